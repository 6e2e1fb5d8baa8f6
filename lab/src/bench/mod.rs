//! The benches `dxpu bench` runs: each measures its figures side by side in one run, says its
//! rows as it measures them, and gives the report `--json` prints (docs/cli.md). The command
//! line's options are the binary's; what they ask for is each bench's options type here.

pub mod bridge;
pub mod link;
#[cfg(feature = "plot")]
pub mod model;
pub mod simgpu;
pub mod vfio_user;
