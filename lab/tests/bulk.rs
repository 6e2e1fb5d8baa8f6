//! Bulk copies measured in process (`lab::bulk`): directly attached and through a fresh
//! pair of endpoints, each copy checked byte for byte, with rates each way and each side's
//! CPU, the work (CPU less spins) never above the CPU; the driver's staged `memcpy` too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use driver::SimGpuDriver;
use hw::SimGpu;
use hw::simgpu::SimGpuParams;
use lab::bulk::{Copied, bridged_copies, copy, direct_copies};
use lab::harness::Frames;
use link::driver::{DriverKind, Offload};
use testbed::direct::DirectAttach;

fn sane(c: &Copied, what: &str) {
    assert!(c.h2d_mb_s > 0.0 && c.d2h_mb_s > 0.0, "{what}: {c:?}");
    for (cpu, work) in c.sides().iter().zip(c.work()) {
        assert!(*cpu >= 0.0 && work >= 0.0 && work <= *cpu + 1e-9, "{what}: {c:?}");
    }
}

#[test]
fn pinned_copies_directly_and_through_the_bridges_are_timed_and_checked() {
    let direct = direct_copies(4 << 20, 2).unwrap();
    sane(&direct, "direct");
    // A direct device has no endpoints: its work is its CPU.
    assert_eq!(direct.host_cpu, direct.host_work);
    for frames in [Frames::Tagged, Frames::Unauthenticated] {
        let variant = (DriverKind::Portable, frames, Offload::AUTO);
        let (c, link) = bridged_copies(4 << 20, 1, variant, Duration::from_millis(2)).unwrap();
        sane(&c, &format!("{frames:?}"));
        // Two copies each way of 4 MiB crossed the link (one untimed, one timed).
        assert!(link.bytes_sent > 2 * (4 << 20) && link.bytes_received > 2 * (4 << 20), "{link:?}");
    }
}

#[test]
fn the_drivers_staged_copy_comes_back_whole() {
    let dev = SimGpu::new(tlp::Bdf::new(1, 0, 0), SimGpuParams::default());
    let mut d = SimGpuDriver::open(DirectAttach::new(dev, 64 << 20)).unwrap();
    let (h2d, d2h) = copy(&mut d, 3 << 20).unwrap();
    assert!(h2d > 0.0 && d2h > 0.0);
}

#[test]
fn the_direct_simgpus_own_figures_are_measured_and_no_command_gives_a_zero_round_trip() {
    let f = lab::simgpu::measure(1 << 20, 20).unwrap();
    assert!(f.command_rtt.p50 > Duration::ZERO && f.command_rtt.p50 <= f.command_rtt.p99);
    assert!(f.staged_mb_s.0 > 0.0 && f.staged_mb_s.1 > 0.0);
    assert!(f.pinned_bytes_per_s.0 > 0.0 && f.pinned_bytes_per_s.1 > 0.0);
    assert!(f.vadd > Duration::ZERO && f.matmul > Duration::ZERO);
    let none = lab::simgpu::measure(1 << 20, 0).unwrap();
    assert_eq!(none.command_rtt.p50, Duration::ZERO);
}
