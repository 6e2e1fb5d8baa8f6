//! The state of one attached device, owned by whichever thread holds its lock (the caller
//! inside a call, or the service thread between calls), and the request path: config
//! accesses through the host view, MMIO translated to the box's BARs, each non-posted
//! request sent with a tag and waited for under its completion timeout while the link is
//! driven. What arrives from the box is in `receive.rs`.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bridge::Dispatcher;
use driver::Interrupts;
use link::SendError;
use tlp::{Address, Bdf, Body, ConfigTarget, CplStatus, Request, TlpRepr};

use crate::addr::{BoxAddr, BusAddr};
use crate::attach::Link;
use crate::config_view::{ConfigView, Routed};
use crate::dma::DmaWindows;
use crate::fence::Fence;
use crate::requester::{Completed, LinkEvidence, MAX_READ, Outstanding, Requester, TimerCheck};
use crate::stats::{HostStats, KindCounts};

/// Bytes of a PCI Express function's config space.
pub(crate) const CONFIG_SPACE: usize = 4096;

/// A memory access: bytes to fill, or bytes to write.
pub(crate) enum Access<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// Who the device is, in log lines and requests.
pub(crate) struct Identity {
    /// Its name on the box.
    pub name: String,
    /// The box.
    pub server: SocketAddr,
    /// The host's requester ID.
    pub host_id: Bdf,
    /// The device's BDF in the host's view.
    pub device_id: Bdf,
    /// Its BDF on the box.
    pub box_id: Bdf,
    /// Its IDs, the box's name and its PCI address there, as the box said at attach.
    pub origin: Option<bridge::attach::Origin>,
}

/// One attached device.
pub(crate) struct DeviceState {
    pub link: Link,
    pub id: Identity,
    pub view: ConfigView,
    pub windows: DmaWindows,
    pub requester: Requester,
    /// MSI-X messages not yet waited for, by vector.
    pub interrupts: Interrupts,
    /// Where MSI-X messages go as they arrive, if a caller asked.
    pub interrupt_sink: Option<Box<dyn FnMut(u32) + Send>>,
    /// Completions the session could not queue yet (its completion queue was full), in order.
    pub held: VecDeque<Vec<u8>>,
    /// Routes what the box sends by class.
    pub dispatcher: Dispatcher<()>,
    pub removed: Option<String>,
    /// `AttachOptions::cancel`.
    pub cancel: Option<Arc<AtomicBool>>,
    /// `AttachOptions::fence`.
    pub fence: Option<Fence>,
    pub sent: KindCounts,
    pub received: KindCounts,
    pub stats: HostStats,
    /// When the link was last driven (`pump`), for the service thread.
    pub last_pump: link::Time,
    /// `AttachOptions::answer_slice`.
    pub answer_slice: Option<std::time::Duration>,
    /// What the passes that found nothing took (a busy-polling caller's spins), and how many
    /// times the link had slept when the last pass began.
    pub spin: link::driver::SpinMeter,
    pub sleeps: u64,
    /// Datagrams the driver had refused as too large when last looked at, and when the
    /// route was last looked at for them.
    pub too_large_seen: u64,
    pub route_checked: Option<link::Time>,
}

impl DeviceState {
    /// Whether the caller gave up (`AttachOptions::cancel`): then the device counts as
    /// removed, so that every wait ends.
    pub(crate) fn cancelled(&mut self) -> bool {
        if self.removed.is_none()
            && let Some(why) = self.fence.as_ref().and_then(Fence::reason)
        {
            self.fenced(&why);
        }
        if self.removed.is_none() && self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed)) {
            log::info!("{} ({}): cancelled; its accesses fail from now on", self.id.name, self.id.device_id);
            self.removed = Some("cancelled: the endpoint is stopping".into());
            self.fail_pending();
        }
        self.removed.is_some()
    }

    /// The fence was raised: the device is gone for its users, and the session is closed so
    /// that nothing more goes to the box for it (no request, no completion, no ACK).
    fn fenced(&mut self, why: &str) {
        log::error!("{} ({}): surprise removal: fenced: {why}", self.id.name, self.id.device_id);
        self.removed = Some(format!("fenced: {why}"));
        self.fail_pending();
        let now = self.link.clock.now();
        self.link.session.close(now);
        let _ = self.link.transmit_at(now);
    }

    /// Whether the fence is raised and not yet acted on (one atomic load).
    pub(crate) fn fence_raised(&self) -> bool {
        self.removed.is_none() && self.fence.as_ref().is_some_and(Fence::is_raised)
    }

    fn fail_pending(&mut self) {
        self.stats.failed_requests += self.requester.fail_all();
    }

    /// The device is gone (surprise removal), for `why`.
    pub(crate) fn remove(&mut self, why: String) {
        if self.removed.is_none() {
            log::error!(
                device = self.id.name.as_str(), peer = self.id.server.to_string().as_str();
                "{} ({}): surprise removal: {why}", self.id.name, self.id.device_id
            );
            self.removed = Some(why);
        }
        self.fail_pending();
    }

    /// Queues a request of the caller's, waiting (up to the completion timeout) while the
    /// session's queue for its class is full.
    fn send(&mut self, t: &TlpRepr<'_>) -> bool {
        self.sent.count(t);
        // The clock is read only if the queue is full (not on the way of every request):
        // when it first refused.
        let mut refused_at = None;
        loop {
            // Emitted straight into the buffer its frame is sent from, again on each try.
            match self.link.session.send_repr(t) {
                Ok(()) => return true,
                Err(SendError::QueueFull { .. }) => {
                    let (timeout, silence) = (self.requester.timeout, self.requester.silence);
                    let now = self.link.clock.now();
                    let since = *refused_at.get_or_insert(now);
                    // A queue that does not drain because the box is silent waits for it, as a
                    // request's completion does, up to the ride-through time.
                    let silent = silence.silent(since, self.link.session.last_heard(), now)
                        && now < since + timeout + silence.ride_through;
                    if now >= since + timeout && !silent {
                        self.remove(format!("the link took no {} for {timeout:?}", t.kind().name()));
                        return false;
                    }
                    if !self.pump() {
                        let _ = self.link.wait();
                    }
                    if self.cancelled() {
                        return false;
                    }
                }
                Err(e) => {
                    log::error!("{}: cannot send {}: {e}", self.id.name, t.kind().name());
                    return false;
                }
            }
        }
    }

    /// What the session has done to recover lost frames so far: retransmissions, NAKs
    /// either way, duplicates received (the peer retransmitting what its lost ACKs did not
    /// confirm), frames beyond the window.
    fn recovery_count(&self) -> u64 {
        let s = self.link.session.stats();
        s.retransmits + s.naks_sent + s.naks_received + s.duplicate_data + s.dropped_out_of_window
    }

    /// What the link shows now, for a completion timer.
    fn link_evidence(&self) -> LinkEvidence {
        LinkEvidence { recoveries: self.recovery_count(), heard: self.link.session.last_heard() }
    }

    /// Sends the non-posted request `t` with `tag` and waits for its completion, driving
    /// the link meanwhile. The completion timeout runs from the send (see
    /// `requester::CompletionTimer`, paused while the box is silent); a box that is really
    /// gone is found by the link's ride-through time. `None` if it failed, timed out, or the device is gone.
    fn request(&mut self, t: &TlpRepr<'_>, tag: tlp::Tag) -> Option<Completed> {
        if self.cancelled() {
            self.stats.failed_requests += 1;
            return None;
        }
        self.requester.open(tag);
        if !self.send(t) {
            self.requester.cancel(tag);
            self.stats.failed_requests += 1;
            return None;
        }
        // One clock reading serves the send and the timeout.
        let sent_at = self.link.clock.now();
        if let Err(e) = self.link.transmit_at(sent_at) {
            log::error!("{}: socket: {e}", self.id.name);
        }
        let mut timer = self.requester.timer(sent_at, self.recovery_count());
        loop {
            let now = match self.requester.poll(tag) {
                Outstanding::None => return None,
                Outstanding::Done(c) => return Some(c),
                Outstanding::Waiting => self.link.clock.now(),
            };
            if self.cancelled() {
                return None;
            }
            match timer.check(now, self.link_evidence()) {
                TimerCheck::Wait => {}
                TimerCheck::Extended => {
                    self.stats.completion_timeouts_extended += 1;
                    continue;
                }
                TimerCheck::Paused => {
                    self.stats.completion_timeouts_paused += 1;
                    continue;
                }
                TimerCheck::Expired(waited) => {
                    self.stats.completion_timeouts += 1;
                    self.remove(format!("no completion for tag {tag} within {waited:.0?}"));
                    return None;
                }
            }
            if !self.pump_for(now, Some(tag)) {
                if self.removed.is_some() {
                    return None;
                }
                let _ = self.link.wait();
            }
        }
    }

    /// A config request to the device with byte enables `be`.
    fn config_request(&mut self, offset: u16, write: Option<u32>, be: u8) -> u32 {
        let tag = self.requester.next_tag();
        let req = Request { requester: self.id.host_id, tag, first_be: be, last_be: 0 };
        // Retargeted from the host-view BDF to the device's BDF on the box.
        let cfg = ConfigTarget { type1: false, target: self.id.box_id, register: offset & 0xffc };
        let data = write.unwrap_or(0).to_le_bytes();
        let body = match write {
            Some(_) => Body::CfgWrite { req, cfg, data: &data },
            None => Body::CfgRead { req, cfg },
        };
        match self.request(&TlpRepr::new(body), tag) {
            Some(Completed { status: CplStatus::Success, data, len }) if len >= 4 => {
                u32::from_le_bytes([data[0], data[1], data[2], data[3]])
            }
            Some(Completed { status: CplStatus::Success, .. }) => 0,
            _ => u32::MAX,
        }
    }

    /// Finds the PCI Express capability, for the host view's Device Control.
    pub(crate) fn learn_max_payload(&mut self) {
        let mut at = (self.config_request(0x34, None, 0xf) & 0xfc) as u16;
        for _ in 0..48 {
            if at == 0 || self.removed.is_some() {
                return;
            }
            let h = self.config_request(at, None, 0xf);
            if h & 0xff == 0x10 {
                let ctl = self.config_request(at + 8, None, 0xf);
                self.view.found_device_control(at + 8, ctl);
                return;
            }
            at = ((h >> 8) & 0xfc) as u16;
        }
    }

    /// Config register `offset` as the host sees it.
    pub(crate) fn config_read(&mut self, offset: u16) -> u32 {
        let offset = offset & 0xffc;
        match self.view.read(offset) {
            Some(v) => v,
            None if self.removed.is_some() => u32::MAX,
            None => self.config_request(offset, None, 0xf),
        }
    }

    /// A config write of the whole register at `offset`.
    pub(crate) fn config_write(&mut self, offset: u16, value: u32) {
        let offset = offset & 0xffc;
        if let Routed::Device(value) = self.view.write(offset, value)
            && self.removed.is_none()
        {
            self.config_request(offset, Some(value), 0xf);
        }
    }

    /// A config write of the bytes enabled by `be`. Registers the host view keeps take the
    /// enabled bytes merged into their current value; the rest goes to the device with the
    /// byte enables as given.
    pub(crate) fn config_write_be(&mut self, offset: u16, value: u32, be: u8) {
        let offset = offset & 0xffc;
        if be == 0xf {
            return self.config_write(offset, value);
        }
        if self.view.is_virtual(offset) {
            let mut merged = self.config_read(offset).to_le_bytes();
            let new = value.to_le_bytes();
            for (i, b) in merged.iter_mut().enumerate() {
                if be & (1 << i) != 0 {
                    *b = new[i];
                }
            }
            return self.config_write(offset, u32::from_le_bytes(merged));
        }
        if self.removed.is_none() && be != 0 {
            self.config_request(offset, Some(value), be);
        }
    }

    /// A driver's MMIO of `len` (4 or 8) bytes at host-view address `addr`: all-ones (and
    /// counted) where no BAR claims it.
    pub(crate) fn mmio(&mut self, addr: BusAddr, len: usize, write: Option<u64>) -> u64 {
        let len = if len == 8 { 8 } else { 4 };
        let Some(target) = self.view.translate(addr, len as u64) else {
            self.stats.unclaimed_mmio += 1;
            return u64::MAX;
        };
        let (first_be, last_be) = if len == 8 { (0xf, 0xf) } else { (0xf, 0) };
        match write {
            Some(v) => {
                let b = v.to_le_bytes();
                self.mem_request(target, len / 4, first_be, last_be, Some(&b[..len]));
                0
            }
            None => match self.mem_request(target, len / 4, first_be, last_be, None) {
                Some(d) => {
                    let mut b = [0u8; 8];
                    b[..len].copy_from_slice(&d[..len]);
                    u64::from_le_bytes(b)
                }
                None => u64::MAX,
            },
        }
    }

    /// A memory access of any size and alignment at box address `addr`, in pieces a device
    /// takes as one register access: an aligned QW as one two-DW request, otherwise one
    /// request per DW with byte enables for the bytes inside it.
    pub(crate) fn mmio_bytes(&mut self, addr: BoxAddr, access: Access<'_>) {
        let (n, mut out, data) = match access {
            Access::Read(o) => (o.len(), Some(o), None),
            Access::Write(d) => (d.len(), None, Some(d)),
        };
        let mut done = 0;
        while done < n {
            let at = addr + done as u64;
            let piece = if at.get().is_multiple_of(8) && n - done >= 8 {
                8
            } else {
                (4 - (at.get() % 4) as usize).min(n - done)
            };
            let lane = (at.get() % 4) as usize;
            let (first_be, last_be, length_dw) =
                if piece == 8 { (0xf, 0xf, 2) } else { ((((1u16 << piece) - 1) << lane) as u8, 0, 1) };
            let mut dw = [0u8; 8];
            if let Some(d) = data {
                dw[lane..lane + piece].copy_from_slice(&d[done..done + piece]);
            }
            let aligned = BoxAddr(at.get() & !3);
            let got =
                self.mem_request(aligned, length_dw, first_be, last_be, data.map(|_| &dw[..length_dw * 4]));
            if let Some(o) = out.as_mut() {
                let bytes = got.unwrap_or([0xff; MAX_READ]);
                o[done..done + piece].copy_from_slice(&bytes[lane..lane + piece]);
            }
            done += piece;
        }
    }

    /// One memory request to box address `addr` (DW-aligned); a read returns its data,
    /// `None` if it failed.
    fn mem_request(
        &mut self,
        addr: BoxAddr,
        length_dw: usize,
        first_be: u8,
        last_be: u8,
        write: Option<&[u8]>,
    ) -> Option<[u8; MAX_READ]> {
        if self.removed.is_some() || self.fence_raised() {
            self.cancelled();
            self.stats.failed_requests += write.is_none() as u64;
            return None;
        }
        let tag = self.requester.next_tag();
        let req = Request { requester: self.id.host_id, tag, first_be, last_be };
        let address = Address::new(addr.get());
        match write {
            Some(data) => {
                let t = TlpRepr::new(Body::MemWrite { req, address, ph: 0, data });
                if self.send(&t)
                    && let Err(e) = self.link.transmit()
                {
                    log::error!("{}: socket: {e}", self.id.name);
                }
                None
            }
            None => {
                let t = TlpRepr::new(Body::MemRead {
                    req,
                    address,
                    ph: 0,
                    length_dw: length_dw as u16,
                    locked: false,
                });
                let started = self.link.clock.now();
                let got = self.request(&t, tag);
                self.stats.mmio_reads.record(self.link.clock.now().since(started));
                match got {
                    Some(Completed { status: CplStatus::Success, data, len }) if len >= length_dw * 4 => {
                        Some(data)
                    }
                    _ => None,
                }
            }
        }
    }
}
