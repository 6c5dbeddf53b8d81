//! Issue 36, item 2: policy the agent can edit does not weaken gating by itself. A weakening
//! in `Cargo.toml` (`gate = "off"`, a new `exempt` entry) or in `run`'s flags (the host's
//! configuration) changes nothing until a human accepts it with `approve --policy`; a
//! strengthening applies at once; a corrupt or planted accepted-policy record is refused and
//! counts as nothing accepted. Real `run` sessions on the fake server.

// Tests plant files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::fixture::Project;
use common::session::Setup;
use serde_json::{Value, json};

/// A setup whose policy no human accepted yet (the harness accepts it for other tests).
fn unaccepted(project: Project) -> Setup {
    let mut setup = Setup::on(project).timeout(Duration::from_secs(90));
    setup.project.accept_policy = false;
    setup
}

fn fresh() -> Project {
    let mut p = Project::built_fake_server(common::session::SUITE);
    p.accept_policy = false;
    p
}

/// `approve --policy --yes`, as a human at a script would: its stderr.
fn accept_as_is(p: &Project) -> String {
    let out = p.run(["approve", "--policy", "--yes"]);
    out.expect_code(0);
    out.stderr
}

fn audit_records(p: &Project) -> Vec<Value> {
    let path = p.target_dir().join("mcp-dev/audit/fake-server.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("record is JSON"))
        .collect()
}

fn record_file(p: &Project) -> std::path::PathBuf {
    let manifest = std::fs::canonicalize(p.root.join("Cargo.toml")).unwrap();
    let keys = cargo_mcp_dev::audit::KeyStore::at(&p.home);
    cargo_mcp_dev::face::commands::policy_record::record_path(&keys, &manifest)
}

/// The refusal of a gated call: `authorization_required`, and nothing that invites the model
/// to accept the policy itself.
#[track_caller]
fn refused(m: &common::rpc::Msg) {
    let p = m.tool_error_payload();
    assert_eq!(p["error"], json!("authorization_required"), "{p}");
    assert!(
        !m.raw.contains("policy"),
        "the model is not pointed at the human's command: {}",
        m.raw
    );
}

#[track_caller]
fn forwarded(m: &common::rpc::Msg) {
    assert!(
        !m.result()["isError"].as_bool().unwrap_or(false),
        "{}",
        m.raw
    );
}

#[test]
fn gate_off_in_cargo_toml_changes_nothing_until_a_human_accepts_it() {
    let project = fresh();
    project.configure("gate = \"off\"");
    let mut s = unaccepted(project).start();
    let line = s.wait_stderr_matching("the waiting weakening", |l| {
        l.contains("Cargo.toml asks to turn the gate off")
    });
    assert!(
        line.contains("stays gated until you run `cargo mcp-dev approve --policy`"),
        "{line}"
    );
    s.wait_stderr("session started: fake-server (restart mode supervise, gating on");
    s.ready_legacy();
    refused(&s.call("1", "write", json!({"marker": "a"})));
    assert!(s.side_effects().is_empty());
    // `status` names what waits, and the command that accepts it.
    let status = s.cli(&["status"]);
    assert!(
        status.stderr.contains("turn the gate off") && status.stderr.contains("approve --policy"),
        "{}",
        status.stderr
    );
    // `approve --policy` without a terminal and without --yes: a usage error, nothing accepted.
    let out = s.cli(&["approve", "--policy"]);
    out.expect_code(2);
    assert!(!record_file(&s.project).exists());
    let project = s.finish_keeping_project();
    let records = audit_records(&project);
    let pending = records
        .iter()
        .find(|r| r["type"] == "policy_pending")
        .expect("policy_pending recorded");
    assert_eq!(
        pending["data"]["weakenings"],
        json!(["gate-off"]),
        "{pending}"
    );
    assert_eq!(pending["data"]["accepted"], Value::Null);
    assert!(records.iter().all(|r| r["type"] != "gating_disabled"));

    // The human accepts it.
    let said = accept_as_is(&project);
    for words in [
        "it would turn the gate off",
        "accepted the policy of `fake-server`: gate off",
    ] {
        assert!(said.contains(words), "{said}");
    }
    let accepted = audit_records(&project)
        .into_iter()
        .find(|r| r["type"] == "policy_accepted")
        .expect("policy_accepted recorded");
    assert_eq!(
        accepted["data"]["recordedBy"],
        json!("approve"),
        "{accepted}"
    );
    assert_eq!(
        accepted["data"]["terms"]["gate"],
        json!("off"),
        "{accepted}"
    );
    project.run(["audit", "verify"]).expect_code(0);
    let show = project.run(["audit", "show"]);
    show.expect_code(0);

    // The next run: the gate is off, as Cargo.toml asks.
    let mut s = unaccepted(project).start();
    s.wait_stderr("session started: fake-server (restart mode supervise, gating off");
    s.ready_legacy();
    forwarded(&s.call("2", "write", json!({"marker": "b"})));
    assert!(
        !s.stderr_lines().iter().any(|l| l.contains("asks to")),
        "{:?}",
        s.stderr_lines()
    );
    let project = s.finish_keeping_project();

    // A strengthening applies at once: `echo` exempt, everything else gated again.
    project.replace("Cargo.toml", "gate = \"off\"", "exempt = [\"echo\"]");
    let mut s = unaccepted(project).start();
    s.wait_stderr("session started: fake-server (restart mode supervise, gating on");
    s.ready_legacy();
    refused(&s.call("3", "write", json!({"marker": "c"})));
    forwarded(&s.call("4", "echo", json!({"x": 1})));
    assert!(
        !s.stderr_lines().iter().any(|l| l.contains("asks to")),
        "{:?}",
        s.stderr_lines()
    );
    s.finish();
}

#[test]
fn a_new_exempt_entry_and_the_hosts_flags_wait_too() {
    let project = fresh();
    project.configure("exempt = [\"write\"]");
    let mut s = unaccepted(project).args(&["--exempt", "echo"]).start();
    let line = s.wait_stderr_matching("the waiting weakening", |l| l.contains("stays gated until"));
    assert!(
        line.contains("Cargo.toml asks to exempt `write` from approval"),
        "{line}"
    );
    assert!(
        line.contains("the host's `run` flags ask to exempt `echo` from approval"),
        "{line}"
    );
    assert!(
        line.contains("`cargo mcp-dev approve --policy --exempt echo`"),
        "{line}"
    );
    s.ready_legacy();
    refused(&s.call("1", "write", json!({"marker": "a"})));
    refused(&s.call("2", "echo", json!({})));
    // Accepting Cargo.toml alone (while this run holds the log) leaves the flag's exemption
    // waiting; the running session keeps its policy, and the next run records the acceptance.
    let said = accept_as_is(&s.project);
    assert!(said.contains("not in the audit log yet"), "{said}");
    refused(&s.call("3", "write", json!({"marker": "a"})));
    let project = s.finish_keeping_project();
    let mut s = unaccepted(project).args(&["--exempt", "echo"]).start();
    let line = s.wait_stderr_matching("the waiting weakening", |l| l.contains("stays gated until"));
    assert!(!line.contains("Cargo.toml"), "{line}");
    s.ready_legacy();
    forwarded(&s.call("4", "write", json!({"marker": "b"})));
    refused(&s.call("5", "echo", json!({})));
    let project = s.finish_keeping_project();
    let accepted: Vec<Value> = audit_records(&project)
        .into_iter()
        .filter(|r| r["type"] == "policy_accepted")
        .collect();
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    assert_eq!(accepted[0]["data"]["recordedBy"], json!("run"));
    assert_eq!(
        accepted[0]["data"]["terms"]["gate"],
        json!({"all": {"exempt": ["write"]}})
    );
}

#[test]
fn a_corrupt_or_planted_record_is_refused_and_nothing_counts_as_accepted() {
    let mut project = fresh();
    project.configure("gate = \"off\"");
    accept_as_is(&project);
    let path = record_file(&project);
    let good = std::fs::read_to_string(&path).unwrap();
    assert!(good.contains("\"off\""), "{good}");
    for (what, planted) in [
        ("garbage", "{not json".to_string()),
        // Edited by something without the user's key: the seal no longer matches.
        (
            "edited",
            good.replace("\"acceptedAtMs\": ", "\"acceptedAtMs\": 1"),
        ),
    ] {
        std::fs::write(&path, &planted).unwrap();
        let mut s = unaccepted(project).start();
        let line = s.wait_stderr_matching(what, |l| l.contains("the accepted policy"));
        assert!(line.contains("is refused"), "{what}: {line}");
        s.wait_stderr("session started: fake-server (restart mode supervise, gating on");
        s.ready_legacy();
        refused(&s.call("1", "write", json!({"marker": what})));
        project = s.finish_keeping_project();
    }
    // A link planted in its place, to a record that would be valid: never followed.
    let elsewhere = project.scratch().join("record.json");
    std::fs::write(&elsewhere, &good).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let mut s = unaccepted(project).start();
    let line = s.wait_stderr_matching("link", |l| l.contains("the accepted policy"));
    assert!(line.contains("is refused (cannot read it"), "{line}");
    s.wait_stderr("session started: fake-server (restart mode supervise, gating on");
    s.ready_legacy();
    refused(&s.call("1", "write", json!({"marker": "link"})));
    s.finish();
}

/// `new` and `init` (a human ran them) accept the table they wrote: the template's exemption
/// applies at the first `run`, and a record already there is left as it is.
#[test]
fn the_table_new_or_init_wrote_is_accepted_once() {
    use cargo_mcp_dev::face::commands::run::accept_written_policy_in;
    let project = fresh();
    project.configure("exempt = [\"echo\"]");
    let written = cargo_mcp_dev::identity::config::LoadedConfig::from_package_metadata(
        &json!({"mcp-dev": {"exempt": ["echo"]}}),
    )
    .unwrap();
    let keys = cargo_mcp_dev::audit::KeyStore::at(&project.home);
    let manifest = project.root.join("Cargo.toml");
    assert!(accept_written_policy_in(&keys, &written, &manifest).unwrap());
    let everything = cargo_mcp_dev::identity::config::LoadedConfig::from_package_metadata(
        &json!({"mcp-dev": {"gate": "off"}}),
    )
    .unwrap();
    assert!(
        !accept_written_policy_in(&keys, &everything, &manifest).unwrap(),
        "an existing record stands"
    );
    let mut s = unaccepted(project).start();
    s.wait_stderr("session started: fake-server (restart mode supervise, gating on");
    s.ready_legacy();
    forwarded(&s.call("1", "echo", json!({})));
    refused(&s.call("2", "write", json!({"marker": "a"})));
    assert!(
        !s.stderr_lines()
            .iter()
            .any(|l| l.contains("stays gated until")),
        "{:?}",
        s.stderr_lines()
    );
    let project = s.finish_keeping_project();
    // The first run recorded the acceptance `new`/`init` made.
    let accepted = audit_records(&project)
        .into_iter()
        .find(|r| r["type"] == "policy_accepted")
        .expect("policy_accepted recorded by run");
    assert_eq!(accepted["data"]["recordedBy"], json!("run"), "{accepted}");
}

/// Red team (issue 36, item 2): the accepted-policy record is looked up by the manifest's
/// canonical path (through links), but cargo builds the package whose root is the directory
/// the manifest path names (a linked `Cargo.toml` does not move the sources). So an agent that
/// replaces its project's `Cargo.toml` with a link to the manifest of another package (one
/// whose `gate = "off"` a human accepted, somewhere the agent cannot write) runs its own code
/// under that acceptance: gating off, no human asked. The record must be for the package cargo
/// builds (the manifest's own directory, the file not followed), else nothing is accepted.
#[test]
fn a_manifest_linked_to_another_package_does_not_borrow_its_accepted_policy() {
    let project = fresh();
    project.configure("gate = \"off\"");
    // Another package elsewhere, whose `gate = "off"` a human accepted (`approve --policy`).
    let other = project.scratch().join("trusted-elsewhere");
    std::fs::create_dir_all(&other).unwrap();
    let other_manifest = other.join("Cargo.toml");
    std::fs::rename(project.root.join("Cargo.toml"), &other_manifest).unwrap();
    let keys = cargo_mcp_dev::audit::KeyStore::at(&project.home);
    cargo_mcp_dev::face::commands::policy_record::accept(
        &keys,
        &other_manifest,
        cargo_mcp_dev::policy::accepted::Terms::nothing_gated(),
        1,
        true,
    )
    .unwrap();
    // The agent's project: its Cargo.toml now a link to that manifest; its own sources stay.
    std::os::unix::fs::symlink(&other_manifest, project.root.join("Cargo.toml")).unwrap();
    still_gated(
        project,
        "borrowed",
        "the agent's project runs under another package's accepted policy",
    );
}

/// A run of `project` starts with gating on and refuses the gated `write` (`why`: what it
/// means when it does not).
#[track_caller]
fn still_gated(project: Project, marker: &str, why: &str) {
    let mut s = unaccepted(project).start();
    let started = s.wait_stderr_matching("session started", |l| l.contains("session started"));
    s.ready_legacy();
    let answer = s.call("1", "write", json!({ "marker": marker }));
    let effects = s.side_effects();
    s.finish();
    assert!(started.contains("gating on"), "{why}: {started}");
    refused(&answer);
    assert!(effects.is_empty(), "{effects:?}");
}

/// Red team (issue 36, items 1 and 2): the state directory (audit key, accepted-policy
/// records, control proof) comes from the environment `run` is started with, which is the
/// host's configuration (`.mcp.json`'s `env`), a file the agent can edit, as it can `run`'s
/// flags. An agent that points `CARGO_MCP_DEV_HOME` into the project owns a key it can read:
/// from its own sandboxed shell it runs `approve --policy --yes` with the same variable (the
/// directory is writable there) and the next `run` applies `gate = "off"`, no human asked. A
/// state directory inside the project (where the agent writes) must not count: nothing is
/// accepted from it.
#[test]
fn a_state_directory_the_agent_points_into_the_project_accepts_nothing() {
    let mut project = fresh();
    project.configure("gate = \"off\"");
    let planted = project.root.join(".mcp-state");
    project.set_env("CARGO_MCP_DEV_HOME", planted.to_str().unwrap());
    // The agent's shell: the same variable, a directory it can write.
    project.run(["approve", "--policy", "--yes"]).expect_code(0);
    assert!(planted.join("audit.key").exists());
    still_gated(
        project,
        "own-state",
        "a state directory in the project let the agent accept its own `gate = \"off\"`",
    );
}
