//! The reduction campaign: processes on many NICs run consecutive allreduces in the NIC (up to
//! 32 bytes, a random operation, type and length each) over the whole fabric and random subsets
//! of every size (non-powers of two among them, whose schedules take the fix-up steps), several
//! at once per port and per NIC, through the full firmware over a lossy, duplicating, reordering
//! wire with the replay adversary — and, in some seeds, processes that die and nodes that stop.
//!
//! Every process belongs to up to [`RUNNING_BARRIERS`] groups and in each round starts the
//! round's allreduce of every one of them, in an order of its own, before it waits for any (as an
//! MPI program's `MPI_Iallreduce`s on different communicators). A group's first allreduce has the
//! NIC keep its steps; every later one names them, as a persistent allreduce's starts do.
//!
//! Checked as it runs:
//! - **Results**: every member that completes an allreduce gets exactly the bytes the host
//!   computes natively ([`mod@reference`]), and so the same bytes at every member; for one in
//!   eight allreduces, a reproducible sum, the accumulator of every member's value merged in
//!   rank order, which no tree the NIC takes may change.
//! - **Safety**: no member completes an allreduce before every member entered it (the
//!   completion is observed the instant the NIC writes it).
//! - **Liveness**: every allreduce completes at every living member, or a member that does not
//!   gets `BARRIER_FAILED` naming a member of the group that is really missing (dead, or not
//!   through this allreduce) — only in a seed where something died, and (checked at the end)
//!   only for an allreduce some member of which died or, having failed elsewhere, never entered.
//!   A bounded drive loop fails loudly with the seed.

pub mod reference;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use firmware::{Config, Instant};
use nicbar_schedule::{Member, allreduce};
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{BarrierId, NodeId, PortId};
use shared_abi::reduce::{REDUCE_MAX, ReduceOp, ReduceSpec, ReduceType};
use shared_abi::reproducible::ReproducibleSum;
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, RUNNING_BARRIERS, Step};
use shared_abi::token::{
    KEPT_SCHEDULES, ReceiveKind, ReceiveToken, ScheduleSource, SendKind, SendToken,
};
use zerocopy::IntoBytes;

use super::drive::Drive;
use super::host::{HostRings, RECEIVE_RING, SEND_RING, SLOT};
use super::rng::Rng;
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

/// The tag each process keeps its groups' schedules under (one keep per slot, never replaced).
const KEPT_TAG: u64 = 1;
const _: () = assert!(RUNNING_BARRIERS <= KEPT_SCHEDULES, "a slot per group");

/// A reduction campaign's shape.
#[derive(Clone, Debug)]
pub struct ReductionCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Ports (processes) per node.
    pub ports: usize,
    /// Groups: group 0 is every process; the others random subsets of two or more, of random
    /// sizes. At most [`RUNNING_BARRIERS`], so that a process's allreduces of one round all run
    /// at once.
    pub groups: usize,
    /// Rounds: each runs one allreduce of every group.
    pub rounds: usize,
    /// Wire faults.
    pub faults: WireFaults,
    /// Longest compute time a process spends between rounds (the start skew).
    pub skew: Duration,
    /// Processes that die mid-run.
    pub deaths: usize,
    /// Nodes that stop mid-run.
    pub node_stops: usize,
}

impl ReductionCampaign {
    /// A campaign drawn from `seed`: 2–12 nodes of 1–3 ports, 1 to [`RUNNING_BARRIERS`] groups,
    /// 2–6 rounds, 0–30 % loss, duplication and reordering; one seed in five kills one or two
    /// processes, and a third of those also stop a node.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x7265_6475_6374_696f);
        let nodes = rng.range(2..13) as usize;
        let ports = rng.range(1..4) as usize;
        let failures = rng.chance(0.2);
        Self {
            seed,
            nodes,
            ports,
            groups: rng.range(1..RUNNING_BARRIERS as u64 + 1) as usize,
            rounds: rng.range(2..7) as usize,
            faults: WireFaults {
                loss: rng.below(31) as f64 / 100.0,
                duplicate: rng.below(31) as f64 / 100.0,
                reorder: rng.below(31) as f64 / 100.0,
                reorder_window: Duration::from_micros(rng.range(1..100)),
            },
            skew: Duration::from_micros(rng.range(0..300)),
            deaths: if failures {
                rng.range(1..3) as usize
            } else {
                0
            },
            node_stops: usize::from(failures && nodes > 2 && rng.chance(0.3)),
        }
    }

    /// Whether something dies or stops in this campaign (only then may an allreduce fail).
    pub fn has_failures(&self) -> bool {
        self.deaths > 0 || self.node_stops > 0
    }
}

impl Campaign for ReductionCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

/// What a finished campaign did.
#[derive(Debug, Default, Clone)]
pub struct ReductionReport {
    /// Allreduce completions observed (one per member per allreduce), each with the reference's
    /// bytes.
    pub completions: u64,
    /// Of them, in groups whose size is not a power of two.
    pub odd_completions: u64,
    /// Allreduce failures observed (each naming a missing member).
    pub failures: u64,
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Packets put on the wire.
    pub packets: u64,
    /// Recorded packets the replay adversary sent again during the run.
    pub replayed: u64,
    /// Operations seen completing (indexed by the operation's number).
    pub operations: BTreeSet<u8>,
    /// Types seen completing (indexed by the type's number).
    pub types: BTreeSet<u8>,
}

/// One group: its members (process ids, in rank order).
struct Group {
    members: Vec<usize>,
}

/// One allreduce of the plan: a group's in one round.
struct Reduction {
    spec: ReduceSpec,
    /// Each member's value, by rank.
    inputs: Vec<Vec<u8>>,
    /// The host's result.
    expected: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Runs its rounds.
    Running,
    /// One of its allreduces failed: it starts no more (as an MPI program aborts), though
    /// those it started run on.
    Failed,
    /// Its process died or its node stopped.
    Dead,
}

struct Process {
    node: usize,
    port: usize,
    rings: HostRings,
    /// The groups it belongs to.
    groups: Vec<usize>,
    /// The round it is in (or will enter next).
    round: usize,
    /// Allreduces of its round not ended yet.
    outstanding: usize,
    state: State,
}

impl Process {
    /// Whether it has nothing more to do.
    fn finished(&self, rounds: usize) -> bool {
        match self.state {
            State::Dead => true,
            State::Failed => self.outstanding == 0,
            State::Running => self.round >= rounds,
        }
    }
}

/// What the campaign has seen: per (group, round, process), when it entered, and whether it
/// completed or failed.
#[derive(Default)]
struct Record {
    entered: BTreeMap<(usize, usize, usize), Instant>,
    completed: BTreeSet<(usize, usize, usize)>,
    failed: BTreeSet<(usize, usize, usize)>,
    dead: BTreeSet<usize>,
}

const ACTION_DIE: u64 = 1;
const ACTION_STOP: u64 = 2;

/// Runs one reduction campaign to the end, checking as it goes.
///
/// # Errors
/// [`CampaignFailure`] names the seed and the first violation seen.
pub fn run(
    campaign: &ReductionCampaign,
) -> Result<ReductionReport, CampaignFailure<ReductionCampaign>> {
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
    // An attacker on the path replays recorded packets while the traffic runs and after the
    // give-up time: an old reduction's packet must never be combined into a new one.
    world.adversary = Some(crate::adversary::Adversary::new(
        campaign.seed,
        Duration::from_millis(3),
        config.give_up_after + Duration::from_millis(50),
    ));
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
                state: State::Running,
            });
        }
    }
    let groups = plan_groups(campaign, &mut world.rng, count);
    for (index, group) in groups.iter().enumerate() {
        for &member in &group.members {
            processes[member].groups.push(index);
        }
    }
    let plan: Vec<Vec<Reduction>> = groups
        .iter()
        .map(|group| {
            (0..campaign.rounds)
                .map(|_| plan_reduction(&mut world.rng, group.members.len()))
                .collect()
        })
        .collect();
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
    for _ in 0..campaign.deaths {
        let victim = world.rng.below(count as u64);
        let at = Duration::from_micros(world.rng.range(10..3_000));
        world.schedule_in(
            at,
            Happening::Action {
                code: ACTION_DIE | victim << 8,
            },
        );
    }
    for _ in 0..campaign.node_stops {
        let victim = world.rng.below(campaign.nodes as u64);
        let at = Duration::from_micros(world.rng.range(10..3_000));
        world.schedule_in(
            at,
            Happening::Action {
                code: ACTION_STOP | victim << 8,
            },
        );
    }
    let mut record = Record::default();
    let mut report = ReductionReport::default();
    let drive = Drive {
        max_steps: 20_000_000,
        deadline: Duration::from_secs(300),
        unfinished: "allreduces",
    };
    loop {
        let done = processes.iter().all(|p| p.finished(campaign.rounds));
        let stuck = || {
            processes
                .iter()
                .filter(|p| !p.finished(campaign.rounds))
                .take(5)
                .map(|p| {
                    format!(
                        "node {} port {} ({:?}) in round {} with {} allreduce(s) outstanding",
                        p.node, p.port, p.state, p.round, p.outstanding
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
                    campaign,
                    &mut processes[id],
                    id,
                    (&groups, &plan),
                    &mut record,
                )
                .map_err(fail)?;
                node
            }
            Happening::Action { code } => {
                let victim = (code >> 8) as usize;
                let victims: Vec<usize> = if code & 0xff == ACTION_DIE {
                    vec![victim]
                } else {
                    world.nodes[victim].stopped = true;
                    (0..campaign.ports)
                        .map(|port| victim * campaign.ports + port)
                        .collect()
                };
                for victim in victims {
                    let process = &mut processes[victim];
                    if process.state == State::Dead {
                        continue;
                    }
                    process.state = State::Dead;
                    record.dead.insert(victim);
                    let (node, port) = (process.node, process.port);
                    let open = world.nodes[node]
                        .nic
                        .port_status(PortId(port as u8))
                        .is_some();
                    if !world.nodes[node].stopped && open {
                        world.close_port(node, port);
                    }
                }
                continue;
            }
        };
        for port in 0..campaign.ports {
            let id = node * campaign.ports + port;
            observe(
                &mut world,
                campaign,
                &mut processes[id],
                id,
                (&groups, &plan),
                &mut record,
                &mut report,
            )
            .map_err(fail)?;
        }
    }
    // Every failed allreduce was doomed: some member died, or failed in another allreduce and so
    // never entered this one (a cascade that starts at a death).
    for &(group, round, _) in &record.failed {
        let doomed = groups[group].members.iter().any(|&member| {
            record.dead.contains(&member)
                || (processes[member].state == State::Failed
                    && !record.entered.contains_key(&(group, round, member)))
        });
        if !doomed {
            return Err(fail(format!(
                "group {group}'s allreduce of round {round} failed though none of its members \
                 died or failed elsewhere before entering it"
            )));
        }
    }
    report.virtual_time = world.now().saturating_since(Instant::ZERO);
    report.packets = world.wire_counts[0];
    report.replayed = world.replayed();
    Ok(report)
}

/// Group 0 is every process; the others random subsets of two or more, of a size drawn
/// uniformly (so non-powers of two are common). Ranks are shuffled so that they do not line up
/// with nodes.
fn plan_groups(campaign: &ReductionCampaign, rng: &mut Rng, count: usize) -> Vec<Group> {
    (0..campaign.groups)
        .map(|index| {
            let mut all: Vec<usize> = (0..count).collect();
            for i in (1..all.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                all.swap(i, j);
            }
            if index > 0 {
                all.truncate(rng.range(2..count as u64 + 1) as usize);
            }
            Group { members: all }
        })
        .collect()
}

/// A random allreduce of `members`: any operation on any type it is defined on, 1 element to
/// [`REDUCE_MAX`] bytes, and values that cover signs, zero, one and extremes (for
/// `MINLOC`/`MAXLOC`, the rank as the index, with ties made likely by a small value range).
fn plan_reduction(rng: &mut Rng, members: usize) -> Reduction {
    if rng.below(8) == 0 {
        return plan_reproducible_sum(rng, members);
    }
    let spec = loop {
        let op = ReduceOp::ALL[rng.below(ReduceOp::ALL.len() as u64) as usize];
        let datatype = ReduceType::ALL[rng.below(ReduceType::ALL.len() as u64) as usize];
        let spec = ReduceSpec::new(op, datatype);
        if spec.check(spec.element_size()).is_ok() {
            break spec;
        }
    };
    let element = spec.element_size();
    let elements = rng.range(1..(REDUCE_MAX / element) as u64 + 1) as usize;
    let inputs: Vec<Vec<u8>> = (0..members)
        .map(|rank| {
            let mut bytes = Vec::with_capacity(elements * element);
            for _ in 0..elements {
                match spec.datatype {
                    ReduceType::F32 => bytes.extend(
                        ((rng.below(2001) as f32) / 8.0 - 125.0)
                            .to_le_bytes()
                            .as_slice(),
                    ),
                    ReduceType::F64 => bytes.extend(
                        ((rng.below(2_000_001) as f64) / 1024.0 - 977.0)
                            .to_le_bytes()
                            .as_slice(),
                    ),
                    _ => {
                        let raw = match rng.below(6) {
                            0 => 0,
                            1 => 1,
                            2 => u64::MAX,
                            3 => rng.below(4),
                            _ => rng.next_u64(),
                        };
                        bytes.extend(&raw.to_le_bytes()[..spec.datatype.size()]);
                    }
                }
                if spec.op.is_pairwise() {
                    bytes.extend((rank as i32).to_le_bytes());
                }
            }
            bytes
        })
        .collect();
    let expected = reference::allreduce(spec, &inputs);
    Reduction {
        spec,
        inputs,
        expected,
    }
}

/// A reproducible sum of one `float` or `double` per member, of magnitudes up to 2^120 apart
/// (an ordinary sum of them depends on the tree): each member's payload is its accumulator, and
/// every member must end with the bytes of all of them merged in rank order, which any tree
/// gives, merging being exact.
fn plan_reproducible_sum(rng: &mut Rng, members: usize) -> Reduction {
    let datatype = if rng.below(2) == 0 {
        ReduceType::F32
    } else {
        ReduceType::F64
    };
    let spec = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, datatype);
    let mut total = ReproducibleSum::default();
    let inputs: Vec<Vec<u8>> = (0..members)
        .map(|_| {
            let value = (rng.next_u64() as i64 as f64) * 2f64.powi(rng.below(121) as i32 - 60);
            let bytes = match datatype {
                ReduceType::F32 => (value as f32).to_le_bytes().to_vec(),
                _ => value.to_le_bytes().to_vec(),
            };
            let mut payload = [0; REDUCE_MAX];
            let len = spec
                .payload(&bytes, &mut payload)
                .expect("one float is what a reproducible sum takes");
            let payload = payload[..len].to_vec();
            if let Some(sum) = ReproducibleSum::from_bytes(&payload) {
                total.merge(&sum);
            }
            payload
        })
        .collect();
    Reduction {
        spec,
        inputs,
        expected: total.to_bytes().to_vec(),
    }
}

/// The barrier identity of `group`'s allreduce of `round` (group numbers from 1: never
/// [`BarrierId::NONE`], which a reduction may not take).
fn identity(group: usize, round: usize) -> BarrierId {
    BarrierId::new(0, group as u32 + 1, round as u32)
}

/// A reduction token's context: its group and round.
fn context_of(group: usize, round: usize) -> u64 {
    (group as u64) << 32 | round as u64
}

/// Bytes of arena each of a round's allreduces may take (its schedule, then its value).
const PLACE: usize = 2 * SLOT;

/// Starts the process's allreduces of its round, one per group, in an order drawn for this
/// process and round: each schedule, with the member's value right after it, in an arena place
/// of its own (the NIC may take the tokens in one poll), then its reduction token.
fn enter_round(
    world: &mut World,
    campaign: &ReductionCampaign,
    process: &mut Process,
    id: usize,
    (groups, plan): (&[Group], &[Vec<Reduction>]),
    record: &mut Record,
) -> Result<(), String> {
    if process.state != State::Running
        || process.outstanding > 0
        || process.round >= campaign.rounds
    {
        return Ok(());
    }
    if process.groups.is_empty() {
        process.round = campaign.rounds;
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
        let reduction = &plan[index][process.round];
        let rank = group
            .members
            .iter()
            .position(|&m| m == id)
            .ok_or("process not in its own group")?;
        let members: Vec<Member> = group
            .members
            .iter()
            .map(|&m| {
                Member::new(
                    NodeId::new((m / campaign.ports) as u16),
                    PortId((m % campaign.ports) as u8),
                )
            })
            .collect();
        let mut steps = [Step::default(); MAX_SCHEDULE_STEPS];
        let count = allreduce(&members, rank, &mut steps)
            .map_err(|error| format!("group {index}: {error}"))?;
        // A group's first allreduce posts its steps and has the NIC keep them in the group's
        // slot; every later one names the slot and posts its value alone.
        let keeping = if process.round == 0 {
            ScheduleSource::keep(index as u8)
        } else {
            ScheduleSource::kept(index as u8)
        };
        let mut bytes = if keeping.runs_kept().is_some() {
            Vec::new()
        } else {
            steps[..count].as_bytes().to_vec()
        };
        bytes.extend_from_slice(&reduction.inputs[rank]);
        // The places after the rings' slots, one per allreduce of a round.
        let offset =
            HostRings::slot_offset((SEND_RING + RECEIVE_RING) as usize) + (place * PLACE) as u64;
        if bytes.len() > PLACE || !process.rings.write_arena(memory, offset, &bytes) {
            return Err(format!(
                "group {index}: a schedule of {count} steps and its value do not fit a place"
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
        let mut token = SendToken {
            kind: SendKind::BARRIER,
            schedule: keeping,
            length: (count as u32).into(),
            buffer: offset.into(),
            context: context_of(index, process.round).into(),
            size: reduction.inputs[rank].len() as u8,
            compare: KEPT_TAG.into(),
            ..SendToken::default()
        }
        .with_barrier_id(identity(index, process.round));
        token.set_reduce_spec(reduction.spec);
        process
            .rings
            .post_send(memory, &token)
            .map_err(|e| format!("send ring: {e}"))?;
        process.rings.send_tokens += 1; // A barrier token comes back with its end.
        record.entered.insert((index, process.round, id), now);
        process.outstanding += 1;
    }
    world.doorbell(process.node);
    Ok(())
}

/// Reads the process's events the instant its NIC wrote them: a completion is checked against
/// the members' entries and the host's result; a failure against the members that are missing.
fn observe(
    world: &mut World,
    campaign: &ReductionCampaign,
    process: &mut Process,
    id: usize,
    (groups, plan): (&[Group], &[Vec<Reduction>]),
    record: &mut Record,
    report: &mut ReductionReport,
) -> Result<(), String> {
    loop {
        if process.state == State::Dead {
            return Ok(());
        }
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
        let (Some(group), Some(reduction)) = (
            groups.get(index),
            plan.get(index).and_then(|rounds| rounds.get(round)),
        ) else {
            return Err(format!(
                "process {id}: {:?} for unknown group {index} round {round}",
                event.kind
            ));
        };
        let key = (index, round, id);
        if round != process.round
            || process.outstanding == 0
            || !record.entered.contains_key(&key)
            || record.completed.contains(&key)
            || record.failed.contains(&key)
        {
            return Err(format!(
                "process {id}: {:?} of group {index}'s allreduce of round {round} while in round \
                 {} with {} outstanding",
                event.kind, process.round, process.outstanding
            ));
        }
        let now = world.now();
        match event.kind {
            EventKind::BARRIER_COMPLETED => {
                for &member in &group.members {
                    match record.entered.get(&(index, round, member)) {
                        Some(at) if *at <= now => {}
                        _ => {
                            return Err(format!(
                                "process {id} completed group {index}'s allreduce of round \
                                 {round} at {now:?} before member {member} entered it"
                            ));
                        }
                    }
                }
                if event.broadcast_data() != reduction.expected.as_slice() {
                    return Err(format!(
                        "process {id}: group {index}'s allreduce of round {round} ({:?} on {:?}, \
                         {} members) completed with {:?}; the host computes {:?}",
                        reduction.spec.op,
                        reduction.spec.datatype,
                        group.members.len(),
                        event.broadcast_data(),
                        reduction.expected
                    ));
                }
                record.completed.insert(key);
                report.completions += 1;
                if !group.members.len().is_power_of_two() {
                    report.odd_completions += 1;
                }
                report.operations.insert(reduction.spec.op.0);
                report.types.insert(reduction.spec.datatype.0);
            }
            EventKind::BARRIER_FAILED => {
                let named = usize::from(event.peer_node.get()) * campaign.ports
                    + usize::from(event.peer_port.0);
                if !group.members.contains(&named) || named == id {
                    return Err(format!(
                        "process {id}: group {index}'s allreduce of round {round} failed \
                         ({:?}) naming process {named}, not another member",
                        event.status
                    ));
                }
                // A member is missing if it died, or it has not come through this allreduce
                // (whether something really held it up is checked at the end).
                let missing = record.dead.contains(&named)
                    || !record.completed.contains(&(index, round, named));
                if !campaign.has_failures() || !missing {
                    return Err(format!(
                        "process {id}: group {index}'s allreduce of round {round} failed ({:?}) \
                         at {now:?} naming process {named}, which is not missing",
                        event.status
                    ));
                }
                if ![
                    Status::TARGET_PORT_CLOSED,
                    Status::TARGET_NODE_UNREACHABLE,
                    Status::BARRIER_TIMED_OUT,
                ]
                .contains(&event.status)
                {
                    return Err(format!(
                        "process {id}: group {index}'s allreduce of round {round} failed with \
                         {:?}",
                        event.status
                    ));
                }
                record.failed.insert(key);
                report.failures += 1;
                process.state = State::Failed;
            }
            other => {
                return Err(format!(
                    "process {id}: unexpected {other:?} ({:?}) for group {index}'s allreduce of \
                     round {round}",
                    event.status
                ));
            }
        }
        process.outstanding -= 1;
        if process.outstanding == 0 && process.state == State::Running {
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
}
