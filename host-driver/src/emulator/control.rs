//! The control thread: accepts processes on the daemon's Unix socket, opens and closes ports for
//! them (the driver's only job, as in GM), and answers status requests.
//!
//! Each connection owns at most one port, for as long as it stays open. The thread learns a
//! process is gone from its connection — end of stream or hang-up, whether the process closed the
//! port, exited or was killed — and closes the port in the NIC, whose firmware then tells the
//! peers. Replies are written with a short deadline, so a process that stops reading cannot stall
//! the daemon; it loses its connection (and its port) instead.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{getsockopt, sockopt};
use shared_abi::ids::{Generation, PORTS_PER_NIC, PortId};
use shared_abi::region::RegionLayout;

use super::RegionShape;
use super::doorbell;
use super::hal::AttachedPort;
use super::protocol::{self, ControlError, FrameReader, OpenedPort, Reply, Request, StatusReport};
use super::sys::Mapping;
use super::unit::{Command, UnitHandle};

/// How long the control thread waits for a NIC thread to answer.
const UNIT_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a process may take to accept a reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

const STOP: u64 = 0;
const LISTENER: u64 = 1;
const FIRST_CLIENT: u64 = 2;

/// Everything the control thread starts from.
pub(crate) struct ControlSetup {
    pub(crate) listener: UnixListener,
    pub(crate) stop: Arc<OwnedFd>,
    pub(crate) units: Vec<UnitHandle>,
    pub(crate) region: RegionShape,
    pub(crate) fault_seed: Option<u64>,
}

struct Client {
    stream: UnixStream,
    pid: u32,
    reader: FrameReader,
    /// The (unit, port) this connection owns.
    port: Option<(u8, u8)>,
}

pub(crate) struct Control {
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    units: Vec<UnitHandle>,
    region: RegionShape,
    fault_seed: Option<u64>,
    epoll: Epoll,
    clients: HashMap<u64, Client>,
    /// The process id owning each (unit, port).
    owners: Vec<[Option<u32>; PORTS_PER_NIC]>,
    next_client: u64,
}

impl Control {
    pub(crate) fn new(setup: ControlSetup) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*setup.stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
        setup.listener.set_nonblocking(true)?;
        epoll.add(
            &setup.listener,
            EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
        )?;
        let owners = vec![[None; PORTS_PER_NIC]; setup.units.len()];
        Ok(Self {
            listener: setup.listener,
            stop: setup.stop,
            units: setup.units,
            region: setup.region,
            fault_seed: setup.fault_seed,
            epoll,
            clients: HashMap::new(),
            owners,
            next_client: FIRST_CLIENT,
        })
    }

    /// Serves until the stop doorbell rings; then stops the NIC threads.
    pub(crate) fn run(mut self) {
        let mut events = [EpollEvent::empty(); 32];
        loop {
            let ready = match self.epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(ready) => ready,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(error) => {
                    eprintln!("nicctl emulate: control loop: epoll failed: {error}");
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
                doorbell::drain(&*self.stop);
                break;
            }
        }
        for unit in self.units.iter_mut() {
            unit.stop();
        }
    }

    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // Out of descriptors, most likely: the waiting process gets nothing now and
                    // may retry; the daemon goes on.
                    eprintln!("nicctl emulate: accept failed: {error}");
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
                // Descriptors a process sends the daemon are closed unread.
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
        let handle = self
            .units
            .get(usize::from(unit))
            .ok_or(ControlError::NoSuchUnit {
                unit,
                units: self.units.len() as u8,
            })?;
        let port_id = PortId(port);
        let index = port_id.index().ok_or(ControlError::NoSuchPort {
            port,
            ports: PORTS_PER_NIC as u8,
        })?;
        if let Some(owner_pid) = self.owners[usize::from(unit)][index] {
            return Err(ControlError::PortBusy {
                unit,
                port,
                owner_pid,
            });
        }
        let failed = |reason: String| ControlError::OpenFailed { unit, port, reason };
        let shape = self.region;
        let layout = RegionLayout::standard(
            shape.send_entries,
            shape.receive_entries,
            shape.event_entries,
            shape.arena_len,
        );
        let header = layout.header(handle.node, port_id, unit, Generation::new(0));
        let (mapping, region_fd) = Mapping::create(
            &format!("nicbar-unit{unit}-port{port}"),
            layout.region_len,
            &header,
        )
        .map_err(|error| failed(format!("cannot create the region: {error}")))?;
        let host_doorbell = doorbell::new()
            .map_err(|error| failed(format!("cannot create the doorbell: {error}")))?;
        let nic_host_doorbell = host_doorbell
            .try_clone()
            .map_err(|error| failed(format!("cannot duplicate the doorbell: {error}")))?;
        let nic_doorbell = handle
            .wake
            .try_clone()
            .map_err(|error| failed(format!("cannot duplicate the NIC doorbell: {error}")))?;
        let (reply, answer) = mpsc::channel();
        let attached = AttachedPort {
            mapping,
            layout,
            host_doorbell: nic_host_doorbell,
        };
        if !handle.send(Command::Open {
            port: port_id,
            attached,
            reply,
        }) {
            return Err(ControlError::Internal(format!(
                "NIC unit {unit} has stopped"
            )));
        }
        let generation = answer
            .recv_timeout(UNIT_REPLY_TIMEOUT)
            .map_err(|_| ControlError::Internal(format!("NIC unit {unit} did not answer")))?
            .map_err(|error| failed(error.to_string()))?;
        self.owners[usize::from(unit)][index] = Some(pid);
        if let Some(client) = self.clients.get_mut(&token) {
            client.port = Some((unit, port));
        }
        let opened = OpenedPort {
            unit,
            port,
            node: handle.node.get(),
            generation: generation.get(),
            region_len: layout.region_len as u64,
        };
        Ok((opened, vec![region_fd, host_doorbell, nic_doorbell]))
    }

    fn close(&mut self, token: u64) -> Result<(), ControlError> {
        let (unit, port) = self
            .clients
            .get_mut(&token)
            .and_then(|client| client.port.take())
            .ok_or(ControlError::NoPortOwned)?;
        let (reply, answer) = mpsc::channel();
        self.release(unit, port, Some(reply));
        answer
            .recv_timeout(UNIT_REPLY_TIMEOUT)
            .map_err(|_| ControlError::Internal(format!("NIC unit {unit} did not answer")))
    }

    /// Frees the port in the owner table and tells its NIC to close it.
    fn release(&mut self, unit: u8, port: u8, reply: Option<mpsc::Sender<()>>) {
        if let Some(slot) = self
            .owners
            .get_mut(usize::from(unit))
            .and_then(|ports| ports.get_mut(usize::from(port)))
        {
            *slot = None;
        }
        if let Some(handle) = self.units.get(usize::from(unit)) {
            handle.send(Command::Close {
                port: PortId(port),
                reply,
            });
        }
    }

    fn disconnect(&mut self, token: u64) {
        let Some(client) = self.clients.remove(&token) else {
            return;
        };
        let _ = self.epoll.delete(&client.stream);
        if let Some((unit, port)) = client.port {
            self.release(unit, port, None);
        }
    }

    fn status(&self) -> StatusReport {
        let mut units = Vec::new();
        for handle in &self.units {
            let (reply, answer) = mpsc::channel();
            if !handle.send(Command::Status { reply }) {
                continue;
            }
            let Ok(mut status) = answer.recv_timeout(UNIT_REPLY_TIMEOUT) else {
                continue;
            };
            for port in status.ports.iter_mut() {
                port.owner_pid = self
                    .owners
                    .get(usize::from(handle.unit))
                    .and_then(|ports| ports.get(usize::from(port.port)))
                    .copied()
                    .flatten();
            }
            units.push(status);
        }
        StatusReport {
            daemon_pid: std::process::id(),
            fault_seed: self.fault_seed,
            units,
        }
    }
}
