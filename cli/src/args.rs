//! Command-line values shared by several commands: the UDP driver and the poll mode, as
//! `--help` lists them (the configuration file spells them the same).

use std::time::Duration;

use link::driver::{DriverKind, Impairment, PollMode};

use lab::affinity::Placement;
use testbed::workload::Workload;

/// `--driver` on the command line: the values `--help` lists.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DriverArg {
    /// io_uring where the kernel has it, else portable (said in the log).
    Auto,
    /// io_uring (fails where the kernel lacks it).
    #[value(name = "io_uring", alias = "uring")]
    IoUring,
    /// sendmmsg / recvmmsg.
    Portable,
}

impl DriverArg {
    pub(crate) fn kind(self) -> DriverKind {
        match self {
            DriverArg::Auto => DriverKind::Auto,
            DriverArg::IoUring => DriverKind::IoUring,
            DriverArg::Portable => DriverKind::Portable,
        }
    }
}

/// `--poll` on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PollArg {
    /// Sleep in the kernel whenever there is nothing to do.
    Blocking,
    /// Spin on the socket (the spin budget), then sleep: lowest latency, a core per endpoint.
    Busy,
}

impl PollArg {
    pub(crate) fn mode(self, spin: Duration) -> PollMode {
        match self {
            PollArg::Blocking => PollMode::Blocking,
            PollArg::Busy => PollMode::Busy { spin },
        }
    }
}

/// How the endpoints of an in-process experiment run (`loopback`, `replay`): the UDP driver,
/// the poll mode and its budget, and the CPUs the spinning threads take.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct EndpointArgs {
    /// UDP driver.
    #[arg(long, value_enum, default_value_t = DriverArg::Auto)]
    pub(crate) driver: DriverArg,
    /// How the endpoints wait for work.
    #[arg(long, value_enum, default_value_t = PollArg::Busy)]
    pub(crate) poll: PollArg,
    /// Busy-poll budget before sleeping in the kernel, µs.
    #[arg(long, default_value_t = 2000)]
    pub(crate) spin_us: u64,
    /// Which CPUs the spinning threads run on: DEVICE,HOST puts the GPU-box endpoint's thread
    /// (which runs the device) and the directly attached device on CPU DEVICE, the host side
    /// (the workload's driver, the replayed job) on CPU HOST, so that the device computes on
    /// one CPU both ways and the two spinning threads never share one; auto: the first two
    /// CPUs this process may use (none where it may use one); off: wherever the scheduler
    /// puts them.
    #[arg(long, default_value = "auto", value_parser = PinArg::parse, value_name = "auto|off|DEVICE,HOST")]
    pub(crate) pin: PinArg,
}

impl Default for EndpointArgs {
    fn default() -> EndpointArgs {
        EndpointArgs { driver: DriverArg::Auto, poll: PollArg::Busy, spin_us: 2000, pin: PinArg::Auto }
    }
}

impl EndpointArgs {
    /// The poll mode with its budget.
    pub(crate) fn poll_mode(&self) -> PollMode {
        self.poll.mode(Duration::from_micros(self.spin_us))
    }

    /// Where `--pin` puts the spinning threads among the CPUs this process may use, said
    /// through `progress`; `host` names what runs on the host's CPU.
    pub(crate) fn placement(
        &self,
        host: &str,
        progress: &mut dyn FnMut(&str),
    ) -> Result<Option<Placement>, String> {
        let placement = self.pin.placement(&lab::affinity::allowed()?)?;
        if let Some(p) = placement {
            progress(&format!(
                "pinned: the GPU-box endpoint and the direct device to CPU {}, {host} to CPU {}",
                p.device, p.host
            ));
        }
        Ok(placement)
    }
}

/// The link's impairment an experiment adds (`loopback`, `replay`): delay, jitter, loss.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ImpairArgs {
    /// Added one-way delay in each direction, µs (0..=10000; emulates distance).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) delay_us: u64,
    /// Random extra delay per datagram, up to this many µs (0..=10000; reorders).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub(crate) jitter_us: u64,
    /// Datagram loss probability in each direction, 0.0..=0.5.
    #[arg(long, default_value_t = 0.0, value_parser = parse_loss)]
    pub(crate) loss: f64,
}

impl ImpairArgs {
    /// The impairment asked for, seeded.
    pub(crate) fn impairment(&self, seed: u64) -> Impairment {
        Impairment {
            loss: self.loss,
            delay: Duration::from_micros(self.delay_us),
            jitter: Duration::from_micros(self.jitter_us),
            seed,
            ..Impairment::default()
        }
    }

    /// The most a datagram is held back each way: delay and jitter.
    pub(crate) fn held(&self) -> Duration {
        Duration::from_micros(self.delay_us + self.jitter_us)
    }
}

/// The most of anything a command counts and keeps a sample of (reads timed, writes
/// streamed, commands): 10 million, some minutes of the slowest case.
pub(crate) const MAX_COUNT: usize = 10_000_000;

/// A count of reads, writes or commands: 1..=[`MAX_COUNT`] (a count past it asked for
/// memory the machine does not have, or hours).
pub(crate) fn parse_count(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_COUNT).contains(&n) => Ok(n),
        _ => Err(format!("{s}: must be a count, 1..={MAX_COUNT}")),
    }
}

fn parse_loss(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("loss {s:?}: not a number"))?;
    if !(0.0..=0.5).contains(&v) {
        return Err(format!("loss {s}: must be 0.0..=0.5"));
    }
    Ok(v)
}

/// `--pin`'s value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinArg {
    /// The first two CPUs this process may use; no pinning where it may use only one.
    Auto,
    /// Wherever the scheduler puts the threads.
    Off,
    /// These two CPUs.
    Cpus(Placement),
}

impl PinArg {
    /// Parses `auto`, `off` or `DEVICE,HOST` (two different CPU numbers).
    pub(crate) fn parse(v: &str) -> Result<PinArg, String> {
        match v {
            "auto" => return Ok(PinArg::Auto),
            "off" => return Ok(PinArg::Off),
            _ => {}
        }
        let bad = || format!("{v:?}: expected auto, off or DEVICE,HOST (two CPU numbers, e.g. 0,1)");
        let (d, h) = v.split_once(',').ok_or_else(bad)?;
        let (device, host) =
            (d.trim().parse::<usize>().map_err(|_| bad())?, h.trim().parse::<usize>().map_err(|_| bad())?);
        if device == host {
            return Err(format!("{v:?}: the device's and the host's CPU must differ (both spin)"));
        }
        Ok(PinArg::Cpus(Placement { device, host }))
    }

    /// The placement this asks for among `allowed` (the CPUs the process may use): `None`
    /// for off, and for auto where fewer than two are allowed; an error for a CPU given that
    /// is not among them.
    pub(crate) fn placement(self, allowed: &[usize]) -> Result<Option<Placement>, String> {
        match self {
            PinArg::Off => Ok(None),
            PinArg::Auto => Ok(match allowed {
                [device, host, ..] => Some(Placement { device: *device, host: *host }),
                _ => None,
            }),
            PinArg::Cpus(p) => {
                for c in [p.device, p.host] {
                    if !allowed.contains(&c) {
                        return Err(format!("--pin: CPU {c} is not one this process may use ({allowed:?})"));
                    }
                }
                Ok(Some(p))
            }
        }
    }
}

/// The workloads `dxpu loopback` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WorkloadArg {
    /// Copies each way, a fill, vector kernels, a matrix multiply, fences by polling and by
    /// interrupt (`testbed::workload`).
    Demo,
    /// Weights resident in VRAM; per request a small input copy, MATMUL + VADD per layer, a
    /// small output copy, one fence waited by interrupt (`testbed::ai`).
    Inference,
    /// Per step forward and backward MATMULs per micro-batch, a gradient reduction, a SAXPY
    /// update; the loss read every 2 steps, a checkpoint every 4.
    Training,
    /// 2 MiB batches streamed host→device through two pinned buffers under kernels.
    DataLoading,
}

impl WorkloadArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkloadArg::Demo => "demo",
            WorkloadArg::Inference => "inference",
            WorkloadArg::Training => "training",
            WorkloadArg::DataLoading => "data-loading",
        }
    }

    pub(crate) const ALL: [WorkloadArg; 4] =
        [WorkloadArg::Demo, WorkloadArg::Inference, WorkloadArg::Training, WorkloadArg::DataLoading];

    /// The workload at `scale`, with `--batch` and `--layers`; either given to a workload it
    /// does not apply to is refused (it would change nothing).
    pub(crate) fn workload(
        self,
        scale: u32,
        batch: Option<u16>,
        layers: Option<u16>,
    ) -> Result<Workload, String> {
        let w = Workload::named(self.name(), scale)
            .unwrap_or_else(|| unreachable!("every WorkloadArg names a workload"));
        let refused = |what: &str| format!("{what} does not apply to the {} workload", self.name());
        Ok(match w {
            Workload::Inference(mut s) => {
                s.batch = batch.map_or(s.batch, usize::from);
                s.layers = layers.map_or(s.layers, usize::from);
                Workload::Inference(s)
            }
            Workload::Training(mut s) => {
                if layers.is_some() {
                    return Err(refused("--layers (inference only)"));
                }
                s.batch = batch.map_or(s.batch, usize::from);
                Workload::Training(s)
            }
            _ if batch.is_some() => return Err(refused("--batch (inference and training only)")),
            _ if layers.is_some() => return Err(refused("--layers (inference only)")),
            w => w,
        })
    }
}

/// How TLPs are printed: JSON Lines or trace lines.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// JSON Lines.
    Json,
    /// Human trace lines.
    Text,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn parses_auto_off_and_two_different_cpus() {
        assert_eq!(PinArg::parse("auto"), Ok(PinArg::Auto));
        assert_eq!(PinArg::parse("off"), Ok(PinArg::Off));
        assert_eq!(PinArg::parse("3, 1"), Ok(PinArg::Cpus(Placement { device: 3, host: 1 })));
        for bad in ["", "1", "1,", "a,b", "-1,2", "1,2,3", "on"] {
            let e = PinArg::parse(bad).unwrap_err();
            assert!(e.contains("DEVICE,HOST"), "{bad:?}: {e}");
        }
        assert!(PinArg::parse("2,2").unwrap_err().contains("must differ"));
    }

    #[test]
    fn a_count_is_one_to_ten_million() {
        assert_eq!(parse_count("1"), Ok(1));
        assert_eq!(parse_count(" 10000000 "), Ok(MAX_COUNT));
        for bad in ["0", "10000001", "18446744073709551616", "-1", "1.5", "", "x"] {
            assert!(parse_count(bad).unwrap_err().contains("must be a count"), "{bad}");
        }
    }

    #[test]
    fn placement_takes_the_first_two_allowed_or_none() {
        assert_eq!(PinArg::Auto.placement(&[2, 5, 7]), Ok(Some(Placement { device: 2, host: 5 })));
        assert_eq!(PinArg::Auto.placement(&[4]), Ok(None));
        assert_eq!(PinArg::Off.placement(&[0, 1]), Ok(None));
        let p = Placement { device: 1, host: 0 };
        assert_eq!(PinArg::Cpus(p).placement(&[0, 1]), Ok(Some(p)));
        let e = PinArg::Cpus(Placement { device: 0, host: 9 }).placement(&[0, 1]).unwrap_err();
        assert!(e.contains("CPU 9") && e.contains("[0, 1]"), "{e}");
    }
}
