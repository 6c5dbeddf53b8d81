//! Interactive Claude Code in a terminal (issue 33 item 8): the approval form as a person sees
//! it. Claude Code 2.1.337 runs without `-p` inside a detached tmux session (120 × 40) against
//! `cargo-mcp-dev run` supervising the inventory fixture with gating on (the default; the
//! fixture's `write_item` is gated). The prompt is typed with `tmux send-keys`; the fake model
//! (`e2e/hosts/fake_model.py`) asks for `write_item`; the supervisor asks the person in the host
//! (`elicitation/create`) and Claude Code draws the form in the terminal. The screen is read with
//! `tmux capture-pane -p`, and answered with keys:
//!
//! 1. "Only this call" → the call runs: the model gets the server's real answer and the
//!    side-effect file has the line;
//! 2. the form's Decline button → the model is told the person declined, and not how to approve
//!    another way (no `cargo mcp-dev approve` hint); nothing is written;
//! 3. no answer until `--approval-timeout` → refused as timed out, same rule.
//!
//! The form's head (its first 3 lines, all Claude Code shows of the message) is asserted as
//! drawn: the tool, the arguments cut to fit, and how long a grant lasts; the choice labels are
//! asserted in the expanded list. Every screen the test read while a form was up is saved under
//! `target/e2e-tmux-screens/` for a person to look at.
//!
//! Bounded: every wait has a timeout; the tmux server has its own socket in the scenario's temp
//! dir and carries the scenario's tag (so do Claude Code, the supervisor and the server, through
//! the pane's environment); the session is killed at the end and no tagged process may be left.
//! First-run screens (theme, onboarding, the folder trust dialog, the custom API key question)
//! are passed by pre-seeding Claude Code's global config (`CLAUDE_CONFIG_DIR/.claude.json`).

use super::hosts::{FakeModel, Host, hosts_ready, model_got, prebuild, report, toolchain_env};
use super::*;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Instant;

/// The terminal's size: wide enough for the form's 76-column head with its indent.
const COLUMNS: u16 = 120;
const ROWS: u16 = 40;
/// How long a gated call waits for the person (short, for the timeout case).
const APPROVAL_TIMEOUT_SECS: u64 = 12;
/// An sku longer than the form's first line has room for: the head must cut it.
const SKU: &str = "widget-blue-large-with-a-description-too-long-for-the-first-line";
const QTY: i64 = 5;

/// A detached tmux session on a socket of its own, running one command.
struct Terminal {
    socket: PathBuf,
    tag: String,
    screens: PathBuf,
    prefix: String,
    saved: usize,
}

impl Terminal {
    /// Starts `argv` in `cwd` with exactly `env` (the pane's command runs under `env -i`).
    fn start(
        s: &Scenario,
        prefix: &str,
        cwd: &Path,
        env: &[(String, String)],
        argv: &[String],
    ) -> Terminal {
        let screens = repo().join("target/e2e-tmux-screens");
        std::fs::create_dir_all(&screens).unwrap();
        let t = Terminal {
            socket: s.root.path().join("tmux.sock"),
            tag: s.tag.clone(),
            screens,
            prefix: prefix.to_string(),
            saved: 0,
        };
        let mut args: Vec<String> = vec![
            "new-session".into(),
            "-d".into(),
            "-s".into(),
            "host".into(),
            "-x".into(),
            COLUMNS.to_string(),
            "-y".into(),
            ROWS.to_string(),
            "-c".into(),
            cwd.display().to_string(),
            "env".into(),
            "-i".into(),
        ];
        args.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        args.extend(argv.iter().cloned());
        let out = t.tmux(&args);
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        t
    }

    /// One tmux client command on this terminal's socket, bounded (a client that hangs is
    /// killed). The client (and so the server it starts) carries the scenario's tag.
    fn tmux(&self, args: &[String]) -> std::process::Output {
        self.try_tmux(args)
            .unwrap_or_else(|e| panic!("tmux {args:?}: {e}"))
    }

    fn try_tmux(&self, args: &[String]) -> Result<std::process::Output, String> {
        let mut cmd = Command::new("tmux");
        cmd.arg("-S")
            .arg(&self.socket)
            .arg("-f")
            .arg("/dev/null")
            .args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env(TAG_ENV, &self.tag)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().map_err(|e| format!("cannot run tmux: {e}"))?;
        let pid = child.id();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(out) => out.map_err(|e| e.to_string()),
            Err(_) => {
                kill_group(pid);
                Err("did not return within 10s".into())
            }
        }
    }

    /// Presses `keys` after a short pause (a person reads before pressing).
    fn keys(&self, keys: &[&str]) {
        std::thread::sleep(Duration::from_millis(300));
        let mut a: Vec<String> = vec!["send-keys".into(), "-t".into(), "host".into()];
        a.extend(keys.iter().map(|k| k.to_string()));
        let out = self.tmux(&a);
        assert!(out.status.success(), "send-keys {keys:?} failed");
    }

    /// Types `text` literally, then Enter.
    fn type_line(&self, text: &str) {
        let out = self.tmux(&[
            "send-keys".into(),
            "-t".into(),
            "host".into(),
            "-l".into(),
            text.into(),
        ]);
        assert!(out.status.success(), "send-keys -l failed");
        std::thread::sleep(Duration::from_millis(300));
        self.keys(&["Enter"]);
    }

    /// The visible screen as text (`capture-pane -p`: no colours).
    fn screen(&self) -> String {
        let out = self.tmux(&[
            "capture-pane".into(),
            "-p".into(),
            "-t".into(),
            "host".into(),
        ]);
        if !out.status.success() {
            return format!(
                "<no screen: {}>",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Saves `screen` as `target/e2e-tmux-screens/<prefix>-<n>-<what>.txt`.
    fn save(&mut self, what: &str, screen: &str) -> PathBuf {
        self.saved += 1;
        let p = self
            .screens
            .join(format!("{}-{:02}-{what}.txt", self.prefix, self.saved));
        std::fs::write(&p, screen).unwrap();
        p
    }

    /// Polls the screen until `pred` holds (then saves it as `what`); fails with the last
    /// screen after `timeout`.
    fn wait_screen(
        &mut self,
        s: &Scenario,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + s.within(timeout);
        loop {
            let screen = self.screen();
            if pred(&screen) {
                self.save(what, &screen);
                return screen;
            }
            if Instant::now() >= deadline {
                let p = self.save(&format!("{what}-NOT-SEEN"), &screen);
                panic!(
                    "{what}: not on the screen within {timeout:?} (saved {}):\n{screen}",
                    p.display()
                );
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        // The session's end hangs up Claude Code; the server exits with its last session.
        let _ = self.try_tmux(&["kill-session".into(), "-t".into(), "host".into()]);
        let _ = self.try_tmux(&["kill-server".into()]);
    }
}

/// Claude Code's debug file, kept next to the screens (what it did with the server).
struct KeepDebug {
    from: PathBuf,
    to: PathBuf,
}

impl Drop for KeepDebug {
    fn drop(&mut self) {
        let _ = std::fs::copy(&self.from, &self.to);
    }
}

/// The form's head as drawn: the first 3 non-blank lines after Claude Code's "requests your
/// input" line.
fn form_head(screen: &str) -> Vec<String> {
    let lines: Vec<&str> = screen.lines().collect();
    let Some(i) = lines.iter().position(|l| l.contains("requests your input")) else {
        return Vec::new();
    };
    lines[i + 1..]
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .take(3)
        .map(String::from)
        .collect()
}

/// The form's Decision field shows `value` (2.1.337: `Decision*:  ▸ v`, 2.1.197: `* Decision: ▸ v`).
fn decision_shows(screen: &str, value: &str) -> bool {
    screen
        .lines()
        .any(|l| l.contains("Decision") && l.contains(&format!("▸ {value}")))
}

fn form_up(screen: &str) -> bool {
    screen.contains("requests your input") && screen.contains("Decision")
}

/// Claude Code's global config: first-run screens done, this folder trusted, the API key of the
/// environment accepted.
fn seed_claude_config(config_dir: &Path, project: &Path) {
    std::fs::create_dir_all(config_dir).unwrap();
    let mut projects = serde_json::Map::new();
    let trusted = json!({"hasTrustDialogAccepted": true, "hasCompletedProjectOnboarding": true,
        "allowedTools": []});
    projects.insert(project.display().to_string(), trusted.clone());
    if let Ok(real) = project.canonicalize() {
        projects.insert(real.display().to_string(), trusted);
    }
    let cfg = json!({
        "hasCompletedOnboarding": true,
        "theme": "dark",
        "numStartups": 1,
        "customApiKeyResponses": {"approved": ["fake-key"], "rejected": []},
        "projects": projects,
    });
    std::fs::write(config_dir.join(".claude.json"), cfg.to_string()).unwrap();
}

/// Waits for the fake model's record of the tool result after record `from`.
fn tool_result_after(s: &Scenario, fm: &FakeModel, from: usize, timeout: Duration) -> Value {
    let deadline = Instant::now() + s.within(timeout);
    loop {
        let recs: Vec<Value> = fm.records().into_iter().skip(from).collect();
        if let Some(r) = recs.iter().find(|r| r["event"] == json!("tool_result")) {
            return r.clone();
        }
        assert!(
            !recs.iter().any(|r| r["event"] == json!("tool_missing")),
            "the model was not offered write_item: {}",
            model_got(&recs)
        );
        assert!(
            Instant::now() < deadline,
            "no tool result reached the model within {timeout:?}: {}",
            model_got(&recs)
        );
        std::thread::sleep(Duration::from_millis(150));
    }
}

/// A refusal the model got: not run, told the person declined (`outcome`), and not told to
/// approve another way.
fn assert_refused(result: &Value, outcome: &str) {
    assert_eq!(result["isError"], json!(true), "{result}");
    assert!(result["found"].is_null(), "a refused call ran: {result}");
    let text = result["text"].as_str().unwrap_or("");
    assert!(text.contains("write_item"), "{result}");
    assert!(
        text.contains("did not approve") && text.contains(outcome),
        "the model is told the person did not approve ({outcome}): {text}"
    );
    assert!(
        text.contains("Do not retry"),
        "the model is told not to retry: {text}"
    );
    assert!(
        !text.contains("cargo mcp-dev approve"),
        "after the person's answer the model gets no approve hint: {text}"
    );
}

/// "Only this call": expand the choices (their labels asserted), select the first, move to
/// Accept, submit.
fn accept_once(t: &mut Terminal, s: &Scenario, step: &str) {
    t.keys(&["Right"]);
    let screen = t.wait_screen(s, &format!("{step}-choices"), secs(10), |sc| {
        sc.contains("Decline: do not run this call")
    });
    for label in [
        "Only this call",
        "`write_item` until the next rebuild",
        "Decline: do not run this call",
    ] {
        // As an item of the expanded list (2.1.197 also prints them in the message).
        assert!(
            screen.contains(&format!("◯ {label}")),
            "choice {label:?}: {screen}"
        );
    }
    t.keys(&["Space"]);
    t.wait_screen(s, &format!("{step}-selected"), secs(10), |sc| {
        decision_shows(sc, "Only this call")
    });
    t.keys(&["Enter"]);
    t.wait_screen(s, &format!("{step}-accept-focused"), secs(10), |sc| {
        sc.contains("❯ Accept")
    });
    t.keys(&["Enter"]);
}

/// The form's Decline button: from the field down to the buttons, over to Decline, Enter.
fn decline(t: &mut Terminal, s: &Scenario, step: &str) {
    t.keys(&["Down"]);
    t.wait_screen(s, &format!("{step}-accept-focused"), secs(10), |sc| {
        sc.contains("❯ Accept")
    });
    t.keys(&["Right"]);
    t.wait_screen(s, &format!("{step}-decline-focused"), secs(10), |sc| {
        sc.contains("❯ Decline")
    });
    t.keys(&["Enter"]);
}

/// Sends the prompt and waits for the form; asserts its head as drawn; returns the screen.
fn prompt_until_form(t: &mut Terminal, s: &Scenario, host: Host, step: &str) -> String {
    t.type_line("Write the item to the inventory.");
    let screen = t.wait_screen(s, &format!("{step}-form"), secs(90), form_up);
    let head = form_head(&screen);
    assert_eq!(head.len(), 3, "{screen}");
    // Line 1: the tool and its arguments, cut to fit.
    let sku_start: String = SKU.chars().take(12).collect();
    assert!(
        head[0].starts_with(&format!(
            "Run `write_item` with {{\"qty\":{QTY},\"sku\":\"{sku_start}"
        )) && head[0].contains('…')
            && !head[0].contains(SKU)
            && head[0].ends_with('?'),
        "line 1 names the tool and its arguments, shortened: {head:?}"
    );
    // Line 2: what changed since the last approval (one plain line).
    assert!(!head[1].is_empty(), "{head:?}");
    // Line 3: how long each grant lasts.
    assert_eq!(
        head[2], "Allow only this call, or `write_item` until the next rebuild; or decline.",
        "{head:?}"
    );
    if host == Host::Claude337 {
        // 2.1.337 draws nothing more of the message than those 3 lines.
        assert!(screen.contains("more lines)"), "{screen}");
        assert!(!screen.contains("Details:"), "{screen}");
    } else {
        // 2.1.197 draws the whole message: the details follow the head.
        assert!(screen.contains("Details:"), "{screen}");
    }
    screen
}

/// How the supervisor asks on this host's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Era {
    /// Up to 2025-11-25: an `elicitation/create` request while the call waits.
    Legacy,
    /// 2026-07-28: the call is answered `input_required` with the form; the host retries it.
    Modern,
}

/// One interactive Claude Code in a terminal, ready for a prompt, its server up. Fields drop
/// in order: the terminal first, the scenario (which kills whatever is left) last.
struct Rig {
    t: Terminal,
    _debug: KeepDebug,
    fm: FakeModel,
    home: PathBuf,
    started: Instant,
    s: Scenario,
}

fn start_rig(name: &str, host: Host) -> Rig {
    let mut s = Scenario::new(name, secs(420));
    prebuild(&mut s, &[], &[]);
    hosts_ready();
    let started = Instant::now();
    let fm = FakeModel::start(
        &s,
        json!({"tool_suffix": "write_item", "arguments": {"sku": SKU, "qty": QTY},
               "final_text": "done"}),
    );
    let home = s.root.path().join(format!("home-tty-{}", host.dir()));
    let config_dir = home.join(".claude");
    seed_claude_config(&config_dir, &s.project);

    // The MCP server entry: the supervisor with gating on and a short approval timeout.
    let timeout_arg = format!("{APPROVAL_TIMEOUT_SECS}s");
    let argv = s.run_argv(&["--approval-timeout", &timeout_arg]);
    let mut server_env = s.env();
    server_env.extend(toolchain_env());
    let env_object: serde_json::Map<String, Value> = server_env
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let mcp = home.join("mcp.json");
    std::fs::write(
        &mcp,
        json!({"mcpServers": {"inventory": {"command": argv[0], "args": argv[1..],
            "env": env_object}}})
        .to_string(),
    )
    .unwrap();

    let h = home.display().to_string();
    let mut env: Vec<(String, String)> = vec![
        ("HOME".into(), h.clone()),
        ("XDG_CONFIG_HOME".into(), format!("{h}/.config")),
        ("XDG_CACHE_HOME".into(), format!("{h}/.cache")),
        ("XDG_DATA_HOME".into(), format!("{h}/.local/share")),
        ("TERM".into(), "xterm-256color".into()),
        ("LANG".into(), "C.UTF-8".into()),
        (
            "ANTHROPIC_BASE_URL".into(),
            format!("http://127.0.0.1:{}", fm.port),
        ),
        ("ANTHROPIC_API_KEY".into(), "fake-key".into()),
        ("CLAUDE_CONFIG_DIR".into(), config_dir.display().to_string()),
        ("DISABLE_TELEMETRY".into(), "1".into()),
        ("DISABLE_AUTOUPDATER".into(), "1".into()),
        ("DISABLE_ERROR_REPORTING".into(), "1".into()),
        (
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        ),
        // MCP tools in the request itself, not behind the ToolSearch tool.
        ("ENABLE_TOOL_SEARCH".into(), "false".into()),
    ];
    env.extend(toolchain_env());
    env.extend(s.env());
    let claude_args: Vec<String> = vec![
        host.bin().display().to_string(),
        "--mcp-config".into(),
        mcp.display().to_string(),
        "--strict-mcp-config".into(),
        // Not auto mode: it would ask the model to classify the call first.
        "--permission-mode".into(),
        "default".into(),
        "--allowedTools".into(),
        "mcp__inventory__write_item".into(),
        "--debug-file".into(),
        home.join("debug.txt").display().to_string(),
    ];
    let prefix = format!("{}-{}", host.dir(), s.name);
    // Old screens of this test go; the ones of this run are the record.
    if let Ok(dir) = std::fs::read_dir(repo().join("target/e2e-tmux-screens")) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _debug = KeepDebug {
        from: home.join("debug.txt"),
        to: repo().join(format!("target/e2e-tmux-screens/{prefix}-debug.txt")),
    };
    let mut t = Terminal::start(&s, &prefix, &s.project, &env, &claude_args);

    // Past the first-run screens: the input prompt, in manual (default) permission mode.
    t.wait_screen(&s, "ready", secs(60), |sc| {
        sc.contains("Claude Code v") && sc.contains("for shortcuts")
    });
    // The server is up with its catalog before the person types.
    s.wait_ready(None);

    Rig {
        t,
        _debug,
        fm,
        home,
        started,
        s,
    }
}

fn interactive_gate(name: &str, host: Host, era: Era) {
    // Bound scenario first: locals drop in reverse, so on a failure the terminal, the debug
    // copy and the fake model go before the scenario kills what is left.
    let Rig {
        s,
        started,
        home,
        fm,
        _debug,
        mut t,
    } = start_rig(name, host);

    // 1. "Only this call".
    let from = fm.records().len();
    prompt_until_form(&mut t, &s, host, "1-once");
    accept_once(&mut t, &s, "1-once");
    let once = tool_result_after(&s, &fm, from, secs(60));
    assert_eq!(once["isError"], json!(false), "{once}");
    assert_eq!(once["found"]["sku"], json!(SKU), "{once}");
    assert_eq!(once["found"]["qty"], json!(QTY), "{once}");
    assert_eq!(once["found"]["revision"], json!("A"), "{once}");
    let lines = s.side_effect_lines();
    assert_eq!(lines.len(), 1, "one write: {lines:?}");
    assert_eq!(lines[0]["sku"], json!(SKU), "{lines:?}");
    assert_eq!(lines[0]["pid"], once["found"]["pid"], "{lines:?}");
    t.wait_screen(&s, "1-once-done", secs(30), |sc| {
        !form_up(sc) && sc.contains("for shortcuts")
    });

    // The era the connection negotiated, as Claude Code logged it.
    let debug = std::fs::read_to_string(home.join("debug.txt")).unwrap_or_default();
    let connected = debug
        .lines()
        .find(|l| l.contains("MCP server \"inventory\": Connection established"))
        .unwrap_or_else(|| panic!("{host:?}: no connection line in its debug file"));
    assert_eq!(
        connected.contains("\"protocolEra\":\"modern\""),
        era == Era::Modern,
        "{host:?}, expected {era:?}: {connected}"
    );

    // 2. Decline.
    let from = fm.records().len();
    prompt_until_form(&mut t, &s, host, "2-decline");
    decline(&mut t, &s, "2-decline");
    let declined = tool_result_after(&s, &fm, from, secs(60));
    eprintln!(
        "{host:?} (terminal): declined, the model was told: {}",
        declined["text"]
    );
    assert_refused(&declined, "declined in the host");
    t.wait_screen(&s, "2-decline-done", secs(30), |sc| {
        !form_up(sc) && sc.contains("for shortcuts")
    });

    // 3. No answer until the approval timeout.
    let from = fm.records().len();
    let audit_from = s.audit_records().len();
    prompt_until_form(&mut t, &s, host, "3-timeout");
    let asked = Instant::now();
    let timed_out = format!("timed out in the host after {APPROVAL_TIMEOUT_SECS}s");
    match era {
        Era::Legacy => {
            // The call waits for the form; at the deadline the supervisor withdraws the form
            // and refuses the call as timed out.
            let refused = tool_result_after(&s, &fm, from, secs(APPROVAL_TIMEOUT_SECS + 60));
            let waited = asked.elapsed();
            eprintln!(
                "{host:?} (terminal): no answer, refused after {:.1}s; the model was told: {}",
                waited.as_secs_f64(),
                refused["text"]
            );
            assert!(
                waited >= Duration::from_secs(APPROVAL_TIMEOUT_SECS - 2),
                "refused before the approval timeout: {waited:?}"
            );
            assert_refused(&refused, &timed_out);
            t.wait_screen(&s, "3-timeout-done", secs(30), |sc| {
                !form_up(sc) && sc.contains("for shortcuts")
            });
        }
        Era::Modern => {
            // The call was answered with the form (`input_required`): the supervisor has
            // nothing left to send. At the deadline it closes the prompt (recorded); the form
            // stays up in the host and the model waits.
            let outcome = format!("not retried in the host within {APPROVAL_TIMEOUT_SECS}s");
            let deadline = Instant::now() + s.within(secs(APPROVAL_TIMEOUT_SECS + 30));
            loop {
                let closed = s.audit_records().into_iter().skip(audit_from).any(|r| {
                    r["type"] == json!("authorization_denied")
                        && r["data"]["outcome"] == json!(outcome)
                });
                if closed {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "the prompt was not closed: {outcome}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
            let waited = asked.elapsed();
            eprintln!(
                "{host:?} (terminal): no answer, prompt closed after {:.1}s",
                waited.as_secs_f64()
            );
            assert!(
                waited >= Duration::from_secs(APPROVAL_TIMEOUT_SECS - 2),
                "closed before the approval timeout: {waited:?}"
            );
            std::thread::sleep(secs(2));
            let screen = t.screen();
            t.save("3-timeout-form-still-up", &screen);
            assert!(form_up(&screen), "{screen}");
            let recs: Vec<Value> = fm.records().into_iter().skip(from).collect();
            assert!(
                !recs.iter().any(|r| r["event"] == json!("tool_result")),
                "the model got a result while the form was up: {}",
                model_got(&recs)
            );
            // The person answers late, with no: refused as declined, no approve hint.
            decline(&mut t, &s, "3-timeout-late");
            let late = tool_result_after(&s, &fm, from, secs(60));
            eprintln!(
                "{host:?} (terminal): declined after the timeout, the model was told: {}",
                late["text"]
            );
            assert_refused(&late, "declined in the host (after the form had closed)");
            t.wait_screen(&s, "3-timeout-late-done", secs(30), |sc| {
                !form_up(sc) && sc.contains("for shortcuts")
            });
        }
    }

    // Only the approved call wrote.
    assert_eq!(
        s.side_effect_lines().len(),
        1,
        "{:?}",
        s.side_effect_lines()
    );
    let records = fm.records();
    report(
        host,
        "terminal (tmux): once / decline / timeout",
        &model_got(&records),
        started.elapsed(),
    );
    drop(t);
    drop(fm);
    s.assert_no_processes_left(secs(15));
}

/// 2026-07-28 era: nobody answers until the approval timeout closes the prompt; then the
/// person says yes ("Only this call") to the form still on the screen. The retry names a
/// closed prompt: the call must not run, and the model must not be sent to approve another way
/// (the person did answer, in the host).
fn late_yes(name: &str, host: Host) {
    // Bound scenario first: locals drop in reverse, so on a failure the terminal, the debug
    // copy and the fake model go before the scenario kills what is left.
    let Rig {
        s,
        started,
        home: _,
        fm,
        _debug,
        mut t,
    } = start_rig(name, host);
    let from = fm.records().len();
    let audit_from = s.audit_records().len();
    prompt_until_form(&mut t, &s, host, "late-yes");
    let outcome = format!("not retried in the host within {APPROVAL_TIMEOUT_SECS}s");
    let deadline = Instant::now() + s.within(secs(APPROVAL_TIMEOUT_SECS + 30));
    while !s.audit_records().into_iter().skip(audit_from).any(|r| {
        r["type"] == json!("authorization_denied") && r["data"]["outcome"] == json!(outcome)
    }) {
        assert!(
            Instant::now() < deadline,
            "the prompt was not closed: {outcome}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(secs(2));
    accept_once(&mut t, &s, "late-yes");
    let late = tool_result_after(&s, &fm, from, secs(60));
    let text = late["text"].as_str().unwrap_or("").to_string();
    eprintln!("{host:?} (terminal): yes after the timeout, the model was told: {text}");
    report(
        host,
        "terminal (tmux): yes after the approval timeout",
        &model_got(&fm.records()),
        started.elapsed(),
    );
    assert!(
        late["found"].is_null(),
        "a call allowed after its form closed ran: {late}"
    );
    assert!(
        s.side_effect_lines().is_empty(),
        "{:?}",
        s.side_effect_lines()
    );
    assert!(
        !text.contains("cargo mcp-dev approve"),
        "the person answered in the host; the model is not sent to approve another way: {text}"
    );
    assert!(
        text.contains("had closed") && text.contains("new form"),
        "the model is told the form had closed: {text}"
    );
    drop(t);
    drop(fm);
    s.assert_no_processes_left(secs(15));
}

/// Claude Code 2.1.337 (2026-07-28) keeps the expired form on screen: a yes given there after
/// the approval timeout runs nothing, and the model is told the form had closed and that
/// calling again shows a new one (never how to approve another way).
#[test]
fn hosts_terminal_late_yes_claude_2_1_337() {
    late_yes("t-late-c337", Host::Claude337);
}

#[test]
fn hosts_terminal_approval_form_claude_2_1_337() {
    interactive_gate("t-gate-c337", Host::Claude337, Era::Modern);
}

#[test]
fn hosts_terminal_approval_form_claude_2_1_197() {
    interactive_gate("t-gate-c197", Host::Claude197, Era::Legacy);
}
