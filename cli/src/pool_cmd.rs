//! `dxpu pool`: the operators' view of a pool on etcd (`docs/pool.md`).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use pool::{PoolConfig, admin};

/// Options of `dxpu pool`.
#[derive(Args, Debug)]
pub(crate) struct PoolArgs {
    /// etcd endpoints, comma-separated, as URLs or host:port (`10.0.0.2:2379,10.0.0.3:2379`),
    /// as etcdctl takes its `--endpoints`; without the flag, from `DXPU_ETCD_ENDPOINTS`, else
    /// etcdctl's own `ETCDCTL_ENDPOINTS`, else 127.0.0.1:2379.
    #[arg(
        long,
        visible_alias = "endpoints",
        value_delimiter = ',',
        env = "DXPU_ETCD_ENDPOINTS",
        global = true
    )]
    etcd: Vec<String>,
    /// The pool's key prefix.
    #[arg(long, default_value = "/dxpu", global = true)]
    prefix: String,
    /// The CA certificate (PEM) that signed etcd's server certificate: TLS to etcd
    /// (host:port endpoints become https://), as etcdctl's --cacert.
    #[arg(long, env = "ETCDCTL_CACERT", global = true)]
    cacert: Option<std::path::PathBuf>,
    /// This client's certificate (PEM), for an etcd started with --client-cert-auth.
    #[arg(long, env = "ETCDCTL_CERT", global = true)]
    cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "ETCDCTL_KEY", global = true)]
    key: Option<std::path::PathBuf>,
    /// The etcd user, as `name` or `name:password`, for an etcd with authentication on.
    #[arg(long, env = "ETCDCTL_USER", global = true)]
    user: Option<String>,
    /// The user's password, where --user gives none.
    #[arg(long, env = "ETCDCTL_PASSWORD", global = true, hide_env_values = true)]
    password: Option<String>,
    #[command(subcommand)]
    command: PoolCommand,
}

#[derive(Subcommand, Debug)]
enum PoolCommand {
    /// Every device of the pool: box, device, IDs, state (free, claimed, draining,
    /// unhealthy), the host holding it and since when.
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// No new claims on BOX/DEVICE; its current owner keeps it.
    Drain {
        /// The device, as BOX/DEVICE.
        target: String,
    },
    /// Claims on BOX/DEVICE allowed again.
    Undrain {
        /// The device, as BOX/DEVICE.
        target: String,
    },
    /// Deletes the claim on BOX/DEVICE: its box cuts the owner off and resets the device.
    Revoke {
        /// The device, as BOX/DEVICE.
        target: String,
    },
    /// Prints the pool's changes as they happen, until interrupted.
    Watch {
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("dxpu pool: {e}");
    ExitCode::FAILURE
}

/// The endpoints as given, else etcdctl's environment, else etcd's default client address.
fn endpoints(given: &[String], etcdctl: Option<String>) -> Vec<String> {
    if !given.is_empty() {
        return given.to_vec();
    }
    match etcdctl.filter(|e| !e.trim().is_empty()) {
        Some(e) => e.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        None => vec!["127.0.0.1:2379".to_string()],
    }
}

/// The TLS files and the user as the flags give them (`--user name:password` as etcdctl
/// takes it, or `--user name` with `--password`).
fn security(args: &PoolArgs) -> pool::EtcdSecurity {
    let (user, password) = match args.user.as_deref().map(|u| u.split_once(':')) {
        Some(Some((u, p))) => (Some(u.to_string()), Some(p.to_string())),
        Some(None) => (args.user.clone(), args.password.clone()),
        None => (None, args.password.clone()),
    };
    pool::EtcdSecurity {
        cacert: args.cacert.clone(),
        cert: args.cert.clone(),
        key: args.key.clone(),
        user,
        password,
    }
}

pub(crate) fn run(args: PoolArgs) -> ExitCode {
    let given = endpoints(&args.etcd, std::env::var("ETCDCTL_ENDPOINTS").ok());
    let security = security(&args);
    let etcd: Result<Vec<String>, _> = given.iter().map(|e| pool::etcd_url_for(e, security.tls())).collect();
    let etcd = match etcd {
        Ok(e) => e,
        Err(e) => return fail(format!("--etcd: {e}")),
    };
    let mut cfg = PoolConfig::new(etcd);
    cfg.security = security;
    cfg.prefix = args.prefix;
    cfg.request_timeout = std::time::Duration::from_secs(3);
    if let Err(e) = cfg.validate() {
        return fail(format!("--{e}"));
    }
    let r = pool::block_on(async {
        let mut client = pool::connect(&cfg).await?;
        match args.command {
            PoolCommand::Ls { json } => {
                let list = admin::ls(&mut client, &cfg).await?;
                if json {
                    outln!("{}", crate::out::json_pretty(&list));
                } else {
                    print_table(&list);
                }
            }
            PoolCommand::Drain { target } => {
                let (b, d) = admin::parse_target(&target)?;
                admin::drain(&mut client, &cfg, &b, &d).await?;
                outln!("{b}/{d}: draining (no new claims; its owner keeps it)");
            }
            PoolCommand::Undrain { target } => {
                let (b, d) = admin::parse_target(&target)?;
                let was = admin::undrain(&mut client, &cfg, &b, &d).await?;
                outln!("{b}/{d}: {}", if was { "claims allowed again" } else { "was not draining" });
            }
            PoolCommand::Revoke { target } => {
                let (b, d) = admin::parse_target(&target)?;
                match admin::revoke(&mut client, &cfg, &b, &d, &operator("dxpu pool revoke")).await? {
                    admin::Revoked::Claim { host, token } => {
                        outln!("{b}/{d}: claim {token} of {host} revoked")
                    }
                    admin::Revoked::Unreadable { token, why } => {
                        outln!("{b}/{d}: an unreadable claim record (revision {token}: {why}) deleted")
                    }
                    admin::Revoked::Nothing => outln!("{b}/{d}: was not claimed"),
                }
            }
            PoolCommand::Watch { json } => {
                admin::watch(&mut client, &cfg, &mut |c| {
                    if json {
                        outln!("{}", serde_json::to_string(c).unwrap_or_default());
                    } else {
                        let host = c.host.as_deref().map(|h| format!(" ({h})")).unwrap_or_default();
                        outln!("{:>8} {} {} {}/{}{host}", c.revision, c.kind, c.event, c.box_name, c.device);
                    }
                    use std::io::Write;
                    std::io::stdout().flush().is_ok()
                })
                .await?;
            }
        }
        Ok::<(), pool::PoolError>(())
    });
    match r {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) | Err(e) => fail(e),
    }
}

fn print_table(list: &[admin::Entry]) {
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                e.box_name.clone(),
                e.device.clone(),
                format!("{:#06x}", e.vendor_id),
                format!("{:#06x}", e.device_id),
                e.state.clone(),
                e.host.clone().unwrap_or_else(|| "-".into()),
                crate::out::utc(e.since as f64),
            ]
        })
        .collect();
    out!(
        "{}",
        ops::table::table(&["box", "device", "vendor_id", "device_id", "state", "host", "since"], &rows)
    );
}

/// Who runs this `dxpu pool` command, as the pool's records name an operator: the user, the
/// machine, the process and the command.
fn operator(command: &str) -> String {
    let uid = rustix::process::getuid().as_raw();
    let user = ops::caller::user_name(uid).unwrap_or_else(|| format!("uid {uid}"));
    let host = rustix::system::uname().nodename().to_string_lossy().into_owned();
    format!("{user}@{host} pid {} ({command})", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::endpoints;

    #[test]
    fn endpoints_come_from_the_flag_then_etcdctls_environment_then_the_default() {
        let flag = vec!["10.0.0.2:2379".to_string()];
        assert_eq!(endpoints(&flag, Some("10.9.9.9:2379".into())), flag);
        assert_eq!(
            endpoints(&[], Some("http://a:2379, b:2379".into())),
            vec!["http://a:2379".to_string(), "b:2379".to_string()]
        );
        assert_eq!(endpoints(&[], Some(" ".into())), vec!["127.0.0.1:2379".to_string()]);
        assert_eq!(endpoints(&[], None), vec!["127.0.0.1:2379".to_string()]);
    }
}
