//! The simulated GPU's device model (docs/simgpu.md): BAR0 registers, sparse VRAM behind the
//! prefetchable BAR2, MSI-X, and a command processor that fetches 64-byte commands by DMA
//! from a ring in host memory when the doorbell rings and executes them — copies in both
//! directions (DMA split at Max_Read_Request_Size / Max_Payload_Size and 4 KiB, several
//! reads in flight), fill, fp32 kernels, fences, interrupts. A malformed command or a failed
//! DMA sets ERROR, raises the error vector, and the processor goes on with the next command.
#![forbid(unsafe_code)]

use tlp::rules::{self, DwSpan, Rcb, TransferSize};
use tlp::{Address, Body, CplStatus, Request, Tag, TlpRepr};

use crate::device::Device;
pub use crate::device::now_ns;
use crate::function::{Function, MemoryTarget};
use crate::simgpu::{SimGpuParams, config_space};
use crate::upstream::Outbox;

pub use simgpu_abi::{CHANNELS, COMMAND_BYTES, ERROR_VECTOR, chreg, err, op, reg, sem};

/// DMA reads the device keeps in flight at most: 1 MiB at a Max_Read_Request_Size of 4 KiB,
/// a link's bandwidth × delay at 10 GB/s and 100 µs. (10-bit tags allow 768 in flight.)
pub const MAX_READS_IN_FLIGHT: usize = 256;
/// Tags the device uses: 10-bit tags (PCIe 6.0 §2.2.6.2), the values 0..1024.
const TAGS: usize = 1024;
const PAGE: u64 = 4096;
/// Largest buffer a command makes the device hold at once.
const CHUNK: u64 = 1 << 20;
/// Commands the command processor fetches in one DMA read at most (as many as are
/// published, up to the ring's end, Max_Read_Request_Size and the next 4 KiB boundary):
/// commands submitted together cost one read's round trip, not one each.
pub const PREFETCH: u64 = 16;
/// The prefetch buffer: the read being executed and the one fetched ahead.
const FETCHED_BYTES: usize = (2 * PREFETCH * COMMAND_BYTES) as usize;
/// Host→VRAM copies [`Device::reads_waited_on`] keeps apart while their bytes land.
const RING_LANDING: usize = 64;
/// Bytes a VRAM→host copy writes per `poll`: what a platform must take from the device
/// before it polls it again (a bridge polls a device only when its upstream took what the
/// device sent), so a long copy runs only this far ahead of the link, and a completion the
/// device owes waits behind no more than this.
const COPY_OUT_STEP: u64 = 64 << 10;
/// Multiply-adds a MATMUL computes per `poll` (a band of rows of C): a GPU's PCIe interface
/// answers register reads and acknowledges the link while its cores compute, so a platform
/// polling the device can serve its link between bands (a sixteenth of a 256³ product,
/// ≈ 0.8 ms here) rather than only after the whole kernel (12–13 ms).
const MATMUL_BAND: usize = 1 << 20;
/// The longest a TIMED kernel, or a copy's least duration, may be: 60 s.
pub const MAX_TIMED_NS: u64 = 60_000_000_000;

/// What an outstanding DMA read is for.
#[derive(Clone, Copy, Debug)]
enum ReadPurpose {
    /// Ring entries of channel `ch` from ring slot `slot` on, into its prefetch buffer from
    /// byte `at` on.
    Commands { ch: usize, at: u64, slot: u64 },
    /// Part of a host→VRAM copy of channel `ch`: bytes land at this VRAM offset.
    Copy { ch: usize, vram: u64 },
}

impl ReadPurpose {
    fn channel(self) -> usize {
        match self {
            ReadPurpose::Commands { ch, .. } | ReadPurpose::Copy { ch, .. } => ch,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Outstanding {
    purpose: ReadPurpose,
    /// Bytes of the request not yet received.
    remaining: u64,
    /// Where the next received byte goes (prefetch buffer offset or VRAM offset).
    next: u64,
}

/// Where the bytes of a DMA write come from.
#[derive(Clone, Copy)]
enum DmaSource<'a> {
    /// These bytes.
    Bytes(&'a [u8]),
    /// VRAM from this offset on.
    Vram(u64),
}

/// The command processor's state.
#[derive(Clone, Debug)]
enum Cp {
    Idle,
    /// Waiting for the command's bytes.
    Fetching,
    /// A host→VRAM copy: `next_host` .. `end_host` still to request.
    CopyIn {
        next_host: u64,
        end_host: u64,
        vram_at_next: u64,
    },
    /// A VRAM→host copy: `next_vram` .. `end_vram` still to write, from `host_at_next` on.
    CopyOut {
        next_vram: u64,
        end_vram: u64,
        host_at_next: u64,
    },
    /// A MATMUL into `c` (m × n, inner dimension k): A and B were read into the scratch when
    /// it began (B transposed), rows `next_row` .. m of C are still to compute, and C is
    /// written to VRAM after the last band.
    Matmul {
        c: u64,
        m: usize,
        n: usize,
        k: usize,
        next_row: usize,
    },
    /// A timed kernel, or a copy held to its least duration: the channel is busy until this
    /// time (ns on the device's clock, [`now_ns`]); a timed kernel is finished as a command
    /// then (`finishes`), a copy was when its last byte went.
    Timed {
        until_ns: u64,
        finishes: bool,
    },
    /// Waiting until the u64 at VRAM offset `at` reaches `value`.
    Acquire {
        at: u64,
        value: u64,
    },
}

/// One command channel (docs/simgpu.md, *Channels*): a ring in host memory with its own
/// registers and doorbell, and the command processor that fetches from it and executes its
/// commands in order. Channels run concurrently, as a GPU's channels feed its engines: a
/// kernel on one runs while another copies.
struct Channel {
    ring_base: u64,
    ring_size: u64,
    ring_head: u64,
    ring_tail: u64,
    /// Commands this channel executed since reset.
    completed: u64,
    cp: Cp,
    /// The command being executed.
    command: [u8; COMMAND_BYTES as usize],
    /// Ring entries fetched ahead: `fetched[0..]` holds ring slots `fetched_first` up to
    /// `fetched_end` (exclusive); `fetched_next` is the next not yet executed. Each is used
    /// once: after the ring wraps, the same slot holds another command. Room for two
    /// reads: the one being executed and the one fetched ahead ([`SimGpu::fetch_ahead`]).
    fetched: [u8; FETCHED_BYTES],
    fetched_first: u64,
    fetched_next: u64,
    fetched_end: u64,
    /// The first ring slot of the ring read in flight (its entries are not there yet), or
    /// of one that failed (`fetch_failed`) until the processor reaches it.
    ring_read: Option<u64>,
    /// The first ring slot of a second ring read, issued while `ring_read` was in flight
    /// for entries published since: it lands after the first's in the buffer, up to
    /// `fetched_end`. Launches published faster than one a round trip are fetched each
    /// with its own read, as a GPU's front end keeps several reads of its command buffer in
    /// flight, not one after the landing of the other.
    ring_read_next: Option<u64>,
    /// Whether the processor has had to wait for `ring_read` (counted once).
    ring_read_waited: bool,
    /// The ring read in flight failed: what it fetched is not to be trusted.
    fetch_failed: bool,
    /// How many of the device's reads in flight are this channel's host→VRAM copies': a
    /// copy whose reads are all issued is finished as a command, and the next host→VRAM
    /// copy may start while its bytes land.
    copy_reads: usize,
    /// A copy's read failed: the copies in flight with it end.
    failed: bool,
    /// The VRAM ranges host→VRAM copies issued since the command processor last needed
    /// their bytes: on a link, still landing ([`Device::reads_waited_on`]).
    landing: Vec<(u64, u64)>,
    /// The compute kernels' working buffers, kept from one command to the next.
    scratch: Scratch,
    /// When the command executing (or the last one, for a semaphore release after it)
    /// began, ns; and the least time a copy lasts from then.
    work_started_ns: u64,
    hold_until_ns: u64,
}

impl Channel {
    fn new() -> Channel {
        Channel {
            ring_base: 0,
            ring_size: 0,
            ring_head: 0,
            ring_tail: 0,
            completed: 0,
            cp: Cp::Idle,
            command: [0; COMMAND_BYTES as usize],
            fetched: [0; FETCHED_BYTES],
            fetched_first: 0,
            fetched_next: 0,
            fetched_end: 0,
            ring_read: None,
            ring_read_next: None,
            ring_read_waited: false,
            fetch_failed: false,
            copy_reads: 0,
            failed: false,
            landing: Vec::new(),
            scratch: Scratch::default(),
            work_started_ns: 0,
            hold_until_ns: 0,
        }
    }

    fn busy(&self) -> bool {
        self.ring_head != self.ring_tail || !matches!(self.cp, Cp::Idle)
    }
}

/// The simulated GPU.
pub struct SimGpu {
    function: Function,
    vram: Vram,
    /// What it sent that the platform has not taken yet ([`Device::upstream`]).
    out: Outbox,
    regs: Regs,
    /// The command channels; channel 0's registers are also at the legacy offsets.
    ch: Vec<Channel>,
    /// DMA reads in flight, by tag.
    outstanding: Box<[Option<Outstanding>; TAGS]>,
    /// How many of `outstanding` are in flight.
    in_flight: usize,
    next_tag: u16,
    /// DMA completions that matched no outstanding read (dropped, counted).
    pub stray_completions: u64,
    /// The most DMA reads the device had in flight at once.
    pub max_reads_in_flight: usize,
    /// DMA reads that fetched ring entries.
    pub command_fetches: u64,
    /// The times a command processor needed bytes it had read: each ring fetch, and each
    /// command that had to wait for copies' bytes to land ([`Device::reads_waited_on`]).
    reads_waited_on: u64,
}

/// A kernel's operands and result as floats. Kept between commands, as a GPU keeps its
/// on-chip memory: a MATMUL 256³ allocated 1.75 MiB afresh each time, and a stand-alone copy
/// of it took about 210 page faults a MATMUL on the main thread, 150 on another (none with
/// its buffers kept), its speed depending on the thread's allocator arena. A buffer grown past [`Scratch::KEPT`] floats is given back after the
/// command.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    y: Vec<f32>,
    t: Vec<f32>,
    out: Vec<f32>,
}

impl Scratch {
    /// Floats a buffer keeps between commands: a MATMUL's largest operand (256 × 256).
    const KEPT: usize = 256 * 256;

    fn trim(&mut self) {
        for v in [&mut self.x, &mut self.y, &mut self.t, &mut self.out] {
            if v.capacity() > Self::KEPT {
                *v = Vec::new();
            }
        }
    }
}

#[derive(Clone, Copy, Default)]
struct Regs {
    error: u64,
    int_status: u64,
    fence: u64,
    completed: u64,
    /// Bytes the copy engines landed in VRAM and sent to host memory (`reg::COPIED_TO_*`).
    copied_to_vram: u64,
    copied_to_host: u64,
}

impl SimGpu {
    /// A simulated GPU answering as `id`.
    pub fn new(id: tlp::Bdf, params: SimGpuParams) -> SimGpu {
        let cfg = config_space(&params);
        let vram_size = cfg.bar(2).map_or(params.vram_bytes, |b| b.size);
        SimGpu {
            function: Function::new(id, cfg),
            vram: Vram::new(vram_size),
            out: Outbox::default(),
            regs: Regs::default(),
            ch: (0..CHANNELS).map(|_| Channel::new()).collect(),
            outstanding: Box::new([None; TAGS]),
            in_flight: 0,
            next_tag: 0,
            stray_completions: 0,
            max_reads_in_flight: 0,
            command_fetches: 0,
            reads_waited_on: 0,
        }
    }

    /// VRAM bytes backed by memory (pages written so far).
    pub fn vram_resident(&self) -> u64 {
        self.vram.resident()
    }

    /// The channel register `off` addresses, as (channel, register offset within the
    /// channel's block): the channel blocks, and channel 0's legacy offsets.
    fn channel_reg(off: u64) -> Option<(usize, u64)> {
        match off {
            reg::RING_BASE..=reg::DOORBELL => Some((0, off - reg::RING_BASE)),
            _ if off >= chreg::BASE && off < chreg::BASE + CHANNELS as u64 * chreg::STRIDE => {
                Some((((off - chreg::BASE) / chreg::STRIDE) as usize, (off - chreg::BASE) % chreg::STRIDE))
            }
            _ => None,
        }
    }

    fn reg_read(&self, off: u64) -> u64 {
        if let Some((ch, r)) = Self::channel_reg(off) {
            let c = &self.ch[ch];
            return match r {
                chreg::RING_BASE => c.ring_base,
                chreg::RING_SIZE => c.ring_size,
                chreg::RING_HEAD => c.ring_head,
                chreg::RING_TAIL => c.ring_tail,
                chreg::COMPLETED => c.completed,
                _ => 0,
            };
        }
        match off {
            reg::ID => 1 << 32 | 0x474d_4953,
            reg::STATUS => {
                let busy = self.ch.iter().any(Channel::busy) || self.in_flight > 0;
                busy as u64 | ((self.regs.error != 0) as u64) << 1
            }
            reg::ERROR => self.regs.error,
            reg::INT_STATUS => self.regs.int_status,
            reg::FENCE => self.regs.fence,
            reg::VRAM_SIZE => self.vram.size(),
            reg::COMPLETED => self.regs.completed,
            reg::CHANNELS => CHANNELS as u64,
            reg::COPIED_TO_VRAM => self.regs.copied_to_vram,
            reg::COPIED_TO_HOST => self.regs.copied_to_host,
            _ => 0,
        }
    }

    fn reg_write(&mut self, off: u64, value: u64) {
        if let Some((ch, r)) = Self::channel_reg(off) {
            match r {
                chreg::RING_BASE => {
                    self.ch[ch].ring_base = value & !(COMMAND_BYTES - 1);
                    self.forget_prefetched(ch);
                }
                chreg::RING_SIZE => {
                    self.ch[ch].ring_size = value;
                    self.forget_prefetched(ch);
                }
                chreg::RING_TAIL => self.ch[ch].ring_tail = value,
                // The doorbell only wakes the processor; `poll` reads RING_TAIL.
                _ => {}
            }
            return;
        }
        match off {
            reg::ERROR => self.regs.error &= !value,
            reg::INT_STATUS => self.regs.int_status &= !value,
            _ => {}
        }
    }

    /// A register access of `len` bytes (4 or 8, aligned) at `off`.
    fn mmio_read(&self, off: u64, len: usize) -> Option<u64> {
        if !matches!(len, 4 | 8) || !off.is_multiple_of(len as u64) {
            return None;
        }
        let v = self.reg_read(off & !7);
        Some(if len == 8 {
            v
        } else if off % 8 == 4 {
            v >> 32
        } else {
            v & 0xffff_ffff
        })
    }

    fn mmio_write(&mut self, off: u64, data: &[u8]) {
        match data.len() {
            8 if off.is_multiple_of(8) => {
                let v = u64::from_le_bytes(data.try_into().unwrap_or([0; 8]));
                self.reg_write(off, v);
            }
            4 if off.is_multiple_of(4) => {
                let v = u32::from_le_bytes(data.try_into().unwrap_or([0; 4])) as u64;
                let base = off & !7;
                let old = self.reg_read(base);
                let merged =
                    if off % 8 == 4 { (old & 0xffff_ffff) | v << 32 } else { (old & !0xffff_ffff) | v };
                // W1C registers take the written bits only.
                let w = if matches!(base, reg::ERROR | reg::INT_STATUS) {
                    if off % 8 == 4 { v << 32 } else { v }
                } else {
                    merged
                };
                self.reg_write(base, w);
            }
            _ => {}
        }
    }

    fn raise_error(&mut self, code: u64) {
        if self.regs.error == 0 {
            self.regs.error = code;
        }
        self.regs.int_status |= 2;
        self.function.signal(ERROR_VECTOR, &mut self.out);
    }

    /// Writes `data` into VRAM at `at`: payloads still queued from there leave as they were
    /// when sent ([`Outbox::before_memory_write`]).
    fn write_vram(&mut self, at: u64, data: &[u8]) {
        self.out.before_memory_write(at, data.len() as u64, &self.vram);
        self.vram.write(at, data);
    }

    /// Answers the memory read `request` of VRAM from `off` on (in bounds): its completions'
    /// payloads read from VRAM as the platform takes them.
    fn complete_from_vram(&mut self, request: &TlpRepr<'_>, off: u64) {
        let Body::MemRead { req, address, length_dw, .. } = request.body else { return };
        let mps =
            TransferSize::from_bytes(self.function.config().max_payload()).unwrap_or(TransferSize::B128);
        let chunks =
            rules::read_completions(address.value(), length_dw, req.first_be, req.last_be, Rcb::B64, mps);
        for chunk in chunks {
            let header = rules::completion_with_data(request, self.function.id(), &chunk, &[]);
            let n = chunk.length_dw as usize * 4;
            self.out.send_from_memory(&header, off + chunk.data_offset as u64, n, 0, n);
        }
    }

    fn alloc_tag(&mut self) -> Option<u16> {
        for _ in 0..TAGS {
            let t = self.next_tag;
            self.next_tag = (self.next_tag + 1) % TAGS as u16;
            if self.outstanding[t as usize].is_none() {
                return Some(t);
            }
        }
        None
    }

    /// Ends the read with `tag`: its tag is free again.
    fn retire(&mut self, tag: u16) {
        if let Some(o) = self.outstanding[tag as usize].take() {
            self.in_flight -= 1;
            if let ReadPurpose::Copy { ch, .. } = o.purpose {
                self.ch[ch].copy_reads -= 1;
            }
        }
    }

    /// Whether `command` may start while host→VRAM copies' bytes are still landing: only
    /// another host→VRAM copy, into VRAM none of them still writes (a copy engine takes its
    /// descriptors back to back, keeping the link full across them). Anything else — a
    /// kernel, a fence, a copy out — waits until they have landed.
    fn may_start_beside_copies(&self, ch: usize, command: &[u8]) -> bool {
        let landing = self.outstanding.iter().flatten().filter_map(|o| match o.purpose {
            ReadPurpose::Copy { ch: c, .. } if c == ch => Some((o.next, o.next.saturating_add(o.remaining))),
            _ => None,
        });
        Self::starts_beside(command, landing)
    }

    /// Whether `command` is a host→VRAM copy into none of the VRAM ranges `landing` (looked
    /// at only for such a copy).
    fn starts_beside(command: &[u8], mut landing: impl Iterator<Item = (u64, u64)>) -> bool {
        let word = |at: usize| u64::from_le_bytes(command[at..at + 8].try_into().unwrap_or([0; 8]));
        if u32::from_le_bytes(command[0..4].try_into().unwrap_or([0; 4])) != op::COPY_H2V {
            return false;
        }
        let (start, end) = (word(16), word(16).saturating_add(word(24)));
        landing.all(|(s, e)| e <= start || s >= end)
    }

    fn dma_read(&mut self, addr: u64, len: u64, purpose: ReadPurpose) -> bool {
        let Some(tag) = self.alloc_tag() else { return false };
        let span = DwSpan::for_bytes(addr, len as u32);
        self.out.send(&TlpRepr::new(Body::MemRead {
            req: Request {
                requester: self.function.id(),
                tag: Tag::from_bits(tag),
                first_be: span.first_be,
                last_be: span.last_be,
            },
            address: Address::new(span.address),
            ph: 0,
            length_dw: span.length_dw,
            locked: false,
        }));
        let next = match purpose {
            ReadPurpose::Commands { at, .. } => at,
            ReadPurpose::Copy { vram, .. } => vram,
        };
        self.outstanding[tag as usize] = Some(Outstanding { purpose, remaining: len, next });
        self.in_flight += 1;
        if let ReadPurpose::Copy { ch, .. } = purpose {
            self.ch[ch].copy_reads += 1;
        }
        self.max_reads_in_flight = self.max_reads_in_flight.max(self.in_flight);
        true
    }

    /// Writes `len` bytes from `src` to host memory at `addr`, in memory writes of at most
    /// Max_Payload_Size that cross no 4 KiB boundary. A piece from VRAM is read from there
    /// when the platform takes it (its one copy); bytes of a command's are carried.
    fn dma_write(&mut self, addr: u64, src: DmaSource<'_>, len: usize) {
        let mps =
            TransferSize::from_bytes(self.function.config().max_payload()).unwrap_or(TransferSize::B128);
        let mut done = 0usize;
        // Room for a whole-DW payload of the largest Max_Payload_Size and its alignment.
        let mut padded = [0u8; 4096 + 8];
        for (a, n) in rules::split(addr, len as u64, mps) {
            let span = DwSpan::for_bytes(a, n);
            let n = n as usize;
            let lead = (a - span.address) as usize;
            let dws = span.length_dw as usize * 4;
            let req = Request {
                requester: self.function.id(),
                tag: Tag::default(),
                first_be: span.first_be,
                last_be: span.last_be,
            };
            let address = Address::new(span.address);
            match src {
                DmaSource::Vram(at) => {
                    let header = TlpRepr::new(Body::MemWrite { req, address, ph: 0, data: &[] });
                    self.out.send_from_memory(&header, at + done as u64, n, lead, dws);
                }
                DmaSource::Bytes(d) => {
                    // The payload is whole DWs; bytes outside the byte enables are zero.
                    padded[..dws].fill(0);
                    padded[lead..lead + n].copy_from_slice(&d[done..done + n]);
                    let data = &padded[..dws];
                    self.out.send(&TlpRepr::new(Body::MemWrite { req, address, ph: 0, data }));
                }
            }
            done += n;
        }
    }
}

impl SimGpu {
    /// The function: config space, MSI-X, Command gates.
    pub fn function(&self) -> &Function {
        &self.function
    }
}

impl Device for SimGpu {
    fn id(&self) -> tlp::Bdf {
        self.function.id()
    }

    fn max_payload(&self) -> u32 {
        self.function.config().max_payload()
    }

    fn request(&mut self, tlp: &TlpRepr<'_>) {
        match tlp.body {
            Body::CfgRead { .. } | Body::CfgWrite { .. } => {
                let e = self.function.config_request(tlp, &mut self.out);
                if e.function_level_reset {
                    self.reset();
                }
            }
            Body::MemRead { address, length_dw, .. } => {
                let target = self.function.memory_target(address.value());
                let len = length_dw as u64 * 4;
                // A register's value is completed from the stack, VRAM from where it lies.
                let register: [u8; 8];
                let data: Result<&[u8], CplStatus> = match target {
                    Err(s) => Err(s),
                    Ok(t @ (MemoryTarget::MsixTable(_) | MemoryTarget::MsixPba(_))) => {
                        let v = self.function.msix_read(t, len as usize);
                        if matches!(len, 4 | 8) {
                            register = v.to_le_bytes();
                            Ok(&register[..len as usize])
                        } else {
                            Err(CplStatus::UnsupportedRequest)
                        }
                    }
                    // `mmio_read` takes 4 or 8 bytes only.
                    Ok(MemoryTarget::Bar(0, off)) => match self.mmio_read(off, len as usize) {
                        Some(v) => {
                            register = v.to_le_bytes();
                            Ok(&register[..len as usize])
                        }
                        None => Err(CplStatus::CompleterAbort),
                    },
                    Ok(MemoryTarget::Bar(_, off)) if self.vram.in_bounds(off, len) => {
                        self.complete_from_vram(tlp, off);
                        return;
                    }
                    Ok(MemoryTarget::Bar(..)) => Err(CplStatus::UnsupportedRequest),
                };
                let id = self.function.id();
                match data {
                    Ok(d) => {
                        let mps = TransferSize::from_bytes(self.function.config().max_payload())
                            .unwrap_or(TransferSize::B128);
                        rules::complete_read(tlp, id, d, Rcb::B64, mps, |c| self.out.send(c));
                    }
                    Err(status) => self.out.send(&rules::completion_without_data(tlp, id, status)),
                }
            }
            Body::MemWrite { req, address, data, .. } => {
                // Posted: a write nothing decodes is dropped (no completion to send).
                let Ok(target) = self.function.memory_target(address.value()) else { return };
                match target {
                    MemoryTarget::MsixTable(_) | MemoryTarget::MsixPba(_) => {
                        let v = match data.len() {
                            4 => u32::from_le_bytes(data.try_into().unwrap_or([0; 4])) as u64,
                            8 => u64::from_le_bytes(data.try_into().unwrap_or([0; 8])),
                            _ => return,
                        };
                        self.function.msix_write(target, data.len(), v, &mut self.out);
                    }
                    MemoryTarget::Bar(0, off) => self.mmio_write(off, data),
                    MemoryTarget::Bar(_, off) => {
                        // Byte enables: First DW BE covers bytes 0..4, Last DW BE the last DW.
                        let n = data.len();
                        let enabled = |i: usize| {
                            if i < 4 {
                                req.first_be & (1 << i) != 0
                            } else if n > 4 && i >= n - 4 {
                                req.last_be & (1 << (i - (n - 4))) != 0
                            } else {
                                true
                            }
                        };
                        if !self.vram.in_bounds(off, n as u64) {
                            return;
                        }
                        let mut i = 0;
                        while i < n {
                            if !enabled(i) {
                                i += 1;
                                continue;
                            }
                            let start = i;
                            while i < n && enabled(i) {
                                i += 1;
                            }
                            self.write_vram(off + start as u64, &data[start..i]);
                        }
                    }
                }
            }
            // IO, AtomicOps and the rest: unsupported. Non-posted ones get UR.
            _ => {
                if tlp.fc_class() == tlp::FcClass::NonPosted {
                    self.out.send(&rules::completion_without_data(
                        tlp,
                        self.function.id(),
                        CplStatus::UnsupportedRequest,
                    ));
                }
            }
        }
    }

    fn completion(&mut self, tlp: &TlpRepr<'_>) {
        let Body::Completion { cpl, data, .. } = tlp.body else { return };
        let tag = cpl.tag.value();
        let Some(mut o) = self.outstanding.get(tag as usize).copied().flatten() else {
            self.stray_completions += 1;
            return;
        };
        let ch = o.purpose.channel();
        if cpl.status != CplStatus::Success || tlp.ep {
            self.retire(tag);
            match o.purpose {
                ReadPurpose::Commands { .. } => self.ch[ch].fetch_failed = true,
                ReadPurpose::Copy { .. } => self.ch[ch].failed = true,
            }
            self.raise_error(err::DMA);
            return;
        }
        let d = data.unwrap_or(&[]);
        let pad = (cpl.lower_address & 3) as usize;
        let n = (d.len().saturating_sub(pad) as u64).min(o.remaining).min(cpl.byte_count as u64);
        let bytes = &d[pad.min(d.len())..pad.min(d.len()) + n as usize];
        match o.purpose {
            ReadPurpose::Commands { .. } => {
                let at = (o.next as usize).min(self.ch[ch].fetched.len());
                let end = (at + bytes.len()).min(self.ch[ch].fetched.len());
                self.ch[ch].fetched[at..end].copy_from_slice(&bytes[..end - at]);
            }
            ReadPurpose::Copy { .. } => {
                self.write_vram(o.next, bytes);
                self.regs.copied_to_vram += bytes.len() as u64;
            }
        }
        o.next += n;
        o.remaining -= n;
        if o.remaining == 0 {
            if let ReadPurpose::Commands { slot, .. } = o.purpose {
                let c = &mut self.ch[ch];
                if c.ring_read == Some(slot) {
                    // The second read, if any, is now the one the processor may wait for.
                    (c.ring_read, c.ring_read_waited) = (c.ring_read_next.take(), false);
                } else if c.ring_read_next == Some(slot) {
                    c.ring_read_next = None;
                }
            }
            self.retire(tag);
        } else {
            self.outstanding[tag as usize] = Some(o);
        }
    }

    fn poll(&mut self) -> bool {
        if !self.function.bus_master() {
            return false;
        }
        let mut did = false;
        for ch in 0..self.ch.len() {
            // Channel 0 is polled as before; the others only once programmed.
            if ch == 0 || self.ch[ch].ring_size != 0 {
                did |= self.poll_channel(ch);
            }
        }
        did
    }

    fn wake_at_ns(&self) -> Option<u64> {
        self.ch
            .iter()
            .filter_map(|c| match c.cp {
                Cp::Timed { until_ns, .. } => Some(until_ns),
                _ => None,
            })
            .min()
    }

    fn reads_waited_on(&self) -> Option<u64> {
        Some(self.reads_waited_on)
    }

    #[inline]
    fn upstream(&mut self) -> Option<TlpRepr<'_>> {
        self.out.take(&self.vram)
    }

    /// What it sent before the reset still leaves (a configuration write's completion, for
    /// one): payloads from VRAM are copied out before VRAM goes.
    fn reset(&mut self) {
        self.function.reset();
        self.out.before_memory_write(0, u64::MAX, &self.vram);
        self.vram.clear();
        self.regs = Regs::default();
        for c in &mut self.ch {
            *c = Channel::new();
        }
        self.outstanding.fill(None);
        self.in_flight = 0;
    }
}

mod cp;
mod vram;

pub use vram::VRAM_PAGE;
use vram::Vram;
