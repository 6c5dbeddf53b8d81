#!/usr/bin/env bash
# Reproduces bench-results/proxy.md: `benches/proxy/run.sh` from anywhere in the repository.
#
# 1. builds cargo-mcp-dev in release (target/release/cargo-mcp-dev) unless MCP_DEV_BIN is set,
# 2. builds this standalone harness + the byte relay into target/bench-proxy,
# 3. runs all phases unpinned, then latency + spaced + throughput + list again with every process pinned to
#    one core (taskset), which removes cross-core wake-up latency and shows the CPU cost per call.
#    (start and exit are process-lifecycle wall clocks: unpinned only, as a host runs them.)
# Report (markdown) on stdout and in target/bench-proxy/report.md; progress on stderr.
# Knobs: CALLS (2000), PIPELINED (20000), TP_ROUNDS (5), RELOADS (10), IDLE_SECS (30),
# LIST_CALLS (1000 tools/list per variant, two tools), LIST_BIG_CALLS (100, 1,000 tools),
# LIST_SPACED (30 lists per variant and catalog, each after 100 ms of quiet, then a call),
# SPACED (200 calls per variant, each after SPACED_GAP_MS = 50 ms of quiet: a host's pace),
# START_ROUNDS (10), EXIT_ROUNDS (5), PHASES (pass A; default all),
# WORK (work dir, reused so the fixture's target dirs stay warm), PIN_CPU (core for the pinned pass).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

if [[ -z "${MCP_DEV_BIN:-}" ]]; then
  cargo build --release --offline >&2
  MCP_DEV_BIN="$root/target/release/cargo-mcp-dev"
fi
CARGO_TARGET_DIR="$root/target/bench-proxy" cargo build --release --offline \
  --manifest-path "$here/Cargo.toml" >&2
bench="$root/target/bench-proxy/release/proxy-bench"

CALLS="${CALLS:-2000}"; PIPELINED="${PIPELINED:-20000}"; TP_ROUNDS="${TP_ROUNDS:-5}"
RELOADS="${RELOADS:-10}"; IDLE_SECS="${IDLE_SECS:-30}"
LIST_CALLS="${LIST_CALLS:-1000}"; LIST_BIG_CALLS="${LIST_BIG_CALLS:-100}"; LIST_SPACED="${LIST_SPACED:-30}"
SPACED="${SPACED:-200}"; SPACED_GAP_MS="${SPACED_GAP_MS:-50}"
START_ROUNDS="${START_ROUNDS:-10}"; EXIT_ROUNDS="${EXIT_ROUNDS:-5}"
PHASES="${PHASES:-latency,spaced,throughput,list,idle,reload,start,exit}"
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-proxy-bench}"
PIN_CPU="${PIN_CPU:-$(( $(nproc) - 1 ))}"
common=(--mcp-dev "$MCP_DEV_BIN" --fixture "$root/tests/fixtures/fake-server"
        --calls "$CALLS" --pipelined "$PIPELINED" --tp-rounds "$TP_ROUNDS"
        --list-calls "$LIST_CALLS" --list-big-calls "$LIST_BIG_CALLS" --list-spaced "$LIST_SPACED"
        --spaced "$SPACED" --spaced-gap-ms "$SPACED_GAP_MS" --mmap-relay --seal-relay
        --clk-tck "$(getconf CLK_TCK)")

report="$root/target/bench-proxy/report.md"
{
  echo "# proxy benchmark: raw output"
  echo
  echo "- date: $(date -u +%FT%TZ); commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?)$(git -C "$root" diff --quiet -- src 2>/dev/null || echo ' (src modified)')"
  echo "- nproc: $(nproc); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs); kernel: $(uname -r)"
  echo "- load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  echo "## Pass A: unpinned (scheduler places processes on any of $(nproc) cores)"
  echo
  echo "- knobs: CALLS=$CALLS PIPELINED=$PIPELINED TP_ROUNDS=$TP_ROUNDS RELOADS=$RELOADS IDLE_SECS=$IDLE_SECS LIST_CALLS=$LIST_CALLS LIST_BIG_CALLS=$LIST_BIG_CALLS LIST_SPACED=$LIST_SPACED SPACED=$SPACED SPACED_GAP_MS=$SPACED_GAP_MS START_ROUNDS=$START_ROUNDS EXIT_ROUNDS=$EXIT_ROUNDS"
  echo
  "$bench" "${common[@]}" --work "$WORK/a" --reloads "$RELOADS" --idle-secs "$IDLE_SECS" \
    --start-rounds "$START_ROUNDS" --exit-rounds "$EXIT_ROUNDS" --phases "$PHASES"
  echo "## Pass B: harness, proxies and servers all pinned to CPU $PIN_CPU (taskset)"
  echo
  taskset -c "$PIN_CPU" "$bench" "${common[@]}" --work "$WORK/b" --phases latency,spaced,throughput,list
  echo "- load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$report"
