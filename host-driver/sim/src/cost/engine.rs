//! The discrete-event engine: every rank's schedule run NIC-based or host-based against the costs,
//! on three serial servers per node (host processor, NIC processor, transmit channel), in virtual
//! time.
//!
//! A serial server is kept as the time it next falls free. Work on it starts at
//! `max(requested, free)`; since events are handled in time order, work is served in the order it
//! was requested (FIFO). Work that follows other work on the same server without a gap (the
//! barrier engine's steps run back to back, as the firmware's `advance` loop runs them; the host
//! posting consecutive sends) is chained directly; a hand-over to another server (the host's token
//! reaching the NIC, a message reaching host memory, a packet reaching another node) is an event
//! at the instant it happens, so the other server sees it in order with everything else it serves.
//!
//! Per rank the engine keeps four times, an index and a few flags (40 bytes), plus a shared set
//! of packets that arrived before their step was reached. Nothing is cloned per event.

use core::cmp::Ordering;
use core::fmt;
use std::collections::{BinaryHeap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use super::params::CostParams;
use super::schedules::{ModelStep, ScheduleSource, StepKind};

/// Who runs the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// The NIC interprets the steps; the host posts one token and takes one notice (equation 2).
    Nic,
    /// The host runs the steps over ordinary messages (equation 1).
    Host,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Nic => "NIC-based",
            Self::Host => "host-based",
        })
    }
}

/// What one simulated barrier did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    /// When the last rank left the barrier, µs after all entered it.
    pub latency: f64,
    /// The mean over ranks of when they left, µs.
    pub mean_completion: f64,
    /// The rank that left last (the lowest, if several).
    pub last_rank: usize,
    /// Barrier packets put on the wire.
    pub packets: u64,
    /// Events the engine handled.
    pub events: u64,
    /// The most events ever pending at once.
    pub peak_pending: usize,
}

/// A packet put on the wire, for cross-checks against the real firmware.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Transmission {
    /// Sending rank.
    pub from: u32,
    /// Receiving rank.
    pub to: u32,
    /// The round it carries.
    pub round: u8,
    /// When its transmission started, µs.
    pub at: f64,
}

/// Why a simulation did not finish.
#[derive(Clone, Debug, PartialEq)]
pub enum SimulationError {
    /// A cost is negative or not finite.
    BadParams(String),
    /// No events are left but a rank still waits: the schedules do not pair up.
    Stuck {
        /// The first rank still waiting.
        rank: usize,
        /// Its step index.
        index: usize,
        /// The step it waits at.
        step: ModelStep,
        /// Ranks that did not finish.
        unfinished: usize,
    },
}

impl fmt::Display for SimulationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::BadParams(reason) => write!(f, "bad costs: {reason}"),
            Self::Stuck {
                rank,
                index,
                step,
                unfinished,
            } => write!(
                f,
                "no events left, {unfinished} ranks unfinished; rank {rank} waits at step {index} ({step:?})"
            ),
        }
    }
}

impl std::error::Error for SimulationError {}

/// Runs one barrier of `schedules` in `mode` with `params`, every rank entering at time 0.
///
/// # Errors
/// [`SimulationError`] if the costs are invalid or the schedules leave a rank waiting forever.
pub fn simulate<S: ScheduleSource + ?Sized>(
    schedules: &S,
    params: &CostParams,
    mode: Mode,
) -> Result<Outcome, SimulationError> {
    Engine::new(schedules, params, mode, false)?.run()
}

/// As [`simulate`], for a reduction: every receiving step that
/// [`ScheduleSource::combines`] costs `combine` µs more on the processor that runs the schedule
/// (the NIC's, NIC-based; the host's, host-based), once its packet is taken.
///
/// # Errors
/// As [`simulate`], and [`SimulationError::BadParams`] if `combine` is negative or not finite.
pub fn simulate_combining<S: ScheduleSource + ?Sized>(
    schedules: &S,
    params: &CostParams,
    mode: Mode,
    combine: f64,
) -> Result<Outcome, SimulationError> {
    if !combine.is_finite() || combine < 0.0 {
        return Err(SimulationError::BadParams(format!(
            "the combine cost is {combine}"
        )));
    }
    let mut engine = Engine::new(schedules, params, mode, false)?;
    engine.combine = combine;
    engine.run()
}

/// As [`simulate`], and also returns every packet put on the wire, in the order transmitted.
///
/// # Errors
/// As [`simulate`].
pub fn simulate_traced<S: ScheduleSource + ?Sized>(
    schedules: &S,
    params: &CostParams,
    mode: Mode,
) -> Result<(Outcome, Vec<Transmission>), SimulationError> {
    let mut engine = Engine::new(schedules, params, mode, true)?;
    let outcome = engine.run()?;
    Ok((outcome, engine.trace.unwrap_or_default()))
}

/// What an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventKind {
    /// NIC-based: the barrier token reaches the NIC of `rank`.
    TokenAtNic,
    /// A packet from `peer` reaches the NIC of `rank`.
    PacketAtNic,
    /// Host-based: a send token of `rank` for `peer` reaches its NIC.
    SendAtNic,
    /// Host-based: `peer`'s message is in `rank`'s host memory; the host takes it (HRecv) as
    /// soon as it is free.
    MessageAtHost,
}

#[derive(Clone, Copy, Debug)]
struct Event {
    /// The event's time as `f64` bits: times are finite and `>= 0` (costs are checked and only
    /// ever added), and for those the bits order as the values do, so the heap compares integers.
    at_bits: u64,
    /// Which event was scheduled first, for ties. One run schedules fewer than
    /// `MAX_NODES · MAX_SCHEDULE_STEPS · 3` (about 25 million) events, well within `u32`.
    order: u32,
    rank: u32,
    peer: u32,
    round: u8,
    kind: EventKind,
}

impl Event {
    fn at(&self) -> f64 {
        f64::from_bits(self.at_bits)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so that the max-heap pops the earliest event; ties go first-scheduled first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at_bits
            .cmp(&self.at_bits)
            .then(other.order.cmp(&self.order))
    }
}

const STARTED: u8 = 1;
const WAITING: u8 = 2;
const SENT_CURRENT: u8 = 4;
const DONE: u8 = 8;

/// One rank: its three servers' free times, when it left, where it is in its schedule.
#[derive(Clone, Copy, Debug, Default)]
struct RankState {
    host_free: f64,
    nic_free: f64,
    transmit_free: f64,
    done_at: f64,
    index: u32,
    flags: u8,
}

/// splitmix64's finalizer over the u64 keys of the arrival set (SipHash would cost more than the
/// rest of an event).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(self.0 ^ u64::from(*byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        // SplitMix64's first output from state `value` is its finalizer over `value` plus the
        // golden-ratio increment.
        self.0 = SplitMix64::seed_from_u64(value).next_u64();
    }
}

/// A packet that arrived (at the NIC, NIC-based; in host memory, host-based) before its step.
fn arrival_key(rank: u32, peer: u32, round: u8) -> u64 {
    (u64::from(rank) << 40) | (u64::from(peer) << 8) | u64::from(round)
}

/// The NIC processor's share of the NIC costs that include DMA or packet-interface time.
#[derive(Clone, Copy, Debug)]
struct Busy {
    recv: f64,
    sdma: f64,
    rdma: f64,
}

struct Engine<'a, S: ?Sized> {
    schedules: &'a S,
    params: CostParams,
    busy: Busy,
    mode: Mode,
    /// A reduction's cost per combining step (0 for a barrier).
    combine: f64,
    ranks: Vec<RankState>,
    heap: BinaryHeap<Event>,
    order: u32,
    arrived: HashSet<u64, BuildHasherDefault<KeyHasher>>,
    packets: u64,
    events: u64,
    peak_pending: usize,
    trace: Option<Vec<Transmission>>,
}

impl<'a, S: ScheduleSource + ?Sized> Engine<'a, S> {
    fn new(
        schedules: &'a S,
        params: &CostParams,
        mode: Mode,
        traced: bool,
    ) -> Result<Self, SimulationError> {
        params.check().map_err(SimulationError::BadParams)?;
        let count = schedules.ranks();
        Ok(Self {
            schedules,
            params: *params,
            busy: Busy {
                recv: params.recv * params.busy_share,
                sdma: params.sdma * params.busy_share,
                rdma: params.rdma * params.busy_share,
            },
            mode,
            combine: 0.0,
            ranks: vec![RankState::default(); count],
            heap: BinaryHeap::with_capacity(count * 2),
            order: 0,
            arrived: HashSet::default(),
            packets: 0,
            events: 0,
            peak_pending: 0,
            trace: traced.then(Vec::new),
        })
    }

    fn schedule(&mut self, at: f64, kind: EventKind, rank: u32, peer: u32, round: u8) {
        self.order = self.order.wrapping_add(1);
        self.heap.push(Event {
            at_bits: at.to_bits(),
            order: self.order,
            rank,
            peer,
            round,
            kind,
        });
        self.peak_pending = self.peak_pending.max(self.heap.len());
    }

    fn run(&mut self) -> Result<Outcome, SimulationError> {
        for rank in 0..self.ranks.len() {
            match self.mode {
                Mode::Nic => {
                    // paper §5.2: the host posts one barrier send token.
                    let posted = self.params.send;
                    self.ranks[rank].host_free = posted;
                    self.schedule(posted, EventKind::TokenAtNic, rank as u32, 0, 0);
                }
                Mode::Host => self.run_host(rank, 0.0),
            }
        }
        while let Some(event) = self.heap.pop() {
            self.events += 1;
            let rank = event.rank as usize;
            match event.kind {
                EventKind::TokenAtNic => {
                    let state = &mut self.ranks[rank];
                    state.flags |= STARTED;
                    let start = event.at().max(state.nic_free);
                    self.run_nic(rank, start);
                }
                EventKind::PacketAtNic => self.packet_at_nic(event),
                EventKind::SendAtNic => {
                    // The processor takes the token and starts the DMA; the DMA finishes after.
                    let start = event.at().max(self.ranks[rank].nic_free);
                    self.ranks[rank].nic_free = start + self.busy.sdma;
                    self.transmit(rank, event.peer, event.round, start + self.params.sdma);
                }
                EventKind::MessageAtHost => {
                    // The host takes messages as they come (it polls its receive queue, as a GM
                    // program polls `gm_receive`), not in the order its schedule names them.
                    let state = &mut self.ranks[rank];
                    let handled = event.at().max(state.host_free) + self.params.hrecv;
                    state.host_free = handled;
                    self.arrived
                        .insert(arrival_key(event.rank, event.peer, event.round));
                    if self.is_waiting_for(rank, event.peer, event.round) {
                        self.ranks[rank].flags &= !WAITING;
                        self.run_host(rank, handled);
                    }
                }
            }
        }
        self.outcome()
    }

    /// Whether `rank` is stopped at a receiving step for `(peer, round)`.
    fn is_waiting_for(&self, rank: usize, peer: u32, round: u8) -> bool {
        let state = &self.ranks[rank];
        if state.flags & WAITING == 0 {
            return false;
        }
        let step = self.schedules.step(rank, state.index as usize);
        step.peer == peer && step.round == round
    }

    fn packet_at_nic(&mut self, event: Event) {
        let rank = event.rank as usize;
        let state = &mut self.ranks[rank];
        match self.mode {
            Mode::Nic => {
                // Taken off the wire and recorded (or matched) whether or not the barrier
                // started: the unexpected-barrier record of paper §3.1.
                let received = event.at().max(state.nic_free) + self.busy.recv;
                state.nic_free = received;
                self.arrived
                    .insert(arrival_key(event.rank, event.peer, event.round));
                if self.is_waiting_for(rank, event.peer, event.round) {
                    self.ranks[rank].flags &= !WAITING;
                    self.run_nic(rank, received);
                }
            }
            Mode::Host => {
                // RECV, then RDMA into a host buffer the host provided in advance; the DMA's own
                // share runs after the processor's.
                let start = event.at().max(state.nic_free);
                let recv_busy = self.busy.recv;
                state.nic_free = start + recv_busy + self.busy.rdma;
                let delivered = start + recv_busy + self.params.rdma;
                self.schedule(
                    delivered,
                    EventKind::MessageAtHost,
                    event.rank,
                    event.peer,
                    event.round,
                );
            }
        }
    }

    /// Puts a packet on `rank`'s transmit channel once it is free, no earlier than `ready`.
    fn transmit(&mut self, rank: usize, to: u32, round: u8, ready: f64) {
        let state = &mut self.ranks[rank];
        let start = ready.max(state.transmit_free);
        state.transmit_free = start + self.params.xmit;
        self.packets += 1;
        if let Some(trace) = &mut self.trace {
            trace.push(Transmission {
                from: rank as u32,
                to,
                round,
                at: start,
            });
        }
        // The packet reaches the NIC processor after the wire and the packet interface's share of
        // Recv.
        let hardware = self.params.recv - self.busy.recv;
        self.schedule(
            start + self.params.network + hardware,
            EventKind::PacketAtNic,
            to,
            rank as u32,
            round,
        );
    }

    /// Takes the receiving half of `step` if its packet is there.
    fn take_arrived(&mut self, rank: usize, step: ModelStep) -> bool {
        self.arrived
            .remove(&arrival_key(rank as u32, step.peer, step.round))
    }

    /// What taking step `index` of `rank` costs on top: a reduction's combine, if it combines.
    fn combine_cost(&self, rank: usize, index: usize) -> f64 {
        if self.combine > 0.0 && self.schedules.combines(rank, index) {
            self.combine
        } else {
            0.0
        }
    }

    /// NIC-based: the barrier engine runs from `now` as far as the record lets it, back to back
    /// on the NIC processor.
    fn run_nic(&mut self, rank: usize, now: f64) {
        let mut now = now;
        loop {
            let state = self.ranks[rank];
            let index = state.index as usize;
            if index == self.schedules.steps(rank) {
                // firmware `finish_barrier`: the completion event goes up by RDMA; the host sees
                // it after HRecv.
                let notified = now + self.params.rdma;
                let left = notified.max(state.host_free) + self.params.hrecv;
                let state = &mut self.ranks[rank];
                state.nic_free = now + self.busy.rdma;
                state.host_free = left;
                state.done_at = left;
                state.flags |= DONE;
                return;
            }
            let step = self.schedules.step(rank, index);
            if step.sends() && state.flags & SENT_CURRENT == 0 {
                now += self.params.step;
                self.transmit(rank, step.peer, step.round, now);
                if step.kind == StepKind::Send {
                    self.ranks[rank].index += 1;
                    continue;
                }
                self.ranks[rank].flags |= SENT_CURRENT;
            }
            if self.take_arrived(rank, step) {
                now += self.combine_cost(rank, index);
                let state = &mut self.ranks[rank];
                state.index += 1;
                state.flags &= !SENT_CURRENT;
                continue;
            }
            let state = &mut self.ranks[rank];
            state.flags |= WAITING;
            state.nic_free = now;
            return;
        }
    }

    /// Host-based: the host runs its steps from `now` (once it is free) as far as its messages
    /// let it.
    fn run_host(&mut self, rank: usize, now: f64) {
        let mut now = now.max(self.ranks[rank].host_free);
        loop {
            let state = self.ranks[rank];
            let index = state.index as usize;
            if index == self.schedules.steps(rank) {
                let state = &mut self.ranks[rank];
                state.host_free = now;
                state.done_at = now;
                state.flags |= DONE;
                return;
            }
            let step = self.schedules.step(rank, index);
            if step.sends() && state.flags & SENT_CURRENT == 0 {
                // The host posts the send token and goes on; the NIC takes it from there.
                now += self.params.send;
                self.schedule(
                    now,
                    EventKind::SendAtNic,
                    rank as u32,
                    step.peer,
                    step.round,
                );
                if step.kind == StepKind::Send {
                    self.ranks[rank].index += 1;
                    continue;
                }
                self.ranks[rank].flags |= SENT_CURRENT;
            }
            if self.take_arrived(rank, step) {
                // Already taken (and HRecv paid) when it reached host memory; a reduction
                // combines it now.
                now += self.combine_cost(rank, index);
                let state = &mut self.ranks[rank];
                state.index += 1;
                state.flags &= !SENT_CURRENT;
                continue;
            }
            let state = &mut self.ranks[rank];
            state.flags |= WAITING;
            state.host_free = now;
            return;
        }
    }

    fn outcome(&self) -> Result<Outcome, SimulationError> {
        let unfinished = self
            .ranks
            .iter()
            .filter(|state| state.flags & DONE == 0)
            .count();
        if let Some(rank) = self.ranks.iter().position(|state| state.flags & DONE == 0) {
            let index = self.ranks[rank].index as usize;
            return Err(SimulationError::Stuck {
                rank,
                index,
                step: self.schedules.step(rank, index),
                unfinished,
            });
        }
        let (mut latency, mut last_rank, mut sum) = (0.0f64, 0, 0.0f64);
        for (rank, state) in self.ranks.iter().enumerate() {
            sum += state.done_at;
            if state.done_at > latency {
                latency = state.done_at;
                last_rank = rank;
            }
        }
        Ok(Outcome {
            latency,
            mean_completion: sum / self.ranks.len().max(1) as f64,
            last_rank,
            packets: self.packets,
            events: self.events,
            peak_pending: self.peak_pending,
        })
    }
}
