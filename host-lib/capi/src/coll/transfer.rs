//! The NIC level of the collectives (CollGM §3.2, its "GM level"): reliable transfers of any
//! length between the members of a group over nicbar messages, keyed by (communicator, operation,
//! part) and the sending port, and arrivals saved until they are wanted.
//!
//! A message longer than one packet is cut into segments here, by [`segments`] alone (the one
//! place to switch when the NIC segments messages itself). Every segment carries a small header
//! (the key, its offset and the message's total length), so the receiver assembles a message
//! whatever order its segments come in — a segment the NIC gave up on (after the receiver-not-
//! ready time, or the give-up time of a NIC that answered nothing) is sent again, until the
//! retry window closes, and may then arrive after the ones behind it.
//!
//! The port keeps [`RECEIVE_BUFFERS`] buffers provided at all times: each arrival is copied out
//! and its buffer provided again at once, so a sender waits only while its receiver is outside
//! the library. Arrivals nobody asked for yet wait in memory (the unexpected-event saving of
//! CollGM §3.2); a malformed or duplicated segment is dropped and counted, never trusted.
//!
//! A message of [`RENDEZVOUS_THRESHOLD`] bytes or more goes by rendezvous (CollGM §3.3) instead:
//!
//! 1. the sender sends a ready-to-send naming the message (key, length, the sender's id for it);
//! 2. the receiver answers at once, whatever it is doing in the library — wanted or not yet —
//!    with a clear-to-send naming a registered landing region of its own (a remote pointer) big
//!    enough, or with a refusal if it cannot register memory (the sender then sends eagerly);
//! 3. the sender copies the message into a registered region of its own and puts it into the
//!    landing region, [`PUT_CHUNK`] bytes per put, [`PUTS_IN_FLIGHT`] puts at once;
//! 4. when every put has completed at the target (its `OperationDone`: the bytes are in the
//!    receiver's memory), the sender sends a small "done"; the receiver copies the message out
//!    and it has arrived, as an eager one would.
//!
//! A rank that passes a message on (the inner ranks of a broadcast tree) can ask for it to be
//! *forwarded* ([`Transfers::forward`], CollGM §3.3's message forwarding): each eager segment of
//! it, as it arrives, goes on to the next ranks from the receive buffer it arrived in — the NIC
//! sends that very buffer to the first of them (a spare send buffer takes its place among the
//! provided ones), and a copy of it to the others — while it is also copied out for the caller.
//! The segment is on its way down the tree before the message is whole, and no copy is made
//! into a send buffer for the first child. A message that comes by rendezvous is passed on as an
//! ordinary send once it is whole.
//!
//! Data nobody asked for yet is bounded: what an endpoint holds of messages it has not asked
//! for (being assembled, arrived, or landing regions registered for them) stays under a limit
//! ([`UNEXPECTED_LIMIT`], `NICBAR_COLL_UNEXPECTED_BYTES`), each message counted as at least one
//! segment. Past it, a ready-to-send waits unanswered until there is room or the message is
//! asked for, and an eager message is dropped and remembered: asking for it then fails, naming
//! its sender and the limit. A message asked for is always taken. So a member that sends
//! garbage lengths cannot make another register or allocate gigabytes.
//!
//! Answering at once means a rendezvous needs no order among the ranks' receives: a collective
//! whose ranks wait for each other in any order still moves. Landing and source regions come
//! from one pool per endpoint ([`RegionPool`]): registering is a round trip to the NIC and the
//! kernel, so a region is registered once and reused by later transfers of its size or less,
//! and only a few are kept when idle. The "done" waits for the puts' remote completion rather
//! than riding the connection's ordering behind them, so a put the NIC refused (a closed port, a
//! bad key) fails the send instead of handing the receiver bytes that never came.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar_rs::{
    DmaBuffer, Error, Event, Member, MemoryRegion, Port, Priority, RemotePointer, Status,
};
use shared_abi::MTU_PAYLOAD;

/// The receive buffers' tag: arrivals carrying another are not the collectives'.
pub(crate) const RECEIVE_TAG: u32 = u32::from_le_bytes(*b"NBCL");
/// The first bytes of every segment.
const MAGIC: u32 = u32::from_le_bytes(*b"NBC1");
/// Bytes of the header before each segment's payload.
pub(crate) const HEADER_LEN: usize = 32;
/// Payload bytes per segment.
pub(crate) const SEGMENT_PAYLOAD: usize = BUFFER_LEN - HEADER_LEN;
/// The size class of every send and receive buffer: the largest whose messages are one packet.
const SIZE_CLASS: u8 = 12;
/// Bytes of every send and receive buffer: what a message of [`SIZE_CLASS`] holds (GM's
/// `gm_max_length_for_size`).
const BUFFER_LEN: usize = shared_abi::max_length_for_size(SIZE_CLASS) as usize;
const _: () = assert!(BUFFER_LEN <= MTU_PAYLOAD, "a segment is one packet");
/// Receive buffers kept provided (the NIC holds 64 per port; the rest is the barriers' room).
pub(crate) const RECEIVE_BUFFERS: usize = 48;
/// Send buffers, so segments in the NIC at once (the NIC takes 32 sends per port).
pub(crate) const SEND_BUFFERS: usize = 24;

/// Messages of this many bytes or more go by rendezvous (RDMA put into the receiver's
/// registered memory); shorter ones eagerly, in segments. CollGM's eager segments are 64 KiB, and
/// so is the point where its rendezvous takes over: below it the handshake's two extra messages
/// cost more than the copies through receive buffers save. `NICBAR_COLL_RENDEZVOUS` (a byte
/// count, or `off`) changes it per process; the ranks need not agree, since each message's
/// sender chooses and a receiver takes either.
pub(crate) const RENDEZVOUS_THRESHOLD: usize = 64 * 1024;
/// Bytes each put of a rendezvous carries (the NIC cuts it into packets).
pub(crate) const PUT_CHUNK: usize = 64 * 1024;
/// Puts of one rendezvous in the NIC at once: enough to keep the wire busy while completions
/// come back, few enough to leave the port's send tokens to the eager segments.
pub(crate) const PUTS_IN_FLIGHT: usize = 4;
/// Idle registered regions the pool keeps for later transfers (more are deregistered).
const POOL_KEEP: usize = 8;
/// Bytes of idle registered regions the pool keeps at most (the largest go first past it).
const POOL_KEEP_BYTES: usize = 64 << 20;
/// The smallest region the pool registers (smaller requests get this much, for reuse).
const POOL_MINIMUM: usize = 64 * 1024;
/// Bytes of messages not asked for yet an endpoint holds at most (`NICBAR_COLL_UNEXPECTED_BYTES`
/// changes it per process).
pub(crate) const UNEXPECTED_LIMIT: usize = 1 << 30;
/// Messages refused for the limit that are remembered (and ready-to-sends kept waiting for room);
/// past this many, they are dropped unremembered.
const REFUSED_KEEP: usize = 4096;
/// The first bytes of every rendezvous control message.
const RENDEZVOUS_MAGIC: u32 = u32::from_le_bytes(*b"NBR1");
/// Bytes of a rendezvous control message.
const CONTROL_LEN: usize = 40;

/// What names one message among a sender's: the communicator, the operation on it, and the
/// part of the operation (a phase, a segment of a pipeline).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Key {
    /// The communicator's context id.
    pub(crate) context: u32,
    /// The operation's sequence number on the communicator.
    pub(crate) sequence: u32,
    /// The part of the operation.
    pub(crate) part: u32,
}

/// A segment's header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Header {
    key: Key,
    offset: u64,
    total: u64,
}

impl Header {
    fn write(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.key.context.to_le_bytes());
        out[8..12].copy_from_slice(&self.key.sequence.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.part.to_le_bytes());
        out[16..24].copy_from_slice(&self.offset.to_le_bytes());
        out[24..32].copy_from_slice(&self.total.to_le_bytes());
    }

    /// The header of `bytes`, if they start with one.
    fn parse(bytes: &[u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        let long = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        if word(0)? != MAGIC {
            return None;
        }
        Some(Self {
            key: Key {
                context: word(4)?,
                sequence: word(8)?,
                part: word(12)?,
            },
            offset: long(16)?,
            total: long(24)?,
        })
    }
}

/// What a rendezvous control message says.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ControlKind {
    /// Ready to send: `value` is the message's length.
    Ready,
    /// Clear to send: `value` is the remote pointer of the landing region.
    Clear,
    /// The receiver cannot take the message by rendezvous: send it eagerly.
    Refuse,
    /// Every byte is in the landing region.
    Done,
}

impl ControlKind {
    fn code(self) -> u32 {
        match self {
            Self::Ready => 1,
            Self::Clear => 2,
            Self::Refuse => 3,
            Self::Done => 4,
        }
    }

    fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::Ready,
            2 => Self::Clear,
            3 => Self::Refuse,
            4 => Self::Done,
            _ => return None,
        })
    }
}

/// A rendezvous control message: a message's key, the sender's id for it, and a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Control {
    kind: ControlKind,
    key: Key,
    /// The sender's id of the message ([`SendId`]): a clear-to-send and a "done" name it.
    id: u64,
    value: u64,
}

impl Control {
    fn to_bytes(self) -> [u8; CONTROL_LEN] {
        let mut out = [0u8; CONTROL_LEN];
        out[0..4].copy_from_slice(&RENDEZVOUS_MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.key.context.to_le_bytes());
        out[8..12].copy_from_slice(&self.key.sequence.to_le_bytes());
        out[12..16].copy_from_slice(&self.key.part.to_le_bytes());
        out[16..20].copy_from_slice(&self.kind.code().to_le_bytes());
        out[24..32].copy_from_slice(&self.id.to_le_bytes());
        out[32..40].copy_from_slice(&self.value.to_le_bytes());
        out
    }

    /// The control message `bytes` are, if they are exactly one.
    fn parse(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != CONTROL_LEN {
            return None;
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let long = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(word)
        };
        if word(0) != RENDEZVOUS_MAGIC || word(20) != 0 {
            return None;
        }
        Some(Self {
            kind: ControlKind::from_code(word(16))?,
            key: Key {
                context: word(4),
                sequence: word(8),
                part: word(12),
            },
            id: long(24),
            value: long(32),
        })
    }
}

/// Registered regions kept for rendezvous transfers, landing and source alike.
#[derive(Default)]
struct RegionPool {
    idle: Vec<MemoryRegion>,
    /// Regions registered so far.
    registered: u64,
}

impl RegionPool {
    /// An idle region of at least `len` bytes (the smallest such), or a new one.
    fn take(&mut self, port: &mut Port, len: usize) -> Result<MemoryRegion, Error> {
        if let Some(at) = (0..self.idle.len())
            .filter(|&at| self.idle[at].len() >= len)
            .min_by_key(|&at| self.idle[at].len())
        {
            return Ok(self.idle.swap_remove(at));
        }
        // Registered a little larger than asked, so a later transfer a little larger reuses it.
        let size = len
            .checked_next_power_of_two()
            .unwrap_or(len)
            .max(POOL_MINIMUM)
            .min(shared_abi::rdma::MAX_RDMA_LENGTH as usize)
            .max(len);
        let region = port.register_memory(size)?;
        self.registered += 1;
        Ok(region)
    }

    /// `region` is free again, for later transfers ([`RegionPool::trim`] deregisters extras).
    fn give(&mut self, region: MemoryRegion) {
        self.idle.push(region);
    }

    /// Deregisters idle regions while more than [`POOL_KEEP`] are idle (the smallest first) or
    /// they hold more than [`POOL_KEEP_BYTES`] (the largest first).
    fn trim(&mut self, port: &mut Port) {
        loop {
            let bytes: usize = self.idle.iter().map(MemoryRegion::len).sum();
            let lengths = (0..self.idle.len()).map(|at| (self.idle[at].len(), at));
            let at = if self.idle.len() > POOL_KEEP {
                lengths.min()
            } else if bytes > POOL_KEEP_BYTES {
                lengths.max()
            } else {
                None
            };
            let Some((_, at)) = at else {
                break;
            };
            let region = self.idle.swap_remove(at);
            let _ = port.deregister_memory(&region);
        }
    }
}

/// The segments of a message of `total` bytes: (offset, length) each. A message of no bytes is
/// one empty segment, so that its arrival is still seen.
pub(crate) fn segments(total: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = segment_count(total);
    (0..count).map(move |index| {
        let offset = index * SEGMENT_PAYLOAD;
        (offset, (total - offset).min(SEGMENT_PAYLOAD))
    })
}

/// How many segments [`segments`] cuts `total` bytes into.
fn segment_count(total: usize) -> usize {
    total.div_ceil(SEGMENT_PAYLOAD).max(1)
}

/// Names a message posted with [`Transfers::send`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct SendId(u64);

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TransferError {
    /// The NIC could not deliver to `peer`: `status` says why (its port closed; or, for longer
    /// than the retry window, its NIC answered nothing or it had no buffer).
    Peer {
        /// The receiver.
        peer: Member,
        /// The send's end.
        status: Status,
    },
    /// The port failed under the transfers.
    Port(String),
    /// `peer`'s message came before it was asked for, and holding it would have passed this
    /// process's limit of unexpected data: it was dropped.
    OverLimit {
        /// The sender.
        peer: Member,
        /// The message's length.
        bytes: usize,
        /// The limit.
        limit: usize,
    },
}

impl std::fmt::Display for TransferError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer { peer, status } => {
                let why = match *status {
                    Status::TARGET_PORT_CLOSED => "its port closed".to_owned(),
                    Status::TARGET_NODE_UNREACHABLE => "its NIC stopped answering".to_owned(),
                    Status::SEND_TIMED_OUT => "it took no data for too long".to_owned(),
                    other => format!("the send ended with status {}", other.0),
                };
                write!(f, "sending to {peer} failed: {why}")
            }
            Self::Port(message) => write!(f, "the port failed: {message}"),
            Self::OverLimit { peer, bytes, limit } => write!(
                f,
                "the message of {bytes} bytes from {peer} came before it was asked for, past \
                 this process's limit of {limit} bytes of unexpected data, and was dropped \
                 (NICBAR_COLL_UNEXPECTED_BYTES raises the limit)"
            ),
        }
    }
}

/// A message not yet wholly handed to the NIC.
struct Outgoing {
    id: SendId,
    to: Member,
    key: Key,
    data: Arc<[u8]>,
    /// Index of the next segment to post.
    next: usize,
    /// A rendezvous control message: `data` goes as it is, in one packet, with no header.
    control: bool,
}

impl Outgoing {
    /// Packets the message takes.
    fn packets(&self) -> usize {
        if self.control {
            1
        } else {
            segment_count(self.data.len())
        }
    }
}

/// Where a rendezvous send stands.
enum Rendezvous {
    /// The ready-to-send is out; the receiver's answer has not come.
    Asking { data: Arc<[u8]> },
    /// The receiver's landing region is known: the message is in `region` and goes there by
    /// puts.
    Putting {
        region: MemoryRegion,
        /// The landing region's remote pointer.
        remote: RemotePointer,
        total: usize,
        /// Offset of the first byte no put has carried yet.
        next: usize,
        /// Chunks to put again (their put was given up on): (offset, length).
        again: Vec<(usize, usize)>,
        /// Puts in the NIC.
        in_flight: usize,
        /// Bytes the target has.
        landed: usize,
    },
}

/// A put of a rendezvous in the NIC, by its context.
struct PutFlight {
    id: SendId,
    to: Member,
    offset: usize,
    length: usize,
}

/// A rendezvous the receiver has answered: where the message lands, until its "done".
struct Landing {
    id: u64,
    total: usize,
    region: MemoryRegion,
}

/// A segment in the NIC, by the send's context.
struct InFlight {
    id: SendId,
    to: Member,
    length: usize,
    /// A forwarded packet not yet handed to the NIC (its send's `unposted` still counts it).
    fresh: bool,
}

/// A message's sends: segments not yet handed to the NIC, segments not yet delivered, its
/// error if one failed, and whether its sender has stopped asking (it was handed over whole).
struct SendRecord {
    unposted: usize,
    undelivered: usize,
    error: Option<TransferError>,
    detached: bool,
    /// The rendezvous under way, if the message goes by one (`None` once its "done" is queued).
    rendezvous: Option<(Member, Key, Rendezvous)>,
    /// A rendezvous control message of the transfers' own, not a caller's message.
    internal: bool,
    /// The forward (sender and key) this send passes on, while none of its message has come.
    awaiting: Option<(Member, Key)>,
}

impl SendRecord {
    /// The record of a message not yet handed to the NIC, in `packets` packets.
    fn new(packets: usize) -> Self {
        Self {
            unposted: packets,
            undelivered: packets,
            error: None,
            detached: false,
            rendezvous: None,
            internal: false,
            awaiting: None,
        }
    }
}

/// A message being assembled from its segments.
struct Assembly {
    data: Vec<u8>,
    arrived: Vec<bool>,
    missing: usize,
}

/// Counters of what the transfers did.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct TransferCounters {
    /// Messages delivered whole.
    pub(crate) messages_sent: u64,
    /// Messages received whole.
    pub(crate) messages_received: u64,
    /// Segments sent again after the NIC gave up on them.
    pub(crate) resent: u64,
    /// Messages that failed after their sender had stopped asking (the peer died after the
    /// operation ended here; its next operation with that peer fails on its own).
    pub(crate) late_failures: u64,
    /// Arrivals dropped: malformed, inconsistent or duplicated.
    pub(crate) dropped: u64,
    /// Messages sent by rendezvous (their data put into the receiver's memory).
    pub(crate) rendezvous_sent: u64,
    /// Messages received by rendezvous.
    pub(crate) rendezvous_received: u64,
    /// Ready-to-sends this endpoint refused (it could not register a landing region): those
    /// messages came eagerly.
    pub(crate) rendezvous_refused: u64,
    /// Puts sent again after the NIC gave up on them.
    pub(crate) puts_resent: u64,
    /// Regions registered for rendezvous transfers.
    pub(crate) regions_registered: u64,
    /// Segments passed on as they arrived (forwarding), one per segment and rank.
    pub(crate) forwarded: u64,
    /// Messages not asked for yet that were refused for the limit of unexpected data (eager
    /// ones dropped, ready-to-sends kept waiting).
    pub(crate) over_limit: u64,
}

/// The transfers of one port.
pub(crate) struct Transfers {
    spare: Vec<DmaBuffer>,
    outgoing: VecDeque<Outgoing>,
    resend: VecDeque<(DmaBuffer, u64)>,
    in_flight: HashMap<u64, InFlight>,
    sends: HashMap<SendId, SendRecord>,
    assembling: HashMap<(Member, Key), Assembly>,
    arrived: HashMap<(Member, Key), Vec<u8>>,
    provided: usize,
    next_id: u64,
    next_context: u64,
    /// How long a segment whose receiver takes nothing is sent again before the send fails.
    retry_window: Duration,
    /// When each message's first give-up happened, for the retry window.
    first_give_up: HashMap<SendId, Instant>,
    counters: TransferCounters,
    /// Messages this long or longer go by rendezvous.
    threshold: usize,
    /// Registered regions for rendezvous.
    pool: RegionPool,
    /// Puts in the NIC, by context.
    puts: HashMap<u64, PutFlight>,
    /// Source regions of sends forgotten while puts from them were in the NIC: given back to the
    /// pool when the last of those puts ends.
    draining: HashMap<SendId, (MemoryRegion, usize)>,
    /// Rendezvous this endpoint answered, by sender and key.
    landing: HashMap<(Member, Key), Landing>,
    /// Messages forwarded as they arrive, by sender and key: where each goes on to, a send (its
    /// record) per rank.
    forwards: HashMap<(Member, Key), Vec<(Member, SendId)>>,
    /// Segments to forward that found no spare send buffer: (send, rank, the packet's bytes).
    forward_backlog: VecDeque<(SendId, Member, Box<[u8]>)>,
    /// Receive buffers sent on by forwarding whose place among the provided ones no spare send
    /// buffer has taken yet.
    lent: usize,
    /// The most bytes of messages not asked for yet that are held.
    unexpected_limit: usize,
    /// Bytes held of messages not asked for yet (the sum of `charged`).
    unexpected: usize,
    /// What each message held that was not asked for when it came counts against the limit.
    charged: HashMap<(Member, Key), usize>,
    /// The message the caller waits for now.
    wanted: Option<(Member, Key)>,
    /// Eager messages dropped for the limit, with their lengths.
    over_limit: HashMap<(Member, Key), usize>,
    /// Ready-to-sends waiting for room under the limit, in arrival order.
    deferred: VecDeque<(Member, Control)>,
}

impl Transfers {
    /// The transfers of `port`: its send buffers allocated and its receive buffers provided.
    ///
    /// # Errors
    /// What the port says when the arena has no room or a provide is refused.
    pub(crate) fn new(port: &mut Port, retry_window: Duration) -> Result<Self, Error> {
        let mut transfers = Self::empty(retry_window);
        // Peers put into this port's landing regions. (Without it their puts are refused and the
        // sends fail; a port that cannot register memory refuses rendezvous instead.)
        port.allow_remote_memory_access()?;
        for _ in 0..SEND_BUFFERS {
            transfers.spare.push(port.dma_alloc(BUFFER_LEN)?);
        }
        for _ in 0..RECEIVE_BUFFERS {
            let buffer = port.dma_alloc(BUFFER_LEN)?;
            transfers.provide(port, buffer)?;
        }
        Ok(transfers)
    }

    /// Transfers with no buffers yet.
    fn empty(retry_window: Duration) -> Self {
        Self {
            spare: Vec::with_capacity(SEND_BUFFERS),
            outgoing: VecDeque::new(),
            resend: VecDeque::new(),
            in_flight: HashMap::new(),
            sends: HashMap::new(),
            assembling: HashMap::new(),
            arrived: HashMap::new(),
            provided: 0,
            next_id: 1,
            next_context: 1,
            retry_window,
            first_give_up: HashMap::new(),
            counters: TransferCounters::default(),
            threshold: RENDEZVOUS_THRESHOLD,
            pool: RegionPool::default(),
            puts: HashMap::new(),
            draining: HashMap::new(),
            landing: HashMap::new(),
            forwards: HashMap::new(),
            forward_backlog: VecDeque::new(),
            lent: 0,
            unexpected_limit: UNEXPECTED_LIMIT,
            unexpected: 0,
            charged: HashMap::new(),
            wanted: None,
            over_limit: HashMap::new(),
            deferred: VecDeque::new(),
        }
    }

    /// Holds at most `limit` bytes of messages not asked for yet from now on.
    pub(crate) fn set_unexpected_limit(&mut self, limit: usize) {
        self.unexpected_limit = limit;
    }

    /// Whether a message of `total` bytes from `at` may be held: always if it is the one asked
    /// for; else if it fits under the limit, and it is then counted against it.
    fn admit(&mut self, at: (Member, Key), total: usize) -> bool {
        if self.wanted == Some(at) {
            return true;
        }
        let cost = total.max(SEGMENT_PAYLOAD);
        if self.unexpected.saturating_add(cost) > self.unexpected_limit {
            self.counters.over_limit += 1;
            return false;
        }
        self.unexpected += cost;
        self.charged.insert(at, cost);
        true
    }

    /// What `at`'s message counted against the limit is free again.
    fn uncharge(&mut self, at: (Member, Key)) {
        if let Some(cost) = self.charged.remove(&at) {
            self.unexpected = self.unexpected.saturating_sub(cost);
        }
    }

    /// The caller waits for the message `key` from `from` now: a ready-to-send of it kept
    /// waiting for room is answered at once.
    ///
    /// # Errors
    /// [`TransferError::OverLimit`] if it came before and was dropped for the limit.
    pub(crate) fn want(
        &mut self,
        port: &mut Port,
        from: Member,
        key: Key,
    ) -> Result<(), TransferError> {
        let at = (from, key);
        self.wanted = Some(at);
        if let Some(bytes) = self.over_limit.remove(&at) {
            return Err(TransferError::OverLimit {
                peer: from,
                bytes,
                limit: self.unexpected_limit,
            });
        }
        if let Some(index) = self
            .deferred
            .iter()
            .position(|(member, control)| *member == from && control.key == key)
            && let Some((member, control)) = self.deferred.remove(index)
        {
            self.ready(port, member, control);
        }
        Ok(())
    }

    /// Answers the ready-to-sends kept waiting, in order, while they fit under the limit.
    fn answer_deferred(&mut self, port: &mut Port) {
        while let Some(&(member, control)) = self.deferred.front() {
            let total = usize::try_from(control.value).unwrap_or(usize::MAX);
            if self.unexpected.saturating_add(total.max(SEGMENT_PAYLOAD)) > self.unexpected_limit {
                return;
            }
            self.deferred.pop_front();
            self.ready(port, member, control);
        }
    }

    /// Messages of `threshold` bytes or more go by rendezvous from now on (`usize::MAX`: none).
    pub(crate) fn set_rendezvous_threshold(&mut self, threshold: usize) {
        self.threshold = threshold;
    }

    /// Whether a message of `length` bytes goes by rendezvous.
    pub(crate) fn by_rendezvous(&self, length: usize) -> bool {
        length >= self.threshold && length as u64 <= shared_abi::rdma::MAX_RDMA_LENGTH
    }

    /// What the transfers did so far.
    pub(crate) fn counters(&self) -> TransferCounters {
        TransferCounters {
            regions_registered: self.pool.registered,
            ..self.counters
        }
    }

    /// Provides spare send buffers in the place of receive buffers forwarding sent on.
    fn replenish(&mut self, port: &mut Port) {
        while self.lent > 0 {
            let Some(buffer) = self.spare.pop() else {
                return;
            };
            self.lent -= 1;
            let _ = self.provide(port, buffer);
        }
    }

    fn provide(&mut self, port: &mut Port, buffer: DmaBuffer) -> Result<(), Error> {
        port.provide_receive_buffer(buffer, SIZE_CLASS, Priority::LOW, RECEIVE_TAG)
            .map_err(|refused| refused.error)?;
        self.provided += 1;
        Ok(())
    }

    /// Queues `data` for `to` under `key`; it goes out as the NIC takes it, while the caller
    /// progresses ([`Transfers::progress`]). [`Transfers::send_done`] says when it is delivered.
    pub(crate) fn send(&mut self, to: Member, key: Key, data: Arc<[u8]>) -> SendId {
        let id = SendId(self.next_id);
        self.next_id += 1;
        self.send_as(id, to, key, data);
        id
    }

    /// [`Transfers::send`] under the id `id` (a new one, or one a forward reserved).
    fn send_as(&mut self, id: SendId, to: Member, key: Key, data: Arc<[u8]>) {
        let detached = self.sends.get(&id).is_some_and(|record| record.detached);
        if self.by_rendezvous(data.len()) {
            let ready = Control {
                kind: ControlKind::Ready,
                key,
                id: id.0,
                value: data.len() as u64,
            };
            self.sends.insert(
                id,
                SendRecord {
                    detached,
                    rendezvous: Some((to, key, Rendezvous::Asking { data })),
                    ..SendRecord::new(1)
                },
            );
            self.queue_control(id, to, ready);
            return;
        }
        self.sends.insert(
            id,
            SendRecord {
                detached,
                ..SendRecord::new(0)
            },
        );
        self.queue_eager(id, to, key, data);
    }

    /// Queues `data` for `to` under `key` as eager segments of the send `id`, which counts them.
    fn queue_eager(&mut self, id: SendId, to: Member, key: Key, data: Arc<[u8]>) {
        if let Some(record) = self.sends.get_mut(&id) {
            record.unposted += segment_count(data.len());
            record.undelivered += segment_count(data.len());
        }
        self.outgoing.push_back(Outgoing {
            id,
            to,
            key,
            data,
            next: 0,
            control: false,
        });
    }

    /// Forwards the message `key` from `from` to each of `to` as it arrives (see the module's
    /// documentation); returns the sends' ids, in `to`'s order, for [`Transfers::send_done`].
    /// `None` if any of it has arrived already (the caller then sends it on itself once it is
    /// whole) or `to` is empty.
    pub(crate) fn forward(&mut self, from: Member, key: Key, to: &[Member]) -> Option<Vec<SendId>> {
        let at = (from, key);
        if to.is_empty()
            || self.forwards.contains_key(&at)
            || self.assembling.contains_key(&at)
            || self.arrived.contains_key(&at)
            || self.landing.contains_key(&at)
        {
            return None;
        }
        let mut sends = Vec::with_capacity(to.len());
        for &member in to {
            let id = SendId(self.next_id);
            self.next_id += 1;
            // One packet until the first segment tells the message's length.
            self.sends.insert(
                id,
                SendRecord {
                    awaiting: Some(at),
                    ..SendRecord::new(1)
                },
            );
            sends.push((member, id));
        }
        let ids = sends.iter().map(|&(_, id)| id).collect();
        self.forwards.insert(at, sends);
        Some(ids)
    }

    /// The segment in `buffer` (`length` bytes, accepted as a new segment of `key` from `from`)
    /// goes on to the ranks its message is forwarded to: `buffer` itself to the first, copies
    /// to the others. Gives `buffer` back if the message is not forwarded.
    fn forward_segment(
        &mut self,
        from: Member,
        key: Key,
        buffer: DmaBuffer,
        length: usize,
    ) -> Option<DmaBuffer> {
        let at = (from, key);
        let Some(to) = self.forwards.get(&at).cloned() else {
            return Some(buffer);
        };
        // The first segment tells the message's length: the sends count its segments.
        let mut total = None;
        for &(_, id) in &to {
            if let Some(record) = self.sends.get_mut(&id)
                && record.awaiting.take().is_some()
            {
                let total = *total.get_or_insert_with(|| {
                    buffer
                        .get(..length)
                        .and_then(Header::parse)
                        .map_or(0, |header| header.total as usize)
                });
                record.unposted = segment_count(total);
                record.undelivered = segment_count(total);
            }
        }
        if !self.assembling.contains_key(&at) {
            // The last segment: the message is whole here.
            self.forwards.remove(&at);
        }
        for &(member, id) in to.iter().skip(1) {
            match self.spare.pop() {
                Some(mut copy) => {
                    copy[..length].copy_from_slice(&buffer[..length]);
                    self.queue_packet(copy, id, member, length);
                }
                None => {
                    self.forward_backlog
                        .push_back((id, member, Box::from(&buffer[..length])));
                }
            }
        }
        match to.first() {
            Some(&(member, id)) => {
                self.queue_packet(buffer, id, member, length);
                self.lent += 1;
                None
            }
            None => Some(buffer),
        }
    }

    /// Queues `buffer`, a packet of `length` bytes of the send `id` to `to`, ahead of the
    /// segments still to be copied. It counts as handed to the NIC once posted.
    fn queue_packet(&mut self, buffer: DmaBuffer, id: SendId, to: Member, length: usize) {
        self.counters.forwarded += 1;
        let context = self.new_context();
        self.in_flight.insert(
            context,
            InFlight {
                id,
                to,
                length,
                fresh: true,
            },
        );
        self.resend.push_back((buffer, context));
    }

    /// A message forwarded as it arrived came whole by rendezvous instead: it goes on to the
    /// forward's ranks as ordinary sends under the ids they were given.
    fn forward_whole(&mut self, at: (Member, Key), data: &[u8]) {
        let Some(to) = self.forwards.remove(&at) else {
            return;
        };
        let data: Arc<[u8]> = Arc::from(data);
        for (member, id) in to {
            if self.sends.contains_key(&id) {
                self.send_as(id, member, at.1, data.clone());
            }
        }
    }

    /// Queues the control message `control` for `to` as a packet of the send `id`.
    fn queue_control(&mut self, id: SendId, to: Member, control: Control) {
        self.outgoing.push_back(Outgoing {
            id,
            to,
            key: control.key,
            data: Arc::new(control.to_bytes()),
            next: 0,
            control: true,
        });
    }

    /// Sends `control` to `to` as a message of the transfers' own: nobody waits for it, and its
    /// failure is counted as a late one (the peer's own wait then fails).
    fn send_internal(&mut self, to: Member, control: Control) {
        let id = SendId(self.next_id);
        self.next_id += 1;
        self.sends.insert(
            id,
            SendRecord {
                detached: true,
                internal: true,
                ..SendRecord::new(1)
            },
        );
        self.queue_control(id, to, control);
    }

    /// Whether the message `id` is wholly in the NIC's hands (`Ok(true)`: the NIC delivers it
    /// reliably from there, as an eager send) or still waiting for send buffers or tokens
    /// (`Ok(false)`). An unknown id counts as in the NIC's hands.
    ///
    /// # Errors
    /// How the send failed (the message is then forgotten).
    pub(crate) fn send_done(&mut self, id: SendId) -> Result<bool, TransferError> {
        let Some(record) = self.sends.get(&id) else {
            return Ok(true);
        };
        if let Some(error) = record.error.clone() {
            self.forget_send(id);
            return Err(error);
        }
        Ok(record.unposted == 0 && record.rendezvous.is_none())
    }

    /// The sender asks no more about message `id`: it is forgotten once delivered, and a failure
    /// after this is counted ([`TransferCounters::late_failures`]) instead of reported.
    pub(crate) fn detach(&mut self, id: SendId) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        if record.detached {
            return;
        }
        record.detached = true;
        let (failed, rendezvous, undelivered) = (
            record.error.is_some(),
            record.rendezvous.is_some(),
            record.undelivered,
        );
        if self.forward_not_started(id) {
            // The operation ended (failed) before the message it was to forward came: nothing
            // goes on to this rank.
            self.forget_send(id);
        } else if failed {
            self.counters.late_failures += 1;
            self.forget_send(id);
        } else if rendezvous {
            // The operation ended (failed) mid-rendezvous: the message is abandoned, and the
            // receiver's wait for its "done" fails on its own.
            self.forget_send(id);
        } else if undelivered == 0 {
            self.counters.messages_sent += 1;
            self.forget_send(id);
        }
    }

    /// Whether `id` is a send of a forward whose message has not begun to arrive (it is then
    /// taken out of the forward).
    fn forward_not_started(&mut self, id: SendId) -> bool {
        let Some(at) = self.sends.get_mut(&id).and_then(|r| r.awaiting.take()) else {
            return false;
        };
        if let Some(to) = self.forwards.get_mut(&at) {
            to.retain(|&(_, i)| i != id);
            if to.is_empty() {
                self.forwards.remove(&at);
            }
        }
        true
    }

    /// Forgets `id`'s record and queued packets, and its rendezvous's source region (back to
    /// the pool, or, while puts from it are in the NIC, once they end).
    fn forget_send(&mut self, id: SendId) {
        if let Some(SendRecord {
            rendezvous:
                Some((
                    _,
                    _,
                    Rendezvous::Putting {
                        region, in_flight, ..
                    },
                )),
            ..
        }) = self.sends.remove(&id)
        {
            if in_flight == 0 {
                self.pool.give(region);
            } else {
                self.draining.insert(id, (region, in_flight));
            }
        }
        self.first_give_up.remove(&id);
        self.outgoing.retain(|message| message.id != id);
    }

    /// Whether any of the message `key` from `from` is here (a segment, or all of it).
    #[cfg(test)]
    pub(crate) fn holds(&self, from: Member, key: Key) -> bool {
        self.assembling.contains_key(&(from, key)) || self.arrived.contains_key(&(from, key))
    }

    /// Whether the message `key` from `from` is here whole (and not taken yet).
    #[cfg(test)]
    pub(crate) fn has_whole(&self, from: Member, key: Key) -> bool {
        self.arrived.contains_key(&(from, key))
    }

    /// The message from `from` under `key`, if it has arrived whole (it is then forgotten).
    pub(crate) fn take(&mut self, from: Member, key: Key) -> Option<Vec<u8>> {
        let message = self.arrived.remove(&(from, key))?;
        self.counters.messages_received += 1;
        self.uncharge((from, key));
        if self.wanted == Some((from, key)) {
            self.wanted = None;
        }
        Some(message)
    }

    /// Whether anything waits to go out (puts in the NIC included: their ends are awaited).
    pub(crate) fn has_outgoing(&self) -> bool {
        !self.outgoing.is_empty()
            || !self.resend.is_empty()
            || !self.puts.is_empty()
            || !self.forward_backlog.is_empty()
    }

    /// Takes `event` if it is the transfers' (a segment arrived, or a segment's send ended);
    /// returns it otherwise.
    pub(crate) fn handle(&mut self, port: &mut Port, event: Event) -> Option<Event> {
        match event {
            Event::Received {
                buffer,
                length,
                tag,
                sender_node,
                sender_port,
                status,
                ..
            } if tag == RECEIVE_TAG => {
                self.provided = self.provided.saturating_sub(1);
                let mut buffer = Some(buffer);
                if status == Status::SUCCESS {
                    let from = Member::new(sender_node, sender_port);
                    let accepted = match buffer.as_ref().and_then(|b| b.get(..length)) {
                        Some(bytes) => match Control::parse(bytes) {
                            Some(control) => {
                                self.control(port, from, control);
                                None
                            }
                            None => self.arrive(from, bytes),
                        },
                        None => {
                            self.counters.dropped += 1;
                            None
                        }
                    };
                    if let Some(key) = accepted
                        && let Some(arrived) = buffer.take()
                    {
                        buffer = self.forward_segment(from, key, arrived, length);
                    }
                }
                // Provided again at once: a receive token came back with the event. (A refused
                // buffer goes back to the arena; the others keep the port fed.) A buffer sent
                // on by forwarding is replaced by a spare send buffer.
                match buffer {
                    Some(buffer) => {
                        let _ = self.provide(port, buffer);
                    }
                    None => self.replenish(port),
                }
                None
            }
            Event::Sent {
                buffer,
                context,
                status,
                ..
            } if self.in_flight.contains_key(&context) => {
                self.sent(buffer, context, status);
                None
            }
            Event::OperationDone {
                context, status, ..
            } if self.puts.contains_key(&context) => {
                self.put_done(context, status);
                None
            }
            Event::SendRejected {
                buffer: Some(buffer),
                context,
                status,
                ..
            } if self.in_flight.contains_key(&context) => {
                // A refused token is not retried: what the NIC refuses, it refuses again.
                if let Some(flight) = self.in_flight.remove(&context) {
                    self.fail(flight, status);
                }
                self.spare.push(buffer);
                None
            }
            Event::ReceiveRejected {
                buffer: Some(_),
                tag,
                ..
            } if tag == RECEIVE_TAG => {
                self.provided = self.provided.saturating_sub(1);
                None
            }
            other => Some(other),
        }
    }

    /// A segment's send ended with `status`.
    fn sent(&mut self, buffer: DmaBuffer, context: u64, status: Status) {
        let Some(flight) = self.in_flight.remove(&context) else {
            self.spare.push(buffer);
            return;
        };
        if status == Status::SUCCESS {
            self.spare.push(buffer);
            if let Some(record) = self.sends.get_mut(&flight.id) {
                record.undelivered = record.undelivered.saturating_sub(1);
                if record.detached && record.undelivered == 0 && record.rendezvous.is_none() {
                    if !record.internal {
                        self.counters.messages_sent += 1;
                    }
                    self.forget_send(flight.id);
                }
            }
            return;
        }
        let now = Instant::now();
        let alive = self.sends.contains_key(&flight.id);
        let first = if alive {
            *self.first_give_up.entry(flight.id).or_insert(now)
        } else {
            now
        };
        let given_up =
            status == Status::SEND_TIMED_OUT || status == Status::TARGET_NODE_UNREACHABLE;
        if given_up && alive && now < first + self.retry_window {
            // The receiver had no buffer for the NIC's whole receiver-not-ready time (it is
            // outside the library: computing, or not scheduled), or its NIC answered nothing
            // for the NIC's give-up time (a busy host looks the same as a dead one for a while).
            // Send the same bytes again until the retry window closes; a closed port is final.
            self.counters.resent += 1;
            let context = self.new_context();
            self.in_flight.insert(context, flight);
            self.resend.push_back((buffer, context));
            return;
        }
        self.spare.push(buffer);
        self.fail(flight, status);
    }

    /// A segment of `flight`'s message failed for good with `status`: the message fails (or,
    /// if its sender stopped asking, is counted as a late failure).
    fn fail(&mut self, flight: InFlight, status: Status) {
        match self.sends.get_mut(&flight.id) {
            Some(record) if record.detached => {
                self.counters.late_failures += 1;
                self.forget_send(flight.id);
            }
            Some(record) => {
                record.error.get_or_insert(TransferError::Peer {
                    peer: flight.to,
                    status,
                });
            }
            None => {}
        }
        self.outgoing.retain(|message| message.id != flight.id);
    }

    fn new_context(&mut self) -> u64 {
        let context = self.next_context;
        self.next_context += 1;
        context
    }

    /// A segment arrived from `from`: checked, stored, and its message completed when whole.
    /// Returns the message's key if the segment was taken (not malformed, not a duplicate).
    fn arrive(&mut self, from: Member, bytes: &[u8]) -> Option<Key> {
        let Some(header) = Header::parse(bytes) else {
            self.counters.dropped += 1;
            return None;
        };
        let payload = &bytes[HEADER_LEN..];
        let (Ok(offset), Ok(total)) = (
            usize::try_from(header.offset),
            usize::try_from(header.total),
        ) else {
            self.counters.dropped += 1;
            return None;
        };
        let index = offset / SEGMENT_PAYLOAD;
        let fits = offset % SEGMENT_PAYLOAD == 0
            && total <= isize::MAX as usize
            && offset <= total
            && payload.len() == (total - offset).min(SEGMENT_PAYLOAD)
            && index < segment_count(total);
        let key = (from, header.key);
        if !fits || self.arrived.contains_key(&key) {
            self.counters.dropped += 1;
            return None;
        }
        if !self.assembling.contains_key(&key) {
            // A new message: the rest of one dropped for the limit stays dropped, and one that
            // does not fit under the limit is dropped (and remembered).
            if self.over_limit.contains_key(&key) {
                self.counters.dropped += 1;
                return None;
            }
            if !self.admit(key, total) {
                self.counters.dropped += 1;
                if self.over_limit.len() < REFUSED_KEEP {
                    self.over_limit.insert(key, total);
                }
                return None;
            }
        }
        let assembly = match self.assembling.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut data = Vec::new();
                if data.try_reserve_exact(total).is_err() {
                    self.uncharge(key);
                    self.counters.dropped += 1;
                    return None;
                }
                data.resize(total, 0);
                let count = segment_count(total);
                entry.insert(Assembly {
                    data,
                    arrived: vec![false; count],
                    missing: count,
                })
            }
        };
        if assembly.data.len() != total || assembly.arrived[index] {
            self.counters.dropped += 1;
            return None;
        }
        assembly.data[offset..offset + payload.len()].copy_from_slice(payload);
        assembly.arrived[index] = true;
        assembly.missing -= 1;
        if assembly.missing == 0
            && let Some(done) = self.assembling.remove(&key)
        {
            self.arrived.insert(key, done.data);
        }
        Some(header.key)
    }

    /// A rendezvous control message `control` arrived from `from`.
    fn control(&mut self, port: &mut Port, from: Member, control: Control) {
        match control.kind {
            ControlKind::Ready => self.ready(port, from, control),
            ControlKind::Clear | ControlKind::Refuse => self.answered(port, from, control),
            ControlKind::Done => {
                let key = (from, control.key);
                match self.landing.remove(&key) {
                    Some(landing) if landing.id == control.id => {
                        let data = landing.region.bytes().to_vec(0, landing.total);
                        self.pool.give(landing.region);
                        self.counters.rendezvous_received += 1;
                        self.forward_whole(key, &data);
                        self.arrived.insert(key, data);
                    }
                    Some(other) => {
                        self.landing.insert(key, other);
                        self.counters.dropped += 1;
                    }
                    None => self.counters.dropped += 1,
                }
            }
        }
    }

    /// `from` is ready to send a message by rendezvous: a landing region goes back to it at
    /// once (or a refusal, if none can be registered: the message then comes eagerly).
    fn ready(&mut self, port: &mut Port, from: Member, control: Control) {
        let key = (from, control.key);
        let Ok(total) = usize::try_from(control.value) else {
            self.counters.dropped += 1;
            return;
        };
        if control.value > shared_abi::rdma::MAX_RDMA_LENGTH
            || self.landing.contains_key(&key)
            || self.arrived.contains_key(&key)
            || self.assembling.contains_key(&key)
        {
            self.counters.dropped += 1;
            return;
        }
        if !self.admit(key, total) {
            // No room under the limit of unexpected data: the answer waits for room, or for
            // the caller to ask for this message.
            if self.deferred.len() < REFUSED_KEEP
                && !self
                    .deferred
                    .iter()
                    .any(|(member, c)| *member == from && c.key == control.key)
            {
                self.deferred.push_back((from, control));
            } else {
                self.counters.dropped += 1;
            }
            return;
        }
        // As an eager message's assembly: a length this process cannot hold is refused, not
        // an abort.
        let room = Vec::<u8>::new().try_reserve_exact(total).is_ok();
        let region = if room {
            self.pool.take(port, total).ok()
        } else {
            None
        };
        let answer = match region {
            Some(region) => {
                let value = region.remote(0);
                self.landing.insert(
                    key,
                    Landing {
                        id: control.id,
                        total,
                        region,
                    },
                );
                Control {
                    kind: ControlKind::Clear,
                    value,
                    ..control
                }
            }
            None => {
                self.uncharge(key);
                self.counters.rendezvous_refused += 1;
                Control {
                    kind: ControlKind::Refuse,
                    value: 0,
                    ..control
                }
            }
        };
        self.send_internal(from, answer);
    }

    /// The receiver `from` answered the ready-to-send of a message of ours: the puts start, or
    /// the message goes eagerly.
    fn answered(&mut self, port: &mut Port, from: Member, control: Control) {
        let id = SendId(control.id);
        let asked = matches!(
            self.sends.get(&id),
            Some(SendRecord {
                error: None,
                rendezvous: Some((to, key, Rendezvous::Asking { .. })),
                ..
            }) if *to == from && *key == control.key
        );
        if !asked {
            self.counters.dropped += 1;
            return;
        }
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        let Some((to, key, Rendezvous::Asking { data })) = record.rendezvous.take() else {
            return;
        };
        let region = match control.kind {
            ControlKind::Clear => self.pool.take(port, data.len()).ok(),
            _ => None,
        };
        let Some(region) = region else {
            // Refused, or this side cannot register the source: eagerly, as a short message.
            self.queue_eager(id, to, key, data);
            return;
        };
        region.bytes().write(0, &data);
        record.rendezvous = Some((
            to,
            key,
            Rendezvous::Putting {
                region,
                remote: RemotePointer::from_u64(control.value),
                total: data.len(),
                next: 0,
                again: Vec::new(),
                in_flight: 0,
                landed: 0,
            },
        ));
        if data.is_empty() {
            self.landed(id);
        }
    }

    /// A put of a rendezvous ended with `status`.
    fn put_done(&mut self, context: u64, status: Status) {
        let Some(flight) = self.puts.remove(&context) else {
            return;
        };
        if let Some((_, left)) = self.draining.get_mut(&flight.id) {
            *left -= 1;
            if *left == 0
                && let Some((region, _)) = self.draining.remove(&flight.id)
            {
                self.pool.give(region);
            }
            return;
        }
        let now = Instant::now();
        let retry_until = match self.first_give_up.get(&flight.id) {
            Some(first) => *first + self.retry_window,
            None => now + self.retry_window,
        };
        let Some(SendRecord {
            rendezvous:
                Some((
                    _,
                    _,
                    Rendezvous::Putting {
                        total,
                        again,
                        in_flight,
                        landed,
                        ..
                    },
                )),
            ..
        }) = self.sends.get_mut(&flight.id)
        else {
            return;
        };
        *in_flight = in_flight.saturating_sub(1);
        if status == Status::SUCCESS {
            *landed += flight.length;
            if *landed >= *total && *in_flight == 0 {
                self.landed(flight.id);
            }
            return;
        }
        let given_up =
            status == Status::SEND_TIMED_OUT || status == Status::TARGET_NODE_UNREACHABLE;
        if given_up && now < retry_until {
            // As an eager segment's: the target's NIC answered nothing for a while; the same
            // bytes to the same place again (a put is idempotent).
            again.push((flight.offset, flight.length));
            self.first_give_up.entry(flight.id).or_insert(now);
            self.counters.puts_resent += 1;
            return;
        }
        self.fail(
            InFlight {
                id: flight.id,
                to: flight.to,
                length: flight.length,
                fresh: false,
            },
            status,
        );
    }

    /// Every byte of the rendezvous `id` is in the receiver's memory: the source region goes
    /// back to the pool and the "done" is queued (the send is in the NIC's hands once it is).
    fn landed(&mut self, id: SendId) {
        let Some(record) = self.sends.get_mut(&id) else {
            return;
        };
        let Some((to, key, Rendezvous::Putting { region, .. })) = record.rendezvous.take() else {
            return;
        };
        self.pool.give(region);
        record.unposted += 1;
        record.undelivered += 1;
        self.counters.rendezvous_sent += 1;
        self.queue_control(
            id,
            to,
            Control {
                kind: ControlKind::Done,
                key,
                id: id.0,
                value: 0,
            },
        );
    }

    /// Posts the puts of rendezvous whose landing region is known, up to [`PUTS_IN_FLIGHT`]
    /// each, while send tokens last. Returns whether it posted any.
    fn post_puts(&mut self, port: &mut Port) -> bool {
        let mut posted = false;
        for (&id, record) in &mut self.sends {
            if record.error.is_some() {
                continue;
            }
            let Some((
                to,
                _,
                Rendezvous::Putting {
                    region,
                    remote,
                    total,
                    next,
                    again,
                    in_flight,
                    ..
                },
            )) = &mut record.rendezvous
            else {
                continue;
            };
            while *in_flight < PUTS_IN_FLIGHT {
                let (offset, length) = match again.pop() {
                    Some(chunk) => chunk,
                    None if *next < *total => (*next, (*total - *next).min(PUT_CHUNK)),
                    None => break,
                };
                let Some(target) = remote.add(offset as u64) else {
                    record.error = Some(TransferError::Port(format!(
                        "the landing region's offset {offset} is past 4 GiB"
                    )));
                    break;
                };
                let context = self.next_context;
                match port.put(
                    region,
                    offset,
                    target.to_u64(),
                    length,
                    to.node,
                    to.port,
                    context,
                ) {
                    Ok(()) => {
                        self.next_context += 1;
                        posted = true;
                        *in_flight += 1;
                        if offset == *next {
                            *next += length;
                        }
                        self.puts.insert(
                            context,
                            PutFlight {
                                id,
                                to: *to,
                                offset,
                                length,
                            },
                        );
                    }
                    Err(Error::NoSendTokens) => {
                        if offset != *next {
                            again.push((offset, length));
                        }
                        return posted;
                    }
                    Err(error) => {
                        record.error = Some(TransferError::Port(error.to_string()));
                        break;
                    }
                }
            }
        }
        posted
    }

    /// Posts what waits to go out while send buffers and tokens last: packets first, then puts.
    /// Returns whether it posted anything.
    pub(crate) fn post(&mut self, port: &mut Port) -> bool {
        self.pool.trim(port);
        self.replenish(port);
        self.answer_deferred(port);
        while !self.forward_backlog.is_empty() {
            let Some(mut buffer) = self.spare.pop() else {
                break;
            };
            if let Some((id, to, bytes)) = self.forward_backlog.pop_front() {
                buffer[..bytes.len()].copy_from_slice(&bytes);
                self.queue_packet(buffer, id, to, bytes.len());
            }
        }
        let packets = self.post_packets(port);
        self.post_puts(port) || packets
    }

    /// Posts packets (segments and control messages) while send buffers and tokens last.
    fn post_packets(&mut self, port: &mut Port) -> bool {
        let mut posted = false;
        while let Some((buffer, context)) = self.resend.pop_front() {
            let Some(flight) = self.in_flight.get(&context) else {
                self.spare.push(buffer);
                continue;
            };
            let (id, to, length) = (flight.id, flight.to, flight.length);
            match port.send(
                buffer,
                length,
                SIZE_CLASS,
                Priority::LOW,
                to.node,
                to.port,
                context,
            ) {
                Ok(()) => {
                    posted = true;
                    if let Some(flight) = self.in_flight.get_mut(&context)
                        && flight.fresh
                    {
                        flight.fresh = false;
                        if let Some(record) = self.sends.get_mut(&id) {
                            record.unposted = record.unposted.saturating_sub(1);
                        }
                    }
                }
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    self.resend.push_front((refused.buffer, context));
                    return posted;
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    if let Some(flight) = self.in_flight.remove(&context) {
                        self.fail(flight, Status::INVALID_TOKEN);
                    }
                }
            }
        }
        while let Some(message) = self.outgoing.front_mut() {
            let Some(mut buffer) = self.spare.pop() else {
                return posted;
            };
            let bytes = if message.control {
                let length = message.data.len().min(BUFFER_LEN);
                buffer[..length].copy_from_slice(&message.data[..length]);
                length
            } else {
                let (offset, length) = segments(message.data.len())
                    .nth(message.next)
                    .unwrap_or((0, 0));
                Header {
                    key: message.key,
                    offset: offset as u64,
                    total: message.data.len() as u64,
                }
                .write(&mut buffer[..HEADER_LEN]);
                buffer[HEADER_LEN..HEADER_LEN + length]
                    .copy_from_slice(&message.data[offset..offset + length]);
                HEADER_LEN + length
            };
            let (id, to) = (message.id, message.to);
            let context = self.next_context;
            match port.send(
                buffer,
                bytes,
                SIZE_CLASS,
                Priority::LOW,
                to.node,
                to.port,
                context,
            ) {
                Ok(()) => {
                    self.next_context += 1;
                    posted = true;
                    self.in_flight.insert(
                        context,
                        InFlight {
                            id,
                            to,
                            length: bytes,
                            fresh: false,
                        },
                    );
                    message.next += 1;
                    if let Some(record) = self.sends.get_mut(&id) {
                        record.unposted = record.unposted.saturating_sub(1);
                    }
                    if message.next >= message.packets() {
                        self.outgoing.pop_front();
                    }
                }
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    self.spare.push(refused.buffer);
                    return posted;
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    if let Some(record) = self.sends.get_mut(&id) {
                        record.error = Some(TransferError::Port(refused.error.to_string()));
                    }
                    self.outgoing.pop_front();
                }
            }
        }
        posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_message_once() {
        for total in [
            0,
            1,
            SEGMENT_PAYLOAD - 1,
            SEGMENT_PAYLOAD,
            SEGMENT_PAYLOAD + 1,
            5 * SEGMENT_PAYLOAD + 7,
        ] {
            let parts: Vec<_> = segments(total).collect();
            assert_eq!(parts.len(), segment_count(total));
            let mut next = 0;
            for (offset, length) in parts {
                assert_eq!(offset, next, "total {total}");
                assert!(length <= SEGMENT_PAYLOAD);
                next += length;
            }
            assert_eq!(next, total);
        }
    }

    #[test]
    fn the_threshold_picks_the_protocol() {
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        assert!(!transfers.by_rendezvous(0));
        assert!(!transfers.by_rendezvous(RENDEZVOUS_THRESHOLD - 1));
        assert!(transfers.by_rendezvous(RENDEZVOUS_THRESHOLD));
        assert!(transfers.by_rendezvous(16 << 20));
        // Longer than one put can address: eagerly.
        assert!(!transfers.by_rendezvous(shared_abi::rdma::MAX_RDMA_LENGTH as usize + 1));
        transfers.set_rendezvous_threshold(usize::MAX);
        assert!(!transfers.by_rendezvous(16 << 20));
        transfers.set_rendezvous_threshold(100);
        assert!(!transfers.by_rendezvous(99));
        assert!(transfers.by_rendezvous(100));
    }

    #[test]
    fn a_control_message_round_trips_and_garbage_is_none() {
        let control = Control {
            kind: ControlKind::Clear,
            key: Key {
                context: 7,
                sequence: 9,
                part: 3,
            },
            id: 1 << 40,
            value: u64::MAX - 5,
        };
        let bytes = control.to_bytes();
        assert_eq!(Control::parse(&bytes), Some(control));
        // Nor is a control message a segment, or a segment a control message.
        assert_eq!(Header::parse(&bytes), None);
        let mut segment = [0u8; CONTROL_LEN];
        Header {
            key: control.key,
            offset: 0,
            total: 8,
        }
        .write(&mut segment);
        assert_eq!(Control::parse(&segment), None);
        // Short, long, an unknown kind, the reserved word set, another magic.
        assert_eq!(Control::parse(&bytes[..CONTROL_LEN - 1]), None);
        assert_eq!(Control::parse(&[&bytes[..], &[0]].concat()), None);
        for (at, value) in [(16, 9u8), (20, 1), (0, b'X')] {
            let mut bad = bytes;
            bad[at] = value;
            assert_eq!(Control::parse(&bad), None, "byte {at} = {value}");
        }
    }

    #[test]
    fn a_header_round_trips_and_garbage_is_no_header() {
        let header = Header {
            key: Key {
                context: 7,
                sequence: 9,
                part: 3,
            },
            offset: 4064,
            total: 1 << 33,
        };
        let mut bytes = [0u8; HEADER_LEN];
        header.write(&mut bytes);
        assert_eq!(Header::parse(&bytes), Some(header));
        assert_eq!(Header::parse(&bytes[..HEADER_LEN - 1]), None);
        bytes[0] ^= 1;
        assert_eq!(Header::parse(&bytes), None);
    }

    /// The segment of a message of `total` bytes (every byte its offset's low byte) at `index`.
    fn segment(key: Key, total: usize, index: usize) -> Vec<u8> {
        let (offset, length) = segments(total).nth(index).unwrap();
        let mut bytes = vec![0u8; HEADER_LEN];
        Header {
            key,
            offset: offset as u64,
            total: total as u64,
        }
        .write(&mut bytes);
        bytes.extend((offset..offset + length).map(|at| at as u8));
        bytes
    }

    #[test]
    fn segments_in_any_order_make_the_message_and_duplicates_are_dropped() {
        use nicbar_rs::{NodeId, PortId};
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        let from = Member::new(NodeId::new(3), PortId(2));
        let key = Key {
            context: 1,
            sequence: 2,
            part: 0,
        };
        let total = 3 * SEGMENT_PAYLOAD + 100;
        for index in [3, 1, 1, 0] {
            transfers.arrive(from, &segment(key, total, index));
        }
        assert_eq!(transfers.take(from, key), None, "a segment is missing");
        transfers.arrive(from, &segment(key, total, 2));
        let message = transfers.take(from, key).expect("whole");
        assert!(message.iter().enumerate().all(|(at, &b)| b == at as u8));
        assert_eq!(transfers.counters().dropped, 1);
        // Another sender's message under the same key is another message.
        let other = Member::new(NodeId::new(4), PortId(2));
        transfers.arrive(other, &segment(key, 0, 0));
        assert_eq!(transfers.take(other, key), Some(Vec::new()));
    }

    #[test]
    fn malformed_segments_are_dropped() {
        use nicbar_rs::{NodeId, PortId};
        let mut transfers = Transfers::empty(Duration::from_secs(1));
        let from = Member::new(NodeId::new(0), PortId(1));
        let key = Key {
            context: 0,
            sequence: 0,
            part: 0,
        };
        let good = segment(key, 10, 0);
        // Too short, a payload longer than the total says, an offset off the grid, a total
        // changed between segments.
        let mut long = good.clone();
        long.push(0);
        let mut shifted = segment(key, 2 * SEGMENT_PAYLOAD, 1);
        shifted[16] = 1;
        transfers.arrive(from, &good[..HEADER_LEN - 1]);
        transfers.arrive(from, &long);
        transfers.arrive(from, &shifted);
        transfers.arrive(from, &segment(key, 2 * SEGMENT_PAYLOAD, 0));
        transfers.arrive(from, &segment(key, 3 * SEGMENT_PAYLOAD, 2));
        assert_eq!(transfers.counters().dropped, 4);
        assert_eq!(transfers.take(from, key), None);
    }
}
