//! The control socket's server, one for every kind of NIC behind it: accepts processes on the
//! Unix socket, reads their requests ([`super::protocol`]), keeps which process owns which port,
//! and answers. What opening, closing and reporting a port means is the [`PortBackend`]'s: the
//! emulator's NIC threads ([`super::control`]) or QEMU NICs (`crate::qemu::control`).
//!
//! Each connection owns at most one port, for as long as it stays open. The server learns a
//! process is gone from its connection — end of stream or hang-up, whether the process closed the
//! port, exited or was killed — and has the backend close the port, whose firmware then tells the
//! peers. A port's owner is the connecting process as the kernel names it (`SO_PEERCRED`).
//! Replies are written with a short deadline, so a process that stops reading cannot stall the
//! server; it loses its connection (and its port) instead.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{getsockopt, sockopt};
use shared_abi::ids::{PORTS_PER_NIC, PortId};

use super::protocol::{
    self, ControlError, FrameReader, OpenedPort, Reply, Request, StatusReport, UnitStatus,
};

/// How long a process may take to accept a reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

const STOP: u64 = 0;
const LISTENER: u64 = 1;
const FIRST_CLIENT: u64 = 2;

/// The NICs behind a control server: what it asks of them for each request.
///
/// The server has checked what it can before it calls: the ABI version, that the unit and port
/// exist, that the port is free and that the connection owns no other port.
pub(crate) trait PortBackend {
    /// How the server names itself in the lines it logs (`nicctl emulate`).
    const LOG_NAME: &'static str;

    /// How many units there are, numbered from 0; fixed for the server's life.
    fn unit_count(&self) -> usize;

    /// Opens `port` of `unit` for a process.
    ///
    /// Returns the reply and the descriptors passed with it: the port's region, the host
    /// doorbell and the NIC doorbell.
    ///
    /// # Errors
    /// The reply the process gets instead, naming what failed.
    fn open_port(&self, unit: u8, port: u8) -> Result<(OpenedPort, Vec<OwnedFd>), ControlError>;

    /// Closes `port` of `unit` because its owner asked to; returns once the NIC has closed it.
    ///
    /// # Errors
    /// The reply the process gets instead, naming what failed.
    fn close_port(&self, unit: u8, port: u8) -> Result<(), ControlError>;

    /// Closes `port` of `unit` because its owner asked to, answering through `done` once the NIC
    /// has closed it — for an orderly close, once it has finished what the process posted, which
    /// may take a while: the server serves others meanwhile. By default, [`PortBackend::close_port`]
    /// and answer at once.
    fn close_port_later(&self, unit: u8, port: u8, done: CloseReply) {
        done.send(self.close_port(unit, port));
    }

    /// Closes `port` of `unit` because its owner's connection ended; nobody waits for the answer.
    fn abandon_port(&self, unit: u8, port: u8);

    /// Every unit's status, with each open port's owner taken from `owners` (indexed by unit,
    /// then port).
    fn unit_status(&self, owners: &[PortOwners]) -> Vec<UnitStatus>;

    /// The fault injector's seed, if one is on.
    fn fault_seed(&self) -> Option<u64>;

    /// Called once as the server ends, after the stop doorbell `stop` rang (or epoll failed).
    fn shut_down(&mut self, stop: &OwnedFd);
}

/// The answer to a close request, to be written when the close is done (from any thread). Dropped
/// unsent, it answers with an internal error, so a process never waits for nothing.
#[derive(Debug)]
pub(crate) struct CloseReply {
    stream: Option<UnixStream>,
}

impl CloseReply {
    /// Writes `result` to the process that asked (with the server's write deadline).
    pub(crate) fn send(mut self, result: Result<(), ControlError>) {
        self.write(result);
    }

    fn write(&mut self, result: Result<(), ControlError>) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        let reply = match result {
            Ok(()) => Reply::Closed,
            Err(error) => Reply::Error(error),
        };
        if let Ok(frame) = protocol::encode(&reply) {
            // The process may be gone by now; then nobody is left to tell.
            let _ = protocol::write_frame(&stream, &frame, &[], Instant::now() + WRITE_TIMEOUT);
        }
    }
}

impl Drop for CloseReply {
    fn drop(&mut self) {
        self.write(Err(ControlError::Internal(
            "the NIC stopped before the port finished closing".to_owned(),
        )));
    }
}

/// Who holds an open port, and which incarnation of it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortOwner {
    /// The owning process, as `SO_PEERCRED` named it (0 if the kernel would not say).
    pub(crate) pid: u32,
    /// The generation the port was opened with.
    pub(crate) generation: u32,
}

/// One unit's ports: the owner of each open one.
pub(crate) type PortOwners = [Option<PortOwner>; PORTS_PER_NIC];

struct Client {
    stream: UnixStream,
    pid: u32,
    reader: FrameReader,
    /// The (unit, port) this connection owns.
    port: Option<(u8, u8)>,
}

/// A control socket's server over the NICs of backend `B`; runs on a thread of its own.
pub(crate) struct ControlServer<B> {
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    backend: B,
    epoll: Epoll,
    clients: HashMap<u64, Client>,
    /// The owner of each (unit, port).
    owners: Vec<PortOwners>,
    next_client: u64,
}

impl<B: PortBackend> ControlServer<B> {
    /// A server for `listener` that ends when the doorbell `stop` rings.
    ///
    /// # Errors
    /// The epoll instance could not be created, or could not watch `stop` or `listener`.
    pub(crate) fn new(listener: UnixListener, stop: Arc<OwnedFd>, backend: B) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
        listener.set_nonblocking(true)?;
        epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
        let owners = vec![[None; PORTS_PER_NIC]; backend.unit_count()];
        Ok(Self {
            listener,
            stop,
            backend,
            epoll,
            clients: HashMap::new(),
            owners,
            next_client: FIRST_CLIENT,
        })
    }

    /// Serves until the stop doorbell rings; then hands it to [`PortBackend::shut_down`].
    pub(crate) fn run(mut self) {
        let mut events = [EpollEvent::empty(); 32];
        loop {
            let ready = match self.epoll.wait(&mut events, EpollTimeout::NONE) {
                Ok(ready) => ready,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(error) => {
                    eprintln!("{}: control loop: epoll failed: {error}", B::LOG_NAME);
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
        self.backend.shut_down(&self.stop);
    }

    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // Out of descriptors, most likely: the waiting process gets nothing now and
                    // may retry; the server goes on.
                    eprintln!("{}: accept failed: {error}", B::LOG_NAME);
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
                // Descriptors a process sends the server are closed unread.
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
                Ok(request) => match self.handle(token, request) {
                    Some(answer) => answer,
                    None => continue,
                },
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

    /// Serves `request`: the reply to write now, or `None` if the backend writes it later.
    fn handle(&mut self, token: u64, request: Request) -> Option<(Reply, Vec<OwnedFd>)> {
        Some(match request {
            Request::OpenPort {
                unit,
                port,
                abi_version,
            } => match self.open(token, unit, port, abi_version) {
                Ok((opened, fds)) => (Reply::Opened(opened), fds),
                Err(error) => (Reply::Error(error), Vec::new()),
            },
            Request::ClosePort => match self.close(token) {
                // The backend answers when the NIC has closed the port.
                Ok(()) => return None,
                Err(error) => (Reply::Error(error), Vec::new()),
            },
            Request::Status => (Reply::Status(self.status()), Vec::new()),
        })
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
        let ports = self
            .owners
            .get_mut(usize::from(unit))
            .ok_or(ControlError::NoSuchUnit {
                unit,
                units: self.backend.unit_count() as u8,
            })?;
        let index = PortId(port).index().ok_or(ControlError::NoSuchPort {
            port,
            ports: PORTS_PER_NIC as u8,
        })?;
        if let Some(owner) = ports[index] {
            return Err(ControlError::PortBusy {
                unit,
                port,
                owner_pid: owner.pid,
            });
        }
        let (opened, fds) = self.backend.open_port(unit, port)?;
        ports[index] = Some(PortOwner {
            pid,
            generation: opened.generation,
        });
        if let Some(client) = self.clients.get_mut(&token) {
            client.port = Some((unit, port));
        }
        Ok((opened, fds))
    }

    /// Has the backend close the port `token` owns; the backend answers the process.
    fn close(&mut self, token: u64) -> Result<(), ControlError> {
        let client = self
            .clients
            .get_mut(&token)
            .ok_or(ControlError::NoPortOwned)?;
        let (unit, port) = client.port.ok_or(ControlError::NoPortOwned)?;
        let stream = client
            .stream
            .try_clone()
            .map_err(|error| ControlError::Internal(format!("cannot answer later: {error}")))?;
        client.port = None;
        self.free(unit, port);
        self.backend.close_port_later(
            unit,
            port,
            CloseReply {
                stream: Some(stream),
            },
        );
        Ok(())
    }

    /// Frees the port in the owner table.
    fn free(&mut self, unit: u8, port: u8) {
        if let Some(slot) = self
            .owners
            .get_mut(usize::from(unit))
            .and_then(|ports| ports.get_mut(usize::from(port)))
        {
            *slot = None;
        }
    }

    fn disconnect(&mut self, token: u64) {
        let Some(client) = self.clients.remove(&token) else {
            return;
        };
        let _ = self.epoll.delete(&client.stream);
        if let Some((unit, port)) = client.port {
            self.free(unit, port);
            self.backend.abandon_port(unit, port);
        }
    }

    fn status(&self) -> StatusReport {
        StatusReport {
            daemon_pid: std::process::id(),
            fault_seed: self.backend.fault_seed(),
            units: self.backend.unit_status(&self.owners),
        }
    }
}
