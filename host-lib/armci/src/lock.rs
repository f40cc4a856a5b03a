//! ARMCI's mutexes (thesis ch. 5): the ticket lock its ARMCI had, beside the MCS software queue
//! lock the thesis put in its place — both on the NIC's atomics, so a lock's owner process never
//! has to make progress for anyone to take or pass its lock.
//!
//! Where the words are: each rank's lock words (two per lock: the MCS tail, or the ticket lock's
//! next ticket and now-serving counter) lie in its own memory; each rank has a queue node (a
//! `next` word and a `locked` flag) per lock in its own memory, which only its predecessor and
//! successor write, with NIC atomics, and which it reads itself. The tail word is only ever
//! touched by NIC atomics, so it holds a whole tag: the rank plus one in the low 16 bits and the
//! acquisition's number above — the witness a test uses to check the queue's order.
//!
//! The process reads its own `next` and `locked` one byte at a time (its registered bytes are
//! atomic bytes), so the values are chosen so that no read can see half of one: `locked` goes
//! from 1 to 0 in its first byte, and `next` holds a rank in three bytes that each go from 0 to a
//! value with the top bit set — a reader takes `next` as written only once all three are.

use std::time::{Duration, Instant};

use nicbar::{AtomicOp, RemotePointer, SharedBytes};

use crate::config::LockMode;
use crate::core::{Armci, control, message, read_u32, read_u64};
use crate::error::ArmciError;
use crate::lock_state::{LockName, Mutexes};

/// The place a lock was granted in: what a test checks FIFO order with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    /// The ticket lock's ticket: grants come in ticket order.
    Ticket(u64),
    /// The queue lock: this acquisition's number on this rank, and the acquisition it queued
    /// behind (rank and number), if the lock was not free.
    Queue {
        /// This acquisition's number on this rank.
        sequence: u64,
        /// The acquisition ahead of it in the queue.
        predecessor: Option<(usize, u64)>,
    },
}

/// How often a releasing rank looks for its successor's link while it waits for it.
const LINK_POLL: Duration = Duration::from_micros(20);

/// How often a queued rank asks the NIC whether the rank ahead of it is still there (an atomic
/// read of that rank's queue node, refused once its process is gone).
const PROBE: Duration = Duration::from_millis(50);

/// The `locked` byte a queued rank finds when the rank ahead of it gave up because a rank
/// further ahead is gone (it is 1 while waiting and 0 once granted).
const BROKEN: u8 = 2;

/// Bytes of one lock's words and of one queue node.
const SLOT: usize = 16;

/// `next` as the three bytes a successor writes.
fn encode_next(rank: usize) -> u64 {
    let r = rank as u64;
    (0x80 | (r & 0x7f)) | (0x80 | ((r >> 7) & 0x7f)) << 8 | (0x80 | ((r >> 14) & 0x7f)) << 16
}

/// The rank in `next`'s first three bytes, once all three are written.
fn decode_next(bytes: [u8; 3]) -> Option<usize> {
    if bytes.iter().all(|b| b & 0x80 != 0) {
        Some(
            usize::from(bytes[0] & 0x7f)
                | usize::from(bytes[1] & 0x7f) << 7
                | usize::from(bytes[2] & 0x7f) << 14,
        )
    } else {
        None
    }
}

/// The tail word's tag of acquisition `sequence` of `rank`.
fn tag(rank: usize, sequence: u64) -> u64 {
    (rank as u64 + 1) | (sequence << 16)
}

impl Armci {
    /// ARMCI_Create_mutexes: creates `count` mutexes on this rank (each rank may create a
    /// different number); mutex `m` of rank `r` is then `(m, r)`. Collective.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if mutexes exist already; the port's region table full; a peer's
    /// failure.
    pub fn create_mutexes(&mut self, count: usize) -> Result<(), ArmciError> {
        if self.mutexes.is_some() {
            return Err(ArmciError::Invalid(
                "mutexes exist: destroy them first".to_owned(),
            ));
        }
        // Own lock words, then a queue node per mutex of the job: the job's total is known once
        // the counts are exchanged.
        let mut entry = Vec::with_capacity(8);
        entry.extend_from_slice(&(count as u64).to_le_bytes());
        let counts: Vec<usize> = self
            .exchange(&entry)?
            .iter()
            .map(|e| read_u64(e, 0).map(|c| c as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| ArmciError::Protocol("a short mutex count".to_owned()))?;
        let mut first = Vec::with_capacity(counts.len());
        let mut total = 0usize;
        for &c in &counts {
            first.push(total);
            total = total
                .checked_add(c)
                .filter(|&t| t <= 1 << 20)
                .ok_or_else(|| ArmciError::Invalid("more than 2^20 mutexes".to_owned()))?;
        }
        let region = self.port.register_memory((count + total).max(1) * SLOT)?;
        let keys: Vec<u32> = self
            .exchange(&region.key().to_le_bytes())?
            .iter()
            .map(|e| read_u32(e, 0))
            .collect::<Option<_>>()
            .ok_or_else(|| ArmciError::Protocol("a short mutex key".to_owned()))?;
        self.mutexes = Some(Mutexes {
            region,
            keys,
            counts,
            first,
        });
        Ok(())
    }

    /// ARMCI_Destroy_mutexes: every rank stops using its mutexes; then they go. Collective.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if none exist, or one is still held here; the barrier's failure.
    pub fn destroy_mutexes(&mut self) -> Result<(), ArmciError> {
        if self.mutexes.is_none() {
            return Err(ArmciError::Invalid("no mutexes to destroy".to_owned()));
        }
        if let Some(name) = self
            .locks
            .held
            .keys()
            .find(|n| matches!(n, LockName::Mutex { .. }))
        {
            return Err(ArmciError::Invalid(format!("{name:?} is still held")));
        }
        self.barrier()?;
        if let Some(mutexes) = self.mutexes.take() {
            self.port.deregister_memory(&mutexes.region)?;
        }
        Ok(())
    }

    /// ARMCI_Lock: waits until this rank holds mutex `mutex` of `rank`; returns the grant's
    /// place in the lock's order.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] for a mutex that does not exist or is held here already; an
    /// atomic failing (the owner's process gone).
    pub fn lock(&mut self, mutex: usize, rank: usize) -> Result<Grant, ArmciError> {
        self.check_mutex(mutex, rank)?;
        self.acquire(LockName::Mutex { mutex, rank })
    }

    /// ARMCI_Unlock: gives mutex `mutex` of `rank` up. Puts made while holding it are not
    /// waited for: fence them first, as ARMCI says.
    ///
    /// # Errors
    /// [`ArmciError::Invalid`] if this rank does not hold it; an atomic failing.
    pub fn unlock(&mut self, mutex: usize, rank: usize) -> Result<(), ArmciError> {
        self.check_mutex(mutex, rank)?;
        self.release(LockName::Mutex { mutex, rank })
    }

    fn check_mutex(&self, mutex: usize, rank: usize) -> Result<(), ArmciError> {
        self.check_rank(rank)?;
        let mutexes = self
            .mutexes
            .as_ref()
            .ok_or_else(|| ArmciError::Invalid("no mutexes: create them first".to_owned()))?;
        if mutex < mutexes.counts[rank] {
            Ok(())
        } else {
            Err(ArmciError::Invalid(format!(
                "rank {rank} has {} mutexes, not {}",
                mutexes.counts[rank],
                mutex + 1
            )))
        }
    }

    /// The remote pointer to `name`'s lock words, and their owner.
    fn lock_words(&self, name: LockName) -> (usize, u64) {
        match name {
            LockName::Accumulate(rank) => (rank, self.control_word(rank, control::ACC_LOCK)),
            LockName::Mutex { mutex, rank } => {
                let mutexes = self.mutexes.as_ref().expect("checked by check_mutex");
                let pointer = RemotePointer {
                    key: mutexes.keys[rank],
                    offset: (mutex * SLOT) as u32,
                };
                (rank, pointer.to_u64())
            }
        }
    }

    /// The remote pointer to `rank`'s queue node for `name`.
    fn queue_node(&self, name: LockName, rank: usize) -> u64 {
        match name {
            LockName::Accumulate(_) => self.control_word(rank, control::ACC_NODE),
            LockName::Mutex { mutex, rank: owner } => {
                let mutexes = self.mutexes.as_ref().expect("checked by check_mutex");
                let global = mutexes.first[owner] + mutex;
                RemotePointer {
                    key: mutexes.keys[rank],
                    offset: ((mutexes.counts[rank] + global) * SLOT) as u32,
                }
                .to_u64()
            }
        }
    }

    /// This rank's queue node for `name`: its bytes and the node's offset in them.
    fn own_queue_node(&self, name: LockName) -> (SharedBytes, usize) {
        match name {
            LockName::Accumulate(_) => (self.control.bytes().clone(), control::ACC_NODE as usize),
            LockName::Mutex { mutex, rank: owner } => {
                let mutexes = self.mutexes.as_ref().expect("checked by check_mutex");
                let global = mutexes.first[owner] + mutex;
                (
                    mutexes.region.bytes().clone(),
                    (mutexes.counts[self.rank] + global) * SLOT,
                )
            }
        }
    }

    pub(crate) fn acquire(&mut self, name: LockName) -> Result<Grant, ArmciError> {
        if self.locks.held.contains_key(&name) {
            return Err(ArmciError::Invalid(format!(
                "{name:?} is held by this rank already"
            )));
        }
        let (owner, words) = self.lock_words(name);
        let (grant, tag) = match self.config.lock {
            LockMode::Ticket => {
                let ticket = self.atomic(AtomicOp::FETCH_ADD, owner, words, 1, 0)?;
                let serving = words + 8;
                // Thesis §5.1.3: poll the owner's counter until it shows the ticket. Each poll
                // is a round trip to the owner's NIC, during which this process sleeps. The
                // ticket lock does not know its holder: a holder that died is seen only as a
                // wait past the timeout.
                let deadline = Instant::now() + self.config.collective_timeout;
                while self.atomic(AtomicOp::FETCH_ADD, owner, serving, 0, 0)? != ticket {
                    if Instant::now() >= deadline {
                        return Err(ArmciError::Timeout {
                            what: "ARMCI_Lock (a ticket lock: its holder may be gone)",
                            rank: owner,
                        });
                    }
                }
                (Grant::Ticket(ticket), ticket)
            }
            LockMode::Mcs => self.acquire_queued(name, owner, words)?,
        };
        self.locks.held.insert(name, tag);
        Ok(grant)
    }

    /// Thesis §5.2.2: swap this rank's tag into the tail; behind a predecessor, link into its
    /// `next` and wait for the `locked` flag in this rank's own memory to clear.
    fn acquire_queued(
        &mut self,
        name: LockName,
        owner: usize,
        tail: u64,
    ) -> Result<(Grant, u64), ArmciError> {
        self.locks.sequence += 1;
        let sequence = self.locks.sequence & ((1 << 48) - 1);
        let me = tag(self.rank, sequence);
        let (node, at) = self.own_queue_node(name);
        // Nobody knows of this node until the swap: the plain writes cannot race the NIC's.
        node.write(at, &[0; 8]);
        node.write(at + 8, &[1]);
        let previous = self.atomic(AtomicOp::SWAP, owner, tail, me, 0)?;
        if previous == 0 {
            return Ok((
                Grant::Queue {
                    sequence,
                    predecessor: None,
                },
                me,
            ));
        }
        let predecessor = (previous & 0xffff) as usize;
        if predecessor == 0 || predecessor > self.size() {
            return Err(ArmciError::Protocol(format!(
                "the tail of {name:?} held {previous:#x}, which names no rank"
            )));
        }
        let predecessor = predecessor - 1;
        let their_next = self.queue_node(name, predecessor);
        self.post_atomic(
            AtomicOp::SWAP,
            predecessor,
            their_next,
            encode_next(self.rank),
            0,
            Some("lock link"),
        )?;
        // Wait for the grant, asking now and then whether the rank ahead is still there: a
        // holder or waiter that died would otherwise keep everyone behind it waiting for ever.
        let mut probe_at = Instant::now() + PROBE;
        loop {
            match node.to_vec(at + 8, 1)[0] {
                0 => break,
                BROKEN => {
                    let error = ArmciError::LockAbandoned {
                        lock: describe(name),
                        rank: predecessor,
                        gone: false,
                    };
                    return Err(self.abandon(name, owner, tail, me, error));
                }
                _ => {}
            }
            if Instant::now() >= probe_at {
                match self.atomic(AtomicOp::FETCH_ADD, predecessor, their_next, 0, 0) {
                    Ok(_) => {}
                    Err(ArmciError::Operation { .. }) => {
                        // The link to it failed too, if it died before the link came.
                        self.poll()?;
                        self.forget_failure("lock link", predecessor);
                        // It may have told this rank it gave up just before it left.
                        let error = ArmciError::LockAbandoned {
                            lock: describe(name),
                            rank: predecessor,
                            gone: node.to_vec(at + 8, 1)[0] != BROKEN,
                        };
                        return Err(self.abandon(name, owner, tail, me, error));
                    }
                    Err(error) => return Err(error),
                }
                probe_at = Instant::now() + PROBE;
            }
            self.progress(Some(probe_at))?;
        }
        Ok((
            Grant::Queue {
                sequence,
                predecessor: Some((predecessor, previous >> 16)),
            },
            me,
        ))
    }

    pub(crate) fn release(&mut self, name: LockName) -> Result<(), ArmciError> {
        let tag = self
            .locks
            .held
            .remove(&name)
            .ok_or_else(|| ArmciError::Invalid(format!("{name:?} is not held by this rank")))?;
        let (owner, words) = self.lock_words(name);
        match self.config.lock {
            LockMode::Ticket => {
                self.atomic(AtomicOp::FETCH_ADD, owner, words + 8, 1, 0)?;
            }
            LockMode::Mcs => {
                let (node, at) = self.own_queue_node(name);
                let read_next = |node: &SharedBytes| {
                    let mut bytes = [0; 3];
                    node.read(at, &mut bytes);
                    decode_next(bytes)
                };
                let successor = match read_next(&node) {
                    Some(successor) => successor,
                    None => {
                        // Seemingly last: free the lock unless someone swapped in meanwhile.
                        let old = self.atomic(AtomicOp::COMPARE_SWAP, owner, words, 0, tag)?;
                        if old == tag {
                            return Ok(());
                        }
                        // Someone did, and links itself right after its swap returned.
                        self.await_link(name, &node, at, words)?
                    }
                };
                if successor >= self.size() {
                    return Err(ArmciError::Protocol(format!(
                        "the queue node of {name:?} names rank {successor}"
                    )));
                }
                let their_locked = self.queue_node(name, successor) + 8;
                self.post_atomic(
                    AtomicOp::SWAP,
                    successor,
                    their_locked,
                    0,
                    0,
                    Some("lock handoff"),
                )?;
                self.send_message(successor, message::WAKE, 0, 0, &[])?;
            }
        }
        Ok(())
    }

    /// Waits for the rank that swapped itself in behind this one to link into this rank's
    /// `next`: looks again every LINK_POLL (sleeping on the port meanwhile), rather than have
    /// every queued acquisition send a wake-up for this rare case. Gives up after the timeout
    /// (that rank died between its swap and its link), naming the rank in the tail.
    fn await_link(
        &mut self,
        name: LockName,
        node: &SharedBytes,
        at: usize,
        tail: u64,
    ) -> Result<usize, ArmciError> {
        let deadline = Instant::now() + self.config.collective_timeout;
        loop {
            let mut bytes = [0; 3];
            node.read(at, &mut bytes);
            if let Some(successor) = decode_next(bytes) {
                return Ok(successor);
            }
            if Instant::now() >= deadline {
                let (owner, _) = self.lock_words(name);
                let last = self.atomic(AtomicOp::FETCH_ADD, owner, tail, 0, 0)?;
                return Err(ArmciError::Timeout {
                    what: "the lock's next waiter to link itself",
                    rank: ((last & 0xffff) as usize).saturating_sub(1),
                });
            }
            self.progress(Some(Instant::now() + LINK_POLL))?;
        }
    }

    /// A queued acquisition gives up with `error` (the rank ahead is gone, or gave up itself):
    /// with nobody behind, the lock is freed, so that later acquisitions are served; else the
    /// rank behind is told (its `locked` byte becomes [`BROKEN`]) and gives up in turn. Every
    /// rank queued behind a dead one thus fails, naming it or the rank ahead, and none waits
    /// for ever. Returns `error`, or what failed on the way.
    fn abandon(
        &mut self,
        name: LockName,
        owner: usize,
        tail: u64,
        me: u64,
        error: ArmciError,
    ) -> ArmciError {
        let (node, at) = self.own_queue_node(name);
        let successor = match self.atomic(AtomicOp::COMPARE_SWAP, owner, tail, 0, me) {
            Ok(old) if old == me => return error,
            Ok(_) => self.await_link(name, &node, at, tail),
            // The lock's owner is gone too: nobody can take the lock again, but a rank
            // already linked behind this one is still told.
            Err(_) => {
                let mut bytes = [0; 3];
                node.read(at, &mut bytes);
                match decode_next(bytes) {
                    Some(successor) => Ok(successor),
                    None => return error,
                }
            }
        };
        let successor = match successor {
            Ok(successor) if successor < self.size() => successor,
            Ok(successor) => {
                return ArmciError::Protocol(format!(
                    "the queue node of {name:?} names rank {successor}"
                ));
            }
            Err(failed) => return failed,
        };
        // Waited for, so that the rank behind hears it even if this process exits next.
        let their_locked = self.queue_node(name, successor) + 8;
        if let Err(failed) = self
            .atomic(
                AtomicOp::SWAP,
                successor,
                their_locked,
                u64::from(BROKEN),
                0,
            )
            .and_then(|_| self.send_message(successor, message::WAKE, 0, 0, &[]))
        {
            return failed;
        }
        error
    }
}

/// A lock's name as ARMCI's user knows it.
fn describe(name: LockName) -> String {
    match name {
        LockName::Accumulate(rank) => format!("the accumulate lock of rank {rank}"),
        LockName::Mutex { mutex, rank } => format!("mutex {mutex} of rank {rank}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_is_read_only_once_all_three_bytes_are_written() {
        for rank in [0, 1, 127, 128, 255, 256, 16_383, 16_384, (1 << 21) - 1] {
            let bytes = encode_next(rank).to_le_bytes();
            assert_eq!(decode_next([bytes[0], bytes[1], bytes[2]]), Some(rank));
            // Any byte still zero (not yet written): not a rank.
            for missing in 0..3 {
                let mut partial = [bytes[0], bytes[1], bytes[2]];
                partial[missing] = 0;
                assert_eq!(decode_next(partial), None, "rank {rank}, byte {missing}");
            }
        }
        assert_eq!(decode_next([0, 0, 0]), None);
    }

    #[test]
    fn tags_name_the_rank_and_the_acquisition() {
        let t = tag(5, 77);
        assert_eq!((t & 0xffff) - 1, 5);
        assert_eq!(t >> 16, 77);
        assert_ne!(tag(0, 0), 0, "a tag is never the empty tail");
    }
}
