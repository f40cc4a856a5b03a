//! The host-based barrier: the schedule the NIC would run, run on the host over ordinary
//! messages of the reserved class (see [`crate::barrier`]'s docs). The baseline of the paper's §6.

use std::time::Instant;

use nicbar_schedule::Member;
use shared_abi::event::Status;
use shared_abi::ids::BarrierId;
use shared_abi::max_length_for_size;
use shared_abi::ring::Wake;
use shared_abi::schedule::StepOp;

use crate::error::Error;
use crate::failure::{BarrierError, FailureReason};
use crate::group::{BarrierOptions, Group};
use crate::port::Port;
use crate::port::barriers::{
    DEFAULT_HOST_TIMEOUT, HOST_BARRIER_PRIORITY, HOST_BARRIER_SIZE, HOST_ID_AT, HOST_MAGIC,
    HOST_MESSAGE_LENGTH, HOST_TAG,
};

/// Most receive buffers the host-based barrier keeps provided.
const MAX_HOST_BUFFERS: usize = 32;

impl Port {
    /// Runs `group`'s barrier on the host: the very schedule the NIC would run
    /// ([`nicbar_schedule::compile`] of `options.algorithm` for this port's rank), each step done by
    /// the host over ordinary messages of the reserved class (see the module docs). The baseline
    /// of the paper's §6. Events that arrive meanwhile are kept, in order, for [`Port::receive`].
    ///
    /// # Errors
    /// As [`Port::barrier`]: [`BarrierError::Failed`] after `options.timeout` (default
    /// [`DEFAULT_HOST_TIMEOUT`]) naming the member it waited for, at once if that member's node
    /// became unreachable; [`BarrierError::Port`] if no receive buffer could be provided.
    pub fn host_barrier(
        &mut self,
        group: &Group,
        options: &BarrierOptions,
    ) -> Result<(), BarrierError> {
        let rank = group.rank_of_port(self.node_id(), self.port_id())?;
        if group.len() == 1 {
            return Ok(());
        }
        let steps = self
            .barrier
            .schedule(group, Some(options.algorithm), rank)
            .map_err(BarrierError::Schedule)?;
        let deadline = Instant::now() + options.timeout.unwrap_or(DEFAULT_HOST_TIMEOUT);
        let barrier = self.barrier.next_id(group);
        self.barrier.count(barrier);
        self.barrier.host.forget_through(barrier, false);
        self.barrier.host.deadline = Some(deadline);
        let receives = steps
            .iter()
            .filter(|s| matches!(s.op, StepOp::RECV | StepOp::EXCHANGE))
            .count();
        let outcome = self
            .provide_host_buffers((2 * receives + 2).min(MAX_HOST_BUFFERS))
            .and_then(|()| {
                for step in steps.iter() {
                    let peer = Member::new(step.node, step.port);
                    if matches!(step.op, StepOp::SEND | StepOp::EXCHANGE) {
                        self.host_send(peer, barrier, step.round, deadline)?;
                    }
                    if matches!(step.op, StepOp::RECV | StepOp::EXCHANGE) {
                        self.host_receive(group, peer, barrier, step.round, deadline)?;
                    }
                }
                Ok(())
            });
        // What is left of this barrier (a failure's stragglers) can complete nothing now.
        self.barrier.host.forget_through(barrier, true);
        outcome
    }

    /// Keeps `want` receive buffers of the reserved class provided.
    fn provide_host_buffers(&mut self, want: usize) -> Result<(), BarrierError> {
        let length = max_length_for_size(HOST_BARRIER_SIZE) as usize;
        while self.barrier.host.buffers.len() < want {
            let buffer = match self.barrier.host.unprovided.pop() {
                Some(buffer) => buffer,
                None => self.dma_alloc(length)?,
            };
            let offset = buffer.arena_offset();
            match self.provide_receive_buffer(
                buffer,
                HOST_BARRIER_SIZE,
                HOST_BARRIER_PRIORITY,
                HOST_TAG,
            ) {
                Ok(()) => {
                    self.barrier.host.buffers.insert(offset);
                }
                Err(refused) => {
                    self.barrier.host.unprovided.push(refused.buffer);
                    if self.barrier.host.buffers.is_empty() {
                        return Err(BarrierError::Port(refused.error));
                    }
                    break;
                }
            }
        }
        Ok(())
    }

    /// Sends `peer` the message of `round` of `barrier`, waiting for a send token if none is
    /// free.
    fn host_send(
        &mut self,
        peer: Member,
        barrier: BarrierId,
        round: u8,
        deadline: Instant,
    ) -> Result<(), BarrierError> {
        while self.send_tokens() == 0 {
            // Every send token is out: their SENT events are on the way.
            match self.wait_from_ring(Some(deadline), Wake::ANY)? {
                Some(event) => self.keep_unless_absorbed(event),
                None => {
                    return Err(BarrierError::Port(Error::NoSendTokens));
                }
            }
        }
        self.post_host_message(peer, barrier, round)
            .map_err(BarrierError::Port)
    }

    /// Posts the message of `round` of `barrier` to `peer` (a send token must be free).
    fn post_host_message(
        &mut self,
        peer: Member,
        barrier: BarrierId,
        round: u8,
    ) -> Result<(), Error> {
        let mut buffer = match self.barrier.host.spare.pop() {
            Some(buffer) => buffer,
            None => self.dma_alloc(HOST_MESSAGE_LENGTH)?,
        };
        buffer[..4].copy_from_slice(&HOST_MAGIC);
        buffer[4..HOST_ID_AT].copy_from_slice(&[round, 0, 0, 0]);
        buffer[HOST_ID_AT..HOST_MESSAGE_LENGTH]
            .copy_from_slice(zerocopy::IntoBytes::as_bytes(&barrier));
        let offset = buffer.arena_offset();
        match self.send(
            buffer,
            HOST_MESSAGE_LENGTH,
            HOST_BARRIER_SIZE,
            HOST_BARRIER_PRIORITY,
            peer.node,
            peer.port,
            u64::from(HOST_TAG),
        ) {
            Ok(()) => {
                self.barrier
                    .host
                    .sending
                    .insert(offset, (peer, barrier, round));
                Ok(())
            }
            Err(refused) => {
                self.barrier.host.spare.push(refused.buffer);
                Err(refused.error)
            }
        }
    }

    /// Waits until the message of `round` of `barrier` from `peer` has arrived, and consumes it.
    fn host_receive(
        &mut self,
        group: &Group,
        peer: Member,
        barrier: BarrierId,
        round: u8,
        deadline: Instant,
    ) -> Result<(), BarrierError> {
        let key = (peer, barrier, round);
        loop {
            if let Some(count) = self.barrier.host.record.get_mut(&key)
                && *count > 0
            {
                *count -= 1;
                if *count == 0 {
                    self.barrier.host.record.remove(&key);
                }
                return Ok(());
            }
            let failure = self.barrier.host.failures.get(&peer).copied();
            let now = Instant::now();
            if failure == Some(Status::TARGET_NODE_UNREACHABLE) || now >= deadline {
                let reason = match failure {
                    Some(Status::TARGET_PORT_CLOSED) => FailureReason::PeerPortClosed,
                    Some(Status::TARGET_NODE_UNREACHABLE) => FailureReason::NodeUnreachable,
                    _ => FailureReason::TimedOut,
                };
                return Err(BarrierError::Failed {
                    waiting_for: peer,
                    rank: group.rank_of(peer),
                    reason,
                });
            }
            let next_resend = self.resend_due(now);
            let until = next_resend.map_or(deadline, |at| at.min(deadline));
            // Waiting for a message: the ends of this barrier's own sends come with it (a
            // failed one rings anyway) and need not wake the process on their own.
            if let Some(event) = self.wait_from_ring(Some(until), Wake::UNLESS_SENT)? {
                self.keep_unless_absorbed(event);
            }
        }
    }

    /// Sends again the failed host-based barrier messages that are due (a refused message's
    /// target may have opened since), drops those past their deadline, and returns when the next
    /// one is due. Never blocks: a message that finds no free send token waits for the next
    /// interval. Every call that takes events runs it, so a message a finished barrier still
    /// owes a late peer goes out while the process does anything else with the port.
    pub(crate) fn resend_due(&mut self, now: Instant) -> Option<Instant> {
        let host = &mut self.barrier.host;
        host.resends.retain(|resend| resend.until > now);
        if host.resends.iter().all(|resend| resend.at > now) {
            return host.next_resend();
        }
        let (due, later): (Vec<_>, Vec<_>) = host.resends.drain(..).partition(|r| r.at <= now);
        host.resends = later;
        for resend in due {
            let posted = if self.send_tokens() == 0 {
                Err(Error::NoSendTokens)
            } else {
                self.post_host_message(resend.peer, resend.barrier, resend.round)
            };
            if posted.is_err() {
                self.barrier
                    .host
                    .resends
                    .push(crate::port::barriers::Resend {
                        at: now + crate::port::barriers::HOST_RETRY_INTERVAL,
                        ..resend
                    });
            }
        }
        self.barrier.host.next_resend()
    }
}
