//! `dxpu bench vfio-user`: what the vfio-user server adds, measured without a VMM, side by
//! side in one run. A client that behaves as QEMU's `vfio-user-pci` does
//! (`testbed::vfio_user_client`) drives the simgpu through the server; the same driver
//! drives a `RemoteDevice` directly. Both over UDP loopback with the portable driver, in
//! busy-poll and blocking mode:
//!
//! (a) register read round trip: REGION_READ through the server against the bridged read;
//! (b) DMA: copies host↔VRAM through guest memory shared as a file, and through guest
//!     memory the server reaches with DMA_READ / DMA_WRITE messages, against the bridges.

use std::time::Duration;

use crate::served::Served;
use bridge_host::RemoteDevice;
use driver::SimGpuDriver;
use link::driver::{DriverKind, Impairment, PollMode};
use serde_json::{Value, json};

use crate::error::LabError;

use crate::bulk::copy;
use crate::floor::us;
use crate::harness::{LocalBox, mmio_rtt};

/// What `dxpu bench vfio-user` measures.
#[derive(Debug, Clone, Copy)]
pub struct VfioUserOptions {
    /// Register reads timed per case (at least 100, after 10 % warm-up).
    pub iterations: usize,
    /// Bytes per DMA copy (guest memory shared as a file).
    pub copy_bytes: usize,
    /// Bytes per DMA copy through DMA_READ / DMA_WRITE messages.
    pub message_copy_bytes: usize,
    /// Both endpoints' UDP driver (`Auto` means portable here: the server waits on the
    /// client's socket and the link's together).
    pub driver: DriverKind,
}

/// Measures every case, says each row through `say` as it is measured, and gives the report
/// as `--json` prints it (docs/cli.md).
pub fn run(args: &VfioUserOptions, say: &dyn Fn(String)) -> Result<Value, LabError> {
    measure(args, say).map_err(LabError::Bench)
}

fn measure(args: &VfioUserOptions, say: &dyn Fn(String)) -> Result<Value, String> {
    let n = args.iterations.max(100);
    let spin = Duration::from_millis(2);
    let driver = match args.driver {
        DriverKind::Auto => DriverKind::Portable,
        d => d,
    };
    let driver_name = if driver == DriverKind::IoUring { "io_uring" } else { "portable" };
    say(format!(
        "dxpu bench vfio-user — the vfio-user server without a VMM: UDP loopback, {driver_name} driver"
    ));
    say(String::new());
    let (mut mmio, mut dma) = (Vec::new(), Vec::new());
    let line = |cells: &[String]| say(crate::report::row(&[56, 8, 8, 10], cells));
    line(&[
        format!("(a) register read round trip, {n} reads"),
        "p50 µs".into(),
        "p99 µs".into(),
        "/ bridged".into(),
    ]);
    let mut rates = Vec::new();
    for busy in [true, false] {
        let mode = if busy { "busy-poll" } else { "blocking" };
        let poll = if busy { PollMode::Busy { spin } } else { PollMode::Blocking };
        let gpu = LocalBox::start(driver, poll, Impairment::default())?;
        let remote = RemoteDevice::attach(gpu.attach_options(driver, poll, Impairment::default()))
            .map_err(|e| e.to_string())?;
        let mut d = SimGpuDriver::open(remote).map_err(|e| e.to_string())?;
        let (b50, b99) = mmio_rtt(&mut d, n);
        mmio.push(json!({"path": "bridged", "poll": if busy { "busy" } else { "blocking" }, "p50_us": us(b50), "p99_us": us(b99)}));
        line(&[
            format!("bridged (RemoteDevice), {mode}"),
            format!("{:.1}", us(b50)),
            format!("{:.1}", us(b99)),
            "1.00".into(),
        ]);
        let bridged = if busy { Some(copy(&mut d, args.copy_bytes)?) } else { None };
        d.into_pci().detach();

        let served = Served::start(&gpu, driver, poll)?;
        let mut v = served.client(true, args.copy_bytes + (1 << 20))?;
        let (p50, p99) = mmio_rtt(&mut v, n);
        mmio.push(json!({"path": "vfio_user", "poll": if busy { "busy" } else { "blocking" }, "p50_us": us(p50), "p99_us": us(p99)}));
        line(&[
            format!("  through the vfio-user server (REGION_READ), {mode}"),
            format!("{:.1}", us(p50)),
            format!("{:.1}", us(p99)),
            format!("{:.2}", us(p50) / us(b50)),
        ]);
        if let Some(b) = bridged {
            let shared = copy(&mut v, args.copy_bytes)?;
            drop(v);
            let mut m = served.client(false, args.message_copy_bytes + (1 << 20))?;
            let messages = copy(&mut m, args.message_copy_bytes)?;
            rates.push((mode, b, shared, messages));
        }
    }
    say(String::new());
    let line = |cells: &[String]| say(crate::report::row(&[56, 10, 10], cells));
    line(&[
        format!(
            "(b) DMA, {:.0} MB per copy ({:.0} MB by messages)",
            args.copy_bytes as f64 / 1e6,
            args.message_copy_bytes as f64 / 1e6
        ),
        "h→d MB/s".into(),
        "d→h MB/s".into(),
    ]);
    for (mode, b, s, m) in rates {
        for (what, path, (h2d, d2h)) in [
            (format!("bridged (RemoteDevice), {mode}"), "bridged", b),
            ("  vfio-user, guest memory shared as a file".into(), "vfio_user_shared", s),
            ("  vfio-user, guest memory by DMA_READ/DMA_WRITE".into(), "vfio_user_messages", m),
        ] {
            line(&[what, format!("{h2d:.0}"), format!("{d2h:.0}")]);
            dma.push(json!({"path": path, "h2d_bytes_per_s": h2d * 1e6, "d2h_bytes_per_s": d2h * 1e6}));
        }
    }
    Ok(json!({
        "driver": driver_name,
        "mmio": mmio,
        "dma": dma,
        "copy_bytes": args.copy_bytes,
        "message_copy_bytes": args.message_copy_bytes,
    }))
}
