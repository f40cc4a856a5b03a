//! A port's barrier state: the running barrier (the paper's "send token pointer" in the port
//! structure, §4.2) and the barrier packets it waits to send again. The barrier engine
//! ([`crate::barrier`]) drives both; they live in the port's state because they end with it.

use heapless::Vec;
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step, StepOp};

use crate::record::Failed;
use crate::time::{Instant, earliest};

/// Where a running barrier is (for `nicctl status`): a stuck barrier names whom it waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierProgress {
    /// The schedule step being worked on (the paper's node index), from 0.
    pub step: usize,
    /// Steps in the schedule.
    pub steps: usize,
    /// The current step's peer node, port and round: the member whose packet it waits for (or,
    /// if `sending`, to whom its packet has not gone out yet).
    pub waiting_for: Option<(NodeId, PortId, u8)>,
    /// The current step's packet has not been sent yet (no room, or its target is not open).
    pub sending: bool,
}

/// Barrier packets of one port waiting to be sent again (their target port was not open yet).
pub(crate) const RETRIES: usize = 64;

/// A barrier packet refused because its target port was not open yet, to send again at `at`. It
/// outlives the barrier that sent it: the sender may complete (it only needs its peers to have
/// entered) while its own packet still has to reach a port that opened late. It is dropped when it
/// gets through, at `until` (the sending barrier's deadline), or when the port closes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    pub(crate) step: Step,
    pub(crate) barrier: BarrierId,
    /// An abort: the failure it carries.
    pub(crate) failed: Option<Failed>,
    pub(crate) at: Instant,
    pub(crate) until: Instant,
}

impl Retry {
    /// When the packet is due to be sent again.
    pub(crate) fn next_attempt(&self) -> Instant {
        self.at
    }

    /// Where it goes. A destination's retries go out together, in order, once its first one is
    /// due: only the first one's time counts.
    pub(crate) fn destination(&self) -> (NodeId, PortId) {
        (self.step.node, self.step.port)
    }
}

/// A schedule the port's process asked the NIC to keep between barriers
/// ([`shared_abi::token::ScheduleSource`]), under the tag it named it by: a start that names the
/// slot runs these steps only if it names the same tag and count, so a start can never run
/// steps that another schedule left in the slot.
#[derive(Debug, Default)]
pub(crate) struct KeptSchedule {
    pub(crate) tag: u64,
    pub(crate) steps: Vec<Step, MAX_SCHEDULE_STEPS>,
}

impl KeptSchedule {
    /// The steps kept under `tag`, if they are `count` steps.
    pub(crate) fn steps(&self, tag: u64, count: usize) -> Option<&Vec<Step, MAX_SCHEDULE_STEPS>> {
        (!self.steps.is_empty() && self.tag == tag && self.steps.len() == count)
            .then_some(&self.steps)
    }
}

/// A running barrier: the schedule in NIC memory and where the engine is in it.
#[derive(Debug)]
pub(crate) struct BarrierRun {
    pub(crate) steps: Vec<Step, MAX_SCHEDULE_STEPS>,
    /// The paper's *node index* (§4.2): the step being worked on.
    pub(crate) index: usize,
    /// The send half of the current `EXCHANGE` step went out.
    pub(crate) sent_current: bool,
    /// Which barrier this is: only packets of the same barrier complete its steps.
    pub(crate) barrier: BarrierId,
    pub(crate) context: u64,
    pub(crate) deadline: Instant,
    /// The current step's send found no room (queue or connection table full): try again then.
    pub(crate) stalled_until: Option<Instant>,
    /// A broadcast: its completion carries the root's bytes.
    pub(crate) broadcast: bool,
    /// A reduction: what it combines with, and this member's value so far.
    pub(crate) reduce: Option<Reduction>,
}

/// A running reduction's state: its operation and type, and the value combined so far.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduction {
    pub(crate) spec: shared_abi::reduce::ReduceSpec,
    pub(crate) len: u8,
    pub(crate) value: [u8; shared_abi::reduce::REDUCE_MAX],
}

impl Reduction {
    /// The value so far.
    pub(crate) fn data(&self) -> &[u8] {
        self.value.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl BarrierRun {
    /// The earliest time this barrier needs attention (a retry or its deadline).
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        earliest(Some(self.deadline), self.stalled_until)
    }

    /// The steps still to do (from the current one on) that receive from `(node, port)` — any
    /// port of `node` if `port` is `None` — in order.
    pub(crate) fn steps_needing(
        &self,
        node: NodeId,
        port: Option<PortId>,
    ) -> impl Iterator<Item = Step> + '_ {
        self.steps
            .iter()
            .skip(self.index)
            .copied()
            .filter(move |step| {
                matches!(step.op, StepOp::RECV | StepOp::EXCHANGE)
                    && step.node == node
                    && port.is_none_or(|port| step.port == port)
            })
    }

    /// Where the barrier is, for status displays.
    pub(crate) fn progress(&self) -> BarrierProgress {
        let current = self.steps.get(self.index);
        BarrierProgress {
            step: self.index,
            steps: self.steps.len(),
            waiting_for: current.map(|step| (step.node, step.port, step.round)),
            sending: current.is_some_and(|step| {
                step.op == StepOp::SEND || (step.op == StepOp::EXCHANGE && !self.sent_current)
            }),
        }
    }

    pub(crate) fn current_peer(&self) -> (NodeId, PortId) {
        self.steps
            .get(self.index)
            .map_or((NodeId::new(0), PortId(0)), |step| (step.node, step.port))
    }
}
