//! Tokens: the host's requests to the NIC, written into a port's send and receive rings.
//!
//! A token carries no pointers: buffers are named by their offset into the port's DMA arena, and
//! the NIC checks every offset and length against the arena before it touches a byte
//! (the other side is untrusted).

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ids::{BarrierId, NodeId, PortId};

/// What a send token asks for.
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
pub struct SendKind(pub u8);

impl SendKind {
    /// Send `length` bytes from the arena at `buffer` to `(target_node, target_port)`.
    pub const DATA: Self = Self(1);
    /// Run the barrier schedule of `length` steps at arena offset `buffer` (paper §5.2,
    /// `gm_barrier_send_with_callback`).
    pub const BARRIER: Self = Self(2);
    /// Put `length` bytes from the process's registered memory at address `buffer` to the remote
    /// pointer `remote` of `(target_node, target_port)` (GM's `gm_put`); the SENT event comes when
    /// the data is in the target's memory.
    pub const PUT: Self = Self(3);
    /// Get `length` bytes from the remote pointer `remote` of `(target_node, target_port)` into
    /// the process's registered memory at address `buffer` (GM's `gm_get`).
    pub const GET: Self = Self(4);
    /// The atomic `op` on the 64-bit word at the remote pointer `remote` with `operand` and
    /// `compare`; the word's previous value comes back in the SENT event and, if `buffer` is not
    /// 0, is written to the process's registered memory at address `buffer`.
    pub const ATOMIC: Self = Self(5);

    /// A broadcast: the barrier of a [`Self::BARRIER`] token (same fields) whose root supplies
    /// `size` bytes (at most [`crate::packet::BROADCAST_MAX`]) from the arena right after the
    /// schedule, and whose packets carry them to every member: each member's
    /// `BARRIER_COMPLETED` event holds them ([`crate::event::Event::broadcast_data`]).
    /// `target_node`/`target_port` name the root; on the other members `size` is ignored. The
    /// schedule must carry the root's bytes to every member — a gather-broadcast tree rooted at
    /// the root does: a member whose barrier completes without them fails it with
    /// `BAD_SCHEDULE`.
    pub const BROADCAST: Self = Self(6);

    /// A reduction: the barrier of a [`Self::BARRIER`] token (same fields, its identity
    /// required) whose every member supplies `size` bytes (at most
    /// [`crate::reduce::REDUCE_MAX`]) from the arena right after the schedule, combined as
    /// [`SendToken::reduce_spec`] says by the steps' [`crate::schedule::StepCombine`]; the
    /// completion event carries the result as a broadcast's carries its bytes.
    pub const REDUCE: Self = Self(7);

    /// Whether the kind runs a barrier schedule ([`Self::BARRIER`], [`Self::BROADCAST`] or
    /// [`Self::REDUCE`]).
    pub const fn is_barrier(self) -> bool {
        self.0 == 2 || self.0 == 6 || self.0 == 7
    }

    /// Whether the kind is a one-sided operation (put, get, atomic).
    pub const fn is_rdma(self) -> bool {
        self.0 >= 3 && self.0 <= 5
    }
}

/// Schedules one port may have the NIC keep between barriers ([`ScheduleSource`]): a persistent
/// collective's start names its kept steps instead of posting them again.
pub const KEPT_SCHEDULES: usize = 4;

/// Where a barrier token's steps come from: the arena (posted with the token, as every barrier's
/// are unless said otherwise), the arena and kept by the NIC in one of the port's
/// [`KEPT_SCHEDULES`] slots, or such a slot. A port's kept schedules are its own and end when
/// it closes.
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
pub struct ScheduleSource(pub u8);

impl ScheduleSource {
    /// The steps are in the arena at the token's `buffer`.
    pub const POSTED: Self = Self(0);
    const KEEP: u8 = 0x80;
    const KEPT: u8 = 0x40;
    const SLOT: u8 = 0x0f;

    /// The steps are in the arena at the token's `buffer`, and the NIC keeps them in `slot`
    /// (replacing what it held there) once it has read them, whether the barrier then starts
    /// or not.
    pub const fn keep(slot: u8) -> Self {
        Self(Self::KEEP | (slot & Self::SLOT))
    }

    /// The steps are those the NIC keeps in `slot`; the token's `length` must be their count.
    pub const fn kept(slot: u8) -> Self {
        Self(Self::KEPT | (slot & Self::SLOT))
    }

    /// The slot to keep the posted steps in, if any.
    pub const fn keeps_in(self) -> Option<usize> {
        if self.0 & !Self::SLOT == Self::KEEP {
            Some((self.0 & Self::SLOT) as usize)
        } else {
            None
        }
    }

    /// The slot whose kept steps the barrier runs, if it names one.
    pub const fn runs_kept(self) -> Option<usize> {
        if self.0 & !Self::SLOT == Self::KEPT {
            Some((self.0 & Self::SLOT) as usize)
        } else {
            None
        }
    }

    /// Whether the byte names a source: posted, or keep or kept with a slot below
    /// [`KEPT_SCHEDULES`].
    pub const fn is_valid(self) -> bool {
        match (self.keeps_in(), self.runs_kept()) {
            (Some(slot), None) | (None, Some(slot)) => slot < KEPT_SCHEDULES,
            _ => self.0 == 0,
        }
    }
}

/// Message priority, as GM's `GM_LOW_PRIORITY` / `GM_HIGH_PRIORITY`.
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
pub struct Priority(pub u8);

impl Priority {
    /// Low priority (GM's default).
    pub const LOW: Self = Self(0);
    /// High priority.
    pub const HIGH: Self = Self(1);

    /// Whether the value is one of the two priorities.
    pub const fn is_valid(self) -> bool {
        self.0 <= 1
    }
}

/// A send token: one entry of a port's send ring. 64 bytes.
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
pub struct SendToken {
    /// [`SendKind`].
    pub kind: SendKind,
    /// [`Priority`] of a data message.
    pub priority: Priority,
    /// GM size class of a data message: the receiver matches it against its buffers. A
    /// broadcast's root: how many bytes it broadcasts.
    pub size: u8,
    /// A barrier's: where its steps come from ([`ScheduleSource`]); zero for everything else.
    pub schedule: ScheduleSource,
    /// Destination node of a data message (a broadcast: its root's).
    pub target_node: NodeId,
    /// Destination port of a data message (a broadcast: its root's).
    pub target_port: PortId,
    /// Reserved, zero.
    pub reserved1: u8,
    /// Data: message length in bytes. Barrier: number of schedule steps.
    pub length: U32,
    /// Arena offset of the message (data) or of the schedule (barrier). A barrier whose steps
    /// the NIC keeps ([`ScheduleSource::kept`]): of what follows the schedule (a broadcast's
    /// bytes, a reduction's value), as no steps precede it.
    pub buffer: U64,
    /// Opaque to the NIC; returned in the completion event (GM's callback context).
    pub context: U64,
    /// Barrier: give up after this many microseconds, 0 for the NIC's default.
    pub timeout_us: U32,
    /// Reserved, zero.
    pub reserved2: U16,
    /// Reserved, zero.
    pub reserved3: U16,
    /// Put, get, atomic: the remote pointer ([`crate::rdma::RemotePointer::to_u64`]). Barrier:
    /// the job (low 32 bits) and group (high 32 bits) of its identity ([`SendToken::barrier_id`]).
    pub remote: U64,
    /// Atomic: the operand. Barrier: the sequence number of its identity (low 32 bits; the high
    /// 32 are zero).
    pub operand: U64,
    /// Compare-and-swap: the compare value. A barrier that keeps its steps or names kept ones
    /// ([`ScheduleSource`]): the tag they are kept under.
    pub compare: U64,
    /// Atomic: the [`crate::rdma::AtomicOp`].
    pub op: crate::rdma::AtomicOp,
    /// Reserved, zero; a reduction's operation and type in the first two
    /// ([`SendToken::reduce_spec`]).
    pub reserved4: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<SendToken>() == 64);

impl SendToken {
    /// A barrier token's identity: which barrier it runs (job, group, sequence). Its packets carry
    /// it, and only packets of the same barrier complete its steps; [`BarrierId::NONE`] for GM's
    /// raw call, which names none. It lives in the fields a barrier has no other use for.
    pub fn barrier_id(&self) -> BarrierId {
        let remote = self.remote.get();
        BarrierId::new(
            remote as u32,
            (remote >> 32) as u32,
            self.operand.get() as u32,
        )
    }

    /// Sets a barrier token's identity (see [`SendToken::barrier_id`]).
    pub fn set_barrier_id(&mut self, barrier: BarrierId) {
        self.remote = (u64::from(barrier.job.get()) | u64::from(barrier.group.get()) << 32).into();
        self.operand = u64::from(barrier.sequence.get()).into();
    }

    /// This token with barrier identity `barrier`.
    #[must_use]
    pub fn with_barrier_id(mut self, barrier: BarrierId) -> Self {
        self.set_barrier_id(barrier);
        self
    }

    /// A reduction's operation and type (in the first two bytes of `reserved4`).
    pub const fn reduce_spec(&self) -> crate::reduce::ReduceSpec {
        crate::reduce::ReduceSpec::new(
            crate::reduce::ReduceOp(self.reserved4[0]),
            crate::reduce::ReduceType(self.reserved4[1]),
        )
    }

    /// Makes this a reduction token combining with `spec`.
    pub fn set_reduce_spec(&mut self, spec: crate::reduce::ReduceSpec) {
        self.kind = SendKind::REDUCE;
        self.reserved4[0] = spec.op.0;
        self.reserved4[1] = spec.datatype.0;
    }
}

/// What a receive token provides.
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
pub struct ReceiveKind(pub u8);

impl ReceiveKind {
    /// A buffer for one incoming message (`gm_provide_receive_buffer_with_tag`).
    pub const BUFFER: Self = Self(1);
    /// A token for one barrier completion (paper §5.2, `gm_provide_barrier_buffer`).
    pub const BARRIER: Self = Self(2);
}

/// A receive token: one entry of a port's receive ring. 32 bytes.
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
pub struct ReceiveToken {
    /// [`ReceiveKind`].
    pub kind: ReceiveKind,
    /// [`Priority`] of the messages this buffer takes.
    pub priority: Priority,
    /// GM size class: the buffer holds [`crate::max_length_for_size`] bytes.
    pub size: u8,
    /// Reserved, zero.
    pub reserved0: u8,
    /// Returned in the receive event (GM's buffer tag).
    pub tag: U32,
    /// Arena offset of the buffer.
    pub buffer: U64,
    /// Reserved, zero.
    pub reserved1: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<ReceiveToken>() == 32);

#[cfg(test)]
mod tests {
    use super::{KEPT_SCHEDULES, ScheduleSource};

    #[test]
    fn a_schedule_source_names_one_slot_one_way() {
        assert!(ScheduleSource::POSTED.is_valid());
        assert_eq!(ScheduleSource::POSTED.keeps_in(), None);
        assert_eq!(ScheduleSource::POSTED.runs_kept(), None);
        for slot in 0..KEPT_SCHEDULES as u8 {
            let keep = ScheduleSource::keep(slot);
            let kept = ScheduleSource::kept(slot);
            assert!(keep.is_valid() && kept.is_valid());
            assert_eq!(keep.keeps_in(), Some(usize::from(slot)));
            assert_eq!(keep.runs_kept(), None);
            assert_eq!(kept.runs_kept(), Some(usize::from(slot)));
            assert_eq!(kept.keeps_in(), None);
        }
    }

    #[test]
    fn every_other_schedule_byte_is_refused() {
        let valid = (0..=u8::MAX)
            .map(ScheduleSource)
            .filter(|source| source.is_valid())
            .count();
        // Posted, and keep and kept for each slot.
        assert_eq!(valid, 1 + 2 * KEPT_SCHEDULES);
        assert!(!ScheduleSource::keep(KEPT_SCHEDULES as u8).is_valid());
        assert!(!ScheduleSource(0xc0).is_valid());
    }
}
