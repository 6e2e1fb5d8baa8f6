//! `dxpu bench chaos`: its options, and its report as text or JSON; the soak is
//! `lab::chaos` (docs/reliability.md says what it injects and what must hold).

use std::path::PathBuf;

use clap::Args;
use lab::chaos::{ChaosOptions, ChaosOutcome};
use serde_json::json;

/// Options of `dxpu bench chaos`.
#[derive(Args, Debug)]
pub(crate) struct ChaosBench {
    /// How long to inject faults, in minutes (0.1..=1440).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// The seed of the fault schedule: the same seed, the same faults in the same order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the configuration files, logs and `chaos.json` go (default: a new directory
    /// under the system's temporary directory, kept).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the soak; whether everything that must hold held.
pub(crate) fn run_chaos(args: ChaosBench) -> Result<bool, String> {
    let dxpu = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let opts = ChaosOptions { minutes: args.minutes, seed: args.seed, dir: args.dir.clone(), dxpu };
    let steps = crate::out::Steps::counted("bench chaos", 1);
    let o = lab::chaos::soak(&opts, &crate::interrupt::requested, &mut |at, what| steps.at(at, what))
        .map_err(|e| e.to_string())?;
    drop(steps);
    let report = report_json(&args, &o);
    let _ = std::fs::write(o.dir.join("chaos.json"), format!("{}\n", crate::out::json_pretty(&report)));
    if args.json {
        outln!("{}", crate::out::json(report));
    } else {
        print_text(&args, &o);
    }
    Ok(o.ok)
}

fn report_json(args: &ChaosBench, o: &ChaosOutcome) -> serde_json::Value {
    let t = &o.tally;
    json!({
        "seed": args.seed,
        "minutes": args.minutes,
        "runs": t.runs,
        "verified": t.verified,
        "failed": o.failed(),
        "failed_by_reason": t.failed,
        "unexplained": t.unexplained,
        "faults": t.faults,
        "ownership_events": o.owner_events,
        "two_owner_violations": o.violations,
        "probes": t.probes,
        "probe_failures": t.probe_failures,
        "probe_max_ms": t.probe_max.as_secs_f64() * 1e3,
        "box_a_rss": {
            "after_warmup_kib": o.rss.after_warmup,
            "last_kib": o.rss.last,
            "samples": t.rss.len(),
            "flat": o.rss.flat,
            "series_seconds_kib": t.rss.iter().map(|&(s, kb)| json!([(s * 10.0).round() / 10.0, kb])).collect::<Vec<_>>(),
        },
        "ok": o.ok,
        "dir": o.dir.display().to_string(),
    })
}

/// The soak's report as text.
fn print_text(args: &ChaosBench, o: &ChaosOutcome) {
    let (dir, tally, rss, ok) = (&o.dir, &o.tally, &o.rss, o.ok);
    let (failed, owner_events, violations) = (o.failed(), o.owner_events, &o.violations);
    outln!("dxpu bench chaos — seed {}, {:.1} min, in {}", args.seed, args.minutes, dir.display());
    outln!(
        "  workload runs: {} ({} verified, {} failed with a named reason, {} unexplained)",
        tally.runs,
        tally.verified,
        failed,
        tally.unexplained.len()
    );
    for (why, n) in &tally.failed {
        outln!("    {n:>5}  {why}");
    }
    for u in &tally.unexplained {
        outln!("    unexplained: {u}");
    }
    outln!("  faults injected:");
    for (what, n) in &tally.faults {
        outln!("    {n:>5}  {what}");
    }
    outln!(
        "  ownership: {} events in the boxes' logs, {} two-owner violations",
        owner_events,
        violations.len()
    );
    for v in violations {
        outln!("    {v}");
    }
    outln!(
        "  box-a: {} probes of its control socket and metrics, {} failed, slowest {:.0} ms; RSS {} KiB after the warm-up → {} KiB at the end ({})",
        tally.probes,
        tally.probe_failures.len(),
        tally.probe_max.as_secs_f64() * 1e3,
        rss.after_warmup,
        rss.last,
        if rss.flat { "flat" } else { "GROWING" }
    );
    for p in &tally.probe_failures {
        outln!("    {p}");
    }
    outln!("  {}", if ok { "every run accounted for; no device had two owners" } else { "FAILED" });
}
