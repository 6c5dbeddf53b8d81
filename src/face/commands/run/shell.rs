//! The `run` shell's effect performer: the state shared by its threads ([`Running`]: the
//! session and the [`Shell`] under one lock), the [`Shell`] that performs one step's effects
//! (group commit: every `Effect::Audit` of the step in one write before any of its lines; a
//! failed write drops the step's `tools/call` lines and is reported back as an event), the
//! status sink, the outlets to the host and the servers, the control tickets, the launch and
//! facts files, and the background fsync.
//!
//! Must not touch: decisions (the session's), threads' lifecycles (`threads`).

use super::*;

/// Status lines for `run`: human on stderr, or JSON events on stderr.
#[derive(Clone)]
pub(super) struct StatusSink {
    pub(super) json: bool,
    pub(super) label: String,
}

impl StatusSink {
    pub(super) fn emit(&self, line: &str) {
        if self.json {
            // JSON escapes C0 controls but not DEL or C1 ones: clean the text first.
            let line = crate::screen::sanitize::line(line);
            let event = serde_json::json!({"event": "status", "label": self.label, "message": line,
                "time": humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()});
            crate::screen::stderr_feed::record(crate::screen::stderr_feed::Source::Ours, &line);
            stderr::raw_unfed(&event.to_string());
        } else {
            stderr::line(line);
        }
    }
}

/// An effect the shell could not perform (a server that would not start), in one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(super) struct EffectError(String);

impl EffectError {
    pub(super) fn new(e: impl std::fmt::Display) -> Self {
        EffectError(e.to_string())
    }
}

/// The session and the shell that performs its effects, behind one lock.
pub(super) struct Running {
    pub(super) session: Session,
    pub(super) shell: Shell,
}

impl Running {
    /// Handles `events` as one step at `now` and performs its effects; then each result they
    /// gave (a server started or not, records not written) as a step of its own. `later`:
    /// lines for servers are queued and written after the lock is released (`Shell::pumps`).
    pub(super) fn step(&mut self, mut events: Vec<Event>, now: Now, later: bool) {
        let effects = if events.len() == 1 {
            let event = events.pop().expect("one event");
            self.session.handle(event, now)
        } else {
            self.session.handle_batch(events, now)
        };
        self.perform(effects, now, later);
    }

    /// Performs `effects`, and the steps of the results they give.
    pub(super) fn perform(&mut self, mut effects: Vec<Effect>, now: Now, later: bool) {
        loop {
            let results = self.shell.perform(&mut effects, later);
            if results.is_empty() {
                self.session.give_back(effects);
                return;
            }
            for event in results {
                effects.extend(self.session.handle(event, now));
            }
        }
    }
}

pub(super) struct Shell {
    pub(super) events: Sender<Event>,
    /// Every timer the session asks for, kept by one thread.
    pub(super) timers: crate::face::commands::timer_thread::TimerThread<crate::session::Timer>,
    /// Set right after the session is created (the shell lives next to it).
    pub(super) me: Weak<Mutex<Running>>,
    pub(super) done: Sender<()>,
    pub(super) host_out: Outlet,
    pub(super) children: HashMap<String, Outlet>,
    pub(super) workers: HashMap<String, Worker>,
    pub(super) prep: Arc<Mutex<Prepared>>,
    pub(super) server_args: Vec<String>,
    pub(super) label: String,
    pub(super) sink: StatusSink,
    pub(super) build_lock: PathBuf,
    pub(super) watcher: Option<Arc<watch::Rewatcher>>,
    pub(super) audit: AuditLog,
    pub(super) status_file: PathBuf,
    pub(super) launch_dir: PathBuf,
    pub(super) facts_file: PathBuf,
    /// `target/mcp-dev`, held open: the files above are written relative to it.
    pub(super) own_files: Option<crate::base::fsutil::DirWriter>,
    pub(super) started: Instant,
    /// The session's agent run (every audit record names it).
    pub(super) agent_run: String,
    /// Control requests taken up and not yet answered, by ticket.
    pub(super) controls: HashMap<Ticket, control_socket::ControlReply>,
    pub(super) next_ticket: Ticket,
    /// Off-thread fsyncs of the audit log (`audit-fsync = boundaries`).
    pub(super) syncer: Option<Syncer>,
    /// Stop sequences still running (the exit waits for them, and only for them).
    pub(super) stops: Arc<std::sync::atomic::AtomicUsize>,
    /// While a reader thread holds the session: lines for servers are queued on their outlets
    /// and `pumps` names the outlets to write once the lock is released (see `deliver`).
    pub(super) pumps: Vec<Outlet>,
    /// When the last delivery that sent nothing to a server ended (see [`HOST_PACE`]).
    pub(super) last_quiet_delivery: Option<Instant>,
    /// The time of the events a reader thread is delivering (`deliver_and_pump`): the
    /// session's clocks read it instead of the system's while it is set.
    pub(super) moment: Option<Moment>,
    /// The identity file as it was when the running build started (`None`: no build yet;
    /// `Some(None)`: there was no file).
    pub(super) identity_before: Option<Option<Vec<u8>>>,
}

impl Shell {
    /// Everything done until [`Shell::end_moment`] happens at `moment` (records included).
    pub(super) fn begin_moment(&mut self, moment: Moment) {
        self.moment = Some(moment);
        self.audit.set_moment(moment);
    }

    pub(super) fn end_moment(&mut self) {
        self.moment = None;
        self.audit.clear_moment();
    }

    /// Writes the records the handled events appended (one `write`). The intent record of a
    /// call never waits for this: it is written before the call is forwarded. A due anchor
    /// rewrite is the caller's: `deliver_and_pump` does it after the session's lock, the event
    /// loop with [`Shell::flush_audit_anchored`].
    pub(super) fn flush_audit(&mut self) {
        if self.audit.pending_bytes() > 0
            && let Err(e) = self.audit.write_pending()
        {
            self.audit_warning(&e);
        }
        self.audit_notice();
    }

    /// What the log did by itself (a removed file put back), as a status line.
    pub(super) fn audit_notice(&mut self) {
        if let Some(notice) = self.audit.take_notice() {
            self.sink.emit(&format!("warning: {notice}"));
        }
    }

    /// [`Shell::flush_audit`] and a due anchor rewrite, now.
    pub(super) fn flush_audit_anchored(&mut self) {
        self.flush_audit();
        if let Some(Err(e)) = self.audit.take_anchor_update().map(AnchorUpdate::write) {
            self.audit_warning(&e);
        }
    }

    /// One status line for an audit write that failed (our own paths and errors, no host or
    /// server text).
    pub(super) fn audit_warning(&self, e: &crate::audit::AuditError) {
        self.sink.emit(&format!("warning: audit log: {e}"));
    }

    /// Writes a line to the host now (bounded, as [`Shell::queue_host`]).
    pub(super) fn send_host(&mut self, line: Vec<u8>, droppable: bool) {
        let sent = if droppable {
            self.host_out.send_droppable(line)
        } else {
            self.host_out.send(line)
        };
        self.report_host_refusal(sent);
    }

    /// Queues a line for the host; the caller pumps `host_out` after the step's lines. Bounded
    /// (issue 12): a host that stops reading while the server floods notifications costs at
    /// most the outlet's bound; dropped notifications are counted and reported.
    pub(super) fn queue_host(&mut self, line: Vec<u8>, droppable: bool) {
        let queued = self.host_out.queue(line, droppable);
        self.report_host_refusal(queued);
    }

    pub(super) fn report_host_refusal(&self, sent: Result<(), outlet::Full>) {
        if let Err(full) = sent {
            self.report_drop(
                &full,
                "the host is not reading its stdin",
                self.host_out.limit(),
            );
        }
    }

    pub(super) fn pump_after_unlock(&mut self, out: &Outlet) {
        if !self.pumps.iter().any(|o| o.same_as(out)) {
            self.pumps.push(out.clone());
        }
    }

    /// Writes a line to the server of `epoch` now, or (`later`) right after the session's
    /// lock is released (bounded: see `Outlet`). Dropped when that server is gone or never
    /// started.
    pub(super) fn send_child(&mut self, epoch: &str, line: Vec<u8>, droppable: bool, later: bool) {
        if let Some(method) = request_without_id(&line) {
            // Defence in depth (issue 12, `id: null` bypass): a request that lost its id would
            // run without an answer, a gate decision or an audit record. Never forward one.
            self.sink.emit(&format!(
                "dropped a `{}` without an id on its way to the server (a request needs an id; it was not gated or audited)",
                crate::screen::sanitize::line(&method)
            ));
            return;
        }
        let Some(out) = self.children.get(epoch) else {
            return;
        };
        let notification = droppable;
        let sent = if later {
            let out = out.clone();
            self.pump_after_unlock(&out);
            out.queue(line, notification)
        } else if notification {
            out.send_droppable(line)
        } else {
            out.send(line)
        };
        if let Err(full) = sent {
            let Some(out) = self.children.get(epoch) else {
                return;
            };
            let limit = out.limit();
            self.report_drop(&full, "the server is not reading its stdin", limit);
            // A request that cannot be queued is answered (as if by the server) with an error:
            // every host request gets exactly one answer, and nothing waits on a stalled pipe.
            if !notification && let Some(answer) = stalled_answer(&full.line) {
                let _ = self.events.send(Event::ChildLine {
                    epoch: epoch.to_string(),
                    line: answer,
                });
            }
        }
    }

    /// Performs one step's effects; returns the results the session hears about as events.
    /// Group commit, one rule: the step's audit records go out in one write before any of its
    /// lines; if they cannot be written, its `tools/call` lines to servers are dropped (they
    /// must not run unrecorded) and [`Event::AuditFailed`] names them.
    pub(super) fn perform(&mut self, effects: &mut Vec<Effect>, later: bool) -> Vec<Event> {
        let mut results = Vec::new();
        let mut failed: Option<String> = None;
        for effect in effects.iter_mut() {
            if let Effect::Audit { kind, epoch, data } = effect {
                let data = std::mem::replace(data, serde_json::Value::Null.into());
                if let Err(e) = self
                    .audit
                    .append(kind, &self.agent_run, epoch.as_deref(), data)
                {
                    failed.get_or_insert(e.to_string());
                }
            }
        }
        if self.audit.pending_bytes() > 0
            && let Err(e) = self.audit.write_pending()
        {
            failed.get_or_insert(e.to_string());
        }
        self.audit_notice();
        let mut dropped = Vec::new();
        // A step's one host line is sent as it is; several are queued and written together.
        let mut host_line: Option<(Vec<u8>, bool)> = None;
        let mut host_queued = false;
        for effect in effects.drain(..) {
            match effect {
                Effect::Audit { .. } => {}
                Effect::ToHost { line, droppable } => {
                    if let Some((held, held_droppable)) = host_line.take() {
                        self.queue_host(held, held_droppable);
                        host_queued = true;
                    }
                    if host_queued {
                        self.queue_host(line, droppable);
                    } else {
                        host_line = Some((line, droppable));
                    }
                }
                Effect::ToChild { call: Some(id), .. } if failed.is_some() => dropped.push(id),
                Effect::ToChild {
                    epoch,
                    line,
                    droppable,
                    call,
                } => {
                    // Only a marked call can be dropped and answered when its record is lost.
                    debug_assert!(call.is_some() || !is_call_request(&line));
                    self.send_child(&epoch, line, droppable, later)
                }
                Effect::StartBuild => self.start_build(),
                Effect::SetAsideBuild => self.set_aside_build(),
                Effect::Spawn { epoch, record } => {
                    results.push(match self.spawn(&epoch, &record) {
                        Ok(pid) => Event::Spawned { epoch, pid },
                        Err(e) => Event::SpawnFailed { epoch, why: e.0 },
                    })
                }
                Effect::Stop { epoch, grace } => self.stop(&epoch, grace),
                Effect::Reap { epoch } => self.reap(&epoch),
                Effect::Arm { delay, timer } => self.timers.schedule(delay, timer),
                Effect::CloseHost => {
                    // Whatever the host was to be told first goes out before it closes.
                    if let Some((line, droppable)) = host_line.take() {
                        self.send_host(line, droppable);
                    }
                    self.host_out.pump();
                    host_queued = false;
                    self.host_out.close();
                }
                Effect::Status(event) => self.sink.emit(&event.to_string()),
                // The session's lines carry tool names and ids: one line, whatever they hold.
                Effect::Verbose(event) => {
                    stderr::verbose_line(&crate::screen::sanitize::line(&event.to_string()))
                }
                Effect::Publish(snapshot) => self.publish_status(&snapshot),
                Effect::KeepLaunch(launch) => self.record_launch(&launch),
                Effect::KeepFacts(facts) => self.record_facts(&facts),
                Effect::AnswerControl { ticket, answer } => {
                    if let Some(reply) = self.controls.remove(&ticket) {
                        reply.send(answer);
                    }
                }
            }
        }
        // The step's host lines go out together: queued in order, then one `writev`.
        if let Some((line, droppable)) = host_line {
            self.send_host(line, droppable);
        } else if host_queued {
            self.host_out.pump();
        }
        if let Some(why) = failed {
            results.push(Event::AuditFailed {
                why,
                calls: dropped,
            });
        }
        results
    }

    /// The session's time of `moment`.
    pub(super) fn now(&self, moment: Moment) -> Now {
        Now {
            mono_ms: moment
                .mono
                .saturating_duration_since(self.started)
                .as_millis() as u64,
            wall_ms: moment
                .wall
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }

    /// A control request whose client still waits gets a ticket; `None` when its client gave
    /// up (then it must not be carried out).
    pub(super) fn take_up(&mut self, reply: control_socket::ControlReply) -> Option<Ticket> {
        if !reply.take_up() {
            stderr::verbose_line("a control request was dropped: its client stopped waiting");
            return None;
        }
        self.next_ticket += 1;
        self.controls.insert(self.next_ticket, reply);
        Some(self.next_ticket)
    }

    /// The end: what is pending is written, and the space reserved past the last record is
    /// given back (see `audit::log`, "Writing through a map").
    pub(super) fn close_audit(&mut self) {
        self.commit_audit();
        if let Err(e) = self.audit.release_reservation() {
            self.audit_warning(&crate::audit::AuditError::io(
                "release the reserved tail of",
                self.audit.path(),
            )(e));
        }
    }

    /// An epoch boundary or the end: the log is made durable as `audit-fsync` says.
    pub(super) fn commit_audit(&mut self) {
        if let Err(e) = self.audit.commit() {
            self.audit_warning(&e);
        }
        self.audit_notice();
        if let Some(s) = &self.syncer {
            s.request();
        }
    }
}

/// fsyncs the audit log and its anchor on a thread of its own (`audit-fsync = boundaries`): a
/// disk busy with a build can make one fsync take seconds, and that must stall neither the
/// session (a new epoch starts under its lock) nor the exit. What was written is in the page
/// cache already: only a power loss before the fsync ends could lose it.
#[derive(Clone)]
pub(super) struct Syncer {
    pub(super) requests: crossbeam_channel::Sender<Option<crossbeam_channel::Sender<()>>>,
}

impl Syncer {
    pub(super) fn start(files: Vec<PathBuf>) -> Syncer {
        let (requests, rx) = crossbeam_channel::bounded::<Option<crossbeam_channel::Sender<()>>>(2);
        let _ = std::thread::Builder::new()
            .name("audit-fsync".into())
            .spawn(move || {
                for done in rx {
                    for f in &files {
                        // By path at each sync (the active file changes at rotation); an fsync
                        // is all that is done with it.
                        if let Ok(file) = crate::base::fsutil::open_regular(f) {
                            let _ = file.sync_all();
                        }
                    }
                    if let Some(done) = done {
                        let _ = done.send(());
                    }
                }
            });
        Syncer { requests }
    }

    /// Asks for an fsync (requests already queued cover this one).
    pub(super) fn request(&self) {
        let _ = self.requests.try_send(None);
    }

    /// Asks for an fsync and waits for it, at most `limit`.
    pub(super) fn wait(&self, limit: Duration) -> bool {
        let (done, rx) = crossbeam_channel::bounded(1);
        self.requests.send_timeout(Some(done), limit).is_ok() && rx.recv_timeout(limit).is_ok()
    }
}

impl Shell {
    pub(super) fn set_aside_build(&mut self) {
        let identity_file = self.prep.lock().expect("prep").identity_file();
        match self.identity_before.take() {
            Some(Some(bytes)) => self.write_own(&identity_file, &bytes),
            Some(None) => {
                if let Some(files) = &self.own_files {
                    let _ = files.remove(&identity_file);
                }
            }
            None => {}
        }
    }

    pub(super) fn start_build(&mut self) {
        // What the build will overwrite, should it be set aside (`set_aside_build`).
        let identity_file = self.prep.lock().expect("prep").identity_file();
        // Ours, in the agent-writable target: read from the held `target/mcp-dev`, no link
        // followed (its bytes may be written back).
        self.identity_before = Some(self.own_files.as_ref().and_then(|files| {
            files.read_small(&identity_file, crate::identity::cycle::LARGEST_RECORD)
        }));
        let events = self.events.clone();
        let prep = self.prep.clone();
        let args = self.server_args.clone();
        let lock = self.build_lock.clone();
        let files = self.own_files.clone();
        let sink = self.sink.clone();
        let watcher = self.watcher.clone();
        let _ = std::thread::Builder::new()
            .name("build".into())
            .spawn(move || {
                let result = build_once(&prep, &args, &lock, files.as_ref(), &sink);
                // A manifest edit can add a path dependency or a source directory: follow it.
                if let Some(w) = &watcher {
                    if matches!(result, BuildResult::Failed { .. } | BuildResult::Error(_)) {
                        w.forget_contents(); // a re-save retries it
                    }
                    let target = prep
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .target
                        .clone();
                    if let Ok(true) = w.follow(&target) {
                        stderr::verbose_line("watching an updated set of source directories");
                    }
                }
                let _ = events.send(Event::BuildFinished(Box::new(result)));
            });
    }

    pub(super) fn spawn(
        &mut self,
        epoch: &str,
        record: &IdentityRecord,
    ) -> Result<u32, EffectError> {
        // An epoch boundary: what the previous epoch recorded is made durable first.
        self.commit_audit();
        // The wrapper runs from the project tree (it may rely on its location): make sure it is
        // still the script whose digest the identity recorded.
        if let (Some(w), Some(path)) = (&record.wrapper, record.launch.argv.first())
            && crate::base::hashing::sha256_file(std::path::Path::new(path))
                .map(|(d, _)| d)
                .ok()
                .as_deref()
                != Some(w.sha256.as_str())
        {
            return Err(EffectError(format!(
                "wrapper `{}` changed after its identity was captured; not started (the rebuild it triggers will start it)",
                w.path
            )));
        }
        // The store entry must still hold the bytes the identity hashed (issue 12: a replaced or
        // symlinked entry used to run as trusted). Opened once, hashed through the descriptor,
        // and executed through that descriptor when it is argv[0].
        let entry = std::path::Path::new(&record.executable.store_path);
        let verified = crate::identity::store::open_verified(entry, &record.executable.sha256)
            .map_err(EffectError::new)?;
        let direct = record.launch.argv.first() == Some(&record.executable.store_path);
        let spec = LaunchSpec {
            program: direct.then(|| Arc::new(verified)),
            argv: record.launch.argv.clone(),
            cwd: PathBuf::from(&record.launch.cwd),
            env: vec![
                ("CARGO_MCP_DEV_EPOCH".into(), epoch.to_string()),
                ("CARGO_MCP_DEV_LABEL".into(), self.label.clone()),
            ],
        };
        let events = self.events.clone();
        let e = epoch.to_string();
        let spawned = supervisor::spawn(&spec, move |exit| {
            let _ = events.send(Event::ChildExited { epoch: e, exit });
        })
        .map_err(|e| EffectError(format!("{}: {e}", spec.argv[0])))?;
        self.children.insert(
            epoch.to_string(),
            Outlet::new(
                &format!("child-{}", epoch::short(epoch)),
                OwnedFd::from(spawned.stdin),
                || {},
            ),
        );
        // stdout reader: each line is handled right here, under the session lock.
        let me = self.me.clone();
        let e = epoch.to_string();
        let stdout = spawned.stdout;
        let _ = std::thread::Builder::new()
            .name(format!("child-out-{}", epoch::short(epoch)))
            .spawn(move || {
                let mut reader =
                    LineReader::new(BufReader::with_capacity(1 << 16, stdout), DEFAULT_MAX_LINE);
                let mut widened = false;
                loop {
                    if !widened && reader.saw_long_line() {
                        // A server that writes large answers writes each in one go from now
                        // on (it is read whole before it goes on anyway).
                        unix::widen_pipe(reader.get_ref().get_ref());
                        widened = true;
                    }
                    let (batch, ended) = next_batch(&mut reader, |frame| match frame {
                        Frame::Line(line) => Some(Event::ChildLine {
                            epoch: e.clone(),
                            line,
                        }),
                        Frame::Oversize { prefix, len } => Some(Event::ChildOversize {
                            epoch: e.clone(),
                            prefix,
                            len,
                        }),
                        Frame::Eof => None,
                    });
                    if !deliver(&me, batch) || ended {
                        break;
                    }
                }
            });
        // stderr passthrough, prefixed with label and epoch
        let prefix = format!("[{} {}] ", self.label, epoch::short(epoch));
        let stderr = spawned.stderr;
        let _ = std::thread::Builder::new()
            .name("child-err".into())
            .spawn(move || {
                let mut reader = LineReader::new(BufReader::new(stderr), 1 << 20);
                let mut err = std::io::stderr();
                loop {
                    match reader.next_frame() {
                        Ok(Frame::Line(line)) => {
                            // Kept for `status --follow` (colour removed there, then cleaned).
                            crate::screen::stderr_feed::record(
                                crate::screen::stderr_feed::Source::Server,
                                &format!("{prefix}{}", String::from_utf8_lossy(&line)),
                            );
                            // The server's stderr reaches the user's terminal: no escape
                            // sequences (issue 12, terminal escape injection).
                            let text = crate::screen::sanitize::bytes_line(&line);
                            let mut out = String::with_capacity(prefix.len() + text.len() + 1);
                            out.push_str(&prefix);
                            out.push_str(&text);
                            out.push('\n');
                            let _ = err.write_all(out.as_bytes());
                        }
                        Ok(Frame::Oversize { len, .. }) => {
                            let text = format!("{prefix}<{len} bytes on one line, not shown>");
                            crate::screen::stderr_feed::record(
                                crate::screen::stderr_feed::Source::Server,
                                &text,
                            );
                            let _ = writeln!(err, "{text}");
                        }
                        Ok(Frame::Eof) | Err(_) => break,
                    }
                }
            });
        let pid = spawned.worker.pid;
        self.workers.insert(epoch.to_string(), spawned.worker);
        Ok(pid)
    }

    pub(super) fn stop(&mut self, epoch: &str, grace: Duration) {
        let stdin = self.children.remove(epoch);
        let Some(worker) = self.workers.remove(epoch) else {
            return;
        };
        let events = self.events.clone();
        let e = epoch.to_string();
        let stops = self.stops.clone();
        stops.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _ = std::thread::Builder::new()
            .name("stop".into())
            .spawn(move || {
                worker.stop(
                    || {
                        if let Some(out) = stdin {
                            out.close();
                        }
                    },
                    grace,
                );
                stops.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let _ = events.send(Event::ChildStopped { epoch: e });
            });
    }

    pub(super) fn reap(&mut self, epoch: &str) {
        self.children.remove(epoch);
        if let Some(worker) = self.workers.remove(epoch) {
            worker.kill_group();
        }
    }

    pub(super) fn publish_status(&mut self, snapshot: &serde_json::Value) {
        // A supervisor that is ending never overwrites the status of another live one for the
        // same label (a host's probe copy, killed while the real session runs, used to leave
        // its "stopping" document on top of the session's).
        if snapshot["lifecycle"] == "stopping"
            && let Some(owner) = self
                .own_files
                .as_ref()
                .and_then(|files| files.read_small(&self.status_file, 16 << 20))
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["supervisorPid"].as_u64())
            && owner as u32 != std::process::id()
            && unix::process_exists(owner as u32)
        {
            return;
        }
        let text = serde_json::to_string_pretty(snapshot).expect("json") + "\n";
        self.write_own(&self.status_file, text.as_bytes());
    }

    pub(super) fn record_launch(&mut self, launch: &LaunchRecord) {
        let text = serde_json::to_string_pretty(launch).expect("json") + "\n";
        self.write_own(
            &self.launch_dir.join(format!("{}.json", launch.epoch)),
            text.as_bytes(),
        );
        self.write_own(&self.launch_dir.join("latest.json"), text.as_bytes());
    }

    pub(super) fn record_facts(&mut self, facts: &RecordedFacts) {
        let text = serde_json::to_string(facts).expect("json");
        self.write_own(&self.facts_file, text.as_bytes());
    }
}

impl Shell {
    /// Writes one of the session's own files below the held `target/mcp-dev`
    /// ([`crate::base::fsutil::DirWriter`]: no directory between followed, atomic rename).
    pub(super) fn write_own(&self, path: &std::path::Path, bytes: &[u8]) {
        // No root held (`target/mcp-dev` is a link, said at start): nothing is written, rather
        // than through links.
        let Some(files) = &self.own_files else {
            return;
        };
        if let Err(e) = files.write(path, bytes) {
            stderr::verbose_line(&format!("could not write {}: {e}", path.display()));
        }
    }
}

/// The method of a line bound for the server that names a method but carries no id and is not
/// an MCP notification (`notifications/…`): e.g. a `tools/call` sent as a notification. Lines
/// the session writes have sorted keys, so requests and responses start with `{"error"` or
/// `{"id"` and are passed without parsing; only the rest (notifications) is parsed.
pub(super) fn request_without_id(line: &[u8]) -> Option<String> {
    use crate::wire::proxy::envelope::{Kind, Message, is_notification_method};
    // The session's own lines (sorted keys) start with a valid id or are responses: no parse.
    // Anything else (a forwarded line keeps its sender's order and spacing) is read.
    // Hosts that put `jsonrpc` first (the Python SDK, rmcp) keep their id second.
    let valid_id_after = |prefix: &[u8]| {
        line.strip_prefix(prefix)
            .is_some_and(|rest| matches!(rest.first(), Some(b'"' | b'-' | b'0'..=b'9')))
    };
    if line.starts_with(br#"{"error":"#)
        || valid_id_after(br#"{"id":"#)
        || valid_id_after(br#"{"jsonrpc":"2.0","id":"#)
    {
        return None;
    }
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    match Message::parse(body) {
        Ok(m) if m.kind() == &Kind::Notification => {
            let method = m.method().unwrap_or_default();
            (!is_notification_method(method)).then(|| method.to_string())
        }
        Ok(_) => None,
        Err(e) => e.dropped_method().map(str::to_string),
    }
}

/// Whether a line for the server is a `tools/call` request (read at its top level only: the
/// failure path is rare, and nested content must not count).
pub(super) fn is_call_request(line: &[u8]) -> bool {
    crate::wire::proxy::envelope::Message::parse(line)
        .is_ok_and(|m| m.method() == Some("tools/call") && m.id().is_some())
}

/// The error response to a request (our numeric id) that the stalled server's queue refused.
pub(super) fn stalled_answer(line: &[u8]) -> Option<Vec<u8>> {
    use crate::wire::proxy::envelope::{self, Kind, Message};
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    let msg = Message::parse(body).ok()?;
    if msg.kind() != &Kind::Request {
        return None;
    }
    let id = msg.id()?;
    envelope::parse_numeric_id(id)?;
    let mut answer = envelope::error_line(
        Some(id),
        crate::session::codes::SERVER_UNAVAILABLE,
        "the server is not reading its stdin; the request was not delivered",
        serde_json::json!({"error": "server_not_reading"}),
    );
    answer.pop();
    Some(answer)
}

impl Shell {
    /// One status line for the first refused line and then one per 1000 (never one per line).
    pub(super) fn report_drop(&self, full: &outlet::Full, why: &str, limit: usize) {
        if full.dropped == 1 || full.dropped.is_multiple_of(1000) {
            self.sink.emit(&format!(
                "dropped {} line{} so far: {why} (queue bound {} MiB)",
                full.dropped,
                if full.dropped == 1 { "" } else { "s" },
                limit >> 20
            ));
        }
    }
}
