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

use std::ops::Range;

use tlp::{TlpPacket, TlpRepr};
use zerocopy::{FromBytes, IntoBytes};

use crate::auth::{FrameKey, Rng};
use crate::config::Config;
use crate::credits::{self, RxCredits, TxCredits};
use crate::error::SendError;
use crate::handshake::{
    CLIENT_PROOF, COOKIE_LEN, ChallengeBody, CookieBody, InitBody, Refusal, RefuseBody, ResponseBody,
    SERVER_PROOF, options, transcript,
};
use crate::keys::{RxKeys, TxKeys, Which};
use crate::reorder::{Next, ReorderBuffer};
use crate::replay_buffer::{ReplayBuffer, Sent};
use crate::replay_window::ReplayWindow;
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::{
    BODY_AT, FC_LEN, FcLimits, Frame, FrameRepr, FrameType, HEADER_LEN, Header, TAG_LEN, TRAILER_LEN,
    TlpRecords, seal_in_place,
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
    /// The server refused the handshake: it has no room for another session.
    Refused,
}

impl std::fmt::Display for DownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DownReason::Timeout => {
                f.write_str("nothing authentic arrived from the peer within the idle timeout")
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
    /// Key updates of this side's sending key.
    pub key_updates: u64,
    /// Key updates of the peer's sending key this side followed.
    pub peer_key_updates: u64,
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

/// TLPs that leave together in one DATA frame, written where that frame is sent from:
/// `buf` has room for the frame's header and FC block (`BODY_AT` bytes), then the TLP
/// records; sealing the frame puts the header before them and the trailer after, so a TLP
/// is copied once, into this buffer, on its way to the socket (and kept here for replay).
struct Chunk {
    /// Send order of the first TLP.
    order: u64,
    /// A whole frame's room (the MTU), zeroed once when first allocated and reused after:
    /// a TLP is written over what was there, with no clearing first.
    buf: Vec<u8>,
    /// Where the records end (`BODY_AT` when empty).
    end: usize,
    /// TLPs per class: its header credits (a held-back chunk holds one class).
    tlps: [u32; 3],
    /// Data credits of its TLPs.
    data: u32,
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
    local_id: u32,
    peer_id: u32,
    local_epoch: u32,
    peer_epoch: u32,
    local_nonce: [u8; 16],
    /// Client: the cookie the server gave, echoed in INIT (zeros before one came).
    cookie: [u8; COOKIE_LEN],
    transcript: Vec<u8>,
    /// The frame keys, once the handshake made them.
    tx: Option<TxKeys>,
    rx: Option<RxKeys>,
    /// Negotiated: frames carry tags; DATA bodies are encrypted.
    authenticate: bool,
    encrypt: bool,
    /// Where an encrypted frame is decrypted (the receive buffer is not ours to change).
    scratch: Vec<u8>,
    mtu: usize,
    window: u32,
    saw_bad_proof: bool,
    handshake_due: bool,
    established_due: bool,
    close_due: bool,
    // Packet numbers: the next to send, and the window of those received (anti-replay).
    next_pn: u64,
    rx_pns: ReplayWindow,
    // Transmit side.
    next_seq: SeqNum,
    /// Sent DATA frames until acknowledged (and the buffers of freed ones, for reuse).
    replay: ReplayBuffer,
    /// Chunks whose TLPs had credits when queued (already charged), in PCIe order, waiting
    /// for the window; the last one takes more TLPs until it is full or sent.
    ready: VecDeque<Chunk>,
    /// Per class, chunks of TLPs held back: no credits when queued, or queued behind a
    /// held-back TLP they may not pass. Charged when they go.
    stalled: [VecDeque<Chunk>; 3],
    /// TLPs queued per class (ready and stalled).
    queued: [usize; 3],
    next_order: u64,
    /// The peer's credits: its limits, what this side consumed, its first grant.
    tx_credits: TxCredits,
    // Receive side.
    rx_next: SeqNum,
    /// DATA frames ahead of `rx_next`, waiting for the gap before them.
    out_of_order: ReorderBuffer,
    /// Delivered TLPs with their credit index and cost (header, data), for `recv_tlp`.
    delivered: VecDeque<(Vec<u8>, usize, u32, u32)>,
    /// The credits this side grants: allocated, advertised, used by the peer.
    rx_credits: RxCredits,
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

impl Session {
    fn blank(role: Role, cfg: Config, now: Time, mut rng: Rng) -> Session {
        let spare = 2 * cfg.window as usize;
        let mut local_nonce = [0u8; 16];
        rng.fill(&mut local_nonce);
        let local_id = rng.nonzero_u32();
        let local_epoch = rng.nonzero_u32();
        let rx_credits = RxCredits::new(cfg.credits);
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
            cookie: [0; COOKIE_LEN],
            transcript: Vec::new(),
            tx: None,
            rx: None,
            authenticate: true,
            encrypt: false,
            scratch: Vec::new(),
            saw_bad_proof: false,
            handshake_due: false,
            established_due: false,
            close_due: false,
            next_pn: 0,
            rx_pns: ReplayWindow::default(),
            next_seq: SeqNum(0),
            replay: ReplayBuffer::new(spare),
            ready: VecDeque::new(),
            stalled: [VecDeque::new(), VecDeque::new(), VecDeque::new()],
            queued: [0; 3],
            next_order: 0,
            tx_credits: TxCredits::default(),
            rx_next: SeqNum(0),
            out_of_order: ReorderBuffer::default(),
            delivered: VecDeque::new(),
            rx_credits,
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

    /// A server session for a client that has proven its key (see [`crate::Endpoint`],
    /// which runs the handshake statelessly until then): up at once, with ESTABLISHED due.
    pub(crate) fn accepted(cfg: Config, now: Time, rng: Rng, a: Accepted) -> Session {
        let mut s = Session::blank(Role::Server, cfg, now, rng);
        s.local_id = a.local_id;
        s.local_epoch = a.local_epoch;
        s.peer_id = a.peer_id;
        s.peer_epoch = a.peer_epoch;
        s.mtu = a.mtu;
        s.window = a.window;
        s.replay.set_spare_limit(2 * a.window as usize);
        let (c2s, s2c) = s.cfg.psk.frame_keys(&a.transcript);
        s.set_keys(s2c, c2s, a.options);
        s.transcript = a.transcript;
        s.stats.frames_received += 1;
        s.become_up(now);
        s.established_due = true;
        s
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
            queued_bytes: self
                .ready
                .iter()
                .chain(self.stalled.iter().flatten())
                .map(|c| c.end - BODY_AT - 2 * c.tlps.iter().sum::<u32>() as usize)
                .sum(),
            queued_tlps: self.queued.iter().sum(),
            unacked_frames: self.replay.len(),
            unacked_bytes: self.replay.bytes(),
            out_of_order_frames: self.out_of_order.held(),
            delivered_tlps: self.delivered.len(),
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
        (self.authenticate, self.encrypt)
    }
    /// The peer's session ID (0 before the handshake has told it).
    pub fn peer_id(&self) -> u32 {
        self.peer_id
    }
    /// Nothing is queued or waiting for acknowledgement.
    pub fn is_idle(&self) -> bool {
        self.replay.is_empty() && self.queued.iter().all(|q| *q == 0)
    }

    // ----- application commands ---------------------------------------------------------

    /// Queues one TLP. It goes out, in PCIe order, as soon as credits and the window allow.
    /// Its bytes are copied once, into the buffer its frame is sent from.
    pub fn send_tlp(&mut self, bytes: &[u8]) -> Result<(), SendError> {
        if self.state != State::Up {
            return Err(SendError::NotConnected);
        }
        let (class, _, data) = tlp_cost(bytes).map_err(SendError::InvalidTlp)?;
        self.enqueue(class, data, bytes.len(), Source::Bytes(bytes))
    }

    /// Queues the TLP `tlp` describes, emitted straight into the buffer its frame is sent
    /// from: a payload it carries (a completion's data read from host memory, say) is copied
    /// once between its source and the socket.
    pub fn send_repr(&mut self, tlp: &TlpRepr<'_>) -> Result<(), SendError> {
        if self.state != State::Up {
            return Err(SendError::NotConnected);
        }
        let class = credits::index(tlp.fc_class());
        let data = tlp.credits().data as u32;
        self.enqueue(class, data, tlp.buffer_len(), Source::Repr(tlp))
    }

    /// Room for TLP records in one DATA frame.
    fn room(&self) -> usize {
        self.mtu - HEADER_LEN - FC_LEN - TRAILER_LEN
    }

    /// Writes a TLP of `class` (`data` data credits, `len` bytes at most) into the chunk it
    /// will be sent in. It joins the ready chunks if it may go now — its class has the
    /// credits and nothing held back comes before it that it may not pass (PCIe 6.0 §2.4.1:
    /// posted requests may pass non-posted requests and completions; nothing passes an
    /// earlier posted request; a class keeps its own order) — and is charged at once; else
    /// it is held back in its class.
    fn enqueue(&mut self, class: usize, data: u32, len: usize, src: Source<'_, '_>) -> Result<(), SendError> {
        let room = self.room();
        if 2 + len > room {
            return Err(SendError::TooLarge { len, mtu: self.mtu });
        }
        if self.queued[class] >= self.cfg.max_queued {
            return Err(SendError::QueueFull { class: credits::CLASSES[class], limit: self.cfg.max_queued });
        }
        let now = self.stalled[0].is_empty()
            && self.stalled[class].is_empty()
            && self.tx_credits.covers(class, 1, data);
        let (cap_h, cap_d) = self.tx_credits.chunk_cap(class, data);
        let queue = if now { &mut self.ready } else { &mut self.stalled[class] };
        let joins = queue.back().is_some_and(|c| {
            c.end + 2 + len <= BODY_AT + room && (now || (c.tlps[class] < cap_h && c.data + data <= cap_d))
        });
        if !joins {
            let mut buf = self.replay.take_buffer();
            if buf.len() < self.mtu {
                // Room for a whole frame at once: appending TLPs and sealing never move it.
                buf.resize(self.mtu, 0);
            }
            queue.push_back(Chunk { order: self.next_order, buf, end: BODY_AT, tlps: [0; 3], data: 0 });
        }
        let Some(chunk) = queue.back_mut() else { return Err(SendError::NotConnected) };
        let at = chunk.end;
        let tlp = &mut chunk.buf[at + 2..at + 2 + len];
        let written = match src {
            Source::Bytes(b) => {
                tlp.copy_from_slice(b);
                Ok(len)
            }
            Source::Repr(t) => match t.emit(tlp) {
                Ok(0) => Err(tlp::Error::Truncated { needed: 4, actual: 0 }),
                r => r,
            },
        };
        match written {
            Ok(n) => {
                chunk.buf[at..at + 2].copy_from_slice(&(n as u16).to_be_bytes());
                chunk.end = at + 2 + n;
            }
            Err(e) => {
                if at == BODY_AT
                    && let Some(c) = queue.pop_back()
                {
                    self.replay.give_buffer(c.buf);
                }
                return Err(SendError::InvalidTlp(e));
            }
        }
        // What the receiver will charge, from the bytes, is what was decided from `src`.
        debug_assert_eq!(
            tlp_cost(&chunk.buf[at + 2..chunk.end]).map(|(c, _, d)| (c, d)).ok(),
            Some((class, data)),
            "credit cost of a queued TLP"
        );
        chunk.tlps[class] += 1;
        chunk.data += data;
        if now {
            self.tx_credits.charge(class, 1, data);
        }
        self.queued[class] += 1;
        self.next_order += 1;
        Ok(())
    }

    /// The next TLP the peer sent, in order. Reading it returns its credits to the peer.
    /// Give the buffer back with [`Session::recycle`] to avoid allocation.
    pub fn recv_tlp(&mut self) -> Option<Vec<u8>> {
        let (tlp, class, h, d) = self.delivered.pop_front()?;
        self.rx_credits.release(class, h, d);
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
            let had_keys = self.tx.is_some();
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

    /// Writes the next datagram to send into `buf` (at least the MTU: a DATA frame longer
    /// than `buf` is cut short, and the peer drops it as malformed until a replay) and
    /// returns its length, or `None` when there is nothing to send now. A DATA frame is
    /// copied into `buf` from where it was sealed; [`Session::poll_transmit_in_place`]
    /// saves that copy.
    pub fn poll_transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<usize> {
        match self.poll_transmit_in_place(now, buf)? {
            Transmit::Written(n) => Some(n),
            Transmit::Sealed(f) => {
                let bytes = self.sealed(&f);
                let n = bytes.len().min(buf.len());
                buf[..n].copy_from_slice(&bytes[..n]);
                Some(n)
            }
        }
    }

    /// The next datagram to send, or `None` when there is nothing to send now: a control
    /// frame is written into `buf` (at least the MTU); a DATA frame is sealed in place in
    /// the replay buffer, where its TLPs were written, and its bytes are [`Session::sealed`]'s
    /// — hand them to the socket before the session next changes.
    pub fn poll_transmit_in_place(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let t = self.transmit(now, buf)?;
        self.stats.frames_sent += 1;
        self.last_tx = now;
        if self.state == State::Up {
            self.set_timer(Timer::Keepalive, now + self.cfg.keepalive_interval);
        }
        Some(t)
    }

    /// The bytes of a DATA frame [`Session::poll_transmit_in_place`] sealed (empty if it was
    /// acknowledged since).
    pub fn sealed(&self, f: &SealedFrame) -> &[u8] {
        self.replay.find(f.seq).and_then(|s| s.buf.get(f.start..f.end)).unwrap_or(&[])
    }

    fn transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let written = |n: Option<usize>| n.map(Transmit::Written);
        let buf_len = buf.len().min(self.mtu);
        let buf = &mut buf[..buf_len];
        if self.close_due {
            self.close_due = false;
            return written(self.control_frame(FrameType::Close, buf));
        }
        match self.state {
            State::Down(_) => return None,
            State::ClientInit | State::ClientResponse if self.handshake_due => {
                self.handshake_due = false;
                return written(self.handshake_frame(buf));
            }
            State::ClientInit | State::ClientResponse => return None,
            State::Up => {}
        }
        if self.established_due {
            self.established_due = false;
            return written(self.control_frame(FrameType::Established, buf));
        }
        // Replays first: they hold up everything behind them at the receiver.
        if let Some(i) = self.replay.next_due() {
            self.stats.retransmits += 1;
            let f = self.data_frame(i);
            self.arm_replay(now);
            return self.data_transmit(f?, buf);
        }
        if (self.replay.len() as u32) < self.window
            && let Some(from) = self.next_chunk()
        {
            let f = self.new_data_frame(from);
            self.arm_replay(now);
            return self.data_transmit(f?, buf);
        }
        if self.keepalive_due {
            self.keepalive_due = false;
            return written(self.control_frame(FrameType::Keepalive, buf));
        }
        // Credits freed since the last advertisement go out at once when a quarter of any
        // grant has come back (a sender may be waiting for it); smaller returns wait for the
        // ACK timer or ride on the next frame, as PCIe batches UpdateFC DLLPs.
        let fc_due = self.rx_credits.changed() && {
            let urgent = self.rx_credits.urgent();
            if !urgent && self.timers[Timer::Ack as usize].is_none() {
                self.set_timer(Timer::Ack, now + self.cfg.ack_delay);
            }
            urgent || self.cfg.ack_delay.is_zero() || self.timer_passed(Timer::Ack, now)
        };
        let ack_ready = self.ack_due && (self.cfg.ack_delay.is_zero() || self.timer_passed(Timer::Ack, now));
        if self.nak_due || ack_ready || fc_due {
            self.stats.acks_sent += 1;
            return written(self.control_frame(FrameType::Ack, buf));
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
        if h.session != self.local_id {
            self.stats.dropped_wrong_session += 1;
            return;
        }
        match (self.state, h.ty) {
            (State::ClientInit, FrameType::Cookie) => return self.on_cookie(frame),
            (State::ClientInit, FrameType::Challenge) => return self.on_challenge(now, frame),
            (State::ClientInit | State::ClientResponse, FrameType::Refuse) => return self.on_refuse(frame),
            (State::Up, FrameType::Response) if self.role == Role::Server => return self.on_response(frame),
            (_, ty) if ty.is_handshake() => {
                self.stats.dropped_unexpected += 1;
                return;
            }
            (_, FrameType::Unknown(_)) => {
                self.stats.dropped_unexpected += 1;
                return;
            }
            _ => {}
        }
        // Everything else is authenticated with the peer's frame key of the phase the frame
        // says; an encrypted body is decrypted into `scratch` (the receive buffer is not ours).
        let Some(rx) = self.rx.as_mut() else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        let which = rx.which(h.key_phase, h.pn);
        let key = rx.key(which);
        let mut decrypted = None;
        if self.encrypt && !frame.body().is_empty() {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            let bytes = frame.bytes();
            scratch.extend_from_slice(&bytes[..bytes.len() - 4]);
            match key.open(&mut scratch, frame.body_at()) {
                Some(len) => decrypted = Some((scratch, len)),
                None => {
                    self.scratch = scratch;
                    self.stats.dropped_bad_mac += 1;
                    return;
                }
            }
        } else if self.authenticate && !key.verify(frame.authenticated(), &frame.tag()) {
            self.stats.dropped_bad_mac += 1;
            return;
        }
        if self.authenticate && which == Which::Next {
            // Authentic under the next key: the peer updated its key.
            rx.advance(h.pn);
            self.stats.peer_key_updates += 1;
        }
        if h.epoch != self.peer_epoch {
            self.stats.dropped_stale_epoch += 1;
            return;
        }
        if !self.rx_pns.accept(h.pn) {
            self.stats.dropped_replayed += 1;
            return;
        }
        if self.state == State::ClientResponse {
            self.become_up(now);
        }
        self.stats.frames_received += 1;
        self.set_timer(Timer::Idle, now + self.cfg.idle_timeout);
        if let Some(fc) = frame.fc() {
            self.tx_credits.update(fc);
        }
        self.on_ack(now, SeqNum(h.ack), h.nak);
        match h.ty {
            FrameType::Data => match decrypted {
                Some((scratch, len)) => {
                    let at = frame.body_at();
                    self.on_data(now, SeqNum(h.seq), &scratch[at..at + len], sink);
                    self.scratch = scratch;
                }
                None => self.on_data(now, SeqNum(h.seq), frame.body(), sink),
            },
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
            if self.replay.timed_out() {
                self.stats.replay_timeouts += 1;
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

    /// COOKIE: the server keeps nothing until INIT echoes this. Taken only if it echoes
    /// our nonce (an off-path sender does not know it); INIT goes again at once.
    fn on_cookie(&mut self, frame: &Frame<'_>) {
        match CookieBody::ref_from_bytes(frame.body()) {
            Ok(c) if c.nonce == self.local_nonce => {
                self.cookie = c.cookie;
                self.handshake_due = true;
                self.stats.frames_received += 1;
            }
            _ => self.stats.dropped_unexpected += 1,
        }
    }

    /// REFUSE echoing our nonce: the server does not hold our key, or has no room.
    fn on_refuse(&mut self, frame: &Frame<'_>) {
        match RefuseBody::ref_from_bytes(frame.body()) {
            Ok(r) if r.nonce == self.local_nonce => {
                self.stats.frames_received += 1;
                match Refusal::from_byte(r.reason) {
                    Refusal::UnknownKey => {
                        self.stats.auth_failures += 1;
                        self.go_down(DownReason::AuthFailed);
                    }
                    Refusal::Full | Refusal::Unknown(_) => self.go_down(DownReason::Refused),
                }
            }
            _ => self.stats.dropped_unexpected += 1,
        }
    }

    fn on_challenge(&mut self, now: Time, frame: &Frame<'_>) {
        let h = frame.header();
        let Ok(c) = ChallengeBody::ref_from_bytes(frame.body()) else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        let t = transcript(self.local_epoch, &self.init_body(), h.epoch, c);
        if !self.cfg.psk.verify(SERVER_PROOF, &t, &c.proof) {
            // The server does not hold our key (or the frame was forged): keep trying until
            // the handshake times out, then report the failure.
            self.stats.auth_failures += 1;
            self.saw_bad_proof = true;
            return;
        }
        let (peer_id, mtu, window) = (c.server_id.get(), c.mtu.get() as usize, c.window.get() as u32);
        // The server may only add to what this side asked of the frames (its proof covers
        // both), never take from it.
        let asked = options::of(&self.cfg);
        if peer_id == 0
            || c.options & asked != asked
            || c.options & !options::KNOWN != 0
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
        self.replay.set_spare_limit(2 * window as usize);
        let (c2s, s2c) = self.cfg.psk.frame_keys(&t);
        self.set_keys(c2s, s2c, c.options);
        self.transcript = t;
        self.state = State::ClientResponse;
        self.handshake_due = true;
        self.stats.frames_received += 1;
        self.set_timer(Timer::Handshake, now + self.cfg.handshake_retry);
    }

    /// A repeated RESPONSE on a live server session: our ESTABLISHED was lost.
    fn on_response(&mut self, frame: &Frame<'_>) {
        let Ok(r) = ResponseBody::ref_from_bytes(frame.body()) else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        if frame.header().epoch != self.peer_epoch {
            self.stats.dropped_unexpected += 1;
            return;
        }
        if !self.cfg.psk.verify(CLIENT_PROOF, &self.transcript, &r.proof) {
            self.stats.auth_failures += 1;
            return;
        }
        self.stats.frames_received += 1;
        self.established_due = true;
    }

    fn init_body(&self) -> InitBody {
        InitBody {
            client_id: self.local_id.into(),
            nonce: self.local_nonce,
            mtu: (self.cfg.mtu.min(u16::MAX as usize) as u16).into(),
            window: (self.cfg.window.min(u16::MAX as u32) as u16).into(),
            key_id: self.cfg.psk.key_id(),
            options: options::of(&self.cfg),
            reserved: 0,
            cookie: self.cookie,
        }
    }

    /// The next frame's header; its key is counted (and updated when due) here, so that the
    /// frame carries the phase of the key it is sealed under.
    fn header(&mut self, ty: FrameType, seq: SeqNum) -> Header {
        let pn = self.next_pn;
        self.next_pn += 1;
        let key_phase = match &mut self.tx {
            Some(t) => {
                let phase = t.for_frame().1;
                self.stats.key_updates = t.updates;
                phase
            }
            None => false,
        };
        Header {
            ty,
            session: self.peer_id,
            epoch: self.local_epoch,
            pn,
            seq: seq.0,
            ack: self.rx_next.0,
            nak: self.nak_due,
            key_phase,
        }
    }

    /// The tag of a frame whose body is sent as it is (every frame of a session that does not
    /// encrypt, and those with no body in one that does: GCM over an empty plaintext is GMAC).
    fn mac(&self) -> impl Fn(&[u8]) -> [u8; TAG_LEN] + '_ {
        let key = if self.authenticate { self.tx.as_ref().map(TxKeys::key) } else { None };
        move |bytes: &[u8]| key.map_or([0u8; TAG_LEN], |k| k.tag(bytes))
    }

    /// A DATA frame to send: where it was sealed, or an encrypted copy in `buf`.
    fn data_transmit(&self, f: SealedFrame, buf: &mut [u8]) -> Option<Transmit> {
        if self.encrypt {
            self.encrypt_into(&f, buf).map(Transmit::Written)
        } else {
            Some(Transmit::Sealed(f))
        }
    }

    /// The session's keys, both ways, and what it does to its frames.
    fn set_keys(&mut self, tx: FrameKey, rx: FrameKey, negotiated: u8) {
        self.tx = Some(TxKeys::new(tx, self.cfg.key_update_frames));
        self.rx = Some(RxKeys::new(rx));
        self.authenticate = negotiated & options::AUTHENTICATE != 0;
        self.encrypt = negotiated & options::ENCRYPT != 0;
    }

    /// A sealed DATA frame, encrypted: copied into `buf` (the plaintext stays in the replay
    /// buffer, to be sealed again under a fresh packet number if it is replayed), its body
    /// encrypted there and its tag and CRC written. The frame's length in `buf`.
    fn encrypt_into(&self, f: &SealedFrame, buf: &mut [u8]) -> Option<usize> {
        let frame = self.sealed(f);
        let out = buf.get_mut(..frame.len())?;
        out.copy_from_slice(frame);
        let key = self.tx.as_ref()?.key();
        crate::wire::reseal(out, |b, body_at| key.seal(b, body_at));
        Some(out.len())
    }

    fn handshake_frame(&mut self, buf: &mut [u8]) -> Option<usize> {
        let unauthenticated = |_: &[u8]| [0u8; TAG_LEN];
        let init = self.init_body();
        match self.state {
            State::ClientInit => {
                let mut h = self.header(FrameType::Init, SeqNum(0));
                h.session = 0;
                let body = init.as_bytes();
                FrameRepr { header: h, fc: None, body }.emit(buf, unauthenticated).ok()
            }
            State::ClientResponse => {
                let proof = self.cfg.psk.proof(CLIENT_PROOF, &self.transcript);
                let r = ResponseBody { init, proof };
                let h = self.header(FrameType::Response, SeqNum(0));
                let body = r.as_bytes();
                FrameRepr { header: h, fc: None, body }.emit(buf, unauthenticated).ok()
            }
            _ => None,
        }
    }

    /// The FC block to send: always on control frames, on DATA only when it changed.
    fn fc_for(&mut self, always: bool) -> Option<FcLimits> {
        if always || self.rx_credits.changed() { Some(self.rx_credits.advertise()) } else { None }
    }

    fn control_frame(&mut self, ty: FrameType, buf: &mut [u8]) -> Option<usize> {
        let fc = self.fc_for(true);
        let h = self.header(ty, SeqNum(0));
        let mac = self.mac();
        let n = FrameRepr { header: h, fc, body: &[] }.emit(buf, mac).ok()?;
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

    /// Seals (again) the DATA frame at `index` of the replay buffer, in place.
    fn data_frame(&mut self, index: usize) -> Option<SealedFrame> {
        let fc = self.fc_for(false);
        let seq = self.replay.get_mut(index)?.seq;
        let h = self.header(FrameType::Data, seq);
        // An encrypting session seals its copy of the frame instead (`encrypt_into`).
        let tags = self.authenticate && !self.encrypt;
        let key = if tags { self.tx.as_ref().map(TxKeys::key) } else { None };
        let mac = |bytes: &[u8]| key.map_or([0u8; TAG_LEN], |k| k.tag(bytes));
        let sent = self.replay.get_mut(index)?;
        if sent.buf.len() < BODY_AT + sent.len + TRAILER_LEN {
            sent.buf.resize(BODY_AT + sent.len + TRAILER_LEN, 0);
        }
        let Range { start, end } = seal_in_place(&mut sent.buf, &h, fc.as_ref(), sent.len, mac).ok()?;
        self.after_ack_sent(h.nak);
        Some(SealedFrame { seq, start, end })
    }

    /// Where the next DATA frame comes from — `None` inside: the oldest ready chunk;
    /// `Some(class)`: that class's oldest held-back chunk — whichever holds the earliest TLP
    /// among those that may go now: a held-back chunk needs its credits and must not pass
    /// an earlier held-back posted chunk. (A ready chunk never holds a TLP that may not pass
    /// what is held back: see `enqueue`.)
    fn next_chunk(&self) -> Option<Option<usize>> {
        let mut best = self.ready.front().map(|c| (c.order, None));
        let posted_head = self.stalled[0].front().map(|c| c.order);
        for (class, q) in self.stalled.iter().enumerate() {
            let Some(head) = q.front() else { continue };
            if class != 0 && posted_head.is_some_and(|p| p < head.order) {
                continue;
            }
            if self.tx_credits.covers(class, head.tlps[class], head.data)
                && best.is_none_or(|(o, _)| head.order < o)
            {
                best = Some((head.order, Some(class)));
            }
        }
        best.map(|(_, from)| from)
    }

    /// Takes the chunk `next_chunk` chose into the replay buffer as a new DATA frame and
    /// seals it.
    fn new_data_frame(&mut self, from: Option<usize>) -> Option<SealedFrame> {
        let chunk = match from {
            None => self.ready.pop_front()?,
            Some(class) => {
                let c = self.stalled[class].pop_front()?;
                self.tx_credits.charge(class, c.tlps[class], c.data);
                c
            }
        };
        for (q, n) in self.queued.iter_mut().zip(chunk.tlps) {
            *q -= n as usize;
        }
        self.stats.tlps_sent += chunk.tlps.iter().sum::<u32>() as u64;
        self.stats.data_frames_sent += 1;
        let seq = self.next_seq;
        self.next_seq = seq.next();
        if let Some(tx) = &mut self.tx {
            tx.first_sent(seq);
        }
        let len = chunk.end - BODY_AT;
        let index = self.replay.push(Sent { seq, buf: chunk.buf, len });
        self.data_frame(index)
    }

    fn arm_replay(&mut self, now: Time) {
        if !self.replay.is_empty() && self.timers[Timer::Replay as usize].is_none() {
            let timeout = self.replay.timeout(self.cfg.replay_timeout, self.cfg.max_replay_timeout);
            self.set_timer(Timer::Replay, now + timeout);
        }
    }

    fn on_ack(&mut self, now: Time, ack: SeqNum, nak: bool) {
        if let Some(tx) = &mut self.tx {
            tx.acked(ack);
        }
        if self.replay.acknowledge(ack).freed > 0 {
            self.timers[Timer::Replay as usize] = None;
            self.arm_replay(now);
        }
        if nak {
            self.stats.naks_received += 1;
            self.replay.nak(ack);
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
            if !self.out_of_order.hold(ahead as usize, body, &mut self.pool) {
                self.stats.duplicate_data += 1;
            }
            self.nak_gap();
            return;
        }
        self.deliver(body, &mut sink);
        self.rx_next = self.rx_next.next();
        loop {
            match self.out_of_order.pop_next() {
                Next::Held(b) => {
                    self.deliver(&b, &mut sink);
                    self.recycle(b);
                    self.rx_next = self.rx_next.next();
                }
                // rx_next is still missing, with frames after it held.
                Next::Gap => break self.nak_gap(),
                Next::Empty => break,
            }
        }
    }

    /// A NAK for the first missing frame, once per gap.
    fn nak_gap(&mut self) {
        if self.nak_sent_for != Some(self.rx_next) {
            self.nak_sent_for = Some(self.rx_next);
            self.nak_due = true;
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
            if !self.rx_credits.take(class, h, d) {
                self.go_down(DownReason::ProtocolViolation("TLP beyond granted credits"));
                return;
            }
            self.stats.tlps_received += 1;
            if self.delivered.is_empty()
                && let Some(take) = sink.as_mut()
                && take(tlp)
            {
                // Consumed where it lies: the credits are free again.
                self.rx_credits.release(class, h, d);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tlp::{Address, Bdf, Body, Request, Tag};

    fn test_config() -> Config {
        Config::new(crate::PresharedKey::new(b"dxpu unit test key, 32 bytes....").unwrap())
    }

    /// A client and a server session joined in memory, handshake done.
    fn pair() -> (Session, Session) {
        pair_with(test_config(), test_config())
    }

    /// [`pair`] with these configurations.
    fn pair_with(client: Config, server: Config) -> (Session, Session) {
        let t = Time::from_nanos(1);
        let mut c = Session::client(client, t, 1, Rng::from_u64(1));
        let mut ep: crate::Endpoint<u8> = crate::Endpoint::new(server, 2, Rng::from_u64(2), 1);
        let mut buf = vec![0u8; 2048];
        // INIT, COOKIE, INIT, CHALLENGE, RESPONSE: the endpoint's answers, then the session.
        for _ in 0..3 {
            while let Some(n) = c.poll_transmit(t, &mut buf) {
                ep.handle_datagram(t, 0, &buf[..n]);
            }
            while let Some((_, n)) = ep.poll_transmit(&mut buf) {
                c.handle_datagram(t, &buf[..n]);
            }
        }
        let mut s = ep.into_sessions().next().unwrap();
        for _ in 0..2 {
            while let Some(n) = s.poll_transmit(t, &mut buf) {
                c.handle_datagram(t, &buf[..n]);
            }
            while let Some(n) = c.poll_transmit(t, &mut buf) {
                s.handle_datagram(t, &buf[..n]);
            }
        }
        assert!(c.is_up() && s.is_up());
        (c, s)
    }

    fn write(payload: &[u8]) -> TlpRepr<'_> {
        TlpRepr::new(Body::MemWrite {
            req: Request {
                requester: Bdf::new(0, 1, 0),
                tag: Tag::default(),
                first_be: 0xf,
                last_be: if payload.len() > 4 { 0xf } else { 0 },
            },
            address: Address::Bits64(0x1_0000_0000),
            ph: 0,
            data: payload,
        })
    }

    /// A TLP is written once, into the buffer its DATA frame is then sent from: the sealed
    /// frame lies in the very buffer `send_repr` emitted into, and replays come from it too.
    #[test]
    fn a_tlp_is_sent_from_where_it_was_written() {
        let (mut c, mut s) = pair();
        let payload: Vec<u8> = (0..256u16).map(|i| i as u8).collect();
        c.send_repr(&write(&payload)).unwrap();
        c.send_repr(&write(&payload[..64])).unwrap();
        let written = c.ready.back().map(|ch| ch.buf.as_ptr() as usize).unwrap();
        assert_eq!(c.ready.len(), 1, "two TLPs queued together share a frame");
        let t = Time::from_nanos(2);
        let mut control = vec![0u8; 2048];
        let Some(Transmit::Sealed(f)) = c.poll_transmit_in_place(t, &mut control) else {
            panic!("no DATA frame")
        };
        let frame = c.sealed(&f).to_vec();
        let at = c.sealed(&f).as_ptr() as usize;
        assert!(at >= written && at < written + BODY_AT, "frame not sealed in the TLPs' buffer");
        let parsed = Frame::new_checked(&frame).unwrap();
        let recs: Vec<&[u8]> = TlpRecords::new(parsed.body()).map(Result::unwrap).collect();
        assert_eq!(recs.len(), 2);
        assert_eq!(&recs[0][recs[0].len() - 256..], &payload[..]);
        // The replay timer fires: the same buffer is sealed again (a new packet number).
        let later = Time::from_nanos(50_000_000);
        c.handle_timeout(later);
        let Some(Transmit::Sealed(r)) = c.poll_transmit_in_place(later, &mut control) else {
            panic!("no replay")
        };
        let replay_at = c.sealed(&r).as_ptr() as usize;
        assert!(replay_at >= written && replay_at < written + BODY_AT);
        let replay = c.sealed(&r).to_vec();
        assert_eq!(Frame::new_checked(&replay).unwrap().body(), parsed.body());
        // Both copies deliver once; the acknowledgement empties the replay buffer.
        s.handle_datagram(later, &frame);
        s.handle_datagram(later, &replay);
        assert_eq!(s.memory().delivered_tlps, 2);
        let acked = Time::from_nanos(51_000_000);
        s.handle_timeout(acked);
        while let Some(n) = s.poll_transmit(acked, &mut control) {
            c.handle_datagram(acked, &control[..n]);
        }
        assert_eq!(c.memory().unacked_frames, 0);
        assert!(c.sealed(&r).is_empty(), "an acknowledged frame has no bytes to send");
    }

    /// A TLP without credits is held back in its class and goes, in its own frame, when
    /// credits come; the posted writes queued behind a held-back read pass it.
    #[test]
    fn held_back_tlps_wait_for_credits_and_writes_pass_them() {
        let (mut c, mut s) = pair();
        let nph = c.tx_credits.grant().get(credits::index(tlp::FcClass::NonPosted)).header;
        let read = TlpRepr::new(Body::MemRead {
            req: Request { requester: Bdf::new(0, 1, 0), tag: Tag::default(), first_be: 0xf, last_be: 0 },
            address: Address::Bits32(0x1000),
            ph: 0,
            length_dw: 1,
            locked: false,
        });
        for _ in 0..nph + 2 {
            c.send_repr(&read).unwrap();
        }
        c.send_repr(&write(&[1, 2, 3, 4])).unwrap();
        assert_eq!(c.stalled[1].iter().map(|ch| ch.tlps[1]).sum::<u32>(), 2);
        assert_eq!(c.queued, [1, nph as usize + 2, 0]);
        let t = Time::from_nanos(2);
        let mut buf = vec![0u8; 2048];
        while let Some(n) = c.poll_transmit(t, &mut buf) {
            s.handle_datagram(t, &buf[..n]);
        }
        // Everything the credits allow arrived (the write passed the two held-back reads).
        assert_eq!(s.memory().delivered_tlps, nph as usize + 1);
        assert_eq!(c.memory().queued_tlps, 2);
        // The server drains: credits come back, the held-back reads go.
        while let Some(b) = s.recv_tlp() {
            s.recycle(b);
        }
        for _ in 0..3 {
            while let Some(n) = s.poll_transmit(t, &mut buf) {
                c.handle_datagram(t, &buf[..n]);
            }
            while let Some(n) = c.poll_transmit(t, &mut buf) {
                s.handle_datagram(t, &buf[..n]);
            }
        }
        assert_eq!(s.memory().delivered_tlps, 2);
        assert!(c.is_idle() || c.memory().queued_tlps == 0);
    }

    /// Sends `n` writes of `payload` from `c` to `s` and back acknowledgements; returns the
    /// datagrams `c` sent.
    fn exchange(c: &mut Session, s: &mut Session, payload: &[u8], n: usize, t: &mut Time) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        let mut wire = Vec::new();
        for _ in 0..n {
            c.send_repr(&write(payload)).unwrap();
            *t = *t + core::time::Duration::from_micros(100);
            while let Some(len) = c.poll_transmit(*t, &mut buf) {
                wire.push(buf[..len].to_vec());
                s.handle_datagram(*t, &buf[..len]);
            }
            while let Some(r) = s.recv_tlp() {
                s.recycle(r);
            }
            *t = *t + core::time::Duration::from_millis(1);
            s.handle_timeout(*t);
            while let Some(len) = s.poll_transmit(*t, &mut buf) {
                c.handle_datagram(*t, &buf[..len]);
            }
        }
        wire
    }

    #[test]
    fn an_encrypted_session_sends_no_plaintext_and_takes_no_altered_frame() {
        let mut enc = test_config();
        enc.encrypt_frames = true;
        // Only the server asks: the session encrypts all the same, both ways.
        let (mut c, mut s) = pair_with(test_config(), enc);
        assert_eq!((c.frame_protection(), s.frame_protection()), ((true, true), (true, true)));
        let secret = *b"a tenant's model weights: not for you!!!";
        let mut t = Time::from_nanos(10);
        let wire = exchange(&mut c, &mut s, &secret, 8, &mut t);
        let data: Vec<&Vec<u8>> = wire.iter().filter(|f| f[3] == 5).collect();
        assert!(!data.is_empty());
        for f in &data {
            assert!(!f.windows(secret.len()).any(|w| w == secret), "plaintext on the wire");
        }
        assert_eq!(s.stats().tlps_received, 8);
        // A bit flipped in an encrypted body (CRC fixed up): the tag catches it.
        let before = s.stats().dropped_bad_mac;
        let mut f = data[0].clone();
        f[60] ^= 1;
        let len = f.len();
        let crc = crate::wire::crc32c(&f[..len - 4]);
        f[len - 4..].copy_from_slice(&crc.to_be_bytes());
        s.handle_datagram(t, &f);
        assert_eq!(s.stats().dropped_bad_mac, before + 1);
        // The same payload in a session that only tags frames is on the wire as it is.
        let (mut c, mut s) = pair();
        assert_eq!(c.frame_protection(), (true, false));
        let wire = exchange(&mut c, &mut s, &secret, 1, &mut t);
        assert!(wire.iter().any(|f| f.windows(secret.len()).any(|w| w == secret)));
    }

    #[test]
    fn tags_are_on_when_either_side_asks_for_them() {
        let mut untagged = test_config();
        untagged.authenticate_frames = false;
        let (c, s) = pair_with(untagged.clone(), test_config());
        assert_eq!((c.frame_protection(), s.frame_protection()), ((true, false), (true, false)));
        let (c, s) = pair_with(untagged.clone(), untagged);
        assert_eq!((c.frame_protection(), s.frame_protection()), ((false, false), (false, false)));
    }

    #[test]
    fn keys_update_without_dropping_the_session() {
        let mut cfg = test_config();
        cfg.encrypt_frames = true;
        cfg.key_update_frames = 16;
        let (mut c, mut s) = pair_with(cfg.clone(), cfg);
        let mut t = Time::from_nanos(10);
        exchange(&mut c, &mut s, &[7u8; 64], 200, &mut t);
        assert_eq!(s.stats().tlps_received, 200);
        assert!(c.stats().key_updates >= 5, "{:?}", c.stats());
        assert_eq!(s.stats().peer_key_updates, c.stats().key_updates);
        assert!(s.stats().key_updates >= 1 && c.stats().peer_key_updates == s.stats().key_updates);
        assert!(c.is_up() && s.is_up());
        assert_eq!(s.stats().dropped_bad_mac + c.stats().dropped_bad_mac, 0);
    }

    /// A client in its handshake, the INIT it sent (body), and a way to hand it a frame of
    /// `ty` with `body` from the server's epoch 2.
    fn client_after_init(cfg: Config) -> (Session, InitBody) {
        let t = Time::from_nanos(1);
        let mut c = Session::client(cfg, t, 1, Rng::from_u64(1));
        let mut buf = vec![0u8; 2048];
        let n = c.poll_transmit(t, &mut buf).unwrap();
        let f = Frame::new_checked(&buf[..n]).unwrap();
        let init = InitBody::read_from_bytes(f.body()).unwrap();
        (c, init)
    }

    fn to_client(c: &mut Session, ty: FrameType, body: &[u8]) {
        let h = Header { session: c.local_id(), epoch: 2, ..Header::new(ty) };
        let mut buf = vec![0u8; 256];
        let n = FrameRepr { header: h, fc: None, body }.emit(&mut buf, |_| [0; TAG_LEN]).unwrap();
        c.handle_datagram(Time::from_nanos(2), &buf[..n]);
    }

    /// COOKIE and REFUSE carry no proof: a client takes them only when they echo the nonce of
    /// its own INIT, which an off-path sender never saw.
    #[test]
    fn a_cookie_or_refusal_not_echoing_the_clients_nonce_is_ignored() {
        let (mut c, init) = client_after_init(test_config());
        let mut wrong = init.nonce;
        wrong[0] ^= 1;
        to_client(&mut c, FrameType::Cookie, CookieBody { nonce: wrong, cookie: [7; COOKIE_LEN] }.as_bytes());
        to_client(
            &mut c,
            FrameType::Refuse,
            RefuseBody { nonce: wrong, reason: 2, reserved: [0; 3] }.as_bytes(),
        );
        assert_eq!(c.cookie, [0; COOKIE_LEN], "a forged cookie was taken");
        assert!(!c.is_down() && c.poll_event().is_none(), "a forged refusal ended the handshake");
        assert_eq!(c.stats().dropped_unexpected, 2);
        // The same with the right nonce: taken.
        to_client(
            &mut c,
            FrameType::Cookie,
            CookieBody { nonce: init.nonce, cookie: [7; COOKIE_LEN] }.as_bytes(),
        );
        assert_eq!(c.cookie, [7; COOKIE_LEN]);
        // A reason this version does not know still ends it, as a refusal.
        to_client(
            &mut c,
            FrameType::Refuse,
            RefuseBody { nonce: init.nonce, reason: 99, reserved: [0; 3] }.as_bytes(),
        );
        assert_eq!(c.poll_event(), Some(Event::Down(DownReason::Refused)));
    }

    /// A CHALLENGE with a valid proof (a server holding the key) that drops encryption the
    /// client asked for is refused; the same CHALLENGE granting it is taken.
    #[test]
    fn a_challenge_weaker_than_what_the_client_asked_is_refused() {
        let mut cfg = test_config();
        cfg.encrypt_frames = true;
        for (options, taken) in
            [(options::AUTHENTICATE, false), (0, false), (options::KNOWN | 4, false), (options::KNOWN, true)]
        {
            let (mut c, init) = client_after_init(cfg.clone());
            let mut ch = ChallengeBody {
                server_id: 5.into(),
                nonce: [1; 16],
                mtu: 1472.into(),
                window: 128.into(),
                options,
                reserved: 0,
                proof: [0; 32],
            };
            ch.proof = cfg.psk.proof(SERVER_PROOF, &transcript(1, &init, 2, &ch));
            to_client(&mut c, FrameType::Challenge, ch.as_bytes());
            assert_eq!(c.state == State::ClientResponse, taken, "options {options:#x}");
            assert_eq!(c.stats().dropped_unexpected, u64::from(!taken), "options {options:#x}");
        }
    }
}
