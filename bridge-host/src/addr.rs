//! The address spaces that cross the host endpoint's API, each its own type so that one is
//! never passed where another is meant:
//!
//! - [`BusAddr`]: an address on the host's PCI bus — what the host view's BAR registers are
//!   programmed with, what the device's DMA requests carry (an I/O virtual address when a
//!   VMM's vIOMMU translates), where DMA windows are granted;
//! - [`BoxAddr`]: an address on the GPU box's bus, where the box placed a BAR. MMIO is
//!   translated from the first to the second before it leaves; the device's DMA arrives
//!   already in the first (the box forwards it untranslated).
#![forbid(unsafe_code)]

use std::fmt;

pub use driver::BusAddr;

/// An address on the GPU box's bus (where the box placed the device's BARs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BoxAddr(pub u64);

impl BoxAddr {
    /// The address as a TLP's Address field carries it.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl std::ops::Add<u64> for BoxAddr {
    type Output = BoxAddr;
    fn add(self, n: u64) -> BoxAddr {
        BoxAddr(self.0.wrapping_add(n))
    }
}

impl fmt::Display for BoxAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}
