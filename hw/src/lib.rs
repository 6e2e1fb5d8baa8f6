//! The devices behind a GPU-box endpoint, as a bridge sees them: [`Device`] (host-originated
//! TLPs in, completions, DMA requests and MSI-X writes out as values the bridge takes
//! ([`Outbox`]), completions to the device's own reads, reset), [`Function`] (config space, MSI-X and the
//! Command register's gates put together the way a bridge drives a function: config TLPs
//! answered, memory requests decoded — UR while Memory Space Enable is clear —,
//! device-originated writes only with Bus Master Enable), the simulated GPU ([`SimGpu`]:
//! registers, sparse VRAM, a command processor doing DMA copies, fp32 kernels, fences and
//! interrupts) and real devices through VFIO (`vfio`). The config-space register model
//! itself (registers with writable and write-1-to-clear masks, BARs that answer size
//! probing, capability chains) is `pci`'s, re-exported here as `config`.
//!
//! ```
//! use hw::{simgpu, Function, MemoryTarget};
//! use tlp::{Bdf, CplStatus};
//!
//! let mut cfg = simgpu::config_space(&Default::default());
//! assert_eq!(cfg.read(0x00, 4), 0xd9a0_1234);
//! // Size BAR0 the way system software does: all ones, read back.
//! cfg.write(0x10, 4, 0xffff_ffff);
//! assert_eq!(!(cfg.read(0x10, 4) & !0xf) + 1, 64 * 1024);
//! cfg.write(0x10, 4, 0xfe00_0000);
//! let mut f = Function::new(Bdf::new(1, 0, 0), cfg);
//! // Until Memory Space Enable is set, the BAR does not decode.
//! assert_eq!(f.memory_target(0xfe00_0000), Err(CplStatus::UnsupportedRequest));
//! ```
// The VFIO backend reaches the OS through the pci-driver crate and `pci`'s eventfds: no
// `unsafe` of its own, as nowhere else here.
#![forbid(unsafe_code)]

pub use pci::config;
pub mod device;
pub mod function;
pub mod msix;
pub mod simgpu;
pub mod simgpu_device;
pub mod upstream;
pub mod vfio;

pub use config::{Bar, BarKind, ConfigSpace, ConfigWrite, PcieCapability};
pub use device::Device;
pub use function::{Function, MemoryTarget};
pub use msix::{MsixEntry, MsixMessage, MsixTable};
pub use simgpu_device::SimGpu;
pub use upstream::{Memory, NoMemory, Outbox, take_all};
