//! `dxpu model`: a workload's bridged time and overhead predicted at a list of round-trip
//! times, from its transaction profile — counted here with runs on a directly attached
//! simgpu, or read from `dxpu loopback --json` — and the link's bandwidth and per-TLP cost
//! (`lab::model`; docs/performance-model.md).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use driver::DriverStats;
use lab::model::{self, LinkParams, Profile};
use serde_json::{Value, json};
use testbed::direct::PlatformCounts;

use crate::args::WorkloadArg;

/// Options of `dxpu model`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ModelArgs {
    /// The workload whose profile to count, with runs on a directly attached simgpu
    /// (`demo` unless `--profile` or `--trace` is given).
    #[arg(long, value_enum, conflicts_with_all = ["profile", "trace"])]
    workload: Option<WorkloadArg>,
    /// Predict a job recorded by the PyTorch profiler instead (`torch.profiler`'s Chrome
    /// trace JSON, plain or gzip): its critical path with the link's round trip and rate
    /// added where its GPU would wait for them (docs/performance-model.md, "Your own job").
    #[arg(long, value_name = "TRACE", conflicts_with = "profile")]
    trace: Option<std::path::PathBuf>,
    /// With `--trace`: the distributed rank the trace must be of (its `distributedInfo`); a
    /// trace of another rank, or naming none, is refused.
    #[arg(long, requires = "trace")]
    rank: Option<u32>,
    /// With `--trace`: the GPU (device index) whose activities to take, where the file holds
    /// several.
    #[arg(long, requires = "trace")]
    device: Option<u32>,
    /// With `--trace`: the most bytes the file, and the JSON it inflates to, may have (a gzip
    /// file may not inflate past 100 times its size either).
    #[arg(long, requires = "trace", default_value_t = lab::trace::ReadLimits::default().max_bytes)]
    max_trace_bytes: u64,
    /// Read the profile and the direct time from this file, as `dxpu loopback --json` writes
    /// it, instead of counting them.
    #[arg(long, value_name = "FILE")]
    profile: Option<std::path::PathBuf>,
    /// Workload size, as `dxpu loopback --scale` (1..=32).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    scale: u32,
    /// Rows per request or micro-batch, as `dxpu loopback --batch`.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    batch: Option<u16>,
    /// Layers per inference request, as `dxpu loopback --layers`.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=32))]
    layers: Option<u16>,
    /// Direct runs counted (after one warm-up); the median time is the baseline (1..=100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// Round-trip times to predict at, µs, comma-separated (each 0..=1000000).
    #[arg(long, value_delimiter = ',', default_value = "0,5,10,20,50,100,200", value_parser = parse_rtt)]
    rtt_us: Vec<f64>,
    /// The link's bulk rate each way, Gbit/s (0.001..=1600): what the bridges move, not the
    /// wire's line rate. 25 unless given, or what `--measure-link` measured.
    #[arg(long, value_parser = parse_bandwidth)]
    bandwidth_gbit: Option<f64>,
    /// Measure the link as well (also `--calibrate`): the calibration `dxpu replay` makes
    /// before it replays, both endpoints over UDP loopback with `--delay-us` added each way —
    /// a register read's round trip (p50 of 300), posted writes, fences, copies each way at
    /// the trace's byte-median copy size (16 MiB without a trace; their median); the
    /// prediction at that round trip is added to the points, and the
    /// measured bulk rates are used unless `--bandwidth-gbit` is given. With `--trace` the
    /// round trip, posted write and fetch turns are what the bridges add to the direct
    /// simgpu's, so the prediction is the one `replay` prints, made blind.
    #[arg(long, alias = "calibrate")]
    measure_link: bool,
    /// With `--measure-link`: added one-way delay each way, µs (0..=10000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    delay_us: u64,
    /// The host's cost of sending one posted TLP, µs (0..=1000).
    #[arg(long, default_value_t = 0.0, value_parser = parse_per_tlp)]
    per_tlp_us: f64,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_in(s: &str, what: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{what} {s:?}: not a number"))?;
    if !v.is_finite() || !(lo..=hi).contains(&v) {
        return Err(format!("{what} {s}: must be {lo}..={hi}"));
    }
    Ok(v)
}

fn parse_rtt(s: &str) -> Result<f64, String> {
    parse_in(s, "round-trip time (µs)", 0.0, 1e6)
}

fn parse_bandwidth(s: &str) -> Result<f64, String> {
    parse_in(s, "bandwidth (Gbit/s)", 0.001, 1600.0)
}

fn parse_per_tlp(s: &str) -> Result<f64, String> {
    parse_in(s, "per-TLP cost (µs)", 0.0, 1000.0)
}

/// The profile as `loopback --json` carries it under `profile`.
pub(crate) fn profile_json(p: &Profile) -> Value {
    json!({
        "register_reads": p.platform.register_reads,
        "register_writes": p.platform.register_writes,
        "device_reads": p.platform.device_reads,
        "device_read_bytes": p.platform.device_read_bytes,
        "dependent_reads": p.platform.dependent_reads,
        "device_writes": p.platform.device_writes,
        "device_write_bytes": p.platform.device_write_bytes,
        "interrupts": p.platform.interrupts,
        "commands": p.driver.commands,
        "doorbells": p.driver.doorbells,
        "waits": p.waits(),
        "waits_polled": p.driver.waits_polled,
        "waits_interrupt": p.driver.waits_interrupt,
        "waits_idle": p.driver.waits_idle,
        "round_trips": p.round_trips(),
        "direct_h2d_bytes_per_s": p.direct_h2d_bytes_per_s,
        "direct_d2h_bytes_per_s": p.direct_d2h_bytes_per_s,
    })
}

/// A profile from [`profile_json`]'s object; the error names the field.
pub(crate) fn profile_from_json(v: &Value) -> Result<Profile, String> {
    let count = |k: &str| {
        v.get(k).and_then(Value::as_u64).ok_or_else(|| format!("profile.{k}: missing or not a count"))
    };
    let rate = |k: &str| match v.get(k).and_then(Value::as_f64) {
        Some(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(format!("profile.{k}: missing or not a rate ≥ 0")),
    };
    Ok(Profile {
        platform: PlatformCounts {
            register_reads: count("register_reads")?,
            register_writes: count("register_writes")?,
            device_reads: count("device_reads")?,
            device_read_bytes: count("device_read_bytes")?,
            dependent_reads: count("dependent_reads")?,
            device_writes: count("device_writes")?,
            device_write_bytes: count("device_write_bytes")?,
            interrupts: count("interrupts")?,
        },
        driver: DriverStats {
            commands: count("commands")?,
            doorbells: count("doorbells")?,
            waits_polled: count("waits_polled")?,
            waits_interrupt: count("waits_interrupt")?,
            waits_idle: count("waits_idle")?,
        },
        direct_h2d_bytes_per_s: rate("direct_h2d_bytes_per_s")?,
        direct_d2h_bytes_per_s: rate("direct_d2h_bytes_per_s")?,
    })
}

/// `--bandwidth-gbit` unless given: the path bandwidth the link's configuration assumes.
const DEFAULT_BANDWIDTH_GBIT: f64 = 25.0;

/// The link as `dxpu replay` calibrates it before replaying (`lab::compare::calibrate`:
/// both platforms, register reads, posted writes, fences, copies each way at `plan`'s
/// byte-median copy size, or 16 MiB without one), with
/// `delay_us` added each way and the spinning threads pinned where two CPUs allow. The
/// calibration's bridged link (what the bridges add to the direct platform's) for a trace's
/// plan; for a profile, whose model takes the whole round trip, the bridged platform's own.
fn measured_link(
    delay_us: u64,
    whole_round_trip: bool,
    plan: Option<&lab::plan::Plan>,
) -> Result<Measured, String> {
    use link::driver::{DriverKind, Impairment, PollMode};
    let opts = lab::compare::CompareOptions {
        repeat: 1,
        impairment: Impairment { delay: Duration::from_micros(delay_us), ..Impairment::default() },
        driver: DriverKind::Auto,
        poll: PollMode::Busy { spin: Duration::from_micros(2000) },
        placement: crate::args::PinArg::Auto.placement(&lab::affinity::allowed()?)?,
    };
    let steps = crate::out::Steps::new("model").with_every_detail(true);
    let c = lab::compare::calibrate(&opts, plan, &mut |s| steps.detail(s))?;
    let link = match whole_round_trip {
        true => LinkParams { rtt_ns: c.bridged.rtt.as_nanos() as f64, ..c.link },
        false => c.link,
    };
    Ok(Measured { link, cores: c.cores })
}

/// What `--measure-link` measured: the link, and where the spinning threads were placed
/// ((device's CPU, host's CPU), a cache line's round trip between them, ns): the rates
/// depend on it (`lab::cores`).
#[derive(Clone, Copy)]
pub(crate) struct Measured {
    pub(crate) link: LinkParams,
    pub(crate) cores: Option<((usize, usize), f64)>,
}

/// `measured_link` in a report's JSON: null where the link was not measured.
fn measured_json(m: Option<&Measured>) -> Value {
    json!(m.map(|m| json!({
        "rtt_us": m.link.rtt_ns / 1e3,
        "h2d_bytes_per_s": m.link.h2d_bytes_per_s,
        "d2h_bytes_per_s": m.link.d2h_bytes_per_s,
        "cpus": m.cores.map(|(c, _)| [c.0, c.1]),
        "core_round_trip_ns": m.cores.map(|(_, ns)| ns),
    })))
}

/// `measured`'s text line, where the link was measured.
fn print_measured(m: Option<&Measured>, delay_us: u64) {
    let Some(m) = m else { return };
    outln!(
        "  link measured over UDP loopback (+{delay_us} µs each way): round trip {:.1} µs, bulk {:.1} / {:.1} Gbit/s{}",
        m.link.rtt_ns / 1e3,
        m.link.h2d_bytes_per_s * 8e-9,
        m.link.d2h_bytes_per_s * 8e-9,
        m.cores.map_or(String::new(), |((d, h), ns)| format!(
            "; CPUs {d} and {h}, a cache line's round trip {ns:.0} ns"
        ))
    );
}

/// What `dxpu model` found: the workload, its profile, direct time and predictions.
pub(crate) struct ModelReport {
    pub(crate) workload: String,
    pub(crate) profile: Profile,
    pub(crate) direct_seconds: f64,
    pub(crate) link: LinkParams,
    /// The link `--measure-link` measured.
    pub(crate) measured: Option<Measured>,
    /// (RTT µs, prediction).
    pub(crate) points: Vec<(f64, model::Prediction)>,
    pub(crate) crosses_10_percent_at_rtt_us: Option<f64>,
}

impl ModelReport {
    pub(crate) fn json(&self) -> Value {
        let points: Vec<Value> = self
            .points
            .iter()
            .map(|(rtt, p)| {
                json!({"rtt_us": rtt, "predicted_overhead_percent": p.overhead_percent,
                       "predicted_bridged_seconds": p.bridged_seconds})
            })
            .collect();
        json!({
            "workload": self.workload,
            "direct_seconds": self.direct_seconds,
            "bandwidth_gbit_per_s": self.link.h2d_bytes_per_s * 8.0 / 1e9,
            "h2d_bytes_per_s": self.link.h2d_bytes_per_s,
            "d2h_bytes_per_s": self.link.d2h_bytes_per_s,
            "measured_link": measured_json(self.measured.as_ref()),
            "per_tlp_us": self.link.posted_write_ns / 1e3,
            "profile": profile_json(&self.profile),
            "points": points,
            "crosses_10_percent_at_rtt_us": self.crosses_10_percent_at_rtt_us,
        })
    }
}

fn predict_all(
    workload: String,
    profile: Profile,
    direct_seconds: f64,
    args: &ModelArgs,
) -> Result<ModelReport, String> {
    if direct_seconds.is_nan() || direct_seconds <= 0.0 || !direct_seconds.is_finite() {
        return Err(format!("direct time {direct_seconds} s: must be > 0"));
    }
    let measured = if args.measure_link { Some(measured_link(args.delay_us, true, None)?) } else { None };
    let base = base_link(args, measured.as_ref().map(|m| &m.link));
    let mut rtts = args.rtt_us.clone();
    if let Some(m) = &measured {
        rtts.push(m.link.rtt_ns / 1e3);
        rtts.sort_by(f64::total_cmp);
    }
    let points = rtts
        .iter()
        .map(|&rtt| {
            (rtt, model::predict(&profile, direct_seconds, &LinkParams { rtt_ns: rtt * 1e3, ..base }))
        })
        .collect();
    let crosses = model::crossing_rtt(&profile, direct_seconds, &base, 10.0).map(|s| s * 1e6);
    Ok(ModelReport {
        workload,
        profile,
        direct_seconds,
        link: base,
        measured,
        points,
        crosses_10_percent_at_rtt_us: crosses,
    })
}

/// The profile, direct time and workload name from a `loopback --json` file.
fn read_profile(path: &std::path::Path) -> Result<(String, Profile, f64), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("--profile {}: {e}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| format!("--profile {}: not JSON: {e}", path.display()))?;
    let at = |e: String| format!("--profile {}: {e}", path.display());
    let profile =
        profile_from_json(v.get("profile").ok_or_else(|| at("no \"profile\" object".into()))?).map_err(at)?;
    let direct = v
        .get("direct_seconds")
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("--profile {}: no \"direct_seconds\" number", path.display()))?;
    let workload = v.get("workload").and_then(Value::as_str).unwrap_or("unnamed").to_string();
    Ok((workload, profile, direct))
}

/// The link `--bandwidth-gbit` and `--measure-link` give, without its round trip.
fn base_link(args: &ModelArgs, measured: Option<&LinkParams>) -> LinkParams {
    let bw = args.bandwidth_gbit.unwrap_or(DEFAULT_BANDWIDTH_GBIT) * 1e9 / 8.0;
    let (h2d, d2h) = match (args.bandwidth_gbit, measured) {
        (None, Some(m)) => (m.h2d_bytes_per_s, m.d2h_bytes_per_s),
        _ => (bw, bw),
    };
    LinkParams {
        h2d_bytes_per_s: h2d,
        d2h_bytes_per_s: d2h,
        posted_write_ns: args.per_tlp_us * 1e3,
        ..LinkParams::LOCAL
    }
}

/// What `dxpu model --trace` found.
pub(crate) struct TraceReport {
    pub(crate) path: String,
    pub(crate) trace: lab::trace::Trace,
    pub(crate) plan: lab::plan::Plan,
    pub(crate) direct: lab::plan::Outcome,
    pub(crate) link: LinkParams,
    pub(crate) measured: Option<Measured>,
    /// (RTT µs, outcome).
    pub(crate) points: Vec<(f64, lab::plan::Outcome)>,
    pub(crate) crosses_10_percent_at_rtt_us: Option<f64>,
}

/// A trace's first report line, as `model --trace` and `replay` print it: its file, GPU and
/// counts.
pub(crate) fn trace_summary(path: &str, t: &lab::trace::Trace, plan: &lab::plan::Plan) -> String {
    let (kernels, copies, memsets) = t.counts();
    let mut line = format!(
        "{path} ({}): {kernels} kernels, {copies} copies, {memsets} memsets, {} synchronizations on {} streams, {} CPU threads",
        t.gpu.as_deref().unwrap_or("GPU unnamed"),
        t.syncs(),
        t.streams().len(),
        plan.threads
    );
    if plan.out_of_submission_order > 0 {
        line.push_str(&format!(
            "\n  reordered: {} activities ran before work submitted earlier on their stream (several threads, graph launches): each follows the latest one submitted before it",
            plan.out_of_submission_order
        ));
    }
    line.push_str(&format!("\n  dependencies: {}", dependencies(plan)));
    let sharing = plan.streams_sharing_channels(lab::replay::STREAM_CHANNELS);
    if sharing > 0 {
        line.push_str(&format!(
            "\n  channels: {sharing} streams beyond the simgpu's {} stream channels share them in turn: their work may wait for another stream's (a false serialization)",
            lab::replay::STREAM_CHANNELS
        ));
    }
    let (collectives, collective_ns) = t.collectives();
    if collectives > 0 {
        line.push_str(&format!(
            "\n  collectives: {collectives} NCCL/RCCL kernels, {} of GPU time, replayed as timers of their traced length: the other ranks and the network between the GPUs are not replayed",
            fmt_s(collective_ns as f64 / 1e9)
        ));
    }
    let a = &t.assumed;
    if a.bytes_from_calls + a.bytes_estimated > 0 {
        line.push_str(&format!(
            "\n  assumed: {} copies or memsets had no byte count in the trace: {} took their runtime call's size, {} their traced time at {:.2} GB/s",
            a.bytes_from_calls + a.bytes_estimated,
            a.bytes_from_calls,
            a.bytes_estimated,
            a.estimated_at_bytes_per_s / 1e9
        ));
    }
    line
}

/// Where the plan's dependencies came from: the trace's own synchronization events, CUDA's
/// documented rules, or timing.
fn dependencies(p: &lab::plan::Plan) -> String {
    let stated = if p.explicit {
        format!("as the trace's cuda_sync events state them ({} stream waits on events)", p.stated_waits)
    } else {
        "the trace has no cuda_sync events (PyTorch before 2.3, or recorded without them)".to_string()
    };
    let mut s = format!(
        "{stated}; inferred from timing: {} cross-stream waits, {} synchronizations' streams; {} synchronous copies or frees wait as CUDA documents",
        p.cross_stream_waits, p.syncs_inferred, p.implicit_syncs
    );
    if p.awaits_contradicted > 0 {
        s.push_str(&format!(
            "; {} synchronizations whose awaited work the trace ends after their return keep their traced time",
            p.awaits_contradicted
        ));
    }
    s
}

/// A trace's counts and span, as `model --trace` and `replay` report them.
pub(crate) fn trace_json(path: &str, t: &lab::trace::Trace) -> serde_json::Map<String, Value> {
    let (kernels, copies, memsets) = t.counts();
    let mut m = serde_json::Map::new();
    m.insert("trace".into(), json!(path));
    m.insert("gpu".into(), json!(t.gpu));
    m.insert("kernels".into(), json!(kernels));
    m.insert("copies".into(), json!(copies));
    m.insert("memsets".into(), json!(memsets));
    m.insert("syncs".into(), json!(t.syncs()));
    m.insert("trace_span_ms".into(), json!(t.gpu_span_ns() as f64 / 1e6));
    m.insert(
        "assumed".into(),
        json!({
            "bytes_from_calls": t.assumed.bytes_from_calls,
            "bytes_estimated": t.assumed.bytes_estimated,
            "estimated_at_bytes_per_s": t.assumed.estimated_at_bytes_per_s,
        }),
    );
    m.insert("unmatched_launches".into(), json!(t.unmatched_launches));
    let (collectives, collective_ns) = t.collectives();
    m.insert(
        "collectives".into(),
        json!({
            "kernels": collectives,
            "traced_ms": collective_ns as f64 / 1e6,
            "replayed_as": "timers of their traced length; other ranks and the network between GPUs are not replayed",
        }),
    );
    m.insert("sync_events".into(), json!(t.sync_events));
    m
}

/// What the plan made of the trace, with what it inferred or changed: where its dependencies
/// came from (stated by the trace, documented by CUDA, inferred from timing), nested calls
/// folded into their outer call, activities that could not follow their stream predecessor
/// by start (it was submitted later).
pub(crate) fn plan_json(p: &lab::plan::Plan) -> Value {
    json!({
        "calls": p.calls.len(),
        "threads": p.threads,
        "dependencies_stated": p.explicit,
        "stated_stream_waits": p.stated_waits,
        "cross_stream_waits": p.cross_stream_waits,
        "syncs_inferred": p.syncs_inferred,
        "implicit_syncs": p.implicit_syncs,
        "awaits_contradicted": p.awaits_contradicted,
        "streams_sharing_channels": p.streams_sharing_channels(lab::replay::STREAM_CHANNELS),
        "nested_calls": p.nested,
        "out_of_submission_order": p.out_of_submission_order,
        "before_their_call": p.before_their_call,
    })
}

/// Where the link's time went on the critical path, ms.
pub(crate) fn added_json(a: &lab::plan::AddedTime) -> Value {
    json!({
        "command_fetch_ms": a.command_fetch_ns / 1e6,
        "copies_ms": a.copies_ns / 1e6,
        "synchronizations_ms": a.synchronizations_ns / 1e6,
        "submissions_ms": a.submissions_ns / 1e6,
    })
}

impl TraceReport {
    pub(crate) fn json(&self) -> Value {
        let direct = self.direct.job_ns;
        let points: Vec<Value> = self
            .points
            .iter()
            .map(|(rtt, o)| {
                json!({"rtt_us": rtt, "predicted_overhead_percent": (o.job_ns / direct - 1.0) * 100.0,
                       "predicted_bridged_seconds": o.job_ns / 1e9, "added": added_json(&o.added)})
            })
            .collect();
        let mut m = trace_json(&self.path, &self.trace);
        m.insert("workload".into(), json!("trace"));
        m.insert("direct_seconds".into(), json!(direct / 1e9));
        m.insert("bandwidth_gbit_per_s".into(), json!(self.link.h2d_bytes_per_s * 8.0 / 1e9));
        m.insert("h2d_bytes_per_s".into(), json!(self.link.h2d_bytes_per_s));
        m.insert("d2h_bytes_per_s".into(), json!(self.link.d2h_bytes_per_s));
        m.insert("measured_link".into(), measured_json(self.measured.as_ref()));
        m.insert("profile".into(), Value::Null);
        m.insert("plan".into(), plan_json(&self.plan));
        m.insert("points".into(), Value::Array(points));
        m.insert("crosses_10_percent_at_rtt_us".into(), json!(self.crosses_10_percent_at_rtt_us));
        Value::Object(m)
    }
}

fn run_trace(path: &std::path::Path, args: &ModelArgs) -> Result<TraceReport, String> {
    let limits = lab::trace::ReadLimits { max_bytes: args.max_trace_bytes };
    let trace =
        lab::trace::read_with(path, lab::trace::Pick { rank: args.rank, device: args.device }, limits)
            .map_err(|e| format!("--trace {e}"))?;
    let plan = lab::plan::Plan::of(&trace);
    let measured =
        if args.measure_link { Some(measured_link(args.delay_us, false, Some(&plan))?) } else { None };
    let mut link = base_link(args, measured.as_ref().map(|m| &m.link));
    if let Some(m) = measured.filter(|_| args.per_tlp_us == 0.0) {
        (link.posted_write_ns, link.fetch_extra_ns) = (m.link.posted_write_ns, m.link.fetch_extra_ns);
    }
    let mut rtts = args.rtt_us.clone();
    if let Some(m) = &measured {
        rtts.push(m.link.rtt_ns / 1e3);
        rtts.sort_by(f64::total_cmp);
    }
    let direct = plan.evaluate(&LinkParams::LOCAL);
    let points =
        rtts.iter().map(|&rtt| (rtt, plan.evaluate(&LinkParams { rtt_ns: rtt * 1e3, ..link }))).collect();
    let crosses = plan.crossing_rtt_ns(&link, 10.0).map(|ns| ns / 1e3);
    Ok(TraceReport {
        path: path.display().to_string(),
        trace,
        plan,
        direct,
        link,
        measured,
        points,
        crosses_10_percent_at_rtt_us: crosses,
    })
}

fn print_trace(r: &TraceReport, delay_us: u64) {
    let t = &r.trace;
    outln!("dxpu model — trace {}", trace_summary(&r.path, t, &r.plan));
    outln!(
        "  the trace: GPU span {}, job {} (first call to last return)",
        fmt_s(t.gpu_span_ns() as f64 / 1e9),
        fmt_s(r.direct.job_ns / 1e9),
    );
    outln!("  link {:.1} / {:.1} Gbit/s", r.link.h2d_bytes_per_s * 8e-9, r.link.d2h_bytes_per_s * 8e-9);
    print_measured(r.measured.as_ref(), delay_us);
    outln!();
    outln!(
        "  {:>10}  {:>14}  {:>10}   {:>12} {:>12} {:>12}",
        "RTT µs",
        "bridged",
        "overhead",
        "fetch ms",
        "copies ms",
        "syncs ms"
    );
    for (rtt, o) in &r.points {
        let mark = if r.measured.is_some_and(|m| m.link.rtt_ns / 1e3 == *rtt) { "  (measured)" } else { "" };
        outln!(
            "  {:>10.1}  {:>14}  {:>9.2} %   {:>12.3} {:>12.3} {:>12.3}{mark}",
            rtt,
            fmt_s(o.job_ns / 1e9),
            (o.job_ns / r.direct.job_ns - 1.0) * 100.0,
            o.added.command_fetch_ns / 1e6,
            o.added.copies_ns / 1e6,
            o.added.synchronizations_ns / 1e6
        );
    }
    outln!("  (fetch, copies, syncs: the link's time on the bridged critical path)");
    match r.crosses_10_percent_at_rtt_us {
        Some(0.0) => outln!("  over 10 % at any round trip: the link's rate alone puts it there"),
        Some(x) => outln!("  crosses 10 % at a round trip of {x:.1} µs"),
        None => outln!("  never crosses 10 % (up to a round trip of 1 s)"),
    }
}

fn run(args: &ModelArgs) -> Result<ModelReport, String> {
    if args.rtt_us.is_empty() {
        return Err("--rtt-us: give at least one round-trip time".into());
    }
    match &args.profile {
        Some(path) => {
            let (workload, profile, direct) = read_profile(path)?;
            predict_all(workload, profile, direct, args)
        }
        None => {
            let w = args.workload.unwrap_or(WorkloadArg::Demo);
            let (profile, direct) =
                lab::loopback::count_direct(w.workload(args.scale, args.batch, args.layers)?, args.repeat)?;
            predict_all(w.name().to_string(), profile, direct.median, args)
        }
    }
}

fn fmt_s(s: f64) -> String {
    testbed::workload::human(Duration::from_secs_f64(s.max(0.0)))
}

pub(crate) fn run_model(args: ModelArgs) -> ExitCode {
    if let Some(path) = &args.trace {
        if args.rtt_us.is_empty() {
            eprintln!("dxpu model: --rtt-us: give at least one round-trip time");
            return ExitCode::FAILURE;
        }
        return match run_trace(path, &args) {
            Ok(r) if args.json => {
                outln!("{}", crate::out::json(r.json()));
                ExitCode::SUCCESS
            }
            Ok(r) => {
                print_trace(&r, args.delay_us);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dxpu model: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let r = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dxpu model: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        outln!("{}", crate::out::json(r.json()));
        return ExitCode::SUCCESS;
    }
    let p = &r.profile;
    outln!("dxpu model — workload {}: direct {} per run", r.workload, fmt_s(r.direct_seconds));
    outln!(
        "  profile (one run): {} register reads, {} posted register writes, {} device reads ({} dependent, {} KiB), {} device writes ({} KiB), {} interrupts, {} waits ({} with the device idle)",
        p.platform.register_reads,
        p.platform.register_writes,
        p.platform.device_reads,
        p.platform.dependent_reads,
        p.platform.device_read_bytes >> 10,
        p.platform.device_writes,
        p.platform.device_write_bytes >> 10,
        p.platform.interrupts,
        p.waits(),
        p.driver.waits_idle
    );
    outln!(
        "  round trips on the critical path: {}; link {:.1} / {:.1} Gbit/s, {:.2} µs per posted TLP",
        p.round_trips(),
        r.link.h2d_bytes_per_s * 8e-9,
        r.link.d2h_bytes_per_s * 8e-9,
        args.per_tlp_us
    );
    print_measured(r.measured.as_ref(), args.delay_us);
    outln!();
    outln!("  {:>10}  {:>14}  {:>10}", "RTT µs", "bridged", "overhead");
    for (rtt, pr) in &r.points {
        let mark = if r.measured.is_some_and(|m| m.link.rtt_ns / 1e3 == *rtt) { "  (measured)" } else { "" };
        outln!("  {:>10.1}  {:>14}  {:>9.1} %{mark}", rtt, fmt_s(pr.bridged_seconds), pr.overhead_percent);
    }
    match r.crosses_10_percent_at_rtt_us {
        Some(0.0) => outln!("  over 10 % at any round trip: the bandwidth term alone exceeds it"),
        Some(x) => outln!("  crosses 10 % at a round trip of {x:.1} µs"),
        None => outln!("  never crosses 10 %: nothing on its critical path crosses the link"),
    }
    ExitCode::SUCCESS
}
