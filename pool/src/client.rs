//! Talking to etcd from the agents and the admin calls: the connection, the runtimes, and
//! the waits between attempts that fail.

use std::time::Duration;

use crate::config::PoolConfig;
use crate::error::{PoolError, etcd_error};
use crate::etcd;

/// A lease of `cfg`'s TTL from etcd, counted in `stats` (or its error).
pub(crate) async fn grant_lease(
    client: &mut etcd::Client,
    cfg: &PoolConfig,
    stats: &crate::AgentStats,
) -> Result<i64, PoolError> {
    match client.lease_grant(cfg.lease_ttl.as_secs() as i64).await {
        Ok(r) => {
            stats.lease();
            Ok(r.id())
        }
        Err(e) => {
            stats.etcd_error();
            Err(etcd_error(cfg, "granting a lease", e))
        }
    }
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
    etcd::Client::connect_secure(&cfg.etcd, opts, &cfg.security)
        .await
        .map_err(|e| etcd_error(cfg, "connecting", e))
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
