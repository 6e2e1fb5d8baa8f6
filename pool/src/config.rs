//! Where the pool is and how to talk to it: etcd's endpoints, the key prefix, the lease and
//! the requests' deadline, each checked and named as the file names it.

use std::time::Duration;

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
    /// TLS to etcd and an etcd user (none by default).
    pub security: crate::EtcdSecurity,
}

impl PoolConfig {
    /// The defaults for `etcd`: prefix `/dxpu`, a 5 s lease, 1 s requests.
    pub fn new(etcd: Vec<String>) -> PoolConfig {
        PoolConfig {
            etcd,
            prefix: "/dxpu".into(),
            lease_ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(1),
            security: crate::EtcdSecurity::default(),
        }
    }

    /// Checks what a configuration file or command line gave.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.etcd.is_empty() {
            return Err(ConfigError::NoEndpoint);
        }
        for u in &self.etcd {
            if !(u.starts_with("http://") || u.starts_with("https://")) || u.len() < 8 {
                return Err(ConfigError::NotAnEndpoint(u.clone()));
            }
        }
        self.security.validate(&self.etcd).map_err(|e| ConfigError::Security(e.to_string()))?;
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

/// An etcd endpoint as a URL: `http://host:port` or `https://host:port` as given, or
/// `host:port` (etcdctl's `--endpoints` form) made one — `http://`.
pub fn etcd_url(s: &str) -> Result<String, ConfigError> {
    etcd_url_for(s, false)
}

/// [`etcd_url`], `host:port` made `https://` where `tls` (a CA or certificate given, as
/// etcdctl does with `--cacert`).
pub fn etcd_url_for(s: &str, tls: bool) -> Result<String, ConfigError> {
    let s = s.trim();
    let url = if s.starts_with("http://") || s.starts_with("https://") {
        s.to_string()
    } else if tls {
        format!("https://{s}")
    } else {
        format!("http://{s}")
    };
    let rest = url.split_once("://").map_or("", |(_, r)| r);
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
    /// The TLS files or the user (`EtcdSecurity::validate`).
    #[error("{0}")]
    Security(String),
    /// Neither a URL nor host:port.
    #[error("etcd = {0:?}: not an etcd endpoint (host:port, http://host:port or https://host:port)")]
    NotAnEndpoint(String),
    /// A lease outside 2..=3600 whole seconds.
    #[error("lease_ttl_s = {0:?}: must be whole seconds from 2 to 3600")]
    LeaseTtl(Duration),
    /// A prefix without its leading slash, or with a trailing one.
    #[error("prefix = {0:?}: must start with '/' and not end with one")]
    Prefix(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_taken_as_urls_or_host_port() {
        assert_eq!(etcd_url("10.0.0.2:2379").unwrap(), "http://10.0.0.2:2379");
        assert_eq!(etcd_url("http://h:1").unwrap(), "http://h:1");
        assert_eq!(etcd_url("[::1]:2379").unwrap(), "http://[::1]:2379");
        assert_eq!(etcd_url("https://h:1").unwrap(), "https://h:1");
        assert_eq!(etcd_url_for("h:1", true).unwrap(), "https://h:1");
        for bad in ["h", "h:0", ":2379", "h:99999", "", "https://h"] {
            assert!(etcd_url(bad).is_err(), "{bad}");
        }
    }
}
