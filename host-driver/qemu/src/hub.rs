//! The hub: one thread that carries everything between the QEMU NICs and the host once ports are
//! open — the UARTs (console text and doorbell bytes from the firmware), the NICs' doorbell
//! eventfds (rung by processes), and the switch that moves packets between the NICs' wire rings.
//!
//! It sleeps in `epoll_wait` whenever there is nothing to move: before it does, it raises the
//! sleeping flag of every transmit ring it consumes and looks once more, so a NIC that transmits
//! afterwards sends [`DOORBELL_WIRE`] on its UART. While a receive ring is full the switch holds
//! the packets for it (in order, up to [`HOLD_LIMIT`] per NIC) and looks again every millisecond;
//! beyond that it drops them, which the firmware's retransmission recovers.
//!
//! It also serves the firmware's accesses to the memory of port owners
//! ([`Machine::serve_memory_access`]): the firmware spins while it waits, so the hub serves an
//! access as soon as its [`DOORBELL_MEMORY`] byte arrives, and looks for one on every turn of its
//! loop besides.

use std::collections::VecDeque;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use shared_abi::ids::{NodeId, PORTS_PER_NIC};
use shared_abi::packet::MAX_WIRE_LEN;
use shared_abi::qemu::layout::{
    DOORBELL_MAILBOX, DOORBELL_MEMORY, DOORBELL_PORT_EVENT, DOORBELL_WIRE, MEMORY_BOUNCE_LEN,
    WIRE_RECEIVE, WIRE_RING_ENTRIES, WIRE_TRANSMIT,
};
use shared_abi::qemu::wire::{PacketConsumer, PacketProducer, WireError};
use shared_abi::ring::RingError;

use super::machine::Machine;
use nicbar_control::doorbell;

/// Packets the switch holds for one NIC whose receive ring is full.
pub const HOLD_LIMIT: usize = 256;
/// Console lines kept per NIC for reports.
const CONSOLE_LINES: usize = 32;
/// Longest console line kept; longer ones are cut.
const CONSOLE_LINE_MAX: usize = 512;

const STOP: u64 = u64::MAX;
const DOORBELL_BASE: u64 = 1 << 32;

/// What the switch did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Packets moved from a transmit ring into a receive ring.
    pub moved: u64,
    /// Packets that waited for room in a full receive ring.
    pub held: u64,
    /// Packets dropped because a NIC's receive ring and hold queue were full.
    pub dropped_full: u64,
    /// Packets for a node that is not on the fabric.
    pub no_route: u64,
    /// Packets held for a NIC whose QEMU exited, dropped.
    pub dropped_down: u64,
    /// Transmit-ring slots with an impossible length, or broken ring indexes.
    pub bad_slots: u64,
}

/// The NICs' console lines: echoed as they come (if asked) and the last few kept.
#[derive(Debug)]
pub(crate) struct Console {
    echo: bool,
    /// The node id of each unit, to label its lines.
    node_ids: Vec<u16>,
    lines: Mutex<Vec<VecDeque<String>>>,
}

impl Console {
    /// The console of NICs whose units have these node ids.
    pub(crate) fn new(node_ids: Vec<u16>, echo: bool) -> Self {
        Self {
            echo,
            lines: Mutex::new(vec![VecDeque::new(); node_ids.len()]),
            node_ids,
        }
    }

    fn push(&self, node: usize, line: String) {
        if self.echo {
            let id = self.node_ids.get(node).copied().unwrap_or(node as u16);
            println!("node {id}: {line}");
        }
        let mut lines = self
            .lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(kept) = lines.get_mut(node) {
            if kept.len() == CONSOLE_LINES {
                kept.pop_front();
            }
            kept.push_back(line);
        }
    }
}

/// What the hub starts from.
pub(crate) struct HubSetup {
    pub(crate) machines: Vec<Arc<Machine>>,
    /// The UART stream of each machine, in node order.
    pub(crate) uarts: Vec<UnixStream>,
    /// Rung to stop the hub; the caller keeps it open while the hub runs.
    pub(crate) stop: Arc<OwnedFd>,
    pub(crate) console: Arc<Console>,
}

/// Starts the hub thread. It returns the switch's counters when the stop doorbell rings.
///
/// # Errors
/// The epoll instance or the thread could not be created.
pub(crate) fn spawn(setup: HubSetup) -> io::Result<JoinHandle<SwitchCounters>> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
    epoll.add(&*setup.stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
    for (index, (machine, uart)) in setup.machines.iter().zip(&setup.uarts).enumerate() {
        uart.set_nonblocking(true)?;
        epoll.add(
            uart,
            EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, index as u64),
        )?;
        epoll.add(
            &*machine.nic_doorbell,
            EpollEvent::new(EpollFlags::EPOLLIN, DOORBELL_BASE + index as u64),
        )?;
    }
    let nodes = setup.machines.len();
    let hub = Hub {
        switch: Switch::new(nodes),
        lines: vec![Vec::new(); nodes],
        uarts: setup.uarts.into_iter().map(Some).collect(),
        machines: setup.machines,
        console: setup.console,
        epoll,
        scratch: Box::new([0; MEMORY_BOUNCE_LEN]),
    };
    std::thread::Builder::new()
        .name("qemu-hub".to_owned())
        .spawn(move || hub.run())
}

struct Hub {
    machines: Vec<Arc<Machine>>,
    uarts: Vec<Option<UnixStream>>,
    lines: Vec<Vec<u8>>,
    console: Arc<Console>,
    epoll: Epoll,
    switch: Switch,
    /// A bounce buffer's worth, for copying between a guest and a process.
    scratch: Box<[u8; MEMORY_BOUNCE_LEN]>,
}

impl Hub {
    fn run(mut self) -> SwitchCounters {
        let mut events = [EpollEvent::empty(); 32];
        loop {
            self.serve_memory_accesses();
            if self.switch.run(&self.machines) {
                // Keep moving while there is traffic; the UARTs and doorbells are looked at
                // without waiting.
                if !self.serve(&mut events, EpollTimeout::ZERO) {
                    break;
                }
                continue;
            }
            self.switch.set_sleeping(&self.machines, true);
            // Flags up: a packet published from now on comes with a doorbell; one published
            // before is seen here.
            let timeout = if self.switch.any_available(&self.machines) {
                EpollTimeout::ZERO
            } else if self.switch.holding() {
                EpollTimeout::from(1u8)
            } else {
                EpollTimeout::NONE
            };
            let go_on = self.serve(&mut events, timeout);
            self.switch.set_sleeping(&self.machines, false);
            if !go_on {
                break;
            }
        }
        self.switch.counters
    }

    /// Waits up to `timeout` and serves what is ready. `false` when told to stop.
    fn serve(&mut self, events: &mut [EpollEvent], timeout: EpollTimeout) -> bool {
        let ready = match self.epoll.wait(events, timeout) {
            Ok(ready) => ready,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(error) => {
                eprintln!("nicctl qemu: hub: epoll failed: {error}");
                return false;
            }
        };
        for event in &events[..ready] {
            match event.data() {
                STOP => {
                    // Drain what the NICs wrote while powering off, then stop.
                    for node in 0..self.uarts.len() {
                        self.read_uart(node);
                    }
                    return false;
                }
                token if token >= DOORBELL_BASE => {
                    let index = (token - DOORBELL_BASE) as usize;
                    if let Some(machine) = self.machines.get(index) {
                        doorbell::drain(&*machine.nic_doorbell);
                        machine.wake_if_sleeping();
                    }
                }
                token => self.read_uart(token as usize),
            }
        }
        true
    }

    /// Serves every process-memory access that waits (a NIC has at most one).
    fn serve_memory_accesses(&mut self) {
        for machine in &self.machines {
            machine.serve_memory_access(&mut self.scratch);
        }
    }

    /// Reads what NIC `node`'s UART has: text goes to the console, doorbell codes are acted on.
    fn read_uart(&mut self, node: usize) {
        let mut buffer = [0u8; 4096];
        loop {
            let Some(Some(stream)) = self.uarts.get_mut(node) else {
                return;
            };
            match stream.read(&mut buffer) {
                Ok(0) => {
                    // QEMU exited (its end of the socket closed).
                    if let Some(stream) = self.uarts.get_mut(node).and_then(Option::take) {
                        let _ = self.epoll.delete(&stream);
                    }
                    self.flush_line(node);
                    return;
                }
                Ok(n) => {
                    for &byte in &buffer[..n] {
                        self.uart_byte(node, byte);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    fn uart_byte(&mut self, node: usize, byte: u8) {
        match byte {
            b'\n' => self.flush_line(node),
            b'\r' => {}
            0x20..=0x7e | b'\t' => {
                if let Some(line) = self.lines.get_mut(node)
                    && line.len() < CONSOLE_LINE_MAX
                {
                    line.push(byte);
                }
            }
            DOORBELL_MEMORY => {
                if let Some(machine) = self.machines.get(node) {
                    machine.serve_memory_access(&mut self.scratch);
                }
            }
            DOORBELL_WIRE | DOORBELL_MAILBOX => {
                // The switch runs on every turn of the loop; the control thread polls for
                // answers. The byte's work was to end the wait.
            }
            code if code & 0xf8 == DOORBELL_PORT_EVENT => {
                let port = usize::from(code & 0x07);
                if port < PORTS_PER_NIC
                    && let Some(machine) = self.machines.get(node)
                {
                    machine.ring_host(port);
                }
            }
            _ => {}
        }
    }

    fn flush_line(&mut self, node: usize) {
        let Some(line) = self.lines.get_mut(node) else {
            return;
        };
        if line.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(line).into_owned();
        line.clear();
        self.console.push(node, text);
    }
}

/// The switch: one consumer per transmit ring, one producer per receive ring, and the packets
/// waiting for a full receive ring.
struct Switch {
    transmit: Vec<PacketConsumer>,
    receive: Vec<PacketProducer>,
    held: Vec<VecDeque<(NodeId, Vec<u8>)>>,
    delivered: Vec<bool>,
    buffer: Box<[u8; MAX_WIRE_LEN]>,
    counters: SwitchCounters,
}

impl Switch {
    fn new(nodes: usize) -> Self {
        Self {
            transmit: (0..nodes)
                .map(|_| PacketConsumer::new(WIRE_TRANSMIT))
                .collect(),
            receive: (0..nodes)
                .map(|_| PacketProducer::new(WIRE_RECEIVE))
                .collect(),
            held: vec![VecDeque::new(); nodes],
            delivered: vec![false; nodes],
            buffer: Box::new([0; MAX_WIRE_LEN]),
            counters: SwitchCounters::default(),
        }
    }

    /// Moves every packet it can, and wakes the receivers that sleep. Returns whether it moved
    /// anything.
    fn run(&mut self, machines: &[Arc<Machine>]) -> bool {
        let mut moved = false;
        for destination in 0..machines.len() {
            moved |= self.release_held(machines, destination);
        }
        for (source, machine) in machines.iter().enumerate() {
            let shared = machine.shared();
            for _ in 0..WIRE_RING_ENTRIES {
                let Some(consumer) = self.transmit.get_mut(source) else {
                    break;
                };
                match consumer.pop(&shared, &mut self.buffer) {
                    Ok(Some(taken)) => {
                        moved = true;
                        let packet = self.buffer[..taken.length].to_vec();
                        self.deliver(machines, source, taken.node, packet);
                    }
                    Ok(None) => break,
                    Err(WireError::BadLength { .. }) => self.counters.bad_slots += 1,
                    Err(WireError::Ring(_)) => {
                        self.counters.bad_slots += 1;
                        let _ = consumer.resynchronise(&shared);
                        break;
                    }
                }
            }
        }
        for (destination, machine) in machines.iter().enumerate() {
            if std::mem::take(&mut self.delivered[destination])
                && self.receive[destination]
                    .consumer_wants_doorbell(&machine.shared())
                    .unwrap_or(true)
            {
                machine.wake();
            }
        }
        moved
    }

    /// Pushes `packet` from node `source` toward `destination`, behind whatever waits for it.
    fn deliver(
        &mut self,
        machines: &[Arc<Machine>],
        source: usize,
        destination: NodeId,
        packet: Vec<u8>,
    ) {
        let index = usize::from(destination.get());
        let Some(machine) = machines.get(index) else {
            self.counters.no_route += 1;
            return;
        };
        let source = NodeId::new(source as u16);
        if self.held[index].is_empty() {
            match self.receive[index].push(&machine.shared(), source, &packet) {
                Ok(()) => {
                    self.counters.moved += 1;
                    self.delivered[index] = true;
                    return;
                }
                Err(RingError::Full) => {}
                Err(_) => {
                    self.counters.bad_slots += 1;
                    return;
                }
            }
        }
        if self.held[index].len() < HOLD_LIMIT {
            self.counters.held += 1;
            self.held[index].push_back((source, packet));
        } else {
            self.counters.dropped_full += 1;
        }
    }

    /// Moves held packets into `destination`'s receive ring while it has room; drops them if
    /// its QEMU exited (nothing will make room).
    fn release_held(&mut self, machines: &[Arc<Machine>], destination: usize) -> bool {
        let Some(machine) = machines.get(destination) else {
            return false;
        };
        if !self.held[destination].is_empty() && machine.exited().is_some() {
            self.counters.dropped_down += self.held[destination].len() as u64;
            self.held[destination].clear();
            return false;
        }
        let shared = machine.shared();
        let mut moved = false;
        while let Some((source, packet)) = self.held[destination].front() {
            match self.receive[destination].push(&shared, *source, packet) {
                Ok(()) => {
                    self.held[destination].pop_front();
                    self.counters.moved += 1;
                    self.delivered[destination] = true;
                    moved = true;
                }
                Err(RingError::Full) => break,
                Err(_) => {
                    self.held[destination].pop_front();
                    self.counters.bad_slots += 1;
                }
            }
        }
        moved
    }

    fn holding(&self) -> bool {
        self.held.iter().any(|queue| !queue.is_empty())
    }

    fn any_available(&self, machines: &[Arc<Machine>]) -> bool {
        self.transmit
            .iter()
            .zip(machines)
            .any(|(consumer, machine)| {
                consumer
                    .available(&machine.shared())
                    .map_or(true, |n| n > 0)
            })
    }

    fn set_sleeping(&self, machines: &[Arc<Machine>], sleeping: bool) {
        for (consumer, machine) in self.transmit.iter().zip(machines) {
            let _ = consumer.set_sleeping(&machine.shared(), sleeping);
        }
    }
}
