//! nicbar-emulator: the emulated NIC, a daemon that runs one or more NICs ("units", as GM's boards) on a Linux host
//! with the real firmware core, serving real processes through shared memory.
//!
//! # Shape
//!
//! - NIC threads ([`nic_thread`]), as many as [`EmulatorConfig::threads`] says, each run the
//!   units given to it ([`unit`]: a [`firmware::Nic`] each) over one epoll loop: the units'
//!   wake-up eventfds (commands, and the NIC doorbell processes ring), their UDP sockets, the
//!   thread's own wake-up (packets from units of other threads, through lock-free inboxes), and a
//!   timeout for the firmware's next deadline. An idle thread polls or sleeps, as its
//!   [`IdlePolicy`] says.
//! - One control thread (the control protocol's server, over the units as `control` presents them) owns the Unix
//!   socket. Opening a port is the driver's only job, as in GM: the control thread creates the
//!   port's region (a sealed memfd holding the header, the send, receive and event rings, and the
//!   DMA arena: [`RegionLayout::standard`]), has the unit open the port, and passes the region and
//!   two doorbells back with `SCM_RIGHTS` (the control protocol, `nicbar_control`). From then on the process and the NIC talk
//!   through the mapping alone. The process keeps its connection open for the port's life; when it
//!   closes (the process exited or died), the port closes, and the firmware tells the peers.
//! - The wire ([`wire`]): a packet for the unit's own node loops back; one for another unit of the
//!   daemon goes into that unit's inbox; one for a node on the fabric map ([`fabric`]) goes out of
//!   the unit's UDP socket. The fault injector ([`fault`]) can sit in front of all of it.
//!
//! # The socket
//!
//! The daemon listens where [`EmulatorConfig::socket`] says; `nicctl emulate` defaults it to
//! `nicbar_control::socket_path()` (`$NICBAR_SOCKET`, else a per-user runtime directory), where
//! the library looks too.
//!
//! This crate is a backend: it stands on the firmware, the ABI and the control protocol, and on
//! nothing of the library or of another backend. Command-line parsing lives in `nicctl`.
//!
//! [`RegionLayout::standard`]: shared_abi::region::RegionLayout::standard
#![forbid(unsafe_code)]

mod control;
pub mod fabric;
pub mod fault;
mod hal;
mod idle;
pub mod key;
mod nic_thread;
mod read_ahead;
mod udp;
mod unit;
mod wire;
mod write_behind;

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use nicbar_control::server::ControlServer;
use nicbar_control::{ListenError, doorbell};
use shared_abi::ids::NodeId;

pub use fabric::{FabricError, FabricMap};
pub use fault::FaultConfig;
pub use firmware::auth::FabricKey;
pub use idle::{IdlePolicy, default_threads};

/// How long a unit stays awake after its last work, by default.
pub const DEFAULT_IDLE_LINGER: Duration = Duration::from_micros(50);

/// The shape of every port region the daemon creates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionShape {
    /// Send ring slots (a power of two): the process's send tokens.
    pub send_entries: u32,
    /// Receive ring slots (a power of two).
    pub receive_entries: u32,
    /// Event ring slots (a power of two). With at least `send_entries + receive_entries` plus a
    /// few barrier tokens, every event the NIC owes a process fits at once.
    pub event_entries: u32,
    /// DMA arena bytes (rounded up to whole pages). The region is a memory file the kernel
    /// fills in page by page as it is touched, so a large arena costs only what a process uses.
    pub arena_len: usize,
}

impl Default for RegionShape {
    fn default() -> Self {
        Self {
            send_entries: 64,
            receive_entries: 128,
            event_entries: 256,
            // Room for GM's size classes to 1 MiB messages and beyond (class 21 is a 2 MiB
            // buffer; a ping-pong keeps a few of them), as a GM program expects of DMA memory.
            arena_len: 64 << 20,
        }
    }
}

/// One NIC of the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitConfig {
    /// Its node id on the fabric.
    pub node: NodeId,
    /// The UDP address it binds, for nodes of other daemons to reach it. `None`: reachable only
    /// from units of the same daemon.
    pub address: Option<SocketAddr>,
}

/// What the emulator runs.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// The control socket to listen on.
    pub socket: PathBuf,
    /// The NICs, by unit number.
    pub units: Vec<UnitConfig>,
    /// Where the nodes of other daemons are.
    pub fabric: FabricMap,
    /// The fault injector, if any.
    pub faults: Option<FaultConfig>,
    /// The firmware's tunables.
    pub nic: firmware::Config,
    /// The shape of port regions.
    pub region: RegionShape,
    /// How long a sleeping NIC thread stays awake after its last work before it sleeps. Within
    /// it, processes post tokens without ringing the doorbell; it costs a core's time while it
    /// lasts.
    pub idle_linger: Duration,
    /// How many NIC threads run the units (unit `u` on thread `u % threads`); `None`:
    /// [`default_threads`] for the cores this process may run on. At most one per unit.
    pub threads: Option<usize>,
    /// CPUs to pin the NIC threads to, thread `t` on `cpus[t % cpus.len()]`; empty: not pinned.
    pub cpus: Vec<usize>,
    /// What an idle NIC thread does.
    pub idle: IdlePolicy,
    /// The NIC threads' niceness (-20 to 19; `None`: the daemon's own). Below the processes',
    /// a NIC thread that wakes takes a core from a computing process at once, as an interrupt
    /// does, instead of waiting for that process's time slice to end: on a host with no core to
    /// spare, that is when a non-blocking collective progresses. Lowering it needs
    /// `CAP_SYS_NICE` (or an `RLIMIT_NICE`); refused, the threads run at the daemon's.
    pub nice: Option<i32>,
    /// A group whose members may use the daemon too (by default only its own user and root).
    pub allow_group: Option<u32>,
    /// Whether packets on the UDP wire are authenticated ([`firmware::auth`]; packets between
    /// units of the daemon never leave its memory and carry no code either way). The key is
    /// `nic.fabric_key`; when it is `None`, a daemon whose units have no UDP address makes a
    /// random one, and a daemon on a UDP fabric refuses to start (its daemons must share a
    /// key: [`key::read_key`]). `false` only to measure what authentication costs: every daemon of
    /// the fabric must agree, and then nothing on the wire is authenticated.
    pub authenticate: bool,
}

impl EmulatorConfig {
    /// Checks what can be checked before anything is made: the number of units (1 to 256),
    /// threads (1 to the units), node ids given twice, the fault injector's ranges, and the
    /// firmware's timers (a retransmission timeout above zero, a give-up time longer than it).
    /// [`Emulator::spawn`] runs it first; a front end runs it before it prints anything.
    ///
    /// # Errors
    /// [`EmulatorError::UnitCount`], [`EmulatorError::ThreadCount`],
    /// [`EmulatorError::DuplicateNode`], [`EmulatorError::Faults`], [`EmulatorError::Timers`].
    pub fn validate(&self) -> Result<(), EmulatorError> {
        if self.units.is_empty() || self.units.len() > 256 {
            return Err(EmulatorError::UnitCount(self.units.len()));
        }
        if let Some(threads) = self.threads
            && !(1..=self.units.len()).contains(&threads)
        {
            return Err(EmulatorError::ThreadCount {
                threads,
                units: self.units.len(),
            });
        }
        for (index, unit) in self.units.iter().enumerate() {
            if self.units[..index].iter().any(|u| u.node == unit.node) {
                return Err(EmulatorError::DuplicateNode {
                    node: unit.node.get(),
                });
            }
        }
        if let Some(faults) = self.faults.as_ref() {
            faults.validate().map_err(EmulatorError::Faults)?;
        }
        let (retransmit, give_up) = (self.nic.retransmit_timeout, self.nic.give_up_after);
        if retransmit.is_zero() {
            return Err(EmulatorError::Timers(
                "the retransmission timeout must be above zero".to_owned(),
            ));
        }
        if give_up <= retransmit {
            return Err(EmulatorError::Timers(format!(
                "the give-up time {give_up:?} must be longer than the retransmission timeout \
                 {retransmit:?}"
            )));
        }
        Ok(())
    }

    /// `units` NICs with node ids `0..units`, all in this daemon, listening on `socket`.
    pub fn in_process(socket: impl Into<PathBuf>, units: u16) -> Self {
        Self {
            socket: socket.into(),
            units: (0..units)
                .map(|node| UnitConfig {
                    node: NodeId::new(node),
                    address: None,
                })
                .collect(),
            fabric: FabricMap::new(),
            faults: None,
            nic: firmware::Config::default(),
            region: RegionShape::default(),
            idle_linger: DEFAULT_IDLE_LINGER,
            threads: None,
            cpus: Vec::new(),
            idle: IdlePolicy::default(),
            nice: None,
            allow_group: None,
            authenticate: true,
        }
    }

    /// The NICs `nodes` of `fabric`, each bound to its address on the map.
    ///
    /// # Errors
    /// [`EmulatorError::NotOnFabric`] for a node the map does not name.
    pub fn on_fabric(
        socket: impl Into<PathBuf>,
        fabric: FabricMap,
        nodes: &[NodeId],
    ) -> Result<Self, EmulatorError> {
        let units = nodes
            .iter()
            .map(|&node| {
                fabric
                    .address(node)
                    .map(|address| UnitConfig {
                        node,
                        address: Some(address),
                    })
                    .ok_or(EmulatorError::NotOnFabric { node: node.get() })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            units,
            fabric,
            ..Self::in_process(socket, 0)
        })
    }
}

/// Why the emulator did not start.
#[derive(Debug)]
pub enum EmulatorError {
    /// No units to run, or more than 256.
    UnitCount(usize),
    /// No NIC threads, or more than units.
    ThreadCount {
        /// Threads asked for.
        threads: usize,
        /// Units to run.
        units: usize,
    },
    /// Two units have the same node id.
    DuplicateNode {
        /// The node id.
        node: u16,
    },
    /// A node was asked for that the fabric map does not name.
    NotOnFabric {
        /// The node id.
        node: u16,
    },
    /// The fault injector's configuration is out of range.
    Faults(String),
    /// The firmware's timers contradict each other (a zero retransmission timeout, or a give-up
    /// time no longer than it).
    Timers(String),
    /// Units on a UDP fabric, but no fabric key to authenticate their packets with.
    NoFabricKey,
    /// The control socket could not be set up, or another daemon answers on it.
    Listen(ListenError),
    /// A unit's UDP address could not be bound.
    Bind {
        /// The node.
        node: u16,
        /// The address.
        address: SocketAddr,
        /// The error.
        source: io::Error,
    },
    /// A thread, eventfd or epoll instance could not be created.
    Resources(io::Error),
}

impl std::fmt::Display for EmulatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnitCount(count) => {
                write!(f, "an emulator runs 1 to 256 units, not {count}")
            }
            Self::ThreadCount { threads, units } => write!(
                f,
                "{threads} NIC threads for {units} units: give 1 to {units} (a thread runs \
                 whole NICs)"
            ),
            Self::DuplicateNode { node } => write!(f, "node {node} is given to two units"),
            Self::NotOnFabric { node } => write!(f, "node {node} is not on the fabric map"),
            Self::Faults(reason) => write!(f, "fault injector: {reason}"),
            Self::Timers(reason) => write!(f, "firmware timers: {reason}"),
            Self::NoFabricKey => write!(
                f,
                "a fabric over UDP needs a key its daemons share: make one with `nicctl keygen \
                 FILE` and give every daemon --fabric-key FILE"
            ),
            Self::Listen(error) => error.fmt(f),
            Self::Bind {
                node,
                address,
                source,
            } => write!(f, "node {node} cannot bind UDP address {address}: {source}"),
            Self::Resources(source) => write!(f, "cannot start the emulator: {source}"),
        }
    }
}

impl std::error::Error for EmulatorError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Listen(error) => error.source(),
            Self::Bind { source, .. } | Self::Resources(source) => Some(source),
            _ => None,
        }
    }
}

/// The emulator.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// Starts the emulator's threads in this process: the NIC threads and the control thread,
    /// listening on `config.socket`. It runs until the handle is dropped or stopped.
    ///
    /// # Errors
    /// [`EmulatorError`] says what could not be set up; nothing keeps running then.
    pub fn spawn(mut config: EmulatorConfig) -> Result<EmulatorHandle, EmulatorError> {
        if !config.authenticate {
            config.nic.fabric_key = None;
        } else if config.nic.fabric_key.is_none() {
            if config.units.iter().any(|unit| unit.address.is_some()) {
                return Err(EmulatorError::NoFabricKey);
            }
            let key = nicbar_control::server::random_key().map_err(EmulatorError::Resources)?;
            config.nic.fabric_key = Some(firmware::auth::FabricKey::new(key));
        }
        config.validate()?;
        let mut sockets = Vec::new();
        for unit in &config.units {
            let udp = match unit.address {
                Some(address) => {
                    Some(
                        wire::bind_udp(address).map_err(|source| EmulatorError::Bind {
                            node: unit.node.get(),
                            address,
                            source,
                        })?,
                    )
                }
                None => None,
            };
            sockets.push(udp);
        }
        let listener = nicbar_control::listen(&config.socket).map_err(EmulatorError::Listen)?;
        let started = Self::start(&config, sockets, listener);
        if started.is_err() {
            let _ = std::fs::remove_file(&config.socket);
        }
        started
    }

    fn start(
        config: &EmulatorConfig,
        sockets: Vec<Option<std::net::UdpSocket>>,
        listener: UnixListener,
    ) -> Result<EmulatorHandle, EmulatorError> {
        let mut fabric = config.fabric.clone();
        for unit in &config.units {
            if let Some(address) = unit.address {
                fabric.insert(unit.node, address);
            }
        }
        let nodes = node_names(config, &fabric);
        let fabric = Arc::new(fabric);
        let wakes = config
            .units
            .iter()
            .map(|_| doorbell::new().map(Arc::new))
            .collect::<io::Result<Vec<_>>>()
            .map_err(EmulatorError::Resources)?;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let plan = nic_thread::ThreadPlan {
            threads: config
                .threads
                .unwrap_or_else(|| default_threads(config.units.len(), cores)),
            cpus: config.cpus.clone(),
            idle: config.idle,
            linger: config.idle_linger,
            nice: config.nice,
            cores,
        };
        let thread_wakes =
            nic_thread::thread_wakes(plan.threads).map_err(EmulatorError::Resources)?;
        let inboxes: Vec<_> = (0..config.units.len())
            .map(|unit| Arc::new(wire::Inbox::new(thread_wakes[plan.thread_of(unit)].clone())))
            .collect();
        let local = Arc::new(wire::LocalFabric::new(
            config
                .units
                .iter()
                .zip(&inboxes)
                .map(|(unit, inbox)| (unit.node, inbox.clone()))
                .collect(),
        ));
        let origin = std::time::Instant::now();
        let boot_nonce = nicbar_control::server::boot_stamp();
        let mut setups = Vec::new();
        // Every unit's sessions draw their nonces from bytes of the operating system's random
        // source, fresh at each start, so traffic of an earlier run can never be taken again.
        let boot_entropy = || -> Result<[u8; 16], EmulatorError> {
            let mut bytes = [0u8; 16];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut source| std::io::Read::read_exact(&mut source, &mut bytes))
                .map_err(EmulatorError::Resources)?;
            Ok(bytes)
        };
        for (index, ((unit, udp), (wake, inbox))) in config
            .units
            .iter()
            .zip(sockets)
            .zip(wakes.into_iter().zip(inboxes))
            .enumerate()
        {
            setups.push(unit::UnitSetup {
                unit: index as u8,
                node: unit.node,
                address: unit.address,
                udp,
                wake,
                inbox,
                local: local.clone(),
                fabric: fabric.clone(),
                faults: config.faults,
                nic: config.nic,
                origin,
                boot_nonce,
                boot_entropy: boot_entropy()?,
                idle: config.idle,
            });
        }
        let units =
            nic_thread::spawn(setups, thread_wakes, &plan).map_err(EmulatorError::Resources)?;
        let stop = Arc::new(doorbell::new().map_err(EmulatorError::Resources)?);
        let mut control = ControlServer::new(
            listener,
            stop.clone(),
            control::EmulatedUnits {
                units,
                region: config.region,
                nodes,
                fault_seed: config.faults.filter(FaultConfig::is_active).map(|f| f.seed),
            },
        )
        .map_err(EmulatorError::Resources)?;
        if let Some(gid) = config.allow_group {
            nicbar_control::share_with_group(&config.socket, gid).map_err(|source| {
                EmulatorError::Listen(ListenError::Socket {
                    socket: config.socket.clone(),
                    source,
                })
            })?;
            control = control.allow_group(gid);
        }
        let thread = std::thread::Builder::new()
            .name("nic-control".to_owned())
            .spawn(move || control.run())
            .map_err(EmulatorError::Resources)?;
        Ok(EmulatorHandle {
            socket: config.socket.clone(),
            stop,
            thread: Some(thread),
        })
    }
}

/// A running emulator. Dropping it stops the emulator and removes its socket.
#[derive(Debug)]
pub struct EmulatorHandle {
    socket: PathBuf,
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl EmulatorHandle {
    /// The control socket the emulator listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops the emulator and waits for its threads. Open ports die with it.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(thread) = self.thread.take() {
            doorbell::ring(&*self.stop);
            let _ = thread.join();
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

impl Drop for EmulatorHandle {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// Every node the daemon knows, by node id, named by `nicbar_control::naming`: its units (those
/// with a UDP address as the fabric map names them, the others `<host name>:<unit>`) and the
/// map's other nodes.
fn node_names(config: &EmulatorConfig, fabric: &FabricMap) -> Vec<nicbar_control::NodeName> {
    let host = nicbar_control::naming::host_name();
    let mut nodes = std::collections::BTreeMap::new();
    for (node, address) in fabric.iter() {
        nodes.insert(
            node.get(),
            nicbar_control::naming::fabric_node(node.get(), address, fabric.name(node)),
        );
    }
    for (unit, config) in config.units.iter().enumerate() {
        if config.address.is_none() {
            let node = config.node.get();
            nodes.insert(
                node,
                nicbar_control::naming::unit_node(&host, unit as u8, node),
            );
        }
    }
    nodes.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_by_the_map_their_address_or_host_and_unit() {
        let map = FabricMap::parse("node 1 127.0.0.1:7401 alpha\nnode 2 127.0.0.2:7402\n").unwrap();
        let mut config =
            EmulatorConfig::on_fabric("/unused.sock", map.clone(), &[NodeId::new(1)]).unwrap();
        config.units.push(UnitConfig {
            node: NodeId::new(5),
            address: None,
        });
        let host = nicbar_control::naming::host_name();
        let names: Vec<(u16, String)> = node_names(&config, &map)
            .into_iter()
            .map(|node| (node.node, node.name))
            .collect();
        assert_eq!(
            names,
            [
                (1, "alpha".to_owned()),
                (2, "127.0.0.2:7402".to_owned()),
                (5, format!("{host}:1")),
            ]
        );
    }

    /// The niceness of every NIC thread of this process, from `/proc/self/task/*/stat` (its
    /// 19th field, counted after the parenthesised name).
    fn nic_thread_niceness() -> Vec<i32> {
        let mut found = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            let Some((name, rest)) = stat.split_once(") ") else {
                continue;
            };
            if name.contains("(nic-thread-") {
                found.push(rest.split_whitespace().nth(16).unwrap().parse().unwrap());
            }
        }
        found
    }

    #[test]
    fn the_nic_threads_take_the_niceness_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = EmulatorConfig::in_process(dir.path().join("nice.sock"), 2);
        config.threads = Some(2);
        // Raising niceness needs no privilege; no other test sets it, so the threads at 7 are
        // this daemon's.
        config.nice = Some(7);
        let daemon = Emulator::spawn(config).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut niceness = nic_thread_niceness();
        while niceness.iter().filter(|&&nice| nice == 7).count() < 2
            && std::time::Instant::now() < deadline
        {
            std::thread::yield_now();
            niceness = nic_thread_niceness();
        }
        assert_eq!(
            niceness.iter().filter(|&&nice| nice == 7).count(),
            2,
            "NIC threads' niceness: {niceness:?}"
        );
        daemon.stop();
    }

    #[test]
    fn one_daemon_per_socket_and_foreign_files_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sub").join("control.sock");
        let first = Emulator::spawn(EmulatorConfig::in_process(&socket, 2)).unwrap();
        assert!(matches!(
            Emulator::spawn(EmulatorConfig::in_process(&socket, 1)),
            Err(EmulatorError::Listen(ListenError::AlreadyRunning { .. }))
        ));
        first.stop();
        assert!(!socket.exists(), "the socket is removed on stop");
        // A stale socket file (no daemon behind it) is replaced.
        drop(UnixListener::bind(&socket).unwrap());
        let second = Emulator::spawn(EmulatorConfig::in_process(&socket, 1)).unwrap();
        drop(second);
        let file = dir.path().join("precious");
        std::fs::write(&file, b"keep").unwrap();
        assert!(matches!(
            Emulator::spawn(EmulatorConfig::in_process(&file, 1)),
            Err(EmulatorError::Listen(ListenError::Socket { .. }))
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        assert!(matches!(
            Emulator::spawn(EmulatorConfig::in_process(dir.path().join("x.sock"), 0)),
            Err(EmulatorError::UnitCount(0))
        ));
        let mut zero_timer = EmulatorConfig::in_process(dir.path().join("y.sock"), 1);
        zero_timer.nic.retransmit_timeout = Duration::ZERO;
        assert!(matches!(
            Emulator::spawn(zero_timer),
            Err(EmulatorError::Timers(_))
        ));
        let mut short_give_up = EmulatorConfig::in_process(dir.path().join("z.sock"), 1);
        short_give_up.nic.give_up_after = short_give_up.nic.retransmit_timeout;
        let error = short_give_up.validate().unwrap_err().to_string();
        assert!(
            error.contains("must be longer than the retransmission timeout"),
            "{error}"
        );
        assert!(!dir.path().join("y.sock").exists() && !dir.path().join("z.sock").exists());
    }
}
