//! `cargo mcp-dev run`: the command an MCP host launches instead of `cargo run`.
//!
//! The shell around [`crate::session::Session`]: it owns the threads (host reader and writer,
//! per-child readers and writer, build, watcher, signals, parent check, control socket) and
//! performs the session's effects ([`crate::session::Effect`]) one step at a time: the step's
//! audit records in one write before its lines, results (a spawned pid, a failed write) handed
//! back as events. Every decision is the session's.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use crate::audit::{AnchorUpdate, AuditLog, KeyStore, Moment};
use crate::base::error::{CmdResult, Failure};
use crate::base::sys::unix;
use crate::face::cli::{FallbackMode, MessageFormat, RestartMode, RunArgs};
use crate::identity::config::{GateSetting, LoadedConfig};
use crate::identity::cycle::{self, Prepared};
use crate::identity::epoch;
use crate::identity::epoch::LaunchRecord;
use crate::identity::fingerprint::IdentityRecord;
use crate::policy::approval::{ApprovalMode, CredentialScope, Gating, Policy};
use crate::process::supervisor::{self, LaunchSpec, Worker};
use crate::session::state::RecordedFacts;
use crate::session::{
    BuildResult, Effect, Event, Fallback, IdMint, Now, Restart, Session, SessionConfig, Ticket,
};
use crate::wire::proxy::framing::{DEFAULT_MAX_LINE, Frame, LineReader};
use crate::wire::proxy::outlet::{self, Outlet};
use crate::{base::exit_codes, face::control_socket, face::watch, screen::output, screen::stderr};

/// Status lines for `run`: human on stderr, or JSON events on stderr.
#[derive(Clone)]
struct StatusSink {
    json: bool,
    label: String,
}

impl StatusSink {
    fn emit(&self, line: &str) {
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
struct EffectError(String);

impl EffectError {
    fn new(e: impl std::fmt::Display) -> Self {
        EffectError(e.to_string())
    }
}

/// The session and the shell that performs its effects, behind one lock.
struct Running {
    session: Session,
    shell: Shell,
}

impl Running {
    /// Handles `events` as one step at `now` and performs its effects; then each result they
    /// gave (a server started or not, records not written) as a step of its own. `later`:
    /// lines for servers are queued and written after the lock is released (`Shell::pumps`).
    fn step(&mut self, mut events: Vec<Event>, now: Now, later: bool) {
        let effects = if events.len() == 1 {
            let event = events.pop().expect("one event");
            self.session.handle(event, now)
        } else {
            self.session.handle_batch(events, now)
        };
        self.perform(effects, now, later);
    }

    /// Performs `effects`, and the steps of the results they give.
    fn perform(&mut self, mut effects: Vec<Effect>, now: Now, later: bool) {
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

/// The session behind its lock. Host and child lines are handled on the thread that read them
/// (no hand-off on the hot path); slower events go through the event channel.
type Shared = Arc<Mutex<Running>>;

/// Hands an event to the session on the current thread; wakes the main thread when the session
/// decided to end.
fn deliver(me: &Weak<Mutex<Running>>, events: Vec<Event>) -> bool {
    deliver_and_pump(me, events).is_some()
}

/// [`deliver`], returning the server outlets it wrote to (`None`: the session ended).
fn deliver_and_pump(me: &Weak<Mutex<Running>>, events: Vec<Event>) -> Option<Vec<Outlet>> {
    let shared = me.upgrade()?;
    let mut running = shared.lock().unwrap_or_else(|e| e.into_inner());
    // One reading of the clocks for everything done for these events (see `Moment`), taken
    // under the lock, so moments follow the order the session sees events in.
    let moment = Moment::now();
    running.shell.begin_moment(moment);
    let now = running.shell.now(moment);
    // Lines for the server are queued under the lock and written after it is released: the
    // write wakes the server, and its answer must not find the session still locked by us.
    running.step(events, now, true);
    let Running { session, shell } = &mut *running;
    shell.flush_audit();
    let pumps = std::mem::take(&mut shell.pumps);
    // A due anchor rewrite is done last, after the lock (the next host or server line need not
    // wait for it), and only when nothing went to a server: then the answer (written under the
    // lock) is already with the host. When a request was just forwarded, its answer's delivery
    // takes the rewrite instead: on a busy core, writing here would delay that answer.
    let (anchor, prepare) = if pumps.is_empty() {
        // Likewise the next part of the log's reserved space, when it is nearly used up, and
        // (at a host's pace) its next pages: here no call waits for them (see
        // `AuditLog::reserve_ahead` and [`HOST_PACE`]).
        let now = moment.mono;
        let paced = shell
            .last_quiet_delivery
            .replace(now)
            .is_none_or(|last| now.duration_since(last) >= HOST_PACE);
        let prepare = shell.audit.reserve_ahead(paced).unwrap_or_else(|e| {
            shell.audit_warning(&e);
            None
        });
        (shell.audit.take_anchor_update(), prepare)
    } else {
        (None, None)
    };
    shell.end_moment();
    let ended = session.exit_code().is_some();
    if ended {
        let _ = shell.done.try_send(());
    }
    drop(running);
    for outlet in &pumps {
        outlet.pump();
    }
    // Outside the lock: the next line, host's or server's, need not wait for it.
    if let Some(pages) = prepare {
        pages.apply();
    }
    if let Some(Err(e)) = anchor.map(AnchorUpdate::write) {
        let running = shared.lock().unwrap_or_else(|e| e.into_inner());
        running.shell.audit_warning(&e);
    }
    (!ended).then_some(pumps)
}

/// Answers further apart than this are a host's pace: after one, the log's next pages are
/// made writable (`AuditLog::reserve_ahead`) in the host's pause, where a record copied into
/// a page not yet written would fault on the next call's path, with cold caches. Closer
/// together (calls back to back or pipelined) the pages are left to fault as they are first
/// written: there, preparing them measured as a slower 99th percentile, since the work lands
/// between one call and the next anyway.
const HOST_PACE: Duration = Duration::from_millis(1);

/// Lines handed to the session under one lock at most (see [`next_batch`]).
const BATCH: usize = 32;

/// The next frame, then every further line already in the reader's buffer (up to [`BATCH`]):
/// lines that arrived together are handled under one lock instead of one lock each, and the
/// reader never waits for more input while it holds some. The flag says the stream ended
/// (after the returned events).
fn next_batch<R: std::io::Read>(
    reader: &mut LineReader<BufReader<R>>,
    mut event: impl FnMut(Frame) -> Option<Event>,
) -> (Vec<Event>, bool) {
    let mut batch = Vec::new();
    loop {
        match reader.next_frame().ok().and_then(&mut event) {
            Some(e) => batch.push(e),
            None => return (batch, true),
        }
        if batch.len() >= BATCH || !reader.line_buffered() {
            return (batch, false);
        }
    }
}

struct Shell {
    events: Sender<Event>,
    /// Every timer the session asks for, kept by one thread.
    timers: super::timer_thread::TimerThread<crate::session::Timer>,
    /// Set right after the session is created (the shell lives next to it).
    me: Weak<Mutex<Running>>,
    done: Sender<()>,
    host_out: Outlet,
    children: HashMap<String, Outlet>,
    workers: HashMap<String, Worker>,
    prep: Arc<Mutex<Prepared>>,
    server_args: Vec<String>,
    label: String,
    sink: StatusSink,
    build_lock: PathBuf,
    watcher: Option<Arc<watch::Rewatcher>>,
    audit: AuditLog,
    status_file: PathBuf,
    launch_dir: PathBuf,
    facts_file: PathBuf,
    /// `target/mcp-dev`, held open: the files above are written relative to it.
    own_files: Option<crate::base::fsutil::DirWriter>,
    started: Instant,
    /// The session's agent run (every audit record names it).
    agent_run: String,
    /// Control requests taken up and not yet answered, by ticket.
    controls: HashMap<Ticket, control_socket::ControlReply>,
    next_ticket: Ticket,
    /// Off-thread fsyncs of the audit log (`audit-fsync = boundaries`).
    syncer: Option<Syncer>,
    /// Stop sequences still running (the exit waits for them, and only for them).
    stops: Arc<std::sync::atomic::AtomicUsize>,
    /// While a reader thread holds the session: lines for servers are queued on their outlets
    /// and `pumps` names the outlets to write once the lock is released (see `deliver`).
    pumps: Vec<Outlet>,
    /// When the last delivery that sent nothing to a server ended (see [`HOST_PACE`]).
    last_quiet_delivery: Option<Instant>,
    /// The time of the events a reader thread is delivering (`deliver_and_pump`): the
    /// session's clocks read it instead of the system's while it is set.
    moment: Option<Moment>,
    /// The identity file as it was when the running build started (`None`: no build yet;
    /// `Some(None)`: there was no file).
    identity_before: Option<Option<Vec<u8>>>,
}

impl Shell {
    /// Everything done until [`Shell::end_moment`] happens at `moment` (records included).
    fn begin_moment(&mut self, moment: Moment) {
        self.moment = Some(moment);
        self.audit.set_moment(moment);
    }

    fn end_moment(&mut self) {
        self.moment = None;
        self.audit.clear_moment();
    }

    /// Writes the records the handled events appended (one `write`). The intent record of a
    /// call never waits for this: it is written before the call is forwarded. A due anchor
    /// rewrite is the caller's: `deliver_and_pump` does it after the session's lock, the event
    /// loop with [`Shell::flush_audit_anchored`].
    fn flush_audit(&mut self) {
        if self.audit.pending_bytes() > 0
            && let Err(e) = self.audit.write_pending()
        {
            self.audit_warning(&e);
        }
        self.audit_notice();
    }

    /// What the log did by itself (a removed file put back), as a status line.
    fn audit_notice(&mut self) {
        if let Some(notice) = self.audit.take_notice() {
            self.sink.emit(&format!("warning: {notice}"));
        }
    }

    /// [`Shell::flush_audit`] and a due anchor rewrite, now.
    fn flush_audit_anchored(&mut self) {
        self.flush_audit();
        if let Some(Err(e)) = self.audit.take_anchor_update().map(AnchorUpdate::write) {
            self.audit_warning(&e);
        }
    }

    /// One status line for an audit write that failed (our own paths and errors, no host or
    /// server text).
    fn audit_warning(&self, e: &crate::audit::AuditError) {
        self.sink.emit(&format!("warning: audit log: {e}"));
    }

    /// Writes a line to the host now (bounded, as [`Shell::queue_host`]).
    fn send_host(&mut self, line: Vec<u8>, droppable: bool) {
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
    fn queue_host(&mut self, line: Vec<u8>, droppable: bool) {
        let queued = self.host_out.queue(line, droppable);
        self.report_host_refusal(queued);
    }

    fn report_host_refusal(&self, sent: Result<(), outlet::Full>) {
        if let Err(full) = sent {
            self.report_drop(
                &full,
                "the host is not reading its stdin",
                self.host_out.limit(),
            );
        }
    }

    fn pump_after_unlock(&mut self, out: &Outlet) {
        if !self.pumps.iter().any(|o| o.same_as(out)) {
            self.pumps.push(out.clone());
        }
    }

    /// Writes a line to the server of `epoch` now, or (`later`) right after the session's
    /// lock is released (bounded: see `Outlet`). Dropped when that server is gone or never
    /// started.
    fn send_child(&mut self, epoch: &str, line: Vec<u8>, droppable: bool, later: bool) {
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
    fn perform(&mut self, effects: &mut Vec<Effect>, later: bool) -> Vec<Event> {
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
    fn now(&self, moment: Moment) -> Now {
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
    fn take_up(&mut self, reply: control_socket::ControlReply) -> Option<Ticket> {
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
    fn close_audit(&mut self) {
        self.commit_audit();
        if let Err(e) = self.audit.release_reservation() {
            self.audit_warning(&crate::audit::AuditError::io(
                "release the reserved tail of",
                self.audit.path(),
            )(e));
        }
    }

    /// An epoch boundary or the end: the log is made durable as `audit-fsync` says.
    fn commit_audit(&mut self) {
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
struct Syncer {
    requests: crossbeam_channel::Sender<Option<crossbeam_channel::Sender<()>>>,
}

impl Syncer {
    fn start(files: Vec<PathBuf>) -> Syncer {
        let (requests, rx) = crossbeam_channel::bounded::<Option<crossbeam_channel::Sender<()>>>(2);
        let _ = std::thread::Builder::new()
            .name("audit-fsync".into())
            .spawn(move || {
                for done in rx {
                    for f in &files {
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
    fn request(&self) {
        let _ = self.requests.try_send(None);
    }

    /// Asks for an fsync and waits for it, at most `limit`.
    fn wait(&self, limit: Duration) -> bool {
        let (done, rx) = crossbeam_channel::bounded(1);
        self.requests.send_timeout(Some(done), limit).is_ok() && rx.recv_timeout(limit).is_ok()
    }
}

impl Shell {
    fn set_aside_build(&mut self) {
        let identity_file = self.prep.lock().expect("prep").identity_file();
        match self.identity_before.take() {
            Some(Some(bytes)) => write_atomic(&identity_file, &bytes),
            Some(None) => {
                let _ = crate::base::fsutil::remove_file(&identity_file);
            }
            None => {}
        }
    }

    fn start_build(&mut self) {
        // What the build will overwrite, should it be set aside (`set_aside_build`).
        let identity_file = self.prep.lock().expect("prep").identity_file();
        // Ours, in the agent-writable target: no link followed (its bytes may be written back).
        self.identity_before = Some(crate::base::fsutil::read_small_regular(
            &identity_file,
            crate::identity::cycle::LARGEST_RECORD,
        ));
        let events = self.events.clone();
        let prep = self.prep.clone();
        let args = self.server_args.clone();
        let lock = self.build_lock.clone();
        let sink = self.sink.clone();
        let watcher = self.watcher.clone();
        let _ = std::thread::Builder::new()
            .name("build".into())
            .spawn(move || {
                let result = build_once(&prep, &args, &lock, &sink);
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

    fn spawn(&mut self, epoch: &str, record: &IdentityRecord) -> Result<u32, EffectError> {
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

    fn stop(&mut self, epoch: &str, grace: Duration) {
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

    fn reap(&mut self, epoch: &str) {
        self.children.remove(epoch);
        if let Some(worker) = self.workers.remove(epoch) {
            worker.kill_group();
        }
    }

    fn publish_status(&mut self, snapshot: &serde_json::Value) {
        // A supervisor that is ending never overwrites the status of another live one for the
        // same label (a host's probe copy, killed while the real session runs, used to leave
        // its "stopping" document on top of the session's).
        if snapshot["lifecycle"] == "stopping"
            && let Some(owner) =
                crate::base::fsutil::read_small_regular(&self.status_file, 16 << 20)
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

    fn record_launch(&mut self, launch: &LaunchRecord) {
        let text = serde_json::to_string_pretty(launch).expect("json") + "\n";
        self.write_own(
            &self.launch_dir.join(format!("{}.json", launch.epoch)),
            text.as_bytes(),
        );
        self.write_own(&self.launch_dir.join("latest.json"), text.as_bytes());
    }

    fn record_facts(&mut self, facts: &RecordedFacts) {
        let text = serde_json::to_string(facts).expect("json");
        self.write_own(&self.facts_file, text.as_bytes());
    }
}

impl Shell {
    /// Writes one of the session's own files below the held `target/mcp-dev`
    /// ([`crate::base::fsutil::DirWriter`]: no directory between followed, atomic rename).
    fn write_own(&self, path: &std::path::Path, bytes: &[u8]) {
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

/// Writes one of the session's files: no-follow, exclusive temporary file, atomic rename
/// ([`crate::base::fsutil::write_atomic`]); a failure is reported once per file kind, not fatal.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) {
    if let Err(e) = crate::base::fsutil::write_atomic(path, bytes) {
        stderr::verbose_line(&format!("could not write {}: {e}", path.display()));
    }
}

/// What the session needs of one build cycle.
fn build_result(prep: &Prepared, outcome: Result<cycle::CycleOutcome, String>) -> BuildResult {
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => return BuildResult::Error(e),
    };
    let line = cycle::status_line(prep, &outcome);
    match outcome {
        cycle::CycleOutcome::Failed {
            errors,
            first_location,
            summary,
            last_good,
            ..
        } => BuildResult::Failed {
            line,
            errors,
            first_location,
            first_error: summary,
            last_good: last_good.map(Box::new),
        },
        cycle::CycleOutcome::Complete {
            record,
            changed,
            problems,
            ..
        } => BuildResult::Complete {
            line,
            changed: changed.iter().map(|c| c.name().to_string()).collect(),
            warnings: problems.iter().map(|p| p.to_string()).collect(),
            record: Box::new(record),
        },
    }
}

/// The method of a line bound for the server that names a method but carries no id and is not
/// an MCP notification (`notifications/…`): e.g. a `tools/call` sent as a notification. Lines
/// the session writes have sorted keys, so requests and responses start with `{"error"` or
/// `{"id"` and are passed without parsing; only the rest (notifications) is parsed.
pub(crate) fn request_without_id(line: &[u8]) -> Option<String> {
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
fn is_call_request(line: &[u8]) -> bool {
    crate::wire::proxy::envelope::Message::parse(line)
        .is_ok_and(|m| m.method() == Some("tools/call") && m.id().is_some())
}

/// The error response to a request (our numeric id) that the stalled server's queue refused.
fn stalled_answer(line: &[u8]) -> Option<Vec<u8>> {
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
    fn report_drop(&self, full: &outlet::Full, why: &str, limit: usize) {
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

/// One build under the per-target-dir build lock (a second supervisor, e.g. a host's probe
/// copy, waits here instead of starting a concurrent build).
fn build_once(
    prep: &Arc<Mutex<Prepared>>,
    server_args: &[String],
    lock_path: &std::path::Path,
    sink: &StatusSink,
) -> BuildResult {
    let lock = match crate::base::fsutil::open_lock_file(lock_path) {
        Ok(l) => l,
        Err(e) => {
            return BuildResult::Error(format!(
                "cannot open build lock {}: {e}",
                lock_path.display()
            ));
        }
    };
    if rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        sink.emit("waiting for another cargo mcp-dev build of this target directory to finish");
        if let Err(e) = rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive) {
            return BuildResult::Error(e.to_string());
        }
    }
    // Manifests may have changed since the last build: re-resolve (cheap when cached).
    let current = {
        let p = prep.lock().expect("prep");
        p.refresh().unwrap_or_else(|_| p.clone())
    };
    let result = cycle::run_cycle(&current, server_args, true).map_err(|f| f.message);
    let result = build_result(&current, result);
    *prep.lock().expect("prep") = current;
    drop(lock);
    result
}

/// Opens the audit log for this run. A log that does not verify completely with this user's key
/// (torn, tampered, truncated, removed by `cargo clean` while its anchor survived, or written
/// under another key) is never appended to: it and its anchor are set aside, kept as evidence
/// for `audit verify`, and a new chain starts that names the old head; one status line says so.
fn open_audit(
    path: &std::path::Path,
    keys: &KeyStore,
    options: &crate::audit::AuditOptions,
    sink: &StatusSink,
) -> Result<AuditLog, Failure> {
    match crate::audit::open_for_run_with(path, keys, options) {
        Ok((log, recovery)) => {
            if let Some(r) = recovery {
                sink.emit(&r.status_line(path));
            }
            Ok(log)
        }
        Err(e) => Err(Failure::error(e.to_string())
            .with_note("tool calls are only forwarded when they can be audited")),
    }
}

/// The audit log's fsync policy and segment size: the flag, else the config, else defaults.
fn audit_options(
    flag: Option<&str>,
    c: &crate::identity::config::McpDevConfig,
) -> Result<crate::audit::AuditOptions, Failure> {
    let mut options = crate::audit::AuditOptions::default();
    if let Some(text) = flag.or(c.audit_fsync.as_deref()) {
        options.fsync = text
            .parse::<crate::audit::FsyncPolicy>()
            .map_err(|e| Failure::error(e.to_string()))?;
    }
    if let Some(bytes) = c.audit_max_segment_bytes {
        options.max_segment_bytes = bytes;
    }
    Ok(options)
}

/// Removes symbolic links planted where the session writes its files (status, launch records,
/// facts) before it starts, so its writes cannot be redirected outside the project (issue 12).
/// Links planted while the session runs are the session writer's to refuse (see
/// [`crate::base::fsutil::write_atomic`]).
fn sweep_planted_links(layout: &crate::base::paths::Layout, label: &str) {
    let status = layout.status_file(label);
    let facts = layout.facts_file(label);
    let launch = layout.launch_dir(label);
    let mut dirs: Vec<PathBuf> = Vec::new();
    dirs.extend(status.parent().map(PathBuf::from));
    dirs.extend(facts.parent().map(PathBuf::from));
    dirs.extend(launch.parent().map(PathBuf::from));
    dirs.push(launch.clone());
    for dir in dirs {
        crate::base::fsutil::remove_planted_link(&dir);
        let _ = crate::base::fsutil::ensure_dir(&dir);
    }
    for file in [status, facts, launch.join("latest.json")] {
        if crate::base::fsutil::remove_planted_link(&file) {
            stderr::warn(&format!(
                "removed a symbolic link planted at {} (cargo mcp-dev writes its own file there)",
                file.display()
            ));
        }
    }
}

/// The command that follows this session's status lines from a terminal: bare in the package
/// directory (where the host usually starts `run`), else with the flags that find this
/// session's socket.
fn follow_command(prep: &Prepared, cargo: &crate::face::cli::CargoArgs) -> String {
    let mut cmd = String::from("cargo mcp-dev status --follow");
    let root = &prep.target.resolved.package_root;
    let here = std::env::current_dir()
        .ok()
        .and_then(|d| crate::base::beneath::followed::canonicalize(&d).ok());
    let mut flag = |name: &str, path: &std::path::Path| {
        let text = path.display().to_string();
        cmd.push_str(&format!(
            " {name} {}",
            crate::screen::sanitize::shell_word(&text).unwrap_or(text)
        ));
    };
    if here.as_deref()
        != crate::base::beneath::followed::canonicalize(root)
            .ok()
            .as_deref()
    {
        flag("--manifest-path", &prep.target.resolved.manifest_path);
    }
    if let Some(dir) = &cargo.target_dir {
        flag("--target-dir", dir);
    }
    cmd
}

/// The policy from configuration and flags.
/// A per-call tool is gated whatever `--exempt` or a `gate` list says (the configuration refuses
/// the conflict; flags can still make it): returns the tools this changed.
fn per_call_wins(policy: &mut Policy) -> Vec<String> {
    let mut changed = Vec::new();
    for tool in &policy.per_call_tools {
        let moved = match &mut policy.gating {
            Gating::All { exempt } => exempt.remove(tool),
            Gating::Only(gated) => gated.insert(tool.clone()),
            Gating::Off => false, // `--no-gating`: the human at the terminal turned it all off
        };
        if moved {
            changed.push(tool.clone());
        }
    }
    changed
}

pub fn policy_from(config: &LoadedConfig, gating_off: bool) -> Policy {
    let c = &config.config;
    let exempt = c.exempt.iter().cloned().collect();
    let gating = if gating_off {
        Gating::Off
    } else {
        match &c.gate {
            None => Gating::All { exempt },
            Some(GateSetting::Keyword(k)) if k == "off" => Gating::Off,
            Some(GateSetting::Keyword(_)) => Gating::All { exempt },
            Some(GateSetting::Tools(tools)) => Gating::Only(tools.iter().cloned().collect()),
        }
    };
    Policy {
        gating,
        mode: if c.approval.as_deref() == Some("per-call") {
            ApprovalMode::PerCall
        } else {
            ApprovalMode::PerEpoch
        },
        per_call_tools: c.per_call.iter().cloned().collect(),
        credential_scopes: c
            .credential_scopes
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    CredentialScope {
                        env: s.env.clone(),
                        tools: s.tools.iter().cloned().collect(),
                    },
                )
            })
            .collect(),
    }
}

pub fn execute(args: RunArgs) -> CmdResult {
    output::reserve_stdout_for_jsonrpc();
    // Every status line from here on is also kept for `status --follow`.
    crate::screen::stderr_feed::enable();
    let started = Instant::now();
    let prep = Prepared::new(&args.cargo.selection())?;
    let t = &prep.target;
    let label = t.label.clone();
    let layout = t.layout();
    let restart = args
        .restart
        .or(t.config.restart_mode())
        .unwrap_or(RestartMode::Supervise);
    let debounce = args
        .debounce
        .or(t.config.config.debounce_ms)
        .map(Duration::from_millis)
        .unwrap_or(watch::DEFAULT_DEBOUNCE);
    let gating_off = args.no_gating
        || matches!(&t.config.config.gate, Some(GateSetting::Keyword(k)) if k == "off");
    let mut policy = policy_from(&t.config, args.no_gating);
    // Flags add to the configuration; they never narrow what it gates per call.
    if let Gating::All { exempt } = &mut policy.gating {
        exempt.extend(args.exempt.iter().cloned());
    }
    policy.per_call_tools.extend(args.per_call.iter().cloned());
    for tool in per_call_wins(&mut policy) {
        stderr::warn(&format!(
            "`{}` needs a decision for every call (per-call): it stays gated despite --exempt or `gate`",
            crate::screen::sanitize::line(&tool)
        ));
    }
    let audit_path = args
        .audit_log
        .clone()
        .or_else(|| {
            t.config
                .config
                .audit_log
                .as_ref()
                .map(|p| t.resolved.package_root.join(p))
        })
        .unwrap_or_else(|| layout.audit_log(&label));
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    let sink = StatusSink {
        json: args.message_format == MessageFormat::Json,
        label: label.clone(),
    };
    let audit_options = audit_options(args.audit_fsync.as_deref(), &t.config.config)?;
    let mut audit = open_audit(&audit_path, &keys, &audit_options, &sink)?;
    // `boundaries`: the fsyncs at each new epoch and at exit run off the session's thread.
    let syncer = (audit_options.fsync == crate::audit::FsyncPolicy::Boundaries).then(|| {
        audit.set_fsync(crate::audit::FsyncPolicy::Never);
        let mut files = vec![audit_path.clone()];
        files.extend(keys.anchor_path(&audit_path).ok());
        Syncer::start(files)
    });
    let socket_path = control_socket::socket_path(&t.resolved.target_dir, &label);

    let (events_tx, events_rx) = unbounded::<Event>();
    let (host_closed_tx, host_closed_rx) = crossbeam_channel::bounded::<()>(1);
    let host_out = Outlet::new("host", outlet::stdout_fd()?, move || {
        // Our copy of fd 1 is closed; fd 1 itself must go too for the host to see EOF.
        if let Ok(null) = crate::base::beneath::followed::dev_null() {
            let _ = rustix::stdio::dup2_stdout(&null);
        }
        let _ = host_closed_tx.send(());
    });
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(1);
    spawn_signal_watch(events_tx.clone())?;
    spawn_parent_watch(events_tx.clone());
    // Kept open here (never disconnected): the event loop waits on it with the events.
    let (controls_tx, controls_rx) = unbounded::<control_socket::ControlCall>();
    let served = match control_socket::serve(&socket_path, controls_tx.clone()) {
        Ok(s) => {
            if let Some(pid) = s.other_owner {
                sink.emit(&format!(
                    "another supervisor for `{label}`{} holds the control socket {}; this session leaves it alone and takes it over when that one exits",
                    pid.map(|p| format!(" (pid {p})")).unwrap_or_default(),
                    socket_path.display()
                ));
            }
            Some(s)
        }
        Err(e) => {
            sink.emit(&format!("warning: control socket unavailable ({e}); approve/status/restart will not reach this session"));
            None
        }
    };
    let socket = served.as_ref().map(|_| socket_path.clone());
    let watcher = if args.no_watch {
        None
    } else {
        let tx = events_tx.clone();
        let shown = t.clone();
        let warn = sink.clone();
        let w = Arc::new(watch::Rewatcher::new(debounce, move |signal| {
            let event = match signal {
                watch::Signal::Unwatched(dirs) => {
                    return warn.emit(&dirs.status_line(|p| shown.display_path(p)));
                }
                watch::Signal::Changing => Event::SourcesChanging,
                watch::Signal::Settled {
                    paths,
                    changed_after_leading_edge,
                } => Event::SourcesChanged {
                    paths: paths.iter().map(|p| shown.display_path(p)).collect(),
                    changed_after_leading_edge,
                },
            };
            let _ = tx.send(event);
        }));
        if let Err(e) = w.follow(t) {
            sink.emit(&format!(
                "warning: cannot watch sources ({e}); rebuild with `cargo mcp-dev restart`"
            ));
        }
        Some(w)
    };

    let duration_setting = |flag: Option<Duration>,
                            key: &str,
                            value: &Option<String>,
                            default: Duration|
     -> Result<Duration, Failure> {
        match (flag, value) {
            (Some(d), _) => Ok(d),
            (None, Some(text)) => humantime::parse_duration(text).map_err(|e| {
                Failure::new(
                    exit_codes::USAGE,
                    format!("`{key} = \"{text}\"` in [package.metadata.mcp-dev] is not a duration ({e}); write e.g. \"25s\""),
                )
            }),
            (None, None) => Ok(default),
        }
    };
    let c = &t.config.config;
    let first_start_budget = duration_setting(
        args.first_start_budget,
        "first-start-budget",
        &c.first_start_budget,
        crate::session::DEFAULT_FIRST_START_BUDGET,
    )?;
    let handshake_wait = duration_setting(
        args.handshake_wait,
        "handshake-wait",
        &c.handshake_wait,
        crate::session::DEFAULT_HANDSHAKE_WAIT,
    )?;
    let discover_wait = duration_setting(
        args.discover_wait,
        "discover-wait",
        &c.discover_wait,
        crate::session::DEFAULT_DISCOVER_WAIT,
    )?;
    let approval_timeout = duration_setting(
        args.approval_timeout,
        "approval-timeout",
        &c.approval_timeout,
        crate::session::DEFAULT_APPROVAL_TIMEOUT,
    )?;
    let approval_channels = args.approval_channel_set(c);
    let fallback = match (args.fallback, c.fallback.as_deref()) {
        (Some(FallbackMode::LastGood), _) | (None, Some("last-good")) => Fallback::LastGood,
        (Some(FallbackMode::None), _) | (None, None | Some("none")) => Fallback::None,
        (None, Some(other)) => {
            return Err(Failure::new(
                exit_codes::USAGE,
                format!(
                    "`fallback = \"{other}\"` in [package.metadata.mcp-dev]: expected \"none\" or \"last-good\""
                ),
            ));
        }
    };
    // Agent-writable: no link followed, no wait on a planted named pipe.
    let recorded: RecordedFacts =
        crate::base::fsutil::read_small_regular(&layout.facts_file(&label), 64 << 20)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
    // Warm: a build of this identity was recorded and its stored executable is still there.
    let warm = prep.last_identity().is_some_and(|r| {
        crate::base::fsutil::exists(std::path::Path::new(&r.executable.store_path))
    });
    sweep_planted_links(&layout, &label);
    let cfg = SessionConfig {
        label: label.clone(),
        package_name: t.resolved.package_name.clone(),
        package_version: t.resolved.package_version.clone(),
        restart: match restart {
            RestartMode::Supervise => Restart::Supervise,
            RestartMode::Disconnect => Restart::Disconnect,
            RestartMode::Manual => Restart::Manual,
        },
        fallback,
        grace: Duration::from_millis(1000),
        gating_off,
        first_start_budget,
        handshake_wait,
        discover_wait,
        restart_hold: crate::session::DEFAULT_RESTART_HOLD,
        warm,
        recorded,
        supervisor_pid: std::process::id(),
        audit_path: audit_path.display().to_string(),
        socket_path: socket.as_ref().map(|p| p.display().to_string()),
        approval_channels,
        approval_timeout,
        max_open_prompts: crate::session::DEFAULT_MAX_OPEN_PROMPTS,
    };
    let stops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let timer_events = events_tx.clone();
    let timers = super::timer_thread::TimerThread::start(move |timer| {
        timer_events.send(Event::Timer(timer)).is_ok()
    })
    .map_err(|e| Failure::error(format!("cannot start the timer thread: {e}")))?;
    let shell = Shell {
        events: events_tx.clone(),
        timers,
        me: Weak::new(),
        done: done_tx,
        host_out: host_out.clone(),
        children: HashMap::new(),
        workers: HashMap::new(),
        prep: Arc::new(Mutex::new(prep.clone())),
        server_args: args.server_args.clone(),
        label: label.clone(),
        sink: sink.clone(),
        build_lock: layout.build_lock(),
        watcher,
        audit,
        syncer: syncer.clone(),
        status_file: layout.status_file(&label),
        launch_dir: layout.launch_dir(&label),
        facts_file: layout.facts_file(&label),
        own_files: match crate::base::fsutil::DirWriter::open(layout.root()) {
            Ok(files) => Some(files),
            Err(e) => {
                stderr::warn(&format!(
                    "{}: {e}; the status file, launch records and recorded facts are not written this session",
                    layout.root().display()
                ));
                None
            }
        },
        started: Instant::now(),
        stops: stops.clone(),
        agent_run: String::new(),
        controls: HashMap::new(),
        next_ticket: 0,
        last_quiet_delivery: None,
        moment: None,
        pumps: Vec::new(),
        identity_before: None,
    };
    // The first line a host may keep: it names where the later ones can be seen.
    sink.emit(&format!(
        "session started: {label} (restart mode {}, gating {}, audit {}, control {}){}",
        restart.as_str(),
        if gating_off { "off" } else { "on" },
        audit_path.display(),
        socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "none".into()),
        if socket.is_some() {
            format!(
                "; status lines: follow them with `{}`",
                follow_command(&prep, &args.cargo)
            )
        } else {
            String::new()
        }
    ));
    let now = shell.now(Moment::now());
    // Ids: seeded once from the system's random source, then advanced by the session.
    let seed = ulid::Ulid::generate().random();
    let ids = IdMint::ulid((seed as u64) ^ ((seed >> 64) as u64));
    let session = Session::new(cfg, policy, ids, now);
    let shared: Shared = Arc::new(Mutex::new(Running { session, shell }));
    {
        let mut r = shared.lock().unwrap_or_else(|e| e.into_inner());
        r.shell.me = Arc::downgrade(&shared);
        r.shell.agent_run = r.session.agent_run().to_string();
        let effects = r.session.start(now);
        r.perform(effects, now, false);
    }
    spawn_host_reader(Arc::downgrade(&shared));
    let code = event_loop(&shared, &events_rx, &controls_rx, &done_rx);
    drop(controls_tx);
    shared
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .shell
        .commit_audit();
    if let Some(s) = &syncer
        && !s.wait(Duration::from_millis(500))
    {
        stderr::verbose_line(
            "the audit log's fsync did not finish within 500 ms; exiting anyway (the records are written)",
        );
    }
    // Let stop sequences in flight (bounded by their own grace) finish; with none (the host
    // left before a server was up) there is nothing to wait for.
    let deadline = Instant::now() + Duration::from_millis(1500);
    while stops.load(std::sync::atomic::Ordering::SeqCst) > 0 && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let _ = events_rx.recv_timeout(left.min(Duration::from_millis(20)));
    }
    let abandoned = shared
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .session
        .first_build_abandoned();
    // Not "is cargo running now": the host may leave before the build thread has started cargo
    // (it answers the handshake first), and that build is just as wanted.
    if abandoned {
        let log = layout.root().join("background-build.log");
        let req = prep.request(false);
        match crate::identity::build::continue_in_background(&req, &log) {
            Ok(pid) => sink.emit(&format!(
                "the host closed the connection during the first build; the build goes on in the background (cargo pid {pid}, output in {}) so the host's retry finds it further along",
                log.display()
            )),
            Err(e) => sink.emit(&format!(
                "the host closed the connection during the first build; could not continue it in the background ({e})"
            )),
        }
    } else {
        crate::identity::build::cancel_running();
    }
    host_out.close();
    let _ = host_closed_rx.recv_timeout(Duration::from_secs(2));
    // The log ends with its last record again (not with the space reserved for more).
    shared
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .shell
        .close_audit();
    drop(shared);
    if let (Some(p), Some(s)) = (socket, served) {
        s.release(&p);
    }
    stderr::verbose_line(&format!(
        "session lasted {:.1}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(code)
}

fn event_loop(
    shared: &Shared,
    events: &Receiver<Event>,
    controls: &Receiver<control_socket::ControlCall>,
    done: &Receiver<()>,
) -> i32 {
    let exit_code = || {
        shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .session
            .exit_code()
    };
    // One event as one step, at the time it is handled.
    let handle = |event: Event| {
        let mut running = shared.lock().unwrap_or_else(|e| e.into_inner());
        // A reader thread that panicked mid-delivery left its moment set: these events
        // read the clocks.
        running.shell.end_moment();
        let now = running.shell.now(Moment::now());
        running.step(vec![event], now, false);
        running.shell.flush_audit_anchored();
        running.session.exit_code()
    };
    loop {
        crossbeam_channel::select! {
            recv(events) -> event => {
                let Ok(event) = event else { return exit_codes::OK };
                if let Some(code) = handle(event) {
                    return code;
                }
            }
            recv(controls) -> call => {
                let Ok(control_socket::ControlCall { request, reply }) = call else { continue };
                // Taken up (or dropped) and handled under one lock each; the ticket names it.
                let ticket = shared.lock().unwrap_or_else(|e| e.into_inner()).shell.take_up(reply);
                if let Some(ticket) = ticket
                    && let Some(code) = handle(Event::Control { request, ticket })
                {
                    return code;
                }
            }
            recv(done) -> _ => {
                if let Some(code) = exit_code() {
                    return code;
                }
            }
        }
    }
}

fn spawn_host_reader(me: Weak<Mutex<Running>>) {
    let _ = std::thread::Builder::new()
        .name("host-in".into())
        .spawn(move || {
            let stdin = std::io::stdin();
            let mut reader = LineReader::new(
                BufReader::with_capacity(1 << 16, stdin.lock()),
                DEFAULT_MAX_LINE,
            );
            loop {
                let (mut batch, ended) = next_batch(&mut reader, |frame| match frame {
                    Frame::Line(line) => Some(Event::HostLine(line)),
                    Frame::Oversize { prefix, len } => Some(Event::HostOversize { prefix, len }),
                    Frame::Eof => None,
                });
                if ended {
                    batch.push(Event::HostEof);
                }
                let Some(written) = deliver_and_pump(&me, batch) else {
                    break;
                };
                if ended {
                    break;
                }
                wait_for_the_server_to_catch_up(&written);
            }
        });
}

/// Bytes of host lines queued for the server beyond what its pipe holds before the host reader
/// waits for them to drain, as a byte relay would (the host's own pipe holds the rest).
const READ_AHEAD: usize = 256 << 10;

/// Backpressure from the server to the host: a host that sends faster than the server reads
/// (20,000 pipelined calls) fills the host's pipe, not our memory. Bounded: a server that stops
/// reading altogether costs each batch at most 100 ms of waiting (the host's next message, or its
/// end, is still read), and the outlet's own bound then answers what does not fit.
fn wait_for_the_server_to_catch_up(written: &[Outlet]) {
    // The outlets' own counters: the session is not locked again (its other reader may be
    // handling the server's answer right now).
    let started = Instant::now();
    while written.iter().map(Outlet::queued_bytes).sum::<usize>() > READ_AHEAD
        && started.elapsed() < Duration::from_millis(100)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn spawn_signal_watch(events: Sender<Event>) -> Result<(), Failure> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| Failure::error(format!("cannot install signal handlers: {e}")))?;
    let _ = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let _ = events.send(Event::Shutdown(format!(
                    "received {}",
                    unix::signal_name(sig)
                )));
            }
        });
    Ok(())
}

/// Some hosts die without closing our stdin; when our parent changes, the host is gone.
/// The thread sleeps until then (a pidfd on Linux: no periodic wake-ups while idle).
fn spawn_parent_watch(events: Sender<Event>) {
    let parent = unix::parent_pid();
    let _ = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || {
            unix::wait_for_parent_exit(parent, Duration::from_millis(500));
            let _ = events.send(Event::Shutdown("the host process exited".into()));
        });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Issue 12, critical finding (`id: null` / no id): the shell never writes a non-notification
    /// method without an id to the server, whatever the session hands it.
    #[test]
    fn requests_without_an_id_never_reach_the_server() {
        let drop = |l: &str| request_without_id(format!("{l}\n").as_bytes());
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"write"}}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"aaa":1,"jsonrpc":"2.0","method":"tools/call"}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"id":null,"jsonrpc":"2.0","method":"tools/call"}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#),
            None
        );
        assert_eq!(
            drop(r#"{"id":3,"jsonrpc":"2.0","method":"tools/call"}"#),
            None
        );
        assert_eq!(
            drop(r#"{"error":{"code":1,"message":"x"},"id":0,"jsonrpc":"2.0"}"#),
            None
        );
    }

    /// Issue 12, medium finding "unbounded memory": how the shell answers a request a stalled
    /// server cannot take (which lines may be dropped is the session's to say: `notify_*`).
    #[test]
    fn stalled_answers() {
        use crate::wire::proxy::envelope::{self, Message};
        let answer = stalled_answer(&envelope::request_line(7, "tools/call", &json!({}))).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(v["id"], json!(7));
        assert_eq!(v["error"]["data"]["error"], json!("server_not_reading"));
        assert_eq!(v["error"]["data"]["source"], json!("cargo-mcp-dev"));
        assert!(stalled_answer(&envelope::notification_line("notifications/x", None)).is_none());
        // A forwarded request keeps its sender's member order: still answered.
        let host = br#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"w","arguments":{}},"id":"h-1"}"#;
        let mut m = Message::parse(host).unwrap();
        m.set_id(envelope::numeric_id(17));
        assert!(stalled_answer(&m.to_line()).is_some());
    }

    /// Review of issue 15 (defence in depth): the fast path of `request_without_id` trusted any
    /// line starting with `{"id":` unless it was `{"id":null`; byte-for-byte lines may put
    /// whitespace after the colon.
    #[test]
    fn request_without_id_fast_path_is_not_fooled_by_whitespace() {
        let drop = |l: &str| request_without_id(format!("{l}\n").as_bytes());
        assert_eq!(
            drop("{\"id\": null,\"jsonrpc\":\"2.0\",\"method\":\"tools/call\"}").as_deref(),
            Some("tools/call")
        );
        // The `jsonrpc`-first prefix passes only a real id; a null one is read and dropped.
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","id":null,"method":"tools/call"}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","id":[1],"method":"tools/call"}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","method":"tools/call","params":{"id":1}}"#).as_deref(),
            Some("tools/call")
        );
        assert_eq!(
            drop(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#),
            None
        );
    }

    fn loaded(v: serde_json::Value) -> LoadedConfig {
        LoadedConfig::from_package_metadata(&json!({ "mcp-dev": v })).unwrap()
    }

    #[test]
    fn only_top_level_tools_call_requests_count_as_calls() {
        assert!(is_call_request(
            br#"{"id":3,"jsonrpc":"2.0","method":"tools/call","params":{"name":"x"}}"#
        ));
        assert!(!is_call_request(
            br#"{"jsonrpc":"2.0","method":"notifications/x","params":{"a":{"method":"tools/call"}}}"#
        ));
        assert!(!is_call_request(
            br#"{"id":4,"jsonrpc":"2.0","method":"tools/list"}"#
        ));
        assert!(!is_call_request(b"not json"));
    }

    #[test]
    fn audit_options_follow_the_flag_then_the_config() {
        use crate::audit::FsyncPolicy;
        let c = crate::identity::config::McpDevConfig {
            audit_fsync: Some("never".into()),
            audit_max_segment_bytes: Some(1024),
            ..Default::default()
        };
        let o = audit_options(None, &c).unwrap();
        assert_eq!((o.fsync, o.max_segment_bytes), (FsyncPolicy::Never, 1024));
        assert_eq!(
            audit_options(Some("every"), &c).unwrap().fsync,
            FsyncPolicy::Every
        );
        let d = audit_options(None, &Default::default()).unwrap();
        assert_eq!(d.fsync, FsyncPolicy::Boundaries);
        assert!(d.max_segment_bytes > 0, "rotation is on by default");
    }

    /// Red-team round 17: flags cannot make a per-call tool ungated.
    #[test]
    fn a_per_call_tool_stays_gated_whatever_the_flags_say() {
        let mut p = policy_from(&loaded(json!({"per-call": ["delete"]})), false);
        if let Gating::All { exempt } = &mut p.gating {
            exempt.insert("delete".into()); // `--exempt delete`
        }
        assert_eq!(per_call_wins(&mut p), ["delete"]);
        assert!(p.is_gated("delete"));
        let mut p = policy_from(&loaded(json!({"gate": ["write_item"]})), false);
        p.per_call_tools.insert("delete".into()); // `--per-call delete`
        assert_eq!(per_call_wins(&mut p), ["delete"]);
        assert!(p.is_gated("delete") && p.is_gated("write_item") && !p.is_gated("list_items"));
        assert!(per_call_wins(&mut p).is_empty(), "nothing left to change");
    }

    #[test]
    fn policy_follows_the_configuration() {
        let p = policy_from(&loaded(json!({})), false);
        assert!(p.is_gated("anything"), "default: every tool is gated");
        let p = policy_from(&loaded(json!({"exempt": ["list_items"]})), false);
        assert!(!p.is_gated("list_items") && p.is_gated("write_item"));
        let p = policy_from(&loaded(json!({"gate": ["write_item"]})), false);
        assert!(p.is_gated("write_item") && !p.is_gated("list_items"));
        let p = policy_from(&loaded(json!({"gate": "off"})), false);
        assert!(!p.is_gated("write_item"));
        let p = policy_from(&loaded(json!({"exempt": ["list_items"]})), true);
        assert!(!p.is_gated("write_item"), "--no-gating wins");
        let p = policy_from(
            &loaded(json!({"approval": "per-epoch", "per-call": ["delete"],
                "credential-scopes": {"api": {"env": ["TOKEN"], "tools": ["write_item"]}}})),
            false,
        );
        assert_eq!(p.mode_for("delete"), ApprovalMode::PerCall);
        assert_eq!(p.mode_for("write_item"), ApprovalMode::PerEpoch);
        assert_eq!(
            p.scopes_for("write_item").into_iter().collect::<Vec<_>>(),
            vec!["api".to_string()]
        );
        let p = policy_from(&loaded(json!({"approval": "per-call"})), false);
        assert_eq!(
            p.mode_for("x"),
            ApprovalMode::PerCall,
            "the stricter mode wins"
        );
    }
}
