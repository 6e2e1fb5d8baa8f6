//! `dxpu bench bridge`'s options; the bench is `lab::bench::bridge`.

use clap::Args;
use link::driver::DriverKind;

use crate::args::PinArg;

/// Options of `dxpu bench bridge`.
#[derive(Args, Debug)]
pub(crate) struct BridgeBench {
    /// MMIO reads timed per case (after 10 % warm-up).
    #[arg(long, default_value_t = 20000, value_parser = crate::args::parse_count)]
    iterations: usize,
    /// Bytes per DMA copy, 1..=134217728 (128 MiB: a copy's host buffer comes from the host
    /// endpoint's 256 MiB of DMA memory).
    #[arg(long, default_value_t = 64 << 20, value_parser = clap::value_parser!(u64).range(1..=128 << 20))]
    copy_bytes: u64,
    /// Workload scale for the bridged-versus-direct comparison (1..=32).
    #[arg(long, default_value_t = 4)]
    scale: u32,
    /// Print one JSON object on standard output (the table goes to standard error).
    #[arg(long)]
    json: bool,
    /// Copies timed per DMA row, after one untimed (VRAM and host pages touched); the row
    /// shows their median.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    copy_repeat: u32,
    /// Run only these sections (repeat the option, or separate with commas); all by default.
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Section>,
    /// Run the bridged rows with only this link driver; both (where io_uring exists) by
    /// default.
    #[arg(long, value_enum)]
    driver: Option<DriverChoice>,
    /// Which CPUs the register reads' two spinning threads run on: DEVICE,HOST puts the
    /// echoing thread of each ping-pong floor and the GPU-box endpoint's thread on CPU
    /// DEVICE, the reading thread on CPU HOST; auto: the first two CPUs this process may use
    /// (none where it may use one); off: wherever the scheduler puts them.
    #[arg(long, default_value = "auto", value_parser = PinArg::parse, value_name = "auto|off|DEVICE,HOST")]
    pin: PinArg,
}

/// A part of `dxpu bench bridge`'s report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Section {
    /// (a) register reads through the bridges against the ping-pong floors.
    Mmio,
    /// (b) DMA through the bridges against bare sockets, the GSO + GRO floor and direct.
    Dma,
    /// (c) the demo workload bridged against direct.
    Workload,
}

/// A link driver to bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DriverChoice {
    /// recvmmsg/sendmmsg on a non-blocking socket.
    Portable,
    /// io_uring.
    #[value(name = "io_uring", alias = "io-uring")]
    IoUring,
}

impl BridgeBench {
    /// What the options ask `lab::bench::bridge` for; the workload's runs as `dxpu loopback
    /// --workload demo` makes them with no other option but the scale.
    fn options(&self) -> Result<lab::bench::bridge::BridgeOptions, String> {
        let runs = |s: Section| self.only.is_empty() || self.only.contains(&s);
        let workload = if runs(Section::Workload) {
            let mut la = crate::loopback::LoopbackArgs::defaults();
            la.scale = self.scale;
            la.workload = Some(crate::args::WorkloadArg::Demo);
            la.rtt_samples = 200;
            Some((self.scale, crate::loopback::options(&la, &mut |_| {})?))
        } else {
            None
        };
        Ok(lab::bench::bridge::BridgeOptions {
            iterations: self.iterations,
            copy_bytes: self.copy_bytes as usize,
            copy_repeat: self.copy_repeat,
            mmio: match runs(Section::Mmio) {
                true => Some(self.pin.placement(&lab::affinity::allowed()?)?),
                false => None,
            },
            dma: runs(Section::Dma),
            workload,
            driver: self.driver.map(|d| match d {
                DriverChoice::Portable => DriverKind::Portable,
                DriverChoice::IoUring => DriverKind::IoUring,
            }),
        })
    }
}

/// `dxpu bench bridge`: with `--json` the rows go to standard error and the object alone to
/// standard output.
pub(crate) fn run_bridge(args: BridgeBench) -> Result<(), String> {
    let say = |line: String| if args.json { eprintln!("{line}") } else { outln!("{line}") };
    let report = lab::bench::bridge::run(&args.options()?, &say)?;
    if args.json {
        outln!("{}", crate::out::json(report));
    }
    Ok(())
}
