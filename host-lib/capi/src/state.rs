//! What a C port holds, and the calls that give the NIC work: DMA memory, sends and receive
//! buffers.
//!
//! A C program names DMA memory by pointers, not by `DmaBuffer`s, and may send from or receive
//! into any part of it, as GM's page-granular heap allows ([`crate::dma_heap`]). So the port
//! keeps every allocation itself, posts tokens that name arena offsets, and keeps its own record of each token it posted (a send's callback and context, a
//! receive buffer's address and tag), named in the token's context or tag by a slot and a serial
//! number ([`Slab`]): the NIC's event is matched against that record, never trusted for an
//! address. An allocation the NIC still uses is freed only when the NIC hands it back.
//!
//! The port's token contexts are this layer's alone (it owns the raw port): a send's context
//! names a record of `sends`, a barrier's a record of the barrier records; the event's kind says
//! which.

use core::ffi::{c_uint, c_void};
use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use nicbar_rs::{DmaBuffer, Error, RawPort};
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, max_length_for_size};

use crate::alarms::Alarms;
use crate::barrier::{BarrierEnd, BarrierRecords};
use crate::dma_heap::{DmaHeap, page_rounded};
use crate::events::{BufferInfo, receive_event};
use crate::names::FabricNames;
use crate::receive::CutShort;
use crate::slab::{Slab, name, unname};
use crate::stall::{Connection, HeldSend, Stalls};
use crate::status::{from_error, set_last_error};
use crate::types::*;

/// A send the NIC holds.
#[derive(Debug)]
pub(crate) struct PendingSend {
    pub(crate) callback: gm_send_completion_callback_t,
    pub(crate) context: usize,
    /// Where it goes: a failure stalls this connection.
    pub(crate) connection: Connection,
    /// The allocations the message lies in (their addresses).
    pub(crate) allocations: Vec<usize>,
    /// The send as the program asked for it, to post again while the target port is not open.
    pub(crate) asked: HeldSend,
    /// When it was first posted, and how long to wait before posting it again.
    pub(crate) attempt: Attempt,
}

/// How long a send to a port that is not open is posted again before it ends with
/// GM_SEND_TARGET_PORT_CLOSED: GM's NIC retries a send until the target port opens or the send
/// times out, so a program may send to a peer as soon as it knows its address.
pub(crate) const PEER_OPEN_WAIT: Duration = Duration::from_secs(3);
/// The first wait before a send to a closed port is posted again; it doubles up to
/// [`RETRY_MOST`].
const RETRY_FIRST: Duration = Duration::from_millis(1);
/// The longest wait between posts of a send to a closed port.
const RETRY_MOST: Duration = Duration::from_millis(50);

/// When a send was first posted, and the wait before its next post if its target port is closed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attempt {
    pub(crate) first_posted: Instant,
    pub(crate) delay: Duration,
}

impl Attempt {
    fn new(now: Instant) -> Self {
        Self {
            first_posted: now,
            delay: RETRY_FIRST,
        }
    }
}

/// A send whose target port was closed, to be posted again at `due`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    pub(crate) due: Instant,
    pub(crate) connection: Connection,
    pub(crate) send: HeldSend,
    pub(crate) attempt: Attempt,
}

/// A receive buffer the NIC holds.
#[derive(Debug)]
pub(crate) struct ProvidedBuffer {
    pub(crate) info: BufferInfo,
    pub(crate) arena_offset: u64,
    /// The allocations the bytes its size class holds lie in.
    pub(crate) allocations: Vec<usize>,
    pub(crate) priority: Priority,
}

/// A callback owed to the program, run by gm_unknown.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) callback: gm_send_completion_callback_t,
    pub(crate) context: usize,
    pub(crate) status: gm_status_t,
    /// A NIC atomic's previous value and where the program wants it, written before the
    /// callback runs.
    pub(crate) result: Option<(usize, u64)>,
}

/// A one-sided operation the NIC holds.
#[derive(Debug)]
pub(crate) struct PendingOperation {
    pub(crate) callback: gm_send_completion_callback_t,
    pub(crate) context: usize,
    pub(crate) kind: SendKind,
    pub(crate) node: u16,
    /// Where an atomic's previous value goes (0: nowhere).
    pub(crate) result: usize,
}

/// Everything a port holds, behind its lock.
pub(crate) struct PortState {
    pub(crate) raw: RawPort,
    /// Set once the port can go no further: the status and what happened.
    pub(crate) fatal: Option<(gm_status_t, String)>,
    /// The last receive buffer refused, in words, for gm_unknown to report.
    pub(crate) bad_receive: Option<String>,
    /// Receive buffers whose message its sender cut short, reported and not yet passed to
    /// gm_unknown (which provides them again).
    pub(crate) cut_short: VecDeque<CutShort>,
    /// DMA memory ([`DmaHeap`]).
    heap: DmaHeap<DmaBuffer>,
    pub(crate) sends: Slab<PendingSend>,
    pub(crate) receives: Slab<ProvidedBuffer>,
    /// Sends whose target port was not open, posted again when due ([`PEER_OPEN_WAIT`]).
    pub(crate) retries: VecDeque<Retry>,
    /// Callbacks owed; gm_unknown runs them.
    pub(crate) completions: VecDeque<Completion>,
    /// Completions were queued without a GM_SENT_EVENT saying so yet.
    pub(crate) unannounced: bool,
    /// Events taken while the library waited for something else (a blocking barrier), or made
    /// without the NIC (a refused buffer, a barrier ended at once), to be returned by the next
    /// receive calls, in order.
    pub(crate) deferred: VecDeque<gm_recv_event>,
    /// Barriers posted, barrier buffers provided, and the barrier timeout.
    pub(crate) barriers: BarrierRecords,
    /// The end of the barrier nicbar_barrier waits for, when it has come.
    pub(crate) library_barrier_end: Option<BarrierEnd>,
    pub(crate) empty_polls: u32,
    /// Send tokens the program took with gm_alloc_send_token and has not used or given back.
    pub(crate) reserved_send_tokens: u32,
    /// The alarms set, and the clock.
    pub(crate) alarms: Alarms,
    /// Alarms that fired, whose callbacks gm_unknown runs: (callback, context, alarm address).
    pub(crate) alarm_callbacks: VecDeque<(gm_alarm_callback_t, usize, usize)>,
    /// Connections stalled by a failed send, and the sends they hold.
    pub(crate) stalls: Stalls,
    /// The fabric's names, once asked for (`names`).
    pub(crate) names: Option<FabricNames>,
    /// One-sided operations the NIC holds ([`crate::rdma`]).
    pub(crate) operations: Slab<PendingOperation>,
    /// Memory registered on the port: (address, length, key).
    pub(crate) registered: Vec<(usize, usize, u32)>,
}

/// Why a send could not be posted: the status its callback gets, and the words.
pub(crate) type Refusal = (gm_status_t, String);

impl PortState {
    pub(crate) fn new(raw: RawPort) -> Self {
        Self {
            raw,
            fatal: None,
            bad_receive: None,
            cut_short: VecDeque::new(),
            heap: DmaHeap::default(),
            sends: Slab::new(32),
            receives: Slab::new(16),
            retries: VecDeque::new(),
            completions: VecDeque::new(),
            unannounced: false,
            deferred: VecDeque::new(),
            barriers: BarrierRecords::new(),
            library_barrier_end: None,
            empty_polls: 0,
            reserved_send_tokens: 0,
            alarms: Alarms::new(),
            alarm_callbacks: VecDeque::new(),
            stalls: Stalls::default(),
            names: None,
            operations: Slab::new(16),
            registered: Vec::new(),
        }
    }

    /// Closes the NIC's port (peers' sends to it then end with GM_SEND_TARGET_PORT_CLOSED)
    /// before the DMA memory is released.
    pub(crate) fn close(self) {
        let Self { raw, heap, .. } = self;
        let _ = raw.close();
        drop(heap);
    }

    /// Finds the DMA memory holding `[address, address + len)`: the allocations it lies in and
    /// the arena offset of `address` ([`DmaHeap::cover`]).
    pub(crate) fn locate(&self, address: usize, len: usize) -> Result<(Vec<usize>, u64), String> {
        let covered = self.heap.cover(address, len)?;
        let first = self
            .heap
            .buffer(covered.first)
            .ok_or_else(|| format!("{address:#x} is not DMA memory of this port"))?;
        // Adjacent allocations are adjacent in the arena: one mapping holds them all.
        let offset = first.arena_offset() + (address - covered.first) as u64;
        Ok((covered.allocations, offset))
    }

    pub(crate) fn hold(&mut self, allocations: &[usize]) {
        self.heap.hold(allocations);
    }

    /// The NIC gave back a token naming `allocations`; frees those the program already did.
    pub(crate) fn release(&mut self, allocations: &[usize]) {
        self.heap.release(allocations);
    }

    /// Queues a callback for gm_unknown, and a GM_SENT_EVENT to say so.
    pub(crate) fn complete(
        &mut self,
        callback: gm_send_completion_callback_t,
        context: usize,
        status: gm_status_t,
    ) {
        self.completions.push_back(Completion {
            callback,
            context,
            status,
            result: None,
        });
        self.unannounced = true;
    }

    /// Marks the port dead: every later receive returns GM_FATAL_FIRMWARE_ERROR_EVENT.
    pub(crate) fn die(&mut self, error: &Error) {
        if self.fatal.is_none() {
            self.fatal = Some((from_error(error), error.to_string()));
        }
    }

    /// The status and words of the port's death, if it is dead.
    pub(crate) fn dead(&self) -> Option<Refusal> {
        self.fatal.clone()
    }

    /// Allocates `length` bytes of DMA memory (zeroed if asked), in whole pages as GM does; NULL
    /// with the last error set if the arena has no room.
    pub(crate) fn allocate(&mut self, length: gm_size_t, zeroed: bool) -> *mut c_void {
        let Some(rounded) = usize::try_from(length).ok().and_then(page_rounded) else {
            set_last_error(format!("gm_dma_malloc: {length} bytes is more than memory"));
            return core::ptr::null_mut();
        };
        let mut buffer = match self.raw.dma_alloc(rounded) {
            Ok(buffer) => buffer,
            Err(error) => {
                set_last_error(format!("gm_dma_malloc: {error}"));
                return core::ptr::null_mut();
            }
        };
        if zeroed {
            buffer.fill(0);
        }
        // From here on the program writes the bytes through this pointer; the library never
        // views them again (it only names them to the NIC by offset).
        let pointer = buffer.as_mut_ptr();
        self.heap.insert(pointer as usize, rounded, buffer);
        pointer.cast()
    }

    /// Frees the DMA memory starting at `address`, now or when the NIC gives it back.
    pub(crate) fn free(&mut self, address: usize) {
        if let Err(why) = self.heap.free(address) {
            set_last_error(why);
        }
    }

    /// Records a receive buffer that came back unused, and the event that says so.
    pub(crate) fn refused_receive(&mut self, buffer: BufferInfo, why: String) -> gm_recv_event {
        let message = format!(
            "the receive buffer at {:#x} (tag {}, size {}) came back unused: {why}",
            buffer.address, buffer.tag, buffer.size
        );
        set_last_error(message.clone());
        self.bad_receive = Some(message);
        receive_event(GM_BAD_RECV_TOKEN_EVENT, buffer, 0, 0, 0)
    }

    /// Posts a send token for `len` bytes at `message`; on any refusal the callback is owed
    /// with the reason instead.
    #[allow(
        clippy::too_many_arguments,
        reason = "gm_send_with_callback's arguments, passed through"
    )]
    pub(crate) fn send(
        &mut self,
        message: usize,
        size: c_uint,
        len: gm_size_t,
        priority: c_uint,
        node: c_uint,
        port: c_uint,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) {
        let connection = Connection {
            node,
            port,
            priority,
        };
        let held = HeldSend {
            message,
            size,
            length: len,
            callback,
            context,
        };
        if self.stalls.hold(connection, held).is_none() {
            // Held until gm_resume_sending or gm_drop_sends.
            return;
        }
        self.post(connection, held, Attempt::new(Instant::now()));
    }

    /// Posts `send` to `connection` (a first post or a retry); on any refusal the callback is
    /// owed with the reason instead.
    fn post(&mut self, connection: Connection, send: HeldSend, attempt: Attempt) {
        if let Err((status, why)) = self.try_send(connection, send, attempt) {
            set_last_error(format!("gm_send_with_callback: {why}"));
            self.complete(send.callback, send.context, status);
        }
    }

    /// A send ended with GM_SEND_TARGET_PORT_CLOSED: posts it again later if it has not waited
    /// [`PEER_OPEN_WAIT`] yet. Whether it will be.
    pub(crate) fn retry_if_closed(&mut self, send: &PendingSend, status: gm_status_t) -> bool {
        let now = Instant::now();
        if status != GM_SEND_TARGET_PORT_CLOSED
            || now.duration_since(send.attempt.first_posted) >= PEER_OPEN_WAIT
        {
            return false;
        }
        self.retries.push_back(Retry {
            due: now + send.attempt.delay,
            connection: send.connection,
            send: send.asked,
            attempt: Attempt {
                first_posted: send.attempt.first_posted,
                delay: (send.attempt.delay * 2).min(RETRY_MOST),
            },
        });
        true
    }

    /// Posts the sends to closed ports whose wait is over.
    pub(crate) fn post_due_retries(&mut self, now: Instant) {
        while self.retries.front().is_some_and(|retry| retry.due <= now) {
            if let Some(retry) = self.retries.pop_front() {
                self.post(retry.connection, retry.send, retry.attempt);
            }
        }
    }

    /// When the next send to a closed port is posted again.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.retries.iter().map(|retry| retry.due).min()
    }

    fn try_send(
        &mut self,
        connection: Connection,
        asked: HeldSend,
        attempt: Attempt,
    ) -> Result<(), Refusal> {
        let HeldSend {
            message,
            size,
            length: len,
            callback,
            context,
        } = asked;
        let Connection {
            node,
            port,
            priority,
        } = connection;
        let invalid = |why: String| Err((GM_INVALID_PARAMETER, why));
        if let Some(death) = self.dead() {
            return Err(death);
        }
        let Some(size_class) = size_class(size) else {
            return invalid(format!(
                "size class {size} is not within 3..={MAX_SIZE_CLASS}"
            ));
        };
        #[allow(
            clippy::useless_conversion,
            reason = "gm_size_t is an unsigned long, 32 bits on some hosts"
        )]
        if let Some(why) = crate::sizes::refuse_length(size, u64::from(len)) {
            return invalid(why);
        }
        if priority >= PRIORITIES {
            return invalid(format!(
                "priority {priority} is neither GM_LOW_PRIORITY nor GM_HIGH_PRIORITY"
            ));
        }
        let Ok(node) = u16::try_from(node) else {
            return invalid(format!("node id {node} is out of range"));
        };
        let target_port = u8::try_from(port)
            .ok()
            .filter(|p| usize::from(*p) < PORTS_PER_NIC);
        let Some(target_port) = target_port else {
            return invalid(format!(
                "port id {port} is not a port of a NIC (0..{PORTS_PER_NIC})"
            ));
        };
        let (allocations, offset) = self
            .locate(message, len as usize)
            .map_err(|why| (GM_INVALID_PARAMETER, why))?;
        let reserved = self.reserved_send_tokens > 0;
        if !reserved && self.raw.send_tokens() <= self.reserved_send_tokens {
            return Err((
                GM_TRY_AGAIN,
                "no send token is free: wait for sends to complete".to_owned(),
            ));
        }
        let connection = Connection {
            node: u32::from(node),
            port,
            priority,
        };
        let (slot, serial) = self.sends.insert(PendingSend {
            callback,
            context,
            connection,
            allocations: allocations.clone(),
            asked,
            attempt,
        });
        let token = SendToken {
            kind: SendKind::DATA,
            priority: Priority(priority as u8),
            size: size_class,
            target_node: NodeId::new(node),
            target_port: PortId(target_port),
            length: (len as u32).into(),
            buffer: offset.into(),
            context: name(slot, serial).into(),
            ..SendToken::default()
        };
        if let Err(error) = self.raw.post_send(&token) {
            self.sends.remove(slot, serial);
            return Err((from_error(&error), error.to_string()));
        }
        if reserved {
            self.reserved_send_tokens -= 1;
        }
        self.hold(&allocations);
        Ok(())
    }

    /// Posts a receive token for the buffer at `address`; on any refusal a
    /// GM_BAD_RECV_TOKEN_EVENT is queued instead.
    pub(crate) fn provide(&mut self, address: usize, size: c_uint, priority: c_uint, tag: u32) {
        if let Err(why) = self.try_provide(address, size, priority, tag) {
            let info = BufferInfo {
                address,
                tag,
                size: size.min(255) as u8,
            };
            let event = self.refused_receive(info, why);
            self.deferred.push_back(event);
        }
    }

    fn try_provide(
        &mut self,
        address: usize,
        size: c_uint,
        priority: c_uint,
        tag: u32,
    ) -> Result<(), String> {
        if let Some((_, why)) = self.dead() {
            return Err(why);
        }
        let Some(size_class) = size_class(size) else {
            return Err(format!(
                "size class {size} is not within 3..={MAX_SIZE_CLASS}"
            ));
        };
        if priority >= PRIORITIES {
            return Err(format!(
                "priority {priority} is neither GM_LOW_PRIORITY nor GM_HIGH_PRIORITY"
            ));
        }
        let needed = max_length_for_size(size_class) as usize;
        let (allocations, arena_offset) = self.locate(address, needed)?;
        if self.raw.receive_tokens() == 0 {
            return Err("no receive token is free".to_owned());
        }
        let (slot, serial) = self.receives.insert(ProvidedBuffer {
            info: BufferInfo {
                address,
                tag,
                size: size_class,
            },
            arena_offset,
            allocations: allocations.clone(),
            priority: Priority(priority as u8),
        });
        if slot > 0xffff {
            self.receives.remove(slot, serial);
            return Err("too many receive buffers outstanding".to_owned());
        }
        // The token's tag names the record (16 bits of slot, 16 of serial); the program's tag
        // stays in the record.
        let token = ReceiveToken {
            kind: ReceiveKind::BUFFER,
            priority: Priority(priority as u8),
            size: size_class,
            tag: (serial << 16 | slot).into(),
            buffer: arena_offset.into(),
            ..ReceiveToken::default()
        };
        if let Err(error) = self.raw.post_receive(&token) {
            self.receives.remove(slot, serial);
            return Err(error.to_string());
        }
        self.hold(&allocations);
        Ok(())
    }

    /// A send to `connection` ended with `status`: a failure stalls the connection (GM's
    /// behaviour; gm_resume_sending or gm_drop_sends ends the stall).
    pub(crate) fn send_ended(&mut self, connection: Connection, status: gm_status_t) {
        if status != GM_SUCCESS {
            self.stalls.failed(connection);
        }
    }

    /// gm_resume_sending: ends the stall of `connection`, sends what it held (in order), and owes
    /// `callback` GM_SUCCESS.
    pub(crate) fn resume_sending(
        &mut self,
        connection: Connection,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) {
        for held in self.stalls.release(connection) {
            self.send(
                held.message,
                held.size,
                held.length,
                connection.priority,
                connection.node,
                connection.port,
                held.callback,
                held.context,
            );
        }
        self.complete(callback, context, GM_SUCCESS);
    }

    /// gm_drop_sends: ends the stall of `connection`, ending what it held with GM_SEND_DROPPED,
    /// and owes `callback` GM_SUCCESS.
    pub(crate) fn drop_sends(
        &mut self,
        connection: Connection,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) {
        for held in self.stalls.release(connection) {
            self.complete(held.callback, held.context, GM_SEND_DROPPED);
        }
        self.complete(callback, context, GM_SUCCESS);
    }

    /// gm_alloc_send_token: takes a free send token for a send to come (the next send uses it).
    /// Whether there was one.
    pub(crate) fn alloc_send_token(&mut self) -> bool {
        if self.raw.send_tokens() > self.reserved_send_tokens {
            self.reserved_send_tokens += 1;
            true
        } else {
            false
        }
    }

    /// gm_free_send_tokens: gives back `count` tokens taken and not used.
    pub(crate) fn free_send_tokens(&mut self, count: u32) {
        self.reserved_send_tokens = self.reserved_send_tokens.saturating_sub(count);
    }

    /// Whether a send could take a token now (gm_send_token_available).
    pub(crate) fn send_token_available(&self) -> bool {
        self.reserved_send_tokens > 0 || self.raw.send_tokens() > 0
    }

    /// Takes the record of the receive buffer a token's tag names, releasing its memory.
    pub(crate) fn take_receive(&mut self, tag: u32) -> Option<ProvidedBuffer> {
        let provided = self.receives.remove(tag & 0xffff, tag >> 16)?;
        self.release(&provided.allocations);
        Some(provided)
    }

    /// Takes the record of the send a token's context names, releasing its memory.
    pub(crate) fn take_send(&mut self, context: u64) -> Option<PendingSend> {
        let (slot, serial) = unname(context);
        let send = self.sends.remove(slot, serial)?;
        self.release(&send.allocations);
        Some(send)
    }
}

/// The size class `size` names, if it is one the NIC takes buffers of.
pub(crate) fn size_class(size: c_uint) -> Option<u8> {
    crate::sizes::nic_size_class(size)
}

impl PortState {
    /// The fabric's names, asked of the daemon the first time.
    ///
    /// # Errors
    /// The status and words if the daemon did not answer: GM_TIMED_OUT if it was too slow,
    /// else GM_FAILURE.
    pub(crate) fn fabric_names(&mut self) -> Result<&FabricNames, (gm_status_t, String)> {
        if self.names.is_none() {
            let nodes = self.raw.fabric_nodes().map_err(|error| {
                let status = match &error {
                    Error::Io(io) if io.kind() == io::ErrorKind::TimedOut => GM_TIMED_OUT,
                    _ => GM_FAILURE,
                };
                (
                    status,
                    format!("the daemon did not name the fabric's nodes: {error}"),
                )
            })?;
            self.names = Some(FabricNames::new(nodes));
        }
        Ok(self.names.get_or_insert_with(FabricNames::default))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_names_round_trip_and_size_classes_are_the_nics() {
        assert_eq!(unname(name(7, 0xdead_beef)), (7, 0xdead_beef));
        assert_eq!(unname(name(u32::MAX, 1)), (u32::MAX, 1));
        assert_eq!(size_class(3), Some(3));
        assert_eq!(size_class(13), Some(13));
        assert_eq!(size_class(2), None);
        assert_eq!(size_class(300), None);
    }
}
