//! Bulk copies measured: the device's DMA engine alone on a pinned buffer, as CUDA's
//! `bandwidthTest --memory=pinned` does, with each side's CPU and its work (the CPU less
//! what the endpoints spun on empty rings), through a fresh pair of endpoints or directly
//! attached; and the driver's staged `memcpy` each way. `dxpu bench bridge` and `dxpu bench
//! vfio-user` put them in their tables.

use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use link::driver::{DriverKind, Impairment, Offload, PollMode};

use crate::error::LabError;
use crate::harness::{Frames, LocalBox, Spread};

/// `repeat` timed copies of `bytes` each way (after one untimed) through a fresh pair of
/// endpoints busy-polling for `spin`, with `driver`, `frames` and `offload`: the medians,
/// and the host endpoint's link counters after.
pub fn bridged_copies(
    bytes: usize,
    repeat: u32,
    (driver, frames, offload): (DriverKind, Frames, Offload),
    spin: Duration,
) -> Result<(Copied, link::Stats), LabError> {
    let poll = PollMode::Busy { spin };
    let gpu = LocalBox::start_offload(driver, poll, Impairment::default(), frames, offload, None)?;
    let remote = RemoteDevice::attach(gpu.attach_options(driver, poll, Impairment::default()))?;
    let mut d = SimGpuDriver::open(remote).map_err(LabError::driver("bridged", "opening the simgpu"))?;
    let buf = pinned(&mut d, bytes)?;
    let spun =
        |d: &mut SimGpuDriver<RemoteDevice>| [Duration::from_nanos(d.pci().stats().spin_ns), gpu.spun()];
    let c = timed_copies(&mut d, &buf, repeat, &spun).map_err(|e| match d.pci().removed() {
        Some(why) => LabError::Removed { during: Box::new(e), why },
        None => e,
    })?;
    Ok((c, d.pci().stats().link))
}

/// The directly attached simgpu's copies each way: its pages touched once first, as `bench
/// simgpu` does, so the figure is the copy's, not the kernel zeroing fresh pages.
/// [`bridged_copies`]' figures on a directly attached simgpu.
pub fn direct_copies(bytes: usize, repeat: u32) -> Result<Copied, LabError> {
    let dev = hw::SimGpu::new(tlp::Bdf::new(1, 0, 0), hw::simgpu::SimGpuParams::default());
    let mut d = SimGpuDriver::open(testbed::direct::DirectAttach::new(dev, bytes + (1 << 20)))
        .map_err(LabError::driver("direct", "opening the simgpu"))?;
    let buf = pinned(&mut d, bytes)?;
    timed_copies(&mut d, &buf, repeat, &no_spin)
}

/// One copy each way, as [`bridged_copies`] and [`direct_copies`] measure it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Copied {
    /// MB/s host→device.
    pub h2d_mb_s: f64,
    /// MB/s device→host.
    pub d2h_mb_s: f64,
    /// CPU seconds per GiB moved by the calling thread (the host endpoint, which the
    /// driver's polling drives), h→d then d→h.
    pub host_cpu: [f64; 2],
    /// The same for the rest of the process (the box endpoint's thread).
    pub box_cpu: [f64; 2],
    /// `host_cpu` less what the host endpoint's passes that found nothing took (its spins,
    /// `link::driver::SpinMeter`): the work.
    pub host_work: [f64; 2],
    /// `box_cpu` less the box endpoint's spins.
    pub box_work: [f64; 2],
}

impl Copied {
    /// CPU per GiB as the tables' columns: host h→d, box h→d, host d→h, box d→h.
    pub fn sides(&self) -> [f64; 4] {
        [self.host_cpu[0], self.box_cpu[0], self.host_cpu[1], self.box_cpu[1]]
    }
    /// The work per GiB, the same way.
    pub fn work(&self) -> [f64; 4] {
        [self.host_work[0], self.box_work[0], self.host_work[1], self.box_work[1]]
    }
}

/// What the host's and the box's endpoints have spun so far: each endpoint's
/// `link::driver::SpinMeter` totals.
type Spun<'a, P> = &'a dyn Fn(&mut SimGpuDriver<P>) -> [Duration; 2];

/// A directly attached device has no endpoints: nothing spins.
fn no_spin<P: driver::PciFunction>(_: &mut SimGpuDriver<P>) -> [Duration; 2] {
    [Duration::ZERO; 2]
}

/// CPU time of the calling thread and of the whole process so far.
fn cpu_now() -> (Duration, Duration) {
    use rustix::time::{ClockId, clock_gettime};
    let d = |t: rustix::time::Timespec| Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
    (d(clock_gettime(ClockId::ThreadCPUTime)), d(clock_gettime(ClockId::ProcessCPUTime)))
}

/// One untimed [`pinned_copy`], then `repeat` timed: the median of each figure.
fn timed_copies<P: driver::PciFunction>(
    d: &mut SimGpuDriver<P>,
    buf: &driver::DmaBuf,
    repeat: u32,
    spun: Spun<'_, P>,
) -> Result<Copied, LabError> {
    let data = testbed::suite::pattern(buf.len, 3);
    let mut back = vec![0xffu8; buf.len];
    pinned_copy(d, buf, &data, &mut back, spun)?;
    let mut runs = Vec::new();
    for _ in 0..repeat {
        runs.push(pinned_copy(d, buf, &data, &mut back, spun)?);
    }
    let median = |f: &dyn Fn(&Copied) -> f64| Spread::of(runs.iter().map(f)).median;
    Ok(Copied {
        h2d_mb_s: median(&|c| c.h2d_mb_s),
        d2h_mb_s: median(&|c| c.d2h_mb_s),
        host_cpu: [median(&|c| c.host_cpu[0]), median(&|c| c.host_cpu[1])],
        box_cpu: [median(&|c| c.box_cpu[0]), median(&|c| c.box_cpu[1])],
        host_work: [median(&|c| c.host_work[0]), median(&|c| c.host_work[1])],
        box_work: [median(&|c| c.box_work[0]), median(&|c| c.box_work[1])],
    })
}

/// A DMA buffer of `bytes` for [`pinned_copy`].
fn pinned<P: driver::PciFunction>(d: &mut SimGpuDriver<P>, bytes: usize) -> Result<driver::DmaBuf, LabError> {
    d.pci().dma_alloc(bytes).ok_or(LabError::NoDmaMemory { bytes })
}

/// The device's DMA engine alone, as CUDA's `bandwidthTest --memory=pinned` measures it: the
/// bytes already lie in a DMA buffer (`buf`), the device copies them to VRAM at 0 and back,
/// the clock runs from each command's submission to its fence, and the bytes that came back
/// (into `back`) are checked against `data` after. Returns the rate and CPU time each way,
/// and the work: the CPU time less what `spun` says each endpoint spun meanwhile.
fn pinned_copy<P: driver::PciFunction>(
    d: &mut SimGpuDriver<P>,
    buf: &driver::DmaBuf,
    data: &[u8],
    back: &mut [u8],
    spun: Spun<'_, P>,
) -> Result<Copied, LabError> {
    use driver::WaitMode;
    use simgpu_abi::op;
    let (bus, len) = (buf.bus.get(), buf.len as u64);
    let mb = buf.len as f64 / 1e6;
    let gib = buf.len as f64 / (1u64 << 30) as f64;
    let mut c = Copied::default();
    let mut timed = |d: &mut SimGpuDriver<P>, op: u32, args: [u64; 5], i: usize| -> Result<f64, LabError> {
        let ([host_spun0, box_spun0], (thread0, process0)) = (spun(d), cpu_now());
        let t = Instant::now();
        d.launch(op, args, WaitMode::Poll).map_err(LabError::driver("bulk", "copy"))?;
        let rate = mb / t.elapsed().as_secs_f64();
        let (thread1, process1) = cpu_now();
        let [host_spun1, box_spun1] = spun(d);
        let host = (thread1 - thread0).as_secs_f64();
        let box_ = ((process1 - process0).as_secs_f64() - host).max(0.0);
        c.host_cpu[i] = host / gib;
        c.box_cpu[i] = box_ / gib;
        c.host_work[i] = (host - (host_spun1 - host_spun0).as_secs_f64()).max(0.0) / gib;
        c.box_work[i] = (box_ - (box_spun1 - box_spun0).as_secs_f64()).max(0.0) / gib;
        Ok(rate)
    };
    d.pci().dma_write(buf, 0, data);
    let h2d = timed(d, op::COPY_H2V, [bus, 0, len, 0, 0], 0)?;
    back.fill(0xff);
    d.pci().dma_write(buf, 0, back);
    let d2h = timed(d, op::COPY_V2H, [0, bus, len, 0, 0], 1)?;
    d.pci().dma_read(buf, 0, back);
    if back != data {
        return Err(LabError::CopyCorrupted { bytes: data.len() });
    }
    c.h2d_mb_s = h2d;
    c.d2h_mb_s = d2h;
    Ok(c)
}

/// Copies `bytes` host→VRAM and back through `d` with the driver's `memcpy` (through its
/// staging buffer), checks them, and returns MB/s each way.
pub fn copy<P: driver::PciFunction>(d: &mut SimGpuDriver<P>, bytes: usize) -> Result<(f64, f64), LabError> {
    let mb = bytes as f64 / 1e6;
    let data = testbed::suite::pattern(bytes, 3);
    let t = Instant::now();
    d.memcpy_to_device(0, &data).map_err(LabError::driver("bulk", "copy to the device"))?;
    let h2d = mb / t.elapsed().as_secs_f64();
    let mut back = vec![0u8; bytes];
    // Touched before the clock starts: a fresh allocation's pages fault in on first write.
    back.fill(0xff);
    let t = Instant::now();
    d.memcpy_from_device(0, &mut back).map_err(LabError::driver("bulk", "copy from the device"))?;
    let d2h = mb / t.elapsed().as_secs_f64();
    if back != data {
        return Err(LabError::CopyCorrupted { bytes });
    }
    Ok((h2d, d2h))
}
