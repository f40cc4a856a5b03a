//! ARMCI between real processes on the emulated NIC, with its fault injector losing, duplicating
//! and reordering packets throughout: concurrent accumulates and locked read-modify-write
//! sections end with exact totals; a put before a fence (or before nothing at all) is visible to
//! every rank past the next barrier, in each fence and barrier mode; the mutex is mutually
//! exclusive and grants in FIFO order under 8 contending ranks, in both lock modes; and a C
//! program written against `armci.h` gets exact totals started by `nicbar-armci-run`, and by
//! `mpirun` (where Open MPI is installed) with no setting but the daemon's socket.
//!
//! The daemon runs in the test process; each rank is a child (this test binary in a role, or the
//! C program), so the NIC reaches the ranks' memory across processes as for any program.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use armci::{Armci, BarrierMode, Config, FenceMode, Grant, LockMode, Rmw, Scale};
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle, FaultConfig};

/// How long one job may run before it fails.
const JOB_LIMIT: Duration = Duration::from_secs(120);
/// The environment variable naming the child's scenario.
const ROLE: &str = "NICBAR_ARMCI_TEST_ROLE";

/// The test's seed: `NICBAR_TEST_SEED` if set, else `default`; printed so a failure replays.
fn seed(default: u64) -> u64 {
    let seed = std::env::var("NICBAR_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    eprintln!("seed {seed} (replay with NICBAR_TEST_SEED={seed})");
    seed
}

/// An emulator with `units` NICs and faults from `seed` (2 % loss, duplication and reordering).
fn daemon(dir: &Path, units: u16, seed: u64) -> EmulatorHandle {
    let mut config = EmulatorConfig::in_process(dir.join("control.sock"), units);
    let faults = FaultConfig {
        loss: 0.02,
        duplicate: 0.02,
        reorder: 0.02,
        ..FaultConfig::none(seed)
    };
    eprintln!("fault injector: {faults}");
    config.faults = Some(faults);
    Emulator::spawn(config).unwrap()
}

/// The environment of rank `rank` of `size`, one NIC per rank.
fn rank_env(socket: &Path, dir: &Path, rank: usize, size: usize) -> Vec<(String, String)> {
    vec![
        ("NICBAR_SOCKET".into(), socket.display().to_string()),
        ("NICBAR_ARMCI_RANK".into(), rank.to_string()),
        ("NICBAR_ARMCI_SIZE".into(), size.to_string()),
        ("NICBAR_ARMCI_UNIT".into(), rank.to_string()),
        (
            "NICBAR_ARMCI_DIR".into(),
            dir.join("rendezvous").display().to_string(),
        ),
    ]
}

/// Waits for `children` (with their names), failing the test with their output if one fails or
/// the job outlives [`JOB_LIMIT`]. Returns each one's standard output.
fn wait_all(children: Vec<(String, Child)>) -> Vec<String> {
    let deadline = Instant::now() + JOB_LIMIT;
    let mut outputs = Vec::new();
    let mut children: Vec<(String, Child, Option<std::process::ExitStatus>)> =
        children.into_iter().map(|(n, c)| (n, c, None)).collect();
    loop {
        let mut running = false;
        for (_, child, status) in children.iter_mut() {
            if status.is_none() {
                *status = child.try_wait().unwrap();
                running |= status.is_none();
            }
        }
        let failed = children
            .iter()
            .any(|(_, _, s)| s.is_some_and(|s| !s.success()));
        if !running || failed || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut report = String::new();
    let mut ok = true;
    for (name, mut child, status) in children {
        if status.is_none() {
            let _ = child.kill();
        }
        let status = child.wait().unwrap();
        let mut output = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut output);
        }
        ok &= status.success();
        report.push_str(&format!("--- {name}: {status}\n{output}\n"));
        outputs.push(output);
    }
    assert!(
        ok,
        "a rank failed or the job took over {JOB_LIMIT:?}:\n{report}"
    );
    outputs
}

/// Starts `size` ranks of this test binary in `role` with `config`, against a fresh daemon, and
/// returns their outputs.
fn run_job(role: &str, size: usize, config: Config, seed: u64) -> Vec<String> {
    let dir = tempfile::Builder::new()
        .prefix("nicbar-armci")
        .tempdir()
        .unwrap();
    let daemon = daemon(dir.path(), size as u16, seed);
    let children = (0..size)
        .map(|rank| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args([
                    "--exact",
                    "child",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(ROLE, role)
                .envs(rank_env(daemon.socket(), dir.path(), rank, size))
                .envs(config.to_env())
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            (format!("rank {rank}"), command.spawn().unwrap())
        })
        .collect();
    let outputs = wait_all(children);
    drop(daemon);
    outputs
}

/// What follows `prefix` in the lines of `output` that hold it (libtest may print `test child
/// ... ` before a child's first line).
fn lines<'a>(output: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    output
        .lines()
        .filter_map(move |line| line.find(prefix).map(|at| line[at + prefix.len()..].trim()))
}

/// Words of `bytes` as little-endian `u64`s.
fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect()
}

// ---- the ranks' scenarios --------------------------------------------------------------------

/// Accumulates of every type and locked read-modify-write sections, concurrently from every
/// rank into every rank; rank 0 prints the totals each rank holds.
const ACC_ROUNDS: usize = 12;

fn accumulate_scenario(armci: &mut Armci) {
    let (me, size) = (armci.rank(), armci.size());
    // [int, int][long][float, pad][double][locked counter][rmw int, pad][rmw long]
    let bases = armci.malloc(64).unwrap();
    armci.create_mutexes(1).unwrap();
    armci.barrier().unwrap();
    let ints: Vec<u8> = [1i32, 2].iter().flat_map(|v| v.to_ne_bytes()).collect();
    for round in 0..ACC_ROUNDS {
        let target = (me + round) % size;
        let base = bases[target];
        armci.acc(Scale::Int(3), &ints, base, target).unwrap();
        armci
            .acc(Scale::Long(-2), &5i64.to_ne_bytes(), base + 8, target)
            .unwrap();
        armci
            .acc(Scale::Float(0.5), &3.0f32.to_ne_bytes(), base + 16, target)
            .unwrap();
        armci
            .acc(
                Scale::Double(0.25),
                &1.0f64.to_ne_bytes(),
                base + 24,
                target,
            )
            .unwrap();
        // A read-modify-write under the target's mutex: get, add, put, fence, unlock.
        armci.lock(0, target).unwrap();
        let mut counter = [0u8; 8];
        armci.get(base + 32, &mut counter, target).unwrap();
        let counter = u64::from_le_bytes(counter) + 1;
        armci
            .put(&counter.to_le_bytes(), base + 32, target)
            .unwrap();
        armci.fence(target).unwrap();
        armci.unlock(0, target).unwrap();
        armci.rmw(Rmw::FetchAndAdd(-1), base + 44, target).unwrap();
        armci
            .rmw(Rmw::FetchAndAddLong(7), base + 48, target)
            .unwrap();
    }
    armci.barrier().unwrap();
    let mut held = vec![0u8; 56];
    armci.local_memory(bases[me]).unwrap().read(0, &mut held);
    let int = |at: usize| i32::from_ne_bytes(held[at..at + 4].try_into().unwrap());
    println!(
        "totals {} {} {} {} {} {} {} {}",
        int(0),
        int(4),
        i64::from_ne_bytes(held[8..16].try_into().unwrap()),
        f32::from_ne_bytes(held[16..20].try_into().unwrap()),
        f64::from_ne_bytes(held[24..32].try_into().unwrap()),
        u64::from_le_bytes(held[32..40].try_into().unwrap()),
        int(44),
        i64::from_ne_bytes(held[48..56].try_into().unwrap()),
    );
    armci.destroy_mutexes().unwrap();
}

/// Rounds of puts to every rank, each followed by a barrier (after a fence to every rank in odd
/// rounds, with nothing in even ones); after each barrier every rank checks what it holds and
/// what a get of another rank's memory shows.
const VISIBILITY_ROUNDS: u64 = 10;

fn visibility_scenario(armci: &mut Armci) {
    let (me, size) = (armci.rank(), armci.size());
    // Slot r of each rank: what rank r put there last, 64 bytes of it.
    let bases = armci.malloc(64 * size).unwrap();
    let stamp = |round: u64, from: usize, to: usize| -> Vec<u8> {
        (0..8u64)
            .flat_map(|i| (round << 32 | (from as u64) << 16 | (to as u64) << 8 | i).to_le_bytes())
            .collect()
    };
    for round in 1..=VISIBILITY_ROUNDS {
        for step in 0..size {
            let to = (me + step) % size;
            armci
                .put(&stamp(round, me, to), bases[to] + 64 * me as u64, to)
                .unwrap();
            if round % 2 == 1 {
                armci.fence(to).unwrap();
            }
        }
        armci.barrier().unwrap();
        let local = armci.local_memory(bases[me]).unwrap().to_vec(0, 64 * size);
        for from in 0..size {
            assert_eq!(
                local[64 * from..64 * (from + 1)],
                stamp(round, from, me)[..],
                "round {round}: rank {from}'s put is not in rank {me}'s memory past the barrier"
            );
        }
        let other = (me + 1) % size;
        let mut seen = vec![0u8; 64 * size];
        armci.get(bases[other], &mut seen, other).unwrap();
        for from in 0..size {
            assert_eq!(
                seen[64 * from..64 * (from + 1)],
                stamp(round, from, other)[..],
                "round {round}: a get of rank {other} misses rank {from}'s put"
            );
        }
        // Nobody puts the next round before everyone has looked.
        armci.barrier().unwrap();
    }
    println!("visible {VISIBILITY_ROUNDS}");
}

/// Every rank takes mutex 0 of rank 0 this often.
const LOCK_ROUNDS: u64 = 12;

fn lock_scenario(armci: &mut Armci) {
    let (me, size) = (armci.rank(), armci.size());
    // [occupancy][log length][log entries: rank, order, predecessor]
    let entries = size * LOCK_ROUNDS as usize;
    let bases = armci.malloc(16 + 24 * entries).unwrap();
    armci.create_mutexes(1).unwrap();
    armci.barrier().unwrap();
    let base = bases[0];
    for _ in 0..LOCK_ROUNDS {
        let grant = armci.lock(0, 0).unwrap();
        let inside = armci.rmw(Rmw::FetchAndAddLong(1), base, 0).unwrap();
        assert_eq!(
            inside, 0,
            "rank {me} entered with {inside} other holders inside"
        );
        let mut length = [0u8; 8];
        armci.get(base + 8, &mut length, 0).unwrap();
        let length = u64::from_le_bytes(length);
        let (order, predecessor) = match grant {
            Grant::Ticket(ticket) => (ticket, 0),
            Grant::Queue {
                sequence,
                predecessor,
            } => (
                sequence,
                predecessor.map_or(0, |(rank, seq)| (rank as u64 + 1) << 48 | seq),
            ),
        };
        let entry: Vec<u8> = [me as u64, order, predecessor]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        armci.put(&entry, base + 16 + 24 * length, 0).unwrap();
        armci.put(&(length + 1).to_le_bytes(), base + 8, 0).unwrap();
        armci.fence(0).unwrap();
        let inside = armci.rmw(Rmw::FetchAndAddLong(-1), base, 0).unwrap();
        assert_eq!(inside, 1, "rank {me} left with {} holders inside", inside);
        armci.unlock(0, 0).unwrap();
    }
    armci.barrier().unwrap();
    if me == 0 {
        let held = armci
            .local_memory(base)
            .unwrap()
            .to_vec(0, 16 + 24 * entries);
        let log = words(&held);
        println!("length {}", log[1]);
        for entry in log[2..].chunks(3) {
            println!("entry {} {} {}", entry[0], entry[1], entry[2]);
        }
    }
    armci.destroy_mutexes().unwrap();
}

/// Rank 0 takes mutex 0 of rank 2 and dies holding it; ranks 1 and 3 then ask for it. Neither
/// may wait for ever: each fails naming the dead rank (or the waiter ahead of it that gave up
/// because of it), or is granted the lock once the rank ahead gave up and freed it. Rank 2 (the
/// lock's owner) stays until both say they are done and have left.
/// The survivors leave without ARMCI_Finalize, whose barrier would wait for the dead rank.
fn holder_dies_scenario(armci: &mut Armci) {
    let me = armci.rank();
    let bases = armci.malloc(8).unwrap();
    armci.create_mutexes(1).unwrap();
    if me == 0 {
        armci.lock(0, 2).unwrap();
    }
    armci.barrier().unwrap();
    match me {
        0 => {
            println!("dying with the lock held");
            std::process::exit(0);
        }
        2 => {
            let deadline = Instant::now() + Duration::from_secs(60);
            let memory = armci.local_memory(bases[2]).unwrap();
            while memory.to_vec(0, 8)[1] == 0 || memory.to_vec(0, 8)[3] == 0 {
                assert!(Instant::now() < deadline, "the waiters never finished");
                std::thread::sleep(Duration::from_millis(5));
            }
            println!("both waiters done");
            // Stay until both have left, so that their fences to this rank complete.
            for waiter in [1, 3] {
                while armci
                    .rmw(Rmw::FetchAndAddLong(0), bases[waiter], waiter)
                    .is_ok()
                {
                    assert!(Instant::now() < deadline, "rank {waiter} never left");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
        _ => {
            match armci.lock(0, 2) {
                Ok(_) => {
                    println!("first attempt granted");
                    armci.unlock(0, 2).unwrap();
                }
                Err(armci::ArmciError::LockAbandoned { rank, gone, .. }) => {
                    println!("first attempt abandoned: rank {rank} gone {gone}");
                }
                Err(other) => panic!("rank {me}: the wrong failure: {other}"),
            }
            armci.put(&[1], bases[2] + me as u64, 2).unwrap();
            armci.fence(2).unwrap();
        }
    }
    std::process::exit(0);
}

/// The body of the child processes: one scenario each, chosen by [`ROLE`].
/// Strided and vector puts on two ranks: each contiguous run is one NIC put (whole rows merge
/// into one), the bytes land where the shape says, a strided get brings them back, and a
/// handle's wait returns once its puts are in the target's memory.
fn strided_scenario(armci: &mut Armci) {
    use armci::Strides;
    let me = armci.rank();
    let bases = armci.malloc(4096).unwrap();
    armci.barrier().unwrap();
    if me == 0 {
        let source: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        let posted = |armci: &Armci| armci.puts_posted(1);
        // Three whole rows of 32 bytes, dense on both sides: one run.
        let before = posted(armci);
        let rows = Strides {
            src: &[32],
            dst: &[32],
            count: &[32, 3],
        };
        armci.put_strided(&source, bases[1], rows, 1, None).unwrap();
        let whole = posted(armci) - before;
        // The same rows out of a 100-byte-wide source into offset 512: three runs.
        let before = posted(armci);
        let patch = Strides {
            src: &[100],
            dst: &[32],
            count: &[32, 3],
        };
        armci
            .put_strided(&source, bases[1] + 512, patch, 1, None)
            .unwrap();
        let runs = posted(armci) - before;
        // Three segments under a handle.
        let before = posted(armci);
        let handle = armci.new_handle();
        let pieces: Vec<(&[u8], u64)> = (0..3)
            .map(|k| (&source[k * 10..k * 10 + 8], bases[1] + 1024 + 64 * k as u64))
            .collect();
        armci.put_pieces(&pieces, 1, Some(handle)).unwrap();
        let segments = posted(armci) - before;
        armci.wait_handle(handle).unwrap();
        assert!(
            armci.test_handle(handle).unwrap(),
            "a waited handle is done"
        );
        println!("strided: puts {whole} {runs} {segments}");
        // Back by one strided get: the patch, into a 40-byte-wide buffer.
        let mut back = vec![0u8; 120];
        let shape = Strides {
            src: &[32],
            dst: &[40],
            count: &[32, 3],
        };
        armci
            .get_strided(bases[1] + 512, &mut back, shape, 1)
            .unwrap();
        for row in 0..3 {
            assert_eq!(
                &back[row * 40..row * 40 + 32],
                &source[row * 100..row * 100 + 32]
            );
            assert_eq!(&back[row * 40 + 32..row * 40 + 40], &[0; 8]);
        }
    }
    armci.barrier().unwrap();
    if me == 1 {
        let source: Vec<u8> = (0..1000).map(|i| (i % 251) as u8).collect();
        let memory = armci.local_memory(bases[1]).unwrap().to_vec(0, 4096);
        assert_eq!(&memory[..96], &source[..96]);
        for row in 0..3 {
            assert_eq!(
                &memory[512 + row * 32..512 + row * 32 + 32],
                &source[row * 100..row * 100 + 32]
            );
        }
        for k in 0..3 {
            assert_eq!(
                &memory[1024 + 64 * k..1024 + 64 * k + 8],
                &source[k * 10..k * 10 + 8]
            );
        }
        println!("strided: landed");
    }
}

#[test]
#[ignore = "run by the other tests as a child process"]
fn child() {
    let role = std::env::var(ROLE).expect("started by another test");
    let mut armci = Armci::init().unwrap();
    match role.as_str() {
        "accumulate" => accumulate_scenario(&mut armci),
        "visibility" => visibility_scenario(&mut armci),
        "lock" => lock_scenario(&mut armci),
        "holder dies" => holder_dies_scenario(&mut armci),
        "strided" => strided_scenario(&mut armci),
        other => panic!("unknown role {other}"),
    }
    armci.finalize().unwrap();
}

// ---- the tests -------------------------------------------------------------------------------

#[test]
fn concurrent_accumulates_and_locked_sections_end_with_exact_totals() {
    let seed = seed(15);
    let size = 4;
    for lock in [LockMode::Mcs, LockMode::Ticket] {
        let config = Config {
            lock,
            ..Config::default()
        };
        eprintln!("lock mode {lock:?}");
        let outputs = run_job("accumulate", size, config, seed);
        // Each rank accumulates into each target ACC_ROUNDS / size times.
        let visits = ACC_ROUNDS / size;
        let n = (size * visits) as i64;
        let expected = format!(
            "{} {} {} {} {} {} {} {}",
            3 * n,
            6 * n,
            -10 * n,
            1.5 * n as f32,
            0.25 * n as f64,
            n,
            -n,
            7 * n
        );
        for (rank, output) in outputs.iter().enumerate() {
            let totals: Vec<&str> = lines(output, "totals ").collect();
            assert_eq!(totals, [expected.as_str()], "rank {rank} ({lock:?})");
        }
    }
}

#[test]
fn strided_and_vector_puts_are_one_nic_put_per_contiguous_run_and_land_by_the_shape() {
    let outputs = run_job("strided", 2, Config::default(), seed(22));
    let puts: Vec<&str> = lines(&outputs[0], "strided: puts ").collect();
    assert_eq!(puts, ["1 3 3"], "whole rows, a patch of 3 rows, 3 segments");
    assert_eq!(
        lines(&outputs[1], "strided: ").collect::<Vec<_>>(),
        ["landed"]
    );
}

#[test]
fn a_put_before_a_fence_or_barrier_is_visible_to_every_rank_past_it_in_every_mode() {
    let seed = seed(16);
    let modes = [
        (FenceMode::Sequential, BarrierMode::FenceThenBarrier),
        (FenceMode::Outstanding(2), BarrierMode::FenceThenBarrier),
        (FenceMode::Completions, BarrierMode::FenceThenBarrier),
        (FenceMode::Outstanding(8), BarrierMode::Fused),
    ];
    for (fence, barrier) in modes {
        eprintln!("{fence:?}, {barrier:?}");
        let config = Config {
            fence,
            barrier,
            ..Config::default()
        };
        // 5 ranks: the fused barrier's sum folds a rank that is not a power of two.
        for output in run_job("visibility", 5, config, seed) {
            assert_eq!(
                lines(&output, "visible ").collect::<Vec<_>>(),
                [VISIBILITY_ROUNDS.to_string()]
            );
        }
    }
}

#[test]
fn the_mutex_excludes_and_grants_in_fifo_order_under_8_contending_ranks() {
    let seed = seed(17);
    let size = 8;
    for lock in [LockMode::Mcs, LockMode::Ticket] {
        eprintln!("lock mode {lock:?}");
        let config = Config {
            lock,
            ..Config::default()
        };
        let outputs = run_job("lock", size, config, seed);
        let total = size as u64 * LOCK_ROUNDS;
        assert_eq!(
            lines(&outputs[0], "length ").collect::<Vec<_>>(),
            [total.to_string()],
            "every section logged once: none lost an update to another"
        );
        let log: Vec<[u64; 3]> = lines(&outputs[0], "entry ")
            .map(|l| {
                let v: Vec<u64> = l.split(' ').map(|w| w.parse().unwrap()).collect();
                [v[0], v[1], v[2]]
            })
            .collect();
        assert_eq!(log.len() as u64, total);
        for rank in 0..size as u64 {
            assert_eq!(
                log.iter().filter(|e| e[0] == rank).count() as u64,
                LOCK_ROUNDS,
                "rank {rank}'s sections"
            );
        }
        let mut queued = 0;
        for (i, entry) in log.iter().enumerate() {
            match lock {
                // FIFO: the tickets come in order, every one of them.
                LockMode::Ticket => assert_eq!(entry[1], i as u64, "grant {i}: {log:?}"),
                // FIFO: whoever queued behind an acquisition is the very next to hold the lock.
                LockMode::Mcs if entry[2] != 0 => {
                    queued += 1;
                    let previous = log[i - 1];
                    assert_eq!(
                        entry[2],
                        (previous[0] + 1) << 48 | previous[1],
                        "grant {i} queued behind another than the holder before it: {log:?}"
                    );
                }
                LockMode::Mcs => {}
            }
        }
        if lock == LockMode::Mcs {
            eprintln!("{queued} of {total} grants waited in the queue");
            assert!(
                queued > 0,
                "8 contending ranks never queued: no contention tested"
            );
        }
    }
}

#[test]
fn a_rank_dying_with_the_mutex_held_fails_its_waiters_and_frees_the_lock() {
    let seed = seed(19);
    let outputs = run_job("holder dies", 4, Config::default(), seed);
    assert_eq!(
        lines(&outputs[0], "dying").count(),
        1,
        "rank 0 took the lock before it died"
    );
    assert_eq!(lines(&outputs[2], "both waiters done").count(), 1);
    let mut abandoned = Vec::new();
    for rank in [1, 3] {
        let first: Vec<&str> = lines(&outputs[rank], "first attempt ").collect();
        assert_eq!(first.len(), 1, "rank {rank}: {}", outputs[rank]);
        if let Some(why) = first[0].strip_prefix("abandoned: ") {
            abandoned.push((rank, why.to_owned()));
        }
    }
    // Whoever queued right behind the dead holder names it; a waiter behind that one names
    // the waiter that gave up. The first to ask always queued behind the holder.
    assert!(
        abandoned.iter().any(|(_, why)| why == "rank 0 gone true"),
        "no waiter named the dead holder: {abandoned:?}"
    );
    for (rank, why) in &abandoned {
        let other = 4 - rank;
        assert!(
            why == "rank 0 gone true" || why == &format!("rank {other} gone false"),
            "rank {rank}: {why}"
        );
    }
}

/// `host-lib/armci/`.
fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory cargo built this test and the `libarmci.so` it tests into:
/// `target/<profile>/deps` (the copy in `target/<profile>` is a `cargo build`'s, maybe older).
fn built_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_owned()
}

/// Compiles `c/<name>.c` against this build's `libarmci.so` into `dir`.
fn compile_c(dir: &Path, name: &str) -> PathBuf {
    let built = built_dir();
    let library = built.join("libarmci.so");
    assert!(
        library.exists(),
        "{} is missing: the crate builds a cdylib",
        library.display()
    );
    let program = dir.join(name);
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let compiled = Command::new(cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join(format!("c/{name}.c")))
        .arg("-o")
        .arg(&program)
        .arg("-L")
        .arg(&built)
        .arg("-larmci")
        // RPATH, not RUNPATH: cargo's LD_LIBRARY_PATH names target/<profile> first, whose
        // libarmci.so may be an older build's.
        .arg(format!(
            "-Wl,--disable-new-dtags,-rpath,{}",
            built.display()
        ))
        .status()
        .unwrap();
    assert!(compiled.success(), "{name}.c does not compile: {compiled}");
    program
}

/// Compiles `c/armci_counter.c`.
fn compile_counter(dir: &Path) -> PathBuf {
    compile_c(dir, "armci_counter")
}

/// Runs `program` with `args` on `size` ranks under the launcher against `daemon`, with the
/// extra environment `env`; returns its exit status and standard output (the job's limit
/// applies).
fn launch(
    daemon: &EmulatorHandle,
    size: usize,
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (std::process::ExitStatus, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_nicbar-armci-run"));
    command
        .args([
            "-n",
            &size.to_string(),
            "--units",
            &size.to_string(),
            "--socket",
        ])
        .arg(daemon.socket())
        .arg(program)
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let deadline = Instant::now() + JOB_LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("{} took over {JOB_LIMIT:?}", program.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    (status, output)
}

#[test]
fn a_c_program_using_the_rest_of_armci_gets_exact_results_under_the_launcher() {
    let seed = seed(20);
    let dir = tempfile::Builder::new()
        .prefix("nicbar-armci-api")
        .tempdir()
        .unwrap();
    let program = compile_c(dir.path(), "armci_api");
    for size in [4, 3] {
        let place = dir.path().join(format!("{size}-ranks"));
        std::fs::create_dir_all(&place).unwrap();
        let daemon = daemon(&place, size as u16, seed);
        let (status, output) = launch(&daemon, size, &program, &[], &[]);
        assert!(status.success(), "{size} ranks: {status}\n{output}");
        let ok: Vec<&str> = lines(&output, "armci_api: ").collect();
        assert_eq!(ok.len(), size, "every rank reports: {output}");
        assert!(ok.iter().all(|l| l.ends_with(" ok")), "{output}");
    }
}

#[test]
fn armci_error_prints_the_rank_message_and_code_and_aborts() {
    let dir = tempfile::Builder::new()
        .prefix("nicbar-armci-error")
        .tempdir()
        .unwrap();
    let program = compile_c(dir.path(), "armci_api");
    let daemon = daemon(dir.path(), 1, seed(21));
    let (status, output) = launch(&daemon, 1, &program, &["error"], &[]);
    assert!(!status.success(), "ARMCI_Error ends the job: {output}");
    assert!(
        output.contains("0:armci_api: an error on purpose: 42"),
        "{output}"
    );
    assert!(!output.contains(" ok"), "{output}");
}

#[test]
fn a_c_program_using_armci_h_gets_exact_totals_under_the_launcher() {
    let seed = seed(18);
    let dir = tempfile::Builder::new()
        .prefix("nicbar-armci-c")
        .tempdir()
        .unwrap();
    let program = compile_counter(dir.path());
    let size = 4;
    let daemon = daemon(dir.path(), size, seed);
    for lock in ["mcs", "ticket"] {
        let launcher = Command::new(env!("CARGO_BIN_EXE_nicbar-armci-run"))
            .args([
                "-n",
                &size.to_string(),
                "--units",
                &size.to_string(),
                "--socket",
            ])
            .arg(daemon.socket())
            .arg(&program)
            .arg("25")
            .env("NICBAR_ARMCI_LOCK", lock)
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let outputs = wait_all(vec![(format!("nicbar-armci-run ({lock})"), launcher)]);
        let ok: Vec<&str> = lines(&outputs[0], "armci_counter: ").collect();
        assert_eq!(
            ok.len(),
            size as usize,
            "every rank reports: {}",
            outputs[0]
        );
        assert!(ok.iter().all(|l| l.ends_with(" ok")), "{}", outputs[0]);
    }
}

#[test]
fn the_c_programs_run_under_mpirun_with_no_setting_but_the_socket() {
    let Ok(version) = Command::new("mpirun").arg("--version").output() else {
        eprintln!("mpirun is not installed: this test checks nothing here");
        return;
    };
    assert!(version.status.success());
    let seed = seed(19);
    let dir = tempfile::Builder::new()
        .prefix("nicbar-armci-mpi")
        .tempdir()
        .unwrap();
    let size: u16 = 4;
    let daemon = daemon(dir.path(), size, seed);
    for (name, args, prefix) in [
        ("armci_counter", &["10"][..], "armci_counter: "),
        ("armci_api", &[][..], "armci_api: "),
    ] {
        let program = compile_c(dir.path(), name);
        let mpirun = Command::new("mpirun")
            .args(["--oversubscribe", "-np", &size.to_string()])
            .args(["-x", "NICBAR_SOCKET", "-x", "NICBAR_ARMCI_UNITS"])
            .arg(&program)
            .args(args)
            .env("NICBAR_SOCKET", daemon.socket())
            .env("NICBAR_ARMCI_UNITS", size.to_string())
            // Open MPI refuses root without these; they change nothing for anyone else.
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env_remove("LD_LIBRARY_PATH")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let outputs = wait_all(vec![(format!("mpirun {name}"), mpirun)]);
        let ok: Vec<&str> = lines(&outputs[0], prefix).collect();
        assert_eq!(
            ok.len(),
            usize::from(size),
            "every rank reports: {}",
            outputs[0]
        );
        assert!(ok.iter().all(|l| l.ends_with(" ok")), "{}", outputs[0]);
    }
}
