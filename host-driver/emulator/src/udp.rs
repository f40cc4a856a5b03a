//! Datagrams in batches: the packets one round of a NIC puts on the UDP wire leave in one
//! `sendmmsg`, and those waiting on its socket come in with one `recvmmsg` — a system call per
//! round instead of one per packet, as a NIC's DMA engine moves a ring of descriptors at once.
//!
//! The receive batch keeps its raw message headers (`mmsghdr`) and so is built on the NIC thread
//! that uses it, never moved; the send batch, which the wire carries to that thread, makes its
//! headers at each flush.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};

/// Datagrams one batch holds.
pub(crate) const BATCH: usize = 64;

/// Datagrams waiting to be sent, in the order the NIC transmitted them.
#[derive(Debug)]
pub(crate) struct SendBatch {
    /// Destinations and bytes; the first `len` are waiting (the buffers behind them are kept
    /// for reuse).
    waiting: Vec<(SockaddrStorage, Vec<u8>)>,
    len: usize,
}

/// What a flush did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flushed {
    /// Datagrams the kernel took.
    pub(crate) sent: usize,
    /// Datagrams dropped because the kernel refused them for good (an ICMP error of an earlier
    /// datagram, a route gone): lost, as on a real wire.
    pub(crate) dropped: usize,
    /// The socket's buffer is full: what is left waits for the next flush.
    pub(crate) blocked: bool,
}

impl SendBatch {
    /// An empty batch.
    pub(crate) fn new() -> Self {
        Self {
            waiting: Vec::with_capacity(BATCH),
            len: 0,
        }
    }

    /// Whether no datagram waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues a copy of `packet` for `to`; `false` if the batch is full.
    pub(crate) fn push(&mut self, to: SocketAddr, packet: &[u8]) -> bool {
        if self.len == BATCH {
            return false;
        }
        let address = SockaddrStorage::from(to);
        match self.waiting.get_mut(self.len) {
            Some((slot_address, bytes)) => {
                *slot_address = address;
                bytes.clear();
                bytes.extend_from_slice(packet);
            }
            None => self.waiting.push((address, packet.to_vec())),
        }
        self.len += 1;
        true
    }

    /// Sends what waits, in order, until the socket's buffer is full.
    pub(crate) fn flush(&mut self, socket: &UdpSocket) -> Flushed {
        let mut flushed = Flushed::default();
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(self.len, None);
        while self.len > 0 {
            let slices: Vec<[IoSlice<'_>; 1]> = self.waiting[..self.len]
                .iter()
                .map(|(_, bytes)| [IoSlice::new(bytes)])
                .collect();
            let addresses: Vec<Option<SockaddrStorage>> = self.waiting[..self.len]
                .iter()
                .map(|(address, _)| Some(*address))
                .collect();
            let outcome = sendmmsg(
                socket.as_raw_fd(),
                &mut headers,
                &slices,
                &addresses,
                [],
                MsgFlags::MSG_DONTWAIT,
            )
            .map(Iterator::count);
            drop(slices);
            let taken = match outcome {
                Ok(sent) => {
                    flushed.sent += sent;
                    sent
                }
                Err(Errno::EAGAIN) => {
                    flushed.blocked = true;
                    break;
                }
                Err(Errno::EINTR) => 0,
                Err(_) => {
                    // The first datagram is refused for good (sendmmsg reports an error only
                    // when nothing was sent): drop it and go on with the rest.
                    flushed.dropped += 1;
                    1
                }
            };
            self.consume(taken);
            if taken == 0 && !flushed.blocked {
                continue;
            }
        }
        flushed
    }

    /// Forgets the first `count` waiting datagrams, keeping their buffers.
    fn consume(&mut self, count: usize) {
        let count = count.min(self.len);
        self.waiting[..self.len].rotate_left(count);
        self.len -= count;
    }
}

/// Datagrams taken from a socket in one call, parsed where they landed.
pub(crate) struct ReceiveBatch {
    headers: MultiHeaders<SockaddrStorage>,
    buffers: Vec<Box<[u8]>>,
    /// Of each datagram the last call took: its length and where it came from.
    arrived: Vec<(usize, Option<SocketAddr>)>,
}

impl ReceiveBatch {
    /// A batch of [`BATCH`] buffers of `buffer_len` bytes.
    pub(crate) fn new(buffer_len: usize) -> Self {
        Self {
            headers: MultiHeaders::preallocate(BATCH, None),
            buffers: (0..BATCH)
                .map(|_| vec![0; buffer_len].into_boxed_slice())
                .collect(),
            arrived: Vec::with_capacity(BATCH),
        }
    }

    /// Takes what waits on `socket`, at most [`BATCH`] datagrams, without blocking; returns how
    /// many came.
    ///
    /// # Errors
    /// The socket reported an error (an ICMP report of an earlier send consumes the call).
    pub(crate) fn receive(&mut self, socket: &UdpSocket) -> io::Result<usize> {
        self.arrived.clear();
        let mut slices: Vec<[IoSliceMut<'_>; 1]> = self
            .buffers
            .iter_mut()
            .map(|buffer| [IoSliceMut::new(buffer)])
            .collect();
        let results = match recvmmsg(
            socket.as_raw_fd(),
            &mut self.headers,
            slices.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        ) {
            Ok(results) => results,
            Err(Errno::EAGAIN) => return Ok(0),
            Err(error) => return Err(error.into()),
        };
        for message in results {
            let from = message.address.as_ref().and_then(socket_address);
            self.arrived.push((message.bytes, from));
        }
        Ok(self.arrived.len())
    }

    /// Datagram `index` of the last call: its bytes (as many as fit the buffer) and its source.
    pub(crate) fn datagram(&self, index: usize) -> Option<(&[u8], usize, Option<SocketAddr>)> {
        let &(len, from) = self.arrived.get(index)?;
        let buffer = self.buffers.get(index)?;
        Some((&buffer[..len.min(buffer.len())], len, from))
    }
}

/// The socket address of `address`, if it is IPv4 or IPv6.
fn socket_address(address: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = address.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    address.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_sends_in_order_and_the_other_side_takes_them_in_one_call() {
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = receiver.local_addr().unwrap();
        let mut batch = SendBatch::new();
        for i in 0..10u8 {
            assert!(batch.push(to, &[i; 100][..usize::from(i) * 10 + 1]));
        }
        let flushed = batch.flush(&sender);
        assert_eq!(
            (flushed.sent, flushed.dropped, flushed.blocked),
            (10, 0, false)
        );
        assert!(batch.is_empty());
        let mut incoming = ReceiveBatch::new(2048);
        let mut seen = Vec::new();
        while seen.len() < 10 {
            let count = incoming.receive(&receiver).unwrap();
            for index in 0..count {
                let (bytes, len, from) = incoming.datagram(index).unwrap();
                assert_eq!(from, Some(sender.local_addr().unwrap()));
                assert_eq!(len, bytes.len());
                seen.push(bytes.to_vec());
            }
        }
        for (i, bytes) in seen.iter().enumerate() {
            assert_eq!(
                bytes,
                &vec![i as u8; i * 10 + 1],
                "datagram {i} in order, intact"
            );
        }
        assert_eq!(
            incoming.receive(&receiver).unwrap(),
            0,
            "nothing more waits"
        );
    }

    #[test]
    fn a_full_batch_refuses_more_and_keeps_its_buffers_after_a_flush() {
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        let receiver = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = receiver.local_addr().unwrap();
        let mut batch = SendBatch::new();
        for _ in 0..BATCH {
            assert!(batch.push(to, b"x"));
        }
        assert!(!batch.push(to, b"y"), "the 65th datagram does not fit");
        assert_eq!(batch.flush(&sender).sent, BATCH);
        assert!(batch.push(to, b"z"));
        assert_eq!(batch.flush(&sender).sent, 1);
    }
}
