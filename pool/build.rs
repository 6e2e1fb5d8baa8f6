//! Generates the etcd client's gRPC code from `proto/` with protox, a protobuf compiler in
//! Rust, so that building dxpu needs a Rust toolchain and nothing else (no `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["etcdserverpb/rpc.proto"], ["proto"])?;
    tonic_prost_build::configure().build_server(false).build_transport(false).compile_fds(fds)?;
    Ok(())
}
