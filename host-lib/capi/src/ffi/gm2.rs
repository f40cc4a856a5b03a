//! The exports of the rest of GM 2's port calls: GM's older send forms and datagrams, receive
//! sizes, peeking at events, alarms and the clock, and leaving the process.

use core::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::port::send_from;
use super::{event_type, guard, with_state};
use crate::stall::Connection;
use crate::status::fail;
use crate::types::*;

/// gm_send_with_callback without a callback (GM's older form): the send's end still comes as a
/// GM_SENT_EVENT for gm_unknown(); a failure is reported in nicbar_last_error() only.
///
/// # Safety
/// As gm_send_with_callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_send(
    port: *mut gm_port,
    message: *mut c_void,
    size: c_uint,
    length: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
) {
    guard("gm_send", (), || {
        send_from(
            "gm_send",
            port,
            message,
            size,
            length,
            priority,
            target_node_id,
            Some(target_port_id),
            None,
            core::ptr::null_mut(),
        );
    });
}

/// gm_send to the port with this port's id on `target_node_id` (GM's older form).
///
/// # Safety
/// As gm_send_with_callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_send_to_peer(
    port: *mut gm_port,
    message: *mut c_void,
    size: c_uint,
    length: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
) {
    guard("gm_send_to_peer", (), || {
        send_from(
            "gm_send_to_peer",
            port,
            message,
            size,
            length,
            priority,
            target_node_id,
            None,
            None,
            core::ptr::null_mut(),
        );
    });
}

/// GM's unreliable send. Here it is gm_send_with_callback: the NIC delivers every message
/// reliably and in order, which a datagram's sender may count on all the more; the callback
/// gets GM_SUCCESS once the message is delivered, or why it was not.
///
/// # Safety
/// As gm_send_with_callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_datagram_send(
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
    guard("gm_datagram_send", (), || {
        send_from(
            "gm_datagram_send",
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

/// Ends the stall that a failed send put on the connection to port `target_port_id` of node
/// `target_node_id` at `priority`: after a send's callback reports an error, the port holds every
/// later send to that connection (GM's behaviour) until this call, which sends them in order, or
/// gm_drop_sends. `callback` (if not NULL) then runs from gm_unknown with `context` and
/// GM_SUCCESS. A connection that is not stalled is left as it is (the callback still runs).
///
/// # Safety
/// `port` is NULL or a port from gm_open; `callback` is NULL or a function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_resume_sending(
    port: *mut gm_port,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("gm_resume_sending", (), || {
        with_state(port, "gm_resume_sending", (), |state| {
            let connection = Connection {
                node: target_node_id,
                port: target_port_id,
                priority,
            };
            state.resume_sending(connection, callback, context as usize);
        });
    });
}

/// As gm_resume_sending, but the held sends are not sent: each one's callback gets
/// GM_SEND_DROPPED (before `callback` gets GM_SUCCESS).
///
/// # Safety
/// As gm_resume_sending.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_drop_sends(
    port: *mut gm_port,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("gm_drop_sends", (), || {
        with_state(port, "gm_drop_sends", (), |state| {
            let connection = Connection {
                node: target_node_id,
                port: target_port_id,
                priority,
            };
            state.drop_sends(connection, callback, context as usize);
        });
    });
}

/// Says which size classes the program provides buffers for at `priority` (bit s of `mask` for
/// class s). GM used it to drop other messages early; this NIC holds a message for a buffer of
/// its class until its send times out, whatever the mask, so the call only checks its arguments.
/// Returns GM_SUCCESS, or GM_INVALID_PARAMETER for a NULL port or a priority that is neither
/// GM_LOW_PRIORITY nor GM_HIGH_PRIORITY.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_set_acceptable_sizes(
    port: *mut gm_port,
    priority: c_uint,
    mask: gm_size_t,
) -> gm_status_t {
    guard("gm_set_acceptable_sizes", GM_INTERNAL_ERROR, || {
        let _ = mask;
        with_state(
            port,
            "gm_set_acceptable_sizes",
            GM_INVALID_PARAMETER,
            |_| {
                if priority >= PRIORITIES {
                    return fail(
                        GM_INVALID_PARAMETER,
                        format!("gm_set_acceptable_sizes: priority {priority} is not a priority"),
                    );
                }
                GM_SUCCESS
            },
        )
    })
}

/// 1 if an event is waiting for gm_receive (a message, a send's end, an alarm due, ...), else 0.
/// Never blocks.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_receive_pending(port: *mut gm_port) -> c_int {
    guard("gm_receive_pending", 0, || {
        with_state(port, "gm_receive_pending", 0, |state| {
            c_int::from(state.pending())
        })
    })
}

/// The type of the next event, without taking it (0 if none is waiting); for a message, stores
/// its sender's node id in `*sender` (if `sender` is not NULL). The next gm_receive returns that
/// event. Never blocks.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `sender` is NULL or points to a writable `gm_u16_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_next_event_peek(port: *mut gm_port, sender: *mut gm_u16_t) -> c_int {
    guard("gm_next_event_peek", 0, || {
        with_state(port, "gm_next_event_peek", 0, |state| {
            let event = state.poll();
            let kind = event_type(&event);
            if kind == GM_NO_RECV_EVENT {
                return 0;
            }
            if !sender.is_null() && (GM_RECV_EVENT..=GM_FAST_HIGH_PEER_RECV_EVENT).contains(&kind) {
                // SAFETY: a receive event of these kinds was built as its `recv` member.
                let node = u16::from_be(unsafe { event.recv.sender_node_id.n });
                // SAFETY: not NULL, and writable (the caller's promise).
                unsafe { sender.write(node) };
            }
            state.deferred.push_front(event);
            c_int::from(kind)
        })
    })
}

/// Makes sure a received message is in `buffer`: copies `length` bytes from `message` to
/// `buffer` unless they are the same address (as they are for every event of this library), and
/// returns `buffer`.
///
/// # Safety
/// `message` and `buffer` each point to `length` bytes (readable, and writable respectively).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_memorize_message(
    message: *mut c_void,
    buffer: *mut c_void,
    length: c_uint,
) -> *mut c_void {
    guard("gm_memorize_message", buffer, || {
        if message != buffer && !message.is_null() && !buffer.is_null() {
            // SAFETY: both hold `length` bytes (the caller's promise); `copy` allows overlap.
            unsafe {
                core::ptr::copy(message.cast::<u8>(), buffer.cast::<u8>(), length as usize);
            }
        }
        buffer
    })
}

/// Prepares `alarm`'s storage for gm_set_alarm (it is not set). NULL is ignored.
///
/// # Safety
/// `alarm` is NULL or points to writable storage for a struct gm_alarm that is not set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_initialize_alarm(alarm: *mut gm_alarm) {
    guard("gm_initialize_alarm", (), || {
        if alarm.is_null() {
            return;
        }
        // SAFETY: not NULL, writable, and not set (the caller's promise): no record names it.
        unsafe {
            alarm.write(gm_alarm {
                next: core::ptr::null_mut(),
                state: gm_alarm_state::GM_ALARM_FREE,
                port: core::ptr::null_mut(),
                callback: None,
                context: core::ptr::null_mut(),
                deadline: 0,
            });
        }
    });
}

/// Sets `alarm` (set again if it is set already) to fire `usecs` microseconds from now: then a
/// receive call returns a GM_ALARM_EVENT, and gm_unknown() runs `callback(context)`. Alarms fire
/// in the order they are due (those due at once in the order they were set). The alarm's
/// storage must stay alive and unmoved until it fires or is cancelled.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `alarm` is NULL or storage initialised with
/// gm_initialize_alarm; `callback` is NULL or a function of that type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_set_alarm(
    port: *mut gm_port,
    alarm: *mut gm_alarm,
    usecs: gm_u64_t,
    callback: gm_alarm_callback_t,
    context: *mut c_void,
) {
    guard("gm_set_alarm", (), || {
        if alarm.is_null() {
            crate::status::set_last_error("gm_set_alarm: the alarm is NULL");
            return;
        }
        with_state(port, "gm_set_alarm", (), |state| {
            let deadline = state.alarms.set(
                alarm as usize,
                usecs,
                Instant::now(),
                callback,
                context as usize,
            );
            // SAFETY: the alarm's storage is the program's, initialised and alive while set (the
            // caller's promise); the library writes it only under the port's lock.
            unsafe {
                alarm.write(gm_alarm {
                    next: core::ptr::null_mut(),
                    state: gm_alarm_state::GM_ALARM_SET,
                    port,
                    callback,
                    context,
                    deadline,
                });
            }
        });
    });
}

/// Cancels `alarm` if it is set; its callback will not run. NULL, or an alarm not set, is
/// ignored.
///
/// # Safety
/// `alarm` is NULL or storage initialised with gm_initialize_alarm.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_cancel_alarm(alarm: *mut gm_alarm) {
    guard("gm_cancel_alarm", (), || {
        if alarm.is_null() {
            return;
        }
        // SAFETY: initialised storage (the caller's promise).
        let set = unsafe { alarm.read() };
        if set.state != gm_alarm_state::GM_ALARM_SET {
            return;
        }
        with_state(set.port, "gm_cancel_alarm", (), |state| {
            if state.alarms.cancel(alarm as usize) {
                // SAFETY: as in gm_set_alarm.
                unsafe { (&raw mut (*alarm).state).write(gm_alarm_state::GM_ALARM_FREE) };
            }
        });
    });
}

/// Makes a set alarm due now (GM's gm_flush_alarm): its GM_ALARM_EVENT comes from the next
/// receive call and gm_unknown runs its callback. An alarm not set is left alone.
///
/// # Safety
/// `alarm` is NULL or an alarm initialised with gm_initialize_alarm.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_flush_alarm(alarm: *mut gm_alarm) {
    guard("gm_flush_alarm", (), || {
        if alarm.is_null() {
            return;
        }
        // SAFETY: initialised storage (the caller's promise).
        let set = unsafe { alarm.read() };
        if set.state != gm_alarm_state::GM_ALARM_SET {
            return;
        }
        with_state(set.port, "gm_flush_alarm", (), |state| {
            state.alarms.flush(alarm as usize, Instant::now());
        });
    });
}

/// The smallest size class a message may have (GM's gm_min_message_size): 3, whose buffers
/// hold zero-length messages. 0 for a NULL port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_min_message_size(port: *mut gm_port) -> c_uint {
    guard("gm_min_message_size", 0, || {
        with_state(port, "gm_min_message_size", 0, |_| {
            crate::sizes::MIN_SIZE_CLASS
        })
    })
}

/// GM 1's handler for GM_SENT_EVENT, deprecated in GM 2: the same as passing the event to
/// gm_unknown (the ended sends' callbacks run).
///
/// # Safety
/// As gm_unknown.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_handle_sent_tokens(port: *mut gm_port, event: *mut gm_recv_event_t) {
    guard("gm_handle_sent_tokens", (), || {
        // SAFETY: the same promise, passed on.
        unsafe { super::port::gm_unknown(port, event) }
    })
}

/// GM's CRC of `length` bytes at `bytes`: CRC-32 (the IEEE 802.3 polynomial, reflected, as zlib
/// computes it). 0 for NULL.
///
/// # Safety
/// `bytes` is NULL or points to `length` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_crc(bytes: *mut c_void, length: c_ulong) -> c_ulong {
    guard("gm_crc", 0, || {
        // SAFETY: the caller's promise.
        let Some(bytes) = (unsafe { super::slice(bytes.cast::<u8>(), length as usize) }) else {
            return 0;
        };
        c_ulong::from(crate::crc::crc32(bytes))
    })
}

/// gm_crc of the NUL-terminated string `string`, without its NUL. 0 for NULL.
///
/// # Safety
/// `string` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_crc_str(string: *const c_char) -> c_ulong {
    guard("gm_crc_str", 0, || {
        if string.is_null() {
            return 0;
        }
        // SAFETY: the caller's promise.
        let bytes = unsafe { core::ffi::CStr::from_ptr(string) }.to_bytes();
        c_ulong::from(crate::crc::crc32(bytes))
    })
}

/// The port's clock: ticks of 0.5 microseconds since the port opened (GM's LANai clock ticks
/// at that rate). 0 for a NULL port.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_ticks(port: *mut gm_port) -> gm_u64_t {
    guard("gm_ticks", 0, || {
        with_state(port, "gm_ticks", 0, |state| {
            state.alarms.ticks(Instant::now())
        })
    })
}

/// Sleeps `seconds` seconds; returns 0.
#[unsafe(no_mangle)]
pub extern "C" fn gm_sleep(seconds: c_uint) -> c_int {
    guard("gm_sleep", 0, || {
        std::thread::sleep(Duration::from_secs(u64::from(seconds)));
        0
    })
}

/// What gm_on_exit registered: callbacks and their arguments, in the order registered.
static ON_EXIT: Mutex<Vec<(gm_on_exit_callback_t, usize)>> = Mutex::new(Vec::new());

/// Called by gm_exit with its status and the argument given to gm_on_exit.
pub type gm_on_exit_callback_t =
    Option<unsafe extern "C" fn(status: gm_status_t, arg: *mut c_void)>;

/// Registers `callback(status, arg)` to run in gm_exit, before the process exits; callbacks run
/// in the reverse order of their registration. Returns GM_SUCCESS (GM_INVALID_PARAMETER for a
/// NULL callback).
#[unsafe(no_mangle)]
pub extern "C" fn gm_on_exit(callback: gm_on_exit_callback_t, arg: *mut c_void) -> gm_status_t {
    guard("gm_on_exit", GM_INTERNAL_ERROR, || {
        if callback.is_none() {
            return fail(GM_INVALID_PARAMETER, "gm_on_exit: the callback is NULL");
        }
        ON_EXIT
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((callback, arg as usize));
        GM_SUCCESS
    })
}

/// Exits the process: runs the callbacks of gm_on_exit (last registered first), then exits with
/// status 0 for GM_SUCCESS, otherwise with the status code (1 if it does not fit an exit status)
/// after printing the status's text on standard error.
#[unsafe(no_mangle)]
pub extern "C" fn gm_exit(status: gm_status_t) {
    guard("gm_exit", (), || {
        loop {
            let next = ON_EXIT.lock().unwrap_or_else(PoisonError::into_inner).pop();
            let Some((callback, arg)) = next else {
                break;
            };
            if let Some(callback) = callback {
                // SAFETY: the program registered this function for this purpose; no lock is held.
                unsafe { callback(status, arg as *mut c_void) };
            }
        }
        if status == GM_SUCCESS {
            std::process::exit(0);
        }
        let code = if (1..=255).contains(&status) {
            status
        } else {
            1
        };
        let text = crate::status::message(status).to_string_lossy();
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!("nicbar: gm_exit: {text}\n"),
        );
        std::process::exit(code);
    });
}

/// Stores in `*node_id` the largest node id the NIC supports: 65535 (node ids are 16 bits; on
/// this fabric node 0 is a node like any other). GM_INVALID_PARAMETER if a pointer is NULL or the
/// port is not open.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `node_id` is NULL or points to a writable `unsigned
/// int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_max_node_id(port: *mut gm_port, node_id: *mut c_uint) -> gm_status_t {
    guard("gm_max_node_id", GM_INTERNAL_ERROR, || {
        if node_id.is_null() {
            return fail(GM_INVALID_PARAMETER, "gm_max_node_id: node_id is NULL");
        }
        with_state(port, "gm_max_node_id", GM_INVALID_PARAMETER, |_| {
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe { node_id.write(c_uint::from(u16::MAX)) };
            GM_SUCCESS
        })
    })
}

/// Myrinet's switch between dropping and refusing packets for a closed port; this NIC always
/// refuses them (a send to a closed port fails at once with GM_SEND_TARGET_PORT_CLOSED), so
/// there is nothing to switch. Returns GM_NOT_SUPPORTED_ON_ARCH.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_set_enable_nack_down(port: *mut gm_port, flag: c_int) -> gm_status_t {
    guard("gm_set_enable_nack_down", GM_INTERNAL_ERROR, || {
        let _ = (port, flag);
        fail(
            GM_NOT_SUPPORTED_ON_ARCH,
            "gm_set_enable_nack_down: this NIC always refuses packets for a closed port",
        )
    })
}

/// Myrinet's node type (GM, MX, ...); this fabric has one kind of node. Returns
/// GM_NOT_SUPPORTED_ON_ARCH and leaves `*node_type` alone.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get_node_type(
    port: *mut gm_port,
    node_type: *mut c_int,
) -> gm_status_t {
    guard("gm_get_node_type", GM_INTERNAL_ERROR, || {
        let _ = (port, node_type);
        fail(
            GM_NOT_SUPPORTED_ON_ARCH,
            "gm_get_node_type: this fabric has one kind of node",
        )
    })
}

/// Aborts the process at once (no cleanup, a core dump where enabled).
#[unsafe(no_mangle)]
pub extern "C" fn gm_abort() {
    guard("gm_abort", (), || std::process::abort());
}
