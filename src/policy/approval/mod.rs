//! The gate: the only place that decides whether a `tools/call` is forwarded to the server.
//!
//! Owns the approval policy ([`Policy`]), the grants a human issued for this agent run
//! ([`Grant`]), the state machine of docs/ARCHITECTURE.md ([`Phase`]) and the denials it produces,
//! with their machine-readable payload and the sentence for the human ([`Denial`]).
//!
//! Pure: events in, decisions out. It does no I/O and reads no clock: times are passed in as
//! milliseconds and grant ids are supplied by the caller. It must not touch processes, JSON-RPC
//! framing, the audit log or the control socket; `session` feeds it events from those and acts on
//! the decisions (writes `tool_called` before forwarding, `authorization_denied` after a denial).
//!
//! Tool annotations (`readOnlyHint`, `destructiveHint`, …) are untrusted hints from the server:
//! nothing in this module takes them as input, so they cannot decide gating or credentials.
//!
//! Rules enforced by [`Gate::decide_call`], in this order:
//! 1. `identity_pending`: no current epoch, or its catalog has not been fetched yet;
//! 2. `catalog_stale`: the called tool's definition as this host connection was last shown it
//!    differs from its definition in the current catalog, or the tool is gone. Judged per
//!    tool: calls to unchanged tools go through. A host that was never shown a catalog in this
//!    connection (or never shown this tool) is judged against the current catalog;
//! 3. `unknown_tool`: the tool is not in the current catalog;
//! 4. `arguments_invalid`: the call's arguments are not an object, or do not validate against
//!    the tool's `inputSchema` in the current catalog (`arguments`: bounded, compiled once per
//!    definition; a schema too big or that does not compile is not checked), whatever the host
//!    was shown: its model may hold an old definition. Judged before grants, so a malformed call
//!    never asks a person nor spends a per-call grant;
//! 5. for a gated tool, a live grant of this run naming the current epoch and covering the tool
//!    and every credential scope it uses; otherwise the refusal cites the newest grant of the
//!    tool that no longer authorizes (`approvedEpoch`): `authorization_stale` when it is of
//!    another epoch, `authorization_required` when it is this epoch's, used up, or when there is
//!    none.

mod arguments;
mod denial;
mod gate;
mod grant;
mod host_view;
mod policy;
#[cfg(test)]
mod test_gate;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_arguments;

pub use arguments::*;
pub use denial::*;
pub use gate::*;
pub use grant::*;
pub use host_view::{HostView, Showing, ShownTool};
pub use policy::*;
