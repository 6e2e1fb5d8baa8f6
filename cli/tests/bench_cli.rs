//! `dxpu bench bridge --json` and `bench link --json`: one JSON object on standard output
//! with the fields scripts compare runs by, the human table on standard error. Small sizes: this checks the shape
//! and that the figures are figures, not the machine's speed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;
use std::sync::Mutex;

mod common;
use common::conventional;

/// Benchmarks measure: one at a time, or each is the other's noise (the pool storm's etcd
/// members took the core the model's link measurement needed).
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `dxpu bench ARGS --json`: the object on stdout, and the table on stderr.
fn bench_json(args: &[&str]) -> (serde_json::Value, String) {
    let out =
        Command::new(env!("CARGO_BIN_EXE_dxpu")).arg("bench").args(args).arg("--json").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let v = serde_json::from_slice(&out.stdout).expect("stdout is one JSON object");
    conventional(&format!("bench {}", args[0]), &v);
    (v, err)
}

#[test]
fn bench_bridge_pins_as_told_and_refuses_bad_cpus() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dxpu = || Command::new(env!("CARGO_BIN_EXE_dxpu"));
    for bad in ["0,0", "one,two", "3"] {
        let out = dxpu().args(["bench", "bridge", "--pin", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--pin {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--pin"), "--pin {bad}");
    }
    let out = dxpu().args(["bench", "bridge", "--only", "mmio", "--pin", "0,1023"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("CPU 1023 is not one"), "{out:?}");
    let args = ["bridge", "--only", "mmio", "--driver", "portable", "--iterations", "100"];
    let (v, _) = bench_json(&[&args[..], &["--pin", "off"]].concat());
    assert!(v["cpus"].is_null(), "{v}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        let (v, err) = bench_json(&[&args[..], &["--pin", "1,0"]].concat());
        assert_eq!(v["cpus"], serde_json::json!({"device": 1, "host": 0}), "{v}");
        assert!(err.contains("reads, CPUs 1,0"), "{err}");
    }
}

/// A copy of no bytes, or of more than the DMA memory or VRAM holds (or of 2⁶⁴ − 1 bytes,
/// which once streamed the GSO floor without end), and a count of reads, writes or commands
/// of none or past 10 million, are refused naming the option before anything is measured.
#[test]
fn a_size_or_count_out_of_range_is_refused_before_anything_runs() {
    let dxpu = || Command::new(env!("CARGO_BIN_EXE_dxpu"));
    for (bench, option, bad) in [
        ("bridge", "--copy-bytes", "0"),
        ("bridge", "--copy-bytes", "134217729"),
        ("bridge", "--copy-bytes", "18446744073709551615"),
        ("simgpu", "--copy-bytes", "0"),
        ("simgpu", "--copy-bytes", "67108865"),
        ("vfio-user", "--copy-bytes", "0"),
        ("vfio-user", "--message-copy-bytes", "134217729"),
        // A count past what a sample can hold: it once panicked allocating it.
        ("bridge", "--iterations", "18446744073709551615"),
        ("bridge", "--iterations", "0"),
        ("link", "--iterations", "10000001"),
        ("link", "--stream", "18446744073709551615"),
        ("simgpu", "--commands", "0"),
        ("vfio-user", "--iterations", "18446744073709551615"),
    ] {
        let start = std::time::Instant::now();
        let out = dxpu().args(["bench", bench, option, bad]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "bench {bench} {option} {bad}: {err}");
        assert!(err.contains(option) && err.contains(bad), "bench {bench} {option} {bad}: {err}");
        assert!(out.stdout.is_empty(), "bench {bench} {option} {bad} measured something");
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "bench {bench} {option} {bad}");
    }
    for bad in ["0", "18446744073709551615"] {
        let out = dxpu().args(["loopback", "--rtt-samples", bad]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "loopback --rtt-samples {bad}: {err}");
        assert!(err.contains("--rtt-samples"), "{err}");
    }
}

#[test]
fn bench_bridge_json_is_one_object_with_every_row() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (v, err) = bench_json(&["bridge", "--iterations", "200", "--copy-bytes", "1048576", "--scale", "1"]);
    assert!(err.contains("(a) MMIO read round trip"), "the table goes to stderr: {err}");
    assert_eq!(v["mtu_bytes"], 9000);
    // The register reads' threads on the first two CPUs the process may use, named.
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        assert_eq!(v["cpus"], serde_json::json!({"device": 0, "host": 1}), "{v}");
        assert!(err.contains("reads, CPUs 0,1"), "{err}");
        // Where the hypervisor put the CPUs, before and after the bench (none where a thread
        // was not running for a second: a busy machine, logged).
        let c = &v["core_round_trip_ns"];
        assert!(!c.is_null() || err.contains("round trip between CPUs"), "not measured, nothing said: {err}");
        if !c.is_null() {
            assert!(c["before"].as_f64().is_some_and(|ns| ns > 0.0) && c["after"].as_f64().is_some(), "{v}");
            assert!(v["cores_moved"].is_boolean() && err.contains("a cache line's round trip"), "{err}");
        }
    }
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
        assert!(
            r["h2d_bytes_per_s"].as_f64().unwrap() > 0.0 && r["d2h_bytes_per_s"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
    let bridged = dma.iter().find(|r| r["path"] == "bridged").unwrap();
    assert_eq!(bridged["authenticated"], true, "the link tags frames by default");
    // What the machine took while each copying row ran: read where /proc/stat is.
    if std::path::Path::new("/proc/stat").exists() {
        for r in dma.iter().filter(|r| r["path"] != "bare") {
            assert!(r["steal_ms"].as_f64().is_some_and(|s| s >= 0.0), "{r}");
            assert!(r["others_ms"].as_f64().is_some_and(|s| s >= 0.0) && r["taken_from"].is_boolean(), "{r}");
        }
        if !v["floor_gso_bytes_per_s"].is_null() {
            assert!(v["floor_samples_taken_from"].as_u64().is_some(), "{v}");
        }
    }
    for way in ["h2d", "d2h"] {
        assert!(bridged["host_cpu_s_per_gib"][way].as_f64().unwrap() > 0.0, "host {way}: {bridged}");
    }
    // The box's share is the process's CPU clock less the host thread's: the process clock
    // takes a thread running on another core only at its next scheduler event, so over a
    // copy of a millisecond or two one direction can read zero (it did, once in CI, on a
    // loaded machine). Both are never zero, and neither is negative.
    let box_cpu = |way: &str| bridged["box_cpu_s_per_gib"][way].as_f64().unwrap();
    assert!(box_cpu("h2d") >= 0.0 && box_cpu("d2h") >= 0.0, "{bridged}");
    assert!(box_cpu("h2d") + box_cpu("d2h") > 0.0, "no box CPU time either way: {bridged}");
    // The work is the CPU time less the spins: never more, never negative; and the floors'
    // sender and receiver spent something on every byte.
    for side in ["host", "box"] {
        for way in ["h2d", "d2h"] {
            let cpu = bridged[format!("{side}_cpu_s_per_gib")][way].as_f64().unwrap();
            let work = bridged[format!("{side}_work_s_per_gib")][way].as_f64().unwrap();
            assert!((0.0..=cpu + 1e-12).contains(&work), "{side} {way}: work {work} of {cpu}: {bridged}");
        }
    }
    if !v["floor_gso_bytes_per_s"].is_null() {
        for floor in ["hot", "copy", "staged"] {
            for end in ["send", "receive"] {
                let f = v["floor_gso_cpu_s_per_gib"][floor][end].as_f64().unwrap();
                assert!(f > 0.0, "{floor} {end}: {v}");
            }
        }
        let ratio = bridged["cpu_vs_gso_staged_floor_ratio"]["h2d"].as_f64().unwrap();
        assert!(ratio > 0.0, "{bridged}");
    }
    assert!(
        dma.iter().any(|r| r["path"] == "bridged" && r["authenticated"] == false),
        "a bridged row with the frames untagged, for what the tags cost: {dma:?}"
    );
    assert!(v["floor_gso_bytes_per_s"].is_null() || v["floor_gso_bytes_per_s"].as_f64().unwrap() > 0.0);
    // The floor from and into copy-sized buffers, directly and staged, exists where the floor does.
    for key in ["floor_gso_copy_bytes_per_s", "floor_gso_staged_bytes_per_s"] {
        assert_eq!(v[key].is_null(), v["floor_gso_bytes_per_s"].is_null(), "{key}: {v}");
        assert!(v[key].is_null() || v[key].as_f64().unwrap() > 0.0, "{key}: {v}");
    }
    if !v["floor_gso_staged_bytes_per_s"].is_null() {
        assert!(bridged["vs_gso_staged_floor_ratio"]["h2d"].as_f64().unwrap() > 0.0, "{bridged}");
    }
    assert_eq!(v["workload"]["verified"], true);
    assert!(v["workload"]["overhead_percent"].is_number());
}

#[test]
fn bench_link_json_is_one_object_with_every_row() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (v, err) = bench_json(&["link", "--iterations", "200", "--stream", "2000"]);
    assert!(err.contains("round trip (64 B / one MRd→CplD)"), "the table goes to stderr: {err}");
    assert_eq!(v["mtu_bytes"], 1472);
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
    assert!(
        p["bytes_per_s"].as_f64().unwrap() > 0.0 && p["tlps_per_datagram"].as_f64().unwrap() >= 1.0,
        "{p}"
    );
    for size in ["64", "1472", "9000"] {
        assert!(v["mac_ns"][size].as_f64().unwrap() > 0.0 && v["aead_ns"][size].as_f64().unwrap() > 0.0);
    }
    assert_eq!(v["session_cpu"].as_array().unwrap().len(), 2);
}

#[test]
fn bench_model_writes_its_table_json_and_plots() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // No font installed is needed: the plots' text is drawn with the built-in DejaVu Sans
    // (.ci/run installs no fonts).
    let dir = std::env::temp_dir().join(format!("dxpu-bench-model-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(["bench", "model", "--delays-us", "0,10", "--repeat", "1", "--scale", "1"])
        .args(["--workloads", "inference,data-loading", "--out"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("inference") && table.contains("holds"), "{table}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap();
    conventional("bench model", &v);
    assert_eq!(v["points"], 4);
    let workloads = v["workloads"].as_array().unwrap();
    assert_eq!(workloads.len(), 2);
    for w in workloads {
        let points = w["points"].as_array().unwrap();
        assert_eq!(points.iter().map(|p| p["delay_us"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 10]);
        // Ten µs each way lengthen the measured round trip by about twenty.
        assert!(points[1]["rtt_us"].as_f64() > points[0]["rtt_us"].as_f64(), "{w}");
        for p in points {
            for k in ["overhead_percent", "predicted_overhead_percent", "predicted_bridged_seconds"] {
                assert!(p[k].is_number(), "{k}: {p}");
            }
        }
        let name = w["workload"].as_str().unwrap();
        let svg = std::fs::read_to_string(dir.join(format!("{name}.svg"))).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("overhead"), "{name}.svg");
        let png = std::fs::read(dir.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}.png");
    }
    // A font that is not one is refused naming it.
    let bad = dir.join("model.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(["bench", "model", "--out"])
        .arg(&dir)
        .arg("--font")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.json"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_pool_storms_a_cluster_it_starts_and_counts_no_double_allocation() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args([
            "bench",
            "pool",
            "--boxes",
            "1,3",
            "--hosts",
            "6",
            "--seconds",
            "1",
            "--hold-ms",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("bench pool", &v);
    let runs = v.as_array().unwrap();
    assert_eq!(
        runs.iter().map(|r| (r["devices"].as_u64(), r["hosts"].as_u64())).collect::<Vec<_>>(),
        [(Some(8), Some(2)), (Some(24), Some(6))]
    );
    for r in runs {
        assert!(r["claims"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["double_allocations"], 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        // A listing and a transaction at least, for each claim granted.
        assert!(r["round_trips_per_claim"].as_f64().unwrap() >= 2.0, "{r}");
    }
}

/// The fault-injection soak, short (CI's run of it; docs/reliability.md has the 30-minute
/// one): every run accounted for, no device with two owners, box-a answering throughout.
#[test]
fn a_short_chaos_soak_accounts_for_every_run() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("dxpu-chaos-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(["bench", "chaos", "--minutes", "0.5", "--seed", "7", "--json", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success(), "{v:#}");
    conventional("bench chaos", &v);
    assert_eq!(v["ok"], true, "{v:#}");
    assert!(v["verified"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(v["two_owner_violations"].as_array().unwrap().len(), 0, "{v:#}");
    assert_eq!(v["unexplained"].as_array().unwrap().len(), 0, "{v:#}");
    let runs = v["runs"].as_u64().unwrap();
    assert_eq!(runs, v["verified"].as_u64().unwrap() + v["failed"].as_u64().unwrap(), "{v:#}");
    assert!(v["faults"].as_object().unwrap().len() >= 4, "too few kinds of fault: {v:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_simgpu_json_is_one_object_by_the_conventions() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (v, err) = bench_json(&["simgpu", "--commands", "200", "--copy-bytes", "1048576"]);
    assert!(err.contains("dxpu bench simgpu"), "the lines go to standard error: {err}");
    let rt = &v["command_round_trip"];
    assert!(rt["p50_us"].as_f64().unwrap() > 0.0 && rt["p99_us"].as_f64() >= rt["p50_us"].as_f64(), "{v}");
    assert_eq!(v["copy_bytes"], 1048576);
    for copy in ["staged_copy", "pinned_copy"] {
        for way in ["h2d_bytes_per_s", "d2h_bytes_per_s"] {
            assert!(v[copy][way].as_f64().unwrap() > 0.0, "{copy} {way}: {v}");
        }
    }
    assert!(
        v["vadd_2e20_fp32_ms"].as_f64().unwrap() > 0.0 && v["matmul_256_fp32_ms"].as_f64().unwrap() > 0.0
    );
}

#[test]
fn bench_vfio_user_json_is_one_object_by_the_conventions() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (v, err) = bench_json(&[
        "vfio-user",
        "--iterations",
        "200",
        "--copy-bytes",
        "1048576",
        "--message-copy-bytes",
        "262144",
    ]);
    assert!(err.contains("dxpu bench vfio-user"), "the table goes to standard error: {err}");
    let mmio = v["mmio"].as_array().unwrap();
    for (path, poll) in
        [("bridged", "busy"), ("vfio_user", "busy"), ("bridged", "blocking"), ("vfio_user", "blocking")]
    {
        let r = mmio
            .iter()
            .find(|r| r["path"] == path && r["poll"] == poll)
            .unwrap_or_else(|| panic!("{path} {poll}: {v}"));
        assert!(r["p50_us"].as_f64().unwrap() > 0.0 && r["p99_us"].as_f64() >= r["p50_us"].as_f64(), "{r}");
    }
    let dma = v["dma"].as_array().unwrap();
    for path in ["bridged", "vfio_user_shared", "vfio_user_messages"] {
        let r = dma.iter().find(|r| r["path"] == path).unwrap_or_else(|| panic!("{path}: {v}"));
        assert!(
            r["h2d_bytes_per_s"].as_f64().unwrap() > 0.0 && r["d2h_bytes_per_s"].as_f64().unwrap() > 0.0,
            "{r}"
        );
    }
}
