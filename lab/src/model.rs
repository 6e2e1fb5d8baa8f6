//! The performance model: a workload's time through the bridges predicted from its
//! transaction profile — what it asked of the device and what the device did to host memory,
//! counted during a run on the directly attached platform — and the link's round-trip time,
//! bandwidth and per-TLP cost. docs/performance-model.md derives it and says where it stops
//! holding.
//!
//! A bridge adds nothing to what the device computes; it stretches every dependency that
//! crosses the link. Three kinds do, and the profile counts each:
//!
//! - a **blocking register read** stalls the driver for one round trip;
//! - a **dependent device read** (a command fetch, a command that needs copies' bytes
//!   landed) stalls the device for one round trip — copies taken back to back, and the
//!   reads that keep a copy's window full, are hidden under the bandwidth;
//! - an **idle wait** (the driver waits for the last fence it published) leaves the device
//!   idle from its fence write until the driver's next doorbell arrives: one way to the host
//!   and one way back, a round trip.
//!
//! Bytes moved add the difference between the link's rate and the platform's own; each
//! posted register write adds the host's cost of sending one TLP.
//!
//! ```text
//! T_bridged = T_direct + RTT · (R + D + W) + B_h2d · (1/BW_h2d − 1/BW'_h2d)⁺
//!                      + B_d2h · (1/BW_d2h − 1/BW'_d2h)⁺ + c_tlp · P
//! ```
#![forbid(unsafe_code)]

use std::time::Instant;

use driver::{Command, DriverError, DriverStats, PciFunction, SimGpuDriver, WaitMode};
use serde_json::{Value, json};

use crate::error::LabError;
use simgpu_abi::op;
use testbed::direct::PlatformCounts;

pub mod report;

/// A workload's transaction profile: what one run asked of the device, what the device did
/// to host memory, and how fast the platform it was counted on moves bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Profile {
    /// What crossed the platform: register reads (R) and posted writes (P), the device's
    /// reads of host memory (D: those it waited on) and writes, interrupts.
    pub platform: PlatformCounts,
    /// What the driver did: commands, doorbells, waits (W: those with the device idle).
    pub driver: DriverStats,
    /// The platform's own rate host → device, bytes per second (BW'_h2d); 0 if unknown.
    pub direct_h2d_bytes_per_s: f64,
    /// The platform's own rate device → host (BW'_d2h); 0 if unknown.
    pub direct_d2h_bytes_per_s: f64,
}

impl Profile {
    /// The counts of one run (each a difference over it); the platform's rates unknown.
    pub fn from_counts(platform: PlatformCounts, driver: DriverStats) -> Profile {
        Profile { platform, driver, direct_h2d_bytes_per_s: 0.0, direct_d2h_bytes_per_s: 0.0 }
    }

    /// Round trips on the critical path: R + D + W.
    pub fn round_trips(&self) -> u64 {
        let p = &self.platform;
        p.register_reads.saturating_add(p.dependent_reads).saturating_add(self.driver.waits_idle)
    }

    /// Fence waits, by polling and by interrupt.
    pub fn waits(&self) -> u64 {
        self.driver.waits_polled.saturating_add(self.driver.waits_interrupt)
    }
}

/// The link between host and device, as every prediction here sees it: the model of a
/// workload's profile ([`predict`]) and the plan of a traced job
/// ([`crate::plan::Plan::evaluate`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkParams {
    /// Round trip of one request and its completion through both bridges, ns: what they add
    /// to the local slot's where that is known (the plan, the replay), else the whole of it.
    pub rtt_ns: f64,
    /// Bulk rate host → device through the bridges, bytes per second; infinite (or ≤ 0):
    /// no limit known.
    pub h2d_bytes_per_s: f64,
    /// Bulk rate device → host.
    pub d2h_bytes_per_s: f64,
    /// The host's own cost of sending one posted TLP (a register write) beyond the local
    /// slot's, ns: a posted write through a bridge is a send.
    pub posted_write_ns: f64,
    /// A command fetch's time beyond 1.5 round trips, ns: the turns a register read's round
    /// trip does not take (the device acting on the doorbell; the host answering the
    /// fetch), measured where they can be (a fence's round trip), 0 where they cannot.
    pub fetch_extra_ns: f64,
}

impl LinkParams {
    /// No link: the local slot a profile was counted or a trace taken in.
    pub const LOCAL: LinkParams = LinkParams {
        rtt_ns: 0.0,
        h2d_bytes_per_s: f64::INFINITY,
        d2h_bytes_per_s: f64::INFINITY,
        posted_write_ns: 0.0,
        fetch_extra_ns: 0.0,
    };

    /// The host's time to publish a submission beyond the local slot's: two posted writes
    /// (RING_TAIL and the doorbell), ns.
    pub fn submit_ns(&self) -> f64 {
        2.0 * self.posted_write_ns.max(0.0)
    }

    /// What a command fetch the device waits for adds: the doorbell's way there and the
    /// fetch's round trip (1.5 round trips), and its turns, ns.
    pub fn fetch_ns(&self) -> f64 {
        1.5 * self.rtt_ns.max(0.0) + self.fetch_extra_ns.max(0.0)
    }
}

/// What the model predicts at one link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prediction {
    /// Bridged wall time.
    pub bridged_seconds: f64,
    /// `bridged / direct − 1`, percent.
    pub overhead_percent: f64,
    /// RTT · (R + D + W).
    pub latency_seconds: f64,
    /// The bytes' term.
    pub bandwidth_seconds: f64,
    /// c_tlp · P.
    pub tlp_seconds: f64,
}

/// Seconds `bytes` take at `link` more than at `native` (never less: a faster link does not
/// make the device's own copy engine faster). A rate ≤ 0 is unknown: no term.
fn slower(bytes: u64, link: f64, native: f64) -> f64 {
    if bytes == 0 || link.is_nan() || link <= 0.0 || link.is_infinite() {
        return 0.0;
    }
    let native = if native > 0.0 { bytes as f64 / native } else { 0.0 };
    (bytes as f64 / link - native).max(0.0)
}

/// The overhead the terms other than latency add (seconds).
fn fixed_seconds(p: &Profile, link: &LinkParams) -> (f64, f64) {
    let (c, bytes_per_s) = (&p.platform, (p.direct_h2d_bytes_per_s, p.direct_d2h_bytes_per_s));
    let bandwidth = slower(c.device_read_bytes, link.h2d_bytes_per_s, bytes_per_s.0)
        + slower(c.device_write_bytes, link.d2h_bytes_per_s, bytes_per_s.1);
    (bandwidth, link.posted_write_ns.max(0.0) * 1e-9 * c.register_writes as f64)
}

/// The bridged time of a workload that took `direct_seconds` on the platform `p` was
/// counted on.
pub fn predict(p: &Profile, direct_seconds: f64, link: &LinkParams) -> Prediction {
    let latency = link.rtt_ns.max(0.0) * 1e-9 * p.round_trips() as f64;
    let (bandwidth, tlp) = fixed_seconds(p, link);
    let bridged = direct_seconds + latency + bandwidth + tlp;
    let overhead = if direct_seconds > 0.0 { (bridged / direct_seconds - 1.0) * 100.0 } else { 0.0 };
    Prediction {
        bridged_seconds: bridged,
        overhead_percent: overhead,
        latency_seconds: latency,
        bandwidth_seconds: bandwidth,
        tlp_seconds: tlp,
    }
}

/// The round-trip time (seconds) at which the predicted overhead reaches `percent`, the
/// other terms as `link` gives them: 0 if it is there already at no latency, `None` if
/// latency never brings it there (no round trips on the critical path).
pub fn crossing_rtt(p: &Profile, direct_seconds: f64, link: &LinkParams, percent: f64) -> Option<f64> {
    let (bandwidth, tlp) = fixed_seconds(p, link);
    let budget = direct_seconds * percent / 100.0 - bandwidth - tlp;
    if budget <= 0.0 {
        return Some(0.0);
    }
    match p.round_trips() {
        0 => None,
        n => Some(budget / n as f64),
    }
}

/// VRAM offset [`copy_rates`] copies to and from (above every workload's data).
const RATE_VRAM: u64 = 0xc00_0000;

/// The device's copy rates between a pinned host buffer of `bytes` and VRAM, host → device
/// and device → host, bytes per second: the median of `repeat` copies each way, each timed
/// from its queueing to its fence. On the direct platform these are the profile's own
/// rates; through the bridges, the link's bulk rates the model takes.
pub fn copy_rates<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    bytes: usize,
    repeat: usize,
) -> Result<(f64, f64), DriverError> {
    d.with_pinned([bytes], |e| e, |d, [buf]| rates(d, buf, bytes, repeat))
}

/// The largest copy [`copy_rates_at`] times: what VRAM holds above the rate buffer (192 MiB) on the
/// default simgpu (256 MiB).
pub const MAX_RATE_BYTES: usize = 64 << 20;

/// The smallest: below it a copy's time is its command's round trip more than its bytes,
/// which the model counts apart (a fill per copy).
pub const MIN_RATE_BYTES: usize = 256 << 10;

/// Copy rates each way, bytes per second, and the copy sizes they were timed at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RatesAt {
    /// Host → device.
    pub h2d: f64,
    /// Device → host.
    pub d2h: f64,
    /// The copies' sizes, host → device and device → host, bytes.
    pub at_bytes: (usize, usize),
}

/// The copy rates each way as [`copy_rates`] measures them, each at its own size (a job's
/// typical copy each way, within [`MIN_RATE_BYTES`]..=[`MAX_RATE_BYTES`]), with as many
/// copies as move 48 MiB (3 to 64).
pub fn copy_rates_at<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    h2d_bytes: usize,
    d2h_bytes: usize,
) -> Result<RatesAt, DriverError> {
    let at = |b: usize| b.clamp(MIN_RATE_BYTES, MAX_RATE_BYTES);
    let (h, v) = (at(h2d_bytes), at(d2h_bytes));
    let repeat = |b: usize| ((48 << 20) / b).clamp(3, 64);
    d.with_pinned(
        [h.max(v)],
        |e| e,
        |d, [buf]| {
            let (h2d, _) = rates_each(d, buf, h, repeat(h), (true, false))?;
            let (_, d2h) = rates_each(d, buf, v, repeat(v), (false, true))?;
            Ok(RatesAt { h2d, d2h, at_bytes: (h, v) })
        },
    )
}

/// [`copy_rates`] through `buf`.
fn rates<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    buf: &driver::Pinned,
    bytes: usize,
    repeat: usize,
) -> Result<(f64, f64), DriverError> {
    rates_each(d, buf, bytes, repeat, (true, true))
}

/// The rates of the directions `which` asks for (host → device, device → host); 0 for the
/// other.
fn rates_each<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    buf: &driver::Pinned,
    bytes: usize,
    repeat: usize,
    which: (bool, bool),
) -> Result<(f64, f64), DriverError> {
    let mut rate = |opcode: u32, args: [u64; 5]| -> Result<f64, DriverError> {
        let mut v = Vec::with_capacity(repeat.max(1));
        for _ in 0..repeat.max(1) {
            let t = Instant::now();
            d.enqueue(Command { opcode, args })?;
            d.sync(WaitMode::Poll)?;
            v.push(bytes as f64 / t.elapsed().as_secs_f64().max(1e-9));
        }
        v.sort_by(f64::total_cmp);
        Ok(v[v.len() / 2])
    };
    let h2d = if which.0 { rate(op::COPY_H2V, [buf.bus.get(), RATE_VRAM, bytes as u64, 0, 0])? } else { 0.0 };
    let d2h = if which.1 { rate(op::COPY_V2H, [RATE_VRAM, buf.bus.get(), bytes as u64, 0, 0])? } else { 0.0 };
    Ok((h2d, d2h))
}

/// The profile as `loopback --json` carries it under `profile`.
pub fn profile_json(p: &Profile) -> Value {
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
pub fn profile_from_json(v: &Value) -> Result<Profile, LabError> {
    let missing = |field: &str, expected| LabError::ProfileField { field: field.to_string(), expected };
    let count = |k: &str| v.get(k).and_then(Value::as_u64).ok_or_else(|| missing(k, "a count"));
    let rate = |k: &str| match v.get(k).and_then(Value::as_f64) {
        Some(r) if r.is_finite() && r >= 0.0 => Ok(r),
        _ => Err(missing(k, "a rate ≥ 0")),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(platform: PlatformCounts) -> Profile {
        Profile { platform, ..Profile::default() }
    }

    fn link(rtt_us: f64) -> LinkParams {
        LinkParams { rtt_ns: rtt_us * 1e3, ..LinkParams::LOCAL }
    }

    #[test]
    fn no_round_trip_time_and_no_slower_link_costs_nothing() {
        let p = Profile {
            platform: PlatformCounts {
                register_reads: 10,
                dependent_reads: 5,
                device_read_bytes: 1 << 20,
                device_write_bytes: 1 << 20,
                ..PlatformCounts::default()
            },
            driver: DriverStats { waits_idle: 3, ..DriverStats::default() },
            direct_h2d_bytes_per_s: 5e9,
            direct_d2h_bytes_per_s: 5e9,
        };
        let at = predict(&p, 0.01, &link(0.0));
        assert_eq!(at.bridged_seconds, 0.01);
        assert_eq!(at.overhead_percent, 0.0);
        // A link as fast as the platform adds nothing either; a faster one takes nothing off.
        for bw in [5e9, 50e9] {
            let l = LinkParams { h2d_bytes_per_s: bw, d2h_bytes_per_s: bw, ..link(0.0) };
            assert_eq!(predict(&p, 0.01, &l).overhead_percent, 0.0);
        }
    }

    #[test]
    fn a_workload_of_blocking_reads_scales_exactly_with_the_round_trip() {
        let p = counts(PlatformCounts { register_reads: 1000, ..PlatformCounts::default() });
        for rtt_us in [1.0, 10.0, 100.0] {
            let at = predict(&p, 0.001, &link(rtt_us));
            let want = 0.001 + 1000.0 * rtt_us * 1e-6;
            assert!((at.bridged_seconds - want).abs() < 1e-12, "{rtt_us}: {at:?}");
        }
        // 10 % of 1 ms is 100 µs: 0.1 µs per read.
        let x = crossing_rtt(&p, 0.001, &link(0.0), 10.0).unwrap();
        assert!((x - 1e-7).abs() < 1e-15, "{x}");
    }

    #[test]
    fn the_bandwidth_term_is_the_difference_of_the_rates() {
        let p = Profile {
            direct_h2d_bytes_per_s: 4e9,
            ..counts(PlatformCounts { device_read_bytes: 1_000_000_000, ..PlatformCounts::default() })
        };
        let l = LinkParams { h2d_bytes_per_s: 1e9, ..link(0.0) };
        let at = predict(&p, 1.0, &l);
        assert!((at.bandwidth_seconds - 0.75).abs() < 1e-9, "{at:?}");
        assert!((at.overhead_percent - 75.0).abs() < 1e-6);
        // Already over 10 % with no latency: crosses at zero; with no round trips and under
        // it, never.
        assert_eq!(crossing_rtt(&p, 1.0, &l, 10.0), Some(0.0));
        assert_eq!(crossing_rtt(&p, 1.0, &link(0.0), 10.0), None);
    }

    #[test]
    fn posted_writes_cost_what_the_link_says_a_tlp_costs() {
        let p = Profile {
            driver: DriverStats { waits_idle: 100, ..DriverStats::default() },
            ..counts(PlatformCounts { register_writes: 200, ..PlatformCounts::default() })
        };
        let l = LinkParams { posted_write_ns: 1e3, ..link(20.0) };
        let at = predict(&p, 0.1, &l);
        assert!((at.tlp_seconds - 200e-6).abs() < 1e-12);
        assert!((at.latency_seconds - 2e-3).abs() < 1e-12);
        assert!((at.bridged_seconds - 0.1022).abs() < 1e-12);
    }
}
