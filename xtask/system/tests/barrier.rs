//! Barriers through the library against the emulated NIC in this process, one thread per port:
//! GM's two calls, groups, the fuzzy barrier, the host-based baseline, and what the port keeps
//! for the caller while a barrier waits. Processes, faults and killed members are the process-level
//! tests' (`host-driver/tests/barrier_processes.rs`).
//!
//! Every wait is bounded and fails loudly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier as ThreadBarrier, mpsc};
use std::time::{Duration, Instant};

use nicbar::{
    Algorithm, BarrierError, Event, FailureReason, Group, Member, Port, Priority, Status, Step,
};
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, IdlePolicy};

/// Longest any one wait of these tests may take.
const BOUND: Duration = Duration::from_secs(20);
const SIZE: u8 = 7;

struct Cluster {
    emulator: EmulatorHandle,
    dir: std::path::PathBuf,
}

impl Cluster {
    fn new(name: &str, units: u16) -> Self {
        Self::on_threads(name, units, None, IdlePolicy::default())
    }

    /// A daemon whose NICs run on `threads` threads (the default for this host if `None`) with
    /// idle policy `idle`.
    fn on_threads(name: &str, units: u16, threads: Option<usize>, idle: IdlePolicy) -> Self {
        Self::configured(name, units, |config| {
            config.threads = threads;
            config.idle = idle;
        })
    }

    /// A daemon of `units` NICs with its configuration as `configure` leaves it.
    fn configured(name: &str, units: u16, configure: impl FnOnce(&mut EmulatorConfig)) -> Self {
        let dir =
            std::env::temp_dir().join(format!("nicbar-barrier-{name}-{}", std::process::id()));
        let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
        configure(&mut config);
        let emulator = Emulator::spawn(config).unwrap();
        Self { emulator, dir }
    }

    fn open(&self, unit: u8, port: u8) -> Port {
        Port::open_at(self.emulator.socket(), unit, port).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn member(port: &Port) -> Member {
    Member::new(port.node_id(), port.port_id())
}

/// Runs `body(rank, port)` on a thread of its own for each of `ports`, as the processes of a
/// job run; returns what each returned, in rank order (a panic in one fails the test).
fn on_every_port<T: Send + 'static>(
    ports: impl IntoIterator<Item = Port>,
    body: impl Fn(usize, Port) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let body = Arc::new(body);
    let threads: Vec<_> = ports
        .into_iter()
        .enumerate()
        .map(|(rank, port)| {
            let body = body.clone();
            std::thread::spawn(move || body(rank, port))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn blocking(port: &mut Port) -> Event {
    port.receive_timeout(BOUND)
        .unwrap()
        .unwrap_or_else(|| panic!("no event within {BOUND:?}"))
}

fn compile(algorithm: Algorithm, members: &[Member], rank: usize) -> Vec<Step> {
    let mut steps = vec![Step::default(); 128];
    let count = nicbar_schedule::compile(algorithm, members, rank, &mut steps).unwrap();
    steps.truncate(count);
    steps
}

/// Runs `barriers` pairwise-exchange barriers through GM's two calls on two ports, one thread
/// each, providing each barrier's buffer right before its barrier token. Checks each end event's
/// context and that every token comes back; returns how many barrier tokens the NIC refused as
/// busy (each is posted again, as a GM program would).
fn gm_barriers(name: &str, barriers: u64) -> u64 {
    let cluster = Cluster::new(name, 2);
    let ports = [cluster.open(0, 1), cluster.open(1, 3)];
    let members: Vec<Member> = ports.iter().map(member).collect();
    on_every_port(ports, move |rank, mut port| {
        let steps = compile(Algorithm::PairwiseExchange, &members, rank);
        let (sends, receives) = (port.send_tokens(), port.receive_tokens());
        let mut refused = 0;
        for round in 0..barriers {
            port.provide_barrier_buffer().unwrap();
            assert_eq!(port.receive_tokens(), receives - 1);
            let context = 1000 * rank as u64 + round;
            port.barrier_send(&steps, context, Some(BOUND)).unwrap();
            assert_eq!(port.send_tokens(), sends - 1);
            loop {
                match blocking(&mut port) {
                    Event::BarrierCompleted { context: c } => {
                        assert_eq!(c, context);
                        break;
                    }
                    Event::SendRejected {
                        status: Status::BARRIER_BUSY,
                        context: c,
                        ..
                    } if c == context => {
                        refused += 1;
                        port.barrier_send(&steps, context, Some(BOUND)).unwrap();
                    }
                    other => panic!("rank {rank} barrier {round}: {other:?}"),
                }
            }
            assert_eq!(
                (port.send_tokens(), port.receive_tokens()),
                (sends, receives)
            );
        }
        refused
    })
    .into_iter()
    .sum()
}

/// Each barrier's buffer is provided right before its token: the NIC must not read the token
/// before the buffer (it once did, and refused such tokens as busy).
#[test]
fn gm_calls_run_barriers_give_every_token_back_and_are_never_refused_as_busy() {
    assert_eq!(gm_barriers("gm", 2000), 0);
}

#[test]
fn a_barrier_without_a_buffer_or_with_a_bad_schedule_is_refused_and_its_tokens_come_back() {
    let cluster = Cluster::new("refused", 2);
    let mut port = cluster.open(0, 1);
    let peer = cluster.open(1, 1);
    let (sends, receives) = (port.send_tokens(), port.receive_tokens());
    let steps = compile(
        Algorithm::PairwiseExchange,
        &[member(&port), member(&peer)],
        0,
    );
    port.barrier_send(&steps, 7, None).unwrap();
    match blocking(&mut port) {
        Event::SendRejected {
            buffer,
            context,
            status,
            kind,
        } => {
            assert!(buffer.is_none(), "the schedule buffer is the port's");
            assert_eq!((context, status, kind), (7, Status::BARRIER_BUSY, 2));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(port.send_tokens(), sends);
    // An empty schedule is refused as such, and the barrier buffer stays provided.
    port.provide_barrier_buffer().unwrap();
    port.barrier_send(&[], 8, None).unwrap();
    match blocking(&mut port) {
        Event::SendRejected {
            context, status, ..
        } => assert_eq!((context, status), (8, Status::BAD_SCHEDULE)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (port.send_tokens(), port.receive_tokens()),
        (sends, receives - 1)
    );
    assert!(port.receive().unwrap().is_none());
}

#[test]
fn a_group_of_one_completes_at_once_and_strangers_are_told_they_are_not_members() {
    let cluster = Cluster::new("one", 2);
    let mut port = cluster.open(0, 2);
    let other = cluster.open(1, 2);
    let alone = Group::new([member(&port)]).unwrap();
    let tokens = (port.send_tokens(), port.receive_tokens());
    port.barrier(&alone).unwrap();
    let pending = port.barrier_start(&alone).unwrap();
    assert!(port.barrier_test(&pending).unwrap());
    port.barrier_wait(pending).unwrap();
    port.host_barrier(&alone, alone.options()).unwrap();
    // Nothing went to the NIC: no token is out, no event comes.
    assert_eq!((port.send_tokens(), port.receive_tokens()), tokens);
    assert!(port.receive().unwrap().is_none());
    let theirs = Group::new([member(&other)]).unwrap();
    match port.barrier(&theirs) {
        Err(BarrierError::NotAMember { member: m }) => assert_eq!(m, member(&port)),
        other => panic!("{other:?}"),
    }
    match port.host_barrier(&theirs, theirs.options()) {
        Err(BarrierError::NotAMember { .. }) => {}
        other => panic!("{other:?}"),
    }
    let two = Group::new([member(&port), member(&other)])
        .unwrap()
        .with_algorithm(Algorithm::Dissemination { n: 2 });
    match port.barrier(&two) {
        Err(BarrierError::Schedule(error)) => {
            assert_eq!(
                error.to_string(),
                "dissemination n = 2 is outside 1..=1 for 2 members"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn events_that_arrive_during_a_barrier_come_out_of_receive_afterwards_in_order() {
    const MESSAGES: u32 = 40;
    let cluster = Cluster::new("kept", 2);
    let mut sender = cluster.open(0, 1);
    let mut receiver = cluster.open(1, 1);
    let group = Group::new([member(&sender), member(&receiver)]).unwrap();
    for tag in 0..MESSAGES {
        let buffer = receiver.dma_alloc(128).unwrap();
        receiver
            .provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .unwrap();
    }
    let to = member(&receiver);
    let (group_a, group_b) = (group.clone(), group.clone());
    let sending = std::thread::spawn(move || {
        for seq in 0..MESSAGES {
            let mut buffer = sender.dma_alloc(128).unwrap();
            buffer[..4].copy_from_slice(&seq.to_le_bytes());
            sender
                .send(
                    buffer,
                    4,
                    SIZE,
                    Priority::LOW,
                    to.node,
                    to.port,
                    u64::from(seq),
                )
                .unwrap();
        }
        // The barrier packet rides behind the messages on the same connection (paper §3.3).
        sender.barrier(&group_a).unwrap();
        let mut contexts = Vec::new();
        while let Some(event) = sender.receive().unwrap() {
            match event {
                Event::Sent {
                    context, status, ..
                } => {
                    assert_eq!(status, Status::SUCCESS);
                    contexts.push(context);
                }
                other => panic!("sender: {other:?}"),
            }
        }
        // Whatever the barrier did not wait through comes later; collect the rest.
        while contexts.len() < MESSAGES as usize {
            match blocking(&mut sender) {
                Event::Sent { context, .. } => contexts.push(context),
                other => panic!("sender: {other:?}"),
            }
        }
        assert_eq!(contexts, (0..u64::from(MESSAGES)).collect::<Vec<_>>());
    });
    receiver.barrier(&group_b).unwrap();
    let mut received = Vec::new();
    while let Some(event) = receiver.receive().unwrap() {
        match event {
            Event::Received { buffer, length, .. } => {
                assert_eq!(length, 4);
                received.push(u32::from_le_bytes(buffer[..4].try_into().unwrap()));
            }
            other => panic!("receiver: {other:?}"),
        }
    }
    // Everything sent before the sender entered the barrier arrived before the barrier completed
    // here, and the port kept it all, in order.
    assert_eq!(received, (0..MESSAGES).collect::<Vec<_>>());
    sending.join().unwrap();
}

/// `Port::nic_broadcast` between three ports of two NICs: every member gets the root's bytes
/// (into a shorter buffer, as many as fit, with the root's count returned); a root with no bytes
/// or too many is refused before anything is posted, and its group's numbering is untouched (the
/// next broadcast works); events of other kinds wait for `receive`.
/// Five ports on `cluster`'s three NICs, two pairs sharing one, and their group.
fn five_members_on_three_nics(cluster: &Cluster) -> (Vec<Port>, Group) {
    let ports = vec![
        cluster.open(0, 1),
        cluster.open(1, 1),
        cluster.open(2, 1),
        cluster.open(0, 2),
        cluster.open(1, 2),
    ];
    let group = Group::new(ports.iter().map(member))
        .unwrap()
        .with_timeout(BOUND);
    (ports, group)
}

/// Five members on three NICs (two pairs of ports share one) reduce in the NIC: a `double` sum
/// whose bits depend on the order of the additions, and an `int` MAXLOC with a tie; every
/// member gets the same bytes, those of the schedule's documented tree, run after run.
#[test]
fn a_nic_allreduce_gives_every_member_the_same_bits_of_the_schedules_tree() {
    use nicbar::{ReduceOp, ReduceSpec, ReduceType};
    let cluster = Cluster::new("allreduce", 3);
    let (ports, group) = five_members_on_three_nics(&cluster);
    let values = [0.1f64, 0.2, 0.3, 1e16, -1e16];
    // The tree for 5 members: ((x0 + x4) + x1) + (x2 + x3).
    let tree = ((values[0] + values[4]) + values[1]) + (values[2] + values[3]);
    on_every_port(ports, move |rank, mut port| {
        let group = group.clone();
        for run in 0..20 {
            let mut sum = values[rank].to_le_bytes();
            port.nic_allreduce(
                &group,
                ReduceSpec::new(ReduceOp::SUM, ReduceType::F64),
                &mut sum,
            )
            .unwrap();
            assert_eq!(f64::from_le_bytes(sum), tree, "rank {rank}, run {run}");
            // MAXLOC of (value, index) pairs: ranks 1 and 3 tie at the maximum.
            let value = [5i32, 9, 2, 9, -1][rank];
            let mut pair = [value.to_le_bytes(), (rank as i32).to_le_bytes()].concat();
            port.nic_allreduce(
                &group,
                ReduceSpec::new(ReduceOp::MAXLOC, ReduceType::I32),
                &mut pair,
            )
            .unwrap();
            assert_eq!(pair, [9i32.to_le_bytes(), 1i32.to_le_bytes()].concat());
        }
        // Refused before anything is posted: too long, and bitwise on floating point.
        let mut long = [0u8; nicbar::NIC_REDUCE_MAX + 8];
        assert!(matches!(
            port.nic_allreduce(
                &group,
                ReduceSpec::new(ReduceOp::SUM, ReduceType::F64),
                &mut long
            ),
            Err(BarrierError::Refused {
                status: Status::TOO_LONG
            })
        ));
        let mut float = [0u8; 8];
        assert!(matches!(
            port.nic_allreduce(
                &group,
                ReduceSpec::new(ReduceOp::BXOR, ReduceType::F64),
                &mut float
            ),
            Err(BarrierError::Refused {
                status: Status::INVALID_TOKEN
            })
        ));
    });
}

/// The reproducible sum in the NIC: five members on three NICs sum five doubles whose
/// ordinary sum depends on the order, each value held by a different rank from one run to the
/// next, directly and through a persistent allreduce; every member gets the bits of the values'
/// exact sum, cut and rounded once ([`shared_abi::reproducible`]), every time. A group of one
/// gets its own value back; an integer type and a vector are refused.
#[test]
fn a_reproducible_sum_gives_the_same_bits_whoever_holds_which_value() {
    use nicbar::{ReduceOp, ReduceSpec, ReduceType};
    use shared_abi::reproducible::ReproducibleSum;
    let cluster = Cluster::new("reproducible", 3);
    let (ports, group) = five_members_on_three_nics(&cluster);
    let values = [1e16f64, 0.1, -3.5e-3, 0.3, -1e16];
    let mut exact = ReproducibleSum::default();
    for value in values {
        exact.merge(&ReproducibleSum::of_f64(value));
    }
    let expected = exact.to_f64();
    let spec = ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, ReduceType::F64);
    on_every_port(ports, move |rank, mut port| {
        let group = group.clone();
        let persistent = port.persistent_allreduce(&group, spec, 8).unwrap();
        for run in 0..10 {
            let value = values[(rank + run) % values.len()];
            let mut sum = value.to_le_bytes();
            port.nic_allreduce(&group, spec, &mut sum).unwrap();
            assert_eq!(f64::from_le_bytes(sum), expected, "rank {rank}, run {run}");
            let pending = port
                .persistent_start(&persistent, &value.to_le_bytes())
                .unwrap();
            let mut sum = [0u8; 8];
            port.nic_allreduce_wait(pending, &mut sum).unwrap();
            assert_eq!(f64::from_le_bytes(sum), expected, "rank {rank}, run {run}");
        }
        for (datatype, len) in [(ReduceType::I64, 8), (ReduceType::F64, 16)] {
            let mut bytes = vec![0u8; len];
            assert!(matches!(
                port.nic_allreduce(
                    &group,
                    ReduceSpec::new(ReduceOp::SUM_REPRODUCIBLE, datatype),
                    &mut bytes
                ),
                Err(BarrierError::Refused { .. })
            ));
        }
        let alone = Group::new([member(&port)]).unwrap();
        let mut own = values[rank].to_le_bytes();
        port.nic_allreduce(&alone, spec, &mut own).unwrap();
        assert_eq!(f64::from_le_bytes(own), values[rank]);
    });
}

/// Persistent collectives (MPI's `MPI_Barrier_init`, `MPI_Allreduce_init`): three members on
/// three NICs (an odd group: the allreduce takes the non-power-of-two fix-up) compile a barrier
/// of one group and an `i64` sum of another once, then start both 40 times, the even ranks the
/// allreduce first and the odd ranks the barrier first, with an ordinary barrier of the first
/// group now and then (they share its numbering). Every sum is checked; the compiled barrier is
/// the steps the group's barrier sends; what a start refuses is refused before anything is posted.
#[test]
fn persistent_collectives_compiled_once_start_many_times_in_either_order() {
    use nicbar::{ReduceOp, ReduceSpec, ReduceType};
    const STARTS: i64 = 40;
    let cluster = Cluster::new("persistent", 3);
    let ports = vec![cluster.open(0, 3), cluster.open(1, 3), cluster.open(2, 3)];
    let members: Vec<Member> = ports.iter().map(member).collect();
    let barriers = Group::new(members.clone())
        .unwrap()
        .with_id(71)
        .with_timeout(BOUND);
    let sums = Group::new(members.clone())
        .unwrap()
        .with_id(72)
        .with_timeout(BOUND);
    let spec = ReduceSpec::new(ReduceOp::SUM, ReduceType::I64);
    let shared = (barriers.clone(), sums.clone(), members.clone());
    let mut ports = on_every_port(ports, move |rank, mut port| {
        let (barriers, sums, members) = &shared;
        let barrier = port.persistent_barrier(barriers).unwrap();
        assert_eq!(
            barrier.steps(),
            compile(barriers.options().algorithm, members, rank).as_slice()
        );
        let sum = port.persistent_allreduce(sums, spec, 16).unwrap();
        assert_eq!(sum.reduce(), Some((spec, 16)));
        for start in 0..STARTS {
            let mine = [rank as i64 + start, -(rank as i64) * start];
            let data: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
            let (pending_sum, pending_barrier) = if rank % 2 == 0 {
                let s = port.persistent_start(&sum, &data).unwrap();
                (s, port.persistent_start(&barrier, &[]).unwrap())
            } else {
                let b = port.persistent_start(&barrier, &[]).unwrap();
                (port.persistent_start(&sum, &data).unwrap(), b)
            };
            port.barrier_wait(pending_barrier).unwrap();
            let mut result = [0u8; 16];
            port.nic_allreduce_wait(pending_sum, &mut result).unwrap();
            let got = [
                i64::from_le_bytes(result[..8].try_into().unwrap()),
                i64::from_le_bytes(result[8..].try_into().unwrap()),
            ];
            // Ranks 0, 1 and 2: (0 + 1 + 2) + 3 * start, and -(0 + 1 + 2) * start.
            assert_eq!(
                got,
                [3 + 3 * start, -3 * start],
                "rank {rank}, start {start}"
            );
            if start % 8 == 7 {
                port.barrier(barriers).unwrap();
            }
        }
        // Another length than compiled is refused before anything is posted.
        assert!(matches!(
            port.persistent_start(&sum, &[0; 8]),
            Err(BarrierError::Refused {
                status: Status::TOO_LONG
            })
        ));
        port.barrier(barriers).unwrap();
        (port, barrier)
    });
    // A persistent collective starts only on the port it was compiled for (its rank's steps).
    let (mut first, _) = ports.remove(0);
    let (_, second_barrier) = ports.remove(0);
    match first.persistent_start(&second_barrier, &[]) {
        Err(BarrierError::NotAMember { member: m }) => assert_eq!(m, member(&first)),
        other => panic!("{other:?}"),
    }
    // Refused at compile time: a bad length, an operation the type lacks, a stranger's group.
    assert!(matches!(
        first.persistent_allreduce(&sums, spec, nicbar::NIC_REDUCE_MAX + 8),
        Err(BarrierError::Refused {
            status: Status::TOO_LONG
        })
    ));
    assert!(matches!(
        first.persistent_allreduce(&sums, ReduceSpec::new(ReduceOp::BXOR, ReduceType::F64), 8),
        Err(BarrierError::Refused {
            status: Status::INVALID_TOKEN
        })
    ));
    let strangers = Group::new(members[1..].iter().copied()).unwrap();
    assert!(matches!(
        first.persistent_barrier(&strangers),
        Err(BarrierError::NotAMember { .. })
    ));
    // A group of one: nothing goes to the NIC; the allreduce's result is the member's value.
    let alone = Group::new([member(&first)]).unwrap();
    let tokens = (first.send_tokens(), first.receive_tokens());
    let one = first.persistent_allreduce(&alone, spec, 8).unwrap();
    let pending = first.persistent_start(&one, &7i64.to_le_bytes()).unwrap();
    let mut result = 7i64.to_le_bytes();
    first.nic_allreduce_wait(pending, &mut result).unwrap();
    assert_eq!(i64::from_le_bytes(result), 7);
    let pending = first
        .persistent_start(&first.persistent_barrier(&alone).unwrap(), &[])
        .unwrap();
    first.barrier_wait(pending).unwrap();
    assert_eq!((first.send_tokens(), first.receive_tokens()), tokens);
}

#[test]
fn a_nic_broadcast_brings_every_member_the_roots_bytes_and_bad_roots_are_refused() {
    let cluster = Cluster::new("broadcast", 2);
    let ports = vec![cluster.open(0, 1), cluster.open(0, 2), cluster.open(1, 1)];
    let group = Group::new(ports.iter().map(member))
        .unwrap()
        .with_timeout(BOUND);
    on_every_port(ports, move |rank, mut port| {
        for (n, length) in [1usize, 17, nicbar::NIC_BROADCAST_MAX]
            .into_iter()
            .enumerate()
        {
            let sent: Vec<u8> = (0..length).map(|i| (i * 7 + n) as u8).collect();
            for from in 0..3 {
                if rank == from && n == 0 {
                    // Refused at the root before anything is posted.
                    for bad in [vec![], vec![1; nicbar::NIC_BROADCAST_MAX + 1]] {
                        let mut bad = bad;
                        assert!(matches!(
                            port.nic_broadcast(&group, from, &mut bad),
                            Err(BarrierError::Refused {
                                status: Status::TOO_LONG
                            })
                        ));
                    }
                }
                let mut data = if rank == from {
                    sent.clone()
                } else {
                    vec![0; length]
                };
                assert_eq!(port.nic_broadcast(&group, from, &mut data).unwrap(), length);
                assert_eq!(data, sent, "rank {rank}, {length} bytes from {from}");
                if rank != from && length > 4 {
                    // Into a shorter buffer: as many as fit.
                    let mut short = [0u8; 4];
                    let got = port.nic_broadcast(&group, from, &mut short);
                    assert_eq!(got.unwrap(), length);
                    assert_eq!(short[..], sent[..4]);
                } else if length > 4 {
                    let mut again = sent.clone();
                    assert_eq!(
                        port.nic_broadcast(&group, from, &mut again).unwrap(),
                        length
                    );
                }
            }
        }
        assert!(
            port.receive().unwrap().is_none(),
            "nothing of the broadcasts leaks out"
        );
    });
}

#[test]
fn a_fuzzy_barrier_is_not_done_until_the_last_member_enters() {
    let cluster = Cluster::new("fuzzy", 2);
    let mut early = cluster.open(0, 4);
    let mut late = cluster.open(1, 4);
    let group = Group::new([member(&early), member(&late)])
        .unwrap()
        .with_timeout(BOUND);
    let (go, wait_for_go) = mpsc::channel::<()>();
    let late_group = group.clone();
    let late_thread = std::thread::spawn(move || {
        wait_for_go.recv_timeout(BOUND).unwrap();
        late.barrier(&late_group).unwrap();
        late
    });
    let pending = early.barrier_start(&group).unwrap();
    let mut tests = 0;
    let computing_until = Instant::now() + Duration::from_millis(50);
    while Instant::now() < computing_until {
        assert!(
            !early.barrier_test(&pending).unwrap(),
            "the barrier completed before its other member entered"
        );
        tests += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    go.send(()).unwrap();
    let deadline = Instant::now() + BOUND;
    while !early.barrier_test(&pending).unwrap() {
        assert!(Instant::now() < deadline, "the barrier did not complete");
        std::hint::spin_loop();
    }
    early.barrier_wait(pending).unwrap();
    let mut late = late_thread.join().unwrap();
    eprintln!("{tests} tests said not yet");
    // Both ports go on with the next barrier.
    let late_group = group.clone();
    let again = std::thread::spawn(move || late.barrier(&late_group).unwrap());
    early.barrier(&group).unwrap();
    again.join().unwrap();
}

/// Paper §3.4's concurrent barriers, per port: two ports start barriers of four groups (the
/// same two members, four identities) in opposite orders before waiting for any, and wait for
/// them in yet another order; all complete. A fifth at once is refused as busy.
#[test]
fn barriers_of_several_groups_run_at_once_in_opposite_orders_and_one_more_is_busy() {
    let running = shared_abi::schedule::RUNNING_BARRIERS as u32;
    let cluster = Cluster::new("overlap", 2);
    let mut first = cluster.open(0, 4);
    let mut second = cluster.open(1, 4);
    let groups: Vec<Group> = (1..=running)
        .map(|id| {
            Group::new([member(&first), member(&second)])
                .unwrap()
                .with_id(id)
                .with_timeout(BOUND)
        })
        .collect();
    let reversed: Vec<Group> = groups.iter().rev().cloned().collect();
    let second_member = member(&second);
    let second_thread = std::thread::spawn(move || {
        let pending: Vec<_> = reversed
            .iter()
            .map(|group| second.barrier_start(group).unwrap())
            .collect();
        for pending in pending {
            second.barrier_wait(pending).unwrap();
        }
    });
    let mut pending: Vec<_> = groups
        .iter()
        .map(|group| first.barrier_start(group).unwrap())
        .collect();
    let fifth = Group::new([member(&first), second_member])
        .unwrap()
        .with_id(running + 1);
    assert!(matches!(
        first.barrier_start(&fifth),
        Err(BarrierError::Busy)
    ));
    // Waited for last-started first: each ends on its own.
    while let Some(last) = pending.pop() {
        first.barrier_wait(last).unwrap();
    }
    second_thread.join().unwrap();
}

#[test]
fn a_member_that_never_enters_fails_the_barrier_naming_it_nic_and_host() {
    let cluster = Cluster::new("timeout", 2);
    let mut port = cluster.open(0, 1);
    let absent = cluster.open(1, 6);
    let group = Group::new([member(&port), member(&absent)])
        .unwrap()
        .with_timeout(Duration::from_millis(200));
    let started = Instant::now();
    match port.barrier(&group) {
        Err(BarrierError::Failed {
            waiting_for,
            rank,
            reason,
        }) => {
            assert_eq!(
                (waiting_for, rank, reason),
                (member(&absent), Some(1), FailureReason::TimedOut)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < BOUND);
    let options = *group.options();
    match port.host_barrier(&group, &options) {
        Err(error @ BarrierError::Failed { .. }) => {
            assert_eq!(
                error.to_string(),
                "the barrier failed waiting for rank 1 (node 1 port 6): the barrier timed out"
            );
        }
        other => panic!("{other:?}"),
    }
    // The port is usable afterwards: the send token and the barrier buffer came back.
    assert!(!matches!(
        port.barrier_start(&group),
        Err(BarrierError::Busy)
    ));
    drop(absent);
}

/// Four ports in four threads run barriers of every algorithm, on the NIC and on the host,
/// alternating, and check on exit that every member entered.
#[test]
fn nic_and_host_barriers_of_every_algorithm_alternate_on_four_ports() {
    alternate_barriers(Cluster::new("alternate", 4));
}

/// The same with every NIC on a thread of its own, polling: every packet crosses threads
/// through the lock-free inboxes.
#[test]
fn barriers_alternate_with_every_nic_on_a_polling_thread_of_its_own() {
    alternate_barriers(Cluster::on_threads(
        "alternate-poll",
        4,
        Some(4),
        IdlePolicy::Poll,
    ));
}

/// The same with two NICs on each of two sleeping threads: packets between threads must wake
/// the receiving one, packets within one are taken in the same pass.
#[test]
fn barriers_alternate_on_two_sleeping_nic_threads() {
    alternate_barriers(Cluster::on_threads(
        "alternate-sleep",
        4,
        Some(2),
        IdlePolicy::Sleep,
    ));
}

/// A barrier rings a sleeping NIC once, for its token: the buffer its end uses, and the next
/// barrier's buffer provided when it ends, go into the receive ring without a doorbell (the
/// token's post brings the NIC to them). The NIC threads sleep the moment they are idle, so
/// every doorbell a process may ring, it rings.
#[test]
fn a_barrier_rings_a_sleeping_nic_once() {
    const BARRIERS: u64 = 200;
    let cluster = Cluster::configured("rings", 2, |config| {
        config.idle = IdlePolicy::Sleep;
        config.idle_linger = Duration::ZERO;
    });
    let ports = [cluster.open(0, 1), cluster.open(1, 1)];
    let group = Group::new(ports.iter().map(member))
        .unwrap()
        .with_timeout(BOUND);
    let doorbells = on_every_port(ports, move |rank, mut port| {
        let before = port.counters().doorbells;
        for round in 0..BARRIERS {
            port.barrier(&group)
                .unwrap_or_else(|e| panic!("rank {rank} barrier {round}: {e}"));
        }
        port.counters().doorbells - before
    });
    for (rank, rung) in doorbells.into_iter().enumerate() {
        assert!(
            rung <= BARRIERS,
            "rank {rank} rang the NIC {rung} times for {BARRIERS} barriers"
        );
    }
}

fn alternate_barriers(cluster: Cluster) {
    const MEMBERS: usize = 4;
    const ROUNDS: u64 = 25;
    let ports: Vec<Port> = (0..MEMBERS as u8).map(|u| cluster.open(u, 2)).collect();
    let group = Group::new(ports.iter().map(member))
        .unwrap()
        .with_timeout(BOUND);
    let algorithms = [
        Algorithm::PairwiseExchange,
        Algorithm::GatherBroadcast {
            dimension: 1,
            root: 0,
        },
        Algorithm::GatherBroadcast {
            dimension: 3,
            root: 2,
        },
        Algorithm::Dissemination { n: 1 },
        Algorithm::Dissemination { n: 3 },
    ];
    let entered: Arc<Vec<AtomicU64>> = Arc::new((0..MEMBERS).map(|_| AtomicU64::new(0)).collect());
    let start = Arc::new(ThreadBarrier::new(MEMBERS));
    on_every_port(ports, move |rank, mut port| {
        let (group, entered, start) = (group.clone(), entered.clone(), start.clone());
        start.wait();
        let mut count = 0;
        for algorithm in algorithms {
            let options = group.options().with_algorithm(algorithm);
            for round in 0..ROUNDS {
                count += 1;
                entered[rank].store(count, Ordering::SeqCst);
                if round % 2 == 0 {
                    port.barrier_with(&group, &options)
                } else {
                    port.host_barrier(&group, &options)
                }
                .unwrap_or_else(|e| panic!("rank {rank} {algorithm:?} {round}: {e}"));
                for (other, their) in entered.iter().enumerate() {
                    let their = their.load(Ordering::SeqCst);
                    assert!(
                        their >= count,
                        "rank {rank} left barrier {count} ({algorithm:?}) before rank \
                         {other} entered it (it entered {their})"
                    );
                }
            }
        }
        // Nothing of the barriers leaked out to the caller.
        assert!(port.receive().unwrap().is_none());
    });
}

/// The NIC takes at most 64 receive buffers per port; a barrier buffer provided behind more waits
/// in the receive ring until messages free room. The barrier is posted again a number of times,
/// then refused as busy, and works once the ring moves.
#[test]
fn a_barrier_buffer_stuck_behind_receive_buffers_is_reported_and_works_once_they_move() {
    const BUFFERS: u32 = 100;
    let cluster = Cluster::new("stuck", 2);
    let mut stuck = cluster.open(0, 1);
    let mut peer = cluster.open(1, 1);
    for tag in 0..BUFFERS {
        let buffer = stuck.dma_alloc(128).unwrap();
        stuck
            .provide_receive_buffer(buffer, SIZE, Priority::LOW, tag)
            .unwrap();
    }
    let group = Group::new([member(&stuck), member(&peer)])
        .unwrap()
        .with_timeout(BOUND);
    let started = Instant::now();
    match stuck.barrier(&group) {
        Err(BarrierError::Refused { status }) => assert_eq!(status, Status::BARRIER_BUSY),
        other => panic!("{other:?}"),
    }
    eprintln!("refused after {:?}", started.elapsed());
    // The peer's messages take buffers, the ring moves, the barrier buffer reaches the NIC.
    let to = member(&stuck);
    for seq in 0..BUFFERS {
        let buffer = peer.dma_alloc(128).unwrap();
        peer.send(
            buffer,
            8,
            SIZE,
            Priority::LOW,
            to.node,
            to.port,
            u64::from(seq),
        )
        .unwrap();
        if peer.send_tokens() == 0 {
            assert!(matches!(blocking(&mut peer), Event::Sent { .. }));
        }
    }
    let peer_group = group.clone();
    let other = std::thread::spawn(move || peer.barrier(&peer_group).unwrap());
    stuck.barrier(&group).unwrap();
    other.join().unwrap();
    let mut received = 0;
    while let Some(event) = stuck.receive().unwrap() {
        assert!(matches!(event, Event::Received { .. }), "{event:?}");
        received += 1;
    }
    assert_eq!(received, BUFFERS);
}
