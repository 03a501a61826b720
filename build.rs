//! Generates `include/mpib.h` (the exported ABI: the `ncclnet-types` crate's C types, the
//! exported tables and `mpib_*` functions) with cbindgen.
use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    // The whole source tree, not just lib.rs, or the header goes stale.
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=crates/ncclnet-types/src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    // Every symbol of the plugin must resolve at link time: rdma-mummy-sys declares all of
    // libibverbs but its dlopen stub defines only the verbs it wraps, and an unwrapped one
    // would otherwise give a plugin that fails to dlopen ("undefined symbol: ibv_...").
    // Not under sanitizer builds (cargo fuzz): their runtime symbols are only resolved in
    // the final fuzz executable, never in the cdylib.
    let sanitized = std::env::var("CARGO_ENCODED_RUSTFLAGS").is_ok_and(|f| f.contains("sanitizer"))
        || std::env::var_os("CARGO_CFG_FUZZING").is_some();
    if !sanitized {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,defs");
    }
    let cfg = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    // Only the ABI files: what NCCL (and C tests) see, nothing internal.
    let mut builder = cbindgen::Builder::new().with_config(cfg);
    for f in [
        "crates/ncclnet-types/src/types.rs",
        "crates/ncclnet-types/src/tables.rs",
        "crates/ncclnet-types/src/tables_v9.rs",
        "crates/ncclnet-types/src/mpib.rs",
        "src/abi/versions.rs",
        "src/abi/query.rs",
        "src/abi/stats.rs",
    ] {
        builder = builder.with_src(dir.join(f));
    }
    match builder.generate() {
        // Rewrites the file only when its content changes.
        Ok(b) => {
            b.write_to_file(dir.join("include/mpib.h"));
        }
        // A syntax error comes back here; rustc reports it properly right after.
        Err(e) => println!("cargo:warning=cbindgen failed: {e}"),
    }
}
