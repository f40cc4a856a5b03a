//! nicbar-system: the whole system under test, as users run it.
//!
//! This crate holds no library code but the few helpers its benchmark programs and tests share
//! (scratch directories, free UDP ports, child processes with a time limit, medians, seeded
//! shuffles, a ping-pong curve's lengths, messages split into UDP datagrams). Its tests
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

/// The lengths of a ping-pong curve up to `most`, ascending and each once: 0, then each power of
/// two to `most` and 3 bytes either side (as `gm_pingpong --sweep` runs them).
pub fn curve_lengths(most: usize) -> Vec<usize> {
    let mut lengths = vec![0];
    let mut power = 1usize;
    while power <= most {
        lengths.extend(
            [
                power.checked_sub(3).filter(|_| power > 3),
                Some(power),
                power.checked_add(3),
            ]
            .into_iter()
            .flatten(),
        );
        let Some(next) = power.checked_mul(2) else {
            break;
        };
        power = next;
    }
    lengths.sort_unstable();
    lengths.dedup();
    lengths
}

/// The most data one UDP datagram over IPv4 carries: 64 KiB less the IP and UDP headers.
pub const DATAGRAM_MOST: usize = 65_535 - 20 - 8;

/// The bytes before a message's part in each of its datagrams: the message's number,
/// little-endian.
pub const MESSAGE_HEADER: usize = 4;

/// Sends `message` on the connected `socket` as message `number`: in datagrams of at most
/// [`DATAGRAM_MOST`] bytes, each the number and the next part, copied out of `message` into
/// `datagram` (at least [`DATAGRAM_MOST`] bytes); an empty message is one datagram of the number
/// alone. The receiver counts the bytes back together ([`receive_message`]).
///
/// # Errors
/// `datagram` is shorter than [`DATAGRAM_MOST`], or a send failed.
pub fn send_message(
    socket: &UdpSocket,
    number: u32,
    message: &[u8],
    datagram: &mut [u8],
) -> std::io::Result<()> {
    let have = datagram.len();
    let datagram = datagram.get_mut(..DATAGRAM_MOST).ok_or_else(|| {
        std::io::Error::other(format!("a datagram buffer of {} bytes is too short", have))
    })?;
    datagram[..MESSAGE_HEADER].copy_from_slice(&number.to_le_bytes());
    let mut parts = message.chunks(DATAGRAM_MOST - MESSAGE_HEADER);
    let mut part = parts.next().unwrap_or(&[]);
    loop {
        datagram[MESSAGE_HEADER..MESSAGE_HEADER + part.len()].copy_from_slice(part);
        socket.send(&datagram[..MESSAGE_HEADER + part.len()])?;
        match parts.next() {
            Some(next) => part = next,
            None => return Ok(()),
        }
    }
}

/// Asks for `bytes` of receive buffer on `socket`: the kernel caps it at `net.core.rmem_max`,
/// and what it grants is what a UDP reference gets.
pub fn set_receive_buffer(socket: &UdpSocket, bytes: usize) {
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = setsockopt(socket, sockopt::RcvBuf, &bytes);
}

/// Receives message `number` into the whole of `message` on the connected `socket`: datagrams
/// are taken (into `datagram`, at least [`DATAGRAM_MOST`] bytes) and their parts copied in order
/// until `message.len()` bytes of that number have come; a datagram of another number (a late
/// one of an earlier message) is passed over. Loopback keeps datagrams in order, and a lost one
/// shows as the socket's read timeout.
///
/// # Errors
/// A receive failed or timed out, or a part runs past the message's end.
pub fn receive_message(
    socket: &UdpSocket,
    number: u32,
    message: &mut [u8],
    datagram: &mut [u8],
) -> std::io::Result<()> {
    let mut arrived = 0;
    loop {
        let len = socket.recv(datagram)?;
        let Some((header, part)) = datagram[..len].split_first_chunk::<MESSAGE_HEADER>() else {
            continue;
        };
        if u32::from_le_bytes(*header) != number {
            continue;
        }
        let end = arrived + part.len();
        let length = message.len();
        message
            .get_mut(arrived..end)
            .ok_or_else(|| {
                std::io::Error::other(format!(
                    "message {number} of {length} bytes: a part runs to byte {end}"
                ))
            })?
            .copy_from_slice(part);
        arrived = end;
        if arrived == message.len() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_curve_runs_each_power_of_two_and_three_either_side_once() {
        assert_eq!(curve_lengths(16), [0, 1, 2, 4, 5, 7, 8, 11, 13, 16, 19]);
        assert_eq!(curve_lengths(0), [0]);
        let long = curve_lengths(1 << 20);
        assert_eq!(long.last(), Some(&((1 << 20) + 3)));
        assert!(long.contains(&((1 << 20) - 3)));
        assert!(long.windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn a_message_longer_than_a_datagram_comes_back_whole() {
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.connect(receiver.local_addr().unwrap()).unwrap();
        receiver.connect(sender.local_addr().unwrap()).unwrap();
        receiver
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut datagram = vec![0u8; DATAGRAM_MOST];
        let mut into = vec![0u8; DATAGRAM_MOST];
        // A stale datagram of another number first: passed over.
        send_message(&sender, 6, &[9; 10], &mut datagram).unwrap();
        // Three datagrams, the last one short.
        let message: Vec<u8> = (0..2 * (DATAGRAM_MOST - MESSAGE_HEADER) + 7)
            .map(|i| (i % 251) as u8)
            .collect();
        send_message(&sender, 7, &message, &mut datagram).unwrap();
        let mut whole = vec![0u8; message.len()];
        receive_message(&receiver, 7, &mut whole, &mut into).unwrap();
        assert_eq!(whole, message);
        // An empty message is one datagram.
        send_message(&sender, 8, &[], &mut datagram).unwrap();
        receive_message(&receiver, 8, &mut [], &mut into).unwrap();
        // A message longer than the receiver expects is refused, not written past its end.
        send_message(&sender, 9, &[1; 20], &mut datagram).unwrap();
        assert!(receive_message(&receiver, 9, &mut [0; 10], &mut into).is_err());
    }

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
