//! The overlapping-barrier campaign: paper §3.4's concurrent barriers, several per port. Every
//! process belongs to several groups at once (the whole fabric, and random subsets), and in each
//! round posts the round's barrier of every one of its groups before it waits for any — each
//! process in an order of its own, drawn anew each round, as MPI programs start non-blocking
//! barriers of different communicators in different orders. The wire loses, duplicates and
//! reorders packets.
//!
//! Checked as it runs:
//! - **Safety**: no process leaves a group's barrier of round `r` before every member of the
//!   group posted it (the completion is observed the instant the NIC writes it).
//! - **Liveness**: every barrier completes at every member (nobody dies here, so a failure is a
//!   violation), whatever order the members posted them in. A bounded drive loop fails loudly
//!   with the seed.

use std::collections::BTreeMap;
use std::time::Duration;

use firmware::{Config, Instant};
use nicbar_schedule::{Algorithm, Member, compile};
use shared_abi::event::EventKind;
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, RUNNING_BARRIERS, Step};
use shared_abi::token::{ReceiveKind, ReceiveToken, SendKind, SendToken};
use zerocopy::IntoBytes;

use super::drive::Drive;
use super::host::{HostRings, RECEIVE_RING, SEND_RING, SLOT};
use super::rng::Rng;
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

/// An overlapping-barrier campaign's shape.
#[derive(Clone, Debug)]
pub struct OverlapCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Ports (processes) per node.
    pub ports: usize,
    /// Groups: group 0 is every process; the others random subsets of two or more. At most
    /// [`RUNNING_BARRIERS`], so that a process's barriers of one round all run at once.
    pub groups: usize,
    /// Rounds: each runs one barrier of every group.
    pub rounds: usize,
    /// Wire faults.
    pub faults: WireFaults,
    /// Longest compute time a process spends between rounds (the start skew).
    pub skew: Duration,
}

impl OverlapCampaign {
    /// A campaign drawn from `seed`: 2–12 nodes of 1–2 ports, 2 to [`RUNNING_BARRIERS`]
    /// groups, 0–20 % loss, duplication and reordering.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x6f76_6572_6c61_7073);
        Self {
            seed,
            nodes: rng.range(2..13) as usize,
            ports: rng.range(1..3) as usize,
            groups: rng.range(2..RUNNING_BARRIERS as u64 + 1) as usize,
            rounds: rng.range(3..9) as usize,
            faults: WireFaults {
                loss: rng.below(21) as f64 / 100.0,
                duplicate: rng.below(21) as f64 / 100.0,
                reorder: rng.below(21) as f64 / 100.0,
                reorder_window: Duration::from_micros(rng.range(1..100)),
            },
            skew: Duration::from_micros(rng.range(0..300)),
        }
    }
}

impl Campaign for OverlapCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

/// What a finished campaign did.
#[derive(Debug, Default, Clone)]
pub struct OverlapReport {
    /// Barrier completions observed (one per member per barrier).
    pub completions: u64,
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Packets put on the wire.
    pub packets: u64,
}

/// One group: its members (process ids, in rank order) and the algorithm its barriers run.
struct Group {
    members: Vec<usize>,
    algorithm: Algorithm,
}

struct Process {
    node: usize,
    port: usize,
    rings: HostRings,
    /// The groups it belongs to.
    groups: Vec<usize>,
    /// The round it is in (or will enter next).
    round: usize,
    /// Barriers of its round not completed yet.
    outstanding: usize,
}

/// Runs one overlapping-barrier campaign to the end, checking as it goes.
///
/// # Errors
/// [`CampaignFailure`] names the seed and the first violation seen.
pub fn run(campaign: &OverlapCampaign) -> Result<OverlapReport, CampaignFailure<OverlapCampaign>> {
    let fail = |violation: String| CampaignFailure::new(campaign, violation);
    let config = Config {
        retransmit_timeout: Duration::from_micros(300),
        give_up_after: Duration::from_millis(300),
        receiver_not_ready_timeout: Duration::from_millis(300),
        retry_interval: Duration::from_micros(100),
        default_barrier_timeout: Duration::from_millis(500),
        fabric_key: Some(firmware::auth::FabricKey::new(crate::campaign_key(
            campaign.seed,
        ))),
    };
    let mut world = World::new(
        campaign.seed,
        campaign.nodes,
        config,
        campaign.faults,
        Duration::from_micros(5),
    );
    let count = campaign.nodes * campaign.ports;
    let mut processes: Vec<Process> = Vec::with_capacity(count);
    for node in 0..campaign.nodes {
        for port in 0..campaign.ports {
            processes.push(Process {
                node,
                port,
                rings: world.open_port(node, port),
                groups: Vec::new(),
                round: 0,
                outstanding: 0,
            });
        }
    }
    let groups = plan_groups(campaign, &mut world.rng, count);
    for (index, group) in groups.iter().enumerate() {
        for &member in &group.members {
            processes[member].groups.push(index);
        }
    }
    // When each member posted each (group, round): the safety check's evidence.
    let mut entered: BTreeMap<(usize, usize, usize), Instant> = BTreeMap::new();
    for process in &processes {
        let start = Duration::from_nanos(world.rng.below(campaign.skew.as_nanos() as u64 + 1));
        world.schedule_in(
            start,
            Happening::Host {
                node: process.node,
                port: process.port,
            },
        );
    }
    let mut report = OverlapReport::default();
    let drive = Drive {
        max_steps: 20_000_000,
        deadline: Duration::from_secs(300),
        unfinished: "overlapping barriers",
    };
    loop {
        let done = processes.iter().all(|p| p.round >= campaign.rounds);
        let stuck = || {
            processes
                .iter()
                .filter(|p| p.round < campaign.rounds)
                .take(5)
                .map(|p| {
                    format!(
                        "node {} port {} in round {} with {} barrier(s) outstanding",
                        p.node, p.port, p.round, p.outstanding
                    )
                })
                .collect()
        };
        let Some(happening) = drive.next(done, &mut world, stuck).map_err(fail)? else {
            break;
        };
        let node = match happening {
            Happening::Arrive { node, bytes } => {
                world.arrive(node, &bytes);
                node
            }
            Happening::Poll { node } => {
                world.poll(node);
                node
            }
            Happening::Host { node, port } => {
                let id = node * campaign.ports + port;
                enter_round(
                    &mut world,
                    campaign.ports,
                    &mut processes[id],
                    id,
                    &groups,
                    &mut entered,
                )
                .map_err(fail)?;
                node
            }
            Happening::Action { .. } => continue,
        };
        for port in 0..campaign.ports {
            let id = node * campaign.ports + port;
            observe(
                &mut world,
                campaign,
                &mut processes[id],
                id,
                &groups,
                &entered,
                &mut report,
            )
            .map_err(fail)?;
        }
    }
    report.virtual_time = world.now().saturating_since(Instant::ZERO);
    report.packets = world.wire_counts[0];
    Ok(report)
}

/// Group 0 is every process; the others random subsets of two or more, each with an algorithm
/// of its own.
fn plan_groups(campaign: &OverlapCampaign, rng: &mut Rng, count: usize) -> Vec<Group> {
    (0..campaign.groups)
        .map(|index| {
            let members: Vec<usize> = if index == 0 {
                (0..count).collect()
            } else {
                let mut members: Vec<usize> = (0..count).filter(|_| rng.chance(0.6)).collect();
                for extra in 0..count {
                    if members.len() >= 2 {
                        break;
                    }
                    if !members.contains(&extra) {
                        members.push(extra);
                    }
                }
                members.sort_unstable();
                members
            };
            let size = members.len();
            let algorithm = match rng.below(3) {
                0 => Algorithm::PairwiseExchange,
                1 => Algorithm::GatherBroadcast {
                    dimension: rng.range(1..size.max(2) as u64) as usize,
                    root: rng.below(size as u64) as usize,
                },
                _ => Algorithm::Dissemination {
                    n: rng.range(1..size.clamp(2, 4) as u64) as usize,
                },
            };
            Group { members, algorithm }
        })
        .collect()
}

/// The barrier identity of `group`'s barrier of `round` (group numbers from 1: never
/// [`BarrierId::NONE`]).
fn identity(group: usize, round: usize) -> BarrierId {
    BarrierId::new(0, group as u32 + 1, round as u32)
}

/// Posts the process's barriers of its round, one per group, in an order drawn for this
/// process and round; each schedule in an arena place of its own (the NIC may take the tokens
/// in one poll).
fn enter_round(
    world: &mut World,
    ports: usize,
    process: &mut Process,
    id: usize,
    groups: &[Group],
    entered: &mut BTreeMap<(usize, usize, usize), Instant>,
) -> Result<(), String> {
    if process.outstanding > 0 || process.round == usize::MAX {
        return Ok(());
    }
    if process.groups.is_empty() {
        process.round = usize::MAX;
        return Ok(());
    }
    let order = world.shuffled(&process.groups);
    let Some(memory) = world.port_memory(process.node, process.port) else {
        return Err(format!(
            "node {} port {}: no region",
            process.node, process.port
        ));
    };
    let now = world.now();
    for (place, &index) in order.iter().enumerate() {
        let group = &groups[index];
        let rank = group
            .members
            .iter()
            .position(|&m| m == id)
            .ok_or("process not in its own group")?;
        let members: Vec<Member> = group
            .members
            .iter()
            .map(|&m| Member::new(NodeId::new((m / ports) as u16), PortId((m % ports) as u8)))
            .collect();
        let mut steps = [Step::default(); MAX_SCHEDULE_STEPS];
        let count = compile(group.algorithm, &members, rank, &mut steps)
            .map_err(|error| format!("group {index} ({:?}): {error}", group.algorithm))?;
        let bytes = steps[..count].as_bytes();
        // The places after the rings' slots, one per barrier of a round.
        let offset = HostRings::slot_offset((SEND_RING + RECEIVE_RING) as usize)
            + (place * SCHEDULE_PLACE) as u64;
        if bytes.len() > SCHEDULE_PLACE || !process.rings.write_arena(memory, offset, bytes) {
            return Err(format!(
                "group {index}: a schedule of {count} steps does not fit its place"
            ));
        }
        process
            .rings
            .post_receive(
                memory,
                &ReceiveToken {
                    kind: ReceiveKind::BARRIER,
                    ..ReceiveToken::default()
                },
            )
            .map_err(|e| format!("receive ring: {e}"))?;
        let token = SendToken {
            kind: SendKind::BARRIER,
            length: (count as u32).into(),
            buffer: offset.into(),
            context: context_of(index, process.round).into(),
            ..SendToken::default()
        }
        .with_barrier_id(identity(index, process.round));
        process
            .rings
            .post_send(memory, &token)
            .map_err(|e| format!("send ring: {e}"))?;
        process.rings.send_tokens += 1; // A barrier token comes back with its end.
        entered.insert((index, process.round, id), now);
        process.outstanding += 1;
    }
    world.doorbell(process.node);
    Ok(())
}

/// Bytes of arena each of a round's schedules may take.
const SCHEDULE_PLACE: usize = 2 * SLOT;

/// A barrier token's context: its group and round.
fn context_of(group: usize, round: usize) -> u64 {
    (group as u64) << 32 | round as u64
}

/// Reads the process's events the instant its NIC wrote them: each completion is checked
/// against the entries of its group's members; a failure is a violation.
fn observe(
    world: &mut World,
    campaign: &OverlapCampaign,
    process: &mut Process,
    id: usize,
    groups: &[Group],
    entered: &BTreeMap<(usize, usize, usize), Instant>,
    report: &mut OverlapReport,
) -> Result<(), String> {
    loop {
        let Some(memory) = world.port_memory(process.node, process.port) else {
            return Ok(());
        };
        let Some(event) = process
            .rings
            .next_event(memory)
            .map_err(|e| format!("event ring: {e}"))?
        else {
            return Ok(());
        };
        let context = event.context.get();
        let (index, round) = ((context >> 32) as usize, (context & 0xffff_ffff) as usize);
        match event.kind {
            EventKind::BARRIER_COMPLETED => {
                let group = groups
                    .get(index)
                    .ok_or(format!("process {id}: completion of unknown group {index}"))?;
                if round != process.round || process.outstanding == 0 {
                    return Err(format!(
                        "process {id}: completion of group {index}'s barrier of round {round} \
                         while in round {} with {} outstanding",
                        process.round, process.outstanding
                    ));
                }
                let now = world.now();
                for &member in &group.members {
                    match entered.get(&(index, round, member)) {
                        Some(at) if *at <= now => {}
                        _ => {
                            return Err(format!(
                                "process {id} left group {index}'s barrier of round {round} \
                                 ({:?}) at {now:?} before member {member} entered it",
                                group.algorithm
                            ));
                        }
                    }
                }
                report.completions += 1;
                process.outstanding -= 1;
                if process.outstanding == 0 {
                    process.round += 1;
                    if process.round < campaign.rounds {
                        let skew = world.rng.below(campaign.skew.as_nanos() as u64 + 1);
                        world.schedule_in(
                            Duration::from_nanos(skew),
                            Happening::Host {
                                node: process.node,
                                port: process.port,
                            },
                        );
                    }
                }
            }
            other => {
                return Err(format!(
                    "process {id}: {other:?} ({:?}, naming node {} port {}) for group {index}'s \
                     barrier of round {round}: nobody died, every barrier must complete",
                    event.status,
                    event.peer_node.get(),
                    event.peer_port.0
                ));
            }
        }
    }
}
