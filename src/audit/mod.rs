//! The audit log: chained, sealed records that prove which code (execution epoch) handled every
//! call and who authorized it; verification; the session and activity journals.
//!
//! Owns: the record format ([`chain`], pure), the per-user key and the head anchors ([`keys`]),
//! the append-only writer ([`log`]: one writer per log, group commit, fsync policy, rotation),
//! the streaming line checks and segment names ([`scan`]), the verifier ([`mod@verify`]), the
//! start-of-run recovery ([`recover`]) and the journals ([`journal`]).
//! Must not touch: policy (whether a call is allowed is decided elsewhere; this module records the
//! decision), stdout, and other modules of the crate.
//!
//! A log is a JSONL file. Every line is one record:
//! `{"v":1,"seq":N,"time":…,"type":…,"run":…,"epoch":…|null,"prev":…,"data":{…},"hash":…,"mac":…}`.
//! `seq` is global to the log (across its runs and its segments); `prev` links to the previous
//! record's `hash`; `hash` covers a canonical encoding of the record (see [`chain`]); `mac` seals
//! the hash with a key kept outside the log (see [`keys`]), and the newest head is anchored
//! outside the log so that a truncated tail is detected.
//!
//! One process writes a log at a time (it holds the log's writer lock for its whole life; a
//! second writer is refused with [`AuditError::WriterBusy`]); successive runs append to the same
//! chain. A log grows into segments (`<stem>.00001.jsonl`, …, then the active `<stem>.jsonl`),
//! chained by [`record_type::SEGMENT_STARTED`] records. See [`log`] for the writer's contract
//! (append / flush / commit) and what each [`FsyncPolicy`] survives.

pub mod chain;
pub mod follow;
pub mod journal;
pub mod keys;
pub mod log;
pub mod records;
pub mod recover;
pub mod scan;
#[cfg(test)]
mod tests_journal_ids;
#[cfg(test)]
mod tests_planted_files;
pub mod verify;

use std::path::PathBuf;

pub use chain::{
    AuditKey, ChainError, FORMAT_VERSION, GENESIS_PREV, Record, RecordData, anchor_mac,
    canonical_json, is_digest_hex, record_mac, verify_anchor_mac, verify_record_mac,
};
pub use journal::{
    CallEntry, CallOutcome, ClientInfo, EpochEntry, GrantEntry, JournalView, Journals, RunEntry,
    SessionJournal,
};
pub use keys::{Anchor, HOME_ENV, KeyStore};
pub use log::{
    ANCHOR_LAG, AnchorUpdate, AppendedRecord, AuditLog, AuditOptions, DEFAULT_MAX_SEGMENT_BYTES,
    FsyncPolicy, Moment, ParseFsyncPolicyError, WRITER_LOCK_WAIT,
};
pub use record_type::*;
pub use recover::{Recovery, open_for_run, open_for_run_with};
pub use verify::{
    ChainBreak, SegmentReport, TornTailReport, VerifyFailure, VerifyReport, read_records, verify,
};

/// Record type names (the `type` field) and the `data` fields the journals read. `data` is free
/// JSON chosen by the caller (integers only, see [`chain`]); fields not listed are kept and
/// ignored by the journals. Never put secret values in `data`: scope names and digests only.
pub mod record_type {
    /// The launch record of a server process.
    /// `{epoch, pid, identityDigest, executableSha256, argv:[..], label}`
    pub const SERVER_STARTED: &str = "server_started";
    /// A build finished (free data, e.g. `{profile, artifact, durationMs, changed}`).
    pub const BUILD_COMPLETED: &str = "build_completed";
    /// The tool catalog was fetched again. `{revision, digest, summary}`
    pub const CATALOG_REFRESHED: &str = "catalog_refreshed";
    /// A new epoch replaced the old one. `{oldEpoch, newEpoch, pid}`
    pub const SERVER_REPLACED: &str = "server_replaced";
    /// `{grant:{id, agentRun, serverLabel, executionEpoch, toolScope:[..], credentialScope:[..],
    /// issuedAt, expiresWhen}}`
    pub const APPROVAL_GRANTED: &str = "approval_granted";
    /// `{grantId}`
    pub const APPROVAL_REVOKED: &str = "approval_revoked";
    /// Written and flushed before the call is forwarded.
    /// `{callId, tool, grant:id|null (null = ungated), credentialScopes:[..], argumentsDigest}`
    pub const TOOL_CALLED: &str = "tool_called";
    /// `{callId, tool, isError, durationMs}`
    pub const TOOL_RESULT: &str = "tool_result";
    /// `{callId, tool, reason, approvedEpoch|null, currentEpoch|null}`
    pub const AUTHORIZATION_DENIED: &str = "authorization_denied";
    /// An in-flight call answered with an error because the worker changed.
    /// `{callId, tool, oldEpoch, newEpoch}`
    pub const CALL_FAILED_EPOCH_TRANSITION: &str = "call_failed_epoch_transition";
    /// `{agentRun, client:{name, version}|null, gating:"on"|"off", label}`
    pub const RUN_STARTED: &str = "run_started";
    /// `{reason}`
    pub const RUN_ENDED: &str = "run_ended";
    /// A server process ended ([`super::records::ServerExited`]).
    pub const SERVER_EXITED: &str = "server_exited";
    /// Gating was turned off for this run (free data, e.g. `{source}`).
    pub const GATING_DISABLED: &str = "gating_disabled";
    /// A host connection was shown a catalog or one tool's definition
    /// ([`super::records::CatalogPresented`]).
    pub const CATALOG_PRESENTED: &str = "catalog_presented";
    /// The first record of a chain that replaced a set-aside one (see [`super::recover`]).
    /// `{reason, previousLog|null, previousAnchor|null, previousHead:{seq,hash}|null,
    ///   previousLastRecord:{seq,hash}|null}`
    pub const CHAIN_RESTARTED: &str = "chain_restarted";
    /// The first record of every log file after the first (see [`super::scan`]): the previous
    /// segment was closed. `{previousSegment: file name, previousSeq, previousHash}`
    pub const SEGMENT_STARTED: &str = "segment_started";
    /// The host cancelled a forwarded call (`notifications/cancelled` went on to the server),
    /// so it may never be answered: the call's closing record unless the server answers it
    /// anyway, which a later `tool_result` records. `{callId, tool}`
    pub const CALL_CANCELLED: &str = "call_cancelled";
    /// The first record after a crash cut a write short: the incomplete last line after the
    /// anchored head was moved out of the log, and the chain continues from the last whole
    /// record. `{afterSeq, offset, bytes, sha256, keptAs: path}`
    pub const TORN_TAIL_SET_ASIDE: &str = "torn_tail_set_aside";
    /// The active file was removed while a writer had it open (`cargo clean`, `rm`), and the
    /// writer put it back at its path from its open descriptor; the chain continues (see
    /// `AuditLog::restore_removed`). `{reason, bytes, lastSeq}`
    pub const LOG_RESTORED: &str = "log_restored";

    /// Every type above, in the order listed.
    pub const ALL: &[&str] = &[
        SERVER_STARTED,
        BUILD_COMPLETED,
        CATALOG_REFRESHED,
        SERVER_REPLACED,
        APPROVAL_GRANTED,
        APPROVAL_REVOKED,
        TOOL_CALLED,
        TOOL_RESULT,
        AUTHORIZATION_DENIED,
        CALL_FAILED_EPOCH_TRANSITION,
        CALL_CANCELLED,
        RUN_STARTED,
        RUN_ENDED,
        SERVER_EXITED,
        GATING_DISABLED,
        CATALOG_PRESENTED,
        CHAIN_RESTARTED,
        SEGMENT_STARTED,
        TORN_TAIL_SET_ASIDE,
        LOG_RESTORED,
    ];
}

/// Everything that can go wrong while keeping an audit log (verification failures of a log's
/// content are [`VerifyFailure`]s, wrapped in [`AuditError::Verify`] where a log must be valid).
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("refusing to open audit log {}: it is a symbolic link", path.display())]
    Symlink { path: PathBuf },
    #[error("audit log {} is not a regular file", path.display())]
    NotRegularFile { path: PathBuf },
    #[error(
        "cannot locate a state directory for the audit key: set {}, XDG_STATE_HOME or HOME",
        keys::HOME_ENV
    )]
    NoStateDir,
    #[error("refusing audit key {}: {reason}", path.display())]
    InsecureKey { path: PathBuf, reason: String },
    #[error("refusing state directory {}: {reason}", path.display())]
    InsecureDir { path: PathBuf, reason: String },
    #[error("audit key {} is unusable: {reason}", path.display())]
    BadKey { path: PathBuf, reason: String },
    #[error("no audit key at {}: logs can only be checked with the key that sealed them", path.display())]
    KeyMissing { path: PathBuf },
    #[error(
        "audit log {} is damaged ({reason}); refusing to append onto a broken chain \
         (inspect it with `cargo mcp-dev audit verify`, or move it aside to start a new log)",
        path.display()
    )]
    CorruptTail { path: PathBuf, reason: String },
    #[error("anchor {} is unusable: {reason}", path.display())]
    BadAnchor { path: PathBuf, reason: String },
    /// The log checks up to its anchored head and beyond, then ends in an incomplete line (a
    /// write a crash cut short). [`recover`] moves those bytes aside and continues the chain.
    #[error(
        "audit log {} ends in an incomplete line after record {after_seq} ({len} bytes at byte {offset}): a write cut short by a crash",
        path.display()
    )]
    TornTail {
        path: PathBuf,
        after_seq: u64,
        offset: u64,
        len: u64,
        /// `(device, inode)` of the file that was judged: the cut is made only on that file.
        file_id: (u64, u64),
    },
    #[error("invalid audit record: {0}")]
    InvalidRecord(String),
    #[error(
        "audit log {} is in use by another process{} (waited {waited_ms} ms): a log \
         has one writer at a time. Stop the other supervisor, or give this one its own log with \
         `--audit-log <path>` or its own label with `--label <name>`",
        path.display(),
        pid.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    WriterBusy {
        path: PathBuf,
        /// The other writer's pid, as it wrote it into the lock file.
        pid: Option<u32>,
        waited_ms: u64,
    },
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("audit log failed verification: {0}")]
    Verify(#[from] VerifyFailure),
}

impl AuditError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> AuditError {
        let path = path.into();
        move |source| AuditError::Io {
            action,
            path,
            source,
        }
    }
}
