//! Identity benchmarks (issue 2, "Performance"). Figures are written down in
//! `bench-results/identity.md`; this program only measures and prints, it asserts nothing.
//!
//! (a) SHA-256 throughput of `cargo_mcp_dev::base::hashing::sha256_file` on a 256 MiB file against
//!     `openssl dgst -sha256` on the same file in the same run (best of 5 each, page cache warm).
//! (b) Identity capture overhead: on an unchanged project whose debug binary is ~50 MB, the median
//!     wall time of `cargo-mcp-dev build` minus the median of cargo's own no-op `cargo build`
//!     (10 runs each, interleaved). The JSON event's `durationMs` (the cargo build inside
//!     cargo-mcp-dev) splits the difference into "cargo under us" and "everything else".
//!
//! Run: `cargo build --release && cargo bench --bench identity` (needs the `[[bench]]` stanza
//! with `harness = false`). Environment:
//! - `BENCH_PARTS=hash,overhead` (default both)
//! - `BENCH_HASH_MIB=256`
//! - `MCP_DEV_BIN` (default `<repo>/target/release/cargo-mcp-dev`)
//! - `BENCH_WORK` (default `<repo>/target/bench-work/identity`): holds the project copy and target dir
//! - `BENCH_PROJECT_SRC` (default `<repo>/e2e/fixtures/inventory`): copied to `$BENCH_WORK/project`
//! - `BENCH_SEED_TARGET`: a target dir that already holds a debug build of the project, copied
//!   (`cp -a`) to `$BENCH_WORK/target` the first time so the dependencies are not rebuilt
//! - `BENCH_RUNS=10`

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cargo_mcp_dev::base::hashing;

fn main() {
    let parts = std::env::var("BENCH_PARTS").unwrap_or_else(|_| "hash,overhead".into());
    let mut out = std::io::stdout().lock();
    machine(&mut out);
    if parts.split(',').any(|p| p == "hash") {
        hash_throughput(&mut out);
    }
    if parts.split(',').any(|p| p == "overhead") {
        capture_overhead(&mut out);
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn env_or(key: &str, default: impl Into<String>) -> String {
    std::env::var(key).unwrap_or_else(|_| default.into())
}

fn machine(out: &mut impl Write) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    let sha_ni = std::fs::read_to_string("/proc/cpuinfo")
        .map(|t| t.split_whitespace().any(|w| w == "sha_ni"))
        .unwrap_or(false);
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let _ = writeln!(
        out,
        "machine: {cpu}, {cores} cores available, sha_ni={sha_ni}"
    );
}

// ------------------------------------------------------------------------------ (a)

fn hash_throughput(out: &mut impl Write) {
    let mib: u64 = env_or("BENCH_HASH_MIB", "256")
        .parse()
        .expect("BENCH_HASH_MIB");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("blob.bin");
    write_blob(&file, mib << 20);
    // Warm the page cache so both sides read from memory.
    let _ = std::fs::read(&file).map(|b| b.len());

    let mut ours = Vec::new();
    let mut our_digest = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        let (d, n) = hashing::sha256_file(&file).expect("hash");
        ours.push(t.elapsed());
        assert_eq!(n, mib << 20);
        our_digest = d;
    }
    let mut theirs = Vec::new();
    let mut their_digest = String::new();
    for _ in 0..5 {
        let t = Instant::now();
        let o = Command::new("openssl")
            .args(["dgst", "-sha256", "-r"])
            .arg(&file)
            .output()
            .expect("run openssl");
        theirs.push(t.elapsed());
        assert!(o.status.success(), "openssl failed");
        their_digest = format!(
            "sha256:{}",
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .next()
                .unwrap_or("")
        );
    }
    assert_eq!(our_digest, their_digest, "both computed the same digest");
    let best_ours = *ours.iter().min().unwrap();
    let best_theirs = *theirs.iter().min().unwrap();
    let mbps = |d: Duration| (mib as f64) / d.as_secs_f64();
    let _ = writeln!(
        out,
        "(a) sha256 of {mib} MiB, best of 5 (page cache warm):\n    \
         hashing::sha256_file  {:>8.1} ms  {:>7.1} MiB/s   (all: {})\n    \
         openssl dgst -sha256  {:>8.1} ms  {:>7.1} MiB/s   (all: {}; includes process start)\n    \
         ratio ours/openssl throughput: {:.3} (goal >= 0.90)",
        ms(best_ours),
        mbps(best_ours),
        list_ms(&ours),
        ms(best_theirs),
        mbps(best_theirs),
        list_ms(&theirs),
        mbps(best_ours) / mbps(best_theirs),
    );
}

/// Incompressible, deterministic content (xorshift), written in 1 MiB chunks.
fn write_blob(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create blob"));
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for w in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).expect("write blob");
        left -= n as u64;
    }
    f.flush().expect("flush blob");
}

// ------------------------------------------------------------------------------ (b)

fn capture_overhead(out: &mut impl Write) {
    let runs: usize = env_or("BENCH_RUNS", "10").parse().expect("BENCH_RUNS");
    let mcp_dev = PathBuf::from(env_or(
        "MCP_DEV_BIN",
        repo()
            .join("target/release/cargo-mcp-dev")
            .display()
            .to_string(),
    ));
    assert!(
        mcp_dev.is_file(),
        "{} missing: run `cargo build --release` first or set MCP_DEV_BIN",
        mcp_dev.display()
    );
    let work = PathBuf::from(env_or(
        "BENCH_WORK",
        repo()
            .join("target/bench-work/identity")
            .display()
            .to_string(),
    ));
    let src = PathBuf::from(env_or(
        "BENCH_PROJECT_SRC",
        repo().join("e2e/fixtures/inventory").display().to_string(),
    ));
    let project = work.join("project");
    let target = work.join("target");
    let home = work.join("home");
    std::fs::create_dir_all(&work).expect("bench work dir");
    if !project.is_dir() {
        cp_a(&src, &project);
        let _ = std::fs::remove_dir_all(project.join("target"));
    }
    if !target.is_dir()
        && let Ok(seed) = std::env::var("BENCH_SEED_TARGET")
    {
        cp_a(Path::new(&seed), &target);
    }
    let manifest = project.join("Cargo.toml");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let cargo_cmd = || {
        let mut c = Command::new(&cargo);
        c.arg("build")
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let mcp_cmd = || {
        let mut c = Command::new(&mcp_dev);
        c.arg("build")
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .args(["--message-format", "json"])
            .env("CARGO_MCP_DEV_HOME", &home)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c
    };

    // Warm-up: bring the build up to date, fill the metadata cache and the store.
    let t = Instant::now();
    assert!(
        cargo_cmd().status().expect("cargo").success(),
        "cargo build failed"
    );
    let warm_cargo = t.elapsed();
    let first = mcp_cmd().output().expect("cargo-mcp-dev");
    assert!(first.status.success(), "cargo-mcp-dev build failed");
    let exe = target.join("debug/inventory");
    let size = std::fs::metadata(&exe).map(|m| m.len()).unwrap_or(0);

    let mut plain = Vec::with_capacity(runs);
    let mut ours = Vec::with_capacity(runs);
    let mut inner = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        assert!(cargo_cmd().status().expect("cargo").success());
        plain.push(t.elapsed());

        let t = Instant::now();
        let o = mcp_cmd().output().expect("cargo-mcp-dev");
        ours.push(t.elapsed());
        assert!(o.status.success());
        let event: serde_json::Value =
            serde_json::from_slice(&o.stdout).expect("one JSON event on stdout");
        assert_eq!(
            event["outcome"], "unchanged",
            "the project must be unchanged"
        );
        inner.push(Duration::from_millis(
            event["durationMs"].as_u64().unwrap_or(0),
        ));
    }
    let (mp, mo, mi) = (median(&plain), median(&ours), median(&inner));
    let _ = writeln!(
        out,
        "(b) unchanged rebuild of {} ({:.1} MB debug binary), median of {runs} (interleaved):\n    \
         warm-up cargo build: {:.0} ms\n    \
         cargo build (no-op)          {:>7.1} ms   (all: {})\n    \
         cargo-mcp-dev build          {:>7.1} ms   (all: {})\n    \
         of which cargo under it      {:>7.1} ms   (durationMs of the event; all: {})\n    \
         overhead (medians)           {:>7.1} ms   (goal <= 80 ms)\n    \
         outside cargo (median)       {:>7.1} ms",
        project.display(),
        size as f64 / 1e6,
        ms(warm_cargo),
        ms(mp),
        list_ms(&plain),
        ms(mo),
        list_ms(&ours),
        ms(mi),
        list_ms(&inner),
        ms(mo) - ms(mp),
        ms(mo) - ms(mi),
    );
    overhead_breakdown(out, runs, &exe, &target, &mcp_dev);
}

/// Where the time outside cargo goes, measured with the library's own functions on the same
/// executable (medians of `runs`): `rustc -vV` (run once per process), hashing alone, the store
/// capture of an executable whose entry already exists (hash + copy to a temp file that is then
/// dropped), and the launcher's self-hash.
fn overhead_breakdown(
    out: &mut impl Write,
    runs: usize,
    exe: &Path,
    target: &Path,
    mcp_dev: &Path,
) {
    let cargo = std::env::var_os("CARGO").map(PathBuf::from);
    let rustc = cargo_mcp_dev::identity::workspace::find_rustc(
        cargo.as_deref().unwrap_or(Path::new("cargo")),
    );
    let time = |f: &mut dyn FnMut()| {
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            f();
            v.push(t.elapsed());
        }
        median(&v)
    };
    let rustc_vv = time(&mut || {
        let o = Command::new(&rustc).arg("-vV").output().expect("rustc -vV");
        assert!(o.status.success());
    });
    let hash_only = time(&mut || {
        hashing::sha256_file(exe).expect("hash");
    });
    let store_dir = tempfile::Builder::new()
        .prefix("bench-store-")
        .tempdir_in(target.join("mcp-dev"))
        .expect("bench store dir");
    let store = cargo_mcp_dev::identity::store::Store::new(store_dir.path());
    assert!(store.capture(exe).expect("capture").newly_stored);
    let capture_existing = time(&mut || {
        let s = store.capture(exe).expect("capture");
        assert!(!s.newly_stored);
    });
    let self_hash = time(&mut || {
        hashing::sha256_file(mcp_dev).expect("hash");
    });
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    let _ = writeln!(
        out,
        "(b') breakdown of the time outside cargo (library functions, median of {runs}):\n    \
         rustc -vV                                    {:>7.1} ms   ({})\n    \
         sha256_file of the executable ({:.1} MB)     {:>7.1} ms\n    \
         Store::capture, entry already present        {:>7.1} ms   (hash + copy to a temp file, dropped)\n    \
         of which the copy (capture - hash)           {:>7.1} ms\n    \
         launcher self-hash ({:.1} MB)                 {:>7.1} ms",
        ms(rustc_vv),
        rustc.display(),
        size(exe),
        ms(hash_only),
        ms(capture_existing),
        ms(capture_existing) - ms(hash_only),
        size(mcp_dev),
        ms(self_hash),
    );
}

fn cp_a(from: &Path, to: &Path) {
    let st = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(st.success(), "cp -a {} {}", from.display(), to.display());
}

fn median(v: &[Duration]) -> Duration {
    let mut s = v.to_vec();
    s.sort();
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn list_ms(v: &[Duration]) -> String {
    v.iter()
        .map(|d| format!("{:.0}", ms(*d)))
        .collect::<Vec<_>>()
        .join(" ")
}
