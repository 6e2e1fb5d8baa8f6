//! What the pool's keys hold: the records boxes, hosts and operators write, as JSON, and
//! how they are read (a record that is not dxpu's is said once per revision, with the
//! command that clears it).

use serde::{Deserialize, Serialize};

use crate::error::PoolError;
use crate::etcd;

/// A device as its box registers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// Where hosts reach the box (`10.0.0.7:7440`).
    pub advertise: String,
    /// PCI Vendor ID.
    pub vendor_id: u16,
    /// PCI Device ID.
    pub device_id: u16,
    /// Class code.
    pub class: u32,
    /// Bytes of VRAM (its largest BAR).
    pub vram_bytes: u64,
    /// `ok` or why not.
    pub health: String,
    /// Hosts that may claim it (`*`: any host; a box publishes its `allow` list).
    pub allow: Vec<String>,
    /// Registered since (Unix seconds).
    pub since: u64,
}

/// The box that holds a box name (`{prefix}/boxes/{box}`), under the lease its devices'
/// records live by: a second box started with the same name finds it and does not register.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoxRecord {
    /// This run of the box (a random number): its own record, left under an older lease,
    /// is taken back; another's is not.
    pub instance: String,
    /// The machine it runs on.
    pub host: String,
    /// Its process.
    pub pid: u32,
    /// Where hosts reach it.
    pub advertise: String,
    /// Holding the name since (Unix seconds).
    pub since: u64,
}

impl std::fmt::Display for BoxRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ago = unix_now().saturating_sub(self.since);
        write!(
            f,
            "pid {} on {} advertising {}, since {} (Unix seconds; {ago} s ago)",
            self.pid, self.host, self.advertise, self.since
        )
    }
}

/// A host's claim on a device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// The host that holds it.
    pub host: String,
    /// Claimed since (Unix seconds).
    pub since: u64,
}

/// An operator's drain: no new claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// Draining since (Unix seconds).
    pub since: u64,
}

/// An operator's revocation of a claim (`dxpu pool revoke`), kept beside the claims so that
/// the box can say who cut the claim's host off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevocationRecord {
    /// Who revoked it: the user, machine, process and command.
    pub by: String,
    /// The token of the claim revoked.
    pub token: u64,
    /// When (Unix seconds).
    pub since: u64,
}

/// Nanoseconds since the Unix epoch (a unique-enough name part).
pub(crate) fn unix_now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) fn decode<T: for<'de> Deserialize<'de>>(kv: &etcd::KeyValue) -> Result<T, PoolError> {
    serde_json::from_slice(kv.value()).map_err(|e| PoolError::BadRecord {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        why: format!("not a dxpu record: {e}"),
    })
}

/// Logs a record that is not dxpu's, once per key and revision: listings run several times
/// a second, and one bad key must not flood the log (it is said again when it changes).
pub(crate) fn warn_bad_record(kv: &etcd::KeyValue, e: &PoolError, fix: &str) -> bool {
    use std::collections::HashSet;
    use std::sync::{Mutex, OnceLock};
    /// Keys and revisions already said.
    type Said = Mutex<HashSet<(Vec<u8>, i64)>>;
    static SAID: OnceLock<Said> = OnceLock::new();
    let mut said = SAID.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if said.len() >= 4096 {
        said.clear();
    }
    let new = said.insert((kv.key().to_vec(), kv.mod_revision()));
    if new {
        log::warn!("{e} (revision {}; {fix})", kv.mod_revision());
    }
    new
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Plain structs of strings and numbers always serialize.
    serde_json::to_vec(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listing runs several times a second: a bad record is said once per revision (on
    /// 9b5fbd6, about five times a second for as long as it stayed).
    #[test]
    fn a_bad_record_is_warned_about_once_per_revision() {
        let kv =
            |rev| etcd::KeyValue { key: b"/t/claims/b/d".to_vec(), mod_revision: rev, ..Default::default() };
        let e = PoolError::BadRecord { key: "/t/claims/b/d".into(), why: "not a dxpu record".into() };
        assert!(warn_bad_record(&kv(7), &e, "fix"));
        for _ in 0..10 {
            assert!(!warn_bad_record(&kv(7), &e, "fix"));
        }
        assert!(warn_bad_record(&kv(8), &e, "fix"), "changed: said again");
    }
}
