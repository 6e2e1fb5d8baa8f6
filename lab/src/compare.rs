//! A trace replayed directly attached and through both endpoints over UDP loopback, in
//! turns, at the speed the traced GPU ran it; each platform's link measured (register round
//! trip, posted write, fence, copy rates alone and in the replay); the model's prediction
//! from the trace and the link measured, beside the overhead measured
//! (docs/performance-model.md). `dxpu replay` prints what [`compare`] returns.

use std::time::Duration;

use driver::{PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use link::driver::{DriverKind, Impairment, PollMode};
use testbed::concurrent::ConcurrentAttach;

use crate::affinity::{self, Placement};
use crate::cores;
use crate::error::LabError;
use crate::harness::{LocalBox, Spread, mmio_rtt};
use crate::model::{self, LinkParams};
use crate::plan::{self, Plan};
use crate::replay::{ReplayError, ReplayRun, Replayer};
use crate::steal;
use crate::trace::Trace;

pub mod report;

/// How a comparison runs: its repeats, the link's impairment, the endpoints' drivers and
/// where the spinning threads go.
#[derive(Clone, Copy, Debug)]
pub struct CompareOptions {
    /// Replays each way, direct and bridged in turns, after one warm-up each.
    pub repeat: u32,
    /// What the link does to datagrams each way (its seed is set per endpoint).
    pub impairment: Impairment,
    /// The UDP driver both endpoints use.
    pub driver: DriverKind,
    /// How both endpoints wait for datagrams.
    pub poll: PollMode,
    /// The CPUs of the device (and the GPU-box endpoint) and of the job's thread; `None`:
    /// wherever the scheduler puts them.
    pub placement: Option<Placement>,
}

/// Host memory each platform lends the replay: the copies' buffers each way (at most
/// `lab::replay::MAX_COPY_BYTES`), the release words, rings.
const HOST_MEMORY: usize = 512 << 20;
/// Register reads timed for the round trip.
const RTT_SAMPLES: usize = 300;
/// Bytes of the copies that measure each platform's rates where the job has no copies that
/// way (a calibration without a trace).
const RATE_BYTES: usize = 16 << 20;

/// The copy sizes a calibration measures the rates at, each way: a job's byte-median copy
/// ([`Plan::copy_sizes`]), else 16 MiB.
pub fn rate_sizes(plan: Option<&Plan>) -> (usize, usize) {
    let (h, d) = plan.map_or((None, None), Plan::copy_sizes);
    let size = |s: Option<u64>| s.map_or(RATE_BYTES, |b| usize::try_from(b).unwrap_or(usize::MAX));
    (size(h), size(d))
}

/// One platform's measurements: its runs, round trip and copy rates.
pub struct Side {
    /// The replays, after the warm-up.
    pub runs: Vec<ReplayRun>,
    /// A register read's round trip, the median of the samples.
    pub rtt: Duration,
    /// One posted register write's cost to the host, ns.
    pub write_ns: f64,
    /// A fence's round trip with nothing queued (`testbed::workload::fence_rtt`).
    pub fence_rtt: Duration,
    /// The host → device copy rate, bytes per second, of one copy alone
    /// (`model::copy_rates_at`).
    pub h2d: f64,
    /// The device → host copy rate alone.
    pub d2h: f64,
    /// The sizes those copies were, host → device and device → host, bytes: the job's
    /// byte-median copy each way ([`rate_sizes`]) within what the calibration times.
    pub rates_at_bytes: (usize, usize),
}

impl Side {
    /// The rates the platform moved host memory at during its runs (median over the runs
    /// that had copies large enough to tell), each way; `None` where none did.
    pub fn in_replay(&self) -> (Option<f64>, Option<f64>) {
        (self.median(|r| r.copy_bytes_per_s.0), self.median(|r| r.copy_bytes_per_s.1))
    }

    /// The share of those copies' time the platform was served on the job's thread
    /// ([`ReplayRun::copy_served_share`]), median over the runs, each way.
    pub fn served_in_replay(&self) -> (Option<f64>, Option<f64>) {
        (self.median(|r| r.copy_served_share.0), self.median(|r| r.copy_served_share.1))
    }

    /// The median of `f` over the runs that have it; `None` where none has.
    fn median(&self, f: fn(&ReplayRun) -> Option<f64>) -> Option<f64> {
        let v: Vec<f64> = self.runs.iter().filter_map(f).collect();
        (!v.is_empty()).then(|| Spread::of(v.into_iter()).median)
    }
}

/// The host's time to send one posted register write, ns: the mean of `n` doorbell writes
/// (the fastest 98 % of them)
/// to a channel the replay does not use (the device ignores a doorbell of a channel without
/// a ring), each alone on an idle link, as a job's doorbells come — not back to back, where
/// the link queues most writes behind the first's send and a write costs a tenth of one
/// alone (0.57 µs against 7.6 µs through the bridges here: the model took the first and the
/// replay paid the second).
fn posted_write_ns<P: PciFunction>(d: &mut SimGpuDriver<P>, n: u32) -> f64 {
    let reg = simgpu_abi::chreg::at(simgpu_abi::CHANNELS - 1, simgpu_abi::chreg::DOORBELL);
    let mut each = Vec::with_capacity(n as usize);
    for _ in 0..n {
        // The last write sent and acknowledged: the link idle, as between a job's launches.
        let quiet = std::time::Instant::now() + WRITE_APART;
        while std::time::Instant::now() < quiet {
            d.pci().serve_for(WRITE_APART);
        }
        let t = std::time::Instant::now();
        d.write_reg(reg, 0);
        each.push(t.elapsed().as_nanos() as f64);
    }
    // The mean, but of the fastest 98 %: a write the scheduler took the thread from for a
    // slice (milliseconds, on a busy machine) is the machine's, not the link's.
    each.sort_by(f64::total_cmp);
    each.truncate((each.len() * 49).div_ceil(50).max(1));
    each.iter().sum::<f64>() / each.len().max(1) as f64
}

/// How long the link is left between the posted writes [`posted_write_ns`] times: past a
/// frame's acknowledgement at the largest delay a calibration is run at.
const WRITE_APART: Duration = Duration::from_micros(100);

fn measure<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    platform: &'static str,
    sizes: (usize, usize),
) -> Result<Side, LabError> {
    let (rtt, _) = mmio_rtt(d, RTT_SAMPLES);
    let write_ns = posted_write_ns(d, 500);
    let fence_rtt =
        testbed::workload::fence_rtt(d, RTT_SAMPLES).map_err(LabError::driver(platform, "fences"))?;
    let r = model::copy_rates_at(d, sizes.0, sizes.1).map_err(LabError::driver(platform, "copies"))?;
    Ok(Side {
        runs: Vec::new(),
        rtt,
        write_ns,
        fence_rtt,
        h2d: r.h2d,
        d2h: r.d2h,
        rates_at_bytes: r.at_bytes,
    })
}

/// A figure of `runs`, its median and spread.
pub fn spread(runs: &[ReplayRun], f: impl Fn(&ReplayRun) -> f64) -> Spread {
    Spread::of(runs.iter().map(f))
}

/// Whether a replay kept the traced job's pace: the bound, and how far it was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Faithfulness {
    /// The direct replay's GPU span over the trace's (median of the runs).
    pub span_ratio: f64,
    /// The direct replay's job time over the trace's.
    pub job_ratio: f64,
}

/// How far a faithful replay's span and job time may be from the trace's.
pub const FAITHFUL_WITHIN: f64 = 0.10;

impl Faithfulness {
    /// Both within [`FAITHFUL_WITHIN`] of the trace's.
    pub fn faithful(&self) -> bool {
        (self.span_ratio - 1.0).abs() <= FAITHFUL_WITHIN && (self.job_ratio - 1.0).abs() <= FAITHFUL_WITHIN
    }

    /// Why the replay is not the traced job, if it is not.
    pub fn why_not(&self) -> Option<String> {
        if self.faithful() {
            return None;
        }
        Some(format!(
            "the direct replay's GPU span is {:.2}× the trace's and its job {:.2}× (a faithful one is within ±{:.0} %): \
             the machine did not keep the traced job's pace (busy, or too few cores for the job's threads), so its \
             overheads are not the traced job's",
            self.span_ratio,
            self.job_ratio,
            FAITHFUL_WITHIN * 100.0
        ))
    }
}

/// What the bridged link did to recover frames during one bridged run: the host side's
/// session counters before and after it. A run whose link timed out often was slower than
/// the others of its invocation (docs/performance-model.md, *The host's looks at its
/// words*: the A100 job's pairs at 50–75 % had 60–70 replay timeouts, those at 33–37 % at
/// most 7) — frames late rather than lost, which the model does not have.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkRecovery {
    /// The host's replay timer expiries.
    pub replay_timeouts: u64,
    /// DATA frames the host sent again.
    pub retransmits: u64,
    /// DATA frames the host received again (the box's timeouts resending what had arrived).
    pub duplicates_received: u64,
}

impl LinkRecovery {
    /// What changed from `before` to `after`.
    pub fn between(before: &link::Stats, after: &link::Stats) -> LinkRecovery {
        LinkRecovery {
            replay_timeouts: after.replay_timeouts.saturating_sub(before.replay_timeouts),
            retransmits: after.retransmits.saturating_sub(before.retransmits),
            duplicates_received: after.duplicate_data.saturating_sub(before.duplicate_data),
        }
    }
}

/// What a comparison measured and predicted.
pub struct Comparison {
    /// The trace replayed.
    pub trace: Trace,
    /// Its dependency graph.
    pub plan: Plan,
    /// The directly attached simgpu's runs and link.
    pub direct: Side,
    /// The bridged simgpu's runs and link.
    pub bridged: Side,
    /// The link the model took, calibrated before any replay ran (blind to the replay):
    /// the bridges' round trip and posted write beyond the direct platform's, their rates
    /// of a copy alone, a fence's extra turns.
    pub link: LinkParams,
    /// The model with the direct platform's rates and no link.
    pub predicted_direct: plan::Outcome,
    /// The model at [`Comparison::link`].
    pub predicted_bridged: plan::Outcome,
    /// A baseline: the model with the bridges' copy rates alone (no round trip, no cost of
    /// a posted write).
    pub predicted_bandwidth_only: plan::Outcome,
    /// The traced job's own time (the plan with no link), ns.
    pub trace_job_ns: f64,
    /// Whether the direct replay kept the traced job's pace.
    pub faithfulness: Faithfulness,
    /// The round trip, µs, at which the model crosses 10 % at the bridges' rates.
    pub crosses_10_percent_at_rtt_us: Option<f64>,
    /// Each pair's overhead, bridged over direct, percent.
    pub overheads: Vec<f64>,
    /// The model's overhead for each pair, percent, from a calibration of both platforms
    /// made just before that pair ran (still blind to the replays): on a machine whose
    /// state drifts between seconds — this one's cores move between dies, and its copy
    /// rates with them — a calibration seconds before can be another machine's.
    pub pair_predictions: Vec<f64>,
    /// What the bridged link did to recover frames in each pair's bridged run.
    pub recovery: Vec<LinkRecovery>,
    /// What the machine took during each pair's direct and bridged run ([`steal`]): the
    /// hypervisor's steal (the most from either placed CPU; none where the threads were not
    /// placed or `/proc/stat` could not be read) and the threads' run-queue waits.
    pub taken: Vec<steal::PairTaken>,
    /// The placed CPUs' round trip at the calibration and after each pair: whether the
    /// machine stayed the one calibrated (none where the threads were not placed, or it
    /// could not be measured).
    pub cores: Option<cores::RoundTrips>,
}

impl Comparison {
    /// The model's overhead, percent.
    pub fn predicted_overhead_percent(&self) -> f64 {
        overhead_percent(self.predicted_bridged.job_ns, self.predicted_direct.job_ns)
    }

    /// The bandwidth-only baseline's overhead, percent.
    pub fn bandwidth_only_overhead_percent(&self) -> f64 {
        overhead_percent(self.predicted_bandwidth_only.job_ns, self.predicted_direct.job_ns)
    }

    /// `verdict` of each pair's taken time and its runs' lengths.
    fn each_pair(
        &self,
        verdict: fn(&steal::PairTaken, Duration, Duration) -> Option<bool>,
    ) -> Vec<Option<bool>> {
        let ns = |x: f64| Duration::from_nanos(x.max(0.0) as u64);
        let runs = self.direct.runs.iter().zip(&self.bridged.runs).map(|(d, b)| (ns(d.job_ns), ns(b.job_ns)));
        steal::PairTaken::each(&self.taken, runs, verdict)
    }

    /// Whether each pair's direct or bridged run had a share of its time taken by the
    /// hypervisor ([`steal::stole_from`]); `None` where the steal was not read.
    pub fn stolen_from(&self) -> Vec<Option<bool>> {
        self.each_pair(steal::PairTaken::stole_from)
    }

    /// Whether each pair's threads waited for a CPU another task held a share of a run
    /// ([`steal::contended`]); `None` where the waits were not read.
    pub fn contended(&self) -> Vec<Option<bool>> {
        self.each_pair(steal::PairTaken::contended)
    }

    /// Either: the pair measured the machine.
    pub fn taken_from(&self) -> Vec<Option<bool>> {
        self.each_pair(steal::PairTaken::taken_from)
    }

    /// Each bridged run's job time over the trace's own, percent.
    pub fn overheads_against_trace(&self) -> Vec<f64> {
        self.bridged.runs.iter().map(|r| (r.job_ns / self.trace_job_ns - 1.0) * 100.0).collect()
    }
}

/// Whether the direct runs of `trace` kept its pace.
fn faithfulness(direct: &[ReplayRun], trace: &Trace, trace_job_ns: f64) -> Faithfulness {
    let span = trace.gpu_span_ns().max(1) as f64;
    Faithfulness {
        span_ratio: spread(direct, |r| r.gpu_span_ns).median / span,
        job_ratio: spread(direct, |r| r.job_ns).median / trace_job_ns.max(1.0),
    }
}

/// The two platforms a comparison runs on: a simgpu directly attached (on a thread of its
/// own, as a GPU beside the CPU) and one through both endpoints over UDP loopback, the
/// spinning threads placed as asked.
struct Platforms {
    direct: SimGpuDriver<ConcurrentAttach<SimGpu>>,
    bridged: SimGpuDriver<bridge_host::RemoteDevice>,
    gpu: LocalBox,
    placement: Option<Placement>,
    poll: PollMode,
}

impl Platforms {
    /// Sets both up (the caller's thread pinned to the host's CPU where placed).
    fn open(opts: &CompareOptions, progress: &mut dyn FnMut(&str)) -> Result<Platforms, LabError> {
        let placement = opts.placement;
        // Left to the scheduler, a wake-up sometimes put the job's thread and the device's on
        // one CPU, where they took turns for milliseconds (a 0.4 ms job took 2-10 ms one run
        // in twenty). The job's thread (and the host endpoint's service thread, started from
        // it) on the host's CPU; the device's, either way, on the device's; the idle box's out
        // of the direct device's way.
        affinity::pin_to(placement.map(|p| p.host)).map_err(LabError::cpus("the job's thread"))?;
        progress("directly attached simgpu: setting up");
        let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
        let device_cpu = placement.map(|p| p.device);
        let pin_device = move || {
            if let Err(e) = affinity::pin_to(device_cpu) {
                log::warn!("the direct device's thread: {e}");
            }
        };
        let pci = ConcurrentAttach::new_with(dev, HOST_MEMORY, pin_device).map_err(LabError::Direct)?;
        let direct = SimGpuDriver::open(pci).map_err(LabError::driver("direct", "opening the simgpu"))?;

        progress("both endpoints over UDP loopback: attaching");
        let poll = opts.poll;
        let gpu = LocalBox::start(opts.driver, poll, Impairment { seed: 31, ..opts.impairment })?;
        let mut o = gpu.attach_options(opts.driver, poll, Impairment { seed: 32, ..opts.impairment });
        o.dma_memory = HOST_MEMORY;
        // The host endpoint runs on the job's thread here (no core of its own): it answers the
        // device's reads in short slices, and the replay lends it the time until its next step.
        o.answer_slice = Some(crate::replay::HOST_ANSWER_SLICE);
        o.completion_timeout += 4 * (opts.impairment.delay + opts.impairment.jitter);
        let remote = bridge_host::RemoteDevice::attach(o)?;
        let bridged =
            SimGpuDriver::open(remote).map_err(LabError::driver("bridged", "opening the simgpu"))?;
        Ok(Platforms { direct, bridged, gpu, placement, poll })
    }

    /// Waits for the other platform's threads to stop spinning: the box's endpoint
    /// busy-polls for its spin after its last datagram, the direct device's thread for its
    /// own budget, and a third spinning thread on two cores made a 0.4 ms direct run take
    /// 4-12 ms (the scheduler's slice).
    fn settle(&self) {
        std::thread::sleep(spin_of(self.poll).max(testbed::concurrent::SPIN) * 2);
    }

    /// The box's endpoint out of the direct device's way (on the host's CPU), for a direct
    /// turn.
    fn direct_turn(&self) -> Result<(), LabError> {
        self.placement.map_or(Ok(()), |p| self.gpu.pin(p.host))
    }

    /// The box's endpoint on the device's CPU, for a bridged turn.
    fn bridged_turn(&self) -> Result<(), LabError> {
        self.placement.map_or(Ok(()), |p| self.gpu.pin(p.device))
    }

    /// Each platform's link, measured with the other quiet.
    fn calibrate(&mut self, sizes: (usize, usize)) -> Result<(Side, Side), LabError> {
        self.direct_turn()?;
        self.settle();
        let d = measure(&mut self.direct, "direct", sizes)?;
        self.bridged_turn()?;
        self.settle();
        let b = measure(&mut self.bridged, "bridged", sizes)?;
        Ok((d, b))
    }

    fn close(self) {
        self.bridged.into_pci().detach();
    }

    /// The placed CPUs' round trip now, ns, the other threads quiet (none where the threads
    /// are not placed; a measurement that failed is logged and none).
    fn round_trip_ns(&self) -> Option<f64> {
        let p = self.placement?;
        self.settle();
        cores::round_trip_ns(p.host, p.device)
    }
}

/// Both platforms' links as a comparison calibrates them, before any replay.
pub struct Calibration {
    /// The directly attached simgpu's measurements.
    pub direct: Side,
    /// The bridged simgpu's.
    pub bridged: Side,
    /// The link the model takes for the direct platform: its copy rates, nothing else.
    pub direct_link: LinkParams,
    /// The link the model takes through the bridges ([`links`]).
    pub link: LinkParams,
    /// The placed CPUs (device's, host's) and their round trip at the calibration, ns.
    pub cores: Option<((usize, usize), f64)>,
}

/// Calibrates both platforms as [`compare`] does before it replays, without replaying: what
/// `dxpu model --trace --calibrate` evaluates `plan` at (its copy rates at the plan's copy
/// sizes; without a plan, at 16 MiB).
pub fn calibrate(
    opts: &CompareOptions,
    plan: Option<&Plan>,
    progress: &mut dyn FnMut(&str),
) -> Result<Calibration, LabError> {
    let _restore = affinity::Restore::here().map_err(LabError::cpus("the job's thread"))?;
    let mut p = Platforms::open(opts, progress)?;
    progress("calibrating the link");
    let at = p.round_trip_ns();
    let (direct, bridged) = p.calibrate(rate_sizes(plan))?;
    let cores = p.placement.zip(at).map(|(pl, at)| ((pl.device, pl.host), at));
    p.close();
    let (direct_link, link) = links(&direct, &bridged);
    Ok(Calibration { direct, bridged, direct_link, link, cores })
}

/// Replays `trace` directly attached and through both endpoints in turns, as `opts` says,
/// telling `progress` what it does; the model's prediction comes from a calibration of each
/// platform before any replay runs.
pub fn compare(
    trace: Trace,
    opts: &CompareOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Comparison, LabError> {
    let plan = Plan::of(&trace);
    // The caller's thread gets its CPUs back however this returns.
    let _restore = affinity::Restore::here().map_err(LabError::cpus("the job's thread"))?;
    let mut p = Platforms::open(opts, progress)?;
    let mut direct_replayer = Replayer::new(&mut p.direct, &plan).map_err(replay_error("direct"))?;
    let mut bridged_replayer = Replayer::new(&mut p.bridged, &plan).map_err(replay_error("bridged"))?;
    // The link calibrated before any replay, each platform quiet: the model never sees
    // what the replay measures.
    progress("calibrating the link");
    let at_calibration = p.round_trip_ns();
    let (d_side, b_side) = p.calibrate(rate_sizes(Some(&plan)))?;
    let (direct_link, bridged_link) = links(&d_side, &b_side);
    let trace_job_ns = plan.evaluate(&LinkParams::LOCAL).job_ns;
    let predicted_direct = plan.evaluate(&direct_link);
    let predicted_bridged = plan.evaluate(&bridged_link);
    let bandwidth_only = LinkParams {
        h2d_bytes_per_s: bridged_link.h2d_bytes_per_s,
        d2h_bytes_per_s: bridged_link.d2h_bytes_per_s,
        ..LinkParams::LOCAL
    };
    let predicted_bandwidth_only = plan.evaluate(&bandwidth_only);
    let crosses = plan.crossing_rtt_ns(&bridged_link, 10.0).map(|ns| ns / 1e3);

    // A warm-up each (VRAM and host memory touched once), then in turns.
    progress("warm-up");
    p.direct_turn()?;
    direct_replayer.run(&mut p.direct, &plan).map_err(replay_error("direct"))?;
    p.bridged_turn()?;
    bridged_replayer.run(&mut p.bridged, &plan).map_err(replay_error("bridged"))?;
    let (mut d_runs, mut b_runs, mut overheads) = (Vec::new(), Vec::new(), Vec::new());
    let (mut recovery, mut taken) = (Vec::new(), Vec::new());
    let (mut after_pairs, mut pair_predictions) = (Vec::new(), Vec::new());
    for i in 0..opts.repeat {
        progress(&format!("calibrating for replay {} of {}", i + 1, opts.repeat));
        let (d_now, b_now) = p.calibrate(rate_sizes(Some(&plan)))?;
        let (d_link, b_link) = links(&d_now, &b_now);
        pair_predictions.push(overhead_percent(plan.evaluate(&b_link).job_ns, plan.evaluate(&d_link).job_ns));
        progress(&format!("replay {} of {}", i + 1, opts.repeat));
        p.direct_turn()?;
        p.settle();
        let s0 = steal::Reading::now(p.placement);
        let d = direct_replayer.run(&mut p.direct, &plan).map_err(replay_error("direct"))?;
        let s1 = steal::Reading::now(p.placement);
        p.bridged_turn()?;
        p.settle();
        let s2 = steal::Reading::now(p.placement);
        let before = p.bridged.pci().stats().link;
        let b = bridged_replayer.run(&mut p.bridged, &plan).map_err(replay_error("bridged"))?;
        recovery.push(LinkRecovery::between(&before, &p.bridged.pci().stats().link));
        taken.push(steal::PairTaken::of([&s0, &s1], [&s2, &steal::Reading::now(p.placement)]));
        overheads.push(overhead_percent(b.job_ns, d.job_ns));
        d_runs.push(d);
        b_runs.push(b);
        after_pairs.extend(p.round_trip_ns());
    }
    let cores = p.placement.zip(at_calibration).map(|(pl, at)| cores::RoundTrips {
        cpus: (pl.device, pl.host),
        first_ns: at,
        later_ns: after_pairs,
    });
    p.close();
    let faithfulness = faithfulness(&d_runs, &trace, trace_job_ns);
    let (mut d_side, mut b_side) = (d_side, b_side);
    (d_side.runs, b_side.runs) = (d_runs, b_runs);
    Ok(Comparison {
        trace,
        plan,
        direct: d_side,
        bridged: b_side,
        link: bridged_link,
        predicted_direct,
        predicted_bridged,
        predicted_bandwidth_only,
        trace_job_ns,
        faithfulness,
        crosses_10_percent_at_rtt_us: crosses,
        overheads,
        pair_predictions,
        recovery,
        taken,
        cores,
    })
}

/// `bridged` over `direct`, percent more.
fn overhead_percent(bridged_ns: f64, direct_ns: f64) -> f64 {
    (bridged_ns / direct_ns - 1.0) * 100.0
}

/// The links the model takes from each platform's calibration: the direct platform's copy
/// rates and no link; through the bridges, their copy rates alone, their round trip and the
/// host's cost of a posted write beyond the direct platform's, and a command fetch's turns.
pub fn links(direct: &Side, bridged: &Side) -> (LinkParams, LinkParams) {
    let direct_link =
        LinkParams { h2d_bytes_per_s: direct.h2d, d2h_bytes_per_s: direct.d2h, ..LinkParams::LOCAL };
    let rtt_ns = bridged.rtt.saturating_sub(direct.rtt).as_nanos() as f64;
    let posted_write_ns = (bridged.write_ns - direct.write_ns).max(0.0);
    // A fence's round trip through the bridges beyond the direct one is a submission (two
    // posted writes), a command fetch (1.5 round trips and its turns) and the fence's way
    // back (half of one): what is left over is the fetch's turns.
    let fence_added = bridged.fence_rtt.saturating_sub(direct.fence_rtt).as_nanos() as f64;
    let bridged_link = LinkParams {
        rtt_ns,
        h2d_bytes_per_s: bridged.h2d,
        d2h_bytes_per_s: bridged.d2h,
        posted_write_ns,
        fetch_extra_ns: (fence_added - 2.0 * rtt_ns - 2.0 * posted_write_ns).max(0.0),
    };
    (direct_link, bridged_link)
}

/// How long an endpoint polling `poll` spins after its last datagram.
fn spin_of(poll: PollMode) -> Duration {
    match poll {
        PollMode::Busy { spin } => spin,
        _ => Duration::ZERO,
    }
}

fn replay_error(platform: &'static str) -> impl FnOnce(ReplayError) -> LabError {
    move |source| LabError::Replay { platform, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runs_link_recovery_is_what_its_counters_moved_and_never_less_than_nothing() {
        let before =
            link::Stats { replay_timeouts: 3, retransmits: 5, duplicate_data: 7, ..Default::default() };
        let after =
            link::Stats { replay_timeouts: 70, retransmits: 75, duplicate_data: 9, ..Default::default() };
        let k = LinkRecovery::between(&before, &after);
        assert_eq!((k.replay_timeouts, k.retransmits, k.duplicates_received), (67, 70, 2));
        // Counters of a session made again (a reattach) start over: nothing, not a wrap.
        assert_eq!(LinkRecovery::between(&after, &before), LinkRecovery::default());
    }
}
