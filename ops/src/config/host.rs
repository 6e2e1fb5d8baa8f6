//! `dxpu host`'s file: its pool, what it configures, what a reload may change.

use std::net::SocketAddr;
use std::time::Duration;

use bridge_host::AttachOptions;

use super::{
    AttachSection, ConfigError, DEFAULT_PORT, HostFile, HostPool, LinkOverride, ServedSocket, bad, id_of,
    key, physical_memory_mib, pool_config, socket_addr,
};

impl HostFile {
    /// `[pool]`, if the file has one.
    pub fn pool(&self) -> Result<Option<HostPool>, ConfigError> {
        let Some(p) = &self.pool else { return Ok(None) };
        let config = pool_config(&p.etcd, &p.etcd_access, p.lease_ttl_s, &p.prefix)?;
        if !pool::valid_name(&p.host) {
            return Err(bad("pool.host", format!("\"{}\"", p.host), "must be 1-64 of A-Z a-z 0-9 - _ ."));
        }
        if !(1..=64).contains(&p.want) {
            return Err(bad("pool.want", p.want, "must be 1..=64 devices"));
        }
        for (i, b) in p.boxes.iter().enumerate() {
            if !pool::valid_name(b) {
                return Err(bad(&format!("pool.boxes[{i}]"), format!("\"{b}\""), "not a box name"));
            }
        }
        if let Some(d) = &p.vfio_user_dir
            && !d.is_dir()
        {
            return Err(bad("pool.vfio_user_dir", d.display(), "not a directory"));
        }
        let k = key("pool", &p.key, &p.key_file)?;
        let link = self.link.settings(k.clone())?;
        // The server is each claim's box; this one is replaced.
        let mut o = AttachOptions::new(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)), "", k);
        o.link = link.config;
        o.driver = link.driver;
        o.offload = link.offload;
        o.poll = link.poll;
        o.impairment = self.impairment.impairment()?;
        let agent = pool::HostAgentOptions {
            host: p.host.clone(),
            want: p.want,
            filter: pool::Filter { vendor_id: p.vendor_id, device_id: p.device_id, boxes: p.boxes.clone() },
            cool_down: Duration::from_secs(2),
        };
        let given = [&p.vfio_user_socket_group, &p.vfio_user_socket_owner].iter().any(|v| v.is_some());
        if p.vfio_user_dir.is_none() && (given || p.vfio_user_socket_mode.is_some()) {
            return Err(bad("pool.vfio_user_socket_mode", "given", "only with vfio_user_dir"));
        }
        let socket_access = socket_access(
            "pool",
            p.vfio_user_socket_mode,
            p.vfio_user_socket_group.as_deref(),
            p.vfio_user_socket_owner.as_deref(),
        )?;
        Ok(Some(HostPool {
            config,
            agent,
            template: o,
            vfio_user_dir: p.vfio_user_dir.clone(),
            socket_access,
        }))
    }
}

impl HostFile {
    /// The command line's `--driver` and `--poll` over the file's.
    pub fn override_link(&mut self, over: LinkOverride) {
        self.link.over = over;
    }

    /// The settings a reload cannot change: the names of those that differ in `new`.
    pub fn restart_only_changes(&self, new: &HostFile) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, same) in [
            ("[link]", self.link == new.link),
            ("[impairment]", self.impairment == new.impairment),
            ("[pool]", self.pool == new.pool),
            ("[control]", self.control == new.control),
            ("[metrics]", self.metrics == new.metrics),
        ] {
            if !same {
                out.push(name);
            }
        }
        out
    }

    /// Whether `[[attach]]` number `i` reads the same in `other`'s number `j`.
    pub fn same_attach(&self, i: usize, other: &HostFile, j: usize) -> bool {
        self.attach.get(i).is_some_and(|a| other.attach.get(j) == Some(a))
    }

    /// One set of attach options per `[[attach]]`; `server` overrides every server address.
    #[cfg(test)]
    pub fn options(&self, server: Option<&str>) -> Result<Vec<AttachOptions>, ConfigError> {
        Ok(self.attachments(server)?.into_iter().map(|(o, _)| o).collect())
    }

    /// Each `[[attach]]`'s options with the vfio-user socket it is served on, if any. A
    /// device served to a VMM has no DMA arena (the VMM grants guest memory), no service
    /// thread (the server's thread drives the link) and, unless the file says otherwise,
    /// the portable link driver (its socket is what the server waits on).
    pub fn attachments(
        &self,
        server: Option<&str>,
    ) -> Result<Vec<(AttachOptions, Option<ServedSocket>)>, ConfigError> {
        if self.attach.is_empty() && self.pool.is_none() {
            return Err(ConfigError::section(
                "attach",
                "at least one [[attach]] with server, device and key (or a [pool]) is needed",
            ));
        }
        let imp = self.impairment.impairment()?;
        let mut out = Vec::new();
        for (i, a) in self.attach.iter().enumerate() {
            let at = format!("attach[{i}]");
            let (key_name, text) = match server {
                Some(s) => ("--server".to_string(), s),
                None => (format!("{at}.server"), a.server.as_str()),
            };
            let addr = socket_addr(&key_name, text)?;
            if addr.port() == 0 || addr.ip().is_unspecified() {
                return Err(bad(
                    &key_name,
                    format!("\"{text}\""),
                    "not a box's address: the box listens on a real address and port (7440 by default)",
                ));
            }
            if let Some((j, _)) = out.iter().enumerate().find(
                |(_, (o, _)): &(usize, &(AttachOptions, Option<ServedSocket>))| {
                    o.server == addr && o.device == a.device
                },
            ) {
                return Err(bad(
                    &format!("{at}.device"),
                    format!("\"{}\"", a.device),
                    &format!("attach[{j}] attaches {} at {addr} already", a.device),
                ));
            }
            let k = key(&at, &a.key, &a.key_file)?;
            let link = self.link.settings(k.clone())?;
            let mut o = AttachOptions::new(addr, &a.device, k);
            o.link = link.config;
            o.driver = link.driver;
            o.offload = link.offload;
            o.poll = link.poll;
            o.impairment = imp;
            a.limits(&at, &mut o)?;
            if let Some(b) = &a.bdf {
                o.device_id = b.parse().map_err(|_| {
                    bad(&format!("{at}.bdf"), format!("\"{b}\""), "not a BDF like \"00:01.0\"")
                })?;
            }
            if let Some(p) = &a.vfio_user_socket {
                let name = format!("{at}.vfio_user_socket");
                let dir = super::socket_dir(&name, p)?;
                if !dir.is_dir() {
                    return Err(bad(
                        &name,
                        p.display(),
                        &format!("its directory {} does not exist", dir.display()),
                    ));
                }
                super::check_writable(&name, p, dir)?;
                if out.iter().any(|(_, s)| s.as_ref().is_some_and(|s| s.path == *p)) {
                    return Err(bad(&name, p.display(), "another [[attach]] is served on it already"));
                }
                o.dma_memory = 0;
                o.service_interval = None;
                if !self.link.names_driver() {
                    o.driver = link::driver::DriverKind::Portable;
                }
            }
            let served = a.served_socket(&at)?;
            out.push((o, served));
        }
        self.place_in_view(&mut out)?;
        Ok(out)
    }
}

impl HostFile {
    /// Each device its own place in the host's view: those without `bdf` take the first
    /// free slots from 00:01.0 on (00:01.0, 00:02.0, …), past every one given; two given the
    /// same are refused.
    fn place_in_view(&self, out: &mut [(AttachOptions, Option<ServedSocket>)]) -> Result<(), ConfigError> {
        let given: Vec<tlp::Bdf> = self
            .attach
            .iter()
            .zip(out.iter())
            .filter(|(a, _)| a.bdf.is_some())
            .map(|(_, (o, _))| o.device_id)
            .collect();
        for (i, (o, _)) in out.iter().enumerate() {
            if self.attach[i].bdf.is_some()
                && let Some(j) =
                    (0..i).find(|j| self.attach[*j].bdf.is_some() && out[*j].0.device_id == o.device_id)
            {
                return Err(bad(
                    &format!("attach[{i}].bdf"),
                    format!("\"{}\"", o.device_id),
                    &format!("attach[{j}] is at that BDF already: each device needs its own"),
                ));
            }
        }
        let mut free = (1u8..32).map(|d| tlp::Bdf::new(0, d, 0)).filter(|b| !given.contains(b));
        for (i, (o, _)) in out.iter_mut().enumerate() {
            if self.attach[i].bdf.is_none() {
                o.device_id = free.next().ok_or_else(|| {
                    bad(&format!("attach[{i}]"), i, "no free BDF on bus 0 left for it: give bdf")
                })?;
            }
        }
        Ok(())
    }
}

impl AttachSection {
    /// The attachment's completion timeout, DMA arena and service interval, where the file
    /// gives them, checked (`at` names the section in errors).
    fn limits(&self, at: &str, o: &mut AttachOptions) -> Result<(), ConfigError> {
        let a = self;
        if let Some(ms) = a.completion_timeout_ms {
            if !(1..=60_000).contains(&ms) {
                return Err(bad(&format!("{at}.completion_timeout_ms"), ms, "must be 1..=60000"));
            }
            o.completion_timeout = Duration::from_millis(ms);
        }
        if let Some(m) = a.dma_memory_mib {
            if !(1..=65536).contains(&m) {
                return Err(bad(&format!("{at}.dma_memory_mib"), m, "must be 1..=65536"));
            }
            if let Some(total) = physical_memory_mib()
                && m > total / 2
            {
                return Err(bad(
                    &format!("{at}.dma_memory_mib"),
                    m,
                    &format!("more than half of this machine's {total} MiB of memory"),
                ));
            }
            o.dma_memory = m << 20;
        }
        if let Some(ms) = a.service_interval_ms {
            if ms > 10_000 {
                return Err(bad(
                    &format!("{at}.service_interval_ms"),
                    ms,
                    "must be 0..=10000 (0: no service thread)",
                ));
            }
            o.service_interval = (ms > 0).then(|| Duration::from_millis(ms));
        }
        Ok(())
    }

    /// The vfio-user socket the device is served on, if the section names one, with the
    /// socket's mode, owner and group checked (and refused without a socket).
    fn served_socket(&self, at: &str) -> Result<Option<ServedSocket>, ConfigError> {
        let a = self;
        Ok(match &a.vfio_user_socket {
            None => {
                for (k, set) in [
                    ("vfio_user_socket_mode", a.vfio_user_socket_mode.is_some()),
                    ("vfio_user_socket_group", a.vfio_user_socket_group.is_some()),
                    ("vfio_user_socket_owner", a.vfio_user_socket_owner.is_some()),
                ] {
                    if set {
                        return Err(bad(&format!("{at}.{k}"), "given", "only with vfio_user_socket"));
                    }
                }
                None
            }
            Some(p) => {
                let access = socket_access(
                    at,
                    a.vfio_user_socket_mode,
                    a.vfio_user_socket_group.as_deref(),
                    a.vfio_user_socket_owner.as_deref(),
                )?;
                Some(ServedSocket { path: p.clone(), access })
            }
        })
    }
}

/// A vfio-user socket's mode (0o600 unless given: the owner's read and write at least,
/// others nothing), group and owner, as `{at}.vfio_user_socket_mode`, `_group`, `_owner` say.
fn socket_access(
    at: &str,
    mode: Option<u32>,
    group: Option<&str>,
    owner: Option<&str>,
) -> Result<bridge_host::SocketAccess, ConfigError> {
    let mode = mode.unwrap_or(0o600);
    if mode > 0o777 || mode & 0o007 != 0 || mode & 0o600 != 0o600 {
        return Err(bad(
            &format!("{at}.vfio_user_socket_mode"),
            format!("0o{mode:o}"),
            "must give the owner read and write and others nothing (0o600, 0o660): the socket is the VM's door to the device",
        ));
    }
    let gid = group.map(|g| id_of(&format!("{at}.vfio_user_socket_group"), g, true)).transpose()?;
    let uid = owner.map(|u| id_of(&format!("{at}.vfio_user_socket_owner"), u, false)).transpose()?;
    Ok(bridge_host::SocketAccess { mode, uid, gid })
}
