//! The ARMCI process: its port, its peers, the memory it registered, and the bookkeeping of the
//! operations and messages in flight.
//!
//! One progress engine serves every call: [`Armci::progress`] takes the port's next event and
//! files it — an operation's end into `finished` (or, for a put nobody waits for, into the
//! per-target counts and the staging area's free list), a message from a peer into the inbox.
//! Nothing here needs a peer's process to make progress for a put, get, atomic, accumulate or
//! lock: the NIC serves them. Only the collectives (malloc, free, the fused barrier's exchange)
//! and the queue lock's wake-up messages are messages.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use nicbar::{
    AtomicOp, DmaBuffer, Error as PortError, Event, Group, MemoryRegion, NodeId, Port, PortId,
    Priority, RemotePointer, SharedBytes, Status,
};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use crate::config::Config;
use crate::error::ArmciError;
use crate::groups::GroupState;
use crate::launch::{self, MAX_RANKS, Placement};
use crate::lock_state::{LockState, Mutexes};

/// Bytes of the staging area: where a put's source is copied (so the call returns at once, ARMCI's
/// local completion) and where a get lands before it is copied out.
pub(crate) const STAGING_LEN: usize = 1 << 20;
/// The longest piece one put or get of the staging area carries.
pub(crate) const PIECE: usize = STAGING_LEN / 4;

/// The control words every rank registers at start, by byte offset.
pub(crate) mod control {
    /// The word acknowledgement requests (fences) read.
    pub(crate) const FENCE_WORD: u32 = 0;
    /// The count of puts applied here, as peers report them (the fused barrier's `op_done`).
    pub(crate) const OP_DONE: u32 = 8;
    /// The lock words of the lock that serialises accumulates into this rank's memory.
    pub(crate) const ACC_LOCK: u32 = 16;
    /// This rank's queue node for the accumulate locks (it waits for one at a time).
    pub(crate) const ACC_NODE: u32 = 32;
    /// Bytes.
    pub(crate) const LEN: usize = 64;
}

/// What the NIC's end of an operation means to this library.
#[derive(Debug)]
enum Pending {
    /// A put nobody waits for: its end frees its staging bytes and counts down its target's puts
    /// (and its handle's operations, if it has one).
    Put {
        rank: usize,
        staging: usize,
        handle: Option<u64>,
    },
    /// A get under a handle: its end hands the bytes to the lander (at `address`), frees the
    /// staging bytes and counts down the handle's operations.
    Land {
        rank: usize,
        staging: usize,
        len: usize,
        address: u64,
        handle: u64,
    },
    /// A caller waits for its outcome in `finished`.
    Waited,
    /// Nobody waits; a failure is kept for the next fence or barrier to report.
    Background { what: &'static str, rank: usize },
}

/// How an operation ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outcome {
    pub(crate) status: Status,
    pub(crate) value: u64,
    pub(crate) rank: usize,
}

/// A message between the ranks' libraries: its kind, the collective's sequence number, a round
/// within it, the sender's rank, the process group's tag (0 for the library's own collectives
/// over every rank), then the payload.
pub(crate) mod message {
    pub(crate) const MAGIC: u16 = 0xa4c1;
    pub(crate) const HEADER: usize = 16;
    /// One rank's entry of an all-to-all exchange (malloc, mutexes, start).
    pub(crate) const EXCHANGE: u8 = 1;
    /// One step of the fused barrier's sum.
    pub(crate) const REDUCE: u8 = 2;
    /// A queue lock's wake-up: look at your flags again.
    pub(crate) const WAKE: u8 = 3;
    /// The send context of a wake-up, whose failure is nobody's: the flags it points at were
    /// written, and the write waited for, before it was sent, and a rank that saw them may have
    /// left before it came.
    pub(crate) const WAKE_CONTEXT: u64 = 1;
    /// One member's entry of an exchange within a process group.
    pub(crate) const GROUP_EXCHANGE: u8 = 4;
}

/// A message kept until a collective asks for it.
#[derive(Debug)]
pub(crate) struct Message {
    pub(crate) kind: u8,
    pub(crate) group: u32,
    pub(crate) round: u8,
    pub(crate) sequence: u32,
    pub(crate) from: usize,
    pub(crate) payload: Vec<u8>,
}

/// Registered bytes handed out first in, first out: a lease is taken for a put's source or a
/// get's landing place and given back when the NIC is done with it.
#[derive(Debug)]
pub(crate) struct Staging {
    pub(crate) region: MemoryRegion,
    /// Leases in the order taken: (start, length, given back).
    leases: VecDeque<(usize, usize, bool)>,
}

impl Staging {
    fn new(region: MemoryRegion) -> Self {
        Self {
            region,
            leases: VecDeque::new(),
        }
    }

    /// `len` bytes (1 to the area's length), if they are free.
    pub(crate) fn take(&mut self, len: usize) -> Option<usize> {
        take_in(&mut self.leases, self.region.len(), len)
    }

    /// Gives back the lease starting at `start`.
    pub(crate) fn give_back(&mut self, start: usize) {
        give_back_in(&mut self.leases, start);
    }
}

/// Takes `len` bytes of an area of `capacity` bytes whose leases, in the order taken, are
/// `leases` (start, length, given back).
fn take_in(
    leases: &mut VecDeque<(usize, usize, bool)>,
    capacity: usize,
    len: usize,
) -> Option<usize> {
    let len = len.max(1);
    if len > capacity {
        return None;
    }
    let start = match (leases.front(), leases.back()) {
        (Some(&(tail, ..)), Some(&(last, last_len, _))) => {
            let head = last + last_len;
            if head > tail {
                // In use: [tail, head). Free: [head, capacity) then [0, tail).
                if capacity - head >= len {
                    head
                } else if tail >= len {
                    0
                } else {
                    return None;
                }
            } else if tail - head >= len {
                // Wrapped: in use [tail, capacity) and [0, head); free [head, tail).
                head
            } else {
                return None;
            }
        }
        _ => 0,
    };
    leases.push_back((start, len, false));
    Some(start)
}

/// Marks the lease at `start` given back and drops the given-back leases at the front.
fn give_back_in(leases: &mut VecDeque<(usize, usize, bool)>, start: usize) {
    if let Some(lease) = leases.iter_mut().find(|l| l.0 == start && !l.2) {
        lease.2 = true;
    }
    while leases.front().is_some_and(|l| l.2) {
        leases.pop_front();
    }
}

/// Writes `len` staged bytes at `start` of the staging area to the caller's memory at
/// `address` (the C API's: it alone holds raw addresses).
pub(crate) type Lander = fn(address: u64, staging: &SharedBytes, start: usize, len: usize);

/// The operations of one non-blocking handle still in the NIC, and the first failure among
/// those that ended.
#[derive(Debug, Default)]
pub(crate) struct HandleState {
    pub(crate) outstanding: usize,
    pub(crate) failure: Option<ArmciError>,
}

/// One ARMCI_Malloc: every rank's base address, length and key.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// This rank's memory (none if it asked for 0 bytes).
    pub(crate) local: Option<MemoryRegion>,
    pub(crate) bases: Vec<u64>,
    pub(crate) lens: Vec<u64>,
    pub(crate) keys: Vec<u32>,
}

/// An ARMCI process: a port on a NIC, its peers, and what it registered.
#[derive(Debug)]
pub struct Armci {
    pub(crate) port: Port,
    pub(crate) rank: usize,
    pub(crate) peers: Vec<(NodeId, PortId)>,
    pub(crate) group: Group,
    pub(crate) config: Config,
    pub(crate) placement: Option<Placement>,
    pub(crate) control: MemoryRegion,
    pub(crate) control_keys: Vec<u32>,
    pub(crate) staging: Staging,
    pub(crate) allocations: Vec<Allocation>,
    pub(crate) mutexes: Option<Mutexes>,
    pub(crate) locks: LockState,
    pending: HashMap<u64, Pending>,
    /// The non-blocking handles with operations posted and not yet waited for.
    pub(crate) handles: HashMap<u64, HandleState>,
    /// The last handle number given out.
    pub(crate) next_handle: u64,
    /// The process groups by id (0: every rank; `None`: freed).
    pub(crate) groups: Vec<Option<GroupState>>,
    /// ARMCI's default group.
    pub(crate) default_group: usize,
    /// Where a get under a handle delivers its bytes (set by the C API).
    pub(crate) lander: Option<Lander>,
    finished: HashMap<u64, Outcome>,
    next_context: u64,
    /// Puts posted and not yet reported done, per target.
    pub(crate) puts_in_flight: Vec<usize>,
    /// Whether puts went to the target since its last fence (the thesis's server list).
    pub(crate) dirty: Vec<bool>,
    /// Puts issued to each target since the start (the fused barrier's `op_init`).
    pub(crate) puts_issued: Vec<u64>,
    /// How many of them each target has been told of (by a fetch-and-add on its `OP_DONE`).
    pub(crate) puts_reported: Vec<u64>,
    /// Messages from peers not yet asked for.
    pub(crate) inbox: Vec<Message>,
    /// The collectives called so far: each one's messages carry its number.
    pub(crate) sequence: u32,
    receive_size: u8,
    /// A failure of an operation nobody waited for, kept for the next fence or barrier.
    pub(crate) failure: Option<ArmciError>,
    /// This rank's generator (SplitMix64 from the configured seed and the rank): the order in
    /// which a fence asks its servers.
    random: SplitMix64,
}

impl Armci {
    /// Starts this rank as the environment says (see [`crate::launch`]) with the configuration
    /// the environment gives ([`Config::from_env`]). Collective: every rank of the job calls it.
    ///
    /// # Errors
    /// [`ArmciError::Launch`] for a missing or bad setting or a failed rendezvous; a port error.
    pub fn init() -> Result<Self, ArmciError> {
        let config = Config::from_env().map_err(|e| ArmciError::Launch(e.to_string()))?;
        Self::init_with(config)
    }

    /// Starts this rank as the environment places it, with `config` (every rank must give the
    /// same one). Collective.
    ///
    /// # Errors
    /// As [`Armci::init`].
    pub fn init_with(config: Config) -> Result<Self, ArmciError> {
        let placement = Placement::from_env()?;
        let socket = std::env::var_os("NICBAR_SOCKET").map(std::path::PathBuf::from);
        let port = launch::open_free_port(socket.as_deref(), placement.unit)?;
        let mut armci = Self::prepare(port, placement.rank, placement.size, config)?;
        let me = (armci.port.node_id(), armci.port.port_id());
        let peers = launch::rendezvous(&placement, me, config.collective_timeout)?;
        armci.placement = Some(placement);
        armci.start(peers)?;
        Ok(armci)
    }

    /// Starts this rank on an open `port`, with the ports of every rank already known (rank `i`
    /// at `peers[i]`; this port must be `peers[rank]`). Collective.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if the peers do not fit; as [`Armci::init`].
    pub fn with_port(
        port: Port,
        rank: usize,
        peers: Vec<(NodeId, PortId)>,
        config: Config,
    ) -> Result<Self, ArmciError> {
        if peers.get(rank) != Some(&(port.node_id(), port.port_id())) {
            return Err(ArmciError::Invalid(format!(
                "rank {rank}'s port is node {} port {}, which the peer list does not name there",
                port.node_id().get(),
                port.port_id().0
            )));
        }
        let mut armci = Self::prepare(port, rank, peers.len(), config)?;
        armci.start(peers)?;
        Ok(armci)
    }

    /// Registers the control words and the staging area and provides receive buffers, before
    /// any peer can know this port.
    fn prepare(
        mut port: Port,
        rank: usize,
        size: usize,
        config: Config,
    ) -> Result<Self, ArmciError> {
        if size == 0 || size > MAX_RANKS || rank >= size {
            return Err(ArmciError::Invalid(format!(
                "rank {rank} of {size}: a job has 1 to {MAX_RANKS} ranks"
            )));
        }
        let control = port.register_memory(control::LEN)?;
        let staging = Staging::new(port.register_memory(STAGING_LEN)?);
        // The largest message: a header and one counter per rank.
        let longest = (message::HEADER + 8 * size).max(64) as u32;
        let receive_size = nicbar::min_size_for_length(longest)
            .ok_or_else(|| ArmciError::Invalid(format!("{size} ranks do not fit a message")))?;
        let buffers = (2 * size + 8).min(port.receive_tokens() as usize);
        for _ in 0..buffers {
            let buffer = port.dma_alloc(1 << receive_size)?;
            port.provide_receive_buffer(buffer, receive_size, Priority::LOW, 0)
                .map_err(|e| ArmciError::Port(e.error))?;
        }
        Ok(Self {
            port,
            rank,
            peers: Vec::new(),
            group: Group::from_endpoints([(NodeId::new(0), PortId(0))])
                .map_err(|e| ArmciError::Invalid(e.to_string()))?,
            config,
            placement: None,
            control,
            control_keys: Vec::new(),
            staging,
            allocations: Vec::new(),
            mutexes: None,
            locks: LockState::default(),
            pending: HashMap::new(),
            handles: HashMap::new(),
            next_handle: 0,
            groups: Vec::new(),
            default_group: 0,
            lander: None,
            finished: HashMap::new(),
            next_context: 0,
            puts_in_flight: vec![0; size],
            dirty: vec![false; size],
            puts_issued: vec![0; size],
            puts_reported: vec![0; size],
            inbox: Vec::new(),
            sequence: 0,
            receive_size,
            failure: None,
            random: SplitMix64::seed_from_u64(
                config.seed ^ (rank as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ),
        })
    }

    /// Opens the control words to the peers and learns theirs.
    fn start(&mut self, peers: Vec<(NodeId, PortId)>) -> Result<(), ArmciError> {
        // The thesis's second pairwise exchange: the NIC's, in its PE form.
        self.group = Group::from_endpoints(peers.iter().copied())
            .map_err(|e| ArmciError::Invalid(format!("the ranks' ports: {e}")))?
            .with_algorithm(nicbar::Algorithm::PairwiseExchange);
        self.peers = peers;
        self.groups = vec![Some(self.world_group_state())];
        self.port.allow_remote_memory_access()?;
        let key = self.control.key();
        let entries = self.exchange(&key.to_le_bytes())?;
        self.control_keys = entries
            .iter()
            .map(|entry| read_u32(entry, 0))
            .collect::<Option<_>>()
            .ok_or_else(|| ArmciError::Protocol("a start entry is short".to_owned()))?;
        Ok(())
    }

    /// Ends this rank: every put complete, a last barrier, the port closed. Collective.
    ///
    /// # Errors
    /// A put that failed, or the barrier.
    pub fn finalize(mut self) -> Result<(), ArmciError> {
        let outcome = self.barrier();
        if let Some(placement) = &self.placement {
            launch::leave(placement);
        }
        let closed = self.port.close();
        outcome?;
        closed.map_err(ArmciError::Port)
    }

    /// This rank (`armci_me`).
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the job (`armci_nproc`).
    pub fn size(&self) -> usize {
        self.peers.len()
    }

    /// The configuration the job runs.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Switches the job to `config` (a benchmark compares modes in one job). Every rank must
    /// switch to the same configuration at the same point, right after a barrier, with no lock
    /// held and no mutexes created (a new lock mode reads the lock words its own way: this rank's
    /// accumulate lock is reset here, and mutexes must be created afresh).
    pub fn set_config(&mut self, config: Config) {
        if config.lock != self.config.lock {
            // Past the barrier no peer touches this rank's lock words.
            self.control
                .bytes()
                .write(control::ACC_LOCK as usize, &[0; 16]);
        }
        self.config = config;
    }

    /// NIC puts this rank posted to `rank` since it started (a put longer than 256 KiB is
    /// several): how a strided or vector transfer was cut shows here.
    pub fn puts_posted(&self, rank: usize) -> u64 {
        self.puts_issued.get(rank).copied().unwrap_or(0)
    }

    /// The port (for its node and port ids and counters).
    pub fn port(&self) -> &Port {
        &self.port
    }

    pub(crate) fn check_rank(&self, rank: usize) -> Result<(), ArmciError> {
        if rank < self.size() {
            Ok(())
        } else {
            Err(ArmciError::Invalid(format!(
                "rank {rank} is not in a job of {} ranks",
                self.size()
            )))
        }
    }

    /// A number from the process's generator.
    pub(crate) fn next_random(&mut self) -> u64 {
        self.random.next_u64()
    }

    // ---- progress -------------------------------------------------------------------------

    /// Takes the port's next event, waiting until `deadline` (for ever if `None`) for one, and
    /// files it. Returns whether one came.
    ///
    /// # Errors
    /// The port failing (the daemon gone).
    pub(crate) fn progress(&mut self, deadline: Option<Instant>) -> Result<bool, ArmciError> {
        let event = match self.port.receive()? {
            Some(event) => Some(event),
            None => match deadline {
                None => Some(self.port.blocking_receive()?),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    self.port.receive_timeout(left)?
                }
            },
        };
        match event {
            Some(event) => {
                self.file(event);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Files every event already waiting, without blocking.
    pub(crate) fn poll(&mut self) -> Result<(), ArmciError> {
        while let Some(event) = self.port.receive()? {
            self.file(event);
        }
        Ok(())
    }

    fn file(&mut self, event: Event) {
        match event {
            Event::OperationDone {
                context,
                status,
                value,
                ..
            } => match self.pending.remove(&context) {
                Some(Pending::Put {
                    rank,
                    staging,
                    handle,
                }) => {
                    self.staging.give_back(staging);
                    self.puts_in_flight[rank] = self.puts_in_flight[rank].saturating_sub(1);
                    match handle {
                        Some(handle) => self.handle_done(handle, "put", rank, status),
                        None => self.keep_failure("put", rank, status),
                    }
                }
                Some(Pending::Land {
                    rank,
                    staging,
                    len,
                    address,
                    handle,
                }) => {
                    if status == Status::SUCCESS
                        && let Some(lander) = self.lander
                    {
                        lander(address, self.staging.region.bytes(), staging, len);
                    }
                    self.staging.give_back(staging);
                    self.handle_done(handle, "get", rank, status);
                }
                Some(Pending::Waited) => {
                    let rank = 0;
                    self.finished.insert(
                        context,
                        Outcome {
                            status,
                            value,
                            rank,
                        },
                    );
                }
                Some(Pending::Background { what, rank }) => self.keep_failure(what, rank, status),
                None => {}
            },
            Event::Received {
                buffer,
                length,
                sender_node,
                sender_port,
                status,
                ..
            } => {
                if status == Status::SUCCESS {
                    self.keep_message(&buffer[..length], (sender_node, sender_port));
                }
                let size = self.receive_size;
                if let Err(e) = self
                    .port
                    .provide_receive_buffer(buffer, size, Priority::LOW, 0)
                {
                    self.failure.get_or_insert(ArmciError::Port(e.error));
                }
            }
            Event::Sent {
                context: message::WAKE_CONTEXT,
                ..
            } => {}
            Event::Sent {
                status,
                target_node,
                target_port,
                ..
            } if status != Status::SUCCESS => {
                let rank = self.rank_of(target_node, target_port).unwrap_or(usize::MAX);
                self.keep_failure("message", rank, status);
            }
            Event::SendRejected { status, .. } => {
                self.keep_failure("message", usize::MAX, status);
            }
            _ => {}
        }
    }

    /// Counts down `handle`'s operations for one that ended with `status`.
    fn handle_done(&mut self, handle: u64, what: &'static str, rank: usize, status: Status) {
        let state = self.handles.entry(handle).or_default();
        state.outstanding = state.outstanding.saturating_sub(1);
        if status != Status::SUCCESS {
            state
                .failure
                .get_or_insert(ArmciError::Operation { what, rank, status });
        }
    }

    fn keep_failure(&mut self, what: &'static str, rank: usize, status: Status) {
        if status != Status::SUCCESS {
            self.failure
                .get_or_insert(ArmciError::Operation { what, rank, status });
        }
    }

    /// Drops the kept failure of a background operation `what` to `rank`, if that is the one
    /// kept (a caller that reports the failure in its own words).
    pub(crate) fn forget_failure(&mut self, what: &'static str, rank: usize) {
        if matches!(&self.failure, Some(ArmciError::Operation { what: w, rank: r, .. })
            if *w == what && *r == rank)
        {
            self.failure = None;
        }
    }

    fn rank_of(&self, node: NodeId, port: PortId) -> Option<usize> {
        self.peers.iter().position(|&p| p == (node, port))
    }

    /// Keeps a peer's message, if it parses and comes from the port of the rank it names.
    fn keep_message(&mut self, bytes: &[u8], sender: (NodeId, PortId)) {
        let Some(from) = self.rank_of(sender.0, sender.1) else {
            return;
        };
        if bytes.len() < message::HEADER
            || u16::from_le_bytes([bytes[0], bytes[1]]) != message::MAGIC
            || read_u32(bytes, 8).map(|r| r as usize) != Some(from)
        {
            return;
        }
        let kind = bytes[2];
        if kind == message::WAKE {
            // Its arrival woke the waiter; the flags it points at are in memory.
            return;
        }
        self.inbox.push(Message {
            kind,
            group: read_u32(bytes, 12).unwrap_or(0),
            round: bytes[3],
            sequence: read_u32(bytes, 4).unwrap_or(0),
            from,
            payload: bytes[message::HEADER..].to_vec(),
        });
    }

    /// Takes the message of `kind`, `sequence` and `round` from `from`, waiting for it until
    /// the collective timeout.
    pub(crate) fn take_message(
        &mut self,
        kind: u8,
        sequence: u32,
        round: u8,
        from: usize,
        what: &'static str,
    ) -> Result<Vec<u8>, ArmciError> {
        self.take_message_in(0, kind, sequence, round, from, what)
    }

    /// As [`Armci::take_message`], for a message of the process group tagged `group`.
    pub(crate) fn take_message_in(
        &mut self,
        group: u32,
        kind: u8,
        sequence: u32,
        round: u8,
        from: usize,
        what: &'static str,
    ) -> Result<Vec<u8>, ArmciError> {
        let deadline = Instant::now() + self.config.collective_timeout;
        loop {
            if let Some(at) = self.inbox.iter().position(|m| {
                m.kind == kind
                    && m.group == group
                    && m.sequence == sequence
                    && m.round == round
                    && m.from == from
            }) {
                return Ok(self.inbox.swap_remove(at).payload);
            }
            if let Some(failure) = self.failure.take() {
                return Err(failure);
            }
            if !self.progress(Some(deadline))? && Instant::now() >= deadline {
                return Err(ArmciError::Timeout { what, rank: from });
            }
        }
    }

    /// Sends a message of `kind` to `rank`.
    pub(crate) fn send_message(
        &mut self,
        rank: usize,
        kind: u8,
        sequence: u32,
        round: u8,
        payload: &[u8],
    ) -> Result<(), ArmciError> {
        self.send_message_in(0, rank, kind, sequence, round, payload)
    }

    /// As [`Armci::send_message`], for the process group tagged `group`.
    pub(crate) fn send_message_in(
        &mut self,
        group: u32,
        rank: usize,
        kind: u8,
        sequence: u32,
        round: u8,
        payload: &[u8],
    ) -> Result<(), ArmciError> {
        let len = message::HEADER + payload.len();
        // Every message is of the one size class the ranks provide buffers of: the NIC puts a
        // message only into a buffer of its own size class.
        let size = self.receive_size;
        if len > nicbar::max_length_for_size(size) as usize {
            return Err(ArmciError::Invalid(format!("a message of {len} bytes")));
        }
        let mut buffer: DmaBuffer = loop {
            match self.port.dma_alloc(len) {
                Ok(buffer) => break buffer,
                // Buffers of sends in flight come back with their SENT events.
                Err(PortError::ArenaFull { .. }) => {
                    self.progress(None)?;
                }
                Err(error) => return Err(error.into()),
            }
        };
        buffer[0..2].copy_from_slice(&message::MAGIC.to_le_bytes());
        buffer[2] = kind;
        buffer[3] = round;
        buffer[4..8].copy_from_slice(&sequence.to_le_bytes());
        buffer[8..12].copy_from_slice(&(self.rank as u32).to_le_bytes());
        buffer[12..16].copy_from_slice(&group.to_le_bytes());
        buffer[message::HEADER..len].copy_from_slice(payload);
        let (node, port) = self.peers[rank];
        let context = if kind == message::WAKE {
            message::WAKE_CONTEXT
        } else {
            0
        };
        loop {
            match self
                .port
                .send(buffer, len, size, Priority::LOW, node, port, context)
            {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.error, PortError::NoSendTokens) => {
                    buffer = e.buffer;
                    self.progress(None)?;
                }
                Err(e) => return Err(e.error.into()),
            }
        }
    }

    // ---- operations -----------------------------------------------------------------------

    fn context(&mut self) -> u64 {
        self.next_context = self.next_context.wrapping_add(1);
        self.next_context
    }

    /// Posts a get of `len` bytes at the remote pointer `remote` of `rank` into the staging
    /// area at `start`: waited for by its context, or, with `(address, handle)`, landed at
    /// `address` under `handle` when it ends. Returns its context.
    pub(crate) fn post_retrying_get(
        &mut self,
        remote: u64,
        start: usize,
        len: usize,
        rank: usize,
        pending: Option<(u64, u64)>,
    ) -> Result<u64, ArmciError> {
        let (node, port) = self.peers[rank];
        let region = self.staging.region.clone();
        let pending = match pending {
            Some((address, handle)) => Pending::Land {
                rank,
                staging: start,
                len,
                address,
                handle,
            },
            None => Pending::Waited,
        };
        self.post_retrying(
            |p, context| p.get(remote, &region, start, len, node, port, context),
            pending,
        )
    }

    /// Posts with `post`, waiting for a send token (a finished operation gives one back) as
    /// long as the port has none.
    fn post_retrying(
        &mut self,
        mut post: impl FnMut(&mut Port, u64) -> Result<(), PortError>,
        pending: Pending,
    ) -> Result<u64, ArmciError> {
        let context = self.context();
        loop {
            match post(&mut self.port, context) {
                Ok(()) => {
                    self.pending.insert(context, pending);
                    return Ok(context);
                }
                Err(PortError::NoSendTokens) => {
                    self.progress(None)?;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Waits for the operation `context` and returns how it ended.
    pub(crate) fn wait(&mut self, context: u64, rank: usize) -> Result<Outcome, ArmciError> {
        loop {
            if let Some(mut outcome) = self.finished.remove(&context) {
                outcome.rank = rank;
                return Ok(outcome);
            }
            self.progress(None)?;
        }
    }

    /// Waits for `context` and fails unless it succeeded.
    pub(crate) fn wait_success(
        &mut self,
        context: u64,
        rank: usize,
        what: &'static str,
    ) -> Result<u64, ArmciError> {
        let outcome = self.wait(context, rank)?;
        if outcome.status == Status::SUCCESS {
            Ok(outcome.value)
        } else {
            Err(ArmciError::Operation {
                what,
                rank,
                status: outcome.status,
            })
        }
    }

    /// Posts the atomic `op` on the word `remote` of `rank`; returns its context.
    pub(crate) fn post_atomic(
        &mut self,
        op: AtomicOp,
        rank: usize,
        remote: u64,
        operand: u64,
        compare: u64,
        background: Option<&'static str>,
    ) -> Result<u64, ArmciError> {
        let (node, port) = self.peers[rank];
        let pending = match background {
            Some(what) => Pending::Background { what, rank },
            None => Pending::Waited,
        };
        self.post_retrying(
            |p, context| p.atomic(op, remote, operand, compare, node, port, context),
            pending,
        )
    }

    /// Applies the atomic `op` on the word `remote` of `rank` and returns the word's previous
    /// value.
    pub(crate) fn atomic(
        &mut self,
        op: AtomicOp,
        rank: usize,
        remote: u64,
        operand: u64,
        compare: u64,
    ) -> Result<u64, ArmciError> {
        let context = self.post_atomic(op, rank, remote, operand, compare, None)?;
        self.wait_success(context, rank, "atomic")
    }

    /// A remote pointer to the control word at `offset` of `rank`.
    pub(crate) fn control_word(&self, rank: usize, offset: u32) -> u64 {
        RemotePointer {
            key: self.control_keys[rank],
            offset,
        }
        .to_u64()
    }

    /// A staging lease of `len` bytes, waiting for the NIC to finish with older ones.
    pub(crate) fn lease(&mut self, len: usize) -> Result<usize, ArmciError> {
        loop {
            if let Some(start) = self.staging.take(len) {
                return Ok(start);
            }
            self.progress(None)?;
        }
    }

    /// Puts `src` to the remote pointer `remote` of `rank` from the staging area: returns once
    /// `src` is copied (ARMCI's local completion); the fences and barriers wait for the rest.
    pub(crate) fn put_remote(
        &mut self,
        src: &[u8],
        remote: u64,
        rank: usize,
    ) -> Result<(), ArmciError> {
        self.put_remote_under(src, remote, rank, None)
    }

    /// As [`Armci::put_remote`], each piece counted under `handle` if there is one (whose wait
    /// then returns once the pieces are in the target's memory).
    pub(crate) fn put_remote_under(
        &mut self,
        src: &[u8],
        remote: u64,
        rank: usize,
        handle: Option<u64>,
    ) -> Result<(), ArmciError> {
        let (node, port) = self.peers[rank];
        let pointer = RemotePointer::from_u64(remote);
        for (index, piece) in src.chunks(PIECE).enumerate() {
            let start = self.lease(piece.len())?;
            self.staging.region.bytes().write(start, piece);
            let offset = pointer.offset + (index * PIECE) as u32;
            let remote = RemotePointer {
                key: pointer.key,
                offset,
            }
            .to_u64();
            let region = self.staging.region.clone();
            let len = piece.len();
            self.post_retrying(
                |p, context| p.put(&region, start, remote, len, node, port, context),
                Pending::Put {
                    rank,
                    staging: start,
                    handle,
                },
            )?;
            if let Some(handle) = handle {
                self.handles.entry(handle).or_default().outstanding += 1;
            }
            self.puts_in_flight[rank] += 1;
            self.puts_issued[rank] += 1;
            self.dirty[rank] = true;
        }
        Ok(())
    }

    /// Puts `src` to `remote` of `rank` and waits until it is in the target's memory.
    pub(crate) fn put_remote_complete(
        &mut self,
        src: &[u8],
        remote: u64,
        rank: usize,
    ) -> Result<(), ArmciError> {
        let (node, port) = self.peers[rank];
        let pointer = RemotePointer::from_u64(remote);
        for (index, piece) in src.chunks(PIECE).enumerate() {
            let start = self.lease(piece.len())?;
            self.staging.region.bytes().write(start, piece);
            let remote = RemotePointer {
                key: pointer.key,
                offset: pointer.offset + (index * PIECE) as u32,
            }
            .to_u64();
            let region = self.staging.region.clone();
            let len = piece.len();
            let context = self.post_retrying(
                |p, context| p.put(&region, start, remote, len, node, port, context),
                Pending::Waited,
            )?;
            let outcome = self.wait(context, rank);
            self.staging.give_back(start);
            let outcome = outcome?;
            if outcome.status != Status::SUCCESS {
                return Err(ArmciError::Operation {
                    what: "put",
                    rank,
                    status: outcome.status,
                });
            }
        }
        Ok(())
    }

    /// Gets `dst.len()` bytes from the remote pointer `remote` of `rank` into `dst`.
    pub(crate) fn get_remote(
        &mut self,
        remote: u64,
        dst: &mut [u8],
        rank: usize,
    ) -> Result<(), ArmciError> {
        let (node, port) = self.peers[rank];
        let pointer = RemotePointer::from_u64(remote);
        for (index, piece) in dst.chunks_mut(PIECE).enumerate() {
            let start = self.lease(piece.len())?;
            let remote = RemotePointer {
                key: pointer.key,
                offset: pointer.offset + (index * PIECE) as u32,
            }
            .to_u64();
            let region = self.staging.region.clone();
            let len = piece.len();
            let context = self.post_retrying(
                |p, context| p.get(remote, &region, start, len, node, port, context),
                Pending::Waited,
            )?;
            let outcome = self.wait(context, rank);
            if let Ok(outcome) = &outcome
                && outcome.status == Status::SUCCESS
            {
                self.staging.region.bytes().read(start, piece);
            }
            self.staging.give_back(start);
            let outcome = outcome?;
            if outcome.status != Status::SUCCESS {
                return Err(ArmciError::Operation {
                    what: "get",
                    rank,
                    status: outcome.status,
                });
            }
        }
        Ok(())
    }

    /// The remote pointer to `len` bytes at `address` of `rank`'s memory from
    /// [`Armci::malloc`].
    pub(crate) fn resolve(&self, rank: usize, address: u64, len: usize) -> Result<u64, ArmciError> {
        self.check_rank(rank)?;
        for allocation in &self.allocations {
            let base = allocation.bases[rank];
            let end = base + allocation.lens[rank];
            if base != 0
                && address >= base
                && address
                    .checked_add(len as u64)
                    .is_some_and(|last| last <= end)
            {
                return Ok(RemotePointer {
                    key: allocation.keys[rank],
                    offset: (address - base) as u32,
                }
                .to_u64());
            }
        }
        Err(ArmciError::Invalid(format!(
            "{len} bytes at {address:#x} are not in memory rank {rank} allocated with ARMCI_Malloc"
        )))
    }
}

/// The little-endian `u32` at `at` of `bytes`.
pub(crate) fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The little-endian `u64` at `at` of `bytes`.
pub(crate) fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_leases_wrap_and_come_back_in_any_order() {
        let mut taken = Vec::new();
        let mut staging = FakeStaging::new(100);
        taken.push(staging.take(40).unwrap());
        taken.push(staging.take(40).unwrap());
        assert_eq!(taken, [0, 40]);
        assert_eq!(staging.take(40), None, "only 20 bytes are free at the end");
        staging.give_back(40);
        assert_eq!(
            staging.take(30),
            None,
            "the oldest lease still holds the front"
        );
        staging.give_back(0);
        assert_eq!(staging.take(100), Some(0), "everything came back");
        staging.give_back(0);
        let a = staging.take(60).unwrap();
        let b = staging.take(30).unwrap();
        staging.give_back(a);
        assert_eq!(staging.take(50), Some(0), "wraps to the front");
        assert_eq!(
            staging.take(20),
            None,
            "[50, 60) is too short and b holds [60, 90)"
        );
        staging.give_back(b);
    }

    /// The allocator's logic over a length only.
    struct FakeStaging {
        len: usize,
        leases: VecDeque<(usize, usize, bool)>,
    }

    impl FakeStaging {
        fn new(len: usize) -> Self {
            Self {
                len,
                leases: VecDeque::new(),
            }
        }
        fn take(&mut self, len: usize) -> Option<usize> {
            take_in(&mut self.leases, self.len, len)
        }
        fn give_back(&mut self, start: usize) {
            give_back_in(&mut self.leases, start);
        }
    }
}
