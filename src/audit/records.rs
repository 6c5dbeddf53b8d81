//! Typed audit records shared by the writer (the session), the verifier and the journals, so a
//! field cannot be written under one name and read under another.
//!
//! Owns: the `data` shapes of the record types that the journals read. Must not touch: I/O.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::{ChainError, RecordData, canonical_json};

/// `server_exited`: a server process ended (by itself, replaced, or at session end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerExited {
    pub epoch: String,
    pub pid: u32,
    /// How it ended, for humans: `exit code 3`, `signal 9 (SIGKILL)`, `replaced`,
    /// `stopped at session end`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub lived_ms: u64,
}

impl ServerExited {
    pub fn to_data(&self) -> Value {
        serde_json::to_value(self).expect("record serializes")
    }

    /// Reads the record's data; records written before the typed shape (`exit` instead of
    /// `status`) are read too.
    pub fn from_data(data: &Value) -> Option<ServerExited> {
        if let Ok(r) = serde_json::from_value::<ServerExited>(data.clone()) {
            return Some(r);
        }
        let status = data
            .get("status")
            .or_else(|| data.get("exit"))
            .and_then(Value::as_str)?;
        Some(ServerExited {
            epoch: data
                .get("epoch")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            pid: data.get("pid").and_then(Value::as_u64).unwrap_or(0) as u32,
            status: status.to_string(),
            code: None,
            signal: None,
            lived_ms: data.get("livedMs").and_then(Value::as_u64).unwrap_or(0),
        })
    }
}

/// `catalog_presented`: a host connection received a catalog or one tool's definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogPresented {
    /// The agent run (one host connection per run).
    pub connection: String,
    /// `server`, `recorded catalog` or `stale-call result`.
    pub source: String,
    pub digest: Option<String>,
    pub revision: Option<u64>,
    /// Number of tools shown (whole catalogs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<u64>,
    /// The one tool shown (stale-call results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_epoch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_identity: Option<String>,
}

/// `tool_called`: written (and flushed) before a call is forwarded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ToolCalled {
    /// The host's JSON-RPC id of the call, as JSON text or value.
    pub call_id: Value,
    pub tool: String,
    /// The grant that authorized it; `None` for an ungated tool.
    #[serde(default)]
    pub grant: Option<String>,
    /// That grant's kind: `epoch` or `call` (bound to `arguments_digest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_kind: Option<String>,
    /// Names of the credential scopes the tool uses (never values).
    #[serde(default)]
    pub credential_scopes: Vec<String>,
    /// Digest of the arguments exactly as sent (never the arguments).
    #[serde(default)]
    pub arguments_digest: Option<String>,
    /// The catalog revision of this tool as the host was shown it (when it was current).
    #[serde(default)]
    pub shown_revision: Option<u64>,
}

/// `tool_result`: the server answered a forwarded call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ToolResult {
    pub call_id: Value,
    pub tool: String,
    pub is_error: bool,
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

/// `authorization_denied`: a call refused before it reached a server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AuthorizationDenied {
    pub call_id: Value,
    pub tool: String,
    /// `identity_pending`, `catalog_stale`, `unknown_tool`, `arguments_invalid`,
    /// `authorization_required`, `authorization_stale`, `build_failed`, `server_unavailable`.
    pub reason: String,
    #[serde(default)]
    pub approved_epoch: Option<String>,
    #[serde(default)]
    pub current_epoch: Option<String>,
    /// Digest of the call's arguments as sent (never the arguments): what `approve --call`
    /// binds a `call` grant to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_digest: Option<String>,
    /// The approval channel involved: `terminal` (the denial points to `cargo mcp-dev approve`)
    /// or `host` (the host's prompt was declined, cancelled or timed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// For a host-channel denial: `declined`, `cancelled`, `timed out`, `epoch changed`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// For `arguments_invalid`: what did not match the tool's input schema (`/qty: …`; at
    /// most three, shortened, without the arguments' values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatches: Option<Vec<String>>,
}

/// `call_failed_epoch_transition`: a call in flight when its server was replaced or exited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CallFailedEpochTransition {
    pub call_id: Value,
    pub tool: String,
    #[serde(default)]
    pub old_epoch: Option<String>,
    #[serde(default)]
    pub new_epoch: Option<String>,
    /// `replaced` or `exited`.
    #[serde(default)]
    pub cause: Option<String>,
}

/// `call_cancelled`: the host cancelled a call that had been forwarded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CallCancelled {
    pub call_id: Value,
    pub tool: String,
}

impl ToolCalled {
    /// The record's data in the chain's canonical encoding, written from the fields (keys in
    /// byte order; the same bytes as encoding [`data`] of it, which the tests check): no JSON
    /// tree per call.
    pub fn canonical(&self) -> Result<RecordData, ChainError> {
        let mut out = Vec::with_capacity(320);
        out.extend_from_slice(b"{\"argumentsDigest\":");
        crate::base::canonical::write_opt_str(self.arguments_digest.as_deref(), &mut out);
        out.extend_from_slice(b",\"callId\":");
        canonical_json(&self.call_id, &mut out)?;
        out.extend_from_slice(b",\"credentialScopes\":[");
        for (i, scope) in self.credential_scopes.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            crate::base::canonical::write_str(scope, &mut out);
        }
        out.extend_from_slice(b"],\"grant\":");
        crate::base::canonical::write_opt_str(self.grant.as_deref(), &mut out);
        if let Some(kind) = &self.grant_kind {
            out.extend_from_slice(b",\"grantKind\":");
            crate::base::canonical::write_str(kind, &mut out);
        }
        out.extend_from_slice(b",\"shownRevision\":");
        crate::base::canonical::write_opt_u64(self.shown_revision, &mut out);
        out.extend_from_slice(b",\"tool\":");
        crate::base::canonical::write_str(&self.tool, &mut out);
        out.push(b'}');
        Ok(RecordData::Canonical(out))
    }
}

impl ToolResult {
    /// As [`ToolCalled::canonical`].
    pub fn canonical(&self) -> Result<RecordData, ChainError> {
        let mut out = Vec::with_capacity(160);
        out.extend_from_slice(b"{\"callId\":");
        canonical_json(&self.call_id, &mut out)?;
        out.extend_from_slice(b",\"durationMs\":");
        crate::base::canonical::write_opt_u64(self.duration_ms, &mut out);
        out.extend_from_slice(if self.is_error {
            b",\"isError\":true"
        } else {
            b",\"isError\":false"
        });
        out.extend_from_slice(b",\"tool\":");
        crate::base::canonical::write_str(&self.tool, &mut out);
        out.push(b'}');
        Ok(RecordData::Canonical(out))
    }
}

impl CatalogPresented {
    /// As [`ToolCalled::canonical`]: a host lists the same catalog again and again, and each
    /// presentation is recorded.
    pub fn canonical(&self) -> RecordData {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"{\"connection\":");
        crate::base::canonical::write_str(&self.connection, &mut out);
        out.extend_from_slice(b",\"digest\":");
        crate::base::canonical::write_opt_str(self.digest.as_deref(), &mut out);
        let mut optional = |name: &[u8], value: Option<&str>| {
            if let Some(v) = value {
                out.extend_from_slice(name);
                crate::base::canonical::write_str(v, &mut out);
            }
        };
        optional(b",\"recordedEpoch\":", self.recorded_epoch.as_deref());
        optional(b",\"recordedIdentity\":", self.recorded_identity.as_deref());
        out.extend_from_slice(b",\"revision\":");
        crate::base::canonical::write_opt_u64(self.revision, &mut out);
        out.extend_from_slice(b",\"source\":");
        crate::base::canonical::write_str(&self.source, &mut out);
        if let Some(tool) = &self.tool {
            out.extend_from_slice(b",\"tool\":");
            crate::base::canonical::write_str(tool, &mut out);
        }
        if let Some(n) = self.tools {
            out.extend_from_slice(b",\"tools\":");
            crate::base::canonical::write_u64(n, &mut out);
        }
        out.push(b'}');
        RecordData::Canonical(out)
    }
}

/// Serializes a record's data (the types above hold only strings, integers and booleans).
pub fn data<T: Serialize>(record: &T) -> Value {
    serde_json::to_value(record).expect("audit record data serializes")
}

/// Reads a record's data as `T`; fields that are missing or of another type read as their
/// defaults (a journal shows what it can of an odd record rather than nothing).
pub fn read<T: serde::de::DeserializeOwned + Default>(data: &Value) -> T {
    if let Ok(t) = serde_json::from_value(data.clone()) {
        return t;
    }
    // Field by field: keep each field that has the right type.
    let Some(obj) = data.as_object() else {
        return T::default();
    };
    let mut good = serde_json::Map::new();
    for (k, v) in obj {
        let mut one = serde_json::Map::new();
        one.insert(k.clone(), v.clone());
        if serde_json::from_value::<T>(Value::Object(one)).is_ok() {
            good.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(Value::Object(good)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy as _;
    use serde_json::json;

    fn generic(v: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        canonical_json(v, &mut out).unwrap();
        out
    }

    fn encoded(d: RecordData) -> Vec<u8> {
        match d {
            RecordData::Canonical(b) => b,
            RecordData::Tree(_) => panic!("typed records encode directly"),
        }
    }

    proptest::proptest! {
        /// The typed encoders write exactly what the generic encoder writes for the same data,
        /// for every shape of field (the verifier re-renders with the generic one).
        #[test]
        fn typed_encodings_match_the_generic_encoder(
            id in proptest::prop_oneof![
                "[a-z0-9\"\\\\\u{0}-\u{1f}é]{0,12}".prop_map(Value::from),
                proptest::num::i64::ANY.prop_map(Value::from),
            ],
            tool in "\\PC{0,16}",
            grant in proptest::option::of("[a-z0-9-]{1,30}"),
            grant_kind in proptest::option::of("epoch|call"),
            scopes in proptest::collection::vec("\\PC{0,8}", 0..4),
            digest in proptest::option::of("sha256:[0-9a-f]{64}"),
            revision in proptest::option::of(proptest::num::u64::ANY),
            is_error in proptest::bool::ANY,
            duration in proptest::option::of(proptest::num::u64::ANY),
        ) {
            let called = ToolCalled {
                call_id: id.clone(),
                tool: tool.clone(),
                grant: grant.clone(),
                grant_kind: grant_kind.clone(),
                credential_scopes: scopes,
                arguments_digest: digest.clone(),
                shown_revision: revision,
            };
            proptest::prop_assert_eq!(
                encoded(called.canonical().unwrap()),
                generic(&data(&called))
            );
            let result = ToolResult { call_id: id, tool: tool.clone(), is_error, duration_ms: duration };
            proptest::prop_assert_eq!(
                encoded(result.canonical().unwrap()),
                generic(&data(&result))
            );
            // Whole catalogs (tools counted) and single definitions (one tool named), with or
            // without the recorded catalog's provenance.
            let presented = CatalogPresented {
                connection: tool.clone(),
                source: grant.clone().unwrap_or_default(),
                digest: digest.clone(),
                revision,
                tools: duration,
                tool: is_error.then(|| tool.clone()),
                recorded_epoch: grant_kind.clone(),
                recorded_identity: digest.clone().filter(|_| is_error),
            };
            proptest::prop_assert_eq!(encoded(presented.canonical()), generic(&data(&presented)));
        }
    }

    #[test]
    fn typed_encodings_refuse_what_the_generic_encoder_refuses() {
        let r = ToolResult {
            call_id: json!(1.5),
            ..ToolResult::default()
        };
        assert!(matches!(
            r.canonical(),
            Err(ChainError::NonIntegerNumber(_))
        ));
    }

    #[test]
    fn server_exited_round_trips_and_reads_the_old_shape() {
        let r = ServerExited {
            epoch: "E".into(),
            pid: 7,
            status: "exit code 3".into(),
            code: Some(3),
            signal: None,
            lived_ms: 10,
        };
        assert_eq!(ServerExited::from_data(&r.to_data()), Some(r));
        let old = json!({"pid": 7, "exit": "signal 9 (SIGKILL)", "livedMs": 5});
        assert_eq!(
            ServerExited::from_data(&old).map(|r| r.status),
            Some("signal 9 (SIGKILL)".to_string())
        );
    }
}
