//! The drop-in's binary interface: sonames and symbol versions (`objdump`), the imports of
//! Debian's rdma-core programs, the C structure layouts against rdma-core's own headers (a C
//! program compiled with them), `ibv_devices` / `ibv_devinfo`, and the C test of the ABI's
//! corners (verbs-abi/tests/c/corners.c).
//!
//! Tools: objdump and cc (binutils, gcc); the rdma-core headers (libibverbs-dev,
//! librdmacm-dev) and programs (ibverbs-utils, rdmacm-utils, perftest), which
//! scripts/test.sh installs. A test whose tools are missing is skipped with a message, or
//! fails under IWARP_REQUIRE_ALL=1.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code panics on failure")]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;
use iwarp_verbs_abi::sys::*;

/// `(node, name)` of every exported name in a version script.
fn parse_map(text: &str) -> Vec<(String, String)> {
    let mut s = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        s.push_str(&rest[..i]);
        rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
    }
    s.push_str(rest);
    let mut out = Vec::new();
    let mut node = String::new();
    let mut global = false;
    for tok in s.split(|c: char| c.is_whitespace() || c == ';').filter(|t| !t.is_empty()) {
        match tok {
            "{" => {}
            "}" => global = false,
            "global:" => global = true,
            "local:" => global = false,
            // A node's name: upper case, with a version number (IBVERBS_1.1, RDMACM_1.0).
            t if !global
                && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                && t.contains('_')
                && t.chars().any(|c| c.is_ascii_digit())
                && t.to_uppercase() == t =>
            {
                node = t.to_string();
            }
            t if global => out.push((node.clone(), t.to_string())),
            _ => {}
        }
    }
    out
}

/// `name -> version` of the functions a library defines (`objdump -T`).
fn defined(lib: &Path) -> BTreeMap<String, String> {
    let out = Command::new("objdump").arg("-T").arg(lib).output().expect("objdump");
    assert!(out.status.success(), "objdump -T {}", lib.display());
    let mut m = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 6 && f.contains(&"DF") && !line.contains("*UND*") {
            let name = f[f.len() - 1].to_string();
            let version = f[f.len() - 2].trim_matches(|c| c == '(' || c == ')').to_string();
            m.insert(name, version);
        }
    }
    m
}

/// `(version, name)` of what a program imports from versioned libraries.
fn imports(program: &Path, prefixes: &[&str]) -> BTreeSet<(String, String)> {
    let out = Command::new("objdump").arg("-T").arg(program).output().expect("objdump");
    let mut s = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if line.contains("*UND*") && f.len() >= 2 {
            let version = f[f.len() - 2].trim_matches(|c| c == '(' || c == ')');
            if prefixes.iter().any(|p| version.starts_with(p)) {
                s.insert((version.to_string(), f[f.len() - 1].to_string()));
            }
        }
    }
    s
}

fn soname(lib: &Path) -> String {
    let out = Command::new("objdump").arg("-p").arg(lib).output().expect("objdump");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("SONAME").map(|s| s.trim().to_string()))
        .unwrap_or_default()
}

fn abi_file(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("abi").join(name)).expect("abi file")
}

#[test]
fn sonames_and_symbol_versions_are_rdma_cores() {
    if !have("objdump") {
        return skip("objdump (binutils)");
    }
    let dir = libdir();
    for (lib, map, private) in [
        ("libibverbs.so.1", "ibverbs.map", Some("IWARP_PRIVATE_1")),
        ("librdmacm.so.1", "rdmacm.map", None),
        ("libmlx5.so.1", "mlx5.map", None),
        ("libefa.so.1", "efa.map", None),
    ] {
        let path = dir.join(lib);
        assert_eq!(soname(&path), lib, "soname of {lib}");
        let want = parse_map(&abi_file(map));
        assert!(want.len() > 1, "{map} parses");
        let have = defined(&path);
        let mut problems = Vec::new();
        for (node, name) in &want {
            match have.get(name) {
                Some(v) if v == node => {}
                Some(v) => problems.push(format!("{name}: version {v}, rdma-core's is {node}")),
                None => problems.push(format!("{name}: not exported (rdma-core: {node})")),
            }
        }
        let names: BTreeSet<&String> = want.iter().map(|(_, n)| n).collect();
        for (name, version) in &have {
            let private_ok = private.is_some_and(|p| version == p && name.starts_with("iwarp_"));
            if !names.contains(name) && !private_ok {
                problems.push(format!("{name}@{version}: exported but not in {map}"));
            }
        }
        assert!(problems.is_empty(), "{lib}:\n  {}", problems.join("\n  "));
    }
    // librdmacm.so.1 forwards to libibverbs.so.1's private entry points.
    let ibverbs = defined(&dir.join("libibverbs.so.1"));
    for (_, name) in parse_map(&abi_file("rdmacm.map")) {
        assert_eq!(
            ibverbs.get(&format!("iwarp_{name}")).map(String::as_str),
            Some("IWARP_PRIVATE_1"),
            "libibverbs.so.1 lacks iwarp_{name}"
        );
    }
}

#[test]
fn debian_programs_find_every_import() {
    if !have("objdump") {
        return skip("objdump (binutils)");
    }
    let dir = libdir();
    let mut exported = BTreeSet::new();
    for lib in ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"] {
        exported.extend(defined(&dir.join(lib)).into_iter().map(|(n, v)| (v, n)));
    }
    let mut checked = 0;
    // Each program, with the argument it is started with to prove that it loads; fi_info
    // (libfabric-bin) stands for libfabric.so.1, whose imports are checked below.
    let programs = [
        ("rping", "--help"),
        ("ib_write_bw", "--help"),
        ("ib_read_bw", "--help"),
        ("ib_send_bw", "--help"),
        ("ibv_devinfo", "--help"),
        ("ibv_devices", "--help"),
        ("fi_info", "--version"),
    ];
    for (program, arg) in programs {
        let Some(path) = which(program) else {
            skip(&format!("{program} (rdmacm-utils, perftest, ibverbs-utils, libfabric-bin)"));
            continue;
        };
        let object = if program == "fi_info" {
            shared_library("libfabric.so.1")
                .expect("fi_info is installed but ldconfig knows no libfabric.so.1")
        } else {
            path.clone()
        };
        let wanted = imports(&object, &["IBVERBS_", "RDMACM_", "MLX5_", "EFA_"]);
        assert!(!wanted.is_empty(), "{} imports nothing from rdma-core?", object.display());
        let missing: Vec<_> = wanted.difference(&exported).collect();
        assert!(missing.is_empty(), "{} imports what the drop-in lacks: {missing:?}", object.display());
        // The program loads (its imports bind at start: Debian links with BIND_NOW, and a
        // missing symbol version fails any load).
        let out = wait_bounded(spawn(dropin_path(&path, &[arg])), Duration::from_secs(10), program);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("symbol lookup error")
                && !err.contains("not found")
                && !err.contains("cannot open"),
            "{program} on the drop-in: {err}"
        );
        checked += 1;
    }
    eprintln!("{checked} programs checked");
}

/// The path `ldconfig -p` gives for the shared library `soname`.
fn shared_library(soname: &str) -> Option<PathBuf> {
    let out = Command::new("ldconfig").arg("-p").output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let (name, path) = l.trim().split_once(" => ")?;
        (name.split_whitespace().next() == Some(soname)).then(|| PathBuf::from(path.trim()))
    })
}

fn which(program: &str) -> Option<PathBuf> {
    let out = Command::new("sh").args(["-c", &format!("command -v {program}")]).output().ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !p.is_empty()).then(|| p.into())
}

fn dropin_path(program: &Path, args: &[&str]) -> Command {
    let mut c = dropin(program.to_str().expect("path"));
    c.args(args);
    c
}

#[test]
fn ibv_devices_and_ibv_devinfo_list_the_device() {
    for p in ["ibv_devices", "ibv_devinfo"] {
        if which(p).is_none() {
            return skip(&format!("{p} (ibverbs-utils)"));
        }
    }
    let out = wait_bounded(spawn(dropin("ibv_devices")), Duration::from_secs(10), "ibv_devices");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("iwarp0") && text.contains("006977fffe617270"), "{text}");

    let out = wait_bounded(spawn(dropin("ibv_devinfo")), Duration::from_secs(10), "ibv_devinfo");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for want in ["hca_id:\tiwarp0", "transport:\t\t\tiWARP (1)", "PORT_ACTIVE (4)", "link_layer:\t\tEthernet"]
    {
        assert!(text.contains(want), "ibv_devinfo lacks {want:?}:\n{text}");
    }
    // -v queries everything, the GIDs included (ibv_query_gid_type, a private symbol).
    let mut v = dropin("ibv_devinfo");
    v.arg("-v");
    let out = wait_bounded(spawn(v), Duration::from_secs(10), "ibv_devinfo -v");
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("max_qp_rd_atom:\t\t\t128") && text.contains("GID[  0]:"), "{text}");

    // A device name from the environment.
    let mut named = dropin("ibv_devices");
    named.env("IWARP_DEVICE", "rnic7");
    let out = wait_bounded(spawn(named), Duration::from_secs(10), "ibv_devices (IWARP_DEVICE)");
    assert!(String::from_utf8_lossy(&out.stdout).contains("rnic7"), "{}", show(&out));
}

/// One size or offset check: the C expression and the value the Rust definition has.
struct Check(String, usize);

macro_rules! size {
    ($v:ident, $c:literal, $t:ty) => {
        $v.push(Check(format!("sizeof({})", $c), size_of::<$t>()));
    };
}

macro_rules! off {
    ($v:ident, $c:literal, $t:ty, $cfield:literal, $($f:tt)+) => {
        $v.push(Check(format!("offsetof({}, {})", $c, $cfield), offset_of!($t, $($f)+)));
    };
}

/// Every size and offset the crate relies on, checked against the C headers.
fn layout_checks() -> Vec<Check> {
    let mut v = Vec::new();
    size!(v, "struct ibv_device", ibv_device);
    off!(v, "struct ibv_device", ibv_device, "node_type", node_type);
    off!(v, "struct ibv_device", ibv_device, "transport_type", transport_type);
    off!(v, "struct ibv_device", ibv_device, "name", name);
    off!(v, "struct ibv_device", ibv_device, "dev_name", dev_name);
    off!(v, "struct ibv_device", ibv_device, "dev_path", dev_path);
    off!(v, "struct ibv_device", ibv_device, "ibdev_path", ibdev_path);
    size!(v, "struct ibv_context", ibv_context);
    off!(v, "struct ibv_context", ibv_context, "device", device);
    off!(v, "struct ibv_context", ibv_context, "ops", ops);
    off!(v, "struct ibv_context", ibv_context, "cmd_fd", cmd_fd);
    off!(v, "struct ibv_context", ibv_context, "async_fd", async_fd);
    off!(v, "struct ibv_context", ibv_context, "num_comp_vectors", num_comp_vectors);
    off!(v, "struct ibv_context", ibv_context, "abi_compat", abi_compat);
    size!(v, "struct ibv_context_ops", ibv_context_ops);
    for (c, o) in [
        ("alloc_mw", offset_of!(ibv_context_ops, alloc_mw)),
        ("bind_mw", offset_of!(ibv_context_ops, bind_mw)),
        ("dealloc_mw", offset_of!(ibv_context_ops, dealloc_mw)),
        ("poll_cq", offset_of!(ibv_context_ops, poll_cq)),
        ("req_notify_cq", offset_of!(ibv_context_ops, req_notify_cq)),
        ("post_srq_recv", offset_of!(ibv_context_ops, post_srq_recv)),
        ("post_send", offset_of!(ibv_context_ops, post_send)),
        ("post_recv", offset_of!(ibv_context_ops, post_recv)),
    ] {
        v.push(Check(format!("offsetof(struct ibv_context_ops, {c})"), o));
    }
    size!(v, "struct verbs_context", verbs_context);
    off!(v, "struct verbs_context", verbs_context, "query_port", query_port);
    off!(v, "struct verbs_context", verbs_context, "query_device_ex", query_device_ex);
    off!(v, "struct verbs_context", verbs_context, "sz", sz);
    off!(v, "struct verbs_context", verbs_context, "context", context);
    size!(v, "struct ibv_device_attr", ibv_device_attr);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "node_guid", node_guid);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "vendor_id", vendor_id);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "vendor_part_id", vendor_part_id);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "max_qp_wr", max_qp_wr);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "max_sge", max_sge);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "max_qp_rd_atom", max_qp_rd_atom);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "max_qp_init_rd_atom", max_qp_init_rd_atom);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "atomic_cap", atomic_cap);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "max_pkeys", max_pkeys);
    off!(v, "struct ibv_device_attr", ibv_device_attr, "phys_port_cnt", phys_port_cnt);
    size!(v, "struct ibv_port_attr", ibv_port_attr);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "active_mtu", active_mtu);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "gid_tbl_len", gid_tbl_len);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "max_msg_sz", max_msg_sz);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "pkey_tbl_len", pkey_tbl_len);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "phys_state", phys_state);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "link_layer", link_layer);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "flags", flags);
    off!(v, "struct ibv_port_attr", ibv_port_attr, "port_cap_flags2", port_cap_flags2);
    size!(v, "union ibv_gid", ibv_gid);
    size!(v, "struct ibv_gid_entry", ibv_gid_entry);
    off!(v, "struct ibv_gid_entry", ibv_gid_entry, "gid_type", gid_type);
    size!(v, "struct ibv_pd", ibv_pd);
    off!(v, "struct ibv_pd", ibv_pd, "handle", handle);
    size!(v, "struct ibv_mr", ibv_mr);
    off!(v, "struct ibv_mr", ibv_mr, "addr", addr);
    off!(v, "struct ibv_mr", ibv_mr, "length", length);
    off!(v, "struct ibv_mr", ibv_mr, "lkey", lkey);
    off!(v, "struct ibv_mr", ibv_mr, "rkey", rkey);
    size!(v, "struct ibv_comp_channel", ibv_comp_channel);
    off!(v, "struct ibv_comp_channel", ibv_comp_channel, "fd", fd);
    off!(v, "struct ibv_comp_channel", ibv_comp_channel, "refcnt", refcnt);
    size!(v, "struct ibv_cq", ibv_cq);
    off!(v, "struct ibv_cq", ibv_cq, "channel", channel);
    off!(v, "struct ibv_cq", ibv_cq, "cq_context", cq_context);
    off!(v, "struct ibv_cq", ibv_cq, "cqe", cqe);
    off!(v, "struct ibv_cq", ibv_cq, "comp_events_completed", comp_events_completed);
    size!(v, "struct ibv_qp", ibv_qp);
    off!(v, "struct ibv_qp", ibv_qp, "qp_context", qp_context);
    off!(v, "struct ibv_qp", ibv_qp, "send_cq", send_cq);
    off!(v, "struct ibv_qp", ibv_qp, "qp_num", qp_num);
    off!(v, "struct ibv_qp", ibv_qp, "state", state);
    off!(v, "struct ibv_qp", ibv_qp, "qp_type", qp_type);
    off!(v, "struct ibv_qp", ibv_qp, "events_completed", events_completed);
    size!(v, "struct ibv_qp_cap", ibv_qp_cap);
    off!(v, "struct ibv_qp_cap", ibv_qp_cap, "max_inline_data", max_inline_data);
    size!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr);
    off!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr, "cap", cap);
    off!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr, "qp_type", qp_type);
    off!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr, "sq_sig_all", sq_sig_all);
    off!(v, "struct ibv_qp_init_attr_ex", ibv_qp_init_attr_ex, "comp_mask", comp_mask);
    off!(v, "struct ibv_qp_init_attr_ex", ibv_qp_init_attr_ex, "pd", pd);
    size!(v, "struct ibv_qp_attr", ibv_qp_attr);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "qp_access_flags", qp_access_flags);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "cap", cap);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "pkey_index", pkey_index);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "max_rd_atomic", max_rd_atomic);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "max_dest_rd_atomic", max_dest_rd_atomic);
    off!(v, "struct ibv_qp_attr", ibv_qp_attr, "port_num", port_num);
    size!(v, "struct ibv_sge", ibv_sge);
    off!(v, "struct ibv_sge", ibv_sge, "length", length);
    off!(v, "struct ibv_sge", ibv_sge, "lkey", lkey);
    size!(v, "struct ibv_send_wr", ibv_send_wr);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "next", next);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "sg_list", sg_list);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "num_sge", num_sge);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "opcode", opcode);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "send_flags", send_flags);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "invalidate_rkey", __bindgen_anon_1.invalidate_rkey);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "wr.rdma.remote_addr", wr.rdma.remote_addr);
    off!(v, "struct ibv_send_wr", ibv_send_wr, "wr.rdma.rkey", wr.rdma.rkey);
    size!(v, "struct ibv_recv_wr", ibv_recv_wr);
    off!(v, "struct ibv_recv_wr", ibv_recv_wr, "num_sge", num_sge);
    size!(v, "struct ibv_wc", ibv_wc);
    off!(v, "struct ibv_wc", ibv_wc, "status", status);
    off!(v, "struct ibv_wc", ibv_wc, "opcode", opcode);
    off!(v, "struct ibv_wc", ibv_wc, "byte_len", byte_len);
    off!(v, "struct ibv_wc", ibv_wc, "invalidated_rkey", __bindgen_anon_1.invalidated_rkey);
    off!(v, "struct ibv_wc", ibv_wc, "qp_num", qp_num);
    off!(v, "struct ibv_wc", ibv_wc, "wc_flags", wc_flags);
    off!(v, "struct ibv_wc", ibv_wc, "dlid_path_bits", dlid_path_bits);
    size!(v, "struct ibv_async_event", ibv_async_event);
    off!(v, "struct ibv_async_event", ibv_async_event, "event_type", event_type);
    size!(v, "struct rdma_event_channel", rdma_event_channel);
    size!(v, "struct rdma_cm_id", rdma_cm_id);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "channel", channel);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "context", context);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "qp", qp);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "route.addr.src_addr", route.addr.__bindgen_anon_1);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "route.addr.dst_addr", route.addr.__bindgen_anon_2);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "ps", ps);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "port_num", port_num);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "event", event);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "send_cq_channel", send_cq_channel);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "send_cq", send_cq);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "recv_cq_channel", recv_cq_channel);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "recv_cq", recv_cq);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "pd", pd);
    off!(v, "struct rdma_cm_id", rdma_cm_id, "qp_type", qp_type);
    size!(v, "struct rdma_cm_event", rdma_cm_event);
    off!(v, "struct rdma_cm_event", rdma_cm_event, "listen_id", listen_id);
    off!(v, "struct rdma_cm_event", rdma_cm_event, "event", event);
    off!(v, "struct rdma_cm_event", rdma_cm_event, "status", status);
    off!(v, "struct rdma_cm_event", rdma_cm_event, "param.conn.private_data", param.conn.private_data);
    off!(
        v,
        "struct rdma_cm_event",
        rdma_cm_event,
        "param.conn.private_data_len",
        param.conn.private_data_len
    );
    off!(
        v,
        "struct rdma_cm_event",
        rdma_cm_event,
        "param.conn.responder_resources",
        param.conn.responder_resources
    );
    off!(v, "struct rdma_cm_event", rdma_cm_event, "param.conn.initiator_depth", param.conn.initiator_depth);
    off!(v, "struct rdma_cm_event", rdma_cm_event, "param.conn.qp_num", param.conn.qp_num);
    size!(v, "struct rdma_conn_param", rdma_conn_param);
    size!(v, "struct rdma_addrinfo", rdma_addrinfo);
    off!(v, "struct rdma_addrinfo", rdma_addrinfo, "ai_src_len", ai_src_len);
    off!(v, "struct rdma_addrinfo", rdma_addrinfo, "ai_src_addr", ai_src_addr);
    off!(v, "struct rdma_addrinfo", rdma_addrinfo, "ai_dst_addr", ai_dst_addr);
    off!(v, "struct rdma_addrinfo", rdma_addrinfo, "ai_next", ai_next);
    v
}

/// Constants the crate uses, against the headers' values.
fn constant_checks() -> Vec<(&'static str, i64)> {
    vec![
        ("IBV_WC_SUCCESS", i64::from(IBV_WC_SUCCESS)),
        ("IBV_WC_WR_FLUSH_ERR", i64::from(IBV_WC_WR_FLUSH_ERR)),
        ("IBV_WC_REM_ACCESS_ERR", i64::from(IBV_WC_REM_ACCESS_ERR)),
        ("IBV_WC_RECV", i64::from(IBV_WC_RECV)),
        ("IBV_WC_RDMA_READ", i64::from(IBV_WC_RDMA_READ)),
        ("IBV_WR_SEND", i64::from(IBV_WR_SEND)),
        ("IBV_WR_RDMA_WRITE", i64::from(IBV_WR_RDMA_WRITE)),
        ("IBV_WR_RDMA_READ", i64::from(IBV_WR_RDMA_READ)),
        ("IBV_WR_SEND_WITH_INV", i64::from(IBV_WR_SEND_WITH_INV)),
        ("IBV_SEND_SIGNALED", i64::from(IBV_SEND_SIGNALED)),
        ("IBV_SEND_INLINE", i64::from(IBV_SEND_INLINE)),
        ("IBV_ACCESS_REMOTE_READ", i64::from(IBV_ACCESS_REMOTE_READ)),
        ("IBV_QPS_ERR", i64::from(IBV_QPS_ERR)),
        ("IBV_QPT_RC", i64::from(IBV_QPT_RC)),
        ("IBV_TRANSPORT_IWARP", i64::from(IBV_TRANSPORT_IWARP)),
        ("IBV_NODE_RNIC", i64::from(IBV_NODE_RNIC)),
        ("IBV_LINK_LAYER_ETHERNET", i64::from(IBV_LINK_LAYER_ETHERNET)),
        ("RDMA_CM_EVENT_ESTABLISHED", i64::from(RDMA_CM_EVENT_ESTABLISHED)),
        ("RDMA_CM_EVENT_DISCONNECTED", i64::from(RDMA_CM_EVENT_DISCONNECTED)),
        ("RDMA_CM_EVENT_CONNECT_REQUEST", i64::from(RDMA_CM_EVENT_CONNECT_REQUEST)),
        ("RDMA_PS_TCP", i64::from(RDMA_PS_TCP)),
        ("RAI_PASSIVE", i64::from(RAI_PASSIVE)),
    ]
}

#[test]
fn layouts_match_rdma_core_headers() {
    if !have("cc") || !have_headers() {
        return skip("cc and the rdma-core headers (libibverbs-dev, librdmacm-dev)");
    }
    let mut c = String::from(
        "/* Generated by verbs-abi/tests/abi.rs: the Rust definitions' sizes and offsets against\n   \
         rdma-core's headers. It compiles only if every one matches. */\n\
         #include <stddef.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\n",
    );
    let checks = layout_checks();
    for Check(expr, value) in &checks {
        writeln!(c, "_Static_assert({expr} == {value}, \"{expr} is {value} in the crate\");").unwrap();
    }
    for (name, value) in constant_checks() {
        writeln!(c, "_Static_assert({name} == {value}, \"{name} is {value} in the crate\");").unwrap();
    }
    c.push_str("\nint main(void) { return 0; }\n");
    let dir = scratch_dir("layout");
    let src = dir.join("layout.c");
    std::fs::write(&src, &c).unwrap();
    let out = Command::new("cc").arg("-std=gnu11").arg("-fsyntax-only").arg(&src).output().expect("cc");
    assert!(
        out.status.success(),
        "the crate's layouts differ from rdma-core's headers ({} checks):\n{}",
        checks.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(checks.len() > 100);
}

/// Compiles the C program `NAME.c` of verbs-abi/tests/c/ against the drop-in libraries.
fn compile_c(name: &str, extra: &[&str]) -> PathBuf {
    let dir = scratch_dir("c");
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("c").join(format!("{name}.c"));
    let mut cc = Command::new("cc");
    cc.args(["-std=gnu11", "-O1", "-g", "-Wall", "-Werror", "-pthread"])
        .args(extra)
        .arg("-o")
        .arg(&exe)
        .arg(src)
        .arg(format!("-L{}", libdir().display()))
        .args(["-lrdmacm", "-libverbs"]);
    if std::env::var_os("IWARP_VERBS_ABI_PRELOAD").is_some() {
        // An instrumented library (scripts/asan.sh): its sanitizer symbols come from the
        // runtime preloaded when the program runs (see `dropin`).
        cc.arg("-Wl,--allow-shlib-undefined");
    }
    let out = cc.output().expect("cc");
    assert!(out.status.success(), "compiling {name}.c: {}", String::from_utf8_lossy(&out.stderr));
    exe
}

#[test]
fn c_abi_corners() {
    if !have("cc") || !have_headers() {
        return skip("cc and the rdma-core headers (libibverbs-dev, librdmacm-dev)");
    }
    let exe = compile_c("corners", &[]);
    let out = wait_bounded(spawn(dropin(exe.to_str().unwrap())), Duration::from_secs(60), "corners");
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success(), "corners.c failed:\n{}", show(&out));
    assert!(!text.contains("not ok"), "{text}");
}

#[test]
fn the_sanitizer_sees_inside_the_library() {
    // Meaningful only with the library built under AddressSanitizer (scripts/asan.sh sets
    // IWARP_VERBS_ABI_PRELOAD to the sanitizer's runtime); elsewhere there is nothing to see.
    if std::env::var_os("IWARP_VERBS_ABI_PRELOAD").is_none() {
        eprintln!("not under AddressSanitizer: nothing to check");
        return;
    }
    if !have("cc") || !have_headers() {
        return skip("cc and the rdma-core headers (libibverbs-dev, librdmacm-dev)");
    }
    let exe = compile_c("asan_canary", &["-Wno-use-after-free"]);
    let out = wait_bounded(spawn(dropin(exe.to_str().unwrap())), Duration::from_secs(60), "asan_canary");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(86), "the canary was not stopped by the sanitizer:\n{}", show(&out));
    assert!(err.contains("heap-use-after-free") && err.contains("ibv_query_device"), "{err}");
}
