//! A port: one endpoint on a NIC, owned by this process, reached through its mapped region.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use host_driver::emulator::doorbell;
use host_driver::emulator::protocol::{self, Reply, Request};
use host_driver::emulator::sys::Mapping;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, recv};
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PortId};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::{Consumer, Producer, RingError, SharedMemory};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use shared_abi::{MAX_SIZE_CLASS, max_length_for_size};
use zerocopy::{FromZeros, IntoBytes};

use crate::barrier::{self, BarrierState};
use crate::dma::{self, DmaBuffer, Region};
use crate::error::{BufferError, Error};
use crate::event::Event;

/// How long the library waits for the daemon to answer a request.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// `detail` bit the NIC sets on a refused receive token.
const RECEIVE_TOKEN_DETAIL: u32 = 0x100;
/// Spins between checks that the daemon is still there, while spinning on the event ring.
const SPINS_PER_LIVENESS_CHECK: u32 = 1 << 16;
/// Spins between yields of the core, while spinning on the event ring.
const SPINS_PER_YIELD: u32 = 16;

/// How [`Port::blocking_receive`] waits for an event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WaitMode {
    /// Sleep on the event doorbell (the NIC rings it only while the process sleeps). Frees the
    /// core; costs a wake-up per event when idle.
    #[default]
    Sleep,
    /// Spin on the event ring: the lowest latency, and a whole core.
    Spin,
    /// Spin this long, then sleep.
    SpinThenSleep(Duration),
}

/// Counters of what the port did to the operating system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Times the process rang the NIC doorbell (a system call each).
    pub doorbells: u64,
    /// Times the process slept on its event doorbell.
    pub sleeps: u64,
}

/// A send the NIC holds: its buffer and the caller's context.
#[derive(Debug)]
struct PendingSend {
    buffer: DmaBuffer,
    context: u64,
    serial: u32,
}

/// An open port (GM's `gm_port`). Sends, receive buffers and events go through the mapped rings;
/// no system call per message, except a doorbell when the NIC asked for one.
///
/// Dropping the port closes it as [`Port::close`] does (waiting until what it posted is done).
/// Buffers still held keep the mapping alive.
#[derive(Debug)]
pub struct Port {
    control: UnixStream,
    region: Arc<Region>,
    host_doorbell: OwnedFd,
    nic_doorbell: OwnedFd,
    send_ring: Producer<SendToken>,
    receive_ring: Producer<ReceiveToken>,
    event_ring: Consumer<shared_abi::event::Event>,
    send_tokens: u32,
    receive_tokens: u32,
    sends: Vec<Option<PendingSend>>,
    free_send_slots: Vec<u32>,
    next_serial: u32,
    provided: HashMap<u64, DmaBuffer>,
    unit: u8,
    port: PortId,
    node: NodeId,
    generation: Generation,
    wait_mode: WaitMode,
    counters: PortCounters,
    /// Events taken from the ring while a barrier waited, for [`Port::receive`] to return first,
    /// in the order they came.
    pub(crate) deferred: VecDeque<Event>,
    /// The barrier code's state: barrier tokens held by the NIC, the running barrier, and the
    /// host-based barrier's record and buffers ([`crate::barrier`]).
    pub(crate) barrier: BarrierState,
    /// The daemon has been asked to close the port (by [`Port::close`] or the drop).
    closed: bool,
}

impl Drop for Port {
    fn drop(&mut self) {
        // Nothing to report to: a daemon that is gone closed the port already.
        let _ = self.close_in_order();
    }
}

impl Port {
    /// Opens `port` of NIC `unit` through the daemon's default socket
    /// ([`host_driver::emulator::socket_path`]: `$NICBAR_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/nicbar/control.sock`, else `/tmp/nicbar-<uid>/control.sock`).
    ///
    /// # Errors
    /// [`Error::DaemonUnreachable`], [`Error::NoSuchUnit`], [`Error::NoSuchPort`],
    /// [`Error::PortBusy`] (naming the owner), or what went wrong mapping the region.
    pub fn open(unit: u8, port: u8) -> Result<Self, Error> {
        Self::open_at(&host_driver::emulator::socket_path(), unit, port)
    }

    /// Opens `port` of NIC `unit` through the daemon listening on `socket`.
    ///
    /// # Errors
    /// As [`Port::open`].
    pub fn open_at(socket: &Path, unit: u8, port: u8) -> Result<Self, Error> {
        let control = UnixStream::connect(socket).map_err(|source| Error::DaemonUnreachable {
            socket: socket.to_owned(),
            source,
        })?;
        let request = Request::OpenPort {
            unit,
            port,
            abi_version: shared_abi::ABI_VERSION,
        };
        let (reply, fds) = protocol::call(&control, &request, CONTROL_TIMEOUT)?;
        let opened = match reply {
            Reply::Opened(opened) => opened,
            Reply::Error(error) => return Err(error.into()),
            other => return Err(Error::Protocol(format!("{other:?} to an open request"))),
        };
        let [region_fd, host_doorbell, nic_doorbell]: [OwnedFd; 3] =
            fds.try_into().map_err(|fds: Vec<OwnedFd>| {
                Error::Protocol(format!(
                    "the port came with {} descriptors, not 3",
                    fds.len()
                ))
            })?;
        let mapping = Mapping::open(&region_fd)?;
        drop(region_fd);
        let mut header = RegionHeader::new_zeroed();
        mapping
            .memory()
            .read(0, header.as_mut_bytes())
            .map_err(|_| Error::BadRegion("shorter than its header".to_owned()))?;
        let layout = RegionLayout::from_header(&header, mapping.len())
            .map_err(|error| Error::BadRegion(error.to_string()))?;
        if header.port_id != PortId(port)
            || header.unit != unit
            || header.node_id.get() != opened.node
            || header.generation.get() != opened.generation
        {
            return Err(Error::BadRegion(format!(
                "the header names unit {} port {} of node {} generation {}; the daemon opened \
                 unit {unit} port {port} of node {} generation {}",
                header.unit,
                header.port_id.0,
                header.node_id.get(),
                header.generation.get(),
                opened.node,
                opened.generation
            )));
        }
        let region = Arc::new(Region::new(mapping, layout));
        Ok(Self {
            control,
            send_ring: Producer::new(layout.send_ring, 0),
            receive_ring: Producer::new(layout.receive_ring, 0),
            event_ring: Consumer::new(layout.event_ring, 0),
            send_tokens: layout.send_ring.entries,
            receive_tokens: layout.receive_ring.entries,
            sends: Vec::new(),
            free_send_slots: Vec::new(),
            next_serial: 0,
            provided: HashMap::new(),
            unit,
            port: header.port_id,
            node: header.node_id,
            generation: header.generation,
            region,
            host_doorbell,
            nic_doorbell,
            wait_mode: WaitMode::default(),
            counters: PortCounters::default(),
            deferred: VecDeque::new(),
            barrier: BarrierState::default(),
            closed: false,
        })
    }

    /// Closes the port in order: the NIC first sends everything posted before — messages and
    /// barrier packets — and the close returns once each message has been acknowledged by its
    /// receiver or has failed for good (its events are not reported any more). That takes at most
    /// the NIC's give-up time plus its receiver-not-ready time (2 s each by default); what is left
    /// then is dropped. Peers' sends to the port then end with `TARGET_PORT_CLOSED`. Dropping the
    /// port does the same. A process that dies instead (killed) loses what the NIC had not sent;
    /// its peers are told the port closed.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] or a protocol error; the port is closed either way.
    pub fn close(mut self) -> Result<(), Error> {
        self.close_in_order()
    }

    fn close_in_order(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        match protocol::call(&self.control, &Request::ClosePort, CONTROL_TIMEOUT)?.0 {
            Reply::Closed => Ok(()),
            Reply::Error(error) => Err(error.into()),
            other => Err(Error::Protocol(format!("{other:?} to a close request"))),
        }
    }

    /// This NIC's node id (GM's `gm_get_node_id`).
    pub fn node_id(&self) -> NodeId {
        self.node
    }

    /// This port's id.
    pub fn port_id(&self) -> PortId {
        self.port
    }

    /// The NIC's unit number.
    pub fn unit(&self) -> u8 {
        self.unit
    }

    /// This incarnation of the port.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// Send tokens the process holds (GM's `gm_num_send_tokens`): one per send the NIC can
    /// take; a SENT (or refused send) event returns one.
    pub fn send_tokens(&self) -> u32 {
        self.send_tokens
    }

    /// Receive tokens the process holds (GM's `gm_num_receive_tokens`).
    pub fn receive_tokens(&self) -> u32 {
        self.receive_tokens
    }

    /// Free bytes in the DMA arena.
    pub fn arena_free(&self) -> usize {
        self.region.arena_free()
    }

    /// What the port did to the operating system so far.
    pub fn counters(&self) -> PortCounters {
        self.counters
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
        dma::allocate(&self.region, len).ok_or_else(|| Error::ArenaFull {
            requested: len,
            free: self.region.arena_free(),
        })
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
        let needed = max_length_for_size(size) as usize;
        let refused = |error, buffer| Err(BufferError { error, buffer });
        if !buffer.belongs_to(&self.region) {
            return refused(Error::ForeignBuffer, buffer);
        }
        if needed == 0 || !priority.is_valid() {
            return refused(Error::InvalidSize { size }, buffer);
        }
        if buffer.len() < needed {
            let length = buffer.len();
            return refused(Error::BufferTooSmall { length, needed }, buffer);
        }
        if self.receive_tokens == 0 {
            return refused(Error::NoReceiveTokens, buffer);
        }
        let token = ReceiveToken {
            kind: ReceiveKind::BUFFER,
            priority,
            size,
            tag: tag.into(),
            buffer: buffer.arena_offset().into(),
            ..ReceiveToken::default()
        };
        if let Err(error) = self.receive_ring.push(self.region.memory(), &token) {
            return refused(ring_error(error, Error::NoReceiveTokens), buffer);
        }
        self.receive_tokens -= 1;
        self.provided.insert(buffer.arena_offset(), buffer);
        self.ring_nic_if_asked(
            self.receive_ring
                .consumer_wants_doorbell(self.region.memory()),
        );
        Ok(())
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
        let refused = |error, buffer| Err(BufferError { error, buffer });
        if !buffer.belongs_to(&self.region) {
            return refused(Error::ForeignBuffer, buffer);
        }
        let max = max_length_for_size(size) as usize;
        if max == 0 || size > MAX_SIZE_CLASS || !priority.is_valid() {
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

    /// Posts a barrier send token for the schedule of `steps` steps in `schedule` (paper §5.2,
    /// `gm_barrier_send_with_callback`). The buffer is held like a send's until the barrier's
    /// end (or refusal) event.
    pub(crate) fn post_barrier_token(
        &mut self,
        schedule: DmaBuffer,
        steps: u32,
        context: u64,
        timeout_us: u32,
    ) -> Result<(), BufferError> {
        if !schedule.belongs_to(&self.region) {
            return Err(BufferError {
                error: Error::ForeignBuffer,
                buffer: schedule,
            });
        }
        let token = SendToken {
            kind: SendKind::BARRIER,
            length: steps.into(),
            buffer: schedule.arena_offset().into(),
            timeout_us: timeout_us.into(),
            ..SendToken::default()
        };
        self.push_send_token(token, schedule, context)?;
        self.barrier.token_posted();
        Ok(())
    }

    /// Posts a barrier receive token (paper §5.2, `gm_provide_barrier_buffer`): one barrier's
    /// end event needs one.
    pub(crate) fn post_barrier_buffer_token(&mut self) -> Result<(), Error> {
        if self.receive_tokens == 0 {
            return Err(Error::NoReceiveTokens);
        }
        let token = ReceiveToken {
            kind: ReceiveKind::BARRIER,
            ..ReceiveToken::default()
        };
        self.receive_ring
            .push(self.region.memory(), &token)
            .map_err(|error| ring_error(error, Error::NoReceiveTokens))?;
        self.receive_tokens -= 1;
        self.barrier.buffer_provided();
        self.ring_nic_if_asked(
            self.receive_ring
                .consumer_wants_doorbell(self.region.memory()),
        );
        Ok(())
    }

    /// Writes `token` into the send ring, holding `buffer` and `context` until its event; the
    /// token's context becomes the slot that names them.
    fn push_send_token(
        &mut self,
        mut token: SendToken,
        buffer: DmaBuffer,
        context: u64,
    ) -> Result<(), BufferError> {
        let refused = |error, buffer| Err(BufferError { error, buffer });
        if self.send_tokens == 0 {
            return refused(Error::NoSendTokens, buffer);
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
        if let Err(error) = self.send_ring.push(self.region.memory(), &token) {
            self.free_send_slots.push(slot);
            return refused(ring_error(error, Error::NoSendTokens), buffer);
        }
        self.send_tokens -= 1;
        self.sends[slot as usize] = Some(PendingSend {
            buffer,
            context,
            serial,
        });
        self.ring_nic_if_asked(self.send_ring.consumer_wants_doorbell(self.region.memory()));
        Ok(())
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
        if let Some(event) = self.deferred.pop_front() {
            return Ok(Some(event));
        }
        while let Some(event) = self.next_from_ring()? {
            if let Some(event) = barrier::absorb(self, event) {
                return Ok(Some(event));
            }
        }
        Ok(None)
    }

    /// The next event in the event ring, interpreted, if one is waiting: neither the events kept
    /// for later nor the barrier code's filter.
    ///
    /// # Errors
    /// As [`Port::receive`].
    pub(crate) fn next_from_ring(&mut self) -> Result<Option<Event>, Error> {
        let memory = self.region.memory();
        let available = self
            .event_ring
            .available(memory)
            .map_err(Error::EventRing)?;
        if available == 0 {
            return Ok(None);
        }
        let Some(raw) = self.event_ring.pop(memory).map_err(Error::EventRing)? else {
            return Ok(None);
        };
        if available == self.event_ring.layout().entries {
            // The ring was full: the NIC may hold events for want of room, and it has no flag
            // to say it waits. The slot just freed is room; tell it.
            self.ring_nic();
        }
        Ok(Some(self.interpret(raw)))
    }

    /// Waits for the next event (GM's `gm_blocking_receive`), as the wait mode says.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] if the daemon exits while the process waits; as [`Port::receive`].
    pub fn blocking_receive(&mut self) -> Result<Event, Error> {
        loop {
            if let Some(event) = self.wait(None, false)? {
                return Ok(event);
            }
        }
    }

    /// Waits at most `timeout` for the next event.
    ///
    /// # Errors
    /// As [`Port::blocking_receive`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Event>, Error> {
        self.wait(Some(Instant::now() + timeout), false)
    }

    /// Waits until `deadline` for the next event of the event ring, as
    /// [`Port::next_from_ring`] takes it (for the barrier code's own waits).
    ///
    /// # Errors
    /// As [`Port::blocking_receive`].
    pub(crate) fn wait_from_ring(
        &mut self,
        deadline: Option<Instant>,
    ) -> Result<Option<Event>, Error> {
        self.wait(deadline, true)
    }

    /// Waits for an event: from [`Port::receive`], or with `from_ring` straight from
    /// [`Port::next_from_ring`].
    fn wait(&mut self, deadline: Option<Instant>, from_ring: bool) -> Result<Option<Event>, Error> {
        let started = Instant::now();
        let spin_until = match self.wait_mode {
            WaitMode::Sleep => None,
            WaitMode::Spin => Some(deadline.unwrap_or(started + Duration::from_secs(86_400))),
            WaitMode::SpinThenSleep(spin) => Some(started + spin),
        };
        let mut spins = 0u32;
        loop {
            let event = if from_ring {
                self.next_from_ring()?
            } else {
                self.receive()?
            };
            if let Some(event) = event {
                return Ok(Some(event));
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Ok(None);
            }
            if spin_until.is_some_and(|until| now < until) {
                spins = spins.wrapping_add(1);
                if spins % SPINS_PER_LIVENESS_CHECK == 0 {
                    self.check_daemon(PollTimeout::ZERO)?;
                }
                if spins % SPINS_PER_YIELD == 0 {
                    // Let a runnable NIC thread (or the peer) have this core: with more spinners
                    // than cores, a spin that never yields only delays the event it waits for.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            }
            self.sleep(deadline)?;
        }
    }

    /// Sleeps on the event doorbell until it rings, the daemon goes away, or `deadline`.
    fn sleep(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        let memory = self.region.memory();
        self.event_ring
            .set_sleeping(memory, true)
            .map_err(|e| Error::EventRing(e.into()))?;
        // The flag is up (with a full fence): an event published from now on rings the doorbell.
        // One published before is seen here.
        let ready = self
            .event_ring
            .available(memory)
            .map_err(Error::EventRing)?
            > 0;
        let result = if ready {
            Ok(())
        } else {
            self.counters.sleeps += 1;
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let millis = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                    PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX)
                }
            };
            self.check_daemon(timeout)
        };
        doorbell::drain(&self.host_doorbell);
        self.event_ring
            .set_sleeping(memory, false)
            .map_err(|e| Error::EventRing(e.into()))?;
        result
    }

    /// Waits up to `timeout` for the event doorbell, failing with [`Error::DaemonGone`] if the
    /// control connection closes meanwhile.
    fn check_daemon(&self, timeout: PollTimeout) -> Result<(), Error> {
        let mut fds = [
            PollFd::new(self.host_doorbell.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
        let control = fds[1].revents().unwrap_or(PollFlags::empty());
        if control.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
            return Err(Error::DaemonGone);
        }
        if control.contains(PollFlags::POLLIN) {
            let mut byte = [0u8; 1];
            match recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.control),
                &mut byte,
                MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(0) => return Err(Error::DaemonGone),
                Ok(_) => {
                    return Err(Error::Protocol(
                        "the daemon wrote to an idle control connection".to_owned(),
                    ));
                }
                Err(_) => {}
            }
        }
        Ok(())
    }

    fn ring_nic_if_asked(&mut self, asked: Result<bool, shared_abi::ring::OutOfBounds>) {
        if asked.unwrap_or(true) {
            self.ring_nic();
        }
    }

    fn ring_nic(&mut self) {
        self.counters.doorbells += 1;
        doorbell::ring(&self.nic_doorbell);
    }

    /// Turns a raw event into an [`Event`], returning the tokens and buffers it gives back.
    fn interpret(&mut self, raw: shared_abi::event::Event) -> Event {
        match raw.kind {
            EventKind::RECEIVED => {
                self.receive_tokens += 1;
                match self.provided.remove(&raw.buffer.get()) {
                    Some(buffer) => Event::Received {
                        // The NIC writes at most the size class's length, which the buffer
                        // holds; a longer claim would only make `buffer[..length]` panic.
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
                }
            }
            EventKind::SENT => {
                self.send_tokens += 1;
                match self.take_send(raw.context.get()) {
                    Some(send) => Event::Sent {
                        buffer: send.buffer,
                        context: send.context,
                        status: raw.status,
                        target_node: raw.peer_node,
                        target_port: raw.peer_port,
                    },
                    None => Event::Other(raw),
                }
            }
            EventKind::BARRIER_COMPLETED | EventKind::BARRIER_FAILED => {
                // The barrier's send token and the barrier buffer its end used (paper §5.2).
                self.send_tokens += 1;
                self.receive_tokens += 1;
                let Some(send) = self.take_send(raw.context.get()) else {
                    self.barrier.ended(None);
                    return Event::Other(raw);
                };
                self.barrier.ended(Some(send.buffer));
                if raw.kind == EventKind::BARRIER_COMPLETED {
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
            EventKind::TOKEN_REJECTED
                if raw.status == Status::RING_CORRUPT && raw.detail.get() == 0 =>
            {
                Event::RingCorrupt
            }
            EventKind::TOKEN_REJECTED if raw.detail.get() & RECEIVE_TOKEN_DETAIL != 0 => {
                self.receive_tokens += 1;
                Event::ReceiveRejected {
                    buffer: self.provided.remove(&raw.buffer.get()),
                    tag: raw.tag.get(),
                    status: raw.status,
                }
            }
            EventKind::TOKEN_REJECTED => {
                self.send_tokens += 1;
                let send = self.take_send(raw.context.get());
                let context = send.as_ref().map_or(raw.context.get(), |s| s.context);
                let mut buffer = send.map(|s| s.buffer);
                if raw.detail.get() == u32::from(SendKind::BARRIER.0) {
                    // A barrier's schedule buffer is the port's, not the caller's.
                    self.barrier.refused(buffer.take());
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

    /// The pending send named by a token context this library made, if it is one.
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

/// A push failure: a full ring means the token accounting and the ring disagree (the NIC has not
/// taken tokens yet), reported as `full`; anything else is the ring's own error.
fn ring_error(error: RingError, full: Error) -> Error {
    match error {
        RingError::Full => full,
        other => Error::BadRegion(other.to_string()),
    }
}

/// Tokens that name arena offsets the caller tracks itself: the C API's sends and receive
/// buffers, which C programs hold as pointers into DMA memory rather than as [`DmaBuffer`]s. The
/// caller picks contexts and tags that name no send or buffer of this port (their events then
/// come back as [`Event::Other`], or a refusal with no buffer) and keeps its memory alive until
/// they do.
impl Port {
    /// Writes `token` into the send ring, spending a send token.
    ///
    /// # Errors
    /// [`Error::NoSendTokens`].
    pub(crate) fn post_send_token(&mut self, token: &SendToken) -> Result<(), Error> {
        if self.send_tokens == 0 {
            return Err(Error::NoSendTokens);
        }
        self.send_ring
            .push(self.region.memory(), token)
            .map_err(|error| ring_error(error, Error::NoSendTokens))?;
        self.send_tokens -= 1;
        self.ring_nic_if_asked(self.send_ring.consumer_wants_doorbell(self.region.memory()));
        Ok(())
    }

    /// Writes `token` into the receive ring, spending a receive token.
    ///
    /// # Errors
    /// [`Error::NoReceiveTokens`].
    pub(crate) fn post_receive_token(&mut self, token: &ReceiveToken) -> Result<(), Error> {
        if self.receive_tokens == 0 {
            return Err(Error::NoReceiveTokens);
        }
        self.receive_ring
            .push(self.region.memory(), token)
            .map_err(|error| ring_error(error, Error::NoReceiveTokens))?;
        self.receive_tokens -= 1;
        self.ring_nic_if_asked(
            self.receive_ring
                .consumer_wants_doorbell(self.region.memory()),
        );
        Ok(())
    }

    /// Checks, without waiting, that the daemon is still there (for callers that poll
    /// [`Port::receive`] and never sleep).
    ///
    /// # Errors
    /// [`Error::DaemonGone`].
    pub(crate) fn check_daemon_alive(&self) -> Result<(), Error> {
        self.check_daemon(PollTimeout::ZERO)
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
    pub fn post_raw_send_token(&mut self, token: &SendToken) -> Result<(), Error> {
        if self.send_tokens == 0 {
            return Err(Error::NoSendTokens);
        }
        self.send_ring
            .push(self.region.memory(), token)
            .map_err(|error| ring_error(error, Error::NoSendTokens))?;
        self.send_tokens -= 1;
        self.ring_nic_if_asked(self.send_ring.consumer_wants_doorbell(self.region.memory()));
        Ok(())
    }

    /// Overwrites the send ring's producer index with `tail` and rings the NIC. The port's own
    /// view of the ring is left behind: only refusals are to be expected from it afterwards.
    pub fn scribble_send_ring_tail(&mut self, tail: u32) {
        let _ = self
            .region
            .memory()
            .store_release(self.send_ring.layout().offset, tail);
        self.ring_nic();
    }
}
