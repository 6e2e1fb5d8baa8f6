//! The session's parts that own a concern of their own: who the two ends are (the
//! handshake's identity), the control frames due, the transmit queue, the frame keys, and
//! the receive side's order.

use std::collections::VecDeque;

use crate::auth::Rng;
use crate::handshake::COOKIE_LEN;
use crate::keys::{RxKeys, TxKeys};
use crate::reorder::ReorderBuffer;
use crate::seq::SeqNum;

use super::Chunk;

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
}

/// The frame keys the handshake made, and what the two ends agreed frames carry.
pub(super) struct Crypto {
    pub(super) tx: Option<TxKeys>,
    pub(super) rx: Option<RxKeys>,
    /// Frames carry tags (on unless both ends asked for none).
    pub(super) authenticate: bool,
    /// DATA bodies are encrypted.
    pub(super) encrypt: bool,
    /// Where an encrypted frame is decrypted (the receive buffer is not ours to change).
    pub(super) scratch: Vec<u8>,
}

impl Crypto {
    pub(super) fn new() -> Crypto {
        Crypto { tx: None, rx: None, authenticate: true, encrypt: false, scratch: Vec::new() }
    }
}

/// The receive side's order: the next sequence number to deliver, the frames ahead of it,
/// and the TLPs delivered for `recv_tlp`.
pub(super) struct RxQueue {
    pub(super) rx_next: SeqNum,
    /// DATA frames ahead of `rx_next`, waiting for the gap before them.
    pub(super) out_of_order: ReorderBuffer,
    /// Delivered TLPs with their credit index and cost (header, data), for `recv_tlp`.
    pub(super) delivered: VecDeque<(Vec<u8>, usize, u32, u32)>,
}

impl RxQueue {
    pub(super) fn new() -> RxQueue {
        RxQueue { rx_next: SeqNum(0), out_of_order: ReorderBuffer::default(), delivered: VecDeque::new() }
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
