//! UDP drivers: what moves a session's frames through the kernel. The state machine never
//! sees them. Two drivers — portable (`recvmmsg`/`sendmmsg` on a non-blocking socket) and,
//! where the kernel has it, io_uring — behind one trait, an impairment layer that wraps
//! either, and runners that drive a client session or a server endpoint over a driver in
//! busy-poll or blocking mode.

mod impair;
mod offload;
mod portable;
mod runner;
mod tap;
mod uring;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub use impair::{Impaired, Impairment};
pub use offload::{MAX_SEGMENTS, MAX_UNIT_BYTES, Offload, OffloadState, gro_segments, gso_unit};
pub use portable::{PortableUdp, set_udp_gro, set_udp_segment};
pub use runner::{Clock, PollMode, ServerRunner, SessionRunner};
pub use tap::{Direction, Tap, TapFn, Tapped};
pub use uring::UringUdp;

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
}

/// A datagram socket as a session runner uses it.
pub trait Datagrams {
    /// Queues one datagram for `to`; it leaves at the next [`Datagrams::flush`] (or sooner).
    fn send_to(&mut self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.send_with(to, bytes.len(), &mut |b| {
            b[..bytes.len()].copy_from_slice(bytes);
            bytes.len()
        })
        .map(|_| ())
    }
    /// Queues one datagram for `to` written in place by `fill`, which gets up to `max` bytes
    /// and returns the length it wrote (0: nothing to send). Saves the copy `send_to` makes.
    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize>;
    /// Sends everything queued, in as few system calls as the driver can.
    fn flush(&mut self) -> io::Result<()>;
    /// Sends everything queued, then `frames` to `to`, read where they lie (a session's
    /// replay buffer, [`crate::Session::sealed`]): the kernel's copy into the socket is
    /// the only one. Returns once the kernel has read them all, so the borrow ends here.
    /// (This default copies each into the send queue; the drivers here do not.)
    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        send_copies(self, to, frames)
    }
    /// Receives every datagram that is ready, without blocking; `f` sees each.
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize>;
    /// Sleeps in the kernel until a datagram is ready or `timeout` passes.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()>;
    /// Says that the caller polls [`Datagrams::recv`] in a loop from now on, without
    /// sleeping in [`Datagrams::wait`], so the driver may receive the way that suits
    /// spinning (io_uring: single-shot receives completed inline instead of a multishot one
    /// completed through task work). A driver starts out spinning; `wait` ends it.
    fn spin(&mut self) {}
    /// Sends what a layer holding datagrams back (the impairment layer's added delay) has
    /// held until now and no longer, as a wire would deliver it, without receiving: for a
    /// loop busy with other work between its sends and receives. Nothing, and no system
    /// call, where nothing is held.
    fn release_held(&mut self) -> io::Result<()> {
        Ok(())
    }
    /// Fixes the socket's one peer (`connect`): the kernel keeps the route to it, so a send
    /// there skips the route lookup (0.5 µs of a 6.7 µs plain-socket ping-pong on this
    /// machine), and it drops datagrams from anyone else. Only for a socket that talks to
    /// `peer` alone; sends elsewhere then fail.
    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        let _ = peer;
        Ok(())
    }
    /// The bound address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// Which driver this is, for logs and reports.
    fn name(&self) -> &'static str;
    /// A descriptor that polls readable whenever [`Datagrams::recv`] has something, for a
    /// caller that waits on it beside descriptors of its own. `None` where there is none now
    /// (io_uring after [`Datagrams::wait`]: its multishot receive's completions arrive as task
    /// work, not on a descriptor); ask again before each wait.
    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// GSO and GRO as this driver uses them, with the reasons for what is off.
    fn offload(&self) -> OffloadState {
        OffloadState {
            gso_off: Some("this driver has none".into()),
            gro_off: Some("this driver has none".into()),
            ..OffloadState::default()
        }
    }
}

/// Sends `frames` to `to` through the send queue, each copied there, then flushes: the
/// [`Datagrams::send_borrowed`] of a driver that must keep its own copy.
fn send_copies<D: Datagrams + ?Sized>(d: &mut D, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
    for f in frames {
        d.send_to(to, f)?;
    }
    d.flush()
}

/// Fills `out` from the kernel's random source (`getrandom(2)`, blocking only until the pool
/// is first initialised at boot).
///
/// Straight from the kernel rather than through AWS-LC's generator: AWS-LC seeds itself once
/// a process with its CPU-jitter entropy source, 28–37 ms of one core before an endpoint could
/// make its first session ID (`perf record -F 4000` of `dxpu bench bridge --only mmio
/// --iterations 100`, three runs, 2026-12-03: 111–147 samples in `jent_*`; none since).
pub fn os_random(out: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < out.len() {
        match rustix::rand::getrandom(&mut out[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A generator seeded with the kernel's random bytes ([`os_random`]), or `None` if it has
/// none to give. (Here, not in the sans-IO `auth`: the state machine takes its generator
/// as an argument and never asks the OS.)
pub fn rng_from_os() -> Option<crate::Rng> {
    let mut seed = [0u8; 32];
    os_random(&mut seed).ok()?;
    Some(crate::Rng::new(seed))
}

/// A generator seeded from the OS ([`rng_from_os`]), for session IDs, nonces and
/// epochs. If the OS has none to give, the clock and process ID seed it (and it says so
/// through `log`).
pub fn os_rng(log: &mut dyn FnMut(&str)) -> crate::Rng {
    match rng_from_os() {
        Some(r) => r,
        None => {
            log("the operating system gave no random bytes; seeding from the clock and process ID");
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            crate::Rng::from_u64(t ^ (std::process::id() as u64) << 32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// The kernel's bytes fill a buffer of any length — empty, one byte, more than the 256
    /// that one `getrandom` call is guaranteed to return whole — and two draws differ.
    #[test]
    fn os_random_fills_every_length() {
        os_random(&mut []).unwrap();
        for n in [1usize, 32, 257, 1 << 20] {
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            os_random(&mut a).unwrap();
            os_random(&mut b).unwrap();
            if n >= 32 {
                assert_ne!(a, b, "two draws of {n} bytes were equal");
                // The last bytes were written too (a short read not retried would leave zeros).
                assert!(a[n - 32..].iter().any(|&x| x != 0), "the tail of {n} bytes stayed zero");
            }
        }
        assert!(rng_from_os().is_some());
    }

    /// Receives until `want` datagrams came or a second passed.
    fn collect(d: &mut dyn Datagrams, want: usize) -> Vec<(SocketAddr, Vec<u8>)> {
        let mut got = Vec::new();
        let end = Instant::now() + Duration::from_secs(1);
        while got.len() < want && Instant::now() < end {
            d.recv(&mut |from, b| got.push((from, b.to_vec()))).unwrap();
        }
        // Anything beyond `want` would show here.
        std::thread::sleep(Duration::from_millis(20));
        d.recv(&mut |from, b| got.push((from, b.to_vec()))).unwrap();
        got
    }

    /// A connected socket sends to its peer without an address, one datagram or a batch (a
    /// datagram for another address among them still reaches it), says its peer as the source
    /// of what it receives, and hears no one else.
    fn connected_socket_talks_to_its_peer_alone(kind: DriverKind) {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut a = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let mut b = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let stranger = std::net::UdpSocket::bind(local).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        a.connect(ba).unwrap();
        a.send_to(ba, b"one").unwrap();
        a.flush().unwrap();
        // A batch with one datagram for someone else in the middle: it keeps its address.
        let mut other = AnyUdp::bind(local, DriverKind::Portable, &mut |_| {}).unwrap();
        let oa = other.local_addr().unwrap();
        for i in 0..5u8 {
            a.send_to(ba, &[i; 40]).unwrap();
            if i == 2 {
                a.send_to(oa, b"elsewhere").unwrap();
            }
        }
        a.flush().unwrap();
        assert_eq!(collect(&mut other, 1), vec![(aa, b"elsewhere".to_vec())], "{kind:?}");
        let got = collect(&mut b, 6);
        assert_eq!(got.len(), 6, "{kind:?}");
        assert!(got.iter().all(|(from, _)| *from == aa));
        assert_eq!(got[0].1, b"one");
        assert_eq!(got[5].1, [4u8; 40]);
        stranger.send_to(b"not for you", aa).unwrap();
        for i in 0..3u8 {
            b.send_to(aa, &[i; 8]).unwrap();
        }
        b.flush().unwrap();
        let got = collect(&mut a, 3);
        assert_eq!(got, (0..3u8).map(|i| (ba, vec![i; 8])).collect::<Vec<_>>(), "{kind:?}");
    }

    /// Frames sent where they lie follow the datagrams queued before them, in order, one
    /// datagram each, to a connected peer or not; the caller may change them at once.
    fn borrowed_frames_follow_the_queued_ones(kind: DriverKind) {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let mut a = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let mut b = AnyUdp::bind(local, kind, &mut |_| {}).unwrap();
        let ba = b.local_addr().unwrap();
        for connected in [false, true] {
            if connected {
                a.connect(ba).unwrap();
            }
            let mut frames: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100 + i as usize]).collect();
            a.send_to(ba, b"queued first").unwrap();
            let refs: Vec<&[u8]> = frames.iter().map(|f| &f[..]).collect();
            a.send_borrowed(ba, &refs).unwrap();
            // The kernel has read them: overwriting changes nothing that was sent.
            for f in &mut frames {
                f.fill(0xee);
            }
            let got = collect(&mut b, 41);
            assert_eq!(got.len(), 41, "{kind:?}, connected {connected}");
            assert_eq!(got[0].1, b"queued first");
            for (i, (_, bytes)) in got[1..].iter().enumerate() {
                assert_eq!(bytes, &vec![i as u8; 100 + i], "{kind:?}, connected {connected}");
            }
        }
    }

    #[test]
    fn borrowed_frames_follow_the_queued_ones_portable() {
        borrowed_frames_follow_the_queued_ones(DriverKind::Portable);
    }

    #[test]
    fn borrowed_frames_follow_the_queued_ones_io_uring() {
        if let Err(e) = UringUdp::probe() {
            eprintln!("skipping: io_uring unavailable here ({e})");
            return;
        }
        borrowed_frames_follow_the_queued_ones(DriverKind::IoUring);
    }

    #[test]
    fn connected_portable_socket_talks_to_its_peer_alone() {
        connected_socket_talks_to_its_peer_alone(DriverKind::Portable);
    }

    #[test]
    fn connected_io_uring_socket_talks_to_its_peer_alone() {
        if let Err(e) = UringUdp::probe() {
            eprintln!("skipping: io_uring unavailable here ({e})");
            return;
        }
        connected_socket_talks_to_its_peer_alone(DriverKind::IoUring);
    }
}
