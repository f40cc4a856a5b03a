//! One process of the QEMU end-to-end check: opens a port on one NIC of a running `nicctl qemu`
//! (or `nicctl emulate`) through the user library, exchanges messages with its neighbours, and
//! runs barriers of every algorithm with the other peers.
//!
//! `cargo run -p nicbar-system --example qemu_peer -- --socket S --unit U --nodes N`
//!
//! Peer `U` opens port `--port` of unit `U`, whose node id is `U` (or `--node`: on a fabric that
//! mixes QEMU and daemon NICs, each control socket numbers its own units), and the peers form a
//! ring by node id:
//! each sends `--messages` messages to the next node and checks every byte of those the previous
//! node sends it. Then, for each algorithm, `--barriers` barriers of all `N` ports, entering at
//! staggered times. It prints one line per result, which `cargo xtask qemu` checks across the
//! peers (no peer may leave a barrier before every peer entered it):
//!
//! ```text
//! open unit=U node=N port=P generation=G
//! messages sent=M received=M bytes=B elapsed_us=T
//! barrier algorithm=NAME index=I enter_ns=E exit_ns=X
//! broadcasts=B checked
//! done
//! ```
//!
//! With `--broadcasts B`, the peers then run B NIC broadcasts, the root going round the nodes,
//! each of a length and bytes of its own, checked byte for byte at every member.
//!
//! With `--one-sided`, each peer then registers a region and tells the others its remote
//! pointer (a NIC broadcast from each node), puts a block of its own bytes into the next
//! node's region and gets it back, and fetch-and-adds on a word of node 0's region; after a
//! barrier each checks the block the previous node put and node 0 the word's sum, and prints
//! `one-sided puts=1 gets=1 adds=A checked`.
//!
//! With `--ping-pong-with P`, the peer instead measures `--round-trips` round trips of one
//! 64-byte message with node `P` (the lower node sends, the other echoes) and the lower node
//! prints `pingpong round_trips=R mean_us=M p50_us=Q min_us=L`.
//!
//! Times are `CLOCK_MONOTONIC` nanoseconds, comparable across the processes of one host. Every
//! wait is bounded; any failure exits non-zero with a message saying what and where.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use nicbar::{
    Algorithm, AtomicOp, BarrierOptions, Event, Group, NodeId, Port, PortId, Priority, Status,
};

/// Size class of the messages: buffers of 256 bytes, messages of up to 248.
const SIZE: u8 = 8;
/// Receive buffers kept provided.
const RECEIVE_BUFFERS: usize = 16;
/// How long one message or one barrier may take before the peer gives up.
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Parser, Debug)]
#[command(about = "One peer of the QEMU end-to-end check")]
struct Args {
    /// The control socket of `nicctl qemu`.
    #[arg(long)]
    socket: PathBuf,
    /// The unit this peer's port is on.
    #[arg(long)]
    unit: u8,
    /// The unit's node id [default: the unit].
    #[arg(long)]
    node: Option<u16>,
    /// How many nodes (peers) there are.
    #[arg(long)]
    nodes: u16,
    /// The port every peer opens on its NIC.
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// Messages each peer sends to the next.
    #[arg(long, default_value_t = 50)]
    messages: u32,
    /// Barriers per algorithm.
    #[arg(long, default_value_t = 40)]
    barriers: u32,
    /// NIC broadcasts after the barriers, the root going round the nodes.
    #[arg(long, default_value_t = 0)]
    broadcasts: u32,
    /// Puts, gets and fetch-and-adds between the nodes after the broadcasts.
    #[arg(long)]
    one_sided: bool,
    /// Measure round trips with this node instead of the ring and the barriers.
    #[arg(long)]
    ping_pong_with: Option<u16>,
    /// Round trips of `--ping-pong-with`.
    #[arg(long, default_value_t = 1000)]
    round_trips: u32,
}

fn main() {
    let args = Args::parse();
    if let Err(error) = run(&args) {
        eprintln!("qemu_peer {}: error: {error}", args.unit);
        std::process::exit(1);
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

impl Args {
    /// The node id this peer's port is on.
    fn node(&self) -> u16 {
        self.node.unwrap_or(u16::from(self.unit))
    }
}

fn run(args: &Args) -> Result<()> {
    if args.nodes < 2 || args.node() >= args.nodes {
        return Err(format!(
            "node {} is not one of {} nodes (2 at least)",
            args.node(),
            args.nodes
        )
        .into());
    }
    let mut port = Port::open_at(&args.socket, args.unit, args.port)?;
    println!(
        "open unit={} node={} port={} generation={}",
        args.unit,
        port.node_id().get(),
        args.port,
        port.generation().get()
    );
    if port.node_id().get() != args.node() {
        return Err(format!(
            "unit {} is node {}, expected node {}",
            args.unit,
            port.node_id().get(),
            args.node()
        )
        .into());
    }
    for tag in 0..RECEIVE_BUFFERS {
        let buffer = port.dma_alloc(256)?;
        port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag as u32)
            .map_err(|refused| refused.error)?;
    }
    if let Some(other) = args.ping_pong_with {
        return ping_pong(port, args, other);
    }
    let group =
        Group::from_endpoints((0..args.nodes).map(|node| (NodeId::new(node), PortId(args.port))))?;
    // Every peer's port is open and has buffers once this first barrier completes: barrier
    // packets to a port not open yet are sent again by the NIC, messages would be refused.
    let options = BarrierOptions::for_members(group.len()).with_timeout(Duration::from_secs(60));
    port.barrier_with(&group, &options)
        .map_err(|error| format!("the starting barrier: {error}"))?;

    exchange_messages(&mut port, args)?;

    let nodes = usize::from(args.nodes);
    let mut algorithms = vec![
        ("pairwise-exchange", Algorithm::PairwiseExchange),
        (
            "gather-broadcast-2",
            Algorithm::GatherBroadcast {
                dimension: 2.min(nodes - 1),
                root: 0,
            },
        ),
        ("dissemination-1", Algorithm::Dissemination { n: 1 }),
    ];
    if nodes > 2 {
        algorithms.push(("dissemination-2", Algorithm::Dissemination { n: 2 }));
    }
    let rank = usize::from(args.node());
    for (name, algorithm) in algorithms {
        let options = BarrierOptions::for_members(nodes)
            .with_algorithm(algorithm)
            .with_timeout(STEP_TIMEOUT);
        for index in 0..args.barriers {
            // Stagger the entries: on each barrier some peer comes late, by up to 4 ms, so that
            // a barrier letting anyone out early would show in the times.
            let late = (index as usize * 7 + rank * 3) % (nodes + 2);
            if late < 2 {
                std::thread::sleep(Duration::from_millis(2 * (late as u64 + 1)));
            }
            let enter = monotonic_ns();
            port.barrier_with(&group, &options)
                .map_err(|error| format!("{name} barrier {index}: {error}"))?;
            let exit = monotonic_ns();
            println!("barrier algorithm={name} index={index} enter_ns={enter} exit_ns={exit}");
        }
    }
    for index in 0..args.broadcasts {
        let root = index as usize % nodes;
        let expected = broadcast_bytes(root, index);
        let mut data = if root == rank {
            expected.clone()
        } else {
            vec![0; nicbar::NIC_BROADCAST_MAX]
        };
        let length = port
            .nic_broadcast(&group, root, &mut data)
            .map_err(|error| format!("broadcast {index} from node {root}: {error}"))?;
        if length != expected.len() || data[..length] != expected[..] {
            return Err(format!(
                "broadcast {index} from node {root}: {length} bytes {:?}, expected {:?}",
                &data[..length.min(data.len())],
                expected
            )
            .into());
        }
    }
    if args.broadcasts > 0 {
        println!("broadcasts={} checked", args.broadcasts);
    }
    if args.one_sided {
        one_sided(&mut port, &group, &options, args)?;
    }
    // The last barrier may have completed here before its last packets reached the others; one
    // more keeps every port open until everyone is through.
    port.barrier_with(&group, &options)
        .map_err(|error| format!("the closing barrier: {error}"))?;
    port.close()?;
    println!("done");
    Ok(())
}

/// Bytes of the block each node puts into the next node's region.
const BLOCK: usize = 40_000;
/// Fetch-and-adds each node applies to node 0's word.
const ADDS: u64 = 25;

/// The byte at `index` of the block node `node` puts.
fn block_byte(node: usize, index: usize) -> u8 {
    (node * 151 + index * 7 + (index >> 9)) as u8
}

/// The next `OperationDone` of `port`, its status and value; messages and other events fail.
fn operation_done(port: &mut Port, what: &str) -> Result<(Status, u64)> {
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("{what}: no completion within {STEP_TIMEOUT:?}").into());
        }
        match port.receive_timeout(left)? {
            Some(Event::OperationDone { status, value, .. }) => return Ok((status, value)),
            Some(other) => return Err(format!("{what}: unexpected event {other:?}").into()),
            None => {}
        }
    }
}

/// The one-sided step (`--one-sided`): remote pointers shared by NIC broadcasts, a put and a
/// get with the next node, fetch-and-adds on node 0's word, each result checked.
fn one_sided(port: &mut Port, group: &Group, options: &BarrierOptions, args: &Args) -> Result<()> {
    let (nodes, me) = (usize::from(args.nodes), usize::from(args.node()));
    let (next, previous) = ((me + 1) % nodes, (me + nodes - 1) % nodes);
    // The block the previous node puts, then the word node 0's counts sum into.
    let target = port.register_memory(BLOCK + 8)?;
    let local = port.register_memory(2 * BLOCK)?;
    port.allow_remote_memory_access()?;
    let mine: Vec<u8> = (0..BLOCK).map(|i| block_byte(me, i)).collect();
    local.bytes().write(0, &mine);
    let mut pointers = vec![0u64; nodes];
    for (root, pointer) in pointers.iter_mut().enumerate() {
        let mut data = if root == me {
            target.remote(0).to_le_bytes().to_vec()
        } else {
            vec![0; nicbar::NIC_BROADCAST_MAX]
        };
        let length = port
            .nic_broadcast(group, root, &mut data)
            .map_err(|error| format!("node {root}'s remote pointer: {error}"))?;
        let bytes: [u8; 8] = data
            .get(..length)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or_else(|| format!("node {root}'s remote pointer came as {length} bytes"))?;
        *pointer = u64::from_le_bytes(bytes);
    }
    let at = |node: usize| NodeId::new(node as u16);
    let remote_port = PortId(args.port);
    port.put(&local, 0, pointers[next], BLOCK, at(next), remote_port, 1)?;
    match operation_done(port, "the put")? {
        (Status::SUCCESS, _) => {}
        (status, _) => return Err(format!("the put to node {next} ended {status:?}").into()),
    }
    port.get(
        pointers[next],
        &local,
        BLOCK,
        BLOCK,
        at(next),
        remote_port,
        2,
    )?;
    match operation_done(port, "the get")? {
        (Status::SUCCESS, _) => {}
        (status, _) => return Err(format!("the get from node {next} ended {status:?}").into()),
    }
    if local.bytes().to_vec(BLOCK, BLOCK) != mine {
        return Err(format!("the block got back from node {next} is not the one put").into());
    }
    // The word at node 0 is 8-aligned: the block is a multiple of 8 bytes.
    let word = pointers[0] + BLOCK as u64;
    for add in 0..ADDS {
        port.atomic(AtomicOp::FETCH_ADD, word, 1, 0, at(0), remote_port, 3)?;
        match operation_done(port, "a fetch-and-add")? {
            (Status::SUCCESS, _) => {}
            (status, _) => return Err(format!("fetch-and-add {add} ended {status:?}").into()),
        }
    }
    port.barrier_with(group, options)
        .map_err(|error| format!("the barrier after the one-sided step: {error}"))?;
    let landed = target.bytes().to_vec(0, BLOCK);
    if (0..BLOCK).any(|i| landed[i] != block_byte(previous, i)) {
        return Err(format!("the block node {previous} put did not land intact").into());
    }
    if me == 0 {
        let sum = u64::from_le_bytes(target.bytes().to_vec(BLOCK, 8).try_into().unwrap_or([0; 8]));
        if sum != ADDS * nodes as u64 {
            return Err(format!("the word holds {sum}, not {}", ADDS * nodes as u64).into());
        }
    }
    println!("one-sided puts=1 gets=1 adds={ADDS} checked");
    Ok(())
}

/// The bytes broadcast `index` from node `root` carries: 1 to `NIC_BROADCAST_MAX` of them.
fn broadcast_bytes(root: usize, index: u32) -> Vec<u8> {
    let length = 1 + (index as usize * 13 + root) % nicbar::NIC_BROADCAST_MAX;
    (0..length)
        .map(|k| (root * 17 + index as usize * 5 + k) as u8)
        .collect()
}

/// Round trips of one 64-byte message with node `other`: the lower node sends and times, the
/// other echoes what it receives. Both ports meet in a barrier before and after.
fn ping_pong(mut port: Port, args: &Args, other: u16) -> Result<()> {
    const LENGTH: usize = 64;
    let me = args.node();
    // Both sides list the members in the same order: lower node first.
    let group = Group::from_endpoints([
        (NodeId::new(me.min(other)), PortId(args.port)),
        (NodeId::new(me.max(other)), PortId(args.port)),
    ])?
    .with_timeout(Duration::from_secs(60));
    port.barrier(&group)
        .map_err(|error| format!("the ping-pong's starting barrier: {error}"))?;
    let initiator = me < other;
    let mut spare = Vec::new();
    let mut times = Vec::with_capacity(args.round_trips as usize);
    for index in 0..args.round_trips {
        let started = Instant::now();
        if initiator {
            let payload = message(me, index);
            send_one(
                &mut port,
                &mut spare,
                &payload[..LENGTH.min(payload.len())],
                other,
                index,
            )?;
        }
        // Wait for the message (and take the SENT of what went out).
        let received = loop {
            let event = port
                .receive_timeout(STEP_TIMEOUT)?
                .ok_or_else(|| format!("round trip {index}: nothing within {STEP_TIMEOUT:?}"))?;
            match event {
                Event::Sent { buffer, status, .. } if status == Status::SUCCESS => {
                    spare.push(buffer);
                }
                Event::Received {
                    buffer,
                    length,
                    tag,
                    sender_node,
                    status,
                    ..
                } if status == Status::SUCCESS && sender_node.get() == other => {
                    let bytes = buffer[..length].to_vec();
                    port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                        .map_err(|refused| refused.error)?;
                    break bytes;
                }
                other => return Err(format!("round trip {index}: unexpected {other:?}").into()),
            }
        };
        if initiator {
            times.push(started.elapsed());
        } else {
            send_one(&mut port, &mut spare, &received, other, index)?;
        }
    }
    port.barrier(&group)
        .map_err(|error| format!("the ping-pong's closing barrier: {error}"))?;
    if initiator {
        times.sort_unstable();
        let total: Duration = times.iter().sum();
        let count = times.len().max(1) as u32;
        println!(
            "pingpong round_trips={} mean_us={:.1} p50_us={:.1} min_us={:.1}",
            times.len(),
            (total / count).as_secs_f64() * 1e6,
            times
                .get(times.len() / 2)
                .map_or(0.0, |t| t.as_secs_f64() * 1e6),
            times.first().map_or(0.0, |t| t.as_secs_f64() * 1e6),
        );
    }
    port.close()?;
    println!("done");
    Ok(())
}

/// Sends `payload` to port `--port` of node `to`, in a spare buffer if there is one.
fn send_one(
    port: &mut Port,
    spare: &mut Vec<nicbar::DmaBuffer>,
    payload: &[u8],
    to: u16,
    context: u32,
) -> Result<()> {
    let mut buffer = match spare.pop() {
        Some(buffer) => buffer,
        None => port.dma_alloc(256)?,
    };
    buffer[..payload.len()].copy_from_slice(payload);
    let port_id = port.port_id();
    port.send(
        buffer,
        payload.len(),
        SIZE,
        Priority::LOW,
        NodeId::new(to),
        port_id,
        u64::from(context),
    )
    .map_err(|refused| format!("round trip {context}: {}", refused.error))?;
    Ok(())
}

/// The bytes of message `index` from `sender`.
fn message(sender: u16, index: u32) -> Vec<u8> {
    let length = 16 + (index as usize * 37) % 232;
    (0..length)
        .map(|k| (usize::from(sender) * 31 + index as usize * 7 + k) as u8)
        .collect()
}

/// Sends `args.messages` messages to the next node and receives as many from the previous one,
/// checking each byte, sender and status: message `i` goes out once message `i - 1` was sent and
/// received (the previous node may be one message ahead, so arrivals are counted on their own).
fn exchange_messages(port: &mut Port, args: &Args) -> Result<()> {
    let next = NodeId::new((args.node() + 1) % args.nodes);
    let previous = (args.node() + args.nodes - 1) % args.nodes;
    let started = Instant::now();
    let mut bytes = 0;
    let mut spare = Vec::new();
    let mut received = 0;
    for index in 0..args.messages {
        let payload = message(args.node(), index);
        let mut buffer = match spare.pop() {
            Some(buffer) => buffer,
            None => port.dma_alloc(256)?,
        };
        buffer[..payload.len()].copy_from_slice(&payload);
        port.send(
            buffer,
            payload.len(),
            SIZE,
            Priority::LOW,
            next,
            PortId(args.port),
            u64::from(index),
        )
        .map_err(|refused| format!("message {index}: {}", refused.error))?;
        let mut sent = false;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while !sent || received <= index {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(event) = port.receive_timeout(left)? else {
                return Err(format!(
                    "message {index}: no {} within {STEP_TIMEOUT:?}",
                    if sent {
                        "message from the previous node"
                    } else {
                        "SENT event"
                    }
                )
                .into());
            };
            match event {
                Event::Sent {
                    buffer,
                    context,
                    status,
                    ..
                } => {
                    if status != Status::SUCCESS || context != u64::from(index) {
                        return Err(
                            format!("message {index}: SENT {status:?} for {context}").into()
                        );
                    }
                    spare.push(buffer);
                    sent = true;
                }
                Event::Received {
                    buffer,
                    length,
                    tag,
                    sender_node,
                    status,
                    ..
                } => {
                    let expected = message(previous, received);
                    if status != Status::SUCCESS
                        || sender_node.get() != previous
                        || buffer[..length] != expected[..]
                    {
                        return Err(format!(
                            "message {received} in: {length} bytes from node {} ({status:?}), \
                             expected {} bytes from node {previous}",
                            sender_node.get(),
                            expected.len()
                        )
                        .into());
                    }
                    bytes += length;
                    received += 1;
                    port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
                        .map_err(|refused| refused.error)?;
                }
                other => return Err(format!("message {index}: unexpected {other:?}").into()),
            }
        }
    }
    println!(
        "messages sent={0} received={0} bytes={bytes} elapsed_us={1}",
        args.messages,
        started.elapsed().as_micros()
    );
    Ok(())
}

fn monotonic_ns() -> i128 {
    // CLOCK_MONOTONIC cannot fail on Linux; a zero would make the barrier check fail loudly.
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |now| {
        i128::from(now.tv_sec()) * 1_000_000_000 + i128::from(now.tv_nsec())
    })
}
