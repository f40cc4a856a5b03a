//! Registered memory: each open port's table of the process memory it registered, and the
//! protection GM lacked — a key per region, and no remote access until the port allows it.
//!
//! A region is a range of the owning process's virtual addresses, reached through
//! [`crate::Hal::read_process_memory`] and [`crate::Hal::write_process_memory`]. The table lives in
//! the port's state, so regions die with the port. The board registers and deregisters on the
//! process's behalf ([`crate::Nic::register_memory`]: the driver's job, as `gm_register_memory`
//! was a call into GM's driver); one-sided operations name a region by its key and an offset
//! ([`shared_abi::rdma::RemotePointer`]).

use shared_abi::event::Status;
use shared_abi::ids::PortId;

/// Regions one port may have registered at once.
pub const MEMORY_REGIONS: usize = 16;

/// Key bits that name the region's slot in the table; the rest come from the board's nonce.
const SLOT_BITS: u32 = 0xff;

/// Why a registration or deregistration was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegisterError {
    /// The port is not open.
    PortClosed(PortId),
    /// The port has [`MEMORY_REGIONS`] regions registered already.
    TableFull,
    /// The range is empty, longer than 4 GiB, or wraps around the address space.
    BadRange {
        /// Its first address.
        address: u64,
        /// Its length.
        length: u64,
    },
    /// No region of the port has exactly this address and length.
    NotRegistered {
        /// The address asked for.
        address: u64,
        /// The length asked for.
        length: u64,
    },
}

impl core::fmt::Display for RegisterError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::PortClosed(port) => write!(f, "{port} is not open"),
            Self::TableFull => write!(
                f,
                "the port has {MEMORY_REGIONS} regions registered already (deregister one first)"
            ),
            Self::BadRange { address, length } => write!(
                f,
                "{length} bytes at {address:#x} are not a registrable range (empty, over 4 GiB, \
                 or wrapping)"
            ),
            Self::NotRegistered { address, length } => write!(
                f,
                "no region of {length} bytes at {address:#x} is registered on the port"
            ),
        }
    }
}

/// One registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MemoryRegion {
    pub(crate) address: u64,
    pub(crate) length: u64,
    pub(crate) key: u32,
}

/// A port's registered regions and whether it accepts remote access.
#[derive(Debug, Default)]
pub(crate) struct MemoryRegions {
    regions: [Option<MemoryRegion>; MEMORY_REGIONS],
    /// Set by `gm_allow_remote_memory_access`; never cleared while the port is open.
    pub(crate) remote_access: bool,
}

impl MemoryRegions {
    /// Registers `length` bytes at `address`; returns the region's key.
    pub(crate) fn register(
        &mut self,
        address: u64,
        length: u64,
        nonce: u32,
    ) -> Result<u32, RegisterError> {
        let bad = RegisterError::BadRange { address, length };
        if length == 0 || length > u64::from(u32::MAX) || address.checked_add(length).is_none() {
            return Err(bad);
        }
        let (slot, entry) = self
            .regions
            .iter_mut()
            .enumerate()
            .find(|(_, entry)| entry.is_none())
            .ok_or(RegisterError::TableFull)?;
        // The slot in the low bits finds the region; the board's nonce in the rest makes a key of
        // an earlier registration of the slot (or a guessed one) miss.
        let key = (nonce & !SLOT_BITS) | slot as u32;
        *entry = Some(MemoryRegion {
            address,
            length,
            key,
        });
        Ok(key)
    }

    /// Deregisters the region of exactly `length` bytes at `address`.
    pub(crate) fn deregister(&mut self, address: u64, length: u64) -> Result<(), RegisterError> {
        let entry = self
            .regions
            .iter_mut()
            .find(|entry| {
                entry
                    .as_ref()
                    .is_some_and(|r| r.address == address && r.length == length)
            })
            .ok_or(RegisterError::NotRegistered { address, length })?;
        *entry = None;
        Ok(())
    }

    /// Whether `length` bytes at `address` lie inside one registered region (local use: the
    /// buffer of a put, get or atomic result).
    pub(crate) fn covers(&self, address: u64, length: u64) -> bool {
        let Some(end) = address.checked_add(length) else {
            return false;
        };
        self.regions.iter().flatten().any(|region| {
            address >= region.address && end <= region.address.saturating_add(region.length)
        })
    }

    /// The process address of `length` bytes at `offset` into the region of `key`, for a remote
    /// access: refused unless the port allows remote access, the key names a region, and the
    /// range lies inside it. The refusal's status names the rule.
    pub(crate) fn remote(&self, key: u32, offset: u64, length: u64) -> Result<u64, Status> {
        if !self.remote_access {
            return Err(Status::REMOTE_ACCESS_DENIED);
        }
        let region = self
            .regions
            .get((key & SLOT_BITS) as usize)
            .copied()
            .flatten()
            .filter(|region| region.key == key)
            .ok_or(Status::BAD_KEY)?;
        let end = offset.checked_add(length).ok_or(Status::OUT_OF_BOUNDS)?;
        if end > region.length {
            return Err(Status::OUT_OF_BOUNDS);
        }
        region
            .address
            .checked_add(offset)
            .ok_or(Status::OUT_OF_BOUNDS)
    }

    /// How many regions are registered.
    pub(crate) fn count(&self) -> usize {
        self.regions.iter().flatten().count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_find_their_region_and_nothing_else() {
        let mut table = MemoryRegions::default();
        let key = table.register(0x1000, 64, 0xabcd_ef00).unwrap();
        assert_eq!(
            table.remote(key, 0, 8),
            Err(Status::REMOTE_ACCESS_DENIED),
            "nothing is reachable before the port allows it"
        );
        table.remote_access = true;
        assert_eq!(table.remote(key, 8, 8), Ok(0x1008));
        assert_eq!(table.remote(key, 60, 8), Err(Status::OUT_OF_BOUNDS));
        assert_eq!(table.remote(key, u64::MAX, 2), Err(Status::OUT_OF_BOUNDS));
        assert_eq!(table.remote(key ^ 0x100, 0, 8), Err(Status::BAD_KEY));
        assert!(table.covers(0x1000, 64));
        assert!(!table.covers(0x1001, 64));
        table.deregister(0x1000, 64).unwrap();
        assert_eq!(table.remote(key, 0, 8), Err(Status::BAD_KEY));
        // The slot is reused under another nonce: the old key stays dead.
        let again = table.register(0x1000, 64, 0x1234_5600).unwrap();
        assert_ne!(again, key);
        assert_eq!(table.remote(key, 0, 8), Err(Status::BAD_KEY));
    }

    #[test]
    fn bad_ranges_and_a_full_table_are_refused() {
        let mut table = MemoryRegions::default();
        assert!(matches!(
            table.register(0, 0, 0),
            Err(RegisterError::BadRange { .. })
        ));
        assert!(matches!(
            table.register(u64::MAX, 2, 0),
            Err(RegisterError::BadRange { .. })
        ));
        for i in 0..MEMORY_REGIONS as u64 {
            table.register(i * 4096, 4096, 0).unwrap();
        }
        assert_eq!(table.register(0, 1, 0), Err(RegisterError::TableFull));
        assert_eq!(
            table.deregister(4096, 1),
            Err(RegisterError::NotRegistered {
                address: 4096,
                length: 1
            })
        );
    }
}
