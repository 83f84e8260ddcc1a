#![allow(clippy::expect_used, reason = "a build script fails with the message")]

//! Builds the small shared libraries that sit beside the crate's cdylib (libibverbs.so.1):
//!
//! - `librdmacm.so.1`: one forwarding jump per rdma_cm function (RDMACM_1.0 .. 1.3, the
//!   version script `abi/rdmacm.map`) to `iwarp_<name>@IWARP_PRIVATE_1` in libibverbs.so.1,
//!   where the connection manager lives with the engine it drives. Written in assembly so
//!   that it needs no prototypes and adds nothing to a call.
//! - `libmlx5.so.1` and `libefa.so.1`: stubs for the provider functions perftest imports
//!   (`abi/stubs.c`, `abi/mlx5.map`, `abi/efa.map`).
//!
//! librdmacm.so.1 is linked against a link-time stand-in of libibverbs.so.1 (same soname,
//! the `iwarp_*` symbols as empty functions), so that it records the dependency and the
//! versioned references without waiting for the crate itself. The outputs go to `OUT_DIR`,
//! whose path the crate gets as `IWARP_VERBS_ABI_LIBS`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::{env, fs};

/// The version node of the private entry points librdmacm.so.1 forwards to.
const PRIVATE_NODE: &str = "IWARP_PRIVATE_1";

/// The exported names of a version script (`name;` lines in `global:` sections).
fn exported(map: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut global = false;
    for line in map.lines() {
        let line = line.trim();
        if line.starts_with("global:") {
            global = true;
        } else if line.starts_with("local:") || line.starts_with('}') {
            global = false;
        }
        let word = line.trim_start_matches("global:").trim();
        if global
            && let Some(name) = word.strip_suffix(';')
            && !name.is_empty()
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            out.push(name.to_string());
        }
    }
    out
}

/// An assembly function body that jumps to `target` (through the PLT).
fn jump(arch: &str, target: &str) -> String {
    match arch {
        "x86_64" => format!("\tjmp {target}@PLT\n"),
        "aarch64" => format!("\tb {target}\n"),
        other => panic!("verbs-abi: no forwarding stubs for target architecture {other}"),
    }
}

/// An assembly function body that returns.
fn ret(arch: &str) -> &'static str {
    match arch {
        "x86_64" => "\tret\n",
        "aarch64" => "\tret\n",
        other => panic!("verbs-abi: no stubs for target architecture {other}"),
    }
}

/// Assembly defining `names`, each with `body(name)`.
fn functions(names: &[String], body: impl Fn(&str) -> String) -> String {
    let mut s = String::from("\t.text\n");
    for name in names {
        s.push_str(&format!(
            "\t.globl {name}\n\t.type {name}, %function\n\t.p2align 4\n{name}:\n{}\t.size {name}, .-{name}\n",
            body(name)
        ));
    }
    s.push_str("\t.section .note.GNU-stack,\"\",%progbits\n");
    s
}

fn cc(args: &[&str]) {
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let status = Command::new(&compiler)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("verbs-abi: cannot run the C compiler {compiler}: {e}"));
    assert!(status.success(), "verbs-abi: {compiler} {} failed", args.join(" "));
}

fn path(p: &Path) -> &str {
    p.to_str().expect("verbs-abi: a build path that is not UTF-8")
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("CARGO_CFG_TARGET_ARCH");
    let abi = manifest.join("abi");
    for f in ["rdmacm.map", "mlx5.map", "efa.map", "stubs.c"] {
        println!("cargo:rerun-if-changed=abi/{f}");
    }
    println!("cargo:rerun-if-env-changed=CC");

    // The link-time stand-in of libibverbs.so.1.
    let rdmacm_map = abi.join("rdmacm.map");
    let names = exported(&fs::read_to_string(&rdmacm_map).expect("abi/rdmacm.map"));
    assert!(names.len() > 60, "verbs-abi: abi/rdmacm.map lists only {} functions", names.len());
    let private: Vec<String> = names.iter().map(|n| format!("iwarp_{n}")).collect();
    let stub_dir = out.join("link-stub");
    fs::create_dir_all(&stub_dir).expect("create link-stub");
    let stub_s = stub_dir.join("stub.S");
    fs::write(&stub_s, functions(&private, |_| ret(&arch).to_string())).expect("write stub.S");
    let stub_map = stub_dir.join("stub.map");
    fs::write(&stub_map, format!("{PRIVATE_NODE} {{ global: iwarp_*; local: *; }};\n"))
        .expect("write stub.map");
    let stub_so = stub_dir.join("libibverbs.so.1");
    cc(&[
        "-shared",
        "-nostdlib",
        "-o",
        path(&stub_so),
        path(&stub_s),
        "-Wl,-soname,libibverbs.so.1",
        &format!("-Wl,--version-script={}", path(&stub_map)),
    ]);

    // librdmacm.so.1: a jump per function.
    let fwd_s = out.join("rdmacm-forward.S");
    fs::write(&fwd_s, functions(&names, |n| jump(&arch, &format!("iwarp_{n}")))).expect("write forwarders");
    cc(&[
        "-shared",
        "-nostdlib",
        "-o",
        path(&out.join("librdmacm.so.1")),
        path(&fwd_s),
        path(&stub_so),
        "-Wl,-soname,librdmacm.so.1",
        &format!("-Wl,--version-script={}", path(&rdmacm_map)),
        "-Wl,-z,now",
        "-Wl,--no-undefined",
    ]);

    // The provider stubs perftest needs at load time.
    for (lib, map) in [("libmlx5.so.1", "mlx5.map"), ("libefa.so.1", "efa.map")] {
        cc(&[
            "-shared",
            "-fPIC",
            "-O2",
            "-o",
            path(&out.join(lib)),
            path(&abi.join("stubs.c")),
            &format!("-Wl,-soname,{lib}"),
            &format!("-Wl,--version-script={}", path(&abi.join(map))),
        ]);
    }
    // libibverbs.so.1 itself (the crate's cdylib): its soname, and the version nodes the
    // crate's `.symver` directives name (declared here; the linker takes each symbol's node
    // from the directive).
    let nodes = out.join("ibverbs-nodes.map");
    let mut script = String::new();
    let mut parent: Option<String> = None;
    for minor in 0..=14 {
        let node = format!("IBVERBS_1.{minor}");
        match &parent {
            Some(p) => script.push_str(&format!("{node} {{ }} {p};\n")),
            None => script.push_str(&format!("{node} {{ }};\n")),
        }
        parent = Some(node);
    }
    script.push_str("IBVERBS_PRIVATE_34 { };\n");
    script.push_str(&format!("{PRIVATE_NODE} {{ }};\n"));
    fs::write(&nodes, script).expect("write ibverbs-nodes.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", path(&nodes));
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-env=IWARP_VERBS_ABI_LIBS={}", path(&out));
}
