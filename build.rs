//! Build script: generates the Container Storage Interface's gRPC code (`unkai csi`) from the
//! spec's own `csi.proto`, which is not kept in this repository (no fetched code is).
//!
//! The proto comes from the Go module of the spec (github.com/container-storage-interface/spec,
//! the version below), as the Go module proxy serves it: the module cache already holds it
//! where `go install` of csi-sanity (scripts/test.sh) has run; else `go mod download` fetches
//! it. `UNKAI_CSI_PROTO` may name a csi.proto instead. Without either, unkai builds without a
//! CSI driver and `unkai csi` says how to get one (cfg `unkai_csi` unset).
//!
//! Not for: anything but the CSI code (the rest of unkai needs no build step).

use std::path::PathBuf;
use std::process::Command;

/// The CSI spec release the driver is built against (csi-test v5.6.0's, which csi-sanity runs).
const SPEC_MODULE: &str = "github.com/container-storage-interface/spec";
const SPEC_VERSION: &str = "v1.13.0";

fn main() {
    println!("cargo::rustc-check-cfg=cfg(unkai_csi)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=UNKAI_CSI_PROTO");
    let Some(proto) = find_proto() else {
        // Found on a later build once Go is installed.
        println!("cargo::rerun-if-env-changed=PATH");
        println!(
            "cargo::warning=unkai csi left out: the CSI spec's csi.proto was not found (install \
             Go, whose module proxy has {SPEC_MODULE}@{SPEC_VERSION}, or set UNKAI_CSI_PROTO), \
             then rebuild"
        );
        return;
    };
    println!("cargo::rerun-if-changed={}", proto.display());
    let dir = proto
        .parent()
        .expect("a file has a directory")
        .to_path_buf();
    let fds = protox::compile([&proto], [&dir])
        .unwrap_or_else(|e| panic!("compiling {}: {e}", proto.display()));
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The RPCs unkai does not serve answer UNIMPLEMENTED, as the spec asks.
        .generate_default_stubs(true)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the CSI code from {}: {e}", proto.display()));
    println!("cargo::rustc-cfg=unkai_csi");
}

/// `UNKAI_CSI_PROTO`, else the spec's module in Go's module cache (downloaded if Go is here).
fn find_proto() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("UNKAI_CSI_PROTO") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            panic!(
                "UNKAI_CSI_PROTO={} is not a file: give the path of the CSI spec's csi.proto",
                p.display()
            );
        }
        return Some(p);
    }
    let go = |args: &[&str]| -> Option<String> {
        let out = Command::new("go").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let cache = go(&["env", "GOMODCACHE"]).filter(|c| !c.is_empty())?;
    let in_cache = PathBuf::from(&cache)
        .join(format!("{SPEC_MODULE}@{SPEC_VERSION}"))
        .join("csi.proto");
    if in_cache.is_file() {
        return Some(in_cache);
    }
    // Outside a module `go mod download` needs an explicit version; it prints the directory.
    let json = go(&[
        "mod",
        "download",
        "-json",
        &format!("{SPEC_MODULE}@{SPEC_VERSION}"),
    ])?;
    let dir = json.lines().find_map(|l| {
        let l = l.trim().strip_prefix("\"Dir\": \"")?;
        Some(l.trim_end_matches(',').trim_end_matches('"').to_string())
    })?;
    let p = PathBuf::from(dir).join("csi.proto");
    p.is_file().then_some(p)
}
