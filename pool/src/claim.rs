//! Claims: a snapshot of the pool in one read, a claim in one transaction, a release that
//! deletes only the claim it was given.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use crate::{
    ClaimRecord, DeviceRecord, DrainRecord, Keys, PoolConfig, PoolError, decode, encode, etcd_error,
};

/// etcd requests made, for `dxpu bench pool` (they must not grow with the pool's size).
#[derive(Debug, Default)]
pub struct RoundTrips(AtomicU64);

impl RoundTrips {
    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// How many so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A device a host holds: where to attach it and the claim's fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The box.
    pub box_name: String,
    /// The device, as the box exports it.
    pub device: String,
    /// The claim's `create_revision`: sent with the attach; the box checks it against etcd.
    pub token: u64,
    /// The device as its box registered it.
    pub record: DeviceRecord,
}

impl Claim {
    /// `box/device`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.box_name, self.device)
    }
}

/// Which devices a host takes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this PCI Vendor ID.
    pub vendor_id: Option<u16>,
    /// Only this PCI Device ID.
    pub device_id: Option<u16>,
    /// Only these boxes (empty: any).
    pub boxes: Vec<String>,
}

impl Filter {
    fn admits(&self, box_name: &str, r: &DeviceRecord) -> bool {
        self.vendor_id.is_none_or(|v| v == r.vendor_id)
            && self.device_id.is_none_or(|d| d == r.device_id)
            && (self.boxes.is_empty() || self.boxes.iter().any(|b| b == box_name))
    }
}

/// The pool at one revision: devices, claims (with their tokens) and drains.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The revision it was read at.
    pub revision: i64,
    /// `(box, device)` → record.
    pub devices: Vec<((String, String), DeviceRecord)>,
    /// `(box, device)` → (claim, token).
    pub claims: HashMap<(String, String), (ClaimRecord, u64)>,
    /// `(box, device)` → drain.
    pub drains: HashMap<(String, String), DrainRecord>,
}

fn pair(b: &str, d: &str) -> (String, String) {
    (b.to_string(), d.to_string())
}

/// Reads devices, claims and drains in one transaction (one round trip, one revision).
/// Records that do not parse are skipped with a warning: one bad key must not stop the pool.
pub async fn snapshot(
    client: &mut Client,
    cfg: &PoolConfig,
    trips: Option<&RoundTrips>,
) -> Result<Snapshot, PoolError> {
    let keys = Keys::new(&cfg.prefix);
    let get = |k: String| TxnOp::get(k, Some(GetOptions::new().with_prefix()));
    let txn = Txn::new().and_then([get(keys.devices()), get(keys.claims()), get(keys.drains())]);
    let resp = client.txn(txn).await.map_err(|e| etcd_error(cfg, "reading the pool", e))?;
    if let Some(t) = trips {
        t.add();
    }
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut ranges = resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (Some(devices), Some(claims), Some(drains)) = (ranges.next(), ranges.next(), ranges.next()) else {
        return Err(PoolError::BadRecord { key: cfg.prefix.clone(), why: "short transaction answer".into() });
    };
    let mut s = Snapshot { revision, ..Snapshot::default() };
    for kv in devices.kvs() {
        let Some((b, d)) = keys.split(&keys.devices(), kv.key()) else { continue };
        match decode::<DeviceRecord>(kv) {
            Ok(r) => s.devices.push((pair(b, d), r)),
            Err(e) => log::warn!("{e}"),
        }
    }
    for kv in claims.kvs() {
        let Some((b, d)) = keys.split(&keys.claims(), kv.key()) else { continue };
        match decode::<ClaimRecord>(kv) {
            Ok(r) => {
                s.claims.insert(pair(b, d), (r, kv.create_revision() as u64));
            }
            Err(e) => log::warn!("{e}"),
        }
    }
    for kv in drains.kvs() {
        let Some((b, d)) = keys.split(&keys.drains(), kv.key()) else { continue };
        match decode::<DrainRecord>(kv) {
            Ok(r) => {
                s.drains.insert(pair(b, d), r);
            }
            Err(e) => log::warn!("{e}"),
        }
    }
    Ok(s)
}

/// What a host asks for: a device `filter` admits, for `host`, under `lease`, none of
/// `avoid` (devices not to take now).
#[derive(Clone, Copy, Debug)]
pub struct ClaimRequest<'a> {
    /// The host.
    pub host: &'a str,
    /// The lease the claim is tied to.
    pub lease: i64,
    /// Which devices.
    pub filter: &'a Filter,
    /// Which not.
    pub avoid: &'a HashSet<(String, String)>,
}

/// Claims one free device for `req`: a snapshot, then a transaction per candidate (in an
/// order `pick` shuffles, so that hosts do not all race for the same one) that creates the
/// claim only if the device is still registered, unclaimed and not draining. `None` if no
/// device is free.
pub async fn claim_one(
    client: &mut Client,
    cfg: &PoolConfig,
    req: ClaimRequest<'_>,
    pick: &mut (dyn FnMut(usize) -> usize + Send),
    trips: Option<&RoundTrips>,
) -> Result<Option<Claim>, PoolError> {
    let ClaimRequest { host, lease, filter, avoid } = req;
    let keys = Keys::new(&cfg.prefix);
    let snap = snapshot(client, cfg, trips).await?;
    let mut free: Vec<_> = snap
        .devices
        .into_iter()
        .filter(|((b, d), r)| {
            let k = pair(b, d);
            r.health == "ok"
                && r.allow.iter().any(|h| h == host || h == "*")
                && filter.admits(b, r)
                && !snap.claims.contains_key(&k)
                && !snap.drains.contains_key(&k)
                && !avoid.contains(&k)
        })
        .collect();
    while !free.is_empty() {
        let ((b, d), record) = free.swap_remove(pick(free.len()) % free.len());
        let claim = keys.claim(&b, &d);
        let txn = Txn::new()
            .when([
                Compare::version(keys.device(&b, &d), CompareOp::Greater, 0),
                Compare::version(claim.clone(), CompareOp::Equal, 0),
                Compare::version(keys.drain(&b, &d), CompareOp::Equal, 0),
            ])
            .and_then([TxnOp::put(
                claim,
                encode(&ClaimRecord { host: host.to_string(), since: crate::unix_now() }),
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let resp = client.txn(txn).await.map_err(|e| etcd_error(cfg, "claiming", e))?;
        if let Some(t) = trips {
            t.add();
        }
        if resp.succeeded() {
            // The put is the transaction's one write: its revision is the claim's
            // create_revision.
            let token = resp.header().map_or(0, |h| h.revision()) as u64;
            return Ok(Some(Claim { box_name: b, device: d, token, record }));
        }
        // Someone else took it (or it left, or began draining) since the snapshot.
    }
    Ok(None)
}

/// Deletes `claim` if etcd still holds it with its token (a claim revoked and taken by
/// another host since is not touched). Returns whether it deleted it.
pub async fn release(
    client: &mut Client,
    cfg: &PoolConfig,
    claim: &Claim,
    trips: Option<&RoundTrips>,
) -> Result<bool, PoolError> {
    let key = Keys::new(&cfg.prefix).claim(&claim.box_name, &claim.device);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, claim.token as i64)])
        .and_then([TxnOp::delete(key, None)]);
    let resp = client.txn(txn).await.map_err(|e| etcd_error(cfg, "releasing", e))?;
    if let Some(t) = trips {
        t.add();
    }
    Ok(resp.succeeded())
}
