//! What a pool agent counts, for the daemons' metrics: its leases and their renewals, the
//! fences it raised, the claims it made and how long each took, and etcd's errors.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A pool agent's counters, shared with whoever exposes them (read with [`Self::counts`]).
#[derive(Debug, Default)]
pub struct AgentStats {
    leases: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
    fences: AtomicU64,
    claims: AtomicU64,
    claim_ns: AtomicU64,
    releases: AtomicU64,
    etcd_errors: AtomicU64,
}

/// [`AgentStats`] at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentCounts {
    /// Leases granted to the agent.
    pub leases: u64,
    /// Lease renewals etcd answered.
    pub renewals: u64,
    /// Renewals that failed (etcd unreachable, slow, or the stream broken).
    pub renewal_failures: u64,
    /// Leases fenced: every device claimed under one was cut off (a host's) or the box's
    /// registration ended (a box's).
    pub fences: u64,
    /// Claims made (a host's).
    pub claims: u64,
    /// Nanoseconds the claims made took, together: the transaction rounds of each, from its
    /// first read to its committed claim.
    pub claim_ns: u64,
    /// Claims given back (a host's).
    pub releases: u64,
    /// Requests to etcd that failed.
    pub etcd_errors: u64,
}

impl AgentStats {
    pub(crate) fn lease(&self) {
        self.leases.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn renewed(&self, ok: bool) {
        let c = if ok { &self.renewals } else { &self.renewal_failures };
        c.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn fenced(&self) {
        self.fences.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn claimed(&self, took: Duration) {
        self.claims.fetch_add(1, Ordering::Relaxed);
        self.claim_ns.fetch_add(took.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }
    pub(crate) fn released(&self, n: usize) {
        self.releases.fetch_add(n as u64, Ordering::Relaxed);
    }
    pub(crate) fn etcd_error(&self) {
        self.etcd_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters now.
    pub fn counts(&self) -> AgentCounts {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AgentCounts {
            leases: r(&self.leases),
            renewals: r(&self.renewals),
            renewal_failures: r(&self.renewal_failures),
            fences: r(&self.fences),
            claims: r(&self.claims),
            claim_ns: r(&self.claim_ns),
            releases: r(&self.releases),
            etcd_errors: r(&self.etcd_errors),
        }
    }
}
