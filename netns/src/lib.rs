//! Two network namespaces joined by a veth pair: the link's and the endpoints' tests run a
//! peer in each to cross a real network device (veth) instead of loopback. Creating them
//! needs `ip` (iproute2) and the privilege to add namespaces; [`Netns::create`] says why
//! when it cannot, so that a test can skip with that reason.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::process::Command;

/// Namespaces `dxpu-<tag>-a` and `dxpu-<tag>-b`, joined by veth `v<tag>a` / `v<tag>b` with
/// addresses `<subnet>.1` (a) and `<subnet>.2` (b) in a /24. Removed on drop.
#[derive(Debug)]
pub struct Netns {
    /// The first namespace's name.
    pub a: String,
    /// The second namespace's name.
    pub b: String,
    subnet: [u8; 3],
}

/// Why the pair could not be made.
#[derive(Debug)]
pub enum NetnsError {
    /// `ip` could not be run (iproute2 missing).
    NoIp(io::Error),
    /// An `ip` command failed: its arguments and what it said.
    Ip {
        /// The command's arguments.
        args: String,
        /// Its standard error.
        said: String,
    },
}

impl std::fmt::Display for NetnsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NetnsError::NoIp(e) => write!(f, "ip: {e}"),
            NetnsError::Ip { args, said } => write!(f, "ip {args}: {said}"),
        }
    }
}

impl std::error::Error for NetnsError {}

impl Netns {
    /// Creates the pair (replacing namespaces of the same names left by an earlier run).
    /// `tag` keeps concurrent tests apart and must leave interface names within 15 bytes.
    pub fn create(tag: &str, subnet: [u8; 3]) -> Result<Netns, NetnsError> {
        let a = format!("dxpu-{tag}-a");
        let b = format!("dxpu-{tag}-b");
        let ip = |args: &str| -> Result<(), NetnsError> {
            let out = Command::new("ip").args(args.split_whitespace()).output().map_err(NetnsError::NoIp)?;
            if out.status.success() {
                Ok(())
            } else {
                Err(NetnsError::Ip {
                    args: args.to_string(),
                    said: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                })
            }
        };
        let _ = ip(&format!("netns del {a}"));
        let _ = ip(&format!("netns del {b}"));
        ip(&format!("netns add {a}"))?;
        // From here on, dropping `ns` removes what was created.
        let ns = Netns { a: a.clone(), b: b.clone(), subnet };
        ip(&format!("netns add {b}"))?;
        let (va, vb) = (format!("v{tag}a"), format!("v{tag}b"));
        ip(&format!("link add {va} netns {a} type veth peer name {vb} netns {b}"))?;
        for (name, dev, addr) in [(&a, &va, ns.addr_a()), (&b, &vb, ns.addr_b())] {
            ip(&format!("-n {name} addr add {addr}/24 dev {dev}"))?;
            ip(&format!("-n {name} link set {dev} up"))?;
            ip(&format!("-n {name} link set lo up"))?;
        }
        Ok(ns)
    }

    /// The address in namespace `a`.
    pub fn addr_a(&self) -> Ipv4Addr {
        let [x, y, z] = self.subnet;
        Ipv4Addr::new(x, y, z, 1)
    }

    /// The address in namespace `b`.
    pub fn addr_b(&self) -> Ipv4Addr {
        let [x, y, z] = self.subnet;
        Ipv4Addr::new(x, y, z, 2)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

/// Moves the calling thread (only it) into the named network namespace: sockets it opens
/// afterwards belong there.
pub fn enter(name: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/var/run/netns/{name}"))
        .map_err(|e| io::Error::new(e.kind(), format!("namespace {name}: {e}")))?;
    // SAFETY: setns with a namespace descriptor this function holds open; it changes the
    // network namespace of the calling thread and nothing else.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("setns {name}: {e}")));
    }
    Ok(())
}
