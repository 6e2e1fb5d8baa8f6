//! The endpoints as processes: `dxpu gpu` and `dxpu host` from configuration files, stopped
//! by SIGTERM; bad configuration refused naming the key; `dxpu loopback --json`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;
use common::conventional;

const KEY_A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const KEY_B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// Endpoint processes spin and share two cores: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("dxpu-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn gpu_toml(port: u16) -> String {
    format!(
        r#"listen = "127.0.0.1:{port}"
[link]
idle_timeout_ms = 500
[[host]]
name = "host-a"
key = "{KEY_A}"
[[host]]
name = "host-b"
key = "{KEY_B}"
[[device]]
name = "gpu0"
sim = {{ vram_mib = 256 }}
allow = ["host-a"]
"#
    )
}

fn host_toml(port: u16, key: &str) -> String {
    format!(
        r#"[[attach]]
server = "127.0.0.1:{port}"
device = "gpu0"
key = "{key}"
"#
    )
}

fn sigterm(child: &Child) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), rustix::process::Signal::TERM)
        .unwrap();
}

fn wait_exit(child: &mut Child, limit: Duration) -> (i32, String) {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (st.code().unwrap_or(-1), err);
        }
        if Instant::now() > end {
            child.kill().unwrap();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start_gpu(dir: &std::path::Path, port: u16) -> Child {
    let cfg = write(dir, "gpu.toml", &gpu_toml(port));
    let mut child = dxpu().args(["gpu", "--config"]).arg(&cfg).stderr(Stdio::piped()).spawn().unwrap();
    until_listening(&mut child, port);
    child
}

/// Waits until `dxpu gpu` has bound its UDP `port` — after it set up its handling of SIGTERM
/// (`ops::gpu::run`), so a signal from here on is a clean stop — or has exited, for 10 s at
/// most. (A fixed 300 ms was too short on a busy machine: SIGTERM's default action killed
/// the daemon before it could handle it, exit status -1.) The port is looked up in the
/// kernel's socket tables: binding it to see would take it from the daemon.
fn until_listening(child: &mut Child, port: u16) {
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && child.try_wait().unwrap().is_none() && !udp_port_bound(port) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `child` catches SIGTERM (its bit in `SigCgt` of `/proc/PID/status`) or has
/// exited, for 10 s at most: a signal sent before would kill it by the default action.
fn until_handling_sigterm(child: &mut Child) {
    let status = format!("/proc/{}/status", child.id());
    let end = Instant::now() + Duration::from_secs(10);
    while Instant::now() < end && child.try_wait().unwrap().is_none() {
        let caught = std::fs::read_to_string(&status).ok().and_then(|t| {
            let mask = t.lines().find_map(|l| l.strip_prefix("SigCgt:"))?.trim().to_string();
            u64::from_str_radix(&mask, 16).ok()
        });
        if caught.is_some_and(|m| m & (1 << (15 - 1)) != 0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a UDP socket of this machine is bound to local `port` (`/proc/net/udp`, `udp6`:
/// the local address's port, in hex, after the colon).
fn udp_port_bound(port: u16) -> bool {
    ["/proc/net/udp", "/proc/net/udp6"].iter().any(|table| {
        std::fs::read_to_string(table).unwrap_or_default().lines().skip(1).any(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|local| local.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
                == Some(port)
        })
    })
}

#[test]
fn host_runs_the_workload_on_a_box_and_both_stop_on_sigterm() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("run");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let host_cfg = write(&dir, "host.toml", &host_toml(port, KEY_A));
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&host_cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dxpu host --workload failed:\n{err}");
    assert!(err.contains("workload verified"), "{err}");

    // A host daemon holding the device stops cleanly on SIGTERM too.
    let mut host = dxpu().args(["host", "--config"]).arg(&host_cfg).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    until_handling_sigterm(&mut host);
    sigterm(&host);
    let (code, err) = wait_exit(&mut host, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("vendor 0x1234 device 0xd9a0"), "{err}");
    assert!(err.contains("detached"), "{err}");

    sigterm(&gpu);
    let (code, err) = wait_exit(&mut gpu, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("gpu0 attached by host-a"), "{err}");
    assert!(err.contains("stopped"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_host_not_allowed_is_refused_with_a_reason() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("refuse");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let host_cfg = write(&dir, "host.toml", &host_toml(port, KEY_B));
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&host_cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(err.contains("host 'host-b' may not attach 'gpu0'"), "{err}");
    sigterm(&gpu);
    wait_exit(&mut gpu, Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_configuration_is_refused_naming_the_key() {
    let dir = tempdir("bad");
    let cases = [
        ("gpu", gpu_toml(1).replace("vram_mib = 256", "vram_mib = 3"), "device[0].sim.vram_mib"),
        ("gpu", gpu_toml(1).replace("[link]", "[link]\nwindoww = 3"), "windoww"),
        ("gpu", gpu_toml(1).replace(KEY_A, "abcd"), "host[0].key"),
        ("host", host_toml(1, KEY_A).replace("127.0.0.1:1", "nowhere"), "attach[0].server"),
        ("host", host_toml(1, "xyz"), "attach[0].key"),
    ];
    for (cmd, text, key) in cases {
        let cfg = write(&dir, "bad.toml", &text);
        // The same refusal from --check, which starts nothing (the units' ExecReload).
        for check in [false, true] {
            let mut c = dxpu();
            c.args([cmd, "--config"]).arg(&cfg);
            if check {
                c.arg("--check");
            }
            let out = c.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(1),
                "{cmd} (check {check}) accepted a bad file ({key}): {err}"
            );
            assert!(err.contains(key), "{cmd}: error does not name {key}: {err}");
        }
    }
    // A good file: --check says so and exits 0 at once, binding nothing.
    for (cmd, text) in [("gpu", gpu_toml(1)), ("host", host_toml(1, KEY_A))] {
        let cfg = write(&dir, "good.toml", &text);
        let out = dxpu().args([cmd, "--check", "--config"]).arg(&cfg).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd} --check: {}", String::from_utf8_lossy(&out.stderr));
        assert!(said.contains(": OK ("), "{said}");
    }
    // A VFIO device that cannot be opened stops the endpoint at start, saying which and why.
    let vfio = gpu_toml(free_port()).replace("sim = { vram_mib = 256 }", "vfio = \"0000:41:00.0\"");
    let cfg = write(&dir, "vfio.toml", &vfio);
    let out = dxpu().args(["gpu", "--config"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("device gpu0") && (err.contains("/dev/vfio") || err.contains("0000:41:00.0")),
        "{err}"
    );
    // --check opens what the start will: the same device refused, with the next step.
    if !std::path::Path::new("/dev/vfio/vfio").exists() {
        let out = dxpu().args(["gpu", "--check", "--config"]).arg(&cfg).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(1),
            "--check passed a VFIO device this machine cannot open: {err}"
        );
        assert!(err.contains("device gpu0: 0000:41:00.0") && err.contains("modprobe vfio-pci"), "{err}");
    }
    let out = dxpu().args(["gpu", "--config", "/nonexistent/gpu.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/gpu.toml"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn loopback_json_report_has_its_keys() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let out = dxpu()
        .args([
            "loopback",
            "--json",
            "--workload",
            "demo",
            "--scale",
            "1",
            "--poll",
            "blocking",
            "--rtt-samples",
            "200",
            "--repeat",
            "3",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("loopback", &v);
    assert_eq!(v["verified"], true);
    // Progress on standard error, as docs/cli.md says, with the object alone on standard output.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("demo: 3 runs each way") && said.contains("demo: verified"), "{said}");
    assert!(v["tlps"]["MRd64"].as_u64().unwrap() > 0);
    assert!(v["tlps"]["CplD"].as_u64().unwrap() > 0);
    let p50 = v["mmio_read_rtt_p50_us"].as_f64().unwrap();
    let p99 = v["mmio_read_rtt_p99_us"].as_f64().unwrap();
    assert!(p50 > 0.0 && p99 >= p50);
    for k in [
        "dma_h2d_bytes_per_s",
        "dma_d2h_bytes_per_s",
        "direct_seconds",
        "bridged_seconds",
        "overhead_percent",
    ] {
        assert!(v[k].is_number(), "{k} missing: {v}");
    }
    assert!(v["dma_h2d_bytes_per_s"].as_f64().unwrap() > 0.0);
    // Three runs each way: the medians inside their spreads.
    assert_eq!((v["repeat"].as_u64(), v["workload"].as_str()), (Some(3), Some("demo")));
    // Each pair's steal, read where the threads were placed.
    let steal = v["steal_ms"].as_array().unwrap();
    assert_eq!(steal.len(), 3, "{v}");
    assert!(steal.iter().all(|s| s.is_null() || s.as_array().is_some_and(|a| a.len() == 2)), "{v}");
    assert!(
        v["pairs_stolen_from"].is_null() || v["pairs_stolen_from"].as_u64().is_some_and(|n| n <= 3),
        "{v}"
    );
    // And the threads' run-queue waits, where the kernel keeps sched_info.
    if std::path::Path::new("/proc/self/schedstat").exists() {
        let waited = v["waited_ms"].as_array().unwrap();
        assert!(
            waited.len() == 3 && waited.iter().all(|w| w.as_array().is_some_and(|a| a.len() == 2)),
            "{v}"
        );
        assert!(v["pairs_contended"].as_u64().is_some_and(|n| n <= 3), "{v}");
    }
    for k in ["overhead_percent", "bridged_seconds", "direct_seconds"] {
        let lo = v[format!("{k}_min")].as_f64().unwrap();
        let hi = v[format!("{k}_max")].as_f64().unwrap();
        let mid = v[k].as_f64().unwrap();
        assert!(lo <= mid && mid <= hi, "{k}: {lo} {mid} {hi}");
    }
    let step = &v["steps"][0];
    assert!(step["bridged_seconds_min"].as_f64() <= step["bridged_seconds"].as_f64(), "{step}");
    assert!(step["direct_seconds"].as_f64().unwrap() > 0.0, "{step}");
    // Impossible options are refused.
    // The profile the direct runs counted, and what the model made of it.
    let profile = &v["profile"];
    for k in ["register_reads", "dependent_reads", "waits_idle", "device_read_bytes", "device_write_bytes"] {
        assert!(profile[k].is_u64(), "profile.{k} missing: {profile}");
    }
    assert!(profile["device_read_bytes"].as_u64().unwrap() >= 1 << 20, "{profile}");
    assert!(profile["round_trips"].as_u64().unwrap() > 0, "{profile}");
    let model = &v["model"];
    assert!(model["predicted_bridged_seconds"].as_f64().unwrap() >= v["direct_seconds"].as_f64().unwrap());
    assert!(model["rtt_us"].as_f64().unwrap() > 0.0, "{model}");
    assert_eq!(v["bridged_runs_seconds"].as_array().map(Vec::len), Some(3));
    for bad in [
        ["--repeat", "0"],
        ["--repeat", "1001"],
        ["--workload", "mining"],
        ["--batch", "0"],
        ["--layers", "33"],
    ] {
        let out = dxpu().arg("loopback").args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(bad[0]), "{bad:?}");
    }
    let out = dxpu().args(["loopback", "--scale", "99"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--scale"));
}

#[test]
fn loopback_runs_every_workload_unless_told_one() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let out = dxpu()
        .args(["loopback", "--json", "--scale", "1", "--repeat", "1", "--rtt-samples", "50"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("loopback", &v);
    assert_eq!(v["verified"], true);
    let names: Vec<_> = v["workloads"].as_array().unwrap().iter().map(|w| w["workload"].clone()).collect();
    assert_eq!(names, ["demo", "inference", "training", "data-loading"]);
    for w in v["workloads"].as_array().unwrap() {
        assert_eq!(w["verified"], true, "{w}");
        assert!(w["profile"]["waits"].as_u64().unwrap() > 0, "{w}");
        assert!(w["model"]["predicted_overhead_percent"].is_number(), "{w}");
    }
    // The baseline on a thread of its own.
    let out = dxpu()
        .args(["loopback", "--json", "--scale", "1", "--repeat", "2", "--rtt-samples", "50"])
        .args(["--workload", "demo", "--baseline", "concurrent"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("loopback", &v);
    assert_eq!((v["verified"].as_bool(), v["baseline"].as_str()), (Some(true), Some("concurrent")));
    assert_eq!(v["direct_runs_seconds"].as_array().map(Vec::len), Some(2));
    // The human report ends with every workload's overhead beside the model's.
    let out = dxpu()
        .args(["loopback", "--scale", "1", "--repeat", "1", "--rtt-samples", "50", "--poll", "blocking"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let summary = &text[text.find("summary:").expect("a summary")..];
    for name in ["demo", "inference", "training", "data-loading"] {
        assert!(summary.contains(name), "{summary}");
    }
    // Not a terminal: a line as each workload starts and ends, not one per step (on
    // 9b5fbd6 the default run printed 820 lines before its report); -v prints every step.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.lines().count() <= 12, "{err}");
    assert_eq!(err.matches(": verified, overhead").count(), 4, "{err}");
    let out = dxpu()
        .args([
            "loopback",
            "-v",
            "--workload",
            "demo",
            "--scale",
            "1",
            "--repeat",
            "1",
            "--rtt-samples",
            "50",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bridged (warm-up): ") && err.lines().count() > 20, "{err}");
}

/// The CPUs the process's threads named `name` may run on, as /proc lists them ("0", "0-1").
fn threads_cpus(pid: u32, name: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|v| v.trim().to_string())
        })
        .collect()
}

#[test]
fn loopback_pins_its_spinning_threads_where_told() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = |pin: &str| {
        let out = dxpu()
            .args(["loopback", "--json", "--scale", "1", "--repeat", "1", "--rtt-samples", "50"])
            .args(["--workload", "demo", "--pin", pin])
            .output()
            .unwrap();
        assert!(out.status.success(), "--pin {pin}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        conventional("loopback", &v);
        conventional("loopback", &v);
        assert_eq!(v["verified"], true, "{v}");
        v["cpus"].clone()
    };
    assert!(run("off").is_null());
    // Refused before anything runs: the same CPU twice, a CPU not there, not CPUs at all.
    for bad in ["0,0", "x", "1", "1,2,3"] {
        let out = dxpu().args(["loopback", "--pin", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--pin {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--pin"), "--pin {bad}");
    }
    let out = dxpu().args(["loopback", "--workload", "demo", "--pin", "0,1023"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("CPU 1023 is not one"), "{out:?}");
    if cpus < 2 {
        eprintln!("skipping the pinned runs: this process may use {cpus} CPU");
        return;
    }
    assert_eq!(run("auto"), serde_json::json!({"device": 0, "host": 1}));
    assert_eq!(run("1,0"), serde_json::json!({"device": 1, "host": 0}));
    // While it runs: the GPU-box endpoint's thread and the workload's each on one of the two
    // CPUs, never both; the host endpoint's service thread on the host's.
    let mut child = dxpu()
        .args(["loopback", "--workload", "inference", "--scale", "1", "--repeat", "3", "--rtt-samples", "50"])
        .args(["--pin", "1,0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut seen_box, mut seen_service, mut seen_main) = (Vec::new(), Vec::new(), Vec::new());
    while child.try_wait().unwrap().is_none() {
        seen_box.extend(threads_cpus(child.id(), "dxpu-gpu"));
        seen_service.extend(threads_cpus(child.id(), "dxpu-host-gpu0"));
        seen_main.extend(threads_cpus(child.id(), "dxpu"));
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.wait().unwrap().success());
    assert!(!seen_box.is_empty() && seen_box.iter().all(|c| c == "0" || c == "1"), "{seen_box:?}");
    assert!(seen_box.iter().any(|c| c == "1"), "the box's thread never on the device's CPU: {seen_box:?}");
    // Moved off the device's CPU for the direct runs, while the workload computes there.
    assert!(seen_box.iter().any(|c| c == "0"), "the box's thread never moved aside: {seen_box:?}");
    assert!(seen_main.iter().any(|c| c == "1"), "the direct device never on CPU 1: {seen_main:?}");
    // One CPU at a time, or all it had again once the runs are over (the report's own work).
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let all = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap().trim();
    assert!(seen_main.iter().all(|c| c == "0" || c == "1" || c == all), "{seen_main:?} {all}");
    assert!(!seen_service.is_empty() && seen_service.iter().all(|c| c == "0"), "{seen_service:?}");
}

#[test]
fn host_serves_a_device_over_vfio_user_and_stops_on_sigterm() {
    use bridge_host::vfio_user::proto::{self, Header, cmd, flags, region};
    use std::io::Write;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("vfio-user");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let sock = dir.join("gpu0.sock");
    let text = format!("{}vfio_user_socket = \"{}\"\n", host_toml(port, KEY_A), sock.display());
    let host_cfg = write(&dir, "host.toml", &text);
    let mut host = dxpu().args(["host", "--config"]).arg(&host_cfg).stderr(Stdio::piped()).spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !sock.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = std::os::unix::net::UnixStream::connect(&sock).expect("the vfio-user socket accepts");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut call = |id: u16, command: u16, payload: &[u8]| {
        s.write_all(&proto::message(id, command, flags::COMMAND, 0, payload)).unwrap();
        let mut h = [0u8; 16];
        s.read_exact(&mut h).unwrap();
        let h = Header::parse(&h);
        let mut p = vec![0u8; h.size as usize - 16];
        s.read_exact(&mut p).unwrap();
        assert_eq!((h.id, h.flags & flags::ERROR), (id, 0), "{} failed", cmd::name(command));
        p
    };
    call(1, cmd::VERSION, &[0, 0, 1, 0]);
    let mut p = 0u64.to_le_bytes().to_vec();
    p.extend_from_slice(&region::CONFIG.to_le_bytes());
    p.extend_from_slice(&4u32.to_le_bytes());
    let r = call(2, cmd::REGION_READ, &p);
    assert_eq!(&r[16..], &[0x34, 0x12, 0xa0, 0xd9], "the simgpu's IDs through the bridge");
    drop(s);
    sigterm(&host);
    let (code, err) = wait_exit(&mut host, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("served over vfio-user"), "{err}");
    assert!(err.contains("detached"), "{err}");
    sigterm(&gpu);
    let (code, err) = wait_exit(&mut gpu, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// SIGTERM while `dxpu host` waits for a handshake no box answers (a UDP socket that reads
/// and never replies): it stops within a poll, not after the attach timeout.
#[test]
fn a_signal_during_the_handshake_stops_the_host_at_once() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("sig-handshake");
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let host_cfg = write(&dir, "host.toml", &host_toml(port, KEY_A));
    let mut host = dxpu().args(["host", "--config"]).arg(&host_cfg).stderr(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    until_handling_sigterm(&mut host);
    let t = Instant::now();
    sigterm(&host);
    let (code, err) = wait_exit(&mut host, Duration::from_secs(10));
    assert!(t.elapsed() < Duration::from_millis(1000), "stopped after {:?}: {err}", t.elapsed());
    // A stop asked for is no failure: the attach in progress ends, saying so.
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("stopped by a signal while attaching"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Runs `dxpu host --workload` with `host_cfg`, calls `interrupt` as the workload's MATMUL step
/// starts (the longest, in a debug build), and reads the host's log to its end: when the
/// interruption came, how the host exited, and all it logged.
fn workload_interrupted_at_matmul(
    host_cfg: &std::path::Path,
    interrupt: impl FnOnce(&Child),
) -> (Instant, std::process::ExitStatus, String) {
    use std::io::BufRead;
    let mut host =
        dxpu().args(["host", "--workload", "--config"]).arg(host_cfg).stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = std::io::BufReader::new(host.stderr.take().unwrap()).lines();
    let mut log = String::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("MATMUL") {
            break;
        }
    }
    interrupt(&host);
    let t = Instant::now();
    for line in lines {
        log.push_str(&line.unwrap());
        log.push('\n');
    }
    (t, host.wait().unwrap(), log)
}

/// SIGTERM during `dxpu host --workload`: the workload ends at its next wait, the device is
/// detached, and the exit status says the work was not done.
#[test]
fn a_signal_during_the_workload_stops_it_and_detaches() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("sig-workload");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let host_cfg = write(&dir, "host.toml", &host_toml(port, KEY_A));
    // Signalled as the longest step starts (a matrix product: long in a debug build).
    let (t, status, log) = workload_interrupted_at_matmul(&host_cfg, sigterm);
    assert!(t.elapsed() < Duration::from_millis(1500), "stopped after {:?}: {log}", t.elapsed());
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("workload stopped by a signal"), "{log}");
    assert!(log.contains("detached"), "{log}");
    sigterm(&gpu);
    let (code, err) = wait_exit(&mut gpu, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A host whose key the box does not hold: told at once (the box refuses the handshake
/// after the cookie; it waited for its 5 s handshake timeout), and the box's log says who
/// and why (it said nothing, even at debug).
#[test]
fn a_wrong_key_is_told_to_the_host_at_once_and_logged_by_the_box() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("wrong-key");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let stranger = "0123456789abcdef".repeat(4);
    let host_cfg = write(&dir, "host.toml", &host_toml(port, &stranger));
    let t = Instant::now();
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&host_cfg).output().unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    assert!(took < Duration::from_millis(1500), "told after {took:?}: {err}");
    sigterm(&gpu);
    let (code, log) = wait_exit(&mut gpu, Duration::from_secs(10));
    assert_eq!(code, 0, "{log}");
    assert!(log.contains("refused: it presented a key this endpoint does not hold"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The box killed (SIGKILL) while `dxpu host --workload` waits on its device: the host exits
/// within half a second of its ride-through time (1 s here; 10 s by default), saying the
/// device was removed and why (it waited for its 5 s fence timeout and said "fence N not
/// reached" or "device error 18446744073709551615").
#[test]
fn a_dead_box_ends_the_hosts_workload_at_the_ride_through_time_saying_why() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("dead-box");
    let port = free_port();
    let mut gpu = start_gpu(&dir, port);
    let text = format!("{}[link]\nidle_timeout_ms = 500\nride_through_ms = 1000\n", host_toml(port, KEY_A));
    let host_cfg = write(&dir, "host.toml", &text);
    let (t, status, log) = workload_interrupted_at_matmul(&host_cfg, |_| gpu.kill().unwrap());
    let _ = gpu.wait();
    assert!(t.elapsed() < Duration::from_millis(1500), "exited {:?} after the box died: {log}", t.elapsed());
    assert!(log.contains("ride-through"), "{log}");
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("device removed"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A key file others may read is warned about at start, naming it and its mode.
#[test]
fn a_key_file_others_can_read_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("key-mode");
    let key = write(&dir, "host-a.key", KEY_A);
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let port = free_port();
    let text = gpu_toml(port).replacen(
        &format!("key = \"{KEY_A}\""),
        &format!("key_file = \"{}\"", key.display()),
        1,
    );
    let cfg = write(&dir, "gpu.toml", &text);
    let mut gpu = dxpu().args(["gpu", "--config"]).arg(&cfg).stderr(Stdio::piped()).spawn().unwrap();
    until_listening(&mut gpu, port);
    sigterm(&gpu);
    let (code, err) = wait_exit(&mut gpu, Duration::from_secs(10));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("readable by others (mode 644)") && err.contains("host-a.key"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `dxpu gpu` with the io_uring driver restarted on its port right after a clean exit binds
/// it at once (the ring's deferred teardown held the socket: EADDRINUSE ten times in ten).
#[test]
fn a_gpu_endpoint_restarted_at_once_gets_its_port_back() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("restart");
    let port = free_port();
    let cfg = write(&dir, "gpu.toml", &gpu_toml(port));
    for round in 0..5 {
        let mut gpu = dxpu()
            .args(["gpu", "--driver", "io_uring", "--config"])
            .arg(&cfg)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        until_listening(&mut gpu, port);
        sigterm(&gpu);
        let (code, err) = wait_exit(&mut gpu, Duration::from_secs(10));
        if round == 0 && err.contains("io_uring") && code != 0 && !err.contains("in use") {
            eprintln!("skipping: no io_uring here ({err})");
            return;
        }
        assert_eq!(code, 0, "round {round}: {err}");
        assert!(err.contains("listening on"), "round {round}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `loopback` and `replay` bound their shared link options the same way: a delay or jitter
/// past 10 ms and a loss past one half are refused before anything runs, naming the option.
#[test]
fn loopback_and_replay_refuse_the_same_out_of_range_link_options() {
    for cmd in [&["loopback"][..], &["replay", "no-such-trace.json"][..]] {
        for (opt, v) in
            [("--delay-us", "10001"), ("--jitter-us", "10001"), ("--loss", "0.6"), ("--loss", "x")]
        {
            let out = dxpu().args(cmd).args([opt, v]).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?} {opt} {v}: {err}");
            assert!(err.contains(opt), "{cmd:?} {opt} {v}: {err}");
        }
    }
}
