//! The unexpected-barrier record (paper §3.1, §4.3), extended exactly as far as correctness needs.
//!
//! The paper keeps one bit per (connection, source port): "a barrier packet from that port has
//! arrived and not been consumed". That is enough for its PE and GB, where a pair of ports meets at
//! most once per barrier, every barrier completes, and a port takes part in one group. Real use
//! breaks each of those, so every packet carries its barrier's identity
//! ([`BarrierId`]: job, group, sequence) and the record keeps, per (destination port, source port),
//! a few **slots**, each the rounds recorded for one barrier:
//!
//! - **A peer in several steps of one schedule** (the non-power-of-two PE fix-up; n-way
//!   dissemination on small groups, where several rounds' peers coincide): arrivals are told apart
//!   by the round they carry — slot bit `r` means "the packet of round `r` is waiting".
//! - **A fast peer's packet for its next barrier** arriving before this barrier consumed its own:
//!   a barrier completes nowhere before every member entered it, so a peer runs at most one barrier
//!   of a group ahead; a port runs several barriers (of different groups) at once, and
//!   [`SLOTS`] holds everything live.
//! - **A failed barrier's stragglers** (and packets of a group this port will never run again) can
//!   never be counted by another barrier: a step takes only a packet of its own barrier. A barrier
//!   that ends forgets what is left of its own identity; what no barrier here ever claims is
//!   evicted, oldest first, when a packet of a new barrier finds every slot taken. Packets from one
//!   source port arrive in the order its barriers ran (the connection is in order, and refused
//!   packets are resent in order), so the oldest slot is never a live barrier while a newer one
//!   is: eviction can only drop a packet of a barrier that already failed at its sender.
//!
//! A second arrival for the same (barrier, round) would be a protocol violation by the sender; it is
//! refused (the packet is rejected as BUSY, and the sender's retry or timeout decides).
//!
//! Each cell also keeps the sender's port generation: a packet from a newer incarnation of the
//! source port supersedes what an older one left (paper §3.2).

use shared_abi::event::Status;
use shared_abi::ids::{BarrierId, Generation, NodeId, PORTS_PER_NIC, PortId};

use crate::port::RUNNING_BARRIERS;

/// An abort's news: the member the sender's barrier failed waiting for, and why. The receiver's
/// barrier fails too, naming the same member, so every member still waiting learns who is
/// missing (not merely which neighbour gave up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Failed {
    pub(crate) node: NodeId,
    pub(crate) port: PortId,
    pub(crate) status: Status,
}

/// Barriers one (destination port, source port) cell holds packets of at once. A port runs up to
/// [`RUNNING_BARRIERS`] barriers, so the live ones of a cell are the source's running barriers and
/// those the destination runs that the source has completed already (it completes one only once
/// the destination entered it): twice that, and one more, so that a failed barrier's straggler is
/// evicted before it could crowd out a live one.
pub(crate) const SLOTS: usize = 2 * RUNNING_BARRIERS + 1;

/// The rounds recorded for one barrier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Slot {
    barrier: BarrierId,
    /// Bit `r`: the packet of round `r` is waiting. Zero: the slot is free.
    rounds: u32,
    /// The sender's barrier failed: what it said (any packet taken from the slot then reports it).
    failed: Option<Failed>,
}

/// One cell: what (source port → destination port) has waiting, oldest barrier first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cell {
    /// Taken slots first, in the order their first packet arrived.
    slots: [Slot; SLOTS],
    /// Generation of the source port that sent what is recorded.
    generation: u32,
}

impl Cell {
    /// Moves the taken slots to the front, keeping their order.
    fn compact(&mut self) {
        let mut taken = 0;
        for i in 0..SLOTS {
            if let Some(slot) = self.slots.get(i).copied()
                && slot.rounds != 0
            {
                if let Some(front) = self.slots.get_mut(taken) {
                    *front = slot;
                }
                taken += 1;
            }
        }
        for slot in self.slots.iter_mut().skip(taken) {
            *slot = Slot::default();
        }
    }
}

/// The record of one connection (one remote node, or this node for port-to-port barriers that
/// never touch the wire): cells indexed by `[destination port][source port]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct UnexpectedBarrierRecord {
    cells: [[Cell; PORTS_PER_NIC]; PORTS_PER_NIC],
}

/// Recording refused: a second packet for the same barrier and round, or ports or round out of
/// range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordFull;

/// What recording a packet did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// It is waiting for its barrier.
    Kept,
    /// It is waiting, and made room by dropping what was left of the oldest barrier in the cell
    /// (one that failed at its sender: see the module docs).
    Evicted,
}

impl UnexpectedBarrierRecord {
    /// Records a barrier packet of `round` of `barrier` from `source_port` (generation
    /// `generation`) for `destination_port`.
    pub(crate) fn record(
        &mut self,
        destination_port: usize,
        source_port: usize,
        generation: Generation,
        barrier: BarrierId,
        round: u8,
        failed: Option<Failed>,
    ) -> Result<Recorded, RecordFull> {
        let Some(cell) = self
            .cells
            .get_mut(destination_port)
            .and_then(|row| row.get_mut(source_port))
        else {
            return Err(RecordFull);
        };
        let bit = 1u32.checked_shl(u32::from(round)).ok_or(RecordFull)?;
        if cell.generation != generation.get() {
            // A new incarnation of the source port: what the old one left is stale (§3.2).
            *cell = Cell {
                generation: generation.get(),
                ..Cell::default()
            };
        }
        if let Some(slot) = cell
            .slots
            .iter_mut()
            .find(|slot| slot.rounds != 0 && slot.barrier == barrier && slot.rounds & bit == 0)
        {
            slot.rounds |= bit;
            slot.failed = slot.failed.or(failed);
            return Ok(Recorded::Kept);
        }
        let holding = cell
            .slots
            .iter()
            .filter(|slot| slot.barrier == barrier && slot.rounds & bit != 0)
            .count();
        // A named barrier's round comes once; GM's raw barriers, which name none, may have the
        // next barrier's packet of a round waiting beside this one's (the paper's record, plus
        // the one bit a fast peer needs).
        if holding >= if barrier == BarrierId::NONE { 2 } else { 1 } {
            return Err(RecordFull);
        }
        let mut outcome = Recorded::Kept;
        if cell.slots.iter().all(|slot| slot.rounds != 0) {
            // Every slot taken: the oldest barrier's packets go (module docs).
            if let Some(oldest) = cell.slots.first_mut() {
                oldest.rounds = 0;
            }
            cell.compact();
            outcome = Recorded::Evicted;
        }
        if let Some(free) = cell.slots.iter_mut().find(|slot| slot.rounds == 0) {
            *free = Slot {
                barrier,
                rounds: bit,
                failed,
            };
        }
        Ok(outcome)
    }

    /// Consumes the recorded packet of `round` of `barrier` from `source_port` for
    /// `destination_port`, if there is one: `Some(None)` for an ordinary packet, `Some(Some(..))`
    /// if the sender's barrier failed (an abort).
    pub(crate) fn take(
        &mut self,
        destination_port: usize,
        source_port: usize,
        barrier: BarrierId,
        round: u8,
    ) -> Option<Option<Failed>> {
        let cell = self
            .cells
            .get_mut(destination_port)
            .and_then(|row| row.get_mut(source_port))?;
        let bit = 1u32.checked_shl(u32::from(round))?;
        // The oldest barrier's packet first (GM's raw barriers may hold two of one round).
        let slot = cell
            .slots
            .iter_mut()
            .find(|slot| slot.barrier == barrier && slot.rounds & bit != 0)?;
        slot.rounds &= !bit;
        let failed = slot.failed;
        if slot.rounds == 0 {
            cell.compact();
        }
        Some(failed)
    }

    /// Whether the packet of `round` of `barrier` from `source_port` waits for
    /// `destination_port`.
    pub(crate) fn has(
        &self,
        destination_port: usize,
        source_port: usize,
        barrier: BarrierId,
        round: u8,
    ) -> bool {
        let bit = 1u32.checked_shl(u32::from(round)).unwrap_or(0);
        self.cells
            .get(destination_port)
            .and_then(|row| row.get(source_port))
            .is_some_and(|cell| {
                cell.slots
                    .iter()
                    .any(|slot| slot.barrier == barrier && slot.rounds & bit != 0)
            })
    }

    /// Whether any packet of `barrier` waits for `destination_port`.
    pub(crate) fn holds(&self, destination_port: usize, barrier: BarrierId) -> bool {
        self.cells.get(destination_port).is_some_and(|row| {
            row.iter().any(|cell| {
                cell.slots
                    .iter()
                    .any(|slot| slot.barrier == barrier && slot.rounds != 0)
            })
        })
    }

    /// Forgets every packet of `barrier` recorded for `destination_port` (its barrier ended:
    /// what is left of it can complete nothing).
    pub(crate) fn forget_barrier(&mut self, destination_port: usize, barrier: BarrierId) {
        if let Some(row) = self.cells.get_mut(destination_port) {
            for cell in row.iter_mut() {
                let mut forgot = false;
                for slot in cell.slots.iter_mut() {
                    if slot.barrier == barrier && slot.rounds != 0 {
                        slot.rounds = 0;
                        forgot = true;
                    }
                }
                // Every barrier's end comes here: most find nothing, and need no compaction.
                if forgot {
                    cell.compact();
                }
            }
        }
    }

    /// Forgets everything recorded for `destination_port` (it opened or closed: what it holds
    /// was meant for another incarnation, §3.2).
    pub(crate) fn clear_destination(&mut self, destination_port: usize) {
        if let Some(row) = self.cells.get_mut(destination_port) {
            *row = [Cell::default(); PORTS_PER_NIC];
        }
    }

    /// Generation `generation` of `source_port` closed: forgets the packets of GM's raw
    /// barriers it left for `destination_port`. They name no barrier, so a later incarnation's
    /// could not be told from them (paper §3.2). A named barrier's packets stay: each says that
    /// its sender entered that barrier, which stays true after it exits, and only a barrier of
    /// that identity (its job's) can take them.
    pub(crate) fn forget_raw_from(
        &mut self,
        destination_port: usize,
        source_port: usize,
        generation: Generation,
    ) {
        if let Some(cell) = self
            .cells
            .get_mut(destination_port)
            .and_then(|row| row.get_mut(source_port))
            && cell.generation == generation.get()
        {
            for slot in cell.slots.iter_mut() {
                if slot.barrier == BarrierId::NONE {
                    slot.rounds = 0;
                }
            }
            cell.compact();
        }
    }

    /// Whether nothing at all is recorded (the connection may be recycled).
    pub(crate) fn is_empty(&self) -> bool {
        self.cells
            .iter()
            .flatten()
            .all(|cell| cell.slots.iter().all(|slot| slot.rounds == 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G1: Generation = Generation::new(1);
    const G2: Generation = Generation::new(2);
    const A: BarrierId = BarrierId::new(7, 1, 10);
    const B: BarrierId = BarrierId::new(7, 1, 11);
    const OTHER_GROUP: BarrierId = BarrierId::new(7, 2, 10);

    #[test]
    fn one_bit_per_round_and_a_slot_per_barrier() {
        let mut record = UnexpectedBarrierRecord::default();
        assert_eq!(record.record(1, 2, G1, A, 0, None), Ok(Recorded::Kept));
        record.record(1, 2, G1, A, 3, None).unwrap();
        record.record(1, 2, G1, B, 0, None).unwrap(); // the fast peer's next barrier
        assert_eq!(record.record(1, 2, G1, A, 0, None), Err(RecordFull));
        assert_eq!(record.record(1, 2, G1, B, 0, None), Err(RecordFull));
        assert_eq!(record.take(1, 2, B, 3), None);
        assert_eq!(record.take(1, 2, A, 0), Some(None));
        assert_eq!(record.take(1, 2, A, 3), Some(None));
        assert_eq!(record.take(1, 2, A, 3), None);
        assert_eq!(record.take(1, 2, B, 0), Some(None));
        assert_eq!(record.take(1, 2, B, 0), None);
        assert!(record.is_empty());
    }

    #[test]
    fn a_packet_counts_only_for_its_own_barrier() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, A, 0, None).unwrap();
        assert_eq!(
            record.take(1, 2, B, 0),
            None,
            "a later barrier of the group"
        );
        assert_eq!(
            record.take(1, 2, OTHER_GROUP, 0),
            None,
            "another group's barrier"
        );
        assert_eq!(
            record.take(1, 2, BarrierId::new(8, 1, 10), 0),
            None,
            "another job's"
        );
        assert!(record.has(1, 2, A, 0));
        record.forget_barrier(1, A);
        assert!(!record.has(1, 2, A, 0));
        assert!(record.is_empty());
    }

    #[test]
    fn a_new_barrier_evicts_the_oldest_when_every_slot_is_taken() {
        let nth = |sequence: usize| BarrierId::new(7, 1, 10 + sequence as u32);
        let mut record = UnexpectedBarrierRecord::default();
        // nth(0) is a failed barrier's straggler; the others fill every other slot.
        for sequence in 0..SLOTS {
            assert_eq!(
                record.record(1, 2, G1, nth(sequence), 0, None),
                Ok(Recorded::Kept)
            );
        }
        assert_eq!(
            record.record(1, 2, G1, nth(SLOTS), 0, None),
            Ok(Recorded::Evicted)
        );
        assert!(!record.has(1, 2, nth(0), 0));
        for sequence in 1..=SLOTS {
            assert_eq!(record.take(1, 2, nth(sequence), 0), Some(None));
        }
        assert!(record.is_empty());
        // A slot freed in the middle keeps the others in order: the oldest is still evicted first.
        for sequence in 0..SLOTS {
            record.record(1, 2, G1, nth(sequence), 0, None).unwrap();
        }
        assert_eq!(record.take(1, 2, nth(1), 0), Some(None));
        record.record(1, 2, G1, nth(SLOTS), 0, None).unwrap();
        assert_eq!(
            record.record(1, 2, G1, OTHER_GROUP, 0, None),
            Ok(Recorded::Evicted)
        );
        assert!(!record.has(1, 2, nth(0), 0));
        assert!((2..=SLOTS).all(|sequence| record.has(1, 2, nth(sequence), 0)));
    }

    #[test]
    fn gm_raw_barriers_keep_one_packet_of_the_next_barrier_per_round() {
        let mut record = UnexpectedBarrierRecord::default();
        let none = BarrierId::NONE;
        record.record(1, 2, G1, none, 0, None).unwrap();
        record.record(1, 2, G1, none, 0, None).unwrap(); // the fast peer's next barrier
        assert_eq!(record.record(1, 2, G1, none, 0, None), Err(RecordFull));
        assert_eq!(record.take(1, 2, none, 0), Some(None));
        record.record(1, 2, G1, none, 0, None).unwrap();
        assert_eq!(record.take(1, 2, none, 0), Some(None));
        assert_eq!(record.take(1, 2, none, 0), Some(None));
        assert_eq!(record.take(1, 2, none, 0), None);
        assert!(record.is_empty());
    }

    #[test]
    fn an_abort_is_reported_by_whatever_is_taken_of_its_barrier_from_its_sender() {
        let mut record = UnexpectedBarrierRecord::default();
        let failed = Failed {
            node: NodeId::new(4),
            port: PortId(1),
            status: Status::TARGET_PORT_CLOSED,
        };
        record.record(1, 2, G1, A, 0, None).unwrap();
        record.record(1, 2, G1, A, 2, Some(failed)).unwrap();
        record.record(1, 3, G1, A, 1, None).unwrap();
        assert_eq!(record.take(1, 2, A, 0), Some(Some(failed)));
        assert_eq!(record.take(1, 3, A, 1), Some(None), "another sender's");
        assert_eq!(record.take(1, 2, A, 2), Some(Some(failed)));
        assert!(record.is_empty());
    }

    #[test]
    fn ports_do_not_see_each_other() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, A, 0, None).unwrap();
        assert_eq!(record.take(2, 2, A, 0), None);
        assert_eq!(record.take(1, 3, A, 0), None);
        record.clear_destination(2);
        assert!(record.has(1, 2, A, 0));
        record.forget_barrier(2, A);
        assert!(record.has(1, 2, A, 0));
        record.clear_destination(1);
        assert!(!record.has(1, 2, A, 0));
    }

    #[test]
    fn a_new_generation_supersedes_the_old() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, A, 0, None).unwrap();
        record.record(1, 2, G1, A, 1, None).unwrap();
        record.record(1, 2, G2, A, 1, None).unwrap();
        assert_eq!(record.take(1, 2, A, 0), None);
        assert_eq!(record.take(1, 2, A, 1), Some(None));
        assert_eq!(record.take(1, 2, A, 1), None);
    }

    #[test]
    fn a_closed_source_leaves_its_named_barriers_packets_and_takes_its_raw_ones() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G2, A, 5, None).unwrap();
        record.record(1, 2, G2, BarrierId::NONE, 0, None).unwrap();
        record.forget_raw_from(1, 2, G1);
        assert!(
            record.has(1, 2, BarrierId::NONE, 0),
            "another generation's close"
        );
        record.forget_raw_from(1, 2, G2);
        assert!(!record.has(1, 2, BarrierId::NONE, 0));
        assert_eq!(record.take(1, 2, A, 5), Some(None));
    }

    #[test]
    fn out_of_range_is_refused_not_a_panic() {
        let mut record = UnexpectedBarrierRecord::default();
        assert_eq!(record.record(8, 0, G1, A, 0, None), Err(RecordFull));
        assert_eq!(record.record(0, 0, G1, A, 32, None), Err(RecordFull));
        assert_eq!(record.take(0, 99, A, 0), None);
        assert_eq!(record.take(0, 0, A, 200), None);
    }
}
