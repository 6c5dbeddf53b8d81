//! `cargo mcp-dev status`: the running supervisor's state (human or `--json`); with `--follow`,
//! its status lines as they are written ([`super::status_follow`]).

use serde_json::{Value, json};

use super::control_client;
use crate::cli::StatusArgs;
use crate::error::CmdResult;
use crate::{exit_codes, output};

pub fn execute(args: StatusArgs) -> CmdResult {
    if args.follow {
        return super::status_follow::execute(&args);
    }
    let status = control_client::call(&args.control, &json!({"op": "status"}))?;
    if args.json {
        // Tool names and call ids are the server's and the agent's: the same JSON, with what a
        // terminal would act on written as `\u` escapes (line by line: a pretty document's
        // line breaks are its own, those inside strings are escaped already).
        let pretty = serde_json::to_string_pretty(&status).expect("json");
        let safe: Vec<_> = pretty.lines().map(crate::sanitize::json_text).collect();
        output::stdout_line(&safe.join("\n"))?;
    } else {
        output::stdout_text(&render(&status))?;
    }
    Ok(exit_codes::OK)
}

fn s<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(|x| x.as_str()).unwrap_or("-")
}

pub fn render(v: &Value) -> String {
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
    let grants = v
        .get("grants")
        .and_then(|g| g.as_array())
        .cloned()
        .unwrap_or_default();
    if grants.is_empty() {
        out.push_str("grants       none\n");
    }
    for g in grants {
        out.push_str(&format!(
            "grant        {} tools {} scopes {} epoch {} ({})\n",
            s(&g, "/id"),
            g["toolScope"],
            g["credentialScope"],
            s(&g, "/executionEpoch"),
            crate::approval::lifetime_words(s(&g, "/expiresWhen"), g["kind"].as_str())
        ));
    }
    for d in v
        .get("recentDenials")
        .and_then(|d| d.as_array())
        .cloned()
        .unwrap_or_default()
    {
        out.push_str(&format!(
            "denied       {} {}\n",
            crate::sanitize::review(s(&d, "/tool")),
            s(&d, "/reason")
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
    for p in v
        .get("openPrompts")
        .and_then(|p| p.as_array())
        .cloned()
        .unwrap_or_default()
    {
        out.push_str(&format!(
            "asking host  call {} {} (waiting for the answer in the host)\n",
            crate::sanitize::review(s(&p, "/callId")),
            crate::sanitize::review(s(&p, "/tool")),
        ));
    }
    // Tool names and call ids come from the agent: sanitized for the terminal.
    for d in v
        .get("deniedCalls")
        .and_then(|d| d.as_array())
        .cloned()
        .unwrap_or_default()
    {
        out.push_str(&format!(
            "waiting call {} {} (arguments {}): `{}` approves this call only\n",
            crate::sanitize::review(s(&d, "/callId")),
            crate::sanitize::review(s(&d, "/tool")),
            crate::sanitize::review(s(&d, "/argumentsDigest")),
            crate::sanitize::approve_call_command(s(&d, "/callId")),
        ));
    }
    out.push_str(&format!("audit log    {}\n", s(v, "/auditLog")));
    out
}
