//! `dxpu bench chaos`'s options; the soak and its report are `lab::chaos` (docs/reliability.md
//! says what it injects and what must hold).

use std::path::PathBuf;

use clap::Args;
use lab::chaos::ChaosOptions;

/// Options of `dxpu bench chaos`.
#[derive(Args, Debug)]
pub(crate) struct ChaosBench {
    /// How long to inject faults, in minutes (0.1..=1440).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// The seed of the fault schedule: the same seed, the same faults in the same order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where the configuration files, logs and `chaos.json` go (default: a new directory
    /// under the system's temporary directory, kept).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Runs the soak; whether everything that must hold held.
pub(crate) fn run_chaos(args: ChaosBench) -> Result<bool, String> {
    let dxpu = std::env::current_exe().map_err(|e| format!("this program's path: {e}"))?;
    let opts = ChaosOptions { minutes: args.minutes, seed: args.seed, dir: args.dir.clone(), dxpu };
    let steps = crate::out::Steps::counted("bench chaos", 1);
    let o = lab::chaos::soak(&opts, &crate::interrupt::requested, &mut |at, what| steps.at(at, what))
        .map_err(|e| e.to_string())?;
    drop(steps);
    let report = lab::chaos::report::json(&opts, &o);
    let _ = std::fs::write(o.dir.join("chaos.json"), format!("{}\n", crate::out::json_pretty(&report)));
    if args.json {
        outln!("{}", crate::out::json(report));
    } else {
        out!("{}", lab::chaos::report::text(&opts, &o));
    }
    Ok(o.ok)
}
