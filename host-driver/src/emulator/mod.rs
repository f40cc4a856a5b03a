//! The emulated NIC: a daemon that runs one or more NICs ("units", as GM's boards) on a Linux host
//! with the real firmware core, serving real processes through shared memory.
//!
//! # Shape
//!
//! - One thread per unit ([`unit`]) runs a [`firmware::Nic`] over an epoll loop: its wake-up
//!   eventfd (commands, packets from the daemon's other units, and the NIC doorbell processes
//!   ring), its UDP socket, and a timeout for the firmware's next deadline. An idle unit sleeps.
//! - One control thread (`server`, over the units as `control` presents them) owns the Unix
//!   socket. Opening a port is the driver's only job, as in GM: the control thread creates the
//!   port's region (a sealed memfd holding the header, the send, receive and event rings, and the
//!   DMA arena: [`RegionLayout::standard`]), has the unit open the port, and passes the region and
//!   two doorbells back with `SCM_RIGHTS` ([`protocol`]). From then on the process and the NIC talk
//!   through the mapping alone. The process keeps its connection open for the port's life; when it
//!   closes (the process exited or died), the port closes, and the firmware tells the peers.
//! - The wire ([`wire`]): a packet for the unit's own node loops back; one for another unit of the
//!   daemon goes into that unit's inbox; one for a node on the fabric map ([`fabric`]) goes out of
//!   the unit's UDP socket. The fault injector ([`fault`]) can sit in front of all of it.
//!
//! # The socket
//!
//! [`socket_path`] gives the control socket's path: `$NICBAR_SOCKET` if set, else
//! `$XDG_RUNTIME_DIR/nicbar/control.sock` if `XDG_RUNTIME_DIR` is set, else
//! `/tmp/nicbar-<uid>/control.sock`. `nicctl emulate --socket` overrides it for the daemon;
//! `host-lib` honours `NICBAR_SOCKET` too.
//!
//! [`RegionLayout::standard`]: shared_abi::region::RegionLayout::standard

pub mod cli;
mod control;
pub mod doorbell;
pub mod fabric;
pub mod fault;
mod hal;
pub mod protocol;
pub(crate) mod server;
pub mod sys;
mod unit;
mod wire;

use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use shared_abi::ids::NodeId;

pub use fabric::{FabricError, FabricMap};
pub use fault::FaultConfig;

/// The environment variable that names the control socket.
pub const SOCKET_ENV: &str = "NICBAR_SOCKET";

/// The control socket's default path: `$XDG_RUNTIME_DIR/nicbar/control.sock` if
/// `XDG_RUNTIME_DIR` is set (and absolute), else `/tmp/nicbar-<uid>/control.sock`.
pub fn default_socket_path() -> PathBuf {
    resolve_socket_path(
        None,
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The control socket's path: `$NICBAR_SOCKET` if set and not empty, else
/// [`default_socket_path`].
pub fn socket_path() -> PathBuf {
    resolve_socket_path(
        std::env::var_os(SOCKET_ENV),
        std::env::var_os("XDG_RUNTIME_DIR"),
        nix::unistd::getuid().as_raw(),
    )
}

/// The rules of [`socket_path`], given the environment's values.
fn resolve_socket_path(
    nicbar_socket: Option<OsString>,
    runtime_dir: Option<OsString>,
    uid: u32,
) -> PathBuf {
    if let Some(path) = nicbar_socket.filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    match runtime_dir.map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() => runtime.join("nicbar").join("control.sock"),
        _ => PathBuf::from(format!("/tmp/nicbar-{uid}")).join("control.sock"),
    }
}

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
    /// DMA arena bytes (rounded up to whole pages).
    pub arena_len: usize,
}

impl Default for RegionShape {
    fn default() -> Self {
        Self {
            send_entries: 64,
            receive_entries: 128,
            event_entries: 256,
            arena_len: 1 << 20,
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
    /// How long a unit stays awake after its last work before it sleeps. Within it, processes
    /// post tokens without ringing the doorbell; it costs a core's time while it lasts.
    pub idle_linger: Duration,
}

impl EmulatorConfig {
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
    /// Another daemon answers on the socket.
    AlreadyRunning {
        /// The socket.
        socket: PathBuf,
    },
    /// The control socket could not be set up.
    Socket {
        /// The socket.
        socket: PathBuf,
        /// The error.
        source: io::Error,
    },
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
            Self::DuplicateNode { node } => write!(f, "node {node} is given to two units"),
            Self::NotOnFabric { node } => write!(f, "node {node} is not on the fabric map"),
            Self::Faults(reason) => write!(f, "fault injector: {reason}"),
            Self::AlreadyRunning { socket } => write!(
                f,
                "a daemon already answers on {} (stop it, or pick another --socket)",
                socket.display()
            ),
            Self::Socket { socket, source } => {
                write!(f, "cannot listen on {}: {source}", socket.display())
            }
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
            Self::Socket { source, .. } | Self::Bind { source, .. } | Self::Resources(source) => {
                Some(source)
            }
            _ => None,
        }
    }
}

/// The emulator.
#[derive(Debug)]
pub struct Emulator;

impl Emulator {
    /// Starts the emulator's threads in this process: one per unit and the control thread,
    /// listening on `config.socket`. It runs until the handle is dropped or stopped.
    ///
    /// # Errors
    /// [`EmulatorError`] says what could not be set up; nothing keeps running then.
    pub fn spawn(config: EmulatorConfig) -> Result<EmulatorHandle, EmulatorError> {
        if config.units.is_empty() || config.units.len() > 256 {
            return Err(EmulatorError::UnitCount(config.units.len()));
        }
        for (index, unit) in config.units.iter().enumerate() {
            if config.units[..index].iter().any(|u| u.node == unit.node) {
                return Err(EmulatorError::DuplicateNode {
                    node: unit.node.get(),
                });
            }
        }
        if let Some(faults) = config.faults.as_ref() {
            faults.validate().map_err(EmulatorError::Faults)?;
        }
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
        let listener = listen(&config.socket)?;
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
        let fabric = Arc::new(fabric);
        let wakes = config
            .units
            .iter()
            .map(|_| doorbell::new().map(Arc::new))
            .collect::<io::Result<Vec<_>>>()
            .map_err(EmulatorError::Resources)?;
        let inboxes: Vec<_> = wakes
            .iter()
            .map(|wake| Arc::new(wire::Inbox::new(wake.clone())))
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
        let boot_nonce = boot_nonce();
        let mut setups = Vec::new();
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
                linger: config.idle_linger,
            });
        }
        let units = unit::spawn_all(setups).map_err(EmulatorError::Resources)?;
        let stop = Arc::new(doorbell::new().map_err(EmulatorError::Resources)?);
        let control = server::ControlServer::new(
            listener,
            stop.clone(),
            control::EmulatedUnits {
                units,
                region: config.region,
                fault_seed: config.faults.filter(FaultConfig::is_active).map(|f| f.seed),
            },
        )
        .map_err(EmulatorError::Resources)?;
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

/// Binds the control socket at `path`: creates its directory (mode 0700) if missing, and replaces
/// a stale socket file no daemon answers on.
pub(crate) fn listen(path: &Path) -> Result<UnixListener, EmulatorError> {
    let socket_error = |source| EmulatorError::Socket {
        socket: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(socket_error)?;
        }
    }
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        if !metadata.file_type().is_socket() {
            return Err(socket_error(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the path exists and is not a socket",
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(EmulatorError::AlreadyRunning {
                socket: path.to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(socket_error)?;
    }
    let listener = UnixListener::bind(path).map_err(socket_error)?;
    // Ports are opened for any process of the user; the directory's mode keeps others out, and
    // the socket's own mode says the same for a socket placed elsewhere.
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    Ok(listener)
}

/// The boot stamp of this start (wall-clock milliseconds, wrapping): it grows from one start to
/// the next, so peers see a restarted NIC's connection epochs as newer than the old ones.
pub(crate) fn boot_nonce() -> u32 {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    millis as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_path_follows_the_documented_rules() {
        let os = |s: &str| Some(OsString::from(s));
        assert_eq!(
            resolve_socket_path(None, None, 1000),
            PathBuf::from("/tmp/nicbar-1000/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
        assert_eq!(
            resolve_socket_path(None, os("relative"), 7),
            PathBuf::from("/tmp/nicbar-7/control.sock")
        );
        assert_eq!(
            resolve_socket_path(os("/elsewhere/x.sock"), os("/run/user/1000"), 1000),
            PathBuf::from("/elsewhere/x.sock")
        );
        assert_eq!(
            resolve_socket_path(os(""), os("/run/user/1000"), 1000),
            PathBuf::from("/run/user/1000/nicbar/control.sock")
        );
    }

    #[test]
    fn one_daemon_per_socket_and_foreign_files_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("sub").join("control.sock");
        let first = Emulator::spawn(EmulatorConfig::in_process(&socket, 2)).unwrap();
        assert!(matches!(
            Emulator::spawn(EmulatorConfig::in_process(&socket, 1)),
            Err(EmulatorError::AlreadyRunning { .. })
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
            Err(EmulatorError::Socket { .. })
        ));
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
        assert!(matches!(
            Emulator::spawn(EmulatorConfig::in_process(dir.path().join("x.sock"), 0)),
            Err(EmulatorError::UnitCount(0))
        ));
    }
}
