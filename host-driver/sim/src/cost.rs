//! The barrier cost model: every rank's compiled schedule run in virtual time against the costs of
//! the paper's equations 1-2, NIC-based and host-based, to predict barrier latency at sizes no
//! cluster here has (paper §2.2 and §6; Hoefler, Mehlan, Mietke, Rehm, *Fast Barrier
//! Synchronization for InfiniBand*, for dissemination).
//!
//! The real-firmware simulator ([`super::world`]) runs the firmware byte for byte but has no notion
//! of how long a LANai takes to do anything. This model is the other half: it knows nothing of
//! packets' bytes, only of who sends what to whom in which order (the very schedules the NIC runs)
//! and what each piece of work costs on which resource. It is a discrete-event simulation with an
//! event heap and time that jumps to the next event, O(events · log events) per barrier, which is
//! O(N log N) for pairwise exchange and dissemination.
//!
//! # Resources
//!
//! Every node has three serial servers, each a FIFO queue of work in virtual time:
//!
//! - the **host processor**: posting a send token (`Send`) and handling a delivered message or
//!   completion notice (`HRecv`);
//! - the **NIC processor**: one LANai runs all four GM state machines (SDMA, SEND, RECV, RDMA) in
//!   one loop and drives the single host-DMA engine, so all NIC work queues here: taking a packet
//!   off the wire (`Recv`), pulling a host message over DMA (`SDMA`), pushing a message or a
//!   completion to the host (`RDMA`), and the barrier engine's work per sending step (`Step`);
//! - the **transmit channel**: a packet occupies it for `Xmit` from its transmit start. The receive
//!   channel is separate (paper §2.2: Myrinet NICs receive while they transmit) and is not a
//!   separate queue here: a packet occupies it for the same `Xmit`, far less than the `Recv` the
//!   NIC processor spends on each packet, so the processor is always the tighter queue.
//!
//! A packet reaches the receiving NIC `Network` after its transmit starts (wormhole routing, paper
//! §2.2). The wire itself never queues: the fabric is a non-blocking crossbar (the paper's 16-port
//! switch), and barrier packets are tiny.
//!
//! Part of `Recv`, `SDMA` and `RDMA` may be the packet interface's or the DMA engine's own time
//! rather than the processor's: [`CostParams::busy_share`] says how much holds the processor (the
//! rest is a pure delay: before the processor's share for a received packet, after it for a DMA).
//! The fitted costs take all of it as processor time (share 1).
//!
//! # The two ways to run a schedule
//!
//! Both modes run the same compiled schedule (a list of `SEND`, `RECV`, `EXCHANGE` steps per rank,
//! from [`nicbar_schedule`]); every rank enters the barrier at time 0, as §2.2
//! assumes, and the barrier's latency is the time the last rank leaves it.
//!
//! - **NIC-based** (equation 2): the host pays `Send` once to post the barrier token; the NIC then
//!   interprets the steps as `firmware::barrier` does. A sending step (`SEND`, or the send half of
//!   `EXCHANGE`) costs the NIC processor `Step` and hands the packet to the transmit channel;
//!   sends never block. A receiving step waits for its (peer, round) packet; every packet costs the
//!   NIC processor `Recv` when it arrives, whether the engine is waiting for it or it is early and
//!   only recorded. The engine runs as many steps as it can back to back, as the firmware's
//!   `advance` loop does. After the last step the NIC pays `RDMA` to post the completion and the
//!   host pays `HRecv` to see it.
//! - **Host-based** (equation 1): the host runs the same steps over ordinary messages. A sending
//!   step costs the host `Send`; then the NIC pays `SDMA` and transmits. The host does not wait
//!   for the NIC: consecutive sends pipeline through it, which is what §6 says makes the
//!   host-based gather-broadcast's broadcast phase cheaper than its equation suggests. Every
//!   message costs the NIC `Recv` and `RDMA` when it arrives and the host `HRecv` as soon as the
//!   host is free (it polls its receive queue, as a GM program polls `gm_receive`, and takes
//!   messages in the order they come, not the order its schedule names them); a receiving step
//!   waits until its message has been taken.
//!
//! For pairwise exchange at a power of two, with nothing queueing, this is exactly equation 1 for
//! host-based and `Send + log2 N · (Step + Network + Recv) + RDMA + HRecv` for NIC-based, which
//! is equation 2 when `Step` is zero (`tests/cost_model.rs` checks both to 1e-9).
//!
//! # Parameters and the fit
//!
//! [`params`] holds the costs and the fit to the paper. The paper's Figure 5 is not legible in the
//! copy this project works from (its data are pictures), so the two-node figures cannot be read.
//! The fit uses only numbers stated in the text: the LANai 7.2 eight-node pairwise exchange
//! latencies (49.25 µs NIC-based, 90.24 µs host-based) and the LANai 4.3 eight-node factor (1.66).
//! The 16-node LANai 4.3 figures (PE 102.14 µs and 1.78×, GB 152.27 µs and 1.46×) are never used
//! by the fit; they are what [`paper`] predicts and scores ([`figures`] states them all). How
//! three figures pin seven costs — which costs are tied together, what scales with the NIC
//! clock — is in [`params`].
//!
//! # Schedules at scale
//!
//! [`schedules`] gives the engine one rank's step at a time. Up to
//! [`schedules::COMPILED_UP_TO`] ranks it holds the output of `compile` for every rank. Beyond,
//! `compile` is O(N) per call (it checks the whole group each time: about 0.1 ms per rank at
//! 65,536 ranks, seven seconds per algorithm), so the steps come from the compilers' documented
//! formulas, computed per step with no storage, and every run checks them against `compile` for
//! a sample of ranks (the tests check every rank at every size up to a few hundred).
//!
//! # Allreduce
//!
//! [`allreduce`] runs the NIC's small allreduce (recursive doubling with the non-power-of-two
//! fix-up, combining up to 32 bytes in each step) NIC-based or host-based: the pairwise exchange
//! barrier's packets, plus a caller-given cost for each step that combines, on the processor that
//! runs the schedule.
//!
//! # Hoefler et al.'s self-tuning
//!
//! [`lop`] fits Hoefler et al.'s LoP model to a 1:P ping-pong's round trips, measured (`cargo xtask
//! bench rttp`) or run in this model ([`lop::model_rttp`]), and predicts from the fit the n-way
//! dissemination `n` best for each group size; `cargo xtask sim tune` simulates that `n` beside
//! `n = 1` and the other algorithms to 65,536 nodes.

pub mod allreduce;
pub mod engine;
pub mod figures;
pub mod lop;
pub mod paper;
pub mod params;
pub mod schedules;
pub mod sweep;

pub use allreduce::{AllreduceSchedules, simulate_allreduce};
pub use engine::{
    Mode, Outcome, SimulationError, Transmission, simulate, simulate_combining, simulate_traced,
};
pub use params::CostParams;
pub use schedules::{ModelStep, SchedulePolicy, ScheduleSet, ScheduleSource};
