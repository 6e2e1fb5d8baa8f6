//! `dxpu gpu` and `dxpu host`: the two endpoints as daemons, configured by a TOML file with
//! command-line overrides, logging through `log`, stopping cleanly on SIGINT/SIGTERM: the
//! arguments, and the `--workload` run; the rest is `ops`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use bridge_host::RemoteDevice;
use clap::Args;
use driver::SimGpuDriver;

use crate::args::{DriverArg, PollArg};

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
    #[arg(long, default_value_t = ops::capture::DEFAULT_LIMIT, requires = "capture")]
    capture_limit: u64,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log lines as text, or as one JSON object each (`ts`, `level`, `msg`, and the
    /// `session`, `host`, `device`, `peer` they concern as fields) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Read and validate the configuration (key files, pool settings, socket directories),
    /// say whether it would start, and exit: 0 if it would, 1 naming what is wrong (as
    /// `nginx -t`; the units' ExecReload runs it before SIGHUP).
    #[arg(long)]
    check: bool,
    /// With --check: compare the file with what the daemon on its control section's socket
    /// runs — what a reload would change, or which sections need a restart (then exit 1,
    /// as the reload would be refused).
    #[arg(long, requires = "check")]
    against_running: bool,
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
    #[arg(long, default_value_t = ops::capture::DEFAULT_LIMIT, requires = "capture")]
    capture_limit: u64,
    /// Log level: error, warn, info, debug or trace (`RUST_LOG` works too).
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Log lines as text, or as one JSON object each (`ts`, `level`, `msg`, and the
    /// `session`, `host`, `device`, `peer` they concern as fields) for log shippers.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Read and validate the configuration (key files, pool settings, socket directories),
    /// say whether it would start, and exit: 0 if it would, 1 naming what is wrong (as
    /// `nginx -t`; the units' ExecReload runs it before SIGHUP).
    #[arg(long)]
    check: bool,
    /// With --check: compare the file with what the daemon on its control section's socket
    /// runs — what a reload would change, or which sections need a restart (then exit 1,
    /// as the reload would be refused).
    #[arg(long, requires = "check")]
    against_running: bool,
}

/// `--log-format`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LogFormat {
    /// `[time LEVEL] message`.
    Text,
    /// One JSON object a line.
    Json,
}

impl LogFormat {
    fn ops(self) -> ops::process::LogFormat {
        match self {
            LogFormat::Text => ops::process::LogFormat::Text,
            LogFormat::Json => ops::process::LogFormat::Json,
        }
    }
}

fn fail(cmd: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("dxpu {cmd}: {e}");
    ExitCode::FAILURE
}

/// `--driver` and `--poll` as the daemons lay them over their files' `[link]`.
fn link_override(driver: Option<DriverArg>, poll: Option<PollArg>) -> ops::config::LinkOverride {
    ops::config::LinkOverride {
        driver: driver.map(DriverArg::kind),
        poll: poll.map(|p| match p {
            PollArg::Blocking => ops::config::PollChoice::Blocking,
            PollArg::Busy => ops::config::PollChoice::Busy,
        }),
    }
}

pub(crate) fn run_gpu(args: GpuArgs) -> ExitCode {
    if let Err(e) = ops::process::init_logging_as(&args.log_level, args.log_format.ops()) {
        return fail("gpu", e);
    }
    let start = ops::gpu::GpuStart {
        config: args.config,
        listen: args.listen,
        link: link_override(args.driver, args.poll),
        capture: args.capture.map(|f| (f, args.capture_limit)),
    };
    if args.against_running {
        return against_running(&start.config, ops::gpu::check_against_running(&start), "gpu");
    }
    if args.check {
        return match ops::gpu::check(&start) {
            Ok(what) => {
                outln!("{}: OK ({what})", start.config.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail("gpu", e),
        };
    }
    match ops::gpu::run(start) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("gpu", e),
    }
}

/// `--check --against-running`'s answer: what a reload would do (0), or why it would be
/// refused (1).
fn against_running(
    config: &std::path::Path,
    r: Result<ops::against::Comparison, ops::error::RunError>,
    role: &str,
) -> ExitCode {
    match r {
        Ok(c) if c.needs_restart.is_empty() => {
            outln!("{}: OK against the running daemon: {}", config.display(), c.describe());
            ExitCode::SUCCESS
        }
        Ok(c) => fail(role, format!("{}: {}", config.display(), c.describe())),
        Err(e) => fail(role, e),
    }
}

/// The demo workload on one device, verified; the device detached after.
fn workload(name: &str, d: RemoteDevice, stop: &AtomicBool) -> bool {
    let mut drv = match SimGpuDriver::open(d) {
        Ok(drv) => drv,
        Err(e) => {
            log::error!("{name}: {e}");
            return false;
        }
    };
    let size = testbed::workload::WorkloadSize::scaled(1);
    let ok = match testbed::workload::run(&mut drv, size, &mut |step| log::info!("{name}: {step}")) {
        Ok(r) => {
            log::info!("{name}: workload verified in {:.3} s", r.seconds);
            true
        }
        Err(e) if stop.load(Ordering::Relaxed) => {
            log::error!("{name}: workload stopped by a signal ({e})");
            false
        }
        Err(e) => {
            log::error!("{name}: {e}");
            false
        }
    };
    drv.into_pci().detach();
    ok
}

pub(crate) fn run_host(args: HostArgs) -> ExitCode {
    if let Err(e) = ops::process::init_logging_as(&args.log_level, args.log_format.ops()) {
        return fail("host", e);
    }
    let start = ops::host::HostStart {
        config: args.config,
        server: args.server,
        link: link_override(args.driver, args.poll),
        capture: args.capture.map(|f| (f, args.capture_limit)),
    };
    if args.against_running {
        return against_running(&start.config, ops::host::check_against_running(&start), "host");
    }
    if args.check {
        return match ops::host::check(&start) {
            Ok(what) => {
                outln!("{}: OK ({what})", start.config.display());
                ExitCode::SUCCESS
            }
            Err(e) => fail("host", e),
        };
    }
    let mut run_on = workload;
    let r = ops::host::run(start, args.workload.then_some(&mut run_on as ops::host::Workload<'_>));
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => fail("host", e),
    }
}
