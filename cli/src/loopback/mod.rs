//! `dxpu loopback`: both endpoints and a simulated GPU on one machine, over real UDP
//! loopback. The simgpu driver runs a workload (the demo, or one shaped like AI work)
//! through the bridges (every result checked against the CPU) and the same workload on a
//! directly attached simgpu, in turns, `--repeat` times each, and the report compares their
//! medians (with the spread): on a shared two-core machine one run of each told the
//! overhead anywhere from 9 to 155 %. The direct runs count the workload's transaction
//! profile, and the performance model (`lab::model`) predicts the bridged time from it
//! and the link's round trip and bulk rates, measured before the runs.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bridge_host::{HostStats, RemoteDevice};
use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::model::{self, LinkParams};
use link::driver::DriverKind;
use serde_json::json;
use testbed::concurrent::ConcurrentAttach;
use testbed::direct::DirectAttach;
use testbed::workload::{Workload, WorkloadReport};

use crate::args::WorkloadArg;
use lab::affinity::{self, Placement};
use lab::harness::{Frames, LocalBox, Spread, mmio_rtt};

/// Bridged runs made through one attachment before the next (see `run`).
const RUNS_PER_SESSION: u32 = 3;

/// Bytes of the copies that measure bulk rates before the runs.
const RATE_BYTES: usize = 16 << 20;

pub(crate) fn run(args: &LoopbackArgs, progress: &mut dyn FnMut(&str)) -> Result<Outcome, String> {
    if !(1..=32).contains(&args.scale) {
        return Err(format!("--scale {}: must be 1..=32", args.scale));
    }
    // The caller's thread gets its CPUs back however this returns.
    let _restore = affinity::Restore::here()?;
    let placement = args.endpoints.placement("the host's driver", progress)?;
    // Bridged turns: the box's thread (the device) on the device's CPU, the workload's on
    // the host's. Direct turns: the device computes on the device's CPU — the synchronous
    // baseline in the workload's thread, the concurrent one in its own beside the driver on
    // the host's — and the idle box's thread waits on the host's CPU: it spins for its
    // budget after every keepalive, which would be taken from the direct device's CPU.
    let bridged_turn = |gpu: &LocalBox| match placement {
        Some(p) => gpu.pin(p.device).map_err(String::from).and_then(|()| Ok(affinity::pin(&[p.host])?)),
        None => Ok(()),
    };
    let direct_turn = |gpu: &LocalBox| match placement {
        Some(p) => gpu.pin(p.host).map_err(String::from).and_then(|()| {
            Ok(affinity::pin(&[match args.baseline {
                BaselineArg::Synchronous => p.device,
                BaselineArg::Concurrent => p.host,
            }])?)
        }),
        None => Ok(()),
    };
    // Attaching from the host's CPU: the host endpoint's service thread starts there too.
    let on_host = || affinity::pin_to(placement.map(|p| p.host));
    // A box and an attachment of their own for every RUNS_PER_SESSION bridged runs, each
    // attachment warmed by one run not counted: sessions differ from one to the next (on
    // this machine some run whole copies at half the rate of others), and a figure over one
    // session says more about that session than about the bridges.
    let attach = |progress: &mut dyn FnMut(&str)| attach_box(args, placement, progress);
    on_host()?;
    let (gpu, mut d) = attach(progress)?;
    let driver_name = d.pci().driver_name().to_string();
    let (offload, sizes) = (d.pci().offload(), d.pci().payload_sizes());
    progress("timing MMIO reads and bulk copies");
    let rtt = mmio_rtt(&mut d, args.rtt_samples);
    // Bulk rates differ from one session to the next (docs/performance.md, "slow
    // sessions"): measured on every attachment the runs use, the model takes their medians.
    let rates_of = |d: &mut SimGpuDriver<RemoteDevice>| {
        model::copy_rates(d, RATE_BYTES, 1).map_err(|e| format!("bridged copies: {e}"))
    };
    let mut session_rates = vec![rates_of(&mut d)?];
    direct_turn(&gpu)?;
    let mut direct = Baseline::open(args.baseline, placement.map(|p| p.device))?;
    let direct_rtt = direct.mmio_rtt(args.rtt_samples);
    let direct_rates = direct.copy_rates()?;
    let w = args.workload.ok_or("no workload chosen")?;
    let size = w.workload(args.scale, args.batch, args.layers)?;
    let mut profile = crate::model::count_profile(size)?;
    (profile.direct_h2d_bytes_per_s, profile.direct_d2h_bytes_per_s) = direct_rates;
    // The first attachment is warmed by the round-trip samples' session and one run.
    bridged_turn(&gpu)?;
    warm_up(&mut d, size, "bridged", progress)?;
    direct_turn(&gpu)?;
    direct.run(size, &mut |s| progress(&format!("direct (warm-up): {s}")))?;
    // In turns, so that what the machine does meanwhile falls on both alike.
    let (mut bridged, mut direct_runs) = (Vec::new(), Vec::new());
    let mut current = Some((gpu, d));
    let mut host = HostStats::default();
    // TLPs each way over every attachment's whole session (what a capture of it holds).
    let mut captured = (0u64, 0u64);
    for i in 1..=args.repeat {
        let of = if args.repeat > 1 { format!(" ({i} of {})", args.repeat) } else { String::new() };
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
        let before = d.pci().stats();
        bridged.push(
            size.run(&mut d, &mut |s| progress(&format!("bridged{of}: {s}")))
                .map_err(|e| format!("bridged workload{of}: {e}"))?,
        );
        // What one run sent and received: the last one's.
        host = one_run(&before, &d.pci().stats());
        direct_turn(&gpu)?;
        direct_runs.push(
            direct
                .run(size, &mut |s| progress(&format!("direct{of}: {s}")))
                .map_err(|e| format!("direct workload{of}: {e}"))?,
        );
        if i % RUNS_PER_SESSION == 0 || i == args.repeat {
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
        workload: w,
        placement,
        captured,
    })
}

/// A box of its own on loopback and gpu0 attached through the host endpoint, for `run`'s
/// bridged turns.
fn attach_box(
    args: &LoopbackArgs,
    placement: Option<Placement>,
    progress: &mut dyn FnMut(&str),
) -> Result<(LocalBox, SimGpuDriver<RemoteDevice>), String> {
    let (driver, poll) = (args.endpoints.driver.kind(), args.endpoints.poll_mode());
    let imp = |seed| args.impair.impairment(seed);
    let gpu = LocalBox::start_offload(
        driver,
        poll,
        imp(11),
        Frames::from_encrypt(args.encrypt),
        link::driver::Offload::AUTO,
        placement.map(|p| p.device),
    )?;
    progress("attaching gpu0 through the host endpoint");
    let mut o = gpu.attach_options(driver, poll, imp(12));
    o.tap = args.tap.clone();
    // Distance adds to every round trip: keep the timeout above it.
    o.completion_timeout += 4 * args.impair.held();
    let remote = RemoteDevice::attach(o).map_err(|e| e.to_string())?;
    let d = SimGpuDriver::open(remote).map_err(|e| format!("opening the remote simgpu: {e}"))?;
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
    fn open(kind: BaselineArg, cpu: Option<usize>) -> Result<Baseline, String> {
        let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
        let opened = |e: driver::DriverError| format!("opening the direct simgpu: {e}");
        Ok(match kind {
            BaselineArg::Synchronous => Baseline::Synchronous(Box::new(
                SimGpuDriver::open(DirectAttach::new(dev, 256 << 20)).map_err(opened)?,
            )),
            BaselineArg::Concurrent => {
                let pin = move || {
                    if let Err(e) = affinity::pin_to(cpu) {
                        log::warn!("the direct device's thread: {e}");
                    }
                };
                let pci = ConcurrentAttach::new_with(dev, 256 << 20, pin)
                    .map_err(|e| format!("starting the direct simgpu's thread: {e}"))?;
                Baseline::Concurrent(Box::new(SimGpuDriver::open(pci).map_err(opened)?))
            }
        })
    }

    fn run(&mut self, w: Workload, progress: &mut dyn FnMut(&str)) -> Result<WorkloadReport, String> {
        match self {
            Baseline::Synchronous(d) => w.run(d, progress),
            Baseline::Concurrent(d) => w.run(d, progress),
        }
        .map_err(|e| format!("direct workload: {e}"))
    }

    fn mmio_rtt(&mut self, n: usize) -> (Duration, Duration) {
        match self {
            Baseline::Synchronous(d) => mmio_rtt(d, n),
            Baseline::Concurrent(d) => mmio_rtt(d, n),
        }
    }

    fn copy_rates(&mut self) -> Result<(f64, f64), String> {
        match self {
            Baseline::Synchronous(d) => model::copy_rates(d, RATE_BYTES, 3),
            Baseline::Concurrent(d) => model::copy_rates(d, RATE_BYTES, 3),
        }
        .map_err(|e| format!("direct copies: {e}"))
    }
}

/// One run of the workload through `d`, verified and not counted.
fn warm_up<P: driver::PciFunction>(
    d: &mut SimGpuDriver<P>,
    size: Workload,
    what: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<(), String> {
    size.run(d, &mut |s| progress(&format!("{what} (warm-up): {s}")))
        .map(|_| ())
        .map_err(|e| format!("{what} workload (warm-up): {e}"))
}

/// The counters the report shows, as far as they moved from `before` to `after`.
fn one_run(before: &HostStats, after: &HostStats) -> HostStats {
    let diff = |a: &BTreeMap<&'static str, u64>, b: &BTreeMap<&'static str, u64>| {
        b.iter().map(|(k, v)| (*k, v - a.get(k).copied().unwrap_or(0))).filter(|(_, v)| *v > 0).collect()
    };
    let mut h = after.clone();
    h.tlps_sent = diff(&before.tlps_sent, &after.tlps_sent);
    h.tlps_received = diff(&before.tlps_received, &after.tlps_received);
    h.interrupts = after.interrupts - before.interrupts;
    h.link.retransmits = after.link.retransmits - before.link.retransmits;
    h
}

/// `--vfio-user DIR`: the box and the host endpoint as for the workload, the remote simgpu
/// served on DIR/gpu0.sock until SIGINT or SIGTERM.
fn serve_vfio_user(args: &LoopbackArgs, dir: &std::path::Path) -> Result<(), String> {
    let driver = args.endpoints.driver.kind();
    // The server waits on the client socket and the link together: the portable driver
    // gives it a descriptor to wait on (docs/vfio-user.md).
    let driver = if driver == DriverKind::Auto { DriverKind::Portable } else { driver };
    let poll = args.endpoints.poll_mode();
    let imp = |seed| args.impair.impairment(seed);
    let stop = ops::process::stop_flag()?;
    // A hangup (the terminal closed) stops it as SIGTERM does: its socket removed, the
    // device given back (it has no file to reload).
    signal_hook::flag::register(signal_hook::consts::SIGHUP, stop.clone())
        .map_err(|e| format!("signal handler: {e}"))?;
    std::fs::create_dir_all(dir).map_err(|e| format!("--vfio-user {}: {e}", dir.display()))?;
    let gpu = LocalBox::start_with(driver, poll, imp(11), Frames::from_encrypt(args.encrypt))?;
    let mut o = gpu.attach_options(driver, poll, imp(12));
    o.completion_timeout += 4 * args.impair.held();
    // The VMM grants guest memory; the server thread drives the link.
    o.dma_memory = 0;
    o.service_interval = None;
    let remote = RemoteDevice::attach(o).map_err(|e| e.to_string())?;
    let path = dir.join("gpu0.sock");
    let mut server = bridge_host::vfio_user::VfioUserServer::bind(&path, remote, poll)
        .map_err(|e| format!("--vfio-user: {e}"))?;
    eprintln!(
        "dxpu loopback: serving the remote simgpu on {} (QEMU: -device '{{\"driver\":\"vfio-user-pci\",\"socket\":{{\"path\":\"{}\",\"type\":\"unix\"}}}}'); SIGINT, SIGTERM or SIGHUP stops",
        path.display(),
        path.display()
    );
    server.serve(&stop).map_err(|e| format!("vfio-user: {e}"))?;
    let c = server.counters();
    eprintln!(
        "dxpu loopback: stopped after {} client(s), {} commands ({} errors), {} interrupts delivered",
        c.clients.load(Ordering::Relaxed),
        c.commands.load(Ordering::Relaxed),
        c.errors.load(Ordering::Relaxed),
        c.interrupts.load(Ordering::Relaxed)
    );
    let stats = server.device().stats();
    eprintln!("dxpu loopback: TLPs host→box {:?}, box→host {:?}", stats.tlps_sent, stats.tlps_received);
    server.into_device().detach();
    drop(gpu);
    Ok(())
}

pub(crate) fn run_loopback(args: LoopbackArgs) -> ExitCode {
    if let Err(e) = ops::process::init_logging(&args.log_level) {
        eprintln!("dxpu loopback: {e}");
        return ExitCode::FAILURE;
    }
    if let Some(dir) = args.vfio_user.clone() {
        return match serve_vfio_user(&args, &dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu loopback: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let start = Instant::now();
    let workloads = args.workload.map_or(WorkloadArg::ALL.to_vec(), |w| vec![w]);
    let mut steps = Steps::new(&args, start);
    let capture = match &args.capture {
        Some(f) => match ops::capture::Capture::create(f, args.capture_limit) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("dxpu loopback: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let mut args = args;
    args.tap = capture.as_ref().and_then(|c| c.tap());
    let mut outcomes = Vec::new();
    for w in workloads {
        let mut one = args.clone();
        one.workload = Some(w);
        steps.begin(w, args.repeat);
        let r = run(&one, &mut |m| steps.step(m));
        steps.end(w, r.as_ref().ok());
        match r {
            Ok(o) => outcomes.push(o),
            Err(e) => {
                if args.json {
                    outln!("{}", json!({ "verified": false, "workload": w.name(), "error": e }));
                } else {
                    eprintln!("dxpu loopback: {}: {e}", w.name());
                }
                return ExitCode::FAILURE;
            }
        }
    }
    // Every session is gone: the capture's writer has the last packet.
    args.tap = None;
    let captured = match capture.map(|c| c.finish()).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dxpu loopback: {e}");
            return ExitCode::FAILURE;
        }
    };
    let with_capture = |mut v: serde_json::Value| {
        if let Some(c) = captured {
            v["capture"]["packets"] = json!(c.packets);
            v["capture"]["bytes"] = json!(c.bytes);
            v["capture"]["dropped"] = json!(c.dropped);
        }
        v
    };
    if args.json {
        match outcomes.as_slice() {
            [o] => outln!("{}", with_capture(report_json(&args, o))),
            all => {
                let each: Vec<_> = all.iter().map(|o| with_capture(report_json(&args, o))).collect();
                outln!("{}", json!({ "verified": true, "workloads": each }));
            }
        }
        return ExitCode::SUCCESS;
    }
    if let (Some(c), Some(f)) = (captured, &args.capture) {
        eprintln!(
            "dxpu loopback: captured {} packets ({} bytes of frames, {} dropped) to {}",
            c.packets,
            c.bytes,
            c.dropped,
            f.display()
        );
    }
    for (i, o) in outcomes.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        print_report(&args, o);
    }
    if outcomes.len() > 1 {
        print_summary(&outcomes);
    }
    ExitCode::SUCCESS
}

/// What `dxpu loopback` says while it runs, on standard error: every step with `--verbose`;
/// else on a terminal a bar that shows the workload, the run and the step, cleared before
/// the report; else (a log, a pipe) a line as each workload starts and ends; nothing with
/// `--json`.
enum Steps {
    Quiet,
    Every(Instant),
    Bar(indicatif::ProgressBar),
    Lines(Instant),
}

impl Steps {
    fn new(args: &LoopbackArgs, start: Instant) -> Steps {
        use std::io::IsTerminal;
        if args.verbose {
            Steps::Every(start)
        } else if args.json {
            Steps::Quiet
        } else if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {prefix}: {wide_msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            Steps::Bar(bar)
        } else {
            Steps::Lines(start)
        }
    }

    fn begin(&mut self, w: WorkloadArg, repeat: u32) {
        match self {
            Steps::Bar(b) => b.set_prefix(w.name()),
            Steps::Lines(t) => {
                eprintln!(
                    "[{:6.1} s] {}: {repeat} runs each way, bridged and direct in turns",
                    t.elapsed().as_secs_f64(),
                    w.name()
                )
            }
            Steps::Quiet | Steps::Every(_) => {}
        }
    }

    fn step(&mut self, m: &str) {
        match self {
            Steps::Every(t) => eprintln!("[{:6.2} s] {m}", t.elapsed().as_secs_f64()),
            Steps::Bar(b) => b.set_message(m.to_string()),
            Steps::Quiet | Steps::Lines(_) => {}
        }
    }

    fn end(&mut self, w: WorkloadArg, o: Option<&Outcome>) {
        match (self, o) {
            (Steps::Lines(t), Some(o)) => eprintln!(
                "[{:6.1} s] {}: verified, overhead {:.1} %",
                t.elapsed().as_secs_f64(),
                w.name(),
                o.overhead().median
            ),
            (Steps::Bar(b), _) => b.set_message(String::new()),
            _ => {}
        }
    }
}

impl Drop for Steps {
    fn drop(&mut self) {
        if let Steps::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

mod args;
mod outcome;
mod report;

pub(crate) use args::{BaselineArg, DEFAULT_REPEAT, LoopbackArgs};
use outcome::Outcome;

pub(crate) use report::report_json;
use report::{print_report, print_summary};
