//! `TlpPacket`: a checked view over the bytes of one TLP, in the manner of smoltcp's
//! `Packet` types. [`TlpPacket::new_checked`] verifies the structure once — prefixes,
//! a Fmt/Type that names a TLP, and a size that matches the header, Length field and
//! digest — after which no accessor can panic. Semantic rules (byte enables, 4 KiB,
//! Max_Payload_Size, ECRC) are checked by [`TlpRepr::parse`](crate::TlpRepr::parse).
//!
//! Header layouts follow PCIe 6.0 §2.2 (non-flit mode); multi-byte fields are big-endian.

use zerocopy::network_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::error::Error;
use crate::fields::{AddressType, Attr, Kind};
use crate::ids::{Bdf, Tag};
use crate::prefix::{MAX_PREFIXES, Prefix, Prefixes};

/// DW0, common to every TLP (PCIe 6.0 §2.2.1.1, Figure 2-5).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default, Debug)]
#[repr(C)]
pub(crate) struct Dw0 {
    /// Fmt[2:0] in bits 7:5, Type[4:0] in bits 4:0.
    pub(crate) fmt_type: u8,
    /// T9 (7), TC[2:0] (6:4), T8 (3), Attr[2] (2), LN/reserved (1), TH (0).
    pub(crate) tc_byte: u8,
    /// TD (15), EP (14), Attr[1:0] (13:12), AT[1:0] (11:10), Length[9:0].
    pub(crate) flags_length: U16,
}

/// DW1 of a request: memory, IO, config, AtomicOp, message (PCIe 6.0 §2.2.6.2).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct RequestDw1 {
    pub(crate) requester_id: U16,
    /// Tag[7:0].
    pub(crate) tag: u8,
    /// Last DW BE (7:4) and First DW BE (3:0); for messages, the Message Code.
    pub(crate) be_or_code: u8,
}

/// DW1 and DW2 of a completion (PCIe 6.0 §2.2.9, Figure 2-26).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct CompletionDw12 {
    pub(crate) completer_id: U16,
    /// Status[2:0] (15:13), BCM (12), Byte Count[11:0].
    pub(crate) status_count: U16,
    pub(crate) requester_id: U16,
    /// Tag[7:0].
    pub(crate) tag: u8,
    /// Reserved (7), Lower Address[6:0].
    pub(crate) lower_address: u8,
}

/// DW2 of a configuration request (PCIe 6.0 §2.2.7.2, Figure 2-22).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Default)]
#[repr(C)]
pub(crate) struct ConfigDw2 {
    pub(crate) target_id: U16,
    /// Extended Register Number in bits 11:8, Register Number in bits 7:2.
    pub(crate) register: U16,
}

/// Where parsing looks for things, and what it enforces beyond the spec's fixed rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParseConfig {
    /// Max_Payload_Size in bytes (128..=4096): larger payloads are malformed.
    pub max_payload: usize,
    /// Verify the ECRC of TLPs that carry a digest (TD = 1).
    pub check_ecrc: bool,
}

impl Default for ParseConfig {
    fn default() -> Self {
        ParseConfig { max_payload: 4096, check_ecrc: true }
    }
}

/// A checked view over the bytes of one TLP.
#[derive(Debug, Clone, Copy)]
pub struct TlpPacket<T: AsRef<[u8]>> {
    buffer: T,
    /// Bytes of prefixes before the header.
    header_offset: usize,
    kind: Kind,
    /// DW0, read once by `new_checked`.
    dw0: Dw0,
}

/// Header size in bytes for a Fmt value.
const fn header_len(fmt: u8) -> usize {
    if fmt & 1 == 1 { 16 } else { 12 }
}

impl<T: AsRef<[u8]>> TlpPacket<T> {
    /// Checks that `buffer` holds exactly one structurally valid TLP.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let b = buffer.as_ref();
        let mut off = 0;
        let kind = loop {
            let Some(&byte0) = b.get(off) else {
                return Err(Error::Truncated { needed: off + 4, actual: b.len() });
            };
            let (fmt, ty) = (byte0 >> 5, byte0 & 0x1f);
            if fmt == 0b100 {
                if off / 4 == MAX_PREFIXES {
                    return Err(Error::TooManyPrefixes { count: off / 4 + 1, max: MAX_PREFIXES });
                }
                off += 4;
                continue;
            }
            break Kind::from_fmt_type(fmt, ty).ok_or(Error::ReservedFmtType { fmt, ty })?;
        };
        let hdr = off + header_len(b[off] >> 5);
        if b.len() < hdr {
            return Err(Error::Truncated { needed: hdr, actual: b.len() });
        }
        let dw0 = Dw0::read_from_prefix(&b[off..]).map(|(d, _)| d).unwrap_or_default();
        let packet = TlpPacket { buffer, header_offset: off, kind, dw0 };
        let digest = if packet.td() { 4 } else { 0 };
        let actual = packet.buffer.as_ref().len();
        if kind.has_data() {
            let expected = hdr + packet.length_dw() as usize * 4 + digest;
            if actual != expected {
                return Err(Error::LengthMismatch { length_dw: packet.length_dw(), expected, actual });
            }
        } else if actual < hdr + digest {
            return Err(Error::Truncated { needed: hdr + digest, actual });
        } else if actual > hdr + digest {
            return Err(Error::UnexpectedPayload { kind, extra: actual - hdr - digest });
        }
        // Prefix order and end-to-end count, checked once here so `prefixes()` cannot fail.
        let mut prefixes = Prefixes::EMPTY;
        for chunk in packet.buffer.as_ref()[..off].chunks_exact(4) {
            let raw = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if let Some(p) = Prefix::from_raw(raw) {
                prefixes.push(p)?;
            }
        }
        Ok(packet)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_offset..]
    }

    pub(crate) fn dw0(&self) -> Dw0 {
        self.dw0
    }

    /// The TLP kind named by Fmt/Type.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The prefixes, in wire order.
    pub fn prefixes(&self) -> Prefixes {
        let mut out = Prefixes::EMPTY;
        if self.header_offset == 0 {
            return out;
        }
        for chunk in self.buffer.as_ref()[..self.header_offset].chunks_exact(4) {
            if let Some(p) = Prefix::from_raw(u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]])) {
                // Order and count were verified in new_checked.
                let _ = out.push(p);
            }
        }
        out
    }
    /// Bytes of prefixes before the header.
    pub fn header_offset(&self) -> usize {
        self.header_offset
    }
    /// Header size in bytes (12 or 16).
    pub fn header_len(&self) -> usize {
        header_len(self.fmt())
    }
    /// Fmt[2:0].
    pub fn fmt(&self) -> u8 {
        self.dw0().fmt_type >> 5
    }
    /// Type[4:0].
    pub fn ty(&self) -> u8 {
        self.dw0().fmt_type & 0x1f
    }
    /// Traffic Class.
    pub fn tc(&self) -> u8 {
        (self.dw0().tc_byte >> 4) & 7
    }
    /// Attr: NS, RO from byte 2 and IDO from byte 1.
    pub fn attr(&self) -> Attr {
        let d = self.dw0();
        Attr::from_bits((((d.flags_length.get() >> 12) & 3) as u8) | ((d.tc_byte >> 2) & 1) << 2)
    }
    /// TLP Processing Hints present.
    pub fn th(&self) -> bool {
        self.dw0().tc_byte & 1 != 0
    }
    /// TLP digest (ECRC) present.
    pub fn td(&self) -> bool {
        self.dw0().flags_length.get() & 0x8000 != 0
    }
    /// Poisoned data.
    pub fn ep(&self) -> bool {
        self.dw0().flags_length.get() & 0x4000 != 0
    }
    /// Address Type.
    pub fn at(&self) -> AddressType {
        AddressType::from_bits(((self.dw0().flags_length.get() >> 10) & 3) as u8)
    }
    /// The Length field decoded: 1..=1024 DW (0 encodes 1024).
    pub fn length_dw(&self) -> u16 {
        match self.dw0().flags_length.get() & 0x3ff {
            0 => 1024,
            n => n,
        }
    }
    /// The 10-bit tag: T9 and T8 from DW0, Tag[7:0] from byte 6 (requests) or 10
    /// (completions).
    pub fn tag(&self) -> Tag {
        let d = self.dw0();
        let hi = (((d.tc_byte >> 7) & 1) as u16) << 9 | (((d.tc_byte >> 3) & 1) as u16) << 8;
        let h = self.header();
        let lo = if matches!(self.kind, Kind::Cpl | Kind::CplD | Kind::CplLk | Kind::CplDLk) {
            h[10]
        } else {
            h[6]
        };
        Tag::from_bits(hi | lo as u16)
    }
    /// Requester ID (bytes 4..6 of a request, 8..10 of a completion).
    pub fn requester_id(&self) -> Bdf {
        let h = self.header();
        let at = if matches!(self.kind, Kind::Cpl | Kind::CplD | Kind::CplLk | Kind::CplDLk) { 8 } else { 4 };
        Bdf::from_raw(u16::from_be_bytes([h[at], h[at + 1]]))
    }
    /// The payload (empty for TLPs without data).
    pub fn payload(&self) -> &[u8] {
        let start = self.header_offset + self.header_len();
        let end = self.buffer.as_ref().len() - if self.td() { 4 } else { 0 };
        &self.buffer.as_ref()[start..end]
    }
    /// The TLP digest, if TD is set.
    pub fn digest(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.td().then(|| {
            let d = &b[b.len() - 4..];
            u32::from_be_bytes([d[0], d[1], d[2], d[3]])
        })
    }
    /// All bytes of the TLP (prefixes, header, payload, digest).
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The header bytes alone.
    pub fn header_bytes(&self) -> &[u8] {
        &self.header()[..self.header_len()]
    }
}

impl<'a> TlpPacket<&'a [u8]> {
    /// The payload, borrowed for the buffer's lifetime.
    pub fn payload_ref(&self) -> &'a [u8] {
        let start = self.header_offset + header_len(self.buffer[self.header_offset] >> 5);
        let end = self.buffer.len() - if self.td() { 4 } else { 0 };
        &self.buffer[start..end]
    }
}

/// DW-aligned access to a header of at least `offset + 4` bytes.
pub(crate) fn read_u32(header: &[u8], offset: usize) -> u32 {
    U32::read_from_prefix(&header[offset..]).map(|(v, _)| v.get()).unwrap_or(0)
}
