//! A port: one endpoint on a NIC, owned by this process, reached through its mapped region.

pub(crate) mod barriers;
pub(crate) mod kept;
pub(crate) mod memory;

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use shared_abi::ids::{Generation, NodeId, PortId};
use shared_abi::ring::Wake;
use shared_abi::token::Priority;

use crate::dma::{BufferError, DmaBuffer};
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::event::Event;
use crate::raw::{PortCounters, RawPort, WaitMode};
use barriers::BarrierState;

/// An open port (GM's `gm_port`). Sends, receive buffers and events go through the mapped rings;
/// no system call per message, except a doorbell when the NIC asked for one.
///
/// Dropping the port closes it in order, as [`Port::close`] does (waiting until what it posted is
/// done). Buffers still held keep the mapping alive.
#[derive(Debug)]
pub struct Port {
    pub(crate) endpoint: Endpoint,
    wait_mode: WaitMode,
    /// Events taken from the ring while a barrier waited, for [`Port::receive`] to return first,
    /// in the order they came.
    deferred: VecDeque<Event>,
    /// The barrier code's state: the running barriers, and the host-based barrier's record and
    /// buffers ([`crate::barrier`]).
    pub(crate) barrier: BarrierState,
    /// The memory registered through [`Port::register_memory`], kept alive while the NIC may
    /// reach it.
    registered: Vec<memory::MemoryRegion>,
}

impl Port {
    /// Opens `port` of NIC `unit` through the daemon's default socket (`$NICBAR_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/nicbar/control.sock`, else `/tmp/nicbar-<uid>/control.sock`).
    ///
    /// # Errors
    /// [`Error::DaemonUnreachable`], [`Error::NoSuchUnit`], [`Error::NoSuchPort`],
    /// [`Error::PortBusy`] (naming the owner), or what went wrong mapping the region.
    pub fn open(unit: u8, port: u8) -> Result<Self, Error> {
        RawPort::open(unit, port).map(Self::from_raw)
    }

    /// Opens `port` of NIC `unit` through the daemon listening on `socket`.
    ///
    /// # Errors
    /// As [`Port::open`].
    pub fn open_at(socket: &Path, unit: u8, port: u8) -> Result<Self, Error> {
        RawPort::open_at(socket, unit, port).map(Self::from_raw)
    }

    /// The port over an open raw port, which it takes over (its tokens' contexts and tags are
    /// this port's from now on).
    pub fn from_raw(raw: RawPort) -> Self {
        Self {
            endpoint: Endpoint::new(raw),
            wait_mode: WaitMode::default(),
            deferred: VecDeque::new(),
            barrier: BarrierState::default(),
            registered: Vec::new(),
        }
    }

    /// Closes the port in order, as [`RawPort::close`] says: everything posted before goes out
    /// first, and the call returns once it is acknowledged or has failed for good (bounded by the
    /// NIC's give-up time plus its receiver-not-ready time). Host-based barrier messages that a
    /// peer's port refused because it was not open yet are sent again first, until they get
    /// through or their barrier's deadline passes — as the NIC does for its own barrier packets
    /// (paper §3.2). Dropping the port does the same. Peers' sends to it then end with
    /// `TARGET_PORT_CLOSED`.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] or a protocol error; the port is closed either way.
    pub fn close(mut self) -> Result<(), Error> {
        self.deliver_host_messages();
        self.endpoint.raw_mut().close_in_order()
    }

    /// Waits until every host-based barrier message this port owes a peer has been taken by the
    /// NIC and has not come back refused (sending refused ones again when due), or until the
    /// latest host-based barrier's deadline.
    fn deliver_host_messages(&mut self) {
        let Some(deadline) = self.barrier.host.deadline else {
            return;
        };
        while !self.barrier.host.resends.is_empty() || !self.barrier.host.sending.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            let wake = self.resend_due(now).map_or(deadline, |at| at.min(deadline));
            // Waiting for sends' ends: every one of them must wake it.
            match self.wait_from_ring(Some(wake), Wake::ANY) {
                Ok(Some(event)) => self.keep_unless_absorbed(event),
                Ok(None) => {}
                Err(_) => return,
            }
        }
    }

    fn raw(&self) -> &RawPort {
        self.endpoint.raw()
    }

    /// This NIC's node id (GM's `gm_get_node_id`).
    pub fn node_id(&self) -> NodeId {
        self.raw().node_id()
    }

    /// This port's id.
    pub fn port_id(&self) -> PortId {
        self.raw().port_id()
    }

    /// The NIC's unit number.
    pub fn unit(&self) -> u8 {
        self.raw().unit()
    }

    /// This incarnation of the port.
    pub fn generation(&self) -> Generation {
        self.raw().generation()
    }

    /// Send tokens the process holds (GM's `gm_num_send_tokens`): one per send the NIC can
    /// take; a SENT (or refused send) event returns one.
    pub fn send_tokens(&self) -> u32 {
        self.raw().send_tokens()
    }

    /// Receive tokens the process holds (GM's `gm_num_receive_tokens`).
    pub fn receive_tokens(&self) -> u32 {
        self.raw().receive_tokens()
    }

    /// Free bytes in the DMA arena.
    pub fn arena_free(&self) -> usize {
        self.raw().region().arena_free()
    }

    /// What the port did to the operating system so far.
    pub fn counters(&self) -> PortCounters {
        self.raw().counters()
    }

    /// How [`Port::blocking_receive`] waits.
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.wait_mode = mode;
    }

    /// Allocates `len` bytes from the port's DMA arena (GM's `gm_dma_malloc`).
    ///
    /// # Errors
    /// [`Error::ArenaFull`] if no free range is that long.
    pub fn dma_alloc(&self, len: usize) -> Result<DmaBuffer, Error> {
        self.endpoint.dma_alloc(len)
    }

    /// Provides `buffer` to receive one message of size class `size` and `priority` (GM's
    /// `gm_provide_receive_buffer_with_tag`). It comes back in the RECEIVED event of the message
    /// it takes, carrying `tag`.
    ///
    /// # Errors
    /// [`Error::InvalidSize`], [`Error::BufferTooSmall`] (the buffer must hold the size class's
    /// longest message), [`Error::ForeignBuffer`], [`Error::NoReceiveTokens`]; the buffer comes
    /// back in the error.
    pub fn provide_receive_buffer(
        &mut self,
        buffer: DmaBuffer,
        size: u8,
        priority: Priority,
        tag: u32,
    ) -> Result<(), BufferError> {
        self.endpoint
            .provide_receive_buffer(buffer, size, priority, tag)
    }

    /// Sends the first `len` bytes of `buffer`, as a message of size class `size` and
    /// `priority`, to port `port` of node `node` (GM's `gm_send_with_callback`). The buffer comes
    /// back in the SENT event, with `context`.
    ///
    /// # Errors
    /// [`Error::InvalidSize`], [`Error::TooLong`], [`Error::NoSuchPort`],
    /// [`Error::ForeignBuffer`], [`Error::NoSendTokens`]; the buffer comes back in the error.
    #[allow(
        clippy::too_many_arguments,
        reason = "the shape of GM's gm_send_with_callback, which the C API wraps one to one"
    )]
    pub fn send(
        &mut self,
        buffer: DmaBuffer,
        len: usize,
        size: u8,
        priority: Priority,
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), BufferError> {
        self.endpoint
            .send(buffer, len, size, priority, node, port, context)
    }

    /// The next event, if one is waiting (GM's `gm_receive`). Never blocks.
    ///
    /// Events that arrived while a barrier waited come first, in order. The host-based barrier's
    /// own messages, and the end of a barrier started with [`Port::barrier_start`], are kept for
    /// the barrier calls and not returned here.
    ///
    /// # Errors
    /// [`Error::EventRing`] if the NIC broke the event ring.
    pub fn receive(&mut self) -> Result<Option<Event>, Error> {
        if !self.barrier.host.resends.is_empty() {
            self.resend_due(Instant::now());
        }
        if let Some(event) = self.deferred.pop_front() {
            return Ok(Some(event));
        }
        while let Some(event) = self.endpoint.next_event()? {
            if let Some(event) = barriers::absorb(&mut self.endpoint, &mut self.barrier, event) {
                return Ok(Some(event));
            }
        }
        Ok(None)
    }

    /// The next event in the event ring, interpreted, if one is waiting: neither the events kept
    /// for later nor the barrier code's filter. Sends again the host-based barrier's refused
    /// messages that are due, as every call that takes events does.
    ///
    /// # Errors
    /// As [`Port::receive`].
    pub(crate) fn next_from_ring(&mut self) -> Result<Option<Event>, Error> {
        if !self.barrier.host.resends.is_empty() {
            self.resend_due(Instant::now());
        }
        self.endpoint.next_event()
    }

    /// Passes `event` through the barrier code; what it does not take waits for
    /// [`Port::receive`].
    pub(crate) fn keep_unless_absorbed(&mut self, event: Event) {
        if let Some(event) = barriers::absorb(&mut self.endpoint, &mut self.barrier, event) {
            self.deferred.push_back(event);
        }
    }

    /// Waits for the next event (GM's `gm_blocking_receive`), as the wait mode says.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] if the daemon exits while the process waits; as [`Port::receive`].
    pub fn blocking_receive(&mut self) -> Result<Event, Error> {
        loop {
            if let Some(event) = self.wait(None, false, Wake::ANY)? {
                return Ok(event);
            }
        }
    }

    /// Waits at most `timeout` for the next event.
    ///
    /// # Errors
    /// As [`Port::blocking_receive`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        self.receive_timeout_for(timeout, Wake::ANY)
    }

    /// [`Port::receive_timeout`], asleep until the NIC rings for what `wake` says.
    ///
    /// # Errors
    /// As [`Port::blocking_receive`].
    pub(crate) fn receive_timeout_for(
        &mut self,
        timeout: Duration,
        wake: Wake,
    ) -> Result<Option<Event>, Error> {
        self.wait(Some(Instant::now() + timeout), false, wake)
    }

    /// Waits at most `timeout` until an event waits to be taken — by [`Port::receive`], or by
    /// the barrier calls, whose own ends [`Port::receive`] does not return — without taking it.
    /// Returns whether one waits. For a progress loop that sleeps between polls: unlike
    /// [`Port::receive_timeout`], the end of a started barrier wakes it.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] if the daemon exits meanwhile; [`Error::EventRing`].
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<bool, Error> {
        self.wait_ready_for(timeout, Wake::ANY)
    }

    /// [`Port::wait_ready`], asleep until the NIC rings for what `wake` says.
    ///
    /// # Errors
    /// As [`Port::wait_ready`].
    pub(crate) fn wait_ready_for(&mut self, timeout: Duration, wake: Wake) -> Result<bool, Error> {
        if !self.deferred.is_empty() {
            return Ok(true);
        }
        let now = Instant::now();
        let deadline = now + timeout;
        let spin_until = self.wait_mode.spin_until(now, Some(deadline));
        let until = self
            .barrier
            .host
            .next_resend()
            .map_or(deadline, |resend| resend.min(deadline));
        self.endpoint.raw_mut().wait(Some(until), spin_until, wake)
    }

    /// Waits until `deadline` for the next event of the event ring, as
    /// [`Port::next_from_ring`] takes it (for the barrier code's own waits), sleeping until the
    /// NIC rings for what `wake` says.
    ///
    /// # Errors
    /// As [`Port::blocking_receive`].
    pub(crate) fn wait_from_ring(
        &mut self,
        deadline: Option<Instant>,
        wake: Wake,
    ) -> Result<Option<Event>, Error> {
        self.wait(deadline, true, wake)
    }

    /// Waits for an event: from [`Port::receive`], or with `from_ring` straight from
    /// [`Port::next_from_ring`]; asleep, until the NIC rings for what `wake` says.
    fn wait(
        &mut self,
        deadline: Option<Instant>,
        from_ring: bool,
        wake: Wake,
    ) -> Result<Option<Event>, Error> {
        let spin_until = self.wait_mode.spin_until(Instant::now(), deadline);
        loop {
            let event = if from_ring {
                self.next_from_ring()?
            } else {
                self.receive()?
            };
            if event.is_some() {
                return Ok(event);
            }
            // Wake for a host-based barrier message due to be sent again, too (taking events
            // sends it).
            let resend = self.barrier.host.next_resend();
            let until = match (deadline, resend) {
                (Some(deadline), Some(resend)) => Some(deadline.min(resend)),
                (deadline, resend) => deadline.or(resend),
            };
            if !self.endpoint.raw_mut().wait(until, spin_until, wake)?
                && deadline.is_some_and(|deadline| Instant::now() >= deadline)
            {
                return Ok(None);
            }
        }
    }
}

impl Drop for Port {
    /// Closes the port as [`Port::close`] does (the raw port closes in order when it drops).
    fn drop(&mut self) {
        self.deliver_host_messages();
    }
}

/// Raw access to the port's rings, for tests of the NIC's defences: tokens written as given, and
/// ring indexes overwritten. Only with the `raw-access` feature.
#[cfg(feature = "raw-access")]
impl Port {
    /// Writes `token` into the send ring as it is, spending a send token. Its SENT or refusal
    /// event comes back as [`Event::Other`] or [`Event::SendRejected`] with no buffer.
    ///
    /// # Errors
    /// [`Error::NoSendTokens`].
    pub fn post_raw_send_token(
        &mut self,
        token: &shared_abi::token::SendToken,
    ) -> Result<(), Error> {
        self.endpoint.raw_mut().post_send(token)
    }

    /// Overwrites the send ring's producer index with `tail` and rings the NIC. The port's own
    /// view of the ring is left behind: only refusals are to be expected from it afterwards.
    pub fn scribble_send_ring_tail(&mut self, tail: u32) {
        self.endpoint.raw_mut().scribble_send_ring_tail(tail);
    }
}
