//! The running session's status lines, kept in memory for `cargo mcp-dev status --follow`.
//!
//! A host shows `run`'s stderr only around connect (Claude Code), or not at all (Codex without
//! `RUST_LOG`): every later line (`catalog changed`, a refused call, a build error after a
//! save, `server replaced`) would reach nobody. `run` keeps the lines it writes to stderr here
//! too, and its control socket hands them out (`{"op": "statusLines"}`, answered by the
//! control thread itself, never queued behind the session).
//!
//! Bounded: two rings, the supervisor's own lines ([`OURS`] lines) and the server's stderr
//! ([`SERVER`] lines), so a server that floods its stderr cannot push the supervisor's lines
//! out; each line is cut at [`MAX_LINE`] bytes. Every line is kept as one line of plain text
//! (colour removed, controls escaped by [`crate::screen::sanitize::line`]); a reader escapes again
//! before printing (the socket's answer is not proof of where it came from).
//!
//! Nothing here touches a file: the agent can write `target/mcp-dev`, but cannot add a line
//! to this memory. Only `run` keeps lines ([`enable`]); in every other command the calls that
//! record are no-ops.
//!
//! Owns: the rings, a reader's cursor, the answer's shape. Not: how a line looks on stderr
//! ([`crate::screen::stderr`]) or the follower's screen ([`crate::face::commands::status_follow`]).

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};

use serde_json::{Value, json};

/// The control request that reads the feed.
pub const OP: &str = "statusLines";

/// The supervisor's own lines kept.
pub const OURS: usize = 1000;
/// The server's stderr lines kept.
pub const SERVER: usize = 500;
/// The longest line kept, in bytes (longer ones are cut, with the cut said).
pub const MAX_LINE: usize = 4096;

/// Where a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Written by the supervisor (status, warnings, cargo's output).
    Ours,
    /// The server's stderr (already tagged `[label epoch]`).
    Server,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Ours => "run",
            Source::Server => "server",
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// Order across both rings.
    seq: u64,
    /// Position in its own ring's history (0 = the first line it ever kept).
    index: u64,
    /// Unix time, milliseconds.
    at: u64,
    text: String,
}

#[derive(Debug)]
struct Ring {
    cap: usize,
    entries: VecDeque<Entry>,
    /// Lines ever pushed (the next line's index).
    total: u64,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            cap,
            entries: VecDeque::with_capacity(cap.min(64)),
            total: 0,
        }
    }

    fn push(&mut self, seq: u64, at: u64, text: String) {
        if self.entries.len() == self.cap {
            self.entries.pop_front();
        }
        self.entries.push_back(Entry {
            seq,
            index: self.total,
            at,
            text,
        });
        self.total += 1;
    }

    /// The index of the oldest line still kept.
    fn oldest(&self) -> u64 {
        self.total - self.entries.len() as u64
    }
}

/// One process's feed.
#[derive(Debug)]
pub struct Feed {
    /// Tells this session from the next one (a pid can come back).
    id: String,
    pid: u32,
    /// Unix time, milliseconds.
    started: u64,
    seq: u64,
    ours: Ring,
    server: Ring,
}

/// What a reader asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// The feed the cursor belongs to; another feed's cursor is ignored.
    pub session: Option<String>,
    /// Lines after these ring indexes (ours, server): what the last answer's `next` said.
    pub after: Option<(u64, u64)>,
    /// Without a cursor for this feed: only lines written at or after this time (Unix ms).
    pub since: Option<u64>,
    /// Without a cursor for this feed: at most the last this many lines.
    pub last: Option<usize>,
}

impl Query {
    pub fn to_json(&self) -> Value {
        let mut q = json!({"op": OP});
        if let Some(s) = &self.session {
            q["session"] = json!(s);
        }
        if let Some((o, s)) = self.after {
            q["after"] = json!({"run": o, "server": s});
        }
        if let Some(t) = self.since {
            q["since"] = json!(t);
        }
        if let Some(n) = self.last {
            q["last"] = json!(n);
        }
        q
    }

    pub fn from_json(v: &Value) -> Query {
        Query {
            session: v.get("session").and_then(Value::as_str).map(String::from),
            after: v
                .get("after")
                .and_then(|a| Some((a.get("run")?.as_u64()?, a.get("server")?.as_u64()?))),
            since: v.get("since").and_then(Value::as_u64),
            last: v
                .get("last")
                .and_then(Value::as_u64)
                .map(|n| n.min((OURS + SERVER) as u64) as usize),
        }
    }
}

impl Feed {
    pub fn new(pid: u32, started: u64) -> Feed {
        let mut nonce = [0u8; 8];
        let _ = crate::base::sys::unix::fill_random(&mut nonce);
        Feed::with_sizes(
            format!("{pid}-{started}-{}", hex::encode(nonce)),
            pid,
            started,
            OURS,
            SERVER,
        )
    }

    fn with_sizes(id: String, pid: u32, started: u64, ours: usize, server: usize) -> Feed {
        Feed {
            id,
            pid,
            started,
            seq: 0,
            ours: Ring::new(ours),
            server: Ring::new(server),
        }
    }

    /// Keeps `text` (one line or several) as written at `at`.
    pub fn push(&mut self, source: Source, at: u64, text: &str) {
        let plain = console::strip_ansi_codes(text);
        for line in plain.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let kept = plain_line(line);
            self.seq += 1;
            let seq = self.seq;
            match source {
                Source::Ours => self.ours.push(seq, at, kept),
                Source::Server => self.server.push(seq, at, kept),
            }
        }
    }

    /// The answer to `q`: the lines it asks for in the order they were written, the cursor
    /// for the next question, and how many lines asked for are no longer kept.
    pub fn answer(&self, q: &Query) -> Value {
        let cursor = q.after.filter(|_| q.session.as_deref() == Some(&self.id));
        let mut picked: Vec<(Source, &Entry)> = Vec::new();
        let mut missed = (0u64, 0u64);
        match cursor {
            Some((after_ours, after_server)) => {
                for (source, ring, after, missed) in [
                    (Source::Ours, &self.ours, after_ours, &mut missed.0),
                    (Source::Server, &self.server, after_server, &mut missed.1),
                ] {
                    *missed = ring.oldest().saturating_sub(after);
                    picked.extend(
                        ring.entries
                            .iter()
                            .filter(|e| e.index >= after)
                            .map(|e| (source, e)),
                    );
                }
            }
            None => {
                for (source, ring) in [(Source::Ours, &self.ours), (Source::Server, &self.server)] {
                    picked.extend(
                        ring.entries
                            .iter()
                            .filter(|e| q.since.is_none_or(|t| e.at >= t))
                            .map(|e| (source, e)),
                    );
                }
            }
        }
        picked.sort_by_key(|(_, e)| e.seq);
        if cursor.is_none()
            && let Some(n) = q.last
        {
            let skip = picked.len().saturating_sub(n);
            picked.drain(..skip);
        }
        json!({
            "session": self.id,
            "pid": self.pid,
            "started": self.started,
            "lines": picked.iter().map(|(source, e)| json!({
                "source": source.name(), "at": e.at, "text": e.text,
            })).collect::<Vec<_>>(),
            "next": {"run": self.ours.total, "server": self.server.total},
            "missed": {"run": missed.0, "server": missed.1},
        })
    }
}

/// `line` as kept: controls escaped, cut at [`MAX_LINE`] bytes on a character boundary.
fn plain_line(line: &str) -> String {
    let clean = crate::screen::sanitize::line(line);
    if clean.len() <= MAX_LINE {
        return clean.into_owned();
    }
    let mut end = MAX_LINE;
    while !clean.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes, cut)", &clean[..end], clean.len())
}

static FEED: OnceLock<Mutex<Feed>> = OnceLock::new();

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Starts keeping this process's status lines (`run` only, before its first line).
pub fn enable() {
    let _ = FEED.get_or_init(|| Mutex::new(Feed::new(std::process::id(), now_ms())));
}

/// Keeps `text` (one line or several), if this process keeps lines.
pub fn record(source: Source, text: &str) {
    if let Some(feed) = FEED.get() {
        feed.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(source, now_ms(), text);
    }
}

/// The control socket's answer to a [`OP`] request (`result` part), or `None` when this
/// process keeps no lines.
pub fn answer(request: &Value) -> Option<Value> {
    let feed = FEED.get()?;
    let q = Query::from_json(request);
    Some(feed.lock().unwrap_or_else(|e| e.into_inner()).answer(&q))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(v: &Value) -> Vec<String> {
        v["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                format!(
                    "{}:{}",
                    l["source"].as_str().unwrap(),
                    l["text"].as_str().unwrap()
                )
            })
            .collect()
    }

    fn next(v: &Value) -> (u64, u64) {
        (
            v["next"]["run"].as_u64().unwrap(),
            v["next"]["server"].as_u64().unwrap(),
        )
    }

    #[test]
    fn lines_come_in_order_once_each_and_a_new_feed_ignores_an_old_cursor() {
        let mut f = Feed::with_sizes("a".into(), 1, 0, 10, 10);
        f.push(Source::Ours, 10, "session started: x");
        f.push(Source::Server, 20, "[x 01ABC] hello");
        f.push(Source::Ours, 30, "build complete: y\nsecond line");
        let first = f.answer(&Query {
            last: Some(3),
            ..Query::default()
        });
        assert_eq!(
            texts(&first),
            [
                "server:[x 01ABC] hello",
                "run:build complete: y",
                "run:second line"
            ]
        );
        assert_eq!(next(&first), (3, 1));
        let cursor = Query {
            session: Some("a".into()),
            after: Some(next(&first)),
            ..Query::default()
        };
        assert!(texts(&f.answer(&cursor)).is_empty(), "nothing new");
        f.push(Source::Ours, 40, "server replaced: pid=2");
        let again = f.answer(&cursor);
        assert_eq!(texts(&again), ["run:server replaced: pid=2"]);
        assert_eq!(again["missed"], json!({"run": 0, "server": 0}));
        // The cursor of another feed (the session before): lines since the given time.
        let other = f.answer(&Query {
            session: Some("b".into()),
            after: Some((100, 100)),
            since: Some(30),
            last: None,
        });
        assert_eq!(
            texts(&other),
            [
                "run:build complete: y",
                "run:second line",
                "run:server replaced: pid=2"
            ]
        );
        assert_eq!(other["session"], json!("a"));
    }

    /// A server that floods its stderr pushes out only its own lines; a reader that fell
    /// behind is told how many it missed.
    #[test]
    fn a_flooding_server_cannot_push_out_the_supervisors_lines() {
        let mut f = Feed::with_sizes("a".into(), 1, 0, 4, 3);
        f.push(
            Source::Ours,
            1,
            "call denied: write (authorization_required)",
        );
        let start = f.answer(&Query::default());
        let cursor = Query {
            session: Some("a".into()),
            after: Some(next(&start)),
            ..Query::default()
        };
        for i in 0..100 {
            f.push(Source::Server, 2, &format!("[x e] flood {i}"));
        }
        f.push(Source::Ours, 3, "catalog changed: revision 2");
        let a = f.answer(&cursor);
        assert_eq!(
            texts(&a),
            [
                "server:[x e] flood 97",
                "server:[x e] flood 98",
                "server:[x e] flood 99",
                "run:catalog changed: revision 2"
            ]
        );
        assert_eq!(a["missed"], json!({"run": 0, "server": 97}));
        let all = f.answer(&Query::default());
        assert_eq!(
            texts(&all)[0],
            "run:call denied: write (authorization_required)"
        );
    }

    #[test]
    fn kept_lines_are_plain_single_lines_and_bounded() {
        let mut f = Feed::with_sizes("a".into(), 1, 0, 10, 10);
        f.push(
            Source::Ours,
            1,
            "\u{1b}[1m\u{1b}[32mbuild complete\u{1b}[0m: x",
        );
        f.push(Source::Server, 1, "evil \u{1b}]0;title\u{7} \u{9b}2J\rend");
        f.push(Source::Server, 1, &"é".repeat(MAX_LINE));
        let v = f.answer(&Query::default());
        let t = texts(&v);
        assert_eq!(t[0], "run:build complete: x");
        assert!(
            t[1].starts_with("server:evil") && t[1].ends_with("end"),
            "{}",
            t[1]
        );
        assert!(
            !t[1].chars().any(crate::screen::sanitize::is_control),
            "{}",
            t[1]
        );
        assert!(
            t[2].len() < MAX_LINE + 64 && t[2].ends_with("bytes, cut)"),
            "{}",
            t[2].len()
        );
    }

    #[test]
    fn a_query_survives_its_json_form() {
        let q = Query {
            session: Some("s".into()),
            after: Some((3, 4)),
            since: Some(99),
            last: Some(10),
        };
        assert_eq!(Query::from_json(&q.to_json()), q);
        assert_eq!(
            Query::from_json(&json!({"last": 1u64 << 60})).last,
            Some(OURS + SERVER),
            "bounded"
        );
    }
}
