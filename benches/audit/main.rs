//! Audit log benchmarks (issue 15, "Scale of the log"). Figures are written down in
//! `bench-results/audit.md`; this program only measures and prints (to stdout: it is a bench
//! binary, not library code), it asserts nothing.
//!
//! (a) per-record cost of the writer: append + flush of a typical `tool_called` record
//!     (the audit cost on the path of every tool call), median and p99 over 20,000 records,
//!     copied into the mapped reservation and `write`-n, side by side;
//! (b) `audit verify` throughput (records/s, one core) on a log of `AUDIT_BENCH_MB` MiB;
//! (c) `open_for_run` (what `run` does at start) on an empty log and on that big log.
//!
//! Run: `benches/audit/run.sh` (pins to one core with `taskset` when available), or
//! `cargo bench --bench audit`. Environment:
//! - `AUDIT_BENCH_MB=1024`: size of the big log
//! - `AUDIT_BENCH_DIR` (default a temporary directory under `target/`)

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cargo_mcp_dev::audit::{self, AuditLog, AuditOptions, KeyStore};
use serde_json::json;

/// A bench prints its figures on stdout (the crate denies `println!`: stdout belongs to JSON-RPC
/// in the library; this is a separate program).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

fn data(i: u64) -> serde_json::Value {
    json!({"callId": i, "tool": "write_inventory", "grant": "01JQ7R4S4S0QJ7GZP1S2G1",
        "credentialScopes": ["inventory-api-staging"], "argumentsDigest": "f".repeat(64)})
}

const RUN: &str = "01JQ7R4S4S0QJ7GZP1S2";
const EPOCH: &str = "01JQ7R9KQ6K2Y8W4JH0M";

fn append(log: &mut AuditLog, i: u64) {
    log.append(audit::TOOL_CALLED, RUN, Some(EPOCH), data(i))
        .unwrap();
    flush(log);
}

/// (Before issue 15 `append` wrote the record itself and there was no `flush`.)
fn flush(log: &mut AuditLog) {
    log.flush().unwrap();
}

fn main() {
    let mb: u64 = std::env::var("AUDIT_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let base = std::env::var_os("AUDIT_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-work/audit")
        });
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let keys = KeyStore::at(base.join("state"));
    say!(
        "nproc: {}",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );

    // (a) per-record append + flush, copied into the mapped reservation (the default on Linux)
    // and `write`-n, in alternating blocks of 1,000 records (the same noise for both).
    let mut logs: Vec<(&str, AuditLog, Vec<Duration>)> =
        [("copied into the map", true), ("write(2)", false)]
            .into_iter()
            .map(|(name, map)| {
                let opts = AuditOptions {
                    write_through_map: map,
                    ..AuditOptions::default()
                };
                let path = base.join(format!("small-{map}.jsonl"));
                let log = AuditLog::open_with(&path, &keys, &opts).unwrap();
                (name, log, Vec::with_capacity(20_000))
            })
            .collect();
    for block in 0..20u64 {
        for (_, log, times) in &mut logs {
            for i in block * 1000..(block + 1) * 1000 {
                let t = Instant::now();
                append(log, i);
                times.push(t.elapsed());
            }
        }
    }
    for (name, log, mut times) in logs {
        drop(log);
        times.sort();
        let total: Duration = times.iter().sum();
        say!(
            "append+flush per record, {name}: mean {:.2} µs, median {:.2} µs, p99 {:.2} µs (20000 records)",
            us(total) / times.len() as f64,
            us(times[times.len() / 2]),
            us(times[times.len() * 99 / 100])
        );
    }

    // (b) the big log
    let big = base.join("big.jsonl");
    let t = Instant::now();
    let mut log = AuditLog::open(&big, &keys).unwrap();
    let mut i = 0u64;
    let target = mb << 20;
    while total_size(&big) < target {
        for _ in 0..10_000 {
            i += 1;
            log.append(audit::TOOL_CALLED, RUN, Some(EPOCH), data(i))
                .unwrap();
        }
        flush(&mut log);
    }
    drop(log);
    let size = total_size(&big);
    say!(
        "big log: {i} records, {:.1} MiB, written in {:.1} s",
        size as f64 / 1048576.0,
        t.elapsed().as_secs_f64()
    );

    for run in 1..=3 {
        let t = Instant::now();
        let cpu = thread_cpu();
        let r = audit::verify(&big, &keys).unwrap();
        let el = t.elapsed();
        let cpu = thread_cpu() - cpu;
        say!(
            "verify #{run}: {} records in {} files, wall {:.2} s = {:.0} records/s, CPU {:.2} s = {:.0} records/s per core ({:.0} MiB/s), peak RSS so far {} MiB",
            r.records,
            r.segments.len(),
            el.as_secs_f64(),
            r.records as f64 / el.as_secs_f64(),
            cpu.as_secs_f64(),
            r.records as f64 / cpu.as_secs_f64(),
            size as f64 / 1048576.0 / cpu.as_secs_f64(),
            peak_rss_mib()
        );
    }

    // (c) open_for_run: empty vs big, 7 opens each (the first big open may do one-time work:
    // before issue 15 the full check that leaves a checkpoint; after, an anchor upgrade).
    let empty = base.join("empty.jsonl");
    for (name, path) in [("empty", &empty), ("big", &big)] {
        let mut v = Vec::new();
        for _ in 0..7 {
            let t = Instant::now();
            let (log, rec) = audit::open_for_run(path, &keys).unwrap();
            v.push(t.elapsed());
            assert!(rec.is_none());
            drop(log);
        }
        let first = v[0];
        let mut rest = v[1..].to_vec();
        rest.sort();
        say!(
            "open_for_run {name}: first {:.3} ms, then median {:.3} ms (min {:.3}, max {:.3})",
            us(first) / 1000.0,
            us(rest[rest.len() / 2]) / 1000.0,
            us(rest[0]) / 1000.0,
            us(rest[rest.len() - 1]) / 1000.0
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

fn total_size(p: &Path) -> u64 {
    let dir = p.parent().unwrap();
    let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&stem))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

/// CPU time of the calling thread (`/proc/thread-self/schedstat`, ns): the machine is shared,
/// so throughput "on one core" is records per CPU second, beside the wall-clock figure.
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

/// VmHWM of this process (Linux), to show that verify streams.
fn peak_rss_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map(|kb| kb / 1024)
        .unwrap_or(0)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
