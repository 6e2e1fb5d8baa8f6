//! The simulated GPU's PCI face: identity, BARs and capabilities (docs/simgpu.md). The
//! device model behind these registers is built on this config space.
#![forbid(unsafe_code)]

use pci::config::{Bar, BarKind, ConfigSpace, PcieCapability};

pub use simgpu_abi::{BAR0_SIZE, DEVICE_ID, MSIX_PBA_OFFSET, MSIX_TABLE_OFFSET, VENDOR_ID};

/// What can be chosen about a simulated GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimGpuParams {
    /// VRAM size in bytes (the BAR2 size; rounded up to a power of two).
    pub vram_bytes: u64,
    /// MSI-X vectors (at least 4).
    pub msix_vectors: u16,
    /// Serial number (Device Serial Number capability).
    pub serial: u64,
}

impl Default for SimGpuParams {
    fn default() -> Self {
        SimGpuParams { vram_bytes: 256 << 20, msix_vectors: 8, serial: 0x0d59_0000_0000_0001 }
    }
}

/// The simulated GPU's config space at power-on: class 03/02/00 (3D controller); BAR0 64-bit
/// non-prefetchable registers; BAR2 64-bit prefetchable VRAM; MSI-X in BAR0; PCI Express
/// endpoint with 10-bit tags; Power Management; Device Serial Number.
pub fn config_space(p: &SimGpuParams) -> ConfigSpace {
    let mut c = ConfigSpace::new(VENDOR_ID, DEVICE_ID, [0x03, 0x02, 0x00], 0x01, (VENDOR_ID, 0x0001));
    // No INTx: MSI-X is the interrupt mechanism (Interrupt Pin 0).
    c.set_interrupt_pin(0);
    c.add_bar(Bar { index: 0, kind: BarKind::Memory64, prefetchable: false, size: BAR0_SIZE });
    c.add_bar(Bar { index: 2, kind: BarKind::Memory64, prefetchable: true, size: p.vram_bytes });
    c.add_power_management();
    // Max_Payload_Size up to 4 KiB: bulk copies move in as few TLPs as the host allows.
    c.add_pcie(PcieCapability { max_payload_supported: 5, ..PcieCapability::default() });
    c.add_msix(p.msix_vectors.max(4), 0, MSIX_TABLE_OFFSET, MSIX_PBA_OFFSET);
    c.add_serial_number(p.serial);
    c
}

/// The config space in the text format `lspci -x` prints and `lspci -F` reads: a slot line,
/// then 16 bytes per line as `oo: hh hh …`, all 4096 bytes.
pub fn lspci_dump(c: &ConfigSpace, slot: &str) -> String {
    use std::fmt::Write;
    let mut s = format!("{slot} 3D controller: dxpu simulated GPU\n");
    for (i, row) in c.bytes().chunks(16).enumerate() {
        let _ = write!(s, "{:03x}:", i * 16);
        for b in row {
            let _ = write!(s, " {b:02x}");
        }
        s.push('\n');
    }
    s.push('\n');
    s
}
