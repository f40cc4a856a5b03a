//! The LoP model of Hoefler et al., *Fast Barrier Synchronization for InfiniBand*: the 1:P
//! ping-pong's round-trip time `RTT(P)` fitted by least squares, and from the fit the n-way
//! dissemination barrier's latency and the `n` predicted best for each group size (Hoefler et al.
//! §2.3 and §4.1: "the task to deduce the optimal n-parameter ... will be done in a self-tuned
//! fashion").
//!
//! # The model
//!
//! LogP prices every message alike, so sending to `P` peers costs `P` times one message's gap:
//! its `RTT(P)` is a straight line through the one-message round trip. LoP keeps LogP's terms but
//! lets the overhead and latency depend on how many messages are posted back to back, `o(P)` and
//! `L(P)`, and reads them off `RTT(P)` (Hoefler et al. §2.3). This module writes the one-way time
//! of a burst of `P` messages, `t(P) = RTT(P) / 2 = o(P) + L(P)`, as
//!
//! ```text
//! t(P) = t1 + g·(P - 1) + c·(P - 1)²
//! ```
//!
//! - `t1`: one message alone, `o(1) + L(1)`;
//! - `g`: what each further message of the same burst adds. Hoefler et al.'s whole point is that
//!   on an offloading network `g` is far below `t1` ("the price per message transfer is much lower
//!   for 4 simultaneous messages as for 1"), and then sending `n > 1` per round pays;
//! - `c`: growth beyond linear, the receiver-side congestion Hoefler et al. blame for a too-large
//!   `n` (§4.1). Negative `c` is a burst that gets cheaper per message as it grows.
//!
//! The three are linear in the unknowns, so an ordinary least-squares fit to the measured medians
//! finds them; [`LopFit`] keeps the residuals so the report can say how well the curve holds.
//! [`fit_line`] is the same fit with `c = 0`: LogP's straight line, for comparison.
//!
//! # The prediction
//!
//! In a round of n-way dissemination every rank sends to `n` peers and waits for `n` (Hoefler et
//! al. listing 1). The ping-pong's initiator does both with `P` peers, but spread over a round
//! trip: its bursts out and in, plus one lone message's way there and back. A round has the bursts
//! and one way, so it costs the round trip less one lone way:
//!
//! ```text
//! round(n) = RTT(n) - t(1) = t1 + 2·g·(n - 1) + 2·c·(n - 1)²
//! ```
//!
//! (`d` for `n` in a last round whose offsets repeat modulo the group size and leave `d < n`
//! distinct peers). The barrier is the rounds one after another: `T(N, n) = Σ_r round(d_r)`.
//! Taking half the round trip per round instead, as if a rank's sends and receives were split
//! over two rounds, undercounts each further peer by half and picks `n` too large. This is
//! Hoefler et al.'s setting, a barrier the hosts drive; in a NIC-based barrier the hosts' overhead
//! is paid once and not per round, which the ping-pong cannot separate out (the reports compare the
//! prediction with both).
//!
//! [`model_rttp`] runs the same ping-pong in the cost model (a gather-broadcast star of `P + 1`
//! ranks is exactly a `P:1` then `1:P` exchange), so the model can be tuned their way too.

use core::fmt;

use nicbar_schedule::arith::{dissemination_rounds, distinct_offsets};
use nicbar_schedule::{Algorithm, MAX_SCHEDULE_STEPS, steps_needed};

use super::engine::Mode;
use super::params::CostParams;
use super::schedules::SchedulePolicy;
use super::sweep::{SweepError, run_algorithm};

/// One measured (or modelled) point: the round-trip time of a 1:P ping-pong.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RttPoint {
    /// `P`: peers sent to at once.
    pub peers: usize,
    /// `RTT(P)`, µs.
    pub rtt_us: f64,
}

/// A fitted `t(P)` and how well it fits.
#[derive(Clone, Debug, PartialEq)]
pub struct LopFit {
    /// `t1`, µs: one message alone, one way.
    pub single_us: f64,
    /// `g`, µs: what each further message of a burst adds, one way.
    pub gap_us: f64,
    /// `c`, µs: the quadratic term (0 for [`fit_line`]).
    pub congestion_us: f64,
    /// The points fitted, in the order given.
    pub points: Vec<RttPoint>,
    /// Measured minus fitted `RTT(P)` for each point, µs.
    pub residuals_us: Vec<f64>,
}

impl LopFit {
    /// The fitted one-way time of a burst of `peers` messages, µs.
    pub fn one_way_us(&self, peers: usize) -> f64 {
        let x = peers.saturating_sub(1) as f64;
        self.single_us + self.gap_us * x + self.congestion_us * x * x
    }

    /// The fitted `RTT(peers)`, µs.
    pub fn rtt_us(&self, peers: usize) -> f64 {
        2.0 * self.one_way_us(peers)
    }

    /// The root mean square of the residuals, µs.
    pub fn rms_us(&self) -> f64 {
        let n = self.residuals_us.len().max(1) as f64;
        (self.residuals_us.iter().map(|r| r * r).sum::<f64>() / n).sqrt()
    }

    /// The largest residual by magnitude, µs.
    pub fn max_residual_us(&self) -> f64 {
        self.residuals_us
            .iter()
            .copied()
            .fold(0.0, |a, r| if r.abs() > a.abs() { r } else { a })
    }

    /// The largest `P` the fit saw: beyond it the curve is an extrapolation, which
    /// [`LopFit::best_dissemination`] never uses.
    pub fn max_peers(&self) -> usize {
        self.points.iter().map(|p| p.peers).max().unwrap_or(1)
    }

    /// The predicted time of one dissemination round in which every rank sends to `peers` and
    /// receives from `peers`, µs: `RTT(peers) - t(1)` (see the module docs).
    pub fn round_us(&self, peers: usize) -> f64 {
        self.rtt_us(peers) - self.single_us
    }

    /// The predicted latency of n-way dissemination over `members` ranks, µs: the sum over its
    /// rounds of [`LopFit::round_us`] of each round's distinct peers (see the module docs). `None` for an `n`
    /// the schedule compilers refuse (`n` outside `1..members`, or more steps than the NIC holds).
    pub fn dissemination_us(&self, members: usize, n: usize) -> Option<f64> {
        let steps = steps_needed(Algorithm::Dissemination { n }, members).ok()?;
        if steps > MAX_SCHEDULE_STEPS {
            return None;
        }
        let mut total = 0.0;
        let mut stride = 1usize;
        for _ in 0..dissemination_rounds(members, n) {
            total += self.round_us(distinct_offsets(members, n, stride).max(1));
            stride = stride.saturating_mul(n + 1);
        }
        Some(total)
    }

    /// The `n` predicted fastest for `members` ranks, with its predicted latency; `n` ranges over
    /// `1..=min(members - 1, max_peers)` (no extrapolation past the measured bursts), and a tie
    /// keeps the smaller `n`. `None` for fewer than two members.
    pub fn best_dissemination(&self, members: usize) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64)> = None;
        for n in 1..=members.saturating_sub(1).min(self.max_peers()) {
            let Some(latency) = self.dissemination_us(members, n) else {
                continue;
            };
            // Within a picosecond counts as a tie: the smaller n has fewer packets.
            if best.is_none_or(|(_, b)| latency < b - 1e-6) {
                best = Some((n, latency));
            }
        }
        best
    }
}

/// Why a fit failed.
#[derive(Clone, Debug, PartialEq)]
pub enum LopError {
    /// Fewer distinct `P` than unknowns.
    TooFewPoints {
        /// Distinct `P` given.
        distinct: usize,
        /// Unknowns of the fit.
        needed: usize,
    },
    /// A point with `P = 0` or a round trip that is not a finite positive number.
    BadPoint(RttPoint),
}

impl fmt::Display for LopError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooFewPoints { distinct, needed } => write!(
                f,
                "{distinct} distinct peer counts cannot fit {needed} unknowns"
            ),
            Self::BadPoint(point) => write!(
                f,
                "RTT({}) = {} µs: P must be at least 1 and the time finite and positive",
                point.peers, point.rtt_us
            ),
        }
    }
}

impl std::error::Error for LopError {}

/// Fits `t(P) = t1 + g·(P-1) + c·(P-1)²` to `points` by least squares.
///
/// # Errors
/// [`LopError`] for a bad point or fewer than three distinct `P`.
pub fn fit_lop(points: &[RttPoint]) -> Result<LopFit, LopError> {
    fit(points, 3)
}

/// Fits LogP's straight line `t(P) = t1 + g·(P-1)` to `points` by least squares.
///
/// # Errors
/// [`LopError`] for a bad point or fewer than two distinct `P`.
pub fn fit_line(points: &[RttPoint]) -> Result<LopFit, LopError> {
    fit(points, 2)
}

fn fit(points: &[RttPoint], unknowns: usize) -> Result<LopFit, LopError> {
    for point in points {
        if point.peers == 0 || !point.rtt_us.is_finite() || point.rtt_us <= 0.0 {
            return Err(LopError::BadPoint(*point));
        }
    }
    let mut distinct: Vec<usize> = points.iter().map(|p| p.peers).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() < unknowns {
        return Err(LopError::TooFewPoints {
            distinct: distinct.len(),
            needed: unknowns,
        });
    }
    // Normal equations over the basis 1, x, x² (x = P - 1), on one-way times.
    let mut normal = [[0.0f64; 4]; 3];
    for point in points {
        let x = (point.peers - 1) as f64;
        let basis = [1.0, x, x * x];
        let y = point.rtt_us / 2.0;
        for row in 0..unknowns {
            for column in 0..unknowns {
                normal[row][column] += basis[row] * basis[column];
            }
            normal[row][3] += basis[row] * y;
        }
    }
    let mut coefficients = [0.0f64; 3];
    solve(&mut normal, unknowns, &mut coefficients).ok_or(LopError::TooFewPoints {
        distinct: distinct.len(),
        needed: unknowns,
    })?;
    let mut fitted = LopFit {
        single_us: coefficients[0],
        gap_us: coefficients[1],
        congestion_us: coefficients[2],
        points: points.to_vec(),
        residuals_us: Vec::new(),
    };
    fitted.residuals_us = points
        .iter()
        .map(|p| p.rtt_us - fitted.rtt_us(p.peers))
        .collect();
    Ok(fitted)
}

/// Gaussian elimination with partial pivoting on the first `size` rows and columns of an
/// augmented matrix (the right-hand side in column 3).
fn solve(m: &mut [[f64; 4]; 3], size: usize, out: &mut [f64; 3]) -> Option<()> {
    for column in 0..size {
        let pivot =
            (column..size).max_by(|&a, &b| m[a][column].abs().total_cmp(&m[b][column].abs()))?;
        if m[pivot][column].abs() < 1e-12 {
            return None;
        }
        m.swap(column, pivot);
        let pivot_row = m[column];
        for (row, values) in m.iter_mut().enumerate().take(size) {
            if row != column {
                let factor = values[column] / pivot_row[column];
                for index in column..size {
                    values[index] -= factor * pivot_row[index];
                }
                values[3] -= factor * pivot_row[3];
            }
        }
    }
    for (index, value) in out.iter_mut().enumerate().take(size) {
        *value = m[index][3] / m[index][index];
    }
    Some(())
}

/// The 1:P ping-pong in the cost model, `P = 1..=max_peers`, in `mode`: a gather-broadcast star
/// of `P + 1` ranks (the root gathers `P` packets, then sends `P`), whose latency is the
/// `P:1`-then-`1:P` round trip with every rank starting together.
///
/// # Errors
/// As [`run_algorithm`].
pub fn model_rttp(
    params: &CostParams,
    mode: Mode,
    max_peers: usize,
) -> Result<Vec<RttPoint>, SweepError> {
    (1..=max_peers)
        .map(|peers| {
            let algorithm = Algorithm::GatherBroadcast {
                dimension: peers,
                root: 0,
            };
            let (pair, _) = run_algorithm(algorithm, peers + 1, params, SchedulePolicy::Compiled)?;
            let outcome = match mode {
                Mode::Nic => pair.nic,
                Mode::Host => pair.host,
            };
            Ok(RttPoint {
                peers,
                rtt_us: outcome.latency,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(one_way: impl Fn(f64) -> f64) -> Vec<RttPoint> {
        (1..=15)
            .map(|peers| RttPoint {
                peers,
                rtt_us: 2.0 * one_way((peers - 1) as f64),
            })
            .collect()
    }

    #[test]
    fn an_exact_curve_is_found_again_with_zero_residuals() {
        let fit = fit_lop(&points(|x| 10.0 + 2.5 * x + 0.125 * x * x)).unwrap();
        assert!((fit.single_us - 10.0).abs() < 1e-9, "{fit:?}");
        assert!((fit.gap_us - 2.5).abs() < 1e-9, "{fit:?}");
        assert!((fit.congestion_us - 0.125).abs() < 1e-9, "{fit:?}");
        assert!(fit.rms_us() < 1e-9);
        // The line cannot follow the curvature: its residuals are not zero.
        let line = fit_line(&fit.points).unwrap();
        assert_eq!(line.congestion_us, 0.0);
        assert!(line.rms_us() > 0.1, "{}", line.rms_us());
    }

    #[test]
    fn residuals_are_measured_minus_fitted() {
        let mut data = points(|x| 5.0 + x);
        data[3].rtt_us += 4.0;
        let fit = fit_line(&data).unwrap();
        for (point, residual) in fit.points.iter().zip(&fit.residuals_us) {
            assert!((point.rtt_us - fit.rtt_us(point.peers) - residual).abs() < 1e-9);
        }
        assert!(fit.max_residual_us() > 0.0);
    }

    #[test]
    fn cheap_extra_messages_choose_a_larger_n_and_dear_ones_choose_one() {
        // LoP's case: each further message costs a tenth of the first; 64 ranks take six rounds
        // of 10 µs at n = 1, three of 14 µs at n = 3, two of 22 µs at n = 7.
        let cheap = fit_lop(&points(|x| 10.0 + 1.0 * x)).unwrap();
        let (n, latency) = cheap.best_dissemination(64).unwrap();
        assert_eq!(n, 3);
        assert!((latency - 42.0).abs() < 1e-9, "{latency}");
        assert!(latency < cheap.dissemination_us(64, 1).unwrap());
        assert_eq!(cheap.dissemination_us(64, 1).unwrap(), 6.0 * 10.0);
        // LogP's case with no parallelism: a further message costs a whole message.
        let dear = fit_lop(&points(|x| 10.0 + 10.0 * x)).unwrap();
        assert_eq!(dear.best_dissemination(64).unwrap().0, 1);
    }

    #[test]
    fn the_choice_stays_within_the_group_and_the_measured_bursts() {
        let free = fit_lop(&points(|x| 10.0 + 0.001 * x)).unwrap();
        assert_eq!(free.best_dissemination(3).unwrap().0, 2);
        assert_eq!(free.best_dissemination(16).unwrap().0, 15);
        // 1000 ranks: never past the 15 measured peers.
        assert!(free.best_dissemination(1000).unwrap().0 <= 15);
        assert_eq!(free.best_dissemination(1), None);
        assert_eq!(free.dissemination_us(4, 4), None);
    }

    #[test]
    fn a_repeated_offset_makes_a_smaller_last_burst() {
        // 9 ranks, n = 2: offsets 1, 2 then 3, 6: two rounds of two.
        // A round with d peers costs 10 + 6·(d - 1).
        let fit = fit_lop(&points(|x| 10.0 + 3.0 * x)).unwrap();
        assert!((fit.round_us(1) - 10.0).abs() < 1e-9);
        assert!((fit.dissemination_us(9, 2).unwrap() - 2.0 * 16.0).abs() < 1e-9);
        // 8 ranks, n = 3: stride 4 in round 1 has period 2: one distinct peer.
        assert!((fit.dissemination_us(8, 3).unwrap() - (22.0 + 10.0)).abs() < 1e-9);
    }

    #[test]
    fn bad_points_are_refused_and_named() {
        let bad = [RttPoint {
            peers: 0,
            rtt_us: 3.0,
        }];
        assert!(matches!(fit_lop(&bad), Err(LopError::BadPoint(_))));
        let nan = [RttPoint {
            peers: 2,
            rtt_us: f64::NAN,
        }];
        assert!(fit_lop(&nan).unwrap_err().to_string().contains("RTT(2)"));
        let two = &points(|x| x + 1.0)[..2];
        assert_eq!(
            fit_lop(two),
            Err(LopError::TooFewPoints {
                distinct: 2,
                needed: 3
            })
        );
        assert!(fit_line(two).is_ok());
    }

    #[test]
    fn the_model_ping_pong_grows_with_the_peers() {
        let params = CostParams {
            send: 1.0,
            sdma: 1.0,
            network: 1.0,
            recv: 1.0,
            rdma: 1.0,
            hrecv: 1.0,
            step: 0.5,
            xmit: 0.1,
            busy_share: 1.0,
        };
        for mode in [Mode::Nic, Mode::Host] {
            let rtt = model_rttp(&params, mode, 6).unwrap();
            assert_eq!(rtt.len(), 6);
            for pair in rtt.windows(2) {
                assert!(pair[1].rtt_us > pair[0].rtt_us, "{mode}: {rtt:?}");
            }
        }
    }
}
