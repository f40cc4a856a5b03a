//! The C types and constants of `nicbar/gm.h`: GM 2's sized and network-order types, status
//! codes, event types and the receive event union, plus nicbar's barrier types.
//!
//! The shapes follow GM 2's `gm.h`: network-order fields are one-member structs (GM's
//! `GM_STRONG_TYPES`), so a field read without its `gm_ntoh_*` accessor does not compile, and
//! every member of the event union is 64 bytes with its `type` in the last byte.

use core::ffi::{c_int, c_uint, c_ulong, c_void};
use core::mem::{offset_of, size_of};

/// An unsigned 8-bit integer.
pub type gm_u8_t = u8;
/// An unsigned 16-bit integer.
pub type gm_u16_t = u16;
/// An unsigned 32-bit integer.
pub type gm_u32_t = u32;
/// An unsigned 64-bit integer.
pub type gm_u64_t = u64;
/// A signed 8-bit integer.
pub type gm_s8_t = i8;
/// A signed 16-bit integer.
pub type gm_s16_t = i16;
/// A signed 32-bit integer.
pub type gm_s32_t = i32;
/// A signed 64-bit integer.
pub type gm_s64_t = i64;
/// A user virtual address as GM's events carry it (64 bits on every host).
pub type gm_up_t = u64;
/// Lengths and sizes of memory (GM's `gm_size_t`: an `unsigned long`).
pub type gm_size_t = c_ulong;

/// How an operation ended: `GM_SUCCESS` or one of the `GM_*` status codes below. The values are
/// GM 2's and never change.
pub type gm_status_t = c_int;

/// An unsigned 8-bit value in network byte order; read it with `gm_ntoh_u8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_u8_n_t {
    /// The value, in network byte order.
    pub n: gm_u8_t,
}

/// An unsigned 16-bit value in network byte order; read it with `gm_ntoh_u16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_u16_n_t {
    /// The value, in network byte order.
    pub n: gm_u16_t,
}

/// An unsigned 32-bit value in network byte order; read it with `gm_ntoh_u32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_u32_n_t {
    /// The value, in network byte order.
    pub n: gm_u32_t,
}

/// An unsigned 64-bit value in network byte order; read it with `gm_ntoh_u64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_u64_n_t {
    /// The value, in network byte order.
    pub n: gm_u64_t,
}

/// A signed 8-bit value in network byte order; read it with `gm_ntoh_s8`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_s8_n_t {
    /// The value, in network byte order.
    pub n: gm_s8_t,
}

/// A signed 16-bit value in network byte order; read it with `gm_ntoh_s16`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_s16_n_t {
    /// The value, in network byte order.
    pub n: gm_s16_t,
}

/// A signed 32-bit value in network byte order; read it with `gm_ntoh_s32`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_s32_n_t {
    /// The value, in network byte order.
    pub n: gm_s32_t,
}

/// A signed 64-bit value in network byte order; read it with `gm_ntoh_s64`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_s64_n_t {
    /// The value, in network byte order.
    pub n: gm_s64_t,
}

/// A user virtual address in network byte order; turn it into a pointer with `gm_ntohp`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_up_n_t {
    /// The address, in network byte order.
    pub n: gm_up_t,
}

// ---------------------------------------------------------------------------------------------
// API versions (the last argument of gm_open).

/// GM API version 1.0.
pub const GM_API_VERSION_1_0: c_uint = 0x100;
/// GM API version 1.1.
pub const GM_API_VERSION_1_1: c_uint = 0x101;
/// GM API version 1.2.
pub const GM_API_VERSION_1_2: c_uint = 0x102;
/// GM API version 1.3.
pub const GM_API_VERSION_1_3: c_uint = 0x103;
/// GM API version 1.4.
pub const GM_API_VERSION_1_4: c_uint = 0x104;
/// GM API version 1.5.
pub const GM_API_VERSION_1_5: c_uint = 0x105;
/// GM API version 1.6.
pub const GM_API_VERSION_1_6: c_uint = 0x106;
/// GM API version 2.0.
pub const GM_API_VERSION_2_0: c_uint = 0x200;
/// GM API version 2.0.6.
pub const GM_API_VERSION_2_0_6: c_uint = 0x20006;
/// GM API version 2.0.12.
pub const GM_API_VERSION_2_0_12: c_uint = 0x2000c;
/// GM API version 2.0.16: the newest, and the one this library implements. `GM_API_VERSION`
/// (the last argument of gm_open) is this one unless the program defines it first.
pub const GM_API_VERSION_2_0_16: c_uint = 0x20010;

/// The API versions gm_open accepts, by name (GM's `enum gm_api_version`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gm_api_version {
    /// GM 1.0.
    _GM_API_VERSION_1_0 = 0x100,
    /// GM 1.1.
    _GM_API_VERSION_1_1 = 0x101,
    /// GM 1.2.
    _GM_API_VERSION_1_2 = 0x102,
    /// GM 1.3.
    _GM_API_VERSION_1_3 = 0x103,
    /// GM 1.4.
    _GM_API_VERSION_1_4 = 0x104,
    /// GM 1.5.
    _GM_API_VERSION_1_5 = 0x105,
    /// GM 1.6.
    _GM_API_VERSION_1_6 = 0x106,
    /// GM 2.0.
    _GM_API_VERSION_2_0 = 0x200,
    /// GM 2.0.6.
    _GM_API_VERSION_2_0_6 = 0x20006,
    /// GM 2.0.12.
    _GM_API_VERSION_2_0_12 = 0x2000c,
    /// GM 2.0.16.
    _GM_API_VERSION_2_0_16 = 0x20010,
}

/// A pointer into another node's memory (GM's `gm_remote_ptr_t`: 64 bits on every host). No
/// call of this library takes one yet: directed sends and gets are not implemented.
pub type gm_remote_ptr_t = u64;

/// The size of gm_get_host_name's buffer: a host name is at most GM_MAX_HOST_NAME_LEN - 1 bytes,
/// so it fits with its NUL (and gm_node_id_to_host_name_ex's buffer has room for one more).
pub const GM_MAX_HOST_NAME_LEN: c_uint = 128;
/// The longest port name gm_open takes.
pub const GM_MAX_PORT_NAME_LEN: c_uint = 32;
/// What gm_host_name_to_node_id returns for a name no node has. Node ids start at 0 on this
/// fabric (GM's at 1), so node 0's name also gives 0 there: gm_host_name_to_node_id_ex tells the
/// two apart.
pub const GM_NO_SUCH_NODE_ID: c_uint = 0;

// ---------------------------------------------------------------------------------------------
// Status codes (gm_status_t). GM 2's numbering.

/// It worked.
pub const GM_SUCCESS: gm_status_t = 0;
/// The operation failed for a reason no other code names.
pub const GM_FAILURE: gm_status_t = 1;
/// An input buffer is too small.
pub const GM_INPUT_BUFFER_TOO_SMALL: gm_status_t = 2;
/// An output buffer is too small.
pub const GM_OUTPUT_BUFFER_TOO_SMALL: gm_status_t = 3;
/// Not possible now; try again later (no send or receive token was free).
pub const GM_TRY_AGAIN: gm_status_t = 4;
/// The port is open in another process, or the barrier engine of the port is busy.
pub const GM_BUSY: gm_status_t = 5;
/// The NIC could not read or write the memory a token named.
pub const GM_MEMORY_FAULT: gm_status_t = 6;
/// A system call was interrupted.
pub const GM_INTERRUPTED: gm_status_t = 7;
/// An argument is out of range, NULL where it may not be, or names memory that is not DMA
/// memory of the port (from gm_dma_malloc).
pub const GM_INVALID_PARAMETER: gm_status_t = 8;
/// No memory: the port's DMA arena has no free range that long.
pub const GM_OUT_OF_MEMORY: gm_status_t = 9;
/// An invalid command.
pub const GM_INVALID_COMMAND: gm_status_t = 10;
/// Permission denied.
pub const GM_PERMISSION_DENIED: gm_status_t = 11;
/// A bug in this library (it caught a panic) or an impossible answer from the NIC.
pub const GM_INTERNAL_ERROR: gm_status_t = 12;
/// Unattached.
pub const GM_UNATTACHED: gm_status_t = 13;
/// Unsupported device.
pub const GM_UNSUPPORTED_DEVICE: gm_status_t = 14;
/// The target port never had a matching receive buffer in time.
pub const GM_SEND_TIMED_OUT: gm_status_t = 15;
/// The receiver refused the message (too long for the size class).
pub const GM_SEND_REJECTED: gm_status_t = 16;
/// The target port is closed.
pub const GM_SEND_TARGET_PORT_CLOSED: gm_status_t = 17;
/// The target node did not answer.
pub const GM_SEND_TARGET_NODE_UNREACHABLE: gm_status_t = 18;
/// The send was dropped at the program's request.
pub const GM_SEND_DROPPED: gm_status_t = 19;
/// The sending port was closed.
pub const GM_SEND_PORT_CLOSED: gm_status_t = 20;
/// The node id is not set yet.
pub const GM_NODE_ID_NOT_YET_SET: gm_status_t = 21;
/// The port is still shutting down.
pub const GM_STILL_SHUTTING_DOWN: gm_status_t = 22;
/// Clone busy.
pub const GM_CLONE_BUSY: gm_status_t = 23;
/// The daemon runs no NIC with that unit number.
pub const GM_NO_SUCH_DEVICE: gm_status_t = 24;
/// Aborted.
pub const GM_ABORTED: gm_status_t = 25;
/// The library and the daemon do not speak the same version.
pub const GM_INCOMPATIBLE_LIB_AND_DRIVER: gm_status_t = 26;
/// A system call failed (nicbar_last_error() says which and why).
pub const GM_UNTRANSLATED_SYSTEM_ERROR: gm_status_t = 27;
/// Access denied.
pub const GM_ACCESS_DENIED: gm_status_t = 28;
/// No driver support.
pub const GM_NO_DRIVER_SUPPORT: gm_status_t = 29;
/// Page table reference count overflow.
pub const GM_PTE_REF_CNT_OVERFLOW: gm_status_t = 30;
/// Not supported in the kernel.
pub const GM_NOT_SUPPORTED_IN_KERNEL: gm_status_t = 31;
/// Not supported on this architecture.
pub const GM_NOT_SUPPORTED_ON_ARCH: gm_status_t = 32;
/// No match.
pub const GM_NO_MATCH: gm_status_t = 33;
/// The program used the API wrongly.
pub const GM_USER_ERROR: gm_status_t = 34;
/// Timed out (a barrier's timeout expired).
pub const GM_TIMED_OUT: gm_status_t = 35;
/// Data corrupted.
pub const GM_DATA_CORRUPTED: gm_status_t = 36;
/// Hardware fault.
pub const GM_HARDWARE_FAULT: gm_status_t = 37;
/// Send orphaned.
pub const GM_SEND_ORPHANED: gm_status_t = 38;
/// Minor overflow.
pub const GM_MINOR_OVERFLOW: gm_status_t = 39;
/// Page table full.
pub const GM_PAGE_TABLE_FULL: gm_status_t = 40;
/// UC error.
pub const GM_UC_ERROR: gm_status_t = 41;
/// The port number is not a port of a NIC.
pub const GM_INVALID_PORT_NUMBER: gm_status_t = 42;
/// No NIC daemon answers on the control socket (start one with `nicctl emulate`).
pub const GM_DEV_NOT_FOUND: gm_status_t = 43;
/// The NIC daemon has gone away.
pub const GM_FIRMWARE_NOT_RUNNING: gm_status_t = 44;
/// No match for a yellow pages query.
pub const GM_YP_NO_MATCH: gm_status_t = 45;
/// SRAM parity error.
pub const GM_SRAM_PARITY_ERROR: gm_status_t = 46;
/// The firmware detected a fatal situation (it broke the event ring).
pub const GM_FIRMWARE_ABORT: gm_status_t = 47;
/// How many status codes there are.
pub const GM_NUM_STATUS_CODES: gm_status_t = 48;

// ---------------------------------------------------------------------------------------------
// Priorities.

/// A message's priority (GM's `enum gm_priority`): messages of one priority arrive in order;
/// high-priority messages may overtake low-priority ones. Receive buffers are provided per
/// priority.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gm_priority {
    /// Low priority (GM's default).
    GM_LOW_PRIORITY = 0,
    /// High priority.
    GM_HIGH_PRIORITY = 1,
    /// How many priorities there are.
    GM_NUM_PRIORITIES = 2,
}

/// How many priorities there are, as an unsigned number.
pub(crate) const PRIORITIES: c_uint = gm_priority::GM_NUM_PRIORITIES as c_uint;

// ---------------------------------------------------------------------------------------------
// Event types (the `type` byte of every member of gm_recv_event_t).

/// No event is waiting (gm_receive only).
pub const GM_NO_RECV_EVENT: gm_u8_t = 0;
/// GM 1's report of failed sends; never produced (sends end through their callbacks).
pub const GM_SENDS_FAILED_EVENT: gm_u8_t = 1;
/// An alarm set with gm_set_alarm is due: pass the event to gm_unknown(), which runs the
/// alarm's callback.
pub const GM_ALARM_EVENT: gm_u8_t = 2;
/// Sends (or barriers) have finished: pass the event to gm_unknown(), which runs their callbacks.
pub const GM_SENT_EVENT: gm_u8_t = 3;
/// Never produced (GM's raw receives have no counterpart here).
pub const GM_RAW_RECV_EVENT: gm_u8_t = 5;
/// Never produced.
pub const GM_BAD_SEND_DETECTED_EVENT: gm_u8_t = 6;
/// Never produced.
pub const GM_SEND_TOKEN_VIOLATION_EVENT: gm_u8_t = 7;
/// Never produced.
pub const GM_RECV_TOKEN_VIOLATION_EVENT: gm_u8_t = 8;
/// A receive buffer came back unused: the program gave a bad pointer, size or priority, or the
/// NIC refused it. `recv.buffer` and `recv.tag` name it. gm_unknown() reports it and exits.
pub const GM_BAD_RECV_TOKEN_EVENT: gm_u8_t = 9;
/// Never produced.
pub const GM_ALARM_VIOLATION_EVENT: gm_u8_t = 10;
/// A message of low priority arrived: `recv.buffer` (where it is), `recv.length`,
/// `recv.sender_node_id`, `recv.sender_port_id`, `recv.tag` and `recv.size` describe it.
pub const GM_RECV_EVENT: gm_u8_t = 11;
/// A message of high priority arrived; as GM_RECV_EVENT.
pub const GM_HIGH_RECV_EVENT: gm_u8_t = 12;
/// As GM_RECV_EVENT, from a port with this port's id (a peer: gm_send_to_peer's target).
pub const GM_PEER_RECV_EVENT: gm_u8_t = 13;
/// As GM_HIGH_RECV_EVENT, from a peer.
pub const GM_HIGH_PEER_RECV_EVENT: gm_u8_t = 14;
/// A small message (at most NICBAR_FAST_RECV_MAX bytes) of low priority arrived: read it at
/// `recv.message` (GM's fast path; here the NIC wrote it into the receive buffer, so `message` is
/// `buffer` and gm_memorize_message copies nothing). The buffer is the program's again.
pub const GM_FAST_RECV_EVENT: gm_u8_t = 15;
/// As GM_FAST_RECV_EVENT, of high priority.
pub const GM_FAST_HIGH_RECV_EVENT: gm_u8_t = 16;
/// As GM_FAST_RECV_EVENT, from a peer.
pub const GM_FAST_PEER_RECV_EVENT: gm_u8_t = 17;
/// As GM_FAST_HIGH_RECV_EVENT, from a peer.
pub const GM_FAST_HIGH_PEER_RECV_EVENT: gm_u8_t = 18;
/// Never produced (a refused send ends through its callback).
pub const GM_REJECTED_SEND_EVENT: gm_u8_t = 19;
/// Never produced.
pub const GM_ORPHANED_SEND_EVENT: gm_u8_t = 20;
/// Never produced.
pub const GM_BAD_RESEND_DETECTED_EVENT: gm_u8_t = 24;
/// Never produced (a dropped send ends through its callback with GM_SEND_DROPPED).
pub const GM_DROPPED_SEND_EVENT: gm_u8_t = 25;
/// Never produced.
pub const GM_BAD_SEND_VMA_EVENT: gm_u8_t = 26;
/// Never produced.
pub const GM_BAD_RECV_VMA_EVENT: gm_u8_t = 27;
/// Never produced.
pub const GM_SENT_TOKENS_EVENT: gm_u8_t = 29;
/// Never produced.
pub const GM_IGNORE_RECV_EVENT: gm_u8_t = 30;
/// Never produced (no Ethernet on this NIC).
pub const GM_ETHERNET_RECV_EVENT: gm_u8_t = 31;
/// The port can go no further: the NIC daemon went away or broke the port's event ring.
/// `fatal_firmware_error.status` says which. gm_unknown() reports it and exits the process.
pub const GM_FATAL_FIRMWARE_ERROR_EVENT: gm_u8_t = 32;
/// The longest message that arrives as a GM_FAST_*_RECV_EVENT.
pub const NICBAR_FAST_RECV_MAX: c_uint = 128;
/// A barrier completed (paper 5.2). `barrier.context` is the context given when it started.
pub const GM_BARRIER_COMPLETED_EVENT: gm_u8_t = 48;
/// A barrier ended without completing. `barrier.status` says why (GM_TIMED_OUT,
/// GM_SEND_TARGET_PORT_CLOSED, GM_SEND_TARGET_NODE_UNREACHABLE, GM_INVALID_PARAMETER, GM_BUSY,
/// ...) and `barrier.waiting_for_node_id` / `barrier.waiting_for_port_id` name the member it
/// was still waiting for, when there was one.
pub const GM_BARRIER_FAILED_EVENT: gm_u8_t = 49;

// ---------------------------------------------------------------------------------------------
// The receive event.

/// A message arrived (GM_RECV_EVENT, GM_HIGH_RECV_EVENT) or a receive buffer came back unused
/// (GM_BAD_RECV_TOKEN_EVENT). Every field is in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gm_recv_t {
    /// nicbar: the buffer's whole tag as given to gm_provide_receive_buffer_with_tag (`tag`
    /// holds its low 8 bits, as in GM).
    pub nicbar_tag: gm_u32_n_t,
    /// Reserved.
    pub _reserved: [gm_u8_n_t; 28],
    /// Where the message starts: the same as `buffer`.
    pub message: gm_up_n_t,
    /// The receive buffer that holds the message, as given when it was provided.
    pub buffer: gm_up_n_t,
    /// Reserved.
    pub reserved_after_buffer: gm_u32_n_t,
    /// The message length in bytes.
    pub length: gm_u32_n_t,
    /// The sending node.
    pub sender_node_id: gm_u16_n_t,
    /// Reserved.
    pub reserved_after_sender_node_id: gm_u16_n_t,
    /// The low 8 bits of the buffer's tag.
    pub tag: gm_u8_n_t,
    /// The message's size class.
    pub size: gm_u8_n_t,
    /// The sending port.
    pub sender_port_id: gm_u8_n_t,
    /// The event type.
    pub r#type: gm_u8_n_t,
}

/// Sends have finished (GM_SENT_EVENT): hand the event to gm_unknown().
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gm_sent_t {
    /// Reserved.
    pub _reserved: [gm_u8_n_t; 63],
    /// The event type.
    pub r#type: gm_u8_n_t,
}

/// The port can go no further (GM_FATAL_FIRMWARE_ERROR_EVENT).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gm_fatal_firmware_error_t {
    /// Reserved.
    pub _reserved: [gm_u8_n_t; 56],
    /// Why: GM_FIRMWARE_NOT_RUNNING (the daemon went away) or GM_FIRMWARE_ABORT.
    pub status: gm_u32_n_t,
    /// Reserved.
    pub reserved_after_status: [gm_u8_n_t; 3],
    /// The event type.
    pub r#type: gm_u8_n_t,
}

/// A barrier ended (GM_BARRIER_COMPLETED_EVENT or GM_BARRIER_FAILED_EVENT).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gm_barrier_event_t {
    /// Reserved.
    pub _reserved: [gm_u8_n_t; 32],
    /// The context given when the barrier started (read it with gm_ntohp).
    pub context: gm_up_n_t,
    /// Reserved.
    pub reserved_after_context: [gm_u8_n_t; 8],
    /// GM_SUCCESS, or why the barrier failed (a gm_status_t).
    pub status: gm_u32_n_t,
    /// Reserved.
    pub reserved_after_status: gm_u32_n_t,
    /// A failed barrier: the node of the member it was waiting for (0 when none).
    pub waiting_for_node_id: gm_u16_n_t,
    /// Reserved.
    pub reserved_after_node_id: [gm_u8_n_t; 4],
    /// A failed barrier: the port of the member it was waiting for.
    pub waiting_for_port_id: gm_u8_n_t,
    /// The event type.
    pub r#type: gm_u8_n_t,
}

/// What gm_receive and gm_blocking_receive return. Every member is 64 bytes and ends with the
/// same `type` byte: read `gm_ntoh_u8(e->recv.type)` (or GM_RECV_EVENT_TYPE(e)) first, then the
/// member that type names. The event stays valid until the next receive call on the port.
#[repr(C)]
#[derive(Clone, Copy)]
pub union gm_recv_event {
    /// GM_RECV_EVENT, GM_HIGH_RECV_EVENT, GM_BAD_RECV_TOKEN_EVENT; and `recv.type` for every
    /// event.
    pub recv: gm_recv_t,
    /// GM_SENT_EVENT.
    pub sent: gm_sent_t,
    /// GM_FATAL_FIRMWARE_ERROR_EVENT.
    pub fatal_firmware_error: gm_fatal_firmware_error_t,
    /// GM_BARRIER_COMPLETED_EVENT, GM_BARRIER_FAILED_EVENT.
    pub barrier: gm_barrier_event_t,
}

/// GM's name for the event union.
pub type gm_recv_event_t = gm_recv_event;

const _: () = {
    assert!(size_of::<gm_recv_t>() == 64);
    assert!(size_of::<gm_sent_t>() == 64);
    assert!(size_of::<gm_fatal_firmware_error_t>() == 64);
    assert!(size_of::<gm_barrier_event_t>() == 64);
    assert!(size_of::<gm_recv_event>() == 64);
    assert!(offset_of!(gm_recv_t, r#type) == 63);
    assert!(offset_of!(gm_sent_t, r#type) == 63);
    assert!(offset_of!(gm_fatal_firmware_error_t, r#type) == 63);
    assert!(offset_of!(gm_barrier_event_t, r#type) == 63);
    // GM 2's layout of the message fields on a 64-bit host.
    assert!(offset_of!(gm_recv_t, buffer) == 40);
    assert!(offset_of!(gm_recv_t, length) == 52);
    assert!(offset_of!(gm_recv_t, sender_node_id) == 56);
    assert!(offset_of!(gm_recv_t, tag) == 60);
};

impl Default for gm_sent_t {
    fn default() -> Self {
        Self {
            _reserved: [gm_u8_n_t::default(); 63],
            r#type: gm_u8_n_t::default(),
        }
    }
}

impl Default for gm_fatal_firmware_error_t {
    fn default() -> Self {
        Self {
            _reserved: [gm_u8_n_t::default(); 56],
            status: gm_u32_n_t::default(),
            reserved_after_status: [gm_u8_n_t::default(); 3],
            r#type: gm_u8_n_t::default(),
        }
    }
}

impl Default for gm_recv_event {
    fn default() -> Self {
        Self {
            recv: gm_recv_t::default(),
        }
    }
}

/// An open port (GM's `struct gm_port`). Opaque: C holds a pointer from gm_open and passes it
/// back; gm_close frees it.
pub struct gm_port {
    _opaque: [u8; 0],
}

/// Called from gm_unknown() when a send ends: `context` is the one given with the send, `status`
/// is GM_SUCCESS or why the send failed (GM_SEND_TIMED_OUT, GM_SEND_TARGET_PORT_CLOSED,
/// GM_SEND_TARGET_NODE_UNREACHABLE, GM_SEND_REJECTED, GM_INVALID_PARAMETER, GM_TRY_AGAIN, ...).
/// The callback may send, provide buffers and free DMA memory; it may close the port (the close
/// then happens when gm_unknown() returns).
pub type gm_send_completion_callback_t =
    Option<unsafe extern "C" fn(port: *mut gm_port, context: *mut c_void, status: gm_status_t)>;

// ---------------------------------------------------------------------------------------------
// Alarms.

/// An alarm's state (the `state` field of struct gm_alarm).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gm_alarm_state {
    /// Not set (after gm_initialize_alarm, when it fired, or when cancelled).
    GM_ALARM_FREE = 0,
    /// Set: its callback runs from gm_unknown() once it is due.
    GM_ALARM_SET = 1,
}

/// An alarm (GM's `struct gm_alarm`): storage the program owns, initialised with
/// gm_initialize_alarm, set with gm_set_alarm. Keep it alive and unmoved while it is set; do not
/// write its fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gm_alarm {
    /// Reserved.
    pub next: *mut gm_alarm,
    /// GM_ALARM_FREE or GM_ALARM_SET.
    pub state: gm_alarm_state,
    /// The port it is set on.
    pub port: *mut gm_port,
    /// What runs when it fires.
    pub callback: gm_alarm_callback_t,
    /// The callback's argument.
    pub context: *mut c_void,
    /// When it is due, in gm_ticks() of its port.
    pub deadline: gm_u64_t,
}

/// GM's name for struct gm_alarm.
pub type gm_alarm_t = gm_alarm;

/// What runs when an alarm fires (from gm_unknown()), with the context given to gm_set_alarm.
pub type gm_alarm_callback_t = Option<unsafe extern "C" fn(context: *mut c_void)>;

// ---------------------------------------------------------------------------------------------
// Barriers.

/// A member of a barrier: a port on a node.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gm_barrier_peer_t {
    /// The member's node id.
    pub node_id: c_uint,
    /// The member's port id.
    pub port_id: c_uint,
}

/// One round of a dissemination barrier: the peers this port notifies, then the peers it waits
/// for.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gm_barrier_round_t {
    /// The peers to send to in this round (`send_count` of them; may be NULL when 0).
    pub send_to: *const gm_barrier_peer_t,
    /// How many peers `send_to` names.
    pub send_count: c_uint,
    /// The peers to wait for in this round (`receive_count` of them; may be NULL when 0).
    pub receive_from: *const gm_barrier_peer_t,
    /// How many peers `receive_from` names.
    pub receive_count: c_uint,
}

/// Let the library choose: pairwise exchange for a power-of-two group, dissemination otherwise.
pub const NICBAR_BARRIER_DEFAULT: c_uint = 0;
/// Pairwise exchange (recursive doubling, paper 5.1), with a fix-up for other group sizes.
pub const NICBAR_BARRIER_PAIRWISE_EXCHANGE: c_uint = 1;
/// Gather and broadcast over a tree (paper 5.1), rooted at the first member; `parameter` is the
/// tree's dimension (most children per node, 0 for 2).
pub const NICBAR_BARRIER_GATHER_BROADCAST: c_uint = 2;
/// n-way dissemination; `parameter` is n, the peers notified per round (0 for 1).
pub const NICBAR_BARRIER_DISSEMINATION: c_uint = 3;
/// Most rounds a barrier may use.
pub const NICBAR_BARRIER_MAX_ROUNDS: c_uint = 32;
/// Most steps (a send, a wait, or an exchange with one peer) a barrier may take on one port.
pub const NICBAR_BARRIER_MAX_STEPS: c_uint = 128;

// The header states the limits as numbers; they are the NIC's.
const _: () = {
    assert!(NICBAR_BARRIER_MAX_ROUNDS as usize == shared_abi::schedule::MAX_ROUNDS as usize);
    assert!(NICBAR_BARRIER_MAX_STEPS as usize == shared_abi::schedule::MAX_SCHEDULE_STEPS);
};
