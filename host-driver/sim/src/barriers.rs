//! The barrier campaign: processes on many NICs run consecutive barriers over changing subsets,
//! with random start skew, a lossy, duplicating, reordering wire, several concurrent barriers per
//! NIC, the paper's worst case (a slow process doing two-process barriers with every other one),
//! and — in some seeds — processes that die and nodes that stop.
//!
//! Checked as it runs:
//! - **Safety**: no process leaves barrier `k` before every member entered barrier `k` (the
//!   completion event is observed the instant the NIC writes it, and compared with the instants
//!   the members posted their barrier tokens).
//! - **Liveness**: every barrier completes at every member, or every member that does not complete
//!   it gets `BARRIER_FAILED` naming a member it was waiting for — and only when some member of
//!   that barrier died or itself failed. A bounded drive loop fails loudly with the seed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use firmware::{Config, Instant};
use nicbar_schedule::{Algorithm, Member, ScheduleError, compile};
use shared_abi::event::{Event, EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};

use super::drive::Drive;
use super::host::{HostRings, SIZE_CLASS};
use super::rng::Rng;
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

/// Which algorithms a campaign draws its barriers from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Pairwise exchange.
    PairwiseExchange,
    /// Gather-broadcast, any dimension and root.
    GatherBroadcast,
    /// n-way dissemination, n in 1..=4.
    Dissemination,
    /// A different algorithm for every barrier.
    Mixed,
}

/// A barrier campaign's shape.
#[derive(Clone, Debug)]
pub struct BarrierCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// Nodes.
    pub nodes: usize,
    /// Ports (processes) per node.
    pub ports: usize,
    /// Barriers in the global sequence.
    pub barriers: usize,
    /// Algorithms drawn from.
    pub family: Family,
    /// Wire faults.
    pub faults: WireFaults,
    /// Longest compute time a process spends between barriers (the start skew).
    pub skew: Duration,
    /// The paper's worst case: process 0 is slow and does a two-process barrier with every other
    /// process in turn.
    pub slow_pairs: bool,
    /// Processes that die mid-run.
    pub deaths: usize,
    /// Nodes that stop mid-run.
    pub node_stops: usize,
    /// Processes whose port opens late, after their peers already sent them barrier packets
    /// (refused while closed and sent again, paper §3.2).
    pub late_opens: usize,
    /// Processes close their port (in order) as soon as they finished their last barrier, while
    /// their last packets may still be on their way: their peers must complete all the same.
    pub exit_when_done: bool,
    /// Some barriers run on the hosts (the baseline of the paper's §6): the schedule's steps as
    /// ordinary messages, refused ones sent again by the host, a process that exits delivering
    /// what it owes first.
    pub host_barriers: bool,
    /// Barriers a member skips (it goes on to its next barrier without entering them): the
    /// barrier fails at the others, which go on too, so a failed barrier's packets meet the next
    /// barriers of the same ports — none may complete before all its members entered it.
    pub absences: usize,
    /// The NIC-based gather-broadcast barriers are broadcasts from their tree's root, which
    /// supplies 1 to 32 bytes the barrier's index determines: every member's completion must
    /// carry exactly them.
    pub broadcasts: bool,
}

/// Whether barrier `index` is a broadcast: its root's rank and its bytes.
fn broadcast_of(
    campaign: &BarrierCampaign,
    index: usize,
    barrier: &Barrier,
) -> Option<(usize, Vec<u8>)> {
    let Algorithm::GatherBroadcast { root, .. } = barrier.algorithm else {
        return None;
    };
    if !campaign.broadcasts || barrier.host {
        return None;
    }
    let len = 1 + index * 7 % shared_abi::packet::BROADCAST_MAX;
    let bytes = (0..len)
        .map(|i| (index.wrapping_mul(31) ^ i.wrapping_mul(131)) as u8)
        .collect();
    Some((root, bytes))
}

impl BarrierCampaign {
    /// A campaign drawn from `seed`: mostly 2–32 nodes, sometimes up to `max_nodes`; 1–3 ports per
    /// node; 0–30 % loss, duplication and reordering; one seed in five runs the slow-process
    /// pattern, one in six kills processes or stops a node.
    pub fn from_seed(seed: u64, family: Family, max_nodes: usize) -> Self {
        let mut rng = Rng::new(seed ^ 0x6261_7272_6965_7273);
        let large = max_nodes > 32 && rng.chance(0.05);
        let nodes = if large {
            rng.range(33..max_nodes as u64 + 1)
        } else {
            rng.range(2..33)
        } as usize;
        let ports = if large { 1 } else { rng.range(1..4) as usize };
        let processes = nodes * ports;
        let barriers = if large {
            3
        } else {
            (600 / processes).clamp(4, 40)
        };
        let faults = WireFaults {
            loss: rng.below(31) as f64 / 100.0,
            duplicate: rng.below(31) as f64 / 100.0,
            reorder: rng.below(31) as f64 / 100.0,
            reorder_window: Duration::from_micros(rng.range(1..100)),
        };
        let failures = !large && rng.chance(0.16);
        Self {
            seed,
            nodes,
            ports,
            barriers,
            family,
            faults,
            skew: Duration::from_micros(rng.range(0..300)),
            slow_pairs: !large && rng.chance(0.2),
            deaths: if failures {
                rng.range(1..3) as usize
            } else {
                0
            },
            node_stops: usize::from(failures && nodes > 2 && rng.chance(0.3)),
            late_opens: if rng.chance(0.3) {
                rng.range(1..4) as usize
            } else {
                0
            },
            exit_when_done: rng.chance(0.5),
            absences: 0,
            host_barriers: rng.chance(0.4),
            broadcasts: false,
        }
    }

    /// A campaign drawn from `seed` as [`BarrierCampaign::from_seed`], with one to three
    /// absences instead of deaths, and no slow process (whose barriers would outlast the NIC's
    /// timeout).
    pub fn with_absences(seed: u64, family: Family, max_nodes: usize) -> Self {
        let mut campaign = Self::from_seed(seed, family, max_nodes.min(32));
        campaign.deaths = 0;
        campaign.node_stops = 0;
        campaign.slow_pairs = false;
        campaign.absences = 1 + (seed % 3) as usize;
        campaign
    }

    /// This campaign with its NIC-based barriers run as broadcasts.
    #[must_use]
    pub fn with_broadcasts(mut self) -> Self {
        self.broadcasts = true;
        self
    }
}

impl Campaign for BarrierCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

/// What a finished campaign did.
#[derive(Debug, Default, Clone)]
pub struct BarrierReport {
    /// Barrier completions observed (one per member per barrier).
    pub completions: u64,
    /// Barrier failures observed.
    pub failures: u64,
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Packets put on the wire.
    pub packets: u64,
    /// Recorded packets the replay adversary sent again during the run.
    pub replayed: u64,
}

/// One barrier of the global sequence.
struct Barrier {
    members: Vec<usize>,
    algorithm: Algorithm,
    /// Entry instant of each member (by position in `members`).
    entered: Vec<Option<Instant>>,
    /// Which members completed it.
    completed: Vec<bool>,
    /// Which members got `BARRIER_FAILED` for it.
    failed: Vec<bool>,
    /// A member will skip it: its members give up after [`DOOMED_TIMEOUT`], well inside the
    /// NIC's default, so that the delay does not make later barriers time out too.
    doomed: bool,
    /// It runs on the hosts, over messages.
    host: bool,
}

/// A host-based barrier's timeout (the NIC's default in these campaigns).
const HOST_TIMEOUT: Duration = Duration::from_millis(500);
/// How often a host sends again a barrier message its target refused.
const HOST_RETRY: Duration = Duration::from_micros(100);
/// Receive buffers a process keeps provided for host-based barrier messages.
const HOST_BUFFERS: usize = 24;

/// A host-based barrier in progress on one process.
struct HostRun {
    index: usize,
    steps: Vec<Step>,
    step: usize,
    sent_current: bool,
    deadline: Instant,
}

/// A host-based barrier message refused by its target, to send again.
#[derive(Clone, Copy)]
struct HostResend {
    to: usize,
    barrier: usize,
    round: u8,
    at: Instant,
    until: Instant,
}

/// What a process keeps for host-based barriers.
#[derive(Default)]
struct HostState {
    run: Option<HostRun>,
    /// Messages arrived and not consumed: (sender, barrier, round) → count.
    record: BTreeMap<(usize, usize, u8), u32>,
    buffers_provided: bool,
    /// Messages the NIC holds: context → (target, barrier, round, arena slot).
    sending: BTreeMap<u64, (usize, usize, u8, usize)>,
    resends: Vec<HostResend>,
    /// Until when refused messages are sent again (the latest host barrier's deadline).
    until: Option<Instant>,
    next_context: u64,
}

impl HostState {
    /// Whether the process still owes a peer a message (an exit waits for it, as
    /// `Port::close` does).
    fn owes(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| until > now)
            && (!self.resends.is_empty() || !self.sending.is_empty())
    }
}

/// Schedules `process`'s next host step `after` from now.
fn wake(world: &mut World, process: &Process, after: Duration) {
    world.schedule_in(
        after,
        Happening::Host {
            node: process.node,
            port: process.port,
        },
    );
}

/// The timeout of a barrier a member skips.
const DOOMED_TIMEOUT: Duration = Duration::from_millis(20);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Computing; enters the next barrier at its next host step.
    Computing,
    /// In barrier `index` of its program.
    Waiting,
    /// Finished its program.
    Done,
    /// Its barrier failed; it stopped (as an MPI program aborts).
    Failed,
    /// Its process died or its node stopped.
    Dead,
}

struct Process {
    node: usize,
    port: usize,
    rings: HostRings,
    program: Vec<usize>,
    position: usize,
    state: State,
    slow: bool,
    /// Positions of its program it skips.
    skips: BTreeSet<usize>,
    host: HostState,
    /// Its port closed (it exited, or died).
    closed: bool,
}

const ACTION_DIE: u64 = 1;
const ACTION_STOP: u64 = 2;
const ACTION_OPEN: u64 = 3;

/// How long a barrier of the campaign may take before it reports a timeout: half a second, and
/// 2 ms more per node. A gather-broadcast tree of dimension 1 is a chain through every node, each
/// hop a first contact (a session handshake) through the campaign's loss, so its barrier lasts in
/// proportion to the nodes (seed 7866: 808 nodes, 29 % loss, over the half second).
fn barrier_timeout(nodes: usize) -> Duration {
    Duration::from_millis(500) + Duration::from_millis(2) * u32::try_from(nodes).unwrap_or(u32::MAX)
}

/// Runs one barrier campaign to the end, checking as it goes.
///
/// # Errors
/// [`CampaignFailure`] names the seed and the first violation seen.
pub fn run(campaign: &BarrierCampaign) -> Result<BarrierReport, CampaignFailure<BarrierCampaign>> {
    let fail = |violation: String| CampaignFailure::new(campaign, violation);
    let config = Config {
        retransmit_timeout: Duration::from_micros(300),
        give_up_after: Duration::from_millis(300),
        receiver_not_ready_timeout: Duration::from_millis(300),
        retry_interval: Duration::from_micros(100),
        default_barrier_timeout: barrier_timeout(campaign.nodes),
        // Every packet of the campaigns carries its code, as on a real fabric.
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
    // give-up time (past node stops, give-ups and idle gaps).
    world.adversary = Some(crate::adversary::Adversary::new(
        campaign.seed,
        Duration::from_millis(3),
        config.give_up_after + Duration::from_millis(50),
    ));
    let process_count = campaign.nodes * campaign.ports;
    let mut processes: Vec<Process> = Vec::with_capacity(process_count);
    let mut late: BTreeSet<usize> = BTreeSet::new();
    for _ in 0..campaign.late_opens {
        late.insert(world.rng.below(process_count as u64) as usize);
    }
    for node in 0..campaign.nodes {
        for port in 0..campaign.ports {
            let rings = if late.contains(&(node * campaign.ports + port)) {
                HostRings::new()
            } else {
                world.open_port(node, port)
            };
            processes.push(Process {
                node,
                port,
                rings,
                program: Vec::new(),
                position: 0,
                state: State::Computing,
                slow: false,
                skips: BTreeSet::new(),
                host: HostState::default(),
                closed: false,
            });
        }
    }
    let mut barriers = plan_barriers(campaign, &mut world.rng, process_count);
    for (index, barrier) in barriers.iter().enumerate() {
        for &member in &barrier.members {
            processes[member].program.push(index);
        }
    }
    if campaign.slow_pairs {
        processes[0].slow = true;
    }
    for _ in 0..campaign.absences {
        let id = world.rng.below(process_count as u64) as usize;
        let length = processes[id].program.len() as u64;
        if length > 0 {
            let position = world.rng.below(length) as usize;
            processes[id].skips.insert(position);
            barriers[processes[id].program[position]].doomed = true;
        }
    }
    for (id, process) in processes.iter().enumerate() {
        if late.contains(&id) {
            let at = Duration::from_micros(world.rng.range(100..3_000));
            world.schedule_in(
                at,
                Happening::Action {
                    code: ACTION_OPEN | (id as u64) << 8,
                },
            );
            continue;
        }
        let start = Duration::from_nanos(world.rng.below(campaign.skew.as_nanos() as u64 + 1));
        wake(&mut world, process, start);
    }
    for _ in 0..campaign.deaths {
        let victim = world.rng.below(process_count as u64);
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
    let index_of = |node: usize, port: usize| node * campaign.ports + port;
    let mut dead: BTreeSet<usize> = BTreeSet::new();
    let mut report = BarrierReport::default();

    let drive = Drive {
        max_steps: 50_000_000,
        deadline: Duration::from_secs(600),
        unfinished: "barriers",
    };
    loop {
        let done = processes
            .iter()
            .all(|p| matches!(p.state, State::Done | State::Failed | State::Dead));
        let stuck = || {
            processes
                .iter()
                .filter(|p| p.state == State::Waiting)
                .take(5)
                .map(|p| {
                    format!(
                        "node {} port {} in barrier {}",
                        p.node, p.port, p.program[p.position]
                    )
                })
                .collect()
        };
        let Some(happening) = drive.next(done, &mut world, stuck).map_err(fail)? else {
            break;
        };
        let touched = match happening {
            Happening::Arrive { node, bytes } => {
                world.arrive(node, &bytes);
                Some(node)
            }
            Happening::Poll { node } => {
                world.poll(node);
                Some(node)
            }
            Happening::Action { code } if code & 0xff == ACTION_OPEN => {
                let id = (code >> 8) as usize;
                let (node, port) = (processes[id].node, processes[id].port);
                if processes[id].state != State::Dead && !world.nodes[node].stopped {
                    processes[id].rings = world.open_port(node, port);
                    world.schedule_in(Duration::ZERO, Happening::Host { node, port });
                }
                None
            }
            Happening::Action { code } => {
                let victim = (code >> 8) as usize;
                let victims: Vec<usize> = if code & 0xff == ACTION_DIE {
                    vec![victim]
                } else {
                    world.nodes[victim].stopped = true;
                    (0..campaign.ports)
                        .map(|port| index_of(victim, port))
                        .collect()
                };
                for victim in victims {
                    if processes[victim].state == State::Dead {
                        continue;
                    }
                    processes[victim].state = State::Dead;
                    processes[victim].closed = true;
                    dead.insert(victim);
                    let (node, port) = (processes[victim].node, processes[victim].port);
                    let open = world.nodes[node]
                        .nic
                        .port_status(PortId(port as u8))
                        .is_some();
                    if !world.nodes[node].stopped && open {
                        world.close_port(node, port);
                    }
                }
                None
            }
            Happening::Host { node, port } => {
                let id = index_of(node, port);
                host_step(
                    &mut world,
                    campaign,
                    &mut processes,
                    id,
                    &mut barriers,
                    &dead,
                    &mut report,
                )
                .map_err(fail)?;
                Some(node)
            }
        };
        if let Some(node) = touched {
            for port in 0..campaign.ports {
                let id = index_of(node, port);
                observe(
                    &mut world,
                    campaign,
                    &mut processes,
                    id,
                    &mut barriers,
                    &dead,
                    &mut report,
                )
                .map_err(fail)?;
            }
        }
    }
    // Every failed barrier was doomed: some member never completed it because it died, or because
    // it failed in another barrier (a cascade that starts at a death).
    for (index, barrier) in barriers.iter().enumerate() {
        if !barrier.failed.iter().any(|f| *f) {
            continue;
        }
        let doomed = barrier.doomed
            || barrier.members.iter().enumerate().any(|(rank, &m)| {
                dead.contains(&m)
                    || (!barrier.completed[rank]
                        && processes[m].state == State::Failed
                        && !barrier.failed[rank])
            });
        if !doomed {
            return Err(fail(format!(
                "barrier {index} ({:?}) failed at some members though none of its members died or failed elsewhere",
                barrier.algorithm
            )));
        }
    }
    report.virtual_time = world.now().saturating_since(Instant::ZERO);
    report.packets = world.wire_counts[0];
    report.replayed = world.replayed();
    Ok(report)
}

/// The global barrier sequence: random subsets (or the slow-pairs pattern), random algorithms.
fn plan_barriers(campaign: &BarrierCampaign, rng: &mut Rng, processes: usize) -> Vec<Barrier> {
    let mut plan = Vec::new();
    let mut add = |rng: &mut Rng, mut members: Vec<usize>| {
        // Shuffle the ranks so that ranks and nodes do not line up.
        for i in (1..members.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            members.swap(i, j);
        }
        let algorithm = draw_algorithm(rng, campaign.family, members.len());
        let entered = vec![None; members.len()];
        let (completed, failed) = (vec![false; members.len()], vec![false; members.len()]);
        plan.push(Barrier {
            members,
            algorithm,
            entered,
            completed,
            failed,
            doomed: false,
            host: campaign.host_barriers && rng.chance(0.4),
        });
    };
    if campaign.slow_pairs && processes > 1 {
        for other in 1..processes {
            add(rng, vec![0, other]);
        }
    }
    for _ in 0..campaign.barriers {
        let members: Vec<usize> = if rng.chance(0.4) || processes <= 2 {
            (0..processes).collect()
        } else {
            let size = rng.range(2..processes as u64 + 1) as usize;
            let mut all: Vec<usize> = (0..processes).collect();
            for i in 0..size {
                let j = i + rng.below((processes - i) as u64) as usize;
                all.swap(i, j);
            }
            all.truncate(size);
            all
        };
        add(rng, members);
    }
    plan
}

fn draw_algorithm(rng: &mut Rng, family: Family, members: usize) -> Algorithm {
    let family = match family {
        Family::Mixed => [
            Family::PairwiseExchange,
            Family::GatherBroadcast,
            Family::Dissemination,
        ][rng.below(3) as usize],
        other => other,
    };
    match family {
        Family::GatherBroadcast => {
            // Any dimension whose schedule fits the NIC (the root holds 2·dimension steps).
            let max_dimension = (members - 1).clamp(1, MAX_SCHEDULE_STEPS / 2 - 1);
            Algorithm::GatherBroadcast {
                dimension: rng.range(1..max_dimension as u64 + 1) as usize,
                root: rng.below(members as u64) as usize,
            }
        }
        Family::Dissemination => Algorithm::Dissemination {
            n: rng.range(1..5).min(members as u64 - 1).max(1) as usize,
        },
        _ => Algorithm::PairwiseExchange,
    }
}

/// The process's host step: if it is computing, it enters its next barrier (provides a barrier
/// buffer, writes the schedule, posts the barrier token, rings the doorbell).
fn enter_next_barrier(
    world: &mut World,
    campaign: &BarrierCampaign,
    process: &mut Process,
    id: usize,
    barriers: &mut [Barrier],
) -> Result<(), String> {
    if process.state != State::Computing {
        return Ok(());
    }
    let Some(&index) = process.program.get(process.position) else {
        process.state = State::Done;
        exit_if_done(world, campaign, process);
        return Ok(());
    };
    let barrier = &mut barriers[index];
    let rank = barrier
        .members
        .iter()
        .position(|&m| m == id)
        .ok_or("process not in its own barrier")?;
    if process.skips.contains(&process.position) {
        // Absent from this one: on to the next at the next host step.
        process.position += 1;
        wake(world, process, Duration::from_micros(1));
        return Ok(());
    }
    let members: Vec<Member> = barrier
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
    let count = match compile(barrier.algorithm, &members, rank, &mut steps) {
        Ok(count) => count,
        Err(ScheduleError::TrivialGroup) => 0,
        Err(error) => {
            return Err(format!(
                "barrier {index} ({:?}): {error}",
                barrier.algorithm
            ));
        }
    };
    barrier.entered[rank] = Some(world.now());
    process.state = State::Waiting;
    if barrier.host {
        let timeout = if barrier.doomed {
            DOOMED_TIMEOUT
        } else {
            HOST_TIMEOUT
        };
        let deadline = world.now().saturating_add(timeout);
        process.host.run = Some(HostRun {
            index,
            steps: steps[..count].to_vec(),
            step: 0,
            sent_current: false,
            deadline,
        });
        process.host.until = Some(deadline);
        provide_host_buffers(world, process)?;
        // Its deadline, and a first look at once.
        wake(world, process, timeout);
        wake(world, process, Duration::ZERO);
        return Ok(());
    }
    let Some(memory) = world.port_memory(process.node, process.port) else {
        return Err(format!(
            "node {} port {}: no region",
            process.node, process.port
        ));
    };
    let offset = process
        .rings
        .write_schedule(memory, &steps[..count])
        .ok_or("schedule does not fit the arena")?;
    let buffer = ReceiveToken {
        kind: ReceiveKind::BARRIER,
        ..ReceiveToken::default()
    };
    process
        .rings
        .post_receive(memory, &buffer)
        .map_err(|e| format!("receive ring: {e}"))?;
    let mut token = SendToken {
        kind: SendKind::BARRIER,
        length: (count as u32).into(),
        buffer: offset.into(),
        context: (index as u64).into(),
        timeout_us: if barrier.doomed {
            DOOMED_TIMEOUT.as_micros() as u32
        } else {
            0
        }
        .into(),
        ..SendToken::default()
    }
    // Every barrier of the plan is one of its own: the members agree on its index.
    .with_barrier_id(shared_abi::ids::BarrierId::new(0, 0, index as u32));
    if let Some((root, bytes)) = broadcast_of(campaign, index, barrier) {
        token.kind = SendKind::BROADCAST;
        // A broadcast needs an identity (the first barrier's would be `BarrierId::NONE`).
        token.set_barrier_id(shared_abi::ids::BarrierId::new(0, 1, index as u32));
        token.target_node = members[root].node;
        token.target_port = members[root].port;
        token.size = bytes.len() as u8;
        if root == rank {
            let at = offset + std::mem::size_of_val(&steps[..count]) as u64;
            if !process.rings.write_arena(memory, at, &bytes) {
                return Err("broadcast bytes do not fit the arena".into());
            }
        }
    }
    process
        .rings
        .post_send(memory, &token)
        .map_err(|e| format!("send ring: {e}"))?;
    process.rings.send_tokens += 1; // A barrier token comes back with its completion event.
    world.doorbell(process.node);
    Ok(())
}

/// Reads the process's events the instant its NIC wrote them: a NIC-based barrier's end (each
/// completion checked against the entries of its barrier's members), and the host-based
/// barrier's messages and sends.
fn observe(
    world: &mut World,
    campaign: &BarrierCampaign,
    processes: &mut [Process],
    id: usize,
    barriers: &mut [Barrier],
    dead: &BTreeSet<usize>,
    report: &mut BarrierReport,
) -> Result<(), String> {
    loop {
        let process = &mut processes[id];
        if process.state == State::Dead || process.closed {
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
        match event.kind {
            EventKind::RECEIVED | EventKind::SENT => {
                host_event(world, campaign, process, &event)?;
                if process.host.run.is_some() {
                    host_progress(world, campaign, processes, id, barriers, dead, report)?;
                }
            }
            EventKind::BARRIER_COMPLETED => {
                let index = process.program[process.position];
                if process.state != State::Waiting || event.context.get() != index as u64 {
                    return Err(format!(
                        "process {id}: completion of barrier {} while in {index} ({:?})",
                        event.context.get(),
                        process.state
                    ));
                }
                if let Some((_, bytes)) = broadcast_of(campaign, index, &barriers[index]) {
                    if event.broadcast_data() != bytes.as_slice() {
                        return Err(format!(
                            "process {id}: broadcast {index} completed with {:?}, the root sent \
                             {bytes:?}",
                            event.broadcast_data()
                        ));
                    }
                }
                complete(world, campaign, process, id, &mut barriers[index], report)?;
            }
            EventKind::BARRIER_FAILED => {
                let named = usize::from(event.peer_node.get()) * campaign.ports
                    + usize::from(event.peer_port.0);
                barrier_failed(
                    world,
                    campaign,
                    processes,
                    id,
                    barriers,
                    dead,
                    report,
                    (named, event.status),
                )?;
            }
            other => {
                return Err(format!(
                    "process {id}: unexpected event {other:?} ({:?})",
                    event.status
                ));
            }
        }
    }
}

/// The process left its barrier: checks that every member entered it, and goes on computing.
fn complete(
    world: &mut World,
    campaign: &BarrierCampaign,
    process: &mut Process,
    id: usize,
    barrier: &mut Barrier,
    report: &mut BarrierReport,
) -> Result<(), String> {
    let index = process.program[process.position];
    let now = world.now();
    for (rank, entered) in barrier.entered.iter().enumerate() {
        match entered {
            Some(at) if *at <= now => {}
            _ => {
                return Err(format!(
                    "process {id} left barrier {index} ({:?}{}) at {:?} before member {} (rank {rank}) entered",
                    barrier.algorithm,
                    if barrier.host { ", on the hosts" } else { "" },
                    now,
                    barrier.members[rank]
                ));
            }
        }
    }
    report.completions += 1;
    if let Some(rank) = barrier.members.iter().position(|&m| m == id) {
        barrier.completed[rank] = true;
    }
    process.position += 1;
    process.state = State::Computing;
    let mut skew = world.rng.below(campaign.skew.as_nanos() as u64 + 1);
    if process.slow {
        skew = skew.saturating_mul(20).max(200_000);
    }
    wake(world, process, Duration::from_nanos(skew));
    Ok(())
}

/// The process's barrier failed naming process `named`: allowed only where something made it
/// fail (checked again at the end), and only naming a member that is missing.
#[allow(
    clippy::too_many_arguments,
    reason = "the campaign's state, passed whole as the other handlers take it"
)]
fn barrier_failed(
    world: &mut World,
    campaign: &BarrierCampaign,
    processes: &mut [Process],
    id: usize,
    barriers: &mut [Barrier],
    dead: &BTreeSet<usize>,
    report: &mut BarrierReport,
    (named, status): (usize, Status),
) -> Result<(), String> {
    let index = processes[id].program[processes[id].position];
    let barrier = &mut barriers[index];
    if !barrier.members.contains(&named) {
        return Err(format!(
            "process {id}: barrier {index} failed naming {named}, not a member"
        ));
    }
    // Allowed only in a campaign where something died (or a member skipped this barrier), and
    // only naming a member that had not completed this barrier, or died (after completing it,
    // before its last packets got through). Whether the barrier was really doomed (a member never
    // completed it because it died, or failed elsewhere) is checked at the end.
    let something_died = campaign.deaths > 0 || campaign.node_stops > 0 || barrier.doomed;
    let named_rank = barrier.members.iter().position(|&m| m == named);
    let missing = dead.contains(&named) || named_rank.is_some_and(|rank| !barrier.completed[rank]);
    if !something_died || !missing {
        return Err(format!(
            "process {id}: barrier {index} ({:?}{}) failed ({status:?}) at {:?} naming {named}, which is not missing",
            barrier.algorithm,
            if barrier.host { ", on the hosts" } else { "" },
            world.now()
        ));
    }
    if ![
        Status::TARGET_PORT_CLOSED,
        Status::TARGET_NODE_UNREACHABLE,
        Status::BARRIER_TIMED_OUT,
    ]
    .contains(&status)
    {
        return Err(format!(
            "process {id}: barrier {index} failed with {status:?}"
        ));
    }
    report.failures += 1;
    if let Some(rank) = barrier.members.iter().position(|&m| m == id) {
        barrier.failed[rank] = true;
    }
    let process = &mut processes[id];
    process.host.run = None;
    if campaign.absences > 0 {
        // Its barrier failed for an absence: on to the next, as a program that handles the
        // error does.
        process.position += 1;
        process.state = State::Computing;
        wake(world, process, Duration::from_micros(1));
    } else {
        process.state = State::Failed;
        exit_if_done(world, campaign, process);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The host-based barrier: the schedule the NIC would run, run by the process over messages.

/// The process's host step: sends again what is due, ends a host-based barrier past its deadline
/// or moves it on, closes the port of a process that is done and owes nothing, or enters the
/// next barrier.
fn host_step(
    world: &mut World,
    campaign: &BarrierCampaign,
    processes: &mut [Process],
    id: usize,
    barriers: &mut [Barrier],
    dead: &BTreeSet<usize>,
    report: &mut BarrierReport,
) -> Result<(), String> {
    if processes[id].state == State::Dead || processes[id].closed {
        return Ok(());
    }
    host_resend(world, campaign, &mut processes[id])?;
    match processes[id].state {
        State::Computing => {
            enter_next_barrier(world, campaign, &mut processes[id], id, barriers)?;
            if processes[id].host.run.is_some() {
                host_progress(world, campaign, processes, id, barriers, dead, report)?;
            }
        }
        State::Waiting if processes[id].host.run.is_some() => {
            host_progress(world, campaign, processes, id, barriers, dead, report)?;
        }
        State::Done | State::Failed => exit_if_done(world, campaign, &mut processes[id]),
        _ => {}
    }
    Ok(())
}

/// A process that is done (or stopped after a failure) exits, if the campaign says so, once it
/// owes no host-based barrier message (as `Port::close` waits for them); its port closes in order.
fn exit_if_done(world: &mut World, campaign: &BarrierCampaign, process: &mut Process) {
    if !campaign.exit_when_done || process.closed {
        return;
    }
    let now = world.now();
    if process.host.owes(now) {
        let at = process
            .host
            .resends
            .iter()
            .map(|r| r.at)
            .min()
            .unwrap_or_else(|| now.saturating_add(HOST_RETRY));
        wake(
            world,
            process,
            at.saturating_since(now).max(Duration::from_micros(1)),
        );
        return;
    }
    process.closed = true;
    world.close_port_orderly(process.node, process.port);
}

/// Keeps receive buffers provided for host-based barrier messages (from the first host-based
/// barrier on).
fn provide_host_buffers(world: &mut World, process: &mut Process) -> Result<(), String> {
    if process.host.buffers_provided {
        return Ok(());
    }
    process.host.buffers_provided = true;
    let memory = world
        .port_memory(process.node, process.port)
        .ok_or("no region")?;
    for _ in 0..HOST_BUFFERS {
        let Some(slot) = process.rings.free_receive_slots.pop() else {
            break;
        };
        let token = ReceiveToken {
            kind: ReceiveKind::BUFFER,
            priority: Priority::HIGH,
            size: SIZE_CLASS,
            buffer: HostRings::slot_offset(slot).into(),
            ..ReceiveToken::default()
        };
        process
            .rings
            .post_receive(memory, &token)
            .map_err(|e| format!("receive ring: {e}"))?;
    }
    world.doorbell(process.node);
    Ok(())
}

/// Posts the message of `round` of `barrier` to process `to`; `false` if no send token or slot is
/// free (a SENT event will free one).
fn post_host_message(
    world: &mut World,
    campaign: &BarrierCampaign,
    process: &mut Process,
    (to, barrier, round): (usize, usize, u8),
) -> Result<bool, String> {
    if process.rings.send_tokens == 0 {
        return Ok(false);
    }
    let Some(slot) = process.rings.free_send_slots.pop() else {
        return Ok(false);
    };
    let memory = world
        .port_memory(process.node, process.port)
        .ok_or("no region")?;
    let mut bytes = [0u8; 5];
    bytes[..4].copy_from_slice(&(barrier as u32).to_le_bytes());
    bytes[4] = round;
    let offset = HostRings::slot_offset(slot);
    if !process.rings.write_arena(memory, offset, &bytes) {
        return Err("send slot outside the arena".into());
    }
    let context = process.host.next_context;
    process.host.next_context += 1;
    let token = SendToken {
        kind: SendKind::DATA,
        priority: Priority::HIGH,
        size: SIZE_CLASS,
        target_node: NodeId::new((to / campaign.ports) as u16),
        target_port: PortId((to % campaign.ports) as u8),
        length: (bytes.len() as u32).into(),
        buffer: offset.into(),
        context: context.into(),
        ..SendToken::default()
    };
    process
        .rings
        .post_send(memory, &token)
        .map_err(|e| format!("send ring: {e}"))?;
    process
        .host
        .sending
        .insert(context, (to, barrier, round, slot));
    world.doorbell(process.node);
    Ok(true)
}

/// A message arrived (count it, provide the buffer again) or a send ended (free its slot; a
/// refused message is sent again later, until its barrier's deadline).
fn host_event(
    world: &mut World,
    campaign: &BarrierCampaign,
    process: &mut Process,
    event: &Event,
) -> Result<(), String> {
    let memory = world
        .port_memory(process.node, process.port)
        .ok_or("no region")?;
    match event.kind {
        EventKind::RECEIVED => {
            let mut bytes = [0u8; 5];
            if event.length.get() != 5
                || !process
                    .rings
                    .read_arena(memory, event.buffer.get(), &mut bytes)
            {
                return Err(format!(
                    "a host-based barrier message of {} bytes",
                    event.length.get()
                ));
            }
            let barrier = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
            let sender = usize::from(event.peer_node.get()) * campaign.ports
                + usize::from(event.peer_port.0);
            *process
                .host
                .record
                .entry((sender, barrier, bytes[4]))
                .or_insert(0) += 1;
            let token = ReceiveToken {
                kind: ReceiveKind::BUFFER,
                priority: Priority::HIGH,
                size: SIZE_CLASS,
                buffer: event.buffer,
                ..ReceiveToken::default()
            };
            process
                .rings
                .post_receive(memory, &token)
                .map_err(|e| format!("receive ring: {e}"))?;
            world.doorbell(process.node);
        }
        _ => {
            let Some((to, barrier, round, slot)) =
                process.host.sending.remove(&event.context.get())
            else {
                return Err(format!("SENT for unknown context {}", event.context.get()));
            };
            process.rings.send_tokens += 1;
            process.rings.free_send_slots.push(slot);
            let now = world.now();
            if event.status != Status::SUCCESS
                && let Some(until) = process.host.until.filter(|until| *until > now)
            {
                let at = now.saturating_add(HOST_RETRY);
                process.host.resends.push(HostResend {
                    to,
                    barrier,
                    round,
                    at,
                    until,
                });
                wake(world, process, HOST_RETRY);
            }
        }
    }
    Ok(())
}

/// Sends again the refused host-based barrier messages that are due (whatever the process is
/// doing: they may be owed to a late peer of a barrier it already left), until their deadline.
fn host_resend(
    world: &mut World,
    campaign: &BarrierCampaign,
    process: &mut Process,
) -> Result<(), String> {
    let now = world.now();
    process.host.resends.retain(|r| r.until > now);
    let (due, later): (Vec<HostResend>, Vec<HostResend>) =
        process.host.resends.drain(..).partition(|r| r.at <= now);
    process.host.resends = later;
    for resend in due {
        let posted = post_host_message(
            world,
            campaign,
            process,
            (resend.to, resend.barrier, resend.round),
        )?;
        if !posted {
            process.host.resends.push(HostResend {
                at: now.saturating_add(HOST_RETRY),
                ..resend
            });
            wake(world, process, HOST_RETRY);
        }
    }
    Ok(())
}

/// Runs the process's host-based barrier as far as it can go: sends, consumes what arrived, and
/// completes it — or fails it past its deadline, naming the member it waited for.
fn host_progress(
    world: &mut World,
    campaign: &BarrierCampaign,
    processes: &mut [Process],
    id: usize,
    barriers: &mut [Barrier],
    dead: &BTreeSet<usize>,
    report: &mut BarrierReport,
) -> Result<(), String> {
    host_resend(world, campaign, &mut processes[id])?;
    loop {
        let process = &mut processes[id];
        let Some(run) = process.host.run.as_mut() else {
            return Ok(());
        };
        let index = run.index;
        let Some(step) = run.steps.get(run.step).copied() else {
            process.host.run = None;
            return complete(world, campaign, process, id, &mut barriers[index], report);
        };
        let peer = usize::from(step.node.get()) * campaign.ports + usize::from(step.port.0);
        let sends = step.op == shared_abi::schedule::StepOp::SEND
            || (step.op == shared_abi::schedule::StepOp::EXCHANGE && !run.sent_current);
        if sends {
            if !post_host_message(world, campaign, process, (peer, index, step.round))? {
                return Ok(()); // A SENT event frees a token.
            }
            let run = process.host.run.as_mut().ok_or("host run vanished")?;
            if step.op == shared_abi::schedule::StepOp::SEND {
                run.step += 1;
                continue;
            }
            run.sent_current = true;
        }
        let key = (peer, index, step.round);
        match process.host.record.get_mut(&key) {
            Some(count) if *count > 0 => {
                *count -= 1;
                if *count == 0 {
                    process.host.record.remove(&key);
                }
                let run = process.host.run.as_mut().ok_or("host run vanished")?;
                run.step += 1;
                run.sent_current = false;
            }
            _ => {
                let deadline = process.host.run.as_ref().map(|r| r.deadline);
                if deadline.is_some_and(|deadline| world.now() >= deadline) {
                    return barrier_failed(
                        world,
                        campaign,
                        processes,
                        id,
                        barriers,
                        dead,
                        report,
                        (peer, Status::BARRIER_TIMED_OUT),
                    );
                }
                return Ok(());
            }
        }
    }
}
