//! nicbar-system: the whole system under test, as users run it.
//!
//! This crate holds no library code but the few helpers its benchmark programs share. Its tests
//! (`tests/`) run real processes on the `nicbar`
//! library over real NICs — the emulated daemon, in-process or as `nicctl emulate`, over the
//! in-process wire or UDP, and QEMU NICs booted from the firmware image — and its examples
//! (`examples/`) are the programs `cargo xtask demo` and `cargo xtask bench` drive. It stands
//! apart so that no library or backend needs another as a dev-dependency.

use std::process::Child;
use std::time::{Duration, Instant};

/// The cores this process may run on (what a benchmark reports beside its figures).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// The CPU's model name from `/proc/cpuinfo` (what a benchmark reports beside its figures).
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Waits for a benchmark's child process, killing it past `limit`.
///
/// # Errors
/// The child failed, or did not finish within `limit`.
pub fn wait_with_timeout(
    child: &mut Child,
    limit: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("a benchmark process failed: {status}").into())
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("a benchmark process did not finish within {limit:?}").into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
