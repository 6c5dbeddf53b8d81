//! Denials: the verdict on one call and, when refused, the machine-readable payload for the
//! model and the sentence for the human. Owns: wording and payload shape. Must not touch:
//! the rules (the gate), I/O.

use serde_json::{Value, json};

use crate::identity::epoch::{EpochId, GrantId};
use crate::policy::catalog::CatalogRevision;

/// The verdict on one `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallDecision {
    /// Forward to the server. `grant_id` is `None` for an ungated tool; `credential_scopes` are
    /// the names of the scopes the tool uses (for the audit record; never values).
    Forward {
        grant_id: Option<GrantId>,
        /// The kind of that grant (`call` grants are bound to the arguments).
        grant_kind: Option<super::GrantKind>,
        credential_scopes: Vec<String>,
    },
    Deny(Denial),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DenialReason {
    IdentityPending,
    CatalogStale,
    UnknownTool,
    ArgumentsInvalid,
    AuthorizationStale,
    AuthorizationRequired,
}

impl DenialReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => "identity_pending",
            DenialReason::CatalogStale => "catalog_stale",
            DenialReason::UnknownTool => "unknown_tool",
            DenialReason::ArgumentsInvalid => "arguments_invalid",
            DenialReason::AuthorizationStale => "authorization_stale",
            DenialReason::AuthorizationRequired => "authorization_required",
        }
    }

    /// The `reason` text of the payload.
    fn explanation(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => {
                "server is starting or restarting; its execution epoch and tool catalog are not known yet"
            }
            DenialReason::CatalogStale => "tool catalog changed since the host last fetched it",
            DenialReason::UnknownTool => "tool is not in the current catalog",
            DenialReason::ArgumentsInvalid => {
                "arguments do not match the tool's current definition (its inputSchema in the current catalog)"
            }
            DenialReason::AuthorizationStale => "server execution epoch changed",
            DenialReason::AuthorizationRequired => {
                "tool requires human approval for this execution epoch"
            }
        }
    }

    /// The `retry` text of the payload: what the agent may do next. Calls are never queued.
    fn retry(self) -> &'static str {
        match self {
            DenialReason::IdentityPending => {
                "wait for the server to come up, refresh tool metadata, then call again"
            }
            DenialReason::CatalogStale => "refresh tool metadata (tools/list), then call again",
            DenialReason::UnknownTool => {
                "refresh tool metadata (tools/list) and call a listed tool"
            }
            DenialReason::ArgumentsInvalid => {
                "call again with arguments that match the tool's current definition"
            }
            DenialReason::AuthorizationStale => "refresh tool metadata and request authorization",
            DenialReason::AuthorizationRequired => {
                "request authorization from the user, then call again"
            }
        }
    }
}

/// Authorization status attached to a `catalog_stale` denial, so the human can approve while the
/// host refetches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingAuthorization {
    /// A grant covered the tool under another epoch (`approved_epoch` names it).
    Stale,
    /// No grant ever covered the tool in this run.
    Required,
}

/// Why one call was refused, with everything the model and the human need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub reason: DenialReason,
    pub tool: String,
    pub approved_epoch: Option<EpochId>,
    pub current_epoch: Option<EpochId>,
    /// Digest of the catalog the host last fetched.
    pub host_catalog: Option<String>,
    pub current_catalog: Option<CatalogRevision>,
    /// Names of the credential scopes the tool uses (what an approval must include).
    pub credential_scopes: Vec<String>,
    /// Only on `catalog_stale` for a gated tool with no live grant.
    pub authorization: Option<PendingAuthorization>,
    /// Only on `arguments_invalid`: what did not match (at most
    /// [`super::MISMATCHES_REPORTED`], shortened and safe to show).
    pub mismatches: Vec<super::ArgumentMismatch>,
}

impl Denial {
    /// The machine-readable payload for the tool execution error, e.g.
    /// `{"error":"authorization_stale","reason":"server execution epoch changed",
    ///   "approvedEpoch":…,"currentEpoch":…,"retry":"refresh tool metadata and request authorization","tool":…}`.
    /// Absent facts are left out rather than sent as `null`.
    pub fn payload(&self) -> Value {
        let mut p = serde_json::Map::new();
        p.insert("error".into(), json!(self.reason.as_str()));
        p.insert("reason".into(), json!(self.reason.explanation()));
        if let Some(epoch) = &self.approved_epoch {
            p.insert("approvedEpoch".into(), json!(epoch));
        }
        if let Some(epoch) = &self.current_epoch {
            p.insert("currentEpoch".into(), json!(epoch));
        }
        if matches!(
            self.reason,
            DenialReason::CatalogStale | DenialReason::ArgumentsInvalid
        ) {
            p.insert("hostCatalog".into(), json!(self.host_catalog));
        }
        if let Some(rev) = &self.current_catalog
            && matches!(
                self.reason,
                DenialReason::CatalogStale
                    | DenialReason::UnknownTool
                    | DenialReason::ArgumentsInvalid
            )
        {
            p.insert("currentCatalog".into(), json!(rev));
        }
        if let Some(auth) = self.authorization {
            let status = match auth {
                PendingAuthorization::Stale => "stale",
                PendingAuthorization::Required => "required",
            };
            p.insert("authorization".into(), json!(status));
        }
        if self.reason == DenialReason::ArgumentsInvalid {
            p.insert("mismatches".into(), json!(self.mismatches));
        }
        p.insert("retry".into(), json!(self.reason.retry()));
        p.insert("tool".into(), json!(self.tool));
        if !self.credential_scopes.is_empty() {
            p.insert("credentialScopes".into(), json!(self.credential_scopes));
        }
        Value::Object(p)
    }

    /// One sentence telling the human what to do.
    pub fn human_hint(&self) -> String {
        // The tool's name is the server's: its backticks are escaped, so a command in
        // backticks in this sentence is only ever ours.
        let tool = &self.tool.replace('`', "\\`");
        let approve = || {
            let epoch = self.current_epoch.as_deref().unwrap_or("the current epoch");
            match approve_tool_command(&self.tool, &self.credential_scopes) {
                Some(cmd) => {
                    format!("run `{cmd}` in the project to approve {tool} for epoch {epoch}")
                }
                None => format!(
                    "run `cargo mcp-dev approve` in the project to review and approve {tool} for epoch {epoch}"
                ),
            }
        };
        match self.reason {
            DenialReason::IdentityPending => format!(
                "The server is starting or restarting, so {tool} was refused rather than queued: wait until the \
                 status line shows the server running under its new epoch, then let the agent refresh its tools and \
                 call again."
            ),
            DenialReason::CatalogStale => {
                let current = self
                    .current_catalog
                    .as_ref()
                    .map(|r| r.number.to_string())
                    .unwrap_or_default();
                let mut s = format!(
                    "The host's tool list is out of date (current catalog revision {current}): let the agent refresh \
                     tools/list, or reconnect the server in the host if it ignores list_changed"
                );
                match (self.authorization, &self.approved_epoch) {
                    (Some(PendingAuthorization::Stale), Some(old)) => s.push_str(&format!(
                        "; {tool} was approved for epoch {old} only, so also {}",
                        approve()
                    )),
                    (Some(_), Some(this)) => s.push_str(&format!(
                        "; {tool} was approved for one call in this build (epoch {this}), which has run, so also {}",
                        approve()
                    )),
                    (Some(_), None) => s.push_str(&format!("; also {}", approve())),
                    (None, _) => {}
                }
                s.push('.');
                s
            }
            DenialReason::UnknownTool => {
                format!(
                    "{tool} is not in the server's current tool list: let the agent refresh tools/list."
                )
            }
            DenialReason::ArgumentsInvalid => {
                let what = self
                    .mismatches
                    .first()
                    .map(|m| format!(" ({})", m.describe()))
                    .unwrap_or_default();
                format!(
                    "The arguments of {tool} do not match its current definition{what}: the agent may hold an old \
                     definition of the tool (some hosts keep it after refetching); the call was refused with the \
                     current one, or reconnect the server in the host."
                )
            }
            DenialReason::AuthorizationStale => format!(
                "{tool} was approved for epoch {}, but the server has been replaced since: review what changed and {}.",
                self.approved_epoch.as_deref().unwrap_or("?"),
                approve()
            ),
            DenialReason::AuthorizationRequired if self.approved_epoch.is_some() => format!(
                "{tool} was approved for one call in this build (epoch {}), and that call has run: it needs your approval again: {}.",
                self.approved_epoch.as_deref().unwrap_or("?"),
                approve()
            ),
            DenialReason::AuthorizationRequired => {
                format!("{tool} needs your approval: {}.", approve())
            }
        }
    }
}

/// The sentence the model gets when the person asked in the host said no to this call
/// (declined, cancelled, denied, or let the form time out): never how to approve, so the agent is
/// not invited to route around the person's answer.
pub fn declined_hint(tool: &str, outcome: &str) -> String {
    let tool = tool.replace('`', "\\`");
    format!(
        "The person was asked in the host to approve this call of {tool} and did not approve it ({outcome}). \
         The call was not run. Do not retry it and do not ask for approval another way; tell the user it was not approved."
    )
}

/// What the model is told when the person approved in a form that had already closed: the call
/// did not run, and calling again shows the person a new form (never how to approve elsewhere).
pub fn late_answer_hint(tool: &str) -> String {
    let tool = tool.replace('`', "\\`");
    format!(
        "The approval form for this call of {tool} had closed (it timed out) before the person's answer arrived, \
         so the call was not run. Calling it again shows the person a new form."
    )
}

/// The `retry` text of a call whose approval came after its form closed.
pub const RETRY_LATE_ANSWER: &str =
    "call again: the person is shown a new approval form; do not ask for approval another way";

/// The `retry` text of a call the person declined (replaces the reason's own).
pub const RETRY_DECLINED: &str =
    "do not retry: the person declined this call; do not ask for approval another way";

/// A denial as kept for `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedCall {
    /// Milliseconds, as passed to [`Gate::decide_call`].
    pub at: u64,
    pub denial: Denial,
}

/// The command that approves `tool` (with its credential scopes), each name as one shell word
/// that cannot expand (`sanitize::shell_word`): the tool's name is the server's, and a human
/// pastes the command into a shell. `None` when a name makes no safe word (not printable ASCII,
/// a backtick, over 128 bytes): the interactive `approve` then shows it instead.
fn approve_tool_command(tool: &str, scopes: &[String]) -> Option<String> {
    // No backtick either: the command is shown between backticks.
    let word = |s: &str| {
        crate::screen::sanitize::shell_word(s).filter(|_| s.len() <= 128 && !s.contains('`'))
    };
    // `--tool=`: a name that starts with `-` is still the option's value.
    let sep = if tool.starts_with('-') { "=" } else { " " };
    let mut cmd = format!("cargo mcp-dev approve --tool{sep}{}", word(tool)?);
    for scope in scopes {
        let sep = if scope.starts_with('-') { "=" } else { " " };
        cmd.push_str(&format!(" --credential-scope{sep}{}", word(scope)?));
    }
    Some(cmd)
}
