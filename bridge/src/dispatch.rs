//! The one receive path both bridges use. A session hands each TLP of a frame to a sink
//! where it lies in the receive buffer ([`link::InPlace`]); [`Dispatcher::route`] is that
//! sink. It parses the TLP once and routes it by its flow-control class:
//!
//! - **posted requests** (MWr, messages) and **completions** go to the bridge's handler at
//!   once, their payload copied once, into place (host memory, a BAR, the waiting read);
//! - **non-posted requests** (MRd, config, IO, AtomicOps) need the session to answer, which
//!   the sink cannot reach while the session is busy with the datagram: they are kept,
//!   parsed, with their few payload bytes, and the bridge answers them after the poll
//!   ([`Dispatcher::drain`]). What follows them in the frame is still taken in place — a
//!   posted write may pass a read (PCIe 6.0 §2.4.1), and a completion may pass a
//!   non-posted request;
//! - the bridges' **control messages** ([`crate::attach`]) are kept beside the requests, in
//!   the order they came, since they act on the session too.
//!
//! A TLP that does not parse is counted and dropped: a malformed TLP is the transmitter's
//! error, and nothing behind it depends on it (PCIe 6.0 §2.3.1).
#![forbid(unsafe_code)]

use tlp::{FcClass, ParseConfig, TlpRepr};

use crate::attach::{Control, ControlError};

/// The most payload a non-posted request carries: a CAS's two 128-bit operands.
const MAX_REQUEST_DATA: usize = 32;

/// What arrived, for the bridge to handle after the poll.
#[derive(Debug, PartialEq)]
pub enum Kept<'a> {
    /// A non-posted request, to answer.
    Request(TlpRepr<'a>),
    /// A control message of the attach protocol.
    Control(Control),
    /// A TLP that claimed to be a control message and is not a valid one.
    BadControl(ControlError),
}

/// One kept item: a request without its payload (held beside it), or a control message.
#[derive(Debug)]
enum Item {
    Request(TlpRepr<'static>, [u8; MAX_REQUEST_DATA], usize),
    Control(Control),
    BadControl(ControlError),
}

/// Counts of what the dispatcher dropped, and the largest TLPs it saw: what the peer sent
/// against the Max_Payload_Size and Max_Read_Request_Size it was given.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// TLPs that did not parse.
    pub malformed: u64,
    /// The largest data payload of a TLP that parsed, in bytes.
    pub largest_payload: u32,
    /// The largest memory read request that parsed, in bytes.
    pub largest_read_request: u32,
}

/// Routes received TLPs by class (see the module's description). `L` labels each TLP with
/// where it came from — the session, on the box, which serves many.
#[derive(Debug)]
pub struct Dispatcher<L> {
    kept: Vec<(L, Item)>,
    parse: ParseConfig,
    stats: DispatchStats,
}

impl<L: Copy> Default for Dispatcher<L> {
    fn default() -> Self {
        Dispatcher::new()
    }
}

impl<L: Copy> Dispatcher<L> {
    /// Nothing kept yet.
    pub fn new() -> Dispatcher<L> {
        Dispatcher { kept: Vec::new(), parse: ParseConfig::default(), stats: DispatchStats::default() }
    }

    /// Routes one TLP from the receive buffer: `now` gets a posted request or a completion
    /// where it lies; anything else is kept for [`Dispatcher::drain`]. Always takes the TLP
    /// (the session need not queue it).
    pub fn route(&mut self, label: L, bytes: &[u8], now: &mut dyn FnMut(L, &TlpRepr<'_>)) -> bool {
        let Ok(t) = TlpRepr::parse_bytes(bytes, &self.parse) else {
            self.stats.malformed += 1;
            return true;
        };
        if let Some(d) = t.data() {
            self.stats.largest_payload = self.stats.largest_payload.max(d.len() as u32);
        }
        if let tlp::Body::MemRead { length_dw, .. } = t.body {
            self.stats.largest_read_request = self.stats.largest_read_request.max(length_dw as u32 * 4);
        }
        match t.fc_class() {
            FcClass::Completion => now(label, &t),
            FcClass::Posted => match Control::from_repr(&t) {
                Err(ControlError::NotControl) => now(label, &t),
                Ok(c) => self.kept.push((label, Item::Control(c))),
                Err(e) => self.kept.push((label, Item::BadControl(e))),
            },
            FcClass::NonPosted => {
                let data = t.data().unwrap_or(&[]);
                if data.len() > MAX_REQUEST_DATA {
                    self.stats.malformed += 1;
                    return true;
                }
                let mut d = [0u8; MAX_REQUEST_DATA];
                d[..data.len()].copy_from_slice(data);
                let request = t.with_data(&[]);
                self.kept.push((label, Item::Request(request, d, data.len())));
            }
        }
        true
    }

    /// Whether anything waits for [`Dispatcher::drain`].
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Hands `f` what was kept, in arrival order, and forgets it (the storage stays for the
    /// next poll: a poll that keeps no more than one before allocates nothing).
    pub fn drain(&mut self, mut f: impl FnMut(L, Kept<'_>)) {
        for (label, item) in self.kept.drain(..) {
            match item {
                Item::Request(t, d, n) => f(label, Kept::Request(t.with_data(&d[..n]))),
                Item::Control(c) => f(label, Kept::Control(c)),
                Item::BadControl(e) => f(label, Kept::BadControl(e)),
            }
        }
    }

    /// What was dropped so far.
    pub fn stats(&self) -> DispatchStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tlp::{Address, Bdf, Body, CplStatus, Request, Tag};

    use super::*;

    fn bytes(t: &TlpRepr<'_>) -> Vec<u8> {
        let mut b = vec![0; t.buffer_len()];
        let n = t.emit(&mut b).unwrap();
        b.truncate(n);
        b
    }

    fn req(tag: u16) -> Request {
        Request { requester: Bdf::new(1, 0, 0), tag: Tag::from_bits(tag), first_be: 0xf, last_be: 0xf }
    }

    #[test]
    fn posted_and_completions_now_requests_and_controls_kept_in_order() {
        let mwr = bytes(&TlpRepr::new(Body::MemWrite {
            req: req(0),
            address: Address::new(0x1000),
            ph: 0,
            data: &[1, 2, 3, 4, 5, 6, 7, 8],
        }));
        let mrd = bytes(&TlpRepr::new(Body::MemRead {
            req: req(7),
            address: Address::new(0x2000),
            ph: 0,
            length_dw: 16,
            locked: false,
        }));
        let cpl = bytes(&tlp::rules::completion_without_data(
            &TlpRepr::parse_bytes(&mrd, &ParseConfig::default()).unwrap(),
            Bdf::new(0, 0, 0),
            CplStatus::Success,
        ));
        let cas = bytes(&TlpRepr::new(Body::Atomic {
            op: tlp::AtomicOp::Cas,
            req: req(9),
            address: Address::new(0x3000),
            ph: 0,
            data: &[0xab; 32],
        }));
        let attach = Control::Attach { device: "gpu0".into(), token: None }.to_tlp(Bdf::new(0, 0, 0));
        let mut d = Dispatcher::<u32>::new();
        let mut now = Vec::new();
        for (label, b) in [(1, &mwr), (1, &mrd), (2, &attach), (1, &cpl), (3, &cas)] {
            assert!(d.route(label, b, &mut |l, t| now.push((l, t.kind()))));
        }
        assert!(d.route(4, &[0x40, 0, 0], &mut |_, _| panic!("a malformed TLP is not handled")));
        assert_eq!(now, vec![(1, tlp::Kind::MWr32), (1, tlp::Kind::Cpl)]);
        assert_eq!(d.stats().malformed, 1);
        let mut kept = Vec::new();
        d.drain(|l, k| {
            kept.push(match k {
                Kept::Request(t) => (l, format!("{:?} {:?}", t.kind(), t.data().map(<[u8]>::len))),
                Kept::Control(c) => (l, format!("{c:?}")),
                Kept::BadControl(e) => (l, format!("{e:?}")),
            })
        });
        assert_eq!(
            kept,
            vec![
                (1, "MRd32 None".to_string()),
                (2, r#"Attach { device: "gpu0", token: None }"#.to_string()),
                (3, "CAS32 Some(32)".to_string()),
            ]
        );
        assert!(d.is_empty());
    }

    #[test]
    fn a_kept_request_is_the_request_that_arrived() {
        let cfg = TlpRepr::new(Body::CfgWrite {
            req: Request { last_be: 0, ..req(3) },
            cfg: tlp::ConfigTarget { type1: false, target: Bdf::new(1, 0, 0), register: 0x10 },
            data: &[0xff, 0xff, 0xff, 0xff],
        });
        let b = bytes(&cfg);
        let mut d = Dispatcher::<()>::new();
        d.route((), &b, &mut |_, _| panic!("a config write is non-posted"));
        let mut seen = None;
        d.drain(|_, k| seen = Some(format!("{k:?}")));
        assert_eq!(seen, Some(format!("{:?}", Kept::Request(cfg))));
    }
}
