//! Registered regions for rendezvous transfers, landing and source alike: registering is a
//! round trip to the NIC and the kernel, so a region is registered once and reused by later
//! transfers of its size or less, and only a few are kept when idle.

use crate::{Error, MemoryRegion, Port};

/// Idle registered regions the pool keeps for later transfers (more are deregistered).
const POOL_KEEP: usize = 8;
/// Bytes of idle registered regions the pool keeps at most (the largest go first past it).
const POOL_KEEP_BYTES: usize = 64 << 20;
/// The smallest region the pool registers (smaller requests get this much, for reuse).
const POOL_MINIMUM: usize = 64 * 1024;

/// Registered regions kept for rendezvous transfers, landing and source alike.
#[derive(Default)]
pub(super) struct RegionPool {
    pub(super) idle: Vec<MemoryRegion>,
    /// Regions registered so far.
    pub(super) registered: u64,
}

impl RegionPool {
    /// An idle region of at least `len` bytes (the smallest such), or a new one.
    pub(super) fn take(&mut self, port: &mut Port, len: usize) -> Result<MemoryRegion, Error> {
        if let Some(at) = (0..self.idle.len())
            .filter(|&at| self.idle[at].len() >= len)
            .min_by_key(|&at| self.idle[at].len())
        {
            return Ok(self.idle.swap_remove(at));
        }
        // Registered a little larger than asked, so a later transfer a little larger reuses it.
        let size = len
            .checked_next_power_of_two()
            .unwrap_or(len)
            .max(POOL_MINIMUM)
            .min(shared_abi::rdma::MAX_RDMA_LENGTH as usize)
            .max(len);
        let region = port.register_memory(size)?;
        self.registered += 1;
        Ok(region)
    }

    /// `region` is free again, for later transfers ([`RegionPool::trim`] deregisters extras).
    pub(super) fn give(&mut self, region: MemoryRegion) {
        self.idle.push(region);
    }

    /// Deregisters idle regions while more than [`POOL_KEEP`] are idle (the smallest first) or
    /// they hold more than [`POOL_KEEP_BYTES`] (the largest first).
    pub(super) fn trim(&mut self, port: &mut Port) {
        loop {
            let bytes: usize = self.idle.iter().map(MemoryRegion::len).sum();
            let lengths = (0..self.idle.len()).map(|at| (self.idle[at].len(), at));
            let at = if self.idle.len() > POOL_KEEP {
                lengths.min()
            } else if bytes > POOL_KEEP_BYTES {
                lengths.max()
            } else {
                None
            };
            let Some((_, at)) = at else {
                break;
            };
            let region = self.idle.swap_remove(at);
            let _ = port.deregister_memory(&region);
        }
    }
}
