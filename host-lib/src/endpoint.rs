//! The buffer-owning layer over a [`RawPort`]: sends and receive buffers as [`DmaBuffer`]s that
//! the port holds while the NIC uses them, and raw events turned into [`Event`]s that hand them
//! back. Below the barrier code and [`crate::Port`], which add barriers and waiting.
//!
//! The send token context space is this layer's: a send's token context names the slot (and a
//! serial number) of its record here, and the caller's own context stays in the record.

use std::collections::HashMap;
use std::time::Duration;

use shared_abi::event::EventKind;
use shared_abi::ids::{NodeId, PortId};
use shared_abi::schedule::Step;
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, max_length_for_size};
use zerocopy::IntoBytes;

use crate::dma::{BufferError, DmaBuffer};
use crate::error::Error;
use crate::event::Event;
use crate::port::kept::Keeping;
use crate::raw::{self, RawEvent, RawPort};

/// A send the NIC holds: its buffer and the caller's context.
#[derive(Debug)]
struct PendingSend {
    buffer: DmaBuffer,
    context: u64,
    serial: u32,
}

/// A one-sided operation the NIC holds: the caller's context and where it goes.
#[derive(Debug)]
struct PendingOperation {
    context: u64,
    kind: SendKind,
    node: NodeId,
    port: PortId,
}

/// Token contexts of one-sided operations have this bit set (sends and barriers never do: their
/// contexts are a slot and a 32-bit serial).
const OPERATION_CONTEXT: u64 = 1 << 63;

/// The NIC-based barrier's tokens: what the port has given the NIC for barriers.
#[derive(Debug, Default)]
pub(crate) struct BarrierTokens {
    /// Barrier send tokens the NIC holds (posted, not yet ended or refused).
    pub(crate) in_flight: u32,
    /// Barrier buffers provided and not yet used by a barrier's end.
    pub(crate) buffers: u32,
    /// A schedule buffer back from the NIC, for the next barrier.
    spare_schedule: Option<DmaBuffer>,
}

impl BarrierTokens {
    /// Keeps `schedule` for the next barrier if it is the longest one back.
    fn recycle(&mut self, schedule: DmaBuffer) {
        if self
            .spare_schedule
            .as_ref()
            .is_none_or(|spare| spare.len() < schedule.len())
        {
            self.spare_schedule = Some(schedule);
        }
    }
}

/// A raw port with the buffers it holds for the NIC.
#[derive(Debug)]
pub(crate) struct Endpoint {
    raw: RawPort,
    sends: Vec<Option<PendingSend>>,
    free_send_slots: Vec<u32>,
    next_serial: u32,
    provided: HashMap<u64, DmaBuffer>,
    pub(crate) barrier_tokens: BarrierTokens,
    operations: HashMap<u64, PendingOperation>,
    next_operation: u64,
}

/// The smallest size class: buffers of 8 bytes, holding messages of 0 bytes.
const MIN_SIZE_CLASS: u8 = 3;

/// The token's `timeout_us`: 0 for the NIC's default, else at least 1 µs.
pub(crate) fn timeout_us(timeout: Option<Duration>) -> u32 {
    timeout.map_or(0, |timeout| {
        u32::try_from(timeout.as_micros())
            .unwrap_or(u32::MAX)
            .max(1)
    })
}

impl Endpoint {
    pub(crate) fn new(raw: RawPort) -> Self {
        Self {
            raw,
            sends: Vec::new(),
            free_send_slots: Vec::new(),
            next_serial: 0,
            provided: HashMap::new(),
            barrier_tokens: BarrierTokens::default(),
            operations: HashMap::new(),
            next_operation: 0,
        }
    }

    pub(crate) fn raw(&self) -> &RawPort {
        &self.raw
    }

    pub(crate) fn raw_mut(&mut self) -> &mut RawPort {
        &mut self.raw
    }

    /// See [`crate::Port::dma_alloc`].
    pub(crate) fn dma_alloc(&self, len: usize) -> Result<DmaBuffer, Error> {
        self.raw.dma_alloc(len)
    }

    /// See [`crate::Port::provide_receive_buffer`].
    pub(crate) fn provide_receive_buffer(
        &mut self,
        buffer: DmaBuffer,
        size: u8,
        priority: Priority,
        tag: u32,
    ) -> Result<(), BufferError> {
        let needed = max_length_for_size(size) as usize;
        let refused = |error, buffer| Err(BufferError { error, buffer });
        if !buffer.belongs_to(self.raw.region()) {
            return refused(Error::ForeignBuffer, buffer);
        }
        if !(MIN_SIZE_CLASS..=MAX_SIZE_CLASS).contains(&size) || !priority.is_valid() {
            return refused(Error::InvalidSize { size }, buffer);
        }
        if buffer.len() < needed {
            let length = buffer.len();
            return refused(Error::BufferTooSmall { length, needed }, buffer);
        }
        let token = ReceiveToken {
            kind: ReceiveKind::BUFFER,
            priority,
            size,
            tag: tag.into(),
            buffer: buffer.arena_offset().into(),
            ..ReceiveToken::default()
        };
        if let Err(error) = self.raw.post_receive(&token) {
            return refused(error, buffer);
        }
        self.provided.insert(buffer.arena_offset(), buffer);
        Ok(())
    }

    /// See [`crate::Port::send`].
    #[allow(
        clippy::too_many_arguments,
        reason = "the shape of GM's gm_send_with_callback"
    )]
    pub(crate) fn send(
        &mut self,
        buffer: DmaBuffer,
        len: usize,
        size: u8,
        priority: Priority,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), BufferError> {
        let refused = |error, buffer| Err(BufferError { error, buffer });
        if !buffer.belongs_to(self.raw.region()) {
            return refused(Error::ForeignBuffer, buffer);
        }
        let max = max_length_for_size(size) as usize;
        if !(MIN_SIZE_CLASS..=MAX_SIZE_CLASS).contains(&size) || !priority.is_valid() {
            return refused(Error::InvalidSize { size }, buffer);
        }
        if len > max.min(buffer.len()) {
            let max = max.min(buffer.len());
            return refused(Error::TooLong { length: len, max }, buffer);
        }
        if port.index().is_none() {
            return refused(Error::NoSuchPort { port: port.0 }, buffer);
        }
        let token = SendToken {
            kind: SendKind::DATA,
            priority,
            size,
            target_node: node,
            target_port: port,
            length: (len as u32).into(),
            buffer: buffer.arena_offset().into(),
            ..SendToken::default()
        };
        self.push_send_token(token, buffer, context)
    }

    /// Provides the receive token one barrier's end uses (paper §5.2,
    /// `gm_provide_barrier_buffer`), ringing a sleeping NIC: a barrier already posted may be
    /// waiting for it.
    pub(crate) fn provide_barrier_buffer(&mut self) -> Result<(), Error> {
        self.raw.post_receive(&barrier_buffer())?;
        self.barrier_tokens.buffers += 1;
        Ok(())
    }

    /// [`Endpoint::provide_barrier_buffer`] ahead of the barrier token that will use it, without
    /// ringing the NIC: that token's post rings it if it sleeps
    /// ([`RawPort::post_receive_unrung`]).
    pub(crate) fn provide_barrier_buffer_ahead(&mut self) -> Result<(), Error> {
        self.raw.post_receive_unrung(&barrier_buffer())?;
        self.barrier_tokens.buffers += 1;
        Ok(())
    }

    /// Writes `steps` into a schedule buffer of the arena and posts the barrier send token for
    /// it (paper §5.2, `gm_barrier_send_with_callback`); the buffer is held like a send's until
    /// the barrier's end (or refusal) event.
    ///
    /// `carried`: the barrier is a broadcast from its root (`SendKind::BROADCAST`; at the root
    /// the bytes follow the schedule in the same buffer), or a reduction (`SendKind::REDUCE`;
    /// this member's value follows the schedule).
    ///
    /// `keeping`: the steps are posted and not kept, posted and kept, or kept already (then
    /// only what they carry is written, and the token names the slot).
    pub(crate) fn barrier_send(
        &mut self,
        (steps, keeping): (&[Step], Keeping),
        context: u64,
        timeout: Option<Duration>,
        barrier: shared_abi::ids::BarrierId,
        carried: Option<&crate::port::barriers::Carried>,
    ) -> Result<(), Error> {
        use crate::port::barriers::Carried;
        let bytes = if keeping.posts_steps() {
            steps.as_bytes()
        } else {
            &[]
        };
        let data = match carried {
            Some(Carried::Broadcast(_, data) | Carried::Reduce(_, data)) => data.as_slice(),
            None => &[][..],
        };
        let needed = bytes.len() + data.len();
        let mut schedule = match self.barrier_tokens.spare_schedule.take() {
            Some(spare) if spare.len() >= needed => spare,
            spare => {
                self.barrier_tokens.spare_schedule = spare;
                // Room for a broadcast's bytes too, so the buffer serves either.
                self.dma_alloc(bytes.len() + shared_abi::packet::BROADCAST_MAX)?
            }
        };
        schedule[..bytes.len()].copy_from_slice(bytes);
        schedule[bytes.len()..needed].copy_from_slice(data);
        let mut token = SendToken {
            kind: SendKind::BARRIER,
            schedule: keeping.source,
            length: u32::try_from(steps.len()).unwrap_or(u32::MAX).into(),
            buffer: schedule.arena_offset().into(),
            timeout_us: timeout_us(timeout).into(),
            compare: keeping.tag.into(),
            ..SendToken::default()
        }
        .with_barrier_id(barrier);
        match carried {
            Some(Carried::Broadcast(root, data)) => {
                token.kind = SendKind::BROADCAST;
                token.target_node = root.node;
                token.target_port = root.port;
                token.size = u8::try_from(data.len()).unwrap_or(u8::MAX);
            }
            Some(Carried::Reduce(spec, data)) => {
                token.set_reduce_spec(*spec);
                token.size = u8::try_from(data.len()).unwrap_or(u8::MAX);
            }
            None => {}
        }
        match self.push_send_token(token, schedule, context) {
            Ok(()) => {
                self.barrier_tokens.in_flight += 1;
                Ok(())
            }
            Err(refused) => {
                self.barrier_tokens.recycle(refused.buffer);
                Err(refused.error)
            }
        }
    }

    /// Writes `token` into the send ring, holding `buffer` and `context` until its event; the
    /// token's context becomes the slot that names them.
    fn push_send_token(
        &mut self,
        mut token: SendToken,
        buffer: DmaBuffer,
        context: u64,
    ) -> Result<(), BufferError> {
        if self.raw.send_tokens() == 0 {
            return Err(BufferError {
                error: Error::NoSendTokens,
                buffer,
            });
        }
        let slot = match self.free_send_slots.pop() {
            Some(slot) => slot,
            None => {
                self.sends.push(None);
                (self.sends.len() - 1) as u32
            }
        };
        self.next_serial = self.next_serial.wrapping_add(1);
        let serial = self.next_serial;
        token.context = (u64::from(serial) << 32 | u64::from(slot)).into();
        if let Err(error) = self.raw.post_send(&token) {
            self.free_send_slots.push(slot);
            return Err(BufferError { error, buffer });
        }
        self.sends[slot as usize] = Some(PendingSend {
            buffer,
            context,
            serial,
        });
        Ok(())
    }

    /// Posts a put, get or atomic token as built, naming it by a context of this layer; its
    /// SENT (or refusal) event comes back as [`Event::OperationDone`] with `context`.
    pub(crate) fn post_operation(
        &mut self,
        mut token: SendToken,
        context: u64,
    ) -> Result<(), Error> {
        self.next_operation = self.next_operation.wrapping_add(1);
        let id = OPERATION_CONTEXT | (self.next_operation & !OPERATION_CONTEXT);
        token.context = id.into();
        self.raw.post_send(&token)?;
        self.operations.insert(
            id,
            PendingOperation {
                context,
                kind: token.kind,
                node: token.target_node,
                port: token.target_port,
            },
        );
        Ok(())
    }

    /// Puts the NIC holds toward `node` (every node if `None`).
    pub(crate) fn puts_outstanding(&self, node: Option<NodeId>) -> usize {
        self.operations
            .values()
            .filter(|op| op.kind == SendKind::PUT && node.is_none_or(|node| op.node == node))
            .count()
    }

    /// The next event in the event ring, interpreted, if one is waiting.
    pub(crate) fn next_event(&mut self) -> Result<Option<Event>, Error> {
        Ok(self.raw.next_event()?.map(|raw| self.interpret(raw)))
    }

    /// Turns a raw event into an [`Event`], handing back the buffers it ends the use of.
    fn interpret(&mut self, raw: RawEvent) -> Event {
        let ends_a_send = raw.kind == EventKind::SENT
            || (raw.kind == EventKind::TOKEN_REJECTED
                && !raw::is_ring_corrupt(&raw)
                && !raw::is_receive_rejection(&raw));
        if ends_a_send && let Some(operation) = self.operations.remove(&raw.context.get()) {
            return Event::OperationDone {
                context: operation.context,
                kind: operation.kind,
                status: raw.status,
                value: raw.buffer.get(),
                target_node: operation.node,
                target_port: operation.port,
            };
        }
        match raw.kind {
            EventKind::RECEIVED => match self.provided.remove(&raw.buffer.get()) {
                Some(buffer) => Event::Received {
                    // The NIC writes at most the size class's length, which the buffer holds; a
                    // longer claim would only make `buffer[..length]` panic.
                    length: (raw.length.get() as usize).min(buffer.len()),
                    buffer,
                    tag: raw.tag.get(),
                    size: raw.size,
                    priority: raw.priority,
                    sender_node: raw.peer_node,
                    sender_port: raw.peer_port,
                    status: raw.status,
                },
                None => Event::Other(raw),
            },
            EventKind::SENT => match self.take_send(raw.context.get()) {
                Some(send) => Event::Sent {
                    buffer: send.buffer,
                    context: send.context,
                    status: raw.status,
                    target_node: raw.peer_node,
                    target_port: raw.peer_port,
                },
                None => Event::Other(raw),
            },
            EventKind::BARRIER_COMPLETED | EventKind::BARRIER_FAILED => {
                // The barrier buffer its end used is spent.
                let tokens = &mut self.barrier_tokens;
                tokens.buffers = tokens.buffers.saturating_sub(1);
                let Some(send) = self.take_send(raw.context.get()) else {
                    return Event::Other(raw);
                };
                let tokens = &mut self.barrier_tokens;
                tokens.in_flight = tokens.in_flight.saturating_sub(1);
                tokens.recycle(send.buffer);
                if raw.kind == EventKind::BARRIER_COMPLETED && raw.length.get() != 0 {
                    Event::BroadcastCompleted {
                        context: send.context,
                        data: crate::event::BroadcastData::new(raw.broadcast_data()),
                    }
                } else if raw.kind == EventKind::BARRIER_COMPLETED {
                    Event::BarrierCompleted {
                        context: send.context,
                    }
                } else {
                    Event::BarrierFailed {
                        context: send.context,
                        status: raw.status,
                        waiting_for: (raw.peer_node, raw.peer_port),
                    }
                }
            }
            EventKind::TOKEN_REJECTED if raw::is_ring_corrupt(&raw) => Event::RingCorrupt,
            EventKind::TOKEN_REJECTED if raw::is_receive_rejection(&raw) => {
                Event::ReceiveRejected {
                    buffer: self.provided.remove(&raw.buffer.get()),
                    tag: raw.tag.get(),
                    status: raw.status,
                }
            }
            EventKind::TOKEN_REJECTED => {
                let send = self.take_send(raw.context.get());
                let context = send.as_ref().map_or(raw.context.get(), |s| s.context);
                let mut buffer = send.map(|s| s.buffer);
                if SendKind(raw.detail.get() as u8).is_barrier()
                    && raw.detail.get() >> 8 == 0
                    && let Some(schedule) = buffer.take()
                {
                    // A barrier's schedule buffer is the port's, not the caller's; its barrier
                    // buffer stays provided.
                    let tokens = &mut self.barrier_tokens;
                    tokens.in_flight = tokens.in_flight.saturating_sub(1);
                    tokens.recycle(schedule);
                }
                Event::SendRejected {
                    context,
                    buffer,
                    status: raw.status,
                    kind: raw.detail.get() as u8,
                }
            }
            _ => Event::Other(raw),
        }
    }

    /// The pending send named by a token context this layer made, if it is one.
    fn take_send(&mut self, context: u64) -> Option<PendingSend> {
        let slot = (context & u64::from(u32::MAX)) as usize;
        let serial = (context >> 32) as u32;
        let entry = self.sends.get_mut(slot)?;
        if entry.as_ref()?.serial != serial {
            return None;
        }
        let send = entry.take()?;
        self.free_send_slots.push(slot as u32);
        Some(send)
    }
}

/// The receive token of a barrier's buffer.
fn barrier_buffer() -> ReceiveToken {
    ReceiveToken {
        kind: ReceiveKind::BARRIER,
        ..ReceiveToken::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_become_microseconds_that_never_mean_the_default_by_accident() {
        assert_eq!(timeout_us(None), 0);
        assert_eq!(timeout_us(Some(Duration::ZERO)), 1);
        assert_eq!(timeout_us(Some(Duration::from_nanos(10))), 1);
        assert_eq!(timeout_us(Some(Duration::from_millis(3))), 3000);
        assert_eq!(timeout_us(Some(Duration::from_secs(1 << 40))), u32::MAX);
    }
}
