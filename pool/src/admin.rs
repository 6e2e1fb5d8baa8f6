//! What `dxpu pool` runs: the inventory, drain / undrain, revoke, and the changes as they
//! happen.

use crate::etcd::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
use serde::Serialize;

use crate::claim::snapshot;
use crate::{
    ClaimRecord, DeviceRecord, DrainRecord, Keys, PoolConfig, PoolError, RevocationRecord, decode, encode,
    etcd_error,
};

/// One device of the pool, as `dxpu pool ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    /// The box.
    #[serde(rename = "box")]
    pub box_name: String,
    /// The device.
    pub device: String,
    /// PCI Vendor ID (`"0x10de"` in JSON, as every dxpu output writes PCI IDs).
    #[serde(serialize_with = "pci_id")]
    pub vendor_id: u16,
    /// PCI Device ID.
    #[serde(serialize_with = "pci_id")]
    pub device_id: u16,
    /// `free`, `claimed`, `draining`, `unhealthy`; `no-box` (no live box holds its record:
    /// one a box left, or one someone else wrote; never claimed); or a key that holds
    /// something dxpu did not write there — `bad-claim` (nobody can claim it until `dxpu pool
    /// revoke`), `bad-drain` (until `dxpu pool undrain`), `bad-device` (until its box
    /// registers again).
    pub state: String,
    /// The claiming host, if any.
    pub host: Option<String>,
    /// Since when (Unix seconds) the device is in that state.
    #[serde(rename = "since_unix_seconds")]
    pub since: u64,
    /// The claim's fencing token, if claimed.
    pub token: Option<u64>,
}

/// A PCI ID as dxpu's outputs write it: `0x` and four lower-case hex digits.
fn pci_id<S: serde::Serializer>(id: &u16, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{id:#06x}"))
}

/// What else the pool says of a device: a key of its that holds something else, or no box.
#[derive(Clone, Copy, Default)]
struct Marks {
    bad_claim: bool,
    bad_drain: bool,
    orphan: bool,
}

/// A device's state from its record, claim and drain.
fn state(
    r: &DeviceRecord,
    claim: Option<&(ClaimRecord, u64)>,
    drain: Option<&DrainRecord>,
    marks: Marks,
) -> (&'static str, u64) {
    if marks.bad_claim {
        // Nobody can claim it while its claim key holds something else.
        ("bad-claim", r.since)
    } else if marks.bad_drain {
        ("bad-drain", r.since)
    } else if marks.orphan {
        ("no-box", r.since)
    } else if r.health != "ok" {
        ("unhealthy", r.since)
    } else if let Some(d) = drain {
        ("draining", d.since)
    } else if let Some((c, _)) = claim {
        ("claimed", c.since)
    } else {
        ("free", r.since)
    }
}

/// The pool's devices, by box and device name.
pub async fn ls(client: &mut Client, cfg: &PoolConfig) -> Result<Vec<Entry>, PoolError> {
    let s = snapshot(client, cfg, None).await?;
    let mut out: Vec<Entry> = s
        .devices
        .iter()
        .map(|(k, r)| {
            let claim = s.claims.get(k);
            let marks = Marks {
                bad_claim: s.bad_claims.contains_key(k),
                bad_drain: s.bad_drains.contains_key(k),
                orphan: s.orphans.contains(k),
            };
            let (state, since) = state(r, claim, s.drains.get(k), marks);
            Entry {
                box_name: k.0.clone(),
                device: k.1.clone(),
                vendor_id: r.vendor_id,
                device_id: r.device_id,
                state: state.into(),
                host: claim.map(|(c, _)| c.host.clone()),
                since,
                token: claim.map(|(_, t)| *t),
            }
        })
        .collect();
    // A device key that holds something else is listed as such, not left out.
    out.extend(s.bad_devices.keys().map(|(b, d)| Entry {
        box_name: b.clone(),
        device: d.clone(),
        vendor_id: 0,
        device_id: 0,
        state: "bad-device".into(),
        host: None,
        since: 0,
        token: None,
    }));
    out.sort_by(|a, b| (&a.box_name, &a.device).cmp(&(&b.box_name, &b.device)));
    Ok(out)
}

/// Splits `BOX/DEVICE`.
pub fn parse_target(s: &str) -> Result<(String, String), PoolError> {
    match s.split_once('/') {
        Some((b, d)) if crate::keys::valid_name(b) && crate::keys::valid_name(d) => Ok((b.into(), d.into())),
        _ => Err(PoolError::Config(format!("{s:?}: give the device as BOX/DEVICE (box-a/gpu0)"))),
    }
}

async fn require_device(client: &mut Client, cfg: &PoolConfig, b: &str, d: &str) -> Result<(), PoolError> {
    let keys = Keys::new(&cfg.prefix);
    let got =
        client.get(keys.device(b, d), None).await.map_err(|e| etcd_error(cfg, "reading the device", e))?;
    if got.kvs().is_empty() {
        return Err(PoolError::NotFound(format!(
            "{b}/{d}: no such device in the pool (dxpu pool ls lists them)"
        )));
    }
    Ok(())
}

/// No new claims on `b/d`; its owner, if any, keeps it.
pub async fn drain(client: &mut Client, cfg: &PoolConfig, b: &str, d: &str) -> Result<(), PoolError> {
    require_device(client, cfg, b, d).await?;
    let key = Keys::new(&cfg.prefix).drain(b, d);
    // Only if not draining already: the first drain's time stays.
    let txn = Txn::new().when([Compare::version(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
        key,
        encode(&DrainRecord { since: crate::unix_now() }),
        None::<PutOptions>,
    )]);
    client.txn(txn).await.map_err(|e| etcd_error(cfg, "draining", e))?;
    Ok(())
}

/// Claims on `b/d` allowed again. Whether it was draining.
pub async fn undrain(client: &mut Client, cfg: &PoolConfig, b: &str, d: &str) -> Result<bool, PoolError> {
    let key = Keys::new(&cfg.prefix).drain(b, d);
    let r = client.delete(key, None).await.map_err(|e| etcd_error(cfg, "undraining", e))?;
    Ok(r.deleted() > 0)
}

/// Deletes the claim on `b/d`: its box cuts the owner off and resets the device, saying
/// who did (`by`, kept at [`Keys::revocation`] in the same transaction). The claim that was
/// revoked (host, token), if there was one.
pub async fn revoke(
    client: &mut Client,
    cfg: &PoolConfig,
    b: &str,
    d: &str,
    by: &str,
) -> Result<Revoked, PoolError> {
    require_device(client, cfg, b, d).await?;
    let keys = Keys::new(&cfg.prefix);
    let key = keys.claim(b, d);
    // The claim read, then deleted only as read (with the record of who revoked it): a claim
    // given back and taken again meanwhile is read again.
    for _ in 0..8 {
        let got = client.get(key.clone(), None).await.map_err(|e| etcd_error(cfg, "revoking", e))?;
        let Some(kv) = got.kvs().first() else { return Ok(Revoked::Nothing) };
        let token = kv.create_revision() as u64;
        let record = RevocationRecord { by: by.to_string(), token, since: crate::unix_now() };
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision())])
            .and_then([
                TxnOp::put(keys.revocation(b, d), encode(&record), None::<PutOptions>),
                TxnOp::delete(key.clone(), None),
            ]);
        let r = client.txn(txn).await.map_err(|e| etcd_error(cfg, "revoking", e))?;
        if r.succeeded() {
            return Ok(match decode::<ClaimRecord>(kv) {
                Ok(c) => Revoked::Claim { host: c.host, token },
                Err(e) => Revoked::Unreadable { token, why: e.to_string() },
            });
        }
    }
    Err(PoolError::NotFound(format!(
        "revoking {b}/{d}: its claim changed under every one of 8 tries; try again"
    )))
}

/// What `revoke` deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Revoked {
    /// A claim: its host and token.
    Claim {
        /// The host that held it.
        host: String,
        /// Its fencing token.
        token: u64,
    },
    /// Something at the claim key that was not a claim (it kept the device unclaimable).
    Unreadable {
        /// Its revision.
        token: u64,
        /// Why it is not a claim.
        why: String,
    },
    /// Nothing: the device was not claimed.
    Nothing,
}

/// One change, as `dxpu pool watch` prints it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    /// etcd's revision of the change.
    pub revision: i64,
    /// `device`, `claim` or `drain`.
    pub kind: String,
    /// `put` or `delete`.
    pub event: String,
    /// The box.
    #[serde(rename = "box")]
    pub box_name: String,
    /// The device.
    pub device: String,
    /// The claiming host (claims).
    pub host: Option<String>,
}

/// Calls `each` with every change under the prefix from now on, until it returns false.
/// A watch that breaks (a member restarted, the connection lost) is resumed from the
/// revision after the last change seen, so that no change is missed or shown twice; only
/// one compacted past that revision ends it (Err: the changes since are gone from etcd).
pub async fn watch(
    client: &mut Client,
    cfg: &PoolConfig,
    each: &mut dyn FnMut(&Change) -> bool,
) -> Result<(), PoolError> {
    let keys = Keys::new(&cfg.prefix);
    let mut from: i64 = 0;
    let mut failures = 0u32;
    let mut waits =
        crate::Backoff::new(std::time::Duration::from_millis(100), std::time::Duration::from_secs(5));
    loop {
        let mut opts = WatchOptions::new().with_prefix().with_prev_key().with_progress_notify();
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let mut stream = match client.watch(format!("{}/", cfg.prefix), Some(opts)).await {
            Ok((_w, stream)) => stream,
            Err(e) => {
                if failures.is_multiple_of(10) {
                    log::warn!("{}; retrying", etcd_error(cfg, "watching", e));
                }
                failures += 1;
                tokio::time::sleep(waits.next_wait()).await;
                continue;
            }
        };
        match watch_stream(&mut stream, &keys, &mut from, each).await {
            Ok(()) => return Ok(()),
            Err(WatchEnd::Compacted(at)) => {
                return Err(PoolError::NotFound(format!(
                    "the watch fell behind: etcd compacted its history to revision {at}, past {from}"
                )));
            }
            Err(WatchEnd::Broken(e)) => {
                log::warn!("{}; resuming from revision {from}", etcd_error(cfg, "watching", e));
                failures = 0;
                waits.reset();
            }
        }
    }
}

enum WatchEnd {
    Compacted(i64),
    Broken(crate::etcd::Error),
}

/// One watch stream's changes, `from` kept at the revision to resume from.
async fn watch_stream(
    stream: &mut crate::etcd::WatchStream,
    keys: &Keys,
    from: &mut i64,
    each: &mut dyn FnMut(&Change) -> bool,
) -> Result<(), WatchEnd> {
    loop {
        let resp = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => return Err(WatchEnd::Broken(crate::etcd::Error::StreamClosed("watch"))),
            Err(e) => return Err(WatchEnd::Broken(e)),
        };
        if resp.canceled() {
            return Err(match resp.compact_revision() {
                0 => WatchEnd::Broken(crate::etcd::Error::WatchCanceled(resp.cancel_reason().to_string())),
                at => WatchEnd::Compacted(at),
            });
        }
        if resp.events().is_empty()
            && let Some(h) = resp.header()
        {
            // A progress notification: every change through it was sent.
            *from = (*from).max(h.revision() + 1);
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            *from = (*from).max(kv.mod_revision() + 1);
            let (kind, under) =
                [("device", keys.devices()), ("claim", keys.claims()), ("drain", keys.drains())]
                    .into_iter()
                    .find(|(_, p)| kv.key().starts_with(p.as_bytes()))
                    .unwrap_or(("?", String::new()));
            let Some((b, d)) = keys.split(&under, kv.key()) else { continue };
            let host = match (kind, ev.event_type()) {
                ("claim", EventType::Put) => decode::<ClaimRecord>(kv).ok().map(|c| c.host),
                ("claim", EventType::Delete) => {
                    ev.prev_kv().and_then(|p| decode::<ClaimRecord>(p).ok()).map(|c| c.host)
                }
                _ => None,
            };
            let c = Change {
                revision: kv.mod_revision(),
                kind: kind.into(),
                event: match ev.event_type() {
                    EventType::Put => "put".into(),
                    EventType::Delete => "delete".into(),
                },
                box_name: b.into(),
                device: d.into(),
                host,
            };
            if !each(&c) {
                return Ok(());
            }
        }
    }
}
