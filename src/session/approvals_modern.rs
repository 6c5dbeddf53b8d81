//! Modern approvals room: the in-host channel on a 2026-07-28 connection, where a server never
//! sends the host a request. A gated call that needs a grant is answered at once with
//! `resultType: "input_required"`, its one input request the approval form
//! (`elicitation/create`), and `requestState` naming the prompt; the host asks its person and
//! retries the same call carrying `inputResponses` and that `requestState`.
//!
//! Owns: turning a refused call into that result, and matching a retry to the one open prompt it
//! answers (same tool, same arguments digest, the prompt's epoch, once). Must not touch: the
//! gate's rules, the legacy prompt flow (`approvals`), I/O (effects are data: `effect`).
//!
//! The retry's `requestState` is only a key into the supervisor's own table of open prompts:
//! nothing in it is trusted. A retry naming no open prompt, another call's prompt, or carrying
//! anything but a well-formed answer under the prompt's key grants nothing. A `requestState`
//! that is not ours (a server's own multi-round request) is passed through untouched.

use serde_json::{Value, json};

use super::approvals::{Form, PROMPT_ID_PREFIX};
use super::*;
use crate::audit::records;
use crate::base::hashing;
use crate::screen::sanitize;
use crate::wire::proxy::envelope::{self, Message};

/// Where a call's params carry a multi-round answer.
const REQUEST_STATE: &str = "requestState";
const INPUT_RESPONSES: &str = "inputResponses";

impl Session {
    /// A prompt closed without a grant: its call is recorded as refused, asked in the host,
    /// with how it ended (`authorization_denied`, channel `host`). Nothing is sent.
    pub(super) fn record_prompt_closed(&mut self, prompt: &Prompt, outcome: &str) {
        let denial = &prompt.denial;
        let record = records::AuthorizationDenied {
            call_id: json!(prompt.call_id),
            tool: prompt.tool.clone(),
            reason: denial.reason.as_str().into(),
            approved_epoch: denial.approved_epoch.as_deref().map(str::to_string),
            current_epoch: denial.current_epoch.as_deref().map(str::to_string),
            arguments_digest: Some(prompt.arguments_digest.clone()),
            channel: Some(crate::policy::approval::Channel::Host.as_str().into()),
            outcome: Some(outcome.to_string()),
            mismatches: None,
        };
        // Under the epoch it asked about (a rebuild may have come since).
        let epoch = prompt.epoch.to_string();
        self.audit_record(
            audit::AUTHORIZATION_DENIED,
            Some(epoch.as_str()),
            records::data(&record),
        );
    }

    /// The host cancelled a call that waits for a prompt: the prompt is closed (its form
    /// withdrawn from the host; a later answer finds nothing and grants nothing) and the call
    /// recorded as refused, cancelled by the host. The host expects no answer to it.
    pub(super) fn drop_prompt_of_call(&mut self, request_id_text: &str) {
        let ids: Vec<String> = self
            .approvals
            .prompts
            .iter()
            .filter(|(_, p)| !p.modern && p.host_id.get() == request_id_text)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            if let Some(p) = self.approvals.prompts.remove(&id) {
                self.withdraw_prompt(&id, "the call was cancelled");
                self.record_prompt_closed(&p, "cancelled by the host");
                self.publish();
            }
        }
    }

    /// Whether a modern host declared form elicitation in the `_meta` of its requests.
    pub(super) fn modern_host_can_elicit(&self) -> bool {
        let Some(e) = self
            .host
            .modern_meta
            .as_ref()
            .and_then(|m| m.get(protocol::CLIENT_CAPABILITIES))
            .and_then(|c| c.get("elicitation"))
            .and_then(Value::as_object)
        else {
            return false;
        };
        e.is_empty() || e.contains_key("form")
    }

    /// Answers a refused call with the approval form as its one input request, and remembers
    /// the prompt until the retry or the deadline. The call itself is not held.
    pub(super) fn prompt_modern(&mut self, prompt_id: String, prompt: Prompt, form: &Form) {
        let host_id = prompt.host_id.clone();
        let params = form.params(true);
        let result = json!({
            "resultType": "input_required",
            "inputRequests": {prompt_id.clone(): {"method": "elicitation/create", "params": params}},
            REQUEST_STATE: prompt_id,
        });
        self.approvals.prompts.insert(prompt_id, prompt);
        self.step
            .out
            .to_host(envelope::result_line(&host_id, &result));
    }

    /// A modern `tools/call` whose `requestState` is one of ours: the retry of a call that was
    /// answered with the approval form. Returns the call back when the state is not ours.
    pub(super) fn on_prompt_retry(&mut self, msg: Message) -> Option<Message> {
        let params = msg.params_value();
        let ours = params
            .get(REQUEST_STATE)
            .and_then(Value::as_str)
            .filter(|s| s.starts_with(PROMPT_ID_PREFIX))
            .map(str::to_string);
        let Some(prompt_id) = ours else {
            return Some(msg);
        };
        // No target: not a retry of anything (judged, and refused, as a call).
        let Some((tool, arguments)) = envelope::call_target(msg.params()) else {
            return Some(msg);
        };
        let digest = hashing::sha256_bytes(arguments.map(|a| a.get()).unwrap_or("null").as_bytes());
        let host_id = msg.id().expect("request").to_owned();
        let open = self
            .approvals
            .prompts
            .get(&prompt_id)
            .is_some_and(|p| p.modern && p.tool == tool && p.arguments_digest == digest);
        if !open {
            self.step.out.status(StatusEvent::RetryPromptNotOpen {
                tool: sanitize::review(&tool).into_owned(),
                prompt: sanitize::review(&prompt_id.chars().take(80).collect::<String>())
                    .into_owned(),
            });
            // The person's no that came after the form closed is still their no: the call is
            // refused as declined (never judged, never told how to approve elsewhere).
            let late_answer = params
                .get(INPUT_RESPONSES)
                .and_then(|r| r.get(&prompt_id))
                .cloned();
            if let Some(answer) = late_answer {
                // The person answered a form that had closed (its deadline passed, or it was
                // answered or withdrawn): a no is still their no; a yes grants nothing (the
                // form it answers is gone), and the model is told to call again, which asks
                // the person again; never how to approve another way (issue 33).
                self.refuse_late_answer(
                    &host_id,
                    &tool,
                    &digest,
                    super::approvals::is_a_no(&answer),
                );
                return None;
            }
            // Judged as a plain call (it cannot prompt again): without a grant, refused.
            let stripped = without_round_trip(msg);
            self.judge_call(stripped, false);
            return None;
        }
        let mut prompt = self
            .approvals
            .prompts
            .remove(&prompt_id)
            .expect("checked open");
        let answer = params
            .get(INPUT_RESPONSES)
            .and_then(|r| r.as_object())
            .filter(|r| r.len() == 1)
            .and_then(|r| r.get(&prompt_id))
            .cloned();
        // The retry (a new JSON-RPC id) is the call that runs or is refused from here on.
        prompt.call = without_round_trip(msg);
        prompt.host_id = host_id;
        match answer {
            Some(a) => self.on_prompt_answer_value(prompt, &a),
            None => self.refuse_prompted(
                prompt,
                "invalid answer from the host (no response under the prompt's key)",
            ),
        }
        None
    }
}

impl Session {
    /// A retry carrying the person's answer to a form that is no longer open: refused, recorded
    /// (`authorization_denied`, channel `host`). A no is refused as declined; a yes as too late
    /// (the call may be made again, which shows a new form).
    fn refuse_late_answer(&mut self, host_id: &RawId, tool: &str, digest: &str, no: bool) {
        let outcome = if no {
            "declined in the host (after the form had closed)"
        } else {
            "approved in the host after the form had closed (it had timed out or was withdrawn)"
        };
        let denial = crate::policy::approval::Denial {
            reason: crate::policy::approval::DenialReason::AuthorizationRequired,
            tool: tool.to_string(),
            approved_epoch: None,
            current_epoch: self
                .current_epoch()
                .map(crate::identity::epoch::EpochId::from),
            host_catalog: None,
            current_catalog: None,
            credential_scopes: self
                .approvals
                .gate
                .policy()
                .scopes_for(tool)
                .into_iter()
                .collect(),
            authorization: None,
            mismatches: Vec::new(),
        };
        let mut payload = denial.payload();
        payload["approval"] = json!({"channel": "host", "outcome": outcome, "declined": no});
        payload["retry"] = json!(if no {
            crate::policy::approval::RETRY_DECLINED
        } else {
            crate::policy::approval::RETRY_LATE_ANSWER
        });
        let record = records::AuthorizationDenied {
            call_id: json!(host_id.get()),
            tool: tool.to_string(),
            reason: denial.reason.as_str().into(),
            approved_epoch: None,
            current_epoch: denial.current_epoch.as_deref().map(str::to_string),
            arguments_digest: Some(digest.to_string()),
            channel: Some(crate::policy::approval::Channel::Host.as_str().into()),
            outcome: Some(outcome.into()),
            mismatches: None,
        };
        let epoch = self.current_epoch().map(str::to_string);
        self.audit_record(
            audit::AUTHORIZATION_DENIED,
            epoch.as_deref(),
            records::data(&record),
        );
        let hint = if no {
            crate::policy::approval::declined_hint(tool, outcome)
        } else {
            crate::policy::approval::late_answer_hint(tool)
        };
        let result = self.tool_error(&payload, &hint);
        self.step
            .out
            .to_host(envelope::result_line(host_id, &result));
        self.publish();
    }
}

/// The call as the server must see it: the supervisor's round trip is not the server's. The
/// arguments stay the bytes whose digest was judged and shown (no tree: a large integer or
/// the sender's spacing would otherwise change on the way).
fn without_round_trip(mut msg: Message) -> Message {
    msg.remove_params_members(&[REQUEST_STATE, INPUT_RESPONSES]);
    msg
}
