//! The client's side of the handshake inside a session (the server's is the endpoint's):
//! INIT, the COOKIE or REFUSE it gets, the CHALLENGE it checks, RESPONSE, and the keys made
//! once the peer has proven its own.
#![forbid(unsafe_code)]

use zerocopy::{FromBytes, IntoBytes};

use crate::auth::FrameKey;
use crate::handshake::{
    CLIENT_PROOF, ChallengeBody, CookieBody, InitBody, Refusal, RefuseBody, ResponseBody, SERVER_PROOF,
    options, transcript,
};
use crate::keys::{RxKeys, TxKeys};
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::{FC_LEN, Frame, FrameRepr, FrameType, HEADER_LEN, TAG_LEN, TRAILER_LEN};

use super::parts::Liveness;
use super::{DownReason, Event, Session, State, Timer};

impl Session {
    pub(super) fn become_up(&mut self, now: Time) {
        self.state = State::Up;
        self.timers[Timer::Handshake as usize] = None;
        self.set_timer(Timer::Idle, now + self.cfg.idle_timeout);
        self.live = Liveness::new(now);
        self.set_timer(Timer::Keepalive, now + self.cfg.keepalive_interval);
        self.events.push_back(Event::Up { peer_epoch: self.id.peer_epoch });
    }

    /// COOKIE: the server keeps nothing until INIT echoes this. Taken only if it echoes
    /// our nonce (an off-path sender does not know it); INIT goes again at once.
    pub(super) fn on_cookie(&mut self, frame: &Frame<'_>) {
        match CookieBody::ref_from_bytes(frame.body()) {
            Ok(c) if c.nonce == self.id.local_nonce => {
                self.id.cookie = c.cookie;
                self.due.handshake = true;
                self.stats.frames_received += 1;
            }
            _ => self.stats.dropped_unexpected += 1,
        }
    }

    /// REFUSE echoing our nonce: the server does not hold our key, or has no room.
    pub(super) fn on_refuse(&mut self, frame: &Frame<'_>) {
        match RefuseBody::ref_from_bytes(frame.body()) {
            Ok(r) if r.nonce == self.id.local_nonce => {
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

    pub(super) fn on_challenge(&mut self, now: Time, frame: &Frame<'_>) {
        let h = frame.header();
        let Ok(c) = ChallengeBody::ref_from_bytes(frame.body()) else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        let t = transcript(self.id.local_epoch, &self.init_body(), h.epoch, c);
        if !self.cfg.psk.verify(SERVER_PROOF, &t, &c.proof) {
            // The server does not hold our key (or the frame was forged): keep trying until
            // the handshake times out, then report the failure.
            self.stats.auth_failures += 1;
            self.id.saw_bad_proof = true;
            return;
        }
        let (peer_id, mtu, window) = (c.server_id.get(), c.mtu.get() as usize, c.window.get() as u32);
        // The server may only add to what this side asked of the frames (its proof covers
        // both), never take from it.
        if peer_id == 0
            || !options::acceptable(options::of(&self.cfg), c.options)
            || mtu > self.mtu
            || window > self.window
            || window == 0
            || mtu < HEADER_LEN + FC_LEN + TRAILER_LEN + 64
        {
            self.stats.dropped_unexpected += 1;
            return;
        }
        self.id.peer_id = peer_id;
        self.id.peer_epoch = h.epoch;
        self.mtu = mtu;
        self.window = window;
        self.replay.set_spare_limit(super::spare_frames(window, self.cfg.max_queued));
        let (c2s, s2c) = self.cfg.psk.frame_keys(&t);
        self.set_keys(c2s, s2c, c.options);
        self.id.transcript = t;
        self.state = State::ClientResponse;
        self.due.handshake = true;
        self.stats.frames_received += 1;
        self.set_timer(Timer::Handshake, now + self.cfg.handshake_retry);
    }

    /// A repeated RESPONSE on a live server session: our ESTABLISHED was lost.
    pub(super) fn on_response(&mut self, frame: &Frame<'_>) {
        let Ok(r) = ResponseBody::ref_from_bytes(frame.body()) else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        if frame.header().epoch != self.id.peer_epoch {
            self.stats.dropped_unexpected += 1;
            return;
        }
        if !self.cfg.psk.verify(CLIENT_PROOF, &self.id.transcript, &r.proof) {
            self.stats.auth_failures += 1;
            return;
        }
        self.stats.frames_received += 1;
        self.due.established = true;
    }

    pub(super) fn init_body(&self) -> InitBody {
        InitBody {
            client_id: self.id.local_id.into(),
            nonce: self.id.local_nonce,
            mtu: (self.cfg.mtu.min(u16::MAX as usize) as u16).into(),
            window: (self.cfg.window.min(u16::MAX as u32) as u16).into(),
            key_id: self.cfg.psk.key_id(),
            options: options::of(&self.cfg),
            reserved: 0,
            cookie: self.id.cookie,
        }
    }

    /// The session's keys, both ways, and what it does to its frames.
    pub(super) fn set_keys(&mut self, tx: FrameKey, rx: FrameKey, negotiated: u8) {
        self.crypto.tx = Some(TxKeys::new(tx, self.cfg.key_update_frames));
        self.crypto.rx = Some(RxKeys::new(rx));
        self.crypto.authenticate = negotiated & options::AUTHENTICATE != 0;
        self.crypto.encrypt = negotiated & options::ENCRYPT != 0;
        self.crypto.selective_ack = negotiated & options::SELECTIVE_ACK != 0;
    }

    pub(super) fn handshake_frame(&mut self, buf: &mut [u8]) -> Option<usize> {
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
                let proof = self.cfg.psk.proof(CLIENT_PROOF, &self.id.transcript);
                let r = ResponseBody { init, proof };
                let h = self.header(FrameType::Response, SeqNum(0));
                let body = r.as_bytes();
                FrameRepr { header: h, fc: None, body }.emit(buf, unauthenticated).ok()
            }
            _ => None,
        }
    }
}
