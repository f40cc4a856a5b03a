//! The schedules are checked twice: statically (every send has its receive, nothing names
//! the rank itself, the formulas hold) and by running every rank's schedule in a
//! schedule-level model of the NIC under seeded random interleavings.

extern crate std;

use std::collections::{HashMap, HashSet, VecDeque};
use std::format;
use std::rc::Rc;
use std::string::String;
use std::vec;
use std::vec::Vec;

use proptest::prelude::*;
use rand_core::{RngCore, SeedableRng};
use rand_xoshiro::SplitMix64;

use super::*;
use shared_abi::ids::{NodeId, PORTS_PER_NIC, PortId};

/// A group of `count` distinct members, several ports per node; `salt` varies which.
fn group(count: usize, salt: usize) -> Vec<Member> {
    const KEYS: usize = (u16::MAX as usize + 1) * PORTS_PER_NIC;
    (0..count)
        .map(|i| {
            // An odd multiplier is a bijection modulo a power of two: the keys are distinct.
            let key = (i * 7919 + salt) % KEYS;
            Member::new(
                NodeId::new((key / PORTS_PER_NIC) as u16),
                PortId((key % PORTS_PER_NIC) as u8),
            )
        })
        .collect()
}

fn compile_all(algorithm: Algorithm, members: &[Member]) -> Result<Vec<Vec<Step>>, ScheduleError> {
    let capacity = steps_needed(algorithm, members.len())?;
    (0..members.len())
        .map(|rank| {
            let mut out = vec![Step::default(); capacity];
            let len = compile(algorithm, members, rank, &mut out)?;
            out.truncate(len);
            Ok(out)
        })
        .collect()
}

fn is_send(op: StepOp) -> bool {
    op == StepOp::SEND || op == StepOp::EXCHANGE
}

fn is_receive(op: StepOp) -> bool {
    op == StepOp::RECV || op == StepOp::EXCHANGE
}

/// What every schedule of every algorithm must satisfy, whatever the interleaving.
fn check_static(algorithm: Algorithm, members: &[Member], schedules: &[Vec<Step>]) {
    let rank_of: HashMap<Member, usize> = members
        .iter()
        .enumerate()
        .map(|(rank, m)| (*m, rank))
        .collect();
    let longest = steps_needed(algorithm, members.len()).unwrap();
    let rounds = rounds_needed(algorithm, members.len()).unwrap();
    assert_eq!(
        schedules.iter().map(Vec::len).max(),
        Some(longest),
        "{algorithm:?}"
    );
    let mut sends = HashSet::new();
    let mut receives = HashSet::new();
    for (rank, schedule) in schedules.iter().enumerate() {
        assert!(
            !schedule.is_empty(),
            "{algorithm:?} rank {rank}: empty schedule"
        );
        assert!(schedule.len() <= MAX_SCHEDULE_STEPS);
        for step in schedule {
            assert!(step.is_valid(), "{algorithm:?} rank {rank}: {step:?}");
            assert_eq!((step.combine.0, step.reserved1.get()), (0, 0));
            assert!(usize::from(step.round) < rounds, "{algorithm:?}: {step:?}");
            let peer = rank_of[&Member::new(step.node, step.port)];
            assert_ne!(peer, rank, "{algorithm:?}: rank {rank} names itself");
            // One packet per (sender, receiver, round) and barrier, each way.
            if is_send(step.op) {
                assert!(
                    sends.insert((rank, peer, step.round)),
                    "{algorithm:?}: {rank} {step:?}"
                );
            }
            if is_receive(step.op) {
                assert!(
                    receives.insert((peer, rank, step.round)),
                    "{algorithm:?}: {rank} {step:?}"
                );
            }
        }
    }
    assert_eq!(
        sends, receives,
        "{algorithm:?}: sends and receives do not pair up"
    );
}

/// SplitMix64: a seeded source of interleavings.
struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64::seed_from_u64(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }
}

/// A set with O(1) insert, remove and uniform pick.
struct PickSet<T> {
    items: Vec<T>,
    position: HashMap<T, usize>,
}

impl<T: Copy + Eq + std::hash::Hash> PickSet<T> {
    fn new() -> Self {
        Self {
            items: Vec::new(),
            position: HashMap::new(),
        }
    }

    fn set(&mut self, item: T, present: bool) {
        match (present, self.position.get(&item).copied()) {
            (true, None) => {
                self.position.insert(item, self.items.len());
                self.items.push(item);
            }
            (false, Some(index)) => {
                self.items.swap_remove(index);
                self.position.remove(&item);
                if let Some(moved) = self.items.get(index) {
                    self.position.insert(*moved, index);
                }
            }
            _ => {}
        }
    }

    fn pick(&self, rng: &mut Rng) -> T {
        self.items[rng.below(self.items.len())]
    }
}

/// A record cell: (receiver, sender, round).
type RecordKey = (usize, usize, u8);

/// A packet: its round and the sender's vector clock when it was sent.
struct Packet {
    round: u8,
    clock: Rc<[u32]>,
}

struct RankState {
    /// Barriers completed.
    completed: usize,
    in_barrier: bool,
    /// Index of the current step.
    index: usize,
    /// The send half of the current EXCHANGE went out.
    sent_current: bool,
    /// Vector clock over barrier entries: `clock[i]` is how many barriers rank `i` is known
    /// (by happens-before) to have entered.
    clock: Vec<u32>,
    snapshot: Option<Rc<[u32]>>,
}

/// What a run saw, for the coverage checks.
#[derive(Default, Debug)]
struct Outcome {
    /// Most packets one (receiver, sender, round) record ever held.
    most_pending: usize,
    /// A rank entered barrier k+1 while another had not completed barrier k.
    entered_ahead: bool,
}

/// Every rank's schedule run as the NIC runs it, `barriers` times back to back. Packets travel
/// FIFO per (sender, receiver) (one reliable connection) and are delivered at random times
/// into the receiver's record per (sender, round); a RECV consumes the oldest. The scheduler
/// picks deliveries and rank steps at random from `seed`, with some ranks favoured so that they
/// run ahead into the next barrier.
struct Simulation<'a> {
    schedules: &'a [Vec<Step>],
    peers: Vec<Vec<usize>>,
    barriers: usize,
    ranks: Vec<RankState>,
    channels: HashMap<(usize, usize), VecDeque<Packet>>,
    busy_channels: PickSet<(usize, usize)>,
    records: HashMap<RecordKey, VecDeque<Rc<[u32]>>>,
    enabled: PickSet<usize>,
    priority: Vec<u64>,
    outcome: Outcome,
}

impl<'a> Simulation<'a> {
    fn new(members: &[Member], schedules: &'a [Vec<Step>], barriers: usize, seed: u64) -> Self {
        let rank_of: HashMap<Member, usize> = members
            .iter()
            .enumerate()
            .map(|(rank, m)| (*m, rank))
            .collect();
        let peers = schedules
            .iter()
            .map(|s| {
                s.iter()
                    .map(|step| rank_of[&Member::new(step.node, step.port)])
                    .collect()
            })
            .collect();
        let count = members.len();
        let mut rng = Rng::new(seed ^ 0x5eed);
        Self {
            schedules,
            peers,
            barriers,
            ranks: (0..count)
                .map(|_| RankState {
                    completed: 0,
                    in_barrier: false,
                    index: 0,
                    sent_current: false,
                    clock: vec![0; count],
                    snapshot: None,
                })
                .collect(),
            channels: HashMap::new(),
            busy_channels: PickSet::new(),
            records: HashMap::new(),
            enabled: PickSet::new(),
            priority: (0..count).map(|_| rng.next()).collect(),
            outcome: Outcome::default(),
        }
    }

    fn can_step(&self, rank: usize) -> bool {
        let state = &self.ranks[rank];
        if !state.in_barrier {
            return state.completed < self.barriers;
        }
        let step = self.schedules[rank][state.index];
        if step.op == StepOp::SEND || (step.op == StepOp::EXCHANGE && !state.sent_current) {
            return true;
        }
        let peer = self.peers[rank][state.index];
        self.records
            .get(&(rank, peer, step.round))
            .is_some_and(|queue| !queue.is_empty())
    }

    fn refresh(&mut self, rank: usize) {
        let can = self.can_step(rank);
        self.enabled.set(rank, can);
    }

    fn step_rank(&mut self, rank: usize) -> Result<(), String> {
        if !self.ranks[rank].in_barrier {
            let entering = self.ranks[rank].completed;
            if self.ranks.iter().any(|other| other.completed < entering) {
                self.outcome.entered_ahead = true;
            }
            let state = &mut self.ranks[rank];
            state.in_barrier = true;
            state.index = 0;
            state.clock[rank] += 1;
            state.snapshot = None;
            self.refresh(rank);
            return Ok(());
        }
        let index = self.ranks[rank].index;
        let step = self.schedules[rank][index];
        let peer = self.peers[rank][index];
        let sends = step.op == StepOp::SEND
            || (step.op == StepOp::EXCHANGE && !self.ranks[rank].sent_current);
        if sends {
            let state = &mut self.ranks[rank];
            let clock = state
                .snapshot
                .get_or_insert_with(|| Rc::from(state.clock.as_slice()))
                .clone();
            self.channels
                .entry((rank, peer))
                .or_default()
                .push_back(Packet {
                    round: step.round,
                    clock,
                });
            self.busy_channels.set((rank, peer), true);
            if step.op == StepOp::SEND {
                state.index += 1;
            } else {
                state.sent_current = true;
            }
        } else {
            let clock = self
                .records
                .get_mut(&(rank, peer, step.round))
                .and_then(VecDeque::pop_front)
                .ok_or_else(|| format!("rank {rank} stepped without its packet"))?;
            let state = &mut self.ranks[rank];
            for (mine, theirs) in state.clock.iter_mut().zip(clock.iter()) {
                *mine = (*mine).max(*theirs);
            }
            state.snapshot = None;
            state.index += 1;
            state.sent_current = false;
        }
        let state = &mut self.ranks[rank];
        if state.index == self.schedules[rank].len() {
            // The barrier property: completing barrier k follows every rank's entry to it.
            let barrier = state.completed + 1;
            if let Some(missing) = state.clock.iter().position(|&c| (c as usize) < barrier) {
                return Err(format!(
                    "rank {rank} completed barrier {barrier} without knowing that rank \
                     {missing} had entered it"
                ));
            }
            state.completed += 1;
            state.in_barrier = false;
        }
        self.refresh(rank);
        Ok(())
    }

    fn deliver(&mut self, channel: (usize, usize)) -> Result<(), String> {
        let (sender, receiver) = channel;
        let queue = self.channels.get_mut(&channel).expect("busy channel");
        let packet = queue.pop_front().expect("busy channel has a packet");
        let now_empty = queue.is_empty();
        self.busy_channels.set(channel, !now_empty);
        let record = self
            .records
            .entry((receiver, sender, packet.round))
            .or_default();
        record.push_back(packet.clock);
        let pending = record.len();
        self.outcome.most_pending = self.outcome.most_pending.max(pending);
        if pending > 2 {
            return Err(format!(
                "rank {receiver} has {pending} packets of round {} from rank {sender} \
                 waiting: the record holds two",
                packet.round
            ));
        }
        self.refresh(receiver);
        Ok(())
    }

    fn run(mut self, seed: u64) -> Result<Outcome, String> {
        let mut rng = Rng::new(seed);
        // How eagerly the network delivers, and how strongly the favoured ranks run ahead.
        let delivery_percent = [10, 50, 90][rng.below(3)];
        let favour_percent = [0, 50, 95][rng.below(3)];
        for rank in 0..self.ranks.len() {
            self.refresh(rank);
        }
        let steps: usize = self.schedules.iter().map(Vec::len).sum();
        // Each step is at most three actions (an EXCHANGE's send, delivery and receive), and each
        // barrier one more per rank to enter it: past that, something is spinning.
        let bound = (3 * steps + self.ranks.len()) * self.barriers + 1;
        for _ in 0..bound {
            let busy = !self.busy_channels.items.is_empty();
            let idle = self.enabled.items.is_empty();
            if busy && (idle || rng.below(100) < delivery_percent) {
                let channel = self.busy_channels.pick(&mut rng);
                self.deliver(channel)?;
            } else if !idle {
                let mut rank = self.enabled.pick(&mut rng);
                if rng.below(100) < favour_percent {
                    for _ in 0..3 {
                        let other = self.enabled.pick(&mut rng);
                        if self.priority[other] > self.priority[rank] {
                            rank = other;
                        }
                    }
                }
                self.step_rank(rank)?;
            } else {
                break;
            }
        }
        if !self.enabled.items.is_empty() || !self.busy_channels.items.is_empty() {
            return Err(String::from("the drive loop bound was reached: livelock"));
        }
        for (rank, state) in self.ranks.iter().enumerate() {
            if state.completed < self.barriers {
                let step = self.schedules[rank].get(state.index);
                return Err(format!(
                    "deadlock: rank {rank} stuck in barrier {} at step {} {step:?}",
                    state.completed + 1,
                    state.index
                ));
            }
        }
        if let Some(((receiver, sender, round), _)) =
            self.records.iter().find(|(_, queue)| !queue.is_empty())
        {
            return Err(format!(
                "rank {receiver} was left a packet of round {round} from rank {sender}"
            ));
        }
        Ok(self.outcome)
    }
}

fn simulate(
    members: &[Member],
    schedules: &[Vec<Step>],
    barriers: usize,
    seed: u64,
) -> Result<Outcome, String> {
    Simulation::new(members, schedules, barriers, seed).run(seed)
}

/// Compiles every rank, checks the schedules statically and runs them under `seeds`.
fn check(algorithm: Algorithm, members: &[Member], barriers: usize, seeds: &[u64]) -> Outcome {
    let schedules = compile_all(algorithm, members)
        .unwrap_or_else(|e| panic!("{algorithm:?} for {}: {e}", members.len()));
    check_static(algorithm, members, &schedules);
    let mut seen = Outcome::default();
    for &seed in seeds {
        let outcome = simulate(members, &schedules, barriers, seed).unwrap_or_else(|e| {
            panic!("{algorithm:?}, {} members, seed {seed}: {e}", members.len())
        });
        seen.most_pending = seen.most_pending.max(outcome.most_pending);
        seen.entered_ahead |= outcome.entered_ahead;
    }
    seen
}

fn ceil_log(members: usize, base: usize) -> usize {
    (0..)
        .find(|&r| base.checked_pow(r).is_none_or(|p| p >= members))
        .unwrap() as usize
}

/// Interleavings per configuration of the exhaustive sweeps.
const SEEDS: [u64; 6] = [1, 2, 3, 4, 5, 6];

#[test]
fn pairwise_exchange_small_groups() {
    for count in 2..=70 {
        let members = group(count, count);
        check(Algorithm::PairwiseExchange, &members, 4, &SEEDS);
    }
}

#[test]
fn dissemination_small_groups() {
    for count in 2..=70 {
        let members = group(count, count * 3);
        for n in 1..=4.min(count - 1) {
            check(Algorithm::Dissemination { n }, &members, 4, &SEEDS);
        }
    }
}

#[test]
fn gather_broadcast_every_dimension_and_root() {
    for count in 2..=16 {
        let members = group(count, count * 5);
        for dimension in 1..count {
            for root in 0..count {
                let algorithm = Algorithm::GatherBroadcast { dimension, root };
                check(
                    algorithm,
                    &members,
                    3,
                    &[dimension as u64, 100 + root as u64],
                );
            }
        }
    }
}

#[test]
fn a_thousand_and_twenty_four_members() {
    let members = group(1024, 12345);
    for algorithm in [
        Algorithm::PairwiseExchange,
        Algorithm::GatherBroadcast {
            dimension: 2,
            root: 517,
        },
        Algorithm::GatherBroadcast {
            dimension: 63,
            root: 1000,
        },
        Algorithm::Dissemination { n: 1 },
        Algorithm::Dissemination { n: 4 },
    ] {
        check(algorithm, &members, 2, &[7]);
    }
    // The widest tree that fits: the root's 2·64 steps; 64 children at relative rank 1 would
    // need 130.
    assert_eq!(
        steps_needed(
            Algorithm::GatherBroadcast {
                dimension: 64,
                root: 0
            },
            1024
        ),
        Ok(130)
    );
    assert_eq!(
        compile_all(
            Algorithm::GatherBroadcast {
                dimension: 64,
                root: 0
            },
            &members
        )
        .unwrap_err(),
        ScheduleError::TooManySteps { steps: 130 }
    );
}

#[test]
fn consecutive_barriers_use_the_second_slot_and_never_a_third() {
    // The runs above fail on a third pending packet; here, that the second one (a fast
    // rank's packet for the next barrier) and running ahead actually happen.
    let mut seen = Outcome::default();
    for algorithm in [
        Algorithm::PairwiseExchange,
        Algorithm::GatherBroadcast {
            dimension: 2,
            root: 3,
        },
        Algorithm::Dissemination { n: 2 },
    ] {
        let members = group(13, 1);
        let seeds: Vec<u64> = (0..40).collect();
        let outcome = check(algorithm, &members, 6, &seeds);
        assert!(outcome.entered_ahead, "{algorithm:?}: no rank ran ahead");
        seen.most_pending = seen.most_pending.max(outcome.most_pending);
    }
    assert_eq!(seen.most_pending, 2);
}

#[test]
fn pairwise_exchange_counts() {
    for count in (2..=70).chain([1024, 1025]) {
        let members = group(count, 0);
        let schedules = compile_all(Algorithm::PairwiseExchange, &members).unwrap();
        let power = 1 << count.ilog2();
        let exchanges = count.ilog2() as usize;
        let fixup = if power == count { 0 } else { 2 };
        assert_eq!(
            rounds_needed(Algorithm::PairwiseExchange, count),
            Ok(exchanges + fixup)
        );
        for (rank, schedule) in schedules.iter().enumerate() {
            let count_of = |op| schedule.iter().filter(|s| s.op == op).count();
            if rank < power {
                assert_eq!(count_of(StepOp::EXCHANGE), exchanges);
                let extra = usize::from(rank < count - power);
                assert_eq!(
                    (count_of(StepOp::RECV), count_of(StepOp::SEND)),
                    (extra, extra)
                );
            } else {
                assert_eq!(
                    schedule.iter().map(|s| s.op).collect::<Vec<_>>(),
                    [StepOp::SEND, StepOp::RECV]
                );
            }
        }
    }
}

#[test]
fn dissemination_counts_and_peers() {
    for count in (2..=70).chain([1024]) {
        let members = group(count, 0);
        for n in 1..=4.min(count - 1) {
            let algorithm = Algorithm::Dissemination { n };
            let schedules = compile_all(algorithm, &members).unwrap();
            let rounds = ceil_log(count, n + 1);
            assert_eq!(rounds_needed(algorithm, count), Ok(rounds));
            for (rank, schedule) in schedules.iter().enumerate() {
                let rank_of = |s: &Step| {
                    members
                        .iter()
                        .position(|m| m.node == s.node && m.port == s.port)
                        .unwrap()
                };
                for round in 0..rounds {
                    // Equations 1-2 with a set: the offsets that are distinct and non-zero.
                    let offsets: HashSet<usize> = (1..=n)
                        .map(|j| j * (n + 1).pow(round as u32) % count)
                        .filter(|&o| o != 0)
                        .collect();
                    let of_round: Vec<&Step> = schedule
                        .iter()
                        .filter(|s| usize::from(s.round) == round)
                        .collect();
                    let sent: Vec<usize> = of_round
                        .iter()
                        .filter(|s| s.op == StepOp::SEND)
                        .map(|s| rank_of(s))
                        .collect();
                    let received: Vec<usize> = of_round
                        .iter()
                        .filter(|s| s.op == StepOp::RECV)
                        .map(|s| rank_of(s))
                        .collect();
                    let expect_sent: HashSet<usize> =
                        offsets.iter().map(|o| (rank + o) % count).collect();
                    let expect_received: HashSet<usize> =
                        offsets.iter().map(|o| (rank + count - o) % count).collect();
                    assert_eq!(sent.len(), offsets.len());
                    assert_eq!(sent.iter().copied().collect::<HashSet<_>>(), expect_sent);
                    assert_eq!(received.len(), offsets.len());
                    assert_eq!(
                        received.iter().copied().collect::<HashSet<_>>(),
                        expect_received
                    );
                    // All of a round's sends come before its receives, rounds in order.
                    assert!(of_round.iter().map(|s| s.op).is_sorted_by_key(|op| op.0));
                    if n == 1 {
                        assert_eq!(sent.len(), 1);
                    }
                }
                assert!(schedule.is_sorted_by_key(|s| s.round));
            }
        }
    }
}

#[test]
fn gather_broadcast_counts_and_tree() {
    for count in 2..=40 {
        let members = group(count, 0);
        for dimension in 1..count {
            let root = count / 3;
            let algorithm = Algorithm::GatherBroadcast { dimension, root };
            let Ok(schedules) = compile_all(algorithm, &members) else {
                assert!(dimension > 63);
                continue;
            };
            assert_eq!(rounds_needed(algorithm, count), Ok(2));
            let rank_of = |s: &Step| {
                members
                    .iter()
                    .position(|m| m.node == s.node && m.port == s.port)
                    .unwrap()
            };
            let mut parent = vec![None; count];
            for (rank, schedule) in schedules.iter().enumerate() {
                let children: Vec<usize> = schedule
                    .iter()
                    .filter(|s| s.op == StepOp::RECV && s.round == 0)
                    .map(rank_of)
                    .collect();
                assert!(children.len() <= dimension);
                // Gather from and broadcast to each child, and twice the parent.
                let parent_steps = if rank == root { 0 } else { 2 };
                assert_eq!(schedule.len(), 2 * children.len() + parent_steps);
                for child in children {
                    assert_eq!(parent[child].replace(rank), None);
                }
            }
            // Every rank but the root has one parent, and following parents reaches the root.
            for rank in 0..count {
                let mut at = rank;
                for _ in 0..count {
                    match parent[at] {
                        Some(up) => at = up,
                        None => break,
                    }
                }
                assert_eq!(
                    at, root,
                    "{algorithm:?}: rank {rank} does not reach the root"
                );
                assert_eq!(parent[rank].is_none(), rank == root);
            }
        }
    }
}

#[test]
fn a_group_of_one_and_bad_input() {
    let members = group(5, 0);
    let mut out = [Step::default(); MAX_SCHEDULE_STEPS];
    let pe = Algorithm::PairwiseExchange;
    assert_eq!(
        compile(pe, &[], 0, &mut out),
        Err(ScheduleError::EmptyGroup)
    );
    assert_eq!(
        compile(pe, &members[..1], 0, &mut out),
        Err(ScheduleError::TrivialGroup)
    );
    for algorithm in [
        pe,
        Algorithm::GatherBroadcast {
            dimension: 1,
            root: 0,
        },
        Algorithm::Dissemination { n: 1 },
    ] {
        assert_eq!(
            compile(algorithm, &members[..1], 0, &mut out),
            Err(ScheduleError::TrivialGroup)
        );
        assert_eq!(steps_needed(algorithm, 1), Err(ScheduleError::TrivialGroup));
    }
    assert_eq!(
        compile(pe, &members, 5, &mut out),
        Err(ScheduleError::RankOutOfRange {
            rank: 5,
            members: 5
        })
    );
    let mut bad_port = members.clone();
    bad_port[3].port = PortId(8);
    assert_eq!(
        compile(pe, &bad_port, 0, &mut out),
        Err(ScheduleError::PortOutOfRange {
            rank: 3,
            port: PortId(8)
        })
    );
    let mut twice = members.clone();
    twice[4] = twice[1];
    assert_eq!(
        compile(pe, &twice, 0, &mut out),
        Err(ScheduleError::DuplicateMember {
            first: 1,
            second: 4,
            member: members[1]
        })
    );
    // The same check alone, as the user library's group runs it: a group of one is a group.
    assert_eq!(check_members(&[]), Err(GroupError::Empty));
    assert_eq!(check_members(&members[..1]), Ok(()));
    assert_eq!(
        check_members(&twice),
        Err(GroupError::DuplicateMember {
            first: 1,
            second: 4,
            member: members[1]
        })
    );
    for dimension in [0, 5] {
        assert_eq!(
            gather_broadcast(&members, 0, dimension, 0, &mut out),
            Err(ScheduleError::DimensionOutOfRange {
                dimension,
                members: 5
            })
        );
    }
    assert_eq!(
        gather_broadcast(&members, 0, 2, 5, &mut out),
        Err(ScheduleError::RootOutOfRange {
            root: 5,
            members: 5
        })
    );
    for n in [0, 5] {
        assert_eq!(
            dissemination(&members, 0, n, &mut out),
            Err(ScheduleError::WaysOutOfRange { n, members: 5 })
        );
    }
    // Rank 0 of five does the fix-up: 1 + 2 + 1 steps.
    assert_eq!(
        pairwise_exchange(&members, 0, &mut out[..3]),
        Err(ScheduleError::OutputTooSmall {
            needed: 4,
            available: 3
        })
    );
    assert_eq!(pairwise_exchange(&members, 0, &mut out[..4]), Ok(4));
    assert_eq!(pairwise_exchange(&members, 4, &mut out[..2]), Ok(2));
    assert_eq!(
        steps_needed(pe, (1 << 40) + 1),
        Err(ScheduleError::TooManyRounds { rounds: 42 })
    );
    let star = Algorithm::GatherBroadcast {
        dimension: 69,
        root: 0,
    };
    let big = group(70, 0);
    for rank in [0, 1, 69] {
        assert_eq!(
            compile(star, &big, rank, &mut out),
            Err(ScheduleError::TooManySteps { steps: 138 })
        );
    }
}

#[test]
fn errors_say_what_and_which_value() {
    let member = Member::new(NodeId::new(3), PortId(2));
    let cases: [(ScheduleError, &str); 5] = [
        (
            ScheduleError::DuplicateMember {
                first: 1,
                second: 4,
                member,
            },
            "ranks 1 and 4 are both node 3 port 2",
        ),
        (
            ScheduleError::OutputTooSmall {
                needed: 4,
                available: 3,
            },
            "has 4 steps, but the output holds only 3",
        ),
        (
            ScheduleError::PortOutOfRange {
                rank: 2,
                port: PortId(9),
            },
            "rank 2 names port 9",
        ),
        (
            ScheduleError::WaysOutOfRange { n: 5, members: 5 },
            "n = 5 is outside 1..=4",
        ),
        (ScheduleError::TooManySteps { steps: 138 }, "138 steps"),
    ];
    for (error, text) in cases {
        let shown = format!("{error}");
        assert!(shown.contains(text), "{shown:?} lacks {text:?}");
    }
}

#[test]
fn default_rule() {
    assert_eq!(default_for(2), Algorithm::PairwiseExchange);
    assert_eq!(default_for(64), Algorithm::PairwiseExchange);
    assert_eq!(default_for(3), Algorithm::Dissemination { n: 1 });
    assert_eq!(default_for(1000), Algorithm::Dissemination { n: 1 });
    for count in 2..=70 {
        let algorithm = default_for(count);
        assert_eq!(rounds_needed(algorithm, count), Ok(ceil_log(count, 2)));
        check(algorithm, &group(count, 9), 2, &[count as u64]);
    }
}

#[test]
fn the_simulation_catches_broken_schedules() {
    let members = group(5, 0);
    let algorithm = Algorithm::Dissemination { n: 1 };
    let schedules = compile_all(algorithm, &members).unwrap();
    // Without the last round, every send still meets its receive, but rank 0 completes
    // without word from all the others.
    let truncated: Vec<Vec<Step>> = schedules
        .iter()
        .map(|s| s.iter().copied().filter(|step| step.round < 2).collect())
        .collect();
    let error = simulate(&members, &truncated, 1, 1).unwrap_err();
    assert!(error.contains("without knowing"), "{error}");
    // A packet nobody receives is left over.
    let pair = group(2, 0);
    let to = |rank: usize, op, round| Step::new(op, pair[rank].node, pair[rank].port, round);
    let unreceived = vec![
        vec![to(1, StepOp::SEND, 1), to(1, StepOp::EXCHANGE, 0)],
        vec![to(0, StepOp::EXCHANGE, 0)],
    ];
    let error = simulate(&pair, &unreceived, 1, 1).unwrap_err();
    assert!(error.contains("left a packet"), "{error}");
    // A send dropped: its receiver waits forever.
    let mut no_send = schedules.clone();
    no_send[2].retain(|s| !(s.op == StepOp::SEND && s.round == 0));
    let error = simulate(&members, &no_send, 1, 1).unwrap_err();
    assert!(error.contains("deadlock"), "{error}");
    // Two sends of one round to one peer, with as many receives: a fast sender overfills the
    // record.
    let doubled = vec![
        vec![
            to(1, StepOp::SEND, 0),
            to(1, StepOp::SEND, 0),
            to(1, StepOp::RECV, 1),
        ],
        vec![
            to(0, StepOp::SEND, 1),
            to(0, StepOp::RECV, 0),
            to(0, StepOp::RECV, 0),
        ],
    ];
    let overfilled = (0..50).any(|seed| {
        simulate(&pair, &doubled, 3, seed).is_err_and(|e| e.contains("record holds two"))
    });
    assert!(overfilled);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn larger_groups_synchronise(
        count in 17usize..=70,
        kind in 0usize..3,
        parameter in any::<usize>(),
        root in any::<usize>(),
        salt in any::<usize>(),
        seed in any::<u64>(),
    ) {
        let members = group(count, salt % 1_000_000);
        let algorithm = match kind {
            0 => Algorithm::PairwiseExchange,
            1 => Algorithm::GatherBroadcast {
                dimension: 1 + parameter % (count - 1),
                root: root % count,
            },
            _ => Algorithm::Dissemination { n: 1 + parameter % 4 },
        };
        if steps_needed(algorithm, count)? > MAX_SCHEDULE_STEPS {
            let mut out = [Step::default(); MAX_SCHEDULE_STEPS];
            let result = compile(algorithm, &members, root % count, &mut out);
            let too_long = matches!(result, Err(ScheduleError::TooManySteps { .. }));
            prop_assert!(too_long, "{:?}", result);
            return Ok(());
        }
        let schedules = compile_all(algorithm, &members).unwrap();
        check_static(algorithm, &members, &schedules);
        let result = simulate(&members, &schedules, 3, seed);
        prop_assert!(result.is_ok(), "{:?}: {}", algorithm, result.err().unwrap_or_default());
    }

    #[test]
    fn any_input_is_an_answer_not_a_panic(
        raw in proptest::collection::vec((0u16..6, 0u8..10), 0..40),
        rank in 0usize..45,
        kind in 0usize..3,
        parameter in 0usize..45,
        root in 0usize..45,
        capacity in 0usize..20,
    ) {
        let members: Vec<Member> =
            raw.iter().map(|&(node, port)| Member::new(NodeId::new(node), PortId(port))).collect();
        let algorithm = match kind {
            0 => Algorithm::PairwiseExchange,
            1 => Algorithm::GatherBroadcast { dimension: parameter, root },
            _ => Algorithm::Dissemination { n: parameter },
        };
        let mut out = vec![Step::default(); capacity];
        if let Ok(len) = compile(algorithm, &members, rank, &mut out) {
            prop_assert!(len > 0 && len <= capacity);
            prop_assert!(out[..len].iter().all(Step::is_valid));
        }
    }
}

/// Runs every member's allreduce schedule of `members` members over a wire that delivers in
/// an order drawn from `seed`, each value an expression (`x3`, `(x0+x1)`), and returns each
/// member's final expression.
fn run_allreduce_symbolically(members: usize, seed: u64) -> Vec<String> {
    let group: Vec<Member> = (0..members)
        .map(|n| Member::new(NodeId::new(n as u16), PortId(1)))
        .collect();
    let schedules: Vec<Vec<Step>> = (0..members)
        .map(|rank| {
            let mut steps = vec![Step::default(); MAX_SCHEDULE_STEPS];
            let count = allreduce(&group, rank, &mut steps).unwrap();
            steps.truncate(count);
            steps
        })
        .collect();
    let rank_of = |step: &Step| usize::from(step.node.get());
    let mut values: Vec<String> = (0..members).map(|rank| format!("x{rank}")).collect();
    let mut at = vec![0usize; members];
    let mut sent = vec![false; members];
    // Packets in flight: (from, to, round, value).
    let mut wire: Vec<(usize, usize, u8, String)> = Vec::new();
    let mut arrived: HashMap<(usize, usize, u8), String> = HashMap::new();
    let mut rng = SplitMix64::seed_from_u64(seed);
    for _ in 0..100_000 {
        let mut moved = false;
        for rank in 0..members {
            let Some(step) = schedules[rank].get(at[rank]).copied() else {
                continue;
            };
            let peer = rank_of(&step);
            if (step.op == StepOp::SEND || step.op == StepOp::EXCHANGE) && !sent[rank] {
                wire.push((rank, peer, step.round, values[rank].clone()));
                sent[rank] = true;
                moved = true;
                if step.op == StepOp::SEND {
                    at[rank] += 1;
                    sent[rank] = false;
                    continue;
                }
            }
            if step.op == StepOp::RECV || step.op == StepOp::EXCHANGE {
                if let Some(theirs) = arrived.remove(&(peer, rank, step.round)) {
                    let mine = &values[rank];
                    values[rank] = if step.combine.contains(StepCombine::REPLACE) {
                        theirs
                    } else if step.combine.contains(StepCombine::PEER_LEFT) {
                        format!("({theirs}+{mine})")
                    } else if step.combine.contains(StepCombine::COMBINE) {
                        format!("({mine}+{theirs})")
                    } else {
                        panic!("rank {rank}: a receive that neither combines nor replaces")
                    };
                    at[rank] += 1;
                    sent[rank] = false;
                    moved = true;
                }
            }
        }
        // Deliver one packet in flight, drawn at random: arrival order is the wire's.
        if !wire.is_empty() {
            let (from, to, round, value) = wire.remove(rng.next_u64() as usize % wire.len());
            assert!(
                arrived.insert((from, to, round), value).is_none(),
                "two packets of one round from {from} to {to}"
            );
            moved = true;
        }
        if !moved {
            break;
        }
    }
    assert!(
        (0..members).all(|rank| at[rank] == schedules[rank].len()),
        "{members} members: the allreduce did not finish ({at:?})"
    );
    values
}

/// The expression tree the allreduce must compute, built independently of the schedule:
/// the fix-up's pairs first, then neighbours combined level by level, lower on the left.
fn allreduce_tree(members: usize) -> String {
    let power = 1usize << (usize::BITS - 1 - members.leading_zeros());
    let extra = members - power;
    let mut level: Vec<String> = (0..power)
        .map(|i| {
            if i < extra {
                format!("(x{i}+x{})", i + power)
            } else {
                format!("x{i}")
            }
        })
        .collect();
    while level.len() > 1 {
        level = level
            .chunks(2)
            .map(|pair| format!("({}+{})", pair[0], pair[1]))
            .collect();
    }
    level.remove(0)
}

#[test]
fn allreduce_gives_every_member_the_same_tree_counting_each_member_once_whatever_the_order() {
    for members in 2..=64 {
        let expected = allreduce_tree(members);
        for seed in 0..8 {
            let values = run_allreduce_symbolically(members, seed);
            for (rank, value) in values.iter().enumerate() {
                assert_eq!(
                    value, &expected,
                    "{members} members, rank {rank}, wire seed {seed}"
                );
            }
        }
        // Each member's value appears exactly once (no overlapping paths).
        for rank in 0..members {
            assert_eq!(
                expected.matches(&format!("x{rank}")).count()
                    - (0..members)
                        .filter(|other| {
                            *other != rank && format!("x{other}").starts_with(&format!("x{rank}"))
                        })
                        .map(|other| expected.matches(&format!("x{other}")).count())
                        .sum::<usize>(),
                1,
                "{members} members: x{rank} counted other than once in {expected}"
            );
        }
    }
}

#[test]
fn allreduce_steps_are_the_pairwise_exchange_s_with_a_treatment_for_every_receive() {
    for members in 2..=33 {
        let group: Vec<Member> = (0..members)
            .map(|n| Member::new(NodeId::new(n as u16), PortId(1)))
            .collect();
        for rank in 0..members {
            let (mut reduce, mut barrier) = (vec![Step::default(); 64], vec![Step::default(); 64]);
            let count = allreduce(&group, rank, &mut reduce).unwrap();
            let barrier_count = pairwise_exchange(&group, rank, &mut barrier).unwrap();
            assert_eq!(count, barrier_count);
            for (with, without) in reduce[..count].iter().zip(&barrier[..count]) {
                assert_eq!(with.with_combine(StepCombine::NONE), *without);
                assert!(with.is_valid());
                let receives = with.op != StepOp::SEND;
                assert_eq!(receives, with.combine != StepCombine::NONE, "{with:?}");
            }
        }
    }
}
