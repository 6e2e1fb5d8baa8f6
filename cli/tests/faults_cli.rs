//! Faults that stay local, in the endpoints as processes (docs/reliability.md): one box
//! that does not answer costs its own device only; the control socket serves while an
//! attach is in progress; the service manager is told which devices are up.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// Two `[[attach]]`: gpu0 on a live box, gpu9 on a port nobody answers. gpu0 attaches and
/// keeps its one session while gpu9 is tried again and again (down, saying why, in `ctl
/// devices` and the metrics); `ctl status` answers at once while a `ctl attach gpu9` is in
/// progress; sd_notify says ready with which device is up. On 9b5fbd6 the host attached
/// gpu0, then detached it and exited 1 after 5 s ("the handshake did not complete in time").
#[test]
fn one_box_that_does_not_answer_costs_its_device_only() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("isolation");
    let (port, dead, gm, hm) = (free_udp_port(), free_udp_port(), free_tcp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let hcfg = dir.join("host.toml");
    let mut h = host_toml(&dir, port, hm, &["gpu0"]);
    h.push_str(&format!("[[attach]]\nserver = \"127.0.0.1:{dead}\"\ndevice = \"gpu9\"\nkey = \"{KEY_A}\"\n"));
    h.push_str("[link]\nhandshake_timeout_ms = 1000\n");
    std::fs::write(&hcfg, h).unwrap();
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut gpu = Proc::start(&dir, "gpu", &gcfg);
    let (gs, hs) = (dir.join("gpu.sock"), dir.join("host.sock"));
    gpu.serving("the box's control socket", &gs);
    let started = Instant::now();
    let mut host = Proc::start_with_env(&dir, "host", &hcfg, &[("NOTIFY_SOCKET", &notify_path)]);
    host.serving("the host's control socket", &hs);
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let session = by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"].clone();
    // Ready once every first attempt ended, saying which device is up and why the other
    // is not.
    let mut ready = String::new();
    let end = Instant::now() + Duration::from_secs(10);
    while !ready.contains("READY=1") {
        assert!(Instant::now() < end, "never ready: {ready}");
        let mut b = [0u8; 1024];
        if let Ok(n) = notify.recv(&mut b) {
            ready = String::from_utf8_lossy(&b[..n]).into_owned();
        }
    }
    assert!(ready.contains("STATUS=1 of 2 device(s) attached; gpu9 down ("), "{ready}");
    let d9 = by_name(&result(&hs, &["devices"]), "name", "gpu9").clone();
    assert!(["down", "attaching"].contains(&d9["state"].as_str().unwrap()), "{d9}");
    // Past the 5 s after which the old host gave up on everything, and a few retries of gpu9.
    while started.elapsed() < Duration::from_secs(8) {
        assert!(host.child.try_wait().unwrap().is_none(), "the host exited:\n{}", host.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let d0 = by_name(&result(&hs, &["devices"]), "name", "gpu0").clone();
    assert_eq!(d0["state"], "attached", "{d0}");
    assert_eq!(
        by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"],
        session,
        "gpu0 was disturbed"
    );
    assert_eq!(by_name(&result(&gs, &["devices"]), "name", "gpu0")["counters"]["attaches"], 1);
    let d9 = by_name(&result(&hs, &["devices"]), "name", "gpu9").clone();
    assert!(d9["attach_failures"].as_u64().unwrap() >= 2, "gpu9 not tried again: {d9}");
    let why = d9["error"].as_str().unwrap_or_default().to_string();
    // Nothing listens on its port: its machine says so (ICMP port unreachable).
    assert!(why.contains("gpu9") && why.contains("nothing listens on"), "{d9}");
    let metrics = scrape(hm);
    assert_eq!(sample(&metrics, "dxpu_device_up{device=\"gpu9\"}"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "dxpu_device_up{device=\"gpu0\"}"), Some(1.0), "{metrics}");
    assert!(sample(&metrics, "dxpu_attach_failures_total{device=\"gpu9\"}").unwrap() >= 2.0, "{metrics}");

    // A ctl attach of the dead box waits for its attempt (1 s handshake timeout); other
    // calls are answered meanwhile.
    let _ = ctl(&hs, &["detach", "gpu9"]);
    let attach = dxpu()
        .args(["ctl", "--json", "--socket"])
        .arg(&hs)
        .args(["attach", "gpu9"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(result(&hs, &["status"])["attached"], 1);
    assert!(t.elapsed() < Duration::from_millis(500), "status waited {:?} behind an attach", t.elapsed());
    let out = attach.wait_with_output().unwrap();
    assert!(!out.status.success(), "the attach of a dead box succeeded");
    assert!(host.log().contains("gpu9"), "{}", host.log());
    let (code, log) = host.stop();
    assert_eq!(code, 0, "{log}");
    drop(gpu);
    let _ = std::fs::remove_dir_all(dir);
}

/// A reload whose key file blocks (a FIFO nobody writes; a hung network mount): the box's
/// loop goes on — the attached host keeps its session, `ctl status` answers at once — and the
/// reload applies once the file can be read. On 9b5fbd6 the read ran on the loop: the host
/// was surprise-removed after the link's idle timeout and the control socket went silent.
#[test]
fn a_reload_whose_key_file_blocks_does_not_freeze_the_box() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("fifo-reload");
    let BoxAndHost { gpu, host, gs, hs, gcfg, .. } = box_and_host(&dir, &["gpu0"], &["gpu0"], "");
    let base = std::fs::read_to_string(&gcfg).unwrap();
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let session = by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"].clone();
    let fifo = dir.join("host-c.key");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    std::fs::write(&gcfg, format!("{base}[[host]]\nname = \"host-c\"\nkey_file = \"{}\"\n", fifo.display()))
        .unwrap();
    gpu.signal(rustix::process::Signal::HUP);
    // Three times the link's idle timeout (1 s): the box's loop must keep answering.
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(3) {
        let asked = Instant::now();
        let st = result(&gs, &["status"]);
        assert!(asked.elapsed() < Duration::from_millis(500), "status took {:?}", asked.elapsed());
        assert_eq!(st["sessions"], 1, "{st}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"], "attached");
    assert_eq!(by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"], session);
    assert!(!gpu.log().contains("reloaded"), "{}", gpu.log());
    // The key arrives: the reload applies.
    std::fs::write(&fifo, format!("{}\n", "c3".repeat(32))).unwrap();
    until("the reload applies", Duration::from_secs(5), || gpu.log().contains("reloaded"));
    assert!(result(&gs, &["status"])["hosts"].as_array().unwrap().iter().any(|h| h == "host-c"));
    assert_eq!(by_name(&result(&gs, &["sessions"]), "device", "gpu0")["session"], session);
    let (code, log) = host.stop();
    assert_eq!(code, 0, "{log}");
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `[control] socket` naming the configuration file, a symlink to it, or a live socket: the
/// endpoint refuses to start, says why, and the file is untouched. A stale socket (nobody
/// listens) is replaced. On 9b5fbd6 the configuration file itself was deleted.
#[test]
fn a_control_socket_path_that_is_not_a_stale_socket_is_refused_and_left_alone() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("sock-path");
    let port = free_udp_port();
    let gcfg = dir.join("gpu.toml");
    let link = dir.join("link.sock");
    std::os::unix::fs::symlink(&gcfg, &link).unwrap();
    for (target, why) in [(&gcfg, "a regular file"), (&link, "a symbolic link")] {
        let text = gpu_toml(&dir, port, free_tcp_port(), &["gpu0"])
            .replace(&dir.join("gpu.sock").display().to_string(), &target.display().to_string());
        std::fs::write(&gcfg, &text).unwrap();
        let out = dxpu().arg("gpu").arg("--config").arg(&gcfg).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(why) && err.contains("refusing to replace it"), "{err}");
        assert_eq!(std::fs::read_to_string(&gcfg).unwrap(), text, "the configuration file was touched");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    }
    // A live socket (another endpoint's) is refused; a stale one replaced.
    let sock = dir.join("gpu.sock");
    let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::fs::write(&gcfg, gpu_toml(&dir, port, free_tcp_port(), &["gpu0"])).unwrap();
    let out = dxpu().arg("gpu").arg("--config").arg(&gcfg).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("live socket"), "{out:?}");
    drop(live);
    let gpu = Proc::start(&dir, "gpu", &gcfg);
    until("the box serves over the stale socket's path", Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    assert!(!sock.exists(), "its own socket is removed at the stop");
    let _ = std::fs::remove_dir_all(dir);
}

/// 200 idle connections and 70 that trickle a header byte a second to the metrics port,
/// then 600 idle ones opened at once (past the 512 the server holds): every scrape answers
/// within a second, and HEAD is answered too. On 166c20c the server held 64 connections for
/// up to 5 s each: with 70 idle, 3 of 5 scrapes took 4 s; with 70 trickling, none answered
/// within 2 s (on 9b5fbd6 it took one connection at a time: six idle made a scrape take
/// 11.6 s).
#[test]
fn no_crowd_of_slow_or_idle_clients_blocks_a_scrape() {
    use std::io::{Read, Write};
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("metrics-slow");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let gpu = Proc::start(&dir, "gpu", &gcfg);
    until("the metrics port", Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", gm)).is_ok()
    });
    let connect = || std::net::TcpStream::connect(("127.0.0.1", gm));
    let idle: Vec<_> = (0..200).filter_map(|_| connect().ok()).collect();
    assert_eq!(idle.len(), 200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tricklers: Vec<_> = (0..70)
        .map(|_| {
            let s2 = stop.clone();
            std::thread::spawn(move || {
                let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", gm)) else { return };
                for b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n".iter() {
                    if s2.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let scrape_within_a_second = |what: &str| {
        let t = Instant::now();
        let text = scrape(gm);
        assert!(t.elapsed() < Duration::from_secs(1), "{what}: a scrape took {:?}", t.elapsed());
        assert!(text.contains("dxpu_up{role=\"gpu\""), "{text}");
    };
    for _ in 0..5 {
        scrape_within_a_second("200 idle, 70 trickling");
        std::thread::sleep(Duration::from_millis(700));
    }
    let crowd: Vec<_> = (0..600).filter_map(|_| connect().ok()).collect();
    assert!(crowd.len() >= 550, "only {} connections opened", crowd.len());
    scrape_within_a_second("600 idle more");
    // HEAD: the headers of a scrape, no body.
    let mut s = connect().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut head = String::new();
    s.read_to_string(&mut head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "a body came with HEAD: {head}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop((idle, crowd));
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    for t in tricklers {
        t.join().unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// `dxpu loopback --vfio-user` stops on SIGHUP as on SIGTERM: exit 0, its socket removed
/// (on 9b5fbd6 a hangup killed it, status 129, and left the socket behind).
#[test]
fn loopback_serving_vfio_user_stops_cleanly_on_a_hangup() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("loopback-hup");
    let mut child = dxpu()
        .args(["loopback", "--vfio-user"])
        .arg(&dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let sock = dir.join("gpu0.sock");
    until("the vfio-user socket", Duration::from_secs(10), || sock.exists());
    let pid = rustix::process::Pid::from_child(&child);
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "still running after SIGHUP");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.contains("stopped after"), "{err}");
    assert!(!sock.exists(), "the socket was left behind");
    let _ = std::fs::remove_dir_all(dir);
}

/// A box killed with SIGKILL and started again at once gets its port back: the port still
/// held by the dying process is waited for, said as such, not blamed on io_uring (on
/// 9b5fbd6 ten restarts of ten failed to bind, after a line saying io_uring set-up failed).
#[test]
fn a_box_restarted_right_after_a_kill_gets_its_port() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("kill-restart");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    for round in 0..3 {
        let mut first = Proc::start(&dir, "gpu", &gcfg);
        until("the box listens", Duration::from_secs(10), || first.log().contains("listening on"));
        first.child.kill().unwrap();
        let second = Proc::start(&dir, "gpu", &gcfg);
        until("the restarted box listens", Duration::from_secs(10), || {
            let log = second.log();
            assert!(!log.contains("dxpu gpu:"), "round {round}: {log}");
            log.contains("listening on")
        });
        let _ = first.child.wait();
        let (code, log) = second.stop();
        assert_eq!(code, 0, "round {round}: {log}");
        assert!(!log.contains("io_uring set-up failed"), "round {round}: {log}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The host's end of an outage test: gpu0 at `port`, attached in this process with the
/// default link settings (idle timeout 1 s, ride-through 10 s), workloads run one after the
/// other until `stop`, each counted in `runs` once it verified. Ends with the device, or
/// the first failure.
fn workloads_until(
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    runs: std::sync::Arc<std::sync::atomic::AtomicU32>,
) -> std::thread::JoinHandle<Result<bridge_host::RemoteDevice, String>> {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let key = link::PresharedKey::new(&hex::decode(KEY_A).unwrap()).unwrap();
        let o = bridge_host::AttachOptions::new(format!("127.0.0.1:{port}").parse().unwrap(), "gpu0", key);
        let remote = bridge_host::RemoteDevice::attach(o).map_err(|e| e.to_string())?;
        let mut d = driver::SimGpuDriver::open(remote).map_err(|e| e.to_string())?;
        while !stop.load(Ordering::Relaxed) {
            let size = testbed::workload::WorkloadSize::scaled(1);
            testbed::workload::run(&mut d, size, &mut |_| {})
                .map_err(|e| format!("run {}: {e}", runs.load(Ordering::Relaxed)))?;
            runs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(d.into_pci())
    })
}

/// The box's process stopped (SIGSTOP) for 1, 3 and 5 s in the middle of workloads, then
/// continued: the host's session says the link is silent and rides it through, its requests'
/// completion timeouts wait for the box, the box drains what arrived while it was stopped
/// before it judges anything, and every workload — before, across and after each stop —
/// verifies; the device is never removed nor attached again. On 166c20c a stop of 1.0 s
/// removed the device ("nothing authentic arrived from the peer within the idle timeout").
#[test]
fn a_box_stopped_for_one_three_and_five_seconds_is_ridden_through() {
    use rustix::process::Signal;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("sigstop");
    let (port, gm) = (free_udp_port(), free_tcp_port());
    let gcfg = dir.join("gpu.toml");
    std::fs::write(&gcfg, gpu_toml(&dir, port, gm, &["gpu0"])).unwrap();
    let mut gpu = Proc::start(&dir, "gpu", &gcfg);
    let gs = dir.join("gpu.sock");
    gpu.serving("the box's control socket", &gs);
    let (stop, runs) = (std::sync::Arc::new(AtomicBool::new(false)), std::sync::Arc::new(AtomicU32::new(0)));
    let host = workloads_until(port, stop.clone(), runs.clone());
    let wait_runs = |n: u32| {
        let end = Instant::now() + Duration::from_secs(60);
        while runs.load(Ordering::Relaxed) < n && !host.is_finished() {
            assert!(Instant::now() < end, "no workload finished in 60 s:\n{}", gpu.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for pause in [1, 3, 5] {
        wait_runs(runs.load(Ordering::Relaxed) + 1);
        // Inside a workload, not between two.
        std::thread::sleep(Duration::from_millis(30));
        gpu.signal(Signal::STOP);
        std::thread::sleep(Duration::from_secs(pause));
        gpu.signal(Signal::CONT);
        eprintln!("box stopped for {pause} s; {} workloads verified so far", runs.load(Ordering::Relaxed));
    }
    wait_runs(runs.load(Ordering::Relaxed) + 2);
    stop.store(true, Ordering::Relaxed);
    let remote = host.join().unwrap().unwrap_or_else(|e| panic!("a workload failed: {e}\n{}", gpu.log()));
    assert!(remote.removed().is_none(), "{:?}", remote.removed());
    let s = remote.stats();
    eprintln!(
        "{} workloads; host: {} silences, {} completion timeouts paused",
        runs.load(Ordering::Relaxed),
        s.link_silences,
        s.completion_timeouts_paused
    );
    assert!(s.link_silences >= 2, "the 3 and 5 s stops were not seen as silences: {s:?}");
    assert_eq!(s.completion_timeouts, 0, "{s:?}");
    let dev = by_name(&result(&gs, &["devices"]), "name", "gpu0").clone();
    assert_eq!(dev["counters"]["attaches"], 1, "the device was attached again: {dev}");
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("host host-a gone"), "the box let the host go:\n{log}");
    // The device's release lines ("gpu0: released by host-a (…)"); the ride-through warning
    // ("… before its device is released") is not one.
    assert_eq!(log.matches(": released by ").count(), 1, "released before the stop:\n{log}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The box stopped past the host's ride-through time (2 s here): the host says once that the
/// link is silent, then removes the device once, saying why; when the box continues, the
/// host attaches it again.
#[test]
fn a_box_stopped_past_the_ride_through_is_removed_once_saying_why() {
    use rustix::process::Signal;
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("sigstop-long");
    let link = "[link]\nidle_timeout_ms = 1000\nride_through_ms = 2000\n";
    let BoxAndHost { gpu, host, hs, .. } = box_and_host(&dir, &["gpu0"], &["gpu0"], link);
    until("gpu0 attached", Duration::from_secs(5), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    gpu.signal(Signal::STOP);
    until("gpu0 silent", Duration::from_millis(1900), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "silent"
    });
    std::thread::sleep(Duration::from_millis(2500));
    let log = host.log();
    gpu.signal(Signal::CONT);
    let silent = log.lines().filter(|l| l.contains("riding through")).count();
    let removed: Vec<&str> = log.lines().filter(|l| l.contains("surprise removal")).collect();
    assert_eq!(silent, 1, "said silent {silent} times:\n{log}");
    assert_eq!(removed.len(), 1, "removed {} times:\n{log}", removed.len());
    assert!(removed[0].contains("ride-through"), "{}", removed[0]);
    until("gpu0 attached again", Duration::from_secs(15), || {
        by_name(&result(&hs, &["devices"]), "name", "gpu0")["state"] == "attached"
    });
    let (code, log) = host.stop();
    assert_eq!(code, 0, "{log}");
    let (code, log) = gpu.stop();
    assert_eq!(code, 0, "{log}");
    let _ = std::fs::remove_dir_all(dir);
}
