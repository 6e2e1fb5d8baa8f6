//! What the simulated GPU's channels share ([`Shared`]): the function, VRAM, the upstream
//! port, the global registers, and the device's DMA — reads in flight by tag, writes split
//! at Max_Payload_Size and 4 KiB, completions for reads of VRAM.

use tlp::rules::{self, DwSpan, Rcb, TransferSize};
use tlp::{Address, Body, Request, Tag, TlpRepr};

use super::vram::Vram;
use simgpu_abi::{ERROR_VECTOR, op};

use crate::function::Function;
use crate::upstream::Outbox;

/// Tags the device uses: 10-bit tags (PCIe 6.0 §2.2.6.2), the values 0..1024.
pub(super) const TAGS: usize = 1024;

/// What an outstanding DMA read is for.
#[derive(Clone, Copy, Debug)]
pub(super) enum ReadPurpose {
    /// Ring entries of channel `ch` from ring slot `slot` on, into its prefetch buffer from
    /// byte `at` on.
    Commands { ch: usize, at: u64, slot: u64 },
    /// Part of a host→VRAM copy of channel `ch`: bytes land at this VRAM offset.
    Copy { ch: usize, vram: u64 },
}

impl ReadPurpose {
    pub(super) fn channel(self) -> usize {
        match self {
            ReadPurpose::Commands { ch, .. } | ReadPurpose::Copy { ch, .. } => ch,
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Outstanding {
    pub(super) purpose: ReadPurpose,
    /// Bytes of the request not yet received.
    pub(super) remaining: u64,
    /// Where the next received byte goes (prefetch buffer offset or VRAM offset).
    pub(super) next: u64,
}

/// Where the bytes of a DMA write come from.
#[derive(Clone, Copy)]
pub(super) enum DmaSource<'a> {
    /// These bytes.
    Bytes(&'a [u8]),
    /// VRAM from this offset on.
    Vram(u64),
}

#[derive(Clone, Copy, Default)]
pub(super) struct Regs {
    pub(super) error: u64,
    pub(super) int_status: u64,
    pub(super) fence: u64,
    pub(super) completed: u64,
    /// Bytes the copy engines landed in VRAM and sent to host memory (`reg::COPIED_TO_*`).
    pub(super) copied_to_vram: u64,
    pub(super) copied_to_host: u64,
}

/// What the channels share: the PCIe function (config space, MSI-X), VRAM, the upstream port,
/// the global registers, and the DMA reads in flight by tag.
pub(super) struct Shared {
    pub(super) function: Function,
    pub(super) vram: Vram,
    /// What it sent that the platform has not taken yet ([`crate::Device::upstream`]).
    pub(super) out: Outbox,
    pub(super) regs: Regs,
    /// DMA reads in flight, by tag.
    pub(super) outstanding: Box<[Option<Outstanding>; TAGS]>,
    /// How many of `outstanding` are in flight.
    pub(super) in_flight: usize,
    next_tag: u16,
    /// The most DMA reads the device had in flight at once.
    pub(super) max_reads_in_flight: usize,
    /// DMA reads that fetched ring entries.
    pub(super) command_fetches: u64,
    /// The times a command processor needed bytes it had read: each ring fetch, and each
    /// command that had to wait for copies' bytes to land ([`crate::Device::reads_waited_on`]).
    pub(super) reads_waited_on: u64,
}

impl Shared {
    pub(super) fn new(function: Function, vram: Vram) -> Shared {
        Shared {
            function,
            vram,
            out: Outbox::default(),
            regs: Regs::default(),
            outstanding: Box::new([None; TAGS]),
            in_flight: 0,
            next_tag: 0,
            max_reads_in_flight: 0,
            command_fetches: 0,
            reads_waited_on: 0,
        }
    }

    /// The u64 at VRAM offset `at` (in bounds).
    pub(super) fn vram_u64(&self, at: u64) -> u64 {
        let mut v = [0u8; 8];
        self.vram.read(at, &mut v);
        u64::from_le_bytes(v)
    }

    pub(super) fn raise_error(&mut self, code: u64) {
        if self.regs.error == 0 {
            self.regs.error = code;
        }
        self.regs.int_status |= 2;
        self.function.signal(ERROR_VECTOR, &mut self.out);
    }

    /// Writes `data` into VRAM at `at`: payloads still queued from there leave as they were
    /// when sent ([`Outbox::before_memory_write`]).
    pub(super) fn write_vram(&mut self, at: u64, data: &[u8]) {
        self.out.before_memory_write(at, data.len() as u64, &self.vram);
        self.vram.write(at, data);
    }

    /// Answers the memory read `request` of VRAM from `off` on (in bounds): its completions'
    /// payloads read from VRAM as the platform takes them.
    pub(super) fn complete_from_vram(&mut self, request: &TlpRepr<'_>, off: u64) {
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

    /// Ends the read with `tag`: its tag is free again. What it was for, if it was in flight.
    pub(super) fn retire(&mut self, tag: u16) -> Option<ReadPurpose> {
        let o = self.outstanding[tag as usize].take()?;
        self.in_flight -= 1;
        Some(o.purpose)
    }

    /// Whether `command` may start while host→VRAM copies' bytes are still landing: only
    /// another host→VRAM copy, into VRAM none of them still writes (a copy engine takes its
    /// descriptors back to back, keeping the link full across them). Anything else — a
    /// kernel, a fence, a copy out — waits until they have landed.
    pub(super) fn may_start_beside_copies(&self, ch: usize, command: &[u8]) -> bool {
        let landing = self.outstanding.iter().flatten().filter_map(|o| match o.purpose {
            ReadPurpose::Copy { ch: c, .. } if c == ch => Some((o.next, o.next.saturating_add(o.remaining))),
            _ => None,
        });
        starts_beside(command, landing)
    }

    pub(super) fn dma_read(&mut self, addr: u64, len: u64, purpose: ReadPurpose) -> bool {
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
        self.max_reads_in_flight = self.max_reads_in_flight.max(self.in_flight);
        true
    }

    /// Writes `len` bytes from `src` to host memory at `addr`, in memory writes of at most
    /// Max_Payload_Size that cross no 4 KiB boundary. A piece from VRAM is read from there
    /// when the platform takes it (its one copy); bytes of a command's are carried.
    pub(super) fn dma_write(&mut self, addr: u64, src: DmaSource<'_>, len: usize) {
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

/// Whether `command` is a host→VRAM copy into none of the VRAM ranges `landing` (looked
/// at only for such a copy).
pub(super) fn starts_beside(command: &[u8], mut landing: impl Iterator<Item = (u64, u64)>) -> bool {
    let word = |at: usize| u64::from_le_bytes(command[at..at + 8].try_into().unwrap_or([0; 8]));
    if u32::from_le_bytes(command[0..4].try_into().unwrap_or([0; 4])) != op::COPY_H2V {
        return false;
    }
    let (start, end) = (word(16), word(16).saturating_add(word(24)));
    landing.all(|(s, e)| e <= start || s >= end)
}
