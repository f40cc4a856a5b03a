//! `nicctl emulate` and `nicctl status`: run the emulated NICs as a daemon, and show what a
//! running daemon is doing.

use std::fmt::Write as _;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use shared_abi::ids::NodeId;

use super::protocol::{self, Reply, Request, StatusReport};
use super::{Emulator, EmulatorConfig, FabricMap, FaultConfig};

/// What a subcommand returns; `nicctl` prints the error and exits with status 1.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// Arguments of `nicctl emulate`.
#[derive(clap::Args, Debug)]
pub struct EmulateArgs {
    /// The control socket [default: $NICBAR_SOCKET, else $XDG_RUNTIME_DIR/nicbar/control.sock,
    /// else /tmp/nicbar-<uid>/control.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// How many NICs to run, with node ids from --first-node on (ignored with --node).
    #[arg(long, default_value_t = 1)]
    pub units: u16,
    /// The node id of unit 0 when the units are given by --units.
    #[arg(long, default_value_t = 0)]
    pub first_node: u16,
    /// The node ids of this daemon's NICs, in unit order (repeat or separate with commas).
    /// With --fabric, each must be on the map; the NIC binds its address.
    #[arg(long = "node", value_delimiter = ',')]
    pub nodes: Vec<u16>,
    /// The fabric map: lines `node <id> <ip>:<port>`, `#` comments. Nodes on it that this
    /// daemon does not run are reached over UDP.
    #[arg(long)]
    pub fabric: Option<PathBuf>,
    /// Fault injector: probability that a packet is lost.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Fault injector: probability that a packet is delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Fault injector: probability that a packet is held back (and overtaken).
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Fault injector: longest hold-back of a reordered packet, in microseconds.
    #[arg(long, default_value_t = 1000)]
    pub reorder_window_us: u64,
    /// Fault injector: delay of every packet, in microseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_us: u64,
    /// Fault injector seed [default: drawn from the clock, and printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Firmware: first retransmission timeout, in microseconds.
    #[arg(long)]
    pub retransmit_us: Option<u64>,
    /// How long a NIC stays awake after its last work before it sleeps, in microseconds
    /// (processes posting within it ring no doorbell; 0 sleeps at once).
    #[arg(long, default_value_t = super::DEFAULT_IDLE_LINGER.as_micros() as u64)]
    pub linger_us: u64,
    /// Firmware: give up on a silent node after this many milliseconds.
    #[arg(long)]
    pub give_up_ms: Option<u64>,
}

/// Arguments of `nicctl status`.
#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The daemon's control socket [default: as for `nicctl emulate`].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print the report as JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

impl EmulateArgs {
    /// The emulator configuration these arguments describe.
    ///
    /// # Errors
    /// A message for a fabric map that does not read, or arguments that contradict each other.
    pub fn config(&self) -> Result<EmulatorConfig, Box<dyn std::error::Error>> {
        let socket = self.socket.clone().unwrap_or_else(super::socket_path);
        let nodes: Vec<NodeId> = if self.nodes.is_empty() {
            if self.fabric.is_some() {
                return Err("with --fabric, name this daemon's nodes with --node".into());
            }
            (0..self.units)
                .map(|i| {
                    self.first_node
                        .checked_add(i)
                        .map(NodeId::new)
                        .ok_or("--first-node + --units exceeds node id 65535")
                })
                .collect::<Result<_, _>>()?
        } else {
            self.nodes.iter().copied().map(NodeId::new).collect()
        };
        let mut config = match self.fabric.as_ref() {
            Some(path) => EmulatorConfig::on_fabric(socket, FabricMap::read(path)?, &nodes)?,
            None => {
                let mut config = EmulatorConfig::in_process(socket, 0);
                config.units = nodes
                    .iter()
                    .map(|&node| super::UnitConfig {
                        node,
                        address: None,
                    })
                    .collect();
                config
            }
        };
        let faults = FaultConfig {
            seed: self.seed.unwrap_or_else(clock_seed),
            loss: self.loss,
            duplicate: self.duplicate,
            reorder: self.reorder,
            reorder_window: Duration::from_micros(self.reorder_window_us),
            delay: Duration::from_micros(self.delay_us),
        };
        faults.validate()?;
        config.faults = faults.is_active().then_some(faults);
        if let Some(us) = self.retransmit_us {
            config.nic.retransmit_timeout = Duration::from_micros(us);
        }
        config.idle_linger = Duration::from_micros(self.linger_us);
        if let Some(ms) = self.give_up_ms {
            config.nic.give_up_after = Duration::from_millis(ms);
        }
        Ok(config)
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

/// Runs `nicctl emulate`: starts the NICs and serves until SIGINT or SIGTERM.
///
/// Prints one line per unit, the fault injector's seed if it is on, and last
/// `nicctl emulate: listening on <socket>` once processes can connect.
///
/// # Errors
/// The emulator did not start.
pub fn run_emulate(args: EmulateArgs) -> CliResult {
    let config = args.config()?;
    // Block the stop signals before any thread starts, so every thread inherits the mask and
    // the signal waits for `sigwait` below instead of killing the process mid-write.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block()?;
    if let Some(faults) = config.faults.as_ref() {
        println!("nicctl emulate: fault injector: {faults}");
    }
    for (unit, unit_config) in config.units.iter().enumerate() {
        let address = unit_config
            .address
            .map_or_else(|| "in-process only".to_owned(), |a| format!("udp {a}"));
        println!(
            "nicctl emulate: unit {unit}: node {} ({address})",
            unit_config.node.get()
        );
    }
    let handle = Emulator::spawn(config)?;
    println!("nicctl emulate: listening on {}", handle.socket().display());
    let signal = signals.wait()?;
    println!("nicctl emulate: {signal}: stopping");
    handle.stop();
    Ok(())
}

/// Runs `nicctl status`.
///
/// # Errors
/// No daemon answers on the socket, or it sent something unexpected.
pub fn run_status(args: StatusArgs) -> CliResult {
    let socket = args.socket.unwrap_or_else(super::socket_path);
    let report = query_status(&socket)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", format_status(&report));
    }
    Ok(())
}

/// Asks the daemon on `socket` for its status.
///
/// # Errors
/// No daemon answers, or the answer is not a status report.
pub fn query_status(socket: &std::path::Path) -> Result<StatusReport, Box<dyn std::error::Error>> {
    let stream = UnixStream::connect(socket)
        .map_err(|error| format!("no daemon answers on {}: {error}", socket.display()))?;
    match protocol::call(&stream, &Request::Status, Duration::from_secs(10))?.0 {
        Reply::Status(report) => Ok(report),
        Reply::Error(error) => Err(error.into()),
        other => Err(format!("the daemon answered a status request with {other:?}").into()),
    }
}

/// The report as tables: units, open ports, connections.
pub fn format_status(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = write!(out, "daemon pid {}", report.daemon_pid);
    match report.fault_seed {
        Some(seed) => {
            let _ = writeln!(out, ", fault injector on (seed {seed})");
        }
        None => out.push('\n'),
    }
    let mut units = vec![row(&[
        "UNIT", "NODE", "ADDRESS", "PORTS", "TX", "RX", "LOST", "DUPED", "DELAYED", "UNDELIV",
    ])];
    for unit in &report.units {
        units.push(vec![
            unit.unit.to_string(),
            unit.node.to_string(),
            unit.address.clone().unwrap_or_else(|| "-".to_owned()),
            unit.ports.len().to_string(),
            unit.wire.transmitted.to_string(),
            unit.wire.received.to_string(),
            unit.wire.lost.to_string(),
            unit.wire.duplicated.to_string(),
            unit.wire.delayed.to_string(),
            unit.wire.undeliverable.to_string(),
        ]);
    }
    out.push_str(&table(&units));
    let mut ports = vec![row(&[
        "UNIT",
        "PORT",
        "GEN",
        "OWNER",
        "SENDS",
        "RECV-BUFS",
        "EVENTS",
        "STATE",
    ])];
    for unit in &report.units {
        for port in &unit.ports {
            ports.push(vec![
                unit.unit.to_string(),
                port.port.to_string(),
                port.generation.to_string(),
                port.owner_pid
                    .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                port.held_sends.to_string(),
                port.receive_buffers.to_string(),
                port.pending_events.to_string(),
                match (port.faulted, port.barrier) {
                    (Some(status), _) => format!("faulted (status {status})"),
                    (None, Some(barrier)) => format!(
                        "{}barrier step {}/{}, {} node {} port {} (round {})",
                        if port.closing { "closing, " } else { "" },
                        barrier.step + 1,
                        barrier.steps,
                        if barrier.sending {
                            "sending to"
                        } else {
                            "waiting for"
                        },
                        barrier.waiting_node,
                        barrier.waiting_port,
                        barrier.round
                    ),
                    (None, None) if port.barrier_running => "barrier".to_owned(),
                    (None, None) if port.closing => "closing".to_owned(),
                    (None, None) => "ok".to_owned(),
                },
            ]);
        }
    }
    out.push_str("\nopen ports\n");
    if ports.len() == 1 {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(&ports));
    }
    let mut connections = vec![row(&[
        "UNIT", "PEER", "SENT", "RESENT", "RECEIVED", "ACKS-TX", "ACKS-RX", "NACKS-TX", "NACKS-RX",
        "REJ-TX", "REJ-RX", "DROPS", "GIVE-UPS",
    ])];
    for unit in &report.units {
        for c in &unit.connections {
            connections.push(
                [
                    u64::from(unit.unit),
                    u64::from(c.peer),
                    c.sent,
                    c.resent,
                    c.received,
                    c.acks_sent,
                    c.acks_received,
                    c.nacks_sent,
                    c.nacks_received,
                    c.rejects_sent,
                    c.rejects_received,
                    c.drops,
                    c.give_ups,
                ]
                .iter()
                .map(u64::to_string)
                .collect(),
            );
        }
    }
    out.push_str("\nconnections\n");
    if connections.len() == 1 {
        out.push_str("(none)\n");
    } else {
        out.push_str(&table(&connections));
    }
    out
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|cell| (*cell).to_owned()).collect()
}

fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in rows {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Harness {
        #[command(flatten)]
        args: EmulateArgs,
    }

    fn parse(line: &[&str]) -> EmulateArgs {
        Harness::try_parse_from(std::iter::once("emulate").chain(line.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn units_get_consecutive_node_ids_without_a_fabric() {
        let config = parse(&["--socket", "/x.sock", "--units", "3", "--first-node", "5"])
            .config()
            .unwrap();
        let nodes: Vec<u16> = config.units.iter().map(|u| u.node.get()).collect();
        assert_eq!(nodes, [5, 6, 7]);
        assert!(config.units.iter().all(|u| u.address.is_none()));
        assert!(config.faults.is_none());
    }

    #[test]
    fn fault_options_switch_the_injector_on_with_their_seed() {
        let config = parse(&["--socket", "/x.sock", "--loss", "0.2", "--seed", "9"])
            .config()
            .unwrap();
        let faults = config.faults.unwrap();
        assert_eq!((faults.seed, faults.loss), (9, 0.2));
        let error = parse(&["--socket", "/x.sock", "--loss", "2"])
            .config()
            .unwrap_err();
        assert_eq!(error.to_string(), "loss probability 2 is not within 0..=1");
    }

    #[test]
    fn a_fabric_needs_the_daemons_nodes() {
        let error = parse(&["--socket", "/x.sock", "--fabric", "/nonexistent.map"])
            .config()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "with --fabric, name this daemon's nodes with --node"
        );
    }

    #[test]
    fn the_status_table_lists_ports_and_connections() {
        let report = StatusReport {
            daemon_pid: 77,
            fault_seed: Some(5),
            units: vec![protocol::UnitStatus {
                unit: 0,
                node: 3,
                address: None,
                ports: vec![protocol::PortReport {
                    port: 2,
                    generation: 1,
                    owner_pid: Some(4242),
                    held_sends: 0,
                    receive_buffers: 16,
                    barrier_running: true,
                    barrier: Some(protocol::BarrierReport {
                        step: 2,
                        steps: 4,
                        waiting_node: 1,
                        waiting_port: 3,
                        round: 2,
                        sending: false,
                    }),
                    closing: false,
                    pending_events: 0,
                    faulted: None,
                }],
                connections: vec![protocol::ConnectionReport::new(
                    9,
                    &firmware::ConnectionCounters {
                        sent: 10,
                        resent: 2,
                        ..Default::default()
                    },
                )],
                counters: Default::default(),
                wire: Default::default(),
            }],
        };
        let text = format_status(&report);
        assert!(text.starts_with("daemon pid 77, fault injector on (seed 5)\n"));
        assert!(
            text.contains(
                "\n0     2     1    4242   0      16         0       \
                 barrier step 3/4, waiting for node 1 port 3 (round 2)\n"
            ),
            "{text}"
        );
        assert!(text.contains("\n0     9     10    2       0"), "{text}");
    }
}
