//! docs/quickstart.md, run as written: every block the page marks with a machine (` ```sh
//! box-a`, ` ```toml host-a:/etc/dxpu/host.toml`) runs in one of two network namespaces joined
//! by veth, with the page's own addresses (10.0.0.7 for the box, 10.0.0.21 for the host), its
//! nftables rule applied for real, the services started as the packaged units start them.
//!
//! What stands in for what a test cannot do on this machine, and nothing else: each machine's
//! `/etc/dxpu`, `/run/dxpu` and `/var/tmp` are directories of the test's (the paths rewritten
//! in the blocks and files); `dpkg -i` only checks its file (tests/deb installs the real
//! package); `systemctl enable --now` and `reload` run the units' own `ExecStart` and
//! `ExecReload` lines (packaging/*.service) as root, where the host's unit runs as the
//! package's user `dxpu`, which `chown` and `install -g` take as root here (tests/deb checks
//! the user and the unit); `scp` copies between the machines' directories;
//! the simulated GPU stands where the page has `vfio =`; the build block is not run (the
//! package is built by tests/deb) and its copies are a placeholder file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const BOX: &str = "box-a";
const HOST: &str = "host-a";
/// The paths of a machine the blocks name, kept per machine under the test's directory.
const MACHINE_PATHS: [&str; 3] = ["/etc/dxpu", "/run/dxpu", "/var/tmp"];

fn repo() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A fenced block of the page: its language, the machines it runs on, the file it is (for
/// ` ```toml MACHINE:PATH`), and its text.
#[derive(Debug)]
struct Block {
    lang: String,
    machines: Vec<String>,
    file: Option<String>,
    text: String,
}

fn blocks(doc: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for line in doc.lines() {
        if let Some(info) = line.strip_prefix("```") {
            match open.take() {
                Some(b) => out.push(b),
                None => {
                    let mut words = info.split_whitespace();
                    let lang = words.next().unwrap_or("").to_string();
                    let (mut machines, mut file) = (Vec::new(), None);
                    for w in words {
                        match w.split_once(':') {
                            Some((m, p)) => {
                                machines.push(m.to_string());
                                file = Some(p.to_string());
                            }
                            None => machines.push(w.to_string()),
                        }
                    }
                    open = Some(Block { lang, machines, file, text: String::new() });
                }
            }
        } else if let Some(b) = &mut open {
            b.text.push_str(line);
            b.text.push('\n');
        }
    }
    assert!(open.is_none(), "docs/quickstart.md: a block is not closed");
    out
}

struct Machine {
    name: &'static str,
    ns: String,
    root: PathBuf,
}

impl Machine {
    fn home(&self) -> PathBuf {
        self.root.join("home")
    }
}

/// `text` with each machine path (`/etc/dxpu/…`) moved under its machine's directory: the
/// machine named before it (`box-a:/etc/dxpu/…`, as scp writes it), else `on`.
fn rewrite(text: &str, on: &Machine, all: &[&Machine]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < text.len() {
        let at = MACHINE_PATHS.iter().filter_map(|p| text[i..].find(p).map(|k| i + k)).min();
        let Some(at) = at else {
            out.push_str(&text[i..]);
            break;
        };
        out.push_str(&text[i..at]);
        let named = all.iter().find(|m| out.ends_with(&format!("{}:", m.name)));
        out.push_str(&named.map_or(on, |m| m).root.display().to_string());
        i = at;
        // The path itself follows, copied as it is.
        let p = MACHINE_PATHS.iter().find(|p| text[at..].starts_with(**p)).unwrap();
        out.push_str(p);
        i += p.len();
    }
    out
}

/// The `ExecStart` and `ExecReload` lines of a packaged unit, as a shell runs them here.
fn unit_lines(unit: &str, dxpu: &Path) -> (String, Vec<String>) {
    let text = std::fs::read_to_string(repo().join(format!("packaging/{unit}.service"))).unwrap();
    let value = |key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(key))
            .map(|l| l.replace("/usr/bin/dxpu", &dxpu.display().to_string()))
            .collect()
    };
    let start = value("ExecStart=");
    assert_eq!(start.len(), 1, "{unit}: one ExecStart");
    (start[0].clone(), value("ExecReload="))
}

/// The control socket a configuration file names (`[control] socket = "…"`).
fn control_socket(toml: &str) -> Option<String> {
    toml.lines().find_map(|l| l.trim().strip_prefix("socket = ")).map(|s| s.trim_matches('"').to_string())
}

/// Writes the stand-ins for dpkg, systemctl and scp into the machine's `bin`.
fn shims(m: &Machine, all: &[&Machine], dxpu: &Path, sockets: &[(String, String)]) {
    let bin = m.root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let r = m.root.display();
    let write = |name: &str, body: String| {
        use std::os::unix::fs::PermissionsExt;
        let p = bin.join(name);
        std::fs::write(&p, format!("#!/bin/sh\nset -eu\n{body}")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    write(
        "dpkg",
        format!(
            "[ \"$#\" -eq 2 ] && [ \"$1\" = -i ] && [ -f \"$2\" ] || {{ echo \"dpkg (quickstart test): only -i FILE, and the file must exist: $*\" >&2; exit 1; }}\n\
             mkdir -p {r}/etc/dxpu {r}/run/dxpu/gpu {r}/run/dxpu/host {r}/var/tmp && chmod 1777 {r}/var/tmp\n\
             echo \"dpkg (quickstart test): $2 stands for the package tests/deb installs\"\n"
        ),
    );
    let mut cases = String::new();
    for unit in ["dxpu-gpu", "dxpu-host"] {
        let (start, reload) = unit_lines(unit, dxpu);
        let start = rewrite(&start, m, all);
        let pid = format!("{r}/run/{unit}.pid");
        let log = format!("{r}/run/{unit}.log");
        let wait = match sockets.iter().find(|(u, _)| u == unit) {
            Some((_, sock)) => format!(
                "i=0; while [ ! -S {sock} ]; do i=$((i+1)); if [ $i -gt 300 ]; then echo \"{unit} did not open {sock}\" >&2; cat {log} >&2; exit 1; fi; sleep 0.1; done\n"
            ),
            None => String::new(),
        };
        cases.push_str(&format!(
            "\"enable --now {unit}\")\n  setsid {start} > {log} 2>&1 < /dev/null &\n  echo $! > {pid}\n  {wait};;\n"
        ));
        let reload: Vec<String> = reload.iter().map(|l| rewrite(l, m, all)).collect();
        cases.push_str(&format!("\"reload {unit}\")\n  {};;\n", reload.join(" && ")));
    }
    write(
        "systemctl",
        format!(
            "case \"$*\" in\n{cases}*) echo \"systemctl (quickstart test): '$*' is not one the page uses\" >&2; exit 1;;\nesac\n"
        ),
    );
    // The package's user, which this machine does not have: root stands for it.
    let as_root = "for a in \"$@\"; do\n  case \"$a\" in dxpu|dxpu:dxpu) a=root;; esac\n  set -- \"$@\" \"$a\"; shift\ndone\n";
    let real = |tool: &str| {
        ["/usr/bin", "/bin", "/usr/sbin"]
            .iter()
            .map(|d| format!("{d}/{tool}"))
            .find(|p| Path::new(p).exists())
            .unwrap_or_else(|| panic!("{tool} not found"))
    };
    write("chown", format!("{as_root}exec {} \"$@\"\n", real("chown")));
    write("install", format!("{as_root}exec {} \"$@\"\n", real("install")));
    let mut map = String::new();
    for o in all {
        map.push_str(&format!(
            "  {n}:) echo {h}/;;\n  {n}:*) echo \"${{1#{n}:}}\";;\n",
            n = o.name,
            h = o.home().display()
        ));
    }
    write(
        "scp",
        format!(
            "map() {{\n case \"$1\" in\n{map}  *) echo \"$1\";;\n esac\n}}\n\
             [ \"$#\" -eq 2 ] || {{ echo \"scp (quickstart test): SOURCE TARGET only: $*\" >&2; exit 1; }}\n\
             cp \"$(map \"$1\")\" \"$(map \"$2\")\"\n"
        ),
    );
}

/// Runs a block's script on a machine: its output, or a panic with it.
fn run(m: &Machine, script: &str, dxpu: &Path) -> String {
    let path = format!(
        "{}:{}:{}",
        m.root.join("bin").display(),
        dxpu.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("timeout")
        // A machine's usual umask, whatever the test runner's: tcpdump, which drops to its own
        // user, must reach /var/tmp through the directories the blocks make.
        .args(["120", "ip", "netns", "exec", &m.ns, "sh", "-eu", "-c", &format!("umask 022\n{script}")])
        .current_dir(m.home())
        .env("PATH", path)
        .env("HOME", m.home())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "on {} ({}):\n{script}\n--- exit {:?}, output:\n{text}",
        m.name,
        m.ns,
        out.status.code()
    );
    text
}

fn ip(args: &str) -> Result<(), String> {
    let out = Command::new("ip").args(args.split_whitespace()).output().map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {args}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// The namespaces, removed (and the services in them stopped) on drop.
struct Testbed {
    machines: Vec<Machine>,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for m in &self.machines {
            for unit in ["dxpu-gpu", "dxpu-host"] {
                let pid = std::fs::read_to_string(m.root.join(format!("run/{unit}.pid"))).unwrap_or_default();
                if let Some(p) = pid.trim().parse::<i32>().ok().and_then(rustix::process::Pid::from_raw) {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
                    for _ in 0..50 {
                        if !Path::new(&format!("/proc/{}", p.as_raw_pid())).exists() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
            let _ = ip(&format!("netns del {}", m.ns));
        }
        if let Some(m) = self.machines.first() {
            let _ = std::fs::remove_dir_all(m.root.parent().unwrap());
        }
    }
}

#[test]
fn the_quickstart_runs_as_written_on_two_machines() {
    if let Some(tool) = missing_tool() {
        eprintln!("skipped: {tool} not found (.ci/run installs iproute2, nftables, tcpdump, curl)");
        return;
    }
    let dxpu = PathBuf::from(env!("CARGO_BIN_EXE_dxpu"));
    let doc = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let blocks = blocks(&doc);
    let dir = std::env::temp_dir().join(format!("dxpu-quickstart-{}", std::process::id()));
    let tag = std::process::id() % 10_000;
    let machine = |name: &'static str, n: usize| Machine {
        name,
        ns: format!("dxpu-qs{tag}-{n}"),
        root: dir.join(name),
    };
    let bed = Testbed { machines: vec![machine(BOX, 0), machine(HOST, 1)] };
    let (b, h) = (&bed.machines[0], &bed.machines[1]);
    // Two machines on one segment, at the page's addresses, with jumbo frames as its [link]
    // asks; nothing leaves the namespaces.
    let veth = (format!("vqs{tag}a"), format!("vqs{tag}b"));
    if let Err(e) = two_machines(b, h, &veth) {
        eprintln!("skipped: cannot make two network namespaces ({e}); the test needs root and iproute2");
        return;
    }
    let all = [b, h];
    // What the build block copies to each machine.
    for m in all {
        std::fs::create_dir_all(m.home()).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            for d in [dir.as_path(), m.root.as_path(), m.home().as_path()] {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        std::fs::write(m.home().join("dxpu_0.1.0_amd64.deb"), "placeholder: the build block is not run")
            .unwrap();
    }
    // The services' control sockets, from the page's configuration files, for `systemctl`
    // to wait on as systemd waits for a notify unit's READY=1.
    let mut sockets = Vec::new();
    for blk in blocks.iter().filter(|b| b.lang == "toml" && b.file.is_some()) {
        let m = all.iter().find(|m| blk.machines.first().is_some_and(|n| n == m.name)).unwrap();
        let unit = if blk.file.as_deref().is_some_and(|f| f.ends_with("gpu.toml")) {
            "dxpu-gpu"
        } else {
            "dxpu-host"
        };
        if let Some(s) = control_socket(&blk.text) {
            sockets.push((unit.to_string(), rewrite(&s, m, &all)));
        }
    }
    for m in all {
        shims(m, &all, &dxpu, &sockets);
    }
    let mut ran = 0;
    let mut said = String::new();
    for blk in &blocks {
        if blk.machines.is_empty() {
            continue;
        }
        if blk.machines == ["build"] {
            assert!(blk.text.contains("packaging/build-deb.sh"), "{blk:?}");
            continue;
        }
        for name in &blk.machines {
            let m =
                all.iter().find(|m| m.name == name).unwrap_or_else(|| panic!("no machine {name}: {blk:?}"));
            match (blk.lang.as_str(), &blk.file) {
                ("toml", Some(file)) => {
                    let text = rewrite(&blk.text, m, &all);
                    // The simulated GPU where the page binds a real one.
                    let text: String = text
                        .lines()
                        .map(|l| if l.starts_with("vfio = ") { "sim = { vram_mib = 256 }" } else { l })
                        .collect::<Vec<_>>()
                        .join("\n");
                    let path = PathBuf::from(rewrite(file, m, &all));
                    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                    std::fs::write(&path, text + "\n").unwrap();
                }
                ("sh", None) => said.push_str(&run(m, &rewrite(&blk.text, m, &all), &dxpu)),
                other => panic!("a block the test cannot run: {other:?} {blk:?}"),
            }
            ran += 1;
        }
    }
    assert!(ran >= 12, "only {ran} blocks ran: has the page lost its machine marks?");
    // What the page says the reader sees.
    assert!(
        said.contains("host-a's key: ") && !said.contains("host-a's key: \n"),
        "the key ID is printed: {said}"
    );
    assert!(said.contains("gpu0: workload verified"), "{said}");
    assert!(said.contains("table inet dxpu"), "{said}");
    assert!(said.contains("dxpu_link_retransmits"), "{said}");
    assert!(
        said.contains("host->box KEEPALIVE") && said.contains("box->host KEEPALIVE"),
        "the capture decodes: {said}"
    );
    let ctl = |m: &Machine, sock: &str, method: &str| ctl(m, &dxpu, sock, method);
    let gpu_sock = rewrite("/run/dxpu/gpu/control.sock", b, &all);
    let host_sock = rewrite("/run/dxpu/host/control.sock", h, &all);
    let devs = ctl(b, &gpu_sock, "devices");
    assert_eq!(
        (devs[0]["state"].as_str(), devs[0]["owner"].as_str()),
        (Some("attached"), Some("host-a")),
        "{devs}"
    );
    let devs = ctl(h, &host_sock, "devices");
    assert_eq!(devs[0]["state"], "attached", "{devs}");
    the_firewall_is_in_the_path(b, h, &dxpu, &gpu_sock, &host_sock);
    reloads(h, &all, &dxpu, &host_sock);
    drop(bed);
}

/// The first tool the test needs that this machine lacks.
fn missing_tool() -> Option<&'static str> {
    ["ip", "nft", "tcpdump", "curl", "setsid", "timeout"].into_iter().find(|tool| {
        Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map_or(true, |o| !o.status.success())
    })
}

/// Two machines on one segment, at the page's addresses, with jumbo frames as its [link]
/// asks; nothing leaves the namespaces.
fn two_machines(b: &Machine, h: &Machine, veth: &(String, String)) -> Result<(), String> {
    ip(&format!("netns add {}", b.ns))?;
    ip(&format!("netns add {}", h.ns))?;
    ip(&format!(
        "link add {} netns {} mtu 9000 type veth peer name {} netns {} mtu 9000",
        veth.0, b.ns, veth.1, h.ns
    ))?;
    for (m, dev, addr) in [(b, &veth.0, "10.0.0.7/24"), (h, &veth.1, "10.0.0.21/24")] {
        ip(&format!("-n {} addr add {addr} dev {dev}", m.ns))?;
        ip(&format!("-n {} link set {dev} up", m.ns))?;
        ip(&format!("-n {} link set lo up", m.ns))?;
    }
    Ok(())
}

/// `dxpu ctl --json` on machine `m` against control socket `sock`.
fn ctl(m: &Machine, dxpu: &Path, sock: &str, method: &str) -> serde_json::Value {
    let out = run(m, &format!("dxpu ctl --json --socket {sock} {method}"), dxpu);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The firewall is in the path: with the host's address out of the set, the box hears
/// nothing from the host and its session turns silent (the host still hears the box's
/// probes: the rule filters what comes in); put back within the ride-through time, the box
/// hears the host again and the device stays attached, never removed.
fn the_firewall_is_in_the_path(b: &Machine, h: &Machine, dxpu: &Path, gpu_sock: &str, host_sock: &str) {
    let silences = || ctl(b, dxpu, gpu_sock, "stats")["sessions_silent"].as_u64().unwrap();
    let before = silences();
    // When the host's device came up: a removal and a new attach would move it.
    let up_since = ctl(h, dxpu, host_sock, "devices")[0]["since_unix_seconds"].clone();
    assert!(up_since.is_number(), "{up_since}");
    run(b, "nft delete element inet dxpu hosts '{ 10.0.0.21 }'", dxpu);
    let mut silent = false;
    for _ in 0..50 {
        if silences() > before {
            silent = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(silent, "the box kept hearing the host through a firewall that drops it");
    run(b, "nft add element inet dxpu hosts '{ 10.0.0.21 }'", dxpu);
    std::thread::sleep(Duration::from_secs(2));
    let devs = ctl(h, dxpu, host_sock, "devices");
    assert_eq!(devs[0]["state"], "attached", "the host's device after a short outage: {devs}");
    assert!(devs[0]["removed"].is_null(), "the device was removed in a short outage: {devs}");
    assert_eq!(devs[0]["since_unix_seconds"], up_since, "the device was attached again, not kept: {devs}");
    let devs = ctl(b, dxpu, gpu_sock, "devices");
    assert_eq!(devs[0]["owner"], "host-a", "the box let the host go in a short outage: {devs}");
}

/// The page's reload: the file checked, then applied by the running host, which answers;
/// a file it refuses — one `--check` refuses, or a change only a restart may make — fails
/// the reload, as `systemctl reload` reports it, the host running on unchanged.
fn reloads(h: &Machine, all: &[&Machine], dxpu: &Path, host_sock: &str) {
    let file = rewrite("/etc/dxpu/host.toml", h, all);
    let page = std::fs::read_to_string(&file).unwrap();
    // As the page says: a vfio-user socket added to the [[attach]], with its mode and QEMU's
    // group (root's here: the test has no libvirt-qemu).
    let doc = std::fs::read_to_string(repo().join("docs/quickstart.md")).unwrap();
    let vm =
        blocks(&doc).into_iter().find(|b| b.text.contains("vfio_user_socket_group")).expect("the VM lines");
    let lines = rewrite(&vm.text, h, all).replace("\"libvirt-qemu\"", "\"root\"");
    let with_socket = page.replace("device = \"gpu0\"", &format!("device = \"gpu0\"\n{}", lines.trim_end()));
    assert_ne!(with_socket, page, "the page's [[attach]] names gpu0");
    std::fs::write(&file, &with_socket).unwrap();
    run(h, "systemctl reload dxpu-host", dxpu);
    let devs = ctl(h, dxpu, host_sock, "devices");
    assert!(devs.to_string().contains("gpu0.sock"), "the reload did not serve gpu0 over vfio-user: {devs}");
    let refused = |text: &str| {
        std::fs::write(&file, text).unwrap();
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &h.ns,
                &h.root.join("bin/systemctl").display().to_string(),
                "reload",
                "dxpu-host",
            ])
            .env(
                "PATH",
                format!("{}:{}", dxpu.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default()),
            )
            .output()
            .unwrap();
        assert!(!out.status.success(), "a refused file reloads: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // A file --check refuses, and one the running host refuses (its [link] is taken at a start).
    refused("[link]\nmtu = 1\n");
    let err = refused(&with_socket.replace("poll = \"busy\"", "poll = \"blocking\""));
    assert!(err.contains("[link]") && err.contains("needs a restart"), "{err}");
    let devs = ctl(h, dxpu, host_sock, "devices");
    assert!(devs.to_string().contains("gpu0.sock"), "a refused reload changed the host: {devs}");
}
