//! The NIC's state toward one remote node (paper §4.1): reliable in-order sequencing, as GM does
//! it — sequence numbers, cumulative acks, a NACK on a gap, go-back-N from a sent list of packet
//! descriptors, a retransmit timer and a give-up — and the unexpected-barrier record.
//!
//! The sent list holds descriptors, not tokens (the fix for paper §4.4): each descriptor is
//! enough to rebuild its packet, so every barrier packet resends on its own, and a data packet is
//! rebuilt from the host buffer its send token still owns.

use heapless::Deque;
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
    ReadData(crate::remote::ReadSegment),
    /// The answer to a one-sided operation of the peer.
    Reply(crate::remote::Reply),
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
    pub(crate) closed_notices: Deque<(u8, Generation), CLOSED_NOTICES>,
    /// Answers owed to the peer's one-sided operations, sent before the queue. Room for every
    /// operation the peer may have outstanding toward us ([`crate::remote::RDMA_OPS`]), so taking
    /// a request never waits for our own stream.
    pub(crate) replies: Deque<Body, { crate::remote::RDMA_OPS }>,
    /// Gets of the peer this NIC is serving: their data is queued as room appears.
    pub(crate) reads: Deque<crate::remote::ReadStream, { crate::remote::RDMA_OPS }>,
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
    pub(crate) ack_pending: bool,
    /// A NACK to send, for the given epoch of the peer.
    pub(crate) nack_pending: Option<u32>,
    pub(crate) last_nack: Option<Instant>,
    pub(crate) rejects: Deque<(Seq, RejectReason, u32, u8), REJECTS>,
    /// The sequence number of a data message we refused because its port was closed. The sender
    /// fails such a message (`TARGET_PORT_CLOSED`) and fills its slot with a cancelled packet, so
    /// until that arrives we keep refusing the number — even once the port opens — or a delayed
    /// duplicate of the refused message would be delivered after its sender was told it failed.
    pub(crate) refused_closed: Option<Seq>,
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
            ack_pending: false,
            nack_pending: None,
            last_nack: None,
            rejects: Deque::new(),
            refused_closed: None,
            barrier_attempts: [[0; PORTS_PER_NIC]; PORTS_PER_NIC],
            barrier_refused: [[None; PORTS_PER_NIC]; PORTS_PER_NIC],
            last_heard: now,
            record: UnexpectedBarrierRecord::default(),
            counters: ConnectionCounters::default(),
        }
    }

    /// Whether nothing is in flight, queued or recorded, and nothing is owed to the peer.
    pub(crate) fn is_idle(&self) -> bool {
        self.sent.is_empty()
            && self.queue.is_empty()
            && self.closed_notices.is_empty()
            && self.replies.is_empty()
            && self.reads.is_empty()
            && !self.ack_pending
            && self.nack_pending.is_none()
            && self.rejects.is_empty()
            && self.record.is_empty()
            && self.assemblies.iter().all(Option::is_none)
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
}
