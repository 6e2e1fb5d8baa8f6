//! How the pool's client checks etcd and proves itself to it, with etcdctl's names: TLS to
//! etcd's client port — its certificate checked against `cacert`, this client's own
//! certificate and key (`cert`, `key`) where etcd asks for one (`--client-cert-auth`) — and
//! an etcd user (`user`, its password) where etcd has authentication on (`etcdctl auth
//! enable`). The server's name checked, and sent as SNI, is the endpoint's host.

use std::path::{Path, PathBuf};

/// TLS files and an etcd user; all unset: plain HTTP/2, no user.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdSecurity {
    /// The CA certificate (PEM) that signed etcd's server certificates.
    pub cacert: Option<PathBuf>,
    /// This client's certificate (PEM), for an etcd that asks for one.
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The etcd user to authenticate as.
    pub user: Option<String>,
    /// Its password.
    pub password: Option<String>,
}

impl std::fmt::Debug for EtcdSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdSecurity")
            .field("cacert", &self.cacert)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// What is wrong with the TLS files or the user, naming the file or the setting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    /// A file that cannot be read.
    #[error("{what} = {path:?}: {problem}")]
    File {
        /// Which setting (`cacert`, `cert`, `key`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it cannot be used.
        problem: String,
    },
    /// Settings that do not go together.
    #[error("{0}")]
    Mismatch(String),
}

impl EtcdSecurity {
    /// Whether the client speaks TLS to etcd.
    pub fn tls(&self) -> bool {
        self.cacert.is_some() || self.cert.is_some()
    }

    /// Checks what goes together — a certificate with its key, a user with its password, TLS
    /// settings with `https://` endpoints (and `https://` with a CA to check it by) — and
    /// that the TLS files are readable PEM.
    pub fn validate(&self, endpoints: &[String]) -> Result<(), SecurityError> {
        let mismatch = |s: &str| Err(SecurityError::Mismatch(s.to_string()));
        if self.cert.is_some() != self.key.is_some() {
            return mismatch(
                "cert and key: give both (this client's certificate and its private key) or neither",
            );
        }
        if self.user.is_some() != self.password.is_some() {
            return mismatch("user and password: give both (etcd's `user:password`) or neither");
        }
        if self.user.as_deref().is_some_and(|u| u.is_empty() || u.contains(':')) {
            return mismatch("user: must be a name without ':' (the password goes apart)");
        }
        let https = endpoints.iter().filter(|e| e.starts_with("https://")).count();
        if https != 0 && https != endpoints.len() {
            return mismatch("etcd: give every endpoint https://, or none");
        }
        if https > 0 && self.cacert.is_none() {
            return mismatch(
                "etcd: https:// endpoints need cacert, the CA certificate (PEM) that signed etcd's server certificate",
            );
        }
        if https == 0 && self.tls() {
            return mismatch("cacert, cert and key are for TLS: give the endpoints as https://host:port");
        }
        // The files read now, so that a start (or `--check`) names one that cannot be used.
        if self.tls() {
            self.tls_config()?;
        }
        Ok(())
    }

    /// The client's TLS configuration: the CA read, and this client's identity where given.
    pub(crate) fn tls_config(&self) -> Result<tonic::transport::ClientTlsConfig, SecurityError> {
        use tonic::transport::{Certificate, ClientTlsConfig, Identity};
        let mut c = ClientTlsConfig::new();
        if let Some(ca) = &self.cacert {
            c = c.ca_certificate(Certificate::from_pem(pem("cacert", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            c = c.identity(Identity::from_pem(pem("cert", cert)?, pem("key", key)?));
        }
        Ok(c)
    }
}

/// A PEM file's bytes: refused if unreadable or not PEM.
fn pem(what: &'static str, path: &Path) -> Result<Vec<u8>, SecurityError> {
    let file = |problem: String| SecurityError::File { what, path: path.to_path_buf(), problem };
    let bytes = std::fs::read(path).map_err(|e| {
        file(match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                format!("{e} (the service runs as user dxpu on a host: give it read access)")
            }
            _ => e.to_string(),
        })
    })?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(file("not a PEM file (no -----BEGIN line)".into()));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn urls(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn what_does_not_go_together_is_refused_naming_it() {
        let ca = Some(PathBuf::from("/nonexistent/ca.pem"));
        let dir = std::env::temp_dir().join(format!("dxpu-sec-v-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
        let ok = EtcdSecurity { cacert: Some(dir.join("ca.pem")), ..Default::default() };
        assert!(ok.validate(&urls(&["https://h:1"])).is_ok());
        let missing = EtcdSecurity { cacert: ca, ..Default::default() };
        assert!(missing.validate(&urls(&["https://h:1"])).unwrap_err().to_string().contains("/ca.pem"));
        for (s, e, says) in [
            (EtcdSecurity::default(), urls(&["https://h:1"]), "need cacert"),
            (ok.clone(), urls(&["http://h:1"]), "are for TLS"),
            (ok.clone(), urls(&["https://h:1", "http://h:2"]), "or none"),
            (EtcdSecurity { cert: Some("/c".into()), ..ok.clone() }, urls(&["https://h:1"]), "cert and key"),
            (
                EtcdSecurity { user: Some("u".into()), ..Default::default() },
                urls(&["http://h:1"]),
                "user and password",
            ),
            (
                EtcdSecurity { user: Some("u:p".into()), password: Some("p".into()), ..Default::default() },
                urls(&["http://h:1"]),
                "without ':'",
            ),
        ] {
            let err = s.validate(&e).unwrap_err().to_string();
            assert!(err.contains(says), "{s:?} {e:?}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_password_never_shows_in_debug_and_a_file_that_is_not_pem_is_named() {
        let s =
            EtcdSecurity { user: Some("u".into()), password: Some("sekrit".into()), ..Default::default() };
        assert!(!format!("{s:?}").contains("sekrit"));
        let dir = std::env::temp_dir().join(format!("dxpu-sec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("ca.pem");
        std::fs::write(&f, "not a certificate").unwrap();
        let err = pem("cacert", &f).unwrap_err().to_string();
        assert!(err.contains("cacert") && err.contains("not a PEM file"), "{err}");
        let err = pem("cacert", &dir.join("missing.pem")).unwrap_err().to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
