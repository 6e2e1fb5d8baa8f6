//! The host endpoint: remote devices made local. [`RemoteDevice`] attaches one device that
//! a GPU-box endpoint (`bridge-gpu`, `dxpu gpu`) exports and implements the PCI function
//! access ([`driver::PciFunction`]) that drivers are written against, so the unchanged
//! simgpu driver runs on a GPU in another box:
//!
//! - **Config space** as the host sees it: BAR registers (placement and sizing) and the
//!   Expansion ROM BAR are virtualized here; every other register is forwarded to the
//!   device as CfgRd/CfgWr.
//! - **MMIO** reads become MRd with a 10-bit tag and a completion timeout; writes become
//!   posted MWr. Host-view BAR addresses are translated to where the box placed the BARs.
//! - **DMA** from the device is served only inside windows the host granted (the DMA arena
//!   [`driver::PciFunction::dma_alloc`] hands out, and windows mapped with [`RemoteDevice::map_window`]);
//!   anything else is answered with Unsupported Request (reads) or dropped (writes), counted,
//!   and logged with the device and address.
//! - **MSI-X** writes from the device to the interrupt window become interrupts that
//!   [`driver::PciFunction::wait_interrupt`] consumes.
//! - **Failure**: a read whose completion does not come within the completion timeout, or
//!   any read after the link went down, returns all-ones as a read of a vanished PCIe device
//!   does, and the device is reported surprise-removed ([`RemoteDevice::removed`]).
//! - **IDs**: requests carry the host's requester ID; config requests are retargeted from
//!   the device's host-view BDF to its BDF on the box, and the box's BDF in what the device
//!   sends is known as the host-view BDF in logs and counters.
//!
//! The rooms: `attach` (the phases of an attach), `config_view` (the host's registers, on
//! the same register-and-mask model as the box's functions), `requester` (tags, outstanding
//! reads, completion timeouts), `dma` (the windows), `device` (the state of one attached
//! device and the request path), `receive` (what arrives, through `bridge::dispatch`),
//! `remote` (the public API and the service thread), `vfio_user` (the server for VMMs),
//! `socket_path` (a UNIX socket at a path an operator named, never replacing what is not ours);
//! `addr` and `error` are the types that cross the API.
//!
//! The calling thread drives the link itself (run-to-completion): a register read queues
//! its MRd, transmits it, and polls the socket until the completion arrives, serving device
//! DMA that arrives meanwhile. In busy-poll mode with the io_uring driver that path makes no
//! system call beyond the io_uring submission. A service thread keeps the session alive
//! (keepalives, acknowledgements, DMA served) while the caller is not inside a call.
//!
//! ```no_run
//! use bridge_host::{AttachOptions, RemoteDevice};
//! use driver::{SimGpuDriver, WaitMode};
//! use simgpu_abi::op;
//! use link::PresharedKey;
//!
//! let key = PresharedKey::new(b"a key of at least sixteen bytes!").unwrap();
//! let opts = AttachOptions::new("192.0.2.7:7440".parse().unwrap(), "gpu0", key);
//! let remote = RemoteDevice::attach(opts).unwrap();
//! // The simgpu driver, unchanged, on a GPU in another box.
//! let mut gpu = SimGpuDriver::open(remote).unwrap();
//! gpu.memcpy_to_device(0, &[1, 2, 3, 4]).unwrap();
//! gpu.launch(op::NOP, [0; 5], WaitMode::Interrupt).unwrap();
//! println!("{:?}", gpu.pci().stats());
//! ```
// `unsafe` lives only in the vfio-user server (mapping a client's memory file, passing
// descriptors); every other module forbids it.
#![deny(unsafe_code)]

pub mod addr;
mod attach;
mod config_view;
mod device;
mod dma;
mod error;
mod fence;
mod receive;
mod remote;
mod requester;
pub mod socket_path;
mod stats;
pub mod vfio_user;

pub use addr::{BoxAddr, BusAddr};
pub use attach::{AttachError, AttachOptions};
pub use config_view::{BAR32_BASE, BAR64_BASE, BarView};
pub use dma::{ClientMemory, DMA_ARENA_BASE};
pub use driver::MSI_BASE;
pub use error::HostError;
pub use fence::Fence;
pub use remote::{RemoteDevice, RemovalWatch};
pub use socket_path::SocketAccess;
pub use stats::{HostStats, LatencyHistogram};

pub(crate) use device::Access;
