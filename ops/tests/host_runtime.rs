//! The host endpoint's run time in process, no signals and no child processes: a box
//! endpoint on a thread, a host runtime attaching from a file, answering control calls,
//! taking a reload that adds a box nobody answers and removes a device — the other device's
//! session untouched throughout.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bridge_gpu::GpuEndpoint;
use dxpu_ops as ops;
use ops::config::{self, GpuFile};
use ops::control::Call;
use ops::host::{HostRuntime, entries, read_host_file};
use serde_json::{Value, json};

mod common;
use common::{KEY, free_udp_port, tempdir};

/// A box with gpu0 and gpu1 serving on its own thread until `stop`.
fn start_box(dir: &Path, port: u16, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let path = dir.join("gpu.toml");
    let mut t = format!("listen = \"127.0.0.1:{port}\"\n[[host]]\nname = \"host-a\"\nkey = \"{KEY}\"\n");
    for d in ["gpu0", "gpu1"] {
        t.push_str(&format!(
            "[[device]]\nname = \"{d}\"\nsim = {{ vram_mib = 256 }}\nallow = [\"host-a\"]\n"
        ));
    }
    std::fs::write(&path, t).unwrap();
    let file: GpuFile = config::read(&path).unwrap();
    let opts = file.options(None).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        // Made on its thread: an endpoint is not Send.
        let mut ep = GpuEndpoint::new(opts).unwrap();
        tx.send(()).unwrap();
        ep.run(&stop).unwrap()
    });
    rx.recv().unwrap();
    t
}

fn host_file(port: u16, dead: Option<u16>, devices: &[&str]) -> String {
    let mut t = String::new();
    for d in devices {
        t.push_str(&format!(
            "[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"{d}\"\nkey = \"{KEY}\"\n"
        ));
    }
    if let Some(p) = dead {
        t.push_str(&format!("[[attach]]\nserver = \"127.0.0.1:{p}\"\ndevice = \"gpu9\"\nkey = \"{KEY}\"\n"));
    }
    t.push_str("[link]\nhandshake_timeout_ms = 500\n");
    t
}

fn ask(rt: &mut HostRuntime, method: &str, params: Value) -> Value {
    let (call, _answer) = Call::new(method, params);
    rt.answer(&call).unwrap_or_else(|e| panic!("{method}: {e:?}"))
}

fn state(rt: &mut HostRuntime, name: &str) -> String {
    let devices = ask(rt, "devices", Value::Null);
    devices
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == name)
        .map_or("absent".into(), |d| d["state"].as_str().unwrap().to_string())
}

/// Steps the runtime until `ok`, or panics saying `what`.
fn until(rt: &mut HostRuntime, what: &str, limit: Duration, mut ok: impl FnMut(&mut HostRuntime) -> bool) {
    let end = Instant::now() + limit;
    loop {
        rt.step();
        if ok(rt) {
            return;
        }
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn attach_control_and_reload_in_process_one_device_unaffected_by_the_others() {
    let dir = tempdir("host-runtime");
    let (port, dead) = (free_udp_port(), free_udp_port());
    let box_stop = Arc::new(AtomicBool::new(false));
    let the_box = start_box(&dir, port, box_stop.clone());
    let path = dir.join("host.toml");
    std::fs::write(&path, host_file(port, None, &["gpu0", "gpu1"])).unwrap();
    let overrides: ops::host::Overrides = (None, Default::default());
    let (file, all) = read_host_file(&path, &overrides).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut rt = HostRuntime::new(path.clone(), file, overrides.clone(), entries(all), stop.clone());
    rt.attach_all();
    until(&mut rt, "both attached", Duration::from_secs(10), |rt| rt.attached() == 2);
    assert!(rt.settled());
    assert_eq!(ask(&mut rt, "status", Value::Null)["attached"], 2);
    let session = |rt: &mut HostRuntime| {
        ask(rt, "sessions", Value::Null).as_array().unwrap().iter().find(|s| s["device"] == "gpu0").unwrap()
            ["since_unix_seconds"]
            .clone()
    };
    let gpu0_since = session(&mut rt);

    // A reload adds a box nobody answers and removes gpu1: gpu1 is given back, gpu9 goes
    // down (and is tried again), gpu0 keeps its session.
    std::fs::write(&path, host_file(port, Some(dead), &["gpu0"])).unwrap();
    let (file, all) = read_host_file(&path, &overrides).unwrap();
    let r = rt.apply(file, all).unwrap();
    assert_eq!((r["added"].clone(), r["removed"].clone()), (json!(["gpu9"]), json!(["gpu1"])), "{r}");
    until(&mut rt, "gpu9 down", Duration::from_secs(10), |rt| state(rt, "gpu9") == "down");
    assert_eq!(state(&mut rt, "gpu1"), "absent");
    assert_eq!(state(&mut rt, "gpu0"), "attached");
    assert_eq!(session(&mut rt), gpu0_since, "gpu0's session changed");
    let d9 = ask(&mut rt, "devices", Value::Null)
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu9")
        .cloned();
    let d9 = d9.unwrap();
    // Nothing listens on the dead box's port: its machine says so (ICMP port unreachable).
    assert!(d9["error"].as_str().unwrap().contains("nothing listens on"), "{d9}");
    assert!(rt.status_line().starts_with("1 of 2 device(s) attached; gpu9 down ("), "{}", rt.status_line());

    // A reload that changes what needs a restart is refused, nothing changed.
    std::fs::write(&path, host_file(port, Some(dead), &["gpu0"]) + "[control]\nsocket = \"/tmp/x.sock\"\n")
        .unwrap();
    let (file, all) = read_host_file(&path, &overrides).unwrap();
    let e = rt.apply(file, all).unwrap_err().to_string();
    assert!(e.contains("control") && e.contains("restart"), "{e}");
    assert_eq!(state(&mut rt, "gpu0"), "attached");

    // Detach stops gpu9's retries; the stop gives everything back.
    ask(&mut rt, "detach", json!({"name": "gpu9"}));
    assert_eq!(state(&mut rt, "gpu9"), "detached");
    stop.store(true, Ordering::Relaxed);
    rt.detach_all();
    assert_eq!(rt.attached(), 0);
    box_stop.store(true, Ordering::Relaxed);
    the_box.join().unwrap();
    let _ = std::fs::remove_dir_all(dir);
}
