//! Messaging campaigns in the deterministic simulator: exactly-once, in-order delivery or an error
//! naming the reason, under loss, duplication, reordering, port restarts and node stops.
//!
//! `NICBAR_SIM_SEEDS=5000 cargo test -p nicbar-sim --test sim_messages --release` runs more;
//! `NICBAR_SIM_SEED=S` replays one.

use nicbar_sim::messages::{MessageCampaign, run};
use nicbar_sim::seeds_from_env;

#[test]
fn messaging_campaigns_deliver_exactly_once_in_order_or_report() {
    let seeds = seeds_from_env(200);
    let mut totals = (0u64, 0u64, 0u64);
    let mut replayed = 0u64;
    for seed in &seeds {
        let campaign = MessageCampaign::from_seed(*seed);
        match run(&campaign) {
            Ok(report) => {
                totals.0 += report.sent;
                totals.1 += report.delivered;
                totals.2 += report.errors.values().sum::<u64>();
                replayed += report.replayed;
            }
            Err(failure) => panic!(
                "{failure}\n  replay: NICBAR_SIM_SEED={seed} cargo test -p nicbar-sim --test sim_messages"
            ),
        }
    }
    println!(
        "{} seeds: {} messages sent, {} delivered, {} reported as errors; {replayed} packets \
         replayed",
        seeds.len(),
        totals.0,
        totals.1,
        totals.2
    );
    assert!(totals.1 > 0, "campaigns delivered nothing");
    assert!(replayed > 0, "the replay adversary sent nothing again");
}
