//! A device attached directly, with no bridge: the baseline the bridged figures are compared
//! with, and the platform the driver tests run on. This is the host side of the link in
//! miniature: it places BARs as firmware would, turns the driver's config and MMIO accesses
//! into TLPs, serves the device's DMA from host memory (anything outside it is answered
//! with UR, or dropped for writes, and counted), and turns MSI-X writes into interrupts.
//!
//! The device's DMA moves at memory speed: a write's payload is copied once, from the
//! device's buffer into host memory, as the device sends it; a read is completed from where
//! its bytes lie, the device copying the payload once, into place. Nothing is allocated per
//! TLP of a transfer.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use tlp::rules::{self, Rcb, TransferSize};
use tlp::{Address, Bdf, Body, ConfigTarget, CplStatus, ParseConfig, Request, Tag, TlpRepr};

use driver::{BusAddr, DmaArena, DmaBuf, Interrupts, MSI_BASE, PciFunction, WaitStep, wait_interrupt};
use hw::Device;

/// The host's requester ID.
pub const HOST_ID: Bdf = Bdf::new(0, 0, 0);
/// Bus address of host memory.
pub const HOST_MEMORY_BASE: u64 = 0x1_0000_0000;
/// Where BAR0 is placed.
pub const BAR0_BASE: u64 = 0xfe00_0000;
/// Where BAR2 is placed.
pub const BAR2_BASE: u64 = 0x40_0000_0000;

/// The host's end of the device's upstream port: what the device sends lands here as it
/// sends it. A write goes straight into host memory (or is an interrupt). A read of host
/// memory is kept — its header only — and completed once the device's step returns
/// (completing it calls the device, which is busy while it sends). Completions for the
/// host's own requests are kept as bytes for the request waiting on them.
#[derive(Default)]
pub(crate) struct HostPort {
    pub(crate) mem: Vec<u8>,
    pub(crate) interrupts: Interrupts,
    pub(crate) reads: VecDeque<TlpRepr<'static>>,
    completions: VecDeque<Vec<u8>>,
    dma_read_refused: u64,
    dma_write_dropped: u64,
    counts: PlatformCounts,
    /// A read of the device's was completed since the device last ran (its `poll` or a
    /// request): reads it sends now may be the refill of a pipeline, not a new dependency.
    completed_since_run: bool,
    /// What the device has sent that the driver could see (writes into host memory,
    /// interrupts, completions), counted: while it stays the same, what the driver read
    /// last is still there.
    pub(crate) changes: u64,
}

/// What crossed the platform between the driver and the device: the hardware side of a
/// workload's transaction profile (`lab::model::Profile`), counted as the host
/// endpoint counts the same TLPs on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlatformCounts {
    /// Memory reads of the device's BARs by the driver: each blocks the driver for a round
    /// trip.
    pub register_reads: u64,
    /// Memory writes to the device's BARs (posted).
    pub register_writes: u64,
    /// Memory reads of host memory by the device.
    pub device_reads: u64,
    /// Bytes those reads asked for.
    pub device_read_bytes: u64,
    /// Device reads sent while no other read of the device's was outstanding and none had
    /// completed since the device last ran: the first of each chain of reads the device
    /// waits on (a command fetch, the start of a copy), each a round trip on its critical
    /// path through a bridge. The reads that keep a copy's window full are not.
    pub dependent_reads: u64,
    /// Memory writes into host memory by the device (MSI-X messages not included).
    pub device_writes: u64,
    /// Bytes of those writes.
    pub device_write_bytes: u64,
    /// MSI-X messages.
    pub interrupts: u64,
}

impl PlatformCounts {
    /// What was counted since `before` (an earlier reading of the same counters).
    pub fn since(&self, before: &PlatformCounts) -> PlatformCounts {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        PlatformCounts {
            register_reads: d(self.register_reads, before.register_reads),
            register_writes: d(self.register_writes, before.register_writes),
            device_reads: d(self.device_reads, before.device_reads),
            device_read_bytes: d(self.device_read_bytes, before.device_read_bytes),
            dependent_reads: d(self.dependent_reads, before.dependent_reads),
            device_writes: d(self.device_writes, before.device_writes),
            device_write_bytes: d(self.device_write_bytes, before.device_write_bytes),
            interrupts: d(self.interrupts, before.interrupts),
        }
    }
}

impl HostPort {
    pub(crate) fn with_memory(len: usize) -> HostPort {
        HostPort { mem: vec![0; len], ..HostPort::default() }
    }

    /// Takes the completion for `tag`, if it has arrived.
    pub(crate) fn completion_for(&mut self, tag: Tag) -> Option<(CplStatus, Vec<u8>)> {
        let i = self.completions.iter().position(|b| {
            TlpRepr::parse_bytes(b, &ParseConfig::default()).is_ok_and(|c| c.requester_tag().1 == tag)
        })?;
        let b = self.completions.remove(i)?;
        let c = TlpRepr::parse_bytes(&b, &ParseConfig::default()).ok()?;
        match c.body {
            Body::Completion { cpl, data, .. } => Some((cpl.status, data.unwrap_or(&[]).to_vec())),
            _ => None,
        }
    }

    pub(crate) fn in_memory(&self, addr: u64, len: u64) -> Option<usize> {
        let off = addr.checked_sub(HOST_MEMORY_BASE)?;
        (off.checked_add(len)? <= self.mem.len() as u64).then_some(off as usize)
    }
}

impl HostPort {
    /// Takes everything `dev` sent, in order, as it lands. (Each TLP is used where the call
    /// returned it, by reference: moved out first, its copy read the bytes the device had
    /// just written there behind the previous payload's 4 KiB copy, and waited for that copy's
    /// stores to drain — copies out ran at 4.9 GB/s instead of 6.1.)
    pub(crate) fn take_from<D: Device + ?Sized>(&mut self, dev: &mut D) {
        while let Some(ref t) = dev.upstream() {
            self.send(t);
        }
    }

    /// One TLP the device sent.
    pub(crate) fn send(&mut self, tlp: &TlpRepr<'_>) {
        match tlp.body {
            Body::MemWrite { req, address, data, .. } => {
                self.changes += 1;
                let a = address.value();
                if (MSI_BASE..MSI_BASE + 0x1000).contains(&a) && data.len() >= 4 {
                    let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as u16;
                    self.interrupts.signal(v, 1);
                    self.counts.interrupts += 1;
                } else if let Some(off) = self.in_memory(a, data.len() as u64) {
                    let dst = &mut self.mem[off..off + data.len()];
                    rules::write_enabled_bytes(dst, data, req.first_be, req.last_be);
                    self.counts.device_writes += 1;
                    self.counts.device_write_bytes += data.len() as u64;
                } else {
                    self.dma_write_dropped += 1;
                }
            }
            Body::MemRead { length_dw, .. } => {
                self.counts.device_reads += 1;
                self.counts.device_read_bytes += length_dw as u64 * 4;
                if self.reads.is_empty() && !self.completed_since_run {
                    self.counts.dependent_reads += 1;
                }
                self.reads.push_back(tlp.with_data(&[]))
            }
            Body::Completion { .. } => {
                self.changes += 1;
                self.completions.push_back(emit(tlp));
            }
            // Nothing else a device sends (messages, atomics) is acted on here.
            _ => {}
        }
    }
}

pub(crate) fn emit(tlp: &TlpRepr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; tlp.buffer_len()];
    let n = tlp.emit(&mut b).unwrap_or(0);
    b.truncate(n);
    b
}

/// A device on the host's own bus.
pub struct DirectAttach<D: Device> {
    dev: D,
    host: HostPort,
    arena: DmaArena,
    next_tag: u16,
}

impl<D: Device> DirectAttach<D> {
    /// Attaches `dev` with `host_memory` bytes of DMA-able memory, and places its BARs.
    pub fn new(dev: D, host_memory: usize) -> DirectAttach<D> {
        let mut d = DirectAttach {
            dev,
            host: HostPort::with_memory(host_memory),
            arena: DmaArena::new(BusAddr(HOST_MEMORY_BASE), host_memory),
            next_tag: 0,
        };
        place_bars(&mut d);
        d
    }

    /// The device.
    pub fn device(&mut self) -> &mut D {
        &mut self.dev
    }

    /// Device DMA reads outside host memory (answered with UR).
    pub fn dma_read_refused(&self) -> u64 {
        self.host.dma_read_refused
    }

    /// Device DMA writes outside host memory (dropped).
    pub fn dma_write_dropped(&self) -> u64 {
        self.host.dma_write_dropped
    }

    /// What crossed the platform since it was attached.
    pub fn counts(&self) -> PlatformCounts {
        let mut c = self.host.counts;
        // Reads are completed at once here: where the device says which it would have waited
        // for on a link (copies taken back to back do not wait on each other), that count.
        if let Some(n) = self.dev.reads_waited_on() {
            c.dependent_reads = n;
        }
        c
    }

    /// Sends one host request to the device and serves everything that follows.
    fn request(&mut self, tlp: &TlpRepr<'_>) {
        self.dev.request(tlp);
        self.host.take_from(&mut self.dev);
        self.host.completed_since_run = false;
        self.serve_reads();
    }

    /// Completes the device's reads of host memory, oldest first, until none is left (a
    /// completion may make the device send more): each from where its bytes lie, the
    /// completions built over host memory and handed to the device.
    fn serve_reads(&mut self) {
        serve_reads(&mut self.host, &mut self.dev);
    }

    /// Lets the device work until it has nothing left to do (bounded).
    pub fn run(&mut self) -> bool {
        let mut any = false;
        for _ in 0..1_000_000 {
            let did = self.dev.poll();
            self.host.take_from(&mut self.dev);
            self.host.completed_since_run = false;
            self.serve_reads();
            if !did {
                break;
            }
            any = true;
        }
        any
    }
}

impl<D: Device> PciFunction for DirectAttach<D> {
    fn config_read(&mut self, offset: u16) -> u32 {
        config_request(self, offset, None)
    }
    fn config_write(&mut self, offset: u16, value: u32) {
        config_request(self, offset, Some(value.to_le_bytes()));
    }
    fn mmio_read(&mut self, addr: BusAddr, len: usize) -> u64 {
        self.host.counts.register_reads += 1;
        mmio_read(self, addr, len)
    }
    fn mmio_write(&mut self, addr: BusAddr, len: usize, value: u64) {
        self.host.counts.register_writes += 1;
        mmio_write(self, addr, len, value);
        self.run();
    }
    fn dma_alloc(&mut self, len: usize) -> Option<DmaBuf> {
        self.arena.alloc_zeroed(&mut self.host.mem, len)
    }
    fn dma_read(&mut self, buf: &DmaBuf, offset: usize, out: &mut [u8]) {
        self.run();
        self.arena.read(&self.host.mem, buf, offset, out);
    }
    fn dma_write(&mut self, buf: &DmaBuf, offset: usize, data: &[u8]) {
        self.arena.write(&mut self.host.mem, buf, offset, data);
    }
    fn wait_interrupt(&mut self, vector: u16, timeout: Duration) -> bool {
        wait_interrupt(timeout, |_| {
            if self.host.interrupts.take(vector) {
                WaitStep::Fired
            } else if self.run() {
                WaitStep::Busy
            } else {
                WaitStep::Idle
            }
        })
    }
}

/// The host's side of requests to a device: a platform sends them and takes their
/// completions; [`config_request`], [`mmio_read`] and [`mmio_write`] build the TLPs.
pub(crate) trait Requester {
    /// The device's ID (the target of configuration requests).
    fn target(&self) -> Bdf;
    /// A fresh tag.
    fn next_tag(&mut self) -> Tag;
    /// Sends a request to the device.
    fn send_request(&mut self, tlp: &TlpRepr<'_>);
    /// The completion for `tag`, once it is there (`None`: it never came).
    fn completion_for(&mut self, tag: Tag) -> Option<(CplStatus, Vec<u8>)>;
}

impl<D: Device> Requester for DirectAttach<D> {
    fn target(&self) -> Bdf {
        self.dev.id()
    }
    fn next_tag(&mut self) -> Tag {
        self.next_tag = (self.next_tag + 1) % 1024;
        Tag::from_bits(self.next_tag)
    }
    fn send_request(&mut self, tlp: &TlpRepr<'_>) {
        self.request(tlp);
    }
    fn completion_for(&mut self, tag: Tag) -> Option<(CplStatus, Vec<u8>)> {
        self.host.completion_for(tag)
    }
}

/// Places BAR0 and BAR2 where [`BAR0_BASE`] and [`BAR2_BASE`] say, as firmware would.
pub(crate) fn place_bars<P: PciFunction>(d: &mut P) {
    d.config_write(0x10, BAR0_BASE as u32);
    d.config_write(0x14, (BAR0_BASE >> 32) as u32);
    d.config_write(0x18, BAR2_BASE as u32);
    d.config_write(0x1c, (BAR2_BASE >> 32) as u32);
}

fn memory_request<R: Requester>(r: &mut R, addr: BusAddr, data: Option<&[u8]>, length_dw: u16) -> Tag {
    let tag = r.next_tag();
    let be = |n: u16| if n > 1 { (0xf, 0xf) } else { (0xf, 0) };
    let (first_be, last_be) = be(length_dw);
    let req = Request { requester: HOST_ID, tag, first_be, last_be };
    let body = match data {
        Some(d) => Body::MemWrite { req, address: Address::new(addr.get()), ph: 0, data: d },
        None => Body::MemRead { req, address: Address::new(addr.get()), ph: 0, length_dw, locked: false },
    };
    r.send_request(&TlpRepr::new(body));
    tag
}

/// A memory read of `len` bytes at `addr` (all-ones if it fails, as hardware reads).
pub(crate) fn mmio_read<R: Requester>(r: &mut R, addr: BusAddr, len: usize) -> u64 {
    let tag = memory_request(r, addr, None, (len / 4).max(1) as u16);
    match r.completion_for(tag) {
        Some((CplStatus::Success, v)) => {
            let mut b = [0u8; 8];
            let n = v.len().min(len).min(8);
            b[..n].copy_from_slice(&v[..n]);
            u64::from_le_bytes(b)
        }
        // A failed read returns all-ones, as real hardware does.
        _ => u64::MAX,
    }
}

/// A posted memory write of the low `len` bytes of `value` at `addr`.
pub(crate) fn mmio_write<R: Requester>(r: &mut R, addr: BusAddr, len: usize, value: u64) {
    let b = value.to_le_bytes();
    memory_request(r, addr, Some(&b[..len.min(8)]), (len / 4).max(1) as u16);
}

/// A configuration read (`data` None) or write of register `reg`.
pub(crate) fn config_request<R: Requester>(r: &mut R, reg: u16, data: Option<[u8; 4]>) -> u32 {
    let tag = r.next_tag();
    let req = Request { requester: HOST_ID, tag, first_be: 0xf, last_be: 0 };
    let cfg = ConfigTarget { type1: false, target: r.target(), register: reg & 0xffc };
    let d;
    let body = match data {
        Some(bytes) => {
            d = bytes;
            Body::CfgWrite { req, cfg, data: &d }
        }
        None => Body::CfgRead { req, cfg },
    };
    r.send_request(&TlpRepr::new(body));
    match r.completion_for(tag) {
        Some((CplStatus::Success, v)) if v.len() >= 4 => u32::from_le_bytes([v[0], v[1], v[2], v[3]]),
        Some((CplStatus::Success, _)) => 0,
        _ => u32::MAX,
    }
}

/// Completes the device's reads of host memory, oldest first, until none is left (a
/// completion may make the device send more): each from where its bytes lie, the
/// completions built over host memory and handed to the device.
pub(crate) fn serve_reads<D: Device>(host: &mut HostPort, dev: &mut D) {
    serve_reads_while(host, dev, |_| true);
}

/// [`serve_reads`], oldest first, while `more` (asked with how many were served so far, before
/// each) says to go on.
pub(crate) fn serve_reads_while<D: Device>(
    host: &mut HostPort,
    dev: &mut D,
    mut more: impl FnMut(usize) -> bool,
) {
    for served in 0.. {
        if !more(served) {
            return;
        }
        let Some(t) = host.reads.pop_front() else { return };
        let Body::MemRead { address, length_dw, .. } = t.body else { continue };
        host.completed_since_run = true;
        let mps = TransferSize::from_bytes(dev.max_payload()).unwrap_or(TransferSize::B128);
        match host.in_memory(address.value(), length_dw as u64 * 4) {
            Some(off) => {
                // Host memory is lent while the device takes the bytes; what it sends
                // meanwhile waits in its outbox, in order, and arrives after.
                let data = &host.mem[off..off + length_dw as usize * 4];
                rules::complete_read(&t, HOST_ID, data, Rcb::B64, mps, |c| dev.completion(c));
                host.take_from(dev);
            }
            None => {
                host.dma_read_refused += 1;
                let cpl = rules::completion_without_data(&t, HOST_ID, CplStatus::UnsupportedRequest);
                dev.completion(&cpl);
                host.take_from(dev);
            }
        }
    }
}
