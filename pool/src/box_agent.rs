//! The box side: registration under a lease kept alive, and the claims on the box's devices
//! as etcd holds them, kept current by a watch ([`ClaimTable`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::etcd::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
    WatchResponse,
};
use bridge_gpu::{ClaimCheck, ClaimVerdict};
use tokio::sync::mpsc;

use crate::{
    BoxRecord, ClaimRecord, DeviceRecord, Keys, PoolConfig, PoolError, RevocationRecord, decode, encode,
    etcd_error,
};

/// The claims on one box's devices, as far as the box has read etcd.
#[derive(Debug, Default)]
pub struct ClaimTable {
    inner: Mutex<TableInner>,
    generation: AtomicU64,
}

#[derive(Debug, Default)]
struct TableInner {
    /// device → (host, token).
    claims: HashMap<String, (String, u64)>,
    /// device → the revision through which its claim is known (a look-up, an event).
    known: HashMap<String, i64>,
    /// The revision through which every claim of the box is known (snapshot, watch).
    revision: i64,
    /// Look-up tickets issued.
    tickets: u64,
    /// device → (the last ticket answered for it, the revision its answer read).
    answered: HashMap<String, (u64, i64)>,
    /// device → (the token of its claim an operator revoked, who did).
    revoked: HashMap<String, (u64, String)>,
}

impl TableInner {
    /// [`ClaimTable::apply`] under the table's lock: whether anything changed.
    fn apply(&mut self, device: &str, claim: Option<(String, u64)>, revision: i64) -> bool {
        let known = self.known.get(device).copied().unwrap_or(0).max(self.revision);
        if revision <= known {
            return false;
        }
        match claim {
            Some(c) => self.claims.insert(device.to_string(), c),
            None => self.claims.remove(device),
        };
        self.known.insert(device.to_string(), revision);
        true
    }
}

impl ClaimTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, TableInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// Everything anew, as read at `revision`.
    fn reset(&self, claims: HashMap<String, (String, u64)>, revision: i64) {
        let mut g = self.lock();
        g.claims = claims;
        g.known.clear();
        g.revision = revision;
        drop(g);
        self.bump();
    }

    fn ticket(&self) -> u64 {
        let mut g = self.lock();
        g.tickets += 1;
        g.tickets
    }

    /// The answer to look-up `ticket`: `device`'s claim as etcd held it at `revision`. The
    /// claim and the answer land under one lock: a verdict between the two would see the
    /// look-up answered and its claim not yet, and refuse a claim just made as never issued.
    fn answer(&self, device: &str, ticket: u64, claim: Option<(String, u64)>, revision: i64) {
        {
            let mut g = self.lock();
            g.apply(device, claim, revision);
            let a = g.answered.entry(device.to_string()).or_insert((0, 0));
            if ticket > a.0 {
                *a = (ticket, revision);
            }
        }
        self.bump();
    }

    /// `device`'s claim as of `revision` (an event, or a look-up), unless already known
    /// through a later one.
    fn apply(&self, device: &str, claim: Option<(String, u64)>, revision: i64) {
        if self.lock().apply(device, claim, revision) {
            self.bump();
        }
    }

    /// Claim `token` on `device` was revoked by `by` (its record read before the claim's
    /// deletion is applied, so that the cut-off says who).
    fn note_revoked(&self, device: &str, token: u64, by: &str) {
        self.lock().revoked.insert(device.to_string(), (token, by.to_string()));
    }

    /// Every claim of the box is known through `revision` (a watch response's header).
    fn advance(&self, revision: i64) {
        let mut g = self.lock();
        if revision > g.revision {
            g.revision = revision;
            drop(g);
            self.bump();
        }
    }

    /// The claim on `device`: host and token.
    pub fn current(&self, device: &str) -> Option<(String, u64)> {
        self.lock().claims.get(device).cloned()
    }

    /// Whether `host` holds `device` with `token`, as far as etcd has been read; with a
    /// look-up's `ticket`, once it is answered, no token is unknown any more
    /// (`bridge_gpu::ClaimCheck::verdict`).
    pub fn verdict(&self, device: &str, host: &str, token: u64, ticket: Option<u64>) -> ClaimVerdict {
        let g = self.lock();
        let held = g.claims.get(device);
        if held.is_some_and(|(h, t)| h == host && *t == token) {
            return ClaimVerdict::Valid;
        }
        let known = g.known.get(device).copied().unwrap_or(0).max(g.revision);
        // etcd's revisions are positive i64s: anything else was never issued.
        let Ok(revision) = i64::try_from(token) else {
            return ClaimVerdict::Refused(format!("token {token} is not a revision etcd issues"));
        };
        if token == 0 {
            return ClaimVerdict::Refused("token 0 is not a revision etcd issues".into());
        }
        if known >= revision {
            ClaimVerdict::Refused(match held {
                Some((h, t)) if *t > token => format!("stale: etcd holds a newer claim ({t}, by {h})"),
                Some((h, t)) => format!("etcd holds claim {t} by {h}"),
                None => match g.revoked.get(device) {
                    Some((t, by)) if *t == token => format!("revoked by {by}"),
                    _ => format!("etcd holds no claim on it (as of revision {known})"),
                },
            })
        } else if let (Some(t), Some((answered, read))) = (ticket, g.answered.get(device))
            && *answered >= t
        {
            ClaimVerdict::Refused(format!(
                "etcd never issued token {token}: a look-up made after the attach read revision {read}"
            ))
        } else {
            ClaimVerdict::Unknown
        }
    }
}

/// What the endpoint holds: the table and a way to ask for a look-up.
struct ClaimView {
    table: Arc<ClaimTable>,
    lookups: mpsc::UnboundedSender<(String, u64)>,
}

impl ClaimCheck for ClaimView {
    fn generation(&self) -> u64 {
        self.table.generation.load(Ordering::Acquire)
    }
    fn verdict(&self, device: &str, host: &str, token: u64, ticket: Option<u64>) -> ClaimVerdict {
        self.table.verdict(device, host, token, ticket)
    }
    fn look_up(&self, device: &str) -> u64 {
        let ticket = self.table.ticket();
        let _ = self.lookups.send((device.to_string(), ticket));
        ticket
    }
}

/// The box's agent: registers the devices, keeps the lease alive, watches the claims.
pub struct BoxAgent {
    table: Arc<ClaimTable>,
    lookups: mpsc::UnboundedSender<(String, u64)>,
    health: mpsc::UnboundedSender<(String, String)>,
    stop: Arc<tokio::sync::Notify>,
    stopping: Arc<AtomicBool>,
    registered: Arc<AtomicBool>,
    registrations: Arc<AtomicU64>,
    stream_resumes: Arc<AtomicU64>,
    stats: Arc<crate::AgentStats>,
    thread: Option<JoinHandle<()>>,
}

impl BoxAgent {
    /// Starts the agent's thread. It registers `devices` (name, record) under `box_name` and
    /// keeps trying while etcd is unreachable (said in the log); [`BoxAgent::registered`]
    /// tells when it has.
    pub fn start(
        cfg: PoolConfig,
        box_name: &str,
        devices: Vec<(String, DeviceRecord)>,
    ) -> Result<BoxAgent, PoolError> {
        cfg.validate()?;
        for (d, _) in &devices {
            if !crate::keys::valid_name(d) {
                return Err(PoolError::Config(format!(
                    "device {d:?}: a pool device name is 1-64 of A-Z a-z 0-9 - _ ."
                )));
            }
        }
        if !crate::keys::valid_name(box_name) {
            return Err(PoolError::Config(format!("box = {box_name:?}: 1-64 of A-Z a-z 0-9 - _ .")));
        }
        let table = Arc::new(ClaimTable::default());
        let (lookups, rx) = mpsc::unbounded_channel();
        let (health, health_rx) = mpsc::unbounded_channel();
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopping = Arc::new(AtomicBool::new(false));
        let registered = Arc::new(AtomicBool::new(false));
        let (registrations, stream_resumes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let stats = Arc::new(crate::AgentStats::default());
        let rt = crate::runtime().map_err(|e| PoolError::Config(format!("tokio runtime: {e}")))?;
        let pid = std::process::id();
        let owner = BoxRecord {
            instance: format!("{:016x}", (crate::unix_now_nanos() as u64) ^ (u64::from(pid) << 40)),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map_or_else(|_| "?".into(), |h| h.trim().to_string()),
            pid,
            advertise: devices.first().map_or_else(String::new, |(_, r)| r.advertise.clone()),
            since: crate::unix_now(),
        };
        let run = BoxAgentState {
            cfg,
            keys: Keys::new("/"),
            box_name: box_name.to_string(),
            owner,
            devices,
            table: table.clone(),
            stop: stop.clone(),
            stopping: stopping.clone(),
            registered: registered.clone(),
            registrations: registrations.clone(),
            stream_resumes: stream_resumes.clone(),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("dxpu-pool-box".into())
            .spawn(move || rt.block_on(run.main(rx, health_rx)))
            .map_err(|e| PoolError::Config(format!("starting the pool thread: {e}")))?;
        Ok(BoxAgent {
            table,
            lookups,
            health,
            stop,
            stopping,
            registered,
            registrations,
            stream_resumes,
            stats,
            thread: Some(thread),
        })
    }

    /// Whether the devices are registered (with the current lease).
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::Acquire)
    }

    /// How many leases the devices were registered under (1 while the first lease lives,
    /// however often its streams broke and were resumed).
    pub fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::Relaxed)
    }

    /// How many times the watch and keep-alive were reopened on the same lease.
    pub fn stream_resumes(&self) -> u64 {
        self.stream_resumes.load(Ordering::Relaxed)
    }

    /// The agent's counters: leases, renewals, registrations ended (fences), etcd's errors.
    pub fn stats(&self) -> Arc<crate::AgentStats> {
        self.stats.clone()
    }

    /// The claims, for `bridge_gpu::GpuEndpoint::set_claims`.
    pub fn claim_check(&self) -> Box<dyn ClaimCheck> {
        Box::new(ClaimView { table: self.table.clone(), lookups: self.lookups.clone() })
    }

    /// Something that reports a device's health (`ok`, or why not) to the pool: its record
    /// is rewritten, and hosts no longer claim it (`dxpu pool ls` says `unhealthy`).
    pub fn health_reporter(&self) -> impl FnMut(&str, &str) + Send + 'static {
        let tx = self.health.clone();
        move |device: &str, health: &str| {
            let _ = tx.send((device.to_string(), health.to_string()));
        }
    }

    /// The table itself.
    pub fn table(&self) -> Arc<ClaimTable> {
        self.table.clone()
    }

    /// Revokes the lease (the devices leave the pool at once) and ends the thread.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BoxAgent {
    fn drop(&mut self) {
        self.shut_down();
    }
}

struct BoxAgentState {
    cfg: PoolConfig,
    keys: Keys,
    box_name: String,
    /// What the box's name record says of this run.
    owner: BoxRecord,
    devices: Vec<(String, DeviceRecord)>,
    table: Arc<ClaimTable>,
    stop: Arc<tokio::sync::Notify>,
    stopping: Arc<AtomicBool>,
    registered: Arc<AtomicBool>,
    /// Leases registered under, and streams resumed on the same lease.
    registrations: Arc<AtomicU64>,
    stream_resumes: Arc<AtomicU64>,
    stats: Arc<crate::AgentStats>,
}

impl BoxAgentState {
    async fn main(
        mut self,
        mut lookups: mpsc::UnboundedReceiver<(String, u64)>,
        mut health: mpsc::UnboundedReceiver<(String, String)>,
    ) {
        self.keys = Keys::new(&self.cfg.prefix);
        let mut failures = 0u32;
        let mut waits = crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        while !self.stopping.load(Ordering::Acquire) {
            match self.session(&mut lookups, &mut health).await {
                Ok(()) => break,
                Err(e) => {
                    if self.registered.swap(false, Ordering::AcqRel) {
                        // It had been registered: a new run of failures starts.
                        failures = 0;
                        waits.reset();
                    }
                    // The first failure at once, then one in ten; a name held by another box
                    // as an error: this box serves nobody through the pool until it is free.
                    if failures.is_multiple_of(10) {
                        match e {
                            PoolError::NameHeld { .. } => log::error!("pool: {e}; trying again"),
                            _ => log::warn!("pool: {e}; retrying"),
                        }
                    }
                    failures += 1;
                    tokio::select! {
                        _ = tokio::time::sleep(waits.next_wait()) => {}
                        _ = self.stop.notified() => break,
                    }
                }
            }
        }
    }

    /// One lease's life: register the devices under it, then read the claims, watch them and
    /// keep the lease alive — reopening the watch from the revision it had reached and the
    /// keep-alive on the same lease whenever a stream breaks (a member restarted, a GOAWAY),
    /// without registering again. Ends Ok when the agent stops; Err when the lease is gone
    /// (expired or revoked while etcd was unreachable: register again) or could not be had.
    async fn session(
        &mut self,
        lookups: &mut mpsc::UnboundedReceiver<(String, u64)>,
        health: &mut mpsc::UnboundedReceiver<(String, String)>,
    ) -> Result<(), PoolError> {
        let cfg = self.cfg.clone();
        let mut client = crate::connect(&cfg).await?;
        let ttl = cfg.lease_ttl.as_secs() as i64;
        let lease = crate::client::grant_lease(&mut client, &cfg, &self.stats).await?;
        if let Err(e) = self.register(&mut client, lease).await {
            // Nothing of ours lives under it.
            let _ = client.lease_revoke(lease).await;
            return Err(e);
        }
        log::info!(
            "pool: box {} registered {} device(s) with lease {lease:x} ({ttl} s)",
            self.box_name,
            self.devices.len()
        );
        self.registrations.fetch_add(1, Ordering::Relaxed);
        // Where the watch goes on from; None: read the claims afresh first.
        let mut resume: Option<i64> = None;
        let mut broken = 0u32;
        let mut waits = crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match self.serve(&mut client, lease, &mut resume, &mut broken, lookups, health).await {
                Served::Stopped => return Ok(()),
                Served::LeaseGone(e) => {
                    self.stats.fenced();
                    return Err(e);
                }
                Served::StreamBroken(e) => {
                    self.stats.etcd_error();
                    // The devices stay registered: their keys live as long as the lease.
                    if broken.is_multiple_of(10) {
                        log::warn!("pool: {e}; resuming with lease {lease:x}");
                    }
                    broken += 1;
                    self.stream_resumes.fetch_add(1, Ordering::Relaxed);
                    if broken == 1 {
                        // The streams had opened since the last failure: a new run starts.
                        waits.reset();
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(waits.next_wait()) => {}
                        _ = self.stop.notified() => {
                            let _ = client.lease_revoke(lease).await;
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Takes the box's name and registers the devices under `lease`, in one transaction: only
    /// if no box holds the name, or this box itself does (its record left under an older
    /// lease that has not ended yet). A name another box holds is refused — its records stay
    /// its own — naming who holds it and since when.
    async fn register(&mut self, client: &mut crate::etcd::Client, lease: i64) -> Result<(), PoolError> {
        let cfg = &self.cfg;
        let owner_key = self.keys.box_owner(&self.box_name);
        let with_lease = || Some(PutOptions::new().with_lease(lease));
        let puts: Vec<TxnOp> =
            std::iter::once(TxnOp::put(owner_key.clone(), encode(&self.owner), with_lease()))
                .chain(
                    self.devices.iter().map(|(d, r)| {
                        TxnOp::put(self.keys.device(&self.box_name, d), encode(r), with_lease())
                    }),
                )
                .collect();
        let free = Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0);
        let resp = client
            .txn(
                Txn::new().when([free]).and_then(puts.clone()).or_else([TxnOp::get(owner_key.clone(), None)]),
            )
            .await
            .map_err(|e| etcd_error(cfg, "registering the devices", e))?;
        if resp.succeeded() {
            return Ok(());
        }
        let held = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        });
        let Some(kv) = held else {
            // Gone between the compare and the read: the next attempt takes it.
            return Err(PoolError::NotFound(format!("{owner_key}: changed while registering")));
        };
        match decode::<BoxRecord>(&kv) {
            Ok(r) if r.instance == self.owner.instance => {
                // Ours, under a lease we gave up for lost: taken back under this one.
                let same = Compare::mod_revision(owner_key.clone(), CompareOp::Equal, kv.mod_revision());
                let resp = client
                    .txn(Txn::new().when([same]).and_then(puts))
                    .await
                    .map_err(|e| etcd_error(cfg, "registering the devices", e))?;
                match resp.succeeded() {
                    true => Ok(()),
                    false => Err(PoolError::NotFound(format!("{owner_key}: changed while registering"))),
                }
            }
            Ok(r) => Err(PoolError::NameHeld {
                box_name: self.box_name.clone(),
                by: r.to_string(),
                lease: kv.lease,
            }),
            Err(e) => Err(PoolError::NameHeld {
                box_name: self.box_name.clone(),
                by: format!(
                    "a record dxpu cannot read ({e}; delete {owner_key} if no box runs with this name)"
                ),
                lease: kv.lease,
            }),
        }
    }

    /// The watch and the keep-alive on `lease`, opened (from `resume`, or after reading the
    /// claims afresh) and served until one breaks, the lease is gone, or the agent stops.
    async fn serve(
        &mut self,
        client: &mut Client,
        lease: i64,
        resume: &mut Option<i64>,
        broken: &mut u32,
        lookups: &mut mpsc::UnboundedReceiver<(String, u64)>,
        health: &mut mpsc::UnboundedReceiver<(String, String)>,
    ) -> Served {
        let cfg = self.cfg.clone();
        let prefix = self.keys.box_claims(&self.box_name);
        let from = match *resume {
            Some(r) => r,
            None => match self.read_claims(client, &prefix).await {
                Ok(revision) => {
                    *resume = Some(revision + 1);
                    revision + 1
                }
                Err(e) => return Served::StreamBroken(e),
            },
        };
        let watch_opts = WatchOptions::new().with_prefix().with_start_revision(from).with_progress_notify();
        let (_watcher, mut watch) = match client.watch(prefix, Some(watch_opts)).await {
            Ok(w) => w,
            Err(e) => return Served::StreamBroken(etcd_error(&cfg, "watching the claims", e)),
        };
        let (mut keeper, mut alive) = match client.lease_keep_alive(lease).await {
            Ok(k) => k,
            Err(e @ crate::etcd::Error::LeaseGone(_)) => {
                return Served::LeaseGone(etcd_error(&cfg, "keeping the lease alive", e));
            }
            Err(e) => return Served::StreamBroken(etcd_error(&cfg, "keeping the lease alive", e)),
        };
        self.registered.store(true, Ordering::Release);
        *broken = 0;
        let mut renew = tokio::time::interval(cfg.lease_ttl / 3);
        renew.tick().await;
        loop {
            tokio::select! {
                _ = renew.tick() => {
                    let failed = match keeper.keep_alive().await {
                        Err(e) => Some(Served::StreamBroken(etcd_error(&cfg, "renewing the lease", e))),
                        Ok(()) => match tokio::time::timeout(cfg.request_timeout, alive.message()).await {
                            Ok(Ok(Some(r))) if r.ttl() > 0 => None,
                            Ok(Ok(Some(_))) => Some(Served::LeaseGone(PoolError::NotFound(format!("lease {lease:x} expired; registering again")))),
                            Ok(Ok(None)) => Some(Served::StreamBroken(PoolError::NotFound("the lease stream ended".into()))),
                            Ok(Err(e)) => Some(Served::StreamBroken(etcd_error(&cfg, "renewing the lease", e))),
                            Err(_) => Some(Served::StreamBroken(PoolError::NotFound(format!("no lease renewal within {:?}", cfg.request_timeout)))),
                        },
                    };
                    self.stats.renewed(failed.is_none());
                    if let Some(s) = failed {
                        return s;
                    }
                }
                msg = watch.message() => {
                    let resp = match msg {
                        Ok(Some(r)) => r,
                        Ok(None) => return Served::StreamBroken(PoolError::NotFound("the claims watch ended".into())),
                        Err(e) => return Served::StreamBroken(etcd_error(&cfg, "watching the claims", e)),
                    };
                    let revoked = self.revocations(client, &resp).await;
                    if let Some(end) = self.apply_watch(&resp, resume, &revoked) {
                        return end;
                    }
                }
                Some((device, h)) = health.recv() => {
                    let Some((_, r)) = self.devices.iter_mut().find(|(d, _)| *d == device) else { continue };
                    r.health = h;
                    let (key, value) = (self.keys.device(&self.box_name, &device), encode(r));
                    if let Err(e) = client.put(key, value, Some(PutOptions::new().with_lease(lease))).await {
                        return Served::StreamBroken(etcd_error(&cfg, "updating a device's health", e));
                    }
                }
                Some((device, ticket)) = lookups.recv() => {
                    let key = self.keys.claim(&self.box_name, &device);
                    let got = match client.get(key, None).await {
                        Ok(g) => g,
                        Err(e) => return Served::StreamBroken(etcd_error(&cfg, "reading a claim", e)),
                    };
                    let revision = got.header().map_or(0, |h| h.revision());
                    let claim = got.kvs().first().and_then(|kv| {
                        decode::<ClaimRecord>(kv).ok().map(|c| (c.host, kv.create_revision() as u64))
                    });
                    self.table.answer(&device, ticket, claim, revision);
                }
                _ = self.stop.notified() => {
                    let _ = client.lease_revoke(lease).await;
                    log::info!("pool: box {} left the pool (lease {lease:x} revoked)", self.box_name);
                    return Served::Stopped;
                }
            }
        }
    }

    /// Reads the box's claims into the table afresh; the revision read at.
    async fn read_claims(&mut self, client: &mut Client, prefix: &str) -> Result<i64, PoolError> {
        let got = client
            .get(prefix.to_string(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(|e| etcd_error(&self.cfg, "reading the claims", e))?;
        let revision = got.header().map_or(0, |h| h.revision());
        let mut claims = HashMap::new();
        for kv in got.kvs() {
            if let (Some((_, d)), Ok(c)) =
                (self.keys.split(&self.keys.claims(), kv.key()), decode::<ClaimRecord>(kv))
            {
                claims.insert(d.to_string(), (c.host, kv.create_revision() as u64));
            }
        }
        self.table.reset(claims, revision);
        Ok(revision)
    }

    /// Who revoked the claims a watch answer deletes, where an operator did (`dxpu pool
    /// revoke` records it beside the claims): device → record. A record that cannot be read
    /// costs only the attribution.
    async fn revocations(
        &self,
        client: &mut Client,
        resp: &WatchResponse,
    ) -> HashMap<String, RevocationRecord> {
        let mut out = HashMap::new();
        for ev in resp.events() {
            let (EventType::Delete, Some(kv)) = (ev.event_type(), ev.kv()) else { continue };
            let Some((_, d)) = self.keys.split(&self.keys.claims(), kv.key()) else { continue };
            let key = self.keys.revocation(&self.box_name, d);
            match client.get(key.clone(), None).await {
                Ok(got) => {
                    if let Some(r) = got.kvs().first().and_then(|kv| decode::<RevocationRecord>(kv).ok()) {
                        out.insert(d.to_string(), r);
                    }
                }
                Err(e) => log::debug!("pool: reading {key}: {e}"),
            }
        }
        out
    }

    /// One answer of the claims watch applied to the table (with who revoked what it
    /// deletes), and where it resumes from; the end of the serving if the watch was
    /// cancelled.
    fn apply_watch(
        &mut self,
        resp: &WatchResponse,
        resume: &mut Option<i64>,
        revoked: &HashMap<String, RevocationRecord>,
    ) -> Option<Served> {
        if resp.canceled() {
            // Compacted past where it would resume: read the claims afresh.
            if resp.compact_revision() > 0 {
                *resume = None;
            }
            return Some(Served::StreamBroken(PoolError::NotFound(format!(
                "the claims watch was cancelled: {} (compacted to {})",
                resp.cancel_reason(),
                resp.compact_revision()
            ))));
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            *resume = Some(resume.unwrap_or(0).max(kv.mod_revision() + 1));
            let Some((_, d)) = self.keys.split(&self.keys.claims(), kv.key()) else { continue };
            let claim = match ev.event_type() {
                EventType::Put => {
                    decode::<ClaimRecord>(kv).ok().map(|c| (c.host, kv.create_revision() as u64))
                }
                EventType::Delete => {
                    if let (Some(r), Some((_, token))) = (revoked.get(d), self.table.current(d))
                        && r.token == token
                    {
                        self.table.note_revoked(d, token, &r.by);
                    }
                    None
                }
            };
            self.table.apply(d, claim, kv.mod_revision());
        }
        if let Some((revision, progress)) = known_through(resp) {
            if progress {
                *resume = Some(resume.unwrap_or(0).max(revision + 1));
            }
            self.table.advance(revision);
        }
        None
    }
}

/// The revision a watch answer says every claim is known through, and whether it is a
/// progress notification: a progress notification's own (every event through it was sent),
/// or the answer's last event's. Not an answer's header where it carries events: etcd stamps
/// it with the store's revision as it sends, and events still to come on a watch catching up
/// may be older — taken as known, a claim made meanwhile was refused as missing (as of that
/// revision) until its event came (`tests/pool.rs`, under the whole suite's load).
fn known_through(resp: &WatchResponse) -> Option<(i64, bool)> {
    match (resp.events().last().and_then(|e| e.kv()), resp.header()) {
        (Some(kv), _) => Some((kv.mod_revision(), false)),
        (None, Some(h)) => Some((h.revision(), true)),
        (None, None) => None,
    }
}

/// How [`BoxAgentState::serve`] ended.
enum Served {
    /// The agent stops.
    Stopped,
    /// etcd no longer holds the lease: register again under a new one.
    LeaseGone(PoolError),
    /// A stream or request failed: open them again on the same lease.
    StreamBroken(PoolError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_answer_is_known_through_its_last_event_and_a_progress_notification_through_its_header() {
        use crate::etcd::{Event, KeyValue, ResponseHeader};
        let header = |revision| Some(ResponseHeader { revision, ..ResponseHeader::default() });
        let event = |mod_revision| Event {
            kv: Some(KeyValue { mod_revision, ..KeyValue::default() }),
            ..Event::default()
        };
        // Events of revision 3, sent when the store was at 5: a claim at 4 may still come.
        let answer =
            WatchResponse { header: header(5), events: vec![event(2), event(3)], ..WatchResponse::default() };
        assert_eq!(known_through(&answer), Some((3, false)));
        let progress = WatchResponse { header: header(5), ..WatchResponse::default() };
        assert_eq!(known_through(&progress), Some((5, true)));
        assert_eq!(known_through(&WatchResponse::default()), None);
        // Through the table: a token between the event and the header is not refused.
        let t = ClaimTable::default();
        t.reset(HashMap::new(), 2);
        t.apply("gpu0", None, 3);
        t.advance(known_through(&answer).map_or(0, |k| k.0));
        assert_eq!(t.verdict("gpu0", "host-a", 4, None), ClaimVerdict::Unknown);
    }

    #[test]
    fn a_look_ups_answer_and_the_claim_it_read_are_seen_together() {
        // The answer to a look-up and the claim it read land at once: a check between the
        // two once refused a claim just made as "never issued" (the 500-round pool test).
        use std::sync::atomic::AtomicU64;
        let t = std::sync::Arc::new(ClaimTable::default());
        let published = std::sync::Arc::new(AtomicU64::new(0));
        let (t2, p2) = (t.clone(), published.clone());
        let answering = std::thread::spawn(move || {
            // Each claim newer than what the last look-up read, as a claim just made is.
            for token in (10..=200_000u64).step_by(10) {
                let ticket = t2.ticket();
                p2.store(ticket << 32 | token, Ordering::Release);
                t2.answer("gpu0", ticket, Some(("host-a".into(), token)), token as i64 + 1);
            }
        });
        let mut checked = 0u64;
        while !answering.is_finished() {
            let v = published.load(Ordering::Acquire);
            let (ticket, token) = (v >> 32, v & 0xffff_ffff);
            if ticket == 0 {
                continue;
            }
            // Not answered yet (unknown), or answered with the claim (valid): never refused —
            // unless the next claim came meanwhile (this one is stale then), which a second
            // look at what was published tells.
            let verdict = t.verdict("gpu0", "host-a", token, Some(ticket));
            if published.load(Ordering::Acquire) != v {
                continue;
            }
            if let ClaimVerdict::Refused(w) = verdict {
                panic!("token {token}, ticket {ticket}: {w}");
            }
            checked += 1;
        }
        assert!(answering.join().is_ok() && checked > 0);
    }

    #[test]
    fn a_token_is_valid_unknown_or_refused_by_what_the_table_has_read() {
        let t = ClaimTable::default();
        t.reset(HashMap::from([("gpu0".into(), ("host-a".into(), 10))]), 12);
        assert_eq!(t.verdict("gpu0", "host-a", 10, None), ClaimVerdict::Valid);
        assert!(matches!(t.verdict("gpu0", "host-b", 10, None), ClaimVerdict::Refused(_)));
        assert!(matches!(t.verdict("gpu0", "host-a", 9, None), ClaimVerdict::Refused(_)));
        // A token newer than what was read: not known yet.
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Unknown);
        // Tokens that are no etcd revision at all.
        for bad in [0, u64::MAX, i64::MAX as u64 + 1] {
            assert!(
                matches!(t.verdict("gpu0", "host-a", bad, None), ClaimVerdict::Refused(w) if w.contains("not a revision")),
                "{bad}"
            );
        }
        // A look-up at 15 says it is host-a's.
        let ticket = t.ticket();
        t.answer("gpu1", ticket, Some(("host-a".into(), 13)), 15);
        // A token beyond what that look-up read was never issued.
        assert!(
            matches!(t.verdict("gpu1", "host-a", 99, Some(ticket)), ClaimVerdict::Refused(w) if w.contains("never"))
        );
        assert_eq!(t.verdict("gpu1", "host-a", 99, Some(ticket + 1)), ClaimVerdict::Unknown);
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Valid);
        // A late watch event from before the look-up changes nothing.
        t.apply("gpu1", None, 14);
        assert_eq!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Valid);
        // The delete at 16: gone, and the old token is refused.
        let g = t.generation.load(Ordering::Acquire);
        t.apply("gpu1", None, 16);
        assert!(t.generation.load(Ordering::Acquire) > g);
        assert!(matches!(t.verdict("gpu1", "host-a", 13, None), ClaimVerdict::Refused(_)));
        // gpu0 taken over by host-b at 20: host-a's token 10 is stale.
        t.apply("gpu0", Some(("host-b".into(), 20)), 20);
        assert!(
            matches!(t.verdict("gpu0", "host-a", 10, None), ClaimVerdict::Refused(w) if w.contains("stale"))
        );
    }
}
