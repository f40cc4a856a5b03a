//! Barrier campaigns in the deterministic simulator: safety (nobody leaves barrier k before every
//! member entered it) and liveness (every barrier completes, or every member that does not gets an
//! error naming a member it waited for), per algorithm, under loss, duplication, reordering, start
//! skew, changing subsets, concurrent barriers per NIC, the slow-process worst case, and deaths;
//! and barriers that fail because a member skipped them while everyone goes on to the next ones
//! (a failed barrier's packets must complete no later barrier).
//!
//! `NICBAR_SIM_SEEDS=2000 cargo test -p nicbar-sim --release --test sim_barriers` runs more;
//! `NICBAR_SIM_SEED=S` replays one; `NICBAR_SIM_MAX_NODES` raises the largest fabric (default 1024).

use nicbar_sim::barriers::{BarrierCampaign, Family, run};
use nicbar_sim::seeds_from_env;

fn campaign(family: Family, default_seeds: u64) {
    campaigns(family, default_seeds, BarrierCampaign::from_seed);
}

fn campaigns(family: Family, default_seeds: u64, draw: fn(u64, Family, usize) -> BarrierCampaign) {
    let max_nodes = std::env::var("NICBAR_SIM_MAX_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let seeds = seeds_from_env(default_seeds);
    let (mut completions, mut failures, mut replayed) = (0, 0, 0);
    for seed in &seeds {
        let campaign = draw(*seed, family, max_nodes);
        match run(&campaign) {
            Ok(report) => {
                completions += report.completions;
                failures += report.failures;
                replayed += report.replayed;
            }
            Err(failure) => panic!(
                "{failure}\n  replay: NICBAR_SIM_SEED={seed} cargo test -p nicbar-sim --test sim_barriers"
            ),
        }
    }
    println!(
        "{family:?}: {} seeds, {completions} completions, {failures} failures reported, \
         {replayed} packets replayed",
        seeds.len()
    );
    assert!(completions > 0);
    assert!(replayed > 0, "the replay adversary sent nothing again");
}

#[test]
fn pairwise_exchange_campaigns() {
    campaign(Family::PairwiseExchange, 100);
}

#[test]
fn gather_broadcast_campaigns() {
    campaign(Family::GatherBroadcast, 100);
}

#[test]
fn dissemination_campaigns() {
    campaign(Family::Dissemination, 100);
}

#[test]
fn mixed_algorithm_campaigns() {
    campaign(Family::Mixed, 100);
}

/// Every NIC-based gather-broadcast barrier a broadcast from its tree's root: its completion at
/// every member carries the root's bytes, through the same faults, deaths, late opens, exits and
/// absences, beside the other algorithms' barriers.
#[test]
fn broadcast_campaigns_bring_every_member_the_roots_bytes() {
    campaigns(Family::GatherBroadcast, 60, |seed, family, max_nodes| {
        BarrierCampaign::from_seed(seed, family, max_nodes).with_broadcasts()
    });
    campaigns(Family::Mixed, 40, |seed, family, max_nodes| {
        BarrierCampaign::with_absences(seed, family, max_nodes).with_broadcasts()
    });
}

#[test]
fn failed_barriers_complete_no_later_barrier() {
    campaigns(Family::Mixed, 100, BarrierCampaign::with_absences);
}
