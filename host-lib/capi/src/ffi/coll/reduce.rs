//! Allreduce in the NIC for collective layers: up to 32 bytes of MPI's predefined operations on
//! 8- to 64-bit integers, `float` and `double`, queued on the endpoint as a barrier is
//! (`nicbar_coll_allreduce_start()` returns a ticket; `nicbar_coll_barrier_test()` says when it
//! ended and how; `nicbar_coll_allreduce_result()` takes the result). The result is bit-identical
//! on every member: the NIC runs recursive doubling with the non-power-of-two fix-up, combining
//! in a fixed order (`nicbar::Port::nic_allreduce`).

use core::ffi::c_void;

use nicbar_rs::{ReduceOp, ReduceSpec, ReduceType};

use super::super::guard;
use super::{nicbar_coll_endpoint, nicbar_coll_group};

/// nicbar_coll_allreduce_start()'s `op`: sum.
pub const NICBAR_REDUCE_SUM: i32 = 1;
/// Product.
pub const NICBAR_REDUCE_PROD: i32 = 2;
/// Minimum.
pub const NICBAR_REDUCE_MIN: i32 = 3;
/// Maximum.
pub const NICBAR_REDUCE_MAX: i32 = 4;
/// Logical and (integers).
pub const NICBAR_REDUCE_LAND: i32 = 5;
/// Logical or (integers).
pub const NICBAR_REDUCE_LOR: i32 = 6;
/// Logical exclusive or (integers).
pub const NICBAR_REDUCE_LXOR: i32 = 7;
/// Bitwise and (integers).
pub const NICBAR_REDUCE_BAND: i32 = 8;
/// Bitwise or (integers).
pub const NICBAR_REDUCE_BOR: i32 = 9;
/// Bitwise exclusive or (integers).
pub const NICBAR_REDUCE_BXOR: i32 = 10;
/// The minimum and the smallest index holding it: packed pairs of an element and an `int32_t`.
pub const NICBAR_REDUCE_MINLOC: i32 = 11;
/// The maximum and the smallest index holding it: packed pairs of an element and an `int32_t`.
pub const NICBAR_REDUCE_MAXLOC: i32 = 12;
/// A sum of one `float` or `double` whose bits do not depend on the order, the grouping, the
/// algorithm or the group's size: the members' exact sum (each value cut at least 64 bits under
/// the largest magnitude's leading bit), rounded once to nearest. Not one of MPI's.
pub const NICBAR_REDUCE_SUM_REPRODUCIBLE: i32 = 13;

/// nicbar_coll_allreduce_start()'s `type`: `int8_t`.
pub const NICBAR_REDUCE_INT8: i32 = 1;
/// `uint8_t`.
pub const NICBAR_REDUCE_UINT8: i32 = 2;
/// `int16_t`.
pub const NICBAR_REDUCE_INT16: i32 = 3;
/// `uint16_t`.
pub const NICBAR_REDUCE_UINT16: i32 = 4;
/// `int32_t`.
pub const NICBAR_REDUCE_INT32: i32 = 5;
/// `uint32_t`.
pub const NICBAR_REDUCE_UINT32: i32 = 6;
/// `int64_t`.
pub const NICBAR_REDUCE_INT64: i32 = 7;
/// `uint64_t`.
pub const NICBAR_REDUCE_UINT64: i32 = 8;
/// `float`.
pub const NICBAR_REDUCE_FLOAT: i32 = 9;
/// `double`.
pub const NICBAR_REDUCE_DOUBLE: i32 = 10;

/// The most bytes nicbar_coll_allreduce_start() combines in the NIC.
pub const NICBAR_NIC_REDUCE_MAX: u32 = 32;

/// Starts an allreduce of `group` in the NIC: this member's `length` bytes at `data`, elements
/// of `type` (a `NICBAR_REDUCE_*` type), combined with `op` (a `NICBAR_REDUCE_*` operation).
/// Returns its ticket (never 0; 0 for a NULL handle, or NULL `data` with a nonzero `length`).
/// Every member starts it at the same point of the group's barriers, with the same `op`,
/// `type` and `length`. An operation or type out of range, one not defined on the type, or a
/// length that is 0, over [`NICBAR_NIC_REDUCE_MAX`] or not whole elements (for
/// [`NICBAR_REDUCE_SUM_REPRODUCIBLE`], not one element) ends the ticket failed
/// (nicbar_coll_barrier_test() says so); nothing is sent then.
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles; `data` is NULL or readable for `length`
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_allreduce_start(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: i32,
    r#type: i32,
    data: *const c_void,
    length: usize,
) -> u64 {
    guard("nicbar_coll_allreduce_start", 0, || {
        // SAFETY: the caller's promise.
        let (Some(endpoint), Some(group)) =
            (unsafe { endpoint.as_mut() }, unsafe { group.as_ref() })
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
        let byte = |value: i32| u8::try_from(value).unwrap_or(0);
        let spec = ReduceSpec::new(ReduceOp(byte(op)), ReduceType(byte(r#type)));
        endpoint.inner.allreduce_start(&group.group, spec, bytes)
    })
}

/// Copies the result of the ended allreduce with `ticket` (after nicbar_coll_barrier_test()
/// said `NICBAR_COLL_COMPLETED`) into `out`, up to `length` bytes, and forgets it. Returns how
/// many bytes the result has, or -1 if no result waits under `ticket` (not ended, failed, or
/// taken already) or a handle or `out` is NULL.
///
/// # Safety
/// `endpoint` is NULL or a live handle; `out` is NULL or writable for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_allreduce_result(
    endpoint: *mut nicbar_coll_endpoint,
    ticket: u64,
    out: *mut c_void,
    length: usize,
) -> i64 {
    guard("nicbar_coll_allreduce_result", -1, || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_mut() }) else {
            return -1;
        };
        if out.is_null() {
            return -1;
        }
        let Some(result) = endpoint.inner.take_broadcast(ticket) else {
            return -1;
        };
        let copied = result.len().min(length);
        // SAFETY: `out` is writable for `length` bytes, the caller's promise; `copied` is at
        // most that, and the result is a separate allocation.
        unsafe {
            core::ptr::copy_nonoverlapping(result.as_ptr(), out.cast::<u8>(), copied);
        }
        result.len() as i64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_handles_and_pointers_are_refused_not_followed() {
        // SAFETY: NULL handles are allowed.
        unsafe {
            assert_eq!(
                nicbar_coll_allreduce_start(
                    core::ptr::null_mut(),
                    core::ptr::null(),
                    NICBAR_REDUCE_SUM,
                    NICBAR_REDUCE_DOUBLE,
                    core::ptr::null(),
                    8
                ),
                0
            );
            assert_eq!(
                nicbar_coll_allreduce_result(core::ptr::null_mut(), 1, core::ptr::null_mut(), 8),
                -1
            );
        }
    }

    #[test]
    fn the_c_numbers_are_the_abi_s() {
        assert_eq!(NICBAR_REDUCE_MAXLOC, i32::from(ReduceOp::MAXLOC.0));
        assert_eq!(NICBAR_REDUCE_BXOR, i32::from(ReduceOp::BXOR.0));
        assert_eq!(
            NICBAR_REDUCE_SUM_REPRODUCIBLE,
            i32::from(ReduceOp::SUM_REPRODUCIBLE.0)
        );
        assert_eq!(NICBAR_REDUCE_DOUBLE, i32::from(ReduceType::F64.0));
        assert_eq!(NICBAR_REDUCE_INT8, i32::from(ReduceType::I8.0));
        assert_eq!(
            NICBAR_NIC_REDUCE_MAX as usize,
            shared_abi::reduce::REDUCE_MAX
        );
    }
}
