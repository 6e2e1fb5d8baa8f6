//! A claim-and-release storm, for `dxpu bench pool`: simulated boxes register devices (the
//! registration only: no datapath), simulated hosts — each with a lease of its own, as a
//! host endpoint has — claim a device, hold it a moment, and release it, as fast as etcd
//! lets them. What is counted: claims, their latency, etcd round trips per claim, and double
//! allocations (a claim granted for a device some other host is holding, by the storm's own
//! record of who holds what).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::etcd::{Client, PutOptions, Txn, TxnOp};
use serde::Serialize;

use crate::claim::{ClaimRequest, Filter, RecordCache, RoundTrips, claim_one, release};
use crate::{DeviceRecord, Keys, PoolConfig, PoolError, encode, etcd_error};

/// How big a storm.
#[derive(Clone, Debug)]
pub struct StormParams {
    /// Simulated boxes.
    pub boxes: usize,
    /// Devices per box.
    pub devices_per_box: usize,
    /// Simulated hosts.
    pub hosts: usize,
    /// How long the hosts claim and release.
    pub duration: Duration,
    /// How long a host holds a device before releasing it.
    pub hold: Duration,
}

/// What a storm measured.
#[derive(Clone, Debug, Serialize)]
pub struct StormReport {
    /// Devices in the pool.
    pub devices: usize,
    /// Hosts.
    pub hosts: usize,
    /// Seconds the storm ran.
    pub seconds: f64,
    /// Claims granted.
    pub claims: u64,
    /// Claims granted per second.
    pub claims_per_second: f64,
    /// Latency of a granted claim (snapshot and transactions), ms: median and 99th percentile.
    pub claim_p50_ms: f64,
    /// 99th percentile.
    pub claim_p99_ms: f64,
    /// Claim attempts that found no free device.
    pub none_free: u64,
    /// etcd requests made for claims (snapshots and transactions), per granted claim.
    pub round_trips_per_claim: f64,
    /// Claims granted for a device another host held: must be 0.
    pub double_allocations: u64,
    /// Requests that failed.
    pub errors: u64,
}

impl StormReport {
    /// The columns of a table of reports, one row each ([`StormReport::row`]).
    pub const COLUMNS: [&'static str; 10] = [
        "devices",
        "hosts",
        "claims",
        "claims/s",
        "p50-ms",
        "p99-ms",
        "trips/claim",
        "none-free",
        "double",
        "errors",
    ];

    /// The report as a row under [`StormReport::COLUMNS`].
    pub fn row(&self) -> Vec<String> {
        vec![
            self.devices.to_string(),
            self.hosts.to_string(),
            self.claims.to_string(),
            format!("{:.0}", self.claims_per_second),
            format!("{:.2}", self.claim_p50_ms),
            format!("{:.2}", self.claim_p99_ms),
            format!("{:.2}", self.round_trips_per_claim),
            self.none_free.to_string(),
            self.double_allocations.to_string(),
            self.errors.to_string(),
        ]
    }
}

/// Runs one storm under a prefix of its own (removed afterwards).
pub async fn storm(cfg: &PoolConfig, p: &StormParams) -> Result<StormReport, PoolError> {
    let mut cfg = cfg.clone();
    cfg.prefix = format!("{}/storm-{}", cfg.prefix, crate::unix_now_nanos());
    let keys = Keys::new(&cfg.prefix);
    let mut client = crate::connect(&cfg).await?;
    let hosts: Vec<String> = (0..p.hosts).map(|i| format!("host-{i}")).collect();
    register_boxes(&mut client, &cfg, &keys, p).await?;
    let trips = Arc::new(RoundTrips::default());
    let held: Arc<Mutex<HashMap<(String, String), String>>> = Arc::default();
    let (claims, none_free, doubles, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let started = Instant::now();
    let end = started + p.duration;
    let mut tasks = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let (cfg, host, trips, held) = (cfg.clone(), host.clone(), trips.clone(), held.clone());
        let (claims, none_free, doubles, errors, latencies) =
            (claims.clone(), none_free.clone(), doubles.clone(), errors.clone(), latencies.clone());
        let mut client = client.clone();
        let hold = p.hold;
        tasks.push(tokio::spawn(async move {
            let Ok(lease) = client.lease_grant(60).await.map(|l| l.id()) else {
                errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let mut rng = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let mut pick = move |n: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng as usize % n.max(1)
            };
            // Each host its own cache of records, as each host endpoint has.
            let (filter, avoid, records) = (Filter::default(), HashSet::new(), RecordCache::default());
            while Instant::now() < end {
                let t = Instant::now();
                let req =
                    ClaimRequest { host: &host, lease, filter: &filter, avoid: &avoid, records: &records };
                match claim_one(&mut client, &cfg, req, &mut pick, Some(&trips)).await {
                    Ok(Some(c)) => {
                        latencies
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(t.elapsed().as_secs_f64() * 1e3);
                        claims.fetch_add(1, Ordering::Relaxed);
                        let k = (c.box_name.clone(), c.device.clone());
                        if let Some(other) =
                            held.lock().unwrap_or_else(|p| p.into_inner()).insert(k.clone(), host.clone())
                        {
                            log::error!(
                                "double allocation: {} granted to {host} while {other} holds it",
                                c.name()
                            );
                            doubles.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(hold).await;
                        held.lock().unwrap_or_else(|p| p.into_inner()).remove(&k);
                        if release(&mut client, &cfg, &c, None).await.is_err() {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(None) => {
                        none_free.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            let _ = client.lease_revoke(lease).await;
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = client
        .delete(format!("{}/", cfg.prefix), Some(crate::etcd::DeleteOptions::new().with_prefix()))
        .await;
    let mut lat = latencies.lock().unwrap_or_else(|p| p.into_inner()).clone();
    lat.sort_by(f64::total_cmp);
    let q = |f: f64| if lat.is_empty() { 0.0 } else { lat[((lat.len() - 1) as f64 * f).round() as usize] };
    let n = claims.load(Ordering::Relaxed);
    Ok(StormReport {
        devices: p.boxes * p.devices_per_box,
        hosts: p.hosts,
        seconds,
        claims: n,
        claims_per_second: n as f64 / seconds,
        claim_p50_ms: q(0.5),
        claim_p99_ms: q(0.99),
        none_free: none_free.load(Ordering::Relaxed),
        round_trips_per_claim: if n == 0 { 0.0 } else { trips.get() as f64 / n as f64 },
        double_allocations: doubles.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
    })
}

/// The storm's boxes: one lease each, their name's record and their devices put in one
/// transaction per box, as a box registers.
async fn register_boxes(
    client: &mut Client,
    cfg: &PoolConfig,
    keys: &Keys,
    p: &StormParams,
) -> Result<(), PoolError> {
    for b in 0..p.boxes {
        let lease = client.lease_grant(60).await.map_err(|e| etcd_error(cfg, "granting", e))?.id();
        let name = format!("box-{b}");
        let owner = crate::BoxRecord {
            instance: format!("storm-{b}"),
            host: "storm".into(),
            pid: std::process::id(),
            advertise: format!("10.0.{}.{}:7440", b / 250, b % 250 + 1),
            since: crate::unix_now(),
        };
        let owner =
            TxnOp::put(keys.box_owner(&name), encode(&owner), Some(PutOptions::new().with_lease(lease)));
        let puts: Vec<TxnOp> = std::iter::once(owner)
            .chain((0..p.devices_per_box).map(|d| {
                let r = DeviceRecord {
                    advertise: format!("10.0.{}.{}:7440", b / 250, b % 250 + 1),
                    vendor_id: 0x1234,
                    device_id: 0xd9a0,
                    class: 0x03_02_00,
                    vram_bytes: 256 << 20,
                    health: "ok".into(),
                    // Any host: the storm's hosts exist only in it.
                    allow: vec!["*".into()],
                    since: crate::unix_now(),
                };
                TxnOp::put(
                    keys.device(&name, &format!("gpu{d}")),
                    encode(&r),
                    Some(PutOptions::new().with_lease(lease)),
                )
            }))
            .collect();
        client.txn(Txn::new().and_then(puts)).await.map_err(|e| etcd_error(cfg, "registering", e))?;
    }
    Ok(())
}
