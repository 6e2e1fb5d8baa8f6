//! The pool against a real three-member etcd cluster (started here from Debian's
//! `etcd-server`; without it every test skips, saying why): two boxes of four simulated GPUs
//! and three hosts claiming, attaching through the link with their fencing tokens, and
//! releasing. Who owned what is read from the boxes' own ownership logs, not from etcd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, HostKey, OwnershipEvent};
use bridge_host::{AttachError, RemoteDevice};
use driver::PciFunction;
use dxpu_tests::{host_options, test_link};
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use pool::cluster::EtcdCluster;
use pool::{BoxAgent, Claim, ClaimRequest, DeviceRecord, Filter, PoolConfig};

const HOSTS: [&str; 3] = ["host-a", "host-b", "host-c"];

fn host_key(name: &str) -> PresharedKey {
    PresharedKey::new(format!("{name}'s key, thirty-two bytes or more").as_bytes()).unwrap()
}

/// The cluster, or None (and why, printed) where etcd is not installed.
fn cluster() -> Option<EtcdCluster> {
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return None;
    }
    Some(EtcdCluster::start(3).expect("a three-member etcd cluster starts"))
}

/// A box serving a pool on its own thread, with its ownership log.
struct PoolBox {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<OwnershipEvent>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PoolBox {
    fn start(cfg: PoolConfig, name: &str, devices: usize) -> PoolBox {
        let opts = GpuOptions {
            listen: "127.0.0.1:0".parse().unwrap(),
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
        };
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (l, s, name) = (log.clone(), stop.clone(), name.to_string());
        let thread = std::thread::spawn(move || {
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

    fn events(&self) -> Vec<OwnershipEvent> {
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
fn assert_one_owner_at_a_time(events: &[OwnershipEvent]) -> usize {
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

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

fn attach(b: SocketAddr, host: &str, claim: &Claim) -> Result<RemoteDevice, AttachError> {
    let mut o = host_options(b, host_key(host));
    o.device = claim.device.clone();
    o.token = Some(claim.token);
    o.dma_memory = 1 << 20;
    RemoteDevice::attach(o)
}

fn box_addr(boxes: &[(String, SocketAddr)], claim: &Claim) -> SocketAddr {
    boxes.iter().find(|(n, _)| *n == claim.box_name).unwrap().1
}

#[test]
fn five_hundred_rounds_of_concurrent_claims_never_give_a_device_two_owners() {
    let _serial = dxpu_tests::serial();
    let Some(cluster) = cluster() else { return };
    let cfg = cluster.config();
    let a = PoolBox::start(cfg.clone(), "box-a", 4);
    let b = PoolBox::start(cfg.clone(), "box-b", 4);
    let boxes = vec![("box-a".to_string(), a.addr), ("box-b".to_string(), b.addr)];
    let rounds = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let (cfg, boxes, rounds, host) = (cfg.clone(), boxes.clone(), rounds.clone(), host.to_string());
            std::thread::spawn(move || {
                let rt = rt();
                let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
                let lease = rt.block_on(client.lease_grant(30, None)).unwrap().id();
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ i as u64;
                let mut pick = move |n: usize| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as usize % n
                };
                let (mut served, mut none_free) = (0, 0);
                let mut held: Vec<(Claim, RemoteDevice)> = Vec::new();
                while rounds.fetch_add(1, Ordering::Relaxed) < 500 {
                    // Hold up to three devices; release one at random half of the time.
                    if held.len() == 3 || (!held.is_empty() && pick(2) == 0) {
                        let (claim, d) = held.swap_remove(pick(held.len()));
                        d.detach();
                        assert!(rt.block_on(pool::release(&mut client, &cfg, &claim, None)).unwrap());
                        continue;
                    }
                    let avoid = HashSet::new();
                    let got = rt
                        .block_on(pool::claim_one(
                            &mut client,
                            &cfg,
                            ClaimRequest { host: &host, lease, filter: &Filter::default(), avoid: &avoid },
                            &mut pick,
                            None,
                        ))
                        .unwrap();
                    let Some(claim) = got else {
                        none_free += 1;
                        continue;
                    };
                    // Every claim is served: the box attaches it, and the device answers.
                    let mut d = attach(box_addr(&boxes, &claim), &host, &claim).unwrap_or_else(|e| {
                        panic!("{host}: claim {} ({}) not served: {e}", claim.token, claim.name())
                    });
                    assert_eq!(
                        d.config_read(0) & 0xffff,
                        simgpu_abi::VENDOR_ID as u32,
                        "{host}: {} answers",
                        claim.name()
                    );
                    served += 1;
                    held.push((claim, d));
                }
                for (claim, d) in held {
                    d.detach();
                    rt.block_on(pool::release(&mut client, &cfg, &claim, None)).unwrap();
                }
                (served, none_free)
            })
        })
        .collect();
    let mut served = 0;
    for w in workers {
        let (s, _) = w.join().unwrap();
        served += s;
    }
    // What the boxes saw: the detaches are in before the boxes stop.
    std::thread::sleep(Duration::from_millis(300));
    let attaches = assert_one_owner_at_a_time(&a.events()) + assert_one_owner_at_a_time(&b.events());
    assert_eq!(attaches, served, "every claim served was attached once, and nothing else was");
    assert!(served >= 150, "only {served} claims served in 500 rounds");
    eprintln!("500 rounds in {:.1} s: {served} claims served", started.elapsed().as_secs_f64());
}

#[test]
fn a_stale_or_missing_token_is_refused_and_drain_undrain_revoke_behave() {
    let _serial = dxpu_tests::serial();
    let Some(cluster) = cluster() else { return };
    let cfg = cluster.config();
    let a = PoolBox::start(cfg.clone(), "box-a", 1);
    let rt = rt();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    let lease = rt.block_on(client.lease_grant(30, None)).unwrap().id();
    let mut first = |_: usize| 0;
    let claim = |client: &mut etcd_client::Client, pick: &mut dyn FnMut(usize) -> usize| {
        rt.block_on(pool::claim_one(
            client,
            &cfg,
            ClaimRequest { host: "host-a", lease, filter: &Filter::default(), avoid: &HashSet::new() },
            pick,
            None,
        ))
        .unwrap()
    };
    let c1 = claim(&mut client, &mut first).expect("the free device is claimed");
    // No second claim while it is held.
    assert_eq!(claim(&mut client, &mut first), None);
    // No token, a made-up token, another host's claim: refused.
    let mut o = host_options(a.addr, host_key("host-a"));
    o.dma_memory = 1 << 20;
    let e = RemoteDevice::attach(o.clone()).err().expect("an attach without a token is refused");
    assert!(e.to_string().contains("needs a claim's token"), "{e}");
    let mut forged = c1.clone();
    forged.token += 1_000_000;
    let e = attach(a.addr, "host-a", &forged).err().expect("a token etcd never issued is refused");
    assert!(e.to_string().contains("could not confirm") || e.to_string().contains("refused"), "{e}");
    let e = attach(a.addr, "host-b", &c1).err().expect("host-a's claim does not let host-b in");
    assert!(e.to_string().contains("host-a"), "{e}");
    // The real claim attaches; revoked, the box cuts the host off and resets the device.
    let mut d = attach(a.addr, "host-a", &c1).unwrap();
    assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
    let revoked = rt.block_on(pool::admin::revoke(&mut client, &cfg, "box-a", "gpu0")).unwrap();
    assert_eq!(revoked, Some(("host-a".to_string(), c1.token)));
    let end = Instant::now() + Duration::from_secs(3);
    while d.removed().is_none() {
        assert!(Instant::now() < end, "the revoked host is cut off within 3 s");
        let _ = d.config_read(0);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(d);
    // A new claim has a larger token; the old one is now stale.
    let c2 = claim(&mut client, &mut first).expect("the revoked device is free again");
    assert!(c2.token > c1.token);
    let e = attach(a.addr, "host-a", &c1).err().expect("the stale token is refused");
    assert!(e.to_string().contains("stale"), "{e}");
    let d2 = attach(a.addr, "host-a", &c2).unwrap();
    // Drain: the owner keeps it; once released, nobody may claim it until undrained.
    rt.block_on(pool::admin::drain(&mut client, &cfg, "box-a", "gpu0")).unwrap();
    let ls = rt.block_on(pool::admin::ls(&mut client, &cfg)).unwrap();
    assert_eq!((ls.len(), ls[0].state.as_str(), ls[0].host.as_deref()), (1, "draining", Some("host-a")));
    assert!(d2.removed().is_none(), "a drain leaves the owner its device");
    d2.detach();
    assert!(rt.block_on(pool::release(&mut client, &cfg, &c2, None)).unwrap());
    assert_eq!(claim(&mut client, &mut first), None, "a draining device is not claimed");
    assert!(rt.block_on(pool::admin::undrain(&mut client, &cfg, "box-a", "gpu0")).unwrap());
    let ls = rt.block_on(pool::admin::ls(&mut client, &cfg)).unwrap();
    assert_eq!((ls[0].state.as_str(), ls[0].host.as_deref()), ("free", None));
    assert!(claim(&mut client, &mut first).is_some(), "undrained, it is claimed again");
    assert!(rt.block_on(pool::admin::drain(&mut client, &cfg, "box-a", "gpu9")).is_err(), "no such device");
    assert_one_owner_at_a_time(&a.events());
}
