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
//! driver's thread reads and writes its buffers and takes interrupts and completions.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use driver::{BusAddr, DmaArena, DmaBuf, PciFunction, WaitStep, wait_interrupt};
use hw::{Device, Upstream};
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

struct Shared {
    to_device: Queue,
    host: Mutex<HostPort>,
    /// Driver-side calls waiting for the host's lock: the device's thread lets them have
    /// it before it takes it again (a mutex does not hand over in turn, and a device busy
    /// with a long copy took it back before a waiting driver woke).
    driver_waiting: std::sync::atomic::AtomicUsize,
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
const SPIN: Duration = Duration::from_micros(2000);

/// Reads of host memory the device's thread serves per taking of the host's lock.
const SERVE_BATCH: usize = 64;

/// What the device sends: into host memory (or an interrupt, or a read to serve), one TLP
/// at a time under the host's lock, taken after any driver call waiting for it.
struct ToHost<'a>(&'a Shared);

impl Upstream for ToHost<'_> {
    fn send(&mut self, tlp: &TlpRepr<'_>) {
        self.0.host_for_device().send(tlp);
    }
}

/// The device's thread: takes what the host sent, lets the device work, serves its reads of
/// host memory, spins meanwhile (and sleeps once idle for [`SPIN`]).
fn device_loop<D: Device>(mut dev: D, shared: Arc<Shared>) -> D {
    let cfg = ParseConfig::default();
    let mut last_work = Instant::now();
    let mut reads_left = false;
    while !shared.stop.load(Ordering::Relaxed) {
        let mut any = false;
        for b in shared.to_device.take_all() {
            any = true;
            // Emitted by this process: never malformed (dropped if it were).
            if let Ok(t) = TlpRepr::parse_bytes(&b, &cfg) {
                dev.request(&t, &mut ToHost(&shared));
            }
        }
        let did = dev.poll(&mut ToHost(&shared));
        if did || any || reads_left {
            let mut host = shared.host_for_device();
            if !host.reads.is_empty() {
                any = true;
                // A bounded batch at a time, so that the driver's calls get the host's
                // memory in between (64 reads: 256 KiB at most).
                direct::serve_reads_upto(&mut host, &mut dev, SERVE_BATCH);
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
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }
    dev
}

/// A device on the host's own bus, on a thread of its own.
pub struct ConcurrentAttach<D: Device + Send + 'static> {
    arena: DmaArena,
    shared: Arc<Shared>,
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
            to_device: Queue::default(),
            host: Mutex::new(HostPort::with_memory(host_memory)),
            driver_waiting: std::sync::atomic::AtomicUsize::new(0),
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
            if let Some(c) = self.shared.host().completion_for(tag) {
                return Some(c);
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
        self.arena.alloc_zeroed(&mut self.shared.host().mem, len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.arena.read(&self.shared.host().mem, buf, offset, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.arena.write(&mut self.shared.host().mem, buf, offset, data);
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        let shared = &self.shared;
        wait_interrupt(timeout, |_| {
            if shared.host().interrupts.take(vector) { WaitStep::Fired } else { WaitStep::Idle }
        })
    }
}
