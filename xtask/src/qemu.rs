//! `cargo xtask qemu`: the end-to-end check of the firmware image running as NICs under QEMU.
//!
//! 1. Makes sure `qemu-system-riscv32` and `qemu-system-riscv64` are installed: on Debian 12 it
//!    installs QEMU 10 from bookworm-backports (adding that source if it is missing), saying what
//!    it runs.
//! 2. Builds the image for each target (`cargo xtask image --target riscv32imac-unknown-none-elf`,
//!    then `riscv64imac-unknown-none-elf`), scans the linked firmware for panic machinery (a
//!    panic path that survives linking fails the check, naming the symbols) and for a `.text`
//!    over 128 KiB, checks the image with `nicctl image info` (which must name the target), and
//!    flashes it onto an emulated flash device with `nicctl flash`.
//! 3. For each target, boots `--nodes` NICs from that flash with `nicctl qemu`, each with a
//!    virtio-net device: the riscv32 NICs with their wire on it (`--virtio-net wire`, UDP/IPv4 on
//!    one Ethernet segment), the riscv64 ones on QEMU's user-mode network (`--virtio-net user`,
//!    the device checked at boot by an ARP exchange with the gateway) and a fifth of the traffic;
//!    checks each NIC's console says so; runs one `qemu_peer` process per NIC (messages around a
//!    ring; barriers of every algorithm through `nicbar::Port`), and checks their output: every
//!    message arrived intact, every barrier completed everywhere, and no peer left a barrier
//!    before every peer had entered it.
//! 4. Closes `nicctl qemu`'s standard input, which powers the NICs off, and checks each NIC's
//!    report (clean power-off, no failed barrier, the counts the peers saw; on the virtio-net
//!    wire, that the switch moved no packet) and prints the stack high-water marks the firmware
//!    measured.
//! 5. For each target, a mixed fabric in a network namespace of its own ([`mixed`]): QEMU NICs
//!    on taps of a bridge and daemon NICs (`nicctl emulate`) with their addresses on it, one
//!    fabric map; prints the fabric it formed and runs messages, barriers of every algorithm and
//!    NIC broadcasts across the mix (the 64-bit run shorter), checked as above. `--mixed-only`
//!    runs only this stage after the images.
//! 6. Runs the one-sided tests on QEMU NICs (`cargo test -p nicbar-system --test qemu_rdma`): a
//!    1 MiB put and get between processes checked byte for byte, fetch-and-adds from three
//!    processes ending exact, refusals naming their rule, a target killed during a put. They
//!    run here, where QEMU is known to be installed, so they cannot pass by being skipped; the
//!    NICs run in the test process, which reaches its child processes' memory under any ptrace
//!    scope.
//!
//! Every wait is bounded; on any failure the processes started here are killed (QEMU dies with
//! `nicctl qemu`, by its parent-death signal) and the error says what was waited for.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::apt;
use crate::command::{cargo, run, show};
use crate::image::{FIRMWARE_TARGET, FIRMWARE_TARGET_64};
use crate::{Result, target_dir, workspace_root};

mod mixed;

/// The QEMU binaries the NICs run on: one per image target.
const QEMUS: [&str; 2] = ["qemu-system-riscv32", "qemu-system-riscv64"];
/// The image targets the stage boots, the primary first.
const QEMU_TARGETS: [&str; 2] = [FIRMWARE_TARGET, FIRMWARE_TARGET_64];
/// The most `.text` either image may have.
const TEXT_LIMIT: u64 = 128 << 10;
/// How long the NICs may take to boot and start serving.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the peers may take, all together.
const PEERS_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the NICs may take to power off and report.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the one-sided tests may take, building included.
const RDMA_TIMEOUT: Duration = Duration::from_secs(300);
/// The stage's budget in CI; exceeding it is reported, not failed.
const BUDGET: Duration = Duration::from_secs(180);

/// Options of `cargo xtask qemu`.
#[derive(clap::Args, Clone)]
pub(crate) struct Args {
    /// NICs to boot (each its own QEMU) and peers to run (one per NIC).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Messages each peer sends around the ring.
    #[arg(long, default_value_t = 50)]
    messages: u32,
    /// Barriers per algorithm.
    #[arg(long, default_value_t = 40)]
    barriers: u32,
    /// Fail instead of installing QEMU when it is missing.
    #[arg(long)]
    no_install: bool,
    /// The network of the NICs' virtio-net devices for the primary target (`wire`: the fabric's
    /// packets go through them; `user`: QEMU's user-mode network, a link check only). The
    /// 64-bit run takes the other, so that both are checked.
    #[arg(skip = Network::Wire)]
    virtio_net: Network,
    /// Run only the mixed-fabric stage (QEMU and daemon NICs on one fabric, both targets).
    #[arg(long)]
    mixed_only: bool,
    /// After the mixed fabric's checks, measure this many round trips of one 64-byte message
    /// between a QEMU NIC and a daemon NIC, two daemon NICs and two QEMU NICs (0: none).
    #[arg(long, default_value_t = 0)]
    ping_pong: u32,
    /// Inside the mixed stage's network namespace: run the mixed fabric for this target.
    #[arg(long, hide = true, requires = "mixed_image")]
    mixed_inside: Option<String>,
    /// Inside the mixed stage's network namespace: the image to boot.
    #[arg(long, hide = true)]
    mixed_image: Option<PathBuf>,
}

/// The network of the NICs' virtio-net devices in a run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Network {
    /// The fabric's wire over virtio-net.
    Wire,
    /// QEMU's user-mode network, checked at boot.
    User,
}

impl Network {
    fn argument(self) -> &'static str {
        match self {
            Self::Wire => "wire",
            Self::User => "user",
        }
    }
}

impl Args {
    /// The stage `cargo xtask test` runs: the defaults, installing QEMU if it is missing.
    pub(crate) fn for_ci() -> Self {
        Self {
            nodes: 3,
            messages: 50,
            barriers: 40,
            no_install: false,
            virtio_net: Network::Wire,
            mixed_only: false,
            ping_pong: 0,
            mixed_inside: None,
            mixed_image: None,
        }
    }

    /// The mixed fabric's run: one more node than the others (so that both kinds have two at
    /// the default three), the same messages, a quarter of the barriers (each crosses the
    /// kinds; CI's budget is tight). The 64-bit run takes `--nodes` nodes and a fifth of that.
    fn mixed(&self, primary: bool) -> Self {
        if primary {
            Self {
                nodes: self.nodes + 1,
                barriers: self.barriers.div_ceil(4),
                ..self.clone()
            }
        } else {
            Self {
                messages: self.messages.div_ceil(5),
                barriers: self.barriers.div_ceil(20),
                ..self.clone()
            }
        }
    }

    /// The shorter run the 64-bit image gets: the same nodes, a fifth of the traffic.
    fn shorter(&self) -> Self {
        Self {
            messages: self.messages.div_ceil(5),
            barriers: self.barriers.div_ceil(5),
            virtio_net: Network::User,
            ..self.clone()
        }
    }
}

/// Runs `cargo xtask qemu`.
pub(crate) fn run_check(args: Args) -> Result<()> {
    if args.nodes < 2 {
        return Err(format!("--nodes {}: the check needs two NICs at least", args.nodes).into());
    }
    let started = Instant::now();
    let root = workspace_root();
    if let (Some(target), Some(image)) = (&args.mixed_inside, &args.mixed_image) {
        return mixed::run_inside(&host_tools(), target, image, &args);
    }

    section("QEMU");
    let version = ensure_qemu(!args.no_install)?;

    section("firmware images");
    let mut images = Vec::new();
    for target in QEMU_TARGETS {
        run(cargo().current_dir(&root).args([
            "run",
            "--quiet",
            "--package",
            "xtask",
            "--",
            "image",
            "--target",
            target,
        ]))?;
        let image = target_dir().join(format!("nicbar-{target}.img"));
        let elf = target_dir().join(target).join("release").join("board");
        let sizes = scan_firmware(&elf)?;
        images.push((target, image, sizes));
    }

    section("host tools");
    run(cargo().current_dir(&root).args([
        "build",
        "--package",
        "host-driver",
        "--bin",
        "nicctl",
        "--package",
        "nicbar-system",
        "--example",
        "qemu_peer",
    ]))?;
    let tools = host_tools();
    let work = WorkDir::create()?;
    let mut fabrics = Vec::new();
    for (index, (target, image, _)) in images.iter().enumerate() {
        if args.mixed_only {
            break;
        }
        // The primary target runs the whole traffic; the 64-bit one a shorter run of the same.
        let shape = if index == 0 {
            args.clone()
        } else {
            args.shorter()
        };
        section(&format!("NICs under QEMU: {target}"));
        let fabric = run_fabric(&tools, &work, target, image, &shape)?;
        fabrics.push((*target, shape, fabric));
    }
    let mut mixed_runs = Vec::new();
    // Taps need the kernel's TUN/TAP device; a machine without it (some containers) cannot form
    // the mixed fabric, and says so rather than failing what it cannot run.
    let has_tun = std::path::Path::new(mixed::TUN_DEVICE).exists();
    if !has_tun {
        println!(
            "\nthe mixed fabric skipped: this machine has no {}, which taps need",
            mixed::TUN_DEVICE
        );
    }
    for (index, (target, image, _)) in images.iter().enumerate().filter(|_| has_tun) {
        let shape = args.mixed(index == 0);
        section(&format!("mixed fabric: QEMU and daemon NICs, {target}"));
        mixed_runs.push((*target, mixed::run_in_namespace(target, image, &shape)?));
    }
    if args.mixed_only {
        section("result");
        print_mixed(&mixed_runs);
        return Ok(());
    }

    section("one-sided operations on QEMU NICs");
    let rdma_started = Instant::now();
    let mut children = Children::default();
    let mut rdma_command = cargo();
    rdma_command.current_dir(&root).args([
        "test",
        "--package",
        "nicbar-system",
        "--test",
        "qemu_rdma",
        "--",
        "--test-threads=1",
        "--nocapture",
    ]);
    println!("running: {}", show(&rdma_command));
    let rdma = children.spawn("qemu_rdma", &mut rdma_command, false)?;
    let status = children.wait(rdma, RDMA_TIMEOUT)?;
    let rdma_lines = children.lines(rdma);
    if !status.success() {
        return Err(format!("the one-sided tests on QEMU NICs failed ({status})").into());
    }
    if let Some(line) = rdma_lines.iter().find(|line| line.contains("skipped:")) {
        return Err(format!("a one-sided test on QEMU NICs was skipped: {line}").into());
    }
    let passed = rdma_lines
        .iter()
        .filter(|line| line.starts_with("test ") && line.ends_with(" ... ok"))
        .count();
    if passed == 0
        || !rdma_lines
            .iter()
            .any(|line| line.starts_with("test result: ok."))
    {
        return Err("the one-sided tests on QEMU NICs did not report success".into());
    }
    let rdma_took = rdma_started.elapsed();
    let figure = |prefix: &str| {
        rdma_lines
            .iter()
            .find_map(|line| line.strip_prefix(prefix))
            .map_or_else(|| "?".to_owned(), |rest| rest.trim().to_owned())
    };

    section("result");
    println!("qemu      {version}");
    for (target, _, sizes) in &images {
        println!(
            "firmware  {target}: .text {} B, .rodata {} B, .data {} B, .bss {} B, stack {} B; no \
             panic machinery linked",
            sizes.text, sizes.rodata, sizes.data, sizes.bss, sizes.stack
        );
    }
    for (target, shape, fabric) in &fabrics {
        println!(
            "stack     {target}: high-water {} B in the main loop, {} B while booting (of {} B)",
            fabric.stacks.main, fabric.stacks.boot, fabric.stacks.size
        );
        println!(
            "traffic   {target}: {} nodes, {} messages each way checked byte for byte, {} \
             barriers of {} algorithms on every node, none left early (tightest margin {} us)",
            shape.nodes,
            shape.messages,
            fabric.outcome.barriers,
            fabric.outcome.algorithms,
            fabric.outcome.tightest_margin_ns / 1000
        );
    }
    println!(
        "one-sided {passed} tests: 1 MiB put {}, get {} between two QEMU NICs, byte for byte; \
         fetch-and-adds from 3 processes exact; refusals named; a killed target survived",
        figure("1 MiB put between QEMU NICs:"),
        figure("1 MiB get between QEMU NICs: None in"),
    );
    print_mixed(&mixed_runs);
    let total = started.elapsed();
    for (target, _, fabric) in &fabrics {
        println!(
            "time      {target}: {:.1} s to a serving fabric, {:.1} s of peers",
            fabric.booted.as_secs_f64(),
            fabric.peers_took.as_secs_f64(),
        );
    }
    println!(
        "time      {:.1} s in all, {:.1} s of one-sided tests",
        total.as_secs_f64(),
        rdma_took.as_secs_f64()
    );
    if total > BUDGET {
        println!(
            "note: this took longer than the {} s budget of the CI stage",
            BUDGET.as_secs()
        );
    }
    Ok(())
}

/// Prints what the mixed fabrics showed.
fn print_mixed(runs: &[(&str, mixed::MixedRun)]) {
    for (target, run) in runs {
        for line in &run.fabric {
            println!("fabric    {target}: {line}");
        }
        for line in &run.summary {
            println!("mixed     {target}: {line}");
        }
        println!(
            "time      {target}: {:.1} s for the mixed fabric, namespace included",
            run.took.as_secs_f64()
        );
    }
}

/// The host programs, as `cargo build` put them.
fn host_tools() -> Tools {
    Tools {
        nicctl: target_dir().join("debug").join("nicctl"),
        peer: target_dir()
            .join("debug")
            .join("examples")
            .join("qemu_peer"),
    }
}

/// The host programs the fabric runs.
struct Tools {
    nicctl: PathBuf,
    peer: PathBuf,
}

/// What one fabric run showed.
struct FabricRun {
    booted: Duration,
    peers_took: Duration,
    outcome: PeerOutcome,
    stacks: Stacks,
}

/// Checks `image` with `nicctl image info`, flashes it, boots `shape.nodes` NICs from the flash
/// with `nicctl qemu`, runs one `qemu_peer` per NIC, checks what the peers and the NICs said, and
/// powers the NICs off.
fn run_fabric(
    tools: &Tools,
    work: &WorkDir,
    target: &str,
    image: &Path,
    shape: &Args,
) -> Result<FabricRun> {
    let info = Command::new(&tools.nicctl)
        .arg("image")
        .arg("info")
        .arg(image)
        .output()
        .map_err(|error| format!("cannot run nicctl image info: {error}"))?;
    let info_text = String::from_utf8_lossy(&info.stdout);
    print!("{info_text}");
    if !info.status.success() {
        return Err(format!(
            "nicctl image info {} failed ({})",
            image.display(),
            info.status
        )
        .into());
    }
    if !info_text
        .lines()
        .any(|line| line.starts_with("target") && line.trim_end().ends_with(target))
    {
        return Err(format!("nicctl image info does not name the target {target}").into());
    }
    let flash = work.path.join(format!("nic-{target}.flash"));
    run(Command::new(&tools.nicctl)
        .args(["flash", "--image"])
        .arg(image)
        .arg("--device")
        .arg(&flash)
        .args(["--target", target, "--create", "--size", "1M"]))?;

    let started = Instant::now();
    let mut children = Children::default();
    let socket = work.path.join(format!("control-{target}.sock"));
    let mut daemon_command = Command::new(&tools.nicctl);
    daemon_command
        .args(["qemu", "--flash"])
        .arg(&flash)
        .args(["--nodes", &shape.nodes.to_string(), "--socket"])
        .arg(&socket)
        .arg("--run-dir")
        .arg(work.path.join(format!("run-{target}")))
        .args(["--virtio-net", shape.virtio_net.argument()])
        .arg("--stop-on-stdin-eof");
    println!("running: {}", show(&daemon_command));
    let daemon = children.spawn("nicctl", &mut daemon_command, true)?;
    children.await_line(daemon, "nicctl qemu: listening on", START_TIMEOUT)?;
    let booted = started.elapsed();
    check_virtio_net(&children.lines(daemon), shape.nodes, shape.virtio_net)?;

    let mut peers = Vec::new();
    for unit in 0..shape.nodes {
        let mut command = Command::new(&tools.peer);
        command
            .arg("--socket")
            .arg(&socket)
            .args(["--unit", &unit.to_string()])
            .args(["--nodes", &shape.nodes.to_string()])
            .args(["--messages", &shape.messages.to_string()])
            .args(["--barriers", &shape.barriers.to_string()]);
        if unit == 0 {
            println!("running: {} (and units 1..{})", show(&command), shape.nodes);
        }
        peers.push(children.spawn(&format!("peer {unit}"), &mut command, false)?);
    }
    let peers_started = Instant::now();
    for &index in &peers {
        let status = children.wait(index, PEERS_TIMEOUT.saturating_sub(peers_started.elapsed()))?;
        if !status.success() {
            return Err(format!(
                "{} failed ({status}); its output:\n{}",
                children.name(index),
                children.lines(index).join("\n")
            )
            .into());
        }
    }
    let peers_took = peers_started.elapsed();
    let outcome = check_peers(&children, &peers, shape)?;

    children.close_stdin(daemon);
    let status = children.wait(daemon, STOP_TIMEOUT)?;
    if !status.success() {
        return Err(format!("nicctl qemu failed ({status})").into());
    }
    let stacks = check_reports(&children.lines(daemon), shape, &outcome)?;
    if shape.virtio_net == Network::Wire {
        // Every packet went through the virtio-net devices: the switch moved none.
        let lines = children.lines(daemon);
        let switch = lines
            .iter()
            .find(|line| line.starts_with("nicctl qemu: switch "))
            .ok_or("nicctl qemu printed no switch counters")?;
        if field(switch, "moved") != Some("0") {
            return Err(
                format!("the wire was virtio-net, yet the switch moved packets: {switch}").into(),
            );
        }
        println!("virtio-net: the switch moved no packet; every one went through the devices");
    }
    Ok(FabricRun {
        booted,
        peers_took,
        outcome,
        stacks,
    })
}

fn section(name: &str) {
    println!("\n== {name} ==");
}

// ---------------------------------------------------------------------------------------------
// Installing QEMU.

/// The first line of `qemu --version`, if it runs.
fn qemu_version(qemu: &str) -> Option<String> {
    let output = Command::new(qemu).arg("--version").output().ok()?;
    if !output.status.success() {
        return None;
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

/// Makes sure both QEMUs run (Debian packages them together, in qemu-system-misc); installs
/// them from bookworm-backports if allowed. Returns the version.
fn ensure_qemu(install: bool) -> Result<String> {
    let missing: Vec<&str> = QEMUS
        .into_iter()
        .filter(|qemu| qemu_version(qemu).is_none())
        .collect();
    if !missing.is_empty() {
        if !install {
            return Err(format!(
                "{} not installed (and --no-install was given)",
                missing.join(" and ")
            )
            .into());
        }
        println!(
            "{}: not installed; installing QEMU 10 from bookworm-backports",
            missing.join(", ")
        );
        apt::install(
            &["qemu-system-misc"],
            Some(apt::BOOKWORM_BACKPORTS),
            "QEMU 10 for riscv32 and riscv64",
        )?;
    }
    let mut version = String::new();
    for qemu in QEMUS {
        version = qemu_version(qemu).ok_or_else(|| {
            format!("{qemu} still does not run after installing qemu-system-misc")
        })?;
        println!("{qemu}: {version}");
    }
    Ok(version)
}

// ---------------------------------------------------------------------------------------------
// The linked firmware.

#[derive(Debug, Default)]
struct Sizes {
    text: u64,
    rodata: u64,
    data: u64,
    bss: u64,
    stack: u64,
}

/// Reads the section sizes of the linked firmware and fails if any symbol of the panic or
/// formatting machinery survived linking.
fn scan_firmware(elf: &Path) -> Result<Sizes> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let bytes = std::fs::read(elf).map_err(|error| format!("{}: {error}", elf.display()))?;
    let file =
        object::File::parse(&*bytes).map_err(|error| format!("{}: {error}", elf.display()))?;
    let size = |name: &str| file.section_by_name(name).map_or(0, |s| s.size());
    let sizes = Sizes {
        text: size(".text"),
        rodata: size(".rodata"),
        data: size(".data"),
        bss: size(".bss"),
        stack: size(".stack"),
    };
    let suspicious: Vec<String> = file
        .symbols()
        .filter_map(|symbol| symbol.name().ok())
        .filter(|name| is_panic_machinery(name))
        .map(str::to_owned)
        .collect();
    println!(
        "{}: .text {} B, .rodata {} B, .data {} B, .bss {} B, .stack {} B",
        elf.display(),
        sizes.text,
        sizes.rodata,
        sizes.data,
        sizes.bss,
        sizes.stack
    );
    if sizes.text > TEXT_LIMIT {
        return Err(format!(
            "{}: .text is {} B, over the {TEXT_LIMIT} B an image may have",
            elf.display(),
            sizes.text
        )
        .into());
    }
    if !suspicious.is_empty() {
        return Err(format!(
            "the linked firmware contains panic or formatting machinery, so some panic is \
             reachable (find its callers with `llvm-objdump -d {}`):\n  {}",
            elf.display(),
            suspicious.join("\n  ")
        )
        .into());
    }
    println!("panic scan: no panic handler, panicking or core::fmt symbol in the linked firmware");
    Ok(sizes)
}

/// Whether a (mangled) symbol name belongs to the panic path or to `core::fmt`.
fn is_panic_machinery(name: &str) -> bool {
    [
        "panic",
        "rust_begin_unwind",
        "4core3fmt",
        "unwrap_failed",
        "expect_failed",
    ]
    .iter()
    .any(|needle| name.contains(needle))
}

// ---------------------------------------------------------------------------------------------
// Child processes.

/// A scratch directory for the flash device, the socket and the run directory, removed on drop.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("nicbar-qemu-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|error| format!("{}: {error}", path.display()))?;
        Ok(Self { path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

struct Running {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Arc<Mutex<Vec<String>>>,
    status: Option<ExitStatus>,
}

/// The processes this check started; whatever still runs when it is dropped is killed.
#[derive(Default)]
struct Children {
    running: Vec<Running>,
}

impl Children {
    /// Starts `command` with its output collected line by line (and echoed with the name in
    /// front if `echo`; stderr always is). With `stdin`, keeps a pipe to its standard input.
    fn spawn(&mut self, name: &str, command: &mut Command, keep_stdin: bool) -> Result<usize> {
        command
            .stdin(if keep_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|error| format!("cannot run {}: {error}", show(command)))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = child.stdout.take() {
            let (lines, name) = (lines.clone(), name.to_owned());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout)
                    .lines()
                    .map_while(std::io::Result::ok)
                {
                    // Barrier lines are many; they are checked, not shown.
                    if !line.starts_with("barrier ") {
                        println!("  {name} | {line}");
                    }
                    lock(&lines).push(line);
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            let (lines, name) = (lines.clone(), name.to_owned());
            std::thread::spawn(move || {
                for line in BufReader::new(stderr)
                    .lines()
                    .map_while(std::io::Result::ok)
                {
                    println!("  {name} ! {line}");
                    lock(&lines).push(line);
                }
            });
        }
        let stdin = child.stdin.take();
        self.running.push(Running {
            name: name.to_owned(),
            child,
            stdin,
            lines,
            status: None,
        });
        Ok(self.running.len() - 1)
    }

    fn name(&self, index: usize) -> &str {
        &self.running[index].name
    }

    /// The lines the process printed so far.
    fn lines(&self, index: usize) -> Vec<String> {
        lock(&self.running[index].lines).clone()
    }

    /// Waits until the process prints a line starting with `prefix`.
    fn await_line(&mut self, index: usize, prefix: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self
                .lines(index)
                .iter()
                .any(|line| line.starts_with(prefix))
            {
                return Ok(());
            }
            let running = &mut self.running[index];
            if let Some(status) = running.child.try_wait()? {
                running.status = Some(status);
                return Err(format!(
                    "{} exited ({status}) before printing {prefix:?}",
                    running.name
                )
                .into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not print {prefix:?} within {timeout:?}",
                    running.name
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit; kills it (and fails) after `timeout`.
    fn wait(&mut self, index: usize, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let running = &mut self.running[index];
        loop {
            if let Some(status) = running.child.try_wait()? {
                running.status = Some(status);
                // Let the output threads take the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = running.child.kill();
                let _ = running.child.wait();
                return Err(format!(
                    "{} did not finish within {timeout:?}; killed it",
                    running.name
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn close_stdin(&mut self, index: usize) {
        self.running[index].stdin = None;
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for running in self.running.iter_mut().filter(|r| r.status.is_none()) {
            if matches!(running.child.try_wait(), Ok(None)) {
                let _ = running.child.kill();
            }
            let _ = running.child.wait();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Checking what the peers and the NICs said.

/// What the peers showed.
struct PeerOutcome {
    /// Barriers each peer completed (all algorithms).
    barriers: usize,
    /// Algorithms run.
    algorithms: usize,
    /// The smallest gap, over all barriers, between the last entry and the first exit.
    tightest_margin_ns: i128,
}

/// The value of `key=` in a line of `key=value` words.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
}

fn check_peers(children: &Children, peers: &[usize], args: &Args) -> Result<PeerOutcome> {
    // (algorithm, index) -> (latest entry, earliest exit, peers that reported it)
    let mut barriers: BTreeMap<(String, u32), (i128, i128, usize)> = BTreeMap::new();
    for &peer in peers {
        let lines = children.lines(peer);
        let name = children.name(peer);
        if !lines.iter().any(|line| line == "done") {
            return Err(format!("{name} did not finish: no \"done\" line").into());
        }
        let expected = format!("messages sent={0} received={0}", args.messages);
        if !lines.iter().any(|line| line.starts_with(&expected)) {
            return Err(format!("{name} did not report {expected:?}").into());
        }
        for line in lines.iter().filter(|line| line.starts_with("barrier ")) {
            let parsed = (|| {
                Some((
                    field(line, "algorithm")?.to_owned(),
                    field(line, "index")?.parse::<u32>().ok()?,
                    field(line, "enter_ns")?.parse::<i128>().ok()?,
                    field(line, "exit_ns")?.parse::<i128>().ok()?,
                ))
            })();
            let Some((algorithm, index, enter, exit)) = parsed else {
                return Err(format!("{name} printed a malformed line: {line}").into());
            };
            let entry = barriers
                .entry((algorithm, index))
                .or_insert((i128::MIN, i128::MAX, 0));
            entry.0 = entry.0.max(enter);
            entry.1 = entry.1.min(exit);
            entry.2 += 1;
        }
    }
    let mut tightest = i128::MAX;
    for ((algorithm, index), (last_entry, first_exit, reported)) in &barriers {
        if *reported != peers.len() {
            return Err(format!(
                "{algorithm} barrier {index}: {reported} of {} peers reported it",
                peers.len()
            )
            .into());
        }
        if first_exit < last_entry {
            return Err(format!(
                "{algorithm} barrier {index}: a peer left at {first_exit} ns, before the last \
                 peer entered at {last_entry} ns: the barrier did not hold"
            )
            .into());
        }
        tightest = tightest.min(first_exit - last_entry);
    }
    let algorithms = barriers
        .keys()
        .map(|(algorithm, _)| algorithm.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let expected = 3 + usize::from(args.nodes > 2);
    if algorithms != expected || barriers.len() != expected * args.barriers as usize {
        return Err(format!(
            "the peers ran {} barriers of {algorithms} algorithms; expected {} of {expected}",
            barriers.len(),
            expected * args.barriers as usize
        )
        .into());
    }
    Ok(PeerOutcome {
        barriers: barriers.len(),
        algorithms,
        tightest_margin_ns: tightest,
    })
}

/// The console line of a NIC whose virtio-net device sent an ARP request through QEMU's
/// user-mode network and took the gateway's reply (QEMU's gateway MAC, 52:55:0a:00:02:02).
const VIRTIO_NET_LINK: &str = "virtio-net: gateway 10.0.2.2 is at 52:55:0a:00:02:02";

/// Checks that every NIC brought its virtio-net device up with the MAC naming its node, and
/// either took it as its wire or exchanged ARP with the user-mode network's gateway through it.
fn check_virtio_net(lines: &[String], nodes: u16, network: Network) -> Result<()> {
    for node in 0..nodes {
        let prefix = format!("node {node}: ");
        let console: Vec<&str> = lines
            .iter()
            .filter_map(|line| line.strip_prefix(&prefix))
            .collect();
        let mac = format!(
            "virtio-net: MAC 52:54:00:00:{:02x}:{:02x}",
            node >> 8,
            node & 0xff
        );
        if !console.contains(&mac.as_str()) {
            return Err(format!("node {node} did not print {mac:?}").into());
        }
        let expected = match network {
            Network::User => VIRTIO_NET_LINK,
            Network::Wire => "wire: UDP/IPv4 through virtio-net",
        };
        if !console.contains(&expected) {
            return Err(format!("node {node} did not print {expected:?}").into());
        }
    }
    match network {
        Network::User => {
            println!("virtio-net: every NIC's device is up and exchanged ARP with the gateway");
        }
        Network::Wire => println!("virtio-net: every NIC's device is up and is its wire"),
    }
    Ok(())
}

/// The stack figures the NICs reported.
struct Stacks {
    size: u64,
    main: u64,
    boot: u64,
}

/// Checks each NIC's final report line and returns the largest stack figures.
fn check_reports(lines: &[String], args: &Args, outcome: &PeerOutcome) -> Result<Stacks> {
    let reports: Vec<&String> = lines
        .iter()
        .filter(|line| line.starts_with("nicctl qemu: report "))
        .collect();
    if reports.len() != usize::from(args.nodes) {
        return Err(format!(
            "nicctl qemu printed {} reports for {} NICs",
            reports.len(),
            args.nodes
        )
        .into());
    }
    let number = |line: &str, key: &str| -> Result<u64> {
        field(line, key)
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| format!("no number {key}= in: {line}").into())
    };
    let mut stacks = Stacks {
        size: 0,
        main: 0,
        boot: 0,
    };
    // The opening and closing barriers come on top of the checked ones.
    let barriers = outcome.barriers as u64 + 2;
    for line in reports {
        if field(line, "exit") != Some("0") || field(line, "state") != Some("stopped") {
            return Err(format!("a NIC did not power off cleanly: {line}").into());
        }
        if number(line, "barriers_failed")? != 0 {
            return Err(format!("a NIC failed barriers: {line}").into());
        }
        if number(line, "barriers_completed")? != barriers {
            return Err(format!("a NIC did not complete {barriers} barriers: {line}").into());
        }
        if number(line, "messages_delivered")? != u64::from(args.messages) {
            return Err(format!("a NIC did not deliver {} messages: {line}", args.messages).into());
        }
        stacks.size = number(line, "stack_size")?;
        stacks.main = stacks.main.max(number(line, "stack_main")?);
        stacks.boot = stacks.boot.max(number(line, "stack_boot")?);
    }
    if stacks.main == 0 || stacks.main > stacks.size {
        return Err(format!(
            "the main loop's stack mark {} B is not a measurement within the {} B stack",
            stacks.main, stacks.size
        )
        .into());
    }
    Ok(stacks)
}
