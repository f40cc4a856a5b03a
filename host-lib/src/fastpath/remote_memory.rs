//! Gets, puts and atomics on a peer's lock region (its lock words and shared bytes), each waited
//! for.

use std::time::Instant;

use shared_abi::event::Status;
use shared_abi::rdma::{AtomicOp, RemotePointer};

use super::FastPath;
use super::context::{context, tag};
use super::message::PeerId;
use crate::error::Error;
use crate::port::Port;

impl FastPath {
    /// How many lock words `peer` hosts (its
    /// [`FastPathConfig::locks`](super::FastPathConfig::locks)), waiting for its hello as a send
    /// does.
    ///
    /// # Errors
    /// [`Error::Protocol`] for an unknown peer, or one silent for the setup timeout.
    pub fn peer_locks(&mut self, peer: PeerId) -> Result<usize, Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        Ok(self.peers[index].remote.map_or(0, |r| r.locks as usize))
    }

    /// Posts an atomic, get or put on `peer` and waits for its completion (making progress).
    pub(super) fn wait_operation(
        &mut self,
        index: usize,
        post: impl Fn(&mut Port, u64) -> Result<(), Error>,
    ) -> Result<u64, Error> {
        self.serial += 1;
        let ctx = context(tag::WAITED, index, self.serial);
        self.with_token(|port| post(port, ctx))?;
        let deadline = Instant::now() + self.config.setup_timeout;
        loop {
            if let Some((status, value)) = self.results.remove(&ctx) {
                if status != Status::SUCCESS {
                    return Err(Error::Refused(format!(
                        "an operation on peer {index} failed: {status:?}"
                    )));
                }
                return Ok(value);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Protocol("an operation did not complete".into()));
            }
            self.progress()?;
            if !self.results.contains_key(&ctx) {
                // Its completion is an event: wait for one as the port's wait mode says.
                self.port.wait_ready(deadline - now)?;
            }
        }
    }

    pub(super) fn lock_pointer(
        &self,
        index: usize,
        offset: usize,
        len: usize,
    ) -> Result<u64, Error> {
        let remote = self.peers[index]
            .remote
            .ok_or_else(|| Error::Protocol(format!("peer {index} has not connected")))?;
        if offset + len > remote.lock_len as usize {
            return Err(Error::TooLong {
                length: offset + len,
                max: remote.lock_len as usize,
            });
        }
        Ok(RemotePointer {
            key: remote.lock_key,
            offset: offset as u32,
        }
        .to_u64())
    }

    /// Reads the 64-bit word at byte `offset` of `peer`'s shared bytes (after its lock words) with
    /// a get: no atomicity with other processes.
    ///
    /// # Errors
    /// [`Error::TooLong`] outside the shared bytes; [`Error::Refused`] if the get failed.
    pub fn read_u64(&mut self, peer: PeerId, offset: usize) -> Result<u64, Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        let remote = self.lock_pointer(index, 8 * locks + offset, 8)?;
        let (node, port, scratch) = (
            self.peers[index].node,
            self.peers[index].port,
            self.scratch.clone(),
        );
        self.wait_operation(index, |p, ctx| {
            p.get(remote, &scratch, 0, 8, node, port, ctx)
        })?;
        Ok(scratch.bytes().load_u64(0))
    }

    /// Writes `value` to the 64-bit word at byte `offset` of `peer`'s shared bytes with a put, and
    /// waits until it is in the peer's memory.
    ///
    /// # Errors
    /// As [`FastPath::read_u64`].
    pub fn write_u64(&mut self, peer: PeerId, offset: usize, value: u64) -> Result<(), Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        let remote = self.lock_pointer(index, 8 * locks + offset, 8)?;
        let (node, port, scratch) = (
            self.peers[index].node,
            self.peers[index].port,
            self.scratch.clone(),
        );
        // The scratch word is rewritten only once the previous operation on it completed.
        scratch.bytes().write(8, &value.to_le_bytes());
        self.wait_operation(index, |p, ctx| {
            p.put(&scratch, 8, remote, 8, node, port, ctx)
        })
        .map(|_| ())
    }

    pub(super) fn atomic_on_lock(
        &mut self,
        index: usize,
        lock: usize,
        op: AtomicOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64, Error> {
        let remote = self.lock_pointer(index, 8 * lock, 8)?;
        let locks = self.peers[index].remote.map_or(0, |r| r.locks as usize);
        if lock >= locks {
            return Err(Error::Protocol(format!(
                "peer {index} hosts {locks} locks, not lock {lock}"
            )));
        }
        let (node, port) = (self.peers[index].node, self.peers[index].port);
        self.wait_operation(index, |p, ctx| {
            p.atomic(op, remote, operand, compare, node, port, ctx)
        })
    }
}
