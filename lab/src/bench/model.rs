//! `dxpu bench model`'s points and plots: a workload through the bridges at an added delay,
//! the measured overhead (median and spread of runs alternated with direct ones) beside what
//! the performance model predicts from the workload's profile and the link measured at that
//! delay; a plot per workload (SVG and PNG; feature `plot`).

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::{Value, json};

use crate::error::LabError;
use crate::harness::Spread;
use crate::loopback::Outcome;
use crate::model::{LinkParams, Profile};

/// The table's columns: their headers and widths.
pub const COLUMNS: [(&str, usize); 10] = [
    ("workload", 13),
    ("+delay", 6),
    ("RTT µs", 8),
    ("overhead % (min..max)", 23),
    ("model %", 10),
    ("bridged", 11),
    ("model", 10),
    ("miss %", 8),
    ("miss pp", 7),
    ("holds", 6),
];

/// A point's row of the table, for the workload `name`.
pub fn row(name: &str, p: &Point) -> String {
    let (time, pp) = p.miss();
    let cells = [
        name.to_string(),
        p.delay_us.to_string(),
        format!("{:.1}", p.rtt_us),
        format!("{:.1} ({:>5.0}..{:>5.0})", p.overhead.median, p.overhead.min, p.overhead.max),
        format!("{:.1}", p.predicted_overhead),
        format!("{:.2}ms", p.bridged.median * 1e3),
        format!("{:.2}ms", p.predicted_bridged * 1e3),
        format!("{time:+.1}"),
        format!("{pp:+.1}"),
        (if p.holds() { "yes" } else { "NO" }).to_string(),
    ];
    crate::report::row(&COLUMNS.map(|c| c.1), &cells)
}

/// The table's header row.
pub fn header() -> String {
    crate::report::row(&COLUMNS.map(|c| c.1), &COLUMNS.map(|c| c.0.to_string()))
}

/// One point of the sweep: a workload's runs at one added delay, and the model's
/// prediction for them.
#[derive(Debug, Clone)]
pub struct Point {
    /// The added one-way delay, µs.
    pub delay_us: u64,
    /// The round trip measured through the bridges (MMIO read p50), µs.
    pub rtt_us: f64,
    /// The overhead against direct, %: median of the pairs and their spread.
    pub overhead: Spread,
    /// Bridged time per run, s.
    pub bridged: Spread,
    /// Direct time per run, s.
    pub direct: Spread,
    /// The model's overhead, %.
    pub predicted_overhead: f64,
    /// The model's bridged time, s.
    pub predicted_bridged: f64,
    /// The workload's profile, counted on the direct platform.
    pub profile: Profile,
    /// The link measured at this point.
    pub link: LinkParams,
}

impl Point {
    /// The point the runs of `o` (made at `delay_us`) give.
    pub fn of(o: &Outcome, delay_us: u64) -> Point {
        let (bridged, direct) = o.seconds();
        let (pred, _) = o.prediction();
        Point {
            delay_us,
            rtt_us: o.link.rtt_ns / 1e3,
            overhead: o.overhead(),
            bridged,
            direct,
            predicted_overhead: pred.overhead_percent,
            predicted_bridged: pred.bridged_seconds,
            profile: o.profile,
            link: o.link,
        }
    }

    /// The model's miss: bridged time (percent of the measured), and overhead
    /// (percentage points).
    pub fn miss(&self) -> (f64, f64) {
        (
            (self.predicted_bridged / self.bridged.median - 1.0) * 100.0,
            self.predicted_overhead - self.overhead.median,
        )
    }

    /// Within ±20 % of the measured bridged time, or ±3 points of overhead where the
    /// overhead is under 15 %.
    pub fn holds(&self) -> bool {
        let (time, points) = self.miss();
        time.abs() <= 20.0 || (self.overhead.median < 15.0 && points.abs() <= 3.0)
    }

    /// The point in `model.json` (docs/cli.md).
    pub fn json(&self) -> Value {
        let (time, points) = self.miss();
        let mut v = json!({
            "delay_us": self.delay_us,
            "rtt_us": self.rtt_us,
            "predicted_overhead_percent": self.predicted_overhead,
            "predicted_bridged_seconds": self.predicted_bridged,
            "model_miss_time_percent": time,
            "model_miss_overhead_points": points,
            "model_holds": self.holds(),
            "h2d_bytes_per_s": self.link.h2d_bytes_per_s,
            "d2h_bytes_per_s": self.link.d2h_bytes_per_s,
            "profile": crate::model::profile_json(&self.profile),
        });
        crate::report::spread(&mut v, "overhead_percent", self.overhead);
        crate::report::spread(&mut v, "bridged_seconds", self.bridged);
        crate::report::spread(&mut v, "direct_seconds", self.direct);
        v
    }
}

/// Registers the plots' font (plotters draws text with it, in both formats): the file
/// given, else DejaVu Sans built into the binary (the `dejavu` crate), so that the plots need
/// no font installed.
pub fn register_font(font: Option<&Path>) -> Result<(), LabError> {
    font_registered(font).map_err(LabError::Bench)
}

fn font_registered(font: Option<&Path>) -> Result<(), String> {
    let bytes: &'static [u8] = match font {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
            // Registered once for the process's life, as plotters keeps it.
            Box::leak(bytes.into_boxed_slice())
        }
        None => dejavu::sans::regular(),
    };
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| match font {
        Some(p) => format!("{}: not a TrueType font plotters can read", p.display()),
        None => "the built-in DejaVu Sans: plotters cannot read it".to_string(),
    })
}

/// The plot of one workload: measured overhead (median, min–max bars) against the round
/// trip, the model's prediction at each point's measured link, the model's line across the
/// range at the first point's bulk rates, and the 10 % line.
fn draw<B: DrawingBackend>(
    area: DrawingArea<B, plotters::coord::Shift>,
    name: &str,
    points: &[Point],
) -> Result<(), String>
where
    B::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<B::ErrorType>| format!("plotting {name}: {e}");
    area.fill(&WHITE).map_err(e)?;
    let x_max = points.iter().map(|p| p.rtt_us).fold(0.0, f64::max) * 1.1 + 1.0;
    let lo = points.iter().map(|p| p.overhead.min.min(p.predicted_overhead)).fold(0.0, f64::min);
    let hi = points.iter().map(|p| p.overhead.max.max(p.predicted_overhead)).fold(12.0, f64::max);
    let mut chart = ChartBuilder::on(&area)
        .caption(format!("dxpu {name}: overhead against round trip"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..x_max, (lo - 5.0)..(hi * 1.05))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("round trip through the bridges (MMIO read p50), µs")
        .y_desc("overhead against direct, %")
        .draw()
        .map_err(e)?;
    chart
        .draw_series(LineSeries::new([(0.0, 10.0), (x_max, 10.0)], RED.stroke_width(1)))
        .map_err(e)?
        .label("10 %")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RED));
    if let Some(first) = points.first() {
        let steps = 64;
        let line = (0..=steps).map(|i| {
            let rtt = x_max * i as f64 / steps as f64;
            let l = LinkParams { rtt_ns: rtt * 1e3, ..first.link };
            (rtt, crate::model::predict(&first.profile, first.direct.median, &l).overhead_percent)
        });
        chart
            .draw_series(LineSeries::new(line, BLUE.stroke_width(2)))
            .map_err(e)?
            .label("model (first point's bulk rates)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLUE));
    }
    chart
        .draw_series(
            points.iter().map(|p| Cross::new((p.rtt_us, p.predicted_overhead), 6, BLUE.stroke_width(2))),
        )
        .map_err(e)?
        .label("model at each point's measured link")
        .legend(|(x, y)| Cross::new((x + 8, y), 5, BLUE));
    chart
        .draw_series(points.iter().map(|p| {
            ErrorBar::new_vertical(
                p.rtt_us,
                p.overhead.min,
                p.overhead.median,
                p.overhead.max,
                BLACK.filled(),
                8,
            )
        }))
        .map_err(e)?
        .label("measured: median, min–max")
        .legend(|(x, y)| Circle::new((x + 8, y), 3, BLACK.filled()));
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(e)?;
    area.present().map_err(e)
}

/// Plots `points` of the workload `name` into DIR/NAME.svg and DIR/NAME.png; gives the two
/// files.
pub fn plot(dir: &Path, name: &str, points: &[Point]) -> Result<(PathBuf, PathBuf), LabError> {
    plotted(dir, name, points).map_err(LabError::Bench)
}

fn plotted(dir: &Path, name: &str, points: &[Point]) -> Result<(PathBuf, PathBuf), String> {
    let (svg, png) = (dir.join(format!("{name}.svg")), dir.join(format!("{name}.png")));
    draw(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), name, points)?;
    draw(BitMapBackend::new(&png, (900, 560)).into_drawing_area(), name, points)?;
    Ok((svg, png))
}
