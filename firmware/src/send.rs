//! SEND: puts prepared packets on the wire — new ones as the window allows, retransmissions
//! (go-back-N), and the pending acks, nacks and rejections (paper §4.1) — and runs the
//! per-connection timers: retransmission with exponential backoff, and the give-up that turns an
//! unreachable node into error events instead of a hang.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::{HEADER_LEN, MAC_LEN, PacketFlags, PacketHeader, PacketKind};
use shared_abi::rdma::{RDMA_HEADER_LEN, RdmaHeader};
use shared_abi::ring::SharedMemory;
use zerocopy::FromBytes;
use zerocopy::little_endian::U32;

use crate::connection::{Body, Connection, Descriptor, WINDOW};
use crate::hal::{Gather, GatherError, TransmitError};
use crate::seq::Seq;
use crate::time::Instant;
use crate::{Hal, Nic};

/// What a packet's builder ([`Nic::build_rdma`], [`Nic::build_data_segment`]) built into the
/// scratch buffer after the header: the payload's length, of which the last `gather`'s bytes,
/// if it is given, are for the board to read as it transmits the packet
/// ([`Hal::transmit_gathered`]) instead of in the scratch buffer.
pub(crate) struct Built {
    pub(crate) payload_len: usize,
    pub(crate) gather: Option<Gathered>,
}

impl Built {
    /// Nothing: the packet goes as a cancelled slot.
    pub(crate) const NOTHING: Self = Self {
        payload_len: 0,
        gather: None,
    };
}

/// Bytes the board reads as it transmits the packet, and what becomes of the packet if it
/// cannot read them.
pub(crate) struct Gathered {
    pub(crate) source: Gather,
    pub(crate) on_fault: OnFault,
}

/// What a packet whose bytes the board could not read becomes, as if the firmware's own read
/// into the scratch buffer had failed.
#[derive(Clone, Copy)]
pub(crate) enum OnFault {
    /// A put's segment: the put (in this slot of the source's port) fails with
    /// `MEMORY_FAULT`, and the packet goes as a cancelled slot.
    FailPut(u8),
    /// A long message's segment: the packet goes as a cancelled slot (the port is closing).
    Cancel,
    /// A get's data: the packet goes with no data and the status `MEMORY_FAULT`, which ends
    /// the get at its initiator.
    Refuse,
}

/// Largest factor the retransmission interval grows to (2^5 = 32 times the first).
const MAX_BACKOFF: u32 = 5;

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Transmits what every connection has due. Returns whether anything went out.
    pub(crate) fn transmit_all(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for index in 0..self.connections.len() {
            busy |= self.transmit_connection(index, now);
        }
        busy
    }

    fn transmit_connection(&mut self, index: usize, now: Instant) -> bool {
        let Some(connection) = self.connections.get_mut(index) else {
            return false;
        };
        let (parked_was, window_was) = (connection.parked.len(), connection.sent.len());
        connection.unpark_due(now);
        let queue_was_full = connection.queue.is_full();
        // Give queued packets (and port-closed notices, after them) sequence numbers as the window
        // allows.
        while !connection.sent.is_full() {
            // Replies first: the peer's operations wait on them, never on our own stream.
            let body = if let Some(body) = connection.replies.pop_front() {
                body
            } else if let Some(body) = connection.queue.pop_front() {
                body
            } else if let Some((port, generation)) = connection.closed_notices.pop_front() {
                Body::PortClosed { port, generation }
            } else {
                break;
            };
            let descriptor = Descriptor {
                seq: connection.next_seq,
                body,
                first_sent: now,
                needs_transmit: true,
                not_before: None,
                transmissions: 0,
            };
            connection.next_seq = connection.next_seq.next();
            if connection.sent.is_empty() {
                connection.last_progress = now;
            }
            // Cannot fail: the loop checks `is_full`.
            let _ = connection.sent.push_back(descriptor);
        }
        if queue_was_full && !connection.queue.is_full() {
            // The window took from a queue that was full when the due parked messages looked for
            // room: they take the room now, rather than stay due with room for them (which would
            // leave `poll_at` naming a time already past).
            connection.unpark_due(now);
        }
        // Unparking and taking into the window are work even if nothing can go yet (no session,
        // a held packet): they free a flow and make room in the queue, which long messages feed
        // (`Nic::feed_messages`) on the next poll, and a caller polls again only for a poll that
        // did something.
        let took = connection.parked.len() != parked_was || connection.sent.len() != window_was;
        let mut busy = self.transmit_hello(index, now) | took;
        let Some(connection) = self.connections.get_mut(index) else {
            return busy;
        };
        if !connection.session.open() {
            // Nothing sequenced goes out before the handshake; the retransmission timer runs
            // meanwhile, so an unreachable peer is given up on as if it took nothing.
            if !connection.sent.is_empty() && connection.retransmit_at.is_none() {
                connection.retransmit_at = Some(now.saturating_add(self.config.retransmit_timeout));
            }
            return busy;
        }
        let mut position = 0;
        loop {
            let Some(connection) = self.connections.get(index) else {
                return busy;
            };
            let Some((found, descriptor)) = connection
                .sent
                .iter()
                .enumerate()
                .skip(position)
                .find(|(_, d)| d.needs_transmit)
                .map(|(found, d)| (found, *d))
            else {
                break;
            };
            position = found;
            if descriptor.not_before.is_some_and(|at| at > now) {
                // Go-back-N keeps order: nothing after a held packet goes before it.
                break;
            }
            match self.transmit_descriptor(index, &descriptor) {
                Ok(()) => {}
                Err(TransmitError::WouldBlock) => {
                    // The wire is full: try this packet again shortly (`poll_at` reports it).
                    let retry = now.saturating_add(self.config.retry_interval);
                    if let Some(connection) = self.connections.get_mut(index) {
                        if let Some(blocked) =
                            connection.sent.iter_mut().find(|d| d.seq == descriptor.seq)
                        {
                            blocked.not_before = Some(retry);
                        }
                        // An ack due now cannot go either: it goes with the retry.
                        if connection.ack_due.is_some_and(|at| at <= now) {
                            connection.ack_due = Some(retry);
                        }
                    }
                    return busy;
                }
                Err(TransmitError::NoRoute) => {}
            }
            busy = true;
            let Some(connection) = self.connections.get_mut(index) else {
                return busy;
            };
            if let Some(sent) = connection.sent.iter_mut().find(|d| d.seq == descriptor.seq) {
                if sent.transmissions == 0 {
                    connection.counters.sent += 1;
                } else {
                    connection.counters.resent += 1;
                }
                sent.transmissions = sent.transmissions.wrapping_add(1);
                sent.needs_transmit = false;
                sent.not_before = None;
            }
            if connection.retransmit_at.is_none() {
                connection.retransmit_at = Some(now.saturating_add(self.config.retransmit_timeout));
            }
            position += 1;
        }
        busy |= self.transmit_control(index, now);
        busy
    }

    /// Builds the packet for `descriptor` into the scratch buffer and transmits it, with the
    /// connection's acknowledgement piggybacked.
    fn transmit_descriptor(
        &mut self,
        index: usize,
        descriptor: &Descriptor,
    ) -> Result<(), TransmitError> {
        let Some(connection) = self.connections.get_mut(index) else {
            return Ok(());
        };
        let peer = connection.peer;
        let mut header = PacketHeader::new(PacketKind::CANCELLED, self.node, peer);
        header.epoch = U32::new(connection.tx_epoch);
        header.seq = U32::new(descriptor.seq.0);
        header.transmission = descriptor.transmissions as u8;
        if !connection.tx_acked_in_epoch {
            header.flags |= PacketFlags::SYN;
        }
        if let Some(epoch) = connection.rx_epoch {
            header.flags |= PacketFlags::ACK_VALID;
            header.ack = U32::new(connection.expected.0);
            header.ack_epoch = U32::new(epoch);
            connection.ack_due = None;
        }
        if wants_ack_now(connection, descriptor) {
            header.flags |= PacketFlags::ACK_REQUEST;
        }
        let mut payload_len = 0usize;
        let mut payload_from: Option<(usize, usize)> = None;
        let mut gather = None;
        match descriptor.body {
            Body::Data {
                port,
                slot,
                generation,
                dst_port,
                priority,
                size,
                length,
            } => {
                let held = self
                    .ports
                    .open(usize::from(port))
                    .filter(|open| open.generation == generation)
                    .and_then(|open| open.held_send(usize::from(slot)).copied());
                if let Some(held) = held {
                    header.kind = PacketKind::DATA;
                    header.attempt = connection
                        .data_attempts
                        .get(usize::from(port))
                        .and_then(|row| row.get(usize::from(dst_port.0)))
                        .map_or(0, |cell| cell[usize::from(priority & 1)]);
                    header.src_port = shared_abi::ids::PortId(port);
                    header.dst_port = dst_port;
                    header.src_generation = generation;
                    header.priority = priority;
                    header.size = size;
                    payload_len = usize::from(length);
                    payload_from = Some((usize::from(port), held.payload_offset));
                }
            }
            Body::Barrier {
                port,
                generation,
                dst_port,
                barrier,
                failed,
                round,
                attempt,
            } => {
                header.kind = PacketKind::BARRIER;
                header.attempt = attempt;
                header.src_port = shared_abi::ids::PortId(port);
                header.dst_port = dst_port;
                header.src_generation = generation;
                header.aux = round;
                let body = shared_abi::packet::BarrierPayload {
                    barrier,
                    failed_node: failed.map_or(NodeId::new(0), |f| f.node),
                    failed_port: failed.map_or(PortId(0), |f| f.port),
                    failed_status: failed.map_or(Status::SUCCESS, |f| f.status),
                };
                let bytes = zerocopy::IntoBytes::as_bytes(&body);
                // A reduction's packet carries the value its step sent; a broadcast's bytes
                // ride every packet of it once the port holds them.
                let reduced = failed
                    .is_none()
                    .then(|| self.reduction_held(usize::from(port), generation, barrier, round))
                    .flatten();
                let held = failed
                    .is_none()
                    .then(|| self.broadcast_held(usize::from(port), generation, barrier))
                    .flatten();
                let data = match (&reduced, &held) {
                    (Some(value), _) => {
                        header.size = shared_abi::packet::BARRIER_CARRIES_REDUCTION;
                        value.data()
                    }
                    (None, Some(held)) => held.data(),
                    (None, None) => &[][..],
                };
                let start = shared_abi::packet::HEADER_LEN;
                if let Some(out) = self.scratch.get_mut(start..start + bytes.len()) {
                    out.copy_from_slice(bytes);
                    payload_len = bytes.len();
                }
                let end = start + bytes.len() + data.len();
                if let Some(out) = self.scratch.get_mut(start + bytes.len()..end) {
                    out.copy_from_slice(data);
                    payload_len += data.len();
                }
            }
            Body::PortClosed { port, generation } => {
                header.kind = PacketKind::PORT_CLOSED;
                header.src_port = shared_abi::ids::PortId(port);
                header.src_generation = generation;
            }
            Body::Cancelled => {}
            Body::DataSegment {
                port,
                dst_port,
                priority,
                ..
            } => {
                // The flow's current attempt, as a one-packet message of the flow carries it.
                header.attempt = connection
                    .data_attempts
                    .get(usize::from(port))
                    .and_then(|row| row.get(usize::from(dst_port.0)))
                    .map_or(0, |cell| cell[usize::from(priority & 1)]);
                let built = self.build_data_segment(&mut header, descriptor.body);
                payload_len = built.payload_len;
                gather = built.gather;
                if header.kind != PacketKind::DATA_SEGMENT {
                    header.attempt = 0;
                }
            }
            Body::Put { .. }
            | Body::Get { .. }
            | Body::Atomic { .. }
            | Body::ReadData(_)
            | Body::Reply(_) => {
                let built = self.build_rdma(&mut header, descriptor.body);
                payload_len = built.payload_len;
                gather = built.gather;
            }
        }
        let header_len = HEADER_LEN;
        let total = header_len + payload_len;
        if let Some((port, offset)) = payload_from {
            let read = self.hal.port_memory(port).map(|memory| {
                self.scratch
                    .get_mut(header_len..total)
                    .map(|out| memory.read(offset, out))
            });
            if !matches!(read, Some(Some(Ok(())))) {
                // The buffer was checked when the token was taken; if the memory is gone now the
                // port is closing. Send the slot as cancelled rather than stall the stream.
                header.kind = PacketKind::CANCELLED;
                payload_len = 0;
            }
        }
        let mut out_header = header;
        out_header.length = (payload_len as u16).into();
        if let Some(bytes) = self.scratch.get_mut(..header_len) {
            bytes.copy_from_slice(zerocopy::IntoBytes::as_bytes(&out_header));
        }
        match gather {
            Some(gathered) => {
                let head = header_len + payload_len - gathered.source.len;
                self.transmit_gathered(peer, head, gathered)
            }
            None => self.transmit_scratch(peer, header_len + payload_len),
        }
    }

    /// Whether the board builds the packets of long segments toward `node` itself
    /// ([`Hal::gathers_toward`]), on a route that never leaves its memory (the only kind on
    /// which it may).
    pub(crate) fn gathers_toward(&self, node: NodeId) -> bool {
        self.hal.gathers_toward(node) && self.hal.local_route(node)
    }

    /// Transmits a segment whose head is in `scratch[..head]` and whose bytes the board reads
    /// as it sends ([`Hal::transmit_gathered`]), on a route that never leaves its memory (so
    /// with no authentication code). Bytes it cannot read end as [`OnFault`] says; the packet
    /// still goes (its sequence number is taken).
    fn transmit_gathered(
        &mut self,
        peer: NodeId,
        head: usize,
        gathered: Gathered,
    ) -> Result<(), TransmitError> {
        let packet = self.scratch.get(..head).unwrap_or(&[]);
        match self.hal.transmit_gathered(peer, packet, gathered.source) {
            Ok(()) => Ok(()),
            Err(GatherError::Transmit(error)) => Err(error),
            Err(GatherError::Memory(_)) => {
                match gathered.on_fault {
                    OnFault::FailPut(slot) => {
                        let port = gathered.source.port;
                        self.complete_operation(port, usize::from(slot), Status::MEMORY_FAULT, 0);
                    }
                    OnFault::Cancel => {}
                    OnFault::Refuse => return self.refuse_gathered_read(peer),
                }
                if let Some(bytes) = self.scratch.get_mut(..HEADER_LEN)
                    && let Ok(header) = PacketHeader::mut_from_bytes(bytes)
                {
                    header.kind = PacketKind::CANCELLED;
                    header.length = 0.into();
                }
                self.transmit_scratch(peer, HEADER_LEN)
            }
        }
    }

    /// Transmits the packet in `scratch[..len]` to `peer`, with its authentication code appended
    /// on an authenticated fabric ([`crate::auth`]) — under the key of the session with `peer`
    /// ([`crate::session`]) — unless the board's route to `peer` never leaves its memory
    /// ([`Hal::local_route`]). Without a session nothing goes out.
    pub(crate) fn transmit_scratch(
        &mut self,
        peer: NodeId,
        len: usize,
    ) -> Result<(), TransmitError> {
        if self.config.fabric_key.is_none() || self.hal.local_route(peer) {
            return self.transmit_sealed(peer, len, None);
        }
        let key = self
            .connection_index(peer)
            .and_then(|index| self.connections.get(index))
            .and_then(|connection| connection.session.bound)
            .map(|bound| bound.key);
        match key {
            Some(key) => self.transmit_sealed(peer, len, Some(key)),
            None => Ok(()),
        }
    }

    /// Transmits the packet in `scratch[..len]` to `peer`, tagged under `key` if one is given.
    pub(crate) fn transmit_sealed(
        &mut self,
        peer: NodeId,
        len: usize,
        key: Option<crate::auth::FabricKey>,
    ) -> Result<(), TransmitError> {
        let wire_len = match key {
            Some(key) => {
                let tag = key.tag(self.scratch.get(..len).unwrap_or(&[]));
                // The scratch buffer has room for the largest packet and its code.
                let Some(trailer) = self.scratch.get_mut(len..len + MAC_LEN) else {
                    return Err(TransmitError::NoRoute);
                };
                trailer.copy_from_slice(&tag);
                len + MAC_LEN
            }
            None => len,
        };
        let packet = self.scratch.get(..wire_len).unwrap_or(&[]);
        self.hal.transmit(peer, packet)
    }

    /// Sends the get's data packet in the scratch buffer, whose bytes the board could not read,
    /// as one with no data and the status `MEMORY_FAULT`.
    fn refuse_gathered_read(&mut self, peer: NodeId) -> Result<(), TransmitError> {
        if let Some(bytes) = self.scratch.get_mut(..HEADER_LEN)
            && let Ok(header) = PacketHeader::mut_from_bytes(bytes)
        {
            header.length = (RDMA_HEADER_LEN as u16).into();
        }
        if let Some(bytes) = self
            .scratch
            .get_mut(HEADER_LEN..HEADER_LEN + RDMA_HEADER_LEN)
            && let Ok(rdma) = RdmaHeader::mut_from_bytes(bytes)
        {
            rdma.status = Status::MEMORY_FAULT.0;
        }
        self.transmit_scratch(peer, HEADER_LEN + RDMA_HEADER_LEN)
    }

    /// Sends the connection's pending NACK, REJECTs and standalone ACK.
    fn transmit_control(&mut self, index: usize, now: Instant) -> bool {
        let node = self.node;
        let Some(connection) = self.connections.get_mut(index) else {
            return false;
        };
        let peer = connection.peer;
        let mut packets: heapless::Vec<PacketHeader, 10> = heapless::Vec::new();
        if let Some(epoch) = connection.nack_pending.take() {
            let mut header = PacketHeader::new(PacketKind::NACK, node, peer);
            header.ack = U32::new(if connection.rx_epoch == Some(epoch) {
                connection.expected.0
            } else {
                0
            });
            header.ack_epoch = U32::new(epoch);
            let _ = packets.push(header);
            connection.counters.nacks_sent += 1;
            connection.last_nack = Some(now);
            connection.ack_due = None;
        }
        while let Some((seq, reason, epoch, transmission)) = connection.rejects.pop_front() {
            let mut header = PacketHeader::new(PacketKind::REJECT, node, peer);
            header.seq = U32::new(seq.0);
            header.aux = reason.0;
            header.transmission = transmission;
            // The refused packet's epoch has a field of its own: the piggybacked ack below may be
            // of a newer epoch (we may have started following one since we queued this refusal),
            // and a sender that read the refusal as of that epoch would act on a stale one.
            header.epoch = U32::new(epoch);
            if let Some(rx_epoch) = connection.rx_epoch {
                header.flags |= PacketFlags::ACK_VALID;
                header.ack = U32::new(connection.expected.0);
                header.ack_epoch = U32::new(rx_epoch);
            }
            let _ = packets.push(header);
            connection.counters.rejects_sent += 1;
        }
        if connection.ack_due.is_some_and(|at| at <= now) {
            connection.ack_due = None;
            if let Some(epoch) = connection.rx_epoch {
                let mut header = PacketHeader::new(PacketKind::ACK, node, peer);
                header.flags |= PacketFlags::ACK_VALID;
                header.ack = U32::new(connection.expected.0);
                header.ack_epoch = U32::new(epoch);
                let _ = packets.push(header);
                connection.counters.acks_sent += 1;
            }
        }
        let busy = !packets.is_empty();
        for header in packets.iter() {
            if let Some(len) = header.emit(&[], &mut self.scratch) {
                // Control packets are unreliable by design: a lost one is sent again when the
                // condition recurs (the next packet, the next gap, the sender's retransmission).
                let _ = self.transmit_scratch(peer, len);
            }
        }
        busy
    }

    /// Retransmission timeouts and give-ups of every connection.
    pub(crate) fn run_connection_timers(&mut self, now: Instant) -> bool {
        let mut busy = false;
        // Room for every connection: a connection left due here would keep `poll_at` in the past.
        let mut failed: heapless::Vec<NodeId, C> = heapless::Vec::new();
        for connection in self.connections.iter_mut() {
            let Some(at) = connection.retransmit_at else {
                continue;
            };
            if at > now {
                continue;
            }
            busy = true;
            if connection.sent.is_empty() {
                connection.retransmit_at = None;
                connection.backoff = 0;
                continue;
            }
            if now.saturating_since(connection.last_progress) >= self.config.give_up_after {
                if failed.push(connection.peer).is_err() {
                    break;
                }
                continue;
            }
            if let Some(front) = connection.sent.front().map(|d| d.seq) {
                connection.go_back_to(front);
            }
            connection.backoff = (connection.backoff + 1).min(MAX_BACKOFF);
            let interval = self
                .config
                .retransmit_timeout
                .saturating_mul(1 << connection.backoff);
            connection.retransmit_at = Some(now.saturating_add(interval));
        }
        for peer in failed {
            self.give_up_on(peer, now);
        }
        busy
    }

    /// `peer` acknowledged nothing for the give-up time: every message in flight or queued to it
    /// fails with `TARGET_NODE_UNREACHABLE`, barriers that need it fail, and the connection starts
    /// a fresh epoch (so a peer that comes back gets a clean stream).
    fn give_up_on(&mut self, peer: NodeId, now: Instant) {
        let Some(index) = self.connection_index(peer) else {
            return;
        };
        self.epoch_counter = self.epoch_counter.wrapping_add(1);
        let epoch = self.epoch_counter;
        let mut lost: heapless::Vec<
            (u8, u8),
            { crate::connection::WINDOW + crate::connection::QUEUE },
        > = heapless::Vec::new();
        if let Some(connection) = self.connections.get_mut(index) {
            connection.counters.give_ups += 1;
            for body in connection
                .sent
                .iter()
                .map(|d| d.body)
                .chain(connection.queue.iter().copied())
                .chain(connection.parked.iter().map(|parked| parked.body))
            {
                if let Body::Data { port, slot, .. } = body {
                    let _ = lost.push((port, slot));
                }
            }
            connection.sent.clear();
            connection.queue.clear();
            connection.parked.clear();
            connection.retransmit_at = None;
            connection.backoff = 0;
            connection.next_seq = Seq(0);
            connection.tx_epoch = epoch;
            connection.tx_acked_in_epoch = false;
            connection.last_progress = now;
            // The session ends too: the next packet to the peer opens a new one.
            Self::end_session(connection);
        }
        for (port, slot) in lost {
            self.complete_send(
                usize::from(port),
                usize::from(slot),
                Status::TARGET_NODE_UNREACHABLE,
            );
        }
        self.give_up_messages(peer);
        for port in 0..PORTS_PER_NIC {
            self.fail_barrier_needing(port, peer, None, Status::TARGET_NODE_UNREACHABLE);
        }
        self.give_up_operations(peer);
    }

    /// Returns the held send token in `slot` of `port` to the host with `status`.
    pub(crate) fn complete_send(&mut self, port: usize, slot: usize, status: Status) {
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        let Some(held) = open.release(slot) else {
            return;
        };
        let event = Event {
            context: held.token.context,
            peer_node: held.token.target_node,
            peer_port: held.token.target_port,
            length: held.token.length,
            ..Self::event(EventKind::SENT, status)
        };
        self.emit(port, event);
    }
}

/// Whether the packet of `descriptor` asks its receiver to acknowledge it at once rather than after
/// the delay ([`crate::Config::ack_delay`]): a retransmission (the first ack was lost, or is late);
/// every quarter window's packet once the window is half full (acks then free room as fast as a
/// stream uses it, one per quarter window rather than one per packet); the last packet of a burst
/// of anything but barrier packets (a send's completion, a one-sided operation, a close waits on
/// its ack, and no packet of ours may follow to carry it). Barrier packets wait on no ack: the next
/// barrier's packets carry it.
fn wants_ack_now(connection: &Connection, descriptor: &Descriptor) -> bool {
    const EVERY: u32 = (WINDOW / 4) as u32;
    let filling = connection.sent.len() >= WINDOW / 2 && descriptor.seq.0 % EVERY == 0;
    if descriptor.transmissions > 0 || filling {
        return true;
    }
    if matches!(descriptor.body, Body::Barrier { .. }) {
        return false;
    }
    let more_to_send = !connection.queue.is_empty()
        || !connection.replies.is_empty()
        || connection
            .sent
            .iter()
            .any(|later| later.needs_transmit && descriptor.seq.precedes(later.seq));
    !more_to_send
}
