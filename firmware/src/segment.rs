//! Messages longer than a packet: the NIC cuts them into [`DATA_SEGMENT`]-byte segments and the
//! receiving NIC places each, in order, into the one receive buffer the first segment took (GM 2's
//! sizes: a message of size class `k` fills a buffer of class `k`, up to
//! [`shared_abi::max_length_for_size`]`(k)` bytes, whatever the packets it travels in).
//!
//! Sending: a long message's token is held like any message; its segments are fed to the
//! connection's queue as room appears ([`Nic::feed_messages`]) and each is read from the arena when
//! its packet is built (again at a retransmission), so no copy is kept beyond the window. The
//! port's later tokens wait until every segment is queued, so a port's messages start in the
//! order posted and the segments of one message follow one another on the connection with no
//! other message of the same port between them. The message completes when its last segment is
//! acknowledged. It fails — and its remaining segments become cancelled slots — when the receiver
//! refuses a segment for good (its port closed: `TARGET_PORT_CLOSED`; no buffer for too long:
//! `SEND_TIMED_OUT`; the receiver lost the message's start: `INCOMPLETE`).
//!
//! A segment the receiver refuses for want of a buffer parks the message's flow as a one-packet
//! message does ([`crate::connection::Connection::park_flow`]): the message leaves the stream as
//! one parked entry (the refused segment; the feeder is rewound to the one after it), so the
//! connection's other traffic flows on, and it comes back when due
//! ([`crate::connection::Connection::unpark_due`]). Until the receiver takes that segment, it
//! alone goes on the wire; the feeder resumes at its acknowledgement. Meanwhile the port's later
//! messages and operations wait, as they wait for any long message not wholly queued (its
//! barriers do not).
//!
//! Receiving: the first segment (offset 0) needs a buffer of the message's size and priority, as a
//! one-packet message does (else the sender holds it and tries again: the existing flow control);
//! the following ones continue the assembly of their source port on the connection
//! ([`crate::connection::Assembly`]). The event comes when the last byte is in. A message whose
//! sender withdrew it part way (its port closed, a new message began, the peer started a new
//! epoch) gives its buffer back with status `INCOMPLETE` and the bytes that arrived.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::max_length_for_size;
use shared_abi::packet::{
    DATA_SEGMENT, DataSegmentHeader, HEADER_LEN, PacketHeader, PacketKind, RejectReason,
};
use shared_abi::ring::SharedMemory;
use shared_abi::token::Priority;
use zerocopy::{FromBytes, IntoBytes};

use crate::connection::{Assembly, Body};
use crate::hal::{Gather, GatherFrom};
use crate::port::OpenPort;
use crate::send::{Built, Gathered, OnFault};
use crate::time::Instant;
use crate::{Hal, Nic};

/// Bytes of the segment header at the start of a segment's payload.
const SEGMENT_HEADER_LEN: usize = core::mem::size_of::<DataSegmentHeader>();

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Queues the next segments of long messages as the connections have room. Returns whether it
    /// queued any.
    pub(crate) fn feed_messages(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for port in crate::ports_of(self.open_ports) {
            let Some(slots) = self.ports.open(port).map(OpenPort::held_slots) else {
                continue;
            };
            for slot in slots.iter() {
                let Some(open) = self.ports.open(port) else {
                    break;
                };
                let Some(held) = open.held_send(slot) else {
                    continue;
                };
                if !held.is_feeding() || held.refused_since.is_some() {
                    // Wholly queued; or its receiver refused it for want of a buffer and it
                    // probes with the refused segment alone until that one is taken (the rest
                    // would only be dropped behind it).
                    continue;
                }
                let (held, generation) = (*held, open.generation);
                let Some(index) = self.connection_for(held.token.target_node, now) else {
                    continue;
                };
                let Some(connection) = self.connections.get_mut(index) else {
                    continue;
                };
                let segments = held.segments();
                let mut queued = held.queued_segments;
                while queued < segments && !connection.queue.is_full() {
                    let body = Body::DataSegment {
                        port: port as u8,
                        slot: slot as u8,
                        generation,
                        dst_port: held.token.target_port,
                        priority: held.token.priority.0,
                        serial: held.serial,
                        segment: queued,
                    };
                    if connection.parked_until(&body).is_some() {
                        // The message's flow waits for a receive buffer (this message's first
                        // segment, or an earlier message of the flow, is parked): feeding
                        // resumes once those are queued again (`Connection::unpark_due`).
                        break;
                    }
                    let _ = connection.queue.push_back(body);
                    queued += 1;
                }
                if queued != held.queued_segments
                    && let Some(state) = self
                        .ports
                        .open_mut(port)
                        .and_then(|open| open.held_send_mut(slot))
                {
                    state.queued_segments = queued;
                    busy = true;
                }
            }
        }
        busy
    }

    /// Builds the payload of segment `body` into the scratch buffer after the packet header
    /// (the segment header, then the bytes read from the arena, or named for the board to read
    /// as it sends a segment longer than the scratch buffer holds), filling in `header`. A
    /// segment whose message is gone (completed, failed, its port closed) leaves the header a
    /// cancelled slot with no payload.
    pub(crate) fn build_data_segment(&mut self, header: &mut PacketHeader, body: Body) -> Built {
        let Body::DataSegment {
            port,
            slot,
            generation,
            dst_port,
            serial,
            segment,
            ..
        } = body
        else {
            return Built::NOTHING;
        };
        let Some(held) = self
            .ports
            .open(usize::from(port))
            .filter(|open| open.generation == generation)
            .and_then(|open| open.held_send(usize::from(slot)).copied())
            .filter(|held| held.serial == serial && held.segments() > 0)
        else {
            return Built::NOTHING;
        };
        let length = held.token.length.get() as usize;
        let each = held.segment_len as usize;
        let position = (segment as usize).saturating_mul(each);
        let data_len = length.saturating_sub(position).min(each);
        let segment_header = DataSegmentHeader {
            total: (length as u32).into(),
            offset: (position as u32).into(),
        };
        let start = HEADER_LEN + SEGMENT_HEADER_LEN;
        let offset = held.payload_offset.saturating_add(position);
        let mut gather = None;
        if each > DATA_SEGMENT {
            gather = Some(Gathered {
                source: Gather {
                    port: usize::from(port),
                    len: data_len,
                    from: GatherFrom::Region { offset },
                },
                on_fault: OnFault::Cancel,
            });
        } else {
            let Some(memory) = self.hal.port_memory(usize::from(port)) else {
                return Built::NOTHING;
            };
            let read = self
                .scratch
                .get_mut(start..start + data_len)
                .map(|out| memory.read(offset, out));
            if !matches!(read, Some(Ok(()))) {
                // The buffer was checked when the token was taken; memory gone now means the
                // port is closing. Send the slot as cancelled rather than stall the stream.
                return Built::NOTHING;
            }
        }
        if let Some(out) = self.scratch.get_mut(HEADER_LEN..start) {
            out.copy_from_slice(segment_header.as_bytes());
        }
        header.kind = PacketKind::DATA_SEGMENT;
        header.src_port = PortId(port);
        header.dst_port = dst_port;
        header.src_generation = generation;
        header.priority = held.token.priority.0;
        header.size = held.token.size;
        Built {
            payload_len: SEGMENT_HEADER_LEN + data_len,
            gather,
        }
    }

    /// Segment `segment` of the message `serial` in `slot` of `port` was acknowledged: the last
    /// one completes the message.
    pub(crate) fn segment_acknowledged(&mut self, port: u8, slot: u8, serial: u32, segment: u32) {
        let Some(held) = self
            .ports
            .open_mut(usize::from(port))
            .and_then(|open| open.held_send_mut(usize::from(slot)))
            .filter(|held| held.serial == serial)
        else {
            return;
        };
        // The receiver took a segment: it has the message's buffer, and the rest is fed.
        held.refused_since = None;
        let last = segment.saturating_add(1) >= held.segments();
        if last {
            self.complete_send(usize::from(port), usize::from(slot), Status::SUCCESS);
        }
    }

    /// Fails the long message `serial` in `slot` of `port` with `status`: its segments still
    /// queued on connection `index` are dropped, those sent become cancelled slots.
    pub(crate) fn fail_message(
        &mut self,
        index: usize,
        port: u8,
        slot: u8,
        serial: u32,
        status: Status,
    ) {
        let ours = |body: &Body| {
            matches!(body, Body::DataSegment { port: p, slot: s, serial: n, .. }
                if *p == port && *s == slot && *n == serial)
        };
        if let Some(connection) = self.connections.get_mut(index) {
            for descriptor in connection.sent.iter_mut() {
                if ours(&descriptor.body) {
                    descriptor.body = Body::Cancelled;
                }
            }
            for _ in 0..connection.queue.len() {
                if let Some(body) = connection.queue.pop_front()
                    && !ours(&body)
                {
                    let _ = connection.queue.push_back(body);
                }
            }
            for _ in 0..connection.parked.len() {
                if let Some(parked) = connection.parked.pop_front()
                    && !ours(&parked.body)
                {
                    let _ = connection.parked.push_back(parked);
                }
            }
        }
        let current = self
            .ports
            .open(usize::from(port))
            .and_then(|open| open.held_send(usize::from(slot)).copied())
            .is_some_and(|held| held.serial == serial && held.segments() > 0);
        if current {
            self.complete_send(usize::from(port), usize::from(slot), status);
        }
    }

    /// The connection to `peer` gave up: every long message toward it fails (a segment not yet
    /// queued would otherwise go into a stream the peer no longer assembles).
    pub(crate) fn give_up_messages(&mut self, peer: NodeId) {
        for port in 0..PORTS_PER_NIC {
            let Some(slots) = self.ports.open(port).map(OpenPort::held_slots) else {
                continue;
            };
            for slot in slots.iter() {
                let toward_peer = self
                    .ports
                    .open(port)
                    .and_then(|open| open.held_send(slot).copied())
                    .is_some_and(|held| held.segments() > 0 && held.token.target_node == peer);
                if toward_peer {
                    self.complete_send(port, slot, Status::TARGET_NODE_UNREACHABLE);
                }
            }
        }
    }

    /// An in-order segment of a long message from `peer` on connection `index`.
    ///
    /// # Errors
    /// The [`RejectReason`] to send back: the port is closed (or closed since the message began),
    /// has no buffer of the message's size and priority for its first segment (the sender holds
    /// it and retries), or the segment continues no message being assembled.
    pub(crate) fn deliver_segment(
        &mut self,
        index: usize,
        peer: NodeId,
        header: &PacketHeader,
        payload: &[u8],
    ) -> Result<(), RejectReason> {
        let source = usize::from(header.src_port.0);
        let Ok((segment, data)) = DataSegmentHeader::read_from_prefix(payload) else {
            // Authenticated but malformed: a peer's bug. Take the slot, apply nothing.
            self.counters.malformed_packets += 1;
            return Ok(());
        };
        if source >= PORTS_PER_NIC {
            self.counters.malformed_packets += 1;
            return Ok(());
        }
        let (total, offset) = (segment.total.get(), segment.offset.get());
        let Some(port) = header.dst_port.index() else {
            return Err(RejectReason::PORT_CLOSED);
        };
        let Some(generation) = self.ports.open(port).map(|open| open.generation) else {
            self.abandon_assembly(peer, index, source);
            return Err(RejectReason::PORT_CLOSED);
        };
        if offset == 0 {
            // A new message from this source port: whatever it was sending before was withdrawn.
            self.abandon_assembly(peer, index, source);
            let priority = Priority(header.priority);
            let Some(open) = self.ports.open_mut(port) else {
                return Err(RejectReason::PORT_CLOSED);
            };
            let Some(position) = open
                .receive_buffers
                .iter()
                .position(|buffer| buffer.size == header.size && buffer.priority == priority)
            else {
                return Err(RejectReason::NO_BUFFER);
            };
            let Some(buffer) = open.take_receive_buffer(position) else {
                return Err(RejectReason::NO_BUFFER);
            };
            open.assembling = open.assembling.saturating_add(1);
            if let Some(entry) = self
                .connections
                .get_mut(index)
                .and_then(|c| c.assemblies.get_mut(source))
            {
                *entry = Some(Assembly {
                    port: port as u8,
                    generation,
                    buffer,
                    total,
                    received: 0,
                    status: Status::SUCCESS,
                });
            }
        }
        let Some(assembly) = self
            .connections
            .get(index)
            .and_then(|c| c.assemblies.get(source).copied().flatten())
        else {
            return Err(RejectReason::INCOMPLETE);
        };
        if usize::from(assembly.port) != port || assembly.generation != generation {
            // The port it was filling closed (and perhaps opened again) since it began.
            self.abandon_assembly(peer, index, source);
            return Err(RejectReason::PORT_CLOSED);
        }
        if assembly.received != offset || assembly.total != total {
            return Err(RejectReason::INCOMPLETE);
        }
        // Bytes past what the buffer holds are not written (a correct sender never sends them:
        // it checked the length against the same size class).
        let capacity = u64::from(max_length_for_size(assembly.buffer.size));
        let writable = capacity
            .saturating_sub(u64::from(offset))
            .min(data.len() as u64) as usize;
        let mut status = assembly.status;
        if writable > 0 {
            let written = self.hal.port_memory(port).and_then(|memory| {
                let open = self.ports.open(port)?;
                let at = assembly
                    .buffer
                    .buffer
                    .get()
                    .checked_add(u64::from(offset))?;
                let region_offset = open.layout.arena_range(at, writable)?;
                Some(memory.write(region_offset, data.get(..writable)?))
            });
            if !matches!(written, Some(Ok(()))) && status == Status::SUCCESS {
                status = Status::BAD_BUFFER;
            }
        }
        let received = offset.saturating_add(data.len() as u32);
        let Some(entry) = self
            .connections
            .get_mut(index)
            .and_then(|c| c.assemblies.get_mut(source))
        else {
            return Ok(());
        };
        if received < total {
            *entry = Some(Assembly {
                received,
                status,
                ..assembly
            });
            return Ok(());
        }
        *entry = None;
        let length = u64::from(total).min(capacity) as u32;
        self.counters.messages_delivered += 1;
        self.end_assembly(peer, source, &assembly, status, length);
        Ok(())
    }

    /// The source port `source` of `peer` (connection `index`) withdrew the message it was
    /// sending, if any: its buffer comes back to the process, with the bytes that arrived (if
    /// the port it was filling is still the incarnation it began in).
    pub(crate) fn abandon_assembly(&mut self, peer: NodeId, index: usize, source: usize) {
        let Some(assembly) = self
            .connections
            .get_mut(index)
            .and_then(|c| c.assemblies.get_mut(source))
            .and_then(Option::take)
        else {
            return;
        };
        self.end_assembly(
            peer,
            source,
            &assembly,
            Status::INCOMPLETE,
            assembly.received,
        );
    }

    /// The peer of connection `index` started a new epoch: every message it was sending is gone.
    pub(crate) fn abandon_assemblies(&mut self, index: usize) {
        let Some(peer) = self.connections.get(index).map(|c| c.peer) else {
            return;
        };
        for source in 0..PORTS_PER_NIC {
            self.abandon_assembly(peer, index, source);
        }
    }

    /// Our port `port` closed: the messages arriving into it are forgotten with its buffers.
    pub(crate) fn forget_assemblies_for(&mut self, port: usize) {
        for connection in self.connections.iter_mut() {
            for entry in connection.assemblies.iter_mut() {
                if entry.is_some_and(|assembly| usize::from(assembly.port) == port) {
                    *entry = None;
                }
            }
        }
    }

    /// Gives `assembly`'s buffer back to its port (if it is still the incarnation the message
    /// began in) with a RECEIVED event of `status` and `length` bytes.
    fn end_assembly(
        &mut self,
        peer: NodeId,
        source: usize,
        assembly: &Assembly,
        status: Status,
        length: u32,
    ) {
        let port = usize::from(assembly.port);
        let Some(open) = self
            .ports
            .open_mut(port)
            .filter(|open| open.generation == assembly.generation)
        else {
            return;
        };
        open.assembling = open.assembling.saturating_sub(1);
        let buffer = assembly.buffer;
        let event = Event {
            priority: buffer.priority,
            size: buffer.size,
            peer_node: peer,
            peer_port: PortId(source as u8),
            length: length.into(),
            tag: buffer.tag,
            buffer: buffer.buffer,
            ..Self::event(EventKind::RECEIVED, status)
        };
        self.emit(port, event);
    }
}
