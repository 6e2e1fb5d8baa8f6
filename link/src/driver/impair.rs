//! An impairment layer any driver can wear: seeded loss, duplication, reordering (jitter),
//! corruption (bit flips), added one-way delay and a rate limit. It is how tests and
//! `dxpu loopback` emulate a real network, since this kernel has no netem.
//!
//! It acts on what the endpoint receives: a datagram is sent at once, in the sender's own
//! call, and held on arrival until the path would have delivered it. Held at the sender
//! instead (as it was until 2026-12-07), a delayed datagram's send — a system call — left at
//! a later poll, off the sending thread's critical path, so any added delay made sends free
//! to their caller where a real network (or netem, whose qdisc queues the datagram inside
//! the sender's call) charges them at once (docs/performance-model.md).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::Datagrams;

/// What the path does to the datagrams an endpoint receives.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairment {
    /// Fraction of datagrams dropped.
    pub loss: f64,
    /// Fraction of datagrams delivered twice.
    pub duplicate: f64,
    /// Fraction of datagrams with one bit flipped.
    pub corrupt: f64,
    /// Added one-way delay.
    pub delay: Duration,
    /// Extra random delay, uniform in 0..=jitter (reorders datagrams).
    pub jitter: Duration,
    /// Bytes per second (0: unlimited).
    pub rate: u64,
    /// Seed of the generator.
    pub seed: u64,
}

impl Impairment {
    /// No impairment at all.
    pub fn is_none(&self) -> bool {
        self.loss == 0.0
            && self.duplicate == 0.0
            && self.corrupt == 0.0
            && self.delay.is_zero()
            && self.jitter.is_zero()
            && self.rate == 0
    }
}

type Held = Reverse<(Instant, u64, SocketAddr, Vec<u8>)>;

/// A driver with impairments applied to what it receives.
pub struct Impaired<D> {
    inner: D,
    imp: Impairment,
    state: u64,
    /// Datagrams arrived and not yet delivered, by when the path delivers them.
    held: BinaryHeap<Held>,
    order: u64,
    rate_free_at: Instant,
    /// Datagrams just taken from the socket, before the path acts on them.
    arrived: Vec<(SocketAddr, Vec<u8>)>,
    /// Buffers of datagrams delivered, for the next arrivals.
    spare: Vec<Vec<u8>>,
    /// Datagrams dropped by the layer.
    pub dropped: u64,
    /// Datagrams delivered twice.
    pub duplicated: u64,
    /// Datagrams corrupted.
    pub corrupted: u64,
}

impl<D: Datagrams> Impaired<D> {
    /// Wraps `inner`.
    pub fn new(inner: D, imp: Impairment) -> Impaired<D> {
        Impaired {
            inner,
            imp,
            state: imp.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            held: BinaryHeap::new(),
            order: 0,
            rate_free_at: Instant::now(),
            arrived: Vec::new(),
            spare: Vec::new(),
            dropped: 0,
            duplicated: 0,
            corrupted: 0,
        }
    }

    /// The wrapped driver.
    pub fn inner(&mut self) -> &mut D {
        &mut self.inner
    }

    fn next(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// What the path does to one datagram that arrived at `now`: dropped, or held (once or
    /// twice, maybe with a bit flipped) until it would be delivered.
    fn on_arrival(&mut self, now: Instant, from: SocketAddr, mut b: Vec<u8>) {
        if self.chance(self.imp.loss) {
            self.dropped += 1;
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(b);
            }
            return;
        }
        let copies = if self.chance(self.imp.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        if !b.is_empty() && self.chance(self.imp.corrupt) {
            let i = (self.next() % b.len() as u64) as usize;
            b[i] ^= 1 << (self.next() % 8);
            self.corrupted += 1;
        }
        for copy in 0..copies {
            let b = if copy + 1 == copies { std::mem::take(&mut b) } else { b.clone() };
            let jitter = if self.imp.jitter.is_zero() {
                0
            } else {
                self.next() % (self.imp.jitter.as_nanos() as u64 + 1)
            };
            let mut at = now + self.imp.delay + Duration::from_nanos(jitter);
            if let Some(ns) = (b.len() as u64 * 1_000_000_000).checked_div(self.imp.rate) {
                // Serialized at the configured rate: each datagram arrives after the previous.
                let start = self.rate_free_at.max(now);
                self.rate_free_at = start + Duration::from_nanos(ns);
                at = at.max(self.rate_free_at);
            }
            self.order += 1;
            self.held.push(Reverse((at, self.order, from, b)));
        }
    }

    /// When the next held datagram is delivered, if one is held.
    fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|Reverse((t, ..))| *t)
    }
}

/// Buffers the layer keeps for the datagrams it holds, at most.
const SPARE_BUFFERS: usize = 4096;

impl<D: Datagrams> Datagrams for Impaired<D> {
    fn send_to(&mut self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.inner.send_to(to, bytes)
    }

    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        self.inner.send_with(to, max, fill)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        self.inner.send_borrowed(to, frames)
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        if self.imp.is_none() {
            return self.inner.recv(f);
        }
        // What the socket has, each into a buffer of the layer's own (the path acts on it).
        let mut arrived = std::mem::take(&mut self.arrived);
        let spare = &mut self.spare;
        let got = self.inner.recv(&mut |from, bytes| {
            let mut b = spare.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(bytes);
            arrived.push((from, b));
        });
        let now = Instant::now();
        for (from, b) in arrived.drain(..) {
            self.on_arrival(now, from, b);
        }
        self.arrived = arrived;
        // What the path delivers by now, in the order it delivers it.
        let mut delivered = 0;
        while self.next_due().is_some_and(|t| t <= now) {
            if let Some(Reverse((_, _, from, b))) = self.held.pop() {
                f(from, &b);
                delivered += 1;
                if self.spare.len() < SPARE_BUFFERS {
                    self.spare.push(b);
                }
            }
        }
        // An error receiving, once what was held is delivered.
        got.map(|_| delivered)
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        // Held datagrams are delivered on a timer, not on a descriptor.
        if self.imp.is_none() { self.inner.poll_fd() } else { None }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let next = self.next_due().map(|t| t.saturating_duration_since(Instant::now()));
        if next.is_some_and(|n| n.is_zero()) {
            // One is deliverable now: no sleep.
            return Ok(());
        }
        let t = match (timeout, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.inner.wait(t)
    }

    fn spin(&mut self) {
        self.inner.spin();
    }

    fn connect(&mut self, peer: SocketAddr) -> io::Result<()> {
        self.inner.connect(peer)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn offload(&self) -> super::OffloadState {
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

    /// A driver whose socket holds `queue` (source, bytes) and records what it is asked to
    /// send.
    #[derive(Default)]
    struct Fake {
        queue: Vec<(SocketAddr, Vec<u8>)>,
        sent: Vec<(SocketAddr, Vec<u8>)>,
    }

    impl Datagrams for Fake {
        fn send_with(
            &mut self,
            to: SocketAddr,
            max: usize,
            fill: &mut dyn FnMut(&mut [u8]) -> usize,
        ) -> io::Result<usize> {
            let mut b = vec![0u8; max];
            let n = fill(&mut b);
            b.truncate(n);
            self.sent.push((to, b));
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
            let n = self.queue.len();
            for (from, b) in self.queue.drain(..) {
                f(from, &b);
            }
            Ok(n)
        }
        fn wait(&mut self, _timeout: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 1)))
        }
        fn name(&self) -> &'static str {
            "fake"
        }
    }

    fn from(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn take(l: &mut Impaired<Fake>) -> Vec<usize> {
        let mut got = Vec::new();
        l.recv(&mut |_, b| got.push(usize::from_be_bytes(b.try_into().unwrap()))).unwrap();
        got
    }

    #[test]
    fn a_send_leaves_at_once_and_an_arrival_is_delivered_after_the_delay_in_order() {
        let delay = Duration::from_millis(20);
        let mut l = Impaired::new(Fake::default(), Impairment { delay, ..Impairment::default() });
        // The sender pays its send in its own call, whatever the delay.
        l.send_to(from(9), b"now").unwrap();
        assert_eq!(l.inner().sent, [(from(9), b"now".to_vec())]);
        l.inner().queue = (0..100usize).map(|i| (from(10), i.to_be_bytes().to_vec())).collect();
        let t = Instant::now();
        assert!(take(&mut l).is_empty(), "nothing is delivered before the delay");
        assert_eq!(l.poll_fd(), None, "held datagrams come on a timer");
        std::thread::sleep(delay.saturating_sub(t.elapsed()) + Duration::from_millis(2));
        assert_eq!(take(&mut l), (0..100).collect::<Vec<_>>(), "every datagram once, in order");
        assert!(take(&mut l).is_empty());
        // The buffers come back for the next arrivals.
        assert_eq!(l.spare.len(), 100);
    }

    #[test]
    fn loss_duplication_and_the_rate_act_on_arrivals() {
        let lossy = Impairment { loss: 0.5, seed: 7, ..Impairment::default() };
        let mut l = Impaired::new(Fake::default(), lossy);
        l.inner().queue = (0..1000usize).map(|i| (from(10), i.to_be_bytes().to_vec())).collect();
        let got = take(&mut l);
        assert_eq!(got.len() as u64 + l.dropped, 1000);
        assert!((400..600).contains(&got.len()), "{}", got.len());
        let twice = Impairment { duplicate: 1.0, ..Impairment::default() };
        let mut l = Impaired::new(Fake::default(), twice);
        l.inner().queue = vec![(from(10), 5usize.to_be_bytes().to_vec())];
        assert_eq!(take(&mut l), [5, 5]);
        // 1,000 bytes at 100 kB/s: one every 10 ms, the first after 10 ms.
        let slow = Impairment { rate: 100_000, ..Impairment::default() };
        let mut l = Impaired::new(Fake::default(), slow);
        l.inner().queue = (0..3usize).map(|i| (from(10), [i as u8; 1000].to_vec())).collect();
        let mut n = 0;
        l.recv(&mut |_, _| n += 1).unwrap();
        assert_eq!(n, 0);
        std::thread::sleep(Duration::from_millis(22));
        l.recv(&mut |_, _| n += 1).unwrap();
        assert_eq!(n, 2, "two of three delivered after 22 ms at the rate");
    }
}
