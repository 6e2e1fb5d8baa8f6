//! The host side: a lease kept alive, claims made until the host holds what it wants, each
//! handed to the endpoint to attach, and the self-fence: when the lease could not be
//! renewed, every device claimed under it is fenced before etcd could let the lease expire.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::etcd::{Client, LeaseKeepAliveStream, LeaseKeeper};
use tokio::sync::mpsc;

use crate::claim::{Claim, ClaimRequest, Filter, RecordCache, claim_one, release};
use crate::{PoolConfig, PoolError, etcd_error};

/// What the host wants from the pool.
#[derive(Clone, Debug)]
pub struct HostAgentOptions {
    /// The host's name (its key's name on the boxes).
    pub host: String,
    /// How many devices to hold.
    pub want: usize,
    /// Which devices.
    pub filter: Filter,
    /// How long a device the host gave back (it failed, or was taken away) is not claimed
    /// again.
    pub cool_down: Duration,
}

/// What the agent tells the endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostEvent {
    /// A device claimed under `lease`: attach it with the claim's token, and give it back
    /// with [`HostAgent::release`] when done or gone.
    Claimed {
        /// The claim.
        claim: Claim,
        /// The lease it is tied to.
        lease: i64,
    },
    /// Every claim under `lease` is void: the lease was not renewed in time. The fence
    /// callback has run already; detach those devices (they are fenced) and forget them.
    Fenced {
        /// The lease.
        lease: i64,
        /// Why.
        why: String,
    },
}

/// The fence: called with a lease and why, on the watchdog's thread, as soon as the lease
/// might expire before it is renewed.
pub type FenceFn = Box<dyn Fn(i64, &str) + Send + Sync>;

enum Cmd {
    Release(Claim, bool),
    Stop,
}

/// When the lease must be taken as lost, shared by the agent and the watchdog.
#[derive(Default)]
struct Deadline {
    /// (lease, deadline, fired).
    at: Option<(i64, Instant, bool)>,
}

/// The host's agent: one thread with the etcd client, one watchdog thread for the fence.
pub struct HostAgent {
    events: std_mpsc::Receiver<HostEvent>,
    stats: Arc<crate::AgentStats>,
    cmds: mpsc::UnboundedSender<Cmd>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    watchdog: Option<JoinHandle<()>>,
}

/// How long before its TTL runs out a lease counts as lost: a fifth of the TTL, at least
/// 500 ms (`docs/pool.md` says why that is safe).
pub fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(500))
}

impl HostAgent {
    /// Starts claiming for `opts.host`. `fence` runs when a lease must be taken as lost.
    pub fn start(cfg: PoolConfig, opts: HostAgentOptions, fence: FenceFn) -> Result<HostAgent, PoolError> {
        cfg.validate()?;
        if !crate::keys::valid_name(&opts.host) {
            return Err(PoolError::Config(format!("host = {:?}: 1-64 of A-Z a-z 0-9 - _ .", opts.host)));
        }
        let (tx, events) = std_mpsc::channel();
        let (cmds, rx) = mpsc::unbounded_channel();
        let stopping = Arc::new(AtomicBool::new(false));
        let deadline = Arc::new(Mutex::new(Deadline::default()));
        let fired = Arc::new(tokio::sync::Notify::new());
        let stats = Arc::new(crate::AgentStats::default());
        let rt = crate::runtime().map_err(|e| PoolError::Config(format!("tokio runtime: {e}")))?;
        let watchdog = {
            let (deadline, stopping, fired, tx, stats) =
                (deadline.clone(), stopping.clone(), fired.clone(), tx.clone(), stats.clone());
            std::thread::Builder::new()
                .name("dxpu-pool-fence".into())
                .spawn(move || watch_deadline(&deadline, &stopping, &fired, &fence, &tx, &stats))
                .map_err(|e| PoolError::Config(format!("starting the fence thread: {e}")))?
        };
        let run = HostAgentState {
            cfg,
            opts,
            events: tx,
            deadline,
            fired,
            held: HashMap::new(),
            avoid: HashMap::new(),
            records: RecordCache::default(),
            stats: stats.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("dxpu-pool-host".into())
            .spawn(move || rt.block_on(run.main(rx)))
            .map_err(|e| PoolError::Config(format!("starting the pool thread: {e}")))?;
        Ok(HostAgent { events, stats, cmds, stopping, thread: Some(thread), watchdog: Some(watchdog) })
    }

    /// The agent's counters (leases, renewals, fences, claims, etcd's errors).
    pub fn stats(&self) -> Arc<crate::AgentStats> {
        self.stats.clone()
    }

    /// What the agent has to say (claims, fences), in order.
    pub fn events(&self) -> &std_mpsc::Receiver<HostEvent> {
        &self.events
    }

    /// Gives `claim` back (the device is detached, or never attached, or gone): the claim is
    /// deleted and another device claimed in its place. `cool_down`: not this one again
    /// for a while (it failed).
    pub fn release(&self, claim: Claim, cool_down: bool) {
        let _ = self.cmds.send(Cmd::Release(claim, cool_down));
    }

    /// Releases every claim, revokes the lease, ends the threads.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        let _ = self.cmds.send(Cmd::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stopping.store(true, Ordering::Release);
        if let Some(t) = self.watchdog.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The watchdog: fences a lease at its deadline, whatever the agent's thread is doing (it may
/// be stuck in a request to an etcd that does not answer).
fn watch_deadline(
    deadline: &Mutex<Deadline>,
    stopping: &AtomicBool,
    fired: &tokio::sync::Notify,
    fence: &FenceFn,
    events: &std_mpsc::Sender<HostEvent>,
    stats: &crate::AgentStats,
) {
    while !stopping.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(5));
        let mut g = deadline.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((lease, at, done @ false)) = &mut g.at
            && Instant::now() >= *at
        {
            *done = true;
            let lease = *lease;
            drop(g);
            let why = format!("pool lease {lease:x} not renewed in time");
            log::error!("pool: {why}: fencing every device claimed under it");
            fence(lease, &why);
            stats.fenced();
            let _ = events.send(HostEvent::Fenced { lease, why });
            fired.notify_one();
        }
    }
}

struct HostAgentState {
    cfg: PoolConfig,
    opts: HostAgentOptions,
    events: std_mpsc::Sender<HostEvent>,
    deadline: Arc<Mutex<Deadline>>,
    fired: Arc<tokio::sync::Notify>,
    /// (box, device) → claim held under the current lease.
    held: HashMap<(String, String), Claim>,
    /// Not to be claimed again before.
    avoid: HashMap<(String, String), Instant>,
    /// The device records read so far.
    records: RecordCache,
    stats: Arc<crate::AgentStats>,
}

enum End {
    Stop,
    Fenced,
}

impl HostAgentState {
    fn set_deadline(&self, at: Option<(i64, Instant)>) {
        let mut g = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        g.at = at.map(|(l, t)| (l, t, false));
    }

    async fn main(mut self, mut cmds: mpsc::UnboundedReceiver<Cmd>) {
        let mut failures = 0u32;
        let mut waits = crate::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        loop {
            match self.lease_life(&mut cmds).await {
                Ok(End::Stop) => break,
                Ok(End::Fenced) => {
                    // Every claim of that lease is void; the endpoint was told.
                    self.held.clear();
                    failures = 0;
                    waits.reset();
                }
                Err(e) => {
                    if failures.is_multiple_of(10) {
                        log::warn!("pool: {e}; retrying");
                    }
                    failures += 1;
                    // Wait a moment, longer after each failure in a row, before trying again; only a stop (or the agent's handle
                    // gone) ends the agent. A release meanwhile is of a claim whose lease is
                    // gone with it: nothing to delete.
                    match tokio::time::timeout(waits.next_wait(), cmds.recv()).await {
                        Ok(Some(Cmd::Stop) | None) => break,
                        Ok(Some(Cmd::Release(..))) | Err(_) => {}
                    }
                }
            }
        }
        self.set_deadline(None);
    }

    /// One lease: granted, renewed, claims made under it, until it is fenced, the agent
    /// stops, or it could not be granted (Err).
    async fn lease_life(&mut self, cmds: &mut mpsc::UnboundedReceiver<Cmd>) -> Result<End, PoolError> {
        let cfg = self.cfg.clone();
        let mut client = crate::connect(&cfg).await?;
        let ttl = cfg.lease_ttl;
        let asked = Instant::now();
        let lease = crate::client::grant_lease(&mut client, &cfg, &self.stats).await?;
        // The TTL runs at etcd from when it granted the lease, which is after `asked`.
        self.set_deadline(Some((lease, asked + ttl - fence_margin(ttl))));
        log::info!("pool: host {} holds lease {lease:x} ({} s)", self.opts.host, ttl.as_secs());
        let mut keep: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
        let mut renew = tokio::time::interval(ttl / 3);
        let mut claim_tick = tokio::time::interval(Duration::from_millis(200));
        let mut to_release: Vec<Claim> = Vec::new();
        let mut rng = seed();
        let mut claim_errors = 0u32;
        loop {
            tokio::select! {
                _ = renew.tick() => {
                    let renewed = self.renew(&mut client, lease, &mut keep).await;
                    self.stats.renewed(renewed.is_ok());
                    if renewed.is_err() {
                        self.stats.etcd_error();
                    }
                    match renewed {
                        Ok(true) => {}
                        Ok(false) => {
                            // etcd says the lease is gone: fence now.
                            self.set_deadline(Some((lease, Instant::now())));
                        }
                        Err(e) => {
                            keep = None;
                            log::warn!("pool: {e} (the fence falls at the lease's deadline unless a renewal succeeds first)");
                        }
                    }
                }
                _ = claim_tick.tick() => {
                    let now = Instant::now();
                    self.avoid.retain(|_, until| *until > now);
                    to_release = self.release_all(&mut client, to_release).await;
                    if self.held.len() >= self.opts.want {
                        continue;
                    }
                    let avoid: HashSet<_> = self.avoid.keys().chain(self.held.keys()).cloned().collect();
                    let mut pick = |n: usize| next(&mut rng) as usize % n.max(1);
                    let asked = Instant::now();
                    match claim_one(&mut client, &cfg, ClaimRequest { host: &self.opts.host, lease, filter: &self.opts.filter, avoid: &avoid, records: &self.records }, &mut pick, None).await {
                        Ok(Some(claim)) => {
                            claim_errors = 0;
                            self.stats.claimed(asked.elapsed());
                            log::info!("pool: claimed {} (token {})", claim.name(), claim.token);
                            self.held.insert((claim.box_name.clone(), claim.device.clone()), claim.clone());
                            let _ = self.events.send(HostEvent::Claimed { claim, lease });
                        }
                        Ok(None) => {}
                        Err(e) => {
                            self.stats.etcd_error();
                            if claim_errors.is_multiple_of(25) {
                                log::warn!("pool: no new claim: {e}");
                            }
                            claim_errors += 1;
                        }
                    }
                }
                cmd = cmds.recv() => match cmd {
                    Some(Cmd::Release(claim, cool)) => {
                        let k = (claim.box_name.clone(), claim.device.clone());
                        if self.held.get(&k).is_some_and(|c| c.token == claim.token) {
                            self.held.remove(&k);
                        }
                        if cool {
                            self.avoid.insert(k, Instant::now() + self.opts.cool_down);
                        }
                        to_release.push(claim);
                        to_release = self.release_all(&mut client, to_release).await;
                    }
                    Some(Cmd::Stop) | None => {
                        let all: Vec<Claim> = self.held.drain().map(|(_, c)| c).chain(to_release).collect();
                        let left = self.release_all(&mut client, all).await;
                        if left.is_empty() {
                            let _ = client.lease_revoke(lease).await;
                        }
                        log::info!("pool: host {} left the pool", self.opts.host);
                        return Ok(End::Stop);
                    }
                },
                _ = self.fired.notified() => {
                    let _ = client.lease_revoke(lease).await;
                    return Ok(End::Fenced);
                }
            }
        }
    }

    /// One renewal: Ok(true) renewed (the deadline moves), Ok(false) the lease is gone.
    async fn renew(
        &mut self,
        client: &mut Client,
        lease: i64,
        keep: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    ) -> Result<bool, PoolError> {
        let cfg = &self.cfg;
        if keep.is_none() {
            *keep = Some(
                client.lease_keep_alive(lease).await.map_err(|e| etcd_error(cfg, "renewing the lease", e))?,
            );
        }
        let Some((keeper, stream)) = keep.as_mut() else { return Ok(true) };
        let sent = Instant::now();
        keeper.keep_alive().await.map_err(|e| etcd_error(cfg, "renewing the lease", e))?;
        let r = match tokio::time::timeout(cfg.request_timeout, stream.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => return Err(PoolError::NotFound("the lease renewal stream ended".into())),
            Ok(Err(e)) => return Err(etcd_error(cfg, "renewing the lease", e)),
            Err(_) => {
                return Err(PoolError::NotFound(format!(
                    "no lease renewal within {:?}",
                    cfg.request_timeout
                )));
            }
        };
        if r.ttl() <= 0 {
            return Ok(false);
        }
        // etcd restarted the TTL when it handled the renewal, after `sent`.
        let ttl = Duration::from_secs(r.ttl() as u64);
        self.set_deadline(Some((lease, sent + ttl - fence_margin(cfg.lease_ttl))));
        Ok(true)
    }

    /// Deletes what can be deleted; returns what could not (tried again later).
    async fn release_all(&mut self, client: &mut Client, claims: Vec<Claim>) -> Vec<Claim> {
        let mut left = Vec::new();
        for c in claims {
            match release(client, &self.cfg, &c, None).await {
                Ok(deleted) => {
                    self.stats.released(1);
                    log::info!(
                        "pool: released {} (token {}){}",
                        c.name(),
                        c.token,
                        if deleted { "" } else { ": it was no longer held" }
                    )
                }
                Err(e) => {
                    self.stats.etcd_error();
                    log::warn!("pool: releasing {}: {e}", c.name());
                    left.push(c);
                }
            }
        }
        left
    }
}

fn seed() -> u64 {
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    t ^ (std::process::id() as u64) << 32 | 1
}

/// xorshift64: spreading hosts over the free devices needs no better.
fn next(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}
