//! The host's run time with `[[attach]]`: its devices, each attached on a thread of its own
//! and tried again with backoff, the control calls and the metrics it answers, and the
//! configuration file read and applied (`process` runs it as a process).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use bridge::attach::Origin;
use bridge_host::vfio_user::ServedDevice;
use bridge_host::{AttachOptions, RemoteDevice, RemovalWatch};
use serde_json::{Value, json};

use crate::config::{self, HostFile, LinkOverride, ServedSocket};
use crate::control::{Call, METHOD_NOT_FOUND, RpcError, unix_seconds, uptime_since};
use crate::metrics::{Exposition, labels};

use crate::error::RunError;
use crate::stats::{DeviceLabels, device_metrics, host_exposition, host_stats_json, link_json};

/// The wait before re-attaching a device whose attach failed or which was removed: from
/// `RETRY_MIN`, doubling with jitter, to `RETRY_MAX` (a box down for a day is asked about
/// twice a minute, and hosts that lost one box together do not come back in step).
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The host's control methods (`rpc_get_methods` lists them; `metrics` is the scrapes').
pub const METHODS: [&str; 9] =
    ["status", "devices", "sessions", "stats", "attach", "detach", "reload", "running", "rpc_get_methods"];

/// One `[[attach]]`: its options and vfio-user socket, by label (the device's name, or
/// `device@server` where two boxes export the same name).
#[derive(Clone)]
pub struct Entry {
    pub(crate) label: String,
    /// Its index among the file's `[[attach]]`.
    index: usize,
    pub(crate) opts: AttachOptions,
    pub(crate) socket: Option<ServedSocket>,
}

/// An attached device: held here, or served to a VMM on a thread of its own.
enum Held {
    Direct(RemoteDevice),
    Served(ServedDevice),
}

impl Held {
    /// Gives the device back to its box (a vfio-user server stops first: its VMM sees the
    /// socket close).
    fn detach(self, label: &str) -> Result<(), RunError> {
        match self {
            Held::Direct(d) => d.detach(),
            Held::Served(s) => {
                s.stop().map_err(|source| RunError::Served { label: label.to_string(), source })?.detach()
            }
        }
        Ok(())
    }
}

struct Attached {
    held: Held,
    watch: RemovalWatch,
    since: SystemTime,
    /// The UDP driver carrying its session.
    driver: &'static str,
}

/// What one `[[attach]]` is doing.
enum Slot {
    /// Not wanted: detached by `dxpu ctl detach`.
    Detached,
    /// An attempt on a thread of its own; `waiters` are `ctl attach` calls, answered when
    /// it ends.
    Attaching {
        attempt: JoinHandle<Result<Attached, String>>,
        started: Instant,
        waiters: Vec<Call>,
    },
    Up(Attached),
    /// The last attempt failed, or the device was removed: tried again at `retry`.
    Down {
        why: String,
        since: SystemTime,
        retry: Instant,
    },
}

/// Per-slot counts and the slot's backoff.
struct SlotLife {
    slot: Slot,
    /// Attempts that failed, and removals, in a row (0 once up).
    failures: u32,
    waits: pool::Backoff,
    /// Attach attempts that failed, in all.
    attach_failures: u64,
    /// Surprise removals seen.
    removals: u64,
    /// Why the last attempt failed or the device was last removed (kept while it is tried
    /// again; cleared once it is up).
    last_error: Option<String>,
    /// What the box said of the device at its last attach (kept while it is down, so that
    /// its metrics' labels do not change).
    origin: Option<Origin>,
}

impl SlotLife {
    fn new() -> SlotLife {
        SlotLife {
            slot: Slot::Detached,
            failures: 0,
            waits: pool::Backoff::new(RETRY_MIN, RETRY_MAX),
            attach_failures: 0,
            removals: 0,
            last_error: None,
            origin: None,
        }
    }

    fn state(&self) -> &'static str {
        match &self.slot {
            Slot::Detached => "detached",
            Slot::Attaching { .. } => "attaching",
            Slot::Up(a) if a.watch.removed().is_some() => "removed",
            Slot::Up(a) if a.watch.silent() => "silent",
            Slot::Up(_) => "attached",
            Slot::Down { .. } => "down",
        }
    }

    fn attached(&self) -> Option<&Attached> {
        match &self.slot {
            Slot::Up(a) => Some(a),
            _ => None,
        }
    }
}

/// The host endpoint's devices and what it was configured with.
pub struct HostRuntime {
    pub(crate) path: PathBuf,
    pub(crate) file: HostFile,
    /// `--server`, `--driver`, `--poll` as given (a reload applies them again).
    pub(super) overrides: Overrides,
    pub(crate) entries: Vec<Entry>,
    slots: BTreeMap<String, SlotLife>,
    /// Attempts whose slot was detached or reconfigured meanwhile: what they attach is
    /// given back as soon as they end.
    orphans: Vec<(String, JoinHandle<Result<Attached, String>>)>,
    pub(super) stop: Arc<AtomicBool>,
    started: Instant,
    /// A capture's tap, given to every attach.
    pub(crate) tap: Option<link::driver::Tap>,
    /// Whether a failed attach is tried again (not for `--workload`, which takes the first
    /// attempts' outcome).
    pub(crate) retries: bool,
}

/// Labels each attachment: the device's name, or `device@server` where it repeats.
pub fn entries(all: Vec<(AttachOptions, Option<ServedSocket>)>) -> Vec<Entry> {
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

/// One attach attempt, on its own thread: the session, the device's identity, and its
/// vfio-user server where the entry has a socket.
fn attach_entry(e: Entry, stop: Arc<AtomicBool>, tap: Option<link::driver::Tap>) -> Result<Attached, String> {
    let label = e.label;
    let mut o = e.opts;
    // A signal ends an attach in progress and every wait on an attached device at once.
    o.cancel = Some(stop);
    o.tap = tap;
    let (name, id, wait) = (o.device.clone(), o.device_id, o.poll);
    let mut d = RemoteDevice::attach(o).map_err(|err| match err {
        bridge_host::AttachError::Cancelled => format!("{label}: stopped by a signal while attaching"),
        err => format!("{label}: {err}"),
    })?;
    let ids = driver::PciFunction::config_read(&mut d, 0);
    let driver = d.driver_name();
    log::info!("{name} at {id}: vendor {:#06x} device {:#06x}", ids & 0xffff, ids >> 16);
    let watch = d.removal_watch();
    let held = match e.socket {
        None => Held::Direct(d),
        Some(ServedSocket { path, access }) => Held::Served(
            ServedDevice::spawn(&name, &path, access, d, wait)
                .map_err(|err| format!("{label}: vfio-user: {err}"))?,
        ),
    };
    Ok(Attached { held, watch, since: SystemTime::now(), driver })
}

impl HostRuntime {
    /// The runtime of `entries` read from `path`, nothing attached yet.
    pub fn new(
        path: PathBuf,
        file: HostFile,
        overrides: Overrides,
        entries: Vec<Entry>,
        stop: Arc<AtomicBool>,
    ) -> HostRuntime {
        let slots = entries.iter().map(|e| (e.label.clone(), SlotLife::new())).collect();
        HostRuntime {
            path,
            file,
            overrides,
            entries,
            slots,
            orphans: Vec::new(),
            stop,
            started: Instant::now(),
            tap: None,
            retries: true,
        }
    }

    /// Starts an attempt to attach `label` on its own thread (ends at once if it is attached
    /// or being attached).
    fn start_attach(&mut self, label: &str) -> Result<(), String> {
        let Some(e) = self.entries.iter().find(|e| e.label == label).cloned() else {
            return Err(format!(
                "attach {label}: no such [[attach]] in {} (configured: {})",
                self.path.display(),
                self.labels().join(", ")
            ));
        };
        let life = self.slots.entry(label.to_string()).or_insert_with(SlotLife::new);
        if matches!(life.slot, Slot::Up(_) | Slot::Attaching { .. }) {
            return Ok(());
        }
        let (stop, tap) = (self.stop.clone(), self.tap.clone());
        let attempt = std::thread::Builder::new()
            .name(format!("dxpu-attach-{}", e.opts.device))
            .spawn(move || attach_entry(e, stop, tap))
            .map_err(|err| format!("attach {label}: starting its thread: {err}"))?;
        life.slot = Slot::Attaching { attempt, started: Instant::now(), waiters: Vec::new() };
        Ok(())
    }

    /// Starts attaching every configured device, each on its own thread.
    pub fn attach_all(&mut self) {
        for l in self.labels() {
            if let Err(e) = self.start_attach(&l) {
                log::error!("{e}");
            }
        }
    }

    /// Whether every device's first attempt has ended (attached or down).
    pub fn settled(&self) -> bool {
        !self.slots.values().any(|s| matches!(s.slot, Slot::Attaching { .. }))
    }

    /// Moves every slot on: attempts that ended become up or down (answering their `ctl
    /// attach` calls), removed devices are given back and go down, devices down whose wait
    /// is over are tried again. Returns whether anything changed state.
    pub fn step(&mut self) -> bool {
        let mut changed = false;
        let now = Instant::now();
        let stopping = self.stop.load(Ordering::Relaxed);
        for (label, life) in &mut self.slots {
            match &mut life.slot {
                Slot::Attaching { attempt, .. } if attempt.is_finished() => {
                    let Slot::Attaching { attempt, started, waiters } =
                        std::mem::replace(&mut life.slot, Slot::Detached)
                    else {
                        continue;
                    };
                    changed = true;
                    let result = attempt
                        .join()
                        .unwrap_or_else(|_| Err(format!("{label}: the attach thread panicked")));
                    match result {
                        Ok(a) => {
                            log::info!("{label}: attached in {:.3} s", started.elapsed().as_secs_f64());
                            life.origin = a.watch.origin().or(life.origin.take());
                            (life.failures, life.slot, life.last_error) = (0, Slot::Up(a), None);
                            life.waits.reset();
                            for w in waiters {
                                w.answer(Ok(json!({ "attached": label })));
                            }
                        }
                        Err(why) => {
                            life.failures += 1;
                            life.attach_failures += 1;
                            let wait = life.waits.next_wait();
                            if stopping {
                                log::info!("{why}");
                            } else if !self.retries {
                                log::error!("{why} (not tried again: --workload takes the first attempt)");
                            } else {
                                log::error!(
                                    "{why}; trying again in {:.1} s (attempt {} failed)",
                                    wait.as_secs_f64(),
                                    life.failures
                                );
                            }
                            for w in waiters {
                                w.answer(Err(RpcError::failed(&why)));
                            }
                            life.last_error = Some(why.clone());
                            life.slot = Slot::Down { why, since: SystemTime::now(), retry: now + wait };
                        }
                    }
                }
                Slot::Up(a) if !stopping => {
                    let Some(why) = a.watch.removed() else { continue };
                    let Slot::Up(a) = std::mem::replace(&mut life.slot, Slot::Detached) else { continue };
                    changed = true;
                    life.removals += 1;
                    life.failures += 1;
                    let wait = life.waits.next_wait();
                    log::error!(
                        "{label}: removed ({why}); given back, attaching again in {:.1} s",
                        wait.as_secs_f64()
                    );
                    if let Err(e) = a.held.detach(label) {
                        log::error!("{e}");
                    }
                    let why = format!("removed: {why}");
                    life.last_error = Some(why.clone());
                    life.slot = Slot::Down { why, since: SystemTime::now(), retry: now + wait };
                }
                _ => {}
            }
        }
        let due: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, l)| matches!(l.slot, Slot::Down { retry, .. } if retry <= now))
            .map(|(k, _)| k.clone())
            .collect();
        if !stopping {
            for l in due {
                changed = true;
                if let Err(e) = self.start_attach(&l) {
                    log::error!("{e}");
                }
            }
        }
        let (done, pending): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.orphans).into_iter().partition(|(_, t)| t.is_finished());
        self.orphans = pending;
        for (label, t) in done {
            if let Ok(Ok(a)) = t.join()
                && let Err(e) = a.held.detach(&label)
            {
                log::error!("{e}");
            }
        }
        changed
    }

    /// `dxpu ctl attach NAME`: an attempt now (the call answered when it ends), unless it is
    /// attached already.
    pub(super) fn attach_call(&mut self, c: Call) {
        let name = match c.only_params(&["name"]).and_then(|()| c.str_param("name")) {
            Ok(n) => n,
            Err(e) => return c.answer(Err(e)),
        };
        if let Some(SlotLife { slot: Slot::Up(_), .. }) = self.slots.get(&name) {
            return c.answer(Err(RpcError::failed(format!("attach {name}: already attached"))));
        }
        if let Err(e) = self.start_attach(&name) {
            return c.answer(Err(RpcError::failed(e)));
        }
        if let Some(SlotLife { slot: Slot::Attaching { waiters, .. }, .. }) = self.slots.get_mut(&name) {
            waiters.push(c);
        }
    }

    /// Detaches `label`: a vfio-user server stops (its VMM sees the socket close), the box
    /// takes the device back; an attempt in progress is abandoned (what it attaches is given
    /// back), a retry cancelled. It stays detached until `ctl attach` or a reload.
    pub fn detach(&mut self, label: &str) -> Result<(), RunError> {
        let Some(life) = self.slots.get_mut(label) else {
            return Err(RunError::NotConfigured { label: label.to_string(), configured: self.labels() });
        };
        match std::mem::replace(&mut life.slot, Slot::Detached) {
            Slot::Detached => return Err(RunError::NotAttached { label: label.to_string() }),
            Slot::Up(a) => a.held.detach(label)?,
            Slot::Attaching { attempt, waiters, .. } => {
                for w in waiters {
                    w.answer(Err(RpcError::failed(format!("attach {label}: detached while attaching"))));
                }
                self.orphans.push((label.to_string(), attempt));
            }
            Slot::Down { .. } => {}
        }
        life.failures = 0;
        life.waits.reset();
        log::info!("{label}: detached");
        Ok(())
    }

    /// The devices held here, not served over vfio-user (for `--workload`).
    pub fn take_direct(&mut self) -> Vec<(String, RemoteDevice)> {
        let mut out = Vec::new();
        for (l, life) in &mut self.slots {
            if let Slot::Up(Attached { held: Held::Direct(_), .. }) = life.slot
                && let Slot::Up(Attached { held: Held::Direct(d), .. }) =
                    std::mem::replace(&mut life.slot, Slot::Detached)
            {
                out.push((l.clone(), d));
            }
        }
        out
    }

    /// Why each device that is not up is not (for `--workload`).
    pub fn down(&self) -> Vec<(String, String)> {
        self.slots
            .iter()
            .filter_map(|(l, s)| match &s.slot {
                Slot::Down { why, .. } => Some((l.clone(), why.clone())),
                _ => None,
            })
            .collect()
    }

    /// How many are served over vfio-user.
    pub fn served(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s.slot, Slot::Up(Attached { held: Held::Served(_), .. })))
            .count()
    }

    /// How many are attached.
    pub fn attached(&self) -> usize {
        self.slots.values().filter(|s| s.attached().is_some()).count()
    }

    fn labels(&self) -> Vec<String> {
        self.entries.iter().map(|e| e.label.clone()).collect()
    }

    /// What the service manager is told: how many are up, and which are not and why.
    pub fn status_line(&self) -> String {
        let down: Vec<String> = self
            .slots
            .iter()
            .filter(|(_, s)| s.attached().is_none())
            .map(|(l, s)| match &s.slot {
                Slot::Down { why, .. } => format!("{l} down ({why})"),
                _ => format!("{l} {}", s.state()),
            })
            .collect();
        let mut line = format!("{} of {} device(s) attached", self.attached(), self.slots.len());
        if !down.is_empty() {
            line.push_str("; ");
            line.push_str(&down.join("; "));
        }
        // One line: sd_notify's STATUS ends at a newline.
        line.replace('\n', " ")
    }

    /// Detaches everything (at the stop); attempts in progress end (the stop flag cancels
    /// them) and what they attached is given back.
    pub fn detach_all(&mut self) {
        let labels: Vec<String> = self.slots.keys().cloned().collect();
        for l in labels {
            if let Some(life) = self.slots.get_mut(&l) {
                match std::mem::replace(&mut life.slot, Slot::Detached) {
                    Slot::Up(a) => {
                        if let Err(e) = a.held.detach(&l) {
                            log::error!("{e}");
                        }
                    }
                    Slot::Attaching { attempt, waiters, .. } => {
                        for w in waiters {
                            w.answer(Err(RpcError::failed(format!("attach {l}: the endpoint is stopping"))));
                        }
                        self.orphans.push((l.clone(), attempt));
                    }
                    Slot::Detached | Slot::Down { .. } => {}
                }
            }
        }
        for (label, t) in std::mem::take(&mut self.orphans) {
            match t.join() {
                Ok(Ok(a)) => {
                    if let Err(e) = a.held.detach(&label) {
                        log::error!("{e}");
                    }
                }
                Ok(Err(why)) => log::info!("{why}"),
                Err(_) => log::error!("{label}: the attach thread panicked"),
            }
        }
    }

    /// Applies a configuration read and validated elsewhere ([`read_host_file`]): attaches
    /// added entries, detaches removed ones, re-attaches changed ones (each attach on its own
    /// thread, as at the start); untouched ones are not disturbed. Refused, nothing changed,
    /// if it changes what needs a restart.
    pub fn apply(
        &mut self,
        file: HostFile,
        all: Vec<(AttachOptions, Option<ServedSocket>)>,
    ) -> Result<Value, RunError> {
        let fixed = self.file.restart_only_changes(&file);
        if !fixed.is_empty() {
            return Err(RunError::NeedsRestart {
                path: self.path.display().to_string(),
                what: fixed.join(", "),
            });
        }
        let new = entries(all);
        let (mut added, mut removed, mut changed, mut unchanged) = (vec![], vec![], vec![], vec![]);
        let old = std::mem::take(&mut self.entries);
        // Detaching looks a label up among the entries: the old ones until the new apply.
        self.entries = old.clone();
        for o in &old {
            match new.iter().find(|n| n.label == o.label) {
                None => {
                    let _ = self.detach(&o.label);
                    self.slots.remove(&o.label);
                    removed.push(o.label.clone());
                }
                Some(n) if self.file.same_attach(o.index, &file, n.index) => unchanged.push(o.label.clone()),
                Some(_) => {
                    let _ = self.detach(&o.label);
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
                && let Err(e) = self.start_attach(&n.label)
            {
                log::error!("reload: {e}");
            }
        }
        Ok(json!({"added": added, "removed": removed, "changed": changed, "unchanged": unchanged}))
    }

    /// Answers one control call.
    pub fn answer(&mut self, c: &Call) -> Result<Value, RpcError> {
        match c.method.as_str() {
            "status" => {
                c.only_params(&[])?;
                let drivers: Vec<&'static str> =
                    self.slots.values().filter_map(|s| s.attached().map(|a| a.driver)).collect();
                Ok(json!({
                    "role": "host",
                    "version": env!("CARGO_PKG_VERSION"),
                    "pid": std::process::id(),
                    "uptime_seconds": uptime_since(self.started),
                    "driver": drivers.first().copied(),
                    "poll": match self.entries.first().map(|e| e.opts.poll) {
                        Some(link::driver::PollMode::Busy { .. }) => "busy",
                        _ => "blocking",
                    },
                    "config": self.path.display().to_string(),
                    "devices": self.entries.len(),
                    "attached": self.attached(),
                    // Ready (`/readyz`) once every configured device is attached.
                    "ready": self.attached() == self.entries.len(),
                    "not_ready": (self.attached() < self.entries.len()).then(|| self.status_line()),
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
                    let Some(a) = self.slots.get(&e.label).and_then(SlotLife::attached) else { continue };
                    let s = a.watch.stats();
                    let mut v = json!({
                        "device": e.label,
                        "peer": e.opts.server.to_string(),
                        "since_unix_seconds": unix_seconds(a.since),
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
                    if let Some(a) = self.slots.get(&e.label).and_then(SlotLife::attached) {
                        m.insert(e.label.clone(), host_stats_json(&a.watch.stats()));
                    }
                }
                let removals: BTreeMap<&String, u64> =
                    self.slots.iter().filter(|(_, s)| s.removals > 0).map(|(l, s)| (l, s.removals)).collect();
                Ok(json!({"devices": m, "surprise_removals": removals}))
            }
            "detach" => {
                c.only_params(&["name"])?;
                let name = c.str_param("name")?;
                self.detach(&name).map_err(RpcError::failed)?;
                Ok(json!({ "detached": name }))
            }
            "running" => {
                // What runs, for `dxpu host --check --against-running`.
                c.only_params(&[])?;
                Ok(self.file.fingerprint())
            }
            "rpc_get_methods" => {
                c.only_params(&[])?;
                Ok(serde_json::json!(METHODS))
            }
            "metrics" => Ok(Value::String(self.metrics().render())),
            m => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("no method '{m}' (dxpu host has: {})", METHODS.join(", ")),
            )),
        }
    }

    fn device_json(&self, e: &Entry) -> Value {
        let life = self.slots.get(&e.label);
        let a = life.and_then(SlotLife::attached);
        let stats = a.map(|a| a.watch.stats());
        let origin = life.and_then(|l| l.origin.as_ref());
        let (retry_in, since) = match life.map(|l| &l.slot) {
            Some(Slot::Down { retry, since, .. }) => (
                Some(retry.saturating_duration_since(Instant::now()).as_secs_f64()),
                Some(unix_seconds(*since)),
            ),
            Some(Slot::Up(a)) => (None, Some(unix_seconds(a.since))),
            _ => (None, None),
        };
        let error = life.and_then(|l| l.last_error.clone());
        json!({
            "name": e.label,
            "device": e.opts.device,
            "server": e.opts.server.to_string(),
            "host_view": e.opts.device_id.to_string(),
            "box_id": a.map(|a| a.watch.box_id().to_string()),
            "box": origin.map(|o| o.box_name.clone()),
            "pci_address": origin.map(|o| o.pci_address.clone()),
            "vendor_id": origin.map(|o| format!("{:#06x}", o.vendor_id)),
            "device_id": origin.map(|o| format!("{:#06x}", o.device_id)),
        "state": life.map_or("detached", SlotLife::state),
            "since_unix_seconds": since,
            "removed": a.and_then(|a| a.watch.removed()),
            "error": error,
            "retry_in_seconds": retry_in,
            "attach_failures": life.map_or(0, |l| l.attach_failures),
            "vfio_user_socket": e.socket.as_ref().map(|s| s.path.display().to_string()),
            "counters": stats.as_ref().map(host_stats_json),
        })
    }

    fn metrics(&self) -> Exposition {
        let mut x = host_exposition();
        for e in &self.entries {
            let life = self.slots.get(&e.label);
            let state = life.map_or("detached", SlotLife::state);
            let removals = life.map_or(0, |l| l.removals);
            let stats = life.and_then(SlotLife::attached).map(|a| a.watch.stats());
            let peer = e.opts.server.to_string();
            let dev =
                DeviceLabels { label: &e.label, peer: &peer, origin: life.and_then(|l| l.origin.as_ref()) };
            device_metrics(&mut x, &dev, state, removals, stats.as_ref());
            let d = labels(&[("device", &e.label)]);
            x.gauge(
                "device_up",
                "The device is attached and its link up (1), or not (0)",
                d.clone(),
                if state == "attached" { 1.0 } else { 0.0 },
            );
            x.counter(
                "attach_failures",
                "Attach attempts that failed (the box unreachable or refusing)",
                d,
                life.map_or(0, |l| l.attach_failures),
            );
        }
        x
    }
}

/// The command line's `--server`, and its `--driver` and `--poll`, over every reading of the
/// host's file.
pub type Overrides = (Option<String>, LinkOverride);

/// A host's configuration as read: the file and its attachments (options, vfio-user socket).
pub type HostConfig = (HostFile, Vec<(AttachOptions, Option<ServedSocket>)>);

/// Reads and validates the host's configuration file, with the command line's overrides:
/// the file and its attachments. Runs off the main loop (`crate::reload::PendingRead`).
pub fn read_host_file(path: &std::path::Path, overrides: &Overrides) -> Result<HostConfig, RunError> {
    let (server, link) = overrides;
    let mut file: HostFile = config::read(path)?;
    file.override_link(*link);
    let in_file = || path.display().to_string();
    let all =
        file.attachments(server.as_deref()).map_err(|source| RunError::InFile { path: in_file(), source })?;
    if file.pool.is_some() {
        return Err(RunError::AttachAndPool { path: in_file() });
    }
    Ok((file, all))
}
