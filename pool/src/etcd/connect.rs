//! Opening a [`Client`]: its endpoints over plain HTTP/2 or TLS, its user authenticated, and
//! the metadata every request carries (the `hasleader` flag, the user's token, renewed every
//! [`TOKEN_RENEWAL`]).

use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::{
    AuthClient, Client, ConnectOptions, Error, KvClient, LeaseClient, TOKEN_RENEWAL, WatchClient, pb,
};

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
            list.push(ep);
        }
        if list.is_empty() {
            return Err(Error::BadEndpoint(String::new()));
        }
        let channel = Channel::balance_list(list.into_iter());
        let mut c = Client {
            kv: KvClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            auth: AuthClient::new(channel),
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
        let mut r = tonic::Request::new(pb::AuthenticateRequest { name: user.clone(), password });
        r.set_timeout(self.opts.timeout);
        let token = match self.auth.authenticate(r).await {
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

    /// A request carrying `msg` with the client's metadata (and, where `deadline`, its
    /// timeout; a stream's lasts as long as it is used): the token of its user, where it has
    /// one.
    pub(super) async fn request<T>(&mut self, msg: T, deadline: bool) -> Result<tonic::Request<T>, Error> {
        let token = self.fresh_token().await?;
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
        Ok(r)
    }
}
