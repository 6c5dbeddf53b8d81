//! Record type names (the `type` field) and the `data` fields the journals read. `data` is free
//! JSON chosen by the caller (integers only, see [`super::chain`]); fields not listed are kept and
//! ignored by the journals. Never put secret values in `data`: scope names and digests only.
//! Must not touch: anything else (a leaf: every audit module may read these names).

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
/// A human accepted the package's policy with `cargo mcp-dev approve --policy` (weakenings of
/// gating apply only after this). `{manifest, terms:{gate, perCallAll, perCall}, acceptedAtMs,
/// recordedBy: "approve"|"run"}` (`run`: the log was held at the acceptance; the next run
/// recorded it).
pub const POLICY_ACCEPTED: &str = "policy_accepted";
/// `run` started with weakenings of gating that no human accepted: they do not apply.
/// `{manifest, requested, accepted|null, effective, weakenings:[..]}`
pub const POLICY_PENDING: &str = "policy_pending";
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
    POLICY_ACCEPTED,
    POLICY_PENDING,
    CATALOG_PRESENTED,
    CHAIN_RESTARTED,
    SEGMENT_STARTED,
    TORN_TAIL_SET_ASIDE,
    LOG_RESTORED,
];

/// The `run` of records written by cargo mcp-dev itself outside any agent run.
pub const TOOL_RUN: &str = "cargo-mcp-dev";
