//! The sender: a message by put into the receiver's ring while it has credit, else the ordinary
//! way, in the pair's one sequence.

use shared_abi::ids::{NodeId, PortId};
use shared_abi::rdma::RemotePointer;
use shared_abi::token::Priority;

use super::FastPath;
use super::context::{context, tag};
use super::layout::{
    BUFFER_LEN, MAX_MESSAGE, ORDINARY_HEADER, SIZE_CLASS, SLOT_OVERHEAD, STAGING_SLOT, align8,
    checksum, kind,
};
use super::message::{PeerId, Route};
use super::peer::Remote;
use crate::error::Error;
use crate::port::Port;

impl FastPath {
    /// Sends `data` to `peer`: by put into its ring when it fits a slot and the ring has room,
    /// else the ordinary way; returns the path taken. Waits (making progress) for the peer's hello
    /// and for a send token, never for the receiver.
    ///
    /// # Errors
    /// [`Error::TooLong`] beyond [`MAX_MESSAGE`]; [`Error::Protocol`] if the peer failed (a send
    /// to it failed, or it wrote a corrupt slot) or did not connect within the setup timeout.
    pub fn send(&mut self, peer: PeerId, data: &[u8]) -> Result<Route, Error> {
        self.send_by(peer, data, true)
    }

    /// Sends `data` to `peer` the ordinary way even if it would fit the fast path (in order with
    /// the pair's other messages): the baseline.
    ///
    /// # Errors
    /// As [`FastPath::send`].
    pub fn send_ordinary_path(&mut self, peer: PeerId, data: &[u8]) -> Result<(), Error> {
        self.send_by(peer, data, false).map(|_| ())
    }

    pub(super) fn send_by(
        &mut self,
        peer: PeerId,
        data: &[u8],
        fast: bool,
    ) -> Result<Route, Error> {
        if data.len() > MAX_MESSAGE {
            return Err(Error::TooLong {
                length: data.len(),
                max: MAX_MESSAGE,
            });
        }
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        self.progress()?;
        self.check_failed(index)?;
        let remote = self.peers[index].remote.ok_or(Error::DaemonGone)?;
        let fits = remote.slots > 0 && data.len() <= remote.slot_size - SLOT_OVERHEAD;
        if fast && fits {
            self.refresh_credit(index);
            let p = &self.peers[index];
            if p.fast_sent - p.fast_credited < u64::from(remote.slots) {
                self.put_slot(index, data, remote)?;
                self.stats.sent_fast += 1;
                return Ok(Route::Fast);
            }
            self.stats.fallback_no_credit += 1;
        } else if remote.slots == 0 || !fast {
            self.stats.fallback_no_ring += 1;
        } else {
            self.stats.fallback_too_long += 1;
        }
        let seq = self.peers[index].next_seq;
        self.peers[index].next_seq += 1;
        let mut bytes = Vec::with_capacity(ORDINARY_HEADER + data.len());
        bytes.push(kind::DATA);
        bytes.extend_from_slice(&[0; 7]);
        bytes.extend_from_slice(&seq.to_le_bytes());
        bytes.extend_from_slice(data);
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.send_ordinary(&bytes, node, port, context(tag::DATA, index, seq))?;
        Ok(Route::Ordinary)
    }

    pub(super) fn put_slot(
        &mut self,
        index: usize,
        data: &[u8],
        remote: Remote,
    ) -> Result<(), Error> {
        // A staging slot whose last put has completed (there is one per send token).
        let entry = loop {
            if let Some(entry) = self.staging_free.pop() {
                break entry;
            }
            self.progress()?;
            std::thread::yield_now();
        };
        let staging = self.staging.clone();
        let from = entry * STAGING_SLOT;
        let peer = &mut self.peers[index];
        let slot = (peer.fast_sent % u64::from(remote.slots)) as usize;
        let ring_seq = peer.fast_sent + 1;
        let seq = peer.next_seq;
        let base = slot * remote.slot_size;
        let tail = 32 + align8(data.len());
        let mut bytes = vec![0u8; tail + 8];
        bytes[0..8].copy_from_slice(&ring_seq.to_le_bytes());
        bytes[8..16].copy_from_slice(&seq.to_le_bytes());
        bytes[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        bytes[20..24].copy_from_slice(&checksum(seq, data).to_le_bytes());
        bytes[24..32].copy_from_slice(&peer.consumed.to_le_bytes());
        bytes[32..32 + data.len()].copy_from_slice(data);
        bytes[tail..tail + 8].copy_from_slice(&ring_seq.to_le_bytes());
        staging.bytes().write(from, &bytes);
        let target = RemotePointer {
            key: remote.ring_key,
            offset: remote.ring_offset,
        }
        .add(base as u64)
        .ok_or(Error::DaemonGone)?
        .to_u64();
        let (node, port) = (peer.node, peer.port);
        let ctx = context(tag::FAST_PUT, index, entry as u64);
        self.with_token(|port_| port_.put(&staging, from, target, bytes.len(), node, port, ctx))?;
        let peer = &mut self.peers[index];
        peer.reported = peer.consumed;
        peer.fast_sent += 1;
        peer.next_seq += 1;
        Ok(())
    }

    /// Runs `post` until it finds a send token, making progress between tries.
    pub(super) fn with_token(
        &mut self,
        mut post: impl FnMut(&mut Port) -> Result<(), Error>,
    ) -> Result<(), Error> {
        loop {
            match post(&mut self.port) {
                Err(Error::NoSendTokens) => {
                    self.progress()?;
                    std::thread::yield_now();
                }
                other => return other,
            }
        }
    }

    pub(super) fn send_ordinary(
        &mut self,
        bytes: &[u8],
        node: NodeId,
        port: PortId,
        context: u64,
    ) -> Result<(), Error> {
        let mut buffer = match self.spare.pop() {
            Some(buffer) => buffer,
            None => self.port.dma_alloc(BUFFER_LEN)?,
        };
        buffer[..bytes.len()].copy_from_slice(bytes);
        loop {
            match self.port.send(
                buffer,
                bytes.len(),
                SIZE_CLASS,
                Priority::LOW,
                node,
                port,
                context,
            ) {
                Ok(()) => return Ok(()),
                Err(refused) if matches!(refused.error, Error::NoSendTokens) => {
                    buffer = refused.buffer;
                    self.progress()?;
                    std::thread::yield_now();
                }
                Err(refused) => {
                    self.spare.push(refused.buffer);
                    return Err(refused.error);
                }
            }
        }
    }

    pub(super) fn send_control(
        &mut self,
        index: usize,
        kind: u8,
        lock: usize,
        flag: u8,
    ) -> Result<(), Error> {
        let mut bytes = [0u8; ORDINARY_HEADER];
        bytes[0] = kind;
        bytes[1] = flag;
        bytes[8..16].copy_from_slice(&(lock as u64).to_le_bytes());
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.send_ordinary(&bytes, node, port, context(tag::CONTROL, index, 0))
    }
}
