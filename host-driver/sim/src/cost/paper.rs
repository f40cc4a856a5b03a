//! The paper's figures (§6 and the abstract, stated in [`super::figures`]), which of them the fit
//! uses and which it predicts, and the model's numbers beside them.
//!
//! Host-based latencies the text does not state but implies (NIC-based latency times the factor)
//! are marked as derived.

use core::fmt;

use nicbar_schedule::Algorithm;

use super::figures::{
    LANAI43_GB16_FACTOR, LANAI43_GB16_NIC_US, LANAI43_PE8_FACTOR, LANAI43_PE16_FACTOR,
    LANAI43_PE16_NIC_US, LANAI72_PE8_HOST_US, LANAI72_PE8_NIC_US,
};
use super::params::{CostParams, Fit, FitAssumptions, FitError, fit};
use super::schedules::SchedulePolicy;
use super::sweep::{Pair, SweepError, run_algorithm, run_gather_broadcast};

/// The sizes the paper measured (§6): 2, 4, 8 nodes on both cards, 16 on the LANai 4.3.
pub const PAPER_SIZES: [usize; 4] = [2, 4, 8, 16];

/// A NIC card of the paper's cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Card {
    /// LANai 4.3, 33 MHz, 16 nodes.
    Lanai43,
    /// LANai 7.2, 66 MHz, 8 nodes.
    Lanai72,
}

impl Card {
    /// The most nodes the paper had with this card.
    pub fn nodes(self) -> usize {
        match self {
            Self::Lanai43 => 16,
            Self::Lanai72 => 8,
        }
    }
}

impl fmt::Display for Card {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Lanai43 => "LANai 4.3",
            Self::Lanai72 => "LANai 7.2",
        })
    }
}

/// The paper's two algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Pairwise exchange (PE).
    PairwiseExchange,
    /// Gather-and-broadcast (GB), best dimension.
    GatherBroadcast,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PairwiseExchange => "PE",
            Self::GatherBroadcast => "GB",
        })
    }
}

/// What the model did with a figure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The fit made the model match it.
    Fitted,
    /// The fit never saw it: the model's value is a prediction.
    Predicted,
}

/// A number from the paper.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PaperValue {
    /// The value (µs, or a factor).
    pub value: f64,
    /// Fitted or predicted.
    pub role: Role,
    /// Not stated, but implied by two stated numbers (NIC-based latency times factor).
    pub derived: bool,
}

impl PaperValue {
    const fn stated(value: f64, role: Role) -> Self {
        Self {
            value,
            role,
            derived: false,
        }
    }

    const fn derived(value: f64, role: Role) -> Self {
        Self {
            value,
            role,
            derived: true,
        }
    }
}

/// What the paper states for `card`, `nodes`, `family`: NIC-based latency, host-based latency,
/// factor.
pub fn paper_values(card: Card, nodes: usize, family: Family) -> [Option<PaperValue>; 3] {
    use Role::{Fitted, Predicted};
    match (card, nodes, family) {
        (Card::Lanai72, 8, Family::PairwiseExchange) => [
            Some(PaperValue::stated(LANAI72_PE8_NIC_US, Fitted)),
            Some(PaperValue::stated(LANAI72_PE8_HOST_US, Fitted)),
            Some(PaperValue::stated(1.83, Fitted)),
        ],
        (Card::Lanai43, 8, Family::PairwiseExchange) => [
            None,
            None,
            Some(PaperValue::stated(LANAI43_PE8_FACTOR, Fitted)),
        ],
        (Card::Lanai43, 16, Family::PairwiseExchange) => [
            Some(PaperValue::stated(LANAI43_PE16_NIC_US, Predicted)),
            Some(PaperValue::derived(
                LANAI43_PE16_NIC_US * LANAI43_PE16_FACTOR,
                Predicted,
            )),
            Some(PaperValue::stated(LANAI43_PE16_FACTOR, Predicted)),
        ],
        (Card::Lanai43, 16, Family::GatherBroadcast) => [
            Some(PaperValue::stated(LANAI43_GB16_NIC_US, Predicted)),
            Some(PaperValue::derived(
                LANAI43_GB16_NIC_US * LANAI43_GB16_FACTOR,
                Predicted,
            )),
            Some(PaperValue::stated(LANAI43_GB16_FACTOR, Predicted)),
        ],
        _ => [None, None, None],
    }
}

/// `(model - paper) / paper`.
pub fn relative_error(model: f64, paper: f64) -> f64 {
    (model - paper) / paper
}

/// The model beside the paper for one card, size and algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct ComparisonRow {
    /// The card.
    pub card: Card,
    /// Nodes.
    pub nodes: usize,
    /// The algorithm.
    pub family: Family,
    /// NIC-based latency, µs.
    pub nic: f64,
    /// Host-based latency, µs.
    pub host: f64,
    /// Gather-broadcast: the dimensions the NIC-based and host-based minima were found at.
    pub dimensions: Option<(usize, usize)>,
    /// The paper's NIC-based latency, host-based latency, factor.
    pub paper: [Option<PaperValue>; 3],
}

impl ComparisonRow {
    /// The model's factor.
    pub fn factor(&self) -> f64 {
        self.host / self.nic
    }

    /// The model's NIC-based latency, host-based latency, factor (the order of `paper`).
    pub fn model(&self) -> [f64; 3] {
        [self.nic, self.host, self.factor()]
    }
}

/// Runs the paper's sizes on both fitted cards.
///
/// # Errors
/// A run failed.
pub fn compare(fit: &Fit, policy: SchedulePolicy) -> Result<Vec<ComparisonRow>, SweepError> {
    let mut rows = Vec::new();
    for (card, params) in [(Card::Lanai43, fit.lanai43), (Card::Lanai72, fit.lanai72)] {
        for nodes in PAPER_SIZES.into_iter().filter(|&n| n <= card.nodes()) {
            let (pe, _) = run_algorithm(Algorithm::PairwiseExchange, nodes, &params, policy)?;
            rows.push(ComparisonRow {
                card,
                nodes,
                family: Family::PairwiseExchange,
                nic: pe.nic.latency,
                host: pe.host.latency,
                dimensions: None,
                paper: paper_values(card, nodes, Family::PairwiseExchange),
            });
            let gb = run_gather_broadcast(nodes, &params, policy)?;
            let ((nic_dimension, nic), (host_dimension, host)) = (gb.best_nic(), gb.best_host());
            rows.push(ComparisonRow {
                card,
                nodes,
                family: Family::GatherBroadcast,
                nic: nic.latency,
                host: host.latency,
                dimensions: Some((nic_dimension, host_dimension)),
                paper: paper_values(card, nodes, Family::GatherBroadcast),
            });
        }
    }
    Ok(rows)
}

/// A statement of the paper's text, checked against the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    /// What the paper says.
    pub statement: &'static str,
    /// Whether the model agrees.
    pub holds: bool,
    /// The model's numbers behind the verdict.
    pub detail: String,
}

fn row(rows: &[ComparisonRow], card: Card, nodes: usize, family: Family) -> Option<&ComparisonRow> {
    rows.iter()
        .find(|r| r.card == card && r.nodes == nodes && r.family == family)
}

/// The paper's qualitative statements about its measurements (§6, §1), checked on `rows`.
pub fn checks(rows: &[ComparisonRow]) -> Vec<Check> {
    let mut checks = Vec::new();
    let lanai43 = |nodes, family| row(rows, Card::Lanai43, nodes, family);
    let sizes43: Vec<usize> = PAPER_SIZES.to_vec();

    if let Some(gb) = lanai43(2, Family::GatherBroadcast) {
        checks.push(Check {
            statement: "§6: on two LANai 4.3 nodes the NIC-based GB is slower than the host-based GB",
            holds: gb.nic > gb.host,
            detail: format!("model: NIC {:.2} µs, host {:.2} µs", gb.nic, gb.host),
        });
    }
    let mut fastest = true;
    let mut detail = String::new();
    for &nodes in &sizes43 {
        if let (Some(pe), Some(gb)) = (
            lanai43(nodes, Family::PairwiseExchange),
            lanai43(nodes, Family::GatherBroadcast),
        ) {
            fastest &= pe.nic < pe.host.min(gb.nic).min(gb.host);
            detail += &format!(
                "{nodes}: {:.1} vs {:.1} ",
                pe.nic,
                pe.host.min(gb.nic).min(gb.host)
            );
        }
    }
    checks.push(Check {
        statement: "§6: the NIC-based PE beats every other barrier (LANai 4.3, every size)",
        holds: fastest,
        detail: format!("NIC PE vs best other: {}", detail.trim_end()),
    });
    let mut beats = true;
    let mut detail = String::new();
    for &nodes in sizes43.iter().filter(|&&n| n > 2) {
        if let (Some(pe), Some(gb)) = (
            lanai43(nodes, Family::PairwiseExchange),
            lanai43(nodes, Family::GatherBroadcast),
        ) {
            beats &= gb.nic < pe.host.min(gb.host);
            detail += &format!("{nodes}: {:.1} vs {:.1} ", gb.nic, pe.host.min(gb.host));
        }
    }
    checks.push(Check {
        statement: "§6: the NIC-based GB beats both host-based barriers beyond two nodes (LANai 4.3)",
        holds: beats,
        detail: format!("NIC GB vs best host: {}", detail.trim_end()),
    });
    let mut host_pe_wins = true;
    let mut detail = String::new();
    for &nodes in &sizes43 {
        if let (Some(pe), Some(gb)) = (
            lanai43(nodes, Family::PairwiseExchange),
            lanai43(nodes, Family::GatherBroadcast),
        ) {
            host_pe_wins &= pe.host < gb.host;
            detail += &format!("{nodes}: {:.1} vs {:.1} ", pe.host, gb.host);
        }
    }
    checks.push(Check {
        statement: "§6: the host-based PE beats the host-based GB (LANai 4.3)",
        holds: host_pe_wins,
        detail: format!("host PE vs host GB: {}", detail.trim_end()),
    });
    for card in [Card::Lanai43, Card::Lanai72] {
        let factors: Vec<f64> = PAPER_SIZES
            .into_iter()
            .filter_map(|nodes| row(rows, card, nodes, Family::PairwiseExchange))
            .map(ComparisonRow::factor)
            .collect();
        checks.push(Check {
            statement: match card {
                Card::Lanai43 => "§1: the PE factor grows with the number of nodes (LANai 4.3)",
                Card::Lanai72 => "§1: the PE factor grows with the number of nodes (LANai 7.2)",
            },
            holds: factors.windows(2).all(|pair| pair[1] > pair[0]),
            detail: format!(
                "factors at {:?}: {}",
                &PAPER_SIZES[..factors.len()],
                factors
                    .iter()
                    .map(|f| format!("{f:.3}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    let mut faster = true;
    let mut detail = String::new();
    for nodes in [2, 4, 8] {
        for family in [Family::PairwiseExchange, Family::GatherBroadcast] {
            if let (Some(slow), Some(fast)) = (
                row(rows, Card::Lanai43, nodes, family),
                row(rows, Card::Lanai72, nodes, family),
            ) {
                faster &= fast.nic < slow.nic && fast.host < slow.host;
                detail += &format!("{nodes} {family}: {:.0}/{:.0} ", fast.nic, fast.host);
            }
        }
    }
    checks.push(Check {
        statement: "§6: the LANai 7.2 improves every implementation over the LANai 4.3",
        holds: faster,
        detail: format!("LANai 7.2 NIC/host: {}", detail.trim_end()),
    });
    checks
}

/// The 16-node LANai 4.3 predictions under other values of what the fit does not fit.
#[derive(Clone, Debug, PartialEq)]
pub struct Sensitivity {
    /// The `Network` assumed, µs.
    pub network: f64,
    /// The busy share assumed.
    pub busy_share: f64,
    /// The fit under them.
    pub fit: Fit,
    /// Pairwise exchange at 16 nodes.
    pub pairwise: Pair,
    /// Gather-broadcast at 16 nodes: best NIC-based latency, best host-based latency.
    pub gather_broadcast: (f64, f64),
}

/// Why a sensitivity run failed.
#[derive(Debug)]
pub enum SensitivityError {
    /// The fit failed under this assumption.
    Fit(FitError),
    /// A run failed.
    Sweep(SweepError),
}

impl fmt::Display for SensitivityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fit(error) => error.fmt(f),
            Self::Sweep(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for SensitivityError {}

/// For each `(network, busy_share)`, refits with that `Network` (all else as
/// [`FitAssumptions::default`]), sets the LANai 4.3's busy share, and predicts the 16-node LANai
/// 4.3 figures again. Neither value is fitted: this shows what the predictions rest on.
///
/// # Errors
/// A fit or a run failed.
pub fn sensitivity(
    variants: &[(f64, f64)],
    policy: SchedulePolicy,
) -> Result<Vec<Sensitivity>, SensitivityError> {
    let mut out = Vec::new();
    for &(network, busy_share) in variants {
        let fit = fit(FitAssumptions {
            network,
            ..FitAssumptions::default()
        })
        .map_err(SensitivityError::Fit)?;
        let params = CostParams {
            busy_share,
            ..fit.lanai43
        };
        let (pairwise, _) = run_algorithm(Algorithm::PairwiseExchange, 16, &params, policy)
            .map_err(SensitivityError::Sweep)?;
        let gb = run_gather_broadcast(16, &params, policy).map_err(SensitivityError::Sweep)?;
        out.push(Sensitivity {
            network,
            busy_share,
            fit,
            pairwise,
            gather_broadcast: (gb.best_nic().1.latency, gb.best_host().1.latency),
        });
    }
    Ok(out)
}
