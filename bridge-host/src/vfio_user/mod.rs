//! A vfio-user server: a remote device served to a VMM (QEMU's `vfio-user-pci`) over a UNIX
//! socket, so that a VM sees the GPU in another box as an ordinary PCI device.
//!
//! The protocol is QEMU's `docs/interop/vfio-user.rst` (version 0.1), written here rather
//! than taken from the rust-vmm `vfio-user` crate: that crate's server serves one connection
//! for its lifetime and cannot send DMA_READ / DMA_WRITE to the client, and this server must
//! serve client after client and reach guest memory that was not shared as a file
//! (docs/vfio-user.md). [`proto`] parses and builds messages without I/O; this module owns
//! the socket, the file descriptors and the device.
//!
//! What each message becomes:
//! - REGION_READ / REGION_WRITE of the config region → CfgRd / CfgWr (with byte enables)
//!   through [`RemoteDevice`], BAR registers virtualized there; of a BAR → MRd / MWr at the
//!   BAR's address on the box. No region is offered for mmap: every access reaches the
//!   device. A read that fails returns all-ones and is logged.
//! - DMA_MAP with a file descriptor → the client's memory mapped here and granted to the
//!   device as a DMA window (readable / writable as the flags say); without one → a window
//!   whose reads and writes become DMA_READ / DMA_WRITE messages to the client. DMA_UNMAP
//!   revokes it before the reply; device DMA to it afterwards gets Unsupported Request.
//! - SET_IRQS for MSI-X → one eventfd per vector; the device's MSI-X table (which the VMM
//!   emulates for the guest) is programmed here so that each vector's message reaches the
//!   host endpoint, which signals the vector's eventfd. MASK / UNMASK set the vector's mask
//!   bit in the device, so a masked vector is held pending by the device itself.
//! - DEVICE_RESET → Bus Master Enable off, then a function-level reset of the remote device.
//! - Client gone → its windows and eventfds are dropped, the device is quiesced and reset,
//!   and the next client is served.
//!
//! One thread serves one device: it waits on the client socket and the link socket
//! together, so commands, device DMA and interrupts are handled as they arrive.

pub mod proto;

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};

use crate::{Access, BusAddr, ClientMemory, MSI_BASE, RemoteDevice};
use driver::{MsixTableInfo, find_capability, msix_table};
use link::driver::PollMode;
use proto::{Caps, Header, Request, cmd, errno, irq, region};

/// Largest `count` of a region or DMA transfer this server accepts (and announces).
pub const MAX_DATA_XFER: u32 = 1 << 20;
/// File descriptors accepted in one message (and announced; QEMU refuses a server that
/// announces more than 16).
pub const MAX_MSG_FDS: u32 = 16;
/// DMA windows a client may have mapped at once (and announced).
pub const MAX_DMA_MAPS: u32 = 65535;
/// Largest message accepted: a REGION_WRITE of [`MAX_DATA_XFER`] bytes.
pub const MAX_MESSAGE: u32 = proto::HEADER_LEN as u32 + 16 + MAX_DATA_XFER;
/// Size of the config region (PCI Express extended config space).
pub const CONFIG_SIZE: u64 = 4096;
/// How long a client may leave its replies untaken before it is treated as gone.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a message may take to arrive whole once its first bytes have: a client stalled
/// mid-message is dropped after it (the link is driven all the while).
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long the client may take to answer a DMA_READ / DMA_WRITE of this side's. The device
/// DMA that asked for it waits, and the link is not driven meanwhile, so this stays well
/// inside the box's idle timeout (1 s by default); a client that does not answer in time is
/// dropped and the device's access fails (Unsupported Request).
pub const DMA_REPLY_TIMEOUT: Duration = Duration::from_millis(200);
/// Bytes of replies a client may leave untaken before it is treated as gone.
pub const MAX_UNSENT: usize = 4 * MAX_MESSAGE as usize;

/// What the server has done, for tests and reports.
#[derive(Debug, Default)]
pub struct Counters {
    /// Clients served (connections accepted).
    pub clients: AtomicU64,
    /// Connections refused because a client was being served.
    pub refused: AtomicU64,
    /// Commands handled.
    pub commands: AtomicU64,
    /// Commands answered with an error.
    pub errors: AtomicU64,
    /// DMA_READ / DMA_WRITE messages sent to the client.
    pub client_dma: AtomicU64,
    /// MSI-X messages delivered to an eventfd.
    pub interrupts: AtomicU64,
    /// MSI-X messages for a vector without an eventfd.
    pub unrouted: AtomicU64,
    /// Device resets (DEVICE_RESET and client departures).
    pub resets: AtomicU64,
    /// Clients dropped for stalling: a message left unfinished, replies or a DMA_READ /
    /// DMA_WRITE left unanswered.
    pub stalled: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Interrupt routes: the eventfds the client gave, by vector.
#[derive(Default)]
struct Routes {
    msix: Vec<Option<File>>,
    masked: Vec<bool>,
    /// The error notifier (VFIO_PCI_ERR_IRQ_INDEX): signalled when the device is
    /// surprise-removed, as vfio-pci signals it on an uncorrectable error.
    err: Option<File>,
    /// The current client has been told of the removal.
    err_signalled: bool,
    counters: Arc<Counters>,
}

impl Routes {
    fn fire(&mut self, vector: u32) {
        match self.msix.get_mut(vector as usize) {
            Some(Some(fd)) => {
                // An eventfd takes an 8-byte count; it only fails if the count would
                // overflow, which a pending signal already covers.
                let _ = fd.write(&1u64.to_ne_bytes());
                bump(&self.counters.interrupts);
            }
            _ => bump(&self.counters.unrouted),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One message as received: header, payload, descriptors.
struct Message {
    header: Header,
    payload: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// Why reading a message failed.
enum RecvError {
    /// The client closed the connection (between messages).
    Closed,
    /// The message cannot be used; the connection cannot go on (framing lost).
    Fatal(String),
    /// The message was too large: its payload was skipped; it gets an error reply.
    TooLarge(Header),
}

/// Bytes read from the client socket per system call at most.
const READ_CHUNK: usize = 64 << 10;

/// The connection to the current client, shared with the DMA windows it did not map.
///
/// Non-blocking both ways, so that no client can hold the thread that also drives the link:
/// bytes are read as they come and messages taken once whole ([`Channel::fill`],
/// [`Channel::next_message`]); replies wait in `tx` until the client takes them
/// ([`Channel::flush`]). A client that leaves a message unfinished for
/// [`MESSAGE_TIMEOUT`], takes none of its replies for [`CLIENT_TIMEOUT`], lets more than
/// [`MAX_UNSENT`] bytes of them pile up, or does not answer a DMA_READ / DMA_WRITE within
/// [`DMA_REPLY_TIMEOUT`] is dropped — the client, never the device.
struct Channel {
    stream: UnixStream,
    /// Bytes of messages not yet taken (at most one message and a read's worth).
    rx: proto::Framer,
    /// Descriptors that came with them (they go with the next whole message).
    rx_fds: Vec<OwnedFd>,
    /// Since when a message has been arriving.
    partial_since: Option<Instant>,
    scratch: Vec<u8>,
    /// Replies and commands of this side the client has not taken yet, from `tx_sent` on.
    tx: Vec<u8>,
    tx_sent: usize,
    /// Since when the client has taken none of `tx`.
    tx_stuck_since: Option<Instant>,
    /// Commands that arrived while this side waited for a reply of the client's.
    deferred: VecDeque<Message>,
    next_id: u16,
    /// The client's limit for DMA_READ / DMA_WRITE counts.
    peer_max_xfer: u32,
    gone: bool,
    /// Why a DMA_READ / DMA_WRITE of this side's failed for want of an answer, for the
    /// server loop to drop the client.
    lost: Option<String>,
}

impl Channel {
    fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            rx: proto::Framer::new(MAX_MESSAGE),
            rx_fds: Vec::new(),
            partial_since: None,
            scratch: vec![0u8; READ_CHUNK],
            tx: Vec::new(),
            tx_sent: 0,
            tx_stuck_since: None,
            deferred: VecDeque::new(),
            next_id: 0,
            peer_max_xfer: 1 << 20,
            gone: false,
            lost: None,
        }
    }

    /// Queues `bytes` for the client and sends what the socket takes now.
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        if self.tx.len() - self.tx_sent + bytes.len() > MAX_UNSENT {
            self.gone = true;
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("the client left over {MAX_UNSENT} bytes of replies untaken"),
            ));
        }
        self.tx.extend_from_slice(bytes);
        self.flush()
    }

    /// Sends what is queued, as far as the socket takes it without waiting.
    fn flush(&mut self) -> io::Result<()> {
        while self.tx_sent < self.tx.len() {
            match (&self.stream).write(&self.tx[self.tx_sent..]) {
                Ok(0) => {
                    self.gone = true;
                    return Err(io::Error::new(io::ErrorKind::WriteZero, "the client's socket took nothing"));
                }
                Ok(n) => {
                    self.tx_sent += n;
                    self.tx_stuck_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.tx_stuck_since.get_or_insert_with(Instant::now);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.gone = true;
                    return Err(e);
                }
            }
        }
        self.tx.clear();
        self.tx_sent = 0;
        self.tx_stuck_since = None;
        Ok(())
    }

    fn has_unsent(&self) -> bool {
        self.tx_sent < self.tx.len()
    }

    /// Reads what the socket has now (without waiting), collecting descriptors, until it has
    /// nothing more or a whole message of the largest size is here.
    fn fill(&mut self) -> Result<(), RecvError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS as usize))];
        while self.rx.wants_more() {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(&mut self.scratch)];
            let r = match rustix::net::recvmsg(
                &self.stream,
                &mut iov,
                &mut control,
                RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            ) {
                Ok(r) => r,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(rustix::io::Errno::CONNRESET) => return Err(RecvError::Closed),
                Err(e) => return Err(RecvError::Fatal(format!("reading from the client: {e}"))),
            };
            for m in control.drain() {
                if let RecvAncillaryMessage::ScmRights(it) = m {
                    self.rx_fds.extend(it);
                }
            }
            if r.flags.contains(ReturnFlags::CTRUNC) || self.rx_fds.len() > MAX_MSG_FDS as usize {
                return Err(RecvError::Fatal(format!(
                    "more than {MAX_MSG_FDS} file descriptors in one message"
                )));
            }
            if r.bytes == 0 {
                return match self.rx.in_message() {
                    false => Err(RecvError::Closed),
                    true => Err(RecvError::Fatal(format!(
                        "connection closed {} bytes into a message",
                        self.rx.progress()
                    ))),
                };
            }
            self.rx.push(&self.scratch[..r.bytes]);
            self.partial_since.get_or_insert_with(Instant::now);
        }
        Ok(())
    }

    /// The next whole message among the bytes read, if there is one.
    fn next_message(&mut self) -> Option<Result<Message, RecvError>> {
        let taken = self.rx.next().map(|f| match f {
            proto::Framed::Message(header, payload) => {
                Ok(Message { header, payload, fds: std::mem::take(&mut self.rx_fds) })
            }
            proto::Framed::TooLarge(h) => {
                self.rx_fds.clear();
                Err(RecvError::TooLarge(h))
            }
            proto::Framed::Broken(h) => Err(RecvError::Fatal(format!(
                "message {} ({}) claims {} bytes, less than its header",
                h.id,
                cmd::name(h.command),
                h.size
            ))),
        });
        if !self.rx.in_message() {
            self.partial_since = None;
        } else if taken.is_some() {
            // The next message's bytes have been arriving since now, at the latest.
            self.partial_since = Some(Instant::now());
        }
        taken
    }

    /// Why the client must be dropped for stalling, if it must.
    fn stalled(&self, now: Instant) -> Option<String> {
        if let Some(t) = self.partial_since
            && now - t > MESSAGE_TIMEOUT
        {
            return Some(format!(
                "a message begun {:?} ago is still not whole ({} bytes of it here)",
                now - t,
                self.rx.progress()
            ));
        }
        if let Some(t) = self.tx_stuck_since
            && now - t > CLIENT_TIMEOUT
        {
            return Some(format!(
                "it has taken none of {} bytes of replies for {:?}",
                self.tx.len() - self.tx_sent,
                now - t
            ));
        }
        None
    }

    /// Waits up to `timeout` for the client's socket to be readable (or writable, while
    /// something waits to be sent).
    fn wait(&self, timeout: Duration) {
        let events = if self.has_unsent() { PollFlags::IN | PollFlags::OUT } else { PollFlags::IN };
        let mut fds = [PollFd::new(&self.stream, events)];
        let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
    }

    /// Sends a command of this side's and waits, up to [`DMA_REPLY_TIMEOUT`], for its reply;
    /// commands that arrive meanwhile are kept, in order, for the server loop.
    fn call(&mut self, command: u16, payload: &[u8]) -> io::Result<Vec<u8>> {
        if self.gone {
            return Err(io::Error::new(io::ErrorKind::NotConnected, "the client is gone"));
        }
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        let msg = proto::message(id, command, proto::flags::COMMAND, 0, payload);
        self.send(&msg)?;
        let deadline = Instant::now() + DMA_REPLY_TIMEOUT;
        loop {
            let got = match self.next_message() {
                Some(m) => m,
                None => {
                    let now = Instant::now();
                    if now >= deadline {
                        let why =
                            format!("it did not answer {} within {DMA_REPLY_TIMEOUT:?}", cmd::name(command));
                        self.gone = true;
                        self.lost = Some(why.clone());
                        return Err(io::Error::new(io::ErrorKind::TimedOut, why));
                    }
                    self.wait(deadline - now);
                    self.flush()?;
                    match self.fill() {
                        Ok(()) => continue,
                        Err(e) => Err(e),
                    }
                }
            };
            match got {
                Ok(m) if m.header.is_reply() && m.header.id == id && m.header.command == command => {
                    if m.header.flags & proto::flags::ERROR != 0 {
                        return Err(io::Error::other(format!(
                            "the client answered {} with error {}",
                            cmd::name(command),
                            m.header.error
                        )));
                    }
                    return Ok(m.payload);
                }
                Ok(m) if m.header.is_command() => self.deferred.push_back(m),
                Ok(m) => log::warn!(
                    "vfio-user: unexpected reply {} to {}; dropped",
                    m.header.id,
                    cmd::name(m.header.command)
                ),
                Err(RecvError::TooLarge(h)) => self.send(&proto::error_reply(&h, errno::E2BIG))?,
                Err(RecvError::Closed) => {
                    self.gone = true;
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client closed the connection",
                    ));
                }
                Err(RecvError::Fatal(why)) => {
                    self.gone = true;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, why));
                }
            }
        }
    }
}

/// Client memory without a file descriptor, reached with DMA_READ / DMA_WRITE.
struct ClientDma {
    chan: Arc<Mutex<Channel>>,
    counters: Arc<Counters>,
}

impl ClientMemory for ClientDma {
    fn read(&mut self, addr: BusAddr, out: &mut [u8]) -> io::Result<()> {
        let addr = addr.get();
        let mut c = lock(&self.chan);
        let chunk = c.peer_max_xfer.clamp(4, MAX_DATA_XFER) as usize;
        let mut done = 0;
        while done < out.len() {
            let n = chunk.min(out.len() - done);
            let at = addr + done as u64;
            bump(&self.counters.client_dma);
            let reply = c.call(cmd::DMA_READ, &proto::dma_read(at, n as u64))?;
            let data = proto::dma_read_data(&reply, at, n)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            out[done..done + n].copy_from_slice(data);
            done += n;
        }
        Ok(())
    }

    fn write(&mut self, addr: BusAddr, data: &[u8]) -> io::Result<()> {
        let addr = addr.get();
        let mut c = lock(&self.chan);
        let chunk = c.peer_max_xfer.clamp(4, MAX_DATA_XFER) as usize;
        for (i, piece) in data.chunks(chunk).enumerate() {
            bump(&self.counters.client_dma);
            c.call(cmd::DMA_WRITE, &proto::dma_write(addr + (i * chunk) as u64, piece))?;
        }
        Ok(())
    }
}

/// A vfio-user server for one remote device.
pub struct VfioUserServer {
    listener: UnixListener,
    path: PathBuf,
    device: RemoteDevice,
    /// Blocking: sleep in `poll` on the client socket and the link together. Busy: poll
    /// both without sleeping for `spin` after the last thing that happened, then sleep.
    wait: PollMode,
    /// Since when nothing has happened (busy mode's spin budget).
    idle_since: Option<std::time::Instant>,
    routes: Arc<Mutex<Routes>>,
    msix: Option<MsixTableInfo>,
    msix_cap: Option<u16>,
    pcie_cap: Option<u16>,
    counters: Arc<Counters>,
    logged_failures: u64,
    /// Said once that the link had no descriptor to sleep on.
    said_no_link_fd: bool,
}

/// A listening UNIX socket at `path` that only this user can connect to: bound, made 0600,
/// and only then listening, so no connection can come in while the mode still follows the
/// umask (connecting to a socket that does not listen yet is refused).
fn bind_private(path: &Path) -> io::Result<UnixListener> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let at = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()));
    match std::fs::symlink_metadata(path) {
        Ok(m) => {
            use std::os::unix::fs::FileTypeExt;
            if !m.file_type().is_socket() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket: refusing to replace it", path.display()),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("{} is a live socket: another server listens there", path.display()),
                ));
            }
            std::fs::remove_file(path).map_err(|e| at(e, "removing the stale socket"))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(at(e, "looking at")),
    }
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| at(e.into(), "a socket for"))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| at(e.into(), "the socket address"))?;
    rustix::net::bind(&fd, &addr).map_err(|e| at(e.into(), "binding"))?;
    let listening = rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(0o600))
        .and_then(|()| rustix::net::listen(&fd, 16));
    if let Err(e) = listening {
        let _ = std::fs::remove_file(path);
        return Err(at(e.into(), "making private and listening on"));
    }
    Ok(UnixListener::from(fd))
}

/// Maps `len` bytes of the client's file at `offset`: shared and writable if the device may
/// write it, otherwise a private read-only view (which this process never writes).
///
/// Touching a mapping beyond the end of its file raises SIGBUS, which would end this process
/// and every device it serves. So only a file that can never shrink is mapped: a memfd
/// sealed with F_SEAL_SHRINK (as QEMU's memfd backend seals by default), checked before its
/// size is read (seals are never removed), covering the whole range. For any other file
/// (`Ok(None)`) the caller reaches the memory through DMA_READ / DMA_WRITE messages instead,
/// where a truncated file is the client's error, not this process's fault.
#[allow(unsafe_code)]
fn map_client_file(
    fd: OwnedFd,
    offset: u64,
    len: usize,
    write: bool,
) -> io::Result<Option<memmap2::MmapMut>> {
    // The seals first: once F_SEAL_SHRINK is there, the size read after it can only grow.
    let sealed = rustix::fs::fcntl_get_seals(&fd).is_ok_and(|s| s.contains(rustix::fs::SealFlags::SHRINK));
    let st = rustix::fs::fstat(&fd)?;
    let regular = rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    if regular && !sealed {
        return Ok(None);
    }
    let end = offset.checked_add(len as u64);
    if !regular || end.is_none_or(|e| e > st.st_size as u64) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "not a regular file covering {offset:#x}+{len:#x} (type {:?}, {} bytes)",
                rustix::fs::FileType::from_raw_mode(st.st_mode),
                st.st_size
            ),
        ));
    }
    let file = File::from(fd);
    let mut o = memmap2::MmapOptions::new();
    o.offset(offset).len(len);
    if write {
        // SAFETY: the mapping is guest memory shared with the VMM by design; the guest and
        // the VMM may change it at any time, so this process only ever copies bytes in and
        // out of it (no references into it outlive a copy), which stays sound whatever
        // they do concurrently. The file is sealed against shrinking and covers the range,
        // so no access to the mapping can fault.
        unsafe { o.map_mut(&file) }.map(Some)
    } else {
        // SAFETY: as above; the private mapping is never written here.
        unsafe { o.map_copy(&file) }.map(Some)
    }
}

impl VfioUserServer {
    /// Serves `device` on a UNIX socket at `path`, created with mode 0600 whatever the umask
    /// (only this user may connect: the socket is the VM's door to the device). A stale socket
    /// there (nobody listening) is replaced; a live one, or anything that is not a socket, is
    /// left alone and refused.
    pub fn bind(path: &Path, device: RemoteDevice, wait: PollMode) -> io::Result<VfioUserServer> {
        let listener = bind_private(path)?;
        listener.set_nonblocking(true)?;
        let mut device = device;
        let msix_cap = find_capability(&mut device, 0x11);
        let msix = msix_table(&mut device);
        let pcie_cap = find_capability(&mut device, 0x10);
        let counters = Arc::new(Counters::default());
        let n = msix.map_or(0, |m| m.vectors as usize);
        let routes = Arc::new(Mutex::new(Routes {
            msix: (0..n).map(|_| None).collect(),
            masked: vec![false; n],
            err: None,
            err_signalled: false,
            counters: counters.clone(),
        }));
        let sink_routes = routes.clone();
        device.set_interrupt_sink(Some(Box::new(move |v| lock(&sink_routes).fire(v))));
        log::info!("vfio-user: serving {} on {} ({} MSI-X vectors)", device.box_id(), path.display(), n);
        Ok(VfioUserServer {
            listener,
            path: path.to_path_buf(),
            device,
            wait,
            idle_since: None,
            said_no_link_fd: false,
            routes,
            msix,
            msix_cap,
            pcie_cap,
            counters,
            logged_failures: 0,
        })
    }

    /// The counters, shared: they stay readable while [`VfioUserServer::serve`] runs.
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The device served.
    pub fn device(&self) -> &RemoteDevice {
        &self.device
    }

    /// Gives the device back (the socket file is removed).
    pub fn into_device(self) -> RemoteDevice {
        let _ = std::fs::remove_file(&self.path);
        self.device.set_interrupt_sink(None);
        self.device
    }

    /// Serves clients, one at a time, until `stop` is set.
    pub fn serve(&mut self, stop: &AtomicBool) -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    bump(&self.counters.clients);
                    log::info!("vfio-user {}: client connected", self.path.display());
                    self.serve_client(stream, stop);
                    self.client_gone();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait_for(None, false, Duration::from_millis(50));
                    self.device.service();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Waits until the client, the link or a new connection has something, or `cap` passes.
    /// Returns whether the client socket is readable.
    fn wait_for(&mut self, client: Option<BorrowedFd<'_>>, want_write: bool, cap: Duration) -> bool {
        let link = self.device.link_fd();
        let spinning = match self.wait {
            PollMode::Busy { spin } => {
                self.idle_since.get_or_insert_with(std::time::Instant::now).elapsed() < spin
            }
            PollMode::Blocking => false,
        };
        let timeout = if spinning {
            Duration::ZERO
        } else if link.is_none() {
            if !self.said_no_link_fd {
                self.said_no_link_fd = true;
                log::info!(
                    "vfio-user {}: the link driver has no descriptor to sleep on (io_uring after \
                     sleeping in its multishot receive); waking every millisecond while it has none",
                    self.path.display()
                );
            }
            cap.min(Duration::from_millis(1))
        } else {
            self.device.next_timer().map_or(cap, |t| t.min(cap))
        };
        let link = link.map(|fd| {
            // The descriptor belongs to the device's socket, which outlives this call.
            #[allow(unsafe_code)]
            // SAFETY: `fd` is the device's open socket, alive for the whole call since
            // `self.device` is borrowed for it.
            unsafe {
                BorrowedFd::borrow_raw(fd)
            }
        });
        let mut fds = Vec::with_capacity(3);
        if let Some(c) = client {
            let events = if want_write { PollFlags::IN | PollFlags::OUT } else { PollFlags::IN };
            fds.push(PollFd::from_borrowed_fd(c, events));
        }
        fds.push(PollFd::new(&self.listener, PollFlags::IN));
        if let Some(l) = link {
            fds.push(PollFd::from_borrowed_fd(l, PollFlags::IN));
        }
        let ts = Timespec { tv_sec: timeout.as_secs() as i64, tv_nsec: timeout.subsec_nanos() as i64 };
        let _ = rustix::event::poll(&mut fds, Some(&ts));
        client.is_some() && !fds[0].revents().is_empty()
    }

    fn serve_client(&mut self, stream: UnixStream, stop: &AtomicBool) {
        // Non-blocking: the client's bytes are taken as they come (see `Channel`), and the
        // link is driven between them whatever the client does.
        if let Err(e) = stream.set_nonblocking(true) {
            log::error!("vfio-user {}: client socket: {e}", self.path.display());
            return;
        }
        let client_fd = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::error!("vfio-user {}: client socket: {e}", self.path.display());
                return;
            }
        };
        let chan = Arc::new(Mutex::new(Channel::new(stream)));
        let mut session = ClientState { version: false, chan: chan.clone() };
        while !stop.load(Ordering::Relaxed) {
            // Commands that arrived while this side waited on the client come first.
            let next = {
                let mut c = lock(&chan);
                match c.deferred.pop_front() {
                    Some(m) => Some(Ok(m)),
                    None => c.next_message(),
                }
            };
            let msg = match next {
                Some(Ok(m)) => Some(m),
                Some(Err(RecvError::TooLarge(h))) => {
                    log::warn!(
                        "vfio-user {}: {} of {} bytes is over the {MAX_MESSAGE}-byte limit",
                        self.path.display(),
                        cmd::name(h.command),
                        h.size
                    );
                    bump(&self.counters.errors);
                    if lock(&chan).send(&proto::error_reply(&h, errno::E2BIG)).is_err() {
                        return;
                    }
                    None
                }
                Some(Err(e)) => {
                    self.log_closing(&e);
                    return;
                }
                None => {
                    let want_write = lock(&chan).has_unsent();
                    let ready = self.wait_for(Some(client_fd.as_fd()), want_write, Duration::from_millis(10));
                    self.refuse_others();
                    let mut c = lock(&chan);
                    if let Err(e) = c.flush() {
                        log::info!("vfio-user {}: client gone while replying: {e}", self.path.display());
                        return;
                    }
                    if ready && let Err(e) = c.fill() {
                        self.log_closing(&e);
                        return;
                    }
                    if let Some(why) = c.stalled(Instant::now()) {
                        bump(&self.counters.stalled);
                        log::warn!("vfio-user {}: dropping the client: {why}", self.path.display());
                        return;
                    }
                    None
                }
            };
            if let Some(m) = msg {
                self.idle_since = None;
                let reply = self.handle(&mut session, m);
                let mut c = lock(&chan);
                if let Some(r) = reply
                    && let Err(e) = c.send(&r)
                {
                    log::info!("vfio-user {}: client gone while replying: {e}", self.path.display());
                    return;
                }
                if c.gone {
                    log::info!("vfio-user {}: client gone", self.path.display());
                    return;
                }
            }
            // Device DMA, MSI-X, link timers.
            if self.device.service() {
                self.idle_since = None;
            }
            self.report_removal();
            let lost = lock(&chan).lost.take();
            if let Some(why) = lost {
                bump(&self.counters.stalled);
                log::warn!("vfio-user {}: dropping the client: {why}", self.path.display());
                return;
            }
        }
    }

    fn log_closing(&self, e: &RecvError) {
        match e {
            RecvError::Closed => log::info!("vfio-user {}: client disconnected", self.path.display()),
            RecvError::Fatal(why) => {
                log::warn!("vfio-user {}: closing the connection: {why}", self.path.display())
            }
            RecvError::TooLarge(h) => log::warn!(
                "vfio-user {}: closing the connection: {} of {} bytes",
                self.path.display(),
                cmd::name(h.command),
                h.size
            ),
        }
    }

    /// Connections that arrive while a client is served are closed at once.
    fn refuse_others(&self) {
        while let Ok((s, _)) = self.listener.accept() {
            bump(&self.counters.refused);
            log::warn!("vfio-user {}: refused a second client: one is being served", self.path.display());
            drop(s);
        }
    }

    /// What is left of a client that went away: its memory and eventfds are dropped, and
    /// the device is quiesced and reset for the next one.
    fn client_gone(&mut self) {
        self.device.unmap_all_windows();
        {
            let mut r = lock(&self.routes);
            r.msix.iter_mut().for_each(|f| *f = None);
            r.masked.iter_mut().for_each(|m| *m = false);
            r.err = None;
            r.err_signalled = false;
        }
        self.reset_device();
    }

    /// Bus Master Enable off (no more DMA), then a function-level reset, then the 100 ms
    /// the spec asks before the function is used again (PCIe 6.0 §6.6.2).
    fn reset_device(&mut self) {
        bump(&self.counters.resets);
        let mut c = [0u8; 2];
        self.device.config_read_bytes(0x04, &mut c);
        let command = u16::from_le_bytes(c) & !(1 << 2);
        self.device.config_write_bytes(0x04, &command.to_le_bytes());
        let Some(cap) = self.pcie_cap else {
            log::warn!("vfio-user {}: the device has no PCI Express capability: no FLR", self.path.display());
            return;
        };
        let mut b = [0u8; 4];
        self.device.config_read_bytes(cap + 4, &mut b);
        if u32::from_le_bytes(b) & (1 << 28) == 0 {
            log::warn!("vfio-user {}: the device cannot do a function-level reset", self.path.display());
            return;
        }
        let mut ctl = [0u8; 2];
        self.device.config_read_bytes(cap + 8, &mut ctl);
        let ctl = u16::from_le_bytes(ctl) | 1 << 15;
        self.device.config_write_bytes(cap + 8, &ctl.to_le_bytes());
        let until = std::time::Instant::now() + Duration::from_millis(100);
        while std::time::Instant::now() < until {
            self.device.service();
            std::thread::sleep(Duration::from_millis(5));
        }
        log::info!("vfio-user {}: device reset (FLR)", self.path.display());
    }

    /// Writes MSI-X table entry `v` of the device: the host endpoint's interrupt window, the
    /// vector as data, masked or not.
    fn program_vector(&self, v: u32, masked: bool) {
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
    fn program_routed(&self) {
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
    fn program_vectors(&self, entries: &[(u32, bool)]) {
        for &(v, masked) in entries {
            self.program_vector(v, masked);
        }
    }

    fn handle(&mut self, s: &mut ClientState, m: Message) -> Option<Vec<u8>> {
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
            log::warn!("vfio-user {}: reply {} to nothing asked; dropped", self.path.display(), h.id);
            return None;
        }
        let req = match proto::parse_request(h.command, &m.payload, MAX_DATA_XFER) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("vfio-user {}: {e}", self.path.display());
                return answer(Err(errno::EINVAL), &self.counters);
            }
        };
        let expects_fds = matches!(req, Request::DmaMap { .. } | Request::SetIrqs { .. });
        if !m.fds.is_empty() && !expects_fds {
            log::warn!(
                "vfio-user {}: {} came with file descriptors",
                self.path.display(),
                cmd::name(h.command)
            );
            return answer(Err(errno::EINVAL), &self.counters);
        }
        if !s.version && !matches!(req, Request::Version { .. }) {
            log::warn!("vfio-user {}: {} before VERSION", self.path.display(), cmd::name(h.command));
            return answer(Err(errno::EINVAL), &self.counters);
        }
        let r = match req {
            Request::Version { major, minor, caps } => {
                if major != 0 {
                    log::warn!(
                        "vfio-user {}: client speaks version {major}.{minor}; this server 0.1",
                        self.path.display()
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
            Request::DmaMap { flags, offset, address, size } => {
                self.dma_map(s, flags, offset, address, size, m.fds)
            }
            Request::DmaUnmap { address, size, flags, .. } => {
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
                    Ok(m.payload[..24].to_vec())
                } else {
                    log::debug!(
                        "vfio-user {}: DMA_UNMAP of {address:#x}+{size:#x}: not mapped",
                        self.path.display()
                    );
                    Err(errno::ENOENT)
                }
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
            Request::RegionWriteMulti { writes } => {
                let mut done = 0u64;
                let mut r = Ok(());
                for w in &writes {
                    r = self.region_access(w.region, w.offset, Access::Write(&w.data[..w.count as usize]));
                    if r.is_err() {
                        break;
                    }
                    done += 1;
                }
                r.map(|()| done.to_le_bytes().to_vec())
            }
            Request::DeviceReset => {
                self.reset_device();
                self.program_routed();
                Ok(Vec::new())
            }
            Request::Unsupported { command } => {
                log::debug!(
                    "vfio-user {}: {} ({command}) not implemented",
                    self.path.display(),
                    cmd::name(command)
                );
                Err(if command == cmd::DEVICE_FEATURE { errno::ENOTSUP } else { errno::ENOSYS })
            }
        };
        answer(r, &self.counters)
    }

    fn dma_map(
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
                self.path.display(),
                fds.len()
            );
            return Err(errno::EINVAL);
        }
        let Ok(len) = usize::try_from(size) else { return Err(errno::EINVAL) };
        if self.device.window_count() >= MAX_DMA_MAPS as usize {
            log::warn!("vfio-user {}: DMA_MAP: {MAX_DMA_MAPS} windows already mapped", self.path.display());
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
                        self.path.display()
                    );
                    let io = ClientDma { chan: s.chan.clone(), counters: self.counters.clone() };
                    self.device.map_client_window(BusAddr(address), len, Box::new(io), read, write)
                }
                Err(e) => {
                    log::warn!(
                        "vfio-user {}: DMA_MAP {address:#x}+{size:#x}: cannot map the client's file at {offset:#x}: {e}",
                        self.path.display()
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
                log::warn!("vfio-user {}: DMA_MAP: {why}", self.path.display());
                Err(errno::EEXIST)
            }
        }
    }

    fn region_info(&self, argsz: u32, index: u32) -> Result<Vec<u8>, u32> {
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

    fn irq_info(&self, argsz: u32, index: u32) -> Result<Vec<u8>, u32> {
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

    fn set_irqs(
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
    fn set_err_irq(
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
    fn report_removal(&self) {
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
                self.path.display()
            );
        }
    }

    fn region_access(&mut self, index: u32, offset: u64, access: Access<'_>) -> Result<(), u32> {
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
                log::debug!("vfio-user {}: region access refused: {e}", self.path.display());
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
                    self.path.display()
                );
            }
        }
        Ok(())
    }
}

/// Per-connection state.
struct ClientState {
    version: bool,
    chan: Arc<Mutex<Channel>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Channel, UnixStream) {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        (Channel::new(a), b)
    }

    fn header(command: u16, size: u32) -> [u8; proto::HEADER_LEN] {
        Header { id: 3, command, size, flags: proto::flags::COMMAND, error: 0 }.emit()
    }

    #[test]
    fn a_message_is_taken_only_once_whole_whatever_pieces_it_comes_in() {
        let (mut c, peer) = pair();
        let m = proto::message(3, cmd::VERSION, proto::flags::COMMAND, 0, b"0123456789");
        for (i, b) in m.iter().enumerate() {
            (&peer).write_all(&[*b]).unwrap();
            c.fill().ok().unwrap();
            let got = c.next_message();
            if i + 1 < m.len() {
                assert!(got.is_none(), "taken after {} of {} bytes", i + 1, m.len());
                assert!(c.partial_since.is_some());
            } else {
                let got = got.unwrap().ok().unwrap();
                assert_eq!((got.header.command, &got.payload[..]), (cmd::VERSION, &b"0123456789"[..]));
            }
        }
        assert!(c.partial_since.is_none() && !c.rx.in_message());
    }

    #[test]
    fn a_message_left_unfinished_is_a_stall_after_the_message_timeout() {
        let (mut c, peer) = pair();
        (&peer).write_all(&header(cmd::VERSION, 40)[..8]).unwrap();
        c.fill().ok().unwrap();
        assert!(c.next_message().is_none());
        let now = Instant::now();
        assert!(c.stalled(now).is_none());
        let why = c.stalled(now + MESSAGE_TIMEOUT + Duration::from_millis(10)).unwrap();
        assert!(why.contains("8 bytes"), "{why}");
    }

    #[test]
    fn an_oversized_message_is_skipped_as_it_arrives_and_the_next_one_read() {
        let (mut c, peer) = pair();
        let size = MAX_MESSAGE + 1000;
        let writer = std::thread::spawn(move || {
            (&peer).write_all(&header(cmd::REGION_WRITE, size)).unwrap();
            (&peer).write_all(&vec![0u8; (size as usize) - proto::HEADER_LEN]).unwrap();
            (&peer).write_all(&proto::message(4, cmd::VERSION, proto::flags::COMMAND, 0, b"x")).unwrap();
            peer
        });
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while seen.len() < 2 && Instant::now() < deadline {
            c.wait(Duration::from_millis(10));
            c.fill().ok().unwrap();
            while let Some(m) = c.next_message() {
                seen.push(match m {
                    Err(RecvError::TooLarge(h)) => ("too large", h.size),
                    Ok(m) => ("message", m.header.size),
                    Err(_) => ("error", 0),
                });
            }
            // Never more than one largest message and a read held.
            assert!(c.rx.held() <= MAX_MESSAGE as usize + READ_CHUNK);
        }
        let _peer = writer.join().unwrap();
        assert_eq!(seen, [("too large", size), ("message", proto::HEADER_LEN as u32 + 1)]);
    }

    #[test]
    fn a_client_that_takes_no_replies_is_dropped_by_time_or_by_volume() {
        let (mut c, _peer) = pair();
        // Replies pile up once the socket's buffer is full; none is lost while they do.
        let reply = vec![0u8; 64 << 10];
        while !c.has_unsent() {
            c.send(&reply).unwrap();
        }
        let now = Instant::now();
        assert!(c.stalled(now).is_none());
        let why = c.stalled(now + CLIENT_TIMEOUT + Duration::from_millis(10)).unwrap();
        assert!(why.contains("taken none"), "{why}");
        // And past MAX_UNSENT bytes at once, whatever the time.
        let mut refused = false;
        for _ in 0..=(MAX_UNSENT / reply.len()) {
            if c.send(&reply).is_err() {
                refused = true;
                break;
            }
        }
        assert!(refused && c.gone, "{} bytes queued", c.tx.len() - c.tx_sent);
        assert!(c.tx.len() - c.tx_sent <= MAX_UNSENT);
    }

    #[test]
    fn a_dma_read_the_client_never_answers_fails_within_the_reply_timeout() {
        let (mut c, peer) = pair();
        let t = Instant::now();
        let e = c.call(cmd::DMA_READ, &proto::dma_read(0x1000, 8)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(t.elapsed() < DMA_REPLY_TIMEOUT + Duration::from_millis(100), "{:?}", t.elapsed());
        assert!(c.gone && c.lost.is_some());
        drop(peer);
    }

    #[test]
    fn descriptors_beyond_the_limit_end_the_connection() {
        let (mut c, peer) = pair();
        let files: Vec<File> = (0..9).map(|_| File::open("/dev/null").unwrap()).collect();
        for chunk in files.chunks(8).chain(files.chunks(8)) {
            let fds: Vec<BorrowedFd<'_>> = chunk.iter().map(|f| f.as_fd()).collect();
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
            assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
            rustix::net::sendmsg(
                &peer,
                &[io::IoSlice::new(&[0u8])],
                &mut control,
                rustix::net::SendFlags::empty(),
            )
            .unwrap();
        }
        // 8 + 1 + 8 + 1 descriptors with 4 bytes of a header: more than one message may carry.
        let r = c.fill();
        assert!(matches!(r, Err(RecvError::Fatal(ref why)) if why.contains("file descriptors")));
    }
}
