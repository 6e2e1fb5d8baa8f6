//! Command-line values shared by several commands: the UDP driver and the poll mode, as
//! `--help` lists them (the configuration file spells them the same).

use std::time::Duration;

use link::driver::{DriverKind, PollMode};

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
