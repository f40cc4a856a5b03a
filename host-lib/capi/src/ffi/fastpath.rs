//! The exports of MVAPICH's RDMA-write eager fast path (Liu et al., *High Performance RDMA-Based
//! MPI Implementation over InfiniBand*) and its remote locks, over the Rust library's
//! `FastPath`: `nicbar_fastpath_*` and `nicbar_lock_*`.
//!
//! A fast path owns a port of its own (opened by nicbar_fastpath_open, never by gm_open) and
//! takes every event of it. Each handle is behind a lock: calls on one fast path from several
//! threads run one at a time (a receive that waits holds the others off for its wait). Every
//! export runs under the panic boundary; a handle that is NULL, closed or never opened is
//! refused with GM_INVALID_PARAMETER, and nicbar_last_error() says what each failing call
//! objected to.

use core::ffi::{c_int, c_uint, c_void};
use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nicbar_rs::fastpath::{MAX_MESSAGE, MAX_SLOTS, Stats};
use nicbar_rs::{Error, FastPath, FastPathConfig, LockMode, Message, NodeId, PeerId, Port, PortId};
use shared_abi::ids::PORTS_PER_NIC;

use super::{guard, slice};
use crate::status::{fail, from_error};
use crate::types::*;

/// The longest message nicbar_fastpath_send takes (what one ordinary message carries).
pub const NICBAR_FASTPATH_MAX_MESSAGE: c_uint = 4072;
/// The most slots a fast path's ring may have (nicbar_fastpath_config's `slots`).
pub const NICBAR_FASTPATH_MAX_SLOTS: c_uint = 128;
const _: () = assert!(NICBAR_FASTPATH_MAX_MESSAGE as usize == MAX_MESSAGE);
const _: () = assert!(NICBAR_FASTPATH_MAX_SLOTS == MAX_SLOTS);

/// The most peers a fast path connects to (nicbar_fastpath_config's `max_peers`).
pub const NICBAR_FASTPATH_MAX_PEERS: c_uint = 1024;
/// The most receive buffers a fast path keeps provided (`receive_buffers`).
pub const NICBAR_FASTPATH_MAX_RECEIVE_BUFFERS: c_uint = 256;
/// The most lock words a fast path hosts (`locks`).
pub const NICBAR_FASTPATH_MAX_LOCKS: c_uint = 1024;
/// The most shared bytes a fast path hosts (`shared_bytes`).
pub const NICBAR_FASTPATH_MAX_SHARED_BYTES: c_uint = 1 << 20;
/// The most bytes a fast path's receiving rings take in all: `polling_set` x `slots` x
/// (`slot_payload` rounded up to 8, plus 40).
pub const NICBAR_FASTPATH_MAX_RING_BYTES: u64 = 64 << 20;

/// A message took the fast path: one put into the receiver's ring.
pub const NICBAR_FASTPATH_ROUTE_FAST: c_int = 1;
/// A message took the ordinary path: a message into a receive buffer.
pub const NICBAR_FASTPATH_ROUTE_ORDINARY: c_int = 2;

/// A lock mode (nicbar_lock_attach): exclusive, by NIC atomics on the target's lock word; the
/// target's process takes no part (it may compute and never call the library).
pub const NICBAR_LOCK_PASSIVE: c_int = 0;
/// A lock mode: shared with other shared holders, never with an exclusive one; by NIC atomics,
/// passive as NICBAR_LOCK_PASSIVE.
pub const NICBAR_LOCK_PASSIVE_SHARED: c_int = 1;
/// A lock mode: exclusive, granted in FIFO order by the target's process from inside its own
/// calls on its fast path (nicbar_fastpath_receive, ...): the baseline that needs the target's
/// progress.
pub const NICBAR_LOCK_SERVED: c_int = 2;

/// A fast path: its port, its peers' rings, its lock words. Opaque.
pub struct nicbar_fastpath {
    inner: Mutex<Open>,
}

struct Open {
    fast: FastPath,
    /// A message nicbar_fastpath_receive found too long for the caller's buffer, kept for the
    /// next call.
    pending: Option<Message>,
    config: FastPathConfig,
}

/// The shape of a fast path (nicbar_fastpath_open). nicbar_fastpath_config_default() fills in
/// the defaults; change the fields you need.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nicbar_fastpath_config {
    /// Slots of each ring this process receives on (at most NICBAR_FASTPATH_MAX_SLOTS); 0 turns
    /// the fast path off toward this process (every peer then uses the ordinary path to it).
    /// Default 32.
    pub slots: u32,
    /// Payload bytes a slot holds (at most NICBAR_FASTPATH_MAX_MESSAGE); longer messages take
    /// the ordinary path. Default 1024.
    pub slot_payload: u32,
    /// Peers whose rings this process polls: the first this many it connects to (at most
    /// `max_peers`); peers beyond it send to this process the ordinary way. Default 8.
    pub polling_set: u32,
    /// The most peers this process connects to (1 to NICBAR_FASTPATH_MAX_PEERS). Default 64.
    pub max_peers: u32,
    /// Receive buffers kept provided for the ordinary path (1 to
    /// NICBAR_FASTPATH_MAX_RECEIVE_BUFFERS). Default 32.
    pub receive_buffers: u32,
    /// Lock words this process hosts for its peers (at most NICBAR_FASTPATH_MAX_LOCKS). Default
    /// 1.
    pub locks: u32,
    /// Bytes of shared memory after the lock words, which peers read and write with
    /// nicbar_fastpath_read_u64 and nicbar_fastpath_write_u64 (at most
    /// NICBAR_FASTPATH_MAX_SHARED_BYTES; rounded up to whole 8-byte words). Default 64.
    pub shared_bytes: u32,
    /// Milliseconds a wait for a peer's hello, an operation on a peer's memory or a lock may
    /// last before it fails (GM_TIMED_OUT); 0: the default, 30000.
    pub setup_timeout_ms: u32,
}

/// What a fast path did so far (nicbar_fastpath_get_stats).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct nicbar_fastpath_stats {
    /// Messages sent by put into a ring.
    pub sent_fast: gm_u64_t,
    /// Messages sent the ordinary way because they were longer than the receiver's slots.
    pub fallback_too_long: gm_u64_t,
    /// Messages sent the ordinary way because the receiver's ring had no room (no credit).
    pub fallback_no_credit: gm_u64_t,
    /// Messages sent the ordinary way because the receiver keeps no ring for this process, or by
    /// nicbar_fastpath_send_ordinary.
    pub fallback_no_ring: gm_u64_t,
    /// Messages received from rings.
    pub received_fast: gm_u64_t,
    /// Messages received the ordinary way.
    pub received_ordinary: gm_u64_t,
    /// Messages delivered after waiting for an earlier one of the same peer.
    pub reordered: gm_u64_t,
    /// Credit puts sent (besides the acknowledgements carried by messages).
    pub credit_puts: gm_u64_t,
    /// Hellos, messages and slots refused as malformed, duplicated or from no known peer.
    pub rejected: gm_u64_t,
}

/// A lock word of a peer, as nicbar_lock_attach found it: which fast path, peer, lock and mode,
/// and whether this process holds it. Fill it only with nicbar_lock_attach; read it freely.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct nicbar_lock {
    /// The fast path the lock was attached on.
    pub fastpath: *const nicbar_fastpath,
    /// The peer hosting the lock word (from nicbar_fastpath_connect).
    pub peer: u32,
    /// The lock word's number on the peer.
    pub index: u32,
    /// NICBAR_LOCK_PASSIVE, NICBAR_LOCK_PASSIVE_SHARED or NICBAR_LOCK_SERVED.
    pub mode: c_int,
    /// 1 while this process holds it (between nicbar_lock_acquire and nicbar_lock_release).
    pub held: u32,
}

/// The fast paths open in this process, by address.
static OPEN_FASTPATHS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn open_fastpaths() -> MutexGuard<'static, Option<HashSet<usize>>> {
    OPEN_FASTPATHS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Runs `body` on the fast path behind `handle`, or refuses the handle.
fn with_fast(
    handle: *mut nicbar_fastpath,
    function: &str,
    body: impl FnOnce(&mut Open) -> gm_status_t,
) -> gm_status_t {
    if handle.is_null() {
        return fail(
            GM_INVALID_PARAMETER,
            format!("{function}: the fast path is NULL"),
        );
    }
    let open = open_fastpaths()
        .as_ref()
        .is_some_and(|set| set.contains(&(handle as usize)));
    if !open {
        return fail(
            GM_INVALID_PARAMETER,
            format!("{function}: {handle:p} is not an open fast path (closed, or never opened)"),
        );
    }
    // SAFETY: the handle is registered, so it came from nicbar_fastpath_open's Box and
    // nicbar_fastpath_close has not freed it (it unregisters first); C is told not to close a
    // fast path while another thread uses it.
    let fast = unsafe { &*handle };
    match fast.inner.lock() {
        Ok(mut open) => body(&mut open),
        Err(_) => fail(
            GM_INTERNAL_ERROR,
            format!("{function}: the fast path is unusable after an internal error"),
        ),
    }
}

/// Records `error` from `function` and returns its status: GM_TIMED_OUT if the call waited as
/// long as the fast path waits (`since` is when it began), else the library's status.
fn refuse(function: &str, error: &Error, since: Instant, open: &Open) -> gm_status_t {
    let status = if since.elapsed() >= open.config.setup_timeout {
        GM_TIMED_OUT
    } else if matches!(error, Error::Protocol(_)) {
        GM_FAILURE
    } else {
        from_error(error)
    };
    fail(status, format!("{function}: {error}"))
}

/// The peer `peer` names; one past the connected ones is refused by the library (`refuse_peer`).
fn peer_of(function: &str, peer: c_uint) -> Result<PeerId, gm_status_t> {
    usize::try_from(peer)
        .map(PeerId)
        .map_err(|_| fail(GM_INVALID_PARAMETER, format!("{function}: no peer {peer}")))
}

fn config_from(config: &nicbar_fastpath_config) -> Result<FastPathConfig, String> {
    let c = *config;
    let checks: [(bool, String); 8] = [
        (
            c.slots <= NICBAR_FASTPATH_MAX_SLOTS,
            format!("{} slots: at most {NICBAR_FASTPATH_MAX_SLOTS}", c.slots),
        ),
        (
            c.slot_payload <= NICBAR_FASTPATH_MAX_MESSAGE,
            format!(
                "slots of {} bytes: at most {NICBAR_FASTPATH_MAX_MESSAGE}",
                c.slot_payload
            ),
        ),
        (
            (1..=NICBAR_FASTPATH_MAX_PEERS).contains(&c.max_peers),
            format!("{} peers: 1 to {NICBAR_FASTPATH_MAX_PEERS}", c.max_peers),
        ),
        (
            c.polling_set <= c.max_peers,
            format!(
                "a polling set of {} beyond {} peers",
                c.polling_set, c.max_peers
            ),
        ),
        (
            (1..=NICBAR_FASTPATH_MAX_RECEIVE_BUFFERS).contains(&c.receive_buffers),
            format!(
                "{} receive buffers: 1 to {NICBAR_FASTPATH_MAX_RECEIVE_BUFFERS}",
                c.receive_buffers
            ),
        ),
        (
            c.locks <= NICBAR_FASTPATH_MAX_LOCKS,
            format!("{} locks: at most {NICBAR_FASTPATH_MAX_LOCKS}", c.locks),
        ),
        (
            c.shared_bytes <= NICBAR_FASTPATH_MAX_SHARED_BYTES,
            format!(
                "{} shared bytes: at most {NICBAR_FASTPATH_MAX_SHARED_BYTES}",
                c.shared_bytes
            ),
        ),
        (
            u64::from(c.polling_set)
                * u64::from(c.slots)
                * (40 + u64::from(c.slot_payload).div_ceil(8) * 8)
                <= NICBAR_FASTPATH_MAX_RING_BYTES,
            format!(
                "rings of {} x {} slots of {} bytes: more than {NICBAR_FASTPATH_MAX_RING_BYTES} \
                 bytes",
                c.polling_set, c.slots, c.slot_payload
            ),
        ),
    ];
    if let Some((_, why)) = checks.into_iter().find(|(ok, _)| !ok) {
        return Err(why);
    }
    let timeout = if c.setup_timeout_ms == 0 {
        FastPathConfig::default().setup_timeout
    } else {
        Duration::from_millis(u64::from(c.setup_timeout_ms))
    };
    Ok(FastPathConfig {
        slots: c.slots,
        slot_payload: c.slot_payload as usize,
        polling_set: c.polling_set as usize,
        max_peers: c.max_peers as usize,
        receive_buffers: c.receive_buffers as usize,
        locks: c.locks as usize,
        shared_bytes: c.shared_bytes as usize,
        setup_timeout: timeout,
    })
}

fn lock_mode(mode: c_int) -> Option<LockMode> {
    match mode {
        NICBAR_LOCK_PASSIVE => Some(LockMode::Passive),
        NICBAR_LOCK_PASSIVE_SHARED => Some(LockMode::PassiveShared),
        NICBAR_LOCK_SERVED => Some(LockMode::Served),
        _ => None,
    }
}

fn stats_to_c(stats: Stats) -> nicbar_fastpath_stats {
    nicbar_fastpath_stats {
        sent_fast: stats.sent_fast,
        fallback_too_long: stats.fallback_too_long,
        fallback_no_credit: stats.fallback_no_credit,
        fallback_no_ring: stats.fallback_no_ring,
        received_fast: stats.received_fast,
        received_ordinary: stats.received_ordinary,
        reordered: stats.reordered,
        credit_puts: stats.credit_puts,
        rejected: stats.rejected,
    }
}

/// Writes `value` through `pointer` if it is not NULL.
///
/// # Safety
/// `pointer` is NULL or valid for a write of a `T`.
unsafe fn put_out<T>(pointer: *mut T, value: T) {
    if !pointer.is_null() {
        // SAFETY: not NULL, and writable (the caller's promise).
        unsafe { pointer.write(value) };
    }
}

// ---------------------------------------------------------------------------------------------
// Exports.

/// Fills `*config` with the defaults: 32 slots of 1024 bytes, a polling set of 8, 64 peers, 32
/// receive buffers, 1 lock word, 64 shared bytes, a 30 s setup timeout. Ignores NULL.
///
/// # Safety
/// `config` is NULL or points to a writable nicbar_fastpath_config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_config_default(config: *mut nicbar_fastpath_config) {
    guard("nicbar_fastpath_config_default", (), || {
        let d = FastPathConfig::default();
        let value = nicbar_fastpath_config {
            slots: d.slots,
            slot_payload: d.slot_payload as u32,
            polling_set: d.polling_set as u32,
            max_peers: d.max_peers as u32,
            receive_buffers: d.receive_buffers as u32,
            locks: d.locks as u32,
            shared_bytes: d.shared_bytes as u32,
            setup_timeout_ms: d.setup_timeout.as_millis() as u32,
        };
        // SAFETY: the caller's promise about `config`.
        unsafe { put_out(config, value) };
    });
}

/// Opens port `port_id` of NIC `unit` (found as gm_open finds the daemon) and a fast path over
/// it shaped by `*config` (NULL: the defaults), and stores its handle in `*fastpath` (NULL on
/// failure). The fast path owns the port: do not gm_open it too. It registers its rings, lock
/// words and shared bytes with the port and lets peers access them.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (`fastpath` is NULL, or a field of `*config` out of
/// its bounds: nicbar_last_error() names it); GM_INVALID_PORT_NUMBER; and gm_open's statuses
/// (GM_DEV_NOT_FOUND, GM_NO_SUCH_DEVICE, GM_BUSY, ...).
///
/// # Safety
/// `fastpath` is NULL or points to writable storage for a pointer; `config` is NULL or points to
/// a nicbar_fastpath_config.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_open(
    fastpath: *mut *mut nicbar_fastpath,
    unit: c_uint,
    port_id: c_uint,
    config: *const nicbar_fastpath_config,
) -> gm_status_t {
    guard("nicbar_fastpath_open", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_open";
        if fastpath.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                format!("{F}: the handle pointer is NULL"),
            );
        }
        // SAFETY: not NULL, and writable (the caller's promise).
        unsafe { fastpath.write(core::ptr::null_mut()) };
        let shape = if config.is_null() {
            FastPathConfig::default()
        } else {
            // SAFETY: not NULL, and a readable config (the caller's promise).
            match config_from(unsafe { &*config }) {
                Ok(shape) => shape,
                Err(why) => return fail(GM_INVALID_PARAMETER, format!("{F}: {why}")),
            }
        };
        let Ok(unit) = u8::try_from(unit) else {
            return fail(GM_NO_SUCH_DEVICE, format!("{F}: no NIC unit {unit}"));
        };
        let port_number = match u8::try_from(port_id) {
            Ok(port) if usize::from(port) < PORTS_PER_NIC => port,
            _ => {
                return fail(
                    GM_INVALID_PORT_NUMBER,
                    format!("{F}: no port {port_id} on a NIC"),
                );
            }
        };
        let port = match Port::open(unit, port_number) {
            Ok(port) => port,
            Err(error) => return fail(from_error(&error), format!("{F}: {error}")),
        };
        let fast = match FastPath::new(port, shape) {
            Ok(fast) => fast,
            Err(error) => return fail(from_error(&error), format!("{F}: {error}")),
        };
        let handle = Box::into_raw(Box::new(nicbar_fastpath {
            inner: Mutex::new(Open {
                fast,
                pending: None,
                config: shape,
            }),
        }));
        open_fastpaths()
            .get_or_insert_with(HashSet::new)
            .insert(handle as usize);
        // SAFETY: as above.
        unsafe { fastpath.write(handle) };
        GM_SUCCESS
    })
}

/// Waits until everything this fast path sent has completed at its targets (at most the setup
/// timeout), then closes its port in order and frees it. Peers' later sends to it fail. NULL, or
/// a fast path closed already, is ignored (GM_SUCCESS). Returns what the wait reported
/// (GM_FAILURE if a send had failed, GM_TIMED_OUT); the fast path is freed either way.
///
/// # Safety
/// No other thread uses the fast path during or after the call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_close(fastpath: *mut nicbar_fastpath) -> gm_status_t {
    guard("nicbar_fastpath_close", GM_INTERNAL_ERROR, || {
        let registered = open_fastpaths()
            .as_mut()
            .is_some_and(|set| set.remove(&(fastpath as usize)));
        if !registered {
            return GM_SUCCESS;
        }
        // SAFETY: registered means it came from Box::into_raw in nicbar_fastpath_open and was not
        // freed; it is unregistered now, so no later call reaches it.
        let owned = unsafe { Box::from_raw(fastpath) };
        let mut open = owned
            .inner
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let since = Instant::now();
        let status = match open.fast.flush() {
            Ok(()) => GM_SUCCESS,
            Err(error) => refuse("nicbar_fastpath_close", &error, since, &open),
        };
        // Dropping the port closes it in order (what was posted goes out first).
        drop(open);
        status
    })
}

/// Connects to port `port_id` of node `node_id` — registers a ring for it if the polling set has
/// room, and sends it this side's hello — and stores the peer's id (0, 1, ... in the order of
/// connecting; the same id again for a peer connected already) in `*peer`. Does not wait for the
/// peer: connect to every peer first, then call nicbar_fastpath_wait_connected, so that
/// processes may connect in any order.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (NULL `peer`, a node or port out of range, more
/// peers than `max_peers`); what sending the hello returned.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `peer` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_connect(
    fastpath: *mut nicbar_fastpath,
    node_id: c_uint,
    port_id: c_uint,
    peer: *mut c_uint,
) -> gm_status_t {
    guard("nicbar_fastpath_connect", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_connect";
        with_fast(fastpath, F, |open| {
            if peer.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `peer` is NULL"));
            }
            let Ok(node) = u16::try_from(node_id) else {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!("{F}: node id {node_id} is out of range"),
                );
            };
            let port = match u8::try_from(port_id) {
                Ok(port) if usize::from(port) < PORTS_PER_NIC => PortId(port),
                _ => {
                    return fail(
                        GM_INVALID_PARAMETER,
                        format!("{F}: no port {port_id} on a NIC"),
                    );
                }
            };
            match open.fast.connect(NodeId::new(node), port) {
                Ok(id) => {
                    let Ok(id) = c_uint::try_from(id.0) else {
                        return fail(GM_INTERNAL_ERROR, format!("{F}: peer id out of range"));
                    };
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { peer.write(id) };
                    GM_SUCCESS
                }
                Err(Error::Protocol(why)) => fail(GM_INVALID_PARAMETER, format!("{F}: {why}")),
                Err(error) => fail(from_error(&error), format!("{F}: {error}")),
            }
        })
    })
}

/// Waits until every peer connected so far has sent its hello (it connected back), at most the
/// setup timeout. Returns GM_SUCCESS; GM_TIMED_OUT naming the silent peers in
/// nicbar_last_error(); GM_INVALID_PARAMETER for a bad handle.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_wait_connected(
    fastpath: *mut nicbar_fastpath,
) -> gm_status_t {
    guard("nicbar_fastpath_wait_connected", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_wait_connected";
        with_fast(fastpath, F, |open| {
            let since = Instant::now();
            match open.fast.wait_connected() {
                Ok(()) => GM_SUCCESS,
                Err(error) => refuse(F, &error, since, open),
            }
        })
    })
}

/// Sends `length` bytes at `data` to `peer`: by one put into the peer's ring when they fit its
/// slots and the ring has room, else the ordinary way — in order with the pair's other messages
/// either way. Stores the path taken in `*route` (NICBAR_FASTPATH_ROUTE_FAST or _ORDINARY) if
/// `route` is not NULL. The bytes are copied: `data` is free again on return. Waits (making
/// progress) for the peer's hello and for a send token, never for the receiver.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (an unknown peer, NULL `data` with a length, more
/// than NICBAR_FASTPATH_MAX_MESSAGE bytes); GM_TIMED_OUT (the peer never connected back);
/// GM_FAILURE (the peer failed: a send to it failed, or it wrote a corrupt slot — its messages
/// fail from then on, other peers' are unaffected).
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `data` is NULL or `length` readable bytes;
/// `route` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_send(
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    data: *const c_void,
    length: usize,
    route: *mut c_int,
) -> gm_status_t {
    guard("nicbar_fastpath_send", GM_INTERNAL_ERROR, || {
        // SAFETY: the caller's promise about `data`.
        unsafe {
            send(
                "nicbar_fastpath_send",
                fastpath,
                peer,
                data,
                length,
                route,
                true,
            )
        }
    })
}

/// Sends as nicbar_fastpath_send does, but always the ordinary way (the baseline), in order
/// with the pair's fast-path messages.
///
/// # Safety
/// As nicbar_fastpath_send.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_send_ordinary(
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    data: *const c_void,
    length: usize,
) -> gm_status_t {
    guard("nicbar_fastpath_send_ordinary", GM_INTERNAL_ERROR, || {
        // SAFETY: the caller's promise about `data`.
        unsafe {
            send(
                "nicbar_fastpath_send_ordinary",
                fastpath,
                peer,
                data,
                length,
                core::ptr::null_mut(),
                false,
            )
        }
    })
}

/// Waits at most `timeout_us` microseconds (0: only looks) for the next message from any peer,
/// polling the rings of the polling set and taking the port's events (serving the
/// NICBAR_LOCK_SERVED locks this process hosts meanwhile). Each peer's messages come in the
/// order it sent them, whichever path each took. The message's bytes are copied to `buffer`,
/// their count to `*length`, the sender's peer id to `*peer` and its path to `*route` (`peer`
/// and `route` may be NULL).
///
/// Returns GM_SUCCESS; GM_TIMED_OUT (no message within the time; nothing is written);
/// GM_OUTPUT_BUFFER_TOO_SMALL (the message is longer than `capacity`: `*length` says how long,
/// and the next call gets the same message); GM_INVALID_PARAMETER (NULL `length`, NULL `buffer`
/// with a capacity); GM_FAILURE (a peer broke the protocol or a send to it failed: that peer is
/// failed from then on, nicbar_last_error() names it, the others are unaffected).
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `buffer` is NULL or `capacity` writable
/// bytes; `length`, `peer` and `route` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_receive(
    fastpath: *mut nicbar_fastpath,
    timeout_us: gm_u64_t,
    buffer: *mut c_void,
    capacity: usize,
    length: *mut usize,
    peer: *mut c_uint,
    route: *mut c_int,
) -> gm_status_t {
    guard("nicbar_fastpath_receive", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_receive";
        with_fast(fastpath, F, |open| {
            if length.is_null() || (buffer.is_null() && capacity > 0) {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!("{F}: `length` is NULL, or `buffer` is NULL with a capacity"),
                );
            }
            let since = Instant::now();
            if open.pending.is_none() {
                match open.fast.receive_timeout(Duration::from_micros(timeout_us)) {
                    Ok(Some(message)) => open.pending = Some(message),
                    Ok(None) => {
                        return fail(
                            GM_TIMED_OUT,
                            format!("{F}: no message within {timeout_us} us"),
                        );
                    }
                    Err(error) => return refuse(F, &error, since, open),
                }
            }
            let Some(message) = open.pending.take() else {
                return fail(GM_INTERNAL_ERROR, format!("{F}: the message went missing"));
            };
            // SAFETY: `length` is not NULL and writable (the caller's promise).
            unsafe { length.write(message.data.len()) };
            if message.data.len() > capacity {
                let long = message.data.len();
                open.pending = Some(message);
                return fail(
                    GM_OUTPUT_BUFFER_TOO_SMALL,
                    format!("{F}: a message of {long} bytes for a buffer of {capacity}"),
                );
            }
            if !message.data.is_empty() {
                // SAFETY: `buffer` is not NULL (the capacity is at least the length, which is
                // not 0) and has `capacity` writable bytes (the caller's promise).
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        message.data.as_ptr(),
                        buffer.cast::<u8>(),
                        message.data.len(),
                    );
                }
            }
            let route_code = match message.route {
                nicbar_rs::Route::Fast => NICBAR_FASTPATH_ROUTE_FAST,
                nicbar_rs::Route::Ordinary => NICBAR_FASTPATH_ROUTE_ORDINARY,
            };
            // SAFETY: the caller's promises about `peer` and `route`.
            unsafe {
                put_out(
                    peer,
                    c_uint::try_from(message.peer.0).unwrap_or(c_uint::MAX),
                );
                put_out(route, route_code);
            }
            GM_SUCCESS
        })
    })
}

/// Waits (at most the setup timeout) until every message, put and credit this fast path sent
/// has completed at its target. Returns GM_SUCCESS; GM_FAILURE if a send failed;
/// GM_TIMED_OUT.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_flush(fastpath: *mut nicbar_fastpath) -> gm_status_t {
    guard("nicbar_fastpath_flush", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_flush";
        with_fast(fastpath, F, |open| {
            let since = Instant::now();
            match open.fast.flush() {
                Ok(()) => GM_SUCCESS,
                Err(error) => refuse(F, &error, since, open),
            }
        })
    })
}

/// Stores what the fast path did so far in `*stats`. GM_INVALID_PARAMETER for a NULL `stats`
/// or a bad handle.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `stats` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_get_stats(
    fastpath: *mut nicbar_fastpath,
    stats: *mut nicbar_fastpath_stats,
) -> gm_status_t {
    guard("nicbar_fastpath_get_stats", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_get_stats";
        with_fast(fastpath, F, |open| {
            if stats.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `stats` is NULL"));
            }
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe { stats.write(stats_to_c(open.fast.stats())) };
            GM_SUCCESS
        })
    })
}

/// Stores the fast path's own node id and port id (for its peers' nicbar_fastpath_connect) in
/// `*node_id` and `*port_id`; either may be NULL.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; the pointers are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_address(
    fastpath: *mut nicbar_fastpath,
    node_id: *mut c_uint,
    port_id: *mut c_uint,
) -> gm_status_t {
    guard("nicbar_fastpath_address", GM_INTERNAL_ERROR, || {
        with_fast(fastpath, "nicbar_fastpath_address", |open| {
            let port = open.fast.port();
            // SAFETY: the caller's promises.
            unsafe {
                put_out(node_id, c_uint::from(port.node_id().get()));
                put_out(port_id, c_uint::from(port.port_id().0));
            }
            GM_SUCCESS
        })
    })
}

/// Reads the 64-bit word at byte `offset` of `peer`'s shared bytes (after its lock words) with a
/// NIC get into `*value` — no atomicity with other processes: guard it with a lock. The peer's
/// process takes no part.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (NULL `value`, an unknown peer, a word outside the
/// peer's shared bytes); GM_PERMISSION_DENIED (the get failed); GM_TIMED_OUT.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_read_u64(
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    offset: usize,
    value: *mut gm_u64_t,
) -> gm_status_t {
    guard("nicbar_fastpath_read_u64", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_read_u64";
        with_fast(fastpath, F, |open| {
            if value.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `value` is NULL"));
            }
            let peer = match peer_of(F, peer) {
                Ok(peer) => peer,
                Err(status) => return status,
            };
            let since = Instant::now();
            match open.fast.read_u64(peer, offset) {
                Ok(word) => {
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { value.write(word) };
                    GM_SUCCESS
                }
                Err(error) => refuse_peer(F, &error, since, open),
            }
        })
    })
}

/// Writes `value` to the 64-bit word at byte `offset` of `peer`'s shared bytes with a NIC put,
/// and returns once it is in the peer's memory. Statuses as nicbar_fastpath_read_u64.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_write_u64(
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    offset: usize,
    value: gm_u64_t,
) -> gm_status_t {
    guard("nicbar_fastpath_write_u64", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_write_u64";
        with_fast(fastpath, F, |open| {
            let peer = match peer_of(F, peer) {
                Ok(peer) => peer,
                Err(status) => return status,
            };
            let since = Instant::now();
            match open.fast.write_u64(peer, offset, value) {
                Ok(()) => GM_SUCCESS,
                Err(error) => refuse_peer(F, &error, since, open),
            }
        })
    })
}

/// Reads the 64-bit word at byte `offset` of this process's own shared bytes (the ones its
/// peers reach with nicbar_fastpath_read_u64 and _write_u64) into `*value`.
/// GM_INVALID_PARAMETER for NULL `value` or a word outside the shared bytes.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_local_read_u64(
    fastpath: *mut nicbar_fastpath,
    offset: usize,
    value: *mut gm_u64_t,
) -> gm_status_t {
    guard("nicbar_fastpath_local_read_u64", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_local_read_u64";
        with_fast(fastpath, F, |open| {
            if value.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `value` is NULL"));
            }
            match local_word(F, open, offset) {
                Ok(at) => {
                    let word = open.fast.lock_region().bytes().load_u64(at);
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { value.write(word) };
                    GM_SUCCESS
                }
                Err(status) => status,
            }
        })
    })
}

/// Writes `value` to the 64-bit word at byte `offset` of this process's own shared bytes (not
/// atomic with peers' accesses: do it before they start, or under a lock).
/// GM_INVALID_PARAMETER for a word outside the shared bytes.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fastpath_local_write_u64(
    fastpath: *mut nicbar_fastpath,
    offset: usize,
    value: gm_u64_t,
) -> gm_status_t {
    guard("nicbar_fastpath_local_write_u64", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_fastpath_local_write_u64";
        with_fast(fastpath, F, |open| match local_word(F, open, offset) {
            Ok(at) => {
                open.fast
                    .lock_region()
                    .bytes()
                    .write(at, &value.to_le_bytes());
                GM_SUCCESS
            }
            Err(status) => status,
        })
    })
}

/// Attaches `*lock` to lock word `index` of `peer` (the peer hosts `locks` of them, from its
/// nicbar_fastpath_config) in `mode` (NICBAR_LOCK_PASSIVE, NICBAR_LOCK_PASSIVE_SHARED or
/// NICBAR_LOCK_SERVED), waiting for the peer's hello if it has not come yet. The lock words live
/// in the peer's registered memory: nothing is created, and any number of processes may attach
/// to the same word. A word must be used in one exclusive mode by everyone (passive or served),
/// shared holders only beside passive exclusive ones.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (NULL `lock`, an unknown peer or mode, a lock the
/// peer does not host); GM_TIMED_OUT (the peer never connected back).
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `lock` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_lock_attach(
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    index: c_uint,
    mode: c_int,
    lock: *mut nicbar_lock,
) -> gm_status_t {
    guard("nicbar_lock_attach", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_lock_attach";
        with_fast(fastpath, F, |open| {
            if lock.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `lock` is NULL"));
            }
            if lock_mode(mode).is_none() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: no lock mode {mode}"));
            }
            let peer_id = match peer_of(F, peer) {
                Ok(peer) => peer,
                Err(status) => return status,
            };
            let since = Instant::now();
            let hosted = match open.fast.peer_locks(peer_id) {
                Ok(hosted) => hosted,
                Err(error) => return refuse_peer(F, &error, since, open),
            };
            if index as usize >= hosted {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!("{F}: peer {peer} hosts {hosted} lock(s), not lock {index}"),
                );
            }
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe {
                lock.write(nicbar_lock {
                    fastpath: fastpath.cast_const(),
                    peer,
                    index,
                    mode,
                    held: 0,
                });
            }
            GM_SUCCESS
        })
    })
}

/// Takes the lock `*lock` names, returning once it is held (at most the setup timeout). Passive
/// modes retry with an exponential back-off (up to 64 us) and need nothing of the target's
/// process; NICBAR_LOCK_SERVED waits for the target's process to grant it, in FIFO order.
///
/// Returns GM_SUCCESS; GM_INVALID_PARAMETER (NULL `lock`, a lock not attached on this fast
/// path); GM_BUSY (this process holds it already through `*lock`); GM_TIMED_OUT (not had within
/// the setup timeout); GM_PERMISSION_DENIED (an atomic failed).
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `lock` is NULL or a nicbar_lock filled by
/// nicbar_lock_attach.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_lock_acquire(
    fastpath: *mut nicbar_fastpath,
    lock: *mut nicbar_lock,
) -> gm_status_t {
    guard("nicbar_lock_acquire", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_lock_acquire";
        with_fast(fastpath, F, |open| {
            // SAFETY: the caller's promise about `lock`.
            let (peer, index, mode) = match unsafe { attached(F, fastpath, lock) } {
                Ok(found) => found,
                Err(status) => return status,
            };
            // SAFETY: `attached` checked it is not NULL; readable and writable (the promise).
            let lock = unsafe { &mut *lock };
            if lock.held != 0 {
                return fail(
                    GM_BUSY,
                    format!("{F}: lock {index} of peer {} is held already", peer.0),
                );
            }
            let since = Instant::now();
            match open.fast.lock(peer, index, mode) {
                Ok(()) => {
                    lock.held = 1;
                    GM_SUCCESS
                }
                Err(error) => refuse_peer(F, &error, since, open),
            }
        })
    })
}

/// Gives up the lock `*lock` names, taken with nicbar_lock_acquire. Returns GM_SUCCESS;
/// GM_INVALID_PARAMETER (NULL `lock`, a lock not attached on this fast path, or not held through
/// `*lock`: the lock word is then left alone); GM_FAILURE (the word says another process holds
/// it); GM_PERMISSION_DENIED (an atomic failed).
///
/// # Safety
/// As nicbar_lock_acquire.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_lock_release(
    fastpath: *mut nicbar_fastpath,
    lock: *mut nicbar_lock,
) -> gm_status_t {
    guard("nicbar_lock_release", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_lock_release";
        with_fast(fastpath, F, |open| {
            // SAFETY: the caller's promise about `lock`.
            let (peer, index, mode) = match unsafe { attached(F, fastpath, lock) } {
                Ok(found) => found,
                Err(status) => return status,
            };
            // SAFETY: `attached` checked it is not NULL; readable and writable (the promise).
            let lock = unsafe { &mut *lock };
            if lock.held == 0 {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!("{F}: lock {index} of peer {} is not held", peer.0),
                );
            }
            let since = Instant::now();
            match open.fast.unlock(peer, index, mode) {
                Ok(()) => {
                    lock.held = 0;
                    GM_SUCCESS
                }
                Err(error) => refuse_peer(F, &error, since, open),
            }
        })
    })
}

/// Reads this process's own lock word `index` into `*value`: 0 when no one holds it (a
/// diagnostic: holders change it with NIC atomics at any time). GM_INVALID_PARAMETER for NULL
/// `value` or a lock this process does not host.
///
/// # Safety
/// `fastpath` is NULL or from nicbar_fastpath_open; `value` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_lock_word(
    fastpath: *mut nicbar_fastpath,
    index: c_uint,
    value: *mut gm_u64_t,
) -> gm_status_t {
    guard("nicbar_lock_word", GM_INTERNAL_ERROR, || {
        const F: &str = "nicbar_lock_word";
        with_fast(fastpath, F, |open| {
            if value.is_null() {
                return fail(GM_INVALID_PARAMETER, format!("{F}: `value` is NULL"));
            }
            if index as usize >= open.config.locks {
                return fail(
                    GM_INVALID_PARAMETER,
                    format!(
                        "{F}: this process hosts {} lock(s), not lock {index}",
                        open.config.locks
                    ),
                );
            }
            let word = open.fast.lock_region().bytes().load_u64(8 * index as usize);
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe { value.write(word) };
            GM_SUCCESS
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers of the exports.

/// Sends for nicbar_fastpath_send and _send_ordinary.
///
/// # Safety
/// `data` is NULL or `length` readable bytes; `route` is NULL or writable.
unsafe fn send(
    function: &str,
    fastpath: *mut nicbar_fastpath,
    peer: c_uint,
    data: *const c_void,
    length: usize,
    route: *mut c_int,
    fast: bool,
) -> gm_status_t {
    with_fast(fastpath, function, |open| {
        // SAFETY: the caller's promise about `data`.
        let Some(bytes) = (unsafe { slice(data.cast::<u8>(), length) }) else {
            return fail(
                GM_INVALID_PARAMETER,
                format!("{function}: `data` is NULL with a length of {length}"),
            );
        };
        let peer = match peer_of(function, peer) {
            Ok(peer) => peer,
            Err(status) => return status,
        };
        let since = Instant::now();
        let sent = if fast {
            open.fast.send(peer, bytes)
        } else {
            open.fast
                .send_ordinary_path(peer, bytes)
                .map(|()| nicbar_rs::Route::Ordinary)
        };
        match sent {
            Ok(taken) => {
                let code = match taken {
                    nicbar_rs::Route::Fast => NICBAR_FASTPATH_ROUTE_FAST,
                    nicbar_rs::Route::Ordinary => NICBAR_FASTPATH_ROUTE_ORDINARY,
                };
                // SAFETY: the caller's promise about `route`.
                unsafe { put_out(route, code) };
                GM_SUCCESS
            }
            Err(error) => refuse_peer(function, &error, since, open),
        }
    })
}

/// As [`refuse`], but an unknown peer or a word outside the peer's memory is the caller's
/// mistake: GM_INVALID_PARAMETER.
fn refuse_peer(function: &str, error: &Error, since: Instant, open: &Open) -> gm_status_t {
    if let Error::Protocol(why) = error
        && why.starts_with("no peer ")
    {
        return fail(GM_INVALID_PARAMETER, format!("{function}: {why}"));
    }
    refuse(function, error, since, open)
}

/// Where the word at `offset` of this process's shared bytes lies in its lock region.
fn local_word(function: &str, open: &Open, offset: usize) -> Result<usize, gm_status_t> {
    let shared = open.config.shared_bytes.div_ceil(8) * 8;
    match offset.checked_add(8) {
        Some(end) if end <= shared => Ok(8 * open.config.locks + offset),
        _ => Err(fail(
            GM_INVALID_PARAMETER,
            format!("{function}: a word at {offset} of {shared} shared bytes"),
        )),
    }
}

/// The peer, lock and mode of `*lock`, if it was attached on `fastpath`.
///
/// # Safety
/// `lock` is NULL or points to a readable nicbar_lock.
unsafe fn attached(
    function: &str,
    fastpath: *mut nicbar_fastpath,
    lock: *const nicbar_lock,
) -> Result<(PeerId, usize, LockMode), gm_status_t> {
    if lock.is_null() {
        return Err(fail(
            GM_INVALID_PARAMETER,
            format!("{function}: `lock` is NULL"),
        ));
    }
    // SAFETY: not NULL, and readable (the caller's promise).
    let lock = unsafe { lock.read() };
    let mode = lock_mode(lock.mode);
    match mode {
        Some(mode) if core::ptr::eq(lock.fastpath, fastpath) => {
            Ok((PeerId(lock.peer as usize), lock.index as usize, mode))
        }
        _ => Err(fail(
            GM_INVALID_PARAMETER,
            format!("{function}: the lock was not attached on this fast path"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CStr;

    use super::*;
    use crate::ffi::status::nicbar_last_error;

    fn last_error() -> String {
        // SAFETY: nicbar_last_error returns a NUL-terminated string owned by this thread.
        unsafe { CStr::from_ptr(nicbar_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    fn defaults() -> nicbar_fastpath_config {
        let mut config = core::mem::MaybeUninit::<nicbar_fastpath_config>::uninit();
        // SAFETY: the pointer is writable; the call fills every field.
        unsafe {
            nicbar_fastpath_config_default(config.as_mut_ptr());
            config.assume_init()
        }
    }

    #[test]
    fn the_default_config_is_the_rust_default_and_each_bound_is_refused_by_name() {
        let config = defaults();
        assert_eq!(config_from(&config), Ok(FastPathConfig::default()));
        type Change = fn(&mut nicbar_fastpath_config);
        let cases: [(&str, Change); 8] = [
            ("129 slots", |c| c.slots = 129),
            ("slots of 4073 bytes", |c| c.slot_payload = 4073),
            ("0 peers", |c| c.max_peers = 0),
            ("a polling set of 65 beyond 64 peers", |c| {
                c.polling_set = 65
            }),
            ("0 receive buffers", |c| c.receive_buffers = 0),
            ("1025 locks", |c| c.locks = 1025),
            ("1048577 shared bytes", |c| c.shared_bytes = (1 << 20) + 1),
            ("rings of 1024 x 128 slots", |c| {
                c.max_peers = 1024;
                c.polling_set = 1024;
                c.slots = 128;
                c.slot_payload = 4072;
            }),
        ];
        for (words, change) in cases {
            let mut bad = config;
            change(&mut bad);
            let why = config_from(&bad).expect_err(words);
            assert!(why.contains(words), "{why}");
        }
        let mut zero_timeout = config;
        zero_timeout.setup_timeout_ms = 0;
        assert_eq!(
            config_from(&zero_timeout).map(|c| c.setup_timeout),
            Ok(FastPathConfig::default().setup_timeout)
        );
    }

    #[test]
    fn null_and_unknown_handles_and_pointers_are_refused_with_a_message() {
        let mut config = defaults();
        config.slots = 1000;
        let mut handle: *mut nicbar_fastpath = core::ptr::dangling_mut();
        // SAFETY: `handle` is writable; `config` readable.
        let status = unsafe { nicbar_fastpath_open(&mut handle, 0, 3, &config) };
        assert_eq!(status, GM_INVALID_PARAMETER);
        assert!(handle.is_null(), "a failed open leaves NULL");
        assert!(last_error().contains("1000 slots"), "{}", last_error());
        // SAFETY: NULL is allowed for the out-pointer (refused).
        let status = unsafe { nicbar_fastpath_open(core::ptr::null_mut(), 0, 3, &config) };
        assert_eq!(status, GM_INVALID_PARAMETER);

        // A pointer that is no fast path is never dereferenced.
        let forged = 0x1000 as *mut nicbar_fastpath;
        let mut value = 0u64;
        for fast in [core::ptr::null_mut(), forged] {
            // SAFETY: the handle is refused before any use.
            let statuses = unsafe {
                [
                    nicbar_fastpath_send(fast, 0, b"x".as_ptr().cast(), 1, core::ptr::null_mut()),
                    nicbar_fastpath_read_u64(fast, 0, 0, &mut value),
                    nicbar_fastpath_wait_connected(fast),
                    nicbar_lock_word(fast, 0, &mut value),
                ]
            };
            assert_eq!(statuses, [GM_INVALID_PARAMETER; 4]);
            assert!(last_error().contains("fast path"), "{}", last_error());
        }
        // SAFETY: NULL and unknown handles are ignored by close.
        unsafe {
            assert_eq!(nicbar_fastpath_close(core::ptr::null_mut()), GM_SUCCESS);
            assert_eq!(nicbar_fastpath_close(forged), GM_SUCCESS);
        }
    }

    #[test]
    fn a_lock_is_refused_unless_attached_on_the_same_fast_path_in_a_known_mode() {
        let here = 0x2000 as *mut nicbar_fastpath;
        let elsewhere = 0x3000 as *const nicbar_fastpath;
        let mut lock = nicbar_lock {
            fastpath: elsewhere,
            peer: 0,
            index: 0,
            mode: NICBAR_LOCK_PASSIVE,
            held: 0,
        };
        // SAFETY: `lock` is readable.
        assert!(unsafe { attached("t", here, &lock) }.is_err());
        lock.fastpath = here;
        lock.mode = 7;
        // SAFETY: as above.
        assert!(unsafe { attached("t", here, &lock) }.is_err());
        lock.mode = NICBAR_LOCK_SERVED;
        // SAFETY: as above.
        let found = unsafe { attached("t", here, &lock) };
        assert_eq!(found, Ok((PeerId(0), 0, LockMode::Served)));
        // SAFETY: NULL is refused.
        assert!(unsafe { attached("t", here, core::ptr::null()) }.is_err());
    }
}
