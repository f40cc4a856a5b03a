//! Status codes: GM's for the library's errors and the NIC's statuses, their texts, and the
//! per-thread message saying what went wrong last.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::io::Write as _;

use shared_abi::event::Status;

use nicbar_rs::Error;

use crate::types::*;

thread_local! {
    /// What went wrong last on this thread, for nicbar_last_error().
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: impl Into<String>) {
    let mut message = message.into();
    message.retain(|c| c != '\0');
    let message = CString::new(message).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Records `message` as the last error and returns `status`, for `return fail(...)`.
pub(crate) fn fail(status: gm_status_t, message: impl Into<String>) -> gm_status_t {
    set_last_error(message);
    status
}

/// The GM status for a NIC completion status.
pub(crate) fn from_nic(status: Status) -> gm_status_t {
    match status {
        Status::SUCCESS => GM_SUCCESS,
        Status::SEND_TIMED_OUT => GM_SEND_TIMED_OUT,
        Status::TARGET_PORT_CLOSED => GM_SEND_TARGET_PORT_CLOSED,
        Status::TARGET_NODE_UNREACHABLE => GM_SEND_TARGET_NODE_UNREACHABLE,
        Status::INVALID_TOKEN | Status::BAD_SCHEDULE => GM_INVALID_PARAMETER,
        Status::BAD_BUFFER => GM_MEMORY_FAULT,
        Status::BARRIER_BUSY => GM_BUSY,
        Status::BARRIER_TIMED_OUT => GM_TIMED_OUT,
        Status::RING_CORRUPT => GM_INTERNAL_ERROR,
        Status::NO_RESOURCES => GM_TRY_AGAIN,
        Status::TOO_LONG => GM_SEND_REJECTED,
        _ => GM_FAILURE,
    }
}

/// The GM status for a library error.
pub(crate) fn from_error(error: &Error) -> gm_status_t {
    match error {
        Error::DaemonUnreachable { .. } => GM_DEV_NOT_FOUND,
        Error::DaemonGone => GM_FIRMWARE_NOT_RUNNING,
        Error::NoSuchUnit { .. } => GM_NO_SUCH_DEVICE,
        Error::NoSuchPort { .. } => GM_INVALID_PORT_NUMBER,
        Error::PortBusy { .. } => GM_BUSY,
        Error::Refused(_) | Error::UntrustedDaemon { .. } => GM_PERMISSION_DENIED,
        Error::Protocol(_) | Error::BadRegion(_) => GM_INCOMPATIBLE_LIB_AND_DRIVER,
        Error::Io(_) => GM_UNTRANSLATED_SYSTEM_ERROR,
        Error::NoSendTokens | Error::NoReceiveTokens => GM_TRY_AGAIN,
        Error::ArenaFull { .. } => GM_OUT_OF_MEMORY,
        Error::ForeignBuffer
        | Error::InvalidSize { .. }
        | Error::TooLong { .. }
        | Error::BufferTooSmall { .. } => GM_INVALID_PARAMETER,
        Error::EventRing(_) => GM_FIRMWARE_ABORT,
    }
}

/// The text of every status code, by value.
const MESSAGES: [&CStr; GM_NUM_STATUS_CODES as usize] = [
    c"success",
    c"operation failed",
    c"input buffer is too small",
    c"output buffer is too small",
    c"try again",
    c"busy",
    c"memory fault",
    c"interrupted",
    c"invalid parameter",
    c"out of memory",
    c"invalid command",
    c"permission denied",
    c"internal error",
    c"unattached",
    c"unsupported device",
    c"send timed out",
    c"send rejected",
    c"send target port closed",
    c"send target node unreachable",
    c"send dropped",
    c"send port closed",
    c"node id not yet set",
    c"port still shutting down",
    c"clone busy",
    c"no such device",
    c"aborted",
    c"incompatible library and driver",
    c"untranslated system error",
    c"access denied",
    c"no driver support",
    c"page table entry reference count overflow",
    c"not supported in the kernel",
    c"not supported on this architecture",
    c"no match",
    c"user error",
    c"timed out",
    c"data corrupted",
    c"hardware fault",
    c"send orphaned",
    c"minor overflow",
    c"page table full",
    c"uc error",
    c"invalid port number",
    c"no NIC daemon found",
    c"NIC daemon not running",
    c"no match for yellow pages query",
    c"SRAM parity error",
    c"firmware abort",
];

/// The text of `status`.
pub(crate) fn message(status: gm_status_t) -> &'static CStr {
    usize::try_from(status)
        .ok()
        .and_then(|index| MESSAGES.get(index))
        .copied()
        .unwrap_or(c"unknown status code")
}

/// What went wrong last on this thread (empty if nothing failed yet), valid until the next
/// failure on this thread.
pub(crate) fn last_error() -> *const core::ffi::c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Exits the process after printing `message` on standard error: what gm_unknown() does with
/// events that say the port can go no further, as GM's did.
pub(crate) fn exit_with(message: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "nicbar: {message}");
    std::process::exit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_own_text() {
        let texts: std::collections::HashSet<_> = (0..GM_NUM_STATUS_CODES).map(message).collect();
        assert_eq!(texts.len(), GM_NUM_STATUS_CODES as usize);
        assert_eq!(
            message(GM_SEND_TARGET_PORT_CLOSED),
            c"send target port closed"
        );
        assert_eq!(message(-1), c"unknown status code");
        assert_eq!(message(GM_NUM_STATUS_CODES), c"unknown status code");
    }

    #[test]
    fn nic_statuses_map_onto_gm_send_errors() {
        assert_eq!(from_nic(Status::SUCCESS), GM_SUCCESS);
        assert_eq!(from_nic(Status::SEND_TIMED_OUT), GM_SEND_TIMED_OUT);
        assert_eq!(
            from_nic(Status::TARGET_PORT_CLOSED),
            GM_SEND_TARGET_PORT_CLOSED
        );
        assert_eq!(
            from_nic(Status::TARGET_NODE_UNREACHABLE),
            GM_SEND_TARGET_NODE_UNREACHABLE
        );
        assert_eq!(from_nic(Status::BARRIER_TIMED_OUT), GM_TIMED_OUT);
        assert_eq!(from_nic(Status(200)), GM_FAILURE);
    }
}
