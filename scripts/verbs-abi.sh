#!/usr/bin/env bash
# Builds the drop-in verbs libraries (verbs-abi/) and puts them in one directory, ready for
# LD_LIBRARY_PATH: libibverbs.so.1 (the crate's cdylib), librdmacm.so.1, and the
# libmlx5.so.1 / libefa.so.1 stubs perftest needs at load time, with the unversioned
# libibverbs.so / librdmacm.so names for programs that dlopen those.
#
#   bash scripts/verbs-abi.sh [--release] [DIR]       (DIR: target/verbs-abi/<profile>)
#   LD_LIBRARY_PATH=DIR rping -s -a 127.0.0.1 -C 10
#
# Prints the directory on its last line.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROFILE=debug
ARGS=()
if [ "${1:-}" = "--release" ]; then
  PROFILE=release
  ARGS+=(--release)
  shift
fi
DIR="${1:-$ROOT/target/verbs-abi/$PROFILE}"
cd "$ROOT"
JSON="$(cargo build -p iwarp-verbs-abi --locked "${ARGS[@]}" --message-format=json-render-diagnostics)"
read -r SO OUT < <(printf '%s\n' "$JSON" | python3 -c '
import json, sys
so = out = None
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if "iwarp-verbs-abi" not in m.get("package_id", "") and "verbs-abi" not in m.get("package_id", ""):
        continue
    if m.get("reason") == "compiler-artifact" and "cdylib" in m["target"]["kind"]:
        so = next(f for f in m["filenames"] if f.endswith(".so"))
    if m.get("reason") == "build-script-executed":
        out = m["out_dir"]
print(so, out)
')
[ -f "$SO" ] && [ -d "$OUT" ] || { echo "verbs-abi.sh: build outputs not found" >&2; exit 1; }
mkdir -p "$DIR"
install -m 0755 "$SO" "$DIR/libibverbs.so.1"
for lib in librdmacm.so.1 libmlx5.so.1 libefa.so.1; do
  install -m 0755 "$OUT/$lib" "$DIR/$lib"
done
ln -sf libibverbs.so.1 "$DIR/libibverbs.so"
ln -sf librdmacm.so.1 "$DIR/librdmacm.so"
echo "$DIR"
