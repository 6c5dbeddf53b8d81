//! MCP protocol facts the session needs (see docs/protocol-notes.md): eras, `_meta` keys,
//! and when a new server is incompatible with what
//! the host was told. Pure functions over JSON values.

use serde_json::{Value, json};

use crate::wire::proxy::envelope::RawId;

pub const MODERN_VERSION: &str = "2026-07-28";
pub const LEGACY_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
pub const PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";
pub const SUBSCRIPTION_ID: &str = "io.modelcontextprotocol/subscriptionId";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// `initialize` → `notifications/initialized` (≤ 2025-11-25).
    Legacy,
    /// No handshake; `_meta` on every request (2026-07-28).
    Modern,
}

impl Era {
    pub fn as_str(self) -> &'static str {
        match self {
            Era::Legacy => "legacy",
            Era::Modern => "modern",
        }
    }
}

/// The modern `_meta` of a request's params, if it carries a protocol version.
pub fn modern_meta(params: &Value) -> Option<Value> {
    modern_meta_of(params.get("_meta")?)
}

/// The same from the `_meta` object itself.
pub fn modern_meta_of(meta: &Value) -> Option<Value> {
    meta.get(PROTOCOL_VERSION)?;
    let mut kept = serde_json::Map::new();
    for k in [PROTOCOL_VERSION, CLIENT_CAPABILITIES, CLIENT_INFO] {
        if let Some(v) = meta.get(k) {
            kept.insert(k.into(), v.clone());
        }
    }
    if !kept.contains_key(CLIENT_CAPABILITIES) {
        kept.insert(CLIENT_CAPABILITIES.into(), json!({}));
    }
    Some(Value::Object(kept))
}

/// What a `subscriptions/listen` filter asks for, split by who can serve it: tool-list changes
/// are the supervisor's to announce (it advertises `tools.listChanged` and refetches the catalog
/// on every new server), every other category only the server knows about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenFilter {
    pub tools: bool,
    pub server_categories: bool,
}

impl ListenFilter {
    pub fn of(params: &Value) -> ListenFilter {
        let n = params.get("notifications");
        let flag = |k: &str| n.and_then(|n| n.get(k)).and_then(Value::as_bool) == Some(true);
        let resources = n
            .and_then(|n| n.get("resourceSubscriptions"))
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        ListenFilter {
            tools: flag("toolsListChanged"),
            server_categories: flag("promptsListChanged")
                || flag("resourcesListChanged")
                || resources,
        }
    }

    /// Only tool-list changes: the supervisor serves the stream by itself.
    pub fn supervisor_only(self) -> bool {
        self.tools && !self.server_categories
    }
}

/// `notifications/subscriptions/acknowledged` params for the host's stream `sid`.
pub fn listen_ack_params(sid: &Value, notifications: Value) -> Value {
    json!({"_meta": {SUBSCRIPTION_ID: sid}, "notifications": notifications})
}

/// Best effort: the id of a message we could not parse (so the error can name it).
pub fn recover_id(bytes: &[u8]) -> Option<RawId> {
    let text = String::from_utf8_lossy(bytes);
    let idx = text.find("\"id\"")?;
    let rest = text[idx + 4..].trim_start().strip_prefix(':')?.trim_start();
    let end = if let Some(inner) = rest.strip_prefix('"') {
        inner.find('"').map(|i| i + 2)?
    } else {
        rest.find(|c: char| !(c.is_ascii_digit() || c == '-' || c == '.'))
            .unwrap_or(rest.len())
    };
    serde_json::value::RawValue::from_string(rest[..end].to_string()).ok()
}

/// Sets `capabilities.tools.listChanged = true` (we always tell the host when the list moves).
pub fn advertise_list_changed(result: &mut Value) {
    if let Some(caps) = result
        .get_mut("capabilities")
        .and_then(|c| c.as_object_mut())
    {
        let tools = caps.entry("tools").or_insert_with(|| json!({}));
        if let Some(t) = tools.as_object_mut() {
            t.insert("listChanged".into(), json!(true));
        }
    }
}

/// Capabilities as compared between servers: `tools.listChanged` is ours to announce.
pub fn capabilities_without_list_changed(caps: &Value) -> Value {
    let mut c = caps.clone();
    if let Some(t) = c.get_mut("tools").and_then(|t| t.as_object_mut()) {
        t.remove("listChanged");
    }
    c
}

/// Why a new server cannot continue a connection negotiated with `version`/`caps`, if it cannot.
pub fn incompatibility(
    version: &str,
    caps: &Value,
    new_version: &str,
    new_caps: &Value,
    modern: bool,
    new_result: &Value,
) -> Option<String> {
    if modern {
        let supported = new_result
            .get("supportedVersions")
            .and_then(|v| v.as_array());
        if !supported.is_some_and(|s| s.iter().any(|v| v.as_str() == Some(version))) {
            return Some(format!("does not support protocol {version}"));
        }
    } else if version != new_version {
        return Some(format!("speaks protocol {new_version}, not {version}"));
    }
    let (a, b) = (
        capabilities_without_list_changed(caps),
        capabilities_without_list_changed(new_caps),
    );
    if a != b {
        return Some(format!("has capabilities {b} instead of {a}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_ids() {
        assert_eq!(
            recover_id(br#"{"jsonrpc":"2.0","id":17,"method":"x", broken"#)
                .unwrap()
                .get(),
            "17"
        );
        assert_eq!(recover_id(br#"{"id": "a-b", "#).unwrap().get(), "\"a-b\"");
        assert!(recover_id(b"garbage").is_none());
    }

    #[test]
    fn listen_filters_split_by_who_serves_them() {
        let f = |n: Value| ListenFilter::of(&json!({ "notifications": n }));
        assert!(f(json!({"toolsListChanged": true})).supervisor_only());
        assert!(!f(json!({"toolsListChanged": false})).tools);
        let mixed = f(json!({"toolsListChanged": true, "promptsListChanged": true}));
        assert!(mixed.tools && mixed.server_categories && !mixed.supervisor_only());
        assert!(f(json!({"resourceSubscriptions": ["file:///a"]})).server_categories);
        assert!(!f(json!({"resourceSubscriptions": []})).server_categories);
        // Malformed filters ask for nothing.
        assert_eq!(
            ListenFilter::of(&json!({"notifications": "all"})),
            ListenFilter {
                tools: false,
                server_categories: false
            }
        );
        assert!(!ListenFilter::of(&json!(null)).tools);
    }

    #[test]
    fn incompatibility_ignores_list_changed_only() {
        let caps = json!({"tools": {"listChanged": true}});
        assert!(
            incompatibility(
                "2025-06-18",
                &caps,
                "2025-06-18",
                &json!({"tools": {}}),
                false,
                &json!({})
            )
            .is_none()
        );
        assert!(
            incompatibility(
                "2025-06-18",
                &caps,
                "2025-03-26",
                &json!({"tools": {}}),
                false,
                &json!({})
            )
            .unwrap()
            .contains("2025-03-26")
        );
        assert!(
            incompatibility(
                "2025-06-18",
                &caps,
                "2025-06-18",
                &json!({"tools": {}, "resources": {}}),
                false,
                &json!({})
            )
            .is_some()
        );
        let d = json!({"supportedVersions": ["2026-07-28"]});
        assert!(
            incompatibility(MODERN_VERSION, &caps, "", &json!({"tools": {}}), true, &d).is_none()
        );
        assert!(
            incompatibility(
                MODERN_VERSION,
                &caps,
                "",
                &json!({"tools": {}}),
                true,
                &json!({"supportedVersions": ["2027-01-01"]})
            )
            .is_some()
        );
    }

    #[test]
    fn modern_meta_requires_a_version() {
        assert!(modern_meta(&json!({"_meta": {"progressToken": 1}})).is_none());
        let m = modern_meta(&json!({"_meta": {PROTOCOL_VERSION: "2026-07-28"}})).unwrap();
        assert_eq!(m[CLIENT_CAPABILITIES], json!({}));
    }
}
