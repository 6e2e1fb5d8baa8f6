//! The access a driver is written against ([`PciFunction`]), and the pieces every platform
//! that offers it shares: bus addresses ([`BusAddr`]), the DMA arena a driver's buffers come
//! from ([`DmaArena`]), the per-vector interrupt count and the one wait for it
//! ([`Interrupts`], [`wait_interrupt`]), and the capability walks a driver starts with.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::{Add, Range};
use std::time::{Duration, Instant};

/// An address on the function's PCI bus: what its BARs are programmed with and what its DMA
/// requests carry (an I/O virtual address where an IOMMU translates). Not a pointer in any
/// process, and not an address on the GPU box's own bus.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BusAddr(pub u64);

impl BusAddr {
    /// The address as the TLP's Address field carries it.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + n`, or `None` past the end of the 64-bit bus.
    pub fn checked_add(self, n: u64) -> Option<BusAddr> {
        self.0.checked_add(n).map(BusAddr)
    }

    /// How far `self` lies above `base`, or `None` below it.
    pub fn offset_from(self, base: BusAddr) -> Option<u64> {
        self.0.checked_sub(base.0)
    }
}

impl Add<u64> for BusAddr {
    type Output = BusAddr;
    fn add(self, n: u64) -> BusAddr {
        BusAddr(self.0.wrapping_add(n))
    }
}

impl fmt::Display for BusAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

impl fmt::LowerHex for BusAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

/// Host memory a device may reach, as the platform hands it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBuf {
    /// Bus address the device uses.
    pub bus: BusAddr,
    /// Length in bytes.
    pub len: usize,
}

/// What a driver needs from its platform.
pub trait PciFunction {
    /// Reads a config DW.
    fn config_read(&mut self, offset: u16) -> u32;
    /// Writes a config DW.
    fn config_write(&mut self, offset: u16, value: u32);
    /// Reads `len` (4 or 8) bytes of MMIO at `addr` (inside a BAR as programmed).
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64;
    /// Writes `len` (4 or 8) bytes of MMIO.
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64);
    /// Allocates DMA-able host memory (zeroed).
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf>;
    /// Reads host memory the device may have written.
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]);
    /// Reads host memory as it stands, without letting the platform deliver what the device
    /// wrote meanwhile: for a caller about to be due elsewhere that must not spend its time
    /// on the link (a bridge's host side driven by its caller's calls does its work in
    /// [`PciFunction::dma_read`] and [`PciFunction::serve_for`]). By default
    /// [`PciFunction::dma_read`]: a platform whose device writes land by themselves.
    fn dma_peek(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.dma_read(buf, offset, out)
    }
    /// Writes host memory the device will read.
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]);
    /// The MSI-X address and data that make vector `vector` reach this driver: by default
    /// the x86 interrupt window ([`MSI_BASE`]) with the vector number as data, which every
    /// platform here decodes (a `vfio-pci` function's table is the kernel's, and what the
    /// driver writes there is dropped).
    fn msi_message(&mut self, vector: u16) -> (u64, u32) {
        (MSI_BASE, vector as u32)
    }
    /// The caller has nothing to do for `budget`: a platform that runs on its caller's
    /// thread (a bridge's host side, driven by the driver's calls) serves the device
    /// meanwhile — its reads of host memory, the link's timers — for about that long at
    /// most, and returns early once it finds nothing to do. True if anything happened. By
    /// default nothing: a platform with a thread of its own.
    fn serve_for(&mut self, budget: Duration) -> bool {
        let _ = budget;
        false
    }
    /// Waits until vector `vector` fired (consuming one occurrence) or `timeout` passed.
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool;
    /// Why the device is gone, once it is (a surprise removal: its reads return all-ones from
    /// then on). A driver's waits end at once with this reason. `None` for a platform whose
    /// devices cannot vanish.
    fn removed(&self) -> Option<String> {
        None
    }
    /// A count that moves whenever the platform hears from the device: frames its link
    /// received, TLPs it carried. A driver's wait goes on while it moves — a lossy link that
    /// recovers slowly is still a link — and gives up only once it stood still for the
    /// driver's stall timeout or at the driver's ceiling. `0` for a platform that cannot
    /// tell (the wait then ends after the stall timeout, as a fixed timeout would).
    fn progress(&self) -> u64 {
        0
    }
}

/// Where x86 platforms decode MSI writes (the Local APIC's window): the address every
/// platform here gives a driver for its MSI-X table, the vector number as the data.
pub const MSI_BASE: u64 = 0xfee0_0000;

/// The DMA memory a platform hands out: one region at `base` on the bus, given out in
/// 64-byte-aligned pieces from its start, zeroed as they go, never taken back (a driver
/// allocates its rings and buffers once, at open). The platform keeps the bytes (a vector,
/// a mapping, a window a VMM shared); the arena says which of them a buffer is.
#[derive(Clone, Debug)]
pub struct DmaArena {
    base: BusAddr,
    len: usize,
    next: usize,
}

impl DmaArena {
    /// An arena of `len` bytes at bus address `base`.
    pub fn new(base: BusAddr, len: usize) -> DmaArena {
        DmaArena { base, len, next: 0 }
    }

    /// Where the arena begins on the bus.
    pub fn base(&self) -> BusAddr {
        self.base
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next `len` bytes, 64-byte aligned: the buffer and where its bytes lie in the
    /// platform's memory (for it to zero). `None` once the arena cannot hold them.
    pub fn alloc(&mut self, len: usize) -> Option<(DmaBuf, Range<usize>)> {
        let start = self.next.checked_next_multiple_of(64)?;
        let end = start.checked_add(len)?;
        if end > self.len {
            return None;
        }
        self.next = end;
        Some((DmaBuf { bus: self.base + start as u64, len }, start..end))
    }

    /// [`DmaArena::alloc`] from `memory`, the arena's bytes, zeroing the piece.
    pub fn alloc_zeroed(&mut self, memory: &mut [u8], len: usize) -> Option<DmaBuf> {
        let (buf, at) = self.alloc(len)?;
        memory.get_mut(at)?.fill(0);
        Some(buf)
    }

    /// Reads `out.len()` bytes at `offset` into `buf` from `memory`, the arena's bytes:
    /// all-ones where they lie outside it, as a read of nothing returns on a bus.
    pub fn read(&self, memory: &[u8], buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        match self.range(buf, offset, out.len()).and_then(|at| memory.get(at)) {
            Some(m) => out.copy_from_slice(m),
            None => out.fill(0xff),
        }
    }

    /// Writes `data` at `offset` into `buf` in `memory`; nothing if any of it lies outside.
    pub fn write(&self, memory: &mut [u8], buf: &DmaBuf, offset: usize, data: &[u8]) {
        if let Some(m) = self.range(buf, offset, data.len()).and_then(|at| memory.get_mut(at)) {
            m.copy_from_slice(data);
        }
    }

    /// Where `len` bytes at `offset` into `buf` lie in the platform's memory, or `None` if
    /// any of them lie outside the arena.
    pub fn range(&self, buf: &DmaBuf, offset: usize, len: usize) -> Option<Range<usize>> {
        let start = buf.bus.offset_from(self.base)?.checked_add(offset as u64)?;
        let end = start.checked_add(len as u64)?;
        (end <= self.len as u64).then_some(start as usize..end as usize)
    }
}

/// The most vectors a function has (MSI-X Table Size is 11 bits, PCIe 6.0 §7.7.2.2).
pub const MAX_VECTORS: u16 = 2048;

/// Interrupts that arrived and were not yet waited for, by vector.
#[derive(Clone, Debug, Default)]
pub struct Interrupts {
    pending: Vec<u64>,
    received: u64,
    beyond: u64,
}

impl Interrupts {
    /// `n` occurrences of `vector` arrived. A vector no function can have (the message data
    /// came from the device, or across the network) is counted apart and dropped, so that
    /// the table never grows past [`MAX_VECTORS`] entries.
    pub fn signal(&mut self, vector: u16, n: u64) {
        if vector >= MAX_VECTORS {
            self.beyond += n;
            return;
        }
        let v = vector as usize;
        if self.pending.len() <= v {
            self.pending.resize(v + 1, 0);
        }
        self.pending[v] += n;
        self.received += n;
    }

    /// Consumes one occurrence of `vector`, if one is pending.
    pub fn take(&mut self, vector: u16) -> bool {
        match self.pending.get_mut(vector as usize) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    /// Every occurrence seen since the platform opened.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// Messages for vectors beyond [`MAX_VECTORS`], dropped.
    pub fn beyond(&self) -> u64 {
        self.beyond
    }
}

/// What one step of an interrupt wait found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStep {
    /// The vector fired (one occurrence consumed).
    Fired,
    /// It never will: the device is gone or the wait was cancelled.
    Gone,
    /// Nothing happened within the step (it slept or polled for up to the time given).
    Idle,
    /// The platform made progress (it moved TLPs): the wait goes on even past its timeout,
    /// as a simulated device's time only passes while it works.
    Busy,
}

/// The one interrupt wait every platform runs: `step(left)` looks whether the vector fired
/// and otherwise lets the platform make progress for at most `left`; the wait ends when it
/// fires (`true`), when it cannot (`false`), or once `timeout` passed with the platform
/// idle (`false`).
pub fn wait_interrupt(timeout: Duration, mut step: impl FnMut(Duration) -> WaitStep) -> bool {
    let start = Instant::now();
    loop {
        let left = timeout.saturating_sub(start.elapsed());
        match step(left) {
            WaitStep::Fired => return true,
            WaitStep::Gone => return false,
            WaitStep::Busy => {}
            WaitStep::Idle if start.elapsed() >= timeout => return false,
            WaitStep::Idle => {}
        }
    }
}

/// Walks the capability list for capability `id` (PCI 0x01 Power Management, 0x10 PCI
/// Express, 0x11 MSI-X, …); its config offset.
pub fn find_capability<P: PciFunction>(pci: &mut P, id: u8) -> Option<u16> {
    let mut at = (pci.config_read(0x34) & 0xfc) as u16;
    for _ in 0..48 {
        if at == 0 {
            return None;
        }
        let h = pci.config_read(at);
        if h & 0xff == id as u32 {
            return Some(at);
        }
        at = ((h >> 8) & 0xfc) as u16;
    }
    None
}

/// Where a function's MSI-X table lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixTableInfo {
    /// The BAR that holds it.
    pub bar: usize,
    /// Its offset in that BAR.
    pub offset: u64,
    /// Its entries (vectors).
    pub vectors: u32,
}

impl MsixTableInfo {
    /// Bytes the table spans (16 per entry).
    pub fn bytes(&self) -> u64 {
        self.vectors as u64 * 16
    }
}

/// The function's MSI-X table, from its MSI-X capability (PCI 3.0 §6.8.2).
pub fn msix_table<P: PciFunction>(pci: &mut P) -> Option<MsixTableInfo> {
    let cap = find_capability(pci, 0x11)?;
    let control = pci.config_read(cap) >> 16;
    let table = pci.config_read(cap + 4);
    Some(MsixTableInfo {
        bar: (table & 7) as usize,
        offset: (table & !7) as u64,
        vectors: (control & 0x7ff) + 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_gives_aligned_pieces_until_it_is_full() {
        let mut a = DmaArena::new(BusAddr(0x1_0000_0000), 256);
        let (b1, r1) = a.alloc(10).unwrap();
        assert_eq!((b1.bus, r1), (BusAddr(0x1_0000_0000), 0..10));
        let (b2, r2) = a.alloc(100).unwrap();
        assert_eq!((b2.bus, r2), (BusAddr(0x1_0000_0040), 64..164));
        assert!(a.alloc(100).is_none(), "192 + 100 > 256");
        assert_eq!(a.alloc(64).map(|(b, _)| b.bus), Some(BusAddr(0x1_0000_00c0)));
        assert!(a.alloc(1).is_none());
        assert!(a.alloc(usize::MAX).is_none());
    }

    #[test]
    fn a_range_outside_the_arena_is_none() {
        let mut a = DmaArena::new(BusAddr(0x1000), 128);
        let (b, _) = a.alloc(64).unwrap();
        assert_eq!(a.range(&b, 8, 8), Some(8..16));
        assert_eq!(a.range(&b, 64, 64), Some(64..128));
        assert_eq!(a.range(&b, 65, 64), None);
        assert_eq!(a.range(&b, usize::MAX, 1), None);
        let below = DmaBuf { bus: BusAddr(0xfff), len: 1 };
        assert_eq!(a.range(&below, 0, 1), None);
    }

    #[test]
    fn reads_outside_the_arena_are_all_ones_and_writes_there_do_nothing() {
        let mut mem = vec![7u8; 128];
        let mut a = DmaArena::new(BusAddr(0x1000), 128);
        let b = a.alloc_zeroed(&mut mem, 64).unwrap();
        a.write(&mut mem, &b, 60, &[1, 2, 3, 4]);
        a.write(&mut mem, &b, 126, &[9, 9, 9, 9]);
        let mut out = [0u8; 6];
        a.read(&mem, &b, 58, &mut out);
        assert_eq!(out, [0, 0, 1, 2, 3, 4]);
        a.read(&mem, &b, 126, &mut out);
        assert_eq!(out, [0xff; 6]);
        assert_eq!(&mem[124..], &[7, 7, 7, 7], "the write past the end left memory alone");
    }

    #[test]
    fn interrupts_are_consumed_one_at_a_time() {
        let mut i = Interrupts::default();
        assert!(!i.take(3));
        i.signal(3, 2);
        assert!(i.take(3) && i.take(3) && !i.take(3));
        assert_eq!(i.received(), 2);
        i.signal(MAX_VECTORS, 1);
        i.signal(u16::MAX, 1);
        assert!(!i.take(u16::MAX));
        assert_eq!((i.beyond(), i.pending.len()), (2, 4), "no table entry for a vector no function has");
    }

    #[test]
    fn a_wait_ends_on_fire_gone_or_idle_timeout_never_while_busy() {
        let mut n = 0;
        assert!(wait_interrupt(Duration::ZERO, |_| {
            n += 1;
            if n < 5 { WaitStep::Busy } else { WaitStep::Fired }
        }));
        assert_eq!(n, 5, "a busy platform is not timed out");
        assert!(!wait_interrupt(Duration::from_secs(60), |_| WaitStep::Gone));
        let t = Instant::now();
        assert!(!wait_interrupt(Duration::from_millis(20), |left| {
            std::thread::sleep(left.min(Duration::from_millis(5)));
            WaitStep::Idle
        }));
        assert!(t.elapsed() >= Duration::from_millis(20));
    }
}
