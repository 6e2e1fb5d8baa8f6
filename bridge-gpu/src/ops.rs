//! What an operator sees of the box and changes while it runs: each export and each session
//! as a report (for a control socket, metrics), exports added and removed, hosts added and
//! their allow lists changed, without disturbing what is untouched.

use std::net::SocketAddr;
use std::time::SystemTime;

use tlp::Bdf;

use crate::claims::Owner;
use crate::endpoint::GpuEndpoint;
use crate::error::GpuError;
use crate::export::{Export, release};
use crate::spec::{DeviceSpec, ExportSpec, HostKey, check_allow};
use crate::stats::{ExportIdentity, ExportStats};

/// One exported device, as the operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportReport {
    /// The name hosts attach it by.
    pub name: String,
    /// Its requester ID on the box's bus.
    pub id: Bdf,
    /// What backs it (`simgpu, 64 MiB VRAM`, `VFIO 0000:41:00.0`).
    pub backing: String,
    /// Its PCI address on the box, sysfs's form (`0000:41:00.0`; a simulated device's BDF on
    /// the box's bus in domain 0).
    pub pci_address: String,
    /// Its IDs and the hosts that may attach it.
    pub identity: ExportIdentity,
    /// The host that holds it, with its session and pool claim token.
    pub owner: Option<(String, u32, Option<u64>)>,
    /// Why it is unhealthy, if it is.
    pub health: Option<String>,
    /// Its counters.
    pub stats: ExportStats,
}

impl ExportReport {
    /// `unhealthy`, `attached` or `free`.
    pub fn state(&self) -> &'static str {
        match (&self.health, &self.owner) {
            (Some(_), _) => "unhealthy",
            (None, Some(_)) => "attached",
            (None, None) => "free",
        }
    }
}

/// One host's session, as the operator sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionReport {
    /// The session's ID (this side's).
    pub id: u32,
    /// The host, by the name of the key it proved.
    pub host: String,
    /// Where its datagrams come from.
    pub peer: SocketAddr,
    /// The device it holds.
    pub device: Option<String>,
    /// When it came up.
    pub since: SystemTime,
    /// The link's counters.
    pub link: link::Stats,
}

impl GpuEndpoint {
    /// Every export, in order.
    pub fn export_reports(&self) -> Vec<ExportReport> {
        self.exports.iter().map(report).collect()
    }

    /// Every session that is up.
    pub fn session_reports(&mut self) -> Vec<SessionReport> {
        let mut out = Vec::new();
        for (id, peer, s) in self.runner.endpoint.sessions() {
            let Some(info) = self.sessions.get(&id) else { continue };
            out.push(SessionReport {
                id,
                host: info.host.clone(),
                peer,
                device: info.device.map(|d| self.exports[d].name.clone()),
                since: info.since,
                link: *s.stats(),
            });
        }
        out.sort_by_key(|r| r.since);
        out
    }

    /// The handshake counters of the box's endpoint (sessions not yet up, refusals).
    pub fn endpoint_stats(&self) -> link::EndpointStats {
        *self.runner.endpoint.stats()
    }

    /// The driver's name and whether it busy-polls.
    pub fn driver_name(&self) -> &'static str {
        link::driver::Datagrams::name(&self.runner.sock)
    }

    /// The hosts' names, in the order given.
    pub fn host_names(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.name.clone()).collect()
    }

    /// Exports `spec` at run time, in the lowest free slot of the box. Refused (nothing
    /// changes) if the name is taken, a host it allows is unknown, the box serves a pool (its
    /// inventory is registered at start), or the device does not open.
    pub fn add_export(&mut self, spec: &ExportSpec) -> Result<(), GpuError> {
        if self.claims.is_some() {
            return Err(GpuError::Config(format!(
                "export {}: this box serves a pool; its devices change with a restart",
                spec.name
            )));
        }
        if self.exports.iter().any(|e| e.name == spec.name) {
            return Err(GpuError::Config(format!("export {}: a device of that name is exported", spec.name)));
        }
        let hosts = &self.keys;
        check_allow(&format!("export {}", spec.name), spec, hosts)?;
        let slot = (1..=u8::MAX).find(|s| !self.exports.iter().any(|e| e.slot == *s)).ok_or_else(|| {
            GpuError::Config(format!("export {}: the box's bus has no free device number", spec.name))
        })?;
        let e = Export::open(spec, slot, &self.box_name)?;
        self.exports.push(e);
        Ok(())
    }

    /// Stops exporting `name`: its owner is cut off (its session closed: the host sees the
    /// device removed) and the device reset, then closed. Refused in a pool box.
    pub fn remove_export(&mut self, name: &str) -> Result<(), GpuError> {
        if self.claims.is_some() {
            return Err(GpuError::Config(format!(
                "unexport {name}: this box serves a pool; its devices change with a restart"
            )));
        }
        let Some(d) = self.exports.iter().position(|e| e.name == name) else {
            return Err(GpuError::Config(format!(
                "unexport {name}: no such export (exported: {})",
                self.export_names().join(", ")
            )));
        };
        self.cut_off(d, "no longer exported");
        self.exports.remove(d);
        for info in self.sessions.values_mut() {
            info.device = match info.device {
                Some(i) if i > d => Some(i - 1),
                other => other,
            };
        }
        log::info!("{name}: no longer exported");
        Ok(())
    }

    /// Changes the hosts that may attach `name`; an owner no longer allowed is cut off.
    pub fn set_allow(&mut self, name: &str, allow: &[String]) -> Result<(), GpuError> {
        let Some(d) = self.exports.iter().position(|e| e.name == name) else {
            return Err(GpuError::Config(format!("allow of {name}: no such export")));
        };
        let spec =
            ExportSpec { name: name.into(), device: DeviceSpec::Vfio(String::new()), allow: allow.into() };
        check_allow(&format!("export {name}"), &spec, &self.keys)?;
        let e = &mut self.exports[d];
        e.allow = allow.to_vec();
        e.identity.allow = allow.to_vec();
        if e.owner.as_ref().is_some_and(|o| !allow.contains(&o.host)) {
            self.cut_off(d, "its host is no longer allowed");
        }
        Ok(())
    }

    /// Accepts sessions from one more host.
    pub fn add_host(&mut self, host: HostKey) -> Result<(), GpuError> {
        if self.keys.iter().any(|k| k.name == host.name) {
            return Err(GpuError::Config(format!("host {}: already known", host.name)));
        }
        if let Some(other) = self.hosts.get(&host.key.key_id()) {
            return Err(GpuError::Config(format!("host {}: has host '{other}''s key", host.name)));
        }
        self.hosts.insert(host.key.key_id(), host.name.clone());
        self.keys.push(host.clone());
        self.runner.endpoint.add_key(host.key);
        Ok(())
    }

    /// Releases export `d` from its owner, if it has one, and closes the owner's session.
    fn cut_off(&mut self, d: usize, why: &str) {
        let GpuEndpoint { runner, exports, sessions, journal, .. } = self;
        let e = &mut exports[d];
        let Some(Owner { sid, host, .. }) = e.owner.clone() else { return };
        log::warn!(device = e.name.as_str(), host = host.as_str(); "{}: cutting {host} off: {why}", e.name);
        release(e, why, journal);
        if let Some(info) = sessions.get_mut(&sid) {
            info.device = None;
        }
        if let Some(s) = runner.endpoint.session(sid) {
            s.close(runner.clock.now());
        }
        let _ = runner.transmit();
    }
}

fn report(e: &Export) -> ExportReport {
    ExportReport {
        name: e.name.clone(),
        id: e.dev.id(),
        backing: e.backing.clone(),
        pci_address: e.origin.pci_address.clone(),
        identity: e.identity.clone(),
        owner: e.owner.as_ref().map(|o| (o.host.clone(), o.sid, o.token)),
        health: e.health.clone(),
        stats: e.stats,
    }
}
