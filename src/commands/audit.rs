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
                        "epochs": r.epochs, "headSeq": r.head_seq, "headHash": r.head_hash})
                    .to_string(),
                )?;
            }
            status::line(&format!(
                "audit log verified: {} ({} records, {} runs, {} epochs, head {} {})",
                path.display(),
                r.records,
                r.runs,
                r.epochs,
                r.head_seq,
                &r.head_hash[..r.head_hash.len().min(16)]
            ));
            Ok(exit_codes::OK)
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
