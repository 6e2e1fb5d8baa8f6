//! The receive side: datagrams checked and authenticated, ACK / NAK applied to the replay
//! buffer, DATA frames put in order (the reorder buffer holds what is ahead of a gap) and
//! their TLPs delivered, in place or through the queue, charged against this side's grants.
#![forbid(unsafe_code)]

use crate::keys::Which;
use crate::reorder::Next;
use crate::seq::SeqNum;
use crate::time::Time;
use crate::wire::{Frame, FrameType, SackRanges, TlpRecords};

use super::parts::Arrival;
use super::{DownReason, Event, InPlace, Role, Session, State, Stats, Timer, tlp_cost};

impl Session {
    /// The next TLP the peer sent, in order. Reading it returns its credits to the peer.
    /// Give the buffer back with [`Session::recycle`] to avoid allocation.
    pub fn recv_tlp(&mut self) -> Option<Vec<u8>> {
        let (tlp, class, h, d) = self.rxq.delivered.pop_front()?;
        self.rx_credits.release(class, h, d);
        Some(tlp)
    }

    /// Returns a buffer to the session's pool.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 4 * self.window as usize {
            self.pool.push(buf);
        }
    }

    /// Handles one received datagram.
    pub fn handle_datagram(&mut self, now: Time, bytes: &[u8]) {
        self.handle_datagram_with(now, bytes, None);
    }

    /// Handles one received datagram, offering each TLP that is next in order to `sink`
    /// first, in place in `bytes`: a TLP the sink takes (returns `true`) is consumed there —
    /// its credits come back at once and [`Session::recv_tlp`] never sees it — and the rest
    /// queue for `recv_tlp` as usual. Offered only while nothing is queued before it, so the
    /// application sees every TLP in order either way. This is the receive path without a
    /// copy: a posted write's payload goes from the socket's buffer straight to its target.
    pub fn handle_datagram_with(&mut self, now: Time, bytes: &[u8], sink: Option<InPlace<'_>>) {
        let frame = match Frame::new_checked(bytes) {
            Ok(f) => f,
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return;
            }
        };
        self.handle_frame_with(now, &frame, sink);
    }

    /// Handles a frame already checked (an endpoint that demultiplexes checks once).
    pub fn handle_frame(&mut self, now: Time, frame: &Frame<'_>) {
        self.handle_frame_with(now, frame, None);
    }

    /// [`Session::handle_frame`] with a sink, as [`Session::handle_datagram_with`].
    pub fn handle_frame_with(&mut self, now: Time, frame: &Frame<'_>, sink: Option<InPlace<'_>>) {
        let h = frame.header();
        if self.is_down() {
            self.stats.dropped_unexpected += 1;
            return;
        }
        if h.session != self.id.local_id {
            self.stats.dropped_wrong_session += 1;
            return;
        }
        match (self.state, h.ty) {
            (State::ClientInit, FrameType::Cookie) => return self.on_cookie(frame),
            (State::ClientInit, FrameType::Challenge) => return self.on_challenge(now, frame),
            (State::ClientInit | State::ClientResponse, FrameType::Refuse) => return self.on_refuse(frame),
            (State::Up, FrameType::Response) if self.role == Role::Server => return self.on_response(frame),
            (_, ty) if ty.is_handshake() => {
                self.stats.dropped_unexpected += 1;
                return;
            }
            (_, FrameType::Unknown(_)) => {
                self.stats.dropped_unexpected += 1;
                return;
            }
            _ => {}
        }
        // Everything else is authenticated with the peer's frame key of the phase the frame
        // says; an encrypted body is decrypted into `scratch` (the receive buffer is not ours).
        let Some(rx) = self.crypto.rx.as_mut() else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        let which = rx.which(h.key_phase, h.pn);
        let key = rx.key(which);
        let mut decrypted = None;
        if self.crypto.encrypt && h.ty == FrameType::Data && !frame.body().is_empty() {
            let mut scratch = std::mem::take(&mut self.crypto.scratch);
            scratch.clear();
            let bytes = frame.bytes();
            scratch.extend_from_slice(&bytes[..bytes.len() - 4]);
            match key.open(&mut scratch, frame.body_at()) {
                Some(len) => decrypted = Some((scratch, len)),
                None => {
                    self.crypto.scratch = scratch;
                    self.stats.dropped_bad_mac += 1;
                    return;
                }
            }
        } else if self.crypto.authenticate && !key.verify(frame.authenticated(), &frame.tag()) {
            self.stats.dropped_bad_mac += 1;
            return;
        }
        if self.crypto.authenticate && which == Which::Next {
            // Authentic under the next key: the peer updated its key.
            rx.advance(h.pn);
            self.stats.peer_key_updates += 1;
        }
        if h.epoch != self.id.peer_epoch {
            self.stats.dropped_stale_epoch += 1;
            return;
        }
        if !self.rx_pns.accept(h.pn) {
            self.stats.dropped_replayed += 1;
            return;
        }
        if self.state == State::ClientResponse {
            self.become_up(now);
        }
        self.stats.frames_received += 1;
        self.stats.bytes_received += frame.bytes().len() as u64;
        self.set_timer(Timer::Idle, now + self.cfg.idle_timeout);
        if let Some(silent_for) = self.live.heard(now) {
            self.events.push_back(Event::Resumed { silent_for });
        }
        if let Some(fc) = frame.fc() {
            self.tx_credits.update(fc);
        }
        self.on_ack(now, SeqNum(h.ack), h.nak);
        if self.crypto.selective_ack
            && matches!(h.ty, FrameType::Ack | FrameType::Keepalive)
            && !frame.body().is_empty()
        {
            self.on_sack(now, frame.body());
        }
        match h.ty {
            FrameType::Data => match decrypted {
                Some((scratch, len)) => {
                    let at = frame.body_at();
                    self.on_data(now, SeqNum(h.seq), &scratch[at..at + len], sink);
                    self.crypto.scratch = scratch;
                }
                None => self.on_data(now, SeqNum(h.seq), frame.body(), sink),
            },
            FrameType::Close => self.go_down(DownReason::PeerClosed),
            _ => {}
        }
    }

    pub(super) fn on_ack(&mut self, now: Time, ack: SeqNum, nak: bool) {
        if let Some(tx) = &mut self.crypto.tx {
            tx.acked(ack);
        }
        if let Some((seq, sent)) = self.rtt_probe
            && seq < ack
        {
            self.rtt_probe = None;
            let rtt = now.since(sent);
            self.rtt.sample(rtt);
            self.stats.rtt_us_log2[Stats::rtt_bucket(rtt.as_micros() as u64)] += 1;
        }
        if self.replay.acknowledge(ack).freed > 0 {
            self.timers[Timer::Replay as usize] = None;
            self.arm_replay(now);
        }
        if nak {
            self.stats.naks_received += 1;
            self.replay.nak(ack);
        }
    }

    /// A selective acknowledgement: the frames the peer holds beyond its gap are not replayed,
    /// and those they overtook are replayed at once. A body that is not one (the peer is
    /// broken: the frame was authentic) is counted and ignored.
    pub(super) fn on_sack(&mut self, now: Time, body: &[u8]) {
        let Ok(ranges) = SackRanges::new_checked(body) else {
            self.stats.dropped_unexpected += 1;
            return;
        };
        let got = self.replay.sack(ranges.iter().map(|(a, b)| (SeqNum(a), SeqNum(b))));
        self.stats.frames_sacked += got.newly as u64;
        self.stats.lost_by_sack += got.lost as u64;
        if got.newly > 0 {
            // Progress: the replay timer starts again, from the round trip (no back-off).
            self.timers[Timer::Replay as usize] = None;
            self.arm_replay(now);
        }
    }

    pub(super) fn on_data(&mut self, now: Time, seq: SeqNum, body: &[u8], mut sink: Option<InPlace<'_>>) {
        self.due.ack = true;
        if !self.cfg.ack_delay.is_zero() && self.timers[Timer::Ack as usize].is_none() {
            self.set_timer(Timer::Ack, now + self.cfg.ack_delay);
        }
        match self.rxq.arrival(seq, self.window) {
            Arrival::Duplicate => {
                self.stats.duplicate_data += 1;
                return;
            }
            Arrival::OutOfWindow => {
                self.stats.dropped_out_of_window += 1;
                return;
            }
            Arrival::Ahead(ahead) => {
                // A gap: hold this frame and NAK the first missing one, once per gap; say
                // which frames are held beyond it.
                if !self.rxq.out_of_order.hold(ahead, body, &mut self.pool) {
                    self.stats.duplicate_data += 1;
                }
                self.nak_gap();
                self.due.sack |= self.crypto.selective_ack;
                return;
            }
            Arrival::Next => {}
        }
        self.deliver(body, &mut sink);
        self.rxq.advance();
        loop {
            match self.rxq.out_of_order.pop_next() {
                Next::Held(b) => {
                    self.deliver(&b, &mut sink);
                    self.recycle(b);
                    self.rxq.advance();
                }
                // rx_next is still missing, with frames after it held.
                Next::Gap => break self.nak_gap(),
                Next::Empty => break,
            }
        }
        if self.crypto.selective_ack && !self.rxq.out_of_order.is_empty() {
            self.due.sack = true;
        }
    }

    /// A NAK for the first missing frame, once per gap.
    pub(super) fn nak_gap(&mut self) {
        if self.rxq.nak_owed() {
            self.due.nak = true;
        }
    }

    /// Hands a frame's TLPs to the application, charging their credits: to `sink` in place
    /// while nothing waits in the delivery queue before them, else to the queue.
    pub(super) fn deliver(&mut self, body: &[u8], sink: &mut Option<InPlace<'_>>) {
        for rec in TlpRecords::new(body) {
            let Ok(tlp) = rec else {
                self.stats.malformed_tlps += 1;
                break;
            };
            let Ok((class, h, d)) = tlp_cost(tlp) else {
                self.stats.malformed_tlps += 1;
                continue;
            };
            if !self.rx_credits.take(class, h, d) {
                self.go_down(DownReason::ProtocolViolation("TLP beyond granted credits"));
                return;
            }
            self.stats.tlps_received += 1;
            if self.rxq.delivered.is_empty()
                && let Some(take) = sink.as_mut()
                && take(tlp)
            {
                // Consumed where it lies: the credits are free again.
                self.rx_credits.release(class, h, d);
                continue;
            }
            let mut b = self.pool.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(tlp);
            self.rxq.delivered.push_back((b, class, h, d));
        }
    }
}
