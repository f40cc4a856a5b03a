//! One emulated NIC ("unit", as GM's boards) of the daemon: its copy of the real firmware core,
//! the commands the control thread sends it, and one round of its work. A NIC thread
//! ([`crate::nic_thread`]) runs one or more of them.

use std::collections::VecDeque;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use firmware::{Instant, Nic, OpenError};
use nicbar_control::process_memory::MemoryRequest;
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::ring::Consumer;
use shared_abi::token::{ReceiveToken, SendToken};

use super::fabric::FabricMap;
use super::fault::{FaultConfig, FaultInjector};
use super::hal::{AttachedPort, UnitHal, process_memory};
use super::idle::IdlePolicy;
use super::udp::{self, ReceiveBatch};
use super::wire::{self, Inbox, LocalFabric, Wire};
use nicbar_control::doorbell;
use nicbar_control::server::CloseReply;
use nicbar_control::{BarrierReport, ConnectionReport, NicReport, PortReport, UnitStatus};

/// Longest sleep while a port has events waiting for room in its event ring. The process rings
/// the NIC doorbell when it frees room in a ring it saw full; this bounds the wait if it could not
/// see that (the ring ABI has no "producer waiting" flag).
const PENDING_EVENTS_RECHECK: Duration = Duration::from_millis(5);

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

/// Everything a unit starts from.
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
    /// Random bytes of this boot, from the operating system: the NIC's session nonces are drawn
    /// from them.
    pub(crate) boot_entropy: [u8; 16],
    pub(crate) idle: IdlePolicy,
}

impl UnitSetup {
    /// The control thread's handle on the unit, and what its NIC thread builds it from.
    /// `open_ports` counts the daemon's open ports (every unit adds its own).
    pub(crate) fn split(
        self,
        thread: u16,
        open_ports: Arc<AtomicUsize>,
    ) -> (UnitHandle, UnitParts) {
        let (commands, receiver) = mpsc::channel();
        let faults = self
            .faults
            .filter(FaultConfig::is_active)
            .map(|config| FaultInjector::new(config, u64::from(self.unit)));
        let wire = Wire::new(
            self.node,
            self.local,
            self.udp,
            self.fabric,
            faults,
            self.nic.fabric_key,
        );
        let handle = UnitHandle {
            unit: self.unit,
            node: self.node,
            wake: self.wake.clone(),
            commands,
            thread,
            shared: None,
            stopped: false,
        };
        let parts = UnitParts {
            unit: self.unit,
            address: self.address,
            node: self.node,
            wire,
            nic: self.nic,
            boot_nonce: self.boot_nonce,
            boot_entropy: self.boot_entropy,
            commands: receiver,
            wake: self.wake,
            inbox: self.inbox,
            origin: self.origin,
            thread,
            idle: self.idle,
            open_ports,
        };
        (handle, parts)
    }
}

/// A unit not yet built: what moves to its NIC thread.
pub(crate) struct UnitParts {
    unit: u8,
    address: Option<SocketAddr>,
    node: NodeId,
    wire: Wire,
    nic: firmware::Config,
    boot_nonce: u32,
    boot_entropy: [u8; 16],
    commands: Receiver<Command>,
    wake: Arc<OwnedFd>,
    inbox: Arc<Inbox>,
    origin: std::time::Instant,
    thread: u16,
    idle: IdlePolicy,
    open_ports: Arc<AtomicUsize>,
}

impl UnitParts {
    /// Builds the unit, on the NIC thread that runs it.
    pub(crate) fn build(self) -> UnitLoop {
        let has_udp = self.wire.has_udp();
        UnitLoop {
            unit: self.unit,
            address: self.address,
            // A few hundred kilobytes of fixed tables: built on the NIC thread's large stack,
            // then kept on the heap.
            nic: Box::new(Nic::new(
                UnitHal::new(self.wire),
                self.node,
                self.nic,
                self.boot_nonce,
                self.boot_entropy,
            )),
            commands: self.commands,
            wake: self.wake,
            inbox: self.inbox,
            origin: self.origin,
            arrivals: VecDeque::new(),
            incoming: has_udp.then(|| ReceiveBatch::new(wire::RECEIVE_BUFFER)),
            accepted: Vec::with_capacity(udp::BATCH),
            closing: Default::default(),
            waiting_opens: Default::default(),
            stopped: false,
            dormant: false,
            settled: None,
            thread: self.thread,
            idle: self.idle,
            polling: false,
            open_ports: self.open_ports,
        }
    }
}

/// A NIC thread, shared by the handles of its units: joined once every one of them has been
/// told to stop.
#[derive(Debug)]
pub(crate) struct SharedThread {
    thread: std::sync::Mutex<Option<JoinHandle<()>>>,
    units: usize,
    stopped: AtomicUsize,
}

impl SharedThread {
    /// A thread of `units` units, not started yet.
    pub(crate) fn new(units: usize) -> Self {
        Self {
            thread: std::sync::Mutex::new(None),
            units,
            stopped: AtomicUsize::new(0),
        }
    }

    /// The thread, once started.
    pub(crate) fn set_thread(&self, thread: JoinHandle<()>) {
        *self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(thread);
    }
}

/// The control thread's handle on a unit.
#[derive(Debug)]
pub(crate) struct UnitHandle {
    pub(crate) unit: u8,
    pub(crate) node: NodeId,
    /// The unit's wake-up eventfd, which processes get as their NIC doorbell.
    pub(crate) wake: Arc<OwnedFd>,
    commands: Sender<Command>,
    thread: u16,
    shared: Option<Arc<SharedThread>>,
    stopped: bool,
}

impl UnitHandle {
    /// The NIC thread that runs the unit.
    pub(crate) fn thread_index(&self) -> u16 {
        self.thread
    }

    /// Ties the handle to the thread that runs its unit.
    pub(crate) fn attach(&mut self, shared: Arc<SharedThread>) {
        self.shared = Some(shared);
    }

    /// Queues `command` and wakes the unit. `false` if the unit is gone.
    pub(crate) fn send(&self, command: Command) -> bool {
        let sent = self.commands.send(command).is_ok();
        doorbell::ring(&*self.wake);
        sent
    }

    /// Stops the unit; the last unit of its thread to stop also waits for the thread.
    pub(crate) fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.send(Command::Stop);
        let Some(shared) = self.shared.as_ref() else {
            return;
        };
        let stopped = shared.stopped.fetch_add(1, Ordering::AcqRel) + 1;
        if stopped == shared.units {
            let thread = shared
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

/// One unit: its firmware core and what feeds it.
pub(crate) struct UnitLoop {
    unit: u8,
    address: Option<SocketAddr>,
    nic: Box<Nic<UnitHal>>,
    commands: Receiver<Command>,
    /// The wake-up eventfd: commands and processes ring it.
    pub(crate) wake: Arc<OwnedFd>,
    /// Packets from the daemon's other units.
    pub(crate) inbox: Arc<Inbox>,
    origin: std::time::Instant,
    arrivals: VecDeque<Vec<u8>>,
    /// The UDP socket's receive batch (units with a UDP address): a datagram is parsed where it
    /// was received.
    incoming: Option<ReceiveBatch>,
    /// Which datagrams of the last batch go to the NIC.
    accepted: Vec<usize>,
    /// Told to stop: its ports are closed and it runs no more.
    pub(crate) stopped: bool,
    /// No port open, nothing due and nothing queued: the loop skips it until its eventfd or
    /// socket is ready, a command comes or a packet comes into its inbox (a daemon of many
    /// units, few in use, costs no more per pass than its busy ones).
    pub(crate) dormant: bool,
    /// Set when the firmware's last poll found nothing to do and nothing has reached it since (a
    /// packet, a command): its next deadline then (`Nic::poll_at`). Until that deadline, a round
    /// polls only if a process posted something ([`Nic::host_work_waiting`]): a thread that
    /// stays awake for its processes then costs a few loads per port and pass, not the
    /// firmware's scans of its timers.
    settled: Option<Option<Instant>>,
    /// The NIC thread that runs it, and that thread's idle policy (for `nicctl status`).
    thread: u16,
    idle: IdlePolicy,
    /// Whether its thread polls now.
    pub(crate) polling: bool,
    /// The daemon's open ports (the adaptive idle policy's load): this unit adds its own.
    open_ports: Arc<AtomicUsize>,
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
    pub(crate) fn runs(&self) -> bool {
        !self.stopped && !self.dormant
    }

    /// Whether it has nothing to serve: no port open or closing, no open waiting, no packet
    /// queued for it.
    pub(crate) fn idle(&self) -> bool {
        self.nic.hal().ports.iter().all(Option::is_none)
            && self.closing.iter().all(Option::is_none)
            && self.waiting_opens.iter().all(Option::is_none)
            && self.arrivals.is_empty()
            && self.nic.hal().wire.loopback.is_empty()
            && self.inbox.is_empty()
    }

    /// Whether neither the firmware nor the wire has anything due, ever (no deadline).
    pub(crate) fn nic_is_idle(&self) -> bool {
        self.nic.poll_at().is_none() && self.nic.hal().wire.next_release().is_none()
    }

    /// Closes every open port (the daemon stops) and runs no more.
    pub(crate) fn stop(&mut self) {
        let now = self.now();
        for port in 0..PORTS_PER_NIC as u8 {
            self.nic.close_port(PortId(port), now);
        }
        self.stopped = true;
    }

    /// Serves every queued command. `false` when told to stop (or the control thread is gone).
    pub(crate) fn serve_commands(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) | Err(TryRecvError::Disconnected) => return false,
                Ok(command) => self.serve(command),
                Err(TryRecvError::Empty) => return true,
            }
        }
    }

    fn serve(&mut self, command: Command) {
        self.dormant = false;
        self.settled = None;
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
        self.end_round();
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
            MemoryRequest::RegionMapped { address } => {
                attached.mapped_at = Some(address);
                Ok(0)
            }
        }
    }

    /// Unmaps `port`'s region: the NIC has let go of it.
    fn unmap(&mut self, port: PortId) {
        if let Some(slot) = port
            .index()
            .and_then(|index| self.nic.hal_mut().ports.get_mut(index))
            && slot.take().is_some()
        {
            self.open_ports.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Ports whose orderly close finished: unmap them, answer their processes, and serve opens
    /// that waited for them.
    fn finish_closes(&mut self, now: Instant) {
        let finished = self.nic.take_finished_closes();
        if finished == 0 {
            return;
        }
        self.settled = None;
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
        } else {
            self.open_ports.fetch_add(1, Ordering::Relaxed);
        }
        opened
    }

    /// One round: packets from the wire, a poll, packets to itself. Returns whether there was
    /// anything to do.
    pub(crate) fn work(&mut self) -> bool {
        {
            let now = self.now();
            let wire = &mut self.nic.hal_mut().wire;
            wire.set_now(now);
            wire.blocked = false;
            wire.release_due();
            let mut busy = false;
            // One batch of datagrams a round, each parsed where it landed (the loop comes back
            // while the socket stays readable).
            if let Some(incoming) = self.incoming.as_mut() {
                busy |= self
                    .nic
                    .hal_mut()
                    .wire
                    .receive_udp(incoming, &mut self.accepted);
                for &index in &self.accepted {
                    if let Some((bytes, _, _)) = incoming.datagram(index) {
                        self.nic.on_packet(bytes, now);
                    }
                }
            }
            // Packets from the other NICs of this daemon and from this one never left its
            // memory: they carry no authentication code (`Hal::local_route`).
            self.inbox.take_all(&mut self.arrivals);
            busy |= !self.arrivals.is_empty();
            self.nic.hal_mut().wire.counters.received += self.arrivals.len() as u64;
            while let Some(packet) = self.arrivals.pop_front() {
                self.nic.on_local_packet(&packet, now);
                self.inbox.recycle(packet);
            }
            if busy {
                self.settled = None;
            }
            busy |= self.poll_firmware(now);
            while let Some(packet) = self.nic.hal_mut().wire.loopback.pop_front() {
                self.nic.hal_mut().wire.counters.received += 1;
                self.nic.on_local_packet(&packet, now);
                self.settled = None;
                busy = true;
            }
            self.finish_closes(now);
            self.end_round();
            busy
        }
    }

    /// Polls the firmware unless it is settled (see [`UnitLoop::settled`]) and nothing
    /// brought it work since. Returns whether the poll did anything.
    fn poll_firmware(&mut self, now: Instant) -> bool {
        let quiet = self
            .settled
            .is_some_and(|deadline| deadline.is_none_or(|at| now < at));
        if quiet && !self.nic.host_work_waiting() {
            return false;
        }
        let busy = self.nic.poll(now);
        // A send the socket refused (`Wire::blocked`) is tried again by the next poll.
        self.settled = (!busy && !self.nic.hal().wire.blocked).then(|| self.nic.poll_at());
        busy
    }

    /// What a round owes the world at its end: the bytes of a put it held, the datagrams it
    /// batched, and one doorbell per sleeping process that got events.
    fn end_round(&mut self) {
        let hal = self.nic.hal_mut();
        hal.flush_writes();
        hal.wire.flush_udp();
        hal.ring_host_doorbells();
    }

    /// Whether work arrived that the unit's last round did not see: a packet in its inbox, a
    /// token a process posted, a packet it sent itself. Called with the sleeping flags up, so
    /// that what is published later rings a doorbell.
    pub(crate) fn has_late_work(&mut self) -> bool {
        if self.stopped {
            return false;
        }
        if !self.inbox.is_empty() {
            return true;
        }
        if self.dormant {
            return false;
        }
        let now = self.now();
        let polled = self.poll_firmware(now);
        self.end_round();
        polled || !self.nic.hal().wire.loopback.is_empty()
    }

    /// How long the unit may sleep: until the firmware's or the wire's next deadline, `None` for
    /// as long as nothing arrives. Zero only when a deadline came due since the last round's poll
    /// (after a poll the firmware names no deadline in the past: `Nic::poll_at`).
    pub(crate) fn sleep_timeout(&mut self) -> Option<Duration> {
        let now = self.now();
        let wire = &self.nic.hal().wire;
        let deadline = firmware::time::earliest(self.nic.poll_at(), wire.next_release());
        let timeout =
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
        match (timeout, recheck) {
            (Some(t), Some(r)) => Some(t.min(r)),
            (t, None) => t,
            (None, r) => r,
        }
    }

    /// Raises or lowers the sleeping flag of every open port's send and receive ring (the NIC is
    /// their consumer), so processes ring the doorbell only while the NIC sleeps.
    pub(crate) fn set_sleeping(&self, sleeping: bool) {
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
            thread: self.thread,
            idle: format!(
                "{}{}",
                self.idle,
                match (self.idle, self.polling) {
                    (IdlePolicy::Adaptive, true) => " (polling)",
                    (IdlePolicy::Adaptive, false) => " (sleeping)",
                    _ => "",
                }
            ),
            thread_cpu_ns: thread_cpu_time(),
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

/// CPU time the calling thread has used, in nanoseconds.
fn thread_cpu_time() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| Duration::from(t).as_nanos() as u64)
        .unwrap_or(0)
}
