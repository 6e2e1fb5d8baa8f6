//! Header field values with meaning: attributes, address type, completion status, message
//! routing and codes, AtomicOp kinds, and the TLP kind named by Fmt/Type.

use core::fmt;

/// The Attr field (PCIe 6.0 §2.2.6.3): bit 0 No Snoop, bit 1 Relaxed Ordering, bit 2
/// ID-Based Ordering. On the wire Attr\[1:0\] sit in DW0 byte 2 and Attr\[2\] in byte 1.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Attr(u8);

impl Attr {
    /// No Snoop.
    pub const NS: Attr = Attr(1);
    /// Relaxed Ordering.
    pub const RO: Attr = Attr(2);
    /// ID-Based Ordering.
    pub const IDO: Attr = Attr(4);

    /// Attributes from bits 2:0 of `bits` (higher bits are dropped).
    pub const fn from_bits(bits: u8) -> Self {
        Attr(bits & 7)
    }
    /// The three attribute bits.
    pub const fn bits(self) -> u8 {
        self.0
    }
    /// No Snoop is set.
    pub const fn no_snoop(self) -> bool {
        self.0 & 1 != 0
    }
    /// Relaxed Ordering is set.
    pub const fn relaxed_ordering(self) -> bool {
        self.0 & 2 != 0
    }
    /// ID-Based Ordering is set.
    pub const fn id_based_ordering(self) -> bool {
        self.0 & 4 != 0
    }
}

impl core::ops::BitOr for Attr {
    type Output = Attr;
    fn bitor(self, rhs: Attr) -> Attr {
        Attr(self.0 | rhs.0)
    }
}

impl fmt::Debug for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Attr(")?;
        let mut sep = "";
        for (bit, name) in [(1, "NS"), (2, "RO"), (4, "IDO")] {
            if self.0 & bit != 0 {
                write!(f, "{sep}{name}")?;
                sep = "|";
            }
        }
        write!(f, ")")
    }
}

/// The AT (Address Type) field of memory requests (PCIe 6.0 §2.2.4.1). All four encodings
/// round-trip; `Reserved` is 11b.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum AddressType {
    /// 00b: untranslated (or default, for non-memory TLPs).
    #[default]
    Untranslated,
    /// 01b: translation request (ATS).
    TranslationRequest,
    /// 10b: translated.
    Translated,
    /// 11b: reserved.
    Reserved,
}

impl AddressType {
    /// From the two-bit field.
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 3 {
            0 => AddressType::Untranslated,
            1 => AddressType::TranslationRequest,
            2 => AddressType::Translated,
            _ => AddressType::Reserved,
        }
    }
    /// The two-bit field.
    pub const fn bits(self) -> u8 {
        self as u8
    }
}

/// Completion Status (PCIe 6.0 §2.2.9). Reserved encodings round-trip through `Reserved`;
/// a requester treats them as UR.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CplStatus {
    /// 000b Successful Completion.
    Success,
    /// 001b Unsupported Request.
    UnsupportedRequest,
    /// 010b Configuration Request Retry Status.
    ConfigRetry,
    /// 100b Completer Abort.
    CompleterAbort,
    /// Any other (reserved) three-bit encoding.
    Reserved(u8),
}

impl CplStatus {
    /// From the three-bit field.
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 7 {
            0 => CplStatus::Success,
            1 => CplStatus::UnsupportedRequest,
            2 => CplStatus::ConfigRetry,
            4 => CplStatus::CompleterAbort,
            other => CplStatus::Reserved(other),
        }
    }
    /// The three-bit field.
    pub const fn bits(self) -> u8 {
        match self {
            CplStatus::Success => 0,
            CplStatus::UnsupportedRequest => 1,
            CplStatus::ConfigRetry => 2,
            CplStatus::CompleterAbort => 4,
            CplStatus::Reserved(b) => b & 7,
        }
    }
    /// The spec's abbreviation: SC, UR, CRS, CA, or `rsvdN`.
    pub fn name(self) -> &'static str {
        match self {
            CplStatus::Success => "SC",
            CplStatus::UnsupportedRequest => "UR",
            CplStatus::ConfigRetry => "CRS",
            CplStatus::CompleterAbort => "CA",
            CplStatus::Reserved(3) => "rsvd3",
            CplStatus::Reserved(5) => "rsvd5",
            CplStatus::Reserved(6) => "rsvd6",
            CplStatus::Reserved(_) => "rsvd7",
        }
    }
    /// Parses a name as printed by [`CplStatus::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "SC" => CplStatus::Success,
            "UR" => CplStatus::UnsupportedRequest,
            "CRS" => CplStatus::ConfigRetry,
            "CA" => CplStatus::CompleterAbort,
            "rsvd3" => CplStatus::Reserved(3),
            "rsvd5" => CplStatus::Reserved(5),
            "rsvd6" => CplStatus::Reserved(6),
            "rsvd7" => CplStatus::Reserved(7),
            _ => return None,
        })
    }
}

/// Message routing, the r\[2:0\] subfield of a Msg/MsgD Type (PCIe 6.0 §2.2.8, Table 2-20).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum MsgRouting {
    /// 000b routed to Root Complex.
    ToRootComplex,
    /// 001b routed by address (bytes 8..16 carry the address).
    ByAddress,
    /// 010b routed by ID (bytes 8..10 carry the target BDF).
    ById,
    /// 011b broadcast from Root Complex.
    Broadcast,
    /// 100b local, terminate at receiver.
    Local,
    /// 101b gathered and routed to Root Complex.
    Gathered,
    /// 110b or 111b: reserved, terminate at receiver.
    Reserved(u8),
}

impl MsgRouting {
    /// From the three-bit subfield.
    pub const fn from_bits(bits: u8) -> Self {
        match bits & 7 {
            0 => MsgRouting::ToRootComplex,
            1 => MsgRouting::ByAddress,
            2 => MsgRouting::ById,
            3 => MsgRouting::Broadcast,
            4 => MsgRouting::Local,
            5 => MsgRouting::Gathered,
            other => MsgRouting::Reserved(other),
        }
    }
    /// The three-bit subfield.
    pub const fn bits(self) -> u8 {
        match self {
            MsgRouting::ToRootComplex => 0,
            MsgRouting::ByAddress => 1,
            MsgRouting::ById => 2,
            MsgRouting::Broadcast => 3,
            MsgRouting::Local => 4,
            MsgRouting::Gathered => 5,
            MsgRouting::Reserved(b) => b & 7,
        }
    }
    /// A short name: `to_rc`, `address`, `id`, `broadcast`, `local`, `gathered`, `rsvd6`, `rsvd7`.
    pub fn name(self) -> &'static str {
        match self {
            MsgRouting::ToRootComplex => "to_rc",
            MsgRouting::ByAddress => "address",
            MsgRouting::ById => "id",
            MsgRouting::Broadcast => "broadcast",
            MsgRouting::Local => "local",
            MsgRouting::Gathered => "gathered",
            MsgRouting::Reserved(6) => "rsvd6",
            MsgRouting::Reserved(_) => "rsvd7",
        }
    }
    /// Parses a name as printed by [`MsgRouting::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        (0..8u8).map(MsgRouting::from_bits).find(|r| r.name() == name)
    }
}

macro_rules! message_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal; )*) => {
        /// A message code (PCIe 6.0 §2.2.8). Codes without a name here round-trip through
        /// `Unknown`.
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
        pub enum MessageCode {
            $( $(#[$doc])* $variant, )*
            /// A code this crate has no name for.
            Unknown(u8),
        }

        impl MessageCode {
            /// From the code byte.
            pub const fn from_code(code: u8) -> Self {
                match code {
                    $( $code => MessageCode::$variant, )*
                    other => MessageCode::Unknown(other),
                }
            }
            /// The code byte.
            pub const fn code(self) -> u8 {
                match self {
                    $( MessageCode::$variant => $code, )*
                    MessageCode::Unknown(c) => c,
                }
            }
            /// The spec's name, or `Unknown` for codes without one.
            pub const fn name(self) -> &'static str {
                match self {
                    $( MessageCode::$variant => $name, )*
                    MessageCode::Unknown(_) => "Unknown",
                }
            }
        }
    };
}

message_codes! {
    /// Unlock (broadcast), releases a locked sequence.
    Unlock = 0x00, "Unlock";
    /// ATS Invalidate Request.
    InvalidateRequest = 0x01, "Invalidate_Request";
    /// ATS Invalidate Completion.
    InvalidateCompletion = 0x02, "Invalidate_Completion";
    /// PRI Page Request.
    PageRequest = 0x04, "Page_Request";
    /// PRI PRG Response.
    PrgResponse = 0x05, "PRG_Response";
    /// Latency Tolerance Reporting.
    Ltr = 0x10, "LTR";
    /// Optimized Buffer Flush/Fill.
    Obff = 0x12, "OBFF";
    /// PM_Active_State_Nak.
    PmActiveStateNak = 0x14, "PM_Active_State_Nak";
    /// PM_PME.
    PmPme = 0x18, "PM_PME";
    /// PME_Turn_Off.
    PmeTurnOff = 0x19, "PME_Turn_Off";
    /// PME_TO_Ack.
    PmeToAck = 0x1b, "PME_TO_Ack";
    /// Assert_INTA.
    AssertIntA = 0x20, "Assert_INTA";
    /// Assert_INTB.
    AssertIntB = 0x21, "Assert_INTB";
    /// Assert_INTC.
    AssertIntC = 0x22, "Assert_INTC";
    /// Assert_INTD.
    AssertIntD = 0x23, "Assert_INTD";
    /// Deassert_INTA.
    DeassertIntA = 0x24, "Deassert_INTA";
    /// Deassert_INTB.
    DeassertIntB = 0x25, "Deassert_INTB";
    /// Deassert_INTC.
    DeassertIntC = 0x26, "Deassert_INTC";
    /// Deassert_INTD.
    DeassertIntD = 0x27, "Deassert_INTD";
    /// Correctable error.
    ErrCor = 0x30, "ERR_COR";
    /// Uncorrectable non-fatal error.
    ErrNonFatal = 0x31, "ERR_NONFATAL";
    /// Uncorrectable fatal error.
    ErrFatal = 0x33, "ERR_FATAL";
    /// Ignored message (formerly Attention_Indicator_Off).
    AttentionIndicatorOff = 0x40, "Attention_Indicator_Off";
    /// Ignored message (formerly Attention_Indicator_On).
    AttentionIndicatorOn = 0x41, "Attention_Indicator_On";
    /// Ignored message (formerly Attention_Indicator_Blink).
    AttentionIndicatorBlink = 0x43, "Attention_Indicator_Blink";
    /// Ignored message (formerly Power_Indicator_Off).
    PowerIndicatorOff = 0x44, "Power_Indicator_Off";
    /// Ignored message (formerly Power_Indicator_On).
    PowerIndicatorOn = 0x45, "Power_Indicator_On";
    /// Ignored message (formerly Power_Indicator_Blink).
    PowerIndicatorBlink = 0x47, "Power_Indicator_Blink";
    /// Ignored message (formerly Attention_Button_Pressed).
    AttentionButtonPressed = 0x48, "Attention_Button_Pressed";
    /// Set_Slot_Power_Limit (MsgD, 1 DW).
    SetSlotPowerLimit = 0x50, "Set_Slot_Power_Limit";
    /// Precision Time Measurement Request.
    PtmRequest = 0x52, "PTM_Request";
    /// Precision Time Measurement Response (Msg) / ResponseD (MsgD).
    PtmResponse = 0x53, "PTM_Response";
    /// Vendor_Defined Type 0 (unsupported ones are UR at the receiver).
    VendorDefinedType0 = 0x7e, "Vendor_Defined_Type_0";
    /// Vendor_Defined Type 1 (unsupported ones are silently discarded).
    VendorDefinedType1 = 0x7f, "Vendor_Defined_Type_1";
}

impl MessageCode {
    /// Parses a name as printed by [`MessageCode::name`] (not `Unknown`).
    pub fn from_name(name: &str) -> Option<Self> {
        (0..=255u8)
            .map(MessageCode::from_code)
            .find(|c| !matches!(c, MessageCode::Unknown(_)) && c.name() == name)
    }
}

/// The three AtomicOp requests (PCIe 6.0 §6.15).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AtomicOp {
    /// Fetch and Add: 32- or 64-bit operand.
    FetchAdd,
    /// Unconditional Swap: 32- or 64-bit operand.
    Swap,
    /// Compare and Swap: 32-, 64- or 128-bit operand (payload carries compare and swap values).
    Cas,
}

impl AtomicOp {
    /// The Type field value.
    pub const fn type_bits(self) -> u8 {
        match self {
            AtomicOp::FetchAdd => 0b01100,
            AtomicOp::Swap => 0b01101,
            AtomicOp::Cas => 0b01110,
        }
    }
    /// Payload lengths in DW the spec allows for this operation.
    pub const fn valid_lengths(self) -> &'static [u16] {
        match self {
            AtomicOp::FetchAdd | AtomicOp::Swap => &[1, 2],
            AtomicOp::Cas => &[2, 4, 8],
        }
    }
    /// Operand size in bytes for a payload of `length_dw` DWs (a CAS payload holds two
    /// operands). The target address must be naturally aligned to it.
    pub const fn operand_bytes(self, length_dw: u16) -> u16 {
        match self {
            AtomicOp::FetchAdd | AtomicOp::Swap => length_dw * 4,
            AtomicOp::Cas => length_dw * 2,
        }
    }
}

/// The flow-control class a TLP consumes credits in (PCIe 6.0 §2.6.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum FcClass {
    /// Posted requests: memory writes and messages.
    Posted,
    /// Non-posted requests: reads, IO and config requests, AtomicOps.
    NonPosted,
    /// Completions.
    Completion,
}

/// The credits a TLP consumes: one header credit, and one data credit per 4 DW (16 bytes)
/// of payload, rounded up (PCIe 6.0 §2.6.1).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Credits {
    /// Header credits.
    pub header: u16,
    /// Data credits (16 bytes each).
    pub data: u16,
}

/// The TLP kinds, named as `dxpu tlp decode` prints them. Each discriminant is the kind's
/// header byte 0 (Fmt in bits 7:5, Type in bits 4:0; messages with routing 000b), so Fmt's
/// "4 DW" and "with data" bits are bit tests on the discriminant.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)]
pub enum Kind {
    MRd32 = 0x00,
    MRd64 = 0x20,
    MRdLk32 = 0x01,
    MRdLk64 = 0x21,
    MWr32 = 0x40,
    MWr64 = 0x60,
    IORd = 0x02,
    IOWr = 0x42,
    CfgRd0 = 0x04,
    CfgRd1 = 0x05,
    CfgWr0 = 0x44,
    CfgWr1 = 0x45,
    Cpl = 0x0a,
    CplD = 0x4a,
    CplLk = 0x0b,
    CplDLk = 0x4b,
    FetchAdd32 = 0x4c,
    FetchAdd64 = 0x6c,
    Swap32 = 0x4d,
    Swap64 = 0x6d,
    CAS32 = 0x4e,
    CAS64 = 0x6e,
    Msg = 0x30,
    MsgD = 0x70,
}

impl Kind {
    /// Every kind, in the order of the spec's Table 2-3.
    pub const ALL: [Kind; 24] = [
        Kind::MRd32,
        Kind::MRd64,
        Kind::MRdLk32,
        Kind::MRdLk64,
        Kind::MWr32,
        Kind::MWr64,
        Kind::IORd,
        Kind::IOWr,
        Kind::CfgRd0,
        Kind::CfgRd1,
        Kind::CfgWr0,
        Kind::CfgWr1,
        Kind::Cpl,
        Kind::CplD,
        Kind::CplLk,
        Kind::CplDLk,
        Kind::FetchAdd32,
        Kind::FetchAdd64,
        Kind::Swap32,
        Kind::Swap64,
        Kind::CAS32,
        Kind::CAS64,
        Kind::Msg,
        Kind::MsgD,
    ];

    /// The name `dxpu tlp decode` prints.
    pub fn name(self) -> &'static str {
        match self {
            Kind::MRd32 => "MRd32",
            Kind::MRd64 => "MRd64",
            Kind::MRdLk32 => "MRdLk32",
            Kind::MRdLk64 => "MRdLk64",
            Kind::MWr32 => "MWr32",
            Kind::MWr64 => "MWr64",
            Kind::IORd => "IORd",
            Kind::IOWr => "IOWr",
            Kind::CfgRd0 => "CfgRd0",
            Kind::CfgRd1 => "CfgRd1",
            Kind::CfgWr0 => "CfgWr0",
            Kind::CfgWr1 => "CfgWr1",
            Kind::Cpl => "Cpl",
            Kind::CplD => "CplD",
            Kind::CplLk => "CplLk",
            Kind::CplDLk => "CplDLk",
            Kind::FetchAdd32 => "FetchAdd32",
            Kind::FetchAdd64 => "FetchAdd64",
            Kind::Swap32 => "Swap32",
            Kind::Swap64 => "Swap64",
            Kind::CAS32 => "CAS32",
            Kind::CAS64 => "CAS64",
            Kind::Msg => "Msg",
            Kind::MsgD => "MsgD",
        }
    }

    /// Parses a name as printed by [`Kind::name`].
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Decodes Fmt\[2:0\] and Type\[4:0\] (PCIe 6.0 §2.2.1.1, Table 2-3); `None` for reserved
    /// or prefix encodings.
    pub const fn from_fmt_type(fmt: u8, ty: u8) -> Option<Kind> {
        Some(match (fmt, ty) {
            (0b000, 0b00000) => Kind::MRd32,
            (0b001, 0b00000) => Kind::MRd64,
            (0b000, 0b00001) => Kind::MRdLk32,
            (0b001, 0b00001) => Kind::MRdLk64,
            (0b010, 0b00000) => Kind::MWr32,
            (0b011, 0b00000) => Kind::MWr64,
            (0b000, 0b00010) => Kind::IORd,
            (0b010, 0b00010) => Kind::IOWr,
            (0b000, 0b00100) => Kind::CfgRd0,
            (0b010, 0b00100) => Kind::CfgWr0,
            (0b000, 0b00101) => Kind::CfgRd1,
            (0b010, 0b00101) => Kind::CfgWr1,
            (0b001, 0b10000..=0b10111) => Kind::Msg,
            (0b011, 0b10000..=0b10111) => Kind::MsgD,
            (0b000, 0b01010) => Kind::Cpl,
            (0b010, 0b01010) => Kind::CplD,
            (0b000, 0b01011) => Kind::CplLk,
            (0b010, 0b01011) => Kind::CplDLk,
            (0b010, 0b01100) => Kind::FetchAdd32,
            (0b011, 0b01100) => Kind::FetchAdd64,
            (0b010, 0b01101) => Kind::Swap32,
            (0b011, 0b01101) => Kind::Swap64,
            (0b010, 0b01110) => Kind::CAS32,
            (0b011, 0b01110) => Kind::CAS64,
            _ => return None,
        })
    }

    /// [`Kind::from_fmt_type`] for every value of header byte 0 (Fmt in bits 7:5, Type in
    /// bits 4:0), so the hot path decodes a kind with one load.
    pub const BY_BYTE0: [Option<Kind>; 256] = {
        let mut table = [None; 256];
        let mut b = 0;
        while b < 256 {
            table[b] = Kind::from_fmt_type((b >> 5) as u8, (b & 0x1f) as u8);
            b += 1;
        }
        table
    };

    /// The flow-control class this kind consumes credits in.
    pub const fn fc_class(self) -> FcClass {
        match self {
            Kind::MWr32 | Kind::MWr64 | Kind::Msg | Kind::MsgD => FcClass::Posted,
            Kind::Cpl | Kind::CplD | Kind::CplLk | Kind::CplDLk => FcClass::Completion,
            _ => FcClass::NonPosted,
        }
    }

    /// Whether the header is 4 DW (64-bit address, or a message): Fmt\[0\].
    pub const fn is_4dw(self) -> bool {
        self as u8 & 0x20 != 0
    }

    /// Whether the TLP carries a data payload: Fmt\[1\].
    pub const fn has_data(self) -> bool {
        self as u8 & 0x40 != 0
    }

    /// A completion (Cpl, CplD, CplLk, CplDLk): Type 0101xb.
    pub const fn is_completion(self) -> bool {
        self as u8 & 0x1e == 0x0a
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fmt_type_decodes_consistently() {
        // Every legal encoding decodes to a kind whose header size and data presence agree
        // with Fmt, and every kind is reachable.
        let mut seen = std::collections::HashSet::new();
        for fmt in 0..8u8 {
            for ty in 0..32u8 {
                if let Some(k) = Kind::from_fmt_type(fmt, ty) {
                    assert_eq!(k.is_4dw(), fmt & 1 == 1, "{k} fmt={fmt:03b}");
                    assert_eq!(k.has_data(), fmt & 2 == 2, "{k} fmt={fmt:03b}");
                    seen.insert(k);
                }
            }
        }
        assert_eq!(seen.len(), Kind::ALL.len());
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn message_codes_round_trip() {
        for c in 0..=255u8 {
            let m = MessageCode::from_code(c);
            assert_eq!(m.code(), c);
            if !matches!(m, MessageCode::Unknown(_)) {
                assert_eq!(MessageCode::from_name(m.name()), Some(m));
            }
        }
        assert_eq!(MessageCode::from_code(0x33), MessageCode::ErrFatal);
        assert_eq!(MessageCode::from_code(0x1b), MessageCode::PmeToAck);
    }

    #[test]
    fn status_and_routing_round_trip() {
        for b in 0..8u8 {
            let s = CplStatus::from_bits(b);
            assert_eq!(s.bits(), b);
            assert_eq!(CplStatus::from_name(s.name()), Some(s));
            let r = MsgRouting::from_bits(b);
            assert_eq!(r.bits(), b);
            assert_eq!(MsgRouting::from_name(r.name()), Some(r));
        }
        for b in 0..4u8 {
            assert_eq!(AddressType::from_bits(b).bits(), b);
        }
    }
}
