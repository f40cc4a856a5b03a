//! Events as the process sees them: the NIC's reports, with the buffers they give back.

use shared_abi::event::Status;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::token::Priority;

use crate::dma::DmaBuffer;

/// The bytes a broadcast run by the NIC delivered: at most [`crate::NIC_BROADCAST_MAX`]. Derefs
/// to the bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BroadcastData {
    len: u8,
    bytes: [u8; shared_abi::packet::BROADCAST_MAX],
}

impl BroadcastData {
    /// The first [`crate::NIC_BROADCAST_MAX`] bytes of `data`.
    pub fn new(data: &[u8]) -> Self {
        let len = data.len().min(shared_abi::packet::BROADCAST_MAX);
        let mut bytes = [0; shared_abi::packet::BROADCAST_MAX];
        bytes[..len].copy_from_slice(&data[..len]);
        Self {
            len: len as u8,
            bytes,
        }
    }
}

impl std::ops::Deref for BroadcastData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for BroadcastData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BroadcastData").field(&&self[..]).finish()
    }
}

/// What [`crate::Port::receive`] returns.
#[derive(Debug)]
pub enum Event {
    /// A message arrived (GM's `GM_RECV_EVENT`, or `GM_HIGH_RECV_EVENT` by `priority`). Its bytes
    /// are `buffer[..length]`; the buffer is the process's again (provide it anew to receive
    /// into it again).
    Received {
        /// The buffer that holds the message.
        buffer: DmaBuffer,
        /// The message length.
        length: usize,
        /// The buffer's tag, as provided.
        tag: u32,
        /// The size class.
        size: u8,
        /// The priority.
        priority: Priority,
        /// The sending node.
        sender_node: NodeId,
        /// The sending port.
        sender_port: PortId,
        /// `SUCCESS`; `BAD_BUFFER` if the NIC could not write the buffer; `INCOMPLETE` if a message
        /// longer than a packet stopped part way (its sender withdrew it): `length` bytes arrived.
        status: Status,
    },
    /// A send finished (GM's send callback): `status` says how. The send token and the buffer
    /// are the process's again.
    Sent {
        /// The buffer sent from.
        buffer: DmaBuffer,
        /// The context given to [`crate::Port::send`].
        context: u64,
        /// `SUCCESS`, `TARGET_PORT_CLOSED`, `TARGET_NODE_UNREACHABLE`, `SEND_TIMED_OUT`.
        status: Status,
        /// The destination node.
        target_node: NodeId,
        /// The destination port.
        target_port: PortId,
    },
    /// The NIC refused a send token; the token (and its buffer, if it was one of this library's
    /// sends) is the process's again. A refused barrier ([`crate::Port::barrier_send`]; `kind`
    /// 2) keeps its barrier buffer provided; `BARRIER_BUSY` says a barrier was running or none
    /// was provided.
    SendRejected {
        /// The buffer, for a data send made through this library (never a barrier's schedule).
        buffer: Option<DmaBuffer>,
        /// The send's context (the raw token's context for a raw token).
        context: u64,
        /// Why (`INVALID_TOKEN`, `BAD_BUFFER`, `TOO_LONG`, ...).
        status: Status,
        /// The refused token's kind byte.
        kind: u8,
    },
    /// The NIC refused a receive token; the token (and its buffer) is the process's again.
    ReceiveRejected {
        /// The buffer, for a buffer provided through this library.
        buffer: Option<DmaBuffer>,
        /// The buffer's tag.
        tag: u32,
        /// Why.
        status: Status,
    },
    /// A barrier completed (GM's `GM_BARRIER_COMPLETED_EVENT`): every member of the group
    /// entered it. The barrier's send token and the barrier buffer it used are spent.
    BarrierCompleted {
        /// The context given to [`crate::Port::barrier_send`].
        context: u64,
    },
    /// A broadcast run by the NIC completed ([`crate::Port::nic_broadcast`]): every member
    /// entered it, and `data` holds the root's bytes. Its send token and barrier buffer are
    /// spent.
    BroadcastCompleted {
        /// The token's context.
        context: u64,
        /// The root's bytes.
        data: BroadcastData,
    },
    /// A barrier ended without completing. The barrier's send token and the barrier buffer it
    /// used are spent.
    BarrierFailed {
        /// The context given to [`crate::Port::barrier_send`].
        context: u64,
        /// Why: `TARGET_PORT_CLOSED` (the member's port closed), `TARGET_NODE_UNREACHABLE` (its
        /// NIC stopped answering), `BARRIER_TIMED_OUT`, or `NO_RESOURCES`.
        status: Status,
        /// The member the NIC was waiting for.
        waiting_for: (NodeId, PortId),
    },
    /// A put, get or atomic ended (GM's callback of `gm_put`, `gm_get`,
    /// `gm_directed_send_with_callback`): with `SUCCESS`, a put's data is in the target's memory
    /// (remote completion), a get's in ours, and an atomic was applied once. Any other status
    /// names the rule the operation broke (`BAD_KEY`, `OUT_OF_BOUNDS`, `REMOTE_ACCESS_DENIED`,
    /// `TARGET_PORT_CLOSED`, `MISALIGNED`, `NOT_REGISTERED`, ...) and the target's memory is
    /// untouched. The send token is the process's again.
    OperationDone {
        /// The context given with the operation.
        context: u64,
        /// `PUT`, `GET` or `ATOMIC`.
        kind: shared_abi::token::SendKind,
        /// How it ended.
        status: Status,
        /// An atomic's word before it was applied.
        value: u64,
        /// The target node.
        target_node: NodeId,
        /// The target port.
        target_port: PortId,
    },
    /// The process broke its own rings' indexes; the NIC skipped what was published. Tokens in
    /// the skipped range produce no events: their tokens and buffers are lost to the process.
    RingCorrupt,
    /// An event this library does not interpret, or one that names no send or buffer of this
    /// port.
    Other(shared_abi::event::Event),
}
