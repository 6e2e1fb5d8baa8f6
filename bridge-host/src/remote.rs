//! [`RemoteDevice`]: an attached device as a caller holds it — the public API, the
//! [`PciFunction`] a driver is written against, and the service thread that keeps the link
//! alive between calls. The device's state lives behind one lock (`device::DeviceState`);
//! whichever thread holds it drives the link.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bridge::Dispatcher;
use bridge::attach::{Control, Origin};
use driver::{DmaBuf, Interrupts, PciFunction, WaitStep, wait_interrupt};
use link::driver::Clock;
use tlp::Bdf;

use crate::addr::BusAddr;
use crate::attach::{AttachError, AttachOptions, Attached};
use crate::config_view::BarView;
use crate::device::{Access, CONFIG_SPACE, DeviceState, Identity};
use crate::dma::{ClientMemory, DmaWindows};
use crate::error::HostError;
use crate::requester::{Requester, Silence};
use crate::stats::{HostStats, KindCounts};

/// A device in another box, attached and usable as a local PCI function.
pub struct RemoteDevice {
    inner: Arc<Mutex<DeviceState>>,
    stop: Arc<AtomicBool>,
    service: Option<JoinHandle<()>>,
    abandoned: bool,
}

fn lock(m: &Mutex<DeviceState>) -> MutexGuard<'_, DeviceState> {
    // A panic while holding the lock leaves counters, not invariants, half-updated.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RemoteDevice {
    /// Connects to the box, authenticates, attaches the device and places its BARs in the
    /// host's view (the phases are in `attach.rs`).
    pub fn attach(opts: AttachOptions) -> Result<RemoteDevice, AttachError> {
        opts.link.validate().map_err(|e| AttachError::Config(e.to_string()))?;
        // Host memory first: a failure here must not leave the device held on the box.
        let arena = (opts.dma_memory > 0)
            .then(|| memmap2::MmapMut::map_anon(opts.dma_memory))
            .transpose()
            .map_err(|error| AttachError::Memory { len: opts.dma_memory, error })?;
        let Attached { link, box_id, max_payload, view, origin } = crate::attach::attach(&opts)?;
        log::info!(
            device = opts.device.as_str(), peer = opts.server.to_string().as_str();
            "attached {} at {} (box {box_id}, host view {}), Max_Payload_Size {max_payload} B",
            opts.device,
            opts.server,
            opts.device_id,
        );
        let clock = link.clock;
        let mut state = DeviceState {
            link,
            id: Identity {
                name: opts.device.clone(),
                server: opts.server,
                host_id: opts.host_id,
                device_id: opts.device_id,
                box_id,
                origin,
            },
            view,
            windows: DmaWindows::new(arena, format!("{} ({})", opts.device, opts.device_id)),
            requester: Requester::new(
                opts.completion_timeout,
                opts.completion_timeout + 4 * opts.link.idle_timeout,
                Silence { quiet: 2 * opts.link.keepalive_interval, ride_through: opts.link.ride_through },
            ),
            interrupts: Interrupts::default(),
            interrupt_sink: None,
            held: VecDeque::new(),
            dispatcher: Dispatcher::new(),
            removed: None,
            cancel: opts.cancel.clone(),
            fence: opts.fence.clone(),
            sent: KindCounts::default(),
            received: KindCounts::default(),
            stats: HostStats::default(),
            last_pump: clock.now(),
            answer_slice: opts.answer_slice,
            spin: link::driver::SpinMeter::new(),
            sleeps: 0,
            too_large_seen: 0,
            route_checked: None,
        };
        state.learn_max_payload();
        let inner = Arc::new(Mutex::new(state));
        let stop = Arc::new(AtomicBool::new(false));
        let service = match opts.service_interval {
            Some(every) => Some(
                spawn_service(&opts.device, every, inner.clone(), stop.clone(), clock)
                    .map_err(AttachError::Socket)?,
            ),
            None => None,
        };
        Ok(RemoteDevice { inner, stop, service, abandoned: false })
    }

    /// Locks the device's state for a call from the driver.
    fn enter(&self) -> MutexGuard<'_, DeviceState> {
        lock(&self.inner)
    }

    /// Why the device counts as surprise-removed, if it does.
    pub fn removed(&self) -> Option<String> {
        lock(&self.inner).removed.clone()
    }

    /// Whether the box has been silent for the link's idle timeout and the device is riding
    /// it through (kept, not removed, until the ride-through time passes).
    pub fn silent(&self) -> bool {
        lock(&self.inner).link.session.is_silent()
    }

    /// A handle that tells from another thread whether the device was removed (for a device
    /// handed to a vfio-user server's thread).
    pub fn removal_watch(&self) -> RemovalWatch {
        RemovalWatch(self.inner.clone())
    }

    /// Counters.
    pub fn stats(&self) -> HostStats {
        stats_of(&lock(&self.inner))
    }

    /// Which UDP driver carries the session (`io_uring` or `portable`).
    pub fn driver_name(&self) -> &'static str {
        use link::driver::Datagrams;
        lock(&self.inner).link.sock.inner().name()
    }

    /// GSO, GRO and zero-copy sends as the session's driver uses them.
    pub fn offload(&self) -> link::driver::OffloadState {
        use link::driver::Datagrams;
        lock(&self.inner).link.sock.offload()
    }

    /// The link's MTU and the largest payload a TLP to or from the device carries now (its
    /// Max_Payload_Size as set, lowered to what one frame carries).
    pub fn payload_sizes(&self) -> (usize, u32) {
        let g = lock(&self.inner);
        (g.link.session.mtu(), g.view.max_payload().bytes())
    }

    /// The device's BDF on the box.
    pub fn box_id(&self) -> Bdf {
        lock(&self.inner).id.box_id
    }

    /// What the device is and where it sits (its IDs, the box's name, its PCI address there),
    /// as the box said at attach; none from a box of an earlier version.
    pub fn origin(&self) -> Option<Origin> {
        lock(&self.inner).id.origin.clone()
    }

    /// Grants the device a DMA window: `mem` at bus address `bus`, readable and/or writable
    /// by the device. Refused if it overlaps a window already granted, is empty or wraps.
    pub fn map_window(
        &self,
        bus: BusAddr,
        mem: memmap2::MmapMut,
        read: bool,
        write: bool,
    ) -> Result<(), HostError> {
        lock(&self.inner).windows.map(bus, mem, read, write)
    }

    /// Grants the device a DMA window of `len` bytes at bus address `bus` that lives with a
    /// client and is reached through `io`. Refused as [`RemoteDevice::map_window`] is.
    pub fn map_client_window(
        &self,
        bus: BusAddr,
        len: usize,
        io: Box<dyn ClientMemory>,
        read: bool,
        write: bool,
    ) -> Result<(), HostError> {
        lock(&self.inner).windows.map_client(bus, len, io, read, write)
    }

    /// Revokes the window that starts at `bus` and is `len` bytes long (any length if
    /// `None`); DMA to it is refused from now on. The DMA arena cannot be revoked.
    pub fn unmap_window(&self, bus: BusAddr, len: Option<usize>) -> Result<(), HostError> {
        lock(&self.inner).windows.unmap(bus, len)
    }

    /// Revokes every window that lies wholly inside `bus..bus + len` (the DMA arena
    /// excepted), as VFIO's type1 IOMMU unmaps a range; returns how many.
    pub fn unmap_range(&self, bus: BusAddr, len: u64) -> usize {
        lock(&self.inner).windows.unmap_range(bus, len)
    }

    /// Granted DMA windows (the arena included).
    pub fn window_count(&self) -> usize {
        lock(&self.inner).windows.len()
    }

    /// Revokes every window but the DMA arena.
    pub fn unmap_all_windows(&self) {
        lock(&self.inner).windows.unmap_all();
    }

    /// The device's BARs, by index.
    pub fn bars(&self) -> [BarView; 6] {
        lock(&self.inner).view.bars()
    }

    /// Reads `out.len()` bytes at `offset` in BAR `bar` (memory BARs), whatever the host
    /// view's BAR registers say; a read that fails returns all-ones.
    pub fn bar_read(&self, bar: usize, offset: u64, out: &mut [u8]) -> Result<(), HostError> {
        let mut g = self.enter();
        let base = g.view.bar_base(bar, offset, out.len()).ok_or(HostError::OutsideBar {
            bar,
            offset,
            len: out.len(),
        })?;
        g.mmio_bytes(base + offset, Access::Read(out));
        Ok(())
    }

    /// Writes `data` at `offset` in BAR `bar` (posted).
    pub fn bar_write(&self, bar: usize, offset: u64, data: &[u8]) -> Result<(), HostError> {
        let mut g = self.enter();
        let base = g.view.bar_base(bar, offset, data.len()).ok_or(HostError::OutsideBar {
            bar,
            offset,
            len: data.len(),
        })?;
        g.mmio_bytes(base + offset, Access::Write(data));
        Ok(())
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
        lock(&self.inner).link.sock.poll_fd()
    }

    /// How long until the link's next timer, for a caller that drives the link itself: no
    /// time while the device's requests wait to be answered (a pass with
    /// [`AttachOptions::answer_slice`] left some) or completions to be sent.
    pub fn next_timer(&self) -> Option<Duration> {
        let g = lock(&self.inner);
        if !g.dispatcher.is_empty() || !g.held.is_empty() {
            return Some(Duration::ZERO);
        }
        g.link.next_timer()
    }

    /// Detaches: what is in flight completes, the box takes the device back (and resets
    /// it), the session closes.
    pub fn detach(mut self) {
        self.shut_down();
    }

    /// [`RemoteDevice::detach`], returning the counters as they stand after it (the DETACH
    /// it sent counted): what a capture of the whole session holds.
    pub fn detach_counted(mut self) -> HostStats {
        self.shut_down();
        // Shut down already: the drop has nothing left to do.
        self.abandoned = true;
        self.stats()
    }

    /// Lets go of the device without detaching or closing the session, as a host process
    /// that is killed does: the box learns of it only at the link's ride-through time. For
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
        if (g.removed.is_none() || cancelled) && g.link.session.is_up() {
            let detach = Control::Detach { device: g.id.name.clone() }.to_tlp(g.id.host_id);
            let _ = g.link.session.send_tlp(&detach);
            let _ = g.link.run_until(Duration::from_millis(200), |s| s.is_idle() || s.is_down());
            log::info!(
                device = g.id.name.as_str(), peer = g.id.server.to_string().as_str();
                "detached {} from {}", g.id.name, g.id.server
            );
        }
        let now = g.link.clock.now();
        g.link.session.close(now);
        let _ = g.link.transmit();
    }
}

/// [`RemoteDevice::removal_watch`]: the device watched from another thread.
#[derive(Clone)]
pub struct RemovalWatch(Arc<Mutex<DeviceState>>);

impl RemovalWatch {
    /// Why the device counts as surprise-removed, if it does.
    pub fn removed(&self) -> Option<String> {
        lock(&self.0).removed.clone()
    }

    /// Whether the device is riding through a silent box, as [`RemoteDevice::silent`].
    pub fn silent(&self) -> bool {
        lock(&self.0).link.session.is_silent()
    }

    /// The device's counters, as [`RemoteDevice::stats`] (waits for the device's lock: a
    /// driver's call in progress finishes first).
    pub fn stats(&self) -> HostStats {
        stats_of(&lock(&self.0))
    }

    /// The device's BDF on the box.
    pub fn box_id(&self) -> Bdf {
        lock(&self.0).id.box_id
    }

    /// What the device is and where it sits, as [`RemoteDevice::origin`].
    pub fn origin(&self) -> Option<Origin> {
        lock(&self.0).id.origin.clone()
    }
}

fn stats_of(g: &DeviceState) -> HostStats {
    let mut s = g.stats.clone();
    s.tlps_sent = g.sent.by_name();
    s.tlps_received = g.received.by_name();
    s.link = *g.link.session.stats();
    let d = g.dispatcher.stats();
    s.malformed_tlps = d.malformed;
    s.largest_payload_received = d.largest_payload;
    s.largest_read_request_received = d.largest_read_request;
    let spin = g.spin.totals();
    s.spin_ns = spin.spun().as_nanos() as u64;
    s.datagrams_too_large = link::driver::Datagrams::offload(&g.link.sock).too_large;
    s.empty_passes = spin.empty_passes();
    s
}

impl Drop for RemoteDevice {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The service thread: every `every`, one pump — only when nobody drove the link for that
/// long (a caller polling drives it itself; one that only enters — writing host memory,
/// reading counters — does not, and once starved the link of its keepalives and
/// acknowledgements until the peer's idle timeout took the device away). It never waits
/// for the lock: a caller holding it is about to drive the link or done in a moment.
fn spawn_service(
    device: &str,
    every: Duration,
    inner: Arc<Mutex<DeviceState>>,
    stop: Arc<AtomicBool>,
    clock: Clock,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(format!("dxpu-host-{device}")).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(every);
            if let Ok(mut g) = inner.try_lock() {
                let now = clock.now();
                if now.since(g.last_pump) >= every {
                    g.pump_at(now);
                }
            }
        }
    })
}

/// Host memory of `buf` at `offset` as it stands: all-ones outside the windows.
fn read_local(g: &mut DeviceState, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
    match g.windows.local(buf.bus + offset as u64, out.len(), false) {
        Some(mem) => out.copy_from_slice(mem),
        None => out.fill(0xff),
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
        self.enter().mmio(addr, len, None)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.enter().mmio(addr, len, Some(value));
    }
    /// The buffer is zeroed in steps of 16 MiB with a pump after each: zeroing a GiB (its
    /// first touch faults every page in) took longer than the link's idle timeout, and
    /// held the lock the service thread needs meanwhile (the box took the device away).
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        const STEP: usize = 16 << 20;
        let mut g = self.enter();
        let buf = g.windows.reserve(len)?;
        let mut done = 0;
        while done < len {
            let n = STEP.min(len - done);
            if let Some(m) = g.windows.local(buf.bus + done as u64, n, true) {
                m.fill(0);
            }
            done += n;
            if done < len {
                g.pump();
            }
        }
        Some(buf)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        let mut g = self.enter();
        // The caller is looking for what the device wrote: let it arrive.
        g.pump();
        read_local(&mut g, buf, offset, out);
    }
    /// What the link has delivered so far: no pass over it.
    fn dma_peek(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        read_local(&mut self.enter(), buf, offset, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        let mut g = self.enter();
        if let Some(mem) = g.windows.local(buf.bus + offset as u64, data.len(), true) {
            mem.copy_from_slice(data);
        }
    }
    fn removed(&self) -> Option<String> {
        RemoteDevice::removed(self)
    }
    /// Frames the link received from the box: while they come, the box is there and the
    /// link recovering, however slowly (a driver's waits go on; they end when the link is
    /// declared dead and the device removed).
    fn progress(&self) -> u64 {
        self.enter().link.session.stats().frames_received
    }
    fn serve_for(&mut self, budget: Duration) -> bool {
        let mut g = self.enter();
        let deadline = g.link.clock.now() + budget;
        g.serve_until(deadline)
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        let mut g = self.enter();
        wait_interrupt(timeout, |left| {
            if g.interrupts.take(vector) {
                WaitStep::Fired
            } else if g.cancelled() {
                WaitStep::Gone
            } else {
                // Time passes for the link whether or not it is busy: the timeout holds. A
                // look with no time left (is it pending?) pumps once and does not wait.
                if !g.pump() && !left.is_zero() {
                    let _ = g.link.wait();
                }
                WaitStep::Idle
            }
        })
    }
}
