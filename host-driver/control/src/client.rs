//! The client side beyond opening ports: asking a backend for its state.

use std::io;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

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
    let stream = UnixStream::connect(socket).map_err(|error| {
        io::Error::new(
            error.kind(),
            format!("no daemon answers on {}: {error}", socket.display()),
        )
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
