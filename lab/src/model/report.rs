//! What `dxpu model` reports, as text and as JSON: a workload's predictions from its profile,
//! a trace's from its plan, and the link they were made over — given, or measured as
//! `dxpu replay` calibrates it (`--measure-link`). `dxpu replay` prints a trace's summary,
//! counts and plan as this does.

use std::time::Duration;

use serde_json::{Value, json};

use super::{LinkParams, Prediction, Profile, crossing_rtt, predict, profile_json};
use crate::affinity::Placement;
use crate::error::LabError;
use crate::plan::{AddedTime, Outcome, Plan};
use crate::report::{say, seconds};
use crate::trace::Trace;

/// How `dxpu model` predicts: at which round trips, over which link.
#[derive(Debug, Clone)]
pub struct ModelOptions {
    /// Round-trip times to predict at, µs (at least one).
    pub rtt_us: Vec<f64>,
    /// The link's bulk rate each way, Gbit/s: 25 unless given, or what was measured.
    pub bandwidth_gbit: Option<f64>,
    /// The host's cost of sending one posted TLP, µs (0: none, or what was measured).
    pub per_tlp_us: f64,
    /// Measure the link first, as `dxpu replay` calibrates it.
    pub measure: Option<MeasureLink>,
}

/// How to measure the link: the one-way delay added each way, and where the spinning threads
/// run.
#[derive(Debug, Clone, Copy)]
pub struct MeasureLink {
    /// Added one-way delay each way, µs.
    pub delay_us: u64,
    /// The spinning threads' CPUs (`None`: wherever the scheduler puts them).
    pub placement: Option<Placement>,
}

/// `--bandwidth-gbit` unless given: the path bandwidth the link's configuration assumes.
const DEFAULT_BANDWIDTH_GBIT: f64 = 25.0;

/// The link as `dxpu replay` calibrates it before replaying (`lab::compare::calibrate`:
/// both platforms, register reads, posted writes, fences, copies each way at `plan`'s
/// byte-median copy size, or 16 MiB without one), with
/// `how.delay_us` added each way and the spinning threads placed as `how` says. The
/// calibration's bridged link (what the bridges add to the direct platform's) for a trace's
/// plan; for a profile, whose model takes the whole round trip, the bridged platform's own.
fn measured_link(
    how: MeasureLink,
    whole_round_trip: bool,
    plan: Option<&Plan>,
    progress: &mut dyn FnMut(&str),
) -> Result<Measured, LabError> {
    use link::driver::{DriverKind, Impairment, PollMode};
    let opts = crate::compare::CompareOptions {
        repeat: 1,
        impairment: Impairment { delay: Duration::from_micros(how.delay_us), ..Impairment::default() },
        driver: DriverKind::Auto,
        poll: PollMode::Busy { spin: Duration::from_micros(2000) },
        placement: how.placement,
    };
    let c = crate::compare::calibrate(&opts, plan, progress)?;
    let link = match whole_round_trip {
        true => LinkParams { rtt_ns: c.bridged.rtt.as_nanos() as f64, ..c.link },
        false => c.link,
    };
    Ok(Measured { link, delay_us: how.delay_us, cores: c.cores })
}

/// What `--measure-link` measured: the link, and where the spinning threads were placed
/// ((device's CPU, host's CPU), a cache line's round trip between them, ns): the rates
/// depend on it (`crate::cores`).
#[derive(Clone, Copy, Debug)]
pub struct Measured {
    /// The link.
    pub link: LinkParams,
    /// The one-way delay added each way while measuring, µs.
    pub delay_us: u64,
    /// (device's CPU, host's CPU) and a cache line's round trip between them, ns.
    pub cores: Option<((usize, usize), f64)>,
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

/// The round trips to predict at, µs: those asked for, and the measured one among them in
/// order.
fn round_trips(args: &ModelOptions, measured: Option<&Measured>) -> Vec<f64> {
    let mut rtts = args.rtt_us.clone();
    if let Some(m) = measured {
        rtts.push(m.link.rtt_ns / 1e3);
        rtts.sort_by(f64::total_cmp);
    }
    rtts
}

/// A table row's mark where its round trip is the measured one.
fn measured_mark(measured: Option<&Measured>, rtt_us: f64) -> &'static str {
    if measured.is_some_and(|m| m.link.rtt_ns / 1e3 == rtt_us) { "  (measured)" } else { "" }
}

/// `measured`'s text line, where the link was measured.
fn measured_text(out: &mut String, m: Option<&Measured>) {
    let Some(m) = m else { return };
    let delay_us = m.delay_us;
    say!(
        out,
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
#[derive(Debug)]
pub struct ModelReport {
    /// The workload's name.
    pub workload: String,
    /// Its transaction profile.
    pub profile: Profile,
    /// Its direct time, s.
    pub direct_seconds: f64,
    /// The link predicted over, its round trip aside.
    pub link: LinkParams,
    /// The link `--measure-link` measured.
    pub measured: Option<Measured>,
    /// (RTT µs, prediction).
    pub points: Vec<(f64, Prediction)>,
    /// The round trip at which the overhead reaches 10 %, µs (0: at any; `None`: never).
    pub crosses_10_percent_at_rtt_us: Option<f64>,
}

impl ModelReport {
    /// The object `dxpu model --json` prints (docs/cli.md).
    pub fn json(&self) -> Value {
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

/// A workload's predictions at `args.rtt_us` (and at the measured round trip, where the link
/// was measured), and the round trip at which it crosses 10 %.
pub fn predict_all(
    workload: String,
    profile: Profile,
    direct_seconds: f64,
    args: &ModelOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<ModelReport, LabError> {
    if direct_seconds.is_nan() || direct_seconds <= 0.0 || !direct_seconds.is_finite() {
        return Err(LabError::DirectTime { seconds: direct_seconds });
    }
    let measured = args.measure.map(|how| measured_link(how, true, None, progress)).transpose()?;
    let base = base_link(args, measured.as_ref().map(|m| &m.link));
    let rtts = round_trips(args, measured.as_ref());
    let points = rtts
        .iter()
        .map(|&rtt| (rtt, predict(&profile, direct_seconds, &LinkParams { rtt_ns: rtt * 1e3, ..base })))
        .collect();
    let crosses = crossing_rtt(&profile, direct_seconds, &base, 10.0).map(|s| s * 1e6);
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

impl ModelReport {
    /// The report `dxpu model` prints.
    pub fn text(&self) -> String {
        let (r, mut out) = (self, String::new());
        let p = &r.profile;
        say!(out, "dxpu model — workload {}: direct {} per run", r.workload, seconds(r.direct_seconds));
        say!(
            out,
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
        say!(
            out,
            "  round trips on the critical path: {}; link {:.1} / {:.1} Gbit/s, {:.2} µs per posted TLP",
            p.round_trips(),
            r.link.h2d_bytes_per_s * 8e-9,
            r.link.d2h_bytes_per_s * 8e-9,
            r.link.posted_write_ns / 1e3
        );
        measured_text(&mut out, r.measured.as_ref());
        say!(out);
        say!(out, "  {:>10}  {:>14}  {:>10}", "RTT µs", "bridged", "overhead");
        for (rtt, pr) in &r.points {
            let mark = measured_mark(r.measured.as_ref(), *rtt);
            say!(
                out,
                "  {:>10.1}  {:>14}  {:>9.1} %{mark}",
                rtt,
                seconds(pr.bridged_seconds),
                pr.overhead_percent
            );
        }
        match r.crosses_10_percent_at_rtt_us {
            Some(0.0) => say!(out, "  over 10 % at any round trip: the bandwidth term alone exceeds it"),
            Some(x) => say!(out, "  crosses 10 % at a round trip of {x:.1} µs"),
            None => say!(out, "  never crosses 10 %: nothing on its critical path crosses the link"),
        }
        out
    }
}

/// The link `--bandwidth-gbit` and `--measure-link` give, without its round trip.
fn base_link(args: &ModelOptions, measured: Option<&LinkParams>) -> LinkParams {
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
#[derive(Debug)]
pub struct TraceReport {
    /// The trace's file, as given.
    pub path: String,
    /// The trace.
    pub trace: Trace,
    /// Its plan.
    pub plan: Plan,
    /// The plan with no link: the job as traced.
    pub direct: Outcome,
    /// The link predicted over, its round trip aside.
    pub link: LinkParams,
    /// The link `measure` measured.
    pub measured: Option<Measured>,
    /// (RTT µs, outcome).
    pub points: Vec<(f64, Outcome)>,
    /// The round trip at which the overhead reaches 10 %, µs (0: at any; `None`: never).
    pub crosses_10_percent_at_rtt_us: Option<f64>,
}

/// A trace's first report line, as `model --trace` and `replay` print it: its file, GPU and
/// counts.
pub fn trace_summary(path: &str, t: &Trace, plan: &Plan) -> String {
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
    let sharing = plan.streams_sharing_channels(crate::replay::STREAM_CHANNELS);
    if sharing > 0 {
        line.push_str(&format!(
            "\n  channels: {sharing} streams beyond the simgpu's {} stream channels share them in turn: their work may wait for another stream's (a false serialization)",
            crate::replay::STREAM_CHANNELS
        ));
    }
    let (collectives, collective_ns) = t.collectives();
    if collectives > 0 {
        line.push_str(&format!(
            "\n  collectives: {collectives} NCCL/RCCL kernels, {} of GPU time, replayed as timers of their traced length: the other ranks and the network between the GPUs are not replayed",
            seconds(collective_ns as f64 / 1e9)
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
fn dependencies(p: &Plan) -> String {
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
pub fn trace_json(path: &str, t: &Trace) -> serde_json::Map<String, Value> {
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
pub fn plan_json(p: &Plan) -> Value {
    json!({
        "calls": p.calls.len(),
        "threads": p.threads,
        "dependencies_stated": p.explicit,
        "stated_stream_waits": p.stated_waits,
        "cross_stream_waits": p.cross_stream_waits,
        "syncs_inferred": p.syncs_inferred,
        "implicit_syncs": p.implicit_syncs,
        "awaits_contradicted": p.awaits_contradicted,
        "streams_sharing_channels": p.streams_sharing_channels(crate::replay::STREAM_CHANNELS),
        "nested_calls": p.nested,
        "out_of_submission_order": p.out_of_submission_order,
        "before_their_call": p.before_their_call,
    })
}

/// Where the link's time went on the critical path, ms.
pub fn added_json(a: &AddedTime) -> Value {
    json!({
        "command_fetch_ms": a.command_fetch_ns / 1e6,
        "copies_ms": a.copies_ns / 1e6,
        "synchronizations_ms": a.synchronizations_ns / 1e6,
        "submissions_ms": a.submissions_ns / 1e6,
    })
}

impl TraceReport {
    /// The object `dxpu model --trace --json` prints (docs/cli.md).
    pub fn json(&self) -> Value {
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

/// A trace's predictions at `args.rtt_us` (and at the measured round trip, where the link was
/// measured) from its plan, and the round trip at which it crosses 10 %.
pub fn predict_trace(
    path: String,
    trace: Trace,
    args: &ModelOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<TraceReport, LabError> {
    let plan = Plan::of(&trace);
    let measured = args.measure.map(|how| measured_link(how, false, Some(&plan), progress)).transpose()?;
    let mut link = base_link(args, measured.as_ref().map(|m| &m.link));
    if let Some(m) = measured.filter(|_| args.per_tlp_us == 0.0) {
        (link.posted_write_ns, link.fetch_extra_ns) = (m.link.posted_write_ns, m.link.fetch_extra_ns);
    }
    let rtts = round_trips(args, measured.as_ref());
    let direct = plan.evaluate(&LinkParams::LOCAL);
    let points =
        rtts.iter().map(|&rtt| (rtt, plan.evaluate(&LinkParams { rtt_ns: rtt * 1e3, ..link }))).collect();
    let crosses = plan.crossing_rtt_ns(&link, 10.0).map(|ns| ns / 1e3);
    Ok(TraceReport {
        path,
        trace,
        plan,
        direct,
        link,
        measured,
        points,
        crosses_10_percent_at_rtt_us: crosses,
    })
}

impl TraceReport {
    /// The report `dxpu model --trace` prints.
    pub fn text(&self) -> String {
        let (r, mut out) = (self, String::new());
        let t = &r.trace;
        say!(out, "dxpu model — trace {}", trace_summary(&r.path, t, &r.plan));
        say!(
            out,
            "  the trace: GPU span {}, job {} (first call to last return)",
            seconds(t.gpu_span_ns() as f64 / 1e9),
            seconds(r.direct.job_ns / 1e9),
        );
        say!(
            out,
            "  link {:.1} / {:.1} Gbit/s",
            r.link.h2d_bytes_per_s * 8e-9,
            r.link.d2h_bytes_per_s * 8e-9
        );
        measured_text(&mut out, r.measured.as_ref());
        say!(out);
        say!(
            out,
            "  {:>10}  {:>14}  {:>10}   {:>12} {:>12} {:>12}",
            "RTT µs",
            "bridged",
            "overhead",
            "fetch ms",
            "copies ms",
            "syncs ms"
        );
        for (rtt, o) in &r.points {
            let mark = measured_mark(r.measured.as_ref(), *rtt);
            say!(
                out,
                "  {:>10.1}  {:>14}  {:>9.2} %   {:>12.3} {:>12.3} {:>12.3}{mark}",
                rtt,
                seconds(o.job_ns / 1e9),
                (o.job_ns / r.direct.job_ns - 1.0) * 100.0,
                o.added.command_fetch_ns / 1e6,
                o.added.copies_ns / 1e6,
                o.added.synchronizations_ns / 1e6
            );
        }
        say!(out, "  (fetch, copies, syncs: the link's time on the bridged critical path)");
        match r.crosses_10_percent_at_rtt_us {
            Some(0.0) => say!(out, "  over 10 % at any round trip: the link's rate alone puts it there"),
            Some(x) => say!(out, "  crosses 10 % at a round trip of {x:.1} µs"),
            None => say!(out, "  never crosses 10 % (up to a round trip of 1 s)"),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(rtt_us: &[f64]) -> ModelOptions {
        ModelOptions { rtt_us: rtt_us.to_vec(), bandwidth_gbit: Some(8.0), per_tlp_us: 0.0, measure: None }
    }

    /// 1,000 dependent register reads and 1 GB to the device in a 1 s job: at a 10 µs round
    /// trip the reads add 10 ms, and 1 GB at 1 GB/s (8 Gbit/s) is a second on its own.
    fn profile() -> Profile {
        let mut p = Profile::default();
        p.platform.register_reads = 1_000;
        p.platform.device_read_bytes = 1_000_000_000;
        p.direct_h2d_bytes_per_s = 10e9;
        p.direct_d2h_bytes_per_s = 10e9;
        p
    }

    #[test]
    fn a_workloads_report_gives_each_round_trip_its_prediction_as_text_and_json() {
        let r = predict_all("w".into(), profile(), 1.0, &options(&[0.0, 10.0]), &mut |_| {}).unwrap();
        assert_eq!(r.points.len(), 2);
        let (at_0, at_10) = (r.points[0].1.bridged_seconds, r.points[1].1.bridged_seconds);
        assert!((at_10 - at_0 - 0.01).abs() < 1e-6, "{at_0} {at_10}");
        let v = r.json();
        assert_eq!(v["workload"], "w");
        assert_eq!(v["bandwidth_gbit_per_s"], 8.0);
        assert_eq!(v["points"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["points"][1]["rtt_us"], 10.0);
        assert_eq!(v["profile"]["register_reads"], 1_000);
        assert!(v["measured_link"].is_null());
        let text = r.text();
        assert!(text.starts_with("dxpu model — workload w: direct "), "{text}");
        assert!(text.lines().any(|l| l.trim_start().starts_with("10.0")), "{text}");
        // Its profile, read back from its JSON, is the same profile.
        assert_eq!(crate::model::profile_from_json(&v["profile"]).unwrap(), r.profile);
    }

    #[test]
    fn a_direct_time_that_is_no_time_is_refused_by_name() {
        for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = predict_all("w".into(), profile(), s, &options(&[0.0]), &mut |_| {}).unwrap_err();
            assert!(matches!(e, LabError::DirectTime { .. }), "{s}: {e}");
            assert!(e.to_string().starts_with("direct time "), "{e}");
        }
    }

    #[test]
    fn a_profile_missing_a_field_or_with_a_bad_rate_names_it() {
        let mut v = profile_json(&profile());
        v.as_object_mut().unwrap().remove("doorbells");
        let e = crate::model::profile_from_json(&v).unwrap_err();
        assert_eq!(e.to_string(), "profile.doorbells: missing or not a count");
        let mut v = profile_json(&profile());
        v["direct_h2d_bytes_per_s"] = json!(-1.0);
        let e = crate::model::profile_from_json(&v).unwrap_err();
        assert_eq!(e.to_string(), "profile.direct_h2d_bytes_per_s: missing or not a rate ≥ 0");
    }
}
