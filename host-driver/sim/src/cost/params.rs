//! The costs of the model (the terms of the paper's equations 1-2, plus the NIC's work per sending
//! step and the transmit channel's time per packet) and their fit to the paper's LANai figures.
//!
//! # What the fit uses, and what it does not
//!
//! The paper's Figure 5 (latency and factor against nodes, LANai 4.3 and 7.2) survives in the copy
//! this project has only as captions, so its two-node points cannot be read off. The text states
//! five numbers; the fit uses three of them and leaves the other two for the prediction:
//!
//! | figure (paper §6) | used as |
//! |---|---|
//! | LANai 7.2, 8 nodes, PE NIC-based 49.25 µs | fitted |
//! | LANai 7.2, 8 nodes, PE host-based 90.24 µs | fitted |
//! | LANai 4.3, 8 nodes, PE factor 1.66 | fitted |
//! | LANai 4.3, 16 nodes, PE NIC-based 102.14 µs, factor 1.78 | predicted, never fitted |
//! | LANai 4.3, 16 nodes, GB NIC-based 152.27 µs, factor 1.46 | predicted, never fitted |
//!
//! (LANai 7.2's 1.83 at eight nodes is 90.24 / 49.25, not a figure of its own.)
//!
//! Three numbers cannot pin seven costs on their own, so the fit ties the costs together by what
//! they physically are, and says so:
//!
//! - **Host costs are the same on both cards** (the same Pentium II hosts, the same GM library),
//!   and `Send = HRecv = h`: each is one GM library call that touches the NIC's memory over PCI
//!   (posting a token, taking an event).
//! - **NIC costs scale with the NIC clock**: a LANai 4.3 (33 MHz) takes `66/33 = 2` times as long
//!   as a LANai 7.2 (66 MHz) for each. `SDMA = Recv = RDMA = o`: each is one pass of one GM state
//!   machine over one small packet or one small DMA. `Step = t` is the barrier engine's work to
//!   build and queue one barrier packet (a `SEND` step, or the send half of an `EXCHANGE`); a
//!   receiving step's match against the record is part of `Recv`.
//! - **`Network`, `Xmit` and the busy share are not fitted**: `Network` (transmit start to
//!   receive start through a cut-through Myrinet switch, which §2.2 calls small) is taken as
//!   1 µs; `Xmit` is a 40-byte barrier packet at Myrinet's 1.28 Gbit/s, 0.25 µs; and all of
//!   `Recv`, `SDMA` and `RDMA` is taken as NIC processor time (busy share 1), the simplest
//!   reading of a single-threaded LANai. No figure the fit may use depends on the busy share
//!   (pairwise exchange never queues), so it cannot be fitted without fitting to the very GB
//!   figures the model predicts. [`super::paper::sensitivity`] shows how the predictions move
//!   with `Network` and with the busy share.
//!
//! That leaves three unknowns, `h`, `o` and `t` (LANai 7.2 values), and three equations: the
//! model's eight-node pairwise exchange latencies on the LANai 7.2 equal 49.25 and 90.24 µs, and
//! on the LANai 4.3 their ratio is 1.66. The model's latency of pairwise exchange at a power of two
//! is affine in the costs (no queue ever forms in it), so the system is linear and [`fit`] solves
//! it exactly; `tests/cost_model.rs` checks that the simulator reproduces the three figures.

use core::fmt;

use super::figures;

/// The costs of one NIC and host, in microseconds. Every cost is time a resource is busy
/// (see the module docs of [`super`] for which resource), except `network`, which is a delay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostParams {
    /// `Send`: the host posts a send or barrier token until the NIC sees it (host processor).
    pub send: f64,
    /// `SDMA`: the NIC pulls a message from host memory and prepares its packet (NIC processor).
    pub sdma: f64,
    /// `Network`: from the start of a packet's transmission to the start of its reception.
    pub network: f64,
    /// `Recv`: the NIC takes one packet off the wire, matches and records it (NIC processor).
    pub recv: f64,
    /// `RDMA`: the NIC pushes a message or a completion notice to host memory (NIC processor).
    pub rdma: f64,
    /// `HRecv`: the host handles a delivered message or completion notice (host processor).
    pub hrecv: f64,
    /// The barrier engine's work for one sending step, NIC-based only: build and queue one
    /// barrier packet (NIC processor).
    pub step: f64,
    /// `Xmit`: one packet on the transmit channel (transmit channel).
    pub xmit: f64,
    /// The share of `Recv`, `SDMA` and `RDMA` during which the NIC processor is busy, `0..=1`. The
    /// rest is the packet interface's and the DMA engine's own time, a delay that does not hold
    /// the processor: a packet's hardware reception comes before the processor's share, a DMA's
    /// transfer after it. 1 (the fit's assumption) makes each of them all processor time. Latency
    /// without queueing (pairwise exchange at a power of two, equations 1-2) does not depend on it;
    /// only fan-in and fan-out do.
    pub busy_share: f64,
}

impl CostParams {
    /// Every cost zero.
    pub const ZERO: Self = Self {
        send: 0.0,
        sdma: 0.0,
        network: 0.0,
        recv: 0.0,
        rdma: 0.0,
        hrecv: 0.0,
        step: 0.0,
        xmit: 0.0,
        busy_share: 1.0,
    };

    /// Every cost zero except `Network`: latency is then the critical path's length in messages
    /// times `network`.
    pub const fn network_only(network: f64) -> Self {
        Self {
            network,
            ..Self::ZERO
        }
    }

    /// The costs by name, in the order the paper lists them (then `Step`, `Xmit`).
    pub fn named(&self) -> [(&'static str, f64); 8] {
        [
            ("Send", self.send),
            ("SDMA", self.sdma),
            ("Network", self.network),
            ("Recv", self.recv),
            ("RDMA", self.rdma),
            ("HRecv", self.hrecv),
            ("Step", self.step),
            ("Xmit", self.xmit),
        ]
    }

    /// Checks that every cost is a finite number `>= 0` and the busy share is in `0..=1`.
    ///
    /// # Errors
    /// Names the first value that is not.
    pub fn check(&self) -> Result<(), String> {
        for (name, value) in self.named() {
            if !value.is_finite() || value < 0.0 {
                return Err(format!(
                    "{name} = {value} µs: a cost must be finite and >= 0"
                ));
            }
        }
        if !(0.0..=1.0).contains(&self.busy_share) {
            return Err(format!(
                "busy share = {}: it is a fraction of Recv, SDMA and RDMA, 0..=1",
                self.busy_share
            ));
        }
        Ok(())
    }

    /// Equation 1: the host-based pairwise exchange latency over `rounds` (`log2 N`) rounds,
    /// `rounds × (Send + SDMA + Network + Recv + RDMA + HRecv)`.
    pub fn equation_1(&self, rounds: u32) -> f64 {
        f64::from(rounds)
            * (self.send + self.sdma + self.network + self.recv + self.rdma + self.hrecv)
    }

    /// Equation 2 with the NIC's per-step cost: the NIC-based pairwise exchange latency,
    /// `Send + rounds × (Step + Network + Recv) + RDMA + HRecv`. With `step = 0` this is the
    /// paper's equation 2.
    pub fn equation_2(&self, rounds: u32) -> f64 {
        self.send
            + f64::from(rounds) * (self.step + self.network + self.recv)
            + self.rdma
            + self.hrecv
    }
}

/// What the fit takes as given instead of fitting.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitAssumptions {
    /// `Network`, µs (both cards).
    pub network: f64,
    /// `Xmit`, µs (both cards).
    pub xmit: f64,
    /// How many times longer NIC work takes on a LANai 4.3 than on a LANai 7.2 (their clocks,
    /// 66 MHz over 33 MHz, paper §6).
    pub clock_ratio: f64,
}

impl Default for FitAssumptions {
    fn default() -> Self {
        Self {
            network: 1.0,
            // 40 bytes (a barrier packet's header) at 1.28 Gbit/s.
            xmit: 40.0 * 8.0 / 1280.0,
            clock_ratio: 66.0 / 33.0,
        }
    }
}

/// The fit's result: the three fitted unknowns and the two cards' costs built from them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// What was assumed.
    pub assumptions: FitAssumptions,
    /// `h = Send = HRecv`, µs, both cards.
    pub host_call: f64,
    /// `o = SDMA = Recv = RDMA` on the LANai 7.2, µs.
    pub nic_pass_lanai72: f64,
    /// `t = Step` on the LANai 7.2, µs.
    pub step_lanai72: f64,
    /// The LANai 7.2's costs.
    pub lanai72: CostParams,
    /// The LANai 4.3's costs (NIC costs times the clock ratio).
    pub lanai43: CostParams,
}

/// Why the fit failed.
#[derive(Clone, Debug, PartialEq)]
pub enum FitError {
    /// The equations have no single solution under these assumptions.
    Singular,
    /// The solution has a negative or non-finite cost: the assumptions contradict the figures.
    Unphysical {
        /// Which unknown.
        name: &'static str,
        /// Its value, µs.
        value: f64,
    },
}

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Singular => f.write_str("the fit's equations have no single solution"),
            Self::Unphysical { name, value } => write!(
                f,
                "the fit gives {name} = {value:.3} µs: the assumptions contradict the figures"
            ),
        }
    }
}

impl std::error::Error for FitError {}

/// The costs of a card from the three unknowns `h`, `o`, `t` (LANai 7.2 values) and the factor
/// its NIC work takes relative to a LANai 7.2.
fn card(unknowns: [f64; 3], nic_factor: f64, assumptions: &FitAssumptions) -> CostParams {
    let [host_call, nic_pass, step] = unknowns;
    CostParams {
        send: host_call,
        sdma: nic_pass * nic_factor,
        network: assumptions.network,
        recv: nic_pass * nic_factor,
        rdma: nic_pass * nic_factor,
        hrecv: host_call,
        step: step * nic_factor,
        xmit: assumptions.xmit,
        busy_share: 1.0,
    }
}

/// The three fitted figures as residuals (zero when the model matches), each affine in the
/// unknowns.
fn residuals(unknowns: [f64; 3], assumptions: &FitAssumptions) -> [f64; 3] {
    const EIGHT_NODE_ROUNDS: u32 = 3;
    let lanai72 = card(unknowns, 1.0, assumptions);
    let lanai43 = card(unknowns, assumptions.clock_ratio, assumptions);
    [
        lanai72.equation_2(EIGHT_NODE_ROUNDS) - figures::LANAI72_PE8_NIC_US,
        lanai72.equation_1(EIGHT_NODE_ROUNDS) - figures::LANAI72_PE8_HOST_US,
        lanai43.equation_1(EIGHT_NODE_ROUNDS)
            - figures::LANAI43_PE8_FACTOR * lanai43.equation_2(EIGHT_NODE_ROUNDS),
    ]
}

/// Fits `h`, `o` and `t` to the three eight-node figures (see the module docs).
///
/// # Errors
/// [`FitError`] if the equations are singular or a fitted cost comes out negative.
pub fn fit(assumptions: FitAssumptions) -> Result<Fit, FitError> {
    // Affine residuals: r(x) = A x + r(0). Column j of A is r(e_j) - r(0).
    let at_zero = residuals([0.0; 3], &assumptions);
    let mut matrix = [[0.0f64; 4]; 3];
    for column in 0..3 {
        let mut unit = [0.0; 3];
        unit[column] = 1.0;
        let at_unit = residuals(unit, &assumptions);
        for row in 0..3 {
            matrix[row][column] = at_unit[row] - at_zero[row];
        }
    }
    for row in 0..3 {
        matrix[row][3] = -at_zero[row];
    }
    let solution = solve3(matrix).ok_or(FitError::Singular)?;
    for (name, value) in ["h (Send, HRecv)", "o (SDMA, Recv, RDMA)", "t (Step)"]
        .into_iter()
        .zip(solution)
    {
        if !value.is_finite() || value < 0.0 {
            return Err(FitError::Unphysical { name, value });
        }
    }
    Ok(Fit {
        assumptions,
        host_call: solution[0],
        nic_pass_lanai72: solution[1],
        step_lanai72: solution[2],
        lanai72: card(solution, 1.0, &assumptions),
        lanai43: card(solution, assumptions.clock_ratio, &assumptions),
    })
}

/// Gaussian elimination with partial pivoting on an augmented 3×4 matrix.
fn solve3(mut m: [[f64; 4]; 3]) -> Option<[f64; 3]> {
    for column in 0..3 {
        let pivot =
            (column..3).max_by(|&a, &b| m[a][column].abs().total_cmp(&m[b][column].abs()))?;
        if m[pivot][column].abs() < 1e-12 {
            return None;
        }
        m.swap(column, pivot);
        let pivot_row = m[column];
        for (row, values) in m.iter_mut().enumerate() {
            if row != column {
                let factor = values[column] / pivot_row[column];
                for (value, pivot_value) in values.iter_mut().zip(pivot_row).skip(column) {
                    *value -= factor * pivot_value;
                }
            }
        }
    }
    Some([m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_solves_its_three_equations_and_nothing_else() {
        let fit = fit(FitAssumptions::default()).unwrap();
        let unknowns = [fit.host_call, fit.nic_pass_lanai72, fit.step_lanai72];
        for residual in residuals(unknowns, &fit.assumptions) {
            assert!(residual.abs() < 1e-9, "{residual}");
        }
        // The closed forms on the fitted cards give the figures back.
        assert!((fit.lanai72.equation_2(3) - 49.25).abs() < 1e-9);
        assert!((fit.lanai72.equation_1(3) - 90.24).abs() < 1e-9);
        let factor = fit.lanai43.equation_1(3) / fit.lanai43.equation_2(3);
        assert!((factor - 1.66).abs() < 1e-9, "{factor}");
        // LANai 4.3 NIC work is twice LANai 7.2's; host work is the same.
        assert_eq!(fit.lanai43.recv, 2.0 * fit.lanai72.recv);
        assert_eq!(fit.lanai43.step, 2.0 * fit.lanai72.step);
        assert_eq!(fit.lanai43.send, fit.lanai72.send);
    }

    #[test]
    fn contradictory_assumptions_are_refused_not_fitted() {
        // A network slower than the whole LANai 7.2 host-based round forces negative costs.
        let assumptions = FitAssumptions {
            network: 40.0,
            ..FitAssumptions::default()
        };
        assert!(matches!(fit(assumptions), Err(FitError::Unphysical { .. })));
    }

    #[test]
    fn negative_or_infinite_costs_are_named() {
        let mut params = CostParams::ZERO;
        assert!(params.check().is_ok());
        params.rdma = -1.0;
        assert!(params.check().unwrap_err().contains("RDMA"));
        params.rdma = f64::INFINITY;
        assert!(params.check().unwrap_err().contains("RDMA"));
        params.rdma = 1.0;
        params.busy_share = 1.5;
        assert!(params.check().unwrap_err().contains("busy share"));
    }
}
