//! The NIC's state toward one remote node (paper §4.1): reliable in-order sequencing, as GM does
//! it — sequence numbers, cumulative acks, a NACK on a gap, go-back-N from a sent list of packet
//! descriptors, a retransmit timer and a give-up — and the unexpected-barrier record.
//!
//! The sent list holds descriptors, not tokens (the fix for paper §4.4): each descriptor is
//! enough to rebuild its packet, so every barrier packet resends on its own, and a data packet is
//! rebuilt from the host buffer its send token still owns.

use heapless::Deque;
use shared_abi::event::Status;
use shared_abi::ids::{BarrierId, Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::RejectReason;

use crate::record::UnexpectedBarrierRecord;
use crate::seq::Seq;
use crate::time::Instant;

/// Packets in flight (sent, unacknowledged) per connection.
pub const WINDOW: usize = 16;
/// Packets waiting for a sequence number per connection.
pub const QUEUE: usize = 32;
/// Rejections waiting to be sent per connection.
const REJECTS: usize = 8;
/// Port-closed notices waiting for room in the queue.
const CLOSED_NOTICES: usize = 16;
/// One-sided operations one node may have outstanding toward another (puts, gets and atomics);
/// a connection keeps room for that many replies and get streams of its peer.
pub const RDMA_OPS: usize = 8;

/// What a sequenced packet carries; enough to build it again at any retransmission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Body {
    /// A message from the held send token in `slot` of `port`.
    Data {
        port: u8,
        slot: u8,
        generation: Generation,
        dst_port: PortId,
        priority: u8,
        size: u8,
        length: u16,
    },
    /// One barrier step's packet.
    Barrier {
        port: u8,
        generation: Generation,
        dst_port: PortId,
        barrier: BarrierId,
        /// An abort: the failure it carries.
        failed: Option<crate::record::Failed>,
        round: u8,
        attempt: u8,
    },
    /// Segment `segment` of the message longer than a packet held in `slot` of `port` (its
    /// held send's `serial`): read from the arena when the packet is built.
    DataSegment {
        port: u8,
        slot: u8,
        generation: Generation,
        dst_port: PortId,
        /// The message's priority (its flow's, as in [`Body::Data`]).
        priority: u8,
        serial: u32,
        segment: u32,
    },
    /// Generation `generation` of `port` closed.
    PortClosed { port: u8, generation: Generation },
    /// A withdrawn message: holds the sequence slot so the stream stays gap-free.
    Cancelled,
    /// Segment `segment` of the put held in `slot` of `port` (operation `operation`).
    Put {
        port: u8,
        slot: u8,
        generation: Generation,
        dst_port: PortId,
        operation: u32,
        segment: u32,
    },
    /// The request of the get held in `slot` of `port`.
    Get {
        port: u8,
        slot: u8,
        generation: Generation,
        dst_port: PortId,
        operation: u32,
    },
    /// The request of the atomic held in `slot` of `port`.
    Atomic {
        port: u8,
        slot: u8,
        generation: Generation,
        dst_port: PortId,
        operation: u32,
    },
    /// Data of a get this NIC serves from its port `port`, read at `address` when the packet is
    /// built.
    ReadData(ReadSegment),
    /// The answer to a one-sided operation of the peer.
    Reply(Reply),
}

/// One data packet of a get this NIC serves (or, in a [`ReadStream`], the next one to queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadSegment {
    /// Our port the data comes from, and its generation when the get arrived.
    pub(crate) port: u8,
    pub(crate) generation: Generation,
    /// The initiator's port, slot and operation.
    pub(crate) dst_port: PortId,
    pub(crate) slot: u8,
    pub(crate) operation: u32,
    /// The region and where the get starts in it (checked again as each packet is built: a
    /// region deregistered meanwhile ends the get with `BAD_KEY`).
    pub(crate) key: u32,
    pub(crate) offset: u32,
    /// The whole get's length, and this packet's offset in it.
    pub(crate) length: u32,
    pub(crate) position: u32,
    /// Data bytes of each packet but the last: [`shared_abi::rdma::RDMA_SEGMENT`], or
    /// [`shared_abi::rdma::LOCAL_RDMA_SEGMENT`] toward a NIC the board gathers for
    /// ([`crate::Hal::gathers_toward`]).
    pub(crate) segment_len: u32,
}

impl ReadSegment {
    /// The bytes this packet carries.
    pub(crate) fn bytes(&self) -> usize {
        (self.length.saturating_sub(self.position) as usize).min(self.segment_len as usize)
    }

    /// Whether this is the get's last packet.
    pub(crate) fn is_last(&self) -> bool {
        self.position as usize + self.bytes() >= self.length as usize
    }
}

/// A get being served: its next segment to queue.
pub(crate) type ReadStream = ReadSegment;

/// An answer to the peer's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    /// Our port the operation targeted.
    pub(crate) port: u8,
    /// The initiator's port, slot and operation.
    pub(crate) dst_port: PortId,
    pub(crate) slot: u8,
    pub(crate) operation: u32,
    pub(crate) status: Status,
    /// An atomic's previous value.
    pub(crate) value: u64,
}

/// A message its receiver refused for want of a buffer, taken out of the stream (its sequence slot
/// cancelled) so that other traffic — barrier packets above all — flows past it; it is queued
/// again at `at`. Later messages of the same flow (source port, destination port, priority) wait
/// behind it, so the flow stays in order (InfiniBand's receiver-not-ready wait is per queue pair in
/// the same way).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Parked {
    pub(crate) body: Body,
    pub(crate) at: Instant,
}

/// A data message's flow: (source port, destination port, priority). A long message's segments
/// belong to its flow as a one-packet message does.
pub(crate) fn flow_of(body: &Body) -> Option<(u8, PortId, u8)> {
    match *body {
        Body::Data {
            port,
            dst_port,
            priority,
            ..
        }
        | Body::DataSegment {
            port,
            dst_port,
            priority,
            ..
        } => Some((port, dst_port, priority)),
        _ => None,
    }
}

/// A message longer than a packet that is arriving: the receive buffer its first segment took,
/// and how far it has come.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Assembly {
    /// Our port it goes to, and that port's generation when it began.
    pub(crate) port: u8,
    pub(crate) generation: Generation,
    /// The buffer (taken from the port's receive buffers).
    pub(crate) buffer: shared_abi::token::ReceiveToken,
    /// The message's length, and the bytes that arrived so far (the next segment's offset).
    pub(crate) total: u32,
    pub(crate) received: u32,
    /// The first failure to write a segment into the buffer, if any.
    pub(crate) status: shared_abi::event::Status,
}

/// What decides whether one data packet waits behind another parked one: its flow, and whether it
/// is a segment of a long message.
type WaitKey = (u8, PortId, u8, bool);

fn wait_key(body: &Body) -> Option<WaitKey> {
    let (port, dst_port, priority) = flow_of(body)?;
    Some((
        port,
        dst_port,
        priority,
        matches!(body, Body::DataSegment { .. }),
    ))
}

/// Whether a packet of `later` waits behind a parked one of `earlier`: the same flow (a flow stays
/// in order), or long messages of one source port (the receiver assembles one long message per
/// source port at a time, so a port's long messages go one after another).
fn waits_behind(earlier: WaitKey, later: WaitKey) -> bool {
    (earlier.0, earlier.1, earlier.2) == (later.0, later.1, later.2)
        || (earlier.0 == later.0 && earlier.3 && later.3)
}

/// The data that waits: every packet that waits behind one of these does too.
struct Waiting(heapless::Vec<WaitKey, { QUEUE + WINDOW + QUEUE + 1 }>);

impl Waiting {
    fn new() -> Self {
        Self(heapless::Vec::new())
    }

    fn holds(&self, body: &Body) -> bool {
        wait_key(body).is_some_and(|key| self.0.iter().any(|&earlier| waits_behind(earlier, key)))
    }

    fn add(&mut self, body: &Body) {
        if let Some(key) = wait_key(body)
            && !self.0.contains(&key)
        {
            // Room for every body a connection holds: never full.
            let _ = self.0.push(key);
        }
    }
}

/// A sequenced packet in the sent list.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Descriptor {
    pub(crate) seq: Seq,
    pub(crate) body: Body,
    /// When the packet first got its sequence number (for the receiver-not-ready give-up).
    pub(crate) first_sent: Instant,
    /// Must be (re)transmitted at the next chance.
    pub(crate) needs_transmit: bool,
    /// Held back until then (the receiver asked us to wait: no buffer, busy).
    pub(crate) not_before: Option<Instant>,
    /// How many times it went on the wire.
    pub(crate) transmissions: u16,
}

/// Per-connection counters, as `nicctl status` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionCounters {
    /// Sequenced packets sent the first time.
    pub sent: u64,
    /// Sequenced packets sent again.
    pub resent: u64,
    /// Sequenced packets accepted in order.
    pub received: u64,
    /// Acknowledgements sent (standalone).
    pub acks_sent: u64,
    /// Acknowledgements (standalone or piggybacked) that freed descriptors.
    pub acks_received: u64,
    /// NACKs sent.
    pub nacks_sent: u64,
    /// NACKs received.
    pub nacks_received: u64,
    /// REJECTs sent.
    pub rejects_sent: u64,
    /// REJECTs received.
    pub rejects_received: u64,
    /// Packets dropped: duplicates, out of order, stale epoch.
    pub drops: u64,
    /// Times the connection gave up on the peer.
    pub give_ups: u64,
    /// Sessions established with the peer ([`crate::session`]).
    pub sessions: u64,
}

/// The state toward one node.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) peer: NodeId,
    // Transmit side.
    pub(crate) tx_epoch: u32,
    pub(crate) next_seq: Seq,
    pub(crate) sent: Deque<Descriptor, WINDOW>,
    pub(crate) queue: Deque<Body, QUEUE>,
    /// Messages waiting for their receiver to provide a buffer ([`Parked`]).
    pub(crate) parked: Deque<Parked, QUEUE>,
    pub(crate) closed_notices: Deque<(u8, Generation), CLOSED_NOTICES>,
    /// Answers owed to the peer's one-sided operations, sent before the queue. Room for every
    /// operation the peer may have outstanding toward us ([`RDMA_OPS`]), so taking
    /// a request never waits for our own stream.
    pub(crate) replies: Deque<Body, { RDMA_OPS }>,
    /// Gets of the peer this NIC is serving: their data is queued as room appears.
    pub(crate) reads: Deque<ReadStream, { RDMA_OPS }>,
    /// Messages longer than a packet being received from the peer, by its source port: each
    /// segment is written into the receive buffer the first one took, in order.
    pub(crate) assemblies: [Option<Assembly>; PORTS_PER_NIC],
    /// The peer's put (source port, operation) a segment of which we refused, with the status of
    /// that first refusal: its last segment's reply reports it.
    pub(crate) failed_put: Option<((u8, u32), shared_abi::event::Status)>,
    /// Whether the peer acknowledged anything of the current transmit epoch. Until it has, every
    /// packet carries SYN, so a receiver without state can start the epoch from whichever packet
    /// of it arrives first.
    pub(crate) tx_acked_in_epoch: bool,
    /// When the sent list last made progress (an ack freed something, or the peer spoke).
    pub(crate) last_progress: Instant,
    /// When to retransmit the sent list if nothing is acknowledged.
    pub(crate) retransmit_at: Option<Instant>,
    /// Consecutive retransmission timeouts (doubles the interval, capped).
    pub(crate) backoff: u32,
    /// Last go-back-N we did on a NACK, to ignore the burst of NACKs one gap causes.
    pub(crate) last_go_back: Option<(Seq, Instant)>,
    // Receive side.
    pub(crate) rx_epoch: Option<u32>,
    pub(crate) expected: Seq,
    /// When the acknowledgement we owe the peer must go on its own at the latest, if we owe one.
    /// Until then it rides on the next packet we send the peer anyway (delayed acks: a barrier's
    /// packets are acknowledged by the next barrier's, not each by a packet of its own).
    pub(crate) ack_due: Option<Instant>,
    /// A NACK to send, for the given epoch of the peer.
    pub(crate) nack_pending: Option<u32>,
    pub(crate) last_nack: Option<Instant>,
    pub(crate) rejects: Deque<(Seq, RejectReason, u32, u8), REJECTS>,
    /// The sequence number of a data message we refused because its port was closed. The sender
    /// fails such a message (`TARGET_PORT_CLOSED`) and fills its slot with a cancelled packet, so
    /// until that arrives we keep refusing the number — even once the port opens — or a delayed
    /// duplicate of the refused message would be delivered after its sender was told it failed.
    pub(crate) refused_closed: Option<Seq>,
    /// Sender side: the current attempt of each data flow, per `[source port][destination
    /// port][priority]`, carried in its packets' `attempt`. It moves on each time the receiver
    /// refuses one of the flow's messages for want of a buffer.
    pub(crate) data_attempts: [[[u8; 2]; PORTS_PER_NIC]; PORTS_PER_NIC],
    /// Receiver side: per `[source port][destination port][priority]`, the attempt at which we
    /// refused a data message for want of a buffer. Its sender takes the flow's messages out of
    /// the stream (it parks them) and sends them again under a newer attempt, filling their old
    /// sequence slots with cancelled packets; a copy of the old attempt that still arrives (a
    /// duplicate, a late packet) is refused, even once a buffer is there, or a message would be
    /// delivered twice or out of order.
    pub(crate) data_refused: [[[Option<u8>; 2]; PORTS_PER_NIC]; PORTS_PER_NIC],
    /// Sender side: the current attempt number of barrier packets per `[source port][destination
    /// port]` (see [`shared_abi::packet::PacketHeader::attempt`]).
    pub(crate) barrier_attempts: [[u8; PORTS_PER_NIC]; PORTS_PER_NIC],
    /// Receiver side: per `[source port][destination port]`, the attempt at which we refused a
    /// barrier packet because the port was closed; packets of that attempt or older are refused.
    pub(crate) barrier_refused: [[Option<u8>; PORTS_PER_NIC]; PORTS_PER_NIC],
    /// Last time anything arrived from the peer (an idle connection may be recycled).
    pub(crate) last_heard: Instant,
    /// Barrier packets that arrived before their barrier wanted them (paper §3.1).
    pub(crate) record: UnexpectedBarrierRecord,
    pub(crate) counters: ConnectionCounters,
    /// The session this connection's packets are authenticated under ([`crate::session`]).
    pub(crate) session: crate::session::Session,
}

impl Connection {
    pub(crate) fn new(peer: NodeId, tx_epoch: u32, now: Instant) -> Self {
        Self {
            peer,
            tx_epoch,
            next_seq: Seq(0),
            tx_acked_in_epoch: false,
            sent: Deque::new(),
            queue: Deque::new(),
            parked: Deque::new(),
            closed_notices: Deque::new(),
            replies: Deque::new(),
            reads: Deque::new(),
            assemblies: [None; PORTS_PER_NIC],
            failed_put: None,
            last_progress: now,
            retransmit_at: None,
            backoff: 0,
            last_go_back: None,
            rx_epoch: None,
            expected: Seq(0),
            ack_due: None,
            nack_pending: None,
            last_nack: None,
            rejects: Deque::new(),
            refused_closed: None,
            data_attempts: [[[0; 2]; PORTS_PER_NIC]; PORTS_PER_NIC],
            data_refused: [[[None; 2]; PORTS_PER_NIC]; PORTS_PER_NIC],
            barrier_attempts: [[0; PORTS_PER_NIC]; PORTS_PER_NIC],
            barrier_refused: [[None; PORTS_PER_NIC]; PORTS_PER_NIC],
            last_heard: now,
            record: UnexpectedBarrierRecord::default(),
            counters: ConnectionCounters::default(),
            session: crate::session::Session::default(),
        }
    }

    /// The peer starts over with nothing of its earlier incarnation (a new session with a peer
    /// that holds none of our reliability state): its stream, what we refused of it, the barrier
    /// packets it sent before they were wanted, and the answers we owed its operations are gone.
    pub(crate) fn forget_peer_stream(&mut self) {
        self.rx_epoch = None;
        self.expected = Seq(0);
        self.ack_due = None;
        self.nack_pending = None;
        self.last_nack = None;
        self.rejects.clear();
        self.refused_closed = None;
        self.data_refused = [[[None; 2]; PORTS_PER_NIC]; PORTS_PER_NIC];
        self.barrier_refused = [[None; PORTS_PER_NIC]; PORTS_PER_NIC];
        self.record = UnexpectedBarrierRecord::default();
        self.failed_put = None;
    }

    /// Whether nothing is in flight, queued or recorded, and nothing is owed to the peer.
    pub(crate) fn is_idle(&self) -> bool {
        self.sent.is_empty()
            && self.queue.is_empty()
            && self.parked.is_empty()
            && self.closed_notices.is_empty()
            && self.replies.is_empty()
            && self.reads.is_empty()
            && self.ack_due.is_none()
            && self.nack_pending.is_none()
            && self.rejects.is_empty()
            && self.record.is_empty()
            && self.assemblies.iter().all(Option::is_none)
    }

    /// When the parked messages `body` waits behind are due (those of its flow; for a long
    /// message's segment, also its port's parked long messages), if there are any: a new message
    /// parks behind them.
    pub(crate) fn parked_until(&self, body: &Body) -> Option<Instant> {
        let key = wait_key(body)?;
        self.parked
            .iter()
            .filter(|parked| {
                wait_key(&parked.body).is_some_and(|earlier| waits_behind(earlier, key))
            })
            .map(|parked| parked.at)
            .max()
    }

    /// The receiver refused the message in sequence slot `seq` for want of a buffer: parks it
    /// until `at`, with every later message of its flow, sent or queued, in order (and, if it is
    /// a long message, its port's later long messages, with theirs); their slots become cancelled
    /// packets and the stream goes back to `seq`, so the rest flows on. Returns `false` (and
    /// changes nothing) if there is no room to park them all.
    ///
    /// `feeding` names the refused message's port's long message still being fed, if any (its
    /// slot and serial; the port's last data, since its later tokens wait for it): it parks as
    /// its first segment taken back alone, and the caller rewinds its feeder to the segment after
    /// that one (see [`Connection::parked_segment`]), so a message of any length takes one parked
    /// entry. A long message wholly queued parks segment by segment.
    pub(crate) fn park_flow(&mut self, seq: Seq, at: Instant, feeding: Option<(u8, u32)>) -> bool {
        let Some(refused) = self.sent.iter().find(|d| d.seq == seq).map(|d| d.body) else {
            return false;
        };
        let Some((port, _, _)) = flow_of(&refused) else {
            return false;
        };
        let of_feeding = |body: &Body| match (*body, feeding) {
            (
                Body::DataSegment {
                    port: p,
                    slot,
                    serial,
                    segment,
                    ..
                },
                Some((s, n)),
            ) if p == port && slot == s && serial == n => Some(segment),
            _ => None,
        };
        let first = self
            .sent
            .iter()
            .filter(|d| !d.seq.precedes(seq))
            .map(|d| &d.body)
            .chain(self.queue.iter())
            .filter_map(of_feeding)
            .min();
        let kept = |body: &Body| of_feeding(body).is_none_or(|segment| Some(segment) == first);
        // What goes, in stream order: what waits behind the refused message or behind anything
        // that goes before it. (Nothing in the stream waits behind a message parked before: a
        // flow's parked messages always come after its messages in the stream.)
        let mut goes = Waiting::new();
        goes.add(&refused);
        let mut count = 0;
        for body in self
            .sent
            .iter()
            .filter(|d| !d.seq.precedes(seq))
            .map(|d| &d.body)
            .chain(self.queue.iter())
        {
            if goes.holds(body) {
                goes.add(body);
                count += usize::from(kept(body));
            }
        }
        if self.parked.len() + count > QUEUE {
            return false;
        }
        let mut goes = Waiting::new();
        goes.add(&refused);
        let mut taken: heapless::Vec<Body, QUEUE> = heapless::Vec::new();
        for descriptor in self.sent.iter_mut() {
            if !descriptor.seq.precedes(seq) && goes.holds(&descriptor.body) {
                goes.add(&descriptor.body);
                if kept(&descriptor.body) {
                    let _ = taken.push(descriptor.body);
                }
                descriptor.body = Body::Cancelled;
                descriptor.not_before = None;
            }
        }
        for _ in 0..self.queue.len() {
            if let Some(body) = self.queue.pop_front() {
                if !goes.holds(&body) {
                    let _ = self.queue.push_back(body);
                    continue;
                }
                goes.add(&body);
                if kept(&body) {
                    let _ = taken.push(body);
                }
            }
        }
        // Ahead of what was parked before: those of the same flows (some of their messages
        // may have gone back into the queue when the queue filled) come after these.
        while let Some(body) = taken.pop() {
            let _ = self.parked.push_front(Parked { body, at });
        }
        self.go_back_to(seq);
        true
    }

    /// The parked segment of the long message in `slot` of `port` numbered `serial`, if any.
    pub(crate) fn parked_segment(&self, port: u8, slot: u8, serial: u32) -> Option<u32> {
        self.parked.iter().find_map(|parked| match parked.body {
            Body::DataSegment {
                port: p,
                slot: s,
                serial: n,
                segment,
                ..
            } if p == port && s == slot && n == serial => Some(segment),
            _ => None,
        })
    }

    /// Queues again the parked messages that are due, in order, as the queue has room; a flow's
    /// messages go together (a later one never overtakes an earlier one still parked), and so do
    /// a port's long messages.
    pub(crate) fn unpark_due(&mut self, now: Instant) {
        let mut waiting = Waiting::new();
        for _ in 0..self.parked.len() {
            let Some(parked) = self.parked.pop_front() else {
                return;
            };
            let free = flow_of(&parked.body).is_some() && !waiting.holds(&parked.body);
            if free && parked.at <= now && self.queue.push_back(parked.body).is_ok() {
                continue;
            }
            waiting.add(&parked.body);
            let _ = self.parked.push_back(parked);
        }
    }

    /// When the next parked message may go back into the queue, if one waits for a time at all:
    /// the first one of each flow, as [`Connection::unpark_due`] takes them (a later one of its
    /// flow goes only after it, whatever its own time says). `None` while the queue is full: it
    /// drains as the window opens, which acks and the retransmit timer bring.
    pub(crate) fn next_unpark_at(&self) -> Option<Instant> {
        if self.queue.is_full() {
            return None;
        }
        let mut waiting = Waiting::new();
        let mut at = None;
        for parked in self.parked.iter() {
            if flow_of(&parked.body).is_some() && !waiting.holds(&parked.body) {
                at = crate::time::earliest(at, Some(parked.at));
            }
            waiting.add(&parked.body);
        }
        at
    }

    /// When the sent list may transmit next, if it holds a packet back: the first packet due for
    /// (re)transmission waits for its `not_before`, and go-back-N sends nothing after it before
    /// it, so only its time counts (a later packet's own, earlier time would name an instant at
    /// which there is nothing to send).
    pub(crate) fn next_transmit_at(&self) -> Option<Instant> {
        if !self.session.open() {
            return None;
        }
        self.sent
            .iter()
            .find(|descriptor| descriptor.needs_transmit)
            .and_then(|descriptor| descriptor.not_before)
    }

    /// Owes the peer an acknowledgement due alone at `at` at the latest (an earlier debt keeps its
    /// time).
    pub(crate) fn owe_ack(&mut self, at: Instant) {
        self.ack_due = crate::time::earliest(self.ack_due, Some(at));
    }

    /// Marks every descriptor from `seq` on for retransmission (go-back-N).
    pub(crate) fn go_back_to(&mut self, seq: Seq) {
        for descriptor in self.sent.iter_mut() {
            if !descriptor.seq.precedes(seq) {
                descriptor.needs_transmit = true;
            }
        }
    }

    /// Starts a new transmit epoch: the peer holds no state for ours although it acknowledged part
    /// of it — it recycled the connection after a silence longer than the give-up time, or
    /// restarted — so nothing in flight now was delivered to the state it has now.
    /// What is in flight is renumbered from zero and sent again.
    pub(crate) fn restart_epoch(&mut self, epoch: u32) {
        self.tx_epoch = epoch;
        self.next_seq = Seq(0);
        self.tx_acked_in_epoch = false;
        for descriptor in self.sent.iter_mut() {
            descriptor.seq = self.next_seq;
            descriptor.needs_transmit = true;
            descriptor.not_before = None;
            self.next_seq = self.next_seq.next();
        }
        self.last_go_back = None;
    }

    /// Our `port` closed: its data packets can no longer be built (its memory is gone). Queued ones
    /// are dropped; those already sequenced become cancelled slots so the stream stays gap-free.
    /// Barrier packets stay: they are self-contained, and peers of a completed barrier need them.
    pub(crate) fn cancel_port_data(&mut self, port: u8) {
        let is_ours = |body: &Body| {
            matches!(body, Body::Data { port: p, .. }
                | Body::DataSegment { port: p, .. }
                | Body::Put { port: p, .. }
                | Body::Get { port: p, .. }
                | Body::Atomic { port: p, .. } if *p == port)
        };
        let queued = self.queue.len();
        for _ in 0..queued {
            if let Some(body) = self.queue.pop_front()
                && !is_ours(&body)
            {
                // Cannot fail: we just made room by popping.
                let _ = self.queue.push_back(body);
            }
        }
        for _ in 0..self.parked.len() {
            if let Some(parked) = self.parked.pop_front()
                && !is_ours(&parked.body)
            {
                let _ = self.parked.push_back(parked);
            }
        }
        for descriptor in self.sent.iter_mut() {
            if is_ours(&descriptor.body) {
                descriptor.body = Body::Cancelled;
            }
        }
    }
}
