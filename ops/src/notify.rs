//! systemd's readiness protocol (`sd_notify(3)`): a datagram to `$NOTIFY_SOCKET` saying the
//! service is ready, reloading or stopping. Nothing happens where the variable is unset (not
//! started by systemd, or not `Type=notify`).

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (`READY=1`, `STOPPING=1`, …) to the service manager, if there is one; a
/// failure is logged, never fatal.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(std::path::Path::new(&path)),
    };
    let sent = addr.and_then(|a| UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), &a)));
    if let Err(e) = sent {
        log::warn!("sd_notify {state:?} to {}: {e}", path.to_string_lossy());
    }
}

/// `READY=1` with a status line.
pub fn ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// `RELOADING=1` with the monotonic time systemd expects alongside it.
pub fn reloading() {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let usec = t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1000;
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={usec}"));
}

/// The service manager's watchdog (`WatchdogSec=`): `WATCHDOG=1` every half of
/// `WATCHDOG_USEC`, from the loop that must stay alive — a loop that hangs stops the pings
/// and systemd restarts the service. Nothing where the variables are unset or name another
/// process.
pub struct Watchdog {
    every: Option<std::time::Duration>,
    last: std::time::Instant,
}

impl Watchdog {
    /// As `WATCHDOG_USEC` and `WATCHDOG_PID` say.
    pub fn from_env() -> Watchdog {
        let ours = std::env::var("WATCHDOG_PID").map_or(true, |p| p.parse() == Ok(std::process::id()));
        let usec = std::env::var("WATCHDOG_USEC").ok().and_then(|v| v.parse::<u64>().ok()).filter(|u| *u > 0);
        Watchdog {
            every: usec.filter(|_| ours).map(|u| std::time::Duration::from_micros(u / 2)),
            last: std::time::Instant::now(),
        }
    }

    /// Pings if half the watchdog's time has passed since the last ping.
    pub fn tick(&mut self) {
        if let Some(every) = self.every
            && self.last.elapsed() >= every
        {
            self.last = std::time::Instant::now();
            notify("WATCHDOG=1");
        }
    }
}

#[cfg(test)]
mod tests {
    /// The test binary runs itself with `NOTIFY_SOCKET` set (this crate forbids the unsafe
    /// `set_var`), and the child's `READY=1` arrives on the socket.
    #[test]
    fn the_state_reaches_the_socket_named_by_notify_socket() {
        let dir = std::env::temp_dir().join(format!("dxpu-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "notify::tests::child_sends", "--nocapture"])
            .env("NOTIFY_SOCKET", &path)
            .env("DXPU_NOTIFY_CHILD", "1")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let mut buf = [0u8; 256];
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The child of the test above (does nothing when run on its own).
    #[test]
    fn child_sends() {
        if std::env::var_os("DXPU_NOTIFY_CHILD").is_some() {
            super::ready("serving");
        }
    }
}
