//! The replay buffer (after PCIe's data link layer, PCIe 6.0 §3.6.2): the DATA frames sent
//! and not yet acknowledged, in sequence order, each kept where its TLPs were written so a
//! replay seals the same bytes again in place. An ACK frees every frame before it; a NAK
//! or the replay timer schedules a frame for replay; the replay timer backs off while
//! nothing is acknowledged and resets when something is. Freed frames' buffers are kept
//! for the next frames, so a session in steady state allocates nothing.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::time::Duration;

use crate::seq::SeqNum;

/// Most doublings of the replay timeout.
const MAX_BACKOFF: u32 = 16;

/// A DATA frame in the replay buffer.
#[derive(Debug)]
pub(crate) struct Sent {
    pub(crate) seq: SeqNum,
    /// The frame's buffer: body at `BODY_AT`, sealed in place for each (re)transmission.
    pub(crate) buf: Vec<u8>,
    /// Length of the DATA body (TLP records).
    pub(crate) len: usize,
}

/// What an acknowledgement did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Acked {
    /// Frames freed.
    pub(crate) freed: usize,
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

    /// The peer is missing `seq` (a NAK): it is replayed, if held and not already due.
    pub(crate) fn nak(&mut self, seq: SeqNum) {
        if self.index_of(seq).is_some() && !self.due.contains(&seq) {
            self.due.push_back(seq);
        }
    }

    /// The replay timer fired: every frame held is replayed, oldest first, as PCIe's
    /// REPLAY_TIMER does (PCIe 6.0 §3.6.2.1), and the timeout doubles (up to 2^16 times).
    /// False if nothing is held.
    ///
    /// Every frame, not the oldest alone: a NAK names one gap at a time, so where loss is
    /// heavy (NAKs lost too) a burst of lost frames would otherwise be recovered one timer
    /// expiry each, the timer backing off to its ceiling.
    pub(crate) fn timed_out(&mut self) -> bool {
        if self.unacked.is_empty() {
            return false;
        }
        self.due.clear();
        self.due.extend(self.unacked.iter().map(|s| s.seq));
        self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        true
    }

    /// The next frame due for replay (its index), taken off the due list; frames freed
    /// since they were asked for are skipped.
    pub(crate) fn next_due(&mut self) -> Option<usize> {
        while let Some(seq) = self.due.pop_front() {
            if let Some(i) = self.index_of(seq) {
                return Some(i);
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
        Sent { seq: SeqNum(seq), buf: vec![0; 64], len }
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
        assert!(!r.timed_out(), "nothing held");
        assert_eq!(r.timeout(base, max), base);
        r.push(sent(7, 1));
        r.push(sent(8, 1));
        r.push(sent(9, 1));
        r.nak(SeqNum(9));
        for _ in 0..3 {
            assert!(r.timed_out());
        }
        assert_eq!(r.timeout(base, max), Duration::from_millis(8));
        assert_eq!(r.next_due(), Some(0));
        assert_eq!(r.next_due(), Some(1));
        assert_eq!(r.next_due(), Some(2), "oldest first, the NAKed one among them");
        assert_eq!(r.next_due(), None, "each once, however often the timer fired");
        for _ in 0..40 {
            r.timed_out();
        }
        assert_eq!(r.timeout(base, max), max);
        r.acknowledge(SeqNum(8));
        assert_eq!(r.timeout(base, max), base, "progress resets the backoff");
    }

    #[test]
    fn sequence_numbers_wrap_inside_the_buffer() {
        let mut r = ReplayBuffer::new(4);
        r.push(sent(u32::MAX, 1));
        r.push(Sent { seq: SeqNum(u32::MAX).next(), buf: Vec::new(), len: 2 });
        r.nak(SeqNum(u32::MAX).next());
        assert_eq!(r.next_due(), Some(1));
        assert_eq!(r.acknowledge(SeqNum(u32::MAX).next()), Acked { freed: 1 });
        assert_eq!(r.len(), 1);
    }
}
