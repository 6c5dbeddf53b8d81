//! Catalog room: fetching each server's `tools/list`, publishing new revisions, and what the
//! host connection was shown.
//!
//! Owns: the supervisor's own paged `tools/list` (bounded), catalog revisions and their audit
//! records (`catalog_refreshed`, `catalog_presented`), the recorded catalog kept for later
//! first contacts, and telling the host when what it holds is outdated. Must not touch: gating
//! decisions (the gate judges per tool from what this room tells it), I/O (effects are data: `effect`).

use serde_json::{Value, json};

use super::*;
use crate::base::hashing::short;
use crate::policy::catalog::Catalog;
use crate::wire::proxy::envelope::{self, Message};

impl Session {
    /// Starts a fetch of the current server's tools (its first list, or a refresh), or starts
    /// the one in flight over from its first page (a change was announced during it; the run
    /// of refetches keeps its audience and count). `audience`: whether the host hears about
    /// what it brings; a fetch started over keeps its own.
    pub(super) fn fetch_tools(&mut self, audience: Audience) {
        let due = self.now() + self.handshake_deadline().as_millis() as u64;
        let Some(child) = self.server.child_mut() else {
            return;
        };
        if !child.phase.fetch_begins(audience, due) {
            return;
        }
        self.request_page(None, due);
        // What waited for the server's handshake and does not need its list goes to it now.
        self.flush_held();
    }

    /// Asks for one page of the fetch in flight (`cursor`: `None` for the first), due by `due`.
    fn request_page(&mut self, cursor: Option<String>, due: u64) {
        let modern = self.era() == Some(Era::Modern);
        let meta = self.host.modern_meta.clone();
        let Some(child) = self.server.child_mut() else {
            return;
        };
        let Some(fetch) = child.phase.fetch_mut() else {
            return;
        };
        fetch.due_ms = due;
        let epoch = child.epoch.clone();
        let mut params = json!({});
        if let Some(c) = cursor {
            params["cursor"] = json!(c);
        }
        if modern {
            params["_meta"] = meta.unwrap_or(json!({}));
        }
        let id = self.alloc(OpenRequest::CatalogPage);
        // Each page has a deadline: a server that never answers must not leave the session
        // fetching (holding calls) for the rest of its epoch.
        self.arm_server_timer(due);
        self.step
            .out
            .to_child(&epoch, envelope::request_line(id, "tools/list", &params));
    }

    /// The fetch in flight of the current server.
    fn fetch_mut(&mut self) -> Option<&mut Fetch> {
        self.server.child_mut().and_then(|c| c.phase.fetch_mut())
    }

    /// Whether the catalog is the current server's: not while a new server's first list is
    /// fetched or failed (the catalog is an earlier server's then). With no server running, the
    /// last one's.
    pub(super) fn catalog_is_this_servers(&self) -> bool {
        self.child_phase().is_none_or(|p| !p.listed().no_catalog())
    }

    /// A catalog page not answered by its deadline: the fetch is given up as a failed page.
    pub(super) fn catalog_deadline_over(&mut self) {
        let secs = self.handshake_deadline().as_secs_f64();
        self.give_up_fetch(&format!("was not answered within {secs} s"));
    }

    /// Ends the current fetch as a failed page (`why`); a late answer is not read as a page. A
    /// change announced meanwhile is fetched again (at most [`CATALOG_REFETCHES`] in a row).
    pub(super) fn give_up_fetch(&mut self, why: &str) {
        let Some(c) = self.server.child_mut() else {
            return;
        };
        let epoch = c.epoch.to_string();
        c.requests
            .retain(|_, p| !matches!(p, OpenRequest::CatalogPage));
        self.catalog_page_failed(&epoch, why);
    }

    pub(super) fn on_catalog_page(&mut self, epoch: &str, msg: &Message) {
        let Some(fetch) = self.child_phase().and_then(ChildPhase::fetch) else {
            return;
        };
        let pages_before = fetch.pages_fetched;
        let first = pages_before == 0 && fetch.of.no_catalog();
        if msg.is_error() && first && handshake::error_code(msg) == Some(-32601) {
            // It has no `tools/list` at all: no tools is what it said (a catalog without
            // tools, not recorded as a list it gave).
            self.mark_fetch_short();
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
        let Some(f) = self.fetch_mut() else { return };
        // One page: remembered with its catalog, so the host's identical answers are cheap.
        f.one_page_text = (pages_before == 0 && next.is_none()).then(|| tools_text.to_string());
        f.pages.extend(tools);
        f.pages_fetched += 1;
        let over = f.pages_fetched >= MAX_CATALOG_PAGES || f.pages.len() > MAX_CATALOG_TOOLS;
        match next {
            Some(cursor) if !over => {
                let due = self.now() + self.handshake_deadline().as_millis() as u64;
                self.request_page(Some(cursor), due)
            }
            more => {
                if self.fetch_again_if_changed() {
                    return;
                }
                let Some(f) = self.fetch_mut() else { return };
                if more.is_some() {
                    f.coverage = Coverage::Short;
                    let (pages, tools) = (f.pages_fetched, f.pages.len());
                    f.pages.truncate(MAX_CATALOG_TOOLS);
                    self.step.out.status(StatusEvent::CatalogPagingLimit {
                        pages,
                        tools,
                        max_pages: MAX_CATALOG_PAGES,
                        max_tools: MAX_CATALOG_TOOLS,
                    });
                }
                let pages = self
                    .fetch_mut()
                    .map(|f| std::mem::take(&mut f.pages))
                    .unwrap_or_default();
                self.catalog_complete(epoch, pages);
            }
        }
    }

    /// The server said `list_changed` during this fetch: its pages may mix two states, so
    /// the fetch starts over (a bounded number of times in a row). Returns whether it did.
    fn fetch_again_if_changed(&mut self) -> bool {
        let Some(f) = self.fetch_mut() else {
            return false;
        };
        if std::mem::replace(&mut f.change, ChangeDuringFetch::None) == ChangeDuringFetch::None {
            return false;
        }
        if f.refetches >= CATALOG_REFETCHES {
            // It may mix two states: it gates calls, but is not recorded as a whole list.
            f.coverage = Coverage::Short;
            self.step
                .out
                .status(StatusEvent::CatalogChangedDuringFetches {
                    fetches: CATALOG_REFETCHES,
                });
            return false;
        }
        f.refetches += 1;
        self.fetch_tools(Audience::Host);
        true
    }

    /// A page that failed: an error after the first page (an expired cursor) or in a refresh,
    /// not JSON, over the line limit, cancelled by the server. Not "no tools": a catalog this
    /// server already gave stays; with none yet, the pages fetched are what it listed (as at
    /// the page bound), or an empty catalog when the first page failed, said in a status line
    /// and never recorded as a whole list. `why` completes "the server's tools/list page N …".
    /// The fetch ends either way: the session never waits for it.
    pub(super) fn catalog_page_failed(&mut self, epoch: &str, why: &str) {
        if self.fetch_mut().is_none() || self.fetch_again_if_changed() {
            return;
        }
        let Some(f) = self.fetch_mut() else { return };
        let (of, fetched, pages) = (f.of, f.pages_fetched, std::mem::take(&mut f.pages));
        if let Listed::Known(extent) = of {
            return self.keep_catalog(
                extent,
                StatusEvent::CatalogPageFailedKept {
                    page: fetched + 1,
                    why: why.to_string(),
                },
            );
        }
        if fetched == 0 {
            return self.catalog_unknown(of, why);
        }
        self.step.out.status(StatusEvent::CatalogPageFailedPartial {
            page: fetched + 1,
            why: why.to_string(),
            fetched,
        });
        self.mark_fetch_short();
        self.catalog_complete(epoch, pages);
    }

    /// A new server's first list failed before any page came (`why`: an error, no answer by
    /// the deadline, no list): its tools are not known, and nothing is published as its
    /// catalog (no revision, no `list_changed`: no server said anything about its tools). It
    /// serves every other request; a call is refused as `identity_pending` until a fetch
    /// succeeds: after its `list_changed`, or when the host lists tools (red-team round 22: a
    /// slow first list was announced as "every tool removed"). `of`: what the fetch began
    /// from (a retry keeps when a call last asked).
    fn catalog_unknown(&mut self, of: Listed, why: &str) {
        self.step.out.status(StatusEvent::CatalogUnknown {
            why: why.to_string(),
        });
        let asked_ms = match of {
            Listed::Unknown { asked_ms } => asked_ms,
            _ => None,
        };
        self.end_fetch(Tools::Unknown { asked_ms });
        if self.lifecycle != Lifecycle::Stopping {
            self.lifecycle = Lifecycle::Serving;
        }
        self.flush_held();
        self.publish();
    }

    /// A refresh that brought no usable list: the catalog this server gave stays, and the
    /// fetch is over (`line` says why on the terminal).
    fn keep_catalog(&mut self, extent: Extent, event: StatusEvent) {
        self.step.out.status(event);
        self.end_fetch(Tools::Known(extent));
        self.flush_held();
    }

    /// The fetch in flight is over: the server's tools are now `tools`.
    fn end_fetch(&mut self, tools: Tools) {
        if let Some(c) = self.server.child_mut() {
            c.phase.fetch_ended(tools);
        }
    }

    fn mark_fetch_short(&mut self) {
        if let Some(f) = self.fetch_mut() {
            f.coverage = Coverage::Short;
        }
    }

    pub(super) fn catalog_complete(&mut self, epoch: &str, tools: Vec<Value>) {
        // Whatever ended the fetch, a change the server announced during it is fetched.
        if self.fetch_again_if_changed() {
            return;
        }
        let Some(f) = self.fetch_mut() else { return };
        let (of, whole, quiet, pages_fetched, one_page_text) = (
            f.of,
            f.coverage == Coverage::Whole,
            f.audience == Audience::Quiet,
            f.pages_fetched,
            f.one_page_text.take(),
        );
        let catalog = match Catalog::from_tools(tools) {
            Ok(c) => c,
            // A refresh that is no catalog (a name twice, as overlapping pages give) is no
            // news: the server still serves the tools it listed (red-team round 21: every
            // tool was announced removed).
            Err(e) if !of.no_catalog() => {
                let Listed::Known(extent) = of else {
                    unreachable!("a catalog")
                };
                return self.keep_catalog(
                    extent,
                    StatusEvent::CatalogInvalidKept { why: e.to_string() },
                );
            }
            // A new server's first list that is no catalog: its tools are not known (round 23:
            // an empty catalog announced every tool removed).
            Err(e) => return self.catalog_unknown(of, &format!("is invalid ({e})")),
        };
        self.catalogs.known_list = one_page_text.map(|tools_text| KnownList {
            tools_text,
            result_text: None,
            catalog: catalog.clone(),
        });
        // Cut at the page or tool bound: a host's whole list always differs from it.
        let bound = catalog.len() >= MAX_CATALOG_TOOLS;
        let extent = if !whole && (bound || pages_fetched >= MAX_CATALOG_PAGES) {
            Extent::CutAtBound
        } else {
            Extent::Listed
        };
        self.end_fetch(Tools::Known(extent));
        let tools_json = catalog.tools_json();
        let had_catalog = self.catalogs.history.current().is_some();
        let (revision, diff) = self.catalogs.history.observe(catalog);
        let summary = match &diff {
            Some(d) => d.summary(),
            None if had_catalog => "unchanged".into(),
            None => "first".into(),
        };
        let changes = diff.as_ref().map(|d| bounded_diff_lines(d.render_human()));
        if let Some(d) = &diff {
            self.step.out.status(StatusEvent::CatalogChanged {
                revision: revision.number,
                digest: short(&revision.digest).to_string(),
                summary: d.summary(),
            });
            for line in changes.iter().flatten() {
                self.step
                    .out
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
            .server
            .child()
            .map(|c| c.record.identity_digest.clone())
            .unwrap_or_default();
        let now = self.step.now.timestamp();
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
            self.step.out.record_facts(&facts);
        }
        // Tell the host only when what it holds is no longer current (or it holds nothing yet
        // because its request was refused).
        let refused = std::mem::take(&mut self.host.list_refused);
        if (self.host_list_outdated() && !quiet || refused)
            && self.host.notified_revision != Some(revision.number)
        {
            self.notify_list_changed();
        }
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
        match (
            self.approvals.gate.host_catalog(),
            self.catalogs.history.current(),
        ) {
            (Some(shown), Some(current)) => shown != current.digest,
            _ => false,
        }
    }

    /// Whether a `tools/list` result is, byte for byte, the last one-page list read: readable,
    /// without reading its tools again (a 1,000-tool answer takes ~0.4 ms to read, and a host
    /// lists the same catalog again and again).
    pub(super) fn is_known_list_result(&self, result: Option<envelope::Raw<'_>>) -> bool {
        let known = self
            .catalogs
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
            && let Some(known) = self.catalogs.known_list.take()
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
                .catalogs
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
            self.step.out.verbose(StatusEvent::HostListTooLong {
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
        let Some(phase) = self.child_phase() else {
            return;
        };
        let said = phase.listed();
        let current = self.catalogs.history.current().map(|r| r.digest.as_str());
        let differs = said.no_catalog() || current.is_none_or(|d| d != listed.digest());
        if !differs || said == Listed::Known(Extent::CutAtBound) {
            return;
        }
        let ready = phase.is_ready();
        if let Some(f) = self.fetch_mut() {
            f.change = ChangeDuringFetch::Announced;
            return;
        }
        if !ready {
            return;
        }
        self.step.out.verbose(StatusEvent::CatalogDrift);
        self.fetch_tools(Audience::Quiet);
    }
    /// The host was shown a whole one-page list whose catalog is known; it stays known.
    fn show_known_list(&mut self, known: KnownList) {
        self.fetch_if_listed_newer(&known.catalog);
        let changed = self.host_was_shown(&known.catalog, "server", None);
        self.catalogs.known_list = Some(known);
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
            .catalogs
            .history
            .current()
            .filter(|r| r.digest == shown.digest())
            .map(|r| r.number);
        // A fetch started by a host's listing tells the host nothing only while what the host
        // holds came from the server (round 23: a recorded list was answered meanwhile).
        if source != "server"
            && let Some(f) = self.fetch_mut()
        {
            f.audience = Audience::Host;
        }
        let digests = shown.tool_digests();
        let changed = self.approvals.gate.host_view_mut().show_catalog(
            shown.digest(),
            revision,
            shown.names().filter_map(|n| {
                let definition = shown.tool(n)?.clone();
                Some((n.to_string(), digests.get(n)?.clone(), definition))
            }),
        );
        let epoch = self.current_epoch().map(str::to_string);
        let data = crate::audit::records::CatalogPresented {
            connection: self.agent_run().to_string(),
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
