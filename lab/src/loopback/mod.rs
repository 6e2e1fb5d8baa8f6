//! `dxpu loopback`'s experiment: both endpoints and a simulated GPU on one machine, over
//! real UDP loopback. The simgpu driver runs a workload (the demo, or one shaped like AI
//! work) through the bridges (every result checked against the CPU) and the same workload on
//! a directly attached simgpu, in turns, [`Options::repeat`] times each; the [`Outcome`]
//! holds both sets of runs, so that a report compares their medians with the spread (on a
//! shared two-core machine one run of each told the overhead anywhere from 9 to 155 %). The
//! direct runs count the workload's transaction profile, and the performance model
//! ([`crate::model`]) predicts the bridged time from it and the link's round trip and bulk
//! rates, measured before the runs.

use std::collections::BTreeMap;
use std::time::Duration;

use bridge_host::{HostStats, RemoteDevice};
use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use link::driver::{DriverKind, Impairment, PollMode, Tap};
use testbed::concurrent::ConcurrentAttach;
use testbed::direct::DirectAttach;
use testbed::workload::{Workload, WorkloadReport};

use crate::affinity::{self, Placement};
use crate::error::LabError;
use crate::harness::{Frames, LocalBox, Spread, mmio_rtt};
use crate::model::{self, LinkParams, Profile};
use crate::steal;

mod outcome;
pub mod report;

pub use outcome::{Outcome, gbps, tlp_totals};

/// Bridged runs made through one attachment before the next (see [`run`]).
const RUNS_PER_SESSION: u32 = 3;

/// Bytes of the copies that measure bulk rates before the runs.
const RATE_BYTES: usize = 16 << 20;

/// Host memory the direct platform lends its driver.
const DIRECT_MEMORY: usize = 256 << 20;

/// How the directly attached simgpu the bridged runs are compared with runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BaselineKind {
    /// Inside the driver's calls, on the driver's thread (`testbed::direct`): one thread busy.
    Synchronous,
    /// On a thread of its own beside the driver's (`testbed::concurrent`), as a GPU beside
    /// the CPU: two threads busy, as through the bridges.
    Concurrent,
}

/// What [`run`] runs, and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// The workload, sized.
    pub workload: Workload,
    /// The platform the bridged runs are compared with.
    pub baseline: BaselineKind,
    /// Runs each way, bridged and direct in turns (at least 1).
    pub repeat: u32,
    /// MMIO reads timed for the round-trip figures.
    pub rtt_samples: usize,
    /// Both endpoints' link driver.
    pub driver: DriverKind,
    /// Both endpoints' poll mode.
    pub poll: PollMode,
    /// What the link does to datagrams each way (its seed is set per side).
    pub impairment: Impairment,
    /// Tagged or encrypted frames.
    pub frames: Frames,
    /// Where the host endpoint's link is copied to (a capture), if anywhere.
    pub tap: Option<Tap>,
    /// The CPUs the spinning threads run on; `None` leaves them to the scheduler.
    pub placement: Option<Placement>,
}

impl Options {
    /// The impairment one side applies, with that side's seed.
    fn impairment(&self, seed: u64) -> Impairment {
        Impairment { seed, ..self.impairment }
    }
}

/// Runs `o.workload` through the bridges and directly, in turns, and says each step through
/// `progress`. The calling thread is pinned as `o.placement` says while it runs and gets its
/// CPUs back however this returns.
pub fn run(o: &Options, progress: &mut dyn FnMut(&str)) -> Result<Outcome, LabError> {
    let _restore = affinity::Restore::here().map_err(LabError::cpus("the workload's"))?;
    let placement = o.placement;
    // Bridged turns: the box's thread (the device) on the device's CPU, the workload's on
    // the host's. Direct turns: the device computes on the device's CPU — the synchronous
    // baseline in the workload's thread, the concurrent one in its own beside the driver on
    // the host's — and the idle box's thread waits on the host's CPU: it spins for its
    // budget after every keepalive, which would be taken from the direct device's CPU.
    let pin = |cpu: usize| affinity::pin(&[cpu]).map_err(LabError::cpus("the workload's"));
    let bridged_turn = |gpu: &LocalBox| match placement {
        Some(p) => gpu.pin(p.device).and_then(|()| pin(p.host)),
        None => Ok(()),
    };
    let direct_turn = |gpu: &LocalBox| match placement {
        Some(p) => gpu.pin(p.host).and_then(|()| {
            pin(match o.baseline {
                BaselineKind::Synchronous => p.device,
                BaselineKind::Concurrent => p.host,
            })
        }),
        None => Ok(()),
    };
    // Attaching from the host's CPU: the host endpoint's service thread starts there too.
    let on_host = || affinity::pin_to(placement.map(|p| p.host)).map_err(LabError::cpus("the host's driver"));
    // A box and an attachment of their own for every RUNS_PER_SESSION bridged runs, each
    // attachment warmed by one run not counted: sessions differ from one to the next (on
    // this machine some run whole copies at half the rate of others), and a figure over one
    // session says more about that session than about the bridges.
    let attach = |progress: &mut dyn FnMut(&str)| attach_box(o, progress);
    on_host()?;
    let (gpu, mut d) = attach(progress)?;
    let driver_name = d.pci().driver_name().to_string();
    let (offload, sizes) = (d.pci().offload(), d.pci().payload_sizes());
    progress("timing MMIO reads and bulk copies");
    let rtt = mmio_rtt(&mut d, o.rtt_samples);
    // Bulk rates differ from one session to the next (docs/performance.md, "slow
    // sessions"): measured on every attachment the runs use, the model takes their medians.
    let rates_of = |d: &mut SimGpuDriver<RemoteDevice>| {
        model::copy_rates(d, RATE_BYTES, 1).map_err(LabError::driver("bridged", "copies"))
    };
    let mut session_rates = vec![rates_of(&mut d)?];
    direct_turn(&gpu)?;
    let mut direct = Baseline::open(o.baseline, placement.map(|p| p.device))?;
    let direct_rtt = direct.mmio_rtt(o.rtt_samples);
    let direct_rates = direct.copy_rates()?;
    let size = o.workload;
    let mut profile = count_profile(size)?;
    (profile.direct_h2d_bytes_per_s, profile.direct_d2h_bytes_per_s) = direct_rates;
    // The first attachment is warmed by the round-trip samples' session and one run.
    bridged_turn(&gpu)?;
    warm_up(&mut d, size, "bridged", progress)?;
    direct_turn(&gpu)?;
    direct.run(size, " (warm-up)", progress)?;
    // In turns, so that what the machine does meanwhile falls on both alike.
    let (mut bridged, mut direct_runs, mut taken) = (Vec::new(), Vec::new(), Vec::new());
    let mut current = Some((gpu, d));
    let mut host = HostStats::default();
    // TLPs each way over every attachment's whole session (what a capture of it holds).
    let mut captured = (0u64, 0u64);
    let repeat = o.repeat.max(1);
    for i in 1..=repeat {
        let of = if repeat > 1 { format!(" ({i} of {repeat})") } else { String::new() };
        on_host()?;
        let (gpu, mut d) = match current.take() {
            Some(c) => c,
            None => {
                let (gpu, mut d) = attach(progress)?;
                warm_up(&mut d, size, "bridged", progress)?;
                session_rates.push(rates_of(&mut d)?);
                (gpu, d)
            }
        };
        bridged_turn(&gpu)?;
        let b0 = steal::Reading::now(placement);
        let before = d.pci().stats();
        bridged.push(
            size.run(&mut d, &mut |s| progress(&format!("bridged{of}: {s}")))
                .map_err(workload_error("bridged", &of))?,
        );
        let b1 = steal::Reading::now(placement);
        // What one run sent and received: the last one's.
        host = one_run(&before, &d.pci().stats());
        direct_turn(&gpu)?;
        let d0 = steal::Reading::now(placement);
        direct_runs.push(direct.run(size, &of, progress)?);
        taken.push(steal::PairTaken::of([&d0, &steal::Reading::now(placement)], [&b0, &b1]));
        if i % RUNS_PER_SESSION == 0 || i == repeat {
            let last = d.into_pci().detach_counted();
            captured.0 += last.link.tlps_sent;
            captured.1 += last.link.tlps_received;
            drop(gpu);
        } else {
            current = Some((gpu, d));
        }
    }
    let link = LinkParams {
        rtt_ns: rtt.0.as_nanos() as f64,
        h2d_bytes_per_s: Spread::of(session_rates.iter().map(|r| r.0)).median,
        d2h_bytes_per_s: Spread::of(session_rates.iter().map(|r| r.1)).median,
        ..LinkParams::LOCAL
    };
    Ok(Outcome {
        bridged,
        direct: direct_runs,
        rtt,
        direct_rtt,
        host,
        driver: driver_name,
        offload,
        sizes,
        profile,
        link,
        workload: o.workload,
        placement,
        captured,
        taken,
    })
}

/// A box of its own on loopback and gpu0 attached through the host endpoint, for [`run`]'s
/// bridged turns.
fn attach_box(
    o: &Options,
    progress: &mut dyn FnMut(&str),
) -> Result<(LocalBox, SimGpuDriver<RemoteDevice>), LabError> {
    let gpu = LocalBox::start_offload(
        o.driver,
        o.poll,
        o.impairment(11),
        o.frames,
        link::driver::Offload::AUTO,
        o.placement.map(|p| p.device),
    )?;
    progress("attaching gpu0 through the host endpoint");
    let mut a = gpu.attach_options(o.driver, o.poll, o.impairment(12));
    a.tap = o.tap.clone();
    // Distance adds to every round trip: keep the timeout above it.
    a.completion_timeout += 4 * (o.impairment.delay + o.impairment.jitter);
    let remote = RemoteDevice::attach(a)?;
    let d = SimGpuDriver::open(remote).map_err(LabError::driver("bridged", "opening the simgpu"))?;
    Ok((gpu, d))
}

/// The directly attached simgpu the bridged runs are compared with.
enum Baseline {
    /// The device runs inside the driver's calls (`testbed::direct`).
    Synchronous(Box<SimGpuDriver<DirectAttach<SimGpu>>>),
    /// The device runs on a thread of its own (`testbed::concurrent`).
    Concurrent(Box<SimGpuDriver<ConcurrentAttach<SimGpu>>>),
}

impl Baseline {
    /// The concurrent baseline's device thread is pinned to `cpu` where given.
    fn open(kind: BaselineKind, cpu: Option<usize>) -> Result<Baseline, LabError> {
        let opened = LabError::driver("direct", "opening the simgpu");
        Ok(match kind {
            BaselineKind::Synchronous => {
                Baseline::Synchronous(Box::new(SimGpuDriver::open(direct_platform()).map_err(opened)?))
            }
            BaselineKind::Concurrent => {
                let pin = move || {
                    if let Err(e) = affinity::pin_to(cpu) {
                        log::warn!("the direct device's thread: {e}");
                    }
                };
                let pci =
                    ConcurrentAttach::new_with(new_simgpu(), DIRECT_MEMORY, pin).map_err(LabError::Direct)?;
                Baseline::Concurrent(Box::new(SimGpuDriver::open(pci).map_err(opened)?))
            }
        })
    }

    /// One run, said through `progress` as `direct{of}: step`.
    fn run(
        &mut self,
        w: Workload,
        of: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<WorkloadReport, LabError> {
        let progress = &mut |s: &str| progress(&format!("direct{of}: {s}"));
        match self {
            Baseline::Synchronous(d) => w.run(d, progress),
            Baseline::Concurrent(d) => w.run(d, progress),
        }
        .map_err(workload_error("direct", of))
    }

    fn mmio_rtt(&mut self, n: usize) -> (Duration, Duration) {
        match self {
            Baseline::Synchronous(d) => mmio_rtt(d, n),
            Baseline::Concurrent(d) => mmio_rtt(d, n),
        }
    }

    fn copy_rates(&mut self) -> Result<(f64, f64), LabError> {
        match self {
            Baseline::Synchronous(d) => model::copy_rates(d, RATE_BYTES, 3),
            Baseline::Concurrent(d) => model::copy_rates(d, RATE_BYTES, 3),
        }
        .map_err(LabError::driver("direct", "copies"))
    }
}

fn new_simgpu() -> SimGpu {
    SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default())
}

/// The synchronous direct platform: the device runs inside the driver's calls.
fn direct_platform() -> DirectAttach<SimGpu> {
    DirectAttach::new(new_simgpu(), DIRECT_MEMORY)
}

/// One run of the workload through `d`, verified and not counted.
fn warm_up<P: driver::PciFunction>(
    d: &mut SimGpuDriver<P>,
    size: Workload,
    platform: &'static str,
    progress: &mut dyn FnMut(&str),
) -> Result<(), LabError> {
    size.run(d, &mut |s| progress(&format!("{platform} (warm-up): {s}")))
        .map(|_| ())
        .map_err(workload_error(platform, " (warm-up)"))
}

/// The counters a report shows, as far as they moved from `before` to `after`.
fn one_run(before: &HostStats, after: &HostStats) -> HostStats {
    let diff = |a: &BTreeMap<&'static str, u64>, b: &BTreeMap<&'static str, u64>| {
        b.iter()
            .map(|(k, v)| (*k, v.saturating_sub(a.get(k).copied().unwrap_or(0))))
            .filter(|(_, v)| *v > 0)
            .collect()
    };
    let mut h = after.clone();
    h.tlps_sent = diff(&before.tlps_sent, &after.tlps_sent);
    h.tlps_received = diff(&before.tlps_received, &after.tlps_received);
    h.interrupts = after.interrupts.saturating_sub(before.interrupts);
    h.link.retransmits = after.link.retransmits.saturating_sub(before.link.retransmits);
    h
}

/// A workload's transaction profile: one run, after a warm-up, on the synchronous direct
/// platform (which sees what the device waits on); its rates unknown.
pub fn count_profile(workload: Workload) -> Result<Profile, LabError> {
    let mut d =
        SimGpuDriver::open(direct_platform()).map_err(LabError::driver("direct", "opening the simgpu"))?;
    workload.run(&mut d, &mut |_| {}).map_err(workload_error("direct", " (warm-up)"))?;
    let before = (d.pci().counts(), d.stats());
    workload.run(&mut d, &mut |_| {}).map_err(workload_error("direct", ""))?;
    Ok(Profile::from_counts(d.pci().counts().since(&before.0), d.stats().since(&before.1)))
}

/// A workload's profile and its direct time: the median of `repeat` runs after a warm-up on
/// the synchronous direct platform, [`run`]'s default baseline.
pub fn count_direct(workload: Workload, repeat: u32) -> Result<(Profile, Spread), LabError> {
    let mut profile = count_profile(workload)?;
    let mut d =
        SimGpuDriver::open(direct_platform()).map_err(LabError::driver("direct", "opening the simgpu"))?;
    (profile.direct_h2d_bytes_per_s, profile.direct_d2h_bytes_per_s) =
        model::copy_rates(&mut d, RATE_BYTES, 3).map_err(LabError::driver("direct", "copies"))?;
    workload.run(&mut d, &mut |_| {}).map_err(workload_error("direct", " (warm-up)"))?;
    let mut seconds = Vec::new();
    for _ in 0..repeat.max(1) {
        seconds.push(workload.run(&mut d, &mut |_| {}).map_err(workload_error("direct", ""))?.seconds);
    }
    Ok((profile, Spread::of(seconds.into_iter())))
}

fn workload_error(
    platform: &'static str,
    run: &str,
) -> impl FnOnce(testbed::workload::WorkloadError) -> LabError {
    let run = run.to_string();
    move |source| LabError::Workload { platform, run, source }
}
