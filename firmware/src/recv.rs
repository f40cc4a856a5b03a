//! RECV: takes packets from the wire, runs the reliability protocol — acks free the sent list,
//! NACKs trigger go-back-N, REJECTs fail or delay one packet — and hands sequenced packets that
//! arrive in order to RDMA (data), the barrier engine (barrier packets) or the port table
//! (port-closed notices) (paper §4.1, §3.3).

use core::time::Duration;

use shared_abi::event::Status;
use shared_abi::packet::{Packet, PacketFlags, PacketHeader, PacketKind, RejectReason};

use crate::connection::{Body, flow_of};
use crate::seq::Seq;
use crate::time::Instant;
use crate::{Hal, Nic};

/// What authenticated a packet.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sealed {
    /// Nothing: a fabric without a key.
    None,
    /// Nothing: a route that never leaves the board ([`Hal::local_route`]).
    Local,
    /// The fabric key (handshakes only).
    Fabric,
    /// The key of the session with the packet's source.
    Session,
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Takes one packet from the wire. Anything that is not a well-formed packet for this node is
    /// counted and dropped; nothing a packet says can crash the NIC or reach a port it was not
    /// addressed to. Call [`Nic::poll`] afterwards to send the acks it caused.
    pub fn on_packet(&mut self, bytes: &[u8], now: Instant) {
        // Nothing of a packet is looked at before its authentication code is checked (but the
        // source node it names, which picks the session key to check it under).
        let Some(fabric) = self.config.fabric_key else {
            self.take_packet(bytes, now, Sealed::None);
            return;
        };
        let Some((packet, in_session)) = self.open_keyed(fabric, bytes, now) else {
            return;
        };
        let sealed = if in_session {
            Sealed::Session
        } else {
            Sealed::Fabric
        };
        self.take_packet(packet, now, sealed);
    }

    /// Takes one packet that came over a route that never left the board's memory
    /// ([`crate::Hal::local_route`]: sent by this NIC to itself, or by another NIC of the same
    /// emulator daemon), which carries no authentication code. Checked and parsed as any other
    /// packet after that; a board must never hand in bytes from its wire here.
    /// The segments of puts, gets' data and long messages may carry more here than on a wire
    /// ([`Hal::gathers_toward`]).
    pub fn on_local_packet(&mut self, bytes: &[u8], now: Instant) {
        self.take_packet(bytes, now, Sealed::Local);
    }

    fn take_packet(&mut self, bytes: &[u8], now: Instant, sealed: Sealed) {
        let checked = match sealed {
            Sealed::Local => Packet::new_checked_local(bytes),
            _ => Packet::new_checked(bytes),
        };
        let Ok(packet) = checked else {
            self.counters.malformed_packets += 1;
            return;
        };
        let header = *packet.header();
        if header.dst_node != self.node {
            self.counters.malformed_packets += 1;
            return;
        }
        match (sealed, header.kind) {
            (Sealed::Fabric, PacketKind::HELLO) => {
                self.take_hello(&header, packet.payload(), now);
                return;
            }
            // The fabric key alone authenticates only handshakes; a HELLO elsewhere is out of
            // place. Neither is taken.
            (Sealed::Fabric, _) | (_, PacketKind::HELLO) => {
                self.counters.unauthenticated += 1;
                return;
            }
            (Sealed::Session, _) => {
                // The session key is the connection's to the named node; a packet naming another
                // source under it is not one a key holder made.
                if self
                    .connection_index(header.src_node)
                    .and_then(|index| self.connections.get(index))
                    .is_none_or(|c| c.session.bound.is_none())
                {
                    self.counters.unauthenticated += 1;
                    return;
                }
            }
            (Sealed::None | Sealed::Local, _) => {}
        }
        let index = if header.kind.is_sequenced() {
            self.connection_for(header.src_node, now)
        } else {
            self.connection_index(header.src_node)
        };
        let Some(index) = index else {
            self.counters.no_connection += 1;
            if header.kind.is_sequenced() {
                // No room for the peer now: tell it we are alive but busy, so it holds the packet
                // and retries instead of taking our silence for death.
                self.send_stateless_reject(&header, RejectReason::BUSY);
            }
            return;
        };
        let mut silent_for = core::time::Duration::ZERO;
        if let Some(connection) = self.connections.get_mut(index) {
            silent_for = now.saturating_since(connection.last_heard);
            connection.last_heard = now;
        }
        if header.flags.contains(PacketFlags::ACK_VALID) || header.kind == PacketKind::ACK {
            self.handle_ack(index, Seq(header.ack.get()), header.ack_epoch.get(), now);
        }
        match header.kind {
            PacketKind::ACK => {}
            PacketKind::NACK => {
                self.handle_nack(index, Seq(header.ack.get()), header.ack_epoch.get(), now)
            }
            PacketKind::REJECT => self.handle_reject(index, &header, now),
            _ => self.handle_sequenced(index, &header, packet.payload(), silent_for, now),
        }
    }

    /// A cumulative ack: everything before `ack` arrived. Frees those descriptors and completes
    /// their send tokens.
    fn handle_ack(&mut self, index: usize, ack: Seq, epoch: u32, now: Instant) {
        // What the ack covers, in sequence order: one ack may cover a long message's last
        // segment and the message behind it, and their sends complete in that order.
        let mut acked: heapless::Vec<Acked, { crate::connection::WINDOW }> = heapless::Vec::new();
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        if epoch != connection.tx_epoch {
            return;
        }
        // An ack beyond what we sent is forged or stale; take only what it can cover.
        if connection.next_seq.precedes(ack) {
            return;
        }
        let mut progressed = false;
        while let Some(front) = connection.sent.front() {
            if !front.seq.precedes(ack) {
                break;
            }
            match front.body {
                Body::Data { port, slot, .. } => {
                    let _ = acked.push(Acked::Message { port, slot });
                }
                Body::DataSegment {
                    port,
                    slot,
                    serial,
                    segment,
                    ..
                } => {
                    let _ = acked.push(Acked::Segment {
                        port,
                        slot,
                        serial,
                        segment,
                    });
                }
                Body::Barrier {
                    port,
                    generation,
                    barrier,
                    failed: None,
                    ..
                } => {
                    let _ = acked.push(Acked::Barrier {
                        port,
                        generation,
                        barrier,
                    });
                }
                _ => {}
            }
            connection.sent.pop_front();
            progressed = true;
        }
        if progressed {
            connection.tx_acked_in_epoch = true;
            connection.counters.acks_received += 1;
            connection.last_progress = now;
            connection.backoff = 0;
            connection.retransmit_at = if connection.sent.is_empty() {
                None
            } else {
                Some(now.saturating_add(self.config.retransmit_timeout))
            };
        }
        // By reference: a slice's iterator, with no index to check (heapless's owning iterator
        // keeps a bounds check, and with it panic machinery, in the image).
        for acked in acked.iter() {
            match *acked {
                Acked::Message { port, slot } => {
                    self.complete_send(usize::from(port), usize::from(slot), Status::SUCCESS);
                }
                Acked::Segment {
                    port,
                    slot,
                    serial,
                    segment,
                } => self.segment_acknowledged(port, slot, serial, segment),
                Acked::Barrier {
                    port,
                    generation,
                    barrier,
                } => self.release_held(usize::from(port), generation, barrier),
            }
        }
    }

    /// The peer saw a gap and expects `expected` next: go back to it (once per gap and half a
    /// retransmission interval, however many NACKs the gap causes). A NACK for something before
    /// our oldest unacknowledged packet is stale (the ack that followed it already arrived).
    fn handle_nack(&mut self, index: usize, expected: Seq, epoch: u32, now: Instant) {
        let retransmit_timeout = self.config.retransmit_timeout;
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        connection.counters.nacks_received += 1;
        if epoch != connection.tx_epoch {
            return;
        }
        self.handle_ack(index, expected, epoch, now);
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        if connection.sent.front().map(|d| d.seq) != Some(expected) {
            return;
        }
        let recent = connection.last_go_back.is_some_and(|(seq, at)| {
            seq == expected && now.saturating_since(at) < retransmit_timeout / 2
        });
        if !recent {
            connection.go_back_to(expected);
            connection.last_go_back = Some((expected, now));
        }
    }

    /// The peer did not take packet `seq`. Port closed: a data message fails with
    /// `TARGET_PORT_CLOSED` and its slot is cancelled; a barrier packet is retried by its engine
    /// until the port opens or the barrier times out (paper §3.2). No buffer / busy: the packet is
    /// held and retried, and a data message gives up with `SEND_TIMED_OUT` in the end.
    fn handle_reject(&mut self, index: usize, header: &PacketHeader, now: Instant) {
        let reason = RejectReason(header.aux);
        let seq = Seq(header.seq.get());
        let config = self.config;
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        connection.counters.rejects_received += 1;
        // The peer spoke, so it is alive: the give-up clock restarts.
        connection.last_progress = now;
        if header.epoch.get() != connection.tx_epoch {
            return;
        }
        if reason == RejectReason::UNKNOWN_EPOCH {
            // The peer has no state for our epoch. If it never acknowledged anything of it, our
            // packets still carry SYN and it will start the epoch from one: just send again. If
            // it did acknowledge, it has since lost that state (it recycled the connection after a
            // silence longer than the give-up time, or restarted): it can never take a packet of
            // this epoch again, so a new epoch renumbers what is in flight without sending
            // anything twice to the state it has now.
            if !connection.tx_acked_in_epoch {
                if let Some(front) = connection.sent.front().map(|d| d.seq) {
                    connection.go_back_to(front);
                }
            } else if !connection.sent.is_empty() {
                self.epoch_counter = self.epoch_counter.wrapping_add(1);
                let epoch = self.epoch_counter;
                if let Some(connection) = self.connections.get_mut(index) {
                    connection.restart_epoch(epoch);
                }
            }
            return;
        }
        let Some(descriptor) = connection.sent.iter_mut().find(|d| d.seq == seq) else {
            return;
        };
        if descriptor.transmissions.wrapping_sub(1) as u8 != header.transmission {
            // A refusal of an earlier transmission (a duplicate, or overtaken by a later
            // transmission the receiver may have accepted): acting on it could send twice.
            return;
        }
        let mut failed_send = None;
        let mut failed_message = None;
        let mut withdrawn = None;
        let mut park = false;
        match (reason, descriptor.body) {
            (
                RejectReason::PORT_CLOSED | RejectReason::PORT_GONE | RejectReason::INCOMPLETE,
                Body::DataSegment {
                    port, slot, serial, ..
                },
            ) => {
                let status = if reason == RejectReason::INCOMPLETE {
                    Status::INCOMPLETE
                } else {
                    Status::TARGET_PORT_CLOSED
                };
                failed_message = Some((port, slot, serial, status));
                descriptor.body = Body::Cancelled;
            }
            (
                RejectReason::NO_BUFFER,
                Body::DataSegment {
                    port, slot, serial, ..
                },
            ) => {
                // As for a one-packet message: the receiver-not-ready clock runs from the first
                // refusal, across parkings; until it runs out the message's flow is parked.
                let since = self
                    .ports
                    .open_mut(usize::from(port))
                    .and_then(|open| open.held_send_mut(usize::from(slot)))
                    .filter(|held| held.serial == serial)
                    .map(|held| *held.refused_since.get_or_insert(now));
                if since.is_none_or(|since| {
                    now.saturating_since(since) >= config.receiver_not_ready_timeout
                }) {
                    failed_message = Some((port, slot, serial, Status::SEND_TIMED_OUT));
                    descriptor.body = Body::Cancelled;
                } else {
                    park = true;
                }
            }
            (
                _,
                Body::DataSegment {
                    port, slot, serial, ..
                },
            ) if now.saturating_since(descriptor.first_sent)
                >= config.receiver_not_ready_timeout =>
            {
                failed_message = Some((port, slot, serial, Status::SEND_TIMED_OUT));
                descriptor.body = Body::Cancelled;
            }
            (RejectReason::PORT_CLOSED, Body::Data { port, slot, .. }) => {
                failed_send = Some((port, slot, Status::TARGET_PORT_CLOSED));
                descriptor.body = Body::Cancelled;
            }
            (
                RejectReason::PORT_CLOSED | RejectReason::PORT_GONE,
                Body::Barrier {
                    port,
                    generation,
                    dst_port,
                    attempt,
                    barrier,
                    ..
                },
            ) => {
                // Withdrawn below, with every later packet of the same pair (paper §3.2).
                let gone = (reason == RejectReason::PORT_GONE).then_some(barrier);
                withdrawn = Some((port, generation, dst_port, attempt, gone));
            }
            (RejectReason::PORT_GONE, Body::Data { port, slot, .. }) => {
                failed_send = Some((port, slot, Status::TARGET_PORT_CLOSED));
                descriptor.body = Body::Cancelled;
            }
            (RejectReason::NO_BUFFER, Body::Data { port, slot, .. }) => {
                // The receiver-not-ready clock runs from the first refusal, across parkings.
                let since = self
                    .ports
                    .open_mut(usize::from(port))
                    .and_then(|open| open.held_send_mut(usize::from(slot)))
                    .map(|held| *held.refused_since.get_or_insert(now));
                if since.is_none_or(|since| {
                    now.saturating_since(since) >= config.receiver_not_ready_timeout
                }) {
                    failed_send = Some((port, slot, Status::SEND_TIMED_OUT));
                    descriptor.body = Body::Cancelled;
                } else {
                    park = true;
                }
            }
            (_, Body::Data { port, slot, .. })
                if now.saturating_since(descriptor.first_sent)
                    >= config.receiver_not_ready_timeout =>
            {
                failed_send = Some((port, slot, Status::SEND_TIMED_OUT));
                descriptor.body = Body::Cancelled;
            }
            (
                _,
                Body::Barrier { .. }
                | Body::Data { .. }
                | Body::DataSegment { .. }
                | Body::Put { .. }
                | Body::Get { .. }
                | Body::Atomic { .. },
            ) => {
                descriptor.not_before = Some(now.saturating_add(config.retry_interval));
            }
            // Notices and cancelled slots are never refused by a correct peer; send them again.
            _ => {}
        }
        if let Some((port, generation, dst_port, attempt, gone)) = withdrawn {
            // The target port is not open (yet). The receiver now refuses every barrier packet of
            // this attempt from our port to it, so take back this one and every later one of the
            // pair — sent or queued — and send them again, in order, under the next attempt when
            // the port may have opened. Nothing holds up the connection meanwhile.
            let pair = (usize::from(port), usize::from(dst_port.0));
            if let Some(current) = connection
                .barrier_attempts
                .get_mut(pair.0)
                .and_then(|row| row.get_mut(pair.1))
                && *current == attempt
            {
                *current = current.wrapping_add(1);
            }
            let same = |body: &Body| matches!(body, Body::Barrier { port: p, dst_port: d, .. } if *p == port && *d == dst_port);
            // A port gone for good takes none of its job's packets again; others wait for it to
            // open (a new owner of another job).
            let retried = |barrier: shared_abi::ids::BarrierId| {
                gone.is_none_or(|gone| gone.job != barrier.job)
            };
            let mut packets: heapless::Vec<
                (
                    shared_abi::ids::BarrierId,
                    u8,
                    Option<crate::record::Failed>,
                ),
                { crate::connection::WINDOW + crate::connection::QUEUE },
            > = heapless::Vec::new();
            for descriptor in connection.sent.iter_mut() {
                if !descriptor.seq.precedes(seq)
                    && same(&descriptor.body)
                    && let Body::Barrier {
                        round,
                        barrier,
                        failed,
                        ..
                    } = descriptor.body
                {
                    if retried(barrier) {
                        let _ = packets.push((barrier, round, failed));
                    }
                    descriptor.body = Body::Cancelled;
                }
            }
            for _ in 0..connection.queue.len() {
                if let Some(body) = connection.queue.pop_front() {
                    match body {
                        Body::Barrier {
                            round,
                            barrier,
                            failed,
                            ..
                        } if same(&body) => {
                            if retried(barrier) {
                                let _ = packets.push((barrier, round, failed));
                            }
                        }
                        other => {
                            let _ = connection.queue.push_back(other);
                        }
                    }
                }
            }
            connection.go_back_to(seq);
            let peer = connection.peer;
            self.barrier_sends_refused(
                usize::from(port),
                generation,
                peer,
                dst_port,
                &packets,
                now,
            );
            if let Some(gone) = gone {
                self.barrier_target_gone(usize::from(port), gone, peer, dst_port);
            }
            return;
        }
        if park {
            let refused = connection
                .sent
                .iter()
                .find(|d| d.seq == seq)
                .map(|d| d.body);
            // The flow moves to its next attempt (the receiver now refuses the old one's copies).
            if let Some((port, dst_port, priority)) = refused.as_ref().and_then(flow_of)
                && let Some(cell) = connection
                    .data_attempts
                    .get_mut(usize::from(port))
                    .and_then(|row| row.get_mut(usize::from(dst_port.0)))
            {
                cell[usize::from(priority & 1)] = cell[usize::from(priority & 1)].wrapping_add(1);
            }
            // The port's long message still being fed (there is at most one, and it is the
            // port's last data: its later tokens wait for it) parks as one entry, its feeder
            // rewound.
            let feeding = refused.as_ref().and_then(flow_of).and_then(|(port, _, _)| {
                let open = self.ports.open(usize::from(port))?;
                open.held_sends_by_slot().find_map(|(slot, held)| {
                    (held.is_feeding() && held.token.target_node == connection.peer)
                        .then_some((slot as u8, held.serial))
                })
            });
            // Out of the stream until the receiver may have a buffer, with the rest of its flow,
            // so that nothing else waits behind it; in place if there is no room to park.
            if connection.park_flow(seq, now.saturating_add(config.retry_interval), feeding) {
                if let Some((port, _, _)) = refused.as_ref().and_then(flow_of)
                    && let Some((slot, serial)) = feeding
                    && let Some(segment) = connection.parked_segment(port, slot, serial)
                    && let Some(held) = self
                        .ports
                        .open_mut(usize::from(port))
                        .and_then(|open| open.held_send_mut(usize::from(slot)))
                        .filter(|held| held.serial == serial)
                {
                    // Its feeder resumes after the parked segment once that is queued again.
                    held.queued_segments = segment.saturating_add(1);
                }
            } else {
                if let Some(descriptor) = connection.sent.iter_mut().find(|d| d.seq == seq) {
                    descriptor.not_before = Some(now.saturating_add(config.retry_interval));
                }
                connection.go_back_to(seq);
            }
            return;
        }
        // The peer dropped everything after the refused packet too: go back to it.
        connection.go_back_to(seq);
        if let Some((port, slot, status)) = failed_send {
            self.complete_send(usize::from(port), usize::from(slot), status);
        }
        if let Some((port, slot, serial, status)) = failed_message {
            self.fail_message(index, port, slot, serial, status);
        }
    }

    /// A sequenced packet (data, barrier, port closed, cancelled).
    ///
    /// Epochs: the peer starts a stream at sequence zero with SYN, in an epoch it never used
    /// before (a new connection, or after giving up on us). We adopt a SYN's epoch only if it is
    /// newer than the one we follow — so a delayed duplicate of an old epoch's first packet can
    /// never rewind the stream and deliver twice — or if the peer was silent for longer than the
    /// give-up time (it may have restarted with an unrelated epoch). A mid-stream packet of an
    /// epoch we do not follow is dropped without a word: the sender's retransmission timer brings
    /// the stream's start again, and a NACK here could be delayed into a later epoch and mislead.
    fn handle_sequenced(
        &mut self,
        index: usize,
        header: &PacketHeader,
        payload: &[u8],
        silent_for: core::time::Duration,
        now: Instant,
    ) {
        let give_up = self.config.give_up_after;
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        let seq = Seq(header.seq.get());
        let epoch = header.epoch.get();
        let mut new_epoch = false;
        if connection.rx_epoch != Some(epoch) {
            let newer = connection
                .rx_epoch
                .is_none_or(|current| Seq(current).precedes(Seq(epoch)));
            // Within a session the peer's epochs only move forward (a new incarnation of the peer
            // comes with a new session, whose receive state starts empty), so an old epoch's SYN
            // is never taken, however long the peer was silent.
            let silent_restart = !connection.session.keyed && silent_for > give_up;
            if header.flags.contains(PacketFlags::SYN) && (newer || silent_restart) {
                connection.rx_epoch = Some(epoch);
                connection.expected = Seq(0);
                connection.refused_closed = None;
                connection.data_refused =
                    [[[None; 2]; shared_abi::ids::PORTS_PER_NIC]; shared_abi::ids::PORTS_PER_NIC];
                new_epoch = true;
            } else {
                connection.counters.drops += 1;
                let queued = connection
                    .rejects
                    .iter()
                    .any(|(s, _, e, _)| *s == seq && *e == epoch);
                if connection.rx_epoch.is_none() && !queued {
                    // We hold no receive state at all (we restarted, or recycled the connection
                    // after a long silence): say so, and the sender resends its SYN or starts a
                    // new epoch (see `handle_reject`).
                    let _ = connection.rejects.push_back((
                        seq,
                        RejectReason::UNKNOWN_EPOCH,
                        epoch,
                        header.transmission,
                    ));
                }
                return;
            }
        }
        if new_epoch {
            // The peer starts over: the long messages it was sending us are gone with its old
            // stream.
            self.abandon_assemblies(index);
        }
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        if seq.precedes(connection.expected) {
            // A duplicate: we have it. Ack again at once, in case our ack was lost: the sender
            // is retransmitting.
            connection.counters.drops += 1;
            connection.owe_ack(now);
            return;
        }
        if seq != connection.expected {
            // A gap: something before this was lost. Go-back-N: drop this and ask for the gap,
            // at most once per half retransmission interval.
            connection.counters.drops += 1;
            let recent = connection
                .last_nack
                .is_some_and(|at| now.saturating_since(at) < self.config.retransmit_timeout / 2);
            if !recent {
                connection.nack_pending = Some(epoch);
            }
            return;
        }
        let peer = connection.peer;
        let is_data = matches!(header.kind, PacketKind::DATA | PacketKind::DATA_SEGMENT);
        let refused_before = connection.refused_closed == Some(seq) && is_data;
        let flow = (
            usize::from(header.src_port.0),
            usize::from(header.dst_port.0),
            usize::from(header.priority & 1),
        );
        // A long message's segments belong to its flow as a one-packet message does: a copy of
        // an attempt we refused is refused again.
        let refused_no_buffer = is_data
            && connection
                .data_refused
                .get(flow.0)
                .and_then(|row| row.get(flow.1))
                .and_then(|cell| cell[flow.2])
                .is_some_and(|refused| (header.attempt.wrapping_sub(refused) as i8) <= 0);
        let outcome = if refused_before {
            Err(RejectReason::PORT_CLOSED)
        } else if refused_no_buffer {
            Err(RejectReason::NO_BUFFER)
        } else {
            match header.kind {
                PacketKind::DATA => self.deliver_data(peer, header, payload),
                PacketKind::DATA_SEGMENT => self.deliver_segment(index, peer, header, payload),
                PacketKind::BARRIER => {
                    self.receive_barrier_packet(index, peer, header, payload, now)
                }
                PacketKind::PORT_CLOSED => {
                    // A long message its port was sending will not go on.
                    self.abandon_assembly(peer, index, usize::from(header.src_port.0));
                    self.peer_port_closed(
                        peer,
                        usize::from(header.src_port.0),
                        header.src_generation,
                    );
                    Ok(())
                }
                kind if kind.is_rdma() => self.receive_rdma(index, header, payload, now),
                _ => Ok(()),
            }
        };
        let Some(connection) = self.connections.get_mut(index) else {
            return;
        };
        match outcome {
            Ok(()) => {
                connection.refused_closed = None;
                connection.expected = connection.expected.next();
                connection.counters.received += 1;
                // The sender asks for the ack at once when something waits on it (the last
                // packet of a burst of messages, a half-full window); else it may wait for a
                // packet of ours to ride on.
                let delay = if header.flags.contains(PacketFlags::ACK_REQUEST) {
                    Duration::ZERO
                } else {
                    self.config.ack_delay()
                };
                connection.owe_ack(now.saturating_add(delay));
            }
            Err(reason) => {
                if reason == RejectReason::PORT_CLOSED && is_data {
                    connection.refused_closed = Some(seq);
                }
                if reason == RejectReason::NO_BUFFER
                    && is_data
                    && !refused_no_buffer
                    && let Some(cell) = connection
                        .data_refused
                        .get_mut(flow.0)
                        .and_then(|row| row.get_mut(flow.1))
                {
                    cell[flow.2] = Some(header.attempt);
                }
                if !connection.rejects.iter().any(|(s, _, _, _)| *s == seq) {
                    let _ = connection
                        .rejects
                        .push_back((seq, reason, epoch, header.transmission));
                }
            }
        }
    }
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Answers a sequenced packet we hold no connection for with a REJECT that needs no state.
    fn send_stateless_reject(&mut self, header: &PacketHeader, reason: RejectReason) {
        let mut reject = PacketHeader::new(
            shared_abi::packet::PacketKind::REJECT,
            self.node,
            header.src_node,
        );
        reject.seq = header.seq;
        reject.aux = reason.0;
        reject.transmission = header.transmission;
        reject.epoch = header.epoch;
        if let Some(len) = reject.emit(&[], &mut self.scratch) {
            let _ = self.transmit_scratch(header.src_node, len);
        }
    }
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// An in-order barrier packet: refused if an earlier attempt of its (source port, destination
    /// port) pair was refused and this one is not newer; else recorded for its port.
    fn receive_barrier_packet(
        &mut self,
        index: usize,
        peer: shared_abi::ids::NodeId,
        header: &PacketHeader,
        payload: &[u8],
        now: Instant,
    ) -> Result<(), RejectReason> {
        // The packet's checks made the payload one identity and at most a broadcast's bytes;
        // anything else is refused like a protocol violation (never reached).
        let (body, data): (shared_abi::packet::BarrierPayload, _) =
            zerocopy::FromBytes::read_from_prefix(payload).map_err(|_| RejectReason::BUSY)?;
        if data.len() > shared_abi::packet::BROADCAST_MAX {
            return Err(RejectReason::BUSY);
        }
        let pair = (
            usize::from(header.src_port.0),
            usize::from(header.dst_port.0),
        );
        let refused = self
            .connections
            .get(index)
            .and_then(|c| c.barrier_refused.get(pair.0))
            .and_then(|row| row.get(pair.1))
            .copied()
            .flatten();
        if let Some(refused) = refused
            && (header.attempt.wrapping_sub(refused) as i8) <= 0
        {
            return Err(RejectReason::PORT_CLOSED);
        }
        let outcome = self.deliver_barrier_packet(peer, header, &body, data, now);
        if let Some(slot) = self
            .connections
            .get_mut(index)
            .and_then(|c| c.barrier_refused.get_mut(pair.0))
            .and_then(|row| row.get_mut(pair.1))
        {
            match outcome {
                Ok(()) => *slot = None,
                Err(RejectReason::PORT_CLOSED | RejectReason::PORT_GONE) => {
                    *slot = Some(header.attempt);
                }
                Err(_) => {}
            }
        }
        outcome
    }
}

/// A packet of a send that an ack covered.
#[derive(Clone, Copy)]
enum Acked {
    /// A message of one packet: its send is complete.
    Message { port: u8, slot: u8 },
    /// A segment of a message longer than a packet (its send completes with its last one).
    Segment {
        port: u8,
        slot: u8,
        serial: u32,
        segment: u32,
    },
    /// A packet of a barrier of `port` (incarnation `generation`): what the port holds for a
    /// reduction or a broadcast may go.
    Barrier {
        port: u8,
        generation: shared_abi::ids::Generation,
        barrier: shared_abi::ids::BarrierId,
    },
}
