//! The host's view of a remote function's config space. Most registers are the device's
//! own, read and written across the link. A few are the host's: the BARs, which the host
//! programs with addresses on its own bus while the box keeps the device's BARs where it
//! placed them; the Expansion ROM BAR, which the host view does not offer; and Device
//! Control, whose Max_Payload_Size the host may raise only as far as one link frame carries.
//! The host's registers are kept in a [`pci::ConfigSpace`] — the register-and-mask model the
//! box's emulated functions are built on — so size probing, read-only bits and 64-bit BAR
//! halves behave exactly as there.
#![forbid(unsafe_code)]

use bridge::attach::BarInfo;
use pci::{Bar, BarKind, ConfigSpace};
use tlp::rules::TransferSize;

use crate::addr::{BoxAddr, BusAddr};

/// Where the host view places 64-bit BARs.
pub const BAR64_BASE: u64 = 0x80_0000_0000;
/// Where the host view places 32-bit BARs.
pub const BAR32_BASE: u64 = 0xc000_0000;
/// Largest 64-bit BAR the host view takes from a box.
const MAX_BAR64: u64 = 1 << 46;
/// Largest 32-bit BAR.
const MAX_BAR32: u64 = 1 << 30;

/// The BARs of an attached device as the box placed them, for callers that address BARs
/// by index (a vfio-user client does).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BarView {
    /// Size in bytes (0: no BAR here, or the upper half of a 64-bit BAR).
    pub size: u64,
    /// Memory space (not IO).
    pub memory: bool,
    /// 64-bit.
    pub is_64: bool,
    /// Prefetchable.
    pub prefetchable: bool,
}

/// Where a config write goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Routed {
    /// Taken by the host view.
    Here,
    /// To the device, with this value.
    Device(u32),
}

/// The host's registers of one remote function.
pub(crate) struct ConfigView {
    regs: ConfigSpace,
    /// The BARs as the box placed them.
    bars: [BarInfo; 6],
    /// Offset of Device Control (PCI Express capability + 8), once found.
    device_control: Option<u16>,
    /// Largest payload one link frame carries.
    link_max_payload: u32,
    /// Largest completion payload toward the device: its Max_Payload_Size as the host set
    /// it, within what a link frame carries.
    max_payload: TransferSize,
}

/// Why the BARs a box described cannot be placed in the host's view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PlaceError {
    /// A size no BAR can have (not a power of two, too large, too small, a 64-bit BAR5).
    #[error("the box described BAR{bar} with an impossible size {size:#x}")]
    BarSize {
        /// The BAR.
        bar: usize,
        /// Its size.
        size: u64,
    },
    /// The 32-bit BARs run past 4 GiB.
    #[error("the 32-bit BARs do not fit below 4 GiB in the host's view (BAR{bar}, {size:#x} bytes)")]
    Below4G {
        /// The BAR that did not fit.
        bar: usize,
        /// Its size.
        size: u64,
    },
}

impl ConfigView {
    /// The host view of a function whose BARs the box placed as `bars`, each placed in the
    /// host's address space as firmware would (64-bit BARs from [`BAR64_BASE`], 32-bit ones
    /// from [`BAR32_BASE`], each aligned to its size). What the box says is checked like any
    /// input from the network.
    pub(crate) fn place(bars: [BarInfo; 6], link_max_payload: u32) -> Result<ConfigView, PlaceError> {
        let mut regs = ConfigSpace::new(0, 0, [0; 3], 0, (0, 0));
        let (mut at64, mut at32) = (BAR64_BASE, BAR32_BASE);
        for (i, info) in bars.iter().enumerate() {
            if info.size == 0 {
                continue;
            }
            let limit = if info.is_64 { MAX_BAR64 } else { MAX_BAR32 };
            if !info.size.is_power_of_two() || info.size > limit || info.size < 16 || (info.is_64 && i == 5) {
                return Err(PlaceError::BarSize { bar: i, size: info.size });
            }
            let kind = match (info.memory, info.is_64) {
                (false, _) => BarKind::Io,
                (true, false) => BarKind::Memory32,
                (true, true) => BarKind::Memory64,
            };
            regs.add_bar(Bar { index: i, kind, prefetchable: info.prefetchable, size: info.size });
            if !info.memory {
                continue;
            }
            let cursor = if info.is_64 { &mut at64 } else { &mut at32 };
            let host = cursor.div_ceil(info.size) * info.size;
            *cursor = host + info.size;
            if !info.is_64 && *cursor > 1 << 32 {
                return Err(PlaceError::Below4G { bar: i, size: info.size });
            }
            let at = 0x10 + 4 * i;
            regs.write(at, 4, host as u32 | regs.read_dword(at) & 0xf);
            if info.is_64 {
                regs.write(at + 4, 4, (host >> 32) as u32);
            }
        }
        Ok(ConfigView { regs, bars, device_control: None, link_max_payload, max_payload: TransferSize::B128 })
    }

    /// Whether the host view keeps register `offset` (DW-aligned) itself, or it needs the
    /// device's value merged (Device Control): a partial write there is merged with the
    /// register's value first.
    pub(crate) fn is_virtual(&self, offset: u16) -> bool {
        matches!(offset, 0x10..=0x27 | 0x30) || Some(offset) == self.device_control
    }

    /// The host view's value of register `offset` (DW-aligned), if it keeps it.
    pub(crate) fn read(&self, offset: u16) -> Option<u32> {
        matches!(offset, 0x10..=0x27 | 0x30).then(|| self.regs.read_dword(offset as usize))
    }

    /// A write of the whole register at `offset` (DW-aligned).
    pub(crate) fn write(&mut self, offset: u16, value: u32) -> Routed {
        match offset {
            0x10..=0x27 | 0x30 => {
                self.regs.write(offset as usize, 4, value);
                Routed::Here
            }
            _ if Some(offset) == self.device_control => {
                // Max_Payload_Size (bits 7:5, 128 << n bytes, PCIe 6.0 §7.5.3.4) is lowered to
                // what one link frame carries before it reaches the device.
                let link = (self.link_max_payload.max(128) / 128).ilog2().min(5);
                let mps = ((value >> 5) & 7).min(link);
                let value = (value & !(7 << 5)) | mps << 5;
                self.set_max_payload(value);
                Routed::Device(value)
            }
            _ => Routed::Device(value),
        }
    }

    /// The device's Device Control register, found at `offset` with value `value`.
    pub(crate) fn found_device_control(&mut self, offset: u16, value: u32) {
        self.device_control = Some(offset);
        self.set_max_payload(value);
    }

    fn set_max_payload(&mut self, device_control: u32) {
        let bytes = (128u32 << ((device_control >> 5) & 7)).min(self.link_max_payload).min(4096);
        self.max_payload = TransferSize::from_bytes(bytes).unwrap_or(TransferSize::B128);
    }

    /// The largest completion payload toward the device.
    pub(crate) fn max_payload(&self) -> TransferSize {
        self.max_payload
    }

    /// The box address behind `len` bytes at host-view address `addr`, if a memory BAR the
    /// host has placed (non-zero) holds all of them.
    pub(crate) fn translate(&self, addr: BusAddr, len: u64) -> Option<BoxAddr> {
        (0..6).find_map(|i| {
            let b = &self.bars[i];
            let host = self.regs.bar_address(i).filter(|&h| h != 0 && b.memory)?;
            let off = addr.get().checked_sub(host)?;
            off.checked_add(len).is_some_and(|end| end <= b.size).then(|| BoxAddr(b.address) + off)
        })
    }

    /// The box address of memory BAR `bar` if `len` bytes (at least one) at `offset` lie
    /// inside it.
    pub(crate) fn bar_base(&self, bar: usize, offset: u64, len: usize) -> Option<BoxAddr> {
        let b = self.bars.get(bar)?;
        let inside = offset.checked_add(len as u64).is_some_and(|e| e <= b.size);
        (b.size != 0 && b.memory && inside && len > 0).then_some(BoxAddr(b.address))
    }

    /// The BARs, by index.
    pub(crate) fn bars(&self) -> [BarView; 6] {
        self.bars.map(|b| BarView {
            size: b.size,
            memory: b.memory,
            is_64: b.is_64,
            prefetchable: b.prefetchable,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn simgpu_like() -> [BarInfo; 6] {
        let mut bars = [BarInfo::default(); 6];
        bars[0] =
            BarInfo { address: 0xfe00_0000, size: 64 << 10, memory: true, is_64: true, prefetchable: false };
        bars[2] =
            BarInfo { address: 0x40_0000_0000, size: 1 << 30, memory: true, is_64: true, prefetchable: true };
        bars[4] =
            BarInfo { address: 0xd000_0000, size: 4096, memory: true, is_64: false, prefetchable: false };
        bars
    }

    #[test]
    fn bars_are_placed_as_firmware_would_and_answer_size_probing() {
        let mut v = ConfigView::place(simgpu_like(), 1024).unwrap();
        assert_eq!(v.read(0x10), Some(0x0000_0004), "BAR0: 64-bit, at 0x80_0000_0000");
        assert_eq!(v.read(0x14), Some(0x80));
        assert_eq!(v.read(0x18), Some(0x4000_000c), "BAR2: 64-bit prefetchable, after BAR0 at 1 GiB");
        assert_eq!(v.read(0x1c), Some(0x80));
        assert_eq!(v.read(0x20), Some(0xc000_0000), "BAR4: 32-bit");
        assert_eq!(v.read(0x30), Some(0), "no Expansion ROM");
        assert_eq!(v.write(0x10, 0xffff_ffff), Routed::Here);
        assert_eq!(v.write(0x14, 0xffff_ffff), Routed::Here);
        assert_eq!(v.read(0x10), Some(0xffff_0004), "64 KiB");
        assert_eq!(v.read(0x14), Some(0xffff_ffff));
        assert_eq!(v.write(0x30, 0xffff_ffff), Routed::Here);
        assert_eq!(v.read(0x30), Some(0));
        assert_eq!(v.read(0x04), None, "Command is the device's");
        assert_eq!(v.write(0x04, 6), Routed::Device(6));
    }

    #[test]
    fn host_addresses_translate_to_where_the_box_placed_the_bar() {
        let mut v = ConfigView::place(simgpu_like(), 1024).unwrap();
        assert_eq!(v.translate(BusAddr(0x80_0000_0010), 8), Some(BoxAddr(0xfe00_0010)));
        assert_eq!(v.translate(BusAddr(0x80_0000_fffc), 8), None, "across the BAR's end");
        assert_eq!(v.translate(BusAddr(0xc000_0ff8), 8), Some(BoxAddr(0xd000_0ff8)));
        v.write(0x10, 0xfe10_0000);
        v.write(0x14, 0);
        assert_eq!(v.translate(BusAddr(0xfe10_0008), 4), Some(BoxAddr(0xfe00_0008)), "moved by the host");
        assert_eq!(v.translate(BusAddr(0x80_0000_0010), 8), None);
        v.write(0x10, 0);
        assert_eq!(v.translate(BusAddr(0x8), 4), None, "a BAR at 0 does not decode");
        assert_eq!(v.bar_base(2, (1 << 30) - 8, 8), Some(BoxAddr(0x40_0000_0000)));
        assert_eq!(v.bar_base(2, (1 << 30) - 8, 9), None);
        assert_eq!(v.bar_base(1, 0, 4), None, "the upper half of BAR0");
        assert_eq!(v.bar_base(6, 0, 4), None);
    }

    #[test]
    fn max_payload_is_lowered_to_what_a_frame_carries() {
        let mut v = ConfigView::place(simgpu_like(), 1024).unwrap();
        v.found_device_control(0x48, 0);
        assert!(v.is_virtual(0x48));
        assert_eq!(v.max_payload(), TransferSize::B128);
        assert_eq!(v.write(0x48, 5 << 5 | 0x10), Routed::Device(3 << 5 | 0x10), "4096 asked, 1024 given");
        assert_eq!(v.max_payload().bytes(), 1024);
    }

    #[test]
    fn impossible_bars_from_the_box_are_refused() {
        for size in [3u64, 8, 0x3000, 1 << 47] {
            let mut bars = simgpu_like();
            bars[0].size = size;
            let e = ConfigView::place(bars, 1024).err().unwrap();
            assert_eq!(e, PlaceError::BarSize { bar: 0, size });
            assert!(e.to_string().contains(&format!("{size:#x}")), "{e}");
        }
        let mut bars = [BarInfo::default(); 6];
        for (i, b) in bars.iter_mut().enumerate().take(5) {
            *b = BarInfo { address: 0, size: 1 << 30, memory: true, is_64: false, prefetchable: false };
            let _ = i;
        }
        let e = ConfigView::place(bars, 1024).err().unwrap();
        assert!(matches!(e, PlaceError::Below4G { .. }) && e.to_string().contains("below 4 GiB"), "{e}");
    }
}
