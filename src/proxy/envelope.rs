//! JSON-RPC envelopes: id, method and the raw bytes of everything else.
//!
//! A message is parsed only at its top level; `params` and `result` stay raw JSON text, so
//! forwarding costs a shallow parse and re-serialisation and never changes what the peers wrote
//! inside them. Ids are kept as raw JSON text: `0`, `"0"` and `1.0` stay distinct and are
//! returned to their sender exactly as sent.

use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Value, json};

/// Source tag on every error cargo mcp-dev itself produces (`data.source`).
pub const SOURCE: &str = "cargo-mcp-dev";

/// A raw JSON-RPC id (exact text).
pub type RawId = Box<RawValue>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Request,
    Notification,
    Response,
}

#[derive(Debug)]
pub struct Message {
    fields: BTreeMap<String, Box<RawValue>>,
    method: Option<String>,
    kind: Kind,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvelopeError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON-RPC 2.0 message: {0}")]
    NotJsonRpc(String),
}

impl EnvelopeError {
    /// The JSON-RPC error code for answering a host that sent this.
    pub fn code(&self) -> i64 {
        match self {
            EnvelopeError::NotJson(_) => -32700,
            EnvelopeError::NotJsonRpc(_) => -32600,
        }
    }
}

impl Message {
    pub fn parse(line: &[u8]) -> Result<Message, EnvelopeError> {
        let fields: BTreeMap<String, Box<RawValue>> = match serde_json::from_slice(line) {
            Ok(f) => f,
            Err(e) => {
                // Valid JSON that is not an object (a batch, a number) is a different failure.
                return Err(
                    if serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok() {
                        EnvelopeError::NotJsonRpc(
                            "expected a JSON object (batches are not supported)".into(),
                        )
                    } else {
                        EnvelopeError::NotJson(e.to_string())
                    },
                );
            }
        };
        match fields.get("jsonrpc").map(|v| v.get()) {
            Some("\"2.0\"") => {}
            _ => {
                return Err(EnvelopeError::NotJsonRpc(
                    "missing \"jsonrpc\": \"2.0\"".into(),
                ));
            }
        }
        let method = match fields.get("method") {
            Some(m) => Some(
                serde_json::from_str::<String>(m.get())
                    .map_err(|_| EnvelopeError::NotJsonRpc("method is not a string".into()))?,
            ),
            None => None,
        };
        let has_id = fields.get("id").map(|v| v.get() != "null").unwrap_or(false);
        let kind = match (&method, has_id) {
            (Some(_), true) => Kind::Request,
            (Some(_), false) => Kind::Notification,
            (None, _) if fields.contains_key("result") || fields.contains_key("error") => {
                Kind::Response
            }
            (None, _) => {
                return Err(EnvelopeError::NotJsonRpc(
                    "neither a request, a notification nor a response".into(),
                ));
            }
        };
        if let Some(id) = fields.get("id") {
            let t = id.get().as_bytes().first().copied();
            if !matches!(t, Some(b'"') | Some(b'-') | Some(b'0'..=b'9') | Some(b'n')) {
                return Err(EnvelopeError::NotJsonRpc(
                    "id must be a string or a number".into(),
                ));
            }
        }
        Ok(Message {
            fields,
            method,
            kind,
        })
    }

    pub fn kind(&self) -> &Kind {
        &self.kind
    }
    pub fn method(&self) -> Option<&str> {
        self.method.as_deref()
    }
    pub fn id(&self) -> Option<&RawValue> {
        self.fields.get("id").map(|b| &**b)
    }
    pub fn params(&self) -> Option<&RawValue> {
        self.fields.get("params").map(|b| &**b)
    }
    pub fn result(&self) -> Option<&RawValue> {
        self.fields.get("result").map(|b| &**b)
    }
    pub fn is_error(&self) -> bool {
        self.fields.contains_key("error")
    }
    /// Parsed params (or Null).
    pub fn params_value(&self) -> Value {
        self.params()
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null)
    }
    /// Parsed result (or Null).
    pub fn result_value(&self) -> Value {
        self.result()
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null)
    }

    pub fn set_id(&mut self, id: RawId) {
        self.fields.insert("id".into(), id);
    }
    pub fn set_params(&mut self, params: &Value) {
        self.fields.insert("params".into(), raw(params));
    }
    pub fn set_result(&mut self, result: &Value) {
        self.fields.insert("result".into(), raw(result));
    }

    /// One line, terminated by `\n`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(&self.fields).expect("raw fields serialize");
        out.push(b'\n');
        out
    }
}

/// The tool name and the raw arguments of a `tools/call`, read without building a JSON tree
/// (this runs for every call).
pub fn call_target(params: Option<&RawValue>) -> (String, Option<&RawValue>) {
    #[derive(serde::Deserialize)]
    struct CallParams<'a> {
        #[serde(default)]
        name: String,
        #[serde(borrow, default)]
        arguments: Option<&'a RawValue>,
    }
    match params.and_then(|p| serde_json::from_str::<CallParams<'_>>(p.get()).ok()) {
        Some(c) => (c.name, c.arguments),
        None => (String::new(), None),
    }
}

/// The `_meta` object of a message's params, parsed alone (the rest is skipped, not built).
pub fn params_meta(params: Option<&RawValue>) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct WithMeta {
        #[serde(rename = "_meta", default)]
        meta: Option<Value>,
    }
    params
        .and_then(|p| serde_json::from_str::<WithMeta>(p.get()).ok())
        .and_then(|w| w.meta)
}

/// Whether a `tools/call` result says `isError: true` (other fields are skipped, not built).
pub fn result_is_error(result: Option<&RawValue>) -> bool {
    #[derive(serde::Deserialize)]
    struct Outcome {
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
    }
    result
        .and_then(|r| serde_json::from_str::<Outcome>(r.get()).ok())
        .and_then(|o| o.is_error)
        .unwrap_or(false)
}

/// A raw value from a JSON value.
pub fn raw(v: &Value) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).expect("a Value is valid JSON")
}

/// A raw numeric id.
pub fn numeric_id(n: u64) -> RawId {
    RawValue::from_string(n.to_string()).expect("a number is valid JSON")
}

/// Our integer ids back from raw text (`17` → 17); anything else is not ours.
pub fn parse_numeric_id(id: &RawValue) -> Option<u64> {
    id.get().parse().ok()
}

pub fn clone_raw(v: &RawValue) -> RawId {
    v.to_owned()
}

fn line_of(v: Value) -> Vec<u8> {
    let mut out = serde_json::to_vec(&v).expect("Value serializes");
    out.push(b'\n');
    out
}

/// `{"jsonrpc":"2.0","id":…,"result":…}` with an exact raw id.
pub fn result_line(id: &RawValue, result: &Value) -> Vec<u8> {
    let mut m: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
    m.insert("jsonrpc", raw(&json!("2.0")));
    m.insert("id", id.to_owned());
    m.insert("result", raw(result));
    let mut out = serde_json::to_vec(&m).expect("serializes");
    out.push(b'\n');
    out
}

/// A JSON-RPC error from cargo mcp-dev (`data.source = "cargo-mcp-dev"`). `id` None → null.
pub fn error_line(id: Option<&RawValue>, code: i64, message: &str, mut data: Value) -> Vec<u8> {
    if let Value::Object(m) = &mut data {
        m.insert("source".into(), json!(SOURCE));
    } else {
        data = json!({"source": SOURCE});
    }
    let mut m: BTreeMap<&str, Box<RawValue>> = BTreeMap::new();
    m.insert("jsonrpc", raw(&json!("2.0")));
    m.insert(
        "id",
        id.map(|i| i.to_owned())
            .unwrap_or_else(|| raw(&Value::Null)),
    );
    m.insert(
        "error",
        raw(&json!({"code": code, "message": message, "data": data})),
    );
    let mut out = serde_json::to_vec(&m).expect("serializes");
    out.push(b'\n');
    out
}

pub fn request_line(id: u64, method: &str, params: &Value) -> Vec<u8> {
    line_of(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
}

pub fn notification_line(method: &str, params: Option<&Value>) -> Vec<u8> {
    match params {
        Some(p) => line_of(json!({"jsonrpc": "2.0", "method": method, "params": p})),
        None => line_of(json!({"jsonrpc": "2.0", "method": method})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_and_keeps_raw_ids() {
        let m = Message::parse(
            br#"{"jsonrpc":"2.0","id":0,"method":"tools/call","params":{"name":"x"}}"#,
        )
        .unwrap();
        assert_eq!(m.kind(), &Kind::Request);
        assert_eq!(m.id().unwrap().get(), "0");
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":"0","result":{}}"#).unwrap();
        assert_eq!(m.kind(), &Kind::Response);
        assert_eq!(m.id().unwrap().get(), "\"0\"");
        let m =
            Message::parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert_eq!(m.kind(), &Kind::Notification);
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1.0,"method":"ping"}"#).unwrap();
        assert_eq!(m.id().unwrap().get(), "1.0");
    }

    #[test]
    fn rewrites_id_and_preserves_everything_else() {
        let mut m = Message::parse(br#"{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"x","arguments":{"b":1,"a":[1,2]}}}"#).unwrap();
        m.set_id(numeric_id(42));
        let out = m.to_line();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], json!(42));
        assert_eq!(v["params"]["arguments"], json!({"b":1,"a":[1,2]}));
        assert_eq!(*out.last().unwrap(), b'\n');
        assert!(!out[..out.len() - 1].contains(&b'\n'));
    }

    #[test]
    fn rejects_bad_input_with_the_right_code() {
        assert_eq!(Message::parse(b"hello").unwrap_err().code(), -32700);
        assert_eq!(Message::parse(b"[1,2]").unwrap_err().code(), -32600);
        assert_eq!(
            Message::parse(br#"{"id":1,"method":"x"}"#)
                .unwrap_err()
                .code(),
            -32600
        );
        assert_eq!(
            Message::parse(br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#)
                .unwrap_err()
                .code(),
            -32600
        );
        assert_eq!(
            Message::parse(br#"{"jsonrpc":"2.0","id":1}"#)
                .unwrap_err()
                .code(),
            -32600
        );
    }

    #[test]
    fn call_target_and_error_flag_without_a_tree() {
        let m = Message::parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"arguments":{"b":[1,{"c":2}]},"name":"write_item","_meta":{"progressToken":3}}}"#).unwrap();
        let (name, args) = call_target(m.params());
        assert_eq!(name, "write_item");
        assert_eq!(args.unwrap().get(), r#"{"b":[1,{"c":2}]}"#);
        assert_eq!(call_target(None).0, "");
        assert_eq!(params_meta(m.params()), Some(json!({"progressToken": 3})));
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"isError":true}}"#).unwrap();
        assert!(result_is_error(r.result()));
        let r = Message::parse(br#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#).unwrap();
        assert!(!result_is_error(r.result()));
    }

    #[test]
    fn error_lines_carry_source() {
        let id = numeric_id(3);
        let v: Value =
            serde_json::from_slice(&error_line(Some(&id), -31001, "m", json!({"x":1}))).unwrap();
        assert_eq!(v["error"]["data"]["source"], json!("cargo-mcp-dev"));
        assert_eq!(v["error"]["data"]["x"], json!(1));
        assert_eq!(v["id"], json!(3));
        let v: Value = serde_json::from_slice(&error_line(None, -32700, "m", Value::Null)).unwrap();
        assert_eq!(v["id"], Value::Null);
    }
}
