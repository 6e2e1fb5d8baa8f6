//! What the package ships: unit files that `systemd-analyze verify` accepts, completions and
//! man pages generated from the command line, and docs/cli.md naming every subcommand
//! `dxpu --help` lists.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

mod common;

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
        // A reload returns the running endpoint's answer, through its control socket.
        assert!(text.contains("Type=notify") && text.contains("ctl --socket /run/dxpu/"), "{u}");
        assert!(text.contains("reload\n") && !text.contains("kill -HUP"), "{u}");
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

/// Every command with `--json`, and where its output is checked against docs/cli.md's *Output
/// conventions* (`common::conventional`): a command that gains `--json` fails here until a
/// test checks what it prints. `tlp decode` (JSON always), `bench model`'s `model.json` and
/// the endpoints' JSON log lines are checked too (`tlp_cli.rs`, `bench_cli.rs`, `ops_cli.rs`).
const JSON_CHECKED: &[(&str, &str)] = &[
    ("loopback", "endpoints_cli.rs"),
    ("model", "model_cli.rs"),
    ("replay", "model_cli.rs"),
    ("ctl", "common/mod.rs"),
    ("pool ls", "pool_cli.rs"),
    ("pool watch", "pool_cli.rs"),
    ("bench link", "bench_cli.rs"),
    ("bench bridge", "bench_cli.rs"),
    ("bench pool", "bench_cli.rs"),
    ("bench chaos", "bench_cli.rs"),
    ("bench simgpu", "bench_cli.rs"),
    ("bench vfio-user", "bench_cli.rs"),
];

/// The subcommands (paths such as `["bench", "link"]`) whose help offers `--json`.
fn json_commands(path: &[String], found: &mut Vec<String>) {
    let out = dxpu().args(path).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    if help.lines().any(|l| l.trim_start().starts_with("--json")) {
        found.push(path.join(" "));
    }
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
        } else if in_commands && line.starts_with("  ") {
            match line.split_whitespace().next() {
                Some("help") | None => {}
                Some(name) if !line.starts_with("   ") => {
                    json_commands(&[path, &[name.to_string()]].concat(), found)
                }
                Some(_) => {}
            }
        } else {
            in_commands = false;
        }
    }
}

#[test]
fn the_convention_check_finds_each_kind_of_break() {
    use serde_json::json;
    let breaks =
        |v: serde_json::Value| std::panic::catch_unwind(|| common::conventional("test", &v)).is_err();
    let good = json!({
        "direct_seconds": 1.5, "runs": 3, "rtt_us": 7.5, "vendor_id": "0x1af4", "class": "0x030200",
        "session": "0x0000beef", "since_unix_seconds": 1_800_000_000, "tlps": {"MRd64": 4}, "aead_ns": {"64": 1.5},
        "rtt_samples": 5, "loss_ratio": 0.01, "tlps_per_datagram": 1.5, "items": [{"h2d_bytes_per_s": 1e9}],
        "register_reads": u64::MAX, "lease": "694d8b1c2f3e4a55",
        "overhead_percent": 1.0, "overhead_percent_min": 0.5, "overhead_percent_max": 2.0,
        "rtt_p50_le_us": 16, "mmio_read_p99_le_ns": 1024, "mmio_read_rtt_p50_us": 7.5, "mmio_read_rtt_p99_us": 9.0,
        "box_id": "01:00.0", "pci_address": "0000:41:00.0", "requester_id": "00:00.0", "time_unix_us": 1_800_000_000_123_456u64,
        "h2d_bytes_per_s": 8412345680.0, "ratio_of_x_ratio": 0.333333333, "names": ["01:00.0"],
    });
    assert!(!breaks(good));
    for bad in [
        json!({"seconds_direct": 1, "direct": 1.5}),
        json!({"DirectSeconds": 1}),
        json!({"delay": 10}),
        json!({"vendor_id": 6900}),
        json!({"vendor_id": "0x1AF4"}),
        json!({"device_id": "1af4"}),
        json!({"session": "0xbeef"}),
        json!({"since_unix_seconds": 12.0}),
        json!({"items": [{"loss": 0.5}]}),
        json!({"lease": 7_587_888_889_962_134_533u64}),
        // One shape of spread, the job's time in one unit.
        json!({"job_seconds": {"median": 1.0, "min": 0.5, "max": 2.0}}),
        json!({"overhead_percent_min": 0.5, "overhead_percent_max": 2.0}),
        json!({"direct_ms": 1.5}),
        json!({"mmio_read_p50_ns": 512}),
        // Percentiles flat, fractions without noise, whole times of day, one key per address.
        json!({"mmio_read_rtt_us": {"p50": 7.5, "p99": 9.0}}),
        json!({"ratio_x_ratio": 2.3329999999999997}),
        json!({"since_unix_seconds": 1_800_000_000.5}),
        json!({"time_unix_us": 1.8e15}),
        json!({"id": "01:00.0"}),
        json!({"bdf": "0000:41:00.0"}),
        json!({"pci_bus_id": "00000000:41:00.0"}),
    ] {
        assert!(breaks(bad.clone()), "{bad} passed");
    }
}

#[test]
fn every_json_command_is_checked_against_the_output_conventions() {
    let mut found = Vec::new();
    json_commands(&[], &mut found);
    found.sort();
    let mut checked: Vec<String> = JSON_CHECKED.iter().map(|(c, _)| c.to_string()).collect();
    checked.sort();
    assert_eq!(
        found, checked,
        "commands with --json (left) against those whose output a test checks (right)"
    );
    for (cmd, file) in JSON_CHECKED {
        let text = std::fs::read_to_string(repo().join("cli/tests").join(file)).unwrap();
        let word = cmd.rsplit(' ').next().unwrap_or(cmd);
        assert!(
            text.contains("conventional(") && text.contains(&format!("\"{word}\"")),
            "cli/tests/{file} does not check `dxpu {cmd} --json` with common::conventional"
        );
    }
    let doc = std::fs::read_to_string(repo().join("docs/cli.md")).unwrap();
    assert!(doc.contains("## Output conventions"), "docs/cli.md lost its conventions");
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

/// `dxpu --version` names the commit it was built from: HEAD's, here (a git checkout).
#[test]
fn the_version_names_the_commit() {
    let out = dxpu().arg("--version").output().unwrap();
    let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).current_dir(repo()).output();
    let commit = match head {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => "unknown".to_string(),
    };
    assert_eq!(v, format!("dxpu {} (commit {commit})", env!("CARGO_PKG_VERSION")));
}

/// Every error docs/troubleshooting.md quotes (its tables' first column, in backquotes) is
/// what the code says: each stretch of it between the page's example values (an address, a
/// device or host name, `…`) is found in the sources' string literals.
#[test]
fn the_troubleshooting_page_quotes_the_errors_as_the_code_says_them() {
    let page = std::fs::read_to_string(repo().join("docs/troubleshooting.md")).unwrap();
    let mut sources = String::new();
    for dir in ["ops/src", "bridge-host/src", "bridge-gpu/src", "link/src", "pool/src", "cli/src", "hw/src"] {
        collect(&repo().join(dir), &mut sources);
    }
    // String literals continued over lines (`\` at a line's end) read as one line.
    let mut joined = String::new();
    let mut lines = sources.lines().peekable();
    while let Some(l) = lines.next() {
        match l.strip_suffix('\\') {
            Some(head) => {
                joined.push_str(head);
                if let Some(next) = lines.peek_mut() {
                    *next = next.trim_start();
                }
            }
            None => {
                joined.push_str(l);
                joined.push('\n');
            }
        }
    }
    let mut quoted = 0;
    let mut missing = Vec::new();
    for line in page.lines().filter(|l| l.starts_with("| `")) {
        let Some(text) = line[3..].split('`').next() else { continue };
        let mut rest = text.to_string();
        for example in ["10.0.0.7:7440", "gpu0", "host-a", "host-b", "5s", " N ", "…"] {
            rest = rest.replace(example, "\u{0}");
        }
        // Each stretch less the punctuation that joins it to an example value (`: `, `'`).
        let trim = |p: &str| p.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != ')').to_string();
        // A stretch is taken clause by clause (`: ` joins what the code formats from parts);
        // a clause's first word may be the code's (`it {why}`, where `why` says the rest).
        let clauses: Vec<String> =
            rest.split('\u{0}').flat_map(|p| p.split(": ").map(trim).collect::<Vec<_>>()).collect();
        for clause in clauses.into_iter().filter(|c| c.len() >= 12) {
            quoted += 1;
            let tail = clause.split_once(' ').map_or("", |(_, t)| t);
            let found = joined.contains(&clause) || (tail.len() >= 12 && joined.contains(tail));
            if !found {
                missing.push(format!("{clause:?} (from `{text}`)"));
            }
        }
    }
    assert!(quoted >= 10, "only {quoted} stretches quoted: has the page's table changed shape?");
    assert!(
        missing.is_empty(),
        "docs/troubleshooting.md quotes what no source says:\n{}",
        missing.join("\n")
    );
}

fn collect(dir: &Path, out: &mut String) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push_str(&std::fs::read_to_string(&p).unwrap());
        }
    }
}

/// docs/libvirt.md's AppArmor rule, put where it says (the local part of the abstraction every
/// libvirt QEMU profile includes) and parsed by apparmor_parser through the same include chain
/// a libvirt profile has (profile → abstractions/libvirt-qemu → `include if exists
/// <local/abstractions/libvirt-qemu>`): the rules are valid and reach the profile. (This
/// kernel does not enforce AppArmor: the denial itself is not tried here.)
#[test]
fn the_apparmor_rule_in_the_docs_parses_into_a_libvirt_style_profile() {
    let Some(parser) = ["/usr/sbin/apparmor_parser", "/sbin/apparmor_parser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        eprintln!("skipping: apparmor_parser not found (Debian package apparmor)");
        return;
    };
    let doc = std::fs::read_to_string(repo().join("docs/libvirt.md")).unwrap();
    let at = doc.find("/etc/apparmor.d/local/abstractions/libvirt-qemu").expect("the rule's place");
    let rules = doc[at..].split("```\n").nth(1).expect("the rule's block").trim().to_string();
    assert!(rules.contains("/run/dxpu/host/*.sock"), "{rules}");
    let dir = std::env::temp_dir().join(format!("dxpu-apparmor-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("abstractions")).unwrap();
    std::fs::create_dir_all(dir.join("local/abstractions")).unwrap();
    std::fs::write(
        dir.join("abstractions/libvirt-qemu"),
        "  /dev/kvm rw,\n  include if exists <local/abstractions/libvirt-qemu>\n",
    )
    .unwrap();
    std::fs::write(dir.join("local/abstractions/libvirt-qemu"), format!("{rules}\n")).unwrap();
    let profile = dir.join("libvirt-test");
    std::fs::write(
        &profile,
        "abi <abi/3.0>,\nprofile libvirt-test flags=(attach_disconnected) {\n  include <abstractions/libvirt-qemu>\n}\n",
    )
    .unwrap();
    let run =
        |args: &[&str]| Command::new(parser).args(args).arg("-I").arg(&dir).arg(&profile).output().unwrap();
    // -Q: parse and compile, load nothing into the kernel; -p: the profile as included.
    let out = run(&["-Q", "-K", "--skip-cache"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let expanded = String::from_utf8_lossy(&run(&["-p"]).stdout).to_string();
    for line in rules.lines() {
        assert!(expanded.contains(line.trim()), "{line} not in the profile:\n{expanded}");
    }
    // A rule with a mistake in it is refused: the check can fail.
    std::fs::write(dir.join("local/abstractions/libvirt-qemu"), "/run/dxpu/host/*.sock rwq,\n").unwrap();
    assert!(!run(&["-Q", "-K", "--skip-cache"]).status.success());
    let _ = std::fs::remove_dir_all(&dir);
}
