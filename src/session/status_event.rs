//! What the session tells a human watching the terminal, as typed events: each names what
//! happened and carries its data (already cleaned where it came from the agent or a server).
//! Their English wording is the screen's (`crate::status_lines`), rendered by the shell and
//! by the test shell.

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
