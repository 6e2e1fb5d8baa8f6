//! A control socket's answer as `dxpu ctl` prints it without `--json`: a table of the devices
//! or sessions, each other answer as `key: value` lines (nested objects flattened with dots).

use serde_json::Value;

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

/// `key: value` lines, nested objects flattened with dots.
fn flat(prefix: &str, v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flat(&key, v, out);
            }
        }
        v => out.push_str(&format!("{prefix}: {}\n", cell(v))),
    }
}

/// The answer `r` to `method` as text: a table of the devices or sessions, else `key: value`
/// lines.
pub fn text(method: &str, r: &Value) -> String {
    let rows = |keys: &[&str]| -> Vec<Vec<String>> {
        r.as_array()
            .map(|a| {
                a.iter()
                    .map(|d| keys.iter().map(|k| cell(d.get(*k).unwrap_or(&Value::Null))).collect())
                    .collect()
            })
            .unwrap_or_default()
    };
    match method {
        "devices" if r.as_array().is_some_and(|a| a.iter().any(|d| d.get("backing").is_some())) => {
            let keys = ["name", "box_id", "state", "owner", "vendor_id", "device_id", "backing", "allow"];
            crate::table::table(
                &["DEVICE", "BOX-BDF", "STATE", "OWNER", "VENDOR", "DEVICE-ID", "BACKING", "ALLOW"],
                &rows(&keys),
            )
        }
        "devices" => {
            let keys = ["name", "state", "server", "box_id", "host_view", "vfio_user_socket"];
            crate::table::table(
                &["DEVICE", "STATE", "SERVER", "BOX-BDF", "HOST-BDF", "VFIO-USER"],
                &rows(&keys),
            )
        }
        "sessions" => {
            let who = if r.as_array().is_some_and(|a| a.iter().any(|d| d.get("host").is_some())) {
                "host"
            } else {
                "device"
            };
            let keys = [
                who,
                "peer",
                "rtt_p50_le_us",
                "rtt_p99_le_us",
                "frames_sent",
                "frames_received",
                "bytes_sent",
                "bytes_received",
                "retransmits",
                "naks_received",
                "credit_stalls",
            ];
            let head = [
                if who == "host" { "HOST" } else { "DEVICE" },
                "PEER",
                "RTT-P50-LE-US",
                "RTT-P99-LE-US",
                "FRAMES-TX",
                "FRAMES-RX",
                "BYTES-TX",
                "BYTES-RX",
                "RETRANSMITS",
                "NAKS-RX",
                "CREDIT-STALLS",
            ];
            crate::table::table(&head, &rows(&keys))
        }
        _ => {
            let mut out = String::new();
            match r {
                Value::Object(_) => flat("", r, &mut out),
                v => out.push_str(&format!("{}\n", cell(v))),
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_line_up() {
        let t = text("devices", &json!([{"name": "gpu0", "state": "attached", "server": "127.0.0.1:1"}]));
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("DEVICE  STATE"), "{t}");
        assert!(lines[1].starts_with("gpu0    attached"), "{t}");
        assert_eq!(text("status", &json!({"a": {"b": 1}})), "a.b: 1\n");
    }
}
