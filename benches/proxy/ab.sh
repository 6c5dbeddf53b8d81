#!/usr/bin/env bash
# A/B of two cargo-mcp-dev binaries in one run: `benches/proxy/ab.sh NEW_BIN OLD_BIN`.
#
# Both run side by side with the relay and the audit-relay (writing, copying into a mapped file:
# mmap-relay, and sealing each message into a hash chain first: seal-relay), taking turns call
# by call, pinned to one core (taskset), in ROUNDS separate runs of the latency, spaced and
# throughput phases. A shared machine's noise moves all variants alike, so compare new with old
# within a line, not lines with each other. The two binaries swap the harness's `run` and `run-b`
# slots every round (odd rounds: NEW is `run`): the slots are not alike (session 20: with one
# binary in both, the `run` slot read 0.3 and 0.5 µs more CPU per call than `run-b`), so
# compare over an even number of rounds. One summary line per round on stdout, the binaries named new
# and old; each round's report in $WORK/ab-<round>.md (with the harness's slot names).
# Knobs: CALLS (20000), PIPELINED (20000), SPACED (200 calls, each after
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
# `run` and `run-b` are renamed after the binary in the slot ($slot_run, $slot_b).
pick() { # file, section start, section end, column
  sed -n "/$2/,/$3/p" "$1" | grep -E '^\| (relay|run|audit-relay|mmap-relay|seal-relay|run-b) \|' \
    | awk -F'|' -v c="$4" -v a="$slot_run" -v b="$slot_b" '{gsub(/ /, "", $2); gsub(/ /, "", $c);
        if ($2 == "run") $2 = a; else if ($2 == "run-b") $2 = b; printf "%s %s  ", $2, $c}'
}
for r in $(seq "$ROUNDS"); do
  out="$WORK/ab-$r.md"
  if (( r % 2 )); then
    first="$new"; second="$old"; slot_run=new; slot_b=old
  else
    first="$old"; second="$new"; slot_run=old; slot_b=new
  fi
  taskset -c "$PIN_CPU" "$bench" --mcp-dev "$first" --mcp-dev-b "$second" \
    --fixture "$root/tests/fixtures/fake-server" --work "$WORK/w" \
    --calls "$CALLS" --pipelined "$PIPELINED" --spaced "$SPACED" --spaced-gap-ms "$SPACED_GAP_MS" --mmap-relay --seal-relay \
    --phases latency,spaced,throughput > "$out"
  echo "round $r: p50 µs: $(pick "$out" '^## 1\.' 'On-CPU' 4)"
  echo "round $r: spaced p50 µs: $(pick "$out" '^## 1b' 'Spaced p50' 4)"
  echo "round $r: CPU µs/call: $(pick "$out" 'On-CPU time per call' 'Context switches' 3)"
  echo "round $r: pipelined calls/s: $(pick "$out" '^## 2' 'GOAL' 4)"
  echo "round $r: CPU µs/pipelined call: $(pick "$out" '^## 2' 'GOAL' 8)"
done
