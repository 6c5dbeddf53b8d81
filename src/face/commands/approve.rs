//! `cargo mcp-dev approve`: the human channel. Shows what would be approved (label, current
//! epoch, what changed since the last approved epoch, the tools with their annotations shown as
//! untrusted hints, credential scopes), asks, then sends the decision bound to the epoch that
//! was shown. A decision for an epoch that has since changed is void on the supervisor side.

use std::collections::BTreeSet;
use std::io::{BufRead, IsTerminal, Write};

use serde_json::{Value, json};

use super::control_client;
use crate::base::error::{CmdResult, Failure};
use crate::face::cli::ApproveArgs;
use crate::{base::exit_codes, screen::output, screen::stderr};

/// `approve` without `--follow` (`dispatch` sends `--follow` to the inbox, `approve_follow`).
pub fn execute(args: ApproveArgs) -> CmdResult {
    if args.list {
        let st = control_client::call(&args.control, &json!({"op": "status"}))?;
        let grants = st.get("grants").cloned().unwrap_or(json!([]));
        // Tool names are the server's: the same JSON, or the line, with nothing a terminal acts on.
        if args.json {
            output::stdout_line(&crate::screen::sanitize::json_text(&grants.to_string()))?;
        } else if grants.as_array().is_none_or(|g| g.is_empty()) {
            output::stdout_line("no live grants")?;
        } else {
            for g in grants.as_array().into_iter().flatten() {
                let line = format!(
                    "{}  tools {}  scopes {}  epoch {}  {}",
                    g["id"].as_str().unwrap_or("?"),
                    g["toolScope"],
                    g["credentialScope"],
                    g["executionEpoch"].as_str().unwrap_or("?"),
                    grant_lifetime(g)
                );
                output::stdout_line(&crate::screen::sanitize::review(&line))?;
            }
        }
        return Ok(exit_codes::OK);
    }
    if let Some(id) = &args.revoke {
        let r = control_client::call(&args.control, &json!({"op": "revoke", "grant": id}))?;
        let n = r["revoked"].as_array().map(|a| a.len()).unwrap_or(0);
        if args.json {
            output::stdout_line(&crate::screen::sanitize::json_text(&r.to_string()))?;
        }
        stderr::line(&format!(
            "revoked {n} grant{}",
            if n == 1 { "" } else { "s" }
        ));
        return Ok(exit_codes::OK);
    }

    if args.policy {
        return approve_policy(&args);
    }
    if let Some(call_id) = &args.call {
        return approve_call(&args, call_id);
    }
    if args.yes && args.tools.is_empty() && !args.all_requested {
        return Err(Failure::new(
            exit_codes::USAGE,
            "--yes needs --tool NAME (repeatable) or --all-requested: the tools of pending denials are chosen by the agent",
        ));
    }
    let st = control_client::call(&args.control, &json!({"op": "status"}))?;
    let epoch = st
        .pointer("/server/epoch")
        .and_then(|e| e.as_str())
        .ok_or_else(|| {
            Failure::error("no server is running in this session (it may be building or crashed)")
        })?
        .to_string();
    refuse_identity_pending(&st)?;
    let catalog: BTreeSet<String> = strings(&st["catalogTools"]).into_iter().collect();
    let tools: BTreeSet<String> = if args.tools.is_empty() {
        strings(&st["pendingApproval"]["tools"])
            .into_iter()
            .collect()
    } else {
        args.tools.iter().cloned().collect()
    };
    if tools.is_empty() {
        return Err(Failure::error(format!(
            "nothing to approve: no denied call is waiting; pass --tool NAME (tools: {})",
            crate::screen::sanitize::review(
                &catalog.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        )));
    }
    for t in &tools {
        if !catalog.contains(t) {
            return Err(Failure::error(format!(
                "tool `{}` is not in the current catalog (tools: {})",
                crate::screen::sanitize::review(t),
                crate::screen::sanitize::review(
                    &catalog.iter().cloned().collect::<Vec<_>>().join(", ")
                )
            )));
        }
    }
    let scopes: BTreeSet<String> = if args.credential_scopes.is_empty() {
        tools
            .iter()
            .flat_map(|t| strings(&st["toolPolicy"][t]["credentialScopes"]))
            .collect()
    } else {
        args.credential_scopes.iter().cloned().collect()
    };

    let mut text = review(&st, &epoch, &tools, &scopes);
    text.push_str(&format!("  lasts     {}\n", tools_lifetime(&st, &tools)));
    stderr::raw(&text);
    if args.yes && args.all_requested {
        stderr::line(&format!(
            "granting every requested tool: {}",
            tools
                .iter()
                .map(|t| crate::screen::sanitize::review(t).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !args.yes && !confirmed("Approve? [y/N] ")? {
        return Ok(exit_codes::ERROR);
    }
    // Per-call tools get their own grant so the others stay per-epoch.
    let (per_call, per_epoch): (Vec<String>, Vec<String>) = tools
        .iter()
        .cloned()
        .partition(|t| st["toolPolicy"][t]["mode"] == "per-call");
    let mut granted = Vec::new();
    for group in [per_epoch, per_call] {
        if group.is_empty() {
            continue;
        }
        let group_scopes: Vec<String> = scopes
            .iter()
            .filter(|s| {
                args.credential_scopes.contains(s)
                    || group
                        .iter()
                        .any(|t| strings(&st["toolPolicy"][t]["credentialScopes"]).contains(s))
            })
            .cloned()
            .collect();
        let r = control_client::call(
            &args.control,
            &json!({"op": "approve", "epoch": epoch, "tools": group, "credentialScopes": group_scopes}),
        )?;
        granted.push(r["grant"].clone());
    }
    if args.json {
        output::stdout_line(&crate::screen::sanitize::json_text(
            &json!({"grants": granted}).to_string(),
        ))?;
    }
    for g in &granted {
        stderr::line(&format!(
            "approved: {} for epoch {} (grant {}, lasts {})",
            crate::screen::sanitize::review(&strings(&g["toolScope"]).join(", ")),
            g["executionEpoch"].as_str().unwrap_or("?"),
            g["id"].as_str().unwrap_or("?"),
            grant_lifetime(g)
        ));
    }
    Ok(exit_codes::OK)
}

/// `approve --call ID`: shows the denied call (tool, arguments, digest, epoch and what changed)
/// and grants exactly that call. `--yes` is allowed: the human named the call.
/// The running server's tool list is not known yet (being fetched, or its first list failed):
/// nothing can be reviewed against it.
fn refuse_identity_pending(st: &Value) -> Result<(), Failure> {
    if st["state"] == "identity-pending" {
        return Err(Failure::error(
            "the server's identity is pending (its tool catalog is not fetched yet): try again in a moment",
        ));
    }
    Ok(())
}

fn approve_call(args: &ApproveArgs, call_id: &str) -> CmdResult {
    let st = control_client::call(&args.control, &json!({"op": "status"}))?;
    let epoch = st
        .pointer("/server/epoch")
        .and_then(|e| e.as_str())
        .ok_or_else(|| {
            Failure::error("no server is running in this session (it may be building or crashed)")
        })?
        .to_string();
    // No review of a call against a catalog that is not this server's (round 25).
    refuse_identity_pending(&st)?;
    let call = control_client::call(
        &args.control,
        &json!({"op": "deniedCall", "callId": call_id}),
    )?;
    let tool = call["tool"].as_str().unwrap_or("").to_string();
    let digest = call["argumentsDigest"].as_str().unwrap_or("").to_string();
    let tools: BTreeSet<String> = [tool.clone()].into();
    let scopes: BTreeSet<String> = strings(&st["toolPolicy"][&tool]["credentialScopes"])
        .into_iter()
        .collect();
    let mut text = review(&st, &epoch, &tools, &scopes);
    text.push_str(&call_review(&call));
    text.push_str("  lasts     this call only (these arguments, once)\n");
    stderr::raw(&text);
    if !args.yes && !confirmed("Approve this one call? [y/N] ")? {
        return Ok(exit_codes::ERROR);
    }
    let r = control_client::call(
        &args.control,
        &json!({"op": "approveCall", "epoch": epoch, "callId": call_id, "tool": tool,
                "argumentsDigest": digest}),
    )?;
    let g = &r["grant"];
    if args.json {
        output::stdout_line(&crate::screen::sanitize::json_text(
            &json!({"grants": [g]}).to_string(),
        ))?;
    }
    stderr::line(&format!(
        "approved: one call of {} with arguments {} for epoch {} (grant {}); the agent may call it again with the same arguments",
        crate::screen::sanitize::review(&tool),
        crate::screen::sanitize::review(&digest),
        g["executionEpoch"].as_str().unwrap_or("?"),
        g["id"].as_str().unwrap_or("?"),
    ));
    Ok(exit_codes::OK)
}

/// `approve --policy`: shows how the package's policy (its configuration and the `run` flags
/// given) differs from what was accepted, in plain words, asks, then writes the accepted record
/// (the project's policy as it is now, stricter parts included) and records the acceptance in
/// the audit log; when a live `run` holds the log, the next `run` records it. It needs no
/// running session and applies at the next `run` (a running session keeps the policy it
/// started with). `--yes` skips the question, as for `--tool`: the agent has a shell too, and
/// what keeps it off this command is the host's sandbox (README, "Gating").
fn approve_policy(args: &ApproveArgs) -> CmdResult {
    use super::policy_record;
    use crate::policy::accepted::{self, AcceptedRecord, Terms};
    use crate::screen::sanitize::review as r;
    let selection = crate::identity::build::CargoSelection {
        manifest_path: args.control.manifest_path.clone(),
        package: args.control.package.clone(),
        target_dir: args.control.target_dir.clone(),
        ..Default::default()
    };
    let prep = crate::identity::cycle::Prepared::new(&selection)?;
    let t = &prep.target;
    let manifest = &t.resolved.manifest_path;
    let keys = crate::audit::KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    let key = keys
        .load_or_create_key()
        .map_err(|e| Failure::error(e.to_string()))?;
    let (requested, warnings) =
        super::run::requested_policy(&t.config, args.no_gating, &args.exempt, &args.per_call);
    for w in warnings {
        stderr::warn(&w);
    }
    let requested = Terms::of(&requested);
    let standing = policy_record::load(&keys, manifest);
    let accepted = standing.terms();
    let weaker = accepted::weakenings(&requested, &accepted);
    let stricter = accepted::weakenings(&accepted, &requested);
    let mut text = format!(
        "Accept the policy of `{}` ({}):\n",
        r(&t.label),
        r(&policy_record::package_key(manifest))
    );
    match (&standing.record, &standing.refused) {
        (Some(rec), _) => text.push_str(&format!(
            "  accepted now:  {} (accepted at {} ms since the Unix epoch)\n",
            r(&terms_words(&rec.terms)),
            rec.accepted_at_ms
        )),
        (None, Some(why)) => text.push_str(&format!(
            "  accepted now:  nothing: the record {} is refused ({}); the default stands, {}\n",
            r(&standing.path.display().to_string()),
            r(why),
            terms_words(&accepted)
        )),
        (None, None) => text.push_str(&format!(
            "  accepted now:  nothing yet; the default stands, {}\n",
            terms_words(&accepted)
        )),
    }
    text.push_str(&format!(
        "  the project:   {}\n",
        r(&terms_words(&requested))
    ));
    for w in &weaker {
        text.push_str(&format!("  weaker:        it would {}\n", r(&w.words())));
    }
    for w in &stricter {
        text.push_str(&format!(
            "  stricter:      it no longer asks to {} (in force already)\n",
            r(&w.words())
        ));
    }
    if standing.record.as_ref().map(|rec| &rec.terms) == Some(&requested)
        || (standing.record.is_none() && standing.refused.is_none() && weaker.is_empty())
    {
        stderr::raw(&text);
        stderr::line("nothing to accept: the project's policy is in force as it is");
        return Ok(exit_codes::OK);
    }
    stderr::raw(&text);
    if !args.yes && !confirmed("Accept this policy? [y/N] ")? {
        return Ok(exit_codes::ERROR);
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // Recorded now when no `run` holds the log; else the next `run` records it.
    let audit_path = t
        .config
        .config
        .audit_log
        .as_ref()
        .map(|p| t.resolved.package_root.join(p))
        .unwrap_or_else(|| t.layout().audit_log(&t.label));
    let unlogged = AcceptedRecord::sealed(
        &policy_record::package_key(manifest),
        requested.clone(),
        now_ms,
        false,
        &key,
    );
    let logged = log_acceptance(&audit_path, &keys, &unlogged);
    let record = policy_record::accept(&keys, manifest, requested, now_ms, logged.is_ok())?;
    if args.json {
        output::stdout_line(&crate::screen::sanitize::json_text(
            &json!({"accepted": record.terms, "logged": record.logged}).to_string(),
        ))?;
    }
    stderr::line(&format!(
        "accepted the policy of `{}`: {}; it applies at the next `cargo mcp-dev run` (a running session keeps its policy until it restarts)",
        r(&t.label),
        r(&terms_words(&record.terms))
    ));
    if let Err(why) = logged {
        stderr::line(&format!(
            "the acceptance is not in the audit log yet ({}): the next `run` records it",
            crate::screen::sanitize::line(&why)
        ));
    }
    Ok(exit_codes::OK)
}

/// Appends `policy_accepted` to the log at `path` if no `run` holds it (waits briefly).
fn log_acceptance(
    path: &std::path::Path,
    keys: &crate::audit::KeyStore,
    record: &crate::policy::accepted::AcceptedRecord,
) -> Result<(), String> {
    let opts = crate::audit::AuditOptions {
        lock_wait: std::time::Duration::from_millis(300),
        write_through_map: false,
        ..Default::default()
    };
    let (mut log, _) =
        crate::audit::open_for_run_with(path, keys, &opts).map_err(|e| e.to_string())?;
    log.append(
        crate::audit::POLICY_ACCEPTED,
        crate::audit::TOOL_RUN,
        None,
        super::run::policy_accepted_data(record, "approve"),
    )
    .map_err(|e| e.to_string())?;
    log.commit().map_err(|e| e.to_string())
}

/// A policy's terms in plain words.
fn terms_words(t: &crate::policy::accepted::Terms) -> String {
    use crate::policy::accepted::GateTerms;
    let list = |s: &BTreeSet<String>| {
        s.iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = match &t.gate {
        GateTerms::Off => "gate off".to_string(),
        GateTerms::All { exempt } if exempt.is_empty() => "every tool gated".into(),
        GateTerms::All { exempt } => format!("every tool gated but {}", list(exempt)),
        GateTerms::Only { tools } if tools.is_empty() => "no tool gated".into(),
        GateTerms::Only { tools } => format!("only {} gated", list(tools)),
    };
    if t.per_call_all {
        out.push_str(", a decision for every call");
    } else if !t.per_call.is_empty() {
        out.push_str(&format!(", a decision per call for {}", list(&t.per_call)));
    }
    out
}

/// The call part of the `approve --call` screen. Every field came from the agent (arguments,
/// call id) or the server (tool): all through [`crate::screen::sanitize::review`].
pub(super) fn call_review(call: &Value) -> String {
    use crate::screen::sanitize::review as r;
    let mut out = format!(
        "  call      {} ({}, denied: {})
  arguments {}
",
        r(call["callId"].as_str().unwrap_or("?")),
        r(call["argumentsDigest"].as_str().unwrap_or("?")),
        r(call["reason"].as_str().unwrap_or("?")),
        r(call["arguments"].as_str().unwrap_or("null")),
    );
    if call["argumentsTruncated"] == true {
        out.push_str("            (arguments cut for display; the grant binds the whole text by its digest)\n");
    }
    out
}

fn eprint_flush(text: &str) {
    let mut e = std::io::stderr();
    let _ = e.write_all(text.as_bytes());
    let _ = e.flush();
}

/// How long the grants `approve` issues for `tools` last, in a person's words (per-call tools
/// share their own grant, used up by one call).
fn tools_lifetime(st: &Value, tools: &BTreeSet<String>) -> String {
    let per_call: Vec<String> = tools
        .iter()
        .filter(|t| st["toolPolicy"][t.as_str()]["mode"] == "per-call")
        .map(|t| crate::screen::sanitize::review(t).into_owned())
        .collect();
    match per_call.len() {
        0 => "until the next rebuild".into(),
        1 if tools.len() == 1 => "for its next call only".into(),
        n if n == tools.len() => "for the next call of one of them only".into(),
        1 => format!(
            "until the next rebuild; {} for its next call only",
            per_call[0]
        ),
        _ => format!(
            "until the next rebuild; {} for the next call of one of them only",
            per_call.join(", ")
        ),
    }
}

/// How long a grant (as the control socket sends it) lasts, in a person's words.
pub(super) fn grant_lifetime(g: &Value) -> String {
    crate::screen::sanitize::review(crate::screen::wording::lifetime_words(
        g["expiresWhen"].as_str().unwrap_or("?"),
        g["kind"].as_str(),
    ))
    .into_owned()
}

pub(super) fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What the human reviews before deciding. Every piece that comes from the server or the agent
/// (tool names, descriptions, hints, catalog lines, scope and env names, even the label) goes
/// through [`crate::screen::sanitize::review`]: no escape sequence reaches the terminal and invisible or
/// bidi characters are shown as `<U+XXXX>` (issue 12, terminal escape injection).
pub(super) fn review(
    st: &Value,
    epoch: &str,
    tools: &BTreeSet<String>,
    scopes: &BTreeSet<String>,
) -> String {
    use crate::screen::sanitize::review as r;
    let mut out = String::new();
    out.push_str(&format!(
        "Approve for `{}` (agent run {}):\n  epoch     {} (pid {}, identity {})\n",
        r(st["label"].as_str().unwrap_or("?")),
        r(st["agentRun"].as_str().unwrap_or("?")),
        r(epoch),
        st.pointer("/server/pid").cloned().unwrap_or(Value::Null),
        r(st.pointer("/server/identityDigest")
            .and_then(|d| d.as_str())
            .unwrap_or("?"))
    ));
    match st.get("sinceLastApproval").filter(|v| !v.is_null()) {
        Some(since) => {
            out.push_str(&format!(
                "  changed since the last approved epoch {}:\n    identity: {}\n",
                r(since["epoch"].as_str().unwrap_or("?")),
                r(since["identity"]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or("no component changed (restart only)"))
            ));
            let lines = strings(&since["catalog"]);
            if lines.is_empty() {
                out.push_str("    catalog: unchanged\n");
            }
            for l in lines {
                out.push_str(&format!("    catalog: {}\n", r(&l)));
            }
        }
        None => out.push_str("  first approval in this session\n"),
    }
    let details = st["catalogDetails"].as_array().cloned().unwrap_or_default();
    for t in tools {
        let d = details
            .iter()
            .find(|d| d["name"] == t.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        let pol = &st["toolPolicy"][t];
        out.push_str(&format!(
            "  tool      {} ({}{})\n",
            r(t),
            pol["mode"].as_str().unwrap_or("per-epoch"),
            if pol["gated"] == false {
                ", not gated"
            } else {
                ""
            }
        ));
        if let Some(desc) = d["description"].as_str() {
            out.push_str(&format!(
                "            {}\n",
                r(desc.lines().next().unwrap_or(""))
            ));
        }
        if let Some(a) = d["annotations"].as_object().filter(|a| !a.is_empty()) {
            let hints: Vec<String> = a.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!(
                "            hints from the server (not trusted): {}\n",
                r(&hints.join(" "))
            ));
        }
    }
    if scopes.is_empty() {
        out.push_str("  credential scopes: none\n");
    } else {
        for s in scopes {
            out.push_str(&format!(
                "  credential scope {} (env {})\n",
                r(s),
                r(&strings(&st["policy"]["credentialScopeEnv"][s]).join(", "))
            ));
        }
    }
    out
}

/// Asks the human at the terminal; `false` (and a status line) unless they answer yes.
fn confirmed(question: &str) -> Result<bool, Failure> {
    if !std::io::stdin().is_terminal() {
        return Err(Failure::new(
            exit_codes::USAGE,
            "stdin is not a terminal: pass --yes to approve without asking",
        ));
    }
    eprint_flush(question);
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        return Ok(true);
    }
    stderr::line("approval cancelled: nothing was granted");
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12, high finding "terminal escape injection": the approve screen shows escape
    /// sequences, invisible and bidi characters from the server instead of passing them to the
    /// terminal.
    #[test]
    fn review_screen_neutralises_server_text() {
        let st = json!({
            "label": "srv",
            "agentRun": "R",
            "server": {"pid": 1, "identityDigest": "sha256:ab"},
            "sinceLastApproval": {"epoch": "E0", "identity": "executable",
                "catalog": ["~ write: description \u{1b}[2K changed"]},
            "catalogDetails": [{"name": "wri\u{202e}te", "description": "safe\u{1b}[8mhidden\u{1b}]0;t\u{7}",
                "annotations": {"readOnlyHint": "\u{1b}[32mtrue"}}],
            "toolPolicy": {},
            "policy": {"credentialScopeEnv": {}},
        });
        let tools: BTreeSet<String> = ["wri\u{202e}te".to_string()].into();
        let text = review(&st, "E1", &tools, &BTreeSet::new());
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\u{202e}'),
            "{text}"
        );
        assert!(text.contains("wri<U+202E>te"), "{text}");
        assert!(text.contains("safe\\x1b[8mhidden\\x1b]0;t\\x07"), "{text}");
        assert!(text.contains("description \\x1b[2K changed"), "{text}");
    }

    /// The arguments of a call to approve come from the agent: no escape sequence, newline or
    /// invisible character reaches the terminal.
    #[test]
    fn call_review_neutralises_agent_text() {
        let call = json!({"callId": "7\u{1b}[2J", "argumentsDigest": "sha256:ab", "reason": "authorization_required",
            "arguments": "{\"path\":\"/etc\u{202e}dwssap\",\n\"x\":\"\u{1b}]0;owned\u{7}\"}", "argumentsTruncated": true});
        let text = call_review(&call);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}') && !text.contains('\u{202e}'),
            "{text}"
        );
        assert_eq!(text.lines().count(), 3, "one line of arguments: {text}");
        assert!(text.contains("/etc<U+202E>dwssap"), "{text}");
        assert!(text.contains("cut for display"), "{text}");
    }
}
