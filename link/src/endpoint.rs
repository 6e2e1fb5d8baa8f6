//! Server-side demultiplexing: many sessions behind one socket. Frames are routed by the
//! receiver's session ID; INITs create sessions (bounded in number); an INIT from a peer
//! address that already has a session with another epoch means the peer restarted, and the
//! old session is declared down. An endpoint may hold several pre-shared keys (one per
//! host it serves): INIT names the client's key by its identifier and the session proves
//! that key; an INIT naming no key held gets the endpoint's first key, so the client learns
//! of the mismatch from a proof that fails (`AuthFailed`) rather than from silence.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::Hash;

use crate::auth::{PresharedKey, Rng};
use crate::config::Config;
use crate::session::{DownReason, InPlaceFrom, Session};
use crate::time::Time;
use crate::wire::{Frame, FrameType};

/// Counters of frames the endpoint handled itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Datagrams that were not frames.
    pub dropped_malformed: u64,
    /// Frames for a session ID that is not live.
    pub dropped_unknown_session: u64,
    /// INITs refused because the session table was full.
    pub refused_full: u64,
    /// Sessions replaced because their peer restarted.
    pub peer_restarts: u64,
    /// INITs naming a key this endpoint does not hold (answered under the first key).
    pub unknown_key: u64,
}

/// A server endpoint: sessions keyed by ID, each remembered with its peer address `A`.
pub struct Endpoint<A> {
    cfg: Config,
    keys: Vec<([u8; 8], PresharedKey)>,
    epoch: u32,
    rng: Rng,
    max_sessions: usize,
    sessions: HashMap<u32, (A, Session)>,
    stats: EndpointStats,
}

impl<A: Copy + Eq + Hash> Endpoint<A> {
    /// An endpoint accepting up to `max_sessions` sessions, holding the key in `cfg`.
    pub fn new(cfg: Config, epoch: u32, rng: Rng, max_sessions: usize) -> Endpoint<A> {
        let keys = vec![(cfg.psk.key_id(), cfg.psk.clone())];
        Endpoint {
            cfg,
            keys,
            epoch,
            rng,
            max_sessions,
            sessions: HashMap::new(),
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
            return self.on_init(now, from, &frame);
        }
        match self.sessions.get_mut(&h.session) {
            Some((_, s)) => {
                let id = h.session;
                match sink {
                    Some(sink) => s.handle_frame_with(now, &frame, Some(&mut |t: &[u8]| sink(id, t))),
                    None => s.handle_frame(now, &frame),
                }
                Some(id)
            }
            None => {
                self.stats.dropped_unknown_session += 1;
                None
            }
        }
    }

    fn on_init(&mut self, now: Time, from: A, frame: &Frame<'_>) -> Option<u32> {
        let epoch = frame.header().epoch;
        let body = frame.body();
        let client_id = body.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        // A repeated INIT of a handshake in progress goes to that session; an INIT for a new
        // session from the same peer ends the old one: with a new epoch the peer restarted,
        // with the same epoch it started over (e.g. after a partition).
        let mut replaced = None;
        for (id, (addr, s)) in &mut self.sessions {
            if *addr == from && !s.is_down() {
                if s.peer_epoch() == epoch && Some(s.peer_id()) == client_id {
                    s.handle_frame(now, frame);
                    return Some(*id);
                }
                replaced = Some((*id, s.peer_epoch() != epoch));
            }
        }
        if let Some((id, restarted)) = replaced
            && let Some((_, old)) = self.sessions.get_mut(&id)
        {
            old.superseded(if restarted { DownReason::PeerRestarted } else { DownReason::Superseded });
            if restarted {
                self.stats.peer_restarts += 1;
            }
        }
        self.sessions.retain(|_, (_, s)| !s.is_down() || s.has_events());
        if self.sessions.len() >= self.max_sessions {
            self.stats.refused_full += 1;
            return None;
        }
        let mut seed = [0u8; 32];
        self.rng.fill(&mut seed);
        let mut cfg = self.cfg.clone();
        let wanted = body.get(24..32);
        match self.keys.iter().find(|(id, _)| Some(&id[..]) == wanted) {
            Some((_, k)) => cfg.psk = k.clone(),
            None => self.stats.unknown_key += 1,
        }
        let s = Session::accept(cfg, now, self.epoch, Rng::new(seed), frame)?;
        let id = s.local_id();
        self.sessions.insert(id, (from, s));
        Some(id)
    }

    /// The session with this ID.
    pub fn session(&mut self, id: u32) -> Option<&mut Session> {
        self.sessions.get_mut(&id).map(|(_, s)| s)
    }

    /// Every session with its peer address.
    pub fn sessions(&mut self) -> impl Iterator<Item = (u32, A, &mut Session)> {
        self.sessions.iter_mut().map(|(id, (a, s))| (*id, *a, s))
    }

    /// Forgets sessions that are down and whose events were read.
    pub fn reap(&mut self) {
        self.sessions.retain(|_, (_, s)| !s.is_down() || s.has_events());
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
        self.sessions.values().filter_map(|(_, s)| s.poll_timeout()).min()
    }

    /// Runs expired timers of every session.
    pub fn handle_timeout(&mut self, now: Time) {
        for (_, s) in self.sessions.values_mut() {
            s.handle_timeout(now);
        }
    }
}
