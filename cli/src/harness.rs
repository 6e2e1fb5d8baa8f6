//! The experiment harness `dxpu loopback`, `dxpu model` and the benches share: a GPU-box
//! endpoint with one simgpu on a thread of its own ([`LocalBox`], over
//! `bridge_gpu::EndpointThread`, which the integration tests use too), the workloads by
//! name, and the median-and-spread of a figure over runs.

use std::net::SocketAddr;

use bridge_gpu::{DeviceSpec, ExportSpec, GpuEndpoint, GpuOptions, HostKey};
use bridge_host::AttachOptions;
use hw::simgpu::SimGpuParams;
use link::PresharedKey;
use link::driver::{DriverKind, Impairment, PollMode};
use testbed::workload::Workload;

use crate::affinity;

pub(crate) use testbed::workload::mmio_read_rtt as mmio_rtt;

/// The workloads `dxpu loopback` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WorkloadArg {
    /// Copies each way, a fill, vector kernels, a matrix multiply, fences by polling and by
    /// interrupt (`testbed::workload`).
    Demo,
    /// Weights resident in VRAM; per request a small input copy, MATMUL + VADD per layer, a
    /// small output copy, one fence waited by interrupt (`testbed::ai`).
    Inference,
    /// Per step forward and backward MATMULs per micro-batch, a gradient reduction, a SAXPY
    /// update; the loss read every 2 steps, a checkpoint every 4.
    Training,
    /// 2 MiB batches streamed host→device through two pinned buffers under kernels.
    DataLoading,
}

impl WorkloadArg {
    pub(crate) fn name(self) -> &'static str {
        match self {
            WorkloadArg::Demo => "demo",
            WorkloadArg::Inference => "inference",
            WorkloadArg::Training => "training",
            WorkloadArg::DataLoading => "data-loading",
        }
    }

    pub(crate) const ALL: [WorkloadArg; 4] =
        [WorkloadArg::Demo, WorkloadArg::Inference, WorkloadArg::Training, WorkloadArg::DataLoading];

    /// The workload at `scale`, with `--batch` and `--layers`; either given to a workload it
    /// does not apply to is refused (it would change nothing).
    pub(crate) fn workload(
        self,
        scale: u32,
        batch: Option<u16>,
        layers: Option<u16>,
    ) -> Result<Workload, String> {
        let w = Workload::named(self.name(), scale)
            .unwrap_or_else(|| unreachable!("every WorkloadArg names a workload"));
        let refused = |what: &str| format!("{what} does not apply to the {} workload", self.name());
        Ok(match w {
            Workload::Inference(mut s) => {
                s.batch = batch.map_or(s.batch, usize::from);
                s.layers = layers.map_or(s.layers, usize::from);
                Workload::Inference(s)
            }
            Workload::Training(mut s) => {
                if layers.is_some() {
                    return Err(refused("--layers (inference only)"));
                }
                s.batch = batch.map_or(s.batch, usize::from);
                Workload::Training(s)
            }
            _ if batch.is_some() => return Err(refused("--batch (inference and training only)")),
            _ if layers.is_some() => return Err(refused("--layers (inference only)")),
            w => w,
        })
    }
}

/// A figure over the runs: its median and its spread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    pub(crate) fn of(values: impl Iterator<Item = f64>) -> Spread {
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
pub(crate) enum Frames {
    /// Tagged (the link's default, `authenticate_frames`).
    Tagged,
    /// Bodies encrypted and tagged (`encrypt_frames`).
    Encrypted,
    /// Neither: for measuring what the tags cost (both ends must agree).
    Unauthenticated,
}

impl Frames {
    pub(crate) fn from_encrypt(encrypt: bool) -> Frames {
        if encrypt { Frames::Encrypted } else { Frames::Tagged }
    }
}

/// A GPU-box endpoint with one simgpu on its own thread, on 127.0.0.1.
pub(crate) struct LocalBox {
    pub(crate) addr: SocketAddr,
    pub(crate) key: PresharedKey,
    pub(crate) link: link::Config,
    /// The offloads both endpoints ask their drivers for.
    pub(crate) offload: link::driver::Offload,
    endpoint: bridge_gpu::EndpointThread,
    /// The endpoint's thread, to pin.
    tid: affinity::Thread,
}

impl LocalBox {
    pub(crate) fn start(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
    ) -> Result<LocalBox, String> {
        LocalBox::start_with(driver, poll, impairment, Frames::Tagged)
    }

    /// [`LocalBox::start`], its link's frames protected as `frames` says.
    pub(crate) fn start_with(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
    ) -> Result<LocalBox, String> {
        LocalBox::start_offload(driver, poll, impairment, frames, link::driver::Offload::AUTO, None)
    }

    /// [`LocalBox::start_with`], both endpoints' drivers asked for `offload`, the endpoint's
    /// thread pinned to `cpu` where given.
    pub(crate) fn start_offload(
        driver: DriverKind,
        poll: PollMode,
        impairment: Impairment,
        frames: Frames,
        offload: link::driver::Offload,
        cpu: Option<usize>,
    ) -> Result<LocalBox, String> {
        let key = random_key();
        let mut link_cfg = link::Config::new(key.clone());
        // Loopback carries 4 KiB payloads in one datagram.
        link_cfg.mtu = 9000;
        link_cfg.size_for_path(link::DEFAULT_PATH_BANDWIDTH, link::DEFAULT_PATH_RTT);
        link_cfg.encrypt_frames = frames == Frames::Encrypted;
        // Tags are on when either end asks for them: both ends here share this setting.
        link_cfg.authenticate_frames = frames != Frames::Unauthenticated;
        let opts = GpuOptions {
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
        let (endpoint, tid) = bridge_gpu::EndpointThread::spawn("dxpu-gpu", move || {
            affinity::pin_to(cpu).map_err(|e| format!("the GPU-box endpoint's thread: {e}"))?;
            let ep = GpuEndpoint::new(opts).map_err(|e| e.to_string())?;
            Ok::<_, String>((ep, affinity::Thread::here()))
        })
        .map_err(|e| e.to_string())?;
        Ok(LocalBox { addr: endpoint.addr(), key, link: link_cfg, offload, endpoint, tid })
    }

    /// Lets the endpoint's thread run only on `cpu`; an error once it has ended (its thread
    /// ID may be another's by then).
    pub(crate) fn pin(&self, cpu: usize) -> Result<(), String> {
        if !self.endpoint.is_running() {
            return Err("the GPU-box endpoint's thread has ended (its log says why)".into());
        }
        self.tid.pin(&[cpu]).map_err(|e| format!("the GPU-box endpoint's thread: {e}"))
    }

    /// Options for attaching its gpu0.
    pub(crate) fn attach_options(
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
        assert!(gpu.pin(cpu).unwrap_err().contains("has ended"));
    }
}
