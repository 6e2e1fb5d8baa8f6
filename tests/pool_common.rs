//! What the pool's tests share: a three-member etcd cluster (or a reason to skip), boxes
//! serving a pool on threads of their own with their ownership logs, the hosts' keys.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, HostKey, OwnershipEvent};
use bridge_host::{AttachError, RemoteDevice};
use dxpu_tests::{host_options, test_link};
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use pool::cluster::EtcdCluster;
use pool::{BoxAgent, Claim, DeviceRecord, PoolConfig};

pub(crate) const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];

pub(crate) fn host_key(name: &str) -> PresharedKey {
    PresharedKey::new(format!("{name}'s key, thirty-two bytes or more").as_bytes()).unwrap()
}

/// The cluster, or None (and why, printed) where etcd is not installed.
pub(crate) fn cluster() -> Option<EtcdCluster> {
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return None;
    }
    Some(EtcdCluster::start(3).expect("a three-member etcd cluster starts"))
}

/// A box serving a pool on its own thread, with its ownership log.
pub(crate) struct PoolBox {
    pub(crate) addr: SocketAddr,
    log: Arc<Mutex<Vec<OwnershipEvent>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PoolBox {
    pub(crate) fn start(cfg: PoolConfig, name: &str, devices: usize) -> PoolBox {
        PoolBox::start_in(cfg, name, devices, None)
    }

    /// In network namespace `ns`, listening on its address `ip`.
    pub(crate) fn start_in(
        cfg: PoolConfig,
        name: &str,
        devices: usize,
        ns: Option<(String, std::net::Ipv4Addr)>,
    ) -> PoolBox {
        let listen = SocketAddr::from((ns.as_ref().map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.1), 0));
        let opts = GpuOptions {
            box_name: name.to_string(),
            listen,
            link: test_link(host_key(HOSTS[0])),
            hosts: HOSTS.iter().map(|h| HostKey { name: h.to_string(), key: host_key(h) }).collect(),
            exports: (0..devices)
                .map(|i| ExportSpec {
                    name: format!("gpu{i}"),
                    device: DeviceSpec::Sim(SimGpuParams::default()),
                    allow: HOSTS.iter().map(|h| h.to_string()).collect(),
                })
                .collect(),
            driver: DriverKind::Auto,
            offload: link::driver::Offload::AUTO,
            poll: PollMode::Blocking,
            impairment: Impairment::default(),
            tap: None,
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (l, s, name) = (log.clone(), stop.clone(), name.to_string());
        let thread = std::thread::spawn(move || {
            if let Some((ns, _)) = &ns {
                // The agent's thread, started from this one, is in it too.
                netns::enter(ns).unwrap();
            }
            let mut ep = GpuEndpoint::new(opts).unwrap();
            let addr = ep.local_addr().unwrap();
            let devices = ep
                .export_names()
                .into_iter()
                .map(|d| {
                    let id = ep.export_identity(&d).unwrap();
                    let r = DeviceRecord {
                        advertise: addr.to_string(),
                        vendor_id: id.vendor_id,
                        device_id: id.device_id,
                        class: id.class,
                        vram_bytes: id.largest_bar,
                        health: "ok".into(),
                        allow: id.allow,
                        since: 0,
                    };
                    (d, r)
                })
                .collect();
            let agent = BoxAgent::start(cfg, &name, devices).unwrap();
            ep.set_claims(agent.claim_check());
            ep.set_ownership_sink(Box::new(move |ev| l.lock().unwrap().push(ev.clone())));
            let end = Instant::now() + Duration::from_secs(10);
            while !agent.registered() {
                assert!(Instant::now() < end, "box {name} registers within 10 s");
                std::thread::sleep(Duration::from_millis(10));
            }
            tx.send(addr).unwrap();
            while !s.load(Ordering::Relaxed) {
                if !ep.poll().unwrap() {
                    ep.wait().unwrap();
                }
            }
            ep.shutdown().unwrap();
            agent.stop();
        });
        let addr = rx.recv_timeout(Duration::from_secs(15)).expect("the box starts and registers");
        PoolBox { addr, log, stop, thread: Some(thread) }
    }

    pub(crate) fn events(&self) -> Vec<OwnershipEvent> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for PoolBox {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Per device, the box's log alternates attached / released, and each attach's token is
/// larger than the one before: never two owners, and never an older claim after a newer.
pub(crate) fn assert_one_owner_at_a_time(events: &[OwnershipEvent]) -> usize {
    let mut owner: HashMap<&str, (&str, u64)> = HashMap::new();
    let mut last_token: HashMap<&str, u64> = HashMap::new();
    let mut attaches = 0;
    for (i, e) in events.iter().enumerate() {
        let token = e.token.expect("a pool box attaches with tokens only");
        if e.attached {
            attaches += 1;
            if let Some((h, t)) = owner.get(e.device.as_str()) {
                panic!(
                    "event {i}: {} attached by {} (claim {token}) while {h} holds it (claim {t})",
                    e.device, e.host
                );
            }
            let before = last_token.insert(&e.device, token).unwrap_or(0);
            assert!(
                token > before,
                "event {i}: {} attached with claim {token} after claim {before}",
                e.device
            );
            owner.insert(&e.device, (&e.host, token));
        } else {
            let held = owner.remove(e.device.as_str());
            assert_eq!(
                held,
                Some((e.host.as_str(), token)),
                "event {i}: a release of what was not held: {e:?}"
            );
        }
    }
    attaches
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

pub(crate) fn attach(b: SocketAddr, host: &str, claim: &Claim) -> Result<RemoteDevice, AttachError> {
    let mut o = host_options(b, host_key(host));
    o.device = claim.device.clone();
    o.token = Some(claim.token);
    o.dma_memory = 1 << 20;
    // The box may hold an ATTACH while it looks the claim up in etcd, up to its confirmation
    // timeout (longer right after an etcd member is lost, while its client moves to a live
    // one): wait past that, as the default attach timeout (5 s) does, not the tests' 2 s.
    o.attach_timeout = bridge_gpu::CLAIM_CONFIRM_TIMEOUT + Duration::from_secs(2);
    RemoteDevice::attach(o)
}

pub(crate) fn box_addr(boxes: &[(String, SocketAddr)], claim: &Claim) -> SocketAddr {
    boxes.iter().find(|(n, _)| *n == claim.box_name).unwrap().1
}
