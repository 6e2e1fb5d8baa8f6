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
use crate::function::{Function, MemoryTarget, Upstream};
use crate::simgpu::{SimGpuParams, config_space};

pub use simgpu_abi::{CHANNELS, COMMAND_BYTES, ERROR_VECTOR, chreg, err, op, reg, sem};

/// DMA reads the device keeps in flight at most: 1 MiB at a Max_Read_Request_Size of 4 KiB,
/// a link's bandwidth × delay at 10 GB/s and 100 µs. (10-bit tags allow 768 in flight.)
pub const MAX_READS_IN_FLIGHT: usize = 256;
/// Tags the device uses: 10-bit tags (PCIe 6.0 §2.2.6.2), the values 0..1024.
const TAGS: usize = 1024;
const PAGE: u64 = 4096;
/// VRAM is backed in pages of this size, each allocated when first written.
pub const VRAM_PAGE: u64 = 64 << 10;
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

type VramPage = Box<[u8; VRAM_PAGE as usize]>;

/// Untouched VRAM reads as this.
static ZERO_PAGE: [u8; VRAM_PAGE as usize] = [0; VRAM_PAGE as usize];

/// Sparse VRAM: pages exist once written; reads of untouched memory return zeros. The page
/// table is indexed by page number and grows to the highest page written (8 bytes per page
/// below it: 8 MiB for a write at the top of 64 GiB).
#[derive(Clone, Default)]
struct Vram {
    size: u64,
    pages: Vec<Option<VramPage>>,
    resident: u64,
}

impl Vram {
    fn in_bounds(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|end| end <= self.size)
    }
    /// The `len` bytes at `off` where they lie, if they lie in one page (untouched pages
    /// read as zeros). The caller checked the bounds.
    fn slice(&self, off: u64, len: usize) -> Option<&[u8]> {
        let (page, at) = ((off / VRAM_PAGE) as usize, (off % VRAM_PAGE) as usize);
        if at + len > VRAM_PAGE as usize {
            return None;
        }
        let p = self.pages.get(page).and_then(|p| p.as_deref()).unwrap_or(&ZERO_PAGE);
        Some(&p[at..at + len])
    }
    fn read(&self, off: u64, out: &mut [u8]) {
        let mut done = 0;
        while done < out.len() {
            let a = off + done as u64;
            let n = (VRAM_PAGE - a % VRAM_PAGE).min((out.len() - done) as u64) as usize;
            if let Some(src) = self.slice(a, n) {
                out[done..done + n].copy_from_slice(src);
            }
            done += n;
        }
    }
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let a = off + done as u64;
            let (page, at) = ((a / VRAM_PAGE) as usize, (a % VRAM_PAGE) as usize);
            let n = (VRAM_PAGE as usize - at).min(data.len() - done);
            if self.pages.len() <= page {
                self.pages.resize_with(page + 1, || None);
            }
            let p = self.pages[page].get_or_insert_with(|| {
                self.resident += VRAM_PAGE;
                // Built on the heap: a 64 KiB array on the stack first is wasted work.
                vec![0u8; VRAM_PAGE as usize].into_boxed_slice().try_into().unwrap_or_else(|_| unreachable!())
            });
            p[at..at + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
    }
    fn clear(&mut self) {
        self.pages = Vec::new();
        self.resident = 0;
    }
    /// The `n` floats at `off` (a multiple of 4: no float straddles a page) into `out`,
    /// replacing what it held, straight from the pages.
    fn read_f32s_into(&self, off: u64, n: u64, out: &mut Vec<f32>) {
        out.clear();
        let (mut at, end) = (off, off + n * 4);
        while at < end {
            let len = (VRAM_PAGE - at % VRAM_PAGE).min(end - at) as usize;
            let bytes = self.slice(at, len).unwrap_or(&[]);
            out.extend(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
            at += len as u64;
        }
    }
    /// `v` at `off` (a multiple of 4), straight into the pages.
    fn write_f32s(&mut self, off: u64, v: &[f32]) {
        // Through a stack buffer of this many bytes at a time.
        const STAGE: usize = 4096;
        let mut bytes = [0u8; STAGE];
        for (i, chunk) in v.chunks(STAGE / 4).enumerate() {
            for (b, x) in bytes.chunks_exact_mut(4).zip(chunk) {
                b.copy_from_slice(&x.to_le_bytes());
            }
            self.write(off + (i * STAGE) as u64, &bytes[..chunk.len() * 4]);
        }
    }
    /// Bytes actually backed by memory.
    fn resident(&self) -> u64 {
        self.resident
    }
}

/// What an outstanding DMA read is for.
#[derive(Clone, Copy, Debug)]
enum ReadPurpose {
    /// Ring entries of channel `ch`, into its prefetch buffer from this byte on.
    Commands { ch: usize, at: u64 },
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
    /// The first ring slot of the ring read in flight (its entries, up to `fetched_end`,
    /// are not there yet), or of one that failed (`fetch_failed`) until the processor
    /// reaches it. One ring read at a time.
    ring_read: Option<u64>,
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
}

impl SimGpu {
    /// A simulated GPU answering as `id`.
    pub fn new(id: tlp::Bdf, params: SimGpuParams) -> SimGpu {
        let cfg = config_space(&params);
        let vram_size = cfg.bar(2).map_or(params.vram_bytes, |b| b.size);
        SimGpu {
            function: Function::new(id, cfg),
            vram: Vram { size: vram_size, ..Vram::default() },
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
            reg::VRAM_SIZE => self.vram.size,
            reg::COMPLETED => self.regs.completed,
            reg::CHANNELS => CHANNELS as u64,
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

    fn raise_error(&mut self, code: u64, up: &mut dyn Upstream) {
        if self.regs.error == 0 {
            self.regs.error = code;
        }
        self.regs.int_status |= 2;
        self.function.signal(ERROR_VECTOR, up);
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

    fn dma_read(&mut self, addr: u64, len: u64, purpose: ReadPurpose, up: &mut dyn Upstream) -> bool {
        let Some(tag) = self.alloc_tag() else { return false };
        let span = DwSpan::for_bytes(addr, len as u32);
        up.send(&TlpRepr::new(Body::MemRead {
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
    /// Max_Payload_Size that cross no 4 KiB boundary. A piece whose bytes lie whole DWs in
    /// one place (the command's bytes, or one VRAM page) is sent from where it lies; only
    /// another is assembled first.
    fn dma_write(&mut self, addr: u64, src: DmaSource<'_>, len: usize, up: &mut dyn Upstream) {
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
            let direct = match src {
                DmaSource::Bytes(d) => Some(&d[done..done + n]),
                DmaSource::Vram(at) => self.vram.slice(at + done as u64, n),
            };
            // The payload is whole DWs; bytes outside the byte enables are zero.
            let payload = match direct {
                Some(bytes) if lead == 0 && dws == n => bytes,
                _ => {
                    padded[..dws].fill(0);
                    let piece = &mut padded[lead..lead + n];
                    match src {
                        DmaSource::Bytes(d) => piece.copy_from_slice(&d[done..done + n]),
                        DmaSource::Vram(at) => self.vram.read(at + done as u64, piece),
                    }
                    &padded[..dws]
                }
            };
            up.send(&TlpRepr::new(Body::MemWrite {
                req: Request {
                    requester: self.function.id(),
                    tag: Tag::default(),
                    first_be: span.first_be,
                    last_be: span.last_be,
                },
                address: Address::new(span.address),
                ph: 0,
                data: payload,
            }));
            done += n;
        }
    }

    fn arg(&self, ch: usize, i: usize) -> u64 {
        let at = 8 + 8 * i;
        u64::from_le_bytes(self.ch[ch].command[at..at + 8].try_into().unwrap_or([0; 8]))
    }

    /// Runs the fetched command. Returns true when it is finished (else a copy continues).
    fn execute(&mut self, ch: usize, up: &mut dyn Upstream) -> bool {
        let opcode = u32::from_le_bytes(self.ch[ch].command[0..4].try_into().unwrap_or([0; 4]));
        let (a, b, c, d) = (self.arg(ch, 0), self.arg(ch, 1), self.arg(ch, 2), self.arg(ch, 3));
        if !matches!(opcode, op::SEM_RELEASE | op::SEM_ACQUIRE) {
            self.ch[ch].work_started_ns = now_ns();
        }
        let f32_range = |off: u64, n: u64| {
            n > 0 && n <= 1 << 24 && off.is_multiple_of(4) && self.vram.in_bounds(off, n * 4)
        };
        if matches!(opcode, op::COPY_H2V | op::COPY_V2H) && d > 0 {
            // Held to the traced copy engine's time: busy until then once its bytes went.
            self.ch[ch].hold_until_ns = self.ch[ch].work_started_ns.saturating_add(d.min(MAX_TIMED_NS));
        }
        let ok = match opcode {
            op::NOP => true,
            op::TIMED if a <= MAX_TIMED_NS => {
                if a == 0 {
                    true
                } else {
                    let until_ns = self.ch[ch].work_started_ns.saturating_add(a);
                    self.ch[ch].cp = Cp::Timed { until_ns, finishes: true };
                    return false;
                }
            }
            op::SEM_RELEASE
                if a.is_multiple_of(8)
                    && c & !(sem::VRAM | sem::TIMESTAMPS) == 0
                    && (c & sem::VRAM == 0 || self.vram.in_bounds(a, 24)) =>
            {
                let mut w = [0u8; 24];
                w[0..8].copy_from_slice(&b.to_le_bytes());
                w[8..16].copy_from_slice(&self.ch[ch].work_started_ns.to_le_bytes());
                w[16..24].copy_from_slice(&now_ns().to_le_bytes());
                let n = if c & sem::TIMESTAMPS != 0 { 24 } else { 8 };
                if c & sem::VRAM != 0 {
                    self.vram.write(a, &w[..n]);
                } else {
                    self.dma_write(a, DmaSource::Bytes(&w[..n]), n, up);
                }
                true
            }
            op::SEM_ACQUIRE if a.is_multiple_of(8) && self.vram.in_bounds(a, 8) => {
                if self.vram_u64(a) >= b {
                    true
                } else {
                    self.ch[ch].cp = Cp::Acquire { at: a, value: b };
                    return false;
                }
            }
            op::COPY_H2V if c > 0 && self.vram.in_bounds(b, c) => {
                self.ch[ch].cp = Cp::CopyIn { next_host: a, end_host: a.saturating_add(c), vram_at_next: b };
                if self.ch[ch].landing.len() >= RING_LANDING {
                    // Too many to keep apart: count the wait a link might impose.
                    self.reads_waited_on += 1;
                    self.ch[ch].landing.clear();
                }
                self.ch[ch].landing.push((b, b + c));
                return false;
            }
            op::COPY_V2H if c > 0 && self.vram.in_bounds(a, c) => {
                // In steps, one per poll (see COPY_OUT_STEP).
                self.ch[ch].cp = Cp::CopyOut { next_vram: a, end_vram: a + c, host_at_next: b };
                return false;
            }
            op::COPY_V2V if c > 0 && self.vram.in_bounds(a, c) && self.vram.in_bounds(b, c) => {
                let mut buf = vec![0u8; c.min(CHUNK) as usize];
                // Overlapping ranges copy as memmove does: backwards when the destination is above.
                let chunks: Vec<u64> = (0..c.div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
                let order: Box<dyn Iterator<Item = &u64>> =
                    if b > a { Box::new(chunks.iter().rev()) } else { Box::new(chunks.iter()) };
                for &off in order {
                    let n = (c - off).min(CHUNK) as usize;
                    self.vram.read(a + off, &mut buf[..n]);
                    self.vram.write(b + off, &buf[..n]);
                }
                true
            }
            op::FILL if b > 0 && self.vram.in_bounds(a, b) => {
                let pat = (c as u32).to_le_bytes();
                let buf: Vec<u8> = (0..b.min(CHUNK) as usize).map(|i| pat[i % 4]).collect();
                let mut done = 0;
                while done < b {
                    // CHUNK is a multiple of 4, so the pattern stays in phase.
                    let n = (b - done).min(CHUNK) as usize;
                    self.vram.write(a + done, &buf[..n]);
                    done += n as u64;
                }
                true
            }
            op::VADD if f32_range(a, d) && f32_range(b, d) && f32_range(c, d) => {
                let Scratch { x, y, .. } = &mut self.ch[ch].scratch;
                self.vram.read_f32s_into(a, d, x);
                self.vram.read_f32s_into(b, d, y);
                x.iter_mut().zip(&*y).for_each(|(p, q)| *p += q);
                self.vram.write_f32s(c, x);
                true
            }
            op::SAXPY if f32_range(a, c) && f32_range(b, c) => {
                let alpha = f32::from_bits(d as u32);
                let Scratch { x, y, .. } = &mut self.ch[ch].scratch;
                self.vram.read_f32s_into(a, c, x);
                self.vram.read_f32s_into(b, c, y);
                y.iter_mut().zip(&*x).for_each(|(q, p)| *q += alpha * p);
                self.vram.write_f32s(b, y);
                true
            }
            op::REDUCE_SUM if f32_range(a, b) && f32_range(c, 1) => {
                let x = &mut self.ch[ch].scratch.x;
                self.vram.read_f32s_into(a, b, x);
                let sum: f32 = x.iter().sum();
                self.vram.write_f32s(c, &[sum]);
                true
            }
            op::MATMUL => {
                let (m, n, k) = (d & 0xffff, (d >> 16) & 0xffff, (d >> 32) & 0xffff);
                let dims_ok = (1..=256).contains(&m) && (1..=256).contains(&n) && (1..=256).contains(&k);
                if dims_ok && f32_range(a, m * k) && f32_range(b, k * n) && f32_range(c, m * n) {
                    let Scratch { x: am, y: bm, t: bt, out: cm } = &mut self.ch[ch].scratch;
                    self.vram.read_f32s_into(a, m * k, am);
                    self.vram.read_f32s_into(b, k * n, bm);
                    let (m, n, k) = (m as usize, n as usize, k as usize);
                    // B transposed first, so that each element is a dot product of two
                    // contiguous rows: the same products summed in the same order as the
                    // textbook loop (the same fp32 result), without walking B's columns at
                    // a stride of n floats, which made a run of `dxpu model --workload
                    // training` take 25 to 38 ms from one process to the next, by where the
                    // buffers happened to lie (ten processes; 20.6–23.2 ms now).
                    bt.clear();
                    bt.resize(k * n, 0.0);
                    for p in 0..k {
                        for j in 0..n {
                            bt[j * k + p] = bm[p * n + j];
                        }
                    }
                    cm.clear();
                    cm.resize(m * n, 0.0);
                    // In bands, one per poll (see MATMUL_BAND).
                    self.ch[ch].cp = Cp::Matmul { c, m, n, k, next_row: 0 };
                    return false;
                } else {
                    false
                }
            }
            op::FENCE if a.is_multiple_of(8) => {
                self.dma_write(a, DmaSource::Bytes(&b.to_le_bytes()), 8, up);
                self.regs.fence = b;
                true
            }
            op::INTERRUPT if (a as usize) < self.function.msix().len() => {
                self.regs.int_status |= 1;
                self.function.signal(a as u16, up);
                true
            }
            // A known opcode whose arguments failed its checks.
            known if known <= op::SEM_ACQUIRE => false,
            _ => {
                self.raise_error(err::BAD_OPCODE, up);
                return true;
            }
        };
        self.ch[ch].scratch.trim();
        if !ok {
            self.raise_error(err::BAD_ARGUMENT, up);
        }
        true
    }

    /// The u64 at VRAM offset `at` (in bounds).
    fn vram_u64(&self, at: u64) -> u64 {
        let mut v = [0u8; 8];
        self.vram.read(at, &mut v);
        u64::from_le_bytes(v)
    }

    /// Whether ring slot `slot` is the next command in the prefetch buffer.
    fn prefetched(&self, ch: usize, slot: u64) -> bool {
        slot == self.ch[ch].fetched_next && self.ch[ch].fetched_next < self.ch[ch].fetched_end
    }

    /// Reads the ring entries published after those prefetched while a command executes,
    /// as a GPU's front end reads its command buffer ahead of its engines: commands
    /// published while the device is busy are there when it gets to them, the read's round
    /// trip hidden under the work before them. One ring read at a time, never across the
    /// ring's end (the processor reads from the start when it gets there).
    fn fetch_ahead(&mut self, ch: usize, up: &mut dyn Upstream) {
        if self.ch[ch].ring_read.is_some() || matches!(self.ch[ch].cp, Cp::Idle) {
            return;
        }
        let (size, tail, head) = (self.ch[ch].ring_size, self.ch[ch].ring_tail, self.ch[ch].ring_head);
        if !(2..=4096).contains(&size) || !size.is_power_of_two() || tail >= size {
            return;
        }
        // The window goes on from the command executing (its slot still the head) or the next.
        let from = self.ch[ch].fetched_end;
        if !(self.ch[ch].fetched_next == head || self.ch[ch].fetched_next == head + 1)
            || from >= size
            || from < self.ch[ch].fetched_next
        {
            return;
        }
        let published = match tail {
            t if t >= from => t - from,
            // Wrapped: up to the ring's end. A tail between the head and what was fetched
            // went back; nothing is read ahead of it.
            t if t < head => size - from,
            _ => 0,
        };
        let held = from - self.ch[ch].fetched_next;
        let addr = self.ch[ch].ring_base + from * COMMAND_BYTES;
        let mrrs = self.function.config().max_read_request() as u64;
        let n = published
            .min(PREFETCH)
            .min(2 * PREFETCH - held)
            .min(mrrs / COMMAND_BYTES)
            .min((PAGE - addr % PAGE) / COMMAND_BYTES);
        if n == 0 {
            return;
        }
        // What is still to execute moves to the buffer's start; the read lands after it.
        let keep = ((self.ch[ch].fetched_next - self.ch[ch].fetched_first) * COMMAND_BYTES) as usize;
        let held_bytes = (held * COMMAND_BYTES) as usize;
        self.ch[ch].fetched.copy_within(keep..keep + held_bytes, 0);
        self.ch[ch].fetched_first = self.ch[ch].fetched_next;
        if !self.dma_read(addr, n * COMMAND_BYTES, ReadPurpose::Commands { ch, at: held_bytes as u64 }, up) {
            return;
        }
        self.ch[ch].fetched_end = from + n;
        (self.ch[ch].ring_read, self.ch[ch].ring_read_waited) = (Some(from), false);
        self.command_fetches += 1;
    }

    fn forget_prefetched(&mut self, ch: usize) {
        self.ch[ch].fetched_end = self.ch[ch].fetched_next;
    }

    fn finish_command(&mut self, ch: usize) {
        let c = &mut self.ch[ch];
        c.ring_head = (c.ring_head + 1) % c.ring_size.max(1);
        c.completed += 1;
        self.regs.completed += 1;
        // A copy held to its least duration stays busy until then.
        let now = if c.hold_until_ns > 0 { now_ns() } else { 0 };
        c.cp = if c.hold_until_ns > now {
            Cp::Timed { until_ns: c.hold_until_ns, finishes: false }
        } else {
            Cp::Idle
        };
        c.hold_until_ns = 0;
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

    fn request(&mut self, tlp: &TlpRepr<'_>, up: &mut dyn Upstream) {
        match tlp.body {
            Body::CfgRead { .. } | Body::CfgWrite { .. } => {
                let e = self.function.config_request(tlp, up);
                if e.function_level_reset {
                    self.reset();
                }
            }
            Body::MemRead { address, length_dw, .. } => {
                let target = self.function.memory_target(address.value());
                let len = length_dw as u64 * 4;
                // A register's value is completed from the stack, VRAM from a buffer.
                let register: [u8; 8];
                let vram: Vec<u8>;
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
                        let mut b = vec![0u8; len as usize];
                        self.vram.read(off, &mut b);
                        vram = b;
                        Ok(&vram)
                    }
                    Ok(MemoryTarget::Bar(..)) => Err(CplStatus::UnsupportedRequest),
                };
                match data {
                    Ok(d) => {
                        let mps = TransferSize::from_bytes(self.function.config().max_payload())
                            .unwrap_or(TransferSize::B128);
                        rules::complete_read(tlp, self.function.id(), d, Rcb::B64, mps, |c| up.send(c));
                    }
                    Err(status) => up.send(&rules::completion_without_data(tlp, self.function.id(), status)),
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
                        self.function.msix_write(target, data.len(), v, up);
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
                            self.vram.write(off + start as u64, &data[start..i]);
                        }
                    }
                }
            }
            // IO, AtomicOps and the rest: unsupported. Non-posted ones get UR.
            _ => {
                if tlp.fc_class() == tlp::FcClass::NonPosted {
                    up.send(&rules::completion_without_data(
                        tlp,
                        self.function.id(),
                        CplStatus::UnsupportedRequest,
                    ));
                }
            }
        }
    }

    fn completion(&mut self, tlp: &TlpRepr<'_>, up: &mut dyn Upstream) {
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
            self.raise_error(err::DMA, up);
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
            ReadPurpose::Copy { .. } => self.vram.write(o.next, bytes),
        }
        o.next += n;
        o.remaining -= n;
        if o.remaining == 0 {
            if matches!(o.purpose, ReadPurpose::Commands { .. }) {
                self.ch[ch].ring_read = None;
            }
            self.retire(tag);
        } else {
            self.outstanding[tag as usize] = Some(o);
        }
    }

    fn poll(&mut self, up: &mut dyn Upstream) -> bool {
        if !self.function.bus_master() {
            return false;
        }
        let mut did = false;
        for ch in 0..self.ch.len() {
            // Channel 0 is polled as before; the others only once programmed.
            if ch == 0 || self.ch[ch].ring_size != 0 {
                did |= self.poll_channel(ch, up);
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

    fn reset(&mut self) {
        self.function.reset();
        self.vram.clear();
        self.regs = Regs::default();
        for c in &mut self.ch {
            *c = Channel::new();
        }
        self.outstanding.fill(None);
        self.in_flight = 0;
    }
}

impl SimGpu {
    /// One step of channel `ch`'s command processor; whether it did anything.
    fn poll_channel(&mut self, ch: usize, up: &mut dyn Upstream) -> bool {
        self.fetch_ahead(ch, up);
        match self.ch[ch].cp.clone() {
            Cp::Idle => {
                if self.ch[ch].ring_head == self.ch[ch].ring_tail {
                    return false;
                }
                let size = self.ch[ch].ring_size;
                if !(2..=4096).contains(&size) || !size.is_power_of_two() || self.ch[ch].ring_tail >= size {
                    self.raise_error(err::RING, up);
                    self.ch[ch].ring_head = self.ch[ch].ring_tail;
                    self.forget_prefetched(ch);
                    return true;
                }
                let head = self.ch[ch].ring_head;
                if !self.prefetched(ch, head) {
                    if self.ch[ch].ring_read.is_some() && !self.ch[ch].fetch_failed {
                        // A read of entries forgotten since (the ring was reprogrammed)
                        // still fills the buffer: the next starts once it has landed.
                        return false;
                    }
                    (self.ch[ch].ring_read, self.ch[ch].fetch_failed) = (None, false);
                    // Every published entry up to the ring's end, at most PREFETCH, in one
                    // read that honours Max_Read_Request_Size and does not cross 4 KiB.
                    let addr = self.ch[ch].ring_base + head * COMMAND_BYTES;
                    let published =
                        if self.ch[ch].ring_tail > head { self.ch[ch].ring_tail } else { size } - head;
                    let mrrs = self.function.config().max_read_request() as u64;
                    let to_4k = PAGE - addr % PAGE;
                    let n =
                        published.min(PREFETCH).min(mrrs / COMMAND_BYTES).min(to_4k / COMMAND_BYTES).max(1);
                    self.ch[ch].fetched = [0; FETCHED_BYTES];
                    if !self.dma_read(addr, n * COMMAND_BYTES, ReadPurpose::Commands { ch, at: 0 }, up) {
                        return false;
                    }
                    (self.ch[ch].fetched_first, self.ch[ch].fetched_next, self.ch[ch].fetched_end) =
                        (head, head, head + n);
                    (self.ch[ch].ring_read, self.ch[ch].ring_read_waited) = (Some(head), true);
                    self.command_fetches += 1;
                    self.reads_waited_on += 1;
                }
                self.ch[ch].cp = Cp::Fetching;
                true
            }
            Cp::Fetching => {
                if self.ch[ch].ring_read.is_some_and(|from| self.ch[ch].fetched_next >= from) {
                    if !self.ch[ch].fetch_failed {
                        // The next command is in the ring read still in flight.
                        if !self.ch[ch].ring_read_waited {
                            // Fetched ahead, and not far enough: the link makes it wait.
                            self.reads_waited_on += 1;
                            self.ch[ch].ring_read_waited = true;
                        }
                        return false;
                    }
                    // The read failed: what it fetched is not to be trusted.
                    (self.ch[ch].ring_read, self.ch[ch].fetch_failed) = (None, false);
                    self.forget_prefetched(ch);
                    self.finish_command(ch);
                    return true;
                }
                let head = self.ch[ch].ring_head;
                if !self.prefetched(ch, head) {
                    self.ch[ch].cp = Cp::Idle;
                    return true;
                }
                let at = ((head - self.ch[ch].fetched_first) * COMMAND_BYTES) as usize;
                let mut command = [0u8; COMMAND_BYTES as usize];
                command.copy_from_slice(&self.ch[ch].fetched[at..at + COMMAND_BYTES as usize]);
                if self.ch[ch].copy_reads > 0 && !self.may_start_beside_copies(ch, &command) {
                    return false;
                }
                let c = &self.ch[ch];
                if !c.landing.is_empty() && !Self::starts_beside(&command, c.landing.iter().copied()) {
                    // What the link would make this command wait for.
                    self.reads_waited_on += 1;
                    self.ch[ch].landing.clear();
                }
                if self.ch[ch].copy_reads == 0 {
                    // No copy in flight: a failure of one before is reported and done with.
                    self.ch[ch].failed = false;
                }
                self.ch[ch].command = command;
                self.ch[ch].fetched_next += 1;
                if self.execute(ch, up) {
                    self.finish_command(ch);
                }
                true
            }
            Cp::CopyIn { next_host, end_host, vram_at_next } => {
                if self.ch[ch].failed {
                    if self.ch[ch].copy_reads == 0 {
                        self.ch[ch].failed = false;
                        self.finish_command(ch);
                    }
                    return true;
                }
                let mrrs = TransferSize::from_bytes(self.function.config().max_read_request())
                    .unwrap_or(TransferSize::B128);
                let (mut host, mut vram) = (next_host, vram_at_next);
                let mut issued = false;
                for (a, n) in rules::split(host, end_host - host, mrrs) {
                    if self.in_flight >= MAX_READS_IN_FLIGHT
                        || !self.dma_read(a, n as u64, ReadPurpose::Copy { ch, vram }, up)
                    {
                        break;
                    }
                    host = a + n as u64;
                    vram += n as u64;
                    issued = true;
                }
                if host >= end_host {
                    // Every read issued: the copy's bytes land as its completions come,
                    // and what follows waits for them unless it is a copy in beside them.
                    self.finish_command(ch);
                    return true;
                }
                self.ch[ch].cp = Cp::CopyIn { next_host: host, end_host, vram_at_next: vram };
                issued
            }
            Cp::Matmul { c, m, n, k, next_row } => {
                let end = (next_row + (MATMUL_BAND / (n * k)).max(1)).min(m);
                let Scratch { x: am, t: bt, out: cm, .. } = &mut self.ch[ch].scratch;
                for i in next_row..end {
                    let row = &am[i * k..(i + 1) * k];
                    for (j, col) in bt.chunks_exact(k).enumerate() {
                        cm[i * n + j] = row.iter().zip(col).map(|(a, b)| a * b).sum();
                    }
                }
                if end < m {
                    self.ch[ch].cp = Cp::Matmul { c, m, n, k, next_row: end };
                } else {
                    self.vram.write_f32s(c, cm);
                    self.ch[ch].scratch.trim();
                    self.finish_command(ch);
                }
                true
            }
            Cp::Timed { until_ns, finishes } => {
                if now_ns() < until_ns {
                    return false;
                }
                if finishes {
                    self.finish_command(ch);
                } else {
                    self.ch[ch].cp = Cp::Idle;
                }
                true
            }
            Cp::Acquire { at, value } => {
                if self.vram_u64(at) < value {
                    return false;
                }
                self.finish_command(ch);
                true
            }
            Cp::CopyOut { next_vram, end_vram, host_at_next } => {
                let n = (end_vram - next_vram).min(COPY_OUT_STEP) as usize;
                self.dma_write(host_at_next, DmaSource::Vram(next_vram), n, up);
                let next_vram = next_vram + n as u64;
                if next_vram >= end_vram {
                    self.finish_command(ch);
                } else {
                    self.ch[ch].cp =
                        Cp::CopyOut { next_vram, end_vram, host_at_next: host_at_next + n as u64 };
                }
                true
            }
        }
    }
}
