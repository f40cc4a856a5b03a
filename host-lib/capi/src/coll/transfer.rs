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

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nicbar_rs::{DmaBuffer, Error, Event, Member, Port, Priority, Status};
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
}

/// A segment in the NIC, by the send's context.
struct InFlight {
    id: SendId,
    to: Member,
    length: usize,
}

/// A message's sends: segments not yet handed to the NIC, segments not yet delivered, its
/// error if one failed, and whether its sender has stopped asking (it was handed over whole).
struct SendRecord {
    unposted: usize,
    undelivered: usize,
    error: Option<TransferError>,
    detached: bool,
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
}

impl Transfers {
    /// The transfers of `port`: its send buffers allocated and its receive buffers provided.
    ///
    /// # Errors
    /// What the port says when the arena has no room or a provide is refused.
    pub(crate) fn new(port: &mut Port, retry_window: Duration) -> Result<Self, Error> {
        let mut transfers = Self::empty(retry_window);
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
        }
    }

    /// What the transfers did so far.
    pub(crate) fn counters(&self) -> TransferCounters {
        self.counters
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
        self.sends.insert(
            id,
            SendRecord {
                unposted: segment_count(data.len()),
                undelivered: segment_count(data.len()),
                error: None,
                detached: false,
            },
        );
        self.outgoing.push_back(Outgoing {
            id,
            to,
            key,
            data,
            next: 0,
        });
        id
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
        Ok(record.unposted == 0)
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
        if record.error.is_some() {
            self.counters.late_failures += 1;
            self.forget_send(id);
        } else if record.undelivered == 0 {
            self.counters.messages_sent += 1;
            self.forget_send(id);
        }
    }

    fn forget_send(&mut self, id: SendId) {
        self.sends.remove(&id);
        self.first_give_up.remove(&id);
        self.outgoing.retain(|message| message.id != id);
    }

    /// The message from `from` under `key`, if it has arrived whole (it is then forgotten).
    pub(crate) fn take(&mut self, from: Member, key: Key) -> Option<Vec<u8>> {
        let message = self.arrived.remove(&(from, key))?;
        self.counters.messages_received += 1;
        Some(message)
    }

    /// Whether anything waits to go out.
    pub(crate) fn has_outgoing(&self) -> bool {
        !self.outgoing.is_empty() || !self.resend.is_empty()
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
                if status == Status::SUCCESS {
                    let from = Member::new(sender_node, sender_port);
                    match buffer.get(..length) {
                        Some(bytes) => self.arrive(from, bytes),
                        None => self.counters.dropped += 1,
                    }
                }
                // Provided again at once: a receive token came back with the event.
                // (A refused buffer goes back to the arena; the others keep the port fed.)
                let _ = self.provide(port, buffer);
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
                if record.detached && record.undelivered == 0 {
                    self.counters.messages_sent += 1;
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
    fn arrive(&mut self, from: Member, bytes: &[u8]) {
        let Some(header) = Header::parse(bytes) else {
            self.counters.dropped += 1;
            return;
        };
        let payload = &bytes[HEADER_LEN..];
        let (Ok(offset), Ok(total)) = (
            usize::try_from(header.offset),
            usize::try_from(header.total),
        ) else {
            self.counters.dropped += 1;
            return;
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
            return;
        }
        let assembly = match self.assembling.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let mut data = Vec::new();
                if data.try_reserve_exact(total).is_err() {
                    self.counters.dropped += 1;
                    return;
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
            return;
        }
        assembly.data[offset..offset + payload.len()].copy_from_slice(payload);
        assembly.arrived[index] = true;
        assembly.missing -= 1;
        if assembly.missing == 0
            && let Some(done) = self.assembling.remove(&key)
        {
            self.arrived.insert(key, done.data);
        }
    }

    /// Posts what waits to go out while send buffers and tokens last. Returns whether it posted
    /// anything.
    pub(crate) fn post(&mut self, port: &mut Port) -> bool {
        let mut posted = false;
        while let Some((buffer, context)) = self.resend.pop_front() {
            let Some(flight) = self.in_flight.get(&context) else {
                self.spare.push(buffer);
                continue;
            };
            let (to, length) = (flight.to, flight.length);
            match port.send(
                buffer,
                length,
                SIZE_CLASS,
                Priority::LOW,
                to.node,
                to.port,
                context,
            ) {
                Ok(()) => posted = true,
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
            let (id, to) = (message.id, message.to);
            let context = self.next_context;
            match port.send(
                buffer,
                HEADER_LEN + length,
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
                            length: HEADER_LEN + length,
                        },
                    );
                    message.next += 1;
                    if let Some(record) = self.sends.get_mut(&id) {
                        record.unposted = record.unposted.saturating_sub(1);
                    }
                    if message.next >= segment_count(message.data.len()) {
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
