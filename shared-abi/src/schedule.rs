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
    /// Reserved, zero.
    pub reserved0: u8,
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
            reserved0: 0,
            node,
            reserved1: U16::new(0),
        }
    }

    /// Whether the step is well formed: a known op, a round in range, a port in range.
    pub const fn is_valid(&self) -> bool {
        matches!(self.op.0, 1..=3) && self.round < MAX_ROUNDS && self.port.index().is_some()
    }
}
