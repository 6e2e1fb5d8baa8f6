//! vfio-user messages as QEMU's `docs/interop/vfio-user.rst` (protocol 0.1) defines them,
//! parsed and built without I/O. All fields are in the host's byte order (the protocol
//! says "the endianness of the host system"; both ends are on one machine), which on the
//! machines dxpu runs on is little-endian.

use std::fmt;

pub use super::caps::{Caps, CapsError};

use zerocopy::byteorder::little_endian;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes in every message's header.
pub const HEADER_LEN: usize = 16;

/// Command numbers (the spec's "Commands" table).
pub mod cmd {
    /// Version and capability negotiation.
    pub const VERSION: u16 = 1;
    /// Client memory the server may reach.
    pub const DMA_MAP: u16 = 2;
    /// Client memory withdrawn.
    pub const DMA_UNMAP: u16 = 3;
    /// Device flags, regions, IRQ types.
    pub const DEVICE_GET_INFO: u16 = 4;
    /// One region.
    pub const DEVICE_GET_REGION_INFO: u16 = 5;
    /// ioeventfd/ioregionfd sub-regions.
    pub const DEVICE_GET_REGION_IO_FDS: u16 = 6;
    /// One IRQ type.
    pub const DEVICE_GET_IRQ_INFO: u16 = 7;
    /// IRQ actions (eventfds, mask, unmask, trigger).
    pub const DEVICE_SET_IRQS: u16 = 8;
    /// Read a region.
    pub const REGION_READ: u16 = 9;
    /// Write a region.
    pub const REGION_WRITE: u16 = 10;
    /// Server reads client memory.
    pub const DMA_READ: u16 = 11;
    /// Server writes client memory.
    pub const DMA_WRITE: u16 = 12;
    /// Reset the device.
    pub const DEVICE_RESET: u16 = 13;
    /// Several small region writes in one message.
    pub const REGION_WRITE_MULTI: u16 = 15;
    /// Device features (migration).
    pub const DEVICE_FEATURE: u16 = 16;

    /// The command's name, for logs.
    pub fn name(c: u16) -> &'static str {
        match c {
            VERSION => "VERSION",
            DMA_MAP => "DMA_MAP",
            DMA_UNMAP => "DMA_UNMAP",
            DEVICE_GET_INFO => "DEVICE_GET_INFO",
            DEVICE_GET_REGION_INFO => "DEVICE_GET_REGION_INFO",
            DEVICE_GET_REGION_IO_FDS => "DEVICE_GET_REGION_IO_FDS",
            DEVICE_GET_IRQ_INFO => "DEVICE_GET_IRQ_INFO",
            DEVICE_SET_IRQS => "DEVICE_SET_IRQS",
            REGION_READ => "REGION_READ",
            REGION_WRITE => "REGION_WRITE",
            DMA_READ => "DMA_READ",
            DMA_WRITE => "DMA_WRITE",
            DEVICE_RESET => "DEVICE_RESET",
            REGION_WRITE_MULTI => "REGION_WRITE_MULTI",
            DEVICE_FEATURE => "DEVICE_FEATURE",
            _ => "unknown",
        }
    }
}

/// Header flag bits.
pub mod flags {
    /// Message type field (bits 0-3).
    pub const TYPE_MASK: u32 = 0xf;
    /// Type: a command.
    pub const COMMAND: u32 = 0;
    /// Type: a reply.
    pub const REPLY: u32 = 1;
    /// The command wants no reply.
    pub const NO_REPLY: u32 = 1 << 4;
    /// The reply reports an error (in the header's error field).
    pub const ERROR: u32 = 1 << 5;
}

/// VFIO region indexes of a PCI device (`VFIO_PCI_*_REGION_INDEX`).
pub mod region {
    /// BAR0; BAR n is `BAR0 + n`.
    pub const BAR0: u32 = 0;
    /// Expansion ROM.
    pub const ROM: u32 = 6;
    /// Configuration space.
    pub const CONFIG: u32 = 7;
    /// Legacy VGA ranges.
    pub const VGA: u32 = 8;
    /// Regions of a PCI device.
    pub const COUNT: u32 = 9;
    /// `VFIO_REGION_INFO_FLAG_READ`.
    pub const FLAG_READ: u32 = 1;
    /// `VFIO_REGION_INFO_FLAG_WRITE`.
    pub const FLAG_WRITE: u32 = 2;
}

/// VFIO IRQ indexes of a PCI device and the SET_IRQS flag bits (`<linux/vfio.h>`).
pub mod irq {
    /// Legacy INTx.
    pub const INTX: u32 = 0;
    /// MSI.
    pub const MSI: u32 = 1;
    /// MSI-X.
    pub const MSIX: u32 = 2;
    /// Error notification.
    pub const ERR: u32 = 3;
    /// Device request notification.
    pub const REQ: u32 = 4;
    /// IRQ types of a PCI device.
    pub const COUNT: u32 = 5;
    /// `VFIO_IRQ_INFO_EVENTFD`.
    pub const INFO_EVENTFD: u32 = 1;
    /// `VFIO_IRQ_INFO_MASKABLE`.
    pub const INFO_MASKABLE: u32 = 2;
    /// `VFIO_IRQ_INFO_AUTOMASKED`.
    pub const INFO_AUTOMASKED: u32 = 4;
    /// `VFIO_IRQ_INFO_NORESIZE`.
    pub const INFO_NORESIZE: u32 = 8;
    /// `VFIO_IRQ_SET_DATA_NONE`.
    pub const DATA_NONE: u32 = 1;
    /// `VFIO_IRQ_SET_DATA_BOOL`.
    pub const DATA_BOOL: u32 = 2;
    /// `VFIO_IRQ_SET_DATA_EVENTFD`.
    pub const DATA_EVENTFD: u32 = 4;
    /// `VFIO_IRQ_SET_ACTION_MASK`.
    pub const ACTION_MASK: u32 = 8;
    /// `VFIO_IRQ_SET_ACTION_UNMASK`.
    pub const ACTION_UNMASK: u32 = 16;
    /// `VFIO_IRQ_SET_ACTION_TRIGGER`.
    pub const ACTION_TRIGGER: u32 = 32;
}

/// `VFIO_DEVICE_FLAGS_RESET`.
pub const DEVICE_FLAGS_RESET: u32 = 1;
/// `VFIO_DEVICE_FLAGS_PCI`.
pub const DEVICE_FLAGS_PCI: u32 = 2;
/// DMA_MAP flag: the device may read the region.
pub const DMA_READABLE: u32 = 1;
/// DMA_MAP flag: the device may write the region.
pub const DMA_WRITEABLE: u32 = 2;

/// errno values the server answers with.
pub mod errno {
    /// Operation not permitted.
    pub const EPERM: u32 = 1;
    /// No such entry.
    pub const ENOENT: u32 = 2;
    /// I/O error.
    pub const EIO: u32 = 5;
    /// Argument list too long.
    pub const E2BIG: u32 = 7;
    /// Bad file descriptor.
    pub const EBADF: u32 = 9;
    /// Out of memory.
    pub const ENOMEM: u32 = 12;
    /// Bad address.
    pub const EFAULT: u32 = 14;
    /// Already exists.
    pub const EEXIST: u32 = 17;
    /// No such device.
    pub const ENODEV: u32 = 19;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left.
    pub const ENOSPC: u32 = 28;
    /// Function not implemented.
    pub const ENOSYS: u32 = 38;
    /// Operation not supported.
    pub const ENOTSUP: u32 = 95;
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// The 16-byte header every message starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Message ID, echoed in the reply.
    pub id: u16,
    /// Command.
    pub command: u16,
    /// Size of the whole message, header included.
    pub size: u32,
    /// [`flags`].
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

/// The header as it lies on the socket (the spec's "Header" table; little-endian).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy)]
#[repr(C)]
struct RawHeader {
    id: little_endian::U16,
    command: little_endian::U16,
    size: little_endian::U32,
    flags: little_endian::U32,
    error: little_endian::U32,
}

const _: () = assert!(size_of::<RawHeader>() == HEADER_LEN);

impl Header {
    /// Reads a header.
    pub fn parse(b: &[u8; HEADER_LEN]) -> Header {
        let h = RawHeader::read_from_bytes(b).unwrap_or_else(|_| RawHeader::new_zeroed());
        Header {
            id: h.id.get(),
            command: h.command.get(),
            size: h.size.get(),
            flags: h.flags.get(),
            error: h.error.get(),
        }
    }

    /// Writes the header.
    pub fn emit(&self) -> [u8; HEADER_LEN] {
        let h = RawHeader {
            id: self.id.into(),
            command: self.command.into(),
            size: self.size.into(),
            flags: self.flags.into(),
            error: self.error.into(),
        };
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(h.as_bytes());
        b
    }

    /// A command (not a reply).
    pub fn is_command(&self) -> bool {
        self.flags & flags::TYPE_MASK == flags::COMMAND
    }

    /// A reply.
    pub fn is_reply(&self) -> bool {
        self.flags & flags::TYPE_MASK == flags::REPLY
    }

    /// The sender wants no reply.
    pub fn no_reply(&self) -> bool {
        self.flags & flags::NO_REPLY != 0
    }
}

/// What a [`Framer`] makes of the bytes so far.
#[derive(Debug, PartialEq, Eq)]
pub enum Framed {
    /// A whole message: its header and payload.
    Message(Header, Vec<u8>),
    /// A message over the size limit, whose payload has been skipped: it gets an error
    /// reply and the framing holds.
    TooLarge(Header),
    /// A header that claims less than itself: the framing is lost.
    Broken(Header),
}

/// Messages out of a byte stream, sans I/O: bytes go in as they arrive ([`Framer::push`]),
/// whole messages come out ([`Framer::next`]). It holds at most one message up to `max`
/// bytes plus what was pushed after it; an oversized message's payload is dropped as it
/// arrives, so memory stays bounded whatever the peer sends.
#[derive(Debug)]
pub struct Framer {
    max: u32,
    rx: Vec<u8>,
    /// An oversized message being skipped: its header and the payload bytes still to come.
    skip: Option<(Header, usize)>,
}

impl Framer {
    /// A framer taking messages of at most `max` bytes (header included).
    pub fn new(max: u32) -> Framer {
        Framer { max, rx: Vec::new(), skip: None }
    }

    /// Bytes that arrived.
    pub fn push(&mut self, mut bytes: &[u8]) {
        if let Some((_, left)) = &mut self.skip {
            let n = bytes.len().min(*left);
            *left -= n;
            bytes = &bytes[n..];
        }
        self.rx.extend_from_slice(bytes);
    }

    /// Bytes held of messages not yet whole (skipped ones not counted).
    pub fn held(&self) -> usize {
        self.rx.len()
    }

    /// Whether a message has begun and is not whole yet.
    pub fn in_message(&self) -> bool {
        !self.rx.is_empty() || self.skip.is_some()
    }

    /// Bytes of the message under way that have arrived (skipped ones included).
    pub fn progress(&self) -> usize {
        self.rx.len() + self.skip.map_or(0, |(h, left)| h.size as usize - left)
    }

    /// Whether more bytes may be read now without holding more than one largest message.
    pub fn wants_more(&self) -> bool {
        self.rx.len() < self.max as usize
    }

    /// The next message, if one is whole.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Option<Framed> {
        if let Some((h, left)) = self.skip {
            if left > 0 {
                return None;
            }
            self.skip = None;
            return Some(Framed::TooLarge(h));
        }
        let h: &[u8; HEADER_LEN] = self.rx.first_chunk()?;
        let header = Header::parse(h);
        let size = header.size as usize;
        if size < HEADER_LEN {
            return Some(Framed::Broken(header));
        }
        if header.size > self.max {
            let here = (self.rx.len() - HEADER_LEN).min(size - HEADER_LEN);
            self.rx.drain(..HEADER_LEN + here);
            self.skip = Some((header, size - HEADER_LEN - here));
            return self.next();
        }
        if self.rx.len() < size {
            return None;
        }
        let payload = self.rx[HEADER_LEN..size].to_vec();
        self.rx.drain(..size);
        Some(Framed::Message(header, payload))
    }
}

/// A whole message: header and payload.
pub fn message(id: u16, command: u16, flags: u32, error: u32, payload: &[u8]) -> Vec<u8> {
    let size = (HEADER_LEN + payload.len()) as u32;
    let mut out = Header { id, command, size, flags, error }.emit().to_vec();
    out.extend_from_slice(payload);
    out
}

/// The reply to `h` carrying `payload`.
pub fn reply(h: &Header, payload: &[u8]) -> Vec<u8> {
    message(h.id, h.command, flags::REPLY, 0, payload)
}

/// The error reply to `h` (header only, as the spec requires).
pub fn error_reply(h: &Header, errno: u32) -> Vec<u8> {
    message(h.id, h.command, flags::REPLY | flags::ERROR, errno, &[])
}

/// One write of a REGION_WRITE_MULTI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmallWrite {
    /// Offset in the region.
    pub offset: u64,
    /// Region index.
    pub region: u32,
    /// Bytes (1..=8).
    pub count: u32,
    /// The data, little-endian in the low `count` bytes.
    pub data: [u8; 8],
}

/// A command from the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// VERSION.
    Version {
        /// Major version proposed.
        major: u16,
        /// Minor version proposed.
        minor: u16,
        /// Capabilities proposed.
        caps: Caps,
    },
    /// DMA_MAP.
    DmaMap {
        /// [`DMA_READABLE`] | [`DMA_WRITEABLE`].
        flags: u32,
        /// Offset in the file descriptor sent with the message.
        offset: u64,
        /// DMA address.
        address: u64,
        /// Bytes.
        size: u64,
    },
    /// DMA_UNMAP.
    DmaUnmap {
        /// Reply payload room.
        argsz: u32,
        /// Flags (none defined).
        flags: u32,
        /// DMA address.
        address: u64,
        /// Bytes.
        size: u64,
    },
    /// DEVICE_GET_INFO.
    DeviceGetInfo {
        /// Reply payload room.
        argsz: u32,
    },
    /// DEVICE_GET_REGION_INFO.
    RegionInfo {
        /// Reply payload room.
        argsz: u32,
        /// Region index.
        index: u32,
    },
    /// DEVICE_GET_IRQ_INFO.
    IrqInfo {
        /// Reply payload room.
        argsz: u32,
        /// IRQ index.
        index: u32,
    },
    /// DEVICE_SET_IRQS.
    SetIrqs {
        /// Data and action flags ([`irq`]).
        flags: u32,
        /// IRQ index.
        index: u32,
        /// First sub-index.
        start: u32,
        /// Sub-indexes.
        count: u32,
        /// Booleans for DATA_BOOL.
        data: &'a [u8],
    },
    /// REGION_READ.
    RegionRead {
        /// Offset in the region.
        offset: u64,
        /// Region index.
        region: u32,
        /// Bytes.
        count: u32,
    },
    /// REGION_WRITE.
    RegionWrite {
        /// Offset in the region.
        offset: u64,
        /// Region index.
        region: u32,
        /// The bytes.
        data: &'a [u8],
    },
    /// REGION_WRITE_MULTI.
    RegionWriteMulti {
        /// The writes, in order.
        writes: Vec<SmallWrite>,
    },
    /// DEVICE_RESET.
    DeviceReset,
    /// A command this server does not implement (answered ENOSYS).
    Unsupported {
        /// The command number.
        command: u16,
    },
}

/// A command whose payload does not fit its definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// The command.
    pub command: u16,
    /// What was wrong.
    pub reason: String,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed {} ({}): {}", cmd::name(self.command), self.command, self.reason)
    }
}

fn need(command: u16, p: &[u8], n: usize) -> Result<(), Malformed> {
    if p.len() < n {
        return Err(Malformed {
            command,
            reason: format!("payload of {} bytes, at least {n} needed", p.len()),
        });
    }
    Ok(())
}

/// Parses the payload of command `command`. `max_xfer` bounds REGION_WRITE's count.
pub fn parse_request(command: u16, p: &[u8], max_xfer: u32) -> Result<Request<'_>, Malformed> {
    let bad = |reason: String| Malformed { command, reason };
    Ok(match command {
        cmd::VERSION => {
            need(command, p, 4)?;
            let caps = Caps::from_json(&p[4..]).map_err(|e| bad(e.to_string()))?;
            Request::Version { major: u16_at(p, 0), minor: u16_at(p, 2), caps }
        }
        cmd::DMA_MAP => {
            need(command, p, 32)?;
            Request::DmaMap {
                flags: u32_at(p, 4),
                offset: u64_at(p, 8),
                address: u64_at(p, 16),
                size: u64_at(p, 24),
            }
        }
        cmd::DMA_UNMAP => {
            need(command, p, 24)?;
            Request::DmaUnmap {
                argsz: u32_at(p, 0),
                flags: u32_at(p, 4),
                address: u64_at(p, 8),
                size: u64_at(p, 16),
            }
        }
        cmd::DEVICE_GET_INFO => {
            need(command, p, 4)?;
            Request::DeviceGetInfo { argsz: u32_at(p, 0) }
        }
        cmd::DEVICE_GET_REGION_INFO => {
            need(command, p, 12)?;
            Request::RegionInfo { argsz: u32_at(p, 0), index: u32_at(p, 8) }
        }
        cmd::DEVICE_GET_IRQ_INFO => {
            need(command, p, 12)?;
            Request::IrqInfo { argsz: u32_at(p, 0), index: u32_at(p, 8) }
        }
        cmd::DEVICE_SET_IRQS => {
            need(command, p, 20)?;
            let (flags, count) = (u32_at(p, 4), u32_at(p, 16));
            let data = &p[20..];
            if flags & irq::DATA_BOOL != 0 && data.len() < count as usize {
                return Err(bad(format!("{count} booleans announced, {} sent", data.len())));
            }
            Request::SetIrqs { flags, index: u32_at(p, 8), start: u32_at(p, 12), count, data }
        }
        cmd::REGION_READ => {
            need(command, p, 16)?;
            let count = u32_at(p, 12);
            if count > max_xfer {
                return Err(bad(format!("count {count} over max_data_xfer_size {max_xfer}")));
            }
            Request::RegionRead { offset: u64_at(p, 0), region: u32_at(p, 8), count }
        }
        cmd::REGION_WRITE => {
            need(command, p, 16)?;
            let count = u32_at(p, 12);
            if count > max_xfer {
                return Err(bad(format!("count {count} over max_data_xfer_size {max_xfer}")));
            }
            if p.len() - 16 != count as usize {
                return Err(bad(format!("count {count} but {} bytes of data", p.len() - 16)));
            }
            Request::RegionWrite { offset: u64_at(p, 0), region: u32_at(p, 8), data: &p[16..] }
        }
        cmd::REGION_WRITE_MULTI => {
            need(command, p, 8)?;
            let n = u64_at(p, 0);
            let room = (p.len() - 8) / 24;
            if n > room as u64 {
                return Err(bad(format!("{n} writes announced, room for {room}")));
            }
            let mut writes = Vec::with_capacity(n as usize);
            for i in 0..n as usize {
                let at = 8 + 24 * i;
                let count = u32_at(p, at + 12);
                if !(1..=8).contains(&count) {
                    return Err(bad(format!("write {i}: count {count} not in 1..=8")));
                }
                let mut data = [0u8; 8];
                data.copy_from_slice(&p[at + 16..at + 24]);
                writes.push(SmallWrite { offset: u64_at(p, at), region: u32_at(p, at + 8), count, data });
            }
            Request::RegionWriteMulti { writes }
        }
        cmd::DEVICE_RESET => Request::DeviceReset,
        other => Request::Unsupported { command: other },
    })
}

/// DEVICE_GET_INFO reply payload.
pub fn device_info(flags: u32, num_regions: u32, num_irqs: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    for v in [16, flags, num_regions, num_irqs] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// DEVICE_GET_REGION_INFO reply payload (no capabilities).
pub fn region_info(index: u32, flags: u32, size: u64, offset: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(32);
    for v in [32, flags, index, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    b
}

/// DEVICE_GET_IRQ_INFO reply payload.
pub fn irq_info(index: u32, flags: u32, count: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    for v in [16, flags, index, count] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// REGION_READ reply payload.
pub fn region_read_reply(offset: u64, region: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&region.to_le_bytes());
    b.extend_from_slice(&(data.len() as u32).to_le_bytes());
    b.extend_from_slice(data);
    b
}

/// REGION_WRITE reply payload.
pub fn region_write_reply(offset: u64, region: u32, count: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&offset.to_le_bytes());
    b.extend_from_slice(&region.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}

/// DMA_READ command payload (server to client).
pub fn dma_read(address: u64, count: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(16);
    b.extend_from_slice(&address.to_le_bytes());
    b.extend_from_slice(&count.to_le_bytes());
    b
}

/// DMA_WRITE command payload (server to client).
pub fn dma_write(address: u64, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&address.to_le_bytes());
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
    b
}

/// The data of a DMA_READ reply, checked against what was asked.
pub fn dma_read_data(p: &[u8], address: u64, count: usize) -> Result<&[u8], DmaReplyError> {
    if p.len() < 16 {
        return Err(DmaReplyError::Short { len: p.len() });
    }
    let (a, n) = (u64_at(p, 0), u64_at(p, 8));
    if a != address || n != count as u64 || p.len() - 16 != count {
        return Err(DmaReplyError::NotAsked {
            address: a,
            count: n,
            data: p.len() - 16,
            asked: (address, count),
        });
    }
    Ok(&p[16..])
}

/// Why a DMA_READ reply is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DmaReplyError {
    /// Shorter than its address and count.
    #[error("DMA_READ reply of {len} bytes")]
    Short {
        /// Its length.
        len: usize,
    },
    /// For another range than the one asked.
    #[error("DMA_READ reply for {address:#x}+{count} with {data} bytes, asked {:#x}+{}", asked.0, asked.1)]
    NotAsked {
        /// The address it names.
        address: u64,
        /// The count it names.
        count: u64,
        /// The data bytes it holds.
        data: usize,
        /// The address and count asked.
        asked: (u64, usize),
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips() {
        let h = Header {
            id: 7,
            command: cmd::REGION_READ,
            size: 32,
            flags: flags::REPLY | flags::ERROR,
            error: 22,
        };
        assert_eq!(Header::parse(&h.emit()), h);
        assert!(h.is_reply() && !h.is_command() && !h.no_reply());
    }

    #[test]
    fn short_payloads_are_malformed_not_panics() {
        for c in 0..20u16 {
            for n in 0..40 {
                let p = vec![0xffu8; n];
                let _ = parse_request(c, &p, 1 << 20);
            }
        }
        assert!(parse_request(cmd::DMA_MAP, &[0; 31], 1 << 20).is_err());
        assert!(parse_request(cmd::DMA_MAP, &[0; 32], 1 << 20).is_ok());
    }

    #[test]
    fn region_write_count_must_match_data_and_limit() {
        let mut p = vec![0u8; 16];
        p[12..16].copy_from_slice(&4u32.to_le_bytes());
        assert!(parse_request(cmd::REGION_WRITE, &p, 64).is_err());
        p.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(
            parse_request(cmd::REGION_WRITE, &p, 64).unwrap(),
            Request::RegionWrite { offset: 0, region: 0, data: &[1, 2, 3, 4] }
        );
        assert!(parse_request(cmd::REGION_WRITE, &p, 2).is_err());
        let mut r = vec![0u8; 16];
        r[12..16].copy_from_slice(&100u32.to_le_bytes());
        assert!(parse_request(cmd::REGION_READ, &r, 64).is_err());
    }

    #[test]
    fn write_multi_bounds_its_count() {
        let mut p = vec![0u8; 8 + 24];
        p[0..8].copy_from_slice(&2u64.to_le_bytes());
        assert!(parse_request(cmd::REGION_WRITE_MULTI, &p, 64).is_err());
        p[0..8].copy_from_slice(&1u64.to_le_bytes());
        p[8 + 12..8 + 16].copy_from_slice(&4u32.to_le_bytes());
        p[8 + 16] = 0xaa;
        let Request::RegionWriteMulti { writes } = parse_request(cmd::REGION_WRITE_MULTI, &p, 64).unwrap()
        else {
            panic!("not a multi write")
        };
        assert_eq!(writes[0].count, 4);
        assert_eq!(writes[0].data[0], 0xaa);
    }

    #[test]
    fn set_irqs_bool_data_must_cover_count() {
        let mut p = vec![0u8; 20];
        p[4..8].copy_from_slice(&(irq::DATA_BOOL | irq::ACTION_MASK).to_le_bytes());
        p[16..20].copy_from_slice(&3u32.to_le_bytes());
        assert!(parse_request(cmd::DEVICE_SET_IRQS, &p, 64).is_err());
        p.extend_from_slice(&[1, 0, 1]);
        assert!(parse_request(cmd::DEVICE_SET_IRQS, &p, 64).is_ok());
    }

    #[test]
    fn dma_read_reply_is_checked() {
        let mut p = dma_read(0x1000, 4);
        p.extend_from_slice(&[9, 8, 7, 6]);
        assert_eq!(dma_read_data(&p, 0x1000, 4).unwrap(), &[9, 8, 7, 6]);
        assert!(dma_read_data(&p, 0x2000, 4).is_err());
        assert!(dma_read_data(&p[..10], 0x1000, 4).is_err());
    }
}
