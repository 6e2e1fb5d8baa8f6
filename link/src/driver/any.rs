//! The driver chosen at start-up: io_uring where the kernel has it, portable otherwise.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::datagrams::Datagrams;
use super::offload::{Offload, OffloadState};
use super::portable::PortableUdp;
use super::uring::UringUdp;

/// Which driver to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DriverKind {
    /// io_uring if the kernel has it, else portable (with a log line saying why).
    Auto,
    /// io_uring, or fail.
    IoUring,
    /// Non-blocking sockets with recvmmsg/sendmmsg.
    Portable,
}

/// A driver chosen at start-up.
pub enum AnyUdp {
    /// io_uring.
    Uring(Box<UringUdp>),
    /// Portable.
    Portable(Box<PortableUdp>),
}

/// How long a bind waits for a port still in use to be freed.
pub const PORT_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl AnyUdp {
    /// Binds a socket with the chosen driver. `Auto` probes io_uring and falls back to the
    /// portable driver, reporting why through `log`.
    pub fn bind(addr: SocketAddr, kind: DriverKind, log: &mut dyn FnMut(&str)) -> io::Result<AnyUdp> {
        AnyUdp::bind_with(addr, kind, Offload::AUTO, log)
    }

    /// [`AnyUdp::bind`] with the offloads `offload` asks for; the log line says which are
    /// in use and why any is not.
    ///
    /// A port still in use is waited for, up to [`PORT_WAIT`], saying so: a process killed
    /// a moment ago (SIGKILL, no chance to cancel its io_uring requests) holds its port until
    /// it has exited and the kernel has torn its ring down — a restart at once found it taken
    /// every time.
    pub fn bind_with(
        addr: SocketAddr,
        kind: DriverKind,
        offload: Offload,
        log: &mut dyn FnMut(&str),
    ) -> io::Result<AnyUdp> {
        let deadline = std::time::Instant::now() + PORT_WAIT;
        let mut said = false;
        loop {
            match AnyUdp::bind_once(addr, kind, offload, log) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                    if !said {
                        said = true;
                        log(&format!(
                            "{addr} is in use; waiting up to {PORT_WAIT:?} for it to be freed (an endpoint stopped a moment ago holds it until it has exited)"
                        ));
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                r => return r,
            }
        }
    }

    fn bind_once(
        addr: SocketAddr,
        kind: DriverKind,
        offload: Offload,
        log: &mut dyn FnMut(&str),
    ) -> io::Result<AnyUdp> {
        let udp = match kind {
            DriverKind::Portable => AnyUdp::Portable(Box::new(PortableUdp::bind_with(addr, offload)?)),
            DriverKind::IoUring => AnyUdp::Uring(Box::new(UringUdp::bind_with(addr, offload)?)),
            DriverKind::Auto => match UringUdp::bind_with(addr, offload) {
                // The port, not io_uring: no reason to fall back.
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => return Err(e),
                Ok(u) => {
                    log(
                        "link driver: io_uring (multishot RecvMsg into a provided buffer ring when sleeping, single-shot MSG_DONTWAIT RecvMsg when spinning, batched Send)",
                    );
                    AnyUdp::Uring(Box::new(u))
                }
                Err(e) => {
                    log(&format!(
                        "link driver: portable (recvmmsg/sendmmsg), because io_uring set-up failed: {e}"
                    ));
                    AnyUdp::Portable(Box::new(PortableUdp::bind_with(addr, offload)?))
                }
            },
        };
        log(&format!("link driver {}: {}", udp.name(), udp.offload().describe()));
        Ok(udp)
    }
}

impl Datagrams for AnyUdp {
    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        match self {
            AnyUdp::Uring(u) => u.send_with(to, max, fill),
            AnyUdp::Portable(p) => p.send_with(to, max, fill),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            AnyUdp::Uring(u) => u.flush(),
            AnyUdp::Portable(p) => p.flush(),
        }
    }
    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        match self {
            AnyUdp::Uring(u) => u.send_borrowed(to, frames),
            AnyUdp::Portable(p) => p.send_borrowed(to, frames),
        }
    }
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        match self {
            AnyUdp::Uring(u) => u.recv(f),
            AnyUdp::Portable(p) => p.recv(f),
        }
    }
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            AnyUdp::Uring(u) => u.wait(timeout),
            AnyUdp::Portable(p) => p.wait(timeout),
        }
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            AnyUdp::Uring(u) => u.local_addr(),
            AnyUdp::Portable(p) => p.local_addr(),
        }
    }
    fn name(&self) -> &'static str {
        match self {
            AnyUdp::Uring(u) => u.name(),
            AnyUdp::Portable(p) => p.name(),
        }
    }
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        match self {
            AnyUdp::Uring(u) => u.poll_fd(),
            AnyUdp::Portable(p) => p.poll_fd(),
        }
    }
    fn spin(&mut self) {
        match self {
            AnyUdp::Uring(u) => u.spin(),
            AnyUdp::Portable(p) => p.spin(),
        }
    }
    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        match self {
            AnyUdp::Uring(u) => u.connect(peer),
            AnyUdp::Portable(p) => p.connect(peer),
        }
    }
    fn offload(&self) -> OffloadState {
        match self {
            AnyUdp::Uring(u) => u.offload(),
            AnyUdp::Portable(p) => p.offload(),
        }
    }
    fn too_large(&self) -> u64 {
        match self {
            AnyUdp::Uring(u) => u.too_large(),
            AnyUdp::Portable(p) => p.too_large(),
        }
    }
    fn port_unreachable(&self) -> u64 {
        match self {
            AnyUdp::Uring(u) => u.port_unreachable(),
            AnyUdp::Portable(p) => p.port_unreachable(),
        }
    }
}
