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

#[test]
fn a_box_in_process_reloads_on_hang_up_and_by_control_and_refuses_what_needs_a_restart() {
    let dir = tempdir("gpu-runtime");
    let sock = dir.join("gpu.sock");
    let port = free_udp_port();
    let config = dir.join("gpu.toml");
    std::fs::write(&config, box_file(&sock, port, &["gpu0", "gpu1"])).unwrap();
    let (stop, hup) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let (s2, h2, start) =
        (stop.clone(), hup.clone(), GpuStart { config: config.clone(), ..GpuStart::default() });
    let served = std::thread::spawn(move || {
        let (mut rt, opts) = GpuRuntime::start(&start)?;
        // Made on its thread: an endpoint is not Send.
        let mut ep = GpuEndpoint::new(opts)?;
        serve(&mut ep, &mut rt, &s2, &h2)
    });
    until("the control socket", Duration::from_secs(10), || sock.exists());
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
