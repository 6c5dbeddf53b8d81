//! proxy-bench: measures `cargo mcp-dev run` against the same MCP server run directly and behind a
//! zero-work byte relay (the floor of one proxy hop), in one run, interleaving the variants so that
//! load from other processes on a shared machine hits all of them alike.
//!
//! Phases (all by default; `--phases latency,spaced,throughput,list,idle,reload,start,exit` to
//! pick):
//! - latency: sequential `tools/call echo` round trips; per round the variants take turns in a
//!   rotating order (`--streak N`: N calls in a row per turn); the timer stops when the answer
//!   line has been read (parsing happens after).
//! - spaced: `tools/call echo` after a pause each (`--spaced N`, `--spaced-gap-ms G`), the
//!   pace of a real host (an agent calls a tool every few seconds): every hop starts from a
//!   sleeping process and cold caches, which the back-to-back latency phase never sees.
//! - throughput: pipelined calls (a writer thread sends all, the main thread reads all answers),
//!   rounds rotate the variant order.
//! - idle: CPU (utime+stime) of a watching supervisor and of the `--no-watch` one over a window.
//! - reload: save a source edit, poll calls until the answer's `structuredContent.revision` is the
//!   new one; the same edit built by plain `cargo build` on a twin copy in the same rotation gives
//!   cargo's own time, subtracted pairwise.
//! - list: `tools/list` round trips, default two-tool catalog and a generated 1,000-tool one
//!   (`list.rs`).
//! - start: spawn to the first successful `tools/call`, `run` vs `cargo run` (`lifecycle.rs`).
//! - exit: host closes stdin to process exit, server idle / build running / server not answering
//!   yet (`lifecycle.rs`).
//!
//! `--mmap-relay` adds the audit-relay in its mapped mode (`src/bin/relay.rs`) as the variant
//! `mmap-relay`: the floor of recording every message the way `run` writes its log on Linux.
//! `--seal-relay` adds it sealing every message into a hash chain first (`seal-relay`): the floor
//! of a proxy that seals each message with `run`'s hash and MAC before passing it on.
//!
//! `--mcp-dev-b OTHER` runs a second `cargo-mcp-dev` (say, the commit before a change) as the
//! variant `run-b` in the latency, spaced and throughput phases, beside the first, in the same rotation:
//! an A/B measured under the same noise (`ab.sh`).
//!
//! Owns only its work directory (`--work`); it never touches the repository it was pointed at
//! except to read the fixture it copies. Output: a markdown report on stdout, progress on stderr.

mod lifecycle;
mod list;

use serde_json::{Value, json};
use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const ERROR_META: &str = "dev.cargo-mcp-dev/error";

struct Opts {
    mcp_dev: PathBuf,
    /// A second `cargo-mcp-dev` (say, before a change) run beside the first as `run-b` in the
    /// latency and throughput phases: an A/B in one run, under the same noise.
    mcp_dev_b: Option<PathBuf>,
    /// Also run the audit-relay writing through a shared map (`--mmap-relay`).
    mmap_relay: bool,
    /// Also run the audit-relay sealing every message into a chain (`--seal-relay`).
    seal_relay: bool,
    relay: PathBuf,
    hops: PathBuf,
    fixture: PathBuf,
    work: PathBuf,
    calls: usize,
    /// Sequential calls each variant makes in a row before the next one's turn (1: call by call).
    streak: usize,
    warmup: usize,
    pipelined: usize,
    tp_rounds: usize,
    reloads: usize,
    idle_secs: u64,
    clk_tck: u64,
    /// tools/list round trips per variant, default catalog / large catalog.
    list_calls: usize,
    list_big_calls: usize,
    /// Tools in the large catalog.
    list_big_tools: usize,
    /// Spaced lists (each after a pause, followed by a call) per variant and catalog.
    list_spaced: usize,
    /// Spaced calls per variant, and the pause before each.
    spaced: usize,
    spaced_gap_ms: u64,
    start_rounds: usize,
    exit_rounds: usize,
    phases: Vec<String>,
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        mcp_dev: PathBuf::from("target/release/cargo-mcp-dev"),
        mcp_dev_b: None,
        mmap_relay: false,
        seal_relay: false,
        relay: PathBuf::new(),
        hops: PathBuf::new(),
        fixture: PathBuf::from("tests/fixtures/fake-server"),
        work: std::env::temp_dir().join("proxy-bench"),
        calls: 2000,
        streak: 1,
        warmup: 500,
        pipelined: 20000,
        tp_rounds: 5,
        reloads: 10,
        idle_secs: 30,
        clk_tck: 100,
        list_calls: 1000,
        list_big_calls: 100,
        list_big_tools: 1000,
        list_spaced: 30,
        spaced: 200,
        spaced_gap_ms: 50,
        start_rounds: 10,
        exit_rounds: 5,
        phases: vec![
            "latency".into(),
            "spaced".into(),
            "throughput".into(),
            "list".into(),
            "idle".into(),
            "reload".into(),
            "start".into(),
            "exit".into(),
        ],
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut val = || {
            args.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--mcp-dev" => o.mcp_dev = val().into(),
            "--relay" => o.relay = val().into(),
            "--mcp-dev-b" => o.mcp_dev_b = Some(val().into()),
            "--mmap-relay" => o.mmap_relay = true,
            "--seal-relay" => o.seal_relay = true,
            "--hops-relay" => o.hops = val().into(),
            "--fixture" => o.fixture = val().into(),
            "--work" => o.work = val().into(),
            "--calls" => o.calls = val().parse().expect("--calls N"),
            "--streak" => o.streak = val().parse::<usize>().expect("--streak N").max(1),
            "--warmup" => o.warmup = val().parse().expect("--warmup N"),
            "--pipelined" => o.pipelined = val().parse().expect("--pipelined N"),
            "--tp-rounds" => o.tp_rounds = val().parse().expect("--tp-rounds N"),
            "--reloads" => o.reloads = val().parse().expect("--reloads N"),
            "--idle-secs" => o.idle_secs = val().parse().expect("--idle-secs N"),
            "--clk-tck" => o.clk_tck = val().parse().expect("--clk-tck N"),
            "--list-calls" => o.list_calls = val().parse().expect("--list-calls N"),
            "--list-big-calls" => o.list_big_calls = val().parse().expect("--list-big-calls N"),
            "--list-big-tools" => o.list_big_tools = val().parse().expect("--list-big-tools N"),
            "--spaced" => o.spaced = val().parse().expect("--spaced N"),
            "--spaced-gap-ms" => o.spaced_gap_ms = val().parse().expect("--spaced-gap-ms MS"),
            "--list-spaced" => o.list_spaced = val().parse().expect("--list-spaced N"),
            "--start-rounds" => o.start_rounds = val().parse().expect("--start-rounds N"),
            "--exit-rounds" => o.exit_rounds = val().parse().expect("--exit-rounds N"),
            "--phases" => o.phases = val().split(',').map(str::to_string).collect(),
            other => panic!("unknown flag {other}"),
        }
    }
    if o.relay.as_os_str().is_empty() {
        // The relay is built next to this binary.
        o.relay = std::env::current_exe()
            .expect("current_exe")
            .with_file_name("relay");
    }
    if o.hops.as_os_str().is_empty() {
        o.hops = std::env::current_exe()
            .expect("current_exe")
            .with_file_name("hops-relay");
    }
    o.hops = fs::canonicalize(&o.hops).expect("hops-relay binary");
    o.mcp_dev = fs::canonicalize(&o.mcp_dev).expect("cargo-mcp-dev binary");
    o.relay = fs::canonicalize(&o.relay).expect("relay binary");
    o.fixture = fs::canonicalize(&o.fixture).expect("fake-server fixture");
    o
}

fn met(ok: bool) -> &'static str {
    if ok { "MET" } else { "MISSED" }
}

fn progress(msg: &str) {
    eprintln!("proxy-bench: {msg}");
}

// ---------------------------------------------------------------------------------------------
// Fixture copies and builds

/// Copies the fake-server workspace (sources and lockfile, no target dir) into `dest`.
fn copy_fixture(fixture: &Path, dest: &Path) {
    let _ = fs::remove_dir_all(dest);
    copy_tree(fixture, dest);
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        let ty = entry.file_type().unwrap();
        if ty.is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else if ty.is_file() {
            fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// The cargo build argument list `run` uses (src/identity/build.rs `cargo_build_args`), for the twin builds.
fn cargo_build(manifest: &Path, target_dir: &Path, release: bool) -> (Duration, Option<f64>) {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()));
    cmd.args([
        "build",
        "--message-format=json-render-diagnostics",
        "--manifest-path",
    ])
    .arg(manifest)
    .args([
        "--package",
        "fake-server",
        "--bin",
        "fake-server",
        "--target-dir",
    ])
    .arg(target_dir)
    .args(["--offline", "--color", "never"]);
    if release {
        cmd.arg("--release");
    }
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("run cargo");
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo build failed:\n{stderr}");
    (took, stderr.lines().find_map(finished_secs))
}

/// Seconds from cargo's `Finished … target(s) in 1.23s` (or `in 1m 02s`) line.
fn finished_secs(line: &str) -> Option<f64> {
    let rest = line.trim_start().strip_prefix("Finished")?;
    let tail = rest.rsplit(" in ").next()?.trim();
    let mut secs = 0.0;
    for part in tail.split_whitespace() {
        if let Some(m) = part.strip_suffix('m') {
            secs += m.parse::<f64>().ok()? * 60.0;
        } else {
            secs += part.strip_suffix('s')?.parse::<f64>().ok()?;
        }
    }
    Some(secs)
}

fn set_revision(main_rs: &Path, revision: &str) {
    let src = fs::read_to_string(main_rs).unwrap();
    let start = src
        .find("const REVISION: &str = \"")
        .expect("REVISION line");
    let end = start + src[start..].find(";\n").unwrap() + 2;
    let new = format!(
        "{}const REVISION: &str = \"{revision}\";\n{}",
        &src[..start],
        &src[end..]
    );
    // An in-place save, as most editors do: one open(O_TRUNC)+write+close.
    fs::write(main_rs, new).unwrap();
}

// ---------------------------------------------------------------------------------------------
// A JSON-RPC connection to one variant

type StderrEvents = Receiver<(Instant, String)>;

struct Conn {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    next_id: u64,
    line: String,
    /// Timestamped stderr lines (supervisor variants only).
    events: Option<StderrEvents>,
}

impl Conn {
    fn spawn(name: &str, mut cmd: Command, stderr_log: Option<&Path>, home: &Path) -> Conn {
        cmd.env("CARGO_MCP_DEV_HOME", home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if stderr_log.is_some() {
            cmd.stderr(Stdio::piped());
        } else {
            cmd.stderr(Stdio::null());
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let events = stderr_log.map(|log| {
            let (tx, rx) = channel();
            let stderr = child.stderr.take().unwrap();
            let mut log = fs::File::create(log).unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    let now = Instant::now();
                    let _ = writeln!(log, "{line}");
                    if tx.send((now, line)).is_err() {
                        // Receiver gone: keep draining so the supervisor never blocks on stderr.
                    }
                }
            });
            rx
        });
        Conn {
            name: name.to_string(),
            stdin: child.stdin.take(),
            out: BufReader::new(child.stdout.take().unwrap()),
            child,
            next_id: 1,
            line: String::new(),
            events,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write to {}: {e}", self.name));
    }

    fn notify(&mut self, method: &str) {
        let msg = json!({"jsonrpc":"2.0","method":method});
        self.send_raw(format!("{msg}\n").as_bytes());
    }

    fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Reads lines until the response with `id`; notifications and other lines are skipped.
    /// Leaves the raw answer in `self.line`.
    fn read_answer(&mut self, id: u64) {
        let needle = format!("\"id\":{id},");
        let needle_end = format!("\"id\":{id}}}");
        loop {
            self.line.clear();
            let n = self
                .out
                .read_line(&mut self.line)
                .unwrap_or_else(|e| panic!("read from {}: {e}", self.name));
            assert!(n > 0, "{}: EOF while waiting for id {id}", self.name);
            // Cheap pre-check; the caller parses and validates after stopping any timer.
            if self.line.contains(&needle) || self.line.contains(&needle_end) {
                return;
            }
        }
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.alloc_id();
        let msg = json!({"jsonrpc":"2.0","id":id,"method":method,"params":params});
        self.send_raw(format!("{msg}\n").as_bytes());
        self.read_answer(id);
        let v: Value = serde_json::from_str(&self.line).unwrap();
        assert_eq!(v["id"], json!(id), "{}: answer id", self.name);
        v
    }

    fn echo_line(id: u64) -> String {
        format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"tools/call\",\"params\":{{\"name\":\"echo\",\"arguments\":{{\"text\":\"bench\"}}}}}}\n"
        )
    }

    /// Sends `line` (a request with `id`) and reads its answer into `self.line`; returns the
    /// nanoseconds from the write to the end of the answer line (no parsing inside the timer).
    fn timed_line(&mut self, id: u64, line: &str) -> u64 {
        let started = Instant::now();
        self.send_raw(line.as_bytes());
        self.read_answer(id);
        started.elapsed().as_nanos() as u64
    }

    /// One timed `tools/call echo` round trip; returns nanoseconds. Validates after timing.
    fn timed_echo(&mut self) -> u64 {
        let id = self.alloc_id();
        let ns = self.timed_line(id, &Self::echo_line(id));
        let v: Value = serde_json::from_str(&self.line).unwrap();
        assert!(
            v["result"]["isError"] != json!(true) && v["result"]["structuredContent"].is_object(),
            "{}: echo failed: {}",
            self.name,
            self.line
        );
        ns
    }

    /// Legacy handshake, tools/list, then calls until one passes (handles cold start and
    /// catalog_stale). Returns the serving revision.
    fn ready(&mut self) -> String {
        let init = self.request(
            "initialize",
            json!({"protocolVersion":"2025-06-18","capabilities":{},
                   "clientInfo":{"name":"proxy-bench","version":"0"}}),
        );
        assert!(
            init["result"].is_object(),
            "{}: initialize: {init}",
            self.name
        );
        self.notify("notifications/initialized");
        self.request("tools/list", json!({}));
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            match self.poll_call() {
                Poll::Served(rev) => return rev,
                Poll::Refused(_) => {}
            }
            assert!(
                Instant::now() < deadline,
                "{}: never became ready",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One untimed call; on catalog_stale refetches tools/list as a host would.
    fn poll_call(&mut self) -> Poll {
        let v = self.request(
            "tools/call",
            json!({"name":"echo","arguments":{"text":"poll"}}),
        );
        if let Some(rev) = v["result"]["structuredContent"]["revision"].as_str()
            && v["result"]["isError"] != json!(true)
        {
            return Poll::Served(rev.to_string());
        }
        let kind = v["result"]["_meta"][ERROR_META]["error"]
            .as_str()
            .map(str::to_string)
            .or_else(|| v["error"]["code"].as_i64().map(|c| format!("rpc {c}")))
            .unwrap_or_else(|| format!("unexpected: {v}"));
        if kind == "catalog_stale" {
            self.request("tools/list", json!({}));
        }
        Poll::Refused(kind)
    }

    /// Sends `n` calls from a writer thread (one write per message, as hosts do) while this
    /// thread reads the answers. Returns (elapsed, answers that were errors).
    fn pipelined(&mut self, n: usize) -> (Duration, usize) {
        let first = self.next_id;
        self.next_id += n as u64;
        let lines: Vec<String> = (first..first + n as u64).map(Self::echo_line).collect();
        let mut stdin = self.stdin.take().unwrap();
        let started = Instant::now();
        let writer = std::thread::spawn(move || {
            for l in &lines {
                stdin.write_all(l.as_bytes()).unwrap();
            }
            stdin
        });
        let mut answers = 0;
        let mut errors = 0;
        while answers < n {
            self.line.clear();
            let got = self.out.read_line(&mut self.line).unwrap();
            assert!(got > 0, "{}: EOF during pipelined run", self.name);
            if self.line.contains("\"id\":") {
                answers += 1;
                if self.line.contains("\"isError\":true") || self.line.contains("\"error\":{") {
                    errors += 1;
                }
            }
        }
        let took = started.elapsed();
        self.stdin = Some(writer.join().unwrap());
        (took, errors)
    }

    fn drain_events(&self) -> Vec<(Instant, String)> {
        self.events
            .as_ref()
            .map(|rx| rx.try_iter().collect())
            .unwrap_or_default()
    }

    fn close(mut self) {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        progress(&format!(
            "{} did not exit within 5 s of stdin EOF; killing",
            self.name
        ));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

enum Poll {
    Served(String),
    Refused(String),
}

// ---------------------------------------------------------------------------------------------
// /proc readings

fn proc_status_kb(pid: u32, key: &str) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn proc_cpu_ticks(pid: u32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// On-CPU time of all live threads of `pid` in ns (first field of each task's schedstat):
/// finer than the 10 ms ticks of /proc/<pid>/stat.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Context switches (voluntary + involuntary) over all threads of `pid`: the wake-ups a
/// process costs, whatever their CPU time.
fn ctxt_switches(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("status")).ok())
        .map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

fn ctxt_snapshot(v: &Variants) -> Vec<(u64, u64)> {
    v.conns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (proxy, server) = work_pids(c, i != DIRECT);
            (proxy.map_or(0, ctxt_switches), ctxt_switches(server))
        })
        .collect()
}

/// The processes doing the work of one variant: (proxy or None, server).
fn work_pids(c: &Conn, proxied: bool) -> (Option<u32>, u32) {
    if proxied {
        (Some(c.pid()), child_pid(c.pid()).unwrap_or(0))
    } else {
        (None, c.pid())
    }
}

fn cpu_snapshot(v: &Variants) -> Vec<(u64, u64)> {
    v.conns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (proxy, server) = work_pids(c, i != DIRECT);
            (proxy.map_or(0, cpu_ns), cpu_ns(server))
        })
        .collect()
}

fn proc_threads(pid: u32) -> u64 {
    proc_status_kb(pid, "Threads").unwrap_or(0)
}

/// The pid of the fake-server child of a supervisor or relay (first child found).
fn child_pid(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    s.split_whitespace().next()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Statistics

struct Summary {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    min: f64,
    max: f64,
}

fn summarize(xs: &[f64]) -> Summary {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    // Nearest-rank percentiles.
    let pct = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Summary {
        n: v.len(),
        p50: pct(0.50),
        p90: pct(0.90),
        p99: pct(0.99),
        min: v[0],
        max: v[v.len() - 1],
    }
}

// ---------------------------------------------------------------------------------------------

struct Variants {
    conns: Vec<Conn>,
}

const DIRECT: usize = 0;
const RELAY: usize = 1;
const RUN: usize = 2;
const HOPS: usize = 3;
const AUDIT_RELAY: usize = 4;

/// The fake-server copy every proxied phase runs: its workspace, target dir and release binary.
struct Server {
    dir: PathBuf,
    tgt: PathBuf,
    exe: PathBuf,
}

impl Server {
    fn manifest(&self) -> PathBuf {
        self.dir.join("Cargo.toml")
    }
}

/// Copies the fixture to `<work>/<name>` and builds it in release into `<work>/target-<name>`.
fn build_server(o: &Opts, name: &str) -> Server {
    let dir = o.work.join(name);
    let tgt = o.work.join(format!("target-{name}"));
    copy_fixture(&o.fixture, &dir);
    progress(&format!(
        "building fake-server (release) in {}",
        dir.display()
    ));
    let (took, _) = cargo_build(&dir.join("Cargo.toml"), &tgt, true);
    progress(&format!("  built in {:.2}s", took.as_secs_f64()));
    let exe = tgt.join("release/fake-server");
    Server { dir, tgt, exe }
}

/// `cargo-mcp-dev run --release --offline --manifest-path … --target-dir … --no-gating --no-watch`
/// against `srv`, as every phase but reload runs it.
fn run_command(o: &Opts, srv: &Server) -> Command {
    run_command_of(&o.mcp_dev, srv)
}

/// [`run_command`] of another `cargo-mcp-dev` binary (`--mcp-dev-b`).
fn run_command_of(mcp_dev: &Path, srv: &Server) -> Command {
    let mut cmd = Command::new(mcp_dev);
    cmd.args(["run", "--release", "--offline", "--manifest-path"])
        .arg(srv.manifest())
        .arg("--target-dir")
        .arg(&srv.tgt)
        .args(["--no-gating", "--no-watch"]);
    cmd
}

/// Starts direct, relay, run (and hops-relay with `with_hops`) on `srv`'s binary, each with `env`
/// (servers inherit it through the proxies), and makes each ready. `tag` names run's stderr log.
fn start_variants(
    o: &Opts,
    srv: &Server,
    tag: &str,
    env: &[(&str, &Path)],
    with_hops: bool,
) -> Variants {
    let home = o.work.join("home");
    fs::create_dir_all(&home).unwrap();
    let with_env = |mut cmd: Command| {
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    };
    let direct = Conn::spawn("direct", with_env(Command::new(&srv.exe)), None, &home);
    let mut relay_cmd = with_env(Command::new(&o.relay));
    relay_cmd.arg(&srv.exe);
    let relay = Conn::spawn("relay", relay_cmd, None, &home);
    let mut run_cmd = with_env(run_command(o, srv));
    if tag != "latency" {
        // Beside the latency phase's `run` of the same package: an audit log of its own (one
        // writer per log).
        run_cmd
            .arg("--audit-log")
            .arg(o.work.join(format!("audit-{tag}.jsonl")));
    }
    let run = Conn::spawn(
        "run",
        run_cmd,
        Some(&o.work.join(format!("run-{tag}.stderr"))),
        &home,
    );
    let mut conns = vec![direct, relay, run];
    if with_hops {
        let mut hops_cmd = with_env(Command::new(&o.hops));
        hops_cmd.arg(&srv.exe);
        conns.push(Conn::spawn("hops-relay", hops_cmd, None, &home));
        // The relay in its logging mode (see `src/bin/relay.rs`).
        let mut audit_cmd = with_env(Command::new(&o.relay));
        audit_cmd.arg(&srv.exe).env(
            "AUDIT_RELAY_LOG",
            o.work.join(format!("audit-relay-{tag}.log")),
        );
        conns.push(Conn::spawn("audit-relay", audit_cmd, None, &home));
        if o.mmap_relay {
            // The audit-relay copying each line into a shared map instead of a `write`.
            let mut mmap_cmd = with_env(Command::new(&o.relay));
            mmap_cmd
                .arg(&srv.exe)
                .env(
                    "AUDIT_RELAY_LOG",
                    o.work.join(format!("mmap-relay-{tag}.log")),
                )
                .env("AUDIT_RELAY_MMAP", "1");
            conns.push(Conn::spawn("mmap-relay", mmap_cmd, None, &home));
        }
        if o.seal_relay {
            // The mapped audit-relay sealing each line into a hash chain first.
            let mut seal_cmd = with_env(Command::new(&o.relay));
            seal_cmd
                .arg(&srv.exe)
                .env(
                    "AUDIT_RELAY_LOG",
                    o.work.join(format!("seal-relay-{tag}.log")),
                )
                .env("AUDIT_RELAY_MMAP", "1")
                .env("AUDIT_RELAY_SEAL", "1");
            conns.push(Conn::spawn("seal-relay", seal_cmd, None, &home));
        }
        if let Some(b) = &o.mcp_dev_b {
            let mut b_cmd = with_env(run_command_of(b, srv));
            b_cmd
                .arg("--audit-log")
                .arg(o.work.join(format!("audit-{tag}-b.jsonl")));
            conns.push(Conn::spawn(
                "run-b",
                b_cmd,
                Some(&o.work.join(format!("run-{tag}-b.stderr"))),
                &home,
            ));
        }
    }
    let mut v = Variants { conns };
    for c in &mut v.conns {
        let rev = c.ready();
        progress(&format!(
            "  {} ready (revision {rev}, pid {})",
            c.name,
            c.pid()
        ));
    }
    v
}

fn start_latency_variants(o: &Opts, srv: &Server, out: &mut String) -> Variants {
    let v = start_variants(o, srv, "latency", &[], true);
    out.push_str(&format!(
        "Server: `{}` (release), copied from the fixture; `run` executes its stored copy of the same bytes.\n\n",
        srv.exe.display()
    ));
    v
}

fn latency_phase(o: &Opts, v: &mut Variants, out: &mut String) {
    progress(&format!("latency: warm-up {} calls per variant", o.warmup));
    for _ in 0..o.warmup {
        for c in &mut v.conns {
            c.timed_echo();
        }
    }
    progress(&format!(
        "latency: {} calls per variant, rotating order, {} in a row per turn",
        o.calls, o.streak
    ));
    let k = v.conns.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(o.calls); k];
    let cpu_before = cpu_snapshot(v);
    let ctxt_before = ctxt_snapshot(v);
    // Turns of `o.streak` calls (1: call by call); the last turn may be shorter.
    for turn in 0..o.calls.div_ceil(o.streak) {
        let calls = o.streak.min(o.calls - turn * o.streak);
        for j in 0..k {
            let c = (turn + j) % k;
            for _ in 0..calls {
                samples[c].push(v.conns[c].timed_echo() as f64 / 1000.0);
            }
        }
    }
    let cpu_after = cpu_snapshot(v);
    let ctxt_after = ctxt_snapshot(v);
    let s: Vec<Summary> = samples.iter().map(|x| summarize(x)).collect();
    // Paired per-round ratio run/direct: the calls of one round ran within a few hundred µs.
    let paired = |a: usize| {
        let r: Vec<f64> = (0..o.calls)
            .map(|i| samples[a][i] / samples[DIRECT][i])
            .collect();
        summarize(&r).p50
    };
    out.push_str("## 1. Sequential `tools/call` round trip (µs)\n\n");
    let turns = if o.streak == 1 {
        "call by call".to_string()
    } else {
        format!(
            "{} calls in a row per turn (`--streak {}`)",
            o.streak, o.streak
        )
    };
    out.push_str(&format!(
        "{} calls per variant after {} warm-up calls each; the variants take turns {turns} (rotating order).\n\n",
        o.calls, o.warmup
    ));
    out.push_str("| variant | n | p50 | p90 | p99 | min | max | p50 / direct | p90 / direct | p99 / direct | median of paired ratios |\n");
    out.push_str("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (i, c) in v.conns.iter().enumerate() {
        let x = &s[i];
        let d = &s[DIRECT];
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            c.name,
            x.n,
            x.p50,
            x.p90,
            x.p99,
            x.min,
            x.max,
            x.p50 / d.p50,
            x.p90 / d.p90,
            x.p99 / d.p99,
            paired(i)
        ));
    }
    out.push_str("\nOn-CPU time per call (µs; sum over all threads from /proc/<pid>/task/*/schedstat, over the measured calls):\n\n| variant | proxy process | server process |\n|---|---|---|\n");
    for (i, c) in v.conns.iter().enumerate() {
        let per = |a: u64, b: u64| (b - a) as f64 / 1000.0 / o.calls as f64;
        out.push_str(&format!(
            "| {} | {} | {:.1} |\n",
            c.name,
            if i == DIRECT {
                "-".into()
            } else {
                format!("{:.1}", per(cpu_before[i].0, cpu_after[i].0))
            },
            per(cpu_before[i].1, cpu_after[i].1)
        ));
    }
    out.push_str("\nContext switches per call (voluntary + involuntary, all threads, from /proc/<pid>/task/*/status):\n\n| variant | proxy process | server process |\n|---|---|---|\n");
    for (i, c) in v.conns.iter().enumerate() {
        let per = |a: u64, b: u64| (b - a) as f64 / o.calls as f64;
        out.push_str(&format!(
            "| {} | {} | {:.2} |\n",
            c.name,
            if i == DIRECT {
                "-".into()
            } else {
                format!("{:.2}", per(ctxt_before[i].0, ctxt_after[i].0))
            },
            per(ctxt_before[i].1, ctxt_after[i].1)
        ));
    }
    let hop = s[RELAY].p50 - s[DIRECT].p50;
    let run_extra = s[RUN].p50 - s[DIRECT].p50;
    let hops_extra = s[HOPS].p50 - s[DIRECT].p50;
    out.push_str(&format!(
        "\nAdded p50 latency over direct: relay {hop:.1} µs, hops-relay {hops_extra:.1} µs, run {run_extra:.1} µs (run − relay: {:.1} µs; run − hops-relay: {:.1} µs).\n\n",
        run_extra - hop,
        run_extra - hops_extra
    ));
    if s.len() > AUDIT_RELAY {
        let floor = s[AUDIT_RELAY].p50;
        out.push_str(&format!(
            "The floor of a proxy that writes every message to a file before passing it on (audit-relay): p50 {floor:.1} µs, {:.3}x the relay; run is {:.3}x that floor (run − audit-relay: {:.1} µs of the proxy's own work).\n\n",
            floor / s[RELAY].p50,
            s[RUN].p50 / floor,
            s[RUN].p50 - floor
        ));
    }
    out.push_str(&mmap_floor_line(&v, &s));
    let rr = s[RUN].p50 / s[RELAY].p50;
    let run_cpu = (cpu_after[RUN].0 - cpu_before[RUN].0) as f64 / 1000.0 / o.calls as f64;
    out.push_str(&format!(
        "GOAL (issue 15) latency p50 run/relay <= 1.10: {rr:.3} -> {}\n\nGOAL (issue 15) supervisor CPU per call <= 8 µs (the pinned pass counts): {run_cpu:.1} µs -> {}\n\n",
        met(rr <= 1.10),
        met(run_cpu <= 8.0)
    ));
    out.push_str(&format!(
        "GOAL latency p50 run/direct <= 1.15: {:.3} -> {}\n\n",
        s[RUN].p50 / s[DIRECT].p50,
        met(s[RUN].p50 / s[DIRECT].p50 <= 1.15)
    ));
}

/// Calls at a host's pace: a pause before each, the variants taking turns (rotating order).
fn spaced_phase(o: &Opts, v: &mut Variants, out: &mut String) {
    let gap = Duration::from_millis(o.spaced_gap_ms);
    progress(&format!(
        "spaced: {} calls per variant, {} ms of quiet before each",
        o.spaced, o.spaced_gap_ms
    ));
    let k = v.conns.len();
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(o.spaced); k];
    for round in 0..o.spaced {
        for j in 0..k {
            let c = (round + j) % k;
            std::thread::sleep(gap);
            samples[c].push(v.conns[c].timed_echo() as f64 / 1000.0);
        }
    }
    let s: Vec<Summary> = samples.iter().map(|x| summarize(x)).collect();
    out.push_str("## 1b. Spaced `tools/call` round trip (µs): a host's pace\n\n");
    out.push_str(&format!(
        "{} calls per variant, each after {} ms in which no variant was called (every process on the path is asleep, its caches cold: the case of a real host, whose agent calls a tool every few seconds); rotating order.\n\n",
        o.spaced, o.spaced_gap_ms
    ));
    out.push_str(
        "| variant | n | p50 | p90 | p99 | min | p50 / direct | p50 / relay | p50 − direct |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for (i, c) in v.conns.iter().enumerate() {
        let x = &s[i];
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.1} |\n",
            c.name,
            x.n,
            x.p50,
            x.p90,
            x.p99,
            x.min,
            x.p50 / s[DIRECT].p50,
            x.p50 / s[RELAY].p50,
            x.p50 - s[DIRECT].p50
        ));
    }
    if s.len() > AUDIT_RELAY {
        out.push_str(&format!(
            "\nSpaced p50: run / relay {:.3}, run / audit-relay {:.3} (run − audit-relay: {:.1} µs).\n\n",
            s[RUN].p50 / s[RELAY].p50,
            s[RUN].p50 / s[AUDIT_RELAY].p50,
            s[RUN].p50 - s[AUDIT_RELAY].p50
        ));
    }
    out.push_str(&mmap_floor_line(v, &s));
}

/// With `--mmap-relay` / `--seal-relay`: the floors of a proxy that records every message the
/// way `run` writes its log on Linux (a copy into a mapped file), and that seals each one into a
/// hash chain as well, beside `run`.
fn mmap_floor_line(v: &Variants, s: &[Summary]) -> String {
    let mut out = String::new();
    for (name, what) in [
        (
            "mmap-relay",
            "copies every message into a mapped file before passing it on (mmap-relay: how `run` writes its log on Linux)",
        ),
        (
            "seal-relay",
            "seals every message into a hash chain (SHA-256 of a canonical record, HMAC-SHA256 of the hash, `run`'s layout) and copies the record into a mapped file before passing it on (seal-relay)",
        ),
    ] {
        let Some(m) = v.conns.iter().position(|c| c.name == name) else {
            continue;
        };
        let floor = s[m].p50;
        out.push_str(&format!(
            "The floor of a proxy that {what}: p50 {floor:.1} µs, {:.3}x the relay; run is {:.3}x that floor (run − {name}: {:.1} µs).\n\n",
            floor / s[RELAY].p50,
            s[RUN].p50 / floor,
            s[RUN].p50 - floor
        ));
    }
    out
}

fn rss_line(label: &str, pid: u32) -> String {
    format!(
        "| {label} | {} | {} | {} |\n",
        proc_status_kb(pid, "VmRSS").map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        proc_status_kb(pid, "VmHWM").map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        proc_threads(pid)
    )
}

fn memory_section(v: &Variants, when: &str, out: &mut String) {
    out.push_str(&format!(
        "### Memory {when}\n\n| process | VmRSS MB | VmHWM MB | threads |\n|---|---|---|---|\n"
    ));
    let run = v.conns[RUN].pid();
    out.push_str(&rss_line("cargo-mcp-dev run (supervisor)", run));
    if let Some(c) = child_pid(run) {
        out.push_str(&rss_line("  its fake-server child", c));
    }
    out.push_str(&rss_line("relay", v.conns[RELAY].pid()));
    out.push_str(&rss_line("hops-relay", v.conns[HOPS].pid()));
    out.push_str(&rss_line("fake-server (direct)", v.conns[DIRECT].pid()));
    let hwm = proc_status_kb(run, "VmHWM").unwrap_or(u64::MAX) as f64 / 1024.0;
    out.push_str(&format!(
        "\nGOAL supervisor RSS < 20 MB (VmHWM {when}): {hwm:.1} MB -> {}\n\n",
        met(hwm < 20.0)
    ));
}

fn throughput_phase(o: &Opts, v: &mut Variants, out: &mut String) {
    let k = v.conns.len();
    progress("throughput: warm-up round");
    for c in &mut v.conns {
        c.pipelined(o.pipelined / 10);
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); k];
    let mut cpu: Vec<(u64, u64)> = vec![(0, 0); k];
    for round in 0..o.tp_rounds {
        for j in 0..k {
            let c = (round + j) % k;
            let before = cpu_snapshot(v);
            let (took, errors) = v.conns[c].pipelined(o.pipelined);
            let after = cpu_snapshot(v);
            cpu[c].0 += after[c].0 - before[c].0;
            cpu[c].1 += after[c].1 - before[c].1;
            assert_eq!(errors, 0, "{}: errors in pipelined run", v.conns[c].name);
            let rate = o.pipelined as f64 / took.as_secs_f64();
            progress(&format!(
                "  round {round} {}: {:.0} calls/s",
                v.conns[c].name, rate
            ));
            rates[c].push(rate);
        }
    }
    out.push_str("## 2. Pipelined throughput (calls/s)\n\n");
    out.push_str(&format!(
        "{} calls sent without waiting (writer thread, one write per message), all answers read; {} rounds, variant order rotating per round; one variant at a time.\n\n",
        o.pipelined, o.tp_rounds
    ));
    out.push_str("| variant | rounds | median | min | max | median / direct | proxy CPU µs/call | server CPU µs/call |\n|---|---|---|---|---|---|---|---|\n");
    let d = summarize(&rates[DIRECT]).p50;
    let calls = (o.pipelined * o.tp_rounds) as f64;
    for (i, c) in v.conns.iter().enumerate() {
        let s = summarize(&rates[i]);
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.3} | {} | {:.1} |\n",
            c.name,
            s.n,
            s.p50,
            s.min,
            s.max,
            s.p50 / d,
            if i == DIRECT {
                "-".into()
            } else {
                format!("{:.1}", cpu[i].0 as f64 / 1000.0 / calls)
            },
            cpu[i].1 as f64 / 1000.0 / calls
        ));
    }
    let r = summarize(&rates[RUN]).p50 / d;
    let rr = summarize(&rates[RUN]).p50 / summarize(&rates[RELAY]).p50;
    if let Some(m) = v.conns.iter().position(|c| c.name == "seal-relay") {
        let floor = summarize(&rates[m]).p50;
        out.push_str(&format!(
            "\nThe floor of a proxy that seals every message before passing it on (seal-relay): {floor:.0} calls/s, {:.3}x the relay, {:.1} µs of its CPU per call; run is {:.3}x that floor.\n",
            floor / summarize(&rates[RELAY]).p50,
            cpu[m].0 as f64 / 1000.0 / calls,
            summarize(&rates[RUN]).p50 / floor
        ));
    }
    out.push_str(&format!(
        "\nGOAL (issue 15) throughput run/relay >= 0.90: {rr:.3} -> {}\n\nGOAL throughput run/direct >= 0.9: {r:.3} -> {}\n\n",
        met(rr >= 0.9),
        met(r >= 0.9)
    ));
}

// ---------------------------------------------------------------------------------------------
// Reload and idle

struct Watched {
    conn: Conn,
    main_rs: PathBuf,
    revision: String,
}

fn start_watched(o: &Opts, name: &str, debounce: Option<u64>) -> Watched {
    let dir = o.work.join(format!("rl-{name}"));
    let tgt = o.work.join(format!("target-rl-{name}"));
    copy_fixture(&o.fixture, &dir);
    let home = o.work.join("home");
    fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(&o.mcp_dev);
    cmd.args(["run", "--offline", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&tgt)
        .arg("--no-gating");
    if let Some(ms) = debounce {
        cmd.args(["--debounce", &ms.to_string()]);
    }
    let mut conn = Conn::spawn(
        name,
        cmd,
        Some(&o.work.join(format!("run-{name}.stderr"))),
        &home,
    );
    progress(&format!(
        "reload: starting {name} (cold debug build of the fixture)"
    ));
    let revision = conn.ready();
    progress(&format!("  {name} ready (revision {revision})"));
    Watched {
        conn,
        main_rs: dir.join("src/main.rs"),
        revision,
    }
}

fn next_revision(cur: &str) -> String {
    if cur == "r1" {
        "r2".into()
    } else {
        "r1".into()
    }
}

#[derive(Default, Clone)]
struct ReloadSample {
    total_ms: f64,
    /// cargo's `Finished … in Xs` as relayed on the supervisor's stderr.
    finished_s: Option<f64>,
    /// save -> the Finished line arrived on stderr
    to_finished_ms: Option<f64>,
    to_build_complete_ms: Option<f64>,
    to_replaced_ms: Option<f64>,
    polls: usize,
    refusals: HashMap<String, usize>,
}

fn reload_once(w: &mut Watched) -> ReloadSample {
    let new_rev = next_revision(&w.revision);
    let _ = w.conn.drain_events();
    set_revision(&w.main_rs, &new_rev);
    let t0 = Instant::now();
    let mut s = ReloadSample::default();
    let deadline = t0 + Duration::from_secs(180);
    loop {
        s.polls += 1;
        match w.conn.poll_call() {
            Poll::Served(rev) if rev == new_rev => break,
            Poll::Served(_) => {}
            Poll::Refused(kind) => *s.refusals.entry(kind).or_default() += 1,
        }
        assert!(
            Instant::now() < deadline,
            "{}: reload never served",
            w.conn.name
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    s.total_ms = t0.elapsed().as_secs_f64() * 1000.0;
    w.revision = new_rev;
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1000.0;
    for (at, line) in w.conn.drain_events() {
        if let Some(secs) = finished_secs(&line) {
            s.finished_s = Some(secs);
            s.to_finished_ms = Some(ms(at));
        } else if line.starts_with("build complete:") {
            s.to_build_complete_ms = Some(ms(at));
        } else if line.starts_with("server replaced:") {
            s.to_replaced_ms = Some(ms(at));
        }
    }
    s
}

fn idle_phase(o: &Opts, watched: &Watched, v: Option<&Variants>, out: &mut String) {
    progress(&format!("idle: {} s of idleness", o.idle_secs));
    // Let the last start settle (status files, catalog fetch) before the window opens.
    std::thread::sleep(Duration::from_secs(2));
    let mut pids = vec![(
        "cargo-mcp-dev run, watcher on".to_string(),
        watched.conn.pid(),
    )];
    if let Some(v) = v {
        pids.push(("cargo-mcp-dev run --no-watch".into(), v.conns[RUN].pid()));
        pids.push(("relay".into(), v.conns[RELAY].pid()));
    }
    let before: Vec<u64> = pids.iter().map(|(_, p)| proc_cpu_ticks(*p)).collect();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(o.idle_secs));
    let secs = t.elapsed().as_secs_f64();
    out.push_str("## 4b. Idle CPU\n\n");
    out.push_str(&format!(
        "utime+stime from /proc/<pid>/stat (all threads; CLK_TCK={}) over {secs:.1} s with no traffic and no edits.\n\n| process | ticks | % of one core |\n|---|---|---|\n",
        o.clk_tck
    ));
    let mut watched_pct = 0.0;
    for (i, (label, pid)) in pids.iter().enumerate() {
        let d = proc_cpu_ticks(*pid) - before[i];
        let pct = d as f64 / o.clk_tck as f64 / secs * 100.0;
        if i == 0 {
            watched_pct = pct;
        }
        out.push_str(&format!("| {label} | {d} | {pct:.3} |\n"));
    }
    out.push_str(&format!(
        "\nGOAL idle CPU ~0 (watcher on): {watched_pct:.3}% -> {}\n\n",
        met(watched_pct < 0.1)
    ));
}

fn reload_phase(o: &Opts, watched: Vec<Watched>, out: &mut String) {
    let twin = o.work.join("rl-cargo");
    let twin_tgt = o.work.join("target-rl-cargo");
    copy_fixture(&o.fixture, &twin);
    progress("reload: warming the cargo twin");
    cargo_build(&twin.join("Cargo.toml"), &twin_tgt, false);
    let twin_rs = twin.join("src/main.rs");
    let mut twin_rev = "r1".to_string();
    let mut watched = watched;
    let k = watched.len() + 1;
    let mut samples: Vec<Vec<ReloadSample>> = vec![Vec::new(); watched.len()];
    let mut cargo_wall: Vec<f64> = Vec::new();
    let mut cargo_finished: Vec<f64> = Vec::new();
    // Per round, the cargo time paired with each supervisor sample of that round.
    for round in 0..o.reloads {
        for j in 0..k {
            let which = (round + j) % k;
            if which == watched.len() {
                twin_rev = next_revision(&twin_rev);
                set_revision(&twin_rs, &twin_rev);
                let (took, fin) = cargo_build(&twin.join("Cargo.toml"), &twin_tgt, false);
                cargo_wall.push(took.as_secs_f64() * 1000.0);
                cargo_finished.push(fin.unwrap_or(f64::NAN));
                progress(&format!(
                    "  round {round} cargo: {:.0} ms",
                    took.as_secs_f64() * 1000.0
                ));
            } else {
                let s = reload_once(&mut watched[which]);
                progress(&format!(
                    "  round {round} {}: {:.0} ms total, cargo Finished {:?} s, polls {}, refusals {:?}",
                    watched[which].conn.name, s.total_ms, s.finished_s, s.polls, s.refusals
                ));
                samples[which].push(s);
            }
            // Let the old child stop and the system settle before the next edit.
            std::thread::sleep(Duration::from_millis(700));
        }
    }
    let cw = summarize(&cargo_wall);
    out.push_str("## 3. Reload overhead (ms)\n\n");
    out.push_str(&format!(
        "Debug profile, in-place save of `src/main.rs` (REVISION r1 <-> r2), then calls polled every ~1 ms until `structuredContent.revision` is the new one (catalog_stale handled by refetching tools/list). {} rounds; in each round the supervisors and a plain `cargo build` of the same edit on a twin copy (same arguments as `run` uses: `cargo build --message-format=json-render-diagnostics --package fake-server --bin fake-server --offline`) take turns in rotating order.\n\n",
        o.reloads
    ));
    out.push_str(&format!(
        "Plain `cargo build` of the edit, wall clock: p50 {:.0}, p90 {:.0}, min {:.0}, max {:.0} (n={}); its own `Finished in` p50 {:.2} s.\n\n",
        cw.p50,
        cw.p90,
        cw.min,
        cw.max,
        cw.n,
        summarize(&cargo_finished).p50
    ));
    // cargo's own time outside its `Finished in` timer (process start before its clock, exit).
    let startup: Vec<f64> = cargo_wall
        .iter()
        .zip(&cargo_finished)
        .filter(|(_, f)| f.is_finite())
        .map(|(w, f)| w - f * 1000.0)
        .collect();
    let cargo_outside = if startup.is_empty() {
        0.0
    } else {
        summarize(&startup).p50
    };
    out.push_str(&format!(
        "cargo's wall clock minus its own `Finished in` (process start/exit outside its timer), twin: p50 {cargo_outside:.0} ms.\n\n"
    ));
    out.push_str("| supervisor | n | total p50 | total p90 | overhead A = total − `Finished in` of the same build: p50 | p90 | min | max | overhead B = A − cargo outside its timer (p50) | overhead C = total − twin cargo wall, same round: p50 | p90 |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut goal_lines = String::new();
    let mut breakdown = String::new();
    for (i, w) in watched.iter().enumerate() {
        let ss = &samples[i];
        let totals: Vec<f64> = ss.iter().map(|s| s.total_ms).collect();
        // Pair each sample with the twin cargo build of the same round.
        let over_twin: Vec<f64> = ss
            .iter()
            .enumerate()
            .map(|(r, s)| s.total_ms - cargo_wall[r])
            .collect();
        let over_fin: Vec<f64> = ss
            .iter()
            .filter_map(|s| Some(s.total_ms - s.finished_s? * 1000.0))
            .collect();
        let t = summarize(&totals);
        let ot = summarize(&over_twin);
        let of = summarize(&over_fin);
        if w.conn.name == "debounce-default" {
            goal_lines.push_str(&format!(
                "GOAL (issue 15) save -> new epoch serving, minus cargo's build, default settings <= 60 ms (overhead A p50): {:.0} ms -> {}\n\n",
                of.p50,
                met(of.p50 <= 60.0)
            ));
        }
        goal_lines.push_str(&format!(
            "GOAL reload overhead < 100 ms ({}, overhead A p50): {:.0} ms -> {}\n\n",
            w.conn.name,
            of.p50,
            met(of.p50 < 100.0)
        ));
        out.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |\n",
            w.conn.name,
            t.n,
            t.p50,
            t.p90,
            of.p50,
            of.p90,
            of.min,
            of.max,
            of.p50 - cargo_outside,
            ot.p50,
            ot.p90
        ));
        let med = |f: &dyn Fn(&ReloadSample) -> Option<f64>| {
            let xs: Vec<f64> = ss.iter().filter_map(f).collect();
            if xs.is_empty() {
                f64::NAN
            } else {
                summarize(&xs).p50
            }
        };
        let fin_at = med(&|s| s.to_finished_ms);
        let fin_s = med(&|s| s.finished_s.map(|x| x * 1000.0));
        let pre = med(&|s| Some(s.to_finished_ms? - s.finished_s? * 1000.0));
        let capture = med(&|s| Some(s.to_build_complete_ms? - s.to_finished_ms?));
        let swap = med(&|s| Some(s.to_replaced_ms? - s.to_build_complete_ms?));
        let serve = med(&|s| Some(s.total_ms - s.to_replaced_ms?));
        let polls = med(&|s| Some(s.polls as f64));
        let mut refusals: HashMap<String, usize> = HashMap::new();
        for s in ss {
            for (k, n) in &s.refusals {
                *refusals.entry(k.clone()).or_default() += n;
            }
        }
        breakdown.push_str(&format!(
            "| {} | {fin_at:.0} | {fin_s:.0} | {pre:.0} | {capture:.1} | {swap:.1} | {serve:.1} | {polls:.0} | {:?} |\n",
            w.conn.name, refusals
        ));
    }
    out.push_str("\nWhere the time goes (medians over the reloads, ms; timestamps are when the harness read each stderr line):\n\n");
    out.push_str("| supervisor | save -> cargo `Finished` line | cargo's `Finished in` | save -> cargo timer start (debounce + watcher + cargo startup/resolve) | `Finished` -> `build complete` (identity capture, store) | `build complete` -> `server replaced` (stop old, spawn, handshake, catalog) | `server replaced` -> first new-revision answer | polls | refusals seen (all reloads) |\n|---|---|---|---|---|---|---|---|---|\n");
    out.push_str(&breakdown);
    out.push('\n');
    out.push_str(&goal_lines);
    for w in watched {
        w.conn.close();
    }
}

fn main() {
    let o = parse_opts();
    fs::create_dir_all(&o.work).unwrap();
    // Target dirs are reused between runs (warm cargo caches), but each run starts with fresh
    // supervisor state: an audit log carried over would grow by ~100k records per run, and its
    // anchor lives in the home dir, so both go together.
    let _ = fs::remove_dir_all(o.work.join("home"));
    for entry in fs::read_dir(&o.work).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("target-") {
            let _ = fs::remove_dir_all(entry.path().join("mcp-dev"));
        }
        // Logs given with `--audit-log` (and what an earlier run set aside): their key went
        // with the home dir, so a kept one would only be set aside again at the next start.
        if name.starts_with("audit-") && (name.ends_with(".jsonl") || name.ends_with(".lock")) {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut out = String::new();
    let has = |p: &str| o.phases.iter().any(|x| x == p);
    out.push_str(&format!(
        "cargo-mcp-dev: `{}`; relay: `{}`; hops-relay: `{}`; work dir: `{}`\n\n",
        o.mcp_dev.display(),
        o.relay.display(),
        o.hops.display(),
        o.work.display()
    ));
    let needs_server = [
        "latency",
        "spaced",
        "throughput",
        "idle",
        "list",
        "start",
        "exit",
    ]
    .iter()
    .any(|p| has(p));
    let srv = needs_server.then(|| build_server(&o, "srv"));
    let mut variants = None;
    if has("latency") || has("spaced") || has("throughput") || has("idle") || has("list") {
        variants = Some(start_latency_variants(&o, srv.as_ref().unwrap(), &mut out));
    }
    if let Some(v) = variants.as_mut() {
        if has("latency") {
            latency_phase(&o, v, &mut out);
            memory_section(v, "after the latency run", &mut out);
        }
        if has("spaced") {
            spaced_phase(&o, v, &mut out);
        }
        if has("throughput") {
            throughput_phase(&o, v, &mut out);
            memory_section(v, "after the throughput run", &mut out);
            let hwm =
                proc_status_kb(v.conns[RUN].pid(), "VmHWM").unwrap_or(u64::MAX) as f64 / 1024.0;
            out.push_str(&format!(
                "GOAL (issue 15) supervisor RSS with {} calls in flight <= 16 MB (VmHWM): {hwm:.1} MB -> {}\n\n",
                o.pipelined,
                met(hwm <= 16.0)
            ));
        }
        if has("list") {
            list::list_phase(&o, srv.as_ref().unwrap(), v, &mut out);
        }
    }
    if has("idle") || has("reload") {
        let mut watched = vec![start_watched(&o, "debounce-default", None)];
        if has("reload") {
            watched.push(start_watched(&o, "debounce-0", Some(0)));
        }
        if has("idle") {
            idle_phase(&o, &watched[0], variants.as_ref(), &mut out);
        }
        if has("reload") {
            reload_phase(&o, watched, &mut out);
        } else {
            for w in watched {
                w.conn.close();
            }
        }
    }
    if let Some(v) = variants {
        for c in v.conns {
            c.close();
        }
    }
    if has("start") {
        lifecycle::start_phase(&o, srv.as_ref().unwrap(), &mut out);
    }
    if has("exit") {
        lifecycle::exit_phase(&o, srv.as_ref().unwrap(), &mut out);
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(out.as_bytes()).unwrap();
}
