//! Collectives for collective layers (an MPI library's `coll` component): one port per process,
//! a group per communicator, barriers in the NIC, and broadcast, scatter, gather and all-to-all
//! over messages.
//!
//! Barriers. The NIC runs a few barriers per port at once (four), each of its own identity, and a
//! process may start non-blocking barriers on several communicators before it waits for any. An
//! endpoint (`nicbar_coll_endpoint`) posts them: nicbar_coll_barrier_start() returns a ticket at
//! once; nicbar_coll_progress() (called from the library's progress loop) takes the ends and
//! posts queued barriers as the NIC has room; nicbar_coll_barrier_test() says whether a ticket's
//! barrier has ended and how. Barriers go to the NIC in the order they were started and each
//! completes on its own, so members that start non-blocking barriers of different communicators
//! in different orders (MPI orders collectives per communicator only) meet as long as none has
//! more than four outstanding; past that, later ones wait for earlier ones to end.
//!
//! A failed barrier names the member the NIC waited for by its rank in the group, which is the
//! rank in the communicator when the group lists the communicator's ranks in order.
//!
//! Allreduce in the NIC ([`reduce`]) and persistent barriers and allreduces, compiled once and
//! started many times ([`persistent`]), are queued and end as barriers do.
//!
//! Data collectives (CollGM's: Hoefler et al., *CollGM*, a Myrinet/GM optimized collective
//! component for Open MPI): nicbar_coll_bcast(), nicbar_coll_scatter[v](),
//! nicbar_coll_gather[v](), nicbar_coll_alltoall[v]() move contiguous bytes (the caller packs
//! other datatypes) between the group's ranks over nicbar messages, segmented into packets,
//! each call blocking until this rank's part is done. A `nicbar_coll_op` names the operation —
//! the communicator's context and the operation's sequence number on it, the same on every rank
//! — chooses its algorithm, gives the work to run while the call waits (an MPI library's
//! progress), and receives the failure's rank and reason. Every rank of the group must make the
//! same calls in the same order with matching lengths, as MPI requires.
//!
//! The endpoint and the collectives are the Rust library's (`nicbar::coll`); here are only the C
//! edge's argument and pointer checks, the algorithms' C numbers, and the status codes. Every
//! export runs under the crate's panic boundary ([`guard`], or [`guard_or`] where the panic's
//! message goes out through the call's own message buffer); handles may be NULL.

use core::ffi::{c_char, c_void};
use std::time::Duration;

use nicbar_rs::coll::map::{self, LoadOutcome};
use nicbar_rs::coll::{self, Alltoall, Bcast, CollError, Collective, Endpoint, Op, Tree, Unit};
use nicbar_rs::{Algorithm, BarrierOptions, Group, Member, NodeId, PortId};

use super::{guard, guard_or};

pub mod allreduce;
pub mod reduce;

pub mod persistent;

/// nicbar_coll_group_new()'s `algorithm`: the library's default for the group's size
/// (pairwise exchange for a power of two, else one-way dissemination).
pub const NICBAR_COLL_ALGORITHM_DEFAULT: i32 = 0;
/// nicbar_coll_group_new()'s `algorithm`: pairwise exchange (paper §5.1).
pub const NICBAR_COLL_ALGORITHM_PAIRWISE_EXCHANGE: i32 = 1;
/// nicbar_coll_group_new()'s `algorithm`: gather-broadcast; `parameter` is the tree's dimension
/// (0: 2), capped at members - 1.
pub const NICBAR_COLL_ALGORITHM_GATHER_BROADCAST: i32 = 2;
/// nicbar_coll_group_new()'s `algorithm`: n-way dissemination; `parameter` is n (0: 1), capped at
/// members - 1.
pub const NICBAR_COLL_ALGORITHM_DISSEMINATION: i32 = 3;

/// nicbar_coll_barrier_test(): the barrier has not ended yet.
pub const NICBAR_COLL_PENDING: i32 = 0;
/// nicbar_coll_barrier_test() and the data collectives: the operation completed.
pub const NICBAR_COLL_COMPLETED: i32 = 1;
/// nicbar_coll_barrier_test() and the data collectives: the operation failed; `failed_rank`
/// and `message` say why.
pub const NICBAR_COLL_FAILED: i32 = -1;
/// nicbar_coll_barrier_test(): no barrier has this ticket (never started, or its end already
/// taken), or a handle is NULL. The data collectives: a handle or a pointer is NULL, or the
/// algorithm is unknown (nothing was sent).
pub const NICBAR_COLL_UNKNOWN: i32 = -2;

/// Bytes of `nicbar_coll_op`'s message.
pub const NICBAR_COLL_MESSAGE_LENGTH: usize = 256;

/// One process's port, with its queue of barriers and its collectives' transfers.
pub struct nicbar_coll_endpoint {
    inner: Endpoint,
}

/// The members of a barrier, by rank (a communicator's ranks), and how its barriers run.
pub struct nicbar_coll_group {
    group: Group,
    members: Vec<Member>,
    timeout: Option<Duration>,
}

/// Work a data collective runs between polls that find nothing to do while it waits (an MPI
/// library's progress).
pub type nicbar_coll_idle_fn = Option<unsafe extern "C" fn(argument: *mut c_void)>;

/// One data collective's description and, after it, how it ended.
#[repr(C)]
pub struct nicbar_coll_op {
    /// The communicator's context id (the same on every rank).
    pub context: u32,
    /// The operation's sequence number on the communicator (the same on every rank; a new one
    /// for each operation).
    pub sequence: u32,
    /// The algorithm: 0 chosen by size; else the collective's NICBAR_COLL_* algorithm number.
    pub algorithm: i32,
    /// Polls with nothing to do before the call sleeps on the port between polls (0: 64).
    pub spin: u32,
    /// Bytes per segment of the segmented broadcasts (0: 32 KiB).
    pub segment: u64,
    /// Run between polls that find nothing to do while the call waits (NULL: none).
    pub idle: nicbar_coll_idle_fn,
    /// `idle`'s argument.
    pub idle_argument: *mut c_void,
    /// Out: the rank the failure is about, or -1.
    pub failed_rank: i32,
    /// Out: why the operation failed, NUL-terminated.
    pub message: [c_char; NICBAR_COLL_MESSAGE_LENGTH],
}

/// Broadcast: the root sends to every rank (nicbar_coll_op's `algorithm`).
pub const NICBAR_COLL_BCAST_LINEAR: i32 = 1;
/// Broadcast: a binomial tree.
pub const NICBAR_COLL_BCAST_BINOMIAL: i32 = 2;
/// Broadcast: a binary tree, segmented.
pub const NICBAR_COLL_BCAST_BINARY: i32 = 3;
/// Broadcast: the split binary tree (each half down half the tree, then swapped in pairs).
pub const NICBAR_COLL_BCAST_SPLIT_BINARY: i32 = 4;
/// Broadcast: a pipeline (a chain, segmented).
pub const NICBAR_COLL_BCAST_PIPELINE: i32 = 5;
/// The most bytes NICBAR_COLL_BCAST_NIC carries in the NIC: what the NIC's completion event holds
/// inline (every member's event brings the root's bytes; no buffer to provide).
pub const NICBAR_NIC_BROADCAST_MAX: u32 = 32;
const _: () = assert!(NICBAR_NIC_BROADCAST_MAX as usize == nicbar_rs::NIC_BROADCAST_MAX);
/// Broadcast: carried by the NIC's barrier engine (a gather-broadcast tree whose down-phase
/// packets carry the bytes) for up to NICBAR_NIC_BROADCAST_MAX bytes; longer messages take
/// the algorithm chosen by size.
pub const NICBAR_COLL_BCAST_NIC: i32 = 6;
/// Scatter and gather: the root talks to every rank.
pub const NICBAR_COLL_TREE_FLAT: i32 = 1;
/// Scatter and gather: a binomial tree (not for the v forms, which are flat).
pub const NICBAR_COLL_TREE_BINOMIAL: i32 = 2;
/// All-to-all: every block at once.
pub const NICBAR_COLL_ALLTOALL_LINEAR: i32 = 1;
/// All-to-all: step k exchanges with ranks +/- k.
pub const NICBAR_COLL_ALLTOALL_PAIRWISE: i32 = 2;
/// All-to-all: Bruck's algorithm (not for alltoallv, which takes it as linear).
pub const NICBAR_COLL_ALLTOALL_BRUCK: i32 = 3;

/// Writes `message` into `buffer` of `length` bytes, truncated and NUL-terminated.
///
/// # Safety
/// `buffer` is NULL or valid for writes of `length` bytes.
unsafe fn write_message(buffer: *mut c_char, length: usize, message: &str) {
    if buffer.is_null() || length == 0 {
        return;
    }
    let bytes: Vec<u8> = message.bytes().filter(|&b| b != 0).collect();
    let count = bytes.len().min(length - 1);
    // SAFETY: the caller gives `length` writable bytes at `buffer`; `count + 1 <= length`.
    unsafe {
        core::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buffer, count);
        *buffer.add(count) = 0;
    }
}

/// Opens a port of the local daemon (its socket: `$NICBAR_SOCKET`, else the default): the first
/// free port, from port 1 on, of NIC `unit`; or, with `unit` negative, of the first unit that
/// has one, starting from unit `-1 - unit` (modulo the daemon's units: -1 fills unit 0 first,
/// `-1 - local_rank` spreads a host's processes over its units). Returns NULL when none opens,
/// with the reason in `error` (`error_length` bytes, NUL-terminated; `error` may be NULL).
///
/// # Safety
/// `error` is NULL or valid for writes of `error_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_open(
    unit: i32,
    error: *mut c_char,
    error_length: usize,
) -> *mut nicbar_coll_endpoint {
    guard_or(
        "nicbar_coll_open",
        // SAFETY: the caller's promise about `error`.
        |panic| unsafe { refused(error, error_length, &panic) },
        || match open_endpoint(unit) {
            Ok(inner) => Box::into_raw(Box::new(nicbar_coll_endpoint { inner })),
            // SAFETY: the caller's promise about `error`.
            Err(message) => unsafe { refused(error, error_length, &message) },
        },
    )
}

/// nicbar_coll_open()'s endpoint on `unit`, or why there is none.
fn open_endpoint(unit: i32) -> Result<Endpoint, String> {
    let port = match u8::try_from(unit) {
        Ok(unit) => coll::open_port(Unit::Exactly(unit)),
        Err(_) if unit < 0 => coll::open_port(Unit::FirstFreeFrom(unit.unsigned_abs() - 1)),
        Err(_) => return Err(format!("no NIC unit {unit}")),
    }
    .map_err(|e| e.to_string())?;
    Endpoint::new(port).map_err(|e| format!("cannot set up the collectives' buffers: {e}"))
}

/// How a constructor refuses: `message` in the caller's `error` buffer, and NULL.
///
/// # Safety
/// `error` is NULL or valid for writes of `error_length` bytes.
unsafe fn refused<T>(error: *mut c_char, error_length: usize, message: &str) -> *mut T {
    // SAFETY: the caller's promise.
    unsafe { write_message(error, error_length, message) };
    core::ptr::null_mut()
}

/// Closes the endpoint's port (peers' barriers waiting for it fail, naming it) and frees it.
/// Takes NULL.
///
/// # Safety
/// `endpoint` is NULL or from nicbar_coll_open() and not closed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_close(endpoint: *mut nicbar_coll_endpoint) {
    guard("nicbar_coll_close", (), || {
        if !endpoint.is_null() {
            // SAFETY: the caller's promise: it came from Box::into_raw and is closed once.
            let endpoint = unsafe { Box::from_raw(endpoint) };
            let _ = endpoint.inner.close();
        }
    });
}

/// The node id of the endpoint's NIC (0 for NULL).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_node_id(endpoint: *const nicbar_coll_endpoint) -> u16 {
    guard("nicbar_coll_node_id", 0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.inner.port().node_id().get())
    })
}

/// The endpoint's port id (0 for NULL).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_port_id(endpoint: *const nicbar_coll_endpoint) -> u8 {
    guard("nicbar_coll_port_id", 0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.inner.port().port_id().0)
    })
}

/// How many barriers completed through this endpoint's NIC (failed ones not counted).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_completed(endpoint: *const nicbar_coll_endpoint) -> u64 {
    guard("nicbar_coll_completed", 0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.inner.barriers_completed())
    })
}

/// The algorithm for `members` from nicbar_coll_group_new()'s arguments.
fn algorithm(algorithm: i32, parameter: u32, members: usize) -> Result<Algorithm, String> {
    let most = members.saturating_sub(1).max(1);
    let parameter = usize::try_from(parameter).unwrap_or(usize::MAX);
    match algorithm {
        NICBAR_COLL_ALGORITHM_DEFAULT => Ok(BarrierOptions::for_members(members).algorithm),
        NICBAR_COLL_ALGORITHM_PAIRWISE_EXCHANGE => Ok(Algorithm::PairwiseExchange),
        NICBAR_COLL_ALGORITHM_GATHER_BROADCAST => Ok(Algorithm::GatherBroadcast {
            dimension: if parameter == 0 { 2 } else { parameter }.min(most),
            root: 0,
        }),
        NICBAR_COLL_ALGORITHM_DISSEMINATION => Ok(Algorithm::Dissemination {
            n: parameter.max(1).min(most),
        }),
        other => Err(format!(
            "no barrier algorithm {other} (0 default, 1 pairwise exchange, 2 gather-broadcast, 3 dissemination)"
        )),
    }
}

/// A group of `members` ports, rank `i` being port `ports[i]` of node `nodes[i]`, whose
/// barriers run `algorithm` (a `NICBAR_COLL_ALGORITHM_*`, with its `parameter`) and fail after
/// `timeout_ms` milliseconds (0: the NIC's default). Returns NULL with the reason in `error`
/// for no members, a port named twice, or an unknown algorithm.
///
/// # Safety
/// `nodes` and `ports` are valid for reads of `members` elements; `error` is NULL or valid for
/// writes of `error_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_group_new(
    nodes: *const u16,
    ports: *const u8,
    members: usize,
    algorithm_id: i32,
    parameter: u32,
    timeout_ms: u32,
    error: *mut c_char,
    error_length: usize,
) -> *mut nicbar_coll_group {
    guard_or(
        "nicbar_coll_group_new",
        // SAFETY: the caller's promise about `error`.
        |panic| unsafe { refused(error, error_length, &panic) },
        || {
            // SAFETY: the caller's promise about `nodes` and `ports`.
            let built =
                unsafe { new_group(nodes, ports, members, algorithm_id, parameter, timeout_ms) };
            match built {
                Ok(group) => Box::into_raw(Box::new(nicbar_coll_group {
                    members: group.members().to_vec(),
                    timeout: group.options().timeout,
                    group,
                })),
                // SAFETY: the caller's promise about `error`.
                Err(message) => unsafe { refused(error, error_length, &message) },
            }
        },
    )
}

/// nicbar_coll_group_new()'s group, or why there is none.
///
/// # Safety
/// `nodes` and `ports` are NULL or valid for reads of `members` elements.
unsafe fn new_group(
    nodes: *const u16,
    ports: *const u8,
    members: usize,
    algorithm_id: i32,
    parameter: u32,
    timeout_ms: u32,
) -> Result<Group, String> {
    if nodes.is_null() || ports.is_null() || members == 0 {
        return Err("a barrier group needs at least one member".to_owned());
    }
    // SAFETY: the caller's promise: `members` elements each.
    let (nodes, ports) = unsafe {
        (
            core::slice::from_raw_parts(nodes, members),
            core::slice::from_raw_parts(ports, members),
        )
    };
    let group = Group::new(
        nodes
            .iter()
            .zip(ports)
            .map(|(&node, &port)| Member::new(NodeId::new(node), PortId(port))),
    )
    .map_err(|e| e.to_string())?;
    let mut group = group.with_algorithm(algorithm(algorithm_id, parameter, members)?);
    if timeout_ms > 0 {
        group = group.with_timeout(Duration::from_millis(u64::from(timeout_ms)));
    }
    Ok(group)
}

/// Frees a group. Takes NULL. Barriers started on it keep running.
///
/// # Safety
/// `group` is NULL or from nicbar_coll_group_new() and not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_group_free(group: *mut nicbar_coll_group) {
    guard("nicbar_coll_group_free", (), || {
        if !group.is_null() {
            // SAFETY: the caller's promise: it came from Box::into_raw and is freed once.
            drop(unsafe { Box::from_raw(group) });
        }
    });
}

/// Names the barriers of `group`: `job` (0: none) and `id`, the same in every member (an MPI
/// communicator's context id, say), and starts the group's barrier numbering on `endpoint` afresh
/// — every member calls it when the group is made, before its first barrier. Barrier packets
/// carry job, id and each barrier's number, so a barrier of one group is never completed by
/// another group's packets, nor by a failed earlier barrier's; and a member whose peer's port
/// closed after running barriers of the same `job` is told at once, not at its timeout. Without
/// it a group's id is a hash of its member list (two groups of the same members then share one
/// numbering: start their barriers in the same order everywhere). Returns 0, or -1 for a NULL
/// handle.
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles not used by another thread meanwhile.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_group_set_id(
    endpoint: *mut nicbar_coll_endpoint,
    group: *mut nicbar_coll_group,
    job: u32,
    id: u32,
) -> i32 {
    guard("nicbar_coll_group_set_id", -1, || {
        // SAFETY: the caller's promise: NULL or live and not shared meanwhile.
        let (Some(endpoint), Some(group)) =
            (unsafe { endpoint.as_mut() }, unsafe { group.as_mut() })
        else {
            return -1;
        };
        group.group = group.group.clone().with_job(job).with_id(id);
        endpoint
            .inner
            .port_mut()
            .restart_barrier_numbering(&group.group);
        0
    })
}

/// Starts a barrier of `group` on the endpoint and returns its ticket (never 0; 0 for a NULL
/// handle). The barrier goes to the NIC at once if it runs fewer than four of this endpoint's
/// barriers and none is queued, else when earlier ones have ended. Follow it with
/// nicbar_coll_barrier_test().
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_barrier_start(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
) -> u64 {
    guard("nicbar_coll_barrier_start", 0, || {
        // SAFETY: the caller's promise.
        let (Some(endpoint), Some(group)) =
            (unsafe { endpoint.as_mut() }, unsafe { group.as_ref() })
        else {
            return 0;
        };
        endpoint.inner.barrier_start(&group.group)
    })
}

/// Takes the ends the NIC has reported and posts queued barriers; never blocks. Returns how many
/// barriers ended in this call (-1 for NULL). Call it from the progress loop while barriers are
/// outstanding.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_progress(endpoint: *mut nicbar_coll_endpoint) -> i32 {
    guard("nicbar_coll_progress", -1, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_mut() }.map_or(-1, |e| {
            i32::try_from(e.inner.progress()).unwrap_or(i32::MAX)
        })
    })
}

/// Progresses as nicbar_coll_progress() and, if that moved nothing (no event taken, no data
/// posted, no barrier ended), sleeps until the NIC reports an event to the endpoint or
/// `timeout_us` microseconds pass, then progresses again; returns how many barriers ended.
/// Does not sleep if no barrier is outstanding and no collective's data waits to go out.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_wait(
    endpoint: *mut nicbar_coll_endpoint,
    timeout_us: u32,
) -> i32 {
    guard("nicbar_coll_wait", -1, || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_mut() }) else {
            return -1;
        };
        let ended = endpoint
            .inner
            .wait(Duration::from_micros(u64::from(timeout_us)));
        i32::try_from(ended).unwrap_or(i32::MAX)
    })
}

/// Whether the barrier with `ticket` has ended: `NICBAR_COLL_PENDING`, `NICBAR_COLL_COMPLETED`,
/// or `NICBAR_COLL_FAILED` with the rank of the member the NIC waited for in `failed_rank` (-1
/// when the failure is not a member's) and the reason in `message` (`message_length` bytes,
/// NUL-terminated). The end is taken: the same ticket then gives `NICBAR_COLL_UNKNOWN`.
/// Progresses first, as nicbar_coll_progress().
///
/// # Safety
/// `endpoint` is NULL or a live endpoint; `failed_rank` is NULL or writable; `message` is NULL
/// or valid for writes of `message_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_barrier_test(
    endpoint: *mut nicbar_coll_endpoint,
    ticket: u64,
    failed_rank: *mut i32,
    message: *mut c_char,
    message_length: usize,
) -> i32 {
    guard("nicbar_coll_barrier_test", NICBAR_COLL_UNKNOWN, || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_mut() }) else {
            return NICBAR_COLL_UNKNOWN;
        };
        match endpoint.inner.barrier_end(ticket) {
            (Some(Ok(())), _) => NICBAR_COLL_COMPLETED,
            (Some(Err((rank, text))), _) => {
                // SAFETY: the caller's promises about `failed_rank` and `message`.
                unsafe {
                    if let Some(failed_rank) = failed_rank.as_mut() {
                        *failed_rank = rank.and_then(|r| i32::try_from(r).ok()).unwrap_or(-1);
                    }
                    write_message(message, message_length, &text);
                }
                NICBAR_COLL_FAILED
            }
            (None, true) => NICBAR_COLL_PENDING,
            (None, false) => NICBAR_COLL_UNKNOWN,
        }
    })
}

/// How many data collectives (all but barriers) completed through this endpoint.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_collectives(endpoint: *const nicbar_coll_endpoint) -> u64 {
    guard("nicbar_coll_collectives", 0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.inner.collectives_completed())
    })
}

/// Segments the transfers sent again after the NIC gave up on them (their receiver took nothing
/// for the NIC's receiver-not-ready time), and arrivals dropped as malformed or duplicated.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint; `resent` and `dropped` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_transfer_counters(
    endpoint: *const nicbar_coll_endpoint,
    resent: *mut u64,
    dropped: *mut u64,
) {
    guard("nicbar_coll_transfer_counters", (), || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_ref() }) else {
            return;
        };
        let counters = endpoint.inner.transfer_counters();
        // SAFETY: the caller's promise about the outputs.
        unsafe {
            if let Some(resent) = resent.as_mut() {
                *resent = counters.resent;
            }
            if let Some(dropped) = dropped.as_mut() {
                *dropped = counters.dropped;
            }
        }
    })
}

/// How the data collectives' messages went: sent and received by rendezvous (RDMA put into the
/// receiver's registered memory), and eager segments an inner rank of a broadcast tree forwarded
/// from the receive buffer they arrived in (once per segment and rank they went to).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint; the outputs are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_protocol_counters(
    endpoint: *const nicbar_coll_endpoint,
    rendezvous_sent: *mut u64,
    rendezvous_received: *mut u64,
    forwarded: *mut u64,
) {
    guard("nicbar_coll_protocol_counters", (), || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_ref() }) else {
            return;
        };
        let counters = endpoint.inner.transfer_counters();
        for (out, value) in [
            (rendezvous_sent, counters.rendezvous_sent),
            (rendezvous_received, counters.rendezvous_received),
            (forwarded, counters.forwarded),
        ] {
            // SAFETY: the caller's promise about the outputs.
            if let Some(out) = unsafe { out.as_mut() } {
                *out = value;
            }
        }
    })
}

/// `length` bytes at `pointer` as a slice (empty for no bytes, whatever the pointer; `None` for
/// NULL with bytes).
///
/// # Safety
/// `pointer` is NULL or valid for reads of `length` bytes for `'a`, and no one writes them
/// meanwhile.
unsafe fn bytes<'a>(pointer: *const c_void, length: usize) -> Option<&'a [u8]> {
    if length == 0 {
        return Some(&[]);
    }
    if pointer.is_null() || length > isize::MAX as usize {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { core::slice::from_raw_parts(pointer.cast::<u8>(), length) })
}

/// As [`bytes`], writable.
///
/// # Safety
/// `pointer` is NULL or valid for reads and writes of `length` bytes for `'a`, and no other
/// reference reaches them meanwhile.
unsafe fn bytes_mut<'a>(pointer: *mut c_void, length: usize) -> Option<&'a mut [u8]> {
    if length == 0 {
        return Some(&mut []);
    }
    if pointer.is_null() || length > isize::MAX as usize {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { core::slice::from_raw_parts_mut(pointer.cast::<u8>(), length) })
}

/// The address ranges `[start, end)` of the non-empty blocks among `(pointer, length)`.
fn ranges(blocks: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut ranges: Vec<(usize, usize)> = blocks
        .iter()
        .filter(|(_, length)| *length > 0)
        .map(|&(start, length)| (start, start.saturating_add(length)))
        .collect();
    ranges.sort_unstable();
    ranges
}

/// Whether any two of the sorted `ranges` overlap.
fn overlapping(ranges: &[(usize, usize)]) -> bool {
    ranges.windows(2).any(|pair| pair[1].0 < pair[0].1)
}

/// Whether `range` overlaps any of the sorted `ranges`.
fn touches(ranges: &[(usize, usize)], range: (usize, usize)) -> bool {
    range.1 > range.0 && ranges.iter().any(|r| r.0 < range.1 && range.0 < r.1)
}

/// The blocks of a call: what it reads (copied first when they share bytes with what it writes,
/// which MPI forbids but which must not make two views of one byte here) and what it writes
/// (refused when two of them overlap).
struct Blocks<'a> {
    reads: Vec<std::borrow::Cow<'a, [u8]>>,
    writes: Vec<&'a mut [u8]>,
}

impl<'a> Blocks<'a> {
    /// # Safety
    /// Each `(pointer, length)` of `reads` is NULL or readable for `length` bytes, each of
    /// `writes` NULL or writable, for `'a`.
    unsafe fn new(
        reads: &[(*const c_void, usize)],
        writes: &[(*mut c_void, usize)],
    ) -> Result<Self, String> {
        let write_ranges = ranges(
            &writes
                .iter()
                .map(|&(p, l)| (p as usize, l))
                .collect::<Vec<_>>(),
        );
        if overlapping(&write_ranges) {
            return Err("two receive blocks overlap".to_owned());
        }
        let mut read_blocks = Vec::with_capacity(reads.len());
        for &(pointer, length) in reads {
            let range = (pointer as usize, (pointer as usize).saturating_add(length));
            if length > 0 && pointer.is_null() {
                return Err("a send block is NULL".to_owned());
            }
            if touches(&write_ranges, range) {
                let mut copy = vec![0u8; length];
                // SAFETY: the caller's promise: readable for `length` bytes; `copy` is ours.
                // A raw copy: no reference to the bytes is made while one to them may exist.
                unsafe {
                    core::ptr::copy(pointer.cast::<u8>(), copy.as_mut_ptr(), length);
                }
                read_blocks.push(std::borrow::Cow::Owned(copy));
            } else {
                // SAFETY: the caller's promise; no write block overlaps it (checked).
                let slice = unsafe { bytes(pointer, length) }.ok_or("a send block is NULL")?;
                read_blocks.push(std::borrow::Cow::Borrowed(slice));
            }
        }
        let mut write_blocks = Vec::with_capacity(writes.len());
        for &(pointer, length) in writes {
            // SAFETY: the caller's promise; the write blocks do not overlap one another, and
            // the reads that overlapped them were copied.
            write_blocks
                .push(unsafe { bytes_mut(pointer, length) }.ok_or("a receive block is NULL")?);
        }
        Ok(Self {
            reads: read_blocks,
            writes: write_blocks,
        })
    }
}

/// Runs a data collective: checks the handles, builds its [`Op`], runs `body`, and reports in
/// `op`. Runs inside an export's [`guard_or`], whose fallback is [`panicked`].
///
/// # Safety
/// `endpoint`, `group` and `op` are NULL or live; `op`'s idle function is safe to call with its
/// argument.
unsafe fn collective(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    body: impl FnOnce(Op<'_>, i32, u64) -> Result<(), CollError>,
) -> i32 {
    // SAFETY: the caller's promise.
    let Some(op) = (unsafe { op.as_mut() }) else {
        return NICBAR_COLL_UNKNOWN;
    };
    // SAFETY: the caller's promises.
    let outcome = unsafe { run(endpoint, group, op, body) };
    report(op, outcome)
}

/// Builds a data collective's [`Op`] from the handles and `op`, and runs `body` on it.
///
/// # Safety
/// As [`collective`].
unsafe fn run(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: &mut nicbar_coll_op,
    body: impl FnOnce(Op<'_>, i32, u64) -> Result<(), CollError>,
) -> Result<(), CollError> {
    // SAFETY: the caller's promise.
    let (Some(endpoint), Some(group)) = (unsafe { endpoint.as_mut() }, unsafe { group.as_ref() })
    else {
        return Err(CollError::Argument("a NULL endpoint or group".into()));
    };
    let (idle, argument) = (op.idle, op.idle_argument);
    let mut run_idle = || {
        if let Some(idle) = idle {
            // SAFETY: the caller's promise about the idle function and its argument.
            unsafe { idle(argument) };
        }
    };
    let mut call = Op::new(&mut endpoint.inner, &group.members, op.context, op.sequence)?
        .with_spin(op.spin)
        .with_group(&group.group)
        .with_idle(&mut run_idle);
    if let Some(timeout) = group.timeout {
        call = call.with_timeout(timeout);
    }
    body(call, op.algorithm, op.segment)
}

/// Writes how a data collective ended into `op`; returns its status code.
fn report(op: &mut nicbar_coll_op, outcome: Result<(), CollError>) -> i32 {
    match outcome {
        Ok(()) => {
            op.failed_rank = -1;
            op.message[0] = 0;
            NICBAR_COLL_COMPLETED
        }
        Err(error) => {
            op.failed_rank = error
                .rank()
                .and_then(|r| i32::try_from(r).ok())
                .unwrap_or(-1);
            // SAFETY: `message` is the op's own array.
            unsafe {
                write_message(
                    op.message.as_mut_ptr(),
                    NICBAR_COLL_MESSAGE_LENGTH,
                    &error.to_string(),
                );
            }
            if matches!(error, CollError::Argument(_)) {
                NICBAR_COLL_UNKNOWN
            } else {
                NICBAR_COLL_FAILED
            }
        }
    }
}

/// A data collective's end after a panic: `message` (what [`guard_or`] says of it) in `op`, as
/// an argument error would be (nothing is known to have been sent).
///
/// # Safety
/// `op` is NULL or live.
unsafe fn panicked(op: *mut nicbar_coll_op, message: String) -> i32 {
    // SAFETY: the caller's promise.
    match unsafe { op.as_mut() } {
        Some(op) => report(op, Err(CollError::Argument(message))),
        None => NICBAR_COLL_UNKNOWN,
    }
}

/// The broadcast algorithm numbered `id` (0: chosen by the process's selection map, else by
/// size) for `size` ranks and `bytes`.
fn bcast_algorithm(id: i32, size: usize, bytes: usize) -> Result<Bcast, CollError> {
    Ok(match id {
        0 => coll::select::process_bcast(size, bytes),
        NICBAR_COLL_BCAST_LINEAR => Bcast::Linear,
        NICBAR_COLL_BCAST_BINOMIAL => Bcast::Binomial,
        NICBAR_COLL_BCAST_BINARY => Bcast::Binary,
        NICBAR_COLL_BCAST_SPLIT_BINARY => Bcast::SplitBinary,
        NICBAR_COLL_BCAST_PIPELINE => Bcast::Pipeline,
        NICBAR_COLL_BCAST_NIC => Bcast::Nic,
        _ => return Err(unknown_algorithm("broadcast", id)),
    })
}

/// The algorithm numbered `id` of `collective` (scatter or gather) on `size` ranks and `block`
/// bytes per rank (0: chosen by the process's selection map, else by size); `which` names the
/// collective in the error.
fn tree_algorithm(
    id: i32,
    collective: Collective,
    which: &str,
    size: usize,
    block: usize,
) -> Result<Tree, CollError> {
    Ok(match id {
        0 => coll::select::process_tree(collective, size, block),
        NICBAR_COLL_TREE_FLAT => Tree::Flat,
        NICBAR_COLL_TREE_BINOMIAL => Tree::Binomial,
        _ => return Err(unknown_algorithm(which, id)),
    })
}

/// The all-to-all algorithm numbered `id` (0: chosen by the process's selection map, else by
/// size) for `size` ranks and `block` bytes per pair.
fn alltoall_algorithm(id: i32, size: usize, block: usize) -> Result<Alltoall, CollError> {
    Ok(match id {
        0 => coll::select::process_alltoall(size, block),
        NICBAR_COLL_ALLTOALL_LINEAR => Alltoall::Linear,
        NICBAR_COLL_ALLTOALL_PAIRWISE => Alltoall::Pairwise,
        NICBAR_COLL_ALLTOALL_BRUCK => Alltoall::Bruck,
        _ => return Err(unknown_algorithm("all-to-all", id)),
    })
}

/// An unknown algorithm number, as an error.
fn unknown_algorithm(which: &str, id: i32) -> CollError {
    CollError::Argument(format!("no {which} algorithm {id}"))
}

/// nicbar_coll_map_load(): a selection map was read; the data collectives' algorithm 0 takes
/// its choices (the defaults where it has none).
pub const NICBAR_COLL_MAP_LOADED: i32 = 1;
/// nicbar_coll_map_load(): no map (none at the default place, or `NICBAR_COLL_MAP=off`): the
/// defaults serve.
pub const NICBAR_COLL_MAP_NONE: i32 = 0;
/// nicbar_coll_map_load(): the map could not be read or is malformed (the message names the
/// line): the defaults serve.
pub const NICBAR_COLL_MAP_REFUSED: i32 = -1;

/// Loads the process's selection map (`cargo xtask tune` writes it) for the data collectives'
/// algorithm 0: from `path` (`off`: none), or, when `path` is NULL or empty, from
/// `$NICBAR_COLL_MAP` (`off`: none), else `$XDG_CONFIG_HOME/nicbar/coll-map`, else `$HOME/.config/nicbar/coll-map`. Without
/// this call the default place is read at the first collective. Every process of a job must
/// load the same map. Writes a sentence saying what was loaded, or why not, into `message`
/// (`message_length` bytes, NUL-terminated; may be NULL). Returns NICBAR_COLL_MAP_LOADED,
/// NICBAR_COLL_MAP_NONE or NICBAR_COLL_MAP_REFUSED.
///
/// # Safety
/// `path` is NULL or a NUL-terminated string; `message` is NULL or valid for writes of
/// `message_length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_map_load(
    path: *const c_char,
    message: *mut c_char,
    message_length: usize,
) -> i32 {
    guard_or(
        "nicbar_coll_map_load",
        |panic| {
            // SAFETY: the caller's promise about `message`.
            unsafe { write_message(message, message_length, &panic) };
            NICBAR_COLL_MAP_REFUSED
        },
        || {
            let path = if path.is_null() {
                None
            } else {
                // SAFETY: the caller's promise: a NUL-terminated string.
                let text = unsafe { std::ffi::CStr::from_ptr(path) };
                let text = text.to_string_lossy();
                (!text.is_empty()).then(|| std::path::PathBuf::from(text.into_owned()))
            };
            let (outcome, description) = map::load(path.as_deref());
            // SAFETY: the caller's promise about `message`.
            unsafe { write_message(message, message_length, &description) };
            match outcome {
                LoadOutcome::Loaded => NICBAR_COLL_MAP_LOADED,
                LoadOutcome::None => NICBAR_COLL_MAP_NONE,
                LoadOutcome::Refused => NICBAR_COLL_MAP_REFUSED,
            }
        },
    )
}

/// MPI_Bcast of `length` bytes at `buffer` from rank `root` (`op`'s algorithm: 0 by size, or a
/// NICBAR_COLL_BCAST_*; NICBAR_COLL_BCAST_NIC runs it in the NIC up to NICBAR_NIC_BROADCAST_MAX
/// bytes, taking the group's next barrier number as a barrier does). Returns NICBAR_COLL_COMPLETED, NICBAR_COLL_FAILED (the op says why),
/// or NICBAR_COLL_UNKNOWN for NULL handles or an unknown algorithm (nothing sent).
///
/// # Safety
/// `endpoint`, `group`, `op` are NULL or live; `buffer` is valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_bcast(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    buffer: *mut c_void,
    length: usize,
    root: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_bcast",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, segment| {
                let algorithm = bcast_algorithm(algorithm, call.size(), length)?;
                let buffer = bytes_mut(buffer, length)
                    .ok_or_else(|| CollError::Argument("a NULL buffer".into()))?;
                let segment = if segment == 0 {
                    coll::DEFAULT_SEGMENT
                } else {
                    segment as usize
                };
                coll::bcast(
                    call,
                    buffer,
                    usize::try_from(root).unwrap_or(usize::MAX),
                    algorithm,
                    segment,
                )
            })
        },
    )
}

/// MPI_Scatter of `block` bytes per rank from `root`: `send` (read at the root only: every
/// rank's block in rank order) to `receive` (`block` bytes; NULL at the root for MPI_IN_PLACE).
/// `op`'s algorithm: 0 by size, or a NICBAR_COLL_TREE_*. Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_bcast(); `send` valid for `block` times the group's size bytes at the root,
/// `receive` for `block` bytes or NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_scatter(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send: *const c_void,
    receive: *mut c_void,
    block: usize,
    root: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_scatter",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let algorithm = tree_algorithm(
                    algorithm,
                    Collective::Scatter,
                    "scatter",
                    call.size(),
                    block,
                )?;
                let root = usize::try_from(root).unwrap_or(usize::MAX);
                let size = call.size();
                let at_root = call.rank() == root;
                let total = block
                    .checked_mul(size)
                    .ok_or_else(|| CollError::Argument("too long".into()))?;
                let reads = if at_root {
                    vec![(send, total)]
                } else {
                    Vec::new()
                };
                let writes = if receive.is_null() {
                    Vec::new()
                } else {
                    vec![(receive, block)]
                };
                let mut blocks = Blocks::new(&reads, &writes).map_err(CollError::Argument)?;
                let send = blocks.reads.first().map(|b| &b[..]);
                let receive = blocks.writes.pop();
                coll::scatter(call, send, receive, block, root, algorithm)
            })
        },
    )
}

/// MPI_Gather of `block` bytes per rank to `root`: `send` (`block` bytes; NULL at the root for
/// MPI_IN_PLACE, its block then already at its place in `receive`) into `receive` (written at
/// the root only: every rank's block in rank order). Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_scatter(), the directions swapped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_gather(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send: *const c_void,
    receive: *mut c_void,
    block: usize,
    root: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_gather",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let algorithm =
                    tree_algorithm(algorithm, Collective::Gather, "gather", call.size(), block)?;
                let root = usize::try_from(root).unwrap_or(usize::MAX);
                let size = call.size();
                let at_root = call.rank() == root;
                let total = block
                    .checked_mul(size)
                    .ok_or_else(|| CollError::Argument("too long".into()))?;
                let reads = if send.is_null() {
                    Vec::new()
                } else {
                    vec![(send, block)]
                };
                let writes = if at_root {
                    vec![(receive, total)]
                } else {
                    Vec::new()
                };
                let mut blocks = Blocks::new(&reads, &writes).map_err(CollError::Argument)?;
                let send = blocks.reads.first().map(|b| &b[..]);
                let receive = blocks.writes.pop();
                coll::gather(call, send, receive, block, root, algorithm)
            })
        },
    )
}

/// The `count` (pointer, length) pairs of C arrays of pointers and lengths (`None` for NULL
/// arrays with a count).
///
/// # Safety
/// `pointers` and `lengths` are NULL or valid for `count` elements.
unsafe fn pairs<P: Copy>(
    pointers: *const P,
    lengths: *const usize,
    count: usize,
) -> Option<Vec<(P, usize)>> {
    if count == 0 {
        return Some(Vec::new());
    }
    if pointers.is_null() || lengths.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    let (pointers, lengths) = unsafe {
        (
            core::slice::from_raw_parts(pointers, count),
            core::slice::from_raw_parts(lengths, count),
        )
    };
    Some(
        pointers
            .iter()
            .copied()
            .zip(lengths.iter().copied())
            .collect(),
    )
}

/// MPI_Scatterv: the root's blocks (`send_blocks[i]`, `send_lengths[i]` bytes, for each rank i;
/// read at the root only) to each rank's `receive` (`receive_length` bytes; NULL at the root for
/// MPI_IN_PLACE). Flat. Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_bcast(); at the root the arrays hold the group's size of elements, each block
/// valid for its length.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_scatterv(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send_blocks: *const *const c_void,
    send_lengths: *const usize,
    receive: *mut c_void,
    receive_length: usize,
    root: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_scatterv",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, _, _| {
                let root = usize::try_from(root).unwrap_or(usize::MAX);
                let reads = if call.rank() == root {
                    pairs(send_blocks, send_lengths, call.size())
                        .ok_or_else(|| CollError::Argument("NULL send block arrays".into()))?
                } else {
                    Vec::new()
                };
                let writes = if receive.is_null() {
                    Vec::new()
                } else {
                    vec![(receive, receive_length)]
                };
                let mut blocks = Blocks::new(&reads, &writes).map_err(CollError::Argument)?;
                let send: Vec<&[u8]> = blocks.reads.iter().map(|b| &b[..]).collect();
                let receive = blocks.writes.pop();
                coll::scatterv(call, (!send.is_empty()).then_some(&send[..]), receive, root)
            })
        },
    )
}

/// MPI_Gatherv: each rank's `send` (`send_length` bytes; NULL at the root for MPI_IN_PLACE)
/// into the root's blocks (`receive_blocks[i]`, `receive_lengths[i]` bytes; written at the root
/// only). Flat. Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_scatterv(), the directions swapped.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_gatherv(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send: *const c_void,
    send_length: usize,
    receive_blocks: *const *mut c_void,
    receive_lengths: *const usize,
    root: i32,
) -> i32 {
    guard_or(
        "nicbar_coll_gatherv",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, _, _| {
                let root = usize::try_from(root).unwrap_or(usize::MAX);
                let at_root = call.rank() == root;
                let writes = if at_root {
                    pairs(receive_blocks, receive_lengths, call.size())
                        .ok_or_else(|| CollError::Argument("NULL receive block arrays".into()))?
                } else {
                    Vec::new()
                };
                let reads = if send.is_null() {
                    Vec::new()
                } else {
                    vec![(send, send_length)]
                };
                let mut blocks = Blocks::new(&reads, &writes).map_err(CollError::Argument)?;
                let send = blocks.reads.first().map(|b| &b[..]);
                let receive = at_root.then_some(&mut blocks.writes[..]);
                coll::gatherv(call, send, receive, root)
            })
        },
    )
}

/// MPI_Alltoall of `block` bytes per pair: block j of `send` to rank j, into block i (this
/// rank) of its `receive` (both the group's size of blocks; for MPI_IN_PLACE the caller copies
/// `receive` to a `send` of its own first). `op`'s algorithm: 0 by size, or a
/// NICBAR_COLL_ALLTOALL_*. Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_bcast(); `send` and `receive` valid for `block` times the group's size bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_alltoall(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send: *const c_void,
    receive: *mut c_void,
    block: usize,
) -> i32 {
    guard_or(
        "nicbar_coll_alltoall",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let algorithm = alltoall_algorithm(algorithm, call.size(), block)?;
                let total = block
                    .checked_mul(call.size())
                    .ok_or_else(|| CollError::Argument("too long".into()))?;
                let mut blocks = Blocks::new(&[(send, total)], &[(receive, total)])
                    .map_err(CollError::Argument)?;
                let receive = blocks.writes.pop().unwrap_or_default();
                coll::alltoall(call, &blocks.reads[0], receive, block, algorithm)
            })
        },
    )
}

/// MPI_Alltoallv: `send_blocks[j]` (`send_lengths[j]` bytes) to rank j, into its
/// `receive_blocks[i]` (this rank; `receive_lengths[i]` bytes); the arrays hold the group's size
/// of elements. Linear or pairwise (Bruck is taken as linear). Returns as nicbar_coll_bcast().
///
/// # Safety
/// As nicbar_coll_bcast(); every block valid for its length.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_alltoallv(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
    op: *mut nicbar_coll_op,
    send_blocks: *const *const c_void,
    send_lengths: *const usize,
    receive_blocks: *const *mut c_void,
    receive_lengths: *const usize,
) -> i32 {
    guard_or(
        "nicbar_coll_alltoallv",
        // SAFETY: the caller's promise about `op`.
        |panic| unsafe { panicked(op, panic) },
        // SAFETY: the caller's promises.
        || unsafe {
            collective(endpoint, group, op, |call, algorithm, _| {
                let size = call.size();
                let reads = pairs(send_blocks, send_lengths, size)
                    .ok_or_else(|| CollError::Argument("NULL send block arrays".into()))?;
                let writes = pairs(receive_blocks, receive_lengths, size)
                    .ok_or_else(|| CollError::Argument("NULL receive block arrays".into()))?;
                // Chosen as for an all-to-all of this rank's longest block: linear puts every
                // long block on its way at once (16 processes, 256 KiB blocks: 3.6 times
                // pairwise's time). Each pair exchanges one message either way, so ranks that
                // choose differently still meet.
                let longest = reads
                    .iter()
                    .map(|&(_, length)| length)
                    .chain(writes.iter().map(|&(_, length)| length))
                    .max()
                    .unwrap_or(0);
                let algorithm = alltoall_algorithm(algorithm, size, longest)?;
                let mut blocks = Blocks::new(&reads, &writes).map_err(CollError::Argument)?;
                let send: Vec<&[u8]> = blocks.reads.iter().map(|b| &b[..]).collect();
                coll::alltoallv(call, &send, &mut blocks.writes, algorithm)
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithms_are_capped_to_the_group() {
        assert_eq!(
            algorithm(NICBAR_COLL_ALGORITHM_GATHER_BROADCAST, 8, 4),
            Ok(Algorithm::GatherBroadcast {
                dimension: 3,
                root: 0
            })
        );
        assert_eq!(
            algorithm(NICBAR_COLL_ALGORITHM_DISSEMINATION, 0, 2),
            Ok(Algorithm::Dissemination { n: 1 })
        );
        assert_eq!(
            algorithm(NICBAR_COLL_ALGORITHM_DEFAULT, 0, 6),
            Ok(Algorithm::Dissemination { n: 1 })
        );
        assert!(
            algorithm(7, 0, 4)
                .unwrap_err()
                .contains("no barrier algorithm 7")
        );
    }

    #[test]
    fn algorithm_numbers_are_the_c_constants() {
        assert!(bcast_algorithm(9, 4, 4).is_err());
        assert_eq!(
            tree_algorithm(2, Collective::Scatter, "scatter", 4, 8),
            Ok(Tree::Binomial)
        );
        assert_eq!(bcast_algorithm(NICBAR_COLL_BCAST_NIC, 4, 4), Ok(Bcast::Nic));
        assert_eq!(alltoall_algorithm(3, 4, 8), Ok(Alltoall::Bruck));
        assert!(alltoall_algorithm(4, 4, 8).is_err());
    }

    #[test]
    fn a_group_with_a_port_twice_is_refused_with_a_reason() {
        let nodes = [0u16, 0];
        let ports = [1u8, 1];
        let mut error = [0 as c_char; 128];
        // SAFETY: two elements each; the buffer is 128 bytes.
        let group = unsafe {
            nicbar_coll_group_new(
                nodes.as_ptr(),
                ports.as_ptr(),
                2,
                0,
                0,
                0,
                error.as_mut_ptr(),
                128,
            )
        };
        assert!(group.is_null());
        // SAFETY: write_message NUL-terminated it.
        let text = unsafe { std::ffi::CStr::from_ptr(error.as_ptr()) };
        assert!(text.to_string_lossy().contains("ranks 0 and 1"), "{text:?}");
    }

    #[test]
    fn null_handles_are_refused() {
        // SAFETY: NULL handles are allowed.
        unsafe {
            assert_eq!(
                nicbar_coll_barrier_start(core::ptr::null_mut(), core::ptr::null()),
                0
            );
            assert_eq!(
                nicbar_coll_barrier_test(
                    core::ptr::null_mut(),
                    1,
                    core::ptr::null_mut(),
                    core::ptr::null_mut(),
                    0
                ),
                NICBAR_COLL_UNKNOWN
            );
            nicbar_coll_close(core::ptr::null_mut());
            nicbar_coll_group_free(core::ptr::null_mut());
        }
    }

    #[test]
    fn data_collectives_refuse_null_handles_and_say_why() {
        let mut op = nicbar_coll_op {
            context: 1,
            sequence: 1,
            algorithm: 0,
            spin: 0,
            segment: 0,
            idle: None,
            idle_argument: core::ptr::null_mut(),
            failed_rank: 7,
            message: [0; NICBAR_COLL_MESSAGE_LENGTH],
        };
        let mut buffer = [0u8; 8];
        // SAFETY: NULL handles are allowed; the buffer is 8 bytes; the op is ours.
        let state = unsafe {
            nicbar_coll_bcast(
                core::ptr::null_mut(),
                core::ptr::null(),
                &mut op,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        assert_eq!(state, NICBAR_COLL_UNKNOWN);
        assert_eq!(op.failed_rank, -1);
        // SAFETY: write_message NUL-terminated it.
        let text = unsafe { std::ffi::CStr::from_ptr(op.message.as_ptr()) };
        assert!(text.to_string_lossy().contains("NULL"), "{text:?}");
        // SAFETY: a NULL op is allowed.
        let state = unsafe {
            nicbar_coll_alltoall(
                core::ptr::null_mut(),
                core::ptr::null(),
                core::ptr::null_mut(),
                core::ptr::null(),
                core::ptr::null_mut(),
                8,
            )
        };
        assert_eq!(state, NICBAR_COLL_UNKNOWN);
    }

    #[test]
    fn overlapping_receive_blocks_are_refused_and_reads_that_overlap_writes_are_copied() {
        let mut memory = [1u8; 32];
        let base = memory.as_mut_ptr();
        // SAFETY: every block lies in `memory`; the first call fails before making views.
        unsafe {
            let overlapping = Blocks::new(&[], &[(base.cast(), 16), (base.add(8).cast(), 16)]);
            assert!(overlapping.is_err());
            let blocks = Blocks::new(
                &[
                    (base.cast::<c_void>().cast_const(), 8),
                    (base.add(24).cast::<c_void>().cast_const(), 8),
                ],
                &[(base.cast(), 16)],
            )
            .unwrap();
            assert!(matches!(blocks.reads[0], std::borrow::Cow::Owned(_)));
            assert!(matches!(blocks.reads[1], std::borrow::Cow::Borrowed(_)));
        }
    }
}
