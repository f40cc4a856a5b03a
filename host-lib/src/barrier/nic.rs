//! The NIC-based barrier (paper §5.2): GM's two calls, and a group's barrier run in the NIC,
//! whole or fuzzy (start, then test or wait).

use std::sync::Arc;
use std::time::{Duration, Instant};

use shared_abi::ids::BarrierId;
use shared_abi::ring::Wake;
use shared_abi::schedule::{RUNNING_BARRIERS, Step};

use crate::error::Error;
use crate::failure::BarrierError;
use crate::group::{BarrierOptions, Group};
use crate::port::Port;
use crate::port::barriers::{Carried, Running};
use crate::port::kept::Keeping;
use nicbar_schedule::Algorithm;

/// How long past its own timeout a NIC-based barrier may go unreported before
/// [`Port::barrier_wait`] gives up on the NIC ([`BarrierError::NoReport`]).
const REPORT_GRACE: Duration = Duration::from_secs(2);
/// High bits of the contexts of barriers started by [`Port::barrier_start`].
const GROUP_CONTEXT: u64 = 0x4e42_6261_0000_0000;

/// A barrier started by [`Port::barrier_start`]: pass it to [`Port::barrier_test`] and
/// [`Port::barrier_wait`] of the same port.
#[derive(Debug)]
#[must_use = "a started barrier ends with Port::barrier_wait"]
pub struct PendingBarrier {
    /// The token's context; `None` for a group of one, complete at once.
    context: Option<u64>,
    /// When the NIC should have reported the end at the latest.
    report_by: Option<Instant>,
    started: Instant,
}

impl PendingBarrier {
    /// A barrier of a group of one: complete at once, nothing runs.
    pub(super) fn complete(started: Instant) -> Self {
        Self {
            context: None,
            report_by: None,
            started,
        }
    }
}

impl Port {
    /// Provides the NIC with the receive token that one barrier's end uses (GM's
    /// `gm_provide_barrier_buffer`, paper §5.2). Counts against the receive tokens; the end event
    /// of the barrier returns it. The NIC holds a few at once (four); more wait in the receive
    /// ring, ahead of later receive buffers.
    ///
    /// # Errors
    /// [`Error::NoReceiveTokens`].
    pub fn provide_barrier_buffer(&mut self) -> Result<(), Error> {
        self.endpoint.provide_barrier_buffer()
    }

    /// Starts a barrier that runs `steps` in the NIC (GM's `gm_barrier_send_with_callback`,
    /// paper §5.2): writes the schedule into a buffer of the arena, which the port holds until the
    /// barrier ends, and posts the barrier send token. The end comes out of [`Port::receive`] as
    /// [`crate::Event::BarrierCompleted`] or [`crate::Event::BarrierFailed`] with `context`; a
    /// refusal as [`crate::Event::SendRejected`] (`BARRIER_BUSY` if the port runs as many barriers as the
    /// NIC does at once, one of the same identity, or no barrier buffer is left for its end, `BAD_SCHEDULE` for an empty, too long or malformed schedule). The NIC
    /// fails the barrier after `timeout` (`None`: its default).
    ///
    /// # Errors
    /// [`Error::ArenaFull`], [`Error::NoSendTokens`].
    pub fn barrier_send(
        &mut self,
        steps: &[Step],
        context: u64,
        timeout: Option<Duration>,
    ) -> Result<(), Error> {
        self.endpoint.barrier_send(
            (steps, Keeping::POSTED),
            context,
            timeout,
            BarrierId::NONE,
            None,
        )
    }

    /// Starts `group`'s barrier numbering on this port afresh: its next barrier is number 0
    /// (see [`Group`]'s identity). Every member must do it at the same point — when the group
    /// is made, before its first barrier — as a new MPI communicator that reuses a freed one's
    /// id does.
    pub fn restart_barrier_numbering(&mut self, group: &Group) {
        self.barrier.restart(group);
    }

    /// Runs a barrier of `group` in the NIC with the group's options and waits for its end.
    ///
    /// # Errors
    /// [`BarrierError`]: this port is not a member, the schedule does not compile, a barrier is
    /// running, or the barrier failed (naming the member it waited for and why).
    pub fn barrier(&mut self, group: &Group) -> Result<(), BarrierError> {
        let pending = self.barrier_start(group)?;
        self.barrier_wait(pending)
    }

    /// As [`Port::barrier`], with `options` instead of the group's.
    ///
    /// # Errors
    /// As [`Port::barrier`].
    pub fn barrier_with(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<(), BarrierError> {
        let pending = self.barrier_start_with(group, options)?;
        self.barrier_wait(pending)
    }

    /// Starts a barrier of `group` in the NIC and returns at once (the fuzzy barrier): compute,
    /// then [`Port::barrier_test`] or [`Port::barrier_wait`]. A group of one member completes
    /// at once without the NIC. Provides the barrier buffer if none is.
    ///
    /// # Errors
    /// [`BarrierError::NotAMember`], [`BarrierError::Schedule`], [`BarrierError::Busy`],
    /// [`BarrierError::Port`].
    pub fn barrier_start(&mut self, group: &Group) -> Result<PendingBarrier, BarrierError> {
        let options = group.options;
        self.barrier_start_with(group, &options)
    }

    /// As [`Port::barrier_start`], with `options` instead of the group's.
    ///
    /// # Errors
    /// As [`Port::barrier_start`].
    pub fn barrier_start_with(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<PendingBarrier, BarrierError> {
        self.start_in_nic(group, Some(options.algorithm), options.timeout, None)
    }

    /// Broadcasts `data` from rank `root` of `group` to every member, run by the NIC's barrier
    /// engine: a gather-broadcast tree rooted at `root` (of the group's dimension if its
    /// algorithm is a gather-broadcast, else binary) whose down-phase packets carry the bytes, so
    /// that the barrier's completion brings them. At the root `data` is sent (1 to
    /// [`crate::NIC_BROADCAST_MAX`] bytes); elsewhere the root's bytes are copied into `data` (up
    /// to its length). Returns how many bytes the root broadcast. It is also a barrier: no member
    /// returns before every member entered. It takes the group's next barrier number, as a
    /// barrier does, so every member must call it at the same point of the group's barriers.
    ///
    /// # Errors
    /// As [`Port::barrier`]; [`BarrierError::Refused`] with `TOO_LONG` at a root whose `data`
    /// is empty or longer than [`crate::NIC_BROADCAST_MAX`]; [`BarrierError::Failed`] with
    /// `BAD_SCHEDULE` at the members that never got the bytes if the members disagree on the
    /// root.
    pub fn nic_broadcast(
        &mut self,
        group: &Group,
        root: usize,
        data: &mut [u8],
    ) -> Result<usize, BarrierError> {
        let pending = self.nic_broadcast_start(group, root, data)?;
        self.nic_broadcast_wait(pending, data)
    }

    /// Starts [`Port::nic_broadcast`] and returns at once; [`Port::barrier_test`] says when it
    /// ended, [`Port::nic_broadcast_wait`] waits and takes the bytes. `data` is read at the root
    /// only.
    ///
    /// # Errors
    /// As [`Port::nic_broadcast`].
    pub fn nic_broadcast_start(
        &mut self,
        group: &Group,
        root: usize,
        data: &[u8],
    ) -> Result<PendingBarrier, BarrierError> {
        let root_member = group.member(root).ok_or(BarrierError::Schedule(
            nicbar_schedule::ScheduleError::RankOutOfRange {
                rank: root,
                members: group.len(),
            },
        ))?;
        let is_root = root_member.node == self.node_id() && root_member.port == self.port_id();
        if is_root && (data.is_empty() || data.len() > crate::NIC_BROADCAST_MAX) {
            return Err(BarrierError::Refused {
                status: shared_abi::event::Status::TOO_LONG,
            });
        }
        let dimension = match group.options.algorithm {
            Algorithm::GatherBroadcast { dimension, .. } => dimension,
            _ => 2,
        }
        .clamp(1, group.len().saturating_sub(1).max(1));
        let algorithm = Algorithm::GatherBroadcast { dimension, root };
        let bytes = if is_root { data.to_vec() } else { Vec::new() };
        self.start_in_nic(
            group,
            Some(algorithm),
            group.options.timeout,
            Some(Carried::Broadcast(root_member, bytes)),
        )
    }

    /// Waits for the end of a broadcast started by [`Port::nic_broadcast_start`] and copies the
    /// root's bytes into `out` (up to its length). Returns how many bytes the root broadcast (in
    /// a group of one, where nothing runs, `out.len()`).
    ///
    /// # Errors
    /// As [`Port::barrier_wait`].
    pub fn nic_broadcast_wait(
        &mut self,
        pending: PendingBarrier,
        out: &mut [u8],
    ) -> Result<usize, BarrierError> {
        let Some(context) = pending.context else {
            return Ok(out.len());
        };
        self.barrier_wait(pending)?;
        match self.barrier.broadcasts.remove(&context) {
            Some(data) => {
                let len = data.len().min(out.len());
                out[..len].copy_from_slice(&data[..len]);
                Ok(data.len())
            }
            _ => Err(BarrierError::Refused {
                status: shared_abi::event::Status::BAD_SCHEDULE,
            }),
        }
    }

    /// Combines every member's `data` with `spec`'s operation in the NIC and leaves the result
    /// in `data` at every member (an allreduce; a reduce is the same, its root reading the
    /// result). `data` is 1 to [`shared_abi::reduce::REDUCE_MAX`] bytes of `spec`'s elements (for
    /// `MINLOC`/`MAXLOC`, packed pairs of an element and a little-endian `i32` index), the same
    /// length at every member. The NIC runs recursive doubling with the non-power-of-two fix-up
    /// (`nicbar_schedule::allreduce`), combining in a fixed order: the result is bit-identical at
    /// every member and from run to run (for floating point, the tree depends on the group's
    /// size). [`shared_abi::reduce::ReduceOp::SUM_REPRODUCIBLE`] takes one `F32` or `F64` and
    /// gives bits that do not depend on the group's size either: the values' exact sum, rounded
    /// once ([`shared_abi::reproducible`]). It takes the group's next barrier number, as a
    /// barrier does, so every member must call it at the same point of the group's barriers; it
    /// is also a barrier.
    ///
    /// # Errors
    /// As [`Port::barrier`]; [`BarrierError::Refused`] with `TOO_LONG` for an empty or too long
    /// `data` or one not a whole number of elements (for the reproducible sum, not one element),
    /// `INVALID_TOKEN` for an operation not defined on the type; [`BarrierError::Failed`] with
    /// `BAD_SCHEDULE` where members disagree on the length.
    pub fn nic_allreduce(
        &mut self,
        group: &Group,
        spec: shared_abi::reduce::ReduceSpec,
        data: &mut [u8],
    ) -> Result<(), BarrierError> {
        let pending = self.nic_allreduce_start(group, spec, data)?;
        self.nic_allreduce_wait(pending, data)
    }

    /// Starts [`Port::nic_allreduce`] with this member's `data` and returns at once;
    /// [`Port::barrier_test`] says when it ended, [`Port::nic_allreduce_wait`] waits and takes
    /// the result.
    ///
    /// # Errors
    /// As [`Port::nic_allreduce`].
    pub fn nic_allreduce_start(
        &mut self,
        group: &Group,
        spec: shared_abi::reduce::ReduceSpec,
        data: &[u8],
    ) -> Result<PendingBarrier, BarrierError> {
        let carried = Carried::reduce(spec, data)?;
        self.start_in_nic(group, None, group.options.timeout, Some(carried))
    }

    /// Waits for the end of an allreduce started by [`Port::nic_allreduce_start`] and copies
    /// the result into `out` (up to its length; in a group of one, where nothing runs, `out`
    /// is left as it is: the member's own value is the result).
    ///
    /// # Errors
    /// As [`Port::barrier_wait`].
    pub fn nic_allreduce_wait(
        &mut self,
        pending: PendingBarrier,
        out: &mut [u8],
    ) -> Result<(), BarrierError> {
        self.nic_broadcast_wait(pending, out).map(|_| ())
    }

    /// Starts `algorithm`'s schedule of `group` in the NIC (`None`: the allreduce schedule),
    /// carrying what `carried` says.
    fn start_in_nic(
        &mut self,
        group: &Group,
        algorithm: Option<Algorithm>,
        timeout: Option<Duration>,
        carried: Option<Carried>,
    ) -> Result<PendingBarrier, BarrierError> {
        let started = Instant::now();
        let rank = group.rank_of_port(self.node_id(), self.port_id())?;
        if group.len() == 1 {
            return Ok(PendingBarrier::complete(started));
        }
        self.check_room(group)?;
        let steps = self
            .barrier
            .schedule(group, algorithm, rank)
            .map_err(BarrierError::Schedule)?;
        self.post_compiled(group, steps, timeout, carried, started)
    }

    /// [`BarrierError::Busy`] unless the NIC has room for another barrier of this port and
    /// `group`'s next barrier is not running already (a second of one identity would take the
    /// first's packets).
    pub(super) fn check_room(&self, group: &Group) -> Result<(), BarrierError> {
        let barrier = self.barrier.next_id(group);
        if self.barrier.running.len() >= RUNNING_BARRIERS
            || self.endpoint.barrier_tokens.in_flight as usize >= RUNNING_BARRIERS
            || self.barrier.runs_barrier(barrier)
        {
            return Err(BarrierError::Busy);
        }
        Ok(())
    }

    /// Posts compiled `steps` as `group`'s next barrier (one send token; the caller checked
    /// [`Port::check_room`]), carrying what `carried` says.
    pub(super) fn post_compiled(
        &mut self,
        group: &Group,
        steps: Arc<[Step]>,
        timeout: Option<Duration>,
        carried: Option<Carried>,
        started: Instant,
    ) -> Result<PendingBarrier, BarrierError> {
        let barrier = self.barrier.next_id(group);
        // A barrier buffer for each running barrier's end, this one's included (the token's
        // post below rings a sleeping NIC for both).
        while (self.endpoint.barrier_tokens.buffers as usize) <= self.barrier.running.len() {
            self.endpoint.provide_barrier_buffer_ahead()?;
        }
        self.barrier.next_serial = self.barrier.next_serial.wrapping_add(1);
        let context = GROUP_CONTEXT | u64::from(self.barrier.next_serial);
        let keeping = self.barrier.kept.choose(&steps);
        let posted = self.endpoint.barrier_send(
            (&steps, keeping),
            context,
            timeout,
            barrier,
            carried.as_ref(),
        );
        if let Err(error) = posted {
            self.barrier.kept.forget(keeping);
            return Err(error.into());
        }
        self.barrier.count(barrier);
        self.barrier.running.push(Running {
            context,
            barrier,
            steps,
            keeping,
            members: group.members.clone(),
            timeout,
            reposts: 0,
            repost_at: None,
            carried,
        });
        Ok(PendingBarrier {
            context: Some(context),
            report_by: timeout.map(|timeout| started + timeout + REPORT_GRACE),
            started,
        })
    }

    /// Whether the barrier has ended (completed or failed; [`Port::barrier_wait`] then returns at
    /// once with how). Takes the events waiting, keeping those that are not the barrier's for
    /// [`Port::receive`]. Never blocks.
    ///
    /// # Errors
    /// [`BarrierError::Port`] if the event ring is broken; [`BarrierError::NotRunning`].
    pub fn barrier_test(&mut self, pending: &PendingBarrier) -> Result<bool, BarrierError> {
        let Some(context) = pending.context else {
            return Ok(true);
        };
        loop {
            if self.barrier.has_ended(context) {
                return Ok(true);
            }
            if !self.barrier.is_running(context) {
                return Err(BarrierError::NotRunning);
            }
            self.repost_if_due()?;
            match self.next_from_ring()? {
                Some(event) => self.keep_unless_absorbed(event),
                None => return Ok(false),
            }
        }
    }

    /// Waits for the barrier's end, keeping the events that are not the barrier's for
    /// [`Port::receive`] (in order).
    ///
    /// # Errors
    /// [`BarrierError::Failed`] names the member the NIC waited for and why;
    /// [`BarrierError::Refused`], [`BarrierError::NoReport`], [`BarrierError::Port`],
    /// [`BarrierError::NotRunning`].
    pub fn barrier_wait(&mut self, pending: PendingBarrier) -> Result<(), BarrierError> {
        let Some(context) = pending.context else {
            return Ok(());
        };
        loop {
            if let Some(outcome) = self.barrier.take_outcome(context) {
                return outcome;
            }
            if !self.barrier.is_running(context) {
                return Err(BarrierError::NotRunning);
            }
            let repost_at = self.repost_if_due()?;
            let until = match (pending.report_by, repost_at) {
                (Some(report_by), Some(at)) => Some(report_by.min(at)),
                (report_by, at) => report_by.or(at),
            };
            // Waiting for the barrier's end: sends' ends (a host-based barrier's) need not wake
            // the process on their own.
            match self.wait_from_ring(until, Wake::UNLESS_SENT)? {
                Some(event) => self.keep_unless_absorbed(event),
                None if pending
                    .report_by
                    .is_some_and(|report_by| Instant::now() >= report_by) =>
                {
                    return Err(BarrierError::NoReport {
                        waited: pending.started.elapsed(),
                    });
                }
                None => {}
            }
        }
    }

    /// Posts again each running group barrier that was refused as busy and whose wait is over;
    /// returns when the next is due otherwise. A failure to post ends that barrier with it.
    fn repost_if_due(&mut self) -> Result<Option<Instant>, BarrierError> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut due = Vec::new();
        for running in &mut self.barrier.running {
            match running.repost_at {
                Some(at) if at <= now => {
                    running.repost_at = None;
                    due.push((
                        running.steps.clone(),
                        running.context,
                        running.timeout,
                        running.barrier,
                        running.carried.clone(),
                    ));
                }
                Some(at) => next = Some(next.map_or(at, |next| next.min(at))),
                None => {}
            }
        }
        for (steps, context, timeout, barrier, carried) in due {
            let keeping = self.barrier.kept.choose(&steps);
            let posted = if self.endpoint.barrier_tokens.buffers == 0 {
                self.endpoint.provide_barrier_buffer_ahead()
            } else {
                Ok(())
            }
            .and_then(|()| {
                self.endpoint.barrier_send(
                    (&steps, keeping),
                    context,
                    timeout,
                    barrier,
                    carried.as_ref(),
                )
            });
            match posted {
                Ok(()) => self.barrier.set_keeping(context, keeping),
                Err(error) => {
                    self.barrier.kept.forget(keeping);
                    self.barrier.finish(context, Err(BarrierError::Port(error)));
                }
            }
        }
        Ok(next)
    }
}
