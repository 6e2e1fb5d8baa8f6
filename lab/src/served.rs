//! A remote simgpu served over vfio-user on a thread of its own, and clients that drive it
//! as QEMU's `vfio-user-pci` does (`testbed::vfio_user_client`): what `dxpu bench vfio-user`
//! measures the server with, without a VMM.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bridge_host::RemoteDevice;
use bridge_host::vfio_user::VfioUserServer;
use driver::SimGpuDriver;
use link::driver::{DriverKind, Impairment, PollMode};
use testbed::vfio_user_client::{GuestMemory, VfioUserClient};

use crate::error::LabError;
use crate::harness::LocalBox;

/// Where the clients' guest memory lies in the device's view.
const IOVA: u64 = 0x4000_0000;

/// gpu0 of a [`LocalBox`] attached through the host endpoint and served over vfio-user on
/// a socket in the temporary directory, by a thread of its own; stopped (the device
/// detached, the socket removed) on drop.
pub struct Served {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Served {
    /// Attaches `gpu`'s device with `driver` and `poll` (no DMA arena, no service thread: the
    /// server's thread drives the link) and serves it.
    pub fn start(gpu: &LocalBox, driver: DriverKind, poll: PollMode) -> Result<Served, LabError> {
        let mut o = gpu.attach_options(driver, poll, Impairment::default());
        o.dma_memory = 0;
        o.service_interval = None;
        let dev = RemoteDevice::attach(o)?;
        let path = std::env::temp_dir().join(format!(
            "dxpu-lab-vfio-user-{}-{}.sock",
            std::process::id(),
            gpu.addr.port()
        ));
        let mut server = VfioUserServer::bind(&path, dev, poll)
            .map_err(|e| LabError::VfioUser { what: "binding its socket", source: e })?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("dxpu-vfio-user".into())
            .spawn(move || {
                if let Err(e) = server.serve(&s) {
                    log::error!("vfio-user server: {e}");
                }
                server.into_device().detach();
            })
            .map_err(|e| LabError::VfioUser { what: "starting its thread", source: e })?;
        Ok(Served { path, stop, thread: Some(thread) })
    }

    /// A client with `len` bytes of guest memory, `shared` with the server as a file (else
    /// reached by DMA_READ / DMA_WRITE messages), and the simgpu driver opened on it.
    pub fn client(&self, shared: bool, len: usize) -> Result<SimGpuDriver<VfioUserClient>, LabError> {
        let c = VfioUserClient::open(&self.path, GuestMemory { shared, iova: IOVA, len })
            .map_err(|e| LabError::VfioUser { what: "connecting a client", source: e })?;
        SimGpuDriver::open(c).map_err(LabError::driver("vfio-user", "opening the simgpu"))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
