//! What [`super::run`] found: the workload through the bridges and directly, the link as
//! measured, the transaction profile, and the figures a report derives from them.

use std::collections::BTreeMap;
use std::time::Duration;

use bridge_host::HostStats;
use testbed::workload::WorkloadReport;

use crate::affinity::Placement;
use crate::harness::Spread;
use crate::model::{self, LinkParams, Prediction, Profile};

/// What the runs found: the workload through the bridges and directly, in turns.
#[derive(Debug)]
pub struct Outcome {
    /// The bridged runs, in order.
    pub bridged: Vec<WorkloadReport>,
    /// The direct runs, each made right after the bridged run of the same index.
    pub direct: Vec<WorkloadReport>,
    /// Register reads through the bridges: p50 and p99.
    pub rtt: (Duration, Duration),
    /// Register reads on the direct platform: p50 and p99.
    pub direct_rtt: (Duration, Duration),
    /// The host endpoint's counters over the last bridged run.
    pub host: HostStats,
    /// The link driver the host endpoint ran.
    pub driver: String,
    /// The offloads the host endpoint's socket took.
    pub offload: link::driver::OffloadState,
    /// The link's MTU and the device's Max_Payload_Size through it.
    pub sizes: (usize, u32),
    /// The workload's transaction profile, counted on the direct platform (one run, the
    /// last), with that platform's copy rates.
    pub profile: Profile,
    /// The link as measured before the runs: MMIO round trip p50 and bulk rates.
    pub link: LinkParams,
    /// The workload that ran, sized.
    pub workload: testbed::workload::Workload,
    /// Where the threads were pinned (none: unpinned).
    pub placement: Option<Placement>,
    /// TLPs host→box and box→host over every bridged session of the workload, whole (what a
    /// capture of it holds).
    pub captured: (u64, u64),
    /// What the machine took during each pair's direct and bridged run ([`crate::steal`]):
    /// the hypervisor's steal (none where the threads were not placed or `/proc/stat` could
    /// not be read) and the threads' run-queue waits.
    pub taken: Vec<crate::steal::PairTaken>,
}

impl Outcome {
    /// Seconds of the whole workload, bridged and direct.
    pub fn seconds(&self) -> (Spread, Spread) {
        (
            Spread::of(self.bridged.iter().map(|r| r.seconds)),
            Spread::of(self.direct.iter().map(|r| r.seconds)),
        )
    }

    /// The overhead in percent, bridged against direct, of each pair of runs made in turn.
    pub fn overhead(&self) -> Spread {
        Spread::of(self.bridged.iter().zip(&self.direct).map(|(b, d)| (b.seconds / d.seconds - 1.0) * 100.0))
    }

    /// `verdict` of each pair's taken time and its runs' lengths.
    fn each_pair(
        &self,
        verdict: fn(&crate::steal::PairTaken, Duration, Duration) -> Option<bool>,
    ) -> Vec<Option<bool>> {
        let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
        let runs = self.direct.iter().zip(&self.bridged).map(|(d, b)| (secs(d.seconds), secs(b.seconds)));
        crate::steal::PairTaken::each(&self.taken, runs, verdict)
    }

    /// Whether each pair's direct or bridged run had a share of its time taken by the
    /// hypervisor ([`crate::steal::stole_from`]); `None` where the steal was not read.
    pub fn stolen_from(&self) -> Vec<Option<bool>> {
        self.each_pair(crate::steal::PairTaken::stole_from)
    }

    /// Whether each pair's threads waited for a CPU another task held a share of a run
    /// ([`crate::steal::contended`]); `None` where the waits were not read.
    pub fn contended(&self) -> Vec<Option<bool>> {
        self.each_pair(crate::steal::PairTaken::contended)
    }

    /// Step `i`'s seconds, bridged and direct.
    pub fn step(&self, i: usize) -> (Spread, Spread) {
        let of = |runs: &[WorkloadReport]| {
            Spread::of(runs.iter().filter_map(|r| r.steps.get(i)).map(|s| s.seconds))
        };
        (of(&self.bridged), of(&self.direct))
    }

    /// Gbit/s of the runs' copies, (host→device, device→host), medians.
    pub fn dma(runs: &[WorkloadReport]) -> (f64, f64) {
        (
            Spread::of(runs.iter().map(|r| gbps(r.h2d.0, r.h2d.1))).median,
            Spread::of(runs.iter().map(|r| gbps(r.d2h.0, r.d2h.1))).median,
        )
    }

    /// What the model predicts for the measured link, and the round trip (µs) at which it
    /// predicts 10 %.
    pub fn prediction(&self) -> (Prediction, Option<f64>) {
        let direct = self.seconds().1.median;
        (
            model::predict(&self.profile, direct, &self.link),
            model::crossing_rtt(&self.profile, direct, &self.link, 10.0).map(|s| s * 1e6),
        )
    }
}

/// Gbit/s of `bytes` moved in `seconds` (0 for no time).
pub fn gbps(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 { bytes as f64 * 8.0 / seconds / 1e9 } else { 0.0 }
}

/// TLPs of each kind, sent and received together.
pub fn tlp_totals(h: &HostStats) -> BTreeMap<&'static str, u64> {
    let mut t = h.tlps_sent.clone();
    for (k, v) in &h.tlps_received {
        *t.entry(k).or_default() += v;
    }
    t
}
