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

/// Which barrier a barrier packet (or a host-based barrier message) belongs to: the job, the
/// group within the job, and the barrier's number in that group's sequence. Every member of a
/// group numbers the group's barriers alike, so a packet of barrier `k` can only ever be counted
/// by barrier `k` of the same group — never by a later one, another group's, or another job's
/// (a straggler of a failed barrier, a late resend, a dead job's packet). 12 bytes.
///
/// Zero is a valid value of each field; [`BarrierId::NONE`] (all zero) is what GM's raw barrier
/// call uses when the caller names no group.
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
#[repr(C)]
pub struct BarrierId {
    /// The job the group belongs to (0: not given). A NIC remembers the job of a port's last
    /// barrier, so a late peer of that job is told at once that the port is gone for good.
    pub job: zerocopy::little_endian::U32,
    /// The group within the job.
    pub group: zerocopy::little_endian::U32,
    /// The barrier's number in the group's sequence (wrapping).
    pub sequence: zerocopy::little_endian::U32,
}
const _: () = assert!(core::mem::size_of::<BarrierId>() == 12);

impl BarrierId {
    /// No job, group 0, barrier 0.
    pub const NONE: Self = Self::new(0, 0, 0);

    /// Barrier `sequence` of `group` in `job`.
    pub const fn new(job: u32, group: u32, sequence: u32) -> Self {
        Self {
            job: zerocopy::little_endian::U32::new(job),
            group: zerocopy::little_endian::U32::new(group),
            sequence: zerocopy::little_endian::U32::new(sequence),
        }
    }
}

impl core::fmt::Display for BarrierId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "barrier {} of group {:#x} (job {})",
            self.sequence.get(),
            self.group.get(),
            self.job.get()
        )
    }
}
