//! `cargo xtask bench mpi`: MPI_Barrier latency and MPI_Ibarrier overlap through coll/nicbar
//! beside Open MPI's own collectives, on one host and across network namespaces.

// The benchmark runs the stage's own helpers: mpirun, daemons, the compiled programs.
use super::*;

// ---------------------------------------------------------------------------------------------
// The benchmark.

/// Options of `cargo xtask bench mpi`.
#[derive(ClapArgs)]
pub(crate) struct BenchArgs {
    /// Process counts.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8, 16])]
    sizes: Vec<usize>,
    /// Timed barriers per measurement.
    #[arg(long, default_value_t = 1000)]
    iterations: usize,
    /// Where to write bench-mpi.csv.
    #[arg(long, default_value = "target")]
    out: PathBuf,
    /// Also measure across this many network namespaces on a bridge (one host each, one
    /// daemon and one process per namespace, the fabric formed by nicbar-fabric); needs root.
    #[arg(long, value_delimiter = ',')]
    namespaces: Vec<usize>,
}

/// One measurement: what served the barrier, over which transport, how many processes.
struct Measurement {
    barrier: &'static str,
    /// "one host", or how many namespaces.
    hosts: String,
    processes: usize,
    barrier_us: f64,
    ibarrier_us: f64,
    overlap_pct: f64,
}

/// Runs `cargo xtask bench mpi`.
pub(crate) fn run_bench(args: BenchArgs) -> Result<()> {
    ensure_packages(true)?;
    let prefix = scratch().join("prefix");
    let component = build(&prefix, "capi")?;
    let components = component.parent().ok_or("no directory")?.to_owned();
    let programs = scratch().join("programs");
    compile_programs(&programs)?;
    let largest = args.sizes.iter().copied().max().unwrap_or(1);
    let daemon = Daemon::start(
        &prefix.join("bin/nicctl"),
        &scratch().join("run").join("bench"),
        largest,
        &[],
    )?;
    let mut results = Vec::new();
    for &processes in &args.sizes {
        for (barrier, priority, transport) in [
            ("nicbar (NIC)", 100, Transport::SharedMemory),
            ("Open MPI shm", -1, Transport::SharedMemory),
            ("Open MPI TCP lo", -1, Transport::Tcp),
        ] {
            let mut command = mpirun(&components, &daemon.socket, processes, priority, transport)?;
            command
                .args(["--mca", "mpi_yield_when_idle", "1"])
                .arg(programs.join("barrier_bench"))
                .arg(args.iterations.to_string());
            let (text, ok) = run_captured(&mut command, Duration::from_secs(600))?;
            let Some((barrier_us, ibarrier_us, overlap_pct)) = parse_result(&text).filter(|_| ok)
            else {
                return Err(format!("{barrier} at {processes} processes gave no result").into());
            };
            if priority > 0 && barriers_through_nic(&text) == 0 {
                return Err("the component ran no barrier: is the NIC daemon reachable?".into());
            }
            results.push(Measurement {
                barrier,
                hosts: "one host".to_owned(),
                processes,
                barrier_us,
                ibarrier_us,
                overlap_pct,
            });
        }
    }
    drop(daemon);
    for &hosts in &args.namespaces {
        results.extend(bench_namespaces(
            &prefix,
            &components,
            &programs,
            hosts,
            args.iterations,
        )?);
    }
    println!(
        "\nMPI_Barrier mean µs and MPI_Ibarrier overlap (OSU), {} iterations; on one host one \
         emulated NIC per process, across namespaces one daemon and one process each:\n",
        args.iterations
    );
    println!("| hosts | processes | barrier | MPI_Barrier µs | MPI_Ibarrier µs | overlap % |");
    println!("|---|---|---|---|---|---|");
    let mut csv = String::from("hosts,processes,barrier,barrier_us,ibarrier_us,overlap_pct\n");
    for m in &results {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.0} |",
            m.hosts, m.processes, m.barrier, m.barrier_us, m.ibarrier_us, m.overlap_pct
        );
        csv.push_str(&format!(
            "{},{},{},{:.2},{:.2},{:.1}\n",
            m.hosts, m.processes, m.barrier, m.barrier_us, m.ibarrier_us, m.overlap_pct
        ));
    }
    let out = workspace_root().join(&args.out);
    std::fs::create_dir_all(&out)?;
    let path = out.join("bench-mpi.csv");
    std::fs::write(&path, csv)?;
    println!("\nwrote {}", path.display());
    Ok(())
}

/// The bridge and the namespaces' names and addresses.
const BRIDGE: &str = "nbmpibr0";
/// Namespace `i` is this prefix and `i`.
const NAMESPACE_PREFIX: &str = "nbmpi";
/// The namespaces are hosts `SUBNET.1..`; the bridge is `SUBNET.254`.
const SUBNET: &str = "10.77.0";

/// Network namespaces on a bridge standing in for hosts (`SUBNET.1..=count`), removed on drop.
struct Namespaces {
    count: usize,
}

impl Namespaces {
    fn create(count: usize) -> Result<Self> {
        let ip = |args: &[&str]| run(Command::new("ip").args(args));
        let mut namespaces = Self { count: 0 };
        Self::remove(count);
        ip(&["link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{SUBNET}.254/24"), "dev", BRIDGE])?;
        ip(&["link", "set", BRIDGE, "up"])?;
        for index in 0..count {
            let name = format!("{NAMESPACE_PREFIX}{index}");
            let veth = format!("{NAMESPACE_PREFIX}v{index}");
            ip(&["netns", "add", &name])?;
            namespaces.count = index + 1;
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &name,
            ])?;
            ip(&["link", "set", &veth, "master", BRIDGE, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", name.as_str(), "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            inside(&[
                "addr",
                "add",
                &format!("{SUBNET}.{}/24", index + 1),
                "dev",
                "eth0",
            ])?;
            inside(&["link", "set", "eth0", "up"])?;
            inside(&["link", "set", "lo", "up"])?;
        }
        Ok(namespaces)
    }
}

impl Namespaces {
    /// Removes namespaces, veth pairs and the bridge of `count` hosts, whatever exists of them.
    /// A namespace lives on while a process in it does; deleting its veth pair at once frees the
    /// names for the next set.
    fn remove(count: usize) {
        let quiet = |args: &[&str]| {
            let _ = Command::new("ip").args(args).stderr(Stdio::null()).status();
        };
        for index in 0..count {
            quiet(&["link", "del", &format!("{NAMESPACE_PREFIX}v{index}")]);
            quiet(&["netns", "del", &format!("{NAMESPACE_PREFIX}{index}")]);
        }
        quiet(&["link", "del", BRIDGE]);
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        Self::remove(self.count);
    }
}

/// `mpirun` of one process per namespace of `hosts`, reached through the netns agent.
fn mpirun_namespaces(components: &Path, run_dir: &Path, hosts: usize) -> Result<Command> {
    let hostfile = run_dir.join("hosts");
    let lines: String = (1..=hosts)
        .map(|host| format!("{SUBNET}.{host} slots=1\n"))
        .collect();
    std::fs::write(&hostfile, lines)?;
    let subnet = format!("{SUBNET}.0/24");
    let mut command = Command::new("mpirun");
    command
        .env_remove("LD_LIBRARY_PATH")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("NICBAR_NETNS_PREFIX", NAMESPACE_PREFIX)
        .env("NICBAR_NETNS_RUN", run_dir)
        .args(["--allow-run-as-root", "--hostfile"])
        .arg(&hostfile)
        .args(["--map-by", "ppr:1:node", "-np", &hosts.to_string()])
        .args(["--mca", "plm_rsh_agent"])
        .arg(workspace_root().join(SOURCES).join("tools/netns_rsh.sh"))
        .args(["--mca", "oob_tcp_if_include", &subnet])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            &subnet,
        ])
        .args(["--mca", "mca_base_component_path"])
        .arg(format!(
            "{}:{}",
            system_component_dir()?,
            components.display()
        ))
        .args(["--mca", "coll_nicbar_verbose", "1"]);
    Ok(command)
}

/// The component and Open MPI over TCP across `hosts` namespaces.
fn bench_namespaces(
    prefix: &Path,
    components: &Path,
    programs: &Path,
    hosts: usize,
    iterations: usize,
) -> Result<Vec<Measurement>> {
    println!("\n-- across {hosts} network namespaces");
    let _namespaces = Namespaces::create(hosts)?;
    let run_dir = scratch().join("run").join(format!("netns-{hosts}"));
    std::fs::create_dir_all(&run_dir)?;
    let stop = || {
        for index in 0..hosts {
            let pidfile = run_dir.join(index.to_string()).join("daemon.pid");
            if let Some(pid) = std::fs::read_to_string(pidfile)
                .ok()
                .and_then(|text| text.trim().parse::<i32>().ok())
            {
                let _ = Command::new("kill").arg(pid.to_string()).status();
            }
        }
    };
    let mut fabric = mpirun_namespaces(components, &run_dir, hosts)?;
    fabric
        .arg(prefix.join("bin/nicbar-fabric"))
        .args(["--interface", "eth0", "--nicctl"])
        .arg(prefix.join("bin/nicctl"));
    let started = run_captured(&mut fabric, Duration::from_secs(120));
    if !started.is_ok_and(|(text, ok)| ok && text.contains("one daemon each")) {
        stop();
        return Err(
            format!("nicbar-fabric did not start the daemons of {hosts} namespaces").into(),
        );
    }
    let mut results = Vec::new();
    for (barrier, priority) in [("nicbar (NIC)", 100), ("Open MPI TCP", -1)] {
        let mut command = mpirun_namespaces(components, &run_dir, hosts)?;
        command
            .args(["--mca", "coll_nicbar_priority", &priority.to_string()])
            .args(["--mca", "mpi_yield_when_idle", "1"])
            .arg(programs.join("barrier_bench"))
            .arg(iterations.to_string());
        let measured = run_captured(&mut command, Duration::from_secs(600))
            .ok()
            .filter(|(text, _)| priority < 0 || barriers_through_nic(text) > 0)
            .and_then(|(text, ok)| parse_result(&text).filter(|_| ok));
        let Some((barrier_us, ibarrier_us, overlap_pct)) = measured else {
            stop();
            return Err(format!("{barrier} across {hosts} namespaces gave no result").into());
        };
        results.push(Measurement {
            barrier,
            hosts: format!("{hosts} namespaces"),
            processes: hosts,
            barrier_us,
            ibarrier_us,
            overlap_pct,
        });
    }
    stop();
    Ok(results)
}

/// The benchmark program's `result` line: barrier µs, Ibarrier µs, overlap %.
pub(super) fn parse_result(text: &str) -> Option<(f64, f64, f64)> {
    let line = text.lines().find(|l| l.starts_with("result "))?;
    let field = |name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    Some((
        field("barrier_us=")?,
        field("ibarrier_pure_us=")?,
        field("overlap_pct=")?,
    ))
}
