//! `dxpu replay TRACE`: a PyTorch profiler trace replayed on the simgpu at the speed the
//! traced GPU ran it, directly attached and through both endpoints over UDP loopback, in
//! turns; the overhead, where the added time went, and what the model predicts from the
//! trace and the link measured (`lab::replay`, `lab::plan`; docs/performance-model.md).

use std::process::ExitCode;

use clap::Args;
use lab::compare::{CompareOptions, Comparison, report};
use link::driver::Impairment;

use crate::args::{EndpointArgs, ImpairArgs};

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

fn run(args: &ReplayArgs, progress: &mut dyn FnMut(&str)) -> Result<(Comparison, CompareOptions), String> {
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
    Ok((lab::compare::compare(trace, &opts, progress)?, opts))
}

/// Runs `dxpu replay`.
pub(crate) fn run_replay(args: ReplayArgs) -> ExitCode {
    // One unit, placed by the replays' `N of M`; its few steps each said.
    let steps = crate::out::Steps::counted("replay", 1).with_every_detail(true);
    steps.step(&format!("{}", args.trace.display()));
    let r = run(&args, &mut |s| steps.detail(s));
    drop(steps);
    let (r, options) = match r {
        Ok(done) => done,
        Err(e) => {
            eprintln!("dxpu replay: {e}");
            return ExitCode::FAILURE;
        }
    };
    let trace = args.trace.display().to_string();
    let asked = report::Asked { trace: &trace, options: &options, rate_gbit: args.rate_gbit };
    match args.json {
        true => outln!("{}", crate::out::json(report::json(&r, &asked))),
        false => out!("{}", report::text(&r, &asked)),
    }
    ExitCode::SUCCESS
}
