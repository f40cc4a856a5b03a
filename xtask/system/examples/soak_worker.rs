//! One process of `cargo xtask soak`: runs a plan of rounds drawn from a seed — each round a
//! barrier of a random group (NIC-based, host-based or fuzzy; pairwise exchange, gather-broadcast
//! or dissemination) with messages of random sizes to the next member before it — and checks
//! what it can see itself:
//!
//! - no one left a barrier before every member entered it (each process writes the round it
//!   entered into its slot of a shared counters file before entering; after leaving, every
//!   member's slot must show it);
//! - every message from the previous member of the group arrives once, intact, after the barrier
//!   (bounded wait);
//! - a barrier either completes within its timeout or fails naming a member.
//!
//! Lines on stdout: `ok barriers=B messages=M` and exit 0; `failed round K naming rank R (reason)`
//! and exit 3; `missing round K from rank R` and exit 4; `violation: ...` and exit 5. The soak
//! decides whether a failure or a missing message is allowed (its member must really be gone).
//! It exits as soon as its plan is done: the port's orderly close delivers what it posted last.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierError, BarrierOptions, Event, Group, Member, NodeId, Port, PortId, Priority,
    max_length_for_size,
};
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

const PORT: u8 = 1;
const SIZE: u8 = 9;
const TIMEOUT: Duration = Duration::from_secs(5);
const BUFFERS: u32 = 48;

struct Args {
    rank: usize,
    nodes: Vec<u16>,
    unit: u8,
    seed: u64,
    epoch: u64,
    rounds: u64,
    counters: std::path::PathBuf,
}

fn parse() -> Result<Args, String> {
    let mut values = HashMap::new();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        values.insert(flag, value);
    }
    let get = |name: &str| values.get(name).cloned().ok_or(format!("missing {name}"));
    let number = |name: &str| -> Result<u64, String> {
        get(name)?.parse().map_err(|e| format!("{name}: {e}"))
    };
    Ok(Args {
        rank: number("--rank")? as usize,
        nodes: get("--nodes")?
            .split(',')
            .map(|n| n.parse().map_err(|e| format!("--nodes: {e}")))
            .collect::<Result<_, _>>()?,
        unit: number("--unit")? as u8,
        seed: number("--seed")?,
        epoch: number("--epoch")?,
        rounds: number("--rounds")?,
        counters: get("--counters")?.into(),
    })
}

/// The plan's randomness (SplitMix64), the same in every process.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Nic,
    Host,
    Fuzzy,
}

/// One round of the plan: its group (ranks, ascending), how the barrier runs, and how many
/// messages each member sends to the next member before it.
struct Round {
    ranks: Vec<usize>,
    mode: Mode,
    algorithm: Algorithm,
    messages: Vec<u64>,
}

fn plan(seed: u64, epoch: u64, round: u64, ranks: usize) -> Round {
    let mut rng = Rng::new(seed ^ epoch.wrapping_mul(0x1_0000_0001) ^ round.wrapping_mul(0x9e37));
    let mut members: Vec<usize> = if rng.below(10) < 4 || ranks <= 2 {
        (0..ranks).collect()
    } else {
        let size = 2 + rng.below(ranks as u64 - 1) as usize;
        let mut all: Vec<usize> = (0..ranks).collect();
        for i in 0..size {
            let j = i + rng.below((ranks - i) as u64) as usize;
            all.swap(i, j);
        }
        all.truncate(size);
        all
    };
    members.sort_unstable();
    let n = members.len();
    let mode = [Mode::Nic, Mode::Host, Mode::Fuzzy][rng.below(3) as usize];
    let algorithm = match rng.below(3) {
        0 => Algorithm::PairwiseExchange,
        1 => Algorithm::GatherBroadcast {
            dimension: 1 + rng.below((n as u64 - 1).min(3)) as usize,
            root: rng.below(n as u64) as usize,
        },
        _ => Algorithm::Dissemination {
            n: 1 + rng.below((n as u64 - 1).min(3)) as usize,
        },
    };
    let messages = (0..n).map(|_| rng.below(4)).collect();
    Round {
        ranks: members,
        mode,
        algorithm,
        messages,
    }
}

fn message(epoch: u64, round: u64, sender: usize, index: u64) -> Vec<u8> {
    let max = max_length_for_size(SIZE) as u64;
    let mut rng = Rng::new(epoch ^ round << 16 ^ (sender as u64) << 40 ^ index << 56);
    let length = 24 + rng.below(max - 24) as usize;
    let mut bytes = vec![0u8; length];
    bytes[..8].copy_from_slice(&round.to_le_bytes());
    bytes[8..16].copy_from_slice(&(sender as u64).to_le_bytes());
    bytes[16..24].copy_from_slice(&index.to_le_bytes());
    for byte in bytes.iter_mut().skip(24) {
        *byte = rng.next() as u8;
    }
    bytes
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("soak_worker: {error}");
            std::process::exit(2);
        }
    };
    std::process::exit(run(&args));
}

fn say(line: &str) {
    println!("{line}");
}

fn run(args: &Args) -> i32 {
    let ranks = args.nodes.len();
    let counters = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&args.counters)
    {
        Ok(file) => file,
        Err(error) => {
            say(&format!("violation: cannot open the counters: {error}"));
            return 5;
        }
    };
    let mut port = match Port::open(args.unit, PORT) {
        Ok(port) => port,
        Err(error) => {
            say(&format!("violation: cannot open the port: {error}"));
            return 5;
        }
    };
    let members: Vec<Member> = args
        .nodes
        .iter()
        .map(|&node| Member::new(NodeId::new(node), PortId(PORT)))
        .collect();
    let length = max_length_for_size(SIZE) as usize;
    for tag in 0..BUFFERS {
        let Ok(buffer) = port.dma_alloc(length) else {
            say("violation: arena full");
            return 5;
        };
        if let Err(refused) = port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag) {
            say(&format!("violation: {}", refused.error));
            return 5;
        }
    }
    // Everyone is here: a NIC barrier waits for ports not open yet (paper §3.2).
    let world = Group::new(members.iter().copied())
        .expect("a group")
        .with_timeout(Duration::from_secs(20));
    if let Err(error) = port.barrier(&world) {
        return failed(&world, u64::MAX, &error);
    }
    // Messages that came early, by (round, sender): their indexes.
    let mut early: HashMap<(u64, usize), Vec<u64>> = HashMap::new();
    let (mut barriers, mut received) = (0u64, 0u64);
    let base = args.epoch << 32;
    for round in 0..args.rounds {
        let plan = plan(args.seed, args.epoch, round, ranks);
        let Some(position) = plan.ranks.iter().position(|&r| r == args.rank) else {
            continue;
        };
        let n = plan.ranks.len();
        let next = plan.ranks[(position + 1) % n];
        let previous_position = (position + n - 1) % n;
        let previous = plan.ranks[previous_position];
        for index in 0..plan.messages[position] {
            let bytes = message(args.epoch, round, args.rank, index);
            let mut buffer = loop {
                match port.dma_alloc(bytes.len()) {
                    Ok(buffer) => break buffer,
                    // Wait for a send to give its buffer back.
                    Err(_) => match port.receive_timeout(TIMEOUT) {
                        Ok(Some(event)) => {
                            if let Err(violation) = check(&mut port, event, args.epoch, &mut early)
                            {
                                say(&format!("violation: {violation}"));
                                return 5;
                            }
                        }
                        _ => {
                            say("violation: no send came back to free the arena");
                            return 5;
                        }
                    },
                }
            };
            buffer.copy_from_slice(&bytes);
            let member = members[next];
            if let Err(refused) = port.send(
                buffer,
                bytes.len(),
                SIZE,
                Priority::LOW,
                member.node,
                member.port,
                round,
            ) {
                say(&format!("violation: send refused: {}", refused.error));
                return 5;
            }
        }
        let entered = base + round + 1;
        let _ = counters.write_at(&entered.to_le_bytes(), 8 * args.rank as u64);
        let group = match Group::new(plan.ranks.iter().map(|&r| members[r])) {
            Ok(group) => group,
            Err(error) => {
                say(&format!("violation: group: {error:?}"));
                return 5;
            }
        };
        let options = BarrierOptions {
            algorithm: plan.algorithm,
            timeout: Some(TIMEOUT),
        };
        let result = match plan.mode {
            Mode::Nic => port.barrier_with(&group, &options),
            Mode::Host => port.host_barrier(&group, &options),
            Mode::Fuzzy => port
                .barrier_start_with(&group, &options)
                .and_then(|pending| port.barrier_wait(pending)),
        };
        if let Err(error) = result {
            return failed_in(&plan, &group, round, &error);
        }
        barriers += 1;
        for &member in &plan.ranks {
            let mut slot = [0u8; 8];
            let _ = counters.read_at(&mut slot, 8 * member as u64);
            let seen = u64::from_le_bytes(slot);
            if seen < entered {
                say(&format!(
                    "violation: rank {} left round {round} ({:?} {:?}) before rank {member} entered \
                     it (its slot shows {seen:#x}, expected {entered:#x})",
                    args.rank, plan.mode, plan.algorithm
                ));
                return 5;
            }
        }
        // The previous member's messages of this round: each once, intact.
        let want = plan.messages[previous_position];
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let got = early.get(&(round, previous)).map_or(0, Vec::len) as u64;
            if got >= want {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match port.receive_timeout(left) {
                Ok(Some(event)) => {
                    if let Err(violation) = check(&mut port, event, args.epoch, &mut early) {
                        say(&format!("violation: {violation}"));
                        return 5;
                    }
                }
                _ => {
                    say(&format!("missing round {round} from rank {previous}"));
                    return 4;
                }
            }
        }
        let indexes = early.remove(&(round, previous)).unwrap_or_default();
        let mut sorted = indexes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != indexes.len() || indexes.len() as u64 != want {
            say(&format!(
                "violation: round {round} from rank {previous}: indexes {indexes:?}, {want} sent"
            ));
            return 5;
        }
        received += want;
    }
    say(&format!("ok barriers={barriers} messages={received}"));
    0
}

/// Checks a received message (its bytes are what its sender wrote) and records it.
fn check(
    port: &mut Port,
    event: Event,
    epoch: u64,
    early: &mut HashMap<(u64, usize), Vec<u64>>,
) -> Result<(), String> {
    let Event::Received {
        buffer,
        length,
        tag,
        ..
    } = event
    else {
        // A send's buffer coming back: nothing to check.
        return Ok(());
    };
    let bytes = &buffer[..length];
    if length < 24 {
        return Err(format!("a message of {length} bytes"));
    }
    let round = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
    let sender = u64::from_le_bytes(bytes[8..16].try_into().unwrap_or_default()) as usize;
    let index = u64::from_le_bytes(bytes[16..24].try_into().unwrap_or_default());
    if bytes != message(epoch, round, sender, index) {
        return Err(format!(
            "round {round} message {index} from rank {sender} arrived corrupt"
        ));
    }
    early.entry((round, sender)).or_default().push(index);
    port.provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
        .map_err(|refused| refused.error.to_string())
}

fn failed(group: &Group, round: u64, error: &BarrierError) -> i32 {
    match error {
        BarrierError::Failed {
            waiting_for,
            reason,
            ..
        } => {
            let rank = group.rank_of(*waiting_for).unwrap_or(usize::MAX);
            say(&format!(
                "failed round {} naming rank {rank} ({reason:?})",
                round as i64
            ));
            3
        }
        other => {
            say(&format!("violation: barrier error {other}"));
            5
        }
    }
}

fn failed_in(plan: &Round, group: &Group, round: u64, error: &BarrierError) -> i32 {
    match error {
        BarrierError::Failed {
            waiting_for,
            reason,
            ..
        } => {
            // Name the rank in the world, not in the group.
            let rank = group
                .rank_of(*waiting_for)
                .and_then(|r| plan.ranks.get(r).copied())
                .unwrap_or(usize::MAX);
            say(&format!(
                "failed round {round} naming rank {rank} ({reason:?}; {:?} {:?} of ranks {:?})",
                plan.mode, plan.algorithm, plan.ranks
            ));
            3
        }
        _ => failed(group, round, error),
    }
}
