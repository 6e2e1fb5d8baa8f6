//! The session state machine (sans-IO, after quinn-proto): no sockets, no clock, no threads.
//!
//! Its public methods come in four kinds:
//! - **inputs**: [`Session::handle_datagram`], [`Session::handle_timeout`];
//! - **outputs**: [`Session::poll_transmit`] (or [`Session::poll_transmit_in_place`], which
//!   leaves a DATA frame where it was sealed), [`Session::poll_timeout`], [`Session::poll_event`];
//! - **application commands**: [`Session::send_tlp`] / [`Session::send_repr`],
//!   [`Session::recv_tlp`], [`Session::close`];
//! - **inspection**: [`Session::stats`], [`Session::memory`], [`Session::is_up`], ….
//!
//! Reliability follows PCIe's data link layer: every DATA frame has a sequence number, the
//! receiver acknowledges cumulatively (piggybacked or standalone) and NAKs the first gap, the
//! sender keeps unacknowledged frames in a bounded replay buffer and replays on NAK or on the
//! replay timer (with back-off). Out-of-order frames within the window wait in a bounded
//! buffer so that one loss does not replay the whole window. Flow control follows PCIe's
//! credits: the receiver grants posted / non-posted / completion × header / data credits
//! and returns them as the application drains TLPs; the sender holds back a class without
//! credit while others proceed, under PCIe's ordering rules (posted requests may pass
//! non-posted requests and completions; nothing passes an earlier posted request).
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use tlp::{TlpPacket, TlpRepr};

use crate::auth::Rng;
use crate::config::Config;
use crate::credits::{self, RxCredits, TxCredits};
use crate::replay_buffer::ReplayBuffer;
use crate::replay_window::ReplayWindow;
use crate::rtt::{MinRtt, PROBE_FRAMES};
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::BODY_AT;

mod connect;
mod parts;
mod receive;
mod send;

use parts::{Crypto, Due, Identity, Liveness, RxQueue, TxQueue};

/// Takes a TLP where it lies in a receive buffer (returns `true`) or leaves it for
/// [`Session::recv_tlp`] (returns `false`); see [`Session::handle_datagram_with`].
pub type InPlace<'a> = &'a mut dyn FnMut(&[u8]) -> bool;

/// [`InPlace`] for an endpoint's sessions: the session's ID comes with each TLP.
pub type InPlaceFrom<'a> = &'a mut dyn FnMut(u32, &[u8]) -> bool;

/// Which side of the handshake.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// Sends INIT (the host endpoint).
    Client,
    /// Answers INIT (the GPU-box endpoint).
    Server,
}

/// Why a session went down.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DownReason {
    /// Nothing authentic arrived within the ride-through time.
    Timeout,
    /// The handshake did not complete in time.
    HandshakeTimeout,
    /// The peer proved a different key.
    AuthFailed,
    /// The peer closed the session.
    PeerClosed,
    /// This side closed the session.
    Closed,
    /// The peer restarted (a new epoch started a new session).
    PeerRestarted,
    /// The peer started a new session from the same epoch (this one is abandoned).
    Superseded,
    /// The peer broke the protocol (e.g. sent beyond its credits).
    ProtocolViolation(&'static str),
    /// The server refused the handshake: it has no room for another session.
    Refused,
}

impl std::fmt::Display for DownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownReason::Timeout => {
                f.write_str("nothing authentic arrived from the peer within the ride-through time")
            }
            DownReason::HandshakeTimeout => f.write_str("the handshake did not complete in time"),
            DownReason::AuthFailed => f.write_str("authentication failed: the peer does not hold this key"),
            DownReason::PeerClosed => f.write_str("the peer closed the session"),
            DownReason::Closed => f.write_str("closed here"),
            DownReason::PeerRestarted => f.write_str("the peer restarted"),
            DownReason::Superseded => f.write_str("the peer started a new session"),
            DownReason::ProtocolViolation(what) => write!(f, "the peer broke the protocol: {what}"),
            DownReason::Refused => f.write_str("the peer refused the session: it has no room for another"),
        }
    }
}

/// What the application learns from a session.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// The session is up; TLPs may flow.
    Up {
        /// The peer's epoch (changes when the peer restarts).
        peer_epoch: u32,
    },
    /// Nothing authentic arrived for the idle timeout: the link is silent. The session keeps
    /// its state and keeps probing; it resumes ([`Event::Resumed`]) if the peer is heard
    /// within the ride-through time, and goes down otherwise. Requests waiting on the peer
    /// are not the device's fault meanwhile.
    Silent {
        /// How long nothing authentic has arrived.
        quiet: Duration,
    },
    /// The peer was heard again after [`Event::Silent`]: nothing was lost.
    Resumed {
        /// How long the link was silent in all.
        silent_for: Duration,
    },
    /// The session is down for good; outstanding requests must be completed with errors.
    Down(DownReason),
}

/// Counters. Every dropped frame is counted under its reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Frames sent (all types, including retransmissions).
    pub frames_sent: u64,
    /// Frames received and accepted.
    pub frames_received: u64,
    /// DATA frames sent for the first time.
    pub data_frames_sent: u64,
    /// DATA frames sent again from the replay buffer.
    pub retransmits: u64,
    /// DATA frames the peer said it held beyond a gap (selective acknowledgements).
    pub frames_sacked: u64,
    /// DATA frames declared lost because frames sent after them were acknowledged
    /// selectively, and replayed without waiting for the timer.
    pub lost_by_sack: u64,
    /// Replay timer expiries.
    pub replay_timeouts: u64,
    /// NAKs sent.
    pub naks_sent: u64,
    /// NAKs received.
    pub naks_received: u64,
    /// Standalone ACK frames sent.
    pub acks_sent: u64,
    /// TLPs handed to the peer (first transmissions).
    pub tlps_sent: u64,
    /// TLPs delivered to the application, in order.
    pub tlps_received: u64,
    /// Datagrams that were not frames (CRC, magic, version, lengths).
    pub dropped_malformed: u64,
    /// Frames whose MAC did not verify.
    pub dropped_bad_mac: u64,
    /// Frames from a previous epoch of the peer.
    pub dropped_stale_epoch: u64,
    /// Frames whose packet number was seen before (replayed datagrams).
    pub dropped_replayed: u64,
    /// Frames for another session ID.
    pub dropped_wrong_session: u64,
    /// Frames of a type that does not fit the session's state.
    pub dropped_unexpected: u64,
    /// DATA frames already delivered (duplicates).
    pub duplicate_data: u64,
    /// DATA frames beyond the receive window.
    pub dropped_out_of_window: u64,
    /// Handshake proofs that failed (wrong key).
    pub auth_failures: u64,
    /// Key updates of this side's sending key.
    pub key_updates: u64,
    /// Key updates of the peer's sending key this side followed.
    pub peer_key_updates: u64,
    /// TLP records in DATA frames that were not TLPs (dropped, frame still acknowledged).
    pub malformed_tlps: u64,
    /// Bytes of the frames sent (datagram payloads, retransmissions included).
    pub bytes_sent: u64,
    /// Bytes of the frames received and accepted.
    pub bytes_received: u64,
    /// TLPs held back when queued because the peer's credits did not cover them.
    pub credit_stalls: u64,
    /// Round trips of DATA frames (first send to the ACK that covers it, frames sent once
    /// only, one in flight at a time): `rtt_us_log2[i]` counts those of `[2^i, 2^(i+1))` µs
    /// (bucket 0 from zero, the last one everything above).
    pub rtt_us_log2: [u64; RTT_BUCKETS],
}

/// Buckets of [`Stats::rtt_us_log2`]: up to 2^23 µs (8.4 s) apart.
pub const RTT_BUCKETS: usize = 24;

impl Stats {
    /// Round-trip samples taken.
    pub fn rtt_samples(&self) -> u64 {
        self.rtt_us_log2.iter().sum()
    }

    /// The `q`-quantile (0 < q ≤ 1) of the round trips, in µs: the upper edge of the bucket
    /// it falls in (a bound within a factor of two); `None` without samples.
    pub fn rtt_quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.rtt_samples();
        if n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.rtt_us_log2.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(1u64 << (i + 1));
            }
        }
        Some(1u64 << RTT_BUCKETS)
    }

    /// The bucket of a round trip of `us` microseconds.
    pub fn rtt_bucket(us: u64) -> usize {
        (63 - us.max(1).leading_zeros() as usize).min(RTT_BUCKETS - 1)
    }
}

/// Bytes a session holds, for checking memory bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// TLP bytes queued for sending.
    pub queued_bytes: usize,
    /// TLPs queued for sending.
    pub queued_tlps: usize,
    /// DATA frames in the replay buffer.
    pub unacked_frames: usize,
    /// Bytes in the replay buffer.
    pub unacked_bytes: usize,
    /// DATA frames waiting for an earlier gap to fill.
    pub out_of_order_frames: usize,
    /// TLPs delivered but not yet read by the application.
    pub delivered_tlps: usize,
    /// Frame and receive buffers kept for reuse (each up to the MTU): what a busy session
    /// keeps so that it allocates nothing per frame, given back when it is idle or silent.
    pub spare_buffers: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Client: INIT sent, waiting for CHALLENGE.
    ClientInit,
    /// Client: RESPONSE sent, waiting for ESTABLISHED (or any authentic frame).
    ClientResponse,
    /// A server session exists only once its client proved the key (see `crate::handshake`).
    Up,
    Down(DownReason),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Timer {
    Handshake = 0,
    Replay = 1,
    Ack = 2,
    Keepalive = 3,
    Idle = 4,
}
const TIMERS: usize = 5;

/// A TLP's class (its index, [`credits::index`]) and credit cost, from its header.
fn tlp_cost(bytes: &[u8]) -> Result<(usize, u32, u32), tlp::Error> {
    let p = TlpPacket::new_checked(bytes)?;
    Ok((credits::index(p.kind().fc_class()), 1, p.payload().len().div_ceil(16) as u32))
}

/// A DATA frame sealed in place in the session's replay buffer, ready to send: its bytes
/// are [`Session::sealed`]'s, valid until the session next changes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SealedFrame {
    seq: SeqNum,
    start: usize,
    end: usize,
}

/// What [`Session::poll_transmit_in_place`] produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// A control frame of this many bytes, written into the caller's buffer.
    Written(usize),
    /// A DATA frame, sealed where its TLPs were written: send [`Session::sealed`]'s bytes.
    Sealed(SealedFrame),
}

/// Where a TLP comes from when it is queued.
enum Source<'a, 'b> {
    Bytes(&'a [u8]),
    Repr(&'a TlpRepr<'b>),
}

/// What a server endpoint established about a client that proved its key: the session is
/// made from it, up at once.
pub(crate) struct Accepted {
    pub(crate) local_id: u32,
    pub(crate) local_epoch: u32,
    pub(crate) peer_id: u32,
    pub(crate) peer_epoch: u32,
    pub(crate) mtu: usize,
    pub(crate) window: u32,
    /// The negotiated options ([`crate::handshake::options`]).
    pub(crate) options: u8,
    pub(crate) transcript: Vec<u8>,
}

/// One end of an authenticated, reliable, flow-controlled TLP session.
pub struct Session {
    role: Role,
    cfg: Config,
    state: State,
    /// Who the two ends are: IDs, epochs, nonce, cookie, the handshake's transcript.
    id: Identity,
    /// The frame keys, once the handshake made them, and what frames carry.
    crypto: Crypto,
    mtu: usize,
    window: u32,
    /// The control frames owed to the peer.
    due: Due,
    // Packet numbers: the next to send, and the window of those received (anti-replay).
    next_pn: u64,
    rx_pns: ReplayWindow,
    // Transmit side.
    next_seq: SeqNum,
    /// Sent DATA frames until acknowledged (and the buffers of freed ones, for reuse).
    replay: ReplayBuffer,
    /// The DATA frame being timed for a round-trip sample, and when it was first sent;
    /// dropped if it is replayed (Karn: an ACK after a replay times neither send).
    rtt_probe: Option<(SeqNum, Time)>,
    /// The least round trip measured: what the tail-loss probe timeout follows.
    rtt: MinRtt,
    /// The timeout the replay timer was last armed with.
    replay_armed_for: Duration,
    /// TLPs waiting for credits and the window, in PCIe order.
    txq: TxQueue,
    /// The peer's credits: its limits, what this side consumed, its first grant.
    tx_credits: TxCredits,
    // Receive side.
    /// The next frame to deliver, the frames ahead of it, the TLPs delivered, the gap NAKed.
    rxq: RxQueue,
    /// The credits this side grants: allocated, advertised, used by the peer.
    rx_credits: RxCredits,
    timers: [Option<Time>; TIMERS],
    last_tx: Time,
    /// When the peer was last heard, and whether the link counts as silent.
    live: Liveness,
    events: VecDeque<Event>,
    stats: Stats,
    pool: Vec<Vec<u8>>,
}

impl Session {
    fn blank(role: Role, cfg: Config, now: Time, mut rng: Rng) -> Session {
        let spare = spare_frames(cfg.window, cfg.max_queued);
        let id = Identity::new(&mut rng);
        let rx_credits = RxCredits::new(cfg.credits);
        let mut s = Session {
            role,
            mtu: cfg.mtu,
            window: cfg.window,
            cfg,
            state: State::ClientInit,
            id,
            crypto: Crypto::new(),
            rtt_probe: None,
            rtt: MinRtt::default(),
            replay_armed_for: Duration::ZERO,
            due: Due::default(),
            next_pn: 0,
            rx_pns: ReplayWindow::default(),
            next_seq: SeqNum(0),
            replay: ReplayBuffer::new(spare),
            txq: TxQueue::new(),
            tx_credits: TxCredits::default(),
            rxq: RxQueue::new(),
            rx_credits,
            timers: [None; TIMERS],
            last_tx: now,
            live: Liveness::new(now),
            events: VecDeque::new(),
            stats: Stats::default(),
            pool: Vec::new(),
        };
        s.set_timer(Timer::Idle, now + s.cfg.handshake_timeout);
        s
    }

    /// A client session: it sends INIT at the first `poll_transmit`. `epoch` identifies this
    /// endpoint instance (a restarted process picks a new one); `rng` supplies nonces and IDs.
    pub fn client(cfg: Config, now: Time, epoch: u32, rng: Rng) -> Session {
        let mut s = Session::blank(Role::Client, cfg, now, rng);
        s.id.local_epoch = epoch;
        s.state = State::ClientInit;
        s.due.handshake = true;
        s.set_timer(Timer::Handshake, now + s.cfg.handshake_retry);
        s
    }

    /// A server session for a client that has proven its key (see [`crate::Endpoint`],
    /// which runs the handshake statelessly until then): up at once, with ESTABLISHED due.
    pub(crate) fn accepted(cfg: Config, now: Time, rng: Rng, a: Accepted) -> Session {
        let mut s = Session::blank(Role::Server, cfg, now, rng);
        s.id.local_id = a.local_id;
        s.id.local_epoch = a.local_epoch;
        s.id.peer_id = a.peer_id;
        s.id.peer_epoch = a.peer_epoch;
        s.mtu = a.mtu;
        s.window = a.window;
        s.replay.set_spare_limit(spare_frames(a.window, s.cfg.max_queued));
        let (c2s, s2c) = s.cfg.psk.frame_keys(&a.transcript);
        s.set_keys(s2c, c2s, a.options);
        s.id.transcript = a.transcript;
        s.stats.frames_received += 1;
        s.become_up(now);
        s.due.established = true;
        s
    }

    // ----- inspection -------------------------------------------------------------------

    /// Client or server.
    pub fn role(&self) -> Role {
        self.role
    }
    /// This side's session ID (what the peer puts in the header).
    pub fn local_id(&self) -> u32 {
        self.id.local_id
    }
    /// This endpoint's epoch.
    pub fn local_epoch(&self) -> u32 {
        self.id.local_epoch
    }
    /// The peer's epoch (0 before the handshake has told it).
    pub fn peer_epoch(&self) -> u32 {
        self.id.peer_epoch
    }
    /// The session is established.
    pub fn is_up(&self) -> bool {
        self.state == State::Up
    }
    /// The session is down for good.
    pub fn is_down(&self) -> bool {
        matches!(self.state, State::Down(_))
    }
    /// The negotiated MTU.
    pub fn mtu(&self) -> usize {
        self.mtu
    }
    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }
    /// What the session holds in memory now.
    pub fn memory(&self) -> Memory {
        Memory {
            queued_bytes: self
                .txq
                .ready
                .iter()
                .chain(self.txq.stalled.iter().flatten())
                .map(|c| c.end - BODY_AT - 2 * c.tlps.iter().sum::<u32>() as usize)
                .sum(),
            queued_tlps: self.txq.len(),
            unacked_frames: self.replay.len(),
            unacked_bytes: self.replay.bytes(),
            out_of_order_frames: self.rxq.out_of_order.held(),
            delivered_tlps: self.rxq.delivered.len(),
            spare_buffers: self.replay.spare() + self.pool.len(),
        }
    }
    /// Credits the peer granted that this side has not used, per class × (header, data).
    pub fn credits_available(&self) -> [i64; 6] {
        self.tx_credits.available()
    }
    /// Credits this side granted that the peer has in use (delivered, not yet drained).
    pub fn credits_in_use(&self) -> [u32; 6] {
        self.rx_credits.in_use()
    }
    /// Events are waiting to be read.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }
    /// The peer started another session: this one is over, for `reason`.
    pub(crate) fn superseded(&mut self, reason: DownReason) {
        self.go_down(reason);
    }
    /// The identifier of the pre-shared key this session proves (see
    /// [`crate::PresharedKey::key_id`]): on a server, which host key the client presented.
    pub fn key_id(&self) -> [u8; 8] {
        self.cfg.psk.key_id()
    }
    /// What the handshake settled for the frames: (tagged, DATA bodies encrypted).
    pub fn frame_protection(&self) -> (bool, bool) {
        (self.crypto.authenticate, self.crypto.encrypt)
    }
    /// The peer's session ID (0 before the handshake has told it).
    pub fn peer_id(&self) -> u32 {
        self.id.peer_id
    }
    /// When the last authentic frame from the peer arrived (the session's start before any).
    pub fn last_heard(&self) -> Time {
        self.live.heard
    }
    /// Nothing authentic has arrived for the idle timeout (see [`Event::Silent`]).
    pub fn is_silent(&self) -> bool {
        self.live.silent
    }
    /// The longest silence the session rides through before it goes down.
    pub fn ride_through(&self) -> Duration {
        self.cfg.ride_through
    }
    /// Nothing is queued or waiting for acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.replay.is_empty() && self.txq.len() == 0
    }

    // ----- application commands ---------------------------------------------------------

    /// Closes the session: a CLOSE frame goes out at the next `poll_transmit`.
    pub fn close(&mut self, _now: Time) {
        if !self.is_down() {
            let had_keys = self.crypto.tx.is_some();
            self.go_down(DownReason::Closed);
            self.due.close = had_keys;
        }
    }

    // ----- outputs ------------------------------------------------------------------------

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// When `handle_timeout` should next be called.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.iter().flatten().min().copied()
    }

    // ----- inputs -------------------------------------------------------------------------

    /// Handles expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.timer_passed(Timer::Idle, now) {
            self.timers[Timer::Idle as usize] = None;
            let reason = match self.state {
                // Silent: the state stays, the probes go on (keepalives, replays at their
                // backed-off pace), and the link is down only past the ride-through time.
                State::Up if !self.live.silent && self.cfg.ride_through > self.cfg.idle_timeout => {
                    self.live.silent = true;
                    self.events.push_back(Event::Silent { quiet: now.since(self.live.heard) });
                    // What the session keeps for a busy peer goes back to the allocator: a
                    // dead peer's session lingers for the ride-through time, and holds only
                    // what it must resend (the replay buffer) and what was delivered.
                    self.replay.trim_spare(0);
                    self.pool = Vec::new();
                    self.set_timer(Timer::Idle, self.live.heard + self.cfg.ride_through);
                    None
                }
                State::Up => Some(DownReason::Timeout),
                _ if self.id.saw_bad_proof => Some(DownReason::AuthFailed),
                _ => Some(DownReason::HandshakeTimeout),
            };
            if let Some(reason) = reason {
                self.go_down(reason);
                return;
            }
        }
        if self.timer_passed(Timer::Handshake, now) {
            if matches!(self.state, State::ClientInit | State::ClientResponse) {
                self.due.handshake = true;
                self.set_timer(Timer::Handshake, now + self.cfg.handshake_retry);
            } else {
                self.timers[Timer::Handshake as usize] = None;
            }
        }
        if self.timer_passed(Timer::Replay, now) {
            self.timers[Timer::Replay as usize] = None;
            // Frames sent before the timer was armed are as old as its timeout.
            if self.replay.timed_out(now, self.replay_armed_for, self.crypto.selective_ack) {
                self.stats.replay_timeouts += 1;
            }
            // Armed again (backed off) while anything is held: the frames just scheduled go at
            // the next transmit, and those too young to be judged now are judged then.
            self.arm_replay(now);
        }
        // An expired ACK timer stays set: `transmit` sends the ACK and clears it.
        if self.timer_passed(Timer::Keepalive, now) {
            self.timers[Timer::Keepalive as usize] = None;
            if self.state == State::Up {
                // A keepalive carries the ACK and credits; sending it is what re-arms this.
                self.due.keepalive = true;
                // Idle for the keepalive's interval: a burst is over, and the buffers it
                // needed beyond the window's go back to the allocator.
                self.replay.trim_spare(2 * self.window as usize);
            }
        }
    }
}

impl Session {
    fn set_timer(&mut self, t: Timer, at: Time) {
        self.timers[t as usize] = Some(at);
    }

    /// The replay timeout now: the configured one — or the tail-loss probe timeout from the
    /// least round trip measured, where a timer's expiry resends little: with selective
    /// acknowledgements (what held frames overtook, and one probe), or with at most
    /// [`PROBE_FRAMES`] frames unacknowledged — doubled per expiry without progress, at most
    /// the configured ceiling.
    fn replay_timeout(&self) -> Duration {
        let cheap = self.crypto.selective_ack || self.replay.len() <= PROBE_FRAMES;
        match self.cfg.tail_loss_probe && cheap {
            // Backed off 8 times at most: an expiry resends a frame or few, and where loss is
            // heavy (half the datagrams) probes fail several times running.
            true => {
                let base = self.rtt.probe_timeout(self.cfg.ack_delay, self.cfg.replay_timeout);
                self.replay.timeout(base, self.cfg.max_replay_timeout.min(8 * base))
            }
            false => self.replay.timeout(self.cfg.replay_timeout, self.cfg.max_replay_timeout),
        }
    }

    fn timer_passed(&self, t: Timer, now: Time) -> bool {
        self.timers[t as usize].is_some_and(|at| at <= now)
    }

    fn go_down(&mut self, reason: DownReason) {
        if self.is_down() {
            return;
        }
        self.state = State::Down(reason);
        self.timers = [None; TIMERS];
        self.events.push_back(Event::Down(reason));
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("role", &self.role)
            .field("state", &self.state)
            .field("local_id", &self.id.local_id)
            .field("peer_id", &self.id.peer_id)
            .field("next_seq", &self.next_seq)
            .field("rx_next", &self.rxq.rx_next)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;

/// Frame buffers a session keeps for reuse while it is busy: as many as it can have in use
/// at once — the window's unacknowledged frames, as many again sealed or sent meanwhile, and
/// a frame for each TLP its three classes may queue — so that a stream allocates none. (With
/// twice the window alone, bulk DMA allocated a frame for every six it sent: the frames
/// queued behind the credits were not counted.) Idle for a keepalive's interval, it keeps
/// twice the window's ([`ReplayBuffer::trim_spare`]): a burst's buffers do not stay.
pub(crate) fn spare_frames(window: u32, max_queued: usize) -> usize {
    2 * window as usize + 3 * max_queued
}
