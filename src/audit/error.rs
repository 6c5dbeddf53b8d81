//! What can go wrong while keeping or checking an audit log: [`AuditError`] (keeping one) and
//! [`VerifyFailure`] (a log's content that does not check, with where).
//! Must not touch: anything (a leaf beside [`super::chain`]: every audit module returns these).

use super::chain::ChainError;
use std::fmt;
use std::path::PathBuf;

/// The environment variable naming the state directory of the key and anchors (read by
/// [`super::keys`]; named here for the error that asks for it).
pub const HOME_ENV: &str = "CARGO_MCP_DEV_HOME";

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
        HOME_ENV
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

/// The first problem found. `line` is 1-based, in the file the reason names (the active file
/// when it names none); `0` means the problem is not at a line (missing or empty log, missing
/// key, missing or invalid anchor, a missing segment). For a truncated tail, `line` and `seq`
/// name the first missing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyFailure {
    pub line: usize,
    pub seq: Option<u64>,
    pub reason: String,
}

impl fmt::Display for VerifyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The reason may quote the log (serde names an unknown field raw): one line, always,
        // so that a record cannot print a line of its own under the failure.
        let reason = crate::screen::sanitize::line(&self.reason);
        match (self.line, self.seq) {
            (0, _) => write!(f, "{reason}"),
            (line, Some(seq)) => write!(f, "record {seq} (line {line}): {reason}"),
            (line, None) => write!(f, "line {line}: {reason}"),
        }
    }
}

impl std::error::Error for VerifyFailure {}
