//! `cargo xtask bench mpi`: MPI_Barrier latency and MPI_Ibarrier overlap through coll/nicbar
//! beside Open MPI's own collectives, on one host and across network namespaces; and the data
//! collectives' latency (MPI_Bcast, MPI_Scatter[v], MPI_Gather[v], MPI_Alltoall[v],
//! MPI_Allreduce) over message sizes and process counts, the component beside Open MPI over
//! shared memory and over TCP. Tables, CSVs and plots.

// The benchmark runs the stage's own helpers: mpirun, daemons, the compiled programs.
use super::*;
use crate::engine::Engine;
use crate::plot::{Axis, Colour, Figure, Panel, Series, Stroke};

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
    /// Process counts of the data collectives' measurements.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8, 16])]
    collective_sizes: Vec<usize>,
    /// Message sizes of the data collectives, bytes per rank.
    #[arg(long, value_delimiter = ',', default_values_t = [8, 64, 512, 4096, 32768, 262144, 1048576, 4194304, 16777216])]
    bytes: Vec<usize>,
    /// The data collectives to measure (of bcast, scatter, gather, scatterv, gatherv, alltoall,
    /// alltoallv, allreduce; default: all).
    #[arg(long, value_delimiter = ',')]
    collectives: Vec<String>,
    /// Time to spend on each (collective, size), in ms (at least 3 iterations each).
    #[arg(long, default_value_t = 300)]
    budget_ms: u64,
    /// The quick mode for a small machine: 2, 4 and 8 processes, 8 B, 4 KiB, 64 KiB and 1 MiB,
    /// 100 ms per point.
    #[arg(long)]
    quick: bool,
    /// Measure only the barriers.
    #[arg(long, conflicts_with = "no_barriers")]
    no_collectives: bool,
    /// Measure only the data collectives.
    #[arg(long)]
    no_barriers: bool,
    /// Measure nothing: draw bench-mpi.svg and bench-mpi-coll.svg again from the CSVs in --out
    /// (those that are there).
    #[arg(long)]
    replot: bool,
    /// The one-host daemon's NIC threads, idle policy and niceness (the barriers' and the data
    /// collectives' daemons alike).
    #[command(flatten)]
    engine: Engine,
}

/// All-to-alls whose whole exchange (block x processes x processes) passes this many bytes are
/// skipped: they would take minutes on two cores.
const ALLTOALL_LIMIT: usize = 64 << 20;

/// `command`, the run of one row, on its CPUs: the component's on the processes' CPUs of
/// `--nic-cpus` (the NIC's are the daemon's), Open MPI's own everywhere (no NIC of theirs
/// needs a core).
fn on_row_cpus(engine: &Engine, command: Command, priority: i32) -> Result<Command> {
    if priority < 0 {
        Ok(command)
    } else {
        engine.confine(command)
    }
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
    /// Mean time in the MPI_Ibarrier call of the overlap loop (largest over the ranks).
    post_us: f64,
    /// Mean time in its MPI_Wait after the compute (largest over the ranks).
    wait_us: f64,
    /// CPU time of the daemon's NIC threads over the whole run (both loops, warm-up included),
    /// ms; `None` where no daemon of ours served it.
    nic_cpu_ms: Option<f64>,
}

impl Measurement {
    /// Its row: where, how many, which barrier, then the latencies with `places` decimals and
    /// the overlap with `overlap_places`.
    fn cells(&self, places: usize, overlap_places: usize) -> Vec<String> {
        let mut cells = vec![
            self.hosts.clone(),
            self.processes.to_string(),
            self.barrier.to_owned(),
        ];
        for (value, places) in [
            (self.barrier_us, places),
            (self.ibarrier_us, places),
            (self.overlap_pct, overlap_places),
            (self.post_us, places),
            (self.wait_us, places),
        ] {
            cells.push(format!("{value:.places$}"));
        }
        cells.push(
            self.nic_cpu_ms
                .map_or_else(String::new, |ms| format!("{ms:.places$}")),
        );
        cells
    }
}

/// What `barrier_bench` prints.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct BarrierResult {
    pub(super) barrier_us: f64,
    pub(super) ibarrier_us: f64,
    pub(super) overlap_pct: f64,
    pub(super) post_us: f64,
    pub(super) wait_us: f64,
}

impl Measurement {
    fn new(barrier: &'static str, hosts: String, processes: usize, result: BarrierResult) -> Self {
        Self {
            barrier,
            hosts,
            processes,
            barrier_us: result.barrier_us,
            ibarrier_us: result.ibarrier_us,
            overlap_pct: result.overlap_pct,
            post_us: result.post_us,
            wait_us: result.wait_us,
            nic_cpu_ms: None,
        }
    }
}

/// Runs `cargo xtask bench mpi`.
pub(crate) fn run_bench(args: BenchArgs) -> Result<()> {
    if args.replot {
        return replot_collectives(&workspace_root().join(&args.out));
    }
    // A bad --nic-cpus is told before anything is built.
    args.engine.process_cpus()?;
    ensure_packages(true)?;
    let prefix = scratch().join("prefix");
    let component = build(&prefix, "capi")?;
    let components = component.parent().ok_or("no directory")?.to_owned();
    let programs = scratch().join("programs");
    compile_programs(&programs)?;
    let out = workspace_root().join(&args.out);
    std::fs::create_dir_all(&out)?;
    if !args.no_barriers {
        bench_barriers(&args, &prefix, &components, &programs, &out)?;
    }
    if !args.no_collectives {
        bench_collectives(&args, &prefix, &components, &programs, &out)?;
    }
    Ok(())
}

/// MPI_Barrier and MPI_Ibarrier: bench-mpi.csv and bench-mpi.svg.
fn bench_barriers(
    args: &BenchArgs,
    prefix: &Path,
    components: &Path,
    programs: &Path,
    out: &Path,
) -> Result<()> {
    let largest = args.sizes.iter().copied().max().unwrap_or(1);
    let daemon = Daemon::start(
        &prefix.join("bin/nicctl"),
        &scratch().join("run").join("bench"),
        largest,
        &args.engine.daemon_args(),
    )?;
    println!(
        "one-host daemon: {largest} units, {}",
        args.engine.describe()
    );
    let mut results = Vec::new();
    for &processes in &args.sizes {
        for (barrier, priority, transport) in [
            ("nicbar (NIC)", 100, Transport::SharedMemory),
            ("Open MPI shm", -1, Transport::SharedMemory),
            ("Open MPI TCP lo", -1, Transport::Tcp),
        ] {
            let mut command = mpirun(components, &daemon.socket, processes, priority, transport)?;
            command
                .args(["--mca", "mpi_yield_when_idle", "1"])
                .arg(programs.join("barrier_bench"))
                .arg(args.iterations.to_string());
            let mut command = on_row_cpus(&args.engine, command, priority)?;
            let cpu_before = daemon.nic_cpu_ns();
            let stopped = (priority < 0).then(|| daemon.stopped()).transpose()?;
            let (text, ok) = run_row(
                &mut command,
                Duration::from_secs(600),
                priority < 0,
                &format!("{barrier} at {processes} processes"),
                |text| parse_result(text).is_some(),
            )?;
            drop(stopped);
            let nic_cpu_ms =
                (priority > 0).then(|| daemon.nic_cpu_ns().saturating_sub(cpu_before) as f64 / 1e6);
            let Some(result) = parse_result(&text).filter(|_| ok) else {
                return Err(format!("{barrier} at {processes} processes gave no result").into());
            };
            if priority > 0 && barriers_through_nic(&text) == 0 {
                return Err("the component ran no barrier: is the NIC daemon reachable?".into());
            }
            let mut measurement =
                Measurement::new(barrier, "one host".to_owned(), processes, result);
            measurement.nic_cpu_ms = nic_cpu_ms;
            results.push(measurement);
        }
    }
    drop(daemon);
    for &hosts in &args.namespaces {
        results.extend(bench_namespaces(
            prefix,
            components,
            programs,
            hosts,
            args.iterations,
        )?);
    }
    println!(
        "\nMPI_Barrier mean µs and MPI_Ibarrier overlap (OSU), {} iterations; on one host one \
         emulated NIC per process, across namespaces one daemon and one process each:\n",
        args.iterations
    );
    println!(
        "| hosts | processes | barrier | MPI_Barrier µs | MPI_Ibarrier µs | overlap % | \
         in MPI_Ibarrier µs | in MPI_Wait µs | NIC threads' CPU ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut csv = String::from(
        "hosts,processes,barrier,barrier_us,ibarrier_us,overlap_pct,post_us,wait_us,nic_cpu_ms\n",
    );
    for m in &results {
        println!("| {} |", m.cells(1, 0).join(" | "));
        csv.push_str(&m.cells(2, 1).join(","));
        csv.push('\n');
    }
    println!(
        "\n(overlap: the time of t_total - t_compute is the time in MPI_Ibarrier plus the time \
         in MPI_Wait; where the emulated NIC has no core of its own, its work runs in the call \
         that wakes it. NIC threads' CPU: what the one-host daemon's NIC threads spent over the \
         whole run, both loops and their warm-up)"
    );
    let path = out.join("bench-mpi.csv");
    std::fs::write(&path, csv)?;
    println!("\nwrote {}", path.display());
    let svg = out.join("bench-mpi.svg");
    barrier_figure(&results)?.write_svg(&svg)?;
    println!("wrote {}", svg.display());
    Ok(())
}

/// The barriers' figure: latency against processes, and Ibarrier overlap, one line per barrier
/// and hosts.
fn barrier_figure(results: &[Measurement]) -> Result<Figure> {
    let mut processes: Vec<f64> = results.iter().map(|m| m.processes as f64).collect();
    processes.sort_by(f64::total_cmp);
    processes.dedup();
    let x = Axis::log("processes").with_ticks(&processes);
    let mut latency = Panel::new("(a) MPI_Barrier", x.clone(), Axis::log("µs per barrier"));
    let mut overlap = Panel::new(
        "(b) MPI_Ibarrier overlap (OSU)",
        x,
        Axis::linear("overlap (%)").including(0.0).including(100.0),
    );
    let mut lines: Vec<(&str, bool)> = Vec::new();
    for m in results {
        let key = (m.barrier, m.hosts == "one host");
        if !lines.contains(&key) {
            lines.push(key);
        }
    }
    // One colour per barrier, whatever the hosts (the stroke tells those apart).
    let mut names: Vec<&str> = Vec::new();
    for (barrier, one_host) in lines {
        let colour = match names.iter().position(|n| *n == barrier) {
            Some(i) => i,
            None => {
                names.push(barrier);
                names.len() - 1
            }
        };
        let stroke = if one_host {
            Stroke::Solid
        } else {
            Stroke::Dashed
        };
        let mut a = Series::new(barrier, Colour::Palette(colour), stroke);
        let mut b = Series::new(barrier, Colour::Palette(colour), stroke);
        for m in results
            .iter()
            .filter(|m| m.barrier == barrier && (m.hosts == "one host") == one_host)
        {
            a.point(m.processes as f64, m.barrier_us.max(0.01));
            b.point(m.processes as f64, m.overlap_pct);
        }
        latency.series.push(a);
        overlap.series.push(b);
    }
    latency
        .note(Stroke::Solid, "one host")
        .note(Stroke::Dashed, "across namespaces");
    Ok(Figure {
        title: "MPI_Barrier and MPI_Ibarrier: coll/nicbar and Open MPI's own".into(),
        panels: vec![latency, overlap],
    })
}

/// One data collective's measurement.
struct CollectiveMeasurement {
    served_by: &'static str,
    processes: usize,
    collective: String,
    bytes: usize,
    us: f64,
}

/// The collectives `coll_bench` times, by the names it takes.
const BENCHED_COLLECTIVES: [&str; 8] = [
    "bcast",
    "scatter",
    "gather",
    "scatterv",
    "gatherv",
    "alltoall",
    "alltoallv",
    "allreduce",
];

/// The data collectives over sizes and process counts, the component beside Open MPI over
/// shared memory and TCP: bench-mpi-coll.csv, a table, and bench-mpi-coll.svg.
fn bench_collectives(
    args: &BenchArgs,
    prefix: &Path,
    components: &Path,
    programs: &Path,
    out: &Path,
) -> Result<()> {
    if let Some(unknown) = args
        .collectives
        .iter()
        .find(|name| !BENCHED_COLLECTIVES.contains(&name.as_str()))
    {
        return Err(format!(
            "--collectives: no collective {unknown:?} ({})",
            BENCHED_COLLECTIVES.join(", ")
        )
        .into());
    }
    let (process_counts, bytes, budget) = if args.quick {
        (vec![2, 4, 8], vec![8, 4096, 65536, 1 << 20], 100)
    } else {
        (
            args.collective_sizes.clone(),
            args.bytes.clone(),
            args.budget_ms,
        )
    };
    let largest = process_counts.iter().copied().max().unwrap_or(1);
    let daemon = Daemon::start(
        &prefix.join("bin/nicctl"),
        &scratch().join("run").join("bench-coll"),
        largest,
        &args.engine.daemon_args(),
    )?;
    println!(
        "one-host daemon: {largest} units, {}",
        args.engine.describe()
    );
    // (Packets between NICs of one daemon carry no authentication code: they never leave its
    // memory. What the code costs shows across namespaces, where packets go over UDP.)
    let sizes: Vec<String> = bytes.iter().map(usize::to_string).collect();
    let mut results = Vec::new();
    for &processes in &process_counts {
        for (served_by, priority, transport, socket) in [
            ("nicbar", 100, Transport::SharedMemory, &daemon.socket),
            ("Open MPI shm", -1, Transport::SharedMemory, &daemon.socket),
            ("Open MPI TCP lo", -1, Transport::Tcp, &daemon.socket),
        ] {
            println!("\n-- data collectives, {served_by}, {processes} processes");
            let mut command = mpirun(components, socket, processes, priority, transport)?;
            // The component's allreduce over messages is off by default; what it costs is
            // measured here.
            command
                .args(["--mca", "mpi_yield_when_idle", "1"])
                .args(["--mca", "coll_nicbar_allreduce_algorithm", "0"])
                .arg(programs.join("coll_bench"))
                .arg(sizes.join(","))
                .arg(budget.to_string())
                .arg(ALLTOALL_LIMIT.to_string());
            if !args.collectives.is_empty() {
                command.arg(args.collectives.join(","));
            }
            let mut command = on_row_cpus(&args.engine, command, priority)?;
            let stopped = (priority < 0).then(|| daemon.stopped()).transpose()?;
            let (text, ok) = run_row(
                &mut command,
                Duration::from_secs(1800),
                priority < 0,
                &format!("{served_by} at {processes} processes"),
                |text| !parse_collective_results(text).is_empty(),
            )?;
            drop(stopped);
            let lines = parse_collective_results(&text);
            if !ok || lines.is_empty() {
                return Err(format!("{served_by} at {processes} processes gave no result").into());
            }
            for (collective, bytes, us) in lines {
                results.push(CollectiveMeasurement {
                    served_by,
                    processes,
                    collective,
                    bytes,
                    us,
                });
            }
        }
    }
    drop(daemon);
    println!(
        "\nData collectives, mean µs (the slowest rank), back-to-back with the root rotating; one \
         emulated NIC per process; ratio = Open MPI / nicbar (above 1: the component wins):\n"
    );
    println!(
        "| collective | processes | bytes | nicbar µs | Open MPI shm µs | Open MPI TCP µs | shm / nicbar | TCP / nicbar |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut csv = String::from("processes,served_by,collective,bytes,us\n");
    for m in &results {
        csv.push_str(&format!(
            "{},{},{},{},{:.2}\n",
            m.processes, m.served_by, m.collective, m.bytes, m.us
        ));
    }
    let find = |served_by: &str, processes: usize, collective: &str, bytes: usize| {
        results
            .iter()
            .find(|m| {
                m.served_by == served_by
                    && m.processes == processes
                    && m.collective == collective
                    && m.bytes == bytes
            })
            .map(|m| m.us)
    };
    for m in results.iter().filter(|m| m.served_by == "nicbar") {
        let shm = find("Open MPI shm", m.processes, &m.collective, m.bytes);
        let tcp = find("Open MPI TCP lo", m.processes, &m.collective, m.bytes);
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        let ratio = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{:.2}", v / m.us));
        println!(
            "| {} | {} | {} | {:.1} | {} | {} | {} | {} |",
            m.collective,
            m.processes,
            m.bytes,
            m.us,
            cell(shm),
            cell(tcp),
            ratio(shm),
            ratio(tcp)
        );
    }
    let path = out.join("bench-mpi-coll.csv");
    std::fs::write(&path, csv)?;
    println!("\nwrote {}", path.display());
    let svg = out.join("bench-mpi-coll.svg");
    collectives_figure(&results, largest)?.write_svg(&svg)?;
    println!("wrote {}", svg.display());
    Ok(())
}

/// Draws bench-mpi.svg and bench-mpi-coll.svg from the CSVs in `out`, those that are there.
fn replot_collectives(out: &Path) -> Result<()> {
    let barriers = out.join("bench-mpi.csv");
    if barriers.exists() {
        let text = std::fs::read_to_string(&barriers)?;
        let mut results = Vec::new();
        for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
            let fields: Vec<&str> = line.split(',').collect();
            // Rows of 6 fields come from before the post and wait columns, of 8 from before the
            // NIC threads' CPU.
            let (hosts, processes, barrier, barrier_us, ibarrier_us, overlap_pct, post, wait, cpu) =
                match fields[..] {
                    [a, b, c, d, e, f] => (a, b, c, d, e, f, "0", "0", ""),
                    [a, b, c, d, e, f, g, h] => (a, b, c, d, e, f, g, h, ""),
                    [a, b, c, d, e, f, g, h, i] => (a, b, c, d, e, f, g, h, i),
                    _ => {
                        return Err(format!(
                            "{}: a row of {} fields",
                            barriers.display(),
                            fields.len()
                        )
                        .into());
                    }
                };
            let barrier = [
                "nicbar (NIC)",
                "Open MPI shm",
                "Open MPI TCP lo",
                "Open MPI TCP",
            ]
            .into_iter()
            .find(|name| *name == barrier)
            .ok_or_else(|| format!("{}: unknown barrier {barrier}", barriers.display()))?;
            results.push(Measurement {
                barrier,
                hosts: hosts.to_owned(),
                processes: processes.parse()?,
                barrier_us: barrier_us.parse()?,
                ibarrier_us: ibarrier_us.parse()?,
                overlap_pct: overlap_pct.parse()?,
                post_us: post.parse()?,
                wait_us: wait.parse()?,
                nic_cpu_ms: (!cpu.is_empty()).then(|| cpu.parse()).transpose()?,
            });
        }
        let svg = out.join("bench-mpi.svg");
        barrier_figure(&results)?.write_svg(&svg)?;
        println!("wrote {}", svg.display());
    }
    let path = out.join("bench-mpi-coll.csv");
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|error| format!("reading {}: {error}", path.display()))?;
    let mut results = Vec::new();
    for line in text.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let [processes, served_by, collective, bytes, us] = fields[..] else {
            return Err(format!(
                "{}: a row of {} fields: {line}",
                path.display(),
                fields.len()
            )
            .into());
        };
        let served_by = ["nicbar", "Open MPI shm", "Open MPI TCP lo"]
            .into_iter()
            .find(|name| *name == served_by)
            .ok_or_else(|| format!("{}: unknown series {served_by}", path.display()))?;
        results.push(CollectiveMeasurement {
            served_by,
            processes: processes.parse()?,
            collective: collective.to_owned(),
            bytes: bytes.parse()?,
            us: us.parse()?,
        });
    }
    let largest = results.iter().map(|m| m.processes).max().ok_or("no rows")?;
    let svg = out.join("bench-mpi-coll.svg");
    collectives_figure(&results, largest)?.write_svg(&svg)?;
    println!("wrote {}", svg.display());
    Ok(())
}

/// CollGM's figures in shape: latency against message size, a panel per collective, at the
/// largest process count; the component solid (with packets authenticated, and not), Open MPI
/// over shared memory dashed, over TCP dotted.
fn collectives_figure(results: &[CollectiveMeasurement], processes: usize) -> Result<Figure> {
    let mut panels = Vec::new();
    for (letter, collective) in ["bcast", "scatter", "gather", "alltoall", "allreduce"]
        .iter()
        .enumerate()
    {
        let mut sizes: Vec<f64> = results
            .iter()
            .filter(|m| m.collective == *collective)
            .map(|m| m.bytes.max(1) as f64)
            .collect();
        sizes.sort_by(f64::total_cmp);
        sizes.dedup();
        let mut panel = Panel::new(
            &format!(
                "({}) MPI_{}{} at {processes} processes",
                (b'a' + letter as u8) as char,
                collective[..1].to_uppercase(),
                &collective[1..]
            ),
            // Every other size when there are many, so that the labels do not run together.
            Axis::log("bytes per rank").with_ticks(&if sizes.len() > 5 {
                sizes.iter().copied().step_by(2).collect::<Vec<_>>()
            } else {
                sizes.clone()
            }),
            Axis::log("µs per collective"),
        );
        for (i, (served_by, stroke)) in [
            ("nicbar", Stroke::Solid),
            ("Open MPI shm", Stroke::Dashed),
            ("Open MPI TCP lo", Stroke::Dotted),
        ]
        .into_iter()
        .enumerate()
        {
            let mut series = Series::new(served_by, Colour::Palette(i), stroke);
            for m in results.iter().filter(|m| {
                m.served_by == served_by && m.processes == processes && m.collective == *collective
            }) {
                series.point(m.bytes.max(1) as f64, m.us.max(0.01));
            }
            if !series.points.is_empty() {
                panel.series.push(series);
            }
        }
        if !panel.series.is_empty() {
            panels.push(panel);
        }
    }
    if panels.is_empty() {
        return Err("no data collective was measured".into());
    }
    Ok(Figure {
        title: "Data collectives: coll/nicbar over the emulated NIC and Open MPI's own".into(),
        panels,
    })
}

/// The collective benchmark's `result` lines: (collective, bytes, µs).
pub(super) fn parse_collective_results(text: &str) -> Vec<(String, usize, f64)> {
    text.lines()
        .filter(|line| line.trim_start().starts_with("result collective="))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(name))
                    .map(str::to_owned)
            };
            Some((
                field("collective=")?,
                field("bytes=")?.parse().ok()?,
                field("us=")?.parse().ok()?,
            ))
        })
        .collect()
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

/// Runs one row of a table under `mpirun`: its output, and whether it exited well. A row of
/// Open MPI's own collectives (`reference`) that fails or gives no result (`has_result` says)
/// runs once more, saying so: it measures Open MPI, not nicbar, and one in a couple of hundred
/// has ended with no result and no word on a loaded 2-core host. A row through the component
/// runs once: its failure is nicbar's to report.
fn run_row(
    command: &mut Command,
    limit: Duration,
    reference: bool,
    what: &str,
    has_result: impl Fn(&str) -> bool,
) -> Result<(String, bool)> {
    let (text, ok) = run_captured(command, limit)?;
    if !reference || (ok && has_result(&text)) {
        return Ok((text, ok));
    }
    println!("{what} (Open MPI's own collectives) gave no result: running it once more");
    run_captured(command, limit)
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
    let daemons = || -> Vec<u32> {
        (0..hosts)
            .filter_map(|index| {
                let pidfile = run_dir.join(index.to_string()).join("daemon.pid");
                std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()
            })
            .collect()
    };
    let stop = || {
        for pid in daemons() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
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
        let stopped = match (priority < 0).then(|| crate::command::Stopped::new(daemons())) {
            Some(Err(error)) => {
                stop();
                return Err(error);
            }
            stopped => stopped,
        };
        let measured = run_captured(&mut command, Duration::from_secs(600));
        drop(stopped);
        let measured = measured
            .ok()
            .filter(|(text, _)| priority < 0 || barriers_through_nic(text) > 0)
            .and_then(|(text, ok)| parse_result(&text).filter(|_| ok));
        let Some(result) = measured else {
            stop();
            return Err(format!("{barrier} across {hosts} namespaces gave no result").into());
        };
        results.push(Measurement::new(
            barrier,
            format!("{hosts} namespaces"),
            hosts,
            result,
        ));
    }
    stop();
    Ok(results)
}

/// The benchmark program's `result` line.
pub(super) fn parse_result(text: &str) -> Option<BarrierResult> {
    let line = text.lines().find(|l| l.starts_with("result "))?;
    let field = |name: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    Some(BarrierResult {
        barrier_us: field("barrier_us=")?,
        ibarrier_us: field("ibarrier_pure_us=")?,
        overlap_pct: field("overlap_pct=")?,
        post_us: field("post_us=")?,
        wait_us: field("wait_us=")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command that fails the first time it runs in `dir` and prints a result after.
    fn fails_once(dir: &Path) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(format!(
            "if [ -e {0}/ran ]; then echo result; else touch {0}/ran; exit 1; fi",
            dir.display()
        ));
        command
    }

    #[test]
    fn a_reference_row_that_fails_runs_once_more_and_a_components_row_does_not() {
        let dir = target_dir()
            .join("xtask-tests")
            .join(format!("run-row-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let limit = Duration::from_secs(30);
        let has_result = |text: &str| text.contains("result");

        let (text, ok) = run_row(&mut fails_once(&dir), limit, true, "ref", has_result).unwrap();
        assert!(ok && has_result(&text), "the second run's output: {text:?}");

        std::fs::remove_file(dir.join("ran")).unwrap();
        let (_, ok) = run_row(&mut fails_once(&dir), limit, false, "nicbar", has_result).unwrap();
        assert!(!ok, "a row through the component ran again");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
