//! Approvals room: which approval channels this run has, and the in-host channel: a gated call
//! that needs a grant waits while the supervisor asks the person at the host
//! (`elicitation/create`, legacy era), bounded in time and in number.
//!
//! Owns: prompts (their ids, deadlines and the call each holds), the form, matching an answer
//! to the one prompt it answers, and turning an accepted answer into a grant through the gate
//! (re-checked against the current epoch). Must not touch: the gate's rules, I/O (effects are data: `effect`).
//!
//! Ids: prompts are JSON-RPC requests to the host with string ids
//! `"cargo-mcp-dev/approval/<minted id>"`. Requests the server sends to the host are relayed
//! under numeric ids (`next_id`), so the two spaces never meet; a host response is routed by
//! the id's JSON type first. An answer grants only if its id names an open prompt (removed on
//! the first answer, so a replay or a second answer finds nothing), it is a well-formed
//! `accept` whose content is exactly one known choice, and the epoch is still the prompt's.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::*;
use crate::policy::approval::{
    ApprovalRequest, CallApprovalRequest, Channel, Denial, DenialReason, GrantKind,
};

use crate::screen::sanitize;
use crate::wire::proxy::envelope::{self, Message};

#[path = "approval_form.rs"]
mod form;
pub(super) use form::Form;
#[cfg(test)]
pub use form::{FORM_HEAD_COLUMNS, columns};

/// The prefix of every prompt's request id.
pub const PROMPT_ID_PREFIX: &str = "cargo-mcp-dev/approval/";
/// The form's one field.
pub const DECISION_FIELD: &str = "decision";

/// The choices of the form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// This call once (a `call` grant).
    Once,
    /// This tool for this epoch (until the next rebuild).
    Tool,
    /// Every requested tool for this epoch (offered only when it names more than the tool).
    Requested,
    Deny,
}

impl Decision {
    pub const ALL: [Decision; 4] = [
        Decision::Once,
        Decision::Tool,
        Decision::Requested,
        Decision::Deny,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Once => "once",
            Decision::Tool => "tool",
            Decision::Requested => "requested",
            Decision::Deny => "deny",
        }
    }

    fn parse(text: &str) -> Option<Decision> {
        Decision::ALL.into_iter().find(|d| d.as_str() == text)
    }
}

/// What the host said to a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Accept(Decision),
    Declined,
    Cancelled,
    /// Not a well-formed answer (an error response, unknown action, other fields).
    Invalid(String),
}

fn read_answer(msg: &Message) -> Answer {
    if msg.is_error() {
        return Answer::Invalid("the host answered with an error".into());
    }
    read_answer_value(&msg.result_value())
}

/// Whether an elicitation result is the person's no (decline, cancel, or the Decline choice).
pub(super) fn is_a_no(result: &Value) -> bool {
    matches!(
        read_answer_value(result),
        Answer::Declined | Answer::Cancelled | Answer::Accept(Decision::Deny)
    )
}

/// An elicitation result (`{action, content}`), as a response or as a modern input response.
fn read_answer_value(result: &Value) -> Answer {
    match result.get("action").and_then(Value::as_str) {
        Some("decline") => Answer::Declined,
        Some("cancel") => Answer::Cancelled,
        Some("accept") => {
            let content = result.get("content").and_then(Value::as_object);
            match content {
                Some(c) if c.len() == 1 => match c.get(DECISION_FIELD).and_then(Value::as_str) {
                    Some(d) => match Decision::parse(d) {
                        Some(d) => Answer::Accept(d),
                        None => Answer::Invalid("an unknown choice".into()),
                    },
                    None => Answer::Invalid(format!("no `{DECISION_FIELD}` field")),
                },
                _ => Answer::Invalid(format!("content other than one `{DECISION_FIELD}` field")),
            }
        }
        _ => Answer::Invalid("no known action".into()),
    }
}

impl Session {
    /// Whether the host declared form elicitation (legacy: in `initialize`; 2026-07-28: in its
    /// requests' `_meta`).
    pub(super) fn host_can_elicit(&self) -> bool {
        match self.era() {
            Some(Era::Modern) => return self.modern_host_can_elicit(),
            Some(Era::Legacy) => {}
            None => return false,
        }
        let Some(e) = self
            .host
            .init_params
            .as_ref()
            .and_then(|p| p.pointer("/capabilities/elicitation"))
            .and_then(Value::as_object)
        else {
            return false;
        };
        // `{}` (2025-06-18) means form; 2025-11-25 names the modes.
        e.is_empty() || e.contains_key("form")
    }

    /// The channels that may grant in this run now: the configured ones (default: both when
    /// the host can elicit, else terminal). `host` needs a host that can elicit; when no
    /// configured channel is available, the terminal is (it is the owner's, and strictest).
    pub(super) fn approval_channels(&self) -> BTreeSet<Channel> {
        let can = self.host_can_elicit();
        let mut set = match &self.cfg.approval_channels {
            Some(c) => c.clone(),
            None => BTreeSet::from([Channel::Terminal, Channel::Host]),
        };
        if !can {
            set.remove(&Channel::Host);
        }
        if set.is_empty() {
            set.insert(Channel::Terminal);
        }
        set
    }

    /// Opens a prompt for a call refused for lack of a grant, if the host channel is on and
    /// fewer than the bounded number of prompts are open. Gives the call back otherwise.
    // The call is handed back by move (no copy); boxing it would cost every prompt.
    #[allow(clippy::result_large_err)]
    pub(super) fn try_prompt(
        &mut self,
        call: Message,
        denial: &Denial,
        call_id: &str,
        arguments_digest: &str,
        arguments: &str,
    ) -> Result<(), Message> {
        let Some(epoch) = denial.current_epoch.clone() else {
            return Err(call);
        };
        if !matches!(
            denial.reason,
            DenialReason::AuthorizationRequired | DenialReason::AuthorizationStale
        ) || !self.approval_channels().contains(&Channel::Host)
            || self.approvals.prompts.len() >= self.cfg.max_open_prompts
            || self.approvals.gate.run_ended()
        {
            return Err(call);
        }
        let modern = self.era() == Some(Era::Modern);
        let (prompt_id, prompt, form) = self.new_prompt(
            call,
            denial,
            epoch.clone(),
            (call_id, arguments_digest, arguments),
            modern,
        );
        let tool = prompt.tool.clone();
        if modern {
            self.prompt_modern(prompt_id, prompt, &form);
        } else {
            let params = form.params(false);
            let line = json!({"jsonrpc": "2.0", "id": prompt_id, "method": "elicitation/create", "params": params});
            self.approvals.prompts.insert(prompt_id, prompt);
            let mut bytes = line.to_string().into_bytes();
            bytes.push(b'\n');
            self.step.out.to_host(bytes);
        }
        self.arm_prompt_timer();
        self.step.out.status(StatusEvent::ApprovalAsked {
            tool: sanitize::review(&tool).into_owned(),
            epoch: epoch.to_string(),
            call_id: sanitize::review(call_id).into_owned(),
            waits_s: self.cfg.approval_timeout.as_secs(),
        });
        self.publish();
        Ok(())
    }

    /// The form's text and a prompt for a call refused with `denial` (shared by both eras).
    pub(super) fn new_prompt(
        &mut self,
        call: Message,
        denial: &Denial,
        epoch: EpochId,
        (call_id, arguments_digest, arguments): (&str, &str, &str),
        modern: bool,
    ) -> (String, Prompt, Form) {
        let host_id = call.id().expect("request").to_owned();
        let tool = denial.tool.clone();
        let mut requested = self
            .approvals
            .gate
            .pending_requests(serving(&self.server, &self.catalogs))
            .0;
        requested.insert(tool.clone());
        let prompt_id = format!("{PROMPT_ID_PREFIX}{}", self.mint_id());
        let form = self.form(&tool, &epoch, &requested, arguments);
        let deadline_ms = self.now() + self.cfg.approval_timeout.as_millis() as u64;
        let prompt = Prompt {
            call,
            host_id,
            call_id: call_id.to_string(),
            tool,
            arguments_digest: arguments_digest.to_string(),
            epoch,
            requested,
            deadline_ms,
            denial: denial.clone(),
            modern,
        };
        (prompt_id, prompt, form)
    }

    /// A host response whose id is a string: ours if it names an open prompt. Anything else
    /// is refused (and never grants).
    pub(super) fn on_prompt_answer(&mut self, id_text: &str, msg: &Message) -> bool {
        let Ok(id) = serde_json::from_str::<String>(id_text) else {
            return false;
        };
        if !id.starts_with(PROMPT_ID_PREFIX) {
            return false;
        }
        let Some(prompt) = self.approvals.prompts.remove(&id) else {
            self.step.out.status(StatusEvent::PromptNotOpen {
                id: sanitize::review(&id.chars().take(80).collect::<String>()).into_owned(),
            });
            return true;
        };
        if prompt.modern {
            // A modern prompt is answered by the call's retry, never by a response.
            self.approvals.prompts.insert(id, prompt);
            self.step.out.status(StatusEvent::PromptWasInputRequest);
            return true;
        }
        self.answered(prompt, read_answer(msg));
        true
    }

    /// A modern prompt's answer, as its retry carried it under the prompt's key.
    pub(super) fn on_prompt_answer_value(&mut self, prompt: Prompt, answer: &Value) {
        self.answered(prompt, read_answer_value(answer));
    }

    fn answered(&mut self, prompt: Prompt, answer: Answer) {
        let outcome = match answer {
            Answer::Accept(Decision::Deny) => "denied in the host".to_string(),
            Answer::Declined => "declined in the host".to_string(),
            Answer::Cancelled => "cancelled in the host".to_string(),
            Answer::Invalid(why) => {
                let outcome = format!("invalid answer from the host ({why})");
                return self.refuse_prompted(prompt, &outcome);
            }
            Answer::Accept(decision) => return self.prompt_accepted(prompt, decision),
        };
        self.refuse_declined(prompt, &outcome);
    }

    fn prompt_accepted(&mut self, prompt: Prompt, decision: Decision) {
        if self.current_epoch() != Some(prompt.epoch.as_str()) {
            let outcome = format!(
                "approved in the host for epoch {}, but the server was rebuilt during the prompt (now {}); the answer is void",
                prompt.epoch,
                self.current_epoch().unwrap_or("not running")
            );
            self.refuse_prompted(prompt, &outcome);
            return;
        }
        let (now, id) = (self.step.now.wall_ms, self.mint_id());
        let epoch = prompt.epoch.clone();
        let result = match decision {
            Decision::Once => self.approvals.gate.approve_call(
                serving(&self.server, &self.catalogs),
                CallApprovalRequest {
                    epoch,
                    tool: prompt.tool.clone(),
                    arguments_digest: prompt.arguments_digest.clone(),
                    call_id: Some(prompt.call_id.clone()),
                    channel: Channel::Host,
                },
                now,
                id,
            ),
            Decision::Tool | Decision::Requested => {
                let tools: BTreeSet<String> = if decision == Decision::Tool {
                    BTreeSet::from([prompt.tool.clone()])
                } else {
                    prompt.requested.clone()
                };
                let credential_scopes = tools
                    .iter()
                    .flat_map(|t| self.approvals.gate.policy().scopes_for(t))
                    .collect();
                self.approvals.gate.approve_via(
                    serving(&self.server, &self.catalogs),
                    ApprovalRequest {
                        epoch,
                        tools,
                        credential_scopes,
                    },
                    Channel::Host,
                    now,
                    id,
                )
            }
            Decision::Deny => unreachable!("deny is refused before"),
        };
        match result {
            Ok(grant) => {
                debug_assert!(grant.kind == GrantKind::Call || decision != Decision::Once);
                self.approvals
                    .denied_calls
                    .retain(|d| d.call_id != prompt.call_id);
                self.record_grant(&grant, "host elicitation");
                // Judged again: forwarded under the new grant (never prompts twice).
                self.judge_call(prompt.call, false);
                // Other calls whose forms the grant now covers (the tools it named) run too,
                // their forms withdrawn.
                self.release_covered_prompts();
            }
            Err(e) => {
                let outcome = format!("approved in the host, but no grant: {e}");
                self.refuse_prompted(prompt, &outcome);
            }
        }
    }

    /// The call of a prompt that yielded no grant, though the person did not say no (the code
    /// was rebuilt or exited during the prompt, the host's answer was not a choice, the session
    /// ends): its denial says what happened. A person was asked: never how to approve elsewhere.
    pub(super) fn refuse_prompted(&mut self, prompt: Prompt, outcome: &str) {
        self.refuse_prompted_as(prompt, outcome, false);
    }

    /// The call of a prompt the person said no to (declined, cancelled, denied, or let time
    /// out): the model is told the person declined it and not to retry it or seek approval
    /// another way.
    pub(super) fn refuse_declined(&mut self, prompt: Prompt, outcome: &str) {
        self.refuse_prompted_as(prompt, outcome, true);
    }

    fn refuse_prompted_as(&mut self, prompt: Prompt, outcome: &str, declined: bool) {
        let denial = &prompt.denial;
        let mut payload = denial.payload();
        payload["approval"] = json!({"channel": "host", "outcome": outcome, "declined": declined});
        let hint = if declined {
            payload["retry"] = json!(crate::policy::approval::RETRY_DECLINED);
            crate::policy::approval::declined_hint(&prompt.tool, outcome)
        } else {
            format!(
                "Approval was asked in the host: {outcome}. The call was not run; calling it again asks the person again."
            )
        };
        self.record_prompt_closed(&prompt, outcome);
        self.step.out.status(StatusEvent::PromptRefused {
            tool: sanitize::review(&prompt.tool).into_owned(),
            reason: denial.reason.as_str().to_string(),
            outcome: sanitize::line(outcome).into_owned(),
        });
        let result = self.tool_error(&payload, &hint);
        self.step
            .out
            .to_host(envelope::result_line(&prompt.host_id, &result));
        self.publish();
    }

    /// A grant came through another channel (the terminal): calls waiting for a prompt that it
    /// now covers are judged again at once, and their prompts withdrawn from the host.
    pub(super) fn release_covered_prompts(&mut self) {
        let covered: Vec<String> = self
            .approvals
            .prompts
            .iter()
            .filter(|(_, p)| {
                self.current_epoch() == Some(p.epoch.as_str())
                    && self
                        .approvals
                        .gate
                        .has_grant_for(&p.tool, Some(&p.arguments_digest))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in covered {
            if let Some(p) = self.approvals.prompts.remove(&id) {
                if p.modern {
                    // Answered already (input_required): the retry finds the grant.
                    continue;
                }
                self.withdraw_prompt(
                    &id,
                    "covered by a grant given since (in another form or channel)",
                );
                self.approvals
                    .denied_calls
                    .retain(|d| d.call_id != p.call_id);
                self.judge_call(p.call, false);
            }
        }
    }

    /// The code a prompt asked about is gone (its server was replaced or exited): the prompt
    /// is withdrawn from the host (its form closes instead of asking about code that no longer
    /// runs) and its call refused, saying why; an answer that still comes finds no open prompt
    /// and grants nothing. Modern prompts (answered by the call's retry, not by a form the
    /// supervisor holds open) are left to the retry, which is refused as void.
    pub(super) fn withdraw_prompts_of(&mut self, epoch: &str, outcome: &str) {
        let stale: Vec<String> = self
            .approvals
            .prompts
            .iter()
            .filter(|(_, p)| !p.modern && p.epoch == epoch)
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some(p) = self.approvals.prompts.remove(&id) {
                self.withdraw_prompt(&id, outcome);
                self.refuse_prompted(p, outcome);
            }
        }
    }

    /// Tells the host a prompt is no longer wanted (`notifications/cancelled`), so its form
    /// closes; an answer that still comes finds no open prompt.
    pub(super) fn withdraw_prompt(&mut self, id: &str, reason: &str) {
        self.step.out.notify_host(envelope::notification_line(
            "notifications/cancelled",
            Some(&json!({"requestId": id, "reason": reason})),
        ));
    }

    /// Timer: prompts past their deadline are closed and their calls refused.
    /// One timer for all open prompts, armed for the earliest deadline (like held requests).
    fn arm_prompt_timer(&mut self) {
        let Some(earliest) = self.approvals.prompts.values().map(|p| p.deadline_ms).min() else {
            return;
        };
        if self
            .step
            .armed
            .prompts
            .is_some_and(|armed| armed <= earliest)
        {
            return;
        }
        self.step.armed.prompts = Some(earliest);
        let wait = std::time::Duration::from_millis(earliest.saturating_sub(self.now()));
        self.step.out.schedule(wait, Timer::ApprovalDeadline);
    }

    pub(super) fn expire_prompts(&mut self) {
        self.step.armed.prompts = None;
        let now = self.now();
        let due: Vec<String> = self
            .approvals
            .prompts
            .iter()
            .filter(|(_, p)| p.deadline_ms <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            if let Some(p) = self.approvals.prompts.remove(&id) {
                if p.modern {
                    // Its call was answered with the form and never retried: recorded as
                    // refused now (a later retry finds nothing open).
                    let secs = self.cfg.approval_timeout.as_secs();
                    self.record_prompt_closed(
                        &p,
                        &format!("not retried in the host within {secs}s"),
                    );
                    continue;
                }
                self.withdraw_prompt(&id, "no answer in time");
                let secs = self.cfg.approval_timeout.as_secs();
                self.refuse_declined(p, &format!("timed out in the host after {secs}s"));
            }
        }
        self.arm_prompt_timer();
    }

    /// The session ends: every waiting call is answered (a modern one was: it is recorded).
    pub(super) fn fail_prompts(&mut self, why: &str) {
        let open = std::mem::take(&mut self.approvals.prompts);
        for p in open.into_values() {
            if p.modern {
                self.record_prompt_closed(&p, why);
            } else {
                self.refuse_prompted(p, why);
            }
        }
    }

    /// Open prompts (status document).
    pub(super) fn open_prompts(&self) -> Vec<Value> {
        self.approvals
            .prompts
            .iter()
            .map(|(id, p)| json!({"id": id, "callId": p.call_id, "tool": p.tool, "epoch": p.epoch}))
            .collect()
    }
}
