//! Events: the NIC's reports to the host, written into a port's event ring.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ids::{NodeId, PortId};
use crate::token::Priority;

/// What an event reports.
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
pub struct EventKind(pub u8);

impl EventKind {
    /// A message arrived into the buffer at `buffer` (GM's `GM_RECV_EVENT` / `GM_HIGH_RECV_EVENT`
    /// by `priority`).
    pub const RECEIVED: Self = Self(1);
    /// A send token finished: `status` says how; `context` is the token's.
    pub const SENT: Self = Self(2);
    /// A barrier completed (GM's `GM_BARRIER_COMPLETED_EVENT`); `context` is the token's. A
    /// broadcast's completion also holds the root's bytes: `length` of them,
    /// [`Event::broadcast_data`].
    pub const BARRIER_COMPLETED: Self = Self(3);
    /// A barrier ended without completing; `status` says why and `peer_node`/`peer_port` name the
    /// member it was still waiting for.
    pub const BARRIER_FAILED: Self = Self(4);
    /// A token the host wrote was refused; `status` says why. The token's resources (its buffer)
    /// are the host's again.
    pub const TOKEN_REJECTED: Self = Self(5);
}

/// How an operation ended. The numbering is nicbar's own; the C API maps it onto GM's
/// `gm_status_t`.
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
pub struct Status(pub u8);

impl Status {
    /// It worked.
    pub const SUCCESS: Self = Self(0);
    /// The target never accepted the message in time (GM's `GM_SEND_TIMED_OUT`).
    pub const SEND_TIMED_OUT: Self = Self(1);
    /// The target port is closed (GM's `GM_SEND_TARGET_PORT_CLOSED`).
    pub const TARGET_PORT_CLOSED: Self = Self(2);
    /// The target node did not answer (GM's `GM_SEND_TARGET_NODE_UNREACHABLE`).
    pub const TARGET_NODE_UNREACHABLE: Self = Self(3);
    /// A field of the token was out of range (kind, size, priority, node or port id).
    pub const INVALID_TOKEN: Self = Self(4);
    /// The token named memory outside the port's DMA arena.
    pub const BAD_BUFFER: Self = Self(5);
    /// A barrier token arrived while a barrier was already running on the port, or without a
    /// barrier buffer provided.
    pub const BARRIER_BUSY: Self = Self(6);
    /// The barrier's timeout expired.
    pub const BARRIER_TIMED_OUT: Self = Self(7);
    /// The barrier schedule was malformed (too long, bad step).
    pub const BAD_SCHEDULE: Self = Self(8);
    /// The port's rings were left inconsistent by the host (an index moved impossibly).
    pub const RING_CORRUPT: Self = Self(9);
    /// The NIC has no room for the request now (a table is full); retry later.
    pub const NO_RESOURCES: Self = Self(10);
    /// The message's length exceeds its size class or the MTU.
    pub const TOO_LONG: Self = Self(11);
    /// A one-sided operation named a region key the target port has not registered (or has
    /// deregistered since).
    pub const BAD_KEY: Self = Self(12);
    /// A one-sided operation reached outside its target region, or outside 4 GiB.
    pub const OUT_OF_BOUNDS: Self = Self(13);
    /// The target port has not allowed remote memory access (`gm_allow_remote_memory_access`).
    pub const REMOTE_ACCESS_DENIED: Self = Self(14);
    /// An atomic's target word is not 8-byte aligned, or its opcode is unknown.
    pub const MISALIGNED: Self = Self(15);
    /// The local buffer of a put, get or atomic is not inside memory this port registered.
    pub const NOT_REGISTERED: Self = Self(16);
    /// The kernel refused the NIC access to the process's memory (on the emulated NIC:
    /// `process_vm_readv`/`process_vm_writev` failed — ptrace scope, or the memory is unmapped).
    pub const MEMORY_FAULT: Self = Self(17);
    /// A message longer than a packet stopped part way. Receiving: its sender withdrew it (its
    /// port closed, or it gave up), and the buffer comes back holding the `length` bytes that
    /// arrived. Sending: the receiver lost the message's start (it restarted).
    pub const INCOMPLETE: Self = Self(18);
}

/// An event: one entry of a port's event ring. 64 bytes.
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
pub struct Event {
    /// [`EventKind`].
    pub kind: EventKind,
    /// [`Status`].
    pub status: Status,
    /// Received message's priority.
    pub priority: Priority,
    /// Received message's size class.
    pub size: u8,
    /// Received: the sender's node. Barrier failed / peer closed: the member in question.
    pub peer_node: NodeId,
    /// Received: the sender's port. Barrier failed / peer closed: the member in question.
    pub peer_port: PortId,
    /// Reserved, zero.
    pub reserved0: u8,
    /// Received: the message length. A broadcast's completion: how many bytes it holds.
    pub length: U32,
    /// Received: the tag of the receive buffer used.
    pub tag: U32,
    /// Received: arena offset of the buffer that holds the message.
    pub buffer: U64,
    /// Sent / barrier: the token's context. (An atomic's SENT event carries the word's previous
    /// value in `buffer`.)
    pub context: U64,
    /// Rejected tokens: the [`crate::token::SendKind`] or [`crate::token::ReceiveKind`] value
    /// of the refused token, with `0x100` set for receive tokens. (A broadcast's completion has
    /// no detail: these 4 bytes and the next 28 hold its bytes, [`Event::broadcast_data`].)
    pub detail: U32,
    /// Reserved, zero (a broadcast's completion: the rest of its bytes).
    pub reserved1: [u8; 28],
}
const _: () = assert!(core::mem::size_of::<Event>() == 64);

/// The most bytes a broadcast carries: what its completion [`Event`] holds inline
/// ([`Event::broadcast_data`]), so every member's event ring delivers them with no buffer to
/// provide and no event grown. A barrier packet of a broadcast carries them after its payload
/// ([`crate::packet::BarrierPayload`]).
pub const BROADCAST_MAX: usize = 32;

/// Where a broadcast's bytes start in its completion [`Event`]: the last [`BROADCAST_MAX`] bytes
/// (`detail` and `reserved1`).
const BROADCAST_DATA_AT: usize = core::mem::offset_of!(Event, detail);
const _: () = assert!(BROADCAST_DATA_AT + BROADCAST_MAX == 64);

impl Event {
    /// Whether this is a send's successful end: what a process sleeping for something else
    /// need not be woken for ([`crate::ring::Wake::UNLESS_SENT`]).
    pub fn is_successful_send(&self) -> bool {
        self.kind == EventKind::SENT && self.status == Status::SUCCESS
    }

    /// A broadcast's bytes in its `BARRIER_COMPLETED` event: the first `length` (at most
    /// [`BROADCAST_MAX`]) of its last 32 bytes. Empty for any other event kind.
    pub fn broadcast_data(&self) -> &[u8] {
        if self.kind != EventKind::BARRIER_COMPLETED {
            return &[];
        }
        let len = (self.length.get() as usize).min(BROADCAST_MAX);
        self.as_bytes()
            .get(BROADCAST_DATA_AT..BROADCAST_DATA_AT + len)
            .unwrap_or(&[])
    }

    /// Puts `data` (at most [`BROADCAST_MAX`] bytes; more are cut) into this
    /// event as a broadcast's bytes, and their count into `length`.
    pub fn set_broadcast_data(&mut self, data: &[u8]) {
        let len = data.len().min(BROADCAST_MAX);
        self.length = U32::new(len as u32);
        if let Some(tail) = self.as_mut_bytes().get_mut(BROADCAST_DATA_AT..) {
            tail.fill(0);
            if let (Some(to), Some(from)) = (tail.get_mut(..len), data.get(..len)) {
                to.copy_from_slice(from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broadcasts_bytes_fill_the_events_last_32_bytes_and_nothing_else() {
        let mut event = Event {
            kind: EventKind::BARRIER_COMPLETED,
            context: U64::new(0x1234),
            ..Event::default()
        };
        let data: [u8; 32] = core::array::from_fn(|i| i as u8 + 1);
        event.set_broadcast_data(&data);
        assert_eq!(event.broadcast_data(), &data[..]);
        assert_eq!(event.context.get(), 0x1234, "the context is untouched");
        event.set_broadcast_data(&data[..5]);
        assert_eq!(event.broadcast_data(), &data[..5]);
        assert_eq!(
            event.reserved1[1..],
            [0; 27],
            "a shorter broadcast leaves no stale bytes"
        );
        event.set_broadcast_data(&[9; 40]);
        assert_eq!(
            event.broadcast_data(),
            &[9; 32][..],
            "more than 32 bytes are cut"
        );
        event.length = U32::new(1000);
        assert_eq!(
            event.broadcast_data().len(),
            32,
            "a forged length reads no further"
        );
        event.kind = EventKind::SENT;
        assert!(event.broadcast_data().is_empty());
    }
}
