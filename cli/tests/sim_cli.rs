//! `dxpu sim dump-config` read back by pciutils' `lspci -vvv -F`: the header, every BAR and
//! every capability decode without complaint.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

fn dump(args: &[&str]) -> String {
    let out =
        Command::new(env!("CARGO_BIN_EXE_dxpu")).args(["sim", "dump-config"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn dump_is_4k_in_lspci_format() {
    let d = dump(&[]);
    let lines: Vec<&str> = d.lines().collect();
    assert!(lines[0].starts_with("01:00.0 "));
    assert_eq!(lines.iter().filter(|l| l.len() == 4 + 16 * 3).count(), 256);
    assert!(lines[1].starts_with("000: 34 12 a0 d9"), "vendor 1234, device d9a0: {}", lines[1]);
}

#[test]
fn lspci_decodes_header_bars_and_capabilities() {
    let Ok(probe) = Command::new("lspci").arg("--version").output() else {
        eprintln!("skipping: lspci (pciutils) is not installed");
        return;
    };
    assert!(probe.status.success());
    let dir = std::env::temp_dir().join(format!("dxpu-lspci-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("simgpu.dump");
    std::fs::write(&file, dump(&["--vram", "8G", "--vectors", "16"])).unwrap();
    let out = Command::new("lspci").args(["-vvv", "-F"]).arg(&file).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lspci failed: {err}");
    for want in [
        "3D controller: Device 1234:d9a0 (rev 01)",
        "Region 0: Memory at <unassigned> (64-bit, non-prefetchable)",
        "Region 2: Memory at <unassigned> (64-bit, prefetchable)",
        "Power Management version 3",
        "Express (v2) Endpoint",
        "10BitTagComp+ 10BitTagReq+",
        "MSI-X: Enable- Count=16 Masked-",
        "Vector table: BAR=0 offset=00008000",
        "PBA: BAR=0 offset=00009000",
        "Device Serial Number",
    ] {
        assert!(text.contains(want), "lspci output lacks {want:?}:\n{text}");
    }
    for bad in ["<BAD", "Unknown", "<?>", "#ff", "Capabilities: [?"] {
        assert!(!text.contains(bad), "lspci complains ({bad:?}):\n{text}");
    }
    // Only lspci's own environment may speak on stderr (no kernel modules here).
    assert!(err.lines().all(|l| l.contains("libkmod") || l.is_empty()), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_options_are_refused_with_the_value() {
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(["sim", "dump-config", "--vram", "12Q"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("12Q"));
    let out = Command::new(env!("CARGO_BIN_EXE_dxpu"))
        .args(["sim", "dump-config", "--vectors", "2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}
