//! The one module of this library that speaks the control protocol (`nicbar_control`): connecting
//! to a daemon it can trust, opening and closing a port over the control socket, the doorbells,
//! the region mapping and the default socket path. Everything else reaches the daemon through
//! here, and no type of the protocol crosses into the library's API.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nicbar_control::{ConnectError, ControlError, Reply, Request, doorbell};

use crate::error::Error;

pub(crate) use nicbar_control::Mapping;

/// How long the library waits for the daemon to answer a request.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// The daemon's default socket: `$NICBAR_SOCKET`, else `$XDG_RUNTIME_DIR/nicbar/control.sock`,
/// else `/tmp/nicbar-<uid>/control.sock`.
pub(crate) fn default_socket() -> PathBuf {
    nicbar_control::socket_path()
}

/// Connects to the daemon on `socket`, refusing one that runs as another user (neither this one
/// nor root) before anything is sent to it.
pub(crate) fn connect(socket: &std::path::Path) -> Result<UnixStream, Error> {
    nicbar_control::connect(socket).map_err(|error| match error {
        ConnectError::Unreachable { socket, source } => Error::DaemonUnreachable { socket, source },
        ConnectError::Untrusted { socket, uid, pid } => Error::UntrustedDaemon { socket, uid, pid },
    })
}

/// A port the daemon opened: its ids and the three descriptors that came with it.
pub(crate) struct Opened {
    pub(crate) node: u16,
    pub(crate) generation: u32,
    pub(crate) region: OwnedFd,
    pub(crate) host_doorbell: OwnedFd,
    pub(crate) nic_doorbell: OwnedFd,
}

/// Asks the daemon on `control` to open `port` of NIC `unit` for this connection.
pub(crate) fn open_port(control: &UnixStream, unit: u8, port: u8) -> Result<Opened, Error> {
    let request = Request::OpenPort {
        unit,
        port,
        abi_version: shared_abi::ABI_VERSION,
    };
    let (reply, fds) = nicbar_control::call(control, &request, CONTROL_TIMEOUT)?;
    let opened = match reply {
        Reply::Opened(opened) => opened,
        Reply::Error(error) => return Err(refused(error)),
        other => return Err(Error::Protocol(format!("{other:?} to an open request"))),
    };
    let [region, host_doorbell, nic_doorbell]: [OwnedFd; 3] =
        fds.try_into().map_err(|fds: Vec<OwnedFd>| {
            Error::Protocol(format!(
                "the port came with {} descriptors, not 3",
                fds.len()
            ))
        })?;
    Ok(Opened {
        node: opened.node,
        generation: opened.generation,
        region,
        host_doorbell,
        nic_doorbell,
    })
}

/// Asks the daemon to close the port this connection owns, and waits until it has.
pub(crate) fn close_port(control: &UnixStream) -> Result<(), Error> {
    match nicbar_control::call(control, &Request::ClosePort, CONTROL_TIMEOUT)?.0 {
        Reply::Closed => Ok(()),
        Reply::Error(error) => Err(refused(error)),
        other => Err(Error::Protocol(format!("{other:?} to a close request"))),
    }
}

/// Asks the daemon on `control` for the fabric's nodes: (node id, host name, unique id), by node
/// id.
pub(crate) fn nodes(control: &UnixStream) -> Result<Vec<(u16, String, u64)>, Error> {
    match nicbar_control::call(control, &Request::Nodes, CONTROL_TIMEOUT)?.0 {
        Reply::Nodes(nodes) => Ok(nodes
            .into_iter()
            .map(|node| (node.node, node.name, node.unique_id))
            .collect()),
        Reply::Error(error) => Err(refused(error)),
        other => Err(Error::Protocol(format!("{other:?} to a nodes request"))),
    }
}

/// Asks the daemon to register, deregister or allow access to memory of the port this
/// connection owns; returns the region's key (0 for the others).
pub(crate) fn memory(control: &UnixStream, request: &Request) -> Result<u32, Error> {
    match nicbar_control::call(control, request, CONTROL_TIMEOUT)?.0 {
        Reply::Registered { key } => Ok(key),
        Reply::MemoryDone => Ok(0),
        Reply::Error(error) => Err(refused(error)),
        other => Err(Error::Protocol(format!("{other:?} to a memory request"))),
    }
}

/// Rings a doorbell.
pub(crate) fn ring(doorbell: &impl AsFd) {
    doorbell::ring(doorbell);
}

/// Empties a doorbell that rang.
pub(crate) fn drain(doorbell: &impl AsFd) {
    doorbell::drain(doorbell);
}

/// The library's error for the daemon's refusal.
fn refused(error: ControlError) -> Error {
    match error {
        ControlError::PortBusy {
            unit,
            port,
            owner_pid,
        } => Error::PortBusy {
            unit,
            port,
            owner_pid,
        },
        ControlError::NoSuchUnit { unit, units } => Error::NoSuchUnit { unit, units },
        ControlError::NoSuchPort { port, .. } => Error::NoSuchPort { port },
        other => Error::Refused(other.to_string()),
    }
}
