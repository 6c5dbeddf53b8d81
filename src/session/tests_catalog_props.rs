//! Property tests of the catalog fetch (the supervisor's own paged `tools/list`): a fake server
//! whose every answer to a catalog page is the test's to choose (a page, the last page, an
//! error, a line that is not JSON, an unreadable result, a cancellation, an oversized line),
//! interleaved with `list_changed`, the host's lists and calls, restarts and time.

use std::collections::{BTreeSet, HashMap, VecDeque};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::testing::*;
use super::*;
use crate::policy::catalog::Catalog;

/// How the fake server answers the pending catalog page (or the oldest forwarded request).
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Up to this many tools, and a `nextCursor` when more remain.
    Page(u8),
    /// Everything left, no `nextCursor`.
    Last,
    /// A JSON-RPC error.
    Error,
    /// Not JSON (a `NaN`), but carrying the request's id.
    NotJson,
    /// A result that is no tool list (`"result": "…"`).
    Unreadable,
    /// `notifications/cancelled` naming the request.
    Cancel,
    /// A line over the limit whose prefix names the request.
    Oversize,
}

#[derive(Debug, Clone)]
enum Step {
    /// The server's tools change (this many, a new version) and it says so.
    ServerChanges(u8),
    /// `list_changed` with nothing changed.
    SpuriousListChanged,
    AnswerPage(Answer),
    /// The host lists: from the first page (0), with a cursor it was given (1), a bogus one (2).
    HostList(u8, u8),
    HostCall(bool),
    /// The server answers the oldest request the host forwarded to it.
    AnswerHost(Answer),
    Advance(u16),
    Rebuild,
    Crash,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        3 => (1u8..3).prop_map(Answer::Page),
        3 => Just(Answer::Last),
        1 => Just(Answer::Error),
        1 => Just(Answer::NotJson),
        1 => Just(Answer::Unreadable),
        1 => Just(Answer::Cancel),
        1 => Just(Answer::Oversize),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0u8..4).prop_map(Step::ServerChanges),
        1 => Just(Step::SpuriousListChanged),
        6 => answer().prop_map(Step::AnswerPage),
        2 => (0u8..3, any::<u8>()).prop_map(|(k, n)| Step::HostList(k, n)),
        1 => any::<bool>().prop_map(Step::HostCall),
        2 => answer().prop_map(Step::AnswerHost),
        1 => (0u16..40_000).prop_map(Step::Advance),
        1 => Just(Step::Rebuild),
        1 => Just(Step::Crash),
    ]
}

fn digest(tools: &[Value]) -> Option<String> {
    Catalog::from_tools(tools.to_vec())
        .ok()
        .map(|c| c.digest().to_string())
}

/// The session, a server under the test's control, and what the test knows was said.
struct Run {
    h: Harness,
    version: u32,
    ntools: usize,
    builds: usize,
    /// The supervisor's catalog pages sent to the server: epoch, our id, cursor.
    pages: VecDeque<(String, u64, Option<String>)>,
    /// Host requests forwarded to the server: epoch, our id, method, cursor.
    forwarded: VecDeque<(String, u64, String, Option<String>)>,
    /// The server's cursors: the tools listed before it in its listing, and the offset.
    cursors: HashMap<String, (Vec<Value>, usize)>,
    next_cursor: u64,
    /// Digests of every list one fetch of the supervisor got whole (first to last page).
    fetched_whole: BTreeSet<String>,
    /// Digests of every state the server's tools were in.
    states: BTreeSet<String>,
    /// Host requests sent (ids), and for its lists the cursor asked for.
    requests: Vec<Value>,
    host_list_cursor: HashMap<String, Option<String>>,
    /// Host-side listings: a `nextCursor` the host got → the tools of its listing so far.
    host_listing: HashMap<String, Option<Vec<Value>>>,
    host_cursors: Vec<String>,
    /// Digests of every whole listing the host was sent.
    shown: BTreeSet<String>,
    seen_to_host: usize,
    /// Fetches started (first pages) since the last one ended (`fetch_ends` ended), their epoch.
    fetch_run: usize,
    fetch_epoch: String,
    fetch_ends: usize,
}

impl Run {
    fn new(gated: bool) -> Run {
        let policy = if gated {
            approval::Policy::default()
        } else {
            approval::Policy {
                gating: approval::Gating::Off,
                ..approval::Policy::default()
            }
        };
        let h = Harness::with_policy(|_| {}, policy);
        let mut r = Run {
            h,
            version: 1,
            ntools: 2,
            builds: 0,
            pages: VecDeque::new(),
            forwarded: VecDeque::new(),
            cursors: HashMap::new(),
            next_cursor: 0,
            fetched_whole: BTreeSet::new(),
            states: BTreeSet::new(),
            requests: Vec::new(),
            host_list_cursor: HashMap::new(),
            host_listing: HashMap::new(),
            host_cursors: Vec::new(),
            shown: BTreeSet::new(),
            seen_to_host: 0,
            fetch_run: 0,
            fetch_ends: 0,
            fetch_epoch: String::new(),
        };
        r.states.extend(digest(&r.server_tools()));
        let id = r.h.next_host_id;
        r.h.next_host_id += 1;
        r.host(json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params":
            {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}));
        r.requests.push(json!(id));
        r.host(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        r.rebuild();
        r
    }

    fn server_tools(&self) -> Vec<Value> {
        (0..self.ntools)
            .map(|i| tool(&format!("t{i}"), self.version))
            .collect()
    }

    fn handle(&mut self, e: Event) {
        self.h.handle(e);
        self.pump();
    }

    fn host(&mut self, msg: Value) {
        self.handle(Event::HostLine(msg.to_string().into_bytes()));
    }

    fn child_line(&mut self, epoch: &str, line: String) {
        self.handle(Event::ChildLine {
            epoch: epoch.to_string(),
            line: line.into_bytes(),
        });
    }

    /// The server reads what was sent to it: handshakes are answered at once, the rest queued.
    fn pump(&mut self) {
        while let Some((epoch, msg)) = self.h.io.to_child.pop_front() {
            if Some(epoch.as_str()) != self.h.s.current_epoch() {
                continue;
            }
            let (Some(id), Some(method)) = (msg["id"].as_u64(), msg["method"].as_str()) else {
                continue;
            };
            let cursor = msg["params"]["cursor"].as_str().map(str::to_string);
            let result = match method {
                "initialize" => json!({"protocolVersion": msg["params"]["protocolVersion"],
                    "capabilities": {"tools": {"listChanged": true}}, "serverInfo": {"name": "f", "version": "1"}}),
                "tools/list"
                    if matches!(
                        self.h.s.open_requests().get(&id),
                        Some(OpenRequest::CatalogPage)
                    ) =>
                {
                    if cursor.is_none() {
                        if self.fetch_epoch != epoch {
                            self.fetch_epoch = epoch.clone();
                            self.fetch_run = 0;
                        }
                        self.fetch_run += 1;
                    }
                    self.pages.push_back((epoch, id, cursor));
                    continue;
                }
                m => {
                    self.forwarded.push_back((epoch, id, m.to_string(), cursor));
                    continue;
                }
            };
            let line = json!({"jsonrpc": "2.0", "id": id, "result": result});
            self.h.handle(Event::ChildLine {
                epoch,
                line: line.to_string().into_bytes(),
            });
        }
    }

    /// A page of the server's current tools from `cursor`'s place: the line, and for a listing
    /// that ended, all its tools.
    fn page(&mut self, cursor: &Option<String>, n: Option<usize>) -> (Value, Option<Vec<Value>>) {
        let (mut before, offset) = match cursor {
            None => (Vec::new(), 0),
            Some(c) => self.cursors.get(c).cloned().unwrap_or_default(),
        };
        let tools = self.server_tools();
        let start = offset.min(tools.len());
        let end = n.map_or(tools.len(), |n| (start + n).min(tools.len()));
        let page = tools[start..end].to_vec();
        before.extend(page.clone());
        if end < tools.len() {
            self.next_cursor += 1;
            let c = format!("c{}", self.next_cursor);
            self.cursors.insert(c.clone(), (before, end));
            (json!({"tools": page, "nextCursor": c}), None)
        } else {
            (json!({"tools": page}), Some(before))
        }
    }

    /// The server answers request `id` of `epoch` as `how`; returns the listing's tools when a
    /// page of a listing ended it.
    fn reply(
        &mut self,
        epoch: &str,
        id: u64,
        cursor: &Option<String>,
        how: Answer,
    ) -> Option<Vec<Value>> {
        let mut ended = None;
        let line = match how {
            Answer::Page(n) => {
                let (result, whole) = self.page(cursor, Some(n as usize));
                ended = whole;
                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
            }
            Answer::Last => {
                let (result, whole) = self.page(cursor, None);
                ended = whole;
                json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
            }
            Answer::Error => json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32603, "message": "internal error"}})
            .to_string(),
            Answer::NotJson => {
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[],"x":NaN}}}}"#)
            }
            Answer::Unreadable => {
                json!({"jsonrpc": "2.0", "id": id, "result": "no list"}).to_string()
            }
            Answer::Cancel => json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
                "params": {"requestId": id, "reason": "gave up"}})
            .to_string(),
            Answer::Oversize => {
                let prefix = format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"tools":[{{"#);
                self.handle(Event::ChildOversize {
                    epoch: epoch.to_string(),
                    prefix: prefix.into_bytes(),
                    len: 1 << 30,
                });
                return None;
            }
        };
        self.child_line(epoch, line);
        ended
    }

    fn answer_page(&mut self, how: Answer) {
        let pending = self.h.s.open_requests();
        self.pages
            .retain(|(_, id, _)| matches!(pending.get(id), Some(OpenRequest::CatalogPage)));
        let Some((epoch, id, cursor)) = self.pages.pop_front() else {
            return;
        };
        // What a fetch got whole: its pages first to last. An error or an unreadable answer,
        // even to a first page, lists nothing (red-team round 21: an error was recorded as an
        // empty catalog, and a later first contact served `{"tools": []}`).
        let ended = self.reply(&epoch, id, &cursor, how);
        if let Some(tools) = ended {
            self.fetched_whole.extend(digest(&tools));
        }
    }

    fn answer_host(&mut self, how: Answer) {
        let pending = self.h.s.open_requests();
        self.forwarded
            .retain(|(_, id, _, _)| matches!(pending.get(id), Some(OpenRequest::Host { .. })));
        let Some((epoch, id, method, cursor)) = self.forwarded.pop_front() else {
            return;
        };
        match (method.as_str(), how) {
            ("tools/list", Answer::Page(_) | Answer::Last)
                if cursor
                    .as_ref()
                    .is_some_and(|c| !self.cursors.contains_key(c)) =>
            {
                self.reply(&epoch, id, &cursor, Answer::Error);
            }
            ("tools/list", _) => {
                self.reply(&epoch, id, &cursor, how);
            }
            (_, Answer::Page(_) | Answer::Last) => {
                let line = json!({"jsonrpc": "2.0", "id": id,
                    "result": {"content": [{"type": "text", "text": "ok"}]}});
                self.child_line(&epoch, line.to_string());
            }
            _ => {
                self.reply(&epoch, id, &cursor, how);
            }
        }
    }

    fn list_changed(&mut self) {
        if let Some(epoch) = self.h.current_epoch() {
            let line = json!({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"});
            self.child_line(&epoch, line.to_string());
        }
    }

    fn advance(&mut self, ms: u64) {
        let target = self.h.io().now_ms + ms;
        while let Some(timer) = self.h.io().take_due_timer(target) {
            self.handle(Event::Timer(timer));
            self.stopped();
        }
        self.h.io().now_ms = target;
    }

    /// Servers asked to stop have stopped.
    fn stopped(&mut self) {
        let stopped: Vec<String> = self.h.io().stopped.drain(..).collect();
        for epoch in stopped {
            self.handle(Event::ChildStopped { epoch });
        }
    }

    fn rebuild(&mut self) {
        self.builds += 1;
        let exe = format!("e{}", self.builds);
        self.handle(Event::BuildFinished(Box::new(complete(&exe))));
        self.stopped();
    }

    fn step(&mut self, step: Step) {
        match step {
            Step::ServerChanges(n) => {
                self.version += 1;
                self.ntools = n as usize;
                self.states.extend(digest(&self.server_tools()));
                self.list_changed();
            }
            Step::SpuriousListChanged => self.list_changed(),
            Step::AnswerPage(how) => self.answer_page(how),
            Step::HostList(kind, n) => {
                let cursor = match kind {
                    0 => None,
                    1 if !self.host_cursors.is_empty() => {
                        Some(self.host_cursors[n as usize % self.host_cursors.len()].clone())
                    }
                    _ => Some(format!("bogus{n}")),
                };
                let id = self.h.next_host_id;
                self.h.next_host_id += 1;
                let params = match &cursor {
                    Some(c) => json!({"cursor": c}),
                    None => json!({}),
                };
                self.host_list_cursor.insert(id.to_string(), cursor);
                self.requests.push(json!(id));
                self.host(
                    json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params}),
                );
            }
            Step::HostCall(second) => {
                let id = self.h.next_host_id;
                self.h.next_host_id += 1;
                self.requests.push(json!(id));
                let name = if second { "t1" } else { "t0" };
                self.host(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                    "params": {"name": name, "arguments": {}}}));
            }
            Step::AnswerHost(how) => self.answer_host(how),
            Step::Advance(ms) => self.advance(ms as u64),
            Step::Rebuild => self.rebuild(),
            Step::Crash => {
                if let Some(epoch) = self.h.current_epoch() {
                    self.handle(Event::ChildExited {
                        epoch,
                        exit: ExitInfo {
                            code: Some(1),
                            signal: None,
                        },
                    });
                    self.stopped();
                }
            }
        }
        self.observe_host();
    }

    /// The host's side: which whole listings it was sent.
    fn observe_host(&mut self) {
        let new: Vec<Value> = self.h.io().to_host[self.seen_to_host..].to_vec();
        self.seen_to_host += new.len();
        for m in new {
            let Some(cursor) = self.host_list_cursor.get(&m["id"].to_string()).cloned() else {
                continue;
            };
            if m.get("method").is_some() {
                continue;
            }
            let Some(tools) = m.pointer("/result/tools").and_then(Value::as_array) else {
                continue;
            };
            let so_far = match &cursor {
                None => Some(tools.clone()),
                Some(c) => self.host_listing.get(c).cloned().flatten().map(|mut t| {
                    t.extend(tools.iter().cloned());
                    t
                }),
            };
            match m.pointer("/result/nextCursor").and_then(Value::as_str) {
                Some(next) => {
                    self.host_cursors.push(next.to_string());
                    self.host_listing.insert(next.to_string(), so_far);
                }
                None => {
                    if let Some(d) = so_far.as_deref().and_then(digest) {
                        self.shown.insert(d);
                    }
                }
            }
        }
    }

    /// The invariants that hold after every step.
    fn check(&mut self, max_run: usize) -> Result<(), TestCaseError> {
        let ends = fetches_ended(&self.h.io);
        if ends > std::mem::replace(&mut self.fetch_ends, ends) {
            self.fetch_run = self.fetch_run.min(1); // at most one started since
        }
        let (s, io) = (&self.h.s, &self.h.io);
        if let Some(c) = s.server.child() {
            let pages = c
                .requests
                .values()
                .filter(|p| matches!(p, OpenRequest::CatalogPage))
                .count();
            let fetching = c.phase.name() == "FetchingCatalog";
            prop_assert_eq!(
                pages,
                fetching as usize,
                "phase {:?} with {} catalog pages pending (stuck or orphaned)",
                c.phase,
                pages
            );
        }
        let fetching = s
            .server
            .child()
            .is_some_and(|c| c.phase.name() == "FetchingCatalog");
        prop_assert!(
            self.fetch_run <= max_run,
            "{} fetches started in a row without one ending",
            self.fetch_run
        );
        if !fetching {
            self.fetch_run = 0;
        }
        if let Some(rec) = &s.recorded.catalog {
            prop_assert!(
                self.fetched_whole.contains(&rec.digest),
                "recorded catalog {:?} is no list a fetch got whole (status: {:?})",
                rec.tools,
                io.status
            );
        }
        // The server says `list_changed` whenever its tools change: a catalog mixing two of its
        // states is kept only once the refetches in a row ran out (and says so).
        let gave_up = io.status.iter().any(|l| l.contains("changed during each"));
        if let Some(rec) = &s.recorded.catalog
            && !gave_up
        {
            prop_assert!(
                self.states.contains(&rec.digest) || rec.tools.is_empty(),
                "recorded catalog {:?} mixes two states of the server",
                rec.tools
            );
        }
        for (kind, _, data) in &io.audit {
            // A single tool presented on its own (a stale call's result) is no listing.
            if kind == audit::CATALOG_PRESENTED
                && data["tool"].is_null()
                && let Some(d) = data["digest"].as_str()
            {
                prop_assert!(
                    self.shown.contains(d),
                    "catalog_presented {} for a list the host was not sent whole",
                    data
                );
            }
        }
        for id in &self.requests {
            let n = io
                .to_host
                .iter()
                .filter(|m| m.get("id") == Some(id) && m.get("method").is_none())
                .count();
            prop_assert!(n <= 1, "request {} answered {} times", id, n);
        }
        Ok(())
    }

    /// Everything the server holds is answered and every deadline passes: every host request
    /// has exactly one answer.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..8 {
            while !self.pages.is_empty() {
                self.answer_page(Answer::Last);
            }
            while !self.forwarded.is_empty() {
                self.answer_host(Answer::Last);
            }
            self.advance(120_000);
            self.observe_host();
            self.check(CATALOG_REFETCHES + 1)?;
        }
        for id in &self.requests {
            let n = self
                .h
                .io()
                .to_host
                .iter()
                .filter(|m| m.get("id") == Some(id) && m.get("method").is_none())
                .count();
            prop_assert_eq!(n, 1, "request {} answered {} times", id, n);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Over random catalog fetches (pages, errors, garbage, cancellations, `list_changed`
    /// mid-fetch, restarts) and host lists and calls: the fetch never hangs (a fetching server
    /// has exactly one page on its way, and no page is pending otherwise); at most
    /// `CATALOG_REFETCHES + 1` fetches start in a row; the recorded catalog is one a single
    /// fetch got whole; `catalog_presented` names only lists the host was sent whole; every host
    /// request is answered exactly once.
    #[test]
    fn catalog_fetch_invariants(steps in prop::collection::vec(step(), 1..48), gated in any::<bool>()) {
        let mut r = Run::new(gated);
        r.check(CATALOG_REFETCHES + 1)?;
        for step in steps {
            r.step(step);
            r.check(CATALOG_REFETCHES + 1)?;
        }
        r.drain()?;
    }
}
/// Fetches that ended: a record each, or a line saying the catalog stays or is not known.
fn fetches_ended(io: &FakeIo) -> usize {
    let ended = |l: &&String| l.contains("not known") || l.contains("stays");
    let records = io.audit.iter().filter(|a| a.0 == audit::CATALOG_REFRESHED);
    records.count() + io.status.iter().filter(ended).count()
}
