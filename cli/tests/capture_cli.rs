//! Captures of the link: `dxpu loopback --capture` decoded by `dxpu tlp decode --pcap` with
//! every TLP the report counted, and by real `tshark` with the shipped Lua dissector, field
//! for field the same; `dxpu gpu --capture` and `dxpu host --capture` as daemons.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::conventional;

const KEY: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

/// Endpoint processes share two cores: one test at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dxpu-capture-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/wireshark/dxpu.lua")
}

/// `dxpu tlp decode --pcap FILE --frames`, one JSON value per line.
fn decode(file: &Path) -> Vec<Value> {
    let out = dxpu().args(["tlp", "decode", "--frames", "--pcap"]).arg(file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for l in &lines {
        conventional("tlp decode", l);
        // Frames and TLPs interleave: each line says which it is.
        let tlp = l.get("kind").is_some() || l.get("error").is_some();
        assert_eq!(l["line"], if tlp { "tlp" } else { "frame" }, "{l}");
        let at = if tlp { &l["capture"]["time_unix_us"] } else { &l["time_unix_us"] };
        assert!(at.as_u64().is_some_and(|us| us > 1_600_000_000_000_000), "{l}");
    }
    lines
}

/// One packet as both decoders see it: frame type, seq, ack, and each TLP's kind,
/// requester, tag, address and length (as decimal numbers; "-" where the TLP has none).
type Seen = (u64, String, u64, u64, Vec<[String; 5]>);

fn ours(lines: &[Value]) -> Vec<Seen> {
    let mut out: Vec<Seen> = Vec::new();
    for v in lines {
        if v.get("kind").is_some() {
            let t = |k: &str| match &v[k] {
                Value::String(s) if k == "kind" => s.clone(),
                x => number(x),
            };
            out.last_mut().unwrap().4.push([
                t("kind"),
                t("requester_id"),
                t("tag"),
                t("address"),
                t("length"),
            ]);
        } else {
            out.push((
                v["packet"].as_u64().unwrap(),
                v["frame"].as_str().unwrap().to_string(),
                v["seq"].as_u64().unwrap(),
                v["ack"].as_u64().unwrap(),
                Vec::new(),
            ));
        }
    }
    out
}

/// `tshark` with the shipped dissector on `file`, both passes (a request's `response_in`
/// is learned from its completion): each dxpu packet's layer as `-T json` gives it (each
/// TLP's fields kept together), or `None` where tshark is not installed.
fn tshark_json(file: &Path, filter: &str) -> Option<Vec<Value>> {
    let mut c = Command::new("tshark");
    c.arg("-X").arg(format!("lua_script:{}", dissector().display()));
    c.arg("-2").arg("-r").arg(file).args(["-Y", filter, "-T", "json", "--no-duplicate-keys"]);
    let out = match c.stderr(Stdio::piped()).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping the tshark comparison: tshark not found ({e}; Debian package tshark)");
            return None;
        }
    };
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let packets: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    Some(packets.into_iter().map(|p| p["_source"]["layers"].clone()).collect())
}

/// One value of tshark's JSON, or each of several (`--no-duplicate-keys` makes an array).
fn each(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(a) => a.iter().collect(),
        Value::Null => Vec::new(),
        x => vec![x],
    }
}

/// A number as either decoder prints it: decimal, `0x` hex, or a bus:device.function.
fn number(v: &Value) -> String {
    let s = match v {
        Value::String(s) => s.clone(),
        Value::Null => return "-".into(),
        x => x.to_string(),
    };
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).unwrap().to_string();
    }
    if let Some((bus, rest)) = s.split_once(':')
        && let Some((dev, func)) = rest.split_once('.')
    {
        let (b, d, f) = (
            u64::from_str_radix(bus, 16).unwrap(),
            u64::from_str_radix(dev, 16).unwrap(),
            func.parse::<u64>().unwrap(),
        );
        return (b << 8 | d << 3 | f).to_string();
    }
    s
}

fn tshark(file: &Path) -> Option<Vec<Seen>> {
    let layers = tshark_json(file, "dxpu")?;
    let mut seen = Vec::new();
    for l in layers {
        let d = &l["dxpu"];
        let tlps = each(&d["dxpu.tlp_tree"])
            .into_iter()
            .map(|t| {
                let field = |k: &str| number(&t[format!("dxpu.tlp.{k}")]);
                [
                    t["dxpu.tlp.kind"].as_str().unwrap().to_string(),
                    field("requester"),
                    field("tag"),
                    field("address"),
                    field("length"),
                ]
            })
            .collect();
        seen.push((
            l["frame"]["frame.number"].as_str().unwrap().parse().unwrap(),
            d["dxpu.type_name"].as_str().unwrap().to_string(),
            d["dxpu.seq"].as_str().unwrap().parse().unwrap(),
            d["dxpu.ack"].as_str().unwrap().parse().unwrap(),
            tlps,
        ));
    }
    Some(seen)
}

/// What [`loopback_passes`] gives: each pass's answer (none where tshark is missing).
type LoopbackPasses = (
    Option<Vec<Seen>>,
    Option<Vec<Value>>,
    Option<Vec<Value>>,
    Option<Vec<Value>>,
    std::io::Result<std::process::Output>,
);

/// tshark's passes over the loopback capture (each some seconds), all at once: every dxpu
/// packet; those with a TLP above 0x1000; a CplD of tag 5; the first copies (no
/// retransmission); the Info column of the MRd64s.
fn loopback_passes(file: &Path) -> LoopbackPasses {
    let mrd64_info = || {
        Command::new("tshark")
            .arg("-X")
            .arg(format!("lua_script:{}", dissector().display()))
            .arg("-r")
            .arg(file)
            .args(["-Y", "dxpu.tlp.kind == \"MRd64\"", "-T", "fields", "-e", "_ws.col.Info"])
            .output()
    };
    std::thread::scope(|s| {
        let all = s.spawn(|| tshark(file));
        let filtered = s.spawn(|| tshark_json(file, "dxpu.tlp.address > 0x1000"));
        let tag5 = s.spawn(|| tshark_json(file, "dxpu.tlp.tag == 5 && dxpu.tlp.kind == \"CplD\""));
        let first_copies = s.spawn(|| tshark_json(file, "dxpu && !dxpu.retransmission"));
        let info = s.spawn(mrd64_info);
        let done = "a tshark pass panicked (its message is above)";
        (
            all.join().expect(done),
            filtered.join().expect(done),
            tag5.join().expect(done),
            first_copies.join().expect(done),
            info.join().expect(done),
        )
    })
}

#[test]
fn a_loopback_capture_holds_every_tlp_the_report_counted_and_tshark_reads_it_the_same() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("loopback");
    let file = dir.join("loopback.pcapng");
    let out = dxpu()
        .args([
            "loopback",
            "--workload",
            "inference",
            "--scale",
            "1",
            "--repeat",
            "1",
            "--rtt-samples",
            "200",
            "--json",
            "--capture",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    conventional("loopback", &report);
    let cap = &report["capture"];
    assert_eq!(cap["dropped"], 0, "{cap}");
    let lines = decode(&file);
    let tlps: Vec<&Value> = lines.iter().filter(|v| v.get("kind").is_some()).collect();
    let count = |dir: &str| {
        tlps.iter().filter(|v| v["capture"]["direction"] == dir && v["capture"]["replay"] == false).count()
            as u64
    };
    assert_eq!(count("host->box"), cap["tlps_host_to_box"].as_u64().unwrap(), "{cap}");
    assert_eq!(count("box->host"), cap["tlps_box_to_host"].as_u64().unwrap(), "{cap}");
    assert!(count("host->box") > 1000, "{cap}");
    // Every frame the report's packets hold is a frame here.
    let frames = lines.iter().filter(|v| v.get("kind").is_none()).count() as u64;
    assert_eq!(frames, cap["packets"].as_u64().unwrap());
    // The kinds a bridged inference run must have carried.
    for k in ["CfgRd0", "MWr64", "MRd64", "CplD"] {
        assert!(tlps.iter().any(|v| v["kind"] == k), "no {k} in the capture");
    }
    // The trace format reads the same file.
    let text = dxpu().args(["tlp", "decode", "--format", "text", "--pcap"]).arg(&file).output().unwrap();
    let t = String::from_utf8_lossy(&text.stdout);
    assert_eq!(t.lines().count(), tlps.len());
    assert!(t.contains("host->box seq") && t.contains("CfgRd0"), "{}", &t[..t.len().min(500)]);
    // Its times in RFC 3339, UTC, to the microsecond (`2026-12-06T02:00:00.123456Z`).
    let when = t.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("");
    let frac = when.strip_suffix('Z').and_then(|w| w.split_once('.')).map(|(_, f)| f.len());
    assert!(when.len() == 27 && when.as_bytes()[10] == b'T' && frac == Some(6), "{when}");

    let (theirs, filtered, tag5, first_copies, info) = loopback_passes(&file);
    let Some(theirs) = theirs else { return };
    let mine = ours(&lines);
    assert_eq!(theirs.len(), mine.len(), "tshark sees another number of dxpu frames");
    for (a, b) in mine.iter().zip(&theirs) {
        assert_eq!(a, b, "packet {}: dxpu tlp decode and tshark differ", a.0);
    }

    // Typed fields: a numeric filter takes the packets with a TLP above the address, as
    // counted here, not those whose text sorts after it.
    let above: Vec<u64> = mine
        .iter()
        .filter(|p| p.4.iter().any(|t| t[3] != "-" && t[3].parse::<u64>().unwrap() > 0x1000))
        .map(|p| p.0)
        .collect();
    assert!(!above.is_empty() && above.len() < mine.len());
    let filtered = filtered.unwrap();
    let numbers: Vec<u64> =
        filtered.iter().map(|l| l["frame"]["frame.number"].as_str().unwrap().parse().unwrap()).collect();
    assert_eq!(numbers, above, "dxpu.tlp.address > 0x1000");
    assert!(!tag5.unwrap().is_empty());

    // Every completion finds its request, with a response time, and every non-posted
    // request its completion (a retransmitted frame's TLPs were matched in its first copy).
    let (mut completions, mut requests) = (0, 0);
    for l in first_copies.unwrap() {
        for t in each(&l["dxpu"]["dxpu.tlp_tree"]) {
            let kind = t["dxpu.tlp.kind"].as_str().unwrap();
            if kind.starts_with("Cpl") {
                completions += 1;
                let req: u64 = t["dxpu.tlp.request_in"].as_str().expect("request_in").parse().unwrap();
                let at: u64 = l["frame"]["frame.number"].as_str().unwrap().parse().unwrap();
                assert!(req < at, "a completion in {at} answers a request in {req}");
                let time: f64 = t["dxpu.tlp.time"].as_str().expect("time").parse().unwrap();
                assert!((0.0..5.0).contains(&time), "response time {time}");
            } else if kind.starts_with("MRd") || kind.starts_with("CfgRd") || kind.starts_with("CfgWr") {
                requests += 1;
                assert!(t.get("dxpu.tlp.response_in").is_some(), "{kind} without its completion: {t}");
            }
        }
    }
    assert!(completions > 1000 && requests > 1000, "{completions} completions, {requests} requests");

    // The Info column names each TLP with its address, length and tag.
    let info = info.unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    let first = info.lines().next().expect("an MRd64 in the capture");
    assert!(first.contains("MRd64 0x") && first.contains(" len ") && first.contains(" tag "), "{first}");
    let _ = std::fs::remove_dir_all(dir);
}

/// A lossy link's capture: the DATA frames sent again, the NAKs and the selective
/// acknowledgements, as `dxpu tlp decode` counts them, are what the dissector marks (a field
/// and expert info each; the ranges held).
#[test]
fn the_dissector_marks_the_retransmissions_and_naks_of_a_lossy_capture() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("lossy");
    let file = dir.join("lossy.pcapng");
    let out = dxpu()
        .args(["loopback", "--workload", "demo", "--scale", "1", "--repeat", "1", "--rtt-samples", "50"])
        .args(["--loss", "0.02", "--json", "--capture"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let frames: Vec<Value> = decode(&file).into_iter().filter(|v| v.get("kind").is_none()).collect();
    let replays = frames.iter().filter(|v| v["replay"] == true).count();
    let naks = frames.iter().filter(|v| v["nak"] == true).count();
    assert!(replays > 0 && naks > 0, "{replays} replays, {naks} NAKs at 2 % loss");
    let sacks = frames.iter().filter(|v| v.get("sack").is_some()).count();
    assert!(sacks > 0, "no selective acknowledgement at 2 % loss");
    for v in frames.iter().filter_map(|v| v.get("sack")) {
        for r in v.as_array().unwrap() {
            assert!(r["start"].as_u64() < r["end"].as_u64(), "{v}");
        }
    }
    // Each filter a tshark pass of its own, all at once: how many packets it takes.
    let filters = [
        "dxpu.retransmission",
        "dxpu.sack.start and (dxpu.type == 6 or dxpu.type == 7)",
        "dxpu.nak == 1",
        "dxpu.retransmission.expert",
        "dxpu.nak.expert",
    ];
    let taken: Vec<Option<usize>> = std::thread::scope(|s| {
        let passes: Vec<_> =
            filters.iter().map(|f| s.spawn(|| tshark_json(&file, f).map(|p| p.len()))).collect();
        passes.into_iter().map(|p| p.join().expect("a tshark pass panicked (its message is above)")).collect()
    });
    let Some(retransmitted) = taken[0] else { return };
    assert_eq!(retransmitted, replays);
    assert_eq!(taken[1], Some(sacks), "{}", filters[1]);
    assert_eq!(taken[2], Some(naks), "{}", filters[2]);
    assert_eq!(taken[3], Some(replays), "{}", filters[3]);
    assert_eq!(taken[4], Some(naks), "{}", filters[4]);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_daemons_capture_their_link_and_an_encrypted_session_shows_no_tlps() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempdir("daemons");
    let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gcfg = dir.join("gpu.toml");
    std::fs::write(
        &gcfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\n[link]\nencrypt_frames = true\n[[host]]\nname = \"h\"\nkey = \"{KEY}\"\n\
             [[device]]\nname = \"gpu0\"\nsim = {{ vram_mib = 256 }}\nallow = [\"h\"]\n"
        ),
    )
    .unwrap();
    let hcfg = dir.join("host.toml");
    std::fs::write(
        &hcfg,
        format!("[[attach]]\nserver = \"127.0.0.1:{port}\"\ndevice = \"gpu0\"\nkey = \"{KEY}\"\n"),
    )
    .unwrap();
    let (gfile, hfile) = (dir.join("gpu.pcapng"), dir.join("host.pcapng"));
    let glog = std::fs::File::create(dir.join("gpu.log")).unwrap();
    let mut gpu = dxpu()
        .args(["gpu", "--config"])
        .arg(&gcfg)
        .arg("--capture")
        .arg(&gfile)
        .stderr(glog)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = dxpu()
        .args(["host", "--workload", "--config"])
        .arg(&hcfg)
        .arg("--capture")
        .arg(&hfile)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    rustix::process::kill_process(rustix::process::Pid::from_child(&gpu), rustix::process::Signal::TERM)
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while gpu.try_wait().unwrap().is_none() {
        assert!(Instant::now() < end, "the box did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    for f in [&gfile, &hfile] {
        let lines = decode(f);
        let data: Vec<&Value> = lines.iter().filter(|v| v["frame"] == "DATA").collect();
        assert!(data.len() > 100, "{}: {} DATA frames", f.display(), data.len());
        assert!(
            data.iter().all(|v| v["encrypted"] == true),
            "{}: a DATA frame not marked encrypted",
            f.display()
        );
        assert!(lines.iter().all(|v| v.get("kind").is_none()), "TLPs decoded out of an encrypted session");
        assert!(
            data.iter().any(|v| v["direction"] == "host->box")
                && data.iter().any(|v| v["direction"] == "box->host")
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
