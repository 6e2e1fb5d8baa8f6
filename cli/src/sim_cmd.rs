//! `dxpu sim`: the simulated GPU on its own.

use clap::{Args, Subcommand};
use hw::simgpu::{self, SimGpuParams};

#[derive(Subcommand, Debug)]
pub(crate) enum SimCommand {
    /// Print the simulated GPU's 4 KiB config space in the format `lspci -F` reads.
    DumpConfig(DumpConfig),
}

#[derive(Args, Debug)]
pub(crate) struct DumpConfig {
    /// VRAM size (the prefetchable BAR2), e.g. 256M, 8G, or bytes; rounded up to a power of two.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    vram: u64,
    /// MSI-X vectors (4..=2048).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(4..=2048))]
    vectors: u16,
    /// The slot printed on the first line (bb:dd.f).
    #[arg(long, default_value = "01:00.0", value_parser = parse_slot)]
    slot: String,
}

/// Parses `1024`, `64K`, `256M`, `8G` (powers of 1024).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 10),
        Some((i, 'm' | 'M')) => (&t[..i], 20),
        Some((i, 'g' | 'G')) => (&t[..i], 30),
        _ => (t, 0),
    };
    let n: u64 =
        num.parse().map_err(|_| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))?;
    let bytes =
        n.checked_shl(shift).filter(|b| b >> shift == n).ok_or_else(|| format!("{s:?} is too large"))?;
    if !(4096..=1 << 40).contains(&bytes) {
        return Err(format!("{s:?}: VRAM must be between 4K and 1T"));
    }
    Ok(bytes)
}

fn parse_slot(s: &str) -> Result<String, String> {
    s.parse::<tlp::Bdf>().map(|b| b.to_string()).map_err(|e| e.to_string())
}

pub(crate) fn run(cmd: SimCommand) {
    match cmd {
        SimCommand::DumpConfig(a) => {
            let p = SimGpuParams { vram_bytes: a.vram, msix_vectors: a.vectors, ..SimGpuParams::default() };
            out!("{}", simgpu::lspci_dump(&simgpu::config_space(&p), &a.slot));
        }
    }
}
