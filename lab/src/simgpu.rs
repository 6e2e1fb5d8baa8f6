//! The directly attached simgpu's own figures, the baseline bridged figures are compared
//! with: a command's round trip, staged and pinned copies each way, two kernels.

use std::time::{Duration, Instant};

use driver::{SimGpuDriver, WaitMode};
use hw::simgpu::SimGpuParams;
use simgpu_abi::op;
use testbed::concurrent::ConcurrentAttach;
use testbed::direct::DirectAttach;
use tlp::Bdf;

use crate::error::LabError;
use crate::floor::{Rtt, summarize};

/// What [`measure`] found.
pub struct SimGpuFigures {
    /// A NOP and its fence, polled.
    pub command_rtt: Rtt,
    /// The driver's staged `memcpy`, MB/s host→VRAM and VRAM→host, one copy each after one
    /// untimed (the pages touched first, as a GPU's memory exists before it is copied to).
    pub staged_mb_s: (f64, f64),
    /// A VADD of 2^20 fp32.
    pub vadd: Duration,
    /// A MATMUL of 256×256×256 fp32.
    pub matmul: Duration,
    /// Pinned copies, the device on a thread of its own (the replay's and loopback's
    /// baseline): bytes per second each way, the median of five after one.
    pub pinned_bytes_per_s: (f64, f64),
}

/// `commands` NOPs timed, copies of `copy_bytes` each way, the two kernels, on a directly
/// attached simgpu; then the pinned copies on one whose device runs on a thread of its own.
pub fn measure(copy_bytes: usize, commands: usize) -> Result<SimGpuFigures, LabError> {
    let failed = |what| LabError::driver("direct", what);
    let mem = (copy_bytes * 3).max(1 << 20);
    let dev = hw::SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let mut d = SimGpuDriver::open(DirectAttach::new(dev, mem)).map_err(failed("opening the simgpu"))?;
    let mut lat = Vec::with_capacity(commands);
    for _ in 0..commands {
        let t0 = Instant::now();
        d.launch(op::NOP, [0; 5], WaitMode::Poll).map_err(failed("NOP"))?;
        lat.push(t0.elapsed());
    }
    let data: Vec<u8> = (0..copy_bytes).map(|i| i as u8).collect();
    let mut back = vec![0u8; copy_bytes];
    d.memcpy_to_device(0, &data).map_err(failed("copy to the device"))?;
    d.memcpy_from_device(0, &mut back).map_err(failed("copy from the device"))?;
    let t0 = Instant::now();
    d.memcpy_to_device(0, &data).map_err(failed("copy to the device"))?;
    let h2d = t0.elapsed();
    back.fill(0);
    let t0 = Instant::now();
    d.memcpy_from_device(0, &mut back).map_err(failed("copy from the device"))?;
    let d2h = t0.elapsed();
    if back != data {
        return Err(LabError::CopyCorrupted { bytes: copy_bytes });
    }
    let mb = copy_bytes as f64 / 1e6;
    let n = 1u64 << 20;
    let t0 = Instant::now();
    d.launch(op::VADD, [0, n * 4, n * 8, n, 0], WaitMode::Poll).map_err(failed("VADD"))?;
    let vadd = t0.elapsed();
    let dims = 256u64 | 256 << 16 | 256 << 32;
    let t0 = Instant::now();
    d.launch(op::MATMUL, [0, 1 << 20, 2 << 20, dims, 0], WaitMode::Poll).map_err(failed("MATMUL"))?;
    let matmul = t0.elapsed();
    let dev = hw::SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let attach = ConcurrentAttach::new(dev, mem).map_err(LabError::Direct)?;
    let mut d = SimGpuDriver::open(attach).map_err(failed("opening the simgpu"))?;
    crate::model::copy_rates(&mut d, copy_bytes, 1).map_err(failed("pinned copies"))?;
    let pinned = crate::model::copy_rates(&mut d, copy_bytes, 5).map_err(failed("pinned copies"))?;
    Ok(SimGpuFigures {
        command_rtt: summarize(lat),
        staged_mb_s: (mb / h2d.as_secs_f64(), mb / d2h.as_secs_f64()),
        vadd,
        matmul,
        pinned_bytes_per_s: pinned,
    })
}
