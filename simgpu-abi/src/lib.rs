//! The simulated GPU's programming interface (docs/simgpu.md): what the device model in
//! `hw` implements and what the simgpu driver in `driver` is written against — its PCI
//! identity, BAR0's register map, the ring's command layout, opcodes and error codes. Like a
//! real GPU's register headers, it is shared by both sides and holds no behaviour.
#![no_std]
#![forbid(unsafe_code)]

/// Vendor ID: 0x1234, the ID QEMU's educational devices use; not a real vendor's.
pub const VENDOR_ID: u16 = 0x1234;
/// Device ID of the simulated GPU.
pub const DEVICE_ID: u16 = 0xd9a0;
/// Size of BAR0, the register BAR (registers, MSI-X table and PBA).
pub const BAR0_SIZE: u64 = 64 * 1024;
/// Offset of the MSI-X table in BAR0.
pub const MSIX_TABLE_OFFSET: u32 = 0x8000;
/// Offset of the MSI-X pending-bit array in BAR0.
pub const MSIX_PBA_OFFSET: u32 = 0x9000;

/// BAR0 register offsets (64-bit registers; 4- and 8-byte accesses).
pub mod reg {
    /// RO: "SIMG" in the low 32 bits, version in the high 32.
    pub const ID: u64 = 0x000;
    /// RO: bit 0 busy (commands pending), bit 1 error (ERROR is non-zero).
    pub const STATUS: u64 = 0x008;
    /// W1C: the first unacknowledged error (see [`super::err`]).
    pub const ERROR: u64 = 0x010;
    /// W1C: bit 0 an INTERRUPT command ran, bit 1 an error.
    pub const INT_STATUS: u64 = 0x018;
    /// RW: bus address of the command ring (64-byte aligned).
    pub const RING_BASE: u64 = 0x020;
    /// RW: ring entries (a power of two, 2..=4096).
    pub const RING_SIZE: u64 = 0x028;
    /// RO: the next entry the device fetches.
    pub const RING_HEAD: u64 = 0x030;
    /// RW: the next entry the driver fills.
    pub const RING_TAIL: u64 = 0x038;
    /// WO: any write makes the device look at RING_TAIL.
    pub const DOORBELL: u64 = 0x040;
    /// RO: the value of the last FENCE command.
    pub const FENCE: u64 = 0x048;
    /// RO: VRAM size in bytes.
    pub const VRAM_SIZE: u64 = 0x050;
    /// RO: commands executed since reset (all channels).
    pub const COMPLETED: u64 = 0x058;
    /// RO: the number of command channels ([`super::CHANNELS`]).
    pub const CHANNELS: u64 = 0x060;
    /// RO: bytes the copy engines moved from host memory into VRAM since reset, counted as
    /// they land (each read's completion written into VRAM), every channel together.
    pub const COPIED_TO_VRAM: u64 = 0x068;
    /// RO: bytes the copy engines sent from VRAM to host memory since reset (the writes
    /// posted), every channel together.
    pub const COPIED_TO_HOST: u64 = 0x070;
}

/// Command channels: each has a block of registers at [`chreg::BASE`] + channel ×
/// [`chreg::STRIDE`]; channel 0's are also at the legacy offsets `reg::RING_BASE` ..
/// `reg::DOORBELL`. 64, as a GPU's front end has more hardware queues than a job has
/// streams at once (CUDA opens at most 32 connections): a replayed job's streams each get one.
pub const CHANNELS: usize = 64;

/// A channel's registers, as offsets within its block.
pub mod chreg {
    /// BAR0 offset of channel 0's block.
    pub const BASE: u64 = 0x1000;
    /// Bytes between channels' blocks.
    pub const STRIDE: u64 = 0x40;
    /// RW: bus address of the channel's ring (64-byte aligned).
    pub const RING_BASE: u64 = 0x00;
    /// RW: entries (a power of two, 2..=4096).
    pub const RING_SIZE: u64 = 0x08;
    /// RO: the next entry the channel fetches.
    pub const RING_HEAD: u64 = 0x10;
    /// RW: the next entry the driver fills.
    pub const RING_TAIL: u64 = 0x18;
    /// WO: any write makes the channel look at RING_TAIL.
    pub const DOORBELL: u64 = 0x20;
    /// RO: commands this channel executed since reset.
    pub const COMPLETED: u64 = 0x28;

    /// BAR0 offset of channel `ch`'s register `r`.
    pub const fn at(ch: usize, r: u64) -> u64 {
        BASE + ch as u64 * STRIDE + r
    }
}

/// Error codes in ERROR.
pub mod err {
    /// Unknown opcode.
    pub const BAD_OPCODE: u64 = 1;
    /// Arguments out of range (VRAM bounds, zero length, alignment, vector number).
    pub const BAD_ARGUMENT: u64 = 2;
    /// A DMA read completed with UR or CA (or poisoned).
    pub const DMA: u64 = 3;
    /// RING_BASE or RING_SIZE unusable.
    pub const RING: u64 = 4;
}

/// Command opcodes (64-byte commands: u32 opcode, u32 flags, then u64 arguments a..e).
pub mod op {
    /// Nothing.
    pub const NOP: u32 = 0;
    /// Copy c bytes from host address a to VRAM offset b; it lasts at least d ns (0: as
    /// fast as it goes), as a traced copy engine did.
    pub const COPY_H2V: u32 = 1;
    /// Copy c bytes from VRAM offset a to host address b; it lasts at least d ns.
    pub const COPY_V2H: u32 = 2;
    /// Copy c bytes from VRAM offset a to VRAM offset b.
    pub const COPY_V2V: u32 = 3;
    /// Fill b bytes at VRAM offset a with the 32-bit pattern c.
    pub const FILL: u32 = 4;
    /// out\[c\] = x\[a\] + y\[b\] over d fp32 elements.
    pub const VADD: u32 = 5;
    /// y\[b\] = alpha * x\[a\] + y\[b\] over c elements; alpha is the fp32 in d.
    pub const SAXPY: u32 = 6;
    /// VRAM\[c\] = sum of b fp32 elements at a.
    pub const REDUCE_SUM: u32 = 7;
    /// C\[c\] = A\[a\] × B\[b\], row-major fp32; d = m | n << 16 | k << 32 (each 1..=256).
    pub const MATMUL: u32 = 8;
    /// Write the 64-bit value b to host address a (8-byte aligned); FENCE = b.
    pub const FENCE: u32 = 9;
    /// Raise MSI-X vector a.
    pub const INTERRUPT: u32 = 10;
    /// Keep the channel busy for a nanoseconds without computing: a kernel of a traced
    /// duration (replay).
    pub const TIMED: u32 = 11;
    /// Semaphore release: once the channel's earlier commands are done, write the u64 value
    /// b to address a (8-aligned): host memory, or VRAM with [`super::sem::VRAM`] in c; with
    /// [`super::sem::TIMESTAMPS`], 24 bytes: b, when the command before it began and now
    /// (ns, CLOCK_MONOTONIC).
    pub const SEM_RELEASE: u32 = 12;
    /// Semaphore acquire: the channel waits until the u64 at VRAM offset a (8-aligned) is at
    /// least b.
    pub const SEM_ACQUIRE: u32 = 13;
}

/// SEM_RELEASE flags (argument c).
pub mod sem {
    /// The address is a VRAM offset, not a host address.
    pub const VRAM: u64 = 1;
    /// Write the begin and end times of the command before it after the value.
    pub const TIMESTAMPS: u64 = 2;
}

/// The vector errors are raised on.
pub const ERROR_VECTOR: u16 = 1;
/// Command size in bytes.
pub const COMMAND_BYTES: u64 = 64;
