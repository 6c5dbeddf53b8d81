//! `cargo mcp-dev run`: the command an MCP host launches instead of `cargo run`.
//!
//! The shell around [`crate::session::Session`]: it owns the threads (host reader and writer,
//! per-child readers and writer, build, watcher, signals, parent check, control socket) and
//! performs the session's effects ([`crate::session::Effect`]) one step at a time: the step's
//! audit records in one write before its lines, results (a spawned pid, a failed write) handed
//! back as events. Every decision is the session's.
//!
//! Rooms: `setup` (what is prepared before the session: build, audit log, policy), `shell`
//! (performing a step's effects), `threads` (readers, watchers, the event loop); this file
//! (`execute`) wires them together and decides the exit.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};

use super::policy_record;
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

mod setup;
mod shell;
mod threads;

use setup::*;
pub use setup::{
    accept_written_policy, accept_written_policy_in, pending_policy_for_status, per_call_wins,
    policy_accepted_data, policy_from, requested_policy,
};
use shell::*;
use threads::*;

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
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    // What the project asks for, met with what a human accepted (issue 36): a weakening waits.
    let (policy, policy_lines, policy_records) = run_policy(&args, t, &keys);
    for line in &policy_lines {
        stderr::warn(line);
    }
    let gating_off = policy.gating == Gating::Off;
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
    let sink = StatusSink {
        json: args.message_format == MessageFormat::Json,
        label: label.clone(),
    };
    let audit_options = audit_options(args.audit_fsync.as_deref(), &t.config.config)?;
    // `target/mcp-dev`, held for the session: its own files and (by default) the audit log's
    // directory are reached from it, no link followed below it.
    let own_files = match crate::base::fsutil::DirWriter::open(layout.root()) {
        Ok(files) => Some(files),
        Err(e) => {
            stderr::warn(&format!(
                "{}: {e}; the status file, launch records and recorded facts are not written this session",
                layout.root().display()
            ));
            None
        }
    };
    let mut audit = open_audit(
        own_files.as_ref().map(|f| f.root()),
        &audit_path,
        &keys,
        &audit_options,
        &sink,
    )?;
    for (kind, data) in policy_records {
        audit
            .append(kind, crate::audit::TOOL_RUN, None, data)
            .map_err(|e| Failure::error(e.to_string()))?;
    }
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
    // The audit log is open, so its key exists: requests must prove they can read it.
    let proof =
        control_socket::ControlProof::load(&keys).map_err(|e| Failure::error(e.to_string()))?;
    let served = match control_socket::serve(&socket_path, controls_tx.clone(), proof) {
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

    let cfg = session_config(
        &args,
        &prep,
        restart,
        gating_off,
        &audit_path,
        socket.as_ref(),
    )?;
    sweep_planted_links(own_files.as_ref(), &layout, &label);
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
        own_files,
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
