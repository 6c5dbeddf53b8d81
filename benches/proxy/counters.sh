#!/usr/bin/env bash
# Kernel counters per call, read by `perf stat`: `benches/proxy/counters.sh [MCP_DEV_BIN...]`
# (default target/release/cargo-mcp-dev; several binaries are measured side by side).
#
# Each binary (and the zero-work relay and seal-relay, for reference) runs under `perf stat`, which counts the
# proxy and the server it starts (on-CPU time, page faults, context switches, futex and madvise
# calls). proxy-bench runs each phase twice, with a short and a long run, pinned to one core;
# the difference divided by the difference of the calls is the cost of one call (start-up,
# builds and warm-up cancel out). Phases: back-to-back calls (latency: CALLS_A, CALLS_B) and
# calls at a host's pace (spaced: SPACED_A, SPACED_B, each after 50 ms of quiet). Needs perf
# with tracepoints (root, or perf_event_paranoid ≤ 1). Knobs: CALLS_A (2000), CALLS_B (8000),
# SPACED_A (100), SPACED_B (300), PIN_CPU (last core), WORK ($TMPDIR/cargo-mcp-dev-counters).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
command -v perf >/dev/null || { echo "counters.sh: needs perf" >&2; exit 2; }
bins=("$@")
[[ ${#bins[@]} -gt 0 ]] || bins=("$root/target/release/cargo-mcp-dev")
CARGO_TARGET_DIR="$root/target/bench-proxy" cargo build --release --offline \
  --manifest-path "$here/Cargo.toml" >&2
bench="$root/target/bench-proxy/release/proxy-bench"
relay="$root/target/bench-proxy/release/relay"
CALLS_A="${CALLS_A:-2000}"; CALLS_B="${CALLS_B:-8000}"
SPACED_A="${SPACED_A:-100}"; SPACED_B="${SPACED_B:-300}"
PIN_CPU="${PIN_CPU:-$(( $(nproc) - 1 ))}"
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-counters}"
events="task-clock,page-faults,context-switches,syscalls:sys_enter_futex,syscalls:sys_enter_madvise"
rm -rf "$WORK/stat" "$WORK/wrap"; mkdir -p "$WORK/stat" "$WORK/wrap"
wrap() { # name, binary: a script proxy-bench starts as it would start the binary
  cat > "$WORK/wrap/$1" <<EOW
#!/bin/sh
exec perf stat -x, -e $events -o "$WORK/stat/\$COUNTERS_RUN.$1\${AUDIT_RELAY_LOG:+-audit}\${AUDIT_RELAY_SEAL:+-seal}.\$\$" "$2" "\$@"
EOW
  chmod +x "$WORK/wrap/$1"
}
wrap relay "$relay"
for i in "${!bins[@]}"; do wrap "run$i" "$(realpath "${bins[$i]}")"; done
for phase in latency spaced; do
  for len in A B; do
    if [[ $phase == latency ]]; then
      n=$([[ $len == A ]] && echo "$CALLS_A" || echo "$CALLS_B"); size=(--calls "$n" --warmup 100)
    else
      n=$([[ $len == A ]] && echo "$SPACED_A" || echo "$SPACED_B"); size=(--spaced "$n")
    fi
    for i in "${!bins[@]}"; do
      # One run per binary (the relay and seal-relay are measured in the first); the other variants run too,
      # uncounted, so the pace is the bench's.
      COUNTERS_RUN="$phase-$len-$i" taskset -c "$PIN_CPU" "$bench" --mcp-dev "$WORK/wrap/run$i" \
        --relay "$WORK/wrap/relay" --fixture "$root/tests/fixtures/fake-server" \
        --work "$WORK/w" "${size[@]}" --seal-relay --phases "$phase" > /dev/null 2> "$WORK/progress.log"
    done
  done
done
python3 - "$WORK/stat" "$CALLS_A" "$CALLS_B" "$SPACED_A" "$SPACED_B" "${bins[@]}" <<'EOP'
import glob, os, sys
stat, ca, cb, sa, sb = sys.argv[1], *map(int, sys.argv[2:6])
bins = sys.argv[6:]
def load(pattern):
    total = {}
    for path in glob.glob(os.path.join(stat, pattern)):
        for line in open(path):
            f = line.strip().split(',')
            if len(f) > 2 and f[0] and f[0][0].isdigit():
                total[f[2]] = total.get(f[2], 0.0) + float(f[0])
    return total
names = ["task-clock", "page-faults", "context-switches",
         "syscalls:sys_enter_futex", "syscalls:sys_enter_madvise"]
heads = ["on-CPU µs", "page faults", "context switches", "futex calls", "madvise calls"]
for phase, a, b in (("latency", ca, cb), ("spaced", sa, sb)):
    print(f"\n## {phase}: per call, proxy + its server (pinned; ({b}-call run − {a}-call run) / {b - a})\n")
    print("| variant | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    rows = [("relay", f"{phase}-A-0.relay.*", f"{phase}-B-0.relay.*"),
            ("seal-relay", f"{phase}-A-0.relay-audit-seal.*", f"{phase}-B-0.relay-audit-seal.*")]
    rows += [(f"run ({os.path.basename(x)})", f"{phase}-A-{i}.run{i}.*", f"{phase}-B-{i}.run{i}.*")
             for i, x in enumerate(bins)]
    for name, pa, pb in rows:
        ta, tb = load(pa), load(pb)
        cells = []
        for n in names:
            d = (tb.get(n, 0.0) - ta.get(n, 0.0)) / (b - a)
            # task-clock is in ms
            cells.append(f"{d * 1000:.1f}" if n == "task-clock" else f"{d:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")
EOP
