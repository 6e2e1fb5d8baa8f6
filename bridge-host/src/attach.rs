//! Attaching a remote device, in its phases: the link (socket, session), the handshake, the
//! attach request and the box's answer, and the host view of what the box attached. Each
//! phase fails with its own [`AttachError`]; a failure after the handshake closes the
//! session, so the box forgets it at once instead of at its ride-through time.
#![forbid(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bridge::attach::{BarInfo, Control, Origin};
use link::driver::{
    AnyUdp, Clock, Datagrams, DriverKind, Impaired, Impairment, Offload, PollMode, SessionRunner, Tap, Tapped,
};
use link::{DownReason, Event, PresharedKey, Session};
use tlp::Bdf;

use crate::config_view::ConfigView;
use crate::fence::Fence;

/// How to attach a remote device.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The GPU-box endpoint.
    pub server: SocketAddr,
    /// The device's name there.
    pub device: String,
    /// Session settings; `link.psk` is this host's key.
    pub link: link::Config,
    /// Local address to bind (default: any address of the server's family, any port).
    pub bind: Option<SocketAddr>,
    /// Which UDP driver.
    pub driver: DriverKind,
    /// UDP GSO / GRO and zero-copy sends, as far as the kernel allows (logged at attach).
    pub offload: Offload,
    /// Busy-poll or blocking.
    pub poll: PollMode,
    /// Emulated network impairment on what this side receives.
    pub impairment: Impairment,
    /// The host's requester ID (its root port).
    pub host_id: Bdf,
    /// The device's BDF in the host's view.
    pub device_id: Bdf,
    /// Completion timeout of non-posted requests. The default, 250 ms, is the top of the
    /// PCIe Completion Timeout Range B (10 ms to 250 ms, PCIe 6.0 §7.5.3.16). A request during
    /// which the link recovered lost frames (retransmissions, NAKs, duplicates) may wait up
    /// to this plus four idle timeouts: a lossy link's replay back-off is not a device that
    /// stopped answering. The default
    /// range's 50 ms is too tight across a network: a completion must not pass the posted
    /// writes queued before it (PCIe ordering), and during bulk device→host DMA megabytes of
    /// them can be queued at the box.
    pub completion_timeout: Duration,
    /// How long the handshake and the attach may take.
    pub attach_timeout: Duration,
    /// Bytes of DMA memory in the arena `dma_alloc` hands out.
    pub dma_memory: usize,
    /// How often the service thread keeps the session alive while no call runs (`None`:
    /// no service thread; the caller must call often enough itself). Default 10 ms: well
    /// inside the keepalive interval. Shorter serves device DMA sooner while the caller is
    /// away, but every wake-up takes a core from busy-polling threads (at 1 ms the MMIO
    /// round trip's p99 tripled on a two-core machine: `dxpu bench bridge`).
    pub service_interval: Option<Duration>,
    /// How long one pass over the link may spend answering the device's reads of host
    /// memory (`None`: all that came). With a bound, what is left stays queued, in order,
    /// for the next pass, and the caller's thread gets back to its own work within about
    /// that: for a caller that drives the link from a thread with work of its own to be on
    /// time for (a replayed job's launches), where an endpoint with a core of its own would
    /// not delay it. Bulk DMA then moves in slices, each followed by a send.
    pub answer_slice: Option<Duration>,
    /// A flag the caller sets to give up (a signal handler's): an attach in progress returns
    /// [`AttachError::Cancelled`] within a poll; an attached device then counts as removed
    /// ("cancelled") and every wait on it ends at once. The device can still be detached.
    pub cancel: Option<Arc<AtomicBool>>,
    /// The fencing token of the pool claim this attach is made under (sent with ATTACH; a
    /// box serving a pool refuses an attach without the claim's current token).
    pub token: Option<u64>,
    /// A fence another thread may raise to take the device away at once (`Fence`).
    pub fence: Option<Fence>,
    /// Sees every datagram of the device's link, both ways (a packet capture).
    pub tap: Option<Tap>,
}

impl AttachOptions {
    /// Defaults for attaching `device` at `server` with `key`.
    pub fn new(server: SocketAddr, device: &str, key: PresharedKey) -> AttachOptions {
        AttachOptions {
            server,
            device: device.to_string(),
            link: link::Config::new(key),
            bind: None,
            driver: DriverKind::Auto,
            offload: Offload::AUTO,
            poll: PollMode::Blocking,
            impairment: Impairment::default(),
            host_id: Bdf::new(0, 0, 0),
            device_id: Bdf::new(0, 1, 0),
            completion_timeout: Duration::from_millis(250),
            attach_timeout: Duration::from_secs(5),
            dma_memory: 64 << 20,
            service_interval: Some(Duration::from_millis(10)),
            answer_slice: None,
            cancel: None,
            token: None,
            fence: None,
            tap: None,
        }
    }
}

/// The link a device is attached over.
pub(crate) type Link = SessionRunner<Tapped<Impaired<AnyUdp>>>;

/// What the box attached.
pub(crate) struct Attached {
    pub link: Link,
    pub box_id: Bdf,
    /// The largest payload the box said a link frame carries.
    pub max_payload: u16,
    pub view: ConfigView,
    /// What the device is and where it sits, as the box said (none from an earlier box).
    pub origin: Option<Origin>,
}

/// The box's ATTACHED, as phase 3 reads it.
struct Granted {
    box_id: Bdf,
    max_payload: u16,
    bars: [BarInfo; 6],
    origin: Option<Origin>,
}

/// Closes the session of an attach that failed after the handshake (the box forgets it at
/// once), and passes the error on.
fn give_up<D: Datagrams>(runner: &mut SessionRunner<D>, e: AttachError) -> AttachError {
    runner.session.close(runner.clock.now());
    let _ = runner.transmit();
    e
}

impl AttachOptions {
    fn cancelled(&self) -> bool {
        self.cancel.as_ref().is_some_and(|c| c.load(Ordering::Relaxed))
            || self.fence.as_ref().is_some_and(Fence::is_raised)
    }

    fn link_error(&self, reason: String) -> AttachError {
        AttachError::Link { server: self.server, reason }
    }
}

/// All the phases: a session with the box, the device attached, its BARs in the host view.
pub(crate) fn attach(opts: &AttachOptions) -> Result<Attached, AttachError> {
    let mut link = open_link(opts)?;
    handshake(&mut link, opts)?;
    let Granted { box_id, max_payload, bars, origin } = request_device(&mut link, opts)?;
    let view = match ConfigView::place(bars, max_payload as u32) {
        Ok(v) => v,
        Err(why) => return Err(give_up(&mut link, opts.link_error(why.to_string()))),
    };
    Ok(Attached { link, box_id, max_payload, view, origin })
}

/// Phase 1: the socket and a client session toward the box.
fn open_link(opts: &AttachOptions) -> Result<Link, AttachError> {
    let bind = opts.bind.unwrap_or(match opts.server {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    });
    let sock = AnyUdp::bind_with(bind, opts.driver, opts.offload, &mut |m| log::info!("{m}"))
        .map_err(AttachError::Socket)?;
    if !opts.impairment.is_none() {
        log::warn!("impairing what this endpoint receives: {:?}", opts.impairment);
    }
    let sock = Tapped::new(Impaired::new(sock, opts.impairment), opts.tap.clone());
    let clock = Clock::new();
    let mut rng = link::driver::os_rng(&mut |m| log::warn!("{m}"));
    let epoch = rng.nonzero_u32();
    let session = Session::client(fit_to_path(opts)?, clock.now(), epoch, rng);
    Ok(SessionRunner::new(sock, opts.server, session, clock, opts.poll))
}

/// The link's configuration with an `mtu` the route to the box carries whole. Datagrams
/// leave with Don't Fragment set (`link::driver`), so a larger one would never arrive: the
/// session proposes the largest that fits instead, and says so once, at this attach. An
/// error where not even the least frame fits.
fn fit_to_path(opts: &AttachOptions) -> Result<link::Config, AttachError> {
    let mut cfg = opts.link.clone();
    let server = opts.server;
    match link::driver::path_mtu(server) {
        Ok(p) if p.datagram < cfg.mtu => {
            let asked = cfg.mtu;
            cfg.mtu = p.datagram;
            if cfg.validate().is_err() {
                return Err(opts.link_error(format!(
                    "the route to {server} has an MTU of {} bytes, so datagrams of at most {} bytes \
                     arrive whole: less than a link frame needs (354); raise the interface's MTU",
                    p.mtu, p.datagram
                )));
            }
            log::warn!(
                peer = server.to_string().as_str();
                "link to {server}: [link] mtu = {asked} is more than the route carries whole (its MTU is {} \
                 bytes: UDP payloads of at most {} with the IP and UDP headers); this session's frames \
                 are at most {} bytes — set mtu = {} to say so, or raise the interface's MTU",
                p.mtu, p.datagram, p.datagram, p.datagram
            );
        }
        Ok(p) => log::info!(
            peer = server.to_string().as_str();
            "link to {server}: frames of at most {} bytes, sent with Don't Fragment (the route's MTU \
             {} carries {} whole)",
            cfg.mtu, p.mtu, p.datagram
        ),
        Err(e) => log::warn!(
            peer = server.to_string().as_str();
            "link to {server}: the route's MTU is unknown ({e}); frames of at most {} bytes, sent with \
             Don't Fragment: a larger route MTU is needed for them to arrive",
            cfg.mtu
        ),
    }
    Ok(cfg)
}

/// Phase 2: the handshake, until the session is up, down, or the caller gives up.
fn handshake(link: &mut Link, opts: &AttachOptions) -> Result<(), AttachError> {
    let mut down = None;
    let up = link
        .run_until(opts.attach_timeout, |s| {
            while let Some(e) = s.poll_event() {
                if let Event::Down(r) = e {
                    down = Some(r);
                }
            }
            s.is_up() || down.is_some() || opts.cancelled()
        })
        .map_err(AttachError::Socket)?;
    if opts.cancelled() {
        return Err(AttachError::Cancelled);
    }
    // The session's own handshake timeout (the link's, often shorter than the attach's) is
    // the same silence as no answer within the attach's time: said by what came back.
    if let Some(r) = down.filter(|r| *r != DownReason::HandshakeTimeout) {
        return Err(opts.link_error(match r {
            DownReason::AuthFailed => "authentication failed: the box does not hold this host's key".into(),
            DownReason::Refused => "the box refused the session: it has no room for another".into(),
            other => other.to_string(),
        }));
    }
    if !up || down.is_some() {
        let server = opts.server;
        let why = if link::driver::Datagrams::port_unreachable(&link.sock) > 0 {
            format!(
                "nothing listens on {server}: its machine answered ICMP port unreachable (is dxpu gpu \
                 running there, listening on that port?)"
            )
        } else {
            format!(
                "no handshake within {:?}: nothing came back from {server} (the box down, a firewall \
                 dropping UDP to it, or the wrong address)",
                if down.is_some() {
                    opts.attach_timeout.min(opts.link.handshake_timeout)
                } else {
                    opts.attach_timeout
                }
            )
        };
        return Err(opts.link_error(why));
    }
    Ok(())
}

/// Phase 3: ATTACH, and the box's ATTACHED (its BDF, Max_Payload_Size, BARs) or REFUSED.
/// Nothing else is expected on the session yet; anything else that arrives is dropped.
fn request_device(link: &mut Link, opts: &AttachOptions) -> Result<Granted, AttachError> {
    let _ = link
        .session
        .send_tlp(&Control::Attach { device: opts.device.clone(), token: opts.token }.to_tlp(opts.host_id));
    let mut answer = None;
    let done = link
        .run_until(opts.attach_timeout, |s| {
            while let Some(t) = s.recv_tlp() {
                if let Ok(c @ (Control::Attached { .. } | Control::Refused { .. })) = Control::from_tlp(&t) {
                    answer = Some(c);
                }
                s.recycle(t);
            }
            answer.is_some() || s.is_down() || opts.cancelled()
        })
        .map_err(AttachError::Socket)?;
    if opts.cancelled() {
        return Err(give_up(link, AttachError::Cancelled));
    }
    match answer {
        Some(Control::Attached { box_id, max_payload, bars, origin, .. }) => {
            Ok(Granted { box_id, max_payload, bars, origin })
        }
        Some(Control::Refused { reason, .. }) => {
            let e = AttachError::Refused { server: opts.server, device: opts.device.clone(), reason };
            Err(give_up(link, e))
        }
        _ if done => Err(opts.link_error("the link went down during the attach".into())),
        _ => {
            let e = AttachError::Timeout {
                server: opts.server,
                device: opts.device.clone(),
                timeout: opts.attach_timeout,
            };
            Err(give_up(link, e))
        }
    }
}

/// Why a device could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// The socket could not be set up.
    #[error("UDP socket: {0}")]
    Socket(io::Error),
    /// The options are inconsistent.
    #[error("{0}")]
    Config(String),
    /// The session did not come up.
    #[error("no session with {server}: {reason}")]
    Link {
        /// The box.
        server: SocketAddr,
        /// Why.
        reason: String,
    },
    /// The box refused the device.
    #[error("{server} refused to attach {device}: {reason}")]
    Refused {
        /// The box.
        server: SocketAddr,
        /// The device asked for.
        device: String,
        /// The box's reason.
        reason: String,
    },
    /// No answer to the attach request.
    #[error("{server} did not answer the attach of {device} within {timeout:?}")]
    Timeout {
        /// The box.
        server: SocketAddr,
        /// The device.
        device: String,
        /// How long was waited.
        timeout: Duration,
    },
    /// The caller gave up (`AttachOptions::cancel`).
    #[error("attach cancelled")]
    Cancelled,
    /// DMA memory could not be mapped.
    #[error("DMA arena of {len} bytes: {error}")]
    Memory {
        /// Size asked for.
        len: usize,
        /// What failed.
        error: io::Error,
    },
}
