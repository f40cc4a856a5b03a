//! `cargo xtask bench pingpong --curve`: a GM program's ping-pong curve beside raw UDP and the
//! Rust API. The C program `host-lib/capi/tests/c/gm_pingpong.c` (GM's calls only:
//! `GM_RECV_EVENT` handled, everything else to `gm_unknown`, exact receive buffers) runs from 0
//! bytes to `--most` (each power of two and 3 bytes either side) between two processes on two
//! NICs of one daemon, and on two daemons over UDP; in the same daemons, the `Port` ping-pong
//! (`bench_pingpong --sweep --nic`) at the same lengths; and with no NIC, a raw UDP ping-pong on
//! loopback (`bench_pingpong --sweep`). Each line of the table and the CSV is one series at one
//! length, the figure is latency and bandwidth against length. GM's figures are the C program's
//! means per length; the others are medians of the round trips at each length.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Csv, draw};
use crate::Result;
use crate::command::run;

/// The two setups the NIC curves run in: the GM series' name, the Rust series', and whether it
/// crosses UDP.
const SETUPS: [(&str, &str, bool); 2] = [
    (
        "GM C ping-pong, one daemon, in-process",
        "Rust Port ping-pong, one daemon, in-process",
        false,
    ),
    (
        "GM C ping-pong, two daemons over UDP",
        "Rust Port ping-pong, two daemons over UDP",
        true,
    ),
];

/// The raw UDP series' name.
const RAW_UDP: &str = "raw UDP ping-pong, loopback, no NIC";

/// What `cargo xtask bench pingpong --curve` runs: the GM C program, `nicctl`, and the
/// `bench_pingpong` example.
pub(crate) struct Programs {
    pub(crate) gm_pingpong: PathBuf,
    pub(crate) nicctl: PathBuf,
    pub(crate) bench_pingpong: PathBuf,
}

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

/// The (length, median round trip µs) lines of `bench_pingpong --sweep`'s output
/// (`sweep BYTES NANOSECONDS`).
fn parse_sweep(output: &str) -> Vec<(u64, f64)> {
    output
        .lines()
        .filter_map(|line| {
            let mut words = line.strip_prefix("sweep ")?.split(' ');
            let bytes = words.next()?.parse().ok()?;
            let nanoseconds: f64 = words.next()?.parse().ok()?;
            words.next().is_none().then_some((bytes, nanoseconds / 1e3))
        })
        .collect()
}

/// Runs `bench_pingpong --sweep` with `nic` (`--nic`'s six fields), or raw UDP without; its
/// lines.
fn rust_sweep(
    program: &Path,
    iterations: u32,
    most: usize,
    nic: Option<String>,
) -> Result<Vec<(u64, f64)>> {
    let mut command = Command::new(program);
    command
        .arg("--sweep")
        .arg(most.to_string())
        .arg("--round-trips")
        .arg(iterations.to_string());
    if let Some(fields) = nic {
        command.arg("--nic").arg(fields);
    }
    let output = command.stderr(Stdio::inherit()).output()?;
    if !output.status.success() {
        return Err(format!("bench_pingpong --sweep failed ({})", output.status).into());
    }
    let lines = parse_sweep(&String::from_utf8_lossy(&output.stdout));
    if lines.is_empty() {
        return Err("bench_pingpong --sweep reported no length".into());
    }
    Ok(lines)
}

/// One length of a series: a line of the table, and of `csv`.
fn record(csv: &mut String, name: &str, bytes: u64, round_trip: f64) {
    // Bytes both ways over the round trip.
    let mb_s = 2.0 * bytes as f64 / round_trip;
    println!(
        "| {name} | {bytes} | {round_trip:.2} | {:.2} | {mb_s:.3} |",
        round_trip / 2.0
    );
    // Latency is one way; a 0-byte message has no bandwidth (and no place on a log axis), so
    // its row holds the latency alone.
    let bandwidth = if bytes == 0 {
        String::new()
    } else {
        format!("{mb_s}")
    };
    csv.push_str(&format!(
        "{name},{bytes},{},{bandwidth}\n",
        round_trip / 2.0
    ));
}

/// Measures the curve into `out/bench-pingpong-curve.csv` (unless `plot_only`) and draws it.
pub(crate) fn run_curve(
    out: &Path,
    programs: impl FnOnce() -> Result<Programs>,
    iterations: u32,
    most: usize,
    plot_only: bool,
) -> Result<()> {
    let csv = out.join("bench-pingpong-curve.csv");
    if !plot_only {
        std::fs::create_dir_all(out)?;
        let Programs {
            gm_pingpong: program,
            nicctl,
            bench_pingpong,
        } = programs()?;
        let scratch = std::env::temp_dir().join(format!("nicbar-gm-curve-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)?;
        let mut text = String::from("series,bytes,latency_us,bandwidth_mb_s\n");
        println!(
            "GM: the C program's mean per length; the others: medians of the round trips\n\n\
             | setup | bytes | round trip µs | one way µs | MB/s |\n|---|---|---|---|---|"
        );
        for (bytes, round_trip) in rust_sweep(&bench_pingpong, iterations, most, None)? {
            record(&mut text, RAW_UDP, bytes, round_trip);
        }
        for (name, rust_name, udp) in SETUPS {
            let (output, rust) = if udp {
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
                let fields = format!("{},0,0,{},0,1", sockets[0].display(), sockets[1].display());
                let rust = rust_sweep(&bench_pingpong, iterations, most, Some(fields))?;
                drop(daemons);
                (output, rust)
            } else {
                let socket = scratch.join("one.sock");
                let _daemon = emulate(&nicctl, &socket, &["--units".into(), "2".into()])?;
                let output = ping_pong(
                    &program,
                    [&socket, &socket],
                    [0, 1],
                    [0, 1],
                    iterations,
                    most,
                )?;
                let fields = format!("{0},0,0,{0},1,1", socket.display());
                let rust = rust_sweep(&bench_pingpong, iterations, most, Some(fields))?;
                (output, rust)
            };
            // The program's round trips, to more places than its MB/s.
            for (bytes, round_trip, _) in parse(&output) {
                record(&mut text, name, bytes, round_trip);
            }
            for (bytes, round_trip) in rust {
                record(&mut text, rust_name, bytes, round_trip);
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
        "GM mean, others median,",
    )?;
    figure.title =
        "Ping-pong through the emulated NIC: a GM program, the Rust API, and raw UDP".into();
    Ok(figure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweeps_lines_parse_and_others_are_passed_over() {
        let output = "sweep 0 20000\n\
                      sweep 1048579 3365256\n\
                      sweep 8\n\
                      sweep 8 12 13\n\
                      machine: 2 cores\n";
        assert_eq!(parse_sweep(output), vec![(0, 20.0), (1_048_579, 3365.256)]);
    }

    #[test]
    fn a_curve_of_every_series_draws() {
        let mut csv = String::from("series,bytes,latency_us,bandwidth_mb_s\n");
        for name in [RAW_UDP, SETUPS[0].0, SETUPS[0].1, SETUPS[1].0, SETUPS[1].1] {
            record(&mut csv, name, 0, 20.0);
            record(&mut csv, name, 1024, 40.0);
            record(&mut csv, name, 1 << 20, 8000.0);
        }
        assert!(csv.contains(&format!("{RAW_UDP},1024,20,51.2\n")));
        assert!(csv.contains(&format!("{RAW_UDP},0,10,\n")));
        let figure = curve_figure(&Csv::parse(&csv).unwrap()).unwrap();
        let svg = std::env::temp_dir().join(format!("nicbar-curve-{}.svg", std::process::id()));
        figure.write_svg(&svg).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        let _ = std::fs::remove_file(&svg);
        for name in [RAW_UDP, SETUPS[0].1, SETUPS[1].1] {
            assert!(drawn.contains(name), "{name} is not in the figure");
        }
    }

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
