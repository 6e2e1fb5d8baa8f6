//! `dxpu bench bridge --json` and `bench link --json`: one JSON object on standard output
//! with the fields scripts compare runs by, the human table on standard error. Small sizes: this checks the shape
//! and that the figures are figures, not the machine's speed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

/// Runs `dxpu bench ARGS --json`: the object on stdout, and the table on stderr.
fn bench_json(args: &[&str]) -> (serde_json::Value, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_dxpu")).arg("bench").args(args).arg("--json").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    (serde_json::from_slice(&out.stdout).expect("stdout is one JSON object"), err)
}

#[test]
fn bench_bridge_json_is_one_object_with_every_row() {
    let (v, err) = bench_json(&["bridge", "--iterations", "200", "--copy-bytes", "1048576", "--scale", "1"]);
    assert!(err.contains("(a) MMIO read round trip"), "the table goes to stderr: {err}");
    assert_eq!(v["mtu"], 9000);
    let mmio = v["mmio"].as_array().unwrap();
    for (path, driver, poll) in
        [("bare", "plain", "busy"), ("bare", "portable", "blocking"), ("bridged", "portable", "busy")]
    {
        let r = mmio
            .iter()
            .find(|r| r["path"] == path && r["driver"] == driver && r["poll"] == poll)
            .unwrap_or_else(|| panic!("no mmio row {path}/{driver}/{poll}: {mmio:?}"));
        let (p50, p99) = (r["p50_us"].as_f64().unwrap(), r["p99_us"].as_f64().unwrap());
        assert!(p50 > 0.0 && p99 >= p50, "{r}");
    }
    let dma = v["dma"].as_array().unwrap();
    for path in ["bare", "direct", "bridged"] {
        let r = dma.iter().find(|r| r["path"] == path).unwrap_or_else(|| panic!("no dma row {path}"));
        assert_eq!(r["bytes"], 1048576);
        assert!(r["h2d_mb_s"].as_f64().unwrap() > 0.0 && r["d2h_mb_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    let bridged = dma.iter().find(|r| r["path"] == "bridged").unwrap();
    assert_eq!(bridged["authenticated"], true, "the link tags frames by default");
    for side in ["host_cpu_s_per_gib", "box_cpu_s_per_gib"] {
        for way in ["h2d", "d2h"] {
            assert!(bridged[side][way].as_f64().unwrap() > 0.0, "{side}.{way}: {bridged}");
        }
    }
    assert!(
        dma.iter().any(|r| r["path"] == "bridged" && r["authenticated"] == false),
        "a bridged row with the frames untagged, for what the tags cost: {dma:?}"
    );
    assert!(v["floor_gso_mb_s"].is_null() || v["floor_gso_mb_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["workload"]["verified"], true);
    assert!(v["workload"]["overhead_percent"].is_number());
}

#[test]
fn bench_link_json_is_one_object_with_every_row() {
    let (v, err) = bench_json(&["link", "--iterations", "200", "--stream", "2000"]);
    assert!(err.contains("round trip (64 B / one MRd→CplD)"), "the table goes to stderr: {err}");
    assert_eq!(v["mtu"], 1472);
    let rtt = v["round_trips"].as_array().unwrap();
    for (path, driver, poll) in [("bare", "plain", "busy"), ("session", "portable", "blocking")] {
        let r = rtt
            .iter()
            .find(|r| r["path"] == path && r["driver"] == driver && r["poll"] == poll)
            .unwrap_or_else(|| panic!("no round-trip row {path}/{driver}/{poll}: {rtt:?}"));
        assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
    }
    let s = v["streaming"].as_array().unwrap();
    let p = s.iter().find(|r| r["driver"] == "portable").expect("a portable streaming row");
    assert_eq!(p["tlps"], 2000);
    assert!(p["mb_s"].as_f64().unwrap() > 0.0 && p["tlps_per_datagram"].as_f64().unwrap() >= 1.0, "{p}");
    for size in ["64", "1472", "9000"] {
        assert!(v["mac_ns"][size].as_f64().unwrap() > 0.0 && v["aead_ns"][size].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["session_cpu"].as_array().unwrap().len(), 2);
}
