//! What the endpoint is told: the hosts and their keys, the devices to export and who may
//! attach each, and how it runs ([`GpuOptions`]).

use std::net::SocketAddr;

use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, Offload, PollMode, Tap};

use crate::error::GpuError;

/// A host allowed to attach devices, known by its key.
#[derive(Clone, Debug)]
pub struct HostKey {
    /// The host's name (logs, refusals).
    pub name: String,
    /// Its pre-shared key.
    pub key: PresharedKey,
}

/// A host's key replaced by a reload, still accepted until `until`; then the sessions made
/// with it end.
#[derive(Clone, Debug)]
pub(crate) struct RetiringKey {
    pub(crate) host: String,
    pub(crate) key_id: [u8; 8],
    pub(crate) until: std::time::Instant,
}

/// What backs an exported device.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSpec {
    /// A simulated GPU.
    Sim(SimGpuParams),
    /// A real device bound to vfio-pci, by PCI address (`0000:41:00.0`).
    Vfio(String),
}

/// One exported device.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportSpec {
    /// The name hosts attach it by.
    pub name: String,
    /// What it is.
    pub device: DeviceSpec,
    /// Names of the hosts that may attach it.
    pub allow: Vec<String>,
}

/// How the endpoint runs.
#[derive(Clone, Debug)]
pub struct GpuOptions {
    /// The box's name (its pool name, else its host name), told to each host at attach so
    /// that the host's metrics name the box (`bridge::attach::Origin`).
    pub box_name: String,
    /// UDP address to listen on.
    pub listen: SocketAddr,
    /// Session settings (its key is replaced by the host keys).
    pub link: link::Config,
    /// Hosts and their keys; at least one.
    pub hosts: Vec<HostKey>,
    /// Devices to export; at least one.
    pub exports: Vec<ExportSpec>,
    /// Which UDP driver.
    pub driver: DriverKind,
    /// UDP GSO / GRO and zero-copy sends, as far as the kernel allows (logged at start).
    pub offload: Offload,
    /// Busy-poll or blocking.
    pub poll: PollMode,
    /// Emulated network impairment on what this endpoint receives.
    pub impairment: Impairment,
    /// Sees every datagram the endpoint sends and receives (a packet capture).
    pub tap: Option<Tap>,
}

/// Checks that every host `spec` allows is a known one; `at` says where in the configuration.
pub(crate) fn check_allow(at: &str, spec: &ExportSpec, hosts: &[HostKey]) -> Result<(), GpuError> {
    for h in &spec.allow {
        if !hosts.iter().any(|k| &k.name == h) {
            return Err(GpuError::Config(format!(
                "{at}.allow: host '{h}' is not among the hosts (known: {})",
                hosts.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    Ok(())
}
