//! `cargo xtask tune`: the data collectives' selection map measured on this machine (CollGM's
//! Figures 7, 9 and 11, as our own). Every algorithm of each collective is forced in turn
//! through the component's MCA parameter and timed by `coll_bench` over communicator and message
//! sizes, the algorithms' runs interleaved over repetitions; the median of each point decides.
//! Writes the map the library reads (the `nicbar-coll-map 1` format of
//! `host-lib/src/coll/map.rs`), prints it as a table and draws it as a picture.

use super::*;
use crate::mpi::bench::parse_collective_results;
use crate::plot::{Axis, Cell, Colour, Figure, Panel};

/// Options of `cargo xtask tune`.
#[derive(ClapArgs)]
pub(crate) struct TuneArgs {
    /// Communicator sizes (processes) to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8])]
    sizes: Vec<usize>,
    /// Also measure 16 processes (slow where the machine has few cores).
    #[arg(long)]
    large: bool,
    /// Message sizes, bytes (the broadcast's and the allreduce's message; the scatter's,
    /// gather's and all-to-all's block per rank).
    #[arg(long, value_delimiter = ',', default_values_t = [8, 64, 512, 4096, 32768, 262144, 1048576])]
    bytes: Vec<usize>,
    /// The collectives to tune.
    #[arg(long, value_delimiter = ',', default_values_t = ["bcast".to_owned(), "scatter".to_owned(), "gather".to_owned(), "alltoall".to_owned(), "allreduce".to_owned()])]
    collectives: Vec<String>,
    /// Time to spend on each point of one run, in ms (at least 3 iterations each).
    #[arg(long, default_value_t = 60)]
    budget_ms: u64,
    /// Runs of every algorithm, interleaved with the other algorithms' (the median decides).
    #[arg(long, default_value_t = 3)]
    repetitions: usize,
    /// All-to-alls whose whole exchange (block x processes x processes) passes this many MiB
    /// are not measured (the map takes the largest measured block's winner above).
    #[arg(long, default_value_t = 16)]
    alltoall_limit_mib: usize,
    /// Fewer points: 8 B, 1 KiB, 64 KiB and 1 MiB, 30 ms each, 2 repetitions.
    #[arg(long)]
    quick: bool,
    /// Where to write coll-map, tune.csv and tune.svg.
    #[arg(long, default_value = "target")]
    out: PathBuf,
    /// Do not install the map where the library reads it ($NICBAR_COLL_MAP, else
    /// $XDG_CONFIG_HOME/nicbar/coll-map, else ~/.config/nicbar/coll-map): --out only.
    #[arg(long)]
    no_install: bool,
    /// Measure nothing: the map, table and picture again from tune.csv in --out.
    #[arg(long)]
    replot: bool,
}

/// A collective's algorithms: the MCA parameter's number and the map's name.
type Algorithms = &'static [(i32, &'static str)];

/// The collectives, their MCA parameter, and their algorithms by the parameter's number and the
/// map's name.
const COLLECTIVES: [(&str, &str, Algorithms); 5] = [
    (
        "bcast",
        "coll_nicbar_bcast_algorithm",
        &[
            (1, "linear"),
            (2, "binomial"),
            (3, "binary"),
            (4, "split-binary"),
            (5, "pipeline"),
            (6, "nic"),
        ],
    ),
    (
        "scatter",
        "coll_nicbar_scatter_algorithm",
        &[(1, "flat"), (2, "binomial")],
    ),
    (
        "gather",
        "coll_nicbar_gather_algorithm",
        &[(1, "flat"), (2, "binomial")],
    ),
    (
        "alltoall",
        "coll_nicbar_alltoall_algorithm",
        &[(1, "linear"), (2, "pairwise"), (3, "bruck")],
    ),
    (
        "allreduce",
        "coll_nicbar_allreduce_algorithm",
        &[(1, "recursive-doubling"), (2, "rabenseifner"), (3, "ring")],
    ),
];

/// The most bytes the NIC's broadcast (`nic`) carries: it is measured at those sizes only (the
/// library hands longer messages to the choice by size).
const NIC_BROADCAST_MAX: usize = 32;

/// The most bytes the NIC combines: an allreduce over messages is measured above it only (the
/// component combines shorter vectors in the NIC whatever algorithm is forced).
const NIC_REDUCE_MAX: usize = 32;

/// The message sizes `algorithm` of `collective` is measured at, of `sizes`.
fn sizes_for(collective: &str, algorithm: &str, sizes: &[usize]) -> Vec<usize> {
    sizes
        .iter()
        .copied()
        .filter(|&bytes| collective != "bcast" || algorithm != "nic" || bytes <= NIC_BROADCAST_MAX)
        .filter(|&bytes| collective != "allreduce" || bytes > NIC_REDUCE_MAX)
        .collect()
}

/// The map file's format line.
const MAP_FORMAT: &str = "nicbar-coll-map 1";

/// One point's samples: (collective, processes, algorithm, bytes) and the µs of each run.
#[derive(Clone, Debug, PartialEq)]
struct Point {
    collective: String,
    processes: usize,
    algorithm: String,
    bytes: usize,
    samples: Vec<f64>,
}

impl Point {
    fn median(&self) -> f64 {
        let mut sorted = self.samples.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        if n == 0 {
            f64::NAN
        } else if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        }
    }
}

/// Runs `cargo xtask tune`.
pub(crate) fn run_tune(args: TuneArgs) -> Result<()> {
    let out = workspace_root().join(&args.out);
    std::fs::create_dir_all(&out)?;
    let csv_path = out.join("tune.csv");
    let points = if args.replot {
        read_csv(
            &std::fs::read_to_string(&csv_path)
                .map_err(|error| format!("reading {}: {error}", csv_path.display()))?,
        )?
    } else {
        let points = measure(&args)?;
        std::fs::write(&csv_path, to_csv(&points))?;
        println!("wrote {}", csv_path.display());
        points
    };
    let winners = winners(&points);
    print_table(&points, &winners);
    let map = map_text(
        &winners,
        &format!(
            "measured by cargo xtask tune on {} ({} cores): the fastest median per point",
            host_name(),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        ),
    );
    println!("\nThe selection map:\n\n{map}");
    let map_path = out.join("coll-map");
    std::fs::write(&map_path, &map)?;
    println!("wrote {}", map_path.display());
    let svg = out.join("tune.svg");
    map_figure(&winners)?.write_svg(&svg)?;
    println!("wrote {}", svg.display());
    if !args.no_install && !args.replot {
        match install_path() {
            Some(path) => {
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                std::fs::write(&path, &map)
                    .map_err(|error| format!("writing {}: {error}", path.display()))?;
                println!(
                    "installed {} (the library reads it from there)",
                    path.display()
                );
            }
            None => {
                println!("NICBAR_COLL_MAP is off and no home is known: the map is not installed")
            }
        }
    }
    Ok(())
}

/// This machine's name, for the map's comment.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "this host".to_owned())
}

/// Where the library reads the map by default (the rules of host-lib/src/coll/map.rs).
fn install_path() -> Option<PathBuf> {
    if let Some(value) = std::env::var_os("NICBAR_COLL_MAP") {
        if value.is_empty() || value == "off" {
            return None;
        }
        return Some(PathBuf::from(value));
    }
    if let Some(config) = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from)
        && config.is_absolute()
    {
        return Some(config.join("nicbar").join("coll-map"));
    }
    let home = PathBuf::from(std::env::var_os("HOME")?);
    home.is_absolute()
        .then(|| home.join(".config").join("nicbar").join("coll-map"))
}

/// Measures every algorithm of the chosen collectives at every size.
fn measure(args: &TuneArgs) -> Result<Vec<Point>> {
    let mut process_counts = args.sizes.clone();
    if args.large && !process_counts.contains(&16) {
        process_counts.push(16);
    }
    process_counts.sort_unstable();
    process_counts.dedup();
    if process_counts.iter().any(|&p| p < 2) {
        return Err("--sizes: a communicator of the map has at least 2 processes".into());
    }
    let (bytes, budget, repetitions) = if args.quick {
        (vec![8, 1024, 65536, 1 << 20], 30, 2)
    } else {
        (args.bytes.clone(), args.budget_ms, args.repetitions.max(1))
    };
    let collectives: Vec<_> = COLLECTIVES
        .iter()
        .filter(|(name, ..)| args.collectives.iter().any(|c| c == name))
        .collect();
    if let Some(unknown) = args
        .collectives
        .iter()
        .find(|c| !COLLECTIVES.iter().any(|(name, ..)| name == c))
    {
        return Err(format!(
            "--collectives: no collective {unknown:?} (bcast, scatter, gather, alltoall, allreduce)"
        )
        .into());
    }
    ensure_packages(true)?;
    let prefix = scratch().join("prefix");
    let component = build(&prefix, "capi")?;
    let components = component.parent().ok_or("no directory")?.to_owned();
    let programs = scratch().join("programs");
    compile_programs(&programs)?;
    let limit = args.alltoall_limit_mib << 20;
    let runs: Vec<(&str, &str, i32, &str)> = collectives
        .iter()
        .flat_map(|(collective, parameter, algorithms)| {
            algorithms
                .iter()
                .map(move |(id, name)| (*collective, *parameter, *id, *name))
        })
        .collect();
    let mut points: Vec<Point> = Vec::new();
    let started = Instant::now();
    for &processes in &process_counts {
        let daemon = Daemon::start(
            &prefix.join("bin/nicctl"),
            &scratch().join("run").join("tune"),
            processes,
            &[],
        )?;
        for repetition in 0..repetitions {
            // Interleaved: each repetition runs every algorithm once, from another one first.
            for index in 0..runs.len() {
                let (collective, parameter, id, name) =
                    runs[(index + repetition * runs.len() / repetitions) % runs.len()];
                let sizes: Vec<String> = sizes_for(collective, name, &bytes)
                    .iter()
                    .map(usize::to_string)
                    .collect();
                if sizes.is_empty() {
                    continue;
                }
                println!(
                    "\n-- tune: {collective} {name} at {processes} processes, repetition {} of \
                     {repetitions} ({:.0} s so far)",
                    repetition + 1,
                    started.elapsed().as_secs_f64()
                );
                let mut command = mpirun(
                    &components,
                    &daemon.socket,
                    processes,
                    100,
                    Transport::SharedMemory,
                )?;
                command
                    .args(["--mca", "mpi_yield_when_idle", "1"])
                    .args(["--mca", parameter, &id.to_string()])
                    .arg(programs.join("coll_bench"))
                    .arg(sizes.join(","))
                    .arg(budget.to_string())
                    .arg(limit.to_string())
                    .arg(collective);
                let (text, ok) = run_captured(&mut command, Duration::from_secs(900))?;
                let results = parse_collective_results(&text);
                if !ok || results.is_empty() {
                    return Err(format!(
                        "{collective} {name} at {processes} processes gave no result"
                    )
                    .into());
                }
                expect_data_over_nic(&text, 1)?;
                for (measured, bytes, us) in results {
                    if measured != collective {
                        continue;
                    }
                    match points.iter_mut().find(|p| {
                        p.collective == collective
                            && p.processes == processes
                            && p.algorithm == name
                            && p.bytes == bytes
                    }) {
                        Some(point) => point.samples.push(us),
                        None => points.push(Point {
                            collective: collective.to_owned(),
                            processes,
                            algorithm: name.to_owned(),
                            bytes,
                            samples: vec![us],
                        }),
                    }
                }
            }
        }
        drop(daemon);
    }
    println!(
        "\nmeasured {} points in {:.0} s",
        points.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(points)
}

/// tune.csv: one row per sample.
fn to_csv(points: &[Point]) -> String {
    let mut csv = String::from("collective,processes,algorithm,bytes,repetition,us\n");
    for p in points {
        for (repetition, us) in p.samples.iter().enumerate() {
            csv.push_str(&format!(
                "{},{},{},{},{},{:.2}\n",
                p.collective, p.processes, p.algorithm, p.bytes, repetition, us
            ));
        }
    }
    csv
}

fn read_csv(text: &str) -> Result<Vec<Point>> {
    let mut points: Vec<Point> = Vec::new();
    for (index, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || format!("tune.csv line {}: {line:?}", index + 1);
        let [collective, processes, algorithm, bytes, _, us] =
            line.split(',').collect::<Vec<_>>()[..]
        else {
            return Err(bad().into());
        };
        let (processes, bytes, us): (usize, usize, f64) = (
            processes.parse().map_err(|_| bad())?,
            bytes.parse().map_err(|_| bad())?,
            us.parse().map_err(|_| bad())?,
        );
        match points.iter_mut().find(|p| {
            p.collective == collective
                && p.processes == processes
                && p.algorithm == algorithm
                && p.bytes == bytes
        }) {
            Some(point) => point.samples.push(us),
            None => points.push(Point {
                collective: collective.to_owned(),
                processes,
                algorithm: algorithm.to_owned(),
                bytes,
                samples: vec![us],
            }),
        }
    }
    Ok(points)
}

/// The fastest algorithm of each (collective, processes, bytes) by median, and its median.
#[derive(Clone, Debug, PartialEq)]
struct Winner {
    collective: String,
    processes: usize,
    bytes: usize,
    algorithm: String,
    us: f64,
}

fn winners(points: &[Point]) -> Vec<Winner> {
    let mut winners: Vec<Winner> = Vec::new();
    for p in points {
        let us = p.median();
        if !us.is_finite() {
            continue;
        }
        match winners.iter_mut().find(|w| {
            w.collective == p.collective && w.processes == p.processes && w.bytes == p.bytes
        }) {
            Some(w) if us < w.us => {
                w.algorithm.clone_from(&p.algorithm);
                w.us = us;
            }
            Some(_) => {}
            None => winners.push(Winner {
                collective: p.collective.clone(),
                processes: p.processes,
                bytes: p.bytes,
                algorithm: p.algorithm.clone(),
                us,
            }),
        }
    }
    let order = |c: &str| COLLECTIVES.iter().position(|(n, ..)| *n == c);
    winners.sort_by(|a, b| {
        (order(&a.collective), a.processes, a.bytes).cmp(&(
            order(&b.collective),
            b.processes,
            b.bytes,
        ))
    });
    winners
}

/// The map's text: for each collective and measured communicator size, the winner at each
/// measured message size covers from that size up to the next measured one (the smallest from
/// 0, the largest to `max`), and each size's entries cover the communicator sizes up to the
/// next measured one (the largest only itself); neighbouring ranges of one algorithm merge.
fn map_text(winners: &[Winner], comment: &str) -> String {
    let mut text = String::new();
    for line in comment.lines() {
        text.push_str(&format!("# {line}\n"));
    }
    text.push_str(MAP_FORMAT);
    text.push('\n');
    for (collective, ..) in COLLECTIVES {
        let mine: Vec<&Winner> = winners
            .iter()
            .filter(|w| w.collective == collective)
            .collect();
        let mut processes: Vec<usize> = mine.iter().map(|w| w.processes).collect();
        processes.dedup();
        for (i, &p) in processes.iter().enumerate() {
            let to = processes.get(i + 1).map_or(p, |next| next - 1);
            let row: Vec<&&Winner> = mine.iter().filter(|w| w.processes == p).collect();
            let mut ranges: Vec<(usize, Option<usize>, &str)> = Vec::new();
            for (j, w) in row.iter().enumerate() {
                let from = if j == 0 { 0 } else { w.bytes };
                let end = row.get(j + 1).map(|next| next.bytes - 1);
                match ranges.last_mut() {
                    Some(last) if last.2 == w.algorithm => last.1 = end,
                    _ => ranges.push((from, end, &w.algorithm)),
                }
            }
            for (from, end, algorithm) in ranges {
                let end = end.map_or("max".to_owned(), |e| e.to_string());
                text.push_str(&format!("{collective} {p}-{to} {from}-{end} {algorithm}\n"));
            }
        }
    }
    text
}

/// The measured medians and each point's winner, as a table.
fn print_table(points: &[Point], winners: &[Winner]) {
    println!(
        "\nData collectives over the emulated NIC, median µs of the runs (each the mean of a \
         back-to-back loop, the slowest rank), every algorithm forced in turn; * the fastest:\n"
    );
    for (collective, _, algorithms) in COLLECTIVES {
        let present: Vec<&str> = algorithms
            .iter()
            .map(|(_, name)| *name)
            .filter(|name| {
                points
                    .iter()
                    .any(|p| p.collective == collective && p.algorithm == *name)
            })
            .collect();
        if present.is_empty() {
            continue;
        }
        println!(
            "| {collective} | processes | bytes | {} | fastest |",
            present.join(" | ")
        );
        println!("|---|---|---|{}---|", "---|".repeat(present.len()));
        for w in winners.iter().filter(|w| w.collective == collective) {
            let cells: Vec<String> = present
                .iter()
                .map(|name| {
                    points
                        .iter()
                        .find(|p| {
                            p.collective == collective
                                && p.processes == w.processes
                                && p.bytes == w.bytes
                                && p.algorithm == *name
                        })
                        .map_or("-".to_owned(), |p| {
                            format!(
                                "{:.1}{}",
                                p.median(),
                                if *name == w.algorithm { "*" } else { "" }
                            )
                        })
                })
                .collect();
            println!(
                "| | {} | {} | {} | {} |",
                w.processes,
                w.bytes,
                cells.join(" | "),
                w.algorithm
            );
        }
        println!();
    }
}

/// CollGM's selection maps in shape: a panel per collective, message size on x, communicator
/// size on y, each measured point's cell in its winner's colour.
fn map_figure(winners: &[Winner]) -> Result<Figure> {
    let mut panels = Vec::new();
    for (letter, (collective, _, algorithms)) in COLLECTIVES.iter().enumerate() {
        let mine: Vec<&Winner> = winners
            .iter()
            .filter(|w| w.collective == *collective)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let mut bytes: Vec<usize> = mine.iter().map(|w| w.bytes.max(1)).collect();
        bytes.sort_unstable();
        bytes.dedup();
        let mut processes: Vec<usize> = mine.iter().map(|w| w.processes).collect();
        processes.sort_unstable();
        processes.dedup();
        // A cell reaches halfway (on the log scale) to its neighbours, as far again at the ends.
        let bounds = |values: &[usize], index: usize| -> (f64, f64) {
            let v = values[index] as f64;
            let mid = |a: usize, b: usize| (a as f64 * b as f64).sqrt();
            let lo = if index == 0 {
                values
                    .get(1)
                    .map_or(v / 2f64.sqrt(), |&n| v * v / mid(values[0], n))
            } else {
                mid(values[index - 1], values[index])
            };
            let hi = if index + 1 == values.len() {
                if index == 0 {
                    v * 2f64.sqrt()
                } else {
                    v * v / mid(values[index - 1], values[index])
                }
            } else {
                mid(values[index], values[index + 1])
            };
            (lo, hi)
        };
        let as_f64 = |values: &[usize]| values.iter().map(|&v| v as f64).collect::<Vec<_>>();
        let mut panel = Panel::new(
            &format!(
                "({}) MPI_{}{}",
                (b'a' + letter as u8) as char,
                collective[..1].to_uppercase(),
                &collective[1..]
            ),
            Axis::log("message size (bytes per rank)").with_ticks(&as_f64(&bytes)),
            Axis::log("communicator size (processes)").with_ticks(&as_f64(&processes)),
        );
        for w in &mine {
            let x = bytes.iter().position(|&b| b == w.bytes.max(1)).unwrap_or(0);
            let y = processes
                .iter()
                .position(|&p| p == w.processes)
                .unwrap_or(0);
            let colour = algorithms
                .iter()
                .position(|(_, name)| *name == w.algorithm)
                .unwrap_or(0);
            panel.cells.push(Cell {
                x: bounds(&bytes, x),
                y: bounds(&processes, y),
                colour: Colour::Palette(colour),
                label: w.algorithm.clone(),
            });
        }
        panels.push(panel);
    }
    if panels.is_empty() {
        return Err("nothing was measured".into());
    }
    Ok(Figure {
        title: "Selection maps: the fastest algorithm of each collective on this machine".into(),
        panels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nics_broadcast_is_measured_only_where_it_carries_the_message() {
        let sizes = [8, 32, 33, 1024];
        assert_eq!(sizes_for("bcast", "nic", &sizes), [8, 32]);
        assert_eq!(sizes_for("bcast", "binomial", &sizes), sizes);
        assert_eq!(sizes_for("scatter", "flat", &sizes), sizes);
        assert!(sizes_for("bcast", "nic", &[64, 4096]).is_empty());
        assert_eq!(sizes_for("allreduce", "ring", &sizes), [33, 1024]);
    }

    fn point(
        collective: &str,
        processes: usize,
        algorithm: &str,
        bytes: usize,
        us: &[f64],
    ) -> Point {
        Point {
            collective: collective.into(),
            processes,
            algorithm: algorithm.into(),
            bytes,
            samples: us.to_vec(),
        }
    }

    #[test]
    fn the_median_decides() {
        // Linear has one fast outlier; binomial's median is lower.
        let points = [
            point("bcast", 2, "linear", 8, &[1.0, 50.0, 60.0]),
            point("bcast", 2, "binomial", 8, &[40.0, 30.0, 45.0]),
        ];
        let winners = winners(&points);
        assert_eq!(winners.len(), 1);
        assert_eq!(winners[0].algorithm, "binomial");
        assert_eq!(winners[0].us, 40.0);
        assert_eq!(point("x", 2, "y", 1, &[1.0, 3.0, 2.0, 10.0]).median(), 2.5);
    }

    #[test]
    fn the_map_covers_the_sizes_between_the_measured_ones() {
        let points = [
            point("bcast", 2, "linear", 8, &[1.0]),
            point("bcast", 2, "linear", 4096, &[1.0]),
            point("bcast", 2, "binomial", 4096, &[2.0]),
            point("bcast", 2, "binomial", 65536, &[1.0]),
            point("bcast", 2, "linear", 65536, &[2.0]),
            point("bcast", 4, "binomial", 8, &[1.0]),
            point("gather", 4, "flat", 8, &[1.0]),
            point("alltoall", 8, "linear", 8, &[1.0]),
            point("alltoall", 8, "pairwise", 512, &[1.0]),
        ];
        let text = map_text(&winners(&points), "measured by cargo xtask tune");
        // The library's own test reads this text (host-lib/src/coll/map.rs, WRITTEN),
        // with the rows of a size it does not cover besides.
        assert_eq!(
            text,
            "# measured by cargo xtask tune\n\
             nicbar-coll-map 1\n\
             bcast 2-3 0-65535 linear\n\
             bcast 2-3 65536-max binomial\n\
             bcast 4-4 0-max binomial\n\
             gather 4-4 0-max flat\n\
             alltoall 8-8 0-511 linear\n\
             alltoall 8-8 512-max pairwise\n"
        );
    }

    #[test]
    fn the_csv_reads_back() {
        let points = vec![
            point("bcast", 2, "linear", 8, &[1.5, 2.25]),
            point("scatter", 4, "flat", 1024, &[3.0]),
        ];
        assert_eq!(read_csv(&to_csv(&points)).unwrap(), points);
        assert!(read_csv("header\nbcast,2,linear\n").is_err());
    }

    #[test]
    fn the_picture_has_a_panel_per_collective_measured() {
        let points = [
            point("bcast", 2, "linear", 8, &[1.0]),
            point("bcast", 4, "pipeline", 1024, &[1.0]),
            point("alltoall", 2, "bruck", 8, &[1.0]),
        ];
        let figure = map_figure(&winners(&points)).unwrap();
        assert_eq!(figure.panels.len(), 2);
        assert_eq!(figure.panels[0].cells.len(), 2);
        // Each cell's x range holds its message size, its y range its communicator size.
        let cell = &figure.panels[0].cells[1];
        assert!(cell.x.0 < 1024.0 && 1024.0 < cell.x.1, "{cell:?}");
        assert!(cell.y.0 < 4.0 && 4.0 < cell.y.1, "{cell:?}");
        assert!(figure.to_svg().is_ok());
    }
}
