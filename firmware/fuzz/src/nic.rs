//! The firmware fed untrusted input: arbitrary bytes from the wire ([`nic_packets`]), and
//! arbitrary sequences of host actions, packet arrivals, losses, timer ticks, NIC restarts and
//! replays of earlier packets between two NICs ([`nic_sequence`]), with or without a fabric key
//! (with one, the session handshake and its per-session keys are on the path).

use arbitrary::{Arbitrary, Unstructured};
use firmware::auth::FabricKey;
use firmware::{Config, Hal, Instant, Nic};
use shared_abi::event::Event;
use shared_abi::ids::{Generation, NodeId, PORTS_PER_NIC, PortId};
use shared_abi::packet::{HEADER_LEN, MAX_PACKET_LEN, PACKET_MAGIC, PacketHeader, WIRE_VERSION};
use shared_abi::region::RegionLayout;
use shared_abi::ring::{Consumer, Producer, RingIndexes, SharedMemory};
use shared_abi::schedule::{Step, StepOp};
use shared_abi::token::{Priority, ReceiveKind, ReceiveToken, SendKind, SendToken};
use zerocopy::{FromBytes, IntoBytes};

use crate::hal::{Memory, Wire};

/// Nodes on the fuzzed fabric.
const NODES: u16 = 2;
/// Connection slots per NIC: few, so recycling them is reachable.
const CONNECTIONS: usize = 4;
/// Most actions one input runs (keeps one run short).
const MAX_ACTIONS: usize = 256;
/// Most poll-and-deliver rounds of one [`Action::Run`].
const MAX_ROUNDS: usize = 32;
/// Arena offset where schedules are written.
const SCHEDULE_AT: u64 = 0;
/// Packets kept for [`Action::Replay`]: the latest ones delivered.
const CAPTURED: usize = 64;

/// The process on one port: the host side of its three rings.
struct Host {
    layout: RegionLayout,
    send: Producer<SendToken>,
    receive: Producer<ReceiveToken>,
    events: Consumer<Event>,
    /// The process overwrote one of its rings' indexes: what it reads since is its own doing.
    forged: bool,
}

struct Node {
    nic: Nic<Wire, CONNECTIONS>,
    hosts: [Option<Host>; PORTS_PER_NIC],
}

/// The shape of a port's region: a small one (rings of two, one page of arena: full rings are
/// reachable) or a roomier one.
fn layout(tiny: bool) -> RegionLayout {
    if tiny {
        RegionLayout::standard(2, 2, 2, 4096)
    } else {
        RegionLayout::standard(16, 16, 32, 8192)
    }
}

impl Node {
    /// NIC `id` at its `boot`-th start (a restart draws other boot entropy), keyed or not.
    fn new(id: u16, key: Option<FabricKey>, boot: u8) -> Self {
        let node = NodeId::new(id);
        let config = Config {
            fabric_key: key,
            ..Config::default()
        };
        let mut entropy = [id as u8; 16];
        entropy[0] = boot;
        Self {
            nic: Nic::new(
                Wire::new(node, NODES, key.is_some()),
                node,
                config,
                u32::from(id) + 1 + u32::from(boot),
                entropy,
            ),
            hosts: Default::default(),
        }
    }

    /// Maps a region for `port` with the header the driver writes (one byte of it replaced by
    /// `edit`, if any) and asks the NIC to open the port.
    fn open(&mut self, port: u8, tiny: bool, edit: Option<(u8, u8)>, now: Instant) {
        let index = usize::from(port) % PORTS_PER_NIC;
        let layout = layout(tiny);
        let mut header = layout.header(self.nic.node(), PortId(index as u8), 0, Generation::new(0));
        if let Some((at, value)) = edit {
            let bytes = header.as_mut_bytes();
            let at = usize::from(at) % bytes.len();
            bytes[at] = value;
        }
        let memory = Memory::new(layout.region_len);
        let _ = memory.write(0, header.as_bytes());
        if self.nic.port_status(PortId(index as u8)).is_none() {
            self.nic.hal_mut().map(index, memory);
        }
        if self.nic.open_port(PortId(index as u8), now).is_ok() {
            self.hosts[index] = Some(Host {
                layout,
                send: Producer::new(layout.send_ring, 0),
                receive: Producer::new(layout.receive_ring, 0),
                events: Consumer::new(layout.event_ring, 0),
                forged: false,
            });
        }
    }

    fn close(&mut self, port: u8, now: Instant) {
        let index = usize::from(port) % PORTS_PER_NIC;
        self.nic.close_port(PortId(index as u8), now);
        self.nic.hal_mut().unmap(index);
        self.hosts[index] = None;
    }

    /// The process on `port`, and its region.
    fn host(&mut self, port: u8) -> Option<(&Memory, &mut Host)> {
        let index = usize::from(port) % PORTS_PER_NIC;
        let host = self.hosts[index].as_mut()?;
        let memory = self.nic.hal().port_memory(index)?;
        Some((memory, host))
    }

    fn post_send(&mut self, port: u8, token: &SendToken) {
        if let Some((memory, host)) = self.host(port) {
            let _ = host.send.push(memory, token);
        }
    }

    fn post_receive(&mut self, port: u8, token: &ReceiveToken) {
        if let Some((memory, host)) = self.host(port) {
            let _ = host.receive.push(memory, token);
        }
    }

    fn write_arena(&mut self, port: u8, offset: u64, bytes: &[u8]) {
        if let Some((memory, host)) = self.host(port)
            && let Some(at) = host.layout.arena_range(offset, bytes.len())
        {
            let _ = memory.write(at, bytes);
        }
    }

    /// The process reads its events, as the host library does: every event the NIC wrote is
    /// one the library knows (unless the process forged its ring's indexes and reads slots the
    /// NIC never wrote).
    fn take_events(&mut self, port: u8) {
        let Some((memory, host)) = self.host(port) else {
            return;
        };
        for _ in 0..64 {
            match host.events.pop(memory) {
                Ok(Some(_)) if host.forged => {}
                Ok(Some(event)) => {
                    assert!(
                        (1..=5).contains(&event.kind.0),
                        "the NIC wrote an event of unknown kind: {event:?}"
                    );
                    // INCOMPLETE is the last status the ABI defines.
                    assert!(
                        event.status.0 <= shared_abi::event::Status::INCOMPLETE.0,
                        "the NIC wrote an unknown status: {event:?}"
                    );
                }
                // An empty ring, or one whose indexes the process itself forged.
                Ok(None) | Err(_) => break,
            }
        }
    }

    fn forge_index(&mut self, port: u8, ring: u8, head: bool, value: u32) {
        let Some((memory, host)) = self.host(port) else {
            return;
        };
        host.forged = true;
        let ring = match ring % 3 {
            0 => host.layout.send_ring,
            1 => host.layout.receive_ring,
            _ => host.layout.event_ring,
        };
        let field = if head {
            core::mem::offset_of!(RingIndexes, head)
        } else {
            core::mem::offset_of!(RingIndexes, tail)
        };
        let _ = memory.store_release(ring.offset + field, value);
    }
}

/// Two NICs, the processes on their ports, one clock, and what an attacker on the wire recorded.
struct Net {
    nodes: [Node; NODES as usize],
    now: Instant,
    key: Option<FabricKey>,
    /// How many times each NIC started.
    boots: [u8; NODES as usize],
    /// The latest packets delivered, with their destination: what a replay re-sends.
    captured: Vec<(u16, Vec<u8>)>,
}

impl Net {
    /// Both NICs with ports 0 and 1 open, so inputs start where traffic can flow.
    fn new(key: Option<FabricKey>) -> Self {
        let mut net = Self {
            nodes: [Node::new(0, key, 0), Node::new(1, key, 0)],
            now: Instant::ZERO,
            key,
            boots: [0; NODES as usize],
            captured: Vec::new(),
        };
        for node in &mut net.nodes {
            node.open(0, false, None, Instant::ZERO);
            node.open(1, false, None, Instant::ZERO);
        }
        net
    }

    /// NIC `which` restarts: everything it held is gone, its processes with it.
    fn restart(&mut self, which: bool) {
        let index = usize::from(which);
        self.boots[index] = self.boots[index].wrapping_add(1);
        self.nodes[index] = Node::new(index as u16, self.key, self.boots[index]);
    }

    /// Re-sends a recorded packet to the NIC it went to.
    fn replay(&mut self, pick: u8) {
        let now = self.now;
        if self.captured.is_empty() {
            return;
        }
        let (to, bytes) = self.captured[usize::from(pick) % self.captured.len()].clone();
        if let Some(node) = self.nodes.get_mut(usize::from(to)) {
            node.nic.on_packet(&bytes, now);
            node.nic.poll(now);
        }
    }

    fn node(&mut self, which: bool) -> &mut Node {
        &mut self.nodes[usize::from(which)]
    }

    fn advance(&mut self, micros: u32) {
        let nanos = u64::from(micros) * 1000;
        self.now = Instant::from_nanos(self.now.as_nanos().saturating_add(nanos));
    }

    fn poll(&mut self, which: bool) {
        let now = self.now;
        self.node(which).nic.poll(now);
    }

    /// Hands up to `count` of `from`'s transmitted packets to their destination, dropping
    /// every `lose`-th one (0: none) and delivering every `duplicate`-th twice (0: none).
    fn deliver(&mut self, from: bool, count: u8, lose: u8, duplicate: u8) {
        let now = self.now;
        let outbox = core::mem::take(&mut self.node(from).nic.hal_mut().outbox);
        let take = usize::from(count).min(outbox.len());
        let (now_going, later) = outbox.split_at(take);
        self.node(from).nic.hal_mut().outbox = later.to_vec();
        for (i, (to, bytes)) in now_going.iter().enumerate() {
            let i = i + 1;
            if lose != 0 && i % usize::from(lose) == 0 {
                continue;
            }
            if self.captured.len() == CAPTURED {
                self.captured.remove(0);
            }
            self.captured.push((to.get(), bytes.clone()));
            let Some(node) = self.nodes.get_mut(usize::from(to.get())) else {
                continue;
            };
            node.nic.on_packet(bytes, now);
            if duplicate != 0 && i % usize::from(duplicate) == 0 {
                node.nic.on_packet(bytes, now);
            }
            node.nic.poll(now);
        }
    }

    /// Polls both NICs and delivers everything, until quiet or `MAX_ROUNDS`, then advances
    /// the clock to the next deadline.
    fn run(&mut self) {
        for _ in 0..MAX_ROUNDS {
            let mut busy = false;
            for which in [false, true] {
                let now = self.now;
                busy |= self.node(which).nic.poll(now);
                busy |= !self.node(which).nic.hal().outbox.is_empty();
                self.deliver(which, u8::MAX, 0, 0);
            }
            if !busy {
                break;
            }
        }
        let next = self.nodes.iter().filter_map(|n| n.nic.poll_at()).min();
        if let Some(next) = next
            && next > self.now
        {
            self.now = next;
        }
    }

    fn take_all_events(&mut self) {
        for node in &mut self.nodes {
            for port in 0..PORTS_PER_NIC as u8 {
                node.take_events(port);
            }
        }
    }
}

/// A schedule step as the fuzzer writes it: valid-looking (op 1..3 on nodes and ports that
/// exist) unless `raw`.
#[derive(Arbitrary, Debug)]
struct FuzzStep {
    op: u8,
    node: bool,
    port: u8,
    round: u8,
    raw: Option<[u8; 8]>,
}

impl FuzzStep {
    fn step(&self) -> Step {
        match self.raw {
            Some(bytes) => Step::read_from_bytes(&bytes).unwrap_or_default(),
            None => Step::new(
                StepOp(1 + self.op % 3),
                NodeId::new(u16::from(self.node)),
                PortId(self.port % 3),
                self.round % 4,
            ),
        }
    }
}

/// One thing that happens to the two NICs.
#[derive(Arbitrary, Debug)]
enum Action {
    /// A process opens a port (its region's header possibly broken in one byte).
    Open {
        node: bool,
        port: u8,
        tiny: bool,
        edit: Option<(u8, u8)>,
    },
    /// The process on a port exits.
    Close { node: bool, port: u8 },
    /// A data send of a message the process wrote in its arena.
    SendMessage {
        node: bool,
        port: u8,
        target_port: u8,
        size: u8,
        length: u16,
        high: bool,
        buffer: u16,
        context: u64,
    },
    /// A receive buffer offered.
    ProvideBuffer {
        node: bool,
        port: u8,
        size: u8,
        high: bool,
        buffer: u16,
        tag: u32,
    },
    /// A barrier: a barrier buffer, then a schedule written in the arena and its token.
    Barrier {
        node: bool,
        port: u8,
        steps: Vec<FuzzStep>,
        timeout_us: u32,
        context: u64,
    },
    /// A send token of any bytes.
    RawSend {
        node: bool,
        port: u8,
        token: [u8; 64],
    },
    /// A receive token of any bytes.
    RawReceive {
        node: bool,
        port: u8,
        token: [u8; 32],
    },
    /// The process scribbles in its arena.
    WriteArena {
        node: bool,
        port: u8,
        offset: u16,
        bytes: Vec<u8>,
    },
    /// The process overwrites one of its rings' indexes.
    ForgeIndex {
        node: bool,
        port: u8,
        ring: u8,
        head: bool,
        value: u32,
    },
    /// The process reads its events.
    TakeEvents { node: bool, port: u8 },
    /// The process goes to sleep on its event ring.
    Sleep { node: bool, port: u8 },
    /// The NIC polls.
    Poll { node: bool },
    /// Some of a NIC's transmitted packets arrive, some lost, some twice.
    Deliver {
        from: bool,
        count: u8,
        lose: u8,
        duplicate: u8,
    },
    /// Everything a NIC transmitted is lost.
    LoseAll { from: bool },
    /// Bytes arrive from the wire that no NIC sent.
    Inject { node: bool, bytes: Vec<u8> },
    /// A forged packet arrives: a header of any fields with a right magic, version and length.
    Forge {
        node: bool,
        header: [u8; HEADER_LEN],
        payload: Vec<u8>,
    },
    /// A NIC restarts (its processes gone with it).
    Restart { node: bool },
    /// A packet delivered earlier arrives again (an attacker re-sends a capture).
    Replay { pick: u8 },
    /// Time passes.
    Tick { micros: u32 },
    /// Both NICs run until quiet, then time moves to the next deadline.
    Run,
}

impl Action {
    fn apply(self, net: &mut Net) {
        let now = net.now;
        match self {
            Action::Open {
                node,
                port,
                tiny,
                edit,
            } => net.node(node).open(port, tiny, edit, now),
            Action::Close { node, port } => net.node(node).close(port, now),
            Action::SendMessage {
                node,
                port,
                target_port,
                size,
                length,
                high,
                buffer,
                context,
            } => net.node(node).post_send(
                port,
                &SendToken {
                    kind: SendKind::DATA,
                    priority: priority(high),
                    size: size % 16,
                    target_node: NodeId::new(u16::from(!node)),
                    target_port: PortId(target_port % 3),
                    length: u32::from(length % 5000).into(),
                    buffer: u64::from(buffer).into(),
                    context: context.into(),
                    ..SendToken::default()
                },
            ),
            Action::ProvideBuffer {
                node,
                port,
                size,
                high,
                buffer,
                tag,
            } => net.node(node).post_receive(
                port,
                &ReceiveToken {
                    kind: ReceiveKind::BUFFER,
                    priority: priority(high),
                    size: size % 16,
                    tag: tag.into(),
                    buffer: u64::from(buffer).into(),
                    ..ReceiveToken::default()
                },
            ),
            Action::Barrier {
                node,
                port,
                steps,
                timeout_us,
                context,
            } => {
                let steps: Vec<Step> = steps.iter().take(64).map(FuzzStep::step).collect();
                let node = net.node(node);
                node.post_receive(
                    port,
                    &ReceiveToken {
                        kind: ReceiveKind::BARRIER,
                        ..ReceiveToken::default()
                    },
                );
                node.write_arena(port, SCHEDULE_AT, steps.as_bytes());
                node.post_send(
                    port,
                    &SendToken {
                        kind: SendKind::BARRIER,
                        length: (steps.len() as u32).into(),
                        buffer: SCHEDULE_AT.into(),
                        context: context.into(),
                        timeout_us: timeout_us.into(),
                        ..SendToken::default()
                    },
                );
            }
            Action::RawSend { node, port, token } => {
                let token = SendToken::read_from_bytes(&token).unwrap_or_default();
                net.node(node).post_send(port, &token);
            }
            Action::RawReceive { node, port, token } => {
                let token = ReceiveToken::read_from_bytes(&token).unwrap_or_default();
                net.node(node).post_receive(port, &token);
            }
            Action::WriteArena {
                node,
                port,
                offset,
                bytes,
            } => net.node(node).write_arena(port, u64::from(offset), &bytes),
            Action::ForgeIndex {
                node,
                port,
                ring,
                head,
                value,
            } => net.node(node).forge_index(port, ring, head, value),
            Action::TakeEvents { node, port } => net.node(node).take_events(port),
            Action::Sleep { node, port } => {
                if let Some((memory, host)) = net.node(node).host(port) {
                    let _ = host.events.set_sleeping(memory, true);
                }
            }
            Action::Poll { node } => net.poll(node),
            Action::Deliver {
                from,
                count,
                lose,
                duplicate,
            } => net.deliver(from, count, lose, duplicate),
            Action::LoseAll { from } => net.node(from).nic.hal_mut().outbox.clear(),
            Action::Inject { node, bytes } => {
                net.node(node).nic.on_packet(&bytes, now);
            }
            Action::Forge {
                node,
                header,
                payload,
            } => {
                let mut header = PacketHeader::read_from_bytes(&header).unwrap_or_default();
                header.magic = PACKET_MAGIC;
                header.version = WIRE_VERSION;
                let mut out = vec![0u8; MAX_PACKET_LEN];
                let payload = &payload[..payload.len().min(shared_abi::MTU_PAYLOAD)];
                if let Some(len) = header.emit(payload, &mut out) {
                    net.node(node).nic.on_packet(&out[..len], now);
                }
            }
            Action::Restart { node } => net.restart(node),
            Action::Replay { pick } => net.replay(pick),
            Action::Tick { micros } => net.advance(micros % 10_000_000),
            Action::Run => net.run(),
        }
    }
}

fn priority(high: bool) -> Priority {
    if high { Priority::HIGH } else { Priority::LOW }
}

/// A sequence of host actions, packet arrivals, losses and timer ticks, replayed against two
/// NICs; at the end both run until quiet and every process reads its events. With
/// `NICBAR_FUZZ_TRACE` set, prints each action as it runs (to read a failing input).
pub fn nic_sequence(data: &[u8]) {
    let trace = std::env::var_os("NICBAR_FUZZ_TRACE").is_some();
    let mut u = Unstructured::new(data);
    // The first byte: whether the fabric is keyed (sessions, per-session keys) or not.
    let keyed = u.arbitrary::<bool>().unwrap_or(false);
    let mut net = Net::new(keyed.then(|| FabricKey::new([0x5a; 32])));
    for _ in 0..MAX_ACTIONS {
        if u.is_empty() {
            break;
        }
        let Ok(action) = Action::arbitrary(&mut u) else {
            break;
        };
        if trace {
            eprintln!("{action:?}");
        }
        action.apply(&mut net);
    }
    net.run();
    net.take_all_events();
}

/// Arbitrary bytes from the wire to a NIC whose ports are busy: port 0 has receive buffers, port
/// 1 waits in a barrier with node 0. The input is a list of packets, each `[len: u16 LE]
/// [micros to wait: u8] [len bytes]`.
pub fn nic_packets(data: &[u8]) {
    let mut net = Net::new(None);
    let node = net.node(true);
    for (i, size) in [3u8, 7, 12].into_iter().enumerate() {
        node.post_receive(
            0,
            &ReceiveToken {
                kind: ReceiveKind::BUFFER,
                priority: priority(i == 1),
                size,
                buffer: (i as u64 * 4096).into(),
                ..ReceiveToken::default()
            },
        );
    }
    let steps = [Step::new(StepOp::EXCHANGE, NodeId::new(0), PortId(1), 0)];
    node.post_receive(
        1,
        &ReceiveToken {
            kind: ReceiveKind::BARRIER,
            ..ReceiveToken::default()
        },
    );
    node.write_arena(1, SCHEDULE_AT, steps.as_bytes());
    node.post_send(
        1,
        &SendToken {
            kind: SendKind::BARRIER,
            length: 1.into(),
            buffer: SCHEDULE_AT.into(),
            ..SendToken::default()
        },
    );
    net.poll(true);
    let mut rest = data;
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])) % (MAX_PACKET_LEN + 1);
        let wait = rest[2];
        let len = len.min(rest.len() - 3);
        let (packet, tail) = rest[3..].split_at(len);
        rest = tail;
        net.advance(u32::from(wait) * 100);
        let now = net.now;
        let node = net.node(true);
        node.nic.on_packet(packet, now);
        node.nic.poll(now);
        node.nic.hal_mut().outbox.clear();
    }
    net.take_all_events();
}
