//! [`GpuEndpoint`]: the box's one thread, run to completion — its poll loop in named phases
//! (receive, answer the kept requests, timers and session events, let the devices work, the
//! pool's claims), and how a kept request or control message is answered.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use bridge::attach::Control;
use bridge::{Dispatcher, Kept};
use link::driver::{AnyUdp, Clock, Datagrams, Impaired, ServerRunner, SpinMeter, SpinTotals, Tapped};
use link::{DownReason, Endpoint, Event, Session, SessionMap};
use tlp::{Body, CplStatus, TlpRepr, rules};

use crate::attach::attach;
use crate::claims::{AttachCtx, Claims, Journal, Owner};
use crate::error::GpuError;
use crate::export::{BOX_ROOT, Deferred, Export, ToSession, device_completion, emit, release, restore_bars};
use crate::session::SessionInfo;
use crate::spec::{GpuOptions, HostKey, RetiringKey, check_allow};
use crate::stats::{ExportIdentity, GpuStats};

/// How long one pass lets a device work before the endpoint serves its links again (a
/// step that starts before the end runs to its own end). Inside the hosts' replay timeout
/// (2 ms) with a MATMUL band to spare, so a long kernel no longer makes them replay frames
/// the box has (`loopback --workload inference`: 15 replays a run before, none now); long
/// beside a copy's step (≈ 10 µs for 64 KiB). 200 µs cost inference about a point of
/// overhead in receives that found nothing (median of six runs in turns, 4.8 → 6.0 %); 1 ms
/// nothing to see (6.1 → 6.2 %, five).
const DEVICE_TURN: std::time::Duration = std::time::Duration::from_millis(1);

/// The GPU-box endpoint.
pub struct GpuEndpoint {
    pub(crate) runner: ServerRunner<Tapped<Impaired<AnyUdp>>>,
    pub(crate) exports: Vec<Export>,
    pub(crate) hosts: HashMap<[u8; 8], String>,
    /// The hosts and their keys, in the order given (and added).
    pub(crate) keys: Vec<HostKey>,
    /// The box's name, for the devices exported later too.
    pub(crate) box_name: String,
    pub(crate) sessions: SessionMap<SessionInfo>,
    pub(crate) stats: GpuStats,
    /// Routes what the hosts send by class (`bridge::dispatch`), each TLP labelled with its
    /// session.
    pub(crate) dispatcher: Dispatcher<u32>,
    /// When a failed handshake was last logged, and how many more failed since.
    pub(crate) failure_log: Option<(std::time::Instant, u64)>,
    /// The pool's claims, if the box serves a pool.
    pub(crate) claims: Option<Claims>,
    pub(crate) journal: Journal,
    /// What the passes that found nothing took ([`GpuEndpoint::spin_totals`]), and how many
    /// times the runner had slept when the last pass began.
    spin: SpinMeter,
    sleeps: u64,
    /// Keys replaced by a reload and still accepted for a while (`hosts.rs`).
    pub(crate) retiring: Vec<RetiringKey>,
    /// Datagrams the driver had refused as too large when last looked at, and when the
    /// sessions' routes were last looked at for them.
    too_large_seen: u64,
    route_checked: Option<link::Time>,
}

impl GpuEndpoint {
    /// Opens the devices, binds the socket, and is ready to serve.
    pub fn new(opts: GpuOptions) -> Result<GpuEndpoint, GpuError> {
        let Some(first) = opts.hosts.first() else {
            return Err(GpuError::Config("hosts: at least one host key is needed".into()));
        };
        if opts.exports.is_empty() {
            return Err(GpuError::Config("devices: at least one device must be exported".into()));
        }
        let mut names = HashSet::new();
        for (i, e) in opts.exports.iter().enumerate() {
            if !names.insert(e.name.as_str()) {
                return Err(GpuError::Config(format!("devices[{i}].name: '{}' is exported twice", e.name)));
            }
            check_allow(&format!("devices[{i}]"), e, &opts.hosts)?;
        }
        let mut hosts = HashMap::new();
        for (i, h) in opts.hosts.iter().enumerate() {
            if hosts.insert(h.key.key_id(), h.name.clone()).is_some() {
                return Err(GpuError::Config(format!(
                    "hosts[{i}].key: host '{}' has another host's key",
                    h.name
                )));
            }
        }
        let mut exports = Vec::new();
        for (i, spec) in opts.exports.iter().enumerate() {
            exports.push(Export::open(spec, i as u8 + 1, &opts.box_name)?);
        }
        let mut cfg = opts.link.clone();
        cfg.psk = first.key.clone();
        cfg.validate().map_err(|e| GpuError::Config(e.to_string()))?;
        let mut rng = link::driver::os_rng(&mut |m| log::warn!("{m}"));
        let epoch = rng.nonzero_u32();
        let mut endpoint = Endpoint::new(cfg, epoch, rng, 64 + 4 * exports.len());
        for h in &opts.hosts[1..] {
            endpoint.add_key(h.key.clone());
        }
        let sock = AnyUdp::bind_with(opts.listen, opts.driver, opts.offload, &mut |m| log::info!("{m}"))
            .map_err(|error| GpuError::Socket { addr: opts.listen, error })?;
        if !opts.impairment.is_none() {
            log::warn!("impairing what this endpoint receives: {:?}", opts.impairment);
        }
        let sock = Tapped::new(Impaired::new(sock, opts.impairment), opts.tap.clone());
        let runner = ServerRunner::new(sock, endpoint, Clock::new(), opts.poll);
        Ok(GpuEndpoint {
            runner,
            exports,
            hosts,
            keys: opts.hosts.clone(),
            box_name: opts.box_name.clone(),
            sessions: SessionMap::default(),
            stats: GpuStats::default(),
            dispatcher: Dispatcher::new(),
            failure_log: None,
            claims: None,
            journal: Journal::default(),
            spin: SpinMeter::new(),
            sleeps: 0,
            retiring: Vec::new(),
            too_large_seen: 0,
            route_checked: None,
        })
    }

    /// The time its passes spent finding nothing to do (busy polling's spins), readable from
    /// another thread while it runs: its thread's CPU time less this is its work.
    pub fn spin_totals(&self) -> std::sync::Arc<SpinTotals> {
        self.spin.totals()
    }

    /// `ok`, or why export `name` is unhealthy.
    pub fn export_health(&self, name: &str) -> Option<String> {
        let e = self.exports.iter().find(|e| e.name == name)?;
        Some(e.health.clone().unwrap_or_else(|| "ok".into()))
    }

    /// The exports' names, in order.
    pub fn export_names(&self) -> Vec<String> {
        self.exports.iter().map(|e| e.name.clone()).collect()
    }

    /// Export `name`'s vendor and device IDs, class code and the size of its largest BAR
    /// (config space as the box reads it), for a pool's inventory.
    pub fn export_identity(&mut self, name: &str) -> Option<ExportIdentity> {
        let e = self.exports.iter().find(|e| e.name == name)?;
        Some(ExportIdentity { allow: e.allow.clone(), ..e.identity.clone() })
    }

    /// The address the endpoint listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.runner.sock.local_addr()
    }

    /// Counters.
    pub fn stats(&self) -> GpuStats {
        let mut s = self.stats.clone();
        s.exports = self.exports.iter().map(|e| (e.name.clone(), e.stats)).collect();
        s.malformed_tlps = self.dispatcher.stats().malformed;
        s.largest_payload_received = self.dispatcher.stats().largest_payload;
        s.datagrams_too_large = self.runner.sock.offload().too_large;
        s
    }

    /// The host that owns export `name`, if any.
    pub fn owner(&self, name: &str) -> Option<&str> {
        self.exports.iter().find(|e| e.name == name)?.owner.as_ref().map(|o| o.host.as_str())
    }

    /// One pass, in phases, each named for what it does; what a phase produced leaves
    /// before the next one runs, at the points the phases' order makes (a host's register
    /// read is answered before the timers run; acknowledgements leave before the devices
    /// work; what the devices sent, at once after their turn). Returns whether anything
    /// happened.
    pub fn poll(&mut self) -> io::Result<bool> {
        let now = self.runner.clock.now();
        if self.runner.sleeps() != self.sleeps {
            self.sleeps = self.runner.sleeps();
            self.spin.slept();
        }
        self.spin.pass_began(now);
        let active = self.pass(now)?;
        self.spin.pass_ended(now, active);
        // At most every ROUTE_CHECK: a look at each session's route is a system call each.
        if self.runner.sock.too_large() != self.too_large_seen
            && self.route_checked.is_none_or(|t| now - t >= ROUTE_CHECK)
        {
            self.too_large_seen = self.runner.sock.too_large();
            self.route_checked = Some(now);
            self.end_sessions_over_their_route();
        }
        Ok(active)
    }

    /// [`GpuEndpoint::poll`]'s pass, at `now`.
    fn pass(&mut self, now: link::Time) -> io::Result<bool> {
        let mut active = self.receive(now)?;
        if self.answer_kept() {
            // In a host's read the time from here to the send is the round trip's; the
            // timers and events below overlap the host's turn.
            active = true;
            self.runner.transmit_at(now)?;
        }
        active |= self.run_timers_and_events(now);
        // What the timers made due (acknowledgements, replays) goes out before the devices
        // are polled, in one pass over the sessions.
        active |= self.runner.transmit_at(now)? > 0;
        if self.let_devices_work()? {
            // What the devices sent, at a fresh time: a device step may have been long.
            active = true;
            self.runner.transmit()?;
        }
        self.runner.endpoint.reap();
        self.log_failed_handshakes();
        if !self.retiring.is_empty() && self.retire_expired_keys() {
            active = true;
            self.runner.transmit()?;
        }
        if self.reconcile_claims() {
            active = true;
            self.runner.transmit()?;
        }
        Ok(active)
    }

    /// Receives what the socket has. The dispatcher hands over the hosts' posted writes
    /// (into BARs) and the completions for the devices' DMA reads where they lie in the
    /// receive buffer: their payload is copied once, into the device. What the device sends
    /// meanwhile waits in its backlog (the session is busy with the datagram). Non-posted
    /// requests and control messages are kept for [`GpuEndpoint::answer_kept`].
    fn receive(&mut self, now: link::Time) -> io::Result<bool> {
        let GpuEndpoint { runner, exports, sessions, stats, dispatcher, .. } = self;
        let mut in_place = |sid: u32, t: &TlpRepr<'_>| {
            let Some(d) = sessions.get(&sid).and_then(|i| i.device) else {
                stats.unowned_requests += 1;
                return;
            };
            let e = &mut exports[d];
            let mut up = Deferred { out: &mut e.out, stats: &mut e.stats };
            if matches!(t.body, Body::Completion { .. }) {
                device_completion(t, e.dev.as_mut(), &mut up);
            } else {
                up.stats.host_requests += 1;
                e.dev.request(t);
                up.take_from(e.dev.as_mut());
            }
        };
        let mut sink = |sid: u32, bytes: &[u8]| dispatcher.route(sid, bytes, &mut in_place);
        let active = runner.receive_frames_at(now, Some(&mut sink))? > 0;
        // What a session queued instead (nothing, unless it received outside a poll) goes the
        // same way, behind what it holds.
        for (sid, _, s) in runner.endpoint.sessions() {
            while let Some(b) = s.recv_tlp() {
                dispatcher.route(sid, &b, &mut in_place);
                s.recycle(b);
            }
        }
        Ok(active)
    }

    /// Handles the requests and control messages the receive kept, in order; returns whether
    /// there were any (their answers wait in the sessions for the caller's send).
    ///
    /// They are handled before this pass's session events, and that is safe for an Attach:
    /// a host sends one only once its session is up, which takes the box's ESTABLISHED; the
    /// pass that accepted the session queued it and handles its `Up` in
    /// [`GpuEndpoint::run_timers_and_events`] before any later receive can bring the Attach.
    fn answer_kept(&mut self) -> bool {
        let GpuEndpoint { runner, exports, sessions, stats, dispatcher, claims, journal, .. } = self;
        let answered = !dispatcher.is_empty();
        dispatcher.drain(|sid, kept| {
            if let Kept::Control(Control::Attach { device, .. }) = &kept {
                take_over_from_a_silent_session(
                    sid,
                    device,
                    &mut runner.endpoint,
                    exports,
                    sessions,
                    journal,
                );
            }
            if let Some(s) = runner.endpoint.session(sid) {
                let mut ctx = AttachCtx { claims, journal };
                handle_kept(sid, s, kept, exports, sessions, stats, &mut ctx);
            }
        });
        answered
    }

    /// Runs the sessions' timers and acts on their events: a host connected, a host gone
    /// (its device released). Returns whether there were events.
    fn run_timers_and_events(&mut self, now: link::Time) -> bool {
        let GpuEndpoint { runner, exports, hosts, sessions, stats, journal, .. } = self;
        runner.run_timers(now);
        let mut active = false;
        for (id, peer, s) in runner.endpoint.sessions() {
            while let Some(ev) = s.poll_event() {
                active = true;
                match ev {
                    Event::Up { .. } => {
                        let host = hosts.get(&s.key_id()).cloned().unwrap_or_else(|| "?".into());
                        log::info!(
                            host = host.as_str(), session = format!("{id:#010x}").as_str();
                            "host {host} connected (session {id:#010x}): frames of at most {} bytes, sent \
                             with Don't Fragment",
                            s.mtu()
                        );
                        warn_if_over_path(&host, peer, s.mtu());
                        stats.sessions_up += 1;
                        sessions.insert(
                            id,
                            SessionInfo { host, device: None, since: std::time::SystemTime::now() },
                        );
                    }
                    Event::Silent { quiet } => {
                        if let Some(info) = sessions.get(&id) {
                            log::warn!(
                                host = info.host.as_str(), session = format!("{id:#010x}").as_str();
                                "host {} silent for {quiet:.1?} (session {id:#010x}): riding through up to {:?} \
                                 before its device is released",
                                info.host,
                                s.ride_through()
                            );
                        }
                        stats.sessions_silent += 1;
                    }
                    Event::Resumed { silent_for } => {
                        if let Some(info) = sessions.get(&id) {
                            log::info!(
                                host = info.host.as_str(), session = format!("{id:#010x}").as_str();
                                "host {} heard again after {silent_for:.1?} of silence (session {id:#010x}): \
                                 nothing lost",
                                info.host
                            );
                        }
                    }
                    Event::Down(reason) => {
                        if reason == DownReason::PeerClosed {
                            stats.sessions_closed_by_hosts += 1;
                        }
                        if let Some(info) = sessions.remove(&id) {
                            log::info!(
                                host = info.host.as_str(), session = format!("{id:#010x}").as_str();
                                "host {} gone (session {id:#010x}): {reason}", info.host
                            );
                            if let Some(d) = info.device {
                                release(&mut exports[d], reason_text(reason), journal);
                            }
                        }
                    }
                }
            }
        }
        active
    }

    /// Lets each attached device work while its upstream has room, after moving what its
    /// backlog holds into its owner's session; returns whether any device worked or sent.
    ///
    /// Bounded per pass, in steps and in time ([`DEVICE_TURN`]), so that one busy device
    /// does not starve the socket: a step may be a band of a long kernel, and the link's
    /// ACKs and a host's register reads wait for the end of the pass.
    fn let_devices_work(&mut self) -> io::Result<bool> {
        let GpuEndpoint { runner, exports, .. } = self;
        let mut worked = false;
        for e in exports.iter_mut() {
            let Some(Owner { sid, .. }) = e.owner else { continue };
            let Some(s) = runner.endpoint.session(sid) else { continue };
            worked |= e.out.flush(s);
            let turn_ends = runner.clock.now() + DEVICE_TURN;
            for _ in 0..64 {
                if !e.out.queue.is_empty() {
                    break;
                }
                let did = e.dev.poll();
                ToSession { s, out: &mut e.out, stats: &mut e.stats, device: &e.name }
                    .take_from(e.dev.as_mut());
                if !did {
                    break;
                }
                worked = true;
                if runner.clock.now() >= turn_ends {
                    break;
                }
            }
        }
        Ok(worked)
    }

    /// Says which hosts could not get a session and why (a key this box does not hold, a
    /// wrong proof, no room): the first at once, then at most one line a second with how
    /// many more there were, so a flood cannot flood the log.
    fn log_failed_handshakes(&mut self) {
        while let Some((from, why)) = self.runner.endpoint.poll_failure() {
            let now = std::time::Instant::now();
            if self.failure_log.is_some_and(|(at, _)| now - at < std::time::Duration::from_secs(1)) {
                if let Some((_, more)) = &mut self.failure_log {
                    *more += 1;
                }
                continue;
            }
            let more = self.failure_log.map_or(0, |(_, n)| n);
            let also = if more > 0 { format!(" ({more} more since the last report)") } else { String::new() };
            log::warn!("handshake from {from} refused: {why}{also}");
            self.failure_log = Some((now, 0));
        }
    }

    /// Waits for work the way the poll mode says (call after an idle [`GpuEndpoint::poll`]).
    /// A device with timed work under way (a timed kernel's end) is polled by then: busy
    /// polling goes on polling, a blocking wait ends when it is due.
    pub fn wait(&mut self) -> io::Result<()> {
        let wake = self.exports.iter().filter(|e| e.owner.is_some()).filter_map(|e| e.dev.wake_at_ns()).min();
        match wake {
            None => self.runner.wait(),
            Some(_) if self.runner.busy_polls() => {
                std::hint::spin_loop();
                Ok(())
            }
            Some(at) => {
                let left = std::time::Duration::from_nanos(at.saturating_sub(hw::device::now_ns()));
                self.runner.wait_at_most(Some(left))
            }
        }
    }

    /// Serves until `stop` is set, then closes every session and resets attached devices.
    pub fn run(&mut self, stop: &AtomicBool) -> io::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            if !self.poll()? {
                self.wait()?;
            }
        }
        self.shutdown()
    }

    /// Closes every session (the hosts see the link go down) and resets attached devices.
    pub fn shutdown(&mut self) -> io::Result<()> {
        let now = self.runner.clock.now();
        for (_, _, s) in self.runner.endpoint.sessions() {
            s.close(now);
        }
        self.runner.transmit()?;
        for e in &mut self.exports {
            if e.owner.is_some() {
                release(e, "endpoint stopping", &mut self.journal);
            }
        }
        Ok(())
    }
}

fn reason_text(r: DownReason) -> &'static str {
    match r {
        DownReason::Timeout => "link timed out",
        DownReason::HandshakeTimeout => "handshake timed out",
        DownReason::AuthFailed => "authentication failed",
        DownReason::PeerClosed => "host closed the session",
        DownReason::Closed => "session closed here",
        DownReason::PeerRestarted => "host restarted",
        DownReason::Superseded => "host started a new session",
        DownReason::ProtocolViolation(_) => "protocol violation",
        DownReason::Refused => "handshake refused",
    }
}

/// A host that attaches `device` on session `sid` while it owns the device through another
/// session of its own that has fallen silent gave that session up: it removed the device
/// after its own ride-through time (the box's may be longer, or the box was the one
/// stopped), or it restarted on a new port. The old session is closed and the device
/// released (reset) so that the attach that follows finds it free — instead of refusing
/// the host its own device until the old session's ride-through ends. A live old session
/// (two processes holding one host's key) keeps the device: that attach is refused.
fn take_over_from_a_silent_session(
    sid: u32,
    device: &str,
    endpoint: &mut Endpoint<std::net::SocketAddr>,
    exports: &mut [Export],
    sessions: &mut SessionMap<SessionInfo>,
    journal: &mut Journal,
) {
    let Some(host) = sessions.get(&sid).map(|i| i.host.clone()) else { return };
    let Some(e) = exports.iter_mut().find(|e| e.name == device) else { return };
    let Some(old) = e.owner.as_ref().filter(|o| o.sid != sid && o.host == host).map(|o| o.sid) else {
        return;
    };
    let Some(s) = endpoint.session(old).filter(|s| s.is_silent()) else { return };
    let quiet = s.last_heard();
    s.close(quiet);
    log::warn!(
        device = device, host = host.as_str(), session = format!("{old:#010x}").as_str();
        "{device}: {host} attaches it again on session {sid:#010x} while its session {old:#010x} is silent: \
         that one is closed and the device released to the new one"
    );
    if let Some(info) = sessions.get_mut(&old) {
        info.device = None;
    }
    release(e, "its host attached it again on a new session", journal);
}

/// A host's request or control message, kept from the receive buffer by the dispatcher.
fn handle_kept(
    sid: u32,
    s: &mut Session,
    kept: Kept<'_>,
    exports: &mut [Export],
    sessions: &mut SessionMap<SessionInfo>,
    stats: &mut GpuStats,
    ctx: &mut AttachCtx<'_>,
) {
    let Some(info) = sessions.get_mut(&sid) else { return };
    let t = match kept {
        Kept::Control(Control::Attach { device, token }) => {
            return attach(sid, s, info, &device, token, exports, ctx);
        }
        Kept::Control(Control::Detach { device }) => {
            if let Some(d) = info.device.take() {
                if exports[d].name == device {
                    release(&mut exports[d], "detached", ctx.journal);
                } else {
                    info.device = Some(d);
                }
            }
            return;
        }
        Kept::Control(_) | Kept::BadControl(_) => {
            stats.bad_control += 1;
            return;
        }
        Kept::Request(t) => t,
    };
    let Some(d) = info.device else {
        stats.unowned_requests += 1;
        let _ =
            s.send_tlp(&emit(&rules::completion_without_data(&t, BOX_ROOT, CplStatus::UnsupportedRequest)));
        return;
    };
    let e = &mut exports[d];
    e.stats.host_requests += 1;
    let cfg_write = matches!(t.body, Body::CfgWrite { .. });
    e.dev.request(&t);
    ToSession { s, out: &mut e.out, stats: &mut e.stats, device: &e.name }.take_from(e.dev.as_mut());
    if cfg_write {
        // A host-initiated function-level reset clears the BARs; the box owns their
        // placement, so it puts them back where the host expects them.
        restore_bars(e.dev.as_mut(), &e.bars);
    }
}

/// How often refused datagrams make the box look at its sessions' routes, at most.
const ROUTE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl GpuEndpoint {
    /// The driver refused datagrams as larger than the path carries whole (Don't Fragment
    /// is set): each session whose frames no longer fit the route back to its host (its MTU
    /// fell since the attach) could never progress again, so it is ended, its device
    /// released, saying why; the host's next attach fits its frames to the route.
    fn end_sessions_over_their_route(&mut self) {
        self.end_sessions_where(|peer, s| {
            let p = link::driver::path_mtu(peer).ok().filter(|p| p.datagram < s.mtu())?;
            Some(format!(
                "the route to its host ({peer}) now carries datagrams of at most {} bytes whole (its MTU \
                 fell to {}), less than this session's frames of {}",
                p.datagram,
                p.mtu,
                s.mtu()
            ))
        });
    }
}

/// Says, once per session, where the session's frames are larger than the route back to its
/// host carries whole: the host proposes no more than its own route allows, so this is a path
/// that differs by direction; frames over it are refused by the kernel (Don't Fragment) and
/// counted (`datagrams_too_large`), never fragmented.
fn warn_if_over_path(host: &str, peer: std::net::SocketAddr, mtu: usize) {
    match link::driver::path_mtu(peer) {
        Ok(p) if p.datagram < mtu => log::warn!(
            host = host;
            "host {host} ({peer}): this session's frames of up to {mtu} bytes are more than the route \
             back carries whole (its MTU is {} bytes: UDP payloads of at most {}); larger ones are \
             refused, not fragmented — set [link] mtu = {} on the host, or raise the route's MTU",
            p.mtu, p.datagram, p.datagram
        ),
        Ok(_) => {}
        Err(e) => log::debug!("host {host} ({peer}): the route's MTU is unknown: {e}"),
    }
}
