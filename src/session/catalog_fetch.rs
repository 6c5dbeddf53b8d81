//! Catalog room: fetching each server's `tools/list`, publishing new revisions, and what the
//! host connection was shown.
//!
//! Owns: the supervisor's own paged `tools/list` (bounded), catalog revisions and their audit
//! records (`catalog_refreshed`, `catalog_presented`), the recorded catalog kept for later
//! first contacts, and telling the host when what it holds is outdated. Must not touch: gating
//! decisions (the gate judges per tool from what this room tells it), I/O (effects are data: `effect`).

use serde_json::{Value, json};

use super::*;
use crate::catalog::Catalog;
use crate::hashing::short;
use crate::proxy::envelope::{self, Message};

impl Session {
    pub(super) fn fetch_catalog(&mut self, cursor: Option<String>) {
        let modern = self.era() == Some(Era::Modern);
        let meta = self.host.modern_meta.clone();
        let Some(child) = &mut self.child else { return };
        let first_page = cursor.is_none();
        if first_page {
            child.catalog_pages.clear();
            child.pages_fetched = 0;
            child.catalog_partial = false;
        }
        child.phase = ChildPhase::FetchingCatalog;
        let epoch = child.epoch.clone();
        let mut params = json!({});
        if let Some(c) = cursor {
            params["cursor"] = json!(c);
        }
        if modern {
            params["_meta"] = meta.unwrap_or(json!({}));
        }
        let id = self.alloc(Pending::CatalogPage {
            epoch: epoch.clone(),
        });
        // Each page has a deadline: a server that never answers must not leave the session
        // fetching (holding calls) for the rest of its epoch.
        self.set_answer_deadline();
        self.out
            .to_child(&epoch, envelope::request_line(id, "tools/list", &params));
        if first_page {
            // What waited for the server's handshake and does not need its list goes to it now.
            self.flush_held();
        }
    }

    /// The current server is fetching the list of tools again (it said `list_changed`) after
    /// giving this epoch a catalog; a call waits for it at most until its hold runs out.
    pub(super) fn refreshing(&self) -> bool {
        self.fetching() && self.gate.phase() != approval::Phase::IdentityPending
    }

    /// Whether the catalog is the current server's: not while a new server's first list is
    /// fetched or failed (the catalog is an earlier server's then). With no server running, the
    /// last one's.
    pub(super) fn catalog_is_this_servers(&self) -> bool {
        self.child.is_none() || self.gate.phase() != approval::Phase::IdentityPending
    }

    fn tools_unknown(&self) -> bool {
        self.child.as_ref().is_some_and(|c| c.tools_unknown)
    }

    fn fetching(&self) -> bool {
        matches!(&self.child, Some(c) if c.phase == ChildPhase::FetchingCatalog && !c.stopping)
    }

    /// Whether a host request (`method`) goes to the server while its catalog is fetched: all
    /// but a call, which is judged by the catalog, and a first list (first contact answers it
    /// with the catalog). The server is up: it answers the rest itself.
    pub(super) fn serves_during_fetch(&self, method: Option<&str>) -> bool {
        let unknown = self.tools_unknown();
        self.fetching()
            && match method {
                Some("tools/call" | "server/discover" | "subscriptions/listen") => false,
                // A server up for a while (its first list failed) answers it itself.
                Some("tools/list") => self.refreshing() || unknown,
                _ => true,
            }
    }

    /// A catalog page not answered by its deadline: the fetch is given up as a failed page.
    pub(super) fn catalog_deadline_over(&mut self) {
        let secs = self.handshake_deadline().as_secs_f64();
        self.give_up_fetch(&format!("was not answered within {secs} s"));
    }

    /// Ends the current fetch as a failed page (`why`); a late answer is not read as a page. A
    /// change announced meanwhile is fetched again (at most [`CATALOG_REFETCHES`] in a row).
    pub(super) fn give_up_fetch(&mut self, why: &str) {
        let Some(c) = &self.child else { return };
        let epoch = c.epoch.clone();
        self.pending
            .retain(|_, p| !matches!(p, Pending::CatalogPage { epoch: e } if *e == epoch));
        self.catalog_page_failed(&epoch, why);
    }

    pub(super) fn on_catalog_page(&mut self, epoch: &str, msg: &Message) {
        let Some(pages_before) = self.child.as_ref().map(|c| c.pages_fetched) else {
            return;
        };
        let first = pages_before == 0 && self.gate.phase() == approval::Phase::IdentityPending;
        if msg.is_error() && first && handshake::error_code(msg) == Some(-32601) {
            // It has no `tools/list` at all: no tools is what it said (a catalog without
            // tools, not recorded as a list it gave).
            self.mark_catalog_partial();
            return self.catalog_complete(epoch, Vec::new());
        }
        if msg.is_error() {
            // The server's own words, cut short (one line: the status sink escapes the rest).
            // Not "no tools", even on a first page: an error lists nothing, so nothing is
            // recorded as what this server listed (a later first contact would serve it).
            let line: Value = serde_json::from_slice(&msg.to_line()).unwrap_or_default();
            let why = line["error"]["message"].as_str().unwrap_or("an error");
            let why: String = why.chars().take(200).collect();
            return self.catalog_page_failed(epoch, &format!("failed ({why})"));
        }
        // `tools` must be an array: anything else is no list (never read as "no tools").
        let parts = envelope::list_result_parts(msg.result());
        let Some((tools_text, next, tools)) = parts.and_then(|(text, next)| {
            let tools = serde_json::from_str::<Vec<Value>>(text).ok()?;
            Some((text, next, tools))
        }) else {
            return self.catalog_page_failed(epoch, "was not a tool list");
        };
        // One page: remembered with its catalog, so the host's identical answers are cheap.
        self.pending_list_text =
            (pages_before == 0 && next.is_none()).then(|| tools_text.to_string());
        let Some(c) = &mut self.child else { return };
        c.catalog_pages.extend(tools);
        c.pages_fetched += 1;
        let over =
            c.pages_fetched >= MAX_CATALOG_PAGES || c.catalog_pages.len() > MAX_CATALOG_TOOLS;
        match next {
            Some(cursor) if !over => self.fetch_catalog(Some(cursor)),
            more => {
                if self.fetch_again_if_changed() {
                    return;
                }
                let Some(c) = &mut self.child else { return };
                if more.is_some() {
                    c.catalog_partial = true;
                    let (pages, tools) = (c.pages_fetched, c.catalog_pages.len());
                    c.catalog_pages.truncate(MAX_CATALOG_TOOLS);
                    self.out.status(StatusEvent::CatalogPagingLimit {
                        pages,
                        tools,
                        max_pages: MAX_CATALOG_PAGES,
                        max_tools: MAX_CATALOG_TOOLS,
                    });
                }
                let pages = self
                    .child
                    .as_mut()
                    .map(|c| std::mem::take(&mut c.catalog_pages))
                    .unwrap_or_default();
                self.catalog_complete(epoch, pages);
            }
        }
    }

    /// The server said `list_changed` during this fetch: its pages may mix two states, so
    /// the fetch starts over (a bounded number of times in a row). Returns whether it did.
    fn fetch_again_if_changed(&mut self) -> bool {
        let Some(c) = &mut self.child else {
            return false;
        };
        if !std::mem::take(&mut c.changed_while_fetching) {
            return false;
        }
        if c.refetches >= CATALOG_REFETCHES {
            // It may mix two states: it gates calls, but is not recorded as a whole list.
            c.catalog_partial = true;
            self.out.status(StatusEvent::CatalogChangedDuringFetches {
                fetches: CATALOG_REFETCHES,
            });
            return false;
        }
        c.refetches += 1;
        self.pending_list_text = None;
        self.fetch_catalog(None);
        true
    }

    /// A page that failed: an error after the first page (an expired cursor) or in a refresh,
    /// not JSON, over the line limit, cancelled by the server. Not "no tools": a catalog this
    /// server already gave stays; with none yet, the pages fetched are what it listed (as at
    /// the page bound), or an empty catalog when the first page failed, said in a status line
    /// and never recorded as a whole list. `why` completes "the server's tools/list page N …".
    /// The fetch ends either way: the session never waits for it.
    pub(super) fn catalog_page_failed(&mut self, epoch: &str, why: &str) {
        if self.child.is_none() || self.fetch_again_if_changed() {
            return;
        }
        let pages = self
            .child
            .as_mut()
            .map(|c| (c.pages_fetched, std::mem::take(&mut c.catalog_pages)))
            .unwrap_or_default();
        self.pending_list_text = None;
        if self.gate.phase() != approval::Phase::IdentityPending {
            return self.keep_catalog(StatusEvent::CatalogPageFailedKept {
                page: pages.0 + 1,
                why: why.to_string(),
            });
        }
        if pages.0 == 0 {
            return self.catalog_unknown(why);
        }
        self.out.status(StatusEvent::CatalogPageFailedPartial {
            page: pages.0 + 1,
            why: why.to_string(),
            fetched: pages.0,
        });
        self.mark_catalog_partial();
        self.catalog_complete(epoch, pages.1);
    }

    /// A new server's first list failed before any page came (`why`: an error, no answer by
    /// the deadline, no list): its tools are not known, and nothing is published as its
    /// catalog (no revision, no `list_changed`: no server said anything about its tools). It
    /// serves every other request; a call is refused as `identity_pending` until a fetch
    /// succeeds: after its `list_changed`, or when the host lists tools (red-team round 22: a
    /// slow first list was announced as "every tool removed").
    fn catalog_unknown(&mut self, why: &str) {
        self.out.status(StatusEvent::CatalogUnknown {
            why: why.to_string(),
        });
        if let Some(c) = &mut self.child {
            c.refetches = 0;
            c.tools_unknown = true;
            c.quiet_fetch = false; // what the next fetch brings is news to the host
        }
        self.set_phase(ChildPhase::Ready);
        if self.lifecycle != Lifecycle::Stopping {
            self.lifecycle = Lifecycle::Serving;
        }
        self.flush_held();
        self.publish();
    }

    /// A refresh that brought no usable list: the catalog this server gave stays, and the
    /// fetch is over (`line` says why on the terminal).
    fn keep_catalog(&mut self, event: StatusEvent) {
        self.out.status(event);
        if let Some(c) = &mut self.child {
            c.refetches = 0;
            c.quiet_fetch = false;
        }
        self.set_phase(ChildPhase::Ready);
        self.flush_held();
    }

    fn mark_catalog_partial(&mut self) {
        if let Some(c) = &mut self.child {
            c.catalog_partial = true;
        }
    }

    pub(super) fn catalog_complete(&mut self, epoch: &str, tools: Vec<Value>) {
        // Whatever ended the fetch, a change the server announced during it is fetched.
        if self.fetch_again_if_changed() {
            return;
        }
        let (mut whole, mut quiet) = (true, false);
        if let Some(c) = &mut self.child {
            c.refetches = 0;
            whole = !std::mem::take(&mut c.catalog_partial);
            quiet = std::mem::take(&mut c.quiet_fetch);
        }
        let catalog = match Catalog::from_tools(tools) {
            Ok(c) => c,
            // A refresh that is no catalog (a name twice, as overlapping pages give) is no
            // news: the server still serves the tools it listed (red-team round 21: every
            // tool was announced removed).
            Err(e) if self.gate.phase() != approval::Phase::IdentityPending => {
                self.pending_list_text = None;
                return self.keep_catalog(StatusEvent::CatalogInvalidKept { why: e.to_string() });
            }
            // A new server's first list that is no catalog: its tools are not known (round 23:
            // an empty catalog announced every tool removed).
            Err(e) => {
                self.pending_list_text = None;
                return self.catalog_unknown(&format!("is invalid ({e})"));
            }
        };
        self.known_list = self.pending_list_text.take().map(|tools_text| KnownList {
            tools_text,
            result_text: None,
            catalog: catalog.clone(),
        });
        // Cut at the page or tool bound: a host's whole list always differs from it.
        let bound = catalog.len() >= MAX_CATALOG_TOOLS;
        if let Some(c) = &mut self.child {
            c.catalog_cut = !whole && (bound || c.pages_fetched >= MAX_CATALOG_PAGES);
            c.tools_unknown = false;
        }
        let digests = catalog.tool_digests().clone();
        let tools_json = catalog.tools_json();
        let had_catalog = self.catalog.current().is_some();
        let (revision, diff) = self.catalog.observe(catalog);
        self.gate.catalog_fetched(epoch, revision.clone(), digests);
        let summary = match &diff {
            Some(d) => d.summary(),
            None if had_catalog => "unchanged".into(),
            None => "first".into(),
        };
        let changes = diff.as_ref().map(|d| bounded_diff_lines(d.render_human()));
        if let Some(d) = &diff {
            self.out.status(StatusEvent::CatalogChanged {
                revision: revision.number,
                digest: short(&revision.digest).to_string(),
                summary: d.summary(),
            });
            for line in changes.iter().flatten() {
                self.out
                    .status(StatusEvent::CatalogChange { line: line.clone() });
            }
        }
        self.audit_record(
            audit::CATALOG_REFRESHED,
            Some(epoch),
            json!({
                "revision": revision.number, "digest": revision.digest, "summary": summary,
                // Human lines only: server JSON may hold floats, which the audit encoding refuses.
                "changes": changes,
            }),
        );
        let identity = self
            .child
            .as_ref()
            .map(|c| c.record.identity_digest.clone())
            .unwrap_or_default();
        let now = self.now.timestamp();
        // Only a whole list is kept as what this package's server said (never a cut one).
        if whole {
            self.recorded.catalog = Some(RecordedCatalog {
                tools: tools_json,
                digest: revision.digest.clone(),
                epoch: epoch.to_string(),
                identity_digest: identity,
                recorded_at: now,
            });
            let facts = self.recorded.clone();
            self.out.record_facts(&facts);
        }
        // Tell the host only when what it holds is no longer current (or it holds nothing yet
        // because its request was refused).
        let refused = std::mem::take(&mut self.host.list_refused);
        if (self.host_list_outdated() && !quiet || refused)
            && self.host.notified_revision != Some(revision.number)
        {
            self.notify_list_changed();
        }
        self.set_phase(ChildPhase::Ready);
        self.lifecycle = match &self.lifecycle {
            Lifecycle::Stopping => Lifecycle::Stopping,
            _ => Lifecycle::Serving,
        };
        self.flush_held();
        self.publish();
    }

    /// Whether the last whole catalog the host was shown differs from the current one (new
    /// tools count: the host should hear about them, though calls to unchanged tools are not
    /// stale).
    pub(super) fn host_list_outdated(&self) -> bool {
        match (self.gate.host_catalog(), self.catalog.current()) {
            (Some(shown), Some(current)) => shown != current.digest,
            _ => false,
        }
    }

    /// Whether a `tools/list` result is, byte for byte, the last one-page list read: readable,
    /// without reading its tools again (a 1,000-tool answer takes ~0.4 ms to read, and a host
    /// lists the same catalog again and again).
    pub(super) fn is_known_list_result(&self, result: Option<envelope::Raw<'_>>) -> bool {
        let known = self
            .known_list
            .as_ref()
            .and_then(|k| k.result_text.as_deref());
        matches!((known, result), (Some(k), Some(r)) if k == r.get())
    }

    /// A `tools/list` answer of the server reached the host: merge its pages, and when the last
    /// one passed, that is what this host connection now holds. `known`: the answer's result
    /// is [`Session::is_known_list_result`] (the caller compared it before forwarding).
    /// `id`: ours for the request. A first-page answer starts a listing afresh; a page asked
    /// for with the open listing's cursor continues it; any other answer (a cursor from
    /// elsewhere, a request no longer kept) is forwarded but is no catalog the host holds.
    pub(super) fn observe_host_list(&mut self, msg: &Message, known: bool, id: u64) {
        let kept = &mut self.host.list_requests;
        let Some(at) = kept.iter().position(|(ours, _)| *ours == id) else {
            return;
        };
        let (_, cursor) = kept.remove(at).expect("found");
        let first = match cursor {
            None => {
                self.host.list_pages.clear();
                self.host.list_next = None;
                true
            }
            Some(c) if self.host.list_next.as_deref() == Some(c.as_str()) => false,
            Some(_) => return,
        };
        if msg.is_error() {
            // The listing ends without a catalog.
            self.host.list_pages.clear();
            self.host.list_next = None;
            return;
        }
        // The same answer as last time, byte for byte: not even parsed again.
        let result_text = msg.result().map(|r| r.get());
        if first
            && known
            && let Some(known) = self.known_list.take()
        {
            return self.show_known_list(known);
        }
        let Some((tools_text, next)) = envelope::list_result_parts(msg.result()) else {
            self.host.list_pages.clear();
            self.host.list_next = None;
            return;
        };
        if first && next.is_none() {
            // The whole list in one page: the same bytes as last time need no new digest.
            let known = self
                .known_list
                .take()
                .filter(|k| k.tools_text == tools_text);
            let known = match known {
                Some(k) => k,
                None => {
                    let Ok(tools) = serde_json::from_str::<Vec<Value>>(tools_text) else {
                        return; // no list: the host holds no catalog from it
                    };
                    let Ok(catalog) = Catalog::from_tools(tools) else {
                        return;
                    };
                    KnownList {
                        tools_text: tools_text.to_string(),
                        result_text: None,
                        catalog,
                    }
                }
            };
            return self.show_known_list(KnownList {
                result_text: result_text.map(str::to_string),
                ..known
            });
        }
        let Ok(tools) = serde_json::from_str::<Vec<Value>>(tools_text) else {
            // A page that is no list ends the listing without a catalog.
            self.host.list_pages.clear();
            self.host.list_next = None;
            return;
        };
        self.host.list_pages.extend(tools);
        self.host.list_next = next.clone();
        if self.host.list_pages.len() > MAX_CATALOG_TOOLS {
            self.host.list_pages = Vec::new();
            self.host.list_next = None;
            self.out.verbose(StatusEvent::HostListTooLong {
                max_tools: MAX_CATALOG_TOOLS,
            });
            return;
        }
        if next.is_none() {
            let pages = std::mem::take(&mut self.host.list_pages);
            if let Ok(c) = Catalog::from_tools(pages) {
                self.fetch_if_listed_newer(&c);
                if self.host_was_shown(&c, "server", None) {
                    self.publish();
                }
            }
        }
    }

    /// The server just listed the host a catalog other than the one it gave the supervisor:
    /// its tools changed without `list_changed` (allowed: hosts must not rely on it). Fetched
    /// again, so calls are judged by what the server lists now, never refused with an older
    /// definition than the host was just shown.
    /// During a fetch the list is fetched again when it ends; a catalog cut at the page bound
    /// differs from any whole list and triggers nothing. Such a fetch tells the host nothing
    /// (`quiet_fetch`). Also how the tools of a server whose first list failed become known.
    fn fetch_if_listed_newer(&mut self, listed: &Catalog) {
        let unknown = self.gate.phase() == approval::Phase::IdentityPending;
        let current = self.catalog.current().map(|r| r.digest.as_str());
        let differs = unknown || current.is_none_or(|d| d != listed.digest());
        let fetching = self.fetching();
        let ready = self.child_ready();
        let Some(c) = &mut self.child else { return };
        if !differs || c.catalog_cut || c.stopping {
            return;
        }
        if fetching {
            c.changed_while_fetching = true;
            return;
        }
        if !ready {
            return;
        }
        c.quiet_fetch = true;
        self.out.verbose(StatusEvent::CatalogDrift);
        self.fetch_catalog(None);
    }
    /// The host was shown a whole one-page list whose catalog is known; it stays known.
    fn show_known_list(&mut self, known: KnownList) {
        self.fetch_if_listed_newer(&known.catalog);
        let changed = self.host_was_shown(&known.catalog, "server", None);
        self.known_list = Some(known);
        if changed {
            self.publish();
        }
    }

    /// Records a whole catalog shown to the host (`catalog_presented`) and tells the gate.
    /// Returns whether what the host holds changed (a host listing the same catalog again
    /// changes nothing but the record: no per-tool copies, no new status document).
    pub(super) fn host_was_shown(
        &mut self,
        shown: &Catalog,
        source: &str,
        provenance: Option<(&str, &str)>,
    ) -> bool {
        let revision = self
            .catalog
            .current()
            .filter(|r| r.digest == shown.digest())
            .map(|r| r.number);
        let view = (shown.digest().to_string(), revision);
        let changed = self.host.shown_whole.as_ref() != Some(&view);
        // A fetch started by a host's listing tells the host nothing only while what the host
        // holds came from the server (round 23: a recorded list was answered meanwhile).
        if source != "server"
            && let Some(c) = &mut self.child
        {
            c.quiet_fetch = false;
        }
        if changed {
            self.gate
                .host_shown_catalog(shown.digest(), revision, shown.tool_digests().clone());
            self.host.show_tools(
                shown
                    .names()
                    .filter_map(|n| shown.tool(n).map(|t| (n.to_string(), t.clone())))
                    .collect(),
            );
            self.host.shown_whole = Some(view);
        }
        let epoch = self.current_epoch().map(str::to_string);
        let data = crate::audit::records::CatalogPresented {
            connection: self.agent_run.to_string(),
            source: source.to_string(),
            digest: Some(shown.digest().to_string()),
            revision,
            tools: Some(shown.len() as u64),
            tool: None,
            recorded_epoch: provenance.map(|(e, _)| e.to_string()),
            recorded_identity: provenance.map(|(_, i)| i.to_string()),
        };
        self.audit_record(audit::CATALOG_PRESENTED, epoch.as_deref(), data.canonical());
        changed
    }
}

/// Lines of a catalog diff shown on the terminal and kept in `catalog_refreshed`.
const DIFF_LINES: usize = 200;
/// Characters of one such line (a description is the server's and may be megabytes long).
const DIFF_LINE_CHARS: usize = 2000;

/// The diff's human lines, bounded: a server that changes a huge description (or thousands of
/// tools) must not make a record longer than a reader accepts, nor flood the terminal. The
/// digests in the record and the stored catalog say exactly what changed.
fn bounded_diff_lines(lines: Vec<String>) -> Vec<String> {
    let total = lines.len();
    let mut out: Vec<String> = lines
        .into_iter()
        .take(DIFF_LINES)
        .map(|line| match line.char_indices().nth(DIFF_LINE_CHARS) {
            Some((cut, _)) => {
                let rest = line[cut..].chars().count();
                format!("{}… ({rest} more characters)", &line[..cut])
            }
            None => line,
        })
        .collect();
    if total > DIFF_LINES {
        out.push(format!("… and {} more lines", total - DIFF_LINES));
    }
    out
}
