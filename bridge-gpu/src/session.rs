//! What the box knows of a host's session: who it is, the device it holds, since when; and
//! how a control message goes back to it.

use bridge::attach::Control;
use link::Session;

use crate::export::BOX_ROOT;

/// A session's host, its device (an index into the exports) and since when it is up.
pub(crate) struct SessionInfo {
    pub(crate) host: String,
    pub(crate) device: Option<usize>,
    pub(crate) since: std::time::SystemTime,
}

/// A control message to the host of `s`.
pub(crate) fn reply(s: &mut Session, c: Control) {
    let _ = s.send_tlp(&c.to_tlp(BOX_ROOT));
}
