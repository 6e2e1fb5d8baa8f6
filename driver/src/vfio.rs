//! The driver's platform on a device bound to `vfio-pci` in this kernel ([`VfioFunction`]):
//! config and BARs through the VFIO regions, DMA memory mapped into the device's IOMMU
//! domain at an I/O virtual address of this process's choosing, MSI-X delivered to eventfds.
//!
//! This is how the simgpu driver runs inside a VM whose simgpu is a vfio-user device: the
//! guest's `vfio-pci` with an emulated IOMMU (`intel-iommu`), so that DMA goes to I/O
//! virtual addresses the VMM maps through vfio-user DMA_MAP. Differences from a directly
//! attached function that the driver does not see:
//! - the kernel owns the MSI-X table and MSI-X Enable: the driver's writes to them are
//!   dropped by `vfio-pci`; interrupts are enabled here, one eventfd per vector, when the
//!   function is opened;
//! - DMA memory is one arena allocated and mapped at open (the IOMMU mapping pins it).
#![allow(unsafe_code)]

use std::io;
use std::path::Path;
use std::time::Duration;

use pci::MsixEventfds;
use pci_driver::device::PciDevice;
use pci_driver::regions::{PciRegion, Permissions};

use crate::function::{
    BusAddr, DmaArena, DmaBuf, Interrupts, MsixTableInfo, PciFunction, WaitStep, msix_table, wait_interrupt,
};

/// I/O virtual address where the DMA arena is mapped (clear of the x86 interrupt window).
pub const IOVA_BASE: u64 = 0x1000_0000;

/// A PCI function opened through VFIO, as a driver platform.
pub struct VfioFunction {
    dev: pci_driver::backends::vfio::VfioPciDevice,
    bars: [(u64, u64); 6],
    /// BARs mapped into this process (accesses are single loads and stores of their size).
    mapped: Vec<Option<pci_driver::regions::MappedOwningPciRegion>>,
    /// The MSI-X table: the kernel's, never written here.
    msix_table: Option<MsixTableInfo>,
    memory: memmap2::MmapMut,
    arena: DmaArena,
    eventfds: Option<MsixEventfds>,
    interrupts: Interrupts,
}

fn bar_addresses(dev: &pci_driver::backends::vfio::VfioPciDevice) -> io::Result<[(u64, u64); 6]> {
    let cfg = dev.config();
    let mut out = [(0u64, 0u64); 6];
    let mut i = 0;
    while i < 6 {
        let lo = cfg.read_le_u32(0x10 + 4 * i as u64)?;
        let is64 = lo & 0x7 == 0x4;
        let addr = if is64 && i < 5 {
            (cfg.read_le_u32(0x14 + 4 * i as u64)? as u64) << 32 | (lo & !0xf) as u64
        } else {
            (lo & !0xf) as u64
        };
        let size = dev.bar(i).map_or(0, |r| r.len());
        if lo & 1 == 0 {
            out[i] = (addr, size);
        }
        i += if is64 { 2 } else { 1 };
    }
    Ok(out)
}

impl VfioFunction {
    /// Opens the function at `sysfs_path` (bound to `vfio-pci`), with `dma_memory` bytes of
    /// DMA memory mapped at [`IOVA_BASE`] and MSI-X enabled on every vector.
    pub fn open(sysfs_path: &Path, dma_memory: usize) -> io::Result<VfioFunction> {
        let dev = pci_driver::backends::vfio::VfioPciDevice::open(sysfs_path)
            .map_err(|e| io::Error::new(e.kind(), format!("opening {}: {e}", sysfs_path.display())))?;
        let bars = bar_addresses(&dev)?;
        let memory = memmap2::MmapMut::map_anon(dma_memory)?;
        // SAFETY: the arena is this process's own anonymous memory, alive as long as the
        // function (it is unmapped from the IOMMU in Drop before the memory goes), and the
        // device may read and write all of it.
        unsafe { dev.iommu().map(IOVA_BASE, dma_memory, memory.as_ptr(), Permissions::ReadWrite) }.map_err(
            |e| io::Error::new(e.kind(), format!("IOMMU map of {dma_memory} bytes at {IOVA_BASE:#x}: {e}")),
        )?;
        let vectors = dev.interrupts().msi_x().max();
        let eventfds = if vectors > 0 {
            let fds = MsixEventfds::new(vectors)?;
            dev.interrupts()
                .msi_x()
                .enable(&fds.raw())
                .map_err(|e| io::Error::new(e.kind(), format!("enabling {vectors} MSI-X vectors: {e}")))?;
            Some(fds)
        } else {
            None
        };
        let mapped = (0..6)
            .map(|i| {
                let r = dev.bar(i)?;
                if r.is_mappable() { r.map(.., Permissions::ReadWrite).ok() } else { None }
            })
            .collect();
        let mut f = VfioFunction {
            dev,
            bars,
            mapped,
            msix_table: None,
            memory,
            arena: DmaArena::new(BusAddr(IOVA_BASE), dma_memory),
            eventfds,
            interrupts: Interrupts::default(),
        };
        f.msix_table = msix_table(&mut f);
        Ok(f)
    }

    /// The BAR and offset a bus address (as the BAR registers said at open) falls in.
    fn decode(&self, addr: BusAddr, len: usize) -> Option<(usize, u64)> {
        let addr = addr.get();
        self.bars.iter().enumerate().find_map(|(i, &(base, size))| {
            (size != 0 && addr >= base && addr + len as u64 <= base + size).then_some((i, addr - base))
        })
    }

    fn collect(&mut self) {
        if let Some(fds) = &self.eventfds {
            for v in fds.fired() {
                self.interrupts.signal(v, 1);
            }
        }
    }

    /// MSI-X signals seen on the eventfds since open (however many a signal stood for).
    pub fn interrupts(&self) -> u64 {
        self.interrupts.received()
    }
}

impl Drop for VfioFunction {
    fn drop(&mut self) {
        let _ = self.dev.interrupts().msi_x().disable();
        let _ = self.dev.iommu().unmap(IOVA_BASE, self.memory.len());
    }
}

impl PciFunction for VfioFunction {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.dev.config().read_le_u32(offset as u64).unwrap_or(u32::MAX)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        let _ = self.dev.config().write_le_u32(offset as u64, value);
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        let len = if len == 8 { 8 } else { 4 };
        let Some((bar, off)) = self.decode(addr, len) else { return u64::MAX };
        if let Some(Some(m)) = self.mapped.get(bar)
            && let p = m.as_ptr()
            && off % len as u64 == 0
        {
            // SAFETY: `off + len` lies inside the mapped BAR (decode checked it against the
            // BAR's size) and is aligned to `len`; one volatile load of that size is one
            // register read.
            return unsafe {
                if len == 8 {
                    std::ptr::read_volatile(p.add(off as usize) as *const u64)
                } else {
                    std::ptr::read_volatile(p.add(off as usize) as *const u32) as u64
                }
            };
        }
        let mut b = [0u8; 8];
        match self.dev.bar(bar).map(|r| r.read_bytes(off, &mut b[..len])) {
            Some(Ok(())) => u64::from_le_bytes(b),
            _ => u64::MAX,
        }
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        let len = if len == 8 { 8 } else { 4 };
        let Some((bar, off)) = self.decode(addr, len) else { return };
        // The kernel owns the MSI-X table: the driver's entries would overwrite its own.
        if let Some(t) = self.msix_table
            && bar == t.bar
            && off + len as u64 > t.offset
            && off < t.offset + t.bytes()
        {
            return;
        }
        if let Some(Some(m)) = self.mapped.get(bar)
            && let p = m.as_mut_ptr()
            && off % len as u64 == 0
        {
            // SAFETY: as in mmio_read; one volatile store of `len` bytes is one register write.
            unsafe {
                if len == 8 {
                    std::ptr::write_volatile(p.add(off as usize) as *mut u64, value);
                } else {
                    std::ptr::write_volatile(p.add(off as usize) as *mut u32, value as u32);
                }
            }
            return;
        }
        if let Some(r) = self.dev.bar(bar) {
            // Region I/O has no 8-byte write here: two DWs, low first.
            let _ = r.write_le_u32(off, value as u32);
            if len == 8 {
                let _ = r.write_le_u32(off + 4, (value >> 32) as u32);
            }
        }
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.arena.alloc_zeroed(&mut self.memory, len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.arena.read(&self.memory, buf, offset, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.arena.write(&mut self.memory, buf, offset, data);
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        wait_interrupt(timeout, |left| {
            self.collect();
            if self.interrupts.take(vector) {
                return WaitStep::Fired;
            }
            match &self.eventfds {
                None => WaitStep::Gone,
                Some(fds) => {
                    fds.wait(left.min(Duration::from_millis(100)));
                    WaitStep::Idle
                }
            }
        })
    }
}
