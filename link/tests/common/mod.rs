//! A deterministic two-endpoint harness (after quinn-proto's `Pair`): a client `Session`
//! and a server `Endpoint` joined by a simulated network in virtual time, with seeded loss,
//! duplication, reordering (jitter), corruption, delay and partitions. Applications on both
//! sides stream TLPs and check the invariants of docs/wire-protocol.md as they run.
#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::time::Duration;

use link::{Config, CreditGrant, DownReason, Endpoint, Event, PresharedKey, Rng, SendError, Session, Time};
use tlp::{Address, Bdf, Body, Completion, CplStatus, ParseConfig, Request, Tag, TlpRepr};

/// A small seeded generator for the network (xorshift64*).
#[derive(Clone)]
pub struct Prng(u64);

impl Prng {
    pub fn new(seed: u64) -> Prng {
        Prng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// What the simulated network does to datagrams.
#[derive(Clone, Copy, Debug, Default)]
pub struct Impairment {
    pub latency: Duration,
    pub jitter: Duration,
    pub loss: f64,
    pub duplicate: f64,
    pub corrupt: f64,
}

/// A datagram in flight: (arrival, order, destination, bytes).
type InFlight = Reverse<(Time, u64, usize, Vec<u8>)>;

pub struct Net {
    pub rng: Prng,
    pub imp: Impairment,
    queue: BinaryHeap<InFlight>,
    order: u64,
    /// While `Some((from, until))`, everything sent is lost (`until = None`: forever).
    pub partition: Option<(Time, Option<Time>)>,
    pub sent: u64,
    /// DATA frames the network lost (not a partition), by destination.
    pub lost_data_to: [u64; 2],
    pub captured: Vec<(usize, Vec<u8>)>,
    pub capture: bool,
}

impl Net {
    pub fn new(seed: u64, imp: Impairment) -> Net {
        Net {
            rng: Prng::new(seed),
            imp,
            queue: BinaryHeap::new(),
            order: 0,
            partition: None,
            sent: 0,
            lost_data_to: [0; 2],
            captured: Vec::new(),
            capture: false,
        }
    }
    fn partitioned(&self, now: Time) -> bool {
        self.partition.is_some_and(|(from, until)| now >= from && until.is_none_or(|u| now < u))
    }
    pub fn send(&mut self, now: Time, dst: usize, bytes: &[u8]) {
        self.sent += 1;
        if self.capture {
            self.captured.push((dst, bytes.to_vec()));
        }
        if self.partitioned(now) {
            return;
        }
        if self.rng.chance(self.imp.loss) {
            if bytes.get(3) == Some(&5) {
                self.lost_data_to[dst] += 1;
            }
            return;
        }
        let copies = if self.rng.chance(self.imp.duplicate) { 2 } else { 1 };
        for _ in 0..copies {
            let mut b = bytes.to_vec();
            if self.rng.chance(self.imp.corrupt) {
                let i = self.rng.below(b.len() as u64) as usize;
                b[i] ^= 1 << self.rng.below(8);
            }
            let jitter = self.rng.below(self.imp.jitter.as_nanos() as u64 + 1);
            let at = now + self.imp.latency + Duration::from_nanos(jitter);
            self.order += 1;
            self.queue.push(Reverse((at, self.order, dst, b)));
        }
    }
    pub fn inject(&mut self, at: Time, dst: usize, bytes: Vec<u8>) {
        self.order += 1;
        self.queue.push(Reverse((at, self.order, dst, bytes)));
    }
    pub fn next_arrival(&self) -> Option<Time> {
        self.queue.peek().map(|Reverse((t, ..))| *t)
    }
    pub fn pop_due(&mut self, now: Time) -> Option<(usize, Vec<u8>)> {
        if self.next_arrival()? <= now { self.queue.pop().map(|Reverse((_, _, d, b))| (d, b)) } else { None }
    }
}

pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

pub fn key() -> PresharedKey {
    PresharedKey::new(b"dxpu test key, 32 bytes long...!").unwrap()
}

pub fn config(key: PresharedKey) -> Config {
    let mut c = Config::new(key);
    c.mtu = 1472;
    c.window = 16;
    c.credits = CreditGrant { posted: (8, 256), non_posted: (4, 256), completion: (8, 256) };
    c.max_queued = 32;
    c.replay_timeout = Duration::from_micros(500);
    c.max_replay_timeout = Duration::from_millis(20);
    c.keepalive_interval = Duration::from_millis(10);
    c.idle_timeout = Duration::from_millis(100);
    c.ride_through = Duration::from_millis(400);
    c.handshake_retry = Duration::from_millis(5);
    c.handshake_timeout = Duration::from_millis(200);
    c
}

/// The workload: `writes` posted writes interleaved with reads; each read's address holds the
/// number of writes issued before it, so the server can check that no read passed a write.
pub struct ClientApp {
    pub plan: Vec<bool>, // true = write, false = read
    pub next: usize,
    pub writes_issued: u32,
    pub outstanding: BTreeSet<u16>,
    pub completed: BTreeSet<u16>,
    pub next_tag: u16,
    pub duplicates: u32,
}

pub struct ServerApp {
    pub writes_seen: u32,
    pub reads_seen: u32,
    pub violations: Vec<String>,
    /// TLPs the server drains per step (to exercise credit stalls).
    pub drain_per_step: usize,
    pub pending_cpl: Vec<Vec<u8>>,
    /// Posted writes taken in place from the datagram.
    pub taken_in_place: u64,
}

fn emit(r: &TlpRepr<'_>) -> Vec<u8> {
    let mut b = vec![0u8; r.buffer_len()];
    r.emit(&mut b).unwrap();
    b
}

fn write_tlp(counter: u32, size: usize) -> Vec<u8> {
    let mut data = vec![0u8; size.max(4)];
    data[..4].copy_from_slice(&counter.to_be_bytes());
    let r = TlpRepr::new(Body::MemWrite {
        req: Request {
            requester: Bdf::new(0, 0, 0),
            tag: Tag::default(),
            first_be: 0xf,
            last_be: if size > 4 { 0xf } else { 0 },
        },
        address: Address::Bits32(0x1000_0000),
        ph: 0,
        data: &data,
    });
    emit(&r)
}

fn read_tlp(tag: u16, writes_before: u32) -> Vec<u8> {
    let r = TlpRepr::new(Body::MemRead {
        req: Request { requester: Bdf::new(0, 0, 0), tag: Tag::new(tag).unwrap(), first_be: 0xf, last_be: 0 },
        address: Address::Bits64(((writes_before as u64) << 12) | 0x1_0000_0000_0000),
        ph: 0,
        length_dw: 1,
        locked: false,
    });
    emit(&r)
}

fn completion_tlp(tag: Tag) -> Vec<u8> {
    let r = TlpRepr::new(Body::Completion {
        cpl: Completion {
            completer: Bdf::new(1, 0, 0),
            status: CplStatus::Success,
            bcm: false,
            byte_count: 4,
            requester: Bdf::new(0, 0, 0),
            tag,
            lower_address: 0,
        },
        locked: false,
        data: Some(&[1, 2, 3, 4]),
    });
    emit(&r)
}

impl ClientApp {
    pub fn new(plan: Vec<bool>) -> ClientApp {
        ClientApp {
            plan,
            next: 0,
            writes_issued: 0,
            outstanding: BTreeSet::new(),
            completed: BTreeSet::new(),
            next_tag: 0,
            duplicates: 0,
        }
    }
    pub fn done(&self) -> bool {
        self.next == self.plan.len() && self.outstanding.is_empty()
    }
    pub fn pump(&mut self, s: &mut Session, write_size: usize) {
        if !s.is_up() {
            return;
        }
        while let Some(tlp) = s.recv_tlp() {
            let r = TlpRepr::parse_bytes(&tlp, &ParseConfig::default()).unwrap();
            let (_, tag) = r.requester_tag();
            if !self.outstanding.remove(&tag.value()) {
                self.duplicates += 1;
            }
            self.completed.insert(tag.value());
            s.recycle(tlp);
        }
        while self.next < self.plan.len() {
            let write = self.plan[self.next];
            let (bytes, tag) = if write {
                (write_tlp(self.writes_issued, write_size), None)
            } else {
                if self.outstanding.len() >= 64 {
                    break;
                }
                let tag = self.next_tag % 1024;
                (read_tlp(tag, self.writes_issued), Some(tag))
            };
            match s.send_tlp(&bytes) {
                Ok(()) => {
                    self.next += 1;
                    if write {
                        self.writes_issued += 1;
                    }
                    if let Some(t) = tag {
                        self.outstanding.insert(t);
                        self.next_tag += 1;
                    }
                }
                Err(SendError::QueueFull { .. }) => break,
                Err(e) => panic!("send_tlp: {e}"),
            }
        }
    }
}

impl ServerApp {
    pub fn new(drain_per_step: usize) -> ServerApp {
        ServerApp {
            writes_seen: 0,
            reads_seen: 0,
            violations: Vec::new(),
            drain_per_step,
            pending_cpl: Vec::new(),
            taken_in_place: 0,
        }
    }
    /// Takes a posted write where it lies (checking its order); anything else waits for
    /// `recv_tlp`.
    pub fn take_in_place(&mut self, tlp: &[u8]) -> bool {
        let r = TlpRepr::parse_bytes(tlp, &ParseConfig::default()).unwrap();
        let Body::MemWrite { data, .. } = r.body else { return false };
        let counter = u32::from_be_bytes(data[..4].try_into().unwrap());
        if counter != self.writes_seen {
            self.violations
                .push(format!("posted write {counter} arrived in place, expected {}", self.writes_seen));
        }
        self.writes_seen = counter + 1;
        self.taken_in_place += 1;
        true
    }

    pub fn pump(&mut self, s: &mut Session) {
        if !s.is_up() {
            return;
        }
        self.pending_cpl.retain(|c| s.send_tlp(c).is_err());
        for _ in 0..self.drain_per_step {
            let Some(tlp) = s.recv_tlp() else { break };
            let r = TlpRepr::parse_bytes(&tlp, &ParseConfig::default()).unwrap();
            match r.body {
                Body::MemWrite { data, .. } => {
                    let counter = u32::from_be_bytes(data[..4].try_into().unwrap());
                    if counter != self.writes_seen {
                        self.violations
                            .push(format!("posted write {counter} arrived, expected {}", self.writes_seen));
                    }
                    self.writes_seen = counter + 1;
                }
                Body::MemRead { req, address, .. } => {
                    let before = ((address.value() & 0xffff_ffff_ffff) >> 12) as u32;
                    if self.writes_seen < before {
                        self.violations.push(format!(
                            "read tag {} passed a write: {} of {before} seen",
                            req.tag.value(),
                            self.writes_seen
                        ));
                    }
                    self.reads_seen += 1;
                    let c = completion_tlp(req.tag);
                    if s.send_tlp(&c).is_err() {
                        self.pending_cpl.push(c);
                    }
                }
                _ => self.violations.push(format!("unexpected TLP {r}")),
            }
            s.recycle(tlp);
        }
    }
}

/// Client, server endpoint, network, applications, virtual clock.
pub struct Pair {
    pub now: Time,
    pub net: Net,
    pub client: Session,
    pub server: Endpoint<usize>,
    pub server_session: Option<u32>,
    pub capp: ClientApp,
    pub sapp: ServerApp,
    pub client_events: Vec<(Time, Event)>,
    pub server_events: Vec<(Time, Event)>,
    pub write_size: usize,
    pub max_memory_seen: link::Memory,
    buf: Vec<u8>,
    pub server_cfg: Config,
    /// The server takes posted writes in place from the datagram (no queue, no copy).
    pub server_sink: bool,
    /// Every INIT and RESPONSE the client sent, for replaying.
    pub client_handshake: Vec<Vec<u8>>,
}

impl Pair {
    pub fn new(seed: u64, imp: Impairment, client_cfg: Config, server_cfg: Config, plan: Vec<bool>) -> Pair {
        let now = Time::from_nanos(1_000_000);
        let mut rng = Rng::from_u64(seed);
        let client = Session::client(client_cfg, now, rng.nonzero_u32(), Rng::from_u64(seed ^ 0xc1));
        let server = Endpoint::new(server_cfg.clone(), rng.nonzero_u32(), Rng::from_u64(seed ^ 0x5e), 4);
        Pair {
            now,
            net: Net::new(seed, imp),
            client,
            server,
            server_session: None,
            capp: ClientApp::new(plan),
            sapp: ServerApp::new(4),
            client_events: Vec::new(),
            server_events: Vec::new(),
            write_size: 64,
            max_memory_seen: Default::default(),
            buf: vec![0u8; 65536],
            server_cfg,
            server_sink: false,
            client_handshake: Vec::new(),
        }
    }

    pub fn server_session(&mut self) -> Option<&mut Session> {
        let id = self.server_session?;
        self.server.session(id)
    }

    /// One step: applications, transmissions, then time advances to the next thing.
    pub fn step(&mut self) {
        self.capp.pump(&mut self.client, self.write_size);
        if let Some(id) = self.server_session
            && let Some(s) = self.server.session(id)
        {
            self.sapp.pump(s);
        }
        while let Some(n) = self.client.poll_transmit(self.now, &mut self.buf) {
            let b = self.buf[..n].to_vec();
            if matches!(b.get(3), Some(1 | 3)) {
                self.client_handshake.push(b.clone());
            }
            self.net.send(self.now, SERVER, &b);
        }
        let now = self.now;
        let mut out = Vec::new();
        while let Some((to, n)) = self.server.poll_transmit(&mut self.buf) {
            // Answers to other addresses (a test's forged INITs) go nowhere.
            if to == CLIENT {
                out.push(self.buf[..n].to_vec());
            }
        }
        for (_, _, s) in self.server.sessions() {
            while let Some(n) = s.poll_transmit(now, &mut self.buf) {
                out.push(self.buf[..n].to_vec());
            }
        }
        for b in out {
            self.net.send(now, CLIENT, &b);
        }
        self.collect_events();
        self.check_bounds();
        // Advance virtual time to the next arrival or timer (applications poll every 50 µs).
        let mut next = self.now + Duration::from_micros(50);
        for t in [self.net.next_arrival(), self.client.poll_timeout(), self.server.poll_timeout()]
            .into_iter()
            .flatten()
        {
            next = next.min(t.max(self.now));
        }
        self.now = next;
        while let Some((dst, bytes)) = self.net.pop_due(self.now) {
            if dst == SERVER {
                let sapp = &mut self.sapp;
                let mut sink = |_: u32, t: &[u8]| sapp.take_in_place(t);
                let sink: Option<link::InPlaceFrom<'_>> =
                    if self.server_sink { Some(&mut sink) } else { None };
                if let Some(id) = self.server.handle_datagram_with(self.now, CLIENT, &bytes, sink)
                    && self
                        .server_session
                        .is_none_or(|cur| self.server.session(cur).is_none_or(|s| s.is_down()))
                {
                    self.server_session = Some(id);
                }
            } else {
                self.client.handle_datagram(self.now, &bytes);
            }
        }
        self.client.handle_timeout(self.now);
        self.server.handle_timeout(self.now);
    }

    fn collect_events(&mut self) {
        while let Some(e) = self.client.poll_event() {
            self.client_events.push((self.now, e));
        }
        let now = self.now;
        let mut evs = Vec::new();
        for (_, _, s) in self.server.sessions() {
            while let Some(e) = s.poll_event() {
                evs.push((now, e));
            }
        }
        self.server_events.extend(evs);
    }

    /// Memory and credit bounds hold at every step.
    fn check_bounds(&mut self) {
        // Both sides are held to the server's configuration (the tests give both the same
        // window, MTU, queue limit and credits).
        let c = &self.server_cfg;
        let (window, mtu, max_queued) = (c.window as usize, c.mtu, c.max_queued);
        let g = c.credits;
        let grant = [g.posted.0, g.posted.1, g.non_posted.0, g.non_posted.1, g.completion.0, g.completion.1];
        let granted_tlps = (g.posted.0 + g.non_posted.0 + g.completion.0) as usize;
        let mut all =
            vec![(self.client.memory(), self.client.credits_available(), self.client.credits_in_use())];
        for (_, _, s) in self.server.sessions() {
            all.push((s.memory(), s.credits_available(), s.credits_in_use()));
        }
        for (m, avail, in_use) in all {
            assert!(m.unacked_frames <= window, "replay buffer {} frames > window", m.unacked_frames);
            assert!(m.unacked_bytes <= window * mtu, "replay buffer {} bytes", m.unacked_bytes);
            assert!(m.out_of_order_frames < window, "out-of-order buffer {} frames", m.out_of_order_frames);
            assert!(m.queued_tlps <= 3 * max_queued, "send queues {} TLPs", m.queued_tlps);
            assert!(
                m.delivered_tlps <= granted_tlps,
                "delivered {} TLPs beyond the credits granted",
                m.delivered_tlps
            );
            for a in avail {
                assert!(a >= 0, "credits went negative: {avail:?}");
            }
            for (u, g) in in_use.iter().zip(grant) {
                assert!(*u <= g, "more credits in use than granted: {in_use:?}");
            }
            self.max_memory_seen.unacked_frames = self.max_memory_seen.unacked_frames.max(m.unacked_frames);
            self.max_memory_seen.delivered_tlps = self.max_memory_seen.delivered_tlps.max(m.delivered_tlps);
        }
    }

    pub fn run_until(&mut self, deadline: Duration, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        let end = self.now + deadline;
        while self.now < end {
            self.step();
            if done(self) {
                return true;
            }
        }
        false
    }

    pub fn client_down(&self) -> Option<(Time, DownReason)> {
        self.client_events.iter().find_map(|(t, e)| match e {
            Event::Down(r) => Some((*t, *r)),
            _ => None,
        })
    }
    pub fn server_down(&self) -> Option<(Time, DownReason)> {
        self.server_events.iter().find_map(|(t, e)| match e {
            Event::Down(r) => Some((*t, *r)),
            _ => None,
        })
    }
}

/// A plan of `n` TLPs with about one read per `read_every`.
pub fn plan(n: usize, read_every: usize, seed: u64) -> Vec<bool> {
    let mut r = Prng::new(seed ^ 0x9a);
    (0..n).map(|_| r.below(read_every as u64) != 0).collect()
}
