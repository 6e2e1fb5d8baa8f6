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
        PoolBox::start_in(cfg, name, devices, None)
    }

    /// In network namespace `ns`, listening on its address `ip`.
    fn start_in(
        cfg: PoolConfig,
        name: &str,
        devices: usize,
        ns: Option<(String, std::net::Ipv4Addr)>,
    ) -> PoolBox {
        let listen = SocketAddr::from((ns.as_ref().map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.1), 0));
        let opts = GpuOptions {
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
    // The box may hold an ATTACH while it looks the claim up in etcd, up to its confirmation
    // timeout (longer right after an etcd member is lost, while its client moves to a live
    // one): wait past that, as the default attach timeout (5 s) does, not the tests' 2 s.
    o.attach_timeout = bridge_gpu::CLAIM_CONFIRM_TIMEOUT + Duration::from_secs(2);
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
                let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
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
                            ClaimRequest {
                                host: &host,
                                lease,
                                filter: &Filter::default(),
                                avoid: &avoid,
                                records: &pool::RecordCache::default(),
                            },
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
    let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
    let mut first = |_: usize| 0;
    // One cache of records for every claim here, as a host keeps.
    let records = pool::RecordCache::default();
    let claim = |client: &mut pool::etcd::Client, pick: &mut (dyn FnMut(usize) -> usize + Send)| {
        rt.block_on(pool::claim_one(
            client,
            &cfg,
            ClaimRequest {
                host: "host-a",
                lease,
                filter: &Filter::default(),
                avoid: &HashSet::new(),
                records: &records,
            },
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
    forged.token = u64::MAX;
    let e = attach(a.addr, "host-a", &forged).err().expect("a token at the edge of its range is refused");
    assert!(e.to_string().contains("not a revision"), "{e}");
    let e = attach(a.addr, "host-b", &c1).err().expect("host-a's claim does not let host-b in");
    assert!(e.to_string().contains("host-a"), "{e}");
    // The real claim attaches; revoked, the box cuts the host off and resets the device.
    let mut d = attach(a.addr, "host-a", &c1).unwrap();
    assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
    let revoked = rt.block_on(pool::admin::revoke(&mut client, &cfg, "box-a", "gpu0")).unwrap();
    assert_eq!(revoked, pool::admin::Revoked::Claim { host: "host-a".to_string(), token: c1.token });
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
    // A record that changed (its box registered again elsewhere) is read again: the next
    // claim names the new address, not the one cached.
    let taken = rt.block_on(pool::snapshot(&mut client, &cfg, None)).unwrap();
    let (_, token) = taken.claims.values().next().cloned().unwrap();
    let held =
        Claim { box_name: "box-a".into(), device: "gpu0".into(), token, record: taken.devices[0].1.clone() };
    assert!(rt.block_on(pool::release(&mut client, &cfg, &held, None)).unwrap());
    let mut moved = taken.devices[0].1.clone();
    moved.advertise = "127.0.0.1:9".into();
    let key = pool::Keys::new(&cfg.prefix).device("box-a", "gpu0");
    rt.block_on(client.put(key, serde_json::to_vec(&moved).unwrap(), None)).unwrap();
    let c4 = claim(&mut client, &mut first).expect("claimed again");
    assert_eq!(c4.record.advertise, "127.0.0.1:9");
    // A box reports a device unhealthy: pool ls says so and nobody claims it.
    let record = DeviceRecord { advertise: "127.0.0.1:9".into(), ..c4.record.clone() };
    let h = BoxAgent::start(cfg.clone(), "box-h", vec![("gpu0".into(), record)]).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !h.registered() {
        assert!(Instant::now() < end, "box-h registers");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut report = h.health_reporter();
    report("gpu0", "does not answer config reads after its reset (Vendor ID 0xffff)");
    let state = |client: &mut pool::etcd::Client| {
        let ls = rt.block_on(pool::admin::ls(client, &cfg)).unwrap();
        ls.into_iter().find(|e| e.box_name == "box-h").map(|e| e.state)
    };
    while state(&mut client).as_deref() != Some("unhealthy") {
        assert!(Instant::now() < end, "the unhealthy device is listed so");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(claim(&mut client, &mut first), None, "an unhealthy device is not claimed");
    h.stop();
    assert_eq!(state(&mut client), None, "a box that stops leaves the pool at once");
    // Something that is not a claim at a device's claim key keeps everyone from claiming it:
    // pool ls says so (on 9b5fbd6 it listed the device free), and revoke says what it cleared
    // (it said "was not claimed").
    let claimed = rt.block_on(pool::snapshot(&mut client, &cfg, None)).unwrap();
    let (_, token) = claimed.claims.values().next().cloned().unwrap();
    let held = Claim { box_name: "box-a".into(), device: "gpu0".into(), token, record: c4.record.clone() };
    assert!(rt.block_on(pool::release(&mut client, &cfg, &held, None)).unwrap());
    let claim_key = pool::Keys::new(&cfg.prefix).claim("box-a", "gpu0");
    rt.block_on(client.put(claim_key, "not json", None)).unwrap();
    let ls = rt.block_on(pool::admin::ls(&mut client, &cfg)).unwrap();
    assert_eq!(ls.iter().find(|e| e.box_name == "box-a").unwrap().state, "bad-claim", "{ls:?}");
    assert_eq!(claim(&mut client, &mut first), None);
    match rt.block_on(pool::admin::revoke(&mut client, &cfg, "box-a", "gpu0")).unwrap() {
        pool::admin::Revoked::Unreadable { why, .. } => assert!(why.contains("not a dxpu record"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(claim(&mut client, &mut first).is_some(), "claimable once the bad record is gone");
    assert_one_owner_at_a_time(&a.events());
}

/// A TCP relay in front of each etcd member that the test can cut: from then on it forwards
/// nothing either way (the connections stay open, as across a partition, so requests time
/// out rather than fail at once).
struct Relay {
    urls: Vec<String>,
    cut: Arc<AtomicBool>,
}

impl Relay {
    fn start(targets: &[String]) -> Relay {
        let cut = Arc::new(AtomicBool::new(false));
        let mut urls = Vec::new();
        for t in targets {
            let to: SocketAddr = t.trim_start_matches("http://").parse().unwrap();
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            urls.push(format!("http://{}", l.local_addr().unwrap()));
            let cut = cut.clone();
            std::thread::spawn(move || {
                for c in l.incoming() {
                    let Ok(c) = c else { return };
                    let Ok(up) = std::net::TcpStream::connect(to) else { continue };
                    for (mut from, mut into) in [(c.try_clone().unwrap(), up.try_clone().unwrap()), (up, c)] {
                        let cut = cut.clone();
                        std::thread::spawn(move || {
                            use std::io::{Read, Write};
                            let mut buf = [0u8; 16384];
                            while let Ok(n) = from.read(&mut buf) {
                                if n == 0 {
                                    return;
                                }
                                while cut.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(50));
                                }
                                if into.write_all(&buf[..n]).is_err() {
                                    return;
                                }
                            }
                        });
                    }
                }
            });
        }
        Relay { urls, cut }
    }
}

#[test]
fn a_host_cut_off_from_etcd_fences_itself_before_its_lease_expires_and_another_host_takes_the_device() {
    let _serial = dxpu_tests::serial();
    let Some(cluster) = cluster() else { return };
    let cfg = cluster.config();
    let a = PoolBox::start(cfg.clone(), "box-a", 1);
    let relay = Relay::start(&cluster.endpoints());
    let mut host_cfg = PoolConfig::new(relay.urls.clone());
    host_cfg.lease_ttl = Duration::from_secs(2);
    let fence = bridge_host::Fence::new();
    let fenced_at = Arc::new(Mutex::new(None));
    let on_fence = {
        let (fence, at) = (fence.clone(), fenced_at.clone());
        Box::new(move |_lease: i64, why: &str| {
            *at.lock().unwrap() = Some(Instant::now());
            fence.raise(why);
        })
    };
    let opts = pool::HostAgentOptions {
        host: "host-a".into(),
        want: 1,
        filter: Filter::default(),
        cool_down: Duration::from_secs(2),
    };
    let agent = pool::HostAgent::start(host_cfg, opts, on_fence).unwrap();
    let claim = match agent.events().recv_timeout(Duration::from_secs(10)).unwrap() {
        pool::HostEvent::Claimed { claim, .. } => claim,
        other => panic!("{other:?}"),
    };
    let mut o = host_options(a.addr, host_key("host-a"));
    o.device = claim.device.clone();
    o.token = Some(claim.token);
    o.fence = Some(fence.clone());
    o.dma_memory = 1 << 20;
    let mut d = RemoteDevice::attach(o).unwrap();
    assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
    // The partition: the host reaches the box, not etcd. Its device keeps answering until
    // the fence falls.
    relay.cut.store(true, Ordering::Relaxed);
    let cut_at = Instant::now();
    while d.removed().is_none() {
        assert!(cut_at.elapsed() < Duration::from_secs(3), "the host fences itself within its TTL");
        let id = d.config_read(0) & 0xffff;
        // The fence may fall during the read: all-ones then, and the device is gone.
        assert!(
            id == simgpu_abi::VENDOR_ID as u32 || d.removed().is_some(),
            "the device answers until fenced"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let fenced = fenced_at.lock().unwrap().expect("the fence callback ran");
    assert!(d.removed().unwrap().contains("fenced"), "{:?}", d.removed());
    // Another host claims it once the lease has expired at etcd, and the box lets it in.
    let rt = rt();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
    let mut first = |_: usize| 0;
    let req = ClaimRequest {
        host: "host-b",
        lease,
        filter: &Filter::default(),
        avoid: &HashSet::new(),
        records: &pool::RecordCache::default(),
    };
    let c2 = loop {
        if let Some(c) = rt.block_on(pool::claim_one(&mut client, &cfg, req, &mut first, None)).unwrap() {
            break c;
        }
        assert!(cut_at.elapsed() < Duration::from_secs(6), "the partitioned host's claim expires");
        std::thread::sleep(Duration::from_millis(20));
    };
    let expired = Instant::now();
    assert!(fenced < expired, "the host fenced itself before its claim could be taken");
    eprintln!(
        "fenced {:?} after the cut; the claim was taken over {:?} after the fence",
        fenced - cut_at,
        expired - fenced
    );
    let mut d2 = attach(a.addr, "host-b", &c2).unwrap();
    assert_eq!(d2.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
    d2.detach();
    drop(d);
    // The fenced host recovers once etcd is reachable again: a new lease, and the device
    // claimed anew once host-b gives it back.
    assert!(rt.block_on(pool::release(&mut client, &cfg, &c2, None)).unwrap());
    // Long enough for the host's next lease grant to time out (1 s requests) while cut.
    std::thread::sleep(Duration::from_millis(2500));
    relay.cut.store(false, Ordering::Relaxed);
    let end = Instant::now() + Duration::from_secs(15);
    let again = loop {
        match agent.events().recv_timeout(Duration::from_millis(100)) {
            Ok(pool::HostEvent::Claimed { claim, .. }) => break claim,
            Ok(_) | Err(_) => assert!(Instant::now() < end, "the fenced host claims again once etcd is back"),
        }
    };
    assert!(again.token > c2.token, "a new claim, with a newer token");
    drop(agent);
    let events = a.events();
    assert_one_owner_at_a_time(&events);
    let hosts: Vec<_> = events.iter().map(|e| (e.host.as_str(), e.attached)).collect();
    assert_eq!(&hosts[..3], &[("host-a", true), ("host-a", false), ("host-b", true)], "{events:?}");
}

#[test]
fn claims_survive_one_etcd_member_lost_and_fail_clearly_without_quorum_while_devices_keep_working() {
    let _serial = dxpu_tests::serial();
    let Some(mut cluster) = cluster() else { return };
    let mut cfg = cluster.config();
    cfg.request_timeout = Duration::from_millis(700);
    let a = PoolBox::start(cfg.clone(), "box-a", 2);
    let rt = rt();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    let lease = rt.block_on(client.lease_grant(60)).unwrap().id();
    let mut first = |_: usize| 0;
    let req = ClaimRequest {
        host: "host-a",
        lease,
        filter: &Filter::default(),
        avoid: &HashSet::new(),
        records: &pool::RecordCache::default(),
    };
    let c1 = rt.block_on(pool::claim_one(&mut client, &cfg, req, &mut first, None)).unwrap().unwrap();
    let mut d = attach(a.addr, "host-a", &c1).unwrap();
    cluster.kill(0);
    // Two of three: claims keep working (the client moves to a live member).
    let c2 = (0..20)
        .find_map(|_| {
            let r = rt.block_on(pool::claim_one(&mut client, &cfg, req, &mut first, None));
            if r.is_err() {
                std::thread::sleep(Duration::from_millis(100));
            }
            r.ok().flatten()
        })
        .expect("a claim with one member down");
    let mut d2 = attach(a.addr, "host-a", &c2).unwrap();
    cluster.kill(1);
    // One of three: no quorum. A new claim fails, saying etcd did; the attached devices carry
    // traffic all the while (neither endpoint's datapath waits on etcd).
    let t = Instant::now();
    let e = rt.block_on(pool::release(&mut client, &cfg, &c2, None)).expect_err("no write without quorum");
    assert!(e.to_string().contains("etcd"), "{e}");
    eprintln!("without quorum a pool write failed after {:?}: {e}", t.elapsed());
    let t = Instant::now();
    let mut reads = 0;
    while t.elapsed() < Duration::from_secs(2) {
        assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
        assert_eq!(d2.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
        reads += 2;
    }
    assert!(d.removed().is_none() && d2.removed().is_none());
    eprintln!("{reads} config reads answered in 2 s without quorum");
    d.detach();
    d2.detach();
}

fn ip(args: &str) {
    let out = std::process::Command::new("ip").args(args.split_whitespace()).output().unwrap();
    assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Runs `f` on a thread of its own inside network namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        netns::enter(&ns).unwrap();
        f()
    })
    .join()
    .unwrap()
}

#[test]
fn across_network_namespaces_a_host_cut_off_from_etcd_but_not_from_the_box_fences_itself() {
    let _serial = dxpu_tests::serial();
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    // Two namespaces: the box and etcd in a, the host in b; two veth links between them, the
    // box's (10.231.0.0/24) and etcd's (10.232.0.0/24), so that etcd's can be cut alone.
    let net = match dxpu_tests::Netns::create("pf", [10, 231, 0]) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("skipped: network namespaces unavailable: {e}");
            return;
        }
    };
    ip(&format!("link add vpfea netns {} type veth peer name vpfeb netns {}", net.a, net.b));
    ip(&format!("-n {} addr add 10.232.0.1/24 dev vpfea", net.a));
    ip(&format!("-n {} addr add 10.232.0.2/24 dev vpfeb", net.b));
    ip(&format!("-n {} link set vpfea up", net.a));
    ip(&format!("-n {} link set vpfeb up", net.b));
    let cluster = EtcdCluster::start_with(3, "10.232.0.1", &["ip", "netns", "exec", &net.a]).unwrap();
    let cfg = cluster.config();
    let c = cfg.clone();
    in_ns(&net.a, move || EtcdCluster::wait_ready_for(&c, Duration::from_secs(20))).unwrap();
    let a = PoolBox::start_in(cfg.clone(), "box-a", 1, Some((net.a.clone(), net.addr_a())));
    // The host, in b: its agent and its device.
    let (tx, rx) = mpsc::channel::<()>();
    let (cfg_b, box_addr) = (cfg.clone(), a.addr);
    let host = std::thread::spawn({
        let ns = net.b.clone();
        move || {
            netns::enter(&ns).unwrap();
            let mut host_cfg = cfg_b;
            host_cfg.lease_ttl = Duration::from_secs(2);
            let fence = bridge_host::Fence::new();
            let f = fence.clone();
            let opts = pool::HostAgentOptions {
                host: "host-a".into(),
                want: 1,
                filter: Filter::default(),
                cool_down: Duration::from_secs(2),
            };
            let agent = pool::HostAgent::start(host_cfg, opts, Box::new(move |_, why| f.raise(why))).unwrap();
            let claim = match agent.events().recv_timeout(Duration::from_secs(10)).unwrap() {
                pool::HostEvent::Claimed { claim, .. } => claim,
                other => panic!("{other:?}"),
            };
            let mut o = host_options(box_addr, host_key("host-a"));
            o.device = claim.device.clone();
            o.token = Some(claim.token);
            o.fence = Some(fence);
            o.dma_memory = 1 << 20;
            let mut d = RemoteDevice::attach(o).unwrap();
            assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
            tx.send(()).unwrap();
            let t = Instant::now();
            // Traffic until the fence falls (the cut comes from the test thread).
            while d.removed().is_none() {
                assert!(t.elapsed() < Duration::from_secs(6), "the host fences itself");
                let id = d.config_read(0) & 0xffff;
                assert!(id == simgpu_abi::VENDOR_ID as u32 || d.removed().is_some());
                std::thread::sleep(Duration::from_millis(10));
            }
            let why = d.removed().unwrap();
            drop(d);
            drop(agent);
            why
        }
    });
    rx.recv_timeout(Duration::from_secs(20)).expect("the host in b claims and attaches the device");
    let cut_at = Instant::now();
    ip(&format!("-n {} link set vpfeb down", net.b));
    let why = host.join().unwrap();
    let fenced = cut_at.elapsed();
    assert!(why.contains("fenced"), "{why}");
    // Another host, beside etcd, takes the device once the lease expired; the box lets it in.
    let (cfg_a, box_addr) = (cfg.clone(), a.addr);
    let taken = in_ns(&net.a, move || {
        let rt = rt();
        let mut client = rt.block_on(pool::connect(&cfg_a)).unwrap();
        let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
        let mut first = |_: usize| 0;
        let req = ClaimRequest {
            host: "host-b",
            lease,
            filter: &Filter::default(),
            avoid: &HashSet::new(),
            records: &pool::RecordCache::default(),
        };
        let c2 = loop {
            if let Some(c) = rt.block_on(pool::claim_one(&mut client, &cfg_a, req, &mut first, None)).unwrap()
            {
                break c;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let at = cut_at.elapsed();
        let mut d2 = attach(box_addr, "host-b", &c2).unwrap();
        assert_eq!(d2.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
        d2.detach();
        at
    });
    assert!(fenced < taken, "fenced {fenced:?} after the cut, the claim taken {taken:?} after it");
    eprintln!("netns: fenced {fenced:?} after the cut; another host claimed the device {taken:?} after it");
    let events = a.events();
    assert_one_owner_at_a_time(&events);
    let hosts: Vec<_> = events.iter().map(|e| (e.host.as_str(), e.attached)).collect();
    assert_eq!(&hosts[..3], &[("host-a", true), ("host-a", false), ("host-b", true)], "{events:?}");
    drop(a);
    drop(cluster);
}

/// A stock etcd (default flags: a client ping at most every 5 s, none without a stream):
/// a box and a host with 30 s leases, and a watch, through a quiet period three times as
/// long as the 4 s after which 9b5fbd6's client (a ping a second) was sent GOAWAY — its
/// watch ended, its box registered again with a new lease, its host's renewals failed. Then
/// the member is restarted under them: the watch resumes from its revision (each change
/// once), the box keeps its lease (no new registration), the host its claim.
#[test]
fn a_stock_etcd_keeps_quiet_agents_and_their_watches_and_a_restart_resumes_them() {
    let _serial = dxpu_tests::serial();
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let mut cluster = EtcdCluster::start_stock(1).expect("a stock etcd starts");
    let mut cfg = cluster.config();
    cfg.lease_ttl = Duration::from_secs(30);
    let record = DeviceRecord {
        advertise: "127.0.0.1:9".into(),
        vendor_id: simgpu_abi::VENDOR_ID,
        device_id: simgpu_abi::DEVICE_ID,
        class: 0x03_02_00,
        vram_bytes: 1 << 30,
        health: "ok".into(),
        allow: vec!["*".into()],
        since: 0,
    };
    let agent = BoxAgent::start(cfg.clone(), "box-q", vec![("gpu0".into(), record)]).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !agent.registered() {
        assert!(Instant::now() < end, "the box registers");
        std::thread::sleep(Duration::from_millis(20));
    }
    let fenced = Arc::new(AtomicBool::new(false));
    let f = fenced.clone();
    let opts = pool::HostAgentOptions {
        host: "host-a".into(),
        want: 1,
        filter: Filter::default(),
        cool_down: Duration::from_secs(2),
    };
    let host =
        pool::HostAgent::start(cfg.clone(), opts, Box::new(move |_, _| f.store(true, Ordering::SeqCst)))
            .unwrap();
    let claim = match host.events().recv_timeout(Duration::from_secs(10)).unwrap() {
        pool::HostEvent::Claimed { claim, .. } => claim,
        other => panic!("{other:?}"),
    };
    // The watch, on a thread of its own, every change it sees sent here.
    let (tx, changes) = mpsc::channel();
    let wcfg = cfg.clone();
    let watching = std::thread::spawn(move || {
        let rt = rt();
        let mut client = rt.block_on(pool::connect(&wcfg)).unwrap();
        rt.block_on(pool::admin::watch(&mut client, &wcfg, &mut |c| tx.send(c.clone()).is_ok()))
    });
    let rt = rt();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    let device_key = format!("{}/devices/box-q/gpu0", cfg.prefix);
    let revision_of = |client: &mut pool::etcd::Client, key: &str| {
        let got = rt.block_on(client.get(key.to_string(), None)).unwrap();
        got.kvs().first().map(|kv| (kv.create_revision(), kv.mod_revision(), kv.lease))
    };
    let registered = revision_of(&mut client, &device_key).expect("the device is registered");
    std::thread::sleep(Duration::from_secs(12));
    assert!(!watching.is_finished(), "the watch ended during the quiet period: {:?}", watching.join());
    assert_eq!(revision_of(&mut client, &device_key), Some(registered), "the box registered again");
    assert_eq!((agent.registrations(), agent.stream_resumes()), (1, 0));
    assert!(!fenced.load(Ordering::SeqCst), "the host fenced itself");
    let claim_key = format!("{}/claims/box-q/gpu0", cfg.prefix);
    assert_eq!(
        revision_of(&mut client, &claim_key).map(|r| r.0 as u64),
        Some(claim.token),
        "the claim moved"
    );
    rt.block_on(pool::admin::drain(&mut client, &cfg, "box-q", "gpu0")).unwrap();
    let seen = changes.recv_timeout(Duration::from_secs(5)).expect("the watch sees the drain");
    assert_eq!((seen.kind.as_str(), seen.event.as_str()), ("drain", "put"), "{seen:?}");

    // The member restarts under them: streams break, and resume.
    cluster.kill(0);
    std::thread::sleep(Duration::from_millis(500));
    cluster.restart(0).unwrap();
    cluster.wait_ready(Duration::from_secs(20)).unwrap();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    rt.block_on(pool::admin::undrain(&mut client, &cfg, "box-q", "gpu0")).unwrap();
    let seen = changes.recv_timeout(Duration::from_secs(15)).expect("the resumed watch sees the undrain");
    assert_eq!((seen.kind.as_str(), seen.event.as_str()), ("drain", "delete"), "{seen:?}");
    assert!(changes.recv_timeout(Duration::from_millis(500)).is_err(), "a change shown twice");
    let end = Instant::now() + Duration::from_secs(10);
    while agent.stream_resumes() == 0 || !agent.registered() {
        assert!(Instant::now() < end, "the box resumes its streams");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(agent.registrations(), 1, "the box registered again after the restart");
    assert_eq!(revision_of(&mut client, &device_key), Some(registered), "the device's key was rewritten");
    assert!(!fenced.load(Ordering::SeqCst), "the host fenced itself");
    drop(host);
    agent.stop();
}
