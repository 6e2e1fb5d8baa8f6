//! The pool against a secured etcd: TLS on etcd's client port with client certificates
//! required, and etcd's own users and roles (`auth enable`). A box registers, a host claims,
//! attaches through the link with its token and releases, each over the secured client; a
//! wrong CA, a missing client certificate and a wrong password are each refused, saying what
//! was wrong. etcd (Debian's `etcd-server`) and `openssl` are started and run here; without
//! them the tests skip, saying why.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[path = "pool_common.rs"]
mod common;

use std::collections::HashSet;
use std::time::Duration;

use driver::PciFunction;
use pool::cluster::EtcdCluster;
use pool::pki::TestPki;
use pool::{ClaimRequest, Filter, PoolConfig};

use common::*;

/// The tests' PKI in a directory of their own, or None (and why, printed).
fn pki(tag: &str) -> Option<(TestPki, std::path::PathBuf)> {
    if pool::cluster::etcd_binary().is_none() || pool::pki::openssl_binary().is_none() {
        eprintln!(
            "skipped: etcd or openssl not found (Debian packages etcd-server, openssl; .ci/run installs them)"
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!("dxpu-pki-{tag}-{}", std::process::id()));
    Some((TestPki::generate(&dir).expect("openssl makes the test PKI"), dir))
}

/// A box registers its device through `cfg`'s client; host-a claims it, attaches with the
/// claim's token (the box confirms it in etcd, through its own client) and reads its
/// Vendor ID, then releases the claim.
fn register_claim_attach_release(cfg: &PoolConfig) {
    let b = PoolBox::start(cfg.clone(), "box-s", 1);
    let rt = rt();
    let mut client = rt.block_on(pool::connect(cfg)).unwrap();
    let lease = rt.block_on(client.lease_grant(30)).unwrap().id();
    let records = pool::RecordCache::default();
    let mut first = |_: usize| 0;
    let mut claim = None;
    let end = std::time::Instant::now() + Duration::from_secs(10);
    while claim.is_none() {
        assert!(std::time::Instant::now() < end, "the box's device never became claimable");
        let req = ClaimRequest {
            host: "host-a",
            lease,
            filter: &Filter::default(),
            avoid: &HashSet::new(),
            records: &records,
        };
        claim = rt.block_on(pool::claim_one(&mut client, cfg, req, &mut first, None)).unwrap();
        if claim.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let claim = claim.unwrap();
    let mut d = attach(b.addr, "host-a", &claim).unwrap();
    assert_eq!(d.config_read(0) & 0xffff, simgpu_abi::VENDOR_ID as u32);
    d.detach();
    assert!(rt.block_on(pool::release(&mut client, cfg, &claim, None)).unwrap(), "the claim is released");
    drop(b);
}

/// What a client with `cfg` gets from its first write (connections open on first use).
fn first_write(cfg: &PoolConfig) -> String {
    match EtcdCluster::wait_ready_for(cfg, Duration::from_secs(2)) {
        Ok(()) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn over_tls_with_client_certificates_a_box_and_a_host_register_claim_and_release() {
    let _serial = dxpu_tests::serial();
    let Some((pki, dir)) = pki("tls") else { return };
    let cluster = EtcdCluster::start_tls(1, &pki).expect("etcd with TLS and client certificates starts");
    let cfg = cluster.config();
    assert!(cfg.etcd[0].starts_with("https://"), "{:?}", cfg.etcd);
    register_claim_attach_release(&cfg);

    // A CA that did not sign etcd's certificate: refused, saying it is the certificate.
    let mut wrong_ca = cfg.clone();
    wrong_ca.security.cacert = Some(pki.other_ca.clone());
    let e = first_write(&wrong_ca);
    eprintln!("a wrong CA: {e}");
    assert!(e.contains("certificate") || e.contains("UnknownIssuer"), "{e}");
    // No client certificate: etcd refuses the handshake.
    let mut anonymous = cfg.clone();
    (anonymous.security.cert, anonymous.security.key) = (None, None);
    let e = first_write(&anonymous);
    eprintln!("no client certificate: {e}");
    assert!(e.contains("etcd must accept this client's certificate"), "{e}");
    // Plain HTTP to the TLS port: refused too.
    let mut plain = PoolConfig::new(cfg.etcd.iter().map(|u| u.replacen("https://", "http://", 1)).collect());
    plain.request_timeout = Duration::from_millis(500);
    let e = first_write(&plain);
    eprintln!("plain HTTP to the TLS port: {e}");
    assert!(e.contains("give https:// endpoints and cacert"), "{e}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_etcd_users_a_role_holding_only_the_prefix_suffices_and_a_wrong_password_is_refused() {
    let _serial = dxpu_tests::serial();
    let Some(cluster) = cluster_of_one() else { return };
    let admin = cluster.config();
    let rt = rt();
    let mut c = rt.block_on(pool::connect(&admin)).unwrap();
    // As an operator's etcdctl would: root, a role for the pool's prefix only, a user in it.
    rt.block_on(async {
        c.user_add("root", "root-pw").await?;
        c.role_add("root").await?;
        c.user_grant_role("root", "root").await?;
        c.role_add("dxpu").await?;
        c.role_grant_prefix("dxpu", "/dxpu/").await?;
        c.user_add("dxpu", "dxpu-pw").await?;
        c.user_grant_role("dxpu", "dxpu").await?;
        c.auth_enable().await
    })
    .unwrap();
    let mut cfg = admin.clone();
    cfg.security.user = Some("dxpu".into());
    cfg.security.password = Some("dxpu-pw".into());
    register_claim_attach_release(&cfg);

    // A wrong password: refused at connect, naming the user.
    let mut wrong = cfg.clone();
    wrong.security.password = Some("not-it".into());
    let e = rt.block_on(pool::connect(&wrong)).err().expect("a wrong password is refused").to_string();
    eprintln!("a wrong password: {e}");
    assert!(e.contains("etcd refused user \"dxpu\""), "{e}");
    // No user at all: etcd says the request needs one.
    let e = rt.block_on(async {
        let mut c = pool::connect(&admin).await?;
        c.put("/dxpu/x", "1", None).await.map_err(|e| pool::PoolError::Config(e.to_string()))
    });
    assert!(e.is_err(), "etcd took a write without a user once auth was on");
    // The role's user cannot write outside the prefix.
    let e = rt.block_on(async {
        let mut c = pool::connect(&cfg).await?;
        c.put("/elsewhere", "1", None).await.map_err(|e| pool::PoolError::Config(e.to_string()))
    });
    assert!(e.err().is_some_and(|e| e.to_string().contains("permission denied")), "outside the prefix");
}

fn cluster_of_one() -> Option<EtcdCluster> {
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return None;
    }
    Some(EtcdCluster::start(1).expect("etcd starts"))
}
