//! The pool with the endpoints as processes against a real three-member etcd cluster (the
//! test starts it; without Debian's `etcd-server` it skips, saying why): two `dxpu gpu`
//! boxes of four simulated GPUs, `dxpu host` claiming from them, `dxpu pool` watching; a
//! host and a box killed with SIGKILL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod common;
use common::conventional;

use pool::cluster::EtcdCluster;

const KEY_A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const TTL_S: u64 = 2;

/// Each test runs a cluster and endpoints with deadlines of a TTL: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn etcd_list(c: &EtcdCluster) -> String {
    c.endpoints().iter().map(|e| format!("{e:?}")).collect::<Vec<_>>().join(", ")
}

fn box_toml(c: &EtcdCluster, name: &str, port: u16, log: &Path) -> String {
    let mut t = format!(
        "listen = \"127.0.0.1:{port}\"\n[link]\nidle_timeout_ms = 500\n[[host]]\nname = \"host-a\"\nkey = \"{KEY_A}\"\n\
         [pool]\netcd = [{}]\nbox = \"{name}\"\nadvertise = \"127.0.0.1:{port}\"\nlease_ttl_s = {TTL_S}\nownership_log = {:?}\n",
        etcd_list(c),
        log.display()
    );
    for i in 0..4 {
        t += &format!("[[device]]\nname = \"gpu{i}\"\nsim = {{ vram_mib = 256 }}\nallow = [\"host-a\"]\n");
    }
    t
}

fn host_toml(c: &EtcdCluster, want: usize) -> String {
    format!(
        "[link]\nidle_timeout_ms = 500\n[pool]\netcd = [{}]\nhost = \"host-a\"\nkey = \"{KEY_A}\"\nwant = {want}\nlease_ttl_s = {TTL_S}\n",
        etcd_list(c)
    )
}

struct Proc(Child, PathBuf);

impl Proc {
    fn start(dir: &Path, name: &str, args: &[&str], config: &str) -> Proc {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(&cfg, config).unwrap();
        let log = dir.join(format!("{name}.log"));
        let child = dxpu()
            .args(args)
            .arg("--config")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Proc(child, log)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn ls(c: &EtcdCluster) -> Vec<serde_json::Value> {
    let out = dxpu().args(["pool", "--etcd", &c.endpoints().join(","), "ls", "--json"]).output().unwrap();
    assert!(out.status.success(), "dxpu pool ls: {}", String::from_utf8_lossy(&out.stderr));
    let v = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
    conventional("pool ls", &v);
    v.as_array().unwrap().clone()
}

fn until(what: &str, within: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

fn claimed(list: &[serde_json::Value]) -> Vec<(String, String, u64)> {
    list.iter()
        .filter(|e| e["state"] == "claimed")
        .map(|e| {
            (
                e["box"].as_str().unwrap().into(),
                e["device"].as_str().unwrap().into(),
                e["token"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn hosts_claim_from_two_boxes_and_a_killed_host_or_box_leaves_the_pool_within_ttl() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let cluster = EtcdCluster::start(3).unwrap();
    let dir = std::env::temp_dir().join(format!("dxpu-pool-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log_a, log_b) = (dir.join("box-a.jsonl"), dir.join("box-b.jsonl"));
    let mut box_a = Proc::start(&dir, "box-a", &["gpu"], &box_toml(&cluster, "box-a", free_port(), &log_a));
    let _box_b = Proc::start(&dir, "box-b", &["gpu"], &box_toml(&cluster, "box-b", free_port(), &log_b));
    until("both boxes register eight devices", Duration::from_secs(20), || ls(&cluster).len() == 8);
    // As etcdctl takes its endpoints: from the environment, as host:port, the flag after the
    // verb; the same listing.
    let hostports: Vec<String> =
        cluster.endpoints().iter().map(|e| e.trim_start_matches("http://").to_string()).collect();
    let env = dxpu()
        .args(["pool", "ls", "--json"])
        .env("DXPU_ETCD_ENDPOINTS", hostports.join(","))
        .output()
        .unwrap();
    assert!(env.status.success(), "{}", String::from_utf8_lossy(&env.stderr));
    let after = dxpu().args(["pool", "ls", "--json", "--etcd", &hostports.join(",")]).output().unwrap();
    assert!(after.status.success(), "{}", String::from_utf8_lossy(&after.stderr));
    for out in [&env.stdout, &after.stdout] {
        assert_eq!(serde_json::from_slice::<serde_json::Value>(out).unwrap().as_array().unwrap().len(), 8);
    }

    // A host with a workload: claims two, runs it on both, releases them, exits 0.
    let cfg = dir.join("host-w.toml");
    std::fs::write(&cfg, host_toml(&cluster, 2)).unwrap();
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&cfg).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dxpu host --workload with a pool: {err}");
    assert_eq!(err.matches("workload verified").count(), 2, "{err}");
    until("the workload's devices are free again", Duration::from_secs(3), || {
        claimed(&ls(&cluster)).is_empty()
    });

    // A host stopped by SIGTERM gives its devices back at once (its lease revoked), not at
    // the TTL's end.
    let host = Proc::start(&dir, "host-0", &["host"], &host_toml(&cluster, 2));
    until("the host claims two devices", Duration::from_secs(20), || claimed(&ls(&cluster)).len() == 2);
    rustix::process::kill_process(rustix::process::Pid::from_child(&host.0), rustix::process::Signal::TERM)
        .unwrap();
    // Within a second: sooner than the lease could expire (its last renewal at most TTL/3 ago).
    let t = until("a stopped host's devices are free", Duration::from_secs(1), || {
        claimed(&ls(&cluster)).is_empty()
    });
    eprintln!("a host stopped by SIGTERM released its devices in {t:?}");
    until("the host says it left", Duration::from_secs(2), || host.log().contains("left the pool"));
    drop(host);

    // A host killed: its devices are reset by their boxes and free within TTL + 1 s.
    let mut host = Proc::start(&dir, "host-1", &["host"], &host_toml(&cluster, 2));
    until("the host claims two devices", Duration::from_secs(20), || claimed(&ls(&cluster)).len() == 2);
    until("the host attaches both", Duration::from_secs(10), || {
        let l = std::fs::read_to_string(&log_a).unwrap_or_default()
            + &std::fs::read_to_string(&log_b).unwrap_or_default();
        l.matches("\"attached\"").count() >= 4
    });
    host.kill();
    let t = until("a killed host's devices are free", Duration::from_secs(TTL_S + 1), || {
        claimed(&ls(&cluster)).is_empty()
    });
    let released = |p: &Path| std::fs::read_to_string(p).unwrap_or_default().matches("\"released\"").count();
    until("the boxes reset the killed host's devices", Duration::from_secs(1), || {
        released(&log_a) + released(&log_b) >= 4
    });
    eprintln!("a killed host's devices free after {t:?} (TTL {TTL_S} s)");

    // A box killed: its devices leave the pool within TTL + 1 s; the host sees them removed,
    // and keeps the other box's.
    let host = Proc::start(&dir, "host-2", &["host"], &host_toml(&cluster, 3));
    until("the host claims three devices", Duration::from_secs(20), || claimed(&ls(&cluster)).len() == 3);
    // Until at least one of them is on each box.
    let on = |b: &str| claimed(&ls(&cluster)).iter().filter(|c| c.0 == b).count();
    if on("box-a") == 0 || on("box-b") == 0 {
        eprintln!("the claims fell on one box; killing that one anyway");
    }
    let before_b: Vec<_> = claimed(&ls(&cluster)).into_iter().filter(|c| c.0 == "box-b").collect();
    std::thread::sleep(Duration::from_millis(500));
    box_a.kill();
    let t = until("a killed box's devices leave the pool", Duration::from_secs(TTL_S + 1), || {
        ls(&cluster).iter().all(|e| e["box"] != "box-a")
    });
    eprintln!("a killed box's devices gone from pool ls after {t:?} (TTL {TTL_S} s)");
    if before_b.len() < 3 {
        until("the host reports the lost devices removed", Duration::from_secs(5), || {
            host.log().contains("removed")
        });
    }
    let after_b: Vec<_> = claimed(&ls(&cluster)).into_iter().filter(|c| c.0 == "box-b").collect();
    for c in &before_b {
        assert!(
            after_b.contains(c),
            "box-b's {}/{} (claim {}) untouched by box-a's death: {after_b:?}",
            c.0,
            c.1,
            c.2
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_claimed_device_gets_its_vfio_user_socket_loses_it_when_revoked_and_watch_shows_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let cluster = EtcdCluster::start(3).unwrap();
    let dir = std::env::temp_dir().join(format!("dxpu-pool-vfio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let mut config = box_toml(&cluster, "box-v", port, &dir.join("box-v.jsonl"));
    // One device is enough here.
    let cut = config.find("[[device]]\nname = \"gpu1\"").unwrap();
    config.truncate(cut);
    let box_sock = dir.join("box.sock");
    config += &format!("[control]\nsocket = {:?}\n", box_sock.display().to_string());
    let _b = Proc::start(&dir, "box-v", &["gpu"], &config);
    until("the box registers", Duration::from_secs(20), || ls(&cluster).len() == 1);
    let watch_out = dir.join("watch.jsonl");
    let mut watch = Proc(
        dxpu()
            .args(["pool", "--etcd", &cluster.endpoints().join(","), "watch", "--json"])
            .stdout(std::fs::File::create(&watch_out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
        dir.join("watch.err"),
    );
    std::thread::sleep(Duration::from_millis(300));
    let sockets = dir.join("run");
    std::fs::create_dir_all(&sockets).unwrap();
    let ctl_sock = dir.join("host.sock");
    let host = format!("[control]\nsocket = {:?}\n", ctl_sock.display().to_string())
        + &host_toml(&cluster, 1)
        + &format!("vfio_user_dir = {:?}\n", sockets.display().to_string())
        + "vfio_user_socket_mode = 0o660\nvfio_user_socket_group = \"root\"\n";
    let h = Proc::start(&dir, "host-v", &["host"], &host);
    let sock = sockets.join("box-v-gpu0.sock");
    until("the claimed device's socket appears", Duration::from_secs(20), || sock.exists());
    let token = claimed(&ls(&cluster))[0].2;
    // The pool host's control socket says what it holds, under which claim; its devices
    // come from claims, so a detach is refused.
    let ctl = |args: &[&str]| -> serde_json::Value {
        let out = dxpu().args(["ctl", "--json", "--socket"]).arg(&ctl_sock).args(args).output().unwrap();
        let v = serde_json::from_slice(&out.stdout).unwrap();
        conventional("ctl", &v);
        v
    };
    let devs = ctl(&["devices"]);
    assert_eq!(devs[0]["name"], "box-v/gpu0", "{devs}");
    assert_eq!(devs[0]["token"], token, "{devs}");
    assert_eq!(devs[0]["vfio_user_socket"], sock.display().to_string());
    assert_eq!(ctl(&["detach", "box-v/gpu0"])["error"]["code"], -32000);
    assert_eq!(ctl(&["sessions"])[0]["peer"], format!("127.0.0.1:{port}"));
    // The socket as [pool] says: mode 0660, the group given.
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let m = std::fs::metadata(&sock).unwrap();
        assert_eq!((m.permissions().mode() & 0o777, m.gid()), (0o660, 0), "{sock:?}");
    }
    let out = dxpu()
        .args(["pool", "--etcd", &cluster.endpoints().join(","), "revoke", "box-v/gpu0"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("claim {token} of host-a revoked")));
    until("the revoked device's socket goes", Duration::from_secs(3), || !sock.exists());
    // The box's ownership log names who revoked the claim: user, machine, process, command.
    let released = std::fs::read_to_string(dir.join("box-v.jsonl")).unwrap_or_default();
    assert!(
        released.lines().any(|l| l.contains("\"released\"")
            && l.contains("revoked by")
            && l.contains("(dxpu pool revoke)")),
        "{released}"
    );
    // The host claims it again (after its cool-down), with a newer token, and serves it again.
    until("the device is claimed again", Duration::from_secs(10), || {
        claimed(&ls(&cluster)).first().is_some_and(|c| c.2 > token)
    });
    until("its socket comes back", Duration::from_secs(10), || sock.exists());
    assert!(h.log().contains("removed"), "{}", h.log());
    pool_series(&ctl_sock, &box_sock);
    watch.kill();
    let changes: Vec<serde_json::Value> = std::fs::read_to_string(&watch_out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for c in &changes {
        conventional("pool watch", c);
    }
    let claims: Vec<(&str, &str)> = changes
        .iter()
        .filter(|c| c["kind"] == "claim")
        .map(|c| (c["event"].as_str().unwrap(), c["host"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(&claims[..3], &[("put", "host-a"), ("delete", "host-a"), ("put", "host-a")], "{changes:?}");
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Both pool agents' series: the host's two claims and their time, a release, its device up;
/// the box's lease kept alive. (The TTL is 2 s: a renewal every 0.67 s.)
fn pool_series(ctl_sock: &Path, box_sock: &Path) {
    let scrape = |s: &Path| -> String {
        let out = dxpu().args(["ctl", "--json", "--socket"]).arg(s).arg("metrics").output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_str()
            .map(str::to_string)
            .or_else(|| v["result"].as_str().map(str::to_string))
            .unwrap_or_else(|| panic!("{v}"))
    };
    let value = |text: &str, series: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
    };
    let hm = scrape(ctl_sock);
    assert!(value(&hm, "dxpu_pool_claims_total{role=\"host\"}") >= 2.0, "{hm}");
    assert!(value(&hm, "dxpu_pool_claim_seconds_total{role=\"host\"}") > 0.0, "{hm}");
    assert!(value(&hm, "dxpu_pool_releases_total{role=\"host\"}") >= 1.0, "{hm}");
    assert!(value(&hm, "dxpu_pool_leases_total{role=\"host\"}") >= 1.0, "{hm}");
    assert!(value(&hm, "dxpu_pool_lease_renewals_total{role=\"host\"}") >= 1.0, "{hm}");
    assert_eq!(value(&hm, "dxpu_device_up{device=\"box-v/gpu0\"}"), 1.0, "{hm}");
    let bm = scrape(box_sock);
    assert!(value(&bm, "dxpu_pool_lease_renewals_total{role=\"box\"}") >= 1.0, "{bm}");
    assert_eq!(value(&bm, "dxpu_pool_fences_total{role=\"box\"}"), 0.0, "{bm}");
    // Both hold their leases: ready (`/readyz`'s answer).
    for s in [ctl_sock, box_sock] {
        let out = dxpu().args(["ctl", "--json", "--socket"]).arg(s).arg("status").output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            (&v["ready"], &v["not_ready"]),
            (&serde_json::json!(true), &serde_json::Value::Null),
            "{v}"
        );
    }
}

/// SIGHUP (what `systemctl reload` sends) to a pool box and a pool host: each keeps running
/// and its claims, and says what it reloaded; a change a pool host takes only at a start is
/// refused by `dxpu ctl reload` (exit status 1, saying what changed), the host running on.
#[test]
fn a_pool_host_and_a_pool_box_ride_a_hang_up_and_say_what_they_reloaded() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let cluster = EtcdCluster::start(1).unwrap();
    let dir = std::env::temp_dir().join(format!("dxpu-pool-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut gpu =
        Proc::start(&dir, "box-h", &["gpu"], &box_toml(&cluster, "box-h", free_port(), &dir.join("h.jsonl")));
    until("the box registers", Duration::from_secs(20), || ls(&cluster).len() == 4);
    let sock = dir.join("host.sock");
    let host_cfg =
        |want: usize| format!("{}[control]\nsocket = {:?}\n", host_toml(&cluster, want), sock.display());
    let mut host = Proc::start(&dir, "host-h", &["host"], &host_cfg(1));
    until("the host claims one", Duration::from_secs(20), || claimed(&ls(&cluster)).len() == 1);
    let before = claimed(&ls(&cluster));
    let hup = |p: &Proc| {
        rustix::process::kill_process(rustix::process::Pid::from_child(&p.0), rustix::process::Signal::HUP)
            .unwrap()
    };
    hup(&host);
    hup(&gpu);
    until("both say what they reloaded", Duration::from_secs(5), || {
        host.log().contains("reloaded") && gpu.log().contains("reloaded")
    });
    assert!(host.log().contains("nothing changed"), "{}", host.log());
    assert!(host.0.try_wait().unwrap().is_none() && gpu.0.try_wait().unwrap().is_none(), "{}", host.log());
    assert_eq!(claimed(&ls(&cluster)), before, "a hang-up changed the claims");
    // Its devices as `dxpu ctl --json devices` gives them, by docs/cli.md's conventions: the
    // claim's 64-bit lease ID a string (a JSON number past 2^53 loses digits).
    let out = dxpu().args(["ctl", "--json", "--socket"]).arg(&sock).arg("devices").output().unwrap();
    let devices: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    common::conventional("pool host's devices", &devices);
    assert!(devices[0]["lease"].as_str().is_some_and(|l| i64::from_str_radix(l, 16).is_ok()), "{devices}");
    // A restart-only change: `ctl reload` says so and fails; the host runs on, its claim kept.
    std::fs::write(dir.join("host-h.toml"), host_cfg(2)).unwrap();
    let out = dxpu().args(["ctl", "--socket"]).arg(&sock).arg("reload").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("[pool]") && err.contains("needs a restart"), "{err}");
    hup(&host);
    until("the host says the hang-up was refused", Duration::from_secs(5), || {
        host.log().contains("reload refused")
    });
    assert!(host.0.try_wait().unwrap().is_none(), "{}", host.log());
    assert_eq!(claimed(&ls(&cluster)), before);
    host.kill();
    gpu.kill();
}

/// README's "A pool in three commands", as written: its files (`contrib/pool/`) against an
/// etcd of the test's own (the files' 127.0.0.1:2379 and the box's port 7440 moved to free
/// ones): the box registers its device, and the host claims it, runs the workload, verifies
/// it and releases the claim (exit 0).
#[test]
fn the_readmes_pool_in_three_commands_runs_as_written() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let section = readme.split("## A pool in three commands").nth(1).unwrap();
    let commands = section.split("```sh").nth(1).unwrap().split("```").next().unwrap();
    for f in ["contrib/pool/box-a.toml", "contrib/pool/host-a.toml"] {
        assert!(commands.contains(&format!("--config {f}")), "README's pool commands name {f}: {commands}");
        let check = dxpu()
            .args([if f.contains("box") { "gpu" } else { "host" }, "--check", "--config"])
            .arg(root.join(f))
            .output()
            .unwrap();
        assert!(check.status.success(), "{f}: {}", String::from_utf8_lossy(&check.stderr));
    }
    if pool::cluster::etcd_binary().is_none() {
        eprintln!("skipped the run: etcd not found (Debian package etcd-server; .ci/run installs it)");
        return;
    }
    let cluster = EtcdCluster::start(1).unwrap();
    let etcd = cluster.endpoints()[0].trim_start_matches("http://").to_string();
    let port = free_port();
    let moved = |f: &str| {
        std::fs::read_to_string(root.join(f))
            .unwrap()
            .replace("127.0.0.1:2379", &etcd)
            .replace("127.0.0.1:7440", &format!("127.0.0.1:{port}"))
    };
    let dir = std::env::temp_dir().join(format!("dxpu-pool-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _gpu = Proc::start(&dir, "box-a", &["gpu"], &moved("contrib/pool/box-a.toml"));
    until("the box registers its device", Duration::from_secs(20), || ls(&cluster).len() == 1);
    let host = dir.join("host-a.toml");
    std::fs::write(&host, moved("contrib/pool/host-a.toml")).unwrap();
    let out = dxpu().args(["host", "--workload", "--config"]).arg(&host).output().unwrap();
    assert!(out.status.success(), "the host's workload: {}", String::from_utf8_lossy(&out.stderr));
    until("the claim is released", Duration::from_secs(10), || claimed(&ls(&cluster)).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
