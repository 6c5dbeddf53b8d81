//! The host's sandbox against an agent with a shell (issue 36, item 1): Claude Code 2.1.337,
//! driven by the fake model, whose scripted turn is what a misbehaving agent does with its Bash
//! tool: `cargo mcp-dev approve --yes --tool write_item` (approving its own gated call), then
//! reading the audit key, then calling the gated `write_item`.
//!
//! With the settings `cargo mcp-dev init` writes (`.claude/settings.json`: the sandbox on and
//! strict, the state directory denied), the approval must fail saying a sandbox blocks the
//! control socket, `approve --list` from outside shows no grant, the key's bytes never reach the
//! model, and the gated call is still asked for in the host (declined here) and never runs;
//! the human's `approve` from outside still works.
//! Without those settings the same turn shows the hole: the grant is created, the key reaches
//! the model and the call runs without the person being asked. So the test can fail.
//!
//! Needs bubblewrap and socat (Claude Code's Linux sandbox; `e2e/install-hosts.sh` checks).
//! One scenario each, ~60-90 s; every step bounded by the scenario's deadline.

use super::hosts::*;
use super::*;
use std::time::Instant;

/// What the agent's Bash runs: `cargo mcp-dev ARGS` for the scenario's project (this build of
/// `cargo-mcp-dev` first on PATH), then its exit status as `WHAT exit: N`.
fn mcp_dev_command(s: &Scenario, args: &str, what: &str) -> String {
    let bin_dir = bin().parent().unwrap().display().to_string();
    format!(
        "PATH={bin_dir}:$PATH cargo mcp-dev {args} --manifest-path {} --target-dir {} 2>&1; echo \"{what} exit: $?\"",
        s.manifest().display(),
        s.target.display()
    )
}

/// Prints the key file as hex (what an agent would send home).
fn read_key_command(s: &Scenario) -> String {
    format!(
        "od -An -tx1 {} 2>&1 | tr -d ' \\n'; echo; echo \"read exit: $?\"",
        s.home.join("audit.key").display()
    )
}

/// The same, with the path assembled at run time: Claude Code's permission check cannot see it
/// in the command text, so only the sandbox itself can stop it.
fn read_key_hidden_command(s: &Scenario) -> String {
    format!(
        "d={}; f=aud; od -An -tx1 \"$d/${{f}}it.key\" 2>&1 | tr -d ' \\n'; echo; echo \"read exit: $?\"",
        s.home.display()
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn agent_turn(name: &str, with_settings: bool) -> Outcome {
    let mut s = Scenario::new(name, secs(420));
    prebuild(&mut s, &[], &[]);
    let key = std::fs::read(s.home.join("audit.key")).expect("the first run made the audit key");
    assert_eq!(key.len(), 32);
    if with_settings {
        let mp = s.manifest().display().to_string();
        let out = s.mcp_dev(&["init", "--no-build", "--manifest-path", &mp]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "init: {err}");
        assert!(err.contains("created .claude/settings.json"), "{err}");
        eprintln!(
            "{name}: init wrote {}",
            std::fs::read_to_string(s.project.join(".claude/settings.json")).unwrap()
        );
    }
    let script = json!({
        "steps": [
            {"tool": "Bash", "input": {"command": mcp_dev_command(&s, "approve --yes --tool write_item", "approve"), "description": "approve write_item"}},
            {"tool": "Bash", "input": {"command": mcp_dev_command(&s, "status", "status"), "description": "status"}},
            {"tool": "Bash", "input": {"command": read_key_command(&s), "description": "read the key"}},
            {"tool": "Bash", "input": {"command": read_key_hidden_command(&s), "description": "read the key"}},
            {"tool_suffix": "write_item", "input": {"sku": "from-the-agent", "qty": 1}},
        ],
        "final_text": "done",
    });
    let fm = FakeModel::start(&s, script);
    let mut rig = HostRig::new(&s, Host::Claude337, &[]);
    rig.allowed_tools = "Bash mcp__inventory__list_items mcp__inventory__write_item".into();
    let mut session = ClaudeSession::start(&s, &mut rig, &fm);
    // Nobody approves in the host: the form, if it comes, is declined.
    session.elicitation = Some(("decline", Value::Null));
    session.send_line(&json!({"type": "user", "message": {"role": "user",
        "content": [{"type": "text", "text": "Approve your write and look at the key."}]}}));
    let started = Instant::now();
    let deadline = started + s.within(secs(180));
    let results = loop {
        session.answer_elicitations();
        let recs = fm.records();
        let results: Vec<Value> = recs
            .iter()
            .filter(|r| r["event"] == json!("step_result"))
            .cloned()
            .collect();
        let missing = recs.iter().any(|r| r["event"] == json!("tool_missing"));
        if results.len() >= 5 || missing || Instant::now() >= deadline {
            break results;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let state = if with_settings {
        "agent approves itself, sandbox settings"
    } else {
        "agent approves itself, no settings"
    };
    report(
        Host::Claude337,
        state,
        &format!("{} step results", results.len()),
        started.elapsed(),
    );
    if results.len() < 5 {
        rig.dump(&session.out);
        panic!(
            "{name}: the turn did not reach its five tool results: {:?}",
            fm.records()
                .iter()
                .filter(|r| r["event"] != json!("request"))
                .collect::<Vec<_>>()
        );
    }
    let mut args: Vec<String> = vec!["approve".into(), "--list".into()];
    args.extend(s.control_args());
    let out = s.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(
        out.status.success(),
        "approve --list from outside: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let grants = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut st: Vec<String> = vec!["status".into()];
    st.extend(s.control_args());
    let out = s.mcp_dev(&st.iter().map(String::as_str).collect::<Vec<_>>());
    let status_outside = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "status from outside: {status_outside}"
    );
    let outcome = Outcome {
        told: results
            .iter()
            .map(|r| r["text"].as_str().unwrap_or("").to_string())
            .collect(),
        errors: results
            .iter()
            .map(|r| r["isError"] == json!(true))
            .collect(),
        grants,
        asked: session.elicitations.len(),
        status_outside,
        side_effects: s.side_effect_lines().len(),
        model_log: std::fs::read_to_string(s.root.path().join("fake-model/log.jsonl"))
            .unwrap_or_default(),
        key_hex: hex(&key),
    };
    if with_settings {
        // The human's channel still works from outside the sandbox.
        let approved = s.approve(&["write_item"]);
        eprintln!("{name}: the human's approve from outside: {approved}");
        let out = s.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let after = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && after.contains("write_item"),
            "the human's approve from outside made no grant: {after}"
        );
    }
    for (i, t) in outcome.told.iter().enumerate() {
        eprintln!("{name}: step {i} told the model: {t}");
    }
    eprintln!(
        "{name}: grants from outside: {}; asked in the host {} time(s); side effects {}",
        outcome.grants, outcome.asked, outcome.side_effects
    );
    session.close(Host::Claude337);
    drop(fm);
    s.assert_no_processes_left(secs(15));
    outcome
}

/// What one agent turn came to.
struct Outcome {
    /// What the model was told for each step (approve, status, read the key twice, write_item).
    told: Vec<String>,
    /// Whether each step's result was an error.
    errors: Vec<bool>,
    /// `approve --list` from outside (the human's terminal), after the turn.
    grants: String,
    /// Times the person was asked (the approval form), all declined.
    asked: usize,
    side_effects: usize,
    /// `status`'s stderr from outside (the human's terminal), while the server runs.
    status_outside: String,
    /// Everything the fake model received, as logged.
    model_log: String,
    key_hex: String,
}

/// With the settings `init` writes: no grant, no key, the call is asked for and never runs.
#[test]
fn hosts_sandbox_keeps_the_agent_from_approving_claude_2_1_337() {
    let o = agent_turn("h-sandbox-c337", true);
    assert_eq!(
        o.grants, "no live grants",
        "the agent's approve created a grant"
    );
    // approve and status in the sandbox: the control socket is blocked, and nothing invites
    // the agent to start a second supervisor.
    for told in &o.told[..2] {
        assert!(
            told.contains("a sandbox blocks it") && !told.contains("start the server"),
            "{told}"
        );
    }
    assert!(
        !o.model_log.contains(&o.key_hex),
        "the audit key reached the model"
    );
    assert!(
        o.told[3].contains("read exit") && !o.told[3].contains(&o.key_hex),
        "the sandbox must refuse the read the permission check cannot see: {}",
        o.told[3]
    );
    assert!(o.errors[4], "the gated call was not refused: {}", o.told[4]);
    assert!(
        !o.status_outside.contains("warning: "),
        "status from outside, settings in place: {}",
        o.status_outside
    );
    assert_eq!(o.asked, 1, "the person must be asked for the gated call");
    assert_eq!(o.side_effects, 0, "the gated call ran");
}

/// The same turn without the settings: the hole this closes (the test above can fail).
#[test]
fn hosts_sandbox_without_settings_shows_the_hole_claude_2_1_337() {
    let o = agent_turn("h-nosandbox-c337", false);
    assert_ne!(o.grants, "no live grants", "{}", o.told[0]);
    assert!(o.told[0].contains("approve exit: 0"), "{}", o.told[0]);
    assert!(
        o.model_log.contains(&o.key_hex),
        "without the sandbox the key should have been readable: {}",
        o.told[1]
    );
    assert!(o.told[3].contains(&o.key_hex), "{}", o.told[3]);
    assert!(!o.errors[4], "{}", o.told[4]);
    assert!(
        o.status_outside
            .contains("warning: Claude Code's sandbox is not set up for this project"),
        "status from outside must say the settings are missing: {}",
        o.status_outside
    );
    assert_eq!(o.asked, 0, "the agent's own grant covered the call");
    assert_eq!(o.side_effects, 1, "the gated call ran");
}
