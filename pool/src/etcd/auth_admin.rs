//! Setting etcd's authentication up, as `etcdctl user add`, `role add`, `role
//! grant-permission`, `user grant-role` and `auth enable` do: what a test needs to run the
//! pool under a user with only its prefix, and what an operator's etcdctl does (docs/pool.md,
//! *A secured etcd*).

use super::{Client, Error, pb, proto};

impl Client {
    /// Adds user `name` with `password`.
    pub async fn user_add(&mut self, name: &str, password: &str) -> Result<(), Error> {
        let req = self
            .request(pb::AuthUserAddRequest { name: name.into(), password: password.into() }, true)
            .await?;
        self.auth.user_add(req).await?;
        Ok(())
    }

    /// Adds role `name`.
    pub async fn role_add(&mut self, name: &str) -> Result<(), Error> {
        let req = self.request(pb::AuthRoleAddRequest { name: name.into() }, true).await?;
        self.auth.role_add(req).await?;
        Ok(())
    }

    /// Lets role `role` read and write every key under `prefix`.
    pub async fn role_grant_prefix(&mut self, role: &str, prefix: &str) -> Result<(), Error> {
        let perm = proto::authpb::Permission {
            perm_type: proto::authpb::permission::Type::Readwrite as i32,
            key: prefix.as_bytes().to_vec(),
            range_end: super::prefix_end(prefix.as_bytes()),
        };
        let req = self
            .request(pb::AuthRoleGrantPermissionRequest { name: role.into(), perm: Some(perm) }, true)
            .await?;
        self.auth.role_grant_permission(req).await?;
        Ok(())
    }

    /// Gives user `user` role `role`.
    pub async fn user_grant_role(&mut self, user: &str, role: &str) -> Result<(), Error> {
        let req =
            self.request(pb::AuthUserGrantRoleRequest { user: user.into(), role: role.into() }, true).await?;
        self.auth.user_grant_role(req).await?;
        Ok(())
    }

    /// Turns authentication on (a user `root` with role `root` must exist).
    pub async fn auth_enable(&mut self) -> Result<(), Error> {
        let req = self.request(pb::AuthEnableRequest {}, true).await?;
        self.auth.auth_enable(req).await?;
        Ok(())
    }
}
