//! The unexpected-barrier record (paper §3.1, §4.3), extended exactly as far as correctness needs.
//!
//! The paper keeps one bit per (connection, source port): "a barrier packet from that port has
//! arrived and not been consumed". That is enough for its PE and GB, where a pair of ports meets at
//! most once per barrier. Two cases break it, and each has its own bit here:
//!
//! - **A peer in several steps of one schedule** (the non-power-of-two PE fix-up; n-way
//!   dissemination on small groups, where several rounds' peers coincide): arrivals are told apart by
//!   the round they carry, so the bits are kept per round — `first` bit `r` means "one packet of
//!   round `r` is waiting".
//! - **A fast peer's packet for the next barrier** arriving before this barrier consumed the
//!   same (peer, round) packet: a barrier completes nowhere before every member entered it, so a
//!   peer runs at most one barrier ahead, and one more bit per round suffices — `second` bit `r`
//!   means "a second packet of round `r` is waiting", the later barrier's.
//!
//! A third arrival for the same (port, round) would be a protocol violation by the sender; it is
//! refused (the packet is rejected as BUSY, and the sender's retry or timeout decides).
//!
//! Each (destination port, source port) cell also keeps the sender's port generation: a packet
//! from a newer incarnation of the source port supersedes what an older one left (paper §3.2).

use shared_abi::ids::{Generation, PORTS_PER_NIC};

/// One cell: what (source port → destination port) has waiting, per round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Cell {
    /// Bit `r`: one packet of round `r` waiting (the earliest barrier's).
    first: u32,
    /// Bit `r`: a second packet of round `r` waiting (the next barrier's; see module docs).
    second: u32,
    /// Generation of the source port that sent what is recorded.
    generation: u32,
}

/// The record of one connection (one remote node, or this node for port-to-port barriers that
/// never touch the wire): cells indexed by `[destination port][source port]`.
#[derive(Clone, Debug, Default)]
pub(crate) struct UnexpectedBarrierRecord {
    cells: [[Cell; PORTS_PER_NIC]; PORTS_PER_NIC],
}

/// Recording refused: a third packet for the same round and ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordFull;

impl UnexpectedBarrierRecord {
    /// Records a barrier packet of `round` from `source_port` (generation `generation`) for
    /// `destination_port`. Ports and round are checked by the caller.
    pub(crate) fn record(
        &mut self,
        destination_port: usize,
        source_port: usize,
        generation: Generation,
        round: u8,
    ) -> Result<(), RecordFull> {
        let Some(cell) = self
            .cells
            .get_mut(destination_port)
            .and_then(|row| row.get_mut(source_port))
        else {
            return Err(RecordFull);
        };
        if cell.generation != generation.get() {
            // A new incarnation of the source port: what the old one left is stale (§3.2).
            *cell = Cell {
                generation: generation.get(),
                ..Cell::default()
            };
        }
        let bit = 1u32.checked_shl(u32::from(round)).ok_or(RecordFull)?;
        if cell.first & bit == 0 {
            cell.first |= bit;
        } else if cell.second & bit == 0 {
            cell.second |= bit;
        } else {
            return Err(RecordFull);
        }
        Ok(())
    }

    /// Consumes one recorded packet of `round` from `source_port` for `destination_port`, if
    /// there is one. The earlier barrier's packet goes first; the next barrier's moves up.
    pub(crate) fn take(&mut self, destination_port: usize, source_port: usize, round: u8) -> bool {
        let Some(cell) = self
            .cells
            .get_mut(destination_port)
            .and_then(|row| row.get_mut(source_port))
        else {
            return false;
        };
        let Some(bit) = 1u32.checked_shl(u32::from(round)) else {
            return false;
        };
        if cell.first & bit == 0 {
            return false;
        }
        if cell.second & bit != 0 {
            cell.second &= !bit;
        } else {
            cell.first &= !bit;
        }
        true
    }

    /// Whether anything from `source_port` is waiting for `destination_port` in `round`.
    pub(crate) fn has(&self, destination_port: usize, source_port: usize, round: u8) -> bool {
        let bit = 1u32.checked_shl(u32::from(round)).unwrap_or(0);
        self.cells
            .get(destination_port)
            .and_then(|row| row.get(source_port))
            .is_some_and(|cell| cell.first & bit != 0)
    }

    /// Forgets everything recorded for `destination_port` (it opened or closed: what it holds
    /// was meant for another incarnation, §3.2).
    pub(crate) fn clear_destination(&mut self, destination_port: usize) {
        if let Some(row) = self.cells.get_mut(destination_port) {
            *row = [Cell::default(); PORTS_PER_NIC];
        }
    }

    /// Forgets what generation `generation` of `source_port` left for `destination_port`.
    pub(crate) fn clear_source(
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
            *cell = Cell::default();
        }
    }

    /// Whether nothing at all is recorded (the connection may be recycled).
    pub(crate) fn is_empty(&self) -> bool {
        self.cells.iter().flatten().all(|cell| cell.first == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G1: Generation = Generation::new(1);
    const G2: Generation = Generation::new(2);

    #[test]
    fn one_bit_per_round_and_one_for_the_next_barrier() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, 0).unwrap();
        record.record(1, 2, G1, 3).unwrap();
        record.record(1, 2, G1, 0).unwrap(); // the fast peer's next barrier
        assert_eq!(record.record(1, 2, G1, 0), Err(RecordFull));
        assert!(record.take(1, 2, 0));
        assert!(record.take(1, 2, 3));
        assert!(!record.take(1, 2, 3));
        assert!(record.take(1, 2, 0));
        assert!(!record.take(1, 2, 0));
        assert!(record.is_empty());
    }

    #[test]
    fn ports_do_not_see_each_other() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, 0).unwrap();
        assert!(!record.take(2, 2, 0));
        assert!(!record.take(1, 3, 0));
        record.clear_destination(2);
        assert!(record.has(1, 2, 0));
        record.clear_destination(1);
        assert!(!record.has(1, 2, 0));
    }

    #[test]
    fn a_new_generation_supersedes_the_old() {
        let mut record = UnexpectedBarrierRecord::default();
        record.record(1, 2, G1, 0).unwrap();
        record.record(1, 2, G1, 1).unwrap();
        record.record(1, 2, G2, 1).unwrap();
        assert!(!record.take(1, 2, 0));
        assert!(record.take(1, 2, 1));
        assert!(!record.take(1, 2, 1));
        record.record(1, 2, G2, 5).unwrap();
        record.clear_source(1, 2, G1);
        assert!(record.has(1, 2, 5));
        record.clear_source(1, 2, G2);
        assert!(!record.has(1, 2, 5));
    }

    #[test]
    fn out_of_range_is_refused_not_a_panic() {
        let mut record = UnexpectedBarrierRecord::default();
        assert_eq!(record.record(8, 0, G1, 0), Err(RecordFull));
        assert_eq!(record.record(0, 0, G1, 32), Err(RecordFull));
        assert!(!record.take(0, 99, 0));
        assert!(!record.take(0, 0, 200));
    }
}
