//! nicbar-system: the whole system under test, as users run it.
//!
//! This crate holds no library code but the few helpers its benchmark programs and tests share
//! (scratch directories, free UDP ports, child processes with a time limit, medians, seeded
//! shuffles). Its tests
//! (`tests/`) run real processes on the `nicbar`
//! library over real NICs — the emulated daemon, in-process or as `nicctl emulate`, over the
//! in-process wire or UDP, and QEMU NICs booted from the firmware image — and its examples
//! (`examples/`) are the programs `cargo xtask demo` and `cargo xtask bench` drive. It stands
//! apart so that no library or backend needs another as a dev-dependency.

#![forbid(unsafe_code)]

use std::io::Read;
use std::net::UdpSocket;
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

use rand_core::RngCore;

/// What a benchmark's helpers fail with.
pub type Error = Box<dyn std::error::Error>;

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
pub fn wait_with_timeout(child: &mut Child, limit: Duration) -> Result<(), Error> {
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

/// Waits for a child whose standard output was piped, killing it past `limit`, and returns
/// everything it wrote there.
///
/// # Errors
/// The child's standard output was not piped, reading it failed, or the child failed or did not
/// finish within `limit`.
pub fn wait_output(mut child: Child, limit: Duration) -> Result<Vec<u8>, Error> {
    let mut stdout = child
        .stdout
        .take()
        .ok_or("the child's standard output was not piped")?;
    // Read while waiting: a child that fills the pipe would otherwise never finish.
    let reader = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        stdout.read_to_end(&mut bytes).map(|_| bytes)
    });
    wait_with_timeout(&mut child, limit)?;
    Ok(reader
        .join()
        .map_err(|_| "the thread reading the child's output panicked")??)
}

/// Kills and reaps every child (what a benchmark does when one of its processes failed).
pub fn stop_all(children: &mut [Child]) {
    for child in children {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A directory for this process's sockets and files, `nicbar-<name>-<process id>` under the
/// system's temporary directory, created if need be.
///
/// # Errors
/// The directory could not be created.
pub fn scratch_dir(name: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("nicbar-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A UDP port free on `ip` right now (another process may take it before it is used).
///
/// # Errors
/// No socket could be bound on `ip`.
pub fn free_udp_port(ip: &str) -> std::io::Result<u16> {
    Ok(UdpSocket::bind((ip, 0))?.local_addr()?.port())
}

/// The median of `values` (the upper one of an even count), sorting them; `None` if empty.
pub fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// The `q`-quantile (0 to 1) of `sorted` (ascending): the sample nearest rank `q * (len - 1)`;
/// NaN for no samples.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let Some(last) = sorted.len().checked_sub(1) else {
        return f64::NAN;
    };
    let index = (last as f64 * q.clamp(0.0, 1.0)).round() as usize;
    sorted[index.min(last)]
}

/// The mean of `values`; NaN for none.
pub fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

/// Shuffles `items` (Fisher-Yates) with draws from `rng`: a benchmark's order of measurements,
/// the same for the same seed.
pub fn shuffle<T>(items: &mut [T], rng: &mut impl RngCore) {
    for i in (1..items.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_value_and_none_of_nothing() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(3.0));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn quantiles_and_means_of_samples_and_of_none() {
        let sorted = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile(&sorted, 0.5), 3.0);
        assert_eq!(quantile(&sorted, 0.99), 5.0);
        assert_eq!(quantile(&sorted, 0.0), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
        assert_eq!(mean(&sorted), 3.0);
        assert!(mean(&[]).is_nan());
    }

    #[test]
    fn a_shuffle_is_a_permutation_fixed_by_the_seed() {
        use rand_core::SeedableRng;
        let shuffled = |seed| {
            let mut items: Vec<u32> = (0..20).collect();
            shuffle(
                &mut items,
                &mut rand_xoshiro::Xoshiro256StarStar::seed_from_u64(seed),
            );
            items
        };
        let mut sorted = shuffled(7);
        assert_eq!(shuffled(7), sorted);
        assert_ne!(shuffled(8), sorted);
        sorted.sort_unstable();
        assert_eq!(sorted, (0..20).collect::<Vec<_>>());
    }

    #[test]
    fn a_free_port_is_a_real_port() {
        assert_ne!(free_udp_port("127.0.0.1").unwrap(), 0);
    }
}
