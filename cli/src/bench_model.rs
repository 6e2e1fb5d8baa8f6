//! `dxpu bench model`: every workload through the bridges at added one-way delays, the
//! measured overhead (median and spread of runs alternated with direct ones) beside what the
//! performance model predicts from the workload's profile and the link measured at that
//! delay; a table, `DIR/model.json`, and a plot per workload (SVG and PNG).

use std::path::{Path, PathBuf};

use clap::Args;
use lab::model::{self, LinkParams, Profile};
use plotters::prelude::*;
use serde_json::{Value, json};

use crate::args::WorkloadArg;
use crate::loopback::LoopbackArgs;
use lab::harness::Spread;

/// Options of `dxpu bench model`.
#[derive(Args, Debug)]
pub(crate) struct ModelBench {
    /// Where model.json and the plots go (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Added one-way delays, µs, comma-separated (each 0..=10000).
    #[arg(long, value_delimiter = ',', default_value = "0,5,10,25,50",
          value_parser = clap::value_parser!(u64).range(0..=10_000))]
    delays_us: Vec<u64>,
    /// Workloads, comma-separated; all four by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    workloads: Vec<WorkloadArg>,
    /// Runs each way at each point (1..=1000).
    #[arg(long, default_value_t = crate::loopback::DEFAULT_REPEAT,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    repeat: u32,
    /// Workload scale, as `dxpu loopback --scale` (1..=32).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    scale: u32,
    /// A TrueType font for the plots' text (default: DejaVu Sans, built in).
    #[arg(long, value_name = "FILE")]
    font: Option<PathBuf>,
}

/// One point of the sweep.
struct Point {
    delay_us: u64,
    rtt_us: f64,
    overhead: Spread,
    bridged: Spread,
    direct: Spread,
    predicted_overhead: f64,
    predicted_bridged: f64,
    profile: Profile,
    link: LinkParams,
}

impl Point {
    /// The model's miss: bridged time (percent of the measured), and overhead
    /// (percentage points).
    fn miss(&self) -> (f64, f64) {
        (
            (self.predicted_bridged / self.bridged.median - 1.0) * 100.0,
            self.predicted_overhead - self.overhead.median,
        )
    }

    /// Within ±20 % of the measured bridged time, or ±3 points of overhead where the
    /// overhead is under 15 %.
    fn holds(&self) -> bool {
        let (time, points) = self.miss();
        time.abs() <= 20.0 || (self.overhead.median < 15.0 && points.abs() <= 3.0)
    }

    fn json(&self) -> Value {
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
        crate::out::spread(&mut v, "overhead_percent", self.overhead);
        crate::out::spread(&mut v, "bridged_seconds", self.bridged);
        crate::out::spread(&mut v, "direct_seconds", self.direct);
        v
    }
}

/// Registers the plots' font (plotters draws text with it, in both formats): the file
/// given, else DejaVu Sans built into the binary (the `dejavu` crate), so that the plots need
/// no font installed.
fn register_font(font: Option<&Path>) -> Result<(), String> {
    let bytes: &'static [u8] = match font {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("--font {}: {e}", path.display()))?;
            // Registered once for the process's life, as plotters keeps it.
            Box::leak(bytes.into_boxed_slice())
        }
        None => dejavu::sans::regular(),
    };
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| match font {
        Some(p) => format!("--font {}: not a TrueType font plotters can read", p.display()),
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
            (rtt, model::predict(&first.profile, first.direct.median, &l).overhead_percent)
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

fn plot(dir: &Path, name: &str, points: &[Point]) -> Result<(PathBuf, PathBuf), String> {
    let (svg, png) = (dir.join(format!("{name}.svg")), dir.join(format!("{name}.png")));
    draw(SVGBackend::new(&svg, (900, 560)).into_drawing_area(), name, points)?;
    draw(BitMapBackend::new(&png, (900, 560)).into_drawing_area(), name, points)?;
    Ok((svg, png))
}

/// One point: the workload through the bridges at `delay_us`, alternated with direct runs.
fn measure(
    args: &ModelBench,
    w: WorkloadArg,
    delay_us: u64,
    steps: &crate::out::Steps,
) -> Result<Point, String> {
    let mut la = LoopbackArgs::defaults();
    la.workload = Some(w);
    la.scale = args.scale;
    la.repeat = args.repeat;
    la.impair.delay_us = delay_us;
    la.rtt_samples = 500;
    let o = crate::loopback::run(&la, &mut |m| steps.detail(&format!("{} +{delay_us} µs: {m}", w.name())))
        .map_err(|e| format!("{} at +{delay_us} µs: {e}", w.name()))?;
    let (bridged, direct) = o.seconds();
    let (pred, _) = o.prediction();
    Ok(Point {
        delay_us,
        rtt_us: o.link.rtt_ns / 1e3,
        overhead: o.overhead(),
        bridged,
        direct,
        predicted_overhead: pred.overhead_percent,
        predicted_bridged: pred.bridged_seconds,
        profile: o.profile,
        link: o.link,
    })
}

pub(crate) fn run_model_bench(args: ModelBench) -> Result<(), String> {
    register_font(args.font.as_deref())?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    let workloads =
        if args.workloads.is_empty() { WorkloadArg::ALL.to_vec() } else { args.workloads.clone() };
    outln!(
        "dxpu bench model — each point: {} runs each way, bridged and direct in turns; model from the direct runs' profile and the link measured at that point",
        args.repeat
    );
    let line = |cells: &[String]| outln!("{}", crate::out::row(&[13, 6, 8, 23, 10, 11, 10, 8, 7, 6], cells));
    line(
        &[
            "workload",
            "+delay",
            "RTT µs",
            "overhead % (min..max)",
            "model %",
            "bridged",
            "model",
            "miss %",
            "miss pp",
            "holds",
        ]
        .map(String::from),
    );
    let (mut all, mut held, mut total) = (Vec::new(), 0, 0);
    let count = workloads.len() * args.delays_us.len();
    let steps = crate::out::Steps::counted("bench model", count as u32);
    for w in workloads {
        let mut points = Vec::new();
        for &delay in &args.delays_us {
            steps.step(&format!("point {} of {count}: {} at +{delay} µs", total + 1, w.name()));
            let p = measure(&args, w, delay, &steps)?;
            let (time, pp) = p.miss();
            steps.print(|| {
                line(&[
                    w.name().to_string(),
                    delay.to_string(),
                    format!("{:.1}", p.rtt_us),
                    format!("{:.1} ({:>5.0}..{:>5.0})", p.overhead.median, p.overhead.min, p.overhead.max),
                    format!("{:.1}", p.predicted_overhead),
                    format!("{:.2}ms", p.bridged.median * 1e3),
                    format!("{:.2}ms", p.predicted_bridged * 1e3),
                    format!("{time:+.1}"),
                    format!("{pp:+.1}"),
                    (if p.holds() { "yes" } else { "NO" }).to_string(),
                ])
            });
            total += 1;
            held += usize::from(p.holds());
            points.push(p);
        }
        let first = &points[0];
        let crossing =
            |p: &Point| model::crossing_rtt(&p.profile, p.direct.median, &p.link, 10.0).map(|s| s * 1e6);
        let (svg, png) = plot(&args.out, w.name(), &points)?;
        steps.print(|| {
            outln!(
                "{:<13} model crosses 10 % at a round trip of {}; plots {} and {}",
                w.name(),
                crossing(first).map_or("never".to_string(), |x| format!("{x:.0} µs")),
                svg.display(),
                png.display()
            )
        });
        all.push(json!({
            "workload": w.name(),
            "crosses_10_percent_at_rtt_us": crossing(first),
            "points": points.iter().map(Point::json).collect::<Vec<_>>(),
        }));
    }
    drop(steps);
    outln!(
        "the model held at {held} of {total} points (±20 % of bridged time, or ±3 points under 15 % overhead)"
    );
    let report = json!({
        "repeat": args.repeat,
        "scale": args.scale,
        "delays_us": args.delays_us,
        "points_held": held,
        "points": total,
        "workloads": all,
    });
    let path = args.out.join("model.json");
    std::fs::write(&path, format!("{}\n", crate::out::json_pretty(&report)))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    outln!("wrote {}", path.display());
    Ok(())
}
