//! The pool: GPUs in boxes, registered in etcd, claimed by hosts, fenced (`docs/pool.md`).
//!
//! This is the control plane; the datapath crates do not depend on it. The box side
//! ([`BoxAgent`]) registers each exported device under a lease it keeps alive and watches the
//! claims on its devices; the endpoint asks it (through `bridge_gpu::ClaimCheck`) whether an
//! attach's fencing token is the claim etcd holds. The host side ([`HostAgent`]) claims free
//! devices with transactions tied to its own lease, hands each claim to its endpoint to
//! attach, and raises a fence on every pool device before its lease could expire when it
//! cannot renew it. [`admin`] is what `dxpu pool` runs.
//!
//! Keys, under a prefix (`/dxpu` by default):
//!
//! | key | value | lease |
//! |---|---|---|
//! | `{prefix}/devices/{box}/{device}` | [`DeviceRecord`] | the box's |
//! | `{prefix}/claims/{box}/{device}` | [`ClaimRecord`] | the claiming host's |
//! | `{prefix}/drain/{box}/{device}` | [`DrainRecord`] | none (an operator's) |
//!
//! A claim's fencing token is its `create_revision`: etcd's revision counter only grows, so
//! a later claim on the same device always has a larger token.
#![forbid(unsafe_code)]

pub mod admin;
mod box_agent;
mod claim;
pub mod cluster;
pub mod etcd;
mod host_agent;
mod keys;
pub mod storm;

use std::time::Duration;

pub use box_agent::{BoxAgent, ClaimTable};
pub use claim::{
    Claim, ClaimRequest, Filter, RecordCache, RoundTrips, Snapshot, claim_one, release, snapshot,
};
pub use host_agent::{FenceFn, HostAgent, HostAgentOptions, HostEvent, fence_margin};
pub use keys::{Keys, valid_name};

use serde::{Deserialize, Serialize};

/// Where the pool is and how to talk to it.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// etcd client URLs (`http://127.0.0.1:2379`), at least one.
    pub etcd: Vec<String>,
    /// Key prefix (default `/dxpu`).
    pub prefix: String,
    /// Time to live of this agent's lease.
    pub lease_ttl: Duration,
    /// How long one etcd request may take before it counts as failed.
    pub request_timeout: Duration,
}

impl PoolConfig {
    /// The defaults for `etcd`: prefix `/dxpu`, a 5 s lease, 1 s requests.
    pub fn new(etcd: Vec<String>) -> PoolConfig {
        PoolConfig {
            etcd,
            prefix: "/dxpu".into(),
            lease_ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
        }
    }

    /// Checks what a configuration file or command line gave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.etcd.is_empty() {
            return Err(ConfigError::NoEndpoint);
        }
        for u in &self.etcd {
            if u.starts_with("https://") {
                return Err(ConfigError::Tls(u.clone()));
            }
            if !u.starts_with("http://") || u.len() < 8 {
                return Err(ConfigError::NotAnEndpoint(u.clone()));
            }
        }
        let ttl = self.lease_ttl.as_secs();
        if !(2..=3600).contains(&ttl) || self.lease_ttl.subsec_nanos() != 0 {
            return Err(ConfigError::LeaseTtl(self.lease_ttl));
        }
        if !self.prefix.starts_with('/') || self.prefix.ends_with('/') {
            return Err(ConfigError::Prefix(self.prefix.clone()));
        }
        Ok(())
    }
}

/// An etcd endpoint as a URL: `http://host:port` as given, or `host:port` (etcdctl's
/// `--endpoints` form) made one. TLS (`https://`) is not supported.
pub fn etcd_url(s: &str) -> Result<String, ConfigError> {
    let s = s.trim();
    if s.starts_with("https://") {
        return Err(ConfigError::Tls(s.to_string()));
    }
    let url = if s.starts_with("http://") { s.to_string() } else { format!("http://{s}") };
    let rest = &url["http://".len()..];
    let hostport = rest.split('/').next().unwrap_or_default();
    match hostport.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => Ok(url),
        _ => Err(ConfigError::NotAnEndpoint(s.to_string())),
    }
}

/// What is wrong with a pool's configuration, named as the file names it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No etcd endpoint given.
    #[error("etcd: at least one etcd endpoint is needed")]
    NoEndpoint,
    /// An https:// endpoint.
    #[error(
        "etcd = {0:?}: TLS to etcd is not supported yet; give http://host:port or host:port of a member on a trusted network"
    )]
    Tls(String),
    /// Neither a URL nor host:port.
    #[error("etcd = {0:?}: not an etcd endpoint (host:port, or http://host:port)")]
    NotAnEndpoint(String),
    /// A lease outside 2..=3600 whole seconds.
    #[error("lease_ttl_s = {0:?}: must be whole seconds from 2 to 3600")]
    LeaseTtl(Duration),
    /// A prefix without its leading slash, or with a trailing one.
    #[error("prefix = {0:?}: must start with '/' and not end with one")]
    Prefix(String),
}

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// etcd did not answer, or answered with an error (no quorum, a timeout, a refusal).
    #[error("etcd ({endpoints}): {what}: {error}")]
    Etcd {
        /// The endpoints tried.
        endpoints: String,
        /// What was being done.
        what: String,
        /// etcd's error.
        error: String,
    },
    /// A value in etcd that is not what dxpu wrote there.
    #[error("etcd key {key}: {why}")]
    BadRecord {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A device named that the pool does not hold.
    #[error("{0}")]
    NotFound(String),
    /// The configuration is inconsistent.
    #[error("{0}")]
    Config(String),
    /// A pool setting is wrong.
    #[error(transparent)]
    Setting(#[from] ConfigError),
    /// Another box holds this box's name: this one does not register its devices (the
    /// other's records stay theirs) until the other's lease ends.
    #[error(
        "box name {box_name:?} is held by another dxpu gpu: {by} (lease {lease:x}); this box does not \
         register its devices while it does — give it another [pool] box, or stop the other"
    )]
    NameHeld {
        /// The name.
        box_name: String,
        /// Who holds it, as its record says.
        by: String,
        /// The holder's lease.
        lease: i64,
    },
}

/// A device as its box registers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// Where hosts reach the box (`10.0.0.7:7440`).
    pub advertise: String,
    /// PCI Vendor ID.
    pub vendor_id: u16,
    /// PCI Device ID.
    pub device_id: u16,
    /// Class code.
    pub class: u32,
    /// Bytes of VRAM (its largest BAR).
    pub vram_bytes: u64,
    /// `ok` or why not.
    pub health: String,
    /// Hosts that may claim it (`*`: any host; a box publishes its `allow` list).
    pub allow: Vec<String>,
    /// Registered since (Unix seconds).
    pub since: u64,
}

/// The box that holds a box name (`{prefix}/boxes/{box}`), under the lease its devices'
/// records live by: a second box started with the same name finds it and does not register.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxRecord {
    /// This run of the box (a random number): its own record, left under an older lease,
    /// is taken back; another's is not.
    pub instance: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process.
    pub pid: u32,
    /// Where hosts reach it.
    pub advertise: String,
    /// Holding the name since (Unix seconds).
    pub since: u64,
}

impl std::fmt::Display for BoxRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = unix_now().saturating_sub(self.since);
        write!(
            f,
            "pid {} on {} advertising {}, since {} (Unix seconds; {ago} s ago)",
            self.pid, self.host, self.advertise, self.since
        )
    }
}

/// A host's claim on a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The host that holds it.
    pub host: String,
    /// Claimed since (Unix seconds).
    pub since: u64,
}

/// An operator's drain: no new claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// Draining since (Unix seconds).
    pub since: u64,
}

/// Nanoseconds since the Unix epoch (a unique-enough name part).
pub(crate) fn unix_now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Connects to the cluster: requests fail after `request_timeout`, and fail rather than wait
/// where the member has no leader (a cluster without quorum answers at once); HTTP/2 pings
/// at etcd's pace (`etcd::KEEPALIVE_INTERVAL`).
pub async fn connect(cfg: &PoolConfig) -> Result<etcd::Client, PoolError> {
    let opts = etcd::ConnectOptions {
        timeout: cfg.request_timeout,
        connect_timeout: cfg.request_timeout,
        require_leader: true,
        keep_alive_interval: etcd::KEEPALIVE_INTERVAL,
    };
    etcd::Client::connect(&cfg.etcd, opts).await.map_err(|e| etcd_error(cfg, "connecting", e))
}

pub(crate) fn etcd_error(cfg: &PoolConfig, what: &str, e: etcd::Error) -> PoolError {
    PoolError::Etcd { endpoints: cfg.etcd.join(","), what: what.to_string(), error: e.to_string() }
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(kv: &etcd::KeyValue) -> Result<T, PoolError> {
    serde_json::from_slice(kv.value()).map_err(|e| PoolError::BadRecord {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        why: format!("not a dxpu record: {e}"),
    })
}

/// Logs a record that is not dxpu's, once per key and revision: listings run several times
/// a second, and one bad key must not flood the log (it is said again when it changes).
pub(crate) fn warn_bad_record(kv: &etcd::KeyValue, e: &PoolError, fix: &str) -> bool {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    /// Keys and revisions already said.
    type Said = Mutex<HashSet<(Vec<u8>, i64)>>;
    static SAID: OnceLock<Said> = OnceLock::new();
    let mut said = SAID.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if said.len() >= 4096 {
        said.clear();
    }
    let new = said.insert((kv.key().to_vec(), kv.mod_revision()));
    if new {
        log::warn!("{e} (revision {}; {fix})", kv.mod_revision());
    }
    new
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_vec(v).unwrap_or_default()
}

/// The waits between attempts in a row that fail (etcd unreachable, a box that does not
/// answer): exponential from `min` to `max`, each with a random jitter of up to itself
/// (backon's `ExponentialBuilder`), so that agents cut off together do not come back in
/// step; [`Backoff::reset`] after a success.
#[derive(Debug)]
pub struct Backoff {
    builder: backon::ExponentialBuilder,
    waits: backon::ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// From `min`, doubling, to `max`.
    pub fn new(min: Duration, max: Duration) -> Backoff {
        let builder = backon::ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times();
        Backoff { builder, waits: backon::BackoffBuilder::build(builder), max }
    }

    /// How long to wait before the next attempt.
    pub fn next_wait(&mut self) -> Duration {
        self.waits.next().unwrap_or(self.max)
    }

    /// The next failure waits `min` again.
    pub fn reset(&mut self) {
        self.waits = backon::BackoffBuilder::build(self.builder);
    }
}

/// A current-thread runtime for an agent's thread.
pub(crate) fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()
}

/// The runtime for a one-off admin call from synchronous code.
pub fn block_on<F: std::future::Future>(f: F) -> Result<F::Output, PoolError> {
    let rt = runtime().map_err(|e| PoolError::Config(format!("tokio runtime: {e}")))?;
    Ok(rt.block_on(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing runs several times a second: a bad record is said once per revision (on
    /// 9b5fbd6, about five times a second for as long as it stayed).
    #[test]
    fn endpoints_are_taken_as_urls_or_host_port() {
        assert_eq!(etcd_url("10.0.0.2:2379").unwrap(), "http://10.0.0.2:2379");
        assert_eq!(etcd_url("http://h:1").unwrap(), "http://h:1");
        assert_eq!(etcd_url("[::1]:2379").unwrap(), "http://[::1]:2379");
        for bad in ["https://h:1", "h", "h:0", ":2379", "h:99999", ""] {
            assert!(etcd_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_bad_record_is_warned_about_once_per_revision() {
        let kv =
            |rev| etcd::KeyValue { key: b"/t/claims/b/d".to_vec(), mod_revision: rev, ..Default::default() };
        let e = PoolError::BadRecord { key: "/t/claims/b/d".into(), why: "not a dxpu record".into() };
        assert!(warn_bad_record(&kv(7), &e, "fix"));
        for _ in 0..10 {
            assert!(!warn_bad_record(&kv(7), &e, "fix"));
        }
        assert!(warn_bad_record(&kv(8), &e, "fix"), "changed: said again");
    }
}
