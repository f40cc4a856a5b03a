//! Connection setup: a ring for each peer of the polling set, and the hellos that tell each peer
//! where its ring and this process's lock region lie.

use std::collections::BTreeMap;
use std::time::Instant;

use shared_abi::ids::{NodeId, PortId};

use super::FastPath;
use super::context::{context, tag};
use super::layout::{MAX_MESSAGE, MAX_SLOTS, ORDINARY_HEADER, SLOT_OVERHEAD, align8, kind, u32_at};
use super::message::PeerId;
use super::peer::{Peer, Remote};
use crate::error::Error;

impl FastPath {
    /// Connects to `port` of `node`: registers a ring for it if the polling set has room, and
    /// sends it this side's hello. Does not wait: the peer connects back in its own time
    /// ([`FastPath::wait_connected`]); connecting to every peer first and waiting once lets
    /// processes connect in any order.
    ///
    /// # Errors
    /// What registering memory or sending returns.
    pub fn connect(&mut self, node: NodeId, port: PortId) -> Result<PeerId, Error> {
        if let Some(&index) = self.by_address.get(&(node, port)) {
            return Ok(PeerId(index));
        }
        let index = self.peers.len();
        if index >= self.config.max_peers {
            return Err(Error::Protocol(format!(
                "a fast path of at most {} peers",
                self.config.max_peers
            )));
        }
        let polled = self.config.slots > 0 && self.polled < self.config.polling_set;
        let slot_size = SLOT_OVERHEAD + align8(self.config.slot_payload);
        let ring =
            16 * self.config.max_peers + self.polled * self.config.slots as usize * slot_size;
        let slots = if polled {
            self.polled += 1;
            self.config.slots
        } else {
            0
        };
        self.peers.push(Peer {
            node,
            port,
            ring,
            slots,
            slot_size,
            credit: 16 * index,
            remote: None,
            hello_delivered: false,
            hello_retry: None,
            next_seq: 1,
            fast_sent: 0,
            fast_credited: 0,
            expected: 1,
            consumed: 0,
            reported: 0,
            credit_in_flight: false,
            stash: BTreeMap::new(),
            torn_since: None,
            failed: None,
        });
        self.by_address.insert((node, port), index);
        self.send_hello(index)?;
        // A hello that came before the connect.
        let early = std::mem::take(&mut self.early);
        for (n, p, bytes) in early {
            if (n, p) == (node, port) {
                self.take_hello(index, &bytes)?;
            } else {
                self.early.push((n, p, bytes));
            }
        }
        Ok(PeerId(index))
    }

    /// Waits until every connected peer's hello has come and this side's has reached every
    /// peer. Both: a process that stopped at the first could leave its own hello, refused by a
    /// peer that had not opened its port yet, never sent again, and the peer waiting for it.
    ///
    /// # Errors
    /// [`Error::Protocol`] naming a peer this side's hello failed to reach (and why), or the
    /// peers not connected both ways after the setup timeout.
    pub fn wait_connected(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + self.config.setup_timeout;
        let connected = |p: &Peer| p.remote.is_some() && p.hello_delivered;
        while !self.peers.iter().all(connected) {
            for index in 0..self.peers.len() {
                if !connected(&self.peers[index]) {
                    self.check_failed(index)?;
                }
            }
            if Instant::now() >= deadline {
                let silent: Vec<String> = self
                    .peers
                    .iter()
                    .filter(|p| !connected(p))
                    .map(|p| format!("{}:{}", p.node.get(), p.port.0))
                    .collect();
                return Err(Error::Protocol(format!(
                    "no fast-path connection with {} within {:?}: its hello did not come, or ours \
                     did not reach it",
                    silent.join(", "),
                    self.config.setup_timeout
                )));
            }
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }

    pub(super) fn send_hello(&mut self, index: usize) -> Result<(), Error> {
        let peer = &self.peers[index];
        let mut hello = [0u8; ORDINARY_HEADER + 32];
        hello[0] = kind::HELLO;
        let fields = [
            self.receiving.key(),
            peer.ring as u32,
            peer.credit as u32,
            peer.slots,
            peer.slot_size as u32,
            self.lock_region.key(),
            self.config.locks as u32,
            self.lock_region.len() as u32,
        ];
        for (i, field) in fields.iter().enumerate() {
            let at = ORDINARY_HEADER + 4 * i;
            hello[at..at + 4].copy_from_slice(&field.to_le_bytes());
        }
        let (node, port) = (peer.node, peer.port);
        self.send_ordinary(&hello, node, port, context(tag::HELLO, index, 0))
    }

    pub(super) fn take_hello(&mut self, index: usize, bytes: &[u8]) -> Result<(), Error> {
        let field = |i: usize| u32_at(bytes, ORDINARY_HEADER + 4 * i);
        let fields: Option<Vec<u32>> = (0..8).map(field).collect();
        let Some(f) = fields else {
            self.stats.rejected += 1;
            return Ok(());
        };
        let remote = Remote {
            ring_key: f[0],
            ring_offset: f[1],
            credit_offset: f[2],
            slots: f[3],
            slot_size: f[4] as usize,
            lock_key: f[5],
            locks: f[6],
            lock_len: f[7],
        };
        let sane = remote.slots <= MAX_SLOTS
            && (remote.slots == 0
                || (remote.slot_size >= SLOT_OVERHEAD
                    && remote.slot_size <= SLOT_OVERHEAD + align8(MAX_MESSAGE)
                    && remote.slot_size % 8 == 0));
        if !sane || self.peers[index].remote.is_some() {
            self.stats.rejected += 1;
            return Ok(());
        }
        self.peers[index].remote = Some(remote);
        Ok(())
    }

    /// Waits for `index`'s hello.
    pub(super) fn await_remote(&mut self, index: usize) -> Result<(), Error> {
        if self.peers[index].remote.is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + self.config.setup_timeout;
        while self.peers[index].remote.is_none() {
            self.check_failed(index)?;
            if Instant::now() >= deadline {
                return Err(Error::Protocol(format!(
                    "no fast-path hello from peer {index} within {:?}",
                    self.config.setup_timeout
                )));
            }
            self.progress()?;
            std::thread::yield_now();
        }
        Ok(())
    }
}
