//! Generates `include/mpib.h` (the exported ABI: the `ncclnet-types` crate's C types, the
//! exported tables and `mpib_*` functions) with cbindgen, and records the git commit the
//! plugin is built from (`BUILD_GIT_COMMIT`, printed by `init`'s banner; not an `MPIB_*` name:
//! cargo also sets it in the environment of the tests it runs, where the plugin would take
//! it for a misspelt variable).
use std::path::{Path, PathBuf};
use std::process::Command;

/// `git <args>` in `dir`, its trimmed stdout when it succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(dir).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The short commit hash, `-dirty` when tracked files differ from it; "unknown" outside a
/// git checkout (a source tarball, no git installed): the build never fails for it.
fn commit(dir: &Path) -> String {
    let Some(hash) = git(dir, &["rev-parse", "--short=12", "HEAD"]) else { return "unknown".to_string() };
    // Rebuild when HEAD moves: HEAD itself, and the branch it points at (in a worktree the
    // branch lives in the common directory; --git-path knows where).
    for path in ["HEAD", "packed-refs"] {
        if let Some(p) = git(dir, &["rev-parse", "--git-path", path]) {
            println!("cargo:rerun-if-changed={}", dir.join(p).display());
        }
    }
    if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"])
        && let Some(p) = git(dir, &["rev-parse", "--git-path", &r])
    {
        println!("cargo:rerun-if-changed={}", dir.join(p).display());
    }
    let dirty = git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{hash}-dirty") } else { hash }
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={}", commit(&dir));
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
    // NCCL 2.28+ dlclose the plugin after the last communicator's finalize and may load it
    // again; the plugin's threads (the soft fabric's helpers) outlive that call, so its code
    // must stay mapped: dlclose of a NODELETE object unmaps nothing, and a later dlopen
    // finds it loaded (its state is reset by the last finalize, not by unmapping).
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
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
