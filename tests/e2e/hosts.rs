//! Real agent hosts (issue 33 item 7): Claude Code 2.1.337 and 2.1.197, Codex CLI 0.171.0 and
//! Gemini CLI 0.61.0, installed from the npm registry at pinned versions (`e2e/install-hosts.sh`),
//! each driven non-interactively against `cargo-mcp-dev run` supervising the inventory fixture.
//!
//! The model is `e2e/hosts/fake_model.py` on 127.0.0.1: for each prompt it asks for the host's
//! `list_items` tool (found by name suffix in the request's tools), records the tool result the
//! host sends back and the tool definitions the host showed it, and answers a final text. The
//! assertion is on that record: the tool result the model got is the server's real answer from
//! the right build (`revision`, the item list), not an error. Every host process gets a fresh
//! temp HOME (config, remembered state) per scenario, the scenario's tag (so the harness kills
//! whatever is left) and a timeout. What each host showed in each start state is printed as a
//! `hosts-report:` line and appended to `target/e2e-hosts-report.txt` (the README's table).

use super::*;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Host {
    Claude337,
    Claude197,
    Codex,
    Gemini,
}

impl Host {
    fn dir(self) -> &'static str {
        match self {
            Host::Claude337 => "claude-2.1.337",
            Host::Claude197 => "claude-2.1.197",
            Host::Codex => "codex-0.171.0",
            Host::Gemini => "gemini-0.61.0",
        }
    }

    fn bin(self) -> PathBuf {
        let name = match self {
            Host::Claude337 | Host::Claude197 => "claude",
            Host::Codex => "codex",
            Host::Gemini => "gemini",
        };
        peers_dir()
            .join("hosts")
            .join(self.dir())
            .join("node_modules/.bin")
            .join(name)
    }

    fn is_claude(self) -> bool {
        matches!(self, Host::Claude337 | Host::Claude197)
    }
}

/// The hosts installed once per test binary; a failure fails the scenario (never a skip).
fn hosts_ready() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let r = READY.get_or_init(|| {
        let t = Instant::now();
        let out = Command::new(repo().join("e2e/install-hosts.sh"))
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run e2e/install-hosts.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "e2e/install-hosts.sh failed ({}): a missing host is a failure, not a skip\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        eprintln!("e2e: hosts ready in {:.1}s", t.elapsed().as_secs_f64());
        Ok(())
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

/// A toolchain variable the supervisor's cargo needs although the host runs with a temp HOME.
fn toolchain_env() -> Vec<(String, String)> {
    let real_home = std::env::var("HOME").unwrap_or_default();
    let mut v = Vec::new();
    for (key, default) in [("RUSTUP_HOME", ".rustup"), ("CARGO_HOME", ".cargo")] {
        let val = std::env::var(key).unwrap_or_else(|_| format!("{real_home}/{default}"));
        v.push((key.to_string(), val));
    }
    for key in ["PATH", "RUSTUP_TOOLCHAIN"] {
        if let Ok(val) = std::env::var(key) {
            v.push((key.to_string(), val));
        }
    }
    v
}

// ----- the fake model -------------------------------------------------------------------------

pub struct FakeModel {
    child: Child,
    log: PathBuf,
    pub port: u16,
}

impl FakeModel {
    /// Starts `e2e/hosts/fake_model.py` with `script`; waits for its port.
    pub fn start(s: &Scenario, script: Value) -> FakeModel {
        let dir = s.root.path().join("fake-model");
        std::fs::create_dir_all(&dir).unwrap();
        let script_path = dir.join("script.json");
        std::fs::write(&script_path, script.to_string()).unwrap();
        let log = dir.join("log.jsonl");
        let port_file = dir.join("port");
        let mut cmd = Command::new("python3");
        cmd.arg(repo().join("e2e/hosts/fake_model.py"))
            .arg("--script")
            .arg(&script_path)
            .arg("--log")
            .arg(&log)
            .arg("--port-file")
            .arg(&port_file)
            .args(["--idle", "300", "--lifetime", "900"])
            .envs(s.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(dir.join("stderr.txt")).unwrap(),
            ));
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().expect("start the fake model (python3)");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.trim().parse::<u16>().ok())
            {
                break p;
            }
            assert!(Instant::now() < deadline, "the fake model did not listen");
            std::thread::sleep(Duration::from_millis(50));
        };
        FakeModel { child, log, port }
    }

    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn results_from(&self, from: usize) -> Vec<Value> {
        self.records()
            .into_iter()
            .skip(from)
            .filter(|r| r["event"] == json!("tool_result"))
            .collect()
    }

    /// Waits until a tool result arrived after record `from`: the first one.
    pub fn wait_result(&self, from: usize, timeout: Duration) -> Option<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.results_from(from).into_iter().next() {
                return Some(r);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

/// What the model got in records `from..`: one line for the report.
fn model_got(records: &[Value]) -> String {
    let mut out = Vec::new();
    for r in records {
        match r["event"].as_str() {
            Some("tool_missing") => out.push("no inventory tool in the request".to_string()),
            Some("wait_call") => out.push("called WaitForMcpServers".to_string()),
            Some("tool_result") => {
                let found = &r["found"];
                if r["isError"] == json!(true) || found.is_null() {
                    let text: String = r["text"].as_str().unwrap_or("").chars().take(160).collect();
                    out.push(format!("tool result without the answer: {text:?}"));
                } else {
                    out.push(format!("revision {}", found["revision"]));
                }
            }
            _ => {}
        }
    }
    if out.is_empty() {
        "no prompt reached the model".to_string()
    } else {
        out.join("; ")
    }
}

fn report(host: Host, state: &str, got: &str, elapsed: Duration) {
    let line = format!(
        "hosts-report: {} | {state} | {got} | {:.1}s",
        host.dir(),
        elapsed.as_secs_f64()
    );
    eprintln!("{line}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(repo().join("target/e2e-hosts-report.txt"))
    {
        let _ = writeln!(f, "{line}");
    }
}

/// Asserts the model got the server's real `list_items` answer of `revision`.
fn assert_real_answer(result: &Value, revision: &str, what: &str) {
    assert_eq!(result["isError"], json!(false), "{what}: {result}");
    let found = &result["found"];
    assert_eq!(found["revision"], json!(revision), "{what}: {result}");
    assert_eq!(
        found["items"],
        json!([{"sku": "widget", "qty": 12}, {"sku": "gadget", "qty": 3}, {"sku": "sprocket", "qty": 40}]),
        "{what}: {result}"
    );
}

// ----- host configuration and runs -------------------------------------------------------------

/// One host's temp home for a scenario, and the MCP server entry pointing at the supervisor.
pub struct HostRig {
    pub host: Host,
    pub home: PathBuf,
    server_argv: Vec<String>,
    server_env: Vec<(String, String)>,
    runs: usize,
}

impl HostRig {
    pub fn new(s: &Scenario, host: Host, run_extra: &[&str]) -> HostRig {
        hosts_ready();
        let home = s.root.path().join(format!("home-{}", host.dir()));
        std::fs::create_dir_all(&home).unwrap();
        let mut server_env = s.env();
        server_env.extend(toolchain_env());
        HostRig {
            host,
            home,
            server_argv: s.run_argv(run_extra),
            server_env,
            runs: 0,
        }
    }

    fn env_object(&self) -> Value {
        Value::Object(
            self.server_env
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect(),
        )
    }

    /// Writes the host's config for a model on `port`; returns (argv after the binary, env).
    fn configure(&self, port: u16, prompt: Option<&str>) -> (Vec<String>, Vec<(String, String)>) {
        let server = json!({
            "command": self.server_argv[0],
            "args": self.server_argv[1..],
            "env": self.env_object(),
        });
        let home = self.home.display().to_string();
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), home.clone()),
            ("XDG_CONFIG_HOME".into(), format!("{home}/.config")),
            ("XDG_CACHE_HOME".into(), format!("{home}/.cache")),
            ("XDG_DATA_HOME".into(), format!("{home}/.local/share")),
            ("NO_COLOR".into(), "1".into()),
        ];
        env.extend(toolchain_env());
        let args: Vec<String> = match self.host {
            Host::Claude337 | Host::Claude197 => {
                let cfg = self.home.join("mcp.json");
                std::fs::write(&cfg, json!({"mcpServers": {"inventory": server}}).to_string())
                    .unwrap();
                env.extend(
                    [
                        ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
                        ("ANTHROPIC_API_KEY", "fake-key".into()),
                        ("CLAUDE_CONFIG_DIR", format!("{home}/.claude")),
                        ("DISABLE_TELEMETRY", "1".into()),
                        ("DISABLE_AUTOUPDATER", "1".into()),
                        ("DISABLE_ERROR_REPORTING", "1".into()),
                        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
                        // MCP tools in the request itself, not behind the ToolSearch tool.
                        ("ENABLE_TOOL_SEARCH", "false".into()),
                    ]
                    .map(|(k, v)| (k.to_string(), v)),
                );
                let mut a: Vec<String> = vec!["-p".into()];
                if let Some(p) = prompt {
                    a.push(p.into());
                } else {
                    a.extend(["--input-format".into(), "stream-json".into()]);
                }
                a.extend(
                    [
                        "--output-format",
                        "stream-json",
                        "--verbose",
                        "--mcp-config",
                        &cfg.display().to_string(),
                        "--strict-mcp-config",
                        "--allowedTools",
                        "mcp__inventory__list_items",
                        "--debug-file",
                        &self.home.join(format!("debug-{}.txt", self.runs)).display().to_string(),
                    ]
                    .map(String::from),
                );
                a
            }
            Host::Codex => {
                let codex_home = self.home.join("codex");
                std::fs::create_dir_all(&codex_home).unwrap();
                let env_table: Vec<String> = self
                    .server_env
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", json!(v)))
                    .collect();
                let toml = format!(
                    "model = \"fake-model\"\nmodel_provider = \"fake\"\n\n\
                     [features]\nplugins = false\nremote_plugin = false\napps = false\n\n\
                     [model_providers.fake]\nname = \"fake\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
                     wire_api = \"responses\"\nenv_key = \"FAKE_MODEL_API_KEY\"\n\n\
                     [mcp_servers.inventory]\ncommand = {}\nargs = {}\nenv = {{ {} }}\n",
                    json!(self.server_argv[0]),
                    json!(self.server_argv[1..]),
                    env_table.join(", ")
                );
                std::fs::write(codex_home.join("config.toml"), toml).unwrap();
                env.push(("CODEX_HOME".into(), codex_home.display().to_string()));
                env.push(("FAKE_MODEL_API_KEY".into(), "fake-key".into()));
                vec![
                    "exec".into(),
                    "--skip-git-repo-check".into(),
                    "--dangerously-bypass-approvals-and-sandbox".into(),
                    "--json".into(),
                    prompt.expect("codex runs one prompt").into(),
                ]
            }
            Host::Gemini => {
                let dir = self.home.join(".gemini");
                std::fs::create_dir_all(&dir).unwrap();
                let settings = json!({
                    "mcpServers": {"inventory": server},
                    "security": {"auth": {"selectedType": "gemini-api-key"},
                                 "folderTrust": {"enabled": false}},
                    "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
                    "privacy": {"usageStatisticsEnabled": false},
                    "telemetry": {"enabled": false},
                });
                std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
                env.push((
                    "GOOGLE_GEMINI_BASE_URL".into(),
                    format!("http://127.0.0.1:{port}"),
                ));
                env.push(("GEMINI_API_KEY".into(), "fake-key".into()));
                vec![
                    // A fixed model: no routing classifier request before the prompt.
                    "-m".into(),
                    "gemini-2.5-flash".into(),
                    "-p".into(),
                    prompt.expect("gemini runs one prompt").into(),
                    "--yolo".into(),
                    "--output-format".into(),
                    "stream-json".into(),
                ]
            }
        };
        (args, env)
    }

    fn spawn(&mut self, s: &Scenario, fm: &FakeModel, prompt: Option<&str>) -> (Child, PathBuf) {
        let (args, env) = self.configure(fm.port, prompt);
        let n = self.runs;
        self.runs += 1;
        let out = self.home.join(format!("run-{n}.out"));
        let err = self.home.join(format!("run-{n}.err"));
        let mut cmd = if self.host == Host::Gemini {
            let mut c = Command::new("node");
            c.arg(self.host.bin());
            c
        } else {
            Command::new(self.host.bin())
        };
        cmd.args(&args)
            .current_dir(&s.project)
            .env_clear()
            .envs(env)
            .envs(s.env())
            .stdin(if prompt.is_some() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::from(std::fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err).unwrap()));
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", self.host));
        (child, out)
    }

    /// One non-interactive prompt, bounded by `timeout`: the fake model's records of this run.
    pub fn run_prompt(
        &mut self,
        s: &Scenario,
        fm: &FakeModel,
        state: &str,
        timeout: Duration,
    ) -> Vec<Value> {
        let from = fm.records().len();
        let started = Instant::now();
        let (mut child, out) = self.spawn(s, fm, Some("List the inventory."));
        let deadline = started + s.within(timeout);
        let status = loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                break Some(st);
            }
            if Instant::now() >= deadline {
                kill_group(child.id());
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let records: Vec<Value> = fm.records().into_iter().skip(from).collect();
        let got = model_got(&records);
        report(self.host, state, &got, started.elapsed());
        if status.is_none() {
            self.dump(&out);
            panic!("{:?} ({state}) did not finish within {timeout:?}; the model got: {got}", self.host);
        }
        records
    }

    fn dump(&self, out: &Path) {
        // Claude Code's debug file: its MCP lines say what it did with the server.
        let n = out
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("run-"))
            .unwrap_or("0");
        let debug = self.home.join(format!("debug-{n}.txt"));
        if let Ok(t) = std::fs::read_to_string(&debug) {
            eprintln!("== {} (MCP lines)", debug.display());
            for l in t.lines().filter(|l| l.contains("MCP")).take(80) {
                eprintln!("{}", l.chars().take(400).collect::<String>());
            }
        }
        let err = out.with_extension("err");
        for p in [out, err.as_path()] {
            let t = std::fs::read_to_string(p).unwrap_or_default();
            let tail: String = t
                .chars()
                .rev()
                .take(4000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            eprintln!("== {}\n{tail}", p.display());
        }
    }

    /// Asserts the model got revision `revision`'s real answer in `records`; dumps the host's
    /// output otherwise.
    pub fn expect_answer(&self, records: &[Value], revision: &str, state: &str) {
        let results: Vec<&Value> = records
            .iter()
            .filter(|r| r["event"] == json!("tool_result"))
            .collect();
        if results.len() != 1 || results[0]["found"]["revision"] != json!(revision) {
            let last = self.home.join(format!("run-{}.out", self.runs - 1));
            self.dump(&last);
        }
        assert_eq!(
            results.len(),
            1,
            "{:?} ({state}): the model must get exactly one tool result; it got: {}",
            self.host,
            model_got(records)
        );
        assert_real_answer(results[0], revision, &format!("{:?} ({state})", self.host));
        // The model was shown the server's own definition.
        let shown = records
            .iter()
            .find(|r| {
                r["event"] == json!("request")
                    && r["tools"].as_array().is_some_and(|t| !t.is_empty())
            })
            .expect("a request that showed the model the tool");
        assert_eq!(
            shown["tools"][0]["description"],
            json!("List the inventory items and the server revision"),
            "{shown}"
        );
    }
}

/// The fake model's script: every prompt calls `list_items`.
fn list_script() -> Value {
    json!({"tool_suffix": "list_items", "arguments": {}, "final_text": "done"})
}

/// Records a build and catalog for the scenario's package (a session of the TS SDK client, the
/// one most hosts embed), so that the next start is warm.
fn prebuild(s: &mut Scenario, run_extra: &[&str]) {
    let mut d = s.driver(Client::TsV1, run_extra, &[]);
    d.connect(60_000);
    assert_eq!(d.list_tools(), TOOLS);
    close_clean(s, d);
}

const HOST_TIMEOUT: Duration = Duration::from_secs(120);

// ----- 1. warm start, 2. changed start ---------------------------------------------------------

/// Warm start (a build and catalog recorded by an earlier session, sources unchanged), then a
/// changed start (REVISION edited between sessions): the model gets revision A, then B.
fn warm_then_changed(name: &str, host: Host) {
    let mut s = Scenario::new(name, secs(420));
    prebuild(&mut s, &["--no-gating"]);
    let fm = FakeModel::start(&s, list_script());
    let mut rig = HostRig::new(&s, host, &["--no-gating"]);
    let r = rig.run_prompt(&s, &fm, "warm", HOST_TIMEOUT);
    rig.expect_answer(&r, "A", "warm");
    to_b(&s);
    let r = rig.run_prompt(&s, &fm, "changed", HOST_TIMEOUT);
    rig.expect_answer(&r, "B", "changed");
    drop(fm);
    s.assert_no_processes_left(secs(15));
}

#[test]
fn hosts_warm_changed_claude_2_1_337() {
    warm_then_changed("h-wc-c337", Host::Claude337);
}

#[test]
fn hosts_warm_changed_claude_2_1_197() {
    warm_then_changed("h-wc-c197", Host::Claude197);
}

#[test]
fn hosts_warm_changed_codex() {
    warm_then_changed("h-wc-codex", Host::Codex);
}

#[test]
fn hosts_warm_changed_gemini() {
    warm_then_changed("h-wc-gemini", Host::Gemini);
}

// ----- 2. cold start ---------------------------------------------------------------------------

/// Cold start: the supervisor's store has no build of this package yet (a fresh label; the
/// copy builds in seconds against the shared target's compiled rmcp).
fn cold(name: &str, host: Host) {
    let s = Scenario::new(name, secs(300));
    let fm = FakeModel::start(&s, list_script());
    let mut rig = HostRig::new(&s, host, &["--no-gating"]);
    let r = rig.run_prompt(&s, &fm, "cold", HOST_TIMEOUT);
    rig.expect_answer(&r, "A", "cold");
    drop(fm);
    s.assert_no_processes_left(secs(15));
}

#[test]
fn hosts_cold_claude_2_1_337() {
    cold("h-cold-c337", Host::Claude337);
}

#[test]
fn hosts_cold_claude_2_1_197() {
    cold("h-cold-c197", Host::Claude197);
}

#[test]
fn hosts_cold_codex() {
    cold("h-cold-codex", Host::Codex);
}

#[test]
fn hosts_cold_gemini() {
    cold("h-cold-gemini", Host::Gemini);
}

// ----- 3. a rebuild during one Claude Code session ----------------------------------------------

/// One Claude Code process, two prompts (`--input-format stream-json`); REVISION is edited
/// between them and the second call answers from the new build.
fn rebuild_during_session(name: &str, host: Host) {
    assert!(host.is_claude());
    let mut s = Scenario::new(name, secs(360));
    prebuild(&mut s, &["--no-gating"]);
    let fm = FakeModel::start(&s, list_script());
    let mut rig = HostRig::new(&s, host, &["--no-gating"]);
    let started = Instant::now();
    let (mut child, out) = rig.spawn(&s, &fm, None);
    let mut stdin: ChildStdin = child.stdin.take().unwrap();
    let prompt = |stdin: &mut ChildStdin, text: &str| {
        let line = json!({"type": "user", "message": {"role": "user",
            "content": [{"type": "text", "text": text}]}});
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .expect("claude stdin");
    };
    prompt(&mut stdin, "List the inventory.");
    let first = fm.wait_result(0, s.within(HOST_TIMEOUT));
    let records = fm.records();
    report(host, "session, before the edit", &model_got(&records), started.elapsed());
    let Some(first) = first else {
        rig.dump(&out);
        panic!("{host:?}: no tool result for the first prompt: {}", model_got(&records));
    };
    assert_real_answer(&first, "A", "first prompt");
    let epoch_a = s.wait_ready(None)["server"]["epoch"].clone();
    // Let the first turn end (its final text) before editing.
    std::thread::sleep(secs(2));
    to_b(&s);
    let edited = Instant::now();
    s.wait_status("the rebuilt server serves", s.within(secs(150)), |st| {
        st.pointer("/server/epoch").is_some_and(|e| *e != epoch_a)
            && st.get("catalog").is_some_and(|c| !c.is_null())
    });
    eprintln!(
        "{host:?}: rebuilt server up {:.1}s after the edit",
        edited.elapsed().as_secs_f64()
    );
    let from = fm.records().len();
    prompt(&mut stdin, "List the inventory again.");
    let second = fm.wait_result(from, s.within(HOST_TIMEOUT));
    let records: Vec<Value> = fm.records().into_iter().skip(from).collect();
    report(host, "session, after the edit", &model_got(&records), started.elapsed());
    let Some(second) = second else {
        rig.dump(&out);
        panic!("{host:?}: no tool result for the second prompt: {}", model_got(&records));
    };
    assert_real_answer(&second, "B", "second prompt, after the rebuild");
    drop(stdin);
    let deadline = Instant::now() + secs(30);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            kill_group(child.id());
            let _ = child.wait();
            panic!("{host:?} did not exit after its input closed");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(fm);
    s.assert_no_processes_left(secs(15));
}

#[test]
fn hosts_rebuild_during_session_claude_2_1_337() {
    rebuild_during_session("h-reb-c337", Host::Claude337);
}

#[test]
fn hosts_rebuild_during_session_claude_2_1_197() {
    rebuild_during_session("h-reb-c197", Host::Claude197);
}
