//! What a package and an operator need besides the endpoints: `dxpu keygen` (a new
//! pre-shared key file, mode 0600), `dxpu completions SHELL` and `dxpu man DIR` (generated
//! from the command line's own definition, so they never drift from `--help`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, CommandFactory};
use ops::config::page::{Role, man_page, roff};

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
        std::fs::write(dir.join(format!("{file}.5")), man_page(role))?;
    }
    Ok(())
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
            out.push_str(&format!(".TP\n\\fI{}\\fR\n{}\n", roff(path), roff(what)));
        }
    }
    let examples = examples_of(name);
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n");
        for (cmd, what) in examples {
            out.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", roff(cmd), roff(what)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
