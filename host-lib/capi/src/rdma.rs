//! One-sided operations of the C API: registered memory (`gm_register_memory`), `gm_put`,
//! `gm_get`, `gm_directed_send_with_callback`, the NIC atomics (`nicbar_atomic_*`) and
//! `nicbar_fence`. Each operation's callback is owed, with a GM_SENT_EVENT, when its SENT event
//! comes: for a put once the data is in the target's memory, for a get once it is in ours, for
//! an atomic once it was applied (its previous value written to the program's result first).

use core::ffi::c_uint;

use nicbar_rs::raw::{self, RawEvent};
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::rdma::{AtomicOp, RemotePointer};
use shared_abi::ring::Wake;
use shared_abi::token::{SendKind, SendToken};

use crate::events::simple_event;
use crate::slab::{name, unname};
use crate::state::{PendingOperation, PortState, Refusal};
use crate::status::{from_error, from_nic, set_last_error};
use crate::types::*;

/// Token contexts of one-sided operations carry this bit (sends' never do: their serials are
/// 16 bits).
const OPERATION_BIT: u64 = 1 << 63;

/// What one operation asks of the NIC.
pub(crate) struct Request {
    pub(crate) kind: SendKind,
    pub(crate) local: usize,
    pub(crate) remote: gm_remote_ptr_t,
    pub(crate) length: u64,
    pub(crate) node: c_uint,
    pub(crate) port: c_uint,
    pub(crate) op: AtomicOp,
    pub(crate) operand: u64,
    pub(crate) compare: u64,
    pub(crate) result: usize,
}

impl PortState {
    /// `gm_register_memory`'s answer: the registration of `length` bytes at `address` (made
    /// by the FFI edge, which vouches for the memory) is recorded, or its failure reported.
    pub(crate) fn registered_memory(
        &mut self,
        address: usize,
        length: usize,
        registered: Result<u32, nicbar_rs::Error>,
    ) -> gm_status_t {
        match registered {
            Ok(key) => {
                self.registered.push((address, length, key));
                GM_SUCCESS
            }
            Err(error) => {
                set_last_error(format!("gm_register_memory: {error}"));
                from_error(&error)
            }
        }
    }

    /// `gm_deregister_memory`.
    pub(crate) fn deregister_memory(&mut self, address: usize, length: usize) -> gm_status_t {
        match self.raw.deregister_memory(address as *const u8, length) {
            Ok(()) => {
                self.registered
                    .retain(|&(a, l, _)| (a, l) != (address, length));
                GM_SUCCESS
            }
            Err(error) => {
                set_last_error(format!("gm_deregister_memory: {error}"));
                from_error(&error)
            }
        }
    }

    /// `gm_allow_remote_memory_access`.
    pub(crate) fn allow_remote_memory_access(&mut self) -> gm_status_t {
        match self.raw.allow_remote_memory_access() {
            Ok(()) => GM_SUCCESS,
            Err(error) => {
                set_last_error(format!("gm_allow_remote_memory_access: {error}"));
                from_error(&error)
            }
        }
    }

    /// `nicbar_remote_ptr`: the remote pointer to the registered byte at `address`, or 0.
    pub(crate) fn remote_pointer(&self, address: usize) -> gm_remote_ptr_t {
        let found = self
            .registered
            .iter()
            .find(|&&(start, length, _)| address >= start && address - start < length);
        match found {
            Some(&(start, _, key)) => match u32::try_from(address - start) {
                Ok(offset) => RemotePointer { key, offset }.to_u64(),
                Err(_) => 0,
            },
            None => {
                set_last_error(format!(
                    "nicbar_remote_ptr: {address:#x} is not in memory registered on this port"
                ));
                0
            }
        }
    }

    /// Posts a put, get or atomic; on any refusal its callback is owed with the reason instead.
    pub(crate) fn post_operation(
        &mut self,
        function: &str,
        request: Request,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) {
        if let Err((status, why)) = self.try_post_operation(request, callback, context) {
            set_last_error(format!("{function}: {why}"));
            self.complete(callback, context, status);
        }
    }

    fn try_post_operation(
        &mut self,
        request: Request,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) -> Result<(), Refusal> {
        let invalid = |why: String| Err((GM_INVALID_PARAMETER, why));
        if let Some(death) = self.dead() {
            return Err(death);
        }
        let Ok(node) = u16::try_from(request.node) else {
            return invalid(format!("node id {} is out of range", request.node));
        };
        let Some(port) = u8::try_from(request.port)
            .ok()
            .filter(|p| usize::from(*p) < PORTS_PER_NIC)
        else {
            return invalid(format!(
                "port id {} is not a port of a NIC (0..{PORTS_PER_NIC})",
                request.port
            ));
        };
        let Ok(length) = u32::try_from(request.length) else {
            return invalid(format!(
                "{} bytes is longer than one operation moves (4 GiB)",
                request.length
            ));
        };
        if self.raw.send_tokens() <= self.reserved_send_tokens {
            return Err((
                GM_TRY_AGAIN,
                "no send token is free: wait for operations to complete".to_owned(),
            ));
        }
        let (slot, serial) = self.operations.insert(PendingOperation {
            callback,
            context,
            kind: request.kind,
            node,
            result: request.result,
        });
        let token = SendToken {
            kind: request.kind,
            target_node: NodeId::new(node),
            target_port: PortId(port),
            length: length.into(),
            buffer: (request.local as u64).into(),
            remote: request.remote.into(),
            operand: request.operand.into(),
            compare: request.compare.into(),
            op: request.op,
            context: (name(slot, serial) | OPERATION_BIT).into(),
            ..SendToken::default()
        };
        if let Err(error) = self.raw.post_send(&token) {
            self.operations.remove(slot, serial);
            return Err((from_error(&error), error.to_string()));
        }
        Ok(())
    }

    /// The end of one of this port's operations, if `event` is one: `Some` of what the
    /// program sees of it.
    pub(crate) fn operation_event(&mut self, event: &RawEvent) -> Option<Option<gm_recv_event>> {
        let ends_a_send = event.kind == EventKind::SENT
            || (event.kind == EventKind::TOKEN_REJECTED
                && !raw::is_ring_corrupt(event)
                && !raw::is_receive_rejection(event));
        let context = event.context.get();
        if !ends_a_send || context & OPERATION_BIT == 0 {
            return None;
        }
        let (slot, serial) = unname(context & !OPERATION_BIT);
        let Some(operation) = self.operations.remove(slot, serial) else {
            return Some(None);
        };
        if event.status != Status::SUCCESS {
            set_last_error(format!(
                "a {} to node {} failed: {}",
                match operation.kind {
                    SendKind::PUT => "put",
                    SendKind::GET => "get",
                    _ => "NIC atomic",
                },
                operation.node,
                refusal(event.status)
            ));
        }
        self.complete(
            operation.callback,
            operation.context,
            status_of(event.status),
        );
        if event.status == Status::SUCCESS
            && operation.kind == SendKind::ATOMIC
            && operation.result != 0
            && let Some(completion) = self.completions.back_mut()
        {
            completion.result = Some((operation.result, event.buffer.get()));
        }
        self.unannounced = false;
        Some(Some(simple_event(GM_SENT_EVENT)))
    }

    /// Puts this port has outstanding toward `node` (every node for `None`).
    fn puts_outstanding(&self, node: Option<u16>) -> bool {
        self.operations
            .iter()
            .any(|op| op.kind == SendKind::PUT && node.is_none_or(|node| op.node == node))
    }

    /// `nicbar_fence`: waits until every put to `node` (every node for `None`) is complete at
    /// its target; events that come meanwhile are kept for the next receive calls.
    pub(crate) fn fence(&mut self, node: Option<u16>) -> gm_status_t {
        while self.puts_outstanding(node) {
            if let Some(death) = self.dead() {
                return death.0;
            }
            match self.raw.next_event() {
                Ok(Some(event)) => {
                    if let Some(event) = self.translate(event) {
                        self.deferred.push_back(event);
                    }
                }
                Ok(None) => {
                    // A put completes with its send's end: every one must wake it.
                    if let Err(error) = self.raw.wait(None, None, Wake::ANY) {
                        self.die(&error);
                    }
                }
                Err(error) => self.die(&error),
            }
        }
        GM_SUCCESS
    }
}

/// The GM status of a one-sided operation's end: GM's where it has one, else the nearest.
fn status_of(status: Status) -> gm_status_t {
    match status {
        Status::BAD_KEY | Status::REMOTE_ACCESS_DENIED | Status::NOT_REGISTERED => {
            GM_PERMISSION_DENIED
        }
        Status::OUT_OF_BOUNDS | Status::MISALIGNED => GM_INVALID_PARAMETER,
        Status::MEMORY_FAULT => GM_MEMORY_FAULT,
        other => from_nic(other),
    }
}

/// The rule a refused operation broke, in words.
fn refusal(status: Status) -> &'static str {
    match status {
        Status::BAD_KEY => "the target has no region with this key (bad key, or deregistered)",
        Status::OUT_OF_BOUNDS => "the range reaches outside the target's region",
        Status::REMOTE_ACCESS_DENIED => "the target port has not allowed remote memory access",
        Status::TARGET_PORT_CLOSED => "the target port is closed",
        Status::MISALIGNED => "the word is not 8-byte aligned (or the atomic is unknown)",
        Status::NOT_REGISTERED => "the local buffer is not in memory registered on this port",
        Status::MEMORY_FAULT => "the kernel refused the NIC access to a process's memory",
        Status::TARGET_NODE_UNREACHABLE => "the target node does not answer",
        Status::SEND_TIMED_OUT => "the target never answered",
        _ => "refused",
    }
}
