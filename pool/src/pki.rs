//! [`TestPki`]: a certificate authority and the certificates a TLS etcd and its clients use,
//! made with the `openssl` command (Debian's `openssl`) for the pool's tests: a server
//! certificate for 127.0.0.1, client certificates, and a second, unrelated CA to be refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::PoolError;

/// The files, in one directory.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// etcd's certificate (subjectAltName IP:127.0.0.1) and key.
    pub server_cert: PathBuf,
    /// Its key.
    pub server_key: PathBuf,
    /// A client certificate (common name `root`, etcd's user for certificate authentication).
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
    /// Another CA's certificate, which signed none of these.
    pub other_ca: PathBuf,
}

/// Where the `openssl` command is, if anywhere.
pub fn openssl_binary() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("openssl"))
        .find(|p| p.is_file())
}

impl TestPki {
    /// Makes the files in `dir` (P-256 keys, valid for two days).
    pub fn generate(dir: &Path) -> Result<TestPki, PoolError> {
        let bin = openssl_binary()
            .ok_or_else(|| PoolError::Config("openssl not found (Debian package openssl)".into()))?;
        std::fs::create_dir_all(dir).map_err(|e| PoolError::Config(format!("{}: {e}", dir.display())))?;
        let f = |name: &str| dir.join(name);
        let run = |args: &[&str]| -> Result<(), PoolError> {
            let out = Command::new(&bin)
                .args(args)
                .current_dir(dir)
                .output()
                .map_err(|e| PoolError::Config(format!("openssl: {e}")))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(PoolError::Config(format!(
                    "openssl {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )))
            }
        };
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for ca in ["ca", "other-ca"] {
            let (k, c) = (format!("{ca}.key"), format!("{ca}.pem"));
            let subj = format!("/CN=dxpu test {ca}");
            let mut a = vec!["req", "-x509"];
            a.extend(key);
            a.extend(["-keyout", &k, "-out", &c, "-days", "2", "-subj", &subj]);
            run(&a)?;
        }
        for (name, cn, ext) in [
            ("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
            ("client", "root", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (k, csr, c, e) =
                (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.ext"));
            std::fs::write(f(&e), ext).map_err(|e| PoolError::Config(format!("{}: {e}", dir.display())))?;
            let subj = format!("/CN={cn}");
            let mut a = vec!["req"];
            a.extend(key);
            a.extend(["-keyout", &k, "-out", &csr, "-subj", &subj]);
            run(&a)?;
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &c,
                "-days",
                "2",
                "-extfile",
                &e,
            ])?;
        }
        Ok(TestPki {
            ca: f("ca.pem"),
            server_cert: f("server.pem"),
            server_key: f("server.key"),
            client_cert: f("client.pem"),
            client_key: f("client.key"),
            other_ca: f("other-ca.pem"),
        })
    }
}
