//! `TlpRepr`: the parsed, validated value of a TLP, in the manner of smoltcp's `Repr`
//! types. [`TlpRepr::parse`] reads a checked [`TlpPacket`] and enforces the spec's rules;
//! [`TlpRepr::emit`] enforces the same rules and writes the bytes. Payloads are borrowed,
//! never copied, by parse.

use core::fmt;

use crate::ecrc::ecrc;
use crate::error::Error;
use crate::fields::{
    AddressType, AtomicOp, Attr, CplStatus, Credits, FcClass, Kind, MessageCode, MsgRouting,
};
use crate::ids::{Bdf, Tag};
use crate::packet::{ParseConfig, TlpPacket, length_of, read_u32};
use crate::prefix::Prefixes;

/// A request address as carried in a 3 DW (32-bit) or 4 DW (64-bit) header. The low two
/// bits are always zero (they hold PH on the wire).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Address {
    /// From a 3 DW header.
    Bits32(u32),
    /// From a 4 DW header. The spec asks requesters to use 3 DW headers below 4 GiB; a
    /// receiver accepts 4 DW anyway, and [`TlpRepr::non_conformance`] flags it.
    Bits64(u64),
}

impl Address {
    /// The address that fits the smallest header: 3 DW below 4 GiB, else 4 DW.
    pub const fn new(addr: u64) -> Address {
        if addr <= u32::MAX as u64 { Address::Bits32(addr as u32) } else { Address::Bits64(addr) }
    }
    /// The address value.
    pub const fn value(self) -> u64 {
        match self {
            Address::Bits32(a) => a as u64,
            Address::Bits64(a) => a,
        }
    }
    /// Carried in a 4 DW header.
    pub const fn is_64(self) -> bool {
        matches!(self, Address::Bits64(_))
    }
}

/// The requester fields common to memory, IO, config and AtomicOp requests.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Request {
    /// Requester ID.
    pub requester: Bdf,
    /// Tag (10-bit).
    pub tag: Tag,
    /// First DW Byte Enables (4 bits).
    pub first_be: u8,
    /// Last DW Byte Enables (4 bits).
    pub last_be: u8,
}

impl Request {
    /// The request fields of a header's DW0 (T9, T8) and DW1.
    #[inline(always)]
    fn decode(dw0: u32, dw1: u32) -> Request {
        Request {
            requester: Bdf::from_raw((dw1 >> 16) as u16),
            tag: Tag::from_bits(tag_high_bits(dw0) | ((dw1 >> 8) & 0xff) as u16),
            first_be: (dw1 & 0xf) as u8,
            last_be: ((dw1 >> 4) & 0xf) as u8,
        }
    }
    /// DW1: Requester ID, Tag[7:0], Last and First DW BE (each at most 0xf).
    #[inline(always)]
    fn dw1(self) -> u32 {
        (self.requester.raw() as u32) << 16
            | (self.tag.value() as u32 & 0xff) << 8
            | (self.last_be as u32) << 4
            | self.first_be as u32
    }
}

/// The target of a configuration request.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ConfigTarget {
    /// Type 1 (to be forwarded by a bridge) rather than Type 0.
    pub type1: bool,
    /// Target bus/device/function.
    pub target: Bdf,
    /// Byte offset of the DW addressed (Extended Register Number and Register Number),
    /// 0..=4092, a multiple of 4.
    pub register: u16,
}

/// The fields of a completion.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Completion {
    /// Completer ID.
    pub completer: Bdf,
    /// Completion status.
    pub status: CplStatus,
    /// Byte Count Modified (PCI-X legacy).
    pub bcm: bool,
    /// Bytes left to complete the request, including this completion's, 1..=4096
    /// (4096 is encoded as 0).
    pub byte_count: u16,
    /// Requester ID of the request being completed.
    pub requester: Bdf,
    /// Tag of the request being completed.
    pub tag: Tag,
    /// Lower Address: address bits 6:0 of the first byte returned (7 bits).
    pub lower_address: u8,
}

impl Completion {
    /// The completion fields of a header's DW0 (T9, T8), DW1 and DW2.
    #[inline(always)]
    fn decode(dw0: u32, dw1: u32, dw2: u32) -> Completion {
        Completion {
            completer: Bdf::from_raw((dw1 >> 16) as u16),
            status: CplStatus::from_bits(((dw1 >> 13) & 7) as u8),
            bcm: dw1 & 0x1000 != 0,
            byte_count: match dw1 & 0xfff {
                0 => 4096,
                n => n as u16,
            },
            requester: Bdf::from_raw((dw2 >> 16) as u16),
            tag: Tag::from_bits(tag_high_bits(dw0) | ((dw2 >> 8) & 0xff) as u16),
            lower_address: (dw2 & 0x7f) as u8,
        }
    }
    /// The most data this completion may carry: the payload starts at Lower Address[1:0]
    /// within its first DW and may not run past the bytes still owed (PCIe 6.0 §2.3.1.1).
    #[inline(always)]
    fn owed_bytes(&self) -> usize {
        (self.byte_count as usize + (self.lower_address & 3) as usize).div_ceil(4) * 4
    }
    /// DW1 and DW2 (Byte Count at most 4096, Lower Address at most 0x7f).
    #[inline(always)]
    fn dws(&self) -> (u32, u32) {
        let dw1 = (self.completer.raw() as u32) << 16
            | (self.status.bits() as u32) << 13
            | (self.bcm as u32) << 12
            | (self.byte_count as u32 & 0xfff);
        let dw2 = (self.requester.raw() as u32) << 16
            | (self.tag.value() as u32 & 0xff) << 8
            | self.lower_address as u32;
        (dw1, dw2)
    }
}

/// The fields of a message.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Message {
    /// Routing subfield of the Type.
    pub routing: MsgRouting,
    /// Requester ID.
    pub requester: Bdf,
    /// Tag.
    pub tag: Tag,
    /// Message Code.
    pub code: MessageCode,
    /// Header bytes 8..16: an address (routed by address), a target ID in bytes 8..10
    /// (routed by ID), or message-specific fields. Carried unchanged.
    pub fields: [u8; 8],
}

impl Message {
    /// Bytes 8..16 as an address (meaningful when routed by address).
    pub fn address(&self) -> u64 {
        u64::from_be_bytes(self.fields)
    }
    /// Bytes 8..10 as a BDF (the target when routed by ID).
    pub fn target(&self) -> Bdf {
        Bdf::from_raw(u16::from_be_bytes([self.fields[0], self.fields[1]]))
    }
    /// Bytes 10..12: the Vendor ID of a Vendor_Defined message.
    pub fn vendor_id(&self) -> u16 {
        u16::from_be_bytes([self.fields[2], self.fields[3]])
    }
}

/// What a TLP is, with the fields that only its kind has.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Body<'a> {
    /// MRd (or MRdLk when `locked`).
    MemRead {
        /// Requester fields.
        req: Request,
        /// Target address.
        address: Address,
        /// Processing Hint (with TH).
        ph: u8,
        /// Requested length in DW, 1..=1024.
        length_dw: u16,
        /// MRdLk.
        locked: bool,
    },
    /// MWr.
    MemWrite {
        /// Requester fields.
        req: Request,
        /// Target address.
        address: Address,
        /// Processing Hint (with TH).
        ph: u8,
        /// Payload, whole DWs.
        data: &'a [u8],
    },
    /// IORd.
    IoRead {
        /// Requester fields.
        req: Request,
        /// IO address.
        address: u32,
    },
    /// IOWr.
    IoWrite {
        /// Requester fields.
        req: Request,
        /// IO address.
        address: u32,
        /// One DW of payload.
        data: &'a [u8],
    },
    /// CfgRd0 / CfgRd1.
    CfgRead {
        /// Requester fields.
        req: Request,
        /// Target and register.
        cfg: ConfigTarget,
    },
    /// CfgWr0 / CfgWr1.
    CfgWrite {
        /// Requester fields.
        req: Request,
        /// Target and register.
        cfg: ConfigTarget,
        /// One DW of payload.
        data: &'a [u8],
    },
    /// FetchAdd, Swap, CAS.
    Atomic {
        /// Which operation.
        op: AtomicOp,
        /// Requester fields (byte enables carried as found).
        req: Request,
        /// Target address.
        address: Address,
        /// Processing Hint (with TH).
        ph: u8,
        /// Operand(s).
        data: &'a [u8],
    },
    /// Cpl, CplD, CplLk, CplDLk.
    Completion {
        /// Completion fields.
        cpl: Completion,
        /// CplLk / CplDLk.
        locked: bool,
        /// Payload (CplD, CplDLk).
        data: Option<&'a [u8]>,
    },
    /// Msg, MsgD.
    Message {
        /// Message fields.
        msg: Message,
        /// Payload (MsgD).
        data: Option<&'a [u8]>,
    },
}

/// A parsed, validated TLP.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TlpRepr<'a> {
    /// TLP prefixes, in wire order.
    pub prefixes: Prefixes,
    /// Traffic Class, 0..=7.
    pub tc: u8,
    /// Attributes (NS, RO, IDO).
    pub attr: Attr,
    /// TLP Processing Hints present.
    pub th: bool,
    /// DW0 bit 17: LN (Lightweight Notification) in PCIe 3.x–5.0, reserved in 6.0. Kept as
    /// received and written back, so that a bridge forwards every bit a TLP carried.
    pub ln: bool,
    /// Carries a TLP digest: emit computes the ECRC, parse verifies it.
    pub td: bool,
    /// Poisoned.
    pub ep: bool,
    /// Address Type.
    pub at: AddressType,
    /// Kind-specific fields.
    pub body: Body<'a>,
}

/// Ways a TLP is accepted but departs from what the spec asks of its sender.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NonConformance {
    /// A 4 DW header addressing below 4 GiB (PCIe 6.0 §2.2.4.1 asks for 3 DW; receiver
    /// behaviour is left open, so it is accepted).
    FourDwAddressBelow4GiB,
}

impl NonConformance {
    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            NonConformance::FourDwAddressBelow4GiB => "4DW header with an address below 4 GiB",
        }
    }
}

impl<'a> TlpRepr<'a> {
    /// A TLP with the given body and the defaults of ordinary traffic: TC 0, no attributes,
    /// no processing hints, no digest, not poisoned, untranslated, no prefixes.
    pub fn new(body: Body<'a>) -> TlpRepr<'a> {
        TlpRepr {
            prefixes: Prefixes::EMPTY,
            tc: 0,
            attr: Attr::default(),
            th: false,
            ln: false,
            td: false,
            ep: false,
            at: AddressType::Untranslated,
            body,
        }
    }

    /// Parses and validates bytes holding exactly one TLP.
    pub fn parse_bytes(bytes: &'a [u8], cfg: &ParseConfig) -> Result<TlpRepr<'a>, Error> {
        TlpRepr::parse(&TlpPacket::new_checked(bytes)?, cfg)
    }

    /// Parses a checked packet and enforces the spec's rules (and `cfg`). Each rule is
    /// checked on the decoded fields before the value is assembled.
    #[inline]
    pub fn parse(packet: &TlpPacket<&'a [u8]>, cfg: &ParseConfig) -> Result<TlpRepr<'a>, Error> {
        // The datapath's TLPs — MRd, MWr, Cpl and CplD without prefix or digest — take a
        // straight-line path per kind with each rule reduced to one test; anything else,
        // and any broken rule, goes to the general path, which parses it or names the rule.
        // Kept apart, the general path's dispatch over every kind and error no longer
        // spills these paths' registers (`cargo bench -p dxpu-tlp --bench codec`: a third
        // of the time of a header).
        if packet.header_offset() != 0 || packet.td() {
            return Self::parse_general(packet, cfg);
        }
        match packet.kind() {
            Kind::MRd32 => Self::parse_memory::<false, false>(packet, cfg),
            Kind::MRd64 => Self::parse_memory::<true, false>(packet, cfg),
            Kind::MWr32 => Self::parse_memory::<false, true>(packet, cfg),
            Kind::MWr64 => Self::parse_memory::<true, true>(packet, cfg),
            Kind::Cpl => Self::parse_completion::<false>(packet, cfg),
            Kind::CplD => Self::parse_completion::<true>(packet, cfg),
            _ => Self::parse_general(packet, cfg),
        }
    }

    /// [`TlpRepr::parse`]'s path for MRd (`WRITE` false) and MWr with a 3 DW or 4 DW
    /// header, no prefix, no digest.
    #[inline(always)]
    fn parse_memory<const FOUR_DW: bool, const WRITE: bool>(
        packet: &TlpPacket<&'a [u8]>,
        cfg: &ParseConfig,
    ) -> Result<TlpRepr<'a>, Error> {
        let all: &'a [u8] = packet.as_bytes_ref();
        let hlen = if FOUR_DW { 16 } else { 12 };
        let (Some(h), Some(data)) = (all.first_chunk::<12>(), all.get(hlen..)) else {
            return Self::parse_general(packet, cfg);
        };
        let dw0 = packet.dw0();
        let dw1 = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let dw2 = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let (address, ph) = if FOUR_DW {
            let dw3 = read_u32(all, 12);
            (Address::Bits64((dw2 as u64) << 32 | (dw3 & !3) as u64), (dw3 & 3) as u8)
        } else {
            (Address::Bits32(dw2 & !3), (dw2 & 3) as u8)
        };
        let ph = if packet.th() { ph } else { 0 };
        // new_checked matched a payload to the Length field.
        let length_dw = length_of(dw0);
        let req = Request::decode(dw0, dw1);
        if !contiguous_in_page(req, address.value(), length_dw) || WRITE && data.len() > cfg.max_payload {
            return Self::parse_general(packet, cfg);
        }
        let body = if WRITE {
            Body::MemWrite { req, address, ph, data }
        } else {
            Body::MemRead { req, address, ph, length_dw, locked: false }
        };
        Ok(TlpRepr::from_packet(packet, body))
    }

    /// [`TlpRepr::parse`]'s path for Cpl and CplD (`DATA`), no prefix, no digest.
    #[inline(always)]
    fn parse_completion<const DATA: bool>(
        packet: &TlpPacket<&'a [u8]>,
        cfg: &ParseConfig,
    ) -> Result<TlpRepr<'a>, Error> {
        let all: &'a [u8] = packet.as_bytes_ref();
        let (Some(h), Some(data)) = (all.first_chunk::<12>(), all.get(12..)) else {
            return Self::parse_general(packet, cfg);
        };
        let dw0 = packet.dw0();
        let dw1 = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let dw2 = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        let cpl = Completion::decode(dw0, dw1, dw2);
        if DATA && (!carries_owed_data(&cpl, data.len()) || data.len() > cfg.max_payload) {
            return Self::parse_general(packet, cfg);
        }
        let data = if DATA { Some(data) } else { None };
        Ok(TlpRepr::from_packet(packet, Body::Completion { cpl, locked: false, data }))
    }

    /// The TLP of `packet` (which has no prefix or digest) with `body`.
    #[inline(always)]
    fn from_packet(packet: &TlpPacket<&'a [u8]>, body: Body<'a>) -> TlpRepr<'a> {
        TlpRepr {
            prefixes: Prefixes::EMPTY,
            tc: packet.tc(),
            attr: packet.attr(),
            th: packet.th(),
            ln: packet.ln(),
            td: false,
            ep: packet.ep(),
            at: packet.at(),
            body,
        }
    }

    /// [`TlpRepr::parse`] for every TLP: each kind, prefixes, the ECRC, and the error of
    /// each broken rule.
    #[inline(never)]
    fn parse_general(packet: &TlpPacket<&'a [u8]>, cfg: &ParseConfig) -> Result<TlpRepr<'a>, Error> {
        // Most TLPs carry no prefix and no digest: with both known the header and payload
        // sit at constant offsets, and the compiler drops the arithmetic and its checks.
        if packet.header_offset() == 0 && !packet.td() {
            Self::parse_at(packet, cfg, 0, false)
        } else {
            Self::parse_at(packet, cfg, packet.header_offset(), packet.td())
        }
    }

    /// [`TlpRepr::parse`] with the prefix length `off` and the digest flag `td` as the
    /// packet has them.
    #[inline(always)]
    fn parse_at(
        packet: &TlpPacket<&'a [u8]>,
        cfg: &ParseConfig,
        off: usize,
        td: bool,
    ) -> Result<TlpRepr<'a>, Error> {
        let kind = packet.kind();
        let all: &'a [u8] = packet.as_bytes_ref();
        let hlen = if kind.is_4dw() { 16 } else { 12 };
        let (Some(h), Some(payload)) =
            (all.get(off..off + hlen), all.get(off + hlen..all.len().saturating_sub(if td { 4 } else { 0 })))
        else {
            return Err(Error::Truncated { needed: off + hlen, actual: all.len() });
        };
        let dw0 = packet.dw0();
        let dw1 = read_u32(h, 4);
        let dw2 = read_u32(h, 8);
        let dw3 = if kind.is_4dw() { read_u32(h, 12) } else { 0 };
        let c = Common(dw0);
        if kind.has_data() {
            check_max_payload(payload.len(), cfg.max_payload)?;
        }
        // T9 and T8 live in DW0; Tag[7:0] in DW1 (requests) or DW2 (completions).
        let req = Request::decode(dw0, dw1);
        let payload_dw = (payload.len() / 4) as u16;
        // Header length for reads: the Length field; for TLPs with data: the payload.
        let length_dw = if kind.has_data() { payload_dw } else { packet.length_dw() };
        let address = || {
            if kind.is_4dw() {
                (Address::Bits64((dw2 as u64) << 32 | (dw3 & !3) as u64), (dw3 & 3) as u8)
            } else {
                (Address::Bits32(dw2 & !3), (dw2 & 3) as u8)
            }
        };
        let body = match kind {
            Kind::MRd32 | Kind::MRd64 | Kind::MRdLk32 | Kind::MRdLk64 | Kind::MWr32 | Kind::MWr64 => {
                let (address, ph) = address();
                let ph = if c.th() { ph } else { 0 };
                check_memory(kind, c, req, address.value(), ph, length_dw)?;
                if kind.has_data() {
                    Body::MemWrite { req, address, ph, data: payload }
                } else {
                    let locked = matches!(kind, Kind::MRdLk32 | Kind::MRdLk64);
                    Body::MemRead { req, address, ph, length_dw, locked }
                }
            }
            Kind::IORd | Kind::IOWr => {
                check_io_cfg(kind, c, req, 0, length_dw as usize)?;
                let address = dw2 & !3;
                if kind.has_data() {
                    Body::IoWrite { req, address, data: payload }
                } else {
                    Body::IoRead { req, address }
                }
            }
            Kind::CfgRd0 | Kind::CfgRd1 | Kind::CfgWr0 | Kind::CfgWr1 => {
                check_io_cfg(kind, c, req, 0, length_dw as usize)?;
                let cfg = ConfigTarget {
                    type1: matches!(kind, Kind::CfgRd1 | Kind::CfgWr1),
                    target: Bdf::from_raw((dw2 >> 16) as u16),
                    register: (dw2 & 0x0ffc) as u16,
                };
                if kind.has_data() {
                    Body::CfgWrite { req, cfg, data: payload }
                } else {
                    Body::CfgRead { req, cfg }
                }
            }
            Kind::FetchAdd32 | Kind::FetchAdd64 | Kind::Swap32 | Kind::Swap64 | Kind::CAS32 | Kind::CAS64 => {
                let op = match kind {
                    Kind::FetchAdd32 | Kind::FetchAdd64 => AtomicOp::FetchAdd,
                    Kind::Swap32 | Kind::Swap64 => AtomicOp::Swap,
                    _ => AtomicOp::Cas,
                };
                let (address, ph) = address();
                let ph = if c.th() { ph } else { 0 };
                check_atomic(kind, op, c, address.value(), ph, payload_dw)?;
                Body::Atomic { op, req, address, ph, data: payload }
            }
            Kind::Cpl | Kind::CplD | Kind::CplLk | Kind::CplDLk => {
                let cpl = Completion::decode(dw0, dw1, dw2);
                let data = kind.has_data().then_some(payload);
                check_completion(&cpl, data.map(<[u8]>::len))?;
                Body::Completion { cpl, locked: matches!(kind, Kind::CplLk | Kind::CplDLk), data }
            }
            Kind::Msg | Kind::MsgD => {
                let mut fields = [0u8; 8];
                fields[..4].copy_from_slice(&dw2.to_be_bytes());
                fields[4..].copy_from_slice(&dw3.to_be_bytes());
                let msg = Message {
                    routing: MsgRouting::from_bits(((dw0 >> 24) & 7) as u8),
                    requester: req.requester,
                    tag: req.tag,
                    code: MessageCode::from_code((dw1 & 0xff) as u8),
                    fields,
                };
                Body::Message { msg, data: kind.has_data().then_some(payload) }
            }
        };
        let prefixes = if off == 0 && !td { Prefixes::EMPTY } else { prefixes_and_ecrc(packet, cfg)? };
        Ok(TlpRepr {
            prefixes,
            tc: packet.tc(),
            attr: packet.attr(),
            th: packet.th(),
            ln: packet.ln(),
            td,
            ep: packet.ep(),
            at: packet.at(),
            body,
        })
    }

    /// The TLP kind.
    pub fn kind(&self) -> Kind {
        match self.body {
            Body::MemRead { address, locked, .. } => match (locked, address.is_64()) {
                (false, false) => Kind::MRd32,
                (false, true) => Kind::MRd64,
                (true, false) => Kind::MRdLk32,
                (true, true) => Kind::MRdLk64,
            },
            Body::MemWrite { address, .. } => {
                if address.is_64() {
                    Kind::MWr64
                } else {
                    Kind::MWr32
                }
            }
            Body::IoRead { .. } => Kind::IORd,
            Body::IoWrite { .. } => Kind::IOWr,
            Body::CfgRead { cfg, .. } => {
                if cfg.type1 {
                    Kind::CfgRd1
                } else {
                    Kind::CfgRd0
                }
            }
            Body::CfgWrite { cfg, .. } => {
                if cfg.type1 {
                    Kind::CfgWr1
                } else {
                    Kind::CfgWr0
                }
            }
            Body::Atomic { op, address, .. } => match (op, address.is_64()) {
                (AtomicOp::FetchAdd, false) => Kind::FetchAdd32,
                (AtomicOp::FetchAdd, true) => Kind::FetchAdd64,
                (AtomicOp::Swap, false) => Kind::Swap32,
                (AtomicOp::Swap, true) => Kind::Swap64,
                (AtomicOp::Cas, false) => Kind::CAS32,
                (AtomicOp::Cas, true) => Kind::CAS64,
            },
            Body::Completion { locked, data, .. } => match (locked, data.is_some()) {
                (false, false) => Kind::Cpl,
                (false, true) => Kind::CplD,
                (true, false) => Kind::CplLk,
                (true, true) => Kind::CplDLk,
            },
            Body::Message { data, .. } => {
                if data.is_some() {
                    Kind::MsgD
                } else {
                    Kind::Msg
                }
            }
        }
    }

    /// Fmt\[2:0\] as emitted.
    pub fn fmt(&self) -> u8 {
        let k = self.kind();
        (k.has_data() as u8) << 1 | k.is_4dw() as u8
    }

    /// Type\[4:0\] as emitted.
    pub fn ty(&self) -> u8 {
        match self.body {
            Body::MemRead { locked, .. } => locked as u8,
            Body::MemWrite { .. } => 0b00000,
            Body::IoRead { .. } | Body::IoWrite { .. } => 0b00010,
            Body::CfgRead { cfg, .. } | Body::CfgWrite { cfg, .. } => 0b00100 | cfg.type1 as u8,
            Body::Atomic { op, .. } => op.type_bits(),
            Body::Completion { locked, .. } => 0b01010 | locked as u8,
            Body::Message { msg, .. } => 0b10000 | msg.routing.bits(),
        }
    }

    /// The payload, if the kind carries one.
    pub fn data(&self) -> Option<&'a [u8]> {
        match self.body {
            Body::MemWrite { data, .. }
            | Body::IoWrite { data, .. }
            | Body::CfgWrite { data, .. }
            | Body::Atomic { data, .. } => Some(data),
            Body::Completion { data, .. } | Body::Message { data, .. } => data,
            Body::MemRead { .. } | Body::IoRead { .. } | Body::CfgRead { .. } => None,
        }
    }

    /// The same TLP with `data` in place of its payload (a kind without one, or a
    /// completion or message without data, is returned as it was): how a TLP parsed where
    /// it arrived is kept past that buffer, its payload copied elsewhere.
    pub fn with_data<'b>(self, data: &'b [u8]) -> TlpRepr<'b> {
        let body = match self.body {
            Body::MemRead { req, address, ph, length_dw, locked } => {
                Body::MemRead { req, address, ph, length_dw, locked }
            }
            Body::MemWrite { req, address, ph, .. } => Body::MemWrite { req, address, ph, data },
            Body::IoRead { req, address } => Body::IoRead { req, address },
            Body::IoWrite { req, address, .. } => Body::IoWrite { req, address, data },
            Body::CfgRead { req, cfg } => Body::CfgRead { req, cfg },
            Body::CfgWrite { req, cfg, .. } => Body::CfgWrite { req, cfg, data },
            Body::Atomic { op, req, address, ph, .. } => Body::Atomic { op, req, address, ph, data },
            Body::Completion { cpl, locked, data: d } => {
                Body::Completion { cpl, locked, data: d.map(|_| data) }
            }
            Body::Message { msg, data: d } => Body::Message { msg, data: d.map(|_| data) },
        };
        TlpRepr {
            prefixes: self.prefixes,
            tc: self.tc,
            attr: self.attr,
            th: self.th,
            ln: self.ln,
            td: self.td,
            ep: self.ep,
            at: self.at,
            body,
        }
    }

    /// The Length field's value in DW: the payload size for TLPs with data, the requested
    /// size for reads, `None` where the field is reserved (Cpl, CplLk, Msg).
    pub fn length_dw(&self) -> Option<u16> {
        match self.body {
            Body::MemRead { length_dw, .. } => Some(length_dw),
            Body::IoRead { .. } | Body::CfgRead { .. } => Some(1),
            _ => self.data().map(|d| (d.len() / 4) as u16),
        }
    }

    /// Requester ID and tag, for every kind (completions carry the requester's).
    pub fn requester_tag(&self) -> (Bdf, Tag) {
        match self.body {
            Body::MemRead { req, .. }
            | Body::MemWrite { req, .. }
            | Body::IoRead { req, .. }
            | Body::IoWrite { req, .. }
            | Body::CfgRead { req, .. }
            | Body::CfgWrite { req, .. }
            | Body::Atomic { req, .. } => (req.requester, req.tag),
            Body::Completion { cpl, .. } => (cpl.requester, cpl.tag),
            Body::Message { msg, .. } => (msg.requester, msg.tag),
        }
    }

    /// The request fields, for kinds that have them.
    pub fn request(&self) -> Option<Request> {
        match self.body {
            Body::MemRead { req, .. }
            | Body::MemWrite { req, .. }
            | Body::IoRead { req, .. }
            | Body::IoWrite { req, .. }
            | Body::CfgRead { req, .. }
            | Body::CfgWrite { req, .. }
            | Body::Atomic { req, .. } => Some(req),
            Body::Completion { .. } | Body::Message { .. } => None,
        }
    }

    /// The request address of memory, IO and AtomicOp requests (and of messages routed
    /// by address).
    pub fn address(&self) -> Option<u64> {
        match self.body {
            Body::MemRead { address, .. } | Body::MemWrite { address, .. } | Body::Atomic { address, .. } => {
                Some(address.value())
            }
            Body::IoRead { address, .. } | Body::IoWrite { address, .. } => Some(address as u64),
            Body::Message { msg, .. } if msg.routing == MsgRouting::ByAddress => Some(msg.address()),
            _ => None,
        }
    }

    /// The flow-control class.
    pub fn fc_class(&self) -> FcClass {
        self.kind().fc_class()
    }

    /// Credits this TLP consumes in its class: one header, one data credit per 16 bytes.
    pub fn credits(&self) -> Credits {
        Credits { header: 1, data: self.data().map_or(0, |d| d.len().div_ceil(16) as u16) }
    }

    /// Departures from what the spec asks of a sender that a receiver accepts.
    pub fn non_conformance(&self) -> Option<NonConformance> {
        match self.body {
            Body::MemRead { address: Address::Bits64(a), .. }
            | Body::MemWrite { address: Address::Bits64(a), .. }
            | Body::Atomic { address: Address::Bits64(a), .. }
                if a <= u32::MAX as u64 =>
            {
                Some(NonConformance::FourDwAddressBelow4GiB)
            }
            _ => None,
        }
    }

    /// Bytes [`TlpRepr::emit`] writes: prefixes, header, payload, digest.
    pub fn buffer_len(&self) -> usize {
        let k = self.kind();
        self.prefixes.wire_len()
            + if k.is_4dw() { 16 } else { 12 }
            + self.data().map_or(0, <[u8]>::len)
            + if self.td { 4 } else { 0 }
    }

    /// Checks every rule that parse enforces, with `max_payload` as Max_Payload_Size.
    pub fn validate(&self, max_payload: usize) -> Result<(), Error> {
        self.encode(max_payload).map(|_| ())
    }

    /// Checks every rule and computes the header: the one place emit and validate share.
    #[inline]
    fn encode(&self, max_payload: usize) -> Result<Encoded<'a>, Error> {
        if self.tc > 7 {
            return Err(Error::FieldOverflow { field: "tc", value: self.tc as u64, max: 7 });
        }
        let c = Common(
            (self.tc as u32) << 20
                | ((self.attr.bits() as u32) >> 2) << 18
                | (self.ln as u32) << 17
                | (self.th as u32) << 16
                | ((self.attr.bits() as u32) & 3) << 12
                | (self.at.bits() as u32) << 10,
        );
        let payload = |data: &'a [u8]| -> Result<&'a [u8], Error> {
            if data.is_empty() || !data.len().is_multiple_of(4) || data.len() > 4096 {
                return Err(Error::InvalidPayload { bytes: data.len() });
            }
            check_max_payload(data.len(), max_payload)?;
            Ok(data)
        };
        let request = |req: Request| -> Result<u32, Error> {
            if req.first_be > 0xf || req.last_be > 0xf {
                let (field, v) =
                    if req.first_be > 0xf { ("first_be", req.first_be) } else { ("last_be", req.last_be) };
                return Err(Error::FieldOverflow { field, value: v as u64, max: 0xf });
            }
            Ok(req.dw1())
        };
        let address = |a: Address, ph: u8| match a {
            Address::Bits32(a) => (a | ph as u32, 0),
            Address::Bits64(a) => ((a >> 32) as u32, a as u32 | ph as u32),
        };
        let e = |kind, ty: u32, length_dw: u16, tag: Tag, dw1, (dw2, dw3): (u32, u32), data| Encoded {
            kind,
            ty,
            length_dw,
            tag,
            dws: [dw1, dw2, dw3],
            data,
        };
        Ok(match self.body {
            Body::MemRead { req, address: a, ph, length_dw, locked } => {
                let kind = read_kind(locked, a.is_64());
                if !(1..=1024).contains(&length_dw) {
                    return Err(Error::FieldOverflow { field: "length", value: length_dw as u64, max: 1024 });
                }
                let dw1 = request(req)?;
                check_memory(kind, c, req, a.value(), ph, length_dw)?;
                e(kind, locked as u32, length_dw, req.tag, dw1, address(a, ph), &[][..])
            }
            Body::MemWrite { req, address: a, ph, data } => {
                let kind = if a.is_64() { Kind::MWr64 } else { Kind::MWr32 };
                let data = payload(data)?;
                let dw1 = request(req)?;
                let length_dw = (data.len() / 4) as u16;
                check_memory(kind, c, req, a.value(), ph, length_dw)?;
                e(kind, 0, length_dw, req.tag, dw1, address(a, ph), data)
            }
            Body::IoRead { req, address } => {
                let dw1 = request(req)?;
                check_io_cfg(Kind::IORd, c, req, address as u64, 1)?;
                e(Kind::IORd, 0b00010, 1, req.tag, dw1, (address, 0), &[][..])
            }
            Body::IoWrite { req, address, data } => {
                let data = payload(data)?;
                let dw1 = request(req)?;
                check_io_cfg(Kind::IOWr, c, req, address as u64, data.len() / 4)?;
                e(Kind::IOWr, 0b00010, 1, req.tag, dw1, (address, 0), data)
            }
            Body::CfgRead { req, cfg } | Body::CfgWrite { req, cfg, .. } => {
                let data = match self.body {
                    Body::CfgWrite { data, .. } => payload(data)?,
                    _ => &[][..],
                };
                let kind = cfg_kind(!data.is_empty(), cfg.type1);
                check_register(cfg.register)?;
                let dw1 = request(req)?;
                check_io_cfg(kind, c, req, 0, if data.is_empty() { 1 } else { data.len() / 4 })?;
                let dw2 = (cfg.target.raw() as u32) << 16 | cfg.register as u32;
                e(kind, 0b00100 | cfg.type1 as u32, 1, req.tag, dw1, (dw2, 0), data)
            }
            Body::Atomic { op, req, address: a, ph, data } => {
                let kind = atomic_kind(op, a.is_64());
                let data = payload(data)?;
                let dw1 = request(req)?;
                let length_dw = (data.len() / 4) as u16;
                check_atomic(kind, op, c, a.value(), ph, length_dw)?;
                e(kind, op.type_bits() as u32, length_dw, req.tag, dw1, address(a, ph), data)
            }
            Body::Completion { cpl, locked, data } => {
                let kind = completion_kind(locked, data.is_some());
                completion_fields_fit(&cpl)?;
                let data = match data {
                    Some(d) => payload(d)?,
                    None => &[][..],
                };
                check_completion(&cpl, (!data.is_empty()).then_some(data.len()))?;
                let (dw1, dw2) = cpl.dws();
                let length_dw = (data.len() / 4) as u16;
                e(kind, 0b01010 | locked as u32, length_dw, cpl.tag, dw1, (dw2, 0), data)
            }
            Body::Message { msg, data } => {
                let data = match data {
                    Some(d) => payload(d)?,
                    None => &[][..],
                };
                let kind = if data.is_empty() { Kind::Msg } else { Kind::MsgD };
                let f = msg.fields;
                let dw1 = (msg.requester.raw() as u32) << 16
                    | (msg.tag.value() as u32 & 0xff) << 8
                    | msg.code.code() as u32;
                let dws = (
                    u32::from_be_bytes([f[0], f[1], f[2], f[3]]),
                    u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
                );
                let length_dw = (data.len() / 4) as u16;
                e(kind, 0b10000 | msg.routing.bits() as u32, length_dw, msg.tag, dw1, dws, data)
            }
        })
    }

    /// Writes the TLP into `buf` after checking the same rules parse enforces (with no
    /// Max_Payload_Size below the architectural 4096 bytes). Returns the bytes written.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, Error> {
        // As in parse: the datapath's TLPs take a straight-line path per kind, anything
        // else (and any broken rule, or too small a buffer) the general one.
        if !self.prefixes.is_empty() || self.td || self.tc > 7 {
            return self.emit_general(buf);
        }
        match self.body {
            Body::MemRead { req, address, ph, length_dw, locked: false } => match address {
                Address::Bits32(a) => {
                    self.emit_memory::<false>(buf, Kind::MRd32, req, a as u64, ph, length_dw, &[])
                }
                Address::Bits64(a) => self.emit_memory::<true>(buf, Kind::MRd64, req, a, ph, length_dw, &[]),
            },
            Body::MemWrite { req, address, ph, data } => {
                let length_dw = (data.len() / 4) as u16;
                if !whole_dws(data) {
                    return self.emit_general(buf);
                }
                match address {
                    Address::Bits32(a) => {
                        self.emit_memory::<false>(buf, Kind::MWr32, req, a as u64, ph, length_dw, data)
                    }
                    Address::Bits64(a) => {
                        self.emit_memory::<true>(buf, Kind::MWr64, req, a, ph, length_dw, data)
                    }
                }
            }
            Body::Completion { cpl, locked: false, data: None } => {
                self.emit_completion(buf, Kind::Cpl, cpl, &[])
            }
            Body::Completion { cpl, locked: false, data: Some(data) } => {
                if !whole_dws(data) || !carries_owed_data(&cpl, data.len()) {
                    return self.emit_general(buf);
                }
                self.emit_completion(buf, Kind::CplD, cpl, data)
            }
            _ => self.emit_general(buf),
        }
    }

    /// [`TlpRepr::emit`]'s path for MRd and MWr (`kind`) without prefix or digest.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn emit_memory<const FOUR_DW: bool>(
        &self,
        buf: &mut [u8],
        kind: Kind,
        req: Request,
        address: u64,
        ph: u8,
        length_dw: u16,
        data: &[u8],
    ) -> Result<usize, Error> {
        if req.first_be > 0xf
            || req.last_be > 0xf
            || !(1..=1024).contains(&length_dw)
            || address & 3 != 0
            || !(ph == 0 || ph <= 3 && self.th)
            || !contiguous_in_page(req, address, length_dw)
        {
            return self.emit_general(buf);
        }
        let dw1 = req.dw1();
        let (dw2, dw3) = if FOUR_DW {
            ((address >> 32) as u32, address as u32 | ph as u32)
        } else {
            (address as u32 | ph as u32, 0)
        };
        self.emit_header::<FOUR_DW>(buf, kind, length_dw, req.tag, [dw1, dw2, dw3], data)
    }

    /// [`TlpRepr::emit`]'s path for Cpl and CplD (`kind`) without prefix or digest.
    #[inline(always)]
    fn emit_completion(
        &self,
        buf: &mut [u8],
        kind: Kind,
        cpl: Completion,
        data: &[u8],
    ) -> Result<usize, Error> {
        if !(1..=4096).contains(&cpl.byte_count) || cpl.lower_address > 0x7f {
            return self.emit_general(buf);
        }
        let (dw1, dw2) = cpl.dws();
        // Length is reserved (zero) in a Cpl, the payload's size in a CplD.
        let length_dw = (data.len() / 4) as u16;
        self.emit_header::<false>(buf, kind, length_dw, cpl.tag, [dw1, dw2, 0], data)
    }

    /// Writes DW0 (from this TLP's fields, `kind`, `length_dw` and `tag`), `dws` as DW1..
    /// of a 3 DW or 4 DW header, and `data`; the general path when `buf` is too small.
    #[inline(always)]
    fn emit_header<const FOUR_DW: bool>(
        &self,
        buf: &mut [u8],
        kind: Kind,
        length_dw: u16,
        tag: Tag,
        dws: [u32; 3],
        data: &[u8],
    ) -> Result<usize, Error> {
        let t = tag.value() as u32;
        let a = self.attr.bits() as u32;
        let dw0 = (kind as u32) << 24
            | ((t >> 9) & 1) << 23
            | (self.tc as u32) << 20
            | ((t >> 8) & 1) << 19
            | (a >> 2) << 18
            | (self.ln as u32) << 17
            | (self.th as u32) << 16
            | (self.ep as u32) << 14
            | (a & 3) << 12
            | (self.at.bits() as u32) << 10
            | (length_dw as u32 & 0x3ff);
        let hlen = if FOUR_DW { 16 } else { 12 };
        let len = hlen + data.len();
        let Some((header, payload)) = buf.get_mut(..len).and_then(|out| out.split_first_chunk_mut::<12>())
        else {
            return self.emit_general(buf);
        };
        *header = zerocopy::transmute!([dw0.to_be(), dws[0].to_be(), dws[1].to_be()]);
        let payload = if FOUR_DW {
            let Some((dw3, payload)) = payload.split_first_chunk_mut::<4>() else {
                return self.emit_general(buf);
            };
            *dw3 = dws[2].to_be_bytes();
            payload
        } else {
            payload
        };
        if !data.is_empty() {
            payload.copy_from_slice(data);
        }
        Ok(len)
    }

    /// [`TlpRepr::emit`] for every TLP: each kind, prefixes, the ECRC, and the error of
    /// each broken rule.
    #[inline(never)]
    fn emit_general(&self, buf: &mut [u8]) -> Result<usize, Error> {
        let Encoded { kind, ty, length_dw, tag, dws, data } = self.encode(4096)?;
        let hlen = if kind.is_4dw() { 16 } else { 12 };
        let poff = self.prefixes.wire_len();
        let len = poff + hlen + data.len() + if self.td { 4 } else { 0 };
        if buf.len() < len {
            return Err(Error::BufferTooSmall { needed: len, actual: buf.len() });
        }
        let buf = &mut buf[..len];
        let (prefix_bytes, rest) = buf.split_at_mut(poff);
        for (chunk, p) in prefix_bytes.chunks_exact_mut(4).zip(self.prefixes.iter()) {
            chunk.copy_from_slice(&p.raw().to_be_bytes());
        }
        let t = tag.value() as u32;
        let fmt = (kind.has_data() as u32) << 1 | kind.is_4dw() as u32;
        let a = self.attr.bits() as u32;
        let dw0 = (fmt << 5 | ty) << 24
            | ((t >> 9) & 1) << 23
            | (self.tc as u32) << 20
            | ((t >> 8) & 1) << 19
            | (a >> 2) << 18
            | (self.ln as u32) << 17
            | (self.th as u32) << 16
            | (self.td as u32) << 15
            | (self.ep as u32) << 14
            | (a & 3) << 12
            | (self.at.bits() as u32) << 10
            // Reserved for Cpl, CplLk and Msg, which carry no data: zero there.
            | if kind.has_data() || matches!(self.body, Body::MemRead { .. } | Body::IoRead { .. } | Body::CfgRead { .. }) {
                length_dw as u32 & 0x3ff
            } else {
                0
            };
        let (header, rest) = rest.split_at_mut(hlen);
        // Fixed-size writes compile to a few moves; a run-time length would call memmove.
        if let Ok(h) = <&mut [u8; 16]>::try_from(&mut *header) {
            h[..4].copy_from_slice(&dw0.to_be_bytes());
            h[4..8].copy_from_slice(&dws[0].to_be_bytes());
            h[8..12].copy_from_slice(&dws[1].to_be_bytes());
            h[12..].copy_from_slice(&dws[2].to_be_bytes());
        } else if let Ok(h) = <&mut [u8; 12]>::try_from(&mut *header) {
            h[..4].copy_from_slice(&dw0.to_be_bytes());
            h[4..8].copy_from_slice(&dws[0].to_be_bytes());
            h[8..].copy_from_slice(&dws[1].to_be_bytes());
        }
        let (payload, digest) = rest.split_at_mut(data.len());
        if !data.is_empty() {
            payload.copy_from_slice(data);
        }
        if self.td {
            digest.copy_from_slice(&ecrc(prefix_bytes, header, data).to_be_bytes());
        }
        Ok(len)
    }
}

/// What [`TlpRepr::encode`] computes: the kind, Type field, Length, tag, header DWs 1..=3
/// and the payload.
struct Encoded<'a> {
    kind: Kind,
    ty: u32,
    length_dw: u16,
    tag: Tag,
    dws: [u32; 3],
    data: &'a [u8],
}

/// First DW BE values whose enabled bytes run to the end of the DW (1111b, 1110b, 1100b,
/// 1000b), as a bit set indexed by the four-bit field.
const CONTIGUOUS_FIRST_BE: u32 = 1 << 0b1111 | 1 << 0b1110 | 1 << 0b1100 | 1 << 0b1000;
/// Last DW BE values whose enabled bytes run from the start of the DW (0001b, 0011b,
/// 0111b, 1111b), as a bit set.
const CONTIGUOUS_LAST_BE: u32 = 1 << 0b0001 | 1 << 0b0011 | 1 << 0b0111 | 1 << 0b1111;

/// T9 and T8 of a tag, from DW0, at bits 9 and 8.
#[inline(always)]
const fn tag_high_bits(dw0: u32) -> u16 {
    (((dw0 >> 23) & 1) << 9 | ((dw0 >> 19) & 1) << 8) as u16
}

/// A memory request's byte enables without holes (the QW-aligned 2 DW exception aside)
/// and its bytes within one 4 KiB page: the rules of PCIe 6.0 §2.2.5 and §2.2.7 as one
/// test, for byte enables of at most 0xf. [`check_byte_enables`] names what is broken.
#[inline(always)]
fn contiguous_in_page(req: Request, address: u64, length_dw: u16) -> bool {
    let enables = if length_dw == 1 {
        req.last_be == 0
    } else {
        (CONTIGUOUS_FIRST_BE >> req.first_be) & (CONTIGUOUS_LAST_BE >> req.last_be) & 1 != 0
    };
    enables && (address & 0xfff) + length_dw as u64 * 4 <= 0x1000
}

/// A payload of 1..=1024 whole DWs.
#[inline(always)]
fn whole_dws(data: &[u8]) -> bool {
    !data.is_empty() && data.len().is_multiple_of(4) && data.len() <= 4096
}

/// A completion that may carry `len` bytes of data: successful, and no more than the
/// bytes still owed from Lower Address[1:0] on (PCIe 6.0 §2.3.1.1). [`check_completion`]
/// names what is broken.
#[inline(always)]
fn carries_owed_data(cpl: &Completion, len: usize) -> bool {
    cpl.status == CplStatus::Success && len <= cpl.owed_bytes()
}

/// DW0 as a word, for the per-kind rules: decoding a field only where a rule looks at it
/// keeps the parse path from holding every field in a register.
#[derive(Clone, Copy)]
struct Common(u32);

impl Common {
    fn th(self) -> bool {
        self.0 & (1 << 16) != 0
    }
}

/// The parts of a parse that ordinary traffic skips: decoding prefixes and verifying the
/// ECRC. Out of line so that the common path keeps its registers.
#[cold]
#[inline(never)]
fn prefixes_and_ecrc(packet: &TlpPacket<&[u8]>, cfg: &ParseConfig) -> Result<Prefixes, Error> {
    if let (Some(found), true) = (packet.digest(), cfg.check_ecrc) {
        let all = packet.as_bytes();
        let computed = ecrc(&all[..packet.header_offset()], packet.header_bytes(), packet.payload());
        if computed != found {
            return Err(Error::EcrcMismatch { found, computed });
        }
    }
    Ok(packet.prefixes())
}

#[inline(always)]
fn check_max_payload(bytes: usize, max_payload: usize) -> Result<(), Error> {
    if bytes > max_payload {
        return Err(Error::PayloadExceedsMps { bytes, max_payload });
    }
    Ok(())
}

#[inline(always)]
fn check_ph(kind: Kind, th: bool, ph: u8) -> Result<(), Error> {
    if ph > 3 {
        return Err(Error::FieldOverflow { field: "ph", value: ph as u64, max: 3 });
    }
    if ph != 0 && !th {
        return Err(Error::FieldNotAllowed { kind, field: "PH (without TH)", found: ph as u32, required: 0 });
    }
    Ok(())
}

/// Memory requests: alignment, PH, byte enables and the 4 KiB rule.
#[inline(always)]
fn check_memory(
    kind: Kind,
    c: Common,
    req: Request,
    address: u64,
    ph: u8,
    length_dw: u16,
) -> Result<(), Error> {
    if address & 3 != 0 {
        return Err(Error::Misaligned { kind, address, align: 4 });
    }
    check_ph(kind, c.th(), ph)?;
    check_byte_enables(req.first_be, req.last_be, length_dw, address)?;
    // PCIe 6.0 §2.2.7: a memory request must not cross a 4 KiB boundary.
    if (address & 0xfff) + length_dw as u64 * 4 > 0x1000 {
        return Err(Error::Crosses4KiB { address, length_dw });
    }
    Ok(())
}

/// IO and configuration requests: PCIe 6.0 §2.2.7 fixes TC, Attr[1:0], AT, Length and
/// Last DW BE.
fn check_io_cfg(kind: Kind, c: Common, req: Request, address: u64, length_dw: usize) -> Result<(), Error> {
    if address & 3 != 0 {
        return Err(Error::Misaligned { kind, address, align: 4 });
    }
    let fixed = [
        ("TC", (c.0 >> 20) & 7, 0),
        ("Attr[1:0]", (c.0 >> 12) & 3, 0),
        ("AT", (c.0 >> 10) & 3, 0),
        ("TH", (c.0 >> 16) & 1, 0),
    ];
    for (field, found, required) in fixed {
        if found != required {
            return Err(Error::FieldNotAllowed { kind, field, found, required });
        }
    }
    if length_dw != 1 {
        return Err(Error::InvalidLength { kind, length_dw: length_dw as u16, allowed: &[1] });
    }
    if req.last_be != 0 {
        return Err(Error::LastBeNotZero { last_be: req.last_be });
    }
    Ok(())
}

/// AtomicOps: operand sizes and natural alignment (PCIe 6.0 §2.2.7, §6.15).
#[inline(always)]
fn check_atomic(
    kind: Kind,
    op: AtomicOp,
    c: Common,
    address: u64,
    ph: u8,
    length_dw: u16,
) -> Result<(), Error> {
    if !op.valid_lengths().contains(&length_dw) {
        return Err(Error::InvalidLength { kind, length_dw, allowed: op.valid_lengths() });
    }
    let align = op.operand_bytes(length_dw) as u64;
    if !address.is_multiple_of(align) {
        return Err(Error::Misaligned { kind, address, align });
    }
    check_ph(kind, c.th(), ph)
}

/// Completions with data: only SC carries data, and no more than the bytes still owed.
#[inline(always)]
fn check_completion(cpl: &Completion, data_len: Option<usize>) -> Result<(), Error> {
    if let Some(len) = data_len {
        if cpl.status != CplStatus::Success {
            return Err(Error::DataWithErrorStatus { status: cpl.status.name() });
        }
        if len > cpl.owed_bytes() {
            return Err(Error::CompletionTooLong {
                length_dw: (len / 4) as u16,
                byte_count: cpl.byte_count,
                lower_address: cpl.lower_address,
            });
        }
    }
    Ok(())
}

#[inline(always)]
fn check_register(register: u16) -> Result<(), Error> {
    if register > 0xffc || register & 3 != 0 {
        return Err(Error::FieldOverflow { field: "register", value: register as u64, max: 0xffc });
    }
    Ok(())
}

/// Byte-enable rules for memory requests (PCIe 6.0 §2.2.5).
#[inline(always)]
fn check_byte_enables(first_be: u8, last_be: u8, length_dw: u16, address: u64) -> Result<(), Error> {
    if length_dw == 1 {
        // Any First DW BE, including 0000b (a zero-length read or write).
        return if last_be != 0 { Err(Error::LastBeNotZero { last_be }) } else { Ok(()) };
    }
    if first_be == 0 {
        return Err(Error::FirstBeZero { length_dw });
    }
    if last_be == 0 {
        return Err(Error::LastBeZero { length_dw });
    }
    // Holes are allowed only in a QW-aligned 2 DW request; otherwise the enabled bytes must
    // run contiguously from the first enabled byte to the last.
    let qw_pair = length_dw == 2 && address & 7 == 0;
    let first_ok = matches!(first_be, 0b1111 | 0b1110 | 0b1100 | 0b1000);
    let last_ok = matches!(last_be, 0b0001 | 0b0011 | 0b0111 | 0b1111);
    if !(qw_pair || first_ok && last_ok) {
        return Err(Error::NonContiguousBe { first_be, last_be, length_dw, address });
    }
    Ok(())
}

struct Hex<'a>(&'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        for b in self.0.iter().take(SHOWN) {
            write!(f, "{b:02x}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "…(+{})", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

fn fmt_address(f: &mut fmt::Formatter<'_>, a: u64) -> fmt::Result {
    write!(f, "addr={:#010x}_{:08x}", a >> 32, a as u32)
}

/// One trace line, e.g. `MRd64 01:00.0 tag=0x012 addr=0x00000001_fee00000 len=1 be=f/0`.
impl fmt::Display for TlpRepr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.kind();
        let (requester, tag) = self.requester_tag();
        match self.body {
            Body::Completion { cpl, .. } => write!(
                f,
                "{kind} {} tag={tag} requester={requester} status={} bc={} la={:#04x}",
                cpl.completer,
                cpl.status.name(),
                cpl.byte_count,
                cpl.lower_address
            )?,
            _ => write!(f, "{kind} {requester} tag={tag}")?,
        }
        match self.body {
            Body::MemRead { address, .. } | Body::MemWrite { address, .. } | Body::Atomic { address, .. } => {
                f.write_str(" ")?;
                fmt_address(f, address.value())?;
            }
            Body::IoRead { address, .. } | Body::IoWrite { address, .. } => {
                f.write_str(" ")?;
                fmt_address(f, address as u64)?;
            }
            Body::CfgRead { cfg, .. } | Body::CfgWrite { cfg, .. } => {
                write!(f, " target={} reg={:#05x}", cfg.target, cfg.register)?;
            }
            Body::Message { msg, .. } => {
                write!(f, " route={} {}({:#04x})", msg.routing.name(), msg.code.name(), msg.code.code())?;
                match msg.routing {
                    MsgRouting::ByAddress => {
                        f.write_str(" ")?;
                        fmt_address(f, msg.address())?;
                    }
                    MsgRouting::ById => write!(f, " target={}", msg.target())?,
                    _ => {}
                }
                if msg.fields != [0; 8] && msg.routing != MsgRouting::ByAddress {
                    write!(f, " fields={}", Hex(&msg.fields))?;
                }
            }
            Body::Completion { .. } => {}
        }
        if let Some(len) = self.length_dw() {
            write!(f, " len={len}")?;
        }
        if let Some(req) = self.request() {
            write!(f, " be={:x}/{:x}", req.first_be, req.last_be)?;
        }
        if self.tc != 0 {
            write!(f, " tc={}", self.tc)?;
        }
        if self.attr.bits() != 0 {
            let names: [(bool, &str); 3] = [
                (self.attr.relaxed_ordering(), "RO"),
                (self.attr.no_snoop(), "NS"),
                (self.attr.id_based_ordering(), "IDO"),
            ];
            let mut sep = " attr=";
            for (_, n) in names.iter().filter(|(on, _)| *on) {
                write!(f, "{sep}{n}")?;
                sep = "|";
            }
        }
        match self.body {
            Body::MemRead { ph, .. } | Body::MemWrite { ph, .. } | Body::Atomic { ph, .. } if self.th => {
                write!(f, " th ph={ph}")?
            }
            _ if self.th => f.write_str(" th")?,
            _ => {}
        }
        if self.ln {
            f.write_str(" ln")?;
        }
        if self.at != AddressType::Untranslated {
            write!(f, " at={}", self.at.bits())?;
        }
        if self.ep {
            f.write_str(" EP")?;
        }
        if self.td {
            f.write_str(" ecrc")?;
        }
        for p in self.prefixes.iter() {
            write!(f, " [{p}]")?;
        }
        if let Some(d) = self.data() {
            write!(f, " data={}", Hex(d))?;
        }
        Ok(())
    }
}

/// A memory read's kind: locked or not, 32- or 64-bit address.
fn read_kind(locked: bool, is_64: bool) -> Kind {
    match (locked, is_64) {
        (false, false) => Kind::MRd32,
        (false, true) => Kind::MRd64,
        (true, false) => Kind::MRdLk32,
        (true, true) => Kind::MRdLk64,
    }
}

/// A configuration request's kind: a write or a read, type 1 or type 0.
fn cfg_kind(write: bool, type1: bool) -> Kind {
    match (write, type1) {
        (false, false) => Kind::CfgRd0,
        (false, true) => Kind::CfgRd1,
        (true, false) => Kind::CfgWr0,
        (true, true) => Kind::CfgWr1,
    }
}

/// An AtomicOp request's kind: its operation, 32- or 64-bit address.
fn atomic_kind(op: AtomicOp, is_64: bool) -> Kind {
    match (op, is_64) {
        (AtomicOp::FetchAdd, false) => Kind::FetchAdd32,
        (AtomicOp::FetchAdd, true) => Kind::FetchAdd64,
        (AtomicOp::Swap, false) => Kind::Swap32,
        (AtomicOp::Swap, true) => Kind::Swap64,
        (AtomicOp::Cas, false) => Kind::CAS32,
        (AtomicOp::Cas, true) => Kind::CAS64,
    }
}

/// A completion's kind: for a locked read or not, with data or without.
fn completion_kind(locked: bool, with_data: bool) -> Kind {
    match (locked, with_data) {
        (false, false) => Kind::Cpl,
        (false, true) => Kind::CplD,
        (true, false) => Kind::CplLk,
        (true, true) => Kind::CplDLk,
    }
}

/// A completion's Byte Count (1..=4096) and Lower Address (7 bits) fit their fields.
fn completion_fields_fit(cpl: &Completion) -> Result<(), Error> {
    if !(1..=4096).contains(&cpl.byte_count) {
        return Err(Error::FieldOverflow { field: "byte_count", value: cpl.byte_count as u64, max: 4096 });
    }
    if cpl.lower_address > 0x7f {
        return Err(Error::FieldOverflow {
            field: "lower_address",
            value: cpl.lower_address as u64,
            max: 0x7f,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The datapath's straight-line paths against the general ones: over TLPs near and
    //! across every rule's edge, `parse` and `emit` give what `parse_general` and
    //! `emit_general` give — the same value, the same bytes, the same error.
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;
    use proptest::sample::select;
    use proptest::strategy::ValueTree;

    use super::*;
    use crate::prefix::Prefix;

    /// Payload bytes for the generated TLPs (slices of it live for `'static`).
    static DATA: [u8; 4100] = {
        let mut d = [0u8; 4100];
        let mut i = 0;
        while i < d.len() {
            d[i] = (i * 37 + 11) as u8;
            i += 1;
        }
        d
    };

    /// Mostly one of the `usual` values, now and then one of the `edge` ones.
    fn mostly<T: Clone + core::fmt::Debug + 'static>(
        usual: Vec<T>,
        edge: Vec<T>,
    ) -> impl Strategy<Value = T> {
        prop_oneof![6 => select(usual), 1 => select(edge)]
    }

    fn request() -> impl Strategy<Value = Request> {
        let first_be = mostly(vec![0xfu8, 0xe, 0xc, 0x8], vec![0u8, 1, 3, 5, 7, 0x10]);
        let last_be = mostly(vec![0u8, 0xf, 1, 3, 7], vec![6u8, 0x10, 0x1f]);
        (any::<u16>(), 0u16..1024, first_be, last_be).prop_map(|(rid, tag, first_be, last_be)| Request {
            requester: Bdf::from_raw(rid),
            tag: Tag::from_bits(tag),
            first_be,
            last_be,
        })
    }

    fn address() -> impl Strategy<Value = Address> {
        let offset = mostly(vec![0u64, 4, 8, 0x800], vec![2u64, 0xff8, 0xffc, 0xffe]);
        (any::<bool>(), any::<u64>(), offset).prop_map(|(four_dw, high, offset)| {
            if four_dw {
                Address::Bits64(high & !0xfff | offset)
            } else {
                Address::Bits32((high as u32) & !0xfff | offset as u32)
            }
        })
    }

    fn ph() -> impl Strategy<Value = u8> {
        mostly(vec![0u8], vec![1u8, 3, 4])
    }

    fn data() -> impl Strategy<Value = &'static [u8]> {
        mostly(vec![4usize, 8, 12, 64, 256], vec![0usize, 2, 4096, 4100]).prop_map(|n| &DATA[..n])
    }

    fn completion() -> impl Strategy<Value = Completion> {
        (
            any::<u16>(),
            mostly(vec![0u8], vec![1u8, 2, 3, 4, 7]),
            any::<bool>(),
            mostly(vec![256u16, 4095, 4096], vec![0u16, 1, 4, 5, 8, 4097]),
            any::<u16>(),
            0u16..1024,
            select(vec![0u8, 1, 3, 4, 0x7f, 0x80]),
        )
            .prop_map(|(completer, status, bcm, byte_count, rid, tag, lower_address)| Completion {
                completer: Bdf::from_raw(completer),
                status: CplStatus::from_bits(status),
                bcm,
                byte_count,
                requester: Bdf::from_raw(rid),
                tag: Tag::from_bits(tag),
                lower_address,
            })
    }

    /// Mostly the datapath's kinds, some of the others, with fields in and out of range.
    fn body() -> impl Strategy<Value = Body<'static>> {
        prop_oneof![
            3 => (request(), address(), ph(), mostly(vec![1u16, 2, 3, 16], vec![0u16, 1024, 1025]), prop::bool::weighted(0.1))
                .prop_map(|(req, address, ph, length_dw, locked)| Body::MemRead { req, address, ph, length_dw, locked }),
            3 => (request(), address(), ph(), data())
                .prop_map(|(req, address, ph, data)| Body::MemWrite { req, address, ph, data }),
            3 => (completion(), prop::bool::weighted(0.1), prop::option::weighted(0.7, data()))
                .prop_map(|(cpl, locked, data)| Body::Completion { cpl, locked, data }),
            1 => (request(), any::<u16>(), 0u16..0x1000).prop_map(|(req, target, register)| Body::CfgRead {
                req,
                cfg: ConfigTarget { type1: false, target: Bdf::from_raw(target), register: register & !3 },
            }),
            1 => (request(), any::<u32>(), data()).prop_map(|(req, address, data)| Body::IoWrite { req, address, data }),
        ]
    }

    fn repr() -> impl Strategy<Value = TlpRepr<'static>> {
        (
            body(),
            mostly(vec![0u8, 1, 7], vec![8u8]),
            0u8..8,
            any::<bool>(),
            prop::bool::weighted(0.15),
            any::<bool>(),
            0u8..4,
            prop::bool::weighted(0.15),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(body, tc, attr, th, td, ep, at, prefixed, ln)| TlpRepr {
                ln,
                prefixes: if prefixed {
                    Prefixes::from_slice(&[Prefix::pasid(0x1234, false, false)]).unwrap()
                } else {
                    Prefixes::EMPTY
                },
                tc,
                attr: Attr::from_bits(attr),
                th,
                td,
                ep,
                at: AddressType::from_bits(at),
                body,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

        #[test]
        fn emit_writes_what_the_general_path_writes(repr in repr(), room in select(vec![0usize, 11, 12, 15, 16, 20, 8192])) {
            let mut fast = vec![0x5a; room.min(repr.buffer_len() + 8)];
            let mut general = fast.clone();
            prop_assert_eq!(repr.emit(&mut fast), repr.emit_general(&mut general));
            prop_assert_eq!(fast, general);
        }

        #[test]
        fn a_tlp_with_its_own_data_again_is_the_same_tlp(repr in repr()) {
            let data: Vec<u8> = repr.data().unwrap_or(&[]).to_vec();
            let kept = repr.with_data(&[]).with_data(&data);
            prop_assert_eq!(kept, repr);
            prop_assert_eq!(repr.with_data(&DATA[..8]).data().map(<[u8]>::len), repr.data().map(|_| 8));
        }

        #[test]
        fn parse_reads_what_the_general_path_reads(
            repr in repr(),
            flip in prop::option::weighted(0.5, any::<prop::sample::Index>()),
            max_payload in select(vec![128usize, 256, 4096]),
            check_ecrc in any::<bool>(),
        ) {
            let mut bytes = vec![0; repr.buffer_len()];
            let Ok(len) = repr.emit_general(&mut bytes) else { return Ok(()) };
            bytes.truncate(len);
            if let Some(bit) = flip {
                let bit = bit.index(len * 8);
                bytes[bit / 8] ^= 1 << (bit % 8);
            }
            let cfg = ParseConfig { max_payload, check_ecrc };
            if let Ok(packet) = TlpPacket::new_checked(&bytes[..]) {
                prop_assert_eq!(TlpRepr::parse(&packet, &cfg), TlpRepr::parse_general(&packet, &cfg));
            }
        }
    }

    /// The generators reach the straight-line paths: most datapath TLPs they make are
    /// valid, so the comparisons above are not all between two errors.
    #[test]
    fn generated_tlps_are_mostly_valid_datapath_tlps() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = repr();
        let (mut datapath, mut valid) = (0, 0);
        for _ in 0..2000 {
            let r = strategy.new_tree(&mut runner).unwrap().current();
            let common = r.prefixes.is_empty()
                && !r.td
                && matches!(
                    r.body,
                    Body::MemRead { locked: false, .. }
                        | Body::MemWrite { .. }
                        | Body::Completion { locked: false, .. }
                );
            if common {
                datapath += 1;
                valid += r.validate(4096).is_ok() as u32;
            }
        }
        assert!(valid * 4 > datapath, "{valid} of {datapath} generated datapath TLPs are valid");
    }
}
