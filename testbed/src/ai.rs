//! Workloads shaped like AI work on a GPU, driven as a GPU stack drives one: copies and
//! kernels queued in the command ring in host memory (fetched by the device's DMA),
//! published with one doorbell, completion fences written by the device into host memory
//! and watched there, interrupts for blocking waits, bulk copies by the device's DMA engine
//! from and into pinned host buffers, and data resident in VRAM between steps. Each result
//! is compared with a CPU reference computed the same way (the same fp32 operations in the
//! same order), after the timed part. docs/performance-model.md says how each maps to a
//! real workload.
#![forbid(unsafe_code)]

use std::time::Instant;

use crate::outcome::{Step, WorkloadError, WorkloadReport, check};
use crate::suite::f32_bytes;
use driver::{Command, DmaBuf, DriverError, PciFunction, SimGpuDriver, WaitMode};
use simgpu_abi::op;

/// `inference`: weights uploaded once; per request a small input copy, a chain of
/// `layers` × (MATMUL, VADD bias), a small output copy and one fence waited by interrupt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InferenceSize {
    /// Rows of each request's input (1..=256).
    pub batch: usize,
    /// Layers in the chain (1..=32): two kernels each.
    pub layers: usize,
    /// Width of each layer (1..=256).
    pub dim: usize,
    /// Requests served.
    pub requests: usize,
}

/// `training`: per step, for each micro-batch a forward MATMUL, the residual (VADD) and a
/// backward MATMUL for the gradient; the gradients reduced (VADD); an optimizer update
/// (SAXPY); the loss read back every `loss_every` steps and the weights copied to the host
/// every `checkpoint_every`. The host runs ahead as a framework does: a step's commands
/// are published without waiting, and a polled fence is waited on only where the host reads
/// what the device wrote (a loss or a checkpoint) and after the last step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainingSize {
    /// Rows of each micro-batch (1..=256).
    pub batch: usize,
    /// The model's width: weights dim × dim (1..=256).
    pub dim: usize,
    /// Micro-batches per step, their gradients reduced (1..=4).
    pub micro_batches: usize,
    /// Optimizer steps.
    pub steps: usize,
    /// Loss read back every this many steps (≥ 1).
    pub loss_every: usize,
    /// Weights checkpointed to the host every this many steps (≥ 1).
    pub checkpoint_every: usize,
}

/// `data-loading`: `batches` batches of `batch_bytes` streamed host → device through two
/// pinned buffers, the host copying the next batch out of its dataset while the device
/// takes the last; each batch summed (REDUCE_SUM) and accumulated (SAXPY) on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataLoadingSize {
    /// Bytes per batch (a multiple of 4, 4 KiB..=16 MiB).
    pub batch_bytes: usize,
    /// Batches streamed.
    pub batches: usize,
}

impl InferenceSize {
    /// `4 · scale` requests of batch 16 through 4 layers of width 256.
    pub fn scaled(scale: u32) -> InferenceSize {
        InferenceSize { batch: 16, layers: 4, dim: 256, requests: 4 * scale.clamp(1, 32) as usize }
    }
}

impl TrainingSize {
    /// `4 · scale` steps of two micro-batches of 64 rows on a 128-wide model, the loss every
    /// 2 steps, a checkpoint every 4.
    pub fn scaled(scale: u32) -> TrainingSize {
        TrainingSize {
            batch: 64,
            dim: 128,
            micro_batches: 2,
            steps: 4 * scale.clamp(1, 32) as usize,
            loss_every: 2,
            checkpoint_every: 4,
        }
    }
}

impl DataLoadingSize {
    /// `2 · scale` batches of 2 MiB.
    pub fn scaled(scale: u32) -> DataLoadingSize {
        DataLoadingSize { batch_bytes: 2 << 20, batches: 2 * scale.clamp(1, 32) as usize }
    }
}

fn bad(step: &str, what: &'static str) -> WorkloadError {
    WorkloadError::Driver { step: step.to_string(), error: DriverError::Unusable(what) }
}

fn driver_err(step: &str) -> impl Fn(DriverError) -> WorkloadError + '_ {
    move |error| WorkloadError::Driver { step: step.to_string(), error }
}

fn cmd(opcode: u32, a: u64, b: u64, c: u64, d: u64) -> Command {
    Command { opcode, args: [a, b, c, d, 0] }
}

/// MATMUL's packed dimensions: C(m×n) = A(m×k)·B(k×n).
fn dims(m: usize, n: usize, k: usize) -> u64 {
    m as u64 | (n as u64) << 16 | (k as u64) << 32
}

/// C(m×n) = A(m×k)·B(k×n), as the device computes it (each element a sequential sum).
pub fn matmul(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0f32; a.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = a[i * cols + j];
        }
    }
    t
}

fn add(x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(p, q)| p + q).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Deterministic values in about ±`scale`.
fn values(n: usize, seed: u32, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32).wrapping_add(seed).wrapping_mul(2_654_435_761) >> 16;
            ((h % 2001) as f32 - 1000.0) / 1000.0 * scale
        })
        .collect()
}

/// A timed step.
fn timed<T>(
    steps: &mut Vec<Step>,
    progress: &mut dyn FnMut(&str),
    name: String,
    f: impl FnOnce() -> Result<T, WorkloadError>,
) -> Result<(T, f64), WorkloadError> {
    progress(&name);
    let t = Instant::now();
    let out = f()?;
    let seconds = t.elapsed().as_secs_f64();
    steps.push(Step { name, seconds });
    Ok((out, seconds))
}

fn read_pinned<P: PciFunction>(d: &mut SimGpuDriver<P>, buf: &DmaBuf, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    d.pci().dma_read(buf, 0, &mut out);
    out
}

const INF_WEIGHTS: u64 = 0x100_0000;
const INF_BIASES: u64 = 0x200_0000;
const INF_ACT: [u64; 2] = [0x300_0000, 0x310_0000];
const INF_TMP: u64 = 0x320_0000;

/// Runs `inference` on an opened driver.
pub fn inference<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    s: InferenceSize,
    progress: &mut dyn FnMut(&str),
) -> Result<WorkloadReport, WorkloadError> {
    let (b, l, w) = (s.batch, s.layers, s.dim);
    if !(1..=256).contains(&b) || !(1..=32).contains(&l) || !(1..=256).contains(&w) {
        return Err(bad("inference", "batch and width 1..=256, layers 1..=32"));
    }
    let start = Instant::now();
    let mut steps = Vec::new();
    let weights: Vec<Vec<f32>> = (0..l).map(|i| values(w * w, 101 + i as u32, 1.0 / w as f32)).collect();
    let biases: Vec<Vec<f32>> = (0..l).map(|i| values(w, 202 + i as u32, 0.1)).collect();
    // Each bias broadcast over the batch's rows, as VADD takes it.
    let broadcast: Vec<Vec<f32>> = biases.iter().map(|v| v.repeat(b)).collect();
    let name = format!("upload weights ({l} layers of {w}x{w} fp32)");
    let up_bytes = l * (w * w + b * w) * 4;
    let (_, up_s) = timed(&mut steps, progress, name.clone(), || {
        // Each tensor staged and its copy queued, one wait for all (as training's upload).
        for i in 0..l {
            let (wa, ba) = (INF_WEIGHTS + (i * w * w * 4) as u64, INF_BIASES + (i * b * w * 4) as u64);
            d.memcpy_to_device_async(wa, &f32_bytes(&weights[i])).map_err(driver_err(&name))?;
            d.memcpy_to_device_async(ba, &f32_bytes(&broadcast[i])).map_err(driver_err(&name))?;
        }
        d.sync(WaitMode::Poll).map_err(driver_err(&name))
    })?;
    let io = b * w * 4;
    let inputs: Vec<Vec<f32>> = (0..s.requests).map(|r| values(b * w, 303 + r as u32, 1.0)).collect();
    let name = format!("{} requests: batch {b}, {l} layers (MATMUL + VADD), fence by interrupt", s.requests);
    let (outputs, _) = timed(&mut steps, progress, name.clone(), || {
        let e = driver_err(&name);
        d.with_pinned([io, io], &e, |d, [inb, outb]| {
            let mut outputs = Vec::with_capacity(s.requests);
            for x in &inputs {
                d.pci().dma_write(inb, 0, &f32_bytes(x));
                d.enqueue(cmd(op::COPY_H2V, inb.bus.get(), INF_ACT[0], io as u64, 0)).map_err(&e)?;
                for i in 0..l {
                    let (from, to) = (INF_ACT[i % 2], INF_ACT[(i + 1) % 2]);
                    let wa = INF_WEIGHTS + (i * w * w * 4) as u64;
                    d.enqueue(cmd(op::MATMUL, from, wa, INF_TMP, dims(b, w, w))).map_err(&e)?;
                    let ba = INF_BIASES + (i * b * w * 4) as u64;
                    d.enqueue(cmd(op::VADD, INF_TMP, ba, to, (b * w) as u64)).map_err(&e)?;
                }
                d.enqueue(cmd(op::COPY_V2H, INF_ACT[l % 2], outb.bus.get(), io as u64, 0)).map_err(&e)?;
                d.sync(WaitMode::Interrupt).map_err(&e)?;
                outputs.push(f32s(&read_pinned(d, outb, io)));
            }
            Ok(outputs)
        })
    })?;
    let seconds = start.elapsed().as_secs_f64();
    for (r, (x, got)) in inputs.iter().zip(&outputs).enumerate() {
        let mut a = x.clone();
        for i in 0..l {
            a = add(&matmul(&a, &weights[i], b, w, w), &broadcast[i]);
        }
        check(&format!("request {r}"), got, &a)?;
    }
    Ok(WorkloadReport { steps, h2d: (up_bytes, up_s), d2h: (0, 0.0), seconds })
}

const TR_WEIGHTS: u64 = 0x100_0000;
/// Each data batch's X, Xᵀ and −Y, 2 MiB apart.
const TR_DATA: u64 = 0x200_0000;
const TR_P: u64 = 0x600_0000;
const TR_E: u64 = 0x640_0000;
const TR_G: u64 = 0x680_0000;
const TR_GSUM: u64 = 0x6c0_0000;
const TR_LOSS: u64 = 0x6d0_0000;
/// Data batches cycled through.
const TR_BATCHES: usize = 2;
const TR_LR: f32 = 1e-4;

/// Runs `training` on an opened driver.
pub fn training<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    s: TrainingSize,
    progress: &mut dyn FnMut(&str),
) -> Result<WorkloadReport, WorkloadError> {
    let (b, w, mb) = (s.batch, s.dim, s.micro_batches);
    if !(1..=256).contains(&b)
        || !(1..=256).contains(&w)
        || !(1..=4).contains(&mb)
        || s.loss_every == 0
        || s.checkpoint_every == 0
    {
        return Err(bad("training", "batch and width 1..=256, micro-batches 1..=4, intervals ≥ 1"));
    }
    let start = Instant::now();
    let mut steps = Vec::new();
    let w0 = values(w * w, 7, 0.01);
    // Micro-batch j of data batch k: X (b×w), Xᵀ, and −Y (the targets, negated for VADD).
    let data: Vec<[Vec<f32>; 3]> = (0..TR_BATCHES * mb)
        .map(|i| {
            let x = values(b * w, 1000 + i as u32, 1.0);
            let xt = transpose(&x, b, w);
            [x, xt, values(b * w, 2000 + i as u32, 1.0).iter().map(|v| -v).collect()]
        })
        .collect();
    let at = |i: usize, part: u64| TR_DATA + (i as u64) * 0x20_0000 + part * 0x8_0000;
    let name = format!("upload weights and {} micro-batches ({b}x{w} fp32)", data.len());
    let up_bytes = (w * w + data.len() * 3 * b * w) * 4;
    let (_, up_s) = timed(&mut steps, progress, name.clone(), || {
        let e = driver_err(&name);
        // Each tensor staged and its copy queued, one wait for all (a framework's
        // non-blocking copies, then a synchronize).
        d.memcpy_to_device_async(TR_WEIGHTS, &f32_bytes(&w0)).map_err(&e)?;
        for (i, parts) in data.iter().enumerate() {
            for (p, v) in parts.iter().enumerate() {
                d.memcpy_to_device_async(at(i, p as u64), &f32_bytes(v)).map_err(&e)?;
            }
        }
        d.sync(WaitMode::Poll).map_err(&e)
    })?;
    let name = format!(
        "{} steps: {mb} x (forward, backward MATMUL), reduce, SAXPY; loss every {}, checkpoint every {}",
        s.steps, s.loss_every, s.checkpoint_every
    );
    let (wbytes, mw) = (w * w * 4, (b * w) as u64);
    let ((losses, checkpoints), _) = timed(&mut steps, progress, name.clone(), || {
        let e = driver_err(&name);
        d.with_pinned([4, wbytes], &e, |d, [lossb, ckptb]| {
            let (mut losses, mut checkpoints) = (Vec::new(), Vec::new());
            for step in 0..s.steps {
                let k = step % TR_BATCHES;
                for j in 0..mb {
                    let i = k * mb + j;
                    let (p, ee, g) = (
                        TR_P + j as u64 * 0x10_0000,
                        TR_E + j as u64 * 0x10_0000,
                        TR_G + j as u64 * 0x10_0000,
                    );
                    d.enqueue(cmd(op::MATMUL, at(i, 0), TR_WEIGHTS, p, dims(b, w, w))).map_err(&e)?;
                    d.enqueue(cmd(op::VADD, p, at(i, 2), ee, mw)).map_err(&e)?;
                    d.enqueue(cmd(op::MATMUL, at(i, 1), ee, g, dims(w, w, b))).map_err(&e)?;
                }
                // The reduction of the micro-batches' gradients, in order.
                let mut sum = TR_G;
                for j in 1..mb {
                    d.enqueue(cmd(op::VADD, sum, TR_G + j as u64 * 0x10_0000, TR_GSUM, (w * w) as u64))
                        .map_err(&e)?;
                    sum = TR_GSUM;
                }
                d.enqueue(cmd(op::SAXPY, sum, TR_WEIGHTS, (w * w) as u64, (-TR_LR).to_bits() as u64))
                    .map_err(&e)?;
                let (loss, ckpt) = ((step + 1) % s.loss_every == 0, (step + 1) % s.checkpoint_every == 0);
                if loss {
                    d.enqueue(cmd(op::REDUCE_SUM, TR_E, mw, TR_LOSS, 0)).map_err(&e)?;
                    d.enqueue(cmd(op::COPY_V2H, TR_LOSS, lossb.bus.get(), 4, 0)).map_err(&e)?;
                }
                if ckpt {
                    d.enqueue(cmd(op::COPY_V2H, TR_WEIGHTS, ckptb.bus.get(), wbytes as u64, 0))
                        .map_err(&e)?;
                }
                if !(loss || ckpt || step + 1 == s.steps) {
                    // Nothing of this step is read here: the next step's commands go behind it.
                    d.flush();
                    continue;
                }
                d.sync(WaitMode::Poll).map_err(&e)?;
                if loss {
                    losses.push(f32s(&read_pinned(d, lossb, 4))[0]);
                }
                if ckpt {
                    checkpoints.push(f32s(&read_pinned(d, ckptb, wbytes)));
                }
            }
            Ok((losses, checkpoints))
        })
    })?;
    let mut wf = vec![0u8; wbytes];
    let name = "read back the weights".to_string();
    timed(&mut steps, progress, name.clone(), || {
        d.memcpy_from_device(TR_WEIGHTS, &mut wf).map_err(driver_err(&name))
    })?;
    let seconds = start.elapsed().as_secs_f64();
    // The CPU's run of the same steps.
    let (wr, want_losses, want_ckpts) = training_reference(&s, w0, &data);
    check("loss", &losses, &want_losses)?;
    for (i, (got, want)) in checkpoints.iter().zip(&want_ckpts).enumerate() {
        check(&format!("checkpoint {i}"), got, want)?;
    }
    check("checkpoints", &[checkpoints.len()], &[want_ckpts.len()])?;
    check("final weights", &f32s(&wf), &wr)?;
    Ok(WorkloadReport { steps, h2d: (up_bytes, up_s), d2h: (0, 0.0), seconds })
}

/// The CPU's run of `training`'s steps, the same fp32 operations in the same order: the
/// final weights, the losses and the checkpoints the device's run must match.
fn training_reference(
    s: &TrainingSize,
    w0: Vec<f32>,
    data: &[[Vec<f32>; 3]],
) -> (Vec<f32>, Vec<f32>, Vec<Vec<f32>>) {
    let (b, w, mb) = (s.batch, s.dim, s.micro_batches);
    let (mut wr, mut want_losses, mut want_ckpts) = (w0, Vec::new(), Vec::new());
    for step in 0..s.steps {
        let k = step % TR_BATCHES;
        let (mut grads, mut first_e) = (Vec::new(), Vec::new());
        for j in 0..mb {
            let [x, xt, neg_y] = &data[k * mb + j];
            let e = add(&matmul(x, &wr, b, w, w), neg_y);
            grads.push(matmul(xt, &e, w, w, b));
            if j == 0 {
                first_e = e;
            }
        }
        let mut g = grads[0].clone();
        for gj in &grads[1..] {
            g = add(&g, gj);
        }
        wr = g.iter().zip(&wr).map(|(gv, wv)| -TR_LR * gv + wv).collect();
        if (step + 1) % s.loss_every == 0 {
            want_losses.push(first_e.iter().sum::<f32>());
        }
        if (step + 1) % s.checkpoint_every == 0 {
            want_ckpts.push(wr.clone());
        }
    }
    (wr, want_losses, want_ckpts)
}

const DL_SLOTS: [u64; 2] = [0x100_0000, 0x200_0000];
const DL_ACC: u64 = 0x300_0000;
const DL_SUMS: u64 = 0x400_0000;

/// Runs `data-loading` on an opened driver.
pub fn data_loading<P: PciFunction>(
    d: &mut SimGpuDriver<P>,
    s: DataLoadingSize,
    progress: &mut dyn FnMut(&str),
) -> Result<WorkloadReport, WorkloadError> {
    let bytes = s.batch_bytes;
    if !(4096..=16 << 20).contains(&bytes) || !bytes.is_multiple_of(4) || !(1..=1024).contains(&s.batches) {
        return Err(bad("data-loading", "batches of 4 KiB..=16 MiB, a multiple of 4; 1..=1024 of them"));
    }
    let start = Instant::now();
    let mut steps = Vec::new();
    let n = bytes / 4;
    // The dataset, in host memory before the stream starts (a page cache, a decoded shard).
    let dataset: Vec<Vec<u8>> = (0..s.batches).map(|i| f32_bytes(&values(n, 50 + i as u32, 1.0))).collect();
    let alpha = 1.0 / s.batches as f32;
    let name = format!(
        "stream {} batches of {} KiB host→VRAM, two pinned buffers, each summed and accumulated",
        s.batches,
        bytes >> 10
    );
    let (_, stream_s) = timed(&mut steps, progress, name.clone(), || {
        let e = driver_err(&name);
        d.with_pinned([bytes, bytes], &e, |d, bufs| {
            d.enqueue(cmd(op::FILL, DL_ACC, bytes as u64, 0, 0)).map_err(&e)?;
            let mut fences = Vec::with_capacity(s.batches);
            for (i, batch) in dataset.iter().enumerate() {
                // The buffer batch i − 2 was copied from is free once its fence is in.
                if i >= 2 {
                    d.wait(fences[i - 2], WaitMode::Poll).map_err(&e)?;
                }
                let (buf, slot) = (&bufs[i % 2], DL_SLOTS[i % 2]);
                d.pci().dma_write(buf, 0, batch);
                d.enqueue(cmd(op::COPY_H2V, buf.bus.get(), slot, bytes as u64, 0)).map_err(&e)?;
                d.enqueue(cmd(op::REDUCE_SUM, slot, n as u64, DL_SUMS + 4 * i as u64, 0)).map_err(&e)?;
                d.enqueue(cmd(op::SAXPY, slot, DL_ACC, n as u64, alpha.to_bits() as u64)).map_err(&e)?;
                fences.push(d.fence(WaitMode::Poll).map_err(&e)?);
            }
            for f in fences.iter().skip(s.batches.saturating_sub(2)) {
                d.wait(*f, WaitMode::Poll).map_err(&e)?;
            }
            Ok(())
        })
    })?;
    let name = "read back the sums and the accumulator".to_string();
    let ((sums, acc), _) = timed(&mut steps, progress, name.clone(), || {
        let e = driver_err(&name);
        let mut sums = vec![0u8; 4 * s.batches];
        d.memcpy_from_device(DL_SUMS, &mut sums).map_err(&e)?;
        let mut acc = vec![0u8; bytes];
        d.memcpy_from_device(DL_ACC, &mut acc).map_err(&e)?;
        Ok((f32s(&sums), f32s(&acc)))
    })?;
    let seconds = start.elapsed().as_secs_f64();
    let mut want_acc = vec![0f32; n];
    let mut want_sums = Vec::new();
    for batch in &dataset {
        let x = f32s(batch);
        want_sums.push(x.iter().sum::<f32>());
        want_acc = x.iter().zip(&want_acc).map(|(p, q)| alpha * p + q).collect();
    }
    check("batch sums", &sums, &want_sums)?;
    check("accumulator", &acc, &want_acc)?;
    Ok(WorkloadReport { steps, h2d: (bytes * s.batches, stream_s), d2h: (0, 0.0), seconds })
}
