//! Server-side demultiplexing: many sessions behind one socket. Frames are routed by the
//! receiver's session ID. The handshake runs statelessly here until the client has proven
//! its key (see [`crate::handshake`]): an INIT gets a COOKIE, an INIT echoing a valid cookie
//! gets a CHALLENGE, and only a RESPONSE with a valid proof makes a session — bounded in
//! number. Only then may the new session end an older one from the same peer address: with
//! another epoch the peer restarted, with the same epoch it started over. An endpoint may
//! hold several pre-shared keys (one per host it serves): INIT names the client's key by its
//! identifier; an INIT naming no key held is refused (REFUSE), so the client learns of the
//! mismatch at once.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::hash::Hash;

use zerocopy::{FromBytes, IntoBytes};

use crate::auth::{PresharedKey, Rng};
use crate::config::Config;
use crate::handshake::{
    CLIENT_PROOF, ChallengeBody, CookieBody, CookieError, Cookies, InitBody, Refusal, RefuseBody,
    ResponseBody, SERVER_PROOF, options, transcript,
};
use crate::session::{Accepted, DownReason, InPlaceFrom, Session};
use crate::session_ids::SessionMap;
use crate::time::Time;
use crate::wire::{FC_LEN, Frame, FrameRepr, FrameType, HEADER_LEN, Header, TAG_LEN, TRAILER_LEN};

/// Counters of frames the endpoint handled itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams that were not frames.
    pub dropped_malformed: u64,
    /// Frames for a session ID that is not live.
    pub dropped_unknown_session: u64,
    /// Handshakes refused because the session table was full.
    pub refused_full: u64,
    /// Sessions replaced because their peer restarted.
    pub peer_restarts: u64,
    /// INITs naming a key this endpoint does not hold (refused).
    pub unknown_key: u64,
    /// COOKIEs sent (INITs without a valid cookie).
    pub cookies_sent: u64,
    /// INITs or RESPONSEs whose cookie did not verify (forged, another address, an earlier
    /// run of this endpoint).
    pub bad_cookies: u64,
    /// INITs or RESPONSEs whose cookie had expired (the client gets a new one).
    pub expired_cookies: u64,
    /// Handshake frames of the wrong length or with impossible limits.
    pub bad_handshakes: u64,
    /// RESPONSEs whose proof did not verify.
    pub auth_failures: u64,
    /// Proven RESPONSEs older than the live session of the same peer (replayed): dropped,
    /// the live session untouched.
    pub stale_handshakes: u64,
    /// Stateless answers dropped because too many were waiting to be sent.
    pub replies_dropped: u64,
    /// TLPs the sessions delivered, all of them (authenticated, in order): what tells a
    /// busy-polling runner that TLPs move, where a datagram's header alone could be forged.
    pub tlps_received: u64,
}

/// A handshake the endpoint turned down from an address that receives (its cookie was
/// valid), for the operator's log ([`Endpoint::poll_failure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client named a key this endpoint does not hold.
    UnknownKey,
    /// The client's proof of the key it named was wrong.
    BadProof,
    /// No session slot was free.
    Full,
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HandshakeFailure::UnknownKey => "it presented a key this endpoint does not hold",
            HandshakeFailure::BadProof => "its proof of the key it named was wrong",
            HandshakeFailure::Full => "no session slot was free",
        })
    }
}

/// Failed handshakes kept for [`Endpoint::poll_failure`] at most; more are only counted.
const MAX_FAILURES: usize = 16;

/// Stateless answers (COOKIE, CHALLENGE, REFUSE) waiting for [`Endpoint::poll_transmit`] at
/// most; more are dropped (the client retries).
const MAX_REPLIES: usize = 256;

/// A stateless answer: the frame's bytes, at most an INIT's length.
struct Reply<A> {
    to: A,
    len: usize,
    bytes: [u8; REPLY_MAX],
}

const REPLY_MAX: usize = HEADER_LEN + size_of::<InitBody>() + TRAILER_LEN;

/// A live session with the peer address it came from and when its cookie was issued (a
/// later handshake from that address may replace it; an earlier one, replayed, may not).
struct Live<A> {
    addr: A,
    cookie_issued: Time,
    session: Session,
}

/// A server endpoint: sessions keyed by ID, each remembered with its peer address `A`.
///
/// Inputs: [`Endpoint::handle_datagram`], [`Endpoint::handle_timeout`]. Outputs:
/// [`Endpoint::poll_transmit`] for the endpoint's own handshake answers, each session's
/// `poll_transmit` for the rest, [`Endpoint::poll_timeout`].
pub struct Endpoint<A> {
    cfg: Config,
    keys: Vec<([u8; 8], PresharedKey)>,
    epoch: u32,
    rng: Rng,
    max_sessions: usize,
    cookies: Cookies,
    sessions: SessionMap<Live<A>>,
    replies: VecDeque<Reply<A>>,
    failures: VecDeque<(A, HandshakeFailure)>,
    stats: EndpointStats,
}

impl<A: Copy + Eq + Hash> Endpoint<A> {
    /// An endpoint accepting up to `max_sessions` sessions, holding the key in `cfg`. Its
    /// cookies are valid for `cfg.handshake_timeout` (a client's whole handshake).
    pub fn new(cfg: Config, epoch: u32, mut rng: Rng, max_sessions: usize) -> Endpoint<A> {
        let keys = vec![(cfg.psk.key_id(), cfg.psk.clone())];
        let mut secret = [0u8; 64];
        rng.fill(&mut secret);
        let cookies = Cookies::new(secret, cfg.handshake_timeout);
        Endpoint {
            cfg,
            keys,
            epoch,
            rng,
            max_sessions,
            cookies,
            sessions: SessionMap::default(),
            replies: VecDeque::new(),
            failures: VecDeque::new(),
            stats: EndpointStats::default(),
        }
    }

    /// Holds one more key: clients presenting it are answered with it.
    pub fn add_key(&mut self, psk: PresharedKey) {
        let id = psk.key_id();
        if !self.keys.iter().any(|(k, _)| *k == id) {
            self.keys.push((id, psk));
        }
    }

    /// Forgets the key `key_id` names: handshakes presenting it fail from now on (sessions
    /// made with it go on until their owner ends them).
    pub fn remove_key(&mut self, key_id: [u8; 8]) {
        self.keys.retain(|(k, _)| *k != key_id);
    }

    /// Routes one datagram from `from`; returns the ID of the session it went to.
    pub fn handle_datagram(&mut self, now: Time, from: A, bytes: &[u8]) -> Option<u32> {
        self.handle_datagram_with(now, from, bytes, None)
    }

    /// [`Endpoint::handle_datagram`], offering in-order TLPs to `sink` in place first (see
    /// [`Session::handle_datagram_with`]); the sink learns which session each came from.
    pub fn handle_datagram_with(
        &mut self,
        now: Time,
        from: A,
        bytes: &[u8],
        sink: Option<InPlaceFrom<'_>>,
    ) -> Option<u32> {
        let Ok(frame) = Frame::new_checked(bytes) else {
            self.stats.dropped_malformed += 1;
            return None;
        };
        let h = frame.header();
        if h.ty == FrameType::Init {
            self.on_init(now, from, &frame);
            return None;
        }
        match self.sessions.get_mut(&h.session) {
            Some(live) => {
                let (id, s) = (h.session, &mut live.session);
                let before = s.stats().tlps_received;
                match sink {
                    Some(sink) => s.handle_frame_with(now, &frame, Some(&mut |t: &[u8]| sink(id, t))),
                    None => s.handle_frame(now, &frame),
                }
                self.stats.tlps_received += s.stats().tlps_received - before;
                Some(id)
            }
            None if h.ty == FrameType::Response => self.on_response(now, from, &frame),
            None => {
                self.stats.dropped_unknown_session += 1;
                None
            }
        }
    }

    /// The endpoint's next handshake answer: written into `buf`, with where it goes.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<(A, usize)> {
        let r = self.replies.pop_front()?;
        let n = r.len.min(buf.len());
        buf[..n].copy_from_slice(&r.bytes[..n]);
        Some((r.to, n))
    }

    /// The next handshake turned down (an address that receives, a key not held, a wrong
    /// proof, no room), for the operator's log: at most the last few are kept, the counters
    /// ([`EndpointStats`]) have them all.
    pub fn poll_failure(&mut self) -> Option<(A, HandshakeFailure)> {
        self.failures.pop_front()
    }

    fn failed(&mut self, from: A, why: HandshakeFailure) {
        if self.failures.len() < MAX_FAILURES {
            self.failures.push_back((from, why));
        }
    }

    /// Checks an INIT's or RESPONSE's cookie, counting a failure.
    fn cookie(&mut self, now: Time, from: &A, epoch: u32, init: &InitBody) -> Result<Time, CookieError> {
        let checked = self.cookies.check(now, from, epoch, init);
        match checked {
            Err(CookieError::Forged) => self.stats.bad_cookies += 1,
            Err(CookieError::Expired) => self.stats.expired_cookies += 1,
            _ => {}
        }
        checked
    }

    /// The CHALLENGE for an INIT with a valid cookie (derived, nothing kept), and the key.
    fn challenge(&self, epoch: u32, init: &InitBody) -> Option<(ChallengeBody, &PresharedKey)> {
        let (_, key) = self.keys.iter().find(|(id, _)| *id == init.key_id)?;
        let (server_id, nonce) = self.cookies.server_id_and_nonce(epoch, init);
        let mtu = self.cfg.mtu.min(init.mtu.get() as usize);
        let window = self.cfg.window.min(init.window.get() as u32).max(1);
        let mut c = ChallengeBody {
            server_id: server_id.into(),
            nonce,
            mtu: (mtu as u16).into(),
            window: (window as u16).into(),
            options: options::negotiated(init.options, options::of(&self.cfg)),
            reserved: 0,
            proof: [0; 32],
        };
        c.proof = key.proof(SERVER_PROOF, &transcript(epoch, init, self.epoch, &c));
        Some((c, key))
    }

    /// Whether a new session from `from` has room: it replaces that address's live session,
    /// if any, or needs a free slot.
    fn has_room(&mut self, from: &A) -> bool {
        self.reap();
        self.sessions.len() < self.max_sessions
            || self.sessions.values().any(|l| l.addr == *from && !l.session.is_down())
    }

    fn on_init(&mut self, now: Time, from: A, frame: &Frame<'_>) {
        let epoch = frame.header().epoch;
        let Ok(init) = InitBody::read_from_bytes(frame.body()) else {
            self.stats.bad_handshakes += 1;
            return;
        };
        let to = init.client_id.get();
        if to == 0 || (init.mtu.get() as usize) < HEADER_LEN + FC_LEN + TRAILER_LEN + 64 {
            self.stats.bad_handshakes += 1;
            return;
        }
        if self.cookie(now, &from, epoch, &init).is_err() {
            // Missing, forged or expired: a fresh one, and nothing kept.
            let cookie =
                CookieBody { nonce: init.nonce, cookie: self.cookies.issue(now, &from, epoch, &init) };
            self.stats.cookies_sent += 1;
            return self.reply(from, FrameType::Cookie, to, cookie.as_bytes());
        }
        // The client receives at its address: it may learn why it cannot have a session.
        let Some((challenge, _)) = self.challenge(epoch, &init) else {
            self.stats.unknown_key += 1;
            self.failed(from, HandshakeFailure::UnknownKey);
            return self.refuse(from, to, &init, Refusal::UnknownKey);
        };
        if !self.has_room(&from) {
            self.stats.refused_full += 1;
            self.failed(from, HandshakeFailure::Full);
            return self.refuse(from, to, &init, Refusal::Full);
        }
        self.reply(from, FrameType::Challenge, to, challenge.as_bytes());
    }

    fn on_response(&mut self, now: Time, from: A, frame: &Frame<'_>) -> Option<u32> {
        let h = frame.header();
        let Ok(r) = ResponseBody::read_from_bytes(frame.body()) else {
            self.stats.bad_handshakes += 1;
            return None;
        };
        let issued = self.cookie(now, &from, h.epoch, &r.init).ok()?;
        let Some((challenge, key)) = self.challenge(h.epoch, &r.init).map(|(c, k)| (c, k.clone())) else {
            self.stats.unknown_key += 1;
            return None;
        };
        if challenge.server_id.get() != h.session {
            self.stats.dropped_unknown_session += 1;
            return None;
        }
        let t = transcript(h.epoch, &r.init, self.epoch, &challenge);
        if !key.verify(CLIENT_PROOF, &t, &r.proof) {
            self.stats.auth_failures += 1;
            self.failed(from, HandshakeFailure::BadProof);
            return None;
        }
        let mut cfg = self.cfg.clone();
        cfg.psk = key;
        // Proven. A live session of the same peer ends only for a later handshake than its
        // own: a replayed RESPONSE (its cookie still valid) cannot take a newer one away.
        if self.sessions.values().any(|l| l.addr == from && !l.session.is_down() && l.cookie_issued > issued)
        {
            self.stats.stale_handshakes += 1;
            return None;
        }
        if !self.has_room(&from) {
            self.stats.refused_full += 1;
            self.failed(from, HandshakeFailure::Full);
            self.refuse(from, r.init.client_id.get(), &r.init, Refusal::Full);
            return None;
        }
        for l in self.sessions.values_mut() {
            if l.addr == from && !l.session.is_down() {
                let restarted = l.session.peer_epoch() != h.epoch;
                l.session.superseded(if restarted {
                    DownReason::PeerRestarted
                } else {
                    DownReason::Superseded
                });
                if restarted {
                    self.stats.peer_restarts += 1;
                }
            }
        }
        let mut seed = [0u8; 32];
        self.rng.fill(&mut seed);
        let id = challenge.server_id.get();
        let accepted = Accepted {
            local_id: id,
            local_epoch: self.epoch,
            peer_id: r.init.client_id.get(),
            peer_epoch: h.epoch,
            mtu: challenge.mtu.get() as usize,
            window: challenge.window.get() as u32,
            options: challenge.options,
            transcript: t,
        };
        let session = Session::accepted(cfg, now, Rng::new(seed), accepted);
        self.sessions.insert(id, Live { addr: from, cookie_issued: issued, session });
        Some(id)
    }

    fn refuse(&mut self, to: A, client_id: u32, init: &InitBody, why: Refusal) {
        let body = RefuseBody { nonce: init.nonce, reason: why.byte(), reserved: [0; 3] };
        self.reply(to, FrameType::Refuse, client_id, body.as_bytes());
    }

    fn reply(&mut self, to: A, ty: FrameType, session: u32, body: &[u8]) {
        if self.replies.len() >= MAX_REPLIES {
            self.stats.replies_dropped += 1;
            return;
        }
        let h = Header { session, epoch: self.epoch, ..Header::new(ty) };
        let mut bytes = [0u8; REPLY_MAX];
        let unauthenticated = |_: &[u8]| [0u8; TAG_LEN];
        let frame = FrameRepr { header: h, fc: None, body };
        if let Ok(len) = frame.emit(&mut bytes, unauthenticated) {
            self.replies.push_back(Reply { to, len, bytes });
        }
    }

    /// The session with this ID.
    pub fn session(&mut self, id: u32) -> Option<&mut Session> {
        self.sessions.get_mut(&id).map(|l| &mut l.session)
    }

    /// Every session with its peer address.
    pub fn sessions(&mut self) -> impl Iterator<Item = (u32, A, &mut Session)> {
        self.sessions.iter_mut().map(|(id, l)| (*id, l.addr, &mut l.session))
    }

    /// Forgets sessions that are down and whose events were read.
    pub fn reap(&mut self) {
        self.sessions.retain(|_, l| !l.session.is_down() || l.session.has_events());
    }

    /// The sessions, out of the endpoint (a test joins one to a client directly).
    #[cfg(test)]
    pub(crate) fn into_sessions(self) -> impl Iterator<Item = Session> {
        self.sessions.into_values().map(|l| l.session)
    }

    /// Counters.
    pub fn stats(&self) -> &EndpointStats {
        &self.stats
    }

    /// This endpoint's epoch.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The earliest timer of any session.
    pub fn poll_timeout(&self) -> Option<Time> {
        self.sessions.values().filter_map(|l| l.session.poll_timeout()).min()
    }

    /// Runs expired timers of every session.
    pub fn handle_timeout(&mut self, now: Time) {
        for l in self.sessions.values_mut() {
            l.session.handle_timeout(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Event;
    use core::time::Duration;

    fn cfg() -> Config {
        Config::new(PresharedKey::new(b"endpoint unit test key, 32 bytes").unwrap())
    }

    /// Runs `c` against `ep` from `addr` in memory until nothing moves; returns the frames the
    /// client sent.
    fn exchange(ep: &mut Endpoint<u8>, c: &mut Session, addr: u8, t: Time) -> Vec<Vec<u8>> {
        let mut buf = vec![0u8; 2048];
        let mut sent = Vec::new();
        for _ in 0..6 {
            while let Some(n) = c.poll_transmit(t, &mut buf) {
                sent.push(buf[..n].to_vec());
                ep.handle_datagram(t, addr, &buf[..n]);
            }
            let mut back = Vec::new();
            while let Some((to, n)) = ep.poll_transmit(&mut buf) {
                back.push((to, buf[..n].to_vec()));
            }
            for (_, a, s) in ep.sessions() {
                while let Some(n) = s.poll_transmit(t, &mut buf) {
                    back.push((a, buf[..n].to_vec()));
                }
            }
            for (to, f) in back {
                if to == addr {
                    c.handle_datagram(t, &f);
                }
            }
        }
        sent
    }

    fn down_reason(s: &mut Session) -> Option<DownReason> {
        std::iter::from_fn(|| s.poll_event()).find_map(|e| match e {
            Event::Down(r) => Some(r),
            _ => None,
        })
    }

    #[test]
    fn nothing_is_kept_before_the_client_proves_its_key() {
        let t = Time::from_nanos(1);
        let mut ep: Endpoint<u8> = Endpoint::new(cfg(), 2, Rng::from_u64(2), 4);
        let mut c = Session::client(cfg(), t, 1, Rng::from_u64(1));
        let mut buf = vec![0u8; 2048];
        // INIT → COOKIE; INIT with the cookie → CHALLENGE: still no session.
        for expected in [FrameType::Cookie, FrameType::Challenge] {
            let n = c.poll_transmit(t, &mut buf).unwrap();
            assert_eq!(ep.handle_datagram(t, 9, &buf[..n]), None);
            assert_eq!(ep.sessions().count(), 0);
            let (to, n) = ep.poll_transmit(&mut buf).unwrap();
            assert_eq!((to, Frame::new_checked(&buf[..n]).unwrap().header().ty), (9, expected));
            c.handle_datagram(t, &buf[..n]);
        }
        // RESPONSE with its proof: now there is one, and it is up.
        let n = c.poll_transmit(t, &mut buf).unwrap();
        let id = ep.handle_datagram(t, 9, &buf[..n]).unwrap();
        assert!(ep.session(id).unwrap().is_up());
        assert_eq!(ep.stats().cookies_sent, 1);
    }

    #[test]
    fn a_response_with_a_bad_proof_or_cookie_makes_no_session() {
        let t = Time::from_nanos(1);
        let mut ep: Endpoint<u8> = Endpoint::new(cfg(), 2, Rng::from_u64(2), 4);
        let mut c = Session::client(cfg(), t, 1, Rng::from_u64(1));
        let mut buf = vec![0u8; 2048];
        for _ in 0..2 {
            let n = c.poll_transmit(t, &mut buf).unwrap();
            ep.handle_datagram(t, 9, &buf[..n]);
            let (_, n) = ep.poll_transmit(&mut buf).unwrap();
            c.handle_datagram(t, &buf[..n]);
        }
        let n = c.poll_transmit(t, &mut buf).unwrap();
        let response = buf[..n].to_vec();
        let body = HEADER_LEN;
        let refresh = |f: &mut Vec<u8>| {
            let len = f.len();
            let crc = crate::wire::crc32c(&f[..len - 4]);
            f[len - 4..].copy_from_slice(&crc.to_be_bytes());
        };
        // A flipped bit in the proof, in the cookie, or in a field the cookie covers.
        for at in [body + 60, body + 40, body + 4] {
            let mut f = response.clone();
            f[at] ^= 1;
            refresh(&mut f);
            assert_eq!(ep.handle_datagram(t, 9, &f), None);
        }
        // From another address, the cookie does not hold.
        assert_eq!(ep.handle_datagram(t, 10, &response), None);
        assert_eq!(ep.sessions().count(), 0);
        assert_eq!(ep.stats().auth_failures, 1);
        assert_eq!(ep.stats().bad_cookies, 3);
        // Past the cookie's lifetime (the handshake timeout), not even the real one works.
        let late = t + cfg().handshake_timeout + Duration::from_millis(1);
        assert_eq!(ep.handle_datagram(late, 9, &response), None);
        assert_eq!(ep.stats().expired_cookies, 1);
        assert!(ep.handle_datagram(t, 9, &response).is_some());
    }

    #[test]
    fn a_replayed_response_cannot_replace_a_later_session() {
        let mut t = Time::from_nanos(1);
        let mut ep: Endpoint<u8> = Endpoint::new(cfg(), 2, Rng::from_u64(2), 4);
        let mut old = Session::client(cfg(), t, 1, Rng::from_u64(1));
        let old_frames = exchange(&mut ep, &mut old, 9, t);
        assert!(old.is_up());
        // The host restarts (new epoch) a millisecond later: the old session is replaced.
        t = t + Duration::from_millis(1);
        let mut new = Session::client(cfg(), t, 77, Rng::from_u64(77));
        exchange(&mut ep, &mut new, 9, t);
        assert!(new.is_up());
        assert_eq!(ep.stats().peer_restarts, 1);
        let live = ep.sessions().find(|(_, _, s)| !s.is_down()).map(|(id, _, _)| id).unwrap();
        // Every frame of the old handshake again, within the old cookie's lifetime: first while
        // the old session is still remembered (down), then once it has been forgotten.
        t = t + Duration::from_millis(1);
        for f in &old_frames {
            ep.handle_datagram(t, 9, f);
        }
        assert!(!ep.session(live).unwrap().is_down(), "the newer session was replaced");
        for (_, _, s) in ep.sessions() {
            while s.poll_event().is_some() {}
        }
        ep.reap();
        assert_eq!(ep.sessions().count(), 1);
        for f in &old_frames {
            ep.handle_datagram(t, 9, f);
        }
        assert!(ep.stats().stale_handshakes >= 1);
        assert!(!ep.session(live).unwrap().is_down(), "the newer session was replaced");
        assert_eq!(ep.sessions().filter(|(_, _, s)| !s.is_down()).count(), 1);
    }

    #[test]
    fn unknown_keys_and_a_full_table_are_refused_at_once_with_the_reason() {
        let t = Time::from_nanos(1);
        let mut ep: Endpoint<u8> = Endpoint::new(cfg(), 2, Rng::from_u64(2), 1);
        let mut stranger = cfg();
        stranger.psk = PresharedKey::new(b"a key the box was never given...").unwrap();
        let mut c = Session::client(stranger, t, 1, Rng::from_u64(1));
        exchange(&mut ep, &mut c, 9, t);
        assert_eq!(down_reason(&mut c), Some(DownReason::AuthFailed));
        assert_eq!((ep.stats().unknown_key, ep.sessions().count()), (1, 0));

        let mut first = Session::client(cfg(), t, 1, Rng::from_u64(2));
        exchange(&mut ep, &mut first, 9, t);
        assert!(first.is_up());
        let mut second = Session::client(cfg(), t, 3, Rng::from_u64(3));
        exchange(&mut ep, &mut second, 10, t);
        assert_eq!(down_reason(&mut second), Some(DownReason::Refused));
        assert_eq!(ep.stats().refused_full, 1);
        // The same address may still start over: its new session replaces its old one.
        let mut again = Session::client(cfg(), t, 1, Rng::from_u64(4));
        exchange(&mut ep, &mut again, 9, t);
        assert!(again.is_up());
    }

    #[test]
    fn answers_are_never_longer_than_what_asked_and_are_bounded_in_number() {
        let t = Time::from_nanos(1);
        let mut ep: Endpoint<u8> = Endpoint::new(cfg(), 2, Rng::from_u64(2), 4);
        let mut buf = vec![0u8; 2048];
        let mut init_len = 0;
        for i in 0..(MAX_REPLIES + 10) as u64 {
            let mut c = Session::client(cfg(), t, 1, Rng::from_u64(i));
            let n = c.poll_transmit(t, &mut buf).unwrap();
            init_len = n;
            ep.handle_datagram(t, (i % 200) as u8, &buf[..n]);
        }
        assert_eq!(ep.stats().replies_dropped, 10);
        let mut answers = 0;
        while let Some((_, n)) = ep.poll_transmit(&mut buf) {
            assert!(n <= init_len, "answer of {n} bytes to an INIT of {init_len}");
            answers += 1;
        }
        assert_eq!((answers, ep.sessions().count()), (MAX_REPLIES, 0));
    }
}
