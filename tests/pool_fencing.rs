//! Fencing against a real etcd cluster: a host cut off from etcd (by a relay the test cuts,
//! and across network namespaces with etcd's links down) fences itself before its lease
//! expires, and another host takes the device. Skips, saying why, without etcd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "pool_common.rs"]
mod common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use driver::PciFunction;
use dxpu_tests::host_options;
use pool::cluster::EtcdCluster;
use pool::{ClaimRequest, Filter, PoolConfig};

use common::*;

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
