//! The session's parts that own a concern of their own: who the two ends are (the
//! handshake's identity), the control frames due, the transmit queue, the frame keys, and
//! the receive side's order.

use std::collections::VecDeque;

use crate::auth::Rng;
use crate::handshake::COOKIE_LEN;
use crate::keys::{RxKeys, TxKeys};
use crate::reorder::ReorderBuffer;
use crate::seq::SeqNum;
use crate::time::Time;

use crate::credits::TxCredits;
use crate::wire::BODY_AT;

/// TLPs that leave together in one DATA frame, written where that frame is sent from:
/// `buf` has room for the frame's header and FC block (`BODY_AT` bytes), then the TLP
/// records; sealing the frame puts the header before them and the trailer after, so a TLP
/// is copied once, into this buffer, on its way to the socket (and kept here for replay).
pub(super) struct Chunk {
    /// Send order of the first TLP.
    pub(super) order: u64,
    /// A whole frame's room (the MTU), zeroed once when first allocated and reused after:
    /// a TLP is written over what was there, with no clearing first.
    pub(super) buf: Vec<u8>,
    /// Where the records end (`BODY_AT` when empty).
    pub(super) end: usize,
    /// TLPs per class: its header credits (a held-back chunk holds one class).
    pub(super) tlps: [u32; 3],
    /// Data credits of its TLPs.
    pub(super) data: u32,
}

/// Who the two ends are, as the handshake established it.
pub(super) struct Identity {
    /// This end's session ID and instance epoch (a restarted process picks a new one).
    pub(super) local_id: u32,
    pub(super) local_epoch: u32,
    /// The peer's, once the handshake said them (0 before).
    pub(super) peer_id: u32,
    pub(super) peer_epoch: u32,
    /// This end's handshake nonce.
    pub(super) local_nonce: [u8; 16],
    /// Client: the cookie the server gave, echoed in INIT (zeros before one came).
    pub(super) cookie: [u8; COOKIE_LEN],
    /// The handshake's messages, which the proofs and the frame keys cover.
    pub(super) transcript: Vec<u8>,
    /// A proof that did not verify was seen (the session ends as an authentication failure
    /// if nothing better arrives).
    pub(super) saw_bad_proof: bool,
}

impl Identity {
    /// A fresh identity: a nonce, and an ID and epoch that are never 0 (0 is "none").
    pub(super) fn new(rng: &mut Rng) -> Identity {
        let mut local_nonce = [0u8; 16];
        rng.fill(&mut local_nonce);
        Identity {
            local_id: rng.nonzero_u32(),
            local_epoch: rng.nonzero_u32(),
            peer_id: 0,
            peer_epoch: 0,
            local_nonce,
            cookie: [0; COOKIE_LEN],
            transcript: Vec::new(),
            saw_bad_proof: false,
        }
    }
}

/// Whether the peer is heard: when it last was, and whether the link counts as silent
/// (nothing authentic for the idle timeout; down only past the ride-through time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Liveness {
    pub(super) heard: Time,
    pub(super) silent: bool,
}

impl Liveness {
    pub(super) fn new(now: Time) -> Liveness {
        Liveness { heard: now, silent: false }
    }

    /// An authentic frame arrived at `now`: how long the link had been silent, if it was.
    pub(super) fn heard(&mut self, now: Time) -> Option<std::time::Duration> {
        let was = std::mem::replace(self, Liveness::new(now));
        was.silent.then(|| now.since(was.heard))
    }
}

/// The control frames owed to the peer, each sent once at the next transmit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Due {
    /// INIT or RESPONSE (the client's handshake step).
    pub(super) handshake: bool,
    /// ESTABLISHED (the server, once the client proved its key).
    pub(super) established: bool,
    /// CLOSE.
    pub(super) close: bool,
    /// A NAK for the gap at the receive point.
    pub(super) nak: bool,
    /// An acknowledgement (delayed up to the configured ACK delay).
    pub(super) ack: bool,
    /// A selective acknowledgement: frames beyond a gap arrived since the last one (a DATA
    /// frame's cumulative ACK does not carry it; an ACK frame goes at once).
    pub(super) sack: bool,
    /// A KEEPALIVE, nothing having been sent for the interval.
    pub(super) keepalive: bool,
}

impl Due {
    /// Whether `flag` is due, and no longer after this: a frame owed once is sent once.
    pub(super) fn take(flag: &mut bool) -> bool {
        std::mem::take(flag)
    }
}

/// TLPs waiting to go, in PCIe order, with what their classes hold queued.
pub(super) struct TxQueue {
    /// Chunks whose TLPs had credits when queued (already charged), in PCIe order, waiting
    /// for the window; the last one takes more TLPs until it is full or sent.
    pub(super) ready: VecDeque<Chunk>,
    /// Per class, chunks of TLPs held back: no credits when queued, or queued behind a
    /// held-back TLP they may not pass. Charged when they go.
    pub(super) stalled: [VecDeque<Chunk>; 3],
    /// TLPs queued per class (ready and stalled).
    pub(super) queued: [usize; 3],
    /// The send order the next queued TLP gets.
    pub(super) next_order: u64,
}

/// Where a TLP queued now goes ([`TxQueue::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Placement {
    /// It may go now: it joins the ready chunks and is charged at once (else it is held
    /// back in its class).
    pub(super) now: bool,
    /// It joins the last chunk of its queue (else it starts a new one).
    pub(super) joins: bool,
}

impl TxQueue {
    pub(super) fn new() -> TxQueue {
        TxQueue { ready: VecDeque::new(), stalled: Default::default(), queued: [0; 3], next_order: 0 }
    }

    /// TLPs queued, all classes.
    pub(super) fn len(&self) -> usize {
        self.queued.iter().sum()
    }

    /// Counts a TLP queued in `class`: the next one gets the next send order.
    pub(super) fn count(&mut self, class: usize) {
        self.queued[class] += 1;
        self.next_order += 1;
    }

    /// Where a TLP of `class` (`data` data credits, `len` bytes) goes. Now if its class has
    /// the credits and nothing held back comes before it that it may not pass (PCIe 6.0
    /// §2.4.1: posted requests may pass non-posted requests and completions; nothing passes
    /// an earlier posted request; a class keeps its own order). It joins the last chunk of
    /// its queue if its record fits the frame's `room`, and — a held-back chunk — if the
    /// chunk stays within what it may ask at once (`TxCredits::chunk_cap`) and no posted
    /// request was held back after the chunk began: the chunk goes out before such a request
    /// (it is older), and the TLP joining it would pass it.
    pub(super) fn place(
        &self,
        class: usize,
        data: u32,
        len: usize,
        room: usize,
        credits: &TxCredits,
    ) -> Placement {
        let now =
            self.stalled[0].is_empty() && self.stalled[class].is_empty() && credits.covers(class, 1, data);
        let (cap_h, cap_d) = credits.chunk_cap(class, data);
        let posted_since =
            |c: &Chunk| class != 0 && self.stalled[0].back().is_some_and(|p| p.order > c.order);
        let last = if now { self.ready.back() } else { self.stalled[class].back() };
        let joins = last.is_some_and(|c| {
            c.end + 2 + len <= BODY_AT + room
                && (now || (c.tlps[class] < cap_h && c.data + data <= cap_d && !posted_since(c)))
        });
        Placement { now, joins }
    }

    /// The queue a TLP of `class` placed `now` (or not) goes into.
    pub(super) fn queue_for(&mut self, class: usize, now: bool) -> &mut VecDeque<Chunk> {
        if now { &mut self.ready } else { &mut self.stalled[class] }
    }

    /// Where the next DATA frame comes from — `None` inside: the oldest ready chunk;
    /// `Some(class)`: that class's oldest held-back chunk — whichever holds the earliest TLP
    /// among those that may go now: a held-back chunk needs its credits and must not pass
    /// an earlier held-back posted chunk. (A ready chunk never holds a TLP that may not pass
    /// what is held back: see [`TxQueue::place`].)
    pub(super) fn next(&self, credits: &TxCredits) -> Option<Option<usize>> {
        let mut best = self.ready.front().map(|c| (c.order, None));
        let posted_head = self.stalled[0].front().map(|c| c.order);
        for (class, q) in self.stalled.iter().enumerate() {
            let Some(head) = q.front() else { continue };
            if class != 0 && posted_head.is_some_and(|p| p < head.order) {
                continue;
            }
            if credits.covers(class, head.tlps[class], head.data) && best.is_none_or(|(o, _)| head.order < o)
            {
                best = Some((head.order, Some(class)));
            }
        }
        best.map(|(_, from)| from)
    }

    /// Takes the chunk [`TxQueue::next`] chose, charging a held-back one's credits, and
    /// counts its TLPs out of the queue.
    pub(super) fn take(&mut self, from: Option<usize>, credits: &mut TxCredits) -> Option<Chunk> {
        let chunk = match from {
            None => self.ready.pop_front()?,
            Some(class) => {
                let c = self.stalled[class].pop_front()?;
                credits.charge(class, c.tlps[class], c.data);
                c
            }
        };
        for (q, n) in self.queued.iter_mut().zip(chunk.tlps) {
            *q -= n as usize;
        }
        Some(chunk)
    }
}

/// The frame keys the handshake made, and what the two ends agreed frames carry.
pub(super) struct Crypto {
    pub(super) tx: Option<TxKeys>,
    pub(super) rx: Option<RxKeys>,
    /// Frames carry tags (on unless both ends asked for none).
    pub(super) authenticate: bool,
    /// DATA bodies are encrypted.
    pub(super) encrypt: bool,
    /// ACK and KEEPALIVE frames carry selective acknowledgements (both sides asked).
    pub(super) selective_ack: bool,
    /// Where an encrypted frame is decrypted (the receive buffer is not ours to change).
    pub(super) scratch: Vec<u8>,
}

impl Crypto {
    pub(super) fn new() -> Crypto {
        Crypto {
            tx: None,
            rx: None,
            authenticate: true,
            encrypt: false,
            selective_ack: false,
            scratch: Vec::new(),
        }
    }
}

/// The receive side's order: the next sequence number to deliver, the frames ahead of it,
/// the TLPs delivered for `recv_tlp`, and the gap last NAKed.
pub(super) struct RxQueue {
    pub(super) rx_next: SeqNum,
    /// DATA frames ahead of `rx_next`, waiting for the gap before them.
    pub(super) out_of_order: ReorderBuffer,
    /// Delivered TLPs with their credit index and cost (header, data), for `recv_tlp`.
    pub(super) delivered: VecDeque<(Vec<u8>, usize, u32, u32)>,
    /// The missing frame a NAK was last owed for (one NAK per gap).
    nak_sent_for: Option<SeqNum>,
}

/// What a DATA frame's sequence number makes of it ([`RxQueue::arrival`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arrival {
    /// Delivered before: dropped.
    Duplicate,
    /// A window or more ahead of the next to deliver: dropped (the peer cannot have sent it
    /// before what it acknowledges).
    OutOfWindow,
    /// This many frames ahead of the next to deliver: held until the gap fills.
    Ahead(usize),
    /// The next to deliver.
    Next,
}

impl RxQueue {
    pub(super) fn new() -> RxQueue {
        RxQueue {
            rx_next: SeqNum(0),
            out_of_order: ReorderBuffer::default(),
            delivered: VecDeque::new(),
            nak_sent_for: None,
        }
    }

    /// Where DATA frame `seq` stands against the next to deliver, in a window of `window`.
    pub(super) fn arrival(&self, seq: SeqNum, window: u32) -> Arrival {
        match seq.distance_from(self.rx_next) {
            a if a < 0 => Arrival::Duplicate,
            a if a as u32 >= window => Arrival::OutOfWindow,
            0 => Arrival::Next,
            a => Arrival::Ahead(a as usize),
        }
    }

    /// The next frame was delivered.
    pub(super) fn advance(&mut self) {
        self.rx_next = self.rx_next.next();
    }

    /// Whether the gap at `rx_next` is owed a NAK: once per gap.
    pub(super) fn nak_owed(&mut self) -> bool {
        let owed = self.nak_sent_for != Some(self.rx_next);
        self.nak_sent_for = Some(self.rx_next);
        owed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_due_frame_is_taken_once() {
        let mut due = Due { ack: true, ..Due::default() };
        assert!(Due::take(&mut due.ack));
        assert!(!Due::take(&mut due.ack));
        assert_eq!(due, Due::default());
    }

    #[test]
    fn an_identity_never_uses_zero_and_two_differ() {
        let mut rng = Rng::from_u64(7);
        let (a, b) = (Identity::new(&mut rng), Identity::new(&mut rng));
        assert!(a.local_id != 0 && a.local_epoch != 0 && (a.peer_id, a.peer_epoch) == (0, 0));
        assert_ne!((a.local_id, a.local_nonce), (b.local_id, b.local_nonce));
        assert!(a.transcript.is_empty() && a.cookie == [0; COOKIE_LEN] && !a.saw_bad_proof);
    }

    use crate::wire::FcLimits;

    /// Credits of (header, data) per class: posted, non-posted, completion.
    fn credits(p: (u32, u32), np: (u32, u32), c: (u32, u32)) -> TxCredits {
        let mut t = TxCredits::default();
        t.update(FcLimits { posted: p, non_posted: np, completion: c });
        t
    }

    /// A chunk of `n` TLPs of `class` (a record of `len` bytes each, one data credit each).
    fn chunk(order: u64, class: usize, n: u32, len: usize) -> Chunk {
        let mut tlps = [0; 3];
        tlps[class] = n;
        Chunk { order, buf: Vec::new(), end: BODY_AT + n as usize * (2 + len), tlps, data: n }
    }

    #[test]
    fn a_tlp_with_its_credits_goes_now_and_joins_the_last_ready_chunk_while_the_frame_has_room() {
        let mut q = TxQueue::new();
        let cr = credits((8, 64), (8, 0), (8, 64));
        assert_eq!(q.place(2, 1, 20, 100, &cr), Placement { now: true, joins: false });
        q.ready.push_back(chunk(0, 2, 1, 20));
        assert_eq!(q.place(2, 1, 20, 100, &cr), Placement { now: true, joins: true });
        // 22 bytes in, 78 left: a record of 2 + 77 bytes does not fit.
        assert_eq!(q.place(0, 1, 77, 100, &cr), Placement { now: true, joins: false });
        // No credits: held back in its class, in a chunk of its own.
        let none = credits((0, 0), (8, 0), (8, 64));
        assert_eq!(q.place(0, 1, 20, 100, &none), Placement { now: false, joins: false });
    }

    #[test]
    fn a_posted_request_passes_a_held_back_completion_and_nothing_passes_a_held_back_posted_one() {
        let cr = credits((8, 64), (8, 0), (8, 64));
        let mut q = TxQueue::new();
        q.stalled[2].push_back(chunk(0, 2, 1, 20));
        assert!(q.place(0, 1, 20, 100, &cr).now, "a posted request may pass a completion");
        assert!(!q.place(2, 1, 20, 100, &cr).now, "a completion keeps its class's order");
        let mut q = TxQueue::new();
        q.stalled[0].push_back(chunk(0, 0, 1, 20));
        for class in 0..3 {
            assert!(!q.place(class, 0, 20, 100, &cr).now, "class {class} passed a held-back posted request");
        }
        // A completion held back before the posted request was may join its chunk; one held
        // back after it may not (the chunk goes before the posted request).
        let mut q = TxQueue::new();
        q.stalled[2].push_back(chunk(0, 2, 1, 20));
        // The completion credits granted, all used.
        let mut held = credits((8, 64), (8, 0), (8, 64));
        held.charge(2, 8, 64);
        assert!(q.place(2, 1, 20, 100, &held).joins);
        q.stalled[0].push_back(chunk(1, 0, 1, 20));
        assert!(!q.place(2, 1, 20, 100, &held).joins);
    }

    #[test]
    fn the_next_frame_is_the_earliest_chunk_that_may_go_and_taking_it_charges_and_counts_it_out() {
        let mut q = TxQueue::new();
        q.stalled[0].push_back(chunk(2, 0, 1, 20));
        q.stalled[2].push_back(chunk(3, 2, 2, 20));
        q.ready.push_back(chunk(5, 1, 1, 20));
        q.queued = [1, 1, 2];
        // No posted credits: the completions (order 3) may not pass the posted request (2);
        // the ready chunk goes.
        let mut cr = credits((0, 0), (8, 0), (8, 64));
        assert_eq!(q.next(&cr), Some(None));
        // With them, the posted request is the earliest.
        cr.update(FcLimits { posted: (8, 64), non_posted: (8, 0), completion: (8, 64) });
        assert_eq!(q.next(&cr), Some(Some(0)));
        let c = q.take(Some(0), &mut cr).map(|c| c.order);
        assert_eq!((c, q.queued), (Some(2), [0, 1, 2]));
        assert_eq!(q.next(&cr), Some(Some(2)));
        assert!(q.take(Some(2), &mut cr).is_some());
        assert_eq!(q.queued, [0, 1, 0]);
        // Charged: the completions' 2 headers and 2 data credits of 8 and 64.
        assert_eq!(cr.available(), [7, 63, 8, 0, 6, 62]);
        assert_eq!(q.take(None, &mut cr).map(|c| c.order), Some(5));
        assert_eq!((q.next(&cr), q.len()), (None, 0));
    }

    #[test]
    fn a_frame_is_next_ahead_a_duplicate_or_out_of_the_window_and_each_gap_is_naked_once() {
        let mut q = RxQueue::new();
        q.rx_next = SeqNum(u32::MAX - 1);
        let at = |d: i64| SeqNum((u32::MAX as i64 - 1 + d).rem_euclid(1 << 32) as u32);
        assert_eq!(q.arrival(at(0), 8), Arrival::Next);
        assert_eq!(q.arrival(at(-1), 8), Arrival::Duplicate);
        // Across the wrap of the sequence space.
        assert_eq!(q.arrival(at(3), 8), Arrival::Ahead(3));
        assert_eq!(q.arrival(at(7), 8), Arrival::Ahead(7));
        assert_eq!(q.arrival(at(8), 8), Arrival::OutOfWindow);
        assert!(q.nak_owed() && !q.nak_owed(), "a gap is NAKed once");
        q.advance();
        q.advance();
        assert_eq!((q.rx_next, q.arrival(at(2), 8)), (SeqNum(0), Arrival::Next));
        assert!(q.nak_owed(), "the next gap is NAKed again");
    }

    #[test]
    fn the_transmit_queue_orders_what_it_takes_and_counts_by_class() {
        let mut q = TxQueue::new();
        for class in [0, 2, 0, 2, 2] {
            q.count(class);
        }
        assert_eq!((q.queued, q.len(), q.next_order), ([2, 0, 3], 5, 5));
        assert!(q.ready.is_empty() && q.stalled.iter().all(VecDeque::is_empty));
    }
}
