//! End-to-end scenarios (issue 5): the real `cargo-mcp-dev run` binary supervising the rmcp
//! `inventory` fixture, driven by the official MCP SDK clients through `e2e/clients`.
//!
//! Each test is one scenario with its own timeout, fixture copy, label and
//! `CARGO_MCP_DEV_HOME`; scenarios run one at a time and share one cargo target dir (see
//! `harness`). Revisions are made the way a developer makes them: by editing the copy's sources
//! and letting the watcher rebuild. Assertions are on driver result lines (what the SDK handed
//! the application), supervisor status lines, the status file, the side-effect file and the
//! audit log.
//!
//! Every denial is asserted as a tool result with `isError: true` (never a transport or protocol
//! failure): `Driver::call` fails the scenario otherwise.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod approvals;
mod first_contact;
mod harness;
mod hosts;
mod hosts_interactive;
mod hosts_sandbox;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use harness::*;
use serde_json::{Value, json};

const TOOLS: [&str; 2] = ["list_items", "write_item"];

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Connects, waits for the first server and its catalog, lists the tools: (pid, epoch).
fn start(s: &Scenario, d: &mut Driver) -> (u32, String) {
    d.connect(30_000);
    // List first, as hosts do: a 2026-07-28 host that reused its probe's discover answer sends
    // nothing before it, and the server's own handshake waits for the host's era.
    assert_eq!(d.list_tools(), TOOLS, "{:?}: catalog", d.client);
    let (_, line) = d.stderr.wait_for(0, "server started:", s.within(secs(150)));
    let (pid, epoch) = pid_epoch(&line);
    s.wait_ready(Some(&epoch));
    (pid, epoch)
}

/// Applies `edit` to the copy and waits until the watcher's rebuild replaced the server of
/// `old_epoch`: (new pid, new epoch, stderr index before the edit).
fn rebuild(
    s: &Scenario,
    d: &Driver,
    old_epoch: &str,
    edit: impl FnOnce(&Scenario),
) -> (u32, String, usize) {
    let mark = d.stderr.len();
    edit(s);
    let (_, line) = d
        .stderr
        .wait_for(mark, "server replaced:", s.within(secs(150)));
    let (pid, epoch) = pid_epoch(&line);
    assert!(
        line.contains(&format!("(was {old_epoch})")),
        "replacement names the old epoch: {line}"
    );
    assert_ne!(epoch, old_epoch, "a new process gets a new epoch");
    s.wait_ready(Some(&epoch));
    (pid, epoch, mark)
}

fn to_b(s: &Scenario) {
    s.set_revision("A", "B");
}

/// Revision B with a changed `write_item` input schema (a new optional property).
fn to_b_with_schema_change(s: &Scenario) {
    s.edit("src/main.rs", |t| {
        t.replacen(
            "    qty: i64,\n",
            "    qty: i64,\n    /// Warehouse (added in revision B).\n    #[serde(default)]\n    #[allow(dead_code)]\n    warehouse: Option<String>,\n",
            1,
        )
    });
    s.set_revision("A", "B");
}

fn write(d: &mut Driver, sku: &str, qty: i64) -> Value {
    d.call("write_item", json!({"sku": sku, "qty": qty}))
}

/// The id of the live grant for `tool` under `epoch` in an `approve --json` answer.
fn grant_id(approval: &Value, tool: &str, epoch: &str) -> String {
    approval["grants"]
        .as_array()
        .unwrap_or_else(|| panic!("approve answer without grants: {approval}"))
        .iter()
        .find(|g| {
            g["executionEpoch"] == json!(epoch)
                && g["toolScope"]
                    .as_array()
                    .is_some_and(|t| t.contains(&json!(tool)))
        })
        .unwrap_or_else(|| panic!("no grant for {tool} under epoch {epoch}: {approval}"))["id"]
        .as_str()
        .expect("grant id")
        .to_string()
}

/// Asserts a successful `write_item` result ran in `revision` in process `pid`.
fn assert_wrote(r: &Value, revision: &str, pid: u32, sku: &str) {
    let sc = structured(r);
    assert_eq!(sc["revision"], json!(revision), "{r}");
    assert_eq!(sc["pid"], json!(pid), "{r}");
    assert_eq!(sc["sku"], json!(sku), "{r}");
}

fn tool_called(s: &Scenario) -> Vec<Value> {
    records_of(&s.audit_records(), "tool_called")
        .into_iter()
        .cloned()
        .collect()
}

fn assert_audit_verifies(s: &Scenario) {
    let (code, v, err) = s.audit_verify();
    assert_eq!(code, 0, "audit verify failed: {v} {err}");
    assert_eq!(v["ok"], json!(true), "{v}");
}

fn close_clean(s: &Scenario, d: Driver) {
    let status = d.close();
    assert!(status.success(), "driver exit: {status}");
    s.assert_no_processes_left(secs(10));
}

// ----- 1. the article's six steps ------------------------------------------------------------

#[test]
fn s01_six_steps_python2() {
    let mut s = Scenario::new("s01", secs(240));
    let mut d = s.driver(Client::Py2, &[], &[]);
    // Step 1: revision A started, launch record captured, catalog fetched.
    let (pid_a, epoch_a) = start(&s, &mut d);
    let launch = s
        .mcp_dev_dir()
        .join(format!("launch/{}/{epoch_a}.json", s.label));
    let launch: Value =
        serde_json::from_str(&std::fs::read_to_string(&launch).expect("launch record"))
            .expect("launch record JSON");
    assert_eq!(launch["pid"], json!(pid_a), "{launch}");
    let digest_a = s.status_file().unwrap()["catalog"]["digest"].clone();
    // Gated before any approval.
    let p = d.call_denied(
        "write_item",
        json!({"sku": "marker-a", "qty": 1}),
        "authorization_required",
    );
    assert_eq!(p["currentEpoch"], json!(epoch_a));
    assert!(s.side_effect_lines().is_empty(), "a denied call wrote");
    // Step 2: approve write_item for the run; write with marker A.
    let grant_a = grant_id(&s.approve(&["write_item"]), "write_item", &epoch_a);
    assert_wrote(&write(&mut d, "marker-a", 1), "A", pid_a, "marker-a");
    let calls = tool_called(&s);
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0]["epoch"], json!(epoch_a));
    assert_eq!(calls[0]["data"]["grant"], json!(grant_a));
    assert_eq!(calls[0]["data"]["tool"], json!("write_item"));
    // Step 3: rebuild to revision B (handler change only); the watcher replaces the worker.
    let (pid_b, epoch_b, mark) = rebuild(&s, &d, &epoch_a, to_b);
    assert_ne!(pid_b, pid_a);
    assert_eq!(
        s.status_file().unwrap()["catalog"]["digest"],
        digest_a,
        "handler-only change keeps the catalog"
    );
    assert!(
        d.stderr.grep(mark, "catalog changed:").is_empty(),
        "no catalog change expected"
    );
    // Step 4: the call prepared before the refresh is denied with both epochs.
    let p = d.call_denied(
        "write_item",
        json!({"sku": "marker-b", "qty": 2}),
        "authorization_stale",
    );
    assert_eq!(p["approvedEpoch"], json!(epoch_a), "{p}");
    assert_eq!(p["currentEpoch"], json!(epoch_b), "{p}");
    assert_eq!(
        s.side_effect_lines().len(),
        1,
        "the stale call must not run"
    );
    // Step 5: refetch, approve again, call.
    assert_eq!(d.list_tools(), TOOLS);
    let grant_b = grant_id(&s.approve(&["write_item"]), "write_item", &epoch_b);
    assert_ne!(grant_b, grant_a);
    assert_wrote(&write(&mut d, "marker-b", 2), "B", pid_b, "marker-b");
    let lines = s.side_effect_lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["revision"], json!("A"));
    assert_eq!(lines[1]["revision"], json!("B"));
    assert_eq!(lines[1]["pid"], json!(pid_b));
    let calls = tool_called(&s);
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[1]["epoch"], json!(epoch_b));
    assert_eq!(calls[1]["data"]["grant"], json!(grant_b));
    let records = s.audit_records();
    let stale: Vec<_> = records_of(&records, "authorization_denied")
        .into_iter()
        .filter(|r| r["data"]["reason"] == json!("authorization_stale"))
        .collect();
    assert_eq!(stale.len(), 1, "{stale:?}");
    assert_eq!(stale[0]["data"]["approvedEpoch"], json!(epoch_a));
    assert_eq!(stale[0]["data"]["currentEpoch"], json!(epoch_b));
    let replaced = records_of(&records, "server_replaced");
    assert_eq!(replaced.len(), 1);
    assert_eq!(replaced[0]["data"]["oldEpoch"], json!(epoch_a));
    assert_eq!(replaced[0]["data"]["newEpoch"], json!(epoch_b));
    close_clean(&s, d);
    // Step 6: the log verifies.
    assert_audit_verifies(&s);
}

// ----- 2. --restart manual ---------------------------------------------------------------------

#[test]
fn s02_restart_manual_keeps_old_server() {
    let mut s = Scenario::new("s02", secs(200));
    let mut d = s.driver(Client::TsV1, &["--restart", "manual"], &[]);
    let (pid_a, epoch_a) = start(&s, &mut d);
    s.approve(&["write_item"]);
    assert_wrote(&write(&mut d, "before", 1), "A", pid_a, "before");
    let mark = d.stderr.len();
    to_b(&s);
    let (i, built) = d
        .stderr
        .wait_for(mark, "build complete:", s.within(secs(120)));
    assert!(
        built.contains(" changed (") && !built.contains("unchanged"),
        "{built}"
    );
    let (_, kept) = d.stderr.wait_for(i, "running server unchanged:", secs(10));
    assert_eq!(pid_epoch(&kept), (pid_a, epoch_a.clone()), "{kept}");
    let st = s.wait_status("pending restart", secs(10), |s| {
        s["pendingRestart"] == json!(true)
    });
    assert_eq!(st["server"]["epoch"], json!(epoch_a));
    assert_ne!(st["latestBuild"], st["server"]["identityDigest"], "{st}");
    // Calls still reach revision A under the old grant; the log says epoch A.
    assert_wrote(&write(&mut d, "after", 2), "A", pid_a, "after");
    let calls = tool_called(&s);
    assert_eq!(calls.len(), 2);
    assert!(
        calls.iter().all(|c| c["epoch"] == json!(epoch_a)),
        "{calls:?}"
    );
    assert!(d.stderr.grep(mark, "server replaced:").is_empty());
    assert!(
        s.side_effect_lines()
            .iter()
            .all(|l| l["revision"] == json!("A"))
    );
    close_clean(&s, d);
    assert_audit_verifies(&s);
}

// ----- 3. restart with an identical tool list --------------------------------------------------

#[test]
fn s03_identical_catalog_new_epoch_grant_stale() {
    let mut s = Scenario::new("s03", secs(200));
    let mut d = s.driver(Client::Py1, &[], &[]);
    let (_, epoch_a) = start(&s, &mut d);
    s.approve(&["write_item"]);
    assert_eq!(structured(&write(&mut d, "a", 1))["revision"], json!("A"));
    let before = s.status_file().unwrap()["catalog"].clone();
    let (pid_b, epoch_b, mark) = rebuild(&s, &d, &epoch_a, to_b);
    assert_eq!(
        s.status_file().unwrap()["catalog"],
        before,
        "same digest and revision number"
    );
    assert!(d.stderr.grep(mark, "catalog changed:").is_empty());
    assert!(
        !d.wait_list_changed(3000),
        "no list_changed for an identical catalog"
    );
    // No refetch needed (same digest), but the grant of epoch A does not carry over.
    let p = d.call_denied(
        "write_item",
        json!({"sku": "b", "qty": 2}),
        "authorization_stale",
    );
    assert_eq!(
        (p["approvedEpoch"].clone(), p["currentEpoch"].clone()),
        (json!(epoch_a), json!(epoch_b))
    );
    s.approve(&["write_item"]);
    assert_wrote(&write(&mut d, "b", 2), "B", pid_b, "b");
    close_clean(&s, d);
}

// ----- 5. restart while a slow write is waiting -------------------------------------------------

#[test]
fn s05_restart_during_slow_write() {
    let mut s = Scenario::new("s05", secs(200));
    let mut d = s.driver(Client::Py2, &[], &[("INVENTORY_WRITE_DELAY_MS", "30000")]);
    let (_, epoch_a) = start(&s, &mut d);
    s.approve(&["write_item"]);
    let id = d.send(
        json!({"op": "call_tool", "name": "write_item", "arguments": {"sku": "slow", "qty": 5},
        "timeoutMs": 120_000, "nowait": true}),
    );
    // The call reached the server (written to the log before forwarding).
    s.wait_status("call forwarded", secs(20), |_| !tool_called(&s).is_empty());
    let (_, epoch_b, _) = rebuild(&s, &d, &epoch_a, to_b);
    let r = d.result(&id, s.within(secs(30)));
    // The old process is gone (stopped, not left to finish the write later).
    let old_pid = records_of(&s.audit_records(), "server_started")[0]["data"]["pid"]
        .as_u64()
        .unwrap();
    s.wait_status("old server gone", secs(10), |_| {
        !Path::new(&format!("/proc/{old_pid}/cmdline")).exists()
            || std::fs::read_to_string(format!("/proc/{old_pid}/stat"))
                .is_ok_and(|st| st.contains(") Z "))
    });
    assert_eq!(
        r["ok"],
        json!(true),
        "the host gets a tool result, not a failure: {r}"
    );
    let p = denial_payload(&r, "epoch_transition", d.client);
    assert_eq!(p["cause"], json!("replaced"), "{p}");
    assert_eq!(p["oldEpoch"], json!(epoch_a), "{p}");
    assert_eq!(p["newEpoch"], json!(epoch_b), "{p}");
    assert_eq!(p["mayHaveRun"], json!(true), "{p}");
    assert_eq!(p["retried"], json!(false), "{p}");
    // Nothing replayed: one call in the log, under epoch A; at most one write, never in B.
    std::thread::sleep(secs(2));
    let lines = s.side_effect_lines();
    assert!(lines.len() <= 1, "{lines:?}");
    assert!(
        lines.iter().all(|l| l["revision"] == json!("A")),
        "{lines:?}"
    );
    let calls = tool_called(&s);
    assert_eq!(calls.len(), 1, "replayed? {calls:?}");
    assert_eq!(calls[0]["epoch"], json!(epoch_a));
    let failed = records_of(&s.audit_records(), "call_failed_epoch_transition").len();
    assert_eq!(failed, 1);
    close_clean(&s, d);
    assert_audit_verifies(&s);
}

// ----- 6. path dependency change only ------------------------------------------------------------

#[test]
fn s06_path_dependency_change_new_epoch() {
    let mut s = Scenario::new("s06", secs(200));
    s.add_metadata(r#"exempt = ["list_items"]"#);
    let mut d = s.driver(Client::Py2, &[], &[]);
    let (_, epoch_a) = start(&s, &mut d);
    let r = d.call("list_items", json!({}));
    assert_eq!(
        structured(&r)["items"][0],
        json!({"sku": "widget", "qty": 12})
    );
    let identity_a = s.root.path().join("identity-a.json");
    std::fs::copy(
        s.mcp_dev_dir()
            .join(format!("identity/{}.dev.json", s.label)),
        &identity_a,
    )
    .expect("identity record of revision A");
    let (_, _epoch_b, mark) = rebuild(&s, &d, &epoch_a, |s| {
        s.edit("inventory-core/src/lib.rs", |t| {
            t.replace("(\"widget\", 12)", "(\"widget\", 13)")
        })
    });
    let built = d.stderr.grep(mark, "build complete:");
    assert_eq!(built.len(), 1, "{built:?}");
    assert!(
        built[0].contains("dependency tree"),
        "status line names the dependency tree: {}",
        built[0]
    );
    assert!(!d.wait_list_changed(2000));
    let r = d.call("list_items", json!({}));
    let sc = structured(&r);
    assert_eq!(
        sc["revision"],
        json!("A"),
        "the server's own source is unchanged"
    );
    assert_eq!(sc["items"][0], json!({"sku": "widget", "qty": 13}));
    let out = s.mcp_dev(&[
        "identity",
        "--diff",
        identity_a.to_str().unwrap(),
        "--manifest-path",
        s.manifest().to_str().unwrap(),
        "--target-dir",
        s.target.to_str().unwrap(),
    ]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("dependency tree"), "identity --diff: {said}");
    let builds = records_of(&s.audit_records(), "build_completed")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    let last = builds.last().expect("build record");
    assert!(
        last["data"]["changed"]
            .as_array()
            .unwrap()
            .contains(&json!("dependency tree")),
        "{last}"
    );
    close_clean(&s, d);
}

// ----- 7. wrapper script ---------------------------------------------------------------------------

fn identity_json(s: &Scenario, extra: &[&str]) -> Value {
    let manifest = s.manifest();
    let mut args = vec![
        "identity",
        "--json",
        "--manifest-path",
        manifest.to_str().unwrap(),
        "--target-dir",
        s.target.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = s.mcp_dev(&args);
    assert!(
        out.status.success(),
        "identity --json: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("identity JSON")
}

#[test]
fn s07_wrapper_script_in_identity() {
    let mut s = Scenario::new("s07", secs(200));
    s.add_metadata(r#"wrapper = "scripts/serve.sh""#);
    let id1 = identity_json(&s, &[]);
    assert!(
        id1["wrapper"].to_string().contains("serve.sh"),
        "wrapper in identity: {}",
        id1["wrapper"]
    );
    let mut d = s.driver(Client::TsV1, &[], &[]);
    let (_, epoch_a) = start(&s, &mut d);
    let latest: Value = serde_json::from_str(
        &std::fs::read_to_string(
            s.mcp_dev_dir()
                .join(format!("launch/{}/latest.json", s.label)),
        )
        .unwrap(),
    )
    .unwrap();
    // The wrapper is what gets launched, with the stored (content-addressed) server as argument.
    assert!(
        latest["argv"][0]
            .as_str()
            .unwrap_or("")
            .ends_with("scripts/serve.sh"),
        "{latest}"
    );
    assert!(
        latest["argv"][1]
            .as_str()
            .unwrap_or("")
            .contains("mcp-dev/store/sha256-"),
        "{latest}"
    );
    let (_, _, mark) = rebuild(&s, &d, &epoch_a, |s| {
        s.edit("scripts/serve.sh", |t| {
            format!("{t}# edited by the e2e wrapper scenario\n")
        })
    });
    let built = d.stderr.grep(mark, "build complete:");
    assert!(built.iter().any(|l| l.contains("wrapper")), "{built:?}");
    let id2 = identity_json(&s, &["--no-build"]);
    assert_ne!(id2["identityDigest"], id1["identityDigest"]);
    assert_ne!(id2["wrapper"], id1["wrapper"]);
    assert_eq!(
        id2["executable"], id1["executable"],
        "only the script changed"
    );
    close_clean(&s, d);
}

// ----- 8. cold start ---------------------------------------------------------------------------------

/// Cold start in a fresh target directory with the Python 2.x client (it probes
/// `server/discover` first): the probe is told "use initialize" within a second, and the
/// fallback `initialize` waits for the server's own answer (issue 33). Nothing of this package
/// was ever recorded and a cold rmcp build outlasts the budget, so the host gets an error that
/// says the server is still building; the build goes on in the background and the reconnect
/// gets the real server. Then the TS v2 client's auto mode (a probe copy and the session copy)
/// on the built target: the status file and the control socket belong to the session copy.
#[test]
fn s08_cold_start_python2_probe_and_ts_v2_double_spawn() {
    let fresh = tempfile::Builder::new()
        .prefix("e2e-cold-target-")
        .tempdir()
        .unwrap();
    {
        let mut s = Scenario::with_target("s08py2", secs(480), fresh.path().to_path_buf());
        s.add_metadata(r#"exempt = ["list_items"]"#);
        let mut d = s.driver(Client::Py2, &["--first-start-budget", "5s"], &[]);
        let c = d.cmd(json!({"op": "connect", "timeoutMs": 30_000}), secs(45));
        assert_eq!(c["ok"], json!(false), "{c}");
        assert!(
            c["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("still building"),
            "{c}"
        );
        let (_, probe) =
            d.stderr
                .wait_for(0, "initialize waits for the server's own answer", secs(10));
        eprintln!("s08py2: {probe}");
        assert!(
            d.stderr.grep(0, "server started:").is_empty(),
            "cold build cannot be done yet"
        );
        d.kill_host();
        d.wait_exit(secs(20));
        // The build the host left goes on in the background: waited for on cargo's lock.
        s.build_now();
        let mut d = s.driver(Client::Py2, &[], &[]);
        d.connect(30_000);
        assert_eq!(d.list_tools(), TOOLS);
        assert_eq!(
            structured(&d.call("list_items", json!({})))["revision"],
            json!("A")
        );
        let records = s.audit_records();
        let presented = records_of(&records, "catalog_presented");
        assert!(
            presented
                .iter()
                .all(|r| r["data"]["source"] == json!("server")),
            "every list that reached the host came from the server: {presented:?}"
        );
        close_clean(&s, d);
    }
    {
        let mut s = Scenario::with_target("s08tsv2", secs(240), fresh.path().to_path_buf());
        s.add_metadata(r#"exempt = ["list_items"]"#);
        let mut d = s.driver(Client::TsV2, &[], &[]);
        // This copy of the package builds its own binary (another path) in the shared target:
        // `initialize` waits for the server's own answer, within the first-start budget.
        let c = d.connect(30_000);
        eprintln!(
            "s08tsv2: connect (probe copy + session) took {} ms",
            c["elapsedMs"]
        );
        assert!(c["elapsedMs"].as_u64().unwrap() < 30_000, "{c}");
        // The first list (held until the server is up) also tells the session the host's era.
        assert_eq!(d.list_tools(), TOOLS);
        let (_, line) = d.stderr.wait_for(0, "server started:", s.within(secs(150)));
        let (pid, epoch) = pid_epoch(&line);
        let st = s.wait_ready(Some(&epoch));
        // Auto negotiation started the command twice: a probe copy and the session (the
        // client does not pass the probe's stderr on, so count runs in the shared audit log).
        let runs: std::collections::BTreeSet<String> =
            records_of(&s.audit_records(), "run_started")
                .iter()
                .map(|r| r["run"].to_string())
                .collect();
        assert_eq!(
            runs.len(),
            2,
            "expected the probe and the session copy: {runs:?}"
        );
        // The status file belongs to the live session's supervisor, not the killed probe copy.
        let sup = st["supervisorPid"].as_u64().unwrap() as u32;
        let cmdline = std::fs::read(format!("/proc/{sup}/cmdline")).unwrap_or_default();
        assert!(
            String::from_utf8_lossy(&cmdline).contains("run"),
            "supervisor {sup} is not alive"
        );
        assert_eq!(d.list_tools(), TOOLS);
        // The control socket reaches the session (the probe copy must not have taken it over).
        let grant = s.approve(&["write_item"]);
        grant_id(&grant, "write_item", &epoch);
        assert_wrote(&write(&mut d, "cold", 1), "A", pid, "cold");
        assert_eq!(s.side_effect_lines().len(), 1);
        close_clean(&s, d);
        assert_audit_verifies(&s);
    }
}

// ----- 9. faults ------------------------------------------------------------------------------------

#[test]
fn s09_host_disconnect_mid_call_and_audit_tampering() {
    let mut s = Scenario::new("s09a", secs(200));
    let mut d = s.driver(Client::Py2, &[], &[("INVENTORY_WRITE_DELAY_MS", "3000")]);
    start(&s, &mut d);
    s.approve(&["write_item"]);
    d.send(
        json!({"op": "call_tool", "name": "write_item", "arguments": {"sku": "gone", "qty": 1},
        "timeoutMs": 60_000, "nowait": true}),
    );
    s.wait_status("call forwarded", secs(20), |_| !tool_called(&s).is_empty());
    // The host dies without a goodbye: only the driver process, its pipes close with it.
    d.kill_host();
    d.wait_exit(secs(10));
    s.assert_no_processes_left(secs(15));
    let lines = s.side_effect_lines();
    assert!(lines.len() <= 1, "at most one write: {lines:?}");
    assert_audit_verifies(&s);

    // Tampering: change one recorded fact; verify must name the bad record.
    let path = s.audit_path();
    let original = std::fs::read_to_string(&path).unwrap();
    let idx = original
        .lines()
        .position(|l| l.contains("\"tool_called\""))
        .unwrap();
    let tampered: Vec<String> = original
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == idx {
                l.replace("write_item", "list_items")
            } else {
                l.to_string()
            }
        })
        .collect();
    std::fs::write(&path, tampered.join("\n") + "\n").unwrap();
    let (code, v, err) = s.audit_verify();
    assert_eq!(code, 105, "tampered log must fail verification: {v} {err}");
    assert_eq!(v["ok"], json!(false), "{v}");
    let seq = idx + 1;
    assert!(
        format!("{v}{err}").contains(&seq.to_string()),
        "names record {seq}: {v} {err}"
    );
    // Truncation (dropping the last record) is caught by the anchor.
    let mut lines: Vec<&str> = original.lines().collect();
    lines.pop();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let (code, v, err) = s.audit_verify();
    assert_eq!(code, 105, "truncated log must fail verification: {v} {err}");
    std::fs::write(&path, &original).unwrap();
    assert_audit_verifies(&s);
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn s09_control_socket_refuses_another_user() {
    let mut s = Scenario::new("s09c", secs(200));
    // Let uid 65534 reach the project and the home dir, so the socket itself is what is tested.
    chmod(s.root.path(), 0o755);
    chmod(&s.home, 0o755);
    let mut d = s.driver(Client::TsV1, &[], &[]);
    let (_, epoch) = start(&s, &mut d);
    s.approve(&["write_item"]);
    let socket = s.status_file().unwrap()["socket"]
        .as_str()
        .expect("socket path")
        .to_string();
    if !rustix::process::getuid().is_root() {
        eprintln!("s09c: not root: cannot act as another user; checked socket mode only");
    }
    let meta = std::fs::metadata(&socket).expect("socket exists");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        meta.permissions().mode() & 0o077,
        0,
        "socket is owner-only: {:o}",
        meta.permissions().mode()
    );
    if rustix::process::getuid().is_root() {
        let mark = d.stderr.len();
        let as_nobody = |args: &[&str]| {
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(bin())
                .args(args);
            s.run_tool(cmd)
        };
        let target = s.target.display().to_string();
        let manifest = s.manifest().display().to_string();
        for args in [
            vec!["status", "--json", "--socket", socket.as_str()],
            vec![
                "status",
                "--json",
                "--manifest-path",
                manifest.as_str(),
                "--target-dir",
                target.as_str(),
            ],
            vec![
                "approve",
                "--yes",
                "--json",
                "--tool",
                "list_items",
                "--socket",
                socket.as_str(),
            ],
            vec!["restart", "--socket", socket.as_str()],
        ] {
            let out = as_nobody(&args);
            eprintln!(
                "s09c: as uid 65534 {args:?} -> {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
            assert!(
                !out.status.success(),
                "uid 65534 `{args:?}` succeeded: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            assert!(
                out.stdout.is_empty() || !String::from_utf8_lossy(&out.stdout).contains(&epoch),
                "state leaked to another user: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        // Nothing changed: same server, one grant, no approval or restart happened.
        let st = s.status_file().unwrap();
        assert_eq!(st["server"]["epoch"], json!(epoch));
        assert_eq!(
            st["grants"].as_array().map(Vec::len),
            Some(1),
            "{}",
            st["grants"]
        );
        assert!(d.stderr.grep(mark, "approved:").is_empty());
        assert!(d.stderr.grep(mark, "server replaced:").is_empty());
    }
    close_clean(&s, d);
}

// ----- 4 and 10. the same session through each client -----------------------------------------------

/// list, approve, call, rebuild with a schema change, denial, refetch, call. Clients that ignore
/// list_changed are refused `catalog_stale` until they refetch (scenario 4).
fn full_session(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(220));
    let mut d = s.driver(client, &[], &[]);
    let (pid_a, epoch_a) = start(&s, &mut d);
    let p = d.call_denied(
        "write_item",
        json!({"sku": "a", "qty": 1}),
        "authorization_required",
    );
    assert_eq!(p["currentEpoch"], json!(epoch_a));
    s.approve(&["write_item"]);
    assert_wrote(&write(&mut d, "a", 1), "A", pid_a, "a");
    let (pid_b, epoch_b, mark) = rebuild(&s, &d, &epoch_a, to_b_with_schema_change);
    assert_eq!(
        d.stderr.grep(mark, "catalog changed:").len(),
        1,
        "{}",
        d.stderr.text()
    );
    if client.refetches_on_list_changed() {
        // The SDK refetches by itself (the proxy advertises tools.listChanged; a modern TS v2
        // client hears it on the `subscriptions/listen` stream it opened, carried across the
        // restart).
        let r = d.cmd(
            json!({"op": "wait_event", "event": "tools_refetched", "timeoutMs": 10_000}),
            secs(20),
        );
        assert_eq!(
            r["ok"],
            json!(true),
            "no automatic refetch: {r}; events {:?}",
            d.events
        );
        s.wait_status("host holds the new catalog", secs(10), |st| {
            st["hostCatalog"] == st["catalog"]["digest"]
        });
    } else {
        // The old schema is refused, not run: the client ignores list_changed.
        let p = d.call_denied("write_item", json!({"sku": "b", "qty": 2}), "catalog_stale");
        assert_eq!(p["tool"], json!("write_item"), "{p}");
        // 2026-07-28: list_changed travels only on a `subscriptions/listen` stream the host
        // opened; the Python 2.x and plain TS v2 clients open none by themselves, so a modern
        // session of theirs hears nothing (the refusal above carried the new definition instead).
        let modern = s
            .status_file()
            .is_some_and(|st| st["era"] == json!("modern"));
        if !modern || client.opens_listen_stream() {
            assert!(d.wait_list_changed(15_000), "list_changed was sent");
        }
        let r = d.cmd(json!({"op": "list_tools"}), secs(30));
        assert_eq!(r["ok"], json!(true), "{r}");
        let write_tool = r["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == json!("write_item"))
            .unwrap();
        assert!(
            write_tool["inputSchema"]["properties"]
                .get("warehouse")
                .is_some(),
            "{write_tool}"
        );
    }
    assert_eq!(s.side_effect_lines().len(), 1, "denied calls must not run");
    let p = d.call_denied(
        "write_item",
        json!({"sku": "b", "qty": 2}),
        "authorization_stale",
    );
    assert_eq!(
        (p["approvedEpoch"].clone(), p["currentEpoch"].clone()),
        (json!(epoch_a), json!(epoch_b))
    );
    s.approve(&["write_item"]);
    let r = d.call(
        "write_item",
        json!({"sku": "b", "qty": 2, "warehouse": "east"}),
    );
    assert_wrote(&r, "B", pid_b, "b");
    let lines = s.side_effect_lines();
    assert_eq!(
        lines
            .iter()
            .map(|l| l["revision"].clone())
            .collect::<Vec<_>>(),
        vec![json!("A"), json!("B")]
    );
    close_clean(&s, d);
    assert_audit_verifies(&s);
}

#[test]
fn s10_session_python2() {
    full_session("s10py2", Client::Py2);
}

#[test]
fn s10_session_python1() {
    full_session("s10py1", Client::Py1);
}

#[test]
fn s10_session_ts_v1() {
    full_session("s10tsv1", Client::TsV1);
}

#[test]
fn s10_session_ts_v1_list_changed_auto() {
    full_session("s10tsv1auto", Client::TsV1Auto);
}

#[test]
fn s10_session_ts_v2_auto() {
    full_session("s10tsv2", Client::TsV2);
}

#[test]
fn s10_session_ts_v2_list_changed_auto() {
    full_session("s10tsv2auto", Client::TsV2Auto);
}

/// Inspector CLI one-shots: every `--method` is a new host process, hence a new `run` session
/// and a new epoch, so an approval cannot target it; `write_item` is called gated (denial shape)
/// and with `--no-gating`; `list_items` is exempt.
#[test]
fn s10_inspector_cli_one_shots() {
    let mut s = Scenario::new("s10insp", secs(240));
    s.add_metadata(r#"exempt = ["list_items"]"#);
    // A first interactive session leaves the facts (last real catalog) one-shots are answered from.
    let mut d = s.driver(Client::TsV1, &[], &[]);
    start(&s, &mut d);
    close_clean(&s, d);
    let inspector = peers_dir().join("node/node_modules/.bin/mcp-inspector");
    // The Inspector passes the server only a minimal environment: a script carries ours.
    let script = |name: &str, extra: &str| {
        let path = s.root.path().join(name);
        let env: Vec<String> = s.env().iter().map(|(k, v)| format!("{k}='{v}'")).collect();
        let argv: Vec<String> = s.run_argv(&[]).iter().map(|a| format!("'{a}'")).collect();
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec env {} {} {extra}\n",
                env.join(" "),
                argv.join(" ")
            ),
        )
        .unwrap();
        chmod(&path, 0o755);
        path
    };
    let gated = script("gated.sh", "");
    let ungated = script("ungated.sh", "--no-gating");
    let one_shot = |server: &Path, method_args: &[&str]| -> (i32, Value, String) {
        let mut cmd = Command::new(&inspector);
        cmd.arg("--cli")
            .arg(server)
            .arg("--method")
            .args(method_args);
        let out = s.run_tool(cmd);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let v = serde_json::from_str(&stdout).unwrap_or_else(|_| json!({"unparsed": stdout}));
        (
            out.status.code().unwrap_or(-1),
            v,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, v, err) = one_shot(&gated, &["tools/list"]);
    assert_eq!(code, 0, "{v} {err}");
    let mut names: Vec<_> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    assert_eq!(names, TOOLS, "{v}");
    // A denial is a printed tool result (exit 0), never `Failed to call tool`.
    let (code, v, err) = one_shot(
        &gated,
        &[
            "tools/call",
            "--tool-name",
            "write_item",
            "--tool-arg",
            "sku=x",
            "--tool-arg",
            "qty=1",
        ],
    );
    assert_eq!(code, 0, "denial must be a tool result: {v} {err}");
    assert_eq!(v["isError"], json!(true), "{v}");
    let payload: Value = serde_json::from_str(v["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(
        [
            "identity_pending",
            "catalog_stale",
            "authorization_required"
        ]
        .contains(&payload["error"].as_str().unwrap()),
        "{payload}"
    );
    assert!(s.side_effect_lines().is_empty());
    // Revision B is built by the next one-shot's own startup build.
    to_b(&s);
    let (code, v, err) = one_shot(
        &ungated,
        &[
            "tools/call",
            "--tool-name",
            "write_item",
            "--tool-arg",
            "sku=y",
            "--tool-arg",
            "qty=2",
        ],
    );
    assert_eq!(code, 0, "{v} {err}");
    let (code2, v2, err2) = one_shot(&gated, &["tools/call", "--tool-name", "list_items"]);
    assert_eq!(code2, 0, "{v2} {err2}");
    s.assert_no_processes_left(secs(10));
    // An ungated / exempt one-shot call should run the tool (see the report: it is refused today).
    assert_eq!(
        v["isError"],
        json!(false),
        "one-shot write_item with --no-gating was refused: {v}"
    );
    assert_eq!(v["structuredContent"]["revision"], json!("B"), "{v}");
    assert_eq!(
        v2["isError"],
        json!(false),
        "one-shot exempt list_items was refused: {v2}"
    );
    assert_eq!(s.side_effect_lines().len(), 1);
    // First contact with a broken build: the Inspector lists before it calls; the list is
    // answered at once with the compiler's first error (nothing waits for a build that failed).
    s.edit("src/main.rs", |t| {
        t.replacen(
            "const REVISION: &str = \"B\";",
            "const REVISION: &str = undefined_name;",
            1,
        )
    });
    let (code, v, err) = one_shot(&gated, &["tools/call", "--tool-name", "list_items"]);
    assert_ne!(code, 0, "{v} {err}");
    assert!(
        err.contains("-31002") && err.contains("build failed") && err.contains("undefined_name"),
        "{err}"
    );
    s.assert_no_processes_left(secs(10));
}

// ----- 11. arguments checked against the current definition (issue 33, item 5) -------------------

/// Revision B where `write_item` requires a `warehouse` (a property that became required).
fn to_b_with_required_warehouse(s: &Scenario) {
    s.edit("src/main.rs", |t| {
        t.replacen(
            "    qty: i64,\n",
            "    qty: i64,\n    /// Warehouse (required from revision B).\n    #[allow(dead_code)]\n    warehouse: String,\n",
            1,
        )
    });
    s.set_revision("A", "B");
}

/// A call whose arguments do not match the running server's input schema is refused with the
/// current definition, whatever the host fetched: `qty` as a string (before any grant: nobody
/// is asked to approve a call that cannot run), then, after a rebuild that made `warehouse`
/// required and a refetch by the host, the old arguments a model that kept the old definition
/// would send (Claude Code does). Nothing runs until the arguments match.
#[test]
fn s11_arguments_checked_against_the_current_definition() {
    let mut s = Scenario::new("s11", secs(240));
    let mut d = s.driver(Client::Py2, &[], &[]);
    let (_, epoch_a) = start(&s, &mut d);
    let p = d.call_denied(
        "write_item",
        json!({"sku": "a", "qty": "1"}),
        "arguments_invalid",
    );
    assert_eq!(p["tool"], json!("write_item"), "{p}");
    assert_eq!(p["currentEpoch"], json!(epoch_a), "{p}");
    assert_eq!(p["mismatches"][0]["path"], json!("/qty"), "{p}");
    assert_eq!(
        p["currentDefinition"]["inputSchema"]["properties"]["qty"]["type"],
        json!("integer"),
        "{p}"
    );
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .contains("do not match the tool's current definition"),
        "{p}"
    );
    s.approve(&["write_item"]);
    assert_wrote(&write(&mut d, "a", 1), "A", start_pid(&s), "a");
    let (pid_b, epoch_b, mark) = rebuild(&s, &d, &epoch_a, to_b_with_required_warehouse);
    assert_eq!(d.stderr.grep(mark, "catalog changed:").len(), 1);
    // The host refetches: what it holds is the current catalog.
    assert_eq!(d.list_tools(), TOOLS);
    s.wait_status("host holds the new catalog", secs(10), |st| {
        st["hostCatalog"] == st["catalog"]["digest"]
    });
    s.approve(&["write_item"]);
    // Its model still calls with the old definition.
    let p = d.call_denied(
        "write_item",
        json!({"sku": "b", "qty": 2}),
        "arguments_invalid",
    );
    assert_eq!(p["currentEpoch"], json!(epoch_b), "{p}");
    assert_eq!(p["mismatches"][0]["keyword"], json!("required"), "{p}");
    assert!(
        p["mismatches"][0]["message"]
            .as_str()
            .unwrap()
            .contains("warehouse"),
        "{p}"
    );
    assert!(
        p["currentDefinition"]["inputSchema"]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("warehouse")),
        "{p}"
    );
    let changes = p["changes"].to_string();
    assert!(
        changes.contains("warehouse"),
        "the diff from the definition the host was shown before: {p}"
    );
    assert_eq!(
        s.side_effect_lines().len(),
        1,
        "a refused call must not run"
    );
    let r = d.call(
        "write_item",
        json!({"sku": "b", "qty": 2, "warehouse": "east"}),
    );
    assert_wrote(&r, "B", pid_b, "b");
    let denied: Vec<Value> = records_of(&s.audit_records(), "authorization_denied")
        .into_iter()
        .filter(|r| r["data"]["reason"] == json!("arguments_invalid"))
        .cloned()
        .collect();
    assert_eq!(denied.len(), 2, "{denied:?}");
    assert!(
        denied[0]["data"]["mismatches"][0]
            .as_str()
            .unwrap()
            .starts_with("/qty"),
        "{denied:?}"
    );
    close_clean(&s, d);
    assert_audit_verifies(&s);
}

/// The pid of the first server started in this scenario.
fn start_pid(s: &Scenario) -> u32 {
    records_of(&s.audit_records(), "server_started")[0]["data"]["pid"]
        .as_u64()
        .unwrap() as u32
}
