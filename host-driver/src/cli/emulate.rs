//! `nicctl emulate`: run the emulated NICs as a daemon.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::{SigSet, Signal};
use shared_abi::ids::NodeId;

use nicbar_emulator::{
    DEFAULT_IDLE_LINGER, Emulator, EmulatorConfig, FabricMap, FaultConfig, IdlePolicy, UnitConfig,
};

use super::{CliResult, resolve_group};

/// The longest fault-injector delay or reordering window `--delay-us` and `--reorder-window-us`
/// take: 10 s.
const MAX_FAULT_DELAY_US: u64 = 10_000_000;
/// `--retransmit-us`'s range: 10 µs to 1 s.
const MIN_RETRANSMIT_US: u64 = 10;
const MAX_RETRANSMIT_US: u64 = 1_000_000;
/// `--give-up-ms`'s range: 10 ms to an hour.
const MIN_GIVE_UP_MS: u64 = 10;
const MAX_GIVE_UP_MS: u64 = 3_600_000;
/// `--linger-us`'s most: 1 s.
const MAX_LINGER_US: u64 = 1_000_000;

/// Arguments of `nicctl emulate`.
#[derive(clap::Args, Debug)]
pub struct EmulateArgs {
    /// The control socket [default: $NICBAR_SOCKET, else $XDG_RUNTIME_DIR/nicbar/control.sock,
    /// else /tmp/nicbar-<uid>/control.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// How many NICs to run, 1 to 256, with node ids from --first-node on (ignored with --node).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub units: u16,
    /// The node id of unit 0 when the units are given by --units.
    #[arg(long, default_value_t = 0)]
    pub first_node: u16,
    /// The node ids of this daemon's NICs, in unit order (repeat or separate with commas).
    /// With --fabric, each must be on the map; the NIC binds its address.
    #[arg(long = "node", value_delimiter = ',')]
    pub nodes: Vec<u16>,
    /// The fabric map: lines `node <id> <ip>:<port> [<host name>]`, `#` comments. Nodes on it
    /// that this daemon does not run are reached over UDP; a node's name (else its address) is
    /// its host name on the fabric.
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
    /// Fault injector: longest hold-back of a reordered packet, in microseconds, 0 to 10000000
    /// (10 s).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=MAX_FAULT_DELAY_US))]
    pub reorder_window_us: u64,
    /// Fault injector: delay of every packet, in microseconds, 0 to 10000000 (10 s).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=MAX_FAULT_DELAY_US))]
    pub delay_us: u64,
    /// Fault injector seed [default: drawn from the clock, and printed].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Firmware: first retransmission timeout, in microseconds, 10 to 1000000 (1 s), shorter
    /// than the give-up time [default: 2000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(MIN_RETRANSMIT_US..=MAX_RETRANSMIT_US))]
    pub retransmit_us: Option<u64>,
    /// How many threads run the NICs (unit u on thread u mod N), 1 to the number of units
    /// [default: one per core left once each unit's process has one, but at least one per eight
    /// cores, and at least 1].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// CPUs to pin the NIC threads to, thread t on the t-th (mod their number): a list such as
    /// `2,3` or `8-11` [default: not pinned].
    #[arg(long, value_name = "LIST", value_parser = parse_cpu_list)]
    pub cpus: Option<CpuList>,
    /// What an idle NIC thread does: `poll` (never sleeps: for a thread with a core of its own),
    /// `sleep` (sleeps at once; processes ring a doorbell), or `adaptive` (polls while the host
    /// has a core for every NIC thread and every process with an open port, else sleeps).
    #[arg(long, default_value_t = IdlePolicy::Adaptive)]
    pub idle: IdlePolicy,
    /// The NIC threads' niceness, -20 to 19 [default: the daemon's]. Below the processes' (say
    /// -5), a NIC thread that wakes takes a core from a computing process at once, as an
    /// interrupt would, so non-blocking collectives progress on a host with no core to spare;
    /// lowering it needs CAP_SYS_NICE.
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub nice: Option<i32>,
    /// How long a sleeping NIC thread stays awake after its last work, in microseconds, 0 to
    /// 1000000 (processes posting within it ring no doorbell; 0 sleeps at once).
    #[arg(long, default_value_t = DEFAULT_IDLE_LINGER.as_micros() as u64, value_parser = clap::value_parser!(u64).range(0..=MAX_LINGER_US))]
    pub linger_us: u64,
    /// Firmware: give up on a silent node after this many milliseconds, 10 to 3600000 (an
    /// hour), longer than the retransmission timeout [default: 2000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(MIN_GIVE_UP_MS..=MAX_GIVE_UP_MS))]
    pub give_up_ms: Option<u64>,
    /// The fabric key file (64 hex digits, mode 0600; `nicctl keygen FILE` makes one): every
    /// packet is authenticated under it. Needed with --fabric, and the same for every daemon of
    /// the fabric; without --fabric the daemon makes a key of its own.
    #[arg(long, value_name = "FILE")]
    pub fabric_key: Option<PathBuf>,
    /// Send and take packets without authentication (to measure what it costs). Every daemon of
    /// the fabric must be started so; anyone who can reach the UDP ports can then forge packets.
    #[arg(long, conflicts_with = "fabric_key")]
    pub insecure_no_auth: bool,
    /// Serve the members of this group too (a name or a number); by default only this user
    /// (and root) may open ports. The socket and its directory are given to the group.
    #[arg(long, value_name = "GROUP")]
    pub allow_group: Option<String>,
}

impl EmulateArgs {
    /// The emulator configuration these arguments describe, checked
    /// ([`EmulatorConfig::validate`]).
    ///
    /// # Errors
    /// A message for a fabric map or key that does not read, or arguments that contradict each
    /// other.
    pub fn config(&self) -> Result<EmulatorConfig, Box<dyn std::error::Error>> {
        let socket = self
            .socket
            .clone()
            .unwrap_or_else(nicbar_control::socket_path);
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
                    .map(|&node| UnitConfig {
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
        config.threads = self.threads.map(usize::from);
        config.cpus = self.cpus.clone().map(|list| list.0).unwrap_or_default();
        config.idle = self.idle;
        config.nice = self.nice;
        config.allow_group = self.allow_group.as_deref().map(resolve_group).transpose()?;
        if let Some(path) = self.fabric_key.as_ref() {
            config.nic.fabric_key = Some(nicbar_emulator::key::read_key(path)?);
        }
        config.authenticate = !self.insecure_no_auth;
        if let Some(ms) = self.give_up_ms {
            config.nic.give_up_after = Duration::from_millis(ms);
        }
        // Everything the daemon would refuse is refused now, before anything is printed.
        config.validate()?;
        Ok(config)
    }
}

/// CPU numbers, as `--cpus` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

/// Parses `0,2,4-7` into the CPUs it names, in order.
fn parse_cpu_list(text: &str) -> Result<CpuList, String> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .ok()
                .filter(|&cpu| cpu < nix::sched::CpuSet::count())
                .ok_or_else(|| {
                    format!(
                        "`{s}` is not a CPU number (0 to {})",
                        nix::sched::CpuSet::count() - 1
                    )
                })
        };
        match part.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return Err(format!("the CPU range `{part}` runs backwards"));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(part)?),
        }
    }
    Ok(CpuList(cpus))
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
    fn thread_options_reach_the_config_and_bad_ones_are_refused() {
        let config = parse(&[
            "--socket",
            "/x.sock",
            "--units",
            "4",
            "--threads",
            "2",
            "--cpus",
            "1,4-5",
            "--idle",
            "poll",
            "--nice",
            "-5",
        ])
        .config()
        .unwrap();
        assert_eq!(config.threads, Some(2));
        assert_eq!(config.nice, Some(-5));
        assert_eq!(config.cpus, [1, 4, 5]);
        assert_eq!(config.idle, IdlePolicy::Poll);
        let defaults = parse(&["--socket", "/x.sock"]).config().unwrap();
        assert_eq!(
            (defaults.threads, defaults.idle),
            (None, IdlePolicy::Adaptive)
        );
        assert!(defaults.cpus.is_empty());
        assert_eq!(defaults.nice, None);
        let harness = |line: &[&str]| {
            Harness::try_parse_from(std::iter::once("emulate").chain(line.iter().copied()))
                .err()
                .map(|error| error.to_string())
                .unwrap_or_default()
        };
        assert!(harness(&["--threads", "0"]).contains("--threads"));
        assert!(harness(&["--cpus", "3-1"]).contains("runs backwards"));
        assert!(harness(&["--cpus", "x"]).contains("not a CPU number"));
        assert!(harness(&["--nice", "20"]).contains("--nice"));
        assert!(harness(&["--nice", "-21"]).contains("--nice"));
        assert!(harness(&["--idle", "spin"]).contains("none of poll, sleep, adaptive"));
    }
}
