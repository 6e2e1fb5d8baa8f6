//! The `dxpu` command: GPU disaggregation at the PCIe level.
#![forbid(unsafe_code)]

// First, so that every module below may use its macros.
#[macro_use]
mod out;

mod args;
mod bench;
mod bench_bridge;
mod bench_chaos;
mod bench_model;
mod bench_pool;
mod bench_vfio_user;
mod ctl;
mod daemon;
mod interrupt;
mod loopback;
mod model;
mod package;
mod pool_cmd;
mod replay_cmd;
mod sim_cmd;
mod tlp_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The version `--version` prints: the package's, and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("DXPU_COMMIT"), ")");

/// dxpu — use a GPU in a GPU box across the network as if it sat in a local PCIe slot.
#[derive(Parser, Debug)]
#[command(name = "dxpu", version = VERSION, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Both endpoints and a simulated GPU on this machine: a workload (the demo, inference,
    /// training, data loading) through the bridges over UDP loopback, verified, compared
    /// with a directly attached simgpu, and with what the performance model predicts.
    Loopback(loopback::LoopbackArgs),
    /// The performance model: a workload's bridged time and overhead predicted at each
    /// round-trip time, from its transaction profile and the link's bandwidth.
    Model(model::ModelArgs),
    /// A PyTorch profiler trace replayed on the simulated GPU at the traced GPU's speed,
    /// directly attached and through both endpoints over UDP loopback, in turns: the
    /// overhead, where it went, and the model's prediction.
    Replay(replay_cmd::ReplayArgs),
    /// The GPU-box endpoint: export devices to hosts.
    Gpu(daemon::GpuArgs),
    /// The host endpoint: attach remote devices.
    Host(daemon::HostArgs),
    /// Ask a running endpoint through its control socket: status, devices, sessions, stats;
    /// attach / detach (host), export / unexport (box), reload.
    Ctl(ctl::CtlArgs),
    /// A GPU pool on etcd: list its devices, drain, undrain, revoke, watch changes.
    Pool(pool_cmd::PoolArgs),
    /// Decode and encode PCIe Transaction Layer Packets.
    #[command(subcommand)]
    Tlp(tlp_cmd::TlpCommand),
    /// The simulated GPU on its own.
    #[command(subcommand)]
    Sim(sim_cmd::SimCommand),
    /// Benchmarks that print figures (not pass/fail).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write a new random pre-shared key file (mode 0600) for a host and its box.
    Keygen(package::KeygenArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(package::CompletionsArgs),
    /// Write the man pages (dxpu.1 and one per subcommand) into a directory.
    Man(package::ManArgs),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// The transport over UDP loopback: round trips against the bare UDP floor, streaming
    /// against bare sockets, MAC and encryption cost.
    Link(bench::LinkBench),
    /// The directly attached simulated GPU (no bridge): command latency, copy bandwidth,
    /// kernel time — the baseline for bridged figures.
    Simgpu(bench::SimGpuBench),
    /// Both endpoints over UDP loopback: MMIO round trip against the bare ping-pong floor,
    /// DMA throughput against bare sockets and the UDP GSO + GRO floor, the demo workload
    /// bridged against direct (--json for scripts).
    Bridge(bench_bridge::BridgeBench),
    /// The vfio-user server without a VMM: register reads and DMA through it against the
    /// bridged device, guest memory shared as a file or reached by messages.
    VfioUser(bench_vfio_user::VfioUserBench),
    /// Every workload at added one-way delays: measured overhead (median, spread) beside
    /// the performance model's prediction; a table, DIR/model.json and a plot per workload.
    Model(bench_model::ModelBench),
    /// A claim-and-release storm of simulated hosts over simulated boxes against a
    /// three-member etcd cluster: claims/s, claim latency, etcd round trips per claim at
    /// each pool size, double allocations.
    Pool(bench_pool::PoolBench),
    /// A fault-injection soak: a pool of two boxes and hosts running the verified workload
    /// while loss bursts, kills, etcd member losses, reloads and stalling clients are
    /// injected from a seed; checks every run is accounted for, no device has two owners,
    /// and memory stays flat (exits 1 otherwise).
    Chaos(bench_chaos::ChaosBench),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The experiments say on standard error what they could not measure (`lab`'s warnings:
    // a CPU round trip, a thread not placed); the daemons start their own logging.
    if matches!(
        cli.command,
        Command::Loopback(_) | Command::Model(_) | Command::Replay(_) | Command::Bench(_)
    ) && let Err(e) = ops::process::init_logging("warn")
    {
        eprintln!("dxpu: logging: {e}");
    }
    match cli.command {
        Command::Loopback(args) => {
            // Serving a VM (`--vfio-user`) stops on its own signals.
            if args.vfio_user.is_none() {
                interrupt::install();
            }
            loopback::run_loopback(args)
        }
        Command::Model(args) => {
            interrupt::install();
            model::run_model(args)
        }
        Command::Replay(args) => {
            interrupt::install();
            replay_cmd::run_replay(args)
        }
        Command::Gpu(args) => daemon::run_gpu(args),
        Command::Host(args) => daemon::run_host(args),
        Command::Pool(args) => pool_cmd::run(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Keygen(args) => package::keygen(args),
        Command::Completions(args) => package::completions(args),
        Command::Man(args) => package::man(args),
        Command::Tlp(cmd) => tlp_cmd::run(cmd),
        Command::Sim(cmd) => {
            sim_cmd::run(cmd);
            ExitCode::SUCCESS
        }
        Command::Bench(cmd) => {
            interrupt::install();
            run_bench(cmd)
        }
    }
}

/// A benchmark, its error said with its name.
fn run_bench(cmd: BenchCommand) -> ExitCode {
    match cmd {
        BenchCommand::Simgpu(args) => match bench::run_simgpu(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench simgpu: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::VfioUser(args) => match bench_vfio_user::run_vfio_user(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench vfio-user: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Bridge(args) => match bench_bridge::run_bridge(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench bridge: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Model(args) => match bench_model::run_model_bench(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench model: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Pool(args) => match bench_pool::run_pool_bench(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench pool: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Chaos(args) => match bench_chaos::run_chaos(args) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
            Err(e) => {
                eprintln!("dxpu bench chaos: {e}");
                ExitCode::FAILURE
            }
        },
        BenchCommand::Link(args) => match bench::run_link(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dxpu bench link: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
