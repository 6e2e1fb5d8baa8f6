//! The `dxpu` command: GPU disaggregation at the PCIe level.

mod tlp_cmd;
mod tlp_json;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// dxpu — use a GPU in a GPU box across the network as if it sat in a local PCIe slot.
#[derive(Parser, Debug)]
#[command(name = "dxpu", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Decode and encode PCIe Transaction Layer Packets.
    #[command(subcommand)]
    Tlp(tlp_cmd::TlpCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Tlp(cmd) => tlp_cmd::run(cmd),
    }
}
