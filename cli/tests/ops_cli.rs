//! Operating the endpoints as processes: `dxpu ctl` against a running box and host (every
//! method, a device detached and attached again while another keeps its session, JSON-RPC
//! errors, a client that never reads), Prometheus metrics checked by `promtool` and against
//! the endpoint's own counters, SIGHUP reloads (a valid change, an invalid one, none).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::*;

#[test]
fn ctl_answers_every_method_and_a_device_comes_and_goes_while_another_keeps_its_session() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("ctl");
    let both = ["gpu0", "gpu1"];
    let BoxAndHost { gpu, host, gs, hs, port, .. } = box_and_host(&dir, &both, &both, "");
    // Both sockets are the owner's only.
    for s in [&gs, &hs] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(s).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{}", s.display());
    }

    let st = result(&gs, &["status"]);
    assert_eq!(st["role"], "gpu");
    assert_eq!(st["version"], env!("CARGO_PKG_VERSION"));
    assert!(st["uptime_seconds"].as_f64().unwrap() >= 0.0);
    assert!(["io_uring", "portable"].contains(&st["driver"].as_str().unwrap()), "{st}");
    assert_eq!(st["poll"], "blocking");
    let st = result(&hs, &["status"]);
    assert_eq!(st["role"], "host");
    assert_eq!(st["attached"], 2);

    let devs = result(&gs, &["devices"]);
    for d in ["gpu0", "gpu1"] {
        let d = by_name(&devs, "name", d);
        assert_eq!(d["state"], "attached", "{d}");
        assert_eq!(d["owner"], "host-a");
        assert_eq!(d["vendor_id"], "0x1234");
        assert!(d["counters"]["host_requests"].as_u64().unwrap() > 0, "{d}");
    }
    let hdevs = result(&hs, &["devices"]);
    assert_eq!(by_name(&hdevs, "name", "gpu1")["state"], "attached");
    let sessions = result(&gs, &["sessions"]);
    assert_eq!(sessions.as_array().unwrap().len(), 2, "{sessions}");
    let s0 = by_name(&sessions, "device", "gpu0").clone();
    assert_eq!(s0["host"], "host-a");
    assert!(
        s0["frames_received"].as_u64().unwrap() > 0 && s0["bytes_received"].as_u64().unwrap() > 0,
        "{s0}"
    );
    assert!(s0["rtt_p50_le_us"].as_u64().is_some(), "no round trips timed: {s0}");
    let hsess = result(&hs, &["sessions"]);
    assert_eq!(by_name(&hsess, "device", "gpu0")["peer"], format!("127.0.0.1:{port}"));
    let stats = result(&gs, &["stats"]);
    assert_eq!(stats["sessions_up"], 2, "{stats}");
    assert!(stats["exports"]["gpu0"]["attaches"].as_u64() == Some(1), "{stats}");
    let hstats = result(&hs, &["stats"]);
    assert!(hstats["devices"]["gpu0"]["tlps_sent"]["CfgRd0"].as_u64().unwrap() > 0, "{hstats}");

    // gpu1 detached and attached again at run time; gpu0's session is the same throughout.
    assert_eq!(result(&hs, &["detach", "gpu1"]), json!({"detached": "gpu1"}));
    assert_eq!(by_name(&result(&hs, &["devices"]), "name", "gpu1")["state"], "detached");
    until("the box frees gpu1", Duration::from_secs(5), || {
        by_name(&result(&gs, &["devices"]), "name", "gpu1")["state"] == "free"
    });
    assert_eq!(result(&hs, &["attach", "gpu1"]), json!({"attached": "gpu1"}));
    let devs = result(&gs, &["devices"]);
    assert_eq!(by_name(&devs, "name", "gpu1")["state"], "attached");
    assert_eq!(by_name(&devs, "name", "gpu1")["counters"]["attaches"], 2);
    assert_eq!(by_name(&devs, "name", "gpu0")["counters"]["attaches"], 1, "gpu0 was disturbed");
    let s0_after = by_name(&result(&gs, &["sessions"]), "device", "gpu0").clone();
    assert_eq!(s0_after["session"], s0["session"], "gpu0's session changed");
    assert_eq!(s0_after["since_unix_seconds"], s0["since_unix_seconds"]);

    // The box takes a device away (unexport): the host sees it removed, gives it back and
    // goes on trying to attach it (down, saying why); export brings it back by itself.
    assert_eq!(result(&gs, &["unexport", "gpu1"]), json!({"unexported": "gpu1"}));
    until("the host sees gpu1 down", Duration::from_secs(5), || {
        let d = by_name(&result(&hs, &["devices"]), "name", "gpu1").clone();
        d["state"] == "down" && d["error"].as_str().is_some_and(|e| e.contains("removed"))
    });
    assert_eq!(result(&gs, &["devices"]).as_array().unwrap().len(), 1);
    assert_eq!(result(&gs, &["export", "gpu1"]), json!({"exported": "gpu1"}));
    until("the host attaches gpu1 again by itself", Duration::from_secs(15), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu1")["state"] == "attached"
    });
    assert_eq!(by_name(&result(&gs, &["devices"]), "name", "gpu1")["owner"], "host-a");
    assert_eq!(by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"], s0["session"]);

    // Each says what it answers (SPDK's rpc_get_methods).
    assert!(result(&gs, &["rpc_get_methods"]).as_array().unwrap().iter().any(|m| m == "unexport"));
    assert!(result(&hs, &["rpc_get_methods"]).as_array().unwrap().iter().any(|m| m == "attach"));
    // --json prints the result alone.
    assert_eq!(result(&gs, &["status"])["role"], "gpu");

    // Errors come back as JSON-RPC errors, with the code the spec gives.
    let code = |v: &Value| v["error"]["code"].as_i64();
    assert_eq!(code(&ctl(&gs, &["bogus"]).1), Some(-32601));
    assert_eq!(code(&ctl(&hs, &["detach"]).1), Some(-32602), "a missing argument");
    assert_eq!(code(&ctl(&hs, &["detach", "name=5"]).1), Some(-32602), "an argument of the wrong type");
    assert_eq!(code(&ctl(&gs, &["status", "x=1"]).1), Some(-32602), "an argument the method does not take");
    assert_eq!(code(&ctl(&hs, &["detach", "gpu7"]).1), Some(-32000), "a device not configured");
    assert_eq!(code(&ctl(&gs, &["export", "gpu0"]).1), Some(-32000), "a device already exported");
    assert_eq!(code(&raw(&gs, "{\"jsonrpc\":\"2.0\",\"id\":")), Some(-32700));
    assert_eq!(code(&raw(&gs, "{\"id\":3,\"method\":\"status\"}")), Some(-32600));
    let ok = raw(&gs, r#"{"jsonrpc":"2.0","id":"x","method":"status"}"#);
    assert_eq!(ok["id"], "x");
    assert_eq!(ok["result"]["role"], "gpu");

    // The readable tables.
    let out = dxpu().args(["ctl", "--socket"]).arg(&gs).arg("devices").output().unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(t.starts_with("DEVICE") && t.contains("gpu0") && t.contains("host-a"), "{t}");

    let (code, log) = host.stop();
    assert_eq!(code, 0, "a stop asked for is no failure, whatever the devices went through:\n{log}");
    assert!(log.contains("gpu1: removed"), "{log}");
    let host_log = log;
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    the_changes_are_logged_with_their_callers(&host_log, &log);
    assert!(!gs.exists() && !hs.exists(), "sockets left behind");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_client_that_never_reads_does_not_stall_the_box_and_metrics_match_its_counters() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("stall");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let mut gpu = Proc::start(&dir, "gpu", &gcfg);
    let gs = dir.join("gpu.sock");
    gpu.serving("the box's control socket", &gs);

    // A client floods requests and never reads its answers: its thread blocks on writing,
    // nothing else does.
    let mut hog = UnixStream::connect(&gs).unwrap();
    hog.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
    let line = format!("{}\n", json!({"jsonrpc": "2.0", "id": 1, "method": "devices"}));
    for _ in 0..20_000 {
        if hog.write_all(line.as_bytes()).is_err() {
            break;
        }
    }
    // A second client that connects and sends half a line, then nothing.
    let mut half = UnixStream::connect(&gs).unwrap();
    half.write_all(b"{\"jsonrpc\":\"2.0\",").unwrap();

    // A workload through the box meanwhile, scraped while it runs.
    let hcfg = dir.join("host.toml");
    std::fs::write(
        &hcfg,
        format!("[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY_B}\"\n"),
    )
    .unwrap();
    let started = Instant::now();
    let mut work =
        dxpu().args(["host", "--workload", "--config"]).arg(&hcfg).stderr(Stdio::piped()).spawn().unwrap();
    let mut during = None;
    while work.try_wait().unwrap().is_none() {
        let t = scrape(gm);
        if t.contains("dxpu_device_owner{device=\"gpu0\",host=\"host-b\"} 1") {
            during.get_or_insert(t);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = work.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("workload verified"), "{err}");
    eprintln!("workload with a stalled control client: {:.2} s", started.elapsed().as_secs_f64());
    let during = during.expect("no scrape saw the workload's session");
    promtool_check(&during);
    assert!(during.contains("dxpu_device_info{"), "{during}");
    // Who holds it and its state are values over a fixed set of series (not labels that
    // change under one info series), and the box and PCI address join with dcgm-exporter.
    assert_eq!(sample(&during, "dxpu_device_owner{device=\"gpu0\",host=\"host-b\"}"), Some(1.0), "{during}");
    assert_eq!(sample(&during, "dxpu_device_owner{device=\"gpu0\",host=\"host-a\"}"), Some(0.0), "{during}");
    assert_eq!(
        sample(&during, "dxpu_device_state{device=\"gpu0\",state=\"attached\"}"),
        Some(1.0),
        "{during}"
    );
    assert_eq!(sample(&during, "dxpu_device_state{device=\"gpu0\",state=\"free\"}"), Some(0.0), "{during}");
    assert!(during.contains("pci_bus_id=\"00000000:01:00.0\""), "{during}");
    assert!(!during.contains("owner=\""), "{during}");
    assert!(during.contains("dxpu_build_info{arch="), "{during}");
    assert!(during.contains("dxpu_link_rtt_seconds_bucket{"), "{during}");
    // The control socket still answers other clients.
    assert_eq!(result(&gs, &["status"])["role"], "gpu");

    // Counters match the box's own: a scrape, the counters, a scrape; each counter in the
    // middle lies between the two (they only grow). The host daemon keeps a session.
    let host_cfg = dir.join("host2.toml");
    std::fs::write(
        &host_cfg,
        format!("[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY_A}\"\n"),
    )
    .unwrap();
    let host = Proc::start(&dir, "host", &host_cfg);
    until("host-a's session", Duration::from_secs(10), || {
        result(&gs, &["sessions"]).as_array().is_some_and(|a| a.iter().any(|s| s["device"] == "gpu0"))
    });
    let before = scrape(gm);
    let sessions = result(&gs, &["sessions"]);
    let stats = result(&gs, &["stats"]);
    let after = scrape(gm);
    promtool_check(&after);
    let s = by_name(&sessions, "device", "gpu0");
    // The peer without its port: a host's port changes at every reconnect.
    let peer: std::net::SocketAddr = s["peer"].as_str().unwrap().parse().unwrap();
    let l = format!("host=\"host-a\",peer=\"{}\"", peer.ip());
    for (metric, key) in [
        (format!("dxpu_link_frames_total{{device=\"gpu0\",direction=\"sent\",{l}}}"), "frames_sent"),
        (format!("dxpu_link_frames_total{{device=\"gpu0\",direction=\"received\",{l}}}"), "frames_received"),
        (format!("dxpu_link_bytes_total{{device=\"gpu0\",direction=\"received\",{l}}}"), "bytes_received"),
        (format!("dxpu_link_tlps_total{{device=\"gpu0\",direction=\"received\",{l}}}"), "tlps_received"),
        (format!("dxpu_link_retransmits_total{{device=\"gpu0\",{l}}}"), "retransmits"),
    ] {
        let (a, b) = (sample(&before, &metric), sample(&after, &metric));
        let (a, b) = (a.unwrap_or_else(|| panic!("{metric} missing:\n{before}")), b.unwrap());
        let v = s[key].as_u64().unwrap() as f64;
        assert!(a <= v && v <= b, "{metric}: {a} <= {v} <= {b}");
    }
    let attaches = sample(&after, "dxpu_device_attaches_total{device=\"gpu0\"}").unwrap();
    assert_eq!(attaches, stats["exports"]["gpu0"]["attaches"].as_u64().unwrap() as f64);
    assert_eq!(attaches, 2.0);
    drop(hog);
    drop(half);
    assert_eq!(host.stop().0, 0);
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_host_metrics_pass_promtool_and_count_the_mmio_round_trips() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("hmetrics");
    let BoxAndHost { gpu, host, hs, hm, gm, .. } = box_and_host(&dir, &["gpu0"], &["gpu0"], "");
    // The control socket comes before the first attach ends: the device's series once it has.
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let t = scrape(hm);
    promtool_check(&t);
    let stats = result(&hs, &["stats"]);
    let cfg_reads = stats["devices"]["gpu0"]["tlps_sent"]["CfgRd0"].as_u64().unwrap() as f64;
    assert_eq!(
        sample(&t, "dxpu_tlps_total{device=\"gpu0\",direction=\"sent\",kind=\"CfgRd0\"}"),
        Some(cfg_reads)
    );
    assert!(t.contains("dxpu_mmio_read_seconds_count{device=\"gpu0\"}"), "{t}");
    assert!(t.contains("dxpu_surprise_removals_total{device=\"gpu0\"} 0"), "{t}");
    assert!(t.contains("dxpu_dma_outside_windows_total{device=\"gpu0\",op=\"read\"}"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("dxpu_device_info{") && l.contains("device=\"gpu0\"")), "{t}");
    // The process's own series, as every Prometheus client names them, on both daemons; and
    // the box's live sessions (the host's one).
    let b = scrape(gm);
    promtool_check(&b);
    for text in [&t, &b] {
        // (CPU in whole seconds, as the collector counts it: 0 this early.)
        assert!(sample(text, "process_cpu_seconds_total").is_some(), "{text}");
        for series in ["process_resident_memory_bytes", "process_open_fds", "process_threads"] {
            assert!(sample(text, series).is_some_and(|v| v > 0.0), "{series}:\n{text}");
        }
        assert!(sample(text, "process_start_time_seconds").is_some_and(|v| v > 1.6e9), "{text}");
    }
    assert_eq!(sample(&b, "dxpu_sessions"), Some(1.0), "{b}");
    // Liveness through the endpoint's loop, on both.
    for port in [hm, gm] {
        let text = http_get(port, "/healthz");
        assert!(text.starts_with("HTTP/1.1 200") && text.ends_with("ok\n"), "{text}");
    }
    // Anything else is refused.
    let text = http_get(hm, "/");
    assert!(text.starts_with("HTTP/1.1 404") && text.contains("/healthz"), "{text}");
    assert_eq!(host.stop().0, 0);
    assert_eq!(gpu.stop().0, 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sighup_applies_a_valid_change_refuses_an_invalid_one_and_leaves_an_unchanged_file_alone() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("hup");
    let BoxAndHost { gpu, host, gs, hs, gcfg, hcfg, port, gm, hm } =
        box_and_host(&dir, &["gpu0", "gpu1"], &["gpu0"], "");
    let session = |gs: &Path| by_name(&result(gs, &["sessions"]), "device", "gpu0")["session"].clone();
    let s0 = session(&gs);

    // No change: nothing happens, nothing is disturbed.
    gpu.signal(rustix::process::Signal::HUP);
    until("the box logs the reload", Duration::from_secs(5), || gpu.log().contains("reloaded"));
    assert!(gpu.log().contains(r#""unchanged":["gpu0","gpu1"]"#), "{}", gpu.log());
    assert_eq!(session(&gs), s0);
    // --check --against-running: the file compared with what runs, before any reload.
    let against = |role: &str, cfg: &Path| {
        let o = dxpu().args([role, "--check", "--against-running", "--config"]).arg(cfg).output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        (o.status.success(), said)
    };
    let (ok, said) = against("gpu", &gcfg);
    assert!(ok && said.contains("a reload would change nothing"), "{said}");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0", "gpu2"])).unwrap();
    let (ok, said) = against("gpu", &gcfg);
    assert!(ok && said.contains("devices added: gpu2") && said.contains("devices removed: gpu1"), "{said}");
    let other_port = if port == u16::MAX { port - 1 } else { port + 1 };
    std::fs::write(&gcfg, gpu_toml(&dir, other_port, gm, &["gpu0", "gpu2"])).unwrap();
    let (ok, said) = against("gpu", &gcfg);
    assert!(!ok && said.contains("listen") && said.contains("needs a restart"), "{said}");

    // A valid change: gpu1 goes, gpu2 comes; gpu0 (held by the host) is untouched.
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0", "gpu2"])).unwrap();
    gpu.signal(rustix::process::Signal::HUP);
    until("gpu2 exported", Duration::from_secs(5), || {
        result(&gs, &["devices"]).as_array().unwrap().iter().any(|d| d["name"] == "gpu2")
    });
    let names: Vec<Value> =
        result(&gs, &["devices"]).as_array().unwrap().iter().map(|d| d["name"].clone()).collect();
    assert_eq!(names, vec![json!("gpu0"), json!("gpu2")]);
    assert_eq!(session(&gs), s0, "gpu0's owner was disturbed by the reload");

    // An invalid change: refused with the message a start gives, the old one keeps running.
    let bad = gpu_toml(&dir, port, gm, &["gpu0", "gpu2"])
        .replace("allow = [\"host-a\", \"host-b\"]\n", "allow = [\"host-z\"]\n");
    std::fs::write(&gcfg, &bad).unwrap();
    let start = dxpu().args(["gpu", "--config"]).arg(&gcfg).output().unwrap();
    let at_start = String::from_utf8_lossy(&start.stderr);
    let why = at_start.trim().strip_prefix("dxpu gpu: ").unwrap_or(&at_start).to_string();
    assert!(why.contains("allow[0]") && why.contains("host-z"), "{why}");
    gpu.signal(rustix::process::Signal::HUP);
    until("the box refuses the reload", Duration::from_secs(5), || gpu.log().contains("reload refused"));
    assert!(
        gpu.log().contains(why.trim()),
        "the reload's refusal differs from the start's ({why}):\n{}",
        gpu.log()
    );
    assert_eq!(result(&gs, &["devices"]).as_array().unwrap().len(), 2);
    assert_eq!(session(&gs), s0);
    // The same through ctl reload: a JSON-RPC error saying why. (What needs a restart, and
    // the control method's answers, are the in-process tests' (ops/tests/gpu_runtime.rs).)
    let (ok, v) = ctl(&gs, &["reload"]);
    assert!(!ok && v["error"]["message"].as_str().unwrap().contains("host-z"), "{v}");

    // The host's SIGHUP: a device added is attached; gpu0 stays. (Removals and refusals:
    // ops/tests/host_runtime.rs, in process.)
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0", "gpu2"])).unwrap();
    assert_eq!(result(&gs, &["reload"])["unchanged"], json!(["gpu0", "gpu2"]));
    std::fs::write(&hcfg, host_toml(&dir, port, hm, &["gpu0", "gpu2"])).unwrap();
    let (ok, said) = against("host", &hcfg);
    assert!(ok && said.contains("attaches added: gpu2@"), "{said}");
    host.signal(rustix::process::Signal::HUP);
    until("the host attaches gpu2", Duration::from_secs(10), || {
        result(&hs, &["devices"])
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == "gpu2" && d["state"] == "attached")
    });
    assert_eq!(by_name(&result(&gs, &["devices"]), "name", "gpu2")["owner"], "host-a");
    assert_eq!(session(&gs), s0, "gpu0's session survived every reload");

    let (code, log) = host.stop();
    assert_eq!(code, 0, "{log}");
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "SIGHUP must not end the box:\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn json_logs_are_one_object_a_line_with_session_host_and_device_as_fields() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("jsonlog");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let log = dir.join("gpu.log");
    let mut gpu = dxpu()
        .args(["gpu", "--log-format", "json", "--config"])
        .arg(&gcfg)
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .unwrap();
    until("the box's control socket", Duration::from_secs(10), || dir.join("gpu.sock").exists());
    let hcfg = dir.join("host.toml");
    std::fs::write(
        &hcfg,
        format!("[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY_A}\"\n"),
    )
    .unwrap();
    let out =
        dxpu().args(["host", "--workload", "--log-format", "json", "--config"]).arg(&hcfg).output().unwrap();
    assert!(out.status.success());
    rustix::process::kill_process(rustix::process::Pid::from_child(&gpu), rustix::process::Signal::TERM)
        .unwrap();
    assert!(gpu.wait().unwrap().success());
    let parse = |text: &str| -> Vec<Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    };
    let box_lines = parse(&std::fs::read_to_string(&log).unwrap());
    for l in &box_lines {
        conventional("log", l);
    }
    let attached = box_lines.iter().find(|v| v["msg"].as_str().unwrap().contains("attached by")).unwrap();
    assert_eq!((attached["device"].as_str(), attached["host"].as_str()), (Some("gpu0"), Some("host-a")));
    assert!(attached["session"].as_str().unwrap().starts_with("0x"), "{attached}");
    assert!(box_lines.iter().all(|v| v["ts"].is_string() && v["level"].is_string()));
    let host_lines = parse(&String::from_utf8_lossy(&out.stderr));
    let a = host_lines.iter().find(|v| v["msg"].as_str().unwrap().starts_with("attached gpu0")).unwrap();
    assert_eq!(a["peer"], format!("127.0.0.1:{port}"));
    let _ = std::fs::remove_dir_all(dir);
}

/// The vfio-user socket's mode and group come from the file: a user in that group can
/// connect (as libvirt's QEMU does), a user outside it cannot; with neither key it stays
/// 0600. Needs root (to make the two users and give the socket a group); skips otherwise.
#[test]
fn a_vfio_user_socket_is_open_to_its_group_and_no_one_else() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: making users and groups needs root");
        return;
    }
    let sh = |cmd: &[&str]| Command::new(cmd[0]).args(&cmd[1..]).output().map(|o| o.status.code());
    // Exit 9: it exists already (a run before this one).
    for c in [
        &["groupadd", "-f", "dxpu-vm"][..],
        &["useradd", "-M", "-N", "-g", "dxpu-vm", "-s", "/usr/sbin/nologin", "dxpu-vm-in"],
        &["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", "dxpu-vm-out"],
    ] {
        match sh(c) {
            Ok(Some(0 | 9)) => {}
            other => {
                eprintln!("skipped: {c:?}: {other:?}");
                return;
            }
        }
    }
    let id = |u: &str| {
        let out = Command::new("id").args(["-u", u]).output().unwrap();
        let uid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
        let out = Command::new("id").args(["-g", u]).output().unwrap();
        (uid, String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().unwrap())
    };
    let (inside, outside) = (id("dxpu-vm-in"), id("dxpu-vm-out"));
    let dir = tempdir("sock-group");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The binary where both users can run it (the tree may sit under a private home).
    let exe = dir.join("dxpu");
    std::fs::copy(env!("CARGO_BIN_EXE_dxpu"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (port, gm, hm) = (free_udp_port(), free_tcp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0", "gpu1"])).unwrap();
    let sock = dir.join("gpu0-vm.sock");
    let private = dir.join("gpu1-vm.sock");
    let mut h = format!("[metrics]\nlisten = \"127.0.0.1:{hm}\"\n");
    h.push_str(&format!(
        "[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY_A}\"\n\
         vfio_user_socket = {:?}\nvfio_user_socket_mode = 0o660\nvfio_user_socket_group = \"dxpu-vm\"\n\
         [[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu1\"\nkey = \"{KEY_A}\"\nvfio_user_socket = {:?}\n",
        sock.display().to_string(),
        private.display().to_string()
    ));
    let hcfg = dir.join("host.toml");
    std::fs::write(&hcfg, h).unwrap();
    let gpu = Proc::start(&dir, "gpu", &gcfg);
    until("the box", Duration::from_secs(10), || gpu.log().contains("listening on"));
    let host = Proc::start(&dir, "host", &hcfg);
    until("both sockets", Duration::from_secs(10), || sock.exists() && private.exists());
    let m = std::fs::metadata(&sock).unwrap();
    assert_eq!((m.mode() & 0o777, m.gid()), (0o660, inside.1), "{:o}", m.mode());
    assert_eq!(std::fs::metadata(&private).unwrap().mode() & 0o777, 0o600);
    // Connecting as each user: `dxpu ctl` is a UNIX-socket client; the server speaks
    // vfio-user, so a connection that gets in ends in some other error, never EACCES.
    let connect = |who: (u32, u32), path: &Path| {
        let out = Command::new(&exe)
            .args(["ctl", "--timeout", "2", "--socket"])
            .arg(path)
            .arg("status")
            .uid(who.0)
            .gid(who.1)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = connect(inside, &sock);
    assert!(!e.contains("Permission denied"), "a member of the socket's group was refused: {e}");
    let e = connect(outside, &sock);
    assert!(e.contains("Permission denied"), "a user outside the group got in: {e}");
    let e = connect(inside, &private);
    assert!(e.contains("Permission denied"), "the 0600 socket let a group member in: {e}");
    drop(host);
    drop(gpu);
    let _ = std::fs::remove_dir_all(dir);
}

/// Under systemd: with `WATCHDOG_USEC` the loop pings `WATCHDOG=1` every half of it, and
/// with `JOURNAL_STREAM` naming standard error each log line starts with its priority
/// (`<6>` info, `<3>` error) for `journalctl -p`.
#[test]
fn systemd_hears_watchdog_pings_and_the_journal_gets_priorities() {
    use std::os::unix::fs::MetadataExt;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("systemd");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let sock = dir.join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    notify.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let log = dir.join("journal.log");
    let f = std::fs::File::create(&log).unwrap();
    let m = f.metadata().unwrap();
    let mut gpu = dxpu()
        .args(["gpu", "--config"])
        .arg(&gcfg)
        .env("NOTIFY_SOCKET", &sock)
        .env("WATCHDOG_USEC", "200000")
        .env("JOURNAL_STREAM", format!("{}:{}", m.dev(), m.ino()))
        .stderr(Stdio::from(f))
        .spawn()
        .unwrap();
    let (mut pings, end) = (0, Instant::now() + Duration::from_secs(5));
    while pings < 3 && Instant::now() < end {
        let mut b = [0u8; 256];
        if let Ok(n) = notify.recv(&mut b) {
            pings += usize::from(&b[..n] == b"WATCHDOG=1");
        }
    }
    assert!(pings >= 3, "{pings} watchdog pings");
    rustix::process::kill_process(rustix::process::Pid::from_child(&gpu), rustix::process::Signal::TERM)
        .unwrap();
    assert!(gpu.wait().unwrap().success());
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.lines().any(|l| l.starts_with("<6>listening on")), "{text}");
    assert!(text.lines().all(|l| l.starts_with('<')), "a line without its priority: {text}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Every control call that changed something is in the log with its caller (SO_PEERCRED) and
/// what came of it, a refused one too; a call that changes nothing is not.
fn the_changes_are_logged_with_their_callers(host_log: &str, box_log: &str) {
    let by = format!("by uid {}", rustix::process::getuid().as_raw());
    let detached = |l: &str| {
        l.contains(r#"control: detach {"name":"gpu1"}"#)
            && l.contains(&by)
            && l.contains("dxpu ctl")
            && l.ends_with("done")
    };
    assert!(host_log.lines().any(detached), "{host_log}");
    assert!(host_log.lines().any(|l| l.contains("control: detach") && l.contains("refused")), "{host_log}");
    let unexported = |l: &str| l.contains(r#"control: unexport {"name":"gpu1"}"#) && l.contains(&by);
    assert!(box_log.lines().any(unexported), "{box_log}");
    assert!(!box_log.contains("control: devices"), "a call that changes nothing is logged: {box_log}");
}

/// `dxpu host --workload` takes its devices' first attempts: one that fails is said, and not
/// promised another attempt it will not get.
#[test]
fn a_workload_host_whose_box_is_not_there_says_so_and_promises_no_retry() {
    let dir = tempdir("workload-no-box");
    let hcfg = dir.join("host.toml");
    let port = free_udp_port();
    std::fs::write(
        &hcfg,
        format!("[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY_A}\"\n"),
    )
    .unwrap();
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&hcfg).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("nothing listens on") && said.contains("not tried again"), "{said}");
    assert!(!said.contains("trying again"), "{said}");
    let _ = std::fs::remove_dir_all(dir);
}
