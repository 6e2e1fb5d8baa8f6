//! Bridged bulk DMA only, for a profiler: one simgpu behind a GPU-box endpoint on loopback,
//! pinned copies host→VRAM and back for a while, nothing else in the process.
//!
//! `perf record -g cargo run --release -p dxpu-lab --example bulk_profile -- io_uring tagged 10`
//! (driver `portable` or `io_uring`; frames `tagged`, `untagged` or `encrypted`; seconds;
//! optionally `h2d` or `d2h` for one way only). `COPY_MIB` sets the copy's size (64),
//! `ANSWER_SLICE_US` the host's answer slice as the replay sets it (none), `PIN=1` the box's
//! thread on CPU 0 and the host's on CPU 1.
//! Prints each copy's rate; the box's thread is named `dxpu-gpu`, the host's runs on `main`.

use std::io::Write;
use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use driver::{PciFunction, SimGpuDriver, WaitMode};
use lab::harness::{Frames, LocalBox};
use link::driver::{DriverKind, Impairment, PollMode};
use simgpu_abi::op;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let driver = match args.get(1).map(String::as_str) {
        Some("portable") => DriverKind::Portable,
        _ => DriverKind::IoUring,
    };
    let frames = match args.get(2).map(String::as_str) {
        Some("untagged") => Frames::Unauthenticated,
        Some("encrypted") => Frames::Encrypted,
        _ => Frames::Tagged,
    };
    let seconds: u64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(10);
    // Which way: h2d, d2h, or both (the default).
    let way = args.get(4).cloned().unwrap_or_default();
    let bytes = std::env::var("COPY_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(64usize) << 20;
    let poll = PollMode::Busy { spin: Duration::from_millis(2) };
    let offload = link::driver::Offload::AUTO;
    // PIN=1: the box's thread on CPU 0 and this one on CPU 1, as the replay places them.
    let pin = std::env::var("PIN").is_ok_and(|v| v == "1");
    let gpu =
        LocalBox::start_offload(driver, poll, Impairment::default(), frames, offload, pin.then_some(0))?;
    if pin {
        lab::affinity::pin_to(Some(1))?;
    }
    let mut o = gpu.attach_options(driver, poll, Impairment::default());
    // As the replay attaches: the host answers the device's reads in slices of this many µs.
    o.answer_slice =
        std::env::var("ANSWER_SLICE_US").ok().and_then(|v| v.parse().ok()).map(Duration::from_micros);
    let remote = RemoteDevice::attach(o)?;
    let mut d = SimGpuDriver::open(remote)?;
    let buf = d.pci().dma_alloc(bytes).ok_or("no DMA memory")?;
    d.pci().dma_write(&buf, 0, &vec![0x5a; bytes]);
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        for (name, opcode, args) in [
            ("h→d", op::COPY_H2V, [buf.bus.get(), 0, bytes as u64, 0, 0]),
            ("d→h", op::COPY_V2H, [0, buf.bus.get(), bytes as u64, 0, 0]),
        ] {
            if !way.is_empty() && way != name.replace('→', "2") {
                continue;
            }
            let t = Instant::now();
            d.launch(opcode, args, WaitMode::Poll)?;
            let rate = bytes as f64 / t.elapsed().as_secs_f64() / 1e6;
            // A closed pipe (`| head`) ends the run, without a panic.
            if writeln!(std::io::stdout(), "{name} {rate:.0} MB/s").is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}
