//! Persistent collectives for collective layers (MPI's `MPI_Barrier_init`,
//! `MPI_Allreduce_init`): nicbar_coll_barrier_init() and nicbar_coll_allreduce_init() compile a
//! group's barrier or allreduce for this endpoint's rank once; nicbar_coll_persistent_start()
//! queues a start of it on the endpoint, as nicbar_coll_barrier_start() queues a barrier, and
//! returns a ticket (nicbar_coll_barrier_test() says when it ended and how,
//! nicbar_coll_allreduce_result() takes an allreduce's result). A start posts the compiled steps
//! as one send token: no compilation, no schedule built (`nicbar::Port::persistent_start`). The
//! schedule lives in the library; the NIC reads it from the port's memory at each start.

use core::ffi::{c_char, c_void};

use nicbar_rs::{PersistentCollective, ReduceOp, ReduceSpec, ReduceType};
use shared_abi::reduce::ReduceRefusal;

use super::super::guard_or;
use super::{nicbar_coll_endpoint, nicbar_coll_group, refused};
use crate::ffi::guard;

/// A group's barrier or allreduce compiled once for an endpoint's rank.
pub struct nicbar_coll_persistent {
    inner: PersistentCollective,
}

/// Compiles `group`'s barrier (its algorithm) for `endpoint`'s rank, to start with
/// nicbar_coll_persistent_start() on that endpoint any number of times. Sends nothing and takes
/// none of the group's barrier numbers (name the group with nicbar_coll_group_set_id() first:
/// the persistent barrier keeps the group's name as it is now). Returns NULL with the reason
/// in `error` (`error_length` bytes, NUL-terminated; `error` may be NULL) for a NULL handle, an
/// endpoint that is not a member, or a schedule that does not compile. Free it with
/// nicbar_coll_persistent_free().
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles; `error` is NULL or valid for writes of
/// `error_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_barrier_init(
    endpoint: *const nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    error: *mut c_char,
    error_length: usize,
) -> *mut nicbar_coll_persistent {
    guard_or(
        "nicbar_coll_barrier_init",
        // SAFETY: the caller's promise about `error`.
        |panic| unsafe { refused(error, error_length, &panic) },
        || {
            // SAFETY: the caller's promise.
            let (Some(endpoint), Some(group)) =
                (unsafe { endpoint.as_ref() }, unsafe { group.as_ref() })
            else {
                // SAFETY: the caller's promise about `error`.
                return unsafe { refused(error, error_length, "a NULL endpoint or group") };
            };
            match endpoint.inner.port().persistent_barrier(&group.group) {
                Ok(inner) => Box::into_raw(Box::new(nicbar_coll_persistent { inner })),
                // SAFETY: the caller's promise about `error`.
                Err(e) => unsafe { refused(error, error_length, &e.to_string()) },
            }
        },
    )
}

/// Compiles `group`'s allreduce in the NIC (as nicbar_coll_allreduce_start() runs it) of
/// `length` bytes of `type` combined with `op` (`NICBAR_REDUCE_*`) for `endpoint`'s rank, to
/// start with nicbar_coll_persistent_start() on that endpoint any number of times. Sends
/// nothing and takes none of the group's barrier numbers. Returns NULL with the reason in
/// `error` for a NULL handle, an endpoint that is not a member, an operation or type out of
/// range or not defined on the type, or a length that is 0, over `NICBAR_NIC_REDUCE_MAX` or not
/// whole elements. Free it with nicbar_coll_persistent_free().
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles; `error` is NULL or valid for writes of
/// `error_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_allreduce_init(
    endpoint: *const nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: i32,
    r#type: i32,
    length: usize,
    error: *mut c_char,
    error_length: usize,
) -> *mut nicbar_coll_persistent {
    guard_or(
        "nicbar_coll_allreduce_init",
        // SAFETY: the caller's promise about `error`.
        |panic| unsafe { refused(error, error_length, &panic) },
        || {
            // SAFETY: the caller's promise.
            let (Some(endpoint), Some(group)) =
                (unsafe { endpoint.as_ref() }, unsafe { group.as_ref() })
            else {
                // SAFETY: the caller's promise about `error`.
                return unsafe { refused(error, error_length, "a NULL endpoint or group") };
            };
            let byte = |value: i32| u8::try_from(value).unwrap_or(0);
            let spec = ReduceSpec::new(ReduceOp(byte(op)), ReduceType(byte(r#type)));
            if let Err(refusal) = spec.check_value(length) {
                let why = match refusal {
                    ReduceRefusal::UnknownOp(_) => "no such operation".to_owned(),
                    ReduceRefusal::UnknownType(_) => "no such type".to_owned(),
                    ReduceRefusal::NotDefined(..) => {
                        "the operation is not defined on the type".to_owned()
                    }
                    ReduceRefusal::BadLength(_) => format!(
                        "the length is 0, over {} or not whole elements",
                        nicbar_rs::NIC_REDUCE_MAX
                    ),
                };
                let message = format!(
                    "no allreduce of {length} bytes of type {type} with operation {op} in the NIC: {why}"
                );
                // SAFETY: the caller's promise about `error`.
                return unsafe { refused(error, error_length, &message) };
            }
            match endpoint
                .inner
                .port()
                .persistent_allreduce(&group.group, spec, length)
            {
                Ok(inner) => Box::into_raw(Box::new(nicbar_coll_persistent { inner })),
                // SAFETY: the caller's promise about `error`.
                Err(e) => unsafe { refused(error, error_length, &e.to_string()) },
            }
        },
    )
}

/// Starts `persistent` on `endpoint` (the one it was compiled for) and returns its ticket (never
/// 0; 0 for a NULL handle, or NULL `data` with a nonzero `length`): queued as
/// nicbar_coll_barrier_start() queues a barrier, in the same order as the endpoint's other
/// barriers and reductions. `data` is this member's value of an allreduce, `length` bytes (its
/// compiled length; the start ends failed otherwise); a barrier ignores it. Every member starts
/// it at the same point of the group's barriers. Follow it with nicbar_coll_barrier_test() and,
/// for an allreduce, nicbar_coll_allreduce_result().
///
/// # Safety
/// `endpoint` and `persistent` are NULL or live handles; `data` is NULL or readable for
/// `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_persistent_start(
    endpoint: *mut nicbar_coll_endpoint,
    persistent: *const nicbar_coll_persistent,
    data: *const c_void,
    length: usize,
) -> u64 {
    guard("nicbar_coll_persistent_start", 0, || {
        // SAFETY: the caller's promise.
        let (Some(endpoint), Some(persistent)) =
            (unsafe { endpoint.as_mut() }, unsafe { persistent.as_ref() })
        else {
            return 0;
        };
        if data.is_null() && length != 0 {
            return 0;
        }
        let bytes: &[u8] = if length == 0 {
            &[]
        } else {
            // SAFETY: `data` is readable for `length` bytes, the caller's promise.
            unsafe { core::slice::from_raw_parts(data.cast::<u8>(), length) }
        };
        endpoint.inner.persistent_start(&persistent.inner, bytes)
    })
}

/// Frees a persistent collective. Takes NULL. Starts queued or running keep running.
///
/// # Safety
/// `persistent` is NULL or from nicbar_coll_barrier_init() or nicbar_coll_allreduce_init() and
/// not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_persistent_free(persistent: *mut nicbar_coll_persistent) {
    guard("nicbar_coll_persistent_free", (), || {
        if !persistent.is_null() {
            // SAFETY: the caller's promise: it came from Box::into_raw and is freed once.
            drop(unsafe { Box::from_raw(persistent) });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_handles_are_refused_with_a_reason_not_followed() {
        let mut message = [0 as c_char; 64];
        // SAFETY: NULL handles are allowed; `message` is writable for its length.
        unsafe {
            assert!(
                nicbar_coll_barrier_init(
                    core::ptr::null(),
                    core::ptr::null(),
                    message.as_mut_ptr(),
                    message.len()
                )
                .is_null()
            );
            let text = core::ffi::CStr::from_ptr(message.as_ptr());
            assert_eq!(text.to_str().unwrap(), "a NULL endpoint or group");
            assert!(
                nicbar_coll_allreduce_init(
                    core::ptr::null(),
                    core::ptr::null(),
                    super::super::reduce::NICBAR_REDUCE_SUM,
                    super::super::reduce::NICBAR_REDUCE_DOUBLE,
                    8,
                    core::ptr::null_mut(),
                    0
                )
                .is_null()
            );
            assert_eq!(
                nicbar_coll_persistent_start(
                    core::ptr::null_mut(),
                    core::ptr::null(),
                    core::ptr::null(),
                    0
                ),
                0
            );
            nicbar_coll_persistent_free(core::ptr::null_mut());
        }
    }
}
