//! The schedules the cost model runs: every rank's output of
//! [`nicbar_schedule::compile`], held compactly, or the same steps from the
//! compilers' formulas, checked against `compile`.
//!
//! The group is `N` members, rank `i` on node `i`, port 0 (node ids are 16 bits, so at most
//! [`MAX_NODES`]). A step names its peer by rank.
//!
//! `compile` checks the whole group on every call (ports, duplicates), so compiling every rank
//! costs O(N²): about 0.1 ms per rank at 65,536 ranks. Up to [`COMPILED_UP_TO`] ranks that is
//! cheap and [`SchedulePolicy::Auto`] compiles every rank. Above, it uses
//! [`FormulaSchedules`]: the compilers' documented formulas (`nicbar_schedule`'s
//! docs of `pairwise_exchange`, `gather_broadcast`, `dissemination`), evaluated per step in O(1)
//! with no per-rank storage, and compared with `compile` at a seeded sample of ranks (the edges of
//! every structure plus random ones) before the run is trusted.

use core::fmt;

use nicbar_schedule::arith::{add_mod, distinct_offsets, mul_mod, sub_mod};
use nicbar_schedule::{Algorithm, Member, ScheduleError, compile, rounds_needed, steps_needed};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step, StepOp};

use crate::rng::Rng;

/// The most ranks a group can have here: one per 16-bit node id.
pub const MAX_NODES: usize = 1 << 16;

/// Up to this many ranks [`SchedulePolicy::Auto`] compiles every rank's schedule.
pub const COMPILED_UP_TO: usize = 4096;

/// Random ranks [`FormulaSchedules::verify_sample`] checks on top of the edge ranks.
pub const RANDOM_SAMPLE: usize = 16;

/// What a step does, as the model needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Send to the peer and go on.
    Send,
    /// Wait for the peer's packet.
    Recv,
    /// Send to the peer, then wait for its packet.
    Exchange,
}

/// One step of one rank's schedule. 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelStep {
    /// What the step does.
    pub kind: StepKind,
    /// The round its packet carries.
    pub round: u8,
    /// The peer's rank.
    pub peer: u32,
}

impl ModelStep {
    /// Whether the step puts a packet on the wire.
    pub fn sends(&self) -> bool {
        matches!(self.kind, StepKind::Send | StepKind::Exchange)
    }

    /// Whether the step waits for a packet.
    pub fn receives(&self) -> bool {
        matches!(self.kind, StepKind::Recv | StepKind::Exchange)
    }

    /// The model's form of a compiled step in a group where rank `i` is node `i`.
    pub(crate) fn from_compiled(step: &Step) -> Option<Self> {
        let kind = match step.op {
            StepOp::SEND => StepKind::Send,
            StepOp::RECV => StepKind::Recv,
            StepOp::EXCHANGE => StepKind::Exchange,
            _ => return None,
        };
        Some(Self {
            kind,
            round: step.round,
            peer: u32::from(step.node.get()),
        })
    }
}

/// Where a simulation gets each rank's steps.
pub trait ScheduleSource {
    /// Ranks in the group.
    fn ranks(&self) -> usize;
    /// Steps in `rank`'s schedule.
    fn steps(&self, rank: usize) -> usize;
    /// Step `index` of `rank`'s schedule, for `rank < ranks()` and `index < steps(rank)`.
    fn step(&self, rank: usize, index: usize) -> ModelStep;
    /// Whether step `index` of `rank`'s schedule combines the value its packet carries with the
    /// rank's own (a reduction's step; a barrier's never does).
    fn combines(&self, _rank: usize, _index: usize) -> bool {
        false
    }
}

/// Why a schedule set could not be built.
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleSetError {
    /// More ranks than node ids.
    TooManyNodes {
        /// Ranks asked for.
        nodes: usize,
    },
    /// The compiler refused the group or the algorithm.
    Compile {
        /// The algorithm.
        algorithm: Algorithm,
        /// Ranks.
        nodes: usize,
        /// Its error.
        error: ScheduleError,
    },
    /// The compiler produced a step the model does not know.
    UnknownStep {
        /// Rank whose schedule has it.
        rank: usize,
        /// The step.
        step: Step,
    },
    /// The formulas and `compile` disagree at a rank: the formulas are wrong and no result from
    /// them may be trusted.
    Mismatch {
        /// The algorithm.
        algorithm: Algorithm,
        /// Ranks.
        nodes: usize,
        /// The rank where they disagree.
        rank: usize,
        /// What differs.
        detail: String,
    },
}

impl fmt::Display for ScheduleSetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooManyNodes { nodes } => {
                write!(f, "{nodes} ranks: node ids allow at most {MAX_NODES}")
            }
            Self::Compile {
                algorithm,
                nodes,
                error,
            } => write!(f, "{algorithm:?} on {nodes} ranks: {error}"),
            Self::UnknownStep { rank, step } => {
                write!(
                    f,
                    "rank {rank}'s schedule has a step of unknown op: {step:?}"
                )
            }
            Self::Mismatch {
                algorithm,
                nodes,
                rank,
                detail,
            } => write!(
                f,
                "{algorithm:?} on {nodes} ranks: the formulas disagree with compile at rank {rank}: {detail}"
            ),
        }
    }
}

impl std::error::Error for ScheduleSetError {}

/// The group the model compiles for: rank `i` is node `i`, port 0.
pub fn group(nodes: usize) -> Result<Vec<Member>, ScheduleSetError> {
    if nodes > MAX_NODES {
        return Err(ScheduleSetError::TooManyNodes { nodes });
    }
    Ok((0..nodes)
        .map(|rank| Member::new(NodeId::new(rank as u16), PortId(0)))
        .collect())
}

/// Compiles `rank`'s schedule with `compile`, in the model's form.
fn compile_rank(
    algorithm: Algorithm,
    members: &[Member],
    rank: usize,
    buffer: &mut [Step; MAX_SCHEDULE_STEPS],
    out: &mut Vec<ModelStep>,
) -> Result<(), ScheduleSetError> {
    let count =
        compile(algorithm, members, rank, buffer).map_err(|error| ScheduleSetError::Compile {
            algorithm,
            nodes: members.len(),
            error,
        })?;
    for step in &buffer[..count] {
        out.push(
            ModelStep::from_compiled(step)
                .ok_or(ScheduleSetError::UnknownStep { rank, step: *step })?,
        );
    }
    Ok(())
}

/// Every rank's compiled schedule, one flat array with an offset per rank (8 bytes a step).
#[derive(Clone, Debug)]
pub struct CompiledSchedules {
    offsets: Vec<u32>,
    steps: Vec<ModelStep>,
}

impl CompiledSchedules {
    /// Compiles `algorithm` for every rank of a group of `nodes`. O(nodes²).
    ///
    /// # Errors
    /// The group is too large or the compiler refuses it.
    pub fn new(algorithm: Algorithm, nodes: usize) -> Result<Self, ScheduleSetError> {
        let members = group(nodes)?;
        let mut buffer = [Step::default(); MAX_SCHEDULE_STEPS];
        let mut offsets = Vec::with_capacity(nodes + 1);
        let mut steps = Vec::new();
        offsets.push(0);
        for rank in 0..nodes {
            compile_rank(algorithm, &members, rank, &mut buffer, &mut steps)?;
            offsets.push(steps.len() as u32);
        }
        Ok(Self { offsets, steps })
    }

    /// Every step of every rank.
    pub fn total_steps(&self) -> usize {
        self.steps.len()
    }
}

impl ScheduleSource for CompiledSchedules {
    fn ranks(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    fn steps(&self, rank: usize) -> usize {
        (self.offsets[rank + 1] - self.offsets[rank]) as usize
    }

    fn step(&self, rank: usize, index: usize) -> ModelStep {
        self.steps[self.offsets[rank] as usize + index]
    }
}

/// One round of n-way dissemination: where its steps start and which offsets it uses.
#[derive(Clone, Copy, Debug)]
struct DisseminationRound {
    first_step: usize,
    stride: usize,
    kept: usize,
}

#[derive(Clone, Debug)]
enum Formula {
    Pairwise {
        exchanges: usize,
        power: usize,
        extra: usize,
    },
    GatherBroadcast {
        dimension: usize,
        root: usize,
    },
    Dissemination {
        rounds: Vec<DisseminationRound>,
        total: usize,
    },
}

/// The compilers' formulas, evaluated per step: O(1) per step (O(log rounds) for dissemination),
/// no per-rank storage. Trust them only after [`FormulaSchedules::verify_sample`] or
/// [`FormulaSchedules::verify_ranks`].
#[derive(Clone, Debug)]
pub struct FormulaSchedules {
    algorithm: Algorithm,
    nodes: usize,
    formula: Formula,
}

impl FormulaSchedules {
    /// The formulas for `algorithm` on `nodes` ranks, refusing what `compile` refuses for a group
    /// of distinct members (sizes, parameters, rounds, schedule length).
    ///
    /// # Errors
    /// As [`CompiledSchedules::new`].
    pub fn new(algorithm: Algorithm, nodes: usize) -> Result<Self, ScheduleSetError> {
        if nodes > MAX_NODES {
            return Err(ScheduleSetError::TooManyNodes { nodes });
        }
        let refuse = |error| ScheduleSetError::Compile {
            algorithm,
            nodes,
            error,
        };
        let longest = steps_needed(algorithm, nodes).map_err(refuse)?;
        if longest > MAX_SCHEDULE_STEPS {
            return Err(refuse(ScheduleError::TooManySteps { steps: longest }));
        }
        let rounds = rounds_needed(algorithm, nodes).map_err(refuse)?;
        let formula = match algorithm {
            Algorithm::PairwiseExchange => {
                let exchanges = nodes.ilog2() as usize;
                let power = 1usize << exchanges;
                Formula::Pairwise {
                    exchanges,
                    power,
                    extra: nodes - power,
                }
            }
            Algorithm::GatherBroadcast { dimension, root } => {
                Formula::GatherBroadcast { dimension, root }
            }
            Algorithm::Dissemination { n } => {
                let mut table = Vec::with_capacity(rounds);
                let (mut stride, mut first_step) = (1usize, 0usize);
                for _ in 0..rounds {
                    let kept = distinct_offsets(nodes, n, stride);
                    table.push(DisseminationRound {
                        first_step,
                        stride,
                        kept,
                    });
                    first_step += 2 * kept;
                    stride = stride.saturating_mul(n + 1);
                }
                Formula::Dissemination {
                    rounds: table,
                    total: first_step,
                }
            }
        };
        Ok(Self {
            algorithm,
            nodes,
            formula,
        })
    }

    /// The ranks where the structure changes: the first and last ranks, the pairwise exchange's
    /// power-of-two boundary and extra ranks, the gather-broadcast root, its first children and
    /// the last parent, and the middle.
    pub fn edge_ranks(&self) -> Vec<usize> {
        let n = self.nodes;
        let mut ranks = vec![0, 1, 2, n / 2, n.saturating_sub(2), n.saturating_sub(1)];
        match &self.formula {
            Formula::Pairwise { power, extra, .. } => {
                ranks.extend([power - 1, *power, extra.saturating_sub(1), *extra]);
            }
            Formula::GatherBroadcast { dimension, root } => {
                let last_parent = (n - 2) / dimension;
                for relative in [
                    0,
                    1,
                    *dimension,
                    dimension + 1,
                    last_parent,
                    last_parent + 1,
                ] {
                    ranks.push((relative % n + root) % n);
                }
            }
            Formula::Dissemination { .. } => {}
        }
        ranks.retain(|&rank| rank < n);
        ranks.sort_unstable();
        ranks.dedup();
        ranks
    }

    /// Compares the formulas with `compile` at the edge ranks and [`RANDOM_SAMPLE`] ranks drawn
    /// from `seed`; returns how many ranks were checked.
    ///
    /// # Errors
    /// [`ScheduleSetError::Mismatch`] at the first rank where they differ.
    pub fn verify_sample(&self, seed: u64) -> Result<usize, ScheduleSetError> {
        let mut ranks = self.edge_ranks();
        let mut rng = Rng::new(seed ^ self.nodes as u64);
        for _ in 0..RANDOM_SAMPLE {
            ranks.push(rng.below(self.nodes as u64) as usize);
        }
        ranks.sort_unstable();
        ranks.dedup();
        self.verify_ranks(&ranks)
    }

    /// Compares the formulas with `compile` at `ranks`; returns how many were checked.
    ///
    /// # Errors
    /// [`ScheduleSetError::Mismatch`] at the first rank where they differ; the group is refused.
    pub fn verify_ranks(&self, ranks: &[usize]) -> Result<usize, ScheduleSetError> {
        let members = group(self.nodes)?;
        let mut buffer = [Step::default(); MAX_SCHEDULE_STEPS];
        let mut compiled = Vec::with_capacity(MAX_SCHEDULE_STEPS);
        for &rank in ranks {
            compiled.clear();
            compile_rank(self.algorithm, &members, rank, &mut buffer, &mut compiled)?;
            let mismatch = |detail: String| ScheduleSetError::Mismatch {
                algorithm: self.algorithm,
                nodes: self.nodes,
                rank,
                detail,
            };
            if compiled.len() != self.steps(rank) {
                return Err(mismatch(format!(
                    "compile has {} steps, the formulas {}",
                    compiled.len(),
                    self.steps(rank)
                )));
            }
            for (index, expected) in compiled.iter().enumerate() {
                let got = self.step(rank, index);
                if got != *expected {
                    return Err(mismatch(format!(
                        "step {index}: compile {expected:?}, formulas {got:?}"
                    )));
                }
            }
        }
        Ok(ranks.len())
    }
}

impl ScheduleSource for FormulaSchedules {
    fn ranks(&self) -> usize {
        self.nodes
    }

    fn steps(&self, rank: usize) -> usize {
        let n = self.nodes;
        match &self.formula {
            Formula::Pairwise {
                exchanges,
                power,
                extra,
            } => {
                if rank >= *power {
                    2
                } else if rank < *extra {
                    exchanges + 2
                } else {
                    *exchanges
                }
            }
            Formula::GatherBroadcast { dimension, root } => {
                let relative = sub_mod(rank, *root, n);
                let children = children(relative, *dimension, n);
                2 * children + if relative == 0 { 0 } else { 2 }
            }
            Formula::Dissemination { total, .. } => *total,
        }
    }

    fn step(&self, rank: usize, index: usize) -> ModelStep {
        let n = self.nodes;
        let make = |kind, peer: usize, round: usize| ModelStep {
            kind,
            round: round as u8,
            peer: peer as u32,
        };
        match &self.formula {
            Formula::Pairwise {
                exchanges,
                power,
                extra,
            } => {
                let (pre_round, post_round) = (*exchanges, exchanges + 1);
                if rank >= *power {
                    return if index == 0 {
                        make(StepKind::Send, rank - power, pre_round)
                    } else {
                        make(StepKind::Recv, rank - power, post_round)
                    };
                }
                let exchange = if rank < *extra {
                    if index == 0 {
                        return make(StepKind::Recv, rank + power, pre_round);
                    }
                    if index == exchanges + 1 {
                        return make(StepKind::Send, rank + power, post_round);
                    }
                    index - 1
                } else {
                    index
                };
                make(StepKind::Exchange, rank ^ (1 << exchange), exchange)
            }
            Formula::GatherBroadcast { dimension, root } => {
                const GATHER: usize = 0;
                const BROADCAST: usize = 1;
                let relative = sub_mod(rank, *root, n);
                let children = children(relative, *dimension, n);
                let first_child = relative * dimension + 1;
                let rank_of = |relative: usize| add_mod(relative, *root, n);
                if index < children {
                    return make(StepKind::Recv, rank_of(first_child + index), GATHER);
                }
                let mut index = index - children;
                if relative != 0 {
                    let parent = rank_of((relative - 1) / dimension);
                    match index {
                        0 => return make(StepKind::Send, parent, GATHER),
                        1 => return make(StepKind::Recv, parent, BROADCAST),
                        _ => index -= 2,
                    }
                }
                make(StepKind::Send, rank_of(first_child + index), BROADCAST)
            }
            Formula::Dissemination { rounds, .. } => {
                let which = rounds
                    .partition_point(|round| round.first_step <= index)
                    .saturating_sub(1);
                let round = rounds[which];
                let within = index - round.first_step;
                if within < round.kept {
                    let offset = mul_mod(within + 1, round.stride, n);
                    make(StepKind::Send, add_mod(rank, offset, n), which)
                } else {
                    let offset = mul_mod(within - round.kept + 1, round.stride, n);
                    make(StepKind::Recv, sub_mod(rank, offset, n), which)
                }
            }
        }
    }
}

/// Children of relative rank `relative` in a gather-broadcast tree of `dimension` over `n` ranks.
fn children(relative: usize, dimension: usize, n: usize) -> usize {
    let first = relative.saturating_mul(dimension).saturating_add(1);
    let last = relative
        .saturating_mul(dimension)
        .saturating_add(dimension)
        .min(n - 1);
    if first > last { 0 } else { last - first + 1 }
}

/// Which schedules a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SchedulePolicy {
    /// `compile` for every rank up to [`COMPILED_UP_TO`] ranks, checked formulas above.
    #[default]
    Auto,
    /// `compile` for every rank, at any size (O(N²) compile time).
    Compiled,
    /// Checked formulas at every size.
    Formula,
}

/// Where a [`ScheduleSet`]'s steps came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// `compile`, every rank.
    Compiled,
    /// The formulas, compared with `compile` at this many ranks.
    Formula {
        /// Ranks compared.
        checked_ranks: usize,
    },
}

/// One algorithm's schedules for one group, from `compile` or from the checked formulas.
#[derive(Clone, Debug)]
pub enum ScheduleSet {
    /// Every rank compiled.
    Compiled(CompiledSchedules),
    /// The formulas (already checked against `compile`).
    Formula(FormulaSchedules),
}

impl ScheduleSet {
    /// The schedules of `algorithm` on `nodes` ranks under `policy`. Formulas are checked
    /// against `compile` (edge ranks and a sample drawn from a fixed seed) before they are
    /// returned.
    ///
    /// # Errors
    /// The group or algorithm is refused, or the formulas disagree with `compile`.
    pub fn build(
        algorithm: Algorithm,
        nodes: usize,
        policy: SchedulePolicy,
    ) -> Result<(Self, Provenance), ScheduleSetError> {
        let compiled = match policy {
            SchedulePolicy::Auto => nodes <= COMPILED_UP_TO,
            SchedulePolicy::Compiled => true,
            SchedulePolicy::Formula => false,
        };
        if compiled {
            let schedules = CompiledSchedules::new(algorithm, nodes)?;
            return Ok((Self::Compiled(schedules), Provenance::Compiled));
        }
        let formulas = FormulaSchedules::new(algorithm, nodes)?;
        let checked_ranks = formulas.verify_sample(0x636f_7374_6d6f_6465)?;
        Ok((
            Self::Formula(formulas),
            Provenance::Formula { checked_ranks },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_formula_is_caught_by_the_sample() {
        // Formulas for a tree rooted at 1, claiming to be the tree rooted at 0.
        let algorithm = Algorithm::GatherBroadcast {
            dimension: 3,
            root: 0,
        };
        let mut wrong = FormulaSchedules::new(algorithm, 5000).unwrap();
        wrong.formula = Formula::GatherBroadcast {
            dimension: 3,
            root: 1,
        };
        assert!(matches!(
            wrong.verify_sample(1),
            Err(ScheduleSetError::Mismatch { .. })
        ));
        // An off-by-one in dissemination's strides is caught as well.
        let mut wrong = FormulaSchedules::new(Algorithm::Dissemination { n: 2 }, 5000).unwrap();
        if let Formula::Dissemination { rounds, .. } = &mut wrong.formula {
            rounds[2].stride += 1;
        }
        assert!(wrong.verify_sample(1).is_err());
        // The right formulas pass.
        assert!(
            FormulaSchedules::new(algorithm, 5000)
                .unwrap()
                .verify_sample(1)
                .is_ok()
        );
    }

    #[test]
    fn auto_compiles_small_groups_and_checks_formulas_for_large_ones() {
        let algorithm = Algorithm::Dissemination { n: 1 };
        let (_, small) =
            ScheduleSet::build(algorithm, COMPILED_UP_TO, SchedulePolicy::Auto).unwrap();
        assert_eq!(small, Provenance::Compiled);
        let (_, large) =
            ScheduleSet::build(algorithm, COMPILED_UP_TO + 1, SchedulePolicy::Auto).unwrap();
        assert!(
            matches!(large, Provenance::Formula { checked_ranks } if checked_ranks >= RANDOM_SAMPLE)
        );
    }
}
