//! Doorbells: eventfds one side writes to wake the other, and only when the other side asked for
//! it through its ring's sleeping flag (io_uring's `NEED_WAKEUP`), so a busy port makes no system
//! call per message.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::sys::eventfd::{EfdFlags, EventFd};

/// A new doorbell: a non-blocking, close-on-exec eventfd.
///
/// # Errors
/// The `eventfd` error (descriptor limit).
pub fn new() -> io::Result<OwnedFd> {
    let eventfd = EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)?;
    Ok(eventfd.into())
}

/// Rings `doorbell`. Never blocks: a counter that is about to overflow is already ringing.
pub fn ring(doorbell: &impl AsFd) {
    let _ = nix::unistd::write(doorbell, &1u64.to_ne_bytes());
}

/// Silences `doorbell`: reads and clears its counter. Returns whether it had rung.
pub fn drain(doorbell: &impl AsFd) -> bool {
    let mut counter = [0u8; 8];
    matches!(nix::unistd::read(doorbell.as_fd(), &mut counter), Ok(8))
}
