//! The endpoint serving a pool (`docs/pool.md`): claims confirmed before an attach, owners
//! cut off when their claim goes, and where changes of owner and of health are sent.

use crate::attach::finish_attach;
use crate::claims::{
    AttachCtx, CLAIM_CONFIRM_TIMEOUT, ClaimCheck, ClaimVerdict, Claims, HealthSink, Owner, OwnershipSink,
};
use crate::endpoint::GpuEndpoint;
use crate::export::release;

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
