//! A device attached directly that runs on a thread of its own, as a GPU runs beside the
//! CPU of a native server: the baseline the bridged figures are compared with when the
//! question is what the bridge costs (`dxpu loopback`, `dxpu bench model`). The driver's
//! thread and the device's thread are busy together, as through the bridges (the host's
//! thread spinning on the link, the box's computing), so that what the machine does meanwhile
//! falls on both sides of the comparison alike; [`crate::direct::DirectAttach`], which runs the
//! device inside the driver's calls, stays the platform that counts a workload's profile.
//!
//! The host's requests (config, MMIO) cross to the device's thread as bytes in a queue. Host
//! memory, interrupts and the completions of the host's requests are one
//! host port of the direct platform behind a lock both threads take: the device's thread writes its
//! DMA into host memory and completes its reads from there as the direct platform does, the
//! driver's thread reads and writes its buffers and takes interrupts and completions. A
//! driver that polls (a fence, a release word, an interrupt) takes the lock only when the
//! device has written something since it last looked, as a CPU's poll of a cached line
//! costs the device nothing until the device writes it.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use driver::{BusAddr, DmaArena, DmaBuf, PciFunction, WaitStep, wait_interrupt};
use hw::Device;
use tlp::{CplStatus, ParseConfig, TlpRepr};

use crate::direct::{self, HOST_MEMORY_BASE, HostPort};

/// How long a request waits for its completion before it reads as all-ones.
const COMPLETION_TIMEOUT: Duration = Duration::from_secs(5);

/// The host's requests on their way to the device, as emitted bytes.
#[derive(Default)]
struct Queue(Mutex<VecDeque<Vec<u8>>>);

impl Queue {
    fn push(&self, tlp: &TlpRepr<'_>) {
        let b = direct::emit(tlp);
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push_back(b);
    }
    fn take_all(&self) -> VecDeque<Vec<u8>> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A value on a cache line of its own (two, as adjacent lines are fetched in pairs): the
/// driver's thread spins reading [`Shared::changes`], and a lock word or counter the device's
/// thread writes beside it made every one of its writes a miss (the device's release of the
/// host's lock was 70 % of its own work in a copy, and copies ran at 3.3 GB/s against 5.1 on
/// the synchronous platform).
#[repr(align(128))]
#[derive(Default)]
struct OwnLine<T>(T);

impl<T> std::ops::Deref for OwnLine<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

struct Shared {
    to_device: OwnLine<Queue>,
    host: OwnLine<Mutex<HostPort>>,
    /// Driver-side calls waiting for the host's lock: the device's thread lets them have
    /// it before it takes it again (a mutex does not hand over in turn, and a device busy
    /// with a long copy took it back before a waiting driver woke).
    driver_waiting: OwnLine<std::sync::atomic::AtomicUsize>,
    /// [`HostPort::changes`], stored by the device's thread before it lets go of the host's
    /// lock: a driver that polls a fence, an interrupt or a completion reads this, not the
    /// lock, while nothing has changed (a driver polling under the lock kept a copying
    /// device waiting for it at every TLP, and copies ran at half speed).
    changes: OwnLine<AtomicU64>,
    stop: AtomicBool,
    /// The device's thread, woken by what the host sends once it has gone to sleep.
    device: std::sync::OnceLock<std::thread::Thread>,
}

impl Shared {
    /// The host port, for the driver's side.
    fn host(&self) -> MutexGuard<'_, HostPort> {
        self.driver_waiting.fetch_add(1, Ordering::AcqRel);
        let g = self.host.lock().unwrap_or_else(|p| p.into_inner());
        self.driver_waiting.fetch_sub(1, Ordering::AcqRel);
        g
    }

    /// Stores `changes` for the driver's polls, if it moved: a store of the same value
    /// still takes the line from a driver that reads it.
    fn publish(&self, changes: u64) {
        if self.changes.load(Ordering::Relaxed) != changes {
            self.changes.store(changes, Ordering::Release);
        }
    }

    /// The host port, for the device's thread: after any driver-side call waiting for it.
    fn host_for_device(&self) -> MutexGuard<'_, HostPort> {
        while self.driver_waiting.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long the device's thread spins with nothing to do before it sleeps until the host
/// sends something: the endpoints' busy-poll budget (`dxpu loopback --spin-us`), so that an
/// idle baseline does not take a core from the bridged runs it alternates with.
pub const SPIN: Duration = Duration::from_micros(2000);

/// Reads of host memory the device's thread serves per taking of the host's lock, at most:
/// it lets go sooner, after the read it is serving (4 KiB at most), once a driver's call waits
/// for the lock. (With 64 and no such check a replayed job's submissions each waited 11 µs
/// for the lock and the A100 trace's direct replay took 600–620 ms; with one, 3–5 µs and
/// 504–520 ms, but a copy paid a lock's release, the device's writes drained first, for
/// each 4 KiB.)
const SERVE_BATCH: usize = 16;

/// What the device sends: into host memory (or an interrupt, or a completion) under the
/// host's lock, taken when the device first sends in a step and kept to the step's end (a
/// copy out sends 16 writes a step; a lock taken and its change published for each made the
/// polling driver take the lock as often), let go sooner when a driver's call waits for it;
/// its reads of host memory are kept for the device's thread to hand over and serve together
/// (a lock taken for each read of a copy was a quarter of the copy's time).
struct ToHost<'a> {
    shared: &'a Shared,
    reads: &'a mut Vec<TlpRepr<'static>>,
    host: Option<MutexGuard<'a, HostPort>>,
}

impl<'a> ToHost<'a> {
    fn new(shared: &'a Shared, reads: &'a mut Vec<TlpRepr<'static>>) -> ToHost<'a> {
        ToHost { shared, reads, host: None }
    }

    /// Lets go of the host's lock, if held, its changes published first.
    fn release(&mut self) {
        if let Some(host) = self.host.take() {
            self.shared.publish(host.changes);
        }
    }
}

impl Drop for ToHost<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

impl ToHost<'_> {
    /// Takes everything `dev` sent, in order.
    fn take_from<D: Device>(&mut self, dev: &mut D) {
        while let Some(ref t) = dev.upstream() {
            self.send(t);
        }
    }

    fn send(&mut self, tlp: &TlpRepr<'_>) {
        if let tlp::Body::MemRead { .. } = tlp.body {
            self.reads.push(tlp.with_data(&[]));
            return;
        }
        if self.shared.driver_waiting.load(Ordering::Acquire) > 0 {
            self.release();
        }
        let shared = self.shared;
        self.host.get_or_insert_with(|| shared.host_for_device()).send(tlp);
    }
}

/// The device's thread: takes what the host sent, lets the device work, hands its reads of
/// host memory over and serves them, spins meanwhile (and sleeps once idle for [`SPIN`]).
fn device_loop<D: Device>(mut dev: D, shared: Arc<Shared>) -> D {
    let cfg = ParseConfig::default();
    let mut last_work = Instant::now();
    let mut reads_left = false;
    let mut reads = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let mut any = false;
        for b in shared.to_device.take_all() {
            any = true;
            // Emitted by this process: never malformed (dropped if it were).
            if let Ok(t) = TlpRepr::parse_bytes(&b, &cfg) {
                dev.request(&t);
                ToHost::new(&shared, &mut reads).take_from(&mut dev);
            }
        }
        let did = dev.poll();
        ToHost::new(&shared, &mut reads).take_from(&mut dev);
        if !reads.is_empty() || reads_left {
            let mut host = shared.host_for_device();
            for r in reads.drain(..) {
                host.send(&r);
            }
            if !host.reads.is_empty() {
                any = true;
                // A bounded batch at a time, so that the driver's calls get the host's
                // memory in between.
                direct::serve_reads_while(&mut host, &mut dev, |served| {
                    served == 0
                        || (served < SERVE_BATCH && shared.driver_waiting.load(Ordering::Acquire) == 0)
                });
                shared.publish(host.changes);
            }
            reads_left = !host.reads.is_empty();
        }
        // Timed work under way (a timed kernel) keeps the device's thread polling, as it
        // keeps a GPU busy.
        if did || any || dev.wake_at_ns().is_some() {
            last_work = Instant::now();
        } else if last_work.elapsed() < SPIN {
            std::hint::spin_loop();
        } else {
            // Woken by the host's next request (or, at the latest, to look at `stop`).
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
    dev
}

/// Reads of host memory the driver's thread keeps, and the most bytes of each: fences and
/// release words, polled.
const SEEN_READS: usize = 16;
const SEEN_READ_BYTES: usize = 64;

/// What the driver's thread last found under the host's lock, good while
/// [`Shared::changes`] still reads `at`: a driver that polls reads it without the lock.
#[derive(Default)]
struct Seen {
    at: u64,
    /// Small reads of host memory: bus address, length and bytes (no allocation per poll).
    reads: VecDeque<(u64, usize, [u8; SEEN_READ_BYTES])>,
    no_interrupt: Option<u16>,
    no_completion: Option<tlp::Tag>,
}

impl Seen {
    /// Whether the device has changed nothing the driver could see since `at` (else what
    /// was seen is forgotten).
    fn current(&mut self, shared: &Shared) -> bool {
        if shared.changes.load(Ordering::Acquire) == self.at {
            return true;
        }
        self.forget();
        false
    }

    fn forget(&mut self) {
        self.reads.clear();
        (self.no_interrupt, self.no_completion) = (None, None);
    }

    /// The host port was taken: what was seen before a change since is forgotten.
    fn taken(&mut self, host: &HostPort) {
        if host.changes != self.at {
            self.forget();
            self.at = host.changes;
        }
    }

    fn read(&mut self, shared: &Shared, addr: u64, out: &mut [u8]) -> bool {
        if out.len() > SEEN_READ_BYTES || !self.current(shared) {
            return false;
        }
        match self.reads.iter().find(|(a, n, _)| *a == addr && *n == out.len()) {
            Some((_, n, b)) => {
                out.copy_from_slice(&b[..*n]);
                true
            }
            None => false,
        }
    }

    fn keep_read(&mut self, addr: u64, bytes: &[u8]) {
        if bytes.len() <= SEEN_READ_BYTES {
            if self.reads.len() == SEEN_READS {
                self.reads.pop_front();
            }
            let mut b = [0u8; SEEN_READ_BYTES];
            b[..bytes.len()].copy_from_slice(bytes);
            self.reads.push_back((addr, bytes.len(), b));
        }
    }
}

/// A device on the host's own bus, on a thread of its own.
pub struct ConcurrentAttach<D: Device + Send + 'static> {
    arena: DmaArena,
    shared: Arc<Shared>,
    seen: Seen,
    thread: Option<JoinHandle<D>>,
    next_tag: u16,
    requester: tlp::Bdf,
}

impl<D: Device + Send + 'static> ConcurrentAttach<D> {
    /// Attaches `dev` with `host_memory` bytes of DMA-able memory, places its BARs as the
    /// direct platform does, and starts its thread.
    pub fn new(dev: D, host_memory: usize) -> std::io::Result<ConcurrentAttach<D>> {
        ConcurrentAttach::new_with(dev, host_memory, || {})
    }

    /// [`ConcurrentAttach::new`], the device's thread running `setup` first (to pin it to a
    /// CPU, say).
    pub fn new_with(
        dev: D,
        host_memory: usize,
        setup: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<ConcurrentAttach<D>> {
        let shared = Arc::new(Shared {
            to_device: OwnLine::default(),
            host: OwnLine(Mutex::new(HostPort::with_memory(host_memory))),
            driver_waiting: OwnLine::default(),
            changes: OwnLine::default(),
            stop: AtomicBool::new(false),
            device: std::sync::OnceLock::new(),
        });
        let requester = dev.id();
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("dxpu-device".into()).spawn(move || {
            setup();
            device_loop(dev, s)
        })?;
        let _ = shared.device.set(thread.thread().clone());
        let mut d = ConcurrentAttach {
            arena: DmaArena::new(BusAddr(HOST_MEMORY_BASE), host_memory),
            shared,
            seen: Seen::default(),
            thread: Some(thread),
            next_tag: 0,
            requester,
        };
        direct::place_bars(&mut d);
        Ok(d)
    }

    /// The device back, its thread stopped.
    pub fn into_device(mut self) -> Option<D> {
        self.stop()
    }

    fn stop(&mut self) -> Option<D> {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.shared.device.get() {
            t.unpark();
        }
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl<D: Device + Send + 'static> Drop for ConcurrentAttach<D> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl<D: Device + Send + 'static> direct::Requester for ConcurrentAttach<D> {
    fn target(&self) -> tlp::Bdf {
        self.requester
    }
    fn next_tag(&mut self) -> tlp::Tag {
        self.next_tag = (self.next_tag + 1) % 1024;
        tlp::Tag::from_bits(self.next_tag)
    }
    fn send_request(&mut self, tlp: &TlpRepr<'_>) {
        self.shared.to_device.push(tlp);
        if let Some(t) = self.shared.device.get() {
            t.unpark();
        }
    }
    fn completion_for(&mut self, tag: tlp::Tag) -> Option<(CplStatus, Vec<u8>)> {
        let start = Instant::now();
        loop {
            if !(self.seen.current(&self.shared) && self.seen.no_completion == Some(tag)) {
                let mut host = self.shared.host();
                self.seen.taken(&host);
                if let Some(c) = host.completion_for(tag) {
                    return Some(c);
                }
                self.seen.no_completion = Some(tag);
            }
            if start.elapsed() > COMPLETION_TIMEOUT {
                return None;
            }
        }
    }
}

impl<D: Device + Send + 'static> PciFunction for ConcurrentAttach<D> {
    fn config_read(&mut self, offset: u16) -> u32 {
        direct::config_request(self, offset, None)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        direct::config_request(self, offset, Some(value.to_le_bytes()));
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        direct::mmio_read(self, addr, len)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        direct::mmio_write(self, addr, len, value);
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.seen.reads.clear();
        self.arena.alloc_zeroed(&mut self.shared.host().mem, len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        let addr = buf.bus.0.wrapping_add(offset as u64);
        if self.seen.read(&self.shared, addr, out) {
            return;
        }
        let host = self.shared.host();
        self.seen.taken(&host);
        self.arena.read(&host.mem, buf, offset, out);
        drop(host);
        self.seen.keep_read(addr, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.seen.reads.clear();
        self.arena.write(&mut self.shared.host().mem, buf, offset, data);
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        let (shared, seen) = (&self.shared, &mut self.seen);
        wait_interrupt(timeout, |_| {
            if seen.current(shared) && seen.no_interrupt == Some(vector) {
                return WaitStep::Idle;
            }
            let mut host = shared.host();
            seen.taken(&host);
            if host.interrupts.take(vector) {
                WaitStep::Fired
            } else {
                seen.no_interrupt = Some(vector);
                WaitStep::Idle
            }
        })
    }
}
