//! Why a pool operation failed.

use crate::config::{ConfigError, PoolConfig};
use crate::etcd;

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

pub(crate) fn etcd_error(cfg: &PoolConfig, what: &str, e: etcd::Error) -> PoolError {
    PoolError::Etcd { endpoints: cfg.etcd.join(","), what: what.to_string(), error: e.to_string() }
}
