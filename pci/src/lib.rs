//! What both sides of the PCIe boundary share. [`config`] is the config-space register
//! model — registers with a writable mask and a write-1-to-clear mask per byte, BARs that
//! answer size probing, capability chains — on which the box's emulated functions are built
//! and the host endpoint's view of a remote function's config space too. [`eventfd`] holds
//! the eventfds VFIO delivers MSI-X vectors to, on the box and in a driver's platform.
//!
//! ```
//! use pci::{Bar, BarKind, ConfigSpace};
//!
//! let mut cfg = ConfigSpace::new(0x1234, 0xd9a0, [0x02, 0x80, 0x03], 1, (0x1234, 0x0001));
//! cfg.add_bar(Bar { index: 0, kind: BarKind::Memory32, prefetchable: false, size: 64 * 1024 });
//! // Size BAR0 the way system software does: all ones, read back.
//! cfg.write(0x10, 4, 0xffff_ffff);
//! assert_eq!(!(cfg.read(0x10, 4) & !0xf) + 1, 64 * 1024);
//! ```
#![forbid(unsafe_code)]

pub mod config;
pub mod eventfd;

pub use config::{Bar, BarKind, CONFIG_SIZE, ConfigSpace, ConfigWrite, PcieCapability, command};
pub use eventfd::MsixEventfds;
