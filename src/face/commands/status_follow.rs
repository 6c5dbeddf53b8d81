//! `cargo mcp-dev status --follow`: the running session's status lines in a terminal, as they
//! are written. Hosts show `run`'s stderr only around connect, or not at all; this view is
//! where the later lines (`catalog changed`, a refused call, a build error after a save,
//! `server replaced`) are seen.
//!
//! Asks the session's control socket for the lines it keeps ([`crate::screen::stderr_feed`]) a few
//! times a second: the last `--lines` of a session already running first, then each new one.
//! A rebuilt server changes nothing (the lines are the supervisor's); when the session ends it
//! says so and waits for the next `run` of the same label, whose lines it shows from its
//! start. With no session it says so once and waits. Ctrl-C stops it (the default signal
//! action: nothing to restore).
//!
//! Writes the lines on stdout (this command's own; never `run`'s), its notes about the
//! following itself on stderr, and every character it prints from the socket's answer through
//! [`sanitize::review`]: the lines quote the server and the agent, and whatever answers on
//! the socket path is not proof of being our supervisor.
//!
//! Owns: the polling loop and what it says. Not: which lines are kept (the feed).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::control_client;
use crate::base::error::CmdResult;
use crate::face::cli::StatusArgs;
use crate::screen::stderr_feed::Query;
use crate::{face::control_socket, screen::output, screen::sanitize, screen::stderr};

/// How often a running session is asked for new lines.
const POLL: Duration = Duration::from_millis(250);
/// How often the view looks for a session when none answers.
const WAIT: Duration = Duration::from_millis(500);

/// The session being followed.
struct Followed {
    session: String,
    pid: u64,
    /// The feed's cursor after the last answer.
    next: (u64, u64),
}

/// What one question to the socket gave.
enum Asked {
    Lines(Value),
    /// Nothing answers (no session): why, for the first such note.
    NoSession(String),
    /// Something answers but keeps no status lines (an older cargo mcp-dev).
    Refused(String),
}

pub fn execute(args: &StatusArgs) -> CmdResult {
    let (sockets, label) = control_client::locate_all(&args.control)?;
    let label = sanitize::review(&label).into_owned();
    let started = now_ms();
    stderr::line(&format!(
        "following: the status lines of `{label}` as they are written (Ctrl-C stops)"
    ));
    let mut current: Option<Followed> = None;
    // Whether a session was followed before (the next one is then a new one).
    let mut followed_any = false;
    let mut first = true;
    // The last note about there being no session to follow (said once until it changes).
    let mut said: Option<String> = None;
    loop {
        let query = Query {
            session: current.as_ref().map(|c| c.session.clone()),
            after: current.as_ref().map(|c| c.next),
            // A session seen at once: its last lines for context. One that starts later: every
            // line it wrote since this view started.
            since: (!first).then_some(started),
            last: first.then_some(args.lines),
        };
        first = false;
        match ask(&sockets, &query) {
            Asked::Lines(v) => {
                let session = v["session"].as_str().unwrap_or("").to_string();
                let pid = v["pid"].as_u64().unwrap_or(0);
                if current.as_ref().map(|c| &c.session) != Some(&session) {
                    let when = humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH
                            + Duration::from_millis(v["started"].as_u64().unwrap_or(0)),
                    );
                    if let Some(old) = &current {
                        stderr::line(&format!(
                            "session ended: pid {} no longer serves `{label}`",
                            old.pid
                        ));
                    }
                    stderr::line(&format!(
                        "{}: `{label}` is served by pid {pid} (started {when})",
                        if followed_any {
                            "new session"
                        } else {
                            "session"
                        }
                    ));
                    followed_any = true;
                    said = None;
                }
                let missed = v["missed"]["run"].as_u64().unwrap_or(0)
                    + v["missed"]["server"].as_u64().unwrap_or(0);
                if missed > 0 {
                    output::stdout_line(&format!(
                        "… {missed} line{} not shown (written faster than this view reads them)",
                        if missed == 1 { "" } else { "s" }
                    ))?;
                }
                for line in v["lines"].as_array().map(Vec::as_slice).unwrap_or_default() {
                    output::stdout_line(&sanitize::review(line["text"].as_str().unwrap_or("")))?;
                }
                current = Some(Followed {
                    session,
                    pid,
                    next: (
                        v["next"]["run"].as_u64().unwrap_or(0),
                        v["next"]["server"].as_u64().unwrap_or(0),
                    ),
                });
                std::thread::sleep(POLL);
            }
            Asked::NoSession(why) => {
                let note = match current.take() {
                    Some(old) => format!(
                        "session ended: pid {} no longer serves `{label}`; waiting for the next `cargo mcp-dev run` of it",
                        old.pid
                    ),
                    None => format!(
                        "waiting: no `cargo mcp-dev run` of `{label}` is running ({why}); its lines show here once your host (or you) starts it"
                    ),
                };
                if said.as_deref() != Some(note.as_str()) {
                    stderr::line(&note);
                    said = Some(note);
                }
                std::thread::sleep(WAIT);
            }
            Asked::Refused(why) => {
                current = None;
                let note = format!(
                    "waiting: the `cargo mcp-dev run` of `{label}` that answers keeps no status lines ({why}; an older cargo mcp-dev?); restart it from your host to follow it"
                );
                if said.as_deref() != Some(note.as_str()) {
                    stderr::line(&note);
                    said = Some(note);
                }
                std::thread::sleep(WAIT);
            }
        }
    }
}

/// Asks the first socket that answers.
fn ask(sockets: &[PathBuf], query: &Query) -> Asked {
    let request = query.to_json();
    let mut first_error = None;
    for path in sockets {
        match control_socket::request(path, &request) {
            Ok(answer) => return read_answer(&answer),
            Err(e) => {
                first_error.get_or_insert_with(|| no_session(path, &e));
            }
        }
    }
    Asked::NoSession(first_error.unwrap_or_else(|| "no socket to ask".into()))
}

fn read_answer(answer: &Value) -> Asked {
    if answer.get("ok").and_then(Value::as_bool) == Some(true)
        && let Some(result) = answer.get("result")
        && result.get("session").and_then(Value::as_str).is_some()
    {
        return Asked::Lines(result.clone());
    }
    let why = answer
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("an answer that is not a list of lines");
    Asked::Refused(sanitize::review(why).into_owned())
}

/// Why nothing answered, in a few words.
fn no_session(path: &Path, e: &control_socket::ControlError) -> String {
    match e {
        control_socket::ControlError::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            format!("nothing answers at {}", path.display())
        }
        other => sanitize::review(&other.to_string()).into_owned(),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
