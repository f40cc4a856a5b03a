//! RDMA: takes receive tokens from the ports' receive rings, moves received messages into the
//! host buffers they name (matching size and priority, as GM does), and reports them with events
//! (paper §4.1).

use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::NodeId;
use shared_abi::max_length_for_size;
use shared_abi::packet::{PacketHeader, RejectReason};
use shared_abi::ring::SharedMemory;
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken};

use crate::port::BARRIER_BUFFERS;
use crate::{Hal, Nic};

/// `detail` bit marking a refused token as a receive token.
const RECEIVE_TOKEN_DETAIL: u32 = 0x100;

impl<H: Hal, const C: usize> Nic<H, C> {
    /// Takes the receive tokens waiting in `port`'s receive ring while the port has room for them.
    pub(crate) fn poll_receive_ring(&mut self, port: usize) -> bool {
        let mut busy = false;
        loop {
            // A closed port costs this test, not a look at the board's memory.
            let Some(open) = self.ports.open_mut(port) else {
                return busy;
            };
            let Some(memory) = self.hal.port_memory(port) else {
                return busy;
            };
            if !open.can_take_token() {
                return busy;
            }
            let token = match open.receive_ring.peek(memory) {
                Ok(Some(token)) => token,
                Ok(None) => return busy,
                Err(_) => {
                    self.ring_corrupt(port);
                    return true;
                }
            };
            let verdict = check_receive_token(&token, &open.layout);
            let taken = match (verdict, token.kind) {
                (Ok(()), ReceiveKind::BUFFER) => open.receive_buffers.push(token).is_ok(),
                (Ok(()), _) if open.barrier_buffers < BARRIER_BUFFERS => {
                    open.barrier_buffers += 1;
                    true
                }
                (Ok(()), _) => false,
                (Err(_), _) => true,
            };
            if !taken {
                return busy;
            }
            let _ = open.receive_ring.skip(memory);
            busy = true;
            if let Err(status) = verdict {
                self.counters.tokens_rejected += 1;
                let event = Event {
                    buffer: token.buffer,
                    tag: token.tag,
                    detail: (RECEIVE_TOKEN_DETAIL | u32::from(token.kind.0)).into(),
                    ..Self::event(EventKind::TOKEN_REJECTED, status)
                };
                self.emit(port, event);
            }
        }
    }

    /// Delivers an in-order data packet into a buffer of its destination port.
    ///
    /// # Errors
    /// The [`RejectReason`] to send back: the port is closed, or has no buffer of the message's
    /// size and priority (the sender holds the message and retries).
    pub(crate) fn deliver_data(
        &mut self,
        peer: NodeId,
        header: &PacketHeader,
        payload: &[u8],
    ) -> Result<(), RejectReason> {
        let Some(port) = header.dst_port.index() else {
            return Err(RejectReason::PORT_CLOSED);
        };
        let Some(memory) = self.hal.port_memory(port) else {
            return Err(RejectReason::PORT_CLOSED);
        };
        let Some(open) = self.ports.open_mut(port) else {
            return Err(RejectReason::PORT_CLOSED);
        };
        let priority = Priority(header.priority);
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
        let length = payload.len().min(max_length_for_size(buffer.size) as usize);
        let written = open
            .layout
            .arena_range(buffer.buffer.get(), length)
            .map(|offset| memory.write(offset, payload.get(..length).unwrap_or(&[])));
        let status = if matches!(written, Some(Ok(()))) {
            Status::SUCCESS
        } else {
            Status::BAD_BUFFER
        };
        let event = Event {
            priority,
            size: buffer.size,
            peer_node: peer,
            peer_port: header.src_port,
            length: (length as u32).into(),
            tag: buffer.tag,
            buffer: buffer.buffer,
            ..Self::event(EventKind::RECEIVED, status)
        };
        self.counters.messages_delivered += 1;
        self.emit(port, event);
        Ok(())
    }
}

/// Checks a receive token against the port's arena.
fn check_receive_token(
    token: &ReceiveToken,
    layout: &shared_abi::region::RegionLayout,
) -> Result<(), Status> {
    match token.kind {
        ReceiveKind::BUFFER => {
            let length = max_length_for_size(token.size);
            if !(3..=shared_abi::MAX_SIZE_CLASS).contains(&token.size) || !token.priority.is_valid()
            {
                return Err(Status::INVALID_TOKEN);
            }
            layout
                .arena_range(token.buffer.get(), length as usize)
                .map(|_| ())
                .ok_or(Status::BAD_BUFFER)
        }
        ReceiveKind::BARRIER => Ok(()),
        _ => Err(Status::INVALID_TOKEN),
    }
}
