#!/bin/sh
# Audit log benchmarks (issue 15): per-record append+flush cost, `audit verify` throughput on a
# ~1 GiB log (wall clock and per CPU second of the verifying thread: the machine may be shared),
# and `open_for_run` (what `run` does at start) on an empty log and on that log.
# Figures are written down in bench-results/audit.md with this command, `nproc` and the date.
#
#   benches/audit/run.sh                     # AUDIT_BENCH_MB=1024 by default
#   AUDIT_BENCH_MB=64 benches/audit/run.sh
set -eu
cd "$(dirname "$0")/../.."
cargo bench --bench audit --no-run >/dev/null 2>&1 || cargo bench --bench audit --no-run
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  nproc: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')  load: $(cut -d' ' -f1-3 /proc/loadavg)"
exec cargo bench --bench audit
