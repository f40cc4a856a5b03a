//! The exports of ports: opening and closing, DMA memory, sends, receive buffers, and events.

use core::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use nicbar_rs::{RawPort, WaitMode};
use shared_abi::MTU_PAYLOAD;
use shared_abi::ids::PORTS_PER_NIC;

use super::{close_now, event_type, guard, no_event, port_ref, register, with_state};
use crate::state::PortState;
use crate::status::{exit_with, fail, from_error, set_last_error};
use crate::types::*;

/// The longest a blocking receive holds the port's lock in one wait: other threads' calls on the
/// port get in between.
const BLOCKING_SLICE: Duration = Duration::from_millis(10);
/// Highest API version gm_open accepts (GM 2.0.16).
const NEWEST_API_VERSION: c_uint = 0x20010;

/// How many gm_init calls are outstanding.
static INIT_COUNT: AtomicU32 = AtomicU32::new(0);

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
        let opened = match RawPort::open(unit, port_number) {
            Ok(opened) => opened,
            Err(error) => return fail(from_error(&error), format!("gm_open: {error}")),
        };
        let handle = register(PortState::new(opened));
        // SAFETY: as above.
        unsafe { port.write(handle) };
        GM_SUCCESS
    })
}

/// Closes the port in order — the NIC first sends everything posted before, and the call returns
/// once each message is acknowledged or has failed for good (at most the NIC's give-up time plus
/// its receiver-not-ready time) — and frees everything it holds, its DMA memory included. NULL,
/// or a port closed already, is ignored. Called from a send callback, the close happens when
/// gm_unknown returns.
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
            unsafe { node_id.write(c_uint::from(state.raw.node_id().get())) };
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
            c_uint::from(state.raw.port_id().0)
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

/// The largest payload of one packet in bytes. A longer message is cut into packets by the NIC
/// and arrives whole in one buffer of its size class.
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

/// The port's send tokens (GM's count, fixed for the life of the port): at most this many sends
/// (and barriers) can be under way at once. Each send takes one; its callback's GM_SENT_EVENT
/// gives it back. 0 for a NULL port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_num_send_tokens(port: *mut gm_port) -> c_uint {
    guard("gm_num_send_tokens", 0, || {
        with_state(port, "gm_num_send_tokens", 0, |state| {
            state.raw.send_token_total()
        })
    })
}

/// The port's receive tokens (fixed for the life of the port): at most this many receive
/// buffers (and barrier buffers) can be provided at once. 0 for a NULL port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_num_receive_tokens(port: *mut gm_port) -> c_uint {
    guard("gm_num_receive_tokens", 0, || {
        with_state(port, "gm_num_receive_tokens", 0, |state| {
            state.raw.receive_token_total()
        })
    })
}

/// Takes a free send token for a send to come: the port's next send uses it instead of a free
/// one. Returns 1 if a token was free, 0 if not (or for a NULL port). `priority` is either
/// priority: the port's tokens serve both.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_alloc_send_token(port: *mut gm_port, priority: c_uint) -> c_int {
    guard("gm_alloc_send_token", 0, || {
        let _ = priority;
        with_state(port, "gm_alloc_send_token", 0, |state| {
            c_int::from(state.alloc_send_token())
        })
    })
}

/// Gives back a send token taken with gm_alloc_send_token and not used.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_free_send_token(port: *mut gm_port, priority: c_uint) {
    guard("gm_free_send_token", (), || {
        let _ = priority;
        with_state(port, "gm_free_send_token", (), |state| {
            state.free_send_tokens(1);
        });
    });
}

/// Gives back `count` send tokens taken with gm_alloc_send_token and not used.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_free_send_tokens(port: *mut gm_port, priority: c_uint, count: c_uint) {
    guard("gm_free_send_tokens", (), || {
        let _ = priority;
        with_state(port, "gm_free_send_tokens", (), |state| {
            state.free_send_tokens(count);
        });
    });
}

/// 1 if a send could start now (a token taken with gm_alloc_send_token, or a free one), else 0.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_send_token_available(port: *mut gm_port, priority: c_uint) -> c_int {
    guard("gm_send_token_available", 0, || {
        let _ = priority;
        with_state(port, "gm_send_token_available", 0, |state| {
            c_int::from(state.send_token_available())
        })
    })
}

/// The smallest size class whose buffers hold `length` bytes, as GM computes it: 3 for an empty
/// message, 4 for 1 to 8 bytes, ..., 13 for up to 8184 bytes, 21 for a MiB. The NIC takes size
/// classes 3 to 31 and messages of any length their class holds (longer than gm_mtu(), it cuts
/// them into packets); a size class above 31 is refused when sent.
#[unsafe(no_mangle)]
pub extern "C" fn gm_min_size_for_length(length: gm_size_t) -> c_uint {
    guard("gm_min_size_for_length", 0, || {
        crate::sizes::min_size_for_gm_length(length)
    })
}

/// The longest message a buffer of size class `size` holds, as GM computes it: 2^size - 8
/// (8184 for class 13); 0 below class 3 and above class 63. The NIC takes buffers of classes 3 to
/// 31, and messages of any length their class holds.
#[unsafe(no_mangle)]
pub extern "C" fn gm_max_length_for_size(size: c_uint) -> gm_size_t {
    guard("gm_max_length_for_size", 0, || {
        crate::sizes::max_length_for_size(size) as gm_size_t
    })
}

/// Allocates `length` bytes of DMA memory from the port's arena: the only memory sends and
/// receive buffers may use. As in GM, DMA memory comes in whole pages (GM_PAGE_LEN): a buffer
/// may use every byte of the pages it was given, and may run on into an allocation that follows
/// it. Aligned to 64 bytes. NULL if the port is NULL or the arena has no free range that long
/// (nicbar_last_error() says how much is free).
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
            state.free(address as usize)
        });
    });
}

/// Provides a buffer for one incoming message of size class `size` and `priority`
/// (GM_LOW_PRIORITY or GM_HIGH_PRIORITY). The gm_max_length_for_size(size) bytes at `buffer`
/// lie in the port's DMA memory from gm_dma_malloc (the pages it handed out, not necessarily
/// one allocation); it is the NIC's until the GM_RECV_EVENT (or
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
        send_from(
            "gm_send_with_callback",
            port,
            message,
            size,
            length,
            priority,
            target_node_id,
            Some(target_port_id),
            callback,
            context,
        );
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
        send_from(
            "gm_send_to_peer_with_callback",
            port,
            message,
            size,
            length,
            priority,
            target_node_id,
            None,
            callback,
            context,
        );
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
        unsafe { blocking_receive(port, WaitMode::default(), "gm_blocking_receive") }
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
        if let Some(event) = state.wait(BLOCKING_SLICE, mode) {
            let published = open.publish(&state, event);
            drop(state);
            return published;
        }
    }
}

/// Handles an event the program does not: runs the callbacks of sends (and barriers) that have
/// ended, in order. Call it for every event whose type the program does not handle itself;
/// calling it for any event, NULL included, is harmless.
///
/// As in GM 2, a program may leave the fast, peer and high-priority receive forms to
/// gm_unknown: the event comes back from the next receive call in the next plainer form (a fast
/// receive as the same form without FAST, its message in the receive buffer; a peer receive
/// without PEER; GM_HIGH_RECV_EVENT as GM_RECV_EVENT), so a program handling GM_RECV_EVENT alone
/// gets every message as one. A GM_BAD_RECV_TOKEN_EVENT for a message its sender's death cut
/// short gives the buffer back to the NIC (a note on standard error says so). Events that say
/// the program can go no further exit the process after printing why on standard error, as GM
/// did: GM_FATAL_FIRMWARE_ERROR_EVENT (the daemon went away) and any other
/// GM_BAD_RECV_TOKEN_EVENT (a buffer could not be provided). Callbacks may call any function of the port, gm_close included.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `event` is NULL or an event from a receive call (or a
/// copy of one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_unknown(port: *mut gm_port, event: *mut gm_recv_event_t) {
    guard("gm_unknown", (), || {
        let copy = if event.is_null() {
            None
        } else {
            // SAFETY: a non-NULL event points to an event (the caller's promise, possibly a copy
            // at any alignment); it is copied out before anything else happens.
            Some(unsafe { event.read_unaligned() })
        };
        let kind = copy.as_ref().map_or(GM_NO_RECV_EVENT, event_type);
        let close = {
            // SAFETY: the reference ends with this block; a gm_close from a callback is
            // deferred while `callbacks_running` is raised, so the port outlives the block.
            let Some(open) = (unsafe { port_ref(port, "gm_unknown") }) else {
                return;
            };
            if let Some(copy) = copy
                && let Ok(mut state) = open.lock("gm_unknown")
                // SAFETY: as in `event_type`: every member is plain bytes, so the `recv` view of
                // any event is initialised bytes.
                && state.unknown_receive(unsafe { copy.recv })
            {
                // A receive form the program does not handle, turned into the one it does, or a
                // buffer given back to the NIC: nothing more to do here.
                return;
            }
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

/// The body of every send export, inside its panic boundary (GM's forms differ only in what they
/// leave out): posts the send on `port`, naming `function` in errors; a `target_port_id` of
/// `None` is this port's own id (the "to peer" forms).
#[allow(
    clippy::too_many_arguments,
    reason = "GM's send arguments, passed through from each export"
)]
pub(super) fn send_from(
    function: &'static str,
    port: *mut gm_port,
    message: *mut c_void,
    size: c_uint,
    length: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: Option<c_uint>,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    with_state(port, function, (), |state| {
        let target_port_id = target_port_id.unwrap_or_else(|| c_uint::from(state.raw.port_id().0));
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
}
