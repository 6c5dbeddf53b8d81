#!/bin/sh
# Audit log benchmarks (issue 15): per-record append+flush cost, `audit verify` throughput on a
# ~1 GiB log, and `open_for_run` (run start) on an empty and on that log.
# Results go to bench-results/audit.md by hand (with this command, `nproc` and the date).
#
#   benches/audit/run.sh            # AUDIT_BENCH_MB=1024 by default
#   AUDIT_BENCH_MB=64 benches/audit/run.sh
set -eu
cd "$(dirname "$0")/../.."
cargo bench --bench audit --no-run >/dev/null 2>&1 || cargo bench --bench audit --no-run
echo "date: $(date -u +%Y-%m-%dT%H:%MZ)  nproc: $(nproc)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
if command -v taskset >/dev/null 2>&1; then
    echo "pinned to core 1 (taskset -c 1)"
    exec taskset -c 1 cargo bench --bench audit
fi
exec cargo bench --bench audit
