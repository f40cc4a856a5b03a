//! The control thread of a QEMU fabric: the emulator's control protocol
//! ([`crate::emulator::protocol`]) over the same kind of socket, so `nicbar::Port::open_at` and
//! `nicctl status` work unchanged.
//!
//! Each connection owns at most one port for as long as it stays open; when it closes (the
//! process closed the port, exited or died) the port is closed in the NIC. Opening and closing
//! go through the NIC's mailbox ([`super::machine::Machine::open_port`]), which waits for the
//! firmware's answer with a bound.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{getsockopt, sockopt};
use shared_abi::ids::PORTS_PER_NIC;

use super::machine::{Machine, region_layout};
use crate::emulator::protocol::{
    self, ControlError, FrameReader, NicReport, OpenedPort, PortReport, Reply, Request,
    StatusReport, UnitStatus, WireCounters,
};

/// How long a process may take to accept a reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

const STOP: u64 = 0;
const LISTENER: u64 = 1;
const FIRST_CLIENT: u64 = 2;

struct Client {
    stream: UnixStream,
    pid: u32,
    reader: FrameReader,
    /// The (unit, port) this connection owns.
    port: Option<(u8, u8)>,
}

/// An open port: who owns it, which incarnation.
#[derive(Clone, Copy)]
struct Owner {
    pid: u32,
    generation: u32,
}

pub(crate) struct Control {
    listener: UnixListener,
    /// Kept open while the epoll instance watches it.
    _stop: Arc<OwnedFd>,
    machines: Vec<Arc<Machine>>,
    epoll: Epoll,
    clients: HashMap<u64, Client>,
    owners: Vec<[Option<Owner>; PORTS_PER_NIC]>,
    next_client: u64,
}

impl Control {
    pub(crate) fn new(
        listener: UnixListener,
        stop: Arc<OwnedFd>,
        machines: Vec<Arc<Machine>>,
    ) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
        listener.set_nonblocking(true)?;
        epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
        let owners = vec![[None; PORTS_PER_NIC]; machines.len()];
        Ok(Self {
            listener,
            _stop: stop,
            machines,
            epoll,
            clients: HashMap::new(),
            owners,
            next_client: FIRST_CLIENT,
        })
    }

    /// Serves until the stop doorbell rings. The stop doorbell is left ringing for the hub.
    pub(crate) fn run(mut self) {
        let mut events = [EpollEvent::empty(); 32];
        loop {
            let ready = match self.epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(ready) => ready,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(error) => {
                    eprintln!("nicctl qemu: control loop: epoll failed: {error}");
                    break;
                }
            };
            let mut stop = false;
            for event in &events[..ready] {
                match event.data() {
                    STOP => stop = true,
                    LISTENER => self.accept_all(),
                    client => self.serve_client(client, event.events()),
                }
            }
            if stop {
                break;
            }
        }
    }

    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    eprintln!("nicctl qemu: accept failed: {error}");
                    return;
                }
            };
            let pid = getsockopt(&stream, sockopt::PeerCredentials)
                .map(|credentials| credentials.pid() as u32)
                .unwrap_or(0);
            let token = self.next_client;
            self.next_client += 1;
            let registered = stream.set_nonblocking(true).is_ok()
                && self
                    .epoll
                    .add(
                        &stream,
                        EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP, token),
                    )
                    .is_ok();
            if registered {
                self.clients.insert(
                    token,
                    Client {
                        stream,
                        pid,
                        reader: FrameReader::new(),
                        port: None,
                    },
                );
            }
        }
    }

    fn serve_client(&mut self, token: u64, flags: EpollFlags) {
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        let mut gone = matches!(
            client.reader.fill(&client.stream),
            Ok(protocol::Fill::Closed) | Err(_)
        );
        gone |= flags.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR);
        let mut requests = Vec::new();
        loop {
            match client.reader.next_frame() {
                // Descriptors a process sends are closed unread.
                Ok(Some((body, _fds))) => requests.push(protocol::decode::<Request>(&body)),
                Ok(None) => break,
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        for request in requests {
            let (reply, fds) = match request {
                Ok(request) => self.handle(token, request),
                Err(error) => (
                    Reply::Error(ControlError::BadRequest(error.to_string())),
                    Vec::new(),
                ),
            };
            if !self.reply(token, &reply, &fds) {
                gone = true;
                break;
            }
        }
        if gone {
            self.disconnect(token);
        }
    }

    fn reply(&mut self, token: u64, reply: &Reply, fds: &[OwnedFd]) -> bool {
        let Some(client) = self.clients.get(&token) else {
            return false;
        };
        let Ok(frame) = protocol::encode(reply) else {
            return false;
        };
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        protocol::write_frame(
            &client.stream,
            &frame,
            &borrowed,
            Instant::now() + WRITE_TIMEOUT,
        )
        .is_ok()
    }

    fn handle(&mut self, token: u64, request: Request) -> (Reply, Vec<OwnedFd>) {
        match request {
            Request::OpenPort {
                unit,
                port,
                abi_version,
            } => match self.open(token, unit, port, abi_version) {
                Ok((opened, fds)) => (Reply::Opened(opened), fds),
                Err(error) => (Reply::Error(error), Vec::new()),
            },
            Request::ClosePort => match self.close(token) {
                Ok(()) => (Reply::Closed, Vec::new()),
                Err(error) => (Reply::Error(error), Vec::new()),
            },
            Request::Status => (Reply::Status(self.status()), Vec::new()),
        }
    }

    fn open(
        &mut self,
        token: u64,
        unit: u8,
        port: u8,
        abi_version: u32,
    ) -> Result<(OpenedPort, Vec<OwnedFd>), ControlError> {
        if abi_version != shared_abi::ABI_VERSION {
            return Err(ControlError::AbiMismatch {
                daemon: shared_abi::ABI_VERSION,
                client: abi_version,
            });
        }
        let client = self
            .clients
            .get(&token)
            .ok_or_else(|| ControlError::Internal("the connection is gone".to_owned()))?;
        if let Some((unit, port)) = client.port {
            return Err(ControlError::AlreadyOwnsPort { unit, port });
        }
        let pid = client.pid;
        let machine = self
            .machines
            .get(usize::from(unit))
            .ok_or(ControlError::NoSuchUnit {
                unit,
                units: self.machines.len() as u8,
            })?;
        let index = usize::from(port);
        if index >= PORTS_PER_NIC {
            return Err(ControlError::NoSuchPort {
                port,
                ports: PORTS_PER_NIC as u8,
            });
        }
        if let Some(owner) = self.owners[usize::from(unit)][index] {
            return Err(ControlError::PortBusy {
                unit,
                port,
                owner_pid: owner.pid,
            });
        }
        let (generation, fds) = machine
            .open_port(unit, port)
            .map_err(|reason| ControlError::OpenFailed { unit, port, reason })?;
        self.owners[usize::from(unit)][index] = Some(Owner {
            pid,
            generation: generation.get(),
        });
        if let Some(client) = self.clients.get_mut(&token) {
            client.port = Some((unit, port));
        }
        let opened = OpenedPort {
            unit,
            port,
            node: machine.node,
            generation: generation.get(),
            region_len: region_layout().region_len as u64,
        };
        Ok((opened, fds))
    }

    fn close(&mut self, token: u64) -> Result<(), ControlError> {
        let (unit, port) = self
            .clients
            .get_mut(&token)
            .and_then(|client| client.port.take())
            .ok_or(ControlError::NoPortOwned)?;
        self.release(unit, port)
            .map_err(|reason| ControlError::Internal(format!("unit {unit} port {port}: {reason}")))
    }

    /// Frees the port in the owner table and has its NIC close it.
    fn release(&mut self, unit: u8, port: u8) -> Result<(), String> {
        if let Some(slot) = self
            .owners
            .get_mut(usize::from(unit))
            .and_then(|ports| ports.get_mut(usize::from(port)))
        {
            *slot = None;
        }
        match self.machines.get(usize::from(unit)) {
            Some(machine) => machine.close_port(port),
            None => Ok(()),
        }
    }

    fn disconnect(&mut self, token: u64) {
        let Some(client) = self.clients.remove(&token) else {
            return;
        };
        let _ = self.epoll.delete(&client.stream);
        if let Some((unit, port)) = client.port
            && let Err(reason) = self.release(unit, port)
        {
            eprintln!("nicctl qemu: closing port {port} of unit {unit}: {reason}");
        }
    }

    /// The fabric's state in the emulator's report shape: ports with owners and generations,
    /// the firmware's counters, and the wire as the NIC counts it. Per-port internals and
    /// per-connection counters stay inside the guest and read as zero / empty.
    fn status(&self) -> StatusReport {
        let units = self
            .machines
            .iter()
            .enumerate()
            .map(|(unit, machine)| {
                let report = machine.report();
                let counters = report.counters;
                let ports = self.owners[unit]
                    .iter()
                    .enumerate()
                    .filter_map(|(port, owner)| {
                        owner.map(|owner| PortReport {
                            port: port as u8,
                            generation: owner.generation,
                            owner_pid: Some(owner.pid),
                            held_sends: 0,
                            receive_buffers: 0,
                            barrier_running: false,
                            pending_events: 0,
                            faulted: None,
                        })
                    })
                    .collect();
                UnitStatus {
                    unit: unit as u8,
                    node: machine.node,
                    address: None,
                    ports,
                    connections: Vec::new(),
                    counters: NicReport {
                        malformed_packets: u64::from(counters.malformed_packets.get()),
                        no_connection: 0,
                        tokens_rejected: u64::from(counters.tokens_rejected.get()),
                        barriers_completed: u64::from(counters.barriers_completed.get()),
                        barriers_failed: u64::from(counters.barriers_failed.get()),
                        messages_delivered: u64::from(counters.messages_delivered.get()),
                    },
                    wire: WireCounters {
                        transmitted: u64::from(counters.packets_transmitted.get()),
                        received: u64::from(counters.packets_received.get()),
                        undeliverable: u64::from(counters.transmit_full.get()),
                        ..WireCounters::default()
                    },
                }
            })
            .collect();
        StatusReport {
            daemon_pid: std::process::id(),
            fault_seed: None,
            units,
        }
    }
}
