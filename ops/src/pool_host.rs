//! The pool in the endpoints (`[pool]` of `dxpu gpu` and `dxpu host`, `docs/pool.md`): the
//! box registers its devices and serves claims only; the host claims devices, attaches each
//! at run time (its own vfio-user socket, where a directory is given), gives back those that
//! are gone, and fences every device claimed under a lease it could not renew.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bridge_gpu::GpuEndpoint;
use bridge_host::vfio_user::ServedDevice;
use bridge_host::{Fence, RemoteDevice};
use pool::{BoxAgent, Claim, DeviceRecord, HostAgent, HostEvent};

use crate::config::{GpuPool, HostFile, HostPool, LinkOverride};
use crate::error::{BoxStartError, RunError};
use crate::reload::{PendingRead, READ_DEADLINE, ReadState};

/// Registers the endpoint's exports in the pool and makes it serve claims only.
pub fn start_box(ep: &mut GpuEndpoint, gp: &GpuPool) -> Result<BoxAgent, BoxStartError> {
    let mut devices = Vec::new();
    for name in ep.export_names() {
        let Some(id) = ep.export_identity(&name) else { continue };
        let health = ep.export_health(&name).unwrap_or_else(|| "ok".into());
        devices.push((
            name,
            DeviceRecord {
                advertise: gp.advertise.to_string(),
                vendor_id: id.vendor_id,
                device_id: id.device_id,
                class: id.class,
                vram_bytes: id.largest_bar,
                health,
                allow: id.allow,
                since: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs()),
            },
        ));
    }
    if let Some(path) = &gp.ownership_log {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| BoxStartError::OwnershipLog { path: path.clone(), source })?;
        let unix_us = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64)
        };
        // A start ends every ownership the log last showed: the devices were reset since (a
        // box killed writes no releases). Times are Unix microseconds, comparable across
        // restarts and boxes.
        let start = serde_json::json!({"unix_us": unix_us(), "event": "started", "box": gp.box_name});
        writeln!(f, "{start}")
            .and_then(|_| f.flush())
            .map_err(|source| BoxStartError::OwnershipLog { path: path.clone(), source })?;
        ep.set_ownership_sink(Box::new(move |ev| {
            let line = serde_json::json!({
                "unix_us": unix_us(),
                "device": ev.device,
                "host": ev.host,
                "token": ev.token,
                "event": if ev.attached { "attached" } else { "released" },
                "why": ev.why,
            });
            // One line per change, written whole and at once (a reader tails it).
            let _ = writeln!(f, "{line}").and_then(|_| f.flush());
        }));
    }
    let agent = BoxAgent::start(gp.config.clone(), &gp.box_name, devices).map_err(BoxStartError::Agent)?;
    ep.set_claims(agent.claim_check());
    ep.set_health_sink(Box::new(agent.health_reporter()));
    log::info!(
        "pool: box {} at {} serves claims only ({})",
        gp.box_name,
        gp.advertise,
        gp.config.etcd.join(",")
    );
    Ok(agent)
}

/// A claimed device, attached.
struct Held {
    claim: Claim,
    lease: i64,
    use_: Use,
}

enum Use {
    /// Kept here (no vfio-user directory): for `--workload`, or idle until released.
    Local(RemoteDevice),
    /// Served to a VMM on its own socket by its own thread.
    Served(ServedDevice),
}

impl Held {
    fn removed(&self) -> Option<String> {
        match &self.use_ {
            Use::Local(d) => d.removed(),
            Use::Served(s) => s.watch().removed(),
        }
    }

    /// `removed`, `silent` (riding through a silent box) or `attached`.
    fn state(&self) -> &'static str {
        let silent = match &self.use_ {
            Use::Local(d) => d.silent(),
            Use::Served(s) => s.watch().silent(),
        };
        match (self.removed(), silent) {
            (Some(_), _) => "removed",
            (None, true) => "silent",
            (None, false) => "attached",
        }
    }

    /// Detaches (a fenced device sends nothing: it only closes what is left locally).
    fn detach(self) {
        match self.use_ {
            Use::Local(d) => d.detach(),
            Use::Served(s) => match s.stop() {
                Ok(d) => d.detach(),
                Err(e) => log::error!("{e}"),
            },
        }
    }
}

/// The fences, one per lease: raised by the agent's watchdog.
type Fences = Arc<Mutex<HashMap<i64, Fence>>>;

fn fence_for(fences: &Fences, lease: i64) -> Fence {
    fences.lock().unwrap_or_else(|p| p.into_inner()).entry(lease).or_default().clone()
}

fn attach(hp: &HostPool, claim: &Claim, fence: Fence, stop: &Arc<AtomicBool>) -> Result<Use, String> {
    let server = claim.record.advertise.parse().map_err(|_| {
        format!("{}: the box advertises {:?}, not an address:port", claim.name(), claim.record.advertise)
    })?;
    let mut o = hp.template.clone();
    o.server = server;
    o.device = claim.device.clone();
    o.token = Some(claim.token);
    o.fence = Some(fence);
    o.cancel = Some(stop.clone());
    let socket =
        hp.vfio_user_dir.as_ref().map(|d| d.join(format!("{}-{}.sock", claim.box_name, claim.device)));
    if socket.is_some() {
        // The VMM grants guest memory and the server's thread drives the link.
        o.dma_memory = 0;
        o.service_interval = None;
    }
    let wait = o.poll;
    let d = RemoteDevice::attach(o).map_err(|e| e.to_string())?;
    let Some(path) = socket else { return Ok(Use::Local(d)) };
    let served = ServedDevice::spawn(&claim.device, &path, hp.socket_access, d, wait)
        .map_err(|e| format!("{}: vfio-user: {e}", path.display()))?;
    log::info!("{}: served on {}", claim.name(), path.display());
    Ok(Use::Served(served))
}

/// A pool host's control methods (`rpc_get_methods` lists them).
const METHODS: [&str; 7] = ["status", "devices", "sessions", "stats", "reload", "running", "rpc_get_methods"];

/// `dxpu host` with `[pool]`: claims, attaches and releases until stopped; with `workload`,
/// runs the workload on every device once `want` are held, releases them and ends.
pub fn run_host(
    hp: HostPool,
    stop: Arc<AtomicBool>,
    mut workload: Option<crate::Workload<'_>>,
    ops: crate::config::OpsSections,
    reload: PoolReload,
) -> bool {
    let mut reload = Reloading { cfg: reload, pending: None };
    let calls = crate::control::Calls::new();
    let control =
        match ops.0.socket.as_deref().map(|p| crate::control::ControlServer::bind(p, calls.sender())) {
            Some(Err(e)) => {
                log::error!("{e}");
                return false;
            }
            c => c.map(Result::ok),
        };
    let metrics = match ops.1.listen().map_err(String::from).and_then(|a| {
        a.map(|a| crate::metrics::MetricsServer::bind(a, calls.sender()).map_err(String::from)).transpose()
    }) {
        Ok(m) => m,
        Err(e) => {
            log::error!("{e}");
            return false;
        }
    };
    let (_control, _metrics) = (control, metrics);
    let started_at = Instant::now();
    let fences: Fences = Arc::default();
    let on_fence = {
        let fences = fences.clone();
        Box::new(move |lease: i64, why: &str| fence_for(&fences, lease).raise(why))
    };
    let agent = match HostAgent::start(hp.config.clone(), hp.agent.clone(), on_fence) {
        Ok(a) => a,
        Err(e) => {
            log::error!("pool: {e}");
            return false;
        }
    };
    // Ready once the agent runs: devices come and go with claims from here on.
    crate::notify::ready("claiming from the pool");
    let mut held: Vec<Held> = Vec::new();
    let mut ok = true;
    let mut attach_failures: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let started = Instant::now();
    let workload_wait = Duration::from_secs(30);
    let mut watchdog = crate::notify::Watchdog::from_env();
    while !stop.load(Ordering::Relaxed) {
        watchdog.tick();
        while let Ok(ev) = agent.events().recv_timeout(Duration::from_millis(20)) {
            match ev {
                HostEvent::Claimed { claim, lease } => {
                    match attach(&hp, &claim, fence_for(&fences, lease), &stop) {
                        Ok(use_) => held.push(Held { claim, lease, use_ }),
                        Err(e) => {
                            *attach_failures.entry(claim.name()).or_default() += 1;
                            log::warn!("pool: {}: not attached: {e}; released", claim.name());
                            agent.release(claim, true);
                        }
                    }
                }
                HostEvent::Fenced { lease, why } => {
                    let (gone, kept): (Vec<_>, Vec<_>) = held.drain(..).partition(|h| h.lease == lease);
                    held = kept;
                    for h in gone {
                        log::warn!("pool: {}: fenced ({why}); its claim is void", h.claim.name());
                        h.detach();
                    }
                }
            }
        }
        while let Some(c) = calls.try_next() {
            if c.method == "reload" {
                reload.on_call(c);
                continue;
            }
            let counts = PoolCounts { agent: agent.stats().counts(), attach_failures: &attach_failures };
            let r = answer(&c, &held, started_at, &reload.cfg.running, &counts);
            c.answer(r);
        }
        reload.step();
        // Devices gone (box lost, claim revoked and the box cut us off): given back, and
        // another claimed in their place.
        let (gone, kept): (Vec<_>, Vec<_>) = held.drain(..).partition(|h| h.removed().is_some());
        held = kept;
        for h in gone {
            log::warn!(
                "pool: {}: removed ({}); releasing it",
                h.claim.name(),
                h.removed().unwrap_or_default()
            );
            let claim = h.claim.clone();
            h.detach();
            agent.release(claim, true);
        }
        if let Some(run_on) = workload.as_mut()
            && (held.len() >= hp.agent.want || started.elapsed() > workload_wait)
        {
            if held.len() < hp.agent.want {
                log::error!(
                    "pool: {} of {} device(s) claimed within {workload_wait:?}",
                    held.len(),
                    hp.agent.want
                );
                ok = false;
            }
            for h in held.drain(..) {
                ok &= run_workload(h, &agent, &stop, &mut **run_on);
            }
            break;
        }
    }
    reload.stop();
    for h in held {
        h.detach();
    }
    agent.stop();
    ok
}

/// What a pool host reloads: the file it was started with, read again on SIGHUP or `ctl
/// reload` and compared with what runs. It applies nothing without a restart (its devices
/// come from claims; `[pool]`, `[link]`, `[control]` and `[metrics]` are taken at the start),
/// so a reload says either that nothing changed or what changed and that it needs a restart.
pub struct PoolReload {
    /// The configuration file.
    pub path: PathBuf,
    /// `--driver` and `--poll` over the file's.
    pub link: LinkOverride,
    /// The file as the host runs it (the overrides applied).
    pub running: HostFile,
    /// The flag SIGHUP raises.
    pub hup: Arc<AtomicBool>,
}

/// A pool host's reload in progress.
struct Reloading {
    cfg: PoolReload,
    pending: Option<PendingRead<HostFile, RunError>>,
}

impl Reloading {
    /// Starts reading the file off the loop, unless a read is under way (said to the
    /// service manager).
    fn start(&mut self) {
        if self.pending.is_some() {
            return;
        }
        crate::notify::reloading();
        let (path, link) = (self.cfg.path.clone(), self.cfg.link);
        let read = move || -> Result<HostFile, RunError> {
            let mut file: HostFile = crate::config::read(&path)?;
            file.override_link(link);
            let at = || path.display().to_string();
            if !file.attachments(None).map_err(|source| RunError::InFile { path: at(), source })?.is_empty() {
                return Err(RunError::AttachAndPool { path: at() });
            }
            Ok(file)
        };
        match PendingRead::start(self.cfg.path.display().to_string(), READ_DEADLINE, read) {
            Ok(r) => self.pending = Some(r),
            Err(e) => log::error!("{e}"),
        }
    }

    /// `ctl reload`: answered with the verdict once the file is read.
    fn on_call(&mut self, c: crate::control::Call) {
        self.start();
        match self.pending.as_mut() {
            Some(r) => r.wait_with(c),
            None => {
                c.answer(Err(crate::control::RpcError::failed("reload: could not start reading the file")))
            }
        }
    }

    /// Takes SIGHUP, and a read that ended: logs and answers the verdict.
    fn step(&mut self) {
        if self.cfg.hup.swap(false, Ordering::Relaxed) {
            self.start();
        }
        let Some(mut r) = self.pending.take() else { return };
        let ReadState::Done(read) = r.poll() else {
            self.pending = Some(r);
            return;
        };
        let at = self.cfg.path.display().to_string();
        let verdict = read.and_then(|file| {
            let changed = self.cfg.running.restart_only_changes(&file);
            if changed.is_empty() {
                Ok(serde_json::Value::String(format!("{at}: nothing changed")))
            } else {
                Err(RunError::NeedsRestart {
                    path: at.clone(),
                    what: format!("{} (a pool host takes its file only at a start)", changed.join(", ")),
                })
            }
        });
        match &verdict {
            Ok(v) => log::info!("reloaded {v}"),
            Err(e) => log::error!("reload refused, still running on the old configuration: {e}"),
        }
        r.answer(&verdict);
        crate::notify::ready("claiming from the pool");
    }

    /// Answers a reload under way: the host is stopping.
    fn stop(self) {
        if let Some(r) = self.pending {
            r.answer(&Err::<serde_json::Value, _>(RunError::Stopping));
        }
    }
}

fn run_workload(
    h: Held,
    agent: &HostAgent,
    stop: &AtomicBool,
    run_on: &mut dyn FnMut(&str, RemoteDevice, &AtomicBool) -> bool,
) -> bool {
    let name = h.claim.name();
    let Use::Local(d) = h.use_ else {
        log::warn!("{name}: served over vfio-user; --workload runs on the others only");
        h.detach_and_release(agent);
        return true;
    };
    let ok = run_on(&name, d, stop);
    agent.release(h.claim, !ok);
    ok
}

impl Held {
    fn stats(&self) -> bridge_host::HostStats {
        match &self.use_ {
            Use::Local(d) => d.stats(),
            Use::Served(s) => s.watch().stats(),
        }
    }

    fn origin(&self) -> Option<bridge::attach::Origin> {
        match &self.use_ {
            Use::Local(d) => d.origin(),
            Use::Served(s) => s.watch().origin(),
        }
    }

    fn detach_and_release(self, agent: &HostAgent) {
        let claim = self.claim.clone();
        self.detach();
        agent.release(claim, false);
    }
}

/// A pool host's control calls: what it holds, read-only (claims decide its devices).
/// What a pool host counts beside its devices: its agent's counters, and the attaches that
/// failed, by claim (`box/device`).
struct PoolCounts<'a> {
    agent: pool::AgentCounts,
    attach_failures: &'a std::collections::BTreeMap<String, u64>,
}

fn answer(
    c: &crate::control::Call,
    held: &[Held],
    started: Instant,
    running: &HostFile,
    counts: &PoolCounts<'_>,
) -> Result<serde_json::Value, crate::control::RpcError> {
    use crate::control::{METHOD_NOT_FOUND, RpcError};
    use serde_json::{Value, json};
    let peer = |h: &Held| h.claim.record.advertise.clone();
    match c.method.as_str() {
        "status" => {
            c.only_params(&[])?;
            Ok(json!({
                "role": "host",
                "pool": true,
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "uptime_seconds": crate::control::uptime_since(started),
                "attached": held.len(),
                // Ready (`/readyz`) while its agent holds a lease: its claims can be served.
                "ready": counts.agent.leases > counts.agent.fences,
                "not_ready": (counts.agent.leases <= counts.agent.fences)
                    .then_some("no lease held in the pool (not registered yet, or fenced)"),
            }))
        }
        "devices" => {
            c.only_params(&[])?;
            Ok(Value::Array(
                held.iter()
                    .map(|h| {
                        json!({
                            "name": h.claim.name(),
                            "device": h.claim.device,
                            "server": peer(h),
                            "token": h.claim.token,
                            // etcd's 64-bit lease ID as etcdctl shows it (hex): a JSON number
                            // past 2^53 comes out changed in most readers.
                            "lease": format!("{:x}", h.lease),
                            "state": h.state(),
                            "removed": h.removed(),
                            "vfio_user_socket": match &h.use_ {
                                Use::Served(s) => Some(s.path().display().to_string()),
                                Use::Local(_) => None,
                            },
                            "counters": crate::stats::host_stats_json(&h.stats()),
                        })
                    })
                    .collect(),
            ))
        }
        "sessions" => {
            c.only_params(&[])?;
            Ok(Value::Array(
                held.iter()
                    .map(|h| {
                        let mut v = json!({"device": h.claim.name(), "peer": peer(h)});
                        if let (Value::Object(m), Value::Object(l)) =
                            (&mut v, crate::stats::link_json(&h.stats().link))
                        {
                            m.extend(l);
                        }
                        v
                    })
                    .collect(),
            ))
        }
        "stats" => {
            c.only_params(&[])?;
            let m: serde_json::Map<String, Value> =
                held.iter().map(|h| (h.claim.name(), crate::stats::host_stats_json(&h.stats()))).collect();
            Ok(json!({ "devices": m }))
        }
        "attach" | "detach" => Err(RpcError::failed(format!(
            "{}: a pool host's devices come from its claims (dxpu pool drain / revoke on the pool; restart for a new [pool])",
            c.method
        ))),
        "metrics" => {
            let mut x = crate::stats::host_exposition();
            for h in held {
                let state = if h.removed().is_some() { "removed" } else { "attached" };
                let (label, peer, origin) = (h.claim.name(), peer(h), h.origin());
                let dev = crate::stats::DeviceLabels { label: &label, peer: &peer, origin: origin.as_ref() };
                crate::stats::device_metrics(&mut x, &dev, state, 0, Some(&h.stats()));
                x.gauge(
                    "device_up",
                    "The device is attached and its link up (1), or not (0)",
                    crate::metrics::labels(&[("device", &h.claim.name())]),
                    if state == "attached" { 1.0 } else { 0.0 },
                );
            }
            for (name, n) in counts.attach_failures {
                x.counter(
                    "attach_failures",
                    "Attach attempts that failed (the box unreachable or refusing)",
                    crate::metrics::labels(&[("device", name)]),
                    *n,
                );
            }
            crate::stats::pool_agent_metrics(&mut x, "host", &counts.agent);
            Ok(Value::String(x.render()))
        }
        // What runs, for `dxpu host --check --against-running`.
        "running" => c.only_params(&[]).map(|()| running.fingerprint()),
        "rpc_get_methods" => Ok(serde_json::json!(METHODS)),
        m => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method '{m}' (a pool host has: {})", METHODS.join(", ")),
        )),
    }
}
