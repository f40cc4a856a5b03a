//! The control socket's server, one for every kind of NIC behind it: accepts processes on the
//! Unix socket, reads their requests ([`crate::message`]), keeps which process owns which port,
//! and answers. What opening, closing and reporting a port means is the [`PortBackend`]'s: the
//! emulator's NIC threads or QEMU NICs.
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

use crate::frame::{self, FrameReader};
use crate::message::{ControlError, OpenedPort, Reply, Request, StatusReport, UnitStatus};

/// How long a process may take to accept a reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

const STOP: u64 = 0;
const LISTENER: u64 = 1;
const FIRST_CLIENT: u64 = 2;

/// The NICs behind a control server: what it asks of them for each request.
///
/// The server has checked what it can before it calls: the ABI version, that the unit and port
/// exist, that the port is free and that the connection owns no other port.
pub trait PortBackend {
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

/// Who holds an open port, and which incarnation of it.
#[derive(Clone, Copy, Debug)]
pub struct PortOwner {
    /// The owning process, as `SO_PEERCRED` named it (0 if the kernel would not say).
    pub pid: u32,
    /// The generation the port was opened with.
    pub generation: u32,
}

/// One unit's ports: the owner of each open one.
pub type PortOwners = [Option<PortOwner>; PORTS_PER_NIC];

struct Client {
    stream: UnixStream,
    pid: u32,
    reader: FrameReader,
    /// The (unit, port) this connection owns.
    port: Option<(u8, u8)>,
}

/// A control socket's server over the NICs of backend `B`; runs on a thread of its own.
///
/// It serves processes of its own user (and root); [`ControlServer::allow_group`] adds the
/// members of one group. Any other process is answered [`ControlError::PermissionDenied`] and
/// disconnected before it can ask anything.
pub struct ControlServer<B> {
    listener: UnixListener,
    uid: u32,
    group: Option<u32>,
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
    pub fn new(listener: UnixListener, stop: Arc<OwnedFd>, backend: B) -> io::Result<Self> {
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        epoll.add(&*stop, EpollEvent::new(EpollFlags::EPOLLIN, STOP))?;
        listener.set_nonblocking(true)?;
        epoll.add(&listener, EpollEvent::new(EpollFlags::EPOLLIN, LISTENER))?;
        let owners = vec![[None; PORTS_PER_NIC]; backend.unit_count()];
        Ok(Self {
            listener,
            uid: nix::unistd::geteuid().as_raw(),
            group: None,
            stop,
            backend,
            epoll,
            clients: HashMap::new(),
            owners,
            next_client: FIRST_CLIENT,
        })
    }

    /// Serves the members of group `gid` too (their processes may open ports and talk to every
    /// other port of these NICs).
    #[must_use]
    pub fn allow_group(mut self, gid: u32) -> Self {
        self.group = Some(gid);
        self
    }

    /// Whether a process running as `uid` (primary group `gid`) may use this server.
    fn permitted(&self, uid: u32, gid: u32) -> bool {
        uid == self.uid
            || uid == 0
            || self
                .group
                .is_some_and(|group| group == gid || member_of(uid, gid, group))
    }

    /// Serves until the stop doorbell rings; then hands it to [`PortBackend::shut_down`].
    pub fn run(mut self) {
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
            let Ok(credentials) = getsockopt(&stream, sockopt::PeerCredentials) else {
                continue;
            };
            let pid = credentials.pid() as u32;
            if !self.permitted(credentials.uid(), credentials.gid()) {
                let refusal = Reply::Error(ControlError::PermissionDenied {
                    client_uid: credentials.uid(),
                    daemon_uid: self.uid,
                });
                // One try, without waiting: the process is not served either way.
                if let (Ok(()), Ok(frame)) = (stream.set_nonblocking(true), frame::encode(&refusal))
                {
                    let _ = frame::write_frame(&stream, &frame, &[], Instant::now());
                }
                eprintln!(
                    "{}: refused process {pid}: it runs as uid {}, this daemon serves uid {}",
                    B::LOG_NAME,
                    credentials.uid(),
                    self.uid
                );
                continue;
            }
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
            Ok(frame::Fill::Closed) | Err(_)
        );
        gone |= flags.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR);
        let mut requests = Vec::new();
        loop {
            match client.reader.next_frame() {
                // Descriptors a process sends the server are closed unread.
                Ok(Some((body, _fds))) => {
                    requests.push(frame::decode::<Request>(&body, "a request"))
                }
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
        let Ok(frame) = frame::encode(reply) else {
            return false;
        };
        let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
        frame::write_frame(
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

    fn close(&mut self, token: u64) -> Result<(), ControlError> {
        let (unit, port) = self
            .clients
            .get_mut(&token)
            .and_then(|client| client.port.take())
            .ok_or(ControlError::NoPortOwned)?;
        self.free(unit, port);
        self.backend.close_port(unit, port)
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

/// Whether the user `uid` (primary group `gid`) is a member of `group`, by the group database.
fn member_of(uid: u32, gid: u32, group: u32) -> bool {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return false;
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return false;
    };
    nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
        .is_ok_and(|groups| groups.iter().any(|g| g.as_raw() == group))
}

/// The boot stamp for NICs a backend starts now (wall-clock milliseconds, wrapping): it grows
/// from one start to the next, so peers see a restarted NIC's connection epochs as newer than the
/// old ones.
pub fn boot_stamp() -> u32 {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    millis as u32
}
