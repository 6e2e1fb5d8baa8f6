//! `dxpu host` with `[[attach]]`: each configured device attached (and served over
//! vfio-user where the file says), watched, and changed at run time — `dxpu ctl attach` /
//! `detach` of a configured device, SIGHUP or `dxpu ctl reload` for the whole file — while
//! the others keep running. The control socket and the metrics server answer from the main
//! loop, which holds no device's lock between calls: a client never holds up a datapath.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bridge_host::vfio_user::VfioUserServer;
use bridge_host::{AttachOptions, HostStats, LatencyHistogram, RemoteDevice, RemovalWatch};
use serde_json::{Value, json};

use crate::config::{self, HostFile};
use crate::control::{Call, Calls, ControlServer, METHOD_NOT_FOUND, RpcError, uptime_since};
use crate::gpu_run::link_json;
use crate::metrics::{Exposition, MetricsServer, labels, link_metrics};

/// One `[[attach]]`: its options and vfio-user socket, by label (the device's name, or
/// `device@server` where two boxes export the same name).
#[derive(Clone)]
pub(crate) struct Entry {
    pub(crate) label: String,
    /// Its index among the file's `[[attach]]`.
    index: usize,
    pub(crate) opts: AttachOptions,
    pub(crate) socket: Option<PathBuf>,
}

/// An attached device: held here, or handed to its vfio-user server's thread.
enum Held {
    Direct(RemoteDevice),
    Served { stop: Arc<AtomicBool>, thread: JoinHandle<RemoteDevice>, path: PathBuf },
}

struct Attached {
    held: Held,
    watch: RemovalWatch,
    since: SystemTime,
    /// The UDP driver carrying its session.
    driver: &'static str,
    /// Counted once when it is first seen removed.
    removal_seen: bool,
}

/// The host endpoint's devices and what it was configured with.
pub(crate) struct HostRuntime {
    pub(crate) path: PathBuf,
    pub(crate) file: HostFile,
    /// `--server`, `--driver`, `--poll` as given.
    pub(crate) server: Option<String>,
    pub(crate) driver: Option<String>,
    pub(crate) poll: Option<String>,
    pub(crate) entries: Vec<Entry>,
    attached: BTreeMap<String, Attached>,
    /// Surprise removals seen, per label.
    removals: BTreeMap<String, u64>,
    stop: Arc<AtomicBool>,
    started: Instant,
    /// A capture's tap, given to every attach.
    pub(crate) tap: Option<link::driver::Tap>,
}

/// Labels each attachment: the device's name, or `device@server` where it repeats.
pub(crate) fn entries(all: Vec<(AttachOptions, Option<PathBuf>)>) -> Vec<Entry> {
    let names: Vec<String> = all.iter().map(|(o, _)| o.device.clone()).collect();
    all.into_iter()
        .enumerate()
        .map(|(index, (opts, socket))| {
            let label = if names.iter().filter(|n| **n == opts.device).count() > 1 {
                format!("{}@{}", opts.device, opts.server)
            } else {
                opts.device.clone()
            };
            Entry { label, index, opts, socket }
        })
        .collect()
}

impl HostRuntime {
    pub(crate) fn new(
        path: PathBuf,
        file: HostFile,
        overrides: [Option<String>; 3],
        entries: Vec<Entry>,
        stop: Arc<AtomicBool>,
    ) -> HostRuntime {
        let [server, driver, poll] = overrides;
        HostRuntime {
            path,
            file,
            server,
            driver,
            poll,
            entries,
            attached: BTreeMap::new(),
            removals: BTreeMap::new(),
            stop,
            started: Instant::now(),
            tap: None,
        }
    }

    /// Attaches entry `label` (served over vfio-user if its entry says so).
    pub(crate) fn attach(&mut self, label: &str) -> Result<(), String> {
        if self.attached.contains_key(label) {
            return Err(format!("attach {label}: already attached"));
        }
        let Some(e) = self.entries.iter().find(|e| e.label == label).cloned() else {
            return Err(format!(
                "attach {label}: no such [[attach]] in {} (configured: {})",
                self.path.display(),
                self.labels().join(", ")
            ));
        };
        let mut o = e.opts.clone();
        // A signal ends an attach in progress and every wait on an attached device at once.
        o.cancel = Some(self.stop.clone());
        o.tap = self.tap.clone();
        let (name, id, wait) = (o.device.clone(), o.device_id, o.poll);
        let mut d = RemoteDevice::attach(o).map_err(|err| match err {
            bridge_host::AttachError::Cancelled => format!("{label}: stopped by a signal while attaching"),
            err => err.to_string(),
        })?;
        let ids = driver::PciFunction::config_read(&mut d, 0);
        let driver = d.driver_name();
        log::info!("{name} at {id}: vendor {:#06x} device {:#06x}", ids & 0xffff, ids >> 16);
        let watch = d.removal_watch();
        let held = match e.socket {
            None => Held::Direct(d),
            Some(path) => {
                let mut server = VfioUserServer::bind(&path, d, wait)
                    .map_err(|err| format!("{label}: vfio-user: {err}"))?;
                let stop = Arc::new(AtomicBool::new(false));
                // Raised by a detach, and for every server when the endpoint stops.
                let stop2 = stop.clone();
                let thread = std::thread::Builder::new()
                    .name(format!("dxpu-vfio-user-{name}"))
                    .spawn(move || {
                        if let Err(err) = server.serve(&stop2) {
                            log::error!("vfio-user {}: {err}", server.path().display());
                        }
                        server.into_device()
                    })
                    .map_err(|err| format!("{label}: starting the vfio-user thread: {err}"))?;
                Held::Served { stop, thread, path }
            }
        };
        self.attached.insert(
            label.to_string(),
            Attached { held, watch, since: SystemTime::now(), driver, removal_seen: false },
        );
        Ok(())
    }

    /// Detaches `label`: a vfio-user server stops (its VMM sees the socket close), the box
    /// takes the device back.
    pub(crate) fn detach(&mut self, label: &str) -> Result<(), String> {
        let Some(a) = self.attached.remove(label) else {
            return Err(format!(
                "detach {label}: not attached (attached: {})",
                self.attached.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        };
        match a.held {
            Held::Direct(d) => d.detach(),
            Held::Served { stop, thread, path } => {
                stop.store(true, Ordering::Relaxed);
                match thread.join() {
                    Ok(d) => d.detach(),
                    Err(_) => {
                        return Err(format!("{label}: the vfio-user thread for {} panicked", path.display()));
                    }
                }
            }
        }
        log::info!("{label}: detached");
        Ok(())
    }

    /// The devices held here, not served over vfio-user (for `--workload`).
    pub(crate) fn take_direct(&mut self) -> Vec<(String, RemoteDevice)> {
        let labels: Vec<String> = self
            .attached
            .iter()
            .filter(|(_, a)| matches!(a.held, Held::Direct(_)))
            .map(|(l, _)| l.clone())
            .collect();
        let mut out = Vec::new();
        for l in labels {
            if let Some(Attached { held: Held::Direct(d), .. }) = self.attached.remove(&l) {
                out.push((l, d));
            }
        }
        out
    }

    /// How many are served over vfio-user.
    pub(crate) fn served(&self) -> usize {
        self.attached.values().filter(|a| matches!(a.held, Held::Served { .. })).count()
    }

    /// How many are attached.
    pub(crate) fn attached(&self) -> usize {
        self.attached.len()
    }

    fn labels(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.label.clone()).collect()
    }

    /// Notes devices newly removed; returns their labels and why.
    pub(crate) fn newly_removed(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if self.stop.load(Ordering::Relaxed) {
            // A stop cancels every device: that is no removal.
            return out;
        }
        for (l, a) in &mut self.attached {
            if a.removal_seen {
                continue;
            }
            if let Some(why) = a.watch.removed() {
                a.removal_seen = true;
                *self.removals.entry(l.clone()).or_default() += 1;
                out.push((l.clone(), why));
            }
        }
        out
    }

    /// Detaches everything (at the stop).
    pub(crate) fn detach_all(&mut self) {
        let labels: Vec<String> = self.attached.keys().cloned().collect();
        for l in labels {
            if let Err(e) = self.detach(&l) {
                log::error!("{e}");
            }
        }
    }

    /// Reads the file again; attaches added entries, detaches removed ones, re-attaches
    /// changed ones; untouched ones are not disturbed. Refused, nothing changed, if the file
    /// does not validate or changes what needs a restart.
    pub(crate) fn reload(&mut self) -> Result<Value, String> {
        let mut file: HostFile = config::read(&self.path)?;
        if let Some(d) = &self.driver {
            file.link.driver = Some(d.clone());
        }
        if let Some(p) = &self.poll {
            file.link.poll = Some(p.clone());
        }
        let all =
            file.attachments(self.server.as_deref()).map_err(|e| format!("{}: {e}", self.path.display()))?;
        if file.pool.is_some() {
            return Err(format!("{}: give [[attach]] or [pool], not both", self.path.display()));
        }
        let fixed = self.file.restart_only_changes(&file);
        if !fixed.is_empty() {
            return Err(format!(
                "{}: {} changed: that needs a restart",
                self.path.display(),
                fixed.join(", ")
            ));
        }
        let new = entries(all);
        let (mut added, mut removed, mut changed, mut unchanged, mut failed) =
            (vec![], vec![], vec![], vec![], vec![]);
        let old = std::mem::take(&mut self.entries);
        for o in &old {
            match new.iter().find(|n| n.label == o.label) {
                None => {
                    if self.attached.contains_key(&o.label) {
                        let _ = self.detach(&o.label);
                    }
                    removed.push(o.label.clone());
                }
                Some(n) if self.file.same_attach(o.index, &file, n.index) => unchanged.push(o.label.clone()),
                Some(_) => {
                    if self.attached.contains_key(&o.label) {
                        let _ = self.detach(&o.label);
                    }
                    changed.push(o.label.clone());
                }
            }
        }
        self.entries = new;
        self.file = file;
        for n in self.entries.clone() {
            let is_new = !old.iter().any(|o| o.label == n.label);
            if is_new {
                added.push(n.label.clone());
            }
            if (is_new || changed.contains(&n.label))
                && let Err(e) = self.attach(&n.label)
            {
                log::error!("reload: {e}");
                failed.push(json!({"device": n.label, "error": e}));
            }
        }
        Ok(
            json!({"added": added, "removed": removed, "changed": changed, "unchanged": unchanged, "failed": failed}),
        )
    }

    /// Answers one control call.
    pub(crate) fn answer(&mut self, c: &Call) -> Result<Value, RpcError> {
        match c.method.as_str() {
            "status" => {
                c.only_params(&[])?;
                let drivers: Vec<&'static str> = self.attached.values().map(|a| a.driver).collect();
                Ok(json!({
                    "role": "host",
                    "version": env!("CARGO_PKG_VERSION"),
                    "pid": std::process::id(),
                    "uptime_s": uptime_since(self.started),
                    "driver": drivers.first().copied(),
                    "poll": match self.entries.first().map(|e| e.opts.poll) {
                        Some(link::driver::PollMode::Busy { .. }) => "busy",
                        _ => "blocking",
                    },
                    "config": self.path.display().to_string(),
                    "devices": self.entries.len(),
                    "attached": self.attached.len(),
                }))
            }
            "devices" => {
                c.only_params(&[])?;
                Ok(Value::Array(self.entries.iter().map(|e| self.device_json(e)).collect()))
            }
            "sessions" => {
                c.only_params(&[])?;
                let mut out = Vec::new();
                for e in &self.entries {
                    let Some(a) = self.attached.get(&e.label) else { continue };
                    let s = a.watch.stats();
                    let mut v = json!({
                        "device": e.label,
                        "peer": e.opts.server.to_string(),
                        "since": a.since.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
                    });
                    if let (Value::Object(m), Value::Object(l)) = (&mut v, link_json(&s.link)) {
                        m.extend(l);
                    }
                    out.push(v);
                }
                Ok(Value::Array(out))
            }
            "stats" => {
                c.only_params(&[])?;
                let mut m = serde_json::Map::new();
                for e in &self.entries {
                    if let Some(a) = self.attached.get(&e.label) {
                        m.insert(e.label.clone(), host_stats_json(&a.watch.stats()));
                    }
                }
                Ok(json!({"devices": m, "surprise_removals": self.removals}))
            }
            "attach" | "detach" => {
                c.only_params(&["name"])?;
                let name = c.str_param("name")?;
                let r = if c.method == "attach" { self.attach(&name) } else { self.detach(&name) };
                r.map_err(RpcError::failed)?;
                Ok(json!({ format!("{}ed", c.method): name }))
            }
            "reload" => {
                c.only_params(&[])?;
                self.reload().map_err(RpcError::failed)
            }
            "metrics" => Ok(Value::String(self.metrics().render())),
            m => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!(
                    "no method '{m}' (dxpu host has: status, devices, sessions, stats, attach, detach, reload)"
                ),
            )),
        }
    }

    fn device_json(&self, e: &Entry) -> Value {
        let a = self.attached.get(&e.label);
        let stats = a.map(|a| a.watch.stats());
        let state = match a {
            None => "detached",
            Some(a) if a.watch.removed().is_some() => "removed",
            Some(_) => "attached",
        };
        json!({
            "name": e.label,
            "device": e.opts.device,
            "server": e.opts.server.to_string(),
            "host_view": e.opts.device_id.to_string(),
            "box_id": a.map(|a| a.watch.box_id().to_string()),
            "state": state,
            "removed": a.and_then(|a| a.watch.removed()),
            "vfio_user_socket": e.socket.as_ref().map(|p| p.display().to_string()),
            "counters": stats.as_ref().map(host_stats_json),
        })
    }

    fn metrics(&self) -> Exposition {
        let mut x = host_exposition();
        for e in &self.entries {
            let a = self.attached.get(&e.label);
            let state = match a {
                None => "detached",
                Some(a) if a.watch.removed().is_some() => "removed",
                Some(_) => "attached",
            };
            let removals = self.removals.get(&e.label).copied().unwrap_or(0);
            let stats = a.map(|a| a.watch.stats());
            device_metrics(&mut x, &e.label, &e.opts.server.to_string(), state, removals, stats.as_ref());
        }
        x
    }
}

/// A host endpoint's exposition, before its devices.
pub(crate) fn host_exposition() -> Exposition {
    let mut x = Exposition::default();
    x.gauge(
        "up",
        "The endpoint runs (1), by role and version",
        labels(&[("role", "host"), ("version", env!("CARGO_PKG_VERSION"))]),
        1.0,
    );
    x
}

/// One device's metrics on a host: its info (state, box), removals, and with `stats` (an
/// attached device) its TLPs, DMA, interrupts, timeouts, register-read latency and link.
pub(crate) fn device_metrics(
    x: &mut Exposition,
    label: &str,
    peer: &str,
    state: &str,
    removals: u64,
    stats: Option<&HostStats>,
) {
    x.gauge(
        "device_info",
        "A configured device (1), with its state and box as labels",
        labels(&[("device", label), ("peer", peer), ("state", state)]),
        1.0,
    );
    let d = labels(&[("device", label)]);
    x.counter("surprise_removals", "Devices seen removed (link down, box gone, fenced)", d.clone(), removals);
    let Some(s) = stats else { return };
    for (dir, m) in [("sent", &s.tlps_sent), ("received", &s.tlps_received)] {
        for (kind, n) in m {
            x.counter(
                "tlps",
                "TLPs by kind and direction",
                labels(&[("device", label), ("direction", dir), ("kind", kind)]),
                *n,
            );
        }
    }
    for (op, n, bytes, outside) in [
        ("read", s.dma_reads, s.dma_read_bytes, s.dma_read_refused),
        ("write", s.dma_writes, s.dma_write_bytes, s.dma_write_dropped),
    ] {
        let l = labels(&[("device", label), ("op", op)]);
        x.counter("dma", "Device DMA into granted windows", l.clone(), n);
        x.counter("dma_bytes", "Bytes of device DMA into granted windows", l.clone(), bytes);
        x.counter("dma_outside_windows", "Device DMA outside every granted window (refused)", l, outside);
    }
    for (name, help, v) in [
        ("interrupts", "MSI-X messages received", s.interrupts),
        ("completion_timeouts", "Non-posted requests that timed out", s.completion_timeouts),
        ("failed_requests", "Non-posted requests failed (link down, device removed)", s.failed_requests),
        ("stray_completions", "Completions matching no request", s.stray_completions),
        ("unclaimed_mmio", "MMIO to addresses no BAR claims", s.unclaimed_mmio),
    ] {
        x.counter(name, help, d.clone(), v);
    }
    mmio_histogram(x, &d, &s.mmio_reads);
    link_metrics(x, &labels(&[("device", label), ("peer", peer)]), &s.link);
}

fn mmio_histogram(x: &mut Exposition, l: &crate::metrics::Labels, h: &LatencyHistogram) {
    x.log2_histogram(
        "mmio_read_seconds",
        "Register reads through the bridges, request to completion",
        l.clone(),
        &h.buckets,
        1e-9,
        h.sum_ns as f64 * 1e-9,
    );
}

pub(crate) fn host_stats_json(s: &HostStats) -> Value {
    json!({
        "tlps_sent": s.tlps_sent, "tlps_received": s.tlps_received,
        "dma_reads": s.dma_reads, "dma_writes": s.dma_writes,
        "dma_read_bytes": s.dma_read_bytes, "dma_write_bytes": s.dma_write_bytes,
        "dma_read_refused": s.dma_read_refused, "dma_write_dropped": s.dma_write_dropped,
        "interrupts": s.interrupts, "completion_timeouts": s.completion_timeouts,
        "failed_requests": s.failed_requests, "stray_completions": s.stray_completions,
        "unclaimed_mmio": s.unclaimed_mmio, "malformed_tlps": s.malformed_tlps,
        "mmio_reads": s.mmio_reads.count(),
        "mmio_read_p50_ns": s.mmio_reads.quantile_ns(0.5), "mmio_read_p99_ns": s.mmio_reads.quantile_ns(0.99),
        "link": link_json(&s.link),
    })
}

/// The main loop of `dxpu host` with `[[attach]]` and no `--workload`: watches removals,
/// answers control calls and scrapes, reloads on SIGHUP, until a signal stops it. Returns
/// whether every device stayed.
pub(crate) fn serve(rt: &mut HostRuntime, hup: &AtomicBool) -> Result<bool, String> {
    let calls = Calls::new();
    let control =
        rt.file.control.socket.as_deref().map(|p| ControlServer::bind(p, calls.sender())).transpose()?;
    let _metrics = match rt.file.metrics.listen()? {
        Some(a) => Some(MetricsServer::bind(a, calls.sender())?),
        None => None,
    };
    log::info!(
        "{} device(s) attached, {} served over vfio-user; SIGINT or SIGTERM detaches and exits",
        rt.attached(),
        rt.served()
    );
    crate::notify::ready(&format!("{} device(s) attached", rt.attached()));
    let mut ok = true;
    while !rt.stop.load(Ordering::Relaxed) {
        if let Some(c) = calls.next_within(Duration::from_millis(50)) {
            let r = rt.answer(&c);
            c.answer(r);
        }
        for (label, why) in rt.newly_removed() {
            ok = false;
            if control.is_some() {
                log::error!(
                    "{label}: removed ({why}); `dxpu ctl detach {label}` then `attach {label}` to take it again"
                );
            } else {
                log::error!("{label}: removed ({why}); exiting");
                rt.stop.store(true, Ordering::Relaxed);
            }
        }
        if hup.swap(false, Ordering::Relaxed) {
            crate::notify::reloading();
            match rt.reload() {
                Ok(v) => log::info!("reloaded {}: {v}", rt.path.display()),
                Err(e) => log::error!("reload refused, still running on the old configuration: {e}"),
            }
            crate::notify::ready(&format!("{} device(s) attached", rt.attached()));
        }
    }
    crate::notify::notify("STOPPING=1");
    rt.stop.store(true, Ordering::Relaxed);
    rt.detach_all();
    Ok(ok)
}
