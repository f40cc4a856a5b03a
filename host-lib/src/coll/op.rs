//! One collective operation of a communicator on an endpoint: its sends and receives, keyed by
//! the communicator's context, the operation's sequence number and a part, and the wait between
//! them, which progresses everything on the port and runs the caller's idle work.

use std::time::{Duration, Instant};

use crate::{Group, Member};

use super::endpoint::{Background, DEFAULT_TIMEOUT, Endpoint};
use super::error::CollError;
use super::transfer::{FAILED_PART, Key, PROBE_PART, Payload, SendId};
#[cfg(doc)]
use super::transfer::{TransferCounters, Transfers};

/// Polls with nothing to do before a wait sleeps on the port, by default.
const SPINS: u32 = 64;
/// How long one sleep on the port lasts at most (the idle callback runs between sleeps).
const SLEEP: Duration = Duration::from_micros(200);
/// How long a wait hears nothing before it asks whether the peer's port is still open (a
/// message delivered to a port just before it closed says nothing of the peer's death; a probe
/// sent after does, long before the timeout). Each probe with nothing heard since doubles it,
/// up to [`PROBE_MOST`], so that a peer computing for minutes gets a few probes, not hundreds.
const PROBE_AFTER: Duration = Duration::from_millis(250);
/// The longest a quiet wait goes between probes.
const PROBE_MOST: Duration = Duration::from_secs(4);

/// What an operation that runs in the background keeps between the calls that progress it (its
/// endpoint is borrowed only while one runs): its sends, and when it started.
pub(super) struct Suspended {
    sends: Vec<(SendId, usize)>,
    started: Instant,
    timeout: Duration,
    quiet_since: Instant,
    probe_after: Duration,
}

/// One collective operation of a communicator on an endpoint: its sends, its receives, and the
/// wait between them (which progresses everything on the port and runs the caller's idle work).
pub struct Op<'a> {
    endpoint: &'a mut Endpoint,
    members: &'a [Member],
    /// The communicator's group, for what runs in the NIC (its broadcasts).
    group: Option<&'a Group>,
    rank: usize,
    context: u32,
    sequence: u32,
    started: Instant,
    timeout: Duration,
    idle: Option<&'a mut dyn FnMut()>,
    sends: Vec<(SendId, usize)>,
    spin: u32,
    /// Since when the operation's waits have seen nothing move (or last probed), and how long
    /// until the next probe.
    quiet_since: Instant,
    probe_after: Duration,
}

impl Drop for Op<'_> {
    /// The operation's sends are the NIC's alone from here ([`Transfers::detach`]).
    fn drop(&mut self) {
        for &(id, _) in &self.sends {
            self.endpoint.transfers.detach(id);
        }
    }
}

impl<'a> Op<'a> {
    /// Operation `sequence` of the communicator with `context` whose ranks are `members`, run by
    /// the member at this endpoint's port. Every rank names the operation alike: the same
    /// `context` and `sequence`, a new `sequence` for each operation of the communicator. It
    /// waits for a peer [`DEFAULT_TIMEOUT`] unless [`Op::with_timeout`] says otherwise.
    ///
    /// # Errors
    /// [`CollError::Argument`] if this endpoint's port is not a member.
    pub fn new(
        endpoint: &'a mut Endpoint,
        members: &'a [Member],
        context: u32,
        sequence: u32,
    ) -> Result<Self, CollError> {
        let me = Member::new(endpoint.port.node_id(), endpoint.port.port_id());
        let rank = members.iter().position(|m| *m == me).ok_or_else(|| {
            CollError::Argument(format!("this process's port ({me}) is not in the group"))
        })?;
        let now = Instant::now();
        let fresh = Suspended {
            sends: Vec::new(),
            started: now,
            timeout: DEFAULT_TIMEOUT,
            quiet_since: now,
            probe_after: PROBE_AFTER,
        };
        Ok(Self::resume(
            endpoint,
            members,
            (rank, context, sequence),
            fresh,
        ))
    }

    /// The operation `suspended` left off, on `endpoint` again (its members, context and
    /// sequence as when it was built).
    pub(super) fn resume(
        endpoint: &'a mut Endpoint,
        members: &'a [Member],
        (rank, context, sequence): (usize, u32, u32),
        suspended: Suspended,
    ) -> Self {
        Self {
            endpoint,
            members,
            group: None,
            rank,
            context,
            sequence,
            started: suspended.started,
            timeout: suspended.timeout,
            idle: None,
            sends: suspended.sends,
            spin: SPINS,
            quiet_since: suspended.quiet_since,
            probe_after: suspended.probe_after,
        }
    }

    /// Leaves the operation off until [`Op::resume`]: its sends stay its own.
    pub(super) fn suspend(mut self) -> Suspended {
        Suspended {
            sends: std::mem::take(&mut self.sends),
            started: self.started,
            timeout: self.timeout,
            quiet_since: self.quiet_since,
            probe_after: self.probe_after,
        }
    }

    /// Hands the operation to its endpoint to run in the background: `work` gets the
    /// communicator's members, the operation's (rank, context, sequence) and what it has done
    /// (its sends stay its own). Returns the ticket [`Endpoint::background_end`] takes.
    pub(super) fn into_background(
        mut self,
        work: impl FnOnce(Vec<Member>, (usize, u32, u32), Suspended) -> Box<dyn Background>,
    ) -> u64 {
        let suspended = Suspended {
            sends: std::mem::take(&mut self.sends),
            started: self.started,
            timeout: self.timeout,
            quiet_since: self.quiet_since,
            probe_after: self.probe_after,
        };
        let identity = (self.rank, self.context, self.sequence);
        let work = work(self.members.to_vec(), identity, suspended);
        self.endpoint.start_background(work)
    }

    /// This operation waiting at most `timeout` for a peer's data (and retrying a send while its
    /// receiver takes nothing).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// This operation running `idle` between polls that find nothing to do while it waits (an
    /// MPI library's progress of its other requests).
    #[must_use]
    pub fn with_idle(mut self, idle: &'a mut dyn FnMut()) -> Self {
        self.idle = Some(idle);
        self
    }

    /// The endpoint the operation runs on, for what a caller does between its sends and
    /// receives ([`Endpoint::pump_transfers`], its counters).
    pub fn endpoint(&mut self) -> &mut Endpoint {
        self.endpoint
    }

    /// This operation with `spin` polls before each sleep on the port (0: the default).
    #[must_use]
    pub fn with_spin(mut self, spin: u32) -> Self {
        if spin > 0 {
            self.spin = spin;
        }
        self
    }

    /// This operation with the communicator's `group` (its members are the operation's), which
    /// the NIC's broadcast runs on.
    #[must_use]
    pub fn with_group(mut self, group: &'a Group) -> Self {
        self.group = Some(group);
        self
    }

    /// Broadcasts `buffer` (at most [`crate::NIC_BROADCAST_MAX`] bytes, the same length on
    /// every rank) from `root` through the NIC's barrier engine, and ends the operation.
    ///
    /// # Errors
    /// [`CollError::Argument`] without a group or for too many bytes; [`CollError::Nic`] if the
    /// NIC's broadcast failed; [`CollError::Length`] if the root sent another length; as
    /// [`Op::finish`].
    pub fn nic_broadcast(mut self, root: usize, buffer: &mut [u8]) -> Result<(), CollError> {
        let group = self
            .group
            .ok_or_else(|| CollError::Argument("no group for the NIC's broadcast".into()))?;
        if buffer.len() > crate::NIC_BROADCAST_MAX {
            return Err(CollError::Argument(format!(
                "the NIC broadcasts at most {} bytes, not {}",
                crate::NIC_BROADCAST_MAX,
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
                    return Err(CollError::Nic { rank, message });
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
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The communicator's size.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    fn key(&self, part: u32) -> Key {
        Key {
            context: self.context,
            sequence: self.sequence,
            part,
        }
    }

    /// `bytes` ready to send to any number of ranks ([`Op::send`]): for a message that goes by
    /// rendezvous, copied once into a registered region the NIC puts it from.
    pub fn stage(&mut self, bytes: &[u8]) -> Payload {
        let endpoint = &mut *self.endpoint;
        endpoint.transfers.stage(&mut endpoint.port, bytes)
    }

    /// Sends `data` to `to` as `part` of this operation (queued: it goes out while the
    /// operation waits).
    pub fn send(&mut self, to: usize, part: u32, data: impl Into<Payload>) {
        let key = self.key(part);
        let id = self
            .endpoint
            .transfers
            .send(self.members[to], key, data.into());
        self.sends.push((id, to));
    }

    /// Posts what is queued now instead of at the next wait, so that the NIC moves it while
    /// the caller goes on: for a root that stages a block for each rank in turn, whose first
    /// block would otherwise wait until the last is staged.
    pub fn post(&mut self) {
        // A failure here is the port's, and the wait that follows meets it again.
        let _ = self.endpoint.pump_transfers();
    }

    /// Whether a message of `length` bytes goes by rendezvous: put by the NIC into a landing
    /// its receiver offers, whole, rather than sent eagerly segment by segment.
    pub fn by_rendezvous(&self, length: usize) -> bool {
        self.endpoint.transfers.by_rendezvous(length)
    }

    /// Says ahead that `part` from `from`, of `length` bytes, will be waited for: if it comes
    /// by rendezvous, a landing region goes to `from` now, so that its puts start as soon as it
    /// sends, however late this rank starts waiting ([`Transfers::offer`]).
    pub fn offer(&mut self, from: usize, part: u32, length: usize) {
        let key = self.key(part);
        let endpoint = &mut *self.endpoint;
        endpoint
            .transfers
            .offer(&mut endpoint.port, self.members[from], key, length);
    }

    /// Waits for `part` of this operation from `from`, which must be `length` bytes.
    ///
    /// # Errors
    /// [`CollError::Length`] when another length came; [`CollError::Peer`] when a send of the
    /// operation failed or the message was dropped for the limit of unexpected data;
    /// [`CollError::Timeout`] past the operation's timeout; [`CollError::Port`] when the port
    /// failed.
    pub fn receive(&mut self, from: usize, part: u32, length: usize) -> Result<Vec<u8>, CollError> {
        let key = self.key(part);
        let member = self.members[from];
        self.wait_for(from, key, length, |transfers| transfers.take(member, key))
            .and_then(|message| match message.len() == length {
                true => Ok(message),
                false => Err(CollError::Length {
                    rank: from,
                    expected: length,
                    got: message.len(),
                }),
            })
    }

    /// [`Op::receive`] of `out.len()` bytes into `out` (a message that came by rendezvous is
    /// copied once, from the region it landed in).
    ///
    /// # Errors
    /// As [`Op::receive`].
    pub fn receive_into(
        &mut self,
        from: usize,
        part: u32,
        out: &mut [u8],
    ) -> Result<(), CollError> {
        let key = self.key(part);
        let member = self.members[from];
        let expected = out.len();
        self.wait_for(from, key, expected, |transfers| {
            transfers.take_into(member, key, out)
        })?
        .map_err(|got| CollError::Length {
            rank: from,
            expected,
            got,
        })
    }

    /// [`Op::receive`] if `part` from `from` is here, else None (nothing waits).
    ///
    /// # Errors
    /// As [`Op::receive`].
    pub(super) fn try_receive(
        &mut self,
        from: usize,
        part: u32,
        length: usize,
    ) -> Result<Option<Vec<u8>>, CollError> {
        let key = self.key(part);
        let member = self.members[from];
        let Some(message) =
            self.look_for(from, key, length, |transfers| transfers.take(member, key))?
        else {
            return Ok(None);
        };
        match message.len() == length {
            true => Ok(Some(message)),
            false => Err(CollError::Length {
                rank: from,
                expected: length,
                got: message.len(),
            }),
        }
    }

    /// [`Op::receive_into`] if `part` from `from` is here (true), else false (nothing waits).
    ///
    /// # Errors
    /// As [`Op::receive`].
    pub(super) fn try_receive_into(
        &mut self,
        from: usize,
        part: u32,
        out: &mut [u8],
    ) -> Result<bool, CollError> {
        let key = self.key(part);
        let member = self.members[from];
        let expected = out.len();
        match self.look_for(from, key, expected, |transfers| {
            transfers.take_into(member, key, out)
        })? {
            None => Ok(false),
            Some(Ok(())) => Ok(true),
            Some(Err(got)) => Err(CollError::Length {
                rank: from,
                expected,
                got,
            }),
        }
    }

    /// Says the message `key` from rank `from`, of `length` bytes, is waited for, and looks
    /// once whether `take` finds it.
    fn look_for<T>(
        &mut self,
        from: usize,
        key: Key,
        length: usize,
        take: impl FnOnce(&mut super::transfer::Transfers) -> Option<T>,
    ) -> Result<Option<T>, CollError> {
        self.endpoint
            .expect(self.members[from], key, length)
            .map_err(|error| CollError::Peer { rank: from, error })?;
        Ok(take(&mut self.endpoint.transfers))
    }

    /// Waits until `take` finds the message `key` from rank `from`, of `length` bytes.
    fn wait_for<T>(
        &mut self,
        from: usize,
        key: Key,
        length: usize,
        mut take: impl FnMut(&mut super::transfer::Transfers) -> Option<T>,
    ) -> Result<T, CollError> {
        self.endpoint
            .expect(self.members[from], key, length)
            .map_err(|error| CollError::Peer { rank: from, error })?;
        let mut polls = 0;
        loop {
            if let Some(message) = take(&mut self.endpoint.transfers) {
                return Ok(message);
            }
            self.step(&mut polls, from)?;
        }
    }

    /// Asks for `part` from `from` to be passed on to each rank of `to` as it arrives
    /// (forwarded segment by segment from the receive buffers: [`Transfers::forward`]); the
    /// sends to `to` are the operation's, as [`Op::send`]'s. Returns whether it will be: not if
    /// part of the message came already ([`Op::receive_forwarded`] then sends it on).
    pub fn forward(&mut self, from: usize, part: u32, to: &[usize]) -> bool {
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

    /// [`Op::receive_into`] of `part` from `from`, for which [`Op::forward`] to `to` said
    /// `forwarded`: if it said no, the message is sent on to `to` here.
    ///
    /// # Errors
    /// As [`Op::receive`].
    pub fn receive_forwarded(
        &mut self,
        from: usize,
        part: u32,
        out: &mut [u8],
        to: &[usize],
        forwarded: bool,
    ) -> Result<(), CollError> {
        self.receive_into(from, part, out)?;
        if !forwarded && !to.is_empty() {
            let data = self.stage(out);
            for &rank in to {
                self.send(rank, part, data.clone());
            }
        }
        Ok(())
    }

    /// Waits until every send of the operation is in the NIC's hands (its data copied into the
    /// port's send buffers: the NIC delivers it from there, retrying as it must). Until the
    /// operation ends, a send that fails (a peer's port closed) fails it at once; after, the
    /// failure is counted ([`TransferCounters::late_failures`]) and the peer's next
    /// operation fails on its own.
    ///
    /// # Errors
    /// [`CollError::Peer`] when a send failed; [`CollError::Timeout`] past the operation's
    /// timeout; [`CollError::Port`] when the port failed.
    pub fn finish(mut self) -> Result<(), CollError> {
        let mut polls = 0;
        while let Some(rank) = self.sending_to()? {
            self.step(&mut polls, rank)?;
        }
        self.endpoint.collectives += 1;
        Ok(())
    }

    /// Waits until at most the latest `pending` of the operation's sends are not yet in the
    /// NIC's hands: a sender of many messages keeps that many on their way, and no more of its
    /// memory staged at once.
    ///
    /// # Errors
    /// As [`Op::finish`].
    pub fn wait_sends(&mut self, pending: usize) -> Result<(), CollError> {
        let mut polls = 0;
        loop {
            let older = self.sends.len().saturating_sub(pending);
            match self.sending_among(older)? {
                Some(rank) => self.step(&mut polls, rank)?,
                None => return Ok(()),
            }
        }
    }

    /// [`Op::finish`] if every send is in the NIC's hands (true), else false (nothing waits).
    ///
    /// # Errors
    /// As [`Op::finish`].
    pub(super) fn try_finish(&mut self) -> Result<bool, CollError> {
        if self.sending_to()?.is_some() {
            return Ok(false);
        }
        self.endpoint.collectives += 1;
        Ok(true)
    }

    /// The rank of a send not yet in the NIC's hands, if any.
    ///
    /// # Errors
    /// [`CollError::Peer`] when a send failed.
    fn sending_to(&mut self) -> Result<Option<usize>, CollError> {
        self.sending_among(self.sends.len())
    }

    /// [`Op::sending_to`] among the operation's first `first` sends.
    ///
    /// # Errors
    /// [`CollError::Peer`] when one of them failed.
    fn sending_among(&mut self, first: usize) -> Result<Option<usize>, CollError> {
        let mut failed = None;
        for &(id, to) in &self.sends[..first] {
            match self.endpoint.transfers.send_done(id) {
                Ok(true) => {}
                Ok(false) => return Ok(Some(to)),
                Err(error) => {
                    failed = Some(CollError::Peer { rank: to, error });
                    break;
                }
            }
        }
        match failed {
            Some(error) => Err(self.send_failed(error)),
            None => Ok(None),
        }
    }

    /// After [`PROBE_AFTER`] (doubling) with nothing moving, sends `rank` a probe ([`PROBE_PART`]): if its
    /// port has closed, the probe fails, and the wait with it, naming `rank`.
    fn probe_if_quiet(&mut self, rank: usize, busy: bool) {
        if busy {
            self.quiet_since = Instant::now();
            self.probe_after = PROBE_AFTER;
        } else if rank != self.rank && self.quiet_since.elapsed() >= self.probe_after {
            self.quiet_since = Instant::now();
            self.probe_after = (self.probe_after * 2).min(PROBE_MOST);
            self.send(rank, PROBE_PART, Vec::new());
        }
    }

    /// Settles the sends the NIC has delivered.
    ///
    /// # Errors
    /// [`CollError::Peer`] when one of them failed.
    fn settle_sends(&mut self) -> Result<(), CollError> {
        let failed = self.sends.iter().find_map(|&(id, to)| {
            let error = self.endpoint.transfers.send_done(id).err()?;
            Some(CollError::Peer { rank: to, error })
        });
        match failed {
            Some(error) => Err(self.send_failed(error)),
            None => self.given_up().map_err(|gave_up| self.failing(gave_up)),
        }
    }

    /// The operation's end for a send that failed (`error`): if another member said it gave the
    /// operation up, its word stands. A member that heard of the failure first may have left
    /// already, and a send to it then fails (its port closed) without it being the one missing.
    fn send_failed(&mut self, error: CollError) -> CollError {
        match self.given_up() {
            Err(gave_up) => self.failing(gave_up),
            Ok(()) => self.failing(error),
        }
    }

    /// Fails if another member said it gave the operation up ([`FAILED_PART`]), naming the
    /// rank it found missing.
    fn given_up(&mut self) -> Result<(), CollError> {
        let Some((by, named)) =
            self.endpoint
                .transfers
                .failed(self.context, self.sequence, self.members)
        else {
            return Ok(());
        };
        let rank = usize::try_from(named)
            .ok()
            .filter(|&rank| rank < self.size());
        Err(CollError::GaveUp { by, rank })
    }

    /// `error`, this operation's end, after telling the other members (but the one it names)
    /// that this rank gave the operation up and whom it found missing, so that one waiting on
    /// this rank names that rank rather than this one. A rank that gave up on another's word
    /// passes it on (to all but that member): a member whose send to it fails once it has left
    /// then holds the word already, sent before its port closed.
    fn failing(&mut self, error: CollError) -> CollError {
        let (named, told_by) = match error {
            CollError::Peer { rank, .. } | CollError::Timeout { rank, .. } => (Some(rank), None),
            CollError::GaveUp { by, rank } => (rank, Some(by)),
            _ => return error,
        };
        let word = named.map_or(u64::MAX, |rank| rank as u64).to_le_bytes();
        let me = self.rank;
        for other in 0..self.size() {
            if other != me && Some(other) != named && Some(other) != told_by {
                self.send(other, FAILED_PART, word.to_vec());
            }
        }
        // Posted now: the caller may leave as soon as it hears.
        let _ = self.endpoint.pump_transfers();
        error
    }

    /// One poll that never waits, for an operation in the background: progresses the port and
    /// settles delivered sends. Returns whether anything moved.
    ///
    /// # Errors
    /// As [`Op::finish`].
    pub(super) fn poll(&mut self, rank: usize) -> Result<bool, CollError> {
        let busy = self
            .endpoint
            .pump_transfers()
            .map_err(|error| CollError::Port(error.to_string()))?;
        self.settle_sends()?;
        self.probe_if_quiet(rank, busy);
        let waited = self.started.elapsed();
        if !busy && waited >= self.timeout {
            return Err(self.failing(CollError::Timeout { rank, waited }));
        }
        Ok(busy)
    }

    /// One poll of a wait for `rank`: progresses the port, settles delivered sends, and if
    /// nothing moved runs the idle work, and after a few empty polls sleeps on the port a
    /// little.
    ///
    /// # Errors
    /// [`CollError::Peer`] when a send failed; [`CollError::Timeout`] past the timeout;
    /// [`CollError::Port`].
    fn step(&mut self, polls: &mut u32, rank: usize) -> Result<(), CollError> {
        // Whatever moved counts: a barrier's end or a message that came in this step is what
        // the caller may be waiting for, and it looks again before this wait may sleep. The
        // collectives in the background go on meanwhile: a peer may wait on one of them before
        // it joins this one.
        let ended = self.endpoint.progress_barriers() + self.endpoint.progress_background();
        let busy = self
            .endpoint
            .pump_transfers()
            .map_err(|error| CollError::Port(error.to_string()))?
            || ended > 0;
        self.settle_sends()?;
        self.probe_if_quiet(rank, busy);
        if busy {
            // The caller's idle work waits for a poll that finds nothing: on a host with no
            // core to spare, Open MPI's progress yields the core, which the next step of the
            // collective wants now.
            *polls = 0;
            return Ok(());
        }
        if let Some(idle) = self.idle.as_mut() {
            idle();
        }
        *polls += 1;
        let waited = self.started.elapsed();
        if waited >= self.timeout {
            return Err(self.failing(CollError::Timeout { rank, waited }));
        }
        let wake = self.endpoint.transfers.wake();
        if *polls > self.spin
            && let Ok(Some(event)) = self.endpoint.port.receive_timeout_for(SLEEP, wake)
        {
            let _ = self
                .endpoint
                .transfers
                .handle(&mut self.endpoint.port, event);
        }
        Ok(())
    }
}
