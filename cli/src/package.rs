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
    /// The directory to write `dxpu.1` and a page per subcommand (`dxpu-gpu.1`, …) into.
    dir: PathBuf,
}

/// Writes a fresh key from the kernel's random source; never from anything weaker.
pub(crate) fn keygen(args: KeygenArgs) -> ExitCode {
    match write_key(&args.file, args.bytes as usize, args.force) {
        Ok(id) => {
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
    let cmd = crate::Cli::command();
    if let Err(e) = std::fs::create_dir_all(&args.dir) {
        eprintln!("dxpu man: {}: {e}", args.dir.display());
        return ExitCode::FAILURE;
    }
    match clap_mangen::generate_to(cmd, &args.dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dxpu man: {}: {e}", args.dir.display());
            ExitCode::FAILURE
        }
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
