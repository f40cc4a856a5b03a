//! The exports of GM 2's host names, node ids and unique ids, as the fabric names its nodes (the
//! fabric map's names, else the nodes' UDP addresses, or `<host name>:<unit>` for the units of one
//! daemon). The daemon is asked once per port; the answers are fixed for the daemon's life.

use core::ffi::{CStr, c_char, c_uint};

use super::{guard, with_state};
use crate::names::NamedNode;
use crate::state::PortState;
use crate::status::fail;
use crate::types::*;

// gm_node_id_to_host_name_ex's buffer, written out as a literal in its signature.
const _: () = assert!(GM_MAX_HOST_NAME_LEN as usize + 1 == 129);

/// Runs `body` on the port's table of names, or returns the status of the failure to get it.
fn with_names(
    port: *mut gm_port,
    function: &str,
    body: impl FnOnce(&crate::names::FabricNames) -> gm_status_t,
) -> gm_status_t {
    with_state(
        port,
        function,
        GM_INVALID_PARAMETER,
        |state: &mut PortState| match state.fabric_names() {
            Ok(names) => body(names),
            Err((status, words)) => fail(status, format!("{function}: {words}")),
        },
    )
}

/// Copies `name` and its NUL to `out`, which holds `capacity` bytes (every name fits GM's
/// buffers: at most GM_MAX_HOST_NAME_LEN - 1 bytes).
///
/// # Safety
/// `out` points to `capacity` writable bytes.
unsafe fn copy_name(node: &NamedNode, out: *mut c_char, capacity: usize) -> bool {
    let bytes = node.name.as_bytes_with_nul();
    if bytes.len() > capacity {
        return false;
    }
    // SAFETY: `out` has `capacity` writable bytes (the caller's promise), and `bytes` fits them;
    // the name is the port's own memory, so the two do not overlap.
    unsafe { core::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len()) };
    true
}

/// Reads the 6 bytes of a unique id at `unique`.
///
/// # Safety
/// `unique` is not NULL and points to 6 readable bytes.
unsafe fn read_unique(unique: *const c_char) -> [u8; 6] {
    let mut id = [0u8; 6];
    // SAFETY: 6 readable bytes (the caller's promise), copied into a local array.
    unsafe { core::ptr::copy_nonoverlapping(unique.cast::<u8>(), id.as_mut_ptr(), 6) };
    id
}

/// Writes a unique id to the 6 bytes at `unique`.
///
/// # Safety
/// `unique` is not NULL and points to 6 writable bytes.
unsafe fn write_unique(unique: *mut c_char, id: [u8; 6]) {
    // SAFETY: 6 writable bytes (the caller's promise), from a local array.
    unsafe { core::ptr::copy_nonoverlapping(id.as_ptr(), unique.cast::<u8>(), 6) };
}

/// Stores this node's host name, with its NUL, in `name` (GM_MAX_HOST_NAME_LEN bytes; a name
/// is at most GM_MAX_HOST_NAME_LEN - 1 bytes). GM_INVALID_PARAMETER if `name` is NULL or the
/// port is not open; GM_TIMED_OUT or GM_FAILURE if the daemon did not answer.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `name` is NULL or points to GM_MAX_HOST_NAME_LEN
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get_host_name(port: *mut gm_port, name: *mut c_char) -> gm_status_t {
    guard("gm_get_host_name", GM_INTERNAL_ERROR, || {
        if name.is_null() {
            return fail(GM_INVALID_PARAMETER, "gm_get_host_name: name is NULL");
        }
        let mut own = 0;
        let status = with_state(port, "gm_get_host_name", GM_INVALID_PARAMETER, |state| {
            own = state.raw.node_id().get();
            GM_SUCCESS
        });
        if status != GM_SUCCESS {
            return status;
        }
        with_names(port, "gm_get_host_name", |names| {
            match names.by_node(c_uint::from(own)) {
                // SAFETY: GM_MAX_HOST_NAME_LEN writable bytes (the caller's promise).
                Some(node) if unsafe { copy_name(node, name, GM_MAX_HOST_NAME_LEN as usize) } => {
                    GM_SUCCESS
                }
                _ => fail(
                    GM_FAILURE,
                    format!("gm_get_host_name: the daemon does not name this node ({own})"),
                ),
            }
        })
    })
}

/// The node id of the node called `host_name` (compared byte for byte), or GM_NO_SUCH_NODE_ID
/// (0) if no node of the fabric is called so, the name is NULL, the port is not open or the
/// daemon did not answer. Node ids start at 0 on this fabric (GM's at 1), so node 0 reads as
/// GM_NO_SUCH_NODE_ID here: gm_host_name_to_node_id_ex tells the two apart.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `host_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_host_name_to_node_id(
    port: *mut gm_port,
    host_name: *mut c_char,
) -> c_uint {
    guard("gm_host_name_to_node_id", GM_NO_SUCH_NODE_ID, || {
        let mut node_id = GM_NO_SUCH_NODE_ID;
        // SAFETY: as this function's own promise.
        let _ = unsafe { gm_host_name_to_node_id_ex(port, 0, host_name, &mut node_id) };
        node_id
    })
}

/// Stores in `*node_id` the node id of the node called `host_name` (compared byte for byte).
/// GM_NO_MATCH if no node of the fabric is called so; GM_INVALID_PARAMETER for a NULL pointer or
/// a port not open; GM_TIMED_OUT or GM_FAILURE if the daemon did not answer. `timeout_usecs` is
/// not used: the daemon answers from the fabric map it read at start, within the control
/// protocol's own bound.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `host_name` is NULL or a NUL-terminated string;
/// `node_id` is NULL or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_host_name_to_node_id_ex(
    port: *mut gm_port,
    timeout_usecs: c_uint,
    host_name: *const c_char,
    node_id: *mut c_uint,
) -> gm_status_t {
    guard("gm_host_name_to_node_id_ex", GM_INTERNAL_ERROR, || {
        let _ = timeout_usecs;
        if host_name.is_null() || node_id.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                "gm_host_name_to_node_id_ex: host_name or node_id is NULL",
            );
        }
        // SAFETY: not NULL, and NUL-terminated (the caller's promise).
        let wanted = unsafe { CStr::from_ptr(host_name) };
        with_names(port, "gm_host_name_to_node_id_ex", |names| {
            match names.by_name(wanted.to_bytes()) {
                Some(node) => {
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { node_id.write(c_uint::from(node.node)) };
                    GM_SUCCESS
                }
                None => fail(
                    GM_NO_MATCH,
                    format!(
                        "gm_host_name_to_node_id_ex: no node of the fabric is called `{}`",
                        wanted.to_string_lossy()
                    ),
                ),
            }
        })
    })
}

/// The host name of node `node_id`, or NULL if the fabric has no such node, the port is not
/// open or the daemon did not answer. The string belongs to the port and stays valid until
/// gm_close.
///
/// # Safety
/// `port` is NULL or a port from gm_open.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_node_id_to_host_name(
    port: *mut gm_port,
    node_id: c_uint,
) -> *mut c_char {
    guard("gm_node_id_to_host_name", core::ptr::null_mut(), || {
        with_state(
            port,
            "gm_node_id_to_host_name",
            core::ptr::null_mut(),
            |state| match state.fabric_names() {
                Ok(names) => match names.by_node(node_id) {
                    // The name lives in the port's table, which is kept until the port closes.
                    Some(node) => node.name.as_ptr().cast_mut(),
                    None => {
                        fail(
                            GM_NO_MATCH,
                            format!("gm_node_id_to_host_name: the fabric has no node {node_id}"),
                        );
                        core::ptr::null_mut()
                    }
                },
                Err((status, words)) => {
                    fail(status, format!("gm_node_id_to_host_name: {words}"));
                    core::ptr::null_mut()
                }
            },
        )
    })
}

/// Stores the host name of node `node_id`, with its NUL, in `*name`. GM_NO_MATCH if the fabric
/// has no such node; GM_INVALID_PARAMETER for a NULL `name` or a port not open; GM_TIMED_OUT or
/// GM_FAILURE if the daemon did not answer. `timeout_usecs` is not used (see
/// gm_host_name_to_node_id_ex).
///
/// # Safety
/// `port` is NULL or a port from gm_open; `name` is NULL or points to a writable
/// `char[GM_MAX_HOST_NAME_LEN + 1]`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_node_id_to_host_name_ex(
    port: *mut gm_port,
    timeout_usecs: c_uint,
    node_id: c_uint,
    // GM_MAX_HOST_NAME_LEN + 1 (cbindgen writes out a literal length only).
    name: *mut [c_char; 129],
) -> gm_status_t {
    guard("gm_node_id_to_host_name_ex", GM_INTERNAL_ERROR, || {
        let _ = timeout_usecs;
        if name.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                "gm_node_id_to_host_name_ex: name is NULL",
            );
        }
        with_names(port, "gm_node_id_to_host_name_ex", |names| {
            match names.by_node(node_id) {
                Some(node) => {
                    let capacity = GM_MAX_HOST_NAME_LEN as usize + 1;
                    // SAFETY: a writable char[GM_MAX_HOST_NAME_LEN + 1] (the caller's promise).
                    if unsafe { copy_name(node, name.cast::<c_char>(), capacity) } {
                        GM_SUCCESS
                    } else {
                        fail(
                            GM_FAILURE,
                            "gm_node_id_to_host_name_ex: the name is too long",
                        )
                    }
                }
                None => fail(
                    GM_NO_MATCH,
                    format!("gm_node_id_to_host_name_ex: the fabric has no node {node_id}"),
                ),
            }
        })
    })
}

/// Stores this node's unique id (GM's 6-byte board id, the same from every daemon of the
/// fabric) in `unique`. GM_INVALID_PARAMETER for a NULL `unique` or a port not open;
/// GM_TIMED_OUT or GM_FAILURE if the daemon did not answer.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `unique` is NULL or points to 6 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_unique_id(port: *mut gm_port, unique: *mut c_char) -> gm_status_t {
    guard("gm_unique_id", GM_INTERNAL_ERROR, || {
        let mut own = 0;
        let status = with_state(port, "gm_unique_id", GM_INVALID_PARAMETER, |state| {
            own = state.raw.node_id().get();
            GM_SUCCESS
        });
        if status != GM_SUCCESS {
            return status;
        }
        // SAFETY: as this function's own promise.
        unsafe { gm_node_id_to_unique_id(port, c_uint::from(own), unique) }
    })
}

/// gm_unique_id under GM's other name for it: this NIC's board id.
///
/// # Safety
/// As gm_unique_id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_get_unique_board_id(
    port: *mut gm_port,
    unique: *mut c_char,
) -> gm_status_t {
    // SAFETY: the same promise.
    guard("gm_get_unique_board_id", GM_INTERNAL_ERROR, || unsafe {
        gm_unique_id(port, unique)
    })
}

/// Stores the unique id of node `n` in `unique`. GM_NO_MATCH if the fabric has no such node;
/// GM_INVALID_PARAMETER for a NULL `unique` or a port not open; GM_TIMED_OUT or GM_FAILURE if
/// the daemon did not answer.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `unique` is NULL or points to 6 writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_node_id_to_unique_id(
    port: *mut gm_port,
    n: c_uint,
    unique: *mut c_char,
) -> gm_status_t {
    guard("gm_node_id_to_unique_id", GM_INTERNAL_ERROR, || {
        if unique.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                "gm_node_id_to_unique_id: unique is NULL",
            );
        }
        with_names(port, "gm_node_id_to_unique_id", |names| {
            match names.by_node(n) {
                Some(node) => {
                    // SAFETY: not NULL, 6 writable bytes (the caller's promise).
                    unsafe { write_unique(unique, node.unique_id) };
                    GM_SUCCESS
                }
                None => fail(
                    GM_NO_MATCH,
                    format!("gm_node_id_to_unique_id: the fabric has no node {n}"),
                ),
            }
        })
    })
}

/// Stores in `*node_id` the node id of the node whose unique id is `unique`. GM_NO_MATCH if no
/// node of the fabric has it; GM_INVALID_PARAMETER for a NULL pointer or a port not open;
/// GM_TIMED_OUT or GM_FAILURE if the daemon did not answer.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `unique` is NULL or points to 6 readable bytes;
/// `node_id` is NULL or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_unique_id_to_node_id(
    port: *mut gm_port,
    unique: *mut c_char,
    node_id: *mut c_uint,
) -> gm_status_t {
    guard("gm_unique_id_to_node_id", GM_INTERNAL_ERROR, || {
        if unique.is_null() || node_id.is_null() {
            return fail(
                GM_INVALID_PARAMETER,
                "gm_unique_id_to_node_id: unique or node_id is NULL",
            );
        }
        // SAFETY: not NULL, 6 readable bytes (the caller's promise).
        let id = unsafe { read_unique(unique) };
        with_names(port, "gm_unique_id_to_node_id", |names| {
            match names.by_unique_id(id) {
                Some(node) => {
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { node_id.write(c_uint::from(node.node)) };
                    GM_SUCCESS
                }
                None => fail(
                    GM_NO_MATCH,
                    format!(
                        "gm_unique_id_to_node_id: no node of the fabric has unique id {id:02x?}"
                    ),
                ),
            }
        })
    })
}

/// Stores in `*n` the largest node id of the fabric this port's daemon knows (its own nodes and
/// those of its fabric map). GM_INVALID_PARAMETER for a NULL `n` or a port not open;
/// GM_TIMED_OUT or GM_FAILURE if the daemon did not answer.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `n` is NULL or points to a writable `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_max_node_id_in_use(port: *mut gm_port, n: *mut c_uint) -> gm_status_t {
    guard("gm_max_node_id_in_use", GM_INTERNAL_ERROR, || {
        if n.is_null() {
            return fail(GM_INVALID_PARAMETER, "gm_max_node_id_in_use: n is NULL");
        }
        with_names(port, "gm_max_node_id_in_use", |names| {
            match names.max_node() {
                Some(max) => {
                    // SAFETY: not NULL, and writable (the caller's promise).
                    unsafe { n.write(c_uint::from(max)) };
                    GM_SUCCESS
                }
                None => fail(
                    GM_FAILURE,
                    "gm_max_node_id_in_use: the daemon names no node",
                ),
            }
        })
    })
}

/// gm_max_node_id_in_use under GM's older name.
///
/// # Safety
/// As gm_max_node_id_in_use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_max_node_id_inuse(port: *mut gm_port, n: *mut c_uint) -> gm_status_t {
    // SAFETY: the same promise.
    guard("gm_max_node_id_inuse", GM_INTERNAL_ERROR, || unsafe {
        gm_max_node_id_in_use(port, n)
    })
}

/// Stores in `*node_id` the node id of the node with global id `global_id`. A node's id is
/// the same from everywhere on this fabric (GM 2's node ids are per-NIC connection ids), so
/// the two are equal: GM_NO_MATCH if the fabric has no such node; GM_INVALID_PARAMETER for a
/// NULL `node_id` or a port not open.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `node_id` is NULL or points to a writable
/// `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_global_id_to_node_id(
    port: *mut gm_port,
    global_id: c_uint,
    node_id: *mut c_uint,
) -> gm_status_t {
    // SAFETY: the same promise, `node_id` for the id written.
    guard("gm_global_id_to_node_id", GM_INTERNAL_ERROR, || unsafe {
        same_id(port, "gm_global_id_to_node_id", global_id, node_id)
    })
}

/// Stores in `*global_id` the global id of node `node_id`: the same number on this fabric (see
/// gm_global_id_to_node_id).
///
/// # Safety
/// `port` is NULL or a port from gm_open; `global_id` is NULL or points to a writable
/// `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_node_id_to_global_id(
    port: *mut gm_port,
    node_id: c_uint,
    global_id: *mut c_uint,
) -> gm_status_t {
    // SAFETY: the same promise, `global_id` for the id written.
    guard("gm_node_id_to_global_id", GM_INTERNAL_ERROR, || unsafe {
        same_id(port, "gm_node_id_to_global_id", node_id, global_id)
    })
}

/// Writes `id` to `out` if the fabric has a node with that id.
///
/// # Safety
/// `port` is NULL or a port from gm_open; `out` is NULL or points to a writable `unsigned int`.
unsafe fn same_id(port: *mut gm_port, function: &str, id: c_uint, out: *mut c_uint) -> gm_status_t {
    if out.is_null() {
        return fail(
            GM_INVALID_PARAMETER,
            format!("{function}: the output is NULL"),
        );
    }
    with_names(port, function, |names| match names.by_node(id) {
        Some(_) => {
            // SAFETY: not NULL, and writable (the caller's promise).
            unsafe { out.write(id) };
            GM_SUCCESS
        }
        None => fail(
            GM_NO_MATCH,
            format!("{function}: the fabric has no node {id}"),
        ),
    })
}
