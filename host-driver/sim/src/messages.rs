//! The messaging campaign: every port sends numbered messages to random ports while the wire loses,
//! duplicates and reorders packets, ports close and reopen, and nodes stop. Checks that every
//! message a send token accepted arrives exactly once, in order per (sender port, receiver port),
//! or that its sender got an error event naming the reason — and that nothing hangs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::max_length_for_size;
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};

use firmware::Hal;

use super::drive::Drive;
use super::host::{HostRings, SIZE_CLASS};
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

/// A messaging campaign's shape.
#[derive(Clone, Debug)]
pub struct MessageCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// Nodes (2..=64).
    pub nodes: usize,
    /// Ports per node (1..=8).
    pub ports: usize,
    /// Messages each port sends.
    pub messages_per_port: u32,
    /// Wire faults.
    pub faults: WireFaults,
    /// Ports that close mid-run (their process dies) and reopen a little later.
    pub port_restarts: usize,
    /// Nodes that stop mid-run for good.
    pub node_stops: usize,
    /// Receivers provide few buffers and run rarely (exercises the no-buffer path).
    pub slow_receivers: bool,
    /// Ports whose process posts a burst of messages and closes the port at once (an orderly
    /// close: every message must still arrive), reopening a little later.
    pub orderly_closes: usize,
}

impl MessageCampaign {
    /// A campaign with every parameter drawn from `seed`: 2–64 nodes (mostly small), 1–4 ports,
    /// 0–30 % loss, duplication and reordering; a third of the seeds also restart ports, and one in
    /// six stops a node.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = super::rng::Rng::new(seed ^ 0x6d65_7373_6167_6573);
        let nodes = if rng.chance(0.15) {
            rng.range(17..65)
        } else {
            rng.range(2..17)
        } as usize;
        let ports = rng.range(1..5) as usize;
        let total_ports = (nodes * ports) as u32;
        let messages_per_port = (400 / total_ports).clamp(3, 40);
        let faults = WireFaults {
            loss: rng.below(31) as f64 / 100.0,
            duplicate: rng.below(31) as f64 / 100.0,
            reorder: rng.below(31) as f64 / 100.0,
            reorder_window: Duration::from_micros(rng.range(1..200)),
        };
        Self {
            seed,
            nodes,
            ports,
            messages_per_port,
            faults,
            port_restarts: if rng.chance(0.33) {
                rng.range(1..4) as usize
            } else {
                0
            },
            node_stops: if nodes > 2 && rng.chance(0.16) { 1 } else { 0 },
            slow_receivers: rng.chance(0.2),
            orderly_closes: if rng.chance(0.5) {
                rng.range(1..4) as usize
            } else {
                0
            },
        }
    }
}

impl Campaign for MessageCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

/// What a finished campaign did.
#[derive(Debug, Default, Clone)]
pub struct CampaignReport {
    /// Messages whose send token was taken.
    pub sent: u64,
    /// Messages delivered.
    pub delivered: u64,
    /// Messages whose sender got an error, by status.
    pub errors: BTreeMap<u8, u64>,
    /// Packets put on the wire / lost / duplicated.
    pub wire: [u64; 3],
    /// Virtual time at the end.
    pub virtual_time: Duration,
    /// Happenings processed.
    pub steps: u64,
    /// Recorded packets the replay adversary sent again during the run.
    pub replayed: u64,
}

/// One message's identity: sender (node, port, incarnation) and its number on that stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Stream {
    src_node: u16,
    src_port: u8,
    incarnation: u32,
    dst_node: u16,
    dst_port: u8,
}

const MESSAGE_HEADER: usize = 16;

fn encode(stream: Stream, number: u32, length: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; length];
    bytes[0..2].copy_from_slice(&stream.src_node.to_le_bytes());
    bytes[2] = stream.src_port;
    bytes[3..7].copy_from_slice(&stream.incarnation.to_le_bytes());
    bytes[7..9].copy_from_slice(&stream.dst_node.to_le_bytes());
    bytes[9] = stream.dst_port;
    bytes[10..14].copy_from_slice(&number.to_le_bytes());
    for (i, byte) in bytes.iter_mut().enumerate().skip(MESSAGE_HEADER) {
        *byte = (number as usize).wrapping_mul(31).wrapping_add(i) as u8;
    }
    bytes
}

fn decode(bytes: &[u8]) -> Option<(Stream, u32)> {
    if bytes.len() < MESSAGE_HEADER {
        return None;
    }
    let stream = Stream {
        src_node: u16::from_le_bytes([bytes[0], bytes[1]]),
        src_port: bytes[2],
        incarnation: u32::from_le_bytes(bytes[3..7].try_into().ok()?),
        dst_node: u16::from_le_bytes([bytes[7], bytes[8]]),
        dst_port: bytes[9],
    };
    let number = u32::from_le_bytes(bytes[10..14].try_into().ok()?);
    let intact = bytes
        .iter()
        .enumerate()
        .skip(MESSAGE_HEADER)
        .all(|(i, byte)| *byte == (number as usize).wrapping_mul(31).wrapping_add(i) as u8);
    intact.then_some((stream, number))
}

/// What happened to one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Pending,
    Sent(Status),
}

/// The program on one port.
struct PortProgram {
    rings: HostRings,
    incarnation: u32,
    to_send: u32,
    next_number: BTreeMap<(u16, u8), u32>,
    /// Context → (stream, number, send slot).
    in_flight: BTreeMap<u64, (Stream, u32, usize)>,
    next_context: u64,
    alive: bool,
}

const ACTION_CLOSE: u64 = 1;
const ACTION_REOPEN: u64 = 2;
const ACTION_STOP: u64 = 3;
const ACTION_ORDERLY_CLOSE: u64 = 4;

fn action(kind: u64, node: usize, port: usize) -> Happening {
    Happening::Action {
        code: kind | (node as u64) << 8 | (port as u64) << 40,
    }
}

/// Runs one messaging campaign to the end, checking as it goes.
///
/// # Errors
/// [`CampaignFailure`] names the seed and the first violation seen.
pub fn run(campaign: &MessageCampaign) -> Result<CampaignReport, CampaignFailure<MessageCampaign>> {
    let fail = |violation: String| CampaignFailure::new(campaign, violation);
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
            ports.push(PortProgram {
                rings,
                incarnation: 0,
                to_send: campaign.messages_per_port,
                next_number: BTreeMap::new(),
                in_flight: BTreeMap::new(),
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
        let at = Duration::from_micros(world.rng.range(20..2_000));
        world.schedule_in(at, action(ACTION_CLOSE, node, port));
    }
    for _ in 0..campaign.orderly_closes {
        let node = world.rng.below(campaign.nodes as u64) as usize;
        let port = world.rng.below(campaign.ports as u64) as usize;
        let at = Duration::from_micros(world.rng.range(20..2_000));
        world.schedule_in(at, action(ACTION_ORDERLY_CLOSE, node, port));
    }
    // Incarnations (node, port, incarnation) that closed in order: all they posted must arrive.
    let mut orderly: BTreeSet<(u16, u8, u32)> = BTreeSet::new();
    let mut stopped_nodes = BTreeSet::new();
    for _ in 0..campaign.node_stops {
        let node = world.rng.below(campaign.nodes as u64) as usize;
        let at = Duration::from_micros(world.rng.range(20..2_000));
        world.schedule_in(at, action(ACTION_STOP, node, 0));
    }

    let mut fates: BTreeMap<(Stream, u32), Fate> = BTreeMap::new();
    let mut last_delivered: BTreeMap<Stream, u32> = BTreeMap::new();
    let mut delivered: BTreeSet<(Stream, u32)> = BTreeSet::new();
    // Ports that were ever closed (sends to them may fail with TARGET_PORT_CLOSED).
    let mut ever_closed: BTreeSet<(u16, u8)> = BTreeSet::new();
    let mut report = CampaignReport::default();

    let drive = Drive {
        max_steps: 20_000_000,
        deadline: Duration::from_secs(120),
        unfinished: "messages",
    };
    loop {
        let done = programs.iter().enumerate().all(|(node, ports)| {
            stopped_nodes.contains(&node)
                || ports.iter().enumerate().all(|(port, p)| {
                    !world.is_closing(node, port)
                        && (!p.alive || (p.to_send == 0 && p.in_flight.is_empty()))
                })
        });
        let stuck = || {
            programs
                .iter()
                .enumerate()
                .flat_map(|(n, ports)| {
                    ports
                        .iter()
                        .enumerate()
                        .filter(|(_, p)| p.alive && !p.in_flight.is_empty())
                        .map(move |(i, p)| {
                            format!(
                                "node {n} port {i}: {} unfinished, {} unsent",
                                p.in_flight.len(),
                                p.to_send
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
                    ACTION_CLOSE
                        if programs[node][port].alive && !stopped_nodes.contains(&node) =>
                    {
                        // The process dies. What the NIC already delivered into its event ring
                        // counts as delivered; its own unfinished sends are abandoned.
                        drain_events(
                            &mut world,
                            node,
                            port,
                            &mut programs[node][port],
                            &mut fates,
                            &mut last_delivered,
                            &mut delivered,
                        )
                        .map_err(fail)?;
                        programs[node][port].alive = false;
                        ever_closed.insert((node as u16, port as u8));
                        world.close_port(node, port);
                        let back = Duration::from_micros(world.rng.range(50..1_500));
                        world.schedule_in(back, action(ACTION_REOPEN, node, port));
                    }
                    ACTION_ORDERLY_CLOSE
                        if programs[node][port].alive && !stopped_nodes.contains(&node) =>
                    {
                        // The process posts what it has left (as many messages as it holds
                        // tokens for), rings the doorbell and closes the port at once.
                        drain_events(
                            &mut world,
                            node,
                            port,
                            &mut programs[node][port],
                            &mut fates,
                            &mut last_delivered,
                            &mut delivered,
                        )
                        .map_err(fail)?;
                        let program = &mut programs[node][port];
                        let burst = program.rings.send_tokens;
                        program.to_send = program.to_send.max(burst);
                        post_messages(
                            &mut world,
                            campaign,
                            node,
                            port,
                            &mut programs[node][port],
                            burst,
                            &mut fates,
                            &mut report,
                        )
                        .map_err(fail)?;
                        world.doorbell(node);
                        let program = &mut programs[node][port];
                        program.alive = false;
                        orderly.insert((node as u16, port as u8, program.incarnation));
                        // Peers' sends to it may fail from now on.
                        ever_closed.insert((node as u16, port as u8));
                        world.close_port_orderly(node, port);
                        let back = Duration::from_micros(world.rng.range(50..1_500));
                        world.schedule_in(back, action(ACTION_REOPEN, node, port));
                    }
                    ACTION_REOPEN if world.is_closing(node, port) => {
                        // The NIC is still finishing the orderly close: the new process waits.
                        world.schedule_in(
                            Duration::from_micros(50),
                            action(ACTION_REOPEN, node, port),
                        );
                    }
                    ACTION_REOPEN if !stopped_nodes.contains(&node) => {
                        let rings = world.open_port(node, port);
                        let program = &mut programs[node][port];
                        program.rings = rings;
                        program.incarnation += 1;
                        program.to_send = campaign.messages_per_port / 2;
                        program.next_number.clear();
                        program.in_flight.clear();
                        program.alive = true;
                        world.schedule_in(Duration::from_micros(1), Happening::Host { node, port });
                    }
                    ACTION_STOP => {
                        stopped_nodes.insert(node);
                        world.nodes[node].stopped = true;
                    }
                    _ => {}
                }
            }
            Happening::Host { node, port } => {
                if stopped_nodes.contains(&node) || !programs[node][port].alive {
                    continue;
                }
                drain_events(
                    &mut world,
                    node,
                    port,
                    &mut programs[node][port],
                    &mut fates,
                    &mut last_delivered,
                    &mut delivered,
                )
                .map_err(fail)?;
                let program = &mut programs[node][port];
                let memory = world.nodes[node].nic.hal().port_memory(port);
                let Some(memory) = memory else { continue };
                // Keep receive buffers provided (a slow receiver keeps only a few).
                let keep = if campaign.slow_receivers {
                    2
                } else {
                    usize::MAX
                };
                let provided =
                    (super::host::RECEIVE_RING as usize) - program.rings.free_receive_slots.len();
                let mut to_provide = keep.saturating_sub(provided);
                while to_provide > 0 {
                    let Some(slot) = program.rings.free_receive_slots.pop() else {
                        break;
                    };
                    let token = ReceiveToken {
                        kind: ReceiveKind::BUFFER,
                        priority: Priority::LOW,
                        size: SIZE_CLASS,
                        tag: (slot as u32).into(),
                        buffer: HostRings::slot_offset(slot).into(),
                        ..ReceiveToken::default()
                    };
                    if program.rings.post_receive(memory, &token).is_err() {
                        program.rings.free_receive_slots.push(slot);
                        break;
                    }
                    to_provide -= 1;
                }
                // Send a few messages if tokens allow.
                let burst = world.rng.range(1..5) as u32;
                post_messages(
                    &mut world,
                    campaign,
                    node,
                    port,
                    &mut programs[node][port],
                    burst,
                    &mut fates,
                    &mut report,
                )
                .map_err(fail)?;
                world.doorbell(node);
                let interval = if campaign.slow_receivers {
                    world.rng.range(50..400)
                } else {
                    world.rng.range(2..60)
                };
                world.schedule_in(
                    Duration::from_micros(interval),
                    Happening::Host { node, port },
                );
            }
        }
    }

    // Final checks: every message of a live sender finished; a successful send was delivered;
    // an error names a reason this campaign can cause.
    for ((stream, number), fate) in &fates {
        let sender_alive = !stopped_nodes.contains(&usize::from(stream.src_node))
            && programs[usize::from(stream.src_node)][usize::from(stream.src_port)].incarnation
                == stream.incarnation
            && programs[usize::from(stream.src_node)][usize::from(stream.src_port)].alive;
        let closed_in_order =
            orderly.contains(&(stream.src_node, stream.src_port, stream.incarnation))
                && !stopped_nodes.contains(&usize::from(stream.src_node));
        match fate {
            Fate::Pending if sender_alive => {
                return Err(fail(format!(
                    "{stream:?} message {number}: no completion event (hang)"
                )));
            }
            Fate::Pending if closed_in_order => {
                // The sender closed its port in order after posting this: the NIC had to finish
                // it. Unless the receiver went away (or may have had no buffer for it), it arrived.
                let (n, p) = (usize::from(stream.dst_node), usize::from(stream.dst_port));
                let excused = stopped_nodes.contains(&n)
                    || ever_closed.contains(&(stream.dst_node, stream.dst_port))
                    || campaign.slow_receivers;
                if !excused && !delivered.contains(&(*stream, *number)) {
                    if programs[n][p].alive {
                        drain_events(
                            &mut world,
                            n,
                            p,
                            &mut programs[n][p],
                            &mut BTreeMap::new(),
                            &mut last_delivered,
                            &mut delivered,
                        )
                        .map_err(fail)?;
                    }
                    if !delivered.contains(&(*stream, *number)) {
                        return Err(fail(format!(
                            "{stream:?} message {number}: posted before an orderly close, never \
                             delivered"
                        )));
                    }
                }
            }
            Fate::Pending => {}
            Fate::Sent(Status::SUCCESS) => {
                let receiver_stopped = stopped_nodes.contains(&usize::from(stream.dst_node));
                if !delivered.contains(&(*stream, *number)) && !receiver_stopped {
                    // A receiver that is still alive must show it (its events are drained at
                    // the end below).
                    let (n, p) = (usize::from(stream.dst_node), usize::from(stream.dst_port));
                    if programs[n][p].alive {
                        drain_events(
                            &mut world,
                            n,
                            p,
                            &mut programs[n][p],
                            &mut BTreeMap::new(),
                            &mut last_delivered,
                            &mut delivered,
                        )
                        .map_err(fail)?;
                    }
                    if !delivered.contains(&(*stream, *number))
                        && !ever_closed.contains(&(stream.dst_node, stream.dst_port))
                    {
                        return Err(fail(format!(
                            "{stream:?} message {number}: sender told SUCCESS, never delivered"
                        )));
                    }
                }
            }
            Fate::Sent(status) => {
                *report.errors.entry(status.0).or_default() += 1;
                let allowed = match *status {
                    Status::TARGET_PORT_CLOSED => {
                        ever_closed.contains(&(stream.dst_node, stream.dst_port))
                    }
                    Status::TARGET_NODE_UNREACHABLE | Status::SEND_TIMED_OUT => {
                        stopped_nodes.contains(&usize::from(stream.dst_node))
                            || campaign.slow_receivers
                            || ever_closed.contains(&(stream.dst_node, stream.dst_port))
                    }
                    _ => false,
                };
                if !allowed {
                    return Err(fail(format!(
                        "{stream:?} message {number}: error {status:?} this campaign cannot cause"
                    )));
                }
            }
        }
    }
    report.delivered = delivered.len() as u64;
    report.wire = world.wire_counts;
    report.virtual_time = world.now().saturating_since(firmware::Instant::ZERO);
    report.steps = world.steps;
    report.replayed = world.replayed();
    Ok(report)
}

/// Posts up to `burst` messages from `port` of `node` to random ports (as far as its send
/// tokens allow), recording each as pending.
#[allow(clippy::too_many_arguments)]
fn post_messages(
    world: &mut World,
    campaign: &MessageCampaign,
    node: usize,
    port: usize,
    program: &mut PortProgram,
    burst: u32,
    fates: &mut BTreeMap<(Stream, u32), Fate>,
    report: &mut CampaignReport,
) -> Result<(), String> {
    let Some(memory) = world.nodes[node].nic.hal().port_memory(port) else {
        return Ok(());
    };
    for _ in 0..burst {
        if program.to_send == 0 || program.rings.send_tokens == 0 {
            break;
        }
        let Some(slot) = program.rings.free_send_slots.pop() else {
            break;
        };
        let dst_node = world.rng.below(campaign.nodes as u64) as u16;
        let dst_port = world.rng.below(campaign.ports as u64) as u8;
        let stream = Stream {
            src_node: node as u16,
            src_port: port as u8,
            incarnation: program.incarnation,
            dst_node,
            dst_port,
        };
        let number = program.next_number.entry((dst_node, dst_port)).or_insert(0);
        let this = *number;
        *number += 1;
        let length = world
            .rng
            .range(MESSAGE_HEADER as u64..u64::from(max_length_for_size(SIZE_CLASS)) + 1)
            as usize;
        let bytes = encode(stream, this, length);
        let offset = HostRings::slot_offset(slot);
        program.rings.write_arena(memory, offset, &bytes);
        let context = program.next_context;
        program.next_context += 1;
        let token = SendToken {
            kind: SendKind::DATA,
            priority: Priority::LOW,
            size: SIZE_CLASS,
            target_node: NodeId::new(dst_node),
            target_port: PortId(dst_port),
            length: (length as u32).into(),
            buffer: offset.into(),
            context: context.into(),
            ..SendToken::default()
        };
        if program.rings.post_send(memory, &token).is_err() {
            return Err(format!(
                "node {node} port {port}: send ring refused a token the host held"
            ));
        }
        program.to_send -= 1;
        program.in_flight.insert(context, (stream, this, slot));
        fates.insert((stream, this), Fate::Pending);
        report.sent += 1;
    }
    Ok(())
}

/// Reads `port`'s events: send completions settle fates and return tokens; receptions are
/// checked (intact, right port, exactly once, in order) and their buffers provided again.
fn drain_events(
    world: &mut World,
    node: usize,
    port: usize,
    program: &mut PortProgram,
    fates: &mut BTreeMap<(Stream, u32), Fate>,
    last_delivered: &mut BTreeMap<Stream, u32>,
    delivered: &mut BTreeSet<(Stream, u32)>,
) -> Result<(), String> {
    let Some(memory) = world.nodes[node].nic.hal().port_memory(port) else {
        return Ok(());
    };
    loop {
        let event = match program.rings.next_event(memory) {
            Ok(Some(event)) => event,
            Ok(None) => return Ok(()),
            Err(error) => return Err(format!("node {node} port {port}: event ring: {error}")),
        };
        match event.kind {
            EventKind::SENT => {
                let context = event.context.get();
                let Some((stream, number, slot)) = program.in_flight.remove(&context) else {
                    return Err(format!(
                        "node {node} port {port}: SENT for unknown context {context}"
                    ));
                };
                program.rings.send_tokens += 1;
                program.rings.free_send_slots.push(slot);
                fates.insert((stream, number), Fate::Sent(event.status));
            }
            EventKind::RECEIVED => {
                let length = event.length.get() as usize;
                let mut bytes = vec![0u8; length];
                if !program
                    .rings
                    .read_arena(memory, event.buffer.get(), &mut bytes)
                {
                    return Err(format!(
                        "node {node} port {port}: RECEIVED names a buffer outside the arena"
                    ));
                }
                let Some((stream, number)) = decode(&bytes) else {
                    return Err(format!(
                        "node {node} port {port}: received a corrupt message of {length} bytes"
                    ));
                };
                if (usize::from(stream.dst_node), usize::from(stream.dst_port)) != (node, port) {
                    return Err(format!(
                        "{stream:?} message {number} delivered to node {node} port {port}"
                    ));
                }
                if (event.peer_node.get(), event.peer_port.0) != (stream.src_node, stream.src_port)
                {
                    return Err(format!(
                        "{stream:?} message {number}: event names the wrong sender"
                    ));
                }
                if let Some(last) = last_delivered.get(&stream)
                    && number <= *last
                {
                    return Err(format!(
                        "{stream:?}: message {number} delivered after message {last} (duplicate or out of order)"
                    ));
                }
                last_delivered.insert(stream, number);
                delivered.insert((stream, number));
                program
                    .rings
                    .free_receive_slots
                    .push(HostRings::slot_of(event.buffer.get()));
            }
            other => {
                return Err(format!(
                    "node {node} port {port}: unexpected event {other:?} status {:?}",
                    event.status
                ));
            }
        }
    }
}
