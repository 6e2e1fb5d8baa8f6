//! `dxpu gpu`'s file: what it configures, what a reload may change.

use std::net::SocketAddr;

use bridge_gpu::{DeviceSpec, ExportSpec, GpuOptions, HostKey};
use hw::simgpu::SimGpuParams;

use super::{ConfigError, DEFAULT_PORT, GpuFile, bad, key, socket_addr};

/// How long a host's old key is still accepted after a reload changed it, by default.
const DEFAULT_KEY_OVERLAP_S: u64 = 600;

impl GpuFile {
    /// The settings a reload cannot change (the socket, the link, the pool, the control
    /// socket and metrics server): the names of those that differ in `new`.
    pub fn restart_only_changes(&self, new: &GpuFile) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, same) in [
            ("listen", self.listen == new.listen),
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

    /// The box's name as the pool and dcgm-exporter know it: its pool name, else the
    /// machine's host name.
    pub fn box_name(&self) -> String {
        self.pool.as_ref().map(|p| p.box_name.clone()).unwrap_or_else(crate::metrics::hostname)
    }

    /// How long a host's old key is still accepted after a reload changed it: `key_overlap_s`
    /// (default 600 s, at most a week).
    pub fn key_overlap(&self) -> Result<std::time::Duration, ConfigError> {
        match self.key_overlap_s {
            None => Ok(std::time::Duration::from_secs(DEFAULT_KEY_OVERLAP_S)),
            Some(s) if s <= 7 * 24 * 3600 => Ok(std::time::Duration::from_secs(s)),
            Some(s) => Err(bad("key_overlap_s", s, "must be 0..=604800 seconds (a week)")),
        }
    }

    /// The endpoint's options; `listen` overrides the file's.
    pub fn options(&self, listen: Option<&str>) -> Result<GpuOptions, ConfigError> {
        self.key_overlap()?;
        let listen = match (listen, &self.listen) {
            (Some(l), _) => socket_addr("--listen", l)?,
            (None, Some(l)) => socket_addr("listen", l)?,
            (None, None) => SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
        };
        if self.host.is_empty() {
            return Err(ConfigError::section(
                "host",
                "at least one [[host]] with a name and a key is needed",
            ));
        }
        let mut hosts = Vec::new();
        for (i, h) in self.host.iter().enumerate() {
            if h.name.is_empty() {
                return Err(bad(&format!("host[{i}].name"), "\"\"", "must not be empty"));
            }
            if hosts.iter().any(|k: &HostKey| k.name == h.name) {
                return Err(bad(&format!("host[{i}].name"), format!("\"{}\"", h.name), "named twice"));
            }
            hosts.push(HostKey {
                name: h.name.clone(),
                key: key(&format!("host[{i}]"), &h.key, &h.key_file)?,
            });
        }
        if self.device.is_empty() {
            return Err(ConfigError::section("device", "at least one [[device]] to export is needed"));
        }
        let mut exports = Vec::new();
        for (i, d) in self.device.iter().enumerate() {
            let at = format!("device[{i}]");
            if d.name.is_empty() || d.name.len() > bridge::attach::MAX_TEXT {
                return Err(bad(&format!("{at}.name"), format!("\"{}\"", d.name), "must be 1..=255 bytes"));
            }
            let device = match (&d.sim, &d.vfio) {
                (Some(s), None) => {
                    let mut p = SimGpuParams::default();
                    if let Some(v) = s.vram_mib {
                        if !(256..=1 << 20).contains(&v) || !v.is_power_of_two() {
                            return Err(bad(
                                &format!("{at}.sim.vram_mib"),
                                v,
                                "must be a power of two, 256..=1048576 (the driver's workload needs 256 MiB)",
                            ));
                        }
                        p.vram_bytes = v << 20;
                    }
                    if let Some(v) = s.msix_vectors {
                        if !(4..=2048).contains(&v) {
                            return Err(bad(&format!("{at}.sim.msix_vectors"), v, "must be 4..=2048"));
                        }
                        p.msix_vectors = v;
                    }
                    if let Some(v) = s.serial {
                        p.serial = v;
                    }
                    DeviceSpec::Sim(p)
                }
                (None, Some(addr)) => {
                    let ok = addr.len() == 12
                        && addr.as_bytes()[4] == b':'
                        && addr.as_bytes()[7] == b':'
                        && addr.as_bytes()[10] == b'.';
                    if !ok {
                        return Err(bad(
                            &format!("{at}.vfio"),
                            format!("\"{addr}\""),
                            "not a PCI address like \"0000:41:00.0\"",
                        ));
                    }
                    DeviceSpec::Vfio(addr.clone())
                }
                (Some(_), Some(_)) => return Err(ConfigError::section(&at, "give sim or vfio, not both")),
                (None, None) => {
                    return Err(ConfigError::section(&at, "sim = { … } or vfio = \"…\" is required"));
                }
            };
            if d.allow.is_empty() {
                return Err(bad(
                    &format!("{at}.allow"),
                    "[]",
                    "no host may attach it: name at least one [[host]]",
                ));
            }
            if exports.iter().any(|e: &ExportSpec| e.name == d.name) {
                return Err(bad(&format!("{at}.name"), format!("\"{}\"", d.name), "named twice"));
            }
            for (j, h) in d.allow.iter().enumerate() {
                if !hosts.iter().any(|k| &k.name == h) {
                    return Err(bad(
                        &format!("{at}.allow[{j}]"),
                        format!("\"{h}\""),
                        "no [[host]] has this name",
                    ));
                }
            }
            exports.push(ExportSpec { name: d.name.clone(), device, allow: d.allow.clone() });
        }
        let link = self.link.settings(hosts[0].key.clone())?;
        Ok(GpuOptions {
            box_name: self.box_name(),
            listen,
            link: link.config,
            hosts,
            exports,
            driver: link.driver,
            offload: link.offload,
            poll: link.poll,
            impairment: self.impairment.impairment()?,
            tap: None,
        })
    }
}
