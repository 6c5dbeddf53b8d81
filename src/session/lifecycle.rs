//! Lifecycle room: builds, starting and replacing servers, exits, the crash loop, shutdown.
//!
//! Owns: [`Lifecycle`], [`Builds`], the child slot, epochs minted for new servers and the
//! audit records of those transitions. Must not touch: message contents (host and child rooms),
//! gating decisions (the gate), I/O (effects are data: `effect`).

use std::time::Duration;

use serde_json::json;

use super::*;
use crate::audit::records::ServerExited;
use crate::base::hashing::short;
use crate::identity::epoch::LaunchRecord;

impl Session {
    /// A burst of changes began: with no build running, build at once (see [`EarlyBuild`]).
    pub(super) fn on_sources_changing(&mut self) {
        self.build.burst = Burst::Open;
        if self.lifecycle == Lifecycle::Stopping || self.build.runs != Builds::Idle {
            return;
        }
        self.request_build();
    }

    pub(super) fn on_sources_changed(&mut self, paths: Vec<String>, changed_after_edge: bool) {
        if self.lifecycle == Lifecycle::Stopping {
            return;
        }
        self.build.burst = Burst::Settled;
        self.step.out.verbose(StatusEvent::ChangeDetected {
            paths: paths.iter().take(3).cloned().collect(),
        });
        if self.lifecycle == Lifecycle::CrashLoop {
            self.leave_crash_loop();
        }
        let Some(mut early) = self.build.early.take() else {
            return self.request_build();
        };
        // A change seen after the leading edge may have reached the build half-way.
        early.stale |= changed_after_edge;
        match (early.stale, early.held.take()) {
            // Still running, and it saw the final files: from now on an ordinary build.
            (false, None) => {}
            (false, Some(result)) => self.on_build_finished(*result),
            // Still running on files that changed under it: set aside when it ends.
            (true, None) => self.build.early = Some(early),
            (true, Some(_)) => self.set_aside_early_build(),
        }
    }

    /// An early build that may have read a file mid-save is not used: build the settled files.
    fn set_aside_early_build(&mut self) {
        self.build.early = None;
        self.build.runs = Builds::Idle;
        self.step.out.set_aside_build();
        self.step.out.verbose(StatusEvent::EarlyBuildOutdated);
        self.request_build();
        self.publish();
    }

    pub(super) fn request_build(&mut self) {
        match self.build.runs {
            // Changes during a build queue exactly one follow-up build.
            Builds::Running | Builds::RunningWithFollowUp => {
                self.build.runs = Builds::RunningWithFollowUp
            }
            Builds::Idle => {
                // Any build that starts while a burst is open (at its leading edge, or a
                // rebuild after one was set aside) waits for the burst to settle.
                if self.build.burst == Burst::Open {
                    self.build.early = Some(EarlyBuild {
                        stale: false,
                        held: None,
                    });
                }
                self.build.runs = Builds::Running;
                self.step.out.start_build();
            }
        }
    }

    pub(super) fn on_build_finished(&mut self, result: BuildResult) {
        if let Some(early) = self.build.early.as_mut() {
            if self.lifecycle == Lifecycle::Stopping {
                self.build.early = None;
                self.build.runs = Builds::Idle;
                return;
            }
            if early.stale {
                return self.set_aside_early_build();
            }
            // Done before its burst settled: the quiet period still decides whether it is used.
            early.held = Some(Box::new(result));
            return;
        }
        let follow_up = self.build.runs == Builds::RunningWithFollowUp;
        self.build.runs = Builds::Idle;
        self.server.build_finished();
        if self.lifecycle == Lifecycle::Stopping {
            return;
        }
        let epoch = self.current_epoch().map(str::to_string);
        match result {
            BuildResult::Error(message) => {
                let line = format!("build failed: {message}");
                self.step.out.status(StatusEvent::BuildError {
                    message: message.clone(),
                });
                self.build.last_line = Some(line);
                self.build_broken(message, None);
            }
            BuildResult::Failed {
                line,
                errors,
                first_location,
                first_error,
                last_good,
            } => {
                self.step
                    .out
                    .status(StatusEvent::BuildReport { line: line.clone() });
                self.build.last_line = Some(line);
                self.audit_record(
                    audit::BUILD_COMPLETED,
                    epoch.as_deref(),
                    json!({"outcome": "failed", "errors": errors, "file": first_location}),
                );
                let message = match (&first_location, &first_error) {
                    (Some(at), Some(e)) => format!("{at}: {e}"),
                    (None, Some(e)) => e.clone(),
                    (Some(at), None) => format!("{errors} error(s), the first at {at}"),
                    (None, None) => format!("{errors} error(s)"),
                };
                self.build_broken(message, last_good.map(|r| *r));
            }
            BuildResult::Complete {
                line,
                record,
                changed,
                warnings,
            } => {
                self.step
                    .out
                    .status(StatusEvent::BuildReport { line: line.clone() });
                self.build.last_line = Some(line);
                for w in warnings {
                    self.step
                        .out
                        .status(StatusEvent::BuildWarning { warning: w });
                }
                self.audit_record(
                    audit::BUILD_COMPLETED,
                    epoch.as_deref(),
                    json!({"outcome": if changed.is_empty() { "unchanged" } else { "changed" },
                           "identityDigest": record.identity_digest,
                           "executableSha256": record.executable.sha256,
                           "changed": changed}),
                );
                if matches!(
                    self.lifecycle,
                    Lifecycle::BuildBroken { .. } | Lifecycle::StartFailed { .. }
                ) {
                    self.lifecycle = self.serving_or_first_start();
                }
                self.apply_build(*record);
            }
        }
        if follow_up && self.lifecycle != Lifecycle::Stopping {
            self.request_build();
        }
        self.publish();
    }

    /// The newest build failed. A running server keeps running; with no server, requests are
    /// answered with the compiler's first error (or the last good build runs, if asked).
    fn build_broken(&mut self, message: String, last_good: Option<IdentityRecord>) {
        if matches!(self.server, Server::Running(_) | Server::Replacing(_)) {
            self.report_running();
            return;
        }
        if self.cfg.fallback == Fallback::LastGood
            && self.build.latest.is_none()
            && let Some(record) = last_good
        {
            self.step.out.status(StatusEvent::RunningLastGood {
                identity: short(&record.identity_digest).to_string(),
            });
            self.build.latest = Some(record.clone());
            self.spawn_child(
                record,
                None,
                Some("last-good: the newest build failed".into()),
            );
            return;
        }
        self.step.out.status(StatusEvent::NoServerBuildFailed {
            message: message.clone(),
        });
        self.lifecycle = Lifecycle::BuildBroken { message };
        self.fail_held();
    }

    fn apply_build(&mut self, record: IdentityRecord) {
        let previous = self.build.latest.replace(record.clone());
        let running_digest = self
            .server
            .child()
            .map(|c| c.record.identity_digest.clone());
        match running_digest {
            // The restart in progress picks up `latest`.
            None if matches!(self.server, Server::Replacing(_)) => {}
            None => {
                // New code, built from a change saved before the loop began (its build ran
                // while the old code crashed): it is what the loop waits for.
                if self.lifecycle == Lifecycle::CrashLoop
                    && previous.is_some_and(|p| p.identity_digest != record.identity_digest)
                {
                    self.leave_crash_loop();
                }
                if self.lifecycle == Lifecycle::CrashLoop {
                    self.step.out.status(StatusEvent::NotRestartedCrashLoop);
                } else {
                    self.spawn_child(record, None, None);
                }
            }
            Some(d) if d == record.identity_digest => {
                self.report_running();
            }
            Some(_) => match self.cfg.restart {
                Restart::Supervise => self.begin_replace(record, "new build"),
                Restart::Manual => {
                    if let Some(c) = self.server.child() {
                        let event = StatusEvent::RunningUnchangedManual {
                            pid: c.pid,
                            epoch: c.epoch.to_string(),
                            identity: short(&record.identity_digest).to_string(),
                        };
                        self.step.out.status(event);
                    }
                }
                Restart::Disconnect => {
                    self.close_connection(&format!(
                        "new build {} (restart mode disconnect); the host must reconnect",
                        short(&record.identity_digest)
                    ));
                }
            },
        }
    }

    /// Manual mode: a newer build than the running server's waits for `cargo mcp-dev restart`.
    pub(super) fn newer_build_waits(&self) -> bool {
        self.cfg.restart == Restart::Manual
            && matches!((self.server.child(), &self.build.latest),
                (Some(c), Some(l)) if c.record.identity_digest != l.identity_digest)
    }

    pub(super) fn report_running(&mut self) {
        let running = self.server.child().map(|c| (c.pid, c.epoch.to_string()));
        self.step
            .out
            .status(StatusEvent::RunningUnchanged { running });
    }

    pub(super) fn spawn_child(
        &mut self,
        record: IdentityRecord,
        replaced: Option<EpochId>,
        fallback: Option<String>,
    ) {
        let epoch = EpochId::new(self.mint_id());
        self.spawn_child_as(epoch, record, replaced, fallback);
    }

    fn spawn_child_as(
        &mut self,
        epoch: EpochId,
        record: IdentityRecord,
        replaced: Option<EpochId>,
        fallback: Option<String>,
    ) {
        self.step.out.spawn(&epoch, record.clone());
        // The shell reports a start before anything else happens; a start never reported is
        // not waited for by a control client.
        if let Server::Spawning(s) = &mut self.server
            && let Some(ticket) = s.ticket.take()
        {
            self.step
                .out
                .answer_control(ticket, json!({"ok": true, "result": {"restarting": true}}));
        }
        self.server.spawning(Spawning {
            epoch,
            record,
            replaced,
            fallback,
            ticket: None,
            restart_due: None,
        });
    }

    /// The server asked for could not start (`why`): rebuild, wait for the build under way,
    /// or answer held requests with why.
    pub(super) fn on_spawn_failed(&mut self, epoch: &str, why: &str) {
        let Some(spawning) = self.server.take_spawning(epoch) else {
            return;
        };
        let ticket = spawning.ticket;
        self.start_failed(spawning.record, why, spawning.restart_due);
        if let Some(ticket) = ticket {
            let answer = self.restart_answer_after_failure();
            self.step.out.answer_control(ticket, answer);
        }
    }

    /// `restart_due`: a crash restart that was scheduled when this start was asked for (a
    /// build's server started in its gap); it stays scheduled, as it was announced.
    fn start_failed(&mut self, record: IdentityRecord, e: &str, restart_due: Option<u64>) {
        self.step
            .out
            .status(StatusEvent::SpawnFailed { why: e.to_string() });
        // Its stored copy may be gone (`cargo clean` takes the target directory, store
        // included) or changed: a build captures it again. Once per identity and at most once
        // a minute (a build whose identity changes every time must not loop), and not while a
        // build runs (that build's result is started anyway).
        let now = self.now();
        let stopping = self.lifecycle == Lifecycle::Stopping;
        if let Some(due) = restart_due.filter(|_| !stopping) {
            self.server.schedule_restart(due);
        }
        if self.build.runs != Builds::Idle && !stopping {
            // A build is under way and its result is started (a fresh copy): nothing has
            // failed for good, and held requests keep waiting for it.
            self.step.out.status(StatusEvent::BuildUnderWayStartsIt);
            self.leave_start_failed();
            self.publish();
            return;
        }
        let may_rebuild = match &self.restarts.last_start_rebuild {
            None => true,
            Some(last) => {
                last.identity != record.identity_digest
                    && now.saturating_sub(last.at_ms) >= START_REBUILD_INTERVAL_MS
            }
        };
        if may_rebuild && !stopping {
            self.restarts.last_start_rebuild = Some(StartRebuild {
                identity: record.identity_digest.clone(),
                at_ms: now,
            });
            self.server.rebuild_to_start(restart_due);
            self.step.out.status(StatusEvent::BuildingAgainForFreshCopy);
            // A server is on its way again (a restart asked for from `StartFailed`).
            self.leave_start_failed();
            self.request_build();
            // Held requests keep waiting, within their own deadlines: a server is on its way
            // (see `hold_budget`).
            self.publish();
            return;
        }
        // No server runs now, whether or not one ran before: calls are answered with why (held
        // calls would wait for a start that is not coming).
        if !stopping {
            self.lifecycle = Lifecycle::StartFailed {
                message: e.to_string(),
            };
        }
        self.fail_held();
        self.publish();
    }

    /// The server asked for runs as `pid`.
    pub(super) fn on_spawned(&mut self, epoch: &str, pid: u32) {
        // Running: a crash restart still scheduled is moot.
        let Some(Spawning {
            epoch,
            record,
            replaced,
            fallback,
            ticket,
            restart_due: _,
        }) = self.server.take_spawning(epoch)
        else {
            return;
        };
        self.started(epoch, pid, record, replaced, fallback);
        if let Some(ticket) = ticket {
            self.step
                .out
                .answer_control(ticket, json!({"ok": true, "result": {"started": true}}));
        }
    }

    fn started(
        &mut self,
        epoch: EpochId,
        pid: u32,
        record: IdentityRecord,
        replaced: Option<EpochId>,
        fallback: Option<String>,
    ) {
        // Started: a later failure to start may have a cause a build fixes again.
        self.restarts.last_start_rebuild = None;
        self.restarts.last_started = Some(epoch.clone());
        // A server runs (after `BuildBroken`: the last good build, by `cargo mcp-dev restart`).
        if matches!(
            self.lifecycle,
            Lifecycle::StartFailed { .. } | Lifecycle::BuildBroken { .. }
        ) {
            self.lifecycle = self.serving_or_first_start();
        }
        let started_ms = self.now();
        let started_at = self.step.now.timestamp();
        let mut launch = LaunchRecord::new(&epoch, pid, &record, started_at, replaced.clone());
        launch.fallback = fallback.clone();
        self.step.out.record_launch(&launch);
        self.approvals.gate.epoch_changed();
        self.audit_record(audit::SERVER_STARTED, Some(&epoch), json!({
            "epoch": epoch, "pid": pid, "identityDigest": record.identity_digest,
            "executableSha256": record.executable.sha256, "argv": record.launch.argv, "label": self.label(),
            "launch": launch,
        }));
        match &replaced {
            Some(old) => {
                self.step.out.status(StatusEvent::ServerReplaced {
                    pid,
                    epoch: epoch.to_string(),
                    old: old.to_string(),
                });
                self.audit_record(
                    audit::SERVER_REPLACED,
                    Some(&epoch),
                    json!({"oldEpoch": old, "newEpoch": epoch, "pid": pid}),
                );
            }
            None => self.step.out.status(StatusEvent::ServerStarted {
                pid,
                epoch: epoch.to_string(),
                identity: short(&record.identity_digest).to_string(),
                last_good: fallback.is_some(),
            }),
        }
        self.server
            .started(ChildState::started(epoch, pid, record, started_ms));
        self.advance_child();
        self.publish();
    }

    /// Supervise mode: answer in-flight requests, stop the old child, then start the new one.
    pub(super) fn begin_replace(&mut self, record: IdentityRecord, why: &str) {
        let Some(mut child) = self.server.take_running() else {
            self.spawn_child(record, None, None);
            return;
        };
        let new_epoch = EpochId::new(self.mint_id());
        self.step.out.verbose(StatusEvent::ReplacingServer {
            why: why.to_string(),
        });
        self.approvals.gate.epoch_changed();
        let requests = std::mem::take(&mut child.requests);
        self.answer_in_flight(requests, &child.epoch, Some(&new_epoch), "replaced", None);
        self.withdraw_prompts_of(
            child.epoch.as_str(),
            &format!(
                "the server was rebuilt during the prompt (epoch {} is being replaced by {new_epoch}); call again to be asked about the new code",
                child.epoch
            ),
        );
        self.record_exit(&child, "replaced", None);
        self.server.begin_replacement(Replacing {
            new_epoch,
            record,
            old_epoch: child.epoch.clone(),
        });
        self.step.out.stop(&child.epoch, self.cfg.grace);
        self.publish();
    }

    pub(super) fn on_child_stopped(&mut self, epoch: &str) {
        if self.lifecycle == Lifecycle::Stopping {
            return;
        }
        if let Some(r) = self.server.take_replacement(epoch) {
            // Apply the newest successful build, which may be newer than the one that asked.
            let record = self.build.latest.clone().unwrap_or(r.record);
            self.spawn_child_as(r.new_epoch, record, Some(r.old_epoch), None);
        }
    }

    pub(super) fn record_exit(
        &mut self,
        child: &ChildState,
        status: &str,
        exit: Option<&ExitInfo>,
    ) {
        let lived = self.now().saturating_sub(child.started_ms);
        let record = ServerExited {
            epoch: child.epoch.to_string(),
            pid: child.pid,
            status: status.to_string(),
            code: exit.and_then(|e| e.code),
            signal: exit.and_then(|e| e.signal),
            lived_ms: lived,
        };
        self.audit_record(audit::SERVER_EXITED, Some(&child.epoch), record.to_data());
    }

    pub(super) fn on_child_exited(&mut self, epoch: &str, exit: ExitInfo) {
        let Some(child) = self.server.child() else {
            return;
        };
        if child.epoch != epoch {
            return; // a replaced child: its requests were already answered
        }
        let mut child = self.server.take_running().expect("checked");
        self.step.out.status(StatusEvent::ServerExited {
            pid: child.pid,
            epoch: child.epoch.to_string(),
            exit: exit.to_string(),
        });
        self.record_exit(&child, &exit.to_string(), Some(&exit));
        self.approvals.gate.epoch_changed();
        let requests = std::mem::take(&mut child.requests);
        self.answer_in_flight(requests, epoch, None, "exited", Some(&exit.to_string()));
        self.withdraw_prompts_of(
            epoch,
            &format!("the server exited during the prompt (epoch {epoch}: {exit}); call again once it is back"),
        );
        self.step.out.reap(epoch); // grandchildren left in its group go too
        if self.lifecycle == Lifecycle::Stopping {
            return;
        }
        match self.cfg.restart {
            Restart::Supervise => {
                let now = self.now();
                self.restarts.crashes.push_back(now);
                while self
                    .restarts
                    .crashes
                    .front()
                    .is_some_and(|t| now.saturating_sub(*t) > CRASH_WINDOW_MS)
                {
                    self.restarts.crashes.pop_front();
                }
                if self.restarts.crashes.len() >= CRASH_LIMIT {
                    self.lifecycle = Lifecycle::CrashLoop;
                    self.step.out.status(StatusEvent::CrashLoop {
                        exits: self.restarts.crashes.len(),
                        window_s: CRASH_WINDOW_MS / 1000,
                    });
                    self.fail_held();
                } else {
                    let delay = Duration::from_millis(
                        250u64 << (self.restarts.crashes.len().saturating_sub(1)).min(6),
                    );
                    let due = self.now() + delay.as_millis() as u64;
                    self.server.schedule_restart(due);
                    self.step.out.status(StatusEvent::RestartingIn {
                        ms: delay.as_millis(),
                    });
                    self.step.out.schedule(delay, Timer::Restart);
                }
            }
            Restart::Manual => {
                self.step.out.status(StatusEvent::ManualRestartNeeded);
                // Unless a build under way starts the next server: held requests wait for it.
                if self.hold_budget().is_none() {
                    self.fail_held();
                }
            }
            Restart::Disconnect => self.close_connection(&format!(
                "server exited ({exit}) in restart mode disconnect"
            )),
        }
        self.publish();
    }

    /// Out of `StartFailed`: a server runs or is on its way.
    fn leave_start_failed(&mut self) {
        if matches!(self.lifecycle, Lifecycle::StartFailed { .. }) {
            self.lifecycle = self.serving_or_first_start();
        }
    }

    /// Where a session with a server (running or on its way) is: first start if none ever
    /// served a catalog.
    pub(super) fn serving_or_first_start(&self) -> Lifecycle {
        if self.catalogs.history.current().is_some() {
            Lifecycle::Serving
        } else {
            Lifecycle::FirstStart
        }
    }

    pub(super) fn restart_due(&mut self) {
        let now = self.now();
        if self.server.restart_due(now)
            && !matches!(self.lifecycle, Lifecycle::Stopping | Lifecycle::CrashLoop)
            && let Some(record) = self.build.latest.clone()
        {
            self.spawn_child(record, None, None);
        }
    }

    // ----- connection end -----------------------------------------------------------------

    pub(super) fn close_connection(&mut self, why: &str) {
        if self.exit_code.is_some() {
            return;
        }
        // Stopping first: what is in flight is answered as a closing connection's.
        self.lifecycle = Lifecycle::Stopping;
        if let Some(c) = self.server.child_mut() {
            let e = c.epoch.clone();
            let requests = std::mem::take(&mut c.requests);
            self.answer_in_flight(requests, &e, None, "replaced", None);
        }
        self.step.out.status(StatusEvent::ConnectionClosed {
            why: why.to_string(),
        });
        self.fail_held();
        self.fail_prompts("the supervisor is shutting down");
        self.step.out.close_host();
        self.shutdown_with(why, crate::base::exit_codes::CONNECTION_CLOSED);
    }

    /// The session ends while its first build runs and no server ever came up: the shell
    /// lets that build finish in the background for the host's retry.
    pub fn first_build_abandoned(&self) -> bool {
        // An early build whose result waits for its burst to settle is over, not running.
        self.build.runs != Builds::Idle
            && self.catalogs.history.current().is_none()
            && self.build.early.as_ref().is_none_or(|e| e.held.is_none())
    }

    pub fn shutdown(&mut self, why: &str) {
        self.shutdown_with(why, crate::base::exit_codes::OK);
    }

    fn shutdown_with(&mut self, why: &str, code: i32) {
        if self.exit_code.is_some() {
            return;
        }
        self.lifecycle = Lifecycle::Stopping;
        self.fail_held();
        self.fail_prompts("the supervisor is shutting down");
        if let Some(mut c) = self.server.take_running() {
            let e = c.epoch.clone();
            let requests = std::mem::take(&mut c.requests);
            self.answer_in_flight(
                requests,
                &e,
                None,
                "exited",
                Some("supervisor shutting down"),
            );
            self.record_exit(&c, "stopped at session end", None);
            // A server that never answered its handshake has nothing to wind down, and may not
            // be reading stdin yet: it gets SIGTERM almost at once instead of the usual grace.
            let grace = match c.phase {
                ChildPhase::Started | ChildPhase::Handshaking { .. } => STOP_GRACE_UNANSWERED,
                _ => STOP_GRACE,
            };
            self.step.out.stop(&e, grace);
        }
        self.approvals.gate.end_run();
        self.audit_record(
            audit::RUN_ENDED,
            None,
            json!({"reason": why, "agentRun": self.agent_run()}),
        );
        self.exit_code = Some(code);
        self.publish();
    }
}
