//! Checkpoints to keep elsewhere (issue 36, point 5): a small signed head of a log (seq, hash,
//! epoch, time) that a user keeps where nothing on this machine can reach it (a CI artifact, a
//! ticket, another machine), and the proof that the log still extends it.
//!
//! Why: the chain, the MACs and the anchor catch an edit by someone without the key. Someone who
//! holds the key (or rolls back both the log and its anchor) can write a whole new history that
//! verifies. A checkpoint kept elsewhere pins the history up to its record: each record's hash
//! covers the one before it, so the log extends the checkpoint only if its record at that seq
//! has that hash. A rewrite of any record at or before it, a cut or a rollback to an earlier
//! state is then detected, whoever holds the key.
//!
//! The checkpoint is signed with the log's key (an HMAC over its canonical fields under a domain
//! tag no record or anchor MAC uses): it proves which log's key made it, and that nobody edited
//! it on the way. It is not what detects a rewrite: the hash is.
//!
//! Owns: the checkpoint's format, its MAC, making one from a verified log and checking a log
//! against one. Must not touch: stdout or the terminal (the face prints), the writer.

use super::chain::{AuditKey, Record, canonical_json, keyed_digest};
use super::error::VerifyFailure;
use super::keys::KeyStore;
use super::verify::{VerifyReport, Visitor, verify_visiting};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::path::Path;

/// The format number a checkpoint carries (`"checkpoint": 1`).
pub const CHECKPOINT_FORMAT: u64 = 1;

/// The most bytes of checkpoint text read (a checkpoint is about 300 bytes).
pub const MAX_CHECKPOINT_BYTES: u64 = 4096;

/// Domain tag of a checkpoint's MAC: no record MAC (over 32 raw bytes) or anchor MAC (over
/// `seq:hash`) starts with it.
const MAC_DOMAIN: &[u8] = b"cargo-mcp-dev checkpoint\n";

/// A log's head, signed: what a user keeps elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// [`CHECKPOINT_FORMAT`].
    pub checkpoint: u64,
    /// The log's path when the checkpoint was made (canonical).
    pub log: String,
    /// The head record's seq and hash.
    pub seq: u64,
    pub hash: String,
    /// The newest execution epoch named by a record at or before the head (`None`: no record
    /// named one).
    pub epoch: Option<String>,
    /// The head record's time.
    pub time: String,
    /// HMAC-SHA256 under the log's key of the fields above.
    pub mac: String,
}

/// Why a checkpoint could not be made or checked.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("the audit log does not verify ({0}); a checkpoint of it would pin damage")]
    LogInvalid(VerifyFailure),
    #[error("the audit log has no records yet; there is nothing to checkpoint")]
    Empty,
    #[error("cannot read the audit key: {0}")]
    Key(String),
    #[error("not a checkpoint: {0}")]
    Unreadable(String),
    #[error("the checkpoint has format {0}; this cargo-mcp-dev reads format {CHECKPOINT_FORMAT}")]
    Format(u64),
}

/// Why a log does not extend a checkpoint (the log may verify on its own).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointMismatch {
    #[error(
        "the checkpoint's signature does not match this log's key: it was made for another log's key, or edited"
    )]
    Signature,
    #[error("the audit log does not verify: {0}")]
    LogInvalid(VerifyFailure),
    #[error(
        "the log ends at record {head}, before the checkpoint's record {seq}: it was cut short or rolled back to an earlier state{restart}"
    )]
    Shorter {
        head: u64,
        seq: u64,
        restart: String,
    },
    #[error(
        "record {seq} is not the record the checkpoint names (hash {found}, checkpoint {expected}): the log was rewritten at or before it{restart}"
    )]
    Rewritten {
        seq: u64,
        found: String,
        expected: String,
        restart: String,
    },
}

/// A log that extends a checkpoint.
#[derive(Debug, Clone)]
pub struct Extends {
    pub report: VerifyReport,
    /// Records written after the checkpoint's.
    pub since: u64,
}

impl Checkpoint {
    /// The bytes the MAC covers: the domain tag, then the canonical JSON of every field but
    /// the MAC.
    fn signed_bytes(&self) -> Vec<u8> {
        let mut out = MAC_DOMAIN.to_vec();
        let fields = json!({"checkpoint": self.checkpoint, "log": self.log, "seq": self.seq,
            "hash": self.hash, "epoch": self.epoch, "time": self.time});
        canonical_json(&fields, &mut out).expect("plain JSON encodes");
        out
    }

    fn sign(&mut self, key: &AuditKey) {
        self.mac = keyed_digest(key, &self.signed_bytes());
    }

    fn signed_by(&self, key: &AuditKey) -> bool {
        let expected = keyed_digest(key, &self.signed_bytes());
        crate::base::hashing::same_secret_text(expected.as_bytes(), self.mac.as_bytes())
    }

    /// Parses a checkpoint's text (one JSON object; surrounding whitespace allowed).
    pub fn parse(text: &str) -> Result<Checkpoint, CheckpointError> {
        let value: serde_json::Value = serde_json::from_str(text.trim())
            .map_err(|e| CheckpointError::Unreadable(e.to_string()))?;
        if let Some(format) = value.get("checkpoint").and_then(|v| v.as_u64())
            && format != CHECKPOINT_FORMAT
        {
            return Err(CheckpointError::Format(format));
        }
        serde_json::from_value(value).map_err(|e| CheckpointError::Unreadable(e.to_string()))
    }

    /// The checkpoint as one line of JSON.
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).expect("plain JSON encodes")
    }
}

/// What a verification saw of the records that matter to a checkpoint.
#[derive(Default)]
struct Seen {
    /// Seq to look for (checking), and the hash found there.
    wanted: Option<u64>,
    found: Option<String>,
    /// The newest record and the newest epoch named (making).
    newest: Option<(u64, String, String)>,
    epoch: Option<String>,
}

impl Visitor for Seen {
    fn record(&mut self, r: &Record) {
        if self.wanted == Some(r.seq) {
            self.found = Some(r.hash.clone());
        }
        if self.wanted.is_none() {
            if let Some(e) = &r.epoch {
                self.epoch = Some(e.clone());
            }
            self.newest = Some((r.seq, r.hash.clone(), r.time.clone()));
        }
    }

    fn start_over(&mut self) {
        *self = Seen {
            wanted: self.wanted,
            ..Seen::default()
        };
    }
}

fn load_key(keys: &KeyStore) -> Result<AuditKey, CheckpointError> {
    keys.load_key()
        .map_err(|e| CheckpointError::Key(e.to_string()))
}

/// Verifies the log at `path` and signs its head: the checkpoint to keep elsewhere.
pub fn make(path: &Path, keys: &KeyStore) -> Result<Checkpoint, CheckpointError> {
    let key = load_key(keys)?;
    let mut seen = Seen::default();
    let report = verify_visiting(path, keys, &mut seen).map_err(CheckpointError::LogInvalid)?;
    // The head the verification reports is the chain's; the visitor saw every record of it.
    let Some((seq, hash, time)) = seen.newest.filter(|(s, _, _)| *s == report.head_seq) else {
        return Err(CheckpointError::Empty);
    };
    let log = crate::base::beneath::followed::canonicalize(path)
        .unwrap_or_else(|_| path.to_owned())
        .display()
        .to_string();
    let mut checkpoint = Checkpoint {
        checkpoint: CHECKPOINT_FORMAT,
        log,
        seq,
        hash,
        epoch: seen.epoch,
        time,
        mac: String::new(),
    };
    checkpoint.sign(&key);
    Ok(checkpoint)
}

/// Whether the log at `path` verifies and extends `checkpoint`. `Err` for what prevents the
/// check (no key); `Ok(Err(_))` for a log that does not extend it.
pub fn check(
    checkpoint: &Checkpoint,
    path: &Path,
    keys: &KeyStore,
) -> Result<Result<Extends, CheckpointMismatch>, CheckpointError> {
    let key = load_key(keys)?;
    if !checkpoint.signed_by(&key) {
        return Ok(Err(CheckpointMismatch::Signature));
    }
    let mut seen = Seen {
        wanted: Some(checkpoint.seq),
        ..Seen::default()
    };
    let report = match verify_visiting(path, keys, &mut seen) {
        Ok(r) => r,
        Err(f) => return Ok(Err(CheckpointMismatch::LogInvalid(f))),
    };
    // A chain restarted since (the old one set aside by `run`, see `recover`) numbers its
    // records from 1 again: the checkpoint may name the earlier chain.
    let restart = match &report.previous {
        Some(b) => format!(
            " (the chain was restarted at record 1: {}; the checkpoint may name the chain set aside then{})",
            b.reason,
            b.previous_log
                .as_ref()
                .map(|p| format!(", {}", p.display()))
                .unwrap_or_default()
        ),
        None => String::new(),
    };
    match seen.found {
        None => Ok(Err(CheckpointMismatch::Shorter {
            head: report.head_seq,
            seq: checkpoint.seq,
            restart,
        })),
        Some(found) if found != checkpoint.hash => Ok(Err(CheckpointMismatch::Rewritten {
            seq: checkpoint.seq,
            found,
            expected: checkpoint.hash.clone(),
            restart,
        })),
        Some(_) => Ok(Ok(Extends {
            since: report.head_seq - checkpoint.seq,
            report,
        })),
    }
}
