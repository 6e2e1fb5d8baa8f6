//! Differential: the `gmac` crate's tag of arbitrary keys, nonces and messages must equal
//! AWS-LC's AES-128-GCM tag of an empty plaintext with the message as associated data.
#![no_main]

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 28 {
        return;
    }
    let key: [u8; 16] = data[..16].try_into().expect("16 bytes");
    let nonce: [u8; 12] = data[16..28].try_into().expect("12 bytes");
    let message = &data[28..];
    let Some(ours) = gmac::Gmac::new(&key) else { return };
    let theirs = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &key).expect("a 16-byte key"));
    let want = theirs
        .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(message), &mut [])
        .expect("a short message");
    assert_eq!(&ours.tag(&nonce, message)[..], want.as_ref());
});
