//! The NIC-based barrier from C (paper 5.2): `gm_provide_barrier_buffer`, the forms of
//! `gm_barrier_send_with_callback`, and `nicbar_barrier`, a whole group barrier in one call.
//!
//! The host works out whom to exchange with (paper 5.1: the NIC is slower, so the host computes
//! the tree or the pairings) and the NIC runs the resulting list of steps. The three forms of
//! `gm_barrier_send_with_callback` take that list in the shape each algorithm has: the ordered
//! partners of pairwise exchange, the parent and children of gather-broadcast, the per-round
//! peers of dissemination.

use core::ffi::{c_uint, c_void};
use std::time::Duration;

use nicbar_schedule::{self, Algorithm, Member};
use shared_abi::event::Status;
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::schedule::{MAX_ROUNDS, MAX_SCHEDULE_STEPS, Step, StepOp};
use shared_abi::token::SendKind;

use super::bytes::hton_pointer;
use super::port::{PortState, Slab, gm_port, port_ref};
use super::status::{fail, from_error, from_nic, guard, set_last_error};
use super::types::*;
use crate::{BarrierError, BarrierOptions, Event, FailureReason, Group};

/// High 16 bits of the contexts of barriers this layer posts (the Rust port's group barriers
/// use other high bits).
const BARRIER_CONTEXT_MARK: u64 = 0x4341 << 48;
/// How many times a barrier refused as busy while no barrier of the port runs (its barrier
/// buffer was still on the way to the NIC) is posted again before the refusal is reported.
const MAX_REPOSTS: u32 = 1000;

/// A barrier the NIC holds, as posted.
#[derive(Debug)]
pub(super) struct PostedBarrier {
    steps: Vec<Step>,
    callback: gm_send_completion_callback_t,
    context: usize,
    reposts: u32,
}

/// What a port keeps for barriers.
#[derive(Debug)]
pub(super) struct BarrierRecords {
    posted: Slab<PostedBarrier>,
    /// The NIC fails a barrier after this long; `None`: the NIC's default.
    timeout: Option<Duration>,
}

impl BarrierRecords {
    pub(super) fn new() -> Self {
        Self {
            posted: Slab::new(16),
            timeout: None,
        }
    }
}

fn barrier_event(
    kind: u8,
    context: usize,
    status: gm_status_t,
    waiting_for: Option<(u16, u8)>,
) -> gm_recv_event {
    let (node, port) = waiting_for.unwrap_or((0, 0));
    gm_recv_event {
        barrier: gm_barrier_event_t {
            context: hton_pointer(context),
            status: gm_u32_n_t {
                n: (status as u32).to_be(),
            },
            waiting_for_node_id: gm_u16_n_t { n: node.to_be() },
            waiting_for_port_id: gm_u8_n_t { n: port },
            r#type: gm_u8_n_t { n: kind },
            ..gm_barrier_event_t::default()
        },
    }
}

impl PortState {
    /// Ends a barrier at once, without the NIC: `status` says how. Its event and callback come
    /// from the next receive call and gm_unknown.
    fn end_barrier_locally(
        &mut self,
        callback: gm_send_completion_callback_t,
        context: usize,
        status: gm_status_t,
    ) {
        let kind = if status == GM_SUCCESS {
            GM_BARRIER_COMPLETED_EVENT
        } else {
            GM_BARRIER_FAILED_EVENT
        };
        self.deferred
            .push_back(barrier_event(kind, context, status, None));
        if callback.is_some() {
            self.complete(callback, context, status);
        }
    }

    /// Posts the barrier of `steps`, or ends it at once with the reason it cannot run.
    fn start_barrier(
        &mut self,
        steps: Result<Vec<Step>, String>,
        callback: gm_send_completion_callback_t,
        context: usize,
        function: &str,
    ) {
        let steps = match steps {
            Ok(steps) => steps,
            Err(why) => {
                set_last_error(format!("{function}: {why}"));
                return self.end_barrier_locally(callback, context, GM_INVALID_PARAMETER);
            }
        };
        if steps.is_empty() {
            // A barrier of one member: complete as soon as it is entered (the NIC refuses an
            // empty schedule).
            return self.end_barrier_locally(callback, context, GM_SUCCESS);
        }
        if let Some((status, why)) = &self.fatal {
            let status = *status;
            set_last_error(format!("{function}: {why}"));
            return self.end_barrier_locally(callback, context, status);
        }
        let (slot, serial) = self.barriers.posted.insert(PostedBarrier {
            steps,
            callback,
            context,
            reposts: 0,
        });
        let token_context = BARRIER_CONTEXT_MARK | u64::from(serial) << 32 | u64::from(slot);
        if let Err(status) = self.post_barrier(slot, serial, token_context) {
            let posted = self.barriers.posted.remove(slot, serial);
            if let Some(posted) = posted {
                self.end_barrier_locally(posted.callback, posted.context, status);
            }
        }
    }

    fn post_barrier(
        &mut self,
        slot: u32,
        serial: u32,
        token_context: u64,
    ) -> Result<(), gm_status_t> {
        let timeout = self.barriers.timeout;
        let Some(posted) = self.barriers.posted.get(slot, serial) else {
            return Err(GM_INTERNAL_ERROR);
        };
        self.port
            .barrier_send(&posted.steps, token_context, timeout)
            .map_err(|error| {
                fail(
                    from_error(&error),
                    format!("gm_barrier_send_with_callback: {error}"),
                )
            })
    }

    /// The C event for the end or the refusal of a barrier; `None` if it is not one of this
    /// layer's barriers, or if the barrier was posted again.
    pub(super) fn barrier_event(&mut self, event: &Event) -> Option<gm_recv_event> {
        let (context, status, waiting_for, refused) = match *event {
            Event::BarrierCompleted { context } => (context, Status::SUCCESS, None, false),
            Event::BarrierFailed {
                context,
                status,
                waiting_for: (node, port),
            } => (context, status, Some((node.get(), port.0)), false),
            Event::SendRejected {
                context,
                status,
                kind,
                ..
            } if kind == SendKind::BARRIER.0 => (context, status, None, true),
            _ => return None,
        };
        if context >> 48 != BARRIER_CONTEXT_MARK >> 48 {
            return None;
        }
        let slot = (context & u64::from(u32::MAX)) as u32;
        let serial = ((context >> 32) & 0xffff) as u32;
        if refused && status == Status::BARRIER_BUSY {
            // Busy with none of the port's barriers in the NIC: the barrier buffer was still in
            // the receive ring when the NIC read the barrier token. Post it again.
            let repost = self
                .barriers
                .posted
                .get_mut(slot, serial)
                .filter(|posted| posted.reposts < MAX_REPOSTS)
                .map(|posted| posted.reposts += 1)
                .is_some();
            if repost && self.post_barrier(slot, serial, context).is_ok() {
                return None;
            }
        }
        let posted = self.barriers.posted.remove(slot, serial)?;
        let status = from_nic(status);
        let kind = if status == GM_SUCCESS {
            GM_BARRIER_COMPLETED_EVENT
        } else {
            GM_BARRIER_FAILED_EVENT
        };
        if posted.callback.is_some() {
            self.complete(posted.callback, posted.context, status);
        }
        Some(barrier_event(kind, posted.context, status, waiting_for))
    }
}

/// The members `pointer[..count]`, checked.
///
/// # Safety
/// `pointer` is NULL or points to `count` readable peers.
unsafe fn peers<'a>(
    pointer: *const gm_barrier_peer_t,
    count: c_uint,
    what: &str,
) -> Result<&'a [gm_barrier_peer_t], String> {
    if count == 0 {
        return Ok(&[]);
    }
    if pointer.is_null() {
        return Err(format!("{what} is NULL but its count is {count}"));
    }
    if count as usize > MAX_SCHEDULE_STEPS {
        return Err(format!(
            "{count} {what} is more than a barrier's {MAX_SCHEDULE_STEPS} steps"
        ));
    }
    // SAFETY: not NULL, and `count` peers are readable there (the caller's promise).
    Ok(unsafe { core::slice::from_raw_parts(pointer, count as usize) })
}

/// One step with `peer`, checked.
fn step(op: StepOp, peer: &gm_barrier_peer_t, round: usize) -> Result<Step, String> {
    let Ok(node) = u16::try_from(peer.node_id) else {
        return Err(format!("node id {} is out of range", peer.node_id));
    };
    let port = u8::try_from(peer.port_id)
        .ok()
        .filter(|port| usize::from(*port) < PORTS_PER_NIC);
    let Some(port) = port else {
        return Err(format!(
            "port id {} of node {node} is not a port of a NIC (0..{PORTS_PER_NIC})",
            peer.port_id
        ));
    };
    let Some(round) = u8::try_from(round).ok().filter(|r| *r < MAX_ROUNDS) else {
        return Err(format!("a barrier has {MAX_ROUNDS} rounds at most"));
    };
    Ok(Step::new(op, NodeId::new(node), PortId(port), round))
}

fn check_length(steps: Vec<Step>) -> Result<Vec<Step>, String> {
    if steps.len() > MAX_SCHEDULE_STEPS {
        return Err(format!(
            "the barrier takes {} steps on this port; the NIC runs {MAX_SCHEDULE_STEPS} at most",
            steps.len()
        ));
    }
    Ok(steps)
}

/// Runs `body` on the state of `port` for one of the barrier-starting calls.
fn with_barrier_state(port: *mut gm_port, function: &str, body: impl FnOnce(&mut PortState)) {
    // SAFETY: the reference is used only within this call, which does not close the port.
    let Some(open) = (unsafe { port_ref(port, function) }) else {
        return;
    };
    if let Ok(mut state) = open.lock(function) {
        body(&mut state);
    }
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
        // SAFETY: the reference is used only within this call, which does not close the port.
        let Some(open) = (unsafe { port_ref(port, "gm_provide_barrier_buffer") }) else {
            return GM_INVALID_PARAMETER;
        };
        let mut state = match open.lock("gm_provide_barrier_buffer") {
            Ok(state) => state,
            Err(status) => return status,
        };
        if let Some((status, why)) = &state.fatal {
            return fail(*status, format!("gm_provide_barrier_buffer: {why}"));
        }
        match state.port.provide_barrier_buffer() {
            Ok(()) => GM_SUCCESS,
            Err(error) => fail(
                from_error(&error),
                format!("gm_provide_barrier_buffer: {error}"),
            ),
        }
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
        let steps = unsafe { self::peers(peers, count, "peers") }.and_then(|peers| {
            let steps = peers
                .iter()
                .enumerate()
                .map(|(round, peer)| step(StepOp::EXCHANGE, peer, round))
                .collect::<Result<Vec<_>, _>>()?;
            check_length(steps)
        });
        with_barrier_state(port, FUNCTION, |state| {
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
    const GATHER: usize = 0;
    const BROADCAST: usize = 1;
    guard(FUNCTION, (), || {
        // SAFETY: `children` and `child_count` as the caller promised.
        let children = unsafe { peers(children, child_count, "children") };
        // SAFETY: `parent` is NULL or points to a peer (the caller's promise).
        let parent = unsafe { parent.as_ref() };
        let steps = children.and_then(|children| {
            let mut steps = Vec::with_capacity(2 * children.len() + 2);
            for child in children {
                steps.push(step(StepOp::RECV, child, GATHER)?);
            }
            if let Some(parent) = parent {
                steps.push(step(StepOp::SEND, parent, GATHER)?);
                steps.push(step(StepOp::RECV, parent, BROADCAST)?);
            }
            for child in children {
                steps.push(step(StepOp::SEND, child, BROADCAST)?);
            }
            check_length(steps)
        });
        with_barrier_state(port, FUNCTION, |state| {
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
            if round_count > 0 && rounds.is_null() {
                return Err(format!("rounds is NULL but round_count is {round_count}"));
            }
            let mut steps = Vec::new();
            for round in 0..round_count as usize {
                // SAFETY: `rounds` is not NULL and holds `round_count` rounds (the caller's
                // promise); `round` is below it.
                let this = unsafe { rounds.add(round).read() };
                // SAFETY: each round's pointers and counts as the caller promised.
                let send_to = unsafe { peers(this.send_to, this.send_count, "send_to") }?;
                // SAFETY: as above.
                let receive_from =
                    unsafe { peers(this.receive_from, this.receive_count, "receive_from") }?;
                for peer in send_to {
                    steps.push(step(StepOp::SEND, peer, round)?);
                }
                for peer in receive_from {
                    steps.push(step(StepOp::RECV, peer, round)?);
                }
                if steps.len() > MAX_SCHEDULE_STEPS {
                    break;
                }
            }
            check_length(steps)
        })();
        with_barrier_state(port, FUNCTION, |state| {
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
        let mut status = GM_INVALID_PARAMETER;
        with_barrier_state(port, FUNCTION, |state| {
            state.barriers.timeout =
                (microseconds > 0).then(|| Duration::from_micros(u64::from(microseconds)));
            status = GM_SUCCESS;
        });
        status
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
        if count == 0 || members.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                format!("{FUNCTION}: the group is empty (members NULL or count 0)"),
            );
        }
        let count = count as usize;
        // SAFETY: not NULL, and `count` members are readable there (the caller's promise).
        let given = unsafe { core::slice::from_raw_parts(members, count) };
        let mut group_members = Vec::with_capacity(count);
        for member in given {
            let node = u16::try_from(member.node_id);
            let port_id = u8::try_from(member.port_id);
            let (Ok(node), Ok(port_id)) = (node, port_id) else {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!(
                        "{FUNCTION}: node {} port {} is not a port of a NIC",
                        member.node_id, member.port_id
                    ),
                );
            };
            group_members.push(Member::new(NodeId::new(node), PortId(port_id)));
        }
        let algorithm = match algorithm {
            NICBAR_BARRIER_DEFAULT => nicbar_schedule::default_for(count),
            NICBAR_BARRIER_PAIRWISE_EXCHANGE => Algorithm::PairwiseExchange,
            NICBAR_BARRIER_GATHER_BROADCAST => Algorithm::GatherBroadcast {
                dimension: if parameter == 0 {
                    2
                } else {
                    parameter as usize
                }
                .min(count.saturating_sub(1).max(1)),
                root: 0,
            },
            NICBAR_BARRIER_DISSEMINATION => Algorithm::Dissemination {
                n: if parameter == 0 {
                    1
                } else {
                    parameter as usize
                },
            },
            other => {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!("{FUNCTION}: {other} is not a NICBAR_BARRIER_* algorithm"),
                );
            }
        };
        let group = match Group::new(group_members) {
            Ok(group) => group,
            Err(error) => return fail(GM_INVALID_PARAMETER, format!("{FUNCTION}: {error}")),
        };
        let mut state = match open.lock(FUNCTION) {
            Ok(state) => state,
            Err(status) => return status,
        };
        if let Some((status, why)) = &state.fatal {
            return fail(*status, format!("{FUNCTION}: {why}"));
        }
        let mut options = BarrierOptions::for_members(count).with_algorithm(algorithm);
        options.timeout = state.barriers.timeout;
        match state.port.barrier_with(&group, &options) {
            Ok(()) => GM_SUCCESS,
            Err(error) => {
                if let BarrierError::Port(port_error) = &error
                    && matches!(
                        port_error,
                        crate::Error::DaemonGone | crate::Error::EventRing(_)
                    )
                {
                    state.die(port_error);
                }
                fail(status_of(&error), format!("{FUNCTION}: {error}"))
            }
        }
    })
}

/// The GM status for a group barrier's failure.
fn status_of(error: &BarrierError) -> gm_status_t {
    match error {
        BarrierError::NotAMember { .. } | BarrierError::Schedule(_) => GM_INVALID_PARAMETER,
        BarrierError::Busy => GM_BUSY,
        BarrierError::Port(error) => from_error(error),
        BarrierError::Refused { status } => from_nic(*status),
        BarrierError::Failed { reason, .. } => match reason {
            FailureReason::PeerPortClosed => GM_SEND_TARGET_PORT_CLOSED,
            FailureReason::NodeUnreachable => GM_SEND_TARGET_NODE_UNREACHABLE,
            FailureReason::TimedOut => GM_TIMED_OUT,
            FailureReason::Other(status) => from_nic(*status),
        },
        BarrierError::NoReport { .. } => GM_TIMED_OUT,
        BarrierError::NotRunning => GM_INTERNAL_ERROR,
    }
}
