//! The session state machine (sans-IO, after quinn-proto): no sockets, no clock, no threads.
//!
//! Its public methods come in four kinds:
//! - **inputs**: [`Session::handle_datagram`], [`Session::handle_timeout`];
//! - **outputs**: [`Session::poll_transmit`], [`Session::poll_timeout`], [`Session::poll_event`];
//! - **application commands**: [`Session::send_tlp`], [`Session::recv_tlp`], [`Session::close`];
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

use tlp::{FcClass, TlpPacket};

use crate::auth::{FrameKey, Rng};
use crate::config::Config;
use crate::error::SendError;
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::{
    FC_LEN, FcLimits, Frame, FrameType, HEADER_LEN, Header, TAG_LEN, TRAILER_LEN, TlpRecords, write_frame,
};

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
    /// Nothing authentic arrived within the idle timeout.
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
}

/// What the application learns from a session.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Event {
    /// The session is up; TLPs may flow.
    Up {
        /// The peer's epoch (changes when the peer restarts).
        peer_epoch: u32,
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
    /// TLP records in DATA frames that were not TLPs (dropped, frame still acknowledged).
    pub malformed_tlps: u64,
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
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Client: INIT sent, waiting for CHALLENGE.
    ClientInit,
    /// Client: RESPONSE sent, waiting for ESTABLISHED (or any authentic frame).
    ClientResponse,
    /// Server: CHALLENGE sent, waiting for RESPONSE.
    ServerChallenge,
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

/// Credit index: class × (header, data).
fn class_index(c: FcClass) -> usize {
    match c {
        FcClass::Posted => 0,
        FcClass::NonPosted => 1,
        FcClass::Completion => 2,
    }
}

/// A TLP's class and credit cost, from its header.
fn tlp_cost(bytes: &[u8]) -> Result<(usize, u32, u32), tlp::Error> {
    let p = TlpPacket::new_checked(bytes)?;
    Ok((class_index(p.kind().fc_class()), 1, p.payload().len().div_ceil(16) as u32))
}

struct Queued {
    order: u64,
    bytes: Vec<u8>,
    data_credits: u32,
}

struct Sent {
    seq: SeqNum,
    /// The frame's TLPs, kept for replay: the queued buffers themselves, moved here
    /// rather than copied; the frame is written from them.
    tlps: Vec<Vec<u8>>,
    /// Length of the DATA body (TLP records).
    len: usize,
}

const INIT_BODY: usize = 4 + 16 + 2 + 2 + 8;
const CHALLENGE_BODY: usize = 4 + 16 + 2 + 2 + 32;
const RESPONSE_BODY: usize = 32;

/// One end of an authenticated, reliable, flow-controlled TLP session.
pub struct Session {
    role: Role,
    cfg: Config,
    state: State,
    local_id: u32,
    peer_id: u32,
    local_epoch: u32,
    peer_epoch: u32,
    local_nonce: [u8; 16],
    transcript: Vec<u8>,
    tx_key: Option<FrameKey>,
    rx_key: Option<FrameKey>,
    mtu: usize,
    window: u32,
    saw_bad_proof: bool,
    handshake_due: bool,
    established_due: bool,
    close_due: bool,
    // Packet numbers: anti-replay.
    next_pn: u64,
    rx_pn_max: u64,
    rx_pn_seen: u64,
    rx_pn_any: bool,
    // Transmit side.
    next_seq: SeqNum,
    unacked: VecDeque<Sent>,
    /// Emptied TLP lists of acknowledged frames, for reuse.
    frame_pool: Vec<Vec<Vec<u8>>>,
    replay_due: VecDeque<SeqNum>,
    replay_backoff: u32,
    queues: [VecDeque<Queued>; 3],
    next_order: u64,
    consumed: [u32; 6],
    limit: [u32; 6],
    // Receive side.
    rx_next: SeqNum,
    out_of_order: VecDeque<Option<Vec<u8>>>,
    /// Delivered TLPs with their credit index and cost (header, data), for `recv_tlp`.
    delivered: VecDeque<(Vec<u8>, usize, u32, u32)>,
    rx_used: [u32; 6],
    allocated: [u32; 6],
    advertised: [u32; 6],
    nak_sent_for: Option<SeqNum>,
    nak_due: bool,
    ack_due: bool,
    keepalive_due: bool,
    timers: [Option<Time>; TIMERS],
    last_tx: Time,
    events: VecDeque<Event>,
    stats: Stats,
    pool: Vec<Vec<u8>>,
}

fn grant_array(cfg: &Config) -> [u32; 6] {
    let c = cfg.credits;
    [c.posted.0, c.posted.1, c.non_posted.0, c.non_posted.1, c.completion.0, c.completion.1]
}

fn limits_of(a: [u32; 6]) -> FcLimits {
    FcLimits { posted: (a[0], a[1]), non_posted: (a[2], a[3]), completion: (a[4], a[5]) }
}

fn array_of(l: FcLimits) -> [u32; 6] {
    [l.posted.0, l.posted.1, l.non_posted.0, l.non_posted.1, l.completion.0, l.completion.1]
}

impl Session {
    fn blank(role: Role, cfg: Config, now: Time, mut rng: Rng) -> Session {
        let mut local_nonce = [0u8; 16];
        rng.fill(&mut local_nonce);
        let local_id = rng.nonzero_u32();
        let local_epoch = rng.nonzero_u32();
        let allocated = grant_array(&cfg);
        let mut s = Session {
            role,
            mtu: cfg.mtu,
            window: cfg.window,
            cfg,
            state: State::ClientInit,
            local_id,
            peer_id: 0,
            local_epoch,
            peer_epoch: 0,
            local_nonce,
            transcript: Vec::new(),
            tx_key: None,
            rx_key: None,
            saw_bad_proof: false,
            handshake_due: false,
            established_due: false,
            close_due: false,
            next_pn: 0,
            rx_pn_max: 0,
            rx_pn_seen: 0,
            rx_pn_any: false,
            next_seq: SeqNum(0),
            unacked: VecDeque::new(),
            frame_pool: Vec::new(),
            replay_due: VecDeque::new(),
            replay_backoff: 0,
            queues: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            next_order: 0,
            consumed: [0; 6],
            limit: [0; 6],
            rx_next: SeqNum(0),
            out_of_order: VecDeque::new(),
            delivered: VecDeque::new(),
            rx_used: [0; 6],
            allocated,
            advertised: [0; 6],
            nak_sent_for: None,
            nak_due: false,
            ack_due: false,
            keepalive_due: false,
            timers: [None; TIMERS],
            last_tx: now,
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
        s.local_epoch = epoch;
        s.state = State::ClientInit;
        s.handshake_due = true;
        s.set_timer(Timer::Handshake, now + s.cfg.handshake_retry);
        s
    }

    /// A server session answering an INIT frame (see [`crate::Endpoint`], which routes INITs
    /// here). `None` if the frame is not a well-formed INIT.
    pub fn accept(cfg: Config, now: Time, epoch: u32, rng: Rng, init: &Frame<'_>) -> Option<Session> {
        let h = init.header();
        let body = init.body();
        if h.ty != FrameType::Init || body.len() != INIT_BODY {
            return None;
        }
        let mut s = Session::blank(Role::Server, cfg, now, rng);
        s.local_epoch = epoch;
        s.peer_id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        s.peer_epoch = h.epoch;
        let their_mtu = u16::from_be_bytes([body[20], body[21]]) as usize;
        let their_window = u16::from_be_bytes([body[22], body[23]]) as u32;
        s.mtu = s.mtu.min(their_mtu);
        s.window = s.window.min(their_window).max(1);
        if s.peer_id == 0 || s.mtu < HEADER_LEN + FC_LEN + TRAILER_LEN + 64 {
            return None;
        }
        // Transcript: client epoch, INIT body, server epoch, server ID and nonce, limits.
        let mut t = Vec::with_capacity(64);
        t.extend_from_slice(&h.epoch.to_be_bytes());
        t.extend_from_slice(body);
        t.extend_from_slice(&s.local_epoch.to_be_bytes());
        t.extend_from_slice(&s.local_id.to_be_bytes());
        t.extend_from_slice(&s.local_nonce);
        t.extend_from_slice(&(s.mtu as u16).to_be_bytes());
        t.extend_from_slice(&(s.window as u16).to_be_bytes());
        let (c2s, s2c) = s.cfg.psk.frame_keys(&t);
        s.rx_key = Some(c2s);
        s.tx_key = Some(s2c);
        s.transcript = t;
        s.state = State::ServerChallenge;
        s.handshake_due = true;
        s.stats.frames_received += 1;
        Some(s)
    }

    // ----- inspection -------------------------------------------------------------------

    /// Client or server.
    pub fn role(&self) -> Role {
        self.role
    }
    /// This side's session ID (what the peer puts in the header).
    pub fn local_id(&self) -> u32 {
        self.local_id
    }
    /// This endpoint's epoch.
    pub fn local_epoch(&self) -> u32 {
        self.local_epoch
    }
    /// The peer's epoch (0 before the handshake has told it).
    pub fn peer_epoch(&self) -> u32 {
        self.peer_epoch
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
            queued_bytes: self.queues.iter().flatten().map(|q| q.bytes.len()).sum(),
            queued_tlps: self.queues.iter().map(VecDeque::len).sum(),
            unacked_frames: self.unacked.len(),
            unacked_bytes: self.unacked.iter().map(|s| s.len).sum(),
            out_of_order_frames: self.out_of_order.iter().filter(|f| f.is_some()).count(),
            delivered_tlps: self.delivered.len(),
        }
    }
    /// Credits the peer granted that this side has not used, per class × (header, data).
    pub fn credits_available(&self) -> [i64; 6] {
        let mut out = [0i64; 6];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.limit[i].wrapping_sub(self.consumed[i]) as i32 as i64;
        }
        out
    }
    /// Credits this side granted that the peer has in use (delivered, not yet drained).
    pub fn credits_in_use(&self) -> [u32; 6] {
        let mut out = [0u32; 6];
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.rx_used[i].wrapping_sub(self.allocated[i].wrapping_sub(grant_array(&self.cfg)[i]));
        }
        out
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
    /// The peer's session ID (0 before the handshake has told it).
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }
    /// Nothing is queued or waiting for acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.unacked.is_empty() && self.queues.iter().all(VecDeque::is_empty)
    }

    // ----- application commands ---------------------------------------------------------

    /// Queues one TLP. It goes out, in PCIe order, as soon as credits and the window allow.
    pub fn send_tlp(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        if self.state != State::Up {
            return Err(SendError::NotConnected);
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(bytes);
        self.enqueue(buf)
    }

    /// Queues one TLP that `write` emits straight into the session's buffer (`len` bytes at
    /// most; it returns the length written): [`Session::send_tlp`] without the copy from
    /// the caller's buffer.
    pub fn send_tlp_with(
        &mut self,
        len: usize,
        write: &mut dyn FnMut(&mut [u8]) -> usize,
    ) -> Result<(), SendError> {
        if self.state != State::Up {
            return Err(SendError::NotConnected);
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        buf.resize(len, 0);
        let n = write(&mut buf).min(len);
        buf.truncate(n);
        self.enqueue(buf)
    }

    /// Checks a TLP and queues its buffer in its flow-control class.
    fn enqueue(&mut self, buf: Vec<u8>) -> Result<(), SendError> {
        let checked = match tlp_cost(&buf) {
            Err(e) => Err(SendError::InvalidTlp(e)),
            Ok(_) if 2 + buf.len() > self.mtu - HEADER_LEN - FC_LEN - TRAILER_LEN => {
                Err(SendError::TooLarge { len: buf.len(), mtu: self.mtu })
            }
            Ok((class, _, _)) if self.queues[class].len() >= self.cfg.max_queued => {
                let c = [FcClass::Posted, FcClass::NonPosted, FcClass::Completion][class];
                Err(SendError::QueueFull { class: c, limit: self.cfg.max_queued })
            }
            Ok((class, _, data)) => Ok((class, data)),
        };
        match checked {
            Ok((class, data)) => {
                self.queues[class].push_back(Queued {
                    order: self.next_order,
                    bytes: buf,
                    data_credits: data,
                });
                self.next_order += 1;
                Ok(())
            }
            Err(e) => {
                self.recycle(buf);
                Err(e)
            }
        }
    }

    /// The next TLP the peer sent, in order. Reading it returns its credits to the peer.
    /// Give the buffer back with [`Session::recycle`] to avoid allocation.
    pub fn recv_tlp(&mut self) -> Option<Vec<u8>> {
        let (tlp, class, h, d) = self.delivered.pop_front()?;
        self.allocated[2 * class] = self.allocated[2 * class].wrapping_add(h);
        self.allocated[2 * class + 1] = self.allocated[2 * class + 1].wrapping_add(d);
        Some(tlp)
    }

    /// Returns a buffer to the session's pool.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 4 * self.window as usize {
            self.pool.push(buf);
        }
    }

    /// Closes the session: a CLOSE frame goes out at the next `poll_transmit`.
    pub fn close(&mut self, _now: Time) {
        if !self.is_down() {
            let had_keys = self.tx_key.is_some();
            self.go_down(DownReason::Closed);
            self.close_due = had_keys;
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

    /// Writes the next datagram to send into `buf` (at least the MTU) and returns its
    /// length, or `None` when there is nothing to send now.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        let n = self.transmit(now, buf)?;
        self.stats.frames_sent += 1;
        self.last_tx = now;
        if self.state == State::Up {
            self.set_timer(Timer::Keepalive, now + self.cfg.keepalive_interval);
        }
        Some(n)
    }

    fn transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        let buf_len = buf.len().min(self.mtu);
        let buf = &mut buf[..buf_len];
        if self.close_due {
            self.close_due = false;
            return self.control_frame(FrameType::Close, buf);
        }
        match self.state {
            State::Down(_) => return None,
            State::ClientInit | State::ClientResponse | State::ServerChallenge if self.handshake_due => {
                self.handshake_due = false;
                return self.handshake_frame(buf);
            }
            State::ClientInit | State::ClientResponse | State::ServerChallenge => return None,
            State::Up => {}
        }
        if self.established_due {
            self.established_due = false;
            return self.control_frame(FrameType::Established, buf);
        }
        // Replays first: they hold up everything behind them at the receiver.
        while let Some(seq) = self.replay_due.pop_front() {
            if let Some(i) = self.unacked.iter().position(|s| s.seq == seq) {
                self.stats.retransmits += 1;
                let n = self.data_frame(buf, i);
                self.arm_replay(now);
                return n;
            }
        }
        if (self.unacked.len() as u32) < self.window && self.has_sendable() {
            let n = self.new_data_frame(buf);
            self.arm_replay(now);
            return n;
        }
        if self.keepalive_due {
            self.keepalive_due = false;
            return self.control_frame(FrameType::Keepalive, buf);
        }
        // Credits freed since the last advertisement go out at once when a quarter of any
        // grant has come back (a sender may be waiting for it); smaller returns wait for the
        // ACK timer or ride on the next frame, as PCIe batches UpdateFC DLLPs.
        let fc_due = self.allocated != self.advertised && {
            let grant = grant_array(&self.cfg);
            let urgent =
                (0..6).any(|i| self.allocated[i].wrapping_sub(self.advertised[i]) >= grant[i].div_ceil(4));
            if !urgent && self.timers[Timer::Ack as usize].is_none() {
                self.set_timer(Timer::Ack, now + self.cfg.ack_delay);
            }
            urgent || self.cfg.ack_delay.is_zero() || self.timer_passed(Timer::Ack, now)
        };
        let ack_ready = self.ack_due && (self.cfg.ack_delay.is_zero() || self.timer_passed(Timer::Ack, now));
        if self.nak_due || ack_ready || fc_due {
            self.stats.acks_sent += 1;
            return self.control_frame(FrameType::Ack, buf);
        }
        None
    }

    // ----- inputs -------------------------------------------------------------------------

    /// Handles one received datagram.
    pub fn handle_datagram(&mut self, now: Time, bytes: &[u8]) {
        self.handle_datagram_with(now, bytes, None);
    }

    /// Handles one received datagram, offering each TLP that is next in order to `sink`
    /// first, in place in `bytes`: a TLP the sink takes (returns `true`) is consumed there —
    /// its credits come back at once and [`Session::recv_tlp`] never sees it — and the rest
    /// queue for `recv_tlp` as usual. Offered only while nothing is queued before it, so the
    /// application sees every TLP in order either way. This is the receive path without a
    /// copy: a posted write's payload goes from the socket's buffer straight to its target.
    pub fn handle_datagram_with(&mut self, now: Time, bytes: &[u8], sink: Option<InPlace<'_>>) {
        let frame = match Frame::new_checked(bytes) {
            Ok(f) => f,
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return;
            }
        };
        self.handle_frame_with(now, &frame, sink);
    }

    /// Handles a frame already checked (an endpoint that demultiplexes checks once).
    pub fn handle_frame(&mut self, now: Time, frame: &Frame<'_>) {
        self.handle_frame_with(now, frame, None);
    }

    /// [`Session::handle_frame`] with a sink, as [`Session::handle_datagram_with`].
    pub fn handle_frame_with(&mut self, now: Time, frame: &Frame<'_>, sink: Option<InPlace<'_>>) {
        let h = frame.header();
        if self.is_down() {
            self.stats.dropped_unexpected += 1;
            return;
        }
        if (self.state, h.ty) == (State::ServerChallenge, FrameType::Init) {
            // Our CHALLENGE was lost; the client repeats INIT (which names no session yet).
            self.handshake_due = true;
            return;
        }
        if h.session != self.local_id {
            self.stats.dropped_wrong_session += 1;
            return;
        }
        match (self.state, h.ty) {
            (State::ClientInit, FrameType::Challenge) => return self.on_challenge(now, frame),
            (State::ServerChallenge | State::Up, FrameType::Response) if self.role == Role::Server => {
                return self.on_response(now, frame);
            }
            (_, FrameType::Init | FrameType::Challenge | FrameType::Response | FrameType::Unknown(_)) => {
                self.stats.dropped_unexpected += 1;
                return;
            }
            _ => {}
        }
        // Everything else is authenticated with the peer's frame key.
        let Some(key) = self.rx_key.as_ref() else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        if self.cfg.authenticate_frames && !key.verify(frame.authenticated(), &frame.tag()) {
            self.stats.dropped_bad_mac += 1;
            return;
        }
        if h.epoch != self.peer_epoch {
            self.stats.dropped_stale_epoch += 1;
            return;
        }
        if !self.accept_pn(h.pn) {
            self.stats.dropped_replayed += 1;
            return;
        }
        match self.state {
            State::ClientResponse => self.become_up(now),
            State::ServerChallenge => {
                // Authentic frames before RESPONSE cannot exist (the client has no keys
                // before it verified our proof), so this is out of order: drop.
                self.stats.dropped_unexpected += 1;
                return;
            }
            _ => {}
        }
        self.stats.frames_received += 1;
        self.set_timer(Timer::Idle, now + self.cfg.idle_timeout);
        if let Some(fc) = frame.fc() {
            let new = array_of(fc);
            for (l, n) in self.limit.iter_mut().zip(new) {
                // Limits only grow; an older frame's smaller limit is ignored.
                if n.wrapping_sub(*l) as i32 > 0 {
                    *l = n;
                }
            }
        }
        self.on_ack(now, SeqNum(h.ack), h.nak);
        match h.ty {
            FrameType::Data => self.on_data(now, SeqNum(h.seq), frame.body(), sink),
            FrameType::Close => self.go_down(DownReason::PeerClosed),
            _ => {}
        }
    }

    /// Handles expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        if self.timer_passed(Timer::Idle, now) {
            self.timers[Timer::Idle as usize] = None;
            let reason = match self.state {
                State::Up => DownReason::Timeout,
                _ if self.saw_bad_proof => DownReason::AuthFailed,
                _ => DownReason::HandshakeTimeout,
            };
            self.go_down(reason);
            return;
        }
        if self.timer_passed(Timer::Handshake, now) {
            if matches!(self.state, State::ClientInit | State::ClientResponse) {
                self.handshake_due = true;
                self.set_timer(Timer::Handshake, now + self.cfg.handshake_retry);
            } else {
                self.timers[Timer::Handshake as usize] = None;
            }
        }
        if self.timer_passed(Timer::Replay, now) {
            self.timers[Timer::Replay as usize] = None;
            if let Some(oldest) = self.unacked.front() {
                self.stats.replay_timeouts += 1;
                if !self.replay_due.contains(&oldest.seq) {
                    self.replay_due.push_back(oldest.seq);
                }
                self.replay_backoff = (self.replay_backoff + 1).min(16);
            }
        }
        // An expired ACK timer stays set: `transmit` sends the ACK and clears it.
        if self.timer_passed(Timer::Keepalive, now) {
            self.timers[Timer::Keepalive as usize] = None;
            if self.state == State::Up {
                // A keepalive carries the ACK and credits; sending it is what re-arms this.
                self.keepalive_due = true;
            }
        }
    }
}

impl Session {
    fn set_timer(&mut self, t: Timer, at: Time) {
        self.timers[t as usize] = Some(at);
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

    fn become_up(&mut self, now: Time) {
        self.state = State::Up;
        self.timers[Timer::Handshake as usize] = None;
        self.set_timer(Timer::Idle, now + self.cfg.idle_timeout);
        self.set_timer(Timer::Keepalive, now + self.cfg.keepalive_interval);
        self.events.push_back(Event::Up { peer_epoch: self.peer_epoch });
    }

    fn on_challenge(&mut self, now: Time, frame: &Frame<'_>) {
        let h = frame.header();
        let body = frame.body();
        if body.len() != CHALLENGE_BODY {
            self.stats.dropped_unexpected += 1;
            return;
        }
        let peer_id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
        let mtu = u16::from_be_bytes([body[20], body[21]]) as usize;
        let window = u16::from_be_bytes([body[22], body[23]]) as u32;
        let mut t = Vec::with_capacity(64);
        t.extend_from_slice(&self.local_epoch.to_be_bytes());
        t.extend_from_slice(&self.init_body());
        t.extend_from_slice(&h.epoch.to_be_bytes());
        t.extend_from_slice(&body[..24]);
        if !self.cfg.psk.verify(b"dxpu-v1 server proof", &t, &body[24..]) {
            // The server does not hold our key (or the frame was forged): keep trying until
            // the handshake times out, then report the failure.
            self.stats.auth_failures += 1;
            self.saw_bad_proof = true;
            return;
        }
        if peer_id == 0
            || mtu > self.mtu
            || window > self.window
            || window == 0
            || mtu < HEADER_LEN + FC_LEN + TRAILER_LEN + 64
        {
            self.stats.dropped_unexpected += 1;
            return;
        }
        self.peer_id = peer_id;
        self.peer_epoch = h.epoch;
        self.mtu = mtu;
        self.window = window;
        let (c2s, s2c) = self.cfg.psk.frame_keys(&t);
        self.tx_key = Some(c2s);
        self.rx_key = Some(s2c);
        self.transcript = t;
        self.state = State::ClientResponse;
        self.handshake_due = true;
        self.stats.frames_received += 1;
        self.set_timer(Timer::Handshake, now + self.cfg.handshake_retry);
    }

    fn on_response(&mut self, now: Time, frame: &Frame<'_>) {
        if frame.body().len() != RESPONSE_BODY || frame.header().epoch != self.peer_epoch {
            self.stats.dropped_unexpected += 1;
            return;
        }
        if !self.cfg.psk.verify(b"dxpu-v1 client proof", &self.transcript, frame.body()) {
            self.stats.auth_failures += 1;
            self.saw_bad_proof = true;
            return;
        }
        self.stats.frames_received += 1;
        if self.state == State::ServerChallenge {
            self.become_up(now);
        }
        // Repeated RESPONSE: our ESTABLISHED was lost.
        self.established_due = true;
    }

    fn init_body(&self) -> [u8; INIT_BODY] {
        let mut b = [0u8; INIT_BODY];
        b[0..4].copy_from_slice(&self.local_id.to_be_bytes());
        b[4..20].copy_from_slice(&self.local_nonce);
        b[20..22].copy_from_slice(&(self.cfg.mtu.min(u16::MAX as usize) as u16).to_be_bytes());
        b[22..24].copy_from_slice(&(self.cfg.window.min(u16::MAX as u32) as u16).to_be_bytes());
        b[24..32].copy_from_slice(&self.cfg.psk.key_id());
        b
    }

    fn header(&mut self, ty: FrameType, seq: SeqNum) -> Header {
        let pn = self.next_pn;
        self.next_pn += 1;
        Header {
            ty,
            session: self.peer_id,
            epoch: self.local_epoch,
            pn,
            seq: seq.0,
            ack: self.rx_next.0,
            nak: self.nak_due,
        }
    }

    fn mac(&self) -> impl Fn(&[u8]) -> [u8; TAG_LEN] + '_ {
        let key = if self.cfg.authenticate_frames { self.tx_key.as_ref() } else { None };
        move |bytes: &[u8]| key.map_or([0u8; TAG_LEN], |k| k.tag(bytes))
    }

    fn handshake_frame(&mut self, buf: &mut [u8]) -> Option<usize> {
        let unauthenticated = |_: &[u8]| [0u8; TAG_LEN];
        match self.state {
            State::ClientInit => {
                let body = self.init_body();
                let mut h = self.header(FrameType::Init, SeqNum(0));
                h.session = 0;
                write_frame(buf, &h, None, body.len(), |b| b.copy_from_slice(&body), unauthenticated).ok()
            }
            State::ClientResponse => {
                let proof = self.cfg.psk.proof(b"dxpu-v1 client proof", &self.transcript);
                let h = self.header(FrameType::Response, SeqNum(0));
                write_frame(buf, &h, None, proof.len(), |b| b.copy_from_slice(&proof), unauthenticated).ok()
            }
            State::ServerChallenge => {
                let proof = self.cfg.psk.proof(b"dxpu-v1 server proof", &self.transcript);
                let mut body = [0u8; CHALLENGE_BODY];
                // The transcript ends with what the CHALLENGE body carries before the proof.
                let t = &self.transcript;
                body[..24].copy_from_slice(&t[t.len() - 24..]);
                body[24..].copy_from_slice(&proof);
                let h = self.header(FrameType::Challenge, SeqNum(0));
                write_frame(buf, &h, None, body.len(), |b| b.copy_from_slice(&body), unauthenticated).ok()
            }
            _ => None,
        }
    }

    /// The FC block to send: always on control frames, on DATA only when it changed.
    fn fc_for(&mut self, always: bool) -> Option<FcLimits> {
        if always || self.allocated != self.advertised {
            self.advertised = self.allocated;
            Some(limits_of(self.allocated))
        } else {
            None
        }
    }

    fn control_frame(&mut self, ty: FrameType, buf: &mut [u8]) -> Option<usize> {
        let fc = self.fc_for(true);
        let h = self.header(ty, SeqNum(0));
        let mac = self.mac();
        let n = write_frame(buf, &h, fc.as_ref(), 0, |_| {}, mac).ok()?;
        self.after_ack_sent(h.nak);
        Some(n)
    }

    fn after_ack_sent(&mut self, nak: bool) {
        self.ack_due = false;
        self.timers[Timer::Ack as usize] = None;
        if nak {
            self.nak_due = false;
            self.stats.naks_sent += 1;
        }
    }

    /// Sends (again) the DATA frame at `index` of the replay buffer.
    fn data_frame(&mut self, buf: &mut [u8], index: usize) -> Option<usize> {
        let fc = self.fc_for(false);
        let seq = self.unacked[index].seq;
        let h = self.header(FrameType::Data, seq);
        let mac = self.mac();
        let sent = &self.unacked[index];
        let write_records = |b: &mut [u8]| {
            let mut at = 0;
            for t in &sent.tlps {
                b[at..at + 2].copy_from_slice(&(t.len() as u16).to_be_bytes());
                b[at + 2..at + 2 + t.len()].copy_from_slice(t);
                at += 2 + t.len();
            }
        };
        let n = write_frame(buf, &h, fc.as_ref(), sent.len, write_records, mac).ok()?;
        self.after_ack_sent(h.nak);
        Some(n)
    }

    /// Whether some queued TLP may go now (credits and ordering).
    fn has_sendable(&self) -> bool {
        self.next_sendable().is_some()
    }

    /// The class whose head TLP goes next: the oldest head that has credits and does not
    /// pass an earlier posted request (PCIe 6.0 §2.4.1: posted requests may pass
    /// non-posted requests and completions; nothing passes an earlier posted request).
    fn next_sendable(&self) -> Option<usize> {
        let posted_head = self.queues[0].front().map(|q| q.order);
        let mut best: Option<(u64, usize)> = None;
        for (class, q) in self.queues.iter().enumerate() {
            let Some(head) = q.front() else { continue };
            if class != 0 && posted_head.is_some_and(|p| p < head.order) {
                continue;
            }
            let h_ok = self.limit[2 * class].wrapping_sub(self.consumed[2 * class]) as i32 >= 1;
            let d_ok = self.limit[2 * class + 1].wrapping_sub(self.consumed[2 * class + 1]) as i32
                >= head.data_credits as i32;
            if h_ok && d_ok && best.is_none_or(|(o, _)| head.order < o) {
                best = Some((head.order, class));
            }
        }
        best.map(|(_, c)| c)
    }

    /// Packs as many sendable TLPs as fit into a new DATA frame and sends it.
    fn new_data_frame(&mut self, buf: &mut [u8]) -> Option<usize> {
        let room = self.mtu.min(buf.len()) - HEADER_LEN - FC_LEN - TRAILER_LEN;
        let mut frame = self.frame_pool.pop().unwrap_or_default();
        let mut len = 0;
        while let Some(class) = self.next_sendable() {
            let tlp_len = self.queues[class].front().map_or(0, |q| q.bytes.len());
            if len + 2 + tlp_len > room {
                break;
            }
            let Some(q) = self.queues[class].pop_front() else { break };
            len += 2 + q.bytes.len();
            self.consumed[2 * class] = self.consumed[2 * class].wrapping_add(1);
            self.consumed[2 * class + 1] = self.consumed[2 * class + 1].wrapping_add(q.data_credits);
            frame.push(q.bytes);
        }
        let tlps = frame.len() as u64;
        if tlps == 0 {
            self.frame_pool.push(frame);
            return None;
        }
        self.stats.tlps_sent += tlps;
        self.stats.data_frames_sent += 1;
        let seq = self.next_seq;
        self.next_seq = seq.next();
        self.unacked.push_back(Sent { seq, tlps: frame, len });
        let i = self.unacked.len() - 1;
        self.data_frame(buf, i)
    }

    fn arm_replay(&mut self, now: Time) {
        if !self.unacked.is_empty() && self.timers[Timer::Replay as usize].is_none() {
            let backoff = self.cfg.replay_timeout.saturating_mul(1 << self.replay_backoff.min(16));
            self.set_timer(Timer::Replay, now + backoff.min(self.cfg.max_replay_timeout));
        }
    }

    /// Anti-replay over packet numbers: a 64-entry window below the highest seen.
    fn accept_pn(&mut self, pn: u64) -> bool {
        if !self.rx_pn_any || pn > self.rx_pn_max {
            let shift = if self.rx_pn_any { pn - self.rx_pn_max } else { 64 };
            self.rx_pn_seen = if shift >= 64 { 0 } else { self.rx_pn_seen << shift };
            self.rx_pn_seen |= 1;
            self.rx_pn_max = pn;
            self.rx_pn_any = true;
            return true;
        }
        let back = self.rx_pn_max - pn;
        if back >= 64 || self.rx_pn_seen & (1 << back) != 0 {
            return false;
        }
        self.rx_pn_seen |= 1 << back;
        true
    }

    fn on_ack(&mut self, now: Time, ack: SeqNum, nak: bool) {
        let mut progressed = false;
        while self.unacked.front().is_some_and(|s| s.seq < ack) {
            if let Some(mut s) = self.unacked.pop_front() {
                for t in s.tlps.drain(..) {
                    self.recycle(t);
                }
                if self.frame_pool.len() < self.window as usize {
                    self.frame_pool.push(s.tlps);
                }
            }
            progressed = true;
        }
        if progressed {
            self.replay_backoff = 0;
            self.timers[Timer::Replay as usize] = None;
            self.replay_due.retain(|s| *s >= ack);
            self.arm_replay(now);
        }
        if nak {
            self.stats.naks_received += 1;
            if self.unacked.iter().any(|s| s.seq == ack) && !self.replay_due.contains(&ack) {
                self.replay_due.push_back(ack);
            }
        }
    }

    fn on_data(&mut self, now: Time, seq: SeqNum, body: &[u8], mut sink: Option<InPlace<'_>>) {
        self.ack_due = true;
        if !self.cfg.ack_delay.is_zero() && self.timers[Timer::Ack as usize].is_none() {
            self.set_timer(Timer::Ack, now + self.cfg.ack_delay);
        }
        let ahead = seq.distance_from(self.rx_next);
        if ahead < 0 {
            self.stats.duplicate_data += 1;
            return;
        }
        if ahead as u32 >= self.window {
            self.stats.dropped_out_of_window += 1;
            return;
        }
        if ahead > 0 {
            // A gap: hold this frame and NAK the first missing one, once per gap.
            let slot = ahead as usize - 1;
            if self.out_of_order.len() <= slot {
                self.out_of_order.resize_with(slot + 1, || None);
            }
            if self.out_of_order[slot].is_some() {
                self.stats.duplicate_data += 1;
            } else {
                let mut b = self.pool.pop().unwrap_or_default();
                b.clear();
                b.extend_from_slice(body);
                self.out_of_order[slot] = Some(b);
            }
            if self.nak_sent_for != Some(self.rx_next) {
                self.nak_sent_for = Some(self.rx_next);
                self.nak_due = true;
            }
            return;
        }
        self.deliver(body, &mut sink);
        self.rx_next = self.rx_next.next();
        // Slot 0 of the out-of-order buffer holds the frame after the one just delivered.
        while let Some(slot) = self.out_of_order.pop_front() {
            match slot {
                Some(b) => {
                    self.deliver(&b, &mut sink);
                    self.recycle(b);
                    self.rx_next = self.rx_next.next();
                }
                None => {
                    // rx_next is still missing; the rest is indexed from rx_next + 1 again.
                    if self.out_of_order.iter().any(Option::is_some)
                        && self.nak_sent_for != Some(self.rx_next)
                    {
                        self.nak_sent_for = Some(self.rx_next);
                        self.nak_due = true;
                    }
                    break;
                }
            }
        }
        if self.out_of_order.iter().all(Option::is_none) {
            self.out_of_order.clear();
        }
    }

    /// Hands a frame's TLPs to the application, charging their credits: to `sink` in place
    /// while nothing waits in the delivery queue before them, else to the queue.
    fn deliver(&mut self, body: &[u8], sink: &mut Option<InPlace<'_>>) {
        for rec in TlpRecords::new(body) {
            let Ok(tlp) = rec else {
                self.stats.malformed_tlps += 1;
                break;
            };
            let Ok((class, h, d)) = tlp_cost(tlp) else {
                self.stats.malformed_tlps += 1;
                continue;
            };
            let (hi, di) = (2 * class, 2 * class + 1);
            let h_used = self.rx_used[hi].wrapping_add(h);
            let d_used = self.rx_used[di].wrapping_add(d);
            if h_used.wrapping_sub(self.allocated[hi]) as i32 > 0
                || d_used.wrapping_sub(self.allocated[di]) as i32 > 0
            {
                self.go_down(DownReason::ProtocolViolation("TLP beyond granted credits"));
                return;
            }
            self.rx_used[hi] = h_used;
            self.rx_used[di] = d_used;
            self.stats.tlps_received += 1;
            if self.delivered.is_empty()
                && let Some(take) = sink.as_mut()
                && take(tlp)
            {
                // Consumed where it lies: the credits are free again.
                self.allocated[hi] = self.allocated[hi].wrapping_add(h);
                self.allocated[di] = self.allocated[di].wrapping_add(d);
                continue;
            }
            let mut b = self.pool.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(tlp);
            self.delivered.push_back((b, class, h, d));
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("role", &self.role)
            .field("state", &self.state)
            .field("local_id", &self.local_id)
            .field("peer_id", &self.peer_id)
            .field("next_seq", &self.next_seq)
            .field("rx_next", &self.rx_next)
            .finish_non_exhaustive()
    }
}
