//! Frames on the control socket: how messages travel, with the descriptors passed beside them.
//!
//! A frame is a little-endian `u32` byte count, then that many bytes: the protocol version
//! ([`PROTOCOL_VERSION`]) and the message ([`crate::codec`]). A frame is at most [`MAX_FRAME`]
//! bytes. Descriptors ride with a frame's first byte (`SCM_RIGHTS`).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};

use crate::codec::{self, Wire};
use crate::message::{Reply, Request};
use crate::sys;

/// The layout version of control messages, the first byte of every frame's body. Bumped on any
/// change to [`crate::codec`]'s layouts; a frame of another version is refused, naming both.
pub const PROTOCOL_VERSION: u8 = 3;

/// Largest frame body, in bytes (a status report of a large emulator fits many times over).
pub const MAX_FRAME: usize = 1 << 20;

/// Bytes read from the socket at a time.
const RECEIVE_CHUNK: usize = 16 * 1024;

/// Encodes `message` as one frame.
///
/// # Errors
/// `InvalidData` if it exceeds [`MAX_FRAME`].
pub fn encode<T: Wire>(message: &T) -> io::Result<Vec<u8>> {
    let mut frame = vec![0; 4];
    frame.push(PROTOCOL_VERSION);
    message.put(&mut frame);
    let len = frame.len() - 4;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a {len} byte message exceeds the {MAX_FRAME} byte frame limit"),
        ));
    }
    frame[..4].copy_from_slice(&(len as u32).to_le_bytes());
    Ok(frame)
}

/// Decodes a frame's body as a `T`.
///
/// # Errors
/// `InvalidData` naming what did not parse: another protocol version, or bytes that are not
/// exactly one message.
pub fn decode<T: Wire>(body: &[u8], what: &'static str) -> io::Result<T> {
    let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
    match body.split_first() {
        None => Err(invalid(format!(
            "malformed control message: {what} is empty"
        ))),
        Some((&version, _)) if version != PROTOCOL_VERSION => Err(invalid(format!(
            "the peer speaks control protocol version {version}, this side {PROTOCOL_VERSION}"
        ))),
        Some((_, message)) => codec::from_bytes(message, what)
            .map_err(|error| invalid(format!("malformed control message: {error}"))),
    }
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

/// One non-blocking attempt to write `frame[written..]` to `stream`, passing `fds` with the
/// frame's first byte (when `written` is 0). Returns how many bytes went out.
///
/// # Errors
/// `WouldBlock` if the peer's socket is full; the socket's error otherwise.
pub fn write_some(
    stream: &UnixStream,
    frame: &[u8],
    written: usize,
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let rights = [ControlMessage::ScmRights(&raw)];
    let control: &[ControlMessage<'_>] = if written == 0 && !raw.is_empty() {
        &rights
    } else {
        &[]
    };
    let chunk = [io::IoSlice::new(frame.get(written..).unwrap_or(&[]))];
    loop {
        match sendmsg::<UnixAddr>(
            stream.as_raw_fd(),
            &chunk,
            control,
            MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => {}
            Err(error) => return Err(error.into()),
        }
    }
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
///
/// Consumed frames are skipped by an offset and the buffer is compacted only when the skipped
/// part outgrows what is left, so reading a stream of many small frames costs time linear in its
/// length.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
    start: usize,
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
        self.fill_up_to(stream, usize::MAX)
    }

    /// As [`FrameReader::fill`], but stops once about `budget` bytes were read, so that one
    /// peer that writes without pause cannot keep its reader busy.
    ///
    /// # Errors
    /// The socket's error (other than `WouldBlock` and `Interrupted`).
    pub fn fill_up_to(&mut self, stream: &UnixStream, budget: usize) -> io::Result<Fill> {
        let mut read = 0usize;
        loop {
            match self.receive_once(stream) {
                Ok(0) => return Ok(Fill::Closed),
                Ok(n) if n < RECEIVE_CHUNK => return Ok(Fill::Data),
                Ok(n) => {
                    read = read.saturating_add(n);
                    if read >= budget {
                        return Ok(Fill::Data);
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(Fill::Data),
                Err(error) => return Err(error),
            }
        }
    }

    /// Whether a whole frame is buffered (or the buffer holds a broken one).
    pub fn has_frame(&self) -> bool {
        let pending = &self.buffer[self.start..];
        pending.first_chunk::<4>().is_some_and(|header| {
            let len = u32::from_le_bytes(*header) as usize;
            len > MAX_FRAME || pending.len() >= 4 + len
        })
    }

    /// How many descriptors arrived that no frame has taken yet.
    pub fn descriptors_held(&self) -> usize {
        self.fds.len()
    }

    /// One `recvmsg` into the buffer; returns the byte count, 0 at end of stream.
    fn receive_once(&mut self, stream: &UnixStream) -> io::Result<usize> {
        let mut chunk = [0u8; RECEIVE_CHUNK];
        let (n, fds) = sys::receive_with_fds(stream.as_raw_fd(), &mut chunk)?;
        if self.start > 0 && self.start >= self.buffer.len() - self.start {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
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
        let pending = &self.buffer[self.start..];
        let Some(header) = pending.first_chunk::<4>() else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(*header) as usize;
        if len > MAX_FRAME {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a frame of {len} bytes exceeds the {MAX_FRAME} byte limit"),
            ));
        }
        if pending.len() < 4 + len {
            return Ok(None);
        }
        let body = pending[4..4 + len].to_vec();
        self.start += 4 + len;
        if self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        }
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
    stream.set_read_timeout(Some(timeout))?;
    if let Err(error) = write_frame(stream, &encode(request)?, &[], deadline) {
        // A server that refuses a process answers and hangs up at once, perhaps before the
        // request is out: its answer is still there to read.
        if matches!(
            error.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            if let Ok((body, fds)) = FrameReader::new().read_frame(stream) {
                return Ok((decode(&body, "a reply")?, fds));
            }
        }
        return Err(error);
    }
    let (body, fds) =
        FrameReader::new()
            .read_frame(stream)
            .map_err(|error| match error.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the daemon did not answer within {timeout:?}"),
                ),
                _ => error,
            })?;
    stream.set_read_timeout(None)?;
    Ok((decode(&body, "a reply")?, fds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ControlError;

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
        assert_eq!(decode::<Request>(&body, "a request").unwrap(), request);
        assert_eq!(fds.len(), 1);
        let (body, fds) = reader.read_frame(&b).unwrap();
        assert_eq!(
            decode::<Request>(&body, "a request").unwrap(),
            Request::Status
        );
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
        let reply: Reply = decode(
            &encode(&Reply::Error(busy.clone())).unwrap()[4..],
            "a reply",
        )
        .unwrap();
        assert_eq!(reply, Reply::Error(busy));
    }

    #[test]
    fn another_protocol_version_is_named() {
        let mut frame = encode(&Request::Status).unwrap();
        frame[4] = PROTOCOL_VERSION + 1;
        let error = decode::<Request>(&frame[4..], "a request").unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "the peer speaks control protocol version {}, this side {PROTOCOL_VERSION}",
                PROTOCOL_VERSION + 1
            )
        );
    }

    #[test]
    fn many_small_frames_are_read_in_order() {
        let (a, b) = UnixStream::pair().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let writer = std::thread::spawn(move || {
            for unit in 0..=255u8 {
                let request = Request::OpenPort {
                    unit,
                    port: unit % 8,
                    abi_version: u32::from(unit),
                };
                write_frame(&a, &encode(&request).unwrap(), &[], deadline).unwrap();
            }
        });
        let mut reader = FrameReader::new();
        for unit in 0..=255u8 {
            let (body, _) = reader.read_frame(&b).unwrap();
            let expected = Request::OpenPort {
                unit,
                port: unit % 8,
                abi_version: u32::from(unit),
            };
            assert_eq!(decode::<Request>(&body, "a request").unwrap(), expected);
        }
        writer.join().unwrap();
    }
}
