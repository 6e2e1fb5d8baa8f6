//! Setting etcd's authentication up, as `etcdctl user add`, `role add`, `role
//! grant-permission`, `user grant-role` and `auth enable` do: what a test needs to run the
//! pool under a user with only its prefix, and what an operator's etcdctl does (docs/pool.md,
//! *A secured etcd*).

use super::{AuthClient, Client, Error, Resend, pb, proto};

impl Client {
    /// Adds user `name` with `password`.
    pub async fn user_add(&mut self, name: &str, password: &str) -> Result<(), Error> {
        self.unary(
            pb::AuthUserAddRequest { name: name.into(), password: password.into() },
            Resend::Write,
            |ch, req| async { AuthClient::new(ch).user_add(req).await },
        )
        .await?;
        Ok(())
    }

    /// Adds role `name`.
    pub async fn role_add(&mut self, name: &str) -> Result<(), Error> {
        self.unary(pb::AuthRoleAddRequest { name: name.into() }, Resend::Write, |ch, req| async {
            AuthClient::new(ch).role_add(req).await
        })
        .await?;
        Ok(())
    }

    /// Lets role `role` read and write every key under `prefix`.
    pub async fn role_grant_prefix(&mut self, role: &str, prefix: &str) -> Result<(), Error> {
        let perm = proto::authpb::Permission {
            perm_type: proto::authpb::permission::Type::Readwrite as i32,
            key: prefix.as_bytes().to_vec(),
            range_end: super::prefix_end(prefix.as_bytes()),
        };
        self.unary(
            pb::AuthRoleGrantPermissionRequest { name: role.into(), perm: Some(perm) },
            Resend::Write,
            |ch, req| async { AuthClient::new(ch).role_grant_permission(req).await },
        )
        .await?;
        Ok(())
    }

    /// Gives user `user` role `role`.
    pub async fn user_grant_role(&mut self, user: &str, role: &str) -> Result<(), Error> {
        self.unary(
            pb::AuthUserGrantRoleRequest { user: user.into(), role: role.into() },
            Resend::Write,
            |ch, req| async { AuthClient::new(ch).user_grant_role(req).await },
        )
        .await?;
        Ok(())
    }

    /// Turns authentication on (a user `root` with role `root` must exist).
    pub async fn auth_enable(&mut self) -> Result<(), Error> {
        self.unary(pb::AuthEnableRequest {}, Resend::Write, |ch, req| async {
            AuthClient::new(ch).auth_enable(req).await
        })
        .await?;
        Ok(())
    }
}
