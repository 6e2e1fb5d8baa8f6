//! The simgpu driver, written against the PCI function access ([`PciFunction`]) so
//! that the same driver runs on a directly attached simgpu, on a remote one through the host
//! endpoint, and inside a VM. It checks the device, sizes its BARs, enables MSI-X, sets up
//! the command ring, submits work, and waits for fences by polling or by interrupt.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use simgpu_abi::{
    CHANNELS, COMMAND_BYTES, DEVICE_ID, ERROR_VECTOR, MSIX_TABLE_OFFSET, VENDOR_ID, chreg, err, op, reg,
};

use crate::function::{BusAddr, DmaBuf, PciFunction, find_capability};
use crate::pinned::{Pinned, PinnedPool};

/// Why the driver could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// Not a simgpu.
    #[error("not a simgpu: vendor {vendor:#06x} device {device:#06x}")]
    NotSimGpu {
        /// Vendor ID read.
        vendor: u16,
        /// Device ID read.
        device: u16,
    },
    /// The device lacks something the driver needs.
    #[error("device unusable: {0}")]
    Unusable(&'static str),
    /// The platform refused DMA memory.
    #[error("no DMA memory for {0} bytes")]
    NoMemory(usize),
    /// The device reported an error (ERROR register value).
    #[error("device error {code} ({})", match *code { err::BAD_OPCODE => "bad opcode", err::BAD_ARGUMENT => "bad argument", err::DMA => "DMA failed", err::RING => "ring misconfigured", _ => "unknown" })]
    Device {
        /// The ERROR register.
        code: u64,
    },
    /// The device is gone (surprise removal), for the reason the platform gave.
    #[error("device removed: {0}")]
    Removed(String),
    /// A fence did not arrive before the wait's ceiling, though the platform kept hearing
    /// from the device (a device that never finishes on a live link).
    #[error("fence {value} not reached within the {timeout:?} ceiling")]
    Timeout {
        /// The fence value waited for.
        value: u64,
        /// The ceiling.
        timeout: Duration,
    },
    /// A fence did not arrive, and the platform heard nothing from the device for the stall
    /// timeout.
    #[error("fence {value} not reached: nothing heard from the device for {idle:?}")]
    Stalled {
        /// The fence value waited for.
        value: u64,
        /// How long nothing moved.
        idle: Duration,
    },
}

/// How long a wait on the device may last: while the platform keeps hearing from the
/// device ([`PciFunction::progress`]) up to `ceiling`; with nothing heard, `stall`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patience {
    /// Nothing heard from the device for this long ends a wait.
    pub stall: Duration,
    /// No wait lasts longer.
    pub ceiling: Duration,
}

impl Default for Patience {
    /// 15 s stalled, 120 s in all: a lossy link's recovery (50 % loss each way moves a
    /// 16 MiB copy in seconds) fits, and so does an outage the link rides through (10 s by
    /// default, `link::Config::ride_through`: the link, not the driver, decides when a silent
    /// box is gone); a hung device on a live link is told within minutes.
    fn default() -> Patience {
        Patience { stall: Duration::from_secs(15), ceiling: Duration::from_secs(120) }
    }
}

/// One wait's clock: when it started, and when the platform last showed progress.
struct WaitClock {
    start: Instant,
    seen: u64,
    moved: Instant,
}

impl WaitClock {
    fn start<P: PciFunction>(pci: &P) -> WaitClock {
        let now = Instant::now();
        WaitClock { start: now, seen: pci.progress(), moved: now }
    }

    /// `Err` once the wait for fence `value` has run out of `p`: `pci` showed no progress
    /// for `p.stall`, or `p.ceiling` passed.
    fn check<P: PciFunction>(&mut self, pci: &P, p: Patience, value: u64) -> Result<(), DriverError> {
        let now = Instant::now();
        let progress = pci.progress();
        if progress != self.seen {
            (self.seen, self.moved) = (progress, now);
        }
        if now - self.start >= p.ceiling {
            return Err(DriverError::Timeout { value, timeout: p.ceiling });
        }
        if now - self.moved >= p.stall {
            return Err(DriverError::Stalled { value, idle: now - self.moved });
        }
        Ok(())
    }

    /// How long the wait may sleep before it must look again (at most `slice`).
    fn left(&self, p: Patience, slice: Duration) -> Duration {
        let now = Instant::now();
        let to_ceiling = (self.start + p.ceiling).saturating_duration_since(now);
        let to_stall = (self.moved + p.stall).saturating_duration_since(now);
        slice.min(to_ceiling).min(to_stall)
    }
}

/// How to wait for a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Poll the fence word in host memory.
    Poll,
    /// Sleep until the completion interrupt.
    Interrupt,
}

/// One command for the ring.
#[derive(Clone, Copy, Debug, Default)]
pub struct Command {
    /// Opcode ([`op`]).
    pub opcode: u32,
    /// Arguments a..e.
    pub args: [u64; 5],
}

const RING_ENTRIES: u64 = 64;
/// The least staging buffer the driver allocates: room for the small copies a workload
/// queues together (a model's tensors) without waiting for the device in between.
const STAGING_MIN: usize = 4 << 20;
/// Max_Read_Request_Size the driver sets, as encoded in Device Control (101b: 4096 bytes,
/// PCIe 6.0 §7.5.3.4): the device's copies from host memory keep 32 reads in flight, and
/// the larger each read, the more bytes are on their way per round trip.
const MAX_READ_REQUEST: u32 = 5;
/// How often a fence wait, once the device raised its error interrupt, asks whether it
/// stopped (ERROR set, STATUS not busy).
const ERROR_CHECK_INTERVAL: Duration = Duration::from_micros(100);
/// The longest an interrupt wait sleeps before it looks at the platform's progress again.
const INTERRUPT_SLICE: Duration = Duration::from_millis(50);
/// Vector the driver uses for command completion.
pub const DONE_VECTOR: u16 = 0;

/// `Err(Removed)` once the platform says the device is gone.
fn pci_gone<P: PciFunction>(pci: &P) -> Result<(), DriverError> {
    pci.removed().map_or(Ok(()), |why| Err(DriverError::Removed(why)))
}

/// A simgpu opened through some [`PciFunction`].
pub struct SimGpuDriver<P: PciFunction> {
    pci: P,
    bar0: BusAddr,
    bar2: BusAddr,
    vram_size: u64,
    ring: DmaBuf,
    /// The next ring slot to write.
    tail: u64,
    /// RING_TAIL as last written: the device sees the commands before it.
    published: u64,
    /// RING_HEAD as last read: the device has fetched at least this far, so the ring has
    /// room up to it without asking again (a register read is a network round trip on a
    /// remote device).
    head: u64,
    fence: DmaBuf,
    next_fence: u64,
    /// RING_TAIL as published with the last fence: later, the device has more to do.
    fence_published: u64,
    patience: Patience,
    /// Host memory copies go through ([`Self::staging`]): taken from its start by the copies
    /// queued since the device was last idle, `staging_used` bytes of it.
    staging: Option<DmaBuf>,
    staging_used: usize,
    /// Pinned buffers given back, for the next ([`Self::pin`]).
    pinned: PinnedPool,
    stats: DriverStats,
    /// The command channels the device has (`reg::CHANNELS`; 1 on a device without more).
    channels: usize,
    /// Channels opened besides channel 0 ([`Self::open_channel`]), by number.
    extra: Vec<Option<ChannelRing>>,
}

/// A command channel besides channel 0: its ring and how far the driver and the device are
/// in it, as channel 0's fields of [`SimGpuDriver`] keep them.
#[derive(Clone, Copy, Debug)]
struct ChannelRing {
    ring: DmaBuf,
    entries: u64,
    tail: u64,
    published: u64,
    head: u64,
}

/// What the driver asked of the device: the software side of a workload's transaction
/// profile (the platform counts the TLPs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Commands written into the ring (fences and interrupts included).
    pub commands: u64,
    /// RING_TAIL writes each followed by a doorbell: each lets the device fetch what waits.
    pub doorbells: u64,
    /// Fence waits by polling host memory.
    pub waits_polled: u64,
    /// Fence waits by interrupt.
    pub waits_interrupt: u64,
    /// Waits for the last fence published with nothing published after it: the device is
    /// idle from its fence until the host publishes more, the fence's way to the host and
    /// the next doorbell's to the device (a round trip through a bridge). A wait for an
    /// earlier fence, more work queued behind it, leaves the device busy.
    pub waits_idle: u64,
}

impl DriverStats {
    /// What was counted since `before` (an earlier reading of the same driver's).
    pub fn since(&self, before: &DriverStats) -> DriverStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        DriverStats {
            commands: d(self.commands, before.commands),
            doorbells: d(self.doorbells, before.doorbells),
            waits_polled: d(self.waits_polled, before.waits_polled),
            waits_interrupt: d(self.waits_interrupt, before.waits_interrupt),
            waits_idle: d(self.waits_idle, before.waits_idle),
        }
    }
}

/// A command as the ring holds it: u32 opcode, u32 flags (0), five u64 arguments.
fn encode(c: Command) -> [u8; COMMAND_BYTES as usize] {
    let mut b = [0u8; COMMAND_BYTES as usize];
    b[0..4].copy_from_slice(&c.opcode.to_le_bytes());
    for (i, a) in c.args.iter().enumerate() {
        b[8 + 8 * i..16 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    b
}

/// Sizes a 64-bit memory BAR by probing; returns (address, size).
fn probe_bar64<P: PciFunction>(pci: &mut P, index: u16) -> (u64, u64) {
    let at = 0x10 + 4 * index;
    let (lo, hi) = (pci.config_read(at), pci.config_read(at + 4));
    pci.config_write(at, 0xffff_ffff);
    pci.config_write(at + 4, 0xffff_ffff);
    let mask = (pci.config_read(at + 4) as u64) << 32 | (pci.config_read(at) & !0xf) as u64;
    pci.config_write(at, lo);
    pci.config_write(at + 4, hi);
    ((hi as u64) << 32 | (lo & !0xf) as u64, (!mask).wrapping_add(1))
}

impl<P: PciFunction> SimGpuDriver<P> {
    /// Checks and sets up the device: IDs, BARs, bus mastering, MSI-X, command ring.
    pub fn open(mut pci: P) -> Result<SimGpuDriver<P>, DriverError> {
        let id = pci.config_read(0);
        let (vendor, device) = (id as u16, (id >> 16) as u16);
        if vendor != VENDOR_ID || device != DEVICE_ID {
            pci_gone(&pci)?;
            return Err(DriverError::NotSimGpu { vendor, device });
        }
        // Memory decoding off while sizing, as system software does.
        let cmd = pci.config_read(0x04);
        pci.config_write(0x04, cmd & !0x6);
        let (bar0, size0) = probe_bar64(&mut pci, 0);
        let (bar2, vram_size) = probe_bar64(&mut pci, 2);
        let (bar0, bar2) = (BusAddr(bar0), BusAddr(bar2));
        if bar0.get() == 0 || bar2.get() == 0 || size0 < 0x1000 {
            pci_gone(&pci)?;
            return Err(DriverError::Unusable("BARs not placed"));
        }
        pci.config_write(0x04, (cmd & 0xffff_0000) | 0x6);
        // Max_Payload_Size: the largest the device supports (PCIe 6.0 §7.5.3.3-4), as system
        // software sets it when nothing on the path is smaller; a platform that carries less
        // (a bridge's link) lowers what it forwards.
        if let Some(pcie) = find_capability(&mut pci, 0x10) {
            let supported = pci.config_read(pcie + 4) & 7;
            let ctl = pci.config_read(pcie + 8);
            let ctl = (ctl & !(7 << 5) & !(7 << 12) & 0xffff) | supported << 5 | MAX_READ_REQUEST << 12;
            pci.config_write(pcie + 8, ctl);
        }
        let msix = match find_capability(&mut pci, 0x11) {
            Some(at) => at,
            None => {
                pci_gone(&pci)?;
                return Err(DriverError::Unusable("no MSI-X capability"));
            }
        };
        let vectors = ((pci.config_read(msix) >> 16) & 0x7ff) as u16 + 1;
        for v in 0..vectors.min(4) {
            let (addr, data) = pci.msi_message(v);
            let e = bar0 + MSIX_TABLE_OFFSET as u64 + v as u64 * 16;
            pci.mmio_write(e, 8, addr);
            pci.mmio_write(e + 8, 4, data as u64);
            pci.mmio_write(e + 12, 4, 0); // unmask
        }
        let ctl = pci.config_read(msix);
        pci.config_write(msix, (ctl & !(0xc000 << 16)) | 0x8000 << 16);
        let ring =
            pci.dma_alloc((RING_ENTRIES * COMMAND_BYTES) as usize).ok_or(DriverError::NoMemory(4096))?;
        let fence = pci.dma_alloc(8).ok_or(DriverError::NoMemory(8))?;
        let mut d = SimGpuDriver {
            pci,
            bar0,
            bar2,
            vram_size,
            ring,
            tail: 0,
            published: 0,
            head: 0,
            fence,
            next_fence: 0,
            fence_published: 0,
            patience: Patience::default(),
            staging: None,
            staging_used: 0,
            pinned: PinnedPool::default(),
            stats: DriverStats::default(),
            channels: 1,
            extra: Vec::new(),
        };
        // A device of an earlier version reads 0 here: it has channel 0 only.
        d.channels = (d.read_reg(reg::CHANNELS) as usize).clamp(1, CHANNELS);
        d.write_reg(reg::RING_BASE, ring.bus.get());
        d.write_reg(reg::RING_SIZE, RING_ENTRIES);
        d.write_reg(reg::RING_TAIL, 0);
        Ok(d)
    }

    /// VRAM size found by sizing BAR2.
    pub fn vram_size(&self) -> u64 {
        self.vram_size
    }
    /// BAR2's bus address (VRAM window).
    pub fn vram_bar(&self) -> BusAddr {
        self.bar2
    }
    /// The platform underneath.
    pub fn pci(&mut self) -> &mut P {
        &mut self.pci
    }
    /// Closes the driver and gives the platform back.
    pub fn into_pci(self) -> P {
        self.pci
    }
    /// Reads a BAR0 register.
    pub fn read_reg(&mut self, r: u64) -> u64 {
        self.pci.mmio_read(self.bar0 + r, 8)
    }
    /// Writes a BAR0 register.
    pub fn write_reg(&mut self, r: u64, v: u64) {
        self.pci.mmio_write(self.bar0 + r, 8, v)
    }

    /// What the driver has asked of the device since it opened.
    pub fn stats(&self) -> DriverStats {
        self.stats
    }

    /// Queues one command and rings the doorbell.
    pub fn submit(&mut self, c: Command) -> Result<(), DriverError> {
        self.queue(c)?;
        self.publish();
        Ok(())
    }

    /// Queues one command without telling the device: commands queued together are
    /// published by the next [`Self::flush`] (or [`Self::fence`], [`Self::sync`], [`Self::submit`]) with one
    /// RING_TAIL write and one doorbell, and fetched together — as a GPU stack queues a
    /// stream's copies and kernels and synchronizes once.
    pub fn enqueue(&mut self, c: Command) -> Result<(), DriverError> {
        self.queue(c)
    }

    /// Publishes the commands queued so far without a fence and without waiting: the device
    /// starts on them while the host queues the next ones (a framework's asynchronous
    /// launches, synchronized only where the host reads a result).
    pub fn flush(&mut self) {
        self.publish();
    }

    /// Tells the device about the commands written since the last time: RING_TAIL, then
    /// the doorbell. Commands published together are fetched together (the device reads
    /// up to `PREFETCH` ring entries at once).
    fn publish(&mut self) {
        if self.published != self.tail {
            self.write_reg(reg::RING_TAIL, self.tail);
            self.write_reg(reg::DOORBELL, 1);
            self.published = self.tail;
            self.stats.doorbells += 1;
        }
    }

    /// Writes a command into the ring without telling the device ([`Self::publish`]).
    fn queue(&mut self, c: Command) -> Result<(), DriverError> {
        // The ring is full when the next tail would reach the head: only then ask the device
        // how far it has fetched — after telling it what waits — and wait for it.
        let mut clock = WaitClock::start(&self.pci);
        while (self.tail + 1) % RING_ENTRIES == self.head {
            self.publish();
            self.head = self.read_reg(reg::RING_HEAD) % RING_ENTRIES;
            pci_gone(&self.pci)?;
            if (self.tail + 1) % RING_ENTRIES == self.head
                && clock.check(&self.pci, self.patience, self.next_fence).is_err()
            {
                return Err(DriverError::Unusable("command ring full and not draining"));
            }
        }
        let ring = self.ring;
        self.pci.dma_write(&ring, (self.tail * COMMAND_BYTES) as usize, &encode(c));
        self.tail = (self.tail + 1) % RING_ENTRIES;
        self.stats.commands += 1;
        Ok(())
    }

    /// Queues a fence (and, waiting by interrupt, an INTERRUPT), publishes them with what
    /// was queued before, and waits until the device has executed everything before it.
    pub fn sync(&mut self, mode: WaitMode) -> Result<(), DriverError> {
        let value = self.fence(mode)?;
        self.wait(value, mode)
    }

    /// Queues a fence (and, for `WaitMode::Interrupt`, an INTERRUPT on the completion vector)
    /// and publishes it with everything queued before; returns the value to [`Self::wait`]
    /// for. The host goes on meanwhile (fills the next buffer, queues the next batch).
    pub fn fence(&mut self, mode: WaitMode) -> Result<u64, DriverError> {
        self.next_fence += 1;
        let value = self.next_fence;
        self.queue(Command { opcode: op::FENCE, args: [self.fence.bus.get(), value, 0, 0, 0] })?;
        if mode == WaitMode::Interrupt {
            self.queue(Command { opcode: op::INTERRUPT, args: [DONE_VECTOR as u64, 0, 0, 0, 0] })?;
        }
        self.publish();
        self.fence_published = self.published;
        Ok(value)
    }

    /// The fence word in host memory: the value of the last FENCE the device executed.
    fn fence_value(&mut self) -> u64 {
        let mut f = [0u8; 8];
        let fence = self.fence;
        self.pci.dma_read(&fence, 0, &mut f);
        u64::from_le_bytes(f)
    }

    /// Whether the device raised its error interrupt (consumed): it does for every error, so
    /// a wait learns of one without reading a register (a network round trip on a remote
    /// device) — the interrupt is a posted write sent before any later fence's, and arrives
    /// before it.
    fn error_raised(&mut self) -> bool {
        self.pci.wait_interrupt(ERROR_VECTOR, Duration::ZERO)
    }

    /// Waits until the device has executed the fence `value` (from [`Self::fence`], queued
    /// with the same `mode`), then reports ERROR if the device raised its error interrupt.
    /// The fence word is watched in host memory (where the device's write lands); no
    /// register is read unless the device raised an error.
    ///
    /// The wait follows the platform, not the clock: it goes on while the platform hears
    /// from the device (a lossy link recovering its frames), ends at once when the device is
    /// removed (its link declared dead), and gives up after [`Patience::stall`] with nothing
    /// heard or at [`Patience::ceiling`].
    pub fn wait(&mut self, value: u64, mode: WaitMode) -> Result<(), DriverError> {
        let mut clock = WaitClock::start(&self.pci);
        let start = clock.start;
        match mode {
            WaitMode::Poll => self.stats.waits_polled += 1,
            WaitMode::Interrupt => self.stats.waits_interrupt += 1,
        }
        let idle = value == self.next_fence && self.published == self.fence_published;
        if idle {
            self.stats.waits_idle += 1;
        }
        // Nothing was queued after this fence either: once it is in, the device is drained.
        let drains = idle && self.tail == self.published;
        if mode == WaitMode::Interrupt {
            // One interrupt per fence queued so: those of earlier fences may still be pending.
            while self.fence_value() < value {
                let left = clock.left(self.patience, INTERRUPT_SLICE);
                if !self.pci.wait_interrupt(DONE_VECTOR, left) {
                    pci_gone(&self.pci)?;
                    clock.check(&self.pci, self.patience, value)?;
                }
            }
        }
        let mut errored = false;
        let mut next_error_check = start;
        while self.fence_value() < value {
            errored = errored || self.error_raised();
            // A device that stopped on an error (the ring misconfigured) never writes the
            // fence: once it raised an error, ask now and then whether it stopped.
            let now = Instant::now();
            if errored && now >= next_error_check {
                if self.read_reg(reg::ERROR) != 0 && self.read_reg(reg::STATUS) & 1 == 0 {
                    break;
                }
                next_error_check = now + ERROR_CHECK_INTERVAL;
            }
            // A device that vanished writes nothing more: say so at once, not at the timeout.
            pci_gone(&self.pci)?;
            clock.check(&self.pci, self.patience, value)?;
        }
        pci_gone(&self.pci)?;
        if drains {
            // The device has read every staged byte it was asked to.
            self.staging_used = 0;
        }
        if !errored && !self.error_raised() {
            return Ok(());
        }
        // Every error raised its interrupt: take them all, one report.
        while self.error_raised() {}
        match self.read_reg(reg::ERROR) {
            0 => Ok(()),
            code => {
                self.write_reg(reg::ERROR, code);
                self.write_reg(reg::INT_STATUS, 2);
                Err(DriverError::Device { code })
            }
        }
    }

    /// `len` bytes of the staging buffer no copy in flight uses: after those queued since
    /// the device was last idle, or — where they leave too little room — from its start once
    /// the device has drained them (a sync). The buffer is reused across copies, grown (to
    /// at least `STAGING_MIN`) when too small, so that copies do not use up the platform's
    /// DMA memory.
    fn staging(&mut self, len: usize) -> Result<DmaBuf, DriverError> {
        let cap = self.staging.map_or(0, |b| b.len);
        if self.staging_used + len > cap && self.staging_used > 0 {
            self.sync(WaitMode::Poll)?;
            self.staging_used = 0;
        }
        let b = match self.staging {
            Some(b) if b.len >= len => b,
            _ => {
                // At least STAGING_MIN where the platform has it, else what this copy needs.
                let b = self
                    .pci
                    .dma_alloc(len.max(STAGING_MIN))
                    .or_else(|| self.pci.dma_alloc(len))
                    .ok_or(DriverError::NoMemory(len))?;
                self.staging = Some(b);
                b
            }
        };
        let at = self.staging_used;
        // The next copy starts on a 64-byte boundary, as the arena hands buffers out.
        self.staging_used = (at + len).next_multiple_of(64).min(b.len);
        Ok(DmaBuf { bus: b.bus + at as u64, len })
    }

    /// `len` bytes of pinned host memory: DMA memory the caller fills and the device copies
    /// from, or the device copies into, as CUDA's pinned host memory. Held by the caller and
    /// given back with [`Self::unpin`], for the next pin to reuse (the platform's DMA memory
    /// is never taken back); its contents are whatever was last there.
    pub fn pin(&mut self, len: usize) -> Result<Pinned, DriverError> {
        let pci = &mut self.pci;
        self.pinned.take(len, |len| pci.dma_alloc(len)).ok_or(DriverError::NoMemory(len))
    }

    /// Gives `p` back, for a later [`Self::pin`].
    pub fn unpin(&mut self, p: Pinned) {
        self.pinned.give_back(p);
    }

    /// Runs `f` with buffers pinned of `lens` bytes, given back however it returns; a pin
    /// refused is `on_error`'s error.
    pub fn with_pinned<const N: usize, T, E>(
        &mut self,
        lens: [usize; N],
        on_error: impl Fn(DriverError) -> E,
        f: impl FnOnce(&mut Self, &[Pinned; N]) -> Result<T, E>,
    ) -> Result<T, E> {
        let mut held = Vec::with_capacity(N);
        for len in lens {
            match self.pin(len) {
                Ok(p) => held.push(p),
                Err(e) => {
                    held.into_iter().for_each(|p| self.unpin(p));
                    return Err(on_error(e));
                }
            }
        }
        // N pinned, one per length: the conversion holds; were it not to, all go back.
        let pins: [Pinned; N] = match held.try_into() {
            Ok(pins) => pins,
            Err(held) => {
                held.into_iter().for_each(|p| self.unpin(p));
                return Err(on_error(DriverError::Unusable("pinned buffers: fewer than asked")));
            }
        };
        let out = f(self, &pins);
        pins.into_iter().for_each(|p| self.unpin(p));
        out
    }

    /// Sets how long a wait (ring space, fences) may last with nothing heard from the
    /// device; 5 s unless changed ([`Patience::stall`]).
    pub fn set_timeout(&mut self, stall: Duration) {
        self.patience.stall = stall;
    }

    /// Sets how long waits may last ([`Patience`]).
    pub fn set_patience(&mut self, patience: Patience) {
        self.patience = patience;
    }

    /// How long waits may last.
    pub fn patience(&self) -> Patience {
        self.patience
    }

    /// Copies host bytes into VRAM at `vram` (through a staging buffer) and waits until the
    /// device has executed the copy and everything queued before it.
    pub fn memcpy_to_device(&mut self, vram: u64, data: &[u8]) -> Result<(), DriverError> {
        self.stage_to_device(vram, data)?;
        self.sync(WaitMode::Poll)
    }

    /// Queues a copy of host bytes into VRAM at `vram` and publishes it, returning once the
    /// bytes are staged — `data` may be reused at once — without waiting for the device, as
    /// CUDA's `cudaMemcpyAsync` from pageable memory: the copy runs in ring order, so a
    /// kernel queued after it sees the bytes, and a device error shows at the next wait.
    /// Copies queued so share the staging buffer; when it is full, the next waits for the
    /// device to drain it.
    pub fn memcpy_to_device_async(&mut self, vram: u64, data: &[u8]) -> Result<(), DriverError> {
        self.stage_to_device(vram, data)?;
        self.publish();
        Ok(())
    }

    fn stage_to_device(&mut self, vram: u64, data: &[u8]) -> Result<(), DriverError> {
        let buf = self.staging(data.len())?;
        self.pci.dma_write(&buf, 0, data);
        self.queue(Command { opcode: op::COPY_H2V, args: [buf.bus.get(), vram, data.len() as u64, 0, 0] })
    }

    /// Copies VRAM bytes at `vram` into `out`.
    pub fn memcpy_from_device(&mut self, vram: u64, out: &mut [u8]) -> Result<(), DriverError> {
        let buf = self.staging(out.len())?;
        self.queue(Command { opcode: op::COPY_V2H, args: [vram, buf.bus.get(), out.len() as u64, 0, 0] })?;
        self.sync(WaitMode::Poll)?;
        self.pci.dma_read(&buf, 0, out);
        Ok(())
    }

    /// The device's command channels (channel 0 is the one [`Self::enqueue`] and the
    /// rest of this driver use).
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Sets up command channel `ch` (1.. [`Self::channels`]) with a ring of `entries`
    /// commands (a power of two, 2..=4096): a stream of its own, fetched and executed beside
    /// channel 0's and the others' ([`Self::enqueue_on`], [`Self::flush_on`]).
    pub fn open_channel(&mut self, ch: usize, entries: u64) -> Result<(), DriverError> {
        if ch == 0 || ch >= self.channels {
            return Err(DriverError::Unusable("no such command channel"));
        }
        if !(2..=4096).contains(&entries) || !entries.is_power_of_two() {
            return Err(DriverError::Unusable("channel ring entries not a power of two in 2..=4096"));
        }
        let bytes = (entries * COMMAND_BYTES) as usize;
        let ring = self.pci.dma_alloc(bytes).ok_or(DriverError::NoMemory(bytes))?;
        if self.extra.len() <= ch {
            self.extra.resize(ch + 1, None);
        }
        self.extra[ch] = Some(ChannelRing { ring, entries, tail: 0, published: 0, head: 0 });
        self.write_reg(chreg::at(ch, chreg::RING_BASE), ring.bus.get());
        self.write_reg(chreg::at(ch, chreg::RING_SIZE), entries);
        self.write_reg(chreg::at(ch, chreg::RING_TAIL), 0);
        Ok(())
    }

    /// Queues `c` on channel `ch` without telling the device (channel 0: [`Self::enqueue`]).
    /// A full ring waits for the device to fetch, as a CUDA launch blocks when its queue is
    /// full.
    pub fn enqueue_on(&mut self, ch: usize, c: Command) -> Result<(), DriverError> {
        if ch == 0 {
            return self.queue(c);
        }
        let Some(mut r) = self.extra.get(ch).copied().flatten() else {
            return Err(DriverError::Unusable("command channel not opened"));
        };
        let mut clock = WaitClock::start(&self.pci);
        while (r.tail + 1) % r.entries == r.head {
            self.publish_on(ch, &mut r);
            r.head = self.read_reg(chreg::at(ch, chreg::RING_HEAD)) % r.entries;
            pci_gone(&self.pci)?;
            if (r.tail + 1) % r.entries == r.head
                && clock.check(&self.pci, self.patience, self.next_fence).is_err()
            {
                self.extra[ch] = Some(r);
                return Err(DriverError::Unusable("command ring full and not draining"));
            }
        }
        self.pci.dma_write(&r.ring, (r.tail * COMMAND_BYTES) as usize, &encode(c));
        r.tail = (r.tail + 1) % r.entries;
        self.stats.commands += 1;
        self.extra[ch] = Some(r);
        Ok(())
    }

    /// Publishes what was queued on channel `ch`: its RING_TAIL, then its doorbell.
    pub fn flush_on(&mut self, ch: usize) {
        if ch == 0 {
            return self.publish();
        }
        if let Some(mut r) = self.extra.get(ch).copied().flatten() {
            self.publish_on(ch, &mut r);
            self.extra[ch] = Some(r);
        }
    }

    fn publish_on(&mut self, ch: usize, r: &mut ChannelRing) {
        if r.published != r.tail {
            self.write_reg(chreg::at(ch, chreg::RING_TAIL), r.tail);
            self.write_reg(chreg::at(ch, chreg::DOORBELL), 1);
            r.published = r.tail;
            self.stats.doorbells += 1;
        }
    }

    /// Launches a kernel (or any command) and waits for it: the command and its fence are
    /// published together.
    pub fn launch(&mut self, opcode: u32, args: [u64; 5], mode: WaitMode) -> Result<(), DriverError> {
        self.queue(Command { opcode, args })?;
        self.sync(mode)
    }
}
