//! What the soak is made of: its options, the seeded choices, the boxes and runs it starts,
//! the impairments it puts on them, the tally it keeps, and the checks of a run's log and a
//! box's metrics.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// What a soak is asked for.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    /// How long to inject faults, minutes (0.1..=1440).
    pub minutes: f64,
    /// The seed of the fault schedule: the same seed, the same faults in the same order.
    pub seed: u64,
    /// Where the configuration files and logs go (none: a new directory under the system's
    /// temporary directory, kept).
    pub dir: Option<PathBuf>,
    /// The `dxpu` binary the boxes and hosts run as.
    pub dxpu: PathBuf,
}

pub(super) const KEY_A: &str = "0c1a05000000000000000000000000000000000000000000000000000000000a";
pub(super) const KEY_B: &str = "0c1a05000000000000000000000000000000000000000000000000000000000b";
/// Workload runs at once (two cores: two hosts, two boxes, three etcd members).
pub(super) const CONCURRENT_RUNS: usize = 2;
/// A run with no result by then is killed and counted as a hang.
pub(super) const RUN_LIMIT: Duration = Duration::from_secs(180);
/// A probe of box-a's control socket or metrics slower than this counts as blinded.
pub(super) const PROBE_LIMIT: Duration = Duration::from_secs(2);

/// xorshift64*: the fault schedule's only source of randomness.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in 0..n.
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// Uniform in lo..=hi milliseconds.
    pub(super) fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
    /// True with probability p.
    pub(super) fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A link impairment, as `[impairment]` says it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Imp {
    pub(super) loss: f64,
    pub(super) delay_us: u64,
    pub(super) jitter_us: u64,
}

impl Imp {
    pub(super) fn toml(&self) -> String {
        format!(
            "[impairment]\nloss = {}\ndelay_us = {}\njitter_us = {}\n",
            self.loss, self.delay_us, self.jitter_us
        )
    }
    /// A host run's link: mostly clean or slightly lossy, sometimes a burst to 50 %.
    pub(super) fn for_run(rng: &mut Rng) -> Imp {
        match rng.below(10) {
            0..=3 => Imp::default(),
            4..=6 => Imp { loss: 0.02, delay_us: rng.below(200), jitter_us: rng.below(200) },
            7 | 8 => Imp { loss: 0.2, delay_us: rng.below(500), jitter_us: rng.below(300) },
            _ => Imp { loss: 0.5, delay_us: 0, jitter_us: 200 },
        }
    }
}

/// A port free now, below the kernel's ephemeral range: a port a box binds later must not be
/// taken meanwhile as the local port of an outgoing connection (a box's own etcd client took
/// its metrics port once, between this pick and the box's bind).
pub(super) fn free_port(udp: bool) -> Result<u16, String> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let start = 10_000u16.min(low.saturating_sub(1_000)).max(1_024);
    let span = u64::from(low.saturating_sub(start).max(1));
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9) ^ u64::from(nanos);
    let free = |port: u16| {
        if udp {
            std::net::UdpSocket::bind(("127.0.0.1", port)).is_ok()
        } else {
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
        }
    };
    (0..500u64)
        .map(|i| start + (seed.wrapping_add(i.wrapping_mul(7_919)) % span) as u16)
        .find(|&p| free(p))
        .ok_or_else(|| format!("no free {} port in {start}..{low}", if udp { "UDP" } else { "TCP" }))
}

/// One box: its configuration and process.
pub(super) struct BoxProc {
    pub(super) name: &'static str,
    pub(super) port: u16,
    pub(super) metrics: u16,
    pub(super) config: PathBuf,
    pub(super) child: Option<Child>,
    /// Its allow lists say every host by name (else `*`): toggled by reloads.
    pub(super) named_allow: bool,
    pub(super) imp: Imp,
}

impl BoxProc {
    pub(super) fn socket(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.sock", self.name))
    }
    pub(super) fn ownership_log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}-owners.jsonl", self.name))
    }
    pub(super) fn write_config(&self, dir: &Path, etcd: &[String]) -> Result<(), String> {
        let allow = if self.named_allow { "\"host-a\", \"host-b\"" } else { "\"*\"" };
        let mut t = format!(
            "listen = \"127.0.0.1:{port}\"\n[link]\npoll = \"blocking\"\nidle_timeout_ms = 1000\n\
             [control]\nsocket = {sock:?}\n[metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [pool]\netcd = {etcd:?}\nbox = \"{name}\"\nadvertise = \"127.0.0.1:{port}\"\nlease_ttl_s = 5\n\
             ownership_log = {log:?}\n\
             [[host]]\nname = \"host-a\"\nkey = \"{KEY_A}\"\n[[host]]\nname = \"host-b\"\nkey = \"{KEY_B}\"\n",
            port = self.port,
            metrics = self.metrics,
            sock = self.socket(dir).display().to_string(),
            name = self.name,
            log = self.ownership_log(dir).display().to_string(),
        );
        for d in ["gpu0", "gpu1"] {
            t.push_str(&format!(
                "[[device]]\nname = \"{d}\"\nsim = {{ vram_mib = 256 }}\nallow = [{allow}]\n"
            ));
        }
        t.push_str(&self.imp.toml());
        std::fs::write(&self.config, t).map_err(|e| format!("{}: {e}", self.config.display()))
    }
}

/// A workload run: one `dxpu host --workload` process.
pub(super) struct WorkloadRun {
    pub(super) id: u64,
    pub(super) child: Child,
    pub(super) log: PathBuf,
    pub(super) started: Instant,
    pub(super) killed: bool,
    pub(super) imp: Imp,
}

/// What the soak saw.
#[derive(Default)]
pub struct Tally {
    /// Workload runs started.
    pub runs: u64,
    /// Runs whose workload verified.
    pub verified: u64,
    /// Failures by reason (the host's last error, numbers and addresses taken out).
    pub failed: BTreeMap<String, u64>,
    /// Failures with no reason: exited without an error line, or hung.
    pub unexplained: Vec<String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Probes of box-a's control socket and metrics.
    pub probes: u64,
    /// The probes that failed or were slower than the limit, and why.
    pub probe_failures: Vec<String>,
    /// The slowest probe.
    pub probe_max: Duration,
    /// box-a's resident memory, kB, over time (s).
    pub rss: Vec<(f64, u64)>,
}

impl Tally {
    /// Counts a fault injected.
    pub(super) fn fault(&mut self, what: &'static str) {
        *self.faults.entry(what).or_default() += 1;
    }
}

/// The reason a run's log gives for its failure: its last error, with numbers, addresses
/// and hex taken out so that the same cause counts once.
pub(super) fn reason(log: &str) -> Option<String> {
    let line = log.lines().rev().find(|l| l.contains("ERROR") || l.starts_with("dxpu host:"))?;
    let msg = line.split_once("] ").map_or(line, |(_, m)| m);
    let mut out = String::new();
    let mut last_digit = false;
    for c in msg.chars() {
        let d = c.is_ascii_digit();
        if d && !last_digit {
            out.push('N');
        } else if !d {
            out.push(c);
        }
        last_digit = d;
    }
    let out = out.trim().to_string();
    (!out.is_empty()).then_some(out)
}

/// One scrape of the metrics port within [`PROBE_LIMIT`].
pub(super) fn scrape(port: u16) -> Result<(), String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(PROBE_LIMIT)).map_err(|e| e.to_string())?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: chaos\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    if text.starts_with("HTTP/1.1 200") { Ok(()) } else { Err(text.lines().next().unwrap_or("").to_string()) }
}
