//! The exports of the NIC-based barrier (paper 5.2): `gm_provide_barrier_buffer`, the three forms
//! of `gm_barrier_send_with_callback`, the barrier timeout, and `nicbar_barrier`.

use core::ffi::{c_uint, c_void};
use std::time::Duration;

use shared_abi::schedule::MAX_SCHEDULE_STEPS;

use super::{guard, port_ref, slice, with_state};
use crate::barrier::{dissemination_round, gather_broadcast, pairwise_exchange};
use crate::status::fail;
use crate::types::*;

/// The members `pointer[..count]`, checked.
///
/// # Safety
/// `pointer` is NULL or points to `count` readable peers.
unsafe fn peers<'a>(
    pointer: *const gm_barrier_peer_t,
    count: c_uint,
    what: &str,
) -> Result<&'a [gm_barrier_peer_t], String> {
    if count as usize > MAX_SCHEDULE_STEPS {
        return Err(format!(
            "{count} {what} is more than a barrier's {MAX_SCHEDULE_STEPS} steps"
        ));
    }
    // SAFETY: as the caller promised.
    unsafe { slice(pointer, count as usize) }
        .ok_or_else(|| format!("{what} is NULL but its count is {count}"))
}

/// Provides the NIC with the receive token that one barrier's end takes (paper 5.2): call it
/// once before each gm_barrier_send_with_callback. Takes a receive token, which the barrier's
/// GM_BARRIER_COMPLETED_EVENT (or GM_BARRIER_FAILED_EVENT) gives back. Returns GM_SUCCESS,
/// GM_TRY_AGAIN (no receive token free), GM_INVALID_PARAMETER (the port is NULL or not open),
/// GM_FIRMWARE_NOT_RUNNING.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_provide_barrier_buffer(port: *mut gm_port) -> gm_status_t {
    guard("gm_provide_barrier_buffer", GM_INTERNAL_ERROR, || {
        with_state(
            port,
            "gm_provide_barrier_buffer",
            GM_INVALID_PARAMETER,
            |state| state.provide_barrier_buffer(),
        )
    })
}

/// Starts a pairwise-exchange barrier in the NIC (paper 5.2): `peers[0..count]` are the members
/// this port exchanges with, in order; in round i it sends to peers[i] and waits for peers[i]'s
/// message of round i. The host computes the pairings (for recursive doubling over ranks 0..N-1
/// with N a power of two, rank r's partner in round i is r XOR 2^i). `count` 0 is a barrier of
/// one member, complete at once.
///
/// Returns at once. The barrier's end comes from gm_receive as GM_BARRIER_COMPLETED_EVENT, or
/// GM_BARRIER_FAILED_EVENT naming the member it waited for; `callback` (if not NULL) then runs
/// from gm_unknown with `context` and the barrier's status. Arguments the library refuses end
/// the barrier the same way, with GM_INVALID_PARAMETER (nicbar_last_error() says why). Call
/// gm_provide_barrier_buffer first; one barrier runs on a port at a time. Takes a send token.
///
/// Like the paper's call, this one names no group, so its barriers carry no identity (job,
/// group and sequence all 0) and every barrier of these three forms is the same to the NIC: a
/// member's packet of an earlier barrier that failed, or of another group over the same ports,
/// completes the next such barrier that waits for it, and a member that enters after a peer's
/// process exited waits for the timeout rather than being told at once. Give every member the
/// same timeout and do not start another barrier after a failure, or use nicbar_barrier, whose
/// barriers carry their group's identity.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `peers` is NULL or points to `count` peers;
/// `callback` is NULL or a function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_barrier_send_with_callback(
    port: *mut gm_port,
    peers: *const gm_barrier_peer_t,
    count: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    const FUNCTION: &str = "gm_barrier_send_with_callback";
    guard(FUNCTION, (), || {
        // SAFETY: `peers` and `count` as the caller promised.
        let steps = unsafe { self::peers(peers, count, "peers") }.and_then(pairwise_exchange);
        with_state(port, FUNCTION, (), |state| {
            state.start_barrier(steps, callback, context as usize, FUNCTION);
        });
    });
}

/// Starts a gather-and-broadcast barrier in the NIC (paper 5.2): this port waits for a gather
/// message from each of `children[0..child_count]`, sends one to `parent`, waits for the
/// parent's broadcast, then sends the broadcast to each child. The root passes `parent` NULL: it
/// broadcasts as soon as every child has gathered. The host builds the tree; every member must
/// agree on it. Otherwise as gm_barrier_send_with_callback.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `parent` is NULL or points to a peer; `children` is
/// NULL or points to `child_count` peers; `callback` is NULL or a function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_gb_barrier_send_with_callback(
    port: *mut gm_port,
    parent: *const gm_barrier_peer_t,
    children: *const gm_barrier_peer_t,
    child_count: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    const FUNCTION: &str = "gm_gb_barrier_send_with_callback";
    guard(FUNCTION, (), || {
        // SAFETY: `children` and `child_count` as the caller promised.
        let children = unsafe { peers(children, child_count, "children") };
        // SAFETY: `parent` is NULL or points to a peer (the caller's promise).
        let parent = unsafe { parent.as_ref() };
        let steps = children.and_then(|children| gather_broadcast(parent, children));
        with_state(port, FUNCTION, (), |state| {
            state.start_barrier(steps, callback, context as usize, FUNCTION);
        });
    });
}

/// Starts a dissemination barrier in the NIC: in round r (0..round_count-1) this port sends to
/// each peer of `rounds[r].send_to`, then waits for each peer of `rounds[r].receive_from`. For
/// n-way dissemination over ranks 0..N-1, rank k sends in round r to (k + j(n+1)^r) mod N and
/// waits for (k - j(n+1)^r) mod N, j = 1..n. At most NICBAR_BARRIER_MAX_ROUNDS rounds.
/// Otherwise as gm_barrier_send_with_callback.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `rounds` is NULL or points to `round_count` rounds
/// whose peer pointers are NULL or point to their counts of peers; `callback` is NULL or a
/// function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_dissemination_barrier_send_with_callback(
    port: *mut gm_port,
    rounds: *const gm_barrier_round_t,
    round_count: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    const FUNCTION: &str = "gm_dissemination_barrier_send_with_callback";
    guard(FUNCTION, (), || {
        let steps = (|| {
            if round_count > NICBAR_BARRIER_MAX_ROUNDS {
                return Err(format!(
                    "{round_count} rounds is more than a barrier's {NICBAR_BARRIER_MAX_ROUNDS}"
                ));
            }
            // SAFETY: `rounds` and `round_count` as the caller promised.
            let rounds = unsafe { slice(rounds, round_count as usize) }
                .ok_or_else(|| format!("rounds is NULL but round_count is {round_count}"))?;
            let mut steps = Vec::new();
            for (round, this) in rounds.iter().enumerate() {
                // SAFETY: each round's pointers and counts as the caller promised.
                let send_to = unsafe { peers(this.send_to, this.send_count, "send_to") }?;
                // SAFETY: as above.
                let receive_from =
                    unsafe { peers(this.receive_from, this.receive_count, "receive_from") }?;
                dissemination_round(&mut steps, round, send_to, receive_from)?;
            }
            Ok(steps)
        })();
        with_state(port, FUNCTION, (), |state| {
            state.start_barrier(steps, callback, context as usize, FUNCTION);
        });
    });
}

/// Makes the NIC fail this port's barriers that have not completed after `microseconds`
/// (GM_BARRIER_FAILED_EVENT with GM_TIMED_OUT, naming the member waited for); 0 restores the
/// NIC's default (30 seconds unless the daemon is configured otherwise). Applies to barriers
/// started afterwards, nicbar_barrier included.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_set_barrier_timeout(
    port: *mut gm_port,
    microseconds: c_uint,
) -> gm_status_t {
    const FUNCTION: &str = "nicbar_set_barrier_timeout";
    guard(FUNCTION, GM_INTERNAL_ERROR, || {
        with_state(port, FUNCTION, GM_INVALID_PARAMETER, |state| {
            state.barriers.timeout =
                (microseconds > 0).then(|| Duration::from_micros(u64::from(microseconds)));
            GM_SUCCESS
        })
    })
}

/// A whole barrier over a group in one call: `members[0..count]` lists the group's ports by
/// rank (the same list, in the same order, on every member; this port among them). Computes this
/// port's part of `algorithm` (NICBAR_BARRIER_DEFAULT, NICBAR_BARRIER_PAIRWISE_EXCHANGE,
/// NICBAR_BARRIER_GATHER_BROADCAST with `parameter` the tree dimension, or
/// NICBAR_BARRIER_DISSEMINATION with `parameter` n; `parameter` 0 picks 2 and 1 respectively),
/// provides the barrier buffer, runs the barrier in the NIC and waits for its end. Events that
/// arrive meanwhile are kept, in order, for the next receive calls.
///
/// Each barrier carries its group's identity, as the Rust library's do: the job (the number in
/// the environment variable NICBAR_JOB, else 0), the group (a hash of `members`, which every
/// member computes alike) and its number among this port's barriers of the group. So a packet
/// of an earlier barrier, one that failed or another group's, never completes this one, and
/// when a member's process has exited after running barriers of the same (non-zero) job, the
/// NIC fails the barrier at once with GM_SEND_TARGET_PORT_CLOSED instead of waiting for the
/// timeout. Members must run the same barriers of a group in the same order.
///
/// Returns GM_SUCCESS once every member has entered; GM_INVALID_PARAMETER (this port is not a
/// member, a member is named twice or out of range, the algorithm does not fit the group);
/// GM_BUSY (a barrier already runs on the port); GM_TIMED_OUT, GM_SEND_TARGET_PORT_CLOSED,
/// GM_SEND_TARGET_NODE_UNREACHABLE (the barrier failed; nicbar_last_error() names the member it
/// waited for).
///
/// # Safety
/// `port` is NULL or a port from gm_open; `members` is NULL or points to `count` peers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_barrier(
    port: *mut gm_port,
    members: *const gm_barrier_peer_t,
    count: c_uint,
    algorithm: c_uint,
    parameter: c_uint,
) -> gm_status_t {
    const FUNCTION: &str = "nicbar_barrier";
    guard(FUNCTION, GM_INTERNAL_ERROR, || {
        // SAFETY: the reference is used only within this call, which does not close the port.
        let Some(open) = (unsafe { port_ref(port, FUNCTION) }) else {
            return GM_INVALID_PARAMETER;
        };
        // SAFETY: `members` and `count` as the caller promised.
        let Some(members) = (unsafe { slice(members, count as usize) }) else {
            return fail(
                GM_INVALID_PARAMETER,
                format!("{FUNCTION}: the group is empty (members NULL or count 0)"),
            );
        };
        match open.lock(FUNCTION) {
            Ok(mut state) => state.group_barrier(members, algorithm, parameter),
            Err(status) => status,
        }
    })
}
