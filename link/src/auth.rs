//! Authentication: the pre-shared key never crosses the wire. The handshake proves knowledge
//! of it with HMAC-SHA-256 over both sides' nonces and the negotiated parameters (the
//! transcript); the per-direction frame keys are derived from it the same way. Every frame
//! after the handshake carries an AES-128-GMAC tag under its direction's key, with the
//! frame's packet number as the nonce (unique per key: it grows with every frame sent).
#![forbid(unsafe_code)]

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::wire::TAG_LEN;

type HmacSha256 = Hmac<Sha256>;

/// A pre-shared key: at least 16 bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct PresharedKey(Vec<u8>);

impl PresharedKey {
    /// The key, if it is at least 16 bytes long.
    pub fn new(bytes: &[u8]) -> Option<PresharedKey> {
        (bytes.len() >= 16).then(|| PresharedKey(bytes.to_vec()))
    }
    fn hmac(&self, label: &[u8], transcript: &[u8]) -> [u8; 32] {
        // HMAC accepts keys of any length; 16+ bytes is checked at construction.
        let mut m = match <HmacSha256 as KeyInit>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => return [0; 32],
        };
        m.update(label);
        m.update(transcript);
        m.finalize().into_bytes().into()
    }
    /// A proof of the key over `transcript`, for the role named by `label`.
    pub fn proof(&self, label: &[u8], transcript: &[u8]) -> [u8; 32] {
        self.hmac(label, transcript)
    }
    /// Checks a proof in constant time.
    pub fn verify(&self, label: &[u8], transcript: &[u8], proof: &[u8]) -> bool {
        let expected = self.hmac(label, transcript);
        proof.len() == 32 && expected.iter().zip(proof).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
    /// The key's identifier: the first 8 bytes of HMAC-SHA-256(K, `"dxpu-v1 key id"`). A
    /// client names its key with it in INIT so that a server holding several keys (one per
    /// host) proves the right one; it reveals nothing of the key.
    pub fn key_id(&self) -> [u8; 8] {
        let mut id = [0u8; 8];
        id.copy_from_slice(&self.hmac(b"dxpu-v1 key id", &[])[..8]);
        id
    }
    /// The frame keys for client→server and server→client.
    pub fn frame_keys(&self, transcript: &[u8]) -> (FrameKey, FrameKey) {
        let k = self.hmac(b"dxpu-v1 frame keys", transcript);
        let mut c2s = [0u8; 16];
        let mut s2c = [0u8; 16];
        c2s.copy_from_slice(&k[..16]);
        s2c.copy_from_slice(&k[16..]);
        (FrameKey::new(&c2s), FrameKey::new(&s2c))
    }
}

impl std::fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PresharedKey(<{} bytes>)", self.0.len())
    }
}

/// Frames up to this many bytes are tagged by [`gmac`] where the CPU allows, longer ones by
/// AWS-LC: each is the faster at those lengths (`cargo bench -p dxpu-gmac --bench tag` on
/// the development machine: 30 against 91 ns at 84 bytes, 66 against 78 at 256, 133 against
/// 145 at 600, 308 against 183 at 1472). The tags are the same either way.
const SHORT_FRAME: usize = 512;

/// A per-direction frame key: AES-128-GMAC (AES-GCM over an empty plaintext with the frame
/// as associated data). Short frames — a register access and its completion — go through
/// [`gmac`], AES-NI and carry-less multiplies with nothing around them; longer ones through
/// AWS-LC, whose GHASH uses the CPU's widest carry-less multiply (VPCLMULQDQ on 512-bit
/// registers where there is one), 2.1× faster per 1472-byte frame than the RustCrypto
/// `aes-gcm` it replaced on this machine (173 against 366 ns), with the same tags.
///
/// `aws_lc` is `None` only if AWS-LC refused the key, which it does for lengths other than
/// 16 bytes: such a key would tag nothing (zeros) and verify nothing.
pub struct FrameKey {
    aws_lc: Option<LessSafeKey>,
    short: Option<gmac::Gmac>,
    /// The key itself, from which the next one is derived at a key update.
    secret: [u8; 16],
}

/// The frame's packet number (header bytes 12..20) as an AES-GCM nonce: pn ‖ 0000, unique per
/// key since the packet number grows with every frame sent.
fn nonce_of(frame: &[u8]) -> [u8; 12] {
    let mut nonce = [0u8; 12];
    if let Some(pn) = frame.get(12..20) {
        nonce[..8].copy_from_slice(pn);
    }
    nonce
}

impl FrameKey {
    pub(crate) fn new(key: &[u8; 16]) -> FrameKey {
        let aws_lc = UnboundKey::new(&AES_128_GCM, key).ok().map(LessSafeKey::new);
        let short = aws_lc.as_ref().and_then(|_| gmac::Gmac::new(key));
        FrameKey { aws_lc, short, secret: *key }
    }

    /// The key that follows this one at a key update (docs/wire-protocol.md, *Key update*):
    /// the first 16 bytes of HMAC-SHA-256(this key, `"dxpu-v1 key update"`).
    pub fn next(&self) -> FrameKey {
        let mut k = [0u8; 16];
        if let Ok(mut m) = <HmacSha256 as KeyInit>::new_from_slice(&self.secret) {
            m.update(b"dxpu-v1 key update");
            let full: [u8; 32] = m.finalize().into_bytes().into();
            k.copy_from_slice(&full[..16]);
        }
        FrameKey::new(&k)
    }

    /// Encrypts `frame[body_at..]` in place (AES-128-GCM; the bytes before `body_at` — header
    /// and FC block — are associated data) and returns the tag. The nonce is the frame's packet
    /// number. A zero tag if AWS-LC refused the key (it verifies nothing then either).
    pub fn seal(&self, frame: &mut [u8], body_at: usize) -> [u8; TAG_LEN] {
        let mut tag = [0u8; TAG_LEN];
        let nonce = nonce_of(frame);
        let Some(key) = &self.aws_lc else { return tag };
        let Some((aad, body)) = frame.split_at_mut_checked(body_at) else { return tag };
        // Only inputs over 2^36 bytes fail; a frame is at most 64 KiB.
        if let Ok(t) =
            key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&*aad), body)
        {
            tag.copy_from_slice(t.as_ref());
        }
        tag
    }

    /// Verifies and decrypts in place `frame[body_at..]`, which is the ciphertext followed by
    /// its tag (the frame up to its CRC). The plaintext's length, or `None` if the tag does
    /// not verify (the bytes are then unspecified).
    pub fn open(&self, frame: &mut [u8], body_at: usize) -> Option<usize> {
        let nonce = nonce_of(frame);
        let key = self.aws_lc.as_ref()?;
        let (aad, in_out) = frame.split_at_mut_checked(body_at)?;
        key.open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(&*aad), in_out).ok().map(|p| p.len())
    }
    /// The tag of a frame's authenticated bytes. The nonce is the frame's packet number
    /// (header bytes 12..20), so no two frames under one key share it.
    pub fn tag(&self, frame: &[u8]) -> [u8; TAG_LEN] {
        let nonce = nonce_of(frame);
        if frame.len() <= SHORT_FRAME
            && let Some(short) = &self.short
        {
            return short.tag(&nonce, frame);
        }
        let mut tag = [0u8; TAG_LEN];
        let Some(key) = &self.aws_lc else { return tag };
        // Only inputs over 2^36 bytes fail; a frame is at most 64 KiB.
        if let Ok(t) =
            key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(frame), &mut [])
        {
            tag.copy_from_slice(t.as_ref());
        }
        tag
    }
    /// Checks a tag in constant time.
    pub fn verify(&self, frame: &[u8], tag: &[u8; TAG_LEN]) -> bool {
        let t = self.tag(frame);
        self.aws_lc.is_some() && t.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Debug for FrameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FrameKey(<AES-128-GMAC>)")
    }
}

/// A deterministic random generator: HMAC-SHA-256 of a counter under a 32-byte seed. Seeded
/// from the OS in production, from a test's seed in simulation.
#[derive(Clone)]
pub struct Rng {
    key: [u8; 32],
    counter: u64,
    buf: [u8; 32],
    used: usize,
}

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: [u8; 32]) -> Rng {
        Rng { key: seed, counter: 0, buf: [0; 32], used: 32 }
    }
    /// A generator seeded with a small integer (tests, simulations).
    pub fn from_u64(seed: u64) -> Rng {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&seed.to_le_bytes());
        Rng::new(k)
    }
    /// Fills `out` with random bytes.
    pub fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            if self.used == 32 {
                let mut m = match <HmacSha256 as KeyInit>::new_from_slice(&self.key) {
                    Ok(m) => m,
                    Err(_) => return,
                };
                m.update(&self.counter.to_le_bytes());
                self.counter += 1;
                self.buf = m.finalize().into_bytes().into();
                self.used = 0;
            }
            *b = self.buf[self.used];
            self.used += 1;
        }
    }
    /// A random u32.
    pub fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill(&mut b);
        u32::from_le_bytes(b)
    }
    /// A random non-zero u32 (session IDs and epochs).
    pub fn nonzero_u32(&mut self) -> u32 {
        loop {
            let v = self.u32();
            if v != 0 {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_need_the_key() {
        let k = PresharedKey::new(b"0123456789abcdef").unwrap();
        let other = PresharedKey::new(b"0123456789abcdeX").unwrap();
        let p = k.proof(b"server", b"transcript");
        assert!(k.verify(b"server", b"transcript", &p));
        assert!(!other.verify(b"server", b"transcript", &p));
        assert!(!k.verify(b"client", b"transcript", &p));
        assert!(!k.verify(b"server", b"transcripT", &p));
        assert!(PresharedKey::new(b"short").is_none());
        let (a, b) = k.frame_keys(b"t");
        let frame = [7u8; 40];
        assert_ne!(a.tag(&frame), b.tag(&frame));
        assert!(a.verify(&frame, &a.tag(&frame)));
        let mut other = frame;
        other[30] ^= 1;
        assert!(!a.verify(&other, &a.tag(&frame)));
        // The packet number is the nonce: the same bytes under another number differ.
        let mut next = frame;
        next[19] ^= 1;
        assert_ne!(a.tag(&next), a.tag(&frame));
    }

    /// AES-128-GMAC as RustCrypto's `aes-gcm` computes it, over frames of every length from
    /// empty to past a jumbo MTU: the tags on the wire do not depend on the implementation.
    #[test]
    fn frame_tags_match_an_independent_gmac() {
        use aes_gcm::aead::{AeadInOut, Nonce};
        use aes_gcm::{Aes128Gcm, KeyInit as _};
        let key: [u8; 16] = *b"frame-key-16byte";
        let ours = FrameKey::new(&key);
        let reference = Aes128Gcm::new(&key.into());
        let mut rng = Rng::from_u64(9);
        // Both implementations: short frames and long ones, around the threshold.
        for len in
            (0..200).chain(SHORT_FRAME - 2..SHORT_FRAME + 3).chain([1471, 1472, 1473, 8999, 9000, 65507])
        {
            let mut frame = vec![0u8; len];
            rng.fill(&mut frame);
            let mut nonce = Nonce::<Aes128Gcm>::default();
            if let Some(pn) = frame.get(12..20) {
                nonce[..8].copy_from_slice(pn);
            }
            let want: [u8; TAG_LEN] =
                reference.encrypt_inout_detached(&nonce, &frame, (&mut [][..]).into()).unwrap().into();
            assert_eq!(ours.tag(&frame), want, "frame of {len} bytes");
            assert!(ours.verify(&frame, &want));
        }
    }

    #[test]
    fn rng_is_deterministic_per_seed() {
        let mut a = Rng::from_u64(1);
        let mut b = Rng::from_u64(1);
        let mut c = Rng::from_u64(2);
        let (x, y, z) = (a.u32(), b.u32(), c.u32());
        assert_eq!(x, y);
        assert_ne!(x, z);
    }
}
