//! First contact (issue "first contact and real host flows"): the flows real hosts run, with
//! the official clients. Each flow: connect, list once, call at once; edit the server so that
//! `write_item`'s schema changes and `list_items`'s does not; call both without refetching;
//! refetch; call again. Start states: warm, changed (the recorded catalog is older than the
//! build), build broken then fixed (and `--fallback last-good`), two different clients in turn
//! on one package. Cold starts are in `s08` (they need a fresh target directory). Approvals are
//! off here (`--no-gating`): approval flows have their own scenarios.

use super::*;

/// `write_item` arguments valid in both revisions.
fn old_args() -> Value {
    json!({"sku": "fc", "qty": 1})
}

/// Waits for the server of `old_epoch` to be replaced (applying the build with `restart` in
/// manual mode): the new epoch.
fn replaced_after_edit(s: &Scenario, d: &Driver, old_epoch: &str, manual: bool) -> String {
    let mark = d.stderr.len();
    to_b_with_schema_change(s);
    if manual {
        let (i, _) = d.stderr.wait_for(
            mark,
            "restart mode manual: run `cargo mcp-dev restart`",
            s.within(secs(150)),
        );
        assert!(d.stderr.grep(mark, "server replaced:").is_empty());
        let mut args = vec!["restart".to_string()];
        args.extend(s.control_args());
        let out = s.mcp_dev(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(out.status.success(), "restart: {out:?}");
        let (_, line) = d.stderr.wait_for(i, "server replaced:", s.within(secs(30)));
        let (_, epoch) = pid_epoch(&line);
        s.wait_ready(Some(&epoch));
        return epoch;
    }
    let (_, line) = d
        .stderr
        .wait_for(mark, "server replaced:", s.within(secs(150)));
    let (_, epoch) = pid_epoch(&line);
    assert!(line.contains(old_epoch), "{line}");
    s.wait_ready(Some(&epoch));
    epoch
}

/// The whole flow for one client; `manual` runs it in restart mode manual.
fn flow(name: &str, client: Client, manual: bool) {
    let mut s = Scenario::new(name, secs(300));
    let mut args = vec!["--no-gating"];
    if manual {
        args.extend(["--restart", "manual"]);
    }
    let mut d = s.driver(client, &args, &[]);
    d.connect(30_000);
    // List once and call at once: no waiting for status lines first.
    assert_eq!(
        d.list_tools(),
        TOOLS,
        "{client:?}: the first list is the server's"
    );
    let r = d.call("list_items", json!({}));
    assert_eq!(structured(&r)["revision"], json!("A"), "{r}");
    let (_, line) = d.stderr.wait_for(0, "server started:", secs(5));
    let (_, epoch_a) = pid_epoch(&line);

    let epoch_b = replaced_after_edit(&s, &d, &epoch_a, manual);
    // The unchanged tool goes through without a refetch.
    let r = d.call("list_items", json!({}));
    assert_eq!(structured(&r)["revision"], json!("B"), "{client:?}: {r}");
    if client.refetches_on_list_changed() {
        // This app refetches on list_changed by itself: nothing is stale for it.
        let r = d.cmd(
            json!({"op": "wait_event", "event": "tools_refetched", "timeoutMs": 10_000}),
            secs(20),
        );
        assert_eq!(r["ok"], json!(true), "{r}");
        s.wait_status("host holds the new catalog", secs(10), |st| {
            st["hostCatalog"] == st["catalog"]["digest"]
        });
    } else {
        // The changed tool: refused with its new definition, not run.
        let p = d.call_denied("write_item", old_args(), "catalog_stale");
        assert_eq!(p["currentEpoch"], json!(epoch_b), "{p}");
        assert!(
            p["currentDefinition"]["inputSchema"]["properties"]
                .get("warehouse")
                .is_some(),
            "{client:?}: the refusal carries the new schema: {p}"
        );
        assert!(
            p["changes"].as_array().is_some_and(|c| c
                .iter()
                .any(|l| l.as_str().unwrap_or("").contains("warehouse"))),
            "{p}"
        );
        assert!(s.side_effect_lines().is_empty(), "a stale call never runs");
    }
    // The retry, still without a refetch, runs against the new definition.
    let r = d.call(
        "write_item",
        json!({"sku": "fc", "qty": 1, "warehouse": "east"}),
    );
    assert_eq!(structured(&r)["revision"], json!("B"), "{client:?}: {r}");
    // Refetch, call again.
    assert_eq!(d.list_tools(), TOOLS);
    let r = d.call(
        "write_item",
        json!({"sku": "fc2", "qty": 2, "warehouse": "west"}),
    );
    assert_eq!(structured(&r)["revision"], json!("B"), "{r}");
    assert!(
        d.stderr.grep(0, "connection closed").is_empty(),
        "{client:?}: no closed connection"
    );
    assert!(d.stderr.grep(0, "identity_pending").is_empty());
    close_clean(&s, d);
    assert_audit_verifies(&s);
    let records = s.audit_records();
    let sources: Vec<String> = records_of(&records, "catalog_presented")
        .iter()
        .map(|r| r["data"]["source"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        sources
            .iter()
            .all(|s| s == "server" || s == "stale-call result"),
        "{sources:?}"
    );
    if !client.refetches_on_list_changed() {
        assert!(
            sources.iter().any(|s| s == "stale-call result"),
            "{sources:?}"
        );
    }
}

#[test]
fn fc_warm_python2() {
    flow("fc-py2", Client::Py2, false);
}

#[test]
fn fc_warm_python1() {
    flow("fc-py1", Client::Py1, false);
}

#[test]
fn fc_warm_ts_v1_never_refetches() {
    flow("fc-tsv1", Client::TsV1, false);
}

#[test]
fn fc_warm_ts_v1_list_changed() {
    flow("fc-tsv1a", Client::TsV1Auto, false);
}

#[test]
fn fc_warm_ts_v2_auto() {
    flow("fc-tsv2", Client::TsV2, false);
}

/// Modern (2026-07-28) with a `subscriptions/listen` stream the client opens by itself; the
/// fixture (rmcp's default) refuses listen, the supervisor serves the tool-list part.
#[test]
fn fc_warm_ts_v2_list_changed() {
    flow("fc-tsv2a", Client::TsV2Auto, false);
}

#[test]
fn fc_manual_mode_ts_v1() {
    flow("fc-man", Client::TsV1, true);
}

/// Changed start: the recorded catalog is from an older build whose tools differ. With a short
/// first-start budget the host gets the recorded catalog (said as such in the audit log); the
/// real catalog then decides per tool.
fn changed_start(name: &str, client: Client) {
    let mut s = Scenario::new(name, secs(300));
    {
        let mut d = s.driver(client, &["--no-gating"], &[]);
        d.connect(30_000);
        assert_eq!(d.list_tools(), TOOLS);
        close_clean(&s, d);
    }
    to_b_with_schema_change(&s);
    let mut d = s.driver(
        client,
        // No warm-start wait for the handshake, and a budget shorter than the rebuild.
        &[
            "--no-gating",
            "--first-start-budget",
            "200ms",
            "--handshake-wait",
            "1ms",
        ],
        &[],
    );
    d.connect(30_000);
    // The build of B takes longer than the budget: the recorded (revision A) catalog.
    assert_eq!(d.list_tools(), TOOLS);
    d.stderr.wait_for(
        0,
        "tools/list answered with the catalog recorded from epoch",
        secs(10),
    );
    let (_, line) = d.stderr.wait_for(0, "server started:", s.within(secs(150)));
    let (_, epoch) = pid_epoch(&line);
    s.wait_ready(Some(&epoch));
    let r = d.call("list_items", json!({}));
    assert_eq!(structured(&r)["revision"], json!("B"), "{client:?}: {r}");
    if client.refetches_on_list_changed() {
        let r = d.cmd(
            json!({"op": "wait_event", "event": "tools_refetched", "timeoutMs": 10_000}),
            secs(20),
        );
        assert_eq!(r["ok"], json!(true), "{r}");
    } else {
        let p = d.call_denied("write_item", old_args(), "catalog_stale");
        assert!(
            p["currentDefinition"]["inputSchema"]["properties"]["warehouse"].is_object(),
            "{client:?}: {p}"
        );
    }
    let r = d.call(
        "write_item",
        json!({"sku": "c", "qty": 1, "warehouse": "n"}),
    );
    assert_eq!(structured(&r)["revision"], json!("B"), "{client:?}: {r}");
    close_clean(&s, d);
    assert_audit_verifies(&s);
    let records = s.audit_records();
    let recorded = records_of(&records, "catalog_presented")
        .into_iter()
        .find(|r| r["data"]["source"] == json!("recorded catalog"))
        .cloned()
        .expect("the recorded catalog is recorded as the source");
    assert!(recorded["data"]["recordedEpoch"].is_string(), "{recorded}");
}

/// Build broken at start, then fixed: the host is told the compiler's first error, and the
/// server starts (with list_changed) when a build works. With `last_good`, then broken again
/// under `--fallback last-good`: the last good build serves and says so.
fn broken_then_fixed(name: &str, client: Client, last_good: bool) {
    let mut s = Scenario::new(name, secs(360));
    // A first session records a good build (the fallback's, and a warm start's).
    {
        let mut d = s.driver(client, &["--no-gating"], &[]);
        d.connect(30_000);
        assert_eq!(d.list_tools(), TOOLS);
        close_clean(&s, d);
    }
    let break_it = |s: &Scenario| {
        s.edit("src/main.rs", |t| {
            t.replacen(
                "const REVISION: &str = \"A\";",
                "const REVISION: &str = undefined_name;",
                1,
            )
        })
    };
    break_it(&s);
    let mut d = s.driver(client, &["--no-gating"], &[]);
    d.connect(30_000);
    let r = d.cmd(json!({"op": "list_tools"}), secs(120));
    assert_eq!(r["ok"], json!(false), "{client:?}: {r}");
    assert_eq!(r["error"]["data"]["error"], json!("build_failed"), "{r}");
    let first = r["error"]["data"]["firstError"]
        .as_str()
        .unwrap_or_default();
    assert!(
        first.contains("src/main.rs:") && first.contains("undefined_name"),
        "{r}"
    );
    let p = d.call_denied("list_items", json!({}), "build_failed");
    assert!(p["firstError"].is_string(), "{p}");
    let mark = d.stderr.len();
    s.edit("src/main.rs", |t| {
        t.replacen(
            "const REVISION: &str = undefined_name;",
            "const REVISION: &str = \"A\";",
            1,
        )
    });
    let (_, line) = d
        .stderr
        .wait_for(mark, "server started:", s.within(secs(150)));
    let (_, epoch) = pid_epoch(&line);
    s.wait_ready(Some(&epoch));
    assert!(
        d.wait_list_changed(10_000),
        "{client:?}: told once a catalog exists"
    );
    assert_eq!(d.list_tools(), TOOLS);
    let r = d.call("list_items", json!({}));
    assert_eq!(structured(&r)["revision"], json!("A"), "{r}");
    close_clean(&s, d);
    if last_good {
        break_it(&s);
        let mut d = s.driver(client, &["--no-gating", "--fallback", "last-good"], &[]);
        d.connect(30_000);
        assert_eq!(d.list_tools(), TOOLS);
        let r = d.call("list_items", json!({}));
        assert_eq!(structured(&r)["revision"], json!("A"), "{r}");
        d.stderr.wait_for(0, "--fallback last-good", secs(5));
        let launch: Value = serde_json::from_slice(
            &std::fs::read(
                s.mcp_dev_dir()
                    .join("launch")
                    .join(&s.label)
                    .join("latest.json"),
            )
            .unwrap(),
        )
        .unwrap();
        assert!(
            launch["fallback"]
                .as_str()
                .unwrap_or("")
                .contains("last-good"),
            "{launch}"
        );
        close_clean(&s, d);
    }
    assert_audit_verifies(&s);
}

#[test]
fn fc_changed_start_python2() {
    changed_start("fc-chg-py2", Client::Py2);
}

#[test]
fn fc_changed_start_python1() {
    changed_start("fc-chg-py1", Client::Py1);
}

#[test]
fn fc_changed_start_ts_v1_never_refetches() {
    changed_start("fc-chg-tsv1", Client::TsV1);
}

#[test]
fn fc_changed_start_ts_v1_list_changed() {
    changed_start("fc-chg-tsv1a", Client::TsV1Auto);
}

#[test]
fn fc_changed_start_ts_v2_auto() {
    changed_start("fc-chg-tsv2", Client::TsV2);
}

#[test]
fn fc_broken_then_fixed_python1_and_fallback_last_good() {
    broken_then_fixed("fc-brk-py1", Client::Py1, true);
}

#[test]
fn fc_broken_then_fixed_python2() {
    broken_then_fixed("fc-brk-py2", Client::Py2, false);
}

#[test]
fn fc_broken_then_fixed_ts_v1() {
    broken_then_fixed("fc-brk-tsv1", Client::TsV1, false);
}

#[test]
fn fc_broken_then_fixed_ts_v2_auto() {
    broken_then_fixed("fc-brk-tsv2", Client::TsV2, false);
}

/// Two different clients in turn on one package: each gets its own protocol version (never
/// the one remembered from the other), and no connection is closed.
#[test]
fn fc_two_clients_in_turn() {
    let mut s = Scenario::new("fc-two", secs(300));
    for client in [Client::TsV1, Client::Py2, Client::Py1, Client::TsV2] {
        let mut d = s.driver(client, &["--no-gating"], &[]);
        d.connect(30_000);
        assert_eq!(d.list_tools(), TOOLS, "{client:?}");
        let r = d.call("list_items", json!({}));
        assert_eq!(structured(&r)["revision"], json!("A"), "{client:?}: {r}");
        assert!(
            d.stderr.grep(0, "connection closed").is_empty(),
            "{client:?}: {}",
            d.stderr.text()
        );
        close_clean(&s, d);
    }
    assert_audit_verifies(&s);
}

/// Cold start (no target directory, nothing recorded) with the client most hosts embed (TS
/// SDK v1): `initialize` waits for the server's own answer (issue 33: never a version no server
/// said). No server can answer within the budget (5 s here; a cold rmcp build takes a minute),
/// so the host gets error −31002 `server_building` that says to reconnect when the build is
/// done; the build goes on in the background after the host leaves, and the reconnect gets the
/// real server's answer, list and call.
#[test]
fn fc_cold_start_ts_v1() {
    let fresh = tempfile::Builder::new()
        .prefix("e2e-cold-tsv1-")
        .tempdir()
        .unwrap();
    let mut s = Scenario::with_target("fc-cold-tsv1", secs(480), fresh.path().to_path_buf());
    let mut d = s.driver(
        Client::TsV1,
        &["--no-gating", "--first-start-budget", "5s"],
        &[],
    );
    let c = d.cmd(json!({"op": "connect", "timeoutMs": 30_000}), secs(45));
    assert_eq!(c["ok"], json!(false), "{c}");
    assert_eq!(c["error"]["code"], json!(-31002), "{c}");
    let message = c["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("still building") && message.contains("reconnect"),
        "{c}"
    );
    assert!(
        d.stderr.grep(0, "server started:").is_empty(),
        "a cold rmcp build cannot be done yet"
    );
    d.stderr
        .wait_for(0, "initialize answered with an error after", secs(10));
    d.kill_host();
    d.wait_exit(secs(20));
    // The build the host left goes on in the background: waited for on cargo's lock.
    s.build_now();
    // The host reconnects: warm now, the server's own answers.
    let mut d = s.driver(Client::TsV1, &["--no-gating"], &[]);
    d.connect(30_000);
    assert_eq!(d.list_tools(), TOOLS);
    let r = d.call("list_items", json!({}));
    assert_eq!(structured(&r)["revision"], json!("A"), "{r}");
    close_clean(&s, d);
    assert_audit_verifies(&s);
}
