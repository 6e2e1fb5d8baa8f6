//! The box endpoint's run time in process, no signals and no child processes: `serve` on a
//! thread with its control socket, a reload by the hang-up flag (what SIGHUP sets) and by the
//! control method, exports added and removed, a file that needs a restart or does not parse
//! refused with the devices untouched, and a stop that ends it cleanly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bridge_gpu::GpuEndpoint;
use dxpu_ops as ops;
use ops::gpu::{GpuRuntime, GpuStart, serve};
use serde_json::{Value, json};

mod common;
use common::{KEY, free_udp_port, tempdir};

fn box_file(sock: &Path, port: u16, devices: &[&str]) -> String {
    let mut t = format!(
        "listen = \"127.0.0.1:{port}\"\n[control]\nsocket = {:?}\n[[host]]\nname = \"host-a\"\nkey = \"{KEY}\"\n",
        sock.display().to_string()
    );
    for d in devices {
        t.push_str(&format!(
            "[[device]]\nname = \"{d}\"\nsim = {{ vram_mib = 256 }}\nallow = [\"host-a\"]\n"
        ));
    }
    t
}

/// One JSON-RPC call on the control socket (`dxpu ctl`'s client): its result, or its error
/// object.
fn call(sock: &Path, method: &str, params: Value) -> Result<Value, Value> {
    let v = ops::control::call(sock, method, params, Duration::from_secs(10)).unwrap();
    match v.get("error") {
        Some(e) => Err(e.clone()),
        None => Ok(v["result"].clone()),
    }
}

fn names(sock: &Path) -> Vec<String> {
    let devs = call(sock, "devices", Value::Null).unwrap();
    devs.as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap().to_string()).collect()
}

fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

type Served = std::thread::JoinHandle<Result<(), ops::error::RunError>>;

/// The box of file `config` served on a thread, once its control socket `sock` is there:
/// its stop and hang-up flags and its thread.
fn serve_box(config: &Path, sock: &Path) -> (Arc<AtomicBool>, Arc<AtomicBool>, Served) {
    let (stop, hup) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (s2, h2, start) =
        (stop.clone(), hup.clone(), GpuStart { config: config.to_path_buf(), ..GpuStart::default() });
    let served = std::thread::spawn(move || {
        let (mut rt, opts) = GpuRuntime::start(&start)?;
        // Made on its thread: an endpoint is not Send.
        let mut ep = GpuEndpoint::new(opts)?;
        serve(&mut ep, &mut rt, &s2, &h2)
    });
    until("the control socket", Duration::from_secs(10), || sock.exists());
    (stop, hup, served)
}

#[test]
fn a_box_in_process_reloads_on_hang_up_and_by_control_and_refuses_what_needs_a_restart() {
    let dir = tempdir("gpu-runtime");
    let sock = dir.join("gpu.sock");
    let port = free_udp_port();
    let config = dir.join("gpu.toml");
    std::fs::write(&config, box_file(&sock, port, &["gpu0", "gpu1"])).unwrap();
    let (stop, hup, served) = serve_box(&config, &sock);
    let status = call(&sock, "status", Value::Null).unwrap();
    assert_eq!((status["role"].as_str(), status["devices"].as_u64()), (Some("gpu"), Some(2)), "{status}");
    assert_eq!(names(&sock), ["gpu0", "gpu1"]);

    // SIGHUP's flag: gpu1 removed, gpu2 added, gpu0 left alone.
    std::fs::write(&config, box_file(&sock, port, &["gpu0", "gpu2"])).unwrap();
    hup.store(true, Ordering::Relaxed);
    until("the hang-up's reload", Duration::from_secs(10), || names(&sock) == ["gpu0", "gpu2"]);

    // By the control method: the answer says what changed.
    std::fs::write(&config, box_file(&sock, port, &["gpu0", "gpu2", "gpu3"])).unwrap();
    let r = call(&sock, "reload", Value::Null).unwrap();
    assert_eq!(r["added"], json!(["gpu3"]), "{r}");
    assert_eq!(r["unchanged"], json!(["gpu0", "gpu2"]), "{r}");

    // What needs a restart, and what does not parse: refused, nothing changed.
    let other_port = port.wrapping_add(1).max(1024);
    std::fs::write(&config, box_file(&sock, other_port, &["gpu0"])).unwrap();
    let e = call(&sock, "reload", Value::Null).unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("needs a restart"), "{e}");
    std::fs::write(&config, "listen = \n").unwrap();
    let e = call(&sock, "reload", Value::Null).unwrap_err();
    assert!(e["message"].as_str().unwrap().contains("gpu.toml"), "{e}");
    assert_eq!(names(&sock), ["gpu0", "gpu2", "gpu3"]);

    // Export and unexport by name, from the file as it is when asked.
    std::fs::write(&config, box_file(&sock, port, &["gpu0", "gpu2", "gpu3", "gpu4"])).unwrap();
    assert_eq!(call(&sock, "unexport", json!({"name": "gpu2"})).unwrap(), json!({"unexported": "gpu2"}));
    assert_eq!(call(&sock, "export", json!({"name": "gpu4"})).unwrap(), json!({"exported": "gpu4"}));
    assert!(call(&sock, "export", json!({"name": "gpu9"})).is_err(), "a device the file lacks");
    assert_eq!(names(&sock), ["gpu0", "gpu3", "gpu4"]);

    stop.store(true, Ordering::Relaxed);
    served.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

const KEY_A2: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf";
const KEY_B: &str = "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf";

fn key_of(hex: &str) -> link::PresharedKey {
    let bytes: Vec<u8> =
        (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    link::PresharedKey::new(&bytes).unwrap()
}

/// A box with host-a (its key `a_key`) and, where `with_b`, host-b; gpu0 and gpu2 for
/// host-a, gpu1 for host-b (host-a once host-b is gone); old keys accepted 2 s after a change.
fn rotation_file(sock: &Path, port: u16, a_key: &str, with_b: bool) -> String {
    let mut t = format!(
        "listen = \"127.0.0.1:{port}\"\nkey_overlap_s = 2\n[control]\nsocket = {:?}\n\
         [[host]]\nname = \"host-a\"\nkey = \"{a_key}\"\n",
        sock.display().to_string()
    );
    if with_b {
        t.push_str(&format!("[[host]]\nname = \"host-b\"\nkey = \"{KEY_B}\"\n"));
    }
    for (d, host) in
        [("gpu0", "host-a"), ("gpu1", if with_b { "host-b" } else { "host-a" }), ("gpu2", "host-a")]
    {
        t.push_str(&format!(
            "[[device]]\nname = \"{d}\"\nsim = {{ vram_mib = 256 }}\nallow = [\"{host}\"]\n"
        ));
    }
    t
}

fn attach(port: u16, device: &str, key: &str) -> Result<bridge_host::RemoteDevice, bridge_host::AttachError> {
    let server = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut o = bridge_host::AttachOptions::new(server, device, key_of(key));
    o.attach_timeout = Duration::from_secs(3);
    bridge_host::RemoteDevice::attach(o)
}

/// 1 MiB to the device and back through the driver, compared.
fn verified(d: &mut driver::SimGpuDriver<bridge_host::RemoteDevice>, seed: u8) -> Result<(), String> {
    let data: Vec<u8> = (0..1 << 20).map(|i: usize| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    d.memcpy_to_device(0, &data).map_err(|e| e.to_string())?;
    let mut back = vec![0u8; data.len()];
    d.memcpy_from_device(0, &mut back).map_err(|e| e.to_string())?;
    if back == data { Ok(()) } else { Err("the bytes came back different".into()) }
}

/// Credentials changed one host at a time, by reload: host-a's key rotated while host-b copies
/// without a pause — host-b's session is never touched and every copy verifies; host-a's old
/// session goes on, its new key attaches at once, its old key is still accepted until the
/// overlap ends, then the old session is ended and the old key refused. Then host-b removed:
/// its session ended and its device released, reset and free.
#[test]
fn a_hosts_key_rotated_with_an_overlap_and_a_host_removed_touch_no_other_session() {
    let dir = tempdir("gpu-rotate");
    let sock = dir.join("gpu.sock");
    let port = free_udp_port();
    let config = dir.join("gpu.toml");
    std::fs::write(&config, rotation_file(&sock, port, KEY, true)).unwrap();
    let (stop, _hup, served) = serve_box(&config, &sock);

    // host-b copies without a pause, from before the rotation to after it.
    let (b_stop, b_runs) = (Arc::new(AtomicBool::new(false)), Arc::new(std::sync::atomic::AtomicU32::new(0)));
    let (bs, br) = (b_stop.clone(), b_runs.clone());
    let host_b = std::thread::spawn(move || -> Result<bridge_host::RemoteDevice, String> {
        let mut d = driver::SimGpuDriver::open(attach(port, "gpu1", KEY_B).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        while !bs.load(Ordering::Relaxed) {
            verified(&mut d, br.load(Ordering::Relaxed) as u8).map_err(|e| format!("host-b, copy: {e}"))?;
            br.fetch_add(1, Ordering::Relaxed);
        }
        Ok(d.into_pci())
    });
    until("host-b's first copies", Duration::from_secs(20), || b_runs.load(Ordering::Relaxed) >= 2);
    let mut old = driver::SimGpuDriver::open(attach(port, "gpu0", KEY).unwrap()).unwrap();
    verified(&mut old, 1).unwrap();

    std::fs::write(&config, rotation_file(&sock, port, KEY_A2, true)).unwrap();
    let r = call(&sock, "reload", Value::Null).unwrap();
    assert_eq!(r["hosts"]["rekeyed"], json!(["host-a"]), "{r}");
    assert_eq!(r["hosts"]["old_keys_accepted_s"], 2, "{r}");
    let b_at_reload = b_runs.load(Ordering::Relaxed);
    // Within the overlap: the old session works, the new key attaches, the old key is still
    // accepted (the handshake passes; gpu0 is held, so the attach is refused for that).
    verified(&mut old, 2).unwrap();
    let mut new = driver::SimGpuDriver::open(attach(port, "gpu2", KEY_A2).unwrap()).unwrap();
    verified(&mut new, 3).unwrap();
    match attach(port, "gpu0", KEY) {
        Err(bridge_host::AttachError::Refused { reason, .. }) => {
            assert!(reason.contains("attached to host"), "{reason}")
        }
        other => panic!("the old key within the overlap: {:?}", other.map(|_| "attached")),
    }
    // Past it: the old session is ended, the old key refused, the new one gets gpu0.
    until("the old key's session ended", Duration::from_secs(10), || old.pci().removed().is_some());
    let e = attach(port, "gpu0", KEY).map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("authentication failed"), "{e}");
    let mut again = driver::SimGpuDriver::open(attach(port, "gpu0", KEY_A2).unwrap()).unwrap();
    verified(&mut again, 4).unwrap();
    verified(&mut new, 5).unwrap();
    until("host-b's copies after the rotation", Duration::from_secs(20), || {
        b_runs.load(Ordering::Relaxed) >= b_at_reload + 3
    });
    b_stop.store(true, Ordering::Relaxed);
    let b = host_b.join().unwrap().unwrap();
    assert!(b.removed().is_none(), "{:?}", b.removed());
    let st = b.stats();
    assert_eq!((st.link_silences, st.failed_requests, st.completion_timeouts), (0, 0, 0), "{st:?}");

    // host-b removed: its session ends, gpu1 is released (reset) and free; host-a untouched.
    std::fs::write(&config, rotation_file(&sock, port, KEY_A2, false)).unwrap();
    let r = call(&sock, "reload", Value::Null).unwrap();
    assert_eq!(r["hosts"]["removed"], json!(["host-b"]), "{r}");
    until("host-b's session ended", Duration::from_secs(10), || b.removed().is_some());
    let devs = call(&sock, "devices", Value::Null).unwrap();
    let gpu1 = devs.as_array().unwrap().iter().find(|d| d["name"] == "gpu1").unwrap().clone();
    assert_eq!(gpu1["state"], "free", "{gpu1}");
    verified(&mut again, 6).unwrap();
    verified(&mut new, 7).unwrap();

    drop((again, new, old, b));
    stop.store(true, Ordering::Relaxed);
    served.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
