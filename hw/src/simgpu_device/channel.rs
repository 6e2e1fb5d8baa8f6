//! One command channel and its command processor (docs/simgpu.md, *Channels*): a ring in
//! host memory with its own registers, its commands fetched by DMA ahead of need and executed
//! in order — copies, fills, kernels, timed commands, semaphores, fences — through what the
//! channels share ([`Shared`]: the function, VRAM, the upstream port, the read tags).

use simgpu_abi::{COMMAND_BYTES, chreg, err, op, sem};
use tlp::rules::{self, TransferSize};

use super::shared::{DmaSource, ReadPurpose, Shared, starts_beside};
use crate::device::now_ns;

/// DMA reads the device keeps in flight at most: 1 MiB at a Max_Read_Request_Size of 4 KiB,
/// a link's bandwidth × delay at 10 GB/s and 100 µs. (10-bit tags allow 768 in flight.)
pub const MAX_READS_IN_FLIGHT: usize = 256;
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

/// The command processor's state.
#[derive(Clone, Debug)]
pub(super) enum Cp {
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
pub(super) struct Channel {
    /// Its number: which channel a DMA read of its is for.
    id: usize,
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

/// A kernel's operands and result as floats. Kept between commands, as a GPU keeps its
/// on-chip memory: a MATMUL 256³ allocated 1.75 MiB afresh each time, and a stand-alone copy
/// of it took about 210 page faults a MATMUL on the main thread, 150 on another (none with
/// its buffers kept), its speed depending on the thread's allocator arena. A buffer grown past [`Scratch::KEPT`] floats is given back after the
/// command.
#[derive(Default)]
pub(super) struct Scratch {
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

impl Channel {
    pub(super) fn new(id: usize) -> Channel {
        Channel {
            id,
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

    pub(super) fn id(&self) -> usize {
        self.id
    }

    /// Whether its ring was programmed (channel 0 is polled either way).
    pub(super) fn programmed(&self) -> bool {
        self.ring_size != 0
    }

    /// When a timed command or a copy's least duration ends, ns on the device's clock.
    pub(super) fn wake_at_ns(&self) -> Option<u64> {
        match self.cp {
            Cp::Timed { until_ns, .. } => Some(until_ns),
            _ => None,
        }
    }

    /// Its register at offset `r` in its block.
    pub(super) fn reg_read(&self, r: u64) -> u64 {
        match r {
            chreg::RING_BASE => self.ring_base,
            chreg::RING_SIZE => self.ring_size,
            chreg::RING_HEAD => self.ring_head,
            chreg::RING_TAIL => self.ring_tail,
            chreg::COMPLETED => self.completed,
            _ => 0,
        }
    }

    /// A write of `value` to its register at offset `r`.
    pub(super) fn reg_write(&mut self, r: u64, value: u64) {
        match r {
            chreg::RING_BASE => {
                self.ring_base = value & !(COMMAND_BYTES - 1);
                self.forget_prefetched();
            }
            chreg::RING_SIZE => {
                self.ring_size = value;
                self.forget_prefetched();
            }
            chreg::RING_TAIL => self.ring_tail = value,
            // The doorbell only wakes the processor; `poll` reads RING_TAIL.
            _ => {}
        }
    }

    /// Ring entries of one of its reads landed: `bytes` at `at` in the prefetch buffer.
    pub(super) fn commands_landed(&mut self, at: usize, bytes: &[u8]) {
        let at = at.min(self.fetched.len());
        let end = (at + bytes.len()).min(self.fetched.len());
        self.fetched[at..end].copy_from_slice(&bytes[..end - at]);
    }

    /// Its ring read from `slot` has landed whole.
    pub(super) fn ring_read_done(&mut self, slot: u64) {
        if self.ring_read == Some(slot) {
            // The second read, if any, is now the one the processor may wait for.
            (self.ring_read, self.ring_read_waited) = (self.ring_read_next.take(), false);
        } else if self.ring_read_next == Some(slot) {
            self.ring_read_next = None;
        }
    }

    /// One of its reads, for `purpose`, failed.
    pub(super) fn read_failed(&mut self, purpose: ReadPurpose) {
        match purpose {
            ReadPurpose::Commands { .. } => self.fetch_failed = true,
            ReadPurpose::Copy { .. } => self.failed = true,
        }
    }

    /// One of its host→VRAM copies' reads is no longer in flight.
    pub(super) fn copy_read_retired(&mut self) {
        self.copy_reads -= 1;
    }

    pub(super) fn busy(&self) -> bool {
        self.ring_head != self.ring_tail || !matches!(self.cp, Cp::Idle)
    }

    fn arg(&self, i: usize) -> u64 {
        let at = 8 + 8 * i;
        u64::from_le_bytes(self.command[at..at + 8].try_into().unwrap_or([0; 8]))
    }

    /// Runs the fetched command. Returns true when it is finished (else a copy continues).
    pub(super) fn execute(&mut self, dev: &mut Shared) -> bool {
        let opcode = u32::from_le_bytes(self.command[0..4].try_into().unwrap_or([0; 4]));
        let (a, b, c, d) = (self.arg(0), self.arg(1), self.arg(2), self.arg(3));
        if !matches!(opcode, op::SEM_RELEASE | op::SEM_ACQUIRE) {
            self.work_started_ns = now_ns();
        }
        if matches!(opcode, op::COPY_H2V | op::COPY_V2H) && d > 0 {
            // Held to the traced copy engine's time: busy until then once its bytes went.
            self.hold_until_ns = self.work_started_ns.saturating_add(d.min(MAX_TIMED_NS));
        }
        let ok = match opcode {
            op::NOP => true,
            op::TIMED if a <= MAX_TIMED_NS => {
                if a == 0 {
                    true
                } else {
                    let until_ns = self.work_started_ns.saturating_add(a);
                    self.cp = Cp::Timed { until_ns, finishes: true };
                    return false;
                }
            }
            op::SEM_RELEASE
                if a.is_multiple_of(8)
                    && c & !(sem::VRAM | sem::TIMESTAMPS) == 0
                    && (c & sem::VRAM == 0 || dev.vram.in_bounds(a, 24)) =>
            {
                let mut w = [0u8; 24];
                w[0..8].copy_from_slice(&b.to_le_bytes());
                w[8..16].copy_from_slice(&self.work_started_ns.to_le_bytes());
                w[16..24].copy_from_slice(&now_ns().to_le_bytes());
                let n = if c & sem::TIMESTAMPS != 0 { 24 } else { 8 };
                if c & sem::VRAM != 0 {
                    dev.write_vram(a, &w[..n]);
                } else {
                    dev.dma_write(a, DmaSource::Bytes(&w[..n]), n);
                }
                true
            }
            op::SEM_ACQUIRE if a.is_multiple_of(8) && dev.vram.in_bounds(a, 8) => {
                if dev.vram_u64(a) >= b {
                    true
                } else {
                    self.cp = Cp::Acquire { at: a, value: b };
                    return false;
                }
            }
            op::COPY_H2V if c > 0 && dev.vram.in_bounds(b, c) => {
                self.cp = Cp::CopyIn { next_host: a, end_host: a.saturating_add(c), vram_at_next: b };
                if self.landing.len() >= RING_LANDING {
                    // Too many to keep apart: count the wait a link might impose.
                    dev.reads_waited_on += 1;
                    self.landing.clear();
                }
                self.landing.push((b, b + c));
                return false;
            }
            op::COPY_V2H if c > 0 && dev.vram.in_bounds(a, c) => {
                // In steps, one per poll (see COPY_OUT_STEP).
                self.cp = Cp::CopyOut { next_vram: a, end_vram: a + c, host_at_next: b };
                return false;
            }
            op::COPY_V2V | op::FILL | op::VADD | op::SAXPY | op::REDUCE_SUM | op::MATMUL => {
                match self.vram_work(dev, opcode, [a, b, c, d]) {
                    Some(ok) => ok,
                    None => return false,
                }
            }
            op::FENCE if a.is_multiple_of(8) => {
                dev.dma_write(a, DmaSource::Bytes(&b.to_le_bytes()), 8);
                dev.regs.fence = b;
                true
            }
            op::INTERRUPT if (a as usize) < dev.function.msix().len() => {
                dev.regs.int_status |= 1;
                dev.function.signal(a as u16, &mut dev.out);
                true
            }
            // A known opcode whose arguments failed its checks.
            known if known <= op::SEM_ACQUIRE => false,
            _ => {
                dev.raise_error(err::BAD_OPCODE);
                return true;
            }
        };
        self.scratch.trim();
        if !ok {
            dev.raise_error(err::BAD_ARGUMENT);
        }
        true
    }

    /// A command that works on VRAM alone — a copy inside it, a fill, a kernel — run, or
    /// started (`None`: a MATMUL goes on in bands over the next polls); `Some(false)` where
    /// its arguments fail their checks.
    fn vram_work(&mut self, dev: &mut Shared, opcode: u32, [a, b, c, d]: [u64; 4]) -> Option<bool> {
        let f32_range = |off: u64, n: u64| {
            n > 0 && n <= 1 << 24 && off.is_multiple_of(4) && dev.vram.in_bounds(off, n * 4)
        };
        Some(match opcode {
            op::COPY_V2V if c > 0 && dev.vram.in_bounds(a, c) && dev.vram.in_bounds(b, c) => {
                let mut buf = vec![0u8; c.min(CHUNK) as usize];
                // Overlapping ranges copy as memmove does: backwards when the destination is above.
                let chunks = c.div_ceil(CHUNK);
                for i in 0..chunks {
                    let off = if b > a { (chunks - 1 - i) * CHUNK } else { i * CHUNK };
                    let n = (c - off).min(CHUNK) as usize;
                    dev.vram.read(a + off, &mut buf[..n]);
                    dev.write_vram(b + off, &buf[..n]);
                }
                true
            }
            op::FILL if b > 0 && dev.vram.in_bounds(a, b) => {
                let pat = (c as u32).to_le_bytes();
                let buf: Vec<u8> = (0..b.min(CHUNK) as usize).map(|i| pat[i % 4]).collect();
                let mut done = 0;
                while done < b {
                    // CHUNK is a multiple of 4, so the pattern stays in phase.
                    let n = (b - done).min(CHUNK) as usize;
                    dev.write_vram(a + done, &buf[..n]);
                    done += n as u64;
                }
                true
            }
            op::VADD if f32_range(a, d) && f32_range(b, d) && f32_range(c, d) => {
                let Scratch { x, y, .. } = &mut self.scratch;
                dev.vram.read_f32s_into(a, d, x);
                dev.vram.read_f32s_into(b, d, y);
                x.iter_mut().zip(&*y).for_each(|(p, q)| *p += q);
                dev.out.before_memory_write(c, d * 4, &dev.vram);
                dev.vram.write_f32s(c, x);
                true
            }
            op::SAXPY if f32_range(a, c) && f32_range(b, c) => {
                let alpha = f32::from_bits(d as u32);
                let Scratch { x, y, .. } = &mut self.scratch;
                dev.vram.read_f32s_into(a, c, x);
                dev.vram.read_f32s_into(b, c, y);
                y.iter_mut().zip(&*x).for_each(|(q, p)| *q += alpha * p);
                dev.out.before_memory_write(b, c * 4, &dev.vram);
                dev.vram.write_f32s(b, y);
                true
            }
            op::REDUCE_SUM if f32_range(a, b) && f32_range(c, 1) => {
                let x = &mut self.scratch.x;
                dev.vram.read_f32s_into(a, b, x);
                let sum: f32 = x.iter().sum();
                dev.out.before_memory_write(c, 4, &dev.vram);
                dev.vram.write_f32s(c, &[sum]);
                true
            }
            op::MATMUL => {
                let (m, n, k) = (d & 0xffff, (d >> 16) & 0xffff, (d >> 32) & 0xffff);
                let dims_ok = (1..=256).contains(&m) && (1..=256).contains(&n) && (1..=256).contains(&k);
                if dims_ok && f32_range(a, m * k) && f32_range(b, k * n) && f32_range(c, m * n) {
                    let Scratch { x: am, y: bm, t: bt, out: cm } = &mut self.scratch;
                    dev.vram.read_f32s_into(a, m * k, am);
                    dev.vram.read_f32s_into(b, k * n, bm);
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
                    self.cp = Cp::Matmul { c, m, n, k, next_row: 0 };
                    return None;
                } else {
                    false
                }
            }
            _ => false,
        })
    }

    /// Whether ring slot `slot` is the next command in the prefetch buffer.
    fn prefetched(&self, slot: u64) -> bool {
        slot == self.fetched_next && self.fetched_next < self.fetched_end
    }

    /// Reads the ring entries published after those prefetched while a command executes,
    /// as a GPU's front end reads its command buffer ahead of its engines: commands
    /// published while the device is busy are there when it gets to them, the read's round
    /// trip hidden under the work before them. Two ring reads in flight at most, never
    /// across the ring's end (the processor reads from the start when it gets there).
    pub(super) fn fetch_ahead(&mut self, dev: &mut Shared) {
        // A second read may go while one is in flight (not behind a failed one).
        let second = self.ring_read.is_some();
        if self.ring_read_next.is_some() || (second && self.fetch_failed) || matches!(self.cp, Cp::Idle) {
            return;
        }
        let (size, tail, head) = (self.ring_size, self.ring_tail, self.ring_head);
        if !(2..=4096).contains(&size) || !size.is_power_of_two() || tail >= size {
            return;
        }
        // The window goes on from the command executing (its slot still the head) or the next.
        let from = self.fetched_end;
        if !(self.fetched_next == head || self.fetched_next == head + 1)
            || from >= size
            || from < self.fetched_next
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
        if self.ring_read.is_some_and(|first| from <= first) {
            // The read in flight was forgotten (the ring moved): nothing lands beside it.
            return;
        }
        let held = from - self.fetched_next;
        // Beside a read in flight, the buffer stays as it is (that read lands where it was
        // told): the second lands after it, in the room left.
        let used = if second { from - self.fetched_first } else { held };
        let addr = self.ring_base + from * COMMAND_BYTES;
        let mrrs = dev.function.config().max_read_request() as u64;
        let n = published
            .min(PREFETCH)
            .min((2 * PREFETCH).saturating_sub(used))
            .min(mrrs / COMMAND_BYTES)
            .min((PAGE - addr % PAGE) / COMMAND_BYTES);
        if n == 0 {
            return;
        }
        if !second {
            // What is still to execute moves to the buffer's start; the read lands after it.
            let keep = ((self.fetched_next - self.fetched_first) * COMMAND_BYTES) as usize;
            let held_bytes = (held * COMMAND_BYTES) as usize;
            self.fetched.copy_within(keep..keep + held_bytes, 0);
            self.fetched_first = self.fetched_next;
        }
        let at = (from - self.fetched_first) * COMMAND_BYTES;
        if !dev.dma_read(addr, n * COMMAND_BYTES, ReadPurpose::Commands { ch: self.id, at, slot: from }) {
            return;
        }
        self.fetched_end = from + n;
        if second {
            self.ring_read_next = Some(from);
        } else {
            (self.ring_read, self.ring_read_waited) = (Some(from), false);
        }
        dev.command_fetches += 1;
    }

    pub(super) fn forget_prefetched(&mut self) {
        self.fetched_end = self.fetched_next;
    }

    pub(super) fn finish_command(&mut self, dev: &mut Shared) {
        let c = &mut *self;
        c.ring_head = (c.ring_head + 1) % c.ring_size.max(1);
        c.completed += 1;
        dev.regs.completed += 1;
        // A copy held to its least duration stays busy until then.
        let now = if c.hold_until_ns > 0 { now_ns() } else { 0 };
        c.cp = if c.hold_until_ns > now {
            Cp::Timed { until_ns: c.hold_until_ns, finishes: false }
        } else {
            Cp::Idle
        };
        c.hold_until_ns = 0;
    }

    /// One step of channel `ch`'s command processor; whether it did anything.
    pub(super) fn poll(&mut self, dev: &mut Shared) -> bool {
        self.fetch_ahead(dev);
        match self.cp.clone() {
            Cp::Idle => self.start_fetch(dev),
            Cp::Fetching => self.next_command(dev),
            Cp::CopyIn { next_host, end_host, vram_at_next } => {
                self.copy_in(dev, next_host, end_host, vram_at_next)
            }
            Cp::Matmul { c, m, n, k, next_row } => self.matmul_band(dev, c, (m, n, k), next_row),
            Cp::Timed { until_ns, finishes } => {
                if now_ns() < until_ns {
                    return false;
                }
                if finishes {
                    self.finish_command(dev);
                } else {
                    self.cp = Cp::Idle;
                }
                true
            }
            Cp::Acquire { at, value } => {
                if dev.vram_u64(at) < value {
                    return false;
                }
                self.finish_command(dev);
                true
            }
            Cp::CopyOut { next_vram, end_vram, host_at_next } => {
                let n = (end_vram - next_vram).min(COPY_OUT_STEP) as usize;
                dev.dma_write(host_at_next, DmaSource::Vram(next_vram), n);
                dev.regs.copied_to_host += n as u64;
                let next_vram = next_vram + n as u64;
                if next_vram >= end_vram {
                    self.finish_command(dev);
                } else {
                    self.cp = Cp::CopyOut { next_vram, end_vram, host_at_next: host_at_next + n as u64 };
                }
                true
            }
        }
    }

    /// An idle channel with published entries: they are in the prefetch buffer, or one read
    /// of them goes (the processor waits for it in `Fetching`).
    fn start_fetch(&mut self, dev: &mut Shared) -> bool {
        if self.ring_head == self.ring_tail {
            return false;
        }
        let size = self.ring_size;
        if !(2..=4096).contains(&size) || !size.is_power_of_two() || self.ring_tail >= size {
            dev.raise_error(err::RING);
            self.ring_head = self.ring_tail;
            self.forget_prefetched();
            return true;
        }
        let head = self.ring_head;
        if !self.prefetched(head) {
            if self.ring_read_next.is_some() || (self.ring_read.is_some() && !self.fetch_failed) {
                // A read of entries forgotten since (the ring was reprogrammed, or
                // a read before it failed) still fills the buffer: the next starts
                // once it has landed.
                return false;
            }
            (self.ring_read, self.fetch_failed) = (None, false);
            // Every published entry up to the ring's end, at most PREFETCH, in one
            // read that honours Max_Read_Request_Size and does not cross 4 KiB.
            let addr = self.ring_base + head * COMMAND_BYTES;
            let published = if self.ring_tail > head { self.ring_tail } else { size } - head;
            let mrrs = dev.function.config().max_read_request() as u64;
            let to_4k = PAGE - addr % PAGE;
            let n = published.min(PREFETCH).min(mrrs / COMMAND_BYTES).min(to_4k / COMMAND_BYTES).max(1);
            self.fetched = [0; FETCHED_BYTES];
            if !dev.dma_read(
                addr,
                n * COMMAND_BYTES,
                ReadPurpose::Commands { ch: self.id, at: 0, slot: head },
            ) {
                return false;
            }
            (self.fetched_first, self.fetched_next, self.fetched_end) = (head, head, head + n);
            (self.ring_read, self.ring_read_waited) = (Some(head), true);
            dev.command_fetches += 1;
            dev.reads_waited_on += 1;
        }
        self.cp = Cp::Fetching;
        true
    }

    /// The next command from the prefetch buffer, once its read has landed, executed.
    fn next_command(&mut self, dev: &mut Shared) -> bool {
        if self.ring_read.is_some_and(|from| self.fetched_next >= from) {
            if !self.fetch_failed {
                // The next command is in the ring read still in flight.
                if !self.ring_read_waited {
                    // Fetched ahead, and not far enough: the link makes it wait.
                    dev.reads_waited_on += 1;
                    self.ring_read_waited = true;
                }
                return false;
            }
            // The read failed: what it fetched is not to be trusted.
            (self.ring_read, self.fetch_failed) = (None, false);
            self.forget_prefetched();
            self.finish_command(dev);
            return true;
        }
        let head = self.ring_head;
        if !self.prefetched(head) {
            self.cp = Cp::Idle;
            return true;
        }
        let at = ((head - self.fetched_first) * COMMAND_BYTES) as usize;
        let mut command = [0u8; COMMAND_BYTES as usize];
        command.copy_from_slice(&self.fetched[at..at + COMMAND_BYTES as usize]);
        if self.copy_reads > 0 && !dev.may_start_beside_copies(self.id, &command) {
            return false;
        }
        let c = &*self;
        if !c.landing.is_empty() && !starts_beside(&command, c.landing.iter().copied()) {
            // What the link would make this command wait for.
            dev.reads_waited_on += 1;
            self.landing.clear();
        }
        if self.copy_reads == 0 {
            // No copy in flight: a failure of one before is reported and done with.
            self.failed = false;
        }
        self.command = command;
        self.fetched_next += 1;
        if self.execute(dev) {
            self.finish_command(dev);
        }
        true
    }

    /// A host→VRAM copy's next reads, as many as may be in flight.
    fn copy_in(&mut self, dev: &mut Shared, next_host: u64, end_host: u64, vram_at_next: u64) -> bool {
        if self.failed {
            if self.copy_reads == 0 {
                self.failed = false;
                self.finish_command(dev);
            }
            return true;
        }
        let mrrs =
            TransferSize::from_bytes(dev.function.config().max_read_request()).unwrap_or(TransferSize::B128);
        let (mut host, mut vram) = (next_host, vram_at_next);
        let mut issued = false;
        for (a, n) in rules::split(host, end_host - host, mrrs) {
            if dev.in_flight >= MAX_READS_IN_FLIGHT
                || !dev.dma_read(a, n as u64, ReadPurpose::Copy { ch: self.id, vram })
            {
                break;
            }
            self.copy_reads += 1;
            host = a + n as u64;
            vram += n as u64;
            issued = true;
        }
        if host >= end_host {
            // Every read issued: the copy's bytes land as its completions come,
            // and what follows waits for them unless it is a copy in beside them.
            self.finish_command(dev);
            return true;
        }
        self.cp = Cp::CopyIn { next_host: host, end_host, vram_at_next: vram };
        issued
    }

    /// A MATMUL's next band of rows.
    fn matmul_band(
        &mut self,
        dev: &mut Shared,
        c: u64,
        (m, n, k): (usize, usize, usize),
        next_row: usize,
    ) -> bool {
        let end = (next_row + (MATMUL_BAND / (n * k)).max(1)).min(m);
        let Scratch { x: am, t: bt, out: cm, .. } = &mut self.scratch;
        for i in next_row..end {
            let row = &am[i * k..(i + 1) * k];
            for (j, col) in bt.chunks_exact(k).enumerate() {
                cm[i * n + j] = row.iter().zip(col).map(|(a, b)| a * b).sum();
            }
        }
        if end < m {
            self.cp = Cp::Matmul { c, m, n, k, next_row: end };
        } else {
            dev.out.before_memory_write(c, cm.len() as u64 * 4, &dev.vram);
            dev.vram.write_f32s(c, cm);
            self.scratch.trim();
            self.finish_command(dev);
        }
        true
    }
}
