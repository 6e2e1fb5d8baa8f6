//! `dxpu bench model`: every workload through the bridges at added one-way delays, the
//! measured overhead (median and spread of runs alternated with direct ones) beside what the
//! performance model predicts from the workload's profile and the link measured at that
//! delay; a table, `DIR/model.json`, and a plot per workload (SVG and PNG). Its points and
//! plots are `lab::bench::model`'s.

use std::path::PathBuf;

use clap::Args;
use lab::bench::model::{Point, header, plot, register_font, row};
use serde_json::json;

use crate::args::WorkloadArg;
use crate::loopback::LoopbackArgs;

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
    let mut progress = |m: &str| steps.detail(&format!("{} +{delay_us} µs: {m}", w.name()));
    let o = crate::loopback::options(&la, &mut progress)
        .and_then(|options| Ok(lab::loopback::run(&options, &mut progress)?))
        .map_err(|e| format!("{} at +{delay_us} µs: {e}", w.name()))?;
    Ok(Point::of(&o, delay_us))
}

pub(crate) fn run_model_bench(args: ModelBench) -> Result<(), String> {
    register_font(args.font.as_deref())
        .map_err(|e| if args.font.is_some() { format!("--font {e}") } else { e.to_string() })?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("--out {}: {e}", args.out.display()))?;
    let workloads =
        if args.workloads.is_empty() { WorkloadArg::ALL.to_vec() } else { args.workloads.clone() };
    outln!(
        "dxpu bench model — each point: {} runs each way, bridged and direct in turns; model from the direct runs' profile and the link measured at that point",
        args.repeat
    );
    outln!("{}", header());
    let (mut all, mut held, mut total) = (Vec::new(), 0, 0);
    let count = workloads.len() * args.delays_us.len();
    let steps = crate::out::Steps::counted("bench model", count as u32);
    for w in workloads {
        let mut points = Vec::new();
        for &delay in &args.delays_us {
            steps.step(&format!("point {} of {count}: {} at +{delay} µs", total + 1, w.name()));
            let p = measure(&args, w, delay, &steps)?;
            steps.print(|| outln!("{}", row(w.name(), &p)));
            total += 1;
            held += usize::from(p.holds());
            points.push(p);
        }
        let first = &points[0];
        let crossing =
            |p: &Point| lab::model::crossing_rtt(&p.profile, p.direct.median, &p.link, 10.0).map(|s| s * 1e6);
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
