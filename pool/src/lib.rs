//! The pool: GPUs in boxes, registered in etcd, claimed by hosts, fenced (`docs/pool.md`).
//!
//! This is the control plane; the datapath crates do not depend on it. The box side
//! ([`BoxAgent`]) registers each exported device under a lease it keeps alive and watches the
//! claims on its devices; the endpoint asks it (through `bridge_gpu::ClaimCheck`) whether an
//! attach's fencing token is the claim etcd holds. The host side ([`HostAgent`]) claims free
//! devices with transactions tied to its own lease, hands each claim to its endpoint to
//! attach, and raises a fence on every pool device before its lease could expire when it
//! cannot renew it. [`admin`] is what `dxpu pool` runs. Every client reaches etcd as
//! [`EtcdSecurity`] says: TLS with a CA and a client certificate, an etcd user (`security`;
//! [`pki`] makes a test CA, [`cluster`] runs a real etcd for the tests).
//!
//! Keys, under a prefix (`/dxpu` by default):
//!
//! | key | value | lease |
//! |---|---|---|
//! | `{prefix}/devices/{box}/{device}` | [`DeviceRecord`] | the box's |
//! | `{prefix}/claims/{box}/{device}` | [`ClaimRecord`] | the claiming host's |
//! | `{prefix}/drain/{box}/{device}` | [`DrainRecord`] | none (an operator's) |
//!
//! A claim's fencing token is its `create_revision`: etcd's revision counter only grows, so
//! a later claim on the same device always has a larger token.
#![forbid(unsafe_code)]

pub mod admin;
mod box_agent;
mod claim;
mod claim_table;
mod client;
pub mod cluster;
mod config;
mod error;
pub mod etcd;
mod host_agent;
mod keys;
pub mod pki;
mod records;
mod security;
mod stats;
pub mod storm;

pub use box_agent::{BoxAgent, ClaimTable};
pub use claim::{
    Claim, ClaimRequest, Filter, RecordCache, RoundTrips, Snapshot, claim_one, release, snapshot,
};
pub(crate) use client::runtime;
pub use client::{Backoff, block_on, connect};
pub use config::{ConfigError, PoolConfig, etcd_url, etcd_url_for};
pub use error::PoolError;
pub(crate) use error::etcd_error;
pub use host_agent::{FenceFn, HostAgent, HostAgentOptions, HostEvent, fence_margin};
pub use keys::{Keys, valid_name};
pub use records::{BoxRecord, ClaimRecord, DeviceRecord, DrainRecord, RevocationRecord};
pub(crate) use records::{decode, encode, unix_now, unix_now_nanos, warn_bad_record};
pub use security::{EtcdSecurity, SecurityError};
pub use stats::{AgentCounts, AgentStats};
