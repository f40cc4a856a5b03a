//! The emulated NICs ("units", as GM's boards) of one daemon: one thread that runs every unit's
//! copy of the real firmware core over one epoll loop.
//!
//! One thread for all units, as one NIC processor runs all of a card's ports: a packet between two
//! units of the daemon (the in-process path) is taken in the same pass of the loop that sent it,
//! with no thread to wake, and a barrier among the daemon's units runs on the NIC side without a
//! context switch. The loop drains each unit's wake-up eventfd (rung for commands from the
//! control thread, for packets from other units, and by processes as that unit's NIC doorbell),
//! serves commands, and runs every unit — packets from its inbox and UDP socket, then a poll of its
//! [`Nic`] — until none has anything left to do. Then it raises the sleeping flag of every open
//! port's send and receive ring, polls once more (a token published before the process saw the
//! flag would otherwise wait), and sleeps in `epoll_wait` until a descriptor is ready or the
//! earliest firmware deadline ([`Nic::poll_at`]) or held-back packet of any unit is due.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use firmware::{Instant, Nic, OpenError};
use nicbar_control::process_memory::MemoryRequest;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use shared_abi::event::Event;
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::ring::{Consumer, Producer};
use shared_abi::token::{ReceiveToken, SendToken};

use super::fabric::FabricMap;
use super::fault::{FaultConfig, FaultInjector};
use super::hal::{AttachedPort, UnitHal, process_memory};
use super::wire::{self, Inbox, LocalFabric, Wire};
use nicbar_control::doorbell;
use nicbar_control::server::CloseReply;
use nicbar_control::{BarrierReport, ConnectionReport, NicReport, PortReport, UnitStatus};

/// Datagrams a unit takes from its UDP socket in one round before it polls.
const UDP_BATCH: usize = 64;
/// Rounds of (packets in, poll, loopback) a unit runs before it looks at its commands again.
const MAX_ROUNDS: usize = 256;
/// Longest sleep while a port has events waiting for room in its event ring. The process rings
/// the NIC doorbell when it frees room in a ring it saw full; this bounds the wait if it could not
/// see that (the ring ABI has no "producer waiting" flag).
const PENDING_EVENTS_RECHECK: Duration = Duration::from_millis(5);
/// Rounds in a row the firmware may ask to be polled at once while having nothing to do before
/// the loop takes the deadline as stale and sleeps a millisecond instead of spinning.
const STALE_DEADLINE_ROUNDS: u32 = 8;

/// Stack of the units' thread: each firmware core is built on it before it moves to the heap.
const UNIT_STACK: usize = 8 << 20;

/// Epoll data of a unit's descriptors: `unit << 1 | WAKE` and `unit << 1 | UDP`.
const WAKE: u64 = 0;
const UDP: u64 = 1;

/// A request from the control thread.
#[derive(Debug)]
pub(crate) enum Command {
    /// Map `attached` as `port`'s region and open the port.
    Open {
        port: PortId,
        attached: AttachedPort,
        reply: Sender<Result<Generation, OpenError>>,
    },
    /// Close `port` (its owner closed it or died) and unmap its region.
    Close { port: PortId, how: CloseHow },
    /// Register, deregister or allow remote access to memory of `port`'s process `pid`.
    Memory {
        port: PortId,
        pid: u32,
        request: MemoryRequest,
        reply: Sender<Result<u32, String>>,
    },
    /// Report.
    Status { reply: Sender<UnitStatus> },
    /// End the thread.
    Stop,
}

/// How a port closes, and who hears when it has.
#[derive(Debug)]
pub(crate) enum CloseHow {
    /// Its process closed it: the NIC first finishes what the process posted
    /// ([`Nic::begin_close`]), then answers.
    Orderly(CloseReply),
    /// At once, dropping what is unsent; `reply` hears when it is done.
    Now(Sender<()>),
    /// Its process is gone (its connection ended): at once, unless an orderly close it asked for
    /// is under way — that one is finished.
    Abandoned,
}

/// Everything a unit thread starts from.
pub(crate) struct UnitSetup {
    pub(crate) unit: u8,
    pub(crate) node: NodeId,
    pub(crate) address: Option<SocketAddr>,
    pub(crate) udp: Option<UdpSocket>,
    pub(crate) wake: Arc<OwnedFd>,
    pub(crate) inbox: Arc<Inbox>,
    pub(crate) local: Arc<LocalFabric>,
    pub(crate) fabric: Arc<FabricMap>,
    pub(crate) faults: Option<FaultConfig>,
    pub(crate) nic: firmware::Config,
    pub(crate) origin: std::time::Instant,
    pub(crate) boot_nonce: u32,
    pub(crate) linger: Duration,
}

/// The units' thread, shared by their handles: joined once every unit has been told to stop.
#[derive(Debug)]
struct SharedThread {
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    units: usize,
    stopped: std::sync::atomic::AtomicUsize,
}

/// The control thread's handle on a unit.
#[derive(Debug)]
pub(crate) struct UnitHandle {
    pub(crate) unit: u8,
    pub(crate) node: NodeId,
    /// The unit's wake-up eventfd, which processes get as their NIC doorbell.
    pub(crate) wake: Arc<OwnedFd>,
    commands: Sender<Command>,
    thread: Arc<SharedThread>,
    stopped: bool,
}

impl UnitHandle {
    /// Queues `command` and wakes the unit. `false` if the unit is gone.
    pub(crate) fn send(&self, command: Command) -> bool {
        let sent = self.commands.send(command).is_ok();
        doorbell::ring(&*self.wake);
        sent
    }

    /// Stops the unit; the last unit to stop also waits for the thread.
    pub(crate) fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.send(Command::Stop);
        let stopped = self
            .thread
            .stopped
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel)
            + 1;
        if stopped == self.thread.units {
            let thread = self
                .thread
                .thread
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            if let Some(thread) = thread {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for UnitHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts the thread that runs all `setups`' units.
///
/// # Errors
/// Creating the epoll instance or the thread failed.
pub(crate) fn spawn_all(setups: Vec<UnitSetup>) -> io::Result<Vec<UnitHandle>> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    let mut handles = Vec::new();
    let mut parts = Vec::new();
    for (index, setup) in setups.into_iter().enumerate() {
        let UnitSetup {
            unit,
            node,
            address,
            udp,
            wake,
            inbox,
            local,
            fabric,
            faults,
            nic,
            origin,
            boot_nonce,
            linger,
        } = setup;
        let key = (index as u64) << 1;
        epoll.add(&*wake, EpollEvent::new(EpollFlags::EPOLLIN, key | WAKE))?;
        if let Some(udp) = udp.as_ref() {
            epoll.add(udp, EpollEvent::new(EpollFlags::EPOLLIN, key | UDP))?;
        }
        let faults = faults
            .filter(FaultConfig::is_active)
            .map(|config| FaultInjector::new(config, u64::from(unit)));
        let wire = Wire::new(node, local, udp, fabric, faults);
        let (commands, receiver) = mpsc::channel();
        handles.push((unit, node, wake.clone(), commands));
        parts.push((
            unit, address, node, wire, nic, boot_nonce, receiver, wake, inbox, origin, linger,
        ));
    }
    let linger = parts.first().map_or(Duration::ZERO, |part| part.10);
    let thread = std::thread::Builder::new()
        .name("nic-units".to_owned())
        .stack_size(UNIT_STACK)
        .spawn(move || {
            let units = parts
                .into_iter()
                .map(
                    |(
                        unit,
                        address,
                        node,
                        wire,
                        nic,
                        boot_nonce,
                        commands,
                        wake,
                        inbox,
                        origin,
                        _,
                    )| UnitLoop {
                        unit,
                        address,
                        // A few hundred kilobytes of fixed tables: built on this thread's large stack,
                        // then kept on the heap.
                        nic: Box::new(Nic::new(UnitHal::new(wire), node, nic, boot_nonce)),
                        commands,
                        wake,
                        inbox,
                        origin,
                        arrivals: VecDeque::new(),
                        datagram: vec![0; wire::RECEIVE_BUFFER].into_boxed_slice(),
                        closing: Default::default(),
                        waiting_opens: Default::default(),
                        stale_rounds: 0,
                        stale_reported: false,
                        stopped: false,
                        dormant: false,
                    },
                )
                .collect();
            Units {
                units,
                epoll,
                linger,
            }
            .run();
        })?;
    let shared = Arc::new(SharedThread {
        thread: std::sync::Mutex::new(Some(thread)),
        units: handles.len(),
        stopped: std::sync::atomic::AtomicUsize::new(0),
    });
    Ok(handles
        .into_iter()
        .map(|(unit, node, wake, commands)| UnitHandle {
            unit,
            node,
            wake,
            commands,
            thread: shared.clone(),
            stopped: false,
        })
        .collect())
}

/// All units of the daemon, and the loop that runs them.
struct Units {
    units: Vec<UnitLoop>,
    epoll: Epoll,
    /// How long to stay awake after the last work before sleeping.
    linger: Duration,
}

impl Units {
    fn run(mut self) {
        let mut events = vec![EpollEvent::empty(); 2 * self.units.len().max(1)];
        let mut last_busy = std::time::Instant::now();
        // Units whose wake-up eventfd or UDP socket was ready in the last wait: every unit at
        // first. Only these are drained and asked for commands (a command always rings).
        let mut woken = vec![true; self.units.len()];
        loop {
            for (unit, woken) in self.units.iter_mut().zip(woken.iter_mut()) {
                if !std::mem::take(woken) {
                    continue;
                }
                unit.dormant = false;
                doorbell::drain(&*unit.wake);
                if !unit.stopped && !unit.serve_commands() {
                    unit.stop();
                }
            }
            if self.units.iter().all(|unit| unit.stopped) {
                return;
            }
            if self.work() {
                last_busy = std::time::Instant::now();
            }
            let mut timeout: Option<Duration> = None;
            for unit in self.units.iter_mut().filter(|unit| unit.runs()) {
                match unit.sleep_timeout() {
                    Some(t) => timeout = Some(timeout.map_or(t, |timeout| timeout.min(t))),
                    // Nothing due, ever, and nothing to serve: skip it until something
                    // arrives for it.
                    None if unit.idle() => unit.dormant = true,
                    None => {}
                }
            }
            if timeout == Some(Duration::ZERO) {
                continue;
            }
            if last_busy.elapsed() < self.linger && self.hosts_asleep() {
                // Recently busy, and every process sleeps on its event ring: stay awake a little
                // without the sleeping flags, so a process that wakes to an event and posts again
                // soon needs no doorbell (io_uring's SQPOLL idle time). A process that spins on
                // its event ring instead would only compete with this spin for the cores: then
                // sleep at once, and let its next post ring the doorbell.
                let ready = self
                    .epoll
                    .wait(&mut events, EpollTimeout::ZERO)
                    .unwrap_or(0);
                mark_woken(&events[..ready], &mut woken);
                std::thread::yield_now();
                continue;
            }
            for unit in &self.units {
                unit.set_sleeping(true);
            }
            // The flags are up: a token published from now on rings the doorbell. One published
            // before, or a packet one unit left another, is seen here.
            let late_work = self.units.iter_mut().any(|unit| {
                if unit.stopped {
                    return false;
                }
                if !unit.inbox.is_empty() {
                    return true;
                }
                if unit.dormant {
                    return false;
                }
                let now = unit.now();
                unit.nic.poll(now) || !unit.nic.hal().wire.loopback.is_empty()
            });
            if !late_work {
                let ready = self
                    .epoll
                    .wait(&mut events, epoll_timeout(timeout))
                    .unwrap_or(0);
                mark_woken(&events[..ready], &mut woken);
            }
            for unit in &self.units {
                unit.set_sleeping(false);
            }
        }
    }

    /// Whether every open port's process sleeps on its event ring (none spins on it).
    fn hosts_asleep(&self) -> bool {
        self.units
            .iter()
            .filter(|unit| !unit.stopped)
            .all(UnitLoop::hosts_asleep)
    }

    /// Runs every unit until none has anything to do (bounded, to serve commands): a packet one
    /// unit sends another is taken in the next pass. Dormant units are skipped unless a packet
    /// came for them. Returns whether there was anything to do.
    fn work(&mut self) -> bool {
        let mut any = false;
        for _ in 0..MAX_ROUNDS {
            let mut busy = false;
            for unit in self.units.iter_mut().filter(|unit| !unit.stopped) {
                if unit.dormant {
                    if unit.inbox.is_empty() {
                        continue;
                    }
                    unit.dormant = false;
                }
                busy |= unit.work();
            }
            if !busy {
                return any;
            }
            any = true;
        }
        any
    }
}

/// Marks the units whose descriptors `ready` names (epoll data `unit << 1 | WAKE/UDP`).
fn mark_woken(ready: &[EpollEvent], woken: &mut [bool]) {
    for event in ready {
        if let Some(flag) = usize::try_from(event.data() >> 1)
            .ok()
            .and_then(|index| woken.get_mut(index))
        {
            *flag = true;
        }
    }
}

/// One unit: its firmware core and what feeds it.
struct UnitLoop {
    unit: u8,
    address: Option<SocketAddr>,
    nic: Box<Nic<UnitHal>>,
    commands: Receiver<Command>,
    wake: Arc<OwnedFd>,
    inbox: Arc<Inbox>,
    origin: std::time::Instant,
    arrivals: VecDeque<Vec<u8>>,
    /// The UDP socket's receive buffer: a datagram is parsed where it was received.
    datagram: Box<[u8]>,
    stale_rounds: u32,
    stale_reported: bool,
    /// Told to stop: its ports are closed and it runs no more.
    stopped: bool,
    /// No port open, nothing due and nothing queued: the loop skips it until its eventfd or
    /// socket is ready or a packet comes into its inbox (a daemon of many units, few in use,
    /// costs no more per pass than its busy ones).
    dormant: bool,
    /// Ports finishing an orderly close, with the answer their process waits for.
    closing: [Option<CloseReply>; PORTS_PER_NIC],
    /// Opens of a port that was still finishing an orderly close: served when it has.
    waiting_opens: [Option<WaitingOpen>; PORTS_PER_NIC],
}

/// An open request waiting for the port's orderly close to finish.
type WaitingOpen = (AttachedPort, Sender<Result<Generation, OpenError>>);

impl UnitLoop {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Whether the loop runs it this pass.
    fn runs(&self) -> bool {
        !self.stopped && !self.dormant
    }

    /// Whether it has nothing to serve: no port open or closing, no open waiting, no packet
    /// queued for it.
    fn idle(&self) -> bool {
        self.nic.hal().ports.iter().all(Option::is_none)
            && self.closing.iter().all(Option::is_none)
            && self.waiting_opens.iter().all(Option::is_none)
            && self.arrivals.is_empty()
            && self.nic.hal().wire.loopback.is_empty()
            && self.inbox.is_empty()
    }

    /// Closes every open port (the daemon stops) and runs no more.
    fn stop(&mut self) {
        let now = self.now();
        for port in 0..PORTS_PER_NIC as u8 {
            self.nic.close_port(PortId(port), now);
        }
        self.stopped = true;
    }

    /// Serves every queued command. `false` when told to stop (or the control thread is gone).
    fn serve_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) | Err(TryRecvError::Disconnected) => return false,
                Ok(command) => self.serve(command),
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    fn serve(&mut self, command: Command) {
        let now = self.now();
        self.nic.hal_mut().wire.set_now(now);
        match command {
            Command::Open {
                port,
                attached,
                reply,
            } => {
                if self.nic.is_closing(port)
                    && let Some(waiting) = port
                        .index()
                        .and_then(|index| self.waiting_opens.get_mut(index))
                    && waiting.is_none()
                {
                    // The port's last process closed it and the NIC is finishing what it
                    // posted (bounded by the close limit): open it once that is done.
                    *waiting = Some((attached, reply));
                    return;
                }
                let _ = reply.send(self.open(port, attached, now));
            }
            Command::Close { port, how } => match how {
                CloseHow::Orderly(done) => {
                    let Some(index) = port.index() else {
                        done.send(Ok(()));
                        return;
                    };
                    if self.nic.begin_close(port, now).is_some() {
                        if let Some(slot) = self.closing.get_mut(index) {
                            *slot = Some(done);
                        }
                    } else {
                        self.unmap(port);
                        done.send(Ok(()));
                    }
                    self.finish_closes(now);
                }
                CloseHow::Now(reply) => {
                    self.nic.close_port(port, now);
                    self.unmap(port);
                    self.finish_closes(now);
                    let _ = reply.send(());
                }
                CloseHow::Abandoned => {
                    if !self.nic.is_closing(port) {
                        self.nic.close_port(port, now);
                        self.unmap(port);
                    }
                    self.finish_closes(now);
                }
            },
            Command::Memory {
                port,
                pid,
                request,
                reply,
            } => {
                let _ = reply.send(self.memory(port, pid, request));
            }
            Command::Status { reply } => {
                let _ = reply.send(self.status());
            }
            Command::Stop => {}
        }
    }

    /// Serves a memory request of `port`'s process `pid`. A registration first checks that the
    /// kernel lets the daemon reach the range (its first and last byte), so a refusal is named
    /// now rather than as a failed operation later.
    fn memory(&mut self, port: PortId, pid: u32, request: MemoryRequest) -> Result<u32, String> {
        let index = port
            .index()
            .ok_or_else(|| format!("{port} does not exist"))?;
        let pid = i32::try_from(pid).map_err(|_| format!("process id {pid} is out of range"))?;
        let attached = self
            .nic
            .hal_mut()
            .ports
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or_else(|| format!("{port} is not open"))?;
        attached.owner_pid = Some(pid);
        match request {
            MemoryRequest::Register {
                address,
                length,
                nonce,
            } => {
                let pid = nix::unistd::Pid::from_raw(pid);
                let mut byte = [0u8; 1];
                let last = address.saturating_add(length.saturating_sub(1));
                for at in [address, last] {
                    process_memory::read(pid, at, &mut byte)
                        .map_err(|error| process_memory::explain(error, pid))?;
                }
                self.nic
                    .register_memory(port, address, length, nonce)
                    .map_err(|error| error.to_string())
            }
            MemoryRequest::Deregister { address, length } => self
                .nic
                .deregister_memory(port, address, length)
                .map(|()| 0)
                .map_err(|error| error.to_string()),
            MemoryRequest::AllowRemoteAccess => self
                .nic
                .allow_remote_memory_access(port)
                .map(|()| 0)
                .map_err(|error| error.to_string()),
        }
    }

    /// Unmaps `port`'s region: the NIC has let go of it.
    fn unmap(&mut self, port: PortId) {
        if let Some(slot) = port
            .index()
            .and_then(|index| self.nic.hal_mut().ports.get_mut(index))
        {
            *slot = None;
        }
    }

    /// Ports whose orderly close finished: unmap them, answer their processes, and serve opens
    /// that waited for them.
    fn finish_closes(&mut self, now: Instant) {
        let finished = self.nic.take_finished_closes();
        if finished == 0 {
            return;
        }
        for index in (0..PORTS_PER_NIC).filter(|index| finished & (1 << index) != 0) {
            let port = PortId(index as u8);
            self.unmap(port);
            if let Some(done) = self.closing.get_mut(index).and_then(Option::take) {
                done.send(Ok(()));
            }
            if let Some((attached, reply)) =
                self.waiting_opens.get_mut(index).and_then(Option::take)
            {
                let opened = self.open(port, attached, now);
                if reply.send(opened).is_err() && opened.is_ok() {
                    // The control thread stopped waiting (the close took longer than it waits):
                    // nobody owns the port, so it must not stay open.
                    self.nic.close_port(port, now);
                    self.unmap(port);
                }
            }
        }
    }

    fn open(
        &mut self,
        port: PortId,
        attached: AttachedPort,
        now: Instant,
    ) -> Result<Generation, OpenError> {
        let index = port.index().ok_or(OpenError::NoSuchPort(port))?;
        let slot = self
            .nic
            .hal_mut()
            .ports
            .get_mut(index)
            .ok_or(OpenError::NoSuchPort(port))?;
        if slot.is_some() {
            return Err(OpenError::AlreadyOpen(port));
        }
        *slot = Some(attached);
        let opened = self.nic.open_port(port, now);
        if opened.is_err()
            && let Some(slot) = self.nic.hal_mut().ports.get_mut(index)
        {
            *slot = None;
        }
        opened
    }

    /// One round: packets from the wire, a poll, packets to itself. Returns whether there was
    /// anything to do.
    fn work(&mut self) -> bool {
        {
            let now = self.now();
            let wire = &mut self.nic.hal_mut().wire;
            wire.set_now(now);
            wire.blocked = false;
            wire.release_due();
            let mut busy = false;
            // Datagrams are taken straight from the receive buffer, a bounded number per round
            // (the loop comes back while the socket stays readable).
            for _ in 0..UDP_BATCH {
                let Some(len) = self.nic.hal_mut().wire.receive_udp(&mut self.datagram[..]) else {
                    break;
                };
                busy = true;
                self.nic.hal_mut().wire.counters.received += 1;
                self.nic
                    .on_packet(self.datagram.get(..len).unwrap_or(&[]), now);
            }
            // Packets from the other NICs of this daemon and from this one never left its
            // memory: they carry no authentication code (`Hal::local_route`).
            self.inbox.take_all(&mut self.arrivals);
            busy |= !self.arrivals.is_empty();
            self.nic.hal_mut().wire.counters.received += self.arrivals.len() as u64;
            while let Some(packet) = self.arrivals.pop_front() {
                self.nic.on_local_packet(&packet, now);
            }
            busy |= self.nic.poll(now);
            while let Some(packet) = self.nic.hal_mut().wire.loopback.pop_front() {
                self.nic.hal_mut().wire.counters.received += 1;
                self.nic.on_local_packet(&packet, now);
                busy = true;
            }
            self.finish_closes(now);
            busy
        }
    }

    /// How long the unit may sleep: until the firmware's or the wire's next deadline, `None` for
    /// as long as nothing arrives.
    fn sleep_timeout(&mut self) -> Option<Duration> {
        let now = self.now();
        let wire = &self.nic.hal().wire;
        let deadline = firmware::time::earliest(self.nic.poll_at(), wire.next_release());
        let mut timeout =
            deadline.map(|at| Duration::from_nanos(at.as_nanos().saturating_sub(now.as_nanos())));
        let mut recheck = None;
        if wire.blocked {
            recheck = Some(wire::BLOCKED_RETRY);
        }
        let events_waiting = (0..PORTS_PER_NIC as u8)
            .filter_map(|port| self.nic.port_status(PortId(port)))
            .any(|status| status.pending_events > 0);
        if events_waiting {
            recheck = Some(recheck.map_or(PENDING_EVENTS_RECHECK, |r: Duration| {
                r.min(PENDING_EVENTS_RECHECK)
            }));
        }
        if timeout == Some(Duration::ZERO) {
            // `work` just found nothing to do; a deadline that is still due at once after that,
            // round after round, is one the firmware will not clear. Sleep briefly rather than spin.
            self.stale_rounds += 1;
            if self.stale_rounds >= STALE_DEADLINE_ROUNDS {
                if !self.stale_reported {
                    self.stale_reported = true;
                    eprintln!(
                        "nicctl emulate: unit {}: the firmware keeps asking to be polled at {:?} \
                         (now {:?}) with nothing to do; sleeping 1 ms per round instead",
                        self.unit, deadline, now
                    );
                }
                timeout = Some(Duration::from_millis(1));
            }
        } else {
            self.stale_rounds = 0;
        }
        match (timeout, recheck) {
            (Some(t), Some(r)) => Some(t.min(r)),
            (t, None) => t,
            (None, r) => r,
        }
    }

    /// Whether the process of every open port sleeps on its event ring (its sleeping flag is
    /// up: it asked for the doorbell).
    fn hosts_asleep(&self) -> bool {
        self.nic.hal().ports.iter().flatten().all(|attached| {
            let events = Producer::<Event>::new(attached.layout.event_ring, 0);
            events
                .consumer_wants_doorbell(attached.mapping.memory())
                .unwrap_or(true)
        })
    }

    /// Raises or lowers the sleeping flag of every open port's send and receive ring (the NIC is
    /// their consumer), so processes ring the doorbell only while the NIC sleeps.
    fn set_sleeping(&self, sleeping: bool) {
        for attached in self.nic.hal().ports.iter().flatten() {
            let memory = attached.mapping.memory();
            let send = Consumer::<SendToken>::new(attached.layout.send_ring, 0);
            let receive = Consumer::<ReceiveToken>::new(attached.layout.receive_ring, 0);
            let _ = send.set_sleeping(memory, sleeping);
            let _ = receive.set_sleeping(memory, sleeping);
        }
    }

    fn status(&self) -> UnitStatus {
        let ports = (0..PORTS_PER_NIC as u8)
            .filter_map(|port| self.nic.port_status(PortId(port)))
            .map(|status| PortReport {
                port: status.port.0,
                generation: status.generation.get(),
                owner_pid: None,
                held_sends: status.held_sends,
                receive_buffers: status.receive_buffers,
                barrier_running: status.barrier_running,
                barrier: status.barrier.as_ref().map(barrier_report),
                closing: status.closing,
                pending_events: status.pending_events,
                faulted: status.faulted.map(|s| s.0),
            })
            .collect();
        let connections = self
            .nic
            .connection_counters()
            .map(|(peer, counters)| connection_report(peer.get(), &counters))
            .collect();
        UnitStatus {
            unit: self.unit,
            node: self.nic.node().get(),
            address: self.address.map(|a| a.to_string()),
            ports,
            connections,
            counters: nic_report(self.nic.counters()),
            wire: self.nic.hal().wire.counters,
        }
    }
}

/// The report of a running barrier's `progress`.
fn barrier_report(progress: &firmware::BarrierProgress) -> BarrierReport {
    let (node, port, round) = progress
        .waiting_for
        .map_or((0, 0, 0), |(node, port, round)| (node.get(), port.0, round));
    BarrierReport {
        step: progress.step as u32,
        steps: progress.steps as u32,
        waiting_node: node,
        waiting_port: port,
        round,
        sending: progress.sending,
    }
}

/// The report of `counters` for the connection to `peer`.
fn connection_report(peer: u16, counters: &firmware::ConnectionCounters) -> ConnectionReport {
    ConnectionReport {
        peer,
        sent: counters.sent,
        resent: counters.resent,
        received: counters.received,
        acks_sent: counters.acks_sent,
        acks_received: counters.acks_received,
        nacks_sent: counters.nacks_sent,
        nacks_received: counters.nacks_received,
        rejects_sent: counters.rejects_sent,
        rejects_received: counters.rejects_received,
        drops: counters.drops,
        give_ups: counters.give_ups,
    }
}

/// The report of the NIC-wide `counters`.
fn nic_report(counters: firmware::NicCounters) -> NicReport {
    NicReport {
        malformed_packets: counters.malformed_packets,
        no_connection: counters.no_connection,
        tokens_rejected: counters.tokens_rejected,
        barriers_completed: counters.barriers_completed,
        barriers_failed: counters.barriers_failed,
        messages_delivered: counters.messages_delivered,
        unauthenticated: counters.unauthenticated,
    }
}

/// An epoll timeout of at least `timeout`, rounded up to whole milliseconds.
fn epoll_timeout(timeout: Option<Duration>) -> EpollTimeout {
    let Some(timeout) = timeout else {
        return EpollTimeout::NONE;
    };
    let millis = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
    EpollTimeout::try_from(millis).unwrap_or(EpollTimeout::MAX)
}
