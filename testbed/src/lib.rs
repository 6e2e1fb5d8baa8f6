//! dxpu's test bed: the platforms, the driver's suite and the workloads that tests and the
//! experiments (the `lab` crate, the VM's guest program) drive devices with, kept out of the
//! production libraries.
//!
//! - [`direct`]: a device attached directly, with no bridge — the baseline bridged figures
//!   are compared with, and the platform the driver tests run on;
//! - [`concurrent`]: the same, the device on a thread of its own as a GPU beside the CPU
//!   (the baseline of `dxpu loopback` and `bench model`);
//! - [`suite`]: the simgpu driver's checks, generic over the platform, so the same checks run
//!   directly, through the bridges and inside a VM;
//! - [`workload`]: the demo workload `dxpu loopback` runs, and [`workload::Workload`] to
//!   name any of them;
//! - [`ai`]: workloads shaped like AI work (inference, training, data loading);
//! - [`vfio_user_client`]: a vfio-user client, the VMM's side of the protocol, for tests
//!   and `dxpu bench vfio-user` to reach the host endpoint's server without QEMU.
// `unsafe` lives only in the vfio-user client (mapping the memory file it shares).
#![deny(unsafe_code)]

pub mod ai;
pub mod concurrent;
pub mod direct;
pub mod outcome;
pub mod suite;
#[cfg(feature = "vfio-user-client")]
pub mod vfio_user_client;
pub mod workload;
