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

mod caps;
mod channel;
mod limits;
use channel::{Channel, RecvError};
pub use limits::{
    CLIENT_TIMEOUT, CONFIG_SIZE, DMA_REPLY_TIMEOUT, MAX_DATA_XFER, MAX_DMA_MAPS, MAX_MESSAGE, MAX_MSG_FDS,
    MAX_UNSENT, MESSAGE_TIMEOUT,
};
mod commands;
mod memory;
pub mod proto;

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::RemoteDevice;
use crate::socket_path::{SocketAccess, SocketPath};
use driver::{MsixTableInfo, find_capability, msix_table};
use link::driver::PollMode;
use proto::{cmd, errno};

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

/// Whether the peer of `client` has hung up, even with messages of its own still unread
/// (its last requests, sent just before it closed): the socket polls RDHUP, HUP or ERR. A
/// peek for end of file saw such a client as alive until its messages were read, so a VMM
/// reconnecting at once, or a bench's next client, was refused in the meantime.
fn hung_up(client: BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(client, PollFlags::RDHUP)];
    let now = Timespec { tv_sec: 0, tv_nsec: 0 };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A vfio-user server for one remote device.
pub struct VfioUserServer {
    listener: UnixListener,
    socket: SocketPath,
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
    /// A connection accepted while a client was served that had already hung up: served
    /// next ([`VfioUserServer::refuse_others`]).
    next_client: Option<UnixStream>,
}

impl VfioUserServer {
    /// Serves `device` on a UNIX socket at `path`, created with mode 0600 whatever the umask
    /// (only this user may connect: the socket is the VM's door to the device). A stale socket
    /// there (nobody listening) is replaced; a live one, or anything that is not a socket, is
    /// left alone and refused.
    pub fn bind(path: &Path, device: RemoteDevice, wait: PollMode) -> io::Result<VfioUserServer> {
        VfioUserServer::bind_with(path, SocketAccess::default(), device, wait)
    }

    /// [`VfioUserServer::bind`] with the socket's mode, owner and group given (a VMM that
    /// runs as another user — libvirt's QEMU — connects through a group).
    pub fn bind_with(
        path: &Path,
        access: SocketAccess,
        device: RemoteDevice,
        wait: PollMode,
    ) -> io::Result<VfioUserServer> {
        let (listener, socket) = crate::socket_path::bind(path, access)?;
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
            socket,
            device,
            wait,
            idle_since: None,
            said_no_link_fd: false,
            next_client: None,
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
        self.socket.path()
    }

    /// The device served.
    pub fn device(&self) -> &RemoteDevice {
        &self.device
    }

    /// Gives the device back (the socket file is removed, if the path still holds it).
    pub fn into_device(self) -> RemoteDevice {
        self.socket.remove();
        self.device.set_interrupt_sink(None);
        self.device
    }

    /// Serves clients, one at a time, until `stop` is set.
    pub fn serve(&mut self, stop: &AtomicBool) -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            let next = match self.next_client.take() {
                Some(s) => Ok(s),
                None => self.listener.accept().map(|(s, _)| s),
            };
            match next {
                Ok(stream) => {
                    bump(&self.counters.clients);
                    log::info!("vfio-user {}: client connected", self.socket.path().display());
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
                    self.socket.path().display()
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
        if self.next_client.is_none() {
            fds.push(PollFd::new(&self.listener, PollFlags::IN));
        }
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
            log::error!("vfio-user {}: client socket: {e}", self.socket.path().display());
            return;
        }
        let client_fd = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                log::error!("vfio-user {}: client socket: {e}", self.socket.path().display());
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
                        self.socket.path().display(),
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
                    self.refuse_others(client_fd.as_fd());
                    let mut c = lock(&chan);
                    if let Err(e) = c.flush() {
                        log::info!(
                            "vfio-user {}: client gone while replying: {e}",
                            self.socket.path().display()
                        );
                        return;
                    }
                    if ready && let Err(e) = c.fill() {
                        self.log_closing(&e);
                        return;
                    }
                    if let Some(why) = c.stalled(Instant::now()) {
                        bump(&self.counters.stalled);
                        log::warn!("vfio-user {}: dropping the client: {why}", self.socket.path().display());
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
                    log::info!("vfio-user {}: client gone while replying: {e}", self.socket.path().display());
                    return;
                }
                if c.gone {
                    log::info!("vfio-user {}: client gone", self.socket.path().display());
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
                log::warn!("vfio-user {}: dropping the client: {why}", self.socket.path().display());
                return;
            }
        }
    }

    fn log_closing(&self, e: &RecvError) {
        match e {
            RecvError::Closed => {
                log::info!("vfio-user {}: client disconnected", self.socket.path().display())
            }
            RecvError::Fatal(why) => {
                log::warn!("vfio-user {}: closing the connection: {why}", self.socket.path().display())
            }
            RecvError::TooLarge(h) => log::warn!(
                "vfio-user {}: closing the connection: {} of {} bytes",
                self.socket.path().display(),
                cmd::name(h.command),
                h.size
            ),
        }
    }

    /// Connections that arrive while a client is served are closed at once — unless the
    /// client served had hung up ([`hung_up`]) by the time the connection was accepted: then
    /// it is kept and served as soon as this one's end is read (a VMM that reconnects at
    /// once). The served client is looked at after each accept, not before: a check before
    /// it raced a client that hung up and reconnected while this thread was descheduled
    /// between the two, and refused the reconnection (3 of 150 `dxpu bench vfio-user` runs
    /// with a busy loop on one CPU).
    fn refuse_others(&mut self, client: BorrowedFd<'_>) {
        while self.next_client.is_none() {
            let Ok((s, _)) = self.listener.accept() else { return };
            if hung_up(client) {
                self.next_client = Some(s);
                return;
            }
            bump(&self.counters.refused);
            log::warn!(
                "vfio-user {}: refused a second client: one is being served",
                self.socket.path().display()
            );
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
            log::warn!(
                "vfio-user {}: the device has no PCI Express capability: no FLR",
                self.socket.path().display()
            );
            return;
        };
        let mut b = [0u8; 4];
        self.device.config_read_bytes(cap + 4, &mut b);
        if u32::from_le_bytes(b) & (1 << 28) == 0 {
            log::warn!(
                "vfio-user {}: the device cannot do a function-level reset",
                self.socket.path().display()
            );
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
        log::info!("vfio-user {}: device reset (FLR)", self.socket.path().display());
    }
}

/// Per-connection state.
struct ClientState {
    version: bool,
    chan: Arc<Mutex<Channel>>,
}

/// A device served to a VMM over vfio-user on a thread of its own, until stopped: the one
/// handle the host endpoint's static devices and its pool devices are both served through.
pub struct ServedDevice {
    watch: crate::RemovalWatch,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<RemoteDevice>>,
    path: std::path::PathBuf,
}

impl ServedDevice {
    /// Binds `path` with `access` and serves `device` there on a thread named after `name`,
    /// one client at a time, until [`ServedDevice::stop`].
    pub fn spawn(
        name: &str,
        path: &Path,
        access: SocketAccess,
        device: RemoteDevice,
        wait: PollMode,
    ) -> io::Result<ServedDevice> {
        let watch = device.removal_watch();
        let mut server = VfioUserServer::bind_with(path, access, device, wait)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new().name(format!("dxpu-vfio-user-{name}")).spawn(move || {
            if let Err(e) = server.serve(&s) {
                log::error!("vfio-user {}: {e}", server.path().display());
            }
            server.into_device()
        })?;
        Ok(ServedDevice { watch, stop, thread: Some(thread), path: path.to_path_buf() })
    }

    /// Tells from here whether the device was removed, and its counters.
    pub fn watch(&self) -> &crate::RemovalWatch {
        &self.watch
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops serving (the client's connection closes, the socket is removed) and gives the
    /// device back.
    pub fn stop(mut self) -> Result<RemoteDevice, ServerPanicked> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(d)) => Ok(d),
            _ => Err(ServerPanicked { socket: self.path.clone() }),
        }
    }
}

impl Drop for ServedDevice {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A vfio-user server's thread that ended by panicking: the device it held is lost with it.
#[derive(Debug, thiserror::Error)]
#[error("the vfio-user thread for {} panicked", socket.display())]
pub struct ServerPanicked {
    /// The socket it served.
    pub socket: std::path::PathBuf,
}

#[cfg(test)]
mod hangup_tests {
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    use super::hung_up;

    #[test]
    fn a_client_that_closed_with_messages_unread_has_hung_up_and_a_live_one_has_not() {
        let (served, mut client) = UnixStream::pair().unwrap();
        assert!(!hung_up(served.as_fd()), "alive, nothing sent");
        client.write_all(&[0u8; 16]).unwrap();
        assert!(!hung_up(served.as_fd()), "alive, a message unread");
        // Gone with its message still unread: a peek for end of file reads the message and
        // took it for alive.
        drop(client);
        assert!(hung_up(served.as_fd()));
        let mut b = [0u8; 1];
        let peeked = rustix::net::recv(served.as_fd(), &mut b, rustix::net::RecvFlags::PEEK).unwrap().0;
        assert_eq!(peeked, 1, "its message is still there to read");
    }
}
