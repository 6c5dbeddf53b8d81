//! Catalog room: fetching each server's `tools/list`, publishing new revisions, and what the
//! host connection was shown.
//!
//! Owns: the supervisor's own paged `tools/list` (bounded), catalog revisions and their audit
//! records (`catalog_refreshed`, `catalog_presented`), the recorded catalog kept for later
//! first contacts, and telling the host when what it holds is outdated. Must not touch: gating
//! decisions (the gate judges per tool from what this room tells it), I/O (the port).

use serde_json::{Value, json};

use super::*;
use crate::catalog::Catalog;
use crate::hashing::short;
use crate::proxy::envelope::{self, Message};

impl<I: Io> Session<I> {
    pub(super) fn fetch_catalog(&mut self, cursor: Option<String>) {
        let modern = self.era() == Some(Era::Modern);
        let meta = self.host.modern_meta.clone();
        let Some(child) = &mut self.child else { return };
        if cursor.is_none() {
            child.catalog_pages.clear();
            child.pages_fetched = 0;
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
        self.io
            .to_child(&epoch, envelope::request_line(id, "tools/list", &params));
    }

    pub(super) fn on_catalog_page(&mut self, epoch: &str, msg: &Message) {
        if msg.is_error() {
            // A server without tools: an empty catalog is still a catalog (it said so).
            return self.catalog_complete(epoch, Vec::new());
        }
        let Some((tools_text, next)) = envelope::list_result_parts(msg.result()) else {
            return self.catalog_complete(epoch, Vec::new());
        };
        let tools: Vec<Value> = serde_json::from_str(tools_text).unwrap_or_default();
        let Some(pages_before) = self.child.as_ref().map(|c| c.pages_fetched) else {
            return;
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
                if more.is_some() {
                    let (pages, tools) = (c.pages_fetched, c.catalog_pages.len());
                    c.catalog_pages.truncate(MAX_CATALOG_TOOLS);
                    self.io.status(&format!(
                        "the server's tools/list kept paging ({pages} pages, {tools} tools): stopped at the limit of {MAX_CATALOG_PAGES} pages / {MAX_CATALOG_TOOLS} tools; the catalog holds what was fetched"
                    ));
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

    pub(super) fn catalog_complete(&mut self, epoch: &str, tools: Vec<Value>) {
        let catalog = match Catalog::from_tools(tools) {
            Ok(c) => c,
            Err(e) => {
                self.io.status(&format!(
                    "server's tools/list is invalid ({e}); treating its catalog as empty"
                ));
                Catalog::from_tools(Vec::new()).expect("empty catalog")
            }
        };
        self.known_list = self.pending_list_text.take().map(|tools_text| KnownList {
            tools_text,
            result_text: None,
            catalog: catalog.clone(),
        });
        let digests = catalog.tool_digests().clone();
        let tools_json = catalog.tools_json();
        let (revision, diff) = self.catalog.observe(catalog);
        self.gate.catalog_fetched(epoch, revision.clone(), digests);
        let summary = diff
            .as_ref()
            .map(|d| d.summary())
            .unwrap_or_else(|| "first".into());
        if let Some(d) = &diff {
            self.io.status(&format!(
                "catalog changed: revision {} ({}; {})",
                revision.number,
                short(&revision.digest),
                d.summary()
            ));
            for line in d.render_human() {
                self.io.status(&format!("  {line}"));
            }
        }
        self.audit_record(
            audit::CATALOG_REFRESHED,
            Some(epoch),
            json!({
                "revision": revision.number, "digest": revision.digest, "summary": summary,
                // Human lines only: server JSON may hold floats, which the audit encoding refuses.
                "changes": diff.as_ref().map(|d| d.render_human()),
            }),
        );
        let identity = self
            .child
            .as_ref()
            .map(|c| c.record.identity_digest.clone())
            .unwrap_or_default();
        let now = self.io.timestamp();
        self.recorded.catalog = Some(RecordedCatalog {
            tools: tools_json,
            digest: revision.digest.clone(),
            epoch: epoch.to_string(),
            identity_digest: identity,
            recorded_at: now,
        });
        let facts = self.recorded.clone();
        self.io.record_facts(&facts);
        // Tell the host only when what it holds is no longer current (or it holds nothing yet
        // because its request was refused).
        let refused = std::mem::take(&mut self.host.list_refused);
        if (self.host_list_outdated() || refused)
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
    pub(super) fn observe_host_list(&mut self, msg: &Message, known: bool) {
        if msg.is_error() {
            return;
        }
        // The same answer as last time, byte for byte: not even parsed again.
        let result_text = msg.result().map(|r| r.get());
        if self.host.list_pages.is_empty()
            && known
            && let Some(known) = self.known_list.take()
        {
            return self.show_known_list(known);
        }
        let Some((tools_text, next)) = envelope::list_result_parts(msg.result()) else {
            return;
        };
        if next.is_none() && self.host.list_pages.is_empty() {
            // The whole list in one page: the same bytes as last time need no new digest.
            let known = self
                .known_list
                .take()
                .filter(|k| k.tools_text == tools_text);
            let known = match known {
                Some(k) => k,
                None => {
                    let tools: Vec<Value> = serde_json::from_str(tools_text).unwrap_or_default();
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
        if let Ok(tools) = serde_json::from_str::<Vec<Value>>(tools_text) {
            self.host.list_pages.extend(tools);
        }
        if next.is_none() {
            let pages = std::mem::take(&mut self.host.list_pages);
            if let Ok(c) = Catalog::from_tools(pages)
                && self.host_was_shown(&c, "server", None)
            {
                self.publish();
            }
        }
    }

    /// The host was shown a whole one-page list whose catalog is known; it stays known.
    fn show_known_list(&mut self, known: KnownList) {
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
        if changed {
            self.gate
                .host_shown_catalog(shown.digest(), revision, shown.tool_digests().clone());
            self.host.shown_tools = shown
                .names()
                .filter_map(|n| shown.tool(n).map(|t| (n.to_string(), t.clone())))
                .collect();
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
