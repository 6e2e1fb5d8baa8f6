//! `dxpu bench link`'s and `dxpu bench simgpu`'s options; the benches are `lab::bench::link`
//! and `lab::bench::simgpu`.

use clap::Args;

/// Options of `dxpu bench link`.
#[derive(Args, Debug)]
pub(crate) struct LinkBench {
    /// Round trips measured per case (after 10 % warm-up).
    #[arg(long, default_value_t = 20000, value_parser = crate::args::parse_count)]
    iterations: usize,
    /// Posted writes streamed per streaming case.
    #[arg(long, default_value_t = 200_000, value_parser = crate::args::parse_count)]
    stream: usize,
    /// The sessions' MTU (the link's default is 1472; 9000 for jumbo frames).
    #[arg(long, default_value_t = 1472, value_parser = clap::value_parser!(u32).range(512..=65507))]
    mtu: u32,
    /// Print one JSON object on standard output (the table goes to standard error).
    #[arg(long)]
    json: bool,
}

/// `dxpu bench link`: with `--json` the rows go to standard error and the object alone to
/// standard output.
pub(crate) fn run_link(args: LinkBench) -> std::io::Result<()> {
    let say = |line: String| if args.json { eprintln!("{line}") } else { outln!("{line}") };
    let options =
        lab::bench::link::LinkOptions { iterations: args.iterations, stream: args.stream, mtu: args.mtu };
    let report = lab::bench::link::run(&options, &say)?;
    if args.json {
        outln!("{}", crate::out::json(report));
    }
    Ok(())
}

mod simgpu;

pub(crate) use simgpu::{SimGpuBench, run_simgpu};
