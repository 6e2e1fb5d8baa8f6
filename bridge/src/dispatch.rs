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

use std::collections::VecDeque;

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

/// Reads of more than this many bytes are long: a bulk copy's (a Max_Read_Request_Size of
/// 4 KiB, or 2) rather than a command fetch's (up to 1 KiB) or a register's.
const SHORT_READ: usize = 1024;

/// Whether `t` is a long memory read ([`SHORT_READ`]).
fn long_read(t: &TlpRepr<'_>) -> bool {
    matches!(t.body, tlp::Body::MemRead { length_dw, .. } if length_dw as usize * 4 > SHORT_READ)
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
    kept: VecDeque<(L, Item)>,
    parse: ParseConfig,
    stats: DispatchStats,
}

impl Item {
    fn is_long_read(&self) -> bool {
        matches!(self, Item::Request(t, _, _) if long_read(t))
    }
}

impl<L: Copy> Default for Dispatcher<L> {
    fn default() -> Self {
        Dispatcher::new()
    }
}

impl<L: Copy> Dispatcher<L> {
    /// Nothing kept yet.
    pub fn new() -> Dispatcher<L> {
        Dispatcher { kept: VecDeque::new(), parse: ParseConfig::default(), stats: DispatchStats::default() }
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
                Ok(c) => self.kept.push_back((label, Item::Control(c))),
                Err(e) => self.kept.push_back((label, Item::BadControl(e))),
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
                // A short request goes ahead of the long reads kept since the last
                // anything-else: a read may pass a read (PCIe 6.0 §2.4.1, table 2-39: the
                // completer's order among non-posted requests is free), so a command fetch
                // or a fence's read is not answered after a megabyte of a bulk copy's.
                let at = match long_read(&request) {
                    true => self.kept.len(),
                    false => {
                        let behind = self.kept.iter().rev().take_while(|(_, i)| i.is_long_read()).count();
                        self.kept.len() - behind
                    }
                };
                self.kept.insert(at, (label, Item::Request(request, d, data.len())));
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
    pub fn drain(&mut self, f: impl FnMut(L, Kept<'_>)) {
        self.drain_until(|_| false, f);
    }

    /// [`Dispatcher::drain`] until `stop` says so, asked before each item with how many were
    /// handed over already: what is left stays kept, in order, for the next call — for a
    /// bridge that answers in slices between other work of its thread's.
    pub fn drain_until(&mut self, mut stop: impl FnMut(usize) -> bool, mut f: impl FnMut(L, Kept<'_>)) {
        let mut handed = 0;
        while !self.kept.is_empty() && !stop(handed) {
            let Some((label, item)) = self.kept.pop_front() else { break };
            handed += 1;
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

    fn read(tag: u16, bytes: u16) -> Vec<u8> {
        let length_dw = bytes / 4;
        super::tests::bytes(&TlpRepr::new(Body::MemRead {
            req: Request { last_be: if length_dw == 1 { 0 } else { 0xf }, ..req(tag) },
            address: Address::new(0x1_0000 + 0x1000 * tag as u64),
            ph: 0,
            length_dw,
            locked: false,
        }))
    }

    fn order(d: &mut Dispatcher<u32>, stop_after: usize) -> Vec<String> {
        let mut seen = Vec::new();
        d.drain_until(
            |handed| handed >= stop_after,
            |_, k| {
                seen.push(match k {
                    Kept::Request(t) => format!("{}", t.requester_tag().1.value()),
                    Kept::Control(_) => "control".to_string(),
                    Kept::BadControl(_) => "bad".to_string(),
                })
            },
        );
        seen
    }

    #[test]
    fn short_reads_pass_the_long_reads_kept_before_them_but_nothing_else() {
        let mut d = Dispatcher::<u32>::new();
        let detach = Control::Detach { device: "gpu0".into() }.to_tlp(Bdf::new(0, 0, 0));
        // Long (4 KiB) reads 1 and 2, a short read 3 (a command fetch's 1 KiB) passes them;
        // a control message 4; a long read 5 and a short 6 (a register's DW): 6 passes 5 and
        // not the control message; 7 (short) queues behind 3 and 6's kind, in order.
        for b in [read(1, 4096), read(2, 4096), read(3, 1024), detach, read(5, 4096), read(6, 4), read(7, 64)]
        {
            d.route(0, &b, &mut |_, t| panic!("{:?} is not kept", t.kind()));
        }
        assert_eq!(order(&mut d, usize::MAX), ["3", "1", "2", "control", "6", "7", "5"]);
    }

    #[test]
    fn draining_until_told_to_stop_keeps_the_rest_in_order_for_the_next_call() {
        let mut d = Dispatcher::<u32>::new();
        for tag in 1..=5 {
            d.route(0, &read(tag, 4096), &mut |_, _| {});
        }
        assert_eq!(order(&mut d, 2), ["1", "2"]);
        assert!(!d.is_empty());
        assert_eq!(order(&mut d, 0), Vec::<String>::new());
        assert_eq!(order(&mut d, usize::MAX), ["3", "4", "5"]);
        assert!(d.is_empty());
    }
}
