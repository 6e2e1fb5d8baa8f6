//! `dxpu replay TRACE`: a PyTorch profiler trace replayed on the simgpu at the speed the
//! traced GPU ran it, directly attached and through both endpoints over UDP loopback, in
//! turns; the overhead, where the added time went, and what the model predicts from the
//! trace and the link measured (`lab::replay`, `lab::plan`; docs/performance-model.md).

use std::process::ExitCode;

use clap::Args;
use lab::compare::{CompareOptions, Comparison, Side, spread};
use lab::harness::Spread;
use lab::replay::ReplayRun;
use link::driver::Impairment;
use serde_json::{Value, json};

use crate::args::{EndpointArgs, ImpairArgs};
use crate::model::{added_json, plan_json, trace_json, trace_summary};

/// Options of `dxpu replay`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReplayArgs {
    /// The trace: torch.profiler's Chrome trace JSON, plain or gzip.
    #[arg(value_name = "TRACE")]
    trace: std::path::PathBuf,
    /// The distributed rank the trace must be of (its `distributedInfo`); a trace of another
    /// rank, or naming none, is refused.
    #[arg(long)]
    rank: Option<u32>,
    /// The GPU (device index) whose activities to take, where the file holds several.
    #[arg(long)]
    device: Option<u32>,
    /// The most bytes the file, and the JSON it inflates to, may have (a gzip file may not
    /// inflate past 100 times its size either).
    #[arg(long, default_value_t = lab::trace::ReadLimits::default().max_bytes)]
    max_trace_bytes: u64,
    /// Replays each way, direct and bridged in turns, after one warm-up each (1..=100).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    #[command(flatten)]
    impair: ImpairArgs,
    /// The link's rate each way, Gbit/s (0: the loopback's own).
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate)]
    rate_gbit: f64,
    #[command(flatten)]
    endpoints: EndpointArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("rate {s:?}: not a number"))?;
    if !v.is_finite() || !(0.0..=1600.0).contains(&v) {
        return Err(format!("rate {s} Gbit/s: must be 0..=1600"));
    }
    Ok(v)
}

impl ReplayArgs {
    fn impairment(&self, seed: u64) -> Impairment {
        Impairment { rate: (self.rate_gbit * 1e9 / 8.0) as u64, ..self.impair.impairment(seed) }
    }
}

fn run(args: &ReplayArgs, progress: &mut dyn FnMut(&str)) -> Result<Comparison, String> {
    let limits = lab::trace::ReadLimits { max_bytes: args.max_trace_bytes };
    let trace =
        lab::trace::read_with(&args.trace, lab::trace::Pick { rank: args.rank, device: args.device }, limits)
            .map_err(|e| e.to_string())?;
    let opts = CompareOptions {
        repeat: args.repeat,
        impairment: args.impairment(0),
        driver: args.endpoints.driver.kind(),
        poll: args.endpoints.poll_mode(),
        placement: args.endpoints.placement("the job's host", progress)?,
    };
    Ok(lab::compare::compare(trace, &opts, progress)?)
}

fn side_json(s: &Side) -> Value {
    let mut v = json!({
        "rtt_us": s.rtt.as_secs_f64() * 1e6,
        "posted_write_us": s.write_ns / 1e3,
        "fence_rtt_us": s.fence_rtt.as_secs_f64() * 1e6,
        "h2d_bytes_per_s": s.h2d,
        "d2h_bytes_per_s": s.d2h,
        "h2d_bytes_per_s_in_replay": s.in_replay().0,
        "d2h_bytes_per_s_in_replay": s.in_replay().1,
        // The copies of the last run, each way, and of them those read back where they
        // landed and found their own.
        "copies_made": s.runs.last().map(|r| [r.copies_made.0, r.copies_made.1]),
        "copies_checked": s.runs.last().map(|r| [r.copies_checked.0, r.copies_checked.1]),
        // What the device's copy engines counted moving in the last run, each way: the
        // copies' bytes, or the run failed its verification.
        "copied_bytes": s.runs.last().map(|r| [r.bytes_copied.0, r.bytes_copied.1]),
    });
    for (key, f) in [
        ("job_seconds", (|r: &ReplayRun| r.job_ns) as fn(&ReplayRun) -> f64),
        ("gpu_span_seconds", |r| r.gpu_span_ns),
        ("fetch_wait_seconds", |r| r.fetch_wait_ns),
        ("copy_extra_seconds", |r| r.copy_extra_ns),
        ("sync_notify_seconds", |r| r.sync_notify_ns),
        ("host_late_seconds", |r| r.host_late_ns),
    ] {
        crate::out::spread(&mut v, key, spread(&s.runs, |r| f(r) / 1e9));
    }
    v
}

fn report_json(r: &Comparison, args: &ReplayArgs) -> Value {
    let d = spread(&r.direct.runs, |r| r.job_ns / 1e9);
    let b = spread(&r.bridged.runs, |r| r.job_ns / 1e9);
    let o = Spread::of(r.overheads.iter().copied());
    let predicted_overhead = r.predicted_overhead_percent();
    let mut m = trace_json(&args.trace.display().to_string(), &r.trace);
    m.insert("plan".into(), plan_json(&r.plan));
    m.insert("copies_capped".into(), json!(r.bridged.runs.first().map_or(0, |run| run.copies_capped)));
    m.insert("repeat".into(), json!(args.repeat));
    m.insert("trace_job_seconds".into(), json!(r.trace_job_ns / 1e9));
    let f = &r.faithfulness;
    m.insert("faithful".into(), json!(f.faithful()));
    m.insert("direct_span_ratio".into(), json!(f.span_ratio));
    m.insert("direct_job_ratio".into(), json!(f.job_ratio));
    m.insert("not_faithful_because".into(), json!(f.why_not()));
    // Where the spinning threads ran: a cache line's round trip between their CPUs where the
    // link was calibrated and after each pair, and whether it moved (lab::cores).
    m.insert(
        "cores".into(),
        json!(r.cores.as_ref().map(|c| json!({
            "cpus": [c.cpus.0, c.cpus.1],
            "round_trip_at_calibration_ns": c.first_ns,
            "round_trip_after_pairs_ns": c.later_ns,
        }))),
    );
    m.insert("cores_moved".into(), json!(r.cores.as_ref().map(|c| c.moved())));
    m.insert("cores_moved_because".into(), json!(r.cores.as_ref().and_then(|c| c.why_moved())));
    m.insert("rtt_us".into(), json!(r.bridged.rtt.as_secs_f64() * 1e6));
    m.insert("delay_us".into(), json!(args.impair.delay_us));
    m.insert("loss_ratio".into(), json!(args.impair.loss));
    m.insert("rate_gbit_per_s".into(), json!(args.rate_gbit));
    m.insert("direct".into(), side_json(&r.direct));
    m.insert("bridged".into(), side_json(&r.bridged));
    m.insert(
        "model".into(),
        json!({
            "predicted_direct_seconds": r.predicted_direct.job_ns / 1e9,
            "predicted_bridged_seconds": r.predicted_bridged.job_ns / 1e9,
            "predicted_overhead_percent": predicted_overhead,
            "added": added_json(&r.predicted_bridged.added),
            "link": {"added_rtt_us": r.link.rtt_ns / 1e3, "submit_us": r.link.submit_ns() / 1e3,
                     "fetch_extra_us": r.link.fetch_extra_ns / 1e3,
                     "h2d_bytes_per_s": r.link.h2d_bytes_per_s, "d2h_bytes_per_s": r.link.d2h_bytes_per_s},
            "crosses_10_percent_at_rtt_us": r.crosses_10_percent_at_rtt_us,
            "inputs_from": "calibration before any replay: register reads, posted writes, fences and copies each way at the trace's byte-median copy size, on each platform alone",
            "calibration_h2d_copy_bytes": r.bridged.rates_at_bytes.0,
            "calibration_d2h_copy_bytes": r.bridged.rates_at_bytes.1,
            "baselines": {
                "no_overhead_percent": 0.0,
                "bandwidth_only_percent": r.bandwidth_only_overhead_percent(),
            },
        }),
    );
    // The job's time in seconds and every spread as siblings, as loopback and bench model give them.
    let mut v = Value::Object(m);
    crate::out::spread(&mut v, "direct_seconds", d);
    crate::out::spread(&mut v, "bridged_seconds", b);
    crate::out::spread(&mut v, "overhead_percent", o);
    crate::out::spread(
        &mut v,
        "overhead_against_trace_percent",
        Spread::of(r.overheads_against_trace().into_iter()),
    );
    v
}

fn print_report(r: &Comparison, args: &ReplayArgs) {
    let t = &r.trace;
    let ms = |s: Spread| format!("{:.2} ms ({:.2}–{:.2})", s.median, s.min, s.max);
    outln!("dxpu replay — {}", trace_summary(&args.trace.display().to_string(), t, &r.plan));
    outln!(
        "  the trace: GPU span {:.2} ms; link +{} µs each way{}{}",
        t.gpu_span_ns() as f64 / 1e6,
        args.impair.delay_us,
        if args.impair.loss > 0.0 {
            format!(", {:.1} % loss", args.impair.loss * 100.0)
        } else {
            String::new()
        },
        if args.rate_gbit > 0.0 { format!(", {} Gbit/s", args.rate_gbit) } else { String::new() }
    );
    let capped = r.bridged.runs.first().map_or(0, |run| run.copies_capped);
    if capped > 0 {
        outln!(
            "  capped: {capped} copies larger than {} MiB moved only that much (held to their traced time)",
            lab::replay::MAX_COPY_BYTES >> 20
        );
    }
    if let Some(run) = r.bridged.runs.last() {
        outln!(
            "  verified: each activity ran its traced time after what the trace says it waits for; copies read back where they landed, their own bytes: in {} of {}, out {} of {} (the others' places were taken by later copies first)",
            run.copies_checked.0,
            run.copies_made.0,
            run.copies_checked.1,
            run.copies_made.1
        );
    }
    for (name, s) in [("direct", &r.direct), ("bridged", &r.bridged)] {
        outln!(
            "  {name:>7}: job {}, GPU span {}; round trip {:.1} µs (a fence's {:.1}), posted write {:.2} µs, copies {:.2} / {:.2} GB/s alone{}",
            ms(spread(&s.runs, |r| r.job_ns / 1e6)),
            ms(spread(&s.runs, |r| r.gpu_span_ns / 1e6)),
            s.rtt.as_secs_f64() * 1e6,
            s.fence_rtt.as_secs_f64() * 1e6,
            s.write_ns / 1e3,
            s.h2d / 1e9,
            s.d2h / 1e9,
            match s.in_replay() {
                (None, None) => String::new(),
                (h2d, d2h) => {
                    let r = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2}", v / 1e9));
                    format!(", {} / {} in the replay", r(h2d), r(d2h))
                }
            }
        );
        outln!(
            "           waits: command fetch {}, copies beyond their traced time {}, synchronizations seen {}, submissions late {}",
            ms(spread(&s.runs, |r| r.fetch_wait_ns / 1e6)),
            ms(spread(&s.runs, |r| r.copy_extra_ns / 1e6)),
            ms(spread(&s.runs, |r| r.sync_notify_ns / 1e6)),
            ms(spread(&s.runs, |r| r.host_late_ns / 1e6))
        );
    }
    let o = Spread::of(r.overheads.iter().copied());
    outln!("  overhead {:.2} % ({:.2}–{:.2}, {} pairs)", o.median, o.min, o.max, r.overheads.len());
    let t = Spread::of(r.overheads_against_trace().into_iter());
    outln!(
        "  against the trace's own job ({:.2} ms): bridged {:.2} % ({:.2}–{:.2})",
        r.trace_job_ns / 1e6,
        t.median,
        t.min,
        t.max
    );
    if let Some(why) = r.faithfulness.why_not() {
        outln!("  NOT FAITHFUL: {why}");
    }
    if let Some(c) = &r.cores {
        let after = match Spread::of(c.later_ns.iter().copied()) {
            _ if c.later_ns.is_empty() => "not measured (logged why)".to_string(),
            s => format!("{:.0} ns ({:.0}–{:.0})", s.median, s.min, s.max),
        };
        outln!(
            "  cores: CPUs {} and {}, a cache line's round trip {:.0} ns at the calibration, {after} after the pairs",
            c.cpus.0,
            c.cpus.1,
            c.first_ns,
        );
        if let Some(why) = c.why_moved() {
            outln!("  CORES MOVED: {why}");
        }
    }
    let p = &r.predicted_bridged;
    outln!(
        "  the model: {:.2} ms direct, {:.2} ms bridged, {:.2} % (command fetch {:.3} ms, copies {:.3} ms, synchronizations {:.3} ms, submissions {:.3} ms on the critical path)",
        r.predicted_direct.job_ns / 1e6,
        p.job_ns / 1e6,
        (p.job_ns / r.predicted_direct.job_ns - 1.0) * 100.0,
        p.added.command_fetch_ns / 1e6,
        p.added.copies_ns / 1e6,
        p.added.synchronizations_ns / 1e6,
        p.added.submissions_ns / 1e6
    );
    outln!(
        "           blind: its link calibrated before the replay; baselines: no overhead 0 %, bandwidth alone {:.2} %",
        r.bandwidth_only_overhead_percent()
    );
    match r.crosses_10_percent_at_rtt_us {
        Some(0.0) => outln!("  over 10 % at any round trip: the link's rate alone puts it there"),
        Some(x) => outln!("  the model crosses 10 % at a round trip of {x:.1} µs"),
        None => outln!("  the model never crosses 10 % (up to a round trip of 1 s)"),
    }
}

/// Runs `dxpu replay`.
pub(crate) fn run_replay(args: ReplayArgs) -> ExitCode {
    // One unit, placed by the replays' `N of M`; its few steps each said.
    let steps = crate::out::Steps::counted("replay", 1).with_every_detail(true);
    steps.step(&format!("{}", args.trace.display()));
    let r = run(&args, &mut |s| steps.detail(s));
    drop(steps);
    match r {
        Ok(r) if args.json => {
            outln!("{}", crate::out::json(report_json(&r, &args)));
            ExitCode::SUCCESS
        }
        Ok(r) => {
            print_report(&r, &args);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dxpu replay: {e}");
            ExitCode::FAILURE
        }
    }
}
