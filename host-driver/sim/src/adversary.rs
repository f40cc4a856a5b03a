//! A replay adversary: an attacker on the path with no key, who records genuine packets as they
//! cross the wire and sends them again later — after restarts, give-ups and idle gaps — from the
//! right source, to the right destination. Whatever it sends must change nothing: no message
//! delivered twice or from an earlier incarnation, no barrier completed early (the campaigns'
//! checks see both).

use std::time::Duration;

use super::rng::Rng;

/// Packets the adversary keeps at most (a reservoir sample of everything it saw).
const RECORD: usize = 4096;

/// The adversary's recording and its plan of bursts.
pub struct Adversary {
    /// Its own generator (drawn from the campaign's seed), so a world with an adversary makes
    /// every other choice as the same world without one.
    rng: Rng,
    /// Recorded packets: (destination node, bytes).
    record: Vec<(usize, Vec<u8>)>,
    seen: u64,
    /// When bursts are due (nanoseconds of virtual time, ascending), and how many packets each.
    bursts: Vec<(u64, usize)>,
    /// Packets sent again so far.
    pub replayed: u64,
}

impl Adversary {
    /// An adversary of `seed` that replays bursts at random times within `active` (while the
    /// campaign's traffic runs) and more after `idle` (past the give-up time, on a quiet link).
    pub fn new(seed: u64, active: Duration, idle: Duration) -> Self {
        let mut rng = Rng::new(seed ^ 0x5eed_ad5e_7a11_0001);
        let mut bursts = Vec::new();
        for _ in 0..8 {
            let at = rng.below(active.as_nanos() as u64 + 1);
            bursts.push((at, rng.range(1..64) as usize));
        }
        for _ in 0..4 {
            let at = idle.as_nanos() as u64 + rng.below(idle.as_nanos() as u64 + 1);
            bursts.push((at, rng.range(16..256) as usize));
        }
        bursts.sort_unstable();
        Self {
            rng,
            record: Vec::new(),
            seen: 0,
            bursts,
            replayed: 0,
        }
    }

    /// Sees one genuine packet on its way to `destination`.
    pub fn observe(&mut self, destination: usize, bytes: &[u8]) {
        self.seen += 1;
        if self.record.len() < RECORD {
            self.record.push((destination, bytes.to_vec()));
        } else {
            let slot = self.rng.below(self.seen) as usize;
            if let Some(kept) = self.record.get_mut(slot) {
                *kept = (destination, bytes.to_vec());
            }
        }
    }

    /// When the next burst is due.
    pub fn next_burst(&self) -> Option<u64> {
        self.bursts.first().map(|(at, _)| *at)
    }

    /// The packets of the burst due now: recorded packets, picked at random (some twice).
    pub fn take_burst(&mut self) -> Vec<(usize, Vec<u8>)> {
        if self.bursts.is_empty() {
            return Vec::new();
        }
        let (_, count) = self.bursts.remove(0);
        if self.record.is_empty() {
            return Vec::new();
        }
        let mut burst = Vec::with_capacity(count);
        for _ in 0..count {
            let pick = self.rng.below(self.record.len() as u64) as usize;
            burst.push(self.record[pick].clone());
        }
        self.replayed += burst.len() as u64;
        burst
    }

    /// Everything recorded, in order (a whole capture sent again).
    pub fn recording(&self) -> Vec<(usize, Vec<u8>)> {
        self.record.clone()
    }
}

impl Adversary {
    /// An adversary that only records: the campaign sends its capture again when it chooses.
    pub fn recorder(seed: u64) -> Self {
        let mut adversary = Self::new(seed, Duration::ZERO, Duration::ZERO);
        adversary.bursts.clear();
        adversary
    }
}
