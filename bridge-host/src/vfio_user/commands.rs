//! What each client message does (see the module above for the list): the replies to
//! VERSION, DEVICE_GET_INFO, REGION_INFO, IRQ_INFO; DMA_MAP / DMA_UNMAP as DMA windows;
//! SET_IRQS as eventfd routes and MSI-X table entries programmed in the device; REGION_READ /
//! REGION_WRITE as config and BAR accesses; DEVICE_RESET.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;

use super::channel::Message;
use super::memory::{ClientDma, map_client_file};
use super::proto::{self, Caps, Request, cmd, errno, irq, region};
use super::{
    CONFIG_SIZE, ClientState, Counters, MAX_DATA_XFER, MAX_DMA_MAPS, MAX_MSG_FDS, VfioUserServer, bump, lock,
};
use crate::{Access, BusAddr, MSI_BASE};

impl VfioUserServer {
    /// Writes MSI-X table entry `v` of the device: the host endpoint's interrupt window, the
    /// vector as data, masked or not.
    pub(super) fn program_vector(&self, v: u32, masked: bool) {
        let Some(m) = self.msix else { return };
        let addr = MSI_BASE;
        let mut e = [0u8; 16];
        e[0..4].copy_from_slice(&(addr as u32).to_le_bytes());
        e[4..8].copy_from_slice(&((addr >> 32) as u32).to_le_bytes());
        e[8..12].copy_from_slice(&v.to_le_bytes());
        e[12..16].copy_from_slice(&(masked as u32).to_le_bytes());
        let _ = self.device.bar_write(m.bar, m.offset + 16 * v as u64, &e);
    }

    /// Programs every vector that has an eventfd (after the device may have lost its table).
    pub(super) fn program_routed(&self) {
        let routed: Vec<(u32, bool)> = {
            let r = lock(&self.routes);
            r.msix
                .iter()
                .zip(&r.masked)
                .enumerate()
                .filter(|(_, (fd, _))| fd.is_some())
                .map(|(v, (_, m))| (v as u32, *m))
                .collect()
        };
        self.program_vectors(&routed);
    }

    /// Writes table entries, with the routes' lock not held (see `set_irqs`).
    pub(super) fn program_vectors(&self, entries: &[(u32, bool)]) {
        for &(v, masked) in entries {
            self.program_vector(v, masked);
        }
    }

    pub(super) fn handle(&mut self, s: &mut ClientState, m: Message) -> Option<Vec<u8>> {
        let h = m.header;
        bump(&self.counters.commands);
        let answer = |r: Result<Vec<u8>, u32>, counters: &Counters| -> Option<Vec<u8>> {
            match r {
                Ok(p) => (!h.no_reply()).then(|| proto::reply(&h, &p)),
                Err(e) => {
                    bump(&counters.errors);
                    Some(proto::error_reply(&h, e))
                }
            }
        };
        if !h.is_command() {
            log::warn!(
                "vfio-user {}: reply {} to nothing asked; dropped",
                self.socket.path().display(),
                h.id
            );
            return None;
        }
        let req = match proto::parse_request(h.command, &m.payload, MAX_DATA_XFER) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("vfio-user {}: {e}", self.socket.path().display());
                return answer(Err(errno::EINVAL), &self.counters);
            }
        };
        let expects_fds = matches!(req, Request::DmaMap { .. } | Request::SetIrqs { .. });
        if !m.fds.is_empty() && !expects_fds {
            log::warn!(
                "vfio-user {}: {} came with file descriptors",
                self.socket.path().display(),
                cmd::name(h.command)
            );
            return answer(Err(errno::EINVAL), &self.counters);
        }
        if !s.version && !matches!(req, Request::Version { .. }) {
            log::warn!("vfio-user {}: {} before VERSION", self.socket.path().display(), cmd::name(h.command));
            return answer(Err(errno::EINVAL), &self.counters);
        }
        let r = match req {
            Request::Version { major, minor, caps } => self.version(s, major, minor, &caps),
            Request::DmaMap { flags, offset, address, size } => {
                self.dma_map(s, flags, offset, address, size, m.fds)
            }
            Request::DmaUnmap { address, size, flags, .. } => {
                self.dma_unmap(address, size, flags, &m.payload)
            }
            Request::DeviceGetInfo { argsz } => {
                if argsz < 16 {
                    Err(errno::EINVAL)
                } else {
                    Ok(proto::device_info(
                        proto::DEVICE_FLAGS_RESET | proto::DEVICE_FLAGS_PCI,
                        region::COUNT,
                        irq::COUNT,
                    ))
                }
            }
            Request::RegionInfo { argsz, index } => self.region_info(argsz, index),
            Request::IrqInfo { argsz, index } => self.irq_info(argsz, index),
            Request::SetIrqs { flags, index, start, count, data } => {
                self.set_irqs(flags, index, start, count, data, m.fds)
            }
            Request::RegionRead { offset, region, count } => {
                let mut buf = vec![0u8; count as usize];
                self.region_access(region, offset, Access::Read(&mut buf))
                    .map(|()| proto::region_read_reply(offset, region, &buf))
            }
            Request::RegionWrite { offset, region, data } => self
                .region_access(region, offset, Access::Write(data))
                .map(|()| proto::region_write_reply(offset, region, data.len() as u32)),
            Request::RegionWriteMulti { writes } => self.region_write_multi(&writes),
            Request::DeviceReset => {
                self.reset_device();
                self.program_routed();
                Ok(Vec::new())
            }
            Request::Unsupported { command } => {
                log::debug!(
                    "vfio-user {}: {} ({command}) not implemented",
                    self.socket.path().display(),
                    cmd::name(command)
                );
                Err(if command == cmd::DEVICE_FEATURE { errno::ENOTSUP } else { errno::ENOSYS })
            }
        };
        answer(r, &self.counters)
    }

    /// VERSION: this server speaks 0.1; the client's data size is kept, ours answered.
    fn version(&self, s: &mut ClientState, major: u16, minor: u16, caps: &Caps) -> Result<Vec<u8>, u32> {
        if major != 0 {
            log::warn!(
                "vfio-user {}: client speaks version {major}.{minor}; this server 0.1",
                self.socket.path().display()
            );
            Err(errno::ENOTSUP)
        } else {
            s.version = true;
            lock(&s.chan).peer_max_xfer = caps.max_data_xfer_size;
            let ours = Caps {
                max_msg_fds: MAX_MSG_FDS,
                max_data_xfer_size: MAX_DATA_XFER,
                max_dma_maps: MAX_DMA_MAPS,
                pgsizes: 4096,
                write_multiple: true,
            };
            let mut p = Vec::new();
            p.extend_from_slice(&0u16.to_le_bytes());
            p.extend_from_slice(&minor.min(1).to_le_bytes());
            p.extend_from_slice(&ours.to_json());
            Ok(p)
        }
    }

    /// DMA_UNMAP: the mapping itself, or every mapping inside the range, or all of them.
    fn dma_unmap(&self, address: u64, size: u64, flags: u32, payload: &[u8]) -> Result<Vec<u8>, u32> {
        // The mapping itself, or (as VFIO's type1 IOMMU does, and QEMU relies on
        // when a vIOMMU address space goes away) every mapping inside the range;
        // VFIO_DMA_UNMAP_FLAG_ALL (2): all of them.
        let removed = if flags & 2 != 0 {
            self.device.unmap_range(BusAddr(0), u64::MAX)
        } else if let Ok(len) = usize::try_from(size)
            && self.device.unmap_window(BusAddr(address), Some(len)).is_ok()
        {
            1
        } else {
            self.device.unmap_range(BusAddr(address), size)
        };
        if removed > 0 {
            Ok(payload[..24].to_vec())
        } else {
            log::debug!(
                "vfio-user {}: DMA_UNMAP of {address:#x}+{size:#x}: not mapped",
                self.socket.path().display()
            );
            Err(errno::ENOENT)
        }
    }

    /// REGION_WRITE_MULTI: the writes in order, until one fails; the count done.
    fn region_write_multi(&mut self, writes: &[proto::SmallWrite]) -> Result<Vec<u8>, u32> {
        let mut done = 0u64;
        let mut r = Ok(());
        for w in writes {
            r = self.region_access(w.region, w.offset, Access::Write(&w.data[..w.count as usize]));
            if r.is_err() {
                break;
            }
            done += 1;
        }
        r.map(|()| done.to_le_bytes().to_vec())
    }

    pub(super) fn dma_map(
        &mut self,
        s: &ClientState,
        flags: u32,
        offset: u64,
        address: u64,
        size: u64,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Vec<u8>, u32> {
        let (read, write) = (flags & proto::DMA_READABLE != 0, flags & proto::DMA_WRITEABLE != 0);
        let page = 4096;
        let bad = size == 0
            || !address.is_multiple_of(page)
            || !size.is_multiple_of(page)
            || !offset.is_multiple_of(page)
            || address.checked_add(size).is_none()
            || flags & !(proto::DMA_READABLE | proto::DMA_WRITEABLE) != 0
            || fds.len() > 1;
        if bad {
            log::warn!(
                "vfio-user {}: DMA_MAP {address:#x}+{size:#x} (offset {offset:#x}, flags {flags:#x}, {} fds) refused",
                self.socket.path().display(),
                fds.len()
            );
            return Err(errno::EINVAL);
        }
        let Ok(len) = usize::try_from(size) else { return Err(errno::EINVAL) };
        if self.device.window_count() >= MAX_DMA_MAPS as usize {
            log::warn!(
                "vfio-user {}: DMA_MAP: {MAX_DMA_MAPS} windows already mapped",
                self.socket.path().display()
            );
            return Err(errno::ENOSPC);
        }
        let added = match fds.pop() {
            Some(fd) => match map_client_file(fd, offset, len, write) {
                Ok(Some(mem)) => self.device.map_window(BusAddr(address), mem, read, write),
                Ok(None) => {
                    log::warn!(
                        "vfio-user {}: DMA_MAP {address:#x}+{size:#x}: the client's file is not a memfd sealed \
                         against shrinking (F_SEAL_SHRINK), so it is not mapped here (a truncation would crash \
                         this process); the device reaches it through DMA_READ / DMA_WRITE messages, slower",
                        self.socket.path().display()
                    );
                    let io = ClientDma { chan: s.chan.clone(), counters: self.counters.clone() };
                    self.device.map_client_window(BusAddr(address), len, Box::new(io), read, write)
                }
                Err(e) => {
                    log::warn!(
                        "vfio-user {}: DMA_MAP {address:#x}+{size:#x}: cannot map the client's file at {offset:#x}: {e}",
                        self.socket.path().display()
                    );
                    return Err(e.raw_os_error().map_or(errno::EINVAL, |n| n as u32));
                }
            },
            None => {
                let io = ClientDma { chan: s.chan.clone(), counters: self.counters.clone() };
                self.device.map_client_window(BusAddr(address), len, Box::new(io), read, write)
            }
        };
        match added {
            Ok(()) => Ok(Vec::new()),
            Err(why) => {
                log::warn!("vfio-user {}: DMA_MAP: {why}", self.socket.path().display());
                Err(errno::EEXIST)
            }
        }
    }

    pub(super) fn region_info(&self, argsz: u32, index: u32) -> Result<Vec<u8>, u32> {
        if argsz < 32 || index >= region::COUNT {
            return Err(errno::EINVAL);
        }
        let rw = region::FLAG_READ | region::FLAG_WRITE;
        let offset = (index as u64) << 40;
        let (flags, size) = match index {
            region::CONFIG => (rw, CONFIG_SIZE),
            i if i < region::ROM => {
                let b = self.device.bars()[i as usize];
                if b.memory && b.size != 0 { (rw, b.size) } else { (0, 0) }
            }
            _ => (0, 0),
        };
        Ok(proto::region_info(index, flags, size, offset))
    }

    pub(super) fn irq_info(&self, argsz: u32, index: u32) -> Result<Vec<u8>, u32> {
        if argsz < 16 || index >= irq::COUNT {
            return Err(errno::EINVAL);
        }
        let (flags, count) = match index {
            irq::MSIX => (irq::INFO_EVENTFD | irq::INFO_MASKABLE, self.msix.map_or(0, |m| m.vectors)),
            irq::ERR => (irq::INFO_EVENTFD, self.pcie_cap.is_some() as u32),
            _ => (irq::INFO_EVENTFD, 0),
        };
        Ok(proto::irq_info(index, flags, count))
    }

    pub(super) fn set_irqs(
        &mut self,
        flags: u32,
        index: u32,
        start: u32,
        count: u32,
        data: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<Vec<u8>, u32> {
        let data_kind = flags & (irq::DATA_NONE | irq::DATA_BOOL | irq::DATA_EVENTFD);
        let action = flags & (irq::ACTION_MASK | irq::ACTION_UNMASK | irq::ACTION_TRIGGER);
        if data_kind.count_ones() != 1 || action.count_ones() != 1 || flags & !0x3f != 0 {
            return Err(errno::EINVAL);
        }
        if data_kind != irq::DATA_EVENTFD && !fds.is_empty() {
            return Err(errno::EINVAL);
        }
        let vectors = if index == irq::MSIX { self.msix.map_or(0, |m| m.vectors) } else { 0 };
        if index >= irq::COUNT {
            return Err(errno::EINVAL);
        }
        if index == irq::ERR && self.pcie_cap.is_some() {
            return self.set_err_irq(data_kind, action, start, count, fds);
        }
        // Lock order: the device's state, then the routes (the interrupt sink runs inside
        // the device and takes the routes). So the routes are changed under their lock and
        // the device's table written after it is released.
        let mut program: Vec<(u32, bool)> = Vec::new();
        // count 0 with DATA_NONE and TRIGGER: everything of this index off.
        if count == 0 && data_kind == irq::DATA_NONE && action == irq::ACTION_TRIGGER {
            if index == irq::MSIX {
                let mut r = lock(&self.routes);
                for v in 0..vectors {
                    if r.msix[v as usize].take().is_some() {
                        program.push((v, true));
                    }
                }
                r.masked.iter_mut().for_each(|m| *m = false);
            }
            self.program_vectors(&program);
            return Ok(Vec::new());
        }
        let end = start.checked_add(count).ok_or(errno::EINVAL)?;
        if end > vectors || count == 0 {
            return Err(errno::EINVAL);
        }
        let chosen = |i: u32| data_kind != irq::DATA_BOOL || data[i as usize] != 0;
        {
            let mut r = lock(&self.routes);
            match (data_kind, action) {
                (irq::DATA_EVENTFD, irq::ACTION_TRIGGER) => {
                    if fds.is_empty() {
                        for v in start..end {
                            r.msix[v as usize] = None;
                            program.push((v, true));
                        }
                    } else if fds.len() == count as usize {
                        for (v, fd) in (start..end).zip(fds) {
                            r.msix[v as usize] = Some(File::from(fd));
                            program.push((v, r.masked[v as usize]));
                        }
                    } else {
                        return Err(errno::EINVAL);
                    }
                }
                (irq::DATA_EVENTFD, _) => return Err(errno::ENOTSUP),
                (_, irq::ACTION_MASK | irq::ACTION_UNMASK) => {
                    let mask = action == irq::ACTION_MASK;
                    for v in (start..end).filter(|&i| chosen(i - start)) {
                        r.masked[v as usize] = mask;
                        if r.msix[v as usize].is_some() {
                            program.push((v, mask));
                        }
                    }
                }
                _ => {
                    for v in (start..end).filter(|&i| chosen(i - start)) {
                        r.fire(v);
                    }
                }
            }
        }
        self.program_vectors(&program);
        Ok(Vec::new())
    }

    /// SET_IRQS for the error notifier: one eventfd, triggered by the server (or the client).
    pub(super) fn set_err_irq(
        &mut self,
        data_kind: u32,
        action: u32,
        start: u32,
        count: u32,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Vec<u8>, u32> {
        let mut r = lock(&self.routes);
        match (data_kind, action, start, count) {
            (irq::DATA_NONE, irq::ACTION_TRIGGER, 0, 0) => r.err = None,
            (irq::DATA_EVENTFD, irq::ACTION_TRIGGER, 0, 1) if fds.len() <= 1 => {
                r.err = fds.pop().map(File::from);
                r.err_signalled = false;
            }
            (irq::DATA_NONE | irq::DATA_BOOL, irq::ACTION_TRIGGER, 0, 1) => {
                if let Some(f) = r.err.as_mut() {
                    let _ = f.write(&1u64.to_ne_bytes());
                }
            }
            _ => return Err(errno::EINVAL),
        }
        Ok(Vec::new())
    }

    /// Tells the client, once, through its error notifier that the device is gone.
    pub(super) fn report_removal(&self) {
        let Some(why) = self.device.removed() else { return };
        let mut r = lock(&self.routes);
        if r.err_signalled {
            return;
        }
        r.err_signalled = true;
        if let Some(f) = r.err.as_mut() {
            let _ = f.write(&1u64.to_ne_bytes());
            log::error!(
                "vfio-user {}: device removed ({why}); error notifier signalled",
                self.socket.path().display()
            );
        }
    }

    pub(super) fn region_access(&mut self, index: u32, offset: u64, access: Access<'_>) -> Result<(), u32> {
        let len = match &access {
            Access::Read(b) => b.len(),
            Access::Write(b) => b.len(),
        } as u64;
        if index == region::CONFIG {
            if offset.checked_add(len).is_none_or(|e| e > CONFIG_SIZE) {
                return Err(errno::EINVAL);
            }
            match access {
                Access::Read(b) => self.device.config_read_bytes(offset as u16, b),
                Access::Write(b) => {
                    self.device.config_write_bytes(offset as u16, b);
                    // The table only takes writes while Memory Space is enabled, and a reset
                    // clears it: program it again whenever Command or MSI-X Message Control
                    // is written.
                    let touches = |at: u64, n: u64| offset < at + n && at < offset + len;
                    let control = self.msix_cap.is_some_and(|c| touches(c as u64 + 2, 2));
                    if touches(0x04, 2) || control {
                        self.program_routed();
                    }
                }
            }
        } else if index < region::ROM {
            let done = match access {
                Access::Read(b) => self.device.bar_read(index as usize, offset, b),
                Access::Write(b) => self.device.bar_write(index as usize, offset, b),
            };
            if let Err(e) = done {
                log::debug!("vfio-user {}: region access refused: {e}", self.socket.path().display());
                return Err(errno::EINVAL);
            }
        } else {
            return Err(errno::EINVAL);
        }
        if let Some(why) = self.device.removed() {
            self.logged_failures += 1;
            let n = self.logged_failures;
            if n <= 4 || n.is_power_of_two() {
                log::warn!(
                    "vfio-user {}: access to region {index} at {offset:#x} failed (reads return all-ones): device removed: {why} ({n} so far)",
                    self.socket.path().display()
                );
            }
        }
        Ok(())
    }
}
