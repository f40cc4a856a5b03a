//! The endpoint: one process's port, the barriers it has queued for the NIC (which runs up to
//! [`RUNNING_BARRIERS`] at once per port, each of its own identity), the ones running, the ends
//! not yet taken, and the collectives' transfers.
//!
//! Barriers go to the NIC in the order they were started, as soon as it has room for one more;
//! each then completes on its own. Members that start barriers of different groups in different
//! orders meet as long as no member has more than [`RUNNING_BARRIERS`] outstanding (MPI orders
//! collectives per communicator only); past that, the later ones wait in the queue for earlier
//! ones to end. A barrier the port cannot start for want of send tokens (the transfers' sends
//! hold them) waits at the head of the queue until their ends give them back.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use shared_abi::ring::Wake;
use shared_abi::schedule::RUNNING_BARRIERS;

use crate::{
    BarrierError, Error, Group, Member, PendingBarrier, PersistentCollective, Port, WaitMode,
};

use super::error::CollError;
use super::transfer::{Key, TransferCounters, TransferError, Transfers};
#[cfg(doc)]
use super::{Op, transfer::RENDEZVOUS_THRESHOLD};

/// How a barrier ended: `Ok`, or the rank of the member the NIC waited for (if the failure is
/// a member's) and what happened.
pub type Outcome = Result<(), (Option<usize>, String)>;

/// How long a collective waits for a peer (and a send is retried while its receiver takes
/// nothing) when the group gives no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a queued barrier carries: nothing, a broadcast run by the NIC (its root's rank, and
/// the bytes at the root), or an allreduce run by the NIC (its operation, and this member's
/// value).
#[derive(Clone, Debug)]
enum Carries {
    Nothing,
    Broadcast(usize, Vec<u8>),
    Allreduce(crate::ReduceSpec, Vec<u8>),
    /// A persistent barrier or allreduce, compiled once, and this member's value (an
    /// allreduce's).
    Persistent(PersistentCollective, Vec<u8>),
}

impl Carries {
    /// What the barrier that carries this brings at its end.
    fn brings(self) -> Brings {
        match self {
            Self::Nothing => Brings::Nothing,
            Self::Broadcast(..) => Brings::Bytes,
            Self::Allreduce(_, data) => Brings::Result(data),
            Self::Persistent(persistent, data) => {
                if persistent.reduce().is_some() {
                    Brings::Result(data)
                } else {
                    Brings::Nothing
                }
            }
        }
    }
}

/// What a running barrier brings at its end: nothing, a broadcast's bytes, or an allreduce's
/// result (this member's value until then: the result in a group of one).
#[derive(Debug)]
enum Brings {
    Nothing,
    Bytes,
    Result(Vec<u8>),
}

/// A collective over messages that runs in the background: every wait on the endpoint, and
/// [`Endpoint::background_end`], progresses it without waiting. [`crate::coll::allreduce_start`]
/// makes one.
pub trait Background {
    /// Does what can be done now; returns how it ended, once it has.
    fn poll(&mut self, endpoint: &mut Endpoint) -> Option<Result<(), CollError>>;
    /// What it leaves the caller, once ended (an allreduce's result).
    fn take_output(&mut self) -> Vec<u8>;
}

/// How a background collective ended, and what it left.
pub type BackgroundEnd = (Result<(), CollError>, Vec<u8>);

/// One process's port, with the barriers it has queued, those running in the NIC, the ends not
/// yet taken, and the collectives' transfers.
pub struct Endpoint {
    pub(super) port: Port,
    /// Barriers and the NIC's broadcasts in their order.
    queued: VecDeque<(u64, Group, Carries)>,
    /// Those running in the NIC, in start order, and what each brings at its end.
    running: Vec<(u64, PendingBarrier, Brings)>,
    ended: HashMap<u64, Outcome>,
    /// Since when the first queued barrier has waited for the port's tokens to come back.
    held_back: Option<Instant>,
    /// The bytes of the NIC's broadcasts and the results of its allreduces that ended, by
    /// ticket.
    broadcasts: HashMap<u64, Vec<u8>>,
    next_ticket: u64,
    /// Barriers completed.
    completed: u64,
    /// Collectives other than barriers completed.
    pub(super) collectives: u64,
    pub(super) transfers: Transfers,
    /// Collectives over messages running in the background, by ticket, and those ended.
    background: Vec<(u64, Box<dyn Background>)>,
    background_ended: HashMap<u64, BackgroundEnd>,
}

impl Endpoint {
    /// The endpoint over `port`: its transfer buffers allocated and provided, the port opened
    /// to its peers' puts. `NICBAR_COLL_RENDEZVOUS` (a byte count, or `off`) and
    /// `NICBAR_COLL_UNEXPECTED_BYTES` change the rendezvous threshold and the limit of
    /// unexpected data. The endpoint's waits spin on their own, progressing the transfers and
    /// running the caller's idle work between polls ([`Op::with_spin`]), then sleep on the port
    /// at once: the port's wait mode becomes [`WaitMode::Sleep`].
    ///
    /// # Errors
    /// What the port says when its arena has no room.
    pub fn new(mut port: Port) -> Result<Self, Error> {
        port.set_wait_mode(WaitMode::Sleep);
        let transfers = Transfers::new(&mut port, DEFAULT_TIMEOUT)?;
        let mut endpoint = Self {
            port,
            queued: VecDeque::new(),
            held_back: None,
            running: Vec::new(),
            ended: HashMap::new(),
            broadcasts: HashMap::new(),
            next_ticket: 1,
            completed: 0,
            collectives: 0,
            transfers,
            background: Vec::new(),
            background_ended: HashMap::new(),
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

    /// The port the endpoint runs on.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// The port, to use beside the collectives (its barrier numbering, waits). Events taken
    /// from it here are not the transfers': take only those the collectives do not use.
    pub fn port_mut(&mut self) -> &mut Port {
        &mut self.port
    }

    /// Closes the port: peers' barriers waiting for it fail, naming it.
    ///
    /// # Errors
    /// What the port says when the daemon refuses or cannot be reached.
    pub fn close(self) -> Result<(), Error> {
        self.port.close()
    }

    /// Barriers (and NIC broadcasts) that completed through this endpoint; failed ones are not
    /// counted.
    pub fn barriers_completed(&self) -> u64 {
        self.completed
    }

    /// Data collectives (all but barriers) that completed through this endpoint.
    pub fn collectives_completed(&self) -> u64 {
        self.collectives
    }

    /// The transfers under the collectives: the NIC level, for programs and tests that move
    /// messages by key themselves.
    pub fn transfers(&self) -> &Transfers {
        &self.transfers
    }

    /// The transfers, to send, forward and take messages by key; [`Endpoint::pump_transfers`]
    /// moves them.
    pub fn transfers_mut(&mut self) -> &mut Transfers {
        &mut self.transfers
    }

    /// What the transfers did so far.
    pub fn transfer_counters(&self) -> TransferCounters {
        self.transfers.counters()
    }

    /// Messages of `threshold` bytes or more go by rendezvous from now on (`usize::MAX`: none);
    /// [`RENDEZVOUS_THRESHOLD`] until then.
    pub fn set_rendezvous_threshold(&mut self, threshold: usize) {
        self.transfers.set_rendezvous_threshold(threshold);
    }

    /// Queues a barrier of `group`; returns its ticket (never 0).
    pub fn barrier_start(&mut self, group: &Group) -> u64 {
        self.enqueue(group, Carries::Nothing)
    }

    /// Queues an allreduce of `group` run by the NIC (see [`Port::nic_allreduce`]): this
    /// member's `data` combined with `spec`; returns its ticket (never 0). Its end comes as a
    /// barrier's; then [`Endpoint::take_broadcast`] gives the result.
    pub fn allreduce_start(&mut self, group: &Group, spec: crate::ReduceSpec, data: &[u8]) -> u64 {
        self.enqueue(group, Carries::Allreduce(spec, data.to_vec()))
    }

    /// Queues a start of `persistent` (a barrier or allreduce compiled once by
    /// [`Port::persistent_barrier`] or [`Port::persistent_allreduce`] on this endpoint's port),
    /// with this member's `data` for an allreduce; returns its ticket (never 0). It goes to the
    /// NIC as its compiled steps, one send token, in the order of the endpoint's queue; its end
    /// comes as a barrier's, and [`Endpoint::take_broadcast`] gives an allreduce's result.
    pub fn persistent_start(&mut self, persistent: &PersistentCollective, data: &[u8]) -> u64 {
        self.enqueue(
            persistent.group(),
            Carries::Persistent(persistent.clone(), data.to_vec()),
        )
    }

    /// Queues a broadcast of `group` from rank `root` run by the NIC (`data`: the bytes, at the
    /// root); returns its ticket (never 0). Its end comes as a barrier's; then
    /// [`Endpoint::take_broadcast`] gives the bytes.
    pub fn broadcast_start(&mut self, group: &Group, root: usize, data: &[u8]) -> u64 {
        self.enqueue(group, Carries::Broadcast(root, data.to_vec()))
    }

    /// The bytes of the ended broadcast (or the result of the ended allreduce) with `ticket`,
    /// taken.
    pub fn take_broadcast(&mut self, ticket: u64) -> Option<Vec<u8>> {
        self.broadcasts.remove(&ticket)
    }

    fn enqueue(&mut self, group: &Group, carries: Carries) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1).max(1);
        self.queued.push_back((ticket, group.clone(), carries));
        self.progress();
        ticket
    }

    /// The end of the barrier with `ticket`, taken; `None` while it runs or if no barrier has
    /// this ticket (then `pending` says which).
    pub fn barrier_end(&mut self, ticket: u64) -> (Option<Outcome>, bool) {
        self.progress();
        match self.ended.remove(&ticket) {
            Some(outcome) => (Some(outcome), false),
            None => (
                None,
                self.running.iter().any(|(t, _, _)| *t == ticket)
                    || self.queued.iter().any(|(t, _, _)| *t == ticket),
            ),
        }
    }

    /// Takes the ends of running barriers that have come, posts queued barriers while the NIC
    /// has room for more, and moves the transfers on. Returns how many barriers ended.
    pub fn progress(&mut self) -> usize {
        let ended = self.progress_barriers();
        let _ = self.pump_transfers();
        self.progress_background();
        ended
    }

    /// Starts `work` in the background; returns its ticket for [`Endpoint::background_end`].
    pub fn start_background(&mut self, work: Box<dyn Background>) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket = self.next_ticket.wrapping_add(1).max(1);
        self.background.push((ticket, work));
        self.progress_background();
        ticket
    }

    /// Progresses the background collectives; returns how many ended.
    pub(super) fn progress_background(&mut self) -> usize {
        if self.background.is_empty() {
            return 0;
        }
        // Taken out while they run: each borrows the endpoint.
        let mut running = std::mem::take(&mut self.background);
        let before = running.len();
        running.retain_mut(|(ticket, work)| match work.poll(self) {
            Some(outcome) => {
                let output = work.take_output();
                self.background_ended.insert(*ticket, (outcome, output));
                false
            }
            None => true,
        });
        let ended = before - running.len();
        running.append(&mut self.background);
        self.background = running;
        ended
    }

    /// How background collective `ticket` ended, and what it left, once it has (taken: asked
    /// once); None while it runs or for a ticket this endpoint does not know
    /// ([`Endpoint::background_running`] tells them apart). Progresses first.
    pub fn background_end(&mut self, ticket: u64) -> Option<BackgroundEnd> {
        if !self.background_ended.contains_key(&ticket) {
            self.progress();
        }
        self.background_ended.remove(&ticket)
    }

    /// Whether background collective `ticket` is still running.
    pub fn background_running(&self, ticket: u64) -> bool {
        self.background.iter().any(|(t, _)| *t == ticket)
    }

    /// [`Endpoint::progress`]'s barrier half: takes the ends that have come and posts queued
    /// barriers. Returns how many ended.
    pub(super) fn progress_barriers(&mut self) -> usize {
        let mut ended = 0;
        loop {
            let mut index = 0;
            while index < self.running.len() {
                let (_, pending, _) = &self.running[index];
                if let Ok(false) = self.port.barrier_test(pending) {
                    index += 1;
                    continue;
                }
                let (ticket, pending, broadcast) = self.running.remove(index);
                let outcome = match broadcast {
                    Brings::Bytes => {
                        let mut bytes = [0; crate::NIC_BROADCAST_MAX];
                        self.port
                            .nic_broadcast_wait(pending, &mut bytes)
                            .map(|length| {
                                let length = length.min(bytes.len());
                                self.broadcasts.insert(ticket, bytes[..length].to_vec());
                            })
                    }
                    Brings::Result(mut value) => {
                        self.port.nic_allreduce_wait(pending, &mut value).map(|()| {
                            self.broadcasts.insert(ticket, value);
                        })
                    }
                    Brings::Nothing => self.port.barrier_wait(pending),
                };
                self.record(ticket, outcome);
                ended += 1;
            }
            if self.running.len() >= RUNNING_BARRIERS {
                break;
            }
            let Some((ticket, group, carries)) = self.queued.pop_front() else {
                break;
            };
            let started = match &carries {
                Carries::Broadcast(root, data) => {
                    self.port.nic_broadcast_start(&group, *root, data)
                }
                Carries::Allreduce(spec, data) => {
                    self.port.nic_allreduce_start(&group, *spec, data)
                }
                Carries::Persistent(persistent, data) => {
                    self.port.persistent_start(persistent, data)
                }
                Carries::Nothing => self.port.barrier_start(&group),
            };
            match started {
                Ok(pending) => {
                    self.held_back = None;
                    self.running.push((ticket, pending, carries.brings()));
                }
                Err(error) if self.comes_back(&error, &group) => {
                    // The port's tokens are out with the transfers' sends (a pipelined
                    // broadcast's segments, say): their ends give them back. It goes first
                    // when they do, and the ones behind it keep their order.
                    self.queued.push_front((ticket, group, carries));
                    break;
                }
                Err(error) => {
                    self.held_back = None;
                    self.record(ticket, Err(error));
                    ended += 1;
                }
            }
        }
        ended
    }

    /// The caller waits for the message `key` from `from`, of `length` bytes, from now on
    /// ([`Transfers::want`]; and [`Transfers::offer`]: a message that comes by rendezvous lands
    /// where this endpoint offers, with no round trip before the sender's puts).
    ///
    /// # Errors
    /// As [`Transfers::want`].
    pub fn expect(&mut self, from: Member, key: Key, length: usize) -> Result<(), TransferError> {
        self.transfers.want(&mut self.port, from, key)?;
        self.transfers.offer(&mut self.port, from, key, length);
        Ok(())
    }

    /// Hands the port's waiting events to the transfers and posts what they have to send.
    /// Returns whether anything happened. [`Endpoint::progress`] and every wait of an [`Op`]
    /// call it; a program that drives transfers itself ([`Endpoint::transfers_mut`]) calls it
    /// in its loop.
    ///
    /// # Errors
    /// [`TransferError::Port`] when the port fails.
    pub fn pump_transfers(&mut self) -> Result<bool, TransferError> {
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

    /// Progresses, and if nothing moved, sleeps until the NIC reports an event or `timeout`
    /// passes, then progresses again. Returns how many barriers ended. An event taken, data
    /// posted or a barrier ended is news for the caller, who looks before waiting again: no
    /// sleep follows it.
    pub fn wait(&mut self, timeout: Duration) -> usize {
        let mut ended = self.progress_barriers();
        let moved = self.pump_transfers().unwrap_or(false) || self.progress_background() > 0;
        let held_back = self.held_back.is_some();
        let waiting = !self.running.is_empty() || !self.background.is_empty();
        if ended == 0 && !moved && (held_back || waiting || self.transfers.has_outgoing()) {
            // Wakes for a barrier's own end too (which `receive` keeps); for sends' ends only
            // when they may be what the transfers, or a barrier held back, wait for.
            let wake = if held_back {
                Wake::ANY
            } else {
                self.transfers.wake()
            };
            let _ = self.port.wait_ready_for(timeout, wake);
            ended = self.progress();
        }
        ended
    }

    /// Whether a barrier the port refused to start for `error` can start once the port's sends
    /// end: it ran out of send tokens, or of receive tokens for the barrier's end, or its arena
    /// is full while barriers run (their ends free their schedules). Not past the group's
    /// timeout: a port whose tokens never come back fails the barrier then, rather than hang.
    fn comes_back(&mut self, error: &BarrierError, group: &Group) -> bool {
        let transient = match error {
            BarrierError::Port(Error::NoSendTokens | Error::NoReceiveTokens) => true,
            BarrierError::Port(Error::ArenaFull { .. }) => !self.running.is_empty(),
            _ => false,
        };
        if !transient {
            return false;
        }
        let since = *self.held_back.get_or_insert_with(Instant::now);
        since.elapsed() < group.options.timeout.unwrap_or(DEFAULT_TIMEOUT)
    }

    fn record(&mut self, ticket: u64, outcome: Result<(), BarrierError>) {
        let outcome = match outcome {
            Ok(()) => {
                self.completed += 1;
                Ok(())
            }
            Err(error) => {
                let rank = match &error {
                    BarrierError::Failed { rank, .. } => *rank,
                    _ => None,
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_threshold_variable_reads_a_count_or_off() {
        use super::rendezvous_threshold_from as read;
        assert_eq!(read(None), None);
        assert_eq!(read(Some("131072".into())), Some(131_072));
        assert_eq!(read(Some(" off ".into())), Some(usize::MAX));
        assert_eq!(read(Some("OFF".into())), Some(usize::MAX));
        assert_eq!(read(Some("64k".into())), None);
    }
}
