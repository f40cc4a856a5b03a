//! One-sided campaigns in the deterministic simulator: puts, gets and NIC fetch-and-adds through
//! loss, duplication, reordering and port churn — bytes intact, every add applied exactly once,
//! nothing written outside a registered region.
//!
//! `NICBAR_SIM_SEEDS=2000 cargo test -p nicbar-sim --test sim_rdma --release` runs more;
//! `NICBAR_SIM_SEED=S` replays one.

use nicbar_sim::rdma::{RdmaCampaign, run};
use nicbar_sim::seeds_from_env;

#[test]
fn rdma_campaigns_keep_bytes_intact_and_apply_every_add_exactly_once() {
    let seeds = seeds_from_env(100);
    let (mut puts, mut gets, mut adds, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut replayed = 0u64;
    for seed in &seeds {
        let campaign = RdmaCampaign::from_seed(*seed);
        match run(&campaign) {
            Ok(report) => {
                puts += report.puts;
                gets += report.gets;
                adds += report.adds;
                errors += report.errors.values().sum::<u64>();
                replayed += report.replayed;
            }
            Err(failure) => panic!(
                "{failure}\n  replay: NICBAR_SIM_SEED={seed} cargo test -p nicbar-sim --test sim_rdma"
            ),
        }
    }
    println!(
        "{} seeds: {puts} puts, {gets} gets, {adds} fetch-and-adds succeeded; {errors} refused or \
         failed (their targets restarted, or the wire gave up); {replayed} packets replayed",
        seeds.len()
    );
    assert!(replayed > 0, "the replay adversary sent nothing again");
    assert!(
        puts > 0 && gets > 0 && adds > 0,
        "the campaigns did nothing"
    );
}
