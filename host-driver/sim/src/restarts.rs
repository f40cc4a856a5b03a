//! Restart campaigns: a sender and a receiver exchange messages; one of them restarts (with the
//! same fabric key), or the link idles past the give-up time, and an attacker on the path sends
//! the whole capture of genuine traffic again. Nothing of the capture may be delivered — not to
//! the restarted receiver's new process, not twice to a receiver that stayed up — and the
//! genuine traffic right after must all arrive, exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use shared_abi::event::{EventKind, Status};
use shared_abi::ids::{NodeId, PortId};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};

use firmware::Hal;

use super::adversary::Adversary;
use super::host::{HostRings, SIZE_CLASS};
use super::rng::Rng;
use super::world::{Happening, WireFaults, World};
use super::{Campaign, CampaignFailure};

const SENDER: (usize, usize) = (0, 3);
const RECEIVER: (usize, usize) = (1, 2);
const MESSAGE: usize = 16;

/// What happens between the genuine traffic and the replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// The receiver restarts and a new process opens the port.
    ReceiverRestarts,
    /// The sender restarts and talks to the receiver again.
    SenderRestarts,
    /// The sender restarts, talks to the receiver, then the link idles past the give-up time.
    SenderRestartsThenIdle,
    /// No restart: the link idles past the give-up time.
    IdlePastGiveUp,
}

/// One restart campaign, drawn from its seed.
#[derive(Clone, Debug)]
pub struct RestartCampaign {
    /// The seed every choice is drawn from.
    pub seed: u64,
    /// What happens before the replay.
    pub case: Case,
    /// Messages per wave of genuine traffic.
    pub messages: u32,
    /// The wire's faults.
    pub faults: WireFaults,
}

impl Campaign for RestartCampaign {
    fn seed(&self) -> u64 {
        self.seed
    }
}

impl RestartCampaign {
    /// The campaign of `seed`: one of the cases, 2 to 24 messages a wave, up to 5 % loss,
    /// duplication and reordering.
    pub fn from_seed(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let case = match rng.below(4) {
            0 => Case::ReceiverRestarts,
            1 => Case::SenderRestarts,
            2 => Case::SenderRestartsThenIdle,
            _ => Case::IdlePastGiveUp,
        };
        let messages = rng.range(2..25) as u32;
        let mut odds = || rng.below(6) as f64 / 100.0;
        let faults = WireFaults {
            loss: odds(),
            duplicate: odds(),
            reorder: odds(),
            reorder_window: Duration::from_micros(50),
        };
        Self {
            seed,
            case,
            messages,
            faults,
        }
    }
}

/// What a campaign saw.
#[derive(Debug, Default)]
pub struct RestartReport {
    /// Genuine messages delivered.
    pub delivered: u64,
    /// Packets the attacker sent again.
    pub replayed: u64,
}

/// The processes: the sender's and the receiver's rings, and what the receiver took.
struct Hosts {
    sender: HostRings,
    receiver: HostRings,
    /// The receiver process's incarnation (a restart opens the port anew).
    receiver_incarnation: u32,
    /// (wave, number) delivered to the current receiver process.
    delivered: BTreeSet<(u32, u32)>,
    /// The waves sent while the current receiver process lived.
    waves_for_receiver: BTreeSet<u32>,
    /// SENT events: (wave, number) and status.
    sent: Vec<((u32, u32), Status)>,
    report: RestartReport,
}

/// Runs the campaign of `campaign`.
///
/// # Errors
/// The violation seen: a message of the capture delivered, a genuine message not delivered or
/// delivered twice, a send that failed.
pub fn run(campaign: &RestartCampaign) -> Result<RestartReport, CampaignFailure<RestartCampaign>> {
    let fail = |violation: String| CampaignFailure::new(campaign, violation);
    let config = crate::campaign_config(campaign.seed);
    let mut world = World::new(
        campaign.seed,
        2,
        config,
        campaign.faults,
        Duration::from_micros(5),
    );
    world.adversary = Some(Adversary::recorder(campaign.seed));
    let mut hosts = Hosts {
        sender: world.open_port(SENDER.0, SENDER.1),
        receiver: world.open_port(RECEIVER.0, RECEIVER.1),
        receiver_incarnation: 0,
        delivered: BTreeSet::new(),
        waves_for_receiver: BTreeSet::new(),
        sent: Vec::new(),
        report: RestartReport::default(),
    };
    provide_buffers(&mut world, &mut hosts);
    wave(&mut world, &mut hosts, 0, campaign.messages).map_err(fail)?;
    let idle = config.give_up_after + Duration::from_millis(50);
    match campaign.case {
        Case::ReceiverRestarts => {
            world.restart_node(RECEIVER.0);
            hosts.receiver = world.open_port(RECEIVER.0, RECEIVER.1);
            hosts.receiver_incarnation += 1;
            hosts.delivered.clear();
            hosts.waves_for_receiver.clear();
            provide_buffers(&mut world, &mut hosts);
        }
        Case::SenderRestarts | Case::SenderRestartsThenIdle => {
            world.restart_node(SENDER.0);
            hosts.sender = world.open_port(SENDER.0, SENDER.1);
            wave(&mut world, &mut hosts, 1, campaign.messages).map_err(fail)?;
            if campaign.case == Case::SenderRestartsThenIdle {
                run_for(&mut world, &mut hosts, idle).map_err(fail)?;
            }
        }
        Case::IdlePastGiveUp => run_for(&mut world, &mut hosts, idle).map_err(fail)?,
    }
    // The attacker sends everything it recorded again, spread over a few milliseconds.
    let capture = world
        .adversary
        .as_ref()
        .map(Adversary::recording)
        .unwrap_or_default();
    hosts.report.replayed = capture.len() as u64;
    for (node, bytes) in capture {
        let after = Duration::from_nanos(world.rng.below(3_000_000));
        world.schedule_in(after, Happening::Arrive { node, bytes });
    }
    run_for(&mut world, &mut hosts, Duration::from_millis(10)).map_err(fail)?;
    // Genuine traffic right after runs unharmed.
    wave(&mut world, &mut hosts, 2, campaign.messages).map_err(fail)?;
    Ok(hosts.report)
}

/// Sends wave `wave` of `count` messages and runs until the sender has every completion; each
/// must succeed and be delivered once.
fn wave(world: &mut World, hosts: &mut Hosts, wave: u32, count: u32) -> Result<(), String> {
    hosts.waves_for_receiver.insert(wave);
    let mut posted = 0;
    let mut done = 0;
    let deadline = world.now().saturating_add(Duration::from_secs(5));
    while done < count {
        while posted < count && hosts.sender.send_tokens > 0 {
            let Some(memory) = world.nodes[SENDER.0].nic.hal().port_memory(SENDER.1) else {
                return Err("the sender's port has no memory".to_owned());
            };
            let Some(slot) = hosts.sender.free_send_slots.pop() else {
                break;
            };
            let mut bytes = [0u8; MESSAGE];
            bytes[..4].copy_from_slice(&wave.to_le_bytes());
            bytes[4..8].copy_from_slice(&posted.to_le_bytes());
            bytes[8..].copy_from_slice(&world.seed.to_le_bytes());
            let offset = HostRings::slot_offset(slot);
            hosts.sender.write_arena(memory, offset, &bytes);
            let token = SendToken {
                kind: SendKind::DATA,
                priority: Priority::LOW,
                size: SIZE_CLASS,
                target_node: NodeId::new(RECEIVER.0 as u16),
                target_port: PortId(RECEIVER.1 as u8),
                length: (MESSAGE as u32).into(),
                buffer: offset.into(),
                context: (u64::from(wave) << 32 | u64::from(posted) << 8 | slot as u64).into(),
                ..SendToken::default()
            };
            hosts
                .sender
                .post_send(memory, &token)
                .map_err(|error| format!("send ring: {error}"))?;
            posted += 1;
        }
        world.doorbell(SENDER.0);
        let before = hosts.sent.len();
        step(world, hosts)?;
        done += (hosts.sent.len() - before) as u32;
        if world.now() > deadline {
            return Err(format!(
                "wave {wave}: {done} of {count} sends finished in 5 s"
            ));
        }
    }
    // Let the last acks and deliveries land.
    run_for(world, hosts, Duration::from_millis(5))?;
    for ((sent_wave, number), status) in hosts.sent.drain(..) {
        if status != Status::SUCCESS {
            return Err(format!(
                "wave {sent_wave} message {number}: sent with {status:?}"
            ));
        }
        if !hosts.delivered.contains(&(sent_wave, number)) {
            return Err(format!(
                "wave {sent_wave} message {number}: sent successfully, never delivered"
            ));
        }
    }
    Ok(())
}

/// Runs the world for `span` of virtual time.
fn run_for(world: &mut World, hosts: &mut Hosts, span: Duration) -> Result<(), String> {
    let until = world.now().saturating_add(span);
    world.schedule(until, Happening::Action { code: 0 });
    while world.now() < until {
        step(world, hosts)?;
    }
    Ok(())
}

/// One happening, then the processes read their events.
fn step(world: &mut World, hosts: &mut Hosts) -> Result<(), String> {
    let Some(happening) = world.next_happening() else {
        // Quiet: time passes to the next thing that can happen (a timer of nobody).
        return Err("the world went quiet".to_owned());
    };
    match happening {
        Happening::Arrive { node, bytes } => world.arrive(node, &bytes),
        Happening::Poll { node } => world.poll(node),
        Happening::Host { .. } | Happening::Action { .. } => {}
    }
    read_events(world, hosts)
}

fn read_events(world: &mut World, hosts: &mut Hosts) -> Result<(), String> {
    if let Some(memory) = world.nodes[SENDER.0].nic.hal().port_memory(SENDER.1) {
        while let Some(event) = hosts
            .sender
            .next_event(memory)
            .map_err(|error| format!("sender events: {error}"))?
        {
            if event.kind == EventKind::SENT {
                let context = event.context.get();
                hosts.sender.send_tokens += 1;
                hosts.sender.free_send_slots.push((context & 0xff) as usize);
                let id = ((context >> 32) as u32, ((context >> 8) & 0xff_ffff) as u32);
                hosts.sent.push((id, event.status));
            }
        }
    }
    let Some(memory) = world.nodes[RECEIVER.0].nic.hal().port_memory(RECEIVER.1) else {
        return Ok(());
    };
    let mut consumed = Vec::new();
    while let Some(event) = hosts
        .receiver
        .next_event(memory)
        .map_err(|error| format!("receiver events: {error}"))?
    {
        if event.kind != EventKind::RECEIVED {
            continue;
        }
        let offset = event.buffer.get();
        let mut bytes = [0u8; MESSAGE];
        hosts.receiver.read_arena(memory, offset, &mut bytes);
        consumed.push(HostRings::slot_of(offset));
        let wave = u32::from_le_bytes(bytes[..4].try_into().unwrap_or_default());
        let number = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
        if !hosts.waves_for_receiver.contains(&wave) {
            return Err(format!(
                "stale delivery: wave {wave} message {number} (sent before receiver process {} \
                 existed) delivered to it",
                hosts.receiver_incarnation
            ));
        }
        if !hosts.delivered.insert((wave, number)) {
            let counters: Vec<_> = (0..2)
                .map(|n| world.nodes[n].nic.connection_counters().collect::<Vec<_>>())
                .collect();
            return Err(format!(
                "wave {wave} message {number} delivered twice to receiver process {} at {:?} \
                 (connections: {counters:?})",
                hosts.receiver_incarnation,
                world.now()
            ));
        }
        hosts.report.delivered += 1;
    }
    hosts.receiver.free_receive_slots.extend(consumed);
    provide_buffers(world, hosts);
    Ok(())
}

fn provide_buffers(world: &mut World, hosts: &mut Hosts) {
    let Some(memory) = world.nodes[RECEIVER.0].nic.hal().port_memory(RECEIVER.1) else {
        return;
    };
    let mut posted = false;
    while let Some(slot) = hosts.receiver.free_receive_slots.pop() {
        let token = ReceiveToken {
            kind: ReceiveKind::BUFFER,
            priority: Priority::LOW,
            size: SIZE_CLASS,
            tag: (slot as u32).into(),
            buffer: HostRings::slot_offset(slot).into(),
            ..ReceiveToken::default()
        };
        if hosts.receiver.post_receive(memory, &token).is_err() {
            hosts.receiver.free_receive_slots.push(slot);
            break;
        }
        posted = true;
    }
    if posted {
        world.doorbell(RECEIVER.0);
    }
}
