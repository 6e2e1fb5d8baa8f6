//! The cluster's members as the client reaches them: one connection to each, opened as
//! requests need it; requests go to the member in use, and on to the next where it cannot
//! be reached — as etcd's own client pins one endpoint and moves on, so that a cluster that
//! has lost a member (or has one not yet listening) answers every request, not two in three.
//!
//! A request goes to another member only where that cannot apply it twice: a write where
//! the member never had it (its connection could not be made, or it had no leader and
//! refused it, etcd's "etcdserver: no leader"); a read also where the member failed while
//! answering (its connection broke, its deadline passed).

use std::sync::atomic::{AtomicUsize, Ordering};

use tonic::transport::Channel;
use tonic::{Code, Status};

/// What a failed request may be sent again after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resend {
    /// Reading (a range, a watch's or a keep-alive stream's opening, a token): after any
    /// failure of the member.
    Read,
    /// Changing the cluster: only after a failure that shows the member never had it.
    Write,
}

impl Resend {
    /// Whether a request that failed with `s` may go to another member.
    pub(super) fn allows(self, s: &Status) -> bool {
        match self {
            Resend::Write => never_delivered(s),
            Resend::Read => never_delivered(s) || member_failed(s),
        }
    }
}

/// The connection to the member could not be made (tonic wraps every failure to connect,
/// TLS included, in [`tonic::ConnectError`]), or the member refused it for want of a
/// leader.
pub(super) fn never_delivered(s: &Status) -> bool {
    connect_failed(s) || (s.code() == Code::Unavailable && s.message().contains("no leader"))
}

fn connect_failed(s: &Status) -> bool {
    causes(s).any(|e| e.is::<tonic::ConnectError>())
}

/// The errors `s` was made from, outermost first.
fn causes(s: &Status) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(std::error::Error::source(s), |e| e.source())
}

/// What `s` says, with the error at the root of it (a connection's own, where it is one):
/// "tcp connect error: Connection refused (os error 111)".
fn reason(s: &Status) -> String {
    match causes(s).last().map(ToString::to_string) {
        Some(r) if !s.message().contains(&r) => format!("{}: {r}", s.message()),
        _ => s.message().to_string(),
    }
}

/// The member did not answer: the failure is the client's own (tonic keeps the error it
/// made the status from as its source — a connection that broke, a deadline that passed —
/// where a member's answer has none), or the member said it is unavailable.
fn member_failed(s: &Status) -> bool {
    std::error::Error::source(s).is_some() || matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded)
}

/// One lazily opened connection per member and the one in use (shared by a client's
/// clones).
pub(super) struct Members {
    /// Each member's endpoint, as given (what the log names), and its connection.
    list: Vec<(String, Channel)>,
    in_use: AtomicUsize,
}

impl Members {
    /// `list` (each member's endpoint and connection) in the order given: the first is used
    /// first.
    pub(super) fn new(list: Vec<(String, Channel)>) -> Members {
        Members { list, in_use: AtomicUsize::new(0) }
    }

    /// `send` to the member in use; where it fails as `resend` allows, to the next, each
    /// member once. The error returned is the last a member gave itself where one did
    /// (its "no leader" says more than the connection refused by the next).
    pub(super) async fn send<T, F, Fut>(&self, resend: Resend, mut send: F) -> Result<T, Status>
    where
        F: FnMut(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut kept: Option<Status> = None;
        for _ in 0..self.list.len() {
            let i = self.in_use.load(Ordering::Relaxed) % self.list.len();
            let s = match send(self.list[i].1.clone()).await {
                Ok(t) => return Ok(t),
                Err(s) => s,
            };
            if never_delivered(&s) || member_failed(&s) {
                // The next request goes to the next member, whether or not this one may
                // follow it (a member that takes connections and never answers must not
                // keep every write). Another request may have moved on already: move only
                // from `i`.
                let next = (i + 1) % self.list.len();
                if self.in_use.compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed).is_ok()
                    && next != i
                {
                    log::warn!(
                        "etcd member {} failed ({}); using {} from now on",
                        self.list[i].0,
                        reason(&s),
                        self.list[next].0
                    );
                }
            }
            if !resend.allows(&s) {
                return Err(s);
            }
            if kept.is_none() || !connect_failed(&s) {
                kept = Some(s);
            }
        }
        Err(kept.unwrap_or_else(|| Status::unavailable("the client has no etcd endpoint")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn refused() -> Status {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        Status::from_error(Box::new(tonic::ConnectError(Box::new(io))))
    }

    fn members(n: usize) -> Members {
        let list = (0..n)
            .map(|i| format!("http://127.0.0.1:{}", 1 + i))
            .map(|url| tonic::transport::Endpoint::from_shared(url.clone()).map(|e| (url, e.connect_lazy())))
            .collect::<Result<Vec<_>, _>>();
        Members::new(list.unwrap_or_default())
    }

    #[test]
    fn a_failure_is_said_with_its_root() {
        assert_eq!(reason(&refused()), "connection refused");
        assert_eq!(reason(&Status::unavailable("etcdserver: no leader")), "etcdserver: no leader");
        let io =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let wrapped = Status::from_error(Box::new(tonic::ConnectError(Box::new(io))));
        assert_eq!(reason(&wrapped), "Connection refused (os error 111)");
    }

    #[tokio::test]
    async fn a_refused_connection_is_said_as_tonic_reports_it() {
        // Port 1 on the loopback: nothing listens there.
        let Ok(ep) = tonic::transport::Endpoint::from_shared("http://127.0.0.1:1") else { return };
        let got = crate::etcd::proto::etcdserverpb::kv_client::KvClient::new(ep.connect_lazy())
            .range(crate::etcd::proto::etcdserverpb::RangeRequest::default())
            .await;
        let s = got.expect_err("nothing listens on port 1");
        assert!(never_delivered(&s), "{s:?}");
        let said = reason(&s);
        assert!(said.starts_with("tcp connect error: ") && said.contains("refused"), "{said}");
    }

    #[test]
    fn what_may_be_sent_again_after_which_failure() {
        let no_leader = Status::unavailable("etcdserver: no leader");
        let broke = Status::from_error(Box::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe)));
        let late = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        let refused_by_etcd = Status::failed_precondition("etcdserver: requested lease not found");
        assert!(Resend::Write.allows(&refused()) && Resend::Write.allows(&no_leader));
        assert!(!Resend::Write.allows(&broke) && !Resend::Write.allows(&late));
        assert!(Resend::Read.allows(&broke) && Resend::Read.allows(&late));
        assert!(!Resend::Read.allows(&refused_by_etcd) && !Resend::Write.allows(&refused_by_etcd));
    }

    #[tokio::test]
    async fn a_refused_member_is_passed_over_and_stays_passed_over() {
        let m = members(3);
        let tried = Mutex::new(Vec::new());
        let down = 0;
        let send = |ch: Channel| {
            let _ = ch;
            let i = m.in_use.load(Ordering::Relaxed);
            tried.lock().map(|mut t| t.push(i)).ok();
            async move { if i == down { Err(refused()) } else { Ok(i) } }
        };
        assert_eq!(m.send(Resend::Write, send).await.ok(), Some(1));
        assert_eq!(m.send(Resend::Write, send).await.ok(), Some(1));
        assert_eq!(*tried.lock().unwrap_or_else(|p| p.into_inner()), [0, 1, 1]);
    }

    #[tokio::test]
    async fn a_write_that_may_have_landed_is_not_sent_again_and_the_members_answer_is_kept() {
        let m = members(3);
        let broke = |_: Channel| async { Err::<(), _>(Status::unavailable("connection reset")) };
        let e = m.send(Resend::Write, broke).await.err();
        assert_eq!(e.map(|s| s.message().to_string()).as_deref(), Some("connection reset"));
        assert_eq!(m.in_use.load(Ordering::Relaxed), 1, "not sent again, but the next write goes on");
        let refused_by_etcd =
            |_: Channel| async { Err::<(), _>(Status::failed_precondition("lease not found")) };
        assert!(m.send(Resend::Read, refused_by_etcd).await.is_err());
        assert_eq!(m.in_use.load(Ordering::Relaxed), 1, "a member's own refusal moves nothing");
        // Every member failing: the one that answered ("no leader") is said, not the
        // connections refused after it.
        let calls = AtomicUsize::new(0);
        let mixed = |_: Channel| {
            let k = calls.fetch_add(1, Ordering::Relaxed);
            async move {
                Err::<(), _>(if k == 1 { Status::unavailable("etcdserver: no leader") } else { refused() })
            }
        };
        m.in_use.store(0, Ordering::Relaxed);
        let e = m.send(Resend::Write, mixed).await.err();
        assert_eq!(e.map(|s| s.message().to_string()).as_deref(), Some("etcdserver: no leader"));
        assert_eq!(calls.load(Ordering::Relaxed), 3, "each member once");
    }
}
