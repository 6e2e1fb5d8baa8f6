//! The exports: each device the box serves, what backs it, its BARs as the box placed them,
//! its owner, and its backlog (what the device sent that the owner's session could not take
//! yet, and the device's reads awaiting completion); what the device sent, taken after each
//! call into the owner's session ([`ToSession`]) or, while that session is busy, into the
//! backlog ([`Deferred`]); opening a device, sizing and placing its BARs, and giving it back
//! ([`release`]).

use std::collections::{HashSet, VecDeque};

use bridge::attach::{BarInfo, Origin};
use hw::{Device, SimGpu};
use link::{SendError, Session};
use tlp::{Bdf, Body, ConfigTarget, CplStatus, Request, Tag, TlpRepr, rules};

use crate::claims::{Journal, Owner};
use crate::error::GpuError;
use crate::spec::{DeviceSpec, ExportSpec};
use crate::stats::{ExportIdentity, ExportStats};

/// The requester ID the box's own configuration requests use (its root port).
pub const BOX_ROOT: Bdf = Bdf::new(0, 0, 0);

pub(crate) struct Export {
    pub(crate) name: String,
    pub(crate) allow: Vec<String>,
    /// Its place in the box: device number on the box's bus and its 1 TiB of bus addresses.
    pub(crate) slot: u8,
    /// What backs it, in words (`simgpu, 64 MiB VRAM`, `VFIO 0000:41:00.0`).
    pub(crate) backing: String,
    /// Its IDs, the box's name and its PCI address there, told to the host at attach.
    pub(crate) origin: Origin,
    /// Its IDs as read at start.
    pub(crate) identity: ExportIdentity,
    /// Why the device is unhealthy (it no longer answers config reads), if it is: not
    /// attached to anyone until the box restarts.
    pub(crate) health: Option<String>,
    pub(crate) dev: Box<dyn Device>,
    pub(crate) bars: [BarInfo; 6],
    pub(crate) base: u64,
    pub(crate) owner: Option<Owner>,
    pub(crate) out: Backlog,
    pub(crate) stats: ExportStats,
}

/// What the device sent that the session could not take yet, and the device's reads
/// awaiting completion.
#[derive(Default)]
pub(crate) struct Backlog {
    pub(crate) queue: VecDeque<Vec<u8>>,
    pub(crate) reads: HashSet<u16>,
    /// Buffers of TLPs the session took, for the next ones queued: a long copy that
    /// outruns the link's credits queues thousands, and allocated a buffer for each.
    spare: Vec<Vec<u8>>,
}

/// Buffers the backlog keeps for reuse while its device is attached, at most: a 4 MiB copy's
/// 4 KiB writes, which a device queues at once when the link's credits hold them (256 left
/// 35 allocations per 8 MiB moved; `tests/alloc.rs`). Let go when the device is given back.
const BACKLOG_SPARE: usize = 1024;

/// Where what the device sent goes: the owner's session.
pub(crate) struct ToSession<'a> {
    pub(crate) s: &'a mut Session,
    pub(crate) out: &'a mut Backlog,
    pub(crate) stats: &'a mut ExportStats,
    pub(crate) device: &'a str,
}

impl ToSession<'_> {
    /// Takes everything `dev` sent, in order.
    pub(crate) fn take_from(&mut self, dev: &mut dyn Device) {
        while let Some(ref t) = dev.upstream() {
            self.send(t);
        }
    }

    fn send(&mut self, tlp: &TlpRepr<'_>) {
        self.out.note(tlp, self.stats);
        if !self.out.queue.is_empty() {
            self.out.push(tlp);
            return;
        }
        // Emitted straight into the buffer its frame is sent from: the payload's one copy.
        match self.s.send_repr(tlp) {
            Ok(()) => {}
            Err(SendError::QueueFull { .. }) => self.out.push(tlp),
            Err(SendError::TooLarge { len, mtu }) => {
                self.stats.too_large += 1;
                log::error!(
                    "{}: a {len}-byte TLP does not fit the link's {mtu}-byte MTU; dropped",
                    self.device
                );
            }
            Err(e) => log::debug!("{}: TLP not sent: {e}", self.device),
        }
    }
}

/// Where what the device sent goes while its session is busy (handling the datagram the
/// TLP came in): the backlog, in order, for the next flush.
pub(crate) struct Deferred<'a> {
    pub(crate) out: &'a mut Backlog,
    pub(crate) stats: &'a mut ExportStats,
}

impl Deferred<'_> {
    /// Takes everything `dev` sent, in order.
    pub(crate) fn take_from(&mut self, dev: &mut dyn Device) {
        while let Some(ref t) = dev.upstream() {
            self.out.note(t, self.stats);
            self.out.push(t);
        }
    }
}

/// A completion from the owner for one of the device's reads.
pub(crate) fn device_completion(t: &TlpRepr<'_>, dev: &mut dyn Device, up: &mut Deferred<'_>) {
    up.out.note_completion(t, up.stats);
    dev.completion(t);
    up.take_from(dev);
}

impl Backlog {
    /// Queues `tlp`, emitted into a spare buffer where there is one.
    fn push(&mut self, tlp: &TlpRepr<'_>) {
        let mut b = self.spare.pop().unwrap_or_default();
        b.resize(tlp.buffer_len(), 0);
        let n = tlp.emit(&mut b).unwrap_or(0);
        b.truncate(n);
        self.queue.push_back(b);
    }

    /// Drops what is queued and the spare buffers (the device is given back).
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.reads.clear();
        self.spare = Vec::new();
    }

    /// Counts a completion for one of the device's reads; the read is no longer in flight
    /// once its last completion (or an error) arrives.
    pub(crate) fn note_completion(&mut self, t: &TlpRepr<'_>, stats: &mut ExportStats) {
        let Body::Completion { cpl, data, .. } = t.body else { return };
        stats.device_completions += 1;
        if rules::completes_request(&cpl, data) {
            self.reads.remove(&cpl.tag.value());
        }
    }

    /// Counts a TLP the device sends and remembers the tag of each of its reads.
    pub(crate) fn note(&mut self, tlp: &TlpRepr<'_>, stats: &mut ExportStats) {
        match tlp.body {
            Body::MemRead { req, .. } => {
                self.reads.insert(req.tag.value());
                stats.device_requests += 1;
            }
            Body::MemWrite { .. } | Body::Message { .. } | Body::Atomic { .. } => stats.device_requests += 1,
            _ => {}
        }
    }

    /// Moves queued TLPs into the session, in order, while it takes them; returns whether
    /// it took any.
    pub(crate) fn flush(&mut self, s: &mut Session) -> bool {
        let mut took = false;
        while let Some(b) = self.queue.front() {
            match s.send_tlp(b) {
                Ok(()) | Err(SendError::TooLarge { .. } | SendError::InvalidTlp(_)) => {
                    if let Some(b) = self.queue.pop_front()
                        && self.spare.len() < BACKLOG_SPARE
                    {
                        self.spare.push(b);
                    }
                    took = true;
                }
                Err(_) => break,
            }
        }
        took
    }
}

/// Sends one config request to `dev` and returns the completion's data (all-ones if none).
pub(crate) fn config_access(dev: &mut dyn Device, register: u16, write: Option<u32>) -> u32 {
    let req = Request { requester: BOX_ROOT, tag: Tag::from_bits(0), first_be: 0xf, last_be: 0 };
    let cfg = ConfigTarget { type1: false, target: dev.id(), register };
    let data = write.unwrap_or(0).to_le_bytes();
    let body = match write {
        Some(_) => Body::CfgWrite { req, cfg, data: &data },
        None => Body::CfgRead { req, cfg },
    };
    dev.request(&TlpRepr::new(body));
    // Everything it sent is taken; anything but the completion (an MSI-X message a write
    // released) is the box's own access's and dropped.
    let mut value = None;
    while let Some(t) = dev.upstream() {
        if let Body::Completion { cpl, data, .. } = t.body
            && cpl.status == CplStatus::Success
            && value.is_none()
        {
            value = Some(
                data.and_then(|d| d.get(..4)).map_or(0, |d| u32::from_le_bytes([d[0], d[1], d[2], d[3]])),
            );
        }
    }
    value.unwrap_or(u32::MAX)
}

/// Sizes the device's BARs and places the unplaced ones from `base` up, as firmware would.
pub(crate) fn place_bars(dev: &mut dyn Device, base: u64) -> [BarInfo; 6] {
    let mut bars = [BarInfo::default(); 6];
    let mut cursor = base;
    let mut i = 0;
    while i < 6 {
        let at = 0x10 + 4 * i as u16;
        let orig = config_access(dev, at, None);
        config_access(dev, at, Some(0xffff_ffff));
        let mask = config_access(dev, at, None);
        let io = mask & 1 == 1;
        let is_64 = !io && (mask >> 1) & 3 == 2;
        let (orig_hi, mask_hi) = if is_64 && i < 5 {
            let o = config_access(dev, at + 4, None);
            config_access(dev, at + 4, Some(0xffff_ffff));
            (o, config_access(dev, at + 4, None))
        } else {
            (0, if is_64 { 0xffff_ffff } else { 0 })
        };
        let low_mask = if io { mask & !3 } else { mask & !0xf };
        let full = if is_64 {
            (mask_hi as u64) << 32 | low_mask as u64
        } else {
            0xffff_ffff_0000_0000 | low_mask as u64
        };
        let size = if low_mask == 0 && mask_hi == 0 { 0 } else { (!full).wrapping_add(1) };
        let mut address = (orig_hi as u64) << 32 | (orig & !0xf) as u64;
        if size != 0 && !io && address == 0 {
            address = cursor.div_ceil(size) * size;
            cursor = address + size;
        }
        config_access(dev, at, Some(address as u32 | (orig & 0xf)));
        if is_64 && i < 5 {
            config_access(dev, at + 4, Some((address >> 32) as u32));
        }
        if size != 0 {
            bars[i] = BarInfo { address, size, memory: !io, is_64, prefetchable: mask & 8 != 0 };
        }
        i += if is_64 { 2 } else { 1 };
    }
    bars
}

/// Writes the BAR addresses back if a reset cleared them (the sizes do not change).
pub(crate) fn restore_bars(dev: &mut dyn Device, bars: &[BarInfo; 6]) {
    for (i, b) in bars.iter().enumerate() {
        if b.size == 0 || !b.memory {
            continue;
        }
        let at = 0x10 + 4 * i as u16;
        let lo = config_access(dev, at, None);
        if lo & !0xf != b.address as u32 & !0xf {
            config_access(dev, at, Some(b.address as u32 | (lo & 0xf)));
        }
        if b.is_64 && i < 5 && config_access(dev, at + 4, None) != (b.address >> 32) as u32 {
            config_access(dev, at + 4, Some((b.address >> 32) as u32));
        }
    }
}

impl Export {
    /// Opens the device `spec` names in `slot` of the box (its device number on the box's
    /// bus, and its own 1 TiB of the box's bus address space), sizes and places its BARs.
    pub(crate) fn open(spec: &ExportSpec, slot: u8, box_name: &str) -> Result<Export, GpuError> {
        let id = Bdf::new(slot, 0, 0);
        let mut dev = open_device(spec, id)?;
        let base = (slot as u64) << 40;
        let bars = place_bars(dev.as_mut(), base);
        let backing = match &spec.device {
            DeviceSpec::Sim(p) => format!("simgpu, {} MiB VRAM", p.vram_bytes >> 20),
            DeviceSpec::Vfio(a) => format!("VFIO {a}"),
        };
        log::info!("exporting {} as {id} ({backing}) to {}", spec.name, spec.allow.join(", "));
        let ids = config_access(dev.as_mut(), 0, None);
        let class = config_access(dev.as_mut(), 8, None) >> 8;
        let identity = ExportIdentity {
            vendor_id: ids as u16,
            device_id: (ids >> 16) as u16,
            class,
            largest_bar: bars.iter().map(|b| b.size).max().unwrap_or(0),
            allow: spec.allow.clone(),
        };
        let health = unanswered(dev.as_mut(), "at start");
        let origin = Origin {
            vendor_id: identity.vendor_id,
            device_id: identity.device_id,
            box_name: box_name.to_string(),
            pci_address: pci_address(&spec.device, id),
        };
        Ok(Export {
            name: spec.name.clone(),
            allow: spec.allow.clone(),
            slot,
            backing,
            origin,
            identity,
            health,
            dev,
            bars,
            base,
            owner: None,
            out: Backlog::default(),
            stats: ExportStats::default(),
        })
    }
}

/// The device's PCI address on the box in sysfs's form (`0000:41:00.0`): a VFIO device's
/// own (its domain added when the configuration left it out), a simulated one's BDF on the
/// box's bus in domain 0.
fn pci_address(device: &DeviceSpec, id: Bdf) -> String {
    match device {
        DeviceSpec::Vfio(a) if a.matches(':').count() >= 2 => a.to_ascii_lowercase(),
        DeviceSpec::Vfio(a) => format!("0000:{}", a.to_ascii_lowercase()),
        DeviceSpec::Sim(_) => format!("0000:{id}"),
    }
}

pub(crate) fn open_device(spec: &ExportSpec, id: Bdf) -> Result<Box<dyn Device>, GpuError> {
    match &spec.device {
        DeviceSpec::Sim(p) => Ok(Box::new(SimGpu::new(id, *p))),
        DeviceSpec::Vfio(addr) => {
            let path = std::path::Path::new("/sys/bus/pci/devices").join(addr);
            let name = spec.name.clone();
            let d = hw::vfio::VfioDevice::open(&path, id, &mut |m| log::info!("{name}: {m}"))
                .map_err(|error| GpuError::Device { name: spec.name.clone(), error })?;
            Ok(Box::new(d))
        }
    }
}

/// Gives the device back: function-level reset, in-flight DMA dropped and counted, BARs
/// placed again (the reset cleared them).
pub(crate) fn release(e: &mut Export, why: &str, journal: &mut Journal) {
    let mut dropped = e.out.reads.len() + e.out.queue.len();
    while e.dev.upstream().is_some() {
        dropped += 1;
    }
    e.stats.dma_dropped += dropped as u64;
    e.out.clear();
    e.dev.reset();
    e.stats.resets += 1;
    e.bars = place_bars(e.dev.as_mut(), e.base);
    if let Some(owner) = e.owner.take() {
        log::info!(
            device = e.name.as_str(), host = owner.host.as_str(), session = format!("{:#010x}", owner.sid).as_str();
            "{}: released by {} ({why}); reset, {dropped} in-flight DMA dropped", e.name, owner.host
        );
        journal.record(&e.name, &owner, false, why);
    }
    if e.health.is_none()
        && let Some(h) = unanswered(e.dev.as_mut(), "after its reset")
    {
        log::error!(device = e.name.as_str(); "{}: unhealthy: {h}; attached to nobody from now on", e.name);
        journal.health(&e.name, &h);
        e.health = Some(h);
    }
}

/// Why a device is unhealthy, if it is: a function that answers its Vendor ID with all-ones
/// is not there (a real device that fell off its bus, a VFIO device gone).
pub(crate) fn unanswered(dev: &mut dyn Device, when: &str) -> Option<String> {
    (config_access(dev, 0, None) & 0xffff == 0xffff)
        .then(|| format!("does not answer config reads {when} (Vendor ID 0xffff)"))
}

pub(crate) fn emit(t: &TlpRepr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; t.buffer_len()];
    let n = t.emit(&mut b).unwrap_or(0);
    b.truncate(n);
    b
}
