//! One-sided operations: puts (GM's `gm_put` and directed sends), gets and NIC atomics on the
//! registered memory of remote ports ([`crate::memory`]).
//!
//! Every packet of them is sequenced on the connection, like data and barrier packets, so
//! exactly-once comes from the sequence layer: a duplicate request, segment or reply is dropped by
//! its sequence number before anything looks at it, and a request is applied when — and only
//! when — it is accepted in order. The initiator's side:
//!
//! - A **put** is cut into segments of [`RDMA_SEGMENT`] bytes, fed to the connection's queue as
//!   room appears; each is read from the process's memory when its packet is built (again at a
//!   retransmission), so no copy is kept beyond the window. The target writes each segment into
//!   its process's memory as it takes it, and answers the last one with a reply: the put's SENT
//!   event means the data is in the target's memory (remote completion).
//! - A **get** sends one request; the target streams the data back in segments on its own
//!   sequence toward us, read from its process's memory as each packet is built, and the last one
//!   completes the get (the data is in our memory).
//! - An **atomic** sends one request; the target NIC applies it to the word (one at a time: the
//!   NIC serialises them) and replies with the word's previous value.
//!
//! Every refusal — a wrong key, a range outside the region, a port that did not allow remote
//! access, a closed port, a misaligned word — is decided before the target's memory is touched,
//! and comes back in the reply as the status of the initiator's SENT event.
//!
//! Flow control: an initiator has at most [`RDMA_OPS`] operations outstanding toward one node, and
//! the target keeps room for that many replies and get streams per connection, so taking a
//! request never waits for the target's own stream (which could wait for ours).
//!
//! Ordering: a port's operations and messages toward a node start in the order it posted them
//! (a token waits in the send ring while a put before it is still being fed), and their packets
//! are applied at the target in that order; completions of operations to different nodes may come
//! in any order.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::{HEADER_LEN, PacketHeader, PacketKind, RejectReason};
use shared_abi::rdma::{
    AtomicOp, LOCAL_RDMA_SEGMENT, RDMA_HEADER_LEN, RDMA_SEGMENT, RdmaFlags, RdmaHeader,
    RemotePointer,
};
use shared_abi::token::{SendKind, SendToken};
use zerocopy::FromBytes;
use zerocopy::IntoBytes;

use crate::connection::{Body, RDMA_OPS, ReadStream, Reply};
use crate::hal::{Gather, GatherFrom};
use crate::port::{Disposition, HeldSend, OpenPort, Operation};
use crate::send::{Built, Gathered, OnFault};
use crate::time::Instant;
use crate::{Hal, Nic};

/// How many packets a put of `length` bytes takes in segments of `segment_len` bytes.
fn segments_for(length: u32, segment_len: usize) -> u32 {
    (length as usize).div_ceil(segment_len).max(1) as u32
}

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Takes a put, get or atomic token from `port`'s send ring.
    pub(crate) fn take_rdma_token(
        &mut self,
        port: usize,
        token: &SendToken,
        now: Instant,
    ) -> Disposition {
        if token.target_port.index().is_none() {
            return Disposition::Reject(Status::INVALID_TOKEN);
        }
        let remote = RemotePointer::from_u64(token.remote.get());
        let length = token.length.get();
        let remote_length = if token.kind == SendKind::ATOMIC {
            8
        } else {
            u64::from(length)
        };
        // A put keeps the segments it starts with to its end.
        let segment_len = self.segment_len_toward(token.target_node);
        let (local_length, segments) = match token.kind {
            SendKind::ATOMIC => {
                if !token.op.is_known() {
                    return Disposition::Reject(Status::INVALID_TOKEN);
                }
                if remote.offset % 8 != 0 {
                    return Disposition::Reject(Status::MISALIGNED);
                }
                (if token.buffer.get() == 0 { 0 } else { 8 }, 1)
            }
            SendKind::GET => (u64::from(length), 1),
            _ => (u64::from(length), segments_for(length, segment_len)),
        };
        if remote.add(remote_length).is_none() {
            return Disposition::Reject(Status::OUT_OF_BOUNDS);
        }
        let Some(open) = self.ports.open(port) else {
            return Disposition::Wait;
        };
        if local_length > 0 && !open.memory.covers(token.buffer.get(), local_length) {
            return Disposition::Reject(Status::NOT_REGISTERED);
        }
        if self.port_is_feeding(port) || self.outstanding_to(token.target_node) >= RDMA_OPS {
            return Disposition::Wait;
        }
        let Some(open) = self.ports.open(port) else {
            return Disposition::Wait;
        };
        let Some(slot) = open.free_send_slot() else {
            return Disposition::Wait;
        };
        let generation = open.generation;
        let Some(index) = self.connection_for(token.target_node, now) else {
            return Disposition::Wait;
        };
        self.operation_serial = self.operation_serial.wrapping_add(1);
        let operation = self.operation_serial;
        let (port_byte, slot_byte) = (port as u8, slot as u8);
        let dst_port = token.target_port;
        let body = match token.kind {
            SendKind::GET => Body::Get {
                port: port_byte,
                slot: slot_byte,
                generation,
                dst_port,
                operation,
            },
            SendKind::ATOMIC => Body::Atomic {
                port: port_byte,
                slot: slot_byte,
                generation,
                dst_port,
                operation,
            },
            _ => Body::Put {
                port: port_byte,
                slot: slot_byte,
                generation,
                dst_port,
                operation,
                segment: 0,
            },
        };
        let Some(connection) = self.connections.get_mut(index) else {
            return Disposition::Wait;
        };
        if connection.queue.push_back(body).is_err() {
            return Disposition::Wait;
        }
        if let Some(open) = self.ports.open_mut(port) {
            open.hold(slot, HeldSend::new(*token, 0));
            open.start_operation(
                slot,
                Operation {
                    serial: operation,
                    segments,
                    segment_len: segment_len as u32,
                    queued: 1,
                    last_activity: now,
                },
            );
        }
        Disposition::Taken
    }

    /// Data bytes per packet of a put toward `node`, or of a get's data: as long as a NIC the
    /// board gathers for takes ([`Hal::gathers_toward`]), else a wire packet's.
    fn segment_len_toward(&self, node: NodeId) -> usize {
        if self.gathers_toward(node) {
            LOCAL_RDMA_SEGMENT
        } else {
            RDMA_SEGMENT
        }
    }

    /// Whether `port` holds a put or a long message not yet wholly queued: its later tokens wait
    /// for it, so a port's operations and messages start in the order it posted them (and the
    /// segments of a long message follow one another with nothing of the port between them).
    pub(crate) fn port_is_feeding(&self, port: usize) -> bool {
        self.ports.open(port).is_some_and(|open| {
            open.operations_by_slot()
                .any(|(_, operation)| operation.queued < operation.segments)
                || open.held_sends_by_slot().any(|(_, held)| held.is_feeding())
        })
    }

    /// One-sided operations of every local port outstanding toward `node`.
    fn outstanding_to(&self, node: NodeId) -> usize {
        self.ports
            .open_ports()
            .map(|open| {
                open.operations_by_slot()
                    .filter(|(slot, _)| {
                        open.held_send(*slot)
                            .is_some_and(|held| held.token.target_node == node)
                    })
                    .count()
            })
            .sum()
    }

    /// Queues what one-sided operations have ready as the connections have room: the next
    /// segments of puts, and the data of gets this NIC serves. Returns whether it queued any.
    pub(crate) fn feed_operations(&mut self, now: Instant) -> bool {
        let mut busy = false;
        for port in crate::ports_of(self.open_ports) {
            let Some(slots) = self.ports.open(port).map(OpenPort::operation_slots) else {
                continue;
            };
            for slot in slots.iter() {
                let Some(open) = self.ports.open(port) else {
                    break;
                };
                let (Some(operation), Some(held)) = (open.operation(slot), open.held_send(slot))
                else {
                    continue;
                };
                if operation.queued >= operation.segments {
                    continue;
                }
                let (operation, token, generation) = (*operation, held.token, open.generation);
                let Some(index) = self.connection_for(token.target_node, now) else {
                    continue;
                };
                let Some(connection) = self.connections.get_mut(index) else {
                    continue;
                };
                let mut queued = operation.queued;
                while queued < operation.segments && !connection.queue.is_full() {
                    let _ = connection.queue.push_back(Body::Put {
                        port: port as u8,
                        slot: slot as u8,
                        generation,
                        dst_port: token.target_port,
                        operation: operation.serial,
                        segment: queued,
                    });
                    queued += 1;
                }
                if queued != operation.queued
                    && let Some(state) = self
                        .ports
                        .open_mut(port)
                        .and_then(|open| open.operation_mut(slot))
                {
                    state.queued = queued;
                    state.last_activity = now;
                    busy = true;
                }
            }
        }
        for index in 0..self.connections.len() {
            let Some(connection) = self.connections.get_mut(index) else {
                break;
            };
            while !connection.queue.is_full() {
                let Some(stream) = connection.reads.front_mut() else {
                    break;
                };
                let segment = *stream;
                if segment.is_last() {
                    connection.reads.pop_front();
                } else {
                    stream.position = stream.position.saturating_add(stream.segment_len);
                }
                let _ = connection.queue.push_back(Body::ReadData(segment));
                busy = true;
            }
        }
        busy
    }

    /// Fails operations that made no progress for the give-up time plus the receiver-not-ready
    /// time (their answer was lost with a connection that gave up, or the target never took
    /// them). Returns whether any failed.
    pub(crate) fn run_operation_timers(&mut self, now: Instant) -> bool {
        let limit = self.operation_limit();
        let mut busy = false;
        for port in crate::ports_of(self.open_ports) {
            let Some(slots) = self.ports.open(port).map(OpenPort::operation_slots) else {
                continue;
            };
            for slot in slots.iter() {
                let expired = self
                    .ports
                    .open(port)
                    .and_then(|open| open.operation(slot).copied())
                    .is_some_and(|op| now.saturating_since(op.last_activity) >= limit);
                if expired {
                    self.complete_operation(port, slot, Status::SEND_TIMED_OUT, 0);
                    busy = true;
                }
            }
        }
        busy
    }

    /// When the oldest operation times out, if any is held.
    pub(crate) fn operation_deadline(&self) -> Option<Instant> {
        let limit = self.operation_limit();
        self.ports
            .open_ports()
            .flat_map(OpenPort::operations_by_slot)
            .map(|(_, op)| op.last_activity.saturating_add(limit))
            .min()
    }

    fn operation_limit(&self) -> core::time::Duration {
        self.config
            .give_up_after
            .saturating_add(self.config.receiver_not_ready_timeout)
    }

    /// The connection to `peer` gave up: its operations fail with `TARGET_NODE_UNREACHABLE`, and
    /// what we owed it (replies, get data) is forgotten.
    pub(crate) fn give_up_operations(&mut self, peer: NodeId) {
        if let Some(connection) = self
            .connection_index(peer)
            .and_then(|index| self.connections.get_mut(index))
        {
            connection.replies.clear();
            connection.reads.clear();
        }
        for port in 0..PORTS_PER_NIC {
            let Some(slots) = self.ports.open(port).map(OpenPort::operation_slots) else {
                continue;
            };
            for slot in slots.iter() {
                let toward_peer = self
                    .ports
                    .open(port)
                    .filter(|open| open.operation(slot).is_some())
                    .and_then(|open| open.held_send(slot).copied())
                    .is_some_and(|held| held.token.target_node == peer);
                if toward_peer {
                    self.complete_operation(port, slot, Status::TARGET_NODE_UNREACHABLE, 0);
                }
            }
        }
    }

    /// Ends the operation in `slot` of `port`: its SENT event carries `status` and, for an
    /// atomic, the word's previous `value` (in `buffer`).
    pub(crate) fn complete_operation(
        &mut self,
        port: usize,
        slot: usize,
        status: Status,
        value: u64,
    ) {
        let Some(open) = self.ports.open_mut(port) else {
            return;
        };
        open.end_operation(slot);
        let Some(held) = open.release(slot) else {
            return;
        };
        let event = Event {
            context: held.token.context,
            peer_node: held.token.target_node,
            peer_port: held.token.target_port,
            length: held.token.length,
            buffer: value.into(),
            detail: u32::from(held.token.kind.0).into(),
            ..Self::event(EventKind::SENT, status)
        };
        self.emit(port, event);
    }

    /// The operation held in `slot` of `port` if it is number `serial` (and the port is of
    /// `generation`, when given).
    fn held_operation(
        &self,
        port: usize,
        slot: usize,
        serial: u32,
        generation: Option<Generation>,
    ) -> Option<(SendToken, Operation)> {
        let open = self.ports.open(port)?;
        if generation.is_some_and(|g| g != open.generation) {
            return None;
        }
        let operation = *open.operation(slot)?;
        let held = *open.held_send(slot)?;
        (operation.serial == serial).then_some((held.token, operation))
    }

    /// Builds the payload of a one-sided packet for `body` into the scratch buffer after the
    /// packet header, filling in `header`'s kind and ports; returns the payload's length. A
    /// body whose operation is gone (completed, or its port closed) leaves the header a
    /// cancelled slot with no payload.
    pub(crate) fn build_rdma(&mut self, header: &mut PacketHeader, body: Body) -> Built {
        let mut rdma = RdmaHeader::default();
        let mut data_len = 0usize;
        let mut gather = None;
        match body {
            Body::Put {
                port,
                slot,
                generation,
                dst_port,
                operation,
                segment,
            } => {
                let (port, slot) = (usize::from(port), usize::from(slot));
                let Some((token, state)) =
                    self.held_operation(port, slot, operation, Some(generation))
                else {
                    return Built::NOTHING;
                };
                let remote = RemotePointer::from_u64(token.remote.get());
                let length = token.length.get();
                let position = segment.saturating_mul(state.segment_len);
                data_len =
                    (length.saturating_sub(position) as usize).min(state.segment_len as usize);
                let start = HEADER_LEN + RDMA_HEADER_LEN;
                // The rest of the put is read in order after this segment: a board may read
                // it ahead.
                let own = own_operation(operation);
                let address = token.buffer.get().saturating_add(u64::from(position));
                let ahead = length.saturating_sub(position) as usize;
                if state.segment_len as usize > RDMA_SEGMENT {
                    // Longer than the scratch buffer holds: the board reads it as it sends.
                    let from = GatherFrom::Process {
                        operation: own,
                        address,
                        ahead,
                    };
                    gather = Some(Gathered {
                        source: Gather {
                            port,
                            len: data_len,
                            from,
                        },
                        on_fault: OnFault::FailPut(slot as u8),
                    });
                } else {
                    let read = match self.scratch.get_mut(start..start + data_len) {
                        Some(out) => self
                            .hal
                            .read_process_memory_ahead(port, own, address, out, ahead),
                        None => Err(crate::hal::MemoryFault::Refused),
                    };
                    if read.is_err() {
                        self.complete_operation(port, slot, Status::MEMORY_FAULT, 0);
                        return Built::NOTHING;
                    }
                }
                header.kind = PacketKind::RDMA_WRITE;
                header.src_port = PortId(port as u8);
                header.dst_port = dst_port;
                header.src_generation = generation;
                rdma.key = remote.key.into();
                rdma.offset = u64::from(remote.offset).into();
                rdma.length = length.into();
                rdma.position = position.into();
                rdma.slot = slot as u8;
                rdma.operation = operation.into();
                if segment.saturating_add(1) >= state.segments {
                    rdma.flags = RdmaFlags::LAST;
                }
            }
            Body::Get {
                port,
                slot,
                generation,
                dst_port,
                operation,
            }
            | Body::Atomic {
                port,
                slot,
                generation,
                dst_port,
                operation,
            } => {
                let (port, slot) = (usize::from(port), usize::from(slot));
                let Some((token, _)) = self.held_operation(port, slot, operation, Some(generation))
                else {
                    return Built::NOTHING;
                };
                let remote = RemotePointer::from_u64(token.remote.get());
                header.kind = if matches!(body, Body::Get { .. }) {
                    PacketKind::RDMA_READ
                } else {
                    PacketKind::ATOMIC
                };
                header.src_port = PortId(port as u8);
                header.dst_port = dst_port;
                header.src_generation = generation;
                rdma.key = remote.key.into();
                rdma.offset = u64::from(remote.offset).into();
                rdma.length = if header.kind == PacketKind::ATOMIC {
                    8.into()
                } else {
                    token.length
                };
                rdma.slot = slot as u8;
                rdma.operation = operation.into();
                rdma.value = token.operand;
                rdma.compare = token.compare;
                rdma.op = token.op;
            }
            Body::ReadData(segment) => {
                let port = usize::from(segment.port);
                data_len = segment.bytes();
                let start = HEADER_LEN + RDMA_HEADER_LEN;
                let status = match self.resolve(
                    PortId(segment.port),
                    segment.key,
                    u64::from(segment.offset),
                    u64::from(segment.length),
                    Some(segment.generation),
                ) {
                    Ok((_, address)) => {
                        let address = address.saturating_add(u64::from(segment.position));
                        // The rest of the get is read in order after this segment.
                        let ahead = segment.length.saturating_sub(segment.position) as usize;
                        let operation =
                            peer_operation(header.dst_node, segment.dst_port, segment.operation);
                        if data_len > RDMA_SEGMENT {
                            // Longer than the scratch buffer holds: the board reads it as it
                            // sends, and a fault answers the get as a read here would.
                            gather = Some(Gathered {
                                source: Gather {
                                    port,
                                    len: data_len,
                                    from: GatherFrom::Process {
                                        operation,
                                        address,
                                        ahead,
                                    },
                                },
                                on_fault: OnFault::Refuse,
                            });
                            Status::SUCCESS
                        } else {
                            match self.scratch.get_mut(start..start + data_len) {
                                Some(out) => match self
                                    .hal
                                    .read_process_memory_ahead(port, operation, address, out, ahead)
                                {
                                    Ok(()) => Status::SUCCESS,
                                    Err(_) => Status::MEMORY_FAULT,
                                },
                                None => Status::MEMORY_FAULT,
                            }
                        }
                    }
                    Err(status) => status,
                };
                if status != Status::SUCCESS {
                    data_len = 0;
                }
                header.kind = PacketKind::RDMA_READ_DATA;
                header.src_port = PortId(segment.port);
                header.dst_port = segment.dst_port;
                rdma.slot = segment.slot;
                rdma.operation = segment.operation.into();
                rdma.length = segment.length.into();
                rdma.position = segment.position.into();
                rdma.status = status.0;
                if segment.is_last() {
                    rdma.flags = RdmaFlags::LAST;
                }
            }
            Body::Reply(reply) => {
                header.kind = PacketKind::RDMA_REPLY;
                header.src_port = PortId(reply.port);
                header.dst_port = reply.dst_port;
                rdma.slot = reply.slot;
                rdma.operation = reply.operation.into();
                rdma.status = reply.status.0;
                rdma.value = reply.value.into();
                rdma.flags = RdmaFlags::LAST;
            }
            _ => return Built::NOTHING,
        }
        if let Some(out) = self
            .scratch
            .get_mut(HEADER_LEN..HEADER_LEN + RDMA_HEADER_LEN)
        {
            out.copy_from_slice(rdma.as_bytes());
        }
        Built {
            payload_len: RDMA_HEADER_LEN + data_len,
            gather,
        }
    }

    /// The local port `port` and the process address of `length` bytes at `offset` into its
    /// region `key`, for a remote access: the port must be open (and of `generation`, when
    /// given, and not closing), and its table must allow the access.
    fn resolve(
        &self,
        port: PortId,
        key: u32,
        offset: u64,
        length: u64,
        generation: Option<Generation>,
    ) -> Result<(usize, u64), Status> {
        let index = port.index().ok_or(Status::TARGET_PORT_CLOSED)?;
        let open = self
            .ports
            .open(index)
            .filter(|open| open.closing.is_none() && open.faulted.is_none())
            .filter(|open| generation.is_none_or(|g| g == open.generation))
            .ok_or(Status::TARGET_PORT_CLOSED)?;
        open.memory
            .remote(key, offset, length)
            .map(|address| (index, address))
    }

    /// An in-order one-sided packet from `peer` on connection `index`.
    ///
    /// # Errors
    /// [`RejectReason::BUSY`] when a request cannot be answered now (a peer over its
    /// [`RDMA_OPS`]): it is not applied, and the peer sends it again.
    pub(crate) fn receive_rdma(
        &mut self,
        index: usize,
        header: &PacketHeader,
        payload: &[u8],
        now: Instant,
    ) -> Result<(), RejectReason> {
        let Ok((rdma, data)) = RdmaHeader::read_from_prefix(payload) else {
            // Authenticated but malformed: a peer's bug. Take the slot, apply nothing.
            self.counters.malformed_packets += 1;
            return Ok(());
        };
        match header.kind {
            PacketKind::RDMA_WRITE => self.receive_put(index, header, &rdma, data),
            PacketKind::RDMA_READ => self.receive_get(index, header, &rdma),
            PacketKind::ATOMIC => self.receive_atomic(index, header, &rdma),
            PacketKind::RDMA_READ_DATA => {
                self.receive_read_data(header, &rdma, data, now);
                Ok(())
            }
            _ => {
                self.receive_reply(header, &rdma);
                Ok(())
            }
        }
    }

    fn reply_room(&self, index: usize) -> bool {
        self.connections
            .get(index)
            .is_some_and(|connection| !connection.replies.is_full())
    }

    fn queue_reply(
        &mut self,
        index: usize,
        header: &PacketHeader,
        rdma: &RdmaHeader,
        status: Status,
        value: u64,
    ) {
        let reply = Reply {
            port: header.dst_port.0,
            dst_port: header.src_port,
            slot: rdma.slot,
            operation: rdma.operation.get(),
            status,
            value,
        };
        if let Some(connection) = self.connections.get_mut(index) {
            // Room was checked before the request was applied.
            let _ = connection.replies.push_back(Body::Reply(reply));
        }
    }

    fn receive_put(
        &mut self,
        index: usize,
        header: &PacketHeader,
        rdma: &RdmaHeader,
        data: &[u8],
    ) -> Result<(), RejectReason> {
        let last = rdma.flags.contains(RdmaFlags::LAST);
        if last && !self.reply_room(index) {
            return Err(RejectReason::BUSY);
        }
        let position = u64::from(rdma.position.get());
        let length = u64::from(rdma.length.get());
        let status = if position.saturating_add(data.len() as u64) > length {
            Status::OUT_OF_BOUNDS
        } else {
            match self.resolve(
                header.dst_port,
                rdma.key.get(),
                rdma.offset.get(),
                length,
                None,
            ) {
                Ok((port, address)) => {
                    let operation =
                        peer_operation(header.src_node, header.src_port, rdma.operation.get());
                    match self.hal.write_process_memory_part(
                        port,
                        operation,
                        address.saturating_add(position),
                        data,
                        last,
                    ) {
                        Ok(()) => Status::SUCCESS,
                        Err(_) => Status::MEMORY_FAULT,
                    }
                }
                Err(status) => status,
            }
        };
        let operation = (header.src_port.0, rdma.operation.get());
        let Some(connection) = self.connections.get_mut(index) else {
            return Ok(());
        };
        // One reply per put, at its last segment: the first failure of an earlier segment of
        // the same put is remembered for it.
        let mut status = status;
        if let Some((failed, first)) = connection.failed_put {
            if failed == operation {
                if status == Status::SUCCESS {
                    status = first;
                }
                if last {
                    connection.failed_put = None;
                }
            }
        }
        if !last {
            if status != Status::SUCCESS
                && connection.failed_put.is_none_or(|(f, _)| f != operation)
            {
                connection.failed_put = Some((operation, status));
            }
            return Ok(());
        }
        self.queue_reply(index, header, rdma, status, 0);
        Ok(())
    }

    fn receive_get(
        &mut self,
        index: usize,
        header: &PacketHeader,
        rdma: &RdmaHeader,
    ) -> Result<(), RejectReason> {
        let reads_full = self
            .connections
            .get(index)
            .is_none_or(|connection| connection.reads.is_full());
        if reads_full || !self.reply_room(index) {
            return Err(RejectReason::BUSY);
        }
        let length = rdma.length.get();
        let offset = rdma.offset.get();
        match self.resolve(
            header.dst_port,
            rdma.key.get(),
            offset,
            u64::from(length),
            None,
        ) {
            Ok((port, _)) => {
                let generation = self
                    .ports
                    .open(port)
                    .map_or(Generation::new(0), |open| open.generation);
                let stream = ReadStream {
                    port: port as u8,
                    generation,
                    dst_port: header.src_port,
                    slot: rdma.slot,
                    operation: rdma.operation.get(),
                    key: rdma.key.get(),
                    // In range: `resolve` checked offset + length against a region of at most
                    // 4 GiB.
                    offset: offset as u32,
                    length,
                    position: 0,
                    segment_len: self.segment_len_toward(header.src_node) as u32,
                };
                if let Some(connection) = self.connections.get_mut(index) {
                    let _ = connection.reads.push_back(stream);
                }
            }
            Err(status) => self.queue_reply(index, header, rdma, status, 0),
        }
        Ok(())
    }

    fn receive_atomic(
        &mut self,
        index: usize,
        header: &PacketHeader,
        rdma: &RdmaHeader,
    ) -> Result<(), RejectReason> {
        if !self.reply_room(index) {
            return Err(RejectReason::BUSY);
        }
        let (status, old) =
            match self.resolve(header.dst_port, rdma.key.get(), rdma.offset.get(), 8, None) {
                Err(status) => (status, 0),
                Ok((_, address)) if address % 8 != 0 || !rdma.op.is_known() => {
                    (Status::MISALIGNED, 0)
                }
                Ok((port, address)) => self.apply_atomic(port, address, rdma),
            };
        self.queue_reply(index, header, rdma, status, old);
        Ok(())
    }

    /// Applies an atomic to the word at `address` of `port`'s process; returns its status and
    /// the word's previous value. One NIC thread applies them, one at a time.
    fn apply_atomic(&mut self, port: usize, address: u64, rdma: &RdmaHeader) -> (Status, u64) {
        let mut word = [0u8; 8];
        if self
            .hal
            .read_process_memory(port, address, &mut word)
            .is_err()
        {
            return (Status::MEMORY_FAULT, 0);
        }
        let old = u64::from_le_bytes(word);
        let Some(new) = AtomicOp::apply(rdma.op, old, rdma.value.get(), rdma.compare.get()) else {
            return (Status::MISALIGNED, 0);
        };
        if new != old
            && self
                .hal
                .write_process_memory(port, address, &new.to_le_bytes())
                .is_err()
        {
            return (Status::MEMORY_FAULT, 0);
        }
        (Status::SUCCESS, old)
    }

    /// Data of one of our gets.
    fn receive_read_data(
        &mut self,
        header: &PacketHeader,
        rdma: &RdmaHeader,
        data: &[u8],
        now: Instant,
    ) {
        let Some(port) = header.dst_port.index() else {
            return;
        };
        let slot = usize::from(rdma.slot);
        let Some((token, _)) = self.held_operation(port, slot, rdma.operation.get(), None) else {
            return;
        };
        if token.kind != SendKind::GET {
            return;
        }
        let status = Status(rdma.status);
        if status != Status::SUCCESS {
            self.complete_operation(port, slot, status, 0);
            return;
        }
        let position = u64::from(rdma.position.get());
        if position.saturating_add(data.len() as u64) > u64::from(token.length.get()) {
            self.complete_operation(port, slot, Status::OUT_OF_BOUNDS, 0);
            return;
        }
        let address = token.buffer.get().saturating_add(position);
        // Written at once, never held for the next segment: a get can end in failure at any
        // moment (its target's refusal, a timer, a closed connection), and its process may use
        // the buffer again as soon as it reads that; no byte may land after.
        if !data.is_empty() && self.hal.write_process_memory(port, address, data).is_err() {
            self.complete_operation(port, slot, Status::MEMORY_FAULT, 0);
            return;
        }
        if rdma.flags.contains(RdmaFlags::LAST) {
            self.complete_operation(port, slot, Status::SUCCESS, 0);
        } else if let Some(state) = self
            .ports
            .open_mut(port)
            .and_then(|open| open.operation_mut(slot))
        {
            state.last_activity = now;
        }
    }

    /// The end of one of our puts or atomics, or the refusal of one of our operations.
    fn receive_reply(&mut self, header: &PacketHeader, rdma: &RdmaHeader) {
        let Some(port) = header.dst_port.index() else {
            return;
        };
        let slot = usize::from(rdma.slot);
        let Some((token, _)) = self.held_operation(port, slot, rdma.operation.get(), None) else {
            return;
        };
        let mut status = Status(rdma.status);
        let value = rdma.value.get();
        if status == Status::SUCCESS
            && token.kind == SendKind::ATOMIC
            && token.buffer.get() != 0
            && self
                .hal
                .write_process_memory(port, token.buffer.get(), &value.to_le_bytes())
                .is_err()
        {
            status = Status::MEMORY_FAULT;
        }
        self.complete_operation(port, slot, status, value);
    }
}

/// The name of one of this NIC's own one-sided operations (its serial) for the board's
/// read-ahead ([`crate::Hal::read_process_memory_ahead`]).
fn own_operation(serial: u32) -> u64 {
    1 << 63 | u64::from(serial)
}

/// The name of a peer's one-sided operation (its node, port and serial there) for the board's
/// read-ahead and write-behind ([`crate::Hal::write_process_memory_part`]); never one of
/// [`own_operation`]'s.
fn peer_operation(node: NodeId, port: PortId, serial: u32) -> u64 {
    u64::from(node.get()) << 40 | u64::from(port.0) << 32 | u64::from(serial)
}
