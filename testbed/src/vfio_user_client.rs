//! A vfio-user client that behaves toward a server as QEMU's `vfio-user-pci` does, and
//! offers the device to a driver as a [`PciFunction`]: the simgpu driver runs on it
//! unchanged. It exists to test and measure the server without a VMM (`tests/vfio_user.rs`,
//! `dxpu bench vfio-user`).
//!
//! Like QEMU it emulates the MSI-X table (the driver's writes to it never reach the server)
//! and takes interrupts on one eventfd per vector; "guest memory" is one region mapped at an
//! I/O virtual address, shared with the server as a memfd (sealed against resizing, as
//! QEMU's memfd backend does) or kept private, in which case the server reaches it with
//! DMA_READ / DMA_WRITE messages that this client answers while it waits for its replies.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use bridge_host::vfio_user::proto::{self, Header, cmd, errno, flags, irq, region};
use driver::{BusAddr, DmaArena, DmaBuf, Interrupts, PciFunction, WaitStep, wait_interrupt};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// A reply from the server.
#[derive(Clone, Debug)]
pub struct Reply {
    /// Its header.
    pub header: Header,
    /// Its payload.
    pub payload: Vec<u8>,
}

impl Reply {
    /// The errno of an error reply.
    pub fn error(&self) -> Option<u32> {
        (self.header.flags & flags::ERROR != 0).then_some(self.header.error)
    }
}

/// The client's "guest memory".
pub struct GuestMemory {
    /// Shared with the server as a file (else reached through DMA messages).
    pub shared: bool,
    /// I/O virtual address it is mapped at.
    pub iova: u64,
    /// Bytes.
    pub len: usize,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Makes a sealed memfd of `len` bytes and maps it.
#[allow(unsafe_code)]
pub fn sealed_memfd(len: usize) -> io::Result<(File, memmap2::MmapMut)> {
    let fd = rustix::fs::memfd_create(
        "dxpu-guest-memory",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    let f = File::from(fd);
    f.set_len(len as u64)?;
    rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW)?;
    // SAFETY: a memfd this process just made, sealed against shrinking; it is shared with
    // the server, and both sides only copy bytes in and out of it.
    let m = unsafe { memmap2::MmapMut::map_mut(&f) }?;
    Ok((f, m))
}

/// A vfio-user client for one device.
pub struct VfioUserClient {
    stream: UnixStream,
    next_id: u16,
    mem: memmap2::MmapMut,
    file: Option<File>,
    iova: u64,
    arena: DmaArena,
    bars: [(u64, u64); 6],
    msix_table: (u64, u64),
    eventfds: Vec<File>,
    interrupts: Interrupts,
    dma_messages: u64,
}

impl VfioUserClient {
    /// Connects to the server at `path` (nothing sent yet). `mem` is the guest memory the
    /// client will offer ([`VfioUserClient::dma_map`]).
    pub fn connect(path: &Path, mem: GuestMemory) -> io::Result<VfioUserClient> {
        let stream = UnixStream::connect(path)
            .map_err(|e| io::Error::new(e.kind(), format!("connecting to {}: {e}", path.display())))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let (file, map) = if mem.shared {
            let (f, m) = sealed_memfd(mem.len)?;
            (Some(f), m)
        } else {
            (None, memmap2::MmapMut::map_anon(mem.len)?)
        };
        Ok(VfioUserClient {
            stream,
            next_id: 0,
            mem: map,
            file,
            iova: mem.iova,
            arena: DmaArena::new(BusAddr(mem.iova), mem.len),
            bars: [(0, 0); 6],
            msix_table: (0, 0),
            eventfds: Vec::new(),
            interrupts: Interrupts::default(),
            dma_messages: 0,
        })
    }

    /// Connects and sets up as QEMU does: VERSION, the BARs' sizes and addresses, guest
    /// memory (DMA_MAP), MSI-X eventfds for every vector.
    pub fn open(path: &Path, mem: GuestMemory) -> io::Result<VfioUserClient> {
        let mut c = VfioUserClient::connect(path, mem)?;
        c.version()?;
        for i in 0..6u32 {
            let mut p = 32u32.to_le_bytes().to_vec();
            p.extend_from_slice(&[0; 4]);
            p.extend_from_slice(&i.to_le_bytes());
            p.extend_from_slice(&[0; 20]);
            let r = c.ok(cmd::DEVICE_GET_REGION_INFO, &p, &[])?;
            let size = r.get(16..24).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
            let dw = |c: &mut VfioUserClient, at: u64| -> io::Result<u32> {
                let b = c.region_read(region::CONFIG, at, 4)?;
                Ok(u32::from_le_bytes(b.try_into().unwrap_or([0; 4])))
            };
            let lo = dw(&mut c, 0x10 + 4 * i as u64)?;
            let hi = if i < 5 && lo & 4 != 0 { dw(&mut c, 0x14 + 4 * i as u64)? } else { 0 };
            let base = (hi as u64) << 32 | (lo & !0xf) as u64;
            c.bars[i as usize] = (base, size);
        }
        let (iova, len) = (c.iova, c.mem.len() as u64);
        let rw = proto::DMA_READABLE | proto::DMA_WRITEABLE;
        let file = c.file.take();
        let mapped = c.dma_map(file.as_ref().map(|f| f.as_fd()), iova, len, rw);
        c.file = file;
        mapped.map_err(|e| invalid(format!("DMA_MAP of the guest memory: errno {e}")))?;
        // MSI-X: where the table lies (the client emulates it), and one eventfd per vector.
        if let Some(t) = driver::msix_table(&mut c) {
            let n = t.vectors;
            c.msix_table = (c.bars.get(t.bar).map_or(0, |b| b.0) + t.offset, t.bytes());
            let fds: Vec<File> = (0..n)
                .map(|_| {
                    rustix::event::eventfd(
                        0,
                        rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
                    )
                    .map(File::from)
                })
                .collect::<Result<_, _>>()?;
            let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            c.set_irqs(irq::DATA_EVENTFD | irq::ACTION_TRIGGER, irq::MSIX, 0, n, &[], &borrowed)
                .map_err(|e| invalid(format!("SET_IRQS for {n} MSI-X vectors: errno {e}")))?;
            c.eventfds = fds;
        }
        Ok(c)
    }

    /// The socket (for tests that misbehave on purpose).
    pub fn stream(&self) -> &UnixStream {
        &self.stream
    }

    /// DMA_READ / DMA_WRITE messages answered so far.
    pub fn dma_messages(&self) -> u64 {
        self.dma_messages
    }

    /// A fresh message ID.
    pub fn next_id(&mut self) -> u16 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// Sends `bytes` with descriptors `fds` attached.
    pub fn send_raw(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(invalid(format!("{} descriptors do not fit one message", fds.len())));
        }
        let sent =
            rustix::net::sendmsg(&self.stream, &[IoSlice::new(bytes)], &mut control, SendFlags::empty())?;
        (&self.stream).write_all(&bytes[sent..])
    }

    /// Sends a command and returns its reply, answering the server's DMA commands that
    /// arrive first.
    pub fn call(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<Reply> {
        let id = self.next_id();
        self.send_raw(&proto::message(id, command, flags::COMMAND, 0, payload), fds)?;
        self.wait_reply(id)
    }

    /// The payload of a successful reply; an error reply is an error.
    pub fn ok(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<Vec<u8>> {
        let r = self.call(command, payload, fds)?;
        match r.error() {
            None => Ok(r.payload),
            Some(e) => Err(invalid(format!("{} failed: errno {e}", cmd::name(command)))),
        }
    }

    /// Reads one message.
    pub fn read_message(&mut self) -> io::Result<Reply> {
        let mut h = [0u8; proto::HEADER_LEN];
        self.stream.read_exact(&mut h)?;
        let header = Header::parse(&h);
        let body = (header.size as usize)
            .checked_sub(proto::HEADER_LEN)
            .ok_or_else(|| invalid(format!("message of {} bytes", header.size)))?;
        let mut payload = vec![0u8; body];
        self.stream.read_exact(&mut payload)?;
        Ok(Reply { header, payload })
    }

    /// Reads until the reply to `id`, answering DMA commands meanwhile.
    pub fn wait_reply(&mut self, id: u16) -> io::Result<Reply> {
        loop {
            let m = self.read_message()?;
            if m.header.is_reply() && m.header.id == id {
                return Ok(m);
            }
            if m.header.is_command() {
                self.serve_dma(&m)?;
            }
        }
    }

    /// Answers a DMA_READ / DMA_WRITE from the guest memory (EFAULT outside it).
    pub fn serve_dma(&mut self, m: &Reply) -> io::Result<()> {
        let p = &m.payload;
        let (addr, count) = match (p.get(0..8), p.get(8..16)) {
            (Some(a), Some(c)) => (
                u64::from_le_bytes(a.try_into().unwrap_or([0; 8])),
                u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as usize,
            ),
            _ => return self.send_raw(&proto::error_reply(&m.header, errno::EINVAL), &[]),
        };
        let at = addr
            .checked_sub(self.iova)
            .map(|a| a as usize)
            .filter(|a| a.checked_add(count).is_some_and(|e| e <= self.mem.len()));
        self.dma_messages += 1;
        let reply = match (m.header.command, at) {
            (cmd::DMA_READ, Some(at)) => {
                let mut r = proto::dma_read(addr, count as u64);
                r.extend_from_slice(&self.mem[at..at + count]);
                proto::reply(&m.header, &r)
            }
            (cmd::DMA_WRITE, Some(at)) if p.len() == 16 + count => {
                self.mem[at..at + count].copy_from_slice(&p[16..]);
                let mut r = addr.to_le_bytes().to_vec();
                r.extend_from_slice(&(count as u32).to_le_bytes());
                proto::reply(&m.header, &r)
            }
            _ => proto::error_reply(&m.header, errno::EFAULT),
        };
        self.send_raw(&reply, &[])
    }

    /// Answers the server's DMA commands that arrive within `wait`.
    pub fn pump(&mut self, wait: Duration) -> io::Result<()> {
        loop {
            let mut fds = [rustix::event::PollFd::new(&self.stream, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec {
                tv_sec: wait.as_secs() as i64,
                tv_nsec: wait.subsec_nanos() as i64,
            };
            if rustix::event::poll(&mut fds, Some(&ts))? == 0 {
                return Ok(());
            }
            let m = self.read_message()?;
            if m.header.is_command() {
                self.serve_dma(&m)?;
            }
        }
    }

    /// VERSION 0.1 with this client's capabilities; the server's, as JSON.
    pub fn version(&mut self) -> io::Result<serde_json::Value> {
        let mut p = vec![0, 0, 1, 0];
        p.extend_from_slice(br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}"#);
        p.push(0);
        let r = self.ok(cmd::VERSION, &p, &[])?;
        let json = r.get(4..).unwrap_or(&[]).split(|b| *b == 0).next().unwrap_or(&[]);
        serde_json::from_slice(json).map_err(|e| invalid(format!("VERSION reply: {e}")))
    }

    /// REGION_READ.
    pub fn region_read(&mut self, region: u32, offset: u64, count: u32) -> io::Result<Vec<u8>> {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&count.to_le_bytes());
        let r = self.ok(cmd::REGION_READ, &p, &[])?;
        r.get(16..16 + count as usize)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| invalid(format!("REGION_READ reply of {} bytes for {count}", r.len())))
    }

    /// REGION_WRITE.
    pub fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        self.ok(cmd::REGION_WRITE, &p, &[]).map(|_| ())
    }

    fn errno_of(r: io::Result<Reply>) -> Result<(), u32> {
        match r {
            Ok(r) => r.error().map_or(Ok(()), Err),
            Err(_) => Err(errno::EIO),
        }
    }

    /// DMA_MAP of `size` bytes at `address`, of `fd` at offset 0 if given.
    pub fn dma_map(
        &mut self,
        fd: Option<BorrowedFd<'_>>,
        address: u64,
        size: u64,
        fl: u32,
    ) -> Result<(), u32> {
        let mut p = 32u32.to_le_bytes().to_vec();
        p.extend_from_slice(&fl.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&address.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        Self::errno_of(self.call(cmd::DMA_MAP, &p, &fds))
    }

    /// DMA_UNMAP.
    pub fn dma_unmap(&mut self, address: u64, size: u64) -> Result<(), u32> {
        Self::errno_of(self.call(cmd::DMA_UNMAP, &dma_unmap_payload(address, size), &[]))
    }

    /// DEVICE_SET_IRQS.
    pub fn set_irqs(
        &mut self,
        fl: u32,
        index: u32,
        start: u32,
        count: u32,
        data: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), u32> {
        let mut p = (20 + data.len() as u32).to_le_bytes().to_vec();
        for v in [fl, index, start, count] {
            p.extend_from_slice(&v.to_le_bytes());
        }
        p.extend_from_slice(data);
        Self::errno_of(self.call(cmd::DEVICE_SET_IRQS, &p, fds))
    }

    /// Takes the signal of `vector`'s eventfd (or one a wait found there and counted); true
    /// if it had fired.
    pub fn signalled(&mut self, vector: usize) -> bool {
        let mut b = [0u8; 8];
        let now = self.eventfds.get_mut(vector).is_some_and(|f| f.read(&mut b).is_ok());
        // A wait for another vector (the driver looks for its error vector after every
        // fence) reads every eventfd and counts what it found.
        let earlier = u16::try_from(vector).is_ok_and(|v| self.interrupts.take(v));
        now || earlier
    }

    /// The guest memory.
    pub fn memory(&mut self) -> &mut [u8] {
        &mut self.mem
    }

    fn decode(&self, addr: u64, len: usize) -> Option<(u32, u64)> {
        self.bars
            .iter()
            .enumerate()
            .find(|(_, (b, s))| *s != 0 && addr >= *b && addr + len as u64 <= b + s)
            .map(|(i, (b, _))| (i as u32, addr - b))
    }
}

/// A DMA_UNMAP payload.
pub fn dma_unmap_payload(address: u64, size: u64) -> Vec<u8> {
    let mut p = 24u32.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&address.to_le_bytes());
    p.extend_from_slice(&size.to_le_bytes());
    p
}

impl PciFunction for VfioUserClient {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.region_read(region::CONFIG, offset as u64, 4)
            .map_or(u32::MAX, |b| u32::from_le_bytes(b.try_into().unwrap_or([0xff; 4])))
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        let _ = self.region_write(region::CONFIG, offset as u64, &value.to_le_bytes());
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        let (addr, len) = (addr.get(), len.min(8));
        let Some((bar, off)) = self.decode(addr, len) else { return u64::MAX };
        let mut b = [0u8; 8];
        match self.region_read(bar, off, len as u32) {
            Ok(d) => b[..len].copy_from_slice(&d),
            Err(_) => return u64::MAX,
        }
        u64::from_le_bytes(b)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        let (addr, len) = (addr.get(), len.min(8));
        // The VMM emulates the MSI-X table: the guest's writes to it never reach the server.
        let (t, n) = self.msix_table;
        if addr + len as u64 > t && addr < t + n {
            return;
        }
        let Some((bar, off)) = self.decode(addr, len) else { return };
        let _ = self.region_write(bar, off, &value.to_le_bytes()[..len]);
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.arena.alloc_zeroed(&mut self.mem, len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        // The server's writes into private memory may be waiting as messages.
        if self.file.is_none() {
            let _ = self.pump(Duration::ZERO);
        }
        self.arena.read(&self.mem, buf, offset, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.arena.write(&mut self.mem, buf, offset, data);
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        if vector as usize >= self.eventfds.len() {
            return false;
        }
        wait_interrupt(timeout, |left| {
            for (i, f) in self.eventfds.iter_mut().enumerate() {
                let mut b = [0u8; 8];
                if f.read(&mut b).is_ok() {
                    self.interrupts.signal(i as u16, u64::from_ne_bytes(b));
                }
            }
            if self.interrupts.take(vector) {
                WaitStep::Fired
            } else if self.pump(left.min(Duration::from_micros(200))).is_err() {
                WaitStep::Gone
            } else {
                WaitStep::Idle
            }
        })
    }
}
