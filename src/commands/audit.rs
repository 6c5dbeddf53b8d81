//! `cargo mcp-dev audit verify|show`.

use std::path::PathBuf;

use crate::audit::{JournalView, Journals, KeyStore, verify};
use crate::cli::{AuditCommand, AuditPathArgs, CargoArgs, Journal};
use crate::cycle::Prepared;
use crate::error::{CmdResult, Failure};
use crate::{exit_codes, output, status};

pub fn execute(cmd: AuditCommand) -> CmdResult {
    match cmd {
        AuditCommand::Verify(a) => run_verify(&a),
        AuditCommand::Show(a) => {
            let path = log_path(&a.log)?;
            let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
            let journals = Journals::from_log(&path, &keys)
                .map_err(|e| Failure::new(exit_codes::AUDIT_INVALID, e.to_string()))?;
            if a.log.json {
                output::stdout_line(&journals.to_json().to_string())?;
            } else {
                let view = match a.journal {
                    Journal::Session => JournalView::Session,
                    Journal::Activity => JournalView::Activity,
                    Journal::Both => JournalView::Both,
                };
                output::stdout_text(&journals.render_human(view))?;
            }
            Ok(exit_codes::OK)
        }
    }
}

fn run_verify(a: &AuditPathArgs) -> CmdResult {
    let path = log_path(a)?;
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    match verify(&path, &keys) {
        Ok(r) => {
            if a.json {
                output::stdout_line(
                    &serde_json::json!({"ok": true, "path": path, "records": r.records, "runs": r.runs,
                        "epochs": r.epochs, "headSeq": r.head_seq, "headHash": r.head_hash,
                        "segments": segments_json(&r), "breaks": breaks_json(&r),
                        "tornTail": r.torn_tail.as_ref().map(|t| serde_json::json!(
                            {"line": t.line, "offset": t.offset, "bytes": t.bytes}))})
                    .to_string(),
                )?;
            }
            let files = if r.segments.len() > 1 {
                format!(" in {} files", r.segments.len())
            } else {
                String::new()
            };
            status::line(&format!(
                "audit log verified: {} ({} records{files}, {} runs, {} epochs, head {} {})",
                path.display(),
                r.records,
                r.runs,
                r.epochs,
                r.head_seq,
                &r.head_hash[..r.head_hash.len().min(16)]
            ));
            if r.segments.len() > 1 {
                for s in &r.segments {
                    status::detail(&format!(
                        "{}: {} records{}",
                        s.path.display(),
                        s.records,
                        s.seqs
                            .map(|(a, b)| format!(", seq {a}..{b}"))
                            .unwrap_or_default()
                    ));
                }
            }
            if let Some(t) = &r.torn_tail {
                status::warn(&format!(
                    "the last {} bytes of {} (line {}, after record {}) are an incomplete line: an interrupted write (a crash or a power loss), never a record; the next `run` moves them aside and continues the chain",
                    t.bytes,
                    path.display(),
                    t.line,
                    r.head_seq
                ));
            }
            if r.previous.is_none() {
                return Ok(exit_codes::OK);
            }
            let mut next = r.previous.as_deref();
            while let Some(b) = next {
                status::line(&format!(
                    "chain break at record 1 ({}): an earlier chain was set aside: {}",
                    b.time, b.reason
                ));
                status::detail(&format!(
                    "earlier log: {}; its anchor: {}; anchored head: {}",
                    b.previous_log
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "gone".into()),
                    b.previous_anchor
                        .as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_else(|| "none".into()),
                    b.previous_head
                        .as_ref()
                        .map(|(s, h)| format!("seq {s} {}", &h[..h.len().min(16)]))
                        .unwrap_or_else(|| "none".into()),
                ));
                match &b.previous {
                    Ok(p) => status::detail(&format!(
                        "earlier chain verified: {} records, head {} {}",
                        p.records,
                        p.head_seq,
                        &p.head_hash[..p.head_hash.len().min(16)]
                    )),
                    Err(f) => status::detail(&format!("earlier chain failed verification: {f}")),
                }
                next = b.previous.as_ref().ok().and_then(|p| p.previous.as_deref());
            }
            Ok(exit_codes::AUDIT_BREAK)
        }
        Err(f) => {
            if a.json {
                output::stdout_line(
                    &serde_json::json!({"ok": false, "path": path, "line": f.line, "seq": f.seq, "reason": f.reason}).to_string(),
                )?;
            }
            Err(Failure::new(
                exit_codes::AUDIT_INVALID,
                format!("audit log {} failed verification: {f}", path.display()),
            ))
        }
    }
}

/// Every file of the log, oldest first, as JSON.
fn segments_json(r: &crate::audit::VerifyReport) -> serde_json::Value {
    r.segments
        .iter()
        .map(|s| {
            serde_json::json!({"path": s.path, "records": s.records,
                "firstSeq": s.seqs.map(|x| x.0), "lastSeq": s.seqs.map(|x| x.1)})
        })
        .collect()
}

/// Every break, newest first, as JSON.
fn breaks_json(r: &crate::audit::VerifyReport) -> serde_json::Value {
    let mut out = Vec::new();
    let mut next = r.previous.as_deref();
    while let Some(b) = next {
        out.push(serde_json::json!({
            "time": b.time, "reason": b.reason, "previousLog": b.previous_log,
            "previousAnchor": b.previous_anchor,
            "previousHead": b.previous_head.as_ref().map(|(s, h)| serde_json::json!({"seq": s, "hash": h})),
            "previousChain": match &b.previous {
                Ok(p) => serde_json::json!({"ok": true, "records": p.records, "headSeq": p.head_seq, "headHash": p.head_hash}),
                Err(f) => serde_json::json!({"ok": false, "line": f.line, "seq": f.seq, "reason": f.reason}),
            },
        }));
        next = b.previous.as_ref().ok().and_then(|p| p.previous.as_deref());
    }
    serde_json::Value::Array(out)
}

fn log_path(a: &AuditPathArgs) -> Result<PathBuf, Failure> {
    if let Some(p) = &a.path {
        return Ok(p.clone());
    }
    let c = &a.control;
    let prep = Prepared::new(&CargoArgs {
        manifest_path: c.manifest_path.clone(),
        package: c.package.clone(),
        target_dir: c.target_dir.clone(),
        ..CargoArgs::default()
    })?;
    let t = &prep.target;
    let label = c.label.clone().unwrap_or_else(|| t.label.clone());
    Ok(t.config
        .config
        .audit_log
        .as_ref()
        .map(|p| t.resolved.package_root.join(p))
        .unwrap_or_else(|| t.layout().audit_log(&label)))
}
