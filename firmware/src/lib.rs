//! nicbar firmware: the NIC control program (the paper's MCP), as a sans-IO core.
//!
//! "The paper" throughout this crate is Buntinas, Panda, Sadayappan, *Fast NIC-Based Barrier
//! over Myrinet/GM* (IPDPS 2001); its section numbers are quoted where the code implements them.
//!
//! [`Nic`] is a plain struct advanced by three calls — [`Nic::poll`] (host rings, timers,
//! transmission), [`Nic::on_packet`] (one packet from the wire) and [`Nic::poll_at`] (when to
//! call `poll` next) — and it sees the world only through the [`Hal`] trait: the memory of open
//! ports' regions, packet transmit, and the host doorbell. It reads no clock and does no I/O of
//! its own, so the same code runs in the deterministic simulator, in the emulator daemon on a real
//! host, and cross-compiled as the flashable image.
//!
//! The paper's four state machines (§4.1, Figure 4) are four modules with one job each:
//! [`sdma`] takes send tokens from the ports' send rings and queues their packets on connections;
//! [`send`] transmits prepared packets, retransmissions, acks and nacks; [`recv`] takes packets
//! from the wire and runs the reliability protocol; [`rdma`] takes receive tokens, moves received
//! data into host buffers and writes events. The barrier engine ([`barrier`]) interprets
//! schedules the host compiled (pairwise exchange, gather-broadcast, n-way dissemination).
//!
//! The engines — those four, the barrier engine, one-sided operations (`remote`) and messages
//! longer than a packet (`segment`) — are `impl Nic` blocks that import only downward: the
//! per-port state ([`port`], with [`memory`]), the per-connection state ([`connection`], with
//! the unexpected-barrier record), and the leaves under them ([`seq`], [`time`], [`hal`],
//! [`auth`]). A type the state holds lives with the state, so no state module names an engine
//! and the modules form no cycle.
//!
//! No allocator, no `unsafe`, no panic on any input: every bound is a fixed capacity, and a full
//! table is back-pressure or an error event, never a crash or silent loss.
#![no_std]
#![forbid(unsafe_code)]

pub mod auth;
pub mod barrier;
pub mod connection;
pub mod hal;
pub mod memory;
pub mod port;
mod rdma;
mod record;
mod recv;
pub mod reduce;
mod remote;
mod sdma;
mod segment;
mod send;
pub mod seq;
pub mod session;
pub mod time;

use core::time::Duration;

use heapless::Vec;
use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::{RingError, SharedMemory};
use zerocopy::{FromZeros, IntoBytes};

pub use connection::{ConnectionCounters, RDMA_OPS};
pub use hal::{Gather, GatherError, GatherFrom, Hal, MemoryFault, TransmitError};
pub use memory::{MEMORY_REGIONS, RegisterError};
pub use port::BarrierProgress;
pub use time::Instant;

use connection::{Body, Connection};
use port::{OpenPort, Ports};
use record::UnexpectedBarrierRecord;

/// Most connections (remote nodes talked to at once) a NIC keeps by default. An idle
/// connection is recycled when a new peer needs its slot.
pub const DEFAULT_CONNECTIONS: usize = 64;

/// Tunables of the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// First retransmission timeout; doubles on each consecutive timeout, up to 32 times it.
    pub retransmit_timeout: Duration,
    /// Give up on a node that acknowledged nothing for this long: its sends fail with
    /// `TARGET_NODE_UNREACHABLE`, and barriers waiting on it fail.
    pub give_up_after: Duration,
    /// Give up on a message whose receiver keeps having no buffer for it for this long
    /// (`SEND_TIMED_OUT`).
    pub receiver_not_ready_timeout: Duration,
    /// Wait this long before resending a packet the receiver could not take (no buffer, busy)
    /// or a barrier packet whose target port is not open yet.
    pub retry_interval: Duration,
    /// Barrier timeout when the token gives none.
    pub default_barrier_timeout: Duration,
    /// The fabric key every packet is authenticated under ([`auth`]); `None` sends and takes
    /// packets without a code (every NIC of the fabric must agree).
    pub fabric_key: Option<auth::FabricKey>,
}

impl Config {
    /// How long an acknowledgement may wait for a packet to ride on: an eighth of the
    /// retransmission timeout, so the sender never retransmits for want of it.
    pub fn ack_delay(&self) -> Duration {
        self.retransmit_timeout / 8
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retransmit_timeout: Duration::from_millis(2),
            give_up_after: Duration::from_secs(2),
            receiver_not_ready_timeout: Duration::from_secs(2),
            retry_interval: Duration::from_micros(500),
            default_barrier_timeout: Duration::from_secs(30),
            fabric_key: None,
        }
    }
}

/// Why a port could not be opened.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum OpenError {
    /// The port id is not below [`PORTS_PER_NIC`].
    NoSuchPort(PortId),
    /// The port is open already.
    AlreadyOpen(PortId),
    /// The board has no region mapped for the port.
    NoRegion(PortId),
    /// The region's header is not a valid layout for this NIC and port.
    BadRegion(shared_abi::region::RegionError),
    /// The region's header names another node or port.
    WrongIdentity {
        /// Node id in the header.
        node: NodeId,
        /// Port id in the header.
        port: PortId,
    },
}

impl core::fmt::Display for OpenError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoSuchPort(port) => {
                write!(f, "{port} does not exist (a NIC has {PORTS_PER_NIC} ports)")
            }
            Self::AlreadyOpen(port) => write!(f, "{port} is already open"),
            Self::NoRegion(port) => write!(f, "{port} has no region mapped"),
            Self::BadRegion(error) => write!(f, "bad port region: {error}"),
            Self::WrongIdentity { node, port } => write!(f, "region header names {node} {port}"),
        }
    }
}

/// What one port looks like from outside (for status displays).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortStatus {
    /// The port.
    pub port: PortId,
    /// Its current generation.
    pub generation: Generation,
    /// Send tokens inside the NIC.
    pub held_sends: usize,
    /// Receive buffers provided.
    pub receive_buffers: usize,
    /// Whether a barrier is running.
    pub barrier_running: bool,
    /// Where the running barrier is, if one runs (of several, the one whose deadline comes
    /// first: the longest stuck, as a rule).
    pub barrier: Option<BarrierProgress>,
    /// Whether the port is finishing an orderly close ([`Nic::begin_close`]).
    pub closing: bool,
    /// Events waiting for room in the event ring.
    pub pending_events: usize,
    /// Set if the host broke the port's rings.
    pub faulted: Option<Status>,
}

/// NIC-wide counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Packets from the wire that failed to parse, or were addressed to another node.
    pub malformed_packets: u64,
    /// Packets dropped for want of a connection slot.
    pub no_connection: u64,
    /// Tokens refused.
    pub tokens_rejected: u64,
    /// Barriers completed.
    pub barriers_completed: u64,
    /// Barriers failed.
    pub barriers_failed: u64,
    /// Messages delivered into host buffers.
    pub messages_delivered: u64,
    /// Packets dropped before parsing because their authentication code was wrong or missing.
    pub unauthenticated: u64,
    /// Recorded barrier packets dropped to make room for a newer barrier's (what was left of a
    /// barrier that failed at its sender; see the unexpected-barrier record).
    pub barrier_packets_evicted: u64,
    /// Broadcast bytes that arrived and found no place (see the barrier engine's broadcasts):
    /// a broadcast whose bytes were dropped fails at that member with `BAD_SCHEDULE`.
    pub broadcast_bytes_dropped: u64,
    /// Barrier packets whose target port was gone for good (closed by an owner that ran the same
    /// job's barriers).
    pub barrier_targets_gone: u64,
}

/// The NIC: ports, connections, and the state machines over them.
pub struct Nic<H: Hal, const CONNECTIONS: usize = DEFAULT_CONNECTIONS> {
    hal: H,
    node: NodeId,
    config: Config,
    ports: Ports,
    connections: Vec<Connection, CONNECTIONS>,
    /// Barrier packets between two ports of this NIC never touch the wire (paper §3.4's
    /// optimisation); their record lives here.
    local_record: UnexpectedBarrierRecord,
    /// Ports whose barrier engine should run again (bit per port).
    advance_pending: u8,
    /// Ports whose orderly close finished since the board last asked (bit per port).
    finished_closes: u8,
    /// Ports that may have events waiting for room in their event ring (bit per port): set by
    /// [`Nic::emit`] whenever it queues one, cleared by [`Nic::flush_events`] only when it finds
    /// none the port can still take. A port without its bit has nothing to flush, so `poll`
    /// looks at no other port's events.
    events_waiting: u8,
    /// The open ports (bit per port): each poll's per-port work (rings, barrier timers and
    /// advances, long messages, operations, closes) passes over the closed ones without touching
    /// their slots. Set by [`Nic::open_port`], cleared by [`Nic::close_port`].
    open_ports: u8,
    epoch_counter: u32,
    /// What this boot's nonces are drawn from ([`session`]), and how many it drew.
    boot_entropy: [u8; 16],
    nonce_counter: u64,
    /// When we last told a node we hold no session with it ([`session`]).
    no_session_sent_at: Option<Instant>,
    counters: NicCounters,
    scratch: [u8; shared_abi::packet::MAX_WIRE_LEN],
    /// The number of the last one-sided operation taken ([`remote`]).
    operation_serial: u32,
}

impl<H: Hal, const CONNECTIONS: usize> Nic<H, CONNECTIONS> {
    /// A NIC with node id `node`. `boot_stamp` is when this boot happened, in milliseconds on any
    /// clock that keeps counting across restarts (wall-clock time is fine; it may wrap): connection
    /// epochs start from it, so a peer sees a restarted NIC's epochs as newer than the old ones and
    /// follows them at once (epochs of boots more than about half an hour apart compare at random,
    /// and are then told apart by the silence of the restart, after the give-up time).
    ///
    /// `boot_entropy` is 16 bytes the board draws at random at every boot (the emulator from the
    /// operating system, the simulator from its seed): on an authenticated fabric the nonces of
    /// this boot's sessions are drawn from it ([`session`]), so traffic of an earlier boot can
    /// never be taken again. Two boots must never be given the same bytes.
    pub fn new(
        hal: H,
        node: NodeId,
        config: Config,
        boot_stamp: u32,
        boot_entropy: [u8; 16],
    ) -> Self {
        Self {
            hal,
            node,
            config,
            ports: Default::default(),
            connections: Vec::new(),
            local_record: UnexpectedBarrierRecord::default(),
            advance_pending: 0,
            finished_closes: 0,
            events_waiting: 0,
            open_ports: 0,
            // 4 ms of boot time per 4096 epochs: a boot started 4 ms or more after another begins
            // past every epoch the other used, unless it made over 4096 connections per 4 ms.
            epoch_counter: (boot_stamp >> 2) << 12,
            boot_entropy,
            nonce_counter: 0,
            no_session_sent_at: None,
            counters: NicCounters::default(),
            scratch: [0; shared_abi::packet::MAX_WIRE_LEN],
            operation_serial: 0,
        }
    }

    /// This NIC's node id.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The tunables.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The board.
    pub fn hal(&self) -> &H {
        &self.hal
    }

    /// The board, mutably (to map or unmap port regions around open and close).
    pub fn hal_mut(&mut self) -> &mut H {
        &mut self.hal
    }

    /// NIC-wide counters.
    pub fn counters(&self) -> NicCounters {
        self.counters
    }

    /// Per-connection counters.
    pub fn connection_counters(&self) -> impl Iterator<Item = (NodeId, ConnectionCounters)> + '_ {
        self.connections.iter().map(|c| (c.peer, c.counters))
    }

    /// The status of `port`, or `None` if it is closed.
    pub fn port_status(&self, port: PortId) -> Option<PortStatus> {
        let open = self.ports.open(port.index()?)?;
        Some(PortStatus {
            port,
            generation: open.generation,
            held_sends: open.held_sends(),
            receive_buffers: open.receive_buffers.len(),
            barrier_running: open.running_count() > 0,
            barrier: open
                .runs()
                .min_by_key(|run| run.deadline)
                .map(port::BarrierRun::progress),
            closing: open.closing.is_some(),
            pending_events: open.pending_events.len(),
            faulted: open.faulted,
        })
    }

    /// Opens `port`: the board has mapped its region (the driver wrote the header); the NIC checks
    /// the header, takes the next generation, writes it into the header, and starts serving the
    /// port's rings. Whatever the unexpected-barrier records held for the port's previous
    /// incarnation is forgotten (paper §3.2).
    ///
    /// Like every entry point of the core it takes the caller's clock; opening starts no timer
    /// today, so `_now` is unused.
    ///
    /// # Errors
    /// [`OpenError`] says why the port was not opened; nothing changed then.
    pub fn open_port(&mut self, port: PortId, _now: Instant) -> Result<Generation, OpenError> {
        let index = port.index().ok_or(OpenError::NoSuchPort(port))?;
        if self.ports.open(index).is_some() {
            return Err(OpenError::AlreadyOpen(port));
        }
        let memory = self
            .hal
            .port_memory(index)
            .ok_or(OpenError::NoRegion(port))?;
        let mut header = RegionHeader::new_zeroed();
        memory
            .read(0, header.as_mut_bytes())
            .map_err(|_| OpenError::NoRegion(port))?;
        let layout =
            RegionLayout::from_header(&header, memory.len()).map_err(OpenError::BadRegion)?;
        if header.node_id != self.node || header.port_id != port {
            return Err(OpenError::WrongIdentity {
                node: header.node_id,
                port: header.port_id,
            });
        }
        let Some(slot) = self.ports.slot_mut(index) else {
            return Err(OpenError::NoSuchPort(port));
        };
        slot.last_generation = slot.last_generation.wrapping_add(1).max(1);
        let generation = Generation::new(slot.last_generation);
        let offset = core::mem::offset_of!(RegionHeader, generation);
        memory
            .write(offset, generation.as_bytes())
            .map_err(|_| OpenError::NoRegion(port))?;
        slot.open = Some(OpenPort::new(generation, layout));
        self.open_ports |= port_bit(index);
        self.forget_records_for(index);
        Ok(generation)
    }

    /// Closes `port` (its process closed it or died). Its held tokens are dropped with its
    /// memory; data packets still in flight become cancelled slots; barrier packets already
    /// queued still go (a barrier that completed needs them at its peers); and every connection
    /// is told, after those, that this generation is dead (paper §3.2).
    /// A barrier of the port that failed since the last [`Nic::poll`] owes its members aborts,
    /// due at once: they go first (a process often exits the moment its barrier fails), or the
    /// members would learn only that this port closed — and those it never sent anything, not
    /// even that. Returns the generation that closed, or `None` if the port was not open.
    ///
    /// This is the abrupt close (the process died): what the NIC had not yet taken from the send
    /// ring, and messages not yet acknowledged, are dropped. [`Nic::begin_close`] is the orderly
    /// one. Closing a port that is finishing an orderly close ends it now (and counts as finished
    /// for [`Nic::take_finished_closes`]).
    pub fn close_port(&mut self, port: PortId, now: Instant) -> Option<Generation> {
        let index = port.index()?;
        if self.ports.open(index).is_some_and(|open| {
            open.barrier_retries
                .iter()
                .any(|retry| retry.failed.is_some())
        }) {
            self.run_due_barrier_retries(now);
        }
        let slot = self.ports.slot_mut(index)?;
        let open = slot.open.take()?;
        self.open_ports &= !port_bit(index);
        slot.gone_job = open.job;
        if open.closing.is_some() {
            self.finished_closes |= 1 << index;
        }
        let generation = open.generation;
        for connection in self.connections.iter_mut() {
            connection.cancel_port_data(index as u8);
            if connection
                .closed_notices
                .push_back((index as u8, generation))
                .is_err()
            {
                // Sixteen closes queued toward one silent node: the oldest notice is the least
                // useful (its port has reopened since); keep the newest.
                connection.closed_notices.pop_front();
                let _ = connection
                    .closed_notices
                    .push_back((index as u8, generation));
            }
        }
        self.forget_records_for(index);
        self.forget_assemblies_for(index);
        self.local_port_closed(index, generation);
        Some(generation)
    }

    /// Begins an orderly close of `port` (its process closed it): the NIC goes on taking what
    /// the process posted to the send ring before the close, sends every message and barrier
    /// packet of it, and closes the port (as [`Nic::close_port`]) once every message has been
    /// acknowledged by its receiver or has failed for good, the running barrier (if any) has
    /// ended, and every barrier packet of the port has been acknowledged (none waits to be sent
    /// again). Events are no longer written: the
    /// process is not reading them.
    ///
    /// Bounded: each message ends within the give-up time (an unreachable node) or the
    /// receiver-not-ready time (no buffer) after it was sent, and the close happens at the latest
    /// `give_up_after + receiver_not_ready_timeout` after it began, dropping whatever is left then.
    /// A port whose rings the host broke closes at once.
    ///
    /// The board learns that the close finished — and that it may unmap the port's region — from
    /// [`Nic::take_finished_closes`] after a [`Nic::poll`] (or at once, for a port with nothing
    /// left to do). Returns the closing generation, or `None` if the port was not open.
    pub fn begin_close(&mut self, port: PortId, now: Instant) -> Option<Generation> {
        let index = port.index()?;
        let limit = self
            .config
            .give_up_after
            .saturating_add(self.config.receiver_not_ready_timeout);
        let open = self.ports.open_mut(index)?;
        let generation = open.generation;
        if open.closing.is_none() {
            open.closing = Some(now.saturating_add(limit));
            open.pending_events.clear();
        }
        if open.faulted.is_some() {
            self.close_port(port, now);
            return Some(generation);
        }
        self.poll_send_ring(index, now);
        self.finish_closes(now);
        Some(generation)
    }

    /// Whether `port` is finishing an orderly close.
    pub fn is_closing(&self, port: PortId) -> bool {
        port.index()
            .and_then(|index| self.ports.open(index))
            .is_some_and(|open| open.closing.is_some())
    }

    /// The ports (bit per port index) whose orderly close finished since the last call: the NIC
    /// has let go of their regions.
    pub fn take_finished_closes(&mut self) -> u8 {
        core::mem::take(&mut self.finished_closes)
    }

    /// Registers `length` bytes of the memory of the process that owns `port`, from its virtual
    /// address `address` (`gm_register_memory`); returns the region's key. `nonce` is any value
    /// the board draws at random for it (it makes keys hard to guess). The region lives until it
    /// is deregistered or the port closes. Ranges may overlap.
    ///
    /// # Errors
    /// [`RegisterError`] says why; nothing changed then.
    pub fn register_memory(
        &mut self,
        port: PortId,
        address: u64,
        length: u64,
        nonce: u32,
    ) -> Result<u32, RegisterError> {
        port.index()
            .and_then(|index| self.ports.open_mut(index))
            .ok_or(RegisterError::PortClosed(port))?
            .memory
            .register(address, length, nonce)
    }

    /// Deregisters the region of exactly `length` bytes at `address` of `port`
    /// (`gm_deregister_memory`). Operations that reach it afterwards are refused (`BAD_KEY`).
    ///
    /// # Errors
    /// [`RegisterError`] says why; nothing changed then.
    pub fn deregister_memory(
        &mut self,
        port: PortId,
        address: u64,
        length: u64,
    ) -> Result<(), RegisterError> {
        port.index()
            .and_then(|index| self.ports.open_mut(index))
            .ok_or(RegisterError::PortClosed(port))?
            .memory
            .deregister(address, length)
    }

    /// Lets other ports reach `port`'s registered memory (`gm_allow_remote_memory_access`); until
    /// then every remote put, get and atomic on it is refused (`REMOTE_ACCESS_DENIED`).
    ///
    /// # Errors
    /// [`RegisterError::PortClosed`].
    pub fn allow_remote_memory_access(&mut self, port: PortId) -> Result<(), RegisterError> {
        port.index()
            .and_then(|index| self.ports.open_mut(index))
            .ok_or(RegisterError::PortClosed(port))?
            .memory
            .remote_access = true;
        Ok(())
    }

    /// How many regions `port` has registered (for status displays), or `None` if it is closed.
    pub fn registered_regions(&self, port: PortId) -> Option<usize> {
        let open = self.ports.open(port.index()?)?;
        Some(open.memory.count())
    }

    /// Closes every closing port that has finished (or whose close deadline passed). Returns
    /// whether it closed any.
    fn finish_closes(&mut self, now: Instant) -> bool {
        let mut closed = false;
        for index in ports_of(self.open_ports) {
            let Some(open) = self.ports.open(index) else {
                continue;
            };
            let Some(deadline) = open.closing else {
                continue;
            };
            let ring_empty = self
                .hal
                .port_memory(index)
                .is_none_or(|memory| !matches!(open.send_ring.peek(memory), Ok(Some(_))));
            // A barrier packet still queued or unacknowledged may yet be refused (its target
            // not open yet) and need the port's retry list: wait until every one is through.
            let barrier_packets_out = self.connections.iter().any(|connection| {
                let ours =
                    |body: &Body| matches!(body, Body::Barrier { port, .. } if usize::from(*port) == index);
                connection.queue.iter().any(ours)
                    || connection.sent.iter().any(|descriptor| ours(&descriptor.body))
            });
            let drained = ring_empty
                && open.held_sends() == 0
                && open.running_count() == 0
                && open.barrier_retries.is_empty()
                && !barrier_packets_out;
            if drained || now >= deadline {
                self.close_port(PortId(index as u8), now);
                closed = true;
            }
        }
        closed
    }

    fn forget_records_for(&mut self, port: usize) {
        self.local_record.clear_destination(port);
        // Reduction values that arrived were meant for another incarnation too.
        if let Some(slot) = self.ports.slot_mut(port) {
            slot.reduce_values
                .forget(|key| matches!(key, port::ValueKey::Arrived { .. }));
        }
        for connection in self.connections.iter_mut() {
            connection.record.clear_destination(port);
        }
    }

    /// Does all work that is due: takes tokens from the open ports' rings (SDMA, and receive
    /// tokens for RDMA), runs barrier engines and timers, transmits (SEND), and flushes events.
    /// Call it after [`Nic::on_packet`], when a doorbell rings, and no later than
    /// [`Nic::poll_at`]. Returns whether it did anything.
    ///
    /// Once it returns, nothing is left due at `now`: [`Nic::poll_at`] is `None` or after `now`
    /// (provided the configured intervals are longer than zero, as the defaults are; a zero
    /// retry interval names `now` itself). A caller may therefore sleep until `poll_at` without
    /// guarding against a deadline already past.
    ///
    /// What it costs follows what there is to do: the rings of open ports are read (their
    /// processes publish without telling), while events, operations and held sends are found
    /// from per-port sets of the slots and ports that hold them, and an idle connection or a
    /// port without barrier retries is passed over after a test or two.
    pub fn poll(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for index in ports_of(self.open_ports) {
            busy |= self.poll_receive_ring(index);
            busy |= self.poll_send_ring(index, now);
        }
        busy |= self.run_barrier_timers(now);
        busy |= self.run_connection_timers(now);
        busy |= self.run_operation_timers(now);
        busy |= self.feed_operations(now);
        busy |= self.feed_messages(now);
        self.advance_all_barriers(now);
        // A barrier that failed since its timers ran (a give-up above, an abort its engine
        // found) owes its other members aborts due at once: they go in this poll.
        busy |= self.run_due_barrier_retries(now);
        busy |= self.transmit_all(now);
        let mut waiting = self.events_waiting;
        while waiting != 0 {
            let index = waiting.trailing_zeros() as usize;
            waiting &= waiting - 1;
            self.flush_events(index, false);
        }
        if self.finish_closes(now) {
            // A close queued its notices, may have failed local barriers (whose aborts are due
            // at once), and may have emptied queue places that parked messages are due to take:
            // send now what that made due, so nothing due is left behind.
            busy |= self.run_due_barrier_retries(now);
            busy |= self.transmit_all(now);
        }
        busy
    }

    /// When [`Nic::poll`] must run next at the latest if nothing else happens, or `None` if the
    /// NIC is idle until a packet or a doorbell. Each time it names is one at which `poll` has
    /// something to do (a timer, a held packet, a parked message that may go), never one of work
    /// that waits behind other work; so right after `poll(now)` it is `None` or after `now`.
    pub fn poll_at(&self) -> Option<Instant> {
        let mut at = None;
        for connection in self.connections.iter() {
            at = time::earliest(at, connection.retransmit_at);
            at = time::earliest(at, connection.next_transmit_at());
            at = time::earliest(at, Self::hello_due_at(connection));
            at = time::earliest(at, connection.next_unpark_at());
            at = time::earliest(at, connection.ack_due);
        }
        for open in self.ports.open_ports() {
            for run in open.runs() {
                at = time::earliest(at, run.next_deadline());
            }
            for (index, retry) in open.barrier_retries.iter().enumerate() {
                let first = open
                    .barrier_retries
                    .iter()
                    .position(|r| r.destination() == retry.destination())
                    == Some(index);
                if first {
                    at = time::earliest(at, Some(retry.next_attempt()));
                }
            }
            at = time::earliest(at, open.closing);
        }
        at = time::earliest(at, self.operation_deadline());
        at
    }

    /// Whether a process gave the NIC work it has not taken: a token in an open port's send or
    /// receive ring that the port may take now, or events waiting for room in an event ring
    /// (a broken ring counts: `poll` must see to it). Processes publish without telling, so a
    /// driver that skips a poll must ask this first.
    ///
    /// A poll that did nothing leaves nothing to do until one of three things: a packet
    /// ([`Nic::on_packet`], [`Nic::on_local_packet`]), a call that changes a port (open, close,
    /// memory), or [`Nic::poll_at`]. With this, the fourth, a driver may skip the polls that
    /// would find nothing: a few loads per open port instead of the timers' scans.
    pub fn host_work_waiting(&self) -> bool {
        if self.events_waiting != 0 {
            return true;
        }
        ports_of(self.open_ports).any(|index| {
            let Some(open) = self.ports.open(index) else {
                return false;
            };
            if !open.can_take_token() {
                return false;
            }
            let Some(memory) = self.hal.port_memory(index) else {
                return false;
            };
            let posted = |available: Result<u32, _>| available.map_or(true, |count| count > 0);
            posted(open.send_ring.available(memory)) || posted(open.receive_ring.available(memory))
        })
    }

    fn connection_index(&self, peer: NodeId) -> Option<usize> {
        self.connections.iter().position(|c| c.peer == peer)
    }

    /// The connection to `peer`, created if there is none (recycling an idle one if the table is
    /// full). `None` if every slot is busy.
    fn connection_for(&mut self, peer: NodeId, now: Instant) -> Option<usize> {
        if let Some(index) = self.connection_index(peer) {
            return Some(index);
        }
        self.epoch_counter = self.epoch_counter.wrapping_add(1);
        let mut fresh = Connection::new(peer, self.epoch_counter, now);
        fresh.session.keyed = self.config.fabric_key.is_some() && !self.hal.local_route(peer);
        if self.connections.is_full() {
            // Recycle only a connection silent for longer than the give-up time: by then the
            // peer has had every ack it will get, so forgetting our receive state loses nothing.
            let give_up = self.config.give_up_after;
            let victim = self
                .connections
                .iter()
                .position(|c| c.is_idle() && now.saturating_since(c.last_heard) > give_up)?;
            let slot = self.connections.get_mut(victim)?;
            *slot = fresh;
            return Some(victim);
        }
        self.connections.push(fresh).ok()?;
        Some(self.connections.len() - 1)
    }

    /// Queues `event` for `port`: straight into the event ring when it has room and nothing is
    /// waiting, else behind the waiting ones. Room is guaranteed by the token accounting.
    fn emit(&mut self, port: usize, event: Event) {
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        if open.closing.is_some() {
            // The process closed the port and reads no more events.
            return;
        }
        if open.pending_events.push_back(event).is_err() {
            // Unreachable by construction (`OpenPort::can_take_token`): every event answers a
            // held token. Count it rather than crash if the accounting is ever wrong.
            self.counters.tokens_rejected += 1;
        }
        self.events_waiting |= port_bit(port);
        self.flush_events(port, true);
    }

    /// Moves waiting events into the port's event ring while it has room, then rings the doorbell
    /// if the host sleeps and asked for what was written — or, when `queued` (an event was just
    /// queued) finds the ring full, whatever it asked for.
    fn flush_events(&mut self, port: usize, queued: bool) {
        let Some(open) = self.ports.open_mut(port) else {
            self.events_waiting &= !port_bit(port);
            return;
        };
        if open.faulted.is_some() || open.closing.is_some() || open.pending_events.is_empty() {
            // Nothing it can write (a broken or closing port takes no more events): `emit`
            // marks the port again when it queues one.
            self.events_waiting &= !port_bit(port);
            return;
        }
        let Some(memory) = self.hal.port_memory(port) else {
            return;
        };
        let mut wrote = false;
        // Whether every event written is a send's successful end, which a process waiting
        // for something else asked not to be woken for (`Wake::UNLESS_SENT`).
        let mut only_sends_ended = true;
        while let Some(event) = open.pending_events.front() {
            match open.event_ring.push(memory, event) {
                Ok(()) => {
                    only_sends_ended &= event.is_successful_send();
                    open.pending_events.pop_front();
                    wrote = true;
                }
                Err(RingError::Full) => break,
                Err(_) => {
                    // The host scribbled over its own event ring's indexes: nothing more can be
                    // reported to it. Stop serving this port (its neighbours are untouched).
                    open.faulted = Some(Status::RING_CORRUPT);
                    break;
                }
            }
        }
        let still_waiting = !open.pending_events.is_empty();
        if !still_waiting {
            self.events_waiting &= !port_bit(port);
        }
        // An event queued behind a full ring: the process must make room, whatever it waits
        // for, or the events it does wait for could never be written (even when this flush
        // wrote none).
        let full = queued && still_waiting;
        if (wrote || full)
            && open
                .event_ring
                .consumer_wake(memory)
                .is_ok_and(|wake| wake.rings_for(only_sends_ended && !full))
        {
            self.hal.notify_host(port);
        }
    }

    fn event(kind: EventKind, status: Status) -> Event {
        Event {
            kind,
            status,
            ..Event::default()
        }
    }
}

#[cfg(test)]
impl<H: Hal, const C: usize> Nic<H, C> {
    /// Whether every set that stands for a scan names what the scan would find: the open ports,
    /// each port's held, operation and barrier slots, and (as a superset) the ports with events
    /// they can still write; and no barrier the engine passed over could have moved.
    pub(crate) fn work_sets_agree(&self) -> bool {
        (0..PORTS_PER_NIC).all(|index| {
            let open_bit = self.open_ports & port_bit(index) != 0;
            open_bit == self.ports.open(index).is_some()
                && self.ports.open(index).is_none_or(|open| {
                    let can_flush = open.faulted.is_none() && open.closing.is_none();
                    open.slot_sets_agree()
                        && !self.barrier_could_advance(index)
                        && (!can_flush
                            || open.pending_events.is_empty()
                            || self.events_waiting & port_bit(index) != 0)
                })
        })
    }
}

/// The ports of a set of ports (bit per port), lowest first.
fn ports_of(set: u8) -> impl Iterator<Item = usize> {
    (0..PORTS_PER_NIC).filter(move |&port| set & port_bit(port) != 0)
}

/// The bit of `port` in a set of ports (none past the last port).
fn port_bit(port: usize) -> u8 {
    u32::try_from(port)
        .ok()
        .and_then(|port| 1u8.checked_shl(port))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests;
