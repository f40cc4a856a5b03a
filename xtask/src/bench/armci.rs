//! `cargo xtask bench armci`: the measurements of Saify, *Optimizing Collective Communication
//! Operations in ARMCI*, over the emulated NIC (the program is
//! `host-lib/armci/examples/bench_armci.rs`) — AllFence latency against K and node count, the fused
//! fence-and-barrier against AllFence + barrier, lock and unlock under contention, each beside its
//! baseline in one run; table, CSV, and a figure in the shape of the thesis's. And a put
//! ping-pong (ARMCI_Put_flag) from 1 byte to 1 MiB beside GM's message ping-pong in the same job:
//! `bench-armci-pingpong.csv` and `.svg` (latency and bandwidth against size).

use std::path::PathBuf;

use clap::Args as ClapArgs;

use super::{Csv, draw};
use crate::Result;
use crate::command::{cargo, run};
use crate::plot::{Axis, Colour, Figure, Panel, Series, Stroke};

/// Options of `cargo xtask bench armci`.
#[derive(ClapArgs)]
pub(crate) struct Args {
    /// Node counts (one rank and one emulated NIC per node).
    #[arg(long, value_delimiter = ',', default_values_t = [2, 4, 8])]
    sizes: Vec<usize>,
    /// Timed iterations of each measurement (after a tenth as many to warm up).
    #[arg(long, default_value_t = 300)]
    iterations: usize,
    /// Bytes each rank puts to every other rank before each timed barrier.
    #[arg(long, default_value_t = 100)]
    put_bytes: usize,
    /// Where to write bench-armci.csv and bench-armci.svg.
    #[arg(long, default_value = "target")]
    out: PathBuf,
    /// Only draw OUT/bench-armci.svg from OUT/bench-armci.csv, without measuring.
    #[arg(long)]
    plot_only: bool,
    /// The ping-pong's largest size in bytes (each power of two from 1 up to it).
    #[arg(long, default_value_t = 1 << 20)]
    pingpong_max: usize,
    /// Round trips of each ping-pong size up to 4 KiB (fewer above, at least 10).
    #[arg(long, default_value_t = 200)]
    pingpong_iterations: usize,
    /// Run only the ping-pong.
    #[arg(long)]
    only_pingpong: bool,
}

/// Runs `cargo xtask bench armci`.
pub(crate) fn run_armci(args: Args) -> Result<()> {
    let out = crate::workspace_root().join(&args.out);
    let csv = out.join("bench-armci.csv");
    let pingpong_csv = out.join("bench-armci-pingpong.csv");
    if !args.plot_only {
        std::fs::create_dir_all(&out)?;
        let root = crate::workspace_root();
        run(cargo().current_dir(&root).args([
            "build",
            "--quiet",
            "--profile",
            "bench-fast",
            "-p",
            "nicbar-armci",
            "--example",
            "bench_armci",
        ]))?;
        let program = crate::target_dir()
            .join("bench-fast")
            .join("examples")
            .join("bench_armci");
        let sizes: Vec<String> = args.sizes.iter().map(usize::to_string).collect();
        let mut command = std::process::Command::new(program);
        command.arg("--sizes").arg(sizes.join(","));
        command.arg("--iterations").arg(args.iterations.to_string());
        command.arg("--put-bytes").arg(args.put_bytes.to_string());
        command.arg("--csv").arg(&csv);
        command.arg("--pingpong-csv").arg(&pingpong_csv);
        command
            .arg("--pingpong-max")
            .arg(args.pingpong_max.to_string());
        command
            .arg("--pingpong-iterations")
            .arg(args.pingpong_iterations.to_string());
        if args.only_pingpong {
            command.arg("--only-pingpong");
        }
        run(&mut command)?;
    }
    draw(
        &pingpong_csv,
        &out.join("bench-armci-pingpong.svg"),
        pingpong_figure,
    )?;
    if args.only_pingpong {
        return Ok(());
    }
    draw(&csv, &out.join("bench-armci.svg"), figure)
}

/// The ping-pong's figure: (a) one-way latency and (b) bandwidth against size, log-log, one
/// series per path (ARMCI's put solid, GM's messages dashed).
fn pingpong_figure(csv: &Csv) -> Result<Figure> {
    let (series, bytes, us, mb_s) = (
        csv.column("series")?,
        csv.column("bytes")?,
        csv.column("one_way_us")?,
        csv.column("bandwidth_mb_s")?,
    );
    let mut names: Vec<String> = Vec::new();
    for row in &csv.rows {
        let name = row.get(series).ok_or("a row without series")?;
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let x = Axis::log("bytes").with_ticks(&[1.0, 1024.0, 1_048_576.0]);
    let mut latency = Panel::new("(a) one-way latency (median)", x.clone(), Axis::log("µs"));
    let mut bandwidth = Panel::new("(b) bandwidth", x, Axis::log("MB/s"));
    for (i, name) in names.iter().enumerate() {
        let stroke = if name.starts_with("ARMCI") {
            Stroke::Solid
        } else {
            Stroke::Dashed
        };
        let mut on_latency = Series::new(name, Colour::Palette(i), stroke);
        let mut on_bandwidth = Series::new(name, Colour::Palette(i), stroke);
        for row in csv.rows.iter().filter(|row| row.get(series) == Some(name)) {
            let size = Csv::number(row, bytes)?.ok_or("a row without bytes")?;
            if let Some(value) = Csv::number(row, us)? {
                on_latency.point(size, value);
            }
            if let Some(value) = Csv::number(row, mb_s)? {
                on_bandwidth.point(size, value);
            }
        }
        latency.series.push(on_latency);
        bandwidth.series.push(on_bandwidth);
    }
    Ok(Figure {
        title: "ARMCI put ping-pong beside GM's messages, two ranks on the emulated NIC".into(),
        panels: vec![latency, bandwidth],
    })
}

/// One line of the figure: its measurement, variant and points.
type Line = (String, String, Vec<(f64, f64)>);

/// Three panels, the thesis's figures side by side: (a) AllFence latency against nodes, one line
/// per variant (the baseline dashed); (b) the barrier, AllFence + barrier against the fused one;
/// (c) lock (solid) and unlock (dashed) under contention, ticket against MCS.
fn figure(csv: &Csv) -> Result<Figure> {
    let (measurement, nodes, variant, us) = (
        csv.column("measurement")?,
        csv.column("nodes")?,
        csv.column("variant")?,
        csv.column("us")?,
    );
    let mut sizes: Vec<f64> = Vec::new();
    // (measurement, variant) -> points, in first-seen order.
    let mut lines: Vec<Line> = Vec::new();
    for row in &csv.rows {
        let m = row.get(measurement).ok_or("a row without measurement")?;
        let v = row.get(variant).ok_or("a row without variant")?;
        let n = Csv::number(row, nodes)?.ok_or("a row without nodes")?;
        let y = Csv::number(row, us)?.ok_or("a row without us")?;
        if !sizes.contains(&n) {
            sizes.push(n);
        }
        match lines.iter_mut().find(|l| &l.0 == m && &l.1 == v) {
            Some(line) => line.2.push((n, y)),
            None => lines.push((m.clone(), v.clone(), vec![(n, y)])),
        }
    }
    sizes.sort_by(f64::total_cmp);
    let x = Axis::linear("nodes").with_ticks(&sizes);
    let mut fence = Panel::new("(a) ARMCI_AllFence", x.clone(), Axis::log("latency (µs)"));
    let mut barrier = Panel::new("(b) ARMCI_Barrier", x.clone(), Axis::log("latency (µs)"));
    let mut lock = Panel::new(
        "(c) lock and unlock under contention",
        x,
        Axis::log("latency (µs)"),
    );
    // Colours by panel: (panel, variant) in first-seen order; lock and unlock of one algorithm
    // share one.
    let mut colours: Vec<(&str, &str)> = Vec::new();
    for (m, v, points) in &lines {
        let baseline = v == "one at a time" || v.starts_with("AllFence (one");
        let (panel, stroke, label) = match m.as_str() {
            "allfence" => (
                &mut fence,
                if baseline {
                    Stroke::Dashed
                } else {
                    Stroke::Solid
                },
                Some(v.clone()),
            ),
            "barrier" => (
                &mut barrier,
                if baseline {
                    Stroke::Dashed
                } else {
                    Stroke::Solid
                },
                Some(v.clone()),
            ),
            "lock" => (&mut lock, Stroke::Solid, Some(v.clone())),
            "unlock" => (&mut lock, Stroke::Dashed, None),
            _ => continue,
        };
        let panel_name = if m == "unlock" { "lock" } else { m.as_str() };
        let colour = match colours
            .iter()
            .filter(|c| c.0 == panel_name)
            .position(|c| c.1 == v.as_str())
        {
            Some(index) => index,
            None => {
                colours.push((panel_name, v.as_str()));
                colours.iter().filter(|c| c.0 == panel_name).count() - 1
            }
        };
        let mut series = match label {
            Some(label) => Series::new(&label, Colour::Palette(colour), stroke),
            None => Series::unlabelled(Colour::Palette(colour), stroke),
        };
        for &(n, y) in points {
            series.point(n, y);
        }
        panel.series.push(series);
    }
    lock.note(Stroke::Solid, "ARMCI_Lock")
        .note(Stroke::Dashed, "ARMCI_Unlock");
    Ok(Figure {
        title: "ARMCI synchronisation over the emulated NIC: Saify's optimisations and baselines"
            .into(),
        panels: vec![fence, barrier, lock],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pingpong_figure_has_a_series_per_path_on_both_panels() {
        let csv = Csv::parse(
            "series,bytes,one_way_us,bandwidth_mb_s\n\
             ARMCI_Put_flag,1,40,0.025\nARMCI_Put_flag,1048576,2600,400\n\
             GM messages,1,30,0.03\n",
        )
        .expect("parses");
        let figure = pingpong_figure(&csv).expect("draws");
        assert_eq!(figure.panels.len(), 2);
        assert_eq!(figure.panels[0].series.len(), 2);
        assert_eq!(
            figure.panels[0].series[0].points,
            [(1.0, 40.0), (1_048_576.0, 2600.0)]
        );
        assert_eq!(figure.panels[1].series[1].points, [(1.0, 0.03)]);
        assert!(figure.to_svg().is_ok());
    }

    #[test]
    fn the_figure_has_three_panels_and_pairs_lock_with_unlock() {
        let csv = Csv::parse(
            "measurement,nodes,variant,k,us\n\
             allfence,2,one at a time,1,50\nallfence,4,one at a time,1,90\n\
             allfence,4,K=2,2,60\n\
             barrier,4,fused fence-barrier,0,70\n\
             lock,4,ticket lock,0,100\nunlock,4,ticket lock,0,30\n\
             lock,4,MCS queue lock,0,80\nunlock,4,MCS queue lock,0,40\n",
        )
        .expect("parses");
        let figure = figure(&csv).expect("draws");
        assert_eq!(figure.panels.len(), 3);
        assert_eq!(figure.panels[0].series.len(), 2);
        assert_eq!(
            figure.panels[0].series[0].points,
            [(2.0, 50.0), (4.0, 90.0)]
        );
        let lock = &figure.panels[2];
        assert_eq!(lock.series.len(), 4);
        assert_eq!(lock.series[0].colour, lock.series[1].colour);
        assert_eq!(lock.series[2].colour, lock.series[3].colour);
        assert_ne!(lock.series[0].colour, lock.series[2].colour);
        assert!(figure.to_svg().is_ok());
    }
}
