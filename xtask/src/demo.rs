//! `cargo xtask demo`: the quick start. Builds `nicctl` and the `cluster` example, starts an
//! emulated cluster (`nicctl emulate`, one NIC per process) in a temporary directory, runs one
//! process of the example per NIC — a ping-pong between ranks 0 and 1, then NIC-based and
//! host-based barriers of three algorithms — prints what rank 0 measured, and stops the cluster.
//!
//! Nothing outlives the demo: on success and on failure the processes and the daemon are stopped
//! and the directory removed. On Ctrl-C the terminal's interrupt reaches the daemon and the
//! processes too (they run in the demo's process group); the daemon then stops by itself, and the
//! directory an interrupted run leaves is removed by the next run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;

use crate::command::{cargo, run, threads_cpu_ns};
use crate::engine::Engine;
use crate::{Result, target_dir, workspace_root};

/// How long the daemon may take to listen on its socket.
const DAEMON_START: Duration = Duration::from_secs(30);
/// Prefix of the demo's temporary directories (followed by the demo's process id).
const DIR_PREFIX: &str = "nicbar-demo-";

/// Options of `cargo xtask demo`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Processes in the cluster, one NIC each.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(2..=32))]
    nodes: u16,
    /// Barriers timed per algorithm, in the NIC and on the host.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u32).range(1..))]
    barriers: u32,
    /// Ping-pong round trips between ranks 0 and 1.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..))]
    round_trips: u32,
    /// The daemon's NIC threads, idle policy and niceness.
    #[command(flatten)]
    engine: Engine,
}

/// Runs the demo.
pub(crate) fn run_demo(args: Args) -> Result<()> {
    let nodes = args.nodes;
    step("building nicctl and the cluster example (profile bench-fast)");
    run(cargo().current_dir(workspace_root()).args([
        "build",
        "--profile",
        "bench-fast",
        "-p",
        "host-driver",
        "--bin",
        "nicctl",
        "-p",
        "nicbar-system",
        "--example",
        "cluster",
    ]))?;
    let built = target_dir().join("bench-fast");
    let nicctl = built.join("nicctl");
    let cluster = built.join("examples").join("cluster");

    let dir = DemoDir::create()?;
    let socket = dir.path.join("control.sock");
    let on_cpus = args
        .engine
        .process_cpus()?
        .map_or_else(String::new, |cpus| format!(" on CPUs {cpus}"));
    let engine = args.engine.daemon_args();
    step(&format!(
        "starting a {nodes}-node emulated cluster: nicctl emulate --units {nodes} --socket {}{}",
        socket.display(),
        engine
            .iter()
            .map(|arg| format!(" {arg}"))
            .collect::<String>()
    ));
    let mut daemon = Daemon::start(&nicctl, nodes, &socket, &engine)?;
    step(&format!(
        "cluster up; running {nodes} processes of the cluster example{on_cpus}: a ping-pong, then \
         {} barriers per algorithm in the NIC and on the host",
        args.barriers
    ));
    let started = Instant::now();
    let daemon_cpu_before = daemon.cpu_ns();
    let mut ranks = Ranks::default();
    for rank in 0..nodes {
        let mut command = Command::new(&cluster);
        command
            .arg("--rank")
            .arg(rank.to_string())
            .arg("--nodes")
            .arg(nodes.to_string())
            .arg("--socket")
            .arg(&socket)
            .arg("--barriers")
            .arg(args.barriers.to_string())
            .arg("--round-trips")
            .arg(args.round_trips.to_string());
        let mut command = args.engine.confine(command)?;
        command
            .stdin(Stdio::null())
            // Rank 0 prints the results; the others speak only to report an error.
            .stdout(if rank == 0 {
                Stdio::inherit()
            } else {
                Stdio::null()
            });
        let child = command
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", cluster.display()))?;
        ranks.0.push(child);
    }
    // Generous: the example's own barrier timeouts fail a stalled cluster long before this.
    let allowed = Duration::from_secs(120) + Duration::from_micros(u64::from(args.barriers) * 2000);
    ranks.wait_all(allowed, &mut daemon)?;
    step(&format!(
        "the processes finished in {:.1} s; the NIC daemon used {:.0} ms of CPU meanwhile; \
         stopping the cluster",
        started.elapsed().as_secs_f64(),
        daemon.cpu_ns().saturating_sub(daemon_cpu_before) as f64 / 1e6
    ));
    daemon.stop()?;
    drop(dir);
    step("done");
    Ok(())
}

fn step(what: &str) {
    println!("demo: {what}");
}

/// The demo's temporary directory (the daemon's socket lives in it); removed when dropped.
struct DemoDir {
    path: PathBuf,
}

impl DemoDir {
    /// Creates the directory, after removing those of earlier runs whose process is gone.
    fn create() -> Result<Self> {
        let temp = std::env::temp_dir();
        if let Ok(entries) = std::fs::read_dir(&temp) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|name| name.strip_prefix(DIR_PREFIX))
                    .and_then(|pid| pid.parse::<u32>().ok())
                else {
                    continue;
                };
                if !Path::new("/proc").join(pid.to_string()).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let path = temp.join(format!("{DIR_PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&path)
            .map_err(|error| format!("cannot create {}: {error}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for DemoDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The running `nicctl emulate`; killed when dropped.
struct Daemon {
    child: Child,
    /// The daemon's output lines, read by a thread (so its pipe never fills).
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Daemon {
    /// CPU time all of the daemon's threads have used, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        threads_cpu_ns(self.child.id(), "")
    }

    /// Starts the daemon with the `engine` arguments and waits, at most [`DAEMON_START`], until
    /// it listens on `socket`.
    fn start(nicctl: &Path, nodes: u16, socket: &Path, engine: &[String]) -> Result<Self> {
        let mut child = Command::new(nicctl)
            .arg("emulate")
            .arg("--units")
            .arg(nodes.to_string())
            .arg("--socket")
            .arg(socket)
            .args(engine)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", nicctl.display()))?;
        let stdout = child.stdout.take().ok_or("the daemon has no stdout")?;
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|line| line.ok()) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut daemon = Self {
            child,
            lines,
            seen: Vec::new(),
        };
        let deadline = Instant::now() + DAEMON_START;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match daemon.lines.recv_timeout(left) {
                Ok(line) => {
                    let listening = line.starts_with("nicctl emulate: listening on");
                    daemon.seen.push(line);
                    if listening && socket.exists() {
                        return Ok(daemon);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!(
                        "the daemon did not listen on {} within {DAEMON_START:?}; it said:\n{}",
                        socket.display(),
                        daemon.seen.join("\n")
                    )
                    .into());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = daemon.child.wait()?;
                    return Err(format!(
                        "the daemon exited ({status}) before it listened; it said:\n{}",
                        daemon.seen.join("\n")
                    )
                    .into());
                }
            }
        }
    }

    /// Whether the daemon has exited, and how.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Stops the daemon and waits for it.
    fn stop(mut self) -> Result<()> {
        if let Some(status) = self.exited() {
            return Err(format!("the daemon had already exited ({status})").into());
        }
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The example's processes, by rank; those still running are killed when dropped.
#[derive(Default)]
struct Ranks(Vec<Child>);

impl Ranks {
    /// Waits until every rank has exited successfully; fails at the first that did not, when the
    /// daemon dies, or after `allowed`.
    fn wait_all(&mut self, allowed: Duration, daemon: &mut Daemon) -> Result<()> {
        let deadline = Instant::now() + allowed;
        let mut running: Vec<usize> = (0..self.0.len()).collect();
        while !running.is_empty() {
            let mut still = Vec::new();
            for rank in running {
                match self.0[rank].try_wait()? {
                    Some(status) if status.success() => {}
                    Some(status) => {
                        return Err(format!("rank {rank} of the cluster failed ({status})").into());
                    }
                    None => still.push(rank),
                }
            }
            running = still;
            if let Some(status) = daemon.exited() {
                return Err(format!("the daemon exited ({status}) under the cluster").into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "ranks {running:?} did not finish within {allowed:?}; stopping them"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
