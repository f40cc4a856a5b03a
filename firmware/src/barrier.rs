//! The barrier engine: one interpreter for every algorithm (paper §5; Hoefler, Mehlan, Mietke,
//! Rehm, *Fast Barrier Synchronization for InfiniBand*).
//!
//! The host compiles pairwise exchange, gather-broadcast or n-way dissemination into a list of
//! [`Step`]s and posts one barrier send token pointing at it (paper §5.2). SDMA pulls the schedule
//! into NIC memory and points the port's running barrier at it (the paper's "send token pointer",
//! §4.2); from then on the NIC runs the steps with no host involvement: a `SEND` step queues a
//! barrier packet and moves on, a `RECV` step consumes a matching packet from the
//! unexpected-barrier record or waits for one, and `EXCHANGE` does both. When the last step is
//! done the NIC writes `BARRIER_COMPLETED` and returns the token.
//!
//! Barrier packets ride the connection's reliable sequence (§3.3), so their order relative to data
//! holds, and each resends on its own from the sent list (the problem of §4.4 does not arise).
//! A step whose peer is a port of this same NIC never touches the wire: the packet is recorded
//! straight into the NIC's local record (the optimisation §3.4 left for later).
//!
//! A barrier that cannot complete ends with `BARRIER_FAILED`, naming the member it was waiting
//! for: the member's port closed, its node became unreachable, or the caller's timeout expired.
//!
//! A broadcast ([`SendKind::BROADCAST`]) is a barrier whose root supplies up to
//! [`BROADCAST_MAX`] bytes. The port slot keeps them ([`crate::port::BroadcastBytes`]), and from
//! then on every packet the port sends for that barrier carries them — built, and rebuilt for
//! every retransmission, from that copy. A member keeps the bytes the first packet carrying them
//! brings, before the packet completes any step, so its own later packets carry them on: any
//! schedule whose completion at every member follows the root's entry (every barrier's) takes
//! them to every member that has a place for them
//! ([`crate::port::broadcast_bytes::BROADCASTS_KEPT`]), and the gather-broadcast tree rooted at
//! the root does it in its down-phase alone, to members that always have one.
//! The completion event holds them; a member that completes without them fails the broadcast
//! with `BAD_SCHEDULE` (its schedule did not follow the root's).

use heapless::Vec;
use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{BarrierId, Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::{BROADCAST_MAX, PacketHeader, RejectReason};
use shared_abi::ring::SharedMemory;
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step, StepOp};
use shared_abi::token::{SendKind, SendToken};
use zerocopy::FromZeros;

use crate::connection::Body;
use crate::port::{BarrierRun, Broadcast, RETRIES, RUNNING_BARRIERS, Reduction, Retry, ValueKey};
use crate::record::Failed;
use crate::reduce::combine;
use crate::time::Instant;
use crate::{Hal, Nic};
use shared_abi::reduce::{REDUCE_MAX, ReduceRefusal};
use shared_abi::schedule::StepCombine;

/// Reads a posted schedule of `steps` steps at arena offset `buffer` and checks every step.
///
/// # Errors
/// `BAD_BUFFER` for a schedule outside the arena, `BAD_SCHEDULE` for a step that is not well
/// formed.
fn read_schedule(
    memory: &impl SharedMemory,
    layout: &shared_abi::region::RegionLayout,
    buffer: u64,
    steps: usize,
) -> Result<Vec<Step, MAX_SCHEDULE_STEPS>, Status> {
    let offset = layout
        .arena_range(buffer, steps * core::mem::size_of::<Step>())
        .ok_or(Status::BAD_BUFFER)?;
    let mut schedule = Vec::new();
    for i in 0..steps {
        let mut step = Step::new_zeroed();
        memory
            .read(
                offset + i * core::mem::size_of::<Step>(),
                zerocopy::IntoBytes::as_mut_bytes(&mut step),
            )
            .map_err(|_| Status::BAD_BUFFER)?;
        if !step.is_valid() {
            return Err(Status::BAD_SCHEDULE);
        }
        schedule.push(step).map_err(|_| Status::BAD_SCHEDULE)?;
    }
    Ok(schedule)
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// SDMA took a barrier send token: pull its schedule in, check it, and start it.
    ///
    /// # Errors
    /// The status to refuse the token with.
    pub(crate) fn start_barrier(
        &mut self,
        port: usize,
        token: &SendToken,
        now: Instant,
    ) -> Result<(), Status> {
        let steps = token.length.get() as usize;
        if steps == 0 || steps > MAX_SCHEDULE_STEPS {
            return Err(Status::BAD_SCHEDULE);
        }
        if !token.schedule.is_valid() {
            return Err(Status::INVALID_TOKEN);
        }
        let root = token.kind == SendKind::BROADCAST
            && token.target_node == self.node
            && usize::from(token.target_port.0) == port;
        if root
            && token.barrier_id() != BarrierId::NONE
            && let Some(generation) = self
                .ports
                .open(port)
                .filter(|open| open.run_slot(token.barrier_id()).is_none())
                .map(|open| open.generation)
            && self
                .broadcast_place(port, generation, token.barrier_id(), true)
                .is_none()
        {
            // Every place holds bytes the port's own packets still need (earlier broadcasts'
            // packets not yet acknowledged): try again later.
            return Err(Status::NO_RESOURCES);
        }
        let memory = self.hal.port_memory(port).ok_or(Status::INVALID_TOKEN)?;
        let open = self.ports.open_mut(port).ok_or(Status::INVALID_TOKEN)?;
        // The steps, and where what follows them (a broadcast's bytes, a reduction's value)
        // starts in the arena.
        let (schedule, after_steps) = match token.schedule.runs_kept() {
            Some(slot) => {
                let kept = open.kept.get(slot).ok_or(Status::INVALID_TOKEN)?;
                let steps = kept
                    .steps(token.compare.get(), steps)
                    .ok_or(Status::BAD_SCHEDULE)?;
                (steps.clone(), token.buffer.get())
            }
            None => {
                let schedule = read_schedule(memory, &open.layout, token.buffer.get(), steps)?;
                if let Some(slot) = token.schedule.keeps_in() {
                    // Kept once read, whether the barrier starts now or is refused as busy.
                    let kept = open.kept.get_mut(slot).ok_or(Status::INVALID_TOKEN)?;
                    kept.tag = token.compare.get();
                    kept.steps.clone_from(&schedule);
                }
                let bytes = (steps * core::mem::size_of::<Step>()) as u64;
                let after = token.buffer.get().checked_add(bytes);
                (schedule, after.ok_or(Status::BAD_BUFFER)?)
            }
        };
        // Each running barrier has its own completion buffer and its own identity: a second
        // barrier of one identity could not tell its packets from the first's.
        if open.running_count() >= usize::from(open.barrier_buffers)
            || open.running_count() >= RUNNING_BARRIERS
            || open.run_slot(token.barrier_id()).is_some()
        {
            return Err(Status::BARRIER_BUSY);
        }
        let timeout = match token.timeout_us.get() {
            0 => self.config.default_barrier_timeout,
            us => core::time::Duration::from_micros(u64::from(us)),
        };
        let barrier = token.barrier_id();
        let broadcast = token.kind == SendKind::BROADCAST;
        // A broadcast's root reads its bytes, which follow the schedule in the arena.
        let mut root_bytes = [0u8; BROADCAST_MAX];
        let mut root_len = None;
        if broadcast {
            if barrier == BarrierId::NONE {
                return Err(Status::INVALID_TOKEN);
            }
            let len = usize::from(token.size);
            if root {
                if len == 0 || len > BROADCAST_MAX {
                    return Err(Status::TOO_LONG);
                }
                let at = open
                    .layout
                    .arena_range(after_steps, len)
                    .ok_or(Status::BAD_BUFFER)?;
                let out = root_bytes.get_mut(..len).ok_or(Status::TOO_LONG)?;
                memory.read(at, out).map_err(|_| Status::BAD_BUFFER)?;
                root_len = Some(len);
            }
        }
        // A reduction's member reads its value, which follows the schedule in the arena.
        let mut reduce = None;
        if token.kind == SendKind::REDUCE {
            if barrier == BarrierId::NONE {
                return Err(Status::INVALID_TOKEN);
            }
            let spec = token.reduce_spec();
            let len = usize::from(token.size);
            spec.check(len).map_err(|refusal| match refusal {
                ReduceRefusal::BadLength(_) => Status::TOO_LONG,
                _ => Status::INVALID_TOKEN,
            })?;
            let at = open
                .layout
                .arena_range(after_steps, len)
                .ok_or(Status::BAD_BUFFER)?;
            let mut value = [0u8; REDUCE_MAX];
            let out = value.get_mut(..len).ok_or(Status::TOO_LONG)?;
            memory.read(at, out).map_err(|_| Status::BAD_BUFFER)?;
            reduce = Some(Reduction {
                spec,
                len: len as u8,
                value,
            });
        }
        if barrier.job.get() != 0 {
            open.job = barrier.job.get();
        }
        let generation = open.generation;
        let started = open.start_run(BarrierRun {
            steps: schedule,
            index: 0,
            sent_current: false,
            barrier,
            context: token.context.get(),
            deadline: now.saturating_add(timeout),
            stalled_until: None,
            broadcast,
            reduce,
        });
        if started.is_none() {
            return Err(Status::BARRIER_BUSY);
        }
        if let Some(len) = root_len {
            self.remember_broadcast(
                port,
                generation,
                barrier,
                root_bytes.get(..len).unwrap_or(&[]),
            );
        }
        self.advance_pending |= 1 << port;
        self.run_pending_advances(now);
        Ok(())
    }

    /// Runs the barrier engines that may move: those marked in `advance_pending`, and those whose
    /// current send found no room (tried again on every poll, as room may have appeared).
    ///
    /// A barrier that waits for a packet is not looked at: it can move only once a packet is
    /// recorded for its port, and every place that records one (`deliver_barrier_packet`, the
    /// local path of `put_barrier_packet`) marks the port in `advance_pending`, as starting a
    /// barrier does.
    pub(crate) fn advance_all_barriers(&mut self, now: Instant) {
        for port in crate::ports_of(self.open_ports) {
            let stalled = self
                .ports
                .open(port)
                .is_some_and(|open| open.runs().any(|run| run.stalled_until.is_some()));
            if stalled {
                self.advance_pending |= 1 << port;
            }
        }
        self.run_pending_advances(now);
    }

    /// Whether one of `port`'s barriers could move if its engine ran now (checked by the tests
    /// after each poll: a barrier `advance_all_barriers` passed over must have nothing to move
    /// on).
    #[cfg(test)]
    pub(crate) fn barrier_could_advance(&self, port: usize) -> bool {
        (0..RUNNING_BARRIERS).any(|slot| self.run_could_advance(port, slot))
    }

    #[cfg(test)]
    fn run_could_advance(&self, port: usize, slot: usize) -> bool {
        let Some(run) = self.ports.open(port).and_then(|open| open.run(slot)) else {
            return false;
        };
        let Some(step) = run.steps.get(run.index) else {
            return true;
        };
        if step.op == StepOp::SEND || (step.op == StepOp::EXCHANGE && !run.sent_current) {
            // Tried on every poll while it finds no room.
            return run.stalled_until.is_none();
        }
        let source = usize::from(step.port.0);
        if step.node == self.node {
            return self.local_record.has(port, source, run.barrier, step.round);
        }
        self.connection_index(step.node)
            .and_then(|index| self.connections.get(index))
            .is_some_and(|connection| connection.record.has(port, source, run.barrier, step.round))
    }

    /// Runs the engines of the ports marked in `advance_pending` until none is left (a local
    /// step can wake another port's engine; this loop, not recursion, runs it).
    pub(crate) fn run_pending_advances(&mut self, now: Instant) {
        // Each pass either clears a bit or makes a step of progress; schedules are finite, so
        // this ends. The bound makes that obvious and costs nothing.
        for _ in 0..(PORTS_PER_NIC * RUNNING_BARRIERS * (MAX_SCHEDULE_STEPS + 2)) {
            if self.advance_pending == 0 {
                return;
            }
            let port = self.advance_pending.trailing_zeros() as usize;
            self.advance_pending &= !(1 << port);
            self.advance(port, now);
        }
    }

    /// Runs each of `port`'s barriers as far as the record allows (each on its own: one that
    /// waits holds up no other).
    fn advance(&mut self, port: usize, now: Instant) {
        for slot in 0..RUNNING_BARRIERS {
            self.advance_run(port, slot, now);
        }
    }

    /// Runs the barrier in `slot` of `port` as far as the record allows.
    fn advance_run(&mut self, port: usize, slot: usize, now: Instant) {
        let Some(barrier) = self.run_at(port, slot).map(|run| run.barrier) else {
            return;
        };
        loop {
            // A local step may have ended this barrier (an abort looped back).
            let Some(run) = self.run_at(port, slot).filter(|run| run.barrier == barrier) else {
                return;
            };
            let Some(step) = run.steps.get(run.index).copied() else {
                self.finish_barrier(port, slot, Status::SUCCESS, None);
                return;
            };
            let reduce = run.reduce;
            let sends =
                step.op == StepOp::SEND || (step.op == StepOp::EXCHANGE && !run.sent_current);
            if sends {
                // A reduction's packet carries the value so far, kept for its retransmissions.
                let kept = reduce.is_none_or(|reduction| {
                    self.keep_sent_value(port, barrier, step.round, reduction.data())
                });
                if !kept || !self.send_barrier_packet(port, step, barrier, now) {
                    // No room now: wake up a little later to try again.
                    let retry = now.saturating_add(self.config.retry_interval);
                    if let Some(run) = self.run_at_mut(port, slot, barrier) {
                        run.stalled_until = Some(retry);
                    }
                    return;
                }
                let Some(run) = self.run_at_mut(port, slot, barrier) else {
                    return;
                };
                run.stalled_until = None;
                if step.op == StepOp::SEND {
                    run.index += 1;
                    continue;
                }
                run.sent_current = true;
            }
            match self.take_recorded(port, step, barrier) {
                None => return, // Wait for the packet.
                Some(Some(failed)) => {
                    // The peer's barrier failed: so does ours, naming the member it named.
                    self.finish_barrier(
                        port,
                        slot,
                        failed.status,
                        Some((failed.node, failed.port)),
                    );
                    return;
                }
                Some(None) => {}
            }
            if let Some(reduction) = reduce
                && step.combine != StepCombine::NONE
            {
                match self.combine_arrived(port, barrier, step, reduction) {
                    Some(value) => {
                        if let Some(run) = self.run_at_mut(port, slot, barrier) {
                            run.reduce = Some(value);
                        }
                    }
                    None => {
                        // The peer's packet carried no value of the right length: it does not
                        // run this reduction as we do.
                        let peer = Some((step.node, step.port));
                        self.finish_barrier(port, slot, Status::BAD_SCHEDULE, peer);
                        return;
                    }
                }
            }
            let Some(run) = self.run_at_mut(port, slot, barrier) else {
                return;
            };
            run.index += 1;
            run.sent_current = false;
        }
    }

    /// The barrier running in `slot` of `port`.
    fn run_at(&self, port: usize, slot: usize) -> Option<&BarrierRun> {
        self.ports.open(port)?.run(slot)
    }

    /// The barrier running in `slot` of `port`, mutably, if it is still `barrier`.
    fn run_at_mut(
        &mut self,
        port: usize,
        slot: usize,
        barrier: BarrierId,
    ) -> Option<&mut BarrierRun> {
        self.ports
            .open_mut(port)?
            .run_mut(slot)
            .filter(|run| run.barrier == barrier)
    }

    /// The slot of `port`'s running barrier `barrier`.
    fn run_slot(&self, port: usize, barrier: BarrierId) -> Option<usize> {
        self.ports.open(port)?.run_slot(barrier)
    }

    /// Consumes the packet of `barrier` that `step` waits for, if it is recorded (and says
    /// whether it was an abort).
    fn take_recorded(
        &mut self,
        port: usize,
        step: Step,
        barrier: BarrierId,
    ) -> Option<Option<Failed>> {
        let source = usize::from(step.port.0);
        if step.node == self.node {
            return self.local_record.take(port, source, barrier, step.round);
        }
        self.connection_index(step.node)
            .and_then(|index| self.connections.get_mut(index))
            .and_then(|connection| connection.record.take(port, source, barrier, step.round))
    }

    /// Sends one barrier packet: over the wire, or for a port of this NIC straight into the
    /// local record. Returns `false` if it could not go now.
    fn send_barrier_packet(
        &mut self,
        port: usize,
        step: Step,
        barrier: BarrierId,
        now: Instant,
    ) -> bool {
        // Barrier packets from one port to one destination port stay in order: while an earlier
        // one waits to be sent again, later ones wait behind it (or the receiver would match a
        // next-barrier packet to the current barrier).
        let waiting = self.ports.open(port).is_some_and(|open| {
            open.barrier_retries
                .iter()
                .any(|r| r.step.node == step.node && r.step.port == step.port)
        });
        if waiting {
            self.schedule_retry(port, step, barrier, None, now);
            return true;
        }
        self.put_barrier_packet(port, step, barrier, None, now)
    }

    /// Sends one barrier packet now: over the wire, or for a port of this NIC straight into the
    /// local record. Returns `false` if it could not go now (no room).
    fn put_barrier_packet(
        &mut self,
        port: usize,
        step: Step,
        barrier: BarrierId,
        failed: Option<Failed>,
        now: Instant,
    ) -> bool {
        if step.node != self.node {
            return self.queue_barrier_packet(
                port,
                step.node,
                step.port,
                (barrier, failed),
                step.round,
                now,
            );
        }
        let target = usize::from(step.port.0);
        let generation = self.ports.open(port).map(|o| o.generation);
        let target_slot = self.ports.slot(target);
        let target_open = target_slot.is_some_and(|slot| slot.open.is_some());
        let target_gone = target_slot.is_some_and(|slot| {
            slot.open.is_none() && slot.gone_job != 0 && slot.gone_job == barrier.job.get()
        });
        match generation {
            Some(generation) if target_open => {
                if failed.is_none() {
                    if !self.hand_on_reduction(port, generation, target, barrier, step.round) {
                        // No room for the value at the target yet.
                        return false;
                    }
                    self.hand_on_broadcast(port, generation, target, barrier);
                }
                match self
                    .local_record
                    .record(target, port, generation, barrier, step.round, failed)
                {
                    // A second packet for one round: the target's schedule disagrees with ours.
                    Err(_) => self.schedule_retry(port, step, barrier, failed, now),
                    Ok(recorded) => {
                        self.count_recorded(recorded);
                        self.advance_pending |= 1 << target;
                        if let Some(failed) = failed {
                            let source = (self.node, PortId(port as u8));
                            self.abort_arrived(target, source, barrier, failed);
                        }
                    }
                }
            }
            // Its last owner ran this job's barriers and is gone: the barrier cannot complete.
            Some(_) if target_gone => self.barrier_target_gone(port, barrier, step.node, step.port),
            // Not open yet: try again later, as the wire path does (§3.2).
            _ => self.schedule_retry(port, step, barrier, failed, now),
        }
        true
    }

    /// An abort of `barrier` from `source` reached `port`: if `port` runs that barrier and still
    /// waits for anything from `source`, it fails now, naming the member the abort names (its
    /// engine would find the abort only on reaching `source`'s step).
    pub(crate) fn abort_arrived(
        &mut self,
        port: usize,
        source: (NodeId, PortId),
        barrier: BarrierId,
        failed: Failed,
    ) {
        let Some(slot) = self.run_slot(port, barrier) else {
            return;
        };
        let needs = self
            .run_at(port, slot)
            .is_some_and(|run| run.steps_needing(source.0, Some(source.1)).next().is_some());
        if needs {
            self.finish_barrier(port, slot, failed.status, Some((failed.node, failed.port)));
        }
    }

    /// Counts what recording a barrier packet did.
    pub(crate) fn count_recorded(&mut self, recorded: crate::record::Recorded) {
        if recorded == crate::record::Recorded::Evicted {
            self.counters.barrier_packets_evicted += 1;
        }
    }

    /// A barrier packet of `barrier` from `port` found its target `(node, dst_port)` gone for
    /// good (closed by an owner that ran the same job's barriers): if `port` still runs that
    /// barrier and waits for a packet the member never sent, it fails at once naming the
    /// member, instead of waiting for it to open. One that has all it needs from the member
    /// goes on: the member entered, and a member missing further on is the one it names.
    pub(crate) fn barrier_target_gone(
        &mut self,
        port: usize,
        barrier: BarrierId,
        node: NodeId,
        dst_port: PortId,
    ) {
        self.counters.barrier_targets_gone += 1;
        if let Some(slot) = self.run_slot(port, barrier) {
            self.fail_run_needing(port, slot, node, Some(dst_port), Status::TARGET_PORT_CLOSED);
        }
    }

    fn schedule_retry(
        &mut self,
        port: usize,
        step: Step,
        barrier: BarrierId,
        failed: Option<Failed>,
        now: Instant,
    ) {
        let at = now.saturating_add(self.config.retry_interval);
        let default_until = now.saturating_add(self.config.default_barrier_timeout);
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        let running = open.run_slot(barrier);
        let until = open
            .running(barrier)
            .map_or(default_until, |run| run.deadline);
        if open
            .barrier_retries
            .push(Retry {
                step,
                barrier,
                failed,
                at,
                until,
            })
            .is_err()
            && let Some(slot) = running
        {
            // More refused sends than the port's schedules should ever have outstanding: end the
            // barrier that sent this one.
            self.finish_barrier(
                port,
                slot,
                Status::NO_RESOURCES,
                Some((step.node, step.port)),
            );
        }
    }

    /// Barrier packets of ours to `(node, dst_port)` were refused or withdrawn because that port
    /// is closed (`packets`: barrier and round, in the order they were sent): send them again, in
    /// that order, until the port opens or the deadline passes (§3.2). This outlives the barrier
    /// that sent them.
    pub(crate) fn barrier_sends_refused(
        &mut self,
        port: usize,
        generation: Generation,
        node: NodeId,
        dst_port: PortId,
        packets: &[(BarrierId, u8, Option<Failed>)],
        now: Instant,
    ) {
        let same_incarnation = self
            .ports
            .open(port)
            .is_some_and(|o| o.generation == generation);
        if same_incarnation {
            for (barrier, round, failed) in packets {
                self.schedule_retry(
                    port,
                    Step::new(StepOp::SEND, node, dst_port, *round),
                    *barrier,
                    *failed,
                    now,
                );
            }
        }
    }

    /// Barrier timers: send again the refused packets that are due, and fail barriers past their
    /// deadline.
    pub(crate) fn run_barrier_timers(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for port in crate::ports_of(self.open_ports) {
            let Some(open) = self.ports.open(port) else {
                continue;
            };
            for slot in open.running_slots().iter() {
                if let Some(run) = self.run_at(port, slot)
                    && run.deadline <= now
                {
                    let peer = run.current_peer();
                    self.finish_barrier(port, slot, Status::BARRIER_TIMED_OUT, Some(peer));
                    busy = true;
                }
            }
            let Some(open) = self.ports.open_mut(port) else {
                continue;
            };
            // Nothing expired and nothing due (a destination's retries are due only once its
            // first one is): the common case, without copying the list.
            if open
                .barrier_retries
                .iter()
                .all(|retry| retry.until > now && retry.at > now)
            {
                continue;
            }
            open.barrier_retries.retain(|retry| retry.until > now);
            // A destination's retries go out together, in order, once its first one is due.
            let mut due: Vec<Retry, RETRIES> = Vec::new();
            let mut kept: Vec<Retry, RETRIES> = Vec::new();
            for retry in open.barrier_retries.iter() {
                let first = open
                    .barrier_retries
                    .iter()
                    .find(|r| r.step.node == retry.step.node && r.step.port == retry.step.port);
                let target = if first.is_some_and(|first| first.at <= now) {
                    &mut due
                } else {
                    &mut kept
                };
                let _ = target.push(*retry);
            }
            open.barrier_retries = kept;
            let mut blocked: Vec<(NodeId, PortId), RETRIES> = Vec::new();
            // By reference: dropping a consumed heapless iterator links a slice-index panic.
            for retry in due.iter().copied() {
                busy = true;
                let destination = (retry.step.node, retry.step.port);
                if blocked.contains(&destination)
                    || !self.put_barrier_packet(port, retry.step, retry.barrier, retry.failed, now)
                {
                    let _ = blocked.push(destination);
                    self.schedule_retry(port, retry.step, retry.barrier, retry.failed, now);
                }
            }
        }
        busy
    }

    /// Runs the barrier timers again while they find work: a barrier that fails (a give-up, an
    /// abort) owes aborts due at once, and an abort delivered to a local port may fail that
    /// port's barrier in turn, owing more. Each pass that finds nothing due ends it; the bound
    /// (a pass per port, and one more) only makes the end obvious. Returns whether any pass did
    /// anything.
    pub(crate) fn run_due_barrier_retries(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for _ in 0..=PORTS_PER_NIC {
            if !self.run_barrier_timers(now) {
                break;
            }
            busy = true;
        }
        busy
    }

    /// An in-order barrier packet of `barrier` arrived from `peer`: record it for its port and
    /// wake that port's engine.
    ///
    /// # Errors
    /// Port closed: the sender retries until the port opens (§3.2). Port gone: the port's last
    /// owner ran barriers of the packet's job and closed; the sender's barrier fails at once.
    /// Busy: a second packet for one barrier and round, which a correct peer never sends.
    ///
    /// `data`: the broadcast bytes the packet carries after its [`shared_abi::packet::BarrierPayload`]
    /// (kept for the port before the packet completes any step; at most [`BROADCAST_MAX`] are).
    pub(crate) fn deliver_barrier_packet(
        &mut self,
        peer: NodeId,
        header: &PacketHeader,
        payload: &shared_abi::packet::BarrierPayload,
        data: &[u8],
        now: Instant,
    ) -> Result<(), RejectReason> {
        let barrier = payload.barrier;
        let failed = (payload.failed_status != Status::SUCCESS).then_some(Failed {
            node: payload.failed_node,
            port: payload.failed_port,
            status: payload.failed_status,
        });
        let Some(port) = header.dst_port.index() else {
            return Err(RejectReason::PORT_CLOSED);
        };
        match self.ports.slot(port) {
            Some(slot) if slot.open.is_some() => {}
            Some(slot) if slot.gone_job != 0 && slot.gone_job == barrier.job.get() => {
                return Err(RejectReason::PORT_GONE);
            }
            _ => return Err(RejectReason::PORT_CLOSED),
        }
        let Some(source) = header.src_port.index() else {
            return Err(RejectReason::BUSY);
        };
        let index = self.connection_index(peer).ok_or(RejectReason::BUSY)?;
        if failed.is_none() && header.size == shared_abi::packet::BARRIER_CARRIES_REDUCTION {
            let key = ValueKey::Arrived {
                node: peer,
                port: header.src_port,
                barrier,
                round: header.aux,
            };
            if !self.keep_arrived_value(port, key, data) {
                // No room for the value yet: the sender tries again.
                return Err(RejectReason::BUSY);
            }
        } else if failed.is_none()
            && !data.is_empty()
            && let Some(generation) = self.ports.open(port).map(|o| o.generation)
        {
            self.receive_broadcast(port, generation, barrier, data);
        }
        let connection = self.connections.get_mut(index).ok_or(RejectReason::BUSY)?;
        let recorded = connection
            .record
            .record(
                port,
                source,
                header.src_generation,
                barrier,
                header.aux,
                failed,
            )
            .map_err(|_| RejectReason::BUSY)?;
        self.count_recorded(recorded);
        self.advance_pending |= 1 << port;
        if let Some(failed) = failed {
            self.abort_arrived(port, (peer, header.src_port), barrier, failed);
        }
        self.run_pending_advances(now);
        Ok(())
    }

    /// `peer`'s port `source` (generation `generation`) closed. A running barrier that still
    /// waits for a packet it has not received from that port can never complete: it fails,
    /// naming the port. What the dead incarnation sent for barriers not running yet stays, for
    /// the barrier of its identity to take (a member that entered and exited still entered);
    /// only GM's raw barriers' packets, which name no barrier, are forgotten.
    pub(crate) fn peer_port_closed(&mut self, peer: NodeId, source: usize, generation: Generation) {
        let Some(source_id) = u8::try_from(source).ok().map(PortId) else {
            return;
        };
        if source_id.index().is_none() {
            return;
        }
        // Barrier packets we hold or queue for that port were waiting for it to open; it died
        // instead. Cancel them, so they stop holding up the connection (a port that has not opened
        // yet sends no notice, and is still waited for).
        if peer != self.node
            && let Some(connection) = self
                .connection_index(peer)
                .and_then(|i| self.connections.get_mut(i))
        {
            let for_dead_port = |body: &Body| matches!(body, Body::Barrier { dst_port, .. } if *dst_port == source_id);
            for descriptor in connection.sent.iter_mut() {
                if for_dead_port(&descriptor.body) {
                    descriptor.body = Body::Cancelled;
                    descriptor.not_before = None;
                    descriptor.needs_transmit = true;
                }
            }
            let queued = connection.queue.len();
            for _ in 0..queued {
                if let Some(body) = connection.queue.pop_front()
                    && !for_dead_port(&body)
                {
                    let _ = connection.queue.push_back(body);
                }
            }
        }
        for port in 0..PORTS_PER_NIC {
            let running = self.ports.open(port).is_some_and(|o| o.running_count() > 0);
            if running {
                self.fail_barrier_needing(port, peer, Some(source_id), Status::TARGET_PORT_CLOSED);
            } else if peer == self.node {
                self.local_record.forget_raw_from(port, source, generation);
            } else if let Some(connection) = self
                .connection_index(peer)
                .and_then(|i| self.connections.get_mut(i))
            {
                connection.record.forget_raw_from(port, source, generation);
            }
        }
    }

    /// A port of this NIC closed: barriers of the other local ports that needed it fail.
    pub(crate) fn local_port_closed(&mut self, port: usize, generation: Generation) {
        self.peer_port_closed(self.node, port, generation);
    }

    /// Fails each of `port`'s running barriers that still waits, in a step to do, for a packet
    /// from `(node, peer_port)` (any port of `node` if `None`) that has not arrived; the others
    /// go on.
    pub(crate) fn fail_barrier_needing(
        &mut self,
        port: usize,
        node: NodeId,
        peer_port: Option<PortId>,
        status: Status,
    ) {
        for slot in 0..RUNNING_BARRIERS {
            self.fail_run_needing(port, slot, node, peer_port, status);
        }
    }

    fn fail_run_needing(
        &mut self,
        port: usize,
        slot: usize,
        node: NodeId,
        peer_port: Option<PortId>,
        status: Status,
    ) {
        let Some(run) = self.run_at(port, slot) else {
            return;
        };
        let barrier = run.barrier;
        let record = if node == self.node {
            Some(&self.local_record)
        } else {
            self.connection_index(node)
                .and_then(|i| self.connections.get(i))
                .map(|connection| &connection.record)
        };
        // Every step still to do that receives from the member, not only the first: a member
        // met in several rounds may have sent the first and died before the next.
        let missing = run.steps_needing(node, peer_port).find(|step| {
            let source = usize::from(step.port.0);
            !record.is_some_and(|record| record.has(port, source, barrier, step.round))
        });
        if let Some(step) = missing {
            self.finish_barrier(port, slot, status, Some((step.node, step.port)));
        }
    }

    /// Ends the barrier in `slot` of `port`: completed (`SUCCESS`) or failed, naming the member
    /// it waited for. The completion uses one of the port's barrier buffers (paper §5.2).
    fn finish_barrier(
        &mut self,
        port: usize,
        slot: usize,
        status: Status,
        waiting_for: Option<(NodeId, PortId)>,
    ) {
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        let Some(run) = open.take_run(slot) else {
            return;
        };
        open.barrier_buffers = open.barrier_buffers.saturating_sub(1);
        let generation = open.generation;
        // A broadcast completes with the root's bytes; without them its schedule was not one
        // that follows the root.
        let mut bytes = None;
        if status == Status::SUCCESS && run.broadcast {
            bytes = self
                .ports
                .slot(port)
                .and_then(|slot| slot.broadcasts.get(generation, run.barrier))
                .copied();
        }
        let status = if status == Status::SUCCESS && run.broadcast && bytes.is_none() {
            Status::BAD_SCHEDULE
        } else {
            status
        };
        // What arrived for this reduction and was not taken can complete nothing now.
        if let Some(slot) = self.ports.slot_mut(port) {
            let ended = run.barrier;
            slot.reduce_values.forget(
                |key| matches!(key, ValueKey::Arrived { barrier, .. } if *barrier == ended),
            );
        }
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        if status != Status::SUCCESS
            && let Some((node, member_port)) = waiting_for
        {
            // Tell the members still owed a packet of ours that this barrier failed, and for
            // whom: they fail too, naming the same member, instead of waiting for their timeout
            // or naming us. The aborts go out with the barrier timers, in order behind any
            // packet of ours still waiting for its target to open.
            let failed = Failed {
                node,
                port: member_port,
                status,
            };
            let until = run
                .deadline
                .saturating_add(self.config.default_barrier_timeout);
            for (index, step) in run.steps.iter().enumerate().skip(run.index) {
                let owed = step.op == StepOp::SEND
                    || (step.op == StepOp::EXCHANGE && !(index == run.index && run.sent_current));
                let named = step.node == node && step.port == member_port;
                if owed && !named {
                    let _ = open.barrier_retries.push(Retry {
                        step: Step::new(StepOp::SEND, step.node, step.port, step.round),
                        barrier: run.barrier,
                        failed: Some(failed),
                        at: Instant::ZERO,
                        until,
                    });
                }
            }
        }
        // Whatever of this barrier is still recorded (a failed barrier's stragglers) can complete
        // nothing now.
        self.local_record.forget_barrier(port, run.barrier);
        for connection in self.connections.iter_mut() {
            connection.record.forget_barrier(port, run.barrier);
        }
        // The values this reduction sent, and this broadcast's bytes, go with it unless a packet
        // of it may be sent again (queued, or not yet acknowledged): on a route that loses
        // nothing, at once; else when the ack of its last packet comes (`handle_ack`).
        self.release_held(port, generation, run.barrier);
        let (kind, (peer_node, peer_port)) = if status == Status::SUCCESS {
            self.counters.barriers_completed += 1;
            (EventKind::BARRIER_COMPLETED, (NodeId::new(0), PortId(0)))
        } else {
            self.counters.barriers_failed += 1;
            (
                EventKind::BARRIER_FAILED,
                waiting_for.unwrap_or((NodeId::new(0), PortId(0))),
            )
        };
        let mut event = Event {
            context: run.context.into(),
            peer_node,
            peer_port,
            ..Self::event(kind, status)
        };
        if let Some(bytes) = bytes {
            event.set_broadcast_data(bytes.data());
        }
        // A reduction completes with its result, where a broadcast's bytes go.
        if let Some(reduction) = run.reduce.filter(|_| status == Status::SUCCESS) {
            event.set_broadcast_data(reduction.data());
        }
        self.emit(port, event);
    }

    /// Keeps `data` as the value `port` sends in `round` of reduction `barrier` (its packets
    /// are built, and rebuilt, from it). Returns `false` if there is no room now.
    fn keep_sent_value(&mut self, port: usize, barrier: BarrierId, round: u8, data: &[u8]) -> bool {
        let Some(generation) = self.ports.open(port).map(|open| open.generation) else {
            return false;
        };
        let key = ValueKey::Sent {
            generation,
            barrier,
            round,
        };
        self.keep_value(port, key, data)
    }

    /// Keeps `data`, arrived for `port` under `key`. Returns `false` if there is no room now.
    fn keep_arrived_value(&mut self, port: usize, key: ValueKey, data: &[u8]) -> bool {
        self.keep_value(port, key, data)
    }

    /// Keeps `data` under `key` in `port`'s reduction values, making room from values nothing
    /// needs any more: sent ones whose packets are all through and whose barrier ended, and
    /// arrived ones of a barrier the port does not run and whose packets no record holds.
    ///
    /// Whether a value is needed takes a look through every connection's queues, so it is
    /// asked only when no place is free, and then every value nothing needs goes at once: one
    /// look makes room for the keeps that follow.
    fn keep_value(&mut self, port: usize, key: ValueKey, data: &[u8]) -> bool {
        let Some(slot) = self.ports.slot_mut(port) else {
            return false;
        };
        if slot.reduce_values.keep(key, data) {
            return true;
        }
        let Some(slot) = self.ports.slot(port) else {
            return false;
        };
        let mut evictable: Vec<ValueKey, { crate::port::REDUCE_VALUES }> = Vec::new();
        for kept in slot.reduce_values.keys() {
            let needed = match kept {
                ValueKey::Sent {
                    generation,
                    barrier,
                    ..
                } => self.broadcast_in_use(port, generation, barrier, false),
                ValueKey::Arrived { barrier, .. } => {
                    self.ports
                        .open(port)
                        .is_some_and(|open| open.running(barrier).is_some())
                        || self.local_record.holds(port, barrier)
                        || self
                            .connections
                            .iter()
                            .any(|connection| connection.record.holds(port, barrier))
                }
            };
            if !needed {
                let _ = evictable.push(kept);
            }
        }
        self.ports.slot_mut(port).is_some_and(|slot| {
            slot.reduce_values.forget(|kept| evictable.contains(kept));
            slot.reduce_values.keep(key, data)
        })
    }

    /// Lets go of what `port` (incarnation `generation`) holds for barrier `barrier` once
    /// nothing of it may be sent again: the values it sent in a reduction, and a broadcast's
    /// bytes unless a record's early packet waits for them. Called at the barrier's end and at
    /// the ack of each of its packets: a barrier packet's ack waits for the next barrier's
    /// packets to carry it, so they are mostly unacknowledged when it ends. Every step of a
    /// reduction looks through the port's values, and every broadcast kept in a full table asks
    /// of each place whether its bytes are still needed (a look through every connection); held
    /// until the table was full, they made both cost a full table's worth.
    pub(crate) fn release_held(&mut self, port: usize, generation: Generation, barrier: BarrierId) {
        let Some(slot) = self.ports.slot(port) else {
            return;
        };
        let values = slot
            .reduce_values
            .keys()
            .any(|key| sent_by(&key, generation, barrier));
        let bytes = slot.broadcasts.get(generation, barrier).is_some();
        if !(values || bytes) || self.broadcast_in_use(port, generation, barrier, false) {
            return;
        }
        let recorded = bytes && self.broadcast_in_use(port, generation, barrier, true);
        if let Some(slot) = self.ports.slot_mut(port) {
            if values {
                slot.reduce_values
                    .forget(|key| sent_by(key, generation, barrier));
            }
            if bytes && !recorded {
                slot.broadcasts.forget(generation, barrier);
            }
        }
    }

    /// The value `port` (incarnation `generation`) sent in `round` of reduction `barrier`, if
    /// it is one: what its packet of that round carries.
    pub(crate) fn reduction_held(
        &self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
        round: u8,
    ) -> Option<crate::port::ReduceValue> {
        self.ports
            .slot(port)?
            .reduce_values
            .get(ValueKey::Sent {
                generation,
                barrier,
                round,
            })
            .copied()
    }

    /// A packet of `round` of `barrier` from `port` (incarnation `generation`) to the open local
    /// port `target`: the value it carries, if it is a reduction's, goes to the target as if
    /// it had come over the wire. Returns `false` if the target has no room for it now.
    fn hand_on_reduction(
        &mut self,
        port: usize,
        generation: Generation,
        target: usize,
        barrier: BarrierId,
        round: u8,
    ) -> bool {
        let Some(value) = self.reduction_held(port, generation, barrier, round) else {
            return true;
        };
        let key = ValueKey::Arrived {
            node: self.node,
            port: PortId(port as u8),
            barrier,
            round,
        };
        self.keep_arrived_value(target, key, value.data())
    }

    /// Takes the value `step`'s peer sent in its round of reduction `barrier` to `port` and
    /// combines it into `reduction` as the step says; `None` if it is missing or of another
    /// length.
    fn combine_arrived(
        &mut self,
        port: usize,
        barrier: BarrierId,
        step: Step,
        reduction: Reduction,
    ) -> Option<Reduction> {
        let key = ValueKey::Arrived {
            node: step.node,
            port: step.port,
            barrier,
            round: step.round,
        };
        let theirs = self.ports.slot_mut(port)?.reduce_values.take(key)?;
        let theirs = theirs.data();
        let mine = reduction.data();
        if theirs.len() != mine.len() {
            return None;
        }
        let mut next = reduction;
        let out = next.value.get_mut(..mine.len())?;
        if step.combine.contains(StepCombine::REPLACE) {
            out.copy_from_slice(theirs);
        } else {
            let (left, right) = if step.combine.contains(StepCombine::PEER_LEFT) {
                (theirs, mine)
            } else {
                (mine, theirs)
            };
            combine(reduction.spec, left, right, out).ok()?;
        }
        Some(next)
    }

    /// The bytes of broadcast `barrier` that `port` (incarnation `generation`) holds, to send
    /// with its packets of that barrier.
    pub(crate) fn broadcast_held(
        &self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
    ) -> Option<Broadcast> {
        self.ports
            .slot(port)
            .and_then(|slot| slot.broadcasts.get(generation, barrier))
            .copied()
    }

    /// A packet of `barrier` from `port` (incarnation `generation`) to the open local port
    /// `target`: the broadcast bytes `port` holds go with it.
    fn hand_on_broadcast(
        &mut self,
        port: usize,
        generation: Generation,
        target: usize,
        barrier: BarrierId,
    ) {
        let Some(held) = self.broadcast_held(port, generation, barrier) else {
            return;
        };
        if let Some(target_generation) = self.ports.open(target).map(|o| o.generation) {
            self.receive_broadcast(target, target_generation, barrier, held.data());
        }
    }

    /// Bytes of broadcast `barrier` arrived for `port` (incarnation `generation`): kept if there
    /// is a place (see [`crate::port::broadcast_bytes::BROADCASTS_KEPT`]), else dropped.
    fn receive_broadcast(
        &mut self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
        data: &[u8],
    ) {
        let running = self
            .ports
            .open(port)
            .is_some_and(|open| open.running(barrier).is_some());
        if let Some(place) = self.broadcast_place(port, generation, barrier, running) {
            self.keep_broadcast(port, place, generation, barrier, data);
        } else {
            self.counters.broadcast_bytes_dropped += 1;
        }
    }

    /// Keeps `data` as the bytes of broadcast `barrier` for `port`'s incarnation `generation`
    /// (a root's own: a place was checked for when its token was taken).
    pub(crate) fn remember_broadcast(
        &mut self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
        data: &[u8],
    ) {
        if let Some(place) = self.broadcast_place(port, generation, barrier, true) {
            self.keep_broadcast(port, place, generation, barrier, data);
        }
    }

    /// Where `port` may keep the bytes of broadcast `barrier` for incarnation `generation`: the
    /// place that holds them already, else a free one, else the oldest whose bytes nothing
    /// needs, else (`urgent`: the running barrier's bytes, or a root's) the oldest whose bytes
    /// only a record's early packets need. `None` for a barrier without an identity
    /// ([`BarrierId::NONE`] has no bytes).
    fn broadcast_place(
        &self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
        urgent: bool,
    ) -> Option<usize> {
        if barrier == BarrierId::NONE {
            return None;
        }
        self.ports.slot(port)?.broadcasts.place(
            generation,
            barrier,
            urgent,
            |generation, barrier, records| {
                self.broadcast_in_use(port, generation, barrier, records)
            },
        )
    }

    /// Puts the bytes of broadcast `barrier` (at most [`BROADCAST_MAX`] of `data`) for
    /// incarnation `generation` in `place` of `port`'s store.
    fn keep_broadcast(
        &mut self,
        port: usize,
        place: usize,
        generation: Generation,
        barrier: BarrierId,
        data: &[u8],
    ) {
        if let Some(slot) = self.ports.slot_mut(port) {
            slot.broadcasts.keep(place, generation, barrier, data);
        }
    }

    /// Whether `port`'s bytes of broadcast `barrier` (incarnation `generation`) are still
    /// needed: its barrier runs, a packet of it waits for the port in a record (the barrier has
    /// not taken it yet; counted if `records`), or one of the port's packets of it waits to be
    /// sent again or in a connection's queue or sent list (it is built, and rebuilt, with them).
    fn broadcast_in_use(
        &self,
        port: usize,
        generation: Generation,
        barrier: BarrierId,
        records: bool,
    ) -> bool {
        let carries = |body: &Body| {
            matches!(*body, Body::Barrier { port: p, generation: g, barrier: b, failed: None, .. }
                if usize::from(p) == port && g == generation && b == barrier)
        };
        let open = self
            .ports
            .open(port)
            .filter(|open| open.generation == generation);
        let recorded = records
            && open.is_some()
            && (self.local_record.holds(port, barrier)
                || self
                    .connections
                    .iter()
                    .any(|connection| connection.record.holds(port, barrier)));
        recorded
            || open.is_some_and(|open| {
                open.running(barrier).is_some()
                    || open
                        .barrier_retries
                        .iter()
                        .any(|retry| retry.barrier == barrier && retry.failed.is_none())
            })
            || self.connections.iter().any(|connection| {
                connection.queue.iter().any(carries)
                    || connection.sent.iter().any(|sent| carries(&sent.body))
            })
    }
}

/// Whether `key` names a value sent by incarnation `generation` of a port in reduction
/// `barrier`.
fn sent_by(key: &ValueKey, generation: Generation, barrier: BarrierId) -> bool {
    matches!(key, ValueKey::Sent { generation: g, barrier: b, .. } if *g == generation && *b == barrier)
}
