//! Pinned host memory as owned handles (`SimGpuDriver::pin`): what is given back is pinned
//! again rather than taken anew from the platform's DMA memory, which is never taken back;
//! `with_pinned` gives its buffers back however its body returns, and when a pin is refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use driver::{DriverError, PciFunction, SimGpuDriver};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use testbed::direct::DirectAttach;
use tlp::Bdf;

fn open(host_memory: usize) -> SimGpuDriver<DirectAttach<SimGpu>> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    SimGpuDriver::open(DirectAttach::new(dev, host_memory)).unwrap()
}

#[test]
fn memory_given_back_is_pinned_again_and_runs_do_not_use_up_the_platform() {
    let mut d = open(8 << 20);
    let a = d.pin(2 << 20).unwrap();
    let at = a.bus;
    d.unpin(a);
    // Fifty runs that each pin 2 MiB twice fit in 8 MiB of DMA memory only by reuse.
    for run in 0..50 {
        let got = d
            .with_pinned(
                [2 << 20, 1 << 20],
                |e| e,
                |d, [x, y]| {
                    d.pci().dma_write(x, 0, &[run as u8; 64]);
                    Ok::<_, DriverError>((x.bus, y.bus))
                },
            )
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
        assert_eq!(got.0, at, "run {run}");
    }
}

#[test]
fn with_pinned_gives_back_what_it_pinned_when_its_body_fails_or_a_pin_is_refused() {
    let mut d = open(8 << 20);
    let failed: Result<(), &str> = d.with_pinned([3 << 20], |_| "refused", |_, _| Err("the body failed"));
    assert_eq!(failed, Err("the body failed"));
    // 3 MiB given back, then more than the platform holds: the first pin is given back too.
    let refused = d.with_pinned([3 << 20, 64 << 20], |e| e.to_string(), |_, _| Ok(()));
    assert!(refused.is_err(), "{refused:?}");
    // Both 3 MiB pins came back: two of them fit beside each other in what is left.
    let a = d.pin(3 << 20).unwrap();
    let b = d.pin(3 << 20).unwrap();
    assert_ne!(a.bus, b.bus);
}
