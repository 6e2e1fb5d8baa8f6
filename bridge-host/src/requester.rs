//! The host's requester (PCIe 6.0 §2.2.6.2, §2.8): the tags of its outstanding non-posted
//! requests, the completion data gathered for each, and the completion timeout — judged on
//! the evidence of the link: extended once when the link was recovering lost frames while
//! the request waited (a lossy link's replay back-off is not a device that stopped
//! answering), and paused while the link is silent (a box that is not heard has not been
//! asked; the session rides such an outage through, and the timeout starts again once the
//! box is heard).
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

/// How the requester tells a silent link from a device that does not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Silence {
    /// Nothing heard from the box for this long (or since the request left, when the
    /// completion timeout passes) is a silent link: every live peer sends at least one frame
    /// per keepalive interval, and acknowledges a request within a round trip.
    pub quiet: Duration,
    /// The most a request waits on a silent link (the session's ride-through time).
    pub ride_through: Duration,
}

impl Silence {
    /// Whether the link is silent at `now`, for a request sent at `sent_at`, the box last
    /// heard at `heard`.
    pub(crate) fn silent(&self, sent_at: Time, heard: Time, now: Time) -> bool {
        heard < sent_at || now.since(heard) >= self.quiet
    }
}

/// What the link shows when a request's timer is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LinkEvidence {
    /// Frames the link recovered so far (retransmissions, NAKs, duplicates).
    pub recoveries: u64,
    /// When the box was last heard (an authentic frame).
    pub heard: Time,
}

/// How often a paused timer looks whether the link is heard again.
const PAUSED_CHECK: Duration = Duration::from_millis(5);

/// The outstanding requests, by 10-bit tag.
pub(crate) struct Requester {
    pending: Box<[Option<Pending>; 1024]>,
    next_tag: u16,
    /// The completion timeout.
    pub timeout: Duration,
    /// The most a request may wait while the link is recovering lost frames.
    pub recovering_timeout: Duration,
    /// What counts as a silent link, and how long a request waits on one.
    pub silence: Silence,
}

impl Requester {
    pub(crate) fn new(timeout: Duration, recovering_timeout: Duration, silence: Silence) -> Requester {
        Requester { pending: Box::new([None; 1024]), next_tag: 0, timeout, recovering_timeout, silence }
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
            timeout: self.timeout,
            silence: self.silence,
            paused: None,
            ride_cap: sent_at + self.timeout + self.silence.ride_through,
        }
    }
}

/// One request's completion timeout. On a clean link it is exactly the configured one; if
/// the link recovered lost frames since the request left, it is extended once, up to the
/// recovering timeout from the send; while the link is silent it is paused, and it starts
/// again from the moment the box is heard (up to the ride-through time in all).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompletionTimer {
    sent_at: Time,
    deadline: Time,
    cap: Time,
    recoveries: u64,
    extended: bool,
    timeout: Duration,
    silence: Silence,
    /// Since when the timer has been paused on a silent link.
    paused: Option<Time>,
    /// No pause goes past this.
    ride_cap: Time,
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
    /// The timeout passed while the link was silent: paused (this is the first check of
    /// the pause) until the box is heard again.
    Paused,
}

impl CompletionTimer {
    /// The timer at `now`, given what the link shows.
    pub(crate) fn check(&mut self, now: Time, link: LinkEvidence) -> TimerCheck {
        if now < self.deadline {
            return TimerCheck::Wait;
        }
        if self.silence.silent(self.sent_at, link.heard, now) && now < self.ride_cap {
            self.deadline = now + PAUSED_CHECK;
            return match self.paused {
                Some(_) => TimerCheck::Wait,
                None => {
                    self.paused = Some(now);
                    TimerCheck::Paused
                }
            };
        }
        if self.paused.take().is_some() && now < self.ride_cap {
            // Heard again: the box has the request now (or its replay), and gets the whole
            // timeout to answer it, from here.
            self.deadline = now + self.timeout;
            self.cap = self.cap.max(now + (self.cap - self.sent_at));
            return TimerCheck::Wait;
        }
        if !self.extended && link.recoveries > self.recoveries && now < self.cap {
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
        let mut r = requester();
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
        let mut r = requester();
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

    fn requester() -> Requester {
        let silence = Silence { quiet: Duration::from_millis(200), ride_through: Duration::from_secs(10) };
        Requester::new(Duration::from_millis(250), Duration::from_secs(1), silence)
    }

    #[test]
    fn the_timeout_is_extended_once_and_only_when_the_link_recovered() {
        let r = requester();
        let t0 = Time::from_nanos(1_000_000);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // The box heard a round trip after each request left, and recently at each check.
        let heard = |at: u64, recoveries: u64| LinkEvidence { recoveries, heard: ms(at) };
        let mut clean = r.timer(t0, 5);
        assert_eq!(clean.check(ms(249), heard(200, 5)), TimerCheck::Wait);
        assert_eq!(clean.check(ms(250), heard(200, 5)), TimerCheck::Expired(Duration::from_millis(250)));
        let mut lossy = r.timer(t0, 5);
        assert_eq!(lossy.check(ms(300), heard(250, 6)), TimerCheck::Extended);
        assert_eq!(lossy.check(ms(999), heard(950, 9)), TimerCheck::Wait);
        assert_eq!(lossy.check(ms(1000), heard(950, 9)), TimerCheck::Expired(Duration::from_secs(1)));
        let mut late = r.timer(t0, 5);
        assert_eq!(
            late.check(ms(1200), heard(1100, 6)),
            TimerCheck::Expired(Duration::from_millis(1200)),
            "past the cap"
        );
    }

    #[test]
    fn the_timeout_pauses_while_the_box_is_silent_and_starts_again_once_it_is_heard() {
        let r = requester();
        let t0 = Time::from_nanos(1_000_000);
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let ev = |heard: u64| LinkEvidence { recoveries: 0, heard: ms(heard) };
        // Sent at 0 into an outage (the box last heard at -50 ms, i.e. before the send).
        let mut t = r.timer(t0, 0);
        let before = LinkEvidence { recoveries: 0, heard: Time::from_nanos(0) };
        assert_eq!(t.check(ms(250), before), TimerCheck::Paused, "not heard since the send");
        assert_eq!(t.check(ms(3000), before), TimerCheck::Wait, "paused once, said once");
        // Heard again at 5 s: the whole timeout from there, not expired at once.
        assert_eq!(t.check(ms(5000), ev(5000)), TimerCheck::Wait);
        assert_eq!(t.check(ms(5200), ev(5100)), TimerCheck::Wait);
        assert_eq!(t.check(ms(5250), ev(5240)), TimerCheck::Expired(Duration::from_millis(5250)));
        // Heard after the send, then silent for `quiet`: paused too.
        let mut t = r.timer(t0, 0);
        assert_eq!(t.check(ms(250), ev(20)), TimerCheck::Paused);
        // A box heard all along that does not answer: the plain timeout.
        let mut t = r.timer(t0, 0);
        assert_eq!(t.check(ms(250), ev(240)), TimerCheck::Expired(Duration::from_millis(250)));
        // Silent past the ride-through time: expired (the session is down by then anyway).
        let mut t = r.timer(t0, 0);
        assert_eq!(t.check(ms(250), before), TimerCheck::Paused);
        assert_eq!(t.check(ms(10_250), before), TimerCheck::Expired(Duration::from_millis(10_250)));
    }
}
