//! Who may read and write what a configuration names: the packaged services' user, this
//! process's, and the hints an error gives where they differ.

use std::path::Path;

use super::error::{ConfigError, bad};

/// The user the packaged services run as (packaging/dxpu-*.service).
pub const SERVICE_USER: &str = "dxpu";

/// The directory a socket named by `key` is made in: `path`'s parent (`.` for a bare name),
/// once `path` is a file's path at all (not empty, not a directory).
pub(crate) fn socket_dir<'a>(key: &str, path: &'a Path) -> Result<&'a Path, ConfigError> {
    if path.as_os_str().is_empty() || path.is_dir() {
        return Err(bad(key, path.display(), "must be a socket file path"));
    }
    Ok(path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new(".")))
}

/// Whether this process may make `path` in `dir` (write and enter it): said as `key`'s
/// error, with who runs and who the packaged services run as, where it may not.
pub(crate) fn check_writable(key: &str, path: &Path, dir: &Path) -> Result<(), ConfigError> {
    let wx = rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK;
    rustix::fs::access(dir, wx).map_err(|e| {
        bad(
            key,
            path.display(),
            &format!(
                "its directory {} is not this process's to write ({e}): it runs as {}; the packaged services run as user {SERVICE_USER}, whose units make their own directories under /run/dxpu at start",
                dir.display(),
                running_as()
            ),
        )
    })
}

/// Who this process runs as: `uid N (name)`.
pub fn running_as() -> String {
    let uid = rustix::process::geteuid().as_raw();
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("uid {uid} ({})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// An error reading `f`, with what to do where it is a permission refused: who this process
/// runs as, and that the packaged services run as [`SERVICE_USER`].
pub fn with_user_hint(e: &std::io::Error, f: &Path) -> String {
    if e.kind() != std::io::ErrorKind::PermissionDenied {
        return e.to_string();
    }
    format!(
        "{e}: this process runs as {}; the packaged services run as user {SERVICE_USER}, which must be able to read it and enter its directory: `chown {SERVICE_USER}:{SERVICE_USER} {}` (a key file: mode 0600; docs/operations.md)",
        running_as(),
        f.display()
    )
}

/// Run as root (a `--check` by hand, say) where the packaged services' user exists, a key
/// file that user cannot read is said: the service would be refused it at start.
pub(crate) fn warn_if_the_service_cannot_read(key_name: &str, f: &Path) {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return;
    }
    let Ok(Some(user)) = nix::unistd::User::from_name(SERVICE_USER) else { return };
    let Ok(m) = std::fs::metadata(f) else { return };
    let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
    let readable = (m.uid() == uid && m.mode() & 0o400 != 0)
        || (m.gid() == gid && m.mode() & 0o040 != 0)
        || m.mode() & 0o004 != 0;
    if !readable {
        log::warn!(
            "{key_name} = {}: the packaged service's user {SERVICE_USER} cannot read it (owner uid {}, mode {:03o}); `chown {SERVICE_USER}:{SERVICE_USER}` it unless this endpoint runs as root",
            f.display(),
            m.uid(),
            m.mode() & 0o777
        );
    }
}
