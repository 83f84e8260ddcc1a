#!/usr/bin/env bash
# Hunts rare stalls (lost wake-ups) by running one `iwarp` command over and over.
#
#   scripts/stall-hunt.sh [-j LOOPS] [-s SECONDS] [-t STALL_SECONDS] [-o DIR] -- IWARP_ARGS...
#
# Runs LOOPS (default 3) loops of `target/debug/iwarp IWARP_ARGS...` side by side for SECONDS
# (default 300), each run on its own. A run still going after STALL_SECONDS (default 4) is
# taken for stalled: its sockets (`ss -tnpie`, the run's own lines: look at Recv-Q, bytes in
# a socket nobody reads) and, where gdb is installed, every thread's stack are saved under DIR
# (default target/stall-hunt/<time>), and the run is left to end on its own (attaching gdb
# interrupts the threads' `epoll_wait`, which may itself end the stall; the run is killed at
# 60 s). At the end it prints the runs, the stalls and the failures, and exits 1 if there
# was a stall or a failure.
#
# The debug build is the default because its slower passes widen race windows; it is built
# first. Several loops on a 2-core machine put the threads under the load that finds the
# races: 3 loops of the Send ping-pong below found a stall in about one run in 70 before the
# fix in `Engine::let_go_quietly` (see docs/architecture.md, "The engine thread never sleeps
# on the core's lock").
#
#   scripts/stall-hunt.sh -- bench --ops send --sizes 64 --iters 3000 --window 1 --qps 3 --json --quiet
#
# Bounded and clean: every run has a deadline, and on exit (also Ctrl-C or a TERM) the loops
# and their runs are killed by PID.
set -euo pipefail
cd "$(dirname "$0")/.."

loops=3
secs=300
stall=4
out=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        -j) loops="$2"; shift 2 ;;
        -s) secs="$2"; shift 2 ;;
        -t) stall="$2"; shift 2 ;;
        -o) out="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "stall-hunt: unknown option '$1' (usage: stall-hunt.sh [-j N] [-s S] [-t T] [-o DIR] -- ARGS...)" >&2; exit 2 ;;
    esac
done
for v in "$loops" "$secs" "$stall"; do
    if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
        echo "stall-hunt: -j, -s and -t take a whole number above 0, not '$v'" >&2
        exit 2
    fi
done
if [[ $# -eq 0 ]]; then
    echo "stall-hunt: no iwarp arguments after --" >&2
    exit 2
fi
out="${out:-target/stall-hunt/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out"
cargo build -q -p iwarp-cli
bin="$PWD/target/debug/iwarp"

# One loop: runs the command until the time is up; writes "runs stalls failures" to its file.
hunt() {
    local id="$1" end=$((SECONDS + secs)) runs=0 stalls=0 fails=0
    shift
    while [[ $SECONDS -lt $end ]]; do
        runs=$((runs + 1))
        "$bin" "$@" > /dev/null 2> "$out/err.$id" &
        local pid=$! ticks=0 caught=0
        while kill -0 "$pid" 2> /dev/null; do
            sleep 0.2
            ticks=$((ticks + 1))
            if [[ $caught -eq 0 && $ticks -ge $((stall * 5)) ]]; then
                caught=1
                stalls=$((stalls + 1))
                local d="$out/stall.$id.$runs"
                mkdir -p "$d"
                ss -tnpie 2> /dev/null | grep "pid=$pid," > "$d/sockets.txt" || true
                if command -v gdb > /dev/null; then
                    timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt" > "$d/stacks.txt" 2>&1 || true
                fi
                echo "stall: loop $id run $runs (pid $pid): $d"
            fi
            if [[ $ticks -ge 300 ]]; then
                kill -9 "$pid" 2> /dev/null || true
            fi
        done
        if ! wait "$pid"; then
            fails=$((fails + 1))
            cp "$out/err.$id" "$out/failed.$id.$runs"
            echo "failed: loop $id run $runs: $(grep -m1 . "$out/err.$id")"
            # A first run that fails is most likely a mistake in the arguments.
            [[ $runs -eq 1 ]] && break
        fi
    done
    echo "$runs $stalls $fails" > "$out/count.$id"
}

pids=()
cleanup() {
    for p in "${pids[@]}"; do
        # The loop's runs first (children of the loop's subshell), then the loop.
        pkill -9 -P "$p" 2> /dev/null || true
        kill -9 "$p" 2> /dev/null || true
    done
}
trap cleanup EXIT
trap 'echo "stall-hunt: stopped" >&2; exit 130' INT TERM
for id in $(seq 1 "$loops"); do
    hunt "$id" "$@" &
    pids+=($!)
done
for p in "${pids[@]}"; do
    wait "$p" || true
done
pids=()
read -r runs stalls fails < <(cat "$out"/count.* | awk '{r += $1; s += $2; f += $3} END {print r, s, f}')
echo "stall-hunt: $runs runs, $stalls stalled past ${stall} s, $fails failed (details in $out)"
[[ $stalls -eq 0 && $fails -eq 0 ]]
