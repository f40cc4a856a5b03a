//! The fault injector: wraps the emulated wire and loses, duplicates, delays and reorders packets,
//! drawn from a seeded generator (smoltcp's `FaultInjector` is the model). A host's kernel may lack
//! netem (and it needs privileges), so faults live in user space, on the sending side of each NIC.
//!
//! Reordering is a random extra delay: a packet held back is overtaken by the ones sent after it.
//! Each NIC draws from its own stream of the seed, so one seed fixes every NIC's sequence of
//! decisions (which packet meets which decision still depends on the threads' timing).

use std::time::Duration;

use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

/// What the fault injector does to packets. Probabilities are per packet, in `0.0..=1.0`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultConfig {
    /// Seed of the decisions; print it so a failing run can be repeated.
    pub seed: u64,
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that a packet is delivered twice.
    pub duplicate: f64,
    /// Probability that a copy is held back by up to `reorder_window`.
    pub reorder: f64,
    /// Longest extra delay of a reordered copy.
    pub reorder_window: Duration,
    /// Delay every packet by this much.
    pub delay: Duration,
}

impl FaultConfig {
    /// No faults, with `seed` for when some are switched on.
    pub fn none(seed: u64) -> Self {
        Self {
            seed,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_window: Duration::from_millis(1),
            delay: Duration::ZERO,
        }
    }

    /// Whether the injector does anything at all.
    pub fn is_active(&self) -> bool {
        self.loss > 0.0 || self.duplicate > 0.0 || self.reorder > 0.0 || !self.delay.is_zero()
    }

    /// Checks the probabilities.
    ///
    /// # Errors
    /// A message naming the probability out of range.
    pub fn validate(&self) -> Result<(), String> {
        for (name, value) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("reorder", self.reorder),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(format!("{name} probability {value} is not within 0..=1"));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for FaultConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} loss {} duplicate {} reorder {} (window {:?}) delay {:?}",
            self.seed, self.loss, self.duplicate, self.reorder, self.reorder_window, self.delay
        )
    }
}

/// SplitMix64 (`rand_xoshiro`'s): small, fast, and good enough to draw fault decisions from.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    /// The generator for stream `stream` of `seed`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut rng = Self(SplitMix64::seed_from_u64(
            seed ^ stream.wrapping_mul(0xd1b5_4a32_d192_ed03),
        ));
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A uniform draw from `0.0..1.0`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether an event of probability `p` happens.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// A uniform draw from `0..=max`.
    pub fn duration_up_to(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.unit())
    }
}

/// The copies of one packet to deliver, each after its delay. No copy: the packet is lost.
pub type Fate = [Option<Duration>; 2];

/// Draws a [`Fate`] for each packet.
#[derive(Clone, Debug)]
pub struct FaultInjector {
    config: FaultConfig,
    rng: Rng,
}

impl FaultInjector {
    /// An injector for the NIC with stream number `stream` (its unit).
    pub fn new(config: FaultConfig, stream: u64) -> Self {
        Self {
            config,
            rng: Rng::new(config.seed, stream),
        }
    }

    /// What happens to the next packet.
    pub fn fate(&mut self) -> Fate {
        if self.rng.chance(self.config.loss) {
            return [None, None];
        }
        let copies = if self.rng.chance(self.config.duplicate) {
            2
        } else {
            1
        };
        let mut fate = [None, None];
        for slot in fate.iter_mut().take(copies) {
            let mut delay = self.config.delay;
            if self.rng.chance(self.config.reorder) {
                delay += self.rng.duration_up_to(self.config.reorder_window);
            }
            *slot = Some(delay);
        }
        fate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(config: FaultConfig, packets: usize) -> (usize, usize, usize) {
        let mut injector = FaultInjector::new(config, 3);
        let (mut lost, mut doubled, mut delayed) = (0, 0, 0);
        for _ in 0..packets {
            let fate = injector.fate();
            match fate {
                [None, None] => lost += 1,
                [Some(_), Some(_)] => doubled += 1,
                _ => {}
            }
            delayed += fate.iter().flatten().filter(|d| !d.is_zero()).count();
        }
        (lost, doubled, delayed)
    }

    #[test]
    fn rates_match_the_configuration() {
        let config = FaultConfig {
            loss: 0.15,
            duplicate: 0.1,
            reorder: 0.2,
            ..FaultConfig::none(77)
        };
        let (lost, doubled, delayed) = tally(config, 100_000);
        assert!((14_000..16_000).contains(&lost), "lost {lost}");
        assert!((7_800..9_200).contains(&doubled), "doubled {doubled}");
        // Copies: 85 000 + 8 500; a fifth of them reordered.
        assert!((17_500..19_900).contains(&delayed), "delayed {delayed}");
        assert_eq!(tally(FaultConfig::none(77), 1000), (0, 0, 0));
    }

    #[test]
    fn one_seed_one_sequence_of_decisions() {
        let config = FaultConfig {
            loss: 0.3,
            duplicate: 0.3,
            reorder: 0.3,
            ..FaultConfig::none(5)
        };
        let draw = |stream| {
            let mut injector = FaultInjector::new(config, stream);
            (0..64).map(|_| injector.fate()).collect::<Vec<_>>()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    /// The stream a printed seed replays is the one of the SplitMix64 the injector had before
    /// it used `rand_xoshiro`'s: stream 0 of seed 7 skips the first draw of state 7.
    #[test]
    fn the_stream_of_a_seed_is_the_one_recorded_seeds_replay() {
        let mut rng = Rng::new(7, 0);
        assert_eq!(rng.next_u64(), 0x044c_3cd7_f43c_661c);
    }

    #[test]
    fn probabilities_out_of_range_are_refused() {
        let config = FaultConfig {
            loss: 1.5,
            ..FaultConfig::none(0)
        };
        assert_eq!(
            config.validate(),
            Err("loss probability 1.5 is not within 0..=1".to_owned())
        );
        assert_eq!(FaultConfig::none(0).validate(), Ok(()));
    }
}
