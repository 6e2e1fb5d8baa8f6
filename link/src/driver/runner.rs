//! Runners: the loop that joins a session (or a server endpoint) to a driver. In busy-poll
//! mode the loop spins on the socket for `spin` after the last activity before it sleeps in
//! the kernel; in blocking mode it sleeps at once. Either way it sleeps no longer than the
//! session's next timer.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::Datagrams;
use crate::endpoint::Endpoint;
use crate::session::{InPlace, InPlaceFrom, SealedFrame, Session, Transmit};
use crate::time::Time;
use crate::wire::FrameType;

/// A monotonic clock for a session: `Time` is nanoseconds since its origin.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn new() -> Clock {
        Clock { origin: Instant::now() }
    }
    /// The time now.
    pub fn now(&self) -> Time {
        Time::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }
    /// How long from now until `t` (zero if past).
    pub fn until(&self, t: Time) -> Duration {
        t.since(self.now())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// How a runner waits for work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the socket for `spin` after the last activity, then sleep in the kernel.
    Busy {
        /// Busy-poll budget.
        spin: Duration,
    },
    /// Sleep in the kernel whenever there is nothing to do.
    Blocking,
}

/// The waiting half of a runner: counts idle polls and, per the mode, spins or sleeps in the
/// kernel until the next timer (at most 100 ms).
#[derive(Clone, Copy, Debug)]
struct Idle {
    mode: PollMode,
    /// Waits since the last activity.
    polls: u64,
    /// When the first of them looked at the clock: the spin budget runs from there, once
    /// per activity.
    since: Option<Instant>,
    /// Times it slept in the kernel.
    sleeps: u64,
}

impl Idle {
    fn new(mode: PollMode) -> Idle {
        Idle { mode, polls: 0, since: None, sleeps: 0 }
    }

    /// TLPs were received or sent: the spin budget starts again. (Control frames — a
    /// keepalive, its acknowledgement — do not restart it: an idle link's keepalives made
    /// an endpoint spin its budget every 100 ms, on a CPU another spinning thread needed.)
    fn active(&mut self) {
        self.polls = 0;
        self.since = None;
    }

    /// `next_timer` is asked only if the wait sleeps: a spinning wait reads no clock but
    /// every 64th time.
    fn wait<D: Datagrams>(
        &mut self,
        sock: &mut D,
        next_timer: impl FnOnce() -> Option<Duration>,
    ) -> io::Result<()> {
        if let PollMode::Busy { spin } = self.mode {
            self.polls += 1;
            // Spinning: look at the clock only every 64 idle polls.
            if self.polls % 64 != 1 {
                std::hint::spin_loop();
                return Ok(());
            }
            if self.since.get_or_insert_with(Instant::now).elapsed() < spin {
                return Ok(());
            }
        }
        let cap = Duration::from_millis(100);
        self.sleeps += 1;
        sock.wait(Some(next_timer().unwrap_or(cap).min(cap)))?;
        if let PollMode::Busy { .. } = self.mode {
            // Woken: receiving the spinning way again. The budget stays spent until TLPs
            // come or go (`active`): a wake for a timer or a keepalive sleeps again at once
            // (it used to spin a whole budget, 4-5 % of a CPU on an idle link).
            sock.spin();
        }
        Ok(())
    }
}

/// The halves of a pass both runners take the same way around what they drive (a session,
/// an endpoint's sessions), kept with the spin budget they restart.
impl Idle {
    /// Receives what is ready from `sock` into `deliver`. The spin budget starts again only
    /// if the TLPs `tlps` counts moved: anyone can send a datagram whose header says DATA,
    /// and it would keep a busy-polling runner spinning.
    fn receive<D: Datagrams, P>(
        &mut self,
        sock: &mut D,
        peers: &mut P,
        tlps: impl Fn(&P) -> u64,
        mut deliver: impl FnMut(&mut P, SocketAddr, &[u8]),
    ) -> io::Result<usize> {
        let before = tlps(peers);
        let received = sock.recv(&mut |from, bytes| deliver(peers, from, bytes))?;
        if tlps(peers) != before {
            self.active();
        }
        Ok(received)
    }

    /// Ends a transmit pass of `sent` datagrams: the driver's queue flushed if any, the spin
    /// budget started again if TLPs (`data`) left.
    fn transmitted<D: Datagrams>(&mut self, sock: &mut D, sent: usize, data: bool) -> io::Result<usize> {
        if sent > 0 {
            sock.flush()?;
        }
        if data {
            self.active();
        }
        Ok(sent)
    }
}

/// DATA frames handed to the driver together at most.
const SEALED_BATCH: usize = 32;

/// Sends every frame `session` has now for `to`: DATA frames straight from the session's
/// replay buffer, where their TLPs were written ([`Datagrams::send_borrowed`]), in batches;
/// control frames through `control` into the driver's send queue (the caller flushes).
/// `batch` is where the sealed frames wait to be handed over together; it is kept by the
/// runner, so that a pass with nothing to send (most of a busy-polling loop's) costs no
/// batch to set up, and emptied first (a failed send may have left frames in it). Returns
/// how many.
fn transmit_session<D: Datagrams>(
    sock: &mut D,
    to: SocketAddr,
    session: &mut Session,
    now: Time,
    control: &mut Vec<u8>,
    batch: &mut Vec<SealedFrame>,
    data: &mut bool,
) -> io::Result<usize> {
    let mut sent = 0;
    batch.clear();
    if control.len() < session.mtu() {
        control.resize(session.mtu(), 0);
    }
    loop {
        match session.poll_transmit_in_place(now, control) {
            Some(Transmit::Sealed(f)) => {
                *data = true;
                batch.push(f);
                if batch.len() == SEALED_BATCH {
                    send_sealed(sock, to, session, batch)?;
                    batch.clear();
                }
            }
            Some(Transmit::Written(len)) => {
                // In the order the session made them.
                if !batch.is_empty() {
                    send_sealed(sock, to, session, batch)?;
                    batch.clear();
                }
                *data |= carries_tlps(&control[..len]);
                sock.send_to(to, &control[..len])?;
            }
            None => break,
        }
        sent += 1;
    }
    if !batch.is_empty() {
        send_sealed(sock, to, session, batch)?;
    }
    Ok(sent)
}

/// Whether a frame is a DATA frame (TLPs), by its header's type byte.
fn carries_tlps(frame: &[u8]) -> bool {
    frame.get(3).is_some_and(|&t| FrameType::from_byte(t) == FrameType::Data)
}

/// Hands sealed DATA frames to the driver where they lie.
fn send_sealed<D: Datagrams>(
    sock: &mut D,
    to: SocketAddr,
    session: &Session,
    batch: &[SealedFrame],
) -> io::Result<()> {
    let mut frames: [&[u8]; SEALED_BATCH] = [&[]; SEALED_BATCH];
    for (slot, f) in frames.iter_mut().zip(batch) {
        *slot = session.sealed(f);
    }
    sock.send_borrowed(to, &frames[..batch.len()])
}

/// Drives one client session over a driver.
pub struct SessionRunner<D> {
    /// The socket.
    pub sock: D,
    /// The server's address.
    pub peer: SocketAddr,
    /// The session.
    pub session: Session,
    /// The clock.
    pub clock: Clock,
    idle: Idle,
    /// Where control frames are written before they are queued.
    control: Vec<u8>,
    /// Sealed DATA frames waiting to be handed to the driver together.
    sealed: Vec<SealedFrame>,
}

impl<D: Datagrams> SessionRunner<D> {
    /// A runner for `session` talking to `peer`, and only to it: the socket is connected to
    /// `peer` (see [`Datagrams::connect`]) where the system allows; where it does not, the
    /// socket stays unconnected and works the same, a route lookup per send slower.
    pub fn new(
        mut sock: D,
        peer: SocketAddr,
        session: Session,
        clock: Clock,
        mode: PollMode,
    ) -> SessionRunner<D> {
        let _ = sock.connect(peer);
        SessionRunner {
            sock,
            peer,
            session,
            clock,
            idle: Idle::new(mode),
            control: Vec::new(),
            sealed: Vec::with_capacity(SEALED_BATCH),
        }
    }

    /// One pass: receive what is ready, run timers, send what the session has. Returns
    /// whether anything was received or sent.
    pub fn poll(&mut self) -> io::Result<bool> {
        self.poll_with(None)
    }

    /// [`SessionRunner::poll`], offering in-order TLPs to `sink` in place in the receive
    /// buffer first (see [`Session::handle_datagram_with`]).
    pub fn poll_with(&mut self, sink: Option<InPlace<'_>>) -> io::Result<bool> {
        let now = self.clock.now();
        let received = self.receive_at(now, sink)?;
        let sent = self.transmit_at(now)?;
        Ok(received + sent > 0)
    }

    /// The first half of [`SessionRunner::poll_with`]: receives what is ready and runs the
    /// timers, at `now`. Returns the datagrams received. A caller that answers what it
    /// receives sends once, after answering, with [`SessionRunner::transmit_at`].
    pub fn receive_at(&mut self, now: Time, sink: Option<InPlace<'_>>) -> io::Result<usize> {
        let received = self.receive_frames_at(now, sink)?;
        self.run_timers(now);
        Ok(received)
    }

    /// [`SessionRunner::receive_at`] without the timers: a caller on a latency-critical path
    /// answers (or returns) first and runs them with [`SessionRunner::run_timers`] after.
    pub fn receive_frames_at(&mut self, now: Time, mut sink: Option<InPlace<'_>>) -> io::Result<usize> {
        let peer = self.peer;
        let tlps = |s: &Session| s.stats().tlps_received;
        self.idle.receive(&mut self.sock, &mut self.session, tlps, |session, from, bytes| {
            if from == peer {
                let sink = sink.as_mut().map(|s| &mut **s as &mut dyn FnMut(&[u8]) -> bool);
                session.handle_datagram_with(now, bytes, sink);
            }
        })
    }

    /// Runs the session's timers (replay, acknowledgement, keepalive, idle) at `now`.
    pub fn run_timers(&mut self, now: Time) {
        self.session.handle_timeout(now);
    }

    /// Sends what the session has now (no receive): call right after queueing a TLP so that
    /// it leaves without waiting for a receive system call. Returns the datagrams sent.
    pub fn transmit(&mut self) -> io::Result<usize> {
        let now = self.clock.now();
        self.transmit_at(now)
    }

    /// [`SessionRunner::transmit`] at `now`, a time the caller read just before.
    pub fn transmit_at(&mut self, now: Time) -> io::Result<usize> {
        let mut data = false;
        let sent = transmit_session(
            &mut self.sock,
            self.peer,
            &mut self.session,
            now,
            &mut self.control,
            &mut self.sealed,
            &mut data,
        )?;
        self.idle.transmitted(&mut self.sock, sent, data)
    }

    /// How long until the session's next timer (replay, acknowledgement, keepalive).
    pub fn next_timer(&self) -> Option<Duration> {
        self.session.poll_timeout().map(|t| self.clock.until(t))
    }

    /// Times [`SessionRunner::wait`] slept in the kernel (a [`SpinMeter`](super::SpinMeter) skips the gap).
    pub fn sleeps(&self) -> u64 {
        self.idle.sleeps
    }

    /// Waits for work the way the mode says (call after an idle `poll`).
    pub fn wait(&mut self) -> io::Result<()> {
        let (session, clock) = (&self.session, self.clock);
        self.idle.wait(&mut self.sock, || session.poll_timeout().map(|t| clock.until(t)))
    }

    /// Polls until `done` says so or `limit` passes; returns whether `done` was reached.
    pub fn run_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&mut Session) -> bool,
    ) -> io::Result<bool> {
        let end = Instant::now() + limit;
        loop {
            let active = self.poll()?;
            if done(&mut self.session) {
                return Ok(true);
            }
            if Instant::now() >= end {
                return Ok(false);
            }
            if !active {
                self.wait()?;
            }
        }
    }
}

/// Drives a server endpoint (many sessions) over a driver.
pub struct ServerRunner<D> {
    /// The socket.
    pub sock: D,
    /// The endpoint.
    pub endpoint: Endpoint<SocketAddr>,
    /// The clock.
    pub clock: Clock,
    idle: Idle,
    /// Where control frames are written before they are queued.
    control: Vec<u8>,
    /// Sealed DATA frames waiting to be handed to the driver together.
    sealed: Vec<SealedFrame>,
}

impl<D: Datagrams> ServerRunner<D> {
    /// A runner for `endpoint`.
    pub fn new(sock: D, endpoint: Endpoint<SocketAddr>, clock: Clock, mode: PollMode) -> ServerRunner<D> {
        ServerRunner {
            sock,
            endpoint,
            clock,
            idle: Idle::new(mode),
            control: Vec::new(),
            sealed: Vec::with_capacity(SEALED_BATCH),
        }
    }

    /// One pass over the socket and every session.
    pub fn poll(&mut self) -> io::Result<bool> {
        self.poll_with(None)
    }

    /// [`ServerRunner::poll`], offering in-order TLPs to `sink` (with their session's ID)
    /// in place in the receive buffer first (see [`Session::handle_datagram_with`]).
    pub fn poll_with(&mut self, sink: Option<InPlaceFrom<'_>>) -> io::Result<bool> {
        let now = self.clock.now();
        let received = self.receive_at(now, sink)?;
        let sent = self.transmit_at(now)?;
        Ok(received + sent > 0)
    }

    /// The first half of [`ServerRunner::poll_with`]: receives what is ready and runs every
    /// session's timers, at `now`. Returns the datagrams received (see
    /// [`SessionRunner::receive_at`]).
    pub fn receive_at(&mut self, now: Time, sink: Option<InPlaceFrom<'_>>) -> io::Result<usize> {
        let received = self.receive_frames_at(now, sink)?;
        self.run_timers(now);
        Ok(received)
    }

    /// [`ServerRunner::receive_at`] without the timers (see
    /// [`SessionRunner::receive_frames_at`]); run them with [`ServerRunner::run_timers`].
    pub fn receive_frames_at(&mut self, now: Time, mut sink: Option<InPlaceFrom<'_>>) -> io::Result<usize> {
        let tlps = |e: &Endpoint<SocketAddr>| e.stats().tlps_received;
        self.idle.receive(&mut self.sock, &mut self.endpoint, tlps, |endpoint, from, bytes| {
            let sink = sink.as_mut().map(|s| &mut **s as &mut dyn FnMut(u32, &[u8]) -> bool);
            endpoint.handle_datagram_with(now, from, bytes, sink);
        })
    }

    /// Runs every session's timers at `now`.
    pub fn run_timers(&mut self, now: Time) {
        self.endpoint.handle_timeout(now);
    }

    /// Sends what every session has now (no receive). Returns the datagrams sent.
    pub fn transmit(&mut self) -> io::Result<usize> {
        let now = self.clock.now();
        self.transmit_at(now)
    }

    /// [`ServerRunner::transmit`] at `now`, a time the caller read just before.
    pub fn transmit_at(&mut self, now: Time) -> io::Result<usize> {
        let mut sent = 0;
        // The endpoint's own handshake answers first (they are no longer than an INIT).
        if self.control.len() < 256 {
            self.control.resize(256, 0);
        }
        while let Some((to, n)) = self.endpoint.poll_transmit(&mut self.control) {
            self.sock.send_to(to, &self.control[..n])?;
            sent += 1;
        }
        let mut data = false;
        for (_, addr, s) in self.endpoint.sessions() {
            sent += transmit_session(
                &mut self.sock,
                addr,
                s,
                now,
                &mut self.control,
                &mut self.sealed,
                &mut data,
            )?;
        }
        self.idle.transmitted(&mut self.sock, sent, data)
    }

    /// Waits for work the way the mode says.
    pub fn wait(&mut self) -> io::Result<()> {
        self.wait_at_most(None)
    }

    /// Waits for work the way the mode says, no longer than `limit` (something else the
    /// caller serves is due then: a device's timed work).
    pub fn wait_at_most(&mut self, limit: Option<Duration>) -> io::Result<()> {
        let (endpoint, clock) = (&self.endpoint, self.clock);
        self.idle.wait(&mut self.sock, || {
            let timer = endpoint.poll_timeout().map(|t| clock.until(t));
            match (timer, limit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        })
    }

    /// Times [`ServerRunner::wait`] slept in the kernel (a [`SpinMeter`](super::SpinMeter) skips the gap).
    pub fn sleeps(&self) -> u64 {
        self.idle.sleeps
    }

    /// Whether the runner busy-polls ([`PollMode::Busy`]).
    pub fn busy_polls(&self) -> bool {
        matches!(self.idle.mode, PollMode::Busy { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::PortableUdp;
    use crate::{Config, PresharedKey, Rng};

    /// A datagram that says DATA in its header, from anyone, is not a TLP: it does not start a
    /// busy-polling endpoint's spin budget again (a stream of them would keep it spinning).
    #[test]
    fn a_forged_data_frame_does_not_restart_the_spin_budget() {
        let sock = PortableUdp::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let to = sock.local_addr().unwrap();
        let cfg = Config::new(PresharedKey::new(b"runner unit test key, 32 bytes!!").unwrap());
        let ep = Endpoint::new(cfg, 7, Rng::from_u64(7), 4);
        let mut r =
            ServerRunner::new(sock, ep, Clock::new(), PollMode::Busy { spin: Duration::from_secs(1) });
        // The budget spent: the next idle wait sleeps.
        let spent = Instant::now() - Duration::from_secs(2);
        r.idle.since = Some(spent);
        let mut forged = [0u8; 96];
        forged[..2].copy_from_slice(&crate::wire::MAGIC.to_be_bytes());
        forged[3] = FrameType::Data.byte();
        let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..3 {
            attacker.send_to(&forged, to).unwrap();
        }
        let mut got = 0;
        for _ in 0..200 {
            got += r.receive_frames_at(r.clock.now(), None).unwrap();
            if got == 3 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(got, 3, "the forged datagrams arrived");
        assert_eq!(r.endpoint.stats().tlps_received, 0);
        assert_eq!(r.idle.since, Some(spent), "the budget started again for datagrams that carried no TLP");
    }
}
