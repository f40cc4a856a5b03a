//! Remote locks on a peer's lock words (Li, Potluri, Hamidouche, Jose, Panda, *Efficient and
//! Truly Passive MPI-3 RMA Using InfiniBand Atomics*, and its baseline).
//!
//! **Passive** ([`LockMode::Passive`]): the lock is one 64-bit word in the target's registered
//! memory, changed only by NIC atomics, so the target's process does nothing — it may compute,
//! sleep, or never call the library again. The word holds an exclusive owner in its top 32 bits
//! (the exclusive bit and the owner's identity) and a count of shared holders in its low 32, as
//! the paper divides its word. Exclusive: compare-and-swap from 0 to the owner's bits; released
//! by a fetch-and-add of their negation (which leaves the count of shared requests that came
//! meanwhile alone). Shared: fetch-and-add of 1, kept if no exclusive owner was there, else taken
//! back by adding `u64::MAX` (the paper's decrement) and tried again; released by adding
//! `u64::MAX`. Retries back off exponentially up to 64 µs, polling the caller's own traffic
//! meanwhile and yielding the core.
//!
//! **Served** ([`LockMode::Served`], the baseline that needs the target's progress): a lock
//! request message to the target, which its process grants in FIFO order from inside its own
//! calls to the fast path ([`FastPath::poll`], [`FastPath::receive_timeout`], ...); a release
//! message gives it to the next in the queue. While the target computes without calling the
//! library, no request is granted.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use shared_abi::rdma::AtomicOp;

use super::FastPath;
use super::layout::{kind, u64_at};
use super::message::PeerId;
use crate::error::Error;

/// The exclusive bit of a passive lock word.
const EXCLUSIVE: u64 = 1 << 63;
/// The longest back-off between tries of a passive lock.
const MAX_BACKOFF: Duration = Duration::from_micros(64);

/// How [`FastPath::lock`] takes a peer's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockMode {
    /// By NIC atomics on the lock word, exclusive; the target's process takes no part.
    Passive,
    /// By NIC atomics, shared with other shared holders (never with an exclusive one).
    PassiveShared,
    /// By a request the target's process grants (exclusive): needs the target's progress.
    Served,
}

/// The served locks this process hosts: the holder and the queue of each.
#[derive(Debug)]
pub(super) struct Served {
    locks: Vec<(Option<usize>, VecDeque<usize>)>,
    /// Grants this process got: (peer, lock).
    granted: Vec<(usize, usize)>,
}

impl Served {
    pub(super) fn new(locks: usize) -> Self {
        Self {
            locks: (0..locks).map(|_| (None, VecDeque::new())).collect(),
            granted: Vec::new(),
        }
    }
}

impl FastPath {
    /// Takes lock `lock` of `peer` as `mode` says; returns once it is held.
    ///
    /// # Errors
    /// [`Error::Protocol`] if the peer hosts no such lock or the lock was not had within the
    /// setup timeout; [`Error::Refused`] if an atomic failed.
    pub fn lock(&mut self, peer: PeerId, lock: usize, mode: LockMode) -> Result<(), Error> {
        let index = self.check_peer(peer)?;
        self.await_remote(index)?;
        let owner = self.lock_owner() << 32 | EXCLUSIVE;
        let deadline = Instant::now() + self.config.setup_timeout;
        let mut backoff = Duration::from_micros(1);
        match mode {
            LockMode::Passive => loop {
                let before = self.atomic_on_lock(index, lock, AtomicOp::COMPARE_SWAP, owner, 0)?;
                if before == 0 {
                    return Ok(());
                }
                self.back_off(&mut backoff, deadline)?;
            },
            LockMode::PassiveShared => loop {
                let before = self.atomic_on_lock(index, lock, AtomicOp::FETCH_ADD, 1, 0)?;
                if before & EXCLUSIVE == 0 {
                    return Ok(());
                }
                self.atomic_on_lock(index, lock, AtomicOp::FETCH_ADD, u64::MAX, 0)?;
                self.back_off(&mut backoff, deadline)?;
            },
            LockMode::Served => {
                let hosted = self.peers[index].remote.map_or(0, |r| r.locks as usize);
                if lock >= hosted {
                    return Err(Error::Protocol(format!(
                        "peer {index} hosts {hosted} locks, not lock {lock}"
                    )));
                }
                self.send_control(index, kind::LOCK_REQUEST, lock, 0)?;
                loop {
                    if let Some(at) = self.served.granted.iter().position(|&g| g == (index, lock)) {
                        self.served.granted.swap_remove(at);
                        return Ok(());
                    }
                    self.check_failed(index)?;
                    if Instant::now() >= deadline {
                        return Err(Error::Protocol(format!(
                            "lock {lock} of peer {index} not granted within {:?}",
                            self.config.setup_timeout
                        )));
                    }
                    self.progress()?;
                    if !self.served.granted.contains(&(index, lock)) {
                        // The grant is a message: wait for an event as the port's mode says.
                        self.port
                            .wait_ready(deadline.saturating_duration_since(Instant::now()))?;
                    }
                }
            }
        }
    }

    /// Gives up lock `lock` of `peer`, taken with [`FastPath::lock`] in `mode`.
    ///
    /// # Errors
    /// [`Error::Protocol`] if this process did not hold it (the word is then left as it was);
    /// [`Error::Refused`] if an atomic failed.
    pub fn unlock(&mut self, peer: PeerId, lock: usize, mode: LockMode) -> Result<(), Error> {
        let index = self.check_peer(peer)?;
        let owner = self.lock_owner() << 32 | EXCLUSIVE;
        match mode {
            LockMode::Passive => {
                // Compare-and-swap first when no shared request is in the word; else subtract.
                let before = self.atomic_on_lock(index, lock, AtomicOp::COMPARE_SWAP, 0, owner)?;
                if before == owner {
                    return Ok(());
                }
                if before & !0xffff_ffff != owner {
                    return Err(Error::Protocol(format!(
                        "lock {lock} of peer {index} is not held by this process"
                    )));
                }
                self.atomic_on_lock(index, lock, AtomicOp::FETCH_ADD, owner.wrapping_neg(), 0)
                    .map(|_| ())
            }
            LockMode::PassiveShared => self
                .atomic_on_lock(index, lock, AtomicOp::FETCH_ADD, u64::MAX, 0)
                .map(|_| ()),
            LockMode::Served => self.send_control(index, kind::LOCK_RELEASE, lock, 0),
        }
    }

    fn back_off(&mut self, backoff: &mut Duration, deadline: Instant) -> Result<(), Error> {
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::Protocol(format!(
                "a passive lock not had within {:?}",
                self.config.setup_timeout
            )));
        }
        let until = now + *backoff;
        while Instant::now() < until {
            self.progress()?;
            std::thread::yield_now();
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
        Ok(())
    }

    /// A lock message from peer `index`: a request or release of a lock this process serves, or
    /// a grant of one it asked for.
    pub(super) fn take_lock_message(
        &mut self,
        index: usize,
        kind: u8,
        bytes: &[u8],
    ) -> Result<(), Error> {
        let Some(lock) = u64_at(bytes, 8).and_then(|l| usize::try_from(l).ok()) else {
            self.stats.rejected += 1;
            return Ok(());
        };
        match kind {
            kind::LOCK_GRANT => {
                self.served.granted.push((index, lock));
                Ok(())
            }
            kind::LOCK_REQUEST | kind::LOCK_RELEASE => {
                let Some((holder, queue)) = self.served.locks.get_mut(lock) else {
                    self.stats.rejected += 1;
                    return Ok(());
                };
                if kind == kind::LOCK_REQUEST {
                    if holder.is_none() {
                        *holder = Some(index);
                    } else if queue.len() < 4096 && !queue.contains(&index) {
                        queue.push_back(index);
                        return Ok(());
                    } else {
                        self.stats.rejected += 1;
                        return Ok(());
                    }
                } else if *holder == Some(index) {
                    *holder = queue.pop_front();
                    if holder.is_none() {
                        return Ok(());
                    }
                } else {
                    // A release from a process that does not hold it changes nothing.
                    self.stats.rejected += 1;
                    return Ok(());
                }
                let next = holder.unwrap_or(index);
                self.send_control(next, kind::LOCK_GRANT, lock, 0)
            }
            _ => Ok(()),
        }
    }

    /// This process's identity in lock words: its node and port, never 0.
    fn lock_owner(&self) -> u64 {
        (u64::from(self.port.node_id().get()) << 8 | u64::from(self.port.port_id().0)) + 1
    }
}
