//! The simulator's [`Hal`]: port regions in heap memory, and an outbox the world drains onto the
//! simulated wire.

use firmware::{Hal, MemoryFault, TransmitError};
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::ring::raw::RawMemory;

use super::memory::HeapRegion;

/// One simulated NIC's board.
#[derive(Default)]
pub struct SimHal {
    regions: [Option<HeapRegion>; PORTS_PER_NIC],
    /// Packets the NIC transmitted since the world last drained them.
    pub outbox: Vec<(NodeId, Vec<u8>)>,
    /// Doorbells rung, per port (the simulated hosts poll, so this is only counted).
    pub doorbells: [u64; PORTS_PER_NIC],
    /// The ordinary memory of each port's process, which it registers for one-sided operations
    /// (`None`: the process has none the NIC may reach).
    pub process: [Option<ProcessMemory>; PORTS_PER_NIC],
}

/// A simulated process's memory: `bytes` at virtual addresses from `base` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessMemory {
    /// The first address.
    pub base: u64,
    /// The bytes.
    pub bytes: Vec<u8>,
}

impl ProcessMemory {
    /// The index range of `len` bytes at `address`, if they are all mapped.
    fn range(&self, address: u64, len: usize) -> Option<std::ops::Range<usize>> {
        let start = usize::try_from(address.checked_sub(self.base)?).ok()?;
        let end = start.checked_add(len)?;
        (end <= self.bytes.len()).then_some(start..end)
    }
}

impl SimHal {
    /// Installs (or removes) the region of `port`.
    pub fn set_region(&mut self, port: usize, region: Option<HeapRegion>) {
        if let Some(slot) = self.regions.get_mut(port) {
            *slot = region;
        }
    }
}

impl Hal for SimHal {
    type Memory = RawMemory;

    fn port_memory(&self, port: usize) -> Option<&RawMemory> {
        self.regions.get(port)?.as_ref().map(HeapRegion::memory)
    }

    fn transmit(&mut self, destination: NodeId, packet: &[u8]) -> Result<(), TransmitError> {
        self.outbox.push((destination, packet.to_vec()));
        Ok(())
    }

    fn notify_host(&mut self, port: usize) {
        if let Some(count) = self.doorbells.get_mut(port) {
            *count += 1;
        }
    }

    fn read_process_memory(
        &mut self,
        port: usize,
        address: u64,
        out: &mut [u8],
    ) -> Result<(), MemoryFault> {
        let memory = self
            .process
            .get(port)
            .and_then(Option::as_ref)
            .ok_or(MemoryFault::Refused)?;
        let range = memory
            .range(address, out.len())
            .ok_or(MemoryFault::Refused)?;
        out.copy_from_slice(&memory.bytes[range]);
        Ok(())
    }

    fn write_process_memory(
        &mut self,
        port: usize,
        address: u64,
        data: &[u8],
    ) -> Result<(), MemoryFault> {
        let memory = self
            .process
            .get_mut(port)
            .and_then(Option::as_mut)
            .ok_or(MemoryFault::Refused)?;
        let range = memory
            .range(address, data.len())
            .ok_or(MemoryFault::Refused)?;
        memory.bytes[range].copy_from_slice(data);
        Ok(())
    }
}
