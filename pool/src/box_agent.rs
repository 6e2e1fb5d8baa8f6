//! The box side: registration under a lease kept alive, and the claims on the box's devices
//! as etcd holds them, kept current by a watch ([`ClaimTable`], in `claim_table`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::etcd::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
    WatchResponse,
};
use bridge_gpu::{ClaimCheck, ClaimVerdict};

pub use crate::claim_table::ClaimTable;
use tokio::sync::mpsc;

use crate::{
    BoxRecord, ClaimRecord, DeviceRecord, Keys, PoolConfig, PoolError, RevocationRecord, decode, encode,
    etcd_error,
};

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
}
