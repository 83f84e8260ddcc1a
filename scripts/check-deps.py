#!/usr/bin/env python3
"""Checks that the workspace crates depend on each other only as docs/architecture.md says.

mpa and ddp depend on no workspace crate, rdmap only on mpa and ddp, netdev on none of the
protocol crates; the root package (the library) may use them all; the capture dissector
(iwarp-dissect) only the protocol crates; the command line (iwarp-cli) the library and the
dissector. Normal and build dependencies count;
dev-dependencies (tests, benches) do not.
"""
import json
import subprocess
import sys

ALLOWED = {
    "iwarp-mpa": set(),
    "iwarp-ddp": set(),
    "iwarp-rdmap": {"iwarp-mpa", "iwarp-ddp"},
    "iwarp-netdev": set(),
    "iwarp": {"iwarp-mpa", "iwarp-ddp", "iwarp-rdmap", "iwarp-netdev"},
    "iwarp-dissect": {"iwarp-mpa", "iwarp-ddp", "iwarp-rdmap"},
    "iwarp-cli": {"iwarp", "iwarp-dissect"},
    "iwarp-tests": set(),
}

meta = json.loads(
    subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
)
members = {p["name"] for p in meta["packages"]}
# The sans-IO protocol crates must not pull in I/O runtimes or network stacks.
IO_CRATES = {"tokio", "mio", "smoltcp", "pnet", "socket2", "async-std"}
SANS_IO = {"iwarp-mpa", "iwarp-ddp", "iwarp-rdmap"}
bad = []
for name in sorted(members):
    if name not in ALLOWED:
        bad.append(f"{name}: not listed in scripts/check-deps.py (add its allowed dependencies)")
for pkg in meta["packages"]:
    name = pkg["name"]
    for dep in pkg["dependencies"]:
        if dep["name"] in members and dep.get("kind") != "dev":
            if dep["name"] not in ALLOWED.get(name, set()):
                bad.append(f"{name} must not depend on {dep['name']}")
        if name in SANS_IO and dep["name"] in IO_CRATES and dep.get("kind") != "dev":
            bad.append(f"{name} is sans-IO and must not depend on {dep['name']}")
if bad:
    print("dependency direction check failed:", *bad, sep="\n  ")
    sys.exit(1)
print(f"dependency directions hold for {len(members)} workspace crates")
