//! Words a person reads for recorded values: the wording `approve`, `status`, `audit show` and
//! the host's approval form share, so that one value reads the same everywhere, and the page
//! `status` prints.
//!
//! Owns: the words and that page's layout. Must not touch: what the values mean (the grant
//! rules are `approval`'s), or where the text goes.

use serde_json::Value;

/// How long a grant lasts, in the words a person reads (the form's choices, `audit show`,
/// `approve`, `status`): `expires_when` and `kind` as recorded (`runEnd` or the older
/// `run-end`; `firstUse`; kind `call` or `epoch`). Unknown values are shown as they are.
pub fn lifetime_words<'a>(expires_when: &'a str, kind: Option<&str>) -> &'a str {
    match (expires_when, kind) {
        // A `call` grant covers one call, whatever else is recorded.
        (_, Some("call")) => "this call only",
        ("firstUse" | "first-use", _) => "its next call only",
        ("runEnd" | "run-end", _) => "until the next rebuild",
        (other, _) => other,
    }
}

/// The array at `key`, or none.
fn list<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(|x| x.as_str()).unwrap_or("-")
}

/// The status document (`{"op": "status"}`) as `cargo mcp-dev status` shows it; missing
/// fields read `-`. Every string the server or the agent wrote (tool names, call ids, reasons)
/// goes through [`crate::screen::sanitize`] first.
pub fn status_page(v: &Value) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "label        {} (agent run {})\n",
        s(v, "/label"),
        s(v, "/agentRun")
    ));
    out.push_str(&format!(
        "state        {} (restart {}, gating {}, era {})\n",
        s(v, "/state"),
        s(v, "/restart"),
        s(v, "/gating"),
        s(v, "/era")
    ));
    match v.get("server").filter(|x| !x.is_null()) {
        Some(srv) => out.push_str(&format!(
            "server       pid={} epoch={} identity {}\n",
            srv["pid"],
            s(srv, "/epoch"),
            s(srv, "/identityDigest")
        )),
        None => match v.get("serverAbsent").and_then(Value::as_str) {
            Some(why) => out.push_str(&format!("server       not running: {why}\n")),
            None => out.push_str("server       not running\n"),
        },
    }
    if v.get("pendingRestart").and_then(|p| p.as_bool()) == Some(true) {
        out.push_str(&format!(
            "pending      build {} waits for `cargo mcp-dev restart`\n",
            s(v, "/latestBuild")
        ));
    }
    out.push_str(&format!("last build   {}\n", s(v, "/lastBuild")));
    let cat = v.get("catalog").filter(|c| !c.is_null());
    out.push_str(&format!(
        "catalog      {} (host has {})\n",
        cat.map(|c| format!("revision {} {}", c["revision"], s(c, "/digest")))
            .unwrap_or_else(|| "not fetched".into()),
        v.get("hostCatalog")
            .and_then(|h| h.as_str())
            .unwrap_or("nothing yet")
    ));
    let grants = list(v, "grants");
    if grants.is_empty() {
        out.push_str("grants       none\n");
    }
    for g in grants {
        out.push_str(&format!(
            "grant        {} tools {} scopes {} epoch {} ({})\n",
            s(g, "/id"),
            g["toolScope"],
            g["credentialScope"],
            s(g, "/executionEpoch"),
            lifetime_words(s(g, "/expiresWhen"), g["kind"].as_str())
        ));
    }
    for d in list(v, "recentDenials") {
        out.push_str(&format!(
            "denied       {} {}\n",
            crate::screen::sanitize::review(s(d, "/tool")),
            s(d, "/reason")
        ));
    }
    let channels: Vec<&str> = v
        .get("approvalChannels")
        .and_then(|c| c.as_array())
        .map(|a| a.iter().filter_map(|c| c.as_str()).collect())
        .unwrap_or_default();
    if !channels.is_empty() {
        out.push_str(&format!("approvals    via {}\n", channels.join(", ")));
    }
    for p in list(v, "openPrompts") {
        out.push_str(&format!(
            "asking host  call {} {} (waiting for the answer in the host)\n",
            crate::screen::sanitize::review(s(p, "/callId")),
            crate::screen::sanitize::review(s(p, "/tool")),
        ));
    }
    // Tool names and call ids come from the agent: sanitized for the terminal.
    for d in list(v, "deniedCalls") {
        out.push_str(&format!(
            "waiting call {} {} (arguments {}): `{}` approves this call only\n",
            crate::screen::sanitize::review(s(d, "/callId")),
            crate::screen::sanitize::review(s(d, "/tool")),
            crate::screen::sanitize::review(s(d, "/argumentsDigest")),
            crate::screen::sanitize::approve_call_command(s(d, "/callId")),
        ));
    }
    out.push_str(&format!("audit log    {}\n", s(v, "/auditLog")));
    out
}
