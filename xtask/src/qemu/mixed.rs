//! The mixed-fabric stage of `cargo xtask qemu`: QEMU NICs and daemon NICs on one fabric map.
//!
//! The stage runs in a network namespace of its own, so it never touches the host's network:
//! `cargo xtask qemu` runs itself again under `unshare -n` (as root) or `unshare -rn` (anyone,
//! where user namespaces are allowed) with `--mixed-inside TARGET`. Inside, it brings up a
//! bridge `nbbr0` and one tap `nbtapK` per QEMU node on it (MTU 9000: the longest fabric frame
//! is over 4 KiB, and the firmware refuses fragments), gives the bridge each daemon node's
//! address 10.77.0.K, and writes one fabric map naming every node at 10.77.0.K:47000. Even
//! nodes are QEMU NICs (`nicctl qemu --virtio-net tap --fabric --node`), odd ones daemon NICs
//! (`nicctl emulate --fabric --node`), so every hop of the peers' ring crosses from one kind to
//! the other. One `qemu_peer` per node runs the messages, the barriers of every algorithm and
//! NIC broadcasts from every root,
//! checked as in the other stages; the QEMU NICs' reports must show a clean power-off and no
//! packet through the switch. With `--ping-pong N`, node pairs of each kind then measure round
//! trips of one 64-byte message.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::{
    Args, Children, PEERS_TIMEOUT, START_TIMEOUT, STOP_TIMEOUT, Tools, WorkDir, check_peers, field,
};
use crate::Result;
use crate::command::{run, show};

/// The bridge inside the namespace.
const BRIDGE: &str = "nbbr0";
/// The taps' prefix: node K's is `nbtapK`.
const TAP_PREFIX: &str = "nbtap";
/// The bridge's and taps' MTU: above the longest fabric frame
/// (`shared_abi::qemu::net::MAX_FRAME_LEN`, about 4.2 KB).
const MTU: &str = "9000";
/// How long the namespaced run may take, boots and peers included.
const INSIDE_TIMEOUT: Duration = Duration::from_secs(240);

/// NIC broadcasts each peer runs: two rounds of roots.
fn broadcasts(shape: &Args) -> u32 {
    2 * u32::from(shape.nodes)
}

/// Whether node `node` of a mixed fabric is a QEMU NIC (else a daemon NIC).
fn is_qemu(node: u16) -> bool {
    node % 2 == 0
}

/// What the outer stage reports.
pub(super) struct MixedRun {
    /// The fabric, one line per node.
    pub(super) fabric: Vec<String>,
    /// The summary lines the inner run printed (`mixed: ...`).
    pub(super) summary: Vec<String>,
    pub(super) took: Duration,
}

/// Runs the mixed stage for `target` in a fresh network namespace (this program again, under
/// `unshare`), and returns what it reported.
pub(super) fn run_in_namespace(target: &str, image: &Path, shape: &Args) -> Result<MixedRun> {
    let started = Instant::now();
    let me = std::env::current_exe().map_err(|error| format!("this program's path: {error}"))?;
    let root = is_root();
    let mut command = Command::new("unshare");
    command
        .arg(if root { "-n" } else { "-rn" })
        .arg(me)
        .args(["qemu", "--mixed-inside", target, "--mixed-image"])
        .arg(image)
        .args(["--nodes", &shape.nodes.to_string()])
        .args(["--messages", &shape.messages.to_string()])
        .args(["--barriers", &shape.barriers.to_string()])
        .args(["--ping-pong", &shape.ping_pong.to_string()]);
    println!("running: {}", show(&command));
    let mut children = Children::default();
    let inside = children.spawn("namespace", &mut command, false)?;
    let status = children.wait(inside, INSIDE_TIMEOUT)?;
    let lines = children.lines(inside);
    if !status.success() {
        let hint = if lines.iter().any(|line| line.contains("unshare: ")) {
            " (no network namespace could be made: run as root, or allow user namespaces)"
        } else {
            ""
        };
        return Err(format!("the mixed fabric on {target} failed ({status}){hint}").into());
    }
    let pick = |prefix: &str| -> Vec<String> {
        lines
            .iter()
            .filter_map(|line| line.strip_prefix(prefix))
            .map(str::to_owned)
            .collect()
    };
    let fabric = pick("fabric: ");
    let summary = pick("mixed: ");
    if fabric.len() != usize::from(shape.nodes) || summary.is_empty() {
        return Err(format!("the mixed fabric on {target} did not report its fabric").into());
    }
    Ok(MixedRun {
        fabric,
        summary,
        took: started.elapsed(),
    })
}

/// The fetch-and-adds each peer applies to node 0's word (`qemu_peer --one-sided`, whose
/// `ADDS` this is).
const ONE_SIDED_ADDS: u32 = 25;

/// The kernel's TUN/TAP device, which a tap is made through.
pub(super) const TUN_DEVICE: &str = "/dev/net/tun";

/// Whether this process's effective user is root (read from `/proc`: xtask binds no libc).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

/// Runs `ip` with `arguments`, failing if it fails.
fn ip(arguments: &[&str]) -> Result<()> {
    run(Command::new("ip").args(arguments))
}

/// Inside the namespace: the network, the map, the key, the NICs, the peers, the checks.
pub(super) fn run_inside(tools: &Tools, target: &str, image: &Path, shape: &Args) -> Result<()> {
    let nodes: Vec<u16> = (0..shape.nodes).collect();
    let (qemu_nodes, daemon_nodes): (Vec<u16>, Vec<u16>) =
        nodes.iter().partition(|&&node| is_qemu(node));
    if daemon_nodes.is_empty() || qemu_nodes.is_empty() {
        return Err("a mixed fabric needs two nodes at least".into());
    }
    ip(&["link", "set", "lo", "up"])?;
    ip(&["link", "add", BRIDGE, "type", "bridge"])?;
    ip(&["link", "set", BRIDGE, "mtu", MTU])?;
    for node in &qemu_nodes {
        let tap = format!("{TAP_PREFIX}{node}");
        ip(&["tuntap", "add", "dev", &tap, "mode", "tap"])?;
        ip(&["link", "set", &tap, "mtu", MTU, "master", BRIDGE, "up"])?;
    }
    ip(&["link", "set", BRIDGE, "up"])?;
    let address = |node: u16| format!("10.77.{}.{}", node >> 8, node & 0xff);
    for &node in &daemon_nodes {
        ip(&[
            "addr",
            "add",
            &format!("{}/16", address(node)),
            "dev",
            BRIDGE,
        ])?;
    }

    let work = WorkDir::create()?;
    let map = work.path.join("fabric.map");
    let mut text = String::from("# a mixed fabric: even nodes QEMU NICs, odd ones daemon NICs\n");
    for &node in &nodes {
        text.push_str(&format!("node {node} {}:47000\n", address(node)));
    }
    std::fs::write(&map, &text).map_err(|error| format!("{}: {error}", map.display()))?;
    let key = work.path.join("fabric.key");
    run(Command::new(&tools.nicctl).arg("keygen").arg(&key))?;
    let list = |nodes: &[u16]| {
        nodes
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    for &node in &nodes {
        let kind = if is_qemu(node) {
            format!("QEMU NIC ({target}), tap {TAP_PREFIX}{node}")
        } else {
            format!("daemon NIC (nicctl emulate), on bridge {BRIDGE}")
        };
        println!("fabric: node {node} {}:47000 {kind}", address(node));
    }

    let started = Instant::now();
    let mut children = Children::default();
    let daemon_socket = work.path.join("daemon.sock");
    let mut daemon_command = Command::new(&tools.nicctl);
    daemon_command
        .args(["emulate", "--socket"])
        .arg(&daemon_socket)
        .args(["--node", &list(&daemon_nodes), "--fabric"])
        .arg(&map)
        .arg("--fabric-key")
        .arg(&key);
    println!("running: {}", show(&daemon_command));
    let daemon = children.spawn("nicctl emulate", &mut daemon_command, false)?;
    let qemu_socket = work.path.join("qemu.sock");
    let mut qemu_command = Command::new(&tools.nicctl);
    qemu_command
        .args(["qemu", "--image"])
        .arg(image)
        .arg("--socket")
        .arg(&qemu_socket)
        .arg("--run-dir")
        .arg(work.path.join("run"))
        .args(["--virtio-net", "tap", "--tap-prefix", TAP_PREFIX])
        .args(["--node", &list(&qemu_nodes), "--fabric"])
        .arg(&map)
        .arg("--fabric-key")
        .arg(&key)
        .arg("--stop-on-stdin-eof");
    println!("running: {}", show(&qemu_command));
    let qemu = children.spawn("nicctl qemu", &mut qemu_command, true)?;
    children.await_line(daemon, "nicctl emulate: listening on", START_TIMEOUT)?;
    children.await_line(qemu, "nicctl qemu: listening on", START_TIMEOUT)?;
    let booted = started.elapsed();

    // Unit u of each socket is the u-th node of its kind.
    let endpoint = |node: u16| {
        let (socket, kind) = if is_qemu(node) {
            (&qemu_socket, &qemu_nodes)
        } else {
            (&daemon_socket, &daemon_nodes)
        };
        let unit = kind.iter().position(|&n| n == node).unwrap_or(0);
        (socket.clone(), unit)
    };
    let mut peers = Vec::new();
    for &node in &nodes {
        let (socket, unit) = endpoint(node);
        let mut command = Command::new(&tools.peer);
        command
            .arg("--socket")
            .arg(&socket)
            .args(["--unit", &unit.to_string(), "--node", &node.to_string()])
            .args(["--nodes", &shape.nodes.to_string()])
            .args(["--messages", &shape.messages.to_string()])
            .args(["--barriers", &shape.barriers.to_string()])
            .args(["--broadcasts", &broadcasts(shape).to_string()])
            .arg("--one-sided");
        println!("running: {}", show(&command));
        peers.push(children.spawn(&format!("peer {node}"), &mut command, false)?);
    }
    let peers_started = Instant::now();
    for &index in &peers {
        let status = children.wait(index, PEERS_TIMEOUT.saturating_sub(peers_started.elapsed()))?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}); its output:\n{}",
                children.name(index),
                children.lines(index).join("\n")
            )
            .into());
        }
    }
    let peers_took = peers_started.elapsed();
    let outcome = check_peers(&children, &peers, shape)?;
    let expected = format!("broadcasts={} checked", broadcasts(shape));
    // Once its put to the next node, its get back and its fetch-and-adds on node 0's word were
    // checked: one-sided operations cross the kinds.
    let one_sided = format!("one-sided puts=1 gets=1 adds={ONE_SIDED_ADDS} checked");
    for &peer in &peers {
        for line in [expected.as_str(), one_sided.as_str()] {
            if !children.lines(peer).iter().any(|l| l == line) {
                return Err(format!("{} did not report {line:?}", children.name(peer)).into());
            }
        }
    }

    let mut pairs = Vec::new();
    if shape.ping_pong > 0 {
        // One pair of each kind the fabric has: QEMU-daemon, daemon-daemon, QEMU-QEMU.
        let candidates = [
            ("QEMU-daemon", qemu_nodes.first(), daemon_nodes.first()),
            ("daemon-daemon", daemon_nodes.first(), daemon_nodes.get(1)),
            ("QEMU-QEMU", qemu_nodes.first(), qemu_nodes.get(1)),
        ];
        for (name, a, b) in candidates {
            let (Some(&a), Some(&b)) = (a, b) else {
                continue;
            };
            let mut sides = Vec::new();
            for (node, other) in [(a, b), (b, a)] {
                let (socket, unit) = endpoint(node);
                let mut command = Command::new(&tools.peer);
                command
                    .arg("--socket")
                    .arg(&socket)
                    .args(["--unit", &unit.to_string(), "--node", &node.to_string()])
                    .args(["--nodes", &shape.nodes.to_string(), "--port", "2"])
                    .args(["--ping-pong-with", &other.to_string()])
                    .args(["--round-trips", &shape.ping_pong.to_string()]);
                sides.push(children.spawn(&format!("{name} {node}"), &mut command, false)?);
            }
            for &side in &sides {
                let status = children.wait(side, PEERS_TIMEOUT)?;
                if !status.success() {
                    return Err(format!("the {name} ping-pong failed ({status})").into());
                }
            }
            let line = children
                .lines(sides[0])
                .into_iter()
                .find(|line| line.starts_with("pingpong "))
                .ok_or_else(|| format!("the {name} ping-pong printed no result"))?;
            pairs.push((name, a, b, line));
        }
    }

    children.close_stdin(qemu);
    let status = children.wait(qemu, STOP_TIMEOUT)?;
    if !status.success() {
        return Err(format!("nicctl qemu failed ({status})").into());
    }
    let lines = children.lines(qemu);
    let reports: Vec<&String> = lines
        .iter()
        .filter(|line| line.starts_with("nicctl qemu: report "))
        .collect();
    if reports.len() != qemu_nodes.len() {
        return Err(format!(
            "nicctl qemu printed {} reports for {} NICs",
            reports.len(),
            qemu_nodes.len()
        )
        .into());
    }
    for line in reports {
        if field(line, "exit") != Some("0") || field(line, "state") != Some("stopped") {
            return Err(format!("a QEMU NIC did not power off cleanly: {line}").into());
        }
        if field(line, "barriers_failed") != Some("0") {
            return Err(format!("a QEMU NIC failed barriers: {line}").into());
        }
        // The checked barriers, the ring's opening and closing ones, and the broadcasts (each
        // is a barrier too); the one-sided step's broadcast of each node's remote pointer and
        // its closing barrier; the ping-pongs' two each.
        let node = field(line, "node").and_then(|node| node.parse::<u16>().ok());
        let ping_pongs = pairs
            .iter()
            .filter(|(_, a, b, _)| Some(*a) == node || Some(*b) == node)
            .count() as u64;
        let one_sided = u64::from(shape.nodes) + 1;
        let barriers =
            outcome.barriers as u64 + 2 + u64::from(broadcasts(shape)) + one_sided + 2 * ping_pongs;
        if field(line, "barriers_completed") != Some(&barriers.to_string()) {
            return Err(format!("a QEMU NIC did not complete {barriers} barriers: {line}").into());
        }
        // The ring's messages, and the ping-pongs' the node took part in.
        let expected = u64::from(shape.messages) + ping_pongs * u64::from(shape.ping_pong);
        if field(line, "messages_delivered") != Some(&expected.to_string()) {
            return Err(format!("a QEMU NIC did not deliver {expected} messages: {line}").into());
        }
    }
    let switch = lines
        .iter()
        .find(|line| line.starts_with("nicctl qemu: switch "))
        .ok_or("nicctl qemu printed no switch counters")?;
    if field(switch, "moved") != Some("0") {
        return Err(
            format!("the wire was the taps, yet the switch moved packets: {switch}").into(),
        );
    }

    println!(
        "mixed: {} nodes ({} QEMU, {} daemon), {} messages each way checked byte for byte and \
         in order, {} barriers of {} algorithms on every node, none left early, {} NIC \
         broadcasts from every root checked, a put, a get and {} fetch-and-adds per node \
         checked; {:.1} s to a serving fabric, {:.1} s of peers",
        shape.nodes,
        qemu_nodes.len(),
        daemon_nodes.len(),
        shape.messages,
        outcome.barriers,
        outcome.algorithms,
        broadcasts(shape),
        ONE_SIDED_ADDS,
        booted.as_secs_f64(),
        peers_took.as_secs_f64()
    );
    for (name, a, b, line) in &pairs {
        println!("mixed: ping-pong {name} (nodes {a} and {b}): {line}");
    }
    Ok(())
}
