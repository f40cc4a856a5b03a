//! The collectives of `nicbar::coll` on an emulated NIC in this process: one thread per rank,
//! each with its own port on its own NIC, every algorithm against the result MPI defines,
//! computed here; and the transfers under them driven step by step (forwarding, rendezvous
//! with a peer gone, forged control messages, the limit on data nobody asked for).

mod common;

use std::net::UdpSocket;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nicbar::coll::transfer::{self, RENDEZVOUS_THRESHOLD};
use nicbar::coll::{self, Allreduce, Alltoall, Bcast, CollError, Endpoint, Op, Tree};
use nicbar::{Member, NodeId, Port};
use nicbar_emulator::{
    Emulator, EmulatorConfig, EmulatorHandle, FabricKey, FabricMap, FaultConfig,
};
use tempfile::TempDir;

/// The byte rank `rank` contributes at `index` for `salt`: every rank's, every position's and
/// every operation's bytes differ.
fn byte(rank: usize, index: usize, salt: usize) -> u8 {
    (rank.wrapping_mul(131) ^ index.wrapping_mul(31) ^ (index >> 8) ^ salt.wrapping_mul(7)) as u8
}

fn data(rank: usize, length: usize, salt: usize) -> Vec<u8> {
    (0..length).map(|i| byte(rank, i, salt)).collect()
}

/// Asserts that `receive` holds, block by block, what each of `size` ranks sent `rank` in an
/// all-to-all of `block`-byte blocks of [`data`] salted `salt`; `what` names the case.
fn assert_alltoall_received(
    receive: &[u8],
    rank: usize,
    size: usize,
    block: usize,
    salt: usize,
    what: &str,
) {
    for from in 0..size {
        assert!(
            receive[from * block..(from + 1) * block]
                == data(from, block * size, salt)[rank * block..(rank + 1) * block],
            "{what}: from {from} at {rank}"
        );
    }
}

/// Runs `body(rank, endpoint, members)` on `size` threads, each with a port of its own NIC of
/// one in-process daemon (with `faults`, if any).
fn run_ranks(
    name: &str,
    size: usize,
    faults: Option<FaultConfig>,
    body: impl Fn(usize, &mut Endpoint, &[Member]) + Send + Sync + 'static,
) {
    run_ranks_with(name, size, |config| config.faults = faults, body);
}

/// As [`run_ranks`], the daemon configured by `configure`.
fn run_ranks_with(
    name: &str,
    size: usize,
    configure: impl FnOnce(&mut EmulatorConfig),
    body: impl Fn(usize, &mut Endpoint, &[Member]) + Send + Sync + 'static,
) {
    let dir = common::temp_dir(&format!("nicbar-coll-{name}-"));
    let socket = dir.path().join("control.sock");
    let mut config = EmulatorConfig::in_process(&socket, size as u16);
    configure(&mut config);
    let daemon = Emulator::spawn(config).expect("the emulator starts");
    let places = (0..size).map(|rank| (socket.clone(), rank as u8)).collect();
    run_ranks_at(name, places, body);
    drop(daemon);
}

/// As [`run_ranks`], over two daemons (the first half of the ranks' NICs in one, the rest in
/// the other) that talk over UDP on the loopback interface, each through `faults` (seeded
/// apart).
fn run_ranks_across_daemons(
    name: &str,
    size: usize,
    faults: FaultConfig,
    body: impl Fn(usize, &mut Endpoint, &[Member]) + Send + Sync + 'static,
) {
    let dir = common::temp_dir(&format!("nicbar-coll-{name}-"));
    let mut fabric = FabricMap::new();
    for node in 0..size as u16 {
        let address = UdpSocket::bind("127.0.0.1:0")
            .and_then(|socket| socket.local_addr())
            .expect("a free UDP port");
        fabric.insert(NodeId::new(node), address);
    }
    let key = Some(FabricKey::new([0x5c; 32]));
    let half = size.div_ceil(2);
    let nodes: [Vec<NodeId>; 2] = [
        (0..half).map(|n| NodeId::new(n as u16)).collect(),
        (half..size).map(|n| NodeId::new(n as u16)).collect(),
    ];
    let mut sockets = Vec::new();
    let mut daemons = Vec::new();
    for (index, nodes) in nodes.iter().enumerate() {
        let socket = dir.path().join(format!("daemon{index}.sock"));
        let mut config = EmulatorConfig::on_fabric(&socket, fabric.clone(), nodes)
            .expect("the nodes are on the map");
        config.nic.fabric_key = key;
        config.faults = Some(FaultConfig {
            seed: faults.seed + index as u64,
            ..faults
        });
        daemons.push(Emulator::spawn(config).expect("the emulator starts"));
        sockets.push(socket);
    }
    let places = (0..size)
        .map(|rank| {
            let daemon = usize::from(rank >= half);
            (sockets[daemon].clone(), (rank - daemon * half) as u8)
        })
        .collect();
    run_ranks_at(name, places, body);
    drop(daemons);
}

/// Runs `body` on one thread per rank, rank `r`'s port 1 opened on the NIC unit `places[r].1`
/// of the daemon listening at `places[r].0`; fails naming the first rank that failed.
fn run_ranks_at(
    name: &str,
    places: Vec<(PathBuf, u8)>,
    body: impl Fn(usize, &mut Endpoint, &[Member]) + Send + Sync + 'static,
) {
    let size = places.len();
    let members: Arc<Vec<Member>> = Arc::new(
        (0..size)
            .map(|n| Member::new(NodeId::new(n as u16), nicbar::PortId(1)))
            .collect(),
    );
    let body = Arc::new(body);
    // Every port opens before any rank sends, as in MPI_Init (a send to a port not open yet
    // fails at once, as one to a closed port).
    let opened = Arc::new(std::sync::Barrier::new(size));
    let threads: Vec<_> = places
        .into_iter()
        .enumerate()
        .map(|(rank, (socket, unit))| {
            let (members, body) = (members.clone(), body.clone());
            let opened = opened.clone();
            std::thread::spawn(move || {
                let port = Port::open_at(&socket, unit, 1).expect("the port opens");
                let mut endpoint = Endpoint::new(port).expect("the endpoint sets up");
                opened.wait();
                body(rank, &mut endpoint, &members);
                endpoint.close().expect("the port closes");
            })
        })
        .collect();
    let mut failed = None;
    for (rank, thread) in threads.into_iter().enumerate() {
        if thread.join().is_err() {
            failed.get_or_insert(rank);
        }
    }
    if let Some(rank) = failed {
        panic!("rank {rank} failed ({name}, {size} ranks)");
    }
}

/// `target += source` as little-endian `u64`s, wrapping: an allreduce's combining function.
fn add(source: &[u8], target: &mut [u8]) {
    for (a, b) in source.chunks_exact(8).zip(target.chunks_exact_mut(8)) {
        let total = u64::from_le_bytes(a.try_into().unwrap())
            .wrapping_add(u64::from_le_bytes((&*b).try_into().unwrap()));
        b.copy_from_slice(&total.to_le_bytes());
    }
}

/// What an allreduce with [`add`] of every rank's `data(rank, length, salt)` comes to on a group
/// of `size`.
fn sum_of_ranks(size: usize, length: usize, salt: usize) -> Vec<u8> {
    let mut sum = vec![0u8; length];
    for from in 0..size {
        add(&data(from, length, salt), &mut sum);
    }
    sum
}

/// An operation of the test communicator (context 5), sequence `sequence`.
fn op<'a>(
    endpoint: &'a mut Endpoint,
    members: &'a [Member],
    sequence: u32,
    idle: &'a mut dyn FnMut(),
) -> Op<'a> {
    Op::new(endpoint, members, 5, sequence)
        .unwrap()
        .with_timeout(Duration::from_secs(30))
        .with_idle(idle)
}

/// Nothing, a byte, one segment's payload exactly, one byte more (two segments, still eager), and
/// a message of one segment that the binomial broadcast sends in pieces.
const LENGTHS: [usize; 5] = [
    0,
    1,
    transfer::SEGMENT_PAYLOAD,
    transfer::SEGMENT_PAYLOAD + 1,
    50_001,
];

/// Lengths above the rendezvous threshold: 1 MiB, and an odd length whose last pipeline
/// segment ([`LARGE_SEGMENT`]) falls below it.
const LARGE: [usize; 2] = [1 << 20, 3 * RENDEZVOUS_THRESHOLD + 12_345];
/// The segment of the segmented broadcasts in the large tests: each goes by rendezvous.
const LARGE_SEGMENT: usize = 4 * RENDEZVOUS_THRESHOLD;

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
                        coll::bcast(call, &mut buffer, root, algorithm, 8192).unwrap();
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
                            coll::scatter(
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
                            coll::gather(
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
            coll::scatterv(
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
            coll::gatherv(
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
        // Each rank may choose for itself (by its own longest block): ranks that differ,
        // linear beside pairwise, must still meet.
        let mixed = if rank % 2 == 0 {
            Alltoall::Linear
        } else {
            Alltoall::Pairwise
        };
        let rounds = [
            (Alltoall::Linear, 1000),
            (Alltoall::Pairwise, 1000),
            (mixed, 1000),
            // Blocks that go by rendezvous.
            (mixed, 100_000),
        ];
        for (algorithm, unit) in rounds {
            sequence += 1;
            let salt = sequence as usize;
            // Rank i sends (i + j) * unit bytes to rank j.
            let sends: Vec<Vec<u8>> = (0..size)
                .map(|j| data(rank * 10 + j, (rank + j) * unit, salt))
                .collect();
            let views: Vec<&[u8]> = sends.iter().map(|b| &b[..]).collect();
            let mut receives: Vec<Vec<u8>> =
                (0..size).map(|i| vec![0xee; (i + rank) * unit]).collect();
            let mut targets: Vec<&mut [u8]> = receives.iter_mut().map(|b| &mut b[..]).collect();
            let call = op(endpoint, members, sequence, &mut idle);
            coll::alltoallv(call, &views, &mut targets, algorithm).unwrap();
            for (i, block) in receives.iter().enumerate() {
                assert_eq!(*block, data(i * 10 + rank, (i + rank) * unit, salt));
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
                    coll::alltoall(call, &send, &mut receive, block, algorithm).unwrap();
                    let what = format!("{algorithm:?} {block}");
                    assert_alltoall_received(&receive, rank, size, block, salt, &what);
                }
            }
        });
    }
}

/// A 2×2 matrix of wrapping `u64`s, as 32 bytes: a product of them depends on the order.
fn matrix(rank: usize, index: usize, salt: usize) -> [u64; 4] {
    let seed = (rank * 1_000_003 + index * 7919 + salt) as u64;
    [
        seed | 1,
        seed.rotate_left(17),
        seed.rotate_left(31) ^ 5,
        seed | 3,
    ]
}

/// `source × target`, left in `target` (MPI_Reduce_local's order), for each matrix of the bytes.
fn multiply(source: &[u8], target: &mut [u8]) {
    let read = |bytes: &[u8]| -> [u64; 4] {
        std::array::from_fn(|i| u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap()))
    };
    for (a, b) in source.chunks_exact(32).zip(target.chunks_exact_mut(32)) {
        let (a, m) = (read(a), read(b));
        let product = [
            a[0].wrapping_mul(m[0])
                .wrapping_add(a[1].wrapping_mul(m[2])),
            a[0].wrapping_mul(m[1])
                .wrapping_add(a[1].wrapping_mul(m[3])),
            a[2].wrapping_mul(m[0])
                .wrapping_add(a[3].wrapping_mul(m[2])),
            a[2].wrapping_mul(m[1])
                .wrapping_add(a[3].wrapping_mul(m[3])),
        ];
        for (i, value) in product.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&value.to_le_bytes());
        }
    }
}

fn matrices(rank: usize, count: usize, salt: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| matrix(rank, i, salt))
        .flat_map(u64::to_le_bytes)
        .collect()
}

/// Every allreduce algorithm over messages, at sizes with and without the non-power-of-two
/// fix-up and lengths from one element to many segments (blocks of the ring and of
/// Rabenseifner's that are empty included): a product of matrices, which does not commute,
/// comes out in rank order on every rank whatever algorithm is asked for; a wrapping sum,
/// which does, comes out the same on every rank under each.
#[test]
fn every_allreduce_combines_every_rank_in_order() {
    for size in [2, 3, 5, 8] {
        run_ranks("allreduce", size, None, move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            for algorithm in [
                Allreduce::RecursiveDoubling,
                Allreduce::Rabenseifner,
                Allreduce::Ring,
            ] {
                for count in [1, 3, 2500] {
                    sequence += 1;
                    let salt = sequence as usize;
                    let mut product = matrices(rank, count, salt);
                    let call = op(endpoint, members, sequence, &mut idle);
                    coll::allreduce(call, &mut product, 32, &mut multiply, false, algorithm)
                        .unwrap();
                    let mut expected = matrices(size - 1, count, salt);
                    for from in (0..size - 1).rev() {
                        multiply(&matrices(from, count, salt), &mut expected);
                    }
                    assert!(
                        product == expected,
                        "{algorithm:?} product of {count} matrices at rank {rank} of {size}"
                    );

                    sequence += 1;
                    let words = count * 4;
                    let mut sum = data(rank, words * 8, sequence as usize);
                    let call = op(endpoint, members, sequence, &mut idle);
                    coll::allreduce(call, &mut sum, 8, &mut { add }, true, algorithm).unwrap();
                    assert!(
                        sum == sum_of_ranks(size, words * 8, sequence as usize),
                        "{algorithm:?} sum of {words} words at rank {rank} of {size}"
                    );
                }
            }
        });
    }
}

/// A long allreduce goes in pieces of its steps' messages (each a message of its own, its
/// landing offered ahead): every algorithm, at sizes with and without the fix-up, over a vector
/// of several pieces whose length is no multiple of a piece and whose elements (24 bytes) do not
/// divide one, comes out as the sum on every rank, and again and again on the regions the
/// first ones registered: pieces do not register a region each.
#[test]
fn a_long_allreduce_goes_in_pieces_and_sums_every_rank() {
    const ELEMENT: usize = 24;
    const ELEMENTS: usize = 50_001;
    for size in [2, 3, 4] {
        run_ranks(
            "allreduce-pieces",
            size,
            None,
            move |rank, endpoint, members| {
                let mut idle = || {};
                let mut sequence = 0;
                for round in 0..3 {
                    for algorithm in [
                        Allreduce::RecursiveDoubling,
                        Allreduce::Rabenseifner,
                        Allreduce::Ring,
                    ] {
                        sequence += 1;
                        let salt = sequence as usize;
                        let mut sum = data(rank, ELEMENT * ELEMENTS, salt);
                        let call = op(endpoint, members, sequence, &mut idle);
                        coll::allreduce(call, &mut sum, ELEMENT, &mut { add }, true, algorithm)
                            .unwrap();
                        assert!(
                            sum == sum_of_ranks(size, ELEMENT * ELEMENTS, salt),
                            "{algorithm:?} sum at rank {rank} of {size}, round {round}"
                        );
                    }
                }
                // A region lent to a piece goes back to the pool when the piece is taken or
                // delivered, and the next pieces reuse it: one region a piece would be one for each
                // piece received and each sent.
                let counters = endpoint.transfer_counters();
                assert!(
                    counters.rendezvous_received >= 20,
                    "rank {rank} of {size} took too few pieces by rendezvous: {counters:?}"
                );
                assert!(
                    counters.regions_registered * 4 <= counters.rendezvous_received,
                    "rank {rank} of {size} registered a region for many pieces: {counters:?}"
                );
            },
        );
    }
}

/// An allreduce in the background ends with the sum on every rank, moved on by nothing but
/// the waits of a blocking allreduce started after it (whose peers wait for the first before
/// they join it) and by asking for its end.
#[test]
fn a_background_allreduce_moves_on_under_other_waits() {
    const ELEMENTS: usize = 40_001;
    for size in [2, 3, 4] {
        run_ranks(
            "allreduce-background",
            size,
            None,
            move |rank, endpoint, members| {
                let mut idle = || {};
                let call = op(endpoint, members, 1, &mut idle);
                let ticket = coll::allreduce_start(
                    call,
                    data(rank, 8 * ELEMENTS, 1),
                    8,
                    Box::new(add),
                    true,
                    Allreduce::Rabenseifner,
                )
                .unwrap();
                let end = |endpoint: &mut Endpoint| loop {
                    if let Some((outcome, sum)) = endpoint.background_end(ticket) {
                        outcome.unwrap();
                        break sum;
                    }
                    assert!(endpoint.background_running(ticket));
                    endpoint.wait(Duration::from_millis(1));
                };
                let mut second = data(rank, 8 * ELEMENTS, 2);
                let first = if rank % 2 == 0 {
                    let call = op(endpoint, members, 2, &mut idle);
                    coll::allreduce(call, &mut second, 8, &mut { add }, true, Allreduce::Ring)
                        .unwrap();
                    end(endpoint)
                } else {
                    let first = end(endpoint);
                    let call = op(endpoint, members, 2, &mut idle);
                    coll::allreduce(call, &mut second, 8, &mut { add }, true, Allreduce::Ring)
                        .unwrap();
                    first
                };
                assert!(
                    first == sum_of_ranks(size, 8 * ELEMENTS, 1),
                    "background sum at rank {rank} of {size}"
                );
                assert!(
                    second == sum_of_ranks(size, 8 * ELEMENTS, 2),
                    "blocking sum at rank {rank} of {size}"
                );
                assert!(endpoint.background_end(ticket).is_none());
                assert!(!endpoint.background_running(ticket));
            },
        );
    }
}

/// A rank whose port closed before a long allreduce fails every other rank's, each naming it:
/// the ranks that exchange with it find its port closed (a quiet wait probes it, rather than
/// wait out the timeout), and those that wait on them hear that they gave the allreduce up,
/// and for want of whom.
#[test]
fn a_closed_rank_fails_every_long_allreduce_naming_it() {
    const VICTIM: usize = 2;
    run_ranks("allreduce-closed", 4, None, |rank, endpoint, members| {
        if rank == VICTIM {
            return;
        }
        let mut idle = || {};
        let call = op(endpoint, members, 1, &mut idle);
        let mut vector = data(rank, 1 << 20, 1);
        let error = coll::allreduce(
            call,
            &mut vector,
            8,
            &mut |_, _| {},
            true,
            Allreduce::Rabenseifner,
        )
        .unwrap_err();
        assert_eq!(error.rank(), Some(VICTIM), "rank {rank}: {error}");
        assert!(
            !matches!(error, CollError::Timeout { .. }),
            "rank {rank} waited out the timeout: {error}"
        );
    });
}

/// A member that heard another give an operation up may leave before the rest hear it: a send to
/// it then fails (its port closed), and the rank that sent still names the member really
/// missing, which the leaver passed on before it left, not the leaver.
#[test]
fn a_send_to_a_member_that_left_on_hearing_names_the_member_missing() {
    const VICTIM: usize = 0;
    const NOTIFIER: usize = 1;
    const LEAVER: usize = 2;
    let dir = common::temp_dir("nicbar-coll-left-");
    let socket = dir.path().join("control.sock");
    let daemon = Emulator::spawn(EmulatorConfig::in_process(&socket, 4)).expect("the emulator");
    let members: Vec<Member> = (0..4)
        .map(|n| Member::new(NodeId::new(n), nicbar::PortId(1)))
        .collect();
    let mut endpoints: Vec<Endpoint> = (0..4)
        .map(|unit| Endpoint::new(Port::open_at(&socket, unit, 1).unwrap()).unwrap())
        .collect();
    let mut tester = endpoints.pop().unwrap();
    let mut leaver = endpoints.pop().unwrap();
    let mut notifier = endpoints.pop().unwrap();
    endpoints.pop().unwrap().close().unwrap();
    // The notifier's word that it gave operation 1 up for want of the victim, to the leaver
    // alone (as if the notice to the tester were still on its way).
    let key = transfer::Key {
        context: 5,
        sequence: 1,
        part: transfer::FAILED_PART,
    };
    let word = (VICTIM as u64).to_le_bytes().to_vec();
    let notice = notifier
        .transfers_mut()
        .send(members[LEAVER], key, word.into());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !notifier.transfers_mut().send_done(notice).unwrap() {
        assert!(
            std::time::Instant::now() < deadline,
            "the notice was not posted"
        );
        notifier.pump_transfers().unwrap();
    }
    notifier.close().unwrap();
    // The leaver hears it while it waits in the operation, gives up, and leaves.
    let (mut idle, mut tester_idle) = (|| {}, || {});
    let error = op(&mut leaver, &members, 1, &mut idle)
        .receive(NOTIFIER, 0, 8)
        .unwrap_err();
    assert!(
        matches!(error, CollError::GaveUp { by: NOTIFIER, .. }),
        "{error}"
    );
    leaver.close().unwrap();
    // The tester's send of the operation to the leaver (by rendezvous: it ends only when the
    // receiver has it) finds its port closed.
    let mut call = op(&mut tester, &members, 1, &mut tester_idle);
    call.send(LEAVER, 0, vec![2u8; RENDEZVOUS_THRESHOLD]);
    let error = call.finish().unwrap_err();
    assert_eq!(error.rank(), Some(VICTIM), "{error}");
    tester.close().unwrap();
    drop(daemon);
}

/// A buffer that is not whole elements is refused before anything is sent.
#[test]
fn an_allreduce_of_part_of_an_element_is_refused() {
    run_ranks("allreduce-refused", 2, None, |_, endpoint, members| {
        let mut idle = || {};
        let call = op(endpoint, members, 1, &mut idle);
        let mut buffer = vec![0u8; 12];
        let error = coll::allreduce(
            call,
            &mut buffer,
            8,
            &mut |_, _| {},
            true,
            Allreduce::RecursiveDoubling,
        )
        .unwrap_err();
        assert!(matches!(error, CollError::Argument(_)), "{error}");
    });
}

/// The NIC's broadcast: every length up to what it carries, from every root, interleaved with
/// barriers of the same group (they share its numbering), through the fault injector; longer
/// messages take the host-driven algorithm and still arrive.
#[test]
fn the_nics_broadcast_reaches_every_rank_from_every_root_and_longer_messages_fall_back() {
    for size in [2, 3, 5] {
        let faults = FaultConfig {
            loss: 0.05,
            duplicate: 0.05,
            reorder: 0.05,
            ..FaultConfig::none(0x0b_ca57 + size as u64)
        };
        eprintln!("{size} ranks, fault injector: {faults}");
        run_ranks(
            "bcast-nic",
            size,
            Some(faults),
            move |rank, endpoint, members| {
                let group = nicbar::Group::new(members.iter().copied())
                    .unwrap()
                    .with_id(0x5eed);
                endpoint.port_mut().restart_barrier_numbering(&group);
                let mut sequence = 0;
                let mut idle = || {};
                for length in [0, 1, 7, 8, 31, nicbar::NIC_BROADCAST_MAX, 33, 4000] {
                    for root in 0..size {
                        sequence += 1;
                        let salt = sequence as usize;
                        let mut buffer = if rank == root {
                            data(root, length, salt)
                        } else {
                            vec![0xee; length]
                        };
                        let call = op(endpoint, members, sequence, &mut idle).with_group(&group);
                        coll::bcast(call, &mut buffer, root, Bcast::Nic, 8192).unwrap();
                        assert_eq!(
                            buffer,
                            data(root, length, salt),
                            "{length} bytes from {root} at rank {rank}"
                        );
                        if sequence % 4 == 0 {
                            let ticket = endpoint.barrier_start(&group);
                            loop {
                                match endpoint.barrier_end(ticket) {
                                    (Some(outcome), _) => break outcome.unwrap(),
                                    (None, true) => {
                                        endpoint.wait(Duration::from_millis(1));
                                    }
                                    (None, false) => panic!("barrier {ticket} lost"),
                                }
                            }
                        }
                    }
                }
            },
        );
    }
}

/// A NIC broadcast whose ranks disagree on the length fails where the root's bytes do not fit,
/// and nowhere is memory past the buffer written.
#[test]
fn a_nic_broadcast_of_another_length_than_the_roots_fails_with_the_lengths() {
    run_ranks(
        "bcast-nic-length",
        2,
        None,
        move |rank, endpoint, members| {
            let group = nicbar::Group::new(members.iter().copied()).unwrap();
            let mut idle = || {};
            let mut buffer = if rank == 0 { vec![1; 16] } else { vec![0; 8] };
            let call = op(endpoint, members, 1, &mut idle).with_group(&group);
            let outcome = coll::bcast(call, &mut buffer, 0, Bcast::Nic, 8192);
            if rank == 0 {
                outcome.unwrap();
            } else {
                assert_eq!(
                    outcome.unwrap_err(),
                    CollError::Length {
                        rank: 0,
                        expected: 8,
                        got: 16
                    }
                );
                assert_eq!(buffer, [0; 8]);
            }
        },
    );
}

#[test]
fn long_binomial_broadcasts_are_passed_on_piece_by_piece_byte_for_byte() {
    // Above 512 KiB the binomial tree moves the message in pieces of 256 KiB, each inner rank
    // sending one on while the next lands: at 5 ranks vrank 2 passes every piece to vrank 3,
    // and vrank 0 feeds three children. Lengths: one byte over two pieces, a short odd last
    // piece, whole ones.
    let size = 5;
    run_ranks(
        "bcast-pieces",
        size,
        None,
        move |rank, endpoint, members| {
            let mut sequence = 0;
            for length in [(512 << 10) + 1, 700_001, 1 << 20] {
                for root in [0, 3] {
                    sequence += 1;
                    let message = (sequence, root, length);
                    check_broadcast(endpoint, members, rank, message, Bcast::Binomial, 0);
                }
            }
            assert_eq!(endpoint.transfer_counters().rendezvous_refused, 0);
        },
    );
}

#[test]
fn segmented_broadcasts_pass_segments_put_whole_on_one_by_one_byte_for_byte() {
    // Segments that go by rendezvous move one at a time down the trees, as the binomial tree's
    // pieces do. At 5 ranks every tree has an inner rank that passes each segment on: the
    // binary tree's vrank 1 (to 3 and 4), the split binary tree's vrank 1 (its half to 3 and
    // 4, whose partners are 2 and the root), the chain's vranks 1 to 3. Lengths: one segment
    // and a byte, an odd short last segment, whole segments.
    let size = 5;
    run_ranks(
        "bcast-segments",
        size,
        None,
        move |rank, endpoint, members| {
            let algorithms = [Bcast::Binary, Bcast::SplitBinary, Bcast::Pipeline];
            let lengths = [LARGE_SEGMENT + 1, 700_001, 4 * LARGE_SEGMENT];
            check_large_broadcasts(endpoint, (rank, members), &algorithms, &lengths, [0, 3]);
        },
    );
}

/// Broadcasts each of `lengths` from each of `roots` with each of `algorithms` (segments of
/// [`LARGE_SEGMENT`]), checking every byte that came to `rank`, then that some came by
/// rendezvous and none was refused.
fn check_large_broadcasts(
    endpoint: &mut Endpoint,
    (rank, members): (usize, &[Member]),
    algorithms: &[Bcast],
    lengths: &[usize],
    roots: [usize; 2],
) {
    let mut sequence = 0;
    for &algorithm in algorithms {
        for &length in lengths {
            for root in roots {
                sequence += 1;
                let message = (sequence, root, length);
                check_broadcast(endpoint, members, rank, message, algorithm, LARGE_SEGMENT);
            }
        }
    }
    let counters = endpoint.transfer_counters();
    assert!(
        counters.rendezvous_received > 0,
        "rank {rank} received nothing by rendezvous: {counters:?}"
    );
    assert_eq!(counters.rendezvous_refused, 0);
}

/// Broadcasts `length` bytes from `root` as operation `sequence` with `algorithm` (segments of
/// `segment` bytes) and checks every byte that came to `rank`.
fn check_broadcast(
    endpoint: &mut Endpoint,
    members: &[Member],
    rank: usize,
    (sequence, root, length): (u32, usize, usize),
    algorithm: Bcast,
    segment: usize,
) {
    let salt = sequence as usize;
    let mut buffer = if rank == root {
        data(root, length, salt)
    } else {
        vec![0xee; length]
    };
    let mut idle = || {};
    let call = op(endpoint, members, sequence, &mut idle);
    coll::bcast(call, &mut buffer, root, algorithm, segment).unwrap();
    assert!(
        buffer == data(root, length, salt),
        "{algorithm:?} of {length} bytes from {root} at rank {rank}"
    );
}

#[test]
fn large_broadcasts_go_by_rendezvous_byte_for_byte() {
    let size = 3;
    run_ranks("bcast-large", size, None, move |rank, endpoint, members| {
        let algorithms = [
            Bcast::Linear,
            Bcast::Binomial,
            Bcast::Binary,
            Bcast::SplitBinary,
            Bcast::Pipeline,
        ];
        check_large_broadcasts(endpoint, (rank, members), &algorithms, &LARGE, [0, 2]);
        let counters = endpoint.transfer_counters();
        // A region lent to a message (staged once for every receiver, or landed and passed on
        // from where it landed) goes back to the pool when its last user lets go: twenty
        // broadcasts of up to 1 MiB reuse a few regions. A segmented broadcast holds one for
        // each segment landing or staged, and the last broadcast's may not be let go yet when
        // the next one's land (up to 9 seen in 40 runs); one region a message would be 20 or
        // more.
        let segments = LARGE[0].div_ceil(LARGE_SEGMENT) as u64;
        assert!(
            counters.regions_registered <= 3 * segments,
            "rank {rank} registered {} regions for 20 broadcasts",
            counters.regions_registered
        );
    });
}

#[test]
fn long_scattered_blocks_come_in_pieces_byte_for_byte() {
    // Above 512 KiB a flat scatter's block goes in pieces of 256 KiB, each a message of its
    // own. Blocks: one byte over two pieces, a short odd last piece, whole pieces; in
    // `scatterv`, the three at once (rank r gets the (r mod 3)-th), and an empty one at rank 1.
    let size = 4;
    run_ranks(
        "scatter-pieces",
        size,
        None,
        move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            let lengths = [(512 << 10) + 1, 700_001, 1 << 20];
            for root in [0, 3] {
                for block in lengths {
                    sequence += 1;
                    let salt = sequence as usize;
                    let send = data(root, block * size, salt);
                    let mut receive = vec![0xee; block];
                    let call = op(endpoint, members, sequence, &mut idle);
                    let send = (rank == root).then_some(&send[..]);
                    coll::scatter(call, send, Some(&mut receive[..]), block, root, Tree::Flat)
                        .unwrap();
                    assert!(
                        receive == data(root, block * size, salt)[rank * block..][..block],
                        "block of {block} from {root} at {rank}"
                    );
                }
                sequence += 1;
                let salt = sequence as usize;
                let length = |r: usize| if r == 1 { 0 } else { lengths[r % 3] };
                let blocks: Vec<Vec<u8>> = (0..size).map(|r| data(r, length(r), salt)).collect();
                let views: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
                let mut receive = vec![0xee; length(rank)];
                let call = op(endpoint, members, sequence, &mut idle);
                let send = (rank == root).then_some(&views[..]);
                coll::scatterv(call, send, Some(&mut receive[..]), root).unwrap();
                assert!(receive == blocks[rank], "scatterv from {root} at {rank}");
            }
            assert_eq!(endpoint.transfer_counters().rendezvous_refused, 0);
        },
    );
}

#[test]
fn idle_regions_give_way_to_a_gathers_landings() {
    // A gather's root at 10 ranks keeps 8 of its 9 landings of 64 KiB idle for reuse; the next
    // gather's 9 landings of 256 KiB do not fit them, and the port's table holds 16 regions:
    // the idle ones must give way, or a block is refused its landing and comes eagerly.
    let size = 10;
    run_ranks(
        "gather-regions",
        size,
        None,
        move |rank, endpoint, members| {
            let mut idle = || {};
            let root = 0;
            for (sequence, block) in [(1, RENDEZVOUS_THRESHOLD), (2, 2 * RENDEZVOUS_THRESHOLD + 1)]
            {
                let mine = data(rank, block, sequence);
                let mut gathered = vec![0xee; block * size];
                let call = op(endpoint, members, sequence as u32, &mut idle);
                let receive = (rank == root).then_some(&mut gathered[..]);
                coll::gather(call, Some(&mine[..]), receive, block, root, Tree::Flat).unwrap();
                if rank == root {
                    let expected: Vec<u8> =
                        (0..size).flat_map(|r| data(r, block, sequence)).collect();
                    assert!(gathered == expected, "blocks of {block}");
                }
            }
            let counters = endpoint.transfer_counters();
            assert_eq!(counters.rendezvous_refused, 0, "rank {rank}: {counters:?}");
        },
    );
}

#[test]
fn large_scatters_gathers_and_alltoalls_go_by_rendezvous() {
    let size = 3;
    run_ranks(
        "blocks-large",
        size,
        None,
        move |rank, endpoint, members| {
            let mut sequence = 0;
            let mut idle = || {};
            let block = RENDEZVOUS_THRESHOLD + 4_465;
            let root = 1;
            for algorithm in [Tree::Flat, Tree::Binomial] {
                sequence += 1;
                let salt = sequence as usize;
                let send = data(root, block * size, salt);
                let mut receive = vec![0xee; block];
                let call = op(endpoint, members, sequence, &mut idle);
                coll::scatter(
                    call,
                    (rank == root).then_some(&send[..]),
                    Some(&mut receive[..]),
                    block,
                    root,
                    algorithm,
                )
                .unwrap();
                assert!(
                    receive == send[rank * block..(rank + 1) * block],
                    "{algorithm:?}"
                );

                sequence += 1;
                let mine = data(rank, block, salt);
                let mut gathered = vec![0xee; block * size];
                let call = op(endpoint, members, sequence, &mut idle);
                coll::gather(
                    call,
                    Some(&mine[..]),
                    (rank == root).then_some(&mut gathered[..]),
                    block,
                    root,
                    algorithm,
                )
                .unwrap();
                if rank == root {
                    let expected: Vec<u8> = (0..size).flat_map(|r| data(r, block, salt)).collect();
                    assert!(gathered == expected, "{algorithm:?} gather");
                }
            }
            for algorithm in [Alltoall::Linear, Alltoall::Pairwise, Alltoall::Bruck] {
                sequence += 1;
                let salt = sequence as usize;
                let send = data(rank, block * size, salt);
                let mut receive = vec![0xee; block * size];
                let call = op(endpoint, members, sequence, &mut idle);
                coll::alltoall(call, &send, &mut receive, block, algorithm).unwrap();
                let what = format!("{algorithm:?}");
                assert_alltoall_received(&receive, rank, size, block, salt, &what);
            }
            // Blocks on both sides of the threshold in one operation: rank i sends (i + j) * 40 000
            // bytes to rank j.
            sequence += 1;
            let salt = sequence as usize;
            let sends: Vec<Vec<u8>> = (0..size)
                .map(|j| data(rank * 10 + j, (rank + j) * 40_000, salt))
                .collect();
            let views: Vec<&[u8]> = sends.iter().map(|b| &b[..]).collect();
            let mut receives: Vec<Vec<u8>> =
                (0..size).map(|i| vec![0xee; (i + rank) * 40_000]).collect();
            let mut targets: Vec<&mut [u8]> = receives.iter_mut().map(|b| &mut b[..]).collect();
            let call = op(endpoint, members, sequence, &mut idle);
            coll::alltoallv(call, &views, &mut targets, Alltoall::Pairwise).unwrap();
            for (i, block) in receives.iter().enumerate() {
                assert!(*block == data(i * 10 + rank, (i + rank) * 40_000, salt));
            }
            let counters = endpoint.transfer_counters();
            assert!(counters.rendezvous_sent > 0 && counters.rendezvous_received > 0);
        },
    );
}

#[test]
fn the_threshold_picks_the_protocol() {
    for eager in [false, true] {
        run_ranks("threshold", 2, None, move |rank, endpoint, members| {
            if eager {
                endpoint.set_rendezvous_threshold(usize::MAX);
            }
            let mut idle = || {};
            for (sequence, length) in (1..).zip([RENDEZVOUS_THRESHOLD - 1, RENDEZVOUS_THRESHOLD]) {
                let before = endpoint.transfer_counters();
                let mut buffer = if rank == 0 {
                    data(0, length, length)
                } else {
                    vec![0; length]
                };
                let call = op(endpoint, members, sequence, &mut idle);
                coll::bcast(call, &mut buffer, 0, Bcast::Linear, 0).unwrap();
                assert!(buffer == data(0, length, length));
                let after = endpoint.transfer_counters();
                let by_rendezvous = !eager && length >= RENDEZVOUS_THRESHOLD;
                let (sent, received) = (
                    after.rendezvous_sent - before.rendezvous_sent,
                    after.rendezvous_received - before.rendezvous_received,
                );
                if rank == 0 {
                    assert_eq!(
                        sent,
                        u64::from(by_rendezvous),
                        "{length} bytes, eager {eager}"
                    );
                } else {
                    assert_eq!(received, u64::from(by_rendezvous), "{length} bytes");
                }
            }
            // The receiver's last answer is delivered before either closes.
            let mut reply = vec![rank as u8; 8];
            let call = op(endpoint, members, 3, &mut idle);
            coll::bcast(call, &mut reply, 1, Bcast::Linear, 0).unwrap();
        });
    }
}

/// What [`two_endpoints`] sets up: the daemon, its directory, the endpoints, their members.
type Two = (EmulatorHandle, TempDir, Endpoint, Endpoint, Vec<Member>);

/// Two endpoints on two NICs of one in-process daemon of `units` NICs, driven by one thread (so
/// a test chooses exactly when each moves).
fn two_endpoints(name: &str, units: u16) -> Two {
    let (daemon, dir, mut endpoints, mut members) = endpoints(name, units, 2);
    members.truncate(2);
    let b = endpoints.pop().expect("two endpoints");
    let a = endpoints.pop().expect("two endpoints");
    (daemon, dir, a, b, members)
}

/// `count` endpoints on the first NICs of one in-process daemon of `units` NICs, one port each,
/// driven by one thread; and every NIC's member.
fn endpoints(
    name: &str,
    units: u16,
    count: u8,
) -> (EmulatorHandle, TempDir, Vec<Endpoint>, Vec<Member>) {
    let dir = common::temp_dir(&format!("nicbar-coll-{name}-"));
    let socket = dir.path().join("control.sock");
    let daemon =
        Emulator::spawn(EmulatorConfig::in_process(&socket, units)).expect("the emulator starts");
    let endpoints = (0..count)
        .map(|unit| {
            Endpoint::new(Port::open_at(&socket, unit, 1).expect("the port opens"))
                .expect("the endpoint sets up")
        })
        .collect();
    let members = (0..units)
        .map(|n| Member::new(NodeId::new(n), nicbar::PortId(1)))
        .collect();
    (daemon, dir, endpoints, members)
}

/// Moves every endpoint's transfers on until `done` holds of them (at most ten seconds).
fn pump_all_until(endpoints: &mut [Endpoint], done: impl Fn(&mut [Endpoint]) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done(endpoints) {
        assert!(std::time::Instant::now() < deadline, "no progress in 10 s");
        for endpoint in endpoints.iter_mut() {
            endpoint.pump_transfers().unwrap();
        }
    }
}

#[test]
fn an_inner_rank_forwards_each_segment_as_it_arrives() {
    // Rank 0 sends to rank 1, which asked for the message to be forwarded to ranks 2 and 3:
    // each eager segment goes on from rank 1's receive buffers (counted once per rank it goes
    // to), and a message that comes by rendezvous goes on whole. Everyone ends with the bytes.
    let (daemon, _dir, mut ranks, members) = endpoints("forward", 4, 4);
    for (sequence, length) in [(1, 0), (2, 50_001), (3, RENDEZVOUS_THRESHOLD + 999)] {
        let key = transfer::Key {
            context: 5,
            sequence,
            part: 0,
        };
        let before = ranks[1].transfer_counters();
        let ids = ranks[1]
            .transfers_mut()
            .forward(members[0], key, &members[2..4])
            .expect("nothing of the message is here yet");
        let message = data(0, length, sequence as usize);
        let sent = ranks[0]
            .transfers_mut()
            .send(members[1], key, message.clone().into());
        pump_all_until(&mut ranks, |r| {
            r[1].transfers().has_whole(members[0], key)
                && r[2].transfers().has_whole(members[1], key)
                && r[3].transfers().has_whole(members[1], key)
                && r[0].transfers_mut().send_done(sent) == Ok(true)
                && ids
                    .iter()
                    .all(|&id| r[1].transfers_mut().send_done(id) == Ok(true))
                && !r.iter().any(|e| e.transfers().has_outgoing())
        });
        for (rank, from) in [(1, 0), (2, 1), (3, 1)] {
            let got = ranks[rank].transfers_mut().take(members[from], key);
            assert!(
                got.as_deref() == Some(&message[..]),
                "rank {rank}, {length} bytes"
            );
        }
        let after = ranks[1].transfer_counters();
        let segments = if ranks[0].transfers().by_rendezvous(length) {
            assert_eq!(after.rendezvous_received, before.rendezvous_received + 1);
            0
        } else {
            transfer::segments(length).count() as u64
        };
        assert_eq!(
            after.forwarded - before.forwarded,
            2 * segments,
            "{length} bytes: each segment once to each of two ranks"
        );
    }
    for rank in ranks {
        rank.close().unwrap();
    }
    drop(daemon);
}

#[test]
fn an_inner_rank_that_leaves_the_library_after_a_broadcast_stalls_no_child() {
    // A broadcast ends once its data is in the NIC's hands: an inner rank that forwarded a
    // segment and then stops calling the library (here: waits for its child outside it) must
    // have handed the forwarded segment to the NIC before its broadcast returned. The root
    // starts each broadcast a little late, so that the inner rank is asleep in its wait when
    // the (one-segment) message comes: the path where the message is whole at once.
    let size = 3;
    let (done, finished) = std::sync::mpsc::channel::<u32>();
    let finished = std::sync::Mutex::new(finished);
    run_ranks("bcast-leave", size, None, move |rank, endpoint, members| {
        let mut idle = || {};
        for sequence in 1..=20 {
            let length = 1000;
            let mut buffer = if rank == 0 {
                std::thread::sleep(Duration::from_millis(3));
                data(0, length, sequence as usize)
            } else {
                vec![0; length]
            };
            let call = op(endpoint, members, sequence, &mut idle);
            coll::bcast(call, &mut buffer, 0, Bcast::Pipeline, 1 << 20).unwrap();
            assert!(buffer == data(0, length, sequence as usize), "rank {rank}");
            match rank {
                // Rank 1 moves nothing until rank 2 has its data.
                1 => {
                    let got = finished
                        .lock()
                        .unwrap()
                        .recv_timeout(Duration::from_secs(20));
                    assert_eq!(got, Ok(sequence), "rank 2 never got broadcast {sequence}");
                }
                2 => done.send(sequence).unwrap(),
                _ => {}
            }
        }
    });
}

#[test]
fn a_message_here_before_its_forward_is_not_forwarded() {
    // Part of the message is here when the forward is asked for: it is refused (the caller
    // sends the message on once whole), and nothing is forwarded.
    let (daemon, _dir, mut ranks, members) = endpoints("late-forward", 3, 3);
    let key = transfer::Key {
        context: 5,
        sequence: 1,
        part: 0,
    };
    let message = data(0, 20_000, 1);
    ranks[0]
        .transfers_mut()
        .send(members[1], key, message.clone().into());
    pump_all_until(&mut ranks, |r| r[1].transfers().holds(members[0], key));
    assert!(
        ranks[1]
            .transfers_mut()
            .forward(members[0], key, &members[2..3])
            .is_none()
    );
    pump_all_until(&mut ranks, |r| {
        !r.iter().any(|e| e.transfers().has_outgoing())
            && r[1].transfers_mut().take(members[0], key).is_some()
    });
    assert_eq!(ranks[1].transfer_counters().forwarded, 0);
    assert!(!ranks[2].transfers().holds(members[1], key));
    for rank in ranks {
        rank.close().unwrap();
    }
    drop(daemon);
}

/// Moves `endpoint`'s transfers on until `done` holds of it (at most ten seconds).
fn pump_until(endpoint: &mut Endpoint, done: impl Fn(&Endpoint) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done(endpoint) {
        assert!(std::time::Instant::now() < deadline, "no progress in 10 s");
        endpoint.pump_transfers().unwrap();
        let _ = endpoint.port_mut().wait_ready(Duration::from_millis(10));
    }
}

#[test]
fn a_peer_gone_mid_rendezvous_fails_the_collective_naming_it() {
    let length = 1 << 20;
    let mut idle = || {};

    // The receiver answers the ready-to-send, then its port closes before the sender has seen
    // the answer: the sender's puts find no port.
    let (daemon, dir, mut sender, mut receiver, members) = two_endpoints("gone-receiver", 2);
    let mut call = Op::new(&mut sender, &members, 5, 1)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .with_idle(&mut idle);
    call.send(1, 0, data(0, length, 1));
    call.endpoint().pump_transfers().unwrap();
    pump_until(&mut receiver, |r| {
        r.transfers().counters().regions_registered > 0 && !r.transfers().has_outgoing()
    });
    receiver.close().unwrap();
    let error = call.finish().expect_err("the receiver is gone");
    assert_eq!(error.rank(), Some(1), "{error}");
    assert!(matches!(error, CollError::Peer { .. }), "{error}");
    sender.close().unwrap();
    drop(daemon);

    // The sender's port closes once the receiver has answered: the receiver's wait for the
    // data fails, naming it, within the operation's timeout.
    let (daemon, _sender_dir, mut sender, mut receiver, members) = two_endpoints("gone-sender", 2);
    let mut call = Op::new(&mut sender, &members, 5, 1)
        .unwrap()
        .with_idle(&mut idle);
    call.send(1, 0, data(0, length, 1));
    call.endpoint().pump_transfers().unwrap();
    drop(call);
    let mut receiving = Op::new(&mut receiver, &members, 5, 1)
        .unwrap()
        .with_timeout(Duration::from_millis(500))
        .with_idle(&mut idle);
    pump_until(receiving.endpoint(), |r| {
        r.transfers().counters().regions_registered > 0
    });
    sender.close().unwrap();
    let error = receiving
        .receive(0, 0, length)
        .expect_err("the sender is gone");
    assert_eq!(error.rank(), Some(0), "{error}");
    drop(receiving);
    receiver.close().unwrap();
    drop(daemon);
    drop(dir);
}

/// A rendezvous control message as a third port would forge it: `kind` 2 is a clear-to-send,
/// 4 a "done", 5 an offer; `id` the sender's id of the message (an offer's length), `value` a
/// remote pointer.
fn forged_control(sequence: u32, kind: u32, id: u64, value: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"NBR1");
    for word in [5, sequence, 0, kind, 0] {
        bytes.extend_from_slice(&u32::to_le_bytes(word));
    }
    bytes.extend_from_slice(&id.to_le_bytes());
    bytes.extend_from_slice(&value.to_le_bytes());
    bytes
}

/// Sends `bytes` from `port` to port 1 of `node` and waits until it is delivered.
fn send_raw(port: &mut Port, node: u16, bytes: &[u8]) {
    let mut buffer = port.dma_alloc(transfer::BUFFER_LEN).unwrap();
    buffer[..bytes.len()].copy_from_slice(bytes);
    port.send(
        buffer,
        bytes.len(),
        transfer::SIZE_CLASS,
        nicbar::Priority::LOW,
        NodeId::new(node),
        nicbar::PortId(1),
        77,
    )
    .map_err(|refused| refused.error)
    .unwrap();
    loop {
        match port.receive_timeout(Duration::from_secs(10)).unwrap() {
            Some(nicbar::Event::Sent {
                context: 77,
                status,
                ..
            }) => {
                assert_eq!(status, nicbar::Status::SUCCESS);
                return;
            }
            Some(_) => {}
            None => panic!("the forged message was not delivered in 10 s"),
        }
    }
}

#[test]
fn forged_rendezvous_answers_from_a_third_port_are_dropped() {
    let length = 1 << 20;
    let mut idle = || {};
    let (daemon, dir, mut sender, mut receiver, members) = two_endpoints("forged", 3);
    let socket = dir.path().join("control.sock");
    let mut forger = Port::open_at(&socket, 2, 1).expect("the port opens");
    let mine = forger.register_memory(length).unwrap();
    forger.allow_remote_memory_access().unwrap();

    // Before the sender sends, the third port offers its own memory as the message's landing
    // region: an offer is the receiver's alone, so it changes nothing.
    let key = transfer::Key {
        context: 5,
        sequence: 1,
        part: 0,
    };
    let forger_member = Member::new(NodeId::new(2), nicbar::PortId(1));
    send_raw(
        &mut forger,
        0,
        &forged_control(1, 5, length as u64, mine.remote(0)),
    );
    pump_until(&mut sender, |s| {
        s.transfers().offered_to(forger_member, key)
    });

    let mut call = Op::new(&mut sender, &members, 5, 1)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .with_idle(&mut idle);
    call.send(1, 0, data(0, length, 1));
    call.endpoint().pump_transfers().unwrap();
    // Before the receiver answers, a third port claims to be it (the sender's first message has
    // id 1), pointing the puts at its own memory; and says "done" for the receiver's message.
    send_raw(&mut forger, 0, &forged_control(1, 2, 1, mine.remote(0)));
    pump_until(&mut receiver, |r| {
        r.transfers().counters().regions_registered > 0 && !r.transfers().has_outgoing()
    });
    send_raw(&mut forger, 1, &forged_control(1, 4, 1, 0));
    call.finish().unwrap();

    let mut receiving = Op::new(&mut receiver, &members, 5, 1)
        .unwrap()
        .with_timeout(Duration::from_secs(20))
        .with_idle(&mut idle);
    let got = receiving.receive(0, 0, length).unwrap();
    drop(receiving);
    assert!(got == data(0, length, 1), "the message is the sender's");
    assert!(
        mine.bytes().to_vec(0, length).iter().all(|&b| b == 0),
        "nothing was put into the forger's memory"
    );
    assert_eq!(sender.transfer_counters().dropped, 1);
    assert_eq!(receiver.transfer_counters().dropped, 1);
    assert_eq!(sender.transfer_counters().rendezvous_sent, 1);
    forger.close().unwrap();
    sender.close().unwrap();
    receiver.close().unwrap();
    drop(daemon);
    drop(dir);
}

/// The key of part `part` of operation 1 on communicator 5, as [`Op`] names it.
fn key_of(part: u32) -> transfer::Key {
    transfer::Key {
        context: 5,
        sequence: 1,
        part,
    }
}

/// Sends `message` as part `part` of operation 1 from `sender` to rank 1 and waits until it is
/// delivered (by rendezvous, until its puts have landed).
fn send_part(sender: &mut Endpoint, members: &[Member], part: u32, message: Vec<u8>) {
    let mut idle = || {};
    let mut call = op(sender, members, 1, &mut idle);
    call.send(1, part, message);
    call.finish().unwrap();
}

/// Receives part `part` of operation 1 from rank 0, `length` bytes.
fn receive_part(receiver: &mut Endpoint, members: &[Member], part: u32, length: usize) -> Vec<u8> {
    let mut idle = || {};
    op(receiver, members, 1, &mut idle)
        .receive(0, part, length)
        .unwrap()
}

/// Closes both endpoints' ports, then the daemon, then its directory.
fn close(sender: Endpoint, receiver: Endpoint, daemon: EmulatorHandle, dir: TempDir) {
    sender.close().unwrap();
    receiver.close().unwrap();
    drop(daemon);
    drop(dir);
}

/// Rank 1 (`receiver`) waits for part `part` of operation 1 from rank 0, of `length` bytes,
/// before rank 0 (`sender`) sends it; returns once the sender holds the receiver's offer.
fn offer(
    receiver: &mut Endpoint,
    sender: &mut Endpoint,
    members: &[Member],
    part: u32,
    length: usize,
) {
    receiver.expect(members[0], key_of(part), length).unwrap();
    pump_until(receiver, |r| !r.transfers().has_outgoing());
    pump_until(sender, |s| {
        s.transfers().offered_to(members[1], key_of(part))
    });
}

#[test]
fn a_receiver_that_waits_first_offers_its_landing_region_and_the_sender_puts_into_it() {
    // The receiver waits for a 1 MiB message before it is sent: its landing region goes to the
    // sender at once, which puts the message there with no ready-to-send or clear-to-send.
    let length = 1 << 20;
    let (daemon, dir, mut sender, mut receiver, members) = two_endpoints("offer", 2);
    offer(&mut receiver, &mut sender, &members, 0, length);

    send_part(&mut sender, &members, 0, data(0, length, 1));
    let got = receive_part(&mut receiver, &members, 0, length);
    assert!(got == data(0, length, 1), "the message is the sender's");
    let (sent, received) = (sender.transfer_counters(), receiver.transfer_counters());
    assert_eq!(sent.offers_taken, 1, "{sent:?}");
    assert_eq!(received.rendezvous_offered, 1, "{received:?}");
    assert_eq!(received.rendezvous_received, 1, "{received:?}");
    assert_eq!((sent.dropped, received.dropped), (0, 0));
    close(sender, receiver, daemon, dir);
}

#[test]
fn an_offer_that_crosses_the_ready_to_send_is_its_answer() {
    // The sender asks first; the receiver offers before it has read the ready-to-send. The
    // sender puts into the offered region, and the ready-to-send takes no region of its own.
    let length = 1 << 20;
    let (daemon, dir, mut sender, mut receiver, members) = two_endpoints("offer-crossing", 2);
    let mut idle = || {};
    let mut call = op(&mut sender, &members, 1, &mut idle);
    call.send(1, 0, data(0, length, 2));
    pump_until(call.endpoint(), |s| !s.transfers().has_outgoing());
    receiver.expect(members[0], key_of(0), length).unwrap();
    pump_until(&mut receiver, |r| !r.transfers().has_outgoing());
    call.finish().unwrap();

    let got = receive_part(&mut receiver, &members, 0, length);
    assert!(got == data(0, length, 2), "the message is the sender's");
    let (sent, received) = (sender.transfer_counters(), receiver.transfer_counters());
    assert_eq!(sent.offers_taken, 1, "{sent:?}");
    assert_eq!(received.regions_registered, 1, "{received:?}");
    assert_eq!((sent.dropped, received.dropped), (0, 0));
    close(sender, receiver, daemon, dir);
}

#[test]
fn an_offer_of_another_length_or_an_eager_message_leaves_the_message_whole() {
    // An offer of another length than the sender sends is void (the ready-to-send is answered
    // as ever), and an offered region whose message came eagerly goes back to the pool.
    let length = 1 << 20;
    let (daemon, dir, mut sender, mut receiver, members) = two_endpoints("offer-void", 2);
    offer(&mut receiver, &mut sender, &members, 0, length);
    let longer = length + 4096;
    let mut idle = || {};
    let mut call = op(&mut sender, &members, 1, &mut idle);
    call.send(1, 0, data(0, longer, 3));
    pump_until(call.endpoint(), |s| !s.transfers().has_outgoing());
    // The ready-to-send is answered with a region of its length.
    pump_until(&mut receiver, |r| {
        r.transfers().counters().regions_registered == 2 && !r.transfers().has_outgoing()
    });
    call.finish().unwrap();
    assert!(receive_part(&mut receiver, &members, 0, longer) == data(0, longer, 3));
    assert_eq!(sender.transfer_counters().offers_taken, 0);

    // A message of the threshold's length, which this sender sends eagerly (in segments the
    // receiver's provided buffers hold while it is not looking).
    let short = RENDEZVOUS_THRESHOLD;
    sender.set_rendezvous_threshold(usize::MAX);
    offer(&mut receiver, &mut sender, &members, 1, short);
    assert_eq!(receiver.transfers().landings(), 1, "the offer's region");
    send_part(&mut sender, &members, 1, data(0, short, 4));
    assert!(receive_part(&mut receiver, &members, 1, short) == data(0, short, 4));
    let received = receiver.transfer_counters();
    assert_eq!(
        received.rendezvous_received, 1,
        "only the first came by rendezvous"
    );
    assert_eq!(received.rendezvous_offered, 2, "{received:?}");
    assert_eq!(
        receiver.transfers().landings(),
        0,
        "the offered region went back"
    );
    assert_eq!(
        (sender.transfer_counters().dropped, received.dropped),
        (0, 0)
    );
    close(sender, receiver, daemon, dir);
}

#[test]
fn data_nobody_asked_for_is_bounded_and_a_forged_length_takes_nothing() {
    // The receiver holds at most 1 MiB of messages it has not asked for. A third port sends a
    // ready-to-send of 3 GiB and the first segment of an eager message of 1 GiB: neither is
    // registered or allocated. A real 4 MiB message not asked for yet waits for room, and
    // comes once asked for; one of 512 KiB is answered at once. Asking for the dropped eager
    // message fails naming its sender.
    let mut idle = || {};
    let (daemon, dir, mut ranks, members) = endpoints("unexpected", 3, 2);
    let mut receiver = ranks.pop().expect("two endpoints");
    let mut sender = ranks.pop().expect("two endpoints");
    receiver.transfers_mut().set_unexpected_limit(1 << 20);
    let mut forger = Port::open_at(&dir.path().join("control.sock"), 2, 1).expect("the port opens");

    send_raw(&mut forger, 1, &forged_control(7, 1, 1, 3 << 30));
    let mut segment = Vec::new();
    for word in [u32::from_le_bytes(*b"NBC1"), 5, 8, 0] {
        segment.extend_from_slice(&word.to_le_bytes());
    }
    segment.extend_from_slice(&0u64.to_le_bytes());
    segment.extend_from_slice(&(1u64 << 30).to_le_bytes());
    segment.resize(transfer::HEADER_LEN + transfer::SEGMENT_PAYLOAD, 0xab);
    send_raw(&mut forger, 1, &segment);
    pump_until(&mut receiver, |r| r.transfer_counters().over_limit == 2);
    assert_eq!(receiver.transfer_counters().regions_registered, 0);
    let forged = |sequence| transfer::Key {
        context: 5,
        sequence,
        part: 0,
    };
    assert!(!receiver.transfers().holds(members[2], forged(8)));

    // Real messages: 512 KiB fits under the limit and is answered before it is asked for; 4
    // MiB waits, and comes when asked for.
    let (small, large) = (512 << 10, 4 << 20);
    let part = |part| transfer::Key {
        context: 5,
        sequence: 1,
        part,
    };
    sender
        .transfers_mut()
        .send(members[1], part(0), data(0, small, 1).into());
    sender
        .transfers_mut()
        .send(members[1], part(1), data(0, large, 2).into());
    let mut both = [sender, receiver];
    pump_all_until(&mut both, |r| {
        r[1].transfers().has_whole(members[0], part(0)) && r[1].transfer_counters().over_limit == 3
    });
    let [mut sender, mut receiver] = both;
    let mut pump_sender = || {
        let _ = sender.pump_transfers();
    };
    let mut receiving = op(&mut receiver, &members, 1, &mut pump_sender);
    assert!(receiving.receive(0, 0, small).unwrap() == data(0, small, 1));
    assert!(receiving.receive(0, 1, large).unwrap() == data(0, large, 2));
    drop(receiving);

    let mut asking = op(&mut receiver, &members, 8, &mut idle);
    let error = asking.receive(2, 0, 1 << 30).expect_err("it was dropped");
    assert_eq!(error.rank(), Some(2), "{error}");
    assert!(
        error.to_string().contains("NICBAR_COLL_UNEXPECTED_BYTES"),
        "{error}"
    );
    drop(asking);
    forger.close().unwrap();
    sender.close().unwrap();
    receiver.close().unwrap();
    drop(daemon);
    drop(dir);
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
            coll::bcast(call, &mut buffer, root, Bcast::SplitBinary, 16_384).unwrap();
            assert_eq!(
                buffer,
                data(root, 100_000, sequence as usize),
                "seed {seed}"
            );
        }
        // By rendezvous: the control messages and the puts cross the same faulty wire.
        for (sequence, length) in (5..).zip(LARGE) {
            let salt = sequence as usize;
            let mut buffer = if rank == 0 {
                data(0, length, salt)
            } else {
                vec![0; length]
            };
            let call = op(endpoint, members, sequence, &mut idle);
            coll::bcast(call, &mut buffer, 0, Bcast::Binomial, LARGE_SEGMENT).unwrap();
            assert!(buffer == data(0, length, salt), "seed {seed}");
        }
        let block = RENDEZVOUS_THRESHOLD + 1;
        let send = data(rank, block * 4, 7);
        let mut receive = vec![0; block * 4];
        let call = op(endpoint, members, 7, &mut idle);
        coll::alltoall(call, &send, &mut receive, block, Alltoall::Pairwise).unwrap();
        assert_alltoall_received(&receive, rank, 4, block, 7, &format!("seed {seed}"));
        assert!(endpoint.transfer_counters().rendezvous_received > 0);
    });
}

#[test]
fn segments_of_64_kib_cross_the_wire_between_daemons() {
    // A segment is one NIC message of up to 64 KiB, which a NIC whose peer is in another
    // daemon cuts into packets over UDP: through loss, duplication and reordering, a block of
    // one segment and a message of several arrive whole, and a segment forwarded on (the
    // binomial broadcast's inner ranks) goes from the buffer it arrived in.
    let seed = common::seed(0x64_5e9);
    let faults = FaultConfig {
        loss: 0.02,
        duplicate: 0.02,
        reorder: 0.02,
        ..FaultConfig::none(seed)
    };
    run_ranks_across_daemons("udp-segments", 4, faults, move |rank, endpoint, members| {
        let mut idle = || {};
        let block = 40 << 10;
        assert!(block < transfer::SEGMENT_PAYLOAD && block > transfer::PACKET_PAYLOAD);
        let send = data(rank, block * 4, 3);
        let mut receive = vec![0; block * 4];
        let call = op(endpoint, members, 1, &mut idle);
        coll::alltoall(call, &send, &mut receive, block, Alltoall::Linear).unwrap();
        assert_alltoall_received(&receive, rank, 4, block, 3, &format!("seed {seed}"));
        endpoint.set_rendezvous_threshold(usize::MAX);
        let length = 5 * transfer::SEGMENT_PAYLOAD + 7;
        let mut buffer = if rank == 0 {
            data(0, length, 4)
        } else {
            vec![0; length]
        };
        let call = op(endpoint, members, 2, &mut idle);
        coll::bcast(call, &mut buffer, 0, Bcast::Binomial, 0).unwrap();
        assert!(buffer == data(0, length, 4), "seed {seed}: at {rank}");
        let counters = endpoint.transfer_counters();
        assert_eq!(counters.rendezvous_received, 0, "{counters:?}");
        if rank == 2 {
            // Rank 0's child in the other daemon, rank 3's parent there.
            assert!(counters.forwarded > 0, "{counters:?}");
        }
    });
}

#[test]
fn a_receiver_that_takes_nothing_for_a_while_still_gets_everything() {
    // The NIC gives up on a segment whose receiver has no buffer after 100 ms here; the
    // receiver stays away six times that long, so eager segments are given up on and sent
    // again. By rendezvous, the receiver's provided buffers take the ready-to-send and its
    // answer waits until it is back; the puts need nothing of its host.
    for eager in [true, false] {
        run_ranks_with(
            if eager {
                "slow-eager"
            } else {
                "slow-rendezvous"
            },
            2,
            |config| config.nic.receiver_not_ready_timeout = Duration::from_millis(100),
            move |rank, endpoint, members| slow_receiver(rank, endpoint, members, eager),
        );
    }
}

/// The body of [`a_receiver_that_takes_nothing_for_a_while_still_gets_everything`].
fn slow_receiver(rank: usize, endpoint: &mut Endpoint, members: &[Member], eager: bool) {
    if eager {
        endpoint.set_rendezvous_threshold(usize::MAX);
    }
    let mut idle = || {};
    // More segments than the receiver keeps buffers provided.
    let length = 4 << 20;
    assert!(length / transfer::SEGMENT_PAYLOAD > transfer::RECEIVE_BUFFERS);
    let mut buffer = if rank == 0 {
        data(0, length, 1)
    } else {
        std::thread::sleep(Duration::from_millis(600));
        vec![0; length]
    };
    let call = op(endpoint, members, 1, &mut idle);
    coll::bcast(call, &mut buffer, 0, Bcast::Linear, 0).unwrap();
    assert_eq!(buffer, data(0, length, 1));
    if rank == 0 {
        // The sender's last segments are delivered before it may close: a second
        // operation the receiver answers.
        let mut reply = vec![0; 8];
        let call = op(endpoint, members, 2, &mut idle);
        coll::bcast(call, &mut reply, 1, Bcast::Linear, 0).unwrap();
        let counters = endpoint.transfer_counters();
        if eager {
            assert!(counters.resent > 0, "no segment was sent again");
            assert_eq!(counters.rendezvous_sent, 0);
        } else {
            assert_eq!(counters.rendezvous_sent, 1, "{counters:?}");
        }
    } else {
        let mut reply = data(1, 8, 2);
        let call = op(endpoint, members, 2, &mut idle);
        coll::bcast(call, &mut reply, 1, Bcast::Linear, 0).unwrap();
    }
}

/// The endpoint's persistent collectives (what the C API's nicbar_coll_persistent_start()
/// queues): a barrier and a sum compiled once, started 10 times behind and beside ordinary
/// barriers of the same group, each sum of the inputs of its own start.
#[test]
fn an_endpoint_starts_persistent_collectives_in_queue_order() {
    run_ranks(
        "persistent-endpoint",
        3,
        None,
        move |rank, endpoint, members| {
            let group = nicbar::Group::new(members.iter().copied()).unwrap();
            endpoint.port_mut().restart_barrier_numbering(&group);
            let spec = nicbar::ReduceSpec::new(nicbar::ReduceOp::SUM, nicbar::ReduceType::I64);
            let barrier = endpoint.port().persistent_barrier(&group).unwrap();
            let sum = endpoint
                .port()
                .persistent_allreduce(&group, spec, 8)
                .unwrap();
            for start in 0..10i64 {
                let value = (rank as i64 * 100 + start).to_le_bytes();
                let tickets = [
                    endpoint.persistent_start(&barrier, &[]),
                    endpoint.barrier_start(&group),
                    endpoint.persistent_start(&sum, &value),
                ];
                for wanted in tickets {
                    loop {
                        match endpoint.barrier_end(wanted) {
                            (Some(outcome), _) => break outcome.unwrap(),
                            (None, true) => {
                                endpoint.wait(Duration::from_millis(1));
                            }
                            (None, false) => panic!("ticket {wanted} lost"),
                        }
                    }
                }
                let result = endpoint.take_broadcast(tickets[2]).unwrap();
                // Ranks 0, 1 and 2: 0 + 100 + 200, and the start three times.
                assert_eq!(result, (300 + 3 * start).to_le_bytes(), "rank {rank}");
            }
        },
    );
}

/// The endpoint's allreduce in the NIC (what the C API's nicbar_coll_allreduce_start() queues):
/// every rank gets the same result, queued behind and beside barriers; a group of one gets its
/// own value.
#[test]
fn an_endpoint_allreduce_brings_every_rank_the_same_result() {
    run_ranks(
        "allreduce-endpoint",
        3,
        None,
        move |rank, endpoint, members| {
            let group = nicbar::Group::new(members.iter().copied()).unwrap();
            endpoint.port_mut().restart_barrier_numbering(&group);
            let spec = nicbar::ReduceSpec::new(nicbar::ReduceOp::PROD, nicbar::ReduceType::I64);
            let value = (rank as i64 + 2).to_le_bytes();
            let barrier = endpoint.barrier_start(&group);
            let ticket = endpoint.allreduce_start(&group, spec, &value);
            for wanted in [barrier, ticket] {
                loop {
                    match endpoint.barrier_end(wanted) {
                        (Some(outcome), _) => break outcome.unwrap(),
                        (None, true) => {
                            endpoint.wait(Duration::from_millis(1));
                        }
                        (None, false) => panic!("ticket {wanted} lost"),
                    }
                }
            }
            let result = endpoint.take_broadcast(ticket).unwrap();
            assert_eq!(result, (2i64 * 3 * 4).to_le_bytes(), "rank {rank}");
            let alone = nicbar::Group::new([members[rank]]).unwrap();
            let ticket = endpoint.allreduce_start(&alone, spec, &value);
            assert!(endpoint.barrier_end(ticket).0.unwrap().is_ok());
            assert_eq!(endpoint.take_broadcast(ticket).unwrap(), value);
        },
    );
}

/// A collective started while the port's send tokens are all out (a pipelined broadcast's
/// forwarded segments take more than the transfers' own send buffers; here, sends to a port that
/// is not open) waits for their ends and runs, rather than failing: coll/nicbar's
/// `MPI_Allreduce` right after a pipelined `MPI_Bcast` of 1 MiB at 8 processes failed so, "no
/// send token left".
#[test]
fn a_collective_started_with_every_send_token_out_waits_for_one() {
    let (daemon, _dir, mut a, mut b, members) = two_endpoints("tokens-out", 2);
    let group = nicbar::Group::new(members.iter().copied()).unwrap();
    for endpoint in [&mut a, &mut b] {
        endpoint.port_mut().restart_barrier_numbering(&group);
    }
    let closed = nicbar::PortId(3);
    while a.port().send_tokens() > 0 {
        let buffer = a.port().dma_alloc(8).unwrap();
        let size = shared_abi::min_size_for_length(8).unwrap();
        a.port_mut()
            .send(
                buffer,
                8,
                size,
                nicbar::Priority::LOW,
                members[1].node,
                closed,
                1,
            )
            .unwrap();
    }
    let spec = nicbar::ReduceSpec::new(nicbar::ReduceOp::SUM, nicbar::ReduceType::I64);
    let tickets = [
        a.allreduce_start(&group, spec, &5i64.to_le_bytes()),
        b.allreduce_start(&group, spec, &7i64.to_le_bytes()),
    ];
    let mut ends = [None, None];
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ends.iter().any(Option::is_none) {
        assert!(std::time::Instant::now() < deadline, "no progress in 10 s");
        for (index, endpoint) in [&mut a, &mut b].into_iter().enumerate() {
            if ends[index].is_none() {
                let (end, pending) = endpoint.barrier_end(tickets[index]);
                assert!(end.is_some() || pending, "ticket {} lost", tickets[index]);
                if let Some(outcome) = &end {
                    assert_eq!(outcome, &Ok(()), "rank {index}");
                }
                ends[index] = end;
            }
        }
    }
    for (index, endpoint) in [&mut a, &mut b].into_iter().enumerate() {
        assert_eq!(
            endpoint.take_broadcast(tickets[index]),
            Some(12i64.to_le_bytes().to_vec()),
            "rank {index}"
        );
    }
    for endpoint in [a, b] {
        endpoint.close().unwrap();
    }
    drop(daemon);
}
