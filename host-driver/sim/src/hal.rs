//! The simulator's [`Hal`]: port regions in heap memory, and an outbox the world drains onto the
//! simulated wire.

use firmware::{Hal, TransmitError};
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
}
