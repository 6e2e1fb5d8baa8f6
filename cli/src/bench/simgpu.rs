//! `dxpu bench simgpu`'s options; the bench is `lab::bench::simgpu`.

use clap::Args;

/// Options of `dxpu bench simgpu`.
#[derive(Args, Debug)]
pub(crate) struct SimGpuBench {
    /// Commands timed for the latency figure.
    #[arg(long, default_value_t = 2000, value_parser = crate::args::parse_count)]
    commands: usize,
    /// Bytes per copy for the bandwidth figures, 1..=67108864 (64 MiB: the copies' three
    /// buffers fit the simgpu's 256 MiB of VRAM).
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..=64 << 20))]
    copy_bytes: u64,
    /// Print one JSON object on standard output (the lines go to standard error).
    #[arg(long)]
    json: bool,
}

/// `dxpu bench simgpu`: with `--json` the lines go to standard error and the object alone to
/// standard output.
pub(crate) fn run_simgpu(args: SimGpuBench) -> Result<(), String> {
    let say = |line: String| if args.json { eprintln!("{line}") } else { outln!("{line}") };
    let options =
        lab::bench::simgpu::SimGpuOptions { commands: args.commands, copy_bytes: args.copy_bytes as usize };
    let report = lab::bench::simgpu::run(&options, &say)?;
    if args.json {
        outln!("{}", crate::out::json(report));
    }
    Ok(())
}
