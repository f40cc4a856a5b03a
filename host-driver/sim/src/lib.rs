//! The deterministic simulator: many NICs running the real firmware core in one process, over a
//! simulated wire in virtual time, with a seeded fault plan.
//!
//! Each simulated NIC is the real [`firmware::Nic`] over [`hal::SimHal`]; each simulated host
//! posts tokens and reads events through the real ring code over heap memory ([`memory`]). An
//! event heap orders packet arrivals, NIC timers and host steps; time jumps to the next one. Every
//! random choice — the fabric's size, the faults, the hosts' timing — comes from one seed, which
//! every failure prints, so any failure replays exactly.

#![deny(unsafe_code)]

pub mod adversary;
pub mod barriers;
pub mod cost;
pub mod drive;
pub mod hal;
pub mod host;
pub mod memory;
pub mod messages;
pub mod overlap;
pub mod rdma;
pub mod reductions;
pub mod restarts;
pub mod rng;
pub mod world;

use std::fmt;

/// The fabric key of the campaign of `seed`: every campaign authenticates its packets, as a real
/// fabric does, under a key drawn from its seed.
pub fn campaign_key(seed: u64) -> [u8; 32] {
    let mut rng = rng::Rng::new(seed ^ 0x6b65_795f_6b65_795f);
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    key
}

/// The firmware configuration of the message and one-sided campaigns of `seed`: short timeouts
/// (a campaign runs many simulated seconds of faults), every packet authenticated under the
/// campaign's key, as on a real fabric.
pub(crate) fn campaign_config(seed: u64) -> firmware::Config {
    firmware::Config {
        retransmit_timeout: std::time::Duration::from_micros(400),
        give_up_after: std::time::Duration::from_millis(400),
        receiver_not_ready_timeout: std::time::Duration::from_millis(400),
        retry_interval: std::time::Duration::from_micros(100),
        default_barrier_timeout: std::time::Duration::from_secs(1),
        fabric_key: Some(firmware::auth::FabricKey::new(campaign_key(seed))),
    }
}

/// A seeded campaign: its seed alone replays it.
pub trait Campaign: fmt::Debug {
    /// The seed every choice of the campaign is drawn from.
    fn seed(&self) -> u64;
}

/// What went wrong in a campaign, with everything needed to reproduce it.
#[derive(Debug)]
pub struct CampaignFailure<C> {
    /// The campaign.
    pub campaign: Box<C>,
    /// What was violated.
    pub violation: String,
}

impl<C: Campaign + Clone> CampaignFailure<C> {
    /// `violation`, seen while running `campaign`.
    pub fn new(campaign: &C, violation: String) -> Self {
        Self {
            campaign: Box::new(campaign.clone()),
            violation,
        }
    }
}

impl<C: Campaign> fmt::Display for CampaignFailure<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed: {}\n  campaign: {:?}",
            self.campaign.seed(),
            self.violation,
            self.campaign
        )
    }
}

/// Seeds a campaign runs: `NICBAR_SIM_SEED=S` runs exactly seed `S`; otherwise
/// `NICBAR_SIM_SEEDS=N` (default `default_count`) seeds starting at `NICBAR_SIM_FIRST_SEED`
/// (default 1).
pub fn seeds_from_env(default_count: u64) -> Vec<u64> {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("NICBAR_SIM_SEED") {
        return vec![seed];
    }
    let first = var("NICBAR_SIM_FIRST_SEED").unwrap_or(1);
    let count = var("NICBAR_SIM_SEEDS").unwrap_or(default_count);
    (first..first.saturating_add(count)).collect()
}
