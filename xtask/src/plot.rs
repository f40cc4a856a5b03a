//! The benchmarks' figures: line charts of y against x, one or more panels side by side, drawn as
//! SVG with `plotters` (its SVG backend only, so nothing is needed from the system).
//!
//! A benchmark describes what to draw — a [`Figure`] of [`Panel`]s, each with two [`Axis`] and
//! its [`Series`] — and this module decides how: round tick values (1, 2, 5 times a power of ten,
//! or values the benchmark names, such as process counts), logarithmic axes where asked, a grid,
//! the axis labels with their units, and a legend beside each panel.

use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;

use crate::Result;

/// Whole figure size of one panel, in pixels; a figure is as wide as its panels side by side.
const PANEL_WIDTH: u32 = 640;
const PANEL_HEIGHT: u32 = 440;
/// Width of the legend column at the right of each panel.
const LEGEND_WIDTH: u32 = 190;
const FONT: &str = "sans-serif";

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scale {
    Linear,
    /// Logarithmic: for data that spans decades (every value must be positive).
    Log,
}

/// How a series' line is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stroke {
    Solid,
    Dashed,
    Dotted,
}

/// A series' colour: one of a palette of distinct colours, or the gray of reference lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Colour {
    Palette(usize),
    Gray,
    Black,
}

/// One axis: its label (with the unit), its scale, and optionally the tick values to show (else
/// round ones are chosen).
#[derive(Clone, Debug)]
pub(crate) struct Axis {
    pub(crate) label: String,
    pub(crate) scale: Scale,
    pub(crate) ticks: Option<Vec<f64>>,
    /// Values the axis must show even without data there (0 or 1 for a ratio, say).
    pub(crate) include: Vec<f64>,
}

impl Axis {
    pub(crate) fn linear(label: &str) -> Self {
        Self {
            label: label.to_string(),
            scale: Scale::Linear,
            ticks: None,
            include: Vec::new(),
        }
    }

    pub(crate) fn log(label: &str) -> Self {
        Self {
            scale: Scale::Log,
            ..Self::linear(label)
        }
    }

    /// Shows exactly these tick values (the range still covers the data).
    pub(crate) fn with_ticks(mut self, ticks: &[f64]) -> Self {
        self.ticks = Some(ticks.to_vec());
        self
    }

    /// Makes the range cover `value` too.
    pub(crate) fn including(mut self, value: f64) -> Self {
        self.include.push(value);
        self
    }
}

/// One line of a panel.
#[derive(Clone, Debug)]
pub(crate) struct Series {
    /// Its legend entry; `None` draws it without one (when a legend note explains it).
    pub(crate) label: Option<String>,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) colour: Colour,
    pub(crate) stroke: Stroke,
}

impl Series {
    pub(crate) fn new(label: &str, colour: Colour, stroke: Stroke) -> Self {
        Self {
            label: Some(label.to_string()),
            points: Vec::new(),
            colour,
            stroke,
        }
    }

    pub(crate) fn unlabelled(colour: Colour, stroke: Stroke) -> Self {
        Self {
            label: None,
            ..Self::new("", colour, stroke)
        }
    }

    pub(crate) fn point(&mut self, x: f64, y: f64) -> &mut Self {
        self.points.push((x, y));
        self
    }
}

/// A filled rectangle of a region map (a selection map: which algorithm wins where), drawn
/// under the series; cells of one label share a colour and one legend entry.
#[derive(Clone, Debug)]
pub(crate) struct Cell {
    /// From and to on the x axis.
    pub(crate) x: (f64, f64),
    /// From and to on the y axis.
    pub(crate) y: (f64, f64),
    pub(crate) colour: Colour,
    pub(crate) label: String,
}

/// One chart: a title, two axes, its series, and legend notes (a line style and what it means,
/// such as "dashed: host-based"); a region map's cells, if any, under the series.
#[derive(Clone, Debug)]
pub(crate) struct Panel {
    pub(crate) title: String,
    pub(crate) x: Axis,
    pub(crate) y: Axis,
    pub(crate) series: Vec<Series>,
    pub(crate) notes: Vec<(Stroke, String)>,
    pub(crate) cells: Vec<Cell>,
}

impl Panel {
    pub(crate) fn new(title: &str, x: Axis, y: Axis) -> Self {
        Self {
            title: title.to_string(),
            x,
            y,
            series: Vec::new(),
            notes: Vec::new(),
            cells: Vec::new(),
        }
    }

    pub(crate) fn note(&mut self, stroke: Stroke, text: &str) -> &mut Self {
        self.notes.push((stroke, text.to_string()));
        self
    }
}

/// A figure: a title over one or more panels side by side.
#[derive(Clone, Debug)]
pub(crate) struct Figure {
    pub(crate) title: String,
    pub(crate) panels: Vec<Panel>,
}

impl Figure {
    /// Draws the figure as an SVG document.
    pub(crate) fn to_svg(&self) -> Result<String> {
        if self.panels.is_empty() {
            return Err("a figure needs at least one panel".into());
        }
        let size = (PANEL_WIDTH * self.panels.len() as u32, PANEL_HEIGHT + 40);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
            root.fill(&WHITE)?;
            let root = root.titled(&self.title, (FONT, 20))?;
            for (panel, area) in self
                .panels
                .iter()
                .zip(root.split_evenly((1, self.panels.len())))
            {
                draw_panel(panel, &area)?;
            }
            root.present()?;
        }
        Ok(svg)
    }

    /// Draws the figure into `path`.
    pub(crate) fn write_svg(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_svg()?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()).into())
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw_panel(panel: &Panel, area: &Area<'_>) -> Result<()> {
    let (chart_area, legend_area) = area.split_horizontally(area.dim_in_pixel().0 - LEGEND_WIDTH);
    let xs: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .chain(panel.cells.iter().flat_map(|c| [c.x.0, c.x.1]))
        .collect();
    let ys: Vec<f64> = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .chain(panel.cells.iter().flat_map(|c| [c.y.0, c.y.1]))
        .collect();
    let x = AxisCoord::new(&panel.x, &xs)?;
    let y = AxisCoord::new(&panel.y, &ys)?;
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(&panel.title, (FONT, 16))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)?;
    let format = |v: &f64| format_number(*v);
    chart
        .configure_mesh()
        .x_desc(&panel.x.label)
        .y_desc(&panel.y.label)
        .x_labels(64)
        .y_labels(64)
        .x_label_formatter(&format)
        .y_label_formatter(&format)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .bold_line_style(RGBColor(210, 210, 210))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()?;
    chart.draw_series(panel.cells.iter().map(|cell| {
        Rectangle::new(
            [(cell.x.0, cell.y.0), (cell.x.1, cell.y.1)],
            rgb(cell.colour).filled(),
        )
    }))?;
    chart.draw_series(panel.cells.iter().map(|cell| {
        Rectangle::new(
            [(cell.x.0, cell.y.0), (cell.x.1, cell.y.1)],
            WHITE.stroke_width(1),
        )
    }))?;
    for series in &panel.series {
        let colour = rgb(series.colour);
        let style = colour.stroke_width(2);
        let points = series.points.clone();
        match series.stroke {
            Stroke::Solid => {
                chart.draw_series(LineSeries::new(points.iter().copied(), style))?;
            }
            Stroke::Dashed => {
                chart.draw_series(DashedLineSeries::new(points.iter().copied(), 7, 5, style))?;
            }
            Stroke::Dotted => {
                chart.draw_series(DashedLineSeries::new(points.iter().copied(), 2, 4, style))?;
            }
        }
        // Markers: filled on solid lines, hollow on the others, so a point's series is clear
        // where lines cross.
        let filled = series.stroke == Stroke::Solid;
        chart.draw_series(points.iter().map(|p| {
            Circle::new(
                *p,
                3,
                if filled {
                    colour.filled()
                } else {
                    colour.stroke_width(1)
                },
            )
        }))?;
    }
    draw_legend(panel, &legend_area)
}

/// The legend: one row per labelled series, then the notes (a line style and its meaning).
fn draw_legend(panel: &Panel, area: &Area<'_>) -> Result<()> {
    let rows = panel
        .series
        .iter()
        .filter_map(|s| s.label.as_ref().map(|l| (s.colour, s.stroke, l.as_str())))
        .chain(
            panel
                .notes
                .iter()
                .map(|(stroke, text)| (Colour::Black, *stroke, text.as_str())),
        );
    let mut y = 48;
    // A region map's labels first, each a filled square of its colour.
    let mut labels: Vec<(&str, Colour)> = Vec::new();
    for cell in &panel.cells {
        if !labels.iter().any(|(l, _)| *l == cell.label) {
            labels.push((&cell.label, cell.colour));
        }
    }
    for (text, colour) in labels {
        area.draw(&Rectangle::new(
            [(8, y - 8), (26, y + 8)],
            rgb(colour).filled(),
        ))?;
        area.draw(&Text::new(
            text.to_string(),
            (42, y - 7),
            (FONT, 13).into_font().color(&RGBColor(30, 30, 30)),
        ))?;
        y += 22;
    }
    for (i, (colour, stroke, text)) in rows.enumerate() {
        if i == panel.series.iter().filter(|s| s.label.is_some()).count() && i > 0 {
            y += 10; // a gap between the series and the notes
        }
        let style = rgb(colour).stroke_width(2);
        let (x0, x1) = (4, 34);
        let (dash, gap) = match stroke {
            Stroke::Solid => (x1 - x0, 0),
            Stroke::Dashed => (7, 5),
            Stroke::Dotted => (2, 4),
        };
        let mut x = x0;
        while x < x1 {
            let end = (x + dash).min(x1);
            area.draw(&PathElement::new(vec![(x, y), (end, y)], style))?;
            x = end + gap;
        }
        area.draw(&Text::new(
            text.to_string(),
            (x1 + 8, y - 7),
            (FONT, 13).into_font().color(&RGBColor(30, 30, 30)),
        ))?;
        y += 20;
    }
    Ok(())
}

fn rgb(colour: Colour) -> RGBColor {
    // Colours that stay distinct for colour-blind readers (Okabe and Ito), then a few more.
    const PALETTE: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(140, 86, 75),
        RGBColor(120, 60, 160),
    ];
    match colour {
        Colour::Palette(i) => PALETTE[i % PALETTE.len()],
        Colour::Gray => RGBColor(120, 120, 120),
        Colour::Black => RGBColor(0, 0, 0),
    }
}

/// A tick value as a person writes it: no trailing zeros, no exponent for everyday magnitudes.
pub(crate) fn format_number(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let magnitude = v.abs();
    if !(1e-3..1e6).contains(&magnitude) {
        return format!("{v:e}");
    }
    // Enough decimals to tell 0.2 from 0.25, none for integers.
    let decimals = (0..=4)
        .find(|&d| {
            let scaled = v * 10f64.powi(d);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.abs().max(1.0)
        })
        .unwrap_or(4);
    format!("{v:.*}", decimals as usize)
}

/// An axis as plotters sees it: its range, how values map to pixels, and its ticks (major ones,
/// labelled; minor ones, grid lines only).
#[derive(Clone, Debug)]
struct AxisCoord {
    lo: f64,
    hi: f64,
    log: bool,
    major: Vec<f64>,
    minor: Vec<f64>,
}

impl AxisCoord {
    fn new(axis: &Axis, data: &[f64]) -> Result<Self> {
        let values: Vec<f64> = data
            .iter()
            .chain(&axis.include)
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        let log = axis.scale == Scale::Log;
        if log && values.iter().any(|v| *v <= 0.0) {
            return Err(format!("axis {:?} is logarithmic but has values <= 0", axis.label).into());
        }
        let (mut lo, mut hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        if !lo.is_finite() {
            (lo, hi) = if log { (1.0, 10.0) } else { (0.0, 1.0) };
        }
        let coord = match (&axis.ticks, log) {
            (Some(ticks), _) => {
                let (tlo, thi) = ticks
                    .iter()
                    .fold((lo, hi), |(lo, hi), t| (lo.min(*t), hi.max(*t)));
                // A little room around named ticks so the end points are not on the frame.
                let (lo, hi) = if log {
                    (tlo / (thi / tlo).powf(0.04), thi * (thi / tlo).powf(0.04))
                } else {
                    let pad = (thi - tlo).max(1e-9) * 0.04;
                    (tlo - pad, thi + pad)
                };
                Self {
                    lo,
                    hi,
                    log,
                    major: ticks.clone(),
                    minor: Vec::new(),
                }
            }
            (None, true) => log_ticks(lo, hi),
            (None, false) => linear_ticks(lo, hi),
        };
        Ok(coord)
    }

    fn fraction(&self, v: f64) -> f64 {
        if self.log {
            (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }
}

/// Round linear ticks (1, 2 or 5 times a power of ten apart, four to eight of them) and a range
/// that ends on ticks.
fn linear_ticks(lo: f64, hi: f64) -> AxisCoord {
    let (lo, hi) = if hi - lo < 1e-12 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    };
    let raw = (hi - lo) / 6.0;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|s| (hi - lo) / s <= 8.0)
        .unwrap_or(10.0 * power);
    let first = (lo / step).floor();
    let last = (hi / step).ceil();
    let major: Vec<f64> = (0..=(last - first) as i64)
        .map(|i| (first + i as f64) * step)
        .collect();
    let minor = major.windows(2).map(|w| (w[0] + w[1]) / 2.0).collect();
    AxisCoord {
        lo: first * step,
        hi: last * step,
        log: false,
        major,
        minor,
    }
}

/// Round logarithmic ticks: 1, 2 and 5 times each power of ten where the range spans up to two
/// decades, powers of ten only where it spans more (with 2..9 as grid lines); the range ends on
/// the outer ticks.
fn log_ticks(lo: f64, hi: f64) -> AxisCoord {
    let (lo, hi) = if hi / lo < 1.0 + 1e-9 {
        (lo / 2.0, hi * 2.0)
    } else {
        (lo, hi)
    };
    let first = lo.log10().floor() as i32;
    let last = hi.log10().ceil() as i32;
    let decades = last - first;
    let mantissas: &[f64] = if decades <= 2 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let mut major = Vec::new();
    let mut minor = Vec::new();
    for e in first..=last {
        let power = 10f64.powi(e);
        for m in 1..10 {
            let v = f64::from(m) * power;
            if mantissas.contains(&f64::from(m)) {
                major.push(v);
            } else {
                minor.push(v);
            }
        }
    }
    // The range: from the last major tick at or below lo to the first at or above hi.
    let tolerance = 1e-9;
    let start = major
        .iter()
        .copied()
        .filter(|t| *t <= lo * (1.0 + tolerance))
        .fold(10f64.powi(first), f64::max);
    let end = major
        .iter()
        .copied()
        .filter(|t| *t >= hi * (1.0 - tolerance))
        .fold(10f64.powi(last), f64::min);
    let within = |t: &f64| *t >= start * (1.0 - tolerance) && *t <= end * (1.0 + tolerance);
    major.retain(within);
    minor.retain(within);
    AxisCoord {
        lo: start,
        hi: end,
        log: true,
        major,
        minor,
    }
}

impl Ranged for AxisCoord {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let t = self.fraction(*value);
        (f64::from(limit.0) + t * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.minor.clone()
        } else {
            self.major.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_ticks_are_round_and_cover_the_data() {
        let axis = linear_ticks(0.0, 6.47);
        assert_eq!(axis.major, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert_eq!((axis.lo, axis.hi), (0.0, 7.0));
        let axis = linear_ticks(0.0, 759.0);
        assert_eq!(
            axis.major,
            vec![0.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0]
        );
    }

    #[test]
    fn log_ticks_are_powers_of_ten_over_many_decades() {
        let axis = log_ticks(0.148, 719.0);
        assert_eq!(axis.major, vec![0.1, 1.0, 10.0, 100.0, 1000.0]);
        assert_eq!((axis.lo, axis.hi), (0.1, 1000.0));
        assert!(axis.minor.contains(&20.0) && axis.minor.contains(&500.0));
    }

    #[test]
    fn log_ticks_add_two_and_five_over_a_short_range() {
        let axis = log_ticks(3.2, 41.0);
        assert_eq!(axis.major, vec![2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!((axis.lo, axis.hi), (2.0, 50.0));
    }

    #[test]
    fn numbers_read_as_written() {
        assert_eq!(format_number(0.0), "0");
        assert_eq!(format_number(100.0), "100");
        assert_eq!(format_number(0.5), "0.5");
        assert_eq!(format_number(2.5), "2.5");
        assert_eq!(format_number(0.001), "0.001");
        assert_eq!(format_number(1e7), "1e7");
    }

    #[test]
    fn a_figure_has_its_labels_and_ticks() {
        let mut panel = Panel::new(
            "latency",
            Axis::log("processes").with_ticks(&[2.0, 4.0, 8.0, 16.0]),
            Axis::log("latency (µs)"),
        );
        let mut series = Series::new("NIC", Colour::Palette(0), Stroke::Solid);
        series.point(2.0, 20.0).point(16.0, 140.0);
        panel.series.push(series);
        panel.note(Stroke::Dashed, "dashed: host-based");
        let svg = Figure {
            title: "a figure".into(),
            panels: vec![panel],
        }
        .to_svg()
        .expect("draws");
        // The SVG's text nodes.
        let texts: Vec<&str> = svg
            .split('>')
            .filter_map(|part| part.split('<').next())
            .map(str::trim)
            .filter(|text| !text.is_empty())
            .collect();
        for text in [
            "a figure",
            "latency (µs)",
            "processes",
            "16",
            "100",
            "NIC",
            "dashed: host-based",
        ] {
            assert!(texts.contains(&text), "{text} missing from {texts:?}");
        }
        // Ticks are the named ones and round ones only: 2, 4, 8, 16 and 10, 20, 50, 100, 200.
        for text in ["3", "140", "20"] {
            assert_eq!(
                texts.contains(&text),
                text == "20",
                "tick {text} in {texts:?}"
            );
        }
    }

    #[test]
    fn a_region_map_has_its_cells_and_their_legend() {
        let mut panel = Panel::new(
            "map",
            Axis::log("bytes").with_ticks(&[8.0, 1024.0]),
            Axis::log("processes").with_ticks(&[2.0, 4.0]),
        );
        for (x, y, colour, label) in [
            ((4.0, 90.0), (1.4, 2.8), 0, "linear"),
            ((90.0, 2048.0), (1.4, 2.8), 1, "binomial"),
            ((4.0, 2048.0), (2.8, 5.6), 1, "binomial"),
        ] {
            panel.cells.push(Cell {
                x,
                y,
                colour: Colour::Palette(colour),
                label: label.into(),
            });
        }
        let svg = Figure {
            title: "a map".into(),
            panels: vec![panel],
        }
        .to_svg()
        .expect("draws");
        let texts: Vec<&str> = svg
            .split('>')
            .filter_map(|part| part.split('<').next())
            .map(str::trim)
            .filter(|text| !text.is_empty())
            .collect();
        // One legend entry per label, however many cells it has.
        assert_eq!(texts.iter().filter(|t| **t == "binomial").count(), 1);
        assert_eq!(texts.iter().filter(|t| **t == "linear").count(), 1);
        // Each label's cells and its legend square in its colour: one linear cell, two
        // binomial ones.
        assert_eq!(svg.matches("fill=\"#0072B2\"").count(), 2, "{svg}");
        assert_eq!(svg.matches("fill=\"#D55E00\"").count(), 3, "{svg}");
    }

    #[test]
    fn a_log_axis_refuses_zero() {
        let mut panel = Panel::new("p", Axis::linear("x"), Axis::log("y"));
        let mut series = Series::new("s", Colour::Gray, Stroke::Dotted);
        series.point(1.0, 0.0);
        panel.series.push(series);
        let figure = Figure {
            title: "t".into(),
            panels: vec![panel],
        };
        assert!(figure.to_svg().is_err());
    }
}
