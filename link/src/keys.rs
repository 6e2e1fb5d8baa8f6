//! A session's frame keys: one chain per direction, each key followed by the next at a key
//! update (after QUIC's, RFC 9001 §6), so that a long session never uses one key for more
//! frames than AES-GCM allows and never needs a new handshake for it.
//!
//! The sender updates its key after `Config::key_update_frames` frames and flips the KEY
//! PHASE flag; the receiver, seeing the other phase on a frame newer than any of the current
//! key's, tries the next key and, if the frame verifies, moves to it. Frames of the previous
//! key still in flight (older packet numbers) verify under the previous key, kept until the
//! next update. A sender updates again only once the peer has acknowledged a DATA frame first
//! sent under the current key: then the peer has moved to it, and a one-bit phase always
//! tells the two keys a receiver can meet apart.
#![forbid(unsafe_code)]

use crate::auth::FrameKey;
use crate::seq::SeqNum;

/// AES-128-GCM's confidentiality limit for one key is 2^23 frames (RFC 9001 §6.6); updating
/// at half of it leaves the update room to complete.
pub const DEFAULT_KEY_UPDATE_FRAMES: u64 = 1 << 22;

/// The sending direction's key.
pub(crate) struct TxKeys {
    key: FrameKey,
    phase: bool,
    /// Frames sealed under `key`.
    sealed: u64,
    update_after: u64,
    /// The first DATA frame first sent under `key`; `None` until one is.
    first_seq: Option<SeqNum>,
    /// The peer acknowledged `first_seq`: it holds `key` too, and another update may follow.
    confirmed: bool,
    /// Updates made.
    pub(crate) updates: u64,
}

impl TxKeys {
    pub(crate) fn new(key: FrameKey, update_after: u64) -> TxKeys {
        // The first key has no previous one in flight: an update may come as soon as due.
        TxKeys { key, phase: false, sealed: 0, update_after, first_seq: None, confirmed: true, updates: 0 }
    }

    /// The key for the frame about to be sealed, and its phase: counted, and updated first
    /// when one is due and allowed.
    pub(crate) fn for_frame(&mut self) -> (&FrameKey, bool) {
        if self.sealed >= self.update_after && self.confirmed {
            self.key = self.key.next();
            self.phase = !self.phase;
            self.sealed = 0;
            self.first_seq = None;
            self.confirmed = false;
            self.updates += 1;
        }
        self.sealed += 1;
        (&self.key, self.phase)
    }

    /// The key frames are sealed under now (no count: a frame already counted).
    pub(crate) fn key(&self) -> &FrameKey {
        &self.key
    }

    /// A DATA frame with sequence number `seq` leaves for the first time.
    pub(crate) fn first_sent(&mut self, seq: SeqNum) {
        self.first_seq.get_or_insert(seq);
    }

    /// The peer's cumulative acknowledgement: every DATA frame before `ack` arrived.
    pub(crate) fn acked(&mut self, ack: SeqNum) {
        if self.first_seq.is_some_and(|f| f < ack) {
            self.confirmed = true;
        }
    }
}

/// Which receive key a frame is for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Which {
    Current,
    Previous,
    Next,
}

/// The receiving direction's keys: the current one, the one before it (for frames still in
/// flight) and the next one (precomputed: a frame of the new phase is checked at once).
pub(crate) struct RxKeys {
    key: FrameKey,
    phase: bool,
    next: FrameKey,
    previous: Option<FrameKey>,
    /// The packet number of the first frame that verified under `key`: a frame of the other
    /// phase below it is the previous key's.
    since: u64,
    /// Updates followed.
    pub(crate) updates: u64,
}

impl RxKeys {
    pub(crate) fn new(key: FrameKey) -> RxKeys {
        let next = key.next();
        RxKeys { key, phase: false, next, previous: None, since: 0, updates: 0 }
    }

    /// The key a frame with this phase and packet number was sealed under.
    pub(crate) fn which(&self, phase: bool, pn: u64) -> Which {
        if phase == self.phase {
            Which::Current
        } else if self.previous.is_some() && pn < self.since {
            Which::Previous
        } else {
            Which::Next
        }
    }

    /// The key `which` names.
    pub(crate) fn key(&self, which: Which) -> &FrameKey {
        match (which, &self.previous) {
            (Which::Previous, Some(k)) => k,
            (Which::Next, _) => &self.next,
            _ => &self.key,
        }
    }

    /// A frame with packet number `pn` verified under the next key: it is the current one.
    pub(crate) fn advance(&mut self, pn: u64) {
        let next = self.next.next();
        let key = std::mem::replace(&mut self.next, next);
        self.previous = Some(std::mem::replace(&mut self.key, key));
        self.phase = !self.phase;
        self.since = pn;
        self.updates += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(pn: u64) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12..20].copy_from_slice(&pn.to_be_bytes());
        f
    }

    #[test]
    fn updates_follow_each_other_and_late_frames_of_the_previous_key_still_verify() {
        let k = FrameKey::new(&[7; 16]);
        let mut tx = TxKeys::new(FrameKey::new(&[7; 16]), 3);
        let mut rx = RxKeys::new(k);
        let mut pn = 0;
        let mut sent = Vec::new();
        for round in 0..5u32 {
            for i in 0..3 {
                let (key, phase) = tx.for_frame();
                let f = frame(pn);
                sent.push((pn, phase, key.tag(&f)));
                pn += 1;
                if i == 0 {
                    tx.first_sent(SeqNum(round * 3));
                }
            }
            // The peer acknowledges what it got under this key: the next update may come.
            tx.acked(SeqNum(round * 3 + 1));
        }
        assert_eq!(tx.updates, 4);
        // Received in order but for one late frame of each key, which comes after the next
        // key's first.
        let mut order: Vec<usize> = (0..sent.len()).collect();
        for b in (3..sent.len()).step_by(3) {
            order.swap(b - 1, b);
        }
        for i in order {
            let (pn, phase, tag) = sent[i];
            let w = rx.which(phase, pn);
            assert!(rx.key(w).verify(&frame(pn), &tag), "frame {pn} ({w:?}) did not verify");
            if w == Which::Next {
                rx.advance(pn);
            }
        }
        assert_eq!(rx.updates, 4);
    }

    #[test]
    fn no_second_update_before_the_peer_confirmed_the_first() {
        let mut tx = TxKeys::new(FrameKey::new(&[1; 16]), 2);
        let phases: Vec<bool> = (0..10).map(|_| tx.for_frame().1).collect();
        // One update after two frames, then none: nothing was acknowledged under the new key.
        assert_eq!(phases, [false, false, true, true, true, true, true, true, true, true]);
        tx.first_sent(SeqNum(5));
        tx.acked(SeqNum(5));
        assert!(tx.for_frame().1, "an ACK below the first frame confirms nothing");
        tx.acked(SeqNum(6));
        assert!(!tx.for_frame().1);
    }

    #[test]
    fn a_key_update_derives_a_different_key_both_sides_agree_on() {
        let a = FrameKey::new(&[3; 16]);
        let f = frame(9);
        assert!(!a.next().verify(&f, &a.tag(&f)));
        assert!(a.next().verify(&f, &FrameKey::new(&[3; 16]).next().tag(&f)));
    }
}
