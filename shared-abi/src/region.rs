//! The port region: the memory a process and the NIC share for one open port.
//!
//! ```text
//! 0       RegionHeader (one page)
//! ...     send ring     (RingIndexes + SendToken slots)     host produces, NIC consumes
//! ...     receive ring  (RingIndexes + ReceiveToken slots)  host produces, NIC consumes
//! ...     event ring    (RingIndexes + Event slots)         NIC produces, host consumes
//! ...     DMA arena (page-aligned): message buffers and barrier schedules, named by offset
//! ```
//!
//! The driver writes the header when it creates the region; both the NIC and the host library
//! parse it with [`RegionLayout::from_header`], which checks every offset against the region.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::event::Event;
use crate::ids::{Generation, NodeId, PortId};
use crate::ring::{RingError, RingLayout};
use crate::token::{ReceiveToken, SendToken};

/// `b"NICB"` read as a little-endian `u32`.
pub const REGION_MAGIC: u32 = u32::from_le_bytes(*b"NICB");

/// Page size the region is laid out in.
pub const PAGE: usize = 4096;

/// The region header. 128 bytes at offset 0.
#[derive(
    Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, Immutable, KnownLayout, Unaligned,
)]
#[repr(C)]
pub struct RegionHeader {
    /// [`REGION_MAGIC`].
    pub magic: U32,
    /// [`crate::ABI_VERSION`].
    pub abi_version: U32,
    /// Total length of the region in bytes.
    pub region_len: U64,
    /// The NIC's node id.
    pub node_id: NodeId,
    /// This port's id.
    pub port_id: PortId,
    /// The NIC's unit number on its host.
    pub unit: u8,
    /// This incarnation of the port (paper §3.2).
    pub generation: Generation,
    /// Offset of the send ring.
    pub send_ring_offset: U32,
    /// Slots in the send ring.
    pub send_ring_entries: U32,
    /// Offset of the receive ring.
    pub receive_ring_offset: U32,
    /// Slots in the receive ring.
    pub receive_ring_entries: U32,
    /// Offset of the event ring.
    pub event_ring_offset: U32,
    /// Slots in the event ring.
    pub event_ring_entries: U32,
    /// Offset of the DMA arena.
    pub arena_offset: U64,
    /// Length of the DMA arena.
    pub arena_len: U64,
    /// Reserved, zero.
    pub reserved: [u8; 64],
}
const _: () = assert!(core::mem::size_of::<RegionHeader>() == 128);

impl Default for RegionHeader {
    fn default() -> Self {
        zerocopy::FromZeros::new_zeroed()
    }
}

/// Where everything in a port region lives, checked against the region's length.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RegionLayout {
    /// The send ring.
    pub send_ring: RingLayout,
    /// The receive ring.
    pub receive_ring: RingLayout,
    /// The event ring.
    pub event_ring: RingLayout,
    /// Offset of the DMA arena.
    pub arena_offset: usize,
    /// Length of the DMA arena.
    pub arena_len: usize,
    /// Length of the whole region.
    pub region_len: usize,
}

/// Why a region header was refused.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RegionError {
    /// The region is shorter than its header.
    TooShort,
    /// The magic is not [`REGION_MAGIC`].
    BadMagic(u32),
    /// The ABI version is not [`crate::ABI_VERSION`].
    AbiMismatch(u32),
    /// The header's length disagrees with the region's.
    LengthMismatch {
        /// What the header says.
        header: u64,
        /// What the region is.
        actual: usize,
    },
    /// A ring does not fit or is not a power of two.
    BadRing(&'static str),
    /// Two parts overlap, or the arena does not fit.
    BadArena,
}

impl core::fmt::Display for RegionError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::TooShort => write!(f, "region shorter than its header"),
            Self::BadMagic(m) => write!(f, "bad region magic {m:#010x}"),
            Self::AbiMismatch(v) => {
                write!(
                    f,
                    "region has ABI version {v}, this build speaks {}",
                    crate::ABI_VERSION
                )
            }
            Self::LengthMismatch { header, actual } => {
                write!(
                    f,
                    "region header says {header} bytes, the mapping has {actual}"
                )
            }
            Self::BadRing(which) => write!(f, "the {which} ring does not fit the region"),
            Self::BadArena => write!(
                f,
                "the DMA arena does not fit the region or overlaps a ring"
            ),
        }
    }
}

impl RegionLayout {
    /// The standard layout for rings of the given sizes (powers of two) and an arena of at least
    /// `arena_len` bytes (rounded up to whole pages).
    pub const fn standard(
        send_entries: u32,
        receive_entries: u32,
        event_entries: u32,
        arena_len: usize,
    ) -> Self {
        let send_offset = PAGE;
        let receive_offset = align64(send_offset + RingLayout::bytes::<SendToken>(send_entries));
        let event_offset =
            align64(receive_offset + RingLayout::bytes::<ReceiveToken>(receive_entries));
        let arena_offset = align_page(event_offset + RingLayout::bytes::<Event>(event_entries));
        let arena_len = align_page(arena_len);
        Self {
            send_ring: RingLayout {
                offset: send_offset,
                entries: send_entries,
            },
            receive_ring: RingLayout {
                offset: receive_offset,
                entries: receive_entries,
            },
            event_ring: RingLayout {
                offset: event_offset,
                entries: event_entries,
            },
            arena_offset,
            arena_len,
            region_len: arena_offset + arena_len,
        }
    }

    /// The header describing this layout for a port.
    pub fn header(
        &self,
        node_id: NodeId,
        port_id: PortId,
        unit: u8,
        generation: Generation,
    ) -> RegionHeader {
        RegionHeader {
            magic: REGION_MAGIC.into(),
            abi_version: crate::ABI_VERSION.into(),
            region_len: (self.region_len as u64).into(),
            node_id,
            port_id,
            unit,
            generation,
            send_ring_offset: (self.send_ring.offset as u32).into(),
            send_ring_entries: self.send_ring.entries.into(),
            receive_ring_offset: (self.receive_ring.offset as u32).into(),
            receive_ring_entries: self.receive_ring.entries.into(),
            event_ring_offset: (self.event_ring.offset as u32).into(),
            event_ring_entries: self.event_ring.entries.into(),
            arena_offset: (self.arena_offset as u64).into(),
            arena_len: (self.arena_len as u64).into(),
            reserved: [0; 64],
        }
    }

    /// Parses and checks a header read from a region of `region_len` bytes.
    ///
    /// # Errors
    /// [`RegionError`] names the first check that failed.
    pub fn from_header(header: &RegionHeader, region_len: usize) -> Result<Self, RegionError> {
        if region_len < core::mem::size_of::<RegionHeader>() {
            return Err(RegionError::TooShort);
        }
        if header.magic.get() != REGION_MAGIC {
            return Err(RegionError::BadMagic(header.magic.get()));
        }
        if header.abi_version.get() != crate::ABI_VERSION {
            return Err(RegionError::AbiMismatch(header.abi_version.get()));
        }
        if header.region_len.get() != region_len as u64 {
            return Err(RegionError::LengthMismatch {
                header: header.region_len.get(),
                actual: region_len,
            });
        }
        let ring = |offset: U32, entries: U32| RingLayout {
            offset: offset.get() as usize,
            entries: entries.get(),
        };
        let layout = Self {
            send_ring: ring(header.send_ring_offset, header.send_ring_entries),
            receive_ring: ring(header.receive_ring_offset, header.receive_ring_entries),
            event_ring: ring(header.event_ring_offset, header.event_ring_entries),
            arena_offset: usize::try_from(header.arena_offset.get())
                .map_err(|_| RegionError::BadArena)?,
            arena_len: usize::try_from(header.arena_len.get())
                .map_err(|_| RegionError::BadArena)?,
            region_len,
        };
        let bad = |_: RingError| RegionError::BadRing("send");
        layout
            .send_ring
            .validate::<SendToken>(region_len)
            .map_err(bad)?;
        layout
            .receive_ring
            .validate::<ReceiveToken>(region_len)
            .map_err(|_| RegionError::BadRing("receive"))?;
        layout
            .event_ring
            .validate::<Event>(region_len)
            .map_err(|_| RegionError::BadRing("event"))?;
        let spans = [
            (0, core::mem::size_of::<RegionHeader>()),
            (
                layout.send_ring.offset,
                RingLayout::bytes::<SendToken>(layout.send_ring.entries),
            ),
            (
                layout.receive_ring.offset,
                RingLayout::bytes::<ReceiveToken>(layout.receive_ring.entries),
            ),
            (
                layout.event_ring.offset,
                RingLayout::bytes::<Event>(layout.event_ring.entries),
            ),
            (layout.arena_offset, layout.arena_len),
        ];
        let arena_end = layout
            .arena_offset
            .checked_add(layout.arena_len)
            .ok_or(RegionError::BadArena)?;
        if arena_end > region_len || layout.arena_offset % 8 != 0 {
            return Err(RegionError::BadArena);
        }
        for (i, (a, a_len)) in spans.iter().enumerate() {
            for (b, b_len) in spans.iter().skip(i + 1) {
                if a < &(b + b_len) && b < &(a + a_len) {
                    return Err(RegionError::BadArena);
                }
            }
        }
        Ok(layout)
    }

    /// The region offset of `len` bytes at arena offset `buffer`, if they lie within the arena.
    pub fn arena_range(&self, buffer: u64, len: usize) -> Option<usize> {
        let buffer = usize::try_from(buffer).ok()?;
        let end = buffer.checked_add(len)?;
        if end > self.arena_len {
            return None;
        }
        self.arena_offset.checked_add(buffer)
    }
}

const fn align64(n: usize) -> usize {
    (n + 63) & !63
}

const fn align_page(n: usize) -> usize {
    (n + PAGE - 1) & !(PAGE - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_layout_round_trips_through_its_header() {
        let layout = RegionLayout::standard(64, 64, 128, 1 << 20);
        let header = layout.header(NodeId::new(3), PortId(2), 0, Generation::new(7));
        assert_eq!(
            RegionLayout::from_header(&header, layout.region_len),
            Ok(layout)
        );
        assert_eq!(layout.arena_offset % PAGE, 0);
    }

    #[test]
    fn bad_headers_are_refused_with_a_reason() {
        let layout = RegionLayout::standard(64, 64, 128, 1 << 16);
        let good = layout.header(NodeId::new(3), PortId(2), 0, Generation::new(7));
        let len = layout.region_len;
        let mut h = good;
        h.magic = 1.into();
        assert_eq!(
            RegionLayout::from_header(&h, len),
            Err(RegionError::BadMagic(1))
        );
        let mut h = good;
        h.abi_version = 99.into();
        assert_eq!(
            RegionLayout::from_header(&h, len),
            Err(RegionError::AbiMismatch(99))
        );
        assert!(matches!(
            RegionLayout::from_header(&good, len - 1),
            Err(RegionError::LengthMismatch { .. })
        ));
        let mut h = good;
        h.send_ring_entries = 63.into();
        assert_eq!(
            RegionLayout::from_header(&h, len),
            Err(RegionError::BadRing("send"))
        );
        let mut h = good;
        h.arena_offset = (PAGE as u64).into();
        assert_eq!(
            RegionLayout::from_header(&h, len),
            Err(RegionError::BadArena)
        );
        let mut h = good;
        h.arena_len = u64::MAX.into();
        assert_eq!(
            RegionLayout::from_header(&h, len),
            Err(RegionError::BadArena)
        );
    }

    #[test]
    fn arena_ranges_are_checked() {
        let layout = RegionLayout::standard(8, 8, 8, PAGE);
        assert_eq!(layout.arena_range(0, PAGE), Some(layout.arena_offset));
        assert_eq!(layout.arena_range(1, PAGE), None);
        assert_eq!(layout.arena_range(u64::MAX, 1), None);
        assert_eq!(
            layout.arena_range(PAGE as u64, 0),
            Some(layout.arena_offset + PAGE)
        );
    }
}
