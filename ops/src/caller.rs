//! Who is at the other end of a control connection: the process the kernel names
//! (`SO_PEERCRED`), described from `/proc` and `/etc/passwd`, for the audit trail.

use std::os::unix::net::UnixStream;

/// The process at the other end of a control connection, as the kernel names it
/// (`SO_PEERCRED`, taken when it connected) and `/proc` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Its user ID.
    pub uid: u32,
    /// Its user's name, where `/etc/passwd` has one.
    pub user: Option<String>,
    /// Its process ID.
    pub pid: i32,
    /// Its command line (at most 120 bytes), where `/proc` still has it.
    pub command: Option<String>,
}

impl Caller {
    /// The peer of `stream`, if the kernel says.
    pub fn of(stream: &UnixStream) -> Option<Caller> {
        let cred = rustix::net::sockopt::socket_peercred(stream).ok()?;
        let (uid, pid) = (cred.uid.as_raw(), cred.pid.as_raw_nonzero().get());
        let command = std::fs::read(format!("/proc/{pid}/cmdline")).ok().map(|raw| {
            let mut s: String = String::from_utf8_lossy(&raw)
                .trim_end_matches('\0')
                .replace('\0', " ")
                .chars()
                .take(120)
                .collect();
            if raw.len() > 120 {
                s.push('…');
            }
            s
        });
        Some(Caller { uid, user: user_name(uid), pid, command })
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {}", self.uid)?;
        if let Some(u) = &self.user {
            write!(f, " ({u})")?;
        }
        write!(f, " pid {}", self.pid)?;
        if let Some(c) = &self.command {
            write!(f, " ({c})")?;
        }
        Ok(())
    }
}

/// The name `/etc/passwd` gives `uid`.
pub fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        (f.nth(1)?.parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The peer of a socket is named by the kernel: here, this very process.
    #[test]
    fn a_callers_uid_pid_and_command_come_from_the_kernel_and_proc() {
        let (a, _b) = UnixStream::pair().unwrap();
        let c = Caller::of(&a).unwrap();
        assert_eq!((c.uid, c.pid), (rustix::process::getuid().as_raw(), std::process::id() as i32));
        let said = c.to_string();
        assert!(
            said.starts_with(&format!("uid {} ", c.uid)) && said.contains(&format!("pid {}", c.pid)),
            "{said}"
        );
        assert!(c.command.is_some_and(|cmd| !cmd.is_empty() && cmd.len() <= 124), "{said}");
    }
}
