//! Telemetry as an operator's tools see it: a real Prometheus joining each host device to its
//! box device by box and PCI address, `/readyz`, and the same counter under the same name in
//! `dxpu ctl stats` and in the metrics.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

mod common;
use common::*;

#[test]
fn readyz_is_ready_once_every_device_is_attached_and_says_which_is_not() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("readyz");
    // The box exports gpu0 only: the host's gpu9 is refused and tried again.
    let BoxAndHost { gpu, host, hs, hm, gm, .. } = box_and_host(&dir, &["gpu0"], &["gpu0", "gpu9"], "");
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let text = http_get(hm, "/readyz");
    assert!(
        text.starts_with("HTTP/1.1 503")
            && text.contains("1 of 2 device(s) attached")
            && text.contains("gpu9"),
        "{text}"
    );
    assert_eq!(result(&hs, &["status"])["ready"], false);
    // Alive all the same, and the box, with its one device healthy, is ready.
    assert!(http_get(hm, "/healthz").starts_with("HTTP/1.1 200"));
    let text = http_get(gm, "/readyz");
    assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("ready\n"), "{text}");
    // Without gpu9 the host is ready.
    let hcfg = dir.join("host.toml");
    let t = std::fs::read_to_string(&hcfg).unwrap();
    let (head, _) = t.split_once("[[attach]]\nserver").unwrap();
    let first = t[head.len()..].split("[[attach]]").nth(1).unwrap();
    std::fs::write(&hcfg, format!("{head}[[attach]]{first}")).unwrap();
    host.signal(rustix::process::Signal::HUP);
    until("the host ready", Duration::from_secs(5), || http_get(hm, "/readyz").starts_with("HTTP/1.1 200"));
    assert_eq!(result(&hs, &["status"])["ready"], true);
    assert_eq!(host.stop().0, 0);
    assert_eq!(gpu.stop().0, 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// The labels of `name`'s sample that has the label `one` (`device="gpu0"`), as pairs.
fn labels_of(text: &str, name: &str, one: &str) -> Vec<(String, String)> {
    let prefix = format!("{name}{{");
    let Some(line) = text.lines().find(|l| l.starts_with(&prefix) && l.contains(one)) else {
        return Vec::new();
    };
    let inside = line[name.len() + 1..].split('}').next().unwrap_or("");
    inside
        .split("\",")
        .filter_map(|kv| kv.split_once("=\""))
        .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
        .collect()
}

#[test]
fn a_real_prometheus_joins_each_host_device_to_its_box_device_by_box_and_pci_address() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if Command::new("prometheus").arg("--version").output().is_err() {
        eprintln!("skipping: prometheus not found (Debian package prometheus)");
        return;
    }
    let dir = tempdir("join");
    let both = ["gpu0", "gpu1"];
    let BoxAndHost { gpu, host, hs, hm, gm, .. } = box_and_host(&dir, &both, &both, "");
    until("both attached", Duration::from_secs(10), || {
        result(&hs, &["devices"]).as_array().unwrap().iter().all(|d| d["state"] == "attached")
    });
    // The host labels each device as the box does: box, PCI address (dcgm's form), IDs.
    let (h, b) = (scrape(hm), scrape(gm));
    promtool_check(&h);
    for d in both {
        let first = format!("device=\"{d}\"");
        let host_labels = labels_of(&h, "dxpu_device_info", &first);
        let box_labels = labels_of(&b, "dxpu_device_info", &first);
        for key in ["box", "pci_bus_id", "vendor_id", "device_id"] {
            let get = |l: &[(String, String)]| l.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
            assert!(get(&host_labels).is_some(), "{d}: the host's info has no {key}:\n{h}");
            assert_eq!(get(&host_labels), get(&box_labels), "{d}: {key}");
        }
        let dev = by_name(&result(&hs, &["devices"]), "name", d).clone();
        conventional("ctl", &dev);
        let pci = dev["pci_address"].as_str().unwrap().to_string();
        assert!(h.contains(&format!("pci_bus_id=\"0000{}\"", pci.to_uppercase())), "{pci}\n{h}");
    }
    // A real Prometheus scrapes both and joins the host's series to the box's on those labels.
    let port = free_tcp_port();
    let yml = dir.join("prometheus.yml");
    std::fs::write(
        &yml,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dxpu-gpu\n    static_configs:\n      - targets: ['127.0.0.1:{gm}']\n  - job_name: dxpu-host\n    static_configs:\n      - targets: ['127.0.0.1:{hm}']\n"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", yml.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let prom = Proc { child, log: dir.join("prometheus.log") };
    // Each host device, the box's device beside it: the box's name for it comes over as
    // `exported_device`, matched on the box and the PCI address alone (not on names).
    let join = "dxpu_device_info{job=\"dxpu-host\"} * on (box, pci_bus_id, vendor_id, device_id) group_left (exported_device) label_replace(dxpu_device_info{job=\"dxpu-gpu\"}, \"exported_device\", \"$1\", \"device\", \"(.*)\")";
    let mut joined = Vec::new();
    until("Prometheus joins both devices", Duration::from_secs(30), || {
        joined = prom_query(port, join);
        joined.len() == 2
    });
    for r in &joined {
        let m = &r["metric"];
        assert_eq!(m["device"], m["exported_device"], "{r}");
        assert_eq!(r["value"][1], "1", "{r}");
        assert!(m["pci_bus_id"].as_str().unwrap().starts_with("00000000:"), "{r}");
    }
    // And a counter of the box's carried to the host's device by the same labels.
    let attaches = "dxpu_device_attaches_total{job=\"dxpu-gpu\"} * on (device) group_left (box, pci_bus_id) dxpu_device_info{job=\"dxpu-gpu\"}";
    let per_host =
        format!("({attaches}) * on (box, pci_bus_id) group_right dxpu_device_info{{job=\"dxpu-host\"}}");
    let r = prom_query(port, &per_host);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r.iter().all(|s| s["value"][1] == "1"), "one attach each: {r:?}");
    drop(prom);
    assert_eq!(host.stop().0, 0);
    assert_eq!(gpu.stop().0, 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// The result vector of a PromQL instant query on the Prometheus at `port` (empty until it
/// answers).
fn prom_query(port: u16, query: &str) -> Vec<Value> {
    let enc: String = query
        .bytes()
        .map(|c| match c {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (c as char).to_string(),
            _ => format!("%{c:02X}"),
        })
        .collect();
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return Vec::new() };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    // HTTP/1.0: the whole body, then the connection closes (no chunks).
    let _ = write!(s, "GET /api/v1/query?query={enc} HTTP/1.0\r\nHost: x\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    assert_ne!(v["status"], "error", "{query}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Where a counter of `dxpu ctl` stands, which decides its metric's prefix.
#[derive(Clone, Copy, PartialEq)]
enum Scope {
    /// The box's own (`stats`' top level), or a host device's (`stats.devices.NAME`).
    Endpoint,
    /// A box's device (`stats.exports.NAME`): `dxpu_device_…`.
    Export,
    /// The box's handshakes (`stats.handshakes`).
    Handshakes,
    /// A session's link (`sessions[]`, a host device's `link`): `dxpu_link_…`.
    Link,
}

/// The handshakes a box refused, by the reasons `dxpu ctl stats` names them.
const REFUSALS: &[&str] = &[
    "unknown_key",
    "auth_failures",
    "bad_cookies",
    "expired_cookies",
    "stale_handshakes",
    "refused_full",
    "bad_handshakes",
];

/// The series a counter of `dxpu ctl` is, by docs/operations.md's rule: the key is the
/// metric's name within its prefix (`dxpu_`, `dxpu_device_`, `dxpu_handshake_`, `dxpu_link_`),
/// with `_total`; a `_sent`/`_received` pair one series by `direction`, a `dropped_R` the
/// `…_dropped_total{reason="R"}`, a `dma_read…`/`dma_write…` one series by `op`, `_samples`
/// a histogram's count, a size in `_bytes` a gauge. None for a percentile (the histograms').
fn series_for(scope: Scope, key: &str) -> Option<(String, Vec<(&'static str, String)>)> {
    if key.split('_').any(|t| t.len() > 1 && t.starts_with('p') && t[1..].chars().all(|c| c.is_ascii_digit()))
    {
        return None;
    }
    let prefix = match scope {
        Scope::Endpoint => "dxpu_",
        Scope::Export => "dxpu_device_",
        Scope::Handshakes => "dxpu_handshake_",
        Scope::Link => "dxpu_link_",
    };
    if scope == Scope::Handshakes && REFUSALS.contains(&key) {
        return Some(("dxpu_handshakes_refused_total".into(), vec![("reason", key.into())]));
    }
    if let Some(why) = key.strip_prefix("dropped_") {
        let what = if scope == Scope::Handshakes { "datagrams" } else { "frames" };
        return Some((format!("{prefix}{what}_dropped_total"), vec![("reason", why.into())]));
    }
    for dir in ["sent", "received"] {
        if let Some(stem) = key.strip_suffix(&format!("_{dir}")) {
            return Some((format!("{prefix}{stem}_total"), vec![("direction", dir.into())]));
        }
    }
    if let Some(stem) = key.strip_suffix("_samples") {
        return Some((format!("{prefix}{stem}_seconds_count"), vec![]));
    }
    for op in ["read", "write"] {
        if let Some(rest) = key.strip_prefix(&format!("dma_{op}")) {
            let stem = if rest == "s" { "dma".to_string() } else { format!("dma{rest}") };
            return Some((format!("dxpu_{stem}_total"), vec![("op", op.into())]));
        }
    }
    if key.ends_with("_bytes") {
        return Some((format!("{prefix}{key}"), vec![]));
    }
    Some((format!("{prefix}{key}_total"), vec![]))
}

/// Whether `text` has a sample of `name` whose labels include `want`.
fn has_series(text: &str, name: &str, want: &[(&str, String)]) -> bool {
    text.lines().filter(|l| !l.starts_with('#')).any(|l| {
        let (n, labels) = match l.split_once('{') {
            Some((n, rest)) => (n, rest.split('}').next().unwrap_or("")),
            None => (l.split(' ').next().unwrap_or(""), ""),
        };
        n == name && want.iter().all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")))
    })
}

/// Every counter in `v` (an object of `scope`, with `labels`) that has no series in `text`,
/// into `missing`; returns how many counters it looked up.
fn unnamed(
    text: &str,
    scope: Scope,
    v: &Value,
    labels: &[(&'static str, String)],
    missing: &mut Vec<String>,
) -> usize {
    let Some(m) = v.as_object() else { return 0 };
    let mut looked = 0;
    for (k, child) in m {
        let with = |extra: Vec<(&'static str, String)>| [labels.to_vec(), extra].concat();
        match child {
            // (A time of day is not a counter.)
            Value::Number(_) if k.contains("_unix_") => {}
            Value::Number(_) => {
                let Some((name, l)) = series_for(scope, k) else { continue };
                let l = with(l);
                looked += 1;
                if !has_series(text, &name, &l) {
                    missing.push(format!("{k} ({name}{l:?})"));
                }
            }
            // TLPs by kind: one series by direction and kind.
            Value::Object(kinds) if k.starts_with("tlps_") => {
                let Some((name, l)) = series_for(scope, k) else { continue };
                for kind in kinds.keys() {
                    let l = with([l.clone(), vec![("kind", kind.clone())]].concat());
                    looked += 1;
                    if !has_series(text, &name, &l) {
                        missing.push(format!("{k}.{kind} ({name}{l:?})"));
                    }
                }
            }
            Value::Object(_) if k == "link" => looked += unnamed(text, Scope::Link, child, labels, missing),
            Value::Object(_) if k == "handshakes" => {
                looked += unnamed(text, Scope::Handshakes, child, labels, missing)
            }
            _ => {}
        }
    }
    looked
}

#[test]
fn ctl_and_the_metrics_name_each_counter_alike() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("names");
    let BoxAndHost { gpu, host, gs, hs, hm, gm, .. } = box_and_host(&dir, &["gpu0"], &["gpu0"], "");
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let (b, h) = (scrape(gm), scrape(hm));
    let (mut missing, mut looked) = (Vec::new(), 0);
    let box_stats = result(&gs, &["stats"]);
    looked += unnamed(&b, Scope::Endpoint, &box_stats, &[], &mut missing);
    for (name, counters) in box_stats["exports"].as_object().unwrap() {
        looked += unnamed(&b, Scope::Export, counters, &[("device", name.clone())], &mut missing);
    }
    for s in result(&gs, &["sessions"]).as_array().unwrap() {
        let l = [("device", s["device"].as_str().unwrap_or("").to_string())];
        looked += unnamed(&b, Scope::Link, s, &l, &mut missing);
    }
    for (name, counters) in result(&hs, &["stats"])["devices"].as_object().unwrap() {
        looked += unnamed(&h, Scope::Endpoint, counters, &[("device", name.clone())], &mut missing);
    }
    // Every object above was walked: the box's own, handshakes, its device, its session's
    // link, the host device's and its link (each over a dozen counters).
    eprintln!("{looked} counters looked up");
    assert!(looked >= 70, "only {looked} counters looked up");
    assert!(
        missing.is_empty(),
        "counters of dxpu ctl with no series of the same name:\n  {}",
        missing.join("\n  ")
    );
    // The rule is not vacuous: a name it cannot find is reported.
    let mut probe = Vec::new();
    unnamed(&b, Scope::Endpoint, &serde_json::json!({"no_such_counter": 1}), &[], &mut probe);
    assert_eq!(probe.len(), 1);
    assert_eq!(host.stop().0, 0);
    assert_eq!(gpu.stop().0, 0);
    let _ = std::fs::remove_dir_all(dir);
}
