//! A box serving a pool (`docs/pool.md`): what the pool says of claims ([`ClaimCheck`]),
//! attaches waiting for it to confirm one, owners cut off when their claim goes, and where
//! changes of owner and of health are sent.

use crate::{GpuEndpoint, finish_attach, release};

/// How long an attach waits for the pool to confirm its claim before it is refused.
pub const CLAIM_CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// What the pool says of a claim (`ClaimCheck::verdict`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimVerdict {
    /// The pool holds this claim: the host may attach (or keep) the device.
    Valid,
    /// The pool holds no such claim (another host's, a newer one, or none): refused, why.
    Refused(String),
    /// The pool has not seen that far yet (the token is newer than what it has read).
    Unknown,
}

/// The box's view of a pool's claims (`docs/pool.md`): with one set
/// ([`GpuEndpoint::set_claims`]), an attach is accepted only with the token of a claim the
/// pool holds for that host on that device, and an owner whose claim goes is cut off and the
/// device reset. The datapath never waits on it: it is asked from the poll loop, and must
/// answer from what it has (a lock and a map, no I/O).
pub trait ClaimCheck: Send {
    /// A number that changes whenever the claims may have changed (read every poll).
    fn generation(&self) -> u64;
    /// Whether `host` holds the claim on `device` with fencing token `token`. With the
    /// `ticket` of a look-up asked after the attach arrived and since answered, a token
    /// still unknown is one etcd never issued (the look-up read a revision at least as new
    /// as any claim the host could hold then): refused, not waited on.
    fn verdict(&self, device: &str, host: &str, token: u64, ticket: Option<u64>) -> ClaimVerdict;
    /// Asks the pool to read `device`'s claim now (an attach is waiting on a token it has
    /// not seen); the answer comes as a new generation. Returns the look-up's ticket.
    fn look_up(&self, device: &str) -> u64;
}

/// One change of a device's owner, as the box made it (its ownership log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnershipEvent {
    /// The export.
    pub device: String,
    /// The host.
    pub host: String,
    /// The claim's fencing token, for a pool device.
    pub token: Option<u64>,
    /// Attached (true) or released (false).
    pub attached: bool,
    /// Why it was released.
    pub why: String,
}

/// Where [`GpuEndpoint::set_ownership_sink`] sends ownership changes.
pub type OwnershipSink = Box<dyn FnMut(&OwnershipEvent) + Send>;

/// Where [`GpuEndpoint::set_health_sink`] sends health changes: the export and `ok` or why
/// it is unhealthy.
pub type HealthSink = Box<dyn FnMut(&str, &str) + Send>;

/// Who holds an export: the session, its host, and the claim's token (pool devices).
#[derive(Clone)]
pub(crate) struct Owner {
    pub(crate) sid: u32,
    pub(crate) host: String,
    pub(crate) token: Option<u64>,
}

/// An attach waiting for the pool to confirm its claim.
pub(crate) struct PendingAttach {
    pub(crate) sid: u32,
    pub(crate) device: String,
    pub(crate) token: u64,
    pub(crate) ticket: u64,
    pub(crate) since: std::time::Instant,
}

/// The pool's claims as this endpoint uses them.
pub(crate) struct Claims {
    pub(crate) check: Box<dyn ClaimCheck>,
    pub(crate) generation: u64,
    pub(crate) pending: Vec<PendingAttach>,
}

/// What the attach path needs besides the session and the exports.
pub(crate) struct AttachCtx<'a> {
    pub(crate) claims: &'a mut Option<Claims>,
    pub(crate) journal: &'a mut Journal,
}

/// Where ownership changes go.
#[derive(Default)]
pub(crate) struct Journal {
    pub(crate) sink: Option<OwnershipSink>,
    pub(crate) health: Option<HealthSink>,
}

impl Journal {
    pub(crate) fn health(&mut self, device: &str, health: &str) {
        if let Some(sink) = &mut self.health {
            sink(device, health);
        }
    }

    pub(crate) fn record(&mut self, device: &str, owner: &Owner, attached: bool, why: &str) {
        if let Some(sink) = &mut self.sink {
            sink(&OwnershipEvent {
                device: device.to_string(),
                host: owner.host.clone(),
                token: owner.token,
                attached,
                why: why.to_string(),
            });
        }
    }
}

impl GpuEndpoint {
    /// Serves a pool from now on: attaches need a claim `check` confirms, and owners whose
    /// claim goes are cut off (their session closed) and the device reset.
    pub fn set_claims(&mut self, check: Box<dyn ClaimCheck>) {
        self.claims =
            Some(Claims { generation: check.generation().wrapping_sub(1), check, pending: Vec::new() });
    }

    /// Sends every change of owner to `sink` (the box's ownership log).
    pub fn set_ownership_sink(&mut self, sink: OwnershipSink) {
        self.journal.sink = Some(sink);
    }

    /// Sends every change of an export's health to `sink` (a pool's inventory).
    pub fn set_health_sink(&mut self, sink: HealthSink) {
        self.journal.health = Some(sink);
    }

    /// Acts on what the pool's claims say now: pending attaches confirmed or refused, owners
    /// whose claim went cut off. Cheap when nothing changed (one generation compare).
    pub(crate) fn reconcile_claims(&mut self) -> bool {
        let GpuEndpoint { runner, exports, sessions, claims, journal, .. } = self;
        let Some(c) = claims else { return false };
        let generation = c.check.generation();
        if generation == c.generation && c.pending.is_empty() {
            return false;
        }
        let changed = generation != c.generation;
        c.generation = generation;
        let mut active = false;
        if changed {
            for e in exports.iter_mut() {
                let Some(Owner { sid, host, token: Some(token) }) = &e.owner else { continue };
                let (sid, token) = (*sid, *token);
                if let ClaimVerdict::Refused(why) = c.check.verdict(&e.name, host, token, None) {
                    let why = format!("claim {token} gone: {why}");
                    log::warn!(device = e.name.as_str(), host = host.as_str(); "{}: cutting {host} off: {why}", e.name);
                    e.stats.claims_revoked += 1;
                    release(e, &why, journal);
                    if let Some(info) = sessions.get_mut(&sid) {
                        info.device = None;
                    }
                    // The host learns it from its session going down; until then what it
                    // still sends is answered Unsupported Request.
                    if let Some(s) = runner.endpoint.session(sid) {
                        s.close(runner.clock.now());
                    }
                    active = true;
                }
            }
        }
        let now = std::time::Instant::now();
        let pending = std::mem::take(&mut c.pending);
        for p in pending {
            let (Some(s), Some(info)) = (runner.endpoint.session(p.sid), sessions.get_mut(&p.sid)) else {
                continue;
            };
            let verdict = c.check.verdict(&p.device, &info.host, p.token, Some(p.ticket));
            let timed_out = now.duration_since(p.since) >= CLAIM_CONFIRM_TIMEOUT;
            match verdict {
                ClaimVerdict::Unknown if !timed_out => c.pending.push(p),
                v => {
                    let verdict = match v {
                        ClaimVerdict::Unknown => ClaimVerdict::Refused(format!(
                            "the pool could not confirm claim {} within {CLAIM_CONFIRM_TIMEOUT:?} (etcd unreachable?)",
                            p.token
                        )),
                        v => v,
                    };
                    let mut ctx = AttachCtx { claims: &mut None, journal };
                    finish_attach(p.sid, s, info, &p.device, Some(p.token), verdict, exports, &mut ctx);
                    active = true;
                }
            }
        }
        active
    }
}
