//! JSON-RPC error codes of cargo mcp-dev's own errors (outside −32768..−32000, and never in
//! MCP's reserved −32020..−32099).

/// The request was in flight when its server was replaced or exited.
pub const EPOCH_TRANSITION: i64 = -31001;
/// No server is available (still building, build failed, crash loop, shutting down).
pub const SERVER_UNAVAILABLE: i64 = -31002;
/// The host sent a response to a request nobody is waiting for.
pub const UNKNOWN_RESPONSE: i64 = -31003;
/// The request could not be audited, so it was not forwarded.
pub const AUDIT_FAILED: i64 = -31004;
/// More requests are open than the supervisor keeps (host requests at the server, or the
/// server's requests at the host); this one was answered at once and not passed on.
pub const TOO_MANY_OPEN: i64 = -31005;
