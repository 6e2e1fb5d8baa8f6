//! Config-space emulation (PCI Local Bus 3.0 §6, PCIe 6.0 §7), after cloud-hypervisor's
//! `pci/configuration.rs`: 4 KiB of registers with a writable mask and a write-1-to-clear
//! mask per byte; BAR registers that answer size probing; capability and extended-capability
//! chains built at set-up. A write returns a [`ConfigWrite`] describing what changed.
#![forbid(unsafe_code)]

/// Config space size (PCIe extended configuration space).
pub const CONFIG_SIZE: usize = 4096;

/// Command register bits (PCI 3.0 §6.2.2).
pub mod command {
    /// I/O Space Enable.
    pub const IO_SPACE: u16 = 1 << 0;
    /// Memory Space Enable: BARs decode.
    pub const MEMORY_SPACE: u16 = 1 << 1;
    /// Bus Master Enable: the function may issue requests (DMA, MSI-X).
    pub const BUS_MASTER: u16 = 1 << 2;
    /// Parity Error Response.
    pub const PARITY_ERROR_RESPONSE: u16 = 1 << 6;
    /// SERR# Enable.
    pub const SERR: u16 = 1 << 8;
    /// Interrupt Disable: no INTx.
    pub const INTERRUPT_DISABLE: u16 = 1 << 10;
}

/// What a BAR maps.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum BarKind {
    /// 32-bit memory.
    Memory32,
    /// 64-bit memory (takes two BAR slots).
    Memory64,
    /// I/O space.
    Io,
}

/// One base address register as the function defines it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Bar {
    /// BAR index 0..=5 (a 64-bit BAR also uses index + 1).
    pub index: usize,
    /// What it maps.
    pub kind: BarKind,
    /// Prefetchable (memory BARs).
    pub prefetchable: bool,
    /// Size in bytes: a power of two, at least 16 (memory) or 4 (I/O).
    pub size: u64,
}

/// What a config write changed, for the device to act on.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConfigWrite {
    /// The Command register changed: (old, new).
    pub command: Option<(u16, u16)>,
    /// A BAR's address changed (index of the BAR).
    pub bar_moved: Option<usize>,
    /// MSI-X Message Control changed: (old, new).
    pub msix_control: Option<(u16, u16)>,
    /// Initiate Function Level Reset was written 1 (PCIe 6.0 §6.6.2).
    pub function_level_reset: bool,
    /// The PM power state changed: (old, new), D0..D3hot as 0..3.
    pub power_state: Option<(u8, u8)>,
}

/// PCI Express capability parameters of an endpoint.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PcieCapability {
    /// Max_Payload_Size Supported, as the 3-bit encoding (0 = 128 B .. 5 = 4096 B).
    pub max_payload_supported: u8,
    /// Completer and requester support 10-bit tags.
    pub ten_bit_tags: bool,
    /// Completion Timeout Ranges Supported (Device Capabilities 2 bits 3:0: A=1, B=2, C=4, D=8).
    pub completion_timeout_ranges: u8,
    /// Link: maximum speed (1 = 2.5 GT/s .. 6 = 64 GT/s) and width (lanes).
    pub link_speed: u8,
    /// Link width in lanes.
    pub link_width: u8,
}

impl Default for PcieCapability {
    fn default() -> Self {
        PcieCapability {
            max_payload_supported: 2,
            ten_bit_tags: true,
            completion_timeout_ranges: 0xf,
            link_speed: 4,
            link_width: 16,
        }
    }
}

/// A function's config space.
#[derive(Clone)]
pub struct ConfigSpace {
    regs: [u8; CONFIG_SIZE],
    writable: [u8; CONFIG_SIZE],
    w1c: [u8; CONFIG_SIZE],
    bars: [Option<Bar>; 6],
    /// Offset of the last capability added (to link the next), 0 if none.
    last_cap: usize,
    next_cap: usize,
    last_ext_cap: usize,
    next_ext_cap: usize,
    pcie_cap: Option<usize>,
    msix_cap: Option<usize>,
    pm_cap: Option<usize>,
}

impl ConfigSpace {
    /// A type 0 header: IDs, class code (base, sub, programming interface), revision.
    pub fn new(vendor: u16, device: u16, class: [u8; 3], revision: u8, subsystem: (u16, u16)) -> ConfigSpace {
        let mut c = ConfigSpace {
            regs: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            w1c: [0; CONFIG_SIZE],
            bars: [None; 6],
            last_cap: 0,
            next_cap: 0x40,
            last_ext_cap: 0,
            next_ext_cap: 0x100,
            pcie_cap: None,
            msix_cap: None,
            pm_cap: None,
        };
        c.set16(0x00, vendor);
        c.set16(0x02, device);
        // Command: I/O, Memory, Bus Master, Parity Error Response, SERR#, Interrupt Disable.
        let cmd = command::IO_SPACE
            | command::MEMORY_SPACE
            | command::BUS_MASTER
            | command::PARITY_ERROR_RESPONSE
            | command::SERR
            | command::INTERRUPT_DISABLE;
        c.writable[0x04..0x06].copy_from_slice(&cmd.to_le_bytes());
        // Status: bits 15..11 and 8 are write-1-to-clear error bits.
        c.w1c[0x06..0x08].copy_from_slice(&0xf900u16.to_le_bytes());
        c.regs[0x08] = revision;
        c.regs[0x09] = class[2];
        c.regs[0x0a] = class[1];
        c.regs[0x0b] = class[0];
        c.writable[0x0c] = 0xff; // Cache Line Size
        c.regs[0x0e] = 0x00; // header type 0, single function
        c.set16(0x2c, subsystem.0);
        c.set16(0x2e, subsystem.1);
        c.writable[0x3c] = 0xff; // Interrupt Line
        c
    }

    fn set16(&mut self, at: usize, v: u16) {
        self.regs[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }
    fn set32(&mut self, at: usize, v: u32) {
        self.regs[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }
    fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.regs[at], self.regs[at + 1]])
    }
    fn get32(&self, at: usize) -> u32 {
        u32::from_le_bytes([self.regs[at], self.regs[at + 1], self.regs[at + 2], self.regs[at + 3]])
    }
    fn mask16(&mut self, at: usize, writable: u16, w1c: u16) {
        self.writable[at..at + 2].copy_from_slice(&writable.to_le_bytes());
        self.w1c[at..at + 2].copy_from_slice(&w1c.to_le_bytes());
    }
    fn mask32(&mut self, at: usize, writable: u32, w1c: u32) {
        self.writable[at..at + 4].copy_from_slice(&writable.to_le_bytes());
        self.w1c[at..at + 4].copy_from_slice(&w1c.to_le_bytes());
    }

    /// Sets the Interrupt Pin (1 = INTA .. 4 = INTD, 0 = none).
    pub fn set_interrupt_pin(&mut self, pin: u8) {
        self.regs[0x3d] = pin;
    }

    /// Defines a BAR. Sizes are rounded up to a power of two.
    pub fn add_bar(&mut self, bar: Bar) {
        let size = bar.size.max(if bar.kind == BarKind::Io { 4 } else { 16 }).next_power_of_two();
        let bar = Bar { size, ..bar };
        let at = 0x10 + 4 * bar.index;
        let mask = !(size - 1);
        match bar.kind {
            BarKind::Io => {
                self.set32(at, 0x1);
                self.mask32(at, (mask as u32) & !0x3, 0);
            }
            BarKind::Memory32 => {
                self.set32(at, if bar.prefetchable { 0x8 } else { 0 });
                self.mask32(at, (mask as u32) & !0xf, 0);
            }
            BarKind::Memory64 => {
                self.set32(at, 0x4 | if bar.prefetchable { 0x8 } else { 0 });
                self.mask32(at, (mask as u32) & !0xf, 0);
                self.mask32(at + 4, (mask >> 32) as u32, 0);
            }
        }
        self.bars[bar.index] = Some(bar);
    }

    /// The BAR at `index`, if defined.
    pub fn bar(&self, index: usize) -> Option<Bar> {
        self.bars.get(index).copied().flatten()
    }

    /// The address the host assigned to BAR `index` (low flag bits cleared).
    pub fn bar_address(&self, index: usize) -> Option<u64> {
        let bar = self.bar(index)?;
        let at = 0x10 + 4 * index;
        Some(match bar.kind {
            BarKind::Io => (self.get32(at) & !0x3) as u64,
            BarKind::Memory32 => (self.get32(at) & !0xf) as u64,
            BarKind::Memory64 => (self.get32(at) & !0xf) as u64 | (self.get32(at + 4) as u64) << 32,
        })
    }

    /// The BAR whose assigned memory range holds `addr`: (index, offset into the BAR).
    pub fn decode(&self, addr: u64) -> Option<(usize, u64)> {
        (0..6).find_map(|i| {
            let bar = self.bar(i)?;
            if bar.kind == BarKind::Io {
                return None;
            }
            let base = self.bar_address(i)?;
            (base != 0 && addr >= base && addr - base < bar.size).then(|| (i, addr - base))
        })
    }

    /// Appends a capability (ID, then its body after the ID/next bytes); returns its offset.
    fn add_capability(&mut self, id: u8, len: usize) -> usize {
        let at = self.next_cap;
        self.regs[at] = id;
        self.regs[at + 1] = 0;
        if self.last_cap == 0 {
            self.regs[0x34] = at as u8;
            // Status: Capabilities List.
            self.regs[0x06] |= 0x10;
        } else {
            self.regs[self.last_cap + 1] = at as u8;
        }
        self.last_cap = at;
        self.next_cap = (at + len + 3) & !3;
        at
    }

    /// Adds the Power Management capability (PCI PM 1.2): D0..D3hot, no PME.
    pub fn add_power_management(&mut self) -> usize {
        let at = self.add_capability(0x01, 8);
        // PMC: version 3 (PM 1.2).
        self.set16(at + 2, 0x0003);
        // PMCSR: PowerState bits 1:0 RW; No_Soft_Reset bit 3 set.
        self.set16(at + 4, 0x0008);
        self.mask16(at + 4, 0x0003, 0x8000);
        self.pm_cap = Some(at);
        at
    }

    /// Adds an MSI-X capability: `vectors` entries, table and PBA in BAR `bir` at the given
    /// offsets (8-byte aligned).
    pub fn add_msix(&mut self, vectors: u16, bir: u8, table_offset: u32, pba_offset: u32) -> usize {
        let at = self.add_capability(0x11, 12);
        self.set16(at + 2, (vectors.clamp(1, 2048) - 1) & 0x7ff);
        // Message Control: MSI-X Enable (15) and Function Mask (14) are RW.
        self.mask16(at + 2, 0xc000, 0);
        self.set32(at + 4, (table_offset & !7) | (bir as u32 & 7));
        self.set32(at + 8, (pba_offset & !7) | (bir as u32 & 7));
        self.msix_cap = Some(at);
        at
    }

    /// Adds a PCI Express capability for an endpoint (PCIe 6.0 §7.5.3).
    pub fn add_pcie(&mut self, p: PcieCapability) -> usize {
        let at = self.add_capability(0x10, 0x3c);
        // PCI Express Capabilities: version 2, Device/Port Type 0000b (endpoint).
        self.set16(at + 2, 0x0002);
        // Device Capabilities: MPS supported 2:0, Extended Tag (5), Role-Based Error
        // Reporting (15), FLR capable (28).
        self.set32(at + 4, (p.max_payload_supported as u32 & 7) | 1 << 5 | 1 << 15 | 1 << 28);
        // Device Control: defaults MPS 128 B, MRRS 512 B (010b), Relaxed Ordering and
        // No Snoop enabled, Extended Tag enabled.
        self.set16(at + 8, 0x2000 | 1 << 4 | 1 << 11 | 1 << 8);
        // RW: error reporting enables 3:0, RO enable 4, MPS 7:5, Ext Tag 8, Phantom 9,
        // Aux PM 10, No Snoop 11, MRRS 14:12; Initiate FLR (15) reads as zero.
        self.mask16(at + 8, 0x7fff, 0);
        // Device Status: error bits 3:0 are write-1-to-clear.
        self.mask16(at + 10, 0, 0x000f);
        // Link Capabilities: speed 3:0, width 9:4, port number 0.
        self.set32(at + 12, (p.link_speed as u32 & 0xf) | (p.link_width as u32 & 0x3f) << 4);
        // Link Control: ASPM 1:0, RCB 3, Common Clock 6, Extended Synch 7 are RW.
        self.mask16(at + 16, 0x00cb, 0);
        // Link Status: current speed and width as negotiated.
        self.set16(at + 18, (p.link_speed as u16 & 0xf) | (p.link_width as u16 & 0x3f) << 4);
        // Device Capabilities 2: completion timeout ranges 3:0, disable supported 4,
        // 10-bit tag completer 16 and requester 17.
        let tags = if p.ten_bit_tags { 3 << 16 } else { 0 };
        self.set32(at + 0x24, (p.completion_timeout_ranges as u32 & 0xf) | 1 << 4 | tags);
        // Device Control 2: completion timeout value 3:0, disable 4, 10-bit tag requester
        // enable 12 are RW.
        self.mask16(at + 0x28, 0x101f, 0);
        // Link Capabilities 2: supported speeds vector up to link_speed.
        self.set32(at + 0x2c, ((1u32 << p.link_speed.min(7)) - 1) << 1);
        // Link Control 2: target speed.
        self.set16(at + 0x30, p.link_speed as u16 & 0xf);
        self.mask16(at + 0x30, 0x000f, 0);
        self.pcie_cap = Some(at);
        at
    }

    /// Appends an extended capability (16-bit ID, version, body length); returns its offset.
    fn add_ext_capability(&mut self, id: u16, version: u8, len: usize) -> usize {
        let at = self.next_ext_cap;
        self.set32(at, id as u32 | (version as u32 & 0xf) << 16);
        if self.last_ext_cap != 0 {
            let prev = self.get32(self.last_ext_cap);
            self.set32(self.last_ext_cap, (prev & 0x000f_ffff) | (at as u32) << 20);
        }
        self.last_ext_cap = at;
        self.next_ext_cap = (at + 4 + len + 3) & !3;
        at
    }

    /// Adds a Device Serial Number extended capability (PCIe 6.0 §7.9.3).
    pub fn add_serial_number(&mut self, serial: u64) -> usize {
        let at = self.add_ext_capability(0x0003, 1, 8);
        self.set32(at + 4, serial as u32);
        self.set32(at + 8, (serial >> 32) as u32);
        at
    }

    /// Offset of the PCI Express capability.
    pub fn pcie_offset(&self) -> Option<usize> {
        self.pcie_cap
    }
    /// Offset of the MSI-X capability.
    pub fn msix_offset(&self) -> Option<usize> {
        self.msix_cap
    }
    /// Offset of the Power Management capability.
    pub fn pm_offset(&self) -> Option<usize> {
        self.pm_cap
    }

    /// The Command register.
    pub fn command(&self) -> u16 {
        self.get16(0x04)
    }
    /// Memory Space Enable.
    pub fn memory_enabled(&self) -> bool {
        self.command() & command::MEMORY_SPACE != 0
    }
    /// Bus Master Enable.
    pub fn bus_master(&self) -> bool {
        self.command() & command::BUS_MASTER != 0
    }
    /// MSI-X Message Control, if the function has MSI-X.
    pub fn msix_control(&self) -> Option<u16> {
        self.msix_cap.map(|at| self.get16(at + 2))
    }
    /// Device Control's Max_Payload_Size in bytes.
    pub fn max_payload(&self) -> u32 {
        self.pcie_cap.map_or(128, |at| 128 << ((self.get16(at + 8) >> 5) & 7).min(5))
    }
    /// Device Control's Max_Read_Request_Size in bytes.
    pub fn max_read_request(&self) -> u32 {
        self.pcie_cap.map_or(128, |at| 128 << ((self.get16(at + 8) >> 12) & 7).min(5))
    }
    /// Sets Device Status error bits (for the device to report errors; W1C for software).
    pub fn set_device_status(&mut self, bits: u16) {
        if let Some(at) = self.pcie_cap {
            let v = self.get16(at + 10) | (bits & 0xf);
            self.set16(at + 10, v);
        }
    }
    /// Sets Status register bits (e.g. Received Master Abort, bit 13; W1C for software).
    pub fn set_status(&mut self, bits: u16) {
        let v = self.get16(0x06) | bits;
        self.set16(0x06, v);
    }

    /// Reads `size` (1, 2 or 4) bytes at `offset`; out-of-range or unaligned reads return
    /// all-ones, as a read of nothing does on PCI.
    pub fn read(&self, offset: usize, size: usize) -> u32 {
        if !matches!(size, 1 | 2 | 4) || !offset.is_multiple_of(size) || offset + size > CONFIG_SIZE {
            return u32::MAX;
        }
        let mut v = 0u32;
        for i in 0..size {
            v |= (self.regs[offset + i] as u32) << (8 * i);
        }
        v
    }

    /// Reads a whole DW at a DW-aligned `offset`.
    pub fn read_dword(&self, offset: usize) -> u32 {
        self.read(offset & !3, 4)
    }

    /// Writes `size` (1, 2 or 4) bytes of `value` at `offset` through the masks, and says
    /// what changed. Out-of-range or unaligned writes are ignored.
    pub fn write(&mut self, offset: usize, size: usize, value: u32) -> ConfigWrite {
        let mut effect = ConfigWrite::default();
        if !matches!(size, 1 | 2 | 4) || !offset.is_multiple_of(size) || offset + size > CONFIG_SIZE {
            return effect;
        }
        let old_command = self.command();
        let old_msix = self.msix_control();
        let old_pm = self.pm_cap.map(|at| self.regs[at + 4] & 3);
        let old_bars: [Option<u64>; 6] = std::array::from_fn(|i| self.bar_address(i));
        let mut flr = false;
        for i in 0..size {
            let at = offset + i;
            let byte = (value >> (8 * i)) as u8;
            // Initiate FLR (Device Control bit 15): acts, reads as zero.
            if let Some(p) = self.pcie_cap
                && at == p + 9
                && byte & 0x80 != 0
            {
                flr = true;
            }
            let rw = self.writable[at];
            let clear = self.w1c[at] & byte;
            self.regs[at] = ((self.regs[at] & !rw) | (byte & rw)) & !clear;
        }
        effect.function_level_reset = flr;
        let new_command = self.command();
        if new_command != old_command {
            effect.command = Some((old_command, new_command));
        }
        let new_msix = self.msix_control();
        if new_msix != old_msix
            && let (Some(o), Some(n)) = (old_msix, new_msix)
        {
            effect.msix_control = Some((o, n));
        }
        if let (Some(o), Some(at)) = (old_pm, self.pm_cap) {
            let n = self.regs[at + 4] & 3;
            if n != o {
                effect.power_state = Some((o, n));
            }
        }
        effect.bar_moved = (0..6).find(|&i| self.bar_address(i) != old_bars[i]);
        effect
    }

    /// The whole config space (for dumps).
    pub fn bytes(&self) -> &[u8; CONFIG_SIZE] {
        &self.regs
    }

    /// Back to the power-on state: command, status errors, BAR addresses and every
    /// writable field cleared to their initial values (given as the set-up `template`).
    pub fn reset_to(&mut self, template: &ConfigSpace) {
        *self = template.clone();
    }
}
