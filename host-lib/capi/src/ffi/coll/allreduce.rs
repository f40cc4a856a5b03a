//! Allreduce over messages for collective layers: vectors longer than the NIC combines, and
//! operations it does not know, with the caller's combining function (an MPI implementation's
//! own operation, user-defined ones included). Recursive doubling keeps the ranks' order, so an
//! operation that does not commute takes it whatever the algorithm asked for.

use core::ffi::c_void;

use nicbar_rs::coll::{self, Allreduce, CollError, Combine, Op};

use super::super::guard_or;
use super::{
    NICBAR_COLL_PENDING, NICBAR_COLL_UNKNOWN, bytes, bytes_mut, collective, nicbar_coll_endpoint,
    nicbar_coll_group, nicbar_coll_op, panicked, report, unknown_algorithm,
};

/// Allreduce (nicbar_coll_op's `algorithm`): log2(P) exchanges of the whole vector, in rank order.
pub const NICBAR_COLL_ALLREDUCE_RECURSIVE_DOUBLING: i32 = 1;
/// Allreduce: Rabenseifner's reduce-scatter by recursive halving and allgather by recursive
/// doubling (commutative operations).
pub const NICBAR_COLL_ALLREDUCE_RABENSEIFNER: i32 = 2;
/// Allreduce: a ring, 2 (P - 1) messages of a P-th of the vector (commutative operations).
pub const NICBAR_COLL_ALLREDUCE_RING: i32 = 3;

/// nicbar_coll_allreduce()'s operation: leaves `source ∘ target` in `target`, `count` elements
/// each (the order of MPI_Reduce_local(source, target)); `argument` is the caller's.
pub type nicbar_coll_combine_fn = Option<
    unsafe extern "C" fn(
        source: *const c_void,
        target: *mut c_void,
        count: usize,
        argument: *mut c_void,
    ),
>;

/// MPI_Allreduce of `length` bytes at `buffer`, in place: elements of `element` bytes combined
/// with `combine` (`argument` its last argument); `commutative` nonzero when the operation
/// commutes. `op`'s algorithm: 0 chosen by size (or the selection map), else a
/// NICBAR_COLL_ALLREDUCE_*. Every rank calls it with the same length, element size, operation
/// and algorithm. Returns as nicbar_coll_bcast(); a `length` that is not whole elements, a
/// NULL `combine` or `buffer` (with bytes to combine) is NICBAR_COLL_UNKNOWN.
///
/// # Safety
/// As nicbar_coll_bcast(); `buffer` valid for reads and writes of `length` bytes; `combine`
/// safe to call with two distinct buffers of whole elements and `argument`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_allreduce(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    buffer: *mut c_void,
    length: usize,
    element: usize,
    combine: nicbar_coll_combine_fn,
    argument: *mut c_void,
    commutative: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_allreduce",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let (algorithm, mut combine) =
                    checked(&call, algorithm, length, element, combine, argument)?;
                let buffer = bytes_mut(buffer, length)
                    .ok_or_else(|| CollError::Argument("a NULL buffer".into()))?;
                coll::allreduce(
                    call,
                    buffer,
                    element,
                    &mut *combine,
                    commutative != 0,
                    algorithm,
                )
            })
        },
    )
}

/// MPI_Iallreduce: nicbar_coll_allreduce() in the background. `length` bytes of `buffer` are
/// copied now (the caller may reuse it); returns a ticket for nicbar_coll_iallreduce_test(), or
/// 0 when it did not start (`op`'s failed_rank and message say why, as nicbar_coll_bcast()'s
/// do). Every wait of a collective on the endpoint, nicbar_coll_progress() and
/// nicbar_coll_iallreduce_test() progress it, none of them waiting for it. `op`'s idle function
/// is not run for it.
///
/// # Safety
/// As nicbar_coll_allreduce(), but `buffer` only for reads, and only during the call;
/// `combine` safe to call with `argument` until the test says the allreduce ended.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_iallreduce(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    buffer: *const c_void,
    length: usize,
    element: usize,
    combine: nicbar_coll_combine_fn,
    argument: *mut c_void,
    commutative: i32,
) -> u64 {
    let mut ticket = 0;
    guard_or(
        "nicbar_coll_iallreduce",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let (algorithm, combine) =
                    checked(&call, algorithm, length, element, combine, argument)?;
                let vector = bytes(buffer, length)
                    .ok_or_else(|| CollError::Argument("a NULL buffer".into()))?
                    .to_vec();
                ticket = coll::allreduce_start(
                    call,
                    vector,
                    element,
                    combine,
                    commutative != 0,
                    algorithm,
                )?;
                Ok(())
            })
        },
    );
    ticket
}

/// Whether the allreduce nicbar_coll_iallreduce() gave `ticket` has ended:
/// NICBAR_COLL_PENDING; NICBAR_COLL_COMPLETED, its result written to `result` (`length` bytes,
/// the length it started with; NULL drops it); NICBAR_COLL_FAILED, `op`'s failed_rank and
/// message saying why; NICBAR_COLL_UNKNOWN for a ticket the endpoint does not know (an ended
/// one is told once) or a `length` other than the allreduce's.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint; `result` is NULL or valid for writes of `length`
/// bytes; `op` is a writable nicbar_coll_op.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_iallreduce_test(
    endpoint: *mut nicbar_coll_endpoint,
    ticket: u64,
    result: *mut c_void,
    length: usize,
    op: *mut nicbar_coll_op,
) -> i32 {
    guard_or(
        "nicbar_coll_iallreduce_test",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        || {
            // SAFETY: the caller's promises.
            let (Some(endpoint), Some(op)) = (unsafe { endpoint.as_mut() }, unsafe { op.as_mut() })
            else {
                return NICBAR_COLL_UNKNOWN;
            };
            let Some((outcome, vector)) = endpoint.inner.background_end(ticket) else {
                return match endpoint.inner.background_running(ticket) {
                    true => NICBAR_COLL_PENDING,
                    false => NICBAR_COLL_UNKNOWN,
                };
            };
            let outcome = outcome.and_then(|()| {
                // SAFETY: the caller's promise about `result`.
                if let Some(out) = unsafe { bytes_mut(result, length) } {
                    if vector.len() != length {
                        return Err(CollError::Argument(format!(
                            "the allreduce has {} bytes, not {length}",
                            vector.len()
                        )));
                    }
                    out.copy_from_slice(&vector);
                }
                Ok(())
            });
            report(op, outcome)
        },
    )
}

/// An allreduce's algorithm (numbered `id`, for `length` bytes on `call`'s group) and the
/// caller's operation as the library's combining function, both checked.
///
/// # Safety
/// `combine` safe to call with two distinct buffers of whole elements and `argument` for as
/// long as the function returned lives.
unsafe fn checked(
    call: &Op<'_>,
    id: i32,
    length: usize,
    element: usize,
    combine: nicbar_coll_combine_fn,
    argument: *mut c_void,
) -> Result<(Allreduce, Box<Combine<'static>>), CollError> {
    let algorithm = allreduce_algorithm(id, call.size(), length)?;
    let combine = combine.ok_or_else(|| CollError::Argument("a NULL operation".into()))?;
    if element == 0 {
        return Err(CollError::Argument("elements of 0 bytes".into()));
    }
    let combine = move |source: &[u8], target: &mut [u8]| {
        // SAFETY: two distinct buffers of the same whole number of elements, the function and
        // argument the caller vouched for.
        unsafe {
            combine(
                source.as_ptr().cast(),
                target.as_mut_ptr().cast(),
                target.len() / element,
                argument,
            )
        }
    };
    Ok((algorithm, Box::new(combine)))
}

/// The allreduce numbered `id` on `size` ranks and `bytes` (0: the selection map's, else by
/// size).
fn allreduce_algorithm(id: i32, size: usize, bytes: usize) -> Result<Allreduce, CollError> {
    Ok(match id {
        0 => coll::select::process_allreduce(size, bytes),
        NICBAR_COLL_ALLREDUCE_RECURSIVE_DOUBLING => Allreduce::RecursiveDoubling,
        NICBAR_COLL_ALLREDUCE_RABENSEIFNER => Allreduce::Rabenseifner,
        NICBAR_COLL_ALLREDUCE_RING => Allreduce::Ring,
        _ => return Err(unknown_algorithm("allreduce", id)),
    })
}
