//! Byte-exact vectors for every TLP kind, written out by hand from the header layouts of
//! PCIe Base Specification 6.0 §2.2 (non-flit mode), not produced by this crate's emitter.
//! Each vector is parsed, checked field by field, and re-emitted to the same bytes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tlp::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace() && *c != '_').collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

/// Parses, checks that emit reproduces the bytes, and returns the value. The bytes are
/// leaked so the value can outlive a temporary vector (tests only).
fn roundtrip(bytes: &[u8]) -> TlpRepr<'static> {
    let bytes: &'static [u8] = Box::leak(bytes.to_vec().into_boxed_slice());
    let repr = TlpRepr::parse_bytes(bytes, &ParseConfig::default()).unwrap_or_else(|e| panic!("{e}"));
    let mut out = vec![0u8; repr.buffer_len()];
    assert_eq!(repr.emit(&mut out).unwrap(), bytes.len());
    assert_eq!(out, bytes, "re-emit of {repr}");
    repr
}

fn req(repr: &TlpRepr<'_>) -> Request {
    repr.request().unwrap()
}

#[test]
fn mrd32() {
    // Fmt 000 Type 00000 | TC0 | len 1 ; RID 01:00.0, tag 0x12, BE 0/f ; addr fee00000
    let b = hex("00000001 0100_12_0f fee00000");
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::MRd32);
    assert_eq!(
        req(&r),
        Request { requester: Bdf::new(1, 0, 0), tag: Tag::new(0x12).unwrap(), first_be: 0xf, last_be: 0 }
    );
    assert_eq!(r.address(), Some(0xfee0_0000));
    assert_eq!(r.length_dw(), Some(1));
    assert_eq!(r.fc_class(), FcClass::NonPosted);
    assert_eq!(r.to_string(), "MRd32 01:00.0 tag=0x012 addr=0x00000000_fee00000 len=1 be=f/0");
}

#[test]
fn mrd64_with_10bit_tag_and_all_attrs() {
    // Byte 1: T9=1, TC=5, T8=1, Attr[2]=1 (IDO), TH=0 -> 1_101_1_1_0_0 = 0xdc
    // Byte 2: TD=0 EP=0 Attr[1:0]=11 (RO, NS) AT=00 Length[9:8]=00 -> 0x30 ; Length 0x10
    let b = hex("20dc3010 3a08_5a_ff 00000001 fee00000");
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::MRd64);
    assert_eq!(r.tc, 5);
    assert_eq!(r.attr, Attr::NS | Attr::RO | Attr::IDO);
    assert_eq!(req(&r).tag.value(), 0x35a);
    assert_eq!(req(&r).requester.to_string(), "3a:01.0");
    assert_eq!(r.address(), Some(0x1_fee0_0000));
    assert_eq!(r.length_dw(), Some(16));
    assert_eq!(r.non_conformance(), None);
    assert_eq!(
        r.to_string(),
        "MRd64 3a:01.0 tag=0x35a addr=0x00000001_fee00000 len=16 be=f/f tc=5 attr=RO|NS|IDO"
    );
}

#[test]
fn mrd_length_1024_encoded_as_zero() {
    let b = hex("20000000 0100_00_ff 00000002 00000000");
    let r = roundtrip(&b);
    assert_eq!(r.length_dw(), Some(1024));
}

#[test]
fn mrdlk32_and_mrdlk64() {
    let r = roundtrip(&hex("01000001 0000_01_0f 000c0000"));
    assert_eq!(r.kind(), Kind::MRdLk32);
    let r = roundtrip(&hex("21000002 0000_02_ff 00000010 00000000"));
    assert_eq!(r.kind(), Kind::MRdLk64);
}

#[test]
fn mwr32_and_mwr64_with_th_ph() {
    // MWr32, TH=1 (byte 1 bit 0), PH=10b in address bits 1:0.
    let b = hex("40010001 0100_00_0f f000100a deadbeef");
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::MWr32);
    assert!(r.th);
    assert!(matches!(r.body, Body::MemWrite { ph: 2, .. }));
    assert_eq!(r.address(), Some(0xf000_1008));
    assert_eq!(r.data(), Some(&hex("deadbeef")[..]));
    assert_eq!(r.fc_class(), FcClass::Posted);
    assert_eq!(r.credits(), Credits { header: 1, data: 1 });
    // 256-byte MWr64.
    let mut b = hex("60000040 0100_07_ff 00000010 00000100");
    b.extend((0..=255u8).collect::<Vec<_>>());
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::MWr64);
    assert_eq!(r.credits(), Credits { header: 1, data: 16 });
}

#[test]
fn io_requests() {
    let r = roundtrip(&hex("02000001 0000_03_03 00000cf8"));
    assert_eq!(r.kind(), Kind::IORd);
    assert_eq!(r.address(), Some(0xcf8));
    let r = roundtrip(&hex("42000001 0000_04_01 00000080 000000aa"));
    assert_eq!(r.kind(), Kind::IOWr);
    assert_eq!(r.fc_class(), FcClass::NonPosted);
}

#[test]
fn config_requests_with_extended_register() {
    // CfgRd0 to 02:03.4, register 0x104: Ext Register 1 (byte 10 bits 3:0), Register 0x01
    // (byte 11 bits 7:2 -> 0x04).
    let b = hex("04000001 0000_05_0f 021c_0104");
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::CfgRd0);
    match r.body {
        Body::CfgRead { cfg, .. } => {
            assert_eq!(cfg.target, Bdf::new(2, 3, 4));
            assert_eq!(cfg.register, 0x104);
            assert!(!cfg.type1);
        }
        _ => unreachable!(),
    }
    assert_eq!(r.to_string(), "CfgRd0 00:00.0 tag=0x005 target=02:03.4 reg=0x104 len=1 be=f/0");
    // Highest register, 0xffc.
    let r = roundtrip(&hex("05000001 0000_06_0f 0100_0ffc"));
    assert_eq!(r.kind(), Kind::CfgRd1);
    let r = roundtrip(&hex("44000001 0000_07_03 0100_0010 11223344"));
    assert_eq!(r.kind(), Kind::CfgWr0);
    let r = roundtrip(&hex("45000001 0000_08_0f 0208_0004 00000006"));
    assert_eq!(r.kind(), Kind::CfgWr1);
}

#[test]
fn completions_all_statuses_and_byte_count_4096() {
    // CplD: completer 01:00.0, SC, BCM 0, Byte Count 0 (=4096); requester 00:00.0, tag 0x12,
    // lower address 0x20; 1 DW payload.
    let b = hex("4a000001 0100_0000 0000_12_20 cafebabe");
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::CplD);
    match r.body {
        Body::Completion { cpl, .. } => {
            assert_eq!(cpl.byte_count, 4096);
            assert_eq!(cpl.status, CplStatus::Success);
            assert_eq!(cpl.lower_address, 0x20);
            assert_eq!(cpl.completer, Bdf::new(1, 0, 0));
            assert_eq!(cpl.tag.value(), 0x12);
        }
        _ => unreachable!(),
    }
    assert_eq!(r.fc_class(), FcClass::Completion);
    // Cpl with UR (001b), BCM=1, byte count 4: 001_1_0000_0000_0100 = 0x3004.
    let r = roundtrip(&hex("0a000000 0100_3004 0000_13_00"));
    assert_eq!(r.kind(), Kind::Cpl);
    assert!(matches!(
        r.body,
        Body::Completion { cpl: Completion { status: CplStatus::UnsupportedRequest, bcm: true, .. }, .. }
    ));
    // CRS (010b), CA (100b), and a reserved status (011b) that round-trips.
    for (word, status) in [
        ("4004", CplStatus::ConfigRetry),
        ("8004", CplStatus::CompleterAbort),
        ("6004", CplStatus::Reserved(3)),
    ] {
        let r = roundtrip(&hex(&format!("0a000000 0100_{word} 0000_14_00")));
        assert!(matches!(r.body, Body::Completion { cpl: Completion { status: s, .. }, .. } if s == status));
    }
    // 10-bit tag on a completion: T9/T8 in DW0, Tag[7:0] in byte 10.
    let r = roundtrip(&hex("4a880001 0100_0004 0000_ff_00 00000001"));
    assert_eq!(r.requester_tag().1.value(), 0x3ff);
    // Locked completions.
    assert_eq!(roundtrip(&hex("0b000000 0100_0004 0000_01_00")).kind(), Kind::CplLk);
    assert_eq!(roundtrip(&hex("4b000001 0100_0004 0000_01_00 00000000")).kind(), Kind::CplDLk);
}

#[test]
fn atomics_every_operand_size() {
    // FetchAdd32, 32-bit operand, address 4-aligned.
    let r = roundtrip(&hex("4c000001 0100_01_00 00001004 00000001"));
    assert_eq!(r.kind(), Kind::FetchAdd32);
    // FetchAdd64 with 64-bit operand (8-aligned), 64-bit address.
    let r = roundtrip(&hex("6c000002 0100_02_00 00000001 00000008 00000000 00000001"));
    assert_eq!(r.kind(), Kind::FetchAdd64);
    let r = roundtrip(&hex("4d000001 0100_03_00 00002000 12345678"));
    assert_eq!(r.kind(), Kind::Swap32);
    let r = roundtrip(&hex("6d000002 0100_04_00 00000002 00000000 11111111 22222222"));
    assert_eq!(r.kind(), Kind::Swap64);
    // CAS with 32-bit operands (2 DW), 64-bit (4 DW) and 128-bit (8 DW, 16-byte aligned).
    let r = roundtrip(&hex("4e000002 0100_05_00 00003000 00000000 00000001"));
    assert_eq!(r.kind(), Kind::CAS32);
    let r = roundtrip(&hex("4e000004 0100_06_00 00003008 00000000 00000000 00000000 00000001"));
    assert_eq!(r.kind(), Kind::CAS32);
    let mut b = hex("6e000008 0100_07_00 00000003 00000010");
    b.extend([0u8; 32]);
    let r = roundtrip(&b);
    assert_eq!(r.kind(), Kind::CAS64);
    assert_eq!(r.fc_class(), FcClass::NonPosted);
    // 128-bit CAS at an 8-byte aligned address is misaligned.
    let mut bad = hex("6e000008 0100_07_00 00000003 00000008");
    bad.extend([0u8; 32]);
    assert!(matches!(
        TlpRepr::parse_bytes(&bad, &ParseConfig::default()),
        Err(Error::Misaligned { align: 16, .. })
    ));
}

#[test]
fn messages_every_routing_and_named_codes() {
    // Assert_INTA, local routing (100b): Type 10100.
    let r = roundtrip(&hex("34000000 0100_00_20 00000000 00000000"));
    assert_eq!(r.kind(), Kind::Msg);
    let Body::Message { msg, .. } = r.body else { unreachable!() };
    assert_eq!(msg.routing, MsgRouting::Local);
    assert_eq!(msg.code, MessageCode::AssertIntA);
    assert_eq!(r.to_string(), "Msg 01:00.0 tag=0x000 route=local Assert_INTA(0x20)");
    // ERR_FATAL to RC (000b).
    let r = roundtrip(&hex("30000000 0100_00_33 00000000 00000000"));
    let Body::Message { msg, .. } = r.body else { unreachable!() };
    assert_eq!((msg.routing, msg.code), (MsgRouting::ToRootComplex, MessageCode::ErrFatal));
    // PME_TO_Ack gathered (101b), Unlock broadcast (011b), PME_Turn_Off broadcast.
    for (t, code, routing, name) in [
        ("35", "1b", MsgRouting::Gathered, "PME_TO_Ack"),
        ("33", "00", MsgRouting::Broadcast, "Unlock"),
        ("33", "19", MsgRouting::Broadcast, "PME_Turn_Off"),
        ("30", "18", MsgRouting::ToRootComplex, "PM_PME"),
        ("30", "30", MsgRouting::ToRootComplex, "ERR_COR"),
        ("30", "31", MsgRouting::ToRootComplex, "ERR_NONFATAL"),
        ("34", "14", MsgRouting::Local, "PM_Active_State_Nak"),
        ("34", "52", MsgRouting::Local, "PTM_Request"),
        ("33", "12", MsgRouting::Broadcast, "OBFF"),
        ("36", "99", MsgRouting::Reserved(6), "Unknown"),
    ] {
        let r = roundtrip(&hex(&format!("{t}000000 0100_00_{code} 00000000 00000000")));
        let Body::Message { msg, .. } = r.body else { unreachable!() };
        assert_eq!(msg.routing, routing);
        assert_eq!(msg.code.name(), name);
    }
    // LTR to RC carries its latencies in bytes 12..16.
    let r = roundtrip(&hex("30000000 0100_00_10 00000000 88018802"));
    let Body::Message { msg, .. } = r.body else { unreachable!() };
    assert_eq!(msg.code, MessageCode::Ltr);
    assert_eq!(msg.fields, [0, 0, 0, 0, 0x88, 0x01, 0x88, 0x02]);
    // Vendor_Defined Type 1 routed by ID: target 05:00.0, vendor 0x1af4.
    let r = roundtrip(&hex("32000000 0100_00_7f 0500_1af4 00000001"));
    let Body::Message { msg, .. } = r.body else { unreachable!() };
    assert_eq!(msg.target(), Bdf::new(5, 0, 0));
    assert_eq!(msg.vendor_id(), 0x1af4);
    // Vendor_Defined Type 0 routed by address with data.
    let r = roundtrip(&hex("71000001 0100_00_7e 00000001 00002000 01020304"));
    assert_eq!(r.kind(), Kind::MsgD);
    assert_eq!(r.address(), Some(0x1_0000_2000));
    // Set_Slot_Power_Limit, MsgD local with 1 DW.
    let r = roundtrip(&hex("74000001 0000_00_50 00000000 00000000 000000fa"));
    let Body::Message { msg, .. } = r.body else { unreachable!() };
    assert_eq!(msg.code, MessageCode::SetSlotPowerLimit);
}

#[test]
fn prefixes_local_and_end_to_end() {
    // Local vendor prefix, then PASID 0x00042 with Execute Requested, then an MRd32.
    let b = hex("8e123456 91400042 00000001 0100_01_0f 00001000");
    let r = roundtrip(&b);
    let p: Vec<_> = r.prefixes.iter().collect();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].kind(), PrefixKind::VendorLocal0);
    assert_eq!(p[1].kind(), PrefixKind::Pasid);
    assert_eq!(p[1].pasid_value(), Some(0x42));
    assert!(p[1].execute());
    // Unknown end-to-end prefix type round-trips.
    let r = roundtrip(&hex("95abcdef 00000001 0100_01_0f 00001000"));
    assert!(matches!(
        r.prefixes.iter().next().unwrap().kind(),
        PrefixKind::Unknown { end_to_end: true, subtype: 5 }
    ));
}

#[test]
fn ecrc_on_emit_and_parse() {
    // MWr32 with TD=1. The digest is computed here independently (CRC-32 of the header with
    // Type[0] and EP forced to 1, then payload), stored as the spec maps it.
    let mut b = hex("40008001 0100_00_0f fee00000 deadbeef");
    let mut masked = b.clone();
    masked[0] |= 1;
    masked[2] |= 0x40;
    let crc = crc32_reflected(&masked);
    b.extend(crc.to_le_bytes());
    let r = roundtrip(&b);
    assert!(r.td);
    // Any flipped bit outside the variant fields is caught.
    let mut bad = b.clone();
    bad[13] ^= 0x10;
    assert!(matches!(TlpRepr::parse_bytes(&bad, &ParseConfig::default()), Err(Error::EcrcMismatch { .. })));
    // Setting EP (a variant bit) keeps the digest valid.
    let mut poisoned = b.clone();
    poisoned[2] |= 0x40;
    assert!(TlpRepr::parse_bytes(&poisoned, &ParseConfig::default()).unwrap().ep);
    // With checking off the bad digest is accepted.
    let lax = ParseConfig { check_ecrc: false, ..ParseConfig::default() };
    assert!(TlpRepr::parse_bytes(&bad, &lax).is_ok());
}

/// Bitwise reflected CRC-32 (poly EDB88320h), written out here so the test does not rely on
/// the crate under test.
fn crc32_reflected(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 { (c >> 1) ^ 0xedb8_8320 } else { c >> 1 };
        }
    }
    !c
}

#[test]
fn four_dw_below_4gib_is_accepted_and_flagged() {
    let r = roundtrip(&hex("20000001 0100_00_0f 00000000 fee00000"));
    assert_eq!(r.kind(), Kind::MRd64);
    assert_eq!(r.non_conformance(), Some(NonConformance::FourDwAddressBelow4GiB));
}

fn parse_err(s: &str) -> Error {
    TlpRepr::parse_bytes(&hex(s), &ParseConfig::default()).unwrap_err()
}

#[test]
fn malformed_cases_each_have_their_error() {
    // Length says 2 DW of payload, 1 present.
    assert!(matches!(
        parse_err("40000002 0100_00_ff 00001000 00000000"),
        Error::LengthMismatch { length_dw: 2, .. }
    ));
    // Payload on a read.
    assert!(matches!(
        parse_err("00000001 0100_00_0f 00001000 00000000"),
        Error::UnexpectedPayload { kind: Kind::MRd32, extra: 4 }
    ));
    // Truncated header.
    assert!(matches!(parse_err("00000001 0100_00_0f"), Error::Truncated { needed: 12, actual: 8 }));
    // Reserved Fmt/Type: Fmt 010 Type 00001 (MRdLk with data), and Fmt 101.
    assert!(matches!(
        parse_err("41000001 0100_00_0f 00001000 00000000"),
        Error::ReservedFmtType { fmt: 2, ty: 1 }
    ));
    assert!(matches!(parse_err("a0000001 0100_00_0f 00001000"), Error::ReservedFmtType { fmt: 5, ty: 0 }));
    // Length 1 with Last BE != 0.
    assert!(matches!(parse_err("00000001 0100_00_ff 00001000"), Error::LastBeNotZero { last_be: 0xf }));
    // Length > 1 with Last BE = 0, and with First BE = 0.
    assert!(matches!(parse_err("00000002 0100_00_0f 00001000"), Error::LastBeZero { length_dw: 2 }));
    assert!(matches!(parse_err("00000002 0100_00_f0 00001000"), Error::FirstBeZero { length_dw: 2 }));
    // Non-contiguous BEs: allowed for a QW-aligned 2 DW request, not at 3 DW or unaligned.
    assert!(TlpRepr::parse_bytes(&hex("00000002 0100_00_a5 00001000"), &ParseConfig::default()).is_ok());
    assert!(matches!(parse_err("00000002 0100_00_a5 00001004"), Error::NonContiguousBe { .. }));
    assert!(matches!(parse_err("00000003 0100_00_f1 00001000"), Error::NonContiguousBe { .. }));
    // Crossing 4 KiB: 2 DW at 0x1ffc.
    assert!(matches!(
        parse_err("00000002 0100_00_ff 00001ffc"),
        Error::Crosses4KiB { address: 0x1ffc, length_dw: 2 }
    ));
    // Config request with TC != 0, and with Length 2.
    assert!(matches!(parse_err("04100001 0000_05_0f 0100_0000"), Error::FieldNotAllowed { field: "TC", .. }));
    assert!(matches!(
        parse_err("04000002 0000_05_0f 0100_0000"),
        Error::InvalidLength { kind: Kind::CfgRd0, .. }
    ));
    // AtomicOp of 3 DW.
    assert!(matches!(
        parse_err("4c000003 0100_01_00 00001000 00000000 00000000 00000000"),
        Error::InvalidLength { kind: Kind::FetchAdd32, length_dw: 3, .. }
    ));
    // CplD with UR status.
    assert!(matches!(
        parse_err("4a000001 0100_2004 0000_12_00 00000000"),
        Error::DataWithErrorStatus { status: "UR" }
    ));
    // CplD longer than its Byte Count allows.
    assert!(matches!(
        parse_err("4a000002 0100_0004 0000_12_00 00000000 00000000"),
        Error::CompletionTooLong { .. }
    ));
    // PH without TH.
    assert!(TlpRepr::parse_bytes(&hex("00000001 0100_00_0f 00001002"), &ParseConfig::default()).is_ok());
    // Too many end-to-end prefixes, and a local prefix after an end-to-end one.
    assert!(matches!(
        parse_err("91000000 91000000 91000000 91000000 91000000 00000001 0100_00_0f 00001000"),
        Error::TooManyPrefixes { count: 5, max: 4 }
    ));
    assert!(matches!(
        parse_err("91000000 8e000000 00000001 0100_00_0f 00001000"),
        Error::LocalPrefixAfterEndToEnd { .. }
    ));
    // Prefix with nothing after it.
    assert!(matches!(parse_err("91000000"), Error::Truncated { .. }));
    // Empty input.
    assert!(matches!(parse_err(""), Error::Truncated { needed: 4, actual: 0 }));
}

#[test]
fn max_payload_size_is_enforced() {
    let mut b = hex("40000040 0100_00_ff 00001000");
    b.extend([0u8; 256]);
    let cfg = ParseConfig { max_payload: 128, ..ParseConfig::default() };
    assert!(matches!(
        TlpRepr::parse_bytes(&b, &cfg),
        Err(Error::PayloadExceedsMps { bytes: 256, max_payload: 128 })
    ));
    assert!(TlpRepr::parse_bytes(&b, &ParseConfig::default()).is_ok());
}

#[test]
fn error_messages_name_field_and_value() {
    let e = parse_err("00000002 0100_00_ff 00001ffc").to_string();
    assert!(e.contains("0x1ffc") && e.contains("4 KiB"), "{e}");
    let e = parse_err("04100001 0000_05_0f 0100_0000").to_string();
    assert!(e.contains("TC") && e.contains("CfgRd0"), "{e}");
}
