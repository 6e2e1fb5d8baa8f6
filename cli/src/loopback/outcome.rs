//! What the runs found: the workload through the bridges and directly, the link as measured,
//! the transaction profile, and the figures the report derives from them.

use std::collections::BTreeMap;
use std::time::Duration;

use bridge_host::HostStats;
use lab::model::{self, LinkParams, Prediction, Profile};
use testbed::workload::WorkloadReport;

use crate::args::WorkloadArg;
use lab::affinity::Placement;
use lab::harness::Spread;

impl Outcome {
    /// Seconds of the whole workload, bridged and direct.
    pub(crate) fn seconds(&self) -> (Spread, Spread) {
        (
            Spread::of(self.bridged.iter().map(|r| r.seconds)),
            Spread::of(self.direct.iter().map(|r| r.seconds)),
        )
    }

    /// The overhead in percent, bridged against direct, of each pair of runs made in turn.
    pub(crate) fn overhead(&self) -> Spread {
        Spread::of(self.bridged.iter().zip(&self.direct).map(|(b, d)| (b.seconds / d.seconds - 1.0) * 100.0))
    }

    /// Step `i`'s seconds, bridged and direct.
    pub(super) fn step(&self, i: usize) -> (Spread, Spread) {
        let of = |runs: &[WorkloadReport]| {
            Spread::of(runs.iter().filter_map(|r| r.steps.get(i)).map(|s| s.seconds))
        };
        (of(&self.bridged), of(&self.direct))
    }

    /// Gbit/s of the workload's copies, (host→device, device→host), medians.
    pub(super) fn dma(runs: &[WorkloadReport]) -> (f64, f64) {
        (
            Spread::of(runs.iter().map(|r| gbps(r.h2d.0, r.h2d.1))).median,
            Spread::of(runs.iter().map(|r| gbps(r.d2h.0, r.d2h.1))).median,
        )
    }
}

pub(super) fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

pub(super) fn gbps(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 { bytes as f64 * 8.0 / seconds / 1e9 } else { 0.0 }
}

/// What the runs found: the workload through the bridges and directly, in turns.
pub(crate) struct Outcome {
    pub(crate) bridged: Vec<WorkloadReport>,
    pub(crate) direct: Vec<WorkloadReport>,
    pub(crate) rtt: (Duration, Duration),
    pub(crate) direct_rtt: (Duration, Duration),
    pub(crate) host: HostStats,
    pub(crate) driver: String,
    pub(crate) offload: link::driver::OffloadState,
    /// The link's MTU and the device's Max_Payload_Size through it.
    pub(crate) sizes: (usize, u32),
    /// The workload's transaction profile, counted on the direct platform (one run, the
    /// last), with that platform's copy rates.
    pub(crate) profile: Profile,
    /// The link as measured before the runs: MMIO round trip p50 and bulk rates.
    pub(crate) link: LinkParams,
    pub(crate) workload: WorkloadArg,
    /// Where `--pin` put the threads (none: unpinned).
    pub(crate) placement: Option<Placement>,
    /// TLPs host→box and box→host over every bridged session of the workload, whole (what a
    /// `--capture` of it holds).
    pub(crate) captured: (u64, u64),
}

impl Outcome {
    /// What the model predicts for the measured link, and the round trip (µs) at which it
    /// predicts 10 %.
    pub(crate) fn prediction(&self) -> (Prediction, Option<f64>) {
        let direct = self.seconds().1.median;
        (
            model::predict(&self.profile, direct, &self.link),
            model::crossing_rtt(&self.profile, direct, &self.link, 10.0).map(|s| s * 1e6),
        )
    }
}

pub(super) fn tlp_totals(h: &HostStats) -> BTreeMap<&'static str, u64> {
    let mut t = h.tlps_sent.clone();
    for (k, v) in &h.tlps_received {
        *t.entry(k).or_default() += v;
    }
    t
}
