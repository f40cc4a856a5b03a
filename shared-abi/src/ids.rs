//! Identifiers: node ids, port ids, port generations.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// How many ports one NIC has (GM's limit was eight; paper §4.3 sizes the unexpected-barrier
/// record by it).
pub const PORTS_PER_NIC: usize = 8;

/// A NIC's address on the fabric.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
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
pub struct NodeId(pub zerocopy::little_endian::U16);

impl NodeId {
    /// The node id with numeric value `id`.
    pub const fn new(id: u16) -> Self {
        Self(zerocopy::little_endian::U16::new(id))
    }
    /// The numeric value.
    pub const fn get(self) -> u16 {
        self.0.get()
    }
}

impl core::fmt::Display for NodeId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "node {}", self.get())
    }
}

/// An endpoint on a NIC, `0..PORTS_PER_NIC`.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
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
pub struct PortId(pub u8);

impl PortId {
    /// The port's index into per-port tables, or `None` if the id is out of range.
    pub const fn index(self) -> Option<usize> {
        if (self.0 as usize) < PORTS_PER_NIC {
            Some(self.0 as usize)
        } else {
            None
        }
    }
}

impl core::fmt::Display for PortId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "port {}", self.0)
    }
}

/// A port's incarnation: changes every time the port is opened (paper §3.2), so that a packet
/// from or for a dead incarnation is told apart from one of the live incarnation. Zero means
/// "never opened".
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
pub struct Generation(pub zerocopy::little_endian::U32);

impl Generation {
    /// The generation with numeric value `value`.
    pub const fn new(value: u32) -> Self {
        Self(zerocopy::little_endian::U32::new(value))
    }
    /// The numeric value.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}
