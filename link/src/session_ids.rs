//! Maps keyed by session ID, hashed cheaply. A box looks a session up several times for
//! every frame it receives and once per device per poll; SipHash, the standard map's
//! default, spends about 120 instructions a look-up on a 4-byte key. It is keyed against
//! an attacker who chooses the keys inserted, which no one does here: a session's ID is the
//! box's own, derived from its secret cookie key ([`crate::Endpoint`]), so the IDs in a map
//! are unpredictable and spread evenly already; a forged frame can only make look-ups that
//! fail. One multiplication spreads an ID's low bits over the hash's high ones, and folding
//! the high half back spreads its high bits over the low ones: hashbrown takes the bucket
//! from the low bits and its tag from the top seven, so IDs that differ anywhere land apart
//! in both.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map from session ID to `V`.
pub type SessionMap<V> = HashMap<u32, V, BuildHasherDefault<SessionIdHasher>>;

/// The hasher of [`SessionMap`]: Fibonacci hashing of the ID, its high half folded back.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionIdHasher(u64);

/// 2⁶⁴ / φ, odd: multiplying by it sends consecutive IDs far apart in every bit.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for SessionIdHasher {
    fn write_u32(&mut self, id: u32) {
        self.0 = (self.0 ^ id as u64).wrapping_mul(GOLDEN);
    }

    /// Any other key: its bytes folded in, four at a time (not used by [`SessionMap`]).
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(4) {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            self.write_u32(u32::from_le_bytes(w));
        }
    }

    fn finish(&self) -> u64 {
        // A product's low bits depend on its factors' low bits alone.
        self.0 ^ (self.0 >> 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn ids_land_in_different_buckets_and_tags() {
        let b = BuildHasherDefault::<SessionIdHasher>::default();
        // Consecutive and small IDs, the worst case for a hash of the low bits alone: the
        // low 8 bits (a 256-bucket table) and the top 7 (hashbrown's tag) both vary.
        // IDs differing only in their top byte, the worst case for the product alone (its
        // low bits would be equal), too.
        for ids in [(0u32..256).collect::<Vec<_>>(), (0u32..256).map(|k| k << 24).collect()] {
            let hashes: Vec<u64> = ids.iter().map(|&id| b.hash_one(id)).collect();
            let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0xff).collect();
            let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
            assert!(low.len() > 128, "{} distinct low bytes of 256", low.len());
            assert!(top.len() > 64, "{} distinct tags of 128", top.len());
        }
        assert_ne!(b.hash_one(0u32), b.hash_one(u32::MAX));
    }

    #[test]
    fn a_map_finds_what_it_holds_and_nothing_else() {
        let mut m = SessionMap::default();
        for id in [0u32, 1, 0xdead_beef, u32::MAX] {
            m.insert(id, id ^ 1);
        }
        for id in [0u32, 1, 0xdead_beef, u32::MAX] {
            assert_eq!(m.get(&id), Some(&(id ^ 1)));
        }
        assert_eq!(m.get(&2), None);
    }
}
