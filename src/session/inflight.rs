//! In-flight room: requests whose server was replaced or exited while they ran.
//!
//! Owns: the one answer each such request gets (`epoch_transition`, never a replay) and its
//! audit record. Must not touch: restarts themselves (lifecycle), I/O (effects are data: `effect`).

use serde_json::json;

use super::*;
use crate::audit::records;
use crate::wire::proxy::envelope;

impl Session {
    /// Every request open at the server of `epoch` (`requests`, taken from it as it goes)
    /// gets an answer now; none is replayed.
    pub(super) fn answer_in_flight(
        &mut self,
        requests: Requests,
        epoch: &str,
        new_epoch: Option<&str>,
        cause: &str,
        exit: Option<&str>,
    ) {
        for (id, p) in requests {
            if self
                .host
                .initialize
                .as_ref()
                .is_some_and(|i| i.at_server == Some(id))
            {
                self.initialize_lost_its_server(id, epoch, cause);
                continue;
            }
            if let OpenRequest::Host {
                host_id,
                method,
                call,
                ..
            } = p
            {
                if method == "subscriptions/listen" {
                    continue; // carried to the next child
                }
                let payload = json!({
                    "error": "epoch_transition",
                    "reason": if cause == "replaced" { "the server was replaced while this request was in flight" } else { "the server exited while this request was in flight" },
                    "cause": cause,
                    "oldEpoch": epoch,
                    "newEpoch": new_epoch,
                    "exit": exit,
                    "mayHaveRun": true,
                    "retried": false,
                    "retry": "refresh tool metadata, check whether the call took effect, then decide whether to call again",
                });
                if let Some(call) = call {
                    let record = records::CallFailedEpochTransition {
                        call_id: json!(call.call_id),
                        tool: call.tool.clone(),
                        old_epoch: Some(epoch.to_string()),
                        new_epoch: new_epoch.map(str::to_string),
                        cause: Some(cause.to_string()),
                    };
                    self.audit_record(
                        audit::CALL_FAILED_EPOCH_TRANSITION,
                        Some(epoch),
                        records::data(&record),
                    );
                    let what = if cause == "replaced" {
                        "was replaced"
                    } else {
                        "exited"
                    };
                    let hint = format!(
                        "The server running epoch {epoch} {what} while `{}` was in flight; it may or may not have run and was not retried.",
                        call.tool
                    );
                    self.step.out.to_host(envelope::result_line(
                        &host_id,
                        &self.tool_error(&payload, &hint),
                    ));
                } else {
                    self.step.out.to_host(envelope::error_line(
                        Some(&host_id),
                        codes::EPOCH_TRANSITION,
                        &format!("server {cause} while the request was in flight (epoch {epoch})"),
                        payload,
                    ));
                }
            }
        }
        for l in &mut self.host.listens {
            l.child_id = None;
        }
        // The server's requests still open at the host are void: the supervisor, which
        // issued them to the host, withdraws them (an elicitation form would stay open).
        let mut void: Vec<u64> = (self.host.server_requests.open.iter())
            .filter(|(_, (e, _))| e == epoch)
            .map(|(id, _)| *id)
            .collect();
        void.sort_unstable();
        let what = match cause {
            "exited" => "exited".to_string(),
            other => format!("was {other}"),
        };
        for id in void {
            self.host.server_requests.open.remove(&id);
            let why = format!("the server that asked (epoch {epoch}) {what}");
            let params = json!({"requestId": id, "reason": why});
            self.step.out.notify_host(envelope::notification_line(
                "notifications/cancelled",
                Some(&params),
            ));
        }
        self.host.server_requests.answered.clear();
        self.host.server_requests.overflow_told = false;
        // Cancelled calls of this server get no late answer now.
        self.host.cancelled_calls.retain(|(_, e, _)| e != epoch);
        self.host.list_pages.clear();
        self.host.list_next = None;
    }

    /// The request that carried the host's `initialize` (our id `id`) is gone with its server.
    /// The session goes on: the `initialize` waits again, looked at once this transition is
    /// over (a timer due now), when it is known whether a server is coming. A closing or
    /// `disconnect` session answers it now.
    fn initialize_lost_its_server(&mut self, id: u64, epoch: &str, cause: &str) {
        if self.lifecycle != Lifecycle::Stopping && self.cfg.restart != Restart::Disconnect {
            let now = self.now();
            if let Some(init) = &mut self.host.initialize {
                init.due_ms = now;
            }
            // After the transition (a timer due now): the next server may be on its way.
            return self.step.out.schedule(Duration::ZERO, Timer::HandshakeWait);
        }
        if let Some(init) = self.take_initialize_carried_by(id) {
            self.step.out.to_host(envelope::error_line(
                Some(&init.host_id),
                codes::EPOCH_TRANSITION,
                &format!("server {cause} during the handshake"),
                json!({"error": "epoch_transition", "oldEpoch": epoch}),
            ));
        }
    }
}
