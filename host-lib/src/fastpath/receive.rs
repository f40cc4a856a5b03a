//! The receiver: polling the rings of the polling set, taking ordinary messages, and delivering
//! each pair's messages strictly in sequence from whichever path holds the next.

use std::time::{Duration, Instant};

use shared_abi::ids::{NodeId, PortId};

use super::FastPath;
use super::layout::{ORDINARY_HEADER, SLOT_OVERHEAD, align8, checksum, kind, u32_at, u64_at};
use super::message::{Message, PeerId, Route};
use crate::error::Error;

/// Messages a peer may have waiting out of turn before it is reported as broken.
const STASH_LIMIT: usize = 4096;
/// How long a slot whose tail flag holds may fail its checksum before it is reported as corrupt.
const TORN_LIMIT: Duration = Duration::from_millis(500);

impl FastPath {
    /// The next message, if one is ready: polls the rings of the polling set and takes the port's
    /// events (serving the locks this process hosts meanwhile). Never blocks.
    ///
    /// # Errors
    /// [`Error::Protocol`] if a peer broke the protocol (a corrupt slot, too many messages out of
    /// turn) or a send to it failed: that peer is failed from then on, the others unaffected.
    pub fn poll(&mut self) -> Result<Option<Message>, Error> {
        self.progress()?;
        self.poll_rings()?;
        Ok(self.deliver())
    }

    /// Waits at most `timeout` for the next message, polling (the rings are memory: no event
    /// announces a put into them).
    ///
    /// # Errors
    /// As [`FastPath::poll`].
    pub fn receive_timeout(&mut self, timeout: Duration) -> Result<Option<Message>, Error> {
        let deadline = Instant::now() + timeout;
        let mut idle = 0u32;
        loop {
            if let Some(message) = self.poll()? {
                return Ok(Some(message));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            idle += 1;
            if idle % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    pub(super) fn take_message(
        &mut self,
        node: NodeId,
        port: PortId,
        bytes: &[u8],
    ) -> Result<(), Error> {
        let Some(&kind) = bytes.first() else {
            self.stats.rejected += 1;
            return Ok(());
        };
        let known = self.by_address.get(&(node, port)).copied();
        match (kind, known) {
            (kind::HELLO, Some(index)) => self.take_hello(index, bytes)?,
            (kind::HELLO, None) => {
                if self.early.len() < 1024 {
                    self.early.push((node, port, bytes.to_vec()));
                } else {
                    self.stats.rejected += 1;
                }
            }
            (kind::DATA, Some(index)) => {
                let Some(seq) = u64_at(bytes, 8) else {
                    self.stats.rejected += 1;
                    return Ok(());
                };
                let payload = bytes[ORDINARY_HEADER.min(bytes.len())..].to_vec();
                self.stats.received_ordinary += 1;
                self.stash(index, seq, payload, Route::Ordinary);
            }
            (kind::LOCK_REQUEST | kind::LOCK_GRANT | kind::LOCK_RELEASE, Some(index)) => {
                self.take_lock_message(index, kind, bytes)?;
            }
            _ => self.stats.rejected += 1,
        }
        Ok(())
    }

    pub(super) fn stash(&mut self, index: usize, seq: u64, data: Vec<u8>, route: Route) {
        let peer = &mut self.peers[index];
        if seq < peer.expected || peer.stash.contains_key(&seq) {
            self.stats.rejected += 1;
            return;
        }
        if peer.stash.len() >= STASH_LIMIT {
            peer.failed.get_or_insert_with(|| {
                format!(
                    "{}:{} sent more than {STASH_LIMIT} messages out of turn",
                    peer.node.get(),
                    peer.port.0
                )
            });
            return;
        }
        peer.stash.insert(seq, (data, route));
    }

    /// Reads every complete slot of the polling set's rings.
    pub(super) fn poll_rings(&mut self) -> Result<(), Error> {
        let count = self.peers.len();
        for step in 0..count {
            let index = (self.next_poll + step) % count;
            if self.peers[index].slots == 0 {
                continue;
            }
            while self.read_slot(index)? {}
            // A credit put that found no send token before goes now.
            self.return_credit(index);
        }
        Ok(())
    }

    /// Reads the next slot of `index`'s ring if it is complete; returns whether it was.
    pub(super) fn read_slot(&mut self, index: usize) -> Result<bool, Error> {
        let peer = &mut self.peers[index];
        if peer.failed.is_some() {
            return Ok(false);
        }
        let ring_seq = peer.consumed + 1;
        let base = peer.ring + (peer.consumed % u64::from(peer.slots)) as usize * peer.slot_size;
        let bytes = self.receiving.bytes();
        if bytes.load_u64(base) != ring_seq {
            return Ok(false);
        }
        let mut header = [0u8; 32];
        bytes.read(base, &mut header);
        let seq = u64_at(&header, 8).unwrap_or(0);
        let len = u32_at(&header, 16).unwrap_or(u32::MAX) as usize;
        let sum = u32_at(&header, 20).unwrap_or(0);
        let ack = u64_at(&header, 24).unwrap_or(0);
        let tail = 32 + align8(len);
        if tail + 8 > peer.slot_size {
            peer.failed = Some(format!(
                "{}:{} wrote a fast-path slot of {len} bytes into slots of {}",
                peer.node.get(),
                peer.port.0,
                peer.slot_size - SLOT_OVERHEAD
            ));
            return Err(Error::Protocol(peer.failed.clone().unwrap_or_default()));
        }
        if bytes.load_u64(base + tail) != ring_seq {
            return Ok(false); // Still landing.
        }
        let data = bytes.to_vec(base + 32, len);
        if checksum(seq, &data) != sum {
            let since = *peer.torn_since.get_or_insert_with(Instant::now);
            if since.elapsed() < TORN_LIMIT {
                return Ok(false);
            }
            peer.failed = Some(format!(
                "{}:{} wrote a corrupt fast-path slot (checksum)",
                peer.node.get(),
                peer.port.0
            ));
            return Err(Error::Protocol(peer.failed.clone().unwrap_or_default()));
        }
        peer.torn_since = None;
        peer.consumed += 1;
        if ack <= peer.fast_sent {
            peer.fast_credited = peer.fast_credited.max(ack);
        }
        self.stats.received_fast += 1;
        self.stash(index, seq, data, Route::Fast);
        self.return_credit(index);
        Ok(true)
    }

    /// The next message in turn, from the peers in round-robin order.
    pub(super) fn deliver(&mut self) -> Option<Message> {
        let count = self.peers.len();
        for step in 0..count {
            let index = (self.next_poll + step) % count;
            let peer = &mut self.peers[index];
            let ahead = peer.stash.len() > 1;
            if let Some((data, route)) = peer.stash.remove(&peer.expected) {
                peer.expected += 1;
                if ahead {
                    self.stats.reordered += 1;
                }
                self.next_poll = (index + 1) % count;
                return Some(Message {
                    peer: PeerId(index),
                    data,
                    route,
                });
            }
        }
        None
    }
}
