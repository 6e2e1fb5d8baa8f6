//! What the experiments share: a GPU-box endpoint with one simgpu on a thread of its own
//! ([`LocalBox`], over `bridge_gpu::EndpointThread`, which the integration tests use too),
//! and the median-and-spread of a figure over runs.

use std::net::SocketAddr;

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, HostKey, SpawnError};
use bridge_host::AttachOptions;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};

use crate::affinity;
use crate::error::LabError;

pub use testbed::workload::mmio_read_rtt as mmio_rtt;

/// A figure over the runs: its median and its spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The middle value, or the mean of the middle two.
    pub median: f64,
    /// The least.
    pub min: f64,
    /// The most.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; all 0 where there are none.
    pub fn of(values: impl Iterator<Item = f64>) -> Spread {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => Spread { median: 0.0, min: 0.0, max: 0.0 },
            // The middle one, or the mean of the middle two.
            n => Spread {
                median: if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 },
                min: v[0],
                max: v[n - 1],
            },
        }
    }
}

fn random_key() -> PresharedKey {
    let mut rng = link::driver::os_rng(&mut |m| log::warn!("{m}"));
    let mut k = [0u8; 32];
    rng.fill(&mut k);
    PresharedKey::new(&k).unwrap_or_else(|| unreachable!("32 bytes is a valid key length"))
}

/// How a loopback link protects its frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Frames {
    /// Tagged (the link's default, `authenticate_frames`).
    Tagged,
    /// Bodies encrypted and tagged (`encrypt_frames`).
    Encrypted,
    /// Neither: for measuring what the tags cost (both ends must agree).
    Unauthenticated,
}

impl Frames {
    /// Encrypted where `encrypt`, else tagged.
    pub fn from_encrypt(encrypt: bool) -> Frames {
        if encrypt { Frames::Encrypted } else { Frames::Tagged }
    }
}

/// A GPU-box endpoint with one simgpu on its own thread, on 127.0.0.1.
pub struct LocalBox {
    /// Where the endpoint listens.
    pub addr: SocketAddr,
    /// The key its one host, `loopback-host`, attaches with.
    pub key: PresharedKey,
    /// The link's configuration, which a host attaching needs the same.
    pub link: link::Config,
    /// The offloads both endpoints ask their drivers for.
    pub offload: link::driver::Offload,
    endpoint: bridge_gpu::EndpointThread,
    /// The endpoint's thread, to pin.
    tid: affinity::Thread,
    /// What its busy polls spent on nothing ([`LocalBox::spun`]).
    spin: std::sync::Arc<link::driver::SpinTotals>,
}

impl LocalBox {
    /// Starts an endpoint exporting one simgpu, `gpu0`, to `loopback-host`, its frames
    /// tagged.
    pub fn start(driver: DriverKind, poll: PollMode, impairment: Impairment) -> Result<LocalBox, LabError> {
        LocalBox::start_with(driver, poll, impairment, Frames::Tagged)
    }

    /// [`LocalBox::start`], its link's frames protected as `frames` says.
    pub fn start_with(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
    ) -> Result<LocalBox, LabError> {
        LocalBox::start_offload(driver, poll, impairment, frames, link::driver::Offload::AUTO, None)
    }

    /// [`LocalBox::start_with`], both endpoints' drivers asked for `offload`, the endpoint's
    /// thread pinned to `cpu` where given.
    pub fn start_offload(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
        offload: link::driver::Offload,
        cpu: Option<usize>,
    ) -> Result<LocalBox, LabError> {
        let key = random_key();
        let mut link_cfg = link::Config::new(key.clone());
        // Loopback carries 4 KiB payloads in one datagram.
        link_cfg.mtu = 9000;
        link_cfg.size_for_path(link::DEFAULT_PATH_BANDWIDTH, link::DEFAULT_PATH_RTT);
        link_cfg.encrypt_frames = frames == Frames::Encrypted;
        // Tags are on when either end asks for them: both ends here share this setting.
        link_cfg.authenticate_frames = frames != Frames::Unauthenticated;
        let opts = GpuOptions {
            box_name: "loopback-box".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            link: link_cfg.clone(),
            hosts: vec![HostKey { name: "loopback-host".into(), key: key.clone() }],
            exports: vec![ExportSpec {
                name: "gpu0".into(),
                device: DeviceSpec::Sim(SimGpuParams::default()),
                allow: vec!["loopback-host".into()],
            }],
            driver,
            offload,
            poll,
            impairment,
            tap: None,
        };
        let (endpoint, (tid, spin)) = bridge_gpu::EndpointThread::spawn("dxpu-gpu", move || {
            affinity::pin_to(cpu).map_err(LabError::cpus("the GPU-box endpoint's thread"))?;
            let ep = GpuEndpoint::new(opts)?;
            let spin = ep.spin_totals();
            Ok::<_, LabError>((ep, (affinity::Thread::here(), spin)))
        })
        .map_err(|e| match e {
            SpawnError::Make(e) => e,
            SpawnError::Thread(e) => LabError::EndpointThread(SpawnError::Thread(e)),
            SpawnError::Address(e) => LabError::EndpointThread(SpawnError::Address(e)),
            SpawnError::Ended => LabError::EndpointThread(SpawnError::Ended),
        })?;
        Ok(LocalBox { addr: endpoint.addr(), key, link: link_cfg, offload, endpoint, tid, spin })
    }

    /// The time the endpoint's passes spent finding nothing to do so far (its busy polls'
    /// spins, `link::driver::SpinMeter`): its thread's CPU time less this is its work.
    pub fn spun(&self) -> std::time::Duration {
        self.spin.spun()
    }

    /// Lets the endpoint's thread run only on `cpu`; an error once it has ended (its thread
    /// ID may be another's by then).
    pub fn pin(&self, cpu: usize) -> Result<(), LabError> {
        if !self.endpoint.is_running() {
            return Err(LabError::EndpointEnded);
        }
        self.tid.pin(&[cpu]).map_err(LabError::cpus("the GPU-box endpoint's thread"))
    }

    /// Options for attaching its gpu0.
    pub fn attach_options(
        &self,
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
    ) -> AttachOptions {
        let mut o = AttachOptions::new(self.addr, "gpu0", self.key.clone());
        o.link = self.link.clone();
        o.driver = driver;
        o.offload = self.offload;
        o.poll = poll;
        o.impairment = impairment;
        o.dma_memory = 256 << 20;
        o
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_box_is_pinned_while_its_thread_runs_and_refused_after() {
        let gpu = LocalBox::start(DriverKind::Portable, PollMode::Blocking, Impairment::default()).unwrap();
        let cpu = affinity::allowed().unwrap()[0];
        gpu.pin(cpu).unwrap();
        gpu.endpoint.request_stop();
        let end = Instant::now() + Duration::from_secs(5);
        while gpu.endpoint.is_running() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gpu.pin(cpu).unwrap_err().to_string().contains("has ended"));
    }
}
