//! The PCIe side of a GPU-box endpoint: devices as a bridge sees them. This crate holds the
//! config-space emulation every emulated function uses: a type 0 header, BARs with size
//! probing, read-only / read-write / write-1-to-clear masks, and capability chains (PCI
//! Express, MSI-X, Power Management; extended capabilities from 0x100). Writes return their
//! side effects as values for the device to act on; nothing happens inside the write.
#![forbid(unsafe_code)]

pub mod config;
pub mod simgpu;

pub use config::{Bar, BarKind, ConfigSpace, ConfigWrite, PcieCapability};
