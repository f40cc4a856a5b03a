//! Ports from C: opening and closing, DMA memory, sends, receive buffers, and events.
//!
//! A C program names DMA memory by pointers, not by [`crate::DmaBuffer`]s, and may send from or
//! receive into any part of it. So the C port keeps every allocation itself, posts tokens that
//! name arena offsets, and keeps its own record of each token it posted (a send's callback and
//! context, a receive buffer's address and tag), keyed by the token's context or tag: the NIC's
//! event is matched against that record, never trusted for an address. An allocation the NIC
//! still uses is freed only when the NIC hands it back.

use core::ffi::{c_char, c_uint, c_void};
use std::cell::UnsafeCell;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, MTU_PAYLOAD, max_length_for_size, min_size_for_length};

use super::barrier::BarrierRecords;
use super::bytes::hton_pointer;
use super::status::{exit_with, fail, from_error, from_nic, guard, set_last_error};
use super::types::*;
use crate::{DmaBuffer, Error, Event, Port, WaitMode};

/// How long gm_blocking_receive spins on the event ring before it sleeps on the doorbell.
const BLOCKING_SPIN: Duration = Duration::from_micros(20);
/// The longest a blocking receive holds the port's lock in one wait: other threads' calls on the
/// port get in between.
const BLOCKING_SLICE: Duration = Duration::from_millis(10);
/// Empty polls of gm_receive between checks that the daemon is still there.
const POLLS_PER_LIVENESS_CHECK: u32 = 1 << 14;
/// Send contexts this layer makes carry this bit in their low word: the Rust port's own sends
/// number their slots from 0, so the two never name the same send.
const SEND_CONTEXT_MARK: u64 = 1 << 31;
/// Highest API version gm_open accepts (GM 2.0.16).
const NEWEST_API_VERSION: c_uint = 0x20010;

/// The ports open in this process, by address: a handle that is not here (closed, or never a
/// port) is refused instead of used.
static OPEN_PORTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// How many gm_init calls are outstanding.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

/// The event returned for a NULL or unknown port: no event.
static NO_EVENT: NoEvent = NoEvent(gm_recv_event {
    recv: gm_recv_t {
        nicbar_tag: gm_u32_n_t { n: 0 },
        _reserved: [gm_u8_n_t { n: 0 }; 28],
        message: gm_up_n_t { n: 0 },
        buffer: gm_up_n_t { n: 0 },
        reserved_after_buffer: gm_u32_n_t { n: 0 },
        length: gm_u32_n_t { n: 0 },
        sender_node_id: gm_u16_n_t { n: 0 },
        reserved_after_sender_node_id: gm_u16_n_t { n: 0 },
        tag: gm_u8_n_t { n: 0 },
        size: gm_u8_n_t { n: 0 },
        sender_port_id: gm_u8_n_t { n: 0 },
        r#type: gm_u8_n_t {
            n: GM_NO_RECV_EVENT,
        },
    },
});

/// A static event, shared read-only by every thread.
struct NoEvent(gm_recv_event);
// SAFETY: the event is never written (C is told not to write events), so sharing it is sharing
// plain immutable bytes.
unsafe impl Sync for NoEvent {}

/// An open port (GM's `struct gm_port`). Opaque: C holds a pointer from gm_open and passes it
/// back; gm_close frees it.
pub struct gm_port {
    state: Mutex<PortState>,
    /// The event the last receive call returned; C reads it through the pointer it was given,
    /// until its next receive call.
    event: UnsafeCell<gm_recv_event>,
    /// gm_unknown calls running callbacks: a gm_close from a callback waits for them.
    callbacks_running: AtomicU32,
    /// gm_close was called from a callback; gm_unknown closes the port when its callbacks return.
    close_requested: AtomicBool,
}

/// DMA memory the C program allocated.
#[derive(Debug)]
pub(super) struct Allocation {
    buffer: DmaBuffer,
    /// Tokens the NIC holds that name this memory.
    in_flight: u32,
    /// gm_dma_free was called while the NIC held it: freed when the last token comes back.
    freed: bool,
}

/// A send the NIC holds.
#[derive(Debug)]
pub(super) struct PendingSend {
    pub(super) callback: gm_send_completion_callback_t,
    pub(super) context: usize,
    /// The allocation sent from (its address).
    pub(super) allocation: Option<usize>,
}

/// A receive buffer the NIC holds.
#[derive(Debug)]
struct ProvidedBuffer {
    address: usize,
    arena_offset: u64,
    allocation: usize,
    tag: u32,
    size: u8,
    priority: Priority,
}

/// A callback owed to the program, run by gm_unknown.
#[derive(Debug)]
pub(super) struct Completion {
    pub(super) callback: gm_send_completion_callback_t,
    pub(super) context: usize,
    pub(super) status: gm_status_t,
}

/// A table of records named by a slot and a serial number, so that a stale or forged name finds
/// nothing.
#[derive(Debug)]
pub(super) struct Slab<T> {
    entries: Vec<Option<(u32, T)>>,
    free: Vec<u32>,
    serial: u32,
    serial_mask: u32,
}

impl<T> Slab<T> {
    /// A table whose serial numbers have `serial_bits` bits.
    pub(super) fn new(serial_bits: u32) -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            serial: 0,
            serial_mask: u32::MAX >> (32 - serial_bits),
        }
    }

    /// Stores `value`; returns its slot and serial.
    pub(super) fn insert(&mut self, value: T) -> (u32, u32) {
        self.serial = self.serial.wrapping_add(1) & self.serial_mask;
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.entries.push(None);
                (self.entries.len() - 1) as u32
            }
        };
        self.entries[slot as usize] = Some((self.serial, value));
        (slot, self.serial)
    }

    /// The record at `slot` if its serial is `serial`.
    pub(super) fn get(&self, slot: u32, serial: u32) -> Option<&T> {
        match self.entries.get(slot as usize)? {
            Some((stored, value)) if *stored == serial => Some(value),
            _ => None,
        }
    }

    /// The record at `slot` if its serial is `serial`, to change.
    pub(super) fn get_mut(&mut self, slot: u32, serial: u32) -> Option<&mut T> {
        match self.entries.get_mut(slot as usize)? {
            Some((stored, value)) if *stored == serial => Some(value),
            _ => None,
        }
    }

    /// Takes the record at `slot` if its serial is `serial`.
    pub(super) fn remove(&mut self, slot: u32, serial: u32) -> Option<T> {
        let entry = self.entries.get_mut(slot as usize)?;
        if entry.as_ref()?.0 != serial {
            return None;
        }
        let (_, value) = entry.take()?;
        self.free.push(slot);
        Some(value)
    }
}

/// Everything a port holds, behind its lock.
pub(super) struct PortState {
    pub(super) port: Port,
    /// Set once the port can go no further: the status and what happened.
    pub(super) fatal: Option<(gm_status_t, String)>,
    /// The last receive buffer refused, in words, for gm_unknown to report.
    bad_receive: Option<String>,
    /// DMA memory by start address.
    allocations: BTreeMap<usize, Allocation>,
    pub(super) sends: Slab<PendingSend>,
    receives: Slab<ProvidedBuffer>,
    /// Callbacks owed; gm_unknown runs them.
    pub(super) completions: VecDeque<Completion>,
    /// Completions were queued without a GM_SENT_EVENT saying so yet.
    pub(super) unannounced: bool,
    /// Events taken while the library waited for something else (a blocking barrier), to be
    /// returned by the next receive calls, in order.
    pub(super) deferred: VecDeque<gm_recv_event>,
    /// Barriers posted, and the barrier timeout.
    pub(super) barriers: BarrierRecords,
    empty_polls: u32,
}

impl PortState {
    fn new(port: Port) -> Self {
        Self {
            port,
            fatal: None,
            bad_receive: None,
            allocations: BTreeMap::new(),
            sends: Slab::new(32),
            receives: Slab::new(16),
            completions: VecDeque::new(),
            unannounced: false,
            deferred: VecDeque::new(),
            barriers: BarrierRecords::new(),
            empty_polls: 0,
        }
    }

    /// Finds the allocation holding `[address, address + len)`: its start and the arena offset
    /// of `address`.
    pub(super) fn locate(&self, address: usize, len: usize) -> Result<(usize, u64), String> {
        let end = address
            .checked_add(len)
            .ok_or_else(|| format!("{address:#x} + {len} bytes wraps around"))?;
        let found = self.allocations.range(..=address).next_back();
        match found {
            Some((&start, allocation))
                if !allocation.freed
                    && end <= start + allocation.buffer.len()
                    && (address < start + allocation.buffer.len() || len == 0) =>
            {
                let offset = allocation.buffer.arena_offset() + (address - start) as u64;
                Ok((start, offset))
            }
            _ => Err(format!(
                "{len} bytes at {address:#x} are not inside DMA memory of this port from \
                 gm_dma_malloc"
            )),
        }
    }

    pub(super) fn hold(&mut self, allocation: usize) {
        if let Some(allocation) = self.allocations.get_mut(&allocation) {
            allocation.in_flight += 1;
        }
    }

    /// The NIC gave back a token naming `allocation`; frees it if the program already did.
    pub(super) fn release(&mut self, allocation: usize) {
        if let Some(entry) = self.allocations.get_mut(&allocation) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            if entry.freed && entry.in_flight == 0 {
                self.allocations.remove(&allocation);
            }
        }
    }

    /// Queues a callback for gm_unknown, and a GM_SENT_EVENT to say so.
    pub(super) fn complete(
        &mut self,
        callback: gm_send_completion_callback_t,
        context: usize,
        status: gm_status_t,
    ) {
        self.completions.push_back(Completion {
            callback,
            context,
            status,
        });
        self.unannounced = true;
    }

    /// Marks the port dead: every later receive returns GM_FATAL_FIRMWARE_ERROR_EVENT.
    pub(super) fn die(&mut self, error: &Error) {
        if self.fatal.is_none() {
            self.fatal = Some((from_error(error), error.to_string()));
        }
    }

    /// An event that needs no look at the NIC: deferred, unannounced completions, death.
    fn ready_event(&mut self) -> Option<gm_recv_event> {
        if let Some(event) = self.deferred.pop_front() {
            return Some(event);
        }
        if self.unannounced {
            self.unannounced = false;
            return Some(simple_event(GM_SENT_EVENT));
        }
        self.fatal.as_ref().map(|(status, _)| fatal_event(*status))
    }

    /// The next event for gm_receive: never waits.
    fn poll(&mut self) -> gm_recv_event {
        if let Some(event) = self.ready_event() {
            return event;
        }
        loop {
            match self.port.receive() {
                Ok(Some(event)) => {
                    if let Some(event) = self.translate(event) {
                        return event;
                    }
                }
                Ok(None) => {
                    self.empty_polls = self.empty_polls.wrapping_add(1);
                    if self.empty_polls % POLLS_PER_LIVENESS_CHECK == 0
                        && let Err(error) = self.port.check_daemon_alive()
                    {
                        self.die(&error);
                        return self.ready_event().unwrap_or_default();
                    }
                    return simple_event(GM_NO_RECV_EVENT);
                }
                Err(error) => {
                    self.die(&error);
                    return self.ready_event().unwrap_or_default();
                }
            }
        }
    }

    /// Waits up to `timeout` for the next event.
    pub(super) fn wait(&mut self, timeout: Duration) -> Option<gm_recv_event> {
        if let Some(event) = self.ready_event() {
            return Some(event);
        }
        match self.port.receive_timeout(timeout) {
            Ok(Some(event)) => self.translate(event),
            Ok(None) => None,
            Err(error) => {
                self.die(&error);
                self.ready_event()
            }
        }
    }

    /// Turns a port event into the C event it means, settling the records it closes; `None` for
    /// an event that means nothing to the program.
    pub(super) fn translate(&mut self, event: Event) -> Option<gm_recv_event> {
        match event {
            Event::BarrierCompleted { .. } | Event::BarrierFailed { .. } => {
                self.barrier_event(&event)
            }
            Event::SendRejected { kind, .. } if kind == SendKind::BARRIER.0 => {
                self.barrier_event(&event)
            }
            Event::Other(raw) if raw.kind == EventKind::SENT => {
                self.finish_send(raw.context.get(), from_nic(raw.status))
            }
            Event::SendRejected {
                context, status, ..
            } => self.finish_send(context, from_nic(status)),
            Event::Other(raw) if raw.kind == EventKind::RECEIVED => {
                let provided = self.take_receive(raw.tag.get())?;
                if raw.buffer.get() != provided.arena_offset {
                    // Not the buffer this tag was given with: the NIC misreported. The record
                    // is gone either way; tell the program its buffer is back, unused.
                    return Some(self.refused_receive(
                        &provided,
                        format!(
                            "the NIC reported arena offset {:#x} for the buffer at {:#x} \
                             (offset {:#x})",
                            raw.buffer.get(),
                            provided.address,
                            provided.arena_offset
                        ),
                    ));
                }
                if raw.status != Status::SUCCESS {
                    return Some(self.refused_receive(
                        &provided,
                        format!("the NIC could not write the buffer ({:?})", raw.status),
                    ));
                }
                let most = max_length_for_size(provided.size);
                let length = raw.length.get().min(most);
                let kind = if provided.priority == Priority::HIGH {
                    GM_HIGH_RECV_EVENT
                } else {
                    GM_RECV_EVENT
                };
                Some(receive_event(
                    kind,
                    &provided,
                    length,
                    raw.peer_node.get(),
                    raw.peer_port.0,
                ))
            }
            Event::ReceiveRejected { tag, status, .. } => {
                let provided = self.take_receive(tag)?;
                Some(self.refused_receive(
                    &provided,
                    format!(
                        "the NIC refused it ({})",
                        super::status::message(from_nic(status)).to_string_lossy()
                    ),
                ))
            }
            Event::RingCorrupt => {
                self.fatal.get_or_insert((
                    GM_FIRMWARE_ABORT,
                    "the NIC found the port's rings corrupt".to_owned(),
                ));
                self.ready_event()
            }
            _ => None,
        }
    }

    fn finish_send(&mut self, context: u64, status: gm_status_t) -> Option<gm_recv_event> {
        if context & SEND_CONTEXT_MARK == 0 {
            return None;
        }
        let slot = (context & u64::from(u32::MAX)) as u32 & !(SEND_CONTEXT_MARK as u32);
        let send = self.sends.remove(slot, (context >> 32) as u32)?;
        if let Some(allocation) = send.allocation {
            self.release(allocation);
        }
        self.complete(send.callback, send.context, status);
        self.unannounced = false;
        Some(simple_event(GM_SENT_EVENT))
    }

    fn take_receive(&mut self, tag: u32) -> Option<ProvidedBuffer> {
        let provided = self.receives.remove(tag & 0xffff, tag >> 16)?;
        self.release(provided.allocation);
        Some(provided)
    }

    fn refused_receive(&mut self, provided: &ProvidedBuffer, why: String) -> gm_recv_event {
        let message = format!(
            "the receive buffer at {:#x} (tag {}, size {}) came back unused: {why}",
            provided.address, provided.tag, provided.size
        );
        set_last_error(message.clone());
        self.bad_receive = Some(message);
        receive_event(GM_BAD_RECV_TOKEN_EVENT, provided, 0, 0, 0)
    }

    /// Posts a send token for `len` bytes at `message`; on any refusal the callback is owed
    /// with the reason instead.
    #[allow(
        clippy::too_many_arguments,
        reason = "gm_send_with_callback's arguments, passed through"
    )]
    fn send(
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
        if let Err((status, why)) =
            self.try_send(message, size, len, priority, node, port, callback, context)
        {
            set_last_error(format!("gm_send_with_callback: {why}"));
            self.complete(callback, context, status);
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "gm_send_with_callback's arguments, passed through"
    )]
    fn try_send(
        &mut self,
        message: usize,
        size: c_uint,
        len: gm_size_t,
        priority: c_uint,
        node: c_uint,
        port: c_uint,
        callback: gm_send_completion_callback_t,
        context: usize,
    ) -> Result<(), (gm_status_t, String)> {
        let invalid = |why: String| Err((GM_INVALID_PARAMETER, why));
        if let Some((status, why)) = &self.fatal {
            return Err((*status, why.clone()));
        }
        let size_class = u8::try_from(size)
            .ok()
            .filter(|s| max_length_for_size(*s) != 0);
        let Some(size_class) = size_class else {
            return invalid(format!(
                "size class {size} is not within 3..={MAX_SIZE_CLASS}"
            ));
        };
        let most = max_length_for_size(size_class) as u64;
        #[allow(
            clippy::useless_conversion,
            reason = "gm_size_t is an unsigned long, 32 bits on some hosts"
        )]
        let long = u64::from(len) > most;
        if long {
            return invalid(format!(
                "a {len} byte message does not fit size class {size} ({most} bytes at most)"
            ));
        }
        if priority >= GM_NUM_PRIORITIES {
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
        let (allocation, offset) = self
            .locate(message, len as usize)
            .map_err(|why| (GM_INVALID_PARAMETER, why))?;
        if self.port.send_tokens() == 0 {
            return Err((
                GM_TRY_AGAIN,
                "no send token is free: wait for sends to complete".to_owned(),
            ));
        }
        let (slot, serial) = self.sends.insert(PendingSend {
            callback,
            context,
            allocation: Some(allocation),
        });
        let token = SendToken {
            kind: SendKind::DATA,
            priority: Priority(priority as u8),
            size: size_class,
            target_node: NodeId::new(node),
            target_port: PortId(target_port),
            length: (len as u32).into(),
            buffer: offset.into(),
            context: (u64::from(serial) << 32 | SEND_CONTEXT_MARK | u64::from(slot)).into(),
            ..SendToken::default()
        };
        if let Err(error) = self.port.post_send_token(&token) {
            self.sends.remove(slot, serial);
            return Err((from_error(&error), error.to_string()));
        }
        self.hold(allocation);
        Ok(())
    }

    /// Posts a receive token for the buffer at `address`; on any refusal a
    /// GM_BAD_RECV_TOKEN_EVENT is queued instead.
    fn provide(&mut self, address: usize, size: c_uint, priority: c_uint, tag: c_uint) {
        let record = |allocation, arena_offset, size| ProvidedBuffer {
            address,
            arena_offset,
            allocation,
            tag,
            size,
            priority: Priority(priority.min(1) as u8),
        };
        match self.try_provide(address, size, priority, tag) {
            Ok(()) => {}
            Err(why) => {
                let provided = record(address, 0, size.min(255) as u8);
                let event = self.refused_receive(&provided, why);
                self.deferred.push_back(event);
            }
        }
    }

    fn try_provide(
        &mut self,
        address: usize,
        size: c_uint,
        priority: c_uint,
        tag: c_uint,
    ) -> Result<(), String> {
        if let Some((_, why)) = &self.fatal {
            return Err(why.clone());
        }
        let size_class = u8::try_from(size)
            .ok()
            .filter(|s| max_length_for_size(*s) != 0);
        let Some(size_class) = size_class else {
            return Err(format!(
                "size class {size} is not within 3..={MAX_SIZE_CLASS}"
            ));
        };
        if priority >= GM_NUM_PRIORITIES {
            return Err(format!(
                "priority {priority} is neither GM_LOW_PRIORITY nor GM_HIGH_PRIORITY"
            ));
        }
        let needed = max_length_for_size(size_class) as usize;
        let (allocation, arena_offset) = self.locate(address, needed)?;
        if self.port.receive_tokens() == 0 {
            return Err("no receive token is free".to_owned());
        }
        let (slot, serial) = self.receives.insert(ProvidedBuffer {
            address,
            arena_offset,
            allocation,
            tag,
            size: size_class,
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
        if let Err(error) = self.port.post_receive_token(&token) {
            self.receives.remove(slot, serial);
            return Err(error.to_string());
        }
        self.hold(allocation);
        Ok(())
    }
}

/// An event with only its type set.
pub(super) fn simple_event(kind: u8) -> gm_recv_event {
    gm_recv_event {
        sent: gm_sent_t {
            r#type: gm_u8_n_t { n: kind },
            ..gm_sent_t::default()
        },
    }
}

/// GM_FATAL_FIRMWARE_ERROR_EVENT with `status`.
fn fatal_event(status: gm_status_t) -> gm_recv_event {
    gm_recv_event {
        fatal_firmware_error: gm_fatal_firmware_error_t {
            status: gm_u32_n_t {
                n: (status as u32).to_be(),
            },
            r#type: gm_u8_n_t {
                n: GM_FATAL_FIRMWARE_ERROR_EVENT,
            },
            ..gm_fatal_firmware_error_t::default()
        },
    }
}

fn receive_event(
    kind: u8,
    provided: &ProvidedBuffer,
    length: u32,
    sender_node: u16,
    sender_port: u8,
) -> gm_recv_event {
    gm_recv_event {
        recv: gm_recv_t {
            nicbar_tag: gm_u32_n_t {
                n: provided.tag.to_be(),
            },
            message: hton_pointer(provided.address),
            buffer: hton_pointer(provided.address),
            length: gm_u32_n_t { n: length.to_be() },
            sender_node_id: gm_u16_n_t {
                n: sender_node.to_be(),
            },
            tag: gm_u8_n_t {
                n: provided.tag as u8,
            },
            size: gm_u8_n_t { n: provided.size },
            sender_port_id: gm_u8_n_t { n: sender_port },
            r#type: gm_u8_n_t { n: kind },
            ..gm_recv_t::default()
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Handles.

fn open_ports() -> MutexGuard<'static, Option<HashSet<usize>>> {
    OPEN_PORTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The port behind `handle`, if it is an open port of this process.
///
/// # Safety
/// The caller does not close the port (free the handle) while it uses the reference; C is told
/// not to close a port while another thread uses it.
pub(super) unsafe fn port_ref<'a>(handle: *mut gm_port, function: &str) -> Option<&'a gm_port> {
    if handle.is_null() {
        set_last_error(format!("{function}: the port is NULL"));
        return None;
    }
    let open = open_ports()
        .as_ref()
        .is_some_and(|ports| ports.contains(&(handle as usize)));
    if !open {
        set_last_error(format!(
            "{function}: {handle:p} is not an open port (closed already, or never opened)"
        ));
        return None;
    }
    // SAFETY: the handle is registered, so it came from gm_open's Box and gm_close has not
    // freed it (it unregisters first); the caller keeps it alive while the reference is used.
    Some(unsafe { &*handle })
}

impl gm_port {
    /// The port's state, or why it cannot be had (a panic left it inconsistent).
    pub(super) fn lock(&self, function: &str) -> Result<MutexGuard<'_, PortState>, gm_status_t> {
        self.state.lock().map_err(|_| {
            fail(
                GM_INTERNAL_ERROR,
                format!("{function}: the port is unusable after an internal error"),
            )
        })
    }

    /// Stores `event` as the port's current event; returns the pointer C reads it through.
    /// `_held` is the port's lock, held.
    pub(super) fn publish(
        &self,
        _held: &MutexGuard<'_, PortState>,
        event: gm_recv_event,
    ) -> *mut gm_recv_event {
        let slot = self.event.get();
        // SAFETY: the slot lives as long as the port; only lock holders write it, one at a time;
        // C reads it only between receive calls on this port (the API's rule), and Rust never
        // holds a reference into it.
        unsafe { slot.write(event) };
        slot
    }
}

fn no_event() -> *mut gm_recv_event {
    // C is told never to write an event, so handing out the static's address as `*mut` is
    // handing out read-only bytes.
    (&raw const NO_EVENT.0).cast_mut()
}

/// Runs `body` on the state of the port behind `handle`, or returns `otherwise`.
fn with_state<T>(
    handle: *mut gm_port,
    function: &str,
    otherwise: T,
    body: impl FnOnce(&mut PortState) -> T,
) -> T {
    // SAFETY: the reference is dropped before this function returns, and nothing here closes
    // the port.
    let Some(port) = (unsafe { port_ref(handle, function) }) else {
        return otherwise;
    };
    match port.lock(function) {
        Ok(mut state) => body(&mut state),
        Err(_) => otherwise,
    }
}

// ---------------------------------------------------------------------------------------------
// Exports.

/// Initialises the library. Optional (gm_open works without it); kept for GM programs. Always
/// GM_SUCCESS.
#[unsafe(no_mangle)]
pub extern "C" fn gm_init() -> gm_status_t {
    guard("gm_init", GM_INTERNAL_ERROR, || {
        INIT_COUNT.fetch_add(1, Ordering::Relaxed);
        GM_SUCCESS
    })
}

/// Undoes one gm_init. Open ports stay open: close them with gm_close.
#[unsafe(no_mangle)]
pub extern "C" fn gm_finalize() {
    guard("gm_finalize", (), || {
        let _ = INIT_COUNT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |count| {
            count.checked_sub(1)
        });
    });
}

/// Opens port `port_id` of NIC `unit` and stores its handle in `*port` (NULL on failure).
///
/// The NIC daemon is found at `$NICBAR_SOCKET`, else `$XDG_RUNTIME_DIR/nicbar/control.sock`, else
/// `/tmp/nicbar-<uid>/control.sock`. `port_name` is ignored and may be NULL; `version` is
/// GM_API_VERSION (any GM 1.0 to 2.0.16 version is accepted).
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (`port` is NULL); GM_DEV_NOT_FOUND (no daemon
/// answers); GM_NO_SUCH_DEVICE (no such unit); GM_INVALID_PORT_NUMBER; GM_BUSY (another process
/// has the port: nicbar_last_error() names it); GM_INCOMPATIBLE_LIB_AND_DRIVER.
///
/// # Safety
/// `port` is NULL or points to writable storage for a pointer; `port_name` is NULL or a
/// NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_open(
    port: *mut *mut gm_port,
    unit: c_uint,
    port_id: c_uint,
    port_name: *const c_char,
    version: c_uint,
) -> gm_status_t {
    guard("gm_open", GM_INTERNAL_ERROR, || {
        let _ = port_name;
        if port.is_null() {
            return fail(GM_INVALID_PARAMETER, "gm_open: the port pointer is NULL");
        }
        // SAFETY: `port` is not NULL and points to storage for a pointer (the caller's promise).
        unsafe { port.write(core::ptr::null_mut()) };
        if !(GM_API_VERSION_1_0..=NEWEST_API_VERSION).contains(&version) {
            return fail(
                GM_INCOMPATIBLE_LIB_AND_DRIVER,
                format!(
                    "gm_open: API version {version:#x} is not one this library implements \
                     ({GM_API_VERSION_1_0:#x} to {NEWEST_API_VERSION:#x})"
                ),
            );
        }
        let Ok(unit) = u8::try_from(unit) else {
            return fail(GM_NO_SUCH_DEVICE, format!("gm_open: no NIC unit {unit}"));
        };
        let Ok(port_number) = u8::try_from(port_id) else {
            return fail(
                GM_INVALID_PORT_NUMBER,
                format!("gm_open: no port {port_id} on a NIC"),
            );
        };
        let opened = match Port::open(unit, port_number) {
            Ok(opened) => opened,
            Err(error) => return fail(from_error(&error), format!("gm_open: {error}")),
        };
        let handle = Box::into_raw(Box::new(gm_port {
            state: Mutex::new(PortState::new(opened)),
            event: UnsafeCell::new(simple_event(GM_NO_RECV_EVENT)),
            callbacks_running: AtomicU32::new(0),
            close_requested: AtomicBool::new(false),
        }));
        open_ports()
            .get_or_insert_with(HashSet::new)
            .insert(handle as usize);
        // SAFETY: as above.
        unsafe { port.write(handle) };
        GM_SUCCESS
    })
}

/// Closes the port in order — the NIC first sends everything posted before, and the call returns
/// once each message is acknowledged or has failed for good (at most the NIC's give-up time plus
/// its receiver-not-ready time) — and frees everything it holds, its DMA memory included. NULL,
/// or a port closed already, is ignored. Called from a send callback, the close happens when gm_unknown
/// returns.
///
/// # Safety
/// No other thread uses the port during or after the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_close(port: *mut gm_port) {
    guard("gm_close", (), || {
        if port.is_null() {
            return;
        }
        {
            // SAFETY: the reference ends with this block, before the port is freed.
            let Some(open) = (unsafe { port_ref(port, "gm_close") }) else {
                return;
            };
            if open.callbacks_running.load(Ordering::Acquire) > 0 {
                open.close_requested.store(true, Ordering::Release);
                return;
            }
        }
        // SAFETY: the port is open and no callback of it runs; the caller uses it no more.
        unsafe { close_now(port) };
    });
}

/// Unregisters and frees the port.
///
/// # Safety
/// `port` is an open port that no one uses any more.
unsafe fn close_now(port: *mut gm_port) {
    let registered = open_ports()
        .as_mut()
        .is_some_and(|ports| ports.remove(&(port as usize)));
    if !registered {
        return;
    }
    // SAFETY: registered means it came from Box::into_raw in gm_open and was not freed; it is
    // unregistered now, so no later call reaches it.
    let owned = unsafe { Box::from_raw(port) };
    let state = owned
        .state
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    // The NIC closes the port (peers' sends to it end with GM_SEND_TARGET_PORT_CLOSED) before
    // the DMA memory is released.
    let PortState {
        port, allocations, ..
    } = state;
    let _ = port.close();
    drop(allocations);
}

/// Stores this port's node id in `*node_id`. GM_INVALID_PARAMETER if either pointer is NULL or
/// the port is not open.
///
/// # Safety
/// `node_id` is NULL or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get_node_id(port: *mut gm_port, node_id: *mut c_uint) -> gm_status_t {
    guard("gm_get_node_id", GM_INTERNAL_ERROR, || {
        if node_id.is_null() {
            return fail(GM_INVALID_PARAMETER, "gm_get_node_id: node_id is NULL");
        }
        with_state(port, "gm_get_node_id", GM_INVALID_PARAMETER, |state| {
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe { node_id.write(c_uint::from(state.port.node_id().get())) };
            GM_SUCCESS
        })
    })
}

/// This port's id (0 for a NULL port).
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get_port_id(port: *mut gm_port) -> c_uint {
    guard("gm_get_port_id", 0, || {
        with_state(port, "gm_get_port_id", 0, |state| {
            c_uint::from(state.port.port_id().0)
        })
    })
}

/// How many ports a NIC has.
///
/// # Safety
/// `port` is ignored and may be anything, NULL included.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_num_ports(port: *mut gm_port) -> c_uint {
    guard("gm_num_ports", 0, || {
        let _ = port;
        PORTS_PER_NIC as c_uint
    })
}

/// The largest message length in bytes.
///
/// # Safety
/// `port` is ignored and may be anything, NULL included.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_mtu(port: *mut gm_port) -> c_uint {
    guard("gm_mtu", 0, || {
        let _ = port;
        MTU_PAYLOAD as c_uint
    })
}

/// Send tokens free: sends the port can start now. Each send takes one; its callback's
/// GM_SENT_EVENT gives it back. 0 for a NULL port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_num_send_tokens(port: *mut gm_port) -> c_uint {
    guard("gm_num_send_tokens", 0, || {
        with_state(port, "gm_num_send_tokens", 0, |state| {
            state.port.send_tokens()
        })
    })
}

/// Receive tokens free: buffers (and barrier buffers) the port can still provide. 0 for a NULL
/// port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_num_receive_tokens(port: *mut gm_port) -> c_uint {
    guard("gm_num_receive_tokens", 0, || {
        with_state(port, "gm_num_receive_tokens", 0, |state| {
            state.port.receive_tokens()
        })
    })
}

/// The smallest size class whose buffers hold `length` bytes; 0 (no size class) if the length
/// exceeds the largest message.
#[unsafe(no_mangle)]
pub extern "C" fn gm_min_size_for_length(length: gm_size_t) -> c_uint {
    guard("gm_min_size_for_length", 0, || {
        u32::try_from(length)
            .ok()
            .and_then(min_size_for_length)
            .map_or(0, c_uint::from)
    })
}

/// The longest message a buffer of size class `size` holds; 0 for a size class out of range.
#[unsafe(no_mangle)]
pub extern "C" fn gm_max_length_for_size(size: c_uint) -> gm_size_t {
    guard("gm_max_length_for_size", 0, || {
        u8::try_from(size).map_or(0, max_length_for_size).into()
    })
}

/// Allocates `length` bytes of DMA memory from the port's arena: the only memory sends and
/// receive buffers may use. Aligned to 64 bytes. NULL if the port is NULL or the arena has no
/// free range that long (nicbar_last_error() says how much is free).
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_dma_malloc(port: *mut gm_port, length: gm_size_t) -> *mut c_void {
    guard("gm_dma_malloc", core::ptr::null_mut(), || {
        with_state(port, "gm_dma_malloc", core::ptr::null_mut(), |state| {
            state.allocate(length, false)
        })
    })
}

/// As gm_dma_malloc, for `count` elements of `length` bytes, zeroed.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_dma_calloc(
    port: *mut gm_port,
    count: gm_size_t,
    length: gm_size_t,
) -> *mut c_void {
    guard("gm_dma_calloc", core::ptr::null_mut(), || {
        let Some(total) = count.checked_mul(length) else {
            set_last_error(format!("gm_dma_calloc: {count} x {length} bytes overflows"));
            return core::ptr::null_mut();
        };
        with_state(port, "gm_dma_calloc", core::ptr::null_mut(), |state| {
            state.allocate(total, true)
        })
    })
}

impl PortState {
    fn allocate(&mut self, length: gm_size_t, zeroed: bool) -> *mut c_void {
        let Ok(length) = usize::try_from(length) else {
            set_last_error(format!("gm_dma_malloc: {length} bytes is more than memory"));
            return core::ptr::null_mut();
        };
        let mut buffer = match self.port.dma_alloc(length.max(1)) {
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
        self.allocations.insert(
            pointer as usize,
            Allocation {
                buffer,
                in_flight: 0,
                freed: false,
            },
        );
        pointer.cast()
    }
}

/// Frees DMA memory from gm_dma_malloc. NULL is ignored, and so is a pointer that is not the
/// start of this port's DMA memory (nicbar_last_error() says so). Memory the NIC still holds (a
/// send or receive buffer not yet back) is freed when it comes back.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_dma_free(port: *mut gm_port, address: *mut c_void) {
    guard("gm_dma_free", (), || {
        if address.is_null() {
            return;
        }
        with_state(port, "gm_dma_free", (), |state| {
            let address = address as usize;
            match state.allocations.get_mut(&address) {
                Some(allocation) if !allocation.freed => {
                    if allocation.in_flight == 0 {
                        state.allocations.remove(&address);
                    } else {
                        allocation.freed = true;
                    }
                }
                _ => set_last_error(format!(
                    "gm_dma_free: {address:#x} is not DMA memory of this port from gm_dma_malloc"
                )),
            }
        });
    });
}

/// Provides a buffer for one incoming message of size class `size` and `priority`
/// (GM_LOW_PRIORITY or GM_HIGH_PRIORITY). The buffer is DMA memory from gm_dma_malloc holding at
/// least gm_max_length_for_size(size) bytes; it is the NIC's until the GM_RECV_EVENT (or
/// GM_HIGH_RECV_EVENT) of the message it takes, which carries `tag`. Takes a receive token.
///
/// A buffer the library cannot provide (bad pointer, size or priority; no receive token) comes
/// back as a GM_BAD_RECV_TOKEN_EVENT from the next receive call.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_provide_receive_buffer_with_tag(
    port: *mut gm_port,
    buffer: *mut c_void,
    size: c_uint,
    priority: c_uint,
    tag: c_uint,
) {
    guard("gm_provide_receive_buffer_with_tag", (), || {
        with_state(port, "gm_provide_receive_buffer_with_tag", (), |state| {
            state.provide(buffer as usize, size, priority, tag);
        });
    });
}

/// gm_provide_receive_buffer_with_tag with tag 0 (GM's older form).
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_provide_receive_buffer(
    port: *mut gm_port,
    buffer: *mut c_void,
    size: c_uint,
    priority: c_uint,
) {
    guard("gm_provide_receive_buffer", (), || {
        // SAFETY: the same promise, passed on.
        unsafe { gm_provide_receive_buffer_with_tag(port, buffer, size, priority, 0) }
    })
}

/// Sends `length` bytes at `message` as a message of size class `size` and `priority` to port
/// `target_port_id` of node `target_node_id`. `message` points into DMA memory from
/// gm_dma_malloc, which is the NIC's until the send ends: then `callback` (if not NULL) runs
/// from gm_unknown() with `context` and the send's status. Takes a send token.
///
/// Nothing is returned: a send the library refuses (bad size, length, priority, ids or memory:
/// GM_INVALID_PARAMETER; no send token: GM_TRY_AGAIN) ends the same way, its callback getting
/// the reason, and nicbar_last_error() saying it in words.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `callback` is NULL or a function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_send_with_callback(
    port: *mut gm_port,
    message: *mut c_void,
    size: c_uint,
    length: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("gm_send_with_callback", (), || {
        with_state(port, "gm_send_with_callback", (), |state| {
            state.send(
                message as usize,
                size,
                length,
                priority,
                target_node_id,
                target_port_id,
                callback,
                context as usize,
            );
        });
    });
}

/// gm_send_with_callback to the port with this port's id on `target_node_id`.
///
/// # Safety
/// As gm_send_with_callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_send_to_peer_with_callback(
    port: *mut gm_port,
    message: *mut c_void,
    size: c_uint,
    length: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("gm_send_to_peer_with_callback", (), || {
        with_state(port, "gm_send_to_peer_with_callback", (), |state| {
            let own_port = c_uint::from(state.port.port_id().0);
            state.send(
                message as usize,
                size,
                length,
                priority,
                target_node_id,
                own_port,
                callback,
                context as usize,
            );
        });
    });
}

/// The next event, or one of type GM_NO_RECV_EVENT if none is waiting. Never blocks, never
/// NULL. Handle the types the program knows (GM_RECV_EVENT, GM_HIGH_RECV_EVENT,
/// GM_BARRIER_COMPLETED_EVENT, ...) and pass every other event to gm_unknown(). The event is
/// valid until the next receive call on the port; do not write it.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_receive(port: *mut gm_port) -> *mut gm_recv_event_t {
    guard("gm_receive", no_event(), || {
        // SAFETY: the reference is used only within this call, which does not close the port.
        let Some(open) = (unsafe { port_ref(port, "gm_receive") }) else {
            return no_event();
        };
        let Ok(mut state) = open.lock("gm_receive") else {
            return no_event();
        };
        let event = state.poll();
        // Written under the lock: two threads receiving on one port do not write it at once.
        let published = open.publish(&state, event);
        drop(state);
        published
    })
}

/// Waits for the next event, spinning briefly and then sleeping; never returns
/// GM_NO_RECV_EVENT (for a NULL port it does, at once). If the daemon goes away it returns
/// GM_FATAL_FIRMWARE_ERROR_EVENT.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_blocking_receive(port: *mut gm_port) -> *mut gm_recv_event_t {
    guard("gm_blocking_receive", no_event(), || {
        // SAFETY: as in gm_receive.
        unsafe {
            blocking_receive(
                port,
                WaitMode::SpinThenSleep(BLOCKING_SPIN),
                "gm_blocking_receive",
            )
        }
    })
}

/// As gm_blocking_receive, sleeping at once instead of spinning first.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_blocking_receive_no_spin(port: *mut gm_port) -> *mut gm_recv_event_t {
    guard("gm_blocking_receive_no_spin", no_event(), || {
        // SAFETY: as in gm_receive.
        unsafe { blocking_receive(port, WaitMode::Sleep, "gm_blocking_receive_no_spin") }
    })
}

/// # Safety
/// `port` is NULL or a port from gm_open.
unsafe fn blocking_receive(
    port: *mut gm_port,
    mode: WaitMode,
    function: &str,
) -> *mut gm_recv_event {
    // SAFETY: the reference is used only within this call, which does not close the port.
    let Some(open) = (unsafe { port_ref(port, function) }) else {
        return no_event();
    };
    loop {
        let Ok(mut state) = open.lock(function) else {
            return no_event();
        };
        state.port.set_wait_mode(mode);
        if let Some(event) = state.wait(BLOCKING_SLICE) {
            let published = open.publish(&state, event);
            drop(state);
            return published;
        }
    }
}

/// Handles an event the program does not: runs the callbacks of sends (and barriers) that have
/// ended, in order. Call it for every event whose type the program does not handle itself;
/// calling it for any event, NULL included, is harmless. Events that say the program can go no
/// further exit the process after printing why on standard error, as GM did:
/// GM_FATAL_FIRMWARE_ERROR_EVENT (the daemon went away) and GM_BAD_RECV_TOKEN_EVENT (a buffer
/// could not be provided). Callbacks may call any function of the port, gm_close included.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `event` is NULL or an event from a receive call (or a
/// copy of one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_unknown(port: *mut gm_port, event: *mut gm_recv_event_t) {
    guard("gm_unknown", (), || {
        let kind = if event.is_null() {
            GM_NO_RECV_EVENT
        } else {
            // SAFETY: a non-NULL event points to an event (the caller's promise, possibly a copy
            // at any alignment); it is copied out before anything else happens.
            unsafe { event.read_unaligned() }.event_type()
        };
        let close = {
            // SAFETY: the reference ends with this block; a gm_close from a callback is
            // deferred while `callbacks_running` is raised, so the port outlives the block.
            let Some(open) = (unsafe { port_ref(port, "gm_unknown") }) else {
                return;
            };
            if kind == GM_FATAL_FIRMWARE_ERROR_EVENT || kind == GM_BAD_RECV_TOKEN_EVENT {
                let why = open.lock("gm_unknown").ok().and_then(|state| {
                    if kind == GM_FATAL_FIRMWARE_ERROR_EVENT {
                        state.fatal.as_ref().map(|(_, why)| why.clone())
                    } else {
                        state.bad_receive.clone()
                    }
                });
                exit_with(&why.unwrap_or_else(|| "the port can go no further".to_owned()));
            }
            open.run_callbacks(port)
        };
        if close {
            // SAFETY: the callbacks asked for the close and have all returned; the reference
            // above is gone.
            unsafe { close_now(port) };
        }
    });
}

impl gm_port {
    /// Runs the callbacks owed when the call began (not those they cause, which wait for the
    /// next gm_unknown). Returns whether a callback asked to close the port.
    fn run_callbacks(&self, handle: *mut gm_port) -> bool {
        /// Lowers `callbacks_running` however the loop ends.
        struct Running<'a>(&'a AtomicU32);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        let owed = match self.lock("gm_unknown") {
            Ok(state) => state.completions.len(),
            Err(_) => return false,
        };
        self.callbacks_running.fetch_add(1, Ordering::AcqRel);
        let running = Running(&self.callbacks_running);
        for _ in 0..owed {
            let completion = match self.lock("gm_unknown") {
                Ok(mut state) => state.completions.pop_front(),
                Err(_) => None,
            };
            let Some(completion) = completion else {
                break;
            };
            if let Some(callback) = completion.callback {
                // SAFETY: the program gave this function for this purpose; the port's lock is
                // not held, so it may call back into the library.
                unsafe { callback(handle, completion.context as *mut c_void, completion.status) };
            }
        }
        drop(running);
        self.callbacks_running.load(Ordering::Acquire) == 0
            && self.close_requested.load(Ordering::Acquire)
    }
}
