//! Helpers for dxpu's cross-crate integration tests: a GPU-box endpoint on its own thread,
//! host options pointing at it, and the keys both sides use.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, GpuStats, HostKey};
use bridge_host::AttachOptions;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};

pub fn key_a() -> PresharedKey {
    PresharedKey::new(b"host-a's key: 32 bytes, not less").unwrap()
}
pub fn key_b() -> PresharedKey {
    PresharedKey::new(b"host-b's key: 32 bytes, not less").unwrap()
}

/// Integration tests share two cores: run one bridged test at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Link settings for tests: a quick idle timeout and handshake so failures show fast.
pub fn test_link(key: PresharedKey) -> link::Config {
    let mut c = link::Config::new(key);
    c.idle_timeout = Duration::from_millis(500);
    c.keepalive_interval = Duration::from_millis(50);
    c.handshake_timeout = Duration::from_secs(1);
    c
}

pub fn gpu_options(listen: SocketAddr) -> GpuOptions {
    GpuOptions {
        listen,
        link: test_link(key_a()),
        hosts: vec![
            HostKey { name: "host-a".into(), key: key_a() },
            HostKey { name: "host-b".into(), key: key_b() },
        ],
        exports: vec![ExportSpec {
            name: "gpu0".into(),
            device: DeviceSpec::Sim(SimGpuParams::default()),
            allow: vec!["host-a".into(), "host-b".into()],
        }],
        driver: DriverKind::Auto,
        poll: PollMode::Blocking,
        impairment: Impairment::default(),
    }
}

/// A GPU-box endpoint serving on its own thread until stopped or killed.
pub struct GpuBox {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    kill: Arc<AtomicBool>,
    thread: Option<JoinHandle<GpuStats>>,
}

impl GpuBox {
    pub fn start(opts: GpuOptions) -> GpuBox {
        GpuBox::start_in(opts, None)
    }

    /// Starts the endpoint in network namespace `ns` (its thread enters it).
    pub fn start_in(opts: GpuOptions, ns: Option<String>) -> GpuBox {
        let stop = Arc::new(AtomicBool::new(false));
        let kill = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (s, k) = (stop.clone(), kill.clone());
        let thread = std::thread::spawn(move || {
            if let Some(ns) = ns {
                enter_netns(&ns);
            }
            let mut ep = GpuEndpoint::new(opts).expect("GPU-box endpoint starts");
            tx.send(ep.local_addr().unwrap()).unwrap();
            while !s.load(Ordering::Relaxed) && !k.load(Ordering::Relaxed) {
                if !ep.poll().unwrap() {
                    ep.wait().unwrap();
                }
            }
            if !k.load(Ordering::Relaxed) {
                ep.shutdown().unwrap();
            }
            // Killed: the endpoint vanishes without a word (no CLOSE), as a killed process.
            ep.stats()
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("GPU-box endpoint reports its address");
        GpuBox { addr, stop, kill, thread: Some(thread) }
    }

    /// Stops the endpoint the way SIGTERM does and returns its counters.
    pub fn stop(mut self) -> GpuStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }

    /// Kills the endpoint: it stops answering at once, closing nothing.
    pub fn kill(mut self) -> GpuStats {
        self.kill.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for GpuBox {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Two network namespaces joined by a veth pair: `a` has 10.78.<n>.1, `b` 10.78.<n>.2.
pub struct Netns {
    pub a: String,
    pub b: String,
}

impl Netns {
    pub fn create(tag: &str, n: u8) -> Result<Netns, String> {
        use std::process::Command;
        let a = format!("dxpu-br{tag}-a");
        let b = format!("dxpu-br{tag}-b");
        let sh = |args: &str| -> Result<(), String> {
            let out =
                Command::new("ip").args(args.split_whitespace()).output().map_err(|e| format!("ip: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!("ip {args}: {}", String::from_utf8_lossy(&out.stderr).trim()))
            }
        };
        let _ = sh(&format!("netns del {a}"));
        let _ = sh(&format!("netns del {b}"));
        sh(&format!("netns add {a}"))?;
        let ns = Netns { a: a.clone(), b: b.clone() };
        sh(&format!("netns add {b}"))?;
        let (va, vb) = (format!("vbr{tag}a"), format!("vbr{tag}b"));
        sh(&format!("link add {va} netns {a} type veth peer name {vb} netns {b}"))?;
        sh(&format!("-n {a} addr add 10.78.{n}.1/24 dev {va}"))?;
        sh(&format!("-n {b} addr add 10.78.{n}.2/24 dev {vb}"))?;
        for (ns, v) in [(&a, &va), (&b, &vb)] {
            sh(&format!("-n {ns} link set {v} up"))?;
            sh(&format!("-n {ns} link set lo up"))?;
        }
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        use std::process::Command;
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

/// Moves the calling thread into a named network namespace.
pub fn enter_netns(name: &str) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/var/run/netns/{name}")).unwrap();
    // SAFETY: setns on a valid namespace fd affects only the calling thread.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns {name}: {}", std::io::Error::last_os_error());
}

pub fn host_options(server: SocketAddr, key: PresharedKey) -> AttachOptions {
    let mut o = AttachOptions::new(server, "gpu0", key.clone());
    o.link = test_link(key);
    o.completion_timeout = Duration::from_millis(500);
    o.attach_timeout = Duration::from_secs(2);
    o
}
