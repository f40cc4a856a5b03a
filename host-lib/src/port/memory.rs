//! The port's one-sided operations: registered memory, puts, gets, NIC atomics and fences.
//!
//! Ordering: a port's operations and messages toward one node start in the order they were
//! posted and are applied at the target in that order (every packet rides the connection's
//! reliable sequence, which also makes each exactly-once: a duplicate request or reply is dropped
//! by its sequence number and never applied twice). Completion events of operations to different
//! nodes may come in any order; [`Port::fence`] waits for every put to a node (or to all nodes).

use shared_abi::ids::{NodeId, PortId};
use shared_abi::rdma::{AtomicOp, RemotePointer};
use shared_abi::ring::Wake;
use shared_abi::token::{SendKind, SendToken};

use super::Port;
use crate::error::Error;
use crate::raw::memory::SharedBytes;

/// Memory of this process registered with a port: its bytes (read and written atomically, since
/// the NIC may write them at any time) and the key remote pointers to it carry.
#[derive(Clone, Debug)]
pub struct MemoryRegion {
    bytes: SharedBytes,
    key: u32,
}

impl MemoryRegion {
    /// The bytes.
    pub fn bytes(&self) -> &SharedBytes {
        &self.bytes
    }

    /// The region's key.
    pub fn key(&self) -> u32 {
        self.key
    }

    /// Bytes in the region.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the region is empty (never: a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The remote pointer (GM's `gm_remote_ptr_t`) to byte `offset` of the region, for peers to
    /// put to, get from and apply atomics at (hand it to them in a message).
    pub fn remote(&self, offset: u32) -> u64 {
        RemotePointer {
            key: self.key,
            offset,
        }
        .to_u64()
    }

    /// The process address of `len` bytes at `offset`, if they lie in the region.
    fn local(&self, offset: usize, len: usize) -> Result<u64, Error> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes.len() => Ok(self.bytes.as_ptr() as u64 + offset as u64),
            _ => Err(Error::TooLong {
                length: offset.saturating_add(len),
                max: self.bytes.len(),
            }),
        }
    }
}

impl Port {
    /// Allocates `len` bytes of this process's memory and registers them with the port
    /// (`gm_register_memory`): in the port's DMA arena while it has room to spare (the emulated
    /// NIC maps it too, and copies to and from it with no system call), else on the heap. The region lives until [`Port::deregister_memory`] or the port
    /// closes; the port keeps its bytes alive until then.
    ///
    /// # Errors
    /// [`Error::Refused`] with the daemon's reason: the port's table is full, or the kernel
    /// refused the daemon access to this process's memory (it needs the same user and, under
    /// Yama, `kernel.yama.ptrace_scope` 0).
    pub fn register_memory(&mut self, len: usize) -> Result<MemoryRegion, Error> {
        let bytes = self
            .endpoint
            .raw()
            .arena_bytes(len)
            .unwrap_or_else(|| SharedBytes::zeroed(len));
        let key = self.endpoint.raw().register_shared(&bytes)?;
        let region = MemoryRegion { bytes, key };
        self.registered.push(region.clone());
        Ok(region)
    }

    /// Deregisters `region` (`gm_deregister_memory`): peers' operations on it are refused with
    /// `BAD_KEY` from now on.
    ///
    /// # Errors
    /// [`Error::Refused`] if it is not registered on this port.
    pub fn deregister_memory(&mut self, region: &MemoryRegion) -> Result<(), Error> {
        self.endpoint
            .raw()
            .deregister_memory(region.bytes.as_ptr(), region.bytes.len())?;
        self.registered.retain(|kept| kept.key != region.key);
        Ok(())
    }

    /// Lets peers put, get and apply atomics to this port's registered memory
    /// (`gm_allow_remote_memory_access`). Until then the NIC refuses them with
    /// `REMOTE_ACCESS_DENIED`.
    ///
    /// # Errors
    /// A control protocol error.
    pub fn allow_remote_memory_access(&mut self) -> Result<(), Error> {
        self.endpoint.raw().allow_remote_memory_access()
    }

    /// Puts `len` bytes of `local` from `offset` to the remote pointer `remote` of `port` on
    /// `node` (`gm_put`, `gm_directed_send_with_callback`). Its [`crate::Event::OperationDone`]
    /// comes when the bytes are in the target's memory. Any length: the NIC cuts it into packets.
    ///
    /// # Errors
    /// [`Error::TooLong`] if the range is outside `local`; [`Error::NoSendTokens`].
    #[allow(
        clippy::too_many_arguments,
        reason = "the shape of GM's gm_put, which the C API wraps one to one"
    )]
    pub fn put(
        &mut self,
        local: &MemoryRegion,
        offset: usize,
        remote: u64,
        len: usize,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let address = local.local(offset, len)?;
        self.post_operation(SendKind::PUT, address, remote, len, node, port, context)
    }

    /// Gets `len` bytes from the remote pointer `remote` of `port` on `node` into `local` at
    /// `offset` (`gm_get`). Its [`crate::Event::OperationDone`] comes when they are in `local`.
    ///
    /// # Errors
    /// As [`Port::put`].
    #[allow(
        clippy::too_many_arguments,
        reason = "the shape of GM's gm_get, which the C API wraps one to one"
    )]
    pub fn get(
        &mut self,
        remote: u64,
        local: &MemoryRegion,
        offset: usize,
        len: usize,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let address = local.local(offset, len)?;
        self.post_operation(SendKind::GET, address, remote, len, node, port, context)
    }

    /// Applies the atomic `op` to the aligned 64-bit word at the remote pointer `remote` of
    /// `port` on `node`, with `operand` (and `compare`, for compare-and-swap). The target NIC
    /// applies it exactly once; the word's previous value comes in the
    /// [`crate::Event::OperationDone`]'s `value`.
    ///
    /// # Errors
    /// [`Error::NoSendTokens`].
    #[allow(
        clippy::too_many_arguments,
        reason = "an operation, its operands and its target, as the C call takes them"
    )]
    pub fn atomic(
        &mut self,
        op: AtomicOp,
        remote: u64,
        operand: u64,
        compare: u64,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let token = SendToken {
            kind: SendKind::ATOMIC,
            target_node: node,
            target_port: port,
            length: 8.into(),
            remote: remote.into(),
            operand: operand.into(),
            compare: compare.into(),
            op,
            ..SendToken::default()
        };
        self.endpoint.post_operation(token, context)
    }

    /// Waits until every put this port issued to `node` (to every node if `None`) is complete at
    /// its target (ARMCI's fence). Events that arrive meanwhile are kept for
    /// [`Port::receive`], in order.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] if the daemon exits meanwhile.
    pub fn fence(&mut self, node: Option<NodeId>) -> Result<(), Error> {
        while self.endpoint.puts_outstanding(node) > 0 {
            // A put completes with its SENT event: every one must wake it.
            if let Some(event) = self.wait_from_ring(None, Wake::ANY)? {
                self.keep_unless_absorbed(event);
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments, reason = "one token's fields, named")]
    fn post_operation(
        &mut self,
        kind: SendKind,
        address: u64,
        remote: u64,
        len: usize,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let length = u32::try_from(len).map_err(|_| Error::TooLong {
            length: len,
            max: u32::MAX as usize,
        })?;
        let token = SendToken {
            kind,
            target_node: node,
            target_port: port,
            length: length.into(),
            buffer: address.into(),
            remote: remote.into(),
            ..SendToken::default()
        };
        self.endpoint.post_operation(token, context)
    }
}
