//! One PCI function as a bridge drives it: config space, MSI-X, and the Command register's
//! gates. Config requests are answered here; memory requests are decoded to a BAR (or
//! refused with UR while Memory Space Enable is clear); MSI-X table and PBA accesses are
//! served here; device-originated requests (DMA, MSI-X writes) go out only with Bus Master
//! Enable set. Function-level reset returns everything to its power-on state.
#![forbid(unsafe_code)]

use tlp::{Bdf, Body, CplStatus, TlpRepr, rules};

use crate::msix::{MsixMessage, MsixTable};
pub use crate::upstream::Outbox;
use pci::config::{BarKind, ConfigSpace, ConfigWrite};

/// Where a memory request lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryTarget {
    /// The MSI-X table, at this byte offset.
    MsixTable(u64),
    /// The MSI-X pending-bit array, at this byte offset.
    MsixPba(u64),
    /// Device registers or memory: BAR index and offset into it.
    Bar(usize, u64),
}

/// A function: config space, its power-on template, MSI-X state.
#[derive(Clone)]
pub struct Function {
    id: Bdf,
    config: ConfigSpace,
    power_on: ConfigSpace,
    msix: MsixTable,
    msix_table: Option<(usize, u64, u64)>,
    msix_pba: Option<(usize, u64, u64)>,
    /// MSI-X messages held back because Bus Master Enable was clear.
    held: u64,
}

impl Function {
    /// A function with this config space (its power-on state) answering as `id`.
    pub fn new(id: Bdf, config: ConfigSpace) -> Function {
        let (table, pba, vectors) = match config.msix_offset() {
            Some(at) => {
                let ctl = config.read(at + 2, 2) as u16;
                let n = (ctl & 0x7ff) as u64 + 1;
                let t = config.read(at + 4, 4);
                let p = config.read(at + 8, 4);
                (
                    Some(((t & 7) as usize, (t & !7) as u64, n * 16)),
                    Some(((p & 7) as usize, (p & !7) as u64, n.div_ceil(64) * 8)),
                    n as u16,
                )
            }
            None => (None, None, 1),
        };
        Function {
            id,
            power_on: config.clone(),
            config,
            msix: MsixTable::new(vectors),
            msix_table: table,
            msix_pba: pba,
            held: 0,
        }
    }

    /// The function's ID (completer ID, requester ID of its own requests).
    pub fn id(&self) -> Bdf {
        self.id
    }
    /// The config space.
    pub fn config(&self) -> &ConfigSpace {
        &self.config
    }
    /// The MSI-X state.
    pub fn msix(&self) -> &MsixTable {
        &self.msix
    }
    /// MSI-X messages held back while Bus Master Enable was clear.
    pub fn held_messages(&self) -> u64 {
        self.held
    }

    /// Answers a configuration request (CfgRd0/CfgWr0; Type 1 gets UR: an endpoint has no
    /// bus behind it). Returns what a write changed; MSI-X messages it released go upstream.
    pub fn config_request(&mut self, req: &TlpRepr<'_>, out: &mut Outbox) -> ConfigWrite {
        let mut effect = ConfigWrite::default();
        match req.body {
            Body::CfgRead { cfg, .. } if !cfg.type1 => {
                let data = self.config.read_dword(cfg.register as usize).to_le_bytes();
                let chunk =
                    rules::CompletionChunk { byte_count: 4, lower_address: 0, data_offset: 0, length_dw: 1 };
                out.send(&rules::completion_with_data(req, self.id, &chunk, &data));
            }
            Body::CfgWrite { req: r, cfg, data } if !cfg.type1 => {
                let base = cfg.register as usize;
                for (i, byte) in data.iter().take(4).enumerate() {
                    if r.first_be & (1 << i) != 0 {
                        let e = self.config.write(base + i, 1, *byte as u32);
                        effect = merge(effect, e);
                    }
                }
                if let Some((_, new)) = effect.msix_control {
                    for m in self.msix.set_control(new) {
                        self.send_msix(m, out);
                    }
                }
                if let Some((old, new)) = effect.command
                    && old & pci::config::command::BUS_MASTER == 0
                    && new & pci::config::command::BUS_MASTER != 0
                {
                    // Bus mastering came on: held-back messages may go now.
                    let ctl = self.config.msix_control().unwrap_or(0);
                    for m in self.msix.set_control(ctl) {
                        self.send_msix(m, out);
                    }
                }
                if effect.function_level_reset {
                    self.reset();
                }
                out.send(&rules::completion_without_data(req, self.id, CplStatus::Success));
            }
            Body::CfgRead { .. } | Body::CfgWrite { .. } => {
                out.send(&rules::completion_without_data(req, self.id, CplStatus::UnsupportedRequest));
            }
            _ => {}
        }
        effect
    }

    /// Decodes a memory request's address: UR while Memory Space Enable is clear or when no
    /// BAR claims it; MSI-X structures are recognised.
    pub fn memory_target(&self, addr: u64) -> Result<MemoryTarget, CplStatus> {
        if !self.config.memory_enabled() {
            return Err(CplStatus::UnsupportedRequest);
        }
        let (bar, off) = self.config.decode(addr).ok_or(CplStatus::UnsupportedRequest)?;
        if self.config.bar(bar).is_some_and(|b| b.kind == BarKind::Io) {
            return Err(CplStatus::UnsupportedRequest);
        }
        if let Some((b, start, len)) = self.msix_table
            && b == bar
            && off >= start
            && off < start + len
        {
            return Ok(MemoryTarget::MsixTable(off - start));
        }
        if let Some((b, start, len)) = self.msix_pba
            && b == bar
            && off >= start
            && off < start + len
        {
            return Ok(MemoryTarget::MsixPba(off - start));
        }
        Ok(MemoryTarget::Bar(bar, off))
    }

    /// Reads the MSI-X table or PBA.
    pub fn msix_read(&self, target: MemoryTarget, len: usize) -> u64 {
        match target {
            MemoryTarget::MsixTable(o) => self.msix.read_table(o, len),
            MemoryTarget::MsixPba(o) => self.msix.read_pba(o, len),
            MemoryTarget::Bar(..) => u64::MAX,
        }
    }

    /// Writes the MSI-X table (the PBA is read-only); released messages go upstream.
    pub fn msix_write(&mut self, target: MemoryTarget, len: usize, value: u64, out: &mut Outbox) {
        if let MemoryTarget::MsixTable(o) = target {
            for m in self.msix.write_table(o, len, value) {
                self.send_msix(m, out);
            }
        }
    }

    /// The device raises a vector: an MSI-X write now, or a pending bit.
    pub fn signal(&mut self, vector: u16, out: &mut Outbox) {
        if let Some(m) = self.msix.signal(vector) {
            self.send_msix(m, out);
        }
    }

    fn send_msix(&mut self, m: MsixMessage, out: &mut Outbox) {
        if !self.bus_master() {
            // A function without Bus Master Enable issues no requests; keep it pending.
            self.held += 1;
            self.msix.set_pending(m.vector);
            return;
        }
        m.send(self.id, out);
    }

    /// Bus Master Enable: the function may issue DMA and MSI-X writes.
    pub fn bus_master(&self) -> bool {
        self.config.bus_master()
    }

    /// Function-level reset: config space and MSI-X back to power-on.
    pub fn reset(&mut self) {
        self.config.reset_to(&self.power_on);
        self.msix.reset();
        self.held = 0;
    }
}

fn merge(a: ConfigWrite, b: ConfigWrite) -> ConfigWrite {
    ConfigWrite {
        command: match (a.command, b.command) {
            (Some((o, _)), Some((_, n))) => Some((o, n)),
            (x, y) => y.or(x),
        },
        bar_moved: b.bar_moved.or(a.bar_moved),
        msix_control: match (a.msix_control, b.msix_control) {
            (Some((o, _)), Some((_, n))) => Some((o, n)),
            (x, y) => y.or(x),
        },
        function_level_reset: a.function_level_reset || b.function_level_reset,
        power_state: b.power_state.or(a.power_state),
    }
}
