//! `cargo xtask bench pingpong --curve`: a GM program's ping-pong curve. The C program
//! `host-lib/capi/tests/c/gm_pingpong.c` (GM's calls only: `GM_RECV_EVENT` handled, everything
//! else to `gm_unknown`, exact receive buffers) runs from 0 bytes to `--most` (each power of two
//! and 3 bytes either side) between two processes on two NICs of one daemon, and on two daemons
//! over UDP; each line of the table and the CSV is one length, the figure is latency and
//! bandwidth against length.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Csv, draw};
use crate::Result;
use crate::command::run;

/// The two setups the curve runs in: its series name, and whether it crosses UDP.
const SETUPS: [(&str, bool); 2] = [
    ("GM C ping-pong, one daemon, in-process", false),
    ("GM C ping-pong, two daemons over UDP", true),
];

/// A daemon, stopped when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nicctl emulate` on `socket` with `arguments`, and waits (30 s at most) until it
/// listens.
fn emulate(nicctl: &Path, socket: &Path, arguments: &[String]) -> Result<Daemon> {
    let child = Command::new(nicctl)
        .arg("emulate")
        .arg("--socket")
        .arg(socket)
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut daemon = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !socket.exists() {
        if let Some(status) = daemon.0.try_wait()? {
            return Err(format!("nicctl emulate exited ({status}) before it listened").into());
        }
        if Instant::now() > deadline {
            return Err(format!("nicctl emulate did not listen on {}", socket.display()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(daemon)
}

/// A free UDP port on loopback.
fn free_udp_port() -> Result<u16> {
    Ok(std::net::UdpSocket::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs the ping-pong pair; the initiator's output.
fn ping_pong(
    program: &Path,
    sockets: [&Path; 2],
    nodes: [u16; 2],
    units: [u16; 2],
    iterations: u32,
    most: usize,
) -> Result<String> {
    let side = |role: u16, me: usize, peer: usize| {
        let mut command = Command::new(program);
        command
            .env("NICBAR_SOCKET", sockets[me])
            .args([role, units[me], 2, nodes[peer], 2].map(|v| v.to_string()))
            .arg(iterations.to_string())
            .arg("--sweep")
            .arg(most.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        command
    };
    let responder = side(1, 1, 0).spawn()?;
    let initiator = side(0, 0, 1).spawn()?;
    let initiator = initiator.wait_with_output()?;
    let responder = responder.wait_with_output()?;
    if !initiator.status.success() || !responder.status.success() {
        return Err(format!(
            "the ping-pong failed ({}, {}):\n{}",
            initiator.status,
            responder.status,
            String::from_utf8_lossy(&initiator.stdout)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&initiator.stdout).into_owned())
}

/// The (length, round trip µs, MB/s) lines of an initiator's output.
fn parse(output: &str) -> Vec<(u64, f64, f64)> {
    output
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("length ")?;
            let (length, rest) = rest.split_once(':')?;
            let round_trip = rest.split("mean ").nth(1)?.split(' ').next()?;
            let bandwidth = rest.rsplit(", ").next()?.strip_suffix(" MB/s")?;
            Some((
                length.parse().ok()?,
                round_trip.parse().ok()?,
                bandwidth.parse().ok()?,
            ))
        })
        .collect()
}

/// Measures the curve into `out/bench-pingpong-curve.csv` (unless `plot_only`) and draws it.
pub(crate) fn run_curve(
    out: &Path,
    program_and_nicctl: impl FnOnce() -> Result<(PathBuf, PathBuf)>,
    iterations: u32,
    most: usize,
    plot_only: bool,
) -> Result<()> {
    let csv = out.join("bench-pingpong-curve.csv");
    if !plot_only {
        std::fs::create_dir_all(out)?;
        let (program, nicctl) = program_and_nicctl()?;
        let scratch = std::env::temp_dir().join(format!("nicbar-gm-curve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)?;
        let mut text = String::from("series,bytes,latency_us,bandwidth_mb_s\n");
        println!("| setup | bytes | round trip µs | one way µs | MB/s |\n|---|---|---|---|---|");
        for (name, udp) in SETUPS {
            let output = if udp {
                let map = scratch.join("fabric.map");
                std::fs::write(
                    &map,
                    format!(
                        "node 0 127.0.0.1:{}\nnode 1 127.0.0.1:{}\n",
                        free_udp_port()?,
                        free_udp_port()?
                    ),
                )?;
                let key = scratch.join("fabric.key");
                run(Command::new(&nicctl).arg("keygen").arg(&key))?;
                let sockets = [scratch.join("a.sock"), scratch.join("b.sock")];
                let daemons = (0..2)
                    .map(|node| {
                        emulate(
                            &nicctl,
                            &sockets[node],
                            &[
                                "--fabric".into(),
                                map.display().to_string(),
                                "--fabric-key".into(),
                                key.display().to_string(),
                                "--node".into(),
                                node.to_string(),
                            ],
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                let output = ping_pong(
                    &program,
                    [&sockets[0], &sockets[1]],
                    [0, 1],
                    [0, 0],
                    iterations,
                    most,
                )?;
                drop(daemons);
                output
            } else {
                let socket = scratch.join("one.sock");
                let _daemon = emulate(&nicctl, &socket, &["--units".into(), "2".into()])?;
                ping_pong(
                    &program,
                    [&socket, &socket],
                    [0, 1],
                    [0, 1],
                    iterations,
                    most,
                )?
            };
            for (bytes, round_trip, _) in parse(&output) {
                // Bytes both ways over the round trip (the program's figure, to more places).
                let mb_s = 2.0 * bytes as f64 / round_trip;
                println!(
                    "| {name} | {bytes} | {round_trip:.2} | {:.2} | {mb_s:.3} |",
                    round_trip / 2.0
                );
                // Latency is one way; a 0-byte message has no bandwidth (and no place on a
                // log axis), so its row holds the latency alone.
                let bandwidth = if bytes == 0 {
                    String::new()
                } else {
                    format!("{mb_s}")
                };
                text.push_str(&format!(
                    "{name},{bytes},{},{bandwidth}\n",
                    round_trip / 2.0
                ));
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::write(&csv, text)?;
        println!("wrote {}", csv.display());
    }
    draw(&csv, &out.join("bench-pingpong-curve.svg"), curve_figure)
}

/// The curve's figure: one-way latency and bandwidth against message length, log-log.
fn curve_figure(csv: &Csv) -> Result<crate::plot::Figure> {
    let mut figure = super::size_figure(
        csv,
        "message length (bytes)",
        "(a) one-way latency (half a round trip)",
        "(b) bandwidth (both directions)",
        "mean",
    )?;
    figure.title = "A GM program's ping-pong through the emulated NIC".into();
    Ok(figure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initiators_lines_parse() {
        let output = "length 0: 20 round trips, mean 12.50 us round trip, 0.00 MB/s\n\
                      length 1048576: 20 round trips, mean 9000.00 us round trip, 233.02 MB/s\n\
                      gm_pingpong 0: done\n";
        assert_eq!(
            parse(output),
            vec![(0, 12.5, 0.0), (1_048_576, 9000.0, 233.02)]
        );
    }
}
