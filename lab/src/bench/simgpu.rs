//! `dxpu bench simgpu`: the directly attached simgpu's own figures (`crate::simgpu`'s
//! measuring), the baseline the bridged figures are compared with.

use serde_json::{Value, json};

use crate::error::LabError;
use crate::floor::us;

/// What `dxpu bench simgpu` measures.
#[derive(Debug, Clone, Copy)]
pub struct SimGpuOptions {
    /// Commands timed for the latency figure.
    pub commands: usize,
    /// Bytes per copy for the bandwidth figures.
    pub copy_bytes: usize,
}

/// `dxpu bench simgpu`: the directly attached simgpu, the baseline bridged figures are
/// compared with: says each line through `say`, and gives the report as `--json` prints it.
pub fn run(args: &SimGpuOptions, say: &dyn Fn(String)) -> Result<Value, LabError> {
    say("dxpu bench simgpu — directly attached simulated GPU (no bridge)".into());
    let f = crate::simgpu::measure(args.copy_bytes, args.commands)?;
    let r = &f.command_rtt;
    say(format!(
        "command round trip (NOP + fence, polled): p50 {:.1} µs, p99 {:.1} µs",
        us(r.p50),
        us(r.p99)
    ));
    let (staged_h2d, staged_d2h) = f.staged_mb_s;
    say(format!(
        "copy host→VRAM {staged_h2d:.0} MB/s, VRAM→host {staged_d2h:.0} MB/s ({} MiB each, verified)",
        args.copy_bytes >> 20
    ));
    let (vadd, mm) = (f.vadd, f.matmul);
    say(format!(
        "kernels: VADD of 2^20 fp32 {:.2} ms, MATMUL 256×256×256 fp32 {:.2} ms",
        vadd.as_secs_f64() * 1e3,
        mm.as_secs_f64() * 1e3
    ));
    let (h2d, d2h) = f.pinned_bytes_per_s;
    say(format!(
        "pinned copy, device on its own thread: host→VRAM {:.0} MB/s, VRAM→host {:.0} MB/s (median of 5)",
        h2d / 1e6,
        d2h / 1e6
    ));
    Ok(json!({
        "command_round_trip": {"p50_us": us(r.p50), "p99_us": us(r.p99), "samples": args.commands},
        "copy_bytes": args.copy_bytes,
        "staged_copy": {"h2d_bytes_per_s": staged_h2d * 1e6, "d2h_bytes_per_s": staged_d2h * 1e6},
        "pinned_copy": {"h2d_bytes_per_s": h2d, "d2h_bytes_per_s": d2h},
        "vadd_2e20_fp32_ms": vadd.as_secs_f64() * 1e3,
        "matmul_256_fp32_ms": mm.as_secs_f64() * 1e3,
    }))
}
