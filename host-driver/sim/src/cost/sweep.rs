//! One group size, every algorithm: pairwise exchange, gather-broadcast over a sweep of tree
//! dimensions (the paper's "minimum over dimensions", §6, but bounded), and n-way dissemination for
//! `n = 1..=4`, each NIC-based and host-based.

use core::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use nicbar_schedule::Algorithm;
use shared_abi::schedule::MAX_SCHEDULE_STEPS;

use super::engine::{Mode, Outcome, SimulationError, simulate};
use super::params::CostParams;
use super::schedules::{Provenance, SchedulePolicy, ScheduleSet, ScheduleSetError};

/// The largest gather-broadcast dimension the NIC can run: a node with `d` children and a parent
/// has `2·d + 2` steps, and a schedule holds at most [`MAX_SCHEDULE_STEPS`] (128), so `d <= 63`.
pub const MAX_GATHER_BROADCAST_DIMENSION: usize = (MAX_SCHEDULE_STEPS - 2) / 2;

/// The dissemination `n` every size runs (Hoefler et al. measured up to 4 and found larger `n` lose
/// to receiver-side congestion).
pub const DISSEMINATION_WAYS: [usize; 4] = [1, 2, 3, 4];

/// Dimensions swept above 64 nodes (below, every dimension `1..N`, as the paper did).
const LARGE_GROUP_DIMENSIONS: [usize; 12] = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 63];

/// The gather-broadcast dimensions tried at `nodes`: every one of `1..nodes` up to 64 nodes (the
/// paper's sweep), a dozen from 1 to [`MAX_GATHER_BROADCAST_DIMENSION`] above.
pub fn gather_broadcast_dimensions(nodes: usize) -> Vec<usize> {
    let most = nodes.saturating_sub(1).min(MAX_GATHER_BROADCAST_DIMENSION);
    if nodes <= 64 {
        (1..=most).collect()
    } else {
        LARGE_GROUP_DIMENSIONS
            .into_iter()
            .filter(|&dimension| dimension <= most)
            .collect()
    }
}

/// One algorithm at one size, both ways.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Pair {
    /// NIC-based.
    pub nic: Outcome,
    /// Host-based.
    pub host: Outcome,
}

impl Pair {
    /// Host-based latency over NIC-based latency (the paper's factor of improvement).
    pub fn factor(&self) -> f64 {
        self.host.latency / self.nic.latency
    }
}

/// Gather-broadcast at one size, every dimension tried.
#[derive(Clone, Debug, PartialEq)]
pub struct GatherBroadcastSweep {
    /// `(dimension, result)`, dimensions ascending.
    pub results: Vec<(usize, Pair)>,
}

impl GatherBroadcastSweep {
    fn best(&self, mode: Mode) -> (usize, Outcome) {
        let mut best: Option<(usize, Outcome)> = None;
        for (dimension, pair) in &self.results {
            let outcome = match mode {
                Mode::Nic => pair.nic,
                Mode::Host => pair.host,
            };
            // Strictly better only: on a tie the smaller dimension stays.
            if best.is_none_or(|(_, best)| outcome.latency < best.latency) {
                best = Some((*dimension, outcome));
            }
        }
        best.unwrap_or((0, empty_outcome()))
    }

    /// The best NIC-based dimension and its outcome.
    pub fn best_nic(&self) -> (usize, Outcome) {
        self.best(Mode::Nic)
    }

    /// The best host-based dimension and its outcome.
    pub fn best_host(&self) -> (usize, Outcome) {
        self.best(Mode::Host)
    }

    /// The paper's factor for gather-broadcast: the best host-based latency over the best
    /// NIC-based latency, each at its own best dimension.
    pub fn factor(&self) -> f64 {
        self.best_host().1.latency / self.best_nic().1.latency
    }
}

/// Everything run at one size.
#[derive(Clone, Debug, PartialEq)]
pub struct SizeReport {
    /// Ranks.
    pub nodes: usize,
    /// Pairwise exchange.
    pub pairwise: Pair,
    /// Gather-broadcast, root 0, every dimension of [`gather_broadcast_dimensions`].
    pub gather_broadcast: GatherBroadcastSweep,
    /// `(n, result)` for each `n` of [`DISSEMINATION_WAYS`] below `nodes`.
    pub dissemination: Vec<(usize, Pair)>,
    /// Whether every schedule was compiled (rather than computed by the checked formulas).
    pub compiled: bool,
    /// Ranks at which formulas were compared with `compile`.
    pub checked_ranks: usize,
    /// Events handled over every run at this size.
    pub events: u64,
}

/// A run that failed: which algorithm, which size, why.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepError {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Ranks.
    pub nodes: usize,
    /// Why.
    pub reason: String,
}

impl fmt::Display for SweepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} on {} ranks: {}",
            self.algorithm, self.nodes, self.reason
        )
    }
}

impl std::error::Error for SweepError {}

impl SweepError {
    fn schedules(algorithm: Algorithm, nodes: usize, error: ScheduleSetError) -> Self {
        Self {
            algorithm,
            nodes,
            reason: error.to_string(),
        }
    }

    fn simulation(algorithm: Algorithm, nodes: usize, error: SimulationError) -> Self {
        Self {
            algorithm,
            nodes,
            reason: error.to_string(),
        }
    }
}

/// Runs `algorithm` on `nodes` ranks NIC-based and host-based, from one set of schedules.
///
/// # Errors
/// The schedules cannot be built or a simulation does not finish.
pub fn run_algorithm(
    algorithm: Algorithm,
    nodes: usize,
    params: &CostParams,
    policy: SchedulePolicy,
) -> Result<(Pair, Provenance), SweepError> {
    let (schedules, provenance) = ScheduleSet::build(algorithm, nodes, policy)
        .map_err(|error| SweepError::schedules(algorithm, nodes, error))?;
    let run = |mode| {
        match &schedules {
            ScheduleSet::Compiled(compiled) => simulate(compiled, params, mode),
            ScheduleSet::Formula(formulas) => simulate(formulas, params, mode),
        }
        .map_err(|error| SweepError::simulation(algorithm, nodes, error))
    };
    let pair = Pair {
        nic: run(Mode::Nic)?,
        host: run(Mode::Host)?,
    };
    Ok((pair, provenance))
}

/// The algorithms one size runs, heaviest first (for the workers' balance).
fn jobs(nodes: usize) -> Vec<Algorithm> {
    let mut jobs: Vec<Algorithm> = DISSEMINATION_WAYS
        .into_iter()
        .rev()
        .filter(|&n| n < nodes)
        .map(|n| Algorithm::Dissemination { n })
        .collect();
    jobs.push(Algorithm::PairwiseExchange);
    jobs.extend(
        gather_broadcast_dimensions(nodes)
            .into_iter()
            .map(|dimension| Algorithm::GatherBroadcast { dimension, root: 0 }),
    );
    jobs
}

/// Runs every algorithm at `nodes` on `workers` threads. The result does not depend on
/// `workers`.
///
/// # Errors
/// The first failing run (in job order).
pub fn run_size(
    nodes: usize,
    params: &CostParams,
    policy: SchedulePolicy,
    workers: usize,
) -> Result<SizeReport, SweepError> {
    let jobs = jobs(nodes);
    type JobResult = Result<(Pair, Provenance), SweepError>;
    let results: Mutex<Vec<Option<JobResult>>> = Mutex::new(vec![None; jobs.len()]);
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, jobs.len()) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&algorithm) = jobs.get(index) else {
                        return;
                    };
                    let result = run_algorithm(algorithm, nodes, params, policy);
                    if let Ok(mut results) = results.lock() {
                        results[index] = Some(result);
                    }
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_default();
    let mut report = SizeReport {
        nodes,
        pairwise: Pair {
            nic: empty_outcome(),
            host: empty_outcome(),
        },
        gather_broadcast: GatherBroadcastSweep {
            results: Vec::new(),
        },
        dissemination: Vec::new(),
        compiled: true,
        checked_ranks: 0,
        events: 0,
    };
    for (algorithm, result) in jobs.iter().zip(results) {
        let (pair, provenance) = result.unwrap_or_else(|| {
            Err(SweepError {
                algorithm: *algorithm,
                nodes,
                reason: "the worker did not report (it panicked)".into(),
            })
        })?;
        report.events += pair.nic.events + pair.host.events;
        if let Provenance::Formula { checked_ranks } = provenance {
            report.compiled = false;
            report.checked_ranks += checked_ranks;
        }
        match *algorithm {
            Algorithm::PairwiseExchange => report.pairwise = pair,
            Algorithm::GatherBroadcast { dimension, .. } => {
                report.gather_broadcast.results.push((dimension, pair));
            }
            Algorithm::Dissemination { n } => report.dissemination.push((n, pair)),
        }
    }
    report
        .gather_broadcast
        .results
        .sort_by_key(|(dimension, _)| *dimension);
    report.dissemination.sort_by_key(|(n, _)| *n);
    Ok(report)
}

/// Gather-broadcast alone at `nodes`, every dimension of [`gather_broadcast_dimensions`].
///
/// # Errors
/// As [`run_algorithm`].
pub fn run_gather_broadcast(
    nodes: usize,
    params: &CostParams,
    policy: SchedulePolicy,
) -> Result<GatherBroadcastSweep, SweepError> {
    let mut results = Vec::new();
    for dimension in gather_broadcast_dimensions(nodes) {
        let algorithm = Algorithm::GatherBroadcast { dimension, root: 0 };
        results.push((
            dimension,
            run_algorithm(algorithm, nodes, params, policy)?.0,
        ));
    }
    Ok(GatherBroadcastSweep { results })
}

fn empty_outcome() -> Outcome {
    Outcome {
        latency: f64::NAN,
        mean_completion: f64::NAN,
        last_rank: 0,
        packets: 0,
        events: 0,
        peak_pending: 0,
    }
}
