//! Captures of the link: `dxpu loopback --capture` decoded by `dxpu tlp decode --pcap` with
//! every TLP the report counted, and by real `tshark` with the shipped Lua dissector, field
//! for field the same; `dxpu gpu --capture` and `dxpu host --capture` as daemons.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

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
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// One packet as both decoders see it: frame type, seq, ack, and each TLP's kind,
/// requester, tag, address and length ("-" where the TLP has none).
type Seen = (u64, String, u64, u64, Vec<[String; 5]>);

fn ours(lines: &[Value]) -> Vec<Seen> {
    let mut out: Vec<Seen> = Vec::new();
    for v in lines {
        if v.get("kind").is_some() {
            let t = |k: &str| match &v[k] {
                Value::Null => "-".to_string(),
                Value::String(s) => s.clone(),
                x => x.to_string(),
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

fn tshark(file: &Path) -> Option<Vec<Seen>> {
    let fields = [
        "frame.number",
        "dxpu.type_name",
        "dxpu.seq",
        "dxpu.ack",
        "dxpu.tlp.kind",
        "dxpu.tlp.requester",
        "dxpu.tlp.tag",
        "dxpu.tlp.address",
        "dxpu.tlp.length",
    ];
    let mut c = Command::new("tshark");
    c.arg("-X").arg(format!("lua_script:{}", dissector().display()));
    c.arg("-r").arg(file).args(["-Y", "dxpu", "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;"]);
    for f in fields {
        c.args(["-e", f]);
    }
    let out = match c.stderr(Stdio::piped()).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping the tshark comparison: tshark not found ({e}; Debian package tshark)");
            return None;
        }
    };
    assert!(out.status.success(), "tshark: {}", String::from_utf8_lossy(&out.stderr));
    let mut seen = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let list = |i: usize| -> Vec<String> {
            cols.get(i)
                .filter(|c| !c.is_empty())
                .map_or(Vec::new(), |c| c.split(';').map(str::to_string).collect())
        };
        let kinds = list(4);
        let (req, tag, addr, len) = (list(5), list(6), list(7), list(8));
        assert!(
            req.len() == kinds.len()
                && tag.len() == kinds.len()
                && addr.len() == kinds.len()
                && len.len() == kinds.len(),
            "tshark's TLP fields do not line up: {line}"
        );
        let tlps = (0..kinds.len())
            .map(|i| [kinds[i].clone(), req[i].clone(), tag[i].clone(), addr[i].clone(), len[i].clone()])
            .collect();
        seen.push((
            cols[0].parse().unwrap(),
            cols[1].to_string(),
            cols[2].parse().unwrap(),
            cols[3].parse().unwrap(),
            tlps,
        ));
    }
    Some(seen)
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

    let Some(theirs) = tshark(&file) else { return };
    let mine = ours(&lines);
    assert_eq!(theirs.len(), mine.len(), "tshark sees another number of dxpu frames");
    for (a, b) in mine.iter().zip(&theirs) {
        assert_eq!(a, b, "packet {}: dxpu tlp decode and tshark differ", a.0);
    }
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
