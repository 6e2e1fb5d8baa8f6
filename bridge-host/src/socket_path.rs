//! A UNIX socket at a path an operator named (a vfio-user socket, a control socket): nothing
//! at that path is ever removed unless it is a stale socket — a socket nobody listens on
//! (connecting is refused) — and at the end the path is removed only if it still holds the
//! socket bound here (a file put there since, or another process's socket, stays). The
//! socket gets its mode, owner and group before it listens, so that no one else can connect
//! in between.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Who may connect: the socket file's mode, and its owner and group where given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketAccess {
    /// Permission bits (0600: the owner only).
    pub mode: u32,
    /// The owning user, by ID (unchanged where `None`: the process's).
    pub uid: Option<u32>,
    /// The owning group, by ID (unchanged where `None`).
    pub gid: Option<u32>,
}

impl Default for SocketAccess {
    /// 0600, the process's user: only the endpoint's own user may connect.
    fn default() -> SocketAccess {
        SocketAccess { mode: 0o600, uid: None, gid: None }
    }
}

/// The path of a socket bound here, and which file it is: device, inode and change time
/// (an inode number freed by a removal is soon given to a new file; the change time tells
/// them apart unless both were made within the same clock tick).
#[derive(Debug)]
pub struct SocketPath {
    path: PathBuf,
    id: (u64, u64, i64, i64),
}

fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
}

impl SocketPath {
    /// The path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket file, if the path still holds the one bound here.
    pub fn remove(&self) {
        if let Ok(m) = std::fs::symlink_metadata(&self.path)
            && m.file_type().is_socket()
            && identity(&m) == self.id
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What is at `path` now, and whether it may be replaced.
fn clear(path: &Path) -> io::Result<()> {
    let at = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()));
    let m = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(at(e, "looking at")),
    };
    if !m.file_type().is_socket() {
        let kind = if m.file_type().is_symlink() {
            "a symbolic link"
        } else if m.is_dir() {
            "a directory"
        } else if m.is_file() {
            "a regular file"
        } else {
            "not a socket"
        };
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is {kind}: refusing to replace it (remove it, or name another path)",
                path.display()
            ),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!("{} is a live socket: another process listens there", path.display()),
        )),
        // Nobody listens: a socket left by an endpoint that died.
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(|e| at(e, "removing the stale socket"))
        }
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "{} is a socket this process cannot tell is stale ({e}): refusing to replace it",
                path.display()
            ),
        )),
    }
}

/// A listening UNIX socket at `path` with `access`: bound where nothing is (or a stale
/// socket was), given its mode, owner and group, and only then listening — connecting to a
/// socket that does not listen yet is refused, so nobody connects while the mode still
/// follows the umask.
pub fn bind(path: &Path, access: SocketAccess) -> io::Result<(UnixListener, SocketPath)> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let at = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()));
    clear(path)?;
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .map_err(|e| at(e.into(), "a socket for"))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| at(e.into(), "the socket address"))?;
    rustix::net::bind(&fd, &addr).map_err(|e| at(e.into(), "binding"))?;
    let set_up = rustix::fs::chmod(path, rustix::fs::Mode::from_raw_mode(access.mode & 0o777))
        .map_err(io::Error::from)
        .and_then(|()| match (access.uid, access.gid) {
            (None, None) => Ok(()),
            (u, g) => {
                rustix::fs::chown(path, u.map(rustix::fs::Uid::from_raw), g.map(rustix::fs::Gid::from_raw))
                    .map_err(io::Error::from)
            }
        });
    // Its identity once its mode and owner are set (they change its change time).
    let bound = std::fs::symlink_metadata(path).map_err(|e| at(e, "looking at"))?;
    let ours = SocketPath { path: path.to_path_buf(), id: identity(&bound) };
    if let Err(e) = set_up.and_then(|()| rustix::net::listen(&fd, 16).map_err(io::Error::from)) {
        ours.remove();
        return Err(at(e, "setting up"));
    }
    Ok((UnixListener::from(fd), ours))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("dxpu-sockpath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_file_a_symlink_or_a_live_socket_is_refused_and_left_alone() {
        let d = dir("refuse");
        let file = d.join("config.toml");
        std::fs::write(&file, "precious").unwrap();
        let e = bind(&file, SocketAccess::default()).unwrap_err();
        assert!(e.to_string().contains("a regular file"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "precious");
        let link = d.join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = bind(&link, SocketAccess::default()).unwrap_err();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        let live = d.join("live.sock");
        let (_l, _p) = bind(&live, SocketAccess::default()).unwrap();
        let e = bind(&live, SocketAccess::default()).unwrap_err();
        assert!(e.to_string().contains("live socket"), "{e}");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_stale_socket_is_replaced_and_only_our_own_is_removed_at_the_end() {
        let d = dir("stale");
        let p = d.join("s.sock");
        let (l, first) = bind(&p, SocketAccess::default()).unwrap();
        drop(l);
        // Past a clock tick: the replacement may get the same inode number.
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Nobody listens now: stale, replaced.
        let (_l2, second) = bind(&p, SocketAccess { mode: 0o660, uid: None, gid: None }).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o660);
        // The first's removal finds another file at the path: it stays.
        first.remove();
        assert!(p.exists());
        second.remove();
        assert!(!p.exists());
        // A file put where our socket was is not ours to remove.
        let (_l3, third) = bind(&p, SocketAccess::default()).unwrap();
        std::fs::remove_file(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, "someone else's").unwrap();
        third.remove();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "someone else's");
        let _ = std::fs::remove_dir_all(d);
    }
}
