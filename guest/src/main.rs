//! `dxpu-guest`: the simgpu driver, unchanged, inside a VM. It opens the simgpu bound to the
//! guest kernel's `vfio-pci` (behind the emulated IOMMU, so its DMA goes to I/O virtual
//! addresses the VMM maps for the device), times register reads, runs the demo workload
//! that `dxpu loopback` runs, checks every result against the CPU, and prints a report
//! ending in `dxpu-guest: PASS` or `dxpu-guest: FAIL`. Built as a static binary for the
//! VM test's initramfs (tests/vm/run.sh).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use driver::SimGpuDriver;
use driver::vfio::VfioFunction;
use simgpu_abi::{DEVICE_ID, VENDOR_ID};
use testbed::workload::{self, WorkloadSize};

const USAGE: &str = "usage: dxpu-guest [--device /sys/bus/pci/devices/DDDD:BB:DD.F] [--scale 1..=32] \
[--dma-mib N] [--rtt-samples N]";

struct Args {
    device: Option<PathBuf>,
    scale: u32,
    dma_mib: usize,
    rtt_samples: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args { device: None, scale: 1, dma_mib: 16, rtt_samples: 200 };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value\n{USAGE}"));
        match k.as_str() {
            "--device" => a.device = Some(PathBuf::from(value("--device")?)),
            "--scale" => {
                a.scale = value("--scale")?.parse().map_err(|e| format!("--scale: {e}"))?;
                if !(1..=32).contains(&a.scale) {
                    return Err(format!("--scale {}: must be 1..=32", a.scale));
                }
            }
            "--dma-mib" => a.dma_mib = value("--dma-mib")?.parse().map_err(|e| format!("--dma-mib: {e}"))?,
            "--rtt-samples" => {
                a.rtt_samples = value("--rtt-samples")?.parse().map_err(|e| format!("--rtt-samples: {e}"))?
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(a)
}

/// The first simgpu in sysfs.
fn find_simgpu() -> Result<PathBuf, String> {
    let dir = std::fs::read_dir("/sys/bus/pci/devices").map_err(|e| format!("/sys/bus/pci/devices: {e}"))?;
    for e in dir.flatten() {
        let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
        let id = |s: String| u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok();
        if id(read("vendor")) == Some(VENDOR_ID) && id(read("device")) == Some(DEVICE_ID) {
            return Ok(e.path());
        }
    }
    Err(format!("no simgpu ({VENDOR_ID:04x}:{DEVICE_ID:04x}) in /sys/bus/pci/devices"))
}

fn us(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

fn run(a: &Args) -> Result<(), String> {
    let path = match &a.device {
        Some(p) => p.clone(),
        None => find_simgpu()?,
    };
    println!("dxpu-guest: simgpu at {}", path.display());
    let f = VfioFunction::open(&path, a.dma_mib << 20).map_err(|e| e.to_string())?;
    let mut d = SimGpuDriver::open(f).map_err(|e| format!("opening the simgpu: {e}"))?;
    println!("dxpu-guest: opened; VRAM {} MiB", d.vram_size() >> 20);
    let (p50, p99) = workload::mmio_read_rtt(&mut d, a.rtt_samples);
    println!("dxpu-guest: register read round trip p50 {:.1} us, p99 {:.1} us", us(p50), us(p99));
    let size = WorkloadSize::scaled(a.scale);
    let r = workload::run(&mut d, size, &mut |s| println!("dxpu-guest: {s}"))
        .map_err(|e| format!("workload: {e}"))?;
    let gbps = |(bytes, s): (usize, f64)| if s > 0.0 { bytes as f64 * 8.0 / s / 1e9 } else { 0.0 };
    for s in &r.steps {
        println!("dxpu-guest: step {:<28} {:.3} s", s.name, s.seconds);
    }
    println!(
        "dxpu-guest: workload verified in {:.3} s; DMA host-to-device {:.3} Gbit/s, device-to-host {:.3} Gbit/s",
        r.seconds,
        gbps(r.h2d),
        gbps(r.d2h)
    );
    println!("dxpu-guest: {} MSI-X interrupts received", d.pci().interrupts());
    println!(
        "dxpu-guest: {{\"verified\":true,\"mmio_read_rtt_us\":{{\"p50\":{:.1},\"p99\":{:.1}}},\"dma_h2d_bytes_per_s\":{:.0},\"dma_d2h_bytes_per_s\":{:.0},\"seconds\":{:.3}}}",
        us(p50),
        us(p99),
        gbps(r.h2d) * 1e9 / 8.0,
        gbps(r.d2h) * 1e9 / 8.0,
        r.seconds
    );
    Ok(())
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("dxpu-guest: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(()) => {
            println!("dxpu-guest: PASS");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("dxpu-guest: {e}");
            println!("dxpu-guest: FAIL");
            ExitCode::FAILURE
        }
    }
}
