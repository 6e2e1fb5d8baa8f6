//! The send side: TLPs queued into chunks laid out as frames (credits, PCIe ordering, the
//! per-class queues), what goes out next (control frames, replays, new DATA frames sealed
//! in place in the replay buffer), and the frame header, tag and encryption of each.
#![forbid(unsafe_code)]

use std::ops::Range;

use tlp::TlpRepr;

use crate::credits;
use crate::error::SendError;
use crate::keys::TxKeys;
use crate::replay_buffer::Sent;
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::{
    BODY_AT, FC_LEN, FcLimits, FrameRepr, FrameType, HEADER_LEN, Header, MAX_SACK_RANGES, SackRanges,
    TAG_LEN, TRAILER_LEN, seal_in_place,
};

use super::parts::{Chunk, Due, Placement};
use super::{SealedFrame, Session, Source, State, Timer, Transmit, tlp_cost};

impl Session {
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
    pub(super) fn room(&self) -> usize {
        self.mtu - HEADER_LEN - FC_LEN - TRAILER_LEN
    }

    /// Writes a TLP of `class` (`data` data credits, `len` bytes at most) into the chunk it
    /// will be sent in, where [`TxQueue::place`] says: with the ready chunks, charged at
    /// once, if it may go now; else held back in its class.
    pub(super) fn enqueue(
        &mut self,
        class: usize,
        data: u32,
        len: usize,
        src: Source<'_, '_>,
    ) -> Result<(), SendError> {
        let room = self.room();
        if 2 + len > room {
            return Err(SendError::TooLarge { len, mtu: self.mtu });
        }
        if self.txq.queued[class] >= self.cfg.max_queued {
            return Err(SendError::QueueFull { class: credits::CLASSES[class], limit: self.cfg.max_queued });
        }
        let Placement { now, joins } = self.txq.place(class, data, len, room, &self.tx_credits);
        let order = self.txq.next_order;
        let queue = self.txq.queue_for(class, now);
        if !joins {
            let mut buf = self.replay.take_buffer();
            if buf.len() < self.mtu {
                // Room for a whole frame at once: appending TLPs and sealing never move it.
                buf.resize(self.mtu, 0);
            }
            queue.push_back(Chunk { order, buf, end: BODY_AT, tlps: [0; 3], data: 0 });
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
        } else if !self.tx_credits.covers(class, 1, data) {
            self.stats.credit_stalls += 1;
        }
        self.txq.count(class);
        Ok(())
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
        self.stats.bytes_sent += match t {
            Transmit::Written(n) => n,
            Transmit::Sealed(f) => f.end - f.start,
        } as u64;
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

    pub(super) fn transmit(&mut self, now: Time, buf: &mut [u8]) -> Option<Transmit> {
        let written = |n: Option<usize>| n.map(Transmit::Written);
        let buf_len = buf.len().min(self.mtu);
        let buf = &mut buf[..buf_len];
        if Due::take(&mut self.due.close) {
            return written(self.control_frame(FrameType::Close, buf));
        }
        match self.state {
            State::Down(_) => return None,
            State::ClientInit | State::ClientResponse if self.due.handshake => {
                self.due.handshake = false;
                return written(self.handshake_frame(buf));
            }
            State::ClientInit | State::ClientResponse => return None,
            State::Up => {}
        }
        if Due::take(&mut self.due.established) {
            return written(self.control_frame(FrameType::Established, buf));
        }
        // Replays first: they hold up everything behind them at the receiver.
        if let Some(i) = self.replay.next_due() {
            self.stats.retransmits += 1;
            self.rtt_probe = None;
            self.replay.sent_again(i, now, self.next_seq);
            let f = self.data_frame(i);
            self.arm_replay(now);
            return self.data_transmit(f?, buf);
        }
        if (self.replay.len() as u32) < self.window
            && let Some(from) = self.next_chunk()
        {
            let f = self.new_data_frame(from, now);
            if self.rtt_probe.is_none() {
                self.rtt_probe = f.map(|f| (f.seq, now));
            }
            self.arm_replay(now);
            return self.data_transmit(f?, buf);
        }
        if Due::take(&mut self.due.keepalive) {
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
        let ack_ready = self.due.ack && (self.cfg.ack_delay.is_zero() || self.timer_passed(Timer::Ack, now));
        if self.due.nak || self.due.sack || ack_ready || fc_due {
            self.stats.acks_sent += 1;
            return written(self.control_frame(FrameType::Ack, buf));
        }
        None
    }

    /// The next frame's header; its key is counted (and updated when due) here, so that the
    /// frame carries the phase of the key it is sealed under.
    pub(super) fn header(&mut self, ty: FrameType, seq: SeqNum) -> Header {
        let pn = self.next_pn;
        self.next_pn += 1;
        let key_phase = match &mut self.crypto.tx {
            Some(t) => {
                let phase = t.for_frame().1;
                self.stats.key_updates = t.updates;
                phase
            }
            None => false,
        };
        Header {
            ty,
            session: self.id.peer_id,
            epoch: self.id.local_epoch,
            pn,
            seq: seq.0,
            ack: self.rxq.rx_next.0,
            nak: self.due.nak,
            key_phase,
        }
    }

    /// The tag of a frame whose body is sent as it is (every frame of a session that does not
    /// encrypt, and those with no body in one that does: GCM over an empty plaintext is GMAC).
    pub(super) fn mac(&self) -> impl Fn(&[u8]) -> [u8; TAG_LEN] + '_ {
        let key = if self.crypto.authenticate { self.crypto.tx.as_ref().map(TxKeys::key) } else { None };
        move |bytes: &[u8]| key.map_or([0u8; TAG_LEN], |k| k.tag(bytes))
    }

    /// A DATA frame to send: where it was sealed, or an encrypted copy in `buf`.
    pub(super) fn data_transmit(&self, f: SealedFrame, buf: &mut [u8]) -> Option<Transmit> {
        if self.crypto.encrypt {
            self.encrypt_into(&f, buf).map(Transmit::Written)
        } else {
            Some(Transmit::Sealed(f))
        }
    }

    /// A sealed DATA frame, encrypted: copied into `buf` (the plaintext stays in the replay
    /// buffer, to be sealed again under a fresh packet number if it is replayed), its body
    /// encrypted there and its tag and CRC written. The frame's length in `buf`.
    pub(super) fn encrypt_into(&self, f: &SealedFrame, buf: &mut [u8]) -> Option<usize> {
        let frame = self.sealed(f);
        let out = buf.get_mut(..frame.len())?;
        out.copy_from_slice(frame);
        let key = self.crypto.tx.as_ref()?.key();
        crate::wire::reseal(out, |b, body_at| key.seal(b, body_at));
        Some(out.len())
    }

    /// The FC block to send: always on control frames, on DATA only when it changed.
    pub(super) fn fc_for(&mut self, always: bool) -> Option<FcLimits> {
        if always || self.rx_credits.changed() { Some(self.rx_credits.advertise()) } else { None }
    }

    pub(super) fn control_frame(&mut self, ty: FrameType, buf: &mut [u8]) -> Option<usize> {
        let fc = self.fc_for(true);
        let h = self.header(ty, SeqNum(0));
        // An ACK or KEEPALIVE says which frames beyond the gap are held, where both ask.
        let mut sack = [0u8; 8 * MAX_SACK_RANGES];
        let sack_len = match ty {
            FrameType::Ack | FrameType::Keepalive if self.crypto.selective_ack => {
                self.due.sack = false;
                SackRanges::emit(self.rxq.out_of_order.ranges(self.rxq.rx_next), &mut sack)
            }
            _ => 0,
        };
        let mac = self.mac();
        let n = FrameRepr { header: h, fc, body: &sack[..sack_len] }.emit(buf, mac).ok()?;
        self.after_ack_sent(h.nak);
        Some(n)
    }

    pub(super) fn after_ack_sent(&mut self, nak: bool) {
        self.due.ack = false;
        self.timers[Timer::Ack as usize] = None;
        if nak {
            self.due.nak = false;
            self.stats.naks_sent += 1;
        }
    }

    /// Seals (again) the DATA frame at `index` of the replay buffer, in place.
    pub(super) fn data_frame(&mut self, index: usize) -> Option<SealedFrame> {
        let fc = self.fc_for(false);
        let seq = self.replay.get_mut(index)?.seq;
        let h = self.header(FrameType::Data, seq);
        // An encrypting session seals its copy of the frame instead (`encrypt_into`).
        let tags = self.crypto.authenticate && !self.crypto.encrypt;
        let key = if tags { self.crypto.tx.as_ref().map(TxKeys::key) } else { None };
        let mac = |bytes: &[u8]| key.map_or([0u8; TAG_LEN], |k| k.tag(bytes));
        let sent = self.replay.get_mut(index)?;
        if sent.buf.len() < BODY_AT + sent.len + TRAILER_LEN {
            sent.buf.resize(BODY_AT + sent.len + TRAILER_LEN, 0);
        }
        let Range { start, end } = seal_in_place(&mut sent.buf, &h, fc.as_ref(), sent.len, mac).ok()?;
        self.after_ack_sent(h.nak);
        Some(SealedFrame { seq, start, end })
    }

    /// Where the next DATA frame comes from ([`TxQueue::next`]).
    pub(super) fn next_chunk(&self) -> Option<Option<usize>> {
        self.txq.next(&self.tx_credits)
    }

    /// Takes the chunk `next_chunk` chose into the replay buffer as a new DATA frame and
    /// seals it.
    pub(super) fn new_data_frame(&mut self, from: Option<usize>, now: Time) -> Option<SealedFrame> {
        let chunk = self.txq.take(from, &mut self.tx_credits)?;
        self.stats.tlps_sent += chunk.tlps.iter().sum::<u32>() as u64;
        self.stats.data_frames_sent += 1;
        let seq = self.next_seq;
        self.next_seq = seq.next();
        if let Some(tx) = &mut self.crypto.tx {
            tx.first_sent(seq);
        }

        let len = chunk.end - BODY_AT;
        let index = self.replay.push(Sent::new(seq, chunk.buf, len, now));
        self.data_frame(index)
    }

    pub(super) fn arm_replay(&mut self, now: Time) {
        if !self.replay.is_empty() && self.timers[Timer::Replay as usize].is_none() {
            let timeout = self.replay_timeout();
            self.replay_armed_for = timeout;
            self.set_timer(Timer::Replay, now + timeout);
        }
    }
}
