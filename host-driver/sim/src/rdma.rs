//! The one-sided campaign: every port registers memory of its process, lets peers reach it, and
//! runs puts, gets and NIC fetch-and-adds on random peers' memory while the wire loses, duplicates
//! and reorders packets and ports close and reopen (their processes die and start again).
//!
//! Checks, as it goes and at the end:
//! - every byte a successful put wrote is in the target's memory, and a get of it brings back the
//!   same bytes;
//! - every fetch-and-add applied exactly once: per target word, the previous values successful
//!   adds returned are distinct, and the word equals their count — give or take only adds whose
//!   outcome the initiator could not know (its node gave up on the target, or it died);
//! - nothing is written outside a registered region (a canary fills the rest of each process's
//!   memory), and no operation fails for a reason the campaign cannot cause;
//! - nothing hangs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use firmware::Hal;
use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::rdma::{AtomicOp, RemotePointer};
use shared_abi::token::{SendKind, SendToken};

use super::drive::Drive;
use super::hal::ProcessMemory;
use super::host::HostRings;
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

/// Where each simulated process's memory starts.
const PROCESS_BASE: u64 = 0x5555_0000_0000;
/// Words at the start of the exposed region that peers add to.
const WORDS: usize = 8;
/// Bytes of each initiator's own slot in every exposed region (puts land there, gets read it).
const PUT_SLOT: usize = 12 * 1024;
/// Initiators a campaign has at most (nodes × ports).
const MAX_INITIATORS: usize = 10;
/// The exposed region: the words, then one put slot per initiator.
const EXPOSED_AT: usize = 4096;
const EXPOSED_LEN: usize = WORDS * 8 + MAX_INITIATORS * PUT_SLOT;
/// The local region: put sources and get destinations.
const LOCAL_AT: usize = EXPOSED_AT + EXPOSED_LEN + 4096;
const LOCAL_LEN: usize = PUT_SLOT;
/// The whole process memory, with unregistered guard bytes around both regions.
const PROCESS_LEN: usize = LOCAL_AT + LOCAL_LEN + 4096;
/// What fills unregistered memory; a NIC write there is a violation.
const CANARY: u8 = 0xc5;

/// A one-sided campaign's shape.
#[derive(Clone, Debug)]
pub struct RdmaCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// Nodes (2..=5).
    pub nodes: usize,
    /// Ports per node (1..=2).
    pub ports: usize,
    /// Operations each port runs (a put and its get count as one).
    pub operations_per_port: u32,
    /// Wire faults.
    pub faults: WireFaults,
    /// Ports that close mid-run (their process dies) and reopen a little later.
    pub port_restarts: usize,
}

impl RdmaCampaign {
    /// A campaign with every parameter drawn from `seed`: 2–5 nodes, 1–2 ports, 0–25 % loss,
    /// duplication and reordering; a third of the seeds also restart ports.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = super::rng::Rng::new(seed ^ 0x7264_6d61_7264_6d61);
        let nodes = rng.range(2..6) as usize;
        let ports = rng.range(1..3) as usize;
        let operations_per_port = (240 / (nodes * ports) as u32).clamp(10, 60);
        let faults = WireFaults {
            loss: rng.below(26) as f64 / 100.0,
            duplicate: rng.below(26) as f64 / 100.0,
            reorder: rng.below(26) as f64 / 100.0,
            reorder_window: Duration::from_micros(rng.range(1..200)),
        };
        Self {
            seed,
            nodes,
            ports,
            operations_per_port,
            faults,
            port_restarts: if rng.chance(0.33) {
                rng.range(1..4) as usize
            } else {
                0
            },
        }
    }
}

impl Campaign for RdmaCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

/// What a finished campaign did.
#[derive(Debug, Default, Clone)]
pub struct RdmaReport {
    /// Puts, gets and fetch-and-adds that succeeded.
    pub puts: u64,
    /// Gets that succeeded.
    pub gets: u64,
    /// Fetch-and-adds that succeeded.
    pub adds: u64,
    /// Operations that failed, by status.
    pub errors: BTreeMap<u8, u64>,
    /// Packets put on the wire / lost / duplicated.
    pub wire: [u64; 3],
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Recorded packets the replay adversary sent again during the run.
    pub replayed: u64,
}

/// One incarnation of a port: `(node, port, incarnation)`.
type Incarnation = (usize, usize, u32);

/// The operation a port has outstanding (one at a time).
#[derive(Clone, Copy, Debug)]
enum Operation {
    Put {
        target: Incarnation,
        length: usize,
        number: u32,
    },
    Get {
        target: Incarnation,
        length: usize,
        number: u32,
    },
    Add {
        target: Incarnation,
        word: usize,
    },
}

/// The program on one port.
struct PortProgram {
    rings: HostRings,
    incarnation: u32,
    /// The key peers present to reach the exposed region of this incarnation.
    key: u32,
    operations_left: u32,
    outstanding: Option<(u64, Operation)>,
    next_context: u64,
    alive: bool,
}

/// What the adds to one word of one incarnation came to.
#[derive(Debug, Default)]
struct WordAdds {
    /// Previous values returned by successful adds.
    previous: Vec<u64>,
    /// Adds whose outcome the initiator cannot know.
    unknown: u64,
    /// The word's value when its incarnation ended (or at the end).
    final_value: Option<u64>,
}

const ACTION_CLOSE: u64 = 1;
const ACTION_REOPEN: u64 = 2;

fn action(kind: u64, node: usize, port: usize) -> Happening {
    Happening::Action {
        code: kind | (node as u64) << 8 | (port as u64) << 40,
    }
}

/// The bytes of put `number` of initiator `initiator`.
fn pattern(initiator: usize, number: u32, length: usize) -> Vec<u8> {
    (0..length)
        .map(|i| (i as u32 ^ number.wrapping_mul(0x9e37) ^ (initiator as u32) << 5) as u8)
        .collect()
}

/// A fresh process memory: canary everywhere, zero words.
fn fresh_process() -> ProcessMemory {
    let mut bytes = vec![CANARY; PROCESS_LEN];
    bytes[EXPOSED_AT..EXPOSED_AT + WORDS * 8].fill(0);
    ProcessMemory {
        base: PROCESS_BASE,
        bytes,
    }
}

/// Registers the process's two regions and allows remote access; returns the exposed region's key.
fn register(world: &mut World, node: usize, port: usize) -> Result<u32, String> {
    let nonce = world.rng.next_u64() as u32;
    let nic = &mut world.nodes[node].nic;
    nic.hal_mut().process[port] = Some(fresh_process());
    let port_id = PortId(port as u8);
    let key = nic
        .register_memory(
            port_id,
            PROCESS_BASE + EXPOSED_AT as u64,
            EXPOSED_LEN as u64,
            nonce,
        )
        .map_err(|e| format!("registering node {node} port {port}: {e}"))?;
    nic.register_memory(
        port_id,
        PROCESS_BASE + LOCAL_AT as u64,
        LOCAL_LEN as u64,
        nonce.rotate_left(8),
    )
    .map_err(|e| format!("registering node {node} port {port}: {e}"))?;
    nic.allow_remote_memory_access(port_id)
        .map_err(|e| format!("allowing node {node} port {port}: {e}"))?;
    Ok(key)
}

fn process(world: &World, node: usize, port: usize) -> Option<&ProcessMemory> {
    world.nodes[node].nic.hal().process[port].as_ref()
}

/// Checks that nothing outside the registered regions of `(node, port)`'s process changed.
fn check_canary(world: &World, node: usize, port: usize) -> Result<(), String> {
    let Some(memory) = process(world, node, port) else {
        return Ok(());
    };
    let outside = memory
        .bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            !(EXPOSED_AT..EXPOSED_AT + EXPOSED_LEN).contains(i)
                && !(LOCAL_AT..LOCAL_AT + LOCAL_LEN).contains(i)
        })
        .find(|(_, b)| **b != CANARY);
    match outside {
        Some((at, byte)) => Err(format!(
            "node {node} port {port}: byte {at:#x} outside every registered region is {byte:#04x}"
        )),
        None => Ok(()),
    }
}

/// The words of `(node, port)`'s exposed region.
fn words(world: &World, node: usize, port: usize) -> [u64; WORDS] {
    let mut words = [0; WORDS];
    if let Some(memory) = process(world, node, port) {
        for (w, word) in words.iter_mut().enumerate() {
            let at = EXPOSED_AT + w * 8;
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&memory.bytes[at..at + 8]);
            *word = u64::from_le_bytes(bytes);
        }
    }
    words
}

/// Runs one campaign to the end, checking as it goes.
///
/// # Errors
/// [`CampaignFailure`] names the seed and the first violation seen.
pub fn run(campaign: &RdmaCampaign) -> Result<RdmaReport, CampaignFailure<RdmaCampaign>> {
    let fail = |violation: String| CampaignFailure::new(campaign, violation);
    if campaign.nodes * campaign.ports > MAX_INITIATORS {
        return Err(fail(format!(
            "{} nodes of {} ports: more than {MAX_INITIATORS} initiators",
            campaign.nodes, campaign.ports
        )));
    }
    let config = crate::campaign_config(campaign.seed);
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
    let mut programs: Vec<Vec<PortProgram>> = Vec::new();
    for node in 0..campaign.nodes {
        let mut ports = Vec::new();
        for port in 0..campaign.ports {
            let rings = world.open_port(node, port);
            let key = register(&mut world, node, port).map_err(fail)?;
            ports.push(PortProgram {
                rings,
                incarnation: 0,
                key,
                operations_left: campaign.operations_per_port,
                outstanding: None,
                next_context: 1,
                alive: true,
            });
            let start = Duration::from_micros(world.rng.below(50));
            world.schedule_in(start, Happening::Host { node, port });
        }
        programs.push(ports);
    }
    for _ in 0..campaign.port_restarts {
        let node = world.rng.below(campaign.nodes as u64) as usize;
        let port = world.rng.below(campaign.ports as u64) as usize;
        let at = Duration::from_micros(world.rng.range(20..3_000));
        world.schedule_in(at, action(ACTION_CLOSE, node, port));
    }
    let mut adds: BTreeMap<(Incarnation, usize), WordAdds> = BTreeMap::new();
    // Incarnations that ended: operations on them may be refused.
    let mut ended: BTreeSet<Incarnation> = BTreeSet::new();
    let mut report = RdmaReport::default();

    let drive = Drive {
        max_steps: 20_000_000,
        deadline: Duration::from_secs(120),
        unfinished: "operations",
    };
    loop {
        let done = programs.iter().all(|ports| {
            ports
                .iter()
                .all(|p| !p.alive || (p.operations_left == 0 && p.outstanding.is_none()))
        });
        let stuck = || {
            programs
                .iter()
                .enumerate()
                .flat_map(|(n, ports)| {
                    ports
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.alive)
                        .map(move |(i, p)| {
                            format!(
                                "node {n} port {i}: {} operations left, {} outstanding",
                                p.operations_left,
                                usize::from(p.outstanding.is_some())
                            )
                        })
                })
                .take(5)
                .collect()
        };
        let Some(happening) = drive.next(done, &mut world, stuck).map_err(fail)? else {
            break;
        };
        match happening {
            Happening::Arrive { node, bytes } => world.arrive(node, &bytes),
            Happening::Poll { node } => world.poll(node),
            Happening::Action { code } => {
                let (kind, node, port) = (
                    code & 0xff,
                    ((code >> 8) & 0xffff_ffff) as usize,
                    (code >> 40) as usize,
                );
                match kind {
                    ACTION_CLOSE if programs[node][port].alive => {
                        // The process dies: what it had outstanding has an unknown outcome.
                        let program = &mut programs[node][port];
                        if let Some((_, Operation::Add { target, word })) = program.outstanding {
                            adds.entry((target, word)).or_default().unknown += 1;
                        }
                        program.outstanding = None;
                        program.alive = false;
                        let incarnation = (node, port, program.incarnation);
                        check_canary(&world, node, port).map_err(fail)?;
                        for (w, value) in words(&world, node, port).into_iter().enumerate() {
                            adds.entry((incarnation, w)).or_default().final_value = Some(value);
                        }
                        ended.insert(incarnation);
                        world.close_port(node, port);
                        world.nodes[node].nic.hal_mut().process[port] = None;
                        let back = Duration::from_micros(world.rng.range(50..1_500));
                        world.schedule_in(back, action(ACTION_REOPEN, node, port));
                    }
                    ACTION_REOPEN => {
                        let rings = world.open_port(node, port);
                        let key = register(&mut world, node, port).map_err(fail)?;
                        let program = &mut programs[node][port];
                        program.rings = rings;
                        program.incarnation += 1;
                        program.key = key;
                        program.operations_left = campaign.operations_per_port / 2;
                        program.alive = true;
                        world.schedule_in(Duration::from_micros(1), Happening::Host { node, port });
                    }
                    _ => {}
                }
            }
            Happening::Host { node, port } => {
                if !programs[node][port].alive {
                    continue;
                }
                drain(
                    &mut world,
                    campaign,
                    &mut programs,
                    (node, port),
                    &ended,
                    &mut adds,
                    &mut report,
                )
                .map_err(fail)?;
                post(&mut world, campaign, &mut programs, (node, port)).map_err(fail)?;
                let interval = world.rng.range(5..80);
                world.schedule_in(
                    Duration::from_micros(interval),
                    Happening::Host { node, port },
                );
            }
        }
    }

    // Final checks: the words of live incarnations, every process's canary, and exactly-once.
    for (node, ports) in programs.iter().enumerate() {
        for (port, program) in ports.iter().enumerate() {
            if !program.alive {
                continue;
            }
            check_canary(&world, node, port).map_err(fail)?;
            let incarnation = (node, port, program.incarnation);
            for (w, value) in words(&world, node, port).into_iter().enumerate() {
                adds.entry((incarnation, w)).or_default().final_value = Some(value);
            }
        }
    }
    for ((incarnation, word), outcome) in &adds {
        let mut previous = outcome.previous.clone();
        previous.sort_unstable();
        let count = previous.len() as u64;
        previous.dedup();
        if previous.len() as u64 != count {
            return Err(fail(format!(
                "{incarnation:?} word {word}: two successful adds saw the same previous value \
                 (an add applied twice or lost): {:?}",
                outcome.previous
            )));
        }
        let Some(value) = outcome.final_value else {
            continue;
        };
        if value < count || value > count + outcome.unknown {
            return Err(fail(format!(
                "{incarnation:?} word {word}: {count} adds succeeded ({} of unknown outcome) but \
                 the word is {value}",
                outcome.unknown
            )));
        }
        if previous.last().is_some_and(|&last| last >= value) {
            return Err(fail(format!(
                "{incarnation:?} word {word}: an add returned {:?}, not below the final {value}",
                previous.last()
            )));
        }
    }
    report.wire = world.wire_counts;
    report.virtual_time = Duration::from_nanos(world.now().as_nanos());
    report.replayed = world.replayed();
    Ok(report)
}

/// Takes the completions of `(node, port)` and checks each.
fn drain(
    world: &mut World,
    campaign: &RdmaCampaign,
    programs: &mut [Vec<PortProgram>],
    (node, port): (usize, usize),
    ended: &BTreeSet<Incarnation>,
    adds: &mut BTreeMap<(Incarnation, usize), WordAdds>,
    report: &mut RdmaReport,
) -> Result<(), String> {
    let initiator = node * campaign.ports + port;
    loop {
        let event = {
            let Some(memory) = world.nodes[node].nic.hal().port_memory(port) else {
                return Ok(());
            };
            let program = &mut programs[node][port];
            match program.rings.next_event(memory) {
                Ok(Some(event)) => event,
                Ok(None) => return Ok(()),
                Err(error) => {
                    return Err(format!("node {node} port {port}: event ring: {error:?}"));
                }
            }
        };
        let program = &mut programs[node][port];
        if event.kind != EventKind::SENT {
            return Err(format!(
                "node {node} port {port}: unexpected event {event:?}"
            ));
        }
        program.rings.send_tokens += 1;
        let Some((context, operation)) = program.outstanding else {
            return Err(format!(
                "node {node} port {port}: a completion with nothing outstanding: {event:?}"
            ));
        };
        if event.context.get() != context {
            return Err(format!(
                "node {node} port {port}: completion of context {} while {context} is \
                 outstanding",
                event.context.get()
            ));
        }
        program.outstanding = None;
        let status = event.status;
        let target = match operation {
            Operation::Put { target, .. }
            | Operation::Get { target, .. }
            | Operation::Add { target, .. } => target,
        };
        if status != Status::SUCCESS {
            *report.errors.entry(status.0).or_default() += 1;
            let refused = matches!(
                status,
                Status::BAD_KEY | Status::TARGET_PORT_CLOSED | Status::REMOTE_ACCESS_DENIED
            );
            let unknown = matches!(
                status,
                Status::SEND_TIMED_OUT | Status::TARGET_NODE_UNREACHABLE
            );
            if refused && !ended.contains(&target) {
                return Err(format!(
                    "node {node} port {port}: {operation:?} refused with {status:?} though its \
                     target never closed"
                ));
            }
            if !refused && !unknown {
                return Err(format!(
                    "node {node} port {port}: {operation:?} failed with {status:?}, which this \
                     campaign cannot cause"
                ));
            }
            if let Operation::Add { target, word } = operation
                && unknown
            {
                adds.entry((target, word)).or_default().unknown += 1;
            }
            continue;
        }
        let (target_node, target_port, incarnation) = target;
        let target_live = programs[target_node][target_port].alive
            && programs[target_node][target_port].incarnation == incarnation;
        match operation {
            Operation::Put { length, number, .. } => {
                report.puts += 1;
                let expected = pattern(initiator, number, length);
                if target_live {
                    let at = EXPOSED_AT + WORDS * 8 + initiator * PUT_SLOT;
                    let memory = process(world, target_node, target_port)
                        .ok_or("a live target without memory")?;
                    if memory.bytes[at..at + length] != expected[..] {
                        return Err(format!(
                            "node {node} port {port}: put {number} of {length} bytes completed \
                             but the target's memory differs"
                        ));
                    }
                }
                // Bring it back with a get.
                let program = &mut programs[node][port];
                program.outstanding = Some((
                    0,
                    Operation::Get {
                        target,
                        length,
                        number,
                    },
                ));
            }
            Operation::Get { length, number, .. } => {
                report.gets += 1;
                let expected = pattern(initiator, number, length);
                let memory = process(world, node, port).ok_or("a live initiator without memory")?;
                if target_live && memory.bytes[LOCAL_AT..LOCAL_AT + length] != expected[..] {
                    return Err(format!(
                        "node {node} port {port}: get of put {number} ({length} bytes) brought \
                         back other bytes"
                    ));
                }
            }
            Operation::Add { target, word } => {
                report.adds += 1;
                adds.entry((target, word))
                    .or_default()
                    .previous
                    .push(event.buffer.get());
            }
        }
    }
}

/// Posts the port's next operation (or the get that follows a put) when none is outstanding.
fn post(
    world: &mut World,
    campaign: &RdmaCampaign,
    programs: &mut [Vec<PortProgram>],
    (node, port): (usize, usize),
) -> Result<(), String> {
    let initiator = node * campaign.ports + port;
    let program = &programs[node][port];
    let operation = match program.outstanding {
        Some((0, get @ Operation::Get { .. })) => get,
        Some(_) => return Ok(()),
        None if program.operations_left == 0 => return Ok(()),
        None => {
            let target_node = world.rng.below(campaign.nodes as u64) as usize;
            let target_port = world.rng.below(campaign.ports as u64) as usize;
            let target = (
                target_node,
                target_port,
                programs[target_node][target_port].incarnation,
            );
            if world.rng.chance(0.5) {
                Operation::Add {
                    target,
                    word: world.rng.below(WORDS as u64) as usize,
                }
            } else {
                Operation::Put {
                    target,
                    length: world.rng.range(1..PUT_SLOT as u64 + 1) as usize,
                    number: program.operations_left,
                }
            }
        }
    };
    let ((target_node, target_port, _), kind) = match operation {
        Operation::Put { target, .. } => (target, SendKind::PUT),
        Operation::Get { target, .. } => (target, SendKind::GET),
        Operation::Add { target, .. } => (target, SendKind::ATOMIC),
    };
    // The key of the target as this process last heard it (stale if the target restarted).
    let key = programs[target_node][target_port].key;
    let (offset, length) = match operation {
        Operation::Put { length, .. } | Operation::Get { length, .. } => {
            (WORDS * 8 + initiator * PUT_SLOT, length)
        }
        Operation::Add { word, .. } => (word * 8, 8),
    };
    if let Operation::Put { number, length, .. } = operation
        && let Some(memory) = world.nodes[node].nic.hal_mut().process[port].as_mut()
    {
        memory.bytes[LOCAL_AT..LOCAL_AT + length]
            .copy_from_slice(&pattern(initiator, number, length));
    }
    if let Operation::Get { length, .. } = operation
        && let Some(memory) = world.nodes[node].nic.hal_mut().process[port].as_mut()
    {
        // What the get brings must be its own doing.
        memory.bytes[LOCAL_AT..LOCAL_AT + length].fill(0);
    }
    let program = &mut programs[node][port];
    let context = program.next_context;
    program.next_context += 1;
    let token = SendToken {
        kind,
        target_node: NodeId::new(target_node as u16),
        target_port: PortId(target_port as u8),
        length: (length as u32).into(),
        buffer: if kind == SendKind::ATOMIC {
            0
        } else {
            PROCESS_BASE + LOCAL_AT as u64
        }
        .into(),
        context: context.into(),
        remote: RemotePointer {
            key,
            offset: offset as u32,
        }
        .to_u64()
        .into(),
        operand: 1.into(),
        op: if kind == SendKind::ATOMIC {
            AtomicOp::FETCH_ADD
        } else {
            AtomicOp::default()
        },
        ..SendToken::default()
    };
    let Some(memory) = world.nodes[node].nic.hal().port_memory(port) else {
        return Ok(());
    };
    program
        .rings
        .post_send(memory, &token)
        .map_err(|e| format!("node {node} port {port}: send ring: {e:?}"))?;
    if !matches!(operation, Operation::Get { .. }) {
        program.operations_left -= 1;
    }
    program.outstanding = Some((context, operation));
    world.doorbell(node);
    Ok(())
}
