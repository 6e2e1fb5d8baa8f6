//! The one trait every driver is behind: a datagram socket as a session runner uses it.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::offload::OffloadState;

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
    /// Fixes the socket's one peer (`connect`): the kernel keeps the route to it, so a send
    /// there skips the route lookup (0.5 µs of a 6.7 µs plain-socket ping-pong on this
    /// machine), and it drops datagrams from anyone else. Only for a socket that talks to
    /// `peer` alone; sends elsewhere then fail.
    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        let _ = peer;
        Ok(())
    }
    /// Datagrams refused so far as larger than the path carries whole
    /// ([`OffloadState::too_large`]), without the rest of the state: cheap enough to look
    /// at on every pass.
    fn too_large(&self) -> u64 {
        0
    }
    /// ICMP "port unreachable" heard so far ([`OffloadState::port_unreachable`]).
    fn port_unreachable(&self) -> u64 {
        0
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
pub(crate) fn send_copies<D: Datagrams + ?Sized>(
    d: &mut D,
    to: SocketAddr,
    frames: &[&[u8]],
) -> io::Result<()> {
    for f in frames {
        d.send_to(to, f)?;
    }
    d.flush()
}
