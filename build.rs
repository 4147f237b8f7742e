//! Compiles `proto/` with protox (pure Rust: no system `protoc`) and writes the descriptor set
//! to OUT_DIR for server reflection.

use std::{env, fs, path::PathBuf};

use protox::prost::Message as _;

const PROTOS: &[&str] = &[
    "proto/mayfly/v1/admin.proto",
    "proto/mayfly/v1/database.proto",
    "proto/mayfly/v1/collection.proto",
    "proto/mayfly/v1/document.proto",
    "proto/mayfly/v1/service.proto",
];

/// Served by reflection only (no code is generated from it): the `google.rpc.ErrorInfo` every
/// error carries, so that grpcurl shows its reason instead of raw bytes.
const REFLECTED: &str = "google/rpc/error_details.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/mayfly");
    println!("cargo:rerun-if-changed=proto/{REFLECTED}");
    let mut reflected: Vec<String> = PROTOS.iter().map(|p| (*p).to_owned()).collect();
    reflected.push(format!("proto/{REFLECTED}"));
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(
        out_dir.join("mayfly_descriptor.bin"),
        protox::compile(&reflected, ["proto"])?.encode_to_vec(),
    )?;
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure()
        // Bodies decode straight into JSON with Mayfly's own depth limit (prost's recursion
        // limit of 100 would cap documents at ~33 levels; SPEC allows 128).
        .extern_path(".google.protobuf.Struct", "crate::json::JsonObject")
        // Patch values, query parameters and partition keys likewise: one depth limit for
        // every JSON-carrying field (prost's would stop a Value at ~32 levels of objects).
        .extern_path(".google.protobuf.Value", "crate::json::JsonValue")
        // Query results are encoded from JSON and decoded into JSON, without a
        // prost_types::Value tree in between (see src/query_page.rs).
        .extern_path(".mayfly.v1.QueryPage", "crate::query_page::QueryPage")
        // Undecodable requests are INVALID_ARGUMENT, not tonic's INTERNAL.
        .codec_path("crate::codec::MayflyCodec")
        .compile_fds(fds)?;
    Ok(())
}
