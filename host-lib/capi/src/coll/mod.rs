//! Collectives for an MPI library's `coll` component, as CollGM (seed 002) splits them: a
//! process's endpoint (one port) running barriers in the NIC and, over messages, broadcast,
//! scatter, gather and all-to-all.
//!
//! - [`transfer`]: the NIC level — reliable transfers of any length keyed by (communicator,
//!   operation, part) and sender, arrivals saved until wanted.
//! - [`algorithms`]: the MPI level — the algorithms over contiguous bytes and their choice by
//!   size. Packing other datatypes is the component's (it knows MPI's datatypes).
//! - [`map`]: the measured selection map (`cargo xtask tune`) the choice takes first.
//! - this module: the endpoint (the port, its queue of barriers, its transfers) and [`Op`], one
//!   collective operation's sends and receives with the wait between them.

pub(crate) mod algorithms;
pub(crate) mod map;
pub(crate) mod transfer;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar_rs::{BarrierError, Error, Group, Member, PendingBarrier, Port};

use transfer::{Key, SendId, TransferError, Transfers};

/// How a barrier ended: `Ok`, or the failed member's rank (-1 if none) and a message.
pub(crate) type Outcome = Result<(), (i32, String)>;

/// How long a collective waits for a peer (and a send is retried while its receiver takes
/// nothing) when the group gives no timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Polls with nothing to do before a wait sleeps on the port, by default.
const SPINS: u32 = 64;
/// How long one sleep on the port lasts at most (the idle callback runs between sleeps).
const SLEEP: Duration = Duration::from_micros(200);

/// A broadcast run by the NIC: its root's rank, and the bytes at the root.
type NicBroadcast = (usize, Vec<u8>);

/// One process's port, with the barriers it has queued, the one running in the NIC, the ends
/// not yet taken, and the collectives' transfers.
pub(crate) struct CollEndpoint {
    pub(crate) port: Port,
    /// Barriers and the NIC's broadcasts in their order.
    queued: VecDeque<(u64, Group, Option<NicBroadcast>)>,
    /// The one running in the NIC, and whether it is a broadcast.
    running: Option<(u64, PendingBarrier, bool)>,
    ended: HashMap<u64, Outcome>,
    /// The bytes of the NIC's broadcasts that ended, by ticket.
    broadcasts: HashMap<u64, Vec<u8>>,
    next_ticket: u64,
    /// Barriers completed.
    pub(crate) completed: u64,
    /// Collectives other than barriers completed.
    pub(crate) collectives: u64,
    transfers: Transfers,
}

impl CollEndpoint {
    /// The endpoint over `port`: its transfer buffers allocated and provided.
    ///
    /// # Errors
    /// What the port says when its arena has no room.
    pub(crate) fn new(mut port: Port) -> Result<Self, Error> {
        let transfers = Transfers::new(&mut port, DEFAULT_TIMEOUT)?;
        let mut endpoint = Self {
            port,
            queued: VecDeque::new(),
            running: None,
            ended: HashMap::new(),
            broadcasts: HashMap::new(),
            next_ticket: 1,
            completed: 0,
            collectives: 0,
            transfers,
        };
        if let Some(threshold) =
            rendezvous_threshold_from(std::env::var("NICBAR_COLL_RENDEZVOUS").ok())
        {
            endpoint.set_rendezvous_threshold(threshold);
        }
        if let Some(limit) = std::env::var("NICBAR_COLL_UNEXPECTED_BYTES")
            .ok()
            .and_then(|value| value.trim().parse().ok())
        {
            endpoint.transfers.set_unexpected_limit(limit);
        }
        Ok(endpoint)
    }

    /// What the transfers did so far.
    pub(crate) fn transfer_counters(&self) -> transfer::TransferCounters {
        self.transfers.counters()
    }

    /// Messages of `threshold` bytes or more go by rendezvous from now on (`usize::MAX`: none);
    /// [`transfer::RENDEZVOUS_THRESHOLD`] until then.
    pub(crate) fn set_rendezvous_threshold(&mut self, threshold: usize) {
        self.transfers.set_rendezvous_threshold(threshold);
    }

    /// Queues a barrier of `group`; returns its ticket (never 0).
    pub(crate) fn barrier_start(&mut self, group: &Group) -> u64 {
        self.enqueue(group, None)
    }

    /// Queues a broadcast of `group` from rank `root` run by the NIC (`data`: the bytes, at the
    /// root); returns its ticket (never 0). Its end comes as a barrier's; then
    /// [`CollEndpoint::take_broadcast`] gives the bytes.
    pub(crate) fn broadcast_start(&mut self, group: &Group, root: usize, data: &[u8]) -> u64 {
        self.enqueue(group, Some((root, data.to_vec())))
    }

    /// The bytes of the ended broadcast with `ticket`, taken.
    pub(crate) fn take_broadcast(&mut self, ticket: u64) -> Option<Vec<u8>> {
        self.broadcasts.remove(&ticket)
    }

    fn enqueue(&mut self, group: &Group, broadcast: Option<NicBroadcast>) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1).max(1);
        self.queued.push_back((ticket, group.clone(), broadcast));
        self.progress();
        ticket
    }

    /// The end of the barrier with `ticket`, taken; `None` while it runs or if no barrier has
    /// this ticket (then `pending` says which).
    pub(crate) fn barrier_end(&mut self, ticket: u64) -> (Option<Outcome>, bool) {
        self.progress();
        match self.ended.remove(&ticket) {
            Some(outcome) => (Some(outcome), false),
            None => (
                None,
                self.running.as_ref().is_some_and(|(t, _, _)| *t == ticket)
                    || self.queued.iter().any(|(t, _, _)| *t == ticket),
            ),
        }
    }

    /// Takes the running barrier's end if it has come, posts queued barriers while the port is
    /// free, and moves the transfers on. Returns how many barriers ended.
    pub(crate) fn progress(&mut self) -> usize {
        let mut ended = 0;
        loop {
            if let Some((_, pending, _)) = &self.running {
                if let Ok(false) = self.port.barrier_test(pending) {
                    break;
                }
                if let Some((ticket, pending, broadcast)) = self.running.take() {
                    let outcome = if broadcast {
                        let mut bytes = [0; nicbar_rs::NIC_BROADCAST_MAX];
                        self.port
                            .nic_broadcast_wait(pending, &mut bytes)
                            .map(|length| {
                                let length = length.min(bytes.len());
                                self.broadcasts.insert(ticket, bytes[..length].to_vec());
                            })
                    } else {
                        self.port.barrier_wait(pending)
                    };
                    self.record(ticket, outcome);
                    ended += 1;
                }
            }
            let Some((ticket, group, broadcast)) = self.queued.pop_front() else {
                break;
            };
            let started = match &broadcast {
                Some((root, data)) => self.port.nic_broadcast_start(&group, *root, data),
                None => self.port.barrier_start(&group),
            };
            match started {
                Ok(pending) => self.running = Some((ticket, pending, broadcast.is_some())),
                Err(error) => {
                    self.record(ticket, Err(error));
                    ended += 1;
                }
            }
        }
        let _ = self.pump_transfers();
        ended
    }

    /// Hands the port's waiting events to the transfers and posts what they have to send.
    /// Returns whether anything happened.
    fn pump_transfers(&mut self) -> Result<bool, TransferError> {
        let mut any = false;
        loop {
            match self.port.receive() {
                Ok(Some(event)) => {
                    any = true;
                    // Nothing else on this port takes events: the barriers' own were absorbed.
                    let _ = self.transfers.handle(&mut self.port, event);
                }
                Ok(None) => break,
                Err(error) => return Err(TransferError::Port(error.to_string())),
            }
        }
        Ok(self.transfers.post(&mut self.port) || any)
    }

    /// Sleeps until the NIC reports an event or `timeout` passes, then progresses. Returns how
    /// many barriers ended.
    pub(crate) fn wait(&mut self, timeout: Duration) -> usize {
        let mut ended = self.progress();
        if ended == 0 && (self.running.is_some() || self.transfers.has_outgoing()) {
            // Wakes for any event, the barrier's own end included (which `receive` keeps).
            let _ = self.port.wait_ready(timeout);
            ended = self.progress();
        }
        ended
    }

    fn record(&mut self, ticket: u64, outcome: Result<(), BarrierError>) {
        let outcome = match outcome {
            Ok(()) => {
                self.completed += 1;
                Ok(())
            }
            Err(error) => {
                let rank = match &error {
                    BarrierError::Failed {
                        rank: Some(rank), ..
                    } => i32::try_from(*rank).unwrap_or(-1),
                    _ => -1,
                };
                Err((rank, error.to_string()))
            }
        };
        self.ended.insert(ticket, outcome);
    }
}

/// The rendezvous threshold `NICBAR_COLL_RENDEZVOUS` sets: a byte count, or `off` (no
/// rendezvous). `None` (the default stands) when unset or unreadable.
fn rendezvous_threshold_from(value: Option<String>) -> Option<usize> {
    let value = value?;
    let value = value.trim();
    if value.eq_ignore_ascii_case("off") {
        return Some(usize::MAX);
    }
    value.parse().ok()
}

/// Why a collective failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CollError {
    /// Sending to `rank` failed.
    Peer {
        /// The receiver's rank.
        rank: usize,
        /// How.
        error: TransferError,
    },
    /// `rank`'s data did not come within the timeout.
    Timeout {
        /// The rank waited for.
        rank: usize,
        /// How long.
        waited: Duration,
    },
    /// `rank` sent another length than this rank expects (the ranks' counts or types differ).
    Length {
        /// The sender.
        rank: usize,
        /// What this rank expected.
        expected: usize,
        /// What came.
        got: usize,
    },
    /// The NIC's broadcast failed: the member it waited for (if it names one) and how.
    Nic {
        /// The rank the NIC waited for.
        rank: Option<usize>,
        /// What happened.
        message: String,
    },
    /// The arguments cannot describe the operation.
    Argument(String),
    /// The port failed.
    Port(String),
}

impl CollError {
    /// The rank that is missing, if the failure is one: a peer the NIC could not reach, or
    /// one whose data did not come. (A rank that sent a wrong length is named in the message
    /// alone: it is there.)
    pub(crate) fn rank(&self) -> Option<usize> {
        match self {
            Self::Peer { rank, .. } | Self::Timeout { rank, .. } => Some(*rank),
            Self::Nic { rank, .. } => *rank,
            Self::Length { .. } | Self::Argument(_) | Self::Port(_) => None,
        }
    }
}

impl std::fmt::Display for CollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer { rank, error } => write!(f, "rank {rank}: {error}"),
            Self::Timeout { rank, waited } => write!(
                f,
                "waited {:.1} s for rank {rank}'s data: is it still running this collective?",
                waited.as_secs_f64()
            ),
            Self::Length {
                rank,
                expected,
                got,
            } => write!(
                f,
                "rank {rank} sent {got} bytes where {expected} were expected (do the ranks' \
                 counts and datatypes match?)"
            ),
            Self::Nic { message, .. } => write!(f, "the NIC's broadcast failed: {message}"),
            Self::Argument(message) => write!(f, "{message}"),
            Self::Port(message) => write!(f, "the port failed: {message}"),
        }
    }
}

impl Drop for Op<'_> {
    /// The operation's sends are the NIC's alone from here ([`Transfers::detach`]).
    fn drop(&mut self) {
        for &(id, _) in &self.sends {
            self.endpoint.transfers.detach(id);
        }
    }
}

/// One collective operation of a communicator on an endpoint: its sends, its receives, and the
/// wait between them (which progresses everything on the port and runs the caller's idle work).
pub(crate) struct Op<'a> {
    endpoint: &'a mut CollEndpoint,
    members: &'a [Member],
    /// The communicator's group, for what runs in the NIC (its broadcasts).
    group: Option<&'a Group>,
    rank: usize,
    context: u32,
    sequence: u32,
    started: Instant,
    timeout: Duration,
    idle: &'a mut dyn FnMut(),
    sends: Vec<(SendId, usize)>,
    spin: u32,
}

impl<'a> Op<'a> {
    /// Operation `sequence` of the communicator with `context` whose ranks are `members`, run by
    /// the member at this endpoint's port; `idle` runs between polls while it waits.
    ///
    /// # Errors
    /// [`CollError::Argument`] if this endpoint's port is not a member.
    pub(crate) fn new(
        endpoint: &'a mut CollEndpoint,
        members: &'a [Member],
        context: u32,
        sequence: u32,
        timeout: Option<Duration>,
        idle: &'a mut dyn FnMut(),
    ) -> Result<Self, CollError> {
        let me = Member::new(endpoint.port.node_id(), endpoint.port.port_id());
        let rank = members.iter().position(|m| *m == me).ok_or_else(|| {
            CollError::Argument(format!("this process's port ({me}) is not in the group"))
        })?;
        Ok(Self {
            endpoint,
            members,
            group: None,
            rank,
            context,
            sequence,
            started: Instant::now(),
            timeout: timeout.unwrap_or(DEFAULT_TIMEOUT),
            idle,
            sends: Vec::new(),
            spin: SPINS,
        })
    }

    /// This operation with `spin` polls before each sleep on the port (0: the default).
    #[must_use]
    pub(crate) fn with_spin(mut self, spin: u32) -> Self {
        if spin > 0 {
            self.spin = spin;
        }
        self
    }

    /// This operation with the communicator's `group` (its members are the operation's), which
    /// the NIC's broadcast runs on.
    #[must_use]
    pub(crate) fn with_group(mut self, group: &'a Group) -> Self {
        self.group = Some(group);
        self
    }

    /// Broadcasts `buffer` (at most [`nicbar_rs::NIC_BROADCAST_MAX`] bytes, the same length on
    /// every rank) from `root` through the NIC's barrier engine, and ends the operation.
    ///
    /// # Errors
    /// [`CollError::Argument`] without a group or for too many bytes; [`CollError::Nic`] if the
    /// NIC's broadcast failed; [`CollError::Length`] if the root sent another length; as
    /// [`Op::step`].
    pub(crate) fn nic_broadcast(mut self, root: usize, buffer: &mut [u8]) -> Result<(), CollError> {
        let group = self
            .group
            .ok_or_else(|| CollError::Argument("no group for the NIC's broadcast".into()))?;
        if buffer.len() > nicbar_rs::NIC_BROADCAST_MAX {
            return Err(CollError::Argument(format!(
                "the NIC broadcasts at most {} bytes, not {}",
                nicbar_rs::NIC_BROADCAST_MAX,
                buffer.len()
            )));
        }
        let data: &[u8] = if self.rank == root { buffer } else { &[] };
        let ticket = self.endpoint.broadcast_start(group, root, data);
        let mut polls = 0;
        loop {
            let (outcome, pending) = self.endpoint.barrier_end(ticket);
            match outcome {
                Some(Ok(())) => break,
                Some(Err((rank, message))) => {
                    return Err(CollError::Nic {
                        rank: usize::try_from(rank).ok(),
                        message,
                    });
                }
                None if !pending => {
                    return Err(CollError::Port("the NIC's broadcast was lost".into()));
                }
                None => self.step(&mut polls, root)?,
            }
        }
        let bytes = self.endpoint.take_broadcast(ticket).unwrap_or_default();
        if bytes.len() != buffer.len() {
            return Err(CollError::Length {
                rank: root,
                expected: buffer.len(),
                got: bytes.len(),
            });
        }
        buffer.copy_from_slice(&bytes);
        self.finish()
    }

    /// This process's rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// The communicator's size.
    pub(crate) fn size(&self) -> usize {
        self.members.len()
    }

    fn key(&self, part: u32) -> Key {
        Key {
            context: self.context,
            sequence: self.sequence,
            part,
        }
    }

    /// Sends `data` to `to` as `part` of this operation (queued: it goes out while the
    /// operation waits).
    pub(crate) fn send(&mut self, to: usize, part: u32, data: Arc<[u8]>) {
        let key = self.key(part);
        let id = self.endpoint.transfers.send(self.members[to], key, data);
        self.sends.push((id, to));
    }

    /// Waits for `part` of this operation from `from`, which must be `length` bytes.
    ///
    /// # Errors
    /// [`CollError::Length`], or as [`Op::step`].
    pub(crate) fn receive(
        &mut self,
        from: usize,
        part: u32,
        length: usize,
    ) -> Result<Vec<u8>, CollError> {
        let key = self.key(part);
        let member = self.members[from];
        self.endpoint
            .transfers
            .want(&mut self.endpoint.port, member, key)
            .map_err(|error| CollError::Peer { rank: from, error })?;
        let mut polls = 0;
        loop {
            if let Some(message) = self.endpoint.transfers.take(member, key) {
                if message.len() != length {
                    return Err(CollError::Length {
                        rank: from,
                        expected: length,
                        got: message.len(),
                    });
                }
                return Ok(message);
            }
            self.step(&mut polls, from)?;
        }
    }

    /// Asks for `part` from `from` to be passed on to each rank of `to` as it arrives
    /// (forwarded segment by segment from the receive buffers: [`Transfers::forward`]); the
    /// sends to `to` are the operation's, as [`Op::send`]'s. Returns whether it will be: not if
    /// part of the message came already ([`Op::receive_forwarded`] then sends it on).
    pub(crate) fn forward(&mut self, from: usize, part: u32, to: &[usize]) -> bool {
        let key = self.key(part);
        let members: Vec<Member> = to.iter().map(|&rank| self.members[rank]).collect();
        match self
            .endpoint
            .transfers
            .forward(self.members[from], key, &members)
        {
            Some(ids) => {
                self.sends.extend(ids.into_iter().zip(to.iter().copied()));
                true
            }
            None => false,
        }
    }

    /// [`Op::receive`] of `part` from `from`, for which [`Op::forward`] to `to` said
    /// `forwarded`: if it said no, the message is sent on to `to` here.
    ///
    /// # Errors
    /// As [`Op::receive`].
    pub(crate) fn receive_forwarded(
        &mut self,
        from: usize,
        part: u32,
        length: usize,
        to: &[usize],
        forwarded: bool,
    ) -> Result<Vec<u8>, CollError> {
        let data = self.receive(from, part, length)?;
        if !forwarded {
            let shared: Arc<[u8]> = Arc::from(data.as_slice());
            for &rank in to {
                self.send(rank, part, shared.clone());
            }
        }
        Ok(data)
    }

    /// Waits until every send of the operation is in the NIC's hands (its data copied into the
    /// port's send buffers: the NIC delivers it from there, retrying as it must). Until the
    /// operation ends, a send that fails (a peer's port closed) fails it at once; after, the
    /// failure is counted ([`transfer::TransferCounters::late_failures`]) and the peer's next
    /// operation fails on its own.
    ///
    /// # Errors
    /// As [`Op::step`].
    pub(crate) fn finish(mut self) -> Result<(), CollError> {
        let mut polls = 0;
        loop {
            let mut waiting_for = None;
            for &(id, to) in &self.sends {
                if !self
                    .endpoint
                    .transfers
                    .send_done(id)
                    .map_err(|error| CollError::Peer { rank: to, error })?
                {
                    waiting_for = Some(to);
                    break;
                }
            }
            let Some(rank) = waiting_for else {
                break;
            };
            self.step(&mut polls, rank)?;
        }
        self.endpoint.collectives += 1;
        Ok(())
    }

    /// One poll of a wait for `rank`: progresses the port, settles delivered sends, runs the
    /// idle work, and after a few empty polls sleeps on the port a little.
    ///
    /// # Errors
    /// [`CollError::Peer`] when a send failed; [`CollError::Timeout`] past the timeout;
    /// [`CollError::Port`].
    fn step(&mut self, polls: &mut u32, rank: usize) -> Result<(), CollError> {
        self.endpoint.progress();
        let busy = self
            .endpoint
            .pump_transfers()
            .map_err(|error| CollError::Port(error.to_string()))?;
        for &(id, to) in &self.sends {
            if let Err(error) = self.endpoint.transfers.send_done(id) {
                return Err(CollError::Peer { rank: to, error });
            }
        }
        (self.idle)();
        if busy {
            *polls = 0;
            return Ok(());
        }
        *polls += 1;
        let waited = self.started.elapsed();
        if waited >= self.timeout {
            return Err(CollError::Timeout { rank, waited });
        }
        if *polls > self.spin
            && let Ok(Some(event)) = self.endpoint.port.receive_timeout(SLEEP)
        {
            let _ = self
                .endpoint
                .transfers
                .handle(&mut self.endpoint.port, event);
        }
        Ok(())
    }
}
