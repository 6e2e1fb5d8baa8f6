//! Opening a [`Client`]: its endpoints over plain HTTP/2 or TLS, its user authenticated, and
//! the metadata every request carries (the `hasleader` flag, the user's token, renewed every
//! [`TOKEN_RENEWAL`]).

use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::members::{Members, Resend};
use super::{AuthClient, Client, ConnectOptions, Error, TOKEN_RENEWAL, pb};

impl Client {
    /// A client of the cluster at `endpoints` (`http://host:port`). Connections open as
    /// requests need them (a member down at start is tried again later).
    pub async fn connect<S: AsRef<str>>(endpoints: &[S], opts: ConnectOptions) -> Result<Client, Error> {
        Client::connect_secure(endpoints, opts, &crate::EtcdSecurity::default()).await
    }

    /// [`Client::connect`] over TLS and as an etcd user, as `security` says (`https://`
    /// endpoints); the user is authenticated at once, so that a wrong password is said here.
    pub async fn connect_secure<S: AsRef<str>>(
        endpoints: &[S],
        opts: ConnectOptions,
        security: &crate::EtcdSecurity,
    ) -> Result<Client, Error> {
        let tls = if security.tls() { Some(security.tls_config()?) } else { None };
        let mut list = Vec::new();
        for e in endpoints {
            let e = e.as_ref();
            let scheme_ok = if tls.is_some() { e.starts_with("https://") } else { e.starts_with("http://") };
            if !scheme_ok {
                return Err(Error::BadEndpoint(e.to_string()));
            }
            let mut ep = Endpoint::from_shared(e.to_string())
                .map_err(|_| Error::BadEndpoint(e.to_string()))?
                .timeout(opts.timeout)
                .connect_timeout(opts.connect_timeout)
                .http2_keep_alive_interval(opts.keep_alive_interval)
                .keep_alive_timeout(opts.timeout.max(Duration::from_secs(1)))
                .keep_alive_while_idle(false);
            if let Some(t) = &tls {
                ep = ep.tls_config(t.clone())?;
            }
            list.push((e.to_string(), ep));
        }
        if list.is_empty() {
            return Err(Error::BadEndpoint(String::new()));
        }
        let members = Members::new(list.into_iter().map(|(url, e)| (url, e.connect_lazy())).collect());
        let mut c = Client {
            members: std::sync::Arc::new(members),
            opts,
            user: security.user.clone().zip(security.password.clone()),
            token: Default::default(),
        };
        c.fresh_token().await?;
        Ok(c)
    }

    /// The token to send, asked for again where there is none or it is [`TOKEN_RENEWAL`]
    /// old; none without a user.
    pub(super) async fn fresh_token(
        &mut self,
    ) -> Result<Option<MetadataValue<tonic::metadata::Ascii>>, Error> {
        let Some((user, password)) = self.user.clone() else { return Ok(None) };
        let held = self.token.lock().ok().and_then(|t| t.clone());
        if let Some((t, _)) = held.filter(|(_, at)| at.elapsed() < TOKEN_RENEWAL) {
            return Ok(Some(t));
        }
        let msg = pb::AuthenticateRequest { name: user.clone(), password };
        let timeout = self.opts.timeout;
        let answer = self
            .members
            .send(Resend::Read, |ch| {
                let mut r = tonic::Request::new(msg.clone());
                r.set_timeout(timeout);
                async { AuthClient::new(ch).authenticate(r).await }
            })
            .await;
        let token = match answer {
            Ok(a) => a.into_inner().token,
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::Unauthenticated
                        | tonic::Code::FailedPrecondition
                ) =>
            {
                return Err(Error::Auth { user, message: s.message().to_string() });
            }
            Err(s) => return Err(s.into()),
        };
        let v = MetadataValue::try_from(token.as_str())
            .map_err(|_| Error::Auth { user, message: "etcd gave a token that is not ASCII".into() })?;
        if let Ok(mut t) = self.token.lock() {
            *t = Some((v.clone(), std::time::Instant::now()));
        }
        Ok(Some(v))
    }

    /// `msg` as a unary request with the client's metadata and deadline, sent to the member
    /// in use and on as `resend` allows ([`Members::send`]); `call` sends it on a channel.
    pub(super) async fn unary<M, R, F, Fut>(&mut self, msg: M, resend: Resend, call: F) -> Result<R, Error>
    where
        M: Clone,
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        let token = self.fresh_token().await?;
        let answer =
            self.members.send(resend, |ch| call(ch, self.metadata(msg.clone(), true, token.clone()))).await?;
        Ok(answer.into_inner())
    }

    /// A stream opened with `first` on the member in use (and on as [`Resend::Read`]
    /// allows: opening a watch or a keep-alive changes nothing), by `open` on a channel;
    /// with the sender of the messages after it and the stream's first answer, which must
    /// come within the client's deadline (`names`: the stream's, the first answer's).
    pub(super) async fn open_stream<M, R, F, Fut>(
        &mut self,
        first: M,
        names: (&'static str, &'static str),
        open: F,
    ) -> Result<(mpsc::Sender<M>, tonic::Streaming<R>, R), Error>
    where
        M: Clone,
        F: Fn(Channel, tonic::Request<ReceiverStream<M>>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<tonic::Streaming<R>>, tonic::Status>>,
    {
        let token = self.fresh_token().await?;
        let (tx, mut stream) = self
            .members
            .send(Resend::Read, |ch| {
                let (tx, rx) = mpsc::channel(4);
                let req = self.metadata(ReceiverStream::new(rx), false, token.clone());
                let opened = open(ch, req);
                let first = first.clone();
                async move {
                    tx.send(first)
                        .await
                        .map_err(|_| tonic::Status::cancelled("the stream's sender is gone"))?;
                    Ok((tx, opened.await?.into_inner()))
                }
            })
            .await?;
        let answer = tokio::time::timeout(self.opts.timeout, stream.message())
            .await
            .map_err(|_| Error::Deadline(names.1, self.opts.timeout))??
            .ok_or(Error::StreamClosed(names.0))?;
        Ok((tx, stream, answer))
    }

    /// A request carrying `msg` with the client's metadata (and, where `deadline`, its
    /// timeout; a stream's lasts as long as it is used): `token`, its user's, where it has
    /// one ([`Client::fresh_token`]).
    pub(super) fn metadata<T>(
        &self,
        msg: T,
        deadline: bool,
        token: Option<MetadataValue<tonic::metadata::Ascii>>,
    ) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if deadline {
            r.set_timeout(self.opts.timeout);
        }
        if self.opts.require_leader {
            r.metadata_mut().insert("hasleader", MetadataValue::from_static("true"));
        }
        if let Some(t) = token {
            r.metadata_mut().insert("token", t);
        }
        r
    }
}
