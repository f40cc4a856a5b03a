//! nicbar-system: the whole system under test, as users run it.
//!
//! This crate holds no library code. Its tests (`tests/`) run real processes on the `nicbar`
//! library over real NICs — the emulated daemon, in-process or as `nicctl emulate`, over the
//! in-process wire or UDP, and QEMU NICs booted from the firmware image — and its examples
//! (`examples/`) are the programs `cargo xtask demo` and `cargo xtask bench` drive. It stands
//! apart so that no library or backend needs another as a dev-dependency.
