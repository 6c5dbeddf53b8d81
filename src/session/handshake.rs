//! Handshake room: our `initialize` (or modern `server/discover`) to a fresh server, its
//! deadline, and what happens when a server cannot serve (it refuses the handshake or never
//! answers it): it is stopped and requests are answered at once with why, or, for a server that
//! refuses only the modern handshake, the host's fallback `initialize` is passed to it.
//!
//! Must not touch: I/O (effects are data: `effect`), gating, what the host is told before a server exists (the
//! first-contact room).

use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::wire::proxy::envelope::{self, Message};

impl Session {
    /// Sends our handshake to the fresh server of `epoch` (`initialize` with the host's params,
    /// or modern `server/discover`) and arms its deadline; returns our id of it.
    pub(super) fn send_handshake(&mut self, epoch: EpochId, modern: bool, params: &Value) -> u64 {
        let asked = (!modern)
            .then(|| params.get("protocolVersion").and_then(Value::as_str))
            .flatten()
            .map(str::to_string);
        let id = self.alloc(OpenRequest::Handshake { modern, asked });
        let due = self.now() + self.handshake_deadline().as_millis() as u64;
        if let Some(c) = self.server.child_mut() {
            c.phase.handshake_sent(due);
        }
        self.arm_server_timer(due);
        let method = if modern {
            "server/discover"
        } else {
            "initialize"
        };
        self.step
            .out
            .to_child(&epoch, envelope::request_line(id, method, params));
        id
    }

    /// Keeps the server's `initialize` answer under the version it was asked for: a later host
    /// asking for the same version may be given it while a build runs (bounded, see
    /// [`RECORDED_HANDSHAKES`]). Only an answer whose `protocolVersion` is a string is kept.
    pub(super) fn record_handshake(&mut self, epoch: &str, asked: Option<&str>, result: &Value) {
        let Some(requested) = asked.filter(|v| v.len() <= 64).map(str::to_string) else {
            return;
        };
        if !result.get("protocolVersion").is_some_and(Value::is_string) {
            return;
        }
        if result.to_string().len() > RECORDED_HANDSHAKE_BYTES {
            return;
        }
        let Some(identity) = self
            .server
            .child()
            .map(|c| c.record.identity_digest.clone())
        else {
            return;
        };
        let recorded = RecordedHandshake {
            result: result.clone(),
            epoch: epoch.to_string(),
            identity_digest: identity,
            recorded_at: self.step.now.timestamp(),
        };
        let kept = &mut self.recorded.handshakes;
        kept.insert(requested, recorded);
        while kept.len() > RECORDED_HANDSHAKES {
            let oldest = kept
                .iter()
                .min_by(|a, b| a.1.recorded_at.cmp(&b.1.recorded_at))
                .map(|(k, _)| k.clone())
                .expect("not empty");
            kept.remove(&oldest);
        }
        let facts = self.recorded.clone();
        self.step.out.record_facts(&facts);
    }

    /// How long a server has to answer our handshake or a catalog page: the first-start
    /// budget, at least [`MIN_HANDSHAKE_DEADLINE`] (a budget of 0 means "requests never wait",
    /// not "no server may start").
    pub(super) fn handshake_deadline(&self) -> Duration {
        self.cfg.first_start_budget.max(MIN_HANDSHAKE_DEADLINE)
    }

    /// One timer for the current server's owed answer (handshake, catalog page), armed for the
    /// earliest such deadline (a later one is armed again when it fires).
    pub(super) fn arm_server_timer(&mut self, due: u64) {
        if self.step.armed.server.is_some_and(|armed| armed <= due) {
            return;
        }
        self.step.armed.server = Some(due);
        let wait = Duration::from_millis(due.saturating_sub(self.now()));
        self.step.out.schedule(wait, Timer::ServerDeadline);
    }

    /// The current server's request of its phase (handshake, catalog page) reached its deadline.
    pub(super) fn server_deadline_over(&mut self) {
        self.step.armed.server = None;
        let now = self.now();
        let Some(c) = self.server.child() else { return };
        match c.phase.answer_due_ms() {
            None => return,
            // A later request's deadline (or a later server's): armed again for it.
            Some(due) if due > now => return self.arm_server_timer(due),
            Some(_) => {}
        }
        match c.phase {
            ChildPhase::Handshaking { .. } => self.handshake_deadline_over(),
            ChildPhase::Up(Tools::Fetching(_)) => self.catalog_deadline_over(),
            _ => {}
        }
    }

    /// A server still handshaking at its deadline never answered: it is stopped as one that
    /// cannot serve (held requests would otherwise each wait out a budget, again and again).
    fn handshake_deadline_over(&mut self) {
        if self.discovery_in_flight() {
            return self.discovery_failed(None);
        }
        let secs = self.handshake_deadline().as_secs_f64();
        self.server_cannot_serve(format!(
            "did not answer `initialize` within {secs} s (the first-start budget); does it read stdin and write only JSON-RPC to stdout?"
        ));
    }

    /// Our modern `server/discover` is in flight to the current server.
    pub(super) fn discovery_in_flight(&self) -> bool {
        let Some(c) = self.server.child() else {
            return false;
        };
        matches!(c.phase, ChildPhase::Handshaking { .. })
            && c.requests
                .values()
                .any(|p| matches!(p, OpenRequest::Handshake { modern: true, .. }))
    }

    /// The server did not take our `server/discover` (it refused it, or its deadline passed):
    /// it may still speak `initialize`, so it waits for one again. The host's waiting
    /// `server/discover` requests get the server's own refusal (or ours, saying to use
    /// `initialize`): the host falls back now, not after the budget.
    pub(super) fn discovery_failed(&mut self, refusal: Option<&Message>) {
        if self.host.negotiated.is_some() && self.era() == Some(Era::Modern) {
            // The host is on the modern protocol already and sends no fallback `initialize`:
            // a server that refuses discovery needs a new connection (whose client falls back);
            // a silent one cannot serve at all.
            return match refusal {
                // "Method not found": it speaks only `initialize`, which a new connection
                // falls back to.
                Some(r) if error_code(r) == Some(-32601) => self.close_connection(
                    "the new server refuses server/discover (it speaks only initialize); the host must reconnect",
                ),
                // Another error (a broken handler in the new code): it cannot serve now; the
                // next build may.
                Some(r) => {
                    let said: String = String::from_utf8_lossy(&r.to_line())
                        .trim()
                        .chars()
                        .take(300)
                        .collect();
                    self.server_cannot_serve(format!(
                        "refused server/discover: {}",
                        crate::screen::sanitize::line(&said)
                    ))
                }
                None => {
                    let secs = self.handshake_deadline().as_secs_f64();
                    self.server_cannot_serve(format!(
                        "did not answer `server/discover` within {secs} s (the first-start budget)"
                    ))
                }
            };
        }
        if refusal.is_none() {
            self.step.out.status(StatusEvent::DiscoverUnanswered);
        }
        let Some(c) = self.server.child_mut() else {
            return;
        };
        c.phase.discover_failed();
        // A late answer to it is dropped as one to an unknown id.
        c.requests
            .retain(|_, p| !matches!(p, OpenRequest::Handshake { modern: true, .. }));
        let mut kept = std::collections::VecDeque::new();
        while let Some(h) = self.host.held.pop_front() {
            if h.msg.method() != Some("server/discover") {
                kept.push_back(h);
                continue;
            }
            match refusal {
                Some(r) => {
                    let id = h.msg.id().expect("request").to_owned();
                    self.forget_probe_era();
                    self.step.out.to_host(r.to_line_with_id(&id));
                }
                None => self.refuse_discover(h.msg),
            }
        }
        self.host.held = kept;
    }

    /// The running server cannot serve (it refused our handshake or never answered it): it is
    /// stopped, and no server runs until the next successful build or `cargo mcp-dev restart`
    /// (restarting the same code would fail the same way). Requests are answered with why.
    pub(super) fn server_cannot_serve(&mut self, why: String) {
        let Some(mut child) = self.server.take_running() else {
            return;
        };
        self.step.out.status(StatusEvent::ServerStopped {
            pid: child.pid,
            epoch: child.epoch.to_string(),
            why: why.to_string(),
        });
        self.approvals.gate.epoch_changed();
        let requests = std::mem::take(&mut child.requests);
        self.answer_in_flight(requests, &child.epoch, None, "stopped", Some(&why));
        self.record_exit(&child, "handshake failed", None);
        self.step.out.stop(&child.epoch, STOP_GRACE_UNANSWERED);
        if self.lifecycle != Lifecycle::Stopping {
            self.lifecycle = Lifecycle::StartFailed {
                message: format!("the server {why}"),
            };
        }
        self.fail_held();
        self.publish();
    }
}

/// The `error.code` of an error answer.
pub(super) fn error_code(msg: &Message) -> Option<i64> {
    serde_json::from_slice::<Value>(&msg.to_line())
        .ok()?
        .pointer("/error/code")?
        .as_i64()
}
