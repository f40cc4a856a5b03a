//! MVAPICH's RDMA-write eager fast path (Liu, Wu, Kini, Wyckoff, Panda, *High Performance
//! RDMA-Based MPI Implementation over InfiniBand*), over the port's puts, beside the ordinary
//! send/receive path it falls back to; and remote locks on the peers' memory (`lock`): truly
//! passive ones on NIC atomics, and the baseline the target's process serves.
//!
//! # The fast path
//!
//! Each receiver keeps, for each peer in its **polling set**, a persistent ring of fixed-size
//! slots in memory registered with its port. The sender keeps the mirror image: a staging ring
//! of the same slots in its own registered memory. Sending a small message is one put: the sender
//! fills staging slot `n % slots` and puts it into the receiver's slot `n % slots`. The receiver
//! learns of it by polling its memory — no event, no receive buffer, no NIC-to-host message
//! descriptor. A slot holds:
//!
//! ```text
//!  0  ring sequence (head flag)   u64   the slot's number on this ring, from 1; never repeats
//!  8  message sequence            u64   the pair's message number over both paths, from 1
//! 16  length                      u32
//! 20  checksum                    u32   FNV-1a over message sequence, length and payload
//! 24  acknowledgement             u64   slots the sender consumed of the reverse ring (credits)
//! 32  payload                     length bytes, padded to 8
//!  .  ring sequence (tail flag)   u64   the same number again, right after the payload
//! ```
//!
//! The receiver checks the head flag of its next slot against the ring sequence it expects; a
//! stale slot holds the number of a lap before, which is never the expected one, so no flag ever
//! needs clearing. It then reads the length, finds the tail flag right after the payload, and
//! waits for it to hold the same number. **Ordering:** the NIC applies a put's segments in
//! order, and writes each segment's bytes front to back (the emulated NIC: one
//! `process_vm_writev` per segment), so the tail flag, at the highest address the put writes, is
//! the last of its bytes to land — the same assumption MVAPICH makes of the HCA's DMA order. The
//! checksum guards the one place the assumption is weakest (a CPU may make the stores of one
//! string copy visible out of order): a slot whose tail flag holds but whose checksum does not is
//! read again until it does, and reported as corrupt if it never does.
//!
//! **Flow control:** a sender may have at most `slots` messages on a ring that the receiver has
//! not consumed. The receiver hands back credits by piggybacking its consumed count of the
//! reverse ring on every fast-path message it sends, and, when half a ring is consumed and
//! unreported, by a one-byte put of that count (modulo 256, which is unambiguous since a ring has
//! at most 128 slots) into a credit byte in the sender's registered memory. A byte cannot be
//! torn, so the sender reads it at any time; only one credit put per peer is in flight at once.
//!
//! **Fallback and order:** a message longer than the receiver's slots, one to a peer that has no
//! room left on its ring, and one to a peer outside the receiver's polling set, goes the ordinary
//! way: a message into a receive buffer the library keeps provided, tagged with the same
//! per-pair message sequence. The receiver delivers each pair's messages strictly by that
//! sequence, from whichever path holds the next one; a message that arrives ahead of its turn
//! waits in a small per-peer stash. So messages of one pair arrive in the order they were sent,
//! whichever path each took.
//!
//! **Polling set:** the receiver polls the rings of at most `polling_set` peers (MVAPICH bounds
//! it so that polling time does not grow with the number of connections): the first peers it
//! connects to. Peers beyond it get no ring, and their senders use the ordinary path.
//!
//! **Connection setup:** [`FastPath::connect`] registers the ring (and the credit byte) for the
//! peer and sends a hello over the ordinary path: the region's key, the ring's place and shape,
//! and the key of this process's lock region. A hello sent before the peer opened its port is
//! sent again. A hello whose numbers do not fit is refused (counted in [`Stats::rejected`]).

mod lock;

pub use lock::LockMode;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use shared_abi::MTU_PAYLOAD;
use shared_abi::event::Status;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::rdma::{AtomicOp, RemotePointer};
use shared_abi::token::Priority;

use crate::dma::DmaBuffer;
use crate::error::Error;
use crate::event::Event;
use crate::port::Port;
use crate::port::memory::MemoryRegion;

/// Bytes of the header of every ordinary message the fast path sends: its kind and the pair's
/// message sequence.
const ORDINARY_HEADER: usize = 16;
/// The longest message [`FastPath::send`] takes: what one ordinary message carries after its
/// header.
pub const MAX_MESSAGE: usize = BUFFER_LEN - ORDINARY_HEADER;
/// The most slots a ring may have (credits travel modulo 256).
pub const MAX_SLOTS: u32 = 128;
/// Bytes a slot takes besides its payload: the header and the tail flag.
pub const SLOT_OVERHEAD: usize = 40;
/// The size class of every ordinary message: the largest whose messages are one packet.
const SIZE_CLASS: u8 = 12;
/// Bytes of each receive buffer: what a message of [`SIZE_CLASS`] holds (GM's
/// `gm_max_length_for_size`).
const BUFFER_LEN: usize = shared_abi::max_length_for_size(SIZE_CLASS) as usize;
const _: () = assert!(
    BUFFER_LEN <= MTU_PAYLOAD,
    "an ordinary message is one packet"
);
/// Messages a peer may have waiting out of turn before it is reported as broken.
const STASH_LIMIT: usize = 4096;
/// How long a slot whose tail flag holds may fail its checksum before it is reported as corrupt.
const TORN_LIMIT: Duration = Duration::from_millis(500);
/// Bytes of a staging slot: the longest slot there is.
const STAGING_SLOT: usize = SLOT_OVERHEAD + MAX_MESSAGE.div_ceil(8) * 8;
/// How soon a hello refused for a closed port is sent again.
const HELLO_RETRY: Duration = Duration::from_millis(10);

/// Ordinary message kinds (the first byte).
mod kind {
    pub(super) const HELLO: u8 = 1;
    pub(super) const DATA: u8 = 2;
    pub(super) const LOCK_REQUEST: u8 = 3;
    pub(super) const LOCK_GRANT: u8 = 4;
    pub(super) const LOCK_RELEASE: u8 = 5;
}

/// What an operation's or send's context names (the top byte).
mod tag {
    pub(super) const FAST_PUT: u64 = 1;
    pub(super) const CREDIT_PUT: u64 = 2;
    pub(super) const WAITED: u64 = 3;
    pub(super) const HELLO: u64 = 4;
    pub(super) const DATA: u64 = 5;
    pub(super) const CONTROL: u64 = 6;
}

fn context(tag: u64, peer: usize, serial: u64) -> u64 {
    tag << 56 | (peer as u64 & 0xff_ffff) << 32 | (serial & 0xffff_ffff)
}

fn context_tag(context: u64) -> u64 {
    context >> 56
}

fn context_peer(context: u64) -> usize {
    ((context >> 32) & 0xff_ffff) as usize
}

/// The fast path's shape on this side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathConfig {
    /// Slots of each ring this process receives on (1..=[`MAX_SLOTS`]); 0 turns the fast path off
    /// toward this process (every peer then uses the ordinary path to it).
    pub slots: u32,
    /// Payload bytes a slot holds (at most [`MAX_MESSAGE`]); longer messages fall back.
    pub slot_payload: usize,
    /// Peers whose rings this process polls: the first this many it connects to.
    pub polling_set: usize,
    /// The most peers this process connects to.
    pub max_peers: usize,
    /// Receive buffers kept provided for the ordinary path.
    pub receive_buffers: usize,
    /// Lock words this process hosts for its peers ([`FastPath::lock`]).
    pub locks: usize,
    /// Bytes of shared memory after the lock words that peers read and write with
    /// [`FastPath::read_u64`] and [`FastPath::write_u64`] (whole 8-byte words).
    pub shared_bytes: usize,
    /// How long [`FastPath::wait_connected`] and a send to a peer not yet connected wait.
    pub setup_timeout: Duration,
}

impl Default for FastPathConfig {
    fn default() -> Self {
        Self {
            slots: 32,
            slot_payload: 1024,
            polling_set: 8,
            max_peers: 64,
            receive_buffers: 32,
            locks: 1,
            shared_bytes: 64,
            setup_timeout: Duration::from_secs(30),
        }
    }
}

/// A peer of [`FastPath::connect`]: its index in this process's peer list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub usize);

/// Which path a message took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// A put into the receiver's ring.
    Fast,
    /// An ordinary message.
    Ordinary,
}

/// A message [`FastPath::poll`] or [`FastPath::receive_timeout`] delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Who sent it.
    pub peer: PeerId,
    /// Its bytes.
    pub data: Vec<u8>,
    /// The path it came by.
    pub route: Route,
}

/// What the fast path did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages sent by put into a ring.
    pub sent_fast: u64,
    /// Messages sent the ordinary way because they were longer than the receiver's slots.
    pub fallback_too_long: u64,
    /// Messages sent the ordinary way because the receiver's ring had no room (no credit).
    pub fallback_no_credit: u64,
    /// Messages sent the ordinary way because the receiver keeps no ring for this process
    /// (outside its polling set, or its fast path off), or because the caller asked.
    pub fallback_no_ring: u64,
    /// Messages received from rings.
    pub received_fast: u64,
    /// Messages received the ordinary way.
    pub received_ordinary: u64,
    /// Messages delivered after waiting for an earlier one of the same pair.
    pub reordered: u64,
    /// Credit puts sent (besides piggybacked acknowledgements).
    pub credit_puts: u64,
    /// Hellos, messages and slots refused as malformed, duplicated or from no known peer.
    pub rejected: u64,
}

/// What this process learnt of a peer from its hello.
#[derive(Clone, Copy, Debug)]
struct Remote {
    ring_key: u32,
    ring_offset: u32,
    credit_offset: u32,
    slots: u32,
    slot_size: usize,
    lock_key: u32,
    locks: u32,
    lock_len: u32,
}

#[derive(Debug)]
struct Peer {
    node: NodeId,
    port: PortId,
    /// Where the peer's ring lies in the receiving region, its slots (0: not in the polling set)
    /// and their size.
    ring: usize,
    slots: u32,
    slot_size: usize,
    /// Where the credit byte the peer puts lies in the receiving region; the byte credits to it
    /// are sent from follows 8 bytes on.
    credit: usize,
    remote: Option<Remote>,
    hello_sent: bool,
    hello_retry: Option<Instant>,
    /// Sending: the next message sequence, fast-path slots used, and slots the peer consumed.
    next_seq: u64,
    fast_sent: u64,
    fast_credited: u64,
    /// Receiving: the next message sequence to deliver, slots consumed, consumption reported.
    expected: u64,
    consumed: u64,
    reported: u64,
    credit_in_flight: bool,
    stash: BTreeMap<u64, (Vec<u8>, Route)>,
    torn_since: Option<Instant>,
    failed: Option<String>,
}

/// The RDMA-write eager fast path over a port: see the module's documentation.
///
/// It owns the port and takes every event from it: a caller's own calls through
/// [`FastPath::port_mut`] should be ones that produce no events (their events would be dropped).
#[derive(Debug)]
pub struct FastPath {
    port: Port,
    config: FastPathConfig,
    peers: Vec<Peer>,
    by_address: HashMap<(NodeId, PortId), usize>,
    /// Hellos from peers not connected yet (their bytes, as received).
    early: Vec<(NodeId, PortId, Vec<u8>)>,
    spare: Vec<DmaBuffer>,
    /// Where the polling of rings and the delivery start next (round robin).
    next_poll: usize,
    polled: usize,
    /// The receiving region: every peer's credit bytes (16 bytes each), then the rings of the
    /// polling set.
    receiving: MemoryRegion,
    /// The staging slots fast-path puts are sent from (one per send token, each as long as the
    /// longest slot), and those free.
    staging: MemoryRegion,
    staging_free: Vec<usize>,
    /// This process's lock words and shared bytes, and a small region for its gets and puts.
    lock_region: MemoryRegion,
    scratch: MemoryRegion,
    /// Results of operations waited for: context -> (status, value).
    results: HashMap<u64, (Status, u64)>,
    serial: u64,
    served: lock::Served,
    stats: Stats,
}

/// FNV-1a over a slot's message sequence, length and payload.
fn checksum(seq: u64, payload: &[u8]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for byte in seq
        .to_le_bytes()
        .iter()
        .chain((payload.len() as u32).to_le_bytes().iter())
        .chain(payload)
    {
        hash ^= u32::from(*byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash
}

fn align8(len: usize) -> usize {
    len.div_ceil(8) * 8
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    let b = bytes.get(at..at + 8)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(b);
    Some(u64::from_le_bytes(word))
}

impl FastPath {
    /// The fast path over `port`: registers the lock region and provides the receive buffers.
    ///
    /// # Errors
    /// [`Error::Protocol`] for a `config` out of bounds; what registering memory or providing
    /// buffers returns.
    pub fn new(mut port: Port, config: FastPathConfig) -> Result<Self, Error> {
        if config.slots > MAX_SLOTS || config.slot_payload > MAX_MESSAGE {
            return Err(Error::Protocol(format!(
                "a fast path of {} slots of {} bytes: at most {MAX_SLOTS} slots of {MAX_MESSAGE}",
                config.slots, config.slot_payload
            )));
        }
        let lock_len = 8 * config.locks + align8(config.shared_bytes);
        let lock_region = port.register_memory(lock_len.max(8))?;
        let slot_size = SLOT_OVERHEAD + align8(config.slot_payload);
        let rings = if config.slots > 0 {
            config.polling_set * config.slots as usize * slot_size
        } else {
            0
        };
        let receiving = port.register_memory(16 * config.max_peers + rings)?;
        let staging_slots = port.endpoint.raw().send_token_total() as usize;
        let staging = port.register_memory(staging_slots * STAGING_SLOT)?;
        let scratch = port.register_memory(64)?;
        port.allow_remote_memory_access()?;
        for _ in 0..config.receive_buffers {
            let buffer = port.dma_alloc(BUFFER_LEN)?;
            port.provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, 0)
                .map_err(|e| e.error)?;
        }
        Ok(Self {
            port,
            config,
            peers: Vec::new(),
            by_address: HashMap::new(),
            early: Vec::new(),
            spare: Vec::new(),
            next_poll: 0,
            polled: 0,
            receiving,
            staging,
            staging_free: (0..staging_slots).rev().collect(),
            lock_region,
            scratch,
            results: HashMap::new(),
            serial: 0,
            served: lock::Served::new(config.locks),
            stats: Stats::default(),
        })
    }

    /// The port.
    pub fn port(&self) -> &Port {
        &self.port
    }

    /// The port, for calls of the caller's own (whose events this fast path will take and
    /// drop if they are not its own: keep to calls that produce none).
    pub fn port_mut(&mut self) -> &mut Port {
        &mut self.port
    }

    /// What the fast path did so far.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// This process's lock words and shared bytes (lock `i` at offset `8 * i`, the shared bytes
    /// after the last lock).
    pub fn lock_region(&self) -> &MemoryRegion {
        &self.lock_region
    }

    /// How many lock words `peer` hosts (its [`FastPathConfig::locks`]), waiting for its hello as
    /// a send does.
    ///
    /// # Errors
    /// [`Error::Protocol`] for an unknown peer, or one silent for the setup timeout.
    pub fn peer_locks(&mut self, peer: PeerId) -> Result<usize, Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        Ok(self.peers[index].remote.map_or(0, |r| r.locks as usize))
    }

    /// The peer at `node`/`port`, if connected.
    pub fn peer(&self, node: NodeId, port: PortId) -> Option<PeerId> {
        self.by_address.get(&(node, port)).copied().map(PeerId)
    }

    /// Connects to `port` of `node`: registers a ring for it if the polling set has room, and
    /// sends it this side's hello. Does not wait: the peer connects back in its own time
    /// ([`FastPath::wait_connected`]); connecting to every peer first and waiting once lets
    /// processes connect in any order.
    ///
    /// # Errors
    /// What registering memory or sending returns.
    pub fn connect(&mut self, node: NodeId, port: PortId) -> Result<PeerId, Error> {
        if let Some(&index) = self.by_address.get(&(node, port)) {
            return Ok(PeerId(index));
        }
        let index = self.peers.len();
        if index >= self.config.max_peers {
            return Err(Error::Protocol(format!(
                "a fast path of at most {} peers",
                self.config.max_peers
            )));
        }
        let polled = self.config.slots > 0 && self.polled < self.config.polling_set;
        let slot_size = SLOT_OVERHEAD + align8(self.config.slot_payload);
        let ring =
            16 * self.config.max_peers + self.polled * self.config.slots as usize * slot_size;
        let slots = if polled {
            self.polled += 1;
            self.config.slots
        } else {
            0
        };
        self.peers.push(Peer {
            node,
            port,
            ring,
            slots,
            slot_size,
            credit: 16 * index,
            remote: None,
            hello_sent: false,
            hello_retry: None,
            next_seq: 1,
            fast_sent: 0,
            fast_credited: 0,
            expected: 1,
            consumed: 0,
            reported: 0,
            credit_in_flight: false,
            stash: BTreeMap::new(),
            torn_since: None,
            failed: None,
        });
        self.by_address.insert((node, port), index);
        self.send_hello(index)?;
        // A hello that came before the connect.
        let early = std::mem::take(&mut self.early);
        for (n, p, bytes) in early {
            if (n, p) == (node, port) {
                self.take_hello(index, &bytes)?;
            } else {
                self.early.push((n, p, bytes));
            }
        }
        Ok(PeerId(index))
    }

    /// Waits until every connected peer's hello has come.
    ///
    /// # Errors
    /// [`Error::Protocol`] naming the peers still silent after the setup timeout.
    pub fn wait_connected(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.config.setup_timeout;
        while self.peers.iter().any(|p| p.remote.is_none()) {
            if Instant::now() >= deadline {
                let silent: Vec<String> = self
                    .peers
                    .iter()
                    .filter(|p| p.remote.is_none())
                    .map(|p| format!("{}:{}", p.node.get(), p.port.0))
                    .collect();
                return Err(Error::Protocol(format!(
                    "no fast-path hello from {} within {:?}",
                    silent.join(", "),
                    self.config.setup_timeout
                )));
            }
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }

    fn send_hello(&mut self, index: usize) -> Result<(), Error> {
        let peer = &self.peers[index];
        let mut hello = [0u8; ORDINARY_HEADER + 32];
        hello[0] = kind::HELLO;
        let fields = [
            self.receiving.key(),
            peer.ring as u32,
            peer.credit as u32,
            peer.slots,
            peer.slot_size as u32,
            self.lock_region.key(),
            self.config.locks as u32,
            self.lock_region.len() as u32,
        ];
        for (i, field) in fields.iter().enumerate() {
            let at = ORDINARY_HEADER + 4 * i;
            hello[at..at + 4].copy_from_slice(&field.to_le_bytes());
        }
        let (node, port) = (peer.node, peer.port);
        self.peers[index].hello_sent = true;
        self.send_ordinary(&hello, node, port, context(tag::HELLO, index, 0))
    }

    fn take_hello(&mut self, index: usize, bytes: &[u8]) -> Result<(), Error> {
        let field = |i: usize| u32_at(bytes, ORDINARY_HEADER + 4 * i);
        let fields: Option<Vec<u32>> = (0..8).map(field).collect();
        let Some(f) = fields else {
            self.stats.rejected += 1;
            return Ok(());
        };
        let remote = Remote {
            ring_key: f[0],
            ring_offset: f[1],
            credit_offset: f[2],
            slots: f[3],
            slot_size: f[4] as usize,
            lock_key: f[5],
            locks: f[6],
            lock_len: f[7],
        };
        let sane = remote.slots <= MAX_SLOTS
            && (remote.slots == 0
                || (remote.slot_size >= SLOT_OVERHEAD
                    && remote.slot_size <= SLOT_OVERHEAD + align8(MAX_MESSAGE)
                    && remote.slot_size % 8 == 0));
        if !sane || self.peers[index].remote.is_some() {
            self.stats.rejected += 1;
            return Ok(());
        }
        self.peers[index].remote = Some(remote);
        Ok(())
    }

    /// Sends `data` to `peer`: by put into its ring when it fits a slot and the ring has room,
    /// else the ordinary way; returns the path taken. Waits (making progress) for the peer's hello
    /// and for a send token, never for the receiver.
    ///
    /// # Errors
    /// [`Error::TooLong`] beyond [`MAX_MESSAGE`]; [`Error::Protocol`] if the peer failed (a send
    /// to it failed, or it wrote a corrupt slot) or did not connect within the setup timeout.
    pub fn send(&mut self, peer: PeerId, data: &[u8]) -> Result<Route, Error> {
        self.send_by(peer, data, true)
    }

    /// Sends `data` to `peer` the ordinary way even if it would fit the fast path (in order with
    /// the pair's other messages): the baseline.
    ///
    /// # Errors
    /// As [`FastPath::send`].
    pub fn send_ordinary_path(&mut self, peer: PeerId, data: &[u8]) -> Result<(), Error> {
        self.send_by(peer, data, false).map(|_| ())
    }

    fn send_by(&mut self, peer: PeerId, data: &[u8], fast: bool) -> Result<Route, Error> {
        if data.len() > MAX_MESSAGE {
            return Err(Error::TooLong {
                length: data.len(),
                max: MAX_MESSAGE,
            });
        }
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        self.progress()?;
        self.check_failed(index)?;
        let remote = self.peers[index].remote.ok_or(Error::DaemonGone)?;
        let fits = remote.slots > 0 && data.len() <= remote.slot_size - SLOT_OVERHEAD;
        if fast && fits {
            self.refresh_credit(index);
            let p = &self.peers[index];
            if p.fast_sent - p.fast_credited < u64::from(remote.slots) {
                self.put_slot(index, data, remote)?;
                self.stats.sent_fast += 1;
                return Ok(Route::Fast);
            }
            self.stats.fallback_no_credit += 1;
        } else if remote.slots == 0 || !fast {
            self.stats.fallback_no_ring += 1;
        } else {
            self.stats.fallback_too_long += 1;
        }
        let seq = self.peers[index].next_seq;
        self.peers[index].next_seq += 1;
        let mut bytes = Vec::with_capacity(ORDINARY_HEADER + data.len());
        bytes.push(kind::DATA);
        bytes.extend_from_slice(&[0; 7]);
        bytes.extend_from_slice(&seq.to_le_bytes());
        bytes.extend_from_slice(data);
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.send_ordinary(&bytes, node, port, context(tag::DATA, index, seq))?;
        Ok(Route::Ordinary)
    }

    fn check_peer(&self, peer: PeerId) -> Result<usize, Error> {
        if peer.0 < self.peers.len() {
            Ok(peer.0)
        } else {
            Err(Error::Protocol(format!("no peer {}", peer.0)))
        }
    }

    fn check_failed(&self, index: usize) -> Result<(), Error> {
        match &self.peers[index].failed {
            Some(why) => Err(Error::Protocol(why.clone())),
            None => Ok(()),
        }
    }

    /// Waits for `index`'s hello.
    fn await_remote(&mut self, index: usize) -> Result<(), Error> {
        if self.peers[index].remote.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + self.config.setup_timeout;
        while self.peers[index].remote.is_none() {
            self.check_failed(index)?;
            if Instant::now() >= deadline {
                return Err(Error::Protocol(format!(
                    "no fast-path hello from peer {index} within {:?}",
                    self.config.setup_timeout
                )));
            }
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Takes the credit byte the peer last put.
    fn refresh_credit(&mut self, index: usize) {
        let peer = &mut self.peers[index];
        let Some(remote) = peer.remote else { return };
        let mut byte = [0u8];
        self.receiving.bytes().read(peer.credit, &mut byte);
        let behind = u64::from((peer.fast_sent as u8).wrapping_sub(byte[0]));
        if behind <= u64::from(remote.slots) {
            let credited = peer.fast_sent - behind;
            peer.fast_credited = peer.fast_credited.max(credited);
        }
    }

    fn put_slot(&mut self, index: usize, data: &[u8], remote: Remote) -> Result<(), Error> {
        // A staging slot whose last put has completed (there is one per send token).
        let entry = loop {
            if let Some(entry) = self.staging_free.pop() {
                break entry;
            }
            self.progress()?;
            std::thread::yield_now();
        };
        let staging = self.staging.clone();
        let from = entry * STAGING_SLOT;
        let peer = &mut self.peers[index];
        let slot = (peer.fast_sent % u64::from(remote.slots)) as usize;
        let ring_seq = peer.fast_sent + 1;
        let seq = peer.next_seq;
        let base = slot * remote.slot_size;
        let tail = 32 + align8(data.len());
        let mut bytes = vec![0u8; tail + 8];
        bytes[0..8].copy_from_slice(&ring_seq.to_le_bytes());
        bytes[8..16].copy_from_slice(&seq.to_le_bytes());
        bytes[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        bytes[20..24].copy_from_slice(&checksum(seq, data).to_le_bytes());
        bytes[24..32].copy_from_slice(&peer.consumed.to_le_bytes());
        bytes[32..32 + data.len()].copy_from_slice(data);
        bytes[tail..tail + 8].copy_from_slice(&ring_seq.to_le_bytes());
        staging.bytes().write(from, &bytes);
        let target = RemotePointer {
            key: remote.ring_key,
            offset: remote.ring_offset,
        }
        .add(base as u64)
        .ok_or(Error::DaemonGone)?
        .to_u64();
        let (node, port) = (peer.node, peer.port);
        let ctx = context(tag::FAST_PUT, index, entry as u64);
        self.with_token(|port_| port_.put(&staging, from, target, bytes.len(), node, port, ctx))?;
        let peer = &mut self.peers[index];
        peer.reported = peer.consumed;
        peer.fast_sent += 1;
        peer.next_seq += 1;
        Ok(())
    }

    /// Runs `post` until it finds a send token, making progress between tries.
    fn with_token(
        &mut self,
        mut post: impl FnMut(&mut Port) -> Result<(), Error>,
    ) -> Result<(), Error> {
        loop {
            match post(&mut self.port) {
                Err(Error::NoSendTokens) => {
                    self.progress()?;
                    std::thread::yield_now();
                }
                other => return other,
            }
        }
    }

    fn send_ordinary(
        &mut self,
        bytes: &[u8],
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let mut buffer = match self.spare.pop() {
            Some(buffer) => buffer,
            None => self.port.dma_alloc(BUFFER_LEN)?,
        };
        buffer[..bytes.len()].copy_from_slice(bytes);
        loop {
            match self.port.send(
                buffer,
                bytes.len(),
                SIZE_CLASS,
                Priority::LOW,
                node,
                port,
                context,
            ) {
                Ok(()) => return Ok(()),
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    buffer = refused.buffer;
                    self.progress()?;
                    std::thread::yield_now();
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    return Err(refused.error);
                }
            }
        }
    }

    /// The next message, if one is ready: polls the rings of the polling set and takes the port's
    /// events (serving the locks this process hosts meanwhile). Never blocks.
    ///
    /// # Errors
    /// [`Error::Protocol`] if a peer broke the protocol (a corrupt slot, too many messages out of
    /// turn) or a send to it failed: that peer is failed from then on, the others unaffected.
    pub fn poll(&mut self) -> Result<Option<Message>, Error> {
        self.progress()?;
        self.poll_rings()?;
        Ok(self.deliver())
    }

    /// Waits at most `timeout` for the next message, polling (the rings are memory: no event
    /// announces a put into them).
    ///
    /// # Errors
    /// As [`FastPath::poll`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, Error> {
        let deadline = Instant::now() + timeout;
        let mut idle = 0u32;
        loop {
            if let Some(message) = self.poll()? {
                return Ok(Some(message));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            idle += 1;
            if idle % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Waits until every message and put this process sent has completed at its target.
    ///
    /// # Errors
    /// As [`FastPath::poll`]; [`Error::Protocol`] if a send failed.
    pub fn flush(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.config.setup_timeout;
        loop {
            self.progress()?;
            for index in 0..self.peers.len() {
                self.check_failed(index)?;
            }
            let busy = self.port.send_tokens() < self.port_tokens_total()
                || self.peers.iter().any(|p| p.credit_in_flight);
            if !busy {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Protocol("sends still outstanding".into()));
            }
            std::thread::yield_now();
        }
    }

    fn port_tokens_total(&self) -> u32 {
        self.port.endpoint.raw().send_token_total()
    }

    /// Takes every waiting event of the port, and sends again the hellos that are due.
    pub(crate) fn progress(&mut self) -> Result<(), Error> {
        while let Some(event) = self.port.receive()? {
            self.handle(event)?;
        }
        let now = Instant::now();
        for index in 0..self.peers.len() {
            if self.peers[index].hello_retry.is_some_and(|at| at <= now) {
                self.peers[index].hello_retry = None;
                self.send_hello(index)?;
            }
        }
        Ok(())
    }

    fn handle(&mut self, event: Event) -> Result<(), Error> {
        match event {
            Event::Received {
                buffer,
                length,
                sender_node,
                sender_port,
                status,
                ..
            } => {
                let bytes = buffer[..length.min(buffer.len())].to_vec();
                self.port
                    .provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, 0)
                    .map_err(|e| e.error)?;
                if status == Status::SUCCESS {
                    self.take_message(sender_node, sender_port, &bytes)?;
                } else {
                    self.stats.rejected += 1;
                }
            }
            Event::Sent {
                buffer,
                context,
                status,
                ..
            } => {
                self.spare.push(buffer);
                self.sent(context, status);
            }
            Event::SendRejected {
                buffer,
                context,
                status,
                ..
            } => {
                if let Some(buffer) = buffer {
                    self.spare.push(buffer);
                }
                self.sent(context, status);
            }
            Event::OperationDone {
                context,
                status,
                value,
                ..
            } => {
                let index = context_peer(context);
                match context_tag(context) {
                    tag::CREDIT_PUT => {
                        if let Some(peer) = self.peers.get_mut(index) {
                            peer.credit_in_flight = false;
                        }
                        self.operation_failed(index, status, "a credit put");
                        self.return_credit(index);
                    }
                    tag::FAST_PUT => {
                        self.staging_free.push((context & 0xffff_ffff) as usize);
                        self.operation_failed(index, status, "a fast-path put");
                    }
                    tag::WAITED => {
                        self.results.insert(context, (status, value));
                    }
                    _ => {}
                }
            }
            Event::ReceiveRejected {
                buffer: Some(buffer),
                ..
            } => {
                // Keep the buffer as a spare send buffer; the port stays usable.
                self.spare.push(buffer);
            }
            _ => {}
        }
        Ok(())
    }

    fn operation_failed(&mut self, index: usize, status: Status, what: &str) {
        if status != Status::SUCCESS
            && let Some(peer) = self.peers.get_mut(index)
            && peer.failed.is_none()
        {
            peer.failed = Some(format!(
                "{what} to {}:{} failed: {status:?}",
                peer.node.get(),
                peer.port.0
            ));
        }
    }

    fn sent(&mut self, context: u64, status: Status) {
        let index = context_peer(context);
        match context_tag(context) {
            tag::HELLO if status == Status::TARGET_PORT_CLOSED => {
                // The peer has not opened its port yet: say it again.
                if let Some(peer) = self.peers.get_mut(index) {
                    peer.hello_retry = Some(Instant::now() + HELLO_RETRY);
                }
            }
            tag::HELLO | tag::DATA | tag::CONTROL => {
                self.operation_failed(index, status, "a message");
            }
            _ => {}
        }
    }

    fn take_message(&mut self, node: NodeId, port: PortId, bytes: &[u8]) -> Result<(), Error> {
        let Some(&kind) = bytes.first() else {
            self.stats.rejected += 1;
            return Ok(());
        };
        let known = self.by_address.get(&(node, port)).copied();
        match (kind, known) {
            (kind::HELLO, Some(index)) => self.take_hello(index, bytes)?,
            (kind::HELLO, None) => {
                if self.early.len() < 1024 {
                    self.early.push((node, port, bytes.to_vec()));
                } else {
                    self.stats.rejected += 1;
                }
            }
            (kind::DATA, Some(index)) => {
                let Some(seq) = u64_at(bytes, 8) else {
                    self.stats.rejected += 1;
                    return Ok(());
                };
                let payload = bytes[ORDINARY_HEADER.min(bytes.len())..].to_vec();
                self.stats.received_ordinary += 1;
                self.stash(index, seq, payload, Route::Ordinary);
            }
            (kind::LOCK_REQUEST | kind::LOCK_GRANT | kind::LOCK_RELEASE, Some(index)) => {
                self.take_lock_message(index, kind, bytes)?;
            }
            _ => self.stats.rejected += 1,
        }
        Ok(())
    }

    fn stash(&mut self, index: usize, seq: u64, data: Vec<u8>, route: Route) {
        let peer = &mut self.peers[index];
        if seq < peer.expected || peer.stash.contains_key(&seq) {
            self.stats.rejected += 1;
            return;
        }
        if peer.stash.len() >= STASH_LIMIT {
            peer.failed.get_or_insert_with(|| {
                format!(
                    "{}:{} sent more than {STASH_LIMIT} messages out of turn",
                    peer.node.get(),
                    peer.port.0
                )
            });
            return;
        }
        peer.stash.insert(seq, (data, route));
    }

    /// Reads every complete slot of the polling set's rings.
    fn poll_rings(&mut self) -> Result<(), Error> {
        let count = self.peers.len();
        for step in 0..count {
            let index = (self.next_poll + step) % count;
            if self.peers[index].slots == 0 {
                continue;
            }
            while self.read_slot(index)? {}
            // A credit put that found no send token before goes now.
            self.return_credit(index);
        }
        Ok(())
    }

    /// Reads the next slot of `index`'s ring if it is complete; returns whether it was.
    fn read_slot(&mut self, index: usize) -> Result<bool, Error> {
        let peer = &mut self.peers[index];
        if peer.failed.is_some() {
            return Ok(false);
        }
        let ring_seq = peer.consumed + 1;
        let base = peer.ring + (peer.consumed % u64::from(peer.slots)) as usize * peer.slot_size;
        let bytes = self.receiving.bytes();
        if bytes.load_u64(base) != ring_seq {
            return Ok(false);
        }
        let mut header = [0u8; 32];
        bytes.read(base, &mut header);
        let seq = u64_at(&header, 8).unwrap_or(0);
        let len = u32_at(&header, 16).unwrap_or(u32::MAX) as usize;
        let sum = u32_at(&header, 20).unwrap_or(0);
        let ack = u64_at(&header, 24).unwrap_or(0);
        let tail = 32 + align8(len);
        if tail + 8 > peer.slot_size {
            peer.failed = Some(format!(
                "{}:{} wrote a fast-path slot of {len} bytes into slots of {}",
                peer.node.get(),
                peer.port.0,
                peer.slot_size - SLOT_OVERHEAD
            ));
            return Err(Error::Protocol(peer.failed.clone().unwrap_or_default()));
        }
        if bytes.load_u64(base + tail) != ring_seq {
            return Ok(false); // Still landing.
        }
        let data = bytes.to_vec(base + 32, len);
        if checksum(seq, &data) != sum {
            let since = *peer.torn_since.get_or_insert_with(Instant::now);
            if since.elapsed() < TORN_LIMIT {
                return Ok(false);
            }
            peer.failed = Some(format!(
                "{}:{} wrote a corrupt fast-path slot (checksum)",
                peer.node.get(),
                peer.port.0
            ));
            return Err(Error::Protocol(peer.failed.clone().unwrap_or_default()));
        }
        peer.torn_since = None;
        peer.consumed += 1;
        if ack <= peer.fast_sent {
            peer.fast_credited = peer.fast_credited.max(ack);
        }
        self.stats.received_fast += 1;
        self.stash(index, seq, data, Route::Fast);
        self.return_credit(index);
        Ok(true)
    }

    /// Puts the consumed count to the peer when half a ring is unreported.
    fn return_credit(&mut self, index: usize) {
        let Some(peer) = self.peers.get_mut(index) else {
            return;
        };
        let Some(remote) = peer.remote else { return };
        let threshold = u64::from(peer.slots / 2).max(1);
        if peer.slots == 0 || peer.credit_in_flight || peer.consumed - peer.reported < threshold {
            return;
        }
        let at = peer.credit + 8;
        self.receiving.bytes().write(at, &[peer.consumed as u8]);
        let target = RemotePointer {
            key: remote.ring_key,
            offset: remote.credit_offset,
        }
        .to_u64();
        let (node, port, region) = (peer.node, peer.port, self.receiving.clone());
        let ctx = context(tag::CREDIT_PUT, index, peer.consumed);
        // Without a send token now, the credit goes with the next call that finds one.
        if self
            .port
            .put(&region, at, target, 1, node, port, ctx)
            .is_ok()
        {
            let peer = &mut self.peers[index];
            peer.credit_in_flight = true;
            peer.reported = peer.consumed;
            self.stats.credit_puts += 1;
        }
    }

    /// The next message in turn, from the peers in round-robin order.
    fn deliver(&mut self) -> Option<Message> {
        let count = self.peers.len();
        for step in 0..count {
            let index = (self.next_poll + step) % count;
            let peer = &mut self.peers[index];
            let ahead = peer.stash.len() > 1;
            if let Some((data, route)) = peer.stash.remove(&peer.expected) {
                peer.expected += 1;
                if ahead {
                    self.stats.reordered += 1;
                }
                self.next_poll = (index + 1) % count;
                return Some(Message {
                    peer: PeerId(index),
                    data,
                    route,
                });
            }
        }
        None
    }

    /// Posts an atomic, get or put on `peer` and waits for its completion (making progress).
    fn wait_operation(
        &mut self,
        index: usize,
        post: impl Fn(&mut Port, u64) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        self.serial += 1;
        let ctx = context(tag::WAITED, index, self.serial);
        self.with_token(|port| post(port, ctx))?;
        let deadline = Instant::now() + self.config.setup_timeout;
        loop {
            if let Some((status, value)) = self.results.remove(&ctx) {
                if status != Status::SUCCESS {
                    return Err(Error::Refused(format!(
                        "an operation on peer {index} failed: {status:?}"
                    )));
                }
                return Ok(value);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Protocol("an operation did not complete".into()));
            }
            self.progress()?;
            if !self.results.contains_key(&ctx) {
                // Its completion is an event: wait for one as the port's wait mode says.
                self.port.wait_ready(deadline - now)?;
            }
        }
    }

    fn lock_pointer(&self, index: usize, offset: usize, len: usize) -> Result<u64, Error> {
        let remote = self.peers[index]
            .remote
            .ok_or_else(|| Error::Protocol(format!("peer {index} has not connected")))?;
        if offset + len > remote.lock_len as usize {
            return Err(Error::TooLong {
                length: offset + len,
                max: remote.lock_len as usize,
            });
        }
        Ok(RemotePointer {
            key: remote.lock_key,
            offset: offset as u32,
        }
        .to_u64())
    }

    /// Reads the 64-bit word at byte `offset` of `peer`'s shared bytes (after its lock words) with
    /// a get: no atomicity with other processes.
    ///
    /// # Errors
    /// [`Error::TooLong`] outside the shared bytes; [`Error::Refused`] if the get failed.
    pub fn read_u64(&mut self, peer: PeerId, offset: usize) -> Result<u64, Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        let remote = self.lock_pointer(index, 8 * locks + offset, 8)?;
        let (node, port, scratch) = (
            self.peers[index].node,
            self.peers[index].port,
            self.scratch.clone(),
        );
        self.wait_operation(index, |p, ctx| {
            p.get(remote, &scratch, 0, 8, node, port, ctx)
        })?;
        Ok(scratch.bytes().load_u64(0))
    }

    /// Writes `value` to the 64-bit word at byte `offset` of `peer`'s shared bytes with a put, and
    /// waits until it is in the peer's memory.
    ///
    /// # Errors
    /// As [`FastPath::read_u64`].
    pub fn write_u64(&mut self, peer: PeerId, offset: usize, value: u64) -> Result<(), Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        let remote = self.lock_pointer(index, 8 * locks + offset, 8)?;
        let (node, port, scratch) = (
            self.peers[index].node,
            self.peers[index].port,
            self.scratch.clone(),
        );
        // The scratch word is rewritten only once the previous operation on it completed.
        scratch.bytes().write(8, &value.to_le_bytes());
        self.wait_operation(index, |p, ctx| {
            p.put(&scratch, 8, remote, 8, node, port, ctx)
        })
        .map(|_| ())
    }

    fn atomic_on_lock(
        &mut self,
        index: usize,
        lock: usize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64, Error> {
        let remote = self.lock_pointer(index, 8 * lock, 8)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        if lock >= locks {
            return Err(Error::Protocol(format!(
                "peer {index} hosts {locks} locks, not lock {lock}"
            )));
        }
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.wait_operation(index, |p, ctx| {
            p.atomic(op, remote, operand, compare, node, port, ctx)
        })
    }

    /// This process's identity in lock words: its node and port, never 0.
    fn lock_owner(&self) -> u64 {
        (u64::from(self.port.node_id().get()) << 8 | u64::from(self.port.port_id().0)) + 1
    }

    fn send_control(&mut self, index: usize, kind: u8, lock: usize, flag: u8) -> Result<(), Error> {
        let mut bytes = [0u8; ORDINARY_HEADER];
        bytes[0] = kind;
        bytes[1] = flag;
        bytes[8..16].copy_from_slice(&(lock as u64).to_le_bytes());
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.send_ordinary(&bytes, node, port, context(tag::CONTROL, index, 0))
    }
}
