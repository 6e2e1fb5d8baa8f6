//! The handshake's frame bodies and the server's stateless half of it.
//!
//! A server keeps nothing for a peer until the peer has proven its key (docs/security.md):
//!
//! 1. An INIT without a valid **cookie** is answered with COOKIE — a token bound to the
//!    INIT's source address, the client's epoch and INIT fields, and the time it was issued,
//!    under a secret only this server process holds (QUIC's Retry, DTLS's
//!    HelloVerifyRequest). A client proves it receives at the address it sends from by
//!    echoing the cookie. Nothing is kept.
//! 2. An INIT with a valid cookie is answered with CHALLENGE. The server's session ID and
//!    nonce are derived from the cookie under the same secret, so a repeated INIT gets the
//!    same CHALLENGE and nothing is kept either.
//! 3. RESPONSE repeats the INIT body (cookie included) beside the client's proof, so that
//!    the server can rebuild the transcript, check the cookie again and verify the proof.
//!    Only then does a session exist — and only then may it replace the live session of the
//!    same peer address (a restarted host).
//!
//! An INIT naming a key the server does not hold, or arriving when the session table is full,
//! is answered with REFUSE (after the cookie, so that the answer goes only to an address that
//! receives): the client learns at once instead of after its handshake timeout.
//!
//! Every answer is no longer than the INIT that asked for it (INIT carries room for the
//! cookie), so the server never amplifies a spoofed datagram.
#![forbid(unsafe_code)]

use core::hash::{Hash, Hasher};
use core::time::Duration;

use aws_lc_rs::hmac;
use zerocopy::network_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::time::Time;

/// Label of the server's proof of the key.
pub(crate) const SERVER_PROOF: &[u8] = b"dxpu-v1 server proof";
/// Label of the client's proof of the key.
pub(crate) const CLIENT_PROOF: &[u8] = b"dxpu-v1 client proof";

/// Bytes of a cookie: when it was issued (u64, the server's clock in nanoseconds), then a
/// 16-byte MAC.
pub const COOKIE_LEN: usize = 24;

/// INIT: the client's session ID, nonce, proposed limits, the key it holds and the cookie it
/// echoes (zeros before it has one).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct InitBody {
    pub(crate) client_id: U32,
    pub(crate) nonce: [u8; 16],
    pub(crate) mtu: U16,
    pub(crate) window: U16,
    pub(crate) key_id: [u8; 8],
    /// What the client asks of the session's frames ([`options`]).
    pub(crate) options: u8,
    pub(crate) reserved: u8,
    pub(crate) cookie: [u8; COOKIE_LEN],
}

/// The handshake's option bits: what the session does to its frames. The protections are
/// what either side asks (the server answers with the union; encryption implies
/// authentication); a feature both sides must understand is used only where both ask.
pub(crate) mod options {
    /// Frames carry a MAC tag.
    pub(crate) const AUTHENTICATE: u8 = 1;
    /// DATA frame bodies are encrypted.
    pub(crate) const ENCRYPT: u8 = 2;
    /// ACK and KEEPALIVE frames carry selective acknowledgements (`crate::wire::SackRanges`):
    /// only if both sides ask, so that a peer that does not know them never gets one.
    pub(crate) const SELECTIVE_ACK: u8 = 4;
    /// Every bit this version knows.
    pub(crate) const KNOWN: u8 = AUTHENTICATE | ENCRYPT | SELECTIVE_ACK;
    /// The bits the server may add to what the client asked (the protections).
    pub(crate) const MAY_ADD: u8 = AUTHENTICATE | ENCRYPT;

    /// The options `cfg` asks for.
    pub(crate) fn of(cfg: &crate::Config) -> u8 {
        (if cfg.authenticate_frames { AUTHENTICATE } else { 0 })
            | (if cfg.encrypt_frames { ENCRYPT } else { 0 })
            | (if cfg.selective_ack { SELECTIVE_ACK } else { 0 })
    }

    /// The session's options when one side asks `a` and the other `b`.
    pub(crate) fn negotiated(a: u8, b: u8) -> u8 {
        let o = (a | b) & MAY_ADD | (a & b & SELECTIVE_ACK);
        if o & ENCRYPT != 0 { o | AUTHENTICATE } else { o }
    }

    /// Whether a server's answer `granted` is one the client that asked `asked` may take: it
    /// keeps every protection asked and adds no feature that was not asked.
    pub(crate) fn acceptable(asked: u8, granted: u8) -> bool {
        granted & !KNOWN == 0
            && granted & asked & MAY_ADD == asked & MAY_ADD
            && granted & !MAY_ADD & !asked == 0
    }
}

/// COOKIE: the INIT's nonce (so that only the asker takes it) and the cookie to echo.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct CookieBody {
    pub(crate) nonce: [u8; 16],
    pub(crate) cookie: [u8; COOKIE_LEN],
}

/// CHALLENGE: the server's session ID, nonce, the negotiated limits and its proof.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct ChallengeBody {
    pub(crate) server_id: U32,
    pub(crate) nonce: [u8; 16],
    pub(crate) mtu: U16,
    pub(crate) window: U16,
    /// The session's options: the union of both sides' ([`options::negotiated`]).
    pub(crate) options: u8,
    pub(crate) reserved: u8,
    pub(crate) proof: [u8; 32],
}

/// RESPONSE: the INIT body the CHALLENGE answered, and the client's proof.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct ResponseBody {
    pub(crate) init: InitBody,
    pub(crate) proof: [u8; 32],
}

/// REFUSE: the INIT's nonce and why.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct RefuseBody {
    pub(crate) nonce: [u8; 16],
    pub(crate) reason: u8,
    pub(crate) reserved: [u8; 3],
}

/// Why a server refused a handshake (REFUSE's reason byte).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Refusal {
    /// The server holds no key with the INIT's key ID.
    UnknownKey,
    /// The server has no room for another session.
    Full,
    /// A reason this version does not know.
    Unknown(u8),
}

impl Refusal {
    /// From the reason byte.
    pub const fn from_byte(b: u8) -> Refusal {
        match b {
            1 => Refusal::UnknownKey,
            2 => Refusal::Full,
            other => Refusal::Unknown(other),
        }
    }
    /// The reason byte.
    pub const fn byte(self) -> u8 {
        match self {
            Refusal::UnknownKey => 1,
            Refusal::Full => 2,
            Refusal::Unknown(b) => b,
        }
    }
}

/// The handshake transcript both proofs and the frame keys are computed over: client epoch
/// ‖ INIT body ‖ server epoch ‖ server ID ‖ server nonce ‖ negotiated MTU ‖ negotiated window
/// ‖ negotiated options ‖ reserved.
pub(crate) fn transcript(
    client_epoch: u32,
    init: &InitBody,
    server_epoch: u32,
    challenge: &ChallengeBody,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(4 + size_of::<InitBody>() + 4 + 24);
    t.extend_from_slice(&client_epoch.to_be_bytes());
    t.extend_from_slice(init.as_bytes());
    t.extend_from_slice(&server_epoch.to_be_bytes());
    t.extend_from_slice(&challenge.as_bytes()[..CHALLENGE_FIELDS]);
    t
}

/// The CHALLENGE fields before its proof: server ID, nonce, MTU, window, options, reserved.
const CHALLENGE_FIELDS: usize = size_of::<ChallengeBody>() - 32;

/// Why a cookie was not accepted.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum CookieError {
    /// The INIT carries none (all zeros).
    Missing,
    /// Its MAC does not verify: forged, for another address or INIT, or from an earlier run.
    Forged,
    /// Older than the lifetime (or issued in the future).
    Expired,
}

/// A [`Hasher`] that feeds what it is given to an HMAC: an address of any type that is
/// [`Hash`] binds a cookie without the endpoint knowing its layout. `Hash` is stable within
/// one process, and a cookie's secret lives no longer than that.
struct MacFeed<'a>(&'a mut hmac::Context);

impl Hasher for MacFeed<'_> {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// The server's cookie secret and lifetime.
pub(crate) struct Cookies {
    /// HMAC-SHA-256 under a 64-byte secret drawn at endpoint start.
    secret: hmac::Key,
    lifetime: Duration,
}

impl Cookies {
    /// Cookies under `secret` (random per process), valid for `lifetime` after issue.
    pub(crate) fn new(secret: [u8; 64], lifetime: Duration) -> Cookies {
        Cookies { secret: hmac::Key::new(hmac::HMAC_SHA256, &secret), lifetime }
    }

    fn mac(&self) -> hmac::Context {
        hmac::Context::with_key(&self.secret)
    }

    fn cookie_mac<A: Hash>(&self, from: &A, client_epoch: u32, init: &InitBody, issued: u64) -> [u8; 16] {
        let mut m = self.mac();
        m.update(b"dxpu-v1 cookie");
        from.hash(&mut MacFeed(&mut m));
        m.update(&client_epoch.to_be_bytes());
        // Every INIT field but the cookie itself.
        m.update(&init.as_bytes()[..size_of::<InitBody>() - COOKIE_LEN]);
        m.update(&issued.to_be_bytes());
        let mut out = [0u8; 16];
        out.copy_from_slice(&m.sign().as_ref()[..16]);
        out
    }

    /// A cookie for this INIT from `from`, issued `now`.
    pub(crate) fn issue<A: Hash>(
        &self,
        now: Time,
        from: &A,
        client_epoch: u32,
        init: &InitBody,
    ) -> [u8; COOKIE_LEN] {
        let issued = now.as_nanos();
        let mut c = [0u8; COOKIE_LEN];
        c[..8].copy_from_slice(&issued.to_be_bytes());
        c[8..].copy_from_slice(&self.cookie_mac(from, client_epoch, init, issued));
        c
    }

    /// Checks the cookie INIT echoes; on success, when it was issued.
    pub(crate) fn check<A: Hash>(
        &self,
        now: Time,
        from: &A,
        client_epoch: u32,
        init: &InitBody,
    ) -> Result<Time, CookieError> {
        if init.cookie == [0; COOKIE_LEN] {
            return Err(CookieError::Missing);
        }
        let issued = U64::read_from_bytes(&init.cookie[..8]).map_or(0, |v| v.get());
        let expected = self.cookie_mac(from, client_epoch, init, issued);
        if !crate::auth::equal_in_constant_time(&expected, &init.cookie[8..]) {
            return Err(CookieError::Forged);
        }
        let issued = Time::from_nanos(issued);
        if issued > now || now - issued > self.lifetime {
            return Err(CookieError::Expired);
        }
        Ok(issued)
    }

    /// The server's session ID and nonce for the INIT a valid cookie came with: derived, so
    /// that nothing needs keeping between CHALLENGE and RESPONSE.
    pub(crate) fn server_id_and_nonce(&self, client_epoch: u32, init: &InitBody) -> (u32, [u8; 16]) {
        let mut m = self.mac();
        m.update(b"dxpu-v1 server id and nonce");
        m.update(&client_epoch.to_be_bytes());
        m.update(init.as_bytes());
        let tag = m.sign();
        let full = tag.as_ref();
        let id = u32::from_be_bytes([full[16], full[17], full[18], full[19]]).max(1);
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&full[..16]);
        (id, nonce)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init() -> InitBody {
        InitBody {
            client_id: 7.into(),
            nonce: [3; 16],
            mtu: 1472.into(),
            window: 128.into(),
            key_id: [9; 8],
            options: options::AUTHENTICATE,
            reserved: 0,
            cookie: [0; COOKIE_LEN],
        }
    }

    #[test]
    fn body_sizes_are_the_documented_ones() {
        assert_eq!(size_of::<InitBody>(), 58);
        assert_eq!(size_of::<CookieBody>(), 40);
        assert_eq!(size_of::<ChallengeBody>(), 58);
        assert_eq!(size_of::<ResponseBody>(), 90);
        assert_eq!(size_of::<RefuseBody>(), 20);
        // No answer is longer than the INIT it answers.
        for answer in [size_of::<CookieBody>(), size_of::<ChallengeBody>(), size_of::<RefuseBody>()] {
            assert!(answer <= size_of::<InitBody>());
        }
    }

    #[test]
    fn a_cookie_holds_for_its_address_init_and_lifetime_only() {
        let c = Cookies::new([1; 64], Duration::from_secs(5));
        let t0 = Time::from_nanos(1_000_000_000);
        let mut i = init();
        assert_eq!(c.check(t0, &1u16, 5, &i), Err(CookieError::Missing));
        i.cookie = c.issue(t0, &1u16, 5, &i);
        assert_eq!(c.check(t0, &1u16, 5, &i), Ok(t0));
        assert_eq!(c.check(t0 + Duration::from_secs(5), &1u16, 5, &i), Ok(t0));
        assert_eq!(c.check(t0 + Duration::from_millis(5001), &1u16, 5, &i), Err(CookieError::Expired));
        // Another address, epoch, field or secret: forged.
        assert_eq!(c.check(t0, &2u16, 5, &i), Err(CookieError::Forged));
        assert_eq!(c.check(t0, &1u16, 6, &i), Err(CookieError::Forged));
        let mut other = i;
        other.nonce[0] ^= 1;
        assert_eq!(c.check(t0, &1u16, 5, &other), Err(CookieError::Forged));
        let mut other = i;
        other.cookie[0] ^= 1; // the issue time is covered by the MAC too
        assert_eq!(c.check(t0, &1u16, 5, &other), Err(CookieError::Forged));
        let restarted = Cookies::new([2; 64], Duration::from_secs(5));
        assert_eq!(restarted.check(t0, &1u16, 5, &i), Err(CookieError::Forged));
    }

    #[test]
    fn the_server_id_and_nonce_follow_from_the_cookie() {
        let c = Cookies::new([1; 64], Duration::from_secs(5));
        let mut a = init();
        a.cookie = c.issue(Time::from_nanos(10), &1u8, 5, &a);
        let mut b = init();
        b.cookie = c.issue(Time::from_nanos(11), &1u8, 5, &b);
        assert_eq!(c.server_id_and_nonce(5, &a), c.server_id_and_nonce(5, &a));
        assert_ne!(c.server_id_and_nonce(5, &a), c.server_id_and_nonce(5, &b));
        assert_ne!(c.server_id_and_nonce(5, &a).0, 0);
    }

    #[test]
    fn refusal_reasons_round_trip() {
        for b in 0..=255u8 {
            assert_eq!(Refusal::from_byte(b).byte(), b);
        }
    }

    #[test]
    fn selective_acks_are_used_only_where_both_ask_and_protections_where_either_does() {
        use options::*;
        let (a, e, s) = (AUTHENTICATE, ENCRYPT, SELECTIVE_ACK);
        assert_eq!(negotiated(a | s, a | s), a | s);
        assert_eq!(negotiated(a | s, a), a, "one side without: none");
        // An older server knows only the two protections: its union drops the bit.
        assert_eq!(negotiated(a | s, a) & !s, a);
        assert_eq!(negotiated(e, s), a | e, "encryption implies tags; SACK needs both");
        // What a client may take: every protection it asked, SACK only if asked, no unknown bit.
        assert!(acceptable(a | s, a | s) && acceptable(a | s, a) && acceptable(a, a | e));
        assert!(!acceptable(a, a | s), "granted SACK it did not ask");
        assert!(!acceptable(a | e, a), "dropped the encryption it asked");
        assert!(!acceptable(a, a | 8), "an unknown bit");
    }
}
