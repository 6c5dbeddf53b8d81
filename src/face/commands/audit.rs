//! `cargo mcp-dev audit verify|checkpoint|show|tail`.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use crate::audit::checkpoint::{self, Checkpoint, MAX_CHECKPOINT_BYTES};
use crate::audit::follow::{Followed, Follower};
use crate::audit::{JournalView, Journals, KeyStore, Record, verify};
use crate::base::error::{CmdResult, Failure};
use crate::face::cli::{AuditCommand, AuditPathArgs, AuditTailArgs, Journal};
use crate::identity::build::CargoSelection;
use crate::identity::cycle::Prepared;
use crate::{base::exit_codes, screen::output, screen::stderr};

pub fn execute(cmd: AuditCommand) -> CmdResult {
    match cmd {
        AuditCommand::Verify(a) => match &a.checkpoint {
            Some(file) => run_verify_checkpoint(&a.log, file),
            None => run_verify(&a.log),
        },
        AuditCommand::Checkpoint(a) => run_checkpoint(&a),
        AuditCommand::Tail(a) => run_tail(&a),
        AuditCommand::Show(a) => {
            let path = log_path(&a.log)?;
            let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
            let journals = Journals::from_log(&path, &keys)
                .map_err(|e| Failure::new(exit_codes::AUDIT_INVALID, e.to_string()))?;
            if a.log.json {
                output::stdout_line(&crate::screen::sanitize::json_text(
                    &journals.to_json().to_string(),
                ))?;
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
                // Paths and break reasons may hold any text: escaped, the same JSON.
                output::stdout_line(&crate::screen::sanitize::json_text(
                    &serde_json::json!({"ok": true, "path": path, "records": r.records, "runs": r.runs,
                        "epochs": r.epochs, "headSeq": r.head_seq, "headHash": r.head_hash,
                        "segments": segments_json(&r), "breaks": breaks_json(&r),
                        "tornTail": r.torn_tail.as_ref().map(|t| serde_json::json!(
                            {"line": t.line, "offset": t.offset, "bytes": t.bytes}))})
                    .to_string(),
                ),
                )?;
            }
            let files = if r.segments.len() > 1 {
                format!(" in {} files", r.segments.len())
            } else {
                String::new()
            };
            stderr::line(&format!(
                "audit log verified: {} ({} records{files}, {} runs, {} epochs, head {} {})",
                path.display(),
                r.records,
                r.runs,
                r.epochs,
                r.head_seq,
                crate::screen::sanitize::first_chars(&r.head_hash, 16)
            ));
            if r.segments.len() > 1 {
                for s in &r.segments {
                    stderr::detail(&format!(
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
                stderr::warn(&format!(
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
                stderr::line(&format!(
                    "chain break at record 1 ({}): an earlier chain was set aside: {}",
                    b.time, b.reason
                ));
                stderr::detail(&format!(
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
                        .map(|(s, h)| format!(
                            "seq {s} {}",
                            crate::screen::sanitize::first_chars(h, 16)
                        ))
                        .unwrap_or_else(|| "none".into()),
                ));
                match &b.previous {
                    Ok(p) => stderr::detail(&format!(
                        "earlier chain verified: {} records, head {} {}",
                        p.records,
                        p.head_seq,
                        crate::screen::sanitize::first_chars(&p.head_hash, 16)
                    )),
                    Err(f) => stderr::detail(&format!("earlier chain failed verification: {f}")),
                }
                next = b.previous.as_ref().ok().and_then(|p| p.previous.as_deref());
            }
            Ok(exit_codes::AUDIT_BREAK)
        }
        Err(f) => {
            if a.json {
                output::stdout_line(&crate::screen::sanitize::json_text(
                    &serde_json::json!({"ok": false, "path": path, "line": f.line, "seq": f.seq, "reason": f.reason}).to_string(),
                ))?;
            }
            Err(Failure::new(
                exit_codes::AUDIT_INVALID,
                format!("audit log {} failed verification: {f}", path.display()),
            ))
        }
    }
}

fn run_checkpoint(a: &AuditPathArgs) -> CmdResult {
    let path = log_path(a)?;
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    let cp = checkpoint::make(&path, &keys).map_err(|e| {
        let code = match e {
            checkpoint::CheckpointError::LogInvalid(_) => exit_codes::AUDIT_INVALID,
            _ => exit_codes::ERROR,
        };
        Failure::new(code, format!("audit log {}: {e}", path.display()))
    })?;
    // The log's path may hold any text: escaped, the same JSON.
    output::stdout_line(&crate::screen::sanitize::json_text(&cp.to_line()))?;
    stderr::line(&format!(
        "checkpoint of {} at record {} ({}, hash {}): keep it where nothing on this machine can change it; `cargo mcp-dev audit verify --checkpoint FILE` proves the log still extends it",
        path.display(),
        cp.seq,
        crate::screen::sanitize::first_chars(&cp.time, 40),
        crate::screen::sanitize::first_chars(&cp.hash, 16),
    ));
    Ok(exit_codes::OK)
}

/// Reads a checkpoint from `file` (`-`: standard input), bounded.
fn read_checkpoint(file: &std::path::Path) -> Result<Checkpoint, Failure> {
    let text = if file == std::path::Path::new("-") {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::io::stdin()
            .take(MAX_CHECKPOINT_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Failure::error(format!("cannot read the checkpoint from stdin: {e}")))?;
        if bytes.len() as u64 > MAX_CHECKPOINT_BYTES {
            return Err(Failure::error(format!(
                "the checkpoint on stdin is longer than {MAX_CHECKPOINT_BYTES} bytes: not a checkpoint"
            )));
        }
        String::from_utf8(bytes)
            .map_err(|_| Failure::error("the checkpoint on stdin is not UTF-8 text"))?
    } else {
        // The user named this file: reading it where it points is the point.
        crate::base::beneath::followed::read_to_string(file, MAX_CHECKPOINT_BYTES).map_err(|e| {
            Failure::error(format!(
                "cannot read the checkpoint {}: {e}",
                file.display()
            ))
        })?
    };
    Checkpoint::parse(&text).map_err(|e| Failure::error(format!("{}: {e}", file.display())))
}

fn run_verify_checkpoint(a: &AuditPathArgs, file: &std::path::Path) -> CmdResult {
    let cp = read_checkpoint(file)?;
    let path = log_path(a)?;
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    let outcome = checkpoint::check(&cp, &path, &keys)
        .map_err(|e| Failure::error(format!("audit log {}: {e}", path.display())))?;
    let here = crate::base::beneath::followed::canonicalize(&path)
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    if here != cp.log {
        stderr::warn(&format!(
            "the checkpoint was made of {}; checking {}",
            crate::screen::sanitize::first_chars(&cp.log, 200),
            path.display()
        ));
    }
    let json = |ok: bool, extra: serde_json::Value| {
        let mut v = serde_json::json!({"ok": ok, "path": path, "checkpoint": {"seq": cp.seq,
            "hash": cp.hash, "time": cp.time}});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        crate::screen::sanitize::json_text(&v.to_string()).into_owned()
    };
    match outcome {
        Ok(extends) => {
            if a.json {
                output::stdout_line(&json(
                    true,
                    serde_json::json!({"headSeq": extends.report.head_seq, "since": extends.since}),
                ))?;
            }
            stderr::line(&format!(
                "audit log verified: {} extends the checkpoint of record {} ({}); {} records since, head {} {}",
                path.display(),
                cp.seq,
                crate::screen::sanitize::first_chars(&cp.time, 40),
                extends.since,
                extends.report.head_seq,
                crate::screen::sanitize::first_chars(&extends.report.head_hash, 16)
            ));
            Ok(exit_codes::OK)
        }
        Err(mismatch) => {
            let reason = mismatch.to_string();
            if a.json {
                output::stdout_line(&json(false, serde_json::json!({"reason": reason})))?;
            }
            Err(Failure::new(
                exit_codes::AUDIT_INVALID,
                format!(
                    "audit log {} does not extend the checkpoint of record {} ({}): {}",
                    path.display(),
                    cp.seq,
                    crate::screen::sanitize::first_chars(&cp.time, 40),
                    crate::screen::sanitize::line(&reason)
                ),
            ))
        }
    }
}

/// How often `tail --follow` looks for new records.
const FOLLOW_POLL: Duration = Duration::from_millis(100);

/// Characters of a record's data shown on its `tail` line.
const DATA_SHOWN: usize = 200;

fn run_tail(a: &AuditTailArgs) -> CmdResult {
    let path = log_path(&a.log)?;
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    let verify_all = || {
        verify(&path, &keys).map(|_| ()).map_err(|f| {
            Failure::new(
                exit_codes::AUDIT_INVALID,
                format!("audit log {} failed verification: {f}", path.display()),
            )
        })
    };
    let waiting = a.follow && !holds_a_record(&path);
    if waiting {
        // `run` has not written yet (the log, even the key, may not exist): the follower
        // checks every record from the first.
        stderr::line(&format!(
            "waiting for the first record of {}",
            path.display()
        ));
    } else if crate::base::fsutil::exists(&path) {
        // The whole log first (segments, anchor), as `audit verify` checks it: what is shown
        // was verified, and the follower checks each record after against the one before.
        verify_all()?;
    } else {
        return Err(Failure::error(format!(
            "no audit log at {} (`cargo mcp-dev run` writes it; `--follow` waits for it)",
            path.display()
        )));
    }
    let key = loop {
        match keys.load_key() {
            Ok(key) => break key,
            Err(crate::audit::AuditError::KeyMissing { .. }) if waiting => {
                std::thread::sleep(FOLLOW_POLL);
            }
            Err(e) => return Err(Failure::error(e.to_string())),
        }
    };
    let mut follower = if waiting {
        Follower::from_oldest(&path, &key)
    } else {
        Follower::from_newest_segment(&path, &key)
    };
    let failed = |e: crate::audit::follow::FollowError| {
        Failure::new(exit_codes::AUDIT_INVALID, e.to_string())
    };
    // The last records of the newest segment and the active file (older ones are `audit
    // show`'s). A log waited for held none when the command started: every record is new, none
    // is skipped.
    let mut last = VecDeque::with_capacity(a.lines.min(4096));
    if !waiting {
        follower
            .poll(|item| {
                if a.lines == 0 {
                    return;
                }
                if last.len() == a.lines {
                    last.pop_front();
                }
                last.push_back(item);
            })
            .map_err(failed)?;
    }
    let json = a.log.json;
    // A closed pipe (`| head`) ends the command quietly, as it ends `tail`.
    let closed = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::BrokenPipe => Ok(exit_codes::OK),
        _ => Err(Failure::from(e)),
    };
    for item in last {
        if let Err(e) = print_followed(item, json) {
            return closed(e);
        }
    }
    if !a.follow {
        return Ok(exit_codes::OK);
    }
    loop {
        std::thread::sleep(FOLLOW_POLL);
        let mut printed = Ok(());
        follower
            .poll(|item| {
                if printed.is_ok() {
                    printed = print_followed(item, json);
                }
            })
            .map_err(failed)?;
        if let Err(e) = printed {
            return closed(e);
        }
    }
}

/// Whether the log's first line is complete: `run` has written a record (a file `run` just
/// created may be empty or hold only reserved NUL bytes, which `audit verify` refuses).
fn holds_a_record(path: &std::path::Path) -> bool {
    use std::io::Read;
    let Ok(file) = crate::base::fsutil::open_regular_nofollow(path) else {
        return false;
    };
    let mut head = Vec::new();
    // A first record is far shorter; a longer first line is left to `verify` to judge.
    if file.take(1 << 20).read_to_end(&mut head).is_err() {
        return false;
    }
    let data = head.split(|&b| b == 0).next().unwrap_or_default();
    data.contains(&b'\n') || (head.len() == 1 << 20 && !head.contains(&0))
}

/// One record on stdout: its line as stored (`--json`, with control, invisible and bidi
/// characters written as JSON escapes: the same JSON, safe on a terminal and after `grep`), or
/// one summary line, escaped as the `approve` screen escapes text.
fn print_followed(item: Followed, json: bool) -> std::io::Result<()> {
    match item {
        Followed::NewChain { path, unseen } => {
            stderr::warn(&format!(
                "{} starts a new chain: the log followed so far was set aside (`audit verify` names why)",
                path.display()
            ));
            if let Some((first, last)) = unseen {
                stderr::detail(&format!(
                    "records {first} to {last} of the set-aside chain were written before they could be shown; `audit show` on the set-aside log (named in the next record) lists them"
                ));
            }
            Ok(())
        }
        Followed::Record { record, line } => {
            if json {
                output::stdout_line(&crate::screen::sanitize::json_text(
                    &String::from_utf8_lossy(&line),
                ))
            } else {
                output::stdout_line(&crate::screen::sanitize::review(&tail_line(&record)))
            }
        }
    }
}

/// `TIME  #SEQ  TYPE  EPOCH  DATA` (data as compact JSON, cut at [`DATA_SHOWN`] characters).
fn tail_line(r: &Record) -> String {
    let data = r.data.to_string();
    let mut shown: String = data.chars().take(DATA_SHOWN).collect();
    if shown.len() < data.len() {
        shown.push('…');
    }
    format!(
        "{}  #{}  {}  {}  {shown}",
        r.time,
        r.seq,
        r.record_type,
        r.epoch.as_deref().unwrap_or("-")
    )
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
    let prep = Prepared::new(&CargoSelection {
        manifest_path: c.manifest_path.clone(),
        package: c.package.clone(),
        target_dir: c.target_dir.clone(),
        ..CargoSelection::default()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_record_is_one_line_whatever_its_fields_hold() {
        let record = Record {
            v: 1,
            seq: 7,
            time: "2026-12-05T16:20:11.000Z".into(),
            record_type: "tool_called".into(),
            run: "R".into(),
            epoch: Some("E1\n2026-01-01T00:00:00.000Z  #1  approval_granted".into()),
            prev: String::new(),
            data: serde_json::json!({"tool": "x".repeat(500)}),
            hash: String::new(),
            mac: String::new(),
        };
        let shown = crate::screen::sanitize::review(&tail_line(&record)).into_owned();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.starts_with("2026-12-05T16:20:11.000Z  #7  tool_called  E1\\n"));
        assert!(shown.ends_with('…'), "long data is cut: {shown}");
        assert!(shown.chars().count() < 400);
    }
}
