//! The C API as C programs see it: the examples in `host-lib/examples/c/` are compiled with `cc`
//! against the checked-in header and `libnicbar` (the cdylib, and once the staticlib) from this
//! build,
//! and run as separate processes against an emulated NIC daemon ([`Emulator::spawn`] in this
//! process, or `nicctl emulate` from an installed prefix). Each program checks its own data and
//! exits non-zero on the first thing wrong; the tests check exit codes and output.
//!
//! Every wait is bounded: a program that does not finish in time is killed and the test fails
//! with what it printed.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nicbar_control::query_status;
use nicbar_emulator::{Emulator, EmulatorConfig, EmulatorHandle};

/// How long one program may run.
const RUN_LIMIT: Duration = Duration::from_secs(90);
/// The port every example opens.
const EXAMPLE_PORT: u8 = 2;
/// What a static link of libnicbar.a needs besides it (rustc's native-static-libs on Linux).
const STATIC_LIBS: [&str; 7] = [
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

/// `host-lib/`: the header (`include/`) and the C examples (`examples/c/`).
fn crate_dir() -> PathBuf {
    let capi = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    capi.parent()
        .expect("host-lib/capi has a parent")
        .to_owned()
}

/// Held shared while this build's `libnicbar` is copied, exclusively while the install test runs
/// cargo (which may build the C library again and replace the files).
static LIBRARY_FILES: RwLock<()> = RwLock::new(());

/// A copy of this build's `libnicbar.so` and `libnicbar.a`, private to this test process: the
/// programs link and load it, so a cargo run by the install test cannot swap the library under
/// them.
fn libraries() -> &'static Path {
    static COPY: OnceLock<PathBuf> = OnceLock::new();
    COPY.get_or_init(|| {
        let _shared = LIBRARY_FILES.read().unwrap_or_else(PoisonError::into_inner);
        // The directory cargo built this test and the library into: target/<profile>.
        let exe = std::env::current_exe().expect("the test's own path");
        let built = exe
            .parent()
            .and_then(Path::parent)
            .expect("the test runs from target/<profile>/deps");
        let copy = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("capi-examples")
            .join(format!("lib-{}", std::process::id()));
        std::fs::create_dir_all(&copy).unwrap();
        {
            // `cargo test` may not have built the C library yet (on a fresh tree, with a filter
            // on the tests), or may have left an older one (it does not rebuild a cdylib the
            // tests do not link): build it, into the same directory, with the same profile (the
            // test profile's output is the dev profile's). Cargo does nothing if it is current.
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let mut build = Command::new(cargo);
            build
                .current_dir(crate_dir())
                .args(["build", "--quiet", "-p", "nicbar-capi", "--lib"]);
            if built.file_name().is_some_and(|name| name != "debug") {
                build
                    .arg("--profile")
                    .arg(built.file_name().unwrap_or_default());
            }
            let status = build.status().expect("running cargo to build libnicbar");
            assert!(
                status.success(),
                "cargo build -p nicbar-capi failed: {status}"
            );
        }
        for library in ["libnicbar.so", "libnicbar.a"] {
            let from = built.join(library);
            assert!(
                from.exists(),
                "{library} is missing from {}: nicbar-capi's crate-type must include cdylib and \
                 staticlib",
                built.display()
            );
            std::fs::copy(&from, copy.join(library)).unwrap();
        }
        copy
    })
}

/// A directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        static COUNT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Under the system's temporary directory: socket paths must stay short.
        let dir =
            std::env::temp_dir().join(format!("nicbar-capi-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// How a program links `libnicbar`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Link {
    Dynamic,
    Static,
}

/// Runs `command`, failing with its output unless it succeeds.
fn run_to_success(command: &mut Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{what}: could not run {command:?}: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The C compiler: `CC`, else `cc`.
fn cc() -> Command {
    Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
}

/// `examples/c/<name>.c`, compiled once per test process and link mode, against the checked-in
/// header.
fn example(name: &str, link: Link) -> PathBuf {
    compiled(&crate_dir().join("examples/c"), name, link)
}

/// `capi/tests/c/<name>.c`: a C test written as GM programs are, compiled as the examples are.
fn c_test(name: &str) -> PathBuf {
    compiled(&crate_dir().join("capi/tests/c"), name, Link::Dynamic)
}

/// `<dir>/<name>.c`, compiled once per test process and link mode.
fn compiled(dir: &Path, name: &str, link: Link) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<(String, Link), PathBuf>>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap();
    if let Some(path) = built.get(&(name.to_owned(), link)) {
        return path.clone();
    }
    let libraries = libraries();
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-examples");
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(format!("{name}-{link:?}-{}", std::process::id()));
    let mut command = cc();
    command
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
            "-I",
        ])
        .arg(crate_dir().join("include"))
        .arg(dir.join(format!("{name}.c")))
        .arg("-o")
        .arg(&binary);
    match link {
        Link::Dynamic => {
            command
                .arg("-L")
                .arg(libraries)
                .arg("-lnicbar")
                .arg(format!("-Wl,-rpath,{}", libraries.display()));
        }
        Link::Static => {
            command.arg(libraries.join("libnicbar.a")).args(STATIC_LIBS);
        }
    }
    run_to_success(&mut command, &format!("compiling {name}.c ({link:?})"));
    built.insert((name.to_owned(), link), binary.clone());
    binary
}

/// A daemon in this process running `units` NICs (nodes 0..units) on a socket of its own.
fn daemon(scratch: &Scratch, units: u16) -> EmulatorHandle {
    Emulator::spawn(EmulatorConfig::in_process(
        scratch.path().join("control.sock"),
        units,
    ))
    .expect("the emulator starts")
}

/// A C program running, its output collected as it comes.
struct Running {
    name: String,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

/// What a program did.
#[derive(Debug)]
struct Finished {
    name: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Finished {
    fn assert_success(&self) {
        assert!(
            self.status.success(),
            "{} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            self.name,
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

fn collect(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

fn start(name: &str, binary: &Path, args: &[String], socket: &Path) -> Running {
    start_in_job(name, binary, args, socket, None)
}

/// As [`start`], the program in job `job` (`NICBAR_JOB`), or in none.
fn start_in_job(
    name: &str,
    binary: &Path,
    args: &[String],
    socket: &Path,
    job: Option<u32>,
) -> Running {
    let mut command = Command::new(binary);
    match job {
        Some(job) => command.env("NICBAR_JOB", job.to_string()),
        None => command.env_remove("NICBAR_JOB"),
    };
    let mut child = command
        .args(args)
        .env("NICBAR_SOCKET", socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("starting {name}: {error}"));
    let stdout = child.stdout.take().map(collect);
    let stderr = child.stderr.take().map(collect);
    Running {
        name: name.to_owned(),
        child,
        stdout,
        stderr,
    }
}

/// Waits for every program, at most `limit` in all; kills them all and fails, showing what
/// each printed, if one is still running then.
fn finish(mut running: Vec<Running>, limit: Duration) -> Vec<Finished> {
    let deadline = Instant::now() + limit;
    let mut statuses: Vec<Option<ExitStatus>> = running.iter().map(|_| None).collect();
    while statuses.iter().any(Option::is_none) && Instant::now() < deadline {
        for (program, status) in running.iter_mut().zip(&mut statuses) {
            if status.is_none() {
                *status = program.child.try_wait().expect("waiting for a program");
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let timed_out = statuses.iter().any(Option::is_none);
    for program in &mut running {
        let _ = program.child.kill();
    }
    let finished: Vec<Finished> = running
        .into_iter()
        .zip(statuses)
        .map(|(mut program, status)| {
            let status = match status {
                Some(status) => status,
                None => program.child.wait().expect("reaping a killed program"),
            };
            Finished {
                name: program.name,
                status,
                stdout: program
                    .stdout
                    .take()
                    .map(|h| h.join().unwrap())
                    .unwrap_or_default(),
                stderr: program
                    .stderr
                    .take()
                    .map(|h| h.join().unwrap())
                    .unwrap_or_default(),
            }
        })
        .collect();
    assert!(
        !timed_out,
        "programs still running after {limit:?} were killed:\n{finished:#?}"
    );
    finished
}

fn args(values: &[&dyn ToString]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}

// ---------------------------------------------------------------------------------------------

#[test]
fn the_header_compiles_as_c_and_cxx_with_gms_event_layout() {
    let scratch = Scratch::new("header");
    let source = scratch.path().join("layout.c");
    std::fs::write(
        &source,
        r#"#include <nicbar/gm.h>
#include <stddef.h>
#define CHECK(name, condition) typedef char name[(condition) ? 1 : -1]
CHECK(event_is_64_bytes, sizeof(gm_recv_event_t) == 64);
CHECK(type_is_last, offsetof(gm_recv_t, type) == 63);
CHECK(sent_type_is_last, offsetof(gm_sent_t, type) == 63);
CHECK(barrier_type_is_last, offsetof(gm_barrier_event_t, type) == 63);
CHECK(buffer_at_40, offsetof(gm_recv_t, buffer) == 40);
CHECK(length_at_52, offsetof(gm_recv_t, length) == 52);
CHECK(sender_node_at_56, offsetof(gm_recv_t, sender_node_id) == 56);
CHECK(tag_at_60, offsetof(gm_recv_t, tag) == 60);
CHECK(status_codes_are_gms, GM_SEND_TIMED_OUT == 15 && GM_SEND_TARGET_PORT_CLOSED == 17
      && GM_SEND_TARGET_NODE_UNREACHABLE == 18 && GM_SUCCESS == 0);
CHECK(event_types_are_gms, GM_NO_RECV_EVENT == 0 && GM_RECV_EVENT == 11
      && GM_HIGH_RECV_EVENT == 12);
/* GM's strong types: a field is read through its accessor. */
unsigned int length_of(gm_recv_event_t *e) { return gm_ntoh_u32(e->recv.length); }
int main(void) { return 0; }
"#,
    )
    .unwrap();
    let include = crate_dir().join("include");
    run_to_success(
        cc().args([
            "-std=c99",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-fsyntax-only",
            "-I",
        ])
        .arg(&include)
        .arg(&source),
        "compiling the header as C99",
    );
    // A field used without its accessor must not compile.
    let misuse = scratch.path().join("misuse.c");
    std::fs::write(
        &misuse,
        "#include <nicbar/gm.h>\nunsigned int f(gm_recv_event_t *e) { return e->recv.length; }\n",
    )
    .unwrap();
    let status = cc()
        .args(["-std=c99", "-fsyntax-only", "-I"])
        .arg(&include)
        .arg(&misuse)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(
        !status.success(),
        "reading a network-order field without gm_ntoh_* compiled"
    );
    // C++ programs include it too (extern "C").
    let cxx = std::env::var_os("CXX").unwrap_or_else(|| "c++".into());
    match Command::new(&cxx).arg("--version").output() {
        Ok(output) if output.status.success() => {
            run_to_success(
                Command::new(&cxx)
                    .args([
                        "-std=c++11",
                        "-Wall",
                        "-Wextra",
                        "-Werror",
                        "-fsyntax-only",
                        "-x",
                        "c++",
                        "-I",
                    ])
                    .arg(&include)
                    .arg(&source),
                "compiling the header as C++11",
            );
        }
        _ => eprintln!(
            "no C++ compiler ({}): the header's C++ guard is not compiled",
            cxx.to_string_lossy()
        ),
    }
}

#[test]
fn ping_pong_between_two_processes_one_linked_statically() {
    let scratch = Scratch::new("pingpong");
    let emulator = daemon(&scratch, 2);
    let round_trips = 300;
    let finished = finish(
        vec![
            start(
                "pingpong (unit 1, static)",
                &example("pingpong", Link::Static),
                &args(&[&1, &0, &round_trips]),
                emulator.socket(),
            ),
            start(
                "pingpong (unit 0)",
                &example("pingpong", Link::Dynamic),
                &args(&[&0, &1, &round_trips]),
                emulator.socket(),
            ),
        ],
        RUN_LIMIT,
    );
    for program in &finished {
        program.assert_success();
    }
    assert!(
        finished[0].stdout.contains(&format!(
            "node 1 answered {round_trips} messages from node 0"
        )),
        "{finished:#?}"
    );
    assert!(
        finished[1]
            .stdout
            .contains(&format!("node 0 <-> node 1: {round_trips} round trips")),
        "{finished:#?}"
    );
}

#[test]
fn all_to_all_among_four_processes() {
    let scratch = Scratch::new("alltoall");
    let emulator = daemon(&scratch, 4);
    let rounds = 25;
    let binary = example("alltoall", Link::Dynamic);
    let running = (0..4)
        .map(|unit| {
            start(
                &format!("alltoall (unit {unit})"),
                &binary,
                &args(&[&unit, &4, &rounds]),
                emulator.socket(),
            )
        })
        .collect();
    let finished = finish(running, RUN_LIMIT);
    for (unit, program) in finished.iter().enumerate() {
        program.assert_success();
        let expected = format!(
            "node {unit} of 4: {rounds} rounds, {0} messages in and {0} out, all intact",
            3 * rounds
        );
        assert!(program.stdout.contains(&expected), "{program:#?}");
    }
}

#[test]
fn mistakes_come_back_as_statuses_events_and_callbacks() {
    let scratch = Scratch::new("errors");
    let emulator = daemon(&scratch, 1);
    let finished = finish(
        vec![start(
            "errors",
            &example("errors", Link::Dynamic),
            &args(&[&0]),
            emulator.socket(),
        )],
        RUN_LIMIT,
    );
    finished[0].assert_success();
    let checks = finished[0]
        .stdout
        .lines()
        .filter(|l| l.starts_with("ok: "))
        .count();
    assert!(
        checks >= 50,
        "only {checks} checks ran:\n{}",
        finished[0].stdout
    );
    assert!(finished[0].stdout.contains("errors: 0 check(s) failed"));
}

#[test]
fn gm2_calls_behave_as_gm_documents_them() {
    let scratch = Scratch::new("gm2");
    let emulator = daemon(&scratch, 2);
    let finished = finish(
        vec![start(
            "gm2",
            &example("gm2", Link::Dynamic),
            &args(&[&0]),
            emulator.socket(),
        )],
        RUN_LIMIT,
    );
    finished[0].assert_success();
    let checks = finished[0]
        .stdout
        .lines()
        .filter(|l| l.starts_with("ok: "))
        .count();
    assert!(
        checks >= 54,
        "only {checks} checks ran:\n{}",
        finished[0].stdout
    );
    assert!(finished[0].stdout.contains("gm2: 0 check(s) failed"));
}

/// Runs the C test `name` with `args` against a daemon of `units` NICs; it must exit 0 after
/// at least `checks` lines of `ok: `.
fn run_c_test(name: &str, units: u16, runs: &[Vec<String>], checks: usize) -> Vec<Finished> {
    let scratch = Scratch::new(name);
    let emulator = daemon(&scratch, units);
    let binary = c_test(name);
    let running = runs
        .iter()
        .enumerate()
        .map(|(i, args)| start(&format!("{name} #{i}"), &binary, args, emulator.socket()))
        .collect();
    let finished = finish(running, RUN_LIMIT);
    for program in &finished {
        program.assert_success();
    }
    let passed: usize = finished
        .iter()
        .map(|f| f.stdout.lines().filter(|l| l.starts_with("ok: ")).count())
        .sum();
    assert!(
        passed >= checks,
        "only {passed} checks passed:\n{finished:#?}"
    );
    finished
}

#[test]
fn dma_memory_is_a_page_heap_short_exact_and_large_buffers_take_their_messages() {
    run_c_test("dma", 2, &[args(&[&0])], 27);
}

#[test]
fn gms_printing_crcs_containers_and_deprecated_calls_behave_as_gm_documents_them() {
    let finished = run_c_test("utilities", 1, &[args(&[&0])], 22);
    assert!(finished[0].stdout.contains("printed by gm_printf 42 ok"));
    assert!(finished[0].stderr.contains("printed by gm_eprintf 7"));
}

/// The lengths a GM ping-pong test runs: the fast form's edge, the packet's, and 1 MiB.
const PING_PONG_LENGTHS: [&str; 8] = ["0", "1", "128", "129", "4096", "4099", "1048573", "1048576"];

/// Runs the GM-style ping-pong between ports `ports` of units 0 and 1; the initiator starts
/// first, so its first send reaches a port that is not open yet.
fn gm_ping_pong(ports: (u8, u8)) {
    let mut initiator = args(&[&0, &0, &ports.0, &1, &ports.1, &3]);
    let mut responder = args(&[&1, &1, &ports.1, &0, &ports.0, &3]);
    for length in PING_PONG_LENGTHS {
        initiator.push(length.to_owned());
        responder.push(length.to_owned());
    }
    let scratch = Scratch::new("gm-pingpong");
    let emulator = daemon(&scratch, 2);
    let binary = c_test("gm_pingpong");
    let first = start("initiator", &binary, &initiator, emulator.socket());
    let second = start("responder", &binary, &responder, emulator.socket());
    let finished = finish(vec![first, second], RUN_LIMIT);
    for program in &finished {
        program.assert_success();
    }
    for length in PING_PONG_LENGTHS {
        assert!(
            finished[0]
                .stdout
                .contains(&format!("length {length}: 3 round trips")),
            "no line for length {length}:\n{finished:#?}"
        );
    }
}

#[test]
fn a_gm_ping_pong_handling_only_gm_recv_event_runs_with_peer_and_fast_events() {
    // The same port id on both sides: every message is a peer event, the short ones fast.
    gm_ping_pong((EXAMPLE_PORT, EXAMPLE_PORT));
}

#[test]
fn a_gm_ping_pong_handling_only_gm_recv_event_runs_between_different_port_ids() {
    gm_ping_pong((EXAMPLE_PORT, EXAMPLE_PORT + 1));
}

/// Two `nicctl emulate` daemons, nodes 0 and 1, one NIC each, over UDP on loopback with a fabric
/// key: the daemons (stopped when dropped) and their sockets.
fn two_udp_daemons(scratch: &Scratch) -> (Vec<Daemon>, [PathBuf; 2]) {
    let map = scratch.path().join("fabric.map");
    std::fs::write(
        &map,
        format!(
            "node 0 127.0.0.1:{}\nnode 1 127.0.0.1:{}\n",
            free_udp_port("127.0.0.1"),
            free_udp_port("127.0.0.1"),
        ),
    )
    .unwrap();
    let key = scratch.path().join("fabric.key");
    run_to_success(
        Command::new(nicctl()).arg("keygen").arg(&key),
        "nicctl keygen",
    );
    let sockets = [
        private_dir(scratch, "zero").join("control.sock"),
        private_dir(scratch, "one").join("control.sock"),
    ];
    let daemons = [(0, &sockets[0]), (1, &sockets[1])]
        .into_iter()
        .map(|(node, socket): (u16, &PathBuf)| {
            let node = node.to_string();
            nicctl_emulate(
                socket,
                &[
                    "--fabric".as_ref(),
                    map.as_os_str(),
                    "--fabric-key".as_ref(),
                    key.as_os_str(),
                    "--node".as_ref(),
                    node.as_ref(),
                ],
            )
        })
        .collect();
    (daemons, sockets)
}

#[test]
fn a_gm_ping_pong_runs_between_two_daemons_over_udp_at_every_size_to_1_mib() {
    let scratch = Scratch::new("gm-pingpong-udp");
    let (_daemons, sockets) = two_udp_daemons(&scratch);
    // Every size class to 1 MiB + 3 (class 21): 0, then each power of two and 3 either side.
    let binary = c_test("gm_pingpong");
    let initiator = start(
        "initiator",
        &binary,
        &args(&[
            &0,
            &0,
            &EXAMPLE_PORT,
            &1,
            &EXAMPLE_PORT,
            &2,
            &"--sweep",
            &(1 << 20),
        ]),
        &sockets[0],
    );
    let responder = start(
        "responder",
        &binary,
        &args(&[
            &1,
            &0,
            &EXAMPLE_PORT,
            &0,
            &EXAMPLE_PORT,
            &2,
            &"--sweep",
            &(1 << 20),
        ]),
        &sockets[1],
    );
    let finished = finish(vec![initiator, responder], RUN_LIMIT);
    for program in &finished {
        program.assert_success();
    }
    for length in ["0", "1", "128", "4099", "1048573", "1048576", "1048579"] {
        assert!(
            finished[0]
                .stdout
                .contains(&format!("length {length}: 2 round trips")),
            "no line for length {length}:\n{finished:#?}"
        );
    }
}

#[test]
fn a_receiver_outlives_a_sender_that_dies_part_way_through_a_long_message() {
    // Over UDP, where a 16 MiB message takes long enough to be cut short by its sender's death.
    let scratch = Scratch::new("cut-short");
    let (_daemons, sockets) = two_udp_daemons(&scratch);
    let binary = c_test("cut_short");
    let ready = scratch.path().join("ready");
    let receiver = start(
        "receiver",
        &binary,
        &[
            "receive".to_owned(),
            "0".to_owned(),
            EXAMPLE_PORT.to_string(),
            ready.display().to_string(),
        ],
        &sockets[0],
    );
    // The receiver's buffer is offered once it says so (it writes the file after that).
    let deadline = Instant::now() + RUN_LIMIT;
    while !ready.exists() {
        assert!(Instant::now() < deadline, "the receiver never got ready");
        std::thread::sleep(Duration::from_millis(10));
    }
    let dying = start(
        "dying sender",
        &binary,
        &args(&[&"die", &0, &EXAMPLE_PORT, &0]),
        &sockets[1],
    );
    let died = finish(vec![dying], RUN_LIMIT);
    died[0].assert_success();
    let last = start(
        "last sender",
        &binary,
        &args(&[&"last", &0, &(EXAMPLE_PORT + 1), &0]),
        &sockets[1],
    );
    let finished = finish(vec![receiver, last], RUN_LIMIT);
    for program in &finished {
        program.assert_success();
    }
    assert!(finished[0].stdout.contains("the last message arrived"));
    // Whether the long message was cut short depends on how far it got; say which it was.
    println!(
        "the long message came {}",
        finished[0].stdout.lines().next().unwrap_or("?")
    );
}

#[test]
fn the_c_rdma_example_puts_gets_and_applies_atomics() {
    let scratch = Scratch::new("rdma");
    let emulator = daemon(&scratch, 2);
    let finished = finish(
        vec![start(
            "rdma",
            &example("rdma", Link::Dynamic),
            &args(&[&0]),
            emulator.socket(),
        )],
        RUN_LIMIT,
    );
    finished[0].assert_success();
    assert!(finished[0].stdout.contains("rdma: 0 check(s) failed"));
}

#[test]
fn the_c_fast_path_example_exchanges_messages_and_counts_exactly_under_both_locks() {
    let scratch = Scratch::new("fastpath");
    let processes = 3u16;
    let (messages, rounds) = (1500u32, 100u32);
    let emulator = daemon(&scratch, processes);
    let binary = example("fastpath", Link::Dynamic);
    let running = (0..processes)
        .map(|rank| {
            start(
                &format!("fastpath (rank {rank})"),
                &binary,
                &args(&[&rank, &processes, &messages, &rounds]),
                emulator.socket(),
            )
        })
        .collect();
    let finished = finish(running, RUN_LIMIT);
    for (rank, program) in finished.iter().enumerate() {
        program.assert_success();
        assert!(
            program
                .stdout
                .contains(&format!("fastpath: rank {rank} of {processes}: "))
                && program.stdout.contains(", 0 failed"),
            "{program:#?}"
        );
        let peers = if rank == 0 {
            u32::from(processes) - 1
        } else {
            1
        };
        assert!(
            program.stdout.contains(&format!(
                "rank {rank}: {0} messages in and {0} out, all intact",
                messages * peers
            )),
            "{program:#?}"
        );
    }
    let total = u32::from(processes - 1) * rounds;
    assert!(
        finished[0].stdout.contains(&format!(
            "rank 0: counters {total} (passive) and {total} (served) of {total}, lock words 0 0"
        )),
        "{:#?}",
        finished[0]
    );
}

/// `nicctl` of this build (`target/<profile>/nicctl`), built first so it is current.
fn nicctl() -> PathBuf {
    static NICCTL: OnceLock<PathBuf> = OnceLock::new();
    NICCTL
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test's own path");
            let profile_dir = exe
                .parent()
                .and_then(Path::parent)
                .expect("the test runs from target/<profile>/deps");
            let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => "dev",
                Some(other) => other,
            };
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            run_to_success(
                Command::new(cargo)
                    .current_dir(crate_dir())
                    .args(["build", "--quiet", "-p", "host-driver", "--bin", "nicctl"])
                    .args(["--profile", profile]),
                "cargo build -p host-driver --bin nicctl",
            );
            profile_dir.join("nicctl")
        })
        .clone()
}

/// A directory only this user may enter (mode 0700), for a daemon's socket.
fn private_dir(scratch: &Scratch, name: &str) -> PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let dir = scratch.path().join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

/// A UDP port free on `ip` now.
fn free_udp_port(ip: &str) -> u16 {
    std::net::UdpSocket::bind((ip, 0))
        .and_then(|socket| socket.local_addr())
        .map(|address| address.port())
        .expect("a free UDP port")
}

/// A `nicctl emulate` process, killed when dropped.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `nicctl emulate` with `arguments` on `socket` and waits until it answers there.
fn nicctl_emulate(socket: &Path, arguments: &[&std::ffi::OsStr]) -> Daemon {
    let child = Command::new(nicctl())
        .arg("emulate")
        .arg("--socket")
        .arg(socket)
        .args(arguments)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nicctl emulate starts");
    let mut daemon = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    while query_status(socket).is_err() {
        if let Ok(Some(status)) = daemon.0.try_wait() {
            panic!("nicctl emulate exited ({status}) before it listened");
        }
        assert!(
            Instant::now() < deadline,
            "nicctl emulate did not listen on {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    daemon
}

/// The 6 bytes a names program printed after `unique <which> `.
fn unique_line(finished: &Finished, which: &str) -> String {
    let prefix = format!("unique {which} ");
    finished
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| {
            panic!(
                "{} printed no {prefix:?} line:\n{}",
                finished.name, finished.stdout
            )
        })
        .to_owned()
}

/// Two daemons on one UDP fabric whose map names nodes 1 and 2 and leaves node 3 unnamed (no
/// daemon runs it): each node's program finds the other by its name and by its unique id, node 3
/// by its address, and a message sent to the node found by its name arrives from it. Both
/// daemons give each node the same unique id.
#[test]
fn host_names_come_from_the_fabric_map_across_two_daemons() {
    let scratch = Scratch::new("names-udp");
    let map = scratch.path().join("fabric.map");
    let unnamed = format!("127.0.0.3:{}", free_udp_port("127.0.0.3"));
    std::fs::write(
        &map,
        format!(
            "# two daemons, one named node each, and a node known by its address\n\
             node 1 127.0.0.1:{} alpha\n\
             node 2 127.0.0.2:{} beta.example\n\
             node 3 {unnamed}\n",
            free_udp_port("127.0.0.1"),
            free_udp_port("127.0.0.2"),
        ),
    )
    .unwrap();
    let key = scratch.path().join("fabric.key");
    run_to_success(
        Command::new(nicctl()).arg("keygen").arg(&key),
        "nicctl keygen",
    );
    let sockets = [
        private_dir(&scratch, "alpha").join("control.sock"),
        private_dir(&scratch, "beta").join("control.sock"),
    ];
    let _daemons: Vec<Daemon> = [(1, &sockets[0]), (2, &sockets[1])]
        .into_iter()
        .map(|(node, socket): (u16, &PathBuf)| {
            let node = node.to_string();
            nicctl_emulate(
                socket,
                &[
                    "--fabric".as_ref(),
                    map.as_os_str(),
                    "--fabric-key".as_ref(),
                    key.as_os_str(),
                    "--node".as_ref(),
                    node.as_ref(),
                ],
            )
        })
        .collect();
    let program = example("names", Link::Dynamic);
    let finished = finish(
        vec![
            start(
                "names on alpha",
                &program,
                &args(&[&0, &"alpha", &"beta.example", &2, &unnamed, &3, &3]),
                &sockets[0],
            ),
            start(
                "names on beta",
                &program,
                &args(&[&0, &"beta.example", &"alpha", &1, &unnamed, &3, &3]),
                &sockets[1],
            ),
        ],
        RUN_LIMIT,
    );
    for program in &finished {
        program.assert_success();
        let checks = program
            .stdout
            .lines()
            .filter(|l| l.starts_with("ok: "))
            .count();
        assert!(
            checks >= 35,
            "only {checks} checks ran:\n{}",
            program.stdout
        );
    }
    assert_eq!(
        unique_line(&finished[0], "own"),
        unique_line(&finished[1], "peer"),
        "the daemons give node 1 different unique ids"
    );
    assert_eq!(
        unique_line(&finished[1], "own"),
        unique_line(&finished[0], "peer"),
        "the daemons give node 2 different unique ids"
    );
}

/// The units of one daemon without a fabric map are `<host name>:<unit>`, as GM names the
/// second board of a host.
#[test]
fn host_names_of_one_daemons_units_are_host_and_unit() {
    let scratch = Scratch::new("names-local");
    let emulator = daemon(&scratch, 2);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the host name")
        .trim()
        .to_owned();
    let (zero, one) = (format!("{host}:0"), format!("{host}:1"));
    let program = example("names", Link::Dynamic);
    let finished = finish(
        vec![
            start(
                "names on unit 0",
                &program,
                &args(&[&0, &zero, &one, &1, &one, &1, &1]),
                emulator.socket(),
            ),
            start(
                "names on unit 1",
                &program,
                &args(&[&1, &one, &zero, &0, &zero, &0, &1]),
                emulator.socket(),
            ),
        ],
        RUN_LIMIT,
    );
    for program in &finished {
        program.assert_success();
    }
}

#[test]
fn gm_exit_exits_with_the_status() {
    let scratch = Scratch::new("gm2-exit");
    let finished = finish(
        vec![start(
            "gm2 --exit",
            &example("gm2", Link::Dynamic),
            &args(&[&"--exit"]),
            &scratch.path().join("unused.sock"),
        )],
        RUN_LIMIT,
    );
    assert_eq!(finished[0].status.code(), Some(15), "{finished:#?}");
    assert!(
        finished[0].stderr.contains("send timed out"),
        "{finished:#?}"
    );
    // gm_on_exit's callbacks ran, the last registered first, with the status.
    assert!(
        finished[0].stdout.contains("on_exit 2 15\non_exit 1 15\n"),
        "{finished:#?}"
    );
}

#[test]
fn opening_without_a_daemon_says_how_to_start_one() {
    let scratch = Scratch::new("nodaemon");
    let finished = finish(
        vec![start(
            "errors --no-daemon",
            &example("errors", Link::Dynamic),
            &args(&[&"--no-daemon"]),
            &scratch.path().join("nobody-listens.sock"),
        )],
        RUN_LIMIT,
    );
    finished[0].assert_success();
    assert!(
        finished[0].stdout.contains("nobody-listens.sock"),
        "{finished:#?}"
    );
}

#[test]
fn waiting_programs_learn_that_the_daemon_is_gone() {
    let scratch = Scratch::new("gone");
    let emulator = daemon(&scratch, 3);
    let socket = emulator.socket().to_owned();
    // Two answering sides of ping-pongs whose peer (node 0) never comes: one waits in
    // gm_blocking_receive, the other spins on gm_receive.
    let binary = example("pingpong", Link::Dynamic);
    let waiting = vec![
        start(
            "pingpong (unit 1, blocking)",
            &binary,
            &args(&[&1, &0, &1]),
            &socket,
        ),
        start(
            "pingpong (unit 2, polling)",
            &binary,
            &args(&[&2, &0, &1, &"poll"]),
            &socket,
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = query_status(&socket).ok().is_some_and(|report| {
            [1, 2].iter().all(|waiting_unit| {
                report.units.iter().any(|unit| {
                    unit.unit == *waiting_unit
                        && unit
                            .ports
                            .iter()
                            .any(|port| port.port == EXAMPLE_PORT && port.receive_buffers >= 4)
                })
            })
        });
        if ready {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the programs never opened their ports and provided their buffers"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    emulator.stop();
    for program in finish(waiting, Duration::from_secs(20)) {
        assert_eq!(program.status.code(), Some(1), "{program:#?}");
        assert!(
            program
                .stderr
                .contains("nicbar: the nicbar daemon has exited"),
            "{program:#?}"
        );
    }
}

/// Runs `barrier UNIT NODES FORM ITERATIONS` on units `0..nodes` and checks that no process
/// left barrier k before every process had entered it.
fn run_barriers(form: &str, nodes: u16, iterations: u32) {
    let scratch = Scratch::new(&format!("barrier-{form}-{nodes}"));
    let emulator = daemon(&scratch, nodes);
    let binary = example("barrier", Link::Dynamic);
    let running = (0..nodes)
        .map(|unit| {
            start(
                &format!("barrier {form} (unit {unit})"),
                &binary,
                &args(&[&unit, &nodes, &form, &iterations]),
                emulator.socket(),
            )
        })
        .collect();
    let finished = finish(running, RUN_LIMIT);
    let mut entered = vec![Vec::new(); iterations as usize];
    let mut left = vec![Vec::new(); iterations as usize];
    for (unit, program) in finished.iter().enumerate() {
        program.assert_success();
        assert!(
            program.stdout.contains(&format!(
                "barrier: node {unit} of {nodes}: {iterations} {form} barriers"
            )),
            "{program:#?}"
        );
        for line in program.stdout.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            if let [what @ ("enter" | "leave"), k, t] = fields[..] {
                let k: usize = k.parse().unwrap();
                let t: i64 = t.parse().unwrap();
                if what == "enter" {
                    entered[k].push((t, unit));
                } else {
                    left[k].push((t, unit));
                }
            }
        }
    }
    for k in 0..iterations as usize {
        assert_eq!(entered[k].len(), nodes as usize, "barrier {k}: who entered");
        assert_eq!(left[k].len(), nodes as usize, "barrier {k}: who left");
        let last_in = entered[k].iter().max().unwrap();
        let first_out = left[k].iter().min().unwrap();
        assert!(
            first_out.0 >= last_in.0,
            "{form} barrier {k}: node {} left at {} before node {} entered at {}",
            first_out.1,
            first_out.0,
            last_in.1,
            last_in.0
        );
    }
}

#[test]
fn pairwise_exchange_barriers_hold_every_process_until_all_entered() {
    run_barriers("pe", 4, 15);
}

#[test]
fn gather_broadcast_barriers_hold_every_process_until_all_entered() {
    run_barriers("gb", 4, 15);
    run_barriers("gb", 3, 10);
}

#[test]
fn dissemination_barriers_hold_every_process_until_all_entered() {
    run_barriers("dissemination", 3, 15);
}

#[test]
fn group_barriers_hold_every_process_until_all_entered() {
    run_barriers("group", 4, 15);
    run_barriers("group", 3, 10);
}

#[test]
fn a_barrier_missing_a_member_fails_naming_it() {
    // Three members, two processes: node 2 never comes, and the NIC gives up after 300 ms. Each
    // process names node 2 — in the tree of gather-broadcast (root 0, children 1 and 2) node 1
    // waits for its parent's broadcast and learns from the parent's failed barrier that node 2
    // is missing — unless its own timeout fires first, when it names the parent it waited for.
    for (form, waited_for) in [
        ("gb", [&[2][..], &[2, 0]]),
        ("dissemination", [&[2], &[2]]),
        ("group", [&[2], &[2]]),
    ] {
        let scratch = Scratch::new(&format!("barrier-missing-{form}"));
        let emulator = daemon(&scratch, 3);
        let binary = example("barrier", Link::Dynamic);
        let running = (0..2)
            .map(|unit| {
                start(
                    &format!("barrier {form} (unit {unit})"),
                    &binary,
                    &args(&[&unit, &3, &form, &1, &300_000]),
                    emulator.socket(),
                )
            })
            .collect();
        for (program, nodes) in finish(running, RUN_LIMIT).iter().zip(waited_for) {
            assert_eq!(program.status.code(), Some(3), "{program:#?}");
            assert!(
                program.stdout.contains("barrier 0 failed")
                    && nodes
                        .iter()
                        .any(|node| program.stdout.contains(&format!("node {node} port 2")))
                    && (program.stdout.contains("timed out")
                        || program.stdout.contains("send target port closed")),
                "{form}: expected a failure naming node {nodes:?}: {program:#?}"
            );
        }
    }
}

#[test]
fn a_group_barrier_entered_after_a_member_of_its_job_exited_fails_at_once() {
    // nicbar_barrier carries the job of NICBAR_JOB to the NIC: two processes of job 23 run a
    // barrier and exit; a new process of the job on node 0 then enters the group's barrier.
    // Node 1's NIC knows its port's last owner ran barriers of job 23 and is gone for good, so
    // the barrier fails naming node 1 port 2 as closed, long before its 20 s timeout. (Without the
    // job the NIC waits for the port to open, as paper §3.2 has it, and the barrier times out.)
    const JOB: u32 = 23;
    let scratch = Scratch::new("barrier-job-gone");
    let emulator = daemon(&scratch, 2);
    let binary = example("barrier", Link::Dynamic);
    let first = (0..2)
        .map(|unit| {
            start_in_job(
                &format!("group barrier of job {JOB} (unit {unit})"),
                &binary,
                &args(&[&unit, &2, &"group", &1]),
                emulator.socket(),
                Some(JOB),
            )
        })
        .collect();
    for program in finish(first, RUN_LIMIT) {
        program.assert_success();
    }
    let late = start_in_job(
        "a late member of the job (unit 0)",
        &binary,
        &args(&[&0, &2, &"group", &1, &20_000_000]),
        emulator.socket(),
        Some(JOB),
    );
    let finished = finish(vec![late], Duration::from_secs(15));
    let program = &finished[0];
    assert_eq!(program.status.code(), Some(3), "{program:#?}");
    assert!(
        program.stdout.contains("barrier 0 failed")
            && program.stdout.contains("send target port closed")
            && program.stdout.contains("node 1 port 2"),
        "expected the barrier to fail at once naming node 1 port 2 as closed: {program:#?}"
    );
}

/// The steps of `examples/c/README.md`: install into a prefix, build with pkg-config, start
/// `nicctl emulate` from the prefix, run. The install reuses this build (`--profile dev`).
#[test]
fn installed_with_pkg_config_a_program_builds_and_runs() {
    let scratch = Scratch::new("install");
    let prefix = scratch.path().join("prefix");
    let workspace = crate_dir().parent().unwrap().to_owned();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    {
        // Other tests' programs use their own copy of the library; take it before cargo runs.
        libraries();
        let _exclusive = LIBRARY_FILES
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        run_to_success(
            Command::new(cargo)
                .current_dir(&workspace)
                .args(["xtask", "capi", "install", "--profile", "dev", "--prefix"])
                .arg(&prefix),
            "cargo xtask capi install",
        );
    }
    for installed in [
        "lib/libnicbar.so",
        "lib/libnicbar.a",
        "lib/pkgconfig/nicbar.pc",
        "include/nicbar/gm.h",
        "bin/nicctl",
    ] {
        assert!(
            prefix.join(installed).exists(),
            "{installed} was not installed"
        );
    }
    let pkg_config = |flag: &str| {
        run_to_success(
            Command::new("pkg-config")
                .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig"))
                .args([flag, "nicbar"]),
            "pkg-config",
        )
    };
    let cflags = pkg_config("--cflags");
    let libs = pkg_config("--libs");
    assert!(libs.contains("-lnicbar"), "{libs}");
    let binary = scratch.path().join("pingpong");
    let mut compile = cc();
    compile
        .arg(crate_dir().join("examples/c/pingpong.c"))
        .arg("-o")
        .arg(&binary)
        .args(cflags.split_whitespace())
        .args(libs.split_whitespace());
    run_to_success(
        &mut compile,
        "cc pingpong.c $(pkg-config --cflags --libs nicbar)",
    );
    // A GM program's own include line compiles unchanged with the same flags.
    let gm_program = scratch.path().join("gm_include.c");
    std::fs::write(
        &gm_program,
        "#include \"gm.h\"\nint main(void) { return gm_init() == GM_SUCCESS ? 0 : 1; }\n",
    )
    .unwrap();
    let mut compile = cc();
    compile
        .arg(&gm_program)
        .arg("-o")
        .arg(scratch.path().join("gm_include"))
        .args(cflags.split_whitespace())
        .args(libs.split_whitespace());
    run_to_success(
        &mut compile,
        "cc gm_include.c (#include \"gm.h\") $(pkg-config --cflags --libs nicbar)",
    );

    let socket = scratch.path().join("control.sock");
    let mut nicctl = Command::new(prefix.join("bin/nicctl"))
        .args(["emulate", "--units", "2", "--socket"])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nicctl emulate starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while query_status(&socket).is_err() {
        if Instant::now() > deadline {
            let _ = nicctl.kill();
            panic!("nicctl emulate did not listen on {}", socket.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let finished = finish(
        vec![
            start(
                "installed pingpong (unit 1)",
                &binary,
                &args(&[&1, &0, &50]),
                &socket,
            ),
            start(
                "installed pingpong (unit 0)",
                &binary,
                &args(&[&0, &1, &50]),
                &socket,
            ),
        ],
        RUN_LIMIT,
    );
    let _ = nicctl.kill();
    let _ = nicctl.wait();
    for program in &finished {
        program.assert_success();
    }
}
