//! The exports of status codes and errors: gm_strerror, gm_perror, nicbar_last_error.

use core::ffi::c_char;
use std::ffi::CStr;
use std::io::Write as _;

use super::guard;
use crate::status::{last_error, message};
use crate::types::*;

/// A short text for a status code: "send target port closed". Never NULL; unknown codes give
/// "unknown status code". The string is static: do not modify or free it.
#[unsafe(no_mangle)]
pub extern "C" fn gm_strerror(status: gm_status_t) -> *mut c_char {
    guard("gm_strerror", c"internal error".as_ptr(), || {
        message(status).as_ptr()
    })
    .cast_mut()
}

/// Prints `message`, a colon and the text of `status` on standard error, as perror() does.
/// `message` may be NULL.
///
/// # Safety
/// `message` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_perror(message: *const c_char, status: gm_status_t) {
    guard("gm_perror", (), || {
        let text = self::message(status).to_string_lossy();
        let prefix = if message.is_null() {
            String::new()
        } else {
            // SAFETY: the caller passes NULL (handled above) or a NUL-terminated string.
            let prefix = unsafe { CStr::from_ptr(message) };
            format!("{}: ", prefix.to_string_lossy())
        };
        let _ = writeln!(std::io::stderr(), "{prefix}{text}");
    });
}

/// What went wrong last on the calling thread, in words and with the values involved (which
/// socket no daemon answers on, which process owns a busy port, ...). Every function that fails
/// sets it; successful calls leave it alone. Never NULL (empty if nothing failed yet). The string
/// stays valid until the next failing call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn nicbar_last_error() -> *const c_char {
    guard("nicbar_last_error", c"".as_ptr(), last_error)
}
