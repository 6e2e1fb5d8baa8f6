//! `dxpu tlp decode` / `encode` as a user runs them: JSON Lines out, errors on their own
//! line with a non-zero exit, and `decode | encode` reproducing the input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

mod common;
use common::conventional;

fn dxpu(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// One TLP of every kind, with prefixes, 10-bit tags, TH/PH, TD with ECRC, Length 1024
/// and Byte Count 4096 among them.
const CORPUS: &[&str] = &[
    "000000010100120f fee00000",
    "20dc3010 3a085aff 00000001 fee00000",
    "20000000 010000ff 00000002 00000000",
    "01000001 0000010f 000c0000",
    "21000002 000002ff 00000010 00000000",
    "40010001 0100000f f000100a deadbeef",
    "60000002 010007ff 00000010 00000100 01020304 05060708",
    "02000001 00000303 00000cf8",
    "42000001 00000401 00000080 000000aa",
    "04000001 0000050f 021c0104",
    "05000001 0000060f 01000ffc",
    "44000001 00000703 01000010 11223344",
    "45000001 0000080f 02080004 00000006",
    "4a000001 01000000 00001220 cafebabe",
    "0a000000 01003004 00001300",
    "0b000000 01000004 00000100",
    "4b000001 01000004 00000100 00000000",
    "4c000001 01000100 00001004 00000001",
    "6c000002 01000200 00000001 00000008 00000000 00000001",
    "4d000001 01000300 00002000 12345678",
    "6d000002 01000400 00000002 00000000 11111111 22222222",
    "4e000002 01000500 00003000 00000000 00000001",
    "6e000004 01000600 00000003 00000010 00000000 00000000 00000000 00000001",
    "34000000 01000020 00000000 00000000",
    "30000000 01000033 00000000 00000000",
    "32000000 0100007f 05001af4 00000001",
    "71000001 0100007e 00000001 00002000 01020304",
    "74000001 00000050 00000000 00000000 000000fa",
    "8e123456 91400042 00000001 0100010f 00001000",
    "20000001 0100000f 00000000 fee00000",
];

fn compact(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn decode_then_encode_reproduces_every_kind() {
    let input: String = CORPUS.iter().map(|l| format!("{l}\n")).collect();
    let dec = dxpu(&["tlp", "decode"], &input);
    assert!(dec.status.success(), "{}", String::from_utf8_lossy(&dec.stdout));
    let json = String::from_utf8(dec.stdout).unwrap();
    let lines: Vec<&str> = json.lines().collect();
    assert_eq!(lines.len(), CORPUS.len());
    let mut kinds = std::collections::BTreeSet::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        conventional("tlp decode", &v);
        kinds.insert(v["kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(kinds.len(), 24, "every kind appears: {kinds:?}");
    let enc = dxpu(&["tlp", "encode"], &json);
    assert!(enc.status.success(), "{}", String::from_utf8_lossy(&enc.stdout));
    let hex = String::from_utf8(enc.stdout).unwrap();
    let expected: Vec<String> = CORPUS.iter().map(|l| compact(l)).collect();
    assert_eq!(hex.lines().collect::<Vec<_>>(), expected);
}

#[test]
fn decode_fields_as_documented() {
    let out = dxpu(&["tlp", "decode", "20dc3010 3a085aff 00000001 fee00000"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["kind"], "MRd64");
    assert_eq!(v["fmt"], 1);
    assert_eq!(v["type"], 0);
    assert_eq!(v["tc"], 5);
    assert_eq!(v["attr"], 7);
    assert_eq!(v["length"], 16);
    assert_eq!(v["requester_id"], "3a:01.0");
    assert_eq!(v["tag"], 0x35a);
    assert_eq!(v["first_be"], 15);
    assert_eq!(v["last_be"], 15);
    assert_eq!(v["address"], "0x00000001fee00000");
    let out = dxpu(&["tlp", "decode", "4a000001 01000000 00001220 cafebabe"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "SC");
    assert_eq!(v["byte_count"], 4096);
    assert_eq!(v["lower_address"], 0x20);
    assert_eq!(v["completer_id"], "01:00.0");
    assert_eq!(v["data"], "cafebabe");
    let out = dxpu(&["tlp", "decode", "30000000 01000033 00000000 00000000"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["routing"], "to_rc");
    assert_eq!(v["message"]["name"], "ERR_FATAL");
    assert_eq!(v["message"]["code"], 0x33);
}

#[test]
fn errors_keep_their_line_and_fail_the_run() {
    let out = dxpu(
        &["tlp", "decode"],
        "000000010100120f fee00000\n00000002 010000ff 00001ffc\nzz\n\n000000010100120f fee00000\n",
    );
    assert!(!out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert!(lines[0].contains("\"MRd32\""));
    let e: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    let msg = e["error"].as_str().unwrap();
    assert!(msg.contains("0x1ffc") && msg.contains("4 KiB"), "{msg}");
    assert!(lines[2].contains("\"error\"") && lines[2].contains("'z'"));
    assert!(lines[3].contains("\"MRd32\""));
}

#[test]
fn text_format_is_a_trace_line() {
    let out = dxpu(&["tlp", "decode", "--format", "text", "200000010100120f00000001fee00000"], "");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "MRd64 01:00.0 tag=0x012 addr=0x00000001_fee00000 len=1 be=f/0"
    );
}

#[test]
fn encode_computes_ecrc_and_rejects_bad_input() {
    let out = dxpu(
        &[
            "tlp",
            "encode",
            r#"{"kind":"MWr32","requester_id":"01:00.0","address":"0xfee00000","data":"deadbeef","td":1}"#,
        ],
        "",
    );
    assert!(out.status.success());
    let hex = String::from_utf8(out.stdout).unwrap();
    let dec = dxpu(&["tlp", "decode", hex.trim()], "");
    assert!(dec.status.success());
    let v: serde_json::Value = serde_json::from_slice(&dec.stdout).unwrap();
    assert_eq!(v["td"], 1);
    assert!(v["ecrc"].as_str().unwrap().starts_with("0x"));
    let bad = dxpu(
        &[
            "tlp",
            "encode",
            r#"{"kind":"MRd32","requester_id":"00:00.0","address":"0x1000","tag":2000}"#,
            r#"{"kind":"Nope"}"#,
        ],
        "",
    );
    assert!(!bad.status.success());
    let text = String::from_utf8(bad.stdout).unwrap();
    assert!(text.lines().next().unwrap().contains("2000"), "{text}");
    assert!(text.lines().nth(1).unwrap().contains("Nope"), "{text}");
}

/// DW0 byte 1 bit 1 (LN in PCIe 3.x–5.0, reserved since 6.0) survives decode and encode:
/// shown as `ln` in JSON and in the trace, written back (it was dropped).
#[test]
fn the_ln_bit_round_trips() {
    // MWr32 of one DW and the same with LN set; a CplD with LN.
    for hex in ["4002000100000f0f0000100012345678", "4a0200010100000400010000deadbeef"] {
        let dec = dxpu(&["tlp", "decode"], &format!("{hex}\n"));
        assert!(dec.status.success(), "{}", String::from_utf8_lossy(&dec.stdout));
        let json = String::from_utf8(dec.stdout).unwrap();
        let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!(v["ln"], 1, "{json}");
        let enc = dxpu(&["tlp", "encode"], &json);
        assert_eq!(String::from_utf8(enc.stdout).unwrap().trim(), hex);
        let text = dxpu(&["tlp", "decode", "--format", "text"], &format!("{hex}\n"));
        assert!(String::from_utf8(text.stdout).unwrap().contains(" ln"));
    }
    // Without it, no `ln` key at all.
    let dec = dxpu(&["tlp", "decode"], "4000000100000f0f0000100012345678\n");
    let v: serde_json::Value = serde_json::from_str(String::from_utf8(dec.stdout).unwrap().trim()).unwrap();
    assert!(v.get("ln").is_none(), "{v}");
}

/// A Vendor ID prints as `0x` and four hex digits and reads back from that or a number; one
/// wider than 16 bits, or not a number, is refused with the key named.
#[test]
fn a_vendor_id_reads_as_hex_or_a_number_and_is_refused_past_16_bits() {
    let msg = |v: &str| {
        format!(
            "{{\"kind\":\"MsgD\",\"length\":1,\"requester_id\":\"01:00.0\",\"tag\":127,\"routing\":\"local\",\"message\":{{\"code\":127}},\"vendor_id\":{v},\"data\":\"deadbeef\"}}\n"
        )
    };
    let want = "7400000101007f7f00001af400000000deadbeef";
    for v in ["\"0x1af4\"", "6900", "\"6900\""] {
        let out = dxpu(&["tlp", "encode"], &msg(v));
        assert!(out.status.success(), "{v}: {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), want, "{v}");
    }
    let dec = dxpu(&["tlp", "decode", want], "");
    let v: serde_json::Value = serde_json::from_slice(&dec.stdout).unwrap();
    assert_eq!(v["vendor_id"], "0x1af4");
    for (v, says) in
        [("70000", "wider than 16 bits"), ("\"0x1ffff\"", "wider than 16 bits"), ("\"abc\"", "not a number")]
    {
        let out = dxpu(&["tlp", "encode"], &msg(v));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success() && text.contains("vendor_id") && text.contains(says), "{v}: {text}");
    }
}
