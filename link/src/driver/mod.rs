//! UDP drivers: what moves a session's frames through the kernel. The state machine never
//! sees them. Two drivers — portable (`recvmmsg`/`sendmmsg` on a non-blocking socket) and,
//! where the kernel has it, io_uring — behind one trait, an impairment layer that wraps
//! either, and runners that drive a client session or a server endpoint over a driver in
//! busy-poll or blocking mode.

mod impair;
mod portable;
mod runner;

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

pub use impair::{Impaired, Impairment};
pub use portable::PortableUdp;
pub use runner::{Clock, PollMode, ServerRunner, SessionRunner};

/// A datagram socket as a session runner uses it.
pub trait Datagrams {
    /// Queues one datagram for `to`; it leaves at the next [`Datagrams::flush`] (or sooner).
    fn send_to(&mut self, to: SocketAddr, bytes: &[u8]) -> io::Result<()>;
    /// Sends everything queued, in as few system calls as the driver can.
    fn flush(&mut self) -> io::Result<()>;
    /// Receives every datagram that is ready, without blocking; `f` sees each.
    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize>;
    /// Sleeps in the kernel until a datagram is ready or `timeout` passes.
    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()>;
    /// The bound address.
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// Which driver this is, for logs and reports.
    fn name(&self) -> &'static str;
}
