//! Journals projected from audit records: the session journal (runs, epochs, grants: who was
//! authorized to run what, under which epoch) and the activity journal (each call and the epoch
//! that handled it). Owns the projection and its human and JSON renderings. Must not touch:
//! verification (a caller picks [`Journals::from_log`], which verifies first, or
//! [`Journals::from_records`]) and stdout (renderings are returned as strings).
//!
//! `data` is free JSON, so the projection is tolerant: a missing field shows as absent, never as
//! an error. The fields read are listed on the [`super::record_type`] constants.

use super::chain::Record;
use super::keys::KeyStore;
use super::record_type as rt;
use super::{AuditError, records, verify};
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// Which journal(s) [`Journals::render_human`] renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalView {
    Session,
    Activity,
    Both,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Journals {
    pub session: SessionJournal,
    pub activity: Vec<CallEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionJournal {
    pub runs: Vec<RunEntry>,
    pub epochs: Vec<EpochEntry>,
    pub grants: Vec<GrantEntry>,
    /// What each host connection was shown, and from which source.
    pub presented: Vec<PresentedEntry>,
}

/// One `catalog_presented` record: a catalog (or one tool's definition) a host was shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PresentedEntry {
    pub time: String,
    pub run: String,
    pub epoch: Option<String>,
    #[serde(flatten)]
    pub record: super::records::CatalogPresented,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEntry {
    pub run: String,
    pub started: Option<String>,
    pub ended: Option<String>,
    pub end_reason: Option<String>,
    pub client: Option<ClientInfo>,
    /// `"on"` / `"off"` from `run_started`; `"off"` after a `gating_disabled` record.
    pub gating: Option<String>,
    pub label: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientInfo {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EpochEntry {
    pub epoch: String,
    /// Time of the `server_started` record (or of the `server_replaced` that introduced it).
    pub started: String,
    pub pid: Option<u64>,
    pub identity_digest: Option<String>,
    pub executable_sha256: Option<String>,
    pub label: Option<String>,
    pub replaced_by: Option<String>,
    /// Time the epoch was replaced or its server exited.
    pub ended: Option<String>,
    pub exit_status: Option<String>,
    /// The agent run whose supervisor started it.
    #[serde(skip)]
    pub run: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GrantEntry {
    pub id: String,
    pub agent_run: Option<String>,
    pub server_label: Option<String>,
    pub epoch: Option<String>,
    pub tools: Vec<String>,
    pub credential_scopes: Vec<String>,
    pub issued_at: Option<String>,
    pub expires_when: Option<String>,
    /// Where the human decided: `terminal` or `host` (absent in logs older than channels).
    pub channel: Option<String>,
    /// `epoch` (the tools for the epoch) or `call` (one call, bound to its arguments' digest).
    pub kind: Option<String>,
    /// Time of the `approval_granted` record.
    pub granted: String,
    /// Time of the `approval_revoked` record.
    pub revoked: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CallEntry {
    /// Time of the first record about this call (`tool_called`, or the denial).
    pub time: String,
    pub run: String,
    pub call_id: String,
    pub tool: String,
    /// The epoch that handled (or refused) the call.
    pub epoch: Option<String>,
    /// The grant that authorized it; `None` for an ungated call (or a call never forwarded).
    pub grant: Option<String>,
    pub credential_scopes: Vec<String>,
    /// The catalog revision of this tool as the host was shown it (when it was current).
    pub shown_revision: Option<u64>,
    pub outcome: CallOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum CallOutcome {
    /// Forwarded, no result recorded (still running, or the log ends there).
    Pending,
    Ok {
        duration_ms: Option<u64>,
    },
    Error {
        duration_ms: Option<u64>,
    },
    Denied {
        reason: String,
        approved_epoch: Option<String>,
        current_epoch: Option<String>,
        /// The approval channel involved, and for the host what became of its prompt.
        channel: Option<String>,
        channel_outcome: Option<String>,
    },
    FailedEpochTransition {
        old_epoch: Option<String>,
        new_epoch: Option<String>,
    },
    /// The host cancelled it after it was forwarded, and no answer was recorded after that.
    Cancelled,
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(s).collect())
        .unwrap_or_default()
}

/// A JSON-RPC id may be a string or a number; show either as text.
fn id_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

impl Journals {
    /// Verifies the log, then projects it. A log that fails verification is an error
    /// ([`AuditError::Verify`]); use [`super::read_records`] + [`Journals::from_records`] to look
    /// at it anyway.
    pub fn from_log(path: &Path, keys: &KeyStore) -> Result<Journals, AuditError> {
        let (_, records) = verify::verify_and_collect(path, keys)?;
        Ok(Journals::from_records(&records))
    }

    /// Projects records in file order.
    pub fn from_records(records: &[Record]) -> Journals {
        let mut b = Builder::default();
        for r in records {
            b.add(r);
        }
        Journals {
            session: SessionJournal {
                runs: b.runs,
                epochs: b.epochs,
                grants: b.grants,
                presented: b.presented,
            },
            activity: b.calls,
        }
    }

    pub fn to_json(&self) -> Value {
        // Plain structs of strings and integers: serialization cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Aligned, plain-text tables (no colours), ending in a newline.
    pub fn render_human(&self, which: JournalView) -> String {
        let mut out = String::new();
        if matches!(which, JournalView::Session | JournalView::Both) {
            self.render_session(&mut out);
        }
        if matches!(which, JournalView::Activity | JournalView::Both) {
            if !out.is_empty() {
                out.push('\n');
            }
            self.render_activity(&mut out);
        }
        out
    }

    fn render_session(&self, out: &mut String) {
        let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        out.push_str("Runs\n");
        let rows = self.session.runs.iter().map(|r| {
            let client = r
                .client
                .as_ref()
                .map(|c| format!("{} {}", c.name, c.version).trim().to_owned());
            let ended = match (&r.ended, &r.end_reason) {
                (Some(t), Some(why)) => format!("{t} ({why})"),
                (Some(t), None) => t.clone(),
                _ => "-".into(),
            };
            vec![
                r.run.clone(),
                dash(&r.started),
                ended,
                dash(&client),
                dash(&r.gating),
                dash(&r.label),
            ]
        });
        table(
            out,
            &["RUN", "STARTED", "ENDED", "CLIENT", "GATING", "LABEL"],
            rows.collect(),
        );

        out.push_str("\nEpochs\n");
        let rows = self.session.epochs.iter().map(|e| {
            let ended = match (&e.ended, &e.replaced_by, &e.exit_status) {
                (Some(t), Some(next), _) => format!("{t} (replaced by {next})"),
                (Some(t), None, Some(status)) => format!("{t} (exited: {status})"),
                (Some(t), None, None) => t.clone(),
                _ => "-".into(),
            };
            let pid = e.pid.map(|p| p.to_string());
            let identity = e
                .identity_digest
                .as_deref()
                .map(|d| d.get(..12).unwrap_or(d).to_owned());
            vec![
                e.epoch.clone(),
                e.started.clone(),
                dash(&pid),
                dash(&identity),
                dash(&e.label),
                ended,
            ]
        });
        table(
            out,
            &["EPOCH", "STARTED", "PID", "IDENTITY", "LABEL", "ENDED"],
            rows.collect(),
        );

        out.push_str("\nGrants\n");
        let rows = self.session.grants.iter().map(|g| {
            let list = |v: &[String]| {
                if v.is_empty() {
                    "-".to_owned()
                } else {
                    v.join(",")
                }
            };
            vec![
                g.id.clone(),
                dash(&g.epoch),
                dash(&g.agent_run),
                list(&g.tools),
                list(&g.credential_scopes),
                match (&g.channel, &g.kind) {
                    (Some(ch), Some(k)) => format!("{ch}, {k}"),
                    (Some(ch), None) => ch.clone(),
                    (None, Some(k)) => k.clone(),
                    (None, None) => "-".into(),
                },
                g.granted.clone(),
                g.revoked
                    .clone()
                    .map(|t| format!("revoked {t}"))
                    .unwrap_or_else(|| match &g.expires_when {
                        Some(e) => {
                            crate::screen::wording::lifetime_words(e, g.kind.as_deref()).to_owned()
                        }
                        None => "-".into(),
                    }),
            ]
        });
        table(
            out,
            &[
                "GRANT", "EPOCH", "RUN", "TOOLS", "SCOPES", "VIA", "GRANTED", "ENDS",
            ],
            rows.collect(),
        );

        out.push_str("\nShown to the host\n");
        let rows = self.session.presented.iter().map(|p| {
            let r = &p.record;
            let what = match (&r.tool, r.tools) {
                (Some(t), _) => format!("tool {t}"),
                (None, Some(n)) => format!("{n} tools"),
                _ => "-".into(),
            };
            vec![
                p.time.clone(),
                p.run.clone(),
                r.source.clone(),
                r.revision
                    .map(|n| format!("rev {n}"))
                    .unwrap_or_else(|| "-".into()),
                r.digest
                    .as_deref()
                    .map(|d| d.get(..19).unwrap_or(d).to_owned())
                    .unwrap_or_else(|| "-".into()),
                what,
            ]
        });
        table(
            out,
            &["TIME", "RUN", "SOURCE", "REVISION", "DIGEST", "WHAT"],
            rows.collect(),
        );
    }

    fn render_activity(&self, out: &mut String) {
        out.push_str("Activity\n");
        let rows = self.activity.iter().map(|c| {
            let grant = match (&c.grant, &c.outcome) {
                (Some(g), _) => g.clone(),
                (None, CallOutcome::Denied { .. }) => "-".into(),
                (None, _) => "ungated".into(),
            };
            let ms = |d: &Option<u64>| d.map(|d| format!(" ({d} ms)")).unwrap_or_default();
            let outcome = match &c.outcome {
                CallOutcome::Pending => "pending".to_owned(),
                CallOutcome::Ok { duration_ms } => format!("ok{}", ms(duration_ms)),
                CallOutcome::Error { duration_ms } => format!("error{}", ms(duration_ms)),
                CallOutcome::Denied {
                    reason,
                    approved_epoch,
                    current_epoch,
                    channel,
                    channel_outcome,
                } => {
                    let base = match (approved_epoch, current_epoch) {
                        (Some(a), Some(cur)) => {
                            format!("denied: {reason} (approved {a}, current {cur})")
                        }
                        _ => format!("denied: {reason}"),
                    };
                    match (channel, channel_outcome) {
                        (Some(ch), Some(o)) => format!("{base} [{ch}: {o}]"),
                        (Some(ch), None) => format!("{base} [{ch}]"),
                        _ => base,
                    }
                }
                CallOutcome::FailedEpochTransition {
                    old_epoch,
                    new_epoch,
                } => format!(
                    "failed: epoch {} -> {}",
                    old_epoch.as_deref().unwrap_or("?"),
                    new_epoch.as_deref().unwrap_or("?")
                ),
                CallOutcome::Cancelled => "cancelled by the host".to_owned(),
            };
            vec![
                c.time.clone(),
                c.run.clone(),
                c.call_id.clone(),
                c.tool.clone(),
                c.epoch.clone().unwrap_or_else(|| "-".into()),
                c.shown_revision
                    .map(|n| format!("rev {n}"))
                    .unwrap_or_else(|| "-".into()),
                grant,
                outcome,
            ]
        });
        table(
            out,
            &[
                "TIME", "RUN", "CALL", "TOOL", "EPOCH", "SHOWN", "GRANT", "OUTCOME",
            ],
            rows.collect(),
        );
    }
}

/// Left-aligned columns separated by two spaces, indented by two; `(none)` for no rows.
fn table(out: &mut String, headers: &[&str], rows: Vec<Vec<String>>) {
    if rows.is_empty() {
        out.push_str("  (none)\n");
        return;
    }
    // Cells hold agent and server text (tool names, call ids): each stays in its cell, with
    // controls, invisible and bidi characters shown, never a line break or a forged row.
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|c| crate::screen::sanitize::review(&c).into_owned())
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::from("  ");
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(cell);
            l.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in &rows {
        line(&mut row.iter().map(String::as_str));
    }
}

#[derive(Default)]
struct Builder {
    runs: Vec<RunEntry>,
    epochs: Vec<EpochEntry>,
    grants: Vec<GrantEntry>,
    presented: Vec<PresentedEntry>,
    calls: Vec<CallEntry>,
    /// (run, callId) → index in `calls` of the newest call with that id (ids are reused).
    call_index: HashMap<(String, String), usize>,
}

impl Builder {
    fn run(&mut self, id: &str) -> &mut RunEntry {
        let i = match self.runs.iter().position(|r| r.run == id) {
            Some(i) => i,
            None => {
                self.runs.push(RunEntry {
                    run: id.to_owned(),
                    started: None,
                    ended: None,
                    end_reason: None,
                    client: None,
                    gating: None,
                    label: None,
                });
                self.runs.len() - 1
            }
        };
        &mut self.runs[i]
    }

    fn epoch(&mut self, id: &str, time: &str) -> &mut EpochEntry {
        let i = match self.epochs.iter().position(|e| e.epoch == id) {
            Some(i) => i,
            None => {
                self.epochs.push(EpochEntry {
                    epoch: id.to_owned(),
                    started: time.to_owned(),
                    pid: None,
                    identity_digest: None,
                    executable_sha256: None,
                    label: None,
                    replaced_by: None,
                    ended: None,
                    exit_status: None,
                    run: None,
                });
                self.epochs.len() - 1
            }
        };
        &mut self.epochs[i]
    }

    /// The call `(run, callId)`, created from `r` if no earlier record mentioned it.
    fn call(&mut self, r: &Record) -> &mut CallEntry {
        let i = self.call_index_of(r);
        &mut self.calls[i]
    }

    /// The entry a `tool_result` closes: the newest call with its id, unless that one is of
    /// another tool (the host reused the id of a cancelled call that the server then answered
    /// late): the newest with its id and its tool (looked for among the last 10,000 calls).
    fn result_entry(&mut self, r: &Record, tool: &str) -> usize {
        let newest = self.call_index_of(r);
        if tool.is_empty() || self.calls[newest].tool == tool {
            return newest;
        }
        let call_id = self.calls[newest].call_id.clone();
        let earliest = self.calls.len().saturating_sub(10_000);
        (earliest..newest)
            .rev()
            .find(|&i| {
                let c = &self.calls[i];
                c.run == r.run && c.call_id == call_id && c.tool == tool
            })
            .unwrap_or(newest)
    }

    fn call_index_of(&mut self, r: &Record) -> usize {
        let key = (r.run.clone(), id_text(&r.data["callId"]));
        match self.call_index.get(&key) {
            Some(&i) => i,
            None => self.new_call(r, key),
        }
    }

    fn new_call(&mut self, r: &Record, key: (String, String)) -> usize {
        self.calls.push(CallEntry {
            time: r.time.clone(),
            run: key.0.clone(),
            call_id: key.1.clone(),
            tool: s(&r.data["tool"]).unwrap_or_else(|| "?".into()),
            epoch: r.epoch.clone(),
            grant: None,
            credential_scopes: Vec::new(),
            shown_revision: None,
            outcome: CallOutcome::Pending,
        });
        self.call_index.insert(key, self.calls.len() - 1);
        self.calls.len() - 1
    }

    fn add(&mut self, r: &Record) {
        let d = &r.data;
        match r.record_type.as_str() {
            rt::RUN_STARTED => {
                let id = s(&d["agentRun"]).unwrap_or_else(|| r.run.clone());
                // Epochs of an earlier run that never recorded an end: that supervisor stopped
                // without writing it (killed, crashed, power loss).
                for e in self
                    .epochs
                    .iter_mut()
                    .filter(|e| e.ended.is_none() && e.run.as_ref().is_some_and(|run| *run != id))
                {
                    e.ended = Some("unknown".into());
                    e.exit_status = Some("supervisor stopped".into());
                }
                let entry = self.run(&id);
                entry.started = Some(r.time.clone());
                entry.client = d["client"].as_object().map(|c| ClientInfo {
                    name: c.get("name").and_then(s).unwrap_or_default(),
                    version: c.get("version").and_then(s).unwrap_or_default(),
                });
                entry.gating = s(&d["gating"]);
                entry.label = s(&d["label"]);
            }
            rt::RUN_ENDED => {
                let entry = self.run(&r.run);
                entry.ended = Some(r.time.clone());
                entry.end_reason = s(&d["reason"]);
                // A server still running when its run ended ended with it.
                for e in self
                    .epochs
                    .iter_mut()
                    .filter(|e| e.ended.is_none() && e.run.as_deref() == Some(r.run.as_str()))
                {
                    e.ended = Some(r.time.clone());
                    e.exit_status = Some("stopped at session end".into());
                }
            }
            rt::GATING_DISABLED => self.run(&r.run).gating = Some("off".into()),
            rt::SERVER_STARTED => {
                let Some(id) = s(&d["epoch"]).or_else(|| r.epoch.clone()) else {
                    return;
                };
                let e = self.epoch(&id, &r.time);
                e.started = r.time.clone();
                e.run = Some(r.run.clone());
                e.pid = d["pid"].as_u64().or(e.pid);
                e.identity_digest = s(&d["identityDigest"]);
                e.executable_sha256 = s(&d["executableSha256"]);
                e.label = s(&d["label"]);
            }
            rt::SERVER_REPLACED => {
                let new = s(&d["newEpoch"]);
                if let Some(old) = s(&d["oldEpoch"]) {
                    let e = self.epoch(&old, &r.time);
                    e.replaced_by = new.clone();
                    e.ended = Some(r.time.clone());
                }
                if let Some(new) = new {
                    let pid = d["pid"].as_u64();
                    let e = self.epoch(&new, &r.time);
                    e.pid = e.pid.or(pid);
                }
            }
            rt::SERVER_EXITED => {
                let Some(id) = s(&d["epoch"]).or_else(|| r.epoch.clone()) else {
                    return;
                };
                let e = self.epoch(&id, &r.time);
                e.ended.get_or_insert_with(|| r.time.clone());
                e.exit_status = records::ServerExited::from_data(d).map(|x| x.status);
            }
            rt::APPROVAL_GRANTED => {
                let g = &d["grant"];
                self.grants.push(GrantEntry {
                    id: s(&g["id"]).unwrap_or_else(|| "?".into()),
                    agent_run: s(&g["agentRun"]),
                    server_label: s(&g["serverLabel"]),
                    epoch: s(&g["executionEpoch"]),
                    tools: strings(&g["toolScope"]),
                    credential_scopes: strings(&g["credentialScope"]),
                    issued_at: s(&g["issuedAt"]),
                    expires_when: s(&g["expiresWhen"]),
                    channel: s(&d["channel"]).or_else(|| s(&g["channel"])),
                    kind: s(&d["kind"]).or_else(|| s(&g["kind"])),
                    granted: r.time.clone(),
                    revoked: None,
                });
            }
            rt::APPROVAL_REVOKED => {
                let id = s(&d["grantId"]);
                if let Some(g) = self
                    .grants
                    .iter_mut()
                    .rev()
                    .find(|g| Some(&g.id) == id.as_ref())
                {
                    g.revoked = Some(r.time.clone());
                }
            }
            rt::TOOL_CALLED => {
                let rec = records::read::<records::ToolCalled>(d);
                // A new tool_called always starts a new entry: JSON-RPC ids may be reused.
                let key = (r.run.clone(), id_text(&rec.call_id));
                let i = self.new_call(r, key);
                let c = &mut self.calls[i];
                c.grant = rec.grant;
                c.credential_scopes = rec.credential_scopes;
                c.shown_revision = rec.shown_revision;
            }
            rt::CATALOG_PRESENTED => {
                if let Ok(record) = serde_json::from_value(d.clone()) {
                    self.presented.push(PresentedEntry {
                        time: r.time.clone(),
                        run: r.run.clone(),
                        epoch: r.epoch.clone(),
                        record,
                    });
                }
            }
            rt::TOOL_RESULT => {
                let rec = records::read::<records::ToolResult>(d);
                let duration_ms = rec.duration_ms;
                let i = self.result_entry(r, &rec.tool);
                self.calls[i].outcome = if rec.is_error {
                    CallOutcome::Error { duration_ms }
                } else {
                    CallOutcome::Ok { duration_ms }
                };
            }
            rt::AUTHORIZATION_DENIED => {
                let rec = records::read::<records::AuthorizationDenied>(d);
                let current = rec.current_epoch.clone();
                let outcome = CallOutcome::Denied {
                    reason: rec.reason,
                    approved_epoch: rec.approved_epoch,
                    current_epoch: rec.current_epoch,
                    channel: rec.channel,
                    channel_outcome: rec.outcome,
                };
                // A refused call was never forwarded (no `tool_called`): it closes the newest
                // call with its id only if that one is still open and of the same tool; else
                // it is a call of its own (the host reused the id of a call that ran).
                let key = (r.run.clone(), id_text(&r.data["callId"]));
                let i = match self.call_index.get(&key) {
                    Some(&i)
                        if self.calls[i].outcome == CallOutcome::Pending
                            && (rec.tool.is_empty() || self.calls[i].tool == rec.tool) =>
                    {
                        i
                    }
                    _ => self.new_call(r, key),
                };
                let c = &mut self.calls[i];
                if current.is_some() {
                    c.epoch = current;
                }
                c.outcome = outcome;
            }
            rt::CALL_FAILED_EPOCH_TRANSITION => {
                let rec = records::read::<records::CallFailedEpochTransition>(d);
                let outcome = CallOutcome::FailedEpochTransition {
                    old_epoch: rec.old_epoch,
                    new_epoch: rec.new_epoch,
                };
                self.call(r).outcome = outcome;
            }
            rt::CALL_CANCELLED => {
                // Only a call still without an answer: a result recorded before the cancel
                // arrived stands (and a late result after it replaces this).
                let c = self.call(r);
                if c.outcome == CallOutcome::Pending {
                    c.outcome = CallOutcome::Cancelled;
                }
            }
            // build_completed, catalog_refreshed and unknown types do not enter the journals.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::chain::{FORMAT_VERSION, GENESIS_PREV};
    use serde_json::json;

    fn rec(seq: u64, ty: &str, run: &str, epoch: Option<&str>, data: Value) -> Record {
        Record {
            v: FORMAT_VERSION,
            seq,
            time: format!("2025-06-01T12:00:{seq:02}.000Z"),
            record_type: ty.into(),
            run: run.into(),
            epoch: epoch.map(Into::into),
            prev: GENESIS_PREV.into(),
            data,
            hash: String::new(),
            mac: String::new(),
        }
    }

    /// The article's scenario: approve A, call under A, rebuild to B, stale call denied,
    /// approve B, call under B; plus an ungated read and an in-flight call failed by a restart.
    pub(crate) fn scenario() -> Vec<Value> {
        vec![
            json!(["run_started", "R1", null, {"agentRun": "R1", "client": {"name": "claude-code", "version": "1.2"}, "gating": "on", "label": "inv"}]),
            json!(["server_started", "R1", "EA", {"epoch": "EA", "pid": 100, "identityDigest": "aaaaaaaaaaaaaaaaaaaa", "executableSha256": "ee", "argv": ["srv"], "label": "inv"}]),
            json!(["approval_granted", "R1", "EA", {"grant": {"id": "G1", "agentRun": "R1", "serverLabel": "inv", "executionEpoch": "EA", "toolScope": ["write"], "credentialScope": ["inv-staging"], "issuedAt": "t", "expiresWhen": "run-end"}}]),
            json!(["tool_called", "R1", "EA", {"callId": 1, "tool": "write", "grant": "G1", "credentialScopes": ["inv-staging"], "argumentsDigest": "d1"}]),
            json!(["tool_result", "R1", "EA", {"callId": 1, "tool": "write", "isError": false, "durationMs": 12}]),
            json!(["tool_called", "R1", "EA", {"callId": "r", "tool": "read", "grant": null, "credentialScopes": [], "argumentsDigest": "d2"}]),
            json!(["server_replaced", "R1", "EB", {"oldEpoch": "EA", "newEpoch": "EB", "pid": 200}]),
            json!(["call_failed_epoch_transition", "R1", "EB", {"callId": "r", "tool": "read", "oldEpoch": "EA", "newEpoch": "EB"}]),
            json!(["server_started", "R1", "EB", {"epoch": "EB", "pid": 200, "identityDigest": "bbbbbbbbbbbbbbbbbbbb", "executableSha256": "ff", "argv": ["srv"], "label": "inv"}]),
            json!(["authorization_denied", "R1", "EB", {"callId": 2, "tool": "write", "reason": "authorization_stale", "approvedEpoch": "EA", "currentEpoch": "EB", "channel": "host", "outcome": "declined"}]),
            json!(["approval_revoked", "R1", "EB", {"grantId": "G1"}]),
            json!(["approval_granted", "R1", "EB", {"grant": {"id": "G2", "agentRun": "R1", "serverLabel": "inv", "executionEpoch": "EB", "toolScope": ["write"], "credentialScope": ["inv-staging"], "issuedAt": "t2", "expiresWhen": "run-end"}, "channel": "terminal", "kind": "epoch"}]),
            json!(["tool_called", "R1", "EB", {"callId": 3, "tool": "write", "grant": "G2", "credentialScopes": ["inv-staging"], "argumentsDigest": "d3"}]),
            json!(["tool_result", "R1", "EB", {"callId": 3, "tool": "write", "isError": true, "durationMs": 5}]),
            json!(["server_exited", "R1", "EB", {"epoch": "EB", "status": "exit 0"}]),
            json!(["run_ended", "R1", null, {"reason": "host disconnected"}]),
        ]
    }

    fn journals() -> Journals {
        let records: Vec<Record> = scenario()
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                rec(
                    i as u64 + 1,
                    v[0].as_str().unwrap(),
                    v[1].as_str().unwrap(),
                    v[2].as_str(),
                    v[3].clone(),
                )
            })
            .collect();
        Journals::from_records(&records)
    }

    #[test]
    fn session_journal_tracks_runs_epochs_grants() {
        let j = journals();
        assert_eq!(j.session.runs.len(), 1);
        let run = &j.session.runs[0];
        assert_eq!(
            run.client,
            Some(ClientInfo {
                name: "claude-code".into(),
                version: "1.2".into()
            })
        );
        assert_eq!(run.end_reason.as_deref(), Some("host disconnected"));
        assert_eq!(run.gating.as_deref(), Some("on"));
        let epochs: Vec<_> = j
            .session
            .epochs
            .iter()
            .map(|e| (e.epoch.as_str(), e.pid, e.replaced_by.as_deref()))
            .collect();
        assert_eq!(
            epochs,
            vec![("EA", Some(100), Some("EB")), ("EB", Some(200), None)]
        );
        assert_eq!(j.session.epochs[1].exit_status.as_deref(), Some("exit 0"));
        assert_eq!(
            j.session.epochs[1].identity_digest.as_deref(),
            Some("bbbbbbbbbbbbbbbbbbbb")
        );
        let grants: Vec<_> = j
            .session
            .grants
            .iter()
            .map(|g| (g.id.as_str(), g.epoch.as_deref(), g.revoked.is_some()))
            .collect();
        assert_eq!(
            grants,
            vec![("G1", Some("EA"), true), ("G2", Some("EB"), false)]
        );
        assert_eq!(j.session.grants[0].tools, vec!["write"]);
    }

    #[test]
    fn activity_journal_names_the_epoch_and_outcome_of_each_call() {
        let j = journals();
        let calls: Vec<_> = j
            .activity
            .iter()
            .map(|c| {
                (
                    c.call_id.as_str(),
                    c.tool.as_str(),
                    c.epoch.as_deref(),
                    c.grant.as_deref(),
                    c.outcome.clone(),
                )
            })
            .collect();
        assert_eq!(
            calls,
            vec![
                (
                    "1",
                    "write",
                    Some("EA"),
                    Some("G1"),
                    CallOutcome::Ok {
                        duration_ms: Some(12)
                    }
                ),
                (
                    "r",
                    "read",
                    Some("EA"),
                    None,
                    CallOutcome::FailedEpochTransition {
                        old_epoch: Some("EA".into()),
                        new_epoch: Some("EB".into())
                    }
                ),
                (
                    "2",
                    "write",
                    Some("EB"),
                    None,
                    CallOutcome::Denied {
                        reason: "authorization_stale".into(),
                        approved_epoch: Some("EA".into()),
                        current_epoch: Some("EB".into()),
                        channel: Some("host".into()),
                        channel_outcome: Some("declined".into()),
                    }
                ),
                (
                    "3",
                    "write",
                    Some("EB"),
                    Some("G2"),
                    CallOutcome::Error {
                        duration_ms: Some(5)
                    }
                ),
            ]
        );
    }

    /// A cancelled call without an answer shows as cancelled; one the server answered anyway
    /// (its late `tool_result`) shows that outcome; a cancel after the result changes nothing.
    #[test]
    fn a_cancelled_call_shows_as_cancelled_unless_it_was_answered() {
        let called = |seq, id: u64| {
            rec(
                seq,
                "tool_called",
                "R",
                Some("E"),
                json!({"callId": id, "tool": "w"}),
            )
        };
        let cancelled = |seq, id: u64| {
            rec(
                seq,
                "call_cancelled",
                "R",
                Some("E"),
                json!({"callId": id, "tool": "w"}),
            )
        };
        let result = |seq, id: u64| {
            rec(
                seq,
                "tool_result",
                "R",
                Some("E"),
                json!({"callId": id, "isError": false}),
            )
        };
        let records = vec![
            called(1, 1),
            cancelled(2, 1),
            called(3, 2),
            cancelled(4, 2),
            result(5, 2),
            called(6, 3),
            result(7, 3),
            cancelled(8, 3),
        ];
        let j = Journals::from_records(&records);
        let got: Vec<_> = j.activity.iter().map(|c| c.outcome.clone()).collect();
        let ok = CallOutcome::Ok { duration_ms: None };
        assert_eq!(got, vec![CallOutcome::Cancelled, ok.clone(), ok]);
        let mut text = String::new();
        j.render_activity(&mut text);
        assert!(text.contains("cancelled by the host"), "{text}");
    }

    #[test]
    fn reused_call_ids_start_new_entries() {
        let records = vec![
            rec(
                1,
                "tool_called",
                "R",
                Some("E"),
                json!({"callId": 1, "tool": "a"}),
            ),
            rec(
                2,
                "tool_result",
                "R",
                Some("E"),
                json!({"callId": 1, "isError": false}),
            ),
            rec(
                3,
                "tool_called",
                "R",
                Some("E"),
                json!({"callId": 1, "tool": "b"}),
            ),
            rec(
                4,
                "tool_called",
                "S",
                Some("E"),
                json!({"callId": 1, "tool": "c"}),
            ),
        ];
        let j = Journals::from_records(&records);
        let got: Vec<_> = j
            .activity
            .iter()
            .map(|c| (c.tool.as_str(), c.outcome.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", CallOutcome::Ok { duration_ms: None }),
                ("b", CallOutcome::Pending),
                ("c", CallOutcome::Pending)
            ]
        );
    }

    #[test]
    fn odd_data_does_not_panic() {
        let records = vec![
            rec(1, "approval_granted", "R", None, json!("not an object")),
            rec(2, "server_started", "R", None, json!({})),
            rec(3, "tool_result", "R", None, json!(null)),
            rec(4, "made_up_type", "R", None, json!({})),
        ];
        let j = Journals::from_records(&records);
        assert_eq!(j.session.grants[0].id, "?");
        assert!(j.session.epochs.is_empty());
        assert_eq!(j.activity[0].call_id, "-");
        assert!(j.render_human(JournalView::Both).contains("Activity"));
    }

    #[test]
    fn human_rendering_is_aligned() {
        let text = journals().render_human(JournalView::Activity);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Activity");
        let header = lines[1];
        let col = header.find("EPOCH").unwrap();
        for l in &lines[2..] {
            assert_eq!(&l[col..col + 1], "E", "misaligned: {l}");
        }
        assert!(text.contains("ungated"));
        assert!(text.contains("failed: epoch EA -> EB"));
        assert!(
            text.contains("denied: authorization_stale (approved EA, current EB) [host: declined]")
        );
        assert!(text.contains("ok (12 ms)"));
        let session = journals().render_human(JournalView::Session);
        assert!(session.contains("terminal, epoch"), "{session}");
        assert!(session.contains("claude-code 1.2"));
        assert!(session.contains("(replaced by EB)"));
        assert!(
            session.contains("aaaaaaaaaaaa "),
            "identity shortened to 12: {session}"
        );
        assert!(!session.contains("Activity"));
    }

    #[test]
    fn json_shape() {
        let v = journals().to_json();
        assert_eq!(v["session"]["runs"][0]["client"]["name"], "claude-code");
        assert_eq!(v["session"]["grants"][1]["epoch"], "EB");
        assert_eq!(v["activity"][2]["outcome"]["kind"], "denied");
        assert_eq!(v["activity"][2]["outcome"]["approvedEpoch"], "EA");
        assert_eq!(v["activity"][1]["outcome"]["kind"], "failedEpochTransition");
        assert_eq!(v["activity"][0]["callId"], "1");
        assert_eq!(v["activity"][0]["grant"], "G1");
    }
}
