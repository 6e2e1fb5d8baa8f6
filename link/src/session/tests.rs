//! The session against itself: two sessions joined in memory.
use super::*;
use crate::handshake::{
    COOKIE_LEN, ChallengeBody, CookieBody, InitBody, RefuseBody, SERVER_PROOF, options, transcript,
};
use crate::wire::{Frame, FrameRepr, FrameType, Header, MAX_SACK_RANGES, SackRanges, TAG_LEN, TlpRecords};
use tlp::{Address, Bdf, Body, Request, Tag};
use zerocopy::{FromBytes, IntoBytes};

fn test_config() -> Config {
    Config::new(crate::PresharedKey::new(b"dxpu unit test key, 32 bytes....").unwrap())
}

/// A client and a server session joined in memory, handshake done.
fn pair() -> (Session, Session) {
    pair_with(test_config(), test_config())
}

/// [`pair`] with these configurations.
fn pair_with(client: Config, server: Config) -> (Session, Session) {
    let t = Time::from_nanos(1);
    let mut c = Session::client(client, t, 1, Rng::from_u64(1));
    let mut ep: crate::Endpoint<u8> = crate::Endpoint::new(server, 2, Rng::from_u64(2), 1);
    let mut buf = vec![0u8; 2048];
    // INIT, COOKIE, INIT, CHALLENGE, RESPONSE: the endpoint's answers, then the session.
    for _ in 0..3 {
        while let Some(n) = c.poll_transmit(t, &mut buf) {
            ep.handle_datagram(t, 0, &buf[..n]);
        }
        while let Some((_, n)) = ep.poll_transmit(&mut buf) {
            c.handle_datagram(t, &buf[..n]);
        }
    }
    let mut s = ep.into_sessions().next().unwrap();
    for _ in 0..2 {
        while let Some(n) = s.poll_transmit(t, &mut buf) {
            c.handle_datagram(t, &buf[..n]);
        }
        while let Some(n) = c.poll_transmit(t, &mut buf) {
            s.handle_datagram(t, &buf[..n]);
        }
    }
    assert!(c.is_up() && s.is_up());
    (c, s)
}

fn write(payload: &[u8]) -> TlpRepr<'_> {
    TlpRepr::new(Body::MemWrite {
        req: Request {
            requester: Bdf::new(0, 1, 0),
            tag: Tag::default(),
            first_be: 0xf,
            last_be: if payload.len() > 4 { 0xf } else { 0 },
        },
        address: Address::Bits64(0x1_0000_0000),
        ph: 0,
        data: payload,
    })
}

/// A TLP is written once, into the buffer its DATA frame is then sent from: the sealed
/// frame lies in the very buffer `send_repr` emitted into, and replays come from it too.
#[test]
fn a_tlp_is_sent_from_where_it_was_written() {
    let (mut c, mut s) = pair();
    let payload: Vec<u8> = (0..256u16).map(|i| i as u8).collect();
    c.send_repr(&write(&payload)).unwrap();
    c.send_repr(&write(&payload[..64])).unwrap();
    let written = c.txq.ready.back().map(|ch| ch.buf.as_ptr() as usize).unwrap();
    assert_eq!(c.txq.ready.len(), 1, "two TLPs queued together share a frame");
    let t = Time::from_nanos(2);
    let mut control = vec![0u8; 2048];
    let Some(Transmit::Sealed(f)) = c.poll_transmit_in_place(t, &mut control) else {
        panic!("no DATA frame")
    };
    let frame = c.sealed(&f).to_vec();
    let at = c.sealed(&f).as_ptr() as usize;
    assert!(at >= written && at < written + BODY_AT, "frame not sealed in the TLPs' buffer");
    let parsed = Frame::new_checked(&frame).unwrap();
    let recs: Vec<&[u8]> = TlpRecords::new(parsed.body()).map(Result::unwrap).collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(&recs[0][recs[0].len() - 256..], &payload[..]);
    // The replay timer fires: the same buffer is sealed again (a new packet number).
    let later = Time::from_nanos(50_000_000);
    c.handle_timeout(later);
    let Some(Transmit::Sealed(r)) = c.poll_transmit_in_place(later, &mut control) else {
        panic!("no replay")
    };
    let replay_at = c.sealed(&r).as_ptr() as usize;
    assert!(replay_at >= written && replay_at < written + BODY_AT);
    let replay = c.sealed(&r).to_vec();
    assert_eq!(Frame::new_checked(&replay).unwrap().body(), parsed.body());
    // Both copies deliver once; the acknowledgement empties the replay buffer.
    s.handle_datagram(later, &frame);
    s.handle_datagram(later, &replay);
    assert_eq!(s.memory().delivered_tlps, 2);
    let acked = Time::from_nanos(51_000_000);
    s.handle_timeout(acked);
    while let Some(n) = s.poll_transmit(acked, &mut control) {
        c.handle_datagram(acked, &control[..n]);
    }
    assert_eq!(c.memory().unacked_frames, 0);
    assert!(c.sealed(&r).is_empty(), "an acknowledged frame has no bytes to send");
}

/// A TLP without credits is held back in its class and goes, in its own frame, when
/// credits come; the posted writes queued behind a held-back read pass it.
#[test]
fn held_back_tlps_wait_for_credits_and_writes_pass_them() {
    // 256 header credits a class: fewer than the send queue's limit.
    let mut cfg = test_config();
    cfg.credits = crate::CreditGrant::default();
    let (mut c, mut s) = pair_with(cfg.clone(), cfg);
    let nph = c.tx_credits.grant().get(credits::index(tlp::FcClass::NonPosted)).header;
    let read = TlpRepr::new(Body::MemRead {
        req: Request { requester: Bdf::new(0, 1, 0), tag: Tag::default(), first_be: 0xf, last_be: 0 },
        address: Address::Bits32(0x1000),
        ph: 0,
        length_dw: 1,
        locked: false,
    });
    for _ in 0..nph + 2 {
        c.send_repr(&read).unwrap();
    }
    c.send_repr(&write(&[1, 2, 3, 4])).unwrap();
    assert_eq!(c.txq.stalled[1].iter().map(|ch| ch.tlps[1]).sum::<u32>(), 2);
    assert_eq!(c.stats().credit_stalls, 2, "each read held back for credits is counted");
    assert_eq!(c.txq.queued, [1, nph as usize + 2, 0]);
    let t = Time::from_nanos(2);
    let mut buf = vec![0u8; 2048];
    while let Some(n) = c.poll_transmit(t, &mut buf) {
        s.handle_datagram(t, &buf[..n]);
    }
    // Everything the credits allow arrived (the write passed the two held-back reads).
    assert_eq!(s.memory().delivered_tlps, nph as usize + 1);
    assert_eq!(c.memory().queued_tlps, 2);
    // The server drains: credits come back, the held-back reads go.
    while let Some(b) = s.recv_tlp() {
        s.recycle(b);
    }
    for _ in 0..3 {
        while let Some(n) = s.poll_transmit(t, &mut buf) {
            c.handle_datagram(t, &buf[..n]);
        }
        while let Some(n) = c.poll_transmit(t, &mut buf) {
            s.handle_datagram(t, &buf[..n]);
        }
    }
    assert_eq!(s.memory().delivered_tlps, 2);
    assert!(c.is_idle() || c.memory().queued_tlps == 0);
}

/// Bytes are counted each way as the datagrams' lengths; a frame's round trip is timed from
/// its first send to the ACK that covers it, one frame in flight at a time, and a replayed
/// frame is not timed at all.
#[test]
fn bytes_and_round_trips_are_counted() {
    let (mut c, mut s) = pair();
    let (sent0, received0) = (c.stats().bytes_sent, s.stats().bytes_received);
    let mut t = Time::from_nanos(10);
    let wire = exchange(&mut c, &mut s, &[7; 64], 5, &mut t);
    let total: u64 = wire.iter().map(|w| w.len() as u64).sum();
    assert_eq!(c.stats().bytes_sent - sent0, total);
    assert_eq!(s.stats().bytes_received - received0, total);
    // Each write was acknowledged 1 ms after it was sent: five samples in [512, 1024) µs.
    assert_eq!(c.stats().rtt_samples(), 5);
    assert_eq!(c.stats().rtt_us_log2[9], 5);
    assert_eq!(c.stats().rtt_quantile_us(0.5), Some(1024));
    assert_eq!(c.stats().rtt_quantile_us(0.99), Some(1024));
    // A frame lost and replayed: no sample.
    c.send_repr(&write(&[1; 4])).unwrap();
    let mut buf = vec![0u8; 2048];
    while c.poll_transmit(t, &mut buf).is_some() {}
    // The replay timer is the next one due (the keepalive and idle timers are later).
    t = c.poll_timeout().unwrap();
    c.handle_timeout(t);
    while let Some(n) = c.poll_transmit(t, &mut buf) {
        s.handle_datagram(t, &buf[..n]);
    }
    t = t + core::time::Duration::from_millis(1);
    s.handle_timeout(t);
    while let Some(n) = s.poll_transmit(t, &mut buf) {
        c.handle_datagram(t, &buf[..n]);
    }
    assert!(c.stats().retransmits > 0);
    assert_eq!(c.stats().rtt_samples(), 5, "a replayed frame is not timed");
    assert_eq!(Stats::rtt_bucket(0), 0);
    assert_eq!(Stats::rtt_bucket(u64::MAX), RTT_BUCKETS - 1);
    assert_eq!(Stats::default().rtt_quantile_us(0.5), None);
}

/// Sends `n` writes of `payload` from `c` to `s` and back acknowledgements; returns the
/// datagrams `c` sent.
fn exchange(c: &mut Session, s: &mut Session, payload: &[u8], n: usize, t: &mut Time) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 2048];
    let mut wire = Vec::new();
    for _ in 0..n {
        c.send_repr(&write(payload)).unwrap();
        *t = *t + core::time::Duration::from_micros(100);
        while let Some(len) = c.poll_transmit(*t, &mut buf) {
            wire.push(buf[..len].to_vec());
            s.handle_datagram(*t, &buf[..len]);
        }
        while let Some(r) = s.recv_tlp() {
            s.recycle(r);
        }
        *t = *t + core::time::Duration::from_millis(1);
        s.handle_timeout(*t);
        while let Some(len) = s.poll_transmit(*t, &mut buf) {
            c.handle_datagram(*t, &buf[..len]);
        }
    }
    wire
}

#[test]
fn an_encrypted_session_sends_no_plaintext_and_takes_no_altered_frame() {
    let mut enc = test_config();
    enc.encrypt_frames = true;
    // Only the server asks: the session encrypts all the same, both ways.
    let (mut c, mut s) = pair_with(test_config(), enc);
    assert_eq!((c.frame_protection(), s.frame_protection()), ((true, true), (true, true)));
    let secret = *b"a tenant's model weights: not for you!!!";
    let mut t = Time::from_nanos(10);
    let wire = exchange(&mut c, &mut s, &secret, 8, &mut t);
    let data: Vec<&Vec<u8>> = wire.iter().filter(|f| f[3] == 5).collect();
    assert!(!data.is_empty());
    for f in &data {
        assert!(!f.windows(secret.len()).any(|w| w == secret), "plaintext on the wire");
    }
    assert_eq!(s.stats().tlps_received, 8);
    // A bit flipped in an encrypted body (CRC fixed up): the tag catches it.
    let before = s.stats().dropped_bad_mac;
    let mut f = data[0].clone();
    f[60] ^= 1;
    let len = f.len();
    let crc = crate::wire::crc32c(&f[..len - 4]);
    f[len - 4..].copy_from_slice(&crc.to_be_bytes());
    s.handle_datagram(t, &f);
    assert_eq!(s.stats().dropped_bad_mac, before + 1);
    // The same payload in a session that only tags frames is on the wire as it is.
    let (mut c, mut s) = pair();
    assert_eq!(c.frame_protection(), (true, false));
    let wire = exchange(&mut c, &mut s, &secret, 1, &mut t);
    assert!(wire.iter().any(|f| f.windows(secret.len()).any(|w| w == secret)));
}

#[test]
fn tags_are_on_when_either_side_asks_for_them() {
    let mut untagged = test_config();
    untagged.authenticate_frames = false;
    let (c, s) = pair_with(untagged.clone(), test_config());
    assert_eq!((c.frame_protection(), s.frame_protection()), ((true, false), (true, false)));
    let (c, s) = pair_with(untagged.clone(), untagged);
    assert_eq!((c.frame_protection(), s.frame_protection()), ((false, false), (false, false)));
}

#[test]
fn keys_update_without_dropping_the_session() {
    let mut cfg = test_config();
    cfg.encrypt_frames = true;
    cfg.key_update_frames = 16;
    let (mut c, mut s) = pair_with(cfg.clone(), cfg);
    let mut t = Time::from_nanos(10);
    exchange(&mut c, &mut s, &[7u8; 64], 200, &mut t);
    assert_eq!(s.stats().tlps_received, 200);
    assert!(c.stats().key_updates >= 5, "{:?}", c.stats());
    assert_eq!(s.stats().peer_key_updates, c.stats().key_updates);
    assert!(s.stats().key_updates >= 1 && c.stats().peer_key_updates == s.stats().key_updates);
    assert!(c.is_up() && s.is_up());
    assert_eq!(s.stats().dropped_bad_mac + c.stats().dropped_bad_mac, 0);
}

/// A client in its handshake, the INIT it sent (body), and a way to hand it a frame of
/// `ty` with `body` from the server's epoch 2.
fn client_after_init(cfg: Config) -> (Session, InitBody) {
    let t = Time::from_nanos(1);
    let mut c = Session::client(cfg, t, 1, Rng::from_u64(1));
    let mut buf = vec![0u8; 2048];
    let n = c.poll_transmit(t, &mut buf).unwrap();
    let f = Frame::new_checked(&buf[..n]).unwrap();
    let init = InitBody::read_from_bytes(f.body()).unwrap();
    (c, init)
}

fn to_client(c: &mut Session, ty: FrameType, body: &[u8]) {
    let h = Header { session: c.local_id(), epoch: 2, ..Header::new(ty) };
    let mut buf = vec![0u8; 256];
    let n = FrameRepr { header: h, fc: None, body }.emit(&mut buf, |_| [0; TAG_LEN]).unwrap();
    c.handle_datagram(Time::from_nanos(2), &buf[..n]);
}

/// COOKIE and REFUSE carry no proof: a client takes them only when they echo the nonce of
/// its own INIT, which an off-path sender never saw.
#[test]
fn a_cookie_or_refusal_not_echoing_the_clients_nonce_is_ignored() {
    let (mut c, init) = client_after_init(test_config());
    let mut wrong = init.nonce;
    wrong[0] ^= 1;
    to_client(&mut c, FrameType::Cookie, CookieBody { nonce: wrong, cookie: [7; COOKIE_LEN] }.as_bytes());
    to_client(&mut c, FrameType::Refuse, RefuseBody { nonce: wrong, reason: 2, reserved: [0; 3] }.as_bytes());
    assert_eq!(c.id.cookie, [0; COOKIE_LEN], "a forged cookie was taken");
    assert!(!c.is_down() && c.poll_event().is_none(), "a forged refusal ended the handshake");
    assert_eq!(c.stats().dropped_unexpected, 2);
    // The same with the right nonce: taken.
    to_client(
        &mut c,
        FrameType::Cookie,
        CookieBody { nonce: init.nonce, cookie: [7; COOKIE_LEN] }.as_bytes(),
    );
    assert_eq!(c.id.cookie, [7; COOKIE_LEN]);
    // A reason this version does not know still ends it, as a refusal.
    to_client(
        &mut c,
        FrameType::Refuse,
        RefuseBody { nonce: init.nonce, reason: 99, reserved: [0; 3] }.as_bytes(),
    );
    assert_eq!(c.poll_event(), Some(Event::Down(DownReason::Refused)));
}

/// A CHALLENGE with a valid proof (a server holding the key) that drops encryption the
/// client asked for is refused; the same CHALLENGE granting it is taken.
#[test]
fn a_challenge_weaker_than_what_the_client_asked_is_refused() {
    let mut cfg = test_config();
    cfg.encrypt_frames = true;
    for (options, taken) in
        [(options::AUTHENTICATE, false), (0, false), (options::KNOWN | 8, false), (options::KNOWN, true)]
    {
        let (mut c, init) = client_after_init(cfg.clone());
        let mut ch = ChallengeBody {
            server_id: 5.into(),
            nonce: [1; 16],
            mtu: 1472.into(),
            window: 128.into(),
            options,
            reserved: 0,
            proof: [0; 32],
        };
        ch.proof = cfg.psk.proof(SERVER_PROOF, &transcript(1, &init, 2, &ch));
        to_client(&mut c, FrameType::Challenge, ch.as_bytes());
        assert_eq!(c.state == State::ClientResponse, taken, "options {options:#x}");
        assert_eq!(c.stats().dropped_unexpected, u64::from(!taken), "options {options:#x}");
    }
}

/// A selective acknowledgement from a broken peer (the frame was authentic): a body that is
/// not whole ranges, or more ranges than a frame carries, is counted and ignored; ranges
/// that name nothing held — past what was sent, reversed, wrapping the sequence space — change
/// nothing. No panic, no frame given up, and the data still arrives.
#[test]
fn a_selective_acknowledgement_that_makes_no_sense_is_ignored() {
    let (mut c, mut s) = pair();
    let mut t = Time::from_nanos(10);
    let mut buf = vec![0u8; 2048];
    for _ in 0..4 {
        c.send_repr(&write(&[1; 64])).unwrap();
    }
    // Sent, none acknowledged yet.
    let mut sent = Vec::new();
    while let Some(n) = c.poll_transmit(t, &mut buf) {
        sent.push(buf[..n].to_vec());
    }
    let before = *c.stats();
    for len in [1, 7, 8 * MAX_SACK_RANGES + 8] {
        c.on_sack(t, &vec![0xff; len]);
    }
    assert_eq!(c.stats().dropped_unexpected, before.dropped_unexpected + 3);
    let mut junk = [0u8; 8 * MAX_SACK_RANGES];
    // The frames held are 0..4: before them, reversed, half the space away, empty, beyond.
    let ranges = [(u32::MAX - 1, u32::MAX), (3, 1), (500, 400), (1 << 31, u32::MAX), (0, 0), (100, 1 << 30)];
    let n = SackRanges::emit(ranges, &mut junk);
    c.on_sack(t, &junk[..n]);
    assert_eq!(c.stats().dropped_unexpected, before.dropped_unexpected + 3, "well-formed ranges are taken");
    assert_eq!(c.stats().frames_sacked, before.frames_sacked, "ranges naming nothing held changed something");
    // The data still arrives, and is acknowledged in full.
    t = Time::from_nanos(20);
    for f in &sent {
        s.handle_datagram(t, f);
    }
    while let Some(n) = s.poll_transmit(t, &mut buf) {
        c.handle_datagram(t, &buf[..n]);
    }
    assert_eq!(std::iter::from_fn(|| s.recv_tlp()).count(), 4);
    assert_eq!(c.stats().retransmits, before.retransmits, "nothing was replayed");
}
