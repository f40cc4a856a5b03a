//! Barrier schedules: a barrier algorithm compiled by the host into steps the NIC interprets.
//!
//! Pairwise exchange, gather-broadcast and n-way dissemination all compile to a list of
//! [`Step`]s (the host does the computation, paper §5.1). The NIC runs the list in order: a
//! `SEND` step transmits one barrier packet and moves on; a `RECV` step waits until the matching
//! packet has arrived (now, or earlier and recorded); `EXCHANGE` is a send then a receive.
//! A packet matches a receive step when it comes from the step's node and port and carries the
//! step's `round`.

use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ids::{NodeId, PortId};

/// Most steps one schedule may have (the NIC copies a schedule into its own memory).
pub const MAX_SCHEDULE_STEPS: usize = 128;

/// Barriers one port may run in the NIC at once, each with its own identity
/// ([`crate::ids::BarrierId`]) and completion buffer: a process's barriers of different groups
/// complete in whatever order their members start them.
pub const RUNNING_BARRIERS: usize = 4;

/// Rounds are numbered `0..MAX_ROUNDS` (the unexpected-barrier record keeps a bit per round).
pub const MAX_ROUNDS: u8 = 32;

/// What a step does.
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
pub struct StepOp(pub u8);

impl StepOp {
    /// Send one barrier packet of `round` to the peer, then go on.
    pub const SEND: Self = Self(1);
    /// Wait for the peer's barrier packet of `round`.
    pub const RECV: Self = Self(2);
    /// Send to the peer, then wait for its packet of `round` (pairwise exchange).
    pub const EXCHANGE: Self = Self(3);
}

/// What a reduction's step does with the value the peer's packet carries (a barrier's steps
/// carry none: zero). Bits.
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
pub struct StepCombine(pub u8);

impl StepCombine {
    /// Nothing: a barrier's step (the packet carries no value, or one that is passed over).
    pub const NONE: Self = Self(0);
    /// The received value is combined with this member's: `mine ⊕ peer's`.
    pub const COMBINE: Self = Self(1);
    /// With [`StepCombine::COMBINE`]: the peer's value is the left operand (`peer's ⊕ mine`),
    /// as the peer holds the lower-ranked block. The order is fixed by the schedule, never by
    /// arrival, so every member computes the same bits.
    pub const PEER_LEFT: Self = Self(2);
    /// The received value replaces this member's (the result handed back to a member that
    /// only contributed).
    pub const REPLACE: Self = Self(4);

    /// Whether every bit in `other` is set.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub const fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether the bits name a known treatment: none, combine (either order), or replace.
    pub const fn is_valid(self) -> bool {
        matches!(self.0, 0 | 1 | 3 | 4)
    }
}

/// One schedule step. 8 bytes.
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
pub struct Step {
    /// [`StepOp`].
    pub op: StepOp,
    /// The round the packet belongs to, `< MAX_ROUNDS`.
    pub round: u8,
    /// The peer's port.
    pub port: PortId,
    /// A reduction's treatment of the received value ([`StepCombine`]; zero for a barrier).
    pub combine: StepCombine,
    /// The peer's node.
    pub node: NodeId,
    /// Reserved, zero.
    pub reserved1: U16,
}
const _: () = assert!(core::mem::size_of::<Step>() == 8);

impl Step {
    /// A step of `op` with `(node, port)` in `round`.
    pub const fn new(op: StepOp, node: NodeId, port: PortId, round: u8) -> Self {
        Self {
            op,
            round,
            port,
            combine: StepCombine::NONE,
            node,
            reserved1: U16::new(0),
        }
    }

    /// This step, treating the value its packet brings as `combine` says.
    #[must_use]
    pub const fn with_combine(mut self, combine: StepCombine) -> Self {
        self.combine = combine;
        self
    }

    /// Whether the step is well formed: a known op, a round in range, a port in range, a known
    /// treatment of a received value.
    pub const fn is_valid(&self) -> bool {
        matches!(self.op.0, 1..=3)
            && self.round < MAX_ROUNDS
            && self.port.index().is_some()
            && self.combine.is_valid()
    }
}
