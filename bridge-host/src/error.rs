//! What the host endpoint's calls refuse, with the values that made them refuse.
#![forbid(unsafe_code)]

use crate::addr::BusAddr;

/// Why a call on an attached device was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// A DMA window would run past the end of the 64-bit bus.
    #[error("DMA window of {len} bytes at {bus} wraps past the end of the bus")]
    WindowWraps {
        /// Where it would start.
        bus: BusAddr,
        /// Its length.
        len: usize,
    },
    /// A DMA window of no bytes.
    #[error("DMA window at {bus} is empty")]
    WindowEmpty {
        /// Where it would start.
        bus: BusAddr,
    },
    /// A DMA window overlaps one already granted.
    #[error("DMA window {bus}..{end} overlaps the granted window {other}..{other_end}")]
    WindowOverlaps {
        /// Where it would start.
        bus: BusAddr,
        /// Where it would end.
        end: BusAddr,
        /// The granted window's start.
        other: BusAddr,
        /// The granted window's end.
        other_end: BusAddr,
    },
    /// No granted window starts there (with that length), or it is the DMA arena, which
    /// cannot be revoked.
    #[error("no revocable DMA window at {bus}{}", len.map_or(String::new(), |l| format!(" of {l} bytes")))]
    NoWindow {
        /// Where it was looked for.
        bus: BusAddr,
        /// The length asked for, if any.
        len: Option<usize>,
    },
    /// An access by BAR index outside the BAR, to a BAR that does not exist or is not
    /// memory, or of no bytes.
    #[error("BAR{bar}: {len} bytes at offset {offset:#x} are not inside a memory BAR")]
    OutsideBar {
        /// The BAR index.
        bar: usize,
        /// The offset into it.
        offset: u64,
        /// The access's length.
        len: usize,
    },
}
