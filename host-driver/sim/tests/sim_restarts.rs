//! Restart campaigns: a capture of genuine traffic sent again after the receiver or the sender
//! restarts (with the same key), with and without an idle gap past the give-up time, delivers
//! nothing, and the genuine traffic right after arrives exactly once.

use nicbar_sim::restarts::{RestartCampaign, run};
use nicbar_sim::seeds_from_env;

#[test]
fn a_replayed_capture_delivers_nothing_after_restarts_and_idle_gaps() {
    let seeds = seeds_from_env(40);
    let (mut delivered, mut replayed) = (0, 0);
    for seed in &seeds {
        let campaign = RestartCampaign::from_seed(*seed);
        match run(&campaign) {
            Ok(report) => {
                delivered += report.delivered;
                replayed += report.replayed;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    println!(
        "{} seeds ({}..={}): {delivered} genuine messages delivered, {replayed} packets replayed, \
         0 stale deliveries",
        seeds.len(),
        seeds.first().copied().unwrap_or(0),
        seeds.last().copied().unwrap_or(0),
    );
}
