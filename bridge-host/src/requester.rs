//! The host's requester (PCIe 6.0 §2.2.6.2, §2.8): the tags of its outstanding non-posted
//! requests, the completion data gathered for each, and the completion timeout — extended
//! once when the link was recovering lost frames while the request waited, so that a lossy
//! link's replay back-off is not taken for a device that stopped answering.
#![forbid(unsafe_code)]

use std::time::Duration;

use link::Time;
use tlp::rules;
use tlp::{Body, CplStatus, Tag, TlpRepr};

/// Bytes of completion data a request gathers (MMIO and config reads: up to a QW).
pub(crate) const MAX_READ: usize = 8;

/// A finished request: its status and the data its completions carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completed {
    pub status: CplStatus,
    pub data: [u8; MAX_READ],
    pub len: usize,
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    status: Option<CplStatus>,
    data: [u8; MAX_READ],
    received: usize,
}

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outstanding {
    /// No request has this tag (it failed, or was never made).
    None,
    /// Waiting for (more of) its completion.
    Waiting,
    /// Done; the tag is free again.
    Done(Completed),
}

/// What a completion matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CompletionMatch {
    /// An outstanding request's.
    Matched,
    /// No outstanding request has its tag.
    Stray,
}

/// The outstanding requests, by 10-bit tag.
pub(crate) struct Requester {
    pending: Box<[Option<Pending>; 1024]>,
    next_tag: u16,
    /// The completion timeout.
    pub timeout: Duration,
    /// The most a request may wait while the link is recovering lost frames.
    pub recovering_timeout: Duration,
}

impl Requester {
    pub(crate) fn new(timeout: Duration, recovering_timeout: Duration) -> Requester {
        Requester { pending: Box::new([None; 1024]), next_tag: 0, timeout, recovering_timeout }
    }

    /// A tag no outstanding request holds (after 1024 outstanding, the next one in turn).
    pub(crate) fn next_tag(&mut self) -> Tag {
        for _ in 0..1024 {
            self.next_tag = (self.next_tag + 1) & Tag::MAX;
            if self.pending[self.next_tag as usize].is_none() {
                break;
            }
        }
        Tag::from_bits(self.next_tag)
    }

    /// A request with `tag` is about to be sent.
    pub(crate) fn open(&mut self, tag: Tag) {
        self.pending[tag.value() as usize] = Some(Pending { status: None, data: [0; MAX_READ], received: 0 });
    }

    /// The request with `tag` was not sent after all.
    pub(crate) fn cancel(&mut self, tag: Tag) {
        self.pending[tag.value() as usize] = None;
    }

    /// A completion arrived: its data and, once the request is complete, its status go
    /// into the tag's entry.
    pub(crate) fn complete(&mut self, t: &TlpRepr<'_>) -> CompletionMatch {
        let Body::Completion { cpl, data, .. } = t.body else { return CompletionMatch::Stray };
        let Some(p) = self.pending[cpl.tag.value() as usize].as_mut() else { return CompletionMatch::Stray };
        if let Some(d) = data {
            let n = d.len().min(MAX_READ - p.received);
            p.data[p.received..p.received + n].copy_from_slice(&d[..n]);
            p.received += n;
        }
        if rules::completes_request(&cpl, data) {
            p.status = Some(cpl.status);
        }
        CompletionMatch::Matched
    }

    /// Whether the request with `tag` has had its last completion (and waits for
    /// [`Requester::poll`] to take it).
    pub(crate) fn is_done(&self, tag: Tag) -> bool {
        self.pending[tag.value() as usize].as_ref().is_some_and(|p| p.status.is_some())
    }

    /// Where the request with `tag` stands; a finished one frees its tag.
    pub(crate) fn poll(&mut self, tag: Tag) -> Outstanding {
        let slot = tag.value() as usize;
        match self.pending[slot] {
            None => Outstanding::None,
            Some(Pending { status: None, .. }) => Outstanding::Waiting,
            Some(Pending { status: Some(status), data, received }) => {
                self.pending[slot] = None;
                Outstanding::Done(Completed { status, data, len: received })
            }
        }
    }

    /// Fails every outstanding request (the device is gone); how many there were.
    pub(crate) fn fail_all(&mut self) -> u64 {
        self.pending.iter_mut().map(|p| p.take().is_some() as u64).sum()
    }

    /// The completion timer of a request sent at `sent_at`, when the link had counted
    /// `recoveries` frames recovered so far.
    pub(crate) fn timer(&self, sent_at: Time, recoveries: u64) -> CompletionTimer {
        CompletionTimer {
            sent_at,
            deadline: sent_at + self.timeout,
            cap: sent_at + self.recovering_timeout,
            recoveries,
            extended: false,
        }
    }
}

/// One request's completion timeout. On a clean link it is exactly the configured one; if
/// the link recovered lost frames since the request left, it is extended once, up to the
/// recovering timeout from the send.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompletionTimer {
    sent_at: Time,
    deadline: Time,
    cap: Time,
    recoveries: u64,
    extended: bool,
}

/// What the timer says at a moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerCheck {
    /// Keep waiting.
    Wait,
    /// The timeout passed while the link recovered frames: waiting on, up to the cap.
    Extended,
    /// The request timed out, after waiting this long.
    Expired(Duration),
}

impl CompletionTimer {
    /// The timer at `now`, the link having counted `recoveries` recovered frames by then.
    pub(crate) fn check(&mut self, now: Time, recoveries: u64) -> TimerCheck {
        if now < self.deadline {
            return TimerCheck::Wait;
        }
        if !self.extended && recoveries > self.recoveries && now < self.cap {
            self.extended = true;
            self.deadline = self.cap;
            return TimerCheck::Extended;
        }
        TimerCheck::Expired(now - self.sent_at)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use tlp::rules::{Rcb, TransferSize, complete_read};
    use tlp::{Bdf, Request};

    use super::*;

    fn read(tag: Tag) -> TlpRepr<'static> {
        TlpRepr::new(Body::MemRead {
            req: Request { requester: Bdf::new(0, 0, 0), tag, first_be: 0xf, last_be: 0xf },
            address: tlp::Address::new(0x1000),
            ph: 0,
            length_dw: 2,
            locked: false,
        })
    }

    #[test]
    fn a_completion_fills_its_request_and_frees_the_tag() {
        let mut r = Requester::new(Duration::from_millis(250), Duration::from_secs(1));
        let tag = r.next_tag();
        assert_eq!(r.poll(tag), Outstanding::None);
        r.open(tag);
        assert_eq!(r.poll(tag), Outstanding::Waiting);
        let data = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut cpls = Vec::new();
        complete_read(&read(tag), Bdf::new(1, 0, 0), &data, Rcb::B64, TransferSize::B128, |c| {
            let mut b = vec![0; c.buffer_len()];
            let n = c.emit(&mut b).unwrap();
            b.truncate(n);
            cpls.push(b);
        });
        let c = TlpRepr::parse_bytes(&cpls[0], &Default::default()).unwrap();
        assert_eq!(r.complete(&c), CompletionMatch::Matched);
        assert_eq!(r.poll(tag), Outstanding::Done(Completed { status: CplStatus::Success, data, len: 8 }));
        assert_eq!(r.poll(tag), Outstanding::None, "the tag is free again");
        assert_eq!(r.complete(&c), CompletionMatch::Stray);
    }

    #[test]
    fn tags_in_use_are_skipped_and_failing_all_counts_them() {
        let mut r = Requester::new(Duration::from_millis(250), Duration::from_secs(1));
        let a = r.next_tag();
        r.open(a);
        let b = r.next_tag();
        assert_ne!(a, b);
        r.open(b);
        for _ in 0..1022 {
            let t = r.next_tag();
            r.open(t);
        }
        assert_eq!(r.fail_all(), 1024);
        assert_eq!(r.fail_all(), 0);
    }

    #[test]
    fn the_timeout_is_extended_once_and_only_when_the_link_recovered() {
        let r = Requester::new(Duration::from_millis(250), Duration::from_secs(1));
        let t0 = Time::from_nanos(1_000_000);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut clean = r.timer(t0, 5);
        assert_eq!(clean.check(ms(249), 5), TimerCheck::Wait);
        assert_eq!(clean.check(ms(250), 5), TimerCheck::Expired(Duration::from_millis(250)));
        let mut lossy = r.timer(t0, 5);
        assert_eq!(lossy.check(ms(300), 6), TimerCheck::Extended);
        assert_eq!(lossy.check(ms(999), 9), TimerCheck::Wait);
        assert_eq!(lossy.check(ms(1000), 9), TimerCheck::Expired(Duration::from_secs(1)));
        let mut late = r.timer(t0, 5);
        assert_eq!(late.check(ms(1200), 6), TimerCheck::Expired(Duration::from_millis(1200)), "past the cap");
    }
}
