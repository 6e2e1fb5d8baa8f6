//! What arrives from the box, and one pass over the link (`pump`). The dispatcher
//! (`bridge::dispatch`) hands over posted writes — DMA into host memory, MSI-X messages —
//! and the completions of this side's reads where they lie in the receive buffer: a payload
//! is copied once, into host memory or the waiting read's result. The device's memory reads
//! (and any other non-posted request) are kept and answered right after the receive, since
//! answering needs the session; their completions are emitted from host memory straight
//! into the session's send queue.
#![forbid(unsafe_code)]

use std::collections::VecDeque;

use bridge::Kept;
use driver::{Interrupts, MSI_BASE};
use link::{Event, Session, Time};
use tlp::rules;
use tlp::{Body, CplStatus, TlpRepr};

use crate::device::DeviceState;
use crate::requester::CompletionMatch;
use crate::stats::{HostStats, KindCounts};

/// Bytes of the device's reads a pass with a deadline answers at most before it sends
/// them (then the next pass, if time is left): 32 KiB, four jumbo frames.
const ANSWER_CHUNK: usize = 32 << 10;

/// How often refused datagrams make the host look at the route to the box, at most.
const ROUTE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes of the interrupt window MSI-X writes land in.
const MSI_WINDOW: u64 = 0x10_0000;

/// Queues a completion into the session, emitted straight into its buffer, or holds it (in
/// order, behind any already held) when the session's queue is full.
fn queue_or_hold(
    session: &mut Session,
    held: &mut VecDeque<Vec<u8>>,
    sent: &mut KindCounts,
    c: &TlpRepr<'_>,
) {
    sent.count(c);
    let queued = held.is_empty() && session.send_repr(c).is_ok();
    if !queued {
        let mut b = vec![0u8; c.buffer_len()];
        let n = c.emit(&mut b).unwrap_or(0);
        b.truncate(n);
        held.push_back(b);
    }
}

/// An MSI-X message from the device: an interrupt for its data value, counted for
/// `wait_interrupt` or handed to the caller's sink. False if `t` is not one.
fn interrupt(
    t: &TlpRepr<'_>,
    interrupts: &mut Interrupts,
    sink: &mut Option<Box<dyn FnMut(u32) + Send>>,
    stats: &mut HostStats,
) -> bool {
    let Body::MemWrite { address, data, .. } = t.body else { return false };
    if !(MSI_BASE..MSI_BASE + MSI_WINDOW).contains(&address.value()) || data.len() < 4 {
        return false;
    }
    let v = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    stats.interrupts += 1;
    match sink.as_mut() {
        Some(sink) => sink(v),
        // A data value no vector of this driver's has is counted and dropped.
        None => {
            if let Ok(v) = u16::try_from(v) {
                interrupts.signal(v, 1);
            }
        }
    }
    true
}

impl DeviceState {
    /// One pass over the link: receive, run timers, serve what arrived, send.
    pub(crate) fn pump(&mut self) -> bool {
        let now = self.link.clock.now();
        self.pump_at(now)
    }

    /// [`DeviceState::pump`] at `now`, a time the caller read just before.
    pub(crate) fn pump_at(&mut self, now: Time) -> bool {
        self.pump_for(now, None)
    }

    /// [`DeviceState::pump_at`] for a caller waiting on the request with tag `awaited`:
    /// once the receive completes it, the pump returns at once — the rest (the session's
    /// events and timers, the send) is left to the next pump or send, off the round trip of
    /// the read — unless something came that must be answered.
    pub(crate) fn pump_for(&mut self, now: Time, awaited: Option<tlp::Tag>) -> bool {
        let answer_until = self.answer_slice.map(|s| now + s);
        self.pass(now, awaited, answer_until)
    }

    /// Passes over the link until `deadline`, answering the device's requests for as long
    /// as that leaves, or until a pass finds nothing to do. True if anything happened.
    pub(crate) fn serve_until(&mut self, deadline: Time) -> bool {
        let mut any = false;
        loop {
            let now = self.link.clock.now();
            if now >= deadline || !self.pass(now, None, Some(deadline)) {
                return any;
            }
            any = true;
        }
    }

    /// One pass: [`DeviceState::pump_for`], answering the device's requests until
    /// `answer_until` (one at least; all without it); metered ([`DeviceState::spin`]).
    fn pass(&mut self, now: Time, awaited: Option<tlp::Tag>, answer_until: Option<Time>) -> bool {
        if self.link.sleeps() != self.sleeps {
            self.sleeps = self.link.sleeps();
            self.spin.slept();
        }
        self.spin.pass_began(now);
        let worked = self.pass_unmetered(now, awaited, answer_until);
        self.spin.pass_ended(now, worked);
        // At most every ROUTE_CHECK: under a stream of refusals, a look at the route (a
        // system call) and a log line per refusal would be a flood.
        if link::driver::Datagrams::too_large(&self.link.sock) != self.too_large_seen
            && self.route_checked.is_none_or(|t| now - t >= ROUTE_CHECK)
        {
            self.route_checked = Some(now);
            self.route_shrank();
        }
        worked
    }

    /// The driver refused datagrams as larger than the path carries whole (Don't Fragment
    /// is set): where the route's MTU fell below this session's frames since the attach (an
    /// ICMP "fragmentation needed", an interface's MTU lowered), no DATA frame can pass any
    /// more while the small ones (acknowledgements, keepalives) do, so the session would
    /// never go down and never progress: the device is removed, saying why, and an attach
    /// made again fits its frames to the route (`attach::fit_to_path`).
    fn route_shrank(&mut self) {
        self.too_large_seen = link::driver::Datagrams::too_large(&self.link.sock);
        let server = self.id.server;
        match self.route_too_small() {
            Some(why) => self.remove(why),
            None => log::warn!(
                peer = server.to_string().as_str();
                "link to {server}: a datagram was refused as too large, though the route carries this \
                 session's frames of {} bytes ({} so far)",
                self.link.session.mtu(), self.too_large_seen
            ),
        }
    }

    /// Why this session's frames no longer fit the route to the box, if they do not.
    fn route_too_small(&self) -> Option<String> {
        let (server, mtu) = (self.id.server, self.link.session.mtu());
        let p = link::driver::path_mtu(server).ok().filter(|p| p.datagram < mtu)?;
        Some(format!(
            "the route to {server} now carries datagrams of at most {} bytes whole (its MTU fell to {}), \
             less than this session's frames of {mtu}: attach again to use frames that fit",
            p.datagram, p.mtu
        ))
    }

    fn pass_unmetered(&mut self, now: Time, awaited: Option<tlp::Tag>, answer_until: Option<Time>) -> bool {
        self.last_pump = now;
        if self.fence_raised() {
            // Fenced between calls (the service thread pumps every few ms): act on it now.
            self.cancelled();
            return false;
        }
        let DeviceState {
            link,
            windows,
            interrupts,
            interrupt_sink,
            stats,
            received,
            requester,
            dispatcher,
            ..
        } = self;
        let mut in_place = |(): (), t: &TlpRepr<'_>| {
            received.count(t);
            match t.body {
                Body::MemWrite { .. } if !interrupt(t, interrupts, interrupt_sink, stats) => {
                    windows.write(t, stats)
                }
                Body::Completion { .. } if requester.complete(t) == CompletionMatch::Stray => {
                    stats.stray_completions += 1
                }
                // MSI-X (taken above), matched completions, and messages from the device
                // (power management, vendor-defined), which are not acted on.
                _ => {}
            }
        };
        let mut sink = |bytes: &[u8]| dispatcher.route((), bytes, &mut in_place);
        let polled = link.receive_frames_at(now, Some(&mut sink));
        // What the session queued instead (nothing, unless it received outside a pump) goes
        // the same way.
        while let Some(b) = link.session.recv_tlp() {
            dispatcher.route((), &b, &mut in_place);
            link.session.recycle(b);
        }
        if polled.is_ok()
            && awaited.is_some_and(|tag| requester.is_done(tag))
            && dispatcher.is_empty()
            && self.held.is_empty()
        {
            return true;
        }
        self.link.run_timers(now);
        let mut active = match polled {
            Ok(n) => n > 0,
            Err(e) => {
                log::error!("{}: socket: {e}", self.id.name);
                false
            }
        };
        while let Some(e) = self.link.session.poll_event() {
            match e {
                Event::Down(r) => {
                    // The box ends a session whose frames no longer fit the route back; say so.
                    let route = self.route_too_small().map(|w| format!(" ({w})")).unwrap_or_default();
                    self.remove(format!("link to {} down: {r}{route}", self.id.server))
                }
                Event::Silent { quiet } => {
                    self.stats.link_silences += 1;
                    log::warn!(
                        device = self.id.name.as_str(), peer = self.id.server.to_string().as_str();
                        "{} ({}): nothing from {} for {quiet:.1?}: riding through, the device is removed if \
                         nothing is heard for {:?}",
                        self.id.name, self.id.device_id, self.id.server, self.link.session.ride_through()
                    );
                }
                Event::Resumed { silent_for } => log::info!(
                    device = self.id.name.as_str(), peer = self.id.server.to_string().as_str();
                    "{} ({}): {} heard again after {silent_for:.1?}: nothing lost",
                    self.id.name, self.id.device_id, self.id.server
                ),
                Event::Up { .. } => {}
            }
        }
        while let Some(b) = self.held.front() {
            if self.link.session.send_tlp(b).is_err() {
                break;
            }
            self.held.pop_front();
        }
        if !self.dispatcher.is_empty() {
            active = true;
            // Out of `self` while they are answered (answering needs all of it); with a
            // slice, until it is spent (one answered at least), the rest left in order.
            let mut dispatcher = std::mem::take(&mut self.dispatcher);
            // and, in a slice, no more than ANSWER_CHUNK bytes before they are sent: the send
            // is most of an answer's cost, and it comes after.
            let clock = self.link.clock;
            let answered = std::cell::Cell::new(0usize);
            let spent = |handed: usize| {
                handed > 0
                    && answer_until.is_some_and(|end| answered.get() >= ANSWER_CHUNK || clock.now() >= end)
            };
            dispatcher.drain_until(spent, |(), kept| match kept {
                Kept::Request(t) => {
                    answered.set(answered.get() + 4 * t.length_dw().unwrap_or(1) as usize);
                    self.answer_request(&t)
                }
                // The box sends no control message once attached; one is dropped.
                Kept::Control(_) | Kept::BadControl(_) => {}
            });
            self.dispatcher = dispatcher;
        }
        // One send for the answers and whatever the timers made due.
        match self.link.transmit_at(now) {
            Ok(n) => active |= n > 0,
            Err(e) => log::error!("{}: socket: {e}", self.id.name),
        }
        active
    }

    /// Queues a completion this side owes the device; never waits: if the session's queue
    /// is full it is held, in order, and goes at the next pump.
    fn answer(&mut self, c: &TlpRepr<'_>) {
        queue_or_hold(&mut self.link.session, &mut self.held, &mut self.sent, c);
    }

    /// A non-posted request from the device, kept by the dispatcher: a DMA read served from
    /// a granted window, anything else (or a read outside every window) answered with
    /// Unsupported Request.
    fn answer_request(&mut self, t: &TlpRepr<'_>) {
        self.received.count(t);
        let host_id = self.id.host_id;
        if matches!(t.body, Body::MemRead { .. }) {
            let mps = self.view.max_payload();
            let DeviceState { windows, link, sent, held, stats, .. } = self;
            let served =
                windows.read(t, host_id, mps, stats, |c| queue_or_hold(&mut link.session, held, sent, c));
            if served {
                return;
            }
        }
        let c = rules::completion_without_data(t, host_id, CplStatus::UnsupportedRequest);
        self.answer(&c);
    }
}
