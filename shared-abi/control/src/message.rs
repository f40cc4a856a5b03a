//! The messages of the control protocol: what a process asks a NIC backend and what it answers.
//!
//! Opening a port is the driver's only job (as in GM): a process connects, sends
//! [`Request::OpenPort`], and receives [`Reply::Opened`] with three descriptors attached
//! (`SCM_RIGHTS`, in this order): the port region (a sealed memfd, see [`crate::Mapping`]), the
//! host doorbell (an eventfd the NIC writes when the process sleeps on its event ring and a new
//! event arrived) and the NIC doorbell (an eventfd the process writes when the NIC sleeps on its
//! send or receive ring and a new token arrived). From then on the process and the NIC talk
//! through the mapping alone. The connection stays open for the life of the port: when it closes
//! — the process closed the port, exited or died — the backend closes the port.
//!
//! How the messages are laid out in bytes is [`crate::codec`]'s; how they travel,
//! [`crate::frame`]'s. One connection owns at most one port.

/// What a process asks the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Open `port` of NIC `unit` for this connection. `abi_version` is the client's
    /// [`shared_abi::ABI_VERSION`]; a daemon speaking another refuses.
    OpenPort {
        /// The NIC's unit number in the daemon.
        unit: u8,
        /// The port, `0..PORTS_PER_NIC`.
        port: u8,
        /// The client's ABI version.
        abi_version: u32,
    },
    /// Close the port this connection owns and confirm once the NIC has closed it (closing the
    /// connection closes it too, without confirmation).
    ClosePort,
    /// Report the units, their open ports and their connections' counters.
    Status,
    /// Name every node of the fabric this daemon knows: its node id, host name and unique id
    /// (what GM's `gm_host_name_to_node_id` and `gm_unique_id` answer from). Needs no port.
    Nodes,
    /// Register `length` bytes of the calling process's memory at its virtual address `address`
    /// with the port this connection owns (`gm_register_memory`); answered with
    /// [`Reply::Registered`] and the region's key. The NIC reaches the memory single-copy
    /// (on the emulated NIC, `process_vm_readv`/`process_vm_writev` into the process the kernel
    /// names on this socket).
    RegisterMemory {
        /// First byte, a virtual address of the calling process.
        address: u64,
        /// Bytes.
        length: u64,
    },
    /// Deregister the region of exactly `length` bytes at `address` (`gm_deregister_memory`);
    /// answered with [`Reply::MemoryDone`].
    DeregisterMemory {
        /// As registered.
        address: u64,
        /// As registered.
        length: u64,
    },
    /// Let other ports reach the registered memory of the port this connection owns
    /// (`gm_allow_remote_memory_access`); answered with [`Reply::MemoryDone`].
    AllowRemoteAccess,
    /// The calling process mapped the region of the port this connection owns at its virtual
    /// address `address`; answered with [`Reply::MemoryDone`]. Memory it registers in the
    /// region's DMA arena, a NIC that maps the region too reaches through its own mapping,
    /// without a system call. A false address harms only the caller: the NIC then reads and
    /// writes its own port's arena where the caller meant other memory.
    RegionMapped {
        /// The region's first byte, a virtual address of the calling process.
        address: u64,
    },
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The port is open; the region, host doorbell and NIC doorbell descriptors come with this
    /// frame.
    Opened(OpenedPort),
    /// The port this connection owned is closed.
    Closed,
    /// The daemon's state.
    Status(StatusReport),
    /// The fabric's nodes, by node id.
    Nodes(Vec<NodeName>),
    /// The request was refused.
    Error(ControlError),
    /// The memory is registered; one-sided operations name it by this key.
    Registered {
        /// The region's key.
        key: u32,
    },
    /// A deregistration or an allowance is done.
    MemoryDone,
}

/// A port the daemon opened for the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenedPort {
    /// The NIC's unit number.
    pub unit: u8,
    /// The port.
    pub port: u8,
    /// The NIC's node id on the fabric.
    pub node: u16,
    /// The port's new generation (also in the region header).
    pub generation: u32,
    /// Length of the region in bytes.
    pub region_len: u64,
}

/// One node of the fabric as the fabric names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeName {
    /// Its node id.
    pub node: u16,
    /// Its host name: the fabric map's name for it, else one derived from its UDP address, or
    /// `<host name>:<unit>` for a unit of one daemon without an address
    /// ([`crate::naming`]). At most [`crate::naming::MAX_NAME_LEN`] bytes, no whitespace.
    pub name: String,
    /// Its unique id (GM's 6-byte board id) in the low 48 bits, the same from every daemon of
    /// the fabric.
    pub unique_id: u64,
}

/// Why the daemon refused a request. Each variant names the values involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlError {
    /// There is no NIC with this unit number.
    NoSuchUnit {
        /// The unit asked for.
        unit: u8,
        /// How many units the daemon runs.
        units: u8,
    },
    /// The port number is out of range.
    NoSuchPort {
        /// The port asked for.
        port: u8,
        /// Ports per NIC.
        ports: u8,
    },
    /// Another live process owns the port.
    PortBusy {
        /// The unit.
        unit: u8,
        /// The port.
        port: u8,
        /// The owner's process id.
        owner_pid: u32,
    },
    /// This connection owns a port already (one connection, one port).
    AlreadyOwnsPort {
        /// The unit of the port it owns.
        unit: u8,
        /// The port it owns.
        port: u8,
    },
    /// `ClosePort` on a connection that owns no port.
    NoPortOwned,
    /// The client speaks another ABI version.
    AbiMismatch {
        /// The daemon's.
        daemon: u32,
        /// The client's.
        client: u32,
    },
    /// The NIC refused to open the port, or the region could not be created.
    OpenFailed {
        /// The unit.
        unit: u8,
        /// The port.
        port: u8,
        /// What failed.
        reason: String,
    },
    /// The daemon serves only its own user (and a group named when it started); this client runs
    /// as another.
    PermissionDenied {
        /// The client's user id.
        client_uid: u32,
        /// The daemon's user id.
        daemon_uid: u32,
    },
    /// The request could not be parsed.
    BadRequest(String),
    /// The daemon could not do its part (a NIC thread did not answer).
    Internal(String),
    /// A registration, deregistration or allowance was refused; says why.
    MemoryRefused(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSuchUnit { unit, units } => {
                write!(f, "no NIC unit {unit}: the daemon runs {units} unit(s)")
            }
            Self::NoSuchPort { port, ports } => {
                write!(f, "no port {port}: a NIC has ports 0..{ports}")
            }
            Self::PortBusy {
                unit,
                port,
                owner_pid,
            } => write!(
                f,
                "port {port} of unit {unit} is owned by process {owner_pid}"
            ),
            Self::AlreadyOwnsPort { unit, port } => write!(
                f,
                "this connection owns port {port} of unit {unit} already (one port per connection)"
            ),
            Self::NoPortOwned => write!(f, "this connection owns no port to close"),
            Self::AbiMismatch { daemon, client } => write!(
                f,
                "the daemon speaks ABI version {daemon}, the client {client}"
            ),
            Self::OpenFailed { unit, port, reason } => {
                write!(
                    f,
                    "port {port} of unit {unit} could not be opened: {reason}"
                )
            }
            Self::PermissionDenied {
                client_uid,
                daemon_uid,
            } => write!(
                f,
                "permission denied: this daemon serves uid {daemon_uid} (and the group it was \
                 started with), not uid {client_uid}"
            ),
            Self::BadRequest(reason) => write!(f, "bad request: {reason}"),
            Self::Internal(reason) => write!(f, "daemon failure: {reason}"),
            Self::MemoryRefused(reason) => write!(f, "memory registration refused: {reason}"),
        }
    }
}

impl std::error::Error for ControlError {}

/// The daemon's state, as `nicctl status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// The daemon's process id.
    pub daemon_pid: u32,
    /// The seed of the fault injector, if it is on.
    pub fault_seed: Option<u64>,
    /// One entry per NIC, by unit number.
    pub units: Vec<UnitStatus>,
}

/// One NIC of the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitStatus {
    /// Unit number.
    pub unit: u8,
    /// The NIC thread that runs it (0 where the backend has no such threads).
    pub thread: u16,
    /// That thread's idle policy, and for an adaptive one what it does now: `poll`, `sleep`,
    /// `adaptive (polling)`, `adaptive (sleeping)`; empty where the backend has none.
    pub idle: String,
    /// CPU time that thread has used, in nanoseconds (0 where the backend cannot tell).
    pub thread_cpu_ns: u64,
    /// Node id on the fabric.
    pub node: u16,
    /// The UDP address the NIC listens on, if it is on a fabric map.
    pub address: Option<String>,
    /// Open ports.
    pub ports: Vec<PortReport>,
    /// Connections to other nodes (and to itself, for loopback).
    pub connections: Vec<ConnectionReport>,
    /// NIC-wide counters.
    pub counters: NicReport,
    /// What the wire did with this NIC's packets.
    pub wire: WireCounters,
}

/// One open port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortReport {
    /// The port.
    pub port: u8,
    /// Its generation.
    pub generation: u32,
    /// The owning process.
    pub owner_pid: Option<u32>,
    /// Send tokens held by the NIC.
    pub held_sends: usize,
    /// Receive buffers provided.
    pub receive_buffers: usize,
    /// Whether a barrier runs.
    pub barrier_running: bool,
    /// Where the running NIC-based barrier is, if one runs.
    pub barrier: Option<BarrierReport>,
    /// Whether the port is finishing an orderly close (its process asked to close it).
    pub closing: bool,
    /// Events waiting for room in the event ring.
    pub pending_events: usize,
    /// The status that stopped the port, if the host broke its rings.
    pub faulted: Option<u8>,
}

/// A running NIC-based barrier (the firmware's `BarrierProgress`): how far it got and whom it
/// waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarrierReport {
    /// The schedule step being worked on, from 0.
    pub step: u32,
    /// Steps in the schedule.
    pub steps: u32,
    /// The member the current step waits for: node, port, and the round of its packet.
    pub waiting_node: u16,
    /// See `waiting_node`.
    pub waiting_port: u8,
    /// See `waiting_node`.
    pub round: u8,
    /// The current step's own packet has not gone out yet (no room, or its target port is not
    /// open): the barrier waits to send to that member rather than to hear from it.
    pub sending: bool,
}

/// One connection's counters (the firmware's `ConnectionCounters`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "each field is the firmware counter of the same name"
)]
pub struct ConnectionReport {
    pub peer: u16,
    pub sent: u64,
    pub resent: u64,
    pub received: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub nacks_sent: u64,
    pub nacks_received: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    pub drops: u64,
    pub give_ups: u64,
}

/// NIC-wide counters (the firmware's `NicCounters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(
    missing_docs,
    reason = "each field is the firmware counter of the same name"
)]
pub struct NicReport {
    pub malformed_packets: u64,
    pub no_connection: u64,
    pub tokens_rejected: u64,
    pub barriers_completed: u64,
    pub barriers_failed: u64,
    pub messages_delivered: u64,
    pub unauthenticated: u64,
}

/// What the emulated wire did with one NIC's packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounters {
    /// Packets the NIC transmitted.
    pub transmitted: u64,
    /// Packets that arrived for the NIC.
    pub received: u64,
    /// Packets the fault injector dropped.
    pub lost: u64,
    /// Extra copies the fault injector made.
    pub duplicated: u64,
    /// Packets the fault injector held back (delay, reordering).
    pub delayed: u64,
    /// Packets the wire could not deliver (no route, full queue, socket error).
    pub undeliverable: u64,
    /// Datagrams that came from addresses not on the fabric map, or were longer than any
    /// packet, dropped.
    pub strangers: u64,
    /// Datagrams with a right authentication code (made by a holder of the fabric key) whose
    /// header named another node than the one at their source address, dropped. One with a wrong
    /// code is the NIC's `unauthenticated`, whatever its header says.
    pub spoofed: u64,
}
