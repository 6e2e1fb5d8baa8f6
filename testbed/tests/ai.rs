//! The AI-shaped workloads (`testbed::ai`) on a directly attached simgpu, each verified
//! against its CPU reference (their transaction profiles are `lab/tests/profile.rs`'s).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use testbed::ai::{DataLoadingSize, InferenceSize, TrainingSize};
use testbed::direct::DirectAttach;
use testbed::workload::{Workload, WorkloadError};
use tlp::Bdf;

fn open() -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(DirectAttach::new(dev, 128 << 20)).unwrap()
}

#[test]
fn every_workload_is_verified_and_runs_again_on_the_same_driver() {
    let mut d = open();
    for name in Workload::NAMES {
        let w = Workload::named(name, 1).unwrap();
        for _ in 0..2 {
            let r = w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!r.steps.is_empty() && r.seconds > 0.0, "{name}: {r:?}");
        }
    }
    assert!(Workload::named("mining", 1).is_none());
}

#[test]
fn other_shapes_are_verified_too() {
    let mut d = open();
    let shapes = [
        Workload::Inference(InferenceSize { batch: 1, layers: 1, dim: 8, requests: 3 }),
        Workload::Inference(InferenceSize { batch: 7, layers: 5, dim: 33, requests: 2 }),
        Workload::Training(TrainingSize {
            batch: 5,
            dim: 9,
            micro_batches: 3,
            steps: 7,
            loss_every: 3,
            checkpoint_every: 2,
        }),
        Workload::Training(TrainingSize {
            batch: 16,
            dim: 16,
            micro_batches: 1,
            steps: 3,
            loss_every: 1,
            checkpoint_every: 5,
        }),
        Workload::DataLoading(DataLoadingSize { batch_bytes: 4096, batches: 1 }),
        Workload::DataLoading(DataLoadingSize { batch_bytes: 12 << 10, batches: 5 }),
    ];
    for w in shapes {
        w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{w:?}: {e}"));
    }
}

#[test]
fn sizes_out_of_range_are_refused_naming_the_workload() {
    let mut d = open();
    let bad = [
        Workload::Inference(InferenceSize { batch: 0, layers: 1, dim: 8, requests: 1 }),
        Workload::Inference(InferenceSize { batch: 1, layers: 33, dim: 8, requests: 1 }),
        Workload::Inference(InferenceSize { batch: 1, layers: 1, dim: 257, requests: 1 }),
        Workload::Training(TrainingSize {
            batch: 4,
            dim: 4,
            micro_batches: 5,
            steps: 1,
            loss_every: 1,
            checkpoint_every: 1,
        }),
        Workload::Training(TrainingSize {
            batch: 4,
            dim: 4,
            micro_batches: 1,
            steps: 1,
            loss_every: 0,
            checkpoint_every: 1,
        }),
        Workload::DataLoading(DataLoadingSize { batch_bytes: 4094, batches: 1 }),
        Workload::DataLoading(DataLoadingSize { batch_bytes: 17 << 20, batches: 1 }),
        Workload::DataLoading(DataLoadingSize { batch_bytes: 4096, batches: 0 }),
    ];
    for w in bad {
        match w.run(&mut d, &mut |_| {}) {
            Err(WorkloadError::Driver { step, .. }) => assert_eq!(step, w.name(), "{w:?}"),
            other => panic!("{w:?}: {other:?}"),
        }
    }
}

/// A simgpu whose writes into host memory of 256 bytes or more have one byte flipped from
/// the `after`-th on: a device (or a path) that corrupts data the workloads read back.
struct Corrupting {
    inner: SimGpu,
    after: usize,
    seen: usize,
    /// The flipped payload lent with the TLP last taken.
    bad: Vec<u8>,
}

impl hw::Device for Corrupting {
    fn id(&self) -> Bdf {
        self.inner.id()
    }
    fn max_payload(&self) -> u32 {
        self.inner.max_payload()
    }
    fn request(&mut self, t: &tlp::TlpRepr<'_>) {
        self.inner.request(t)
    }
    fn completion(&mut self, t: &tlp::TlpRepr<'_>) {
        self.inner.completion(t)
    }
    fn poll(&mut self) -> bool {
        self.inner.poll()
    }
    fn upstream(&mut self) -> Option<tlp::TlpRepr<'_>> {
        let t = self.inner.upstream()?;
        if let tlp::Body::MemWrite { data, .. } = t.body
            && data.len() >= 256
        {
            self.seen += 1;
            if self.seen > self.after {
                self.bad.clear();
                self.bad.extend_from_slice(data);
                self.bad[100] ^= 0x40;
                return Some(t.with_data(&self.bad));
            }
        }
        Some(t)
    }
    fn reset(&mut self) {
        self.inner.reset()
    }
}

#[test]
fn a_corrupted_result_fails_every_workload_naming_where() {
    for name in Workload::NAMES {
        let dev = Corrupting {
            inner: SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default()),
            after: 0,
            seen: 0,
            bad: Vec::new(),
        };
        let mut d = SimGpuDriver::open(DirectAttach::new(dev, 128 << 20)).unwrap();
        match Workload::named(name, 1).unwrap().run(&mut d, &mut |_| {}) {
            Err(e @ WorkloadError::Mismatch { .. }) => {
                let said = e.to_string();
                assert!(said.contains("differs from the CPU reference at element"), "{name}: {said}");
            }
            other => panic!("{name}: a corrupted result must be caught, got {other:?}"),
        }
    }
}
