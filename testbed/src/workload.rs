//! The demo workload `dxpu loopback` runs and the integration tests repeat: copies in both
//! directions, every kernel, fences by polling and by interrupt, each result checked
//! against a CPU reference. It runs on any [`PciFunction`], so the bridged run and the
//! directly attached baseline execute exactly the same commands.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use crate::outcome::check;
pub use crate::outcome::{Step, WorkloadError, WorkloadReport};
use crate::suite::{f32_bytes, pattern, read_f32s};
use driver::{DriverError, PciFunction, SimGpuDriver, WaitMode};
use simgpu_abi::{op, reg};

/// How much work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadSize {
    /// Bytes copied each way.
    pub copy_bytes: usize,
    /// fp32 elements of the vector kernels.
    pub vector_len: usize,
    /// Matrix dimension (square, 1..=256).
    pub matrix_dim: usize,
    /// Fences waited for by interrupt.
    pub fences: usize,
}

impl WorkloadSize {
    /// A size from a scale, 1..=32 (clamped): `scale` MiB copies, `scale` × 64 Ki-element
    /// vectors, 64·`scale` square matrices (at most 256). It fits the default 256 MiB VRAM.
    pub fn scaled(scale: u32) -> WorkloadSize {
        let s = scale.clamp(1, 32) as usize;
        WorkloadSize { copy_bytes: s << 20, vector_len: s << 16, matrix_dim: (64 * s).min(256), fences: 16 }
    }
}

/// A workload and its size: the demo or one shaped like AI work ([`crate::ai`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Copies each way, every kernel, fences by polling and by interrupt ([`run`]).
    Demo(WorkloadSize),
    /// Weights resident, requests through a chain of kernels ([`crate::ai::inference`]).
    Inference(crate::ai::InferenceSize),
    /// Forward, backward, reduction, optimizer, loss and checkpoints ([`crate::ai::training`]).
    Training(crate::ai::TrainingSize),
    /// A bulk host→device stream under kernels ([`crate::ai::data_loading`]).
    DataLoading(crate::ai::DataLoadingSize),
}

impl Workload {
    /// The workloads' names, as `dxpu loopback --workload` takes them.
    pub const NAMES: [&'static str; 4] = ["demo", "inference", "training", "data-loading"];

    /// Workload `name` at `scale` (1..=32), or `None` for a name not in [`Self::NAMES`].
    pub fn named(name: &str, scale: u32) -> Option<Workload> {
        Some(match name {
            "demo" => Workload::Demo(WorkloadSize::scaled(scale)),
            "inference" => Workload::Inference(crate::ai::InferenceSize::scaled(scale)),
            "training" => Workload::Training(crate::ai::TrainingSize::scaled(scale)),
            "data-loading" => Workload::DataLoading(crate::ai::DataLoadingSize::scaled(scale)),
            _ => return None,
        })
    }

    /// Its name.
    pub fn name(&self) -> &'static str {
        match self {
            Workload::Demo(_) => "demo",
            Workload::Inference(_) => "inference",
            Workload::Training(_) => "training",
            Workload::DataLoading(_) => "data-loading",
        }
    }

    /// Runs it on an opened driver, every result checked against the CPU.
    pub fn run<P: PciFunction>(
        &self,
        d: &mut SimGpuDriver<P>,
        progress: &mut dyn FnMut(&str),
    ) -> Result<WorkloadReport, WorkloadError> {
        match *self {
            Workload::Demo(s) => run(d, s, progress),
            Workload::Inference(s) => crate::ai::inference(d, s, progress),
            Workload::Training(s) => crate::ai::training(d, s, progress),
            Workload::DataLoading(s) => crate::ai::data_loading(d, s, progress),
        }
    }
}

struct StepTimer<'a, P: PciFunction> {
    d: &'a mut SimGpuDriver<P>,
    steps: Vec<Step>,
    progress: &'a mut dyn FnMut(&str),
}

impl<P: PciFunction> StepTimer<'_, P> {
    fn step<T>(
        &mut self,
        name: &str,
        f: impl FnOnce(&mut SimGpuDriver<P>) -> Result<T, DriverError>,
    ) -> Result<(T, f64), WorkloadError> {
        (self.progress)(name);
        let t = Instant::now();
        let out = f(self.d).map_err(|error| WorkloadError::Driver { step: name.to_string(), error })?;
        let seconds = t.elapsed().as_secs_f64();
        self.steps.push(Step { name: name.to_string(), seconds });
        Ok((out, seconds))
    }
}

/// Runs the workload on an opened driver; `progress` hears each step's name as it starts.
pub fn run<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    size: WorkloadSize,
    progress: &mut dyn FnMut(&str),
) -> Result<WorkloadReport, WorkloadError> {
    let start = Instant::now();
    let mut r = StepTimer { d, steps: Vec::new(), progress };
    let n = size.vector_len;
    let bytes = size.copy_bytes;
    let data = pattern(bytes, 0x5eed);

    let name = format!("copy {} KiB host→VRAM", bytes >> 10);
    let (_, h2d) = r.step(&name, |d| d.memcpy_to_device(0x100_0000, &data))?;
    let mut back = vec![0u8; bytes];
    let name = format!("copy {} KiB VRAM→host", bytes >> 10);
    let (_, d2h) = r.step(&name, |d| d.memcpy_from_device(0x100_0000, &mut back))?;
    check(&name, &back, &data)?;

    let name = "FILL 256 KiB".to_string();
    r.step(&name, |d| d.launch(op::FILL, [0x80_0000, 256 << 10, 0xdead_beef, 0, 0], WaitMode::Poll))?;
    let mut f = vec![0u8; 256 << 10];
    r.step("read back the fill", |d| d.memcpy_from_device(0x80_0000, &mut f))?;
    let want: Vec<u8> = (0..f.len()).map(|i| 0xdead_beefu32.to_le_bytes()[i % 4]).collect();
    check(&name, &f, &want)?;

    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.25 - 7.0).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 37) as f32 * 1.5).collect();
    let (xa, ya, za) = (0x400_0000u64, 0x600_0000u64, 0x800_0000u64);
    r.step("upload vectors", |d| {
        d.memcpy_to_device(xa, &f32_bytes(&x))?;
        d.memcpy_to_device(ya, &f32_bytes(&y))
    })?;
    let name = format!("VADD {n} fp32 (fence by polling)");
    r.step(&name, |d| d.launch(op::VADD, [xa, ya, za, n as u64, 0], WaitMode::Poll))?;
    let (z, _) = r.step("read VADD result", |d| read_f32s(d, za, n))?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    check(&name, &z, &want)?;

    let alpha = 0.75f32;
    let name = format!("SAXPY {n} fp32 (fence by interrupt)");
    r.step(&name, |d| {
        d.launch(op::SAXPY, [xa, ya, n as u64, alpha.to_bits() as u64, 0], WaitMode::Interrupt)
    })?;
    let (y2, _) = r.step("read SAXPY result", |d| read_f32s(d, ya, n))?;
    let want: Vec<f32> = x.iter().zip(&y).map(|(a, b)| alpha * a + b).collect();
    check(&name, &y2, &want)?;

    let name = format!("REDUCE_SUM {n} fp32");
    r.step(&name, |d| d.launch(op::REDUCE_SUM, [xa, n as u64, za, 0, 0], WaitMode::Poll))?;
    let (s, _) = r.step("read REDUCE_SUM result", |d| read_f32s(d, za, 1))?;
    check(&name, &s, &[x.iter().sum::<f32>()])?;

    let m = size.matrix_dim.clamp(1, 256);
    let a: Vec<f32> = (0..m * m).map(|i| ((i % 97) as f32 - 48.0) / 16.0).collect();
    let b: Vec<f32> = (0..m * m).map(|i| ((i % 89) as f32 - 44.0) / 8.0).collect();
    let (aa, ba, ca) = (0xa00_0000u64, 0xa10_0000u64, 0xa20_0000u64);
    r.step("upload matrices", |d| {
        d.memcpy_to_device(aa, &f32_bytes(&a))?;
        d.memcpy_to_device(ba, &f32_bytes(&b))
    })?;
    let name = format!("MATMUL {m}x{m}x{m} fp32");
    let dims = m as u64 | (m as u64) << 16 | (m as u64) << 32;
    r.step(&name, |d| d.launch(op::MATMUL, [aa, ba, ca, dims, 0], WaitMode::Poll))?;
    let (c, _) = r.step("read MATMUL result", |d| read_f32s(d, ca, m * m))?;
    let mut want = vec![0f32; m * m];
    for i in 0..m {
        for j in 0..m {
            want[i * m + j] = (0..m).map(|p| a[i * m + p] * b[p * m + j]).sum();
        }
    }
    check(&name, &c, &want)?;

    let fences = size.fences;
    let name = format!("{fences} fences waited by interrupt");
    r.step(&name, |d| {
        for _ in 0..fences {
            d.launch(op::NOP, [0; 5], WaitMode::Interrupt)?;
        }
        Ok(())
    })?;

    Ok(WorkloadReport {
        steps: r.steps,
        h2d: (bytes, h2d),
        d2h: (bytes, d2h),
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// A duration as a human reads it.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

/// Times `n` reads of the ID register (after a warm-up of `n / 10`): p50 and p99.
pub fn mmio_read_rtt<P: PciFunction>(d: &mut SimGpuDriver<P>, n: usize) -> (Duration, Duration) {
    for _ in 0..n / 10 {
        d.read_reg(reg::ID);
    }
    let mut v: Vec<Duration> = (0..n.max(1))
        .map(|_| {
            let t = Instant::now();
            d.read_reg(reg::ID);
            t.elapsed()
        })
        .collect();
    v.sort();
    let at = |p: f64| v[(((v.len() - 1) as f64) * p).round() as usize];
    (at(0.5), at(0.99))
}

/// Times `n` fences with nothing queued before them (after a warm-up of `n / 10`), waited
/// for by polling their word in host memory: the publish (RING_TAIL and doorbell writes),
/// the device's command fetch, the fence's write back and the host seeing it — a launch's
/// way to the device and its result's way back. The median.
pub fn fence_rtt<P: PciFunction>(d: &mut SimGpuDriver<P>, n: usize) -> Result<Duration, DriverError> {
    for _ in 0..n / 10 {
        d.sync(WaitMode::Poll)?;
    }
    let mut v = Vec::with_capacity(n.max(1));
    for _ in 0..n.max(1) {
        let t = Instant::now();
        d.sync(WaitMode::Poll)?;
        v.push(t.elapsed());
    }
    v.sort();
    Ok(v[v.len() / 2])
}
