//! What the package ships: unit files that `systemd-analyze verify` accepts, completions and
//! man pages generated from the command line, and docs/cli.md naming every subcommand
//! `dxpu --help` lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

fn dxpu() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dxpu"))
}

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn the_unit_files_pass_systemd_analyze_verify() {
    if Command::new("systemd-analyze").arg("--version").output().is_err() {
        eprintln!("skipping: systemd-analyze not found (Debian package systemd)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("dxpu-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for u in ["dxpu-gpu.service", "dxpu-host.service"] {
        let text = std::fs::read_to_string(repo().join("packaging").join(u)).unwrap();
        assert!(text.contains("Type=notify") && text.contains("ExecReload=/bin/kill -HUP $MAINPID"), "{u}");
        // Verified against the binary just built where the package puts /usr/bin/dxpu.
        let p = dir.join(u);
        std::fs::write(&p, text.replace("/usr/bin/dxpu", env!("CARGO_BIN_EXE_dxpu"))).unwrap();
        let out = Command::new("systemd-analyze").args(["verify", "--man=no"]).arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.trim().is_empty(), "systemd-analyze verify {u}: {err}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The methods offered to completion do not restrict what `dxpu ctl` sends: an unknown one
/// (a newer endpoint's) goes to the socket, and only the socket's absence is the error.
#[test]
fn ctl_passes_a_method_it_does_not_know() {
    let out = dxpu().args(["ctl", "--socket", "/nonexistent/dxpu.sock", "frobnicate"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dxpu.sock"));
}

#[test]
fn completions_and_man_pages_come_from_the_command_line() {
    for shell in ["bash", "zsh", "fish"] {
        let out = dxpu().args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(t.contains("loopback") && t.contains("ctl") && t.contains("keygen"), "{shell}");
        // The control methods complete after `dxpu ctl` (clap_complete's fish script
        // completes options only, no positional values).
        if shell != "fish" {
            assert!(t.contains("rpc_get_methods") && t.contains("unexport"), "{shell}: no ctl methods");
        }
    }
    let dir = std::env::temp_dir().join(format!("dxpu-man-{}", std::process::id()));
    assert!(dxpu().arg("man").arg(&dir).status().unwrap().success());
    for page in ["dxpu.1", "dxpu-gpu.1", "dxpu-host.1", "dxpu-ctl.1", "dxpu-tlp-decode.1", "dxpu-replay.1"] {
        let t = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(t.starts_with(".ie") || t.contains(".TH"), "{page} is no man page");
        for section in [".SH \"EXIT STATUS\"", ".SH EXAMPLES"] {
            assert!(t.contains(section), "{page} has no {section}");
        }
    }
    for page in ["dxpu-gpu.1", "dxpu-host.1", "dxpu-ctl.1"] {
        let t = std::fs::read_to_string(dir.join(page)).unwrap();
        assert!(t.contains(".SH FILES") && t.contains("/run/dxpu/"), "{page} has no FILES");
    }
    for page in ["gpu.toml.5", "host.toml.5"] {
        let t = std::fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(t.contains(".TH") && t.contains(".SH KEYS") && t.contains("[link]"), "{page}");
    }
    // man(1) reads every page without a warning, where it is installed.
    if let Ok(o) = Command::new("man").arg("--version").output()
        && o.status.success()
    {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let out = Command::new("man")
                .arg("--warnings")
                .arg("-l")
                .arg(&path)
                .env("MANWIDTH", "80")
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", path.display());
            // groff's own complaints (a locale message from man itself is no fault of the page).
            let stderr = String::from_utf8_lossy(&out.stderr);
            let warnings: Vec<&str> =
                stderr.lines().filter(|l| l.contains("warning") || l.contains("error")).collect();
            assert!(warnings.is_empty(), "{}: {warnings:?}", path.display());
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn docs_cli_names_every_subcommand_the_help_lists() {
    let help = String::from_utf8_lossy(&dxpu().arg("--help").output().unwrap().stdout).to_string();
    let doc = std::fs::read_to_string(repo().join("docs/cli.md")).unwrap();
    let mut listed = 0;
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            let Some(name) = line.split_whitespace().next() else { break };
            if !line.starts_with("  ") {
                break;
            }
            if name == "help" {
                continue;
            }
            listed += 1;
            assert!(doc.contains(&format!("dxpu {name}")), "docs/cli.md does not describe `dxpu {name}`");
        }
    }
    assert!(listed >= 12, "{help}");
}

#[test]
fn the_libvirt_domain_in_the_docs_validates_against_libvirts_schema() {
    let doc = std::fs::read_to_string(repo().join("docs/libvirt.md")).unwrap();
    let xml = doc.split("```xml\n").nth(1).and_then(|s| s.split("```").next()).expect("an xml block");
    assert!(xml.contains("vfio-user-pci") && xml.contains("<access mode='shared'/>"));
    let file = std::env::temp_dir().join(format!("dxpu-domain-{}.xml", std::process::id()));
    std::fs::write(&file, xml).unwrap();
    let out = match Command::new("virt-xml-validate").arg(&file).arg("domain").output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "skipping: virt-xml-validate not found ({e}; Debian packages libvirt-clients, libxml2-utils)"
            );
            return;
        }
    };
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
