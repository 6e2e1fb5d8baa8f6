//! The upstream port: where a function sends the TLPs it originates (DMA, MSI-X writes) or
//! answers with (completions). Its own module, below both `function` and `msix`, which send
//! through it.
#![forbid(unsafe_code)]

use tlp::TlpRepr;

/// Where the function sends the TLPs it originates or answers with.
pub trait Upstream {
    /// Sends one TLP towards the host.
    fn send(&mut self, tlp: &TlpRepr<'_>);
}

/// Collects TLPs as bytes (tests, and bridges that queue them).
#[derive(Default, Debug)]
pub struct TlpQueue(pub Vec<Vec<u8>>);

impl Upstream for TlpQueue {
    fn send(&mut self, tlp: &TlpRepr<'_>) {
        let mut b = vec![0u8; tlp.buffer_len()];
        if tlp.emit(&mut b).is_ok() {
            self.0.push(b);
        }
    }
}
