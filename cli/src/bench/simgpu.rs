//! `dxpu bench simgpu`: the directly attached simgpu's own figures.

use std::time::Instant;

use clap::Args;
use tlp::Bdf;

use lab::floor::{summarize, us};

/// Options of `dxpu bench simgpu`.
#[derive(Args, Debug)]
pub(crate) struct SimGpuBench {
    /// Commands timed for the latency figure.
    #[arg(long, default_value_t = 2000)]
    commands: usize,
    /// Bytes per copy for the bandwidth figures.
    #[arg(long, default_value_t = 16 << 20)]
    copy_bytes: usize,
    /// Print one JSON object on standard output (the lines go to standard error).
    #[arg(long)]
    json: bool,
}

/// `dxpu bench simgpu`: the directly attached simgpu, the baseline bridged figures are
/// compared with.
pub(crate) fn run_simgpu(args: SimGpuBench) -> Result<(), String> {
    use driver::{SimGpuDriver, WaitMode};
    use hw::simgpu::SimGpuParams;
    use simgpu_abi::op;
    use testbed::direct::DirectAttach;

    let dev = hw::SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let mem = (args.copy_bytes * 3).max(1 << 20);
    let mut d = SimGpuDriver::open(DirectAttach::new(dev, mem)).map_err(|e| e.to_string())?;
    // With --json the lines go to standard error and the object alone to standard output.
    let say = |line: String| if args.json { eprintln!("{line}") } else { outln!("{line}") };
    say("dxpu bench simgpu — directly attached simulated GPU (no bridge)".into());
    let mut lat = Vec::with_capacity(args.commands);
    for _ in 0..args.commands {
        let t0 = Instant::now();
        d.launch(op::NOP, [0; 5], WaitMode::Poll).map_err(|e| e.to_string())?;
        lat.push(t0.elapsed());
    }
    let r = summarize(lat);
    say(format!(
        "command round trip (NOP + fence, polled): p50 {:.1} µs, p99 {:.1} µs",
        us(r.p50),
        us(r.p99)
    ));
    let data: Vec<u8> = (0..args.copy_bytes).map(|i| i as u8).collect();
    let mut back = vec![0u8; args.copy_bytes];
    // One copy each way first: the host arena's and the sparse VRAM's pages are touched
    // (faulted in, zeroed) once, as a GPU's memory exists before it is copied to.
    d.memcpy_to_device(0, &data).map_err(|e| e.to_string())?;
    d.memcpy_from_device(0, &mut back).map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    d.memcpy_to_device(0, &data).map_err(|e| e.to_string())?;
    let h2d = t0.elapsed();
    back.fill(0);
    let t0 = Instant::now();
    d.memcpy_from_device(0, &mut back).map_err(|e| e.to_string())?;
    let d2h = t0.elapsed();
    if back != data {
        return Err("copy round trip mismatch".into());
    }
    let mb = args.copy_bytes as f64 / 1e6;
    let (staged_h2d, staged_d2h) = (mb / h2d.as_secs_f64(), mb / d2h.as_secs_f64());
    say(format!(
        "copy host→VRAM {staged_h2d:.0} MB/s, VRAM→host {staged_d2h:.0} MB/s ({} MiB each, verified)",
        args.copy_bytes >> 20
    ));
    let n = 1u64 << 20;
    let t0 = Instant::now();
    d.launch(op::VADD, [0, n * 4, n * 8, n, 0], WaitMode::Poll).map_err(|e| e.to_string())?;
    let vadd = t0.elapsed();
    let dims = 256u64 | 256 << 16 | 256 << 32;
    let t0 = Instant::now();
    d.launch(op::MATMUL, [0, 1 << 20, 2 << 20, dims, 0], WaitMode::Poll).map_err(|e| e.to_string())?;
    let mm = t0.elapsed();
    say(format!(
        "kernels: VADD of 2^20 fp32 {:.2} ms, MATMUL 256×256×256 fp32 {:.2} ms",
        vadd.as_secs_f64() * 1e3,
        mm.as_secs_f64() * 1e3
    ));
    // The device on a thread of its own (the replay's and loopback's baseline), copying from
    // and into a pinned buffer: DMA alone, no staging copy by the driver.
    let dev = hw::SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let attach = testbed::concurrent::ConcurrentAttach::new(dev, mem)
        .map_err(|e| format!("the device's thread: {e}"))?;
    let mut d = SimGpuDriver::open(attach).map_err(|e| e.to_string())?;
    lab::model::copy_rates(&mut d, args.copy_bytes, 1).map_err(|e| e.to_string())?;
    let (h2d, d2h) = lab::model::copy_rates(&mut d, args.copy_bytes, 5).map_err(|e| e.to_string())?;
    say(format!(
        "pinned copy, device on its own thread: host→VRAM {:.0} MB/s, VRAM→host {:.0} MB/s (median of 5)",
        h2d / 1e6,
        d2h / 1e6
    ));
    if args.json {
        let v = serde_json::json!({
            "command_round_trip": {"p50_us": us(r.p50), "p99_us": us(r.p99), "samples": args.commands},
            "copy_bytes": args.copy_bytes,
            "staged_copy": {"h2d_bytes_per_s": staged_h2d * 1e6, "d2h_bytes_per_s": staged_d2h * 1e6},
            "pinned_copy": {"h2d_bytes_per_s": h2d, "d2h_bytes_per_s": d2h},
            "vadd_2e20_fp32_ms": vadd.as_secs_f64() * 1e3,
            "matmul_256_fp32_ms": mm.as_secs_f64() * 1e3,
        });
        outln!("{v}");
    }
    Ok(())
}
