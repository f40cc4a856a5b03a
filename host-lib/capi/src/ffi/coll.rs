//! Barriers for collective layers (an MPI library's `coll` component): one port per process, a
//! group per communicator, and any number of barriers outstanding on the port at once.
//!
//! The NIC runs one barrier at a time per port. A communication library needs more: a process
//! may start non-blocking barriers on several communicators before it waits for any. An
//! endpoint (`nicbar_coll_endpoint`) queues them: nicbar_coll_barrier_start() returns a ticket at
//! once; nicbar_coll_progress() (called from the library's progress loop) posts the next queued
//! barrier to the NIC as soon as the one running ends; nicbar_coll_barrier_test() says whether a
//! ticket's barrier has ended and how. Barriers run in the order they were started, so members
//! that start barriers on the same communicators in the same order (as MPI requires of blocking
//! collectives) always meet; members that start non-blocking barriers of different
//! communicators in different orders wait for each other until the barriers' timeout.
//!
//! A failed barrier names the member the NIC waited for by its rank in the group, which is the
//! rank in the communicator when the group lists the communicator's ranks in order.
//!
//! They live at the FFI edge whole: the endpoint is a Rust `Port` behind an opaque handle, and
//! what they add to it (a queue of tickets) is small. These calls are built over the library's Rust API (`Port`, `Group`, `barrier_start`,
//! `barrier_test`, `barrier_wait`); they share nothing with the GM calls but the header. Every
//! export runs under a panic boundary; handles may be NULL.

use core::ffi::c_char;
use std::collections::{HashMap, VecDeque};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use shared_abi::ids::PORTS_PER_NIC;

use nicbar_rs::{
    Algorithm, BarrierError, BarrierOptions, Error, Group, Member, NodeId, PendingBarrier, Port,
    PortId,
};

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
/// nicbar_coll_barrier_test(): the barrier completed.
pub const NICBAR_COLL_COMPLETED: i32 = 1;
/// nicbar_coll_barrier_test(): the barrier failed; `failed_rank` and `message` say why.
pub const NICBAR_COLL_FAILED: i32 = -1;
/// nicbar_coll_barrier_test(): no barrier has this ticket (never started, or its end already
/// taken), or a handle is NULL.
pub const NICBAR_COLL_UNKNOWN: i32 = -2;

/// How a barrier ended: `Ok`, or the failed member's rank (-1 if none) and a message.
type Outcome = Result<(), (i32, String)>;

/// One process's port, with the barriers it has queued, the one running in the NIC, and the
/// ends not yet taken.
pub struct nicbar_coll_endpoint {
    port: Port,
    queued: VecDeque<(u64, Group)>,
    running: Option<(u64, PendingBarrier)>,
    ended: HashMap<u64, Outcome>,
    next_ticket: u64,
    completed: u64,
}

/// The members of a barrier, by rank (a communicator's ranks), and how its barriers run.
pub struct nicbar_coll_group {
    group: Group,
}

/// Runs `body`, turning a panic into `on_panic` instead of letting it unwind into C.
fn boundary<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or(on_panic)
}

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

impl nicbar_coll_endpoint {
    /// Takes the running barrier's end if it has come, and posts queued barriers while the port
    /// is free. Returns how many barriers ended.
    fn progress(&mut self) -> usize {
        let mut ended = 0;
        loop {
            if let Some((_, pending)) = &self.running {
                if let Ok(false) = self.port.barrier_test(pending) {
                    return ended;
                }
                if let Some((ticket, pending)) = self.running.take() {
                    let outcome = self.port.barrier_wait(pending);
                    self.record(ticket, outcome);
                    ended += 1;
                }
            }
            let Some((ticket, group)) = self.queued.pop_front() else {
                return ended;
            };
            match self.port.barrier_start(&group) {
                Ok(pending) => self.running = Some((ticket, pending)),
                Err(error) => {
                    self.record(ticket, Err(error));
                    ended += 1;
                }
            }
        }
    }

    fn record(&mut self, ticket: u64, outcome: Result<(), BarrierError>) {
        let outcome = match outcome {
            Ok(()) => {
                self.completed += 1;
                Ok(())
            }
            Err(error) => {
                let rank = match &error {
                    BarrierError::Failed {
                        rank: Some(rank), ..
                    } => i32::try_from(*rank).unwrap_or(-1),
                    _ => -1,
                };
                Err((rank, error.to_string()))
            }
        };
        self.ended.insert(ticket, outcome);
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
    let opened = boundary(
        Err("a panic in the nicbar library".to_owned()),
        || match u8::try_from(unit) {
            Ok(unit) => open_first_free(unit)
                .map_err(|e| e.to_string())?
                .ok_or_else(|| format!("every port of NIC unit {unit} is busy")),
            Err(_) if unit < 0 => open_any(unit.unsigned_abs() - 1),
            Err(_) => Err(format!("no NIC unit {unit}")),
        },
    );
    match opened {
        Ok(port) => Box::into_raw(Box::new(nicbar_coll_endpoint {
            port,
            queued: VecDeque::new(),
            running: None,
            ended: HashMap::new(),
            next_ticket: 1,
            completed: 0,
        })),
        Err(message) => {
            // SAFETY: the caller's promise about `error`.
            unsafe { write_message(error, error_length, &message) };
            core::ptr::null_mut()
        }
    }
}

/// Closes the endpoint's port (peers' barriers waiting for it fail, naming it) and frees it.
/// Takes NULL.
///
/// # Safety
/// `endpoint` is NULL or from nicbar_coll_open() and not closed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_close(endpoint: *mut nicbar_coll_endpoint) {
    boundary((), || {
        if !endpoint.is_null() {
            // SAFETY: the caller's promise: it came from Box::into_raw and is closed once.
            let endpoint = unsafe { Box::from_raw(endpoint) };
            let _ = endpoint.port.close();
        }
    });
}

/// The node id of the endpoint's NIC (0 for NULL).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_node_id(endpoint: *const nicbar_coll_endpoint) -> u16 {
    boundary(0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.port.node_id().get())
    })
}

/// The endpoint's port id (0 for NULL).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_port_id(endpoint: *const nicbar_coll_endpoint) -> u8 {
    boundary(0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.port.port_id().0)
    })
}

/// How many barriers completed through this endpoint's NIC (failed ones not counted).
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_completed(endpoint: *const nicbar_coll_endpoint) -> u64 {
    boundary(0, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_ref() }.map_or(0, |e| e.completed)
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
    let built = boundary(Err("a panic in the nicbar library".to_owned()), || {
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
    });
    match built {
        Ok(group) => Box::into_raw(Box::new(nicbar_coll_group { group })),
        Err(message) => {
            // SAFETY: the caller's promise about `error`.
            unsafe { write_message(error, error_length, &message) };
            core::ptr::null_mut()
        }
    }
}

/// The first free port of `unit` (`None` if all are busy).
fn open_first_free(unit: u8) -> Result<Option<Port>, Error> {
    let ports = u8::try_from(PORTS_PER_NIC).unwrap_or(u8::MAX);
    for port in (1..ports).chain([0]) {
        match Port::open(unit, port) {
            Ok(port) => return Ok(Some(port)),
            Err(Error::PortBusy { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(None)
}

/// The first free port of the daemon's units, from unit `start` (modulo their number) on.
fn open_any(start: u32) -> Result<Port, String> {
    // Ask for a unit past the daemon's last: the refusal says how many it runs.
    let units = match Port::open(u8::MAX, 1) {
        Err(Error::NoSuchUnit { units, .. }) => units,
        Ok(port) => return Ok(port),
        Err(other) => return Err(other.to_string()),
    };
    if units == 0 {
        return Err("the NIC daemon runs no units".to_owned());
    }
    let first = u8::try_from(start % u32::from(units)).unwrap_or(0);
    for offset in 0..units {
        let unit =
            u8::try_from((u32::from(first) + u32::from(offset)) % u32::from(units)).unwrap_or(0);
        if let Some(port) = open_first_free(unit).map_err(|e| e.to_string())? {
            return Ok(port);
        }
    }
    Err(format!(
        "every port of the daemon's {units} NIC unit(s) is busy"
    ))
}

/// Frees a group. Takes NULL. Barriers started on it keep running.
///
/// # Safety
/// `group` is NULL or from nicbar_coll_group_new() and not freed yet.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_group_free(group: *mut nicbar_coll_group) {
    boundary((), || {
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
    boundary(-1, || {
        // SAFETY: the caller's promise: NULL or live and not shared meanwhile.
        let (Some(endpoint), Some(group)) =
            (unsafe { endpoint.as_mut() }, unsafe { group.as_mut() })
        else {
            return -1;
        };
        group.group = group.group.clone().with_job(job).with_id(id);
        endpoint.port.restart_barrier_numbering(&group.group);
        0
    })
}

/// Starts a barrier of `group` on the endpoint and returns its ticket (never 0; 0 for a NULL
/// handle). The barrier goes to the NIC at once if the port is free, else when the barriers
/// started before it on this endpoint have ended. Follow it with nicbar_coll_barrier_test().
///
/// # Safety
/// `endpoint` and `group` are NULL or live handles.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_barrier_start(
    endpoint: *mut nicbar_coll_endpoint,
    group: *const nicbar_coll_group,
) -> u64 {
    boundary(0, || {
        // SAFETY: the caller's promise.
        let (Some(endpoint), Some(group)) =
            (unsafe { endpoint.as_mut() }, unsafe { group.as_ref() })
        else {
            return 0;
        };
        let ticket = endpoint.next_ticket;
        endpoint.next_ticket = endpoint.next_ticket.wrapping_add(1).max(1);
        endpoint.queued.push_back((ticket, group.group.clone()));
        endpoint.progress();
        ticket
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
    boundary(-1, || {
        // SAFETY: the caller's promise.
        unsafe { endpoint.as_mut() }.map_or(-1, |e| i32::try_from(e.progress()).unwrap_or(i32::MAX))
    })
}

/// Sleeps until the NIC reports an event to the endpoint or `timeout_us` microseconds pass, then
/// progresses as nicbar_coll_progress() and returns what it returns. Returns at once if no
/// barrier is outstanding.
///
/// # Safety
/// `endpoint` is NULL or a live endpoint.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_coll_wait(
    endpoint: *mut nicbar_coll_endpoint,
    timeout_us: u32,
) -> i32 {
    boundary(-1, || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_mut() }) else {
            return -1;
        };
        let mut ended = endpoint.progress();
        if ended == 0 && endpoint.running.is_some() {
            // The barrier's end is taken by the port's barrier code; any other event is
            // nobody's on a port that only runs barriers.
            let _ = endpoint
                .port
                .receive_timeout(Duration::from_micros(u64::from(timeout_us)));
            ended = endpoint.progress();
        }
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
    boundary(NICBAR_COLL_UNKNOWN, || {
        // SAFETY: the caller's promise.
        let Some(endpoint) = (unsafe { endpoint.as_mut() }) else {
            return NICBAR_COLL_UNKNOWN;
        };
        endpoint.progress();
        match endpoint.ended.remove(&ticket) {
            Some(Ok(())) => NICBAR_COLL_COMPLETED,
            Some(Err((rank, text))) => {
                // SAFETY: the caller's promises about `failed_rank` and `message`.
                unsafe {
                    if let Some(failed_rank) = failed_rank.as_mut() {
                        *failed_rank = rank;
                    }
                    write_message(message, message_length, &text);
                }
                NICBAR_COLL_FAILED
            }
            None if endpoint.running.as_ref().is_some_and(|(t, _)| *t == ticket)
                || endpoint.queued.iter().any(|(t, _)| *t == ticket) =>
            {
                NICBAR_COLL_PENDING
            }
            None => NICBAR_COLL_UNKNOWN,
        }
    })
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
}
