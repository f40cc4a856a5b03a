//! The cost of a small allreduce: the NIC's recursive doubling (`nicbar_schedule::allreduce`,
//! the pairwise exchange's schedule whose steps combine the values their packets carry) run
//! NIC-based or host-based in the [engine](super::engine), with a cost per combining step on the
//! processor that runs it.
//!
//! A payload of up to 32 bytes fits the barrier packet, so an allreduce's packets are a
//! barrier's: the model's allreduce is the pairwise exchange barrier plus one combine per
//! receiving step that combines — `⌈log2 N⌉` on a member with a fix-up partner (the fix-up's
//! first exchange, then one per round), one fewer on the others below the largest power of two,
//! none on a member past it (it only hands its value over and takes the result back). At a power
//! of two nothing queues behind a combine and the allreduce takes exactly the barrier's latency
//! plus `log2 N · combine`; NIC-based, never less than the barrier plus `⌈log2 N⌉ · combine` at
//! any size; host-based at other sizes a combine can overlap the host's wait for a message.
//! `tests/cost_model.rs` checks all three, and that with no combine cost the allreduce is the
//! barrier.
//!
//! The combine cost is the caller's (the model has no figure for it): a few dozen integer
//! operations on up to 32 bytes, far slower on a LANai than on its host, which is what decides
//! whether the NIC-based allreduce keeps the NIC barrier's lead over the host-based one.

use nicbar_schedule::allreduce;
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step, StepCombine};

use super::engine::{Mode, Outcome, SimulationError, simulate_combining};
use super::params::CostParams;
use super::schedules::{ModelStep, ScheduleSetError, ScheduleSource, group};

/// Every rank's compiled allreduce schedule, with which of its steps combine.
#[derive(Clone, Debug)]
pub struct AllreduceSchedules {
    ranks: Vec<Vec<(ModelStep, bool)>>,
}

impl AllreduceSchedules {
    /// Compiles the allreduce for every rank of a group of `nodes` (rank `i` on node `i`).
    ///
    /// # Errors
    /// The group is too large or the compiler refuses it.
    pub fn new(nodes: usize) -> Result<Self, ScheduleSetError> {
        let members = group(nodes)?;
        let mut buffer = [Step::default(); MAX_SCHEDULE_STEPS];
        let mut ranks = Vec::with_capacity(nodes);
        for rank in 0..nodes {
            let count = allreduce(&members, rank, &mut buffer).map_err(|error| {
                ScheduleSetError::Compile {
                    algorithm: nicbar_schedule::Algorithm::PairwiseExchange,
                    nodes,
                    error,
                }
            })?;
            let steps = buffer[..count]
                .iter()
                .map(|step| {
                    let combines = step.combine.contains(StepCombine::COMBINE);
                    ModelStep::from_compiled(step)
                        .map(|model| (model, combines))
                        .ok_or(ScheduleSetError::UnknownStep { rank, step: *step })
                })
                .collect::<Result<Vec<_>, _>>()?;
            ranks.push(steps);
        }
        Ok(Self { ranks })
    }

    /// The steps of `rank` that combine.
    pub fn combining_steps(&self, rank: usize) -> usize {
        self.ranks[rank].iter().filter(|(_, c)| *c).count()
    }
}

impl ScheduleSource for AllreduceSchedules {
    fn ranks(&self) -> usize {
        self.ranks.len()
    }

    fn steps(&self, rank: usize) -> usize {
        self.ranks[rank].len()
    }

    fn step(&self, rank: usize, index: usize) -> ModelStep {
        self.ranks[rank][index].0
    }

    fn combines(&self, rank: usize, index: usize) -> bool {
        self.ranks[rank][index].1
    }
}

/// Why an allreduce could not be modelled.
#[derive(Clone, Debug, PartialEq)]
pub enum AllreduceError {
    /// The schedules could not be built.
    Schedules(ScheduleSetError),
    /// The simulation did not finish.
    Simulation(SimulationError),
}

impl core::fmt::Display for AllreduceError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Schedules(error) => write!(f, "allreduce schedules: {error}"),
            Self::Simulation(error) => write!(f, "allreduce simulation: {error}"),
        }
    }
}

impl std::error::Error for AllreduceError {}

/// One small allreduce of `nodes` ranks in `mode`, every rank entering at time 0: the barrier's
/// costs from `params`, and `combine` µs per combining step on the processor that runs the
/// schedule (the NIC's, [`Mode::Nic`]; the host's, [`Mode::Host`]).
///
/// # Errors
/// [`AllreduceError`] if the group cannot be compiled, or the costs are invalid.
pub fn simulate_allreduce(
    nodes: usize,
    params: &CostParams,
    mode: Mode,
    combine: f64,
) -> Result<Outcome, AllreduceError> {
    let schedules = AllreduceSchedules::new(nodes).map_err(AllreduceError::Schedules)?;
    simulate_combining(&schedules, params, mode, combine).map_err(AllreduceError::Simulation)
}
