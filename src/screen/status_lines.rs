//! The session's status lines (the screen layer): [`StatusEvent`], what the session core tells
//! a human watching the terminal as typed events (each names what happened and carries its
//! data, already cleaned where it came from the agent or a server), and their English wording,
//! the line a human reads on stderr. The `run` shell and the session's test shell both render
//! through this `Display`, so tests read the text users do. The session imports the events
//! from here (a lower layer); it holds no wording.

use std::fmt;

/// One status event of the session.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusEvent {
    // ----- the run and its audit log --------------------------------------------------------
    /// `--no-gating`: every call is forwarded without a grant.
    GatingOff,
    /// Records of a step could not be written (no call was waiting on them).
    AuditWarning {
        why: String,
    },
    /// Records could not be written: the calls they named were refused.
    CallsRefusedAuditUnavailable {
        calls: usize,
        why: String,
    },
    /// The host's connection is closing.
    ConnectionClosed {
        why: String,
    },

    // ----- builds and changes ---------------------------------------------------------------
    /// A burst of source changes settled (first paths).
    ChangeDetected {
        paths: Vec<String>,
    },
    /// The early build saw a later change and is built again.
    EarlyBuildOutdated,
    /// A build's own summary line (worded by the build).
    BuildReport {
        line: String,
    },
    /// cargo could not run, or identity could not be captured.
    BuildError {
        message: String,
    },
    /// A warning the build reported.
    BuildWarning {
        warning: String,
    },
    /// The first build failed; the last good build runs (`--fallback last-good`).
    RunningLastGood {
        identity: String,
    },
    /// The build failed and no server runs.
    NoServerBuildFailed {
        message: String,
    },

    // ----- servers --------------------------------------------------------------------------
    /// A new build is not started: the server is in a crash loop.
    NotRestartedCrashLoop,
    /// Manual mode: a new build waits for `cargo mcp-dev restart`.
    RunningUnchangedManual {
        pid: u32,
        epoch: String,
        identity: String,
    },
    /// The build changed nothing the server runs (or there is none).
    RunningUnchanged {
        running: Option<(u32, String)>,
    },
    SpawnFailed {
        why: String,
    },
    /// The server could not start; the build under way starts it.
    BuildUnderWayStartsIt,
    /// The server could not start; it is built again from a fresh copy.
    BuildingAgainForFreshCopy,
    ServerReplaced {
        pid: u32,
        epoch: String,
        old: String,
    },
    ServerStarted {
        pid: u32,
        epoch: String,
        identity: String,
        last_good: bool,
    },
    ReplacingServer {
        why: String,
    },
    ServerExited {
        pid: u32,
        epoch: String,
        exit: String,
    },
    CrashLoop {
        exits: usize,
        window_s: u64,
    },
    RestartingIn {
        ms: u128,
    },
    ManualRestartNeeded,
    /// The server cannot serve (its handshake failed); it starts again with a build.
    ServerStopped {
        pid: u32,
        epoch: String,
        why: String,
    },

    // ----- handshakes -----------------------------------------------------------------------
    DiscoverRefused,
    DiscoverUnanswered,
    /// Capabilities differ from the recorded ones the host was given.
    CapabilitiesDiffer {
        capabilities: String,
    },
    ListenNotServed,
    InitializeWaits {
        why: &'static str,
        at_most_s: f64,
        then_recorded: bool,
    },
    InitializeFromRecord {
        protocol: String,
        epoch: String,
        identity: String,
        why: &'static str,
        list_waits: bool,
    },
    InitializeError {
        waited_s: f64,
        why: &'static str,
    },

    // ----- first contact --------------------------------------------------------------------
    TooManyHeld {
        limit: usize,
    },
    HeldTooLong {
        method: String,
        waited_s: f64,
    },
    ListFromRecord {
        starting: &'static str,
        epoch: String,
        digest: String,
        identity: String,
    },

    // ----- the host -------------------------------------------------------------------------
    HostInvalidMessage {
        why: String,
    },
    HostOversize {
        len: usize,
    },
    HostRequestWithoutId {
        method: String,
    },
    HostCancelled {
        tool: String,
        call_id: String,
    },
    HostAnsweredNobody,
    HostAnsweredReplaced {
        id: u64,
    },
    HostNotRefetching {
        after_list_changed: bool,
        revision: u64,
    },

    // ----- the server's output --------------------------------------------------------------
    TooManyServerRequests {
        limit: usize,
        label: String,
        epoch: String,
    },
    ServerNonJson {
        text: String,
        cut: bool,
        label: String,
        epoch: String,
    },
    ServerUnknownId,
    ServerListUnreadable,
    ServerOversize {
        len: usize,
        label: String,
        epoch: String,
    },
    TooManyOpenAtServer {
        limit: usize,
    },

    // ----- catalogs -------------------------------------------------------------------------
    CatalogPagingLimit {
        pages: usize,
        tools: usize,
        max_pages: usize,
        max_tools: usize,
    },
    CatalogChangedDuringFetches {
        fetches: usize,
    },
    CatalogPageFailedKept {
        page: usize,
        why: String,
    },
    CatalogPageFailedPartial {
        page: usize,
        why: String,
        fetched: usize,
    },
    CatalogUnknown {
        why: String,
    },
    CatalogInvalidKept {
        why: String,
    },
    CatalogChanged {
        revision: u64,
        digest: String,
        summary: String,
    },
    CatalogChange {
        line: String,
    },
    HostListTooLong {
        max_tools: usize,
    },
    CatalogDrift,

    // ----- calls and approvals --------------------------------------------------------------
    CallDenied {
        tool: String,
        reason: String,
        hint: String,
        approve_command: Option<String>,
    },
    CallWithoutTarget,
    ArgumentsNotChecked {
        tool: String,
        why: String,
    },
    ApprovalAsked {
        tool: String,
        epoch: String,
        call_id: String,
        waits_s: u64,
    },
    PromptNotOpen {
        id: String,
    },
    PromptWasInputRequest,
    PromptRefused {
        tool: String,
        reason: String,
        outcome: String,
    },
    RetryPromptNotOpen {
        tool: String,
        prompt: String,
    },
    Approved {
        what: String,
        epoch: String,
        grant: String,
        lasts: String,
        via: String,
    },
}

impl fmt::Display for StatusEvent {
    // One arm a line: the wording reads as a table.
    #[rustfmt::skip]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use StatusEvent as S;
        match self {
            S::GatingOff => f.write_str("approval gating is off: every tool call is forwarded without a grant"),
            S::AuditWarning { why } => write!(f, "warning: audit log: {why}"),
            S::CallsRefusedAuditUnavailable { calls, why } => {
                let many = if *calls == 1 { "call" } else { "calls" };
                write!(f, "{many} refused: audit log unavailable: {why}")
            }
            S::ConnectionClosed { why } => write!(f, "connection closed: {why}"),
            S::ChangeDetected { paths } => write!(f, "change detected: {}", paths.join(", ")),
            S::EarlyBuildOutdated => f.write_str("a build started before the sources settled saw a later change; building again"),
            S::BuildReport { line } => f.write_str(line),
            S::BuildError { message } => write!(f, "build failed: {message}"),
            S::BuildWarning { warning } => write!(f, "warning: {warning}"),
            S::RunningLastGood { identity } => write!(f, "build failed; running the last good build {identity} instead (--fallback last-good); fix the error and save to run new code"),
            S::NoServerBuildFailed { message } => write!(f, "no server running: the build failed ({message}); it starts as soon as a build succeeds"),
            S::NotRestartedCrashLoop => f.write_str("server not restarted: it is in a crash loop (waiting for a source change)"),
            S::RunningUnchangedManual { pid, epoch, identity } => write!(f, "running server unchanged: pid={pid} epoch={epoch} (restart mode manual: run `cargo mcp-dev restart` to apply {identity})"),
            S::RunningUnchanged { running: Some((pid, epoch)) } => write!(f, "running server unchanged: pid={pid} epoch={epoch}"),
            S::RunningUnchanged { running: None } => f.write_str("no server running"),
            S::SpawnFailed { why } => write!(f, "server failed to start: {why}"),
            S::BuildUnderWayStartsIt => f.write_str("the build under way starts the server when it is done"),
            S::BuildingAgainForFreshCopy => f.write_str("building again to start it from a fresh copy (was the target directory cleaned?)"),
            S::ServerReplaced { pid, epoch, old } => write!(f, "server replaced: pid={pid} epoch={epoch} (was {old})"),
            S::ServerStarted { pid, epoch, identity, last_good } => write!(f, "server started: pid={pid} epoch={epoch} ({identity}{})", if *last_good { ", last good build" } else { "" }),
            S::ReplacingServer { why } => write!(f, "replacing server ({why})"),
            S::ServerExited { pid, epoch, exit } => write!(f, "server exited: pid={pid} epoch={epoch} ({exit})"),
            S::CrashLoop { exits, window_s } => write!(f, "server crash loop: {exits} exits in {window_s} s; not restarting until the sources change or `cargo mcp-dev restart`"),
            S::RestartingIn { ms } => write!(f, "restarting server in {ms} ms"),
            S::ManualRestartNeeded => f.write_str("restart mode manual: run `cargo mcp-dev restart` to start the server again"),
            S::ServerStopped { pid, epoch, why } => write!(f, "server stopped: pid={pid} epoch={epoch}: {why}; it starts again with the next successful build (save a change) or on `cargo mcp-dev restart`"),
            S::DiscoverRefused => f.write_str("the server refused server/discover; waiting for initialize"),
            S::DiscoverUnanswered => f.write_str("the server has not answered server/discover; the host is told to use initialize"),
            S::CapabilitiesDiffer { capabilities } => write!(f, "the server's capabilities {capabilities} differ from those recorded from an earlier build, which the host was given; reconnect the server in the host to use them"),
            S::ListenNotServed => f.write_str("the server does not serve subscriptions/listen; the supervisor sends tool-list changes on the host's stream"),
            S::InitializeWaits { why, at_most_s, then_recorded } => write!(f, "initialize waits for the server's own answer ({why}; at most {at_most_s:.0} s{})", if *then_recorded { ", then the answer a server of this package gave before" } else { "" }),
            S::InitializeFromRecord { protocol, epoch, identity, why, list_waits } => write!(f, "initialize answered with the answer a server of this package gave before (protocol {protocol}, epoch {epoch}, identity {identity}) while {why}; {}", if *list_waits { "tools/list waits for the server" } else { "tools/list is answered with why until a server runs" }),
            S::InitializeError { waited_s, why } => write!(f, "initialize answered with an error after {waited_s:.1} s while {why}"),
            S::TooManyHeld { limit } => write!(f, "more than {limit} requests wait for the server; answering the newest at once"),
            S::HeldTooLong { method, waited_s } => write!(f, "{method} waited {waited_s:.1} s for the server, which is still not up; answered with an error"),
            S::ListFromRecord { starting, epoch, digest, identity } => write!(f, "the server is still {starting}: tools/list answered with the catalog recorded from epoch {epoch} ({digest}, identity {identity}); calls are checked against the real catalog when the server is up"),
            S::HostInvalidMessage { why } => write!(f, "host sent an invalid message ({why}); answered with an error"),
            S::HostOversize { len } => write!(f, "host sent a message of {len} bytes, over the line limit; answered with a parse error"),
            S::HostRequestWithoutId { method } => write!(f, "host sent `{}` without an id (not a notification); dropped, not forwarded", method.escape_debug()),
            S::HostCancelled { tool, call_id } => write!(f, "host cancelled {tool} ({call_id})"),
            S::HostAnsweredNobody => f.write_str("host answered a request nobody sent; dropped"),
            S::HostAnsweredReplaced { id } => write!(f, "host answered request {id} of a replaced server; dropped"),
            S::HostNotRefetching { after_list_changed, revision } => write!(f, "the host has not refetched tools/list {}(catalog revision {revision}); stale calls are refused with the new definition. In Claude Code, `/mcp` reconnects the server", if *after_list_changed { "after list_changed " } else { "" }),
            S::TooManyServerRequests { limit, label, epoch } => write!(f, "server sent more than {limit} requests the host has not answered; answering the next ones itself with an error ({label} epoch {epoch})"),
            S::ServerNonJson { text, cut, label, epoch } => write!(f, "server wrote non-JSON to stdout: {}{} ({label} epoch {epoch}; use stderr for logs)", text.escape_debug(), if *cut { "…" } else { "" }),
            S::ServerUnknownId => f.write_str("server answered a request id it was never sent; dropped"),
            S::ServerListUnreadable => f.write_str("server answered tools/list with a list that cannot be read; the host gets an error"),
            S::ServerOversize { len, label, epoch } => write!(f, "server wrote a {len}-byte line to stdout, over the limit; dropped ({label} epoch {epoch})"),
            S::TooManyOpenAtServer { limit } => write!(f, "{limit} requests are open at the server (it is not answering them); answering the next ones at once with an error"),
            S::CatalogPagingLimit { pages, tools, max_pages, max_tools } => write!(f, "the server's tools/list kept paging ({pages} pages, {tools} tools): stopped at the limit of {max_pages} pages / {max_tools} tools; the catalog holds what was fetched"),
            S::CatalogChangedDuringFetches { fetches } => write!(f, "the server's tools changed during each of {fetches} fetches in a row; the catalog holds the last one"),
            S::CatalogPageFailedKept { page, why } => write!(f, "the server's tools/list page {page} {why}; the catalog stays as it was"),
            S::CatalogPageFailedPartial { page, why, fetched } => write!(f, "the server's tools/list page {page} {why}; the catalog holds the {fetched} pages fetched"),
            S::CatalogUnknown { why } => write!(f, "the server's tools/list page 1 {why}; its tools are not known: a call asks for them again (at most every 10 s), as do its list_changed and the host's tools/list; calls are refused until it lists them"),
            S::CatalogInvalidKept { why } => write!(f, "server's tools/list is invalid ({why}); the catalog stays as it was"),
            S::CatalogChanged { revision, digest, summary } => write!(f, "catalog changed: revision {revision} ({digest}; {summary})"),
            S::CatalogChange { line } => write!(f, "  {line}"),
            S::HostListTooLong { max_tools } => write!(f, "the host's paged tools/list passed {max_tools} tools; not followed further"),
            S::CatalogDrift => f.write_str("the server listed tools that differ from its catalog without saying list_changed; fetching its catalog again"),
            S::CallDenied { tool, reason, hint, approve_command: None } => write!(f, "call denied: {tool} ({reason}): {hint}"),
            S::CallDenied { tool, reason, hint, approve_command: Some(command) } => write!(f, "call denied: {tool} ({reason}): {hint} (or `{command}` for this call only)"),
            S::CallWithoutTarget => f.write_str("call refused: tools/call params must be an object with one string `name` (answered with invalid params)"),
            S::ArgumentsNotChecked { tool, why } => write!(f, "arguments of {tool} are not checked against its input schema: {why}"),
            S::ApprovalAsked { tool, epoch, call_id, waits_s } => write!(f, "approval asked in the host: {tool} for epoch {epoch} (call {call_id}, waits up to {waits_s}s)"),
            S::PromptNotOpen { id } => write!(f, "host answered approval prompt {id} that is not open (never sent, already answered or expired); ignored, nothing granted"),
            S::PromptWasInputRequest => f.write_str("host answered an approval prompt that was sent as an input request; ignored, nothing granted"),
            S::PromptRefused { tool, reason, outcome } => write!(f, "call refused: {tool} ({reason}): {outcome}"),
            S::RetryPromptNotOpen { tool, prompt } => write!(f, "a retry of {tool} named approval prompt {prompt} that is not open for this call (never sent, already answered, expired, or another call's); nothing granted"),
            S::Approved { what, epoch, grant, lasts, via } => write!(f, "approved: {what} for epoch {epoch} (grant {grant}, lasts {lasts}, via {via})"),
        }
    }
}
