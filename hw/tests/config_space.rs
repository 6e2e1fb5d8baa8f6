//! Config-space emulation: BAR sizing for every BAR kind, masks byte by byte, capability
//! chains walked the way lspci walks them, Command register effects, MSI-X control, FLR.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use hw::config::{Bar, BarKind, CONFIG_SIZE, ConfigSpace, command};
use hw::simgpu::{self, SimGpuParams};

fn bare() -> ConfigSpace {
    ConfigSpace::new(0x1234, 0x5678, [0x03, 0x02, 0x00], 1, (0x1234, 1))
}

/// Size probing as system software does it: write all ones, read back, decode, restore.
fn probe(c: &mut ConfigSpace, index: usize) -> (u64, u32) {
    let at = 0x10 + 4 * index;
    let orig = c.read(at, 4);
    c.write(at, 4, 0xffff_ffff);
    let lo = c.read(at, 4);
    c.write(at, 4, orig);
    if lo & 1 == 1 {
        return ((!(lo & !0x3)).wrapping_add(1) as u64 & 0xffff, lo & 0x3);
    }
    let flags = lo & 0xf;
    if (lo >> 1) & 3 == 2 {
        let orig_hi = c.read(at + 4, 4);
        c.write(at + 4, 4, 0xffff_ffff);
        let hi = c.read(at + 4, 4);
        c.write(at + 4, 4, orig_hi);
        let mask = (hi as u64) << 32 | (lo & !0xf) as u64;
        return ((!mask).wrapping_add(1), flags);
    }
    ((!(lo & !0xf)).wrapping_add(1) as u64, flags)
}

#[test]
fn bar_sizing_for_every_kind() {
    let mut c = bare();
    c.add_bar(Bar { index: 0, kind: BarKind::Memory32, prefetchable: false, size: 4096 });
    c.add_bar(Bar { index: 1, kind: BarKind::Memory32, prefetchable: true, size: 1 << 20 });
    c.add_bar(Bar { index: 2, kind: BarKind::Memory64, prefetchable: true, size: 8 << 30 });
    c.add_bar(Bar { index: 4, kind: BarKind::Io, prefetchable: false, size: 32 });
    c.add_bar(Bar { index: 5, kind: BarKind::Memory32, prefetchable: false, size: 100 });
    assert_eq!(probe(&mut c, 0), (4096, 0x0));
    assert_eq!(probe(&mut c, 1), (1 << 20, 0x8));
    assert_eq!(probe(&mut c, 2), (8 << 30, 0xc));
    assert_eq!(probe(&mut c, 4), (32, 0x1));
    // Sizes round up to a power of two.
    assert_eq!(probe(&mut c, 5), (128, 0x0));
    // Probing restored the addresses (zero) and assigning places the BAR.
    c.write(0x18, 4, 0x0000_000c | 0x4000_0000);
    let e = c.write(0x1c, 4, 0x0000_0002);
    assert_eq!(e.bar_moved, Some(2));
    // An 8 GiB BAR is 8 GiB-aligned: no low-DW address bit is writable.
    assert_eq!(c.bar_address(2), Some(0x2_0000_0000));
    // Low bits of an assignment are the size's: they do not stick.
    c.write(0x10, 4, 0x1234_5678);
    assert_eq!(c.bar_address(0), Some(0x1234_5000));
    assert_eq!(c.decode(0x1234_5ffc), Some((0, 0xffc)));
    assert_eq!(c.decode(0x1234_6000), None);
    assert_eq!(c.decode(0x2_0000_0000 + (8 << 30) - 1), Some((2, (8 << 30) - 1)));
    assert_eq!(c.decode(0x4_0000_0000), None);
}

#[test]
fn masks_byte_by_byte() {
    let c0 = simgpu::config_space(&SimGpuParams::default());
    // Write all ones then all zeros to every byte and classify it: read-only bytes never
    // change, read-write bits follow, write-1-to-clear bits only clear.
    let mut ro = 0;
    let mut rw = 0;
    for at in 0..CONFIG_SIZE {
        let mut c = c0.clone();
        let before = c.read(at, 1);
        c.write(at, 1, 0xff);
        let ones = c.read(at, 1);
        c.write(at, 1, 0x00);
        let zeros = c.read(at, 1);
        if ones == before && zeros == before {
            ro += 1;
        } else {
            rw += 1;
            // Nothing becomes set that was not writable: zeros clears every RW bit.
            assert_eq!(zeros & !before, 0, "offset {at:#x}: zeros set bits");
        }
    }
    assert!(ro > 4000 && rw > 10, "ro {ro} rw {rw}");
    // IDs and class are read-only.
    let mut c = c0.clone();
    c.write(0x00, 4, 0);
    c.write(0x08, 4, 0);
    assert_eq!(c.read(0x00, 4), 0xd9a0_1234);
    assert_eq!(c.read(0x0b, 1), 0x03);
    // Status error bits are write-1-to-clear; Capabilities List is read-only.
    c.set_status(1 << 13 | 1 << 8);
    assert_eq!(c.read(0x06, 2) & 0x2110, 0x2110);
    c.write(0x06, 2, 1 << 13);
    assert_eq!(c.read(0x06, 2) & 0x2110, 0x0110, "only the written 1 clears");
    c.write(0x06, 2, 0xffff);
    assert_eq!(c.read(0x06, 2), 0x0010);
    // PCIe Device Status error bits are W1C.
    let p = c.pcie_offset().unwrap();
    c.set_device_status(0b0101);
    c.write(p + 10, 2, 0b0001);
    assert_eq!(c.read(p + 10, 2) & 0xf, 0b0100);
    // Unaligned and out-of-range accesses: all-ones, no effect.
    assert_eq!(c.read(0x01, 2), u32::MAX);
    assert_eq!(c.read(4095, 4), u32::MAX);
    assert_eq!(c.write(0x02, 4, 0), Default::default());
}

#[test]
fn capability_chains_walk_like_lspci() {
    let c = simgpu::config_space(&SimGpuParams::default());
    assert_ne!(c.read(0x06, 2) & 0x10, 0, "Capabilities List");
    let mut ids = Vec::new();
    let mut at = c.read(0x34, 1) as usize & !3;
    let mut seen = 0;
    while at != 0 {
        assert!((0x40..0x100).contains(&at), "capability at {at:#x} outside 0x40..0x100");
        ids.push(c.read(at, 1));
        at = c.read(at + 1, 1) as usize & !3;
        seen += 1;
        assert!(seen < 48, "capability loop");
    }
    assert_eq!(ids, vec![0x01, 0x10, 0x11], "PM, PCI Express, MSI-X");
    let mut ext = Vec::new();
    let mut at = 0x100;
    while at != 0 {
        let h = c.read(at, 4);
        ext.push(h & 0xffff);
        at = (h >> 20) as usize;
        assert!(at == 0 || at >= 0x100);
    }
    assert_eq!(ext, vec![0x0003], "Device Serial Number");
    let p = c.pcie_offset().unwrap();
    assert_eq!(c.read(p + 2, 2) & 0xf0, 0, "endpoint");
    let devcap2 = c.read(p + 0x24, 4);
    assert_eq!(devcap2 & (3 << 16), 3 << 16, "10-bit tag completer and requester");
    assert_eq!(devcap2 & 0xf, 0xf, "completion timeout ranges A-D");
}

#[test]
fn command_register_effects() {
    let mut c = simgpu::config_space(&SimGpuParams::default());
    assert!(!c.memory_enabled() && !c.bus_master());
    let e = c.write(0x04, 2, (command::MEMORY_SPACE | command::BUS_MASTER) as u32);
    assert_eq!(e.command, Some((0, command::MEMORY_SPACE | command::BUS_MASTER)));
    assert!(c.memory_enabled() && c.bus_master());
    // Bits that are not implemented stay zero (e.g. Special Cycles, bit 3).
    c.write(0x04, 2, 0xffff);
    assert_eq!(c.command() & (1 << 3), 0);
    assert_ne!(c.command() & command::INTERRUPT_DISABLE, 0);
    // Interrupt Disable is plain RW: writing 0 clears it, writing 1 sets it (not W1C).
    c.write(0x04, 2, (command::MEMORY_SPACE) as u32);
    assert_eq!(c.command() & command::INTERRUPT_DISABLE, 0);
}

#[test]
fn msix_control_and_flr() {
    let mut c = simgpu::config_space(&SimGpuParams { msix_vectors: 16, ..SimGpuParams::default() });
    let m = c.msix_offset().unwrap();
    assert_eq!(c.msix_control().unwrap() & 0x7ff, 15, "table size N-1");
    let e = c.write(m + 2, 2, 0xc000 | 0x7ff);
    assert_eq!(e.msix_control, Some((15, 0xc000 | 15)), "only Enable and Function Mask are writable");
    let e = c.write(m + 2, 2, 0x8000);
    assert_eq!(e.msix_control.unwrap().1 & 0xc000, 0x8000);
    // Initiate FLR: reported, reads as zero.
    let p = c.pcie_offset().unwrap();
    let devctl = c.read(p + 8, 2);
    let e = c.write(p + 8, 2, devctl | 0x8000);
    assert!(e.function_level_reset);
    assert_eq!(c.read(p + 8, 2) & 0x8000, 0);
    // MPS and MRRS are writable and decoded.
    c.write(p + 8, 2, (devctl & !0x70e0) | 1 << 5 | 3 << 12);
    assert_eq!(c.max_payload(), 256);
    assert_eq!(c.max_read_request(), 1024);
}

#[test]
fn power_state_changes_are_reported() {
    let mut c = simgpu::config_space(&SimGpuParams::default());
    let pm = c.pm_offset().unwrap();
    let e = c.write(pm + 4, 2, 3);
    assert_eq!(e.power_state, Some((0, 3)));
    assert_eq!(c.read(pm + 4, 2) & 3, 3);
}
