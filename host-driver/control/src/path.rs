//! Where the control socket is, and binding it on the server side.
//!
//! [`socket_path`] gives the control socket's path: `$NICBAR_SOCKET` if set, else
//! `$XDG_RUNTIME_DIR/nicbar/control.sock` if `XDG_RUNTIME_DIR` is set, else
//! `/tmp/nicbar-<uid>/control.sock`. Every backend listens there by default and the library
//! connects there.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// The environment variable that names the control socket.
pub const SOCKET_ENV: &str = "NICBAR_SOCKET";

/// The control socket's default path: `$XDG_RUNTIME_DIR/nicbar/control.sock` if
/// `XDG_RUNTIME_DIR` is set (and absolute), else `/tmp/nicbar-<uid>/control.sock`.
pub fn default_socket_path() -> PathBuf {
    resolve_socket_path(
        None,
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The control socket's path: `$NICBAR_SOCKET` if set and not empty, else
/// [`default_socket_path`].
pub fn socket_path() -> PathBuf {
    resolve_socket_path(
        std::env::var_os(SOCKET_ENV),
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The rules of [`socket_path`], given the environment's values.
fn resolve_socket_path(
    nicbar_socket: Option<OsString>,
    runtime_dir: Option<OsString>,
    uid: u32,
) -> PathBuf {
    if let Some(path) = nicbar_socket.filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    match runtime_dir.map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() => runtime.join("nicbar").join("control.sock"),
        _ => PathBuf::from(format!("/tmp/nicbar-{uid}")).join("control.sock"),
    }
}

/// Why a backend could not listen on its control socket.
#[derive(Debug)]
pub enum ListenError {
    /// Another daemon answers on the socket.
    AlreadyRunning {
        /// The socket.
        socket: PathBuf,
    },
    /// The control socket could not be set up.
    Socket {
        /// The socket.
        socket: PathBuf,
        /// The error.
        source: io::Error,
    },
}

impl std::fmt::Display for ListenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyRunning { socket } => write!(
                f,
                "a daemon already answers on {} (stop it, or pick another --socket)",
                socket.display()
            ),
            Self::Socket { socket, source } => {
                write!(f, "cannot listen on {}: {source}", socket.display())
            }
        }
    }
}

impl std::error::Error for ListenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Socket { source, .. } => Some(source),
            Self::AlreadyRunning { .. } => None,
        }
    }
}

/// Binds the control socket at `path`: creates its directory (mode 0700) if missing, and replaces
/// a stale socket file no daemon answers on.
///
/// # Errors
/// Another daemon answers there, the path is something other than a socket, or the socket could
/// not be bound.
pub fn listen(path: &Path) -> Result<UnixListener, ListenError> {
    let socket_error = |source| ListenError::Socket {
        socket: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(socket_error)?;
        }
    }
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(socket_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(ListenError::AlreadyRunning {
                socket: path.to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(socket_error)?;
    }
    let listener = UnixListener::bind(path).map_err(socket_error)?;
    // Ports are opened for any process of the user; the directory's mode keeps others out, and
    // the socket's own mode says the same for a socket placed elsewhere.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_path_follows_the_documented_rules() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            resolve_socket_path(None, None, 1000),
            PathBuf::from("/tmp/nicbar-1000/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("relative"), 7),
            PathBuf::from("/tmp/nicbar-7/control.sock")
        );
        assert_eq!(
            resolve_socket_path(os("/elsewhere/x.sock"), os("/run/user/1000"), 1000),
            PathBuf::from("/elsewhere/x.sock")
        );
        assert_eq!(
            resolve_socket_path(os(""), os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
    }
}
