//! The simgpu on a thread of its own (`testbed::concurrent`): the driver's whole suite and
//! every workload, verified, as on the synchronous direct platform.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::SimGpuDriver;
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
