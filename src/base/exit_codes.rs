//! Every exit code `cargo mcp-dev` uses, in one place (documented in the README and `--help`).
//!
//! Codes follow cargo where cargo has one (101 for a failed build); the rest sit above it so a
//! wrapper can tell "cargo failed" from "cargo mcp-dev refused".

/// Success.
pub const OK: i32 = 0;
/// A general error (I/O, bad configuration, unreachable supervisor…); the message says which.
pub const ERROR: i32 = 1;
/// Bad command-line usage (clap's own code).
pub const USAGE: i32 = 2;
/// `cargo build` failed; its diagnostics were shown on stderr (also the build `new` and `init`
/// end with: their files are written all the same).
pub const BUILD_FAILED: i32 = 101;
/// `cargo metadata` failed (bad manifest, unknown package…), or cargo itself could not be run.
pub const METADATA_FAILED: i32 = 102;
/// The identity of what would run could not be captured completely (`check`, `build`).
pub const IDENTITY_NOT_CAPTURED: i32 = 103;
/// `check --expect FILE`: the captured identity differs from the expected record.
pub const IDENTITY_DIFFERS: i32 = 104;
/// `audit verify`: the log failed verification (the message names the first bad record).
pub const AUDIT_INVALID: i32 = 105;
/// `approve`, `status`, `restart`: no running supervisor answered on the control socket.
pub const NO_SUPERVISOR: i32 = 106;
/// `run`: the supervisor closed the host connection on purpose (restart mode `disconnect`, or a
/// new server whose protocol version or capabilities differ from what the host negotiated).
pub const CONNECTION_CLOSED: i32 = 107;
/// `demo`: a step did not behave as narrated.
pub const DEMO_FAILED: i32 = 108;
/// `audit verify`: the current chain verified, but the log's history has a break (an earlier
/// chain was set aside by `run`; both chains are reported on stderr).
pub const AUDIT_BREAK: i32 = 109;

/// (code, meaning) pairs for help text and the README.
pub const TABLE: &[(i32, &str)] = &[
    (OK, "success"),
    (ERROR, "error (message on stderr)"),
    (USAGE, "bad command-line usage"),
    (
        BUILD_FAILED,
        "cargo build failed (diagnostics shown; for new/init, files written)",
    ),
    (
        METADATA_FAILED,
        "cargo metadata failed or cargo could not be run",
    ),
    (IDENTITY_NOT_CAPTURED, "identity could not be captured"),
    (IDENTITY_DIFFERS, "identity differs from --expect"),
    (AUDIT_INVALID, "audit log failed verification"),
    (NO_SUPERVISOR, "no running supervisor on the control socket"),
    (
        CONNECTION_CLOSED,
        "run closed the host connection on purpose",
    ),
    (DEMO_FAILED, "a demo step did not behave as narrated"),
    (
        AUDIT_BREAK,
        "audit log verified, but an earlier chain was set aside (break reported)",
    ),
];

/// The table rendered for `--help`.
pub fn help_table() -> String {
    let mut out = String::from("Exit codes:\n");
    for (code, meaning) in TABLE {
        out.push_str(&format!("  {code:>3}  {meaning}\n"));
    }
    out
}
