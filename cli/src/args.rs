//! Command-line values shared by several commands: the UDP driver and the poll mode, as
//! `--help` lists them (the configuration file spells them the same).

use std::time::Duration;

use link::driver::{DriverKind, Impairment, PollMode};

use crate::affinity::PinArg;

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
    /// The name, as the configuration file spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            DriverArg::Auto => "auto",
            DriverArg::IoUring => "io_uring",
            DriverArg::Portable => "portable",
        }
    }
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
    /// The name, as the configuration file spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PollArg::Blocking => "blocking",
            PollArg::Busy => "busy",
        }
    }
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
    ) -> Result<Option<crate::affinity::Placement>, String> {
        let placement = self.pin.placement(&crate::affinity::allowed()?)?;
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

fn parse_loss(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("loss {s:?}: not a number"))?;
    if !(0.0..=0.5).contains(&v) {
        return Err(format!("loss {s}: must be 0.0..=0.5"));
    }
    Ok(v)
}
