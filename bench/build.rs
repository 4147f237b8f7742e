//! Compiles the vendored slice of etcd's v3 API (`proto/etcd_minimal.proto`) with protox (pure
//! Rust: no system `protoc`) into tonic clients for the etcd workloads.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["proto/etcd_minimal.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
