//! The etcd v3 client the pool needs: KV (range, put, delete, transactions), watches and
//! leases over etcd's gRPC API, generated from `proto/` by protox at build time (no `protoc`).
//!
//! Written for how etcd expects clients to behave, which a general client left to its caller:
//!
//! - **HTTP/2 keepalive at etcd's pace.** A stock etcd accepts a client ping at most every
//!   5 s (`--grpc-keepalive-min-time`) and, like every gRPC-Go server, none while no stream
//!   is open; a client that pings faster is sent GOAWAY ("too_many_pings") and loses its
//!   watches and lease keep-alives. Pings go every [`KEEPALIVE_INTERVAL`] (10 s, the least
//!   gRPC-Go's own clients use), and only while a stream is open.
//! - **Requests fail rather than wait without a leader** (`hasleader` metadata, as etcdctl's
//!   `--require-leader`), and every unary request has a deadline.
//!
//! The names follow the etcd-client crate's (`Client::get`, `Txn::when`, `TxnOp::put`,
//! `WatchOptions::with_start_revision`) so that readers who know it find their way.
#![forbid(unsafe_code)]

use std::time::Duration;

use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;

/// etcd's messages and service clients, as protox and tonic generate them.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
pub mod proto {
    /// etcd's key-value records.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// etcd's v3 services.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// etcd's auth records (a role's permission).
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
}

use proto::etcdserverpb as pb;

mod auth_admin;
mod connect;
mod members;
use members::Resend;
use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;

pub use pb::{
    DeleteRangeResponse, LeaseGrantResponse, LeaseKeepAliveResponse, PutResponse, RangeResponse,
    ResponseHeader, TxnResponse, WatchResponse,
};
pub use proto::mvccpb::event::EventType;
pub use proto::mvccpb::{Event, KeyValue};

/// How often the client pings a member while a stream is open: at least etcd's
/// `--grpc-keepalive-min-time` (5 s by default), as gRPC-Go clients never ping more often
/// than every 10 s.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Why an etcd call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection could be made, or it broke.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// etcd answered with a gRPC error.
    #[error("{} ({:?})", .0.message(), .0.code())]
    GRpcStatus(#[from] tonic::Status),
    /// An endpoint that is not a URL the client can use.
    #[error("endpoint {0:?}: not an http:// or https:// URL")]
    BadEndpoint(String),
    /// The TLS files or the user (`crate::EtcdSecurity`).
    #[error(transparent)]
    Security(#[from] crate::security::SecurityError),
    /// etcd refused the user's name or password.
    #[error("etcd refused user {user:?}: {message} (check user and password; `etcdctl user get {user}`)")]
    Auth {
        /// The user.
        user: String,
        /// What etcd said.
        message: String,
    },
    /// A watch that etcd refused or cancelled (its reason).
    #[error("watch cancelled: {0}")]
    WatchCanceled(String),
    /// A lease that etcd no longer holds (expired or revoked).
    #[error("lease {0:x} is gone")]
    LeaseGone(i64),
    /// A stream's answer did not come in time.
    #[error("no answer to {0} within {1:?}")]
    Deadline(&'static str, Duration),
    /// A stream's other end is gone.
    #[error("the {0} stream ended")]
    StreamClosed(&'static str),
}

/// How the client talks to the cluster.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    /// A unary request's deadline.
    pub timeout: Duration,
    /// How long a connection may take to open.
    pub connect_timeout: Duration,
    /// Ask members to refuse requests while they have no leader.
    pub require_leader: bool,
    /// The HTTP/2 ping interval while a stream is open (at least etcd's minimum).
    pub keep_alive_interval: Duration,
}

impl Default for ConnectOptions {
    fn default() -> ConnectOptions {
        ConnectOptions {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            require_leader: true,
            keep_alive_interval: KEEPALIVE_INTERVAL,
        }
    }
}

/// A client of one etcd cluster: requests go to the member in use, and to the next where it
/// cannot be reached (`members`). Cheap to clone (the connections are shared).
#[derive(Clone)]
pub struct Client {
    members: std::sync::Arc<members::Members>,
    opts: ConnectOptions,
    /// The user and password to authenticate with, and the token etcd gave for them with
    /// when: shared by the clones, renewed every [`TOKEN_RENEWAL`].
    user: Option<(String, String)>,
    token: std::sync::Arc<std::sync::Mutex<Option<HeldToken>>>,
}

/// An etcd token and when it was given.
type HeldToken = (MetadataValue<tonic::metadata::Ascii>, std::time::Instant);

/// How long an etcd token is used before the client asks for a new one: well within
/// etcd's shortest default (a simple token idle for 5 minutes, `--auth-token-ttl`; a JWT
/// token's own lifetime), so that none expires under a request.
pub const TOKEN_RENEWAL: Duration = Duration::from_secs(60);

impl Client {
    /// The keys at `key` (or under it, [`GetOptions::with_prefix`]).
    pub async fn get(
        &mut self,
        key: impl Into<Vec<u8>>,
        opts: Option<GetOptions>,
    ) -> Result<RangeResponse, Error> {
        let msg = opts.unwrap_or_default().request(key.into());
        self.unary(msg, Resend::Read, |ch, req| async { KvClient::new(ch).range(req).await }).await
    }

    /// Sets `key` to `value`.
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        opts: Option<PutOptions>,
    ) -> Result<PutResponse, Error> {
        let msg = opts.unwrap_or_default().request(key.into(), value.into());
        self.unary(msg, Resend::Write, |ch, req| async { KvClient::new(ch).put(req).await }).await
    }

    /// Deletes `key` (or the keys under it).
    pub async fn delete(
        &mut self,
        key: impl Into<Vec<u8>>,
        opts: Option<DeleteOptions>,
    ) -> Result<DeleteRangeResponse, Error> {
        let msg = opts.unwrap_or_default().request(key.into());
        self.unary(msg, Resend::Write, |ch, req| async { KvClient::new(ch).delete_range(req).await }).await
    }

    /// Runs a transaction.
    pub async fn txn(&mut self, txn: Txn) -> Result<TxnResponse, Error> {
        // One that only reads may be sent again as a range may.
        let resend = if txn.reads_only() { Resend::Read } else { Resend::Write };
        self.unary(txn.req, resend, |ch, req| async { KvClient::new(ch).txn(req).await }).await
    }

    /// A new lease of `ttl` seconds.
    pub async fn lease_grant(&mut self, ttl: i64) -> Result<LeaseGrantResponse, Error> {
        let msg = pb::LeaseGrantRequest { ttl, id: 0 };
        self.unary(msg, Resend::Write, |ch, req| async { LeaseClient::new(ch).lease_grant(req).await }).await
    }

    /// Ends lease `id` (its keys are deleted).
    pub async fn lease_revoke(&mut self, id: i64) -> Result<(), Error> {
        let msg = pb::LeaseRevokeRequest { id };
        self.unary(msg, Resend::Write, |ch, req| async { LeaseClient::new(ch).lease_revoke(req).await })
            .await?;
        Ok(())
    }

    /// A keep-alive stream for lease `id`, opened with one renewal (etcd answers a stream's
    /// headers with its first message, so the call would not return before a renewal was
    /// sent); that renewal's answer is taken here: `Err` if the lease is gone.
    /// [`LeaseKeeper::keep_alive`] renews it again, and the stream answers each renewal
    /// with the time to live left (0: the lease is gone).
    pub async fn lease_keep_alive(&mut self, id: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        let renew = pb::LeaseKeepAliveRequest { id };
        let (tx, stream, first) = self
            .open_stream(renew, ("keep-alive", "the first lease renewal"), |ch, req| async {
                LeaseClient::new(ch).lease_keep_alive(req).await
            })
            .await?;
        if first.ttl <= 0 {
            return Err(Error::LeaseGone(id));
        }
        Ok((LeaseKeeper { id, tx }, LeaseKeepAliveStream { stream }))
    }

    /// Watches `key` (or the keys under it): returns once etcd has created the watch.
    pub async fn watch(
        &mut self,
        key: impl Into<Vec<u8>>,
        opts: Option<WatchOptions>,
    ) -> Result<(Watcher, WatchStream), Error> {
        let create = opts.unwrap_or_default().request(key.into());
        let create =
            pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) };
        let (tx, stream, first) = self
            .open_stream(create, ("watch", "the watch's creation"), |ch, req| async {
                WatchClient::new(ch).watch(req).await
            })
            .await?;
        if first.canceled || !first.created {
            return Err(Error::WatchCanceled(first.cancel_reason));
        }
        Ok((Watcher { id: first.watch_id, _tx: tx }, WatchStream { stream }))
    }
}

/// The end of `prefix`'s key range: the first key after every key that starts with it.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// Options of a read.
#[derive(Clone, Copy, Debug, Default)]
pub struct GetOptions {
    prefix: bool,
    keys_only: bool,
}

impl GetOptions {
    /// No options.
    pub fn new() -> GetOptions {
        GetOptions::default()
    }
    /// Every key that starts with the key given.
    pub fn with_prefix(mut self) -> GetOptions {
        self.prefix = true;
        self
    }
    /// Keys and revisions, not values.
    pub fn with_keys_only(mut self) -> GetOptions {
        self.keys_only = true;
        self
    }
    fn request(self, key: Vec<u8>) -> pb::RangeRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { Vec::new() };
        pb::RangeRequest { key, range_end, keys_only: self.keys_only, ..Default::default() }
    }
}

/// Options of a write.
#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    lease: i64,
}

impl PutOptions {
    /// No options.
    pub fn new() -> PutOptions {
        PutOptions::default()
    }
    /// The key lives as long as lease `id`.
    pub fn with_lease(mut self, id: i64) -> PutOptions {
        self.lease = id;
        self
    }
    fn request(self, key: Vec<u8>, value: Vec<u8>) -> pb::PutRequest {
        pb::PutRequest { key, value, lease: self.lease, prev_kv: false }
    }
}

/// Options of a delete.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeleteOptions {
    prefix: bool,
    prev_kv: bool,
}

impl DeleteOptions {
    /// No options.
    pub fn new() -> DeleteOptions {
        DeleteOptions::default()
    }
    /// Every key that starts with the key given.
    pub fn with_prefix(mut self) -> DeleteOptions {
        self.prefix = true;
        self
    }
    /// Return what was deleted.
    pub fn with_prev_key(mut self) -> DeleteOptions {
        self.prev_kv = true;
        self
    }
    fn request(self, key: Vec<u8>) -> pb::DeleteRangeRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { Vec::new() };
        pb::DeleteRangeRequest { key, range_end, prev_kv: self.prev_kv }
    }
}

/// Options of a watch.
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchOptions {
    prefix: bool,
    prev_kv: bool,
    start_revision: i64,
    progress_notify: bool,
}

impl WatchOptions {
    /// No options: from the next revision on.
    pub fn new() -> WatchOptions {
        WatchOptions::default()
    }
    /// Every key that starts with the key given.
    pub fn with_prefix(mut self) -> WatchOptions {
        self.prefix = true;
        self
    }
    /// Each event carries the key's value before it.
    pub fn with_prev_key(mut self) -> WatchOptions {
        self.prev_kv = true;
        self
    }
    /// Events from `revision` on (a watch resumed where it stopped misses nothing).
    pub fn with_start_revision(mut self, revision: i64) -> WatchOptions {
        self.start_revision = revision;
        self
    }
    /// etcd tells the watch its revision now and then while nothing changes (so that a
    /// watch resumed after a quiet hour does not start from a compacted revision).
    pub fn with_progress_notify(mut self) -> WatchOptions {
        self.progress_notify = true;
        self
    }
    fn request(self, key: Vec<u8>) -> pb::WatchCreateRequest {
        let range_end = if self.prefix { prefix_end(&key) } else { Vec::new() };
        pb::WatchCreateRequest {
            key,
            range_end,
            start_revision: self.start_revision,
            progress_notify: self.progress_notify,
            prev_kv: self.prev_kv,
            watch_id: 0,
        }
    }
}

/// A comparison of a transaction's guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`.
    Equal,
    /// `>`.
    Greater,
    /// `<`.
    Less,
    /// `!=`.
    NotEqual,
}

impl CompareOp {
    fn result(self) -> pb::compare::CompareResult {
        use pb::compare::CompareResult as R;
        match self {
            CompareOp::Equal => R::Equal,
            CompareOp::Greater => R::Greater,
            CompareOp::Less => R::Less,
            CompareOp::NotEqual => R::NotEqual,
        }
    }
}

/// A transaction guard: one key's version, creation or modification revision compared.
#[derive(Clone, Debug, PartialEq)]
pub struct Compare(pb::Compare);

impl Compare {
    fn of(key: impl Into<Vec<u8>>, op: CompareOp, target: pb::compare::CompareTarget, v: i64) -> Compare {
        use pb::compare::{CompareTarget as T, TargetUnion as U};
        let union = match target {
            T::Version => U::Version(v),
            T::Create => U::CreateRevision(v),
            T::Mod => U::ModRevision(v),
            T::Lease => U::Lease(v),
            T::Value => U::Value(Vec::new()),
        };
        Compare(pb::Compare {
            result: op.result() as i32,
            target: target as i32,
            key: key.into(),
            target_union: Some(union),
            range_end: Vec::new(),
        })
    }
    /// The key's version (0: the key does not exist).
    pub fn version(key: impl Into<Vec<u8>>, op: CompareOp, version: i64) -> Compare {
        Compare::of(key, op, pb::compare::CompareTarget::Version, version)
    }
    /// The revision the key was created at.
    pub fn create_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::of(key, op, pb::compare::CompareTarget::Create, revision)
    }
    /// The revision the key was last changed at.
    pub fn mod_revision(key: impl Into<Vec<u8>>, op: CompareOp, revision: i64) -> Compare {
        Compare::of(key, op, pb::compare::CompareTarget::Mod, revision)
    }
}

/// One operation of a transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct TxnOp(pb::RequestOp);

impl TxnOp {
    fn op(r: pb::request_op::Request) -> TxnOp {
        TxnOp(pb::RequestOp { request: Some(r) })
    }
    /// A read.
    pub fn get(key: impl Into<Vec<u8>>, opts: Option<GetOptions>) -> TxnOp {
        TxnOp::op(pb::request_op::Request::RequestRange(opts.unwrap_or_default().request(key.into())))
    }
    /// A write.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, opts: Option<PutOptions>) -> TxnOp {
        TxnOp::op(pb::request_op::Request::RequestPut(
            opts.unwrap_or_default().request(key.into(), value.into()),
        ))
    }
    /// A delete.
    pub fn delete(key: impl Into<Vec<u8>>, opts: Option<DeleteOptions>) -> TxnOp {
        TxnOp::op(pb::request_op::Request::RequestDeleteRange(opts.unwrap_or_default().request(key.into())))
    }
}

/// A transaction: if every guard holds, the `and_then` operations, else the `or_else` ones.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    req: pb::TxnRequest,
}

impl Txn {
    /// No guards, no operations.
    pub fn new() -> Txn {
        Txn::default()
    }
    /// Whether every operation, on either branch, is a read (nested transactions count as
    /// writes).
    fn reads_only(&self) -> bool {
        let read = |o: &pb::RequestOp| matches!(o.request, Some(pb::request_op::Request::RequestRange(_)));
        self.req.success.iter().chain(&self.req.failure).all(read)
    }
    /// The guards.
    pub fn when(mut self, compare: impl IntoIterator<Item = Compare>) -> Txn {
        self.req.compare.extend(compare.into_iter().map(|c| c.0));
        self
    }
    /// What runs when every guard holds.
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.req.success.extend(ops.into_iter().map(|o| o.0));
        self
    }
    /// What runs otherwise.
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.req.failure.extend(ops.into_iter().map(|o| o.0));
        self
    }
}

/// What one operation of a transaction returned.
#[derive(Clone, Debug)]
pub enum TxnOpResponse {
    /// A read's keys.
    Get(RangeResponse),
    /// A write.
    Put(PutResponse),
    /// A delete.
    Delete(DeleteRangeResponse),
    /// A nested transaction.
    Txn(TxnResponse),
}

/// Renews one lease on its keep-alive stream.
pub struct LeaseKeeper {
    id: i64,
    tx: mpsc::Sender<pb::LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// The lease.
    pub fn id(&self) -> i64 {
        self.id
    }
    /// Asks etcd to renew the lease (the answer comes on the stream).
    pub async fn keep_alive(&mut self) -> Result<(), Error> {
        self.tx
            .send(pb::LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::StreamClosed("keep-alive"))
    }
}

/// etcd's answers to a lease's renewals.
pub struct LeaseKeepAliveStream {
    stream: tonic::Streaming<LeaseKeepAliveResponse>,
}

impl LeaseKeepAliveStream {
    /// The next answer; `None` once etcd closed the stream.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Error> {
        Ok(self.stream.message().await?)
    }
}

/// A watch's handle: the watch lasts as long as it and its stream do.
pub struct Watcher {
    id: i64,
    _tx: mpsc::Sender<pb::WatchRequest>,
}

impl Watcher {
    /// The watch's ID on its stream.
    pub fn watch_id(&self) -> i64 {
        self.id
    }
}

/// A watch's events.
pub struct WatchStream {
    stream: tonic::Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next batch of events (or progress notification); `None` once etcd closed it.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        Ok(self.stream.message().await?)
    }
}

// Accessors in etcd-client's names over the generated messages' fields.

impl ResponseHeader {
    /// The store's revision when the request was served.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

impl RangeResponse {
    /// The keys found.
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
    /// The response header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
}

impl DeleteRangeResponse {
    /// How many keys were deleted.
    pub fn deleted(&self) -> i64 {
        self.deleted
    }
    /// What they held (with [`DeleteOptions::with_prev_key`]).
    pub fn prev_kvs(&self) -> &[KeyValue] {
        &self.prev_kvs
    }
}

impl TxnResponse {
    /// Whether every guard held.
    pub fn succeeded(&self) -> bool {
        self.succeeded
    }
    /// The response header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
    /// What each operation returned, in order.
    pub fn op_responses(self) -> Vec<TxnOpResponse> {
        use pb::response_op::Response as R;
        self.responses
            .into_iter()
            .filter_map(|r| {
                Some(match r.response? {
                    R::ResponseRange(g) => TxnOpResponse::Get(g),
                    R::ResponsePut(p) => TxnOpResponse::Put(p),
                    R::ResponseDeleteRange(d) => TxnOpResponse::Delete(d),
                    R::ResponseTxn(t) => TxnOpResponse::Txn(t),
                })
            })
            .collect()
    }
}

impl LeaseGrantResponse {
    /// The lease's ID.
    pub fn id(&self) -> i64 {
        self.id
    }
}

impl LeaseKeepAliveResponse {
    /// Seconds the lease has left (0 or less: it is gone).
    pub fn ttl(&self) -> i64 {
        self.ttl
    }
}

impl WatchResponse {
    /// The events, in revision order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }
    /// Whether etcd ended the watch (compaction past its revision, or a cancel).
    pub fn canceled(&self) -> bool {
        self.canceled
    }
    /// Why etcd cancelled the watch.
    pub fn cancel_reason(&self) -> &str {
        &self.cancel_reason
    }
    /// The oldest revision etcd still has, where it cancelled the watch for compaction.
    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }
    /// The response header.
    pub fn header(&self) -> Option<&ResponseHeader> {
        self.header.as_ref()
    }
}

impl Event {
    /// A put or a delete.
    pub fn event_type(&self) -> EventType {
        self.r#type()
    }
    /// The key after the event.
    pub fn kv(&self) -> Option<&KeyValue> {
        self.kv.as_ref()
    }
    /// The key before it (with [`WatchOptions::with_prev_key`]).
    pub fn prev_kv(&self) -> Option<&KeyValue> {
        self.prev_kv.as_ref()
    }
}

impl KeyValue {
    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The value.
    pub fn value(&self) -> &[u8] {
        &self.value
    }
    /// The revision the key was created at.
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }
    /// The revision it was last changed at.
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_after_every_key_that_starts_with_it() {
        assert_eq!(prefix_end(b"/dxpu/"), b"/dxpu0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), [0]);
        assert_eq!(prefix_end(b""), [0]);
    }

    #[test]
    fn a_guard_carries_its_target_and_value() {
        let c = Compare::create_revision("k", CompareOp::Equal, 42);
        assert_eq!(c.0.target(), pb::compare::CompareTarget::Create);
        assert_eq!(c.0.result(), pb::compare::CompareResult::Equal);
        assert_eq!(c.0.target_union, Some(pb::compare::TargetUnion::CreateRevision(42)));
        let t = Txn::new().when([c]).and_then([TxnOp::delete("k", None)]);
        assert_eq!((t.req.compare.len(), t.req.success.len(), t.req.failure.len()), (1, 1, 0));
        assert!(!t.reads_only());
        let reads = Txn::new().and_then([TxnOp::get("k", None)]);
        assert!(reads.reads_only());
        assert!(!reads.or_else([TxnOp::put("k", "v", None)]).reads_only());
    }

    #[tokio::test]
    async fn an_endpoint_that_is_not_http_is_refused() {
        let e = Client::connect(&["127.0.0.1:2379"], ConnectOptions::default()).await.err();
        assert!(matches!(e, Some(Error::BadEndpoint(ref s)) if s == "127.0.0.1:2379"), "{e:?}");
    }
}
