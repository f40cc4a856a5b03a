//! What can go wrong, and with which values.

use std::io;
use std::path::PathBuf;

use shared_abi::ring::RingError;

/// An operation on a port failed.
#[derive(Debug)]
pub enum Error {
    /// No daemon answers on the control socket.
    DaemonUnreachable {
        /// The socket tried.
        socket: PathBuf,
        /// Why the connection failed.
        source: io::Error,
    },
    /// The process behind the control socket runs as another user (neither this one nor root):
    /// it may have squatted the socket's name, so nothing was sent to it.
    UntrustedDaemon {
        /// The socket.
        socket: PathBuf,
        /// The user id the kernel gives for that process.
        uid: u32,
        /// Its process id.
        pid: u32,
    },
    /// The daemon has exited: the control connection closed under the port.
    DaemonGone,
    /// The daemon runs no NIC with this unit number.
    NoSuchUnit {
        /// The unit asked for.
        unit: u8,
        /// How many units the daemon runs.
        units: u8,
    },
    /// The port number is out of range.
    NoSuchPort {
        /// The port asked for.
        port: u8,
    },
    /// Another live process owns the port.
    PortBusy {
        /// The unit.
        unit: u8,
        /// The port.
        port: u8,
        /// The owner's process id.
        owner_pid: u32,
    },
    /// The daemon refused for another reason (its words).
    Refused(String),
    /// The daemon answered something this library does not expect.
    Protocol(String),
    /// The region the daemon passed is not one this library can use.
    BadRegion(String),
    /// A system call on the control socket, the doorbells or the mapping failed.
    Io(io::Error),
    /// Every send token is in use: wait for SENT events.
    NoSendTokens,
    /// Every receive token is in use: wait for RECEIVED events.
    NoReceiveTokens,
    /// The arena has no free range of the requested length.
    ArenaFull {
        /// Bytes asked for.
        requested: usize,
        /// Bytes free (possibly in smaller pieces).
        free: usize,
    },
    /// The buffer belongs to another port's arena.
    ForeignBuffer,
    /// The size class is not one the NIC knows (`3..=MAX_SIZE_CLASS`).
    InvalidSize {
        /// The size class given.
        size: u8,
    },
    /// The message is longer than its size class allows, or than its buffer.
    TooLong {
        /// The message length.
        length: usize,
        /// The most the size class and buffer allow.
        max: usize,
    },
    /// The receive buffer is shorter than its size class's messages.
    BufferTooSmall {
        /// The buffer's length.
        length: usize,
        /// What the size class needs.
        needed: usize,
    },
    /// The NIC left the event ring inconsistent (a firmware bug; nothing was read).
    EventRing(RingError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::DaemonUnreachable { socket, source } => write!(
                f,
                "no nicbar daemon answers on {} ({source}); start one with `nicctl emulate`",
                socket.display()
            ),
            Self::DaemonGone => write!(f, "the nicbar daemon has exited"),
            Self::NoSuchUnit { unit, units } => {
                write!(f, "no NIC unit {unit}: the daemon runs {units} unit(s)")
            }
            Self::NoSuchPort { port } => write!(f, "no port {port} on a NIC"),
            Self::UntrustedDaemon { socket, uid, pid } => write!(
                f,
                "the process behind {} (pid {pid}) runs as uid {uid}, neither this user nor root: \
                 refusing to talk to it",
                socket.display()
            ),
            Self::PortBusy {
                unit,
                port,
                owner_pid,
            } => write!(
                f,
                "port {port} of unit {unit} is owned by process {owner_pid}"
            ),
            Self::Refused(error) => write!(f, "the daemon refused: {error}"),
            Self::Protocol(what) => write!(f, "unexpected answer from the daemon: {what}"),
            Self::BadRegion(what) => write!(f, "unusable port region: {what}"),
            Self::Io(error) => write!(f, "{error}"),
            Self::NoSendTokens => write!(f, "no send token left: wait for SENT events"),
            Self::NoReceiveTokens => write!(f, "no receive token left: wait for RECEIVED events"),
            Self::ArenaFull { requested, free } => write!(
                f,
                "the DMA arena has no {requested} byte range free ({free} bytes free in all)"
            ),
            Self::ForeignBuffer => write!(f, "the buffer belongs to another port's arena"),
            Self::InvalidSize { size } => write!(
                f,
                "size class {size} is not within 3..={}",
                shared_abi::MAX_SIZE_CLASS
            ),
            Self::TooLong { length, max } => {
                write!(f, "a {length} byte message exceeds the {max} bytes allowed")
            }
            Self::BufferTooSmall { length, needed } => write!(
                f,
                "a {length} byte buffer cannot take its size class's {needed} byte messages"
            ),
            Self::EventRing(error) => write!(f, "the NIC broke the event ring: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::DaemonUnreachable { source, .. } | Self::Io(source) => Some(source),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

impl From<nix::errno::Errno> for Error {
    fn from(error: nix::errno::Errno) -> Self {
        Self::Io(error.into())
    }
}
