//! The wire between QEMU NICs: single-producer/single-consumer packet rings in shared memory.
//!
//! Each NIC has a transmit ring (the firmware produces, the host's switch consumes) and a receive
//! ring (the switch produces, the firmware consumes), both in the NIC's shared area
//! ([`super::layout`]). The switch moves a packet from one NIC's transmit ring into the receive
//! ring of the NIC its slot names.
//!
//! A ring is the port rings' [`RingIndexes`](crate::ring::RingIndexes) block followed by `entries` slots of
//! [`SLOT_STRIDE`] bytes: a [`SlotHeader`] and up to [`MAX_WIRE_LEN`] packet bytes. Its indexes
//! move by the port rings' protocol, the same code ([`ProducerCursor`], [`ConsumerCursor`]):
//! the producer writes the slot, then publishes `tail` with release ordering; the consumer loads
//! `tail` with acquire ordering, copies the slot out, then releases it by storing `head`; a tail
//! more than a ring ahead is [`RingError::Corrupt`]. Unlike a port ring's fixed-size entries,
//! only the header and the packet's own bytes are copied, and the header is the other side's
//! word too: a slot claiming more than [`MAX_WIRE_LEN`] bytes is [`WireError::BadLength`] (and
//! is skipped), never an out-of-bounds copy.

use core::mem::size_of;

use crate::ids::NodeId;
use crate::packet::MAX_WIRE_LEN;
use crate::ring::{
    ConsumerCursor, OutOfBounds, ProducerCursor, RingError, RingShape, SharedMemory,
};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The header of one slot. 16 bytes.
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned)]
#[repr(C)]
pub struct SlotHeader {
    /// Packet bytes that follow.
    pub length: U32,
    /// In a transmit ring the destination node, in a receive ring the source node.
    pub node: NodeId,
    /// Reserved, zero.
    pub reserved0: U16,
    /// Reserved, zero.
    pub reserved1: [u8; 8],
}
const _: () = assert!(size_of::<SlotHeader>() == 16);

/// Bytes between the starts of two slots: a header and the largest packet, rounded up to a cache
/// line.
pub const SLOT_STRIDE: usize = (size_of::<SlotHeader>() + MAX_WIRE_LEN + 63) & !63;

/// Where a packet ring lives in its memory.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PacketRingLayout {
    /// Offset of the ring's [`RingIndexes`](crate::ring::RingIndexes) (64-aligned).
    pub offset: usize,
    /// Number of slots, a power of two.
    pub entries: u32,
}

impl PacketRingLayout {
    /// Bytes a ring of `entries` slots occupies.
    pub const fn bytes(entries: u32) -> usize {
        RingShape::bytes(entries, SLOT_STRIDE)
    }

    /// The ring's shape: slots of [`SLOT_STRIDE`] bytes.
    pub const fn shape(&self) -> RingShape {
        RingShape {
            offset: self.offset,
            entries: self.entries,
            stride: SLOT_STRIDE,
        }
    }

    /// Checks the layout against memory of `len` bytes.
    ///
    /// # Errors
    /// [`RingError::BadLayout`] if `entries` is not a power of two, the offset is not 64-aligned,
    /// or the ring does not fit.
    pub fn validate(&self, len: usize) -> Result<(), RingError> {
        self.shape().validate(len)
    }
}

/// A packet could not be taken from a ring.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum WireError {
    /// The ring's indexes or memory are broken.
    Ring(RingError),
    /// The slot claimed more bytes than a packet has; it was skipped.
    BadLength {
        /// The claimed length.
        length: u32,
    },
}

impl From<RingError> for WireError {
    fn from(error: RingError) -> Self {
        Self::Ring(error)
    }
}

impl From<OutOfBounds> for WireError {
    fn from(error: OutOfBounds) -> Self {
        Self::Ring(RingError::OutOfBounds(error))
    }
}

/// The producer side of a packet ring: a [`ProducerCursor`] whose slots are a [`SlotHeader`]
/// and a packet.
#[derive(Debug)]
pub struct PacketProducer {
    cursor: ProducerCursor,
}

impl PacketProducer {
    /// A producer for a fresh ring (both indexes zero) at `layout`.
    pub const fn new(layout: PacketRingLayout) -> Self {
        Self {
            cursor: ProducerCursor::new(layout.shape(), 0),
        }
    }

    /// Copies `packet` into the next slot, marked with `node`, and publishes it.
    ///
    /// # Errors
    /// [`RingError::Full`] if there is no free slot; [`RingError::Corrupt`] if the consumer's
    /// head is impossible; [`RingError::OutOfBounds`] for a packet longer than
    /// [`MAX_WIRE_LEN`] or a ring outside the memory. Nothing is published on error.
    pub fn push<M: SharedMemory + ?Sized>(
        &mut self,
        memory: &M,
        node: NodeId,
        packet: &[u8],
    ) -> Result<(), RingError> {
        if packet.len() > MAX_WIRE_LEN {
            return Err(RingError::OutOfBounds(OutOfBounds {
                offset: 0,
                len: packet.len(),
            }));
        }
        let slot = self.cursor.reserve(memory)?;
        let header = SlotHeader {
            length: U32::new(packet.len() as u32),
            node,
            ..SlotHeader::default()
        };
        memory.write(slot, header.as_bytes())?;
        memory.write(slot + size_of::<SlotHeader>(), packet)?;
        self.cursor.publish(memory)?;
        Ok(())
    }

    /// Whether the consumer asked for a doorbell. Call after [`PacketProducer::push`]: the full
    /// fence orders our tail store before this load, so either the consumer sees the packet
    /// before it sleeps or we see its flag.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn consumer_wants_doorbell<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
    ) -> Result<bool, OutOfBounds> {
        self.cursor.consumer_wants_doorbell(memory)
    }
}

/// A packet taken from a ring.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Taken {
    /// The slot's node (the destination in a transmit ring, the source in a receive ring).
    pub node: NodeId,
    /// Packet bytes copied into the caller's buffer.
    pub length: usize,
}

/// The consumer side of a packet ring: a [`ConsumerCursor`] whose slots are a [`SlotHeader`]
/// and a packet.
#[derive(Debug)]
pub struct PacketConsumer {
    cursor: ConsumerCursor,
}

impl PacketConsumer {
    /// A consumer for a fresh ring (both indexes zero) at `layout`.
    pub const fn new(layout: PacketRingLayout) -> Self {
        Self {
            cursor: ConsumerCursor::new(layout.shape(), 0),
        }
    }

    /// Packets published and not yet taken.
    ///
    /// # Errors
    /// [`RingError::Corrupt`] if the producer's tail is more than a ring ahead of our head.
    pub fn available<M: SharedMemory + ?Sized>(&self, memory: &M) -> Result<u32, RingError> {
        self.cursor.available(memory)
    }

    /// Copies the next packet into `out` and frees its slot.
    ///
    /// # Errors
    /// [`WireError::Ring`] if the producer's tail is impossible (nothing is taken; see
    /// [`PacketConsumer::resynchronise`]); [`WireError::BadLength`] if the slot claims more than
    /// [`MAX_WIRE_LEN`] bytes (the slot is freed unread).
    pub fn pop<M: SharedMemory + ?Sized>(
        &mut self,
        memory: &M,
        out: &mut [u8; MAX_WIRE_LEN],
    ) -> Result<Option<Taken>, WireError> {
        let Some(slot) = self.cursor.peek(memory)? else {
            return Ok(None);
        };
        let mut header = SlotHeader::new_zeroed();
        memory.read(slot, header.as_mut_bytes())?;
        // The length is the producer's word: checked against `out` before any packet byte is
        // copied.
        let length = header.length.get();
        let taken = match out.get_mut(..length as usize) {
            Some(bytes) => {
                memory.read(slot + size_of::<SlotHeader>(), bytes)?;
                Ok(Some(Taken {
                    node: header.node,
                    length: bytes.len(),
                }))
            }
            None => Err(WireError::BadLength { length }),
        };
        self.cursor.release(memory)?;
        taken
    }

    /// Skips everything published so far (after [`RingError::Corrupt`]). Returns the new head.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn resynchronise<M: SharedMemory + ?Sized>(
        &mut self,
        memory: &M,
    ) -> Result<u32, OutOfBounds> {
        self.cursor.resynchronise(memory)
    }

    /// Says whether this consumer is about to sleep and wants a doorbell on the next push. After
    /// raising it, check [`PacketConsumer::available`] once more before sleeping.
    ///
    /// # Errors
    /// [`OutOfBounds`] if the ring lies outside the memory.
    pub fn set_sleeping<M: SharedMemory + ?Sized>(
        &self,
        memory: &M,
        sleeping: bool,
    ) -> Result<(), OutOfBounds> {
        self.cursor.set_sleeping(memory, sleeping)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::ring::cursor::{HEAD_OFFSET as HEAD, TAIL_OFFSET as TAIL};
    use core::cell::RefCell;

    /// Plain memory standing in for the shared area.
    struct FakeMemory(RefCell<std::vec::Vec<u8>>);

    impl FakeMemory {
        fn new(len: usize) -> Self {
            Self(RefCell::new(std::vec![0; len]))
        }
    }

    impl SharedMemory for FakeMemory {
        fn len(&self) -> usize {
            self.0.borrow().len()
        }
        fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds> {
            let mut word = [0; 4];
            self.read(offset, &mut word)?;
            Ok(u32::from_le_bytes(word))
        }
        fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
            self.write(offset, &value.to_le_bytes())
        }
        fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
            crate::ring::check_range(self.len(), offset, out.len())?;
            out.copy_from_slice(&self.0.borrow()[offset..offset + out.len()]);
            Ok(())
        }
        fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
            crate::ring::check_range(self.len(), offset, data.len())?;
            self.0.borrow_mut()[offset..offset + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    const LAYOUT: PacketRingLayout = PacketRingLayout {
        offset: 64,
        entries: 4,
    };

    fn memory() -> FakeMemory {
        FakeMemory::new(64 + PacketRingLayout::bytes(LAYOUT.entries))
    }

    #[test]
    fn packets_round_trip_in_order_and_the_ring_fills() {
        let memory = memory();
        LAYOUT.validate(memory.len()).unwrap();
        let mut producer = PacketProducer::new(LAYOUT);
        let mut consumer = PacketConsumer::new(LAYOUT);
        let mut out = [0u8; MAX_WIRE_LEN];
        for round in 0..3u8 {
            for i in 0..4u8 {
                let packet = std::vec![round ^ i; usize::from(i) * 1000 + 1];
                producer
                    .push(&memory, NodeId::new(u16::from(i)), &packet)
                    .unwrap();
            }
            assert_eq!(
                producer.push(&memory, NodeId::new(9), &[1]),
                Err(RingError::Full)
            );
            assert_eq!(consumer.available(&memory), Ok(4));
            for i in 0..4u8 {
                let taken = consumer.pop(&memory, &mut out).unwrap().unwrap();
                assert_eq!(taken.node, NodeId::new(u16::from(i)));
                assert_eq!(taken.length, usize::from(i) * 1000 + 1);
                assert!(out[..taken.length].iter().all(|&b| b == round ^ i));
            }
            assert_eq!(consumer.pop(&memory, &mut out), Ok(None));
        }
        let largest = [7u8; MAX_WIRE_LEN];
        producer.push(&memory, NodeId::new(1), &largest).unwrap();
        assert_eq!(
            consumer.pop(&memory, &mut out).unwrap().unwrap().length,
            MAX_WIRE_LEN
        );
        assert!(
            producer
                .push(&memory, NodeId::new(1), &[0; MAX_WIRE_LEN + 1])
                .is_err()
        );
    }

    #[test]
    fn a_lying_producer_is_caught_not_followed() {
        let memory = memory();
        let mut consumer = PacketConsumer::new(LAYOUT);
        let mut out = [0u8; MAX_WIRE_LEN];
        // A tail five ahead of a four-slot ring.
        memory.store_release(LAYOUT.offset + TAIL, 5).unwrap();
        assert!(matches!(
            consumer.pop(&memory, &mut out),
            Err(WireError::Ring(RingError::Corrupt { head: 0, tail: 5 }))
        ));
        assert_eq!(consumer.resynchronise(&memory), Ok(5));
        assert_eq!(consumer.pop(&memory, &mut out), Ok(None));
        // A slot claiming more than a packet: skipped, and the next one is still read.
        let slot = LAYOUT.shape().slot_offset(5);
        memory.write(slot, &u32::MAX.to_le_bytes()).unwrap();
        let next = LAYOUT.shape().slot_offset(6);
        memory.write(next, &3u32.to_le_bytes()).unwrap();
        memory.store_release(LAYOUT.offset + TAIL, 7).unwrap();
        assert_eq!(
            consumer.pop(&memory, &mut out),
            Err(WireError::BadLength { length: u32::MAX })
        );
        assert_eq!(consumer.pop(&memory, &mut out).unwrap().unwrap().length, 3);
    }

    #[test]
    fn a_lying_consumer_is_caught_not_followed() {
        let memory = memory();
        let mut producer = PacketProducer::new(LAYOUT);
        memory.store_release(LAYOUT.offset + HEAD, 3).unwrap();
        assert_eq!(
            producer.push(&memory, NodeId::new(0), &[1]),
            Err(RingError::Corrupt { head: 3, tail: 0 })
        );
    }

    #[test]
    fn the_sleeping_flag_reaches_the_producer() {
        let memory = memory();
        let mut producer = PacketProducer::new(LAYOUT);
        let consumer = PacketConsumer::new(LAYOUT);
        producer.push(&memory, NodeId::new(0), &[1]).unwrap();
        assert_eq!(producer.consumer_wants_doorbell(&memory), Ok(false));
        consumer.set_sleeping(&memory, true).unwrap();
        assert_eq!(producer.consumer_wants_doorbell(&memory), Ok(true));
        consumer.set_sleeping(&memory, false).unwrap();
        assert_eq!(producer.consumer_wants_doorbell(&memory), Ok(false));
    }

    #[test]
    fn layouts_are_validated() {
        assert_eq!(LAYOUT.validate(64), Err(RingError::BadLayout));
        let odd = PacketRingLayout {
            offset: 64,
            entries: 3,
        };
        assert_eq!(odd.validate(1 << 20), Err(RingError::BadLayout));
        let misaligned = PacketRingLayout {
            offset: 65,
            entries: 4,
        };
        assert_eq!(misaligned.validate(1 << 20), Err(RingError::BadLayout));
    }
}
