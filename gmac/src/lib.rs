//! AES-128-GMAC — AES-GCM over an empty plaintext, the message as associated data (NIST
//! SP 800-38D) — computed with the CPU's AES rounds (AES-NI) and carry-less multiply
//! (PCLMULQDQ), for the short messages whose tag cost is dominated by fixed overhead in a
//! general-purpose AEAD library.
//!
//! Why it exists: dxpu's link tags every frame, and a register read's round trip carries four
//! small frames (a request and its completion, each sealed once and verified once). Through
//! AWS-LC's AEAD interface an 84-byte frame's tag costs 92 ns on the development machine,
//! whatever its length below a few hundred bytes; here 30 ns (`cargo bench -p dxpu-gmac`).
//! Above about 600 bytes AWS-LC's 512-bit GHASH is faster; the link uses this crate below a
//! length threshold and AWS-LC above it, with the same tags.
//!
//! How: GHASH is evaluated in the bit-reflected representation of Intel's white paper
//! (Gueron & Kounavis, "Intel Carry-Less Multiplication Instruction and its Usage for
//! Computing the GCM Mode", rev. 2.02, 2014: blocks byte-swapped, products shifted left by
//! one, reduction by shifts and XORs) with aggregated reduction: up to eight blocks are
//! multiplied by H⁸…H¹ and summed before one reduction, so their multiplications overlap.
//! The tag is `GHASH_H(A ∥ 0-pad ∥ [len(A)]₆₄ ∥ [0]₆₄) ⊕ AES_K(IV ∥ 0³¹1)`.
//!
//! `unsafe` here only calls the `#[target_feature]` functions once [`Gmac::new`] has seen the
//! CPU features at run time; a [`Gmac`] exists only on a CPU that has them. Everything is
//! constant-time in the key and the data (no table lookups, no data-dependent branches but
//! the message length).
#![cfg_attr(not(target_arch = "x86_64"), forbid(unsafe_code))]

/// Blocks multiplied before one reduction (the powers of H kept).
#[cfg(target_arch = "x86_64")]
const AGGREGATE: usize = 8;

/// An AES-128-GMAC key: the expanded AES key and the powers H¹…H⁸ of the hash key.
#[derive(Clone)]
pub struct Gmac {
    #[cfg(target_arch = "x86_64")]
    inner: x86::Key,
    #[cfg(not(target_arch = "x86_64"))]
    _never: std::convert::Infallible,
}

impl Gmac {
    /// The key `key`, or `None` where the CPU lacks AES-NI, PCLMULQDQ or SSSE3 (or is not
    /// x86-64): the caller then computes the same tags another way.
    pub fn new(key: &[u8; 16]) -> Option<Gmac> {
        #[cfg(target_arch = "x86_64")]
        {
            if !(std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
                && std::arch::is_x86_feature_detected!("ssse3"))
            {
                return None;
            }
            // SAFETY: the CPU has every feature `x86::Key::new` enables (checked above).
            Some(Gmac { inner: unsafe { x86::Key::new(key) } })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = key;
            None
        }
    }

    /// The 16-byte tag of `message` under the 96-bit `nonce`: what AES-128-GCM returns for an
    /// empty plaintext with `message` as the associated data. A nonce must never repeat
    /// under one key.
    pub fn tag(&self, nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: a `Gmac` is only made by `new`, after it saw the CPU features that
            // `x86::Key::tag` enables.
            unsafe { self.inner.tag(nonce, message) }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (nonce, message);
            let never: std::convert::Infallible = self._never;
            match never {}
        }
    }
}

impl std::fmt::Debug for Gmac {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gmac(<AES-128>)")
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, _mm_aesenc_si128, _mm_aesenclast_si128, _mm_aeskeygenassist_si128, _mm_clmulepi64_si128,
        _mm_cvtsi128_si64, _mm_or_si128, _mm_set_epi8, _mm_set_epi64x, _mm_setzero_si128, _mm_shuffle_epi8,
        _mm_shuffle_epi32, _mm_slli_epi32, _mm_slli_si128, _mm_srli_epi32, _mm_srli_si128, _mm_xor_si128,
    };

    use super::AGGREGATE;

    /// The expanded AES-128 key and H¹…H⁸ in the reflected representation, as bytes (loaded
    /// into registers per tag: from L1, a load each).
    #[derive(Clone)]
    pub(crate) struct Key {
        round_keys: [[u8; 16]; 11],
        h_powers: [[u8; 16]; AGGREGATE],
    }

    impl Drop for Key {
        fn drop(&mut self) {
            // Key material does not outlive the key (best effort: no volatile writes).
            self.round_keys = [[0; 16]; 11];
            self.h_powers = [[0; 16]; AGGREGATE];
            std::hint::black_box(&self.round_keys);
            std::hint::black_box(&self.h_powers);
        }
    }

    /// A block from 16 bytes (unaligned, no pointer cast).
    #[target_feature(enable = "sse2")]
    fn load(b: &[u8; 16]) -> __m128i {
        let lo = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        let hi = u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]);
        _mm_set_epi64x(hi as i64, lo as i64)
    }

    #[target_feature(enable = "sse2")]
    fn store(x: __m128i) -> [u8; 16] {
        let lo = _mm_cvtsi128_si64(x) as u64;
        let hi = _mm_cvtsi128_si64(_mm_srli_si128::<8>(x)) as u64;
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&lo.to_le_bytes());
        out[8..].copy_from_slice(&hi.to_le_bytes());
        out
    }

    /// Byte order reversed: GCM's big-endian blocks into the reflected representation.
    #[target_feature(enable = "ssse3")]
    fn byte_swap(x: __m128i) -> __m128i {
        _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15))
    }

    #[target_feature(enable = "aes")]
    fn expand(key: &[u8; 16]) -> [__m128i; 11] {
        // FIPS 197 §5.2 with AESKEYGENASSIST (Intel AES-NI white paper, fig. 19).
        #[target_feature(enable = "sse2")]
        fn next(k: __m128i, assist: __m128i) -> __m128i {
            let t = _mm_shuffle_epi32::<0xff>(assist);
            let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
            let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
            let k = _mm_xor_si128(k, _mm_slli_si128::<4>(k));
            _mm_xor_si128(k, t)
        }
        let mut rk = [_mm_setzero_si128(); 11];
        rk[0] = load(key);
        rk[1] = next(rk[0], _mm_aeskeygenassist_si128::<0x01>(rk[0]));
        rk[2] = next(rk[1], _mm_aeskeygenassist_si128::<0x02>(rk[1]));
        rk[3] = next(rk[2], _mm_aeskeygenassist_si128::<0x04>(rk[2]));
        rk[4] = next(rk[3], _mm_aeskeygenassist_si128::<0x08>(rk[3]));
        rk[5] = next(rk[4], _mm_aeskeygenassist_si128::<0x10>(rk[4]));
        rk[6] = next(rk[5], _mm_aeskeygenassist_si128::<0x20>(rk[5]));
        rk[7] = next(rk[6], _mm_aeskeygenassist_si128::<0x40>(rk[6]));
        rk[8] = next(rk[7], _mm_aeskeygenassist_si128::<0x80>(rk[7]));
        rk[9] = next(rk[8], _mm_aeskeygenassist_si128::<0x1b>(rk[8]));
        rk[10] = next(rk[9], _mm_aeskeygenassist_si128::<0x36>(rk[9]));
        rk
    }

    #[target_feature(enable = "aes")]
    fn encrypt(rk: &[[u8; 16]; 11], block: __m128i) -> __m128i {
        let mut x = _mm_xor_si128(block, load(&rk[0]));
        for k in &rk[1..10] {
            x = _mm_aesenc_si128(x, load(k));
        }
        _mm_aesenclast_si128(x, load(&rk[10]))
    }

    /// The 256-bit carry-less product of two reflected elements, unreduced: (low, high).
    #[target_feature(enable = "pclmulqdq")]
    fn multiply(a: __m128i, b: __m128i) -> (__m128i, __m128i) {
        let low = _mm_clmulepi64_si128::<0x00>(a, b);
        let high = _mm_clmulepi64_si128::<0x11>(a, b);
        let mid = _mm_xor_si128(_mm_clmulepi64_si128::<0x10>(a, b), _mm_clmulepi64_si128::<0x01>(a, b));
        (_mm_xor_si128(low, _mm_slli_si128::<8>(mid)), _mm_xor_si128(high, _mm_srli_si128::<8>(mid)))
    }

    /// A (sum of) product(s) reduced modulo x¹²⁸ + x⁷ + x² + x + 1, after the one-bit shift
    /// the reflected representation needs (the white paper's algorithms 4 and 5).
    #[target_feature(enable = "sse2")]
    fn reduce(low: __m128i, high: __m128i) -> __m128i {
        let carry_low = _mm_srli_epi32::<31>(low);
        let carry_high = _mm_srli_epi32::<31>(high);
        let mut low = _mm_or_si128(_mm_slli_epi32::<1>(low), _mm_slli_si128::<4>(carry_low));
        let high = _mm_or_si128(
            _mm_or_si128(_mm_slli_epi32::<1>(high), _mm_slli_si128::<4>(carry_high)),
            _mm_srli_si128::<12>(carry_low),
        );
        let a = _mm_xor_si128(
            _mm_xor_si128(_mm_slli_epi32::<31>(low), _mm_slli_epi32::<30>(low)),
            _mm_slli_epi32::<25>(low),
        );
        low = _mm_xor_si128(low, _mm_slli_si128::<12>(a));
        let b = _mm_xor_si128(
            _mm_xor_si128(_mm_srli_epi32::<1>(low), _mm_srli_epi32::<2>(low)),
            _mm_xor_si128(_mm_srli_epi32::<7>(low), _mm_srli_si128::<4>(a)),
        );
        _mm_xor_si128(high, _mm_xor_si128(low, b))
    }

    impl Key {
        #[target_feature(enable = "aes,pclmulqdq,ssse3")]
        pub(crate) fn new(key: &[u8; 16]) -> Key {
            let round_keys = expand(key).map(|k| store(k));
            let h = byte_swap(encrypt(&round_keys, _mm_setzero_si128()));
            let mut power = h;
            let mut h_powers = [[0u8; 16]; AGGREGATE];
            for p in &mut h_powers {
                *p = store(power);
                let (low, high) = multiply(power, h);
                power = reduce(low, high);
            }
            Key { round_keys, h_powers }
        }

        #[target_feature(enable = "aes,pclmulqdq,ssse3")]
        pub(crate) fn tag(&self, nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
            let mut j0 = [0u8; 16];
            j0[..12].copy_from_slice(nonce);
            j0[15] = 1;
            // Independent of the hash: the AES rounds overlap the multiplications.
            let mask = encrypt(&self.round_keys, load(&j0));
            let (full, rest) = message.as_chunks::<16>();
            let mut last = [0u8; 16];
            last[..rest.len()].copy_from_slice(rest);
            let mut length = [0u8; 16];
            length[..8].copy_from_slice(&((message.len() as u64) * 8).to_be_bytes());
            // The blocks: the message's, its zero-padded tail, the length block.
            let blocks = full.len() + usize::from(!rest.is_empty()) + 1;
            let block = |i: usize| -> __m128i {
                let b = match full.get(i) {
                    Some(b) => b,
                    None if i + 1 < blocks => &last,
                    None => &length,
                };
                byte_swap(load(b))
            };
            let mut acc = _mm_setzero_si128();
            let mut i = 0;
            while i < blocks {
                // Y ← (Y ⊕ X₁)·Hⁿ ⊕ X₂·Hⁿ⁻¹ ⊕ … ⊕ Xₙ·H¹, reduced once.
                let n = (blocks - i).min(AGGREGATE);
                let (mut low, mut high) = multiply(_mm_xor_si128(block(i), acc), load(&self.h_powers[n - 1]));
                for j in 1..n {
                    let (l, h) = multiply(block(i + j), load(&self.h_powers[n - 1 - j]));
                    low = _mm_xor_si128(low, l);
                    high = _mm_xor_si128(high, h);
                }
                acc = reduce(low, high);
                i += n;
            }
            store(_mm_xor_si128(byte_swap(acc), mask))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The key, or `None` (saying why the test is skipped) on a CPU without the features.
    fn key_or_skip(key: &[u8; 16]) -> Option<Gmac> {
        let k = Gmac::new(key);
        if k.is_none() {
            eprintln!("skipped: this CPU lacks AES-NI, PCLMULQDQ or SSSE3 (the link uses AWS-LC alone)");
        }
        k
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap_or(0)).collect()
    }

    fn aws_lc(key: &[u8; 16], nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
        let Ok(k) = UnboundKey::new(&AES_128_GCM, key) else { return [0; 16] };
        let t = LessSafeKey::new(k)
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(message), &mut [])
            .map(|t| t.as_ref().to_vec())
            .unwrap_or_default();
        let mut out = [0u8; 16];
        out.copy_from_slice(&t);
        out
    }

    fn rust_crypto(key: &[u8; 16], nonce: &[u8; 12], message: &[u8]) -> [u8; 16] {
        use aes_gcm::aead::{AeadInOut, KeyInit};
        let cipher = aes_gcm::Aes128Gcm::new(key.into());
        let tag = cipher.encrypt_inout_detached(nonce.into(), message, (&mut [][..]).into());
        let mut out = [0u8; 16];
        if let Ok(t) = tag {
            out.copy_from_slice(&t);
        }
        out
    }

    #[test]
    fn known_answers() {
        let Some(zero) = key_or_skip(&[0; 16]) else { return };
        // McGrew & Viega, "The Galois/Counter Mode of Operation", test case 1: K = 0, IV = 0,
        // nothing to authenticate.
        assert_eq!(zero.tag(&[0; 12], &[]).to_vec(), hex("58e2fccefa7e3061367f1d57a4e7455a"));
        // NIST CAVS gcmEncryptExtIV128, Keylen 128, IVlen 96, PTlen 0, AADlen 128, count 0.
        let key: [u8; 16] = hex("77be63708971c4e240d1cb79e8d77feb").try_into().unwrap_or([0; 16]);
        let nonce: [u8; 12] = hex("e0e00f19fed7ba0136a797f3").try_into().unwrap_or([0; 12]);
        let Some(k) = Gmac::new(&key) else { return };
        assert_eq!(
            k.tag(&nonce, &hex("7a43ec1d9c0a5a78a0b16533a6213cab")).to_vec(),
            hex("209fcc8d3675ed938e9c7166709dd946")
        );
    }

    #[test]
    fn every_length_to_past_an_mtu_matches_aws_lc() {
        let key = [0x42u8; 16];
        let nonce = [7u8; 12];
        let Some(k) = key_or_skip(&key) else { return };
        // Every split of the aggregation (multiples of 8 blocks and around them), partial
        // tails of every size.
        for len in 0..=1600 {
            let m: Vec<u8> = (0..len).map(|i| (i * 31 + len * 7) as u8).collect();
            assert_eq!(k.tag(&nonce, &m), aws_lc(&key, &nonce, &m), "length {len}");
        }
    }

    proptest! {
        #[test]
        fn random_keys_nonces_and_messages_match_both_libraries(
            key in any::<[u8; 16]>(),
            nonce in any::<[u8; 12]>(),
            message in proptest::collection::vec(any::<u8>(), 0..700),
        ) {
            if let Some(k) = Gmac::new(&key) {
                let t = k.tag(&nonce, &message);
                prop_assert_eq!(t, aws_lc(&key, &nonce, &message));
                prop_assert_eq!(t, rust_crypto(&key, &nonce, &message));
            }
        }
    }

    #[test]
    fn a_changed_bit_changes_the_tag() {
        let Some(k) = key_or_skip(&[9; 16]) else { return };
        let m = vec![0x5au8; 84];
        let t = k.tag(&[1; 12], &m);
        for bit in 0..m.len() * 8 {
            let mut c = m.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(k.tag(&[1; 12], &c), t, "bit {bit}");
        }
        assert_ne!(k.tag(&[2; 12], &m), t, "another nonce");
    }
}
