//! The driver side of a PCI function. A driver is written against [`PciFunction`] — config
//! reads and writes, MMIO at bus addresses, DMA memory from one [`DmaArena`], MSI-X messages
//! and one interrupt wait ([`wait_interrupt`]) — and runs unchanged on every platform that
//! offers it: a directly attached device (the test bed), a remote one through the host
//! endpoint (`bridge_host::RemoteDevice`), a vfio-user device from a VMM's side, and a
//! function bound to this kernel's `vfio-pci` ([`vfio::VfioFunction`], how the driver runs
//! inside a VM). [`simgpu`] is the simulated GPU's driver. Nothing here knows how a device is
//! built: the simgpu's registers come from `simgpu_abi`, the same definitions its model uses.
// `unsafe` lives only where the kernel is reached (the IOMMU mapping in `vfio`).
#![deny(unsafe_code)]

pub mod function;
pub mod pinned;
pub mod simgpu;
pub mod vfio;

pub use function::{
    BusAddr, DmaArena, DmaBuf, Interrupts, MAX_VECTORS, MSI_BASE, MsixTableInfo, PciFunction, WaitStep,
    find_capability, msix_table, wait_interrupt,
};
pub use pinned::Pinned;
pub use simgpu::{Command, DriverError, DriverStats, Patience, SimGpuDriver, WaitMode};
