//! The chaos soak's report, as text and as JSON.

use serde_json::{Value, json};

use super::ChaosOutcome;
use super::parts::ChaosOptions;
use crate::report::say;

/// The object `dxpu bench chaos --json` prints and DIR/chaos.json holds (docs/cli.md).
pub fn json(args: &ChaosOptions, o: &ChaosOutcome) -> Value {
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
pub fn text(args: &ChaosOptions, o: &ChaosOutcome) -> String {
    let mut out = String::new();
    let (dir, tally, rss, ok) = (&o.dir, &o.tally, &o.rss, o.ok);
    let (failed, owner_events, violations) = (o.failed(), o.owner_events, &o.violations);
    say!(out, "dxpu bench chaos — seed {}, {:.1} min, in {}", args.seed, args.minutes, dir.display());
    say!(
        out,
        "  workload runs: {} ({} verified, {} failed with a named reason, {} unexplained)",
        tally.runs,
        tally.verified,
        failed,
        tally.unexplained.len()
    );
    for (why, n) in &tally.failed {
        say!(out, "    {n:>5}  {why}");
    }
    for u in &tally.unexplained {
        say!(out, "    unexplained: {u}");
    }
    say!(out, "  faults injected:");
    for (what, n) in &tally.faults {
        say!(out, "    {n:>5}  {what}");
    }
    say!(
        out,
        "  ownership: {} events in the boxes' logs, {} two-owner violations",
        owner_events,
        violations.len()
    );
    for v in violations {
        say!(out, "    {v}");
    }
    say!(
        out,
        "  box-a: {} probes of its control socket and metrics, {} failed, slowest {:.0} ms; RSS {} KiB after the warm-up → {} KiB at the end ({})",
        tally.probes,
        tally.probe_failures.len(),
        tally.probe_max.as_secs_f64() * 1e3,
        rss.after_warmup,
        rss.last,
        if rss.flat { "flat" } else { "GROWING" }
    );
    for p in &tally.probe_failures {
        say!(out, "    {p}");
    }
    say!(out, "  {}", if ok { "every run accounted for; no device had two owners" } else { "FAILED" });
    out
}
