//! nicbar-qemu: QEMU-backed NICs: the flashed firmware image running as the NIC core in
//! `qemu-system-riscv32 -machine virt` (or `qemu-system-riscv64` for a 64-bit image), one QEMU process per NIC, served to processes through the
//! same control socket as the emulator, so the user library opens ports on them unchanged.
//!
//! # Shape
//!
//! For each NIC ("node"), [`QemuFabric::spawn`] creates the guest's RAM and a pool of
//! `shared_abi::qemu::layout::PORT_REGIONS` memories per port as sealed memfds, writes the mailbox
//! configuration into the RAM, and starts QEMU with the RAM as its `memory-backend-file`
//! (`share=on`) and each port memory as the shared BAR of an `ivshmem-plain` PCI device (port
//! `p`'s pool: the functions of slot `0x10 + p`). The guest-physical memory map, the mailbox and the doorbell bytes
//! are `shared_abi::qemu::layout`; the wire's packet rings are `shared_abi::qemu::wire`. Then three kinds of thread run:
//!
//! - The hub (`hub`): reads every NIC's UART (console text, and doorbell bytes: an event for a
//!   sleeping process rings that process's eventfd), watches every NIC's doorbell eventfd
//!   (processes ring it when the NIC sleeps and they posted a token; the hub writes a byte to the
//!   NIC's UART, which wakes it), and is the switch: it moves packets from each NIC's transmit
//!   ring into the receive ring of the NIC they are for, and wakes a sleeping receiver. It sleeps
//!   in `epoll_wait` when there is nothing to move.
//! - The control thread (`control`): the control socket, speaking the control protocol
//!   (`nicbar_control`). Opening port `p` of unit `u` takes the next memory of port `p`'s pool
//!   that no process has held, writes its header, asks the firmware through the mailbox to open
//!   the port on it, and passes that memory, a fresh host doorbell and the NIC's doorbell back
//!   with `SCM_RIGHTS`.
//!   Memory registration, deregistration and allowing remote access are port commands too: the
//!   firmware keeps the regions and keys, and the control thread records the port's owner (the
//!   process `SO_PEERCRED` named) and the ranges it registered.
//! - The hub also serves the firmware's accesses to that memory (`Machine::serve_memory_access`):
//!   the board posts one access at a time in the mailbox with a bounce buffer of one packet's
//!   payload and rings a UART byte; the hub copies with `process_vm_readv`/`process_vm_writev`
//!   for the port's owner, inside its registered ranges only, and answers. Each access is a
//!   guest-to-host round trip.
//! - The QEMU processes, which die with the supervising thread (parent-death signal) and are
//!   powered off through the mailbox on [`QemuFabric::stop`].
//!
//! With [`QemuConfig::virtio_net`] set to [`VirtioNet::Wire`], each NIC also gets a virtio-net
//! device on one Ethernet segment of the fabric's NICs, and the firmware's packets go through it
//! as UDP/IPv4 datagrams (`shared_abi::qemu::net`) instead of through the switch.
//!
//! With [`VirtioNet::Tap`], each NIC's device is a tap interface someone else created and put on
//! a bridge (`<tap_prefix><node>`), and the NICs can be some nodes of a larger fabric
//! ([`QemuConfig::node_ids`], [`QemuConfig::node_count`], [`QemuConfig::fabric_key`]) whose
//! other nodes are daemon NICs (`nicctl emulate --fabric`) with their addresses on that bridge:
//! one fabric, QEMU and daemon NICs side by side, every node at `10.77.hi.lo:47000`
//! (`shared_abi::qemu::net::node_address`). The firmware finds a daemon's MAC by ARP
//! (`shared_abi::qemu::neighbour`).
//!
//! # Differences from the emulator
//!
//! A port's memories live as long as the QEMU NIC: QEMU cannot swap the memory behind a BAR of a
//! running guest (the virt machine's root bus has no hot-plug), so instead of a memfd made at
//! each open, as the emulator does, each port has a pool made at start. Every open takes a
//! memory no earlier owner of the port held, and a close retires it for good (its pages are
//! freed; a process that kept its descriptor and mapping writes only to itself, and no one reads
//! there). A port can therefore be opened `PORT_REGIONS` (8) times per NIC start; the next open
//! fails, saying so, until the NIC is restarted. The NIC sleeps in `wfi` and wakes on a UART
//! byte or its timer; it polls while busy and for 200 µs after.

#![deny(unsafe_code)]

mod control;
mod hub;
mod machine;
mod sys;

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared_abi::ids::PORTS_PER_NIC;
use shared_abi::qemu::layout::{GuestCounters, GuestFailure, GuestState, RAM_BASE};

use nicbar_control::server::ControlServer;
use nicbar_control::{ListenError, doorbell};
use nicbar_image::image::ImageFile;
use shared_abi::image::ImageTarget;

pub use hub::{HOLD_LIMIT, SwitchCounters};
pub use machine::region_layout;
use machine::{Machine, MachineSetup};

/// The QEMU binary looked for on the path for a riscv32imac image.
pub const DEFAULT_QEMU: &str = "qemu-system-riscv32";
/// The QEMU binary looked for on the path for a riscv64imac image.
pub const DEFAULT_QEMU_64: &str = "qemu-system-riscv64";

/// The QEMU binary (on the path) whose `virt` machine runs an image for `target`, or `None` for
/// a target QEMU virt cannot run (a Cortex-M image).
pub fn qemu_for_target(target: ImageTarget) -> Option<&'static str> {
    if target == ImageTarget::RISCV32IMAC {
        Some(DEFAULT_QEMU)
    } else if target == ImageTarget::RISCV64IMAC {
        Some(DEFAULT_QEMU_64)
    } else {
        None
    }
}
/// How long a NIC may take from QEMU's start to the firmware's RUNNING, by default.
pub const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a powered-off NIC may take to exit before it is killed.
const POWER_OFF_TIMEOUT: Duration = Duration::from_secs(3);

/// What to run.
#[derive(Debug)]
pub struct QemuConfig {
    /// The control socket to listen on.
    pub socket: PathBuf,
    /// The firmware image (verified when it was read).
    pub image: ImageFile,
    /// How many NICs, with node ids (and unit numbers) `0..nodes`.
    pub nodes: u16,
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// Where the UART sockets, the flat firmware and the QEMU logs go. `None`: a fresh directory
    /// under the control socket's directory, removed on stop.
    pub run_dir: Option<PathBuf>,
    /// Print the NICs' console lines on stdout as they come.
    pub echo_console: bool,
    /// How long each NIC may take to boot.
    pub boot_timeout: Duration,
    /// A group whose members may use the NICs too (by default only this user and root).
    pub allow_group: Option<u32>,
    /// Give each NIC a virtio-net device, and on which network ([`VirtioNet`]); `None`: none.
    pub virtio_net: Option<VirtioNet>,
    /// With [`VirtioNet::Tap`]: node `K`'s tap interface is this prefix and `K` in decimal.
    pub tap_prefix: String,
    /// The node id of each unit, in unit order (as many as `nodes`); `None`: `0..nodes`. Other
    /// ids than those need a wire that does not go through this process's switch
    /// ([`VirtioNet::Wire`] or [`VirtioNet::Tap`]).
    pub node_ids: Option<Vec<u16>>,
    /// How many nodes the fabric has (every node id is below it); `None`: `nodes`.
    pub node_count: Option<u16>,
    /// The key the fabric's packets are authenticated under (the daemons' `--fabric-key`, on a
    /// fabric shared with them); `None`: a key of this fabric's own, made at start.
    pub fabric_key: Option<[u8; 32]>,
}

/// The tap interfaces' prefix by default: node `K`'s is `nbtapK`.
pub const DEFAULT_TAP_PREFIX: &str = "nbtap";

/// The network of the NICs' virtio-net devices.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum VirtioNet {
    /// QEMU's user-mode network, one per NIC (no root, no host set-up). The firmware checks the
    /// device at boot with an ARP exchange with the network's gateway (on the console); the
    /// fabric's packets still go through the switch.
    User,
    /// The fabric's wire: every NIC on one Ethernet segment (QEMU's multicast socket network on
    /// the loopback interface, a group and port of this fabric's own), the firmware's packets in
    /// UDP/IPv4 datagrams through the device; the switch carries none.
    Wire,
    /// The fabric's wire on a tap interface per NIC ([`QemuConfig::tap_prefix`]), made and
    /// bridged beforehand by someone allowed to (as root, or in a network namespace of one's
    /// own): the NICs meet daemon NICs whose addresses are on the bridge. The switch carries
    /// none.
    Tap,
}

impl VirtioNet {
    /// Whether the firmware's packets go through the virtio-net devices (not the switch).
    pub fn is_wire(self) -> bool {
        matches!(self, Self::Wire | Self::Tap)
    }
}

impl QemuConfig {
    /// `nodes` NICs booting `image`, listening on `socket`, with the QEMU binary for the
    /// image's target ([`qemu_for_target`]) and the default boot timeout, a temporary run
    /// directory, and the console echoed.
    pub fn new(socket: impl Into<PathBuf>, image: ImageFile, nodes: u16) -> Self {
        let qemu = qemu_for_target(image.header().target).unwrap_or(DEFAULT_QEMU);
        Self {
            socket: socket.into(),
            image,
            nodes,
            qemu: PathBuf::from(qemu),
            run_dir: None,
            echo_console: true,
            boot_timeout: DEFAULT_BOOT_TIMEOUT,
            allow_group: None,
            virtio_net: None,
            tap_prefix: DEFAULT_TAP_PREFIX.to_owned(),
            node_ids: None,
            node_count: None,
            fabric_key: None,
        }
    }

    /// The node id of each unit.
    pub fn unit_nodes(&self) -> Vec<u16> {
        self.node_ids
            .clone()
            .unwrap_or_else(|| (0..self.nodes).collect())
    }

    /// The tap interface of node `node` ([`VirtioNet::Tap`]).
    pub fn tap_interface(&self, node: u16) -> String {
        format!("{}{node}", self.tap_prefix)
    }

    /// Checks the node ids, the fabric's size and the tap names against each other.
    fn check_nodes(&self) -> Result<(), QemuError> {
        let refuse = |reason: String| Err(QemuError::Nodes(reason));
        let ids = self.unit_nodes();
        if ids.len() != usize::from(self.nodes) {
            return refuse(format!("{} node ids for {} NICs", ids.len(), self.nodes));
        }
        let count = self.node_count.unwrap_or(self.nodes);
        if let Some(&node) = ids.iter().find(|&&node| node >= count) {
            return refuse(format!(
                "node {node} is not below the fabric's {count} nodes"
            ));
        }
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if let Some(pair) = sorted.windows(2).find(|pair| pair[0] == pair[1]) {
            return refuse(format!("node {} is named twice", pair[0]));
        }
        let identity = ids.iter().copied().eq(0..self.nodes);
        if !identity && !self.virtio_net.is_some_and(VirtioNet::is_wire) {
            return refuse(
                "node ids other than 0..N need the wire on virtio-net (`wire` or `tap`): the \
                 switch reaches units by node id"
                    .to_owned(),
            );
        }
        if self.virtio_net == Some(VirtioNet::Tap) {
            // Linux's interface names hold 15 bytes.
            let longest = ids
                .iter()
                .map(|&node| self.tap_interface(node))
                .max_by_key(String::len);
            if let Some(name) = longest.filter(|name| name.len() > 15 || self.tap_prefix.is_empty())
            {
                return refuse(format!(
                    "tap interface name {name:?} is empty or over 15 bytes"
                ));
            }
        }
        Ok(())
    }
}

/// Why the QEMU NICs did not start, or stopped.
#[derive(Debug)]
pub enum QemuError {
    /// No NICs asked for, or more than 256.
    NodeCount(u16),
    /// The node ids, the fabric's size or the tap names do not fit together (the reason says
    /// how).
    Nodes(String),
    /// The image cannot be booted on QEMU `virt`.
    Image(String),
    /// The control socket could not be set up.
    Socket(ListenError),
    /// A NIC's QEMU could not be started or connected to.
    Start {
        /// The node.
        node: u16,
        /// What failed.
        reason: String,
    },
    /// A NIC did not come up: its firmware refused, QEMU exited, or the boot timed out.
    Boot {
        /// The node.
        node: u16,
        /// What happened, with the end of QEMU's log.
        reason: String,
    },
    /// A NIC's QEMU exited while the fabric ran.
    Exited {
        /// The node.
        node: u16,
        /// How it ended, and why if the firmware said.
        reason: String,
    },
    /// A thread, eventfd or directory could not be created.
    Resources(io::Error),
}

impl fmt::Display for QemuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NodeCount(count) => write!(f, "a QEMU fabric runs 1 to 256 NICs, not {count}"),
            Self::Nodes(reason) => write!(f, "cannot place the QEMU NICs: {reason}"),
            Self::Image(reason) => write!(f, "cannot boot the image: {reason}"),
            Self::Socket(error) => write!(f, "{error}"),
            Self::Start { node, reason } => write!(f, "node {node}: cannot start QEMU: {reason}"),
            Self::Boot { node, reason } => write!(f, "node {node} did not boot: {reason}"),
            Self::Exited { node, reason } => write!(f, "node {node} stopped: {reason}"),
            Self::Resources(error) => write!(f, "cannot start the QEMU fabric: {error}"),
        }
    }
}

impl std::error::Error for QemuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Socket(error) => Some(error),
            Self::Resources(error) => Some(error),
            _ => None,
        }
    }
}

/// What one NIC reported about itself through its mailbox, and how its QEMU ended.
#[derive(Clone, Debug)]
pub struct NodeReport {
    /// The node id.
    pub node: u16,
    /// QEMU's process id.
    pub pid: u32,
    /// The firmware's state.
    pub state: GuestState,
    /// Why it refused to run, when the state is FAILED.
    pub failure: GuestFailure,
    /// Bytes of stack the firmware has.
    pub stack_size: u32,
    /// Most stack the main loop used, in bytes (measured: the stack is painted).
    pub stack_high_water: u32,
    /// Most stack used while booting, in bytes.
    pub stack_boot_high_water: u32,
    /// The firmware's counters.
    pub counters: GuestCounters,
    /// Guest-physical address and length of each port's window (0 where none was found).
    pub windows: [(u32, u32); PORTS_PER_NIC],
    /// `mcause`, `mepc` and `mtval` if the firmware trapped.
    pub trap: Option<(u32, u32, u32)>,
    /// QEMU's exit status, if it has exited.
    pub exit: Option<std::process::ExitStatus>,
}

impl fmt::Display for NodeReport {
    /// One line of `key=value` pairs (the end-to-end check parses it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.counters;
        write!(
            f,
            "node={} state={} stack_size={} stack_main={} stack_boot={} wakeups={} \
             packets_transmitted={} packets_received={} transmit_full={} receive_errors={} \
             barriers_completed={} barriers_failed={} messages_delivered={} \
             malformed_packets={} tokens_rejected={} uart_dropped={} memory_accesses={} \
             memory_faults={} memory_timeouts={}",
            self.node,
            state_name(self.state),
            self.stack_size,
            self.stack_high_water,
            self.stack_boot_high_water,
            c.wakeups.get(),
            c.packets_transmitted.get(),
            c.packets_received.get(),
            c.transmit_full.get(),
            c.receive_errors.get(),
            c.barriers_completed.get(),
            c.barriers_failed.get(),
            c.messages_delivered.get(),
            c.malformed_packets.get(),
            c.tokens_rejected.get(),
            c.uart_dropped.get(),
            c.memory_accesses.get(),
            c.memory_faults.get(),
            c.memory_timeouts.get(),
        )?;
        if let Some((cause, pc, value)) = self.trap {
            write!(
                f,
                " trap_cause={cause:#x} trap_pc={pc:#010x} trap_value={value:#x}"
            )?;
        }
        match self.exit.and_then(|status| status.code()) {
            Some(code) => write!(f, " exit={code}"),
            None if self.exit.is_some() => write!(f, " exit=signal"),
            None => write!(f, " exit=running"),
        }
    }
}

fn state_name(state: GuestState) -> &'static str {
    match state {
        GuestState::BOOTING => "booting",
        GuestState::RUNNING => "running",
        GuestState::FAILED => "failed",
        GuestState::STOPPED => "stopped",
        _ => "unknown",
    }
}

/// The reports of a stopped fabric.
#[derive(Clone, Debug)]
pub struct FabricReport {
    /// One per node.
    pub nodes: Vec<NodeReport>,
    /// What the switch did.
    pub switch: SwitchCounters,
}

/// Running QEMU NICs. Dropping it stops them (powered off, then killed if they linger) and
/// removes the socket and the temporary run directory.
#[derive(Debug)]
pub struct QemuFabric {
    socket: PathBuf,
    run_dir: PathBuf,
    remove_run_dir: bool,
    machines: Vec<Arc<Machine>>,
    /// Stops the control thread.
    stop: Arc<OwnedFd>,
    /// Stops the hub, after the NICs powered off.
    hub_stop: Arc<OwnedFd>,
    hub: Option<JoinHandle<SwitchCounters>>,
    control: Option<JoinHandle<()>>,
    report: Option<FabricReport>,
    /// The multicast group and port of the NICs' Ethernet segment ([`VirtioNet::Wire`]).
    segment: Option<std::net::SocketAddrV4>,
}

impl QemuFabric {
    /// Boots `config.nodes` NICs and starts serving the control socket. Returns once every NIC's
    /// firmware says it runs.
    ///
    /// Every QEMU started here is killed if the thread that called this exits; call it from a
    /// thread that outlives the fabric (the main thread of a daemon, the thread of a test).
    ///
    /// # Errors
    /// [`QemuError`] says what failed; whatever was started is stopped again.
    pub fn spawn(config: QemuConfig) -> Result<Self, QemuError> {
        if config.nodes == 0 || config.nodes > 256 {
            return Err(QemuError::NodeCount(config.nodes));
        }
        config.check_nodes()?;
        let header = config.image.header();
        if qemu_for_target(header.target).is_none() {
            return Err(QemuError::Image(format!(
                "QEMU virt runs riscv32imac and riscv64imac images; this one is for {}",
                header.target
            )));
        }
        let (load, entry) = (header.load_address.get(), header.entry_point.get());
        if load != u64::from(RAM_BASE) || entry != load {
            return Err(QemuError::Image(format!(
                "QEMU virt starts a flat image at its RAM base {RAM_BASE:#x}; this one loads at \
                 {load:#x} and starts at {entry:#x}"
            )));
        }
        let listener = nicbar_control::listen(&config.socket).map_err(QemuError::Socket)?;
        if let Some(gid) = config.allow_group {
            nicbar_control::share_with_group(&config.socket, gid).map_err(|source| {
                QemuError::Socket(ListenError::Socket {
                    socket: config.socket.clone(),
                    source,
                })
            })?;
        }
        let (run_dir, remove_run_dir) = match config.run_dir.clone() {
            Some(dir) => (dir, false),
            None => (temporary_run_dir(&config.socket), true),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&run_dir)
            .map_err(QemuError::Resources)?;
        let stop = Arc::new(doorbell::new().map_err(QemuError::Resources)?);
        let hub_stop = Arc::new(doorbell::new().map_err(QemuError::Resources)?);
        let mut fabric = Self {
            socket: config.socket.clone(),
            run_dir,
            remove_run_dir,
            machines: Vec::new(),
            stop,
            hub_stop,
            hub: None,
            control: None,
            report: None,
            segment: None,
        };
        fabric.start(&config, listener)?;
        Ok(fabric)
    }

    fn start(
        &mut self,
        config: &QemuConfig,
        listener: std::os::unix::net::UnixListener,
    ) -> Result<(), QemuError> {
        let kernel = self.run_dir.join("firmware.bin");
        std::fs::write(&kernel, config.image.payload()).map_err(QemuError::Resources)?;
        let boot_stamp = nicbar_control::server::boot_stamp();
        // The NICs of a QEMU fabric of its own talk only among themselves: a key of their own,
        // made here, authenticates their packets. On a fabric shared with daemons, the key is
        // the fabric's.
        let fabric_key = match config.fabric_key {
            Some(key) => key,
            None => nicbar_control::server::random_key().map_err(QemuError::Resources)?,
        };
        // The segment's UDP port: one the kernel found free (another fabric's segment has its
        // own; a stray frame would fail authentication under this fabric's key anyway).
        let segment_port = std::net::UdpSocket::bind(("127.0.0.1", 0))
            .and_then(|socket| socket.local_addr())
            .map_err(QemuError::Resources)?
            .port();
        if config.virtio_net == Some(VirtioNet::Wire) {
            self.segment = Some(std::net::SocketAddrV4::new(
                machine::SEGMENT_GROUP,
                segment_port,
            ));
        }
        let mut uarts = Vec::new();
        let node_ids = config.unit_nodes();
        for &node in &node_ids {
            let (machine, uart) = Machine::start(&MachineSetup {
                node,
                node_count: config.node_count.unwrap_or(config.nodes),
                qemu: &config.qemu,
                kernel: &kernel,
                run_dir: &self.run_dir,
                boot_stamp,
                fabric_key: &fabric_key,
                virtio_net: config.virtio_net.map(|kind| match kind {
                    VirtioNet::User => machine::Network::User,
                    VirtioNet::Wire => machine::Network::Segment(segment_port),
                    VirtioNet::Tap => machine::Network::Tap(config.tap_interface(node)),
                }),
            })?;
            self.machines.push(Arc::new(machine));
            uarts.push(uart);
        }
        let console = Arc::new(hub::Console::new(node_ids, config.echo_console));
        self.hub = Some(
            hub::spawn(hub::HubSetup {
                machines: self.machines.clone(),
                uarts,
                stop: self.hub_stop.clone(),
                console,
            })
            .map_err(QemuError::Resources)?,
        );
        let deadline = Instant::now() + config.boot_timeout;
        for machine in &self.machines {
            machine.await_running(deadline)?;
        }
        let mut control = ControlServer::new(
            listener,
            self.stop.clone(),
            control::QemuMachines {
                machines: self.machines.clone(),
            },
        )
        .map_err(QemuError::Resources)?;
        if let Some(gid) = config.allow_group {
            control = control.allow_group(gid);
        }
        self.control = Some(
            std::thread::Builder::new()
                .name("qemu-control".to_owned())
                .spawn(move || control.run())
                .map_err(QemuError::Resources)?,
        );
        Ok(())
    }

    /// The control socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The multicast group and port that carry the NICs' Ethernet segment, with
    /// [`VirtioNet::Wire`]: a datagram sent there is a raw Ethernet frame every NIC receives.
    pub fn virtio_segment(&self) -> Option<std::net::SocketAddrV4> {
        self.segment
    }

    /// The run directory (UART sockets, the flat firmware, one QEMU log per node).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Each NIC's report as it stands.
    pub fn reports(&self) -> Vec<NodeReport> {
        self.machines
            .iter()
            .map(|machine| machine.report())
            .collect()
    }

    /// Checks that every NIC's QEMU still runs.
    ///
    /// # Errors
    /// [`QemuError::Exited`] for the first that does not, with the firmware's trap if it trapped
    /// and the end of QEMU's log.
    pub fn check_running(&self) -> Result<(), QemuError> {
        for machine in &self.machines {
            if let Some(status) = machine.exited() {
                return Err(QemuError::Exited {
                    node: machine.node,
                    reason: machine.describe_exit(status),
                });
            }
        }
        Ok(())
    }

    /// Stops serving, powers every NIC off (killing those that do not exit in time), and
    /// returns their final reports.
    pub fn stop(mut self) -> FabricReport {
        self.shut_down();
        self.report.take().unwrap_or(FabricReport {
            nodes: Vec::new(),
            switch: SwitchCounters::default(),
        })
    }

    fn shut_down(&mut self) {
        if self.report.is_some() {
            return;
        }
        doorbell::ring(&*self.stop);
        if let Some(control) = self.control.take() {
            let _ = control.join();
        }
        // Power off while the hub still runs, so a NIC's last console lines are read.
        for machine in &self.machines {
            machine.request_power_off();
        }
        for machine in &self.machines {
            machine.await_exit(POWER_OFF_TIMEOUT);
        }
        doorbell::ring(&*self.hub_stop);
        let switch = self
            .hub
            .take()
            .and_then(|hub| hub.join().ok())
            .unwrap_or_default();
        let nodes = self.reports();
        let _ = std::fs::remove_file(&self.socket);
        if self.remove_run_dir {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
        self.report = Some(FabricReport { nodes, switch });
    }
}

impl Drop for QemuFabric {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A fresh directory beside the control socket, named after this process.
fn temporary_run_dir(socket: &Path) -> PathBuf {
    let parent = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(std::env::temp_dir, Path::to_path_buf);
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    parent.join(format!("qemu-{}-{n}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_abi::image::ImageHeader;

    /// A configuration of `nodes` NICs booting a small valid image (never started here).
    fn config(nodes: u16) -> QemuConfig {
        let payload = [0u8; 16];
        let header = ImageHeader::new(
            ImageTarget::RISCV32IMAC,
            u64::from(RAM_BASE),
            u64::from(RAM_BASE),
            &payload,
        )
        .unwrap();
        let mut bytes = header.to_bytes().to_vec();
        bytes.extend_from_slice(&payload);
        let image = ImageFile::from_bytes(Path::new("test.img"), bytes).unwrap();
        QemuConfig::new("control.sock", image, nodes)
    }

    fn refusal(config: &QemuConfig) -> String {
        match config.check_nodes() {
            Err(QemuError::Nodes(reason)) => reason,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn the_default_nodes_are_0_to_n_on_any_wire() {
        let config = config(3);
        assert_eq!(config.unit_nodes(), vec![0, 1, 2]);
        assert!(config.check_nodes().is_ok());
    }

    #[test]
    fn some_nodes_of_a_larger_fabric_on_taps_are_accepted() {
        let mut config = config(2);
        config.virtio_net = Some(VirtioNet::Tap);
        config.node_ids = Some(vec![0, 2]);
        config.node_count = Some(4);
        assert!(config.check_nodes().is_ok());
        assert_eq!(config.tap_interface(2), "nbtap2");
    }

    #[test]
    fn node_ids_that_do_not_fit_are_refused_saying_why() {
        let mut config = config(2);
        config.virtio_net = Some(VirtioNet::Tap);
        config.node_ids = Some(vec![0]);
        assert_eq!(refusal(&config), "1 node ids for 2 NICs");
        config.node_ids = Some(vec![0, 4]);
        config.node_count = Some(4);
        assert_eq!(refusal(&config), "node 4 is not below the fabric's 4 nodes");
        config.node_ids = Some(vec![1, 1]);
        assert_eq!(refusal(&config), "node 1 is named twice");
        config.node_ids = Some(vec![0, 2]);
        config.tap_prefix = "a-long-tap-name-".to_owned();
        assert!(refusal(&config).contains("over 15 bytes"));
        // Through the switch, units are found by node id.
        config.virtio_net = None;
        assert!(refusal(&config).contains("need the wire on virtio-net"));
    }
}
