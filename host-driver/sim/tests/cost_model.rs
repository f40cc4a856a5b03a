//! The barrier cost model (`nicbar_sim::cost`): its schedules are `compile`'s, it puts on the
//! wire exactly what the real firmware puts there, it reduces to the paper's equations 1-2 where
//! they apply, its queues behave as serial servers, and the fit is reproduced by the simulator.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use firmware::{Config, Hal};
use nicbar_schedule::{Algorithm, compile};
use nicbar_sim::cost::allreduce::simulate_allreduce;
use nicbar_sim::cost::engine::{Mode, simulate, simulate_traced};
use nicbar_sim::cost::figures;
use nicbar_sim::cost::params::{CostParams, FitAssumptions, fit};
use nicbar_sim::cost::schedules::{
    CompiledSchedules, FormulaSchedules, SchedulePolicy, ScheduleSource, group,
};
use nicbar_sim::cost::sweep::{run_algorithm, run_size};
use nicbar_sim::host::HostRings;
use nicbar_sim::rng::Rng;
use nicbar_sim::world::{Happening, WireFaults, World};
use shared_abi::event::EventKind;
use shared_abi::packet::{Packet, PacketKind};
use shared_abi::schedule::{MAX_SCHEDULE_STEPS, Step};
use shared_abi::token::{ReceiveKind, ReceiveToken, SendKind, SendToken};

/// Every algorithm worth trying at `nodes`: PE, GB over a few dimensions and roots, dissemination
/// n = 1..=4.
fn algorithms(nodes: usize) -> Vec<Algorithm> {
    let mut out = vec![Algorithm::PairwiseExchange];
    let mut dimensions = vec![1, 2, 3, 4, 7, nodes - 1, 63];
    dimensions.retain(|&d| d >= 1 && d < nodes && d <= 63);
    dimensions.sort_unstable();
    dimensions.dedup();
    for dimension in dimensions {
        let mut roots = vec![0, nodes / 2, nodes - 1];
        roots.dedup();
        for root in roots {
            out.push(Algorithm::GatherBroadcast { dimension, root });
        }
    }
    for n in 1..=4 {
        if n < nodes {
            out.push(Algorithm::Dissemination { n });
        }
    }
    out
}

fn fitted() -> nicbar_sim::cost::params::Fit {
    fit(FitAssumptions::default()).expect("the default fit")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

#[test]
fn formulas_equal_compile_at_every_rank_up_to_130_nodes() {
    let mut checked = 0;
    for nodes in 2..=130 {
        for algorithm in algorithms(nodes) {
            let compiled = CompiledSchedules::new(algorithm, nodes).unwrap();
            let formulas = FormulaSchedules::new(algorithm, nodes).unwrap();
            assert_eq!(formulas.ranks(), nodes);
            for rank in 0..nodes {
                assert_eq!(
                    formulas.steps(rank),
                    compiled.steps(rank),
                    "{algorithm:?} {nodes} rank {rank}"
                );
                for index in 0..compiled.steps(rank) {
                    assert_eq!(
                        formulas.step(rank, index),
                        compiled.step(rank, index),
                        "{algorithm:?} {nodes} rank {rank} step {index}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
}

#[test]
fn formulas_equal_compile_at_sampled_ranks_of_large_groups() {
    for nodes in [4097, 5000, 10_000, 32_767, 50_000, 65_535, 65_536] {
        for algorithm in algorithms(nodes) {
            let formulas = FormulaSchedules::new(algorithm, nodes).unwrap();
            let checked = formulas.verify_sample(nodes as u64).unwrap();
            assert!(checked >= 16, "{algorithm:?} {nodes}: {checked}");
        }
    }
}

#[test]
fn formulas_refuse_what_compile_refuses() {
    for (algorithm, nodes) in [
        (Algorithm::PairwiseExchange, 1),
        (
            Algorithm::GatherBroadcast {
                dimension: 64,
                root: 0,
            },
            1000,
        ),
        (
            Algorithm::GatherBroadcast {
                dimension: 5,
                root: 5,
            },
            5,
        ),
        (Algorithm::Dissemination { n: 3 }, 3),
        (Algorithm::PairwiseExchange, 65_537),
    ] {
        assert!(
            FormulaSchedules::new(algorithm, nodes).is_err(),
            "{algorithm:?} {nodes}"
        );
        assert!(
            CompiledSchedules::new(algorithm, nodes).is_err(),
            "{algorithm:?} {nodes}"
        );
    }
}

/// Runs one barrier of `algorithm` on `nodes` simulated NICs running the real firmware over a
/// loss-free wire, every rank entering at time 0; returns every barrier packet put on the wire as
/// (source node, destination node, round), counted.
fn firmware_barrier_packets(algorithm: Algorithm, nodes: usize) -> BTreeMap<(u32, u32, u8), u32> {
    let config = Config {
        retransmit_timeout: Duration::from_micros(300),
        give_up_after: Duration::from_millis(300),
        receiver_not_ready_timeout: Duration::from_millis(300),
        retry_interval: Duration::from_micros(100),
        default_barrier_timeout: Duration::from_millis(500),
        fabric_key: None,
    };
    let mut world = World::new(7, nodes, config, WireFaults::NONE, Duration::from_micros(5));
    let mut rings: Vec<HostRings> = (0..nodes).map(|node| world.open_port(node, 0)).collect();
    let members = group(nodes).unwrap();
    for (rank, rings) in rings.iter_mut().enumerate() {
        let mut steps = [Step::default(); MAX_SCHEDULE_STEPS];
        let count = compile(algorithm, &members, rank, &mut steps).unwrap();
        let memory = world.nodes[rank].nic.hal().port_memory(0).unwrap();
        let offset = rings.write_schedule(memory, &steps[..count]).unwrap();
        let buffer = ReceiveToken {
            kind: ReceiveKind::BARRIER,
            ..ReceiveToken::default()
        };
        rings.post_receive(memory, &buffer).unwrap();
        let token = SendToken {
            kind: SendKind::BARRIER,
            length: (count as u32).into(),
            buffer: offset.into(),
            context: 1u64.into(),
            ..SendToken::default()
        };
        rings.post_send(memory, &token).unwrap();
        world.doorbell(rank);
    }
    let mut packets = BTreeMap::new();
    let mut completed = vec![false; nodes];
    let mut quiet_until = None;
    while let Some(happening) = world.next_happening() {
        // Once everyone is done, run 1 ms more so that a late retransmission would be counted.
        if quiet_until.is_some_and(|until| world.now().as_nanos() > until) {
            break;
        }
        let deadline = Duration::from_millis(100).as_nanos() as u64;
        assert!(
            world.now().as_nanos() < deadline,
            "{algorithm:?} {nodes}: no completion after 100 ms of virtual time"
        );
        match happening {
            Happening::Arrive { node, bytes } => {
                let packet = Packet::new_checked(&bytes[..]).unwrap();
                let header = packet.header();
                if header.kind == PacketKind::BARRIER {
                    *packets
                        .entry((
                            u32::from(header.src_node.get()),
                            u32::from(header.dst_node.get()),
                            header.aux,
                        ))
                        .or_insert(0) += 1;
                }
                world.arrive(node, &bytes);
            }
            Happening::Poll { node } => world.poll(node),
            Happening::Host { .. } | Happening::Action { .. } => {}
        }
        for (node, rings) in rings.iter_mut().enumerate() {
            let memory = world.nodes[node].nic.hal().port_memory(0).unwrap();
            while let Some(event) = rings.next_event(memory).unwrap() {
                if event.kind == EventKind::BARRIER_COMPLETED {
                    assert!(!completed[node], "node {node} completed twice");
                    completed[node] = true;
                } else {
                    assert_ne!(event.kind, EventKind::BARRIER_FAILED, "node {node}");
                }
            }
        }
        if quiet_until.is_none() && completed.iter().all(|c| *c) {
            quiet_until = Some(world.now().as_nanos() + 1_000_000);
        }
    }
    assert!(
        completed.iter().all(|c| *c),
        "{algorithm:?} {nodes}: not every node completed"
    );
    packets
}

#[test]
fn the_model_puts_on_the_wire_exactly_what_the_real_firmware_does() {
    let params = fitted().lanai43;
    let mut compared = 0;
    for nodes in [2, 3, 4, 5, 7, 8, 12, 16, 24, 31, 33, 64] {
        for algorithm in algorithms(nodes) {
            let schedules = CompiledSchedules::new(algorithm, nodes).unwrap();
            let firmware = firmware_barrier_packets(algorithm, nodes);
            for mode in [Mode::Nic, Mode::Host] {
                let (outcome, trace) = simulate_traced(&schedules, &params, mode).unwrap();
                let mut model = BTreeMap::new();
                for packet in &trace {
                    *model
                        .entry((packet.from, packet.to, packet.round))
                        .or_insert(0u32) += 1;
                }
                assert_eq!(
                    outcome.packets,
                    firmware
                        .values()
                        .map(|&count| u64::from(count))
                        .sum::<u64>(),
                    "{algorithm:?} {nodes} {mode}: packet count"
                );
                assert_eq!(model, firmware, "{algorithm:?} {nodes} {mode}: packets");
            }
            compared += 1;
        }
    }
    assert!(compared > 100, "{compared}");
}

#[test]
fn nic_based_pairwise_exchange_beats_host_based_from_four_nodes() {
    let fit = fitted();
    let mut sizes: Vec<usize> = (4..=130).collect();
    sizes.extend([255, 256, 257, 1000, 1024, 4096, 5000, 16_384]);
    for (card, params) in [("LANai 4.3", fit.lanai43), ("LANai 7.2", fit.lanai72)] {
        for &nodes in &sizes {
            let (pair, _) = run_algorithm(
                Algorithm::PairwiseExchange,
                nodes,
                &params,
                SchedulePolicy::Auto,
            )
            .unwrap();
            assert!(
                pair.nic.latency <= pair.host.latency,
                "{card} {nodes}: NIC {} > host {}",
                pair.nic.latency,
                pair.host.latency
            );
        }
    }
}

/// `⌈log_{n+1} nodes⌉`.
fn dissemination_rounds(nodes: usize, n: usize) -> u32 {
    let (mut rounds, mut span) = (0, 1usize);
    while span < nodes {
        span *= n + 1;
        rounds += 1;
    }
    rounds
}

/// Levels below the root of a gather-broadcast tree of `dimension` over `nodes`: the depth of the
/// last relative rank, which is the deepest.
fn tree_depth(nodes: usize, dimension: usize) -> u32 {
    let (mut depth, mut node) = (0, nodes - 1);
    while node != 0 {
        node = (node - 1) / dimension;
        depth += 1;
    }
    depth
}

/// The longest chain of messages through `schedules`: each rank's steps in order, a receive no
/// earlier than one hop after its matching send. Computed by relaxing every rank as far as it
/// goes until nothing moves; no queues, no costs, nothing shared with the engine.
fn critical_path_messages<S: ScheduleSource>(schedules: &S) -> u32 {
    let ranks = schedules.ranks();
    let mut index = vec![0usize; ranks];
    let mut hops = vec![0u32; ranks];
    let mut sent_current = vec![false; ranks];
    let mut sent: HashMap<(u32, u32, u8), u32> = HashMap::new();
    let mut progress = true;
    while progress {
        progress = false;
        for rank in 0..ranks {
            while index[rank] < schedules.steps(rank) {
                let step = schedules.step(rank, index[rank]);
                if step.sends() && !sent_current[rank] {
                    sent.insert((rank as u32, step.peer, step.round), hops[rank]);
                    sent_current[rank] = true;
                    progress = true;
                }
                if step.receives() {
                    let Some(&at) = sent.get(&(step.peer, rank as u32, step.round)) else {
                        break;
                    };
                    hops[rank] = hops[rank].max(at + 1);
                }
                index[rank] += 1;
                sent_current[rank] = false;
                progress = true;
            }
        }
    }
    for (rank, reached) in index.iter().enumerate() {
        assert_eq!(
            *reached,
            schedules.steps(rank),
            "rank {rank} never finishes"
        );
    }
    hops.into_iter().max().unwrap_or(0)
}

#[test]
fn with_only_network_latency_is_the_critical_path_in_messages() {
    let network = 3.5;
    let params = CostParams::network_only(network);
    let mut sizes: Vec<usize> = (2..=70).collect();
    sizes.extend([100, 128, 1000, 1024, 4096, 4097, 20_000]);
    for nodes in sizes {
        let mut algorithms = vec![Algorithm::PairwiseExchange];
        algorithms.extend((1..=4usize.min(nodes - 1)).map(|n| Algorithm::Dissemination { n }));
        for dimension in [1, 2, 3, 5, 63].into_iter().filter(|&d| d < nodes) {
            // A chain of 20,000 is slow to relax and says nothing new.
            if dimension > 1 || nodes <= 2000 {
                algorithms.push(Algorithm::GatherBroadcast { dimension, root: 0 });
            }
        }
        for algorithm in algorithms {
            let schedules = FormulaSchedules::new(algorithm, nodes).unwrap();
            let messages = critical_path_messages(&schedules);
            // The closed forms where there are some.
            match algorithm {
                Algorithm::PairwiseExchange if nodes.is_power_of_two() => {
                    assert_eq!(messages, nodes.ilog2(), "{nodes}");
                }
                Algorithm::Dissemination { n } => {
                    assert_eq!(
                        messages,
                        dissemination_rounds(nodes, n),
                        "{algorithm:?} {nodes}"
                    );
                }
                Algorithm::GatherBroadcast { dimension, .. } => {
                    assert_eq!(
                        messages,
                        2 * tree_depth(nodes, dimension),
                        "{algorithm:?} {nodes}"
                    );
                }
                Algorithm::PairwiseExchange => {
                    let floor = nodes.ilog2();
                    assert!(
                        (floor + 1..=floor + 2).contains(&messages),
                        "{nodes}: {messages}"
                    );
                }
            }
            let (pair, _) = run_algorithm(algorithm, nodes, &params, SchedulePolicy::Auto).unwrap();
            for (mode, outcome) in [(Mode::Nic, pair.nic), (Mode::Host, pair.host)] {
                assert!(
                    close(outcome.latency, f64::from(messages) * network),
                    "{algorithm:?} {nodes} {mode}: {} µs, expected {messages} × {network}",
                    outcome.latency
                );
            }
        }
    }
}

#[test]
fn equations_1_and_2_hold_exactly_for_pairwise_exchange_at_powers_of_two() {
    let mut rng = Rng::new(11);
    let mut parameter_sets = vec![fitted().lanai43, fitted().lanai72];
    for _ in 0..6 {
        let mut costs = [0.0; 7];
        for cost in &mut costs {
            *cost = rng.below(40_000) as f64 / 1000.0;
        }
        let [send, sdma, network, recv, rdma, hrecv, step] = costs;
        parameter_sets.push(CostParams {
            send,
            sdma,
            network,
            recv,
            rdma,
            hrecv,
            step,
            xmit: 0.0,
            busy_share: [1.0, 0.5, 0.0][rng.below(3) as usize],
        });
    }
    for base in parameter_sets {
        for with_step in [false, true] {
            let params = CostParams {
                step: if with_step { base.step } else { 0.0 },
                ..base
            };
            for log in 1..=14u32 {
                let nodes = 1usize << log;
                let (pair, _) = run_algorithm(
                    Algorithm::PairwiseExchange,
                    nodes,
                    &params,
                    SchedulePolicy::Auto,
                )
                .unwrap();
                // Equation 2 (with the per-step cost when it is not zero) and equation 1.
                assert!(
                    close(pair.nic.latency, params.equation_2(log)),
                    "{params:?} {nodes}: NIC {} vs {}",
                    pair.nic.latency,
                    params.equation_2(log)
                );
                assert!(
                    close(pair.host.latency, params.equation_1(log)),
                    "{params:?} {nodes}: host {} vs {}",
                    pair.host.latency,
                    params.equation_1(log)
                );
                if !with_step {
                    let paper_equation_2 = params.send
                        + f64::from(log) * (params.network + params.recv)
                        + params.rdma
                        + params.hrecv;
                    assert!(close(pair.nic.latency, paper_equation_2));
                }
            }
        }
    }
}

#[test]
fn the_simulator_reproduces_the_three_fitted_figures() {
    let fit = fitted();
    let eight = |params| {
        run_algorithm(
            Algorithm::PairwiseExchange,
            8,
            &params,
            SchedulePolicy::Compiled,
        )
        .unwrap()
        .0
    };
    let lanai72 = eight(fit.lanai72);
    assert!(
        close(lanai72.nic.latency, figures::LANAI72_PE8_NIC_US),
        "{lanai72:?}"
    );
    assert!(
        close(lanai72.host.latency, figures::LANAI72_PE8_HOST_US),
        "{lanai72:?}"
    );
    let lanai43 = eight(fit.lanai43);
    assert!(
        close(lanai43.factor(), figures::LANAI43_PE8_FACTOR),
        "{lanai43:?}"
    );
}

#[test]
fn the_nic_processor_is_one_serial_server() {
    // A star (gather-broadcast of dimension N-1): the root's NIC takes N-1 packets one after
    // another. With only Recv costing, the last gather packet is taken at (N-1)·Recv, the
    // broadcast costs nothing to send, and each leaf takes its broadcast packet in one Recv.
    for nodes in [2, 5, 17, 64] {
        let star = Algorithm::GatherBroadcast {
            dimension: nodes - 1,
            root: 0,
        };
        let recv_only = CostParams {
            recv: 1.0,
            ..CostParams::ZERO
        };
        let schedules = CompiledSchedules::new(star, nodes).unwrap();
        let nic = simulate(&schedules, &recv_only, Mode::Nic).unwrap();
        assert!(close(nic.latency, nodes as f64), "{nodes}: {nic:?}");
        // Host-based with only SDMA costing: the leaves' gathers go out in parallel (one SDMA
        // each, on their own NICs), then the root's N-1 broadcast sends queue on its one NIC.
        let sdma_only = CostParams {
            sdma: 1.0,
            ..CostParams::ZERO
        };
        let host = simulate(&schedules, &sdma_only, Mode::Host).unwrap();
        assert!(close(host.latency, nodes as f64), "{nodes}: {host:?}");
        // And the host pipelines its sends through the NIC (§6): with Send = SDMA = 1, the
        // gathers are in at 2, the root posts the k-th broadcast at 2 + k and its NIC finishes it
        // at 3 + k, so the last leaf has its message at N + 2, not at 2 + 2(N-1).
        let both = CostParams {
            send: 1.0,
            sdma: 1.0,
            ..CostParams::ZERO
        };
        let host = simulate(&schedules, &both, Mode::Host).unwrap();
        assert!(close(host.latency, nodes as f64 + 2.0), "{nodes}: {host:?}");
        // With a busy share of 0, Recv is all packet-interface time: nothing queues at the root,
        // every gather packet is in at Recv and every leaf has its broadcast at 2 Recv.
        let pure_delay = CostParams {
            busy_share: 0.0,
            ..recv_only
        };
        let nic = simulate(&schedules, &pure_delay, Mode::Nic).unwrap();
        assert!(close(nic.latency, 2.0), "{nodes}: {nic:?}");
    }
}

#[test]
fn results_do_not_depend_on_the_worker_count_or_the_schedule_source() {
    let params = fitted().lanai43;
    for nodes in [6, 48, 300] {
        let one = run_size(nodes, &params, SchedulePolicy::Compiled, 1).unwrap();
        let two = run_size(nodes, &params, SchedulePolicy::Compiled, 2).unwrap();
        let formulas = run_size(nodes, &params, SchedulePolicy::Formula, 2).unwrap();
        assert_eq!(one.pairwise, two.pairwise);
        assert_eq!(one.gather_broadcast, two.gather_broadcast);
        assert_eq!(one.dissemination, two.dissemination);
        assert_eq!(one.pairwise, formulas.pairwise);
        assert_eq!(one.gather_broadcast, formulas.gather_broadcast);
        assert_eq!(one.dissemination, formulas.dissemination);
        assert!(one.compiled && !formulas.compiled && formulas.checked_ranks > 0);
    }
}

#[test]
fn bad_costs_are_refused() {
    let schedules = CompiledSchedules::new(Algorithm::PairwiseExchange, 4).unwrap();
    let params = CostParams {
        recv: f64::NAN,
        ..CostParams::ZERO
    };
    assert!(simulate(&schedules, &params, Mode::Nic).is_err());
}

/// The allreduce a user models is the pairwise exchange barrier plus its combines. With no
/// combine cost it takes the barrier's time at every size, NIC-based and host-based (the same
/// packets between the same ranks). With a combine cost `c`, at a power of two it takes exactly
/// the barrier's time plus `log2 N · c` (one combine per round on the critical path, and nothing
/// queues behind one); NIC-based, at any size, never less than the barrier plus `⌈log2 N⌉ · c`
/// (the fix-up's combine and one per round, on one serial processor). It grows with the group
/// as the barrier does: from one power of two to the next, and no group is faster than the
/// largest power of two within it (the fix-up's two extra messages make 3 members slower than 4).
#[test]
fn allreduce_is_the_pairwise_exchange_barrier_plus_its_combines_and_grows_with_the_group() {
    let fit = fitted();
    let combine = 1.5;
    for (card, params) in [("LANai 4.3", fit.lanai43), ("LANai 7.2", fit.lanai72)] {
        for mode in [Mode::Nic, Mode::Host] {
            let mut at_power = 0.0;
            for nodes in 2..=130usize {
                let barrier = simulate(
                    &CompiledSchedules::new(Algorithm::PairwiseExchange, nodes).unwrap(),
                    &params,
                    mode,
                )
                .unwrap()
                .latency;
                let free = simulate_allreduce(nodes, &params, mode, 0.0).unwrap();
                assert!(
                    close(free.latency, barrier),
                    "{card} {mode} {nodes}: allreduce without combine cost {} != barrier {barrier}",
                    free.latency
                );
                let reduce = simulate_allreduce(nodes, &params, mode, combine)
                    .unwrap()
                    .latency;
                let rounds = f64::from(nodes.next_power_of_two().trailing_zeros());
                let combined = barrier + rounds * combine;
                if nodes.is_power_of_two() {
                    assert!(
                        close(reduce, combined),
                        "{card} {mode} {nodes}: allreduce {reduce} != barrier {barrier} + \
                         {rounds} · {combine}"
                    );
                    at_power = reduce;
                } else if mode == Mode::Nic {
                    assert!(
                        reduce >= combined - 1e-9,
                        "{card} {mode} {nodes}: allreduce {reduce} < barrier {barrier} + \
                         {rounds} · {combine}"
                    );
                }
                assert!(
                    reduce >= at_power,
                    "{card} {mode}: allreduce at {nodes} ({reduce}) faster than at the power of \
                     two below ({at_power})"
                );
            }
        }
    }
}
