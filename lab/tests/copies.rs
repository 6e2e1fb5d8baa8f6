//! The replay's copies each move bytes of their own, and its verification reads them back
//! where they landed, each way: a hand-made trace's copies all checked, and a platform that
//! corrupts host memory (what the device reads, or what the host reads back) refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use driver::{BusAddr, DmaBuf, PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::plan::Plan;
use lab::replay::{ReplayError, ReplayRun, Replayer};
use lab::trace::{Pick, Trace, parse};
use serde_json::{Value, json};
use testbed::concurrent::ConcurrentAttach;

const T0: u64 = 1_700_000_000_000_000;

/// A platform that flips a byte of what the host writes to, or reads from, its own memory:
/// of writes of at least `writes_from` bytes, of reads of exactly `reads_of`; and whose
/// device's count of bytes copied to host memory falls `short` behind at each reading (as a
/// device that moved less than it was asked would).
struct Corrupting<P> {
    inner: P,
    writes_from: usize,
    reads_of: usize,
    short: u64,
    counted: u64,
}

impl<P: PciFunction> PciFunction for Corrupting<P> {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.inner.config_read(offset)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        self.inner.config_write(offset, value)
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        let v = self.inner.mmio_read(addr, len);
        if addr.0 % simgpu_abi::BAR0_SIZE == simgpu_abi::reg::COPIED_TO_HOST {
            self.counted += 1;
            return v.saturating_sub(self.short * self.counted);
        }
        v
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.inner.mmio_write(addr, len, value)
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.inner.dma_alloc(len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.inner.dma_read(buf, offset, out);
        if out.len() == self.reads_of {
            out[out.len() / 2] ^= 0x40;
        }
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        if data.len() >= self.writes_from {
            let mut bad = data.to_vec();
            for b in bad.iter_mut().step_by(4096) {
                *b ^= 0x40;
            }
            self.inner.dma_write(buf, offset, &bad);
        } else {
            self.inner.dma_write(buf, offset, data);
        }
    }
    fn msi_message(&mut self, vector: u16) -> (u64, u32) {
        self.inner.msi_message(vector)
    }
    fn serve_for(&mut self, budget: Duration) -> bool {
        self.inner.serve_for(budget)
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        self.inner.wait_interrupt(vector, timeout)
    }
    fn removed(&self) -> Option<String> {
        self.inner.removed()
    }
    fn progress(&self) -> u64 {
        self.inner.progress()
    }
}

fn device(
    writes_from: usize,
    reads_of: usize,
    short: u64,
) -> SimGpuDriver<Corrupting<ConcurrentAttach<SimGpu>>> {
    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    let inner = ConcurrentAttach::new(dev, 256 << 20).unwrap();
    SimGpuDriver::open(Corrupting { inner, writes_from, reads_of, short, counted: 0 }).unwrap()
}

fn replay(plan: &Plan, writes_from: usize, reads_of: usize, runs: usize) -> Result<ReplayRun, ReplayError> {
    replay_short(plan, (writes_from, reads_of, 0), runs)
}

fn replay_short(
    plan: &Plan,
    (writes_from, reads_of, short): (usize, usize, u64),
    runs: usize,
) -> Result<ReplayRun, ReplayError> {
    let mut d = device(writes_from, reads_of, short);
    let mut r = Replayer::new(&mut d, plan)?;
    let mut last = r.run(&mut d, plan);
    for _ in 1..runs {
        last = r.run(&mut d, plan);
    }
    last
}

/// A launch-free job of copies: `ins` copies in on streams 7 and 13 in turn, then `outs`
/// copies out (pinned, each waited for by a stream synchronization; pageable, synchronous).
fn copies(ins: &[u64], outs: &[u64]) -> Trace {
    let mut e: Vec<Value> = Vec::new();
    let mut t = 0;
    for (i, &bytes) in ins.iter().chain(outs).enumerate() {
        let corr = i as u64 + 1;
        let inward = i < ins.len();
        let (name, stream) = if inward {
            ("Memcpy HtoD (Pinned -> Device)", if i % 2 == 0 { 7 } else { 13 })
        } else if i % 2 == 0 {
            ("Memcpy DtoH (Device -> Pinned)", 7)
        } else {
            ("Memcpy DtoH (Device -> Pageable)", 7)
        };
        e.push(json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 1, "tid": 1,
                      "ts": T0 + t, "dur": 5, "args": {"correlation": corr}}));
        e.push(json!({"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": stream, "ts": T0 + t + 4,
                      "dur": 100, "args": {"correlation": corr, "stream": stream, "device": 0, "bytes": bytes}}));
        if !inward {
            e.push(
                json!({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1,
                          "ts": T0 + t + 10, "dur": 100, "args": {"correlation": 1000 + corr}}),
            );
        }
        t += 200;
    }
    parse(json!({ "traceEvents": e }).to_string().as_bytes(), "copies", Pick::ANY).unwrap()
}

#[test]
fn every_copy_in_and_each_copy_out_waited_for_is_read_back_its_own() {
    let ins = [1 << 20, 3 << 20, 4096, 100, 2 << 20, 1 << 20];
    let outs = [1 << 20, 64 << 10, 5000, 1 << 20];
    let plan = Plan::of(&copies(&ins, &outs));
    // Three runs: each run's copies read other bytes than the run before's.
    let run = replay(&plan, usize::MAX, usize::MAX, 3).unwrap();
    assert_eq!(run.copies_made, (ins.len(), outs.len()));
    assert_eq!(run.copies_checked, (ins.len(), outs.len()), "{run:?}");
    // The device's own count of the bytes its copy engines moved, each way.
    assert_eq!(run.bytes_copied, (ins.iter().sum::<u64>(), outs.iter().sum::<u64>()));
}

#[test]
fn a_device_that_moved_fewer_bytes_than_the_copies_is_refused() {
    let plan = Plan::of(&copies(&[1 << 20], &[1 << 20, 4096]));
    match replay_short(&plan, (usize::MAX, usize::MAX, 4096), 1) {
        Err(ReplayError::Verification(why)) => assert!(
            why.contains("copy engines moved 1048576 bytes to VRAM")
                && why.contains("the run's copies are 1048576 and 1052672"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_copy_in_whose_source_was_corrupted_is_refused() {
    let plan = Plan::of(&copies(&[1 << 20, 2 << 20], &[]));
    // The pattern copies in read from, written once at setup, corrupted on its way.
    match replay(&plan, 1 << 20, usize::MAX, 1) {
        Err(ReplayError::Verification(why)) => {
            assert!(why.contains("copy in") && why.contains("are not its own"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_copy_out_read_back_corrupted_is_refused() {
    let plan = Plan::of(&copies(&[], &[1 << 20, 1 << 20]));
    match replay(&plan, usize::MAX, 4096, 1) {
        Err(ReplayError::Verification(why)) => {
            assert!(why.contains("copy out") && why.contains("are not its own"), "{why}")
        }
        other => panic!("{other:?}"),
    }
}
