//! What both bridges share above the link: the receive path that routes each TLP by its
//! class ([`dispatch`]) and the bridges' own control protocol ([`attach`]), carried in the
//! session as PCIe vendor-defined messages. `link` moves TLPs and knows none of this.
#![forbid(unsafe_code)]

pub mod attach;
pub mod dispatch;

pub use dispatch::{DispatchStats, Dispatcher, Kept};
