//! A tap any driver can wear: every datagram sent and received is shown to a [`Tap`] (a
//! packet capture) with its addresses, as it leaves for the socket and as it comes from it.
//! Without a tap it forwards and costs one branch per call.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::{Datagrams, OffloadState};

/// Which way a datagram went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Sent by this endpoint.
    Sent,
    /// Received by it.
    Received,
}

/// What a tap is told: the direction, this side's address, the other side's, the bytes.
pub type TapFn = dyn Fn(Direction, SocketAddr, SocketAddr, &[u8]) + Send + Sync;

/// A shared tap (a capture file's writer, behind whatever queue it keeps).
#[derive(Clone)]
pub struct Tap(pub Arc<TapFn>);

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Tap")
    }
}

/// A driver whose datagrams a [`Tap`] sees.
pub struct Tapped<D> {
    inner: D,
    tap: Option<Tap>,
    local: SocketAddr,
}

impl<D: Datagrams> Tapped<D> {
    /// Wraps `inner`; `tap` sees its datagrams, if given.
    pub fn new(inner: D, tap: Option<Tap>) -> Tapped<D> {
        let local = inner.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        Tapped { inner, tap, local }
    }

    /// The wrapped driver.
    pub fn inner(&mut self) -> &mut D {
        &mut self.inner
    }

    /// The wrapped driver, to read.
    pub fn get(&self) -> &D {
        &self.inner
    }
}

impl<D: Datagrams> Datagrams for Tapped<D> {
    fn send_to(&mut self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if let Some(t) = &self.tap {
            (t.0)(Direction::Sent, self.local, to, bytes);
        }
        self.inner.send_to(to, bytes)
    }

    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        let Some(t) = self.tap.clone() else { return self.inner.send_with(to, max, fill) };
        let local = self.local;
        self.inner.send_with(to, max, &mut |buf: &mut [u8]| {
            let n = fill(buf);
            (t.0)(Direction::Sent, local, to, &buf[..n.min(buf.len())]);
            n
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        if let Some(t) = &self.tap {
            for f in frames {
                (t.0)(Direction::Sent, self.local, to, f);
            }
        }
        self.inner.send_borrowed(to, frames)
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        let Some(t) = self.tap.clone() else { return self.inner.recv(f) };
        let local = self.local;
        self.inner.recv(&mut |from, bytes| {
            (t.0)(Direction::Received, local, from, bytes);
            f(from, bytes)
        })
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.inner.wait(timeout)
    }

    fn spin(&mut self) {
        self.inner.spin();
    }

    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        self.inner.connect(peer)?;
        // Connected, the socket has its own address toward the peer (not 0.0.0.0).
        if let Ok(a) = self.inner.local_addr() {
            self.local = a;
        }
        Ok(())
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.poll_fd()
    }

    fn offload(&self) -> OffloadState {
        self.inner.offload()
    }

    fn too_large(&self) -> u64 {
        self.inner.too_large()
    }

    fn port_unreachable(&self) -> u64 {
        self.inner.port_unreachable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{AnyUdp, DriverKind};
    use std::sync::Mutex;

    #[test]
    fn a_tap_sees_every_datagram_both_ways() {
        type Seen = Vec<(Direction, SocketAddr, Vec<u8>)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let s2 = seen.clone();
        let tap =
            Tap(Arc::new(move |d, _local, peer, b: &[u8]| s2.lock().unwrap().push((d, peer, b.to_vec()))));
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let a = AnyUdp::bind(any, DriverKind::Portable, &mut |_| {}).unwrap();
        let mut a = Tapped::new(a, Some(tap));
        let mut b = AnyUdp::bind(any, DriverKind::Portable, &mut |_| {}).unwrap();
        let (aa, ba) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        a.send_to(ba, b"one").unwrap();
        a.send_borrowed(ba, &[b"two", b"three"]).unwrap();
        a.send_with(ba, 64, &mut |buf| {
            buf[..4].copy_from_slice(b"four");
            4
        })
        .unwrap();
        a.flush().unwrap();
        let mut got = 0;
        for _ in 0..200 {
            got += b.recv(&mut |_, _| {}).unwrap();
            if got == 4 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        b.send_to(aa, b"back").unwrap();
        b.flush().unwrap();
        for _ in 0..200 {
            if a.recv(&mut |_, _| {}).unwrap() > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let seen = seen.lock().unwrap();
        let words: Vec<(Direction, &[u8])> = seen.iter().map(|(d, _, b)| (*d, b.as_slice())).collect();
        assert_eq!(
            words,
            vec![
                (Direction::Sent, &b"one"[..]),
                (Direction::Sent, &b"two"[..]),
                (Direction::Sent, &b"three"[..]),
                (Direction::Sent, &b"four"[..]),
                (Direction::Received, &b"back"[..]),
            ]
        );
        assert!(seen.iter().all(|(_, p, _)| *p == ba), "every datagram's peer is the other socket");
    }
}
