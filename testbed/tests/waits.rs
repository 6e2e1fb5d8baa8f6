//! The driver's waits follow the platform, not the clock: a fence wait goes on while the
//! platform hears from the device, gives up after the stall timeout once nothing moves, and
//! at the ceiling however much moves (a device that never finishes on a live link).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cell::Cell;
use std::time::{Duration, Instant};

use driver::{BusAddr, DmaBuf, DriverError, Patience, PciFunction, SimGpuDriver, WaitMode};
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use testbed::direct::DirectAttach;
use tlp::Bdf;

/// A directly attached simgpu whose fence word never shows what the device wrote (the
/// fence's write lost for good), and whose progress moves on every look when `moving`.
struct FenceNeverLands {
    inner: DirectAttach<SimGpu>,
    fence: Option<DmaBuf>,
    moving: bool,
    progress: Cell<u64>,
}

impl PciFunction for FenceNeverLands {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.inner.config_read(offset)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        self.inner.config_write(offset, value)
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        self.inner.mmio_read(addr, len)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.inner.mmio_write(addr, len, value)
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        let b = self.inner.dma_alloc(len)?;
        // The driver's 8-byte allocation is its fence word.
        if len == 8 {
            self.fence = Some(b);
        }
        Some(b)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.inner.dma_read(buf, offset, out);
        if self.fence.is_some_and(|f| f.bus == buf.bus) {
            out.fill(0);
        }
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.inner.dma_write(buf, offset, data)
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        self.inner.wait_interrupt(vector, timeout.min(Duration::from_millis(1)))
    }
    fn progress(&self) -> u64 {
        if self.moving {
            self.progress.set(self.progress.get() + 1);
        }
        self.progress.get()
    }
}

fn open(moving: bool) -> SimGpuDriver<FenceNeverLands> {
    let dev = SimGpu::new(Bdf::new(1, 0, 0), SimGpuParams::default());
    let pci = FenceNeverLands {
        inner: DirectAttach::new(dev, 16 << 20),
        fence: None,
        moving,
        progress: Cell::new(0),
    };
    SimGpuDriver::open(pci).unwrap()
}

#[test]
fn a_wait_with_progress_goes_on_past_the_stall_timeout_and_ends_at_the_ceiling() {
    for mode in [WaitMode::Poll, WaitMode::Interrupt] {
        let mut d = open(true);
        let p = Patience { stall: Duration::from_millis(100), ceiling: Duration::from_millis(600) };
        d.set_patience(p);
        let start = Instant::now();
        let e = d.sync(mode).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(e, DriverError::Timeout { value: 1, timeout } if timeout == p.ceiling),
            "{mode:?}: {e}"
        );
        assert!(took >= p.ceiling, "{mode:?}: ended after {took:?}, before the ceiling");
        assert!(took < p.ceiling + Duration::from_millis(400), "{mode:?}: {took:?}");
        assert!(e.to_string().contains("ceiling"), "{e}");
    }
}

#[test]
fn a_wait_with_nothing_heard_ends_after_the_stall_timeout() {
    for mode in [WaitMode::Poll, WaitMode::Interrupt] {
        let mut d = open(false);
        d.set_patience(Patience { stall: Duration::from_millis(150), ceiling: Duration::from_secs(30) });
        let start = Instant::now();
        let e = d.sync(mode).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(e, DriverError::Stalled { value: 1, idle } if idle >= Duration::from_millis(150)),
            "{e}"
        );
        assert!(took < Duration::from_secs(2), "{mode:?}: {took:?}");
        assert!(e.to_string().contains("nothing heard from the device"), "{e}");
    }
}
