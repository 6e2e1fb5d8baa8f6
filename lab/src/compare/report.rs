//! What `dxpu replay` reports, as text and as JSON (docs/cli.md): the trace and its plan, each
//! side's link and waits, the overhead both ways, whether the run was faithful, where the
//! cores were, and the model's blind prediction beside the measurement.

use serde_json::{Value, json};

use super::{CompareOptions, Comparison, Side, spread};
use crate::harness::Spread;
use crate::model::report::{added_json, plan_json, trace_json, trace_summary};
use crate::replay::ReplayRun;
use crate::report::say;
use crate::steal;

/// What the replay was asked for, as the report names it: the trace's file, the comparison's
/// options, and the link's rate each way in Gbit/s as given (0: the loopback's own).
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    /// The trace's file, as given.
    pub trace: &'a str,
    /// The comparison's options.
    pub options: &'a CompareOptions,
    /// The link's rate each way, Gbit/s, as given (0: the loopback's own).
    pub rate_gbit: f64,
}

impl Asked<'_> {
    fn delay_us(&self) -> u64 {
        self.options.impairment.delay.as_micros() as u64
    }
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
        // The share of those copies' time the replay's thread served the platform.
        "h2d_served_share_in_replay": s.served_in_replay().0,
        "d2h_served_share_in_replay": s.served_in_replay().1,
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
        crate::report::spread(&mut v, key, spread(&s.runs, |r| f(r) / 1e9));
    }
    v
}

/// The object `dxpu replay --json` prints.
pub fn json(r: &Comparison, args: &Asked<'_>) -> Value {
    let d = spread(&r.direct.runs, |r| r.job_ns / 1e9);
    let b = spread(&r.bridged.runs, |r| r.job_ns / 1e9);
    let o = Spread::of(r.overheads.iter().copied());
    let predicted_overhead = r.predicted_overhead_percent();
    let by_pair = (!r.pair_predictions.is_empty()).then(|| Spread::of(r.pair_predictions.iter().copied()));
    let mut m = trace_json(args.trace, &r.trace);
    m.insert("plan".into(), plan_json(&r.plan));
    m.insert("copies_capped".into(), json!(r.bridged.runs.first().map_or(0, |run| run.copies_capped)));
    m.insert("repeat".into(), json!(args.options.repeat));
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
    // Each pair's overhead beside what its bridged run's link did to recover frames.
    m.insert(
        "pairs".into(),
        json!(
            r.overheads
                .iter()
                .zip(&r.recovery)
                .zip(r.taken.iter().zip(r.stolen_from().into_iter().zip(r.contended())))
                .zip(&r.pair_predictions)
                .map(|(((o, k), (t, (stolen, contended))), predicted)| json!({
                    "overhead_percent": o,
                    "predicted_overhead_percent": predicted,
                    "replay_timeouts": k.replay_timeouts,
                    "retransmits": k.retransmits,
                    "duplicates_received": k.duplicates_received,
                    "steal_ms": t.steal_ms(),
                    "stolen_from": stolen,
                    "waited_ms": t.waited_ms(),
                    "contended": contended,
                }))
                .collect::<Vec<_>>()
        ),
    );
    m.insert("pairs_stolen_from".into(), json!(steal::count(&r.stolen_from())));
    m.insert("pairs_contended".into(), json!(steal::count(&r.contended())));
    m.insert("cores_moved".into(), json!(r.cores.as_ref().map(|c| c.moved())));
    m.insert("cores_moved_because".into(), json!(r.cores.as_ref().and_then(|c| c.why_moved())));
    m.insert("rtt_us".into(), json!(r.bridged.rtt.as_secs_f64() * 1e6));
    m.insert("delay_us".into(), json!(args.delay_us()));
    m.insert("loss_ratio".into(), json!(args.options.impairment.loss));
    m.insert("rate_gbit_per_s".into(), json!(args.rate_gbit));
    m.insert("direct".into(), side_json(&r.direct));
    m.insert("bridged".into(), side_json(&r.bridged));
    m.insert(
        "model".into(),
        json!({
            "predicted_direct_seconds": r.predicted_direct.job_ns / 1e9,
            "predicted_bridged_seconds": r.predicted_bridged.job_ns / 1e9,
            "predicted_overhead_percent": predicted_overhead,
            // From a calibration just before each pair (the median; pairs[] has each).
            "predicted_overhead_percent_by_pair": by_pair.as_ref().map(|p| p.median),
            "predicted_overhead_percent_by_pair_min": by_pair.as_ref().map(|p| p.min),
            "predicted_overhead_percent_by_pair_max": by_pair.as_ref().map(|p| p.max),
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
    crate::report::spread(&mut v, "direct_seconds", d);
    crate::report::spread(&mut v, "bridged_seconds", b);
    crate::report::spread(&mut v, "overhead_percent", o);
    // The pairs the machine took no share of (none where nothing was read, or every pair
    // was taken from).
    match untaken(r) {
        Some(u) => crate::report::spread(&mut v, "overhead_percent_not_taken", u),
        None => {
            for k in [
                "overhead_percent_not_taken",
                "overhead_percent_not_taken_min",
                "overhead_percent_not_taken_max",
            ] {
                v[k] = Value::Null;
            }
        }
    }
    crate::report::spread(
        &mut v,
        "overhead_against_trace_percent",
        Spread::of(r.overheads_against_trace().into_iter()),
    );
    v
}

/// The overhead both ways, and each pair's beside its link's recovery.
fn overheads(out: &mut String, r: &Comparison) {
    let o = Spread::of(r.overheads.iter().copied());
    say!(out, "  overhead {:.2} % ({:.2}–{:.2}, {} pairs)", o.median, o.min, o.max, r.overheads.len());
    say!(
        out,
        "  pairs (overhead; the bridged link's replay timeouts, frames resent, duplicates received; direct / bridged, the hypervisor's steal and the threads' run-queue waits): {}",
        pairs(r)
    );
    let pairs = r.overheads.len();
    if let Some(n) = steal::count(&r.stolen_from()).filter(|n| *n > 0) {
        say!(out, "{}", steal::stolen_line(n, pairs, "the job"));
    }
    if let Some(n) = steal::count(&r.contended()).filter(|n| *n > 0) {
        say!(out, "{}", steal::contended_line(n, pairs, "the job"));
    }
    if let Some(n) = steal::count(&r.taken_from()).filter(|n| *n > 0) {
        match untaken(r) {
            Some(o) => say!(
                out,
                "  the {} pairs the machine took nothing from: overhead {:.2} % ({:.2}–{:.2})",
                pairs - n,
                o.median,
                o.min,
                o.max
            ),
            None => say!(
                out,
                "  no pair the machine took nothing from: the overhead above measured it, not the job"
            ),
        }
    }
    let t = Spread::of(r.overheads_against_trace().into_iter());
    say!(
        out,
        "  against the trace's own job ({:.2} ms): bridged {:.2} % ({:.2}–{:.2})",
        r.trace_job_ns / 1e6,
        t.median,
        t.min,
        t.max
    );
}

/// Each pair's overhead, what its bridged run's link did to recover frames, and what the
/// machine took during its direct and bridged run.
fn pairs(r: &Comparison) -> String {
    let each = r.overheads.iter().zip(&r.recovery).zip(&r.taken).map(|((o, k), t)| {
        format!(
            "{o:.1} % ({}, {}, {}; {})",
            k.replay_timeouts,
            k.retransmits,
            k.duplicates_received,
            t.text()
        )
    });
    each.collect::<Vec<_>>().join("; ")
}

/// The overhead of the pairs the machine took no share of; `None` where there is none, or
/// nothing was read.
fn untaken(r: &Comparison) -> Option<Spread> {
    let kept: Vec<f64> =
        r.overheads.iter().zip(r.taken_from()).filter(|(_, f)| *f == Some(false)).map(|(o, _)| *o).collect();
    (!kept.is_empty()).then(|| Spread::of(kept.into_iter()))
}

/// The report `dxpu replay` prints.
pub fn text(r: &Comparison, args: &Asked<'_>) -> String {
    let mut out = String::new();
    let t = &r.trace;
    let ms = |s: Spread| format!("{:.2} ms ({:.2}–{:.2})", s.median, s.min, s.max);
    say!(out, "dxpu replay — {}", trace_summary(args.trace, t, &r.plan));
    say!(
        out,
        "  the trace: GPU span {:.2} ms; link +{} µs each way{}{}",
        t.gpu_span_ns() as f64 / 1e6,
        args.delay_us(),
        if args.options.impairment.loss > 0.0 {
            format!(", {:.1} % loss", args.options.impairment.loss * 100.0)
        } else {
            String::new()
        },
        if args.rate_gbit > 0.0 { format!(", {} Gbit/s", args.rate_gbit) } else { String::new() }
    );
    let capped = r.bridged.runs.first().map_or(0, |run| run.copies_capped);
    if capped > 0 {
        say!(
            out,
            "  capped: {capped} copies larger than {} MiB moved only that much (held to their traced time)",
            crate::replay::MAX_COPY_BYTES >> 20
        );
    }
    if let Some(run) = r.bridged.runs.last() {
        say!(
            out,
            "  verified: each activity ran its traced time after what the trace says it waits for; copies read back where they landed, their own bytes: in {} of {}, out {} of {} (the others' places were taken by later copies first)",
            run.copies_checked.0,
            run.copies_made.0,
            run.copies_checked.1,
            run.copies_made.1
        );
    }
    for (name, s) in [("direct", &r.direct), ("bridged", &r.bridged)] {
        say!(
            out,
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
                    let (sh, sd) = s.served_in_replay();
                    let share = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0} %", v * 100.0));
                    format!(
                        ", {} / {} in the replay (served on the job's thread {} / {} of their time)",
                        r(h2d),
                        r(d2h),
                        share(sh),
                        share(sd)
                    )
                }
            }
        );
        say!(
            out,
            "           waits: command fetch {}, copies beyond their traced time {}, synchronizations seen {}, submissions late {}",
            ms(spread(&s.runs, |r| r.fetch_wait_ns / 1e6)),
            ms(spread(&s.runs, |r| r.copy_extra_ns / 1e6)),
            ms(spread(&s.runs, |r| r.sync_notify_ns / 1e6)),
            ms(spread(&s.runs, |r| r.host_late_ns / 1e6))
        );
    }
    overheads(&mut out, r);
    if let Some(why) = r.faithfulness.why_not() {
        say!(out, "  NOT FAITHFUL: {why}");
    }
    if let Some(c) = &r.cores {
        let after = match Spread::of(c.later_ns.iter().copied()) {
            _ if c.later_ns.is_empty() => "not measured (logged why)".to_string(),
            s => format!("{:.0} ns ({:.0}–{:.0})", s.median, s.min, s.max),
        };
        say!(
            out,
            "  cores: CPUs {} and {}, a cache line's round trip {:.0} ns at the calibration, {after} after the pairs",
            c.cpus.0,
            c.cpus.1,
            c.first_ns,
        );
        if let Some(why) = c.why_moved() {
            say!(out, "  CORES MOVED: {why}");
        }
    }
    model_lines(&mut out, r);
    match r.crosses_10_percent_at_rtt_us {
        Some(0.0) => say!(out, "  over 10 % at any round trip: the link's rate alone puts it there"),
        Some(x) => say!(out, "  the model crosses 10 % at a round trip of {x:.1} µs"),
        None => say!(out, "  the model never crosses 10 % (up to a round trip of 1 s)"),
    }
    out
}

/// The model's lines of the text report: its prediction from the calibration before the
/// replays and where its added time went, its baselines, and the predictions from the
/// calibrations before each pair.
fn model_lines(out: &mut String, r: &Comparison) {
    let p = &r.predicted_bridged;
    say!(
        out,
        "  the model: {:.2} ms direct, {:.2} ms bridged, {:.2} % (command fetch {:.3} ms, copies {:.3} ms, synchronizations {:.3} ms, submissions {:.3} ms on the critical path)",
        r.predicted_direct.job_ns / 1e6,
        p.job_ns / 1e6,
        (p.job_ns / r.predicted_direct.job_ns - 1.0) * 100.0,
        p.added.command_fetch_ns / 1e6,
        p.added.copies_ns / 1e6,
        p.added.synchronizations_ns / 1e6,
        p.added.submissions_ns / 1e6
    );
    say!(
        out,
        "           blind: its link calibrated before the replay; baselines: no overhead 0 %, bandwidth alone {:.2} %",
        r.bandwidth_only_overhead_percent()
    );
    if !r.pair_predictions.is_empty() {
        let p = Spread::of(r.pair_predictions.iter().copied());
        say!(
            out,
            "           calibrated again just before each pair: {:.2} % ({:.2}–{:.2}); by pair, measured less predicted: {}",
            p.median,
            p.min,
            p.max,
            r.overheads
                .iter()
                .zip(&r.pair_predictions)
                .map(|(o, q)| format!("{:+.1}", o - q))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}
