//! The deterministic simulator: many NICs running the real firmware core in one process, over a
//! simulated wire in virtual time, with a seeded fault plan.
//!
//! Each simulated NIC is the real [`firmware::Nic`] over [`hal::SimHal`]; each simulated host
//! posts tokens and reads events through the real ring code over heap memory ([`memory`]). An
//! event heap orders packet arrivals, NIC timers and host steps; time jumps to the next one. Every
//! random choice — the fabric's size, the faults, the hosts' timing — comes from one seed, which
//! every failure prints, so any failure replays exactly.

pub mod barriers;
pub mod cost;
pub mod hal;
pub mod host;
pub mod memory;
pub mod messages;
pub mod rng;
pub mod world;

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
