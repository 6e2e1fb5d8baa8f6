//! `dxpu model`: predictions from a profile with known answers (no round trip, no cost; a
//! workload of blocking reads only scales exactly with the round trip), a profile counted
//! by direct runs, and bad values refused with messages that name them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use serde_json::{Value, json};

mod common;
use common::conventional;

fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

fn profile(fields: &[(&str, u64)]) -> Value {
    let mut p = json!({
        "register_reads": 0, "register_writes": 0, "device_reads": 0, "device_read_bytes": 0,
        "dependent_reads": 0, "device_writes": 0, "device_write_bytes": 0, "interrupts": 0,
        "commands": 0, "doorbells": 0, "waits": 0, "waits_polled": 0, "waits_interrupt": 0,
        "waits_idle": 0,
        "direct_h2d_bytes_per_s": 0.0, "direct_d2h_bytes_per_s": 0.0,
    });
    for (k, v) in fields {
        p[*k] = json!(v);
    }
    p
}

fn model_json(file: &Value, args: &[&str]) -> Value {
    let path =
        std::env::temp_dir().join(format!("dxpu-model-{}-{}.json", std::process::id(), args.join("_")));
    std::fs::write(&path, file.to_string()).unwrap();
    let out = dxpu().args(["model", "--json", "--profile"]).arg(&path).args(args).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v = serde_json::from_slice(&out.stdout).unwrap();
    conventional("model", &v);
    v
}

#[test]
fn blocking_reads_alone_scale_exactly_with_the_round_trip() {
    let file = json!({"workload": "reads", "direct_seconds": 0.001, "profile": profile(&[("register_reads", 1000)])});
    let v = model_json(&file, &["--rtt-us", "0,1,10,100"]);
    assert_eq!(v["workload"], "reads");
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    for p in points {
        let rtt = p["rtt_us"].as_f64().unwrap();
        let want = 0.001 + 1000.0 * rtt * 1e-6;
        let got = p["predicted_bridged_seconds"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-12, "{p}");
        let overhead = p["predicted_overhead_percent"].as_f64().unwrap();
        assert!((overhead - rtt * 100.0).abs() < 1e-6, "{p}");
    }
    // Zero round trip, zero overhead.
    assert_eq!(points[0]["predicted_overhead_percent"].as_f64(), Some(0.0));
    // 10 % of 1 ms over 1000 reads: 0.1 µs each.
    let x = v["crosses_10_percent_at_rtt_us"].as_f64().unwrap();
    assert!((x - 0.1).abs() < 1e-9, "{x}");
}

#[test]
fn counts_at_the_edge_of_their_range_do_not_overflow() {
    let huge = u64::MAX;
    let p = profile(&[
        ("register_reads", huge),
        ("dependent_reads", huge),
        ("waits_idle", huge),
        ("waits_polled", huge),
        ("waits_interrupt", huge),
    ]);
    let file = json!({"workload": "edge", "direct_seconds": 1e-9, "profile": p});
    let v = model_json(&file, &["--rtt-us", "0,1000000"]);
    let top = v["points"][1]["predicted_overhead_percent"].as_f64().unwrap();
    assert!(top.is_finite() && top > 1e20, "{v}");
    assert_eq!(v["profile"]["round_trips"].as_u64(), Some(huge));
    // A direct time of zero, negative or not a number is refused.
    for direct in [json!(0.0), json!(-1.0), json!("fast")] {
        let path = std::env::temp_dir().join(format!("dxpu-model-direct-{}.json", std::process::id()));
        std::fs::write(&path, json!({"direct_seconds": direct, "profile": profile(&[])}).to_string())
            .unwrap();
        let out = dxpu().args(["model", "--profile"]).arg(&path).output().unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(out.status.code(), Some(1), "{direct}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("direct"), "{direct}");
    }
}

#[test]
fn a_profile_with_nothing_on_its_critical_path_never_crosses() {
    let file = json!({"workload": "compute", "direct_seconds": 0.5, "profile": profile(&[("commands", 10)])});
    let v = model_json(&file, &["--rtt-us", "0,1000000"]);
    assert!(v["crosses_10_percent_at_rtt_us"].is_null(), "{v}");
    for p in v["points"].as_array().unwrap() {
        assert_eq!(p["predicted_overhead_percent"].as_f64(), Some(0.0), "{p}");
    }
    // Bytes over a link slower than the platform: the bandwidth term, at any round trip.
    let p = profile(&[("device_read_bytes", 1_000_000_000)]);
    let file = json!({"workload": "copy", "direct_seconds": 1.0, "profile": p});
    let v = model_json(&file, &["--rtt-us", "0", "--bandwidth-gbit", "8"]);
    let got = v["points"][0]["predicted_bridged_seconds"].as_f64().unwrap();
    assert!((got - 2.0).abs() < 1e-9, "1 GB at 1 GB/s adds 1 s: {v}");
    assert_eq!(v["crosses_10_percent_at_rtt_us"].as_f64(), Some(0.0));
}

#[test]
fn a_workload_counted_by_direct_runs_has_a_profile_and_a_crossing() {
    let out = dxpu()
        .args([
            "model",
            "--workload",
            "inference",
            "--scale",
            "1",
            "--repeat",
            "1",
            "--json",
            "--rtt-us",
            "0,20",
        ])
        // A link faster than the platform's own copies: no bandwidth term.
        .args(["--bandwidth-gbit", "1600"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("model", &v);
    assert_eq!(v["workload"], "inference");
    assert_eq!(v["points"][0]["predicted_overhead_percent"].as_f64(), Some(0.0), "{v}");
    let at20 = v["points"][1]["predicted_overhead_percent"].as_f64().unwrap();
    assert!(at20 > 0.0, "{v}");
    assert!(v["crosses_10_percent_at_rtt_us"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["profile"]["waits_idle"].as_u64().unwrap() > 0);
    // The link measured through both endpoints: its round trip joins the points, its bulk
    // rates are the ones used.
    let out = dxpu()
        .args(["model", "--workload", "training", "--scale", "1", "--repeat", "1", "--json"])
        .args(["--measure-link", "--delay-us", "20", "--rtt-us", "0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("model", &v);
    let m = &v["measured_link"];
    let rtt = m["rtt_us"].as_f64().unwrap();
    assert!(rtt >= 40.0, "20 µs each way: {v}");
    let points: Vec<f64> =
        v["points"].as_array().unwrap().iter().map(|p| p["rtt_us"].as_f64().unwrap()).collect();
    assert_eq!(points, [0.0, rtt]);
    assert_eq!(v["h2d_bytes_per_s"], m["h2d_bytes_per_s"]);
    // The human table names each round trip.
    let out = dxpu().args(["model", "--workload", "demo", "--scale", "1", "--repeat", "1"]).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("RTT µs") && text.contains("10 %"), "{text}");
}

#[test]
fn bad_values_are_refused_naming_them() {
    for (args, says) in [
        (&["--rtt-us", "abc"][..], "abc"),
        (&["--rtt-us", "-5"], "-5"),
        (&["--rtt-us", "10,2000000"], "2000000"),
        (&["--rtt-us", "nan"], "nan"),
        (&["--workload", "mining"], "mining"),
        (&["--bandwidth-gbit", "0"], "bandwidth"),
        (&["--per-tlp-us", "-1"], "-1"),
        (&["--scale", "0"], "--scale"),
    ] {
        let out = dxpu().arg("model").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A profile file that is missing, not JSON, or lacks a count; a device that never ends
    // (it once read /dev/zero without end), a directory, and a file past 16 MiB.
    let dir = std::env::temp_dir();
    let huge = dir.join(format!("dxpu-model-huge-{}.json", std::process::id()));
    std::fs::File::create(&huge).and_then(|f| f.set_len((16 << 20) + 1)).unwrap();
    for (path, says) in [
        (std::path::Path::new("/dev/zero"), "not a regular file"),
        (dir.as_path(), "not a regular file"),
        (huge.as_path(), "over 16777216 bytes"),
    ] {
        let start = std::time::Instant::now();
        let out = dxpu().args(["model", "--profile"]).arg(path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{path:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains(path.to_str().unwrap()), "{err}");
        assert!(start.elapsed() < std::time::Duration::from_secs(10), "{path:?}");
    }
    let _ = std::fs::remove_file(&huge);
    let missing = dir.join(format!("dxpu-model-missing-{}.json", std::process::id()));
    let bad = dir.join(format!("dxpu-model-bad-{}.json", std::process::id()));
    let short = dir.join(format!("dxpu-model-short-{}.json", std::process::id()));
    std::fs::write(&bad, "not json").unwrap();
    let mut p = profile(&[]);
    p.as_object_mut().unwrap().remove("waits_idle");
    std::fs::write(&short, json!({"direct_seconds": 1.0, "profile": p}).to_string()).unwrap();
    for (path, says) in [(&missing, "No such file"), (&bad, "not JSON"), (&short, "profile.waits_idle")] {
        let out = dxpu().args(["model", "--profile"]).arg(path).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{path:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains(path.to_str().unwrap()), "{err}");
    }
    let _ = (std::fs::remove_file(&bad), std::fs::remove_file(&short));
    // A shape option given to a workload it does not apply to.
    for (args, says) in [
        (&["--workload", "demo", "--batch", "8"][..], "--batch"),
        (&["--workload", "training", "--layers", "2"], "--layers"),
    ] {
        let out = dxpu().arg("model").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says) && err.contains("does not apply"), "{args:?}: {err}");
    }
    // --workload and --profile together.
    let out = dxpu().args(["model", "--workload", "demo", "--profile", "x.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    // `dxpu model … | head -1`: every line after the reader went away meets a closed pipe.
    let file = json!({"workload": "reads", "direct_seconds": 0.001, "profile": profile(&[("register_reads", 1000)])});
    let path = std::env::temp_dir().join(format!("dxpu-model-pipe-{}.json", std::process::id()));
    std::fs::write(&path, file.to_string()).unwrap();
    let rtts = (0..2000).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    for args in
        [vec!["model", "--profile", path.to_str().unwrap(), "--rtt-us", &rtts], vec!["completions", "zsh"]]
    {
        let mut child = dxpu()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader closes before reading anything
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("panicked"),
            "dxpu {}: {:?} {err}",
            args[0],
            out.status
        );
    }
    let _ = std::fs::remove_file(&path);
}

/// One launch (kernel 10–110 µs) and a stream synchronization returning 5 µs after it: at
/// a round trip R the job is 2 R longer (1.5 R to fetch the command, R/2 for the fence).
#[test]
fn a_trace_is_predicted_from_its_critical_path() {
    let trace = json!({"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "tid": 1, "ts": 1000, "dur": 5,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "k", "tid": 7, "ts": 1010, "dur": 100,
         "args": {"correlation": 1, "stream": 7, "device": 0}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "tid": 1, "ts": 1020, "dur": 95,
         "args": {"correlation": 2}},
    ]});
    let path = std::env::temp_dir().join(format!("dxpu-model-trace-{}.json", std::process::id()));
    std::fs::write(&path, trace.to_string()).unwrap();
    let out =
        dxpu().args(["model", "--json", "--rtt-us", "0,10"]).arg("--trace").arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("model", &v);
    assert_eq!(
        (v["workload"].as_str(), v["kernels"].as_u64(), v["syncs"].as_u64()),
        (Some("trace"), Some(1), Some(1))
    );
    assert_eq!(v["direct_seconds"].as_f64(), Some(115e-6));
    let p = &v["points"][1];
    assert!((p["predicted_bridged_seconds"].as_f64().unwrap() - 135e-6).abs() < 1e-12, "{p}");
    assert!((p["added"]["command_fetch_ms"].as_f64().unwrap() - 0.015).abs() < 1e-12, "{p}");
    assert!((p["added"]["synchronizations_ms"].as_f64().unwrap() - 0.005).abs() < 1e-12, "{p}");
    // 10 % of 115 µs over 2 round trips.
    let x = v["crosses_10_percent_at_rtt_us"].as_f64().unwrap();
    assert!((x - 5.75).abs() < 0.01, "{x}");
    // The trace has no cuda_sync events: its synchronization's stream is inferred, and said.
    assert_eq!(
        (v["plan"]["dependencies_stated"].as_bool(), v["plan"]["syncs_inferred"].as_u64()),
        (Some(false), Some(1))
    );
    // --device picks a GPU of the file; --rank is the rank the trace names (this one names none).
    let with = |extra: &[&str]| {
        dxpu().args(["model", "--rtt-us", "1"]).args(extra).arg("--trace").arg(&path).output().unwrap()
    };
    assert!(with(&["--device", "0"]).status.success());
    let out = with(&["--device", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("on GPU 1"), "{out:?}");
    let out = with(&["--rank", "3"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("names no rank"), "{out:?}");
    // A truncated trace: an error naming the file, no panic.
    std::fs::write(&path, &trace.to_string()[..60]).unwrap();
    let out = dxpu().args(["model", "--rtt-us", "1"]).arg("--trace").arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a PyTorch profiler trace"), "{err}");
}

/// `dxpu replay` on the small A100 trace, once each way: the report's fields, the replay's
/// span near the trace's, the model's prediction beside it.
#[test]
fn replay_reports_the_overhead_and_the_models_prediction_as_json() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/traces/a100-event-sync-small.json.gz");
    let out = dxpu().args(["replay", "--repeat", "1", "--json"]).arg(&trace).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("replay", &v);
    for k in [
        "trace",
        "gpu",
        "kernels",
        "copies",
        "syncs",
        "trace_span_ms",
        "direct_seconds",
        "direct_seconds_min",
        "bridged_seconds_max",
        "overhead_percent",
        "overhead_percent_min",
        "overhead_percent_max",
        "rtt_us",
        "delay_us",
    ] {
        assert!(!v[k].is_null(), "{k} missing: {v}");
    }
    assert_eq!(
        (v["kernels"].as_u64(), v["copies"].as_u64(), v["syncs"].as_u64()),
        (Some(4), Some(1), Some(3))
    );
    for k in ["predicted_bridged_seconds", "predicted_overhead_percent"] {
        assert!(v["model"][k].as_f64().is_some(), "model.{k}: {v}");
    }
    assert!(v["model"].get("crosses_10_percent_at_rtt_us").is_some());
    // Blind, with its baselines; overhead both ways; the replay's pace judged.
    assert!(v["model"]["inputs_from"].as_str().unwrap().contains("before any replay"), "{v}");
    assert_eq!(v["model"]["baselines"]["no_overhead_percent"], 0.0);
    assert!(v["model"]["baselines"]["bandwidth_only_percent"].as_f64().is_some());
    assert!(v["overhead_against_trace_percent"].as_f64().is_some(), "{v}");
    assert!(v["overhead_against_trace_percent_min"].as_f64() <= v["overhead_against_trace_percent"].as_f64());
    assert!(v["faithful"].is_boolean() && v["direct_span_ratio"].as_f64().is_some(), "{v}");
    assert_eq!(v["faithful"].as_bool().unwrap(), v["not_faithful_because"].is_null());
    // Where the spinning threads ran, measured at the calibration and after each pair (none
    // where a measurement found a thread not running for a second: a busy machine, logged).
    let c = &v["cores"];
    if c.is_null() && std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        // Placed on two CPUs: a round trip not measured is said on standard error.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("round trip between CPUs") || err.contains("starting a thread for CPU"),
            "cores null, nothing said: {err}"
        );
    }
    if !c.is_null() {
        assert!(c["round_trip_at_calibration_ns"].as_f64().is_some_and(|ns| ns > 0.0), "{v}");
        assert!(c["round_trip_after_pairs_ns"].as_array().unwrap().len() <= 1, "{v}");
        assert_eq!(v["cores_moved"].as_bool().unwrap(), !v["cores_moved_because"].is_null(), "{v}");
    }
    assert!(v["plan"]["out_of_submission_order"].as_u64().is_some() && v["assumed"].is_object());
    // Each pair: its overhead and what the bridged run's link did to recover frames.
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 1, "{v}");
    assert_eq!(pairs[0]["overhead_percent"], v["overhead_percent"]);
    for k in ["replay_timeouts", "retransmits", "duplicates_received"] {
        assert!(pairs[0][k].as_u64().is_some(), "pairs[0].{k}: {v}");
    }
    // Each pair's prediction, from a calibration made just before it; with one pair, the
    // median of them is its own.
    let by_pair = pairs[0]["predicted_overhead_percent"].as_f64().unwrap();
    assert_eq!(v["model"]["predicted_overhead_percent_by_pair"].as_f64(), Some(by_pair), "{v}");
    assert_eq!(v["model"]["predicted_overhead_percent_by_pair_min"].as_f64(), Some(by_pair), "{v}");
    // The share of the large copies' time the job's thread served the platform: a share, or
    // none where the trace has no copy large enough to tell a rate.
    for side in ["direct", "bridged"] {
        for k in ["h2d_served_share_in_replay", "d2h_served_share_in_replay"] {
            let x = &v[side][k];
            assert!(x.is_null() || x.as_f64().is_some_and(|s| (0.0..=1.0).contains(&s)), "{side}.{k}: {v}");
        }
    }
    // The hypervisor's steal during each run, where the threads were placed and /proc/stat read.
    if !v["cores"].is_null() && std::path::Path::new("/proc/stat").exists() {
        assert_eq!(pairs[0]["steal_ms"].as_array().map(Vec::len), Some(2), "{v}");
        assert!(pairs[0]["stolen_from"].is_boolean() && v["pairs_stolen_from"].as_u64().is_some(), "{v}");
    }
    // The threads' run-queue waits during each run, where the kernel keeps sched_info.
    if std::path::Path::new("/proc/self/schedstat").exists() {
        let waited = pairs[0]["waited_ms"].as_array().unwrap();
        assert!(waited.len() == 2 && waited.iter().all(|w| w.as_f64().is_some_and(|w| w >= 0.0)), "{v}");
        assert!(pairs[0]["contended"].is_boolean() && v["pairs_contended"].as_u64().is_some(), "{v}");
    }
    // The overhead of the pairs the machine took nothing from: all of them here, or none.
    let taken =
        pairs[0]["stolen_from"].as_bool() == Some(true) || pairs[0]["contended"].as_bool() == Some(true);
    if taken {
        assert!(v["overhead_percent_not_taken"].is_null(), "{v}");
    } else if pairs[0]["contended"].is_boolean() || pairs[0]["stolen_from"].is_boolean() {
        assert_eq!(v["overhead_percent_not_taken"], v["overhead_percent"], "{v}");
    }
    // The direct replay's calls go no earlier than traced: its job no shorter than the trace's.
    let job = v["trace_job_seconds"].as_f64().unwrap();
    let direct_job = v["direct"]["job_seconds"].as_f64().unwrap();
    assert!(direct_job >= job * 0.95, "{direct_job} against {job}");
    // A trace that is not one: an error, exit status 1.
    let out = dxpu().args(["replay", "/nonexistent.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.json"));
    // Both spinning threads on one CPU: refused before anything starts.
    let out = dxpu().args(["replay", "--pin", "0,0"]).arg(&trace).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must differ"));
}

/// `dxpu model --trace T --calibrate`: the link calibrated as `replay` calibrates it, its
/// round trip a point of the prediction.
#[test]
fn model_calibrates_the_link_for_a_trace_as_replay_does() {
    let trace =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/traces/a100-event-sync-small.json.gz");
    let out = dxpu()
        .args(["model", "--calibrate", "--json", "--rtt-us", "0"])
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("calibrating the link"));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rtt = v["measured_link"]["rtt_us"].as_f64().unwrap();
    assert!(rtt > 0.0, "{v}");
    let points = v["points"].as_array().unwrap();
    assert!(points.iter().any(|p| p["rtt_us"].as_f64() == Some(rtt)), "{v}");
}
