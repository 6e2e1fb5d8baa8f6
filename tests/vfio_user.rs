//! The vfio-user server without QEMU: a client written here from the protocol document
//! speaks to it over a UNIX socket. The simgpu driver runs its workload through it (client
//! memory shared as a file, and client memory reached only through DMA_READ / DMA_WRITE
//! messages); malformed, oversized and hostile messages are answered with errors or a
//! clean close; a client that vanishes mid-DMA leaves a reset device for the next one.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use bridge_host::vfio_user::proto::{self, Header, cmd, errno, flags, irq, region};
use bridge_host::vfio_user::{Counters, VfioUserServer, Wait};
use dxpu_tests::{GpuBox, gpu_options, host_options, key_a, serial};
use hw::driver::{DmaBuf, PciFunction, SimGpuDriver};
use hw::workload::{self, WorkloadSize};
use link::driver::DriverKind;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

const IOVA: u64 = 0x4000_0000;

struct Served {
    gpu: Option<GpuBox>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<RemoteDevice>>,
    _dir: TempDir,
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A box with a simgpu, a host endpoint attached to it, serving vfio-user on a socket.
fn serve() -> Served {
    let gpu = GpuBox::start(gpu_options("127.0.0.1:0".parse().unwrap()));
    let mut o = host_options(gpu.addr, key_a());
    o.dma_memory = 0;
    o.service_interval = None;
    o.driver = DriverKind::Portable;
    let dev = RemoteDevice::attach(o).expect("attach");
    let dir =
        std::env::temp_dir().join(format!("dxpu-vfio-user-{}-{:?}", std::process::id(), Instant::now()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpu0.sock");
    let mut server = VfioUserServer::bind(&path, dev, Wait::Blocking).expect("bind");
    let counters = server.counters();
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::spawn(move || {
        server.serve(&s).expect("serve");
        server.into_device()
    });
    Served { gpu: Some(gpu), path, stop, counters, thread: Some(thread), _dir: TempDir(dir) }
}

impl Served {
    fn finish(mut self) -> RemoteDevice {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().expect("server thread")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        drop(self.gpu.take());
    }
}

fn memfd(len: usize) -> (File, memmap2::MmapMut) {
    let fd = rustix::fs::memfd_create(
        "guest-memory",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .unwrap();
    let f = File::from(fd);
    f.set_len(len as u64).unwrap();
    // As QEMU's memfd backend does: the size is fixed from here on.
    rustix::fs::fcntl_add_seals(&f, rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW).unwrap();
    // SAFETY: a memfd this test created; the server maps it too and both only copy bytes.
    let m = unsafe { memmap2::MmapMut::map_mut(&f) }.unwrap();
    (f, m)
}

/// A vfio-user client, as QEMU's `vfio-user-pci` behaves toward the server, offering the
/// PCI function to the simgpu driver.
struct Client {
    s: UnixStream,
    next_id: u16,
    mem: memmap2::MmapMut,
    _file: Option<File>,
    alloc: usize,
    bars: [(u64, u64); 6],
    msix_table: (u64, u64),
    eventfds: Vec<File>,
    pending: Vec<u64>,
    /// DMA_READ / DMA_WRITE messages served.
    dma_messages: u64,
}

struct Reply {
    header: Header,
    payload: Vec<u8>,
}

fn send_with_fds(s: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(16))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
    }
    let mut sent =
        rustix::net::sendmsg(s, &[std::io::IoSlice::new(bytes)], &mut control, SendFlags::empty()).unwrap();
    if sent < bytes.len() {
        (&*s).write_all(&bytes[sent..]).unwrap();
        sent = bytes.len();
    }
    assert_eq!(sent, bytes.len());
}

impl Client {
    fn connect(path: &std::path::Path) -> UnixStream {
        let s = UnixStream::connect(path).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Sends one raw message and reads the reply to it, serving the server's DMA commands
    /// that arrive first.
    fn call_raw(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Reply {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        send_with_fds(&self.s, &proto::message(id, command, flags::COMMAND, 0, payload), fds);
        self.wait_reply(id)
    }

    fn read_message(&mut self) -> Option<Reply> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).ok()?;
        let header = Header::parse(&h);
        let mut payload = vec![0u8; header.size as usize - 16];
        self.s.read_exact(&mut payload).ok()?;
        Some(Reply { header, payload })
    }

    fn wait_reply(&mut self, id: u16) -> Reply {
        loop {
            let m = self.read_message().expect("the server answers");
            if m.header.is_reply() && m.header.id == id {
                return m;
            }
            assert!(m.header.is_command(), "unexpected reply {:?}", m.header);
            self.serve_dma(&m);
        }
    }

    fn serve_dma(&mut self, m: &Reply) {
        let p = &m.payload;
        let addr = u64::from_le_bytes(p[0..8].try_into().unwrap());
        let count = u64::from_le_bytes(p[8..16].try_into().unwrap()) as usize;
        let at = addr.checked_sub(IOVA).map(|a| a as usize).filter(|a| a + count <= self.mem.len());
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
        (&self.s).write_all(&reply).unwrap();
    }

    fn ok(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Vec<u8> {
        let r = self.call_raw(command, payload, fds);
        assert_eq!(
            r.header.flags & flags::ERROR,
            0,
            "{} failed: errno {}",
            cmd::name(command),
            r.header.error
        );
        r.payload
    }

    fn err(&mut self, command: u16, payload: &[u8], fds: &[BorrowedFd<'_>]) -> u32 {
        let r = self.call_raw(command, payload, fds);
        assert_ne!(r.header.flags & flags::ERROR, 0, "{} should fail", cmd::name(command));
        assert!(r.payload.is_empty(), "an error reply is only a header");
        r.header.error
    }

    fn version(&mut self) -> serde_json::Value {
        let mut p = vec![0, 0, 1, 0];
        p.extend_from_slice(br#"{"capabilities":{"max_msg_fds":8,"max_data_xfer_size":1048576}}"#);
        p.push(0);
        let r = self.ok(cmd::VERSION, &p, &[]);
        assert_eq!(&r[0..4], &[0, 0, 1, 0]);
        let json = std::str::from_utf8(&r[4..r.len() - 1]).unwrap();
        serde_json::from_str(json).unwrap()
    }

    fn region_read(&mut self, region: u32, offset: u64, count: u32) -> Vec<u8> {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&count.to_le_bytes());
        let r = self.ok(cmd::REGION_READ, &p, &[]);
        assert_eq!(r.len(), 16 + count as usize);
        r[16..].to_vec()
    }

    fn region_write(&mut self, region: u32, offset: u64, data: &[u8]) {
        let mut p = offset.to_le_bytes().to_vec();
        p.extend_from_slice(&region.to_le_bytes());
        p.extend_from_slice(&(data.len() as u32).to_le_bytes());
        p.extend_from_slice(data);
        self.ok(cmd::REGION_WRITE, &p, &[]);
    }

    fn dma_map(&mut self, fd: Option<BorrowedFd<'_>>, address: u64, size: u64, fl: u32) -> Result<(), u32> {
        let mut p = 32u32.to_le_bytes().to_vec();
        p.extend_from_slice(&fl.to_le_bytes());
        p.extend_from_slice(&0u64.to_le_bytes());
        p.extend_from_slice(&address.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        let r = self.call_raw(cmd::DMA_MAP, &p, &fds);
        if r.header.flags & flags::ERROR != 0 { Err(r.header.error) } else { Ok(()) }
    }

    fn dma_unmap(&mut self, address: u64, size: u64) -> Result<(), u32> {
        let mut p = 24u32.to_le_bytes().to_vec();
        p.extend_from_slice(&0u32.to_le_bytes());
        p.extend_from_slice(&address.to_le_bytes());
        p.extend_from_slice(&size.to_le_bytes());
        let r = self.call_raw(cmd::DMA_UNMAP, &p, &[]);
        if r.header.flags & flags::ERROR != 0 { Err(r.header.error) } else { Ok(()) }
    }

    fn set_irqs(
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
        let r = self.call_raw(cmd::DEVICE_SET_IRQS, &p, fds);
        if r.header.flags & flags::ERROR != 0 { Err(r.header.error) } else { Ok(()) }
    }

    /// Connects and sets up as QEMU does: version, the device's BARs, guest memory (shared
    /// as a file, or reached by messages), MSI-X eventfds.
    fn open(path: &std::path::Path, shared: bool, mem_len: usize) -> Client {
        let (file, mem) = if shared {
            let (f, m) = memfd(mem_len);
            (Some(f), m)
        } else {
            (None, memmap2::MmapMut::map_anon(mem_len).unwrap())
        };
        let mut c = Client {
            s: Client::connect(path),
            next_id: 0,
            mem,
            _file: file,
            alloc: 0,
            bars: [(0, 0); 6],
            msix_table: (0, 0),
            eventfds: Vec::new(),
            pending: Vec::new(),
            dma_messages: 0,
        };
        c.version();
        for i in 0..6u32 {
            let mut p = 32u32.to_le_bytes().to_vec();
            p.extend_from_slice(&[0; 4]);
            p.extend_from_slice(&i.to_le_bytes());
            p.extend_from_slice(&[0; 4]);
            let r = c.ok(cmd::DEVICE_GET_REGION_INFO, &p, &[]);
            let size = u64::from_le_bytes(r[16..24].try_into().unwrap());
            let lo =
                u32::from_le_bytes(c.region_read(region::CONFIG, 0x10 + 4 * i as u64, 4).try_into().unwrap());
            let hi = if i < 5 {
                u32::from_le_bytes(c.region_read(region::CONFIG, 0x14 + 4 * i as u64, 4).try_into().unwrap())
            } else {
                0
            };
            let base = if lo & 4 != 0 { (hi as u64) << 32 | (lo & !0xf) as u64 } else { (lo & !0xf) as u64 };
            c.bars[i as usize] = (base, size);
        }
        let fd = c._file.as_ref().map(|f| f.as_fd());
        // The file lives in `c` for the whole call.
        let fd = fd.map(|f| unsafe_borrow(f));
        c.dma_map(fd, IOVA, mem_len as u64, proto::DMA_READABLE | proto::DMA_WRITEABLE).expect("DMA_MAP");
        // MSI-X: the table lives in BAR0 at 0x8000, 8 vectors (the VMM emulates it).
        c.msix_table = (c.bars[0].0 + 0x8000, 8 * 16);
        let fds: Vec<OwnedFd> = (0..8)
            .map(|_| {
                rustix::event::eventfd(
                    0,
                    rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
                )
                .unwrap()
            })
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        c.set_irqs(irq::DATA_EVENTFD | irq::ACTION_TRIGGER, irq::MSIX, 0, 8, &[], &borrowed)
            .expect("SET_IRQS");
        c.eventfds = fds.into_iter().map(File::from).collect();
        c.pending = vec![0; 8];
        c
    }

    fn decode(&self, addr: u64, len: usize) -> Option<(u32, u64)> {
        self.bars
            .iter()
            .enumerate()
            .find(|(_, (b, s))| *s != 0 && addr >= *b && addr + len as u64 <= b + s)
            .map(|(i, (b, _))| (i as u32, addr - b))
    }
}

fn unsafe_borrow(f: BorrowedFd<'_>) -> BorrowedFd<'static> {
    use std::os::fd::AsRawFd;
    // SAFETY: used only while the owning File lives in the same Client (the DMA_MAP call).
    unsafe { BorrowedFd::borrow_raw(f.as_raw_fd()) }
}

impl PciFunction for Client {
    fn config_read(&mut self, offset: u16) -> u32 {
        u32::from_le_bytes(self.region_read(region::CONFIG, offset as u64, 4).try_into().unwrap())
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        self.region_write(region::CONFIG, offset as u64, &value.to_le_bytes());
    }
    fn mmio_read(&mut self, addr: u64, len: usize) -> u64 {
        let Some((bar, off)) = self.decode(addr, len) else { return u64::MAX };
        let mut b = [0u8; 8];
        b[..len].copy_from_slice(&self.region_read(bar, off, len as u32));
        u64::from_le_bytes(b)
    }
    fn mmio_write(&mut self, addr: u64, len: usize, value: u64) {
        // The VMM emulates the MSI-X table: the guest's writes to it never reach the server.
        if addr >= self.msix_table.0 && addr < self.msix_table.0 + self.msix_table.1 {
            return;
        }
        let Some((bar, off)) = self.decode(addr, len) else { return };
        self.region_write(bar, off, &value.to_le_bytes()[..len]);
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        let start = self.alloc.div_ceil(64) * 64;
        if start + len > self.mem.len() {
            return None;
        }
        self.alloc = start + len;
        self.mem[start..start + len].fill(0);
        Some(DmaBuf { bus: IOVA + start as u64, len })
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        // Serve DMA messages that are waiting (the server's writes into this memory).
        self.pump(Duration::ZERO);
        let at = (buf.bus - IOVA) as usize + offset;
        out.copy_from_slice(&self.mem[at..at + out.len()]);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        let at = (buf.bus - IOVA) as usize + offset;
        self.mem[at..at + data.len()].copy_from_slice(data);
    }
    fn msi_message(&mut self, vector: u16) -> (u64, u32) {
        (0xfee0_0000, vector as u32)
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            for (v, f) in self.eventfds.iter_mut().enumerate() {
                let mut b = [0u8; 8];
                if f.read(&mut b).is_ok() {
                    self.pending[v] += u64::from_ne_bytes(b);
                }
            }
            if self.pending[vector as usize] > 0 {
                self.pending[vector as usize] -= 1;
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            self.pump(Duration::from_micros(200));
        }
    }
}

impl Client {
    /// Serves DMA commands that arrive within `wait`.
    fn pump(&mut self, wait: Duration) {
        loop {
            let mut fds = [rustix::event::PollFd::new(&self.s, rustix::event::PollFlags::IN)];
            let ts = rustix::event::Timespec { tv_sec: 0, tv_nsec: wait.as_nanos() as i64 };
            if rustix::event::poll(&mut fds, Some(&ts)).unwrap_or(0) == 0 {
                return;
            }
            let Some(m) = self.read_message() else { return };
            assert!(m.header.is_command());
            self.serve_dma(&m);
        }
    }
}

fn run_workload(c: Client) -> (Client, workload::WorkloadReport) {
    let mut d = SimGpuDriver::open(c).expect("the simgpu driver opens the device through vfio-user");
    let r = workload::run(&mut d, WorkloadSize::scaled(1), &mut |_| {}).expect("workload verified");
    (d.into_pci(), r)
}

#[test]
fn the_driver_runs_the_workload_through_shared_guest_memory() {
    let _g = serial();
    let served = serve();
    let c = Client::open(&served.path, true, 16 << 20);
    let (c, r) = run_workload(c);
    assert!(r.steps.iter().any(|s| s.name.contains("interrupt")));
    assert_eq!(c.dma_messages, 0, "memory shared as a file needs no DMA messages");
    let n = &served.counters;
    assert!(n.interrupts.load(Ordering::Relaxed) >= 17, "SAXPY and 16 fences by MSI-X");
    assert_eq!(n.errors.load(Ordering::Relaxed), 0);
    drop(c);
    let d = served.finish();
    let s = d.stats();
    assert!(s.dma_reads > 0 && s.dma_writes > 0, "{s:?}");
    assert_eq!(s.dma_read_refused + s.dma_write_dropped, 0, "{s:?}");
}

#[test]
fn the_driver_runs_the_workload_through_dma_messages() {
    let _g = serial();
    let served = serve();
    let c = Client::open(&served.path, false, 16 << 20);
    let (c, _) = run_workload(c);
    assert!(c.dma_messages > 100, "device DMA went through DMA_READ / DMA_WRITE: {}", c.dma_messages);
    assert!(served.counters.client_dma.load(Ordering::Relaxed) >= c.dma_messages);
}

#[test]
fn bad_messages_get_errors_and_the_session_goes_on() {
    let _g = serial();
    let served = serve();
    let mut c = Client {
        s: Client::connect(&served.path),
        next_id: 0,
        mem: memmap2::MmapMut::map_anon(4096).unwrap(),
        _file: None,
        alloc: 0,
        bars: [(0, 0); 6],
        msix_table: (0, 0),
        eventfds: Vec::new(),
        pending: Vec::new(),
        dma_messages: 0,
    };
    // Nothing before VERSION.
    assert_eq!(c.err(cmd::DEVICE_GET_INFO, &16u32.to_le_bytes(), &[]), errno::EINVAL);
    // Version data that is not JSON.
    assert_eq!(c.err(cmd::VERSION, &[0, 0, 1, 0, b'{', 0], &[]), errno::EINVAL);
    // A major version this server does not speak.
    assert_eq!(c.err(cmd::VERSION, &[9, 0, 0, 0], &[]), errno::ENOTSUP);
    let caps = c.version();
    assert_eq!(caps["capabilities"]["max_msg_fds"], 16);
    assert_eq!(caps["capabilities"]["max_data_xfer_size"], 1 << 20);

    let info = c.ok(cmd::DEVICE_GET_INFO, &[16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(info, proto::device_info(proto::DEVICE_FLAGS_RESET | proto::DEVICE_FLAGS_PCI, 9, 5));
    // Regions: config, BAR0 (64 KiB registers), BAR2 (VRAM); none mappable.
    let ri = |c: &mut Client, i: u32| {
        let mut p = 32u32.to_le_bytes().to_vec();
        p.extend_from_slice(&[0; 4]);
        p.extend_from_slice(&i.to_le_bytes());
        p.extend_from_slice(&[0; 20]);
        let r = c.ok(cmd::DEVICE_GET_REGION_INFO, &p, &[]);
        (u32::from_le_bytes(r[4..8].try_into().unwrap()), u64::from_le_bytes(r[16..24].try_into().unwrap()))
    };
    assert_eq!(ri(&mut c, region::CONFIG), (3, 4096));
    assert_eq!(ri(&mut c, 0), (3, 64 << 10));
    assert_eq!(ri(&mut c, 1), (0, 0));
    assert_eq!(ri(&mut c, 2).1, 256 << 20);
    assert_eq!(ri(&mut c, region::ROM), (0, 0));
    let mut p = 32u32.to_le_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(&9u32.to_le_bytes());
    p.extend_from_slice(&[0; 20]);
    assert_eq!(c.err(cmd::DEVICE_GET_REGION_INFO, &p, &[]), errno::EINVAL);
    let mut p = 16u32.to_le_bytes().to_vec();
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(&irq::MSIX.to_le_bytes());
    p.extend_from_slice(&[0; 4]);
    let r = c.ok(cmd::DEVICE_GET_IRQ_INFO, &p, &[]);
    assert_eq!(u32::from_le_bytes(r[12..16].try_into().unwrap()), 8);

    // Config reads at any alignment; the IDs.
    assert_eq!(c.region_read(region::CONFIG, 0, 4), [0x34, 0x12, 0xa0, 0xd9]);
    assert_eq!(c.region_read(region::CONFIG, 2, 2), [0xa0, 0xd9]);
    assert_eq!(c.region_read(region::CONFIG, 1, 1), [0x12]);
    // Out of range, short payloads, unknown commands, descriptors where none belong.
    let mut p = 4090u64.to_le_bytes().to_vec();
    p.extend_from_slice(&region::CONFIG.to_le_bytes());
    p.extend_from_slice(&8u32.to_le_bytes());
    assert_eq!(c.err(cmd::REGION_READ, &p, &[]), errno::EINVAL);
    let mut p = (64u64 << 10).to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    assert_eq!(c.err(cmd::REGION_READ, &p, &[]), errno::EINVAL, "past BAR0");
    assert_eq!(c.err(cmd::REGION_READ, &[0; 5], &[]), errno::EINVAL);
    assert_eq!(c.err(99, &[], &[]), errno::ENOSYS);
    assert_eq!(c.err(cmd::DEVICE_GET_REGION_IO_FDS, &[0; 16], &[]), errno::ENOSYS);
    let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap();
    let mut p = 0u64.to_le_bytes().to_vec();
    p.extend_from_slice(&region::CONFIG.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    assert_eq!(c.err(cmd::REGION_READ, &p, &[efd.as_fd()]), errno::EINVAL);
    // DMA maps: a descriptor that cannot be mapped, misaligned, overlapping, two fds.
    assert!(c.dma_map(Some(efd.as_fd()), IOVA, 4096, 3).is_err(), "an eventfd is not memory");
    // A file shorter than the range: mapping it would raise SIGBUS on the device's DMA.
    let (short, _ms) = memfd(4096);
    assert_eq!(c.dma_map(Some(short.as_fd()), IOVA, 8192, 3), Err(errno::EINVAL));
    assert_eq!(c.dma_map(None, IOVA + 1, 4096, 3), Err(errno::EINVAL));
    assert_eq!(c.dma_map(None, IOVA, 0, 3), Err(errno::EINVAL));
    c.dma_map(None, IOVA, 8192, 3).unwrap();
    assert_eq!(c.dma_map(None, IOVA + 4096, 4096, 3), Err(errno::EEXIST));
    let (f1, _m1) = memfd(4096);
    let (f2, _m2) = memfd(4096);
    let mut p = 32u32.to_le_bytes().to_vec();
    p.extend_from_slice(&3u32.to_le_bytes());
    p.extend_from_slice(&0u64.to_le_bytes());
    p.extend_from_slice(&(IOVA + (1 << 20)).to_le_bytes());
    p.extend_from_slice(&4096u64.to_le_bytes());
    assert_eq!(c.err(cmd::DMA_MAP, &p, &[f1.as_fd(), f2.as_fd()]), errno::EINVAL);
    // Unmapping what was never mapped: an error, and nothing else changes.
    assert_eq!(c.dma_unmap(0x7000_0000, 4096), Err(errno::ENOENT));
    c.dma_unmap(IOVA, 8192).unwrap();
    assert_eq!(c.dma_unmap(IOVA, 8192), Err(errno::ENOENT));
    // SET_IRQS: wrong descriptor count, out of range, two data kinds.
    assert_eq!(
        c.set_irqs(irq::DATA_EVENTFD | irq::ACTION_TRIGGER, irq::MSIX, 0, 2, &[], &[efd.as_fd()]),
        Err(errno::EINVAL)
    );
    assert_eq!(c.set_irqs(irq::DATA_NONE | irq::ACTION_MASK, irq::MSIX, 7, 2, &[], &[]), Err(errno::EINVAL));
    assert_eq!(
        c.set_irqs(irq::DATA_NONE | irq::DATA_BOOL | irq::ACTION_MASK, irq::MSIX, 0, 1, &[1], &[]),
        Err(errno::EINVAL)
    );
    c.set_irqs(irq::DATA_BOOL | irq::ACTION_MASK, irq::MSIX, 0, 2, &[1, 0], &[]).unwrap();
    c.set_irqs(irq::DATA_NONE | irq::ACTION_TRIGGER, irq::MSIX, 0, 0, &[], &[]).unwrap();
    // A message over the size limit is refused and skipped; the framing holds.
    let big = vec![0u8; (bridge_host::vfio_user::MAX_MESSAGE as usize) + 100];
    let mut p = 0u64.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&(big.len() as u32).to_le_bytes());
    p.extend_from_slice(&big);
    assert_eq!(c.err(cmd::REGION_WRITE, &p, &[]), errno::E2BIG);
    // REGION_WRITE_MULTI and a reset, then the device still answers.
    let mut p = 1u64.to_le_bytes().to_vec();
    p.extend_from_slice(&0x04u64.to_le_bytes());
    p.extend_from_slice(&region::CONFIG.to_le_bytes());
    p.extend_from_slice(&2u32.to_le_bytes());
    p.extend_from_slice(&[0x06, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(c.ok(cmd::REGION_WRITE_MULTI, &p, &[]), 1u64.to_le_bytes());
    assert_eq!(c.region_read(region::CONFIG, 4, 2), [0x06, 0]);
    c.ok(cmd::DEVICE_RESET, &[], &[]);
    assert_eq!(c.region_read(region::CONFIG, 4, 2), [0, 0], "FLR cleared Memory Space and Bus Master");
    assert_eq!(c.region_read(region::CONFIG, 0, 4), [0x34, 0x12, 0xa0, 0xd9]);
    assert!(served.counters.errors.load(Ordering::Relaxed) >= 20);

    // A header that claims less than itself: the connection is closed, the server lives.
    (&c.s).write_all(&Header { id: 1, command: 9, size: 8, flags: 0, error: 0 }.emit()).unwrap();
    let mut b = [0u8; 1];
    assert_eq!((&c.s).read(&mut b).unwrap_or(0), 0, "closed");
    let mut c2 = Client { s: Client::connect(&served.path), ..c };
    c2.version();
    assert_eq!(c2.region_read(region::CONFIG, 0, 2), [0x34, 0x12]);
}

#[test]
fn a_client_gone_mid_dma_leaves_a_reset_device_for_the_next() {
    let _g = serial();
    let served = serve();
    {
        // Guest memory reached only by messages; the client starts a copy and vanishes
        // without answering the server's DMA_READs.
        let c = Client::open(&served.path, false, 4 << 20);
        let mut d = SimGpuDriver::open(c).unwrap();
        let src = d.pci().dma_alloc(1 << 20).unwrap();
        d.submit(hw::driver::Command {
            opcode: hw::simgpu_device::op::COPY_H2V,
            args: [src.bus, 0, 1 << 20, 0, 0],
        })
        .unwrap();
        let c = d.into_pci();
        let _ = c.s.shutdown(std::net::Shutdown::Both);
    }
    // A second client at the same time is refused while the first is served; then the
    // next one gets a clean device and runs everything.
    let deadline = Instant::now() + Duration::from_secs(10);
    while served.counters.resets.load(Ordering::Relaxed) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(served.counters.resets.load(Ordering::Relaxed) >= 1, "the device was reset");
    let c = Client::open(&served.path, true, 16 << 20);
    let busy = UnixStream::connect(&served.path).unwrap();
    busy.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!((&busy).read(&mut b).unwrap_or(0), 0, "refused while another client is served");
    let (_c, _) = run_workload(c);
    assert!(served.counters.refused.load(Ordering::Relaxed) >= 1);
    assert_eq!(served.counters.clients.load(Ordering::Relaxed), 2);
}

impl Client {
    /// Drains the eventfd of `vector`; true if it had been signalled.
    fn signalled(&mut self, vector: usize) -> bool {
        let mut b = [0u8; 8];
        self.eventfds[vector].read(&mut b).is_ok()
    }
}

#[test]
fn a_masked_vector_is_held_pending_by_the_device_and_delivered_on_unmask() {
    let _g = serial();
    let served = serve();
    let c = Client::open(&served.path, true, 4 << 20);
    let mut d = SimGpuDriver::open(c).unwrap();
    let v = 5u64;
    let raise = |d: &mut SimGpuDriver<Client>| {
        d.launch(hw::simgpu_device::op::INTERRUPT, [v, 0, 0, 0, 0], hw::driver::WaitMode::Poll).unwrap()
    };
    // Unmasked: the interrupt reaches the vector's eventfd.
    raise(&mut d);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = false;
    while !seen && Instant::now() < deadline {
        d.pci().pump(Duration::from_millis(1));
        seen = d.pci().signalled(v as usize);
    }
    assert!(seen, "vector {v} reached its eventfd");
    // Masked: the device holds it (its Pending Bit), nothing is signalled.
    d.pci().set_irqs(irq::DATA_NONE | irq::ACTION_MASK, irq::MSIX, v as u32, 1, &[], &[]).unwrap();
    raise(&mut d);
    std::thread::sleep(Duration::from_millis(100));
    d.pci().pump(Duration::ZERO);
    assert!(!d.pci().signalled(v as usize), "a masked vector must not be delivered");
    let pba = d.pci().region_read(0, 0x9000, 8);
    assert_ne!(u64::from_le_bytes(pba.try_into().unwrap()) & (1 << v), 0, "pending in the device's PBA");
    // Unmasked: the pending message goes out.
    d.pci().set_irqs(irq::DATA_BOOL | irq::ACTION_UNMASK, irq::MSIX, v as u32, 1, &[1], &[]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = false;
    while !seen && Instant::now() < deadline {
        d.pci().pump(Duration::from_millis(1));
        seen = d.pci().signalled(v as usize);
    }
    assert!(seen, "the pending vector was delivered on unmask");
}

#[test]
fn dma_to_a_window_unmapped_in_flight_fails_cleanly() {
    let _g = serial();
    let served = serve();
    // Guest memory reached by messages, so the server is inside a DMA_READ when the
    // client takes the window away.
    let c = Client::open(&served.path, false, 4 << 20);
    let mut d = SimGpuDriver::open(c).unwrap();
    let src = d.pci().dma_alloc(1 << 20).unwrap();
    d.submit(hw::driver::Command {
        opcode: hw::simgpu_device::op::COPY_H2V,
        args: [src.bus, 0, 1 << 20, 0, 0],
    })
    .unwrap();
    let c = d.pci();
    // Answer the first DMA_READ only after unmapping: the server takes the unmap in order
    // behind the read it is serving, and the device's later reads find no window.
    let first = c.read_message().expect("a DMA_READ");
    assert_eq!(first.header.command, cmd::DMA_READ);
    c.next_id = c.next_id.wrapping_add(1);
    let id = c.next_id;
    let mut p = 24u32.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.extend_from_slice(&IOVA.to_le_bytes());
    p.extend_from_slice(&(4u64 << 20).to_le_bytes());
    send_with_fds(&c.s, &proto::message(id, cmd::DMA_UNMAP, flags::COMMAND, 0, &p), &[]);
    c.serve_dma(&first);
    let r = c.wait_reply(id);
    assert_eq!(r.header.flags & flags::ERROR, 0, "the unmap succeeds");
    // The copy fails on the device (DMA error), the session and the device go on.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut error = 0;
    while error == 0 && Instant::now() < deadline {
        c.pump(Duration::from_millis(1));
        error = u64::from_le_bytes(c.region_read(0, hw::simgpu_device::reg::ERROR, 8).try_into().unwrap());
    }
    assert_eq!(error, hw::simgpu_device::err::DMA, "the device reports the DMA it could not do");
    assert_eq!(c.region_read(region::CONFIG, 0, 2), [0x34, 0x12]);
    drop(d);
    let dev = served.finish();
    assert!(dev.stats().dma_read_refused > 0, "{:?}", dev.stats());
}

#[test]
fn reads_of_a_vanished_device_return_all_ones() {
    let _g = serial();
    let mut served = serve();
    let mut c = Client::open(&served.path, true, 1 << 20);
    assert_eq!(c.region_read(region::CONFIG, 0, 2), [0x34, 0x12]);
    // The error notifier, as QEMU registers it (it stops the VM when signalled).
    let err = rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
    )
    .unwrap();
    c.set_irqs(irq::DATA_EVENTFD | irq::ACTION_TRIGGER, irq::ERR, 0, 1, &[], &[err.as_fd()]).unwrap();
    let mut err = File::from(err);
    let mut b = [0u8; 8];
    assert!(err.read(&mut b).is_err(), "not signalled while the device is there");
    served.gpu.take().unwrap().kill();
    // The box is gone: the read waits out the completion timeout, then reads all-ones as a
    // read of a surprise-removed PCIe device does; later reads fail at once.
    assert_eq!(c.region_read(0, hw::simgpu_device::reg::ID, 8), [0xff; 8]);
    let t = Instant::now();
    assert_eq!(c.region_read(region::CONFIG, 0, 4), [0xff; 4]);
    assert!(t.elapsed() < Duration::from_millis(100), "no second timeout");
    c.region_write(0, hw::simgpu_device::reg::ID, &[0; 8]);
    assert!(err.read(&mut b).is_ok(), "the error notifier was signalled on removal");
    let dev = served.finish();
    assert!(dev.removed().is_some());
}

#[test]
fn a_read_only_window_takes_no_device_writes() {
    let _g = serial();
    let served = serve();
    let mut c = Client::open(&served.path, true, 1 << 20);
    // A second region of guest memory the device may only read.
    let (f, mut ro) = memfd(64 << 10);
    ro[..4].copy_from_slice(&[1, 2, 3, 4]);
    let ro_iova = IOVA + (16 << 20);
    c.dma_map(Some(unsafe_borrow(f.as_fd())), ro_iova, 64 << 10, proto::DMA_READABLE).unwrap();
    let mut d = SimGpuDriver::open(c).unwrap();
    // The device reads it (host → VRAM) ...
    d.submit(hw::driver::Command { opcode: hw::simgpu_device::op::COPY_H2V, args: [ro_iova, 0, 4096, 0, 0] })
        .unwrap();
    d.sync(hw::driver::WaitMode::Poll).unwrap();
    let mut back = [0u8; 4];
    d.memcpy_from_device(0, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3, 4]);
    // ... but cannot write it (VRAM → host lands nowhere, the device reports a DMA error).
    ro[..4].fill(9);
    let _ = d.submit(hw::driver::Command {
        opcode: hw::simgpu_device::op::COPY_V2H,
        args: [0, ro_iova, 4096, 0, 0],
    });
    let _ = d.sync(hw::driver::WaitMode::Poll);
    assert_eq!(&ro[..4], &[9; 4], "guest memory mapped read-only is untouched");
    drop(d);
    let dev = served.finish();
    assert!(dev.stats().dma_write_dropped > 0, "{:?}", dev.stats());
}
