//! The claims on one box's devices as the box has read them from etcd (a snapshot, its
//! watch, look-ups of a device), and the verdict on a host's claim token at attach: valid,
//! refused (and why), or not known yet.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use bridge_gpu::ClaimVerdict;

/// The claims on one box's devices, as far as the box has read etcd.
#[derive(Debug, Default)]
pub struct ClaimTable {
    inner: Mutex<TableInner>,
    pub(crate) generation: AtomicU64,
}

#[derive(Debug, Default)]
struct TableInner {
    /// device → (host, token).
    claims: HashMap<String, (String, u64)>,
    /// device → the revision through which its claim is known (a look-up, an event).
    known: HashMap<String, i64>,
    /// The revision through which every claim of the box is known (snapshot, watch).
    revision: i64,
    /// Look-up tickets issued.
    tickets: u64,
    /// device → (the last ticket answered for it, the revision its answer read).
    answered: HashMap<String, (u64, i64)>,
    /// device → (the token of its claim an operator revoked, who did).
    revoked: HashMap<String, (u64, String)>,
}

impl TableInner {
    /// The revision through which `device`'s claim is known: its own (a look-up, an event)
    /// or the whole table's (snapshot, watch), the later.
    fn known_through(&self, device: &str) -> i64 {
        self.known.get(device).copied().unwrap_or(0).max(self.revision)
    }

    /// [`ClaimTable::apply`] under the table's lock: whether anything changed.
    fn apply(&mut self, device: &str, claim: Option<(String, u64)>, revision: i64) -> bool {
        if revision <= self.known_through(device) {
            return false;
        }
        match claim {
            Some(c) => self.claims.insert(device.to_string(), c),
            None => self.claims.remove(device),
        };
        self.known.insert(device.to_string(), revision);
        true
    }
}

impl ClaimTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Everything anew, as read at `revision`.
    pub(crate) fn reset(&self, claims: HashMap<String, (String, u64)>, revision: i64) {
        let mut g = self.lock();
        g.claims = claims;
        g.known.clear();
        g.revision = revision;
        drop(g);
        self.bump();
    }

    pub(crate) fn ticket(&self) -> u64 {
        let mut g = self.lock();
        g.tickets += 1;
        g.tickets
    }

    /// The answer to look-up `ticket`: `device`'s claim as etcd held it at `revision`. The
    /// claim and the answer land under one lock: a verdict between the two would see the
    /// look-up answered and its claim not yet, and refuse a claim just made as never issued.
    pub(crate) fn answer(&self, device: &str, ticket: u64, claim: Option<(String, u64)>, revision: i64) {
        {
            let mut g = self.lock();
            g.apply(device, claim, revision);
            let a = g.answered.entry(device.to_string()).or_insert((0, 0));
            if ticket > a.0 {
                *a = (ticket, revision);
            }
        }
        self.bump();
    }

    /// `device`'s claim as of `revision` (an event, or a look-up), unless already known
    /// through a later one.
    pub(crate) fn apply(&self, device: &str, claim: Option<(String, u64)>, revision: i64) {
        if self.lock().apply(device, claim, revision) {
            self.bump();
        }
    }

    /// Claim `token` on `device` was revoked by `by` (its record read before the claim's
    /// deletion is applied, so that the cut-off says who).
    pub(crate) fn note_revoked(&self, device: &str, token: u64, by: &str) {
        self.lock().revoked.insert(device.to_string(), (token, by.to_string()));
    }

    /// Every claim of the box is known through `revision` (a watch response's header).
    pub(crate) fn advance(&self, revision: i64) {
        let mut g = self.lock();
        if revision > g.revision {
            g.revision = revision;
            drop(g);
            self.bump();
        }
    }

    /// The claim on `device`: host and token.
    pub fn current(&self, device: &str) -> Option<(String, u64)> {
        self.lock().claims.get(device).cloned()
    }

    /// Whether `host` holds `device` with `token`, as far as etcd has been read; with a
    /// look-up's `ticket`, once it is answered, no token is unknown any more
    /// (`bridge_gpu::ClaimCheck::verdict`).
    pub fn verdict(&self, device: &str, host: &str, token: u64, ticket: Option<u64>) -> ClaimVerdict {
        let g = self.lock();
        let held = g.claims.get(device);
        if held.is_some_and(|(h, t)| h == host && *t == token) {
            return ClaimVerdict::Valid;
        }
        let known = g.known_through(device);
        // etcd's revisions are positive i64s: anything else was never issued.
        let Ok(revision) = i64::try_from(token) else {
            return ClaimVerdict::Refused(format!("token {token} is not a revision etcd issues"));
        };
        if token == 0 {
            return ClaimVerdict::Refused("token 0 is not a revision etcd issues".into());
        }
        if known >= revision {
            ClaimVerdict::Refused(match held {
                Some((h, t)) if *t > token => format!("stale: etcd holds a newer claim ({t}, by {h})"),
                Some((h, t)) => format!("etcd holds claim {t} by {h}"),
                None => match g.revoked.get(device) {
                    Some((t, by)) if *t == token => format!("revoked by {by}"),
                    _ => format!("etcd holds no claim on it (as of revision {known})"),
                },
            })
        } else if let (Some(t), Some((answered, read))) = (ticket, g.answered.get(device))
            && *answered >= t
        {
            ClaimVerdict::Refused(format!(
                "etcd never issued token {token}: a look-up made after the attach read revision {read}"
            ))
        } else {
            ClaimVerdict::Unknown
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_ups_answer_and_the_claim_it_read_are_seen_together() {
        // The answer to a look-up and the claim it read land at once: a check between the
        // two once refused a claim just made as "never issued" (the 500-round pool test).
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let t = std::sync::Arc::new(ClaimTable::default());
        let published = std::sync::Arc::new(AtomicU64::new(0));
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let (t2, p2, d2) = (t.clone(), published.clone(), done.clone());
        let answering = std::thread::spawn(move || {
            // Each claim newer than what the last look-up read, as a claim just made is;
            // until the checks below are done, whichever thread the machine runs first.
            let mut token = 0u64;
            while !d2.load(Ordering::Acquire) && token < 400_000_000 {
                token += 10;
                let ticket = t2.ticket();
                p2.store(ticket << 32 | token, Ordering::Release);
                t2.answer("gpu0", ticket, Some(("host-a".into(), token)), token as i64 + 1);
            }
        });
        let mut checked = 0u64;
        while checked < 200_000 && !answering.is_finished() {
            let v = published.load(Ordering::Acquire);
            let (ticket, token) = (v >> 32, v & 0xffff_ffff);
            if ticket == 0 {
                std::thread::yield_now();
                continue;
            }
            // Not answered yet (unknown), or answered with the claim (valid): never refused —
            // unless the next claim came meanwhile (this one is stale then), which a second
            // look at what was published tells.
            let verdict = t.verdict("gpu0", "host-a", token, Some(ticket));
            if published.load(Ordering::Acquire) != v {
                continue;
            }
            if let ClaimVerdict::Refused(w) = verdict {
                done.store(true, Ordering::Release);
                panic!("token {token}, ticket {ticket}: {w}");
            }
            checked += 1;
        }
        done.store(true, Ordering::Release);
        assert!(answering.join().is_ok());
        assert_eq!(checked, 200_000, "the answers ran out before the checks");
    }

    #[test]
    fn a_token_is_valid_unknown_or_refused_by_what_the_table_has_read() {
        let t = ClaimTable::default();
        t.reset(HashMap::from([("gpu0".into(), ("host-a".into(), 10))]), 12);
        assert_eq!(t.verdict("gpu0", "host-a", 10, None), ClaimVerdict::Valid);
        assert!(matches!(t.verdict("gpu0", "host-b", 10, None), ClaimVerdict::Refused(_)));
        assert!(matches!(t.verdict("gpu0", "host-a", 9, None), ClaimVerdict::Refused(_)));
        // A token newer than what was read: not known yet.
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Unknown);
        // Tokens that are no etcd revision at all.
        for bad in [0, u64::MAX, i64::MAX as u64 + 1] {
            assert!(
                matches!(t.verdict("gpu0", "host-a", bad, None), ClaimVerdict::Refused(w) if w.contains("not a revision")),
                "{bad}"
            );
        }
        // A look-up at 15 says it is host-a's.
        let ticket = t.ticket();
        t.answer("gpu1", ticket, Some(("host-a".into(), 13)), 15);
        // A token beyond what that look-up read was never issued.
        assert!(
            matches!(t.verdict("gpu1", "host-a", 99, Some(ticket)), ClaimVerdict::Refused(w) if w.contains("never"))
        );
        assert_eq!(t.verdict("gpu1", "host-a", 99, Some(ticket + 1)), ClaimVerdict::Unknown);
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Valid);
        // A late watch event from before the look-up changes nothing.
        t.apply("gpu1", None, 14);
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Valid);
        // The delete at 16: gone, and the old token is refused.
        let g = t.generation.load(Ordering::Acquire);
        t.apply("gpu1", None, 16);
        assert!(t.generation.load(Ordering::Acquire) > g);
        assert!(matches!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Refused(_)));
        // gpu0 taken over by host-b at 20: host-a's token 10 is stale.
        t.apply("gpu0", Some(("host-b".into(), 20)), 20);
        assert!(
            matches!(t.verdict("gpu0", "host-a", 10, None), ClaimVerdict::Refused(w) if w.contains("stale"))
        );
    }
}
