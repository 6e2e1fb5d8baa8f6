//! `dxpu replay TRACE`: a PyTorch profiler trace replayed on the simgpu at the speed the
//! traced GPU ran it, directly attached and through both endpoints over UDP loopback, in
//! turns; the overhead, where the added time went, and what the model predicts from the
//! trace and the link measured (`testbed::replay`, `testbed::plan`; docs/performance-model.md).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use driver::{PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use link::driver::Impairment;
use serde_json::{Value, json};
use testbed::concurrent::ConcurrentAttach;
use testbed::model;
use testbed::plan::{self, Plan};
use testbed::replay::{ReplayRun, Replayer};

use crate::affinity;
use crate::args::{EndpointArgs, ImpairArgs};
use crate::harness::{LocalBox, Spread, mmio_rtt};
use crate::model::{added_json, trace_json, trace_summary};

/// Options of `dxpu replay`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ReplayArgs {
    /// The trace: torch.profiler's Chrome trace JSON, plain or gzip.
    #[arg(value_name = "TRACE")]
    trace: std::path::PathBuf,
    /// The GPU (rank) whose activities to take, where the file holds several.
    #[arg(long)]
    rank: Option<u32>,
    /// The most bytes the file, and the JSON it inflates to, may have (a gzip file may not
    /// inflate past 100 times its size either).
    #[arg(long, default_value_t = testbed::trace::ReadLimits::default().max_bytes)]
    max_trace_bytes: u64,
    /// Replays each way, direct and bridged in turns, after one warm-up each (1..=100).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    #[command(flatten)]
    impair: ImpairArgs,
    /// The link's rate each way, Gbit/s (0: the loopback's own).
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate)]
    rate_gbit: f64,
    #[command(flatten)]
    endpoints: EndpointArgs,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("rate {s:?}: not a number"))?;
    if !v.is_finite() || !(0.0..=1600.0).contains(&v) {
        return Err(format!("rate {s} Gbit/s: must be 0..=1600"));
    }
    Ok(v)
}

impl ReplayArgs {
    fn impairment(&self, seed: u64) -> Impairment {
        Impairment { rate: (self.rate_gbit * 1e9 / 8.0) as u64, ..self.impair.impairment(seed) }
    }
}

/// Host memory each platform lends the replay: the copies' buffers each way (at most
/// `testbed::replay::MAX_COPY_BYTES`), the release words, rings.
const HOST_MEMORY: usize = 512 << 20;
/// Register reads timed for the round trip.
const RTT_SAMPLES: usize = 300;
/// Bytes of the copies that measure each platform's rates.
const RATE_BYTES: usize = 16 << 20;

/// One platform's measurements: its runs, round trip and copy rates.
struct Side {
    runs: Vec<ReplayRun>,
    rtt: Duration,
    /// One posted register write's cost to the host, ns.
    write_ns: f64,
    /// A fence's round trip with nothing queued (`testbed::workload::fence_rtt`).
    fence_rtt: Duration,
    /// Copy rates, bytes per second, of one copy alone (`model::copy_rates`).
    h2d: f64,
    d2h: f64,
}

impl Side {
    /// The rates the platform moved host memory at during its runs (median over the runs
    /// that had copies large enough to tell), each way; `None` where none did.
    fn in_replay(&self) -> (Option<f64>, Option<f64>) {
        let median = |f: fn(&ReplayRun) -> Option<f64>| {
            let v: Vec<f64> = self.runs.iter().filter_map(f).collect();
            (!v.is_empty()).then(|| Spread::of(v.into_iter()).median)
        };
        (median(|r| r.copy_bytes_per_s.0), median(|r| r.copy_bytes_per_s.1))
    }

    /// The link the model takes for this platform: its copies at the rates they got during
    /// the replay where it tells them (the host endpoint serves them on the job's thread
    /// here, and a copy alone gets more than one beside the job's work), else alone.
    fn model_rates(&self) -> (f64, f64) {
        let (h2d, d2h) = self.in_replay();
        (h2d.unwrap_or(self.h2d), d2h.unwrap_or(self.d2h))
    }
}

/// The host's time to send one posted register write, ns: the mean of `n` doorbell writes
/// to a channel the replay does not use (the device ignores a doorbell of a channel without
/// a ring).
fn posted_write_ns<P: PciFunction>(d: &mut SimGpuDriver<P>, n: u32) -> f64 {
    let reg = simgpu_abi::chreg::at(simgpu_abi::CHANNELS - 1, simgpu_abi::chreg::DOORBELL);
    let t = std::time::Instant::now();
    for _ in 0..n {
        d.write_reg(reg, 0);
    }
    t.elapsed().as_nanos() as f64 / f64::from(n.max(1))
}

fn measure<P: PciFunction>(d: &mut SimGpuDriver<P>, what: &str) -> Result<Side, String> {
    let (rtt, _) = mmio_rtt(d, RTT_SAMPLES);
    let write_ns = posted_write_ns(d, 2000);
    let fence_rtt =
        testbed::workload::fence_rtt(d, RTT_SAMPLES).map_err(|e| format!("{what} fences: {e}"))?;
    let (h2d, d2h) = model::copy_rates(d, RATE_BYTES, 3).map_err(|e| format!("{what} copies: {e}"))?;
    Ok(Side { runs: Vec::new(), rtt, write_ns, fence_rtt, h2d, d2h })
}

fn spread(runs: &[ReplayRun], f: impl Fn(&ReplayRun) -> f64) -> Spread {
    Spread::of(runs.iter().map(f))
}

struct Report {
    trace: testbed::trace::Trace,
    plan: Plan,
    direct: Side,
    bridged: Side,
    /// The model: with the direct platform's rates and no link, and with the bridges'.
    /// The link the model took.
    link: plan::Link,
    predicted_direct: plan::Outcome,
    predicted_bridged: plan::Outcome,
    crosses: Option<f64>,
    overheads: Vec<f64>,
}

fn run(args: &ReplayArgs, progress: &mut dyn FnMut(&str)) -> Result<Report, String> {
    let limits = testbed::trace::ReadLimits { max_bytes: args.max_trace_bytes };
    let trace = testbed::trace::read_with(&args.trace, args.rank, limits).map_err(|e| e.to_string())?;
    let plan = Plan::of(&trace);
    // The caller's thread gets its CPUs back however this returns.
    let _restore = affinity::Restore::here()?;
    let placement = args.endpoints.placement("the job's host", progress)?;
    // Left to the scheduler, a wake-up sometimes put the job's thread and the device's on one
    // CPU, where they took turns for milliseconds (a 0.4 ms job took 2-10 ms one run in
    // twenty). The job's thread (and the host endpoint's service thread, started from it)
    // on the host's CPU; the device's, either way, on the device's; the idle box's out of
    // the direct device's way.
    affinity::pin_to(placement.map(|p| p.host))?;
    progress("directly attached simgpu: setting up");
    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    let device_cpu = placement.map(|p| p.device);
    let pin_device = move || {
        if let Err(e) = affinity::pin_to(device_cpu) {
            log::warn!("the direct device's thread: {e}");
        }
    };
    let pci = ConcurrentAttach::new_with(dev, HOST_MEMORY, pin_device)
        .map_err(|e| format!("the direct simgpu: {e}"))?;
    let mut direct = SimGpuDriver::open(pci).map_err(|e| format!("opening the direct simgpu: {e}"))?;
    let mut direct_replayer = Replayer::new(&mut direct, &plan).map_err(|e| format!("direct: {e}"))?;

    progress("both endpoints over UDP loopback: attaching");
    let poll = args.endpoints.poll_mode();
    let gpu = LocalBox::start(args.endpoints.driver.kind(), poll, args.impairment(31))?;
    let mut o = gpu.attach_options(args.endpoints.driver.kind(), poll, args.impairment(32));
    o.dma_memory = HOST_MEMORY;
    // The host endpoint runs on the job's thread here (no core of its own): it answers the
    // device's reads in short slices, and the replay lends it the time until its next step.
    o.answer_slice = Some(testbed::replay::HOST_ANSWER_SLICE);
    o.completion_timeout += 4 * args.impair.held();
    let remote =
        bridge_host::RemoteDevice::attach(o).map_err(|e| format!("attaching through the bridges: {e}"))?;
    let mut bridged = SimGpuDriver::open(remote).map_err(|e| format!("opening the remote simgpu: {e}"))?;
    let mut bridged_replayer = Replayer::new(&mut bridged, &plan).map_err(|e| format!("bridged: {e}"))?;

    // Each run starts once the other platform's threads have stopped spinning: the box's
    // endpoint busy-polls for `--spin-us` after its last datagram, the direct device's thread
    // for its own budget, and a third spinning thread on two cores made a 0.4 ms direct run
    // take 4-12 ms (the scheduler's slice).
    let settle = || {
        std::thread::sleep(Duration::from_micros(args.endpoints.spin_us).max(testbed::concurrent::SPIN) * 2)
    };
    let box_on = |which: fn(affinity::Placement) -> usize| placement.map_or(Ok(()), |p| gpu.pin(which(p)));
    // A warm-up each (VRAM and host memory touched once), then in turns.
    progress("warm-up");
    box_on(|p| p.host)?;
    direct_replayer.run(&mut direct, &plan).map_err(|e| format!("direct replay: {e}"))?;
    box_on(|p| p.device)?;
    bridged_replayer.run(&mut bridged, &plan).map_err(|e| format!("bridged replay: {e}"))?;
    let (mut d_runs, mut b_runs, mut overheads) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..args.repeat {
        progress(&format!("replay {} of {}", i + 1, args.repeat));
        box_on(|p| p.host)?;
        settle();
        let d = direct_replayer.run(&mut direct, &plan).map_err(|e| format!("direct replay: {e}"))?;
        box_on(|p| p.device)?;
        settle();
        let b = bridged_replayer.run(&mut bridged, &plan).map_err(|e| format!("bridged replay: {e}"))?;
        overheads.push((b.job_ns / d.job_ns - 1.0) * 100.0);
        d_runs.push(d);
        b_runs.push(b);
    }
    progress("measuring the link");
    box_on(|p| p.host)?;
    settle();
    let mut d_side = measure(&mut direct, "direct")?;
    box_on(|p| p.device)?;
    settle();
    let mut b_side = measure(&mut bridged, "bridged")?;
    bridged.into_pci().detach();
    drop(gpu);
    (d_side.runs, b_side.runs) = (d_runs, b_runs);

    // The model: the trace's job on each platform's copy engine; through the bridges, their
    // round trip and the host's cost of a submission's two posted writes beyond the direct
    // platform's.
    let ((d_h2d, d_d2h), (b_h2d, b_d2h)) = (d_side.model_rates(), b_side.model_rates());
    let direct_link = plan::Link { h2d_bytes_per_s: d_h2d, d2h_bytes_per_s: d_d2h, ..plan::Link::LOCAL };
    let rtt_ns = b_side.rtt.saturating_sub(d_side.rtt).as_nanos() as f64;
    let submit_ns = 2.0 * (b_side.write_ns - d_side.write_ns).max(0.0);
    // A fence's round trip through the bridges beyond the direct one is a submission, a
    // command fetch (1.5 round trips and its turns) and the fence's way back (half of one):
    // what is left over is the fetch's turns.
    let fence_added = b_side.fence_rtt.saturating_sub(d_side.fence_rtt).as_nanos() as f64;
    let bridged_link = plan::Link {
        rtt_ns,
        h2d_bytes_per_s: b_h2d,
        d2h_bytes_per_s: b_d2h,
        submit_ns,
        fetch_extra_ns: (fence_added - 2.0 * rtt_ns - submit_ns).max(0.0),
    };
    let predicted_direct = plan.evaluate(&direct_link);
    let predicted_bridged = plan.evaluate(&bridged_link);
    let crosses = plan::crossing_rtt_ns(&plan, &bridged_link, 10.0).map(|ns| ns / 1e3);
    Ok(Report {
        trace,
        plan,
        direct: d_side,
        bridged: b_side,
        link: bridged_link,
        predicted_direct,
        predicted_bridged,
        crosses,
        overheads,
    })
}

fn side_json(s: &Side) -> Value {
    let ms = |f: &dyn Fn(&ReplayRun) -> f64| {
        let sp = spread(&s.runs, |r| f(r) / 1e6);
        json!({"median": sp.median, "min": sp.min, "max": sp.max})
    };
    json!({
        "job_ms": ms(&|r| r.job_ns),
        "gpu_span_ms": ms(&|r| r.gpu_span_ns),
        "fetch_wait_ms": ms(&|r| r.fetch_wait_ns),
        "copy_extra_ms": ms(&|r| r.copy_extra_ns),
        "sync_notify_ms": ms(&|r| r.sync_notify_ns),
        "host_late_ms": ms(&|r| r.host_late_ns),
        "rtt_us": s.rtt.as_secs_f64() * 1e6,
        "posted_write_us": s.write_ns / 1e3,
        "fence_rtt_us": s.fence_rtt.as_secs_f64() * 1e6,
        "h2d_bytes_per_s": s.h2d,
        "d2h_bytes_per_s": s.d2h,
        "h2d_bytes_per_s_in_replay": s.in_replay().0,
        "d2h_bytes_per_s_in_replay": s.in_replay().1,
    })
}

impl Report {
    fn json(&self, args: &ReplayArgs) -> Value {
        let d = spread(&self.direct.runs, |r| r.job_ns / 1e6);
        let b = spread(&self.bridged.runs, |r| r.job_ns / 1e6);
        let o = Spread::of(self.overheads.iter().copied());
        let predicted_overhead = (self.predicted_bridged.job_ns / self.predicted_direct.job_ns - 1.0) * 100.0;
        let mut m = trace_json(&args.trace.display().to_string(), &self.trace);
        m.insert("repeat".into(), json!(args.repeat));
        m.insert("direct_ms".into(), json!(d.median));
        m.insert("bridged_ms".into(), json!(b.median));
        m.insert("overhead_percent".into(), json!(o.median));
        m.insert("overhead_percent_min".into(), json!(o.min));
        m.insert("overhead_percent_max".into(), json!(o.max));
        m.insert("rtt_us".into(), json!(self.bridged.rtt.as_secs_f64() * 1e6));
        m.insert("delay_us".into(), json!(args.impair.delay_us));
        m.insert("loss_ratio".into(), json!(args.impair.loss));
        m.insert("rate_gbit_per_s".into(), json!(args.rate_gbit));
        m.insert("direct".into(), side_json(&self.direct));
        m.insert("bridged".into(), side_json(&self.bridged));
        m.insert(
            "model".into(),
            json!({
                "predicted_direct_ms": self.predicted_direct.job_ns / 1e6,
                "predicted_bridged_ms": self.predicted_bridged.job_ns / 1e6,
                "predicted_overhead_percent": predicted_overhead,
                "added": added_json(&self.predicted_bridged.added),
                "link": {"added_rtt_us": self.link.rtt_ns / 1e3, "submit_us": self.link.submit_ns / 1e3,
                         "fetch_extra_us": self.link.fetch_extra_ns / 1e3,
                         "h2d_bytes_per_s": self.link.h2d_bytes_per_s, "d2h_bytes_per_s": self.link.d2h_bytes_per_s},
                "crosses_10_percent_at_rtt_us": self.crosses,
            }),
        );
        Value::Object(m)
    }

    fn print(&self, args: &ReplayArgs) {
        let t = &self.trace;
        let ms = |s: Spread| format!("{:.2} ms ({:.2}–{:.2})", s.median, s.min, s.max);
        outln!("dxpu replay — {}", trace_summary(&args.trace.display().to_string(), t, &self.plan));
        outln!(
            "  the trace: GPU span {:.2} ms; link +{} µs each way{}{}",
            t.gpu_span_ns() as f64 / 1e6,
            args.impair.delay_us,
            if args.impair.loss > 0.0 {
                format!(", {:.1} % loss", args.impair.loss * 100.0)
            } else {
                String::new()
            },
            if args.rate_gbit > 0.0 { format!(", {} Gbit/s", args.rate_gbit) } else { String::new() }
        );
        for (name, s) in [("direct", &self.direct), ("bridged", &self.bridged)] {
            outln!(
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
                        format!(", {} / {} in the replay", r(h2d), r(d2h))
                    }
                }
            );
            outln!(
                "           waits: command fetch {}, copies beyond their traced time {}, synchronizations seen {}, submissions late {}",
                ms(spread(&s.runs, |r| r.fetch_wait_ns / 1e6)),
                ms(spread(&s.runs, |r| r.copy_extra_ns / 1e6)),
                ms(spread(&s.runs, |r| r.sync_notify_ns / 1e6)),
                ms(spread(&s.runs, |r| r.host_late_ns / 1e6))
            );
        }
        let o = Spread::of(self.overheads.iter().copied());
        outln!("  overhead {:.2} % ({:.2}–{:.2}, {} pairs)", o.median, o.min, o.max, self.overheads.len());
        let p = &self.predicted_bridged;
        outln!(
            "  the model: {:.2} ms direct, {:.2} ms bridged, {:.2} % (command fetch {:.3} ms, copies {:.3} ms, synchronizations {:.3} ms, submissions {:.3} ms on the critical path)",
            self.predicted_direct.job_ns / 1e6,
            p.job_ns / 1e6,
            (p.job_ns / self.predicted_direct.job_ns - 1.0) * 100.0,
            p.added.command_fetch_ns / 1e6,
            p.added.copies_ns / 1e6,
            p.added.synchronizations_ns / 1e6,
            p.added.submissions_ns / 1e6
        );
        match self.crosses {
            Some(0.0) => outln!("  over 10 % at any round trip: the link's rate alone puts it there"),
            Some(x) => outln!("  the model crosses 10 % at a round trip of {x:.1} µs"),
            None => outln!("  the model never crosses 10 % (up to a round trip of 1 s)"),
        }
    }
}

/// Runs `dxpu replay`.
pub(crate) fn run_replay(args: ReplayArgs) -> ExitCode {
    let mut progress = |s: &str| eprintln!("dxpu replay: {s}");
    match run(&args, &mut progress) {
        Ok(r) if args.json => {
            outln!("{}", r.json(&args));
            ExitCode::SUCCESS
        }
        Ok(r) => {
            r.print(&args);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dxpu replay: {e}");
            ExitCode::FAILURE
        }
    }
}
