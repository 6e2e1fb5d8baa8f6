//! `dxpu loopback`: its arguments, its progress and its report. What it runs — a workload
//! through both endpoints over real UDP loopback and on a directly attached simgpu, in turns,
//! `--repeat` times each, the link measured and the profile counted — is
//! `lab::loopback::run`; the report compares the medians (with the spread), the model's
//! prediction beside them.

use std::process::ExitCode;
use std::sync::atomic::Ordering;

use bridge_host::RemoteDevice;
use lab::harness::Frames;
use lab::harness::LocalBox;
use lab::loopback::{BaselineKind, Outcome};
use link::driver::DriverKind;
use serde_json::json;

use crate::args::WorkloadArg;
use crate::out::Steps;

/// The runs `args` asks for, as `lab::loopback::run` takes them.
pub(crate) fn options(
    args: &LoopbackArgs,
    progress: &mut dyn FnMut(&str),
) -> Result<lab::loopback::Options, String> {
    if !(1..=32).contains(&args.scale) {
        return Err(format!("--scale {}: must be 1..=32", args.scale));
    }
    let w = args.workload.ok_or("no workload chosen")?;
    Ok(lab::loopback::Options {
        workload: w.workload(args.scale, args.batch, args.layers)?,
        baseline: match args.baseline {
            BaselineArg::Synchronous => BaselineKind::Synchronous,
            BaselineArg::Concurrent => BaselineKind::Concurrent,
        },
        repeat: args.repeat,
        rtt_samples: args.rtt_samples,
        driver: args.endpoints.driver.kind(),
        poll: args.endpoints.poll_mode(),
        impairment: args.impair.impairment(0),
        frames: Frames::from_encrypt(args.encrypt),
        tap: args.tap.clone(),
        placement: args.endpoints.placement("the host's driver", progress)?,
    })
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
    let workloads = args.workload.map_or(WorkloadArg::ALL.to_vec(), |w| vec![w]);
    // With --json too: the object goes to standard output, the progress to standard error;
    // every step with --verbose.
    let steps = Steps::counted("loopback", workloads.len() as u32).with_every_detail(args.verbose);
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
        steps.step(&format!("{}: {} runs each way, bridged and direct in turns", w.name(), args.repeat));
        let mut progress = |m: &str| steps.detail(&format!("{}: {m}", w.name()));
        // The options are kept for the report, their tap dropped: the capture's writer ends
        // when the last tap does.
        let r = options(&one, &mut progress).and_then(|o| {
            Ok((lab::loopback::run(&o, &mut progress)?, lab::loopback::Options { tap: None, ..o }))
        });
        if let Ok((o, _)) = &r {
            steps.say(&format!("{}: verified, overhead {:.1} %", w.name(), o.overhead().median));
        }
        match r {
            Ok(done) => outcomes.push(done),
            Err(e) => {
                if args.json {
                    outln!(
                        "{}",
                        crate::out::json(json!({ "verified": false, "workload": w.name(), "error": e }))
                    );
                } else {
                    eprintln!("dxpu loopback: {}: {e}", w.name());
                }
                return ExitCode::FAILURE;
            }
        }
    }
    // The bar off the screen before the report.
    drop(steps);
    // Every session is gone: the capture's writer has the last packet.
    args.tap = None;
    let captured = match capture.map(|c| c.finish()).transpose() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("dxpu loopback: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report_json = |(o, options): &(Outcome, lab::loopback::Options)| {
        let mut v = lab::loopback::report::json(options, o, args.capture.as_deref());
        if let Some(c) = captured {
            v["capture"]["packets"] = json!(c.packets);
            v["capture"]["bytes"] = json!(c.bytes);
            v["capture"]["dropped"] = json!(c.dropped);
        }
        v
    };
    if args.json {
        match outcomes.as_slice() {
            [one] => outln!("{}", crate::out::json(report_json(one))),
            all => {
                let each: Vec<_> = all.iter().map(report_json).collect();
                outln!("{}", crate::out::json(json!({ "verified": true, "workloads": each })));
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
    for (i, (o, options)) in outcomes.iter().enumerate() {
        if i > 0 {
            outln!();
        }
        out!("{}", lab::loopback::report::text(options, o));
    }
    if outcomes.len() > 1 {
        let all: Vec<Outcome> = outcomes.into_iter().map(|(o, _)| o).collect();
        out!("{}", lab::loopback::report::summary(&all));
    }
    ExitCode::SUCCESS
}

mod args;

pub(crate) use args::{BaselineArg, DEFAULT_REPEAT, LoopbackArgs};
