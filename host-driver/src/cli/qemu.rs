//! `nicctl qemu`: boot the firmware image as NICs under QEMU and serve them on a control socket.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use nicbar_emulator::FabricMap;
use nicbar_image::flash::FlashDevice;
use nicbar_image::image::ImageFile;
use nicbar_qemu::{
    DEFAULT_BOOT_TIMEOUT, DEFAULT_TAP_PREFIX, QemuConfig, QemuFabric, VirtioNet, qemu_for_target,
};
use shared_abi::ids::NodeId;
use shared_abi::qemu::net::{FABRIC_UDP_PORT, node_address};

use super::{CliResult, resolve_group};

/// How often the supervisor checks that every QEMU still runs.
const CHECK_INTERVAL: u16 = 250;

/// Arguments of `nicctl qemu`.
#[derive(clap::Args, Debug)]
pub struct QemuArgs {
    /// The firmware image file to boot (as `cargo xtask image` writes it).
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "flash",
        conflicts_with = "flash"
    )]
    pub image: Option<PathBuf>,
    /// Boot the image flashed on this device (as `nicctl flash` wrote it) instead of a file.
    #[arg(long, value_name = "DEVICE")]
    pub flash: Option<PathBuf>,
    /// How many NICs to boot; they get node ids and unit numbers 0..N (ignored with --node).
    #[arg(long, default_value_t = 2)]
    pub nodes: u16,
    /// With --fabric: the node ids of this fabric's QEMU NICs, in unit order (repeat or separate
    /// with commas); each must be on the map at 10.77.hi.lo:47000.
    #[arg(long = "node", value_delimiter = ',', requires = "fabric")]
    pub node_ids: Vec<u16>,
    /// The fabric map these NICs are part of (as `nicctl emulate --fabric` reads it): every node
    /// on it, QEMU or daemon, must be at its QEMU address 10.77.hi.lo:47000; the fabric has as
    /// many nodes as the highest id on it and one. Needs --node, --fabric-key and
    /// `--virtio-net tap`.
    #[arg(long, value_name = "MAP", requires_all = ["node_ids", "fabric_key"])]
    pub fabric: Option<PathBuf>,
    /// The fabric key file the daemons of the fabric read too (`nicctl keygen FILE`); without
    /// --fabric the NICs make a key of their own.
    #[arg(long, value_name = "FILE", requires = "fabric")]
    pub fabric_key: Option<PathBuf>,
    /// With `--virtio-net tap`: node K's tap interface is PREFIX followed by K.
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_TAP_PREFIX)]
    pub tap_prefix: String,
    /// The control socket (default: $NICBAR_SOCKET, else $XDG_RUNTIME_DIR/nicbar/control.sock,
    /// else /tmp/nicbar-UID/control.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The QEMU binary [default: qemu-system-riscv32 for a riscv32imac image,
    /// qemu-system-riscv64 for a riscv64imac one].
    #[arg(long)]
    pub qemu: Option<PathBuf>,
    /// Keep the UART sockets, the flat firmware and the QEMU logs here, kept after stop
    /// (default: a temporary directory beside the socket, removed on stop).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// How long each NIC may take to boot, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_BOOT_TIMEOUT.as_millis() as u64)]
    pub boot_timeout_ms: u64,
    /// Serve the members of this group too (a name or a number); by default only this user
    /// (and root) may open ports.
    #[arg(long, value_name = "GROUP")]
    pub allow_group: Option<String>,
    /// Give each NIC a virtio-net device: `wire` puts every NIC on one Ethernet segment and the
    /// fabric's packets through the devices (UDP/IPv4); `tap` puts each on its tap interface
    /// (`--tap-prefix`; made and bridged beforehand, for instance in a network namespace, see
    /// docs/architecture.md), where it meets daemon NICs whose addresses are on the bridge;
    /// `user` puts each on QEMU's user-mode network, where the firmware checks it at boot with
    /// an ARP exchange with the gateway (printed on the console) and the packets still go
    /// through the switch.
    #[arg(long, value_name = "NETWORK", value_parser = parse_virtio_net)]
    pub virtio_net: Option<VirtioNet>,
    /// Do not print the NICs' console lines.
    #[arg(long)]
    pub quiet: bool,
    /// Also stop when standard input reaches its end (for a supervising process: closing the
    /// pipe stops the NICs cleanly, and so does the supervisor's death).
    #[arg(long)]
    pub stop_on_stdin_eof: bool,
}

fn parse_virtio_net(value: &str) -> Result<VirtioNet, String> {
    match value {
        "wire" => Ok(VirtioNet::Wire),
        "tap" => Ok(VirtioNet::Tap),
        "user" => Ok(VirtioNet::User),
        other => Err(format!(
            "{other:?}: the virtio-net network is `wire`, `tap` or `user`"
        )),
    }
}

/// Runs `nicctl qemu`: boots the NICs, prints `nicctl qemu: listening on <socket>` once
/// processes can connect, and serves until SIGINT or SIGTERM (or the end of standard input, with
/// `--stop-on-stdin-eof`). Then powers the NICs off and prints one `nicctl qemu: report ...` line
/// per node (stack high-water marks, counters, exit status) and the switch's counters.
///
/// # Errors
/// The image does not verify, a NIC did not boot, or a NIC's QEMU exited while serving (the error
/// says how, with the firmware's trap if it trapped).
pub fn run_qemu(args: QemuArgs) -> CliResult {
    let image = match (&args.image, &args.flash) {
        (Some(path), _) => ImageFile::read(path)?,
        (None, Some(device)) => FlashDevice::open(device)?.read_image()?,
        (None, None) => return Err("name the firmware with --image or --flash".into()),
    };
    if qemu_for_target(image.header().target).is_none() {
        return Err(format!(
            "{} is a {} image; QEMU virt runs riscv32imac-unknown-none-elf and \
             riscv64imac-unknown-none-elf images",
            image.path().display(),
            image.header().target
        )
        .into());
    }
    let mut config = QemuConfig::new(
        args.socket
            .clone()
            .unwrap_or_else(nicbar_control::socket_path),
        image,
        args.nodes,
    );
    config.virtio_net = args.virtio_net;
    config.tap_prefix = args.tap_prefix.clone();
    if let Some(path) = &args.fabric {
        let (node_ids, node_count) =
            fabric_placement(&FabricMap::read(path)?, &args.node_ids, config.virtio_net)?;
        config.nodes = u16::try_from(node_ids.len()).map_err(|_| "too many --node ids")?;
        config.node_ids = Some(node_ids);
        config.node_count = Some(node_count);
        if let Some(key) = &args.fabric_key {
            config.fabric_key = Some(nicbar_emulator::key::read_key_bytes(key)?);
        }
    }
    if let Some(qemu) = &args.qemu {
        config.qemu = qemu.clone();
    }
    config.run_dir = args.run_dir.clone();
    config.echo_console = !args.quiet;
    config.boot_timeout = Duration::from_millis(args.boot_timeout_ms);
    config.allow_group = args.allow_group.as_deref().map(resolve_group).transpose()?;

    // Block the stop signals before any thread starts, so every thread inherits the mask and the
    // signals wait for the signalfd below instead of killing the process mid-write.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals.thread_block()?;
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_CLOEXEC)?;

    println!(
        "nicctl qemu: booting {} NIC(s) from {} ({}) with {}",
        config.nodes,
        config.image.path().display(),
        config.image.header().target,
        config.qemu.display()
    );
    let fabric = QemuFabric::spawn(config)?;
    for (unit, report) in fabric.reports().iter().enumerate() {
        let windows = report
            .windows
            .iter()
            .filter(|(address, _)| *address != 0)
            .count();
        let wire = match args.virtio_net {
            Some(VirtioNet::Tap) => format!(
                ", {} on tap {}{}",
                node_address(report.node),
                args.tap_prefix,
                report.node
            ),
            Some(VirtioNet::Wire) => format!(", {} on the segment", node_address(report.node)),
            _ => String::new(),
        };
        println!(
            "nicctl qemu: unit {unit} = node {}: QEMU pid {}, {windows} port windows{wire}",
            report.node, report.pid
        );
    }

    println!("nicctl qemu: listening on {}", fabric.socket().display());

    let stdin = std::io::stdin();
    let watch_stdin = args.stop_on_stdin_eof;
    let outcome = loop {
        let mut fds = vec![PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN)];
        if watch_stdin {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, PollTimeout::from(CHECK_INTERVAL)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(error) => break Err(format!("waiting for a stop signal: {error}")),
        }
        let ready = |fd: &PollFd<'_>| {
            fd.revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
        };
        if ready(&fds[0]) {
            let signal = signal_fd
                .read_signal()
                .ok()
                .flatten()
                .and_then(|info| Signal::try_from(info.ssi_signo as i32).ok());
            let name = signal.map_or("a signal", Signal::as_str);
            println!("nicctl qemu: {name}: stopping");
            break Ok(());
        }
        if watch_stdin && fds.get(1).is_some_and(ready) && stdin_at_end(&stdin) {
            println!("nicctl qemu: standard input closed: stopping");
            break Ok(());
        }
        if let Err(error) = fabric.check_running() {
            break Err(error.to_string());
        }
    };
    let report = fabric.stop();
    for node in &report.nodes {
        println!("nicctl qemu: report {node}");
    }
    let switch = report.switch;
    println!(
        "nicctl qemu: switch moved={} held={} dropped_full={} dropped_down={} no_route={} \
         bad_slots={}",
        switch.moved,
        switch.held,
        switch.dropped_full,
        switch.dropped_down,
        switch.no_route,
        switch.bad_slots
    );
    outcome.map_err(Into::into)
}

/// The node ids and the fabric's size of QEMU NICs that are nodes `nodes` of the fabric `map`:
/// every node on the map must sit at its QEMU address (10.77.hi.lo:47000, where the firmware
/// sends to it), every one of `nodes` must be on it, and the wire must be the taps.
///
/// # Errors
/// A message saying which of those does not hold.
fn fabric_placement(
    map: &FabricMap,
    nodes: &[u16],
    virtio_net: Option<VirtioNet>,
) -> Result<(Vec<u16>, u16), String> {
    if virtio_net != Some(VirtioNet::Tap) {
        return Err(
            "--fabric needs `--virtio-net tap`: the NICs meet the daemons on a bridge".to_owned(),
        );
    }
    let mut highest = 0;
    for (node, address) in map.iter() {
        let expected = std::net::SocketAddr::from((
            std::net::Ipv4Addr::from(node_address(node.get()).0),
            FABRIC_UDP_PORT,
        ));
        if address != expected {
            return Err(format!(
                "the fabric map puts node {} at {address}; on a fabric with QEMU NICs every node \
                 is at {expected}",
                node.get()
            ));
        }
        highest = highest.max(node.get());
    }
    if let Some(node) = nodes
        .iter()
        .find(|&&node| map.address(NodeId::new(node)).is_none())
    {
        return Err(format!("node {node} is not on the fabric map"));
    }
    Ok((nodes.to_vec(), highest.saturating_add(1)))
}

/// Reads standard input (which polled readable) and says whether it is at its end; other input
/// is read and ignored.
fn stdin_at_end(stdin: &std::io::Stdin) -> bool {
    let mut buffer = [0u8; 256];
    matches!(
        nix::unistd::read(stdin.as_fd(), &mut buffer),
        Ok(0) | Err(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = "node 0 10.77.0.0:47000\nnode 1 10.77.0.1:47000\nnode 2 10.77.0.2:47000\n";

    #[test]
    fn a_map_of_qemu_addresses_places_the_nodes_and_sizes_the_fabric() {
        let map = FabricMap::parse(MIXED).unwrap();
        assert_eq!(
            fabric_placement(&map, &[2, 0], Some(VirtioNet::Tap)),
            Ok((vec![2, 0], 3))
        );
    }

    #[test]
    fn other_addresses_absent_nodes_and_other_wires_are_refused_by_name() {
        let map = FabricMap::parse(MIXED).unwrap();
        let wire = fabric_placement(&map, &[0], Some(VirtioNet::Wire)).unwrap_err();
        assert!(wire.contains("--virtio-net tap"), "{wire}");
        let absent = fabric_placement(&map, &[5], Some(VirtioNet::Tap)).unwrap_err();
        assert_eq!(absent, "node 5 is not on the fabric map");
        let elsewhere =
            FabricMap::parse("node 0 10.77.0.0:47000\nnode 1 127.0.0.1:7400\n").unwrap();
        let moved = fabric_placement(&elsewhere, &[0], Some(VirtioNet::Tap)).unwrap_err();
        assert!(
            moved.contains("node 1 at 127.0.0.1:7400") && moved.contains("10.77.0.1:47000"),
            "{moved}"
        );
    }
}
