#!/usr/bin/env bash
# User-space instructions per sequential `tools/call`, counted by valgrind's callgrind:
# `benches/proxy/instructions.sh [MCP_DEV_BIN]` (default target/release/cargo-mcp-dev).
#
# Unlike time, an instruction count does not move with the load of a shared machine, so a
# change's effect on the supervisor's own work is read exactly (two runs of the same binary give
# the same figure within a few instructions). The latency phase of proxy-bench runs twice, with
# CALLS_A and CALLS_B calls, with `run`, the relay and the audit-relay each under callgrind; the
# difference of the totals divided by the difference of the calls is the cost of one call (start
# and warm-up cancel out). Then the functions that cost most per call, by their own
# instructions. Needs valgrind.
#
# Caveat: under valgrind the CPU's SHA extensions are not offered, so `sha2` runs its portable
# code (about 2,500 instructions per 64-byte block, where the SHA-NI code the real run uses
# needs a small fraction of that); the report gives the figure with and without
# `compress256`. seal-relay (`src/bin/relay.rs`) is the floor of sealing each message into
# `run`'s chain: `run` minus it is the work beyond the two seals.
# Knobs: CALLS_A (1000), CALLS_B (4000), WORK ($TMPDIR/cargo-mcp-dev-instr).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="$(realpath "${1:-$root/target/release/cargo-mcp-dev}")"
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind" >&2; exit 2; }
CARGO_TARGET_DIR="$root/target/bench-proxy" cargo build --release --offline \
  --manifest-path "$here/Cargo.toml" >&2
bench="$root/target/bench-proxy/release/proxy-bench"
relay="$root/target/bench-proxy/release/relay"
CALLS_A="${CALLS_A:-1000}"; CALLS_B="${CALLS_B:-4000}"
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-instr}"
rm -rf "$WORK"; mkdir -p "$WORK/cg"
# Wrappers: proxy-bench starts them as it would start the binaries.
cat > "$WORK/run.sh" <<EOS
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file="$WORK/cg/run.%p" "$bin" "\$@"
EOS
cat > "$WORK/relay.sh" <<EOS
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file="$WORK/cg/relay\${AUDIT_RELAY_LOG:+-audit}\${AUDIT_RELAY_SEAL:+-seal}.%p" "$relay" "\$@"
EOS
chmod +x "$WORK/run.sh" "$WORK/relay.sh"
for n in "$CALLS_A" "$CALLS_B"; do
  "$bench" --mcp-dev "$WORK/run.sh" --relay "$WORK/relay.sh" \
    --fixture "$root/tests/fixtures/fake-server" --work "$WORK/w" \
    --calls "$n" --warmup 200 --seal-relay --phases latency > "$WORK/report-$n.md" 2> "$WORK/progress-$n.log"
  mkdir -p "$WORK/cg/$n"
  mv "$WORK"/cg/run.* "$WORK"/cg/relay* "$WORK/cg/$n/"
done
python3 - "$WORK/cg" "$CALLS_A" "$CALLS_B" <<'EOS'
import re, subprocess, sys, glob
cg, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def costs(path):
    out = subprocess.run(["callgrind_annotate", "--auto=no", "--inclusive=no", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    d = {}
    for line in out.splitlines():
        m = re.match(r"^\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
        if m:
            name = re.sub(r"\s*\[[^\]]*\]$", "", m.group(2))
            d[name] = d.get(name, 0) + int(m.group(1).replace(",", ""))
    return d
def per_call(kind):
    [pa] = glob.glob(f"{cg}/{a}/{kind}.*"); [pb] = glob.glob(f"{cg}/{b}/{kind}.*")
    ca, cb = costs(pa), costs(pb)
    return {k: (cb.get(k, 0) - ca.get(k, 0)) / (b - a) for k in set(ca) | set(cb)}
print("| variant | instructions per call | without sha256 compress |")
print("|---|---|---|")
runs = {}
for kind, name in [("relay", "relay"), ("relay-audit", "audit-relay"), ("relay-audit-seal", "seal-relay"), ("run", "run")]:
    d = per_call(kind)
    runs[name] = d
    total = d.get("PROGRAM TOTALS", 0)
    sha = sum(v for k, v in d.items() if "compress256" in k)
    print(f"| {name} | {total:,.0f} | {total - sha:,.0f} |")
print()
print("`run`, the functions with most instructions of their own per call:")
print()
print("| instructions | function |")
print("|---|---|")
for k, v in sorted(runs["run"].items(), key=lambda x: -x[1])[1:31]:
    print(f"| {v:,.0f} | `{k[:120]}` |")
EOS
