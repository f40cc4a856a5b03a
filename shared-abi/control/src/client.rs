//! The client side: connecting to a backend it can trust, and asking it for its state.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::socket::{getsockopt, sockopt};

use crate::frame::call;
use crate::message::{Reply, Request, StatusReport};

/// How long a status request may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the backend on `socket` for its status.
///
/// # Errors
/// No backend answers on `socket` (`NotFound`/`ConnectionRefused`, naming the socket), it
/// refused (`Other`, its reason), or it answered something else (`InvalidData`).
pub fn query_status(socket: &Path) -> io::Result<StatusReport> {
    let stream = connect(socket).map_err(|error| match error {
        ConnectError::Unreachable { ref source, .. } => {
            io::Error::new(source.kind(), error.to_string())
        }
        ConnectError::Untrusted { .. } => {
            io::Error::new(io::ErrorKind::PermissionDenied, error.to_string())
        }
    })?;
    match call(&stream, &Request::Status, STATUS_TIMEOUT)?.0 {
        Reply::Status(report) => Ok(report),
        Reply::Error(error) => Err(io::Error::other(error)),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the daemon answered a status request with {other:?}"),
        )),
    }
}

/// Why a backend could not be reached, or was not trusted.
#[derive(Debug)]
pub enum ConnectError {
    /// Nothing answers on the socket.
    Unreachable {
        /// The socket.
        socket: PathBuf,
        /// Why the connection failed.
        source: io::Error,
    },
    /// The process behind the socket runs as another user (not this one, not root): it may be
    /// an impostor that squatted the socket's name; nothing was sent to it.
    Untrusted {
        /// The socket.
        socket: PathBuf,
        /// The user id the kernel gives for the process behind it.
        uid: u32,
        /// Its process id.
        pid: u32,
    },
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable { socket, source } => {
                write!(f, "no daemon answers on {}: {source}", socket.display())
            }
            Self::Untrusted { socket, uid, pid } => write!(
                f,
                "the process behind {} (pid {pid}) runs as uid {uid}, neither this user (uid {}) \
                 nor root: refusing to talk to it",
                socket.display(),
                nix::unistd::geteuid().as_raw()
            ),
        }
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Unreachable { source, .. } => Some(source),
            Self::Untrusted { .. } => None,
        }
    }
}

/// Connects to the backend on `socket` and checks, before anything is sent, that the process
/// behind it runs as this user or as root (the kernel's `SO_PEERCRED`, which the other side
/// cannot forge).
///
/// # Errors
/// Nothing answers on `socket`, or the process behind it runs as another user.
pub fn connect(socket: &Path) -> Result<UnixStream, ConnectError> {
    let stream = UnixStream::connect(socket).map_err(|source| ConnectError::Unreachable {
        socket: socket.to_owned(),
        source,
    })?;
    let credentials = getsockopt(&stream, sockopt::PeerCredentials).map_err(|errno| {
        ConnectError::Unreachable {
            socket: socket.to_owned(),
            source: errno.into(),
        }
    })?;
    let uid = credentials.uid();
    if uid != nix::unistd::geteuid().as_raw() && uid != 0 {
        return Err(ConnectError::Untrusted {
            socket: socket.to_owned(),
            uid,
            pid: credentials.pid() as u32,
        });
    }
    Ok(stream)
}
