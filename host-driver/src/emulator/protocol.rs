//! The control protocol between a process and the emulator daemon, over its Unix socket.
//!
//! Opening a port is the driver's only job (as in GM): a process connects, sends
//! [`Request::OpenPort`], and receives [`Reply::Opened`] with three descriptors attached
//! (`SCM_RIGHTS`, in this order): the port region (a sealed memfd, see [`super::sys::Mapping`]),
//! the host doorbell (an eventfd the NIC writes when the process sleeps on its event ring and a new
//! event arrived) and the NIC doorbell (an eventfd the process writes when the NIC sleeps on its
//! send or receive ring and a new token arrived). From then on the process and the NIC talk through
//! the mapping alone. The connection stays open for the life of the port: when it closes — the
//! process closed the port, exited or died — the daemon closes the port.
//!
//! Each message is one frame: a little-endian `u32` byte count, then that many bytes of JSON
//! (serde's external tagging of [`Request`] and [`Reply`]). A frame is at most [`MAX_FRAME`]
//! bytes. One connection owns at most one port.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};
use serde::{Deserialize, Serialize};

use super::sys;

/// Largest frame, in bytes (a status report of a large emulator fits many times over).
pub const MAX_FRAME: usize = 1 << 20;

/// Bytes read from the socket at a time.
const RECEIVE_CHUNK: usize = 16 * 1024;

/// What a process asks the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Open `port` of NIC `unit` for this connection. `abi_version` is the client's
    /// [`shared_abi::ABI_VERSION`]; a daemon speaking another refuses.
    OpenPort {
        /// The NIC's unit number in the daemon.
        unit: u8,
        /// The port, `0..PORTS_PER_NIC`.
        port: u8,
        /// The client's ABI version.
        abi_version: u32,
    },
    /// Close the port this connection owns and confirm once the NIC has closed it (closing the
    /// connection closes it too, without confirmation).
    ClosePort,
    /// Report the units, their open ports and their connections' counters.
    Status,
}

/// What the daemon answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The port is open; the region, host doorbell and NIC doorbell descriptors come with this
    /// frame.
    Opened(OpenedPort),
    /// The port this connection owned is closed.
    Closed,
    /// The daemon's state.
    Status(StatusReport),
    /// The request was refused.
    Error(ControlError),
}

/// A port the daemon opened for the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenedPort {
    /// The NIC's unit number.
    pub unit: u8,
    /// The port.
    pub port: u8,
    /// The NIC's node id on the fabric.
    pub node: u16,
    /// The port's new generation (also in the region header).
    pub generation: u32,
    /// Length of the region in bytes.
    pub region_len: u64,
}

/// Why the daemon refused a request. Each variant names the values involved.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControlError {
    /// There is no NIC with this unit number.
    NoSuchUnit {
        /// The unit asked for.
        unit: u8,
        /// How many units the daemon runs.
        units: u8,
    },
    /// The port number is out of range.
    NoSuchPort {
        /// The port asked for.
        port: u8,
        /// Ports per NIC.
        ports: u8,
    },
    /// Another live process owns the port.
    PortBusy {
        /// The unit.
        unit: u8,
        /// The port.
        port: u8,
        /// The owner's process id.
        owner_pid: u32,
    },
    /// This connection owns a port already (one connection, one port).
    AlreadyOwnsPort {
        /// The unit of the port it owns.
        unit: u8,
        /// The port it owns.
        port: u8,
    },
    /// `ClosePort` on a connection that owns no port.
    NoPortOwned,
    /// The client speaks another ABI version.
    AbiMismatch {
        /// The daemon's.
        daemon: u32,
        /// The client's.
        client: u32,
    },
    /// The NIC refused to open the port, or the region could not be created.
    OpenFailed {
        /// The unit.
        unit: u8,
        /// The port.
        port: u8,
        /// What failed.
        reason: String,
    },
    /// The request could not be parsed.
    BadRequest(String),
    /// The daemon could not do its part (a NIC thread did not answer).
    Internal(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoSuchUnit { unit, units } => {
                write!(f, "no NIC unit {unit}: the daemon runs {units} unit(s)")
            }
            Self::NoSuchPort { port, ports } => {
                write!(f, "no port {port}: a NIC has ports 0..{ports}")
            }
            Self::PortBusy {
                unit,
                port,
                owner_pid,
            } => write!(
                f,
                "port {port} of unit {unit} is owned by process {owner_pid}"
            ),
            Self::AlreadyOwnsPort { unit, port } => write!(
                f,
                "this connection owns port {port} of unit {unit} already (one port per connection)"
            ),
            Self::NoPortOwned => write!(f, "this connection owns no port to close"),
            Self::AbiMismatch { daemon, client } => write!(
                f,
                "the daemon speaks ABI version {daemon}, the client {client}"
            ),
            Self::OpenFailed { unit, port, reason } => {
                write!(
                    f,
                    "port {port} of unit {unit} could not be opened: {reason}"
                )
            }
            Self::BadRequest(reason) => write!(f, "bad request: {reason}"),
            Self::Internal(reason) => write!(f, "daemon failure: {reason}"),
        }
    }
}

impl std::error::Error for ControlError {}

/// The daemon's state, as `nicctl status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The daemon's process id.
    pub daemon_pid: u32,
    /// The seed of the fault injector, if it is on.
    pub fault_seed: Option<u64>,
    /// One entry per NIC, by unit number.
    pub units: Vec<UnitStatus>,
}

/// One NIC of the daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitStatus {
    /// Unit number.
    pub unit: u8,
    /// Node id on the fabric.
    pub node: u16,
    /// The UDP address the NIC listens on, if it is on a fabric map.
    pub address: Option<String>,
    /// Open ports.
    pub ports: Vec<PortReport>,
    /// Connections to other nodes (and to itself, for loopback).
    pub connections: Vec<ConnectionReport>,
    /// NIC-wide counters.
    pub counters: NicReport,
    /// What the wire did with this NIC's packets.
    pub wire: WireCounters,
}

/// One open port.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortReport {
    /// The port.
    pub port: u8,
    /// Its generation.
    pub generation: u32,
    /// The owning process.
    pub owner_pid: Option<u32>,
    /// Send tokens held by the NIC.
    pub held_sends: usize,
    /// Receive buffers provided.
    pub receive_buffers: usize,
    /// Whether a barrier runs.
    pub barrier_running: bool,
    /// Where the running NIC-based barrier is, if one runs.
    #[serde(default)]
    pub barrier: Option<BarrierReport>,
    /// Whether the port is finishing an orderly close (its process asked to close it).
    #[serde(default)]
    pub closing: bool,
    /// Events waiting for room in the event ring.
    pub pending_events: usize,
    /// The status that stopped the port, if the host broke its rings.
    pub faulted: Option<u8>,
}

/// A running NIC-based barrier (see [`firmware::BarrierProgress`]): how far it got and whom it
/// waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BarrierReport {
    /// The schedule step being worked on, from 0.
    pub step: u32,
    /// Steps in the schedule.
    pub steps: u32,
    /// The member the current step waits for: node, port, and the round of its packet.
    pub waiting_node: u16,
    /// See `waiting_node`.
    pub waiting_port: u8,
    /// See `waiting_node`.
    pub round: u8,
    /// The current step's own packet has not gone out yet (no room, or its target port is not
    /// open): the barrier waits to send to that member rather than to hear from it.
    pub sending: bool,
}

impl BarrierReport {
    /// The report of `progress`.
    pub fn new(progress: &firmware::BarrierProgress) -> Self {
        let (node, port, round) = progress
            .waiting_for
            .map_or((0, 0, 0), |(node, port, round)| (node.get(), port.0, round));
        Self {
            step: progress.step as u32,
            steps: progress.steps as u32,
            waiting_node: node,
            waiting_port: port,
            round,
            sending: progress.sending,
        }
    }
}

/// One connection's counters (see [`firmware::ConnectionCounters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(
    missing_docs,
    reason = "each field is the firmware counter of the same name"
)]
pub struct ConnectionReport {
    pub peer: u16,
    pub sent: u64,
    pub resent: u64,
    pub received: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub nacks_sent: u64,
    pub nacks_received: u64,
    pub rejects_sent: u64,
    pub rejects_received: u64,
    pub drops: u64,
    pub give_ups: u64,
}

impl ConnectionReport {
    /// The report of `counters` for the connection to `peer`.
    pub fn new(peer: u16, counters: &firmware::ConnectionCounters) -> Self {
        Self {
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
}

/// NIC-wide counters (see [`firmware::NicCounters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(
    missing_docs,
    reason = "each field is the firmware counter of the same name"
)]
pub struct NicReport {
    pub malformed_packets: u64,
    pub no_connection: u64,
    pub tokens_rejected: u64,
    pub barriers_completed: u64,
    pub barriers_failed: u64,
    pub messages_delivered: u64,
}

impl From<firmware::NicCounters> for NicReport {
    fn from(counters: firmware::NicCounters) -> Self {
        Self {
            malformed_packets: counters.malformed_packets,
            no_connection: counters.no_connection,
            tokens_rejected: counters.tokens_rejected,
            barriers_completed: counters.barriers_completed,
            barriers_failed: counters.barriers_failed,
            messages_delivered: counters.messages_delivered,
        }
    }
}

/// What the emulated wire did with one NIC's packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireCounters {
    /// Packets the NIC transmitted.
    pub transmitted: u64,
    /// Packets that arrived for the NIC.
    pub received: u64,
    /// Packets the fault injector dropped.
    pub lost: u64,
    /// Extra copies the fault injector made.
    pub duplicated: u64,
    /// Packets the fault injector held back (delay, reordering).
    pub delayed: u64,
    /// Packets the wire could not deliver (no route, full queue, socket error).
    pub undeliverable: u64,
    /// Datagrams that came from addresses not on the fabric map, dropped.
    pub strangers: u64,
}

/// Encodes `message` as one frame.
///
/// # Errors
/// `InvalidData` if it does not serialise or exceeds [`MAX_FRAME`].
pub fn encode<T: Serialize>(message: &T) -> io::Result<Vec<u8>> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a {} byte message exceeds the {MAX_FRAME} byte frame limit",
                body.len()
            ),
        ));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Decodes a frame's body.
///
/// # Errors
/// `InvalidData` naming what did not parse.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> io::Result<T> {
    serde_json::from_slice(body).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed control message: {error}"),
        )
    })
}

/// Writes `frame` to `stream`, passing `fds` with its first byte. Waits for room (the socket may
/// be non-blocking) until `deadline`.
///
/// # Errors
/// The socket's error, or `TimedOut` if the peer did not take the frame by `deadline`.
pub fn write_frame(
    stream: &UnixStream,
    frame: &[u8],
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> io::Result<()> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let mut written = 0;
    while written < frame.len() {
        let rights = [ControlMessage::ScmRights(&raw)];
        let control: &[ControlMessage<'_>] = if written == 0 && !raw.is_empty() {
            &rights
        } else {
            &[]
        };
        let chunk = [io::IoSlice::new(&frame[written..])];
        match sendmsg::<UnixAddr>(
            stream.as_raw_fd(),
            &chunk,
            control,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => written += n,
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => wait_until(stream, PollFlags::POLLOUT, deadline)?,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Waits until `stream` is ready for `flags`, or fails with `TimedOut` at `deadline`.
fn wait_until(stream: &UnixStream, flags: PollFlags, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the control socket's peer did not keep up",
        ));
    }
    let timeout =
        PollTimeout::try_from(left.max(Duration::from_millis(1))).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(stream.as_fd(), flags)];
    match poll(&mut fds, timeout) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// What [`FrameReader::fill`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Bytes arrived (or none were waiting on a non-blocking socket).
    Data,
    /// The peer closed the connection.
    Closed,
}

/// Assembles frames from a stream, keeping the descriptors that arrived with their bytes.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl FrameReader {
    /// An empty reader.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads what `stream` has. On a non-blocking socket reads until it would block; on a
    /// blocking one, reads once (waiting for at least one byte).
    ///
    /// # Errors
    /// The socket's error (other than `WouldBlock` and `Interrupted`).
    pub fn fill(&mut self, stream: &UnixStream) -> io::Result<Fill> {
        loop {
            match self.receive_once(stream) {
                Ok(0) => return Ok(Fill::Closed),
                Ok(n) if n < RECEIVE_CHUNK => return Ok(Fill::Data),
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(Fill::Data),
                Err(error) => return Err(error),
            }
        }
    }

    /// One `recvmsg` into the buffer; returns the byte count, 0 at end of stream.
    fn receive_once(&mut self, stream: &UnixStream) -> io::Result<usize> {
        let mut chunk = [0u8; RECEIVE_CHUNK];
        let (n, fds) = sys::receive_with_fds(stream.as_raw_fd(), &mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..n]);
        self.fds.extend(fds);
        Ok(n)
    }

    /// The next complete frame's body and the descriptors received so far, if a whole frame has
    /// arrived.
    ///
    /// # Errors
    /// `InvalidData` if the frame announces more than [`MAX_FRAME`] bytes (the stream cannot be
    /// resynchronised; drop the connection).
    pub fn next_frame(&mut self) -> io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        let Some(header) = self.buffer.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*header) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {len} bytes exceeds the {MAX_FRAME} byte limit"),
            ));
        }
        if self.buffer.len() < 4 + len {
            return Ok(None);
        }
        let body = self.buffer[4..4 + len].to_vec();
        self.buffer.drain(..4 + len);
        Ok(Some((body, std::mem::take(&mut self.fds))))
    }

    /// Reads one whole frame from a blocking `stream`.
    ///
    /// # Errors
    /// `UnexpectedEof` if the peer closes first; the socket's error (`WouldBlock`/`TimedOut` when
    /// a receive timeout expires).
    pub fn read_frame(&mut self, stream: &UnixStream) -> io::Result<(Vec<u8>, Vec<OwnedFd>)> {
        loop {
            if let Some(frame) = self.next_frame()? {
                return Ok(frame);
            }
            match self.receive_once(stream) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the daemon closed the control connection",
                    ));
                }
                Ok(_) => {}
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
    }
}

/// Sends `request` on a blocking `stream` and reads the reply with its descriptors.
///
/// # Errors
/// The socket's error, or `InvalidData` for a reply that does not parse.
pub fn call(
    stream: &UnixStream,
    request: &Request,
    timeout: Duration,
) -> io::Result<(Reply, Vec<OwnedFd>)> {
    let deadline = Instant::now() + timeout;
    write_frame(stream, &encode(request)?, &[], deadline)?;
    stream.set_read_timeout(Some(timeout))?;
    let (body, fds) = FrameReader::new().read_frame(stream)?;
    stream.set_read_timeout(None)?;
    Ok((decode(&body)?, fds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_with_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let request = Request::OpenPort {
            unit: 3,
            port: 2,
            abi_version: shared_abi::ABI_VERSION,
        };
        let memfd =
            nix::sys::memfd::memfd_create("frame-test", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
                .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        write_frame(&a, &encode(&request).unwrap(), &[memfd.as_fd()], deadline).unwrap();
        write_frame(&a, &encode(&Request::Status).unwrap(), &[], deadline).unwrap();
        let mut reader = FrameReader::new();
        let (body, fds) = reader.read_frame(&b).unwrap();
        assert_eq!(decode::<Request>(&body).unwrap(), request);
        assert_eq!(fds.len(), 1);
        let (body, fds) = reader.read_frame(&b).unwrap();
        assert_eq!(decode::<Request>(&body).unwrap(), Request::Status);
        assert!(fds.is_empty());
        drop(a);
        assert_eq!(
            reader.read_frame(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut reader = FrameReader::new();
        reader
            .buffer
            .extend_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
        assert_eq!(
            reader.next_frame().unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn errors_name_their_values() {
        let busy = ControlError::PortBusy {
            unit: 1,
            port: 4,
            owner_pid: 4242,
        };
        assert_eq!(
            busy.to_string(),
            "port 4 of unit 1 is owned by process 4242"
        );
        let reply: Reply = decode(&encode(&Reply::Error(busy.clone())).unwrap()[4..]).unwrap();
        assert_eq!(reply, Reply::Error(busy));
    }
}
