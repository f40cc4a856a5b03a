//! One-sided operations: the bytes of remote pointers, atomic opcodes, and the header that starts
//! the payload of every RDMA packet (put segments, get requests and their data, atomics, replies).
//!
//! A process registers ordinary memory of its own with its port; the NIC keeps a table of the
//! port's regions, each with a 32-bit key. A **remote pointer** (GM's `gm_remote_ptr_t`) names a
//! byte of a registered region of some port: the region's key in the high 32 bits and the offset
//! into the region in the low 32 ([`RemotePointer`]). The target hands its remote pointers to its
//! peers itself (in a message), as GM programs hand over addresses; a peer that presents a wrong
//! key, or an offset outside the region, is refused by the target's NIC.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes of the [`RdmaHeader`] at the start of an RDMA packet's payload.
pub const RDMA_HEADER_LEN: usize = core::mem::size_of::<RdmaHeader>();
/// Data bytes one put segment or get data packet carries.
pub const RDMA_SEGMENT: usize = crate::MTU_PAYLOAD - RDMA_HEADER_LEN;
/// Data bytes one put segment carries on a route that never leaves the board's memory
/// ([`crate::LOCAL_MTU_PAYLOAD`]): whole pages, so that the copies of a page-aligned put stay
/// aligned.
pub const LOCAL_RDMA_SEGMENT: usize = 15 * crate::MTU_PAYLOAD;
/// The longest one-sided operation in bytes (a region's offsets are 32-bit).
pub const MAX_RDMA_LENGTH: u64 = u32::MAX as u64;

/// A remote pointer: a registered region's key and an offset into it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct RemotePointer {
    /// The region's key (the NIC gave it at registration).
    pub key: u32,
    /// The byte offset into the region.
    pub offset: u32,
}

impl RemotePointer {
    /// The pointer as one 64-bit value (`key << 32 | offset`), as GM programs pass it around.
    pub const fn to_u64(self) -> u64 {
        (self.key as u64) << 32 | self.offset as u64
    }

    /// The pointer a 64-bit value names.
    pub const fn from_u64(value: u64) -> Self {
        Self {
            key: (value >> 32) as u32,
            offset: value as u32,
        }
    }

    /// The pointer `bytes` further on, or `None` past 4 GiB.
    pub const fn add(self, bytes: u64) -> Option<Self> {
        let offset = self.offset as u64 + bytes;
        if offset > u32::MAX as u64 {
            return None;
        }
        Some(Self {
            key: self.key,
            offset: offset as u32,
        })
    }
}

/// Which read-modify-write an atomic is. Every atomic works on one aligned 64-bit little-endian
/// word of registered memory and returns the word's previous value.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct AtomicOp(pub u8);

impl AtomicOp {
    /// `word += operand` (wrapping).
    pub const FETCH_ADD: Self = Self(1);
    /// `word = operand`.
    pub const SWAP: Self = Self(2);
    /// `if word == compare { word = operand }`.
    pub const COMPARE_SWAP: Self = Self(3);

    /// Whether the value names a known operation.
    pub const fn is_known(self) -> bool {
        self.0 >= 1 && self.0 <= 3
    }

    /// The new value of a word that held `old`, or `None` for an unknown operation.
    pub const fn apply(self, old: u64, operand: u64, compare: u64) -> Option<u64> {
        match self.0 {
            1 => Some(old.wrapping_add(operand)),
            2 => Some(operand),
            3 => Some(if old == compare { operand } else { old }),
            _ => None,
        }
    }
}

/// `flags` of an [`RdmaHeader`].
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(transparent)]
pub struct RdmaFlags(pub u8);

bitflags::bitflags! {
    impl RdmaFlags: u8 {
        /// The last segment of a put, or the last data packet of a get.
        const LAST = 0x01;
    }
}

/// The header at the start of every RDMA packet's payload. 48 bytes.
///
/// | packet | `key`, `offset` | `length` | `position` | `value`, `compare` | data after it |
/// |---|---|---|---|---|---|
/// | put segment (`RDMA_WRITE`) | the target region, where the whole put starts | the whole put | this segment's offset in the put | — | the segment |
/// | get request (`RDMA_READ`) | the target region, where the get starts | the whole get | — | — | — |
/// | get data (`RDMA_READ_DATA`) | — | the whole get | this packet's offset in the get | — | the data |
/// | atomic (`ATOMIC`) | the target word | 8 | — | operand, compare | — |
/// | reply (`RDMA_REPLY`) | — | — | — | the atomic's old value | — |
///
/// Every packet of an operation carries the initiator's `slot` and `operation` number, which the
/// target echoes in its get data and replies so the initiator finds the operation they answer;
/// `status` is a reply's or get data's [`crate::event::Status`].
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Debug,
    Default,
    FromBytes,
    IntoBytes,
    Immutable,
    KnownLayout,
    Unaligned,
)]
#[repr(C)]
pub struct RdmaHeader {
    /// The target region's key.
    pub key: U32,
    /// The initiator's operation number (its held send token's serial).
    pub operation: U32,
    /// Offset into the target region where the operation starts.
    pub offset: U64,
    /// Length of the whole operation in bytes.
    pub length: U32,
    /// This packet's offset within the operation.
    pub position: U32,
    /// An atomic's operand; a reply's returned value.
    pub value: U64,
    /// A compare-and-swap's compare value.
    pub compare: U64,
    /// The initiator's send slot.
    pub slot: u8,
    /// [`RdmaFlags`].
    pub flags: RdmaFlags,
    /// [`AtomicOp`] of an atomic.
    pub op: AtomicOp,
    /// A reply's or get data's status (a [`crate::event::Status`] value).
    pub status: u8,
    /// Reserved, zero.
    pub reserved: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<RdmaHeader>() == 48);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_pointers_round_trip_and_stop_at_4_gib() {
        let pointer = RemotePointer {
            key: 0xdead_beef,
            offset: 12,
        };
        assert_eq!(RemotePointer::from_u64(pointer.to_u64()), pointer);
        assert_eq!(pointer.add(4).map(|p| p.offset), Some(16));
        assert_eq!(pointer.add(u64::from(u32::MAX)), None);
    }

    #[test]
    fn atomics_compute_what_their_names_say() {
        assert_eq!(AtomicOp::FETCH_ADD.apply(u64::MAX, 2, 0), Some(1));
        assert_eq!(AtomicOp::SWAP.apply(5, 9, 0), Some(9));
        assert_eq!(AtomicOp::COMPARE_SWAP.apply(5, 9, 5), Some(9));
        assert_eq!(AtomicOp::COMPARE_SWAP.apply(5, 9, 4), Some(5));
        assert_eq!(AtomicOp(0).apply(5, 9, 4), None);
        assert!(!AtomicOp(4).is_known());
    }
}
