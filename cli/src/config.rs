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
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct LinkSection {
    mtu: Option<usize>,
    window: Option<u32>,
    max_queued: Option<usize>,
    replay_timeout_us: Option<u64>,
    ack_delay_us: Option<u64>,
    keepalive_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    handshake_timeout_ms: Option<u64>,
    authenticate_frames: Option<bool>,
    /// `auto`, `io_uring` or `portable`.
    pub(crate) driver: Option<String>,
    /// `blocking` or `busy`.
    pub(crate) poll: Option<String>,
    spin_us: Option<u64>,
}

/// `[impairment]`: what the endpoint does to what it sends.
#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct ImpairmentSection {
    delay_us: Option<u64>,
    jitter_us: Option<u64>,
    loss: Option<f64>,
    duplicate: Option<f64>,
    corrupt: Option<f64>,
    rate_mbps: Option<u64>,
    seed: Option<u64>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct HostSection {
    name: String,
    key: Option<String>,
    key_file: Option<PathBuf>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct SimSection {
    vram_mib: Option<u64>,
    msix_vectors: Option<u16>,
    serial: Option<u64>,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
struct DeviceSection {
    name: String,
    sim: Option<SimSection>,
    vfio: Option<String>,
    allow: Vec<String>,
}

/// The whole file of `dxpu gpu`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuFile {
    pub(crate) listen: Option<String>,
    #[serde(default)]
    pub(crate) link: LinkSection,
    #[serde(default)]
    impairment: ImpairmentSection,
    #[serde(default)]
    host: Vec<HostSection>,
    #[serde(default)]
    device: Vec<DeviceSection>,
}

#[derive(Deserialize, Debug, Clone)]
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
}

/// The whole file of `dxpu host`.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostFile {
    #[serde(default)]
    pub(crate) link: LinkSection,
    #[serde(default)]
    impairment: ImpairmentSection,
    #[serde(default)]
    attach: Vec<AttachSection>,
}

fn bad(key: &str, value: impl std::fmt::Display, problem: &str) -> String {
    format!("{key} = {value}: {problem}")
}

/// Reads and parses a TOML file; the error names the file, line and key.
pub(crate) fn read<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {}", path.display(), e.to_string().trim_end()))
}

/// A key from hex (at least 16 bytes), given inline or in a file.
fn key(section: &str, inline: &Option<String>, file: &Option<PathBuf>) -> Result<PresharedKey, String> {
    let (hex, key_name) = match (inline, file) {
        (Some(k), None) => (k.clone(), format!("{section}.key")),
        (None, Some(f)) => (
            std::fs::read_to_string(f)
                .map_err(|e| bad(&format!("{section}.key_file"), f.display(), &e.to_string()))?,
            format!("{section}.key_file"),
        ),
        (Some(_), Some(_)) => return Err(format!("{section}: give key or key_file, not both")),
        (None, None) => return Err(format!("{section}: key or key_file is required")),
    };
    let hex = hex.trim();
    let bytes = parse_hex(hex).ok_or_else(|| bad(&key_name, "…", "not hexadecimal digits"))?;
    PresharedKey::new(&bytes).ok_or_else(|| {
        bad(&key_name, "…", &format!("{} bytes; a key needs at least 16 (32 hex digits)", bytes.len()))
    })
}

pub(crate) fn parse_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

pub(crate) fn driver_kind(key: &str, v: &str) -> Result<DriverKind, String> {
    match v {
        "auto" => Ok(DriverKind::Auto),
        "io_uring" | "uring" => Ok(DriverKind::IoUring),
        "portable" => Ok(DriverKind::Portable),
        other => Err(bad(key, format!("\"{other}\""), "must be \"auto\", \"io_uring\" or \"portable\"")),
    }
}

pub(crate) fn poll_mode(key: &str, v: &str, spin: Duration) -> Result<PollMode, String> {
    match v {
        "blocking" => Ok(PollMode::Blocking),
        "busy" => Ok(PollMode::Busy { spin }),
        other => Err(bad(key, format!("\"{other}\""), "must be \"blocking\" or \"busy\"")),
    }
}

/// What the `[link]` section says, on top of the defaults.
pub(crate) struct LinkSettings {
    pub(crate) config: link::Config,
    pub(crate) driver: DriverKind,
    pub(crate) poll: PollMode,
}

impl LinkSection {
    pub(crate) fn settings(&self, psk: PresharedKey) -> Result<LinkSettings, String> {
        let mut c = link::Config::new(psk);
        if let Some(v) = self.mtu {
            c.mtu = v;
        }
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
        c.validate().map_err(|e| format!("link.{e}"))?;
        let driver = driver_kind("link.driver", self.driver.as_deref().unwrap_or("auto"))?;
        let spin = Duration::from_micros(self.spin_us.unwrap_or(1000));
        let poll = poll_mode("link.poll", self.poll.as_deref().unwrap_or("blocking"), spin)?;
        Ok(LinkSettings { config: c, driver, poll })
    }
}

impl ImpairmentSection {
    pub(crate) fn impairment(&self) -> Result<Impairment, String> {
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

fn socket_addr(key: &str, v: &str) -> Result<SocketAddr, String> {
    v.parse().map_err(|_| bad(key, format!("\"{v}\""), "not an address:port (e.g. \"0.0.0.0:7440\")"))
}

/// The default UDP port of `dxpu gpu`.
pub(crate) const DEFAULT_PORT: u16 = 7440;

impl GpuFile {
    /// The endpoint's options; `listen` overrides the file's.
    pub(crate) fn options(&self, listen: Option<&str>) -> Result<GpuOptions, String> {
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
            if d.name.is_empty() || d.name.len() > link::attach::MAX_TEXT {
                return Err(bad(&format!("{at}.name"), format!("\"{}\"", d.name), "must be 1..=255 bytes"));
            }
            let device = match (&d.sim, &d.vfio) {
                (Some(s), None) => {
                    let mut p = SimGpuParams::default();
                    if let Some(v) = s.vram_mib {
                        if !(1..=1 << 20).contains(&v) || !v.is_power_of_two() {
                            return Err(bad(
                                &format!("{at}.sim.vram_mib"),
                                v,
                                "must be a power of two, 1..=1048576",
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
            poll: link.poll,
            impairment: self.impairment.impairment()?,
        })
    }
}

impl HostFile {
    /// One set of attach options per `[[attach]]`; `server` overrides every server address.
    #[cfg(test)]
    pub(crate) fn options(&self, server: Option<&str>) -> Result<Vec<AttachOptions>, String> {
        Ok(self.attachments(server)?.into_iter().map(|(o, _)| o).collect())
    }

    /// Each `[[attach]]`'s options with the vfio-user socket it is served on, if any. A
    /// device served to a VMM has no DMA arena (the VMM grants guest memory), no service
    /// thread (the server's thread drives the link) and, unless the file says otherwise,
    /// the portable link driver (its socket is what the server waits on).
    pub(crate) fn attachments(
        &self,
        server: Option<&str>,
    ) -> Result<Vec<(AttachOptions, Option<PathBuf>)>, String> {
        if self.attach.is_empty() {
            return Err("attach: at least one [[attach]] with server, device and key is needed".into());
        }
        let imp = self.impairment.impairment()?;
        let mut out = Vec::new();
        for (i, a) in self.attach.iter().enumerate() {
            let at = format!("attach[{i}]");
            let addr = match server {
                Some(s) => socket_addr("--server", s)?,
                None => socket_addr(&format!("{at}.server"), &a.server)?,
            };
            let k = key(&at, &a.key, &a.key_file)?;
            let link = self.link.settings(k.clone())?;
            let mut o = AttachOptions::new(addr, &a.device, k);
            o.link = link.config;
            o.driver = link.driver;
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
                if p.as_os_str().is_empty() || p.is_dir() {
                    return Err(bad(
                        &format!("{at}.vfio_user_socket"),
                        p.display(),
                        "must be a socket file path",
                    ));
                }
                o.dma_memory = 0;
                o.service_interval = None;
                if self.link.driver.is_none() {
                    o.driver = link::driver::DriverKind::Portable;
                }
            }
            out.push((o, a.vfio_user_socket.clone()));
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
            poll = "busy"
            spin_us = 50
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
        assert_eq!(o.poll, PollMode::Busy { spin: Duration::from_micros(50) });
        assert!(matches!(&o.exports[0].device, DeviceSpec::Sim(p) if p.vram_bytes == 1 << 30));
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
        let served = toml::from_str::<HostFile>(&format!(
            "[[attach]]\nserver = \"127.0.0.1:7440\"\ndevice = \"gpu0\"\nkey = \"{KEY}\"\nvfio_user_socket = \"/run/dxpu/gpu0.sock\""
        ))
        .unwrap()
        .attachments(None)
        .unwrap();
        assert_eq!(served[0].1.as_deref(), Some(Path::new("/run/dxpu/gpu0.sock")));
        assert_eq!(served[0].0.dma_memory, 0, "a VMM grants guest memory: no arena");
        assert_eq!(served[0].0.driver, link::driver::DriverKind::Portable);
        assert_eq!(o[0].server, "127.0.0.1:1".parse().unwrap());
        let f: HostFile = toml::from_str(&format!(
            "[[attach]]\nserver = \"x\"\ndevice = \"g\"\nkey = \"{KEY}\"\ncompletion_timeout_ms = 0"
        ))
        .unwrap();
        assert!(f.options(None).unwrap_err().contains("attach[0].server"));
    }
}
