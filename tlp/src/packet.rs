//! `TlpPacket`: a checked view over the bytes of one TLP, in the manner of smoltcp's
//! `Packet` types. [`TlpPacket::new_checked`] verifies the structure once — prefixes,
//! a Fmt/Type that names a TLP, and a size that matches the header, Length field and
//! digest — after which no accessor can panic. Semantic rules (byte enables, 4 KiB,
//! Max_Payload_Size, ECRC) are checked by [`TlpRepr::parse`](crate::TlpRepr::parse).
//!
//! Header layouts follow PCIe 6.0 §2.2 (non-flit mode); multi-byte fields are big-endian.
//! DW0 (PCIe 6.0 §2.2.1.1, Figure 2-5) is kept as a word:
//!
//! ```text
//! 31..29 Fmt  28..24 Type  23 T9  22..20 TC  19 T8  18 Attr[2]  17 LN/rsvd  16 TH
//! 15 TD  14 EP  13..12 Attr[1:0]  11..10 AT  9..0 Length
//! ```
//!
//! and the rest of the header is read as big-endian DWs (zerocopy's `network_endian::U32`):
//!
//! ```text
//! request DW1      31..16 Requester ID  15..8 Tag[7:0]  7..4 Last DW BE  3..0 First DW BE
//!                  (messages: 7..0 Message Code)
//! memory DW2(/3)   address (64-bit: DW2 high, DW3 low); bits 1..0 PH when TH is set
//! config DW2       31..16 target BDF  11..8 Extended Register Number  7..2 Register Number
//! completion DW1   31..16 Completer ID  15..13 Status  12 BCM  11..0 Byte Count
//! completion DW2   31..16 Requester ID  15..8 Tag[7:0]  6..0 Lower Address
//! message DW2..3   address, target BDF (31..16 of DW2) or message-specific fields
//! ```

use zerocopy::FromBytes;
use zerocopy::network_endian::U32;

use crate::error::Error;
use crate::fields::{AddressType, Attr, Kind};
use crate::ids::{Bdf, Tag};
use crate::prefix::{MAX_PREFIXES, Prefix, Prefixes};

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
    dw0: u32,
}

/// Reads a big-endian DW at `offset` (callers guarantee `offset + 4 <= bytes.len()`).
pub(crate) fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    U32::read_from_prefix(&bytes[offset..]).map(|(v, _)| v.get()).unwrap_or(0)
}

impl<T: AsRef<[u8]>> TlpPacket<T> {
    /// Checks that `buffer` holds exactly one structurally valid TLP.
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let b = buffer.as_ref();
        let mut off = 0;
        while b.get(off).is_some_and(|&byte0| byte0 >> 5 == 0b100) {
            off += 4;
            if off / 4 > MAX_PREFIXES {
                return Err(Error::TooManyPrefixes { count: off / 4, max: MAX_PREFIXES });
            }
        }
        if b.len() < off + 4 {
            return Err(Error::Truncated { needed: off + 4, actual: b.len() });
        }
        let dw0 = read_u32(b, off);
        let byte0 = (dw0 >> 24) as usize;
        let kind = Kind::BY_BYTE0[byte0]
            .ok_or(Error::ReservedFmtType { fmt: (byte0 >> 5) as u8, ty: (byte0 & 0x1f) as u8 })?;
        let hdr = off + if kind.is_4dw() { 16 } else { 12 };
        let digest = ((dw0 >> 15) & 1) as usize * 4;
        let actual = b.len();
        if kind.has_data() {
            let length_dw = length_of(dw0);
            let expected = hdr + length_dw as usize * 4 + digest;
            if actual != expected {
                if actual < hdr {
                    return Err(Error::Truncated { needed: hdr, actual });
                }
                return Err(Error::LengthMismatch { length_dw, expected, actual });
            }
        } else if actual != hdr + digest {
            if actual < hdr + digest {
                return Err(Error::Truncated { needed: hdr + digest, actual });
            }
            return Err(Error::UnexpectedPayload { kind, extra: actual - hdr - digest });
        }
        if off > 0 {
            // Prefix order and end-to-end count, checked once here so `prefixes()` cannot fail.
            let mut prefixes = Prefixes::EMPTY;
            for i in (0..off).step_by(4) {
                if let Some(p) = Prefix::from_raw(read_u32(b, i)) {
                    prefixes.push(p)?;
                }
            }
        }
        Ok(TlpPacket { buffer, header_offset: off, kind, dw0 })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// DW0 of the header.
    pub(crate) fn dw0(&self) -> u32 {
        self.dw0
    }

    /// The TLP kind named by Fmt/Type.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The prefixes, in wire order.
    pub fn prefixes(&self) -> Prefixes {
        let mut out = Prefixes::EMPTY;
        let b = self.buffer.as_ref();
        for i in (0..self.header_offset).step_by(4) {
            if let Some(p) = Prefix::from_raw(read_u32(b, i)) {
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
        if self.kind.is_4dw() { 16 } else { 12 }
    }
    /// Fmt\[2:0\].
    pub fn fmt(&self) -> u8 {
        (self.dw0 >> 29) as u8
    }
    /// Type\[4:0\].
    pub fn ty(&self) -> u8 {
        ((self.dw0 >> 24) & 0x1f) as u8
    }
    /// Traffic Class.
    pub fn tc(&self) -> u8 {
        ((self.dw0 >> 20) & 7) as u8
    }
    /// Attr: NS and RO from DW0 bits 13:12, IDO from bit 18.
    pub fn attr(&self) -> Attr {
        Attr::from_bits((((self.dw0 >> 12) & 3) | ((self.dw0 >> 18) & 1) << 2) as u8)
    }
    /// TLP Processing Hints present.
    pub fn th(&self) -> bool {
        self.dw0 & (1 << 16) != 0
    }
    /// DW0 bit 17: LN (Lightweight Notification) in PCIe 3.x–5.0, reserved in 6.0.
    pub fn ln(&self) -> bool {
        self.dw0 & (1 << 17) != 0
    }
    /// TLP digest (ECRC) present.
    pub fn td(&self) -> bool {
        self.dw0 & (1 << 15) != 0
    }
    /// Poisoned data.
    pub fn ep(&self) -> bool {
        self.dw0 & (1 << 14) != 0
    }
    /// Address Type.
    pub fn at(&self) -> AddressType {
        AddressType::from_bits(((self.dw0 >> 10) & 3) as u8)
    }
    /// The Length field decoded: 1..=1024 DW (0 encodes 1024).
    pub fn length_dw(&self) -> u16 {
        length_of(self.dw0)
    }
    fn is_completion(&self) -> bool {
        self.kind.is_completion()
    }
    /// The 10-bit tag: T9 and T8 from DW0, Tag\[7:0\] from byte 6 (requests) or 10
    /// (completions).
    pub fn tag(&self) -> Tag {
        let hi = ((self.dw0 >> 23) & 1) << 9 | ((self.dw0 >> 19) & 1) << 8;
        let at = self.header_offset + if self.is_completion() { 10 } else { 6 };
        Tag::from_bits((hi | self.buffer.as_ref()[at] as u32) as u16)
    }
    /// Requester ID (bytes 4..6 of a request, 8..10 of a completion).
    pub fn requester_id(&self) -> Bdf {
        let at = self.header_offset + if self.is_completion() { 8 } else { 4 };
        let b = self.buffer.as_ref();
        Bdf::from_raw(u16::from_be_bytes([b[at], b[at + 1]]))
    }
    /// The payload (empty for TLPs without data).
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[self.header_offset + self.header_len()..b.len() - if self.td() { 4 } else { 0 }]
    }
    /// The TLP digest, if TD is set.
    pub fn digest(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        self.td().then(|| read_u32(b, b.len() - 4))
    }
    /// All bytes of the TLP (prefixes, header, payload, digest).
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The header bytes alone.
    pub fn header_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_offset..self.header_offset + self.header_len()]
    }
}

impl<'a> TlpPacket<&'a [u8]> {
    /// All bytes of the TLP, borrowed for the buffer's lifetime.
    pub fn as_bytes_ref(&self) -> &'a [u8] {
        self.buffer
    }
    /// The payload, borrowed for the buffer's lifetime.
    pub fn payload_ref(&self) -> &'a [u8] {
        let b: &'a [u8] = self.buffer;
        &b[self.header_offset + self.header_len()..b.len() - if self.td() { 4 } else { 0 }]
    }
}

/// The Length field of DW0: 1..=1024 DW, with 0 encoding 1024.
pub(crate) const fn length_of(dw0: u32) -> u16 {
    match dw0 & 0x3ff {
        0 => 1024,
        n => n as u16,
    }
}
