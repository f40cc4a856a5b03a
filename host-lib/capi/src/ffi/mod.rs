//! The FFI edge: every `extern "C"` export, and the one module of the C API with `unsafe` code.
//!
//! Here and only here: pointers from C are checked and read, port handles are turned back into
//! ports (a handle that is NULL, closed, or never opened is refused instead of used), events are
//! published where C reads them, callbacks into C are run, and every export runs under the panic
//! boundary ([`guard`]): a panic becomes `GM_INTERNAL_ERROR` (or the function's empty result)
//! and a message in `nicbar_last_error()`, never an unwind into C. What the calls mean is the safe
//! modules' ([`crate::state`], [`crate::receive`], [`crate::group`], ...).
#![allow(
    unsafe_code,
    reason = "the FFI edge: raw pointers from C, exported symbols, callbacks into C"
)]

// The header lists items in this order (blank lines keep rustfmt from sorting them).
pub mod port;

pub mod gm2;

pub mod names;

pub mod barrier;

pub mod bytes;

pub mod status;

pub mod util;

pub mod coll;

pub mod rdma;

pub mod fastpath;

use core::ffi::c_void;
use std::cell::UnsafeCell;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::events::simple_event;
use crate::state::PortState;
use crate::status::{fail, set_last_error};
use crate::types::*;

/// The ports open in this process, by address: a handle that is not here (closed, or never a
/// port) is refused instead of used.
static OPEN_PORTS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

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

/// Runs `body`, turning a panic into `on_panic` (and a last error saying so) instead of letting it
/// unwind into C. Every exported function goes through here or through [`guard_or`].
pub(crate) fn guard<T>(function: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    guard_or(function, |_| on_panic, body)
}

/// [`guard`] for the exports that report errors through buffers of their own (the collectives'
/// message and error buffers): a panic's message, the same as the last error's, is handed to
/// `on_panic`, which writes it there and gives the result.
pub(crate) fn guard_or<T>(
    function: &str,
    on_panic: impl FnOnce(String) -> T,
    body: impl FnOnce() -> T,
) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_owned());
            let message = format!("{function}: internal error in the nicbar library: {what}");
            set_last_error(message.clone());
            on_panic(message)
        }
    }
}

/// What a `gm_port` handle points to: an open port.
pub(crate) struct OpenPort {
    state: Mutex<PortState>,
    /// The event the last receive call returned; C reads it through the pointer it was given,
    /// until its next receive call.
    event: UnsafeCell<gm_recv_event>,
    /// gm_unknown calls running callbacks: a gm_close from a callback waits for them.
    callbacks_running: AtomicU32,
    /// gm_close was called from a callback; gm_unknown closes the port when its callbacks return.
    close_requested: AtomicBool,
}

fn open_ports() -> MutexGuard<'static, Option<HashSet<usize>>> {
    OPEN_PORTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes a handle for `state` and registers it as open.
fn register(state: PortState) -> *mut gm_port {
    let handle = Box::into_raw(Box::new(OpenPort {
        state: Mutex::new(state),
        event: UnsafeCell::new(simple_event(GM_NO_RECV_EVENT)),
        callbacks_running: AtomicU32::new(0),
        close_requested: AtomicBool::new(false),
    }));
    open_ports()
        .get_or_insert_with(HashSet::new)
        .insert(handle as usize);
    handle.cast()
}

/// The port behind `handle`, if it is an open port of this process.
///
/// # Safety
/// The caller does not close the port (free the handle) while it uses the reference; C is told
/// not to close a port while another thread uses it.
unsafe fn port_ref<'a>(handle: *mut gm_port, function: &str) -> Option<&'a OpenPort> {
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
    // SAFETY: the handle is registered, so it came from `register`'s Box of an `OpenPort` and
    // gm_close has not freed it (it unregisters first); the caller keeps it alive while the
    // reference is used.
    Some(unsafe { &*handle.cast::<OpenPort>() })
}

/// Unregisters and frees the port, closing it.
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
    // SAFETY: registered means it came from Box::into_raw in `register` and was not freed; it is
    // unregistered now, so no later call reaches it.
    let owned = unsafe { Box::from_raw(port.cast::<OpenPort>()) };
    owned
        .state
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
        .close();
}

impl OpenPort {
    /// The port's state, or why it cannot be had (a panic left it inconsistent).
    fn lock(&self, function: &str) -> Result<MutexGuard<'_, PortState>, gm_status_t> {
        self.state.lock().map_err(|_| {
            fail(
                GM_INTERNAL_ERROR,
                format!("{function}: the port is unusable after an internal error"),
            )
        })
    }

    /// Stores `event` as the port's current event; returns the pointer C reads it through.
    /// `_held` is the port's lock, held.
    fn publish(
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
        let (owed, alarms_owed) = match self.lock("gm_unknown") {
            Ok(state) => (state.completions.len(), state.alarm_callbacks.len()),
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
            if let Some((address, value)) = completion.result {
                // SAFETY: the program gave this address for a NIC atomic's result and keeps it
                // writable until the atomic's callback, which runs next (nicbar_atomic_*).
                unsafe { core::ptr::write_unaligned(address as *mut u64, value) };
            }
            if let Some(callback) = completion.callback {
                // SAFETY: the program gave this function for this purpose; the port's lock is
                // not held, so it may call back into the library.
                unsafe { callback(handle, completion.context as *mut c_void, completion.status) };
            }
        }
        for _ in 0..alarms_owed {
            let fired = match self.lock("gm_unknown") {
                Ok(mut state) => state.alarm_callbacks.pop_front(),
                Err(_) => None,
            };
            let Some((callback, context, alarm)) = fired else {
                break;
            };
            let alarm = alarm as *mut gm_alarm;
            // SAFETY: the alarm's storage stays alive until it fires (the API's rule); it fired,
            // so it is free again before its callback runs (which may set it again).
            unsafe { (&raw mut (*alarm).state).write(gm_alarm_state::GM_ALARM_FREE) };
            if let Some(callback) = callback {
                // SAFETY: the program gave this function for this alarm; no lock is held.
                unsafe { callback(context as *mut c_void) };
            }
        }
        drop(running);
        self.callbacks_running.load(Ordering::Acquire) == 0
            && self.close_requested.load(Ordering::Acquire)
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

/// The event's type byte, which every member keeps in the same place.
fn event_type(event: &gm_recv_event) -> u8 {
    // SAFETY: every member is plain bytes with `type` at offset 63 (asserted in `types`), so
    // reading the `recv` view of any member is reading initialised bytes.
    unsafe { event.recv.r#type.n }
}

/// A slice of `count` `T`s at `pointer`: empty for a count of 0, `None` for NULL with a count.
///
/// # Safety
/// `pointer` is NULL or points to `count` readable `T`s that stay unchanged while the slice is
/// used.
unsafe fn slice<'a, T>(pointer: *const T, count: usize) -> Option<&'a [T]> {
    if count == 0 {
        return Some(&[]);
    }
    if pointer.is_null() {
        return None;
    }
    // SAFETY: not NULL, and `count` elements are readable there (the caller's promise).
    Some(unsafe { core::slice::from_raw_parts(pointer, count) })
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;
    use crate::events::{BufferInfo, barrier_event, receive_event};

    /// The edge's sources, by file name.
    const SOURCES: [(&str, &str); 9] = [
        ("ffi/mod.rs", include_str!("mod.rs")),
        ("ffi/port.rs", include_str!("port.rs")),
        ("ffi/gm2.rs", include_str!("gm2.rs")),
        ("ffi/barrier.rs", include_str!("barrier.rs")),
        ("ffi/bytes.rs", include_str!("bytes.rs")),
        ("ffi/status.rs", include_str!("status.rs")),
        ("ffi/util.rs", include_str!("util.rs")),
        ("ffi/fastpath.rs", include_str!("fastpath.rs")),
        ("ffi/coll.rs", include_str!("coll.rs")),
    ];

    /// Every exported function's body is the panic boundary: after any `const` items and
    /// comments, its first statement is a call of `guard` (or `guard_or`).
    #[test]
    fn every_export_runs_under_the_panic_boundary() {
        let mut exports = 0;
        let marker = ["#[unsafe(no_", "mangle)]"].concat();
        for (file, source) in SOURCES {
            for (index, _) in source.match_indices(&marker) {
                let item = &source[index..];
                if item
                    .lines()
                    .nth(1)
                    .is_some_and(|l| l.starts_with("pub static "))
                {
                    continue;
                }
                let name = item
                    .split("fn ")
                    .nth(1)
                    .and_then(|rest| rest.split('(').next())
                    .unwrap_or("?");
                let body = item
                    .find("{\n")
                    .map(|open| &item[open + 2..])
                    .unwrap_or_default();
                let first = body
                    .lines()
                    .map(str::trim)
                    .find(|line| {
                        !line.is_empty() && !line.starts_with("const ") && !line.starts_with("//")
                    })
                    .unwrap_or_default();
                assert!(
                    first.starts_with("guard(") || first.starts_with("guard_or("),
                    "{file}: {name} does not start with guard(...): `{first}`"
                );
                exports += 1;
            }
        }
        assert!(
            exports >= 78,
            "found only {exports} exports: the scan is broken"
        );
    }

    /// No export lives outside the edge.
    #[test]
    fn the_safe_modules_export_nothing() {
        for (file, source) in [
            ("lib.rs", include_str!("../lib.rs")),
            ("types.rs", include_str!("../types.rs")),
            ("state.rs", include_str!("../state.rs")),
            ("receive.rs", include_str!("../receive.rs")),
            ("barrier.rs", include_str!("../barrier.rs")),
            ("group.rs", include_str!("../group.rs")),
            ("events.rs", include_str!("../events.rs")),
            ("status.rs", include_str!("../status.rs")),
            ("slab.rs", include_str!("../slab.rs")),
            ("sizes.rs", include_str!("../sizes.rs")),
            ("alarms.rs", include_str!("../alarms.rs")),
        ] {
            assert!(
                !source.contains(&["no_", "mangle"].concat()),
                "{file} exports a symbol"
            );
        }
    }

    #[test]
    fn a_panic_becomes_the_fallback_and_a_message() {
        let status = guard("test_function", GM_INTERNAL_ERROR, || -> gm_status_t {
            panic!("boom")
        });
        assert_eq!(status, GM_INTERNAL_ERROR);
        // SAFETY: nicbar_last_error returns a NUL-terminated string owned by this thread.
        let text = unsafe { CStr::from_ptr(status::nicbar_last_error()) };
        let text = text.to_str().unwrap();
        assert!(
            text.contains("test_function") && text.contains("boom"),
            "{text}"
        );
    }

    #[test]
    fn events_put_their_fields_where_gm_does_in_network_order() {
        let event = receive_event(
            GM_HIGH_RECV_EVENT,
            BufferInfo {
                address: 0x1234_5678,
                tag: 0x0102_0304,
                size: 7,
            },
            100,
            0x0a0b,
            3,
        );
        assert_eq!(event_type(&event), GM_HIGH_RECV_EVENT);
        // SAFETY: the event was built as its `recv` member.
        let recv = unsafe { event.recv };
        assert_eq!(u32::from_be(recv.length.n), 100);
        assert_eq!(u16::from_be(recv.sender_node_id.n), 0x0a0b);
        assert_eq!(recv.tag.n, 0x04, "the low 8 bits of the tag");
        assert_eq!(u32::from_be(recv.nicbar_tag.n), 0x0102_0304);
        assert_eq!(u64::from_be(recv.buffer.n), 0x1234_5678);
        assert_eq!(recv.size.n, 7);
        assert_eq!(recv.sender_port_id.n, 3);
        let ended = barrier_event(GM_BARRIER_FAILED_EVENT, 0x77, GM_TIMED_OUT, Some((3, 2)));
        assert_eq!(event_type(&ended), GM_BARRIER_FAILED_EVENT);
        // SAFETY: built as its `barrier` member.
        let barrier = unsafe { ended.barrier };
        assert_eq!(u64::from_be(barrier.context.n), 0x77);
        assert_eq!(u32::from_be(barrier.status.n), GM_TIMED_OUT as u32);
        assert_eq!(u16::from_be(barrier.waiting_for_node_id.n), 3);
        assert_eq!(barrier.waiting_for_port_id.n, 2);
        assert_eq!(event_type(&simple_event(GM_SENT_EVENT)), GM_SENT_EVENT);
        // SAFETY: the static is a valid event.
        assert_eq!(event_type(unsafe { &*no_event() }), GM_NO_RECV_EVENT);
    }
}
