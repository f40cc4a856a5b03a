//! nicbar-capi: the C API, `libnicbar.so` and `libnicbar.a` — GM 2's calls over nicbar ports,
//! declared in the generated header `nicbar/gm.h`.
//!
//! A GM program ports by changing its include line to `#include <nicbar/gm.h>` and its link line
//! to `$(pkg-config --cflags --libs nicbar)`: the names, argument orders and the event union are
//! GM 2's (`gm_open(&port, unit, port_id, name, GM_API_VERSION)`, `gm_send_with_callback`,
//! `gm_provide_receive_buffer_with_tag`, `gm_receive` returning a `gm_recv_event_t` whose
//! network-order fields are read with `gm_ntoh_*`, `gm_unknown` running send callbacks). The
//! NIC-based barrier adds the paper's `gm_provide_barrier_buffer` and
//! `gm_barrier_send_with_callback` (section 5.2) in its pairwise-exchange, gather-broadcast and
//! dissemination forms, and `nicbar_barrier`, a whole barrier over a group in one call.
//!
//! # Defences
//!
//! - Handles are opaque; a port handle that is NULL, closed, or never opened is refused (with an
//!   error status or an empty result) instead of used. Frees and closes take NULL.
//! - Every export runs under a panic boundary (`ffi::guard`): a panic becomes
//!   `GM_INTERNAL_ERROR` (or the function's empty result) and a message in
//!   `nicbar_last_error()`, never an unwind into C.
//! - Status codes are GM 2's numbers, fixed forever.
//! - Memory is checked: a send or a receive buffer must lie inside DMA memory of the port from
//!   `gm_dma_malloc`, and memory the NIC still holds is freed only when the NIC gives it back.
//! - Callbacks never run inside the call that caused them: completions wait for `gm_unknown`
//!   (the style guide's rule 4, and GM's own behaviour).
//!
//! # The header
//!
//! `host-lib/include/nicbar/gm.h` is generated from this crate by cbindgen
//! (`cargo xtask capi header`), checked in, and checked for drift
//! (`cargo xtask capi header --check`, also a test of the xtask crate). Doc comments here are the
//! header's comments, so they speak C.
//!
//! # Layers
//!
//! The crate stands on the Rust library's raw port ([`nicbar_rs::RawPort`]): it posts tokens
//! with contexts and tags of its own and gives the NIC's raw events their GM meaning. Each module
//! uses only those below it:
//!
//! - `types` (the C types and constants), `slab` (records named by slot and serial), `status`
//!   (status codes and the last error), `events` (building C events);
//! - `names`: the table of the fabric's host names, node ids and unique ids;
//! - `barrier`: barrier buffers and barriers posted, their ends, and the schedules of GM's forms;
//! - `state`: what a port holds — DMA memory, sends, receive buffers, one-sided operations, the
//!   fabric's names (asked of the daemon once) — and posting them;
//! - `rdma`: registered memory and one-sided operations (puts, gets, atomics) and their ends;
//! - `receive`: raw events into C events, settling the records they close;
//! - `group`: barriers started from C, and nicbar_barrier's wait;
//! - `ffi`: every `extern "C"` export, pointer checks, the handle registry and the panic
//!   boundary — the one module with `unsafe` code. Its `coll` exports (an MPI library's `coll`
//!   component: barriers queued for the NIC; broadcast, scatter, gather and all-to-all over
//!   messages) stand on the Rust library's `nicbar::coll` alone.
#![deny(unsafe_code)]
#![allow(
    non_camel_case_types,
    reason = "the C names of GM 2's types (gm_port, gm_recv_event_t, ...)"
)]

// The header lists items in this order (blank lines keep rustfmt from sorting them).
pub mod types;

pub mod ffi;

mod alarms;
mod barrier;
mod crc;
mod dma_heap;
mod events;
mod group;
mod names;
mod rdma;
mod receive;
mod sizes;
mod slab;
mod stall;
mod state;
mod status;
