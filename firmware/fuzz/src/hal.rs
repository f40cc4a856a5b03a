//! A board made of plain memory: port regions as byte cells, and a wire that keeps what the
//! firmware transmits (and checks that every packet is well formed and comes from its node).

use std::cell::Cell;

use firmware::{Hal, TransmitError};
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::packet::Packet;
use shared_abi::ring::{OutOfBounds, SharedMemory, check_range};

/// A port region in plain memory. Single-threaded, so an acquire load and a release store are a
/// plain read and write of the little-endian word.
pub(crate) struct Memory {
    bytes: Box<[Cell<u8>]>,
}

impl Memory {
    pub(crate) fn new(len: usize) -> Self {
        Self {
            bytes: (0..len).map(|_| Cell::new(0)).collect(),
        }
    }

    fn word(&self, offset: usize) -> Result<&[Cell<u8>], OutOfBounds> {
        check_range(self.bytes.len(), offset, 4)?;
        if !offset.is_multiple_of(4) {
            return Err(OutOfBounds { offset, len: 4 });
        }
        Ok(&self.bytes[offset..offset + 4])
    }
}

impl SharedMemory for Memory {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn load_acquire(&self, offset: usize) -> Result<u32, OutOfBounds> {
        let mut word = [0u8; 4];
        for (byte, cell) in word.iter_mut().zip(self.word(offset)?) {
            *byte = cell.get();
        }
        Ok(u32::from_le_bytes(word))
    }

    fn store_release(&self, offset: usize, value: u32) -> Result<(), OutOfBounds> {
        for (cell, byte) in self.word(offset)?.iter().zip(value.to_le_bytes()) {
            cell.set(byte);
        }
        Ok(())
    }

    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), OutOfBounds> {
        check_range(self.bytes.len(), offset, out.len())?;
        for (byte, cell) in out.iter_mut().zip(&self.bytes[offset..]) {
            *byte = cell.get();
        }
        Ok(())
    }

    fn write(&self, offset: usize, data: &[u8]) -> Result<(), OutOfBounds> {
        check_range(self.bytes.len(), offset, data.len())?;
        for (cell, byte) in self.bytes[offset..].iter().zip(data) {
            cell.set(*byte);
        }
        Ok(())
    }
}

/// Most packets the wire holds before it pushes back (keeps a run's memory bounded).
const WIRE_CAPACITY: usize = 256;

/// The board of one NIC: its ports' regions and its wire.
pub(crate) struct Wire {
    node: NodeId,
    /// Nodes the wire reaches; packets to others have no route.
    nodes: u16,
    regions: [Option<Memory>; PORTS_PER_NIC],
    /// Whether the fabric is keyed: every packet then ends in its authentication code.
    keyed: bool,
    /// Packets transmitted and not yet delivered or lost: (destination, bytes).
    pub(crate) outbox: Vec<(NodeId, Vec<u8>)>,
}

impl Wire {
    pub(crate) fn new(node: NodeId, nodes: u16, keyed: bool) -> Self {
        Self {
            node,
            nodes,
            regions: Default::default(),
            keyed,
            outbox: Vec::new(),
        }
    }

    pub(crate) fn map(&mut self, port: usize, memory: Memory) {
        if let Some(slot) = self.regions.get_mut(port) {
            *slot = Some(memory);
        }
    }

    pub(crate) fn unmap(&mut self, port: usize) {
        if let Some(slot) = self.regions.get_mut(port) {
            *slot = None;
        }
    }
}

impl Hal for Wire {
    type Memory = Memory;

    fn port_memory(&self, port: usize) -> Option<&Memory> {
        self.regions.get(port)?.as_ref()
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        // On a keyed fabric the code follows the packet; what it covers must be well formed.
        let code = if self.keyed {
            shared_abi::packet::MAC_LEN
        } else {
            0
        };
        let covered = packet
            .len()
            .checked_sub(code)
            .and_then(|len| packet.get(..len))
            .unwrap_or_else(|| panic!("the firmware transmitted {} bytes, no code", packet.len()));
        let header = *Packet::new_checked(covered)
            .unwrap_or_else(|error| panic!("the firmware transmitted a malformed packet: {error}"))
            .header();
        assert_eq!(header.src_node, self.node, "a packet names another source");
        assert_eq!(header.dst_node, destination, "a packet to another node");
        if destination.get() >= self.nodes {
            return Err(TransmitError::NoRoute);
        }
        if self.outbox.len() >= WIRE_CAPACITY {
            return Err(TransmitError::WouldBlock);
        }
        self.outbox.push((destination, packet.to_vec()));
        Ok(())
    }

    fn notify_host(&mut self, port: usize) {
        assert!(port < PORTS_PER_NIC, "a doorbell for port {port}");
    }
}
