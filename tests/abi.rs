//! The plugin as NCCL sees it: the C header compiles, a C program loads the built library
//! with dlopen/dlsym exactly as NCCL does and checks every layout against the reference
//! numbers, and the library exports nothing but the plugin symbols.

mod common;

use std::process::Command;

use common::{cdylib, compile_c, run_loader, tmpdir};

#[test]
fn c_header_compiles_and_matches_reference_sizes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-c", "-o"])
        .arg(tmpdir("header").join("header_check.o"))
        .arg("-I")
        .arg(format!("{root}/include"))
        .arg(format!("{root}/tests/c/header_check.c"))
        .output()
        .expect("run cc");
    assert!(out.status.success(), "header_check.c failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn exports_only_the_plugin_tables() {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(cdylib()).output().expect("run nm");
    assert!(out.status.success());
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    names.sort();
    let mut want: Vec<String> = (6..=12).map(|v| format!("ncclNetPlugin_v{v}")).collect();
    want.extend(common::EXPORTED_FUNCTIONS.iter().map(|s| s.to_string()));
    want.sort();
    assert_eq!(names, want, "the library must export exactly the plugin tables and mpib_* functions");
}

#[test]
fn no_link_time_dependency_on_rdma_libraries() {
    let out = Command::new("readelf").arg("-d").arg(cdylib()).output().expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    let needed: Vec<&str> = text.lines().filter(|l| l.contains("(NEEDED)")).collect();
    assert!(!needed.is_empty(), "readelf printed no NEEDED lines:\n{text}");
    for l in &needed {
        assert!(!l.contains("ibverbs") && !l.contains("rdmacm") && !l.contains("mlx5"), "{l}");
    }
}

#[test]
fn the_library_stays_mapped_when_nccl_unloads_it_and_loads_again() {
    let out = Command::new("readelf").arg("-d").arg(cdylib()).output().expect("run readelf");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(|l| l.contains("FLAGS_1") && l.contains("NODELETE")),
        "linked without -z nodelete: its helper threads would run unmapped code after dlclose\n{text}"
    );
    let reload = compile_c("reload", &["tests/c/reload.c"], &["-ldl"]);
    let (_, env) = common::device_mode();
    let r = Command::new(&reload).arg(cdylib()).arg("4").envs(env).output().expect("run reload");
    let text = format!("{}{}", String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    assert!(r.status.success() && text.contains("PASS"), "{text}");
}

#[test]
fn loader_without_a_usable_device_fails_init_clearly() {
    // verbs is asked for, and this build/host cannot provide it: init fails, NCCL falls back.
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (ok, out) = run_loader(&loader, cdylib().to_str().unwrap(), "nodev", &[("MPIB_FABRIC", "verbs")]);
    assert!(ok, "{out}");
}

#[test]
fn verbs_are_resolved_at_run_time_not_link_time() {
    // rdma-mummy-sys's stub dlopens libibverbs: no undefined ibv_* symbol may reach ld.so.
    let out = Command::new("nm").args(["-D", "--undefined-only"]).arg(cdylib()).output().expect("run nm");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let ibv: Vec<&str> = text.lines().filter(|l| l.contains("ibv_") || l.contains("rdma_")).collect();
    assert!(ibv.is_empty(), "undefined RDMA symbols: {ibv:?}");
    let defined = Command::new("nm").arg(cdylib()).output().expect("run nm");
    assert!(
        String::from_utf8_lossy(&defined.stdout).contains("ibv_get_device_list"),
        "the verbs provider is linked in (its stub defines ibv_get_device_list locally)"
    );
}

#[test]
fn loader_with_a_bad_environment_fails_init_clearly() {
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (ok, out) = run_loader(&loader, cdylib().to_str().unwrap(), "badenv", &[("MPIB_SPLIT", "sideways")]);
    assert!(ok, "{out}");
    assert!(out.contains("MPIB_SPLIT=\"sideways\" is not valid"), "{out}");
}

#[test]
fn loader_through_every_version() {
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (mode, env) = common::device_mode();
    let (ok, out) = run_loader(&loader, cdylib().to_str().unwrap(), mode, &env);
    assert!(ok, "{out}");
    assert_eq!(out.matches(": init -> ").count(), 7, "{out}");
}

#[test]
fn loader_banner_names_version_commit_and_both_rails() {
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (mode, mut env) = common::device_mode();
    env.push(("NCCL_DEBUG", "INFO"));
    let (ok, out) = run_loader(&loader, cdylib().to_str().unwrap(), mode, &env);
    assert!(ok, "{out}");
}

#[test]
fn loader_fuses_the_nics_as_nccl_does() {
    // MPIB_NCCL_DEVICES=nics shows the soft fabric's two "NICs" through v9+; the loader reads
    // the NCCL_NET_FORCE_MERGE the plugin published and calls makeVDevice as NCCL does.
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (_, mut env) = common::device_mode();
    env.extend([("MPIB_NCCL_DEVICES", "nics"), ("NCCL_DEBUG", "INFO")]);
    let (ok, out) = run_loader(&loader, cdylib().to_str().unwrap(), "nics", &env);
    assert!(ok, "{out}");
    assert!(out.contains("v12 fused dev "), "{out}");
    assert!(out.contains("name=soft-sout+soft-sup"), "{out}");
}

#[test]
fn loads_by_nccl_name_from_the_library_path() {
    // NCCL_NET_PLUGIN=mpib makes NCCL dlopen("libnccl-net-mpib.so") through ld.so.
    let dir = tmpdir("byname");
    let link = dir.join("libnccl-net-mpib.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(cdylib(), &link).unwrap();
    let loader = compile_c("loader", &["tests/c/loader.c"], &["-ldl"]);
    let (mode, mut env) = common::device_mode();
    let lib_path = dir.to_str().unwrap().to_string();
    env.push(("LD_LIBRARY_PATH", Box::leak(lib_path.into_boxed_str())));
    let (ok, out) = run_loader(&loader, "libnccl-net-mpib.so", mode, &env);
    assert!(ok, "{out}");
}
