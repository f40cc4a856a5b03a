//! What the port keeps for barriers, and the filter that takes the barrier code's events out of
//! the port's stream: the running group barriers' ends (or refusals), and the host-based
//! barrier's messages and sends.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar_schedule::{self, Algorithm, Member, ScheduleError};
use shared_abi::event::Status;
use shared_abi::ids::BarrierId;
use shared_abi::reduce::{REDUCE_MAX, ReduceRefusal, ReduceSpec};
use shared_abi::schedule::Step;
use shared_abi::token::{Priority, SendKind};

use crate::dma::DmaBuffer;
use crate::endpoint::Endpoint;
use crate::event::Event;
use crate::failure::{BarrierError, FailureReason};
use crate::group::{BarrierNumbering, Group};
use crate::port::kept::{Keeping, KeptSchedules};

/// Size class of the host-based barrier's messages (24-byte messages), reserved with
/// [`HOST_BARRIER_PRIORITY`] on ports that run host-based barriers (see the module docs).
pub const HOST_BARRIER_SIZE: u8 = 5;
/// Priority of the host-based barrier's messages.
pub const HOST_BARRIER_PRIORITY: Priority = Priority::HIGH;
/// How often the host-based barrier sends again a message its target refused (the NIC's retry
/// interval for barrier packets).
pub const HOST_RETRY_INTERVAL: Duration = Duration::from_micros(500);
/// The host-based barrier's timeout when the options give none (the NIC's default).
pub const DEFAULT_HOST_TIMEOUT: Duration = Duration::from_secs(30);

/// The first bytes of a host-based barrier message.
pub(crate) const HOST_MAGIC: [u8; 4] = *b"NBhb";
/// A host-based barrier message: the magic, the round, three reserved bytes, and the barrier's
/// identity ([`BarrierId`]: job, group, sequence).
pub(crate) const HOST_MESSAGE_LENGTH: usize = 8 + core::mem::size_of::<BarrierId>();
/// Where a host-based barrier message's identity starts.
pub(crate) const HOST_ID_AT: usize = 8;
/// The tag of the host-based barrier's receive buffers (for `nicctl status` readers; the port
/// tells its buffers by their arena offsets).
pub(crate) const HOST_TAG: u32 = u32::from_le_bytes(HOST_MAGIC);
/// How many times a barrier refused as busy (its barrier buffer not yet taken by the NIC: it
/// waits in the receive ring behind buffers the NIC has no room for) is posted again before the
/// refusal is reported.
const MAX_REPOSTS: u32 = 200;
/// The first wait before a barrier refused as busy is posted again; it doubles with each refusal
/// up to 64 times this.
const REPOST_BACKOFF: Duration = Duration::from_micros(20);

/// A schedule compiled lately: the same group, algorithm and rank compile to it again.
#[derive(Debug)]
struct CachedSchedule {
    members: Arc<[Member]>,
    /// `None`: the allreduce's.
    algorithm: Option<Algorithm>,
    rank: usize,
    steps: Arc<[Step]>,
}

/// Schedules kept compiled: enough for a program that alternates barriers, broadcasts and
/// allreduces on a communicator or two, so that a start costs no compilation.
const CACHED_SCHEDULES: usize = 4;

/// A group barrier running in the NIC (a port runs up to
/// [`shared_abi::schedule::RUNNING_BARRIERS`] at once).
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) context: u64,
    pub(crate) barrier: BarrierId,
    pub(crate) steps: Arc<[Step]>,
    /// How its latest token got the steps (posted, or from a slot the NIC keeps).
    pub(crate) keeping: Keeping,
    pub(crate) members: Arc<[Member]>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) reposts: u32,
    /// Refused as busy: post it again then.
    pub(crate) repost_at: Option<Instant>,
    /// What its packets carry: a broadcast's root and (at the root) bytes, or a reduction's
    /// operation and this member's value.
    pub(crate) carried: Option<Carried>,
}

/// What a group barrier's packets carry beside the barrier.
#[derive(Clone, Debug)]
pub(crate) enum Carried {
    /// A broadcast: its root, and (at the root) the bytes.
    Broadcast(Member, Vec<u8>),
    /// A reduction: what it combines with, and this member's value as the NIC combines it
    /// ([`Carried::reduce`]).
    Reduce(ReduceSpec, Vec<u8>),
}

impl Carried {
    /// A reduction of this member's `value` with `spec`, which travels as
    /// [`ReduceSpec::payload`] makes it (a reproducible sum's accumulator, else the value).
    ///
    /// # Errors
    /// [`BarrierError::Refused`] with `TOO_LONG` for a value of a length the operation does not
    /// take, `INVALID_TOKEN` for an operation not defined on the type.
    pub(crate) fn reduce(spec: ReduceSpec, value: &[u8]) -> Result<Self, BarrierError> {
        let mut payload = [0; REDUCE_MAX];
        let len = spec.payload(value, &mut payload).map_err(refused)?;
        Ok(Self::Reduce(spec, payload[..len].to_vec()))
    }
}

/// A reduction the NIC cannot run, as the barrier error a start returns.
pub(crate) fn refused(refusal: ReduceRefusal) -> BarrierError {
    BarrierError::Refused {
        status: match refusal {
            ReduceRefusal::BadLength(_) => Status::TOO_LONG,
            _ => Status::INVALID_TOKEN,
        },
    }
}

/// What the port keeps for barriers (a field of [`crate::Port`]); the barrier tokens themselves
/// are the endpoint's ([`crate::endpoint::BarrierTokens`]).
#[derive(Debug, Default)]
pub(crate) struct BarrierState {
    /// The schedules compiled last, the latest first.
    cache: VecDeque<CachedSchedule>,
    /// The schedules the NIC keeps for this port.
    pub(crate) kept: KeptSchedules,
    /// The group barriers running in the NIC, in the order they started.
    pub(crate) running: Vec<Running>,
    /// The ends of group barriers, by context, kept for [`crate::Port::barrier_wait`].
    pub(crate) outcomes: HashMap<u64, Result<(), BarrierError>>,
    /// The bytes of ended broadcasts, by context, kept for [`crate::Port::nic_broadcast_wait`].
    pub(crate) broadcasts: HashMap<u64, crate::event::BroadcastData>,
    pub(crate) next_serial: u32,
    pub(crate) host: HostState,
    /// The number of the next barrier of each (job, group) this port runs.
    numbering: BarrierNumbering,
}

impl BarrierState {
    /// The schedule of `rank` in `group` under `algorithm` (`None`: the allreduce's,
    /// `nicbar_schedule::allreduce`), compiled or from the cache.
    pub(crate) fn schedule(
        &mut self,
        group: &Group,
        algorithm: Option<Algorithm>,
        rank: usize,
    ) -> Result<Arc<[Step]>, ScheduleError> {
        let at = self.cache.iter().position(|cached| {
            Arc::ptr_eq(&cached.members, &group.members)
                && cached.algorithm == algorithm
                && cached.rank == rank
        });
        if let Some(hit) = at.and_then(|at| self.cache.remove(at)) {
            let steps = hit.steps.clone();
            self.cache.push_front(hit);
            return Ok(steps);
        }
        let (mut steps, count) = match algorithm {
            Some(algorithm) => {
                let mut steps =
                    vec![Step::default(); nicbar_schedule::steps_needed(algorithm, group.len())?];
                let count = nicbar_schedule::compile(algorithm, &group.members, rank, &mut steps)?;
                (steps, count)
            }
            None => {
                let mut steps = vec![Step::default(); nicbar_schedule::MAX_SCHEDULE_STEPS];
                let count = nicbar_schedule::allreduce(&group.members, rank, &mut steps)?;
                (steps, count)
            }
        };
        steps.truncate(count);
        let steps: Arc<[Step]> = steps.into();
        self.cache.truncate(CACHED_SCHEDULES - 1);
        self.cache.push_front(CachedSchedule {
            members: group.members.clone(),
            algorithm,
            rank,
            steps: steps.clone(),
        });
        Ok(steps)
    }

    /// The identity of the next barrier of `group` on this port (not yet counted: see
    /// [`BarrierState::count`]).
    pub(crate) fn next_id(&self, group: &Group) -> BarrierId {
        self.numbering.next_id(group)
    }

    /// Starts `group`'s numbering afresh.
    pub(crate) fn restart(&mut self, group: &Group) {
        self.numbering.restart(group);
    }

    /// Counts barrier `barrier` as started: the group's next barrier is the one after it.
    pub(crate) fn count(&mut self, barrier: BarrierId) {
        self.numbering.count(barrier);
    }

    /// The running group barrier with `context` was posted again, its steps as `keeping` says.
    pub(crate) fn set_keeping(&mut self, context: u64, keeping: Keeping) {
        if let Some(running) = self.running.iter_mut().find(|r| r.context == context) {
            running.keeping = keeping;
        }
    }

    pub(crate) fn is_running(&self, context: u64) -> bool {
        self.running_with(context).is_some()
    }

    /// The running group barrier with `context`.
    pub(crate) fn running_with(&self, context: u64) -> Option<&Running> {
        self.running.iter().find(|r| r.context == context)
    }

    /// Whether barrier `barrier` runs (a second of one identity would take the first's packets).
    pub(crate) fn runs_barrier(&self, barrier: BarrierId) -> bool {
        self.running.iter().any(|r| r.barrier == barrier)
    }

    pub(crate) fn has_ended(&self, context: u64) -> bool {
        self.outcomes.contains_key(&context)
    }

    pub(crate) fn take_outcome(&mut self, context: u64) -> Option<Result<(), BarrierError>> {
        self.outcomes.remove(&context)
    }

    /// The running group barrier with `context` ended with `outcome`. One the NIC never ran
    /// (refused, or not posted again) gives its number back if no later barrier of its group
    /// started: the members that did not see it run number their next barrier the same.
    pub(crate) fn finish(&mut self, context: u64, outcome: Result<(), BarrierError>) {
        let Some(at) = self.running.iter().position(|r| r.context == context) else {
            return;
        };
        {
            let running = self.running.remove(at);
            if matches!(
                outcome,
                Err(BarrierError::Refused { .. } | BarrierError::Port(_))
            ) {
                self.numbering.give_back(running.barrier);
            }
            self.outcomes.insert(running.context, outcome);
        }
    }
}

/// Takes the events the barrier code owns out of the stream: the running group barrier's end (or
/// refusal) and the host-based barrier's messages and sends. Returns the others.
pub(crate) fn absorb(
    endpoint: &mut Endpoint,
    state: &mut BarrierState,
    event: Event,
) -> Option<Event> {
    match event {
        Event::BarrierCompleted { context } if state.is_running(context) => {
            state.finish(context, Ok(()));
            provide_ahead(endpoint);
            None
        }
        Event::BroadcastCompleted { context, data } if state.is_running(context) => {
            // A reduction's combined payload stands for its result (a reproducible sum's
            // accumulator is rounded here, once for every door).
            let data = match state.running_with(context).and_then(|r| r.carried.as_ref()) {
                Some(Carried::Reduce(spec, _)) => {
                    let mut result = [0; REDUCE_MAX];
                    let len = spec.result(&data, &mut result);
                    crate::event::BroadcastData::new(&result[..len])
                }
                _ => data,
            };
            state.broadcasts.insert(context, data);
            state.finish(context, Ok(()));
            provide_ahead(endpoint);
            None
        }
        Event::BarrierFailed {
            context,
            status,
            waiting_for: (node, peer_port),
        } if state.is_running(context) => {
            let waiting_for = Member::new(node, peer_port);
            let rank = state
                .running_with(context)
                .and_then(|r| r.members.iter().position(|m| *m == waiting_for));
            state.finish(
                context,
                Err(BarrierError::Failed {
                    waiting_for,
                    rank,
                    reason: FailureReason::from_status(status),
                }),
            );
            provide_ahead(endpoint);
            None
        }
        Event::SendRejected {
            context,
            status,
            kind,
            ..
        } if SendKind(kind).is_barrier() && state.is_running(context) => {
            let running = state.running.iter_mut().find(|r| r.context == context);
            if let Some(running) = &running
                && status != Status::BARRIER_BUSY
            {
                // The NIC refuses a barrier as busy only once it holds its steps; after any
                // other refusal the slot may not hold them.
                state.kept.forget(running.keeping);
            }
            match running {
                // Steps the NIC was to keep are not there (the token that was to keep them
                // was refused before it could): post them now.
                Some(running)
                    if status == Status::BAD_SCHEDULE
                        && !running.keeping.posts_steps()
                        && running.reposts < MAX_REPOSTS =>
                {
                    running.reposts += 1;
                    running.repost_at = Some(Instant::now());
                }
                // Busy: the port starts no more barriers than the NIC runs, each of its own
                // identity, so its barrier buffer has not reached the NIC (it waits in the
                // receive ring behind buffers the NIC has no room for yet). Post it again a
                // little later.
                // A broadcast's root refused for want of room for its bytes (the NIC still holds
                // earlier broadcasts' unacknowledged packets): the same.
                Some(running)
                    if (status == Status::BARRIER_BUSY
                        || (status == Status::NO_RESOURCES
                            && matches!(running.carried, Some(Carried::Broadcast(..)))))
                        && running.reposts < MAX_REPOSTS =>
                {
                    let backoff = REPOST_BACKOFF * (1 << running.reposts.min(6));
                    running.reposts += 1;
                    running.repost_at = Some(Instant::now() + backoff);
                }
                _ => state.finish(context, Err(BarrierError::Refused { status })),
            }
            None
        }
        Event::Received { ref buffer, .. }
            if state.host.buffers.contains(&buffer.arena_offset()) =>
        {
            host_received(endpoint, state, event)
        }
        Event::Sent { ref buffer, .. }
            if state.host.sending.contains_key(&buffer.arena_offset()) =>
        {
            host_sent(state, event);
            None
        }
        Event::ReceiveRejected {
            buffer: Some(buffer),
            ..
        } if state.host.buffers.contains(&buffer.arena_offset()) => {
            // Never for a buffer of the reserved class; forget it, the next barrier provides
            // another.
            state.host.buffers.remove(&buffer.arena_offset());
            None
        }
        other => Some(other),
    }
}

/// Provides the next barrier's buffer as soon as one ends, so it is in the NIC before the next
/// barrier token. Best effort: [`crate::Port::barrier_start`] provides it if this could not.
/// No barrier runs without its buffer here (each start provides one per running barrier), so
/// the NIC needs this one only for the next barrier token, whose post rings it if it sleeps.
fn provide_ahead(endpoint: &mut Endpoint) {
    if endpoint.barrier_tokens.buffers == 0 {
        let _ = endpoint.provide_barrier_buffer_ahead();
    }
}

// ---------------------------------------------------------------------------------------------
// The host-based barrier.

/// A host-based barrier message whose send failed, to send again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resend {
    pub(crate) peer: Member,
    pub(crate) barrier: BarrierId,
    pub(crate) round: u8,
    pub(crate) at: Instant,
    pub(crate) until: Instant,
}

/// The host-based barrier's record, buffers and sends.
#[derive(Debug, Default)]
pub(crate) struct HostState {
    /// Messages arrived and not yet consumed, per (sender, barrier, round): the host's
    /// unexpected-barrier record. A barrier forgets what is left of its own when it ends, and of
    /// its group's earlier barriers when it starts.
    pub(crate) record: HashMap<(Member, BarrierId, u8), u32>,
    /// Arena offsets of the receive buffers provided for the messages.
    pub(crate) buffers: HashSet<u64>,
    /// Buffers back from the NIC that could not be provided again yet (no receive token).
    pub(crate) unprovided: Vec<DmaBuffer>,
    /// Send buffers not in use.
    pub(crate) spare: Vec<DmaBuffer>,
    /// Messages the NIC holds: buffer offset → (target, barrier, round).
    pub(crate) sending: HashMap<u64, (Member, BarrierId, u8)>,
    pub(crate) resends: Vec<Resend>,
    /// The last failure of a send to each member since a message from it or a send to it got
    /// through.
    pub(crate) failures: HashMap<Member, Status>,
    /// Until when failed sends are sent again: the deadline of the latest host-based barrier.
    pub(crate) deadline: Option<Instant>,
}

impl HostState {
    /// Forgets what is recorded of `barrier`'s group's barriers before it (`inclusive`: and of
    /// `barrier` itself): they ended, and what is left of them can complete nothing.
    pub(crate) fn forget_through(&mut self, barrier: BarrierId, inclusive: bool) {
        let (job, group, sequence) = (barrier.job, barrier.group, barrier.sequence.get());
        self.record.retain(|(_, id, _), _| {
            let behind = sequence.wrapping_sub(id.sequence.get()) as i32;
            id.job != job || id.group != group || behind < 0 || (behind == 0 && !inclusive)
        });
    }

    /// When the next failed message is due to be sent again.
    pub(crate) fn next_resend(&self) -> Option<Instant> {
        self.resends.iter().map(|resend| resend.at).min()
    }
}

/// A message arrived in one of the host-based barrier's buffers: count it and provide the buffer
/// again. A message that is not the barrier's is the caller's.
fn host_received(endpoint: &mut Endpoint, state: &mut BarrierState, event: Event) -> Option<Event> {
    let Event::Received {
        ref buffer,
        length,
        sender_node,
        sender_port,
        status,
        ..
    } = event
    else {
        return Some(event);
    };
    let offset = buffer.arena_offset();
    let round = buffer.get(4).copied().unwrap_or(u8::MAX);
    let barrier = buffer
        .get(HOST_ID_AT..HOST_MESSAGE_LENGTH)
        .and_then(|bytes| zerocopy::FromBytes::read_from_bytes(bytes).ok());
    let ours = status == Status::SUCCESS
        && length == HOST_MESSAGE_LENGTH
        && buffer.get(..4) == Some(&HOST_MAGIC[..])
        && round < shared_abi::schedule::MAX_ROUNDS
        && barrier.is_some();
    let host = &mut state.host;
    host.buffers.remove(&offset);
    if !ours && status == Status::SUCCESS {
        // Someone else's message of the reserved class: it is the caller's, buffer and all.
        return Some(event);
    }
    if ours && let Some(barrier) = barrier {
        let sender = Member::new(sender_node, sender_port);
        *host.record.entry((sender, barrier, round)).or_insert(0) += 1;
        host.failures.remove(&sender);
    }
    let Event::Received { buffer, .. } = event else {
        return None;
    };
    match endpoint.provide_receive_buffer(
        buffer,
        HOST_BARRIER_SIZE,
        HOST_BARRIER_PRIORITY,
        HOST_TAG,
    ) {
        Ok(()) => {
            state.host.buffers.insert(offset);
        }
        Err(refused) => state.host.unprovided.push(refused.buffer),
    }
    None
}

/// A host-based barrier message was sent, or failed: keep the buffer; on failure, send it again
/// until the deadline (the target port may not be open yet, or had no buffer).
fn host_sent(state: &mut BarrierState, event: Event) {
    let Event::Sent { buffer, status, .. } = event else {
        return;
    };
    let host = &mut state.host;
    let Some((peer, barrier, round)) = host.sending.remove(&buffer.arena_offset()) else {
        return;
    };
    host.spare.push(buffer);
    if status == Status::SUCCESS {
        host.failures.remove(&peer);
        return;
    }
    host.failures.insert(peer, status);
    let now = Instant::now();
    if let Some(until) = host.deadline.filter(|until| *until > now) {
        host.resends.push(Resend {
            peer,
            barrier,
            round,
            at: now + HOST_RETRY_INTERVAL,
            until,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::ids::{NodeId, PortId};

    #[test]
    fn the_schedule_cache_answers_only_for_the_same_group_algorithm_and_rank() {
        let mut state = BarrierState::default();
        let group = Group::from_endpoints((0..8).map(|n| (NodeId::new(n), PortId(1)))).unwrap();
        let pe_of = |state: &mut BarrierState, rank| {
            state
                .schedule(&group, Some(Algorithm::PairwiseExchange), rank)
                .unwrap()
        };
        let pe = pe_of(&mut state, 3);
        assert_eq!(pe.len(), 3);
        assert!(Arc::ptr_eq(&pe, &pe_of(&mut state, 3)));
        let gb = state
            .schedule(
                &group,
                Some(Algorithm::GatherBroadcast {
                    dimension: 2,
                    root: 0,
                }),
                3,
            )
            .unwrap();
        assert!(!Arc::ptr_eq(&pe, &gb));
        // The allreduce's schedule is another entry, and alternating with it keeps both.
        let allreduce = state.schedule(&group, None, 3).unwrap();
        let mut expected = vec![Step::default(); nicbar_schedule::MAX_SCHEDULE_STEPS];
        let count = nicbar_schedule::allreduce(&group.members, 3, &mut expected).unwrap();
        assert_eq!(&*allreduce, &expected[..count]);
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&pe, &pe_of(&mut state, 3)));
            assert!(Arc::ptr_eq(
                &allreduce,
                &state.schedule(&group, None, 3).unwrap()
            ));
        }
        let other_rank = pe_of(&mut state, 4);
        assert_ne!(&*pe, &*other_rank);
        // The same members in another group object compile again, to the same steps.
        let twin = Group::new(group.members().iter().copied()).unwrap();
        let twin_pe = state
            .schedule(&twin, Some(Algorithm::PairwiseExchange), 3)
            .unwrap();
        assert_eq!(&*twin_pe, &*pe);
        // Only the latest few are kept: the first has gone by now.
        assert!(!Arc::ptr_eq(
            &gb,
            &state
                .schedule(
                    &group,
                    Some(Algorithm::GatherBroadcast {
                        dimension: 2,
                        root: 0
                    }),
                    3
                )
                .unwrap()
        ));
        assert_eq!(
            state
                .schedule(&group, Some(Algorithm::Dissemination { n: 8 }), 0)
                .unwrap_err(),
            ScheduleError::WaysOutOfRange { n: 8, members: 8 }
        );
    }
}
