//! An impairment layer any driver can wear: seeded loss, duplication, reordering (jitter),
//! corruption (bit flips), added one-way delay and a rate limit. It is how tests and
//! `dxpu loopback` emulate a real network, since this kernel has no netem. It acts on the
//! sending side.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::Datagrams;

/// What to do to outgoing datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Impairment {
    /// Fraction of datagrams dropped.
    pub loss: f64,
    /// Fraction of datagrams sent twice.
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

/// A driver with impairments applied to what it sends.
pub struct Impaired<D> {
    inner: D,
    imp: Impairment,
    state: u64,
    held: BinaryHeap<Held>,
    order: u64,
    rate_free_at: Instant,
    scratch: Vec<u8>,
    /// Datagrams due now, on their way out together.
    due: Vec<(SocketAddr, Vec<u8>)>,
    /// Buffers of datagrams sent, for the next held ones.
    spare: Vec<Vec<u8>>,
    /// Datagrams dropped, duplicated, corrupted by the layer.
    pub dropped: u64,
    /// Datagrams sent twice.
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
            scratch: Vec::new(),
            due: Vec::new(),
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

    /// Sends the held datagrams that are due: those to one destination in one borrowed
    /// send, segmented by the driver (UDP GSO) as the link's own sends are. (Sent one by one,
    /// a delayed link carried bulk DMA at 1.4 GB/s where an undelayed one carried 2.4.)
    fn release_due(&mut self) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        while self.held.peek().is_some_and(|Reverse((t, ..))| *t <= now) {
            if let Some(Reverse((_, _, to, b))) = self.held.pop() {
                self.due.push((to, b));
            }
        }
        let mut result = Ok(());
        let mut i = 0;
        // The frames of one send, borrowed in place: no allocation per release.
        let mut frames: [&[u8]; RELEASE_BATCH] = [&[]; RELEASE_BATCH];
        while i < self.due.len() {
            let to = self.due[i].0;
            let mut n = 0;
            while n < RELEASE_BATCH && self.due.get(i + n).is_some_and(|(t, _)| *t == to) {
                frames[n] = &self.due[i + n].1;
                n += 1;
            }
            if let Err(e) = self.inner.send_borrowed(to, &frames[..n]) {
                result = Err(e);
                break;
            }
            i += n;
        }
        for (_, b) in self.due.drain(..) {
            if self.spare.len() < SPARE_BUFFERS {
                self.spare.push(b);
            }
        }
        result?;
        self.inner.flush()
    }
}

/// Datagrams released in one borrowed send at most: what one GSO send carries.
const RELEASE_BATCH: usize = super::MAX_SEGMENTS;

/// Buffers the layer keeps for datagrams it holds, at most.
const SPARE_BUFFERS: usize = 4096;

impl<D: Datagrams> Datagrams for Impaired<D> {
    fn send_to(&mut self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if self.imp.is_none() {
            return self.inner.send_to(to, bytes);
        }
        if self.chance(self.imp.loss) {
            self.dropped += 1;
            return Ok(());
        }
        let copies = if self.chance(self.imp.duplicate) {
            self.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(bytes);
            if !b.is_empty() && self.chance(self.imp.corrupt) {
                let i = (self.next() % b.len() as u64) as usize;
                b[i] ^= 1 << (self.next() % 8);
                self.corrupted += 1;
            }
            let jitter = if self.imp.jitter.is_zero() {
                0
            } else {
                self.next() % (self.imp.jitter.as_nanos() as u64 + 1)
            };
            let mut at = Instant::now() + self.imp.delay + Duration::from_nanos(jitter);
            if let Some(ns) = (b.len() as u64 * 1_000_000_000).checked_div(self.imp.rate) {
                // Serialize at the configured rate: each datagram leaves after the previous.
                let tx = Duration::from_nanos(ns);
                let start = self.rate_free_at.max(Instant::now());
                self.rate_free_at = start + tx;
                at = at.max(self.rate_free_at);
            }
            if at <= Instant::now() {
                self.inner.send_to(to, &b)?;
                self.spare.push(b);
            } else {
                self.order += 1;
                self.held.push(Reverse((at, self.order, to, b)));
            }
        }
        Ok(())
    }

    fn send_with(
        &mut self,
        to: SocketAddr,
        max: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> io::Result<usize> {
        if self.imp.is_none() {
            // Nothing to impair: no copy, no delay.
            return self.inner.send_with(to, max, fill);
        }
        // The impairment layer may hold or alter the datagram: it needs its own copy anyway.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(max, 0);
        let n = fill(&mut scratch).min(max);
        if n > 0 {
            self.send_to(to, &scratch[..n])?;
        }
        self.scratch = scratch;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()?;
        self.release_due()
    }

    fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
        if self.imp.is_none() {
            return self.inner.send_borrowed(to, frames);
        }
        // Frames the layer may hold or alter get copies of their own.
        super::send_copies(self, to, frames)
    }

    fn recv(&mut self, f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
        self.release_due()?;
        self.inner.recv(f)
    }

    fn poll_fd(&self) -> Option<std::os::fd::RawFd> {
        // Delayed datagrams leave on a timer, not on a descriptor.
        if self.imp.is_none() { self.inner.poll_fd() } else { None }
    }

    fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let next = self.held.peek().map(|Reverse((t, ..))| t.saturating_duration_since(Instant::now()));
        let t = match (timeout, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.inner.wait(t)?;
        self.release_due()
    }

    fn spin(&mut self) {
        self.inner.spin();
    }

    fn release_held(&mut self) -> io::Result<()> {
        self.release_due()
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

    /// A driver that records what it is asked to send: each borrowed send's destination and
    /// frames, and the datagrams sent one by one.
    #[derive(Default)]
    struct Recorder {
        borrowed: Vec<(SocketAddr, Vec<Vec<u8>>)>,
        single: usize,
    }

    impl Datagrams for Recorder {
        fn send_with(
            &mut self,
            _to: SocketAddr,
            max: usize,
            fill: &mut dyn FnMut(&mut [u8]) -> usize,
        ) -> io::Result<usize> {
            let mut b = vec![0; max];
            self.single += 1;
            Ok(fill(&mut b))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn send_borrowed(&mut self, to: SocketAddr, frames: &[&[u8]]) -> io::Result<()> {
            self.borrowed.push((to, frames.iter().map(|f| f.to_vec()).collect()));
            Ok(())
        }
        fn recv(&mut self, _f: &mut dyn FnMut(SocketAddr, &[u8])) -> io::Result<usize> {
            Ok(0)
        }
        fn wait(&mut self, _timeout: Option<Duration>) -> io::Result<()> {
            Ok(())
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 1)))
        }
        fn name(&self) -> &'static str {
            "recorder"
        }
    }

    #[test]
    fn held_datagrams_leave_in_one_send_per_run_of_a_destination_at_most_a_gso_batch_each() {
        let delay = Duration::from_millis(2);
        let mut l = Impaired::new(Recorder::default(), Impairment { delay, ..Impairment::default() });
        let (a, b) = (SocketAddr::from(([127, 0, 0, 1], 10)), SocketAddr::from(([127, 0, 0, 1], 11)));
        // 100 to a, 30 to b, 5 to a: sends of 64 and 36, 30, 5, in the order sent.
        let to = |i: usize| if (100..130).contains(&i) { b } else { a };
        for i in 0..135usize {
            l.send_to(to(i), &i.to_be_bytes()).unwrap();
        }
        assert!(l.inner().borrowed.is_empty(), "nothing leaves before it is due");
        std::thread::sleep(delay + Duration::from_millis(1));
        l.release_held().unwrap();
        let sends: Vec<(SocketAddr, usize)> = l.inner().borrowed.iter().map(|(t, f)| (*t, f.len())).collect();
        assert_eq!(sends, [(a, 64), (a, 36), (b, 30), (a, 5)]);
        let order: Vec<usize> = l
            .inner()
            .borrowed
            .iter()
            .flat_map(|(_, f)| f.iter().map(|d| usize::from_be_bytes(d[..].try_into().unwrap())))
            .collect();
        assert_eq!(order, (0..135).collect::<Vec<_>>(), "every datagram once, in order");
        assert_eq!(l.inner().single, 0, "none sent one by one");
        // The buffers come back for the next held datagrams.
        assert_eq!(l.spare.len(), 135);
    }
}
