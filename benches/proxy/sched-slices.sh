#!/usr/bin/env bash
# Where a call at a host's pace spends its time, thread by thread:
# `benches/proxy/sched-slices.sh [MCP_DEV_BIN]` (default target/release/cargo-mcp-dev).
#
# proxy-bench runs its spaced phase (SPACED calls per variant, each after SPACED_GAP_MS of
# quiet), pinned to one core, while `perf record` takes every context switch on the machine
# (the sched:sched_switch tracepoint: it needs no hardware counters, which this VM lacks).
# Each thread's time on the CPU is cut into one burst per call (slices less than 5 ms apart
# belong together; calls are at least SPACED_GAP_MS apart), and the report gives the median
# burst of every thread of every proxy and server, and each proxy's threads together. The
# proxy's bursts include what it does after the answer is with the host (the anchor, the next
# pages): CPU time, not latency. Variants are told apart by their processes: the relay
# variants by their AUDIT_RELAY_* environment and servers by their parent, read while they
# run. Needs perf with tracepoints (root, or perf_event_paranoid <= 1).
# Knobs: SPACED (300), SPACED_GAP_MS (50), PIN_CPU (last core),
# WORK ($TMPDIR/cargo-mcp-dev-sched).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$(realpath "${1:-$root/target/release/cargo-mcp-dev}")"
command -v perf >/dev/null || { echo "sched-slices.sh: needs perf" >&2; exit 2; }
CARGO_TARGET_DIR="$root/target/bench-proxy" cargo build --release --offline \
  --manifest-path "$here/Cargo.toml" >&2
bench="$root/target/bench-proxy/release/proxy-bench"
SPACED="${SPACED:-300}"; SPACED_GAP_MS="${SPACED_GAP_MS:-50}"
PIN_CPU="${PIN_CPU:-$(( $(nproc) - 1 ))}"
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-sched}"
rm -rf "$WORK"; mkdir -p "$WORK"
# Who is who, while they run: pid, parent, name, relay mode.
(
  while :; do
    for d in /proc/[0-9]*; do
      comm="$(cat "$d/comm" 2>/dev/null)" || continue
      case "$comm" in relay|hops-relay|cargo-mcp-dev|fake-server|[0-9]*) ;; *) continue ;; esac
      ppid="$(awk '/^PPid:/ {print $2}' "$d/status" 2>/dev/null)" || continue
      mode="$(tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -E '^AUDIT_RELAY_(LOG|MMAP|SEAL)=' \
        | cut -d= -f1 | sort | tr '\n' ' ')" || true
      echo "${d#/proc/}|$ppid|$comm|$mode"
    done
    sleep 0.5
  done
) > "$WORK/procs.txt" 2>/dev/null &
poller=$!
trap 'kill $poller 2>/dev/null || true' EXIT
perf record -q -e sched:sched_switch -a -o "$WORK/perf.data" -- \
  taskset -c "$PIN_CPU" "$bench" --mcp-dev "$bin" --fixture "$root/tests/fixtures/fake-server" \
  --work "$WORK/w" --spaced "$SPACED" --spaced-gap-ms "$SPACED_GAP_MS" --seal-relay \
  --phases spaced > "$WORK/report.md" 2> "$WORK/progress.log"
kill "$poller" 2>/dev/null || true
perf script -i "$WORK/perf.data" -F pid,tid,time,trace 2>/dev/null > "$WORK/switches.txt"
echo "- date: $(date -u +%FT%TZ); commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo ?); SPACED=$SPACED SPACED_GAP_MS=$SPACED_GAP_MS pinned to CPU $PIN_CPU"
echo
grep -E '^\| (variant|---|direct|relay|run|audit-relay|seal-relay|hops-relay) ' "$WORK/report.md" | cut -d'|' -f1-5
echo
python3 - "$WORK" <<'EOS'
import collections, re, statistics, sys
work = sys.argv[1]
procs = {}
for line in open(f"{work}/procs.txt"):
    pid, ppid, comm, mode = line.rstrip("\n").split("|")
    procs[int(pid)] = (int(ppid), comm, set(mode.split()))
def proxy_label(pid):
    ppid, comm, mode = procs[pid]
    if comm == "cargo-mcp-dev":
        return "run"
    if comm == "hops-relay":
        return "hops-relay"
    if comm == "relay":
        if "AUDIT_RELAY_SEAL" in mode:
            return "seal-relay"
        if "AUDIT_RELAY_MMAP" in mode:
            return "mmap-relay"
        return "audit-relay" if "AUDIT_RELAY_LOG" in mode else "relay"
    return None
def label(pid):
    if pid not in procs:
        return None
    own = proxy_label(pid)
    if own:
        return own
    ppid = procs[pid][0]
    parent = proxy_label(ppid) if ppid in procs else None
    return f"{parent or 'direct'} server"
pat = re.compile(r"\s*(\d+)/(\d+)\s+([\d.]+):\s+prev_comm=(.*?) prev_pid=(\d+) .*?==> next_comm=(.*?) next_pid=(\d+)")
tgid, name, start, slices = {}, {}, {}, collections.defaultdict(list)
for line in open(f"{work}/switches.txt"):
    m = pat.match(line)
    if not m:
        continue
    t, prev, nxt = float(m.group(3)), int(m.group(5)), int(m.group(7))
    tgid[int(m.group(2))] = int(m.group(1))
    name[prev], name[nxt] = m.group(4), m.group(6)
    if prev in start:
        slices[prev].append((start.pop(prev), t))
    start[nxt] = t
rows = collections.defaultdict(list)
for tid, sl in slices.items():
    who = label(tgid.get(tid, tid))
    if who is None:
        continue
    bursts, cur = [], None
    for s, e in sl:
        if cur and s - cur[1] < 0.005:
            cur = [cur[0], e, cur[2] + (e - s)]
        else:
            if cur:
                bursts.append(cur[2])
            cur = [s, e, e - s]
    if cur:
        bursts.append(cur[2])
    if len(bursts) < 50:
        continue  # start-up threads, not the calls'
    rows[who].append((name[tid], len(bursts), statistics.median(bursts) * 1e6))
print("| process | thread | bursts | median on CPU per call (µs) |")
print("|---|---|---|---|")
order = ["direct server", "relay", "relay server", "audit-relay", "audit-relay server",
         "seal-relay", "seal-relay server", "run", "run server", "hops-relay", "hops-relay server"]
for who in sorted(rows, key=lambda w: order.index(w) if w in order else 99):
    threads = sorted(rows[who], key=lambda r: -r[2])
    for thread, n, med in threads:
        print(f"| {who} | {thread} | {n} | {med:.1f} |")
    if len(threads) > 1:
        print(f"| {who} | (all) | | {sum(r[2] for r in threads):.1f} |")
EOS
