//! A capture's dxpu frames understood as a whole: which side of each is the box (learned
//! from the handshake: INIT and RESPONSE go to it; COOKIE, CHALLENGE and REFUSE come from it;
//! before any handshake, from the box's port), a DATA frame sent again (same direction,
//! session and sequence number: a replay), and the sessions whose DATA bodies are encrypted
//! (their CHALLENGE negotiated it). `dxpu tlp decode --pcap` prints what [`Decoder`] finds.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;

use link::wire::{Frame, FrameType};

use super::Datagram;

/// The frame type's name, as the dissector shows it.
pub fn frame_name(t: FrameType) -> String {
    match t {
        FrameType::Init => "INIT".into(),
        FrameType::Challenge => "CHALLENGE".into(),
        FrameType::Response => "RESPONSE".into(),
        FrameType::Established => "ESTABLISHED".into(),
        FrameType::Data => "DATA".into(),
        FrameType::Ack => "ACK".into(),
        FrameType::Keepalive => "KEEPALIVE".into(),
        FrameType::Close => "CLOSE".into(),
        FrameType::Cookie => "COOKIE".into(),
        FrameType::Refuse => "REFUSE".into(),
        FrameType::Unknown(b) => format!("UNKNOWN({b})"),
    }
}

/// What [`Decoder::frame`] finds of one datagram that is a dxpu frame.
#[derive(Debug)]
pub struct Decoded<'a> {
    /// The frame, checked.
    pub frame: Frame<'a>,
    /// `host->box`, `box->host` or `unknown`.
    pub direction: &'static str,
    /// A DATA frame whose sequence number was seen before in its direction and session.
    pub replay: bool,
    /// A DATA frame of a session that negotiated encryption: its TLPs cannot be read.
    pub encrypted: bool,
}

/// What a capture taught so far: the boxes, the sessions' sequence numbers, the encrypted
/// sessions. One per capture, fed every datagram in order.
pub struct Decoder {
    roles: Roles,
    encrypted: HashSet<u32>,
    seen: HashMap<(&'static str, u32), SeenSeqs>,
}

impl Decoder {
    /// A decoder that takes `box_port` for the box's until a handshake says otherwise.
    pub fn new(box_port: u16) -> Decoder {
        Decoder {
            roles: Roles { boxes: HashSet::new(), box_port },
            encrypted: HashSet::new(),
            seen: HashMap::new(),
        }
    }

    /// `d` as a dxpu frame, what it says learned; none where it is not one.
    pub fn frame<'a>(&mut self, d: &'a Datagram) -> Option<Decoded<'a>> {
        let frame = Frame::new_checked(&d.payload).ok()?;
        let h = frame.header();
        self.roles.learn(d, h.ty);
        learn_encryption(&frame, &mut self.encrypted);
        let direction = self.roles.direction(d);
        let data = h.ty == FrameType::Data;
        let key = (direction, h.session);
        if data && self.seen.len() >= MAX_SESSIONS && !self.seen.contains_key(&key) {
            // A capture of more sessions than a link has (forged, or made up): what was
            // learned of the old ones is let go rather than kept without bound.
            self.seen.clear();
        }
        let replay = data && self.seen.entry(key).or_default().replay(h.seq);
        let encrypted = data && self.encrypted.contains(&h.session);
        Some(Decoded { frame, direction, replay, encrypted })
    }
}

/// Which addresses are boxes.
struct Roles {
    boxes: HashSet<SocketAddr>,
    box_port: u16,
}

impl Roles {
    fn learn(&mut self, d: &Datagram, ty: FrameType) {
        if self.boxes.len() >= MAX_SESSIONS {
            self.boxes.clear();
        }
        match ty {
            FrameType::Init | FrameType::Response => {
                self.boxes.insert(d.dst);
            }
            FrameType::Cookie | FrameType::Challenge | FrameType::Refuse => {
                self.boxes.insert(d.src);
            }
            _ => {}
        }
    }

    fn direction(&self, d: &Datagram) -> &'static str {
        if self.boxes.contains(&d.dst) || (!self.boxes.contains(&d.src) && d.dst.port() == self.box_port) {
            "host->box"
        } else if self.boxes.contains(&d.src) || d.src.port() == self.box_port {
            "box->host"
        } else {
            "unknown"
        }
    }
}

/// The most sessions (and boxes) a decoder keeps what it learned of: far more than any
/// capture of real links holds; a file with more (forged frames) costs bounded memory, and
/// the oldest sessions' replays and encryption are forgotten.
const MAX_SESSIONS: usize = 1 << 16;

/// Sequence numbers a link may still send again, behind the highest seen: far more than a
/// window (at most 4096 frames).
const REPLAY_SPAN: u32 = 1 << 16;

/// The DATA sequence numbers seen in one direction of one session, back to
/// [`REPLAY_SPAN`] behind the highest: a bounded set however long the capture.
#[derive(Default)]
struct SeenSeqs {
    highest: Option<u32>,
    seqs: HashSet<u32>,
}

impl SeenSeqs {
    /// Whether `seq` was seen before (a retransmission); remembers it.
    fn replay(&mut self, seq: u32) -> bool {
        let newer = |a: u32, b: u32| a.wrapping_sub(b) as i32 > 0;
        if self.highest.is_none_or(|h| newer(seq, h)) {
            self.highest = Some(seq);
        }
        let again = !self.seqs.insert(seq);
        if self.seqs.len() > 2 * REPLAY_SPAN as usize
            && let Some(h) = self.highest
        {
            self.seqs.retain(|&s| h.wrapping_sub(s) < REPLAY_SPAN);
        }
        again
    }
}

/// A CHALLENGE that negotiated encryption makes both its sessions' DATA frames opaque:
/// the options at body offset 24 (bit 1 ENCRYPT), the client's session ID at 0.
fn learn_encryption(f: &Frame<'_>, encrypted: &mut HashSet<u32>) {
    let h = f.header();
    if h.ty != FrameType::Challenge {
        return;
    }
    let b = f.body();
    if b.get(24).is_some_and(|o| o & 2 != 0) {
        if encrypted.len() >= MAX_SESSIONS {
            encrypted.clear();
        }
        encrypted.insert(h.session);
        if let Some(id) = b.get(..4) {
            encrypted.insert(u32::from_be_bytes([id[0], id[1], id[2], id[3]]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DATA frame of `session` with sequence number `seq`, host to box.
    fn data(session: u32, seq: u32) -> Datagram {
        let header = link::wire::Header { session, seq, ..link::wire::Header::new(FrameType::Data) };
        let repr = link::wire::FrameRepr { header, fc: None, body: &[] };
        let mut payload = vec![0u8; repr.buffer_len()];
        let Ok(_) = repr.emit(&mut payload, |_| [0; link::wire::TAG_LEN]) else { panic!("emit") };
        Datagram {
            number: 1,
            time: 0.0,
            src: SocketAddr::from(([127, 0, 0, 1], 40000)),
            dst: SocketAddr::from(([127, 0, 0, 1], 4791)),
            direction: None,
            payload,
        }
    }

    #[test]
    fn a_capture_of_more_sessions_than_links_have_keeps_bounded_memory() {
        let mut d = Decoder::new(4791);
        let first = data(1, 5);
        let Some(f) = d.frame(&first) else { panic!("a DATA frame is a frame") };
        assert!(!f.replay && f.direction == "host->box");
        assert!(d.frame(&first).is_some_and(|f| f.replay), "seen again: a replay");
        for session in 2..(MAX_SESSIONS as u32 + 10) {
            d.frame(&data(session, 5));
            assert!(d.seen.len() <= MAX_SESSIONS);
        }
        // The newest sessions are still known.
        assert!(d.frame(&data(MAX_SESSIONS as u32 + 9, 5)).is_some_and(|f| f.replay));
    }

    #[test]
    fn a_sequence_number_seen_again_is_a_replay_and_the_set_stays_bounded() {
        let mut s = SeenSeqs::default();
        assert!(!s.replay(7));
        assert!(s.replay(7));
        assert!(!s.replay(8));
        // Across the wrap of the 32-bit sequence space.
        let mut w = SeenSeqs::default();
        for seq in (u32::MAX - 5)..=u32::MAX {
            assert!(!w.replay(seq));
        }
        assert!(!w.replay(0));
        assert!(w.replay(u32::MAX - 1));
        // A long capture: the set keeps what may still come again, no more.
        let mut long = SeenSeqs::default();
        for seq in 0..10 * REPLAY_SPAN {
            assert!(!long.replay(seq), "{seq}");
            assert!(long.seqs.len() <= 2 * REPLAY_SPAN as usize + 1);
        }
        // A retransmission within a window of the newest is still recognised.
        assert!(long.replay(10 * REPLAY_SPAN - 4096));
    }
}
