//! The command processor: each channel's commands fetched from its ring by DMA, ahead of
//! need, and executed — copies, fills, kernels, timed commands, semaphores, fences.

use simgpu_abi::{COMMAND_BYTES, err, op, sem};
use tlp::rules::{self, TransferSize};

use super::{
    CHUNK, COPY_OUT_STEP, Cp, DmaSource, FETCHED_BYTES, MATMUL_BAND, MAX_READS_IN_FLIGHT, MAX_TIMED_NS, PAGE,
    PREFETCH, RING_LANDING, ReadPurpose, Scratch, SimGpu,
};
use crate::device::now_ns;

impl SimGpu {
    pub(super) fn arg(&self, ch: usize, i: usize) -> u64 {
        let at = 8 + 8 * i;
        u64::from_le_bytes(self.ch[ch].command[at..at + 8].try_into().unwrap_or([0; 8]))
    }

    /// Runs the fetched command. Returns true when it is finished (else a copy continues).
    pub(super) fn execute(&mut self, ch: usize) -> bool {
        let opcode = u32::from_le_bytes(self.ch[ch].command[0..4].try_into().unwrap_or([0; 4]));
        let (a, b, c, d) = (self.arg(ch, 0), self.arg(ch, 1), self.arg(ch, 2), self.arg(ch, 3));
        if !matches!(opcode, op::SEM_RELEASE | op::SEM_ACQUIRE) {
            self.ch[ch].work_started_ns = now_ns();
        }
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
                    self.write_vram(a, &w[..n]);
                } else {
                    self.dma_write(a, DmaSource::Bytes(&w[..n]), n);
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
            op::COPY_V2V | op::FILL | op::VADD | op::SAXPY | op::REDUCE_SUM | op::MATMUL => {
                match self.vram_work(ch, opcode, [a, b, c, d]) {
                    Some(ok) => ok,
                    None => return false,
                }
            }
            op::FENCE if a.is_multiple_of(8) => {
                self.dma_write(a, DmaSource::Bytes(&b.to_le_bytes()), 8);
                self.regs.fence = b;
                true
            }
            op::INTERRUPT if (a as usize) < self.function.msix().len() => {
                self.regs.int_status |= 1;
                self.function.signal(a as u16, &mut self.out);
                true
            }
            // A known opcode whose arguments failed its checks.
            known if known <= op::SEM_ACQUIRE => false,
            _ => {
                self.raise_error(err::BAD_OPCODE);
                return true;
            }
        };
        self.ch[ch].scratch.trim();
        if !ok {
            self.raise_error(err::BAD_ARGUMENT);
        }
        true
    }

    /// A command that works on VRAM alone — a copy inside it, a fill, a kernel — run, or
    /// started (`None`: a MATMUL goes on in bands over the next polls); `Some(false)` where
    /// its arguments fail their checks.
    fn vram_work(&mut self, ch: usize, opcode: u32, [a, b, c, d]: [u64; 4]) -> Option<bool> {
        let f32_range = |off: u64, n: u64| {
            n > 0 && n <= 1 << 24 && off.is_multiple_of(4) && self.vram.in_bounds(off, n * 4)
        };
        Some(match opcode {
            op::COPY_V2V if c > 0 && self.vram.in_bounds(a, c) && self.vram.in_bounds(b, c) => {
                let mut buf = vec![0u8; c.min(CHUNK) as usize];
                // Overlapping ranges copy as memmove does: backwards when the destination is above.
                let chunks: Vec<u64> = (0..c.div_ceil(CHUNK)).map(|i| i * CHUNK).collect();
                let order: Box<dyn Iterator<Item = &u64>> =
                    if b > a { Box::new(chunks.iter().rev()) } else { Box::new(chunks.iter()) };
                for &off in order {
                    let n = (c - off).min(CHUNK) as usize;
                    self.vram.read(a + off, &mut buf[..n]);
                    self.write_vram(b + off, &buf[..n]);
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
                    self.write_vram(a + done, &buf[..n]);
                    done += n as u64;
                }
                true
            }
            op::VADD if f32_range(a, d) && f32_range(b, d) && f32_range(c, d) => {
                let Scratch { x, y, .. } = &mut self.ch[ch].scratch;
                self.vram.read_f32s_into(a, d, x);
                self.vram.read_f32s_into(b, d, y);
                x.iter_mut().zip(&*y).for_each(|(p, q)| *p += q);
                self.out.before_memory_write(c, d * 4, &self.vram);
                self.vram.write_f32s(c, x);
                true
            }
            op::SAXPY if f32_range(a, c) && f32_range(b, c) => {
                let alpha = f32::from_bits(d as u32);
                let Scratch { x, y, .. } = &mut self.ch[ch].scratch;
                self.vram.read_f32s_into(a, c, x);
                self.vram.read_f32s_into(b, c, y);
                y.iter_mut().zip(&*x).for_each(|(q, p)| *q += alpha * p);
                self.out.before_memory_write(b, c * 4, &self.vram);
                self.vram.write_f32s(b, y);
                true
            }
            op::REDUCE_SUM if f32_range(a, b) && f32_range(c, 1) => {
                let x = &mut self.ch[ch].scratch.x;
                self.vram.read_f32s_into(a, b, x);
                let sum: f32 = x.iter().sum();
                self.out.before_memory_write(c, 4, &self.vram);
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
                    return None;
                } else {
                    false
                }
            }
            _ => false,
        })
    }

    /// The u64 at VRAM offset `at` (in bounds).
    pub(super) fn vram_u64(&self, at: u64) -> u64 {
        let mut v = [0u8; 8];
        self.vram.read(at, &mut v);
        u64::from_le_bytes(v)
    }

    /// Whether ring slot `slot` is the next command in the prefetch buffer.
    pub(super) fn prefetched(&self, ch: usize, slot: u64) -> bool {
        slot == self.ch[ch].fetched_next && self.ch[ch].fetched_next < self.ch[ch].fetched_end
    }

    /// Reads the ring entries published after those prefetched while a command executes,
    /// as a GPU's front end reads its command buffer ahead of its engines: commands
    /// published while the device is busy are there when it gets to them, the read's round
    /// trip hidden under the work before them. Two ring reads in flight at most, never
    /// across the ring's end (the processor reads from the start when it gets there).
    pub(super) fn fetch_ahead(&mut self, ch: usize) {
        // A second read may go while one is in flight (not behind a failed one).
        let second = self.ch[ch].ring_read.is_some();
        if self.ch[ch].ring_read_next.is_some()
            || (second && self.ch[ch].fetch_failed)
            || matches!(self.ch[ch].cp, Cp::Idle)
        {
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
        if self.ch[ch].ring_read.is_some_and(|first| from <= first) {
            // The read in flight was forgotten (the ring moved): nothing lands beside it.
            return;
        }
        let held = from - self.ch[ch].fetched_next;
        // Beside a read in flight, the buffer stays as it is (that read lands where it was
        // told): the second lands after it, in the room left.
        let used = if second { from - self.ch[ch].fetched_first } else { held };
        let addr = self.ch[ch].ring_base + from * COMMAND_BYTES;
        let mrrs = self.function.config().max_read_request() as u64;
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
            let keep = ((self.ch[ch].fetched_next - self.ch[ch].fetched_first) * COMMAND_BYTES) as usize;
            let held_bytes = (held * COMMAND_BYTES) as usize;
            self.ch[ch].fetched.copy_within(keep..keep + held_bytes, 0);
            self.ch[ch].fetched_first = self.ch[ch].fetched_next;
        }
        let at = (from - self.ch[ch].fetched_first) * COMMAND_BYTES;
        if !self.dma_read(addr, n * COMMAND_BYTES, ReadPurpose::Commands { ch, at, slot: from }) {
            return;
        }
        self.ch[ch].fetched_end = from + n;
        if second {
            self.ch[ch].ring_read_next = Some(from);
        } else {
            (self.ch[ch].ring_read, self.ch[ch].ring_read_waited) = (Some(from), false);
        }
        self.command_fetches += 1;
    }

    pub(super) fn forget_prefetched(&mut self, ch: usize) {
        self.ch[ch].fetched_end = self.ch[ch].fetched_next;
    }

    pub(super) fn finish_command(&mut self, ch: usize) {
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

    /// One step of channel `ch`'s command processor; whether it did anything.
    pub(super) fn poll_channel(&mut self, ch: usize) -> bool {
        self.fetch_ahead(ch);
        match self.ch[ch].cp.clone() {
            Cp::Idle => self.start_fetch(ch),
            Cp::Fetching => self.next_command(ch),
            Cp::CopyIn { next_host, end_host, vram_at_next } => {
                self.copy_in(ch, next_host, end_host, vram_at_next)
            }
            Cp::Matmul { c, m, n, k, next_row } => self.matmul_band(ch, c, (m, n, k), next_row),
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
                self.dma_write(host_at_next, DmaSource::Vram(next_vram), n);
                self.regs.copied_to_host += n as u64;
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

    /// An idle channel with published entries: they are in the prefetch buffer, or one read
    /// of them goes (the processor waits for it in `Fetching`).
    fn start_fetch(&mut self, ch: usize) -> bool {
        if self.ch[ch].ring_head == self.ch[ch].ring_tail {
            return false;
        }
        let size = self.ch[ch].ring_size;
        if !(2..=4096).contains(&size) || !size.is_power_of_two() || self.ch[ch].ring_tail >= size {
            self.raise_error(err::RING);
            self.ch[ch].ring_head = self.ch[ch].ring_tail;
            self.forget_prefetched(ch);
            return true;
        }
        let head = self.ch[ch].ring_head;
        if !self.prefetched(ch, head) {
            if self.ch[ch].ring_read_next.is_some()
                || (self.ch[ch].ring_read.is_some() && !self.ch[ch].fetch_failed)
            {
                // A read of entries forgotten since (the ring was reprogrammed, or
                // a read before it failed) still fills the buffer: the next starts
                // once it has landed.
                return false;
            }
            (self.ch[ch].ring_read, self.ch[ch].fetch_failed) = (None, false);
            // Every published entry up to the ring's end, at most PREFETCH, in one
            // read that honours Max_Read_Request_Size and does not cross 4 KiB.
            let addr = self.ch[ch].ring_base + head * COMMAND_BYTES;
            let published = if self.ch[ch].ring_tail > head { self.ch[ch].ring_tail } else { size } - head;
            let mrrs = self.function.config().max_read_request() as u64;
            let to_4k = PAGE - addr % PAGE;
            let n = published.min(PREFETCH).min(mrrs / COMMAND_BYTES).min(to_4k / COMMAND_BYTES).max(1);
            self.ch[ch].fetched = [0; FETCHED_BYTES];
            if !self.dma_read(addr, n * COMMAND_BYTES, ReadPurpose::Commands { ch, at: 0, slot: head }) {
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

    /// The next command from the prefetch buffer, once its read has landed, executed.
    fn next_command(&mut self, ch: usize) -> bool {
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
        if self.execute(ch) {
            self.finish_command(ch);
        }
        true
    }

    /// A host→VRAM copy's next reads, as many as may be in flight.
    fn copy_in(&mut self, ch: usize, next_host: u64, end_host: u64, vram_at_next: u64) -> bool {
        if self.ch[ch].failed {
            if self.ch[ch].copy_reads == 0 {
                self.ch[ch].failed = false;
                self.finish_command(ch);
            }
            return true;
        }
        let mrrs =
            TransferSize::from_bytes(self.function.config().max_read_request()).unwrap_or(TransferSize::B128);
        let (mut host, mut vram) = (next_host, vram_at_next);
        let mut issued = false;
        for (a, n) in rules::split(host, end_host - host, mrrs) {
            if self.in_flight >= MAX_READS_IN_FLIGHT
                || !self.dma_read(a, n as u64, ReadPurpose::Copy { ch, vram })
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

    /// A MATMUL's next band of rows.
    fn matmul_band(&mut self, ch: usize, c: u64, (m, n, k): (usize, usize, usize), next_row: usize) -> bool {
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
            self.out.before_memory_write(c, cm.len() as u64 * 4, &self.vram);
            self.vram.write_f32s(c, cm);
            self.ch[ch].scratch.trim();
            self.finish_command(ch);
        }
        true
    }
}
