//! The raw port: what every layer above stands on — the Rust [`crate::Port`] and the C API alike.
//!
//! A [`RawPort`] opens and closes a port over the daemon's control socket, maps its region, and
//! moves tokens and events through the region's rings: [`RawPort::post_send`] and
//! [`RawPort::post_receive`] write tokens as the caller built them, their contexts and tags the
//! caller's to choose (one context space per port: whoever owns the raw port owns it);
//! [`RawPort::next_event`] takes the next event as the NIC wrote it; [`RawPort::wait`] waits for
//! one, spinning or sleeping on the port's doorbell. It keeps count of the tokens the process
//! holds (a token posted is spent; the event that ends its use gives it back) and rings the NIC's
//! doorbell when the NIC asked for it. It knows nothing of buffers, sends or barriers: those are
//! the meaning the layers above give to contexts and tags.

pub(crate) mod control;
pub mod dma;
pub mod memory;
pub mod region;

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, ppoll};
use nix::sys::socket::{MsgFlags, recv};
use nix::sys::time::TimeSpec;
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{Generation, NodeId, PortId};
use shared_abi::region::{RegionHeader, RegionLayout};
use shared_abi::ring::{Consumer, Producer, RingError, SharedMemory, Wake};
use shared_abi::token::{ReceiveToken, SendToken};
use zerocopy::{FromZeros, IntoBytes};

use crate::error::Error;
use control::Mapping;
use dma::DmaBuffer;
use region::Region;

/// An event as the NIC writes it into the event ring.
pub type RawEvent = shared_abi::event::Event;

/// `detail` bit the NIC sets on a refused receive token.
pub const RECEIVE_TOKEN_DETAIL: u32 = 0x100;
/// Spins between checks that the daemon is still there, while spinning on the event ring.
const SPINS_PER_LIVENESS_CHECK: u32 = 1 << 16;
/// Spins between yields of the core, while spinning on the event ring.
const SPINS_PER_YIELD: u32 = 16;

/// How a wait for an event waits. The default spins [`WaitMode::DEFAULT_SPIN`], then sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Sleep on the event doorbell at once (the NIC rings it only while the process sleeps).
    /// Frees the core; costs a wake-up per event, which the NIC pays.
    Sleep,
    /// Spin on the event ring: the lowest latency, and a whole core.
    Spin,
    /// Spin this long, then sleep.
    SpinThenSleep(Duration),
}

impl Default for WaitMode {
    /// [`WaitMode::SpinThenSleep`] for [`WaitMode::DEFAULT_SPIN`], as GM's
    /// `gm_blocking_receive` polls a while before it sleeps.
    fn default() -> Self {
        Self::SpinThenSleep(Self::DEFAULT_SPIN)
    }
}

impl WaitMode {
    /// How long the default wait spins (yielding the core now and then) before it sleeps. An
    /// event that comes within it — a barrier's end, a peer's answer — costs no wake-up: waking
    /// a sleeping process is the NIC's dearest work (a system call and, often, an
    /// inter-processor interrupt), and it delays the NIC's next packet. Long enough for a
    /// barrier among processes of one host, short enough that a process with nothing coming
    /// gives its core away at once.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(20);

    /// Until when a wait that starts at `started` and ends at `deadline` spins before it
    /// sleeps; `None` to sleep at once.
    pub fn spin_until(self, started: Instant, deadline: Option<Instant>) -> Option<Instant> {
        match self {
            Self::Sleep => None,
            Self::Spin => Some(deadline.unwrap_or(started + Duration::from_secs(86_400))),
            Self::SpinThenSleep(spin) => Some(started + spin),
        }
    }
}

/// Counters of what the port did to the operating system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// Times the process rang the NIC doorbell (a system call each).
    pub doorbells: u64,
    /// Times the process slept on its event doorbell.
    pub sleeps: u64,
}

/// Which tokens an event gives back to the process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokensBack {
    /// A send token.
    pub send: bool,
    /// A receive token.
    pub receive: bool,
}

impl TokensBack {
    /// The tokens `event` ends the use of: a RECEIVED event its receive token, a SENT event its
    /// send token, a barrier's end both (its send token and the barrier buffer its end used,
    /// paper §5.2), a refused token that token.
    pub fn of(event: &RawEvent) -> Self {
        let (send, receive) = match event.kind {
            EventKind::RECEIVED => (false, true),
            EventKind::SENT => (true, false),
            EventKind::BARRIER_COMPLETED | EventKind::BARRIER_FAILED => (true, true),
            EventKind::TOKEN_REJECTED if is_ring_corrupt(event) => (false, false),
            EventKind::TOKEN_REJECTED => {
                let receive = is_receive_rejection(event);
                (!receive, receive)
            }
            _ => (false, false),
        };
        Self { send, receive }
    }
}

/// Whether `event` says the process broke its own rings' indexes (the NIC skipped what was
/// published; the tokens in the skipped range produce no events).
pub fn is_ring_corrupt(event: &RawEvent) -> bool {
    event.kind == EventKind::TOKEN_REJECTED
        && event.status == Status::RING_CORRUPT
        && event.detail.get() == 0
}

/// Whether `event` is the refusal of a receive token (else, if refused, of a send token).
pub fn is_receive_rejection(event: &RawEvent) -> bool {
    event.kind == EventKind::TOKEN_REJECTED
        && !is_ring_corrupt(event)
        && event.detail.get() & RECEIVE_TOKEN_DETAIL != 0
}

/// A node of the fabric as the fabric names it ([`RawPort::fabric_nodes`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricNode {
    /// Its node id.
    pub node: NodeId,
    /// Its host name: the fabric map's name for it, else its UDP address, or
    /// `<host name>:<unit>` for a unit of one daemon. At most 127 bytes of printable ASCII.
    pub name: String,
    /// Its unique id (GM's 6-byte board id), the same from every daemon of the fabric.
    pub unique_id: [u8; 6],
}

/// An open port at the level of its rings (GM's `gm_port` without the library's meaning).
///
/// Dropping it closes the port in order, as [`RawPort::close`] does. Buffers still held keep the
/// mapping alive.
#[derive(Debug)]
pub struct RawPort {
    /// The daemon has been asked to close the port (by [`RawPort::close`] or the drop).
    closed: bool,
    control: UnixStream,
    region: Arc<Region>,
    host_doorbell: OwnedFd,
    nic_doorbell: OwnedFd,
    send_ring: Producer<SendToken>,
    receive_ring: Producer<ReceiveToken>,
    event_ring: Consumer<RawEvent>,
    send_tokens: u32,
    receive_tokens: u32,
    unit: u8,
    port: PortId,
    node: NodeId,
    generation: Generation,
    counters: PortCounters,
    /// Whether the daemon knows where the region is mapped here ([`RawPort::arena_bytes`]).
    region_mapped: memory::RegionMapped,
}

impl Drop for RawPort {
    fn drop(&mut self) {
        // Closing in order: what the process posted goes out first. Nothing to report to; a
        // daemon that is gone closed the port already.
        let _ = self.close_in_order();
    }
}

impl RawPort {
    /// Opens `port` of NIC `unit` through the daemon's default socket (`$NICBAR_SOCKET`, else
    /// `$XDG_RUNTIME_DIR/nicbar/control.sock`, else `/tmp/nicbar-<uid>/control.sock`).
    ///
    /// # Errors
    /// [`Error::DaemonUnreachable`], [`Error::NoSuchUnit`], [`Error::NoSuchPort`],
    /// [`Error::PortBusy`] (naming the owner), or what went wrong mapping the region.
    pub fn open(unit: u8, port: u8) -> Result<Self, Error> {
        Self::open_at(&control::default_socket(), unit, port)
    }

    /// Opens `port` of NIC `unit` through the daemon listening on `socket`.
    ///
    /// # Errors
    /// As [`RawPort::open`].
    pub fn open_at(socket: &Path, unit: u8, port: u8) -> Result<Self, Error> {
        let stream = control::connect(socket)?;
        let opened = control::open_port(&stream, unit, port)?;
        let mapping = Mapping::open(&opened.region)?;
        drop(opened.region);
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
        Ok(Self {
            control: stream,
            send_ring: Producer::new(layout.send_ring, 0),
            receive_ring: Producer::new(layout.receive_ring, 0),
            event_ring: Consumer::new(layout.event_ring, 0),
            send_tokens: layout.send_ring.entries,
            receive_tokens: layout.receive_ring.entries,
            unit,
            port: header.port_id,
            node: header.node_id,
            generation: header.generation,
            region: Arc::new(Region::new(mapping, layout)),
            host_doorbell: opened.host_doorbell,
            nic_doorbell: opened.nic_doorbell,
            counters: PortCounters::default(),
            region_mapped: memory::RegionMapped::new(memory::UNTOLD),
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

    /// Closes in order now (once: later calls, and the drop, do nothing).
    pub(crate) fn close_in_order(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        control::close_port(&self.control)
    }

    /// Every node of the fabric the daemon knows, by node id, with its host name and unique id,
    /// asked of the daemon over the control connection (the fabric's naming is the daemon's: it
    /// reads the fabric map).
    ///
    /// # Errors
    /// [`Error::DaemonGone`], a timeout, or a protocol error.
    pub fn fabric_nodes(&self) -> Result<Vec<FabricNode>, Error> {
        Ok(control::nodes(&self.control)?
            .into_iter()
            .map(|(node, name, unique_id)| {
                let [_, _, id @ ..] = unique_id.to_be_bytes();
                FabricNode {
                    node: NodeId::new(node),
                    name,
                    unique_id: id,
                }
            })
            .collect())
    }

    /// This NIC's node id.
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

    /// The port's mapped region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// Send tokens the process holds: sends the NIC can take now.
    pub fn send_tokens(&self) -> u32 {
        self.send_tokens
    }

    /// Receive tokens the process holds.
    pub fn receive_tokens(&self) -> u32 {
        self.receive_tokens
    }

    /// Send tokens the port has in all (one per send ring slot), held or not.
    pub fn send_token_total(&self) -> u32 {
        self.send_ring.layout().entries
    }

    /// Receive tokens the port has in all, held or not.
    pub fn receive_token_total(&self) -> u32 {
        self.receive_ring.layout().entries
    }

    /// What the port did to the operating system so far.
    pub fn counters(&self) -> PortCounters {
        self.counters
    }

    /// Allocates `len` bytes from the port's DMA arena.
    ///
    /// # Errors
    /// [`Error::ArenaFull`] if no free range is that long.
    pub fn dma_alloc(&self, len: usize) -> Result<DmaBuffer, Error> {
        dma::allocate(&self.region, len).ok_or_else(|| Error::ArenaFull {
            requested: len,
            free: self.region.arena_free(),
        })
    }

    /// Writes `token` into the send ring as it is, spending a send token. The NIC names the
    /// token by its context in the event that ends it.
    ///
    /// # Errors
    /// [`Error::NoSendTokens`].
    pub fn post_send(&mut self, token: &SendToken) -> Result<(), Error> {
        if self.send_tokens == 0 {
            return Err(Error::NoSendTokens);
        }
        self.send_ring
            .push(self.region.memory(), token)
            .map_err(|error| ring_error(error, Error::NoSendTokens))?;
        self.send_tokens -= 1;
        let asked = self.send_ring.consumer_wants_doorbell(self.region.memory());
        self.ring_nic_if_asked(asked);
        Ok(())
    }

    /// Writes `token` into the receive ring as it is, spending a receive token. The NIC names
    /// the token by its tag (and buffer) in the event that ends it.
    ///
    /// # Errors
    /// [`Error::NoReceiveTokens`].
    pub fn post_receive(&mut self, token: &ReceiveToken) -> Result<(), Error> {
        self.post_receive_unrung(token)?;
        let asked = self
            .receive_ring
            .consumer_wants_doorbell(self.region.memory());
        self.ring_nic_if_asked(asked);
        Ok(())
    }

    /// [`RawPort::post_receive`] without ringing a sleeping NIC, for a token the NIC needs only
    /// once a send token posted after it asks for it (a barrier's buffer, provided before its
    /// barrier token): the NIC takes it at its next look at the port, which that send's doorbell
    /// brings at the latest. A system call and a wake-up of the NIC saved.
    ///
    /// # Errors
    /// [`Error::NoReceiveTokens`].
    pub fn post_receive_unrung(&mut self, token: &ReceiveToken) -> Result<(), Error> {
        if self.receive_tokens == 0 {
            return Err(Error::NoReceiveTokens);
        }
        self.receive_ring
            .push(self.region.memory(), token)
            .map_err(|error| ring_error(error, Error::NoReceiveTokens))?;
        self.receive_tokens -= 1;
        Ok(())
    }

    /// The next event in the event ring, as the NIC wrote it, if one is waiting; the tokens it
    /// ends are the process's again ([`TokensBack`]). Never blocks.
    ///
    /// # Errors
    /// [`Error::EventRing`] if the NIC broke the event ring.
    pub fn next_event(&mut self) -> Result<Option<RawEvent>, Error> {
        let memory = self.region.memory();
        let available = self
            .event_ring
            .available(memory)
            .map_err(Error::EventRing)?;
        if available == 0 {
            return Ok(None);
        }
        let Some(event) = self.event_ring.pop(memory).map_err(Error::EventRing)? else {
            return Ok(None);
        };
        if available == self.event_ring.layout().entries {
            // The ring was full: the NIC may hold events for want of room, and it has no flag
            // to say it waits. The slot just freed is room; tell it.
            self.ring_nic();
        }
        let back = TokensBack::of(&event);
        self.send_tokens += u32::from(back.send);
        self.receive_tokens += u32::from(back.receive);
        Ok(Some(event))
    }

    /// Whether an event waits in the event ring.
    ///
    /// # Errors
    /// [`Error::EventRing`] if the NIC broke the event ring.
    pub fn event_waiting(&self) -> Result<bool, Error> {
        Ok(self
            .event_ring
            .available(self.region.memory())
            .map_err(Error::EventRing)?
            > 0)
    }

    /// Waits until an event waits in the event ring (`true`) or `deadline` passes (`false`):
    /// spinning on the ring until `spin_until` (yielding the core now and then), then sleeping on
    /// the event doorbell until the NIC rings it for what `wake` says ([`Wake::ANY`], or
    /// [`Wake::UNLESS_SENT`] for a caller that waits for something other than a send's end).
    /// [`WaitMode::spin_until`] turns a mode into `spin_until`.
    ///
    /// # Errors
    /// [`Error::DaemonGone`] if the daemon exits meanwhile; [`Error::EventRing`].
    pub fn wait(
        &mut self,
        deadline: Option<Instant>,
        spin_until: Option<Instant>,
        wake: Wake,
    ) -> Result<bool, Error> {
        let mut spins = 0u32;
        loop {
            if self.event_waiting()? {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| now >= deadline) {
                return Ok(false);
            }
            if spin_until.is_some_and(|until| now < until) {
                spins = spins.wrapping_add(1);
                if spins % SPINS_PER_LIVENESS_CHECK == 0 {
                    self.check_daemon(Some(Duration::ZERO))?;
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
            self.sleep(deadline, wake)?;
        }
    }

    /// Checks, without waiting, that the daemon is still there (for callers that poll and
    /// never sleep).
    ///
    /// # Errors
    /// [`Error::DaemonGone`].
    pub fn check_daemon_alive(&self) -> Result<(), Error> {
        self.check_daemon(Some(Duration::ZERO))
    }

    /// Sleeps on the event doorbell until it rings (for what `wake` asks), the daemon goes
    /// away, or `deadline`.
    fn sleep(&mut self, deadline: Option<Instant>, wake: Wake) -> Result<(), Error> {
        let memory = self.region.memory();
        self.event_ring
            .set_wake(memory, wake)
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
            // To the microsecond (`ppoll`): `poll`'s milliseconds would stretch a wait of 200 µs
            // to 1 ms.
            let timeout =
                deadline.map(|deadline| deadline.saturating_duration_since(Instant::now()));
            self.check_daemon(timeout)
        };
        control::drain(&self.host_doorbell);
        self.event_ring
            .set_sleeping(memory, false)
            .map_err(|e| Error::EventRing(e.into()))?;
        result
    }

    /// Waits up to `timeout` (`None`: for ever) for the event doorbell, failing with
    /// [`Error::DaemonGone`] if the control connection closes meanwhile.
    fn check_daemon(&self, timeout: Option<Duration>) -> Result<(), Error> {
        let mut fds = [
            PollFd::new(self.host_doorbell.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.control.as_fd(), PollFlags::POLLIN),
        ];
        match ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None) {
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
                self.control.as_raw_fd(),
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
        control::ring(&self.nic_doorbell);
    }

    /// Overwrites the send ring's producer index with `tail` and rings the NIC, for tests of the
    /// NIC's defences. The port's own view of the ring is left behind: only refusals are to be
    /// expected from it afterwards.
    #[cfg(feature = "raw-access")]
    pub fn scribble_send_ring_tail(&mut self, tail: u32) {
        let _ = self
            .region
            .memory()
            .store_release(self.send_ring.layout().offset, tail);
        self.ring_nic();
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
