//! `dxpu loopback`'s report: the table of each workload, the summary of several, and the
//! JSON object (docs/cli.md); `dxpu bench bridge` gives the same object for its workload.

use std::path::Path;

use link::driver::PollMode;
use serde_json::json;

use super::outcome::{Outcome, tlp_totals};
use super::{BaselineKind, Options};
use crate::floor::us;
use crate::harness::{Frames, Spread};
use crate::report::spread;
use crate::report::{say, seconds};

/// The poll mode as the configuration file spells it.
fn poll_name(p: PollMode) -> &'static str {
    match p {
        PollMode::Busy { .. } => "busy",
        PollMode::Blocking => "blocking",
    }
}

/// Every workload's overhead beside the model's prediction, one line each.
pub fn summary(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    say!(out);
    say!(
        out,
        "  summary: overhead through the bridges against direct (median of the pairs, their spread), and the model"
    );
    say!(
        out,
        "    {:<13} {:>9} {:>16} {:>10} {:>9}   model: 10 % at a round trip of",
        "workload",
        "overhead",
        "spread",
        "RTT µs",
        "model"
    );
    for o in outcomes {
        let (overhead, (pred, crossing)) = (o.overhead(), o.prediction());
        say!(
            out,
            "    {:<13} {:>7.1} % {:>7.0} to {:>4.0} % {:>10.1} {:>7.1} %   {}",
            o.workload.name(),
            overhead.median,
            overhead.min,
            overhead.max,
            o.link.rtt_ns / 1e3,
            pred.overhead_percent,
            crossing_text(crossing)
        );
    }
    out
}

fn crossing_text(crossing: Option<f64>) -> String {
    match crossing {
        Some(0.0) => "any (its bandwidth term alone is over 10 %)".to_string(),
        Some(x) => format!("{x:.0} µs"),
        None => "never".to_string(),
    }
}

/// The report's first lines: what ran, over which link, on which CPUs.
fn header(out: &mut String, options: &Options, o: &Outcome) {
    say!(
        out,
        "dxpu loopback — a simulated GPU behind a GPU-box endpoint, used through a host endpoint over UDP"
    );
    say!(
        out,
        "  link: 127.0.0.1, driver {}, {} poll, added delay {} µs one-way, jitter {} µs, loss {:.1} %, frames {}",
        o.driver,
        poll_name(options.poll),
        options.impairment.delay.as_micros(),
        options.impairment.jitter.as_micros(),
        options.impairment.loss * 100.0,
        if options.frames == Frames::Encrypted { "encrypted" } else { "authenticated" }
    );
    match o.placement {
        Some(p) => say!(
            out,
            "  CPUs: the GPU-box endpoint and the direct device on {}, the host's driver on {} (--pin)",
            p.device,
            p.host
        ),
        None => say!(out, "  CPUs: wherever the scheduler puts the threads (--pin off, or one CPU)"),
    }
}

/// One workload's report.
pub fn text(options: &Options, o: &Outcome) -> String {
    let mut out = String::new();
    let overhead = o.overhead();
    let (bridged, direct) = o.seconds();
    let tlps = tlp_totals(&o.host);
    header(&mut out, options, o);
    say!(out);
    let runs = o.bridged.len();
    if runs > 1 {
        say!(
            out,
            "  workload {} (every result checked against the CPU), medians of {runs} runs each way, in turns, and their spread",
            o.workload.name()
        );
        say!(out, "  {:<46} {:>29}  {:>29}", "", "bridged", "direct");
    } else {
        say!(
            out,
            "  workload {} (every result checked against the CPU)       bridged      direct",
            o.workload.name()
        );
    }
    for (i, step) in o.bridged[0].steps.iter().enumerate() {
        let (b, d) = o.step(i);
        if runs > 1 {
            say!(out, "    {:<44} {:>29}  {:>29}", step.name, fmt_spread(b), fmt_spread(d));
        } else {
            say!(out, "    {:<52} {:>9}  {:>9}", step.name, seconds(b.median), seconds(d.median));
        }
    }
    say!(out, "  all results verified: yes");
    say!(out);
    say!(out, "  TLPs by kind in one run (the last; host→box / box→host):");
    for k in tlps.keys() {
        say!(
            out,
            "    {:<8} {:>9} / {}",
            k,
            o.host.tlps_sent.get(k).copied().unwrap_or(0),
            o.host.tlps_received.get(k).copied().unwrap_or(0)
        );
    }
    say!(out, "  interrupts {}, retransmitted frames {}", o.host.interrupts, o.host.link.retransmits);
    say!(
        out,
        "  link: {} driver, MTU {}, Max_Payload_Size {} B, {}",
        o.driver,
        o.sizes.0,
        o.sizes.1,
        o.offload.describe()
    );
    say!(out);
    say!(
        out,
        "  MMIO read round trip: p50 {:.1} µs, p99 {:.1} µs   (direct: p50 {:.2} µs)",
        us(o.rtt.0),
        us(o.rtt.1),
        us(o.direct_rtt.0)
    );
    let (bh, bd) = Outcome::dma(&o.bridged);
    let (dh, dd) = Outcome::dma(&o.direct);
    say!(
        out,
        "  DMA host→device {bh:.2} Gbit/s, device→host {bd:.2} Gbit/s   (direct: {dh:.2} / {dd:.2}; the workload's copies, medians)"
    );
    if runs > 1 {
        say!(
            out,
            "  workload: bridged {}, direct {}, overhead {:.0} % (median of {runs} pairs; {:.0} to {:.0} %)",
            fmt_spread(bridged),
            fmt_spread(direct),
            overhead.median,
            overhead.min,
            overhead.max
        );
    } else {
        say!(
            out,
            "  workload: bridged {}, direct {}, overhead {:.0} %",
            seconds(bridged.median),
            seconds(direct.median),
            overhead.median
        );
    }
    if let Some(n) = crate::steal::count(&o.stolen_from()).filter(|n| *n > 0) {
        say!(out, "{}", crate::steal::stolen_line(n, runs, "the workload"));
    }
    if let Some(n) = crate::steal::count(&o.contended()).filter(|n| *n > 0) {
        say!(out, "{}", crate::steal::contended_line(n, runs, "the workload"));
    }
    let (pred, crossing) = o.prediction();
    let p = &o.profile;
    say!(
        out,
        "  profile (a direct run): {} register reads, {} dependent device reads, {} idle waits, {} KiB to the device, {} KiB from it",
        p.platform.register_reads,
        p.platform.dependent_reads,
        p.driver.waits_idle,
        p.platform.device_read_bytes >> 10,
        p.platform.device_write_bytes >> 10
    );
    say!(
        out,
        "  model: at the measured round trip ({:.1} µs) and bulk rates ({:.2} / {:.2} Gbit/s) it predicts bridged {}, overhead {:.0} %; 10 % at a round trip of {}",
        o.link.rtt_ns / 1e3,
        o.link.h2d_bytes_per_s * 8e-9,
        o.link.d2h_bytes_per_s * 8e-9,
        seconds(pred.bridged_seconds),
        pred.overhead_percent,
        crossing_text(crossing)
    );
    out
}

/// `median (min–max)`.
fn fmt_spread(s: Spread) -> String {
    format!("{} ({}–{})", seconds(s.median), seconds(s.min), seconds(s.max))
}

/// `loopback --json`'s object (and `bench bridge --json`'s `workload`).
pub fn json(options: &Options, o: &Outcome, capture: Option<&Path>) -> serde_json::Value {
    let overhead = o.overhead();
    let (bridged, direct) = o.seconds();
    let (bh, bd) = Outcome::dma(&o.bridged);
    let (dh, dd) = Outcome::dma(&o.direct);
    let tlps = tlp_totals(&o.host);
    let steps: Vec<_> = o.bridged[0]
        .steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (b, d) = o.step(i);
            let mut v = json!({ "name": s.name });
            spread(&mut v, "bridged_seconds", b);
            spread(&mut v, "direct_seconds", d);
            v
        })
        .collect();
    let (pred, crossing) = o.prediction();
    let mut v = json!({
        "verified": true,
        "workload": o.workload.name(),
        "profile": crate::model::profile_json(&o.profile),
        "model": {
            "rtt_us": o.link.rtt_ns / 1e3,
            "h2d_bytes_per_s": o.link.h2d_bytes_per_s,
            "d2h_bytes_per_s": o.link.d2h_bytes_per_s,
            "predicted_bridged_seconds": pred.bridged_seconds,
            "predicted_overhead_percent": pred.overhead_percent,
            "latency_seconds": pred.latency_seconds,
            "bandwidth_seconds": pred.bandwidth_seconds,
            "crosses_10_percent_at_rtt_us": crossing,
        },
        "repeat": o.bridged.len(),
        "steps": steps,
        "tlps": tlps,
        "tlps_host_to_box": o.host.tlps_sent,
        "tlps_box_to_host": o.host.tlps_received,
        "capture": capture.map(|f| json!({
            "file": f.display().to_string(),
            "tlps_host_to_box": o.captured.0,
            "tlps_box_to_host": o.captured.1,
        })),
        "mmio_read_rtt_p50_us": us(o.rtt.0),
        "mmio_read_rtt_p99_us": us(o.rtt.1),
        "direct_mmio_read_rtt_p50_us": us(o.direct_rtt.0),
        "direct_mmio_read_rtt_p99_us": us(o.direct_rtt.1),
        "dma_h2d_bytes_per_s": bh * 1e9 / 8.0,
        "dma_d2h_bytes_per_s": bd * 1e9 / 8.0,
        "direct_dma_h2d_bytes_per_s": dh * 1e9 / 8.0,
        "direct_dma_d2h_bytes_per_s": dd * 1e9 / 8.0,
        "bridged_runs_seconds": o.bridged.iter().map(|r| r.seconds).collect::<Vec<_>>(),
        "direct_runs_seconds": o.direct.iter().map(|r| r.seconds).collect::<Vec<_>>(),
        "interrupts": o.host.interrupts,
        "retransmits": o.host.link.retransmits,
        "link_driver": o.driver,
        "mtu_bytes": o.sizes.0,
        "max_payload_bytes": o.sizes.1,
        "gso": o.offload.gso,
        "gro": o.offload.gro,
        "poll": poll_name(options.poll),
        "cpus": o.placement.map(|p| json!({ "device": p.device, "host": p.host })),
        "baseline": match options.baseline {
            BaselineKind::Synchronous => "synchronous",
            BaselineKind::Concurrent => "concurrent",
        },
        "delay_us": options.impairment.delay.as_micros(),
        "loss_ratio": options.impairment.loss,
        "encrypted": options.frames == Frames::Encrypted,
    });
    spread(&mut v, "direct_seconds", direct);
    spread(&mut v, "bridged_seconds", bridged);
    spread(&mut v, "overhead_percent", overhead);
    // Each pair's steal and run-queue waits (direct, bridged, ms), and how many pairs each
    // took a share of.
    v["steal_ms"] = serde_json::json!(o.taken.iter().map(|t| t.steal_ms()).collect::<Vec<_>>());
    v["pairs_stolen_from"] = serde_json::json!(crate::steal::count(&o.stolen_from()));
    v["waited_ms"] = serde_json::json!(o.taken.iter().map(|t| t.waited_ms()).collect::<Vec<_>>());
    v["pairs_contended"] = serde_json::json!(crate::steal::count(&o.contended()));
    v
}
