//! The C API: GM 2's calls over nicbar ports, declared in the generated header `nicbar/gm.h`.
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
//! - Every export runs under a panic boundary ([`status::guard`]): a panic becomes
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
//! `host-lib/include/nicbar/gm.h` is generated from this module by cbindgen
//! (`cargo xtask capi header`), checked in, and checked for drift
//! (`cargo xtask capi header --check`, also a test of the xtask crate). Doc comments here are the
//! header's comments, so they speak C.
#![allow(
    unsafe_code,
    reason = "the FFI edge: raw pointers from C, exported symbols, callbacks into C"
)]
#![allow(
    non_camel_case_types,
    reason = "the C names of GM 2's types (gm_port, gm_recv_event_t, ...)"
)]

// The header lists items in this order (blank lines keep rustfmt from sorting them).
pub mod types;

pub mod port;

pub mod barrier;

pub mod bytes;

pub mod status;

pub mod coll;

#[cfg(test)]
mod tests {
    /// The module's sources, by file name.
    const SOURCES: [(&str, &str); 5] = [
        ("types.rs", include_str!("types.rs")),
        ("port.rs", include_str!("port.rs")),
        ("barrier.rs", include_str!("barrier.rs")),
        ("bytes.rs", include_str!("bytes.rs")),
        ("status.rs", include_str!("status.rs")),
    ];

    /// Every exported function's body is the panic boundary: after any `const` items and
    /// comments, its first statement is a call of `guard`.
    #[test]
    fn every_export_runs_under_the_panic_boundary() {
        let mut exports = 0;
        for (file, source) in SOURCES {
            for (index, _) in source.match_indices("#[unsafe(no_mangle)]") {
                let item = &source[index..];
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
                    first.starts_with("guard("),
                    "{file}: {name} does not start with guard(...): `{first}`"
                );
                exports += 1;
            }
        }
        assert!(
            exports >= 55,
            "found only {exports} exports: the scan is broken"
        );
    }
}
