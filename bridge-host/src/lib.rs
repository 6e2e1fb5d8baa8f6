//! The host endpoint: remote devices made local. [`RemoteDevice`] attaches one device that
//! a GPU-box endpoint (`bridge-gpu`, `dxpu gpu`) exports and implements the PCI function
//! access ([`driver::PciFunction`]) that drivers are written against, so the unchanged
//! simgpu driver runs on a GPU in another box:
//!
//! - **Config space** as the host sees it: BAR registers (placement and sizing) and the
//!   Expansion ROM BAR are virtualized here; every other register is forwarded to the
//!   device as CfgRd/CfgWr.
//! - **MMIO** reads become MRd with a 10-bit tag and a completion timeout; writes become
//!   posted MWr. Host-view BAR addresses are translated to where the box placed the BARs.
//! - **DMA** from the device is served only inside windows the host granted (the DMA arena
//!   [`PciFunction::dma_alloc`] hands out, and windows mapped with [`RemoteDevice::map_window`]);
//!   anything else is answered with Unsupported Request (reads) or dropped (writes), counted,
//!   and logged with the device and address.
//! - **MSI-X** writes from the device to the interrupt window become interrupts that
//!   [`PciFunction::wait_interrupt`] consumes.
//! - **Failure**: a read whose completion does not come within the completion timeout, or
//!   any read after the link went down, returns all-ones as a read of a vanished PCIe device
//!   does, and the device is reported surprise-removed ([`RemoteDevice::removed`]).
//! - **IDs**: requests carry the host's requester ID; config requests are retargeted from
//!   the device's host-view BDF to its BDF on the box, and the box's BDF in what the device
//!   sends is known as the host-view BDF in logs and counters.
//!
//! The calling thread drives the link itself (run-to-completion): a register read queues
//! its MRd, transmits it, and polls the socket until the completion arrives, serving device
//! DMA that arrives meanwhile. In busy-poll mode with the io_uring driver that path makes no
//! system call beyond the io_uring submission. A service thread keeps the session alive
//! (keepalives, acknowledgements, DMA served) while the caller is not inside a call.
//!
//! ```no_run
//! use bridge_host::{AttachOptions, RemoteDevice};
//! use driver::{SimGpuDriver, WaitMode};
//! use simgpu_abi::op;
//! use link::PresharedKey;
//!
//! let key = PresharedKey::new(b"a key of at least sixteen bytes!").unwrap();
//! let opts = AttachOptions::new("192.0.2.7:7440".parse().unwrap(), "gpu0", key);
//! let remote = RemoteDevice::attach(opts).unwrap();
//! // The simgpu driver, unchanged, on a GPU in another box.
//! let mut gpu = SimGpuDriver::open(remote).unwrap();
//! gpu.memcpy_to_device(0, &[1, 2, 3, 4]).unwrap();
//! gpu.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap();
//! println!("{:?}", gpu.pci().stats());
//! ```
#![deny(unsafe_code)]

pub mod vfio_user;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridge::attach::{BarInfo, Control};
use bridge::{Dispatcher, Kept};
use driver::{BusAddr, DmaBuf, PciFunction};
use link::driver::{AnyUdp, Clock, DriverKind, Impaired, Impairment, PollMode, SessionRunner};
use link::{DownReason, Event, PresharedKey, SendError, Session, Time};
use tlp::rules::{self, Rcb, TransferSize};
use tlp::{Address, Bdf, Body, ConfigTarget, CplStatus, Request, Tag, TlpRepr};

/// Bytes of a PCI Express function's config space.
const CONFIG_SPACE: usize = 4096;
/// Where the device's MSI-X writes land: the x86 interrupt window, as every platform gives it.
pub use driver::MSI_BASE;
/// Bus address of the DMA arena.
pub const DMA_ARENA_BASE: u64 = 0x1_0000_0000;
/// Where the host view places 64-bit BARs.
pub const BAR64_BASE: u64 = 0x80_0000_0000;
/// Where the host view places 32-bit BARs.
pub const BAR32_BASE: u64 = 0xc000_0000;

/// How to attach a remote device.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The GPU-box endpoint.
    pub server: SocketAddr,
    /// The device's name there.
    pub device: String,
    /// Session settings; `link.psk` is this host's key.
    pub link: link::Config,
    /// Local address to bind (default: any address of the server's family, any port).
    pub bind: Option<SocketAddr>,
    /// Which UDP driver.
    pub driver: DriverKind,
    /// Busy-poll or blocking.
    pub poll: PollMode,
    /// Emulated network impairment on what this side sends.
    pub impairment: Impairment,
    /// The host's requester ID (its root port).
    pub host_id: Bdf,
    /// The device's BDF in the host's view.
    pub device_id: Bdf,
    /// Completion timeout of non-posted requests. The default, 250 ms, is the top of the
    /// PCIe Completion Timeout Range B (10 ms to 250 ms, PCIe 6.0 §7.5.3.16). A request during
    /// which the link recovered lost frames (retransmissions, NAKs, duplicates) may wait up
    /// to this plus four idle timeouts: a lossy link's replay back-off is not a device that
    /// stopped answering. The default
    /// range's 50 ms is too tight across a network: a completion must not pass the posted
    /// writes queued before it (PCIe ordering), and during bulk device→host DMA megabytes of
    /// them can be queued at the box.
    pub completion_timeout: Duration,
    /// How long the handshake and the attach may take.
    pub attach_timeout: Duration,
    /// Bytes of DMA memory in the arena `dma_alloc` hands out.
    pub dma_memory: usize,
    /// How often the service thread keeps the session alive while no call runs (`None`:
    /// no service thread; the caller must call often enough itself). Default 10 ms: well
    /// inside the keepalive interval. Shorter serves device DMA sooner while the caller is
    /// away, but every wake-up takes a core from busy-polling threads (at 1 ms the MMIO
    /// round trip's p99 tripled on a two-core machine: `dxpu bench bridge`).
    pub service_interval: Option<Duration>,
    /// A flag the caller sets to give up (a signal handler's): an attach in progress returns
    /// [`AttachError::Cancelled`] within a poll; an attached device then counts as removed
    /// ("cancelled") and every wait on it ends at once. The device can still be detached.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl AttachOptions {
    /// Defaults for attaching `device` at `server` with `key`.
    pub fn new(server: SocketAddr, device: &str, key: PresharedKey) -> AttachOptions {
        AttachOptions {
            server,
            device: device.to_string(),
            link: link::Config::new(key),
            bind: None,
            driver: DriverKind::Auto,
            poll: PollMode::Blocking,
            impairment: Impairment::default(),
            host_id: Bdf::new(0, 0, 0),
            device_id: Bdf::new(0, 1, 0),
            completion_timeout: Duration::from_millis(250),
            attach_timeout: Duration::from_secs(5),
            dma_memory: 64 << 20,
            service_interval: Some(Duration::from_millis(10)),
            cancel: None,
        }
    }
}

/// Closes the session of an attach that failed after the handshake (the box forgets it at
/// once), and passes the error on.
fn give_up<D: link::driver::Datagrams>(runner: &mut SessionRunner<D>, e: AttachError) -> AttachError {
    runner.session.close(runner.clock.now());
    let _ = runner.transmit();
    e
}

/// Why a device could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The socket could not be set up.
    #[error("UDP socket: {0}")]
    Socket(io::Error),
    /// The options are inconsistent.
    #[error("{0}")]
    Config(String),
    /// The session did not come up.
    #[error("no session with {server}: {reason}")]
    Link {
        /// The box.
        server: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The box refused the device.
    #[error("{server} refused to attach {device}: {reason}")]
    Refused {
        /// The box.
        server: SocketAddr,
        /// The device asked for.
        device: String,
        /// The box's reason.
        reason: String,
    },
    /// No answer to the attach request.
    #[error("{server} did not answer the attach of {device} within {timeout:?}")]
    Timeout {
        /// The box.
        server: SocketAddr,
        /// The device.
        device: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The caller gave up (`AttachOptions::cancel`).
    #[error("attach cancelled")]
    Cancelled,
    /// DMA memory could not be mapped.
    #[error("DMA arena of {len} bytes: {error}")]
    Memory {
        /// Size asked for.
        len: usize,
        /// What failed.
        error: io::Error,
    },
}

/// What the host endpoint counted for one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostStats {
    /// TLPs sent to the box, by kind (`MRd64`, `CfgWr0`, …).
    pub tlps_sent: BTreeMap<&'static str, u64>,
    /// TLPs received from the box, by kind.
    pub tlps_received: BTreeMap<&'static str, u64>,
    /// Device DMA reads served from granted windows.
    pub dma_reads: u64,
    /// Device DMA writes into granted windows.
    pub dma_writes: u64,
    /// Device DMA reads outside every window (answered UR).
    pub dma_read_refused: u64,
    /// Device DMA writes outside every window (dropped).
    pub dma_write_dropped: u64,
    /// MSI-X messages received.
    pub interrupts: u64,
    /// Non-posted requests that timed out.
    pub completion_timeouts: u64,
    /// Completion timeouts that found the link had been recovering lost frames and were
    /// extended (see `AttachOptions::completion_timeout`).
    pub completion_timeouts_extended: u64,
    /// Non-posted requests failed because the link went down or the device was removed.
    pub failed_requests: u64,
    /// Completions that matched no outstanding request.
    pub stray_completions: u64,
    /// MMIO to host addresses no BAR claims (all-ones, nothing sent).
    pub unclaimed_mmio: u64,
    /// The session's counters.
    pub link: link::Stats,
}

#[derive(Clone, Copy, Debug, Default)]
struct VirtualBar {
    info: BarInfo,
    /// The BAR's value as the host programmed it (address bits above the size only).
    host: u64,
}

impl VirtualBar {
    fn flags(&self) -> u32 {
        (self.info.is_64 as u32) << 2 | (self.info.prefetchable as u32) << 3
    }
    fn mask(&self) -> u64 {
        let m = !(self.info.size.wrapping_sub(1));
        if self.info.is_64 { m } else { m & 0xffff_ffff }
    }
}

/// Memory that lives with a client elsewhere (a VMM's guest memory it did not share as a
/// file), reached through messages rather than loads and stores.
pub trait ClientMemory: Send {
    /// Reads `out.len()` bytes at bus address `addr`.
    fn read(&mut self, addr: u64, out: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at bus address `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> io::Result<()>;
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
    bus: u64,
    mem: Memory,
    read: bool,
    write: bool,
}

impl Window {
    fn end(&self) -> u64 {
        self.bus + self.mem.len() as u64
    }
    fn contains(&self, addr: u64, len: usize) -> bool {
        addr >= self.bus && addr.checked_add(len as u64).is_some_and(|e| e <= self.end())
    }
}

/// The BARs of an attached device as the box placed them, for callers that address BARs
/// by index (a vfio-user client does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BarView {
    /// Size in bytes (0: no BAR here, or the upper half of a 64-bit BAR).
    pub size: u64,
    /// Memory space (not IO).
    pub memory: bool,
    /// 64-bit.
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    status: Option<CplStatus>,
    data: [u8; 8],
    received: usize,
}

struct Inner {
    runner: SessionRunner<Impaired<AnyUdp>>,
    name: String,
    server: SocketAddr,
    host_id: Bdf,
    device_id: Bdf,
    box_id: Bdf,
    /// Largest completion payload toward the device: its Max_Payload_Size (Device
    /// Control, snooped as the host writes it), within what a link frame carries.
    max_payload: TransferSize,
    link_max_payload: u32,
    /// Offset of the Device Control register (PCI Express capability + 8).
    device_control: Option<u16>,
    bars: [VirtualBar; 6],
    /// Granted DMA windows by bus address (a VMM with a vIOMMU grants thousands of pages).
    windows: BTreeMap<u64, Window>,
    next_alloc: usize,
    /// Outstanding non-posted requests, by 10-bit tag.
    pending: Box<[Option<Pending>; 1024]>,
    next_tag: u16,
    interrupts: HashMap<u32, u64>,
    /// Completions the session could not queue yet (its completion queue was full), in order.
    held: VecDeque<Vec<u8>>,
    /// The device's memory reads taken from the receive buffer during a poll, answered right
    /// after it.
    dispatcher: Dispatcher<()>,
    /// Where MSI-X messages go as they arrive, if a caller asked.
    interrupt_sink: Option<Box<dyn FnMut(u32) + Send>>,
    /// Whether the DMA arena exists.
    arena: bool,
    removed: Option<String>,
    /// `AttachOptions::cancel`.
    cancel: Option<Arc<AtomicBool>>,
    timeout: Duration,
    /// The most a completion may take while the link is recovering lost frames (see
    /// `Inner::wait_for`): the completion timeout plus four idle timeouts.
    recovering_timeout: Duration,
    sent: [u64; 256],
    received: [u64; 256],
    stats: HostStats,
    logged_refusals: u64,
}

/// A device in another box, attached and usable as a local PCI function.
pub struct RemoteDevice {
    inner: Arc<Mutex<Inner>>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
    abandoned: bool,
    clock: Clock,
    /// When the caller last entered (nanoseconds on `clock`), for the service thread.
    last_call: Arc<AtomicU64>,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // A panic while holding the lock leaves counters, not invariants, half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn kind_index(t: &TlpRepr<'_>) -> usize {
    t.kind() as u8 as usize
}

fn kind_counts(counts: &[u64; 256]) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for (i, n) in counts.iter().enumerate() {
        if *n > 0
            && let Some(k) = tlp::Kind::BY_BYTE0[i]
        {
            out.insert(k.name(), *n);
        }
    }
    out
}

impl RemoteDevice {
    /// Connects to the box, authenticates, attaches the device and places its BARs in the
    /// host's view.
    pub fn attach(opts: AttachOptions) -> Result<RemoteDevice, AttachError> {
        opts.link.validate().map_err(|e| AttachError::Config(e.to_string()))?;
        // Host memory first: a failure here must not leave the device held on the box.
        let arena = (opts.dma_memory > 0)
            .then(|| memmap2::MmapMut::map_anon(opts.dma_memory))
            .transpose()
            .map_err(|error| AttachError::Memory { len: opts.dma_memory, error })?;
        let bind = opts.bind.unwrap_or(match opts.server {
            SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
            SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
        });
        let sock =
            AnyUdp::bind(bind, opts.driver, &mut |m| log::info!("{m}")).map_err(AttachError::Socket)?;
        if !opts.impairment.is_none() {
            log::warn!("impairing what this endpoint sends: {:?}", opts.impairment);
        }
        let sock = Impaired::new(sock, opts.impairment);
        let clock = Clock::new();
        let mut rng = link::driver::os_rng(&mut |m| log::warn!("{m}"));
        let epoch = rng.nonzero_u32();
        let session = Session::client(opts.link.clone(), clock.now(), epoch, rng);
        let mut runner = SessionRunner::new(sock, opts.server, session, clock, opts.poll);
        let link_err = |reason: String| AttachError::Link { server: opts.server, reason };
        let cancelled = || opts.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));

        // Handshake.
        let mut down = None;
        let up = runner
            .run_until(opts.attach_timeout, |s| {
                while let Some(e) = s.poll_event() {
                    if let Event::Down(r) = e {
                        down = Some(r);
                    }
                }
                s.is_up() || down.is_some() || cancelled()
            })
            .map_err(AttachError::Socket)?;
        if cancelled() {
            return Err(AttachError::Cancelled);
        }
        if let Some(r) = down {
            return Err(link_err(match r {
                DownReason::AuthFailed => {
                    "authentication failed: the box does not hold this host's key".into()
                }
                DownReason::Refused => "the box refused the session: it has no room for another".into(),
                other => other.to_string(),
            }));
        }
        if !up {
            return Err(link_err(format!("no handshake within {:?}", opts.attach_timeout)));
        }

        // Attach.
        let _ =
            runner.session.send_tlp(&Control::Attach { device: opts.device.clone() }.to_tlp(opts.host_id));
        let mut answer = None;
        let done = runner
            .run_until(opts.attach_timeout, |s| {
                while let Some(t) = s.recv_tlp() {
                    if let Ok(c @ (Control::Attached { .. } | Control::Refused { .. })) =
                        Control::from_tlp(&t)
                    {
                        answer = Some(c);
                    }
                }
                answer.is_some() || s.is_down() || cancelled()
            })
            .map_err(AttachError::Socket)?;
        // From here on a failure closes the session, so the box forgets it at once instead
        // of at its idle timeout.
        if cancelled() {
            return Err(give_up(&mut runner, AttachError::Cancelled));
        }
        let (box_id, max_payload, bar_info) = match answer {
            Some(Control::Attached { box_id, max_payload, bars, .. }) => (box_id, max_payload, bars),
            Some(Control::Refused { reason, .. }) => {
                let e = AttachError::Refused { server: opts.server, device: opts.device, reason };
                return Err(give_up(&mut runner, e));
            }
            _ if done => return Err(link_err("the link went down during the attach".into())),
            _ => {
                let e = AttachError::Timeout {
                    server: opts.server,
                    device: opts.device,
                    timeout: opts.attach_timeout,
                };
                return Err(give_up(&mut runner, e));
            }
        };

        // The host's view of the BARs, placed as firmware would.
        let mut bars = [VirtualBar::default(); 6];
        let (mut at64, mut at32) = (BAR64_BASE, BAR32_BASE);
        for (i, (v, info)) in bars.iter_mut().zip(bar_info).enumerate() {
            // What the box says about its BARs is checked like any input from the network.
            let limit = if info.is_64 { 1u64 << 46 } else { 1 << 30 };
            if info.size != 0 && (!info.size.is_power_of_two() || info.size > limit || info.size < 16) {
                let e =
                    link_err(format!("the box described BAR{i} with an impossible size {:#x}", info.size));
                return Err(give_up(&mut runner, e));
            }
            v.info = info;
            if info.size != 0 && info.memory {
                let cursor = if info.is_64 { &mut at64 } else { &mut at32 };
                v.host = cursor.div_ceil(info.size) * info.size;
                *cursor = v.host + info.size;
                if !info.is_64 && *cursor > 1 << 32 {
                    let e = link_err(format!(
                        "the 32-bit BARs do not fit below 4 GiB in the host's view (BAR{i}, {:#x} bytes)",
                        info.size
                    ));
                    return Err(give_up(&mut runner, e));
                }
            }
        }
        let mut windows = BTreeMap::new();
        if let Some(arena) = arena {
            let arena = Window { bus: DMA_ARENA_BASE, mem: Memory::Local(arena), read: true, write: true };
            windows.insert(DMA_ARENA_BASE, arena);
        }
        log::info!(
            "attached {} at {} (box {box_id}, host view {}), Max_Payload_Size {max_payload} B",
            opts.device,
            opts.server,
            opts.device_id
        );
        let inner = Inner {
            runner,
            name: opts.device.clone(),
            server: opts.server,
            host_id: opts.host_id,
            device_id: opts.device_id,
            box_id,
            max_payload: TransferSize::B128,
            link_max_payload: max_payload as u32,
            device_control: None,
            bars,
            windows,
            next_alloc: 0,
            pending: Box::new([None; 1024]),
            next_tag: 0,
            interrupts: HashMap::new(),
            held: VecDeque::new(),
            dispatcher: Dispatcher::new(),
            interrupt_sink: None,
            arena: opts.dma_memory > 0,
            removed: None,
            cancel: opts.cancel.clone(),
            timeout: opts.completion_timeout,
            recovering_timeout: opts.completion_timeout + 4 * opts.link.idle_timeout,
            sent: [0; 256],
            received: [0; 256],
            stats: HostStats::default(),
            logged_refusals: 0,
        };
        let mut inner = inner;
        inner.learn_max_payload();
        let clock = inner.runner.clock;
        let inner = Arc::new(Mutex::new(inner));
        let stop = Arc::new(AtomicBool::new(false));
        let last_call = Arc::new(AtomicU64::new(0));
        let service = opts.service_interval.map(|every| {
            let (inner, stop, last_call) = (inner.clone(), stop.clone(), last_call.clone());
            std::thread::Builder::new().name(format!("dxpu-host-{}", opts.device)).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(every);
                    // Only when the caller has not been driving the link itself: taking the
                    // lock under a busy caller would only delay its next access.
                    let idle = clock.now().as_nanos().saturating_sub(last_call.load(Ordering::Relaxed));
                    if idle >= every.as_nanos() as u64
                        && let Ok(mut g) = inner.try_lock()
                    {
                        g.pump();
                    }
                }
            })
        });
        let service = match service {
            Some(Ok(h)) => Some(h),
            Some(Err(e)) => return Err(AttachError::Socket(e)),
            None => None,
        };
        Ok(RemoteDevice { inner, stop, service, abandoned: false, clock, last_call })
    }

    /// Locks the device's state for a call from the driver, noting the time for the service
    /// thread.
    fn enter(&self) -> MutexGuard<'_, Inner> {
        self.last_call.store(self.clock.now().as_nanos(), Ordering::Relaxed);
        lock(&self.inner)
    }

    /// Why the device counts as surprise-removed, if it does.
    pub fn removed(&self) -> Option<String> {
        lock(&self.inner).removed.clone()
    }

    /// Counters.
    pub fn stats(&self) -> HostStats {
        let g = lock(&self.inner);
        let mut s = g.stats.clone();
        s.tlps_sent = kind_counts(&g.sent);
        s.tlps_received = kind_counts(&g.received);
        s.link = *g.runner.session.stats();
        s
    }

    /// Which UDP driver carries the session (`io_uring` or `portable`).
    pub fn driver_name(&self) -> &'static str {
        use link::driver::Datagrams;
        lock(&self.inner).runner.sock.inner().name()
    }

    /// The device's BDF on the box.
    pub fn box_id(&self) -> Bdf {
        lock(&self.inner).box_id
    }

    /// Grants the device a DMA window: `mem` at bus address `bus`, readable and/or writable
    /// by the device. Refused if it overlaps a window already granted.
    pub fn map_window(&self, bus: u64, mem: memmap2::MmapMut, read: bool, write: bool) -> Result<(), String> {
        lock(&self.inner).add_window(Window { bus, mem: Memory::Local(mem), read, write })
    }

    /// Grants the device a DMA window of `len` bytes at bus address `bus` that lives with a
    /// client and is reached through `io`. Refused if it overlaps a window already granted.
    pub fn map_client_window(
        &self,
        bus: u64,
        len: usize,
        io: Box<dyn ClientMemory>,
        read: bool,
        write: bool,
    ) -> Result<(), String> {
        lock(&self.inner).add_window(Window { bus, mem: Memory::Client { len, io }, read, write })
    }

    /// Revokes the window that starts at `bus` and is `len` bytes long (any length if
    /// `None`); DMA to it is refused from now on. False if there is no such window.
    pub fn unmap_window(&self, bus: u64, len: Option<usize>) -> bool {
        let mut g = lock(&self.inner);
        let arena = g.arena;
        let found = g
            .windows
            .get(&bus)
            .is_some_and(|w| len.is_none_or(|l| l == w.mem.len()) && !(arena && w.bus == DMA_ARENA_BASE));
        found && g.windows.remove(&bus).is_some()
    }

    /// Revokes every window that lies wholly inside `bus..bus + len` (the DMA arena
    /// excepted), as VFIO's type1 IOMMU unmaps a range; returns how many.
    pub fn unmap_range(&self, bus: u64, len: u64) -> usize {
        let mut g = lock(&self.inner);
        let arena = g.arena;
        let end = bus.saturating_add(len);
        let inside: Vec<u64> = g
            .windows
            .range(bus..end)
            .filter(|(b, w)| w.end() <= end && !(arena && **b == DMA_ARENA_BASE))
            .map(|(b, _)| *b)
            .collect();
        for b in &inside {
            g.windows.remove(b);
        }
        inside.len()
    }

    /// Granted DMA windows (the arena included).
    pub fn window_count(&self) -> usize {
        lock(&self.inner).windows.len()
    }

    /// Revokes every window but the DMA arena.
    pub fn unmap_all_windows(&self) {
        let mut g = lock(&self.inner);
        let arena = g.arena;
        g.windows.retain(|bus, _| arena && *bus == DMA_ARENA_BASE);
    }

    /// The device's BARs, by index.
    pub fn bars(&self) -> [BarView; 6] {
        let g = lock(&self.inner);
        g.bars.map(|b| BarView {
            size: b.info.size,
            memory: b.info.memory,
            is_64: b.info.is_64,
            prefetchable: b.info.prefetchable,
        })
    }

    /// Reads `out.len()` bytes at `offset` in BAR `bar` (memory BARs), whatever the host
    /// view's BAR registers say; a read that fails returns all-ones. False if the access is
    /// outside the BAR.
    pub fn bar_read(&self, bar: usize, offset: u64, out: &mut [u8]) -> bool {
        let mut g = self.enter();
        let Some(base) = g.bar_base(bar, offset, out.len()) else { return false };
        g.mmio_bytes(base + offset, Access::Read(out));
        true
    }

    /// Writes `data` at `offset` in BAR `bar` (posted). False if outside the BAR.
    pub fn bar_write(&self, bar: usize, offset: u64, data: &[u8]) -> bool {
        let mut g = self.enter();
        let Some(base) = g.bar_base(bar, offset, data.len()) else { return false };
        g.mmio_bytes(base + offset, Access::Write(data));
        true
    }

    /// Reads config bytes at `offset` (any alignment) as the host sees them.
    pub fn config_read_bytes(&self, offset: u16, out: &mut [u8]) {
        let mut g = self.enter();
        let mut at = offset as usize;
        let end = offset as usize + out.len();
        // Past the 4 KiB of config space nothing answers.
        if end > CONFIG_SPACE {
            let inside = CONFIG_SPACE.saturating_sub(at).min(out.len());
            out[inside..].fill(0xff);
        }
        let end = end.min(CONFIG_SPACE);
        while at < end {
            let dw = g.config_read((at & !3) as u16).to_le_bytes();
            let stop = ((at & !3) + 4).min(end);
            for a in at..stop {
                out[a - offset as usize] = dw[a & 3];
            }
            at = stop;
        }
    }

    /// Writes config bytes at `offset` (any alignment): each DW touched is written with
    /// byte enables for exactly the bytes given, so neighbouring registers (write-1-to-clear
    /// Status beside Command, say) are not written.
    pub fn config_write_bytes(&self, offset: u16, data: &[u8]) {
        let mut g = self.enter();
        let mut at = offset as usize;
        let end = (offset as usize + data.len()).min(CONFIG_SPACE);
        while at < end {
            let base = at & !3;
            let stop = (base + 4).min(end);
            let mut dw = [0u8; 4];
            let mut be = 0u8;
            for a in at..stop {
                dw[a & 3] = data[a - offset as usize];
                be |= 1 << (a & 3);
            }
            g.config_write_be(base as u16, u32::from_le_bytes(dw), be);
            at = stop;
        }
    }

    /// Routes MSI-X messages (by their data value, which [`PciFunction::msi_message`]
    /// makes the vector number) to `sink` as they arrive, instead of keeping them for
    /// [`PciFunction::wait_interrupt`]. `None` goes back to keeping them.
    pub fn set_interrupt_sink(&self, sink: Option<Box<dyn FnMut(u32) + Send>>) {
        lock(&self.inner).interrupt_sink = sink;
    }

    /// One pass over the link for a caller that drives it itself (no service thread):
    /// receives, serves device DMA, runs timers, sends. True if anything happened.
    pub fn service(&self) -> bool {
        self.enter().pump()
    }

    /// A descriptor that becomes readable when the link has something to receive, for a
    /// caller that waits on it beside its own. `None` when there is none now: the io_uring
    /// driver has one only while it spins (after a wait in the kernel, its multishot
    /// receive's completions are signalled on no descriptor until it spins again). Ask
    /// before each wait.
    pub fn link_fd(&self) -> Option<std::os::fd::RawFd> {
        use link::driver::Datagrams;
        lock(&self.inner).runner.sock.poll_fd()
    }

    /// How long until the link's next timer, for a caller that drives the link itself.
    pub fn next_timer(&self) -> Option<Duration> {
        lock(&self.inner).runner.next_timer()
    }

    /// Detaches: what is in flight completes, the box takes the device back (and resets
    /// it), the session closes.
    pub fn detach(mut self) {
        self.shut_down();
    }

    /// Lets go of the device without detaching or closing the session, as a host process
    /// that is killed does: the box learns of it only from the link's idle timeout. For
    /// tests of that failure.
    pub fn abandon(mut self) {
        self.abandoned = true;
    }

    fn shut_down(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.service.take() {
            let _ = h.join();
        }
        if self.abandoned {
            return;
        }
        let mut g = lock(&self.inner);
        // A device the caller cancelled is still there: it is detached as usual.
        let cancelled = g.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed));
        if (g.removed.is_none() || cancelled) && g.runner.session.is_up() {
            let detach = Control::Detach { device: g.name.clone() }.to_tlp(g.host_id);
            let _ = g.runner.session.send_tlp(&detach);
            let _ = g.runner.run_until(Duration::from_millis(200), |s| s.is_idle() || s.is_down());
            log::info!("detached {} from {}", g.name, g.server);
        }
        let now = g.runner.clock.now();
        g.runner.session.close(now);
        let _ = g.runner.transmit();
    }
}

impl Drop for RemoteDevice {
    fn drop(&mut self) {
        self.shut_down();
    }
}

impl Inner {
    /// Whether the caller gave up (`AttachOptions::cancel`): then the device counts as
    /// removed, so that every wait ends.
    fn cancelled(&mut self) -> bool {
        if self.removed.is_none() && self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
            log::info!("{} ({}): cancelled; its accesses fail from now on", self.name, self.device_id);
            self.removed = Some("cancelled: the endpoint is stopping".into());
            self.fail_pending();
        }
        self.removed.is_some()
    }

    fn fail_pending(&mut self) {
        for p in self.pending.iter_mut() {
            if p.take().is_some() {
                self.stats.failed_requests += 1;
            }
        }
    }

    fn remove(&mut self, why: String) {
        if self.removed.is_none() {
            log::error!("{} ({}): surprise removal: {why}", self.name, self.device_id);
            self.removed = Some(why);
        }
        self.fail_pending();
    }

    /// One pass over the link: receive, run timers, serve what arrived, send.
    fn pump(&mut self) -> bool {
        let now = self.runner.clock.now();
        self.pump_at(now)
    }

    /// [`Inner::pump`] at `now`, a time the caller read just before.
    fn pump_at(&mut self, now: Time) -> bool {
        // The dispatcher hands over posted writes (DMA into host memory, MSI-X) and the
        // completions of this side's reads where they lie in the receive buffer: a payload is
        // copied once, into host memory (or the waiting read's result). The device's memory
        // reads (and any other non-posted request) are kept and answered right after the
        // receive, which needs the session.
        let Inner {
            runner,
            windows,
            interrupts,
            interrupt_sink,
            stats,
            received,
            logged_refusals,
            name,
            device_id,
            pending,
            dispatcher,
            ..
        } = self;
        let who = (name.as_str(), *device_id);
        let mut in_place = |(): (), t: &TlpRepr<'_>| {
            received[kind_index(t)] += 1;
            match t.body {
                Body::MemWrite { .. } => {
                    let mut irq = Interrupts { counts: interrupts, sink: interrupt_sink };
                    posted_write(t, windows, &mut irq, stats, logged_refusals, who)
                }
                Body::Completion { .. } => take_completion(t, pending, stats),
                // Messages from the device (power management, vendor-defined) are not acted on.
                _ => {}
            }
        };
        let mut sink = |bytes: &[u8]| dispatcher.route((), bytes, &mut in_place);
        let polled = runner.receive_at(now, Some(&mut sink));
        // What the session queued instead (nothing, unless it received outside a pump) goes
        // the same way.
        while let Some(b) = runner.session.recv_tlp() {
            dispatcher.route((), &b, &mut in_place);
            runner.session.recycle(b);
        }
        let mut active = match polled {
            Ok(n) => n > 0,
            Err(e) => {
                log::error!("{}: socket: {e}", self.name);
                false
            }
        };
        while let Some(e) = self.runner.session.poll_event() {
            if let Event::Down(r) = e {
                self.remove(format!("link to {} down: {r}", self.server));
            }
        }
        while let Some(b) = self.held.front() {
            if self.runner.session.send_tlp(b).is_err() {
                break;
            }
            self.held.pop_front();
        }
        if !self.dispatcher.is_empty() {
            active = true;
            // Out of `self` while they are answered (answering needs all of it).
            let mut dispatcher = std::mem::take(&mut self.dispatcher);
            dispatcher.drain(|(), kept| match kept {
                Kept::Request(t) => self.answer_request(&t),
                // The box sends no control message once attached; one is dropped.
                Kept::Control(_) | Kept::BadControl(_) => {}
            });
            self.dispatcher = dispatcher;
        }
        // One send for the answers and whatever the timers made due.
        match self.runner.transmit_at(now) {
            Ok(n) => active |= n > 0,
            Err(e) => log::error!("{}: socket: {e}", self.name),
        }
        active
    }

    /// Queues a request of the caller's, waiting (up to the completion timeout) while the
    /// session's queue for its class is full.
    fn send(&mut self, t: &TlpRepr<'_>) -> bool {
        self.sent[kind_index(t)] += 1;
        // The clock is read only if the queue is full (not on the way of every request).
        let mut deadline = None;
        loop {
            // Emitted straight into the buffer its frame is sent from, again on each try.
            match self.runner.session.send_repr(t) {
                Ok(()) => return true,
                Err(SendError::QueueFull { .. }) => {
                    let timeout = self.timeout;
                    if Instant::now() >= *deadline.get_or_insert_with(|| Instant::now() + timeout) {
                        self.remove(format!("the link took no {} for {:?}", t.kind().name(), self.timeout));
                        return false;
                    }
                    if !self.pump() {
                        let _ = self.runner.wait();
                    }
                    if self.cancelled() {
                        return false;
                    }
                }
                Err(e) => {
                    log::error!("{}: cannot send {}: {e}", self.name, t.kind().name());
                    return false;
                }
            }
        }
    }

    /// Queues a completion this side owes the device; never waits: if the session's queue
    /// is full it is held, in order, and goes at the next pump.
    fn answer(&mut self, c: &TlpRepr<'_>) {
        queue_or_hold(&mut self.runner.session, &mut self.held, &mut self.sent, c);
    }

    fn tag(&mut self) -> Tag {
        for _ in 0..1024 {
            self.next_tag = (self.next_tag + 1) & Tag::MAX;
            if self.pending[self.next_tag as usize].is_none() {
                break;
            }
        }
        Tag::from_bits(self.next_tag)
    }

    /// What the session has done to recover lost frames so far: retransmissions, NAKs
    /// either way, duplicates received (the peer retransmitting what its lost ACKs did not
    /// confirm), frames beyond the window.
    fn recovery_count(&self) -> u64 {
        let s = self.runner.session.stats();
        s.retransmits + s.naks_sent + s.naks_received + s.duplicate_data + s.dropped_out_of_window
    }

    /// Waits for the completion of the request with `tag`. The completion timeout runs from
    /// the send. On a clean link it is exactly the configured one. If the link was
    /// recovering lost frames while the request waited (it counted some since the request
    /// left), the request may wait up to `recovering_timeout`: a lossy link's replay back-off
    /// (up to `max_replay_timeout` per attempt, for frames either way) is not mistaken for a
    /// device that stopped answering, and a box that is really gone is found by the link's
    /// idle timeout first.
    fn wait_for(&mut self, tag: Tag) -> Option<(CplStatus, [u8; 8], usize)> {
        // One clock reading serves the send and the timeout.
        let sent_at = self.runner.clock.now();
        if let Err(e) = self.runner.transmit_at(sent_at) {
            log::error!("{}: socket: {e}", self.name);
        }
        let mut deadline = sent_at + self.timeout;
        let recovered = self.recovery_count();
        let mut extended = false;
        loop {
            let slot = tag.value() as usize;
            let now = match self.pending[slot] {
                None => return None,
                Some(p) if p.status.is_some() => {
                    self.pending[slot] = None;
                    return Some((p.status?, p.data, p.received));
                }
                Some(_) => self.runner.clock.now(),
            };
            if self.cancelled() {
                return None;
            }
            if now >= deadline {
                let cap = sent_at + self.recovering_timeout;
                if !extended && self.recovery_count() > recovered && now < cap {
                    extended = true;
                    deadline = cap;
                    self.stats.completion_timeouts_extended += 1;
                    continue;
                }
                self.stats.completion_timeouts += 1;
                let waited = now - sent_at;
                let why = format!("no completion for tag {tag} within {waited:.0?}");
                self.remove(why);
                return None;
            }
            if !self.pump_at(now) {
                if self.removed.is_some() {
                    return None;
                }
                let _ = self.runner.wait();
            }
        }
    }

    fn request(&mut self, t: &TlpRepr<'_>, tag: Tag) -> Option<(CplStatus, [u8; 8], usize)> {
        if self.cancelled() {
            self.stats.failed_requests += 1;
            return None;
        }
        self.pending[tag.value() as usize] = Some(Pending { status: None, data: [0; 8], received: 0 });
        if !self.send(t) {
            self.pending[tag.value() as usize] = None;
            self.stats.failed_requests += 1;
            return None;
        }
        self.wait_for(tag)
    }

    fn config(&mut self, offset: u16, write: Option<u32>) -> u32 {
        self.config_be(offset, write, 0xf)
    }

    /// A config request with byte enables `be` (a write of only some bytes of the DW).
    fn config_be(&mut self, offset: u16, write: Option<u32>, be: u8) -> u32 {
        let tag = self.tag();
        let req = Request { requester: self.host_id, tag, first_be: be, last_be: 0 };
        // Retargeted from the host-view BDF to the device's BDF on the box.
        let cfg = ConfigTarget { type1: false, target: self.box_id, register: offset & 0xffc };
        let data = write.unwrap_or(0).to_le_bytes();
        let body = match write {
            Some(_) => Body::CfgWrite { req, cfg, data: &data },
            None => Body::CfgRead { req, cfg },
        };
        match self.request(&TlpRepr::new(body), tag) {
            Some((CplStatus::Success, d, n)) if n >= 4 => u32::from_le_bytes([d[0], d[1], d[2], d[3]]),
            Some((CplStatus::Success, ..)) => 0,
            _ => u32::MAX,
        }
    }

    /// Finds the PCI Express capability and reads Max_Payload_Size from Device Control.
    fn learn_max_payload(&mut self) {
        let mut at = (self.config(0x34, None) & 0xfc) as u16;
        for _ in 0..48 {
            if at == 0 || self.removed.is_some() {
                return;
            }
            let h = self.config(at, None);
            if h & 0xff == 0x10 {
                self.device_control = Some(at + 8);
                let ctl = self.config(at + 8, None);
                self.set_max_payload(ctl);
                return;
            }
            at = ((h >> 8) & 0xfc) as u16;
        }
    }

    fn set_max_payload(&mut self, device_control: u32) {
        // PCIe 6.0 §7.5.3.4: Max_Payload_Size is bits 7:5, 128 << n bytes.
        let bytes = (128u32 << ((device_control >> 5) & 7)).min(self.link_max_payload).min(4096);
        self.max_payload = TransferSize::from_bytes(bytes).unwrap_or(TransferSize::B128);
    }

    /// The box address behind host-view address `addr`.
    fn translate(&self, addr: u64, len: u64) -> Option<u64> {
        self.bars.iter().find_map(|b| {
            let host = b.host & b.mask();
            let inside = addr >= host
                && addr.checked_add(len).is_some_and(|end| end <= host.saturating_add(b.info.size));
            (b.info.size != 0 && b.info.memory && host != 0 && inside)
                .then(|| b.info.address.wrapping_add(addr - host))
        })
    }

    fn window(&mut self, addr: u64, len: usize, write: bool) -> Option<&mut [u8]> {
        let w = find_window(&mut self.windows, addr, len, write)?;
        let off = (addr - w.bus) as usize;
        match &mut w.mem {
            Memory::Local(m) => Some(&mut m[off..off + len]),
            Memory::Client { .. } => None,
        }
    }

    fn add_window(&mut self, w: Window) -> Result<(), String> {
        let (bus, end) = (w.bus, w.bus.checked_add(w.mem.len() as u64));
        let end = end.ok_or(format!("window at {bus:#x} wraps"))?;
        if w.mem.len() == 0 {
            return Err(format!("window at {bus:#x} is empty"));
        }
        // The last window starting below `end` is the only one that can overlap.
        if let Some((_, o)) = self.windows.range(..end).next_back()
            && o.end() > bus
        {
            return Err(format!("window {bus:#x}..{end:#x} overlaps {:#x}..{:#x}", o.bus, o.end()));
        }
        self.windows.insert(bus, w);
        Ok(())
    }

    /// The box address of memory BAR `bar` if `len` bytes at `offset` lie inside it.
    fn bar_base(&self, bar: usize, offset: u64, len: usize) -> Option<u64> {
        let b = self.bars.get(bar)?;
        let inside = offset.checked_add(len as u64).is_some_and(|e| e <= b.info.size);
        (b.info.size != 0 && b.info.memory && inside && len > 0).then_some(b.info.address)
    }

    /// A memory access of any size and alignment at box address `addr`, in pieces a device
    /// takes as one register access: an aligned QW as one two-DW request, otherwise one
    /// request per DW with byte enables for the bytes inside it.
    fn mmio_bytes(&mut self, addr: u64, access: Access<'_>) {
        let (n, mut out, data) = match access {
            Access::Read(o) => (o.len(), Some(o), None),
            Access::Write(d) => (d.len(), None, Some(d)),
        };
        let mut done = 0;
        while done < n {
            let at = addr + done as u64;
            let piece =
                if at.is_multiple_of(8) && n - done >= 8 { 8 } else { (4 - (at % 4) as usize).min(n - done) };
            let lane = (at % 4) as usize;
            let (first_be, last_be, length_dw) =
                if piece == 8 { (0xf, 0xf, 2) } else { ((((1u16 << piece) - 1) << lane) as u8, 0, 1) };
            let mut dw = [0u8; 8];
            if let Some(d) = data {
                dw[lane..lane + piece].copy_from_slice(&d[done..done + piece]);
            }
            let got =
                self.mem_request(at & !3, length_dw, first_be, last_be, data.map(|_| &dw[..length_dw * 4]));
            if let Some(o) = out.as_mut() {
                let bytes = got.unwrap_or([0xff; 8]);
                o[done..done + piece].copy_from_slice(&bytes[lane..lane + piece]);
            }
            done += piece;
        }
    }

    /// One memory request to box address `addr` (DW-aligned); a read returns its data,
    /// `None` if it failed.
    fn mem_request(
        &mut self,
        addr: u64,
        length_dw: usize,
        first_be: u8,
        last_be: u8,
        write: Option<&[u8]>,
    ) -> Option<[u8; 8]> {
        if self.removed.is_some() {
            self.stats.failed_requests += write.is_none() as u64;
            return None;
        }
        let tag = self.tag();
        let req = Request { requester: self.host_id, tag, first_be, last_be };
        let address = Address::new(addr);
        match write {
            Some(data) => {
                let t = TlpRepr::new(Body::MemWrite { req, address, ph: 0, data });
                if self.send(&t)
                    && let Err(e) = self.runner.transmit()
                {
                    log::error!("{}: socket: {e}", self.name);
                }
                None
            }
            None => {
                let t = TlpRepr::new(Body::MemRead {
                    req,
                    address,
                    ph: 0,
                    length_dw: length_dw as u16,
                    locked: false,
                });
                match self.request(&t, tag) {
                    Some((CplStatus::Success, d, n)) if n >= length_dw * 4 => Some(d),
                    _ => None,
                }
            }
        }
    }
}

/// A completion for one of this side's requests: its data and, once the request is
/// complete, its status go into the tag's entry.
fn take_completion(t: &TlpRepr<'_>, pending: &mut [Option<Pending>; 1024], stats: &mut HostStats) {
    let Body::Completion { cpl, data, .. } = t.body else { return };
    let Some(p) = pending[cpl.tag.value() as usize].as_mut() else {
        stats.stray_completions += 1;
        return;
    };
    if let Some(d) = data {
        let n = d.len().min(8 - p.received);
        p.data[p.received..p.received + n].copy_from_slice(&d[..n]);
        p.received += n;
    }
    if rules::completes_request(&cpl, data) {
        p.status = Some(cpl.status);
    }
}

/// Queues a completion into the session, emitted straight into its buffer, or holds it (in
/// order, behind any already held) when the session's queue is full.
fn queue_or_hold(
    session: &mut Session,
    held: &mut VecDeque<Vec<u8>>,
    sent: &mut [u64; 256],
    c: &TlpRepr<'_>,
) {
    sent[kind_index(c)] += 1;
    let queued = held.is_empty() && session.send_repr(c).is_ok();
    if !queued {
        let mut b = vec![0u8; c.buffer_len()];
        let n = c.emit(&mut b).unwrap_or(0);
        b.truncate(n);
        held.push_back(b);
    }
}

/// The window that holds `len` bytes at `addr` and allows the access.
fn find_window(
    windows: &mut BTreeMap<u64, Window>,
    addr: u64,
    len: usize,
    write: bool,
) -> Option<&mut Window> {
    let (_, w) = windows.range_mut(..=addr).next_back()?;
    if !w.contains(addr, len) {
        return None;
    }
    if (write && !w.write) || (!write && !w.read) {
        return None;
    }
    Some(w)
}

fn log_refusal(count: &mut u64, (name, id): (&str, Bdf), what: &str, addr: u64, len: usize) {
    *count += 1;
    let n = *count;
    if n <= 16 || n.is_power_of_two() {
        log::warn!(
            "{name} ({id}): device DMA {what} of {len} bytes at {addr:#x} outside every granted window ({n} so far)"
        );
    }
}

/// A posted write from the device: an MSI-X message (an interrupt for its data value), or
/// DMA into a granted window (byte enables honoured); anything else is dropped and counted.
fn posted_write(
    t: &TlpRepr<'_>,
    windows: &mut BTreeMap<u64, Window>,
    interrupts: &mut Interrupts<'_>,
    stats: &mut HostStats,
    refusals: &mut u64,
    who: (&str, Bdf),
) {
    let Body::MemWrite { req, address, data, .. } = t.body else { return };
    let addr = address.value();
    if (MSI_BASE..MSI_BASE + 0x10_0000).contains(&addr) && data.len() >= 4 {
        let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        stats.interrupts += 1;
        match interrupts.sink.as_mut() {
            Some(sink) => sink(v),
            None => *interrupts.counts.entry(v).or_default() += 1,
        }
        return;
    }
    let n = data.len();
    let Some(w) = find_window(windows, addr, n, true) else {
        stats.dma_write_dropped += 1;
        log_refusal(refusals, who, "write", addr, n);
        return;
    };
    let off = (addr - w.bus) as usize;
    match &mut w.mem {
        Memory::Local(m) => rules::write_enabled_bytes(&mut m[off..off + n], data, req.first_be, req.last_be),
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
                log::warn!("{} ({}): device DMA write of {n} bytes at {addr:#x} failed: {e}", who.0, who.1);
                return;
            }
        }
    }
    stats.dma_writes += 1;
}

/// A memory access: bytes to fill, or bytes to write.
pub(crate) enum Access<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// Where MSI-X messages go: counted for `wait_interrupt`, or to the caller's sink.
struct Interrupts<'a> {
    counts: &'a mut HashMap<u32, u64>,
    sink: &'a mut Option<Box<dyn FnMut(u32) + Send>>,
}

impl Inner {
    /// A non-posted request from the device, kept by the dispatcher: a DMA read served from
    /// a granted window, anything else answered with Unsupported Request.
    fn answer_request(&mut self, t: &TlpRepr<'_>) {
        self.received[kind_index(t)] += 1;
        match t.body {
            Body::MemRead { address, length_dw, .. } => {
                let (addr, len) = (address.value(), length_dw as usize * 4);
                let mps = self.max_payload;
                let host_id = self.host_id;
                // Split borrows: the window's bytes, the session, the held completions.
                let Inner { windows, runner, sent, held, .. } = self;
                match find_window(windows, addr, len, false) {
                    Some(w) => {
                        let off = (addr - w.bus) as usize;
                        let client;
                        let data = match &mut w.mem {
                            Memory::Local(m) => &m[off..off + len],
                            Memory::Client { io, .. } => {
                                let mut buf = vec![0u8; len];
                                if let Err(e) = io.read(addr, &mut buf) {
                                    log::warn!(
                                        "{} ({}): device DMA read of {len} bytes at {addr:#x} failed: {e}",
                                        self.name,
                                        self.device_id
                                    );
                                    self.stats.dma_read_refused += 1;
                                    let c = rules::completion_without_data(
                                        t,
                                        host_id,
                                        CplStatus::UnsupportedRequest,
                                    );
                                    self.answer(&c);
                                    return;
                                }
                                client = buf;
                                &client[..]
                            }
                        };
                        // Emitted from host memory straight into the session's queue.
                        rules::complete_read(t, host_id, data, Rcb::B64, mps, |c| {
                            queue_or_hold(&mut runner.session, held, sent, c)
                        });
                        self.stats.dma_reads += 1;
                    }
                    None => {
                        self.stats.dma_read_refused += 1;
                        log_refusal(
                            &mut self.logged_refusals,
                            (&self.name, self.device_id),
                            "read",
                            addr,
                            len,
                        );
                        let c = rules::completion_without_data(t, host_id, CplStatus::UnsupportedRequest);
                        self.answer(&c);
                    }
                }
            }
            _ => {
                if t.fc_class() == tlp::FcClass::NonPosted {
                    let c = rules::completion_without_data(t, self.host_id, CplStatus::UnsupportedRequest);
                    self.answer(&c);
                }
            }
        }
    }

    fn mmio(&mut self, addr: u64, len: usize, write: Option<u64>) -> u64 {
        let len = if len == 8 { 8 } else { 4 };
        let Some(target) = self.translate(addr, len as u64) else {
            self.stats.unclaimed_mmio += 1;
            return u64::MAX;
        };
        let (first_be, last_be) = if len == 8 { (0xf, 0xf) } else { (0xf, 0) };
        match write {
            Some(v) => {
                let b = v.to_le_bytes();
                self.mem_request(target, len / 4, first_be, last_be, Some(&b[..len]));
                0
            }
            None => match self.mem_request(target, len / 4, first_be, last_be, None) {
                Some(d) => {
                    let mut b = [0u8; 8];
                    b[..len].copy_from_slice(&d[..len]);
                    u64::from_le_bytes(b)
                }
                None => u64::MAX,
            },
        }
    }

    /// BAR register `i` is the upper half of the 64-bit BAR before it.
    fn upper_half(&self, i: usize) -> bool {
        i > 0 && self.bars[i - 1].info.is_64 && self.bars[i - 1].info.size != 0 && self.bars[i].info.size == 0
    }

    fn config_read(&mut self, offset: u16) -> u32 {
        let offset = offset & 0xffc;
        match offset {
            0x10..=0x27 => {
                let i = (offset as usize - 0x10) / 4;
                if self.upper_half(i) {
                    let b = &self.bars[i - 1];
                    return ((b.host & b.mask()) >> 32) as u32;
                }
                let b = &self.bars[i];
                if b.info.size == 0 {
                    return 0;
                }
                (b.host & b.mask()) as u32 | b.flags()
            }
            0x30 => 0, // no Expansion ROM in the host's view
            _ if self.removed.is_some() => u32::MAX,
            _ => self.config(offset, None),
        }
    }

    /// A config write of the bytes enabled by `be`. Registers virtualized here take the
    /// enabled bytes merged into their current value; the rest goes to the device with
    /// the byte enables as given.
    fn config_write_be(&mut self, offset: u16, value: u32, be: u8) {
        let offset = offset & 0xffc;
        if be == 0xf {
            return self.config_write(offset, value);
        }
        let virtual_reg = matches!(offset, 0x10..=0x27 | 0x30) || Some(offset) == self.device_control;
        if virtual_reg {
            let mut merged = self.config_read(offset).to_le_bytes();
            let new = value.to_le_bytes();
            for (i, b) in merged.iter_mut().enumerate() {
                if be & (1 << i) != 0 {
                    *b = new[i];
                }
            }
            return self.config_write(offset, u32::from_le_bytes(merged));
        }
        if self.removed.is_none() && be != 0 {
            self.config_be(offset, Some(value), be);
        }
    }

    fn config_write(&mut self, offset: u16, value: u32) {
        let offset = offset & 0xffc;
        match offset {
            0x10..=0x27 => {
                let i = (offset as usize - 0x10) / 4;
                if self.upper_half(i) {
                    let b = &mut self.bars[i - 1];
                    b.host = (value as u64) << 32 | (b.host & 0xffff_ffff);
                    b.host &= b.mask();
                    return;
                }
                let b = &mut self.bars[i];
                b.host = (b.host & 0xffff_ffff_0000_0000) | (value & !0xf) as u64;
                b.host &= b.mask();
            }
            0x30 => {}
            _ if self.removed.is_some() => {}
            _ if Some(offset) == self.device_control => {
                // Max_Payload_Size is the host's to choose only up to what one link frame
                // carries: a larger value is lowered before it reaches the device.
                let link = (self.link_max_payload.max(128) / 128).ilog2().min(5);
                let mps = ((value >> 5) & 7).min(link);
                let value = (value & !(7 << 5)) | mps << 5;
                self.config(offset, Some(value));
                self.set_max_payload(value);
            }
            _ => {
                self.config(offset, Some(value));
            }
        }
    }
}

impl PciFunction for RemoteDevice {
    fn config_read(&mut self, offset: u16) -> u32 {
        self.enter().config_read(offset)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        self.enter().config_write(offset, value)
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        self.enter().mmio(addr.get(), len, None)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.enter().mmio(addr.get(), len, Some(value));
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        let mut g = self.enter();
        let start = g.next_alloc.div_ceil(64) * 64;
        let end = start.checked_add(len)?;
        if !g.arena {
            return None;
        }
        let arena = g.windows.get_mut(&DMA_ARENA_BASE)?;
        let Memory::Local(mem) = &mut arena.mem else { return None };
        if end > mem.len() {
            return None;
        }
        mem[start..end].fill(0);
        g.next_alloc = end;
        Some(DmaBuf { bus: BusAddr(DMA_ARENA_BASE + start as u64), len })
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        let mut g = self.enter();
        // The caller is looking for what the device wrote: let it arrive.
        g.pump();
        match g.window(buf.bus.get() + offset as u64, out.len(), false) {
            Some(mem) => out.copy_from_slice(mem),
            None => out.fill(0xff),
        }
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        let mut g = self.enter();
        if let Some(mem) = g.window(buf.bus.get() + offset as u64, data.len(), true) {
            mem.copy_from_slice(data);
        }
    }
    fn removed(&self) -> Option<String> {
        RemoteDevice::removed(self)
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut g = self.enter();
        loop {
            if let Some(n) = g.interrupts.get_mut(&(vector as u32))
                && *n > 0
            {
                *n -= 1;
                return true;
            }
            if g.cancelled() || start.elapsed() >= timeout {
                return false;
            }
            if !g.pump() {
                let _ = g.runner.wait();
            }
        }
    }
}
