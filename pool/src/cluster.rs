//! [`EtcdCluster`]: a real etcd cluster of several members on 127.0.0.1, started from the
//! `etcd` binary (Debian's `etcd-server`) for the pool's tests and `dxpu bench pool`. Its
//! data lives in a directory of its own (on tmpfs where `/dev/shm` exists); every member is
//! killed when it is dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{PoolConfig, PoolError};

/// One member.
struct Member {
    name: String,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

/// A running cluster.
pub struct EtcdCluster {
    dir: PathBuf,
    members: Vec<Member>,
    token: String,
    /// What each member's command is run under (`ip netns exec NS`), if anything.
    wrap: Vec<String>,
    /// Every flag but names and addresses at etcd's default (keepalive, heartbeat,
    /// election): a cluster as an operator's stock etcd runs.
    stock: bool,
    /// TLS on the client port, with client certificates required (`--client-cert-auth`).
    tls: Option<crate::pki::TestPki>,
}

/// Where the `etcd` binary is, if anywhere (`$DXPU_ETCD`, then `PATH`, then `/usr/bin`).
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DXPU_ETCD") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join("etcd"))
        .find(|p| p.is_file())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl EtcdCluster {
    /// Starts `n` members on 127.0.0.1 and waits (up to 20 s) until the cluster has a leader
    /// and every member answers.
    pub fn start(n: usize) -> Result<EtcdCluster, PoolError> {
        EtcdCluster::started(|| EtcdCluster::start_with(n, "127.0.0.1", &[]))
    }

    /// The cluster `spawn` starts, once it is ready ([`EtcdCluster::wait_ready`], 20 s); a
    /// cluster that is not is stopped and started again on new ports, up to three times in
    /// all (a port found free may be taken by another socket before its member binds it:
    /// that member never joins). The last failure says what each member's log ended with.
    fn started(spawn: impl Fn() -> Result<EtcdCluster, PoolError>) -> Result<EtcdCluster, PoolError> {
        EtcdCluster::started_within(spawn, Duration::from_secs(20))
    }

    fn started_within(
        spawn: impl Fn() -> Result<EtcdCluster, PoolError>,
        within: Duration,
    ) -> Result<EtcdCluster, PoolError> {
        let mut attempt = 1;
        loop {
            let c = spawn()?;
            match c.wait_ready(within) {
                Ok(()) => return Ok(c),
                Err(e) if attempt < 3 => {
                    eprintln!(
                        "etcd cluster not ready (attempt {attempt} of 3: {e}); starting it again on new ports"
                    );
                }
                Err(e) => return Err(PoolError::Config(format!("{e}; {}", c.log_tails()))),
            }
            attempt += 1;
        }
    }

    /// The last lines of each member's log.
    fn log_tails(&self) -> String {
        let tail = |m: &Member| {
            let log = std::fs::read_to_string(self.dir.join(format!("{}.log", m.name))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            format!("{}'s log ends: {}", m.name, lines[lines.len().saturating_sub(3)..].join(" | "))
        };
        self.members.iter().map(tail).collect::<Vec<_>>().join("; ")
    }

    /// Starts `n` members whose client port speaks TLS with `pki`'s server certificate and
    /// requires a client certificate its CA signed (`--client-cert-auth`), and waits until the
    /// cluster has a leader ([`EtcdCluster::config`] then carries the CA and `pki`'s client
    /// certificate).
    pub fn start_tls(n: usize, pki: &crate::pki::TestPki) -> Result<EtcdCluster, PoolError> {
        EtcdCluster::started(|| {
            let mut c = EtcdCluster::prepare(n, "127.0.0.1", &[])?;
            for m in &mut c.members {
                m.client_url = m.client_url.replacen("http://", "https://", 1);
            }
            c.tls = Some(pki.clone());
            c.spawn_all()?;
            Ok(c)
        })
    }

    /// Starts `n` members with etcd's default flags but for names and addresses (its
    /// 5 s `--grpc-keepalive-min-time` among them, its 100 ms heartbeat and 1 s election
    /// timeout), as an operator's stock etcd, and waits until the cluster has a leader.
    pub fn start_stock(n: usize) -> Result<EtcdCluster, PoolError> {
        EtcdCluster::started(|| {
            let mut c = EtcdCluster::prepare(n, "127.0.0.1", &[])?;
            c.stock = true;
            c.spawn_all()?;
            Ok(c)
        })
    }

    /// Starts `n` members listening on `ip`, each command run under `wrap` (`["ip", "netns",
    /// "exec", NS]` puts them in a network namespace). Returns at once: call
    /// [`EtcdCluster::wait_ready`] from where `ip` can be reached.
    pub fn start_with(n: usize, ip: &str, wrap: &[&str]) -> Result<EtcdCluster, PoolError> {
        let mut c = EtcdCluster::prepare(n, ip, wrap)?;
        c.spawn_all()?;
        Ok(c)
    }

    fn spawn_all(&mut self) -> Result<(), PoolError> {
        let bin = etcd_binary().ok_or_else(|| {
            PoolError::Config("etcd not found (Debian package etcd-server, or set DXPU_ETCD)".into())
        })?;
        for i in 0..self.members.len() {
            self.spawn(i, &bin, "new")?;
        }
        Ok(())
    }

    /// The members' names, addresses and directory, none started.
    fn prepare(n: usize, ip: &str, wrap: &[&str]) -> Result<EtcdCluster, PoolError> {
        let base = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        let token = format!("dxpu-{}-{}", std::process::id(), crate::unix_now_nanos());
        let dir = base.join(&token);
        std::fs::create_dir_all(&dir).map_err(|e| PoolError::Config(format!("{}: {e}", dir.display())))?;
        let io = |e: std::io::Error| PoolError::Config(format!("starting etcd: {e}"));
        let mut members = Vec::new();
        for i in 0..n {
            members.push(Member {
                name: format!("m{i}"),
                client_url: format!("http://{ip}:{}", free_port().map_err(io)?),
                peer_url: format!("http://{ip}:{}", free_port().map_err(io)?),
                child: None,
            });
        }
        Ok(EtcdCluster {
            dir,
            members,
            token,
            wrap: wrap.iter().map(|w| w.to_string()).collect(),
            stock: false,
            tls: None,
        })
    }

    fn spawn(&mut self, i: usize, bin: &std::path::Path, state: &str) -> Result<(), PoolError> {
        let initial: Vec<String> =
            self.members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect();
        let m = &self.members[i];
        let data = self.dir.join(&m.name);
        let log = std::fs::File::create(self.dir.join(format!("{}.log", m.name)))
            .map_err(|e| PoolError::Config(format!("etcd log: {e}")))?;
        let mut cmd = match self.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        if !self.stock {
            // Elections in half a second, not the WAN-sized defaults: this is one machine.
            cmd.args(["--heartbeat-interval", "50", "--election-timeout", "500"]);
        }
        if let Some(p) = &self.tls {
            cmd.arg("--cert-file").arg(&p.server_cert).arg("--key-file").arg(&p.server_key);
            cmd.arg("--trusted-ca-file").arg(&p.ca).arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &m.client_url, "--advertise-client-urls", &m.client_url])
            .args(["--listen-peer-urls", &m.peer_url, "--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", state, "--initial-cluster-token", &self.token])
            .args(["--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| PoolError::Config(format!("starting {}: {e}", bin.display())))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until a write through the cluster succeeds and every member running (not
    /// [`EtcdCluster::kill`]ed) answers a read — it is listening, has joined and knows the
    /// leader: a test that then kills one of three has two.
    pub fn wait_ready(&self, within: Duration) -> Result<(), PoolError> {
        let running = self.members.iter().filter(|m| m.child.is_some()).map(|m| m.client_url.clone());
        EtcdCluster::wait_members(&self.config(), running.collect(), within)
    }

    /// [`EtcdCluster::wait_ready`] for the cluster `cfg` names, every endpoint a member
    /// that must answer (from another thread, one that can reach it: a network
    /// namespace's).
    pub fn wait_ready_for(cfg: &PoolConfig, within: Duration) -> Result<(), PoolError> {
        EtcdCluster::wait_members(cfg, cfg.etcd.clone(), within)
    }

    fn wait_members(cfg: &PoolConfig, members: Vec<String>, within: Duration) -> Result<(), PoolError> {
        let end = Instant::now() + within;
        let cfg = cfg.clone();
        loop {
            let r = crate::block_on(async {
                let mut c = crate::connect(&cfg).await?;
                c.put("/dxpu-cluster-ready", "1", None)
                    .await
                    .map_err(|e| crate::etcd_error(&cfg, "probing", e))?;
                for e in &members {
                    let one = PoolConfig { etcd: vec![e.clone()], ..cfg.clone() };
                    let mut c = crate::connect(&one).await?;
                    c.get("/dxpu-cluster-ready", None)
                        .await
                        .map_err(|e| crate::etcd_error(&one, "probing a member", e))?;
                }
                Ok::<(), PoolError>(())
            })?;
            match r {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= end => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The client URLs of every member (running or not).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// A pool configuration for this cluster (prefix `/dxpu`, 5 s leases; over TLS with the
    /// CA and the client certificate where it speaks TLS).
    pub fn config(&self) -> PoolConfig {
        let mut c = PoolConfig::new(self.endpoints());
        if let Some(p) = &self.tls {
            c.security.cacert = Some(p.ca.clone());
            c.security.cert = Some(p.client_cert.clone());
            c.security.key = Some(p.client_key.clone());
        }
        c
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members.get_mut(i).and_then(|m| m.child.take()) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again on its data (after [`EtcdCluster::kill`]).
    pub fn restart(&mut self, i: usize) -> Result<(), PoolError> {
        let bin = etcd_binary().ok_or_else(|| PoolError::Config("etcd not found".into()))?;
        self.spawn(i, &bin, "existing")
    }

    /// The directory holding the members' data and logs.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_whose_member_never_answers_is_started_again_on_new_ports() {
        if etcd_binary().is_none() {
            eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
            return;
        }
        // The member's client port taken first by a socket that accepts and never answers,
        // as a port found free and taken before the member binds it: the member exits, and
        // requests to the port wait.
        let Ok(hung) = TcpListener::bind("127.0.0.1:0") else { return };
        let Ok(addr) = hung.local_addr() else { return };
        let taken = format!("http://{addr}");
        let first = std::sync::atomic::AtomicBool::new(true);
        let spawn = || {
            let mut c = EtcdCluster::prepare(1, "127.0.0.1", &[])?;
            if first.swap(false, std::sync::atomic::Ordering::Relaxed) {
                c.members[0].client_url = taken.clone();
            }
            c.spawn_all()?;
            Ok(c)
        };
        let c = EtcdCluster::started_within(spawn, Duration::from_secs(5));
        assert!(c.as_ref().is_ok_and(|c| c.endpoints() != [taken.clone()]), "{:?}", c.err());
    }
}
