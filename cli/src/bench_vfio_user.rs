//! `dxpu bench vfio-user`'s options; the bench is `lab::bench::vfio_user`.

use clap::Args;

/// Options of `dxpu bench vfio-user`.
#[derive(Args, Debug)]
pub(crate) struct VfioUserBench {
    /// Register reads timed per case (after 10 % warm-up).
    #[arg(long, default_value_t = 5000, value_parser = crate::args::parse_count)]
    iterations: usize,
    /// Bytes per DMA copy (guest memory shared as a file), 1..=134217728 (128 MiB: the host
    /// endpoint's DMA memory is 256 MiB).
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..=128 << 20))]
    copy_bytes: u64,
    /// Bytes per DMA copy through DMA_READ / DMA_WRITE messages, 1..=134217728.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1..=128 << 20))]
    message_copy_bytes: u64,
    /// UDP driver of both endpoints (auto means portable here).
    #[arg(long, value_enum, default_value_t = crate::args::DriverArg::Portable)]
    driver: crate::args::DriverArg,
    /// Print one JSON object on standard output (the table goes to standard error).
    #[arg(long)]
    json: bool,
}

/// `dxpu bench vfio-user`: with `--json` the rows go to standard error and the object alone
/// to standard output.
pub(crate) fn run_vfio_user(args: VfioUserBench) -> Result<(), String> {
    let say = |line: String| if args.json { eprintln!("{line}") } else { outln!("{line}") };
    let options = lab::bench::vfio_user::VfioUserOptions {
        iterations: args.iterations,
        copy_bytes: args.copy_bytes as usize,
        message_copy_bytes: args.message_copy_bytes as usize,
        driver: args.driver.kind(),
    };
    let report = lab::bench::vfio_user::run(&options, &say)?;
    if args.json {
        outln!("{}", crate::out::json(report));
    }
    Ok(())
}
