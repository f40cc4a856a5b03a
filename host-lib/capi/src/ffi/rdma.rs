//! The exports of one-sided operations: GM 2's registered memory, `gm_put`, `gm_get` and
//! directed sends, and nicbar's NIC atomics and fence (GM had none).

use core::ffi::{c_uint, c_void};

use shared_abi::rdma::AtomicOp;
use shared_abi::token::SendKind;

use super::{guard, with_state};
use crate::rdma::Request;
use crate::status::fail;
use crate::types::*;

/// `nicbar_fence`'s node for "every node".
pub const NICBAR_ALL_NODES: c_uint = c_uint::MAX;

/// Registers `length` bytes at `ptr` — any memory the process owns: `malloc`ed, on the stack,
/// static — with the port, so the NIC reaches it single-copy for gm_put, gm_get and the NIC
/// atomics, and (once gm_allow_remote_memory_access) peers reach it too. The memory must stay
/// valid until gm_deregister_memory or gm_close. On the emulated NIC the daemon reads and writes
/// it with process_vm_readv/process_vm_writev: it must run as the same user, and under Yama
/// `kernel.yama.ptrace_scope` must be 0; otherwise this fails with GM_PERMISSION_DENIED and
/// nicbar_last_error() says why. At most 16 regions per port.
///
/// # Safety
/// `port` is NULL or a port from gm_open; the memory stays valid while registered.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_register_memory(
    port: *mut gm_port,
    ptr: *mut c_void,
    length: gm_size_t,
) -> gm_status_t {
    guard("gm_register_memory", GM_INTERNAL_ERROR, || {
        if ptr.is_null() || length == 0 {
            return fail(
                GM_INVALID_PARAMETER,
                "gm_register_memory: a NULL or empty range",
            );
        }
        with_state(port, "gm_register_memory", GM_INVALID_PARAMETER, |state| {
            // SAFETY: GM's rule, which the program promises: registered memory stays valid (and
            // the program expects the NIC to write it) until it is deregistered or the port
            // closes.
            let registered = unsafe {
                state
                    .raw
                    .register_memory(ptr.cast_const().cast(), length as usize)
            };
            state.registered_memory(ptr as usize, length as usize, registered)
        })
    })
}

/// Deregisters the region registered with exactly `ptr` and `length`; peers' operations on it
/// then fail (their callbacks get GM_PERMISSION_DENIED: bad key).
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_deregister_memory(
    port: *mut gm_port,
    ptr: *mut c_void,
    length: gm_size_t,
) -> gm_status_t {
    guard("gm_deregister_memory", GM_INTERNAL_ERROR, || {
        with_state(
            port,
            "gm_deregister_memory",
            GM_INVALID_PARAMETER,
            |state| state.deregister_memory(ptr as usize, length as usize),
        )
    })
}

/// Lets peers put to, get from and apply atomics to this port's registered memory. Until it is
/// called their operations fail (GM_PERMISSION_DENIED, "remote access not allowed").
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_allow_remote_memory_access(port: *mut gm_port) -> gm_status_t {
    guard("gm_allow_remote_memory_access", GM_INTERNAL_ERROR, || {
        with_state(
            port,
            "gm_allow_remote_memory_access",
            GM_INVALID_PARAMETER,
            PortState::allow_remote_memory_access,
        )
    })
}

/// The remote pointer to the byte at `ptr` of memory registered on this port (the region's key
/// and the offset into it), to hand to peers for gm_put, gm_get and the atomics; 0 (and
/// nicbar_last_error()) if `ptr` is not in registered memory.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_remote_ptr(
    port: *mut gm_port,
    ptr: *mut c_void,
) -> gm_remote_ptr_t {
    guard("nicbar_remote_ptr", 0, || {
        with_state(port, "nicbar_remote_ptr", 0, |state| {
            state.remote_pointer(ptr as usize)
        })
    })
}

/// Puts `len` bytes of registered memory at `local_buffer` to `remote_buffer` of
/// (`target_node_id`, `target_port_id`). `callback` runs (from gm_unknown, after a
/// GM_SENT_EVENT) once the bytes are in the target's memory — remote completion — or with why
/// not: GM_PERMISSION_DENIED (bad key, remote access not allowed, local buffer not registered),
/// GM_INVALID_PARAMETER (outside the target's region), GM_SEND_TARGET_PORT_CLOSED, ...; then the
/// target's memory is untouched. Any length: the NIC cuts it into packets. A port's puts, gets
/// and sends to one node are applied there in the order posted. `priority` is accepted as GM's
/// and not used.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `local_buffer` stays registered until the callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_put(
    port: *mut gm_port,
    local_buffer: *mut c_void,
    remote_buffer: gm_remote_ptr_t,
    len: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    let _ = priority;
    guard("gm_put", (), || {
        post(
            "gm_put",
            port,
            request(
                SendKind::PUT,
                local_buffer,
                remote_buffer,
                len,
                target_node_id,
                target_port_id,
            ),
            callback,
            context,
        );
    });
}

/// gm_put under GM 1's name: the same call.
///
/// # Safety
/// As gm_put.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_directed_send_with_callback(
    port: *mut gm_port,
    source_buffer: *mut c_void,
    target_buffer: gm_remote_ptr_t,
    len: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    let _ = priority;
    guard("gm_directed_send_with_callback", (), || {
        post(
            "gm_directed_send_with_callback",
            port,
            request(
                SendKind::PUT,
                source_buffer,
                target_buffer,
                len,
                target_node_id,
                target_port_id,
            ),
            callback,
            context,
        );
    });
}

/// Gets `len` bytes from `remote_buffer` of (`target_node_id`, `target_port_id`) into registered
/// memory at `local_buffer`; `callback` runs once they are there, or with why not (as gm_put).
///
/// # Safety
/// `port` is NULL or a port from gm_open; `local_buffer` stays registered until the callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get(
    port: *mut gm_port,
    remote_buffer: gm_remote_ptr_t,
    local_buffer: *mut c_void,
    len: gm_size_t,
    priority: c_uint,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    let _ = priority;
    guard("gm_get", (), || {
        post(
            "gm_get",
            port,
            request(
                SendKind::GET,
                local_buffer,
                remote_buffer,
                len,
                target_node_id,
                target_port_id,
            ),
            callback,
            context,
        );
    });
}

/// NIC fetch-and-add: the target NIC adds `operand` to the aligned 64-bit word at `word` of
/// (`target_node_id`, `target_port_id`), exactly once even through lost or duplicated packets,
/// one atomic at a time; the word's previous value is written to `*result` (if not NULL) before
/// `callback` runs. Atomic against other NIC atomics on the word (not against the target
/// process's own CPU accesses). Fails as gm_put does, and with GM_INVALID_PARAMETER for a
/// misaligned word.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `result` is NULL or stays writable until the callback.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_atomic_fetch_add(
    port: *mut gm_port,
    word: gm_remote_ptr_t,
    operand: gm_u64_t,
    result: *mut gm_u64_t,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("nicbar_atomic_fetch_add", (), || {
        atomic(
            "nicbar_atomic_fetch_add",
            port,
            AtomicOp::FETCH_ADD,
            (word, operand, 0, result),
            (target_node_id, target_port_id),
            callback,
            context,
        );
    });
}

/// NIC swap: the word becomes `operand`; its previous value goes to `*result`. As
/// nicbar_atomic_fetch_add.
///
/// # Safety
/// As nicbar_atomic_fetch_add.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_atomic_swap(
    port: *mut gm_port,
    word: gm_remote_ptr_t,
    operand: gm_u64_t,
    result: *mut gm_u64_t,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("nicbar_atomic_swap", (), || {
        atomic(
            "nicbar_atomic_swap",
            port,
            AtomicOp::SWAP,
            (word, operand, 0, result),
            (target_node_id, target_port_id),
            callback,
            context,
        );
    });
}

/// NIC compare-and-swap: if the word equals `compare` it becomes `operand`; its previous value
/// goes to `*result` either way (equal to `compare` when it swapped). As
/// nicbar_atomic_fetch_add.
///
/// # Safety
/// As nicbar_atomic_fetch_add.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_atomic_compare_swap(
    port: *mut gm_port,
    word: gm_remote_ptr_t,
    compare: gm_u64_t,
    operand: gm_u64_t,
    result: *mut gm_u64_t,
    target_node_id: c_uint,
    target_port_id: c_uint,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    guard("nicbar_atomic_compare_swap", (), || {
        atomic(
            "nicbar_atomic_compare_swap",
            port,
            AtomicOp::COMPARE_SWAP,
            (word, operand, compare, result),
            (target_node_id, target_port_id),
            callback,
            context,
        );
    });
}

/// Returns once every gm_put this port issued to `target_node_id` (to every node for
/// NICBAR_ALL_NODES) is complete at its target — ARMCI's fence. Events that arrive meanwhile
/// are kept for the next receive calls; the puts' callbacks run from gm_unknown as usual.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nicbar_fence(port: *mut gm_port, target_node_id: c_uint) -> gm_status_t {
    guard("nicbar_fence", GM_INTERNAL_ERROR, || {
        let node = if target_node_id == NICBAR_ALL_NODES {
            None
        } else {
            match u16::try_from(target_node_id) {
                Ok(node) => Some(node),
                Err(_) => {
                    return fail(
                        GM_INVALID_PARAMETER,
                        format!("nicbar_fence: node id {target_node_id} is out of range"),
                    );
                }
            }
        };
        with_state(port, "nicbar_fence", GM_INVALID_PARAMETER, |state| {
            state.fence(node)
        })
    })
}

use crate::state::PortState;

fn request(
    kind: SendKind,
    local: *mut c_void,
    remote: gm_remote_ptr_t,
    len: gm_size_t,
    node: c_uint,
    port: c_uint,
) -> Request {
    Request {
        kind,
        local: local as usize,
        remote,
        #[allow(
            clippy::useless_conversion,
            reason = "gm_size_t is an unsigned long, 32 bits on some hosts"
        )]
        length: u64::from(len),
        node,
        port,
        op: AtomicOp::default(),
        operand: 0,
        compare: 0,
        result: 0,
    }
}

fn post(
    function: &str,
    port: *mut gm_port,
    request: Request,
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    with_state(port, function, (), |state| {
        state.post_operation(function, request, callback, context as usize);
    });
}

fn atomic(
    function: &str,
    port: *mut gm_port,
    op: AtomicOp,
    (word, operand, compare, result): (gm_remote_ptr_t, u64, u64, *mut gm_u64_t),
    (node, target_port): (c_uint, c_uint),
    callback: gm_send_completion_callback_t,
    context: *mut c_void,
) {
    let request = Request {
        op,
        operand,
        compare,
        result: result as usize,
        length: 8,
        ..request(
            SendKind::ATOMIC,
            core::ptr::null_mut(),
            word,
            0,
            node,
            target_port,
        )
    };
    post(function, port, request, callback, context);
}
