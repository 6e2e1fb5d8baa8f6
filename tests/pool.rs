//! The pool against a real three-member etcd cluster (started here from Debian's
//! `etcd-server`; without it every test skips, saying why): two boxes of four simulated GPUs
//! and three hosts claiming, attaching through the link with their fencing tokens, and
//! releasing. Who owned what is read from the boxes' own ownership logs, not from etcd.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "pool_common.rs"]
mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use bridge_host::RemoteDevice;
use driver::PciFunction;
use dxpu_tests::host_options;
use pool::cluster::EtcdCluster;
use pool::{BoxAgent, Claim, ClaimRequest, DeviceRecord, Filter};

use common::*;

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
    let by = "ops@console pid 77 (dxpu pool revoke)";
    let revoked = rt.block_on(pool::admin::revoke(&mut client, &cfg, "box-a", "gpu0", by)).unwrap();
    assert_eq!(revoked, pool::admin::Revoked::Claim { host: "host-a".to_string(), token: c1.token });
    let end = Instant::now() + Duration::from_secs(3);
    while d.removed().is_none() {
        assert!(Instant::now() < end, "the revoked host is cut off within 3 s");
        let _ = d.config_read(0);
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(d);
    // The box's ownership record of the release names who revoked the claim.
    let released = a.events().into_iter().rfind(|e| !e.attached).expect("a release recorded");
    assert!(released.why.contains(&format!("revoked by {by}")), "{released:?}");
    // A new claim has a larger token; the old one is now stale.
    let c2 = claim(&mut client, &mut first).expect("the revoked device is free again");
    assert!(c2.token > c1.token);
    // Refused as stale once the box has seen the new claim, as revoked (by whom) before.
    let e = attach(a.addr, "host-a", &c1).err().expect("the stale token is refused");
    assert!(e.to_string().contains("stale") || e.to_string().contains(&format!("revoked by {by}")), "{e}");
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
    // Under the box's own lease, as its box writes it (a record under no live box's lease is
    // never claimed).
    let lease = rt.block_on(client.get(key.clone(), None)).unwrap().kvs()[0].lease;
    let under = Some(pool::etcd::PutOptions::new().with_lease(lease));
    rt.block_on(client.put(key, serde_json::to_vec(&moved).unwrap(), under)).unwrap();
    let c4 = claim(&mut client, &mut first).expect("claimed again");
    assert_eq!(c4.record.advertise, "127.0.0.1:9");
    unhealthy_is_listed_and_not_claimed(&cfg, &rt, &mut client, &c4.record, &mut |c| claim(c, &mut first));
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
    match rt.block_on(pool::admin::revoke(&mut client, &cfg, "box-a", "gpu0", by)).unwrap() {
        pool::admin::Revoked::Unreadable { why, .. } => assert!(why.contains("not a dxpu record"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(claim(&mut client, &mut first).is_some(), "claimable once the bad record is gone");
    assert_one_owner_at_a_time(&a.events());
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
    // A member that takes connections and never answers (an etcd still starting, or hung),
    // and one that closes each at once, first in the list: a read goes on past it, a write
    // sent to the hung one fails with it (it may have landed), and what follows goes to a
    // live member, the first time.
    let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closing = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closing_at = closing.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in closing.incoming() {
            drop(c);
        }
    });
    for (what, at) in [("hung", hung.local_addr().unwrap()), ("closing", closing_at)] {
        let mut past = cfg.clone();
        past.etcd.insert(0, format!("http://{at}"));
        for first_is_a_write in [false, true] {
            let mut c = rt.block_on(pool::connect(&past)).unwrap();
            let t = Instant::now();
            if first_is_a_write {
                let put = rt.block_on(c.put("/hung-probe", "1", None));
                assert!(what != "hung" || put.is_err(), "a write that met only the hung member: {put:?}");
            } else {
                rt.block_on(pool::admin::ls(&mut c, &past))
                    .unwrap_or_else(|e| panic!("a read past a {what} member: {e}"));
            }
            eprintln!("first request past a {what} member (write: {first_is_a_write}): {:?}", t.elapsed());
            for i in 0..5 {
                let t = Instant::now();
                let put = rt.block_on(c.put("/hung-probe", "1", None));
                assert!(
                    put.is_ok() && t.elapsed() < cfg.request_timeout,
                    "write {i} after the {what} member: {put:?}"
                );
            }
        }
    }
    cluster.kill(0);
    let killed = Instant::now();
    // Two of three: once they have a leader (the killed member may have been it; without
    // one a request fails at once, as docs/pool.md says), every request succeeds the first
    // time, on the client that used the killed member and on new ones whose first endpoint
    // is it (the client moves to a live member; `dxpu pool ls` once failed in CI with a
    // member not yet listening).
    cluster.wait_ready(Duration::from_secs(10)).expect("two members elect a leader");
    eprintln!("two members had a leader {:?} after the kill", killed.elapsed());
    for i in 0..20 {
        let listed = rt.block_on(pool::admin::ls(&mut client, &cfg));
        assert!(listed.is_ok(), "pool ls {i} with one member down: {:?}", listed.err());
        let mut fresh = rt.block_on(pool::connect(&cfg)).unwrap();
        let listed = rt.block_on(pool::admin::ls(&mut fresh, &cfg));
        assert!(listed.is_ok(), "a new client's pool ls {i} with one member down: {:?}", listed.err());
    }
    let c2 = rt
        .block_on(pool::claim_one(&mut client, &cfg, req, &mut first, None))
        .expect("a claim with one member down")
        .expect("a free device");
    // The box confirms the claim from its watch of the claims, which was on the killed
    // member as often as not and is reopened on a live one: an attach meanwhile is refused
    // ("could not confirm claim … (etcd unreachable?)"). Alone this took under 3 s; beside
    // the rest of the suite on two cores it once took longer. It must come back within 15 s.
    let mut d2 = loop {
        match attach(a.addr, "host-a", &c2) {
            Ok(d) => break d,
            Err(e) if killed.elapsed() < Duration::from_secs(15) => {
                eprintln!("attach with one member down, {:?} after the kill: {e}", killed.elapsed());
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!("the box did not confirm a claim 15 s after losing one etcd member: {e}"),
        }
    };
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
    let record = sim_record("127.0.0.1:9");
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

/// The record of a simulated GPU, open to every host, served at `advertise`.
fn sim_record(advertise: &str) -> DeviceRecord {
    DeviceRecord {
        advertise: advertise.into(),
        vendor_id: simgpu_abi::VENDOR_ID,
        device_id: simgpu_abi::DEVICE_ID,
        class: 0x03_02_00,
        vram_bytes: 1 << 30,
        health: "ok".into(),
        allow: vec!["*".into()],
        since: 0,
    }
}

/// A box reports a device unhealthy: `pool ls` says so and nobody claims it; once the box
/// stops, its device leaves the pool at once.
fn unhealthy_is_listed_and_not_claimed(
    cfg: &pool::PoolConfig,
    rt: &tokio::runtime::Runtime,
    client: &mut pool::etcd::Client,
    like: &DeviceRecord,
    claim: &mut dyn FnMut(&mut pool::etcd::Client) -> Option<Claim>,
) {
    let (h, end) = (unhealthy_box(cfg, like), Instant::now() + Duration::from_secs(10));
    let state = |client: &mut pool::etcd::Client| {
        let ls = rt.block_on(pool::admin::ls(client, cfg)).unwrap();
        ls.into_iter().find(|e| e.box_name == "box-h").map(|e| e.state)
    };
    while state(client).as_deref() != Some("unhealthy") {
        assert!(Instant::now() < end, "the unhealthy device is listed so");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(claim(client), None, "an unhealthy device is not claimed");
    h.stop();
    assert_eq!(state(client), None, "a box that stops leaves the pool at once");
}

/// A box "box-h" serving one device (a copy of `like`'s record at 127.0.0.1:9), registered,
/// which then reports it unhealthy.
fn unhealthy_box(cfg: &pool::PoolConfig, like: &DeviceRecord) -> BoxAgent {
    let record = DeviceRecord { advertise: "127.0.0.1:9".into(), ..like.clone() };
    let h = BoxAgent::start(cfg.clone(), "box-h", vec![("gpu0".into(), record)]).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !h.registered() {
        assert!(Instant::now() < end, "box-h registers");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut report = h.health_reporter();
    report("gpu0", "does not answer config reads after its reset (Vendor ID 0xffff)");
    h
}

/// A second box agent started with the name a running box holds registers nothing — the
/// first keeps its devices in `pool ls` — and takes the name once the first has stopped. A
/// device record no live box holds (a forged one, here) shows `no-box` and is never
/// claimed; an unreadable drain shows `bad-drain`; an unreadable `boxes/{box}` record holds its
/// name until deleted. On 166c20c the second box overwrote the
/// first's records under its own lease, and when it died the live first box had no device in
/// `pool ls` for 30 s, with nothing logged.
#[test]
fn a_second_box_with_a_name_in_use_registers_nothing() {
    let _serial = dxpu_tests::serial();
    let Some(cluster) = cluster() else { return };
    let cfg = cluster.config();
    let wait = |what: &str, ok: &dyn Fn() -> bool| {
        let end = Instant::now() + Duration::from_secs(15);
        while !ok() {
            assert!(Instant::now() < end, "{what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let first =
        BoxAgent::start(cfg.clone(), "box-n", vec![("gpu0".into(), sim_record("127.0.0.1:1001"))]).unwrap();
    wait("the first box registers", &|| first.registered());
    let second =
        BoxAgent::start(cfg.clone(), "box-n", vec![("gpu0".into(), sim_record("127.0.0.1:1002"))]).unwrap();
    let rt = rt();
    let mut client = rt.block_on(pool::connect(&cfg)).unwrap();
    // A name held by a record dxpu cannot read (not JSON, under no lease) is held too.
    let unreadable = format!("{}/boxes/box-u", cfg.prefix);
    rt.block_on(client.put(unreadable.clone(), b"not json".to_vec(), None)).unwrap();
    let third =
        BoxAgent::start(cfg.clone(), "box-u", vec![("gpu0".into(), sim_record("127.0.0.1:1003"))]).unwrap();
    let ls = |client: &mut pool::etcd::Client| rt.block_on(pool::admin::ls(client, &cfg)).unwrap();
    let device_of = |client: &mut pool::etcd::Client| {
        let got = rt.block_on(client.get(format!("{}/devices/box-n/gpu0", cfg.prefix), None)).unwrap();
        got.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_default()
    };
    // Several of the second's attempts: it never registers, the first's record stays.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!second.registered(), "the second box registered over the first");
    assert!(!third.registered(), "a box registered over an unreadable record of its name");
    assert!(device_of(&mut client).contains("127.0.0.1:1001"), "{}", device_of(&mut client));
    let e = ls(&mut client);
    let n: Vec<_> = e.iter().filter(|e| e.box_name == "box-n").collect();
    assert_eq!(n.len(), 1, "{e:?}");
    assert_eq!(n[0].state, "free", "{e:?}");
    // The first stops (its lease revoked): the second takes the name.
    first.stop();
    wait("the second box registers once the name is free", &|| second.registered());
    rt.block_on(client.delete(unreadable, None)).unwrap();
    wait("box-u registers once the unreadable record is deleted", &|| third.registered());
    third.stop();
    assert!(device_of(&mut client).contains("127.0.0.1:1002"));
    // A forged device record of a box no agent runs, and an unreadable drain of box-n's.
    rt.block_on(client.put(
        format!("{}/devices/box-f/gpu0", cfg.prefix),
        serde_json::to_vec(&sim_record("127.0.0.1:9")).unwrap(),
        None,
    ))
    .unwrap();
    rt.block_on(client.put(format!("{}/drain/box-n/gpu0", cfg.prefix), b"not json".to_vec(), None)).unwrap();
    let e = ls(&mut client);
    let state = |b: &str| e.iter().find(|x| x.box_name == b).map(|x| x.state.clone()).unwrap_or_default();
    assert_eq!(state("box-f"), "no-box", "{e:?}");
    assert_eq!(state("box-n"), "bad-drain", "{e:?}");
    // A host claims neither.
    let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
    let got = rt
        .block_on(pool::claim_one(
            &mut client,
            &cfg,
            ClaimRequest {
                host: "host-a",
                lease,
                filter: &Filter::default(),
                avoid: &HashSet::new(),
                records: &pool::RecordCache::default(),
            },
            &mut |_| 0,
            None,
        ))
        .unwrap();
    assert!(got.is_none(), "claimed {got:?}");
    assert!(rt.block_on(pool::admin::undrain(&mut client, &cfg, "box-n", "gpu0")).unwrap());
    assert_eq!(ls(&mut client).iter().find(|x| x.box_name == "box-n").unwrap().state, "free");
    second.stop();
}
