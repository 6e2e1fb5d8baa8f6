//! The PCIe side of a GPU-box endpoint: devices as a bridge sees them. This crate holds the
//! config-space emulation every emulated function uses: a type 0 header, BARs with size
//! probing, read-only / read-write / write-1-to-clear masks, and capability chains (PCI
//! Express, MSI-X, Power Management; extended capabilities from 0x100). Writes return their
//! side effects as values for the device to act on; nothing happens inside the write.
//! [`Function`] puts config space, MSI-X and the Command register's gates together the way
//! a bridge drives a function: config TLPs answered, memory requests decoded (UR while
//! Memory Space Enable is clear), device-originated writes only with Bus Master Enable.
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
// `unsafe` lives only where the OS is reached (the VFIO backend's eventfds); every other
// module forbids it.
#![deny(unsafe_code)]

pub use pci::config;
pub mod device;
pub mod function;
pub mod msix;
pub mod simgpu;
pub mod simgpu_device;
pub mod vfio;

pub use config::{Bar, BarKind, ConfigSpace, ConfigWrite, PcieCapability};
pub use device::Device;
pub use function::{Function, MemoryTarget, TlpQueue, Upstream};
pub use msix::{MsixEntry, MsixMessage, MsixTable};
pub use simgpu_device::SimGpu;
