//! Reduction campaigns in the deterministic simulator: consecutive allreduces in the NIC (random
//! operation, type and length up to 32 bytes; the whole fabric and random subsets of every size;
//! several at once per port) through the full firmware over a lossy, duplicating, reordering wire
//! with the replay adversary, and in some seeds processes that die and nodes that stop. Every
//! member that completes gets the host's bytes; nobody completes before every member entered; a
//! member that cannot complete fails naming a member really missing, only when one died.
//!
//! `NICBAR_SIM_SEEDS=10000 cargo test -p nicbar-sim --release --test sim_reductions` runs more;
//! `NICBAR_SIM_SEED=S` replays one.

use std::collections::BTreeSet;
use std::time::Instant;

use nicbar_sim::reductions::{ReductionCampaign, run};
use nicbar_sim::seeds_from_env;

/// Seeds the test runs by default (each builds a fabric of real NICs, most of its cost).
const DEFAULT_SEEDS: u64 = 20;

#[test]
fn allreduces_through_faults_and_deaths_give_every_member_the_hosts_bytes() {
    let seeds = seeds_from_env(DEFAULT_SEEDS);
    let started = Instant::now();
    let (mut completions, mut odd, mut failures, mut replayed) = (0, 0, 0, 0);
    let (mut operations, mut types) = (BTreeSet::new(), BTreeSet::new());
    let mut with_failures = 0;
    for seed in &seeds {
        let campaign = ReductionCampaign::from_seed(*seed);
        with_failures += u64::from(campaign.has_failures());
        match run(&campaign) {
            Ok(report) => {
                completions += report.completions;
                odd += report.odd_completions;
                failures += report.failures;
                replayed += report.replayed;
                operations.extend(report.operations);
                types.extend(report.types);
            }
            Err(failure) => panic!(
                "{failure}\n  replay: NICBAR_SIM_SEED={seed} cargo test -p nicbar-sim --test sim_reductions"
            ),
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{} seeds ({}..={}, {with_failures} with deaths or stops) in {elapsed:.2?} ({:.0} \
         seeds/s): {completions} completions ({odd} in groups of a size not a power of two), \
         {failures} failures reported, {replayed} packets replayed, {} operations and {} types \
         completed",
        seeds.len(),
        seeds.first().copied().unwrap_or(0),
        seeds.last().copied().unwrap_or(0),
        seeds.len() as f64 / elapsed.as_secs_f64(),
        operations.len(),
        types.len()
    );
    assert!(completions > 0);
    assert!(replayed > 0, "the replay adversary sent nothing again");
    if seeds == (1..=DEFAULT_SEEDS).collect::<Vec<_>>() {
        // What the default seeds cover, so that the campaign tests what it says it does.
        assert!(
            odd > 0,
            "no allreduce in a group of a size not a power of two"
        );
        assert!(
            with_failures > 0 && failures > 0,
            "no allreduce failed for a death"
        );
        // MPI's twelve and the reproducible sum.
        assert_eq!(operations.len(), 13, "operations completed: {operations:?}");
        assert_eq!(types.len(), 10, "types completed: {types:?}");
    }
}
