//! The TOML configuration of `dxpu gpu` and `dxpu host` (documented, with a complete
//! example, in `docs/operations.md`). Parsing refuses unknown keys; validation names the key
//! at fault and says what is wrong with its value.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bridge_gpu::ExportSpec;
use bridge_host::AttachOptions;

use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use serde::Deserialize;

use access::warn_if_the_service_cannot_read;
pub use access::{SERVICE_USER, running_as, with_user_hint};
pub(crate) use access::{check_writable, socket_dir};
pub use error::ConfigError;
use error::bad;

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
    /// Silence a session rides through before it is declared down (at least the idle
    /// timeout; `link::DEFAULT_RIDE_THROUGH` by default, or the idle timeout if longer).
    ride_through_ms: Option<u64>,
    handshake_timeout_ms: Option<u64>,
    authenticate_frames: Option<bool>,
    encrypt_frames: Option<bool>,
    key_update_frames: Option<u64>,
    /// `auto`, `io_uring` or `portable`.
    pub(crate) driver: Option<String>,
    /// `blocking` or `busy`.
    pub(crate) poll: Option<String>,
    /// The command line's `--driver` and `--poll`, over `driver` and `poll`.
    #[serde(skip)]
    pub(crate) over: LinkOverride,
    spin_us: Option<u64>,
    /// UDP GSO / GRO (on where the kernel has them), zero-copy sends (io_uring; off).
    gso: Option<bool>,
    gro: Option<bool>,
    zero_copy_send: Option<bool>,
}

/// `[impairment]`: what the path does to what the endpoint receives.
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

impl ControlSection {
    /// What the start will need of the socket's directory (`--check`): one this process may
    /// write, or one it may make (the start makes it). A directory not there whose parent this
    /// process may not write is warned about, not refused: a unit's `RuntimeDirectory` makes
    /// it before the start.
    pub fn check(&self) -> Result<(), ConfigError> {
        let Some(p) = &self.socket else { return Ok(()) };
        let dir = socket_dir("control.socket", p)?;
        if dir.is_dir() {
            return check_writable("control.socket", p, dir);
        }
        let made_in = dir.ancestors().skip(1).find(|a| a.is_dir()).unwrap_or(Path::new("/"));
        if check_writable("control.socket", p, made_in).is_err() {
            log::warn!(
                "control.socket = {}: its directory {} is not there and this process ({}) may not make it in {}; the packaged units' RuntimeDirectory makes it at start",
                p.display(),
                dir.display(),
                running_as(),
                made_in.display()
            );
        }
        Ok(())
    }
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
    pub fn listen(&self) -> Result<Option<SocketAddr>, ConfigError> {
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
    /// After a reload changes a host's key, how long its old key is still accepted
    /// (seconds; the sessions made with it then end).
    key_overlap_s: Option<u64>,
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
    #[serde(flatten)]
    etcd_access: EtcdAccess,
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
    #[serde(flatten)]
    etcd_access: EtcdAccess,
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
    /// Each served socket's mode (0o600 unless given), group and owner, as `[[attach]]`'s.
    vfio_user_socket_mode: Option<u32>,
    vfio_user_socket_group: Option<String>,
    vfio_user_socket_owner: Option<String>,
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
    /// The mode, owner and group of each socket in `vfio_user_dir`.
    pub(crate) socket_access: bridge_host::SocketAccess,
}

/// How `[pool]` reaches etcd where etcd is secured: etcdctl's `--cacert`, `--cert`, `--key`
/// and `--user` as `etcd_cacert`, `etcd_cert`, `etcd_key`, `etcd_user` (the password in
/// `etcd_password_file`, never in the file itself).
#[derive(Deserialize, Debug, Clone, PartialEq, Default)]
pub(crate) struct EtcdAccess {
    etcd_cacert: Option<PathBuf>,
    etcd_cert: Option<PathBuf>,
    etcd_key: Option<PathBuf>,
    etcd_user: Option<String>,
    etcd_password_file: Option<PathBuf>,
}

impl EtcdAccess {
    /// The TLS files and the user, the password read from its file.
    fn security(&self) -> Result<pool::EtcdSecurity, ConfigError> {
        let password = match &self.etcd_password_file {
            None => None,
            Some(f) => {
                let text = std::fs::read_to_string(f).map_err(|e| {
                    bad("pool.etcd_password_file", format!("{f:?}"), &format!("cannot be read: {e}"))
                })?;
                Some(text.trim_end_matches(['\n', '\r']).to_string())
            }
        };
        Ok(pool::EtcdSecurity {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password,
        })
    }
}

fn pool_config(
    etcd: &[String],
    access: &EtcdAccess,
    ttl: Option<u64>,
    prefix: &Option<String>,
) -> Result<pool::PoolConfig, ConfigError> {
    let security = access.security()?;
    let etcd: Vec<String> = etcd
        .iter()
        .map(|e| {
            pool::etcd_url_for(e, security.tls())
                .map_err(|why| ConfigError::section("pool.etcd", why.to_string()))
        })
        .collect::<Result<_, _>>()?;
    let mut c = pool::PoolConfig::new(etcd);
    c.security = security;
    if let Some(t) = ttl {
        within("pool.lease_ttl_s", Some(t), 2..=3600, "s")?;
        c.lease_ttl = Duration::from_secs(t);
    }
    if let Some(p) = prefix {
        c.prefix = p.clone();
    }
    c.validate().map_err(|e| ConfigError::Pool(e.to_string()))?;
    Ok(c)
}

impl GpuPoolSection {
    /// The box's pool settings, for the devices it exports.
    pub fn pool(&self, exports: &[ExportSpec]) -> Result<GpuPool, ConfigError> {
        let config = pool_config(&self.etcd, &self.etcd_access, self.lease_ttl_s, &self.prefix)?;
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
fn id_of(key: &str, value: &str, group: bool) -> Result<u32, ConfigError> {
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

/// Largest configuration file read (a file this long is not a configuration).
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Reads at most `limit` bytes of `path` as text; longer, or not UTF-8, is an error naming
/// the file. `/dev/zero` and the like end at the limit.
pub fn read_bounded(path: &Path, limit: u64) -> Result<String, ConfigError> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| ConfigError::file(path, with_user_hint(&e, path)))?;
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes).map_err(|e| ConfigError::file(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(ConfigError::file(path, format!("longer than {limit} bytes: not a configuration file")));
    }
    String::from_utf8(bytes).map_err(|e| ConfigError::file(path, format!("not UTF-8 text ({e})")))
}

/// Reads and parses a TOML file; the error names the file, line and key.
pub fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, ConfigError> {
    let text = read_bounded(path, MAX_CONFIG_BYTES)?;
    toml::from_str(&text).map_err(|e| ConfigError::file(path, e.to_string().trim_end()))
}

/// A key from hex (at least 16 bytes), given inline or in a file.
fn key(section: &str, inline: &Option<String>, file: &Option<PathBuf>) -> Result<PresharedKey, ConfigError> {
    let (hex, key_name) = match (inline, file) {
        (Some(k), None) => (k.clone(), format!("{section}.key")),
        (None, Some(f)) => {
            let name = format!("{section}.key_file");
            warn_if_others_can_read(&name, f);
            warn_if_the_service_cannot_read(&name, f);
            (read_bounded(f, 4096).map_err(|e| bad(&name, f.display(), &e.to_string()))?, name)
        }
        (Some(_), Some(_)) => return Err(ConfigError::section(section, "give key or key_file, not both")),
        (None, None) => return Err(ConfigError::section(section, "key or key_file is required")),
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
pub fn driver_kind(key: &str, v: &str) -> Result<DriverKind, ConfigError> {
    match v {
        "auto" => Ok(DriverKind::Auto),
        "io_uring" | "uring" => Ok(DriverKind::IoUring),
        "portable" => Ok(DriverKind::Portable),
        other => Err(bad(key, format!("\"{other}\""), "must be \"auto\", \"io_uring\" or \"portable\"")),
    }
}

/// The poll mode `key` names (`blocking`, `busy` with `spin`).
pub fn poll_mode(key: &str, v: &str, spin: Duration) -> Result<PollMode, ConfigError> {
    match v {
        "blocking" => Ok(PollMode::Blocking),
        "busy" => Ok(PollMode::Busy { spin }),
        other => Err(bad(key, format!("\"{other}\""), "must be \"blocking\" or \"busy\"")),
    }
}

/// How an endpoint waits for work, as `--poll` names it (how long a busy one spins is the
/// file's `link.spin_us`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollChoice {
    /// Sleep in the kernel whenever there is nothing to do.
    Blocking,
    /// Spin on the rings for `link.spin_us` after the last work before sleeping.
    Busy,
}

/// The command line's `--driver` and `--poll`, laid over every reading of the file's
/// `[link]` (at the start, by `--check`, and at each reload).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkOverride {
    /// `--driver`.
    pub driver: Option<DriverKind>,
    /// `--poll`.
    pub poll: Option<PollChoice>,
}

impl LinkSection {
    /// Whether the file or the command line names a driver.
    pub(crate) fn names_driver(&self) -> bool {
        self.driver.is_some() || self.over.driver.is_some()
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
) -> Result<Option<T>, ConfigError> {
    match value {
        Some(v) if !range.contains(&v) => {
            Err(bad(key, v, &format!("must be {}..={} {unit}", range.start(), range.end())))
        }
        v => Ok(v),
    }
}

impl LinkSection {
    /// Every value in range, named as in the file, before the session's own checks.
    fn check(&self) -> Result<(), ConfigError> {
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
        if let Some(ride) = within("link.ride_through_ms", self.ride_through_ms, 2..=3_600_000, "ms")?
            && ride < idle
        {
            return Err(bad(
                "link.ride_through_ms",
                ride,
                &format!(
                    "must be at least link.idle_timeout_ms ({idle}): the link is silent first, then down"
                ),
            ));
        }
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
    pub fn settings(&self, psk: PresharedKey) -> Result<LinkSettings, ConfigError> {
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
            c.ride_through = c.ride_through.max(c.idle_timeout);
        }
        if let Some(v) = self.ride_through_ms {
            c.ride_through = Duration::from_millis(v);
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
        let driver = match self.over.driver {
            Some(d) => d,
            None => driver_kind("link.driver", self.driver.as_deref().unwrap_or("auto"))?,
        };
        let spin = Duration::from_micros(self.spin_us.unwrap_or(1000));
        let poll = match self.over.poll {
            Some(PollChoice::Blocking) => PollMode::Blocking,
            Some(PollChoice::Busy) => PollMode::Busy { spin },
            None => poll_mode("link.poll", self.poll.as_deref().unwrap_or("blocking"), spin)?,
        };
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
    pub fn impairment(&self) -> Result<Impairment, ConfigError> {
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

fn socket_addr(key: &str, v: &str) -> Result<SocketAddr, ConfigError> {
    v.parse().map_err(|_| bad(key, format!("\"{v}\""), "not an address:port (e.g. \"0.0.0.0:7440\")"))
}

/// The default UDP port of `dxpu gpu`.
pub const DEFAULT_PORT: u16 = 7440;

mod access;
mod error;
mod fingerprint;
mod gpu;
mod host;
pub mod page;
#[cfg(test)]
mod tests;
