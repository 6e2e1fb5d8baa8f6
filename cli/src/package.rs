//! What a package and an operator need besides the endpoints: `dxpu keygen` (a new
//! pre-shared key file, mode 0600), `dxpu completions SHELL` and `dxpu man DIR` (generated
//! from the command line's own definition, so they never drift from `--help`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory};

/// Options of `dxpu keygen`.
#[derive(Args, Debug)]
pub(crate) struct KeygenArgs {
    /// Where to write the key (hex, one line), created with mode 0600.
    file: PathBuf,
    /// Key length in bytes, 16..=64.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u16).range(16..=64))]
    bytes: u16,
    /// Replace the file if it exists.
    #[arg(long)]
    force: bool,
}

/// Options of `dxpu completions`.
#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Options of `dxpu man`.
#[derive(Args, Debug)]
pub(crate) struct ManArgs {
    /// The directory to write `dxpu.1`, a page per subcommand (`dxpu-gpu.1`, …) and the
    /// configuration files' `gpu.toml.5` and `host.toml.5` into.
    dir: PathBuf,
}

/// Writes a fresh key from the kernel's random source; never from anything weaker.
pub(crate) fn keygen(args: KeygenArgs) -> ExitCode {
    match write_key(&args.file, args.bytes as usize, args.force) {
        Ok(id) => {
            // The key ID alone on standard output, for `ID=$(dxpu keygen FILE)`; the sentence
            // for a person on standard error.
            outln!("{id}");
            eprintln!(
                "dxpu keygen: wrote a {}-byte key to {} (mode 0600, key ID {id}); give it to both ends as key_file",
                args.bytes,
                args.file.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("dxpu keygen: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_key(path: &Path, n: usize, force: bool) -> Result<String, String> {
    let at = path.display();
    let mut key = vec![0u8; n];
    link::driver::os_random(&mut key).map_err(|e| format!("the kernel's random source (getrandom): {e}"))?;
    let psk = link::PresharedKey::new(&key).ok_or_else(|| format!("{n} bytes is no valid key length"))?;
    let id = hex::encode(psk.key_id());
    if force {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{at}: removing the old key: {e}")),
        }
    }
    // Created new, 0600 from the start: never readable by others, not even for a moment.
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(
        |e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => format!("{at} exists (--force replaces it)"),
            _ => format!("{at}: {e}"),
        },
    )?;
    writeln!(f, "{}", hex::encode(&key)).and_then(|_| f.sync_all()).map_err(|e| format!("{at}: {e}"))?;
    Ok(id)
}

pub(crate) fn completions(args: CompletionsArgs) -> ExitCode {
    let mut cmd = crate::Cli::command();
    // Into memory first: clap_complete panics on a failed write (a closed pipe, say).
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "dxpu", &mut script);
    out!("{}", String::from_utf8_lossy(&script));
    ExitCode::SUCCESS
}

pub(crate) fn man(args: ManArgs) -> ExitCode {
    match write_man_pages(&args.dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dxpu man: {}: {e}", args.dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Every page: clap's (name, synopsis, description, options, subcommands) with EXIT STATUS,
/// FILES, EXAMPLES and SEE ALSO after them, and the two configuration files' pages.
fn write_man_pages(dir: &Path) -> std::io::Result<()> {
    fn each(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned() {
            each(sub, dir)?;
        }
        let man = clap_mangen::Man::new(cmd.clone());
        let mut page = Vec::new();
        man.render(&mut page)?;
        let name = cmd.get_display_name().unwrap_or_else(|| cmd.get_name()).to_string();
        page.extend_from_slice(extra_sections(&name).as_bytes());
        std::fs::write(dir.join(man.get_filename()), page)
    }
    std::fs::create_dir_all(dir)?;
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    each(cmd, dir)?;
    for (file, role) in [("gpu.toml", Role::Gpu), ("host.toml", Role::Host)] {
        std::fs::write(dir.join(format!("{file}.5")), config_page(role))?;
    }
    Ok(())
}

/// Text for roff: a leading dot or quote escaped, backslashes doubled.
fn roff_text(s: &str) -> String {
    s.lines()
        .map(|l| {
            let l = l.replace('\\', "\\e").replace('-', "\\-");
            if l.starts_with('.') || l.starts_with('\'') { format!("\\&{l}") } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The sections clap does not write, for the page of `name` (`dxpu`, `dxpu-gpu`, …).
fn extra_sections(name: &str) -> String {
    let mut out = String::new();
    out.push_str(".SH \"EXIT STATUS\"\n");
    let daemon = "0 when stopped by SIGINT or SIGTERM (every session closed, attached devices \
                  reset), and with \\fB\\-\\-check\\fR when the configuration is valid; 1 when it \
                  cannot start or go on (a configuration refused, with the key and the reason on \
                  standard error; a device that cannot be opened)";
    match name {
        "dxpu-gpu" => out.push_str(&format!("{daemon}; 2 for a command line it does not take.\n")),
        "dxpu-host" => out.push_str(&format!(
            "{daemon}; with \\fB\\-\\-workload\\fR, 1 unless every result was verified; 2 for a \
             command line it does not take.\n"
        )),
        _ => out.push_str(
            "0 on success; 1 when the command failed, with the reason on standard error (for \
             \\fBdxpu ctl\\fR also an error answered by the endpoint; for a benchmark or \
             workload, a result that was not verified); 2 for a command line it does not take \
             (an unknown option, a value out of its range).\n",
        ),
    }
    let files = files_of(name);
    if !files.is_empty() {
        out.push_str(".SH FILES\n");
        for (path, what) in files {
            out.push_str(&format!(".TP\n\\fI{}\\fR\n{}\n", roff_text(path), roff_text(what)));
        }
    }
    let examples = examples_of(name);
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for (cmd, what) in examples {
            out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff_text(cmd), roff_text(what)));
        }
    }
    if matches!(name, "dxpu" | "dxpu-gpu" | "dxpu-host") {
        out.push_str(".SH \"SEE ALSO\"\ngpu.toml(5), host.toml(5), dxpu-ctl(1)\n");
    }
    out
}

/// The FILES section's entries of page `name`: a path and what it is.
fn files_of(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "dxpu-gpu" => &[
            ("/etc/dxpu/gpu.toml", "the configuration, as packaged (gpu.toml(5))"),
            ("/etc/dxpu/keys/", "the hosts' pre-shared keys (key_file), mode 0600"),
            ("/run/dxpu/gpu/control.sock", "the control socket, as packaged ([control] socket)"),
        ],
        "dxpu-host" => &[
            ("/etc/dxpu/host.toml", "the configuration, as packaged (host.toml(5))"),
            (
                "/etc/dxpu/keys/",
                "the pre-shared keys (key_file), mode 0600, owned by the service's user dxpu",
            ),
            ("/usr/lib/sysusers.d/dxpu.conf", "the service's user dxpu, made when the package is installed"),
            ("/run/dxpu/host/control.sock", "the control socket, as packaged ([control] socket)"),
            ("/run/dxpu/host/*.sock", "vfio-user sockets served to virtual machines (vfio_user_socket)"),
        ],
        "dxpu-ctl" => &[
            ("/run/dxpu/gpu/control.sock", "the box's control socket, taken when it exists"),
            ("/run/dxpu/host/control.sock", "the host's control socket, taken otherwise"),
        ],
        "dxpu" => &[
            (
                "/etc/dxpu/gpu.toml, /etc/dxpu/host.toml",
                "the endpoints' configurations (gpu.toml(5), host.toml(5))",
            ),
            ("/run/dxpu/gpu/control.sock, /run/dxpu/host/control.sock", "their control sockets, as packaged"),
        ],
        _ => &[],
    }
}

/// The EXAMPLES section's entries of page `name`: a command and what it does.
fn examples_of(name: &str) -> &'static [(&'static str, &'static str)] {
    match name {
        "dxpu" => &[
            (
                "dxpu loopback",
                "both endpoints and a simulated GPU on this machine: the overhead of each workload",
            ),
            (
                "dxpu replay lab/traces/v100-training-4k-kernels.json.gz --delay-us 10",
                "a real job's trace replayed directly and through the bridges",
            ),
        ],
        "dxpu-gpu" => &[
            ("dxpu gpu --check --config /etc/dxpu/gpu.toml", "validate the configuration without starting"),
            ("dxpu gpu --config /etc/dxpu/gpu.toml --log-level debug", "run in the foreground"),
        ],
        "dxpu-host" => &[
            ("dxpu host --check --config /etc/dxpu/host.toml", "validate the configuration without starting"),
            (
                "dxpu host --config /etc/dxpu/host.toml --workload",
                "attach, run the demo workload on every device, report and exit",
            ),
        ],
        "dxpu-ctl" => &[
            ("dxpu ctl devices", "who holds which device"),
            (
                "dxpu ctl --socket /run/dxpu/host/control.sock detach gpu1",
                "detach one device while the others run on",
            ),
            ("dxpu ctl --json stats", "the counters, as JSON"),
        ],
        "dxpu-loopback" => &[
            ("dxpu loopback --workload inference --repeat 5", "one workload, five runs each way"),
            ("dxpu loopback --delay-us 10 --json", "one datacenter hop added each way, as JSON"),
        ],
        "dxpu-replay" => &[
            (
                "dxpu replay trace.json.gz --delay-us 10",
                "a PyTorch profiler trace through the bridges with 10 µs each way",
            ),
            ("dxpu replay trace.json.gz --rate-gbit 25 --json", "over a 25 Gbit/s link, as JSON"),
        ],
        "dxpu-model" => &[
            (
                "dxpu model --trace trace.json.gz --rtt-us 0,10,50 --bandwidth-gbit 100",
                "a traced job's predicted overhead at three round trips",
            ),
            ("dxpu model --workload training --rtt-us 0,20,50", "a workload's, from its transaction profile"),
        ],
        "dxpu-tlp-decode" => &[
            ("dxpu tlp decode --pcap /tmp/link.pcapng --format text", "the TLPs of a capture, one line each"),
            (
                "dxpu tlp decode --format text 4a00000101000004000000002a000000",
                "one TLP given as hex (a completion with one DW of data)",
            ),
        ],
        "dxpu-keygen" => &[("dxpu keygen /etc/dxpu/keys/host-a.key", "a new 32-byte key, mode 0600")],
        "dxpu-pool" | "dxpu-pool-ls" => &[
            ("DXPU_ETCD_ENDPOINTS=10.0.0.2:2379 dxpu pool ls", "every device of the pool and who holds it"),
            ("dxpu pool drain box-a/gpu0", "no new claims on one device"),
        ],
        _ => &[],
    }
}

#[derive(Clone, Copy)]
enum Role {
    Gpu,
    Host,
}

/// The complete, commented configuration file of `role` as docs/operations.md shows it
/// (the first TOML block under its endpoint's heading): one source for the docs and the
/// page, and a test parses it as the endpoint would.
fn config_example(role: Role) -> &'static str {
    block_after(
        OPERATIONS,
        match role {
            Role::Gpu => "## `dxpu gpu`",
            Role::Host => "## `dxpu host`",
        },
    )
}

const OPERATIONS: &str = include_str!("../../docs/operations.md");
const POOL: &str = include_str!("../../docs/pool.md");

/// The first TOML block after `marker` in `doc` (empty if there is none).
fn block_after(doc: &'static str, marker: &str) -> &'static str {
    doc.split_once(marker)
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, block)| block.split_once("```"))
        .map_or("", |(toml, _)| toml)
}

/// The sections a file of `role` may add, each as the docs show it: `[control]`,
/// `[metrics]`, `[pool]`, and `[pool]`'s keys for a secured etcd.
fn optional_sections(role: Role) -> [(&'static str, &'static str); 4] {
    [
        (
            "[control]: the control socket (docs/operations.md)",
            block_after(OPERATIONS, "## The control socket and `dxpu ctl`"),
        ),
        ("[metrics]: the Prometheus endpoint (docs/operations.md)", block_after(OPERATIONS, "## Metrics")),
        (
            "[pool]: devices from a pool on etcd (docs/pool.md)",
            block_after(
                POOL,
                match role {
                    Role::Gpu => "`[[host]]` / `[[device]]` as usual plus",
                    Role::Host => "(no `[[attach]]`: the pool says what to attach)",
                },
            ),
        ),
        (
            "[pool] with a secured etcd: TLS, client certificates, a user (docs/pool.md)",
            block_after(POOL, "## A secured etcd"),
        ),
    ]
}

/// gpu.toml(5) or host.toml(5).
fn config_page(role: Role) -> String {
    let (name, what, cmd) = match role {
        Role::Gpu => ("gpu.toml", "the GPU-box endpoint's configuration", "dxpu-gpu"),
        Role::Host => ("host.toml", "the host endpoint's configuration", "dxpu-host"),
    };
    let about = match role {
        Role::Gpu => {
            "The file \\fBdxpu gpu\\fR reads (\\fB--config\\fR; packaged as /etc/dxpu/gpu.toml): where it \
             listens, the link's settings, the hosts allowed in with their keys, and the devices it \
             exports (simulated, or real ones bound to vfio-pci) with the hosts that may attach each."
        }
        Role::Host => {
            "The file \\fBdxpu host\\fR reads (\\fB--config\\fR; packaged as /etc/dxpu/host.toml): the \
             link's settings and each device to attach \\(em its box, name and key, and whether it is \
             served to a virtual machine over a vfio-user socket \\(em or a \\fB[pool]\\fR to claim \
             devices from."
        }
    };
    format!(
        ".TH {upper} 5 \"\" \"dxpu {version}\" \"File Formats\"\n\
         .SH NAME\n{name} \\- {what}\n\
         .SH DESCRIPTION\n{about} TOML; an unknown key is refused, and an invalid value stops the \
         endpoint at start (or is refused on reload) with the key, the value and the reason. \
         \\fB{bin} --check --config FILE\\fR validates a file without starting.\n\
         .SH KEYS\nEvery key, with its default where it has one:\n.PP\n.nf\n{example}\n.fi\n\
         {sections}\
         .SH FILES\n.TP\n\\fI/etc/dxpu/{name}\\fR\nwhere the package's unit reads it\n\
         .SH \"SEE ALSO\"\n{cmd}(1), dxpu-ctl(1){also}; docs/operations.md in the source (the \
         control socket, metrics, capture and pool sections)\n",
        also = match role {
            Role::Gpu => ", host.toml(5)",
            Role::Host => ", gpu.toml(5) (the [link] and [impairment] keys)",
        },
        upper = name.to_uppercase(),
        version = env!("CARGO_PKG_VERSION"),
        bin = cmd.replace('-', " "),
        example = roff_text(config_example(role).trim_end()),
        sections = optional_sections(role)
            .iter()
            .map(|(title, toml)| format!(".SS \"{title}\"\n.nf\n{}\n.fi\n", roff_text(toml.trim_end())))
            .collect::<String>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// The configuration pages' key reference is docs/operations.md's complete example, and
    /// each parses as its endpoint would parse it.
    #[test]
    fn the_configuration_pages_hold_a_file_each_endpoint_takes() {
        let dir = std::env::temp_dir().join(format!("dxpu-man-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gpu = config_example(Role::Gpu);
        let host = config_example(Role::Host);
        assert!(gpu.contains("[[device]]") && gpu.contains("[link]"), "{gpu}");
        assert!(host.contains("[[attach]]"), "{host}");
        let (g, h, k) = (dir.join("gpu.toml"), dir.join("host.toml"), dir.join("host-b.key"));
        // Its key file where this test can write one.
        write_key(&k, 32, true).unwrap();
        let gpu = gpu.replace("/etc/dxpu/host-b.key", k.to_str().unwrap());
        std::fs::write(&g, gpu).unwrap();
        std::fs::write(&h, host).unwrap();
        let gf: ops::config::GpuFile = ops::config::read(&g).unwrap();
        gf.options(None).unwrap();
        let hf: ops::config::HostFile = ops::config::read(&h).unwrap();
        hf.attachments(None).unwrap();
        let page = config_page(Role::Gpu);
        assert!(page.starts_with(".TH GPU.TOML 5") && page.contains("key_update_frames"), "{page}");
        assert!(config_page(Role::Host).contains("completion_timeout_ms"));
        // Every section a file may add, each with its keys, on both pages.
        for role in [Role::Gpu, Role::Host] {
            let page = config_page(role);
            for (title, toml) in optional_sections(role) {
                let section = title.split_once(':').map_or(title, |(s, _)| s);
                assert!(
                    !toml.trim().is_empty() && toml.contains(section.split(' ').next().unwrap_or("")),
                    "{title}: {toml}"
                );
                assert!(page.contains(&format!(".SS \"{title}\"")), "{title}");
            }
            for key in ["socket =", "listen =", "etcd =", "etcd_cacert", "lease_ttl_s"] {
                assert!(page.contains(key), "{key} not in the page");
            }
        }
        assert!(config_page(Role::Gpu).contains("advertise") && config_page(Role::Host).contains("want ="));
        // Lines of the example that begin with a dot or a quote cannot be taken for requests.
        assert_eq!(roff_text(".x\n'y\nz\\ -1"), "\\&.x\n\\&'y\nz\\e \\-1");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_key_is_random_hex_mode_0600_and_never_overwritten_unless_forced() {
        let dir = std::env::temp_dir().join(format!("dxpu-keygen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("k");
        let _ = std::fs::remove_file(&p);
        write_key(&p, 32, false).unwrap();
        let a = std::fs::read_to_string(&p).unwrap();
        assert_eq!(a.trim().len(), 64);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(write_key(&p, 32, false).unwrap_err().contains("exists"));
        assert_eq!(std::fs::read_to_string(&p).unwrap(), a, "a refused keygen left the key alone");
        write_key(&p, 32, true).unwrap();
        assert_ne!(std::fs::read_to_string(&p).unwrap(), a);
        // What keygen writes is a key the configuration takes.
        let hex = std::fs::read_to_string(&p).unwrap();
        assert!(link::PresharedKey::new(&ops::config::parse_hex(hex.trim()).unwrap()).is_some());
        let _ = std::fs::remove_dir_all(dir);
    }
}
