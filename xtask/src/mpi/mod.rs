//! `cargo xtask mpi`: the Open MPI collective component coll/nicbar (`host-lib/coll-nicbar`),
//! built against the installed Open MPI's development headers and libnicbar, installed where
//! Open MPI finds components, checked, and measured.
//!
//! - `mpi build` installs libnicbar and nicctl under `target/coll-nicbar/prefix` (through
//!   `cargo xtask capi install`), compiles `mca_coll_nicbar.so` with gcc against Open MPI's
//!   headers (found with `mpicc --showme:incdirs`) into `target/coll-nicbar/components`, and
//!   `nicbar-fabric` (which starts one daemon per host of a job) into the prefix's `bin/`.
//! - `mpi install [--prefix DIR] [--components DIR]` installs libnicbar, nicctl and
//!   nicbar-fabric under `DIR` (default `~/.local`) and the component, linked to it, into Open MPI's per-user component directory
//!   (default `~/.openmpi/components`, on Open MPI's default `mca_base_component_path`).
//! - `mpi test` (a stage of `cargo xtask test`) installs Debian's `openmpi-bin`,
//!   `libopenmpi-dev`, `gfortran` and `python3-mpi4py` when missing, builds the component, and
//!   runs with it forced: a C program running barriers and non-blocking barriers on split and
//!   dup communicators concurrently through the emulator's fault injector (a printed seed), a
//!   Fortran program and one reducing Fortran's types in the NIC, a program one of whose ranks
//!   is killed (the others' errors must name it), and mpi4py's own test suite (from the
//!   `mpi4py==3.1.4` source distribution, with Debian's python3-mpi4py under /usr/bin/python3)
//!   at 2 and 4 processes, printing how many barriers
//!   went through the NIC and how many data collectives went over it; and `coll_check`, every
//!   data collective against MPI's definition and Open MPI's own results.
//! - `bench mpi` (run through `cargo xtask bench mpi`): MPI_Barrier latency and MPI_Ibarrier
//!   overlap (OSU's definition) with the component beside Open MPI's own collectives over
//!   shared memory and over TCP, at 2, 4, 8 and 16 processes; a table and a CSV.
//! - `tune` (run through `cargo xtask tune`): every algorithm of each data collective forced in
//!   turn over communicator and message sizes; the selection map the library loads, as a file,
//!   a table and a picture.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args as ClapArgs, Subcommand};

use crate::command::run;
use crate::{Result, target_dir, workspace_root};

mod bench;
mod tune;

pub(crate) use bench::{BenchArgs, run_bench};
pub(crate) use tune::{TuneArgs, run_tune};

/// The component's sources, relative to the workspace root.
const SOURCES: &str = "host-lib/coll-nicbar";
/// The Debian packages the component and its checks need.
const PACKAGES: [&str; 4] = [
    "openmpi-bin",
    "libopenmpi-dev",
    "gfortran",
    "python3-mpi4py",
];
/// mpi4py's version whose test suite CI runs (Debian 12's python3-mpi4py is this version).
const MPI4PY: &str = "3.1.4";
/// The system Python, which imports Debian's python3-mpi4py (a pyenv shim cannot).
const SYSTEM_PYTHON: &str = "/usr/bin/python3";
/// What the component prints at MPI_Finalize under `coll_nicbar_verbose 1`.
const COUNT_LINE: &str = "barriers went through the NIC";
/// The same line's count of data collectives (bcast, scatter, gather, alltoall and v forms).
const DATA_COUNT_LINE: &str = "data collectives went over it";
/// The largest message `coll_check` moves in CI, compared with Open MPI's own (bytes): 32 of
/// the collectives' default segments, and past the rendezvous threshold. Its next size, 16 MiB,
/// is a flag away; at 5 processes on two cores it takes minutes (its all-to-all alone moves
/// 400 MiB), where 1 MiB takes about 20 s.
const CHECK_BYTES: usize = 1 << 20;
/// The largest message `coll_check` moves through the fault injector in CI (bytes): past the
/// rendezvous threshold, so both protocols meet the faults.
const FAULT_CHECK_BYTES: usize = 1 << 20;
/// The largest message of the runs that force each algorithm in turn (bytes).
const FORCED_CHECK_BYTES: usize = 128 << 10;

/// The segment of the segmented broadcasts in the run that forces algorithm `k` (bytes): the
/// binary tree's and the chain's go eagerly, forwarded as they arrive; the split binary tree's
/// (`k` 4) are 64 KiB, the rendezvous threshold, and go one by one, put whole.
fn forced_segment(k: i32) -> i32 {
    if k == 4 { 64 << 10 } else { 8192 * k }
}

/// Options of `cargo xtask mpi`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: MpiCommand,
}

#[derive(Subcommand)]
enum MpiCommand {
    /// Build libnicbar and the component under target/coll-nicbar.
    Build,
    /// Install libnicbar under --prefix and the component where Open MPI looks for components.
    Install {
        /// Where libnicbar, its header and nicctl go (lib/, include/, bin/).
        #[arg(long)]
        prefix: Option<PathBuf>,
        /// Where mca_coll_nicbar.so goes [default: ~/.openmpi/components].
        #[arg(long)]
        components: Option<PathBuf>,
    },
    /// The CI checks with Open MPI (installs Debian's Open MPI, gfortran and mpi4py if missing).
    Test(TestArgs),
}

/// Options of `cargo xtask mpi test`.
#[derive(ClapArgs)]
pub(crate) struct TestArgs {
    /// Do not install missing Debian packages: fail instead.
    #[arg(long)]
    no_install: bool,
    /// Runs of the concurrent-barrier program through the fault injector.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Skip mpi4py's test suite (it takes a few minutes).
    #[arg(long)]
    no_mpi4py: bool,
    /// The largest message of the collectives' check against Open MPI's own, bytes per rank
    /// (the sizes it runs, up to this: 0, 4 and 8 B, 4,064 and 4,068 B, 100,000 B, 1 MiB, 16 MiB).
    #[arg(long, default_value_t = CHECK_BYTES)]
    check_bytes: usize,
    /// The largest message of the same check through the fault injector (2 % loss,
    /// duplication and reordering); 16777216 takes about a minute and a half on two cores.
    #[arg(long, default_value_t = FAULT_CHECK_BYTES)]
    fault_bytes: usize,
}

impl TestArgs {
    /// What `cargo xtask test` runs.
    pub(crate) fn for_ci() -> Self {
        Self {
            no_install: false,
            runs: 3,
            no_mpi4py: false,
            check_bytes: CHECK_BYTES,
            fault_bytes: FAULT_CHECK_BYTES,
        }
    }
}

/// Runs `cargo xtask mpi`.
pub(crate) fn run_mpi(args: Args) -> Result<()> {
    match args.command {
        MpiCommand::Build => {
            let built = build(&scratch().join("prefix"), "capi")?;
            println!("built {}", built.display());
            Ok(())
        }
        MpiCommand::Install { prefix, components } => {
            let home = PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?);
            let prefix = prefix.unwrap_or_else(|| home.join(".local"));
            let components = components.unwrap_or_else(|| home.join(".openmpi/components"));
            let prefix = absolute(&prefix)?;
            let built = build(&prefix, "capi")?;
            std::fs::create_dir_all(&components)?;
            let target = components.join("mca_coll_nicbar.so");
            // Copying the built component onto itself (--components naming the build's own
            // folder) would leave it empty.
            if !same_file(&built, &target) {
                std::fs::copy(&built, &target)
                    .map_err(|error| format!("copying to {}: {error}", target.display()))?;
            }
            println!("installed {}", target.display());
            println!(
                "run: {}/bin/nicctl emulate --units 2 &   then   mpirun{} ./program",
                prefix.display(),
                if components == home.join(".openmpi/components") {
                    String::new()
                } else {
                    format!(
                        " --mca mca_base_component_path {}:{}",
                        system_component_dir()?,
                        components.display()
                    )
                }
            );
            Ok(())
        }
        MpiCommand::Test(args) => run_tests(&args),
    }
}

/// Whether `a` and `b` name one file (both exist and resolve to the same path).
fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}

/// Where the build and the checks put their files.
fn scratch() -> PathBuf {
    target_dir().join("coll-nicbar")
}

fn absolute(path: &Path) -> Result<PathBuf> {
    Ok(if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    })
}

/// Output of `program args`, trimmed, if it ran and succeeded.
fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Open MPI's own component directory (the first entry of its default component path).
fn system_component_dir() -> Result<String> {
    let libdir = output_of("mpicc", &["--showme:libdirs"]).ok_or("mpicc does not run")?;
    let libdir = libdir.split_whitespace().next().unwrap_or_default();
    for name in ["openmpi3", "openmpi"] {
        let dir = Path::new(libdir).join(name);
        if dir.join("mca_coll_tuned.so").exists() {
            return Ok(dir.display().to_string());
        }
    }
    Err(format!("no mca_coll_tuned.so under {libdir}: where are Open MPI's components?").into())
}

/// Installs libnicbar and nicctl under `prefix`, built with cargo profile `profile` (`capi`, the
/// optimised install build, for users and benchmarks; `dev` for the checks, which reuses what the
/// test stage built), and compiles the component against them; returns the component's path.
fn build(prefix: &Path, profile: &str) -> Result<PathBuf> {
    let root = workspace_root();
    // `cargo xtask capi install`, run by this very program.
    run(Command::new(std::env::current_exe()?)
        .current_dir(&root)
        .args(["capi", "install", "--profile", profile, "--prefix"])
        .arg(prefix))?;
    let include_dirs = output_of("mpicc", &["--showme:incdirs"])
        .ok_or("mpicc does not run: install libopenmpi-dev (or run `cargo xtask mpi test`)")?;
    let include_dirs: Vec<&str> = include_dirs.split_whitespace().collect();
    if !include_dirs
        .iter()
        .any(|dir| Path::new(dir).join("ompi/mca/coll/coll.h").exists())
    {
        return Err(format!(
            "Open MPI's development headers (ompi/mca/coll/coll.h) are not under {include_dirs:?}: \
             this Open MPI was built without them"
        )
        .into());
    }
    let lib_dirs = output_of("mpicc", &["--showme:libdirs"]).unwrap_or_default();
    // One folder per profile: the component finds libnicbar through its run path, so a
    // benchmark must never pick up the one the checks built against their debug build.
    let out = scratch().join(if profile == "dev" {
        "components-dev"
    } else {
        "components"
    });
    std::fs::create_dir_all(&out)?;
    let component = out.join("mca_coll_nicbar.so");
    let sources = root.join(SOURCES);
    let lib = prefix.join("lib");
    let mut gcc = Command::new("gcc");
    gcc.args([
        "-shared",
        "-fPIC",
        "-O2",
        "-std=gnu11",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unused-parameter",
    ]);
    for dir in &include_dirs {
        gcc.arg(format!("-I{dir}"));
    }
    gcc.arg(format!("-I{}", prefix.join("include").display()))
        .arg("-o")
        .arg(&component)
        .arg(sources.join("coll_nicbar_component.c"))
        .arg(sources.join("coll_nicbar_module.c"))
        .arg(sources.join("coll_nicbar_data.c"))
        .arg(sources.join("coll_nicbar_reduce.c"))
        .arg(sources.join("coll_nicbar_reduce_messages.c"))
        .arg(format!("-L{}", lib.display()))
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-lnicbar");
    for dir in lib_dirs.split_whitespace() {
        gcc.arg(format!("-L{dir}"));
    }
    gcc.args(["-lmpi", "-lopen-pal"]);
    run(&mut gcc)?;
    // The tool that forms a fabric across hosts from an MPI job and starts their daemons.
    run(Command::new("mpicc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(prefix.join("bin/nicbar-fabric"))
        .arg(sources.join("tools/nicbar_fabric.c")))?;
    Ok(component)
}

// ---------------------------------------------------------------------------------------------
// Debian's packages.

/// Whether everything the checks need is installed.
fn packages_present() -> bool {
    output_of("mpicc", &["--showme:version"]).is_some()
        && output_of("mpifort", &["--showme:version"]).is_some()
        && output_of("mpirun", &["--version"]).is_some()
        && output_of(SYSTEM_PYTHON, &["-c", "import mpi4py"]).is_some()
}

/// Installs the Debian packages the checks need when one is missing (as root, or through
/// `sudo -n`), as `cargo xtask qemu` installs QEMU.
fn ensure_packages(install: bool) -> Result<()> {
    if packages_present() {
        println!("Open MPI, gfortran, mpi4py: installed");
        return Ok(());
    }
    if !install {
        return Err(format!(
            "a package the MPI checks need is missing (and --no-install was given): apt-get \
             install {}",
            PACKAGES.join(" ")
        )
        .into());
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default();
    let sudo: &[&str] = if uid == "0" {
        &[]
    } else if output_of("sudo", &["-n", "true"]).is_some() {
        &["sudo", "-n"]
    } else {
        return Err(format!(
            "installing {} needs root (this is uid {uid}, and sudo -n does not work)",
            PACKAGES.join(" ")
        )
        .into());
    };
    let command = |args: &[&str]| {
        let mut all: Vec<&str> = sudo.to_vec();
        all.extend_from_slice(args);
        let mut command = Command::new(all[0]);
        command
            .args(&all[1..])
            .env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    println!(
        "Open MPI, gfortran or mpi4py missing: installing {}",
        PACKAGES.join(" ")
    );
    run(&mut command(&["apt-get", "update"]))?;
    let mut install = vec!["apt-get", "install", "-y", "--no-install-recommends"];
    install.extend(PACKAGES);
    run(&mut command(&install))?;
    if !packages_present() {
        return Err("Open MPI, gfortran or mpi4py still missing after apt-get install".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The emulated NIC daemon and mpirun.

/// A `nicctl emulate` daemon on its own socket, stopped on drop.
struct Daemon {
    child: Child,
    socket: PathBuf,
}

impl Daemon {
    /// Starts `nicctl emulate --units units` with `extra` arguments on a fresh socket under
    /// `dir`, and waits until it listens.
    fn start(nicctl: &Path, dir: &Path, units: usize, extra: &[String]) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("control.sock");
        let _ = std::fs::remove_file(&socket);
        let mut child = Command::new(nicctl)
            .arg("emulate")
            .arg("--socket")
            .arg(&socket)
            .arg("--units")
            .arg(units.to_string())
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|error| format!("starting {}: {error}", nicctl.display()))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            match lines.next() {
                Some(Ok(line)) => {
                    println!("{line}");
                    if line.contains("listening on") {
                        break;
                    }
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("nicctl emulate exited before it listened".into());
                }
            }
        }
        // Keep draining its output so that it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Self { child, socket })
    }
}

impl Daemon {
    /// CPU time the daemon's NIC threads have used, in nanoseconds.
    fn nic_cpu_ns(&self) -> u64 {
        crate::command::threads_cpu_ns(self.child.id(), "nic-thread")
    }

    /// Holds the daemon stopped while a reference row runs without it.
    fn stopped(&self) -> Result<crate::command::Stopped> {
        crate::command::Stopped::new([self.child.id()])
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The transport Open MPI's own point-to-point (and own collectives) use.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    SharedMemory,
    Tcp,
}

/// `mpirun` of `processes` with the component on the path, `priority` for it (-1: off), and
/// the daemon's socket.
fn mpirun(
    components: &Path,
    socket: &Path,
    processes: usize,
    priority: i32,
    transport: Transport,
) -> Result<Command> {
    let mut command = Command::new("mpirun");
    command
        // Cargo points the library path at its own build of libnicbar, which would win over
        // the component's run path to the one `build` installed.
        .env_remove("LD_LIBRARY_PATH")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("NICBAR_SOCKET", socket)
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(processes.to_string())
        .args(["--mca", "mca_base_component_path"])
        .arg(format!(
            "{}:{}",
            system_component_dir()?,
            components.display()
        ))
        .args(["--mca", "coll_nicbar_priority", &priority.to_string()])
        .args(["--mca", "coll_nicbar_verbose", "1"])
        // One NIC per process where the daemon has enough units.
        .args(["--mca", "coll_nicbar_unit", "-2"]);
    match transport {
        Transport::SharedMemory => command.args(["--mca", "btl", "self,vader"]),
        Transport::Tcp => command.args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ]),
    };
    Ok(command)
}

/// `mpirun` as the checks run it: the component on, over shared memory.
fn mpirun_checked(components: &Path, socket: &Path, processes: usize) -> Result<Command> {
    mpirun(components, socket, processes, 100, Transport::SharedMemory)
}

/// The daemon arguments of a wire that loses, duplicates and reorders `rate` of its packets
/// (a fraction), the fault injector seeded with `seed`.
fn lossy_wire(rate: f64, seed: u64) -> Vec<String> {
    ["--loss", "--duplicate", "--reorder"]
        .iter()
        .flat_map(|option| [(*option).to_owned(), rate.to_string()])
        .chain(["--seed".to_owned(), seed.to_string()])
        .collect()
}

/// Runs `command` with a deadline; returns its standard output and error, printed as it goes,
/// and whether it succeeded.
fn run_captured(command: &mut Command, limit: Duration) -> Result<(String, bool)> {
    println!("running: {command:?}");
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| format!("starting mpirun: {error}"))?;
    let (stdout, stderr) = (
        child.stdout.take().ok_or("no stdout")?,
        child.stderr.take().ok_or("no stderr")?,
    );
    let collect = |stream: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stream).lines().map_while(|l| l.ok()) {
                println!("  {line}");
                text.push_str(&line);
                text.push('\n');
            }
            text
        })
    };
    let (out, err) = (collect(Box::new(stdout)), collect(Box::new(stderr)));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = out.join().unwrap_or_default() + &err.join().unwrap_or_default();
    match status {
        Some(status) => Ok((text, status.success())),
        None => Err(format!("timed out after {limit:?}: {command:?}").into()),
    }
}

/// The barriers the component's processes report having run through the NIC.
fn barriers_through_nic(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let before = line.split(COUNT_LINE).next()?;
            if !line.contains(COUNT_LINE) {
                return None;
            }
            before.split_whitespace().last()?.parse::<u64>().ok()
        })
        .sum()
}

/// How many distinct NICs (`node N` in the count lines) the processes used.
fn nodes_used(text: &str) -> usize {
    let nodes: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|line| line.contains(COUNT_LINE))
        .filter_map(|line| line.split("(node ").nth(1)?.split_whitespace().next())
        .collect();
    nodes.len()
}

// ---------------------------------------------------------------------------------------------
// The checks.

/// Compiles the test and benchmark programs with mpicc and mpifort into `dir`.
fn compile_programs(dir: &Path) -> Result<()> {
    let sources = workspace_root().join(SOURCES);
    std::fs::create_dir_all(dir)?;
    for (compiler, source, name) in [
        ("mpicc", "tests/barrier_concurrent.c", "barrier_concurrent"),
        ("mpicc", "tests/barrier_opposite.c", "barrier_opposite"),
        ("mpicc", "tests/barrier_kill.c", "barrier_kill"),
        ("mpicc", "tests/coll_check.c", "coll_check"),
        ("mpicc", "tests/reduce_check.c", "reduce_check"),
        ("mpicc", "tests/persistent_check.c", "persistent_check"),
        ("mpicc", "tests/reproducible_check.c", "reproducible_check"),
        ("mpicc", "tests/coll_kill.c", "coll_kill"),
        ("mpifort", "tests/barrier.f90", "barrier_fortran"),
        ("mpifort", "tests/reduce.f90", "reduce_fortran"),
        ("mpicc", "bench/barrier_bench.c", "barrier_bench"),
        ("mpicc", "bench/coll_bench.c", "coll_bench"),
        ("mpicc", "bench/persistent_bench.c", "persistent_bench"),
    ] {
        run(Command::new(compiler)
            .args(["-O2", "-Wall", "-o"])
            .arg(dir.join(name))
            .arg(sources.join(source)))?;
    }
    Ok(())
}

/// mpi4py's test directory from its source distribution, downloaded once with pip.
fn mpi4py_tests() -> Result<PathBuf> {
    let dir = scratch().join("mpi4py");
    let tests = dir.join(format!("mpi4py-{MPI4PY}")).join("test");
    if tests.join("runtests.py").exists() {
        return Ok(tests);
    }
    std::fs::create_dir_all(&dir)?;
    let pip = if output_of("pip", &["--version"]).is_some() {
        vec!["pip"]
    } else {
        vec![SYSTEM_PYTHON, "-m", "pip"]
    };
    run(Command::new(pip[0])
        .args(&pip[1..])
        .args(["download", "--no-deps", "--no-binary", ":all:"])
        .arg(format!("mpi4py=={MPI4PY}"))
        .arg("-d")
        .arg(&dir))?;
    run(Command::new("tar")
        .arg("-xzf")
        .arg(dir.join(format!("mpi4py-{MPI4PY}.tar.gz")))
        .arg("-C")
        .arg(&dir))?;
    Ok(tests)
}

/// Runs the checks; fails on the first that fails.
pub(crate) fn run_tests(args: &TestArgs) -> Result<()> {
    ensure_packages(!args.no_install)?;
    let prefix = scratch().join("prefix-dev");
    let component = build(&prefix, "dev")?;
    let components = component.parent().ok_or("no directory")?.to_owned();
    let nicctl = prefix.join("bin/nicctl");
    let programs = scratch().join("programs");
    compile_programs(&programs)?;
    let run_dir = scratch().join("run");

    // The component is listed by ompi_info with the component path.
    let listed = Command::new("ompi_info")
        .env_remove("LD_LIBRARY_PATH")
        .env(
            "OMPI_MCA_mca_base_component_path",
            format!("{}:{}", system_component_dir()?, components.display()),
        )
        .output()?;
    let listing = String::from_utf8_lossy(&listed.stdout);
    match listing
        .lines()
        .find(|line| line.contains("MCA coll: nicbar"))
    {
        Some(line) => println!("ompi_info: {}", line.trim()),
        None => return Err("ompi_info does not list coll/nicbar".into()),
    }

    // Concurrent barriers on dup and split communicators through the fault injector: four
    // processes, each on its own NIC, so that every barrier crosses the faulty wire.
    for attempt in 0..args.runs {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 & 0xffff_ffff);
        println!("\n-- concurrent barriers through the fault injector, run {attempt}, seed {seed}");
        let daemon = Daemon::start(&nicctl, &run_dir.join("faulty"), 4, &lossy_wire(0.05, seed))?;
        let mut command = mpirun_checked(&components, &daemon.socket, 4)?;
        command.arg(programs.join("barrier_concurrent")).arg("200");
        let text = run_expecting(
            &mut command,
            Duration::from_secs(120),
            "concurrent: 200 rounds ok",
            format!("the concurrent barriers failed (fault seed {seed})"),
        )?;
        expect_through_nic(&text, 4 * 800)?;
        let nodes = nodes_used(&text);
        if nodes < 4 {
            return Err(format!(
                "the processes used {nodes} NIC(s), not 4: the barriers did not all cross the \
                 faulty wire"
            )
            .into());
        }
    }

    check_opposite_order_barriers(&components, &nicctl, &programs, &run_dir)?;
    check_reductions(&components, &nicctl, &programs, &run_dir)?;
    check_persistent(&components, &nicctl, &programs, &run_dir)?;
    check_reproducible_sum(&components, &nicctl, &programs, &run_dir)?;

    let daemon = Daemon::start(&nicctl, &run_dir.join("plain"), 4, &[])?;

    check_data_collectives(
        &components,
        &nicctl,
        &daemon,
        &programs,
        &run_dir,
        (args.check_bytes, args.fault_bytes),
    )?;

    println!("\n-- Fortran");
    let mut command = mpirun_checked(&components, &daemon.socket, 4)?;
    command.arg(programs.join("barrier_fortran"));
    let text = run_expecting(
        &mut command,
        Duration::from_secs(60),
        "fortran: 100 barriers ok",
        "the Fortran program failed".to_owned(),
    )?;
    expect_through_nic(&text, 4 * 100)?;
    // Fortran's INTEGER, INTEGER(8), REAL, DOUBLE PRECISION, MPI_2INTEGER and LOGICAL: ten
    // reductions a round, twenty rounds, combined in the NIC on every process.
    let mut command = mpirun_checked(&components, &daemon.socket, 4)?;
    command.arg(programs.join("reduce_fortran"));
    let text = run_expecting(
        &mut command,
        Duration::from_secs(60),
        "fortran reductions: 2000 ok",
        "the Fortran reductions failed".to_owned(),
    )?;
    expect_reductions_in_nic(&text, 4 * 10 * 20)?;

    // Each as it comes, and with rank 0 entering late, after the other survivors failed and
    // exited: it too must name the dead rank, not a survivor that entered and left. The long
    // MPI_Iallreduce over messages runs over the NIC's messages (algorithm 0).
    let victim = 2;
    let kills = [
        ("barrier_kill", None, "MPI_Barrier"),
        ("coll_kill", Some("alltoall"), "MPI_Alltoall"),
        ("coll_kill", Some("allreduce"), "MPI_Allreduce"),
        ("coll_kill", Some("iallreduce"), "MPI_Iallreduce"),
    ];
    for (program, collective, call) in kills {
        for late in [None, Some(0)] {
            let when = late.map_or(String::new(), |rank| format!(", rank {rank} late"));
            println!("\n-- a killed rank in {call}{when}");
            let mut command = mpirun_checked(&components, &daemon.socket, 4)?;
            command
                .args(["--enable-recovery", "--mca", "coll_nicbar_timeout", "3000"])
                .args(["--mca", "coll_nicbar_allreduce_algorithm", "0"])
                .arg(programs.join(program))
                .arg(victim.to_string())
                .args(collective)
                .args(late.map(|rank| rank.to_string()));
            let (text, _) = run_captured(&mut command, Duration::from_secs(60))?;
            check_kill_report(&text, 4, victim, call)?;
        }
    }

    if args.no_mpi4py {
        println!("\n(mpi4py's test suite skipped: --no-mpi4py)");
    } else {
        let tests = mpi4py_tests()?;
        for processes in [2, 4] {
            println!("\n-- mpi4py {MPI4PY}'s test suite, {processes} processes");
            let mut command = mpirun_checked(&components, &daemon.socket, processes)?;
            command
                .current_dir(tests.parent().ok_or("no directory")?)
                .arg(SYSTEM_PYTHON)
                .arg(tests.join("runtests.py"))
                .args(["-q", "-e", "spawn"]);
            let (text, ok) = run_captured(&mut command, Duration::from_secs(900))?;
            if !ok || text.contains("FAILED") {
                return Err(format!("mpi4py's test suite failed at {processes} processes").into());
            }
            expect_through_nic(&text, 1)?;
            expect_data_over_nic(&text, 1)?;
        }
    }
    println!("\nMPI checks passed");
    Ok(())
}

/// Non-blocking barriers of two communicators started in opposite orders by even and odd ranks
/// (`barrier_opposite`): a valid MPI program, which must complete every round at 2, 3, 5 and 8
/// processes, each process on its own NIC.
fn check_opposite_order_barriers(
    components: &Path,
    nicctl: &Path,
    programs: &Path,
    run_dir: &Path,
) -> Result<()> {
    const ROUNDS: u64 = 20;
    let daemon = Daemon::start(nicctl, &run_dir.join("opposite"), 8, &[])?;
    // Even and odd sizes, a power of two and not, the largest: the sizes that differ.
    for processes in [2, 3, 5, 8] {
        println!(
            "\n-- MPI_Ibarrier on two communicators in opposite orders, {processes} processes"
        );
        let mut command = mpirun_checked(components, &daemon.socket, processes)?;
        command
            .arg(programs.join("barrier_opposite"))
            .arg(ROUNDS.to_string());
        let text = run_expecting(
            &mut command,
            Duration::from_secs(120),
            &format!("opposite: {ROUNDS} rounds ok"),
            format!("the opposite-order non-blocking barriers failed at {processes} processes"),
        )?;
        expect_through_nic(&text, processes as u64 * 2 * ROUNDS)?;
    }
    Ok(())
}

/// MPI_Allreduce, MPI_Reduce and their non-blocking forms (`reduce_check`): every predefined
/// operation on every type, long vectors, user operations and derived types (whose holes must
/// stay untouched), each result against the reference the program folds with Open MPI's own
/// operations, at 2 and 5 processes (5 takes the non-power-of-two fix-up), with the short ones
/// combined in the NIC (the component's count says so), the long ones over its messages and the
/// rest through the component below; once more through the fault injector; then the long ones
/// with each algorithm forced.
fn check_reductions(
    components: &Path,
    nicctl: &Path,
    programs: &Path,
    run_dir: &Path,
) -> Result<()> {
    let plain = Daemon::start(nicctl, &run_dir.join("reduce"), 5, &[])?;
    let faulty = Daemon::start(
        nicctl,
        &run_dir.join("reduce-faulty"),
        4,
        &lossy_wire(0.05, 7),
    )?;
    // At 2 processes as users get it by default (what the NIC does not combine goes to the
    // component below); at 5 and through the fault injector with the NIC's messages carrying it
    // (the algorithm chosen by size: recursive doubling, and Rabenseifner's above 64 KiB).
    for (daemon, processes, wire, over_messages) in [
        (&plain, 2, "plain", false),
        (&plain, 5, "plain", true),
        (&faulty, 4, "lossy", true),
    ] {
        let rest = if over_messages {
            "the rest over the NIC's messages"
        } else {
            "the rest through the component below"
        };
        println!("\n-- MPI_Allreduce and MPI_Reduce, {processes} processes, {wire} wire, {rest}");
        let mut command = mpirun_checked(components, &daemon.socket, processes)?;
        if over_messages {
            command.args(["--mca", "coll_nicbar_allreduce_algorithm", "0"]);
        }
        command.arg(programs.join("reduce_check"));
        let text = run_expecting(
            &mut command,
            Duration::from_secs(300),
            "reduce_check: ok",
            format!("reduce_check failed at {processes} processes on the {wire} wire"),
        )?;
        let combined = reductions_in_nic(&text);
        println!("reductions combined in the NIC (all processes): {combined}");
        // One process: the component leaves a communicator of one to the component below.
        if processes > 1 && combined == 0 {
            return Err("no reduction was combined in the NIC".into());
        }
    }
    // The long vectors and user operations again with the other algorithms forced.
    for (algorithm, name) in [("1", "recursive doubling"), ("3", "the ring")] {
        println!("\n-- long MPI_Allreduce and MPI_Reduce, 5 processes, {name} forced");
        let mut command = mpirun_checked(components, &plain.socket, 5)?;
        command.args(["--mca", "coll_nicbar_allreduce_algorithm", algorithm]);
        command
            .arg(programs.join("reduce_check"))
            .args(["1", "long"]);
        let text = run_expecting(
            &mut command,
            Duration::from_secs(300),
            "reduce_check: ok",
            format!("reduce_check failed with {name} forced"),
        )?;
        // Each rank's long reductions, user operations and derived types, blocking and not,
        // are over 240 (1,294 in all); had the non-blocking ones gone to the component below,
        // as they once did, 1,014 would count (639 without the padded pairs and derived types).
        expect_data_over_nic(&text, 5 * 240)?;
    }
    Ok(())
}

/// The persistent collectives (`persistent_check`): MPIX_Barrier_init, MPIX_Allreduce_init and
/// MPIX_Reduce_init started many times, each result against Open MPI's own operations, and
/// MPI_Startall of two requests on two communicators listed in opposite orders by even and odd
/// ranks; at 2 and 5 processes (5 takes the recursive doubling's fix-up), each on its own NIC.
/// The component's counts say the short reductions went through the NIC, every start of them.
fn check_persistent(
    components: &Path,
    nicctl: &Path,
    programs: &Path,
    run_dir: &Path,
) -> Result<()> {
    const STARTS: u64 = 3;
    // What one process combines in the NIC at the least: 26 (operation, type) pairs, two lengths
    // each, three persistent reductions started STARTS times; and the MPI_Startall's allreduce,
    // started 4 * STARTS times.
    const IN_NIC: u64 = 26 * 2 * 3 * STARTS + 4 * STARTS;
    let daemon = Daemon::start(nicctl, &run_dir.join("persistent"), 5, &[])?;
    for processes in [2, 5] {
        println!("\n-- persistent collectives, {processes} processes");
        let mut command = mpirun_checked(components, &daemon.socket, processes)?;
        command
            .arg(programs.join("persistent_check"))
            .arg(STARTS.to_string());
        let text = run_expecting(
            &mut command,
            Duration::from_secs(120),
            "persistent_check: ok",
            format!("persistent_check failed at {processes} processes"),
        )?;
        expect_reductions_in_nic(&text, processes as u64 * IN_NIC)?;
        // The persistent barrier's starts and the MPI_Startall's, beside the reductions.
        expect_through_nic(&text, processes as u64 * (IN_NIC + 2 * 4 * STARTS))?;
    }
    Ok(())
}

/// The reproducible sum (`reproducible_check` with `coll_nicbar_reproducible_sum 1`): sums of
/// one `double` or `float` whose ordinary floating-point result depends on the order come out as
/// the exact sum rounded once, on a communicator, on its reverse and on its halves, at 3 and 8
/// processes (odd and even halves, and the allreduce's fix-up at 3); each went through the NIC.
fn check_reproducible_sum(
    components: &Path,
    nicctl: &Path,
    programs: &Path,
    run_dir: &Path,
) -> Result<()> {
    const ROUNDS: u64 = 10;
    let daemon = Daemon::start(nicctl, &run_dir.join("reproducible"), 8, &[])?;
    for processes in [3, 8] {
        println!("\n-- the reproducible sum, {processes} processes");
        let mut command = mpirun_checked(components, &daemon.socket, processes)?;
        command.args(["--mca", "coll_nicbar_reproducible_sum", "1"]);
        command
            .arg(programs.join("reproducible_check"))
            .arg(ROUNDS.to_string());
        let text = run_expecting(
            &mut command,
            Duration::from_secs(120),
            "reproducible_check: ok",
            format!("reproducible_check failed at {processes} processes"),
        )?;
        // Per round, five sums on the world and on its reverse, on every process.
        expect_reductions_in_nic(&text, processes as u64 * ROUNDS * 2 * 5)?;
    }
    Ok(())
}

/// The sum of the processes' "N reductions were combined in the NIC" lines.
fn reductions_in_nic(text: &str) -> u64 {
    const LINE: &str = " reductions were combined in the NIC";
    text.lines()
        .filter(|line| line.contains(LINE))
        .filter_map(|line| {
            line.split(LINE)
                .next()?
                .split_whitespace()
                .last()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The data collectives (`coll_check`): every result checked against MPI's definition by the
/// program itself, and its digests compared with a run through Open MPI's own collectives; at 5
/// processes (an odd world, splits of 3 and 2) with the sizes chosen by the component and with
/// each algorithm forced, and at 4 processes on 4 NICs through the fault injector.
fn check_data_collectives(
    components: &Path,
    nicctl: &Path,
    daemon: &Daemon,
    programs: &Path,
    run_dir: &Path,
    (check_bytes, fault_bytes): (usize, usize),
) -> Result<()> {
    let check = programs.join("coll_check");
    let forced_bytes = FORCED_CHECK_BYTES.min(check_bytes);
    let run = |socket: &Path,
               processes: usize,
               priority: i32,
               forced: &[(&str, String)],
               bytes: usize| {
        let mut command = mpirun(
            components,
            socket,
            processes,
            priority,
            Transport::SharedMemory,
        )?;
        for (name, value) in forced {
            command.args(["--mca", name, value]);
        }
        command.arg(&check).arg(bytes.to_string());
        let started = Instant::now();
        let (text, ok) = run_captured(&mut command, Duration::from_secs(600))?;
        println!("({:.1} s)", started.elapsed().as_secs_f64());
        if !ok || !text.contains("coll_check: ok") {
            return Err(format!("coll_check failed (priority {priority}, {forced:?})").into());
        }
        Ok::<_, Box<dyn std::error::Error>>(text)
    };
    println!("\n-- the data collectives through Open MPI's own (the reference)");
    let reference = digests(&run(&daemon.socket, 5, -1, &[], check_bytes)?);
    let small_reference = digests(&run(&daemon.socket, 5, -1, &[], forced_bytes)?);
    if reference.len() != 5 || small_reference.len() != 5 {
        return Err(format!("coll_check printed {} digests, not 5", reference.len()).into());
    }
    // Chosen by size up to `check_bytes`; then each row forces one algorithm per collective
    // (together they cover every algorithm; the sixth broadcast, the NIC's, carries the messages
    // of up to 32 bytes and hands longer ones on) up to `forced_bytes`; the last switches every
    // data collective off, so that the component below (saved at enable) serves them.
    let forced: Vec<(Vec<(&str, String)>, usize)> = std::iter::once((Vec::new(), check_bytes))
        .chain((1..=6).map(|k: i32| {
            (
                vec![
                    ("coll_nicbar_bcast_algorithm", k.to_string()),
                    (
                        "coll_nicbar_scatter_algorithm",
                        ((k - 1) % 2 + 1).to_string(),
                    ),
                    ("coll_nicbar_gather_algorithm", (k % 2 + 1).to_string()),
                    (
                        "coll_nicbar_alltoall_algorithm",
                        ((k - 1) % 3 + 1).to_string(),
                    ),
                    ("coll_nicbar_segment", forced_segment(k).to_string()),
                ],
                forced_bytes,
            )
        }))
        .chain(std::iter::once((
            [
                "coll_nicbar_bcast_algorithm",
                "coll_nicbar_scatter_algorithm",
                "coll_nicbar_gather_algorithm",
                "coll_nicbar_alltoall_algorithm",
            ]
            .into_iter()
            .map(|name| (name, "-1".to_owned()))
            .collect(),
            forced_bytes,
        )))
        .collect();
    for (parameters, bytes) in &forced {
        println!("\n-- the data collectives through the component {parameters:?}, to {bytes} B");
        let text = run(&daemon.socket, 5, 100, parameters, *bytes)?;
        let through = digests(&text);
        let expected = if *bytes == check_bytes {
            reference.clone()
        } else {
            small_reference.clone()
        };
        if through != expected {
            return Err(format!(
                "coll_check's results through the component differ from Open MPI's own \
                 ({parameters:?}): {through:?} against {expected:?}"
            )
            .into());
        }
        let off = parameters.iter().any(|(_, value)| value == "-1");
        let count = expect_data_over_nic(&text, if off { 0 } else { 5 * 100 })?;
        if parameters.is_empty() {
            // The broadcasts' inner ranks forward segments; messages from 1 MiB (the gathers'
            // and scatters' blocks of the largest size) go by rendezvous.
            let forwarded = sum_before(&text, " segments forwarded");
            let landed = sum_before(&text, " received by rendezvous");
            println!("segments forwarded: {forwarded}; messages received by rendezvous: {landed}");
            if forwarded == 0 || (check_bytes >= 1 << 20 && landed == 0) {
                return Err(format!(
                    "the component forwarded {forwarded} segments and received {landed} \
                     messages by rendezvous"
                )
                .into());
            }
        }
        if off && count > 0 {
            return Err(
                format!("{count} data collectives went over the NIC though switched off").into(),
            );
        }
    }
    // A selection map (`cargo xtask tune`'s format) choosing other algorithms than the defaults
    // by size, and a malformed one, which is refused naming its line (the defaults serve).
    let good = run_dir.join("coll-map");
    std::fs::write(
        &good,
        "nicbar-coll-map 1\n\
         bcast 2-64 0-32 nic\n\
         bcast 2-64 33-4095 split-binary\n\
         bcast 2-64 4096-max pipeline\n\
         scatter 2-64 0-max binomial\n\
         gather 2-64 0-max binomial\n\
         alltoall 2-64 0-max bruck\n",
    )?;
    let bad = run_dir.join("coll-map-bad");
    std::fs::write(&bad, "nicbar-coll-map 1\n\nbcast 2-64 0-max fastest\n")?;
    for (map, refused) in [(&good, false), (&bad, true)] {
        println!(
            "\n-- the data collectives chosen by the map {}",
            map.display()
        );
        let parameters = [("coll_nicbar_map", map.display().to_string())];
        let text = run(&daemon.socket, 5, 100, &parameters, forced_bytes)?;
        if digests(&text) != small_reference {
            return Err(format!(
                "coll_check's results with the map {} differ from Open MPI's own",
                map.display()
            )
            .into());
        }
        let said = text.contains("refused, line 3:") && text.contains("fastest");
        if said != refused {
            return Err(format!(
                "the map {} was {}reported refused",
                map.display(),
                if said { "" } else { "not " }
            )
            .into());
        }
        expect_data_over_nic(&text, 5 * 100)?;
    }
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 & 0xffff_ffff);
    println!("\n-- the data collectives through the fault injector, seed {seed}");
    let faults = lossy_wire(0.02, seed);
    let faulty = Daemon::start(nicctl, &run_dir.join("faulty-data"), 4, &faults)?;
    let text = run(&faulty.socket, 4, 100, &[], fault_bytes)
        .map_err(|error| format!("{error} (fault seed {seed})"))?;
    expect_data_over_nic(&text, 4 * 100)?;
    Ok(())
}

/// The digests `coll_check` printed, by rank.
fn digests(text: &str) -> std::collections::BTreeMap<u32, String> {
    text.lines()
        .filter_map(|line| {
            let rest = line.split("coll_check: rank ").nth(1)?;
            let mut words = rest.split_whitespace();
            let rank = words.next()?.parse().ok()?;
            (words.next()? == "digest").then_some(())?;
            Some((rank, words.next()?.to_owned()))
        })
        .collect()
}

/// The sum over the lines of `text` of the count just before `suffix` (as the component's
/// verbose lines print them: "... 12 segments forwarded").
fn sum_before(text: &str, suffix: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let (before, _) = line.split_once(suffix)?;
            before.split_whitespace().last()?.parse::<u64>().ok()
        })
        .sum()
}

/// Fails unless at least `least` data collectives went over the NIC; prints and returns how many
/// did.
fn expect_data_over_nic(text: &str, least: u64) -> Result<u64> {
    let count: u64 = text
        .lines()
        .filter_map(|line| {
            let before = line.split(DATA_COUNT_LINE).next()?;
            if !line.contains(DATA_COUNT_LINE) {
                return None;
            }
            before.split_whitespace().last()?.parse::<u64>().ok()
        })
        .sum();
    println!("data collectives over the NIC (all processes): {count}");
    if count < least {
        return Err(
            format!("only {count} data collectives went over the NIC, expected {least}").into(),
        );
    }
    Ok(count)
}

/// Fails unless at least `least` barriers went through the NIC; prints how many did.
fn expect_through_nic(text: &str, least: u64) -> Result<()> {
    let count = barriers_through_nic(text);
    println!("barriers through the NIC (all processes): {count}");
    if count < least {
        return Err(format!("only {count} barriers went through the NIC, expected {least}").into());
    }
    Ok(())
}

/// Runs `command` for at most `limit` and returns its output, if it exited well and printed
/// `ok_line`; else fails with `failure`.
fn run_expecting(
    command: &mut Command,
    limit: Duration,
    ok_line: &str,
    failure: String,
) -> Result<String> {
    let (text, ok) = run_captured(command, limit)?;
    if !ok || !text.contains(ok_line) {
        return Err(failure.into());
    }
    Ok(text)
}

/// Fails unless the processes' "N reductions were combined in the NIC" lines add up to `least`
/// at least (fewer: some went elsewhere).
fn expect_reductions_in_nic(text: &str, least: u64) -> Result<()> {
    let count = reductions_in_nic(text);
    println!("reductions combined in the NIC (all processes): {count}");
    if count < least {
        return Err(
            format!("only {count} reductions were combined in the NIC, expected {least}").into(),
        );
    }
    Ok(())
}

/// Every survivor's `operation` failed instead of hanging, and each failure names the killed
/// rank as the one missing.
fn check_kill_report(text: &str, processes: usize, victim: usize, operation: &str) -> Result<()> {
    let failures: Vec<&str> = text
        .lines()
        .filter(|line| line.contains(&format!("{operation} failed:")))
        .collect();
    let naming = failures
        .iter()
        .filter(|line| line.contains(&format!("rank {victim} is missing")))
        .count();
    println!(
        "{} of {} survivors reported a failed {operation}; {naming} named rank {victim}",
        failures.len(),
        processes - 1
    );
    if failures.len() != processes - 1 {
        return Err(format!("a survivor's {operation} did not fail").into());
    }
    if failures.iter().any(|line| !line.contains(" is missing")) {
        return Err("a failure does not name a missing rank".into());
    }
    // The NIC passes a failed barrier on to every member still waiting, naming the member that
    // is missing, and one that enters late goes past the members that entered and left; a rank
    // that gives up a collective over messages tells the others whom it found missing, so that
    // one waiting on it names that rank too: every survivor names the killed rank.
    if naming != processes - 1 {
        return Err(format!(
            "{naming} of {} survivors named the killed rank {victim}",
            processes - 1
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bench::{parse_collective_results, parse_result};
    use super::*;

    #[test]
    fn a_lossy_wire_is_the_fault_injectors_three_rates_and_its_seed() {
        assert_eq!(
            lossy_wire(0.02, 9),
            [
                "--loss",
                "0.02",
                "--duplicate",
                "0.02",
                "--reorder",
                "0.02",
                "--seed",
                "9"
            ]
        );
    }

    #[test]
    fn the_collective_result_lines_are_read() {
        let text = "noise\n  result collective=bcast bytes=4096 us=12.50 iterations=40\n\
                    result collective=alltoall bytes=8 us=x iterations=3\n";
        assert_eq!(
            parse_collective_results(text),
            vec![("bcast".to_owned(), 4096, 12.5)]
        );
    }

    #[test]
    fn digests_are_read_by_rank() {
        let text = "  coll_check: rank 1 digest 00ff checks 3 failures 0\n\
                    coll_check: rank 0 digest 0a0b checks 3 failures 0\ncoll_check: ok\n";
        let read = digests(text);
        assert_eq!(read.len(), 2);
        assert_eq!(read[&0], "0a0b");
        assert_eq!(read[&1], "00ff");
    }

    #[test]
    fn the_count_lines_are_summed() {
        let text = "[node-a:1] coll:nicbar: rank 0: 3944 barriers went through the NIC (node 0 port 2)\n\
                    other line 12\n\
                    [node-a:2] coll:nicbar: rank 1: 3944 barriers went through the NIC (node 0 port 1)\n";
        assert_eq!(barriers_through_nic(text), 7888);
        assert_eq!(barriers_through_nic("nothing here"), 0);
        assert_eq!(nodes_used(text), 1);
    }

    #[test]
    fn the_result_line_is_read() {
        let text = "noise\nresult barrier_us=12.50 ibarrier_pure_us=20.00 overlap_pct=95.5 \
                    post_us=0.40 wait_us=0.50\n";
        let result = parse_result(text).expect("parses");
        assert_eq!(
            (
                result.barrier_us,
                result.ibarrier_us,
                result.overlap_pct,
                result.post_us,
                result.wait_us
            ),
            (12.5, 20.0, 95.5, 0.4, 0.5)
        );
        assert_eq!(parse_result("result barrier_us=1"), None);
    }

    #[test]
    fn a_kill_report_must_fail_every_survivor_and_name_the_victim() {
        let good = "rank 0: MPI_Barrier failed: MPI_Barrier on MPI_COMM_WORLD: rank 2 is missing (x)\n\
                    rank 1: MPI_Barrier failed: MPI_Barrier on MPI_COMM_WORLD: rank 2 is missing (x)\n\
                    rank 3: MPI_Barrier failed: MPI_Barrier on MPI_COMM_WORLD: rank 2 is missing (x)\n";
        assert!(check_kill_report(good, 4, 2, "MPI_Barrier").is_ok());
        let one_names_a_survivor = good.replacen("rank 2 is missing", "rank 3 is missing", 1);
        assert!(check_kill_report(&one_names_a_survivor, 4, 2, "MPI_Barrier").is_err());
        let short: String = good.lines().take(2).collect::<Vec<_>>().join("\n");
        assert!(check_kill_report(&short, 4, 2, "MPI_Barrier").is_err());
        assert!(check_kill_report(good, 4, 1, "MPI_Barrier").is_err());
        assert!(check_kill_report(good, 4, 2, "MPI_Alltoall").is_err());
    }
}
