//! A simulated host process on one port: it posts send, receive and barrier tokens into the
//! port's rings and reads events back, through the same ring layout the real host library uses.

use shared_abi::event::Event;
use shared_abi::region::RegionLayout;
use shared_abi::ring::raw::RawMemory;
use shared_abi::ring::{Consumer, Producer, RingError, SharedMemory};
use shared_abi::schedule::Step;
use shared_abi::token::{ReceiveToken, SendToken};
use zerocopy::IntoBytes;

/// Ring sizes and arena of a simulated port.
pub const SEND_RING: u32 = 32;
/// Receive ring slots.
pub const RECEIVE_RING: u32 = 64;
/// Event ring slots.
pub const EVENT_RING: u32 = 128;
/// Size class of every simulated message buffer (248-byte messages at most).
pub const SIZE_CLASS: u8 = 8;
/// Bytes of one arena slot.
pub const SLOT: usize = 256;
/// Arena slots: one per send token, one per receive buffer, and room for a schedule.
pub const SLOTS: usize = (SEND_RING + RECEIVE_RING) as usize + 8;

/// The layout every simulated port uses.
pub fn layout() -> RegionLayout {
    RegionLayout::standard(SEND_RING, RECEIVE_RING, EVENT_RING, SLOTS * SLOT)
}

/// The rings of one port, as the host side holds them.
pub struct HostRings {
    send: Producer<SendToken>,
    receive: Producer<ReceiveToken>,
    events: Consumer<Event>,
    layout: RegionLayout,
    /// Send tokens the host holds (GM's token accounting: a SENT event returns one).
    pub send_tokens: u32,
    /// Free arena slots for send buffers.
    pub free_send_slots: Vec<usize>,
    /// Free arena slots for receive buffers.
    pub free_receive_slots: Vec<usize>,
}

impl HostRings {
    /// Fresh rings over a fresh region.
    pub fn new() -> Self {
        let layout = layout();
        Self {
            send: Producer::new(layout.send_ring, 0),
            receive: Producer::new(layout.receive_ring, 0),
            events: Consumer::new(layout.event_ring, 0),
            layout,
            send_tokens: SEND_RING,
            free_send_slots: (0..SEND_RING as usize).collect(),
            free_receive_slots: (SEND_RING as usize..(SEND_RING + RECEIVE_RING) as usize).collect(),
        }
    }

    /// Arena offset of slot `slot`.
    pub fn slot_offset(slot: usize) -> u64 {
        (slot * SLOT) as u64
    }

    /// The arena slot an arena offset names.
    pub fn slot_of(offset: u64) -> usize {
        offset as usize / SLOT
    }

    /// Writes `bytes` into the arena at `offset`.
    pub fn write_arena(&self, memory: &RawMemory, offset: u64, bytes: &[u8]) -> bool {
        self.layout
            .arena_range(offset, bytes.len())
            .is_some_and(|at| memory.write(at, bytes).is_ok())
    }

    /// Reads `out.len()` bytes of the arena at `offset`.
    pub fn read_arena(&self, memory: &RawMemory, offset: u64, out: &mut [u8]) -> bool {
        self.layout
            .arena_range(offset, out.len())
            .is_some_and(|at| memory.read(at, out).is_ok())
    }

    /// Posts a send token (using one of the host's tokens).
    pub fn post_send(&mut self, memory: &RawMemory, token: &SendToken) -> Result<(), RingError> {
        self.send.push(memory, token)?;
        self.send_tokens -= 1;
        Ok(())
    }

    /// Posts a receive token.
    pub fn post_receive(
        &mut self,
        memory: &RawMemory,
        token: &ReceiveToken,
    ) -> Result<(), RingError> {
        self.receive.push(memory, token)
    }

    /// Writes a barrier schedule into the arena's schedule area and returns its offset.
    pub fn write_schedule(&self, memory: &RawMemory, steps: &[Step]) -> Option<u64> {
        let offset = Self::slot_offset((SEND_RING + RECEIVE_RING) as usize);
        self.write_arena(memory, offset, steps.as_bytes())
            .then_some(offset)
    }

    /// Takes the next event, if any.
    pub fn next_event(&mut self, memory: &RawMemory) -> Result<Option<Event>, RingError> {
        self.events.pop(memory)
    }

    /// Writes raw bytes over the send ring's next slot and publishes it, as a buggy or hostile
    /// process could.
    pub fn post_garbage(&mut self, memory: &RawMemory, bytes: &[u8; 64]) -> Result<(), RingError> {
        let token: SendToken = zerocopy::FromBytes::read_from_bytes(&bytes[..]).unwrap_or_default();
        self.send.push(memory, &token)
    }
}

impl Default for HostRings {
    fn default() -> Self {
        Self::new()
    }
}
