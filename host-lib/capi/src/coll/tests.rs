//! The collectives on an emulated NIC in this process: one thread per rank, each with its own
//! port on its own NIC, every algorithm against the result MPI defines, computed here.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nicbar_emulator::{Emulator, EmulatorConfig, FaultConfig};
use nicbar_rs::{Member, NodeId, Port};

use super::algorithms::{self, Alltoall, Bcast, Tree};
use super::{CollEndpoint, Op, transfer};

/// The byte rank `rank` contributes at `index` for `salt`: every rank's, every position's and
/// every operation's bytes differ.
fn byte(rank: usize, index: usize, salt: usize) -> u8 {
    (rank.wrapping_mul(131) ^ index.wrapping_mul(31) ^ (index >> 8) ^ salt.wrapping_mul(7)) as u8
}

fn data(rank: usize, length: usize, salt: usize) -> Vec<u8> {
    (0..length).map(|i| byte(rank, i, salt)).collect()
}

/// Runs `body(rank, endpoint, members)` on `size` threads, each with a port of its own NIC of
/// one in-process daemon (with `faults`, if any).
fn run_ranks(
    name: &str,
    size: usize,
    faults: Option<FaultConfig>,
    body: impl Fn(usize, &mut CollEndpoint, &[Member]) + Send + Sync + 'static,
) {
    run_ranks_with(name, size, |config| config.faults = faults, body);
}

/// As [`run_ranks`], the daemon configured by `configure`.
fn run_ranks_with(
    name: &str,
    size: usize,
    configure: impl FnOnce(&mut EmulatorConfig),
    body: impl Fn(usize, &mut CollEndpoint, &[Member]) + Send + Sync + 'static,
) {
    let dir: PathBuf =
        std::env::temp_dir().join(format!("nicbar-coll-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("control.sock");
    let mut config = EmulatorConfig::in_process(&socket, size as u16);
    configure(&mut config);
    let daemon = Emulator::spawn(config).expect("the emulator starts");
    let members: Arc<Vec<Member>> = Arc::new(
        (0..size)
            .map(|n| Member::new(NodeId::new(n as u16), nicbar_rs::PortId(1)))
            .collect(),
    );
    let body = Arc::new(body);
    // Every port opens before any rank sends, as in MPI_Init (a send to a port not open yet
    // fails at once, as one to a closed port).
    let opened = Arc::new(std::sync::Barrier::new(size));
    let threads: Vec<_> = (0..size)
        .map(|rank| {
            let (socket, members, body) = (socket.clone(), members.clone(), body.clone());
            let opened = opened.clone();
            std::thread::spawn(move || {
                let port = Port::open_at(&socket, rank as u8, 1).expect("the port opens");
                let mut endpoint = CollEndpoint::new(port).expect("the endpoint sets up");
                opened.wait();
                body(rank, &mut endpoint, &members);
                endpoint.port.close().expect("the port closes");
            })
        })
        .collect();
    let mut failed = None;
    for (rank, thread) in threads.into_iter().enumerate() {
        if thread.join().is_err() {
            failed.get_or_insert(rank);
        }
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(rank) = failed {
        panic!("rank {rank} failed ({name}, {size} ranks)");
    }
}

/// An operation of the test communicator (context 5), sequence `sequence`.
fn op<'a>(
    endpoint: &'a mut CollEndpoint,
    members: &'a [Member],
    sequence: u32,
    idle: &'a mut dyn FnMut(),
) -> Op<'a> {
    Op::new(
        endpoint,
        members,
        5,
        sequence,
        Some(Duration::from_secs(30)),
        idle,
    )
    .unwrap()
}

/// Nothing, a byte, one segment's payload exactly, one byte more, and many segments.
const LENGTHS: [usize; 5] = [
    0,
    1,
    transfer::SEGMENT_PAYLOAD,
    transfer::SEGMENT_PAYLOAD + 1,
    50_001,
];

#[test]
fn every_broadcast_reaches_every_rank_from_every_root() {
    for size in [2, 3, 5] {
        run_ranks("bcast", size, None, move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            for algorithm in [
                Bcast::Linear,
                Bcast::Binomial,
                Bcast::Binary,
                Bcast::SplitBinary,
                Bcast::Pipeline,
            ] {
                for length in LENGTHS {
                    for root in 0..size {
                        sequence += 1;
                        let salt = sequence as usize;
                        let mut buffer = if rank == root {
                            data(root, length, salt)
                        } else {
                            vec![0xee; length]
                        };
                        let call = op(endpoint, members, sequence, &mut idle);
                        algorithms::bcast(call, &mut buffer, root, algorithm, 8192).unwrap();
                        assert_eq!(
                            buffer,
                            data(root, length, salt),
                            "{algorithm:?} of {length} bytes from {root} at rank {rank}"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn scatter_and_gather_move_every_block_in_and_out_of_place() {
    for size in [3, 4] {
        run_ranks("scatter", size, None, move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            for algorithm in [Tree::Flat, Tree::Binomial] {
                for block in [0, 3, 5000] {
                    for root in 0..size {
                        for in_place in [false, true] {
                            sequence += 1;
                            let salt = sequence as usize;
                            // Scatter: block r of the root's buffer goes to rank r.
                            let send = data(root, block * size, salt);
                            let mut receive = vec![0xee; block];
                            let at_root = rank == root;
                            let call = op(endpoint, members, sequence, &mut idle);
                            algorithms::scatter(
                                call,
                                at_root.then_some(&send[..]),
                                (!(at_root && in_place)).then_some(&mut receive[..]),
                                block,
                                root,
                                algorithm,
                            )
                            .unwrap();
                            if !(at_root && in_place) {
                                assert_eq!(receive, send[rank * block..(rank + 1) * block]);
                            }
                            // Gather: every rank's block to the root, in rank order.
                            sequence += 1;
                            let mine = data(rank, block, salt);
                            let mut gathered = vec![0xee; block * size];
                            if at_root && in_place {
                                gathered[rank * block..(rank + 1) * block].copy_from_slice(&mine);
                            }
                            let call = op(endpoint, members, sequence, &mut idle);
                            algorithms::gather(
                                call,
                                (!(at_root && in_place)).then_some(&mine[..]),
                                at_root.then_some(&mut gathered[..]),
                                block,
                                root,
                                algorithm,
                            )
                            .unwrap();
                            if at_root {
                                let expected: Vec<u8> =
                                    (0..size).flat_map(|r| data(r, block, salt)).collect();
                                assert_eq!(gathered, expected, "{algorithm:?} {block} root {root}");
                            }
                        }
                    }
                }
            }
        });
    }
}

#[test]
fn the_v_forms_move_blocks_of_every_length() {
    let size = 3;
    run_ranks("vforms", size, None, move |rank, endpoint, members| {
        let mut sequence = 0;
        let mut idle = || {};
        // Rank r's block is r * 3000 bytes long: rank 0's is empty.
        let length = |r: usize| r * 3000;
        for root in 0..size {
            sequence += 1;
            let salt = sequence as usize;
            let blocks: Vec<Vec<u8>> = (0..size)
                .map(|r| data(root + 10 * r, length(r), salt))
                .collect();
            let views: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
            let mut receive = vec![0xee; length(rank)];
            let call = op(endpoint, members, sequence, &mut idle);
            algorithms::scatterv(
                call,
                (rank == root).then_some(&views[..]),
                Some(&mut receive[..]),
                root,
            )
            .unwrap();
            assert_eq!(receive, blocks[rank]);

            sequence += 1;
            let mine = data(rank, length(rank), salt);
            let mut gathered: Vec<Vec<u8>> = (0..size).map(|r| vec![0xee; length(r)]).collect();
            let mut views: Vec<&mut [u8]> = gathered.iter_mut().map(|b| &mut b[..]).collect();
            let call = op(endpoint, members, sequence, &mut idle);
            algorithms::gatherv(
                call,
                Some(&mine),
                (rank == root).then_some(&mut views[..]),
                root,
            )
            .unwrap();
            if rank == root {
                for (r, block) in gathered.iter().enumerate() {
                    assert_eq!(*block, data(r, length(r), salt));
                }
            }
        }
        for algorithm in [Alltoall::Linear, Alltoall::Pairwise] {
            sequence += 1;
            let salt = sequence as usize;
            // Rank i sends (i + j) * 1000 bytes to rank j.
            let sends: Vec<Vec<u8>> = (0..size)
                .map(|j| data(rank * 10 + j, (rank + j) * 1000, salt))
                .collect();
            let views: Vec<&[u8]> = sends.iter().map(|b| &b[..]).collect();
            let mut receives: Vec<Vec<u8>> =
                (0..size).map(|i| vec![0xee; (i + rank) * 1000]).collect();
            let mut targets: Vec<&mut [u8]> = receives.iter_mut().map(|b| &mut b[..]).collect();
            let call = op(endpoint, members, sequence, &mut idle);
            algorithms::alltoallv(call, &views, &mut targets, algorithm).unwrap();
            for (i, block) in receives.iter().enumerate() {
                assert_eq!(*block, data(i * 10 + rank, (i + rank) * 1000, salt));
            }
        }
    });
}

#[test]
fn every_alltoall_delivers_every_block() {
    for size in [2, 3, 5] {
        run_ranks("alltoall", size, None, move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            for algorithm in [Alltoall::Linear, Alltoall::Pairwise, Alltoall::Bruck] {
                for block in [0, 1, 5000] {
                    sequence += 1;
                    let salt = sequence as usize;
                    let send = data(rank, block * size, salt);
                    let mut receive = vec![0xee; block * size];
                    let call = op(endpoint, members, sequence, &mut idle);
                    algorithms::alltoall(call, &send, &mut receive, block, algorithm).unwrap();
                    for from in 0..size {
                        assert_eq!(
                            receive[from * block..(from + 1) * block],
                            data(from, block * size, salt)[rank * block..(rank + 1) * block],
                            "{algorithm:?} {block} from {from} at {rank}"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn collectives_survive_a_faulty_wire() {
    // NICBAR_COLL_SEED=N replays a run.
    let seed = std::env::var("NICBAR_COLL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 & 0xffff)
        });
    println!("fault seed {seed} (NICBAR_COLL_SEED={seed} replays it)");
    let faults = FaultConfig {
        loss: 0.05,
        duplicate: 0.05,
        reorder: 0.05,
        ..FaultConfig::none(seed)
    };
    run_ranks("faulty", 4, Some(faults), move |rank, endpoint, members| {
        let mut idle = || {};
        for (sequence, root) in (1..=4u32).zip([0, 1, 2, 3]) {
            let mut buffer = if rank == root {
                data(root, 100_000, sequence as usize)
            } else {
                vec![0; 100_000]
            };
            let call = op(endpoint, members, sequence, &mut idle);
            algorithms::bcast(call, &mut buffer, root, Bcast::SplitBinary, 16_384).unwrap();
            assert_eq!(
                buffer,
                data(root, 100_000, sequence as usize),
                "seed {seed}"
            );
        }
    });
}

#[test]
fn a_receiver_that_takes_nothing_for_a_while_still_gets_everything() {
    // The NIC gives up on a segment whose receiver has no buffer after 100 ms here; the
    // receiver stays away six times that long, so segments are given up on and sent again.
    run_ranks_with(
        "slow",
        2,
        |config| config.nic.receiver_not_ready_timeout = Duration::from_millis(100),
        |rank, endpoint, members| {
            let mut idle = || {};
            let length = 1 << 20;
            let mut buffer = if rank == 0 {
                data(0, length, 1)
            } else {
                std::thread::sleep(Duration::from_millis(600));
                vec![0; length]
            };
            let call = op(endpoint, members, 1, &mut idle);
            algorithms::bcast(call, &mut buffer, 0, Bcast::Linear, 0).unwrap();
            assert_eq!(buffer, data(0, length, 1));
            if rank == 0 {
                // The sender's last segments are delivered before it may close: a second
                // operation the receiver answers.
                let mut reply = vec![0; 8];
                let call = op(endpoint, members, 2, &mut idle);
                algorithms::bcast(call, &mut reply, 1, Bcast::Linear, 0).unwrap();
                assert!(
                    endpoint.transfer_counters().resent > 0,
                    "no segment was sent again"
                );
            } else {
                let mut reply = data(1, 8, 2);
                let call = op(endpoint, members, 2, &mut idle);
                algorithms::bcast(call, &mut reply, 1, Bcast::Linear, 0).unwrap();
            }
        },
    );
}
