//! Helpers for dxpu's cross-crate integration tests: a GPU-box endpoint on its own thread,
//! host options pointing at it, and the keys both sides use.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bridge_gpu::{DeviceSpec, EndpointThread, ExportSpec, GpuEndpoint, GpuOptions, GpuStats, HostKey};
use bridge_host::AttachOptions;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};

pub fn key_a() -> PresharedKey {
    PresharedKey::new(b"host-a's key: 32 bytes, not less").unwrap()
}
pub fn key_b() -> PresharedKey {
    PresharedKey::new(b"host-b's key: 32 bytes, not less").unwrap()
}

/// Integration tests share two cores: run one bridged test at a time.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Link settings for tests: a quick idle timeout, ride-through and handshake so failures
/// show fast (a test of an outage sets the ride-through it needs).
pub fn test_link(key: PresharedKey) -> link::Config {
    let mut c = link::Config::new(key);
    c.idle_timeout = Duration::from_millis(500);
    c.ride_through = Duration::from_secs(1);
    c.keepalive_interval = Duration::from_millis(50);
    c.handshake_timeout = Duration::from_secs(1);
    c
}

pub fn gpu_options(listen: SocketAddr) -> GpuOptions {
    GpuOptions {
        box_name: "box-a".into(),
        listen,
        link: test_link(key_a()),
        hosts: vec![
            HostKey { name: "host-a".into(), key: key_a() },
            HostKey { name: "host-b".into(), key: key_b() },
        ],
        exports: vec![ExportSpec {
            name: "gpu0".into(),
            device: DeviceSpec::Sim(SimGpuParams::default()),
            allow: vec!["host-a".into(), "host-b".into()],
        }],
        driver: DriverKind::Auto,
        offload: link::driver::Offload::AUTO,
        poll: PollMode::Blocking,
        impairment: Impairment::default(),
        tap: None,
    }
}

/// A GPU-box endpoint serving on its own thread until stopped or killed.
pub struct GpuBox {
    pub addr: SocketAddr,
    endpoint: EndpointThread,
}

impl GpuBox {
    pub fn start(opts: GpuOptions) -> GpuBox {
        GpuBox::start_in(opts, None)
    }

    /// Starts the endpoint in network namespace `ns` (its thread enters it).
    pub fn start_in(opts: GpuOptions, ns: Option<String>) -> GpuBox {
        let (endpoint, ()) = EndpointThread::spawn("dxpu-test-gpu", move || {
            if let Some(ns) = ns {
                netns::enter(&ns).map_err(|e| e.to_string())?;
            }
            Ok::<_, String>((GpuEndpoint::new(opts).map_err(|e| e.to_string())?, ()))
        })
        .expect("GPU-box endpoint starts");
        GpuBox { addr: endpoint.addr(), endpoint }
    }

    /// Stops the endpoint the way SIGTERM does and returns its counters.
    pub fn stop(self) -> GpuStats {
        self.endpoint.stop()
    }

    /// Kills the endpoint: it stops answering at once, closing nothing.
    pub fn kill(self) -> GpuStats {
        self.endpoint.kill()
    }
}

pub use netns::Netns;

pub fn host_options(server: SocketAddr, key: PresharedKey) -> AttachOptions {
    let mut o = AttachOptions::new(server, "gpu0", key.clone());
    o.link = test_link(key);
    o.completion_timeout = Duration::from_millis(500);
    o.attach_timeout = Duration::from_secs(2);
    o
}

/// Sends one UDP datagram whose source is `from` — any address and port, the way an attacker
/// who forges the source would — through a raw IPv4 socket (root only). The UDP checksum is
/// left 0 (none, as IPv4 allows); the kernel fills in the IP header's checksum and length.
pub fn send_spoofed(
    from: std::net::SocketAddrV4,
    to: std::net::SocketAddrV4,
    payload: &[u8],
) -> std::io::Result<()> {
    use rustix::net::{AddressFamily, SendFlags, SocketType, ipproto, sendto, socket};
    let fd = socket(AddressFamily::INET, SocketType::RAW, Some(ipproto::RAW))?;
    let udp_len = 8 + payload.len();
    let total = 20 + udp_len;
    let mut p = Vec::with_capacity(total);
    p.extend_from_slice(&[0x45, 0, (total >> 8) as u8, total as u8, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    p.extend_from_slice(&from.ip().octets());
    p.extend_from_slice(&to.ip().octets());
    p.extend_from_slice(&from.port().to_be_bytes());
    p.extend_from_slice(&to.port().to_be_bytes());
    p.extend_from_slice(&(udp_len as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    sendto(&fd, &p, SendFlags::empty(), &std::net::SocketAddr::V4(to))?;
    Ok(())
}

/// A free UDP port on 127.0.0.1 (bound and released: good enough for a test's own socket).
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
