//! The control socket's server, one for every kind of NIC behind it: accepts processes on the
//! Unix socket, reads their requests ([`crate::message`]), keeps which process owns which port,
//! and answers. What opening, closing and reporting a port means is the [`PortBackend`]'s: the
//! emulator's NIC threads or QEMU NICs.
//!
//! Each connection owns at most one port, for as long as it stays open. The server learns a
//! process is gone from its connection — end of stream or hang-up, whether the process closed the
//! port, exited or was killed — and has the backend close the port, whose firmware then tells the
//! peers. A port's owner is the connecting process as the kernel names it (`SO_PEERCRED`).
//!
//! No process can stall the server or starve another. Every read and every reply is
//! non-blocking: a process gets at most [`READ_BUDGET`] bytes read and [`REQUESTS_PER_TURN`]
//! requests served before the others have their turn; a reply that does not fit its socket waits
//! in that connection's queue, and while it waits nothing more is read from that process; a
//! process that leaves a reply unread for [`WRITE_TIMEOUT`] is disconnected. A malformed request
//! is answered and ends the connection. A process never passes the server descriptors: one that
//! does is disconnected at once, its descriptors closed. When the server runs out of descriptors
//! it stops accepting for a moment and says so, instead of spinning.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{getsockopt, sockopt};
use shared_abi::ids::{PORTS_PER_NIC, PortId};

use crate::frame::{self, FrameReader};
use crate::message::{
    ControlError, NodeName, OpenedPort, Reply, Request, StatusReport, UnitStatus,
};

/// How long a process may leave a reply unread before it is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bytes read from one process in one turn.
pub const READ_BUDGET: usize = 64 * 1024;

/// Requests served for one process in one turn.
pub const REQUESTS_PER_TURN: usize = 16;

/// How long the server stops accepting after running out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

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

    /// Every node of the fabric the backend knows — its own units and the nodes of the fabric map
    /// — by node id, named by [`crate::naming`]'s rules. Fixed for the server's life.
    fn node_names(&self) -> Vec<NodeName>;

    /// The fault injector's seed, if one is on.
    fn fault_seed(&self) -> Option<u64>;

    /// Serves a memory request ([`Request::RegisterMemory`], [`Request::DeregisterMemory`],
    /// [`Request::AllowRemoteAccess`], [`Request::RegionMapped`]) for `port` of `unit`, owned by process `pid`; returns the
    /// reply. By default the backend has no registered memory.
    ///
    /// # Errors
    /// The reply the process gets instead, naming what failed.
    fn memory(
        &self,
        unit: u8,
        port: u8,
        pid: u32,
        request: &Request,
    ) -> Result<Reply, ControlError> {
        let _ = (unit, port, pid, request);
        Err(ControlError::MemoryRefused(format!(
            "{} NICs do not reach ordinary process memory",
            Self::LOG_NAME
        )))
    }

    /// Called once as the server ends, after the stop doorbell `stop` rang (or epoll failed).
    fn shut_down(&mut self, stop: &OwnedFd);
}

/// The answer to a close request, to be written when the close is done (from any thread). Dropped
/// unsent, it answers with an internal error, so a process never waits for nothing.
#[derive(Debug)]
pub struct CloseReply {
    stream: Option<UnixStream>,
}

impl CloseReply {
    /// Writes `result` to the process that asked (within the server's write deadline).
    pub fn send(mut self, result: Result<(), ControlError>) {
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
        if let Ok(frame) = frame::encode(&reply) {
            // The process may be gone by now; then nobody is left to tell.
            let _ = frame::write_frame(&stream, &frame, &[], Instant::now() + WRITE_TIMEOUT);
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
    /// Replies not yet taken by the process, oldest first.
    outgoing: VecDeque<Outgoing>,
    /// Disconnect once the queued replies are out (after a malformed request).
    closing: bool,
    /// What epoll watches for this connection now.
    interest: EpollFlags,
    /// Why this process is not served, if it is not: its first request is answered so, and the
    /// connection ends.
    refused: Option<ControlError>,
}

/// A reply on its way out.
struct Outgoing {
    frame: Vec<u8>,
    written: usize,
    /// Passed with the frame's first byte.
    fds: Vec<OwnedFd>,
    /// When it was queued: the process must take it within [`WRITE_TIMEOUT`].
    queued: Instant,
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
    /// Connections with complete requests left over from their last turn.
    backlog: Vec<u64>,
    /// Accepting is paused until then (the server ran out of descriptors).
    accept_paused_until: Option<Instant>,
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
            backlog: Vec::new(),
            accept_paused_until: None,
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
            let timeout = self.next_timeout();
            let ready = match self.epoll.wait(&mut events, timeout) {
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
            for token in std::mem::take(&mut self.backlog) {
                self.serve_client(token, EpollFlags::empty());
            }
            self.expire(Instant::now());
        }
        self.backend.shut_down(&self.stop);
    }

    /// How long epoll may sleep: not at all with a backlog, else until the next reply deadline
    /// or the end of an accept pause.
    fn next_timeout(&self) -> EpollTimeout {
        if !self.backlog.is_empty() {
            return EpollTimeout::ZERO;
        }
        let deadlines = self
            .clients
            .values()
            .filter_map(|client| client.outgoing.front())
            .map(|reply| reply.queued + WRITE_TIMEOUT)
            .chain(self.accept_paused_until);
        match deadlines.min() {
            None => EpollTimeout::NONE,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                let millis = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
                EpollTimeout::try_from(millis.max(1)).unwrap_or(EpollTimeout::MAX)
            }
        }
    }

    /// Disconnects processes that left a reply unread too long, and ends an accept pause.
    fn expire(&mut self, now: Instant) {
        let late: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, client)| {
                client
                    .outgoing
                    .front()
                    .is_some_and(|reply| now >= reply.queued + WRITE_TIMEOUT)
            })
            .map(|(token, _)| *token)
            .collect();
        for token in late {
            if let Some(client) = self.clients.get(&token) {
                eprintln!(
                    "{}: process {} left a reply unread for {WRITE_TIMEOUT:?}: disconnected",
                    B::LOG_NAME,
                    client.pid
                );
            }
            self.disconnect(token);
        }
        if self.accept_paused_until.is_some_and(|until| now >= until) {
            self.accept_paused_until = None;
            let _ = self.epoll.add(
                &self.listener,
                EpollEvent::new(EpollFlags::EPOLLIN, LISTENER),
            );
            self.accept_all();
        }
    }

    fn accept_all(&mut self) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // Out of descriptors, most likely. The connection waits in the backlog; a
                    // level-triggered listener would wake the loop at once, so stop watching
                    // it for a moment.
                    let resource = match error.raw_os_error() {
                        Some(code)
                            if code == nix::errno::Errno::EMFILE as i32
                                || code == nix::errno::Errno::ENFILE as i32 =>
                        {
                            "file descriptors"
                        }
                        Some(code) if code == nix::errno::Errno::ENOMEM as i32 => "memory",
                        _ => "a resource",
                    };
                    eprintln!(
                        "{}: accept failed, out of {resource} ({error}) with {} processes \
                         connected: not accepting for {ACCEPT_PAUSE:?}",
                        B::LOG_NAME,
                        self.clients.len()
                    );
                    let _ = self.epoll.delete(&self.listener);
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            let Ok(credentials) = getsockopt(&stream, sockopt::PeerCredentials) else {
                continue;
            };
            let pid = credentials.pid() as u32;
            // A process of another user is refused in the answer to its first request (closing
            // at once could lose the answer under its request).
            let refused = (!self.permitted(credentials.uid(), credentials.gid())).then(|| {
                eprintln!(
                    "{}: refused process {pid}: it runs as uid {}, this daemon serves uid {}",
                    B::LOG_NAME,
                    credentials.uid(),
                    self.uid
                );
                ControlError::PermissionDenied {
                    client_uid: credentials.uid(),
                    daemon_uid: self.uid,
                }
            });
            let token = self.next_client;
            self.next_client += 1;
            let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP;
            let registered = stream.set_nonblocking(true).is_ok()
                && self
                    .epoll
                    .add(&stream, EpollEvent::new(interest, token))
                    .is_ok();
            if registered {
                self.clients.insert(
                    token,
                    Client {
                        stream,
                        pid,
                        reader: FrameReader::new(),
                        port: None,
                        outgoing: VecDeque::new(),
                        closing: false,
                        interest,
                        refused,
                    },
                );
            }
        }
    }

    /// One turn of one connection: flush its replies, read a budget of its bytes, serve a budget
    /// of its requests.
    fn serve_client(&mut self, token: u64, flags: EpollFlags) {
        if !self.flush(token) {
            self.disconnect(token);
            return;
        }
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        let mut gone = flags.intersects(EpollFlags::EPOLLHUP | EpollFlags::EPOLLERR);
        // A process that has not taken its replies is not heard until it does.
        if client.outgoing.is_empty() && !client.closing {
            gone |= matches!(
                client.reader.fill_up_to(&client.stream, READ_BUDGET),
                Ok(frame::Fill::Closed) | Err(_)
            );
            if client.reader.descriptors_held() > 0 {
                eprintln!(
                    "{}: process {} passed descriptors to the server: disconnected",
                    B::LOG_NAME,
                    client.pid
                );
                gone = true;
            }
        }
        let mut requests = Vec::new();
        while !gone && client.outgoing.is_empty() && !client.closing {
            if requests.len() == REQUESTS_PER_TURN {
                if !self.backlog.contains(&token) {
                    self.backlog.push(token);
                }
                break;
            }
            match client.reader.next_frame() {
                Ok(Some((body, _fds))) => {
                    let request = frame::decode::<Request>(&body, "a request");
                    let malformed = request.is_err();
                    requests.push(request);
                    if malformed {
                        break;
                    }
                }
                Ok(None) => break,
                Err(_) => gone = true,
            }
        }
        for request in requests {
            let refusal = self.clients.get_mut(&token).and_then(|client| {
                let refusal = client.refused.clone()?;
                client.closing = true;
                Some(refusal)
            });
            if let Some(refusal) = refusal {
                self.queue(token, &Reply::Error(refusal), Vec::new());
                break;
            }
            let (reply, fds) = match request {
                Ok(request) => match self.handle(token, request) {
                    Some(answer) => answer,
                    // The backend answers later (an orderly close).
                    None => continue,
                },
                Err(error) => {
                    if let Some(client) = self.clients.get_mut(&token) {
                        client.closing = true;
                    }
                    (
                        Reply::Error(ControlError::BadRequest(error.to_string())),
                        Vec::new(),
                    )
                }
            };
            self.queue(token, &reply, fds);
        }
        if gone || !self.flush(token) {
            self.disconnect(token);
        }
    }

    /// Queues `reply` (with `fds`) for the connection; [`ControlServer::flush`] sends it.
    fn queue(&mut self, token: u64, reply: &Reply, fds: Vec<OwnedFd>) {
        let Some(client) = self.clients.get_mut(&token) else {
            return;
        };
        let frame = frame::encode(reply).unwrap_or_else(|error| {
            // Only a status report of an absurd size could exceed a frame.
            let error = Reply::Error(ControlError::Internal(error.to_string()));
            frame::encode(&error).unwrap_or_default()
        });
        client.outgoing.push_back(Outgoing {
            frame,
            written: 0,
            fds,
            queued: Instant::now(),
        });
    }

    /// Sends what the socket takes of the connection's queued replies, and watches for room if
    /// some are left. Returns `false` if the connection is to be dropped.
    fn flush(&mut self, token: u64) -> bool {
        let Some(client) = self.clients.get_mut(&token) else {
            return true;
        };
        while let Some(reply) = client.outgoing.front_mut() {
            let fds: Vec<_> = reply.fds.iter().map(AsFd::as_fd).collect();
            match frame::write_some(&client.stream, &reply.frame, reply.written, &fds) {
                Ok(n) => {
                    reply.written += n;
                    if reply.written >= reply.frame.len() {
                        client.outgoing.pop_front();
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        if client.outgoing.is_empty() && client.closing {
            return false;
        }
        // Wait for room while replies are queued; read requests only when none are.
        let interest = if client.outgoing.is_empty() {
            EpollFlags::EPOLLIN | EpollFlags::EPOLLRDHUP
        } else {
            EpollFlags::EPOLLOUT | EpollFlags::EPOLLRDHUP
        };
        if interest != client.interest {
            let mut event = EpollEvent::new(interest, token);
            if self.epoll.modify(&client.stream, &mut event).is_err() {
                return false;
            }
            client.interest = interest;
        }
        if client.outgoing.is_empty() && client.reader.has_frame() && !self.backlog.contains(&token)
        {
            self.backlog.push(token);
        }
        true
    }

    /// Serves `request`: the reply to queue now, or `None` if the backend writes it later.
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
            Request::Nodes => (Reply::Nodes(self.backend.node_names()), Vec::new()),
            Request::RegisterMemory { .. }
            | Request::DeregisterMemory { .. }
            | Request::AllowRemoteAccess
            | Request::RegionMapped { .. } => {
                let owned = self
                    .clients
                    .get(&token)
                    .and_then(|client| client.port.map(|(unit, port)| (unit, port, client.pid)));
                let reply = match owned {
                    Some((unit, port, pid)) => self.backend.memory(unit, port, pid, &request),
                    None => Err(ControlError::NoPortOwned),
                };
                (reply.unwrap_or_else(Reply::Error), Vec::new())
            }
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

/// 32 random bytes from the kernel, for a fabric key a backend makes for NICs whose packets never
/// leave it.
///
/// # Errors
/// The kernel's random source could not be read.
pub fn random_key() -> io::Result<[u8; 32]> {
    let mut key = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut key)?;
    Ok(key)
}
