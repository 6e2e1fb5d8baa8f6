//! The transaction profile the platform and the driver count for the performance model
//! (`lab::model`), on the AI-shaped workloads (`testbed::ai`) directly attached: its counts
//! follow from what each workload does, and a copy's window of reads counts once, not once
//! per read.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{Command, SimGpuDriver, WaitMode};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::model::Profile;
use simgpu_abi::op;
use testbed::ai::{DataLoadingSize, InferenceSize, TrainingSize};
use testbed::direct::DirectAttach;
use testbed::workload::Workload;
use tlp::Bdf;

fn open() -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(DirectAttach::new(dev, 128 << 20)).unwrap()
}

/// Runs `w` once and counts its profile.
fn profiled(d: &mut SimGpuDriver<DirectAttach<SimGpu>>, w: Workload) -> Profile {
    let before = (d.pci().counts(), d.stats());
    w.run(d, &mut |_| {}).unwrap_or_else(|e| panic!("{}: {e}", w.name()));
    Profile::from_counts(d.pci().counts().since(&before.0), d.stats().since(&before.1))
}

#[test]
fn inference_profile_counts_what_each_request_does() {
    let mut d = open();
    let s = InferenceSize { batch: 4, layers: 3, dim: 32, requests: 5 };
    let p = profiled(&mut d, Workload::Inference(s));
    let io = (s.batch * s.dim * 4) as u64;
    // Two copies per layer to upload, queued together, one wait for them; one fence per
    // request.
    let copies = 2 * s.layers as u64;
    let waits = 1 + s.requests as u64;
    assert_eq!(p.waits(), waits, "{p:?}");
    assert_eq!(p.driver.waits_idle, waits, "every wait is for the last fence: {p:?}");
    // Each copy published as it is queued, then the upload's fence, then each request's.
    let doorbells = copies + waits;
    assert_eq!(p.driver.doorbells, doorbells);
    assert_eq!(p.platform.interrupts, s.requests as u64);
    assert_eq!(p.platform.register_reads, 0, "no register read per wait: {p:?}");
    // Doorbell: RING_TAIL and DOORBELL.
    assert_eq!(p.platform.register_writes, 2 * doorbells);
    // Each request's output, and one 8-byte fence per wait.
    assert_eq!(p.platform.device_write_bytes, s.requests as u64 * io + 8 * waits);
    // The upload: a fetch per doorbell (each copy's and the fence's), the copies taken back
    // to back, and the fence's wait for their bytes. Each request: its fetch and the first
    // kernel's wait for the input copy's bytes (the output is written, not read).
    assert_eq!(p.platform.dependent_reads, copies + 2 + 2 * s.requests as u64, "{p:?}");
    let weights = (s.layers * (s.dim * s.dim + s.batch * s.dim) * 4) as u64;
    assert!(p.platform.device_read_bytes >= weights + s.requests as u64 * io, "{p:?}");
}

#[test]
fn training_waits_only_where_the_host_reads_a_result() {
    // Fewer commands than the ring holds: no publish because the ring looked full.
    let s = TrainingSize { batch: 8, dim: 8, micro_batches: 1, steps: 7, loss_every: 3, checkpoint_every: 5 };
    let p = profiled(&mut open(), Workload::Training(s));
    assert_eq!(p.platform.register_reads, 0, "{p:?}");
    // The upload's wait; steps 3 and 6 (loss), 5 (checkpoint) and 7 (the last); the weights
    // read back. The other steps are published behind the ones before, not waited for.
    assert_eq!(p.waits(), 1 + 4 + 1, "{p:?}");
    assert_eq!(p.driver.waits_idle, p.waits(), "each wait is for the last fence: {p:?}");
    // Every step rings the doorbell once, whether or not it waits.
    let steps_alone = {
        let one = TrainingSize { steps: 1, ..s };
        profiled(&mut open(), Workload::Training(one)).driver.doorbells
    };
    assert_eq!(p.driver.doorbells, steps_alone + 6, "{p:?}");
}

#[test]
fn a_copys_window_of_reads_is_one_dependency_and_an_overlapped_wait_none() {
    let mut d = open();
    let before = (d.pci().counts(), d.stats());
    let buf = d.pin(4 << 20).unwrap();
    // 4 MiB in 4 KiB reads, 256 in flight: four windows, one round trip to start them.
    d.enqueue(Command { opcode: op::COPY_H2V, args: [buf.bus.get(), 0, 4 << 20, 0, 0] }).unwrap();
    let first = d.fence(WaitMode::Poll).unwrap();
    d.enqueue(Command { opcode: op::NOP, args: [0; 5] }).unwrap();
    let second = d.fence(WaitMode::Poll).unwrap();
    d.wait(first, WaitMode::Poll).unwrap();
    d.wait(second, WaitMode::Poll).unwrap();
    let p = Profile::from_counts(d.pci().counts().since(&before.0), d.stats().since(&before.1));
    assert_eq!(p.platform.device_read_bytes, (4 << 20) + 64 * 2 + 64 * 2, "{p:?}");
    // Two fetches (one per doorbell) and the copy's start.
    assert_eq!(p.platform.dependent_reads, 3, "{p:?}");
    assert_eq!((p.waits(), p.driver.waits_idle), (2, 1), "{p:?}");
}

#[test]
fn data_loading_waits_behind_the_next_batch_are_not_idle() {
    let mut d = open();
    let s = DataLoadingSize { batch_bytes: 64 << 10, batches: 6 };
    let p = profiled(&mut d, Workload::DataLoading(s));
    // One wait per batch, and the two read-backs; only the last batch's and the read-backs'
    // leave the device idle.
    assert_eq!(p.waits(), s.batches as u64 + 2, "{p:?}");
    assert_eq!(p.driver.waits_idle, 3, "{p:?}");
    assert!(p.platform.device_read_bytes >= (s.batch_bytes * s.batches) as u64);
}
