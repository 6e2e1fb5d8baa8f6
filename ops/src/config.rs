//! The TOML configuration of `dxpu gpu` and `dxpu host` (documented, with a complete
//! example, in `docs/operations.md`). Parsing refuses unknown keys; validation names the key
//! at fault and says what is wrong with its value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bridge_gpu::{DeviceSpec, ExportSpec, GpuOptions, HostKey};
use bridge_host::AttachOptions;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use serde::Deserialize;

/// `[link]`: the session and its driver.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkSection {
    mtu: Option<usize>,
    /// The path's bandwidth in Gbit/s and round trip in µs: the window and the credits are
    /// sized from them (`link::Config::size_for_path`).
    bandwidth_gbit: Option<u64>,
    rtt_us: Option<u64>,
    window: Option<u32>,
    max_queued: Option<usize>,
    replay_timeout_us: Option<u64>,
    ack_delay_us: Option<u64>,
    keepalive_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    handshake_timeout_ms: Option<u64>,
    authenticate_frames: Option<bool>,
    encrypt_frames: Option<bool>,
    key_update_frames: Option<u64>,
    /// `auto`, `io_uring` or `portable`.
    pub(crate) driver: Option<String>,
    /// `blocking` or `busy`.
    pub(crate) poll: Option<String>,
    spin_us: Option<u64>,
    /// UDP GSO / GRO (on where the kernel has them), zero-copy sends (io_uring; off).
    gso: Option<bool>,
    gro: Option<bool>,
    zero_copy_send: Option<bool>,
}

/// `[impairment]`: what the endpoint does to what it sends.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImpairmentSection {
    delay_us: Option<u64>,
    jitter_us: Option<u64>,
    loss: Option<f64>,
    duplicate: Option<f64>,
    corrupt: Option<f64>,
    rate_mbps: Option<u64>,
    seed: Option<u64>,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct HostSection {
    name: String,
    key: Option<String>,
    key_file: Option<PathBuf>,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct SimSection {
    vram_mib: Option<u64>,
    msix_vectors: Option<u16>,
    serial: Option<u64>,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct DeviceSection {
    name: String,
    sim: Option<SimSection>,
    vfio: Option<String>,
    allow: Vec<String>,
}

/// `[control]`: the JSON-RPC control socket (`dxpu ctl`).
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ControlSection {
    /// Where the socket is made (mode 0600); no socket without it.
    pub(crate) socket: Option<PathBuf>,
}

/// `[metrics]`: Prometheus metrics over HTTP.
#[derive(Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MetricsSection {
    /// The TCP address to serve `/metrics` on; off without it.
    listen: Option<String>,
}

impl MetricsSection {
    /// The address to listen on, if metrics are on.
    pub fn listen(&self) -> Result<Option<SocketAddr>, String> {
        self.listen.as_deref().map(|l| socket_addr("metrics.listen", l)).transpose()
    }
}

/// `[control]` and `[metrics]` of a file.
pub type OpsSections = (ControlSection, MetricsSection);

/// The whole file of `dxpu gpu`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuFile {
    pub(crate) listen: Option<String>,
    #[serde(default)]
    pub(crate) link: LinkSection,
    #[serde(default)]
    impairment: ImpairmentSection,
    #[serde(default)]
    host: Vec<HostSection>,
    #[serde(default)]
    device: Vec<DeviceSection>,
    /// `[pool]`: the box registers its devices in a pool and serves claims only.
    pub(crate) pool: Option<GpuPoolSection>,
    #[serde(default)]
    pub(crate) control: ControlSection,
    #[serde(default)]
    pub(crate) metrics: MetricsSection,
}

/// `[pool]` of `dxpu gpu`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuPoolSection {
    etcd: Vec<String>,
    #[serde(rename = "box")]
    pub(crate) box_name: String,
    advertise: String,
    lease_ttl_s: Option<u64>,
    prefix: Option<String>,
    /// Where each change of owner is appended as a JSON line.
    pub(crate) ownership_log: Option<PathBuf>,
}

/// `[pool]` of `dxpu host`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostPoolSection {
    etcd: Vec<String>,
    host: String,
    key: Option<String>,
    key_file: Option<PathBuf>,
    want: usize,
    vendor_id: Option<u16>,
    device_id: Option<u16>,
    #[serde(default)]
    boxes: Vec<String>,
    lease_ttl_s: Option<u64>,
    prefix: Option<String>,
    pub(crate) vfio_user_dir: Option<PathBuf>,
}

/// What `[pool]` of `dxpu gpu` says.
pub struct GpuPool {
    pub(crate) config: pool::PoolConfig,
    pub(crate) box_name: String,
    pub(crate) advertise: SocketAddr,
    pub(crate) ownership_log: Option<PathBuf>,
}

/// What `[pool]` of `dxpu host` says.
pub struct HostPool {
    pub(crate) config: pool::PoolConfig,
    pub(crate) agent: pool::HostAgentOptions,
    /// Attach options every claimed device starts from (server and device set per claim).
    pub(crate) template: AttachOptions,
    pub(crate) vfio_user_dir: Option<PathBuf>,
}

fn pool_config(
    etcd: &[String],
    ttl: Option<u64>,
    prefix: &Option<String>,
) -> Result<pool::PoolConfig, String> {
    let etcd: Vec<String> = etcd
        .iter()
        .map(|e| pool::etcd_url(e).map_err(|why| format!("pool.etcd: {why}")))
        .collect::<Result<_, _>>()?;
    let mut c = pool::PoolConfig::new(etcd);
    if let Some(t) = ttl {
        within("pool.lease_ttl_s", Some(t), 2..=3600, "s")?;
        c.lease_ttl = Duration::from_secs(t);
    }
    if let Some(p) = prefix {
        c.prefix = p.clone();
    }
    c.validate().map_err(|e| format!("pool.{e}"))?;
    Ok(c)
}

impl GpuPoolSection {
    /// The box's pool settings, for the devices it exports.
    pub fn pool(&self, exports: &[ExportSpec]) -> Result<GpuPool, String> {
        let config = pool_config(&self.etcd, self.lease_ttl_s, &self.prefix)?;
        if !pool::valid_name(&self.box_name) {
            return Err(bad(
                "pool.box",
                format!("\"{}\"", self.box_name),
                "must be 1-64 of A-Z a-z 0-9 - _ .",
            ));
        }
        let advertise = socket_addr("pool.advertise", &self.advertise)?;
        if advertise.port() == 0 || advertise.ip().is_unspecified() {
            return Err(bad(
                "pool.advertise",
                format!("\"{}\"", self.advertise),
                "hosts must reach the box there: a real address and port",
            ));
        }
        for (i, e) in exports.iter().enumerate() {
            if !pool::valid_name(&e.name) {
                return Err(bad(
                    &format!("device[{i}].name"),
                    format!("\"{}\"", e.name),
                    "a pool device's name is 1-64 of A-Z a-z 0-9 - _ . (it is part of an etcd key)",
                ));
            }
        }
        Ok(GpuPool {
            config,
            box_name: self.box_name.clone(),
            advertise,
            ownership_log: self.ownership_log.clone(),
        })
    }
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
struct AttachSection {
    server: String,
    device: String,
    key: Option<String>,
    key_file: Option<PathBuf>,
    completion_timeout_ms: Option<u64>,
    dma_memory_mib: Option<usize>,
    bdf: Option<String>,
    service_interval_ms: Option<u64>,
    vfio_user_socket: Option<PathBuf>,
    /// The socket's permission bits (TOML `0o660`); 0600 unless given.
    vfio_user_socket_mode: Option<u32>,
    /// Its owning group, by name or number (a VMM running as another user connects
    /// through it: libvirt's QEMU).
    vfio_user_socket_group: Option<String>,
    /// Its owning user, by name or number.
    vfio_user_socket_owner: Option<String>,
}

/// Where a device is served over vfio-user, and who may connect to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedSocket {
    pub(crate) path: PathBuf,
    pub(crate) access: bridge_host::SocketAccess,
}

/// A user or group named in a file: by number, or by name through the system's databases.
fn id_of(key: &str, value: &str, group: bool) -> Result<u32, String> {
    if let Ok(n) = value.parse::<u32>() {
        return Ok(n);
    }
    let found = if group {
        nix::unistd::Group::from_name(value).map(|g| g.map(|g| g.gid.as_raw()))
    } else {
        nix::unistd::User::from_name(value).map(|u| u.map(|u| u.uid.as_raw()))
    };
    match found {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(bad(
            key,
            format!("\"{value}\""),
            &format!("no such {}", if group { "group" } else { "user" }),
        )),
        Err(e) => Err(bad(key, format!("\"{value}\""), &format!("looking it up: {e}"))),
    }
}

/// The whole file of `dxpu host`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    #[serde(default)]
    pub(crate) link: LinkSection,
    #[serde(default)]
    impairment: ImpairmentSection,
    #[serde(default)]
    attach: Vec<AttachSection>,
    /// `[pool]`: devices claimed from a pool, attached and released at run time.
    pub(crate) pool: Option<HostPoolSection>,
    #[serde(default)]
    pub(crate) control: ControlSection,
    #[serde(default)]
    pub(crate) metrics: MetricsSection,
}

impl HostFile {
    /// `[pool]`, if the file has one.
    pub fn pool(&self) -> Result<Option<HostPool>, String> {
        let Some(p) = &self.pool else { return Ok(None) };
        let config = pool_config(&p.etcd, p.lease_ttl_s, &p.prefix)?;
        if !pool::valid_name(&p.host) {
            return Err(bad("pool.host", format!("\"{}\"", p.host), "must be 1-64 of A-Z a-z 0-9 - _ ."));
        }
        if !(1..=64).contains(&p.want) {
            return Err(bad("pool.want", p.want, "must be 1..=64 devices"));
        }
        for (i, b) in p.boxes.iter().enumerate() {
            if !pool::valid_name(b) {
                return Err(bad(&format!("pool.boxes[{i}]"), format!("\"{b}\""), "not a box name"));
            }
        }
        if let Some(d) = &p.vfio_user_dir
            && !d.is_dir()
        {
            return Err(bad("pool.vfio_user_dir", d.display(), "not a directory"));
        }
        let k = key("pool", &p.key, &p.key_file)?;
        let link = self.link.settings(k.clone())?;
        // The server is each claim's box; this one is replaced.
        let mut o = AttachOptions::new(SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)), "", k);
        o.link = link.config;
        o.driver = link.driver;
        o.offload = link.offload;
        o.poll = link.poll;
        o.impairment = self.impairment.impairment()?;
        let agent = pool::HostAgentOptions {
            host: p.host.clone(),
            want: p.want,
            filter: pool::Filter { vendor_id: p.vendor_id, device_id: p.device_id, boxes: p.boxes.clone() },
            cool_down: Duration::from_secs(2),
        };
        Ok(Some(HostPool { config, agent, template: o, vfio_user_dir: p.vfio_user_dir.clone() }))
    }
}

fn bad(key: &str, value: impl std::fmt::Display, problem: &str) -> String {
    format!("{key} = {value}: {problem}")
}

/// Largest configuration file read (a file this long is not a configuration).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads at most `limit` bytes of `path` as text; longer, or not UTF-8, is an error naming
/// the file. `/dev/zero` and the like end at the limit.
pub fn read_bounded(path: &Path, limit: u64) -> Result<String, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(format!("{}: longer than {limit} bytes: not a configuration file", path.display()));
    }
    String::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8 text ({e})", path.display()))
}

/// Reads and parses a TOML file; the error names the file, line and key.
pub fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, String> {
    let text = read_bounded(path, MAX_CONFIG_BYTES)?;
    toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.to_string().trim_end()))
}

/// A key from hex (at least 16 bytes), given inline or in a file.
fn key(section: &str, inline: &Option<String>, file: &Option<PathBuf>) -> Result<PresharedKey, String> {
    let (hex, key_name) = match (inline, file) {
        (Some(k), None) => (k.clone(), format!("{section}.key")),
        (None, Some(f)) => {
            let name = format!("{section}.key_file");
            warn_if_others_can_read(&name, f);
            (read_bounded(f, 4096).map_err(|e| bad(&name, f.display(), &e))?, name)
        }
        (Some(_), Some(_)) => return Err(format!("{section}: give key or key_file, not both")),
        (None, None) => return Err(format!("{section}: key or key_file is required")),
    };
    let hex = hex.trim();
    let bytes = parse_hex(hex).ok_or_else(|| bad(&key_name, "…", "not hexadecimal digits"))?;
    if bytes.iter().all(|b| *b == 0) {
        return Err(bad(
            &key_name,
            "…",
            "all zeros: not a secret (docs/operations.md says how to make a random one)",
        ));
    }
    PresharedKey::new(&bytes).ok_or_else(|| {
        bad(&key_name, "…", &format!("{} bytes; a key needs at least 16 (32 hex digits)", bytes.len()))
    })
}

/// A key file others may read is no secret: said at start, as ssh does for its keys.
fn warn_if_others_can_read(key_name: &str, f: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(f)
        && m.permissions().mode() & 0o077 != 0
    {
        log::warn!(
            "{key_name} = {}: readable by others (mode {:03o}); `chmod 600` it",
            f.display(),
            m.permissions().mode() & 0o777
        );
    }
}

/// Hexadecimal digits only (no sign, no prefix, no spaces), two per byte.
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

/// The UDP driver `key` names (`auto`, `io_uring`, `portable`).
pub fn driver_kind(key: &str, v: &str) -> Result<DriverKind, String> {
    match v {
        "auto" => Ok(DriverKind::Auto),
        "io_uring" | "uring" => Ok(DriverKind::IoUring),
        "portable" => Ok(DriverKind::Portable),
        other => Err(bad(key, format!("\"{other}\""), "must be \"auto\", \"io_uring\" or \"portable\"")),
    }
}

/// The poll mode `key` names (`blocking`, `busy` with `spin`).
pub fn poll_mode(key: &str, v: &str, spin: Duration) -> Result<PollMode, String> {
    match v {
        "blocking" => Ok(PollMode::Blocking),
        "busy" => Ok(PollMode::Busy { spin }),
        other => Err(bad(key, format!("\"{other}\""), "must be \"blocking\" or \"busy\"")),
    }
}

/// What the `[link]` section says, on top of the defaults.
pub struct LinkSettings {
    pub(crate) config: link::Config,
    pub(crate) driver: DriverKind,
    pub(crate) offload: link::driver::Offload,
    pub(crate) poll: PollMode,
}

/// `value` of `key` if it lies in `range` (the range said in the error).
fn within<T: PartialOrd + std::fmt::Display + Copy>(
    key: &str,
    value: Option<T>,
    range: std::ops::RangeInclusive<T>,
    unit: &str,
) -> Result<Option<T>, String> {
    match value {
        Some(v) if !range.contains(&v) => {
            Err(bad(key, v, &format!("must be {}..={} {unit}", range.start(), range.end())))
        }
        v => Ok(v),
    }
}

impl LinkSection {
    /// Every value in range, named as in the file, before the session's own checks.
    fn check(&self) -> Result<(), String> {
        within(
            "link.replay_timeout_us",
            self.replay_timeout_us,
            1..=200_000,
            "µs (the replay back-off's ceiling)",
        )?;
        within("link.ack_delay_us", self.ack_delay_us, 0..=100_000, "µs")?;
        within("link.spin_us", self.spin_us, 0..=1_000_000, "µs")?;
        within("link.bandwidth_gbit", self.bandwidth_gbit, 1..=1600, "Gbit/s")?;
        within("link.rtt_us", self.rtt_us, 1..=1_000_000, "µs")?;
        let keepalive = within("link.keepalive_ms", self.keepalive_ms, 1..=60_000, "ms")?.unwrap_or(100);
        let idle = within("link.idle_timeout_ms", self.idle_timeout_ms, 2..=3_600_000, "ms")?.unwrap_or(1000);
        within("link.handshake_timeout_ms", self.handshake_timeout_ms, 100..=600_000, "ms")?;
        if keepalive >= idle {
            let (key, value) = match self.idle_timeout_ms {
                Some(v) => ("link.idle_timeout_ms", v),
                None => ("link.keepalive_ms", keepalive),
            };
            return Err(bad(
                key,
                value,
                &format!("link.keepalive_ms ({keepalive}) must be below link.idle_timeout_ms ({idle})"),
            ));
        }
        Ok(())
    }

    /// The link's settings under `psk`, every value checked and named on error.
    pub fn settings(&self, psk: PresharedKey) -> Result<LinkSettings, String> {
        self.check()?;
        let mut c = link::Config::new(psk);
        if let Some(v) = self.mtu {
            c.mtu = v;
        }
        // The window and credits for this path at this MTU (an explicit window wins).
        let bandwidth = self.bandwidth_gbit.map_or(link::DEFAULT_PATH_BANDWIDTH, |g| g * 1_000_000_000 / 8);
        let rtt = self.rtt_us.map_or(link::DEFAULT_PATH_RTT, Duration::from_micros);
        c.size_for_path(bandwidth, rtt);
        if let Some(v) = self.window {
            c.window = v;
        }
        if let Some(v) = self.max_queued {
            c.max_queued = v;
        }
        if let Some(v) = self.replay_timeout_us {
            c.replay_timeout = Duration::from_micros(v);
        }
        if let Some(v) = self.ack_delay_us {
            c.ack_delay = Duration::from_micros(v);
        }
        if let Some(v) = self.keepalive_ms {
            c.keepalive_interval = Duration::from_millis(v);
        }
        if let Some(v) = self.idle_timeout_ms {
            c.idle_timeout = Duration::from_millis(v);
        }
        if let Some(v) = self.handshake_timeout_ms {
            c.handshake_timeout = Duration::from_millis(v);
        }
        if let Some(v) = self.authenticate_frames {
            c.authenticate_frames = v;
        }
        if let Some(v) = self.encrypt_frames {
            c.encrypt_frames = v;
        }
        if let Some(v) = self.key_update_frames {
            c.key_update_frames = v;
        }
        c.validate().map_err(|link::ConfigError::Invalid { key, value, problem }| {
            bad(&format!("link.{key}"), value, problem)
        })?;
        let driver = driver_kind("link.driver", self.driver.as_deref().unwrap_or("auto"))?;
        let spin = Duration::from_micros(self.spin_us.unwrap_or(1000));
        let poll = poll_mode("link.poll", self.poll.as_deref().unwrap_or("blocking"), spin)?;
        let auto = link::driver::Offload::AUTO;
        let offload = link::driver::Offload {
            gso: self.gso.unwrap_or(auto.gso),
            gro: self.gro.unwrap_or(auto.gro),
            zero_copy_send: self.zero_copy_send.unwrap_or(auto.zero_copy_send),
        };
        Ok(LinkSettings { config: c, driver, offload, poll })
    }
}

impl ImpairmentSection {
    /// The impairment the section asks for (none by default).
    pub fn impairment(&self) -> Result<Impairment, String> {
        within("impairment.delay_us", self.delay_us, 0..=10_000_000, "µs")?;
        within("impairment.jitter_us", self.jitter_us, 0..=10_000_000, "µs")?;
        within("impairment.rate_mbps", self.rate_mbps, 0..=10_000_000, "Mbit/s")?;
        for (k, v) in [("loss", self.loss), ("duplicate", self.duplicate), ("corrupt", self.corrupt)] {
            if let Some(p) = v
                && !(0.0..=1.0).contains(&p)
            {
                return Err(bad(&format!("impairment.{k}"), p, "a probability must be 0.0..=1.0"));
            }
        }
        Ok(Impairment {
            loss: self.loss.unwrap_or(0.0),
            duplicate: self.duplicate.unwrap_or(0.0),
            corrupt: self.corrupt.unwrap_or(0.0),
            delay: Duration::from_micros(self.delay_us.unwrap_or(0)),
            jitter: Duration::from_micros(self.jitter_us.unwrap_or(0)),
            rate: self.rate_mbps.unwrap_or(0) * 1_000_000 / 8,
            seed: self.seed.unwrap_or(1),
        })
    }
}

/// This machine's memory in MiB (`MemTotal` of /proc/meminfo), if it can be read.
fn physical_memory_mib() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024)
}

fn socket_addr(key: &str, v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| bad(key, format!("\"{v}\""), "not an address:port (e.g. \"0.0.0.0:7440\")"))
}

/// The default UDP port of `dxpu gpu`.
pub const DEFAULT_PORT: u16 = 7440;

impl GpuFile {
    /// The settings a reload cannot change (the socket, the link, the pool, the control
    /// socket and metrics server): the names of those that differ in `new`.
    pub fn restart_only_changes(&self, new: &GpuFile) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, same) in [
            ("listen", self.listen == new.listen),
            ("[link]", self.link == new.link),
            ("[impairment]", self.impairment == new.impairment),
            ("[pool]", self.pool == new.pool),
            ("[control]", self.control == new.control),
            ("[metrics]", self.metrics == new.metrics),
        ] {
            if !same {
                out.push(name);
            }
        }
        out
    }

    /// The endpoint's options; `listen` overrides the file's.
    pub fn options(&self, listen: Option<&str>) -> Result<GpuOptions, String> {
        let listen = match (listen, &self.listen) {
            (Some(l), _) => socket_addr("--listen", l)?,
            (None, Some(l)) => socket_addr("listen", l)?,
            (None, None) => SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)),
        };
        if self.host.is_empty() {
            return Err("host: at least one [[host]] with a name and a key is needed".into());
        }
        let mut hosts = Vec::new();
        for (i, h) in self.host.iter().enumerate() {
            if h.name.is_empty() {
                return Err(bad(&format!("host[{i}].name"), "\"\"", "must not be empty"));
            }
            if hosts.iter().any(|k: &HostKey| k.name == h.name) {
                return Err(bad(&format!("host[{i}].name"), format!("\"{}\"", h.name), "named twice"));
            }
            hosts.push(HostKey {
                name: h.name.clone(),
                key: key(&format!("host[{i}]"), &h.key, &h.key_file)?,
            });
        }
        if self.device.is_empty() {
            return Err("device: at least one [[device]] to export is needed".into());
        }
        let mut exports = Vec::new();
        for (i, d) in self.device.iter().enumerate() {
            let at = format!("device[{i}]");
            if d.name.is_empty() || d.name.len() > bridge::attach::MAX_TEXT {
                return Err(bad(&format!("{at}.name"), format!("\"{}\"", d.name), "must be 1..=255 bytes"));
            }
            let device = match (&d.sim, &d.vfio) {
                (Some(s), None) => {
                    let mut p = SimGpuParams::default();
                    if let Some(v) = s.vram_mib {
                        if !(256..=1 << 20).contains(&v) || !v.is_power_of_two() {
                            return Err(bad(
                                &format!("{at}.sim.vram_mib"),
                                v,
                                "must be a power of two, 256..=1048576 (the driver's workload needs 256 MiB)",
                            ));
                        }
                        p.vram_bytes = v << 20;
                    }
                    if let Some(v) = s.msix_vectors {
                        if !(4..=2048).contains(&v) {
                            return Err(bad(&format!("{at}.sim.msix_vectors"), v, "must be 4..=2048"));
                        }
                        p.msix_vectors = v;
                    }
                    if let Some(v) = s.serial {
                        p.serial = v;
                    }
                    DeviceSpec::Sim(p)
                }
                (None, Some(addr)) => {
                    let ok = addr.len() == 12
                        && addr.as_bytes()[4] == b':'
                        && addr.as_bytes()[7] == b':'
                        && addr.as_bytes()[10] == b'.';
                    if !ok {
                        return Err(bad(
                            &format!("{at}.vfio"),
                            format!("\"{addr}\""),
                            "not a PCI address like \"0000:41:00.0\"",
                        ));
                    }
                    DeviceSpec::Vfio(addr.clone())
                }
                (Some(_), Some(_)) => return Err(format!("{at}: give sim or vfio, not both")),
                (None, None) => return Err(format!("{at}: sim = {{ … }} or vfio = \"…\" is required")),
            };
            if d.allow.is_empty() {
                return Err(bad(
                    &format!("{at}.allow"),
                    "[]",
                    "no host may attach it: name at least one [[host]]",
                ));
            }
            if exports.iter().any(|e: &ExportSpec| e.name == d.name) {
                return Err(bad(&format!("{at}.name"), format!("\"{}\"", d.name), "named twice"));
            }
            for (j, h) in d.allow.iter().enumerate() {
                if !hosts.iter().any(|k| &k.name == h) {
                    return Err(bad(
                        &format!("{at}.allow[{j}]"),
                        format!("\"{h}\""),
                        "no [[host]] has this name",
                    ));
                }
            }
            exports.push(ExportSpec { name: d.name.clone(), device, allow: d.allow.clone() });
        }
        let link = self.link.settings(hosts[0].key.clone())?;
        Ok(GpuOptions {
            listen,
            link: link.config,
            hosts,
            exports,
            driver: link.driver,
            offload: link.offload,
            poll: link.poll,
            impairment: self.impairment.impairment()?,
            tap: None,
        })
    }
}

impl HostFile {
    /// The settings a reload cannot change: the names of those that differ in `new`.
    pub fn restart_only_changes(&self, new: &HostFile) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (name, same) in [
            ("[link]", self.link == new.link),
            ("[impairment]", self.impairment == new.impairment),
            ("[pool]", self.pool == new.pool),
            ("[control]", self.control == new.control),
            ("[metrics]", self.metrics == new.metrics),
        ] {
            if !same {
                out.push(name);
            }
        }
        out
    }

    /// Whether `[[attach]]` number `i` reads the same in `other`'s number `j`.
    pub fn same_attach(&self, i: usize, other: &HostFile, j: usize) -> bool {
        self.attach.get(i).is_some_and(|a| other.attach.get(j) == Some(a))
    }

    /// One set of attach options per `[[attach]]`; `server` overrides every server address.
    #[cfg(test)]
    pub fn options(&self, server: Option<&str>) -> Result<Vec<AttachOptions>, String> {
        Ok(self.attachments(server)?.into_iter().map(|(o, _)| o).collect())
    }

    /// Each `[[attach]]`'s options with the vfio-user socket it is served on, if any. A
    /// device served to a VMM has no DMA arena (the VMM grants guest memory), no service
    /// thread (the server's thread drives the link) and, unless the file says otherwise,
    /// the portable link driver (its socket is what the server waits on).
    pub fn attachments(
        &self,
        server: Option<&str>,
    ) -> Result<Vec<(AttachOptions, Option<ServedSocket>)>, String> {
        if self.attach.is_empty() && self.pool.is_none() {
            return Err(
                "attach: at least one [[attach]] with server, device and key (or a [pool]) is needed".into(),
            );
        }
        let imp = self.impairment.impairment()?;
        let mut out = Vec::new();
        for (i, a) in self.attach.iter().enumerate() {
            let at = format!("attach[{i}]");
            let (key_name, text) = match server {
                Some(s) => ("--server".to_string(), s),
                None => (format!("{at}.server"), a.server.as_str()),
            };
            let addr = socket_addr(&key_name, text)?;
            if addr.port() == 0 || addr.ip().is_unspecified() {
                return Err(bad(
                    &key_name,
                    format!("\"{text}\""),
                    "not a box's address: the box listens on a real address and port (7440 by default)",
                ));
            }
            if let Some((j, _)) = out.iter().enumerate().find(
                |(_, (o, _)): &(usize, &(AttachOptions, Option<ServedSocket>))| {
                    o.server == addr && o.device == a.device
                },
            ) {
                return Err(bad(
                    &format!("{at}.device"),
                    format!("\"{}\"", a.device),
                    &format!("attach[{j}] attaches {} at {addr} already", a.device),
                ));
            }
            let k = key(&at, &a.key, &a.key_file)?;
            let link = self.link.settings(k.clone())?;
            let mut o = AttachOptions::new(addr, &a.device, k);
            o.link = link.config;
            o.driver = link.driver;
            o.offload = link.offload;
            o.poll = link.poll;
            o.impairment = imp;
            if let Some(ms) = a.completion_timeout_ms {
                if !(1..=60_000).contains(&ms) {
                    return Err(bad(&format!("{at}.completion_timeout_ms"), ms, "must be 1..=60000"));
                }
                o.completion_timeout = Duration::from_millis(ms);
            }
            if let Some(m) = a.dma_memory_mib {
                if !(1..=65536).contains(&m) {
                    return Err(bad(&format!("{at}.dma_memory_mib"), m, "must be 1..=65536"));
                }
                if let Some(total) = physical_memory_mib()
                    && m > total / 2
                {
                    return Err(bad(
                        &format!("{at}.dma_memory_mib"),
                        m,
                        &format!("more than half of this machine's {total} MiB of memory"),
                    ));
                }
                o.dma_memory = m << 20;
            }
            if let Some(ms) = a.service_interval_ms {
                if ms > 10_000 {
                    return Err(bad(
                        &format!("{at}.service_interval_ms"),
                        ms,
                        "must be 0..=10000 (0: no service thread)",
                    ));
                }
                o.service_interval = (ms > 0).then(|| Duration::from_millis(ms));
            }
            if let Some(b) = &a.bdf {
                o.device_id = b.parse().map_err(|_| {
                    bad(&format!("{at}.bdf"), format!("\"{b}\""), "not a BDF like \"00:01.0\"")
                })?;
            }
            if let Some(p) = &a.vfio_user_socket {
                let name = format!("{at}.vfio_user_socket");
                if p.as_os_str().is_empty() || p.is_dir() {
                    return Err(bad(&name, p.display(), "must be a socket file path"));
                }
                let dir = p.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
                if !dir.is_dir() {
                    return Err(bad(
                        &name,
                        p.display(),
                        &format!("its directory {} does not exist", dir.display()),
                    ));
                }
                if out.iter().any(|(_, s)| s.as_ref().is_some_and(|s| s.path == *p)) {
                    return Err(bad(&name, p.display(), "another [[attach]] is served on it already"));
                }
                o.dma_memory = 0;
                o.service_interval = None;
                if self.link.driver.is_none() {
                    o.driver = link::driver::DriverKind::Portable;
                }
            }
            let served = match &a.vfio_user_socket {
                None => {
                    for (k, set) in [
                        ("vfio_user_socket_mode", a.vfio_user_socket_mode.is_some()),
                        ("vfio_user_socket_group", a.vfio_user_socket_group.is_some()),
                        ("vfio_user_socket_owner", a.vfio_user_socket_owner.is_some()),
                    ] {
                        if set {
                            return Err(bad(&format!("{at}.{k}"), "given", "only with vfio_user_socket"));
                        }
                    }
                    None
                }
                Some(p) => {
                    let mode = a.vfio_user_socket_mode.unwrap_or(0o600);
                    if mode > 0o777 || mode & 0o007 != 0 || mode & 0o600 != 0o600 {
                        return Err(bad(
                            &format!("{at}.vfio_user_socket_mode"),
                            format!("0o{mode:o}"),
                            "must give the owner read and write and others nothing (0o600, 0o660): the socket is the VM's door to the device",
                        ));
                    }
                    let gid = a
                        .vfio_user_socket_group
                        .as_deref()
                        .map(|g| id_of(&format!("{at}.vfio_user_socket_group"), g, true))
                        .transpose()?;
                    let uid = a
                        .vfio_user_socket_owner
                        .as_deref()
                        .map(|u| id_of(&format!("{at}.vfio_user_socket_owner"), u, false))
                        .transpose()?;
                    Some(ServedSocket {
                        path: p.clone(),
                        access: bridge_host::SocketAccess { mode, uid, gid },
                    })
                }
            };
            out.push((o, served));
        }
        // Each device its own place in the host's view: those without `bdf` take the first
        // free slots from 00:01.0 on (00:01.0, 00:02.0, …), past every one given.
        let given: Vec<tlp::Bdf> = self
            .attach
            .iter()
            .zip(&out)
            .filter(|(a, _)| a.bdf.is_some())
            .map(|(_, (o, _))| o.device_id)
            .collect();
        for (i, (o, _)) in out.iter().enumerate() {
            if self.attach[i].bdf.is_some()
                && let Some(j) =
                    (0..i).find(|j| self.attach[*j].bdf.is_some() && out[*j].0.device_id == o.device_id)
            {
                return Err(bad(
                    &format!("attach[{i}].bdf"),
                    format!("\"{}\"", o.device_id),
                    &format!("attach[{j}] is at that BDF already: each device needs its own"),
                ));
            }
        }
        let mut free = (1u8..32).map(|d| tlp::Bdf::new(0, d, 0)).filter(|b| !given.contains(b));
        for (i, (o, _)) in out.iter_mut().enumerate() {
            if self.attach[i].bdf.is_none() {
                o.device_id = free.next().ok_or_else(|| {
                    bad(&format!("attach[{i}]"), i, "no free BDF on bus 0 left for it: give bdf")
                })?;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KEY: &str = "00112233445566778899aabbccddeeff";

    fn gpu(text: &str) -> Result<GpuOptions, String> {
        toml::from_str::<GpuFile>(text).map_err(|e| e.to_string())?.options(None)
    }

    #[test]
    fn a_complete_gpu_file_is_understood() {
        let o = gpu(&format!(
            r#"listen = "127.0.0.1:7441"
            [link]
            mtu = 9000
            encrypt_frames = true
            key_update_frames = 100000
            poll = "busy"
            spin_us = 50
            gro = false
            zero_copy_send = true
            bandwidth_gbit = 100
            rtt_us = 20
            [[host]]
            name = "a"
            key = "{KEY}"
            [[device]]
            name = "gpu0"
            sim = {{ vram_mib = 1024 }}
            allow = ["a"]"#
        ))
        .unwrap();
        assert_eq!(o.listen, "127.0.0.1:7441".parse().unwrap());
        assert_eq!(o.link.mtu, 9000);
        assert!(o.link.encrypt_frames);
        assert_eq!(o.link.key_update_frames, 100_000);
        assert_eq!(o.poll, PollMode::Busy { spin: Duration::from_micros(50) });
        assert!(matches!(&o.exports[0].device, DeviceSpec::Sim(p) if p.vram_bytes == 1 << 30));
        assert_eq!(o.offload, link::driver::Offload { gso: true, gro: false, zero_copy_send: true });
        // 100 Gbit/s × 20 µs × 2 = 500 KB in flight: 31,250 data credits, 62 frames → 128.
        assert_eq!(o.link.credits.posted.1, 31_250);
        assert_eq!(o.link.window, 128);
    }

    fn gpu_pool(pool: &str) -> Result<GpuPool, String> {
        let text = format!(
            "[[host]]\nname = \"a\"\nkey = \"{KEY}\"\n[[device]]\nname = \"gpu0\"\nsim = {{}}\nallow = [\"a\"]\n[pool]\n{pool}"
        );
        let f = toml::from_str::<GpuFile>(&text).map_err(|e| e.to_string())?;
        let o = f.options(None)?;
        f.pool.as_ref().ok_or("no [pool]")?.pool(&o.exports)
    }

    fn host_pool(pool: &str) -> Result<Option<HostPool>, String> {
        toml::from_str::<HostFile>(&format!("[pool]\n{pool}")).map_err(|e| e.to_string())?.pool()
    }

    #[test]
    fn pool_sections_are_understood_and_bad_ones_refused_naming_the_key() {
        let etcd = "etcd = [\"http://127.0.0.1:2379\"]";
        let g = gpu_pool(&format!("{etcd}\nbox = \"box-a\"\nadvertise = \"10.0.0.7:7440\"\nlease_ttl_s = 7"))
            .unwrap();
        assert_eq!(
            (g.box_name.as_str(), g.advertise.port(), g.config.lease_ttl.as_secs()),
            ("box-a", 7440, 7)
        );
        let h =
            host_pool(&format!("{etcd}\nhost = \"host-a\"\nkey = \"{KEY}\"\nwant = 2\nvendor_id = 0x1234"))
                .unwrap()
                .unwrap();
        assert_eq!((h.agent.want, h.agent.filter.vendor_id), (2, Some(0x1234)));
        let box_cases = [
            ("etcd = [\"https://127.0.0.1:2379\"]\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"", "etcd"),
            ("etcd = [\"127.0.0.1\"]\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"", "etcd"),
            ("etcd = []\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"", "etcd"),
            (&*format!("{etcd}\nbox = \"a/b\"\nadvertise = \"10.0.0.7:7440\""), "pool.box"),
            (&*format!("{etcd}\nbox = \"b\"\nadvertise = \"0.0.0.0:7440\""), "pool.advertise"),
            (
                &*format!("{etcd}\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"\nlease_ttl_s = 1"),
                "pool.lease_ttl_s",
            ),
            (&*format!("{etcd}\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"\nleas_ttl_s = 5"), "leas_ttl_s"),
        ];
        // host:port is taken as etcdctl takes it.
        let g = gpu_pool("etcd = [\"127.0.0.1:2379\"]\nbox = \"b\"\nadvertise = \"10.0.0.7:7440\"").unwrap();
        assert_eq!(g.config.etcd, ["http://127.0.0.1:2379"]);
        for (text, key) in box_cases {
            let e = gpu_pool(text).err().unwrap_or_else(|| panic!("{text:?} accepted"));
            assert!(e.contains(key), "error for {key:?} does not name it: {e}");
        }
        let host_cases = [
            (format!("{etcd}\nhost = \"h\"\nkey = \"{KEY}\"\nwant = 0"), "pool.want"),
            (format!("{etcd}\nhost = \"\"\nkey = \"{KEY}\"\nwant = 1"), "pool.host"),
            (format!("{etcd}\nhost = \"h\"\nwant = 1"), "pool: key or key_file"),
            (
                format!("{etcd}\nhost = \"h\"\nkey = \"{KEY}\"\nwant = 1\nvfio_user_dir = \"/nonexistent\""),
                "pool.vfio_user_dir",
            ),
            (format!("{etcd}\nhost = \"h\"\nkey = \"{KEY}\"\nwant = 1\nvendor_id = 70000"), "vendor_id"),
            (format!("{etcd}\nhost = \"h\"\nkey = \"{KEY}\"\nwant = 1\nboxes = [\"a b\"]"), "pool.boxes[0]"),
        ];
        for (text, key) in host_cases {
            let e = host_pool(&text).err().unwrap_or_else(|| panic!("{text:?} accepted"));
            assert!(e.contains(key), "error for {key:?} does not name it: {e}");
        }
    }

    #[test]
    fn bad_files_are_refused_naming_the_key() {
        let base = |extra: &str, dev: &str| {
            format!(
                "{extra}\n[[host]]\nname = \"a\"\nkey = \"{KEY}\"\n[[device]]\nname = \"gpu0\"\nallow = [\"a\"]\n{dev}"
            )
        };
        let cases = [
            (base("[link]\nmtu = 100", "sim = {}"), "mtu"),
            (base("[link]\nbandwidth_gbit = 0", "sim = {}"), "link.bandwidth_gbit"),
            (base("[link]\nbandwidth_gbit = 1601", "sim = {}"), "link.bandwidth_gbit"),
            (base("[link]\nrtt_us = 0", "sim = {}"), "link.rtt_us"),
            (base("[link]\ngso = \"yes\"", "sim = {}"), "gso"),
            (base("[link]\ndriver = \"dpdk\"", "sim = {}"), "link.driver"),
            (base("[link]\nmtuu = 1", "sim = {}"), "mtuu"),
            (base("", "sim = { vram_mib = 3 }"), "device[0].sim.vram_mib"),
            (base("", "vfio = \"41:00.0\""), "device[0].vfio"),
            (base("", ""), "device[0]"),
            (base("[impairment]\nloss = 2.0", "sim = {}"), "impairment.loss"),
            (base("listen = \"nowhere\"", "sim = {}"), "listen"),
            (
                "[[host]]\nname = \"a\"\nkey = \"abcd\"\n[[device]]\nname = \"g\"\nsim = {}\nallow = [\"a\"]"
                    .to_string(),
                "host[0].key",
            ),
            (
                format!(
                    "[[host]]\nname = \"a\"\nkey = \"{KEY}\"\n[[device]]\nname = \"g\"\nsim = {{}}\nallow = [\"b\"]"
                ),
                "device[0].allow[0]",
            ),
        ];
        for (text, key) in cases {
            let e = gpu(&text).unwrap_err();
            assert!(e.contains(key), "error for {key:?} does not name it: {e}");
        }
    }

    /// Each gap the adversarial review found in what was accepted (issue 15, item 10): refused
    /// at start, naming the key and the value (each case was accepted before).
    #[test]
    fn what_used_to_be_accepted_is_refused_naming_key_and_value() {
        let gpu_with = |link: &str, host_key: &str, dev: &str| {
            format!(
                "{link}\n[[host]]\nname = \"a\"\nkey = \"{host_key}\"\n[[device]]\nname = \"gpu0\"\n{dev}"
            )
        };
        let dev = "sim = {}\nallow = [\"a\"]";
        let plus = "+0".repeat(16);
        let zeros = "00".repeat(16);
        let gpu_cases = [
            (gpu_with("", &plus, dev), "host[0].key", "hexadecimal"),
            (gpu_with("", &zeros, dev), "host[0].key", "all zeros"),
            (gpu_with("[link]\nidle_timeout_ms = 50", KEY, dev), "link.idle_timeout_ms = 50", "keepalive_ms"),
            (
                gpu_with("[link]\nhandshake_timeout_ms = 50", KEY, dev),
                "link.handshake_timeout_ms = 50",
                "100..=",
            ),
            (
                gpu_with("[link]\nreplay_timeout_us = 9200000000000000000", KEY, dev),
                "link.replay_timeout_us",
                "..=",
            ),
            (gpu_with("[link]\nkeepalive_ms = 9200000000000000000", KEY, dev), "link.keepalive_ms", "..="),
            (gpu_with("[link]\nack_delay_us = 9200000000000000000", KEY, dev), "link.ack_delay_us", "..="),
            (gpu_with("[link]\nspin_us = 9200000000000000000", KEY, dev), "link.spin_us", "..="),
            (
                gpu_with("[impairment]\nrate_mbps = 9200000000000000000", KEY, dev),
                "impairment.rate_mbps",
                "..=",
            ),
            (
                gpu_with("[impairment]\ndelay_us = 9200000000000000000", KEY, dev),
                "impairment.delay_us",
                "..=",
            ),
            (
                gpu_with("[impairment]\njitter_us = 9200000000000000000", KEY, dev),
                "impairment.jitter_us",
                "..=",
            ),
            (gpu_with("", KEY, "sim = {}\nallow = []"), "device[0].allow = []", "no host"),
            (
                gpu_with("", KEY, "sim = { vram_mib = 128 }\nallow = [\"a\"]"),
                "device[0].sim.vram_mib = 128",
                "256",
            ),
            (gpu_with("[link]\nmtu = 100", KEY, dev), "link.mtu = 100", "354"),
            (gpu_with("[link]\nkey_update_frames = 3", KEY, dev), "link.key_update_frames = 3", "16..="),
        ];
        for (text, key, why) in gpu_cases {
            let e = gpu(&text).unwrap_err();
            assert!(e.contains(key) && e.contains(why), "expected {key} / {why}: {e}");
            assert!(!e.contains("link.link") && !e.contains("link setting"), "{e}");
        }
        let host = |extra: &str| -> Result<Vec<(AttachOptions, Option<ServedSocket>)>, String> {
            toml::from_str::<HostFile>(&format!(
                "[[attach]]\nserver = \"127.0.0.1:7440\"\ndevice = \"gpu0\"\nkey = \"{KEY}\"\n{extra}"
            ))
            .map_err(|e| e.to_string())?
            .attachments(None)
        };
        let port0 = toml::from_str::<HostFile>(&format!(
            "[[attach]]\nserver = \"127.0.0.1:0\"\ndevice = \"gpu0\"\nkey = \"{KEY}\""
        ))
        .unwrap()
        .attachments(None)
        .unwrap_err();
        assert!(port0.contains("attach[0].server = \"127.0.0.1:0\""), "{port0}");
        let twice =
            host(&format!("[[attach]]\nserver = \"127.0.0.1:7440\"\ndevice = \"gpu0\"\nkey = \"{KEY}\""))
                .unwrap_err();
        assert!(twice.contains("attach[1].device") && twice.contains("attach[0]"), "{twice}");
        let tmp = std::env::temp_dir().join("gpu0.sock").display().to_string();
        let open = host(&format!("vfio_user_socket = {tmp:?}\nvfio_user_socket_mode = 0o666")).unwrap_err();
        assert!(open.contains("vfio_user_socket_mode = 0o666") && open.contains("others nothing"), "{open}");
        let nogroup =
            host(&format!("vfio_user_socket = {tmp:?}\nvfio_user_socket_group = \"no-such-group-dxpu\""))
                .unwrap_err();
        assert!(nogroup.contains("vfio_user_socket_group") && nogroup.contains("no such group"), "{nogroup}");
        let alone = host("vfio_user_socket_mode = 0o660").unwrap_err();
        assert!(alone.contains("only with vfio_user_socket"), "{alone}");
        let given = host(&format!(
            "vfio_user_socket = {tmp:?}\nvfio_user_socket_mode = 0o660\nvfio_user_socket_group = \"0\""
        ))
        .unwrap();
        assert_eq!(
            given[0].1.as_ref().map(|s| s.access),
            Some(bridge_host::SocketAccess { mode: 0o660, uid: None, gid: Some(0) })
        );
        let no_dir = host("vfio_user_socket = \"/nonexistent-dxpu-dir/gpu0.sock\"").unwrap_err();
        assert!(
            no_dir.contains("attach[0].vfio_user_socket") && no_dir.contains("does not exist"),
            "{no_dir}"
        );
        if let Some(total) = physical_memory_mib()
            && total < 65536
        {
            let big = host("dma_memory_mib = 65536").unwrap_err();
            assert!(big.contains("attach[0].dma_memory_mib = 65536") && big.contains("memory"), "{big}");
        }
        assert!(host("").is_ok());
    }

    #[test]
    fn configuration_files_are_read_bounded_and_as_text() {
        let e = read_bounded(Path::new("/dev/zero"), MAX_CONFIG_BYTES).unwrap_err();
        assert!(e.contains("/dev/zero") && e.contains("longer than"), "{e}");
        let dir = std::env::temp_dir().join(format!("dxpu-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("latin1.toml");
        std::fs::write(&f, b"listen = \"\xe9\"").unwrap();
        let e = read_bounded(&f, MAX_CONFIG_BYTES).unwrap_err();
        assert!(e.contains("not UTF-8"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn host_files_give_attach_options() {
        let f: HostFile = toml::from_str(&format!(
            r#"[[attach]]
            server = "10.0.0.7:7440"
            device = "gpu0"
            key = "{KEY}"
            completion_timeout_ms = 20
            bdf = "00:05.0""#
        ))
        .unwrap();
        let o = f.options(None).unwrap();
        assert_eq!(o[0].completion_timeout, Duration::from_millis(20));
        assert_eq!(o[0].device_id, tlp::Bdf::new(0, 5, 0));
        let o = f.options(Some("127.0.0.1:1")).unwrap();
        let sock = std::env::temp_dir().join("gpu0.sock");
        let served = toml::from_str::<HostFile>(&format!(
            "[[attach]]\nserver = \"127.0.0.1:7440\"\ndevice = \"gpu0\"\nkey = \"{KEY}\"\nvfio_user_socket = \"{}\"",
            sock.display()
        ))
        .unwrap()
        .attachments(None)
        .unwrap();
        assert_eq!(served[0].1.as_ref().map(|s| s.path.as_path()), Some(sock.as_path()));
        assert_eq!(served[0].1.as_ref().map(|s| s.access), Some(bridge_host::SocketAccess::default()));
        assert_eq!(served[0].0.dma_memory, 0, "a VMM grants guest memory: no arena");
        assert_eq!(served[0].0.driver, link::driver::DriverKind::Portable);
        assert_eq!(o[0].server, "127.0.0.1:1".parse().unwrap());
        let f: HostFile = toml::from_str(&format!(
            "[[attach]]\nserver = \"x\"\ndevice = \"g\"\nkey = \"{KEY}\"\ncompletion_timeout_ms = 0"
        ))
        .unwrap();
        assert!(f.options(None).unwrap_err().contains("attach[0].server"));
    }

    /// Devices without `bdf` each get their own place in the host's view (on 9b5fbd6 every
    /// one was at 00:01.0), past the ones given; two given the same BDF are refused.
    #[test]
    fn each_attach_gets_its_own_bdf() {
        let attach = |dev: &str, bdf: Option<&str>| {
            let b = bdf.map(|b| format!("bdf = \"{b}\"\n")).unwrap_or_default();
            format!("[[attach]]\nserver = \"127.0.0.1:7440\"\ndevice = \"{dev}\"\nkey = \"{KEY}\"\n{b}")
        };
        let text =
            [attach("a", None), attach("b", Some("00:01.0")), attach("c", None), attach("d", None)].concat();
        let f: HostFile = toml::from_str(&text).unwrap();
        let bdfs: Vec<String> =
            f.attachments(None).unwrap().iter().map(|(o, _)| o.device_id.to_string()).collect();
        assert_eq!(bdfs, ["00:02.0", "00:01.0", "00:03.0", "00:04.0"]);
        let text = [attach("a", Some("00:07.0")), attach("b", Some("00:07.0"))].concat();
        let f: HostFile = toml::from_str(&text).unwrap();
        let e = f.attachments(None).unwrap_err();
        assert!(e.contains("attach[1].bdf") && e.contains("attach[0] is at that BDF already"), "{e}");
    }
}
