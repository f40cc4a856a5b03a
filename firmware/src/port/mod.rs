//! The NIC's per-port state (paper §4.1: "the NIC has a data structure for each local port").
//!
//! `Ports` is the table of slots. A slot outlives its port's opens and closes: the last
//! generation handed out, and the bytes of the port's latest broadcasts (`broadcast_bytes`).
//! An open port (`OpenPort`) holds its rings, the tokens it took, its registered memory
//! ([`crate::memory`]), its running barriers and the barrier packets it waits to send again
//! (`barrier_run`). The engines drive this state; nothing here names an engine.

use heapless::{Deque, Vec};
use shared_abi::event::{Event, Status};
use shared_abi::ids::{BarrierId, Generation, PORTS_PER_NIC};
use shared_abi::region::RegionLayout;
use shared_abi::ring::{Consumer, Producer};
use shared_abi::token::{ReceiveToken, SendToken};

mod barrier_run;
mod broadcast_bytes;
mod reduce_values;

pub use barrier_run::BarrierProgress;
pub(crate) use barrier_run::{BarrierRun, KeptSchedule, RETRIES, Reduction, Retry};
pub(crate) use broadcast_bytes::{Broadcast, BroadcastBytes};
pub(crate) use reduce_values::{REDUCE_VALUES, ReduceValue, ReduceValues, ValueKey};

use crate::time::Instant;

/// Send tokens one port may have inside the NIC at once. Tokens beyond it stay in the send ring
/// until one completes (back-pressure, never loss).
pub const SEND_TOKENS: usize = 32;
/// Receive buffers one port may have provided at once; further receive tokens wait in the ring.
pub const RECEIVE_BUFFERS: usize = 64;
/// Barrier completion tokens one port may have provided at once: one per barrier it may run.
pub const BARRIER_BUFFERS: u8 = RUNNING_BARRIERS as u8;
/// Barriers one port may run at once, each with its own identity (job, group, sequence), state
/// and completion buffer (paper §3.4's concurrent barriers, per port): a process's non-blocking
/// barriers of different groups complete in whatever order their members start them.
pub const RUNNING_BARRIERS: usize = shared_abi::schedule::RUNNING_BARRIERS;
/// Events held for a port whose event ring is full. Every held token produces exactly one event,
/// and a token is taken only while this has room for it, so no event is ever dropped.
pub(crate) const PENDING_EVENTS: usize =
    SEND_TOKENS + RECEIVE_BUFFERS + BARRIER_BUFFERS as usize + 4;

/// A send token the NIC holds until its message is acknowledged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeldSend {
    pub(crate) token: SendToken,
    /// Region offset of the payload, checked against the arena when the token was taken.
    pub(crate) payload_offset: usize,
    /// When the receiver first refused the message for want of a buffer (the receiver-not-ready
    /// clock, which survives the message being parked and sequenced again).
    pub(crate) refused_since: Option<Instant>,
    /// A message longer than a packet: its number (a segment built after the message ended finds
    /// another number, or none, and goes as a cancelled slot), and how many of its segments are
    /// queued on the connection so far. Zero for everything else.
    pub(crate) serial: u32,
    pub(crate) queued_segments: u32,
    /// Data bytes of each of a long message's segments but the last:
    /// [`shared_abi::packet::DATA_SEGMENT`], or [`shared_abi::packet::LOCAL_DATA_SEGMENT`]
    /// toward a NIC the board gathers for ([`crate::Hal::gathers_toward`]).
    pub(crate) segment_len: u32,
}

impl HeldSend {
    /// A held send of anything but a long message.
    pub(crate) fn new(token: SendToken, payload_offset: usize) -> Self {
        Self {
            token,
            payload_offset,
            refused_since: None,
            serial: 0,
            queued_segments: 0,
            segment_len: shared_abi::packet::DATA_SEGMENT as u32,
        }
    }

    /// Segments of a data message longer than one packet; 0 for everything else.
    pub(crate) fn segments(&self) -> u32 {
        let length = self.token.length.get() as usize;
        if self.token.kind != shared_abi::token::SendKind::DATA || length <= shared_abi::MTU_PAYLOAD
        {
            return 0;
        }
        length.div_ceil(self.segment_len.max(1) as usize) as u32
    }

    /// Whether this is a long message not yet wholly queued.
    pub(crate) fn is_feeding(&self) -> bool {
        self.queued_segments < self.segments()
    }
}

/// What to do with a token read from the port's send ring (SDMA's answer, and the one-sided
/// engine's for its tokens).
pub(crate) enum Disposition {
    /// Refuse it with this status (its event returns it to the host).
    Reject(Status),
    /// Not now: leave it in the ring (no room for it yet).
    Wait,
    /// Taken.
    Taken,
}

/// The state of a one-sided operation held in a send slot (its token is beside it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Operation {
    /// Its number, echoed by the target: a late answer never completes a newer operation of the
    /// slot.
    pub(crate) serial: u32,
    /// Packets it sends (a put's segments; 1 for a get or an atomic).
    pub(crate) segments: u32,
    /// Data bytes of each of a put's segments but the last: [`shared_abi::rdma::RDMA_SEGMENT`],
    /// or [`shared_abi::rdma::LOCAL_RDMA_SEGMENT`] toward a NIC the board gathers for
    /// ([`crate::Hal::gathers_toward`]).
    pub(crate) segment_len: u32,
    /// Packets queued on the connection so far.
    pub(crate) queued: u32,
    /// When it last made progress; it fails with `SEND_TIMED_OUT` after the give-up time plus
    /// the receiver-not-ready time without any.
    pub(crate) last_activity: Instant,
}

/// An open port.
#[derive(Debug)]
pub(crate) struct OpenPort {
    pub(crate) generation: Generation,
    pub(crate) layout: RegionLayout,
    pub(crate) send_ring: Consumer<SendToken>,
    pub(crate) receive_ring: Consumer<ReceiveToken>,
    pub(crate) event_ring: Producer<Event>,
    /// The send tokens held, by slot. Only [`OpenPort::hold`] and [`OpenPort::release`] fill and
    /// empty a slot, so that `held` always names the full ones.
    sends: [Option<HeldSend>; SEND_TOKENS],
    /// The slots of `sends` that hold a token (bit per slot): what the engines walk, and what
    /// counts the tokens, instead of scanning every slot on every poll.
    held: SlotSet,
    pub(crate) receive_buffers: Vec<ReceiveToken, RECEIVE_BUFFERS>,
    pub(crate) barrier_buffers: u8,
    pub(crate) pending_events: Deque<Event, PENDING_EVENTS>,
    /// The running barriers, by slot: each the paper's "send token pointer" in the port structure
    /// (§4.2). Only [`OpenPort::start_run`] fills a slot and [`OpenPort::take_run`] empties it.
    runs: [Option<BarrierRun>; RUNNING_BARRIERS],
    /// The slots of `runs` that hold a barrier: each poll's timer scan tests these bits rather
    /// than every slot of every port (a slot is far bigger than a cache line).
    running: SlotSet,
    /// The schedules the process asked the NIC to keep, by slot; they end with the port.
    pub(crate) kept: [KeptSchedule; shared_abi::token::KEPT_SCHEDULES],
    /// Barrier packets refused by a closed target port, to send again (they outlive the barrier
    /// that sent them).
    pub(crate) barrier_retries: heapless::Vec<Retry, RETRIES>,
    /// Set when the host broke its event ring: the port stops until it is closed.
    pub(crate) faulted: Option<Status>,
    /// Set by an orderly close ([`crate::Nic::begin_close`]): the port finishes what its process
    /// posted, writes no more events, and closes when done or at this deadline.
    pub(crate) closing: Option<Instant>,
    /// The job of the port's latest barrier (0: none named yet); kept by the slot when the port
    /// closes, so that a late peer of that job learns the port is gone for good.
    pub(crate) job: u32,
    /// The process memory the port registered ([`crate::memory`]).
    pub(crate) memory: crate::memory::MemoryRegions,
    /// The one-sided operation held in each send slot, beside its token in `sends`. Only
    /// [`OpenPort::start_operation`] and [`OpenPort::end_operation`] fill and empty a slot.
    operations: [Option<Operation>; SEND_TOKENS],
    /// The slots of `operations` that hold one (bit per slot).
    operating: SlotSet,
    /// Receive buffers of this port that long messages arriving are filling (in connections'
    /// assemblies): each still owes its event.
    pub(crate) assembling: u8,
}

impl OpenPort {
    pub(crate) fn new(generation: Generation, layout: RegionLayout) -> Self {
        Self {
            generation,
            layout,
            send_ring: Consumer::new(layout.send_ring, 0),
            receive_ring: Consumer::new(layout.receive_ring, 0),
            event_ring: Producer::new(layout.event_ring, 0),
            sends: [None; SEND_TOKENS],
            held: SlotSet::EMPTY,
            receive_buffers: Vec::new(),
            barrier_buffers: 0,
            pending_events: Deque::new(),
            runs: [const { None }; RUNNING_BARRIERS],
            running: SlotSet::EMPTY,
            kept: Default::default(),
            barrier_retries: heapless::Vec::new(),
            faulted: None,
            closing: None,
            job: 0,
            memory: Default::default(),
            operations: [None; SEND_TOKENS],
            operating: SlotSet::EMPTY,
            assembling: 0,
        }
    }

    /// The running barriers, in slot order.
    pub(crate) fn runs(&self) -> impl Iterator<Item = &BarrierRun> {
        self.running.iter().filter_map(|slot| self.run(slot))
    }

    /// The slots that run a barrier, in slot order.
    pub(crate) fn running_slots(&self) -> SlotSet {
        self.running
    }

    /// How many barriers run.
    pub(crate) fn running_count(&self) -> usize {
        self.running.len()
    }

    /// The running barrier in `slot`, if any.
    pub(crate) fn run(&self, slot: usize) -> Option<&BarrierRun> {
        self.runs.get(slot)?.as_ref()
    }

    /// The running barrier in `slot`, mutably.
    pub(crate) fn run_mut(&mut self, slot: usize) -> Option<&mut BarrierRun> {
        self.runs.get_mut(slot)?.as_mut()
    }

    /// The slot of the running barrier `barrier`, if it runs.
    pub(crate) fn run_slot(&self, barrier: BarrierId) -> Option<usize> {
        self.runs
            .iter()
            .position(|run| run.as_ref().is_some_and(|run| run.barrier == barrier))
    }

    /// The running barrier `barrier`, if it runs.
    pub(crate) fn running(&self, barrier: BarrierId) -> Option<&BarrierRun> {
        self.runs().find(|run| run.barrier == barrier)
    }

    /// Starts `run` in a free slot and returns the slot; `None` (and `run` is dropped) if every
    /// slot runs a barrier.
    pub(crate) fn start_run(&mut self, run: BarrierRun) -> Option<usize> {
        let slot = self.runs.iter().position(Option::is_none)?;
        *self.runs.get_mut(slot)? = Some(run);
        self.running.insert(slot);
        Some(slot)
    }

    /// Ends the barrier in `slot`, returning it.
    pub(crate) fn take_run(&mut self, slot: usize) -> Option<BarrierRun> {
        self.running.remove(slot);
        self.runs.get_mut(slot)?.take()
    }

    /// How many send tokens the port holds.
    pub(crate) fn held_sends(&self) -> usize {
        self.held.len()
    }

    /// The send token held in `slot`, if any.
    pub(crate) fn held_send(&self, slot: usize) -> Option<&HeldSend> {
        self.sends.get(slot)?.as_ref()
    }

    /// The send token held in `slot`, mutably (to follow its progress; [`OpenPort::release`]
    /// empties the slot).
    pub(crate) fn held_send_mut(&mut self, slot: usize) -> Option<&mut HeldSend> {
        self.sends.get_mut(slot)?.as_mut()
    }

    /// The slots that hold a send token.
    pub(crate) fn held_slots(&self) -> SlotSet {
        self.held
    }

    /// The held send tokens with their slots, in slot order.
    pub(crate) fn held_sends_by_slot(&self) -> impl Iterator<Item = (usize, &HeldSend)> {
        self.held
            .iter()
            .filter_map(|slot| Some((slot, self.held_send(slot)?)))
    }

    /// Holds `held` in `slot` (a free one, from [`OpenPort::free_send_slot`]).
    pub(crate) fn hold(&mut self, slot: usize, held: HeldSend) {
        if let Some(entry) = self.sends.get_mut(slot) {
            *entry = Some(held);
            self.held.insert(slot);
        }
    }

    /// Empties `slot`, returning the token it held.
    pub(crate) fn release(&mut self, slot: usize) -> Option<HeldSend> {
        self.held.remove(slot);
        self.sends.get_mut(slot)?.take()
    }

    /// The one-sided operation held in `slot`, if any.
    pub(crate) fn operation(&self, slot: usize) -> Option<&Operation> {
        self.operations.get(slot)?.as_ref()
    }

    /// The one-sided operation held in `slot`, mutably.
    pub(crate) fn operation_mut(&mut self, slot: usize) -> Option<&mut Operation> {
        self.operations.get_mut(slot)?.as_mut()
    }

    /// The slots that hold a one-sided operation.
    pub(crate) fn operation_slots(&self) -> SlotSet {
        self.operating
    }

    /// The one-sided operations held, with their slots, in slot order.
    pub(crate) fn operations_by_slot(&self) -> impl Iterator<Item = (usize, &Operation)> {
        self.operating
            .iter()
            .filter_map(|slot| Some((slot, self.operation(slot)?)))
    }

    /// Records `operation` as held in `slot` (beside its token).
    pub(crate) fn start_operation(&mut self, slot: usize, operation: Operation) {
        if let Some(entry) = self.operations.get_mut(slot) {
            *entry = Some(operation);
            self.operating.insert(slot);
        }
    }

    /// Forgets the operation held in `slot`, if any.
    pub(crate) fn end_operation(&mut self, slot: usize) {
        self.operating.remove(slot);
        if let Some(entry) = self.operations.get_mut(slot) {
            *entry = None;
        }
    }

    /// Events already promised: one per held token, one per running barrier, plus those pending.
    fn promised_events(&self) -> usize {
        self.pending_events.len()
            + self.held_sends()
            + self.receive_buffers.len()
            + usize::from(self.assembling)
            + usize::from(self.barrier_buffers)
    }

    /// Whether the port may take one more token (its event is guaranteed room).
    pub(crate) fn can_take_token(&self) -> bool {
        self.faulted.is_none() && self.promised_events() < PENDING_EVENTS
    }

    /// Takes the receive buffer at `position` out of the provided ones (the last one takes its
    /// place, as `swap_remove` does, without a panic path for a position out of range).
    pub(crate) fn take_receive_buffer(&mut self, position: usize) -> Option<ReceiveToken> {
        if position >= self.receive_buffers.len() {
            return None;
        }
        let last = self.receive_buffers.pop()?;
        match self.receive_buffers.get_mut(position) {
            Some(slot) => Some(core::mem::replace(slot, last)),
            None => Some(last),
        }
    }

    /// Whether the slot sets name exactly the full slots, send and barrier (checked by the tests
    /// after each poll).
    #[cfg(test)]
    pub(crate) fn slot_sets_agree(&self) -> bool {
        (0..SEND_TOKENS).all(|slot| {
            let held = self.held.0 & (1 << slot) != 0;
            let operating = self.operating.0 & (1 << slot) != 0;
            held == self.sends[slot].is_some() && operating == self.operations[slot].is_some()
        }) && (0..RUNNING_BARRIERS)
            .all(|slot| (self.running.0 & (1 << slot) != 0) == self.runs[slot].is_some())
    }

    pub(crate) fn free_send_slot(&self) -> Option<usize> {
        self.held.first_free()
    }
}

/// A set of the slots of a table of `BOUND` (send slots by default, barrier slots, the places of
/// a port's reduction values), a bit per slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotSet<const BOUND: usize = SEND_TOKENS>(u32);

// The barrier slots are numbered within the send slots' bound.
const _: () = assert!(RUNNING_BARRIERS <= SEND_TOKENS);

impl<const BOUND: usize> SlotSet<BOUND> {
    /// The empty set; a slot is a bit of the word, so the bound is the word's width at most.
    pub(crate) const EMPTY: Self = {
        assert!(BOUND <= u32::BITS as usize);
        Self(0)
    };

    pub(crate) fn insert(&mut self, slot: usize) {
        if slot < BOUND {
            self.0 |= 1 << slot;
        }
    }

    pub(crate) fn remove(&mut self, slot: usize) {
        if slot < BOUND {
            self.0 &= !(1 << slot);
        }
    }

    fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub(crate) fn first_free(self) -> Option<usize> {
        let slot = (!self.0).trailing_zeros() as usize;
        (slot < BOUND).then_some(slot)
    }

    /// The slots in the set, lowest first.
    pub(crate) fn iter(self) -> impl Iterator<Item = usize> {
        let mut bits = self.0;
        core::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let slot = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            Some(slot)
        })
    }
}

/// The port table: a slot per port of the NIC, indexed by port number. A method of the table (not
/// of [`crate::Nic`]) so that an engine may hold a port while it borrows the NIC's other parts
/// (the board's memory, the connections).
#[derive(Debug, Default)]
pub(crate) struct Ports([PortSlot; PORTS_PER_NIC]);

impl Ports {
    /// The slot of `port`, open or not; `None` past the last port.
    pub(crate) fn slot(&self, port: usize) -> Option<&PortSlot> {
        self.0.get(port)
    }

    /// The slot of `port`, mutably.
    pub(crate) fn slot_mut(&mut self, port: usize) -> Option<&mut PortSlot> {
        self.0.get_mut(port)
    }

    /// `port`'s state if it is open.
    pub(crate) fn open(&self, port: usize) -> Option<&OpenPort> {
        self.0.get(port)?.open.as_ref()
    }

    /// `port`'s state if it is open, mutably.
    pub(crate) fn open_mut(&mut self, port: usize) -> Option<&mut OpenPort> {
        self.0.get_mut(port)?.open.as_mut()
    }

    /// Every open port's state, in port order.
    pub(crate) fn open_ports(&self) -> impl Iterator<Item = &OpenPort> {
        self.0.iter().filter_map(|slot| slot.open.as_ref())
    }
}

/// A slot of the port table.
#[derive(Debug, Default)]
pub(crate) struct PortSlot {
    pub(crate) open: Option<OpenPort>,
    /// The last generation handed out for this port; the next open takes the one after.
    pub(crate) last_generation: u32,
    /// The job whose barriers the port's last owner ran before it closed (0: none): barrier
    /// packets of that job for the closed port are refused as gone for good, not "not open yet"
    /// (paper §3.2's wait for a late opener still holds for every other job).
    pub(crate) gone_job: u32,
    /// The bytes of the port's latest broadcasts: they outlive the barrier and the port's close,
    /// as its packets do.
    pub(crate) broadcasts: BroadcastBytes,
    /// The values of the port's reductions: those it sent (as long as its packets need them)
    /// and those that arrived (until a step takes them).
    pub(crate) reduce_values: ReduceValues,
}
