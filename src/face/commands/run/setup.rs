//! What `run` prepares before its session starts: the first build's result as the session
//! reads it, opening the audit log (key, options, planted links swept from `target/mcp-dev`),
//! the approval policy from the configuration and flags met with what a human accepted
//! (`run_policy`), the command line shown for `--follow`.
//!
//! Must not touch: the session's state, the threads.

use super::*;

/// What the session needs of one build cycle.
pub(super) fn build_result(
    prep: &Prepared,
    outcome: Result<cycle::CycleOutcome, String>,
) -> BuildResult {
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

/// One build under the per-target-dir build lock (a second supervisor, e.g. a host's probe
/// copy, waits here instead of starting a concurrent build).
pub(super) fn build_once(
    prep: &Arc<Mutex<Prepared>>,
    server_args: &[String],
    lock_path: &std::path::Path,
    files: Option<&crate::base::fsutil::DirWriter>,
    sink: &StatusSink,
) -> BuildResult {
    // From the session's held `target/mcp-dev` when there is one (no link followed below it);
    // otherwise by its path, its directory required to be a real one.
    let opened = match files {
        Some(files) => files.open_lock(lock_path),
        None => crate::base::fsutil::open_lock_file(lock_path),
    };
    let lock = match opened {
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
/// A log below the session's held `target/mcp-dev` (`within`, the default place) has its
/// directory opened below that root: a link planted on the way is refused, not followed.
pub(super) fn open_audit(
    within: Option<&crate::base::beneath::Beneath>,
    path: &std::path::Path,
    keys: &KeyStore,
    options: &crate::audit::AuditOptions,
    sink: &StatusSink,
) -> Result<AuditLog, Failure> {
    match crate::audit::open_for_run_within(within, path, keys, options) {
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
pub(super) fn audit_options(
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
/// [`crate::base::fsutil::DirWriter`]). Everything is reached from the held `target/mcp-dev`
/// (`files`); without it (that directory is a link, said at start) nothing is written there.
pub(super) fn sweep_planted_links(
    files: Option<&crate::base::fsutil::DirWriter>,
    layout: &crate::base::paths::Layout,
    label: &str,
) {
    let Some(files) = files else {
        return;
    };
    let status = layout.status_file(label);
    let facts = layout.facts_file(label);
    let launch = layout.launch_dir(label);
    let mut dirs: Vec<PathBuf> = Vec::new();
    dirs.extend(status.parent().map(PathBuf::from));
    dirs.extend(facts.parent().map(PathBuf::from));
    dirs.extend(launch.parent().map(PathBuf::from));
    dirs.push(launch.clone());
    for dir in dirs {
        files.remove_planted_link(&dir);
        let _ = files.root().create_dir_all(&dir);
    }
    for file in [status, facts, launch.join("latest.json")] {
        if files.remove_planted_link(&file) {
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
pub(super) fn follow_command(prep: &Prepared, cargo: &crate::face::cli::CargoArgs) -> String {
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
pub fn per_call_wins(policy: &mut Policy) -> Vec<String> {
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

/// The policy the project asks for: the configuration, then `run`'s flags (`--no-gating`,
/// `--exempt`, `--per-call`: the host's configuration, which the agent can edit too), a
/// per-call tool gated whatever they say. Also the warnings for the tools that rule kept gated.
pub fn requested_policy(
    config: &LoadedConfig,
    no_gating: bool,
    exempt: &[String],
    per_call: &[String],
) -> (Policy, Vec<String>) {
    let mut policy = policy_from(config, no_gating);
    // Flags add to the configuration; they never narrow what it gates per call.
    if let Gating::All { exempt: e } = &mut policy.gating {
        e.extend(exempt.iter().cloned());
    }
    policy.per_call_tools.extend(per_call.iter().cloned());
    let warnings = per_call_wins(&mut policy)
        .into_iter()
        .map(|tool| {
            format!(
                "`{}` needs a decision for every call (per-call): it stays gated despite --exempt or `gate`",
                crate::screen::sanitize::line(&tool)
            )
        })
        .collect();
    (policy, warnings)
}

/// The policy `run` applies: what the project asks for met with what a human accepted (see
/// `policy::accepted`): strengthenings at once, weakenings only once accepted. Returns it, the
/// status lines to show (a weakening that waits, a refused record) and the audit records to
/// write before the session starts (`policy_pending`, and `policy_accepted` for an acceptance
/// the log does not hold yet: the record is then marked logged).
/// The project folder (package, workspace or target directory) the state directory lies in,
/// if it does (both compared canonical, links resolved).
fn state_dir_in_project(
    keys: &KeyStore,
    resolved: &crate::identity::workspace::Resolved,
) -> Option<std::path::PathBuf> {
    let canonical = |p: &std::path::Path| crate::base::beneath::followed::canonicalize(p).ok();
    // The state directory may not exist yet: its nearest existing ancestor decides.
    let state = keys.dir().ancestors().find_map(|a| {
        canonical(a).map(|c| {
            c.join(
                keys.dir()
                    .strip_prefix(a)
                    .unwrap_or(std::path::Path::new("")),
            )
        })
    })?;
    [
        &resolved.package_root,
        &resolved.workspace_root,
        &resolved.target_dir,
    ]
    .into_iter()
    .filter_map(|p| canonical(p))
    .find(|root| state.starts_with(root))
}

pub(super) fn run_policy(
    args: &RunArgs,
    t: &crate::identity::workspace::ServerTarget,
    keys: &KeyStore,
) -> (Policy, Vec<String>, Vec<(&'static str, serde_json::Value)>) {
    let (mut policy, mut lines) =
        requested_policy(&t.config, args.no_gating, &args.exempt, &args.per_call);
    let (config_only, _) = requested_policy(&t.config, false, &[], &[]);
    let manifest = &t.resolved.manifest_path;
    let mut standing = policy_record::load(keys, manifest);
    // The state directory comes from `run`'s environment, which the host's configuration (a
    // file the agent edits) sets: one inside the project is the agent's, and so is any record
    // in it (red team, issue 36).
    if let Some(inside) = state_dir_in_project(keys, &t.resolved) {
        standing = policy_record::Standing {
            record: None,
            refused: Some(format!(
                "the state directory {} lies inside {}, where the agent writes; a record there is not a human's, and the audit key and the control socket there are within the agent's reach too: point CARGO_MCP_DEV_HOME (or XDG_STATE_HOME) outside the project",
                keys.dir().display(),
                inside.display()
            )),
            path: standing.path,
        };
    }
    let mut records = Vec::new();
    if let Some(why) = &standing.refused {
        lines.push(format!(
            "the accepted policy {} is refused ({}): nothing counts as accepted, every weakening of the default waits for `cargo mcp-dev approve --policy`",
            standing.path.display(),
            crate::screen::sanitize::line(why)
        ));
    }
    let accepted = standing.terms();
    let verdict = policy_record::Verdict::of(&policy, &config_only, &accepted);
    let requested = crate::policy::accepted::Terms::of(&policy);
    verdict.effective.apply_to(&mut policy);
    per_call_wins(&mut policy);
    if verdict.waits() {
        lines.push(verdict.status_line(&approve_policy_command(args, t)));
        records.push((
            crate::audit::POLICY_PENDING,
            serde_json::json!({
                "manifest": policy_record::package_key(manifest),
                "requested": requested,
                "accepted": standing.record.as_ref().map(|r| &r.terms),
                "effective": verdict.effective,
                "weakenings": verdict.codes(),
            }),
        ));
    }
    if let Some(r) = standing.record.as_ref().filter(|r| !r.logged) {
        records.push((
            crate::audit::POLICY_ACCEPTED,
            policy_accepted_data(r, "run"),
        ));
        let _ = policy_record::accept(keys, manifest, r.terms.clone(), r.accepted_at_ms, true);
    }
    (policy, lines, records)
}

/// The data of a `policy_accepted` record (`recordedBy`: `approve` at the moment of the
/// acceptance, or `run` when the log was held then).
pub fn policy_accepted_data(
    r: &crate::policy::accepted::AcceptedRecord,
    recorded_by: &str,
) -> serde_json::Value {
    serde_json::json!({
        "manifest": r.manifest,
        "terms": r.terms,
        "acceptedAtMs": r.accepted_at_ms,
        "recordedBy": recorded_by,
    })
}

/// The `approve --policy` command that accepts what this `run` asks for (its policy flags too).
fn approve_policy_command(args: &RunArgs, t: &crate::identity::workspace::ServerTarget) -> String {
    let mut cmd = String::from("cargo mcp-dev approve --policy");
    let word = |w: &str| crate::screen::sanitize::shell_word(w).unwrap_or_else(|| w.to_string());
    let here = std::env::current_dir()
        .ok()
        .and_then(|d| crate::base::beneath::followed::canonicalize(&d).ok());
    if here.as_deref() != Some(t.resolved.package_root.as_path()) {
        cmd.push_str(&format!(
            " --manifest-path {}",
            word(&t.resolved.manifest_path.display().to_string())
        ));
    }
    if args.no_gating {
        cmd.push_str(" --no-gating");
    }
    for e in &args.exempt {
        cmd.push_str(&format!(" --exempt {}", word(e)));
    }
    for p in &args.per_call {
        cmd.push_str(&format!(" --per-call {}", word(p)));
    }
    cmd
}

/// For `new` and `init` (run by a human): accepts the policy of the `[package.metadata.mcp-dev]`
/// table they just wrote (`written`, e.g. the template's `exempt = ["list_notes"]`) for the
/// package with this manifest, unless a record is there already (a human's earlier acceptance
/// stands). Inside a host's sandbox the state directory is out of reach and this fails: the
/// first `run` then says what waits. Returns whether a record was written.
pub fn accept_written_policy(
    written: &LoadedConfig,
    manifest: &std::path::Path,
) -> Result<bool, Failure> {
    let keys = KeyStore::from_env().map_err(|e| Failure::error(e.to_string()))?;
    accept_written_policy_in(&keys, written, manifest)
}

/// [`accept_written_policy`] with the state directory given.
pub fn accept_written_policy_in(
    keys: &KeyStore,
    written: &LoadedConfig,
    manifest: &std::path::Path,
) -> Result<bool, Failure> {
    let (policy, _) = requested_policy(written, false, &[], &[]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    // Not in the audit log yet: the first `run` records it (`policy_accepted`, by `run`).
    policy_record::accept_unless_recorded(
        keys,
        manifest,
        crate::policy::accepted::Terms::of(&policy),
        now_ms,
        false,
    )
}

/// For `status`: the sentence saying which weakening of `[package.metadata.mcp-dev]` waits for
/// `approve --policy` in this package (the configuration alone: `run`'s flags are the host's
/// and only `run` knows them), or `None`. A refused record is named too.
pub fn pending_policy_for_status(
    config: &crate::identity::config::LoadedConfig,
    manifest: &std::path::Path,
) -> Option<String> {
    let keys = KeyStore::from_env().ok()?;
    let standing = policy_record::load(&keys, manifest);
    let (config_only, _) = requested_policy(config, false, &[], &[]);
    let verdict = policy_record::Verdict::of(&config_only, &config_only, &standing.terms());
    let mut line = verdict.status_line("cargo mcp-dev approve --policy");
    if let Some(why) = &standing.refused {
        line = format!(
            "{}the accepted policy {} is refused ({}): nothing is accepted",
            if line.is_empty() {
                String::new()
            } else {
                format!("{line}; ")
            },
            standing.path.display(),
            crate::screen::sanitize::line(why)
        );
    }
    (!line.is_empty()).then_some(line)
}

/// The session's settings: each flag over `[package.metadata.mcp-dev]` over the default, the
/// facts real servers of this package recorded (read without following a link), and whether a
/// warm start is likely. A setting that is not a duration, or an unknown fallback, is a usage
/// error naming the key.
pub(super) fn session_config(
    args: &RunArgs,
    prep: &Prepared,
    restart: RestartMode,
    gating_off: bool,
    audit_path: &std::path::Path,
    socket: Option<&PathBuf>,
) -> Result<SessionConfig, Failure> {
    let t = &prep.target;
    let label = t.label.clone();
    let layout = t.layout();
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
    // Agent-writable: no link followed, no wait on a planted named pipe. One-shot by path: read
    // once, while the session config is built, before `run` holds `target/mcp-dev`.
    let recorded: RecordedFacts =
        crate::base::fsutil::read_small_regular(&layout.facts_file(&label), 64 << 20)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
    // Warm: a build of this identity was recorded and its stored executable is still there.
    let warm = prep.last_identity().is_some_and(|r| {
        crate::base::fsutil::exists(std::path::Path::new(&r.executable.store_path))
    });
    Ok(SessionConfig {
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
    })
}
