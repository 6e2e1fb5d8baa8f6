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
    let mut error = e.to_string();
    // What lies at the bottom of a transport's error (the TLS alert, the refused
    // connection), where the message does not say it already.
    let mut deepest = None;
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        deepest = Some(s.to_string());
        source = s.source();
    }
    if let Some(d) = deepest.filter(|d| !error.contains(d.as_str())) {
        error = format!("{error}: {d}");
    }
    let transport = matches!(&e, etcd::Error::Transport(_))
        || matches!(&e, etcd::Error::GRpcStatus(s) if matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable));
    if transport && cfg.security.tls() && !error.contains("certificate") {
        error.push_str(
            " (over TLS: etcd must accept this client's certificate — cert and key, signed by the CA of its \
             --trusted-ca-file — and cacert must be the CA that signed etcd's)",
        );
    } else if transport && !cfg.security.tls() && cfg.etcd.iter().all(|u| u.starts_with("http://")) {
        error.push_str(" (if etcd's client port speaks TLS, give https:// endpoints and cacert)");
    }
    PoolError::Etcd { endpoints: cfg.etcd.join(","), what: what.to_string(), error }
}
