//! What the process-level tests of the endpoints share: keys, ports, configuration files,
//! endpoint processes with their logs, `dxpu ctl`, metrics scrapes.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

pub const KEY_A: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
pub const KEY_B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

/// Endpoint processes share two cores: one test at a time.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dxpu-ops-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn device(name: &str, allow: &str) -> String {
    format!("[[device]]\nname = \"{name}\"\nsim = {{ vram_mib = 256 }}\nallow = [{allow}]\n")
}

pub fn gpu_toml(dir: &Path, port: u16, metrics: u16, devices: &[&str]) -> String {
    let mut t = format!(
        "listen = \"127.0.0.1:{port}\"\n[link]\nidle_timeout_ms = 1000\n[control]\nsocket = \"{}\"\n\
         [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
         [[host]]\nname = \"host-a\"\nkey = \"{KEY_A}\"\n[[host]]\nname = \"host-b\"\nkey = \"{KEY_B}\"\n",
        dir.join("gpu.sock").display()
    );
    for d in devices {
        t.push_str(&device(d, "\"host-a\", \"host-b\""));
    }
    t
}

pub fn host_toml(dir: &Path, port: u16, metrics: u16, devices: &[&str]) -> String {
    let mut t = format!(
        "[control]\nsocket = \"{}\"\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n",
        dir.join("host.sock").display()
    );
    for d in devices {
        t.push_str(&format!(
            "[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"{d}\"\nkey = \"{KEY_A}\"\n"
        ));
    }
    t
}

/// A box (`dxpu gpu`) exporting `exports` and a host (`dxpu host`) attaching `attaches` from
/// it over 127.0.0.1, each started from its configuration file in `dir` and serving its
/// control socket; `host_extra` is added to the host's configuration (a `[link]` section).
pub struct BoxAndHost {
    pub gpu: Proc,
    pub host: Proc,
    /// The box's and the host's control sockets.
    pub gs: PathBuf,
    pub hs: PathBuf,
    /// The box's and the host's configuration files.
    pub gcfg: PathBuf,
    pub hcfg: PathBuf,
    /// The box's UDP port, and the box's and the host's metrics ports.
    pub port: u16,
    pub gm: u16,
    pub hm: u16,
}

pub fn box_and_host(dir: &Path, exports: &[&str], attaches: &[&str], host_extra: &str) -> BoxAndHost {
    let (port, gm, hm) = (free_udp_port(), free_tcp_port(), free_tcp_port());
    let (gcfg, hcfg) = (dir.join("gpu.toml"), dir.join("host.toml"));
    std::fs::write(&gcfg, gpu_toml(dir, port, gm, exports)).unwrap();
    std::fs::write(&hcfg, host_toml(dir, port, hm, attaches) + host_extra).unwrap();
    let (gs, hs) = (dir.join("gpu.sock"), dir.join("host.sock"));
    let mut gpu = Proc::start(dir, "gpu", &gcfg);
    gpu.serving("the box's control socket", &gs);
    let mut host = Proc::start(dir, "host", &hcfg);
    host.serving("the host's control socket", &hs);
    BoxAndHost { gpu, host, gs, hs, gcfg, hcfg, port, gm, hm }
}

/// A process whose log goes to a file (a pipe nobody reads would fill and stall it).
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn start(dir: &Path, what: &str, config: &Path) -> Proc {
        Proc::start_with_env(dir, what, config, &[])
    }
    /// With `env` set for the process (`NOTIFY_SOCKET`, …).
    pub fn start_with_env(dir: &Path, what: &str, config: &Path, env: &[(&str, &Path)]) -> Proc {
        let log = dir.join(format!("{what}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let mut cmd = dxpu();
        cmd.arg(what).arg("--config").arg(config).stderr(Stdio::from(f));
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc { child: cmd.spawn().unwrap(), log }
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
    /// Waits up to 10 s for the process to serve `socket` (its control socket); fails with
    /// its log if it does not, or if it ended first (a port taken meanwhile, say).
    pub fn serving(&mut self, what: &str, socket: &Path) {
        let end = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("{what}: the process ended first ({st}):\n{}", self.log());
            }
            assert!(Instant::now() < end, "{what}: not within 10 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    pub fn signal(&self, sig: rustix::process::Signal) {
        rustix::process::kill_process(rustix::process::Pid::from_child(&self.child), sig).unwrap();
    }
    pub fn stop(mut self) -> (i32, String) {
        self.signal(rustix::process::Signal::TERM);
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return (st.code().unwrap_or(-1), self.log());
            }
            assert!(Instant::now() < end, "did not stop within 10 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < end, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dxpu ctl --json` and its parsed response.
pub fn ctl(sock: &Path, args: &[&str]) -> (bool, Value) {
    let out = dxpu().args(["ctl", "--json", "--socket"]).arg(sock).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let v = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!("ctl {args:?}: not JSON ({e}): {text} {}", String::from_utf8_lossy(&out.stderr))
    });
    // `metrics` answers the exposition text, whose conventions are Prometheus' (promtool).
    if args.first() != Some(&"metrics") {
        conventional("ctl", &v);
    }
    (out.status.success(), v)
}

pub fn result(sock: &Path, args: &[&str]) -> Value {
    let (ok, v) = ctl(sock, args);
    assert!(ok, "ctl {args:?}: {v}");
    v
}

/// A raw JSON-RPC exchange on the socket.
pub fn raw(sock: &Path, line: &str) -> Value {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    writeln!(s, "{line}").unwrap();
    let mut buf = Vec::new();
    let mut b = [0u8; 4096];
    while !buf.ends_with(b"\n") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0, "closed without an answer to {line}");
        buf.extend_from_slice(&b[..n]);
    }
    serde_json::from_slice(&buf).unwrap()
}

pub fn scrape(port: u16) -> String {
    let text = http_get(port, "/metrics");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    text.split_once("\r\n\r\n").unwrap().1.to_string()
}

/// The whole answer (status line, headers, body) to `GET path` on 127.0.0.1:`port`.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text
}

/// The value of the sample `name{labels}` (labels in the order the endpoint writes them).
pub fn sample(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.parse().ok())
}

pub fn promtool_check(text: &str) {
    let Ok(mut p) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("skipping promtool's check: promtool not found (Debian package prometheus)");
        return;
    };
    p.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = p.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn by_name<'a>(list: &'a Value, key: &str, name: &str) -> &'a Value {
    list.as_array().unwrap().iter().find(|d| d[key] == name).unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// Checks a command's JSON output against docs/cli.md's *Output conventions* and panics
/// naming every key that breaks them: `what` is the command (`"bench link"`), as
/// `package_cli.rs` finds it in the sources when it checks that every `--json` command is
/// checked here.
pub fn conventional(what: &str, v: &Value) {
    let mut bad = Vec::new();
    walk("", "", v, Keyed::Name, &mut bad);
    assert!(
        bad.is_empty(),
        "{what}: the output breaks docs/cli.md's conventions:\n  {}\n{v:#}",
        bad.join("\n  ")
    );
}

/// A key's tokens that name an identifier: a number past 2^53 under such a key is refused.
const ID_TOKENS: &[&str] = &["id", "lease", "seed", "token", "revision", "epoch", "nonce", "key"];

/// A key's tokens that name a unit: a number under such a key says what it counts.
const UNIT_TOKENS: &[&str] =
    &["seconds", "ms", "us", "ns", "minutes", "bytes", "kib", "mib", "percent", "points", "ratio", "per"];
/// A key's tokens that mean a time, a size or a rate: such a number must name its unit.
const QUANTITY_TOKENS: &[&str] = &[
    "rtt",
    "delay",
    "delays",
    "latency",
    "duration",
    "timeout",
    "interval",
    "uptime",
    "since",
    "elapsed",
    "age",
    "time",
    "wait",
    "late",
    "span",
    "size",
    "mtu",
    "payload",
    "bar",
    "rate",
    "bandwidth",
    "throughput",
    "retry",
    "rss",
    "loss",
];
/// The job's times, given as `…_seconds` by every command that measures a job.
const JOB_TIMES: &[&str] =
    &["direct", "bridged", "job", "trace_job", "predicted_direct", "predicted_bridged"];

/// Keys whose objects are keyed by data (TLP kinds, devices' names, reasons), not by names.
const DATA_MAPS: &[&str] = &[
    "tlps",
    "tlps_host_to_box",
    "tlps_box_to_host",
    "faults",
    "failed_by_reason",
    "devices",
    "surprise_removals",
];

/// The keys a PCI address may stand under, one per idea: the device's BDF on the box's bus, in
/// the host's view, its PCI address on the box, and a TLP's IDs.
const PCI_ADDRESS_KEYS: &[&str] =
    &["box_id", "host_view", "pci_address", "requester_id", "completer_id", "target"];

/// `bb:dd.f` or `dddd:bb:dd.f` (lower- or upper-case hex).
fn is_pci_address(s: &str) -> bool {
    let hex = |p: &str, n: usize| p.len() == n && p.chars().all(|c| c.is_ascii_hexdigit());
    let Some((head, f)) = s.rsplit_once('.') else { return false };
    let parts: Vec<&str> = head.split(':').collect();
    let bdf = |b: &str, d: &str| {
        hex(b, 2) && hex(d, 2) && f.len() == 1 && f.chars().all(|c| ('0'..='7').contains(&c))
    };
    match parts.as_slice() {
        [b, d] => bdf(b, d),
        [dom, b, d] => (hex(dom, 4) || hex(dom, 8)) && bdf(b, d),
        _ => false,
    }
}

/// `p50`, `p99`, `p999`: a percentile's token.
fn is_percentile(t: &str) -> bool {
    t.len() > 1 && t.starts_with('p') && t[1..].chars().all(|c| c.is_ascii_digit())
}

/// The significant digits of a number as JSON prints it (`0.0250` has 3, `1.5e-7` 2).
fn significant_digits(printed: &str) -> usize {
    let mantissa = printed.split(['e', 'E']).next().unwrap_or(printed);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    digits.trim_start_matches('0').trim_end_matches('0').len()
}

fn names_unit(key: &str) -> bool {
    key.split('_').any(|t| UNIT_TOKENS.contains(&t))
}

/// How a value is reached: by a key that is a name, by a data key, or as an array's element.
#[derive(Clone, Copy, PartialEq)]
enum Keyed {
    Name,
    Data,
    Element,
}

fn walk(path: &str, key: &str, v: &Value, how: Keyed, bad: &mut Vec<String>) {
    let tokens: Vec<&str> = key.split('_').collect();
    match v {
        Value::Object(m) => {
            // A spread over runs is `key` (the median), `key_min` and `key_max`, in every
            // command: not an object of its own, and never a bound without its median.
            if m.contains_key("median") && (m.contains_key("min") || m.contains_key("max")) {
                bad.push(format!(
                    "{path}: a spread is `{key}`, `{key}_min`, `{key}_max` beside each other, not an object"
                ));
            }
            for k in m.keys() {
                // A percentile is a flat key (`mmio_read_rtt_p50_us`), never an object's `p50`.
                if is_percentile(k) {
                    bad.push(format!("{path}.{k}: a percentile is a key of its own, `{key}_{k}_<unit>`"));
                }
                let stem = k.strip_suffix("_min").or_else(|| k.strip_suffix("_max"));
                if stem.is_some_and(|s| !m.contains_key(s)) {
                    bad.push(format!(
                        "{path}.{k}: a spread's bound stands beside its median (`{}`)",
                        stem.unwrap_or("")
                    ));
                }
                // The job's time is the same idea in every command: seconds.
                if let Some(s) = k.strip_suffix("_ms")
                    && JOB_TIMES.contains(&s)
                {
                    bad.push(format!("{path}.{k}: the job's time is `{s}_seconds` in every command"));
                }
            }
            for (k, child) in m {
                let p = format!("{path}.{k}");
                let data = how == Keyed::Name && (DATA_MAPS.contains(&key) || key.starts_with("tlps"));
                let number = !k.is_empty() && k.chars().all(|c| c.is_ascii_digit());
                let snake = k.starts_with(|c: char| c.is_ascii_lowercase())
                    && k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                if !(data || number || snake) {
                    bad.push(format!("{p}: keys are snake_case ASCII"));
                }
                // The numbers of an object whose key names a unit are in that unit
                // (`"rtt_us": {"p50": …}`); a data map's values are what its key says.
                let k_eff = if data || (names_unit(key) && !names_unit(k)) { key } else { k.as_str() };
                walk(&p, k_eff, child, if data { Keyed::Data } else { Keyed::Name }, bad);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                walk(&format!("{path}[{i}]"), key, child, Keyed::Element, bad);
            }
        }
        Value::Number(n) => number(path, key, &tokens, n, bad),
        Value::String(s) => string(path, key, s, how, bad),
        Value::Bool(_) | Value::Null => {}
    }
}

/// A number's checks: its unit, an ID's range, a percentile's and a time's shape, noise.
fn number(path: &str, key: &str, tokens: &[&str], n: &serde_json::Number, bad: &mut Vec<String>) {
    // The endpoints' round trips and register reads are counted in power-of-two
    // buckets: a percentile of them is a bucket's upper edge, and its key says so.
    // (Bucket edges are integers; an exact percentile from sorted samples is a float.)
    let percentile = tokens.iter().any(|t| is_percentile(t));
    let integer = n.is_u64() || n.is_i64();
    if percentile && integer && tokens.iter().any(|t| *t == "rtt" || *t == "mmio") && !tokens.contains(&"le")
    {
        bad.push(format!("{path} = {n}: a bucket's upper edge says so: `_pNN_le_<unit>` (docs/cli.md)"));
    }
    // JSON readers hold numbers as doubles: an ID past 2^53 (a 64-bit lease, a seed)
    // comes out changed (`jq` printed …5700 for a lease …5485); such an ID is a
    // string. (A count at its range's edge is a count: the model's overflow test
    // echoes u64::MAX on purpose.)
    let big =
        n.as_u64().is_some_and(|x| x > 1 << 53) || n.as_i64().is_some_and(|x| x.unsigned_abs() > 1 << 53);
    if big && tokens.iter().any(|t| ID_TOKENS.contains(t)) {
        bad.push(format!(
            "{path} = {n}: an integer past 2^53 loses digits in JSON readers; give it as a string"
        ));
    }
    // Binary floating point's noise (`2.3329999999999997`) is not a figure: output
    // rounds fractions to 9 significant digits (`ops::control::tidy`).
    if !integer && significant_digits(&n.to_string()) > 9 {
        bad.push(format!("{path} = {n}: more digits than any figure means (round it: ops::control::tidy)"));
    }
    // Times of day are whole seconds (`_unix_seconds`) or microseconds (`_unix_us`).
    if !integer && tokens.contains(&"unix") {
        bad.push(format!("{path} = {n}: a time of day is a whole number of the key's unit"));
    }
    if !integer && !names_unit(key) {
        bad.push(format!("{path} = {n}: a measured number names its unit in its key (docs/cli.md: _seconds, _us, _bytes, _percent, _per_…)"));
    }
    let count = matches!(tokens.last(), Some(&("samples" | "count")));
    if tokens.iter().any(|t| QUANTITY_TOKENS.contains(t)) && !names_unit(key) && !count {
        bad.push(format!("{path} = {n}: a time, size or rate names its unit in its key"));
    }
    if tokens.contains(&"unix") {
        let x = n.as_f64().unwrap_or(0.0);
        let (lo, hi) = if tokens.contains(&"us") { (1.5e15, 4.2e15) } else { (1.5e9, 4.2e9) };
        if !(lo..hi).contains(&x) {
            bad.push(format!("{path} = {n}: not a time since the Unix epoch in the key's unit"));
        }
    }
    if matches!(
        key,
        "vendor_id"
            | "device_id"
            | "subsystem_vendor_id"
            | "subsystem_id"
            | "class"
            | "session"
            | "session_id"
    ) {
        bad.push(format!("{path} = {n}: PCI IDs and session IDs are hex strings"));
    }
}

/// A string's checks: PCI and session IDs' form, a PCI address's key.
fn string(path: &str, key: &str, s: &str, how: Keyed, bad: &mut Vec<String>) {
    let hex = |digits: usize| {
        s.len() == 2 + digits
            && s.starts_with("0x")
            && s[2..].chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
    };
    let ok = match key {
        "vendor_id" | "device_id" | "subsystem_vendor_id" | "subsystem_id" => hex(4),
        "class" => hex(6),
        "session" | "session_id" => hex(8),
        _ => true,
    };
    if !ok {
        bad.push(format!(
            "{path} = {s:?}: PCI IDs are 0x and 4 (a class 6) lower-case hex digits, session IDs 0x and 8"
        ));
    }
    // One key for each idea a PCI address stands for (docs/cli.md).
    if is_pci_address(s) && how != Keyed::Element && !PCI_ADDRESS_KEYS.contains(&key) {
        bad.push(format!(
            "{path} = {s:?}: a PCI address goes under one of {} (docs/cli.md)",
            PCI_ADDRESS_KEYS.join(", ")
        ));
    }
}
