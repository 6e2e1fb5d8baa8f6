//! The simulated GPU's device model (docs/simgpu.md): BAR0 registers, sparse VRAM behind the
//! prefetchable BAR2, MSI-X, and a command processor that fetches 64-byte commands by DMA
//! from a ring in host memory when the doorbell rings and executes them — copies in both
//! directions (DMA split at Max_Read_Request_Size / Max_Payload_Size and 4 KiB, several
//! reads in flight), fill, fp32 kernels, fences, interrupts. A malformed command or a failed
//! DMA sets ERROR, raises the error vector, and the processor goes on with the next command.
//!
//! Each channel is a type of its own (`channel::Channel`: its ring, registers and command
//! processor); what the channels share — the function, VRAM, the upstream port, the global
//! registers, the DMA reads in flight by tag — is `shared::Shared`, which a channel is lent
//! while it runs. [`SimGpu`] is the two together: it routes register accesses and DMA
//! completions to the channel they are for.
#![forbid(unsafe_code)]

use tlp::rules::{self, Rcb, TransferSize};
use tlp::{Body, CplStatus, TlpRepr};

use crate::device::Device;
pub use crate::device::now_ns;
use crate::function::{Function, MemoryTarget};
use crate::simgpu::{SimGpuParams, config_space};

pub use simgpu_abi::{CHANNELS, COMMAND_BYTES, ERROR_VECTOR, chreg, err, op, reg, sem};

/// The simulated GPU.
pub struct SimGpu {
    /// What the channels share: the function, VRAM, the upstream port, the read tags.
    dev: Shared,
    /// The command channels; channel 0's registers are also at the legacy offsets.
    ch: Vec<Channel>,
    /// DMA completions that matched no outstanding read (dropped, counted).
    pub stray_completions: u64,
}

impl SimGpu {
    /// A simulated GPU answering as `id`.
    pub fn new(id: tlp::Bdf, params: SimGpuParams) -> SimGpu {
        let cfg = config_space(&params);
        let vram_size = cfg.bar(2).map_or(params.vram_bytes, |b| b.size);
        SimGpu {
            dev: Shared::new(Function::new(id, cfg), Vram::new(vram_size)),
            ch: (0..CHANNELS).map(Channel::new).collect(),
            stray_completions: 0,
        }
    }

    /// The most DMA reads the device had in flight at once.
    pub fn max_reads_in_flight(&self) -> usize {
        self.dev.max_reads_in_flight
    }

    /// DMA reads that fetched ring entries.
    pub fn command_fetches(&self) -> u64 {
        self.dev.command_fetches
    }

    /// VRAM bytes backed by memory (pages written so far).
    pub fn vram_resident(&self) -> u64 {
        self.dev.vram.resident()
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
            return self.ch[ch].reg_read(r);
        }
        match off {
            reg::ID => 1 << 32 | 0x474d_4953,
            reg::STATUS => {
                let busy = self.ch.iter().any(Channel::busy) || self.dev.in_flight > 0;
                busy as u64 | ((self.dev.regs.error != 0) as u64) << 1
            }
            reg::ERROR => self.dev.regs.error,
            reg::INT_STATUS => self.dev.regs.int_status,
            reg::FENCE => self.dev.regs.fence,
            reg::VRAM_SIZE => self.dev.vram.size(),
            reg::COMPLETED => self.dev.regs.completed,
            reg::CHANNELS => CHANNELS as u64,
            reg::COPIED_TO_VRAM => self.dev.regs.copied_to_vram,
            reg::COPIED_TO_HOST => self.dev.regs.copied_to_host,
            _ => 0,
        }
    }

    fn reg_write(&mut self, off: u64, value: u64) {
        if let Some((ch, r)) = Self::channel_reg(off) {
            self.ch[ch].reg_write(r, value);
            return;
        }
        match off {
            reg::ERROR => self.dev.regs.error &= !value,
            reg::INT_STATUS => self.dev.regs.int_status &= !value,
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
}

impl SimGpu {
    /// Ends the read with `tag`: its tag is free again, and a copy's channel has one read
    /// fewer in flight.
    fn retire(&mut self, tag: u16) {
        if let Some(ReadPurpose::Copy { ch, .. }) = self.dev.retire(tag) {
            self.ch[ch].copy_read_retired();
        }
    }

    /// The function: config space, MSI-X, Command gates.
    pub fn function(&self) -> &Function {
        &self.dev.function
    }
}

impl Device for SimGpu {
    fn id(&self) -> tlp::Bdf {
        self.dev.function.id()
    }

    fn max_payload(&self) -> u32 {
        self.dev.function.config().max_payload()
    }

    fn request(&mut self, tlp: &TlpRepr<'_>) {
        match tlp.body {
            Body::CfgRead { .. } | Body::CfgWrite { .. } => {
                let e = self.dev.function.config_request(tlp, &mut self.dev.out);
                if e.function_level_reset {
                    self.reset();
                }
            }
            Body::MemRead { address, length_dw, .. } => {
                let target = self.dev.function.memory_target(address.value());
                let len = length_dw as u64 * 4;
                // A register's value is completed from the stack, VRAM from where it lies.
                let register: [u8; 8];
                let data: Result<&[u8], CplStatus> = match target {
                    Err(s) => Err(s),
                    Ok(t @ (MemoryTarget::MsixTable(_) | MemoryTarget::MsixPba(_))) => {
                        let v = self.dev.function.msix_read(t, len as usize);
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
                    Ok(MemoryTarget::Bar(_, off)) if self.dev.vram.in_bounds(off, len) => {
                        self.dev.complete_from_vram(tlp, off);
                        return;
                    }
                    Ok(MemoryTarget::Bar(..)) => Err(CplStatus::UnsupportedRequest),
                };
                let id = self.dev.function.id();
                match data {
                    Ok(d) => {
                        let mps = TransferSize::from_bytes(self.dev.function.config().max_payload())
                            .unwrap_or(TransferSize::B128);
                        rules::complete_read(tlp, id, d, Rcb::B64, mps, |c| self.dev.out.send(c));
                    }
                    Err(status) => self.dev.out.send(&rules::completion_without_data(tlp, id, status)),
                }
            }
            Body::MemWrite { req, address, data, .. } => {
                // Posted: a write nothing decodes is dropped (no completion to send).
                let Ok(target) = self.dev.function.memory_target(address.value()) else { return };
                match target {
                    MemoryTarget::MsixTable(_) | MemoryTarget::MsixPba(_) => {
                        let v = match data.len() {
                            4 => u32::from_le_bytes(data.try_into().unwrap_or([0; 4])) as u64,
                            8 => u64::from_le_bytes(data.try_into().unwrap_or([0; 8])),
                            _ => return,
                        };
                        self.dev.function.msix_write(target, data.len(), v, &mut self.dev.out);
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
                        if !self.dev.vram.in_bounds(off, n as u64) {
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
                            self.dev.write_vram(off + start as u64, &data[start..i]);
                        }
                    }
                }
            }
            // IO, AtomicOps and the rest: unsupported. Non-posted ones get UR.
            _ => {
                if tlp.fc_class() == tlp::FcClass::NonPosted {
                    self.dev.out.send(&rules::completion_without_data(
                        tlp,
                        self.dev.function.id(),
                        CplStatus::UnsupportedRequest,
                    ));
                }
            }
        }
    }

    fn completion(&mut self, tlp: &TlpRepr<'_>) {
        let Body::Completion { cpl, data, .. } = tlp.body else { return };
        let tag = cpl.tag.value();
        let Some(mut o) = self.dev.outstanding.get(tag as usize).copied().flatten() else {
            self.stray_completions += 1;
            return;
        };
        let ch = o.purpose.channel();
        if cpl.status != CplStatus::Success || tlp.ep {
            self.retire(tag);
            self.ch[ch].read_failed(o.purpose);
            self.dev.raise_error(err::DMA);
            return;
        }
        let d = data.unwrap_or(&[]);
        let pad = (cpl.lower_address & 3) as usize;
        let n = (d.len().saturating_sub(pad) as u64).min(o.remaining).min(cpl.byte_count as u64);
        let bytes = &d[pad.min(d.len())..pad.min(d.len()) + n as usize];
        match o.purpose {
            ReadPurpose::Commands { .. } => self.ch[ch].commands_landed(o.next as usize, bytes),
            ReadPurpose::Copy { .. } => {
                self.dev.write_vram(o.next, bytes);
                self.dev.regs.copied_to_vram += bytes.len() as u64;
            }
        }
        o.next += n;
        o.remaining -= n;
        if o.remaining == 0 {
            if let ReadPurpose::Commands { slot, .. } = o.purpose {
                self.ch[ch].ring_read_done(slot);
            }
            self.retire(tag);
        } else {
            self.dev.outstanding[tag as usize] = Some(o);
        }
    }

    fn poll(&mut self) -> bool {
        if !self.dev.function.bus_master() {
            return false;
        }
        let mut did = false;
        for ch in 0..self.ch.len() {
            // Channel 0 is polled as before; the others only once programmed.
            if ch == 0 || self.ch[ch].programmed() {
                did |= self.ch[ch].poll(&mut self.dev);
            }
        }
        did
    }

    fn wake_at_ns(&self) -> Option<u64> {
        self.ch.iter().filter_map(Channel::wake_at_ns).min()
    }

    fn reads_waited_on(&self) -> Option<u64> {
        Some(self.dev.reads_waited_on)
    }

    #[inline]
    fn upstream(&mut self) -> Option<TlpRepr<'_>> {
        self.dev.out.take(&self.dev.vram)
    }

    /// What it sent before the reset still leaves (a configuration write's completion, for
    /// one): payloads from VRAM are copied out before VRAM goes.
    fn reset(&mut self) {
        self.dev.function.reset();
        self.dev.out.before_memory_write(0, u64::MAX, &self.dev.vram);
        self.dev.vram.clear();
        self.dev.regs = Default::default();
        for c in &mut self.ch {
            *c = Channel::new(c.id());
        }
        self.dev.outstanding.fill(None);
        self.dev.in_flight = 0;
    }
}

mod channel;
mod shared;
mod vram;

use channel::Channel;
pub use channel::{MAX_READS_IN_FLIGHT, MAX_TIMED_NS, PREFETCH};
use shared::{ReadPurpose, Shared};
pub use vram::VRAM_PAGE;
use vram::Vram;
