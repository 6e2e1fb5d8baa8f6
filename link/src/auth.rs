//! Authentication: the pre-shared key never crosses the wire. The handshake proves knowledge
//! of it with HMAC-SHA-256 over both sides' nonces and the negotiated parameters (the
//! transcript); the per-direction frame keys come from HKDF-SHA-256 over the key with the
//! transcript as salt. Every frame after the handshake carries an AES-128-GMAC tag (or, in a
//! session that encrypts, an AES-128-GCM one) under its direction's key, with the frame's
//! packet number as the nonce (unique per key: it grows with every frame sent).
//!
//! One crypto library does all of it: AWS-LC (HMAC, HKDF, AES-GCM, the constant-time
//! compare, the OS's random bytes); [`gmac`] only computes the short frames' tags faster.
#![forbid(unsafe_code)]

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use aws_lc_rs::{constant_time, hkdf, hmac};

use crate::wire::TAG_LEN;

/// HMAC-SHA-256 of `parts` under `key`.
pub(crate) fn hmac_sha256(key: &hmac::Key, parts: &[&[u8]]) -> [u8; 32] {
    let mut c = hmac::Context::with_key(key);
    for p in parts {
        c.update(p);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(c.sign().as_ref());
    out
}

/// `a == b`, in time that does not depend on where they differ.
pub(crate) fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    constant_time::verify_slices_are_equal(a, b).is_ok()
}

/// An HKDF output length (AWS-LC asks for it as a type).
struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// A pre-shared key: at least 16 bytes.
#[derive(Clone)]
pub struct PresharedKey {
    bytes: Vec<u8>,
    key: hmac::Key,
}

impl PartialEq for PresharedKey {
    fn eq(&self, other: &PresharedKey) -> bool {
        equal_in_constant_time(&self.bytes, &other.bytes)
    }
}

impl Eq for PresharedKey {}

impl PresharedKey {
    /// The key, if it is at least 16 bytes long.
    pub fn new(bytes: &[u8]) -> Option<PresharedKey> {
        (bytes.len() >= 16)
            .then(|| PresharedKey { bytes: bytes.to_vec(), key: hmac::Key::new(hmac::HMAC_SHA256, bytes) })
    }
    /// A proof of the key over `transcript`, for the role named by `label`.
    pub fn proof(&self, label: &[u8], transcript: &[u8]) -> [u8; 32] {
        hmac_sha256(&self.key, &[label, transcript])
    }
    /// Checks a proof in constant time.
    pub fn verify(&self, label: &[u8], transcript: &[u8], proof: &[u8]) -> bool {
        equal_in_constant_time(&self.proof(label, transcript), proof)
    }
    /// The key's identifier: the first 8 bytes of HMAC-SHA-256(K, `"dxpu-v1 key id"`). A
    /// client names its key with it in INIT so that a server holding several keys (one per
    /// host) proves the right one; it reveals nothing of the key.
    pub fn key_id(&self) -> [u8; 8] {
        let mut id = [0u8; 8];
        id.copy_from_slice(&hmac_sha256(&self.key, &[b"dxpu-v1 key id"])[..8]);
        id
    }
    /// The frame keys for client→server and server→client: HKDF-SHA-256 with the transcript
    /// as salt and the key as input keying material, expanded with `"dxpu-v2 client to
    /// server"` and `"dxpu-v2 server to client"`, 16 bytes each.
    pub fn frame_keys(&self, transcript: &[u8]) -> (FrameKey, FrameKey) {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, transcript).extract(&self.bytes);
        let expand = |info: &[u8]| {
            let mut k = [0u8; 16];
            // 16 bytes is far below HKDF's limit of 255 hash lengths: this cannot fail.
            if let Ok(okm) = prk.expand(&[info], Len(16)) {
                let _ = okm.fill(&mut k);
            }
            FrameKey::new(&k)
        };
        (expand(b"dxpu-v2 client to server"), expand(b"dxpu-v2 server to client"))
    }
}

impl std::fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PresharedKey(<{} bytes>)", self.bytes.len())
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
        let full = hmac_sha256(&hmac::Key::new(hmac::HMAC_SHA256, &self.secret), &[b"dxpu-v1 key update"]);
        let mut k = [0u8; 16];
        k.copy_from_slice(&full[..16]);
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
        self.aws_lc.is_some() && equal_in_constant_time(&self.tag(frame), tag)
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
    key: hmac::Key,
    counter: u64,
    buf: [u8; 32],
    used: usize,
}

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: [u8; 32]) -> Rng {
        Rng { key: hmac::Key::new(hmac::HMAC_SHA256, &seed), counter: 0, buf: [0; 32], used: 32 }
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
                self.buf = hmac_sha256(&self.key, &[&self.counter.to_le_bytes()]);
                self.counter += 1;
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
