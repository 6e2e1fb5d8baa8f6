//! Claims: a snapshot of the pool in one read, a claim in one transaction, a release that
//! deletes only the claim it was given.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::etcd::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

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
    /// `(box, device)` → why its claim key holds something that is not a claim: no host
    /// can claim the device while it is there (`dxpu pool revoke` clears it).
    pub bad_claims: HashMap<(String, String), String>,
    /// `(box, device)` → why its drain key holds something that is not a drain: no host
    /// claims the device while it is there (`dxpu pool undrain` clears it).
    pub bad_drains: HashMap<(String, String), String>,
    /// `(box, device)` → why its device key holds something that is not a device record
    /// (its box writes it again when it registers).
    pub bad_devices: HashMap<(String, String), String>,
    /// Devices whose records no live box holds: no `{prefix}/boxes/{box}` record, or one
    /// under another lease (a forged record, or one a box left): not claimed.
    pub orphans: HashSet<(String, String)>,
}

/// What clears a bad record under each prefix.
pub(crate) const FIX_CLAIM: &str = "`dxpu pool revoke BOX/DEVICE` clears a bad claim";
pub(crate) const FIX_DRAIN: &str = "`dxpu pool undrain BOX/DEVICE` clears a bad drain";
pub(crate) const FIX_DEVICE: &str =
    "its box writes the device's record again when it registers (restart that box's dxpu gpu)";

/// Each box's lease, from the `{prefix}/boxes/` keys listed.
fn box_leases(keys: &Keys, r: &crate::etcd::RangeResponse) -> HashMap<String, i64> {
    r.kvs().iter().filter_map(|kv| keys.box_of(kv.key()).map(|b| (b.to_string(), kv.lease))).collect()
}

fn pair(b: &str, d: &str) -> (String, String) {
    (b.to_string(), d.to_string())
}

/// Reads devices, claims and drains in one transaction (one round trip, one revision).
/// Records that do not parse are skipped with a warning (once per key and revision): one bad
/// key must not stop the pool. A claim key that does not parse still holds its device (no
/// claim can be created over it), so it is kept in `bad_claims`.
pub async fn snapshot(
    client: &mut Client,
    cfg: &PoolConfig,
    trips: Option<&RoundTrips>,
) -> Result<Snapshot, PoolError> {
    let keys = Keys::new(&cfg.prefix);
    let get = |k: String| TxnOp::get(k, Some(GetOptions::new().with_prefix()));
    let txn = Txn::new().and_then([
        get(keys.devices()),
        get(keys.claims()),
        get(keys.drains()),
        TxnOp::get(keys.boxes(), Some(GetOptions::new().with_prefix().with_keys_only())),
    ]);
    let resp = client.txn(txn).await.map_err(|e| etcd_error(cfg, "reading the pool", e))?;
    if let Some(t) = trips {
        t.add();
    }
    let revision = resp.header().map_or(0, |h| h.revision());
    let mut ranges = resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (Some(devices), Some(claims), Some(drains), Some(boxes)) =
        (ranges.next(), ranges.next(), ranges.next(), ranges.next())
    else {
        return Err(PoolError::BadRecord { key: cfg.prefix.clone(), why: "short transaction answer".into() });
    };
    let mut s = Snapshot { revision, ..Snapshot::default() };
    let leases = box_leases(&keys, &boxes);
    for kv in devices.kvs() {
        let Some((b, d)) = keys.split(&keys.devices(), kv.key()) else { continue };
        if leases.get(b) != Some(&kv.lease) {
            s.orphans.insert(pair(b, d));
        }
        match decode::<DeviceRecord>(kv) {
            Ok(r) => s.devices.push((pair(b, d), r)),
            Err(e) => {
                crate::warn_bad_record(kv, &e, FIX_DEVICE);
                s.bad_devices.insert(pair(b, d), e.to_string());
            }
        }
    }
    for kv in claims.kvs() {
        let Some((b, d)) = keys.split(&keys.claims(), kv.key()) else { continue };
        match decode::<ClaimRecord>(kv) {
            Ok(r) => {
                s.claims.insert(pair(b, d), (r, kv.create_revision() as u64));
            }
            Err(e) => {
                crate::warn_bad_record(kv, &e, FIX_CLAIM);
                s.bad_claims.insert(pair(b, d), e.to_string());
            }
        }
    }
    for kv in drains.kvs() {
        let Some((b, d)) = keys.split(&keys.drains(), kv.key()) else { continue };
        match decode::<DrainRecord>(kv) {
            Ok(r) => {
                s.drains.insert(pair(b, d), r);
            }
            Err(e) => {
                crate::warn_bad_record(kv, &e, FIX_DRAIN);
                s.bad_drains.insert(pair(b, d), e.to_string());
            }
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
    /// The device records read so far (kept between claims: a record is read again only
    /// when its revision changed).
    pub records: &'a RecordCache,
}

/// Device records by key, with the revision each was read at. A claim lists the pool by keys
/// and revisions only, and reads the records that are new or changed: the bytes a claim
/// moves and decodes do not grow with the pool once the records are known.
#[derive(Debug, Default)]
pub struct RecordCache {
    inner: std::sync::Mutex<CacheInner>,
}

#[derive(Debug, Default)]
struct CacheInner {
    records: HashMap<Vec<u8>, (i64, DeviceRecord)>,
    /// When the whole pool was last listed.
    listed_at: Option<std::time::Instant>,
}

/// How often a host lists the whole pool (to learn of new boxes); in between it lists one
/// box at a time.
const FULL_LISTING_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// Boxes looked at, one listing each, before a claim lists the whole pool instead.
const BOX_PROBES: usize = 4;

impl RecordCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The boxes to look at, in `pick`'s order, unless the whole pool is due to be listed.
    fn boxes(
        &self,
        keys: &Keys,
        filter: &Filter,
        pick: &mut (dyn FnMut(usize) -> usize + Send),
    ) -> Option<Vec<String>> {
        let g = self.lock();
        if g.listed_at.is_none_or(|t| t.elapsed() >= FULL_LISTING_EVERY) {
            return None;
        }
        let mut boxes: Vec<String> = g
            .records
            .keys()
            .filter_map(|k| keys.split(&keys.devices(), k).map(|(b, _)| b.to_string()))
            .filter(|b| filter.boxes.is_empty() || filter.boxes.contains(b))
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        boxes.sort();
        let mut order = Vec::new();
        while !boxes.is_empty() && order.len() < BOX_PROBES {
            order.push(boxes.swap_remove(pick(boxes.len()) % boxes.len()));
        }
        Some(order)
    }
}

/// What one listing covers: the whole pool, or one box.
#[derive(Clone, Copy)]
enum Scope<'a> {
    Pool,
    Box(&'a str),
}

/// A device free to claim: where, the record's revision, the record.
type Candidate = ((String, String), i64, DeviceRecord);

/// The devices listed that may not be claimed: claimed, draining (whatever their claim or
/// drain key holds), or whose record no live box holds (no box record, or one under another
/// lease: a record a dead box left, or one written by someone else).
fn not_free(
    keys: &Keys,
    devices: &crate::etcd::RangeResponse,
    claims: &crate::etcd::RangeResponse,
    drains: &crate::etcd::RangeResponse,
    boxes: &crate::etcd::RangeResponse,
) -> HashSet<(String, String)> {
    let leases = box_leases(keys, boxes);
    let mut taken: HashSet<(String, String)> = HashSet::new();
    for kv in devices.kvs() {
        if let Some((b, d)) = keys.split(&keys.devices(), kv.key())
            && leases.get(b) != Some(&kv.lease)
        {
            taken.insert(pair(b, d));
        }
    }
    for (under, r) in [(keys.claims(), claims), (keys.drains(), drains)] {
        for kv in r.kvs() {
            if let Some((b, d)) = keys.split(&under, kv.key()) {
                taken.insert(pair(b, d));
            }
        }
    }
    taken
}

/// The free devices `req` admits in `scope`, from one listing of keys and revisions (one
/// round trip) and, where records are new or changed, one read of them (a second).
async fn free_devices(
    client: &mut Client,
    cfg: &PoolConfig,
    req: &ClaimRequest<'_>,
    scope: Scope<'_>,
    trips: Option<&RoundTrips>,
) -> Result<Vec<Candidate>, PoolError> {
    let keys = Keys::new(&cfg.prefix);
    let list = |k: String| TxnOp::get(k, Some(GetOptions::new().with_prefix().with_keys_only()));
    let (devices_at, claims_at, drains_at) = match scope {
        Scope::Pool => (keys.devices(), keys.claims(), keys.drains()),
        Scope::Box(b) => (keys.box_devices(b), keys.box_claims(b), keys.box_drains(b)),
    };
    let owners_at = match scope {
        Scope::Pool => keys.boxes(),
        Scope::Box(b) => keys.box_owner(b),
    };
    let txn =
        Txn::new().and_then([list(devices_at.clone()), list(claims_at), list(drains_at), list(owners_at)]);
    let resp = client.txn(txn).await.map_err(|e| etcd_error(cfg, "listing the pool", e))?;
    if let Some(t) = trips {
        t.add();
    }
    let mut ranges = resp.op_responses().into_iter().filter_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g),
        _ => None,
    });
    let (Some(devices), Some(claims), Some(drains), Some(boxes)) =
        (ranges.next(), ranges.next(), ranges.next(), ranges.next())
    else {
        return Err(PoolError::BadRecord { key: cfg.prefix.clone(), why: "short transaction answer".into() });
    };
    let taken = not_free(&keys, &devices, &claims, &drains, &boxes);
    let listed: Vec<(Vec<u8>, i64)> =
        devices.kvs().iter().map(|kv| (kv.key().to_vec(), kv.mod_revision())).collect();
    let stale: Vec<Vec<u8>> = {
        let cache = req.records.lock();
        listed
            .iter()
            .filter(|(k, rev)| cache.records.get(k).is_none_or(|c| c.0 != *rev))
            .map(|(k, _)| k.clone())
            .collect()
    };
    if !stale.is_empty() {
        // Many (the first claim): the whole prefix; a few: just those, in one transaction.
        let got: Vec<crate::etcd::KeyValue> = if stale.len() > 16 {
            let r = client
                .get(devices_at.clone(), Some(GetOptions::new().with_prefix()))
                .await
                .map_err(|e| etcd_error(cfg, "reading the devices", e))?;
            r.kvs().to_vec()
        } else {
            let gets: Vec<TxnOp> = stale.iter().map(|k| TxnOp::get(k.clone(), None)).collect();
            let r = client
                .txn(Txn::new().and_then(gets))
                .await
                .map_err(|e| etcd_error(cfg, "reading the devices", e))?;
            r.op_responses()
                .into_iter()
                .filter_map(|o| match o {
                    TxnOpResponse::Get(g) => Some(g.kvs().to_vec()),
                    _ => None,
                })
                .flatten()
                .collect()
        };
        if let Some(t) = trips {
            t.add();
        }
        let mut cache = req.records.lock();
        for kv in &got {
            match decode::<DeviceRecord>(kv) {
                Ok(r) => {
                    cache.records.insert(kv.key().to_vec(), (kv.mod_revision(), r));
                }
                Err(e) => {
                    crate::warn_bad_record(kv, &e, FIX_DEVICE);
                }
            }
        }
    }
    let mut cache = req.records.lock();
    // Records of devices that left (under what was listed) are forgotten.
    let present: HashSet<&[u8]> = listed.iter().map(|(k, _)| k.as_slice()).collect();
    cache.records.retain(|k, _| !k.starts_with(devices_at.as_bytes()) || present.contains(k.as_slice()));
    if matches!(scope, Scope::Pool) {
        cache.listed_at = Some(std::time::Instant::now());
    }
    let mut free = Vec::new();
    for (k, rev) in &listed {
        let Some((b, d)) = keys.split(&keys.devices(), k) else { continue };
        let Some((cached, r)) = cache.records.get(k) else { continue };
        let at = pair(b, d);
        if *cached == *rev
            && r.health == "ok"
            && r.allow.iter().any(|h| h == req.host || h == "*")
            && req.filter.admits(b, r)
            && !taken.contains(&at)
            && !req.avoid.contains(&at)
        {
            free.push((at, *rev, r.clone()));
        }
    }
    Ok(free)
}

/// Claims one free device for `req`: a listing of a few boxes or of the pool
/// (`free_devices`), then a
/// transaction per candidate (in an order `pick` shuffles, so that hosts do not all race for
/// the same one) that creates the claim only if the device's record is still the one read,
/// and it is unclaimed and not draining. `None` if no device is free.
pub async fn claim_one(
    client: &mut Client,
    cfg: &PoolConfig,
    req: ClaimRequest<'_>,
    pick: &mut (dyn FnMut(usize) -> usize + Send),
    trips: Option<&RoundTrips>,
) -> Result<Option<Claim>, PoolError> {
    let keys = Keys::new(&cfg.prefix);
    // A few boxes, one listing each (what a listing moves does not grow with the pool);
    // the whole pool when it is due or when those boxes had nothing free.
    let mut free = Vec::new();
    if let Some(boxes) = req.records.boxes(&keys, req.filter, pick) {
        for b in &boxes {
            free = free_devices(client, cfg, &req, Scope::Box(b), trips).await?;
            if !free.is_empty() {
                break;
            }
        }
    }
    if free.is_empty() {
        free = free_devices(client, cfg, &req, Scope::Pool, trips).await?;
    }
    let (host, lease) = (req.host, req.lease);
    while !free.is_empty() {
        let ((b, d), revision, record) = free.swap_remove(pick(free.len()) % free.len());
        let claim = keys.claim(&b, &d);
        let txn = Txn::new()
            .when([
                // The record read, unchanged (a box that registered again may have moved).
                Compare::mod_revision(keys.device(&b, &d), CompareOp::Equal, revision),
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
