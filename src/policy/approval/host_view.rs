//! What one host connection was shown of the server's tools: kept once, here.
//!
//! Owns: per tool, the definition the host holds (its digest, the catalog revision it was shown
//! in, the definition itself and the different one it replaced), the digest of the last whole
//! catalog shown, and whether the view is exactly that catalog. The gate judges stale calls
//! from it; the session's router reads the definitions to show what changed; the status
//! document reads the catalog digest. Before issue 34 the same facts lived in three places
//! (the gate's view, the session's host connection and its list caches) and could disagree.
//!
//! Must not touch: I/O, decisions (the gate decides; this records).

use std::collections::BTreeMap;

use serde_json::Value;

/// One tool as the host connection was last shown it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownTool {
    /// Digest of the definition (the fields the catalog digest covers).
    pub digest: String,
    /// The catalog revision it was shown in, when it was the current one.
    pub revision: Option<u64>,
    /// The definition itself, as the host was shown it.
    pub definition: Value,
    /// The different definition this host was shown before this one: what a model that kept
    /// its old definition holds (a call whose arguments do not match is shown the diff from it).
    pub replaced: Option<Value>,
}

/// One tool being shown: its name, definition digest and definition.
pub type Showing = (String, String, Value);

/// What the host connection holds.
#[derive(Debug, Clone, Default)]
pub struct HostView {
    /// Per tool, what the host was last shown (`None`: never shown a catalog or a tool).
    tools: Option<BTreeMap<String, ShownTool>>,
    /// Digest of the last whole catalog the host was shown (kept when single tools are shown
    /// after it).
    catalog: Option<String>,
    /// The whole catalog the view is exactly, `(digest, revision)`; `None` once a single tool
    /// was presented on its own (a refused call's result carries it).
    whole: Option<(String, Option<u64>)>,
}

impl HostView {
    /// The host received a whole catalog (a `tools/list` answer, all pages) of `digest`, the
    /// current revision when it is the current one. Returns whether what the host holds
    /// changed (the same catalog listed again changes nothing).
    pub fn show_catalog(
        &mut self,
        digest: &str,
        revision: Option<u64>,
        tools: impl IntoIterator<Item = Showing>,
    ) -> bool {
        let whole = (digest.to_owned(), revision);
        if self.whole.as_ref() == Some(&whole) {
            return false;
        }
        let before = self.tools.take().unwrap_or_default();
        let mut now = BTreeMap::new();
        for (name, digest, definition) in tools {
            let replaced = match before.get(&name) {
                Some(old) if old.definition != definition => Some(old.definition.clone()),
                Some(old) => old.replaced.clone(),
                None => None,
            };
            let shown = ShownTool {
                digest,
                revision,
                definition,
                replaced,
            };
            now.insert(name, shown);
        }
        self.tools = Some(now);
        self.catalog = Some(whole.0.clone());
        self.whole = Some(whole);
        true
    }

    /// The host was shown one tool's current definition (`Some((digest, definition))`, a
    /// refused call's result carries it) or that it is gone (`None`). The next call of that
    /// tool is judged against it.
    pub fn show_tool(&mut self, tool: &str, shown: Option<(String, Value)>, revision: Option<u64>) {
        let view = self.tools.get_or_insert_with(BTreeMap::new);
        self.whole = None;
        match shown {
            Some((digest, definition)) => {
                let replaced = match view.get(tool) {
                    Some(old) if old.definition != definition => Some(old.definition.clone()),
                    Some(old) => old.replaced.clone(),
                    None => None,
                };
                view.insert(
                    tool.to_owned(),
                    ShownTool {
                        digest,
                        revision,
                        definition,
                        replaced,
                    },
                );
            }
            None => {
                view.remove(tool);
            }
        }
    }

    /// What the host was shown of `tool`, if anything.
    pub fn tool(&self, tool: &str) -> Option<&ShownTool> {
        self.tools.as_ref()?.get(tool)
    }

    /// Every tool the host holds (none before it was shown anything).
    pub fn tools(&self) -> impl Iterator<Item = (&String, &ShownTool)> {
        self.tools.iter().flatten()
    }

    /// Whether the host was shown a catalog or a tool at all.
    pub fn shown_anything(&self) -> bool {
        self.tools.is_some()
    }

    /// Digest of the last whole catalog the host was shown.
    pub fn catalog(&self) -> Option<&str> {
        self.catalog.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn showing(name: &str, v: u64) -> Showing {
        (
            name.into(),
            format!("d:{name}:{v}"),
            json!({"name": name, "v": v}),
        )
    }

    #[test]
    fn a_changed_definition_keeps_the_one_it_replaced_and_a_repeat_changes_nothing() {
        let mut view = HostView::default();
        assert!(!view.shown_anything());
        assert!(view.show_catalog("c1", Some(1), [showing("a", 1), showing("b", 1)]));
        assert!(!view.show_catalog("c1", Some(1), [showing("a", 1), showing("b", 1)]));
        assert!(view.show_catalog("c2", Some(2), [showing("a", 2), showing("b", 1)]));
        let a = view.tool("a").unwrap();
        assert_eq!(a.definition["v"], 2);
        assert_eq!(a.replaced.as_ref().unwrap()["v"], 1);
        assert_eq!(view.tool("b").unwrap().replaced, None);
        assert_eq!(view.catalog(), Some("c2"));
        // Listing the same definition again keeps what it replaced.
        assert!(view.show_catalog("c3", Some(3), [showing("a", 2)]));
        assert_eq!(view.tool("a").unwrap().replaced.as_ref().unwrap()["v"], 1);
        assert!(view.tool("b").is_none(), "no longer shown");
    }

    #[test]
    fn a_single_tool_shown_leaves_the_whole_catalog_and_a_removed_one_is_gone() {
        let mut view = HostView::default();
        view.show_catalog("c1", Some(1), [showing("a", 1)]);
        view.show_tool(
            "a",
            Some(("d:a:2".into(), json!({"name": "a", "v": 2}))),
            Some(2),
        );
        assert_eq!(view.tool("a").unwrap().replaced.as_ref().unwrap()["v"], 1);
        assert_eq!(view.catalog(), Some("c1"), "the last whole catalog");
        // The same catalog listed again is news now: the view was no longer exactly it.
        assert!(view.show_catalog("c1", Some(1), [showing("a", 1)]));
        view.show_tool("a", None, Some(2));
        assert!(view.tool("a").is_none());
        assert!(view.shown_anything());
    }
}
