//! `iwarp devices` and `iwarp bench --device`: the device list, and a device measured
//! through the backend seam beside the engine.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test helpers panic on broken fixtures")]

mod common;

use common::{iwarp, stderr};

#[test]
fn devices_lists_the_engine_first_with_every_capability() {
    let o = iwarp(&["devices", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let first = &v.as_array().unwrap()[0];
    assert_eq!(first["name"], "iwarp", "{v}");
    assert_eq!(first["iwarp"], true, "{v}");
    for cap in ["immediate", "atomics", "private_data", "reject", "cq_notify", "srq", "memory_windows"] {
        assert_eq!(first[cap], true, "{cap}: {v}");
    }
    // Every other row is an rdma-core device; without any, stderr says why.
    if v.as_array().unwrap().len() == 1 {
        assert!(stderr(&o).contains("no rdma-core devices"), "{}", stderr(&o));
    }
}

#[test]
fn devices_table_names_the_engine() {
    let o = iwarp(&["devices"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8(o.stdout).unwrap();
    assert!(text.lines().nth(1).unwrap().starts_with("iwarp "), "{text}");
}

#[test]
fn bench_device_measures_the_device_beside_the_engine() {
    // The engine named as the device: both columns come from the seam, so the run checks
    // the measurement itself on any host.
    let o =
        iwarp(&["bench", "--device", "iwarp", "--sizes", "4k", "--duration", "0.05", "--json", "--quiet"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for op in ["write", "read", "send"] {
        let r = rows.iter().find(|r| r["op"] == op).unwrap_or_else(|| panic!("{op}: {v}"));
        for key in ["device_bytes_per_s", "engine_bytes_per_s", "bandwidth_ratio", "rate_ratio"] {
            assert!(r[key].as_f64().unwrap() > 0.0, "{op} {key}: {r}");
        }
    }
}

#[test]
fn bench_device_that_does_not_exist_fails_cleanly() {
    let o = iwarp(&["bench", "--device", "nosuch0", "--sizes", "4k", "--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("nosuch0"), "{}", stderr(&o));
}
