#!/usr/bin/env bash
# Context switches of the `run` supervisor (all its threads) per `tools/list` of the 1,000-tool
# catalog, for each binary given, pinned to one core like the bench's pass B. Reuses the work
# dir of `benches/proxy/run.sh` (run it once first): its fake server build and its catalog.
#   benches/proxy/ctx-per-list.sh BIN [BIN...]     (LISTS=300, WORK=..., PIN_CPU=...)
set -euo pipefail
WORK="${WORK:-${TMPDIR:-/tmp}/cargo-mcp-dev-proxy-bench}/b"
LISTS="${LISTS:-300}"; PIN_CPU="${PIN_CPU:-$(( $(nproc) - 1 ))}"
[[ -f "$WORK/tools-1000.json" ]] || { echo "run benches/proxy/run.sh first (no $WORK/tools-1000.json)" >&2; exit 2; }
for bin in "$@"; do
  taskset -c "$PIN_CPU" python3 - "$bin" "$WORK" "$LISTS" <<'PY'
import json, os, subprocess, sys, glob
binary, work, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = dict(os.environ, CARGO_MCP_DEV_HOME=f"{work}/home", FAKE_TOOLS=f"{work}/tools-1000.json")
log = f"{work}/audit-ctx.jsonl"
for f in glob.glob(log + "*"):
    os.remove(f)
p = subprocess.Popen([binary, "mcp-dev", "run", "--release", "--offline", "--manifest-path", f"{work}/srv/Cargo.toml",
                      "--target-dir", f"{work}/target-srv", "--no-gating", "--no-watch", "--audit-log", log],
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
def ask(o):
    p.stdin.write((json.dumps(o, separators=(",", ":")) + "\n").encode()); p.stdin.flush()
    return p.stdout.readline()
ask({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "ctx", "version": "1"}}})
p.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n'); p.stdin.flush()
ask({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
def switches():
    total = 0
    for status in glob.glob(f"/proc/{p.pid}/task/*/status"):
        for line in open(status):
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total
before = switches()
for i in range(n):
    answer = ask({"jsonrpc": "2.0", "id": i + 10, "method": "tools/list"})
    assert b'"tools"' in answer, answer[:200]
after = switches()
p.stdin.close(); p.wait()
print(f"{os.path.basename(binary)}: {(after - before) / n:.1f} supervisor context switches per 1,000-tool list ({n} lists)")
PY
done
