//! The simgpu on a thread of its own (`testbed::concurrent`): the driver's whole suite and
//! every workload, verified, as on the synchronous direct platform.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use testbed::concurrent::ConcurrentAttach;
use testbed::workload::Workload;
use tlp::Bdf;

fn open() -> SimGpuDriver<ConcurrentAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(ConcurrentAttach::new(dev, 64 << 20).unwrap()).unwrap()
}

#[test]
fn driver_suite_passes_with_the_device_on_its_own_thread() {
    let failed = testbed::suite::failures(open);
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn every_workload_is_verified_with_the_device_on_its_own_thread() {
    let mut d = open();
    for name in Workload::NAMES {
        let w = Workload::named(name, 1).unwrap();
        w.run(&mut d, &mut |_| {}).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // The device comes back with its thread stopped.
    assert!(d.into_pci().into_device().is_some());
}

/// The driver keeps what it polled while the device has written nothing: each fence the
/// device writes, each interrupt it raises, and each copy into a word the driver had read is
/// seen at once, and the driver's own writes read back.
#[test]
fn what_the_driver_polls_follows_every_write_of_the_devices() {
    use driver::simgpu::{Command, WaitMode};
    use simgpu_abi::op;
    let mut d = open();
    for i in 0..2000 {
        let mode = if i % 4 == 0 { WaitMode::Interrupt } else { WaitMode::Poll };
        d.sync(mode).unwrap_or_else(|e| panic!("sync {i}: {e}"));
    }
    let word = d.pci().dma_alloc(64).unwrap();
    let mut seen = [0u8; 64];
    for i in 1..=200u8 {
        // The driver reads the word (and keeps it), then has the device write it.
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [i - 1; 64], "before copy {i}");
        d.enqueue(Command { opcode: op::FILL, args: [0, 64, u64::from(u32::from_le_bytes([i; 4])), 0, 0] })
            .unwrap();
        d.enqueue(Command { opcode: op::COPY_V2H, args: [0, word.bus.get(), 64, 0, 0] }).unwrap();
        d.sync(WaitMode::Poll).unwrap();
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [i; 64], "after copy {i}");
        // The driver's own write reads back, then goes back to what the device wrote.
        d.pci().dma_write(&word, 0, &[0xee; 64]);
        d.pci().dma_read(&word, 0, &mut seen);
        assert_eq!(seen, [0xee; 64]);
        d.pci().dma_write(&word, 0, &[i; 64]);
    }
}
