//! `dxpu loopback`'s options, and what it runs with none.

use clap::Args;

use crate::args::WorkloadArg;
use crate::args::{EndpointArgs, ImpairArgs};

/// Options of `dxpu loopback`.
#[derive(Args, Debug, Clone)]
pub(crate) struct LoopbackArgs {
    /// Workload size, 1..=32: the demo's MiB copied each way (×64 Ki-element vectors); the
    /// AI workloads' requests, steps or batches, 2 per unit.
    #[arg(long, default_value_t = 4)]
    pub(crate) scale: u32,
    /// The workload; every one in turn unless given, and a summary of their overheads.
    #[arg(long, value_enum)]
    pub(crate) workload: Option<WorkloadArg>,
    /// Rows per request (`inference`, 1..=256; 16 unless given) or per micro-batch
    /// (`training`, 1..=256; 64).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub(crate) batch: Option<u16>,
    /// Layers in each request's chain of kernels (`inference`, 1..=32; 4 unless given).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub(crate) layers: Option<u16>,
    /// How the directly attached simgpu the bridged runs are compared with runs: inside the
    /// driver's calls (synchronous) or on a thread of its own (concurrent).
    #[arg(long, value_enum, default_value_t = BaselineArg::Synchronous)]
    pub(crate) baseline: BaselineArg,
    /// Runs of the workload each way, bridged and direct in turns (1..=1000); the report
    /// gives the medians and their spread.
    #[arg(long, default_value_t = DEFAULT_REPEAT, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) repeat: u32,
    #[command(flatten)]
    pub(crate) endpoints: EndpointArgs,
    #[command(flatten)]
    pub(crate) impair: ImpairArgs,
    /// Encrypt the frames' bodies (link.encrypt_frames), as on a fabric others can read.
    #[arg(long)]
    pub(crate) encrypt: bool,
    /// MMIO reads timed for the round-trip figures.
    #[arg(long, default_value_t = 2000, value_parser = crate::args::parse_count)]
    pub(crate) rtt_samples: usize,
    /// Write the host endpoint's link, both ways, to this pcapng file (read it with
    /// `dxpu tlp decode --pcap`, or Wireshark with contrib/wireshark/dxpu.lua).
    #[arg(long, value_name = "FILE")]
    pub(crate) capture: Option<std::path::PathBuf>,
    /// The capture file's size bound in bytes; packets beyond it are counted, not written.
    #[arg(long, default_value_t = ops::capture::DEFAULT_LIMIT, requires = "capture")]
    pub(crate) capture_limit: u64,
    /// The capture's tap (set from --capture).
    #[arg(skip)]
    pub(crate) tap: Option<link::driver::Tap>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
    /// Say every step of every run on standard error (else a progress bar on a terminal,
    /// and a line per workload elsewhere).
    #[arg(long, short)]
    pub(crate) verbose: bool,
    /// Instead of running the workload, serve the remote simgpu to a VMM over vfio-user on
    /// DIR/gpu0.sock (QEMU: -device vfio-user-pci) until SIGINT or SIGTERM.
    #[arg(long, value_name = "DIR")]
    pub(crate) vfio_user: Option<std::path::PathBuf>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, default_value = "warn")]
    pub(crate) log_level: String,
}

/// Runs each way by default: enough that invocations in a row agree on the median overhead
/// within ±5 percentage points on the 2-core development machine (docs/performance.md: 9
/// did not, nor did 41 through one attachment).
pub(crate) const DEFAULT_REPEAT: u32 = 15;

impl LoopbackArgs {
    /// What `dxpu loopback` runs with no options.
    pub(crate) fn defaults() -> LoopbackArgs {
        LoopbackArgs {
            scale: 4,
            workload: None,
            batch: None,
            layers: None,
            baseline: BaselineArg::Synchronous,
            repeat: DEFAULT_REPEAT,
            endpoints: EndpointArgs::default(),
            impair: ImpairArgs::default(),
            encrypt: false,
            rtt_samples: 2000,
            json: false,
            verbose: false,
            vfio_user: None,
            log_level: "warn".into(),
            capture: None,
            capture_limit: ops::capture::DEFAULT_LIMIT,
            tap: None,
        }
    }
}

/// `--baseline`: how the directly attached simgpu runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BaselineArg {
    /// Inside the driver's calls, on the driver's thread: one thread busy.
    Synchronous,
    /// On a thread of its own beside the driver's, as a GPU beside the CPU: two threads
    /// busy, as through the bridges.
    Concurrent,
}
