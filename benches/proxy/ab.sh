#!/usr/bin/env bash
# A/B of two cargo-mcp-dev binaries in one run: `benches/proxy/ab.sh NEW_BIN OLD_BIN`.
#
# Both run side by side (`run` and `run-b`) with the relay and the audit-relay (writing, and
# copying into a mapped file: mmap-relay), taking turns call
# by call, pinned to one core (taskset), in ROUNDS separate runs of the latency, spaced and throughput
# phases. A shared machine's noise moves all variants alike, so compare run with run-b within a
# line, not lines with each other. One summary line per round on stdout; each round's report in
# $WORK/ab-<round>.md. Knobs: CALLS (20000), PIPELINED (20000), SPACED (200 calls, each after
# SPACED_GAP_MS = 50 ms of quiet), ROUNDS (2), PIN_CPU (last core),
# WORK (default $TMPDIR/cargo-mcp-dev-proxy-ab).
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: benches/proxy/ab.sh NEW_BIN OLD_BIN" >&2
  exit 2
fi
new="$(realpath "$1")"; old="$(realpath "$2")"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
CARGO_TARGET_DIR="$root/target/bench-proxy" cargo build --release --offline \
  --manifest-path "$here/Cargo.toml" >&2
bench="$root/target/bench-proxy/release/proxy-bench"
CALLS="${CALLS:-20000}"; PIPELINED="${PIPELINED:-20000}"; ROUNDS="${ROUNDS:-2}"
SPACED="${SPACED:-200}"; SPACED_GAP_MS="${SPACED_GAP_MS:-50}"
PIN_CPU="${PIN_CPU:-$(( $(nproc) - 1 ))}"
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-proxy-ab}"
mkdir -p "$WORK"
# Columns of the report's tables: variant, then the figure.
pick() { # file, section start, section end, column
  sed -n "/$2/,/$3/p" "$1" | grep -E '^\| (relay|run|audit-relay|mmap-relay|seal-relay|run-b) \|' \
    | awk -F'|' -v c="$4" '{gsub(/ /, "", $2); gsub(/ /, "", $c); printf "%s %s  ", $2, $c}'
}
for r in $(seq "$ROUNDS"); do
  out="$WORK/ab-$r.md"
  taskset -c "$PIN_CPU" "$bench" --mcp-dev "$new" --mcp-dev-b "$old" \
    --fixture "$root/tests/fixtures/fake-server" --work "$WORK/w" \
    --calls "$CALLS" --pipelined "$PIPELINED" --spaced "$SPACED" --spaced-gap-ms "$SPACED_GAP_MS" --mmap-relay --seal-relay \
    --phases latency,spaced,throughput > "$out"
  echo "round $r: p50 µs: $(pick "$out" '^## 1\.' 'On-CPU' 4)"
  echo "round $r: spaced p50 µs: $(pick "$out" '^## 1b' 'Spaced p50' 4)"
  echo "round $r: CPU µs/call: $(pick "$out" 'On-CPU time per call' 'Context switches' 3)"
  echo "round $r: pipelined calls/s: $(pick "$out" '^## 2' 'GOAL' 4)"
  echo "round $r: CPU µs/pipelined call: $(pick "$out" '^## 2' 'GOAL' 8)"
done
