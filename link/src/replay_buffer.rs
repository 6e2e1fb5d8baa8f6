//! The replay buffer (after PCIe's data link layer, PCIe 6.0 §3.6.2): the DATA frames sent
//! and not yet acknowledged, in sequence order, each kept where its TLPs were written so a
//! replay seals the same bytes again in place. An ACK frees every frame before it; a
//! selective acknowledgement marks the frames the peer holds beyond a gap, which are never
//! replayed, and declares lost a frame that frames sent after it overtook (RFC 9002 §6.1);
//! a NAK or the replay timer schedules a frame for replay; the replay timer backs off while
//! nothing is acknowledged and resets when something is. Freed frames' buffers are kept for
//! the next frames, so a session in steady state allocates nothing.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use crate::seq::SeqNum;
use crate::time::Time;

/// Most doublings of the replay timeout.
const MAX_BACKOFF: u32 = 16;

/// A frame is lost once a frame sent this many after its last transmission is acknowledged
/// selectively (QUIC's kPacketThreshold, RFC 9002 §6.1.1): reordering by fewer is tolerated.
const REORDER_THRESHOLD: i64 = 3;

/// A DATA frame in the replay buffer.
#[derive(Debug)]
pub(crate) struct Sent {
    pub(crate) seq: SeqNum,
    /// The frame's buffer: body at `BODY_AT`, sealed in place for each (re)transmission.
    pub(crate) buf: Vec<u8>,
    /// Length of the DATA body (TLP records).
    pub(crate) len: usize,
    /// When it was last sent (first sent, or replayed).
    sent_at: Time,
    /// The sequence number the next new frame had when this one was last sent: every frame
    /// from there on left after it.
    sent_before: SeqNum,
    /// The peer holds it beyond a gap (a selective acknowledgement): it is not replayed.
    sacked: bool,
    /// It is on the due list.
    due: bool,
}

impl Sent {
    /// A frame sent for the first time at `now`.
    pub(crate) fn new(seq: SeqNum, buf: Vec<u8>, len: usize, now: Time) -> Sent {
        Sent { seq, buf, len, sent_at: now, sent_before: seq.next(), sacked: false, due: false }
    }
}

/// What an acknowledgement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acked {
    /// Frames freed.
    pub(crate) freed: usize,
}

/// What a selective acknowledgement did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Sacked {
    /// Frames newly known to be held by the peer.
    pub(crate) newly: usize,
    /// Frames declared lost and scheduled for replay (frames sent after them overtook them).
    pub(crate) lost: usize,
}

/// Sent, unacknowledged DATA frames.
#[derive(Debug, Default)]
pub(crate) struct ReplayBuffer {
    unacked: VecDeque<Sent>,
    /// Frames to replay, in the order they were asked for.
    due: VecDeque<SeqNum>,
    backoff: u32,
    /// Buffers of acknowledged frames, for reuse; at most `spare_limit`.
    spare: Vec<Vec<u8>>,
    spare_limit: usize,
}

impl ReplayBuffer {
    /// An empty buffer that keeps at most `spare_limit` freed buffers for reuse.
    pub(crate) fn new(spare_limit: usize) -> ReplayBuffer {
        ReplayBuffer { spare_limit, ..ReplayBuffer::default() }
    }

    /// Keeps at most `n` freed buffers from now on (the negotiated window sets it).
    pub(crate) fn set_spare_limit(&mut self, n: usize) {
        self.spare_limit = n;
        self.spare.truncate(n);
    }

    /// Lets go of freed buffers beyond `keep` (a burst is over); the limit stays.
    pub(crate) fn trim_spare(&mut self, keep: usize) {
        self.spare.truncate(keep);
        self.spare.shrink_to(keep);
    }

    /// Frames held.
    pub(crate) fn len(&self) -> usize {
        self.unacked.len()
    }

    /// Whether nothing is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.unacked.is_empty()
    }

    /// Freed buffers kept for the next frames.
    pub(crate) fn spare(&self) -> usize {
        self.spare.len()
    }

    /// Body bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.unacked.iter().map(|s| s.len).sum()
    }

    /// A buffer for a new frame: a freed one, or a new (empty) one.
    pub(crate) fn take_buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// A buffer back for reuse.
    pub(crate) fn give_buffer(&mut self, buf: Vec<u8>) {
        if self.spare.len() < self.spare_limit {
            self.spare.push(buf);
        }
    }

    /// Holds a newly sent frame (its sequence number follows the last held one); its index.
    pub(crate) fn push(&mut self, sent: Sent) -> usize {
        debug_assert!(self.unacked.back().is_none_or(|b| b.seq.next() == sent.seq), "sequence gap");
        self.unacked.push_back(sent);
        self.unacked.len() - 1
    }

    /// The frame at `index`.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut Sent> {
        self.unacked.get_mut(index)
    }

    /// The frame at `index` was sent again at `now`, when the next new frame was `next`.
    pub(crate) fn sent_again(&mut self, index: usize, now: Time, next: SeqNum) {
        if let Some(s) = self.unacked.get_mut(index) {
            (s.sent_at, s.sent_before) = (now, next);
        }
    }

    /// The frame with sequence number `seq`, if it is held.
    pub(crate) fn find(&self, seq: SeqNum) -> Option<&Sent> {
        self.unacked.get(self.index_of(seq)?)
    }

    fn index_of(&self, seq: SeqNum) -> Option<usize> {
        // Consecutive sequence numbers from the front.
        let first = self.unacked.front()?.seq;
        let i = usize::try_from(seq.distance_from(first)).ok()?;
        self.unacked.get(i).filter(|s| s.seq == seq).map(|_| i)
    }

    /// Puts the frame at `index` on the due list unless it is there, or the peer holds it.
    fn schedule(&mut self, index: usize) -> bool {
        match self.unacked.get_mut(index) {
            Some(s) if !s.due && !s.sacked => {
                s.due = true;
                self.due.push_back(s.seq);
                true
            }
            _ => false,
        }
    }

    /// The peer has every frame before `ack`: they are freed, and if any was, the backoff
    /// resets and replays of freed frames are forgotten.
    pub(crate) fn acknowledge(&mut self, ack: SeqNum) -> Acked {
        let mut freed = 0;
        while self.unacked.front().is_some_and(|s| s.seq < ack) {
            if let Some(s) = self.unacked.pop_front() {
                self.give_buffer(s.buf);
            }
            freed += 1;
        }
        if freed > 0 {
            self.backoff = 0;
            self.due.retain(|s| *s >= ack);
        }
        Acked { freed }
    }

    /// The peer is missing `seq` (a NAK): it is replayed, if held, not already due, and not
    /// replayed since it was first sent — a receiver NAKs a gap once, so a NAK arriving after
    /// the frame was resent (on a selective acknowledgement's evidence, or the timer's) is the
    /// same gap, not a new loss.
    pub(crate) fn nak(&mut self, seq: SeqNum) {
        if let Some(i) = self.index_of(seq)
            && self.unacked[i].sent_before == seq.next()
        {
            self.schedule(i);
        }
    }

    /// A selective acknowledgement: the peer holds the frames of `ranges` (`[start, end)`;
    /// what lies outside the frames held is ignored). They are never replayed; a frame not
    /// held whose last transmission was followed by [`REORDER_THRESHOLD`] frames the peer now
    /// holds is lost, and scheduled for replay at once. Frames newly held are progress: the
    /// backoff resets.
    pub(crate) fn sack(&mut self, ranges: impl Iterator<Item = (SeqNum, SeqNum)>) -> Sacked {
        let Some(first) = self.unacked.front().map(|s| s.seq) else { return Sacked::default() };
        let held = self.unacked.len() as i64;
        let mut out = Sacked::default();
        let mut highest = None;
        for (start, end) in ranges {
            let from = i64::from(start.distance_from(first)).clamp(0, held);
            let to = i64::from(end.distance_from(first)).clamp(0, held);
            for s in self.unacked.range_mut(from as usize..to.max(from) as usize) {
                if !s.sacked {
                    s.sacked = true;
                    out.newly += 1;
                }
            }
            if to > from {
                highest = highest.max(Some(to - 1));
            }
        }
        if let Some(h) = highest {
            let highest = self.unacked[h as usize].seq;
            for i in 0..h as usize {
                let s = &self.unacked[i];
                if !s.sacked
                    && i64::from(highest.distance_from(s.sent_before)) >= REORDER_THRESHOLD - 1
                    && self.schedule(i)
                {
                    out.lost += 1;
                }
            }
        }
        if out.newly > 0 {
            self.backoff = 0;
        }
        out
    }

    /// The replay timer fired at `now` after `timeout`: frames held that the peer does not
    /// hold and that were last sent at least `timeout` ago are replayed, oldest first, as
    /// PCIe's REPLAY_TIMER does (PCIe 6.0 §3.6.2.1), and the timeout doubles (up to 2^16
    /// times). False if nothing is held.
    ///
    /// Without selective acknowledgements (`probe_only_beyond` false): every such frame, not
    /// the oldest alone — a NAK names one gap at a time, so where loss is heavy (NAKs lost
    /// too) a burst of lost frames would otherwise be recovered one timer expiry each, the
    /// timer backing off to its ceiling. With them: every such frame before the last one the
    /// peer holds (it has later ones, so these are lost), and beyond that one frame only, the
    /// oldest, as a probe (RFC 9002 §6.2.4): what lies beyond may have arrived with its
    /// acknowledgement lost, and the probe's acknowledgement says which. A frame sent more
    /// recently than `timeout` cannot have been acknowledged yet, and waits.
    pub(crate) fn timed_out(&mut self, now: Time, timeout: Duration, probe_only_beyond: bool) -> bool {
        if self.unacked.is_empty() {
            return false;
        }
        let beyond = match probe_only_beyond {
            true => self.unacked.iter().rposition(|s| s.sacked).map_or(0, |h| h + 1),
            false => self.unacked.len(),
        };
        // Oldest first, those already due among them.
        self.due.clear();
        let mut probed = false;
        for i in 0..self.unacked.len() {
            let s = &mut self.unacked[i];
            let was_due = std::mem::take(&mut s.due);
            let old = now.since(s.sent_at) >= timeout && !s.sacked;
            if was_due || (old && (i < beyond || !probed)) {
                probed |= old && i >= beyond;
                self.schedule(i);
            }
        }
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        true
    }

    /// The next frame due for replay (its index), taken off the due list; frames freed or
    /// held by the peer since they were asked for are skipped.
    pub(crate) fn next_due(&mut self) -> Option<usize> {
        while let Some(seq) = self.due.pop_front() {
            if let Some(i) = self.index_of(seq) {
                let s = &mut self.unacked[i];
                s.due = false;
                if !s.sacked {
                    return Some(i);
                }
            }
        }
        None
    }

    /// The replay timeout now: `base` doubled once per expiry since the last progress, at
    /// most `max`.
    pub(crate) fn timeout(&self, base: Duration, max: Duration) -> Duration {
        base.saturating_mul(1 << self.backoff.min(MAX_BACKOFF)).min(max)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sent(seq: u32, len: usize) -> Sent {
        Sent::new(SeqNum(seq), vec![0; 64], len, Time::ZERO)
    }

    fn ms(n: u64) -> Time {
        Time::ZERO + Duration::from_millis(n)
    }

    fn filled(n: u32) -> ReplayBuffer {
        let mut r = ReplayBuffer::new(4);
        for s in 0..n {
            r.push(sent(s, 10));
        }
        r
    }

    #[test]
    fn an_ack_frees_every_frame_before_it_and_keeps_their_buffers() {
        let mut r = filled(5);
        assert_eq!((r.len(), r.bytes()), (5, 50));
        assert_eq!(r.acknowledge(SeqNum(0)), Acked { freed: 0 });
        assert_eq!(r.acknowledge(SeqNum(3)), Acked { freed: 3 });
        assert!(r.find(SeqNum(2)).is_none() && r.find(SeqNum(3)).is_some());
        assert_eq!(r.take_buffer().len(), 64, "a freed buffer is reused");
        assert_eq!(r.acknowledge(SeqNum(5)), Acked { freed: 2 });
        assert!(r.is_empty());
        assert_eq!(r.spare.len(), 4, "at most the spare limit is kept");
    }

    #[test]
    fn a_trim_lets_a_bursts_buffers_go_and_keeps_the_limit() {
        let mut r = filled(5);
        r.acknowledge(SeqNum(5));
        assert_eq!(r.spare.len(), 4);
        r.trim_spare(1);
        assert_eq!(r.spare.len(), 1);
        // The next burst fills the pool again up to the limit, not the trim.
        let bufs: Vec<Vec<u8>> = (0..4).map(|_| r.take_buffer()).collect();
        for b in bufs {
            r.give_buffer(b);
        }
        assert_eq!(r.spare.len(), 4);
    }

    #[test]
    fn a_nak_replays_a_held_frame_once() {
        let mut r = filled(4);
        r.nak(SeqNum(2));
        r.nak(SeqNum(2));
        r.nak(SeqNum(9));
        assert_eq!(r.next_due(), Some(2));
        assert_eq!(r.next_due(), None, "asked for twice, replayed once; 9 was never sent");
    }

    #[test]
    fn a_replay_of_a_frame_acknowledged_since_is_skipped() {
        let mut r = filled(4);
        r.nak(SeqNum(1));
        r.nak(SeqNum(3));
        r.acknowledge(SeqNum(2));
        assert_eq!(r.next_due(), Some(1), "seq 3 is now at index 1");
        assert_eq!(r.find(SeqNum(3)).map(|s| s.seq), Some(SeqNum(3)));
        assert_eq!(r.next_due(), None);
    }

    #[test]
    fn the_timer_replays_every_frame_held_and_backs_off_until_progress() {
        let (base, max) = (Duration::from_millis(1), Duration::from_millis(50));
        let mut r = ReplayBuffer::new(4);
        assert!(!r.timed_out(ms(1), base, false), "nothing held");
        assert_eq!(r.timeout(base, max), base);
        r.push(sent(7, 1));
        r.push(sent(8, 1));
        r.push(sent(9, 1));
        r.nak(SeqNum(9));
        for _ in 0..3 {
            assert!(r.timed_out(ms(1), base, false));
        }
        assert_eq!(r.timeout(base, max), Duration::from_millis(8));
        assert_eq!(r.next_due(), Some(0));
        assert_eq!(r.next_due(), Some(1));
        assert_eq!(r.next_due(), Some(2), "oldest first, the NAKed one among them");
        assert_eq!(r.next_due(), None, "each once, however often the timer fired");
        for _ in 0..40 {
            r.timed_out(ms(1), base, false);
        }
        assert_eq!(r.timeout(base, max), max);
        r.acknowledge(SeqNum(8));
        assert_eq!(r.timeout(base, max), base, "progress resets the backoff");
    }

    #[test]
    fn sequence_numbers_wrap_inside_the_buffer() {
        let mut r = ReplayBuffer::new(4);
        r.push(sent(u32::MAX, 1));
        r.push(Sent::new(SeqNum(u32::MAX).next(), Vec::new(), 2, Time::ZERO));
        r.nak(SeqNum(u32::MAX).next());
        assert_eq!(r.next_due(), Some(1));
        assert_eq!(r.acknowledge(SeqNum(u32::MAX).next()), Acked { freed: 1 });
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn the_timer_replays_only_what_was_sent_a_timeout_ago_and_the_peer_does_not_hold() {
        let t = Duration::from_millis(1);
        let mut r = ReplayBuffer::new(4);
        for (seq, at) in [(0, 0), (1, 0), (2, 5)] {
            r.push(Sent::new(SeqNum(seq), vec![], 1, ms(at)));
        }
        r.sack([(SeqNum(1), SeqNum(2))].into_iter());
        assert!(r.timed_out(ms(5), t, false));
        assert_eq!(r.next_due(), Some(0), "old, not held");
        assert_eq!(r.next_due(), None, "1 is held by the peer, 2 was sent just now");
        r.sent_again(0, ms(5), SeqNum(3));
        assert!(r.timed_out(ms(6), t, false));
        assert_eq!((r.next_due(), r.next_due(), r.next_due()), (Some(0), Some(2), None));
    }

    #[test]
    fn with_selective_acks_the_timer_replays_what_held_frames_overtook_and_one_probe_beyond() {
        let t = Duration::from_millis(1);
        let mut r = ReplayBuffer::new(4);
        for seq in 0..8 {
            r.push(Sent::new(SeqNum(seq), vec![], 1, ms(0)));
        }
        // 3 and 4 held: 0, 1, 2 before them lost (too few after them to tell by the count);
        // 5, 6, 7 may have arrived, their acknowledgements lost.
        r.sack([(SeqNum(3), SeqNum(5))].into_iter());
        while r.next_due().is_some() {}
        assert!(r.timed_out(ms(2), t, true));
        let due: Vec<_> = std::iter::from_fn(|| r.next_due()).collect();
        assert_eq!(due, [0, 1, 2, 5], "the three overtaken, and one probe");
        // Nothing held at all: one probe, the oldest.
        let mut r = ReplayBuffer::new(4);
        for seq in 0..4 {
            r.push(Sent::new(SeqNum(seq), vec![], 1, ms(0)));
        }
        assert!(r.timed_out(ms(2), t, true));
        assert_eq!((r.next_due(), r.next_due()), (Some(0), None));
    }

    #[test]
    fn a_selective_ack_marks_what_the_peer_holds_and_declares_lost_what_three_later_frames_overtook() {
        let mut r = ReplayBuffer::new(4);
        for seq in 10..20 {
            r.push(sent(seq, 1));
        }
        r.backoff = 3;
        // 10 and 11 lost; 12 and 13 held: 13 overtook 10 by three, 11 by two only.
        let got = r.sack([(SeqNum(12), SeqNum(14))].into_iter());
        assert_eq!(got, Sacked { newly: 2, lost: 1 });
        assert_eq!(r.backoff, 0, "newly held frames are progress");
        assert_eq!(r.next_due(), Some(0));
        r.sent_again(0, Time::ZERO, SeqNum(20));
        // 14 arrives too: 11 is overtaken by three now; 10, just replayed, is not.
        let got = r.sack([(SeqNum(12), SeqNum(15))].into_iter());
        assert_eq!(got, Sacked { newly: 1, lost: 1 });
        assert_eq!((r.next_due(), r.next_due()), (Some(1), None));
        r.sent_again(1, Time::ZERO, SeqNum(20));
        // A held frame is never replayed, by NAK or timer; nor by a NAK once it was resent; ranges
        // beyond what is held, before it, or backwards change nothing.
        r.nak(SeqNum(10));
        assert_eq!(r.next_due(), None, "10 was resent already");
        r.nak(SeqNum(12));
        assert_eq!(r.next_due(), None);
        let junk = [(SeqNum(40), SeqNum(50)), (SeqNum(2), SeqNum(5)), (SeqNum(18), SeqNum(16))];
        assert_eq!(r.sack(junk.into_iter()), Sacked::default());
        // 16..20 held: 15 is lost; 10 and 11, replayed when 20 was next, are not yet.
        assert_eq!(
            r.sack([(SeqNum(12), SeqNum(15)), (SeqNum(16), SeqNum(20))].into_iter()),
            Sacked { newly: 4, lost: 1 }
        );
        assert_eq!((r.next_due(), r.next_due()), (Some(5), None));
        r.sent_again(5, Time::ZERO, SeqNum(20));
        // Frames 20..23 sent after those replays and held: 10, 11 and 15 are lost again.
        for seq in 20..23 {
            r.push(sent(seq, 1));
        }
        assert_eq!(
            r.sack([(SeqNum(12), SeqNum(15)), (SeqNum(16), SeqNum(23))].into_iter()),
            Sacked { newly: 3, lost: 3 }
        );
        // Acknowledged cumulatively, it all goes.
        assert_eq!(r.acknowledge(SeqNum(23)), Acked { freed: 13 });
        assert_eq!(r.sack([(SeqNum(12), SeqNum(15))].into_iter()), Sacked::default());
    }
}
