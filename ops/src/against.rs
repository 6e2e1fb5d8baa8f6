//! `--check --against-running`: a file compared with what a running daemon runs, from the
//! two fingerprints (`config::fingerprint`): whether a reload would take it, and what it would
//! change — or the sections that need a restart, where a reload would be refused.

use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::error::RunError;

/// Asks the daemon on control socket `socket` (the file's, at `path`) for the fingerprint of
/// what it runs, and compares `new`'s with it.
pub fn against_running(path: &Path, socket: Option<&Path>, new: &Value) -> Result<Comparison, RunError> {
    let socket = socket.ok_or_else(|| RunError::NoControlSocket { path: path.display().to_string() })?;
    let v = crate::control::call(socket, "running", Value::Null, Duration::from_secs(10))
        .map_err(|e| RunError::Running(e.to_string()))?;
    if let Some(e) = v.get("error") {
        let said = e["message"].as_str().unwrap_or("an error without a message");
        return Err(RunError::Running(format!("{}: {said}", socket.display())));
    }
    Ok(compare(&v["result"], new))
}

/// What a reload of the file would do to the running daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Comparison {
    /// Sections that differ and need a restart (a reload is refused): empty if a reload
    /// takes the file.
    pub needs_restart: Vec<String>,
    /// What a reload would change, by kind: `{"hosts": {"added", "removed", "rekeyed"},
    /// "devices": {"added", "removed", "changed", "unchanged"}}` or `{"attaches": …}`.
    pub changes: Value,
}

fn names(m: Option<&Map<String, Value>>) -> Vec<&String> {
    m.map(|m| m.keys().collect()).unwrap_or_default()
}

/// `new` against `running`, both of one kind of daemon.
pub fn compare(running: &Value, new: &Value) -> Comparison {
    let mut needs_restart = Vec::new();
    if running["role"] != new["role"] {
        needs_restart.push(format!("the role ({} runs, the file is for {})", running["role"], new["role"]));
    }
    if let (Some(r), Some(n)) = (running["restart"].as_object(), new["restart"].as_object()) {
        for (section, v) in n {
            if r.get(section) != Some(v) {
                needs_restart.push(section.clone());
            }
        }
    }
    let mut changes = Map::new();
    for kind in ["hosts", "devices", "attaches"] {
        let (r, n) = (running[kind].as_object(), new[kind].as_object());
        if r.is_none() && n.is_none() {
            continue;
        }
        let (mut added, mut removed, mut changed, mut unchanged) = (vec![], vec![], vec![], vec![]);
        for name in names(n) {
            match r.and_then(|r| r.get(name)) {
                None => added.push(name.clone()),
                Some(v) if Some(v) == n.and_then(|n| n.get(name)) => unchanged.push(name.clone()),
                Some(_) => changed.push(name.clone()),
            }
        }
        for name in names(r) {
            if n.is_none_or(|n| !n.contains_key(name)) {
                removed.push(name.clone());
            }
        }
        let changed_as = if kind == "hosts" { "rekeyed" } else { "changed" };
        changes.insert(
            kind.into(),
            json!({"added": added, "removed": removed, changed_as: changed, "unchanged": unchanged}),
        );
    }
    Comparison { needs_restart, changes: Value::Object(changes) }
}

impl Comparison {
    /// One line: what a reload would do, or why it would be refused.
    pub fn describe(&self) -> String {
        if !self.needs_restart.is_empty() {
            return format!(
                "a reload would be refused: {} changed, which needs a restart",
                self.needs_restart.join(", ")
            );
        }
        let mut parts = Vec::new();
        if let Some(m) = self.changes.as_object() {
            for (kind, v) in m {
                for (what, list) in v.as_object().into_iter().flatten() {
                    let list: Vec<&str> =
                        list.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                    if !list.is_empty() && what != "unchanged" {
                        parts.push(format!("{kind} {what}: {}", list.join(", ")));
                    }
                }
            }
        }
        if parts.is_empty() {
            "a reload would change nothing".into()
        } else {
            format!("a reload would apply: {}", parts.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_hosts_and_devices_are_compared_by_their_digests() {
        let running = json!({"role": "gpu", "restart": {"listen": "a", "[link]": "b"},
            "hosts": {"host-a": "k1", "host-b": "k2"}, "devices": {"gpu0": {"spec": "s", "allow": ["host-a"]}}});
        let same = compare(&running, &running);
        assert!(same.needs_restart.is_empty());
        assert_eq!(same.describe(), "a reload would change nothing");
        let new = json!({"role": "gpu", "restart": {"listen": "a", "[link]": "b"},
            "hosts": {"host-a": "k9", "host-c": "k3"},
            "devices": {"gpu0": {"spec": "s", "allow": ["host-a", "host-c"]}, "gpu1": {"spec": "s", "allow": []}}});
        let c = compare(&running, &new);
        assert!(c.needs_restart.is_empty());
        assert_eq!(c.changes["hosts"]["rekeyed"], json!(["host-a"]));
        assert_eq!(c.changes["hosts"]["added"], json!(["host-c"]));
        assert_eq!(c.changes["hosts"]["removed"], json!(["host-b"]));
        assert_eq!(c.changes["devices"]["changed"], json!(["gpu0"]));
        assert_eq!(c.changes["devices"]["added"], json!(["gpu1"]));
        let restart =
            json!({"role": "gpu", "restart": {"listen": "z", "[link]": "b"}, "hosts": {}, "devices": {}});
        let c = compare(&running, &restart);
        assert_eq!(c.needs_restart, ["listen"]);
        assert!(c.describe().contains("needs a restart"), "{}", c.describe());
        assert!(!compare(&running, &json!({"role": "host", "restart": {}})).needs_restart.is_empty());
    }
}
