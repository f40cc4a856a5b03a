//! Overlapping-barrier campaigns in the deterministic simulator: every process posts one barrier
//! of each of its groups per round, in an order of its own, before waiting for any (paper §3.4's
//! concurrent barriers, several per port), through loss, duplication and reordering. Safety
//! (nobody leaves a barrier before every member posted it) and liveness (every barrier
//! completes, whatever the order) are checked as the campaign runs.
//!
//! `NICBAR_SIM_SEEDS=2000 cargo test -p nicbar-sim --release --test sim_overlap` runs more;
//! `NICBAR_SIM_SEED=S` replays one.

use nicbar_sim::overlap::{OverlapCampaign, run};
use nicbar_sim::seeds_from_env;

#[test]
fn barriers_posted_in_different_orders_all_complete() {
    let seeds = seeds_from_env(40);
    let mut completions = 0;
    for seed in &seeds {
        let campaign = OverlapCampaign::from_seed(*seed);
        match run(&campaign) {
            Ok(report) => completions += report.completions,
            Err(failure) => panic!(
                "{failure}\n  replay: NICBAR_SIM_SEED={seed} cargo test -p nicbar-sim --test sim_overlap"
            ),
        }
    }
    println!("{} seeds, {completions} completions", seeds.len());
    assert!(completions > 0);
}
