//! The session's state types: enums instead of combinations of booleans, so states that cannot
//! happen cannot be written down.
//!
//! Owns: data only. Must not touch: I/O, decisions (the other rooms decide; this file names).

use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};

use serde_json::Value;

pub use crate::identity::epoch::{AgentRunId, EpochId};
use crate::identity::fingerprint::IdentityRecord;
use crate::session::BuildResult;
use crate::wire::proxy::envelope::Message;
pub use crate::wire::proxy::envelope::RawId;

use super::protocol::Era;

/// A raw JSON-RPC id kept for later answers.
pub type RawIdText = RawId;

/// Where the session is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lifecycle {
    /// No server of this session has been ready yet: requests are held (bounded by the
    /// first-start budget), never answered from state no real server produced.
    FirstStart,
    /// A server has been up in this session (it may be restarting now).
    Serving,
    /// The newest build failed and no server runs: requests are answered with the compiler's
    /// first error until a build succeeds.
    BuildBroken { message: String },
    /// The newest build was built but could not be started (its executable is gone or will
    /// not run) and no server runs: requests are answered with why until a start succeeds.
    StartFailed { message: String },
    /// The server exited too often: no automatic restarts until the sources change.
    CrashLoop,
    /// The session is ending.
    Stopping,
}

/// Builds: never two at once; a change during a build queues exactly one more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Builds {
    #[default]
    Idle,
    Running,
    RunningWithFollowUp,
}

/// A build started at a burst's leading edge, before the burst settled: it saves the quiet period
/// from every reload, and its result is used only if the burst settled with no change after its
/// leading edge (so it read the final files, as a build started after the quiet period would
/// have). Otherwise it is set aside and the sources are built again.
#[derive(Debug)]
pub struct EarlyBuild {
    /// A change came after its leading edge: it may have read a file mid-save.
    pub stale: bool,
    /// Its result, when it finished before the burst settled.
    pub held: Option<Box<BuildResult>>,
}

/// Where one server is, from its spawn until it goes: one value per epoch, so what a server
/// owes (a handshake answer, a catalog page) and by when lives in the variant that owes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildPhase {
    /// Started; waiting for the host's first message to know the era.
    Started,
    /// Our `initialize` (or modern `server/discover`) is in flight; it must be answered by
    /// `due_ms`.
    Handshaking { due_ms: u64 },
    /// Legacy: initialized; waiting for the host's `notifications/initialized` to pass on.
    AwaitingInitialized,
    /// Past its handshake: it serves every request, and its tools are as [`Tools`] says.
    Up(Tools),
}

impl ChildPhase {
    /// The name the status document shows (`server.phase`): a fetch is `FetchingCatalog`,
    /// a server with known or unknown tools `Ready`.
    pub fn name(&self) -> &'static str {
        match self {
            ChildPhase::Started => "Started",
            ChildPhase::Handshaking { .. } => "Handshaking",
            ChildPhase::AwaitingInitialized => "AwaitingInitialized",
            ChildPhase::Up(Tools::Fetching(_)) => "FetchingCatalog",
            ChildPhase::Up(Tools::Known(_) | Tools::Unknown { .. }) => "Ready",
        }
    }

    /// When the server's owed answer (handshake or catalog page) is due, if it owes one.
    pub fn answer_due_ms(&self) -> Option<u64> {
        match self {
            ChildPhase::Handshaking { due_ms } => Some(*due_ms),
            ChildPhase::Up(Tools::Fetching(f)) => Some(f.due_ms),
            _ => None,
        }
    }

    /// Past the handshake (serving), whatever is known of its tools.
    pub fn is_up(&self) -> bool {
        matches!(self, ChildPhase::Up(_))
    }

    /// Up, and no fetch of its tools in flight.
    pub fn is_ready(&self) -> bool {
        matches!(
            self,
            ChildPhase::Up(Tools::Known(_) | Tools::Unknown { .. })
        )
    }

    /// The fetch of its tools in flight, if any.
    pub fn fetch(&self) -> Option<&Fetch> {
        match self {
            ChildPhase::Up(Tools::Fetching(f)) => Some(f),
            _ => None,
        }
    }

    pub fn fetch_mut(&mut self) -> Option<&mut Fetch> {
        match self {
            ChildPhase::Up(Tools::Fetching(f)) => Some(f),
            _ => None,
        }
    }

    /// What this server has said about its tools so far (before a fetch ends: what the fetch
    /// refreshes).
    pub fn listed(&self) -> Listed {
        match self {
            ChildPhase::Up(Tools::Fetching(f)) => f.of,
            ChildPhase::Up(Tools::Known(extent)) => Listed::Known(*extent),
            ChildPhase::Up(Tools::Unknown { asked_ms }) => Listed::Unknown {
                asked_ms: *asked_ms,
            },
            _ => Listed::Nothing,
        }
    }
}

/// What the supervisor knows of one server's tools, from its own `tools/list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tools {
    /// The supervisor's own `tools/list` is in flight.
    Fetching(Fetch),
    /// This server gave a catalog (the catalog history's current revision).
    Known(Extent),
    /// Its first list failed and no fetch has succeeded since (`catalog_unknown`): calls are
    /// refused as `identity_pending`; a call asks for the list again at most every
    /// [`CATALOG_RETRY_MS`] (`asked_ms`: when one last did).
    Unknown { asked_ms: Option<u64> },
}

/// How much of the server's list a known catalog holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// What the server listed (a fetch that ended short for another reason counts here: a
    /// host's whole list that differs from it is news).
    Listed,
    /// Cut at the page or tool bound: a host's whole list always differs from it, without any
    /// change, so that difference triggers no refetch.
    CutAtBound,
}

/// What a server had said about its tools when a fetch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Nothing: this is its first list (a host's first `tools/list` waits for it).
    Nothing,
    /// Its first list failed (see [`Tools::Unknown`]).
    Unknown { asked_ms: Option<u64> },
    /// A catalog: this fetch refreshes it.
    Known(Extent),
}

impl Listed {
    /// This server has given no catalog yet (the gate says `identity_pending` for its calls).
    pub fn no_catalog(self) -> bool {
        !matches!(self, Listed::Known(_))
    }
}

/// Whether the host hears about the catalog a fetch brings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// As usual: `list_changed` when what the host holds is outdated.
    Host,
    /// Started because the host was just shown a list other than the catalog: it tells the
    /// host nothing (it listed a moment ago; telling it would make a host that re-lists on
    /// `list_changed` loop with a server whose list differs every time).
    Quiet,
}

/// Whether a fetch holds the server's whole list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    Whole,
    /// It ended short (the page bound, a later page's error, an unusable page, changes during
    /// every refetch, no `tools/list` at all): its catalog gates calls but is not recorded as
    /// what a server of this package listed (a later first contact answers from that record).
    Short,
}

/// The server's tools changed (it said `list_changed`) while a fetch was in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeDuringFetch {
    None,
    /// Its pages may mix two states: the fetch starts over when it ends (at most
    /// [`CATALOG_REFETCHES`] times in a row).
    Announced,
}

/// The supervisor's own `tools/list` of one server, page by page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    /// What the server had said about its tools when this fetch (or the run of refetches it
    /// belongs to) began.
    pub of: Listed,
    /// When the page in flight must have been answered.
    pub due_ms: u64,
    pub pages: Vec<Value>,
    /// Pages fetched (bounded by [`MAX_CATALOG_PAGES`]).
    pub pages_fetched: usize,
    /// The `tools` text of a one-page answer, until its catalog is built: remembered with it,
    /// so the host's identical answers are cheap ([`KnownList`]).
    pub one_page_text: Option<String>,
    pub coverage: Coverage,
    pub change: ChangeDuringFetch,
    /// Fetches started over in a row because of changes (see [`ChangeDuringFetch`]).
    pub refetches: usize,
    pub audience: Audience,
}

impl Fetch {
    pub fn new(of: Listed, audience: Audience, due_ms: u64) -> Fetch {
        Fetch {
            of,
            due_ms,
            pages: Vec::new(),
            pages_fetched: 0,
            one_page_text: None,
            coverage: Coverage::Whole,
            change: ChangeDuringFetch::None,
            refetches: 0,
            audience,
        }
    }
}

#[derive(Debug)]
pub struct ChildState {
    pub epoch: EpochId,
    pub pid: u32,
    pub record: IdentityRecord,
    pub phase: ChildPhase,
    pub started_ms: u64,
    /// Our requests to this server not answered yet, by our id (host requests forwarded, our
    /// handshake, catalog pages): they go with the server, and are answered when it goes
    /// (`answer_in_flight`).
    pub requests: Requests,
}

/// One server's open requests, by our id.
pub type Requests = HashMap<u64, OpenRequest, OurIds>;

impl ChildState {
    /// A server just spawned: nothing said to it yet.
    pub fn started(epoch: EpochId, pid: u32, record: IdentityRecord, started_ms: u64) -> Self {
        ChildState {
            epoch,
            pid,
            record,
            phase: ChildPhase::Started,
            started_ms,
            requests: Requests::default(),
        }
    }
}

/// Fetches started over in a row because the server's tools changed during each.
pub const CATALOG_REFETCHES: usize = 3;
/// A call asks again for the list of a server whose first list failed at most this often.
pub const CATALOG_RETRY_MS: u64 = 10_000;

/// Timers shared by everything that waits on them: armed once for the earliest deadline (a
/// flood of held requests or prompts costs one timer, not one each).
#[derive(Debug, Default)]
pub struct ArmedTimers {
    pub held: Option<u64>,
    pub prompts: Option<u64>,
    /// The server's handshake or catalog page (a thousand-page list costs one timer).
    pub server: Option<u64>,
}

/// A server that fails to start is built again at most this often (see `spawn_child_as`).
pub const START_REBUILD_INTERVAL_MS: u64 = 60_000;

/// The last build requested because a server could not start from its stored copy (while it
/// runs, the server slot is [`super::server::Server::RebuildingToStart`]).
#[derive(Debug, Clone)]
pub struct StartRebuild {
    pub identity: String,
    pub at_ms: u64,
}

/// A server asked for with [`super::Effect::Spawn`], until the shell reports its start.
#[derive(Debug)]
pub struct Spawning {
    pub epoch: EpochId,
    pub record: IdentityRecord,
    pub replaced: Option<EpochId>,
    pub fallback: Option<String>,
    /// A `restart` control request answered when the start is reported.
    pub ticket: Option<super::Ticket>,
    /// A crash restart scheduled when this start was asked for (set by the server slot): if
    /// the start fails, it stays scheduled.
    pub restart_due: Option<u64>,
}

/// A replacement in progress: the new epoch starts when the old child has stopped.
#[derive(Debug, Clone)]
pub struct Replacing {
    pub new_epoch: EpochId,
    pub record: IdentityRecord,
    pub old_epoch: EpochId,
}

/// What a child-facing id (always ours) stands for: an entry of one server's
/// [`ChildState::requests`], so it goes with that server.
#[derive(Debug)]
pub enum OpenRequest {
    /// A host request forwarded to the child.
    Host {
        host_id: RawId,
        /// Borrowed for the methods named in code (`tools/call` on every call).
        method: std::borrow::Cow<'static, str>,
        call: Option<CallInfo>,
    },
    /// Our replay of the host's `initialize` (or modern `server/discover`). Whether it carries
    /// the host's own `initialize` is [`HostInitialize::at_server`]'s to say (one fact, one
    /// place); `asked` is the protocol version the server was asked for (legacy).
    Handshake { modern: bool, asked: Option<String> },
    /// Our own `tools/list` page.
    CatalogPage,
    /// The host's own `initialize`, passed to a server past its handshake. It holds no host
    /// id: only [`HostInitialize`] can answer the host, so nothing answers it twice.
    ForwardedInitialize,
}

#[derive(Debug, Clone)]
pub struct CallInfo {
    pub tool: String,
    pub call_id: String,
    pub started_ms: u64,
}

/// A host request waiting for a server, with its deadline.
#[derive(Debug)]
pub struct Held {
    pub msg: Message,
    pub deadline_ms: u64,
    pub since_ms: u64,
}

/// The last whole one-page tool list seen (the supervisor's own fetch or a host's answer): its
/// `tools` text exactly as the server wrote it and the catalog built from it. A host that lists
/// again and gets the same bytes costs a comparison, not a parse and a digest per tool.
#[derive(Debug, Clone)]
pub struct KnownList {
    pub tools_text: String,
    /// The whole `result` text of the last host answer that showed it.
    pub result_text: Option<String>,
    pub catalog: crate::policy::catalog::Catalog,
}

/// A host `subscriptions/listen` stream, carried across restarts.
///
/// Tool-list changes on it are the supervisor's to send (it advertises `tools.listChanged`);
/// other categories are the server's, so the stream is also opened at each server while it
/// asks for any (`server_part`). A server that refuses the stream (rmcp's default) leaves the
/// supervisor's part standing.
#[derive(Debug)]
pub struct Listen {
    pub host_id: RawId,
    pub params: Value,
    /// Our id for it at the current child.
    pub child_id: Option<u64>,
    pub tools: bool,
    /// The stream is (also) carried by the server, and re-opened at each new one.
    pub server_part: bool,
    /// The host got this stream's acknowledgement (re-opened streams are not acknowledged twice).
    pub acknowledged: bool,
}

/// What the host negotiated (legacy) or was first told (modern).
#[derive(Debug, Clone)]
pub struct Negotiated {
    pub protocol_version: String,
    pub capabilities: Value,
    /// The host's `initialize` was answered from [`RecordedFacts::handshakes`] (a real server
    /// of this package, an earlier run) before this session's server was up: the first server's
    /// own answer must confirm its version.
    pub from_record: bool,
}

/// The host's `initialize` from its arrival until it is answered: kept here alone, with its
/// own deadline, wherever it is (waiting for a server, or sent to one). Whatever becomes of the
/// request it rode on (the server exits, is replaced, answers with a broken line), it is looked
/// at again at its deadline, so it is answered exactly once and within its budget (issue 33).
#[derive(Debug, Clone)]
pub struct HostInitialize {
    pub host_id: RawId,
    /// When the host sent it (the budget counts from here, across servers).
    pub since_ms: u64,
    /// When it is looked at again (the one `HandshakeWait` timer that counts; earlier ones
    /// firing find it not due).
    pub due_ms: u64,
    /// Our id of the request that carries it to a server (our handshake, or the host's own
    /// request to a server past its handshake). A dangling id (that request is gone: our ids
    /// are never reused) means it waits again.
    pub at_server: Option<u64>,
}

/// The one host connection of this run (stdin/stdout).
#[derive(Debug, Default)]
pub struct HostConnection {
    /// Requests waiting for a server (bounded: [`HELD_LIMIT`]).
    pub held: VecDeque<Held>,
    /// The host's `subscriptions/listen` streams, carried across restarts.
    pub listens: Vec<Listen>,
    /// The server's requests open at the host.
    pub server_requests: ServerRequests,
    pub era: Option<Era>,
    /// A request was refused for [`OPEN_AT_SERVER_LIMIT`] and the status line said so; cleared
    /// when a request is forwarded again (one line per overflow).
    pub overflow_told: bool,
    pub init_params: Option<Value>,
    pub initialized: bool,
    pub negotiated: Option<Negotiated>,
    pub modern_meta: Option<Value>,
    pub client_info: Option<Value>,
    /// Pages of the host's paged `tools/list` passing through, until the last one: only while
    /// a listing that began with a first page is open (`list_next`), at most
    /// [`MAX_CATALOG_TOOLS`] tools.
    pub list_pages: Vec<Value>,
    /// The cursor that continues the open listing (the last page's `nextCursor`): only a page
    /// asked for with it continues that listing, so two listings in flight are never merged
    /// into a catalog nobody served.
    pub list_next: Option<String>,
    /// The host's `tools/list` requests in flight, the newest [`LIST_REQUESTS_KEPT`]: our id
    /// and the cursor asked for (`None`: from the first page). An answer to a request not
    /// kept here is forwarded and not taken for anything the host holds.
    pub list_requests: VecDeque<(u64, Option<String>)>,
    /// The host's `initialize`, until it is answered.
    pub initialize: Option<HostInitialize>,
    /// The host asked for the catalog and got an error (nothing to show yet): tell it when
    /// the first catalog exists.
    pub list_refused: bool,
    /// `list_changed` was sent for this catalog revision.
    pub notified_revision: Option<u64>,
    /// The "host has not refetched" status line was printed for this revision.
    pub stale_notice_revision: Option<u64>,
    /// Calls the host cancelled after they were forwarded: (our id, epoch, call), the newest
    /// [`CANCELLED_KEPT`]. A late answer is recorded (the call ran) but not forwarded.
    pub cancelled_calls: VecDeque<(u64, EpochId, CallInfo)>,
}

/// The server's requests the host has not answered yet, at most [`OPEN_AT_HOST_LIMIT`].
#[derive(Debug, Default)]
pub struct ServerRequests {
    /// Our host-facing id → (epoch, the server's own id).
    pub open: HashMap<u64, (EpochId, RawIdText)>,
    /// The server's own ids of its latest requests the host answered (at most
    /// [`ANSWERED_KEPT`]): a late `notifications/cancelled` for one of them is about that
    /// finished request, never one of the host's that the server knows under the same number.
    pub answered: std::collections::VecDeque<RawIdText>,
    /// A request was refused for the limit and the status line said so; cleared once the
    /// host answers one (one line per overflow, not one per refused request).
    pub overflow_told: bool,
}

impl ServerRequests {
    /// The server's request `id` is over (answered by the host or by the supervisor, or
    /// cancelled by the server): kept among the last [`ANSWERED_KEPT`].
    pub fn ended(&mut self, id: RawIdText) {
        if self.answered.len() >= ANSWERED_KEPT {
            self.answered.pop_front();
        }
        self.answered.push_back(id);
    }
}

/// `tools/list` requests remembered (see `HostConnection::list_requests`).
pub const LIST_REQUESTS_KEPT: usize = 64;
/// The server's answered requests remembered (see [`ServerRequests::answered`]).
pub const ANSWERED_KEPT: usize = 64;
/// Cancelled calls whose late answers are still recorded (see `HostConnection`).
pub const CANCELLED_KEPT: usize = 64;

/// What real servers of this package said before: kept by the shell between runs and used
/// only with its provenance (which epoch and identity produced it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedFacts {
    /// The last real `initialize` answer of a server of this package for each protocol version
    /// a host asked for (the key), at most [`RECORDED_HANDSHAKES`]. A later host asking for the
    /// same version may be given it while the server builds: never an answer to another
    /// version, never one the supervisor made up.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub handshakes: std::collections::BTreeMap<String, RecordedHandshake>,
    /// The last catalog a real server of this package returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<RecordedCatalog>,
}

/// A real server's `initialize` result, as it answered it, and which code answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedHandshake {
    pub result: Value,
    pub epoch: String,
    pub identity_digest: String,
    pub recorded_at: String,
}

/// Protocol versions whose `initialize` answer is kept (the oldest recorded is dropped first).
pub const RECORDED_HANDSHAKES: usize = 8;
/// An `initialize` result larger than this (JSON text) is not recorded.
pub const RECORDED_HANDSHAKE_BYTES: usize = 64 << 10;
/// How long a host's `server/discover` probe waits for a real server's answer before it is
/// told to use `initialize` (Claude Code gives up on its probe after about 3 s).
pub const DEFAULT_DISCOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedCatalog {
    pub tools: Vec<Value>,
    pub digest: String,
    pub epoch: String,
    pub identity_digest: String,
    pub recorded_at: String,
}

/// Crash-loop bounds: this many exits within the window stop automatic restarts.
pub const CRASH_LIMIT: usize = 5;
pub const CRASH_WINDOW_MS: u64 = 60_000;
/// Requests held at once; more are answered at once.
pub const HELD_LIMIT: usize = 1024;
/// How long a stopping server gets after its stdin closes, before SIGTERM (session end).
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(500);
/// The same for a server that never answered its handshake.
pub const STOP_GRACE_UNANSWERED: std::time::Duration = std::time::Duration::from_millis(50);
/// Host requests open at the server at once (a server that reads and never answers cannot
/// grow the session without bound); more are answered at once with `TOO_MANY_OPEN`.
pub const OPEN_AT_SERVER_LIMIT: usize = 65_536;
/// The server's own requests open at the host at once; more are answered to the server.
pub const OPEN_AT_HOST_LIMIT: usize = 1024;
/// Open `subscriptions/listen` streams one host connection may hold.
pub const LISTEN_LIMIT: usize = 64;
/// `tools/list` pages fetched for one catalog; a server that pages forever is cut off here.
pub const MAX_CATALOG_PAGES: usize = 1000;
/// Tools in one catalog (a bound on memory for a server that never stops listing).
pub const MAX_CATALOG_TOOLS: usize = 100_000;

/// How many denied calls are kept for `approve --call` (oldest dropped first).
pub const DENIED_CALLS: usize = 32;
/// How much of a denied call's arguments text is kept to show the human (characters).
pub const ARGUMENTS_PREVIEW: usize = 2000;

/// A call refused for lack of a grant, kept so a human can approve exactly that call
/// (`cargo mcp-dev approve --call ID`). The arguments are kept only to show the human over
/// the owner-only control socket; never in the status document or the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedCallRecord {
    /// The host's id of the call, as JSON text.
    pub call_id: String,
    pub tool: String,
    pub arguments_digest: String,
    /// The arguments text as sent, cut at [`ARGUMENTS_PREVIEW`] characters.
    pub arguments_preview: String,
    pub arguments_truncated: bool,
    pub epoch: Option<EpochId>,
    pub reason: String,
}

/// A gated call waiting for the human's answer to an approval prompt in the host.
#[derive(Debug)]
pub struct Prompt {
    /// The `tools/call` as the host sent it, judged again after a grant.
    pub call: Message,
    pub host_id: RawId,
    pub call_id: String,
    pub tool: String,
    pub arguments_digest: String,
    /// The epoch the prompt was for: an answer that arrives under another one grants nothing.
    pub epoch: EpochId,
    /// The tools "all requested tools" grants, as the form listed them.
    pub requested: std::collections::BTreeSet<String>,
    /// Monotonic milliseconds after which the call is refused as timed out.
    pub deadline_ms: u64,
    /// The denial the call gets if no grant results.
    pub denial: crate::policy::approval::Denial,
    /// 2026-07-28: the call was answered with the form (`input_required`); the host's retry
    /// carries the answer. Legacy: the call waits for the answer to our request.
    pub modern: bool,
}

/// Hashes the supervisor's own request ids (sequential integers it minted, so nobody can choose
/// them to collide): one multiplication instead of SipHash, on every call's way out and back.
#[derive(Clone, Copy, Default)]
pub struct OurIds;

impl std::hash::BuildHasher for OurIds {
    type Hasher = OurIdHasher;
    fn build_hasher(&self) -> OurIdHasher {
        OurIdHasher(0)
    }
}

#[derive(Default)]
pub struct OurIdHasher(u64);

impl std::hash::Hasher for OurIdHasher {
    fn finish(&self) -> u64 {
        // Fibonacci hashing spreads consecutive ids over the table's top bits, which the map's
        // probe groups use.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The least time a fresh server has to answer our handshake, whatever the first-start budget.
pub const MIN_HANDSHAKE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

/// Default first-start budget: under the 30 s connect timeout of the most used hosts.
pub const DEFAULT_FIRST_START_BUDGET: std::time::Duration = std::time::Duration::from_secs(25);
/// Default warm-start wait for the server's own handshake answer.
pub const DEFAULT_HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);
/// Default wait for an answer in the host: well under the MCP SDKs' 60 s request timeout.
pub const DEFAULT_APPROVAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(45);
/// Default bound on approval prompts open in the host at once (more calls are refused).
pub const DEFAULT_MAX_OPEN_PROMPTS: usize = 4;
/// Default time a call waits for the next server during a restart.
pub const DEFAULT_RESTART_HOLD: std::time::Duration = std::time::Duration::from_secs(5);

/// The builds room's state (lifecycle.rs): never two builds at once, the early build of a
/// burst, and the newest successful build.
#[derive(Debug, Default)]
pub struct BuildState {
    pub runs: Builds,
    /// The running (or finished, unused) build started at a burst's first change.
    pub early: Option<EarlyBuild>,
    /// A burst of source changes began and has not settled yet.
    pub burst: Burst,
    /// Identity to apply when (re)starting: the newest successful build.
    pub latest: Option<IdentityRecord>,
    /// The last build's status line.
    pub last_line: Option<String>,
}

/// Whether a burst of source changes is open (began, not settled yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Burst {
    #[default]
    Settled,
    Open,
}

/// What happened to this session's servers before (the server slot holds the present).
#[derive(Debug, Default)]
pub struct Restarts {
    /// When the server exited lately (monotonic ms), for the crash loop.
    pub crashes: VecDeque<u64>,
    /// The last build asked for because a server could not start from its stored copy (once
    /// per identity, at most once a minute).
    pub last_start_rebuild: Option<StartRebuild>,
    /// The epoch of the last server this session started: once one was up, a held list is
    /// answered from the record only if that server produced it (never an earlier build's).
    pub last_started: Option<EpochId>,
}

/// The catalog room's state (catalog_fetch.rs): the revisions and the byte caches of lists.
#[derive(Debug, Default)]
pub struct Catalogs {
    pub history: crate::policy::catalog::CatalogHistory,
    /// The last whole one-page list seen, with its catalog.
    pub known_list: Option<KnownList>,
    /// The last `tools/list` answer the host was sent, as the server wrote it (its id): the
    /// same answer with another id is compared, not parsed ([`Message::with_other_id`]).
    pub list_answer: Option<Message>,
}

/// The approval rooms' state: the gate (the one judge of calls), what `approve` diffs
/// against, calls refused for lack of a grant, and prompts open in the host.
#[derive(Debug)]
pub struct Approvals {
    pub gate: crate::policy::approval::Gate,
    /// The epoch, identity and catalog of the last approval (what `approve` diffs against).
    pub baseline: Option<(
        String,
        IdentityRecord,
        Option<crate::policy::catalog::Catalog>,
    )>,
    /// Calls refused for lack of a grant, newest last (bounded: [`DENIED_CALLS`]).
    pub denied_calls: VecDeque<DeniedCallRecord>,
    /// Approval prompts open in the host, by request id (bounded by `max_open_prompts`).
    pub prompts: std::collections::BTreeMap<String, Prompt>,
}

impl Approvals {
    pub fn new(gate: crate::policy::approval::Gate) -> Approvals {
        Approvals {
            gate,
            baseline: None,
            denied_calls: VecDeque::new(),
            prompts: std::collections::BTreeMap::new(),
        }
    }
}
