//! `dxpu gpu` and `dxpu host`: the two endpoints as daemons, configured by a TOML file with
//! command-line overrides, logging through `log`, stopping cleanly on SIGINT/SIGTERM.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bridge_gpu::{GpuEndpoint, GpuOptions};
use clap::Args;
use driver::SimGpuDriver;

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
    /// Write every datagram of the link, both ways, to this pcapng file (`dxpu tlp decode
    /// --pcap`, Wireshark with the dxpu dissector).
    #[arg(long, value_name = "FILE")]
    capture: Option<PathBuf>,
    /// The capture file's size bound in bytes; packets beyond it are counted, not written.
    #[arg(long, default_value_t = crate::capture::DEFAULT_LIMIT, requires = "capture")]
    capture_limit: u64,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log lines as text, or as one JSON object each (`ts`, `level`, `msg`, and the
    /// `session`, `host`, `device`, `peer` they concern as fields) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
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
    /// Write every datagram of the link, both ways, to this pcapng file (`dxpu tlp decode
    /// --pcap`, Wireshark with the dxpu dissector).
    #[arg(long, value_name = "FILE")]
    capture: Option<PathBuf>,
    /// The capture file's size bound in bytes; packets beyond it are counted, not written.
    #[arg(long, default_value_t = crate::capture::DEFAULT_LIMIT, requires = "capture")]
    capture_limit: u64,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log lines as text, or as one JSON object each (`ts`, `level`, `msg`, and the
    /// `session`, `host`, `device`, `peer` they concern as fields) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// `[time LEVEL] message`.
    Text,
    /// One JSON object a line.
    Json,
}

/// Starts logging at `level` unless `RUST_LOG` says otherwise.
pub(crate) fn init_logging(level: &str) -> Result<(), String> {
    init_logging_as(level, LogFormat::Text)
}

/// [`init_logging`] in `format`.
pub(crate) fn init_logging_as(level: &str, format: LogFormat) -> Result<(), String> {
    if !["error", "warn", "info", "debug", "trace", "off"].contains(&level) {
        return Err(format!("--log-level {level}: must be error, warn, info, debug, trace or off"));
    }
    let env = env_logger::Env::default().default_filter_or(level);
    let mut b = env_logger::Builder::from_env(env);
    b.format_target(false);
    if format == LogFormat::Json {
        b.format(|buf, r| {
            use std::io::Write;
            let mut m = serde_json::Map::new();
            m.insert("ts".into(), buf.timestamp_micros().to_string().into());
            m.insert("level".into(), r.level().as_str().into());
            m.insert("target".into(), r.target().into());
            m.insert("msg".into(), r.args().to_string().into());
            let _ = r.key_values().visit(&mut JsonFields(&mut m));
            writeln!(buf, "{}", serde_json::Value::Object(m))
        });
    }
    let _ = b.try_init();
    Ok(())
}

/// A log record's key-value fields (session, host, device, peer, token) into its JSON line.
struct JsonFields<'a>(&'a mut serde_json::Map<String, serde_json::Value>);

impl<'kvs> log::kv::VisitSource<'kvs> for JsonFields<'_> {
    fn visit_pair(
        &mut self,
        key: log::kv::Key<'kvs>,
        value: log::kv::Value<'kvs>,
    ) -> Result<(), log::kv::Error> {
        let v = match value.to_u64() {
            Some(n) => serde_json::Value::from(n),
            None => serde_json::Value::from(value.to_string()),
        };
        self.0.insert(key.as_str().to_string(), v);
        Ok(())
    }
}

/// A flag SIGHUP sets: the endpoint reads its configuration again.
pub(crate) fn hup_flag() -> Result<Arc<AtomicBool>, String> {
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .map_err(|e| format!("signal handler: {e}"))?;
    Ok(hup)
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
    if let Err(e) = init_logging_as(&args.log_level, args.log_format) {
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
    let mut opts = match file.options(args.listen.as_deref()) {
        Ok(o) => o,
        Err(e) => return fail("gpu", format!("{}: {e}", args.config.display())),
    };
    let capture =
        match args.capture.as_deref().map(|f| crate::capture::Capture::create(f, args.capture_limit)) {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return fail("gpu", e),
            None => None,
        };
    opts.tap = capture.as_ref().and_then(|c| c.tap());
    let stop = match stop_flag() {
        Ok(s) => s,
        Err(e) => return fail("gpu", e),
    };
    let opts_exports = opts.exports.clone();
    let mut rt = crate::gpu_run::GpuRuntime {
        path: args.config.clone(),
        file: file.clone(),
        listen: args.listen.clone(),
        driver: args.driver.map(|d| d.name().to_string()),
        poll: args.poll.map(|p| p.name().to_string()),
        // Without the tap: the capture ends with the endpoint.
        opts: GpuOptions { tap: None, ..opts.clone() },
        started: std::time::Instant::now(),
    };
    let hup = match hup_flag() {
        Ok(h) => h,
        Err(e) => return fail("gpu", e),
    };
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
    let served = crate::gpu_run::serve(&mut ep, &mut rt, &stop, &hup);
    // The devices leave the pool at once (their lease revoked) rather than at its expiry.
    if let Some(a) = agent {
        a.stop();
    }
    if let Err(e) = served {
        return fail("gpu", e);
    }
    let exports = ep.stats().exports;
    // The endpoint's tap goes with it: the capture's writer has the last packet.
    drop(ep);
    if let Some(c) = capture
        && let Err(e) = c.finish()
    {
        log::error!("{e}");
    }
    for (name, s) in exports {
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
    if let Err(e) = init_logging_as(&args.log_level, args.log_format) {
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
        if args.capture.is_some() {
            return fail("host", "--capture: for the devices of [[attach]]; a pool's are not captured");
        }
        if !all.is_empty() {
            return fail("host", format!("{}: give [[attach]] or [pool], not both", args.config.display()));
        }
        let ops = (file.control.clone(), file.metrics.clone());
        let ok = crate::pool_run::run_host(hp, stop, args.workload, ops);
        log::info!("stopped");
        return if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    let hup = match hup_flag() {
        Ok(h) => h,
        Err(e) => return fail("host", e),
    };
    let overrides = [
        args.server.clone(),
        args.driver.map(|d| d.name().to_string()),
        args.poll.map(|p| p.name().to_string()),
    ];
    let capture =
        match args.capture.as_deref().map(|f| crate::capture::Capture::create(f, args.capture_limit)) {
            Some(Ok(c)) => Some(c),
            Some(Err(e)) => return fail("host", e),
            None => None,
        };
    let entries = crate::host_run::entries(all);
    let mut rt =
        crate::host_run::HostRuntime::new(args.config.clone(), file, overrides, entries, stop.clone());
    rt.tap = capture.as_ref().and_then(|c| c.tap());
    // Every device attaches on a thread of its own: one box that does not answer costs its
    // device, not the others.
    rt.attach_all();
    let mut ok = true;
    if args.workload {
        while !rt.settled() {
            rt.step();
            std::thread::sleep(Duration::from_millis(10));
        }
        rt.step();
        for (name, why) in rt.down() {
            log::error!("{name}: not attached, no workload: {why}");
            ok = false;
        }
        if rt.served() > 0 {
            log::warn!("--workload runs on the devices not served over vfio-user only");
        }
        for (name, d) in rt.take_direct() {
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
        stop.store(true, Ordering::Relaxed);
        rt.detach_all();
    } else if let Err(e) = crate::host_run::serve(&mut rt, &hup) {
        rt.detach_all();
        return fail("host", e);
    }
    drop(rt);
    if let Some(c) = capture
        && let Err(e) = c.finish()
    {
        log::error!("{e}");
    }
    log::info!("stopped");
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
