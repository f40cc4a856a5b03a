//! The NIC-based barrier's records (paper 5.2): barrier buffers provided, barriers posted, and
//! what a barrier's end means; and the schedules the three forms of
//! `gm_barrier_send_with_callback` describe.
//!
//! The host works out whom to exchange with (paper 5.1: the NIC is slower, so the host computes
//! the tree or the pairings) and the NIC runs the resulting list of steps: the ordered partners
//! of pairwise exchange, the parent and children of gather-broadcast, the per-round peers of
//! dissemination.

use std::time::Duration;

use nicbar_rs::raw::RawEvent;
use nicbar_rs::{BarrierNumbering, DmaBuffer, Error, RawPort};
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{BarrierId, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::schedule::{MAX_ROUNDS, MAX_SCHEDULE_STEPS, Step, StepOp};
use shared_abi::token::{ReceiveKind, ReceiveToken, SendKind, SendToken};
use zerocopy::IntoBytes;

use crate::events::barrier_event;
use crate::slab::Slab;
use crate::status::from_nic;
use crate::types::*;

/// How many times a barrier refused as busy while no barrier of the port runs (its barrier
/// buffer was still on the way to the NIC) is posted again before the refusal is reported.
const MAX_REPOSTS: u32 = 1000;

/// Who waits for a barrier's end.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiter {
    /// The program: a GM_BARRIER_*_EVENT, and the callback if it gave one.
    Program {
        callback: gm_send_completion_callback_t,
        context: usize,
    },
    /// nicbar_barrier, waiting in the library.
    Library,
}

/// A barrier the NIC holds, as posted.
#[derive(Debug)]
struct PostedBarrier {
    /// The schedule, in DMA memory the NIC reads until the barrier ends.
    schedule: DmaBuffer,
    steps: u32,
    /// Its identity: job, group and sequence for nicbar_barrier; [`BarrierId::NONE`] for the
    /// paper's GM forms, which name no group.
    barrier: BarrierId,
    waiter: Waiter,
    reposts: u32,
}

/// How a barrier ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BarrierEnd {
    /// The name of its record.
    pub(crate) name: u64,
    pub(crate) waiter: Waiter,
    /// The identity it ran under.
    pub(crate) barrier: BarrierId,
    /// GM_SUCCESS, or why it failed.
    pub(crate) status: gm_status_t,
    /// The member it waited for, when it failed waiting.
    pub(crate) waiting_for: Option<(u16, u8)>,
    /// The NIC's status.
    pub(crate) nic_status: Status,
    /// The NIC refused the barrier token (rather than ending the barrier).
    pub(crate) refused: bool,
}

impl BarrierEnd {
    /// The event that tells the program.
    pub(crate) fn event(&self) -> gm_recv_event {
        let kind = if self.status == GM_SUCCESS {
            GM_BARRIER_COMPLETED_EVENT
        } else {
            GM_BARRIER_FAILED_EVENT
        };
        let context = match self.waiter {
            Waiter::Program { context, .. } => context,
            Waiter::Library => 0,
        };
        barrier_event(kind, context, self.status, self.waiting_for)
    }
}

/// What a port keeps for barriers.
#[derive(Debug)]
pub(crate) struct BarrierRecords {
    posted: Slab<PostedBarrier>,
    /// Barrier buffers provided and not yet used by a barrier's end.
    pub(crate) buffers: u32,
    /// The NIC fails a barrier after this long; `None`: the NIC's default.
    pub(crate) timeout: Option<Duration>,
    /// The numbers nicbar_barrier gives each group's barriers, as the Rust API's port does.
    pub(crate) numbering: BarrierNumbering,
}

impl BarrierRecords {
    pub(crate) fn new() -> Self {
        Self {
            posted: Slab::new(32),
            buffers: 0,
            timeout: None,
            numbering: BarrierNumbering::new(),
        }
    }

    /// Barriers posted whose end has not come.
    pub(crate) fn running(&self) -> usize {
        self.posted.len()
    }

    /// Provides the NIC with the receive token one barrier's end takes.
    pub(crate) fn provide_buffer(&mut self, raw: &mut RawPort) -> Result<(), Error> {
        let token = ReceiveToken {
            kind: ReceiveKind::BARRIER,
            ..ReceiveToken::default()
        };
        raw.post_receive(&token)?;
        self.buffers += 1;
        Ok(())
    }

    /// Writes `steps` into DMA memory and posts the barrier, under identity `barrier` (its
    /// packets match only the peers' barrier of the same identity); returns the name of its
    /// record.
    pub(crate) fn start(
        &mut self,
        raw: &mut RawPort,
        steps: &[Step],
        barrier: BarrierId,
        waiter: Waiter,
    ) -> Result<u64, Error> {
        let bytes = steps.as_bytes();
        let mut schedule = raw.dma_alloc(bytes.len())?;
        schedule[..bytes.len()].copy_from_slice(bytes);
        let (slot, serial) = self.posted.insert(PostedBarrier {
            schedule,
            steps: steps.len() as u32,
            barrier,
            waiter,
            reposts: 0,
        });
        let name = crate::slab::name(slot, serial);
        if let Err(error) = self.post(raw, name) {
            self.posted.remove(slot, serial);
            return Err(error);
        }
        Ok(name)
    }

    /// Posts (again) the barrier of record `name`.
    fn post(&mut self, raw: &mut RawPort, name: u64) -> Result<(), Error> {
        let (slot, serial) = crate::slab::unname(name);
        let timeout_us = self.timeout.map_or(0, |timeout| {
            u32::try_from(timeout.as_micros())
                .unwrap_or(u32::MAX)
                .max(1)
        });
        let Some(posted) = self.posted.get(slot, serial) else {
            return Err(Error::Protocol("a barrier record vanished".to_owned()));
        };
        let token = SendToken {
            kind: SendKind::BARRIER,
            length: posted.steps.into(),
            buffer: posted.schedule.arena_offset().into(),
            timeout_us: timeout_us.into(),
            context: name.into(),
            ..SendToken::default()
        }
        .with_barrier_id(posted.barrier);
        raw.post_send(&token)
    }

    /// Whether `event` is about a barrier token or buffer: a barrier's end, or the refusal of a
    /// barrier token.
    pub(crate) fn concerns(event: &RawEvent) -> bool {
        matches!(
            event.kind,
            EventKind::BARRIER_COMPLETED | EventKind::BARRIER_FAILED
        ) || (event.kind == EventKind::TOKEN_REJECTED
            && !nicbar_rs::raw::is_receive_rejection(event)
            && event.detail.get() == u32::from(SendKind::BARRIER.0))
    }

    /// The end a barrier event means, settling its record; `None` if it names no barrier of
    /// this port, or if a barrier refused as busy was posted again.
    pub(crate) fn on_event(&mut self, raw: &mut RawPort, event: &RawEvent) -> Option<BarrierEnd> {
        let refused = event.kind == EventKind::TOKEN_REJECTED;
        if !refused {
            // The barrier buffer its end used is spent.
            self.buffers = self.buffers.saturating_sub(1);
        }
        let name = event.context.get();
        let (slot, serial) = crate::slab::unname(name);
        if refused && event.status == Status::BARRIER_BUSY {
            // Busy with none of the port's barriers in the NIC: the barrier buffer was still in
            // the receive ring when the NIC read the barrier token. Post it again.
            let repost = self
                .posted
                .get_mut(slot, serial)
                .filter(|posted| posted.reposts < MAX_REPOSTS)
                .map(|posted| posted.reposts += 1)
                .is_some();
            if repost && self.post(raw, name).is_ok() {
                return None;
            }
        }
        let posted = self.posted.remove(slot, serial)?;
        let waiting_for = (event.kind == EventKind::BARRIER_FAILED)
            .then(|| (event.peer_node.get(), event.peer_port.0));
        Some(BarrierEnd {
            name,
            waiter: posted.waiter,
            barrier: posted.barrier,
            status: from_nic(event.status),
            waiting_for,
            nic_status: event.status,
            refused,
        })
    }
}

/// One step with `peer`, checked.
pub(crate) fn step(op: StepOp, peer: &gm_barrier_peer_t, round: usize) -> Result<Step, String> {
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

/// `steps`, unless they are more than the NIC runs.
fn check_length(steps: Vec<Step>) -> Result<Vec<Step>, String> {
    if steps.len() > MAX_SCHEDULE_STEPS {
        return Err(format!(
            "the barrier takes {} steps on this port; the NIC runs {MAX_SCHEDULE_STEPS} at most",
            steps.len()
        ));
    }
    Ok(steps)
}

/// The pairwise-exchange schedule: in round i, exchange with `peers[i]`.
pub(crate) fn pairwise_exchange(peers: &[gm_barrier_peer_t]) -> Result<Vec<Step>, String> {
    let steps = peers
        .iter()
        .enumerate()
        .map(|(round, peer)| step(StepOp::EXCHANGE, peer, round))
        .collect::<Result<Vec<_>, _>>()?;
    check_length(steps)
}

/// The gather-broadcast schedule: gather from each child, to the parent and back (unless this
/// is the root), then broadcast to each child — the layout of `nicbar_schedule`'s
/// gather-broadcast, on the tree the caller gives.
pub(crate) fn gather_broadcast(
    parent: Option<&gm_barrier_peer_t>,
    children: &[gm_barrier_peer_t],
) -> Result<Vec<Step>, String> {
    let mut steps = Vec::with_capacity(2 * children.len() + 2);
    nicbar_schedule::gather_broadcast_steps(parent, children.iter(), |op, peer, round| {
        steps.push(step(op, peer, round)?);
        Ok::<(), String>(())
    })?;
    check_length(steps)
}

/// One round of the dissemination schedule: send to each of `send_to`, then wait for each of
/// `receive_from`, appended to `steps`. Stops adding once the schedule is too long.
pub(crate) fn dissemination_round(
    steps: &mut Vec<Step>,
    round: usize,
    send_to: &[gm_barrier_peer_t],
    receive_from: &[gm_barrier_peer_t],
) -> Result<(), String> {
    for peer in send_to {
        steps.push(step(StepOp::SEND, peer, round)?);
    }
    for peer in receive_from {
        steps.push(step(StepOp::RECV, peer, round)?);
    }
    if steps.len() > MAX_SCHEDULE_STEPS {
        return check_length(std::mem::take(steps)).map(drop);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(node_id: u32, port_id: u32) -> gm_barrier_peer_t {
        gm_barrier_peer_t { node_id, port_id }
    }

    #[test]
    fn each_form_becomes_the_steps_it_describes() {
        let pe = pairwise_exchange(&[peer(1, 2), peer(2, 2)]).unwrap();
        assert_eq!(
            pe,
            [
                Step::new(StepOp::EXCHANGE, NodeId::new(1), PortId(2), 0),
                Step::new(StepOp::EXCHANGE, NodeId::new(2), PortId(2), 1),
            ]
        );
        let gb = gather_broadcast(Some(&peer(0, 1)), &[peer(3, 1)]).unwrap();
        let ops: Vec<_> = gb.iter().map(|s| (s.op, s.node.get(), s.round)).collect();
        assert_eq!(
            ops,
            [
                (StepOp::RECV, 3, 0),
                (StepOp::SEND, 0, 0),
                (StepOp::RECV, 0, 1),
                (StepOp::SEND, 3, 1),
            ]
        );
        let root = gather_broadcast(None, &[peer(1, 1)]).unwrap();
        assert_eq!(root.len(), 2);
        let mut steps = Vec::new();
        dissemination_round(&mut steps, 0, &[peer(1, 1)], &[peer(2, 1)]).unwrap();
        dissemination_round(&mut steps, 1, &[peer(2, 1)], &[peer(1, 1)]).unwrap();
        assert_eq!(steps.len(), 4);
        assert_eq!(steps[3].round, 1);
    }

    #[test]
    fn bad_members_and_long_schedules_are_refused_in_words() {
        assert!(
            pairwise_exchange(&[peer(1, 99)])
                .unwrap_err()
                .contains("port id 99")
        );
        assert!(
            pairwise_exchange(&[peer(70_000, 1)])
                .unwrap_err()
                .contains("out of range")
        );
        let many = vec![peer(1, 1); MAX_SCHEDULE_STEPS + 1];
        assert!(gather_broadcast(None, &many).is_err());
        let rounds = vec![peer(1, 1); MAX_ROUNDS as usize + 1];
        assert!(
            pairwise_exchange(&rounds)
                .unwrap_err()
                .contains("rounds at most")
        );
    }
}
