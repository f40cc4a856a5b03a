//! Registered regions for rendezvous transfers, landing and source alike: registering is a
//! round trip to the NIC and the kernel, so a region is registered once and reused by later
//! transfers of its size or less, and only a few are kept when idle.
//!
//! A region taken from the pool is [`Lent`]: the messages that use it share it (a message
//! staged once for several receivers, a landed message passed on while the caller copies it
//! out), and it comes back to the pool when the last of them lets go, on whatever path that is.

use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

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
    idle: Vec<MemoryRegion>,
    /// Regions whose last user let go since the pool last looked.
    returned: Arc<Mutex<Vec<MemoryRegion>>>,
    /// Regions registered so far.
    pub(super) registered: u64,
}

/// A region lent out of the pool. Clones share it; it goes back to the pool when the last clone
/// is dropped.
#[derive(Clone)]
pub(super) struct Lent(Arc<Loan>);

struct Loan {
    region: MemoryRegion,
    home: Arc<Mutex<Vec<MemoryRegion>>>,
}

impl Drop for Loan {
    fn drop(&mut self) {
        self.home
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.region.clone());
    }
}

impl Deref for Lent {
    type Target = MemoryRegion;

    fn deref(&self) -> &MemoryRegion {
        &self.0.region
    }
}

impl RegionPool {
    /// An idle region of at least `len` bytes (the smallest such), or a new one.
    pub(super) fn take(&mut self, port: &mut Port, len: usize) -> Result<Lent, Error> {
        self.collect_returned();
        let region = match (0..self.idle.len())
            .filter(|&at| self.idle[at].len() >= len)
            .min_by_key(|&at| self.idle[at].len())
        {
            Some(at) => self.idle.swap_remove(at),
            None => {
                // Registered a little larger than asked, so a later transfer a little larger
                // reuses it.
                let size = len
                    .checked_next_power_of_two()
                    .unwrap_or(len)
                    .max(POOL_MINIMUM)
                    .min(shared_abi::rdma::MAX_RDMA_LENGTH as usize)
                    .max(len);
                let region = match port.register_memory(size) {
                    Ok(region) => region,
                    // The port's table of regions may be full of idle ones kept for reuse,
                    // too small for this: they give way to one in use.
                    Err(_) if !self.idle.is_empty() => {
                        for region in self.idle.drain(..) {
                            let _ = port.deregister_memory(&region);
                        }
                        port.register_memory(size)?
                    }
                    Err(error) => return Err(error),
                };
                self.registered += 1;
                region
            }
        };
        Ok(Lent(Arc::new(Loan {
            region,
            home: self.returned.clone(),
        })))
    }

    /// Deregisters idle regions while more than [`POOL_KEEP`] are idle (the smallest first) or
    /// they hold more than [`POOL_KEEP_BYTES`] (the largest first).
    pub(super) fn trim(&mut self, port: &mut Port) {
        self.collect_returned();
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

    /// Regions whose last user let go are idle again.
    fn collect_returned(&mut self) {
        let mut returned = self.returned.lock().unwrap_or_else(PoisonError::into_inner);
        self.idle.append(&mut returned);
    }
}
