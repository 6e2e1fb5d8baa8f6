//! `dxpu gpu` serving: the endpoint's loop with its control socket, metrics, SIGHUP reload
//! and readiness signal. Control calls and scrapes are answered between polls, from a
//! channel looked at once per pass; a reload changes exports and hosts in place.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bridge_gpu::{ExportReport, GpuEndpoint, GpuOptions, SessionReport};
use serde_json::{Value, json};

use crate::config::{self, GpuFile, LinkOverride};
use crate::control::{Call, Calls, ControlServer, METHOD_NOT_FOUND, RpcError, uptime_since};
use crate::error::RunError;
use crate::metrics::{Exposition, MetricsServer, labels, link_metrics};
use crate::reload::{PendingRead, READ_DEADLINE, ReadState};
pub use crate::stats::link_json;

/// What `dxpu gpu` runs on besides the endpoint.
pub struct GpuRuntime {
    /// The configuration file, read again on reload.
    pub(crate) path: PathBuf,
    /// The file as last applied.
    pub(crate) file: GpuFile,
    /// `--listen` as given (it overrides every reading of the file).
    pub(crate) listen: Option<String>,
    /// `--driver` and `--poll` as given (over every reading of the file).
    pub(crate) link: LinkOverride,
    /// The options last applied.
    pub(crate) opts: GpuOptions,
    pub(crate) started: Instant,
    /// The pool agent's counters, where the box is in a pool.
    pub(crate) pool_stats: Option<std::sync::Arc<pool::AgentStats>>,
}

impl GpuRuntime {
    /// Reads the file as `dxpu gpu` starts (with the command line's overrides): the run time
    /// [`serve`] keeps, and the options to make the endpoint with.
    pub fn start(start: &GpuStart) -> Result<(GpuRuntime, GpuOptions), RunError> {
        let (file, opts) = read_options(&start.config, start.listen.as_deref(), start.link)?;
        let rt = GpuRuntime {
            path: start.config.clone(),
            file,
            listen: start.listen.clone(),
            link: start.link,
            opts: opts.clone(),
            started: Instant::now(),
            pool_stats: None,
        };
        Ok((rt, opts))
    }
}

/// The box's control methods (`rpc_get_methods` lists them; `metrics` is the scrapes').
pub const METHODS: [&str; 9] =
    ["status", "devices", "sessions", "stats", "export", "unexport", "reload", "running", "rpc_get_methods"];

/// A box's configuration as read: the file and the options it gives.
type GpuConfig = (GpuFile, GpuOptions);

/// Serves until `stop`; SIGHUP (`hup`) reloads. Control and metrics run if configured.
pub fn serve(
    ep: &mut GpuEndpoint,
    rt: &mut GpuRuntime,
    stop: &AtomicBool,
    hup: &AtomicBool,
) -> Result<(), RunError> {
    let calls = Calls::new();
    let _control =
        rt.file.control.socket.as_deref().map(|p| ControlServer::bind(p, calls.sender())).transpose()?;
    let _metrics = match rt.file.metrics.listen()? {
        Some(a) => Some(MetricsServer::bind(a, calls.sender())?),
        None => None,
    };
    let listen = ep.local_addr().map_err(RunError::Serving)?;
    crate::notify::ready(&format!("listening on {listen}"));
    // Files are read off this loop, which carries every device's TLPs: a key file that
    // blocks costs the reload, not the sessions (docs/reliability.md).
    let mut reload: Option<PendingRead<GpuConfig, RunError>> = None;
    let mut reload_again = false;
    let mut exports: Vec<(PendingRead<GpuConfig, RunError>, Call, String)> = Vec::new();
    let mut watchdog = crate::notify::Watchdog::from_env();
    while !stop.load(Ordering::Relaxed) {
        watchdog.tick();
        if !ep.poll().map_err(RunError::Serving)? {
            ep.wait().map_err(RunError::Serving)?;
        }
        if hup.swap(false, Ordering::Relaxed) {
            if reload.is_some() {
                reload_again = true;
            } else {
                reload = start_read(rt, true);
            }
        }
        while let Some(c) = calls.try_next() {
            match c.method.as_str() {
                "reload" => match c.only_params(&[]) {
                    Err(e) => c.answer(Err(e)),
                    Ok(()) => {
                        if reload.is_none() {
                            reload = start_read(rt, true);
                        }
                        match reload.as_mut() {
                            Some(r) => r.wait_with(c),
                            None => {
                                c.answer(Err(RpcError::failed("reload: could not start reading the file")))
                            }
                        }
                    }
                },
                "export" => match c.only_params(&["name"]).and_then(|()| c.str_param("name")) {
                    Err(e) => c.answer(Err(e)),
                    Ok(name) => match start_read(rt, false) {
                        Some(r) => exports.push((r, c, name)),
                        None => c.answer(Err(RpcError::failed("export: could not start reading the file"))),
                    },
                },
                _ => {
                    let r = answer(ep, rt, &c);
                    c.answer(r);
                }
            }
        }
        if let Some(mut r) = reload.take() {
            match r.poll() {
                ReadState::Reading => reload = Some(r),
                ReadState::Done(read) => {
                    let applied = read.and_then(|(file, opts)| apply(ep, rt, file, opts));
                    match &applied {
                        Ok(v) => log::info!("reloaded {}: {v}", rt.path.display()),
                        Err(e) => log::error!("reload refused, still running on the old configuration: {e}"),
                    }
                    r.answer(&applied);
                    crate::notify::ready(&format!("listening on {listen}"));
                    if std::mem::take(&mut reload_again) {
                        reload = start_read(rt, true);
                    }
                }
            }
        }
        let mut i = 0;
        while i < exports.len() {
            let ReadState::Done(read) = exports[i].0.poll() else {
                i += 1;
                continue;
            };
            let (_, c, name) = exports.swap_remove(i);
            c.answer(read.and_then(|(_, opts)| export(ep, rt, &opts, &name)).map_err(RpcError::failed));
        }
    }
    crate::notify::notify("STOPPING=1");
    if let Some(r) = reload {
        r.answer(&Err::<Value, _>(RunError::Stopping));
    }
    for (_, c, name) in exports {
        c.answer(Err(RpcError::failed(format!("export {name}: the endpoint is stopping"))));
    }
    ep.shutdown().map_err(RunError::Serving)
}

/// Starts reading the file off the loop (for a reload: said to the service manager).
fn start_read(rt: &GpuRuntime, reloading: bool) -> Option<PendingRead<GpuConfig, RunError>> {
    if reloading {
        crate::notify::reloading();
    }
    let (path, listen, link) = (rt.path.clone(), rt.listen.clone(), rt.link);
    match PendingRead::start(rt.path.display().to_string(), READ_DEADLINE, move || {
        read_options(&path, listen.as_deref(), link)
    }) {
        Ok(r) => Some(r),
        Err(e) => {
            log::error!("{e}");
            None
        }
    }
}

/// `dxpu ctl export NAME`: the `[[device]]` of that name in the file as just read.
fn export(ep: &mut GpuEndpoint, rt: &GpuRuntime, opts: &GpuOptions, name: &str) -> Result<Value, RunError> {
    let Some(spec) = opts.exports.iter().find(|e| e.name == name) else {
        let (name, path) = (name.to_string(), rt.path.display().to_string());
        return Err(RunError::NoSuchExport { name, path });
    };
    ep.add_export(spec)?;
    Ok(json!({"exported": name}))
}

fn answer(ep: &mut GpuEndpoint, rt: &mut GpuRuntime, c: &Call) -> Result<Value, RpcError> {
    match c.method.as_str() {
        "status" => {
            c.only_params(&[])?;
            let not_ready = not_ready(ep, rt);
            Ok(json!({
                "role": "gpu",
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "uptime_seconds": uptime_since(rt.started),
                "listen": ep.local_addr().map(|a| a.to_string()).unwrap_or_default(),
                "driver": ep.driver_name(),
                "poll": poll_name(&rt.opts),
                "config": rt.path.display().to_string(),
                "devices": ep.export_names().len(),
                "sessions": ep.session_reports().len(),
                "hosts": ep.host_names(),
                "pool": rt.file.pool.is_some(),
                "ready": not_ready.is_none(),
                "not_ready": not_ready,
            }))
        }
        "devices" => {
            c.only_params(&[])?;
            Ok(Value::Array(ep.export_reports().iter().map(device_json).collect()))
        }
        "sessions" => {
            c.only_params(&[])?;
            Ok(Value::Array(ep.session_reports().iter().map(session_json).collect()))
        }
        "stats" => {
            c.only_params(&[])?;
            Ok(stats_json(ep))
        }
        "unexport" => {
            c.only_params(&["name"])?;
            let name = c.str_param("name")?;
            ep.remove_export(&name).map_err(RpcError::failed)?;
            Ok(json!({"unexported": name}))
        }
        "running" => {
            // What runs, for `dxpu gpu --check --against-running`.
            c.only_params(&[])?;
            Ok(rt.file.fingerprint(&rt.opts))
        }
        "rpc_get_methods" => {
            c.only_params(&[])?;
            Ok(serde_json::json!(METHODS))
        }
        "metrics" => Ok(Value::String(metrics(ep, rt).render())),
        m => Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("no method '{m}' (dxpu gpu has: {})", METHODS.join(", ")),
        )),
    }
}

fn poll_name(o: &GpuOptions) -> &'static str {
    match o.poll {
        link::driver::PollMode::Busy { .. } => "busy",
        link::driver::PollMode::Blocking => "blocking",
    }
}

/// The file as it is now, with the command line's overrides (`--listen`, `--driver`,
/// `--poll`), and the options it gives (validated exactly as at start). Runs off the loop.
fn read_options(
    path: &std::path::Path,
    listen: Option<&str>,
    link: LinkOverride,
) -> Result<(GpuFile, GpuOptions), RunError> {
    let mut file: GpuFile = config::read(path)?;
    file.link.over = link;
    let opts = file
        .options(listen)
        .map_err(|source| RunError::InFile { path: path.display().to_string(), source })?;
    Ok((file, opts))
}

/// Applies a file read and validated off the loop: exports added, removed, or changed
/// (removed and exported again; only their allow list: changed in place), hosts added,
/// removed and re-keyed (`apply_hosts`).
/// Refused, nothing changed, if it changes what needs a restart.
fn apply(
    ep: &mut GpuEndpoint,
    rt: &mut GpuRuntime,
    file: GpuFile,
    opts: GpuOptions,
) -> Result<Value, RunError> {
    let needs_restart = |what: String| RunError::NeedsRestart { path: rt.path.display().to_string(), what };
    let fixed = rt.file.restart_only_changes(&file);
    if !fixed.is_empty() {
        return Err(needs_restart(fixed.join(", ")));
    }
    let hosts = apply_hosts(ep, rt, &file, &opts)?;
    let (mut added, mut removed, mut changed, mut unchanged) = (vec![], vec![], vec![], vec![]);
    for old in &rt.opts.exports {
        match opts.exports.iter().find(|n| n.name == old.name) {
            None => {
                ep.remove_export(&old.name)?;
                removed.push(old.name.clone());
            }
            Some(n) if n == old => unchanged.push(old.name.clone()),
            Some(n) if n.device == old.device => {
                ep.set_allow(&n.name, &n.allow)?;
                changed.push(n.name.clone());
            }
            Some(n) => {
                ep.remove_export(&old.name)?;
                ep.add_export(n)?;
                changed.push(n.name.clone());
            }
        }
    }
    for n in opts.exports.iter().filter(|n| !rt.opts.exports.iter().any(|o| o.name == n.name)) {
        ep.add_export(n)?;
        added.push(n.name.clone());
    }
    rt.file = file;
    rt.opts = opts;
    Ok(
        json!({"added": added, "removed": removed, "changed": changed, "unchanged": unchanged, "hosts": hosts}),
    )
}

/// The hosts a reload changes, each without touching another's sessions: added, removed
/// (sessions ended, devices released), re-keyed (the old key accepted for the file's
/// `key_overlap_s` more). What it did, for the reload's answer.
fn apply_hosts(
    ep: &mut GpuEndpoint,
    rt: &GpuRuntime,
    file: &GpuFile,
    opts: &GpuOptions,
) -> Result<Value, RunError> {
    let in_file = |source| RunError::InFile { path: rt.path.display().to_string(), source };
    let overlap = file.key_overlap().map_err(in_file)?;
    let (mut added, mut removed, mut rekeyed) = (vec![], vec![], vec![]);
    for h in &rt.opts.hosts {
        match opts.hosts.iter().find(|n| n.name == h.name) {
            None => {
                ep.remove_host(&h.name)?;
                removed.push(h.name.clone());
            }
            Some(n) if n.key.key_id() != h.key.key_id() => {
                ep.rekey_host(&n.name, n.key.clone(), overlap)?;
                rekeyed.push(n.name.clone());
            }
            Some(_) => {}
        }
    }
    for h in opts.hosts.iter().filter(|h| !rt.opts.hosts.iter().any(|o| o.name == h.name)) {
        ep.add_host(h.clone())?;
        log::info!("host {} added", h.name);
        added.push(h.name.clone());
    }
    Ok(
        json!({"added": added, "removed": removed, "rekeyed": rekeyed, "old_keys_accepted_s": overlap.as_secs()}),
    )
}

/// Why the box is not ready to be attached (`/readyz`), if it is not: no healthy device, or
/// in a pool no lease held (not registered yet, or fenced and not registered again).
fn not_ready(ep: &GpuEndpoint, rt: &GpuRuntime) -> Option<String> {
    let reports = ep.export_reports();
    if !reports.iter().any(|r| r.health.is_none()) {
        return Some(format!("none of its {} device(s) is healthy", reports.len()));
    }
    let c = rt.pool_stats.as_ref()?.counts();
    (c.leases <= c.fences).then(|| "not registered in the pool (no lease held)".to_string())
}

fn device_json(r: &ExportReport) -> Value {
    let s = &r.stats;
    json!({
        "name": r.name,
        "box_id": r.id.to_string(),
        "pci_address": r.pci_address,
        "backing": r.backing,
        "vendor_id": format!("{:#06x}", r.identity.vendor_id),
        "device_id": format!("{:#06x}", r.identity.device_id),
        "class": format!("{:#08x}", r.identity.class),
        "largest_bar_bytes": r.identity.largest_bar,
        "allow": r.identity.allow,
        "state": r.state(),
        "owner": r.owner.as_ref().map(|o| o.0.clone()),
        "session": r.owner.as_ref().map(|o| format!("{:#010x}", o.1)),
        "token": r.owner.as_ref().and_then(|o| o.2),
        "health": r.health,
        "counters": {
            "attaches": s.attaches, "refusals": s.refusals, "host_requests": s.host_requests,
            "dma_requests": s.device_requests, "dma_completions": s.device_completions,
            "dma_dropped": s.dma_dropped, "tlps_too_large": s.too_large, "resets": s.resets,
            "claims_revoked": s.claims_revoked, "stale_tokens": s.stale_tokens,
        },
    })
}

fn session_json(r: &SessionReport) -> Value {
    let mut v = json!({
        "session": format!("{:#010x}", r.id),
        "host": r.host,
        "peer": r.peer.to_string(),
        "device": r.device,
        "since_unix_seconds": crate::control::unix_seconds(r.since),
    });
    if let (Value::Object(m), Value::Object(l)) = (&mut v, link_json(&r.link)) {
        m.extend(l);
    }
    v
}

fn stats_json(ep: &mut GpuEndpoint) -> Value {
    let s = ep.stats();
    let h = ep.endpoint_stats();
    let exports: serde_json::Map<String, Value> =
        ep.export_reports().iter().map(|r| (r.name.clone(), device_json(r)["counters"].clone())).collect();
    json!({
        "sessions_up": s.sessions_up,
        "sessions_closed_by_hosts": s.sessions_closed_by_hosts,
        "sessions_silent": s.sessions_silent,
        "unowned_requests": s.unowned_requests,
        "bad_control": s.bad_control,
        "malformed_tlps": s.malformed_tlps,
        "link_datagrams_too_large": s.datagrams_too_large,
        "largest_payload_received_bytes": s.largest_payload_received,
        "handshakes": {
            "cookies_sent": h.cookies_sent, "bad_cookies": h.bad_cookies, "expired_cookies": h.expired_cookies,
            "unknown_key": h.unknown_key, "auth_failures": h.auth_failures, "stale_handshakes": h.stale_handshakes,
            "refused_full": h.refused_full, "peer_restarts": h.peer_restarts, "bad_handshakes": h.bad_handshakes,
            "dropped_malformed": h.dropped_malformed, "dropped_unknown_session": h.dropped_unknown_session,
        },
        "exports": exports,
    })
}

fn metrics(ep: &mut GpuEndpoint, rt: &GpuRuntime) -> Exposition {
    let mut x = Exposition::default();
    x.gauge(
        "up",
        "The endpoint runs (1), by role and version",
        labels(&[("role", "gpu"), ("version", env!("CARGO_PKG_VERSION"))]),
        1.0,
    );
    crate::metrics::build_info(&mut x);
    let box_name = rt.file.box_name();
    let hosts: Vec<String> = rt.opts.hosts.iter().map(|h| h.name.clone()).collect();
    for r in ep.export_reports() {
        let vendor = format!("{:#06x}", r.identity.vendor_id);
        let device = format!("{:#06x}", r.identity.device_id);
        // dcgm-exporter's form, so that the two join: the real device's address for a VFIO
        // device, the box-side BDF (domain 0) for a simulated one.
        let pci = crate::metrics::dcgm_bus_id(&r.pci_address);
        x.gauge(
            "device_info",
            "An exported device (1): its box, PCI address and IDs (labels that do not change)",
            labels(&[
                ("device", &r.name),
                ("box", &box_name),
                ("pci_bus_id", &pci),
                ("vendor_id", &vendor),
                ("device_id", &device),
            ]),
            1.0,
        );
        for st in ["free", "attached", "unhealthy"] {
            x.gauge(
                "device_state",
                "1 for the device's state, 0 for the others (free, attached, unhealthy)",
                labels(&[("device", &r.name), ("state", st)]),
                if r.state() == st { 1.0 } else { 0.0 },
            );
        }
        let owner = r.owner.as_ref().map(|o| o.0.as_str());
        for h in &hosts {
            x.gauge(
                "device_owner",
                "1 for the host that holds the device, 0 for every other host the box knows",
                labels(&[("device", &r.name), ("host", h)]),
                if owner == Some(h.as_str()) { 1.0 } else { 0.0 },
            );
        }
        let d = labels(&[("device", &r.name)]);
        let s = &r.stats;
        for (name, help, v) in [
            ("device_attaches", "Successful attaches", s.attaches),
            ("device_refusals", "Attaches refused", s.refusals),
            ("device_host_requests", "Requests from the owner executed against the device", s.host_requests),
            ("device_dma_requests", "Requests the device originated (DMA, MSI-X)", s.device_requests),
            (
                "device_dma_completions",
                "Completions from the owner for the device's reads",
                s.device_completions,
            ),
            ("device_dma_dropped", "Device DMA dropped at resets", s.dma_dropped),
            ("device_tlps_too_large", "Device TLPs that did not fit the link", s.too_large),
            ("device_resets", "Function-level resets on release", s.resets),
            ("device_claims_revoked", "Owners cut off because their pool claim went", s.claims_revoked),
            ("device_stale_tokens", "Attaches refused for a claim the pool did not hold", s.stale_tokens),
        ] {
            x.counter(name, help, d.clone(), v);
        }
    }
    for r in ep.session_reports() {
        // The peer's address without its port: a host's port changes at every reconnect.
        let peer = r.peer.ip().to_string();
        let l = labels(&[("host", &r.host), ("peer", &peer), ("device", r.device.as_deref().unwrap_or(""))]);
        link_metrics(&mut x, &l, &r.link);
    }
    endpoint_metrics(&mut x, ep);
    if let Some(p) = &rt.pool_stats {
        crate::stats::pool_agent_metrics(&mut x, "box", &p.counts());
    }
    x
}

/// The box's own series: its sessions, what it refused or dropped, its handshakes.
fn endpoint_metrics(x: &mut Exposition, ep: &mut GpuEndpoint) {
    let s = ep.stats();
    let h = ep.endpoint_stats();
    x.counter("sessions_up", "Sessions that came up", vec![], s.sessions_up);
    x.counter(
        "sessions_closed_by_hosts",
        "Sessions their host closed (CLOSE), rather than leaving them to time out",
        vec![],
        s.sessions_closed_by_hosts,
    );
    x.counter("bad_control", "Control messages that did not parse", vec![], s.bad_control);
    x.gauge(
        "largest_payload_received_bytes",
        "The largest data payload a host sent (at most the Max_Payload_Size its attach negotiated)",
        vec![],
        s.largest_payload_received as f64,
    );
    x.gauge("sessions", "Sessions live now (hosts connected)", vec![], ep.session_reports().len() as f64);
    x.counter(
        "sessions_silent",
        "Times a host's link fell silent for the idle timeout (ridden through if heard again)",
        vec![],
        s.sessions_silent,
    );
    x.counter("unowned_requests", "Requests from sessions owning no device", vec![], s.unowned_requests);
    x.counter("malformed_tlps", "TLPs from hosts that did not parse", vec![], s.malformed_tlps);
    x.counter(
        "link_datagrams_too_large",
        "Datagrams the kernel refused as larger than the route carries whole (Don't Fragment set)",
        vec![],
        s.datagrams_too_large,
    );
    // The reasons are `dxpu ctl stats`' names for the same counters (docs/wire-protocol.md).
    for (why, n) in [
        ("unknown_key", h.unknown_key),
        ("auth_failures", h.auth_failures),
        ("bad_cookies", h.bad_cookies),
        ("expired_cookies", h.expired_cookies),
        ("stale_handshakes", h.stale_handshakes),
        ("refused_full", h.refused_full),
        ("bad_handshakes", h.bad_handshakes),
    ] {
        x.counter("handshakes_refused", "Handshakes refused, by reason", labels(&[("reason", why)]), n);
    }
    x.counter(
        "handshake_cookies",
        "COOKIEs, by direction: sent (INITs without a valid cookie)",
        labels(&[("direction", "sent")]),
        h.cookies_sent,
    );
    x.counter(
        "handshake_peer_restarts",
        "Sessions replaced because their peer restarted",
        vec![],
        h.peer_restarts,
    );
    for (why, n) in [("malformed", h.dropped_malformed), ("unknown_session", h.dropped_unknown_session)] {
        x.counter(
            "handshake_datagrams_dropped",
            "Datagrams no session took: not frames (malformed), or for a session that is not live (unknown_session)",
            labels(&[("reason", why)]),
            n,
        );
    }
}

/// How `dxpu gpu` was started: the file and the command line's overrides.
#[derive(Clone, Debug, Default)]
pub struct GpuStart {
    /// The configuration file.
    pub config: PathBuf,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--driver` and `--poll`.
    pub link: LinkOverride,
    /// `--capture FILE` and its size bound.
    pub capture: Option<(PathBuf, u64)>,
}

/// `dxpu gpu --check`: the file read and validated as a start would (key files, the pool
/// section), nothing started; what it would serve.
pub fn check(start: &GpuStart) -> Result<String, RunError> {
    let (file, opts) = read_options(&start.config, start.listen.as_deref(), start.link)?;
    let in_file = |source| RunError::InFile { path: start.config.display().to_string(), source };
    if let Some(p) = &file.pool {
        p.pool(&opts.exports).map_err(in_file)?;
    }
    file.control.check().map_err(in_file)?;
    // What the start will open: each VFIO device, bound to vfio-pci and reachable.
    for e in &opts.exports {
        if let bridge_gpu::DeviceSpec::Vfio(addr) = &e.device {
            hw::vfio::check_ready(addr)
                .map_err(|why| RunError::DeviceNotReady { device: e.name.clone(), why: why.to_string() })?;
        }
    }
    Ok(format!(
        "listen {}, {} device(s), {} host(s){}",
        opts.listen,
        opts.exports.len(),
        opts.hosts.len(),
        if file.pool.is_some() { ", in a pool" } else { "" }
    ))
}

/// `dxpu gpu --check --against-running`: the file validated as `--check` does, then compared
/// with what the daemon on its `[control]` socket runs: what a reload would do, or what needs
/// a restart.
pub fn check_against_running(start: &GpuStart) -> Result<crate::against::Comparison, RunError> {
    check(start)?;
    let (file, opts) = read_options(&start.config, start.listen.as_deref(), start.link)?;
    crate::against::against_running(&start.config, file.control.socket.as_deref(), &file.fingerprint(&opts))
}

/// `dxpu gpu`: reads the file, starts the endpoint (and its pool agent), serves until
/// SIGINT / SIGTERM, reloads on SIGHUP; the error says what was wrong.
pub fn run(start: GpuStart) -> Result<(), RunError> {
    let (mut rt, mut opts) = GpuRuntime::start(&start)?;
    let file = rt.file.clone();
    let capture = match &start.capture {
        Some((f, limit)) => Some(crate::capture::Capture::create(f, *limit)?),
        None => None,
    };
    // The endpoint's options alone get the tap: the capture ends with the endpoint.
    opts.tap = capture.as_ref().and_then(|c| c.tap());
    let stop = crate::process::stop_flag()?;
    let opts_exports = opts.exports.clone();
    let hup = crate::process::hup_flag()?;
    let mut ep = GpuEndpoint::new(opts)?;
    let addr = ep.local_addr().map_err(RunError::Serving)?;
    log::info!("listening on {addr}");
    let agent = match &file.pool {
        Some(p) => Some({
            let path = || start.config.display().to_string();
            let gp = p.pool(&opts_exports).map_err(|source| RunError::InFile { path: path(), source })?;
            crate::pool_host::start_box(&mut ep, &gp)
                .map_err(|source| RunError::Pool { path: path(), source })?
        }),
        None => None,
    };
    rt.pool_stats = agent.as_ref().map(pool::BoxAgent::stats);
    let served = serve(&mut ep, &mut rt, &stop, &hup);
    // The devices leave the pool at once (their lease revoked) rather than at its expiry.
    if let Some(a) = agent {
        a.stop();
    }
    served?;
    let exports = ep.stats().exports;
    // The endpoint's tap goes with it: the capture's writer has the last packet.
    drop(ep);
    if let Some(c) = capture
        && let Err(e) = c.finish()
    {
        log::error!("{e}");
    }
    for (name, s) in exports {
        log::info!(
            "{name}: {} attaches, {} refused, {} host requests, {} device requests, {} DMA dropped at resets",
            s.attaches,
            s.refusals,
            s.host_requests,
            s.device_requests,
            s.dma_dropped
        );
    }
    log::info!("stopped");
    Ok(())
}
