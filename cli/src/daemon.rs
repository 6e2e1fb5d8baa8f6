//! `dxpu gpu` and `dxpu host`: the two endpoints as daemons, configured by a TOML file with
//! command-line overrides, logging through `log`, stopping cleanly on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bridge_gpu::GpuEndpoint;
use bridge_host::RemoteDevice;
use bridge_host::vfio_user::VfioUserServer;
use clap::Args;
use driver::{PciFunction, SimGpuDriver};

use crate::config::{self, DriverArg, GpuFile, HostFile, PollArg};

/// Options of `dxpu gpu`.
#[derive(Args, Debug)]
pub(crate) struct GpuArgs {
    /// The configuration file (TOML; see docs/operations.md).
    #[arg(long, short)]
    config: PathBuf,
    /// UDP address to listen on (overrides `listen`).
    #[arg(long)]
    listen: Option<String>,
    /// UDP driver (overrides `link.driver`).
    #[arg(long, value_enum)]
    driver: Option<DriverArg>,
    /// How the endpoint waits for work (overrides `link.poll`).
    #[arg(long, value_enum)]
    poll: Option<PollArg>,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// Options of `dxpu host`.
#[derive(Args, Debug)]
pub(crate) struct HostArgs {
    /// The configuration file (TOML; see docs/operations.md).
    #[arg(long, short)]
    config: PathBuf,
    /// The GPU-box endpoint's address for every attach (overrides `attach[].server`).
    #[arg(long)]
    server: Option<String>,
    /// UDP driver (overrides `link.driver`).
    #[arg(long, value_enum)]
    driver: Option<DriverArg>,
    /// How the endpoint waits for work (overrides `link.poll`).
    #[arg(long, value_enum)]
    poll: Option<PollArg>,
    /// Run the demo workload on every attached device, report, detach and exit.
    #[arg(long)]
    workload: bool,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
}

/// Starts logging at `level` unless `RUST_LOG` says otherwise.
pub(crate) fn init_logging(level: &str) -> Result<(), String> {
    if !["error", "warn", "info", "debug", "trace", "off"].contains(&level) {
        return Err(format!("--log-level {level}: must be error, warn, info, debug, trace or off"));
    }
    let env = env_logger::Env::default().default_filter_or(level);
    let _ = env_logger::Builder::from_env(env).format_target(false).try_init();
    Ok(())
}

/// A flag that SIGINT and SIGTERM set; a second one while it is set ends the process at once
/// (exit status 1), for a stop that takes too long.
pub(crate) fn stop_flag() -> Result<Arc<AtomicBool>, String> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The conditional shutdown is registered first, so that it sees the flag as the first
        // signal left it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .and_then(|_| signal_hook::flag::register(sig, stop.clone()))
            .map_err(|e| format!("signal handler: {e}"))?;
    }
    Ok(stop)
}

fn fail(cmd: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("dxpu {cmd}: {e}");
    ExitCode::FAILURE
}

pub(crate) fn run_gpu(args: GpuArgs) -> ExitCode {
    if let Err(e) = init_logging(&args.log_level) {
        return fail("gpu", e);
    }
    let mut file: GpuFile = match config::read(&args.config) {
        Ok(f) => f,
        Err(e) => return fail("gpu", e),
    };
    if let Some(d) = args.driver {
        file.link.driver = Some(d.name().into());
    }
    if let Some(p) = args.poll {
        file.link.poll = Some(p.name().into());
    }
    let opts = match file.options(args.listen.as_deref()) {
        Ok(o) => o,
        Err(e) => return fail("gpu", format!("{}: {e}", args.config.display())),
    };
    let stop = match stop_flag() {
        Ok(s) => s,
        Err(e) => return fail("gpu", e),
    };
    let opts_exports = opts.exports.clone();
    let mut ep = match GpuEndpoint::new(opts) {
        Ok(ep) => ep,
        Err(e) => return fail("gpu", e),
    };
    match ep.local_addr() {
        Ok(a) => log::info!("listening on {a}"),
        Err(e) => return fail("gpu", e),
    }
    let agent = match &file.pool {
        Some(p) => match p.pool(&opts_exports).and_then(|gp| crate::pool_run::start_box(&mut ep, &gp)) {
            Ok(a) => Some(a),
            Err(e) => return fail("gpu", format!("{}: {e}", args.config.display())),
        },
        None => None,
    };
    let served = ep.run(&stop);
    // The devices leave the pool at once (their lease revoked) rather than at its expiry.
    if let Some(a) = agent {
        a.stop();
    }
    if let Err(e) = served {
        return fail("gpu", e);
    }
    for (name, s) in ep.stats().exports {
        log::info!(
            "{name}: {} attaches, {} refused, {} host requests, {} device requests, {} DMA dropped at resets",
            s.attaches,
            s.refusals,
            s.host_requests,
            s.device_requests,
            s.dma_dropped
        );
    }
    log::info!("stopped");
    ExitCode::SUCCESS
}

pub(crate) fn run_host(args: HostArgs) -> ExitCode {
    if let Err(e) = init_logging(&args.log_level) {
        return fail("host", e);
    }
    let mut file: HostFile = match config::read(&args.config) {
        Ok(f) => f,
        Err(e) => return fail("host", e),
    };
    if let Some(d) = args.driver {
        file.link.driver = Some(d.name().into());
    }
    if let Some(p) = args.poll {
        file.link.poll = Some(p.name().into());
    }
    let all = match file.attachments(args.server.as_deref()) {
        Ok(o) => o,
        Err(e) => return fail("host", format!("{}: {e}", args.config.display())),
    };
    let pool = match file.pool() {
        Ok(p) => p,
        Err(e) => return fail("host", format!("{}: {e}", args.config.display())),
    };
    let stop = match stop_flag() {
        Ok(s) => s,
        Err(e) => return fail("host", e),
    };
    if let Some(hp) = pool {
        if !all.is_empty() {
            return fail("host", format!("{}: give [[attach]] or [pool], not both", args.config.display()));
        }
        let ok = crate::pool_run::run_host(hp, stop, args.workload);
        log::info!("stopped");
        return if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let mut devices = Vec::new();
    let mut servers = Vec::new();
    for (mut o, socket) in all {
        // A signal ends an attach in progress and every wait on an attached device at once.
        o.cancel = Some(stop.clone());
        let (name, id) = (o.device.clone(), o.device_id);
        let wait = o.poll;
        match RemoteDevice::attach(o) {
            Ok(mut d) => {
                let ids = d.config_read(0);
                log::info!("{name} at {id}: vendor {:#06x} device {:#06x}", ids & 0xffff, ids >> 16);
                match socket {
                    // Served to a VMM by its own thread until the stop flag is set.
                    Some(path) => {
                        let mut server = match VfioUserServer::bind(&path, d, wait) {
                            Ok(s) => s,
                            Err(e) => return fail("host", format!("{name}: vfio-user: {e}")),
                        };
                        let stop = stop.clone();
                        let t = std::thread::Builder::new().name(format!("dxpu-vfio-user-{name}")).spawn(
                            move || {
                                if let Err(e) = server.serve(&stop) {
                                    log::error!("vfio-user {}: {e}", server.path().display());
                                }
                                server.into_device()
                            },
                        );
                        match t {
                            Ok(t) => servers.push((name, t)),
                            Err(e) => {
                                return fail("host", format!("{name}: starting the vfio-user thread: {e}"));
                            }
                        }
                    }
                    None => devices.push((name, d)),
                }
            }
            Err(bridge_host::AttachError::Cancelled) => {
                return fail("host", format!("{name}: stopped by a signal while attaching"));
            }
            Err(e) => return fail("host", e),
        }
    }
    if args.workload && !servers.is_empty() {
        log::warn!("--workload runs on the devices not served over vfio-user only");
    }
    let mut ok = true;
    if args.workload {
        for (name, d) in devices.drain(..) {
            let mut drv = match SimGpuDriver::open(d) {
                Ok(drv) => drv,
                Err(e) => {
                    log::error!("{name}: {e}");
                    ok = false;
                    continue;
                }
            };
            let size = testbed::workload::WorkloadSize::scaled(1);
            match testbed::workload::run(&mut drv, size, &mut |step| log::info!("{name}: {step}")) {
                Ok(r) => log::info!("{name}: workload verified in {:.3} s", r.seconds),
                Err(e) if stop.load(Ordering::Relaxed) => {
                    log::error!("{name}: workload stopped by a signal ({e})");
                    ok = false;
                }
                Err(e) => {
                    log::error!("{name}: {e}");
                    ok = false;
                }
            }
            drv.into_pci().detach();
        }
    } else {
        log::info!(
            "{} device(s) attached, {} served over vfio-user; SIGINT or SIGTERM detaches and exits",
            devices.len() + servers.len(),
            servers.len()
        );
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
            for (name, d) in &devices {
                if let Some(why) = d.removed() {
                    log::error!("{name}: removed ({why}); exiting");
                    ok = false;
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
        for (_, d) in devices {
            d.detach();
        }
    }
    stop.store(true, Ordering::Relaxed);
    for (name, t) in servers {
        match t.join() {
            Ok(d) => d.detach(),
            Err(_) => log::error!("{name}: the vfio-user thread panicked"),
        }
    }
    log::info!("stopped");
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
