//! DMA windows: the host memory a remote device may reach, by bus address. The device's
//! reads and writes are served only inside a window that allows them; anything else is
//! refused (a read answered with Unsupported Request, a write dropped), counted and logged
//! — the first 16 and then at powers of two, so a misbehaving device cannot flood the log.
//! The DMA arena `dma_alloc` hands out is one window, granted at attach and never revoked.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io;

use driver::{DmaArena, DmaBuf};
use tlp::rules::{self, Rcb, TransferSize};
use tlp::{Bdf, Body, TlpRepr};

use crate::addr::BusAddr;
use crate::error::HostError;
use crate::stats::HostStats;

/// Bus address of the DMA arena.
pub const DMA_ARENA_BASE: u64 = 0x1_0000_0000;

/// Memory that lives with a client elsewhere (a VMM's guest memory it did not share as a
/// file), reached through messages rather than loads and stores.
pub trait ClientMemory: Send {
    /// Reads `out.len()` bytes at bus address `addr`.
    fn read(&mut self, addr: BusAddr, out: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at bus address `addr`.
    fn write(&mut self, addr: BusAddr, data: &[u8]) -> io::Result<()>;
}

/// What backs a DMA window.
enum Memory {
    /// Mapped into this process.
    Local(memmap2::MmapMut),
    /// Reached through the client ([`ClientMemory`]).
    Client { len: usize, io: Box<dyn ClientMemory> },
}

impl Memory {
    fn len(&self) -> usize {
        match self {
            Memory::Local(m) => m.len(),
            Memory::Client { len, .. } => *len,
        }
    }
}

/// A DMA window: host memory the device may reach, at a bus address.
struct Window {
    bus: BusAddr,
    mem: Memory,
    read: bool,
    write: bool,
}

impl Window {
    fn end(&self) -> BusAddr {
        self.bus + self.mem.len() as u64
    }
    fn contains(&self, addr: BusAddr, len: usize) -> bool {
        addr >= self.bus && addr.checked_add(len as u64).is_some_and(|e| e <= self.end())
    }
}

/// The windows granted to one device.
pub(crate) struct DmaWindows {
    /// By bus address (a VMM with a vIOMMU grants thousands of pages).
    windows: BTreeMap<BusAddr, Window>,
    /// The arena's allocator, if there is an arena (its window starts at its base).
    arena: Option<DmaArena>,
    /// Who the log lines are about: the device's name and host-view BDF.
    who: String,
    logged_refusals: u64,
}

impl DmaWindows {
    /// The windows of device `who`, with `arena` (if any) granted at [`DMA_ARENA_BASE`].
    pub(crate) fn new(arena: Option<memmap2::MmapMut>, who: String) -> DmaWindows {
        let mut w = DmaWindows { windows: BTreeMap::new(), arena: None, who, logged_refusals: 0 };
        if let Some(mem) = arena {
            let base = BusAddr(DMA_ARENA_BASE);
            w.arena = Some(DmaArena::new(base, mem.len()));
            w.windows.insert(base, Window { bus: base, mem: Memory::Local(mem), read: true, write: true });
        }
        w
    }

    fn is_arena(&self, bus: BusAddr) -> bool {
        self.arena.as_ref().is_some_and(|a| a.base() == bus)
    }

    /// Grants a window of local memory.
    pub(crate) fn map(
        &mut self,
        bus: BusAddr,
        mem: memmap2::MmapMut,
        read: bool,
        write: bool,
    ) -> Result<(), HostError> {
        self.add(Window { bus, mem: Memory::Local(mem), read, write })
    }

    /// Grants a window of client memory.
    pub(crate) fn map_client(
        &mut self,
        bus: BusAddr,
        len: usize,
        io: Box<dyn ClientMemory>,
        read: bool,
        write: bool,
    ) -> Result<(), HostError> {
        self.add(Window { bus, mem: Memory::Client { len, io }, read, write })
    }

    fn add(&mut self, w: Window) -> Result<(), HostError> {
        let (bus, len) = (w.bus, w.mem.len());
        let end = bus.checked_add(len as u64).ok_or(HostError::WindowWraps { bus, len })?;
        if len == 0 {
            return Err(HostError::WindowEmpty { bus });
        }
        // The last window starting below `end` is the only one that can overlap.
        if let Some((_, o)) = self.windows.range(..end).next_back()
            && o.end() > bus
        {
            return Err(HostError::WindowOverlaps { bus, end, other: o.bus, other_end: o.end() });
        }
        self.windows.insert(bus, w);
        Ok(())
    }

    /// Revokes the window that starts at `bus` and is `len` bytes long (any length if
    /// `None`); the arena cannot be revoked.
    pub(crate) fn unmap(&mut self, bus: BusAddr, len: Option<usize>) -> Result<(), HostError> {
        let found = self.windows.get(&bus).is_some_and(|w| len.is_none_or(|l| l == w.mem.len()));
        if !found || self.is_arena(bus) {
            return Err(HostError::NoWindow { bus, len });
        }
        self.windows.remove(&bus);
        Ok(())
    }

    /// Revokes every window that lies wholly inside `bus..bus + len`, the arena excepted;
    /// how many.
    pub(crate) fn unmap_range(&mut self, bus: BusAddr, len: u64) -> usize {
        let end = BusAddr(bus.get().saturating_add(len));
        let inside: Vec<BusAddr> = self
            .windows
            .range(bus..end)
            .filter(|(b, w)| w.end() <= end && !self.is_arena(**b))
            .map(|(b, _)| *b)
            .collect();
        for b in &inside {
            self.windows.remove(b);
        }
        inside.len()
    }

    /// Revokes every window but the arena.
    pub(crate) fn unmap_all(&mut self) {
        let arena = self.arena.as_ref().map(DmaArena::base);
        self.windows.retain(|bus, _| Some(*bus) == arena);
    }

    /// How many windows are granted (the arena included).
    pub(crate) fn len(&self) -> usize {
        self.windows.len()
    }

    /// Memory from the arena, not zeroed: the caller zeroes it (in steps, serving the link
    /// between them — see `RemoteDevice::dma_alloc`).
    pub(crate) fn reserve(&mut self, len: usize) -> Option<DmaBuf> {
        let arena = self.arena.as_mut()?;
        let w = self.windows.get(&arena.base())?;
        let Memory::Local(_) = &w.mem else { return None };
        arena.alloc(len).map(|(buf, _)| buf)
    }

    /// The window that holds `len` bytes at `addr` and allows the access.
    fn find(&mut self, addr: BusAddr, len: usize, write: bool) -> Option<&mut Window> {
        let (_, w) = self.windows.range_mut(..=addr).next_back()?;
        if !w.contains(addr, len) || (write && !w.write) || (!write && !w.read) {
            return None;
        }
        Some(w)
    }

    /// The local bytes at `addr` if a window holds them (a driver's view of its buffers).
    pub(crate) fn local(&mut self, addr: BusAddr, len: usize, write: bool) -> Option<&mut [u8]> {
        let w = self.find(addr, len, write)?;
        let off = addr.offset_from(w.bus)? as usize;
        match &mut w.mem {
            Memory::Local(m) => m.get_mut(off..off + len),
            Memory::Client { .. } => None,
        }
    }

    fn refused(&mut self, what: &str, addr: BusAddr, len: usize) {
        self.logged_refusals += 1;
        let n = self.logged_refusals;
        if n <= 16 || n.is_power_of_two() {
            log::warn!(
                "{}: device DMA {what} of {len} bytes at {addr} outside every granted window ({n} so far)",
                self.who
            );
        }
    }

    /// The device's memory write `t` (byte enables honoured), into a window that allows it;
    /// anything else is dropped and counted.
    pub(crate) fn write(&mut self, t: &TlpRepr<'_>, stats: &mut HostStats) {
        let Body::MemWrite { req, address, data, .. } = t.body else { return };
        let (addr, n) = (BusAddr(address.value()), data.len());
        let Some(w) = self.find(addr, n, true) else {
            stats.dma_write_dropped += 1;
            return self.refused("write", addr, n);
        };
        let off = (addr.get() - w.bus.get()) as usize;
        match &mut w.mem {
            Memory::Local(m) => {
                rules::write_enabled_bytes(&mut m[off..off + n], data, req.first_be, req.last_be)
            }
            Memory::Client { io, .. } => {
                // Only the enabled bytes: read what is there, merge, write back.
                let mut buf = vec![0u8; n];
                let full = req.first_be == 0xf && (req.last_be == 0xf || (n <= 4 && req.last_be == 0));
                if !full && io.read(addr, &mut buf).is_err() {
                    stats.dma_write_dropped += 1;
                    return;
                }
                rules::write_enabled_bytes(&mut buf, data, req.first_be, req.last_be);
                if let Err(e) = io.write(addr, &buf) {
                    stats.dma_write_dropped += 1;
                    log::warn!("{}: device DMA write of {n} bytes at {addr} failed: {e}", self.who);
                    return;
                }
            }
        }
        stats.dma_writes += 1;
        stats.dma_write_bytes += n as u64;
    }

    /// Serves the device's memory read `t` from a window that allows it: its completions,
    /// emitted from host memory, go to `send`. False if it cannot be served (outside every
    /// window, or the client's memory failed): the caller answers Unsupported Request.
    pub(crate) fn read(
        &mut self,
        t: &TlpRepr<'_>,
        completer: Bdf,
        max_payload: TransferSize,
        stats: &mut HostStats,
        send: impl FnMut(&TlpRepr<'_>),
    ) -> bool {
        let Body::MemRead { address, length_dw, .. } = t.body else { return false };
        let (addr, len) = (BusAddr(address.value()), length_dw as usize * 4);
        let Some(w) = self.find(addr, len, false) else {
            stats.dma_read_refused += 1;
            self.refused("read", addr, len);
            return false;
        };
        let off = (addr.get() - w.bus.get()) as usize;
        let client;
        let data = match &mut w.mem {
            Memory::Local(m) => &m[off..off + len],
            Memory::Client { io, .. } => {
                let mut buf = vec![0u8; len];
                if let Err(e) = io.read(addr, &mut buf) {
                    log::warn!("{}: device DMA read of {len} bytes at {addr} failed: {e}", self.who);
                    stats.dma_read_refused += 1;
                    return false;
                }
                client = buf;
                &client[..]
            }
        };
        rules::complete_read(t, completer, data, Rcb::B64, max_payload, send);
        stats.dma_reads += 1;
        stats.dma_read_bytes += len as u64;
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn mem(len: usize) -> memmap2::MmapMut {
        memmap2::MmapMut::map_anon(len).unwrap()
    }

    #[test]
    fn windows_that_overlap_wrap_or_are_empty_are_refused_with_their_addresses() {
        let mut w = DmaWindows::new(None, "gpu0".into());
        w.map(BusAddr(0x1000), mem(0x1000), true, true).unwrap();
        assert_eq!(
            w.map(BusAddr(0x1800), mem(0x1000), true, true),
            Err(HostError::WindowOverlaps {
                bus: BusAddr(0x1800),
                end: BusAddr(0x2800),
                other: BusAddr(0x1000),
                other_end: BusAddr(0x2000)
            })
        );
        assert!(w.map(BusAddr(0x2000), mem(0x1000), true, false).is_ok(), "adjacent is fine");
        assert_eq!(
            w.map(BusAddr(u64::MAX - 0xfff), mem(0x2000), true, true),
            Err(HostError::WindowWraps { bus: BusAddr(u64::MAX - 0xfff), len: 0x2000 })
        );
        assert_eq!(w.len(), 2);
        assert!(w.local(BusAddr(0x2000), 8, true).is_none(), "a read-only window refuses writes");
        assert!(w.local(BusAddr(0x1ffc), 8, false).is_none(), "an access across two windows is refused");
        assert!(w.local(BusAddr(0x1ff8), 8, false).is_some());
    }

    #[test]
    fn the_arena_is_never_revoked() {
        let mut w = DmaWindows::new(Some(mem(1 << 16)), "gpu0".into());
        let base = BusAddr(DMA_ARENA_BASE);
        assert_eq!(w.unmap(base, None), Err(HostError::NoWindow { bus: base, len: None }));
        assert_eq!(w.unmap_range(BusAddr(0), u64::MAX), 0);
        w.map(BusAddr(0x1000), mem(0x1000), true, true).unwrap();
        w.unmap_all();
        assert_eq!(w.len(), 1);
        let b = w.reserve(100).unwrap();
        assert_eq!(b.bus, base);
        assert_eq!(
            w.unmap(BusAddr(0x1000), Some(0x1000)),
            Err(HostError::NoWindow { bus: BusAddr(0x1000), len: Some(0x1000) })
        );
    }
}
