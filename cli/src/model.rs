//! `dxpu model`: a workload's bridged time and overhead predicted at a list of round-trip
//! times, from its transaction profile — counted here with runs on a directly attached
//! simgpu, or read from `dxpu loopback --json` — and the link's bandwidth and per-TLP cost
//! (`lab::model`; docs/performance-model.md).

use std::process::ExitCode;

use clap::Args;
use lab::model::report::{MeasureLink, ModelOptions, predict_all, predict_trace};
use lab::model::{Profile, profile_from_json};
use serde_json::Value;

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

/// The most a `--profile` file may hold: a `loopback --json` report is a few KiB.
const MAX_PROFILE_BYTES: u64 = 16 << 20;

/// The profile, direct time and workload name from a `loopback --json` file.
fn read_profile(path: &std::path::Path) -> Result<(String, Profile, f64), String> {
    use std::io::Read;
    let at = |e: String| format!("--profile {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(|e| at(e.to_string()))?;
    // A regular file, read to a bound: a device or FIFO could be read without end.
    if !file.metadata().map_err(|e| at(e.to_string()))?.is_file() {
        return Err(at("not a regular file: give the file `dxpu loopback --json` wrote".into()));
    }
    let mut text = String::new();
    file.take(MAX_PROFILE_BYTES + 1).read_to_string(&mut text).map_err(|e| at(e.to_string()))?;
    if text.len() as u64 > MAX_PROFILE_BYTES {
        return Err(at(format!("over {MAX_PROFILE_BYTES} bytes: not a `dxpu loopback --json` report")));
    }
    let v: Value = serde_json::from_str(&text).map_err(|e| at(format!("not JSON: {e}")))?;
    let profile = profile_from_json(v.get("profile").ok_or_else(|| at("no \"profile\" object".into()))?)
        .map_err(|e| at(e.to_string()))?;
    let direct = v
        .get("direct_seconds")
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("--profile {}: no \"direct_seconds\" number", path.display()))?;
    let workload = v.get("workload").and_then(Value::as_str).unwrap_or("unnamed").to_string();
    Ok((workload, profile, direct))
}

impl ModelArgs {
    /// What the options ask `lab::model::report` for.
    fn options(&self) -> Result<ModelOptions, String> {
        if self.rtt_us.is_empty() {
            return Err("--rtt-us: give at least one round-trip time".into());
        }
        let measure = match self.measure_link {
            true => Some(MeasureLink {
                delay_us: self.delay_us,
                placement: crate::args::PinArg::Auto.placement(&lab::affinity::allowed()?)?,
            }),
            false => None,
        };
        Ok(ModelOptions {
            rtt_us: self.rtt_us.clone(),
            bandwidth_gbit: self.bandwidth_gbit,
            per_tlp_us: self.per_tlp_us,
            measure,
        })
    }
}

/// The report `args` asks for: text, or one line of JSON with `--json`.
fn run(args: &ModelArgs) -> Result<String, String> {
    let options = args.options()?;
    // The measuring's steps, with `--measure-link`: off the screen before the report.
    let steps = args.measure_link.then(|| crate::out::Steps::new("model").with_every_detail(true));
    let mut progress = |s: &str| steps.iter().for_each(|st| st.detail(s));
    if let Some(path) = &args.trace {
        let limits = lab::trace::ReadLimits { max_bytes: args.max_trace_bytes };
        let trace =
            lab::trace::read_with(path, lab::trace::Pick { rank: args.rank, device: args.device }, limits)
                .map_err(|e| format!("--trace {e}"))?;
        let r = predict_trace(path.display().to_string(), trace, &options, &mut progress)?;
        return Ok(if args.json { crate::out::json(r.json()) + "\n" } else { r.text() });
    }
    let (workload, profile, direct) = match &args.profile {
        Some(path) => read_profile(path)?,
        None => {
            let w = args.workload.unwrap_or(WorkloadArg::Demo);
            let (profile, direct) =
                lab::loopback::count_direct(w.workload(args.scale, args.batch, args.layers)?, args.repeat)?;
            (w.name().to_string(), profile, direct.median)
        }
    };
    let r = predict_all(workload, profile, direct, &options, &mut progress)?;
    Ok(if args.json { crate::out::json(r.json()) + "\n" } else { r.text() })
}

pub(crate) fn run_model(args: ModelArgs) -> ExitCode {
    let report = match run(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("dxpu model: {e}");
            return ExitCode::FAILURE;
        }
    };
    out!("{report}");
    ExitCode::SUCCESS
}
