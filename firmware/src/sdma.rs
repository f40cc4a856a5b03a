//! SDMA: takes send tokens from the ports' send rings, checks them, and queues their packets on
//! the connection to the target node (paper §4.1). The payload itself is pulled from host memory
//! when the packet is built for the wire (see [`crate::send`]), so a retransmission reads it again
//! from the buffer the token still owns instead of keeping a copy in NIC memory.

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{PORTS_PER_NIC, PortId};
use shared_abi::packet::{DATA_SEGMENT, LOCAL_DATA_SEGMENT};
use shared_abi::token::{SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, MTU_PAYLOAD, max_length_for_size};

use crate::connection::{Body, Parked};
use crate::port::{Disposition, HeldSend};
use crate::time::Instant;
use crate::{Hal, Nic};

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Takes the send tokens waiting in `port`'s send ring while the NIC has room for them.
    pub(crate) fn poll_send_ring(&mut self, port: usize, now: Instant) -> bool {
        let mut busy = false;
        loop {
            let Some(open) = self.ports.open(port) else {
                return busy;
            };
            if !open.can_take_token() {
                return busy;
            }
            let Some(memory) = self.hal.port_memory(port) else {
                return busy;
            };
            let token = match open.send_ring.peek(memory) {
                Ok(Some(token)) => token,
                Ok(None) => return busy,
                Err(_) => {
                    self.ring_corrupt(port);
                    return true;
                }
            };
            let disposition = match token.kind {
                SendKind::DATA => self.take_data_token(port, &token, now),
                kind if kind.is_barrier() => self.take_barrier_token(port, &token, now),
                kind if kind.is_rdma() => self.take_rdma_token(port, &token, now),
                _ => Disposition::Reject(Status::INVALID_TOKEN),
            };
            match disposition {
                Disposition::Wait => return busy,
                Disposition::Taken => {}
                Disposition::Reject(status) => {
                    self.counters.tokens_rejected += 1;
                    let event = Event {
                        context: token.context,
                        detail: u32::from(token.kind.0).into(),
                        ..Self::event(EventKind::TOKEN_REJECTED, status)
                    };
                    self.emit(port, event);
                }
            }
            busy = true;
            let Some(memory) = self.hal.port_memory(port) else {
                return busy;
            };
            if let Some(open) = self.ports.open_mut(port) {
                let _ = open.send_ring.skip(memory);
            }
        }
    }

    /// The host broke one of its rings' indexes: tell it (on the event ring, if that still works),
    /// skip what it published, and carry on. Its neighbours are untouched.
    pub(crate) fn ring_corrupt(&mut self, port: usize) {
        self.counters.tokens_rejected += 1;
        self.emit(
            port,
            Self::event(EventKind::TOKEN_REJECTED, Status::RING_CORRUPT),
        );
        let Some(memory) = self.hal.port_memory(port) else {
            return;
        };
        if let Some(open) = self.ports.open_mut(port) {
            let _ = open.send_ring.resynchronise(memory);
            let _ = open.receive_ring.resynchronise(memory);
        }
    }

    fn take_data_token(&mut self, port: usize, token: &SendToken, now: Instant) -> Disposition {
        let length = token.length.get();
        if !token.priority.is_valid() || !(3..=MAX_SIZE_CLASS).contains(&token.size) {
            return Disposition::Reject(Status::INVALID_TOKEN);
        }
        if length > max_length_for_size(token.size) {
            return Disposition::Reject(Status::TOO_LONG);
        }
        if token.target_port.index().is_none() {
            return Disposition::Reject(Status::INVALID_TOKEN);
        }
        let Some(open) = self.ports.open(port) else {
            return Disposition::Wait;
        };
        let Some(payload_offset) = open.layout.arena_range(token.buffer.get(), length as usize)
        else {
            return Disposition::Reject(Status::BAD_BUFFER);
        };
        let Some(slot) = open.free_send_slot() else {
            return Disposition::Wait;
        };
        let generation = open.generation;
        if self.port_is_feeding(port) {
            // A put posted before this message is still being cut into packets: keep the
            // port's order.
            return Disposition::Wait;
        }
        let Some(connection) = self.connection_for(token.target_node, now) else {
            return Disposition::Wait;
        };
        if length as usize > MTU_PAYLOAD {
            // A message longer than a packet: its segments are fed to the connection as room
            // appears ([`Nic::feed_messages`]), each read from the arena when it is built.
            self.operation_serial = self.operation_serial.wrapping_add(1);
            let serial = self.operation_serial;
            // Toward a NIC the board gathers for, in segments as long as that route takes.
            let segment_len = if self.gathers_toward(token.target_node) {
                LOCAL_DATA_SEGMENT
            } else {
                DATA_SEGMENT
            };
            let first = Body::DataSegment {
                port: port as u8,
                slot: slot as u8,
                generation,
                dst_port: token.target_port,
                priority: token.priority.0,
                serial,
                segment: 0,
            };
            let Some(connection) = self.connections.get_mut(connection) else {
                return Disposition::Wait;
            };
            // Behind its flow's parked messages, as a one-packet message waits (its feeder
            // waits with it).
            let queued = match connection.parked_until(&first) {
                Some(at) => connection
                    .parked
                    .push_back(Parked { body: first, at })
                    .is_ok(),
                None => connection.queue.push_back(first).is_ok(),
            };
            if !queued {
                return Disposition::Wait;
            }
            if let Some(open) = self.ports.open_mut(port) {
                open.hold(
                    slot,
                    HeldSend {
                        serial,
                        queued_segments: 1,
                        segment_len: segment_len as u32,
                        ..HeldSend::new(*token, payload_offset)
                    },
                );
            }
            return Disposition::Taken;
        }
        let body = Body::Data {
            port: port as u8,
            slot: slot as u8,
            generation,
            dst_port: token.target_port,
            priority: token.priority.0,
            size: token.size,
            length: length as u16,
        };
        let Some(connection) = self.connections.get_mut(connection) else {
            return Disposition::Wait;
        };
        // A message of a flow whose earlier message waits for a receive buffer waits behind it
        // (messages between two ports at one priority stay in order).
        let queued = match connection.parked_until(&body) {
            Some(at) => connection.parked.push_back(Parked { body, at }).is_ok(),
            None => connection.queue.push_back(body).is_ok(),
        };
        if !queued {
            return Disposition::Wait;
        }
        if let Some(open) = self.ports.open_mut(port) {
            open.hold(slot, HeldSend::new(*token, payload_offset));
        }
        Disposition::Taken
    }

    fn take_barrier_token(&mut self, port: usize, token: &SendToken, now: Instant) -> Disposition {
        let no_buffer = self
            .ports
            .open(port)
            .is_some_and(|open| open.barrier_buffers == 0);
        if no_buffer {
            // The host provides the barrier buffer before it posts the token, so a buffer
            // published before the token is visible now (the acquire that showed us the token
            // orders it) even if it was not when we read the receive ring this poll: read it again
            // rather than refuse the barrier for a race.
            self.poll_receive_ring(port);
        }
        match self.start_barrier(port, token, now) {
            Ok(()) => Disposition::Taken,
            Err(status) => Disposition::Reject(status),
        }
    }

    /// Queues a barrier packet of `round` of `barrier` from `port` to `(node, dst_port)`. Returns `false` if
    /// there is no room now (the engine tries again on the next poll).
    pub(crate) fn queue_barrier_packet(
        &mut self,
        port: usize,
        node: shared_abi::ids::NodeId,
        dst_port: PortId,
        (barrier, failed): (shared_abi::ids::BarrierId, Option<crate::record::Failed>),
        round: u8,
        now: Instant,
    ) -> bool {
        let Some(generation) = self.ports.open(port).map(|o| o.generation) else {
            return false;
        };
        let Some(index) = self.connection_for(node, now) else {
            return false;
        };
        let Some(connection) = self.connections.get_mut(index) else {
            return false;
        };
        let attempt = connection
            .barrier_attempts
            .get(port)
            .and_then(|row| row.get(usize::from(dst_port.0)))
            .copied()
            .unwrap_or(0);
        connection
            .queue
            .push_back(Body::Barrier {
                port: port as u8,
                generation,
                dst_port,
                barrier,
                failed,
                round,
                attempt,
            })
            .is_ok()
    }
}

const _: () = assert!(
    PORTS_PER_NIC <= 8,
    "ports are bits of a u8 in the barrier engine"
);
