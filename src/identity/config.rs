//! `[package.metadata.mcp-dev]`: the server's configuration, read from cargo metadata.
//!
//! Owns parsing and validation of the table (an unknown key or value is an error that suggests
//! the closest known one, never ignored). It does not
//! read files or env values named by the configuration; identity capture does that.
//!
//! ```toml
//! [package.metadata.mcp-dev]
//! label = "inventory"                 # server label (default: package name)
//! bin = "inventory"                   # server binary (default: the only bin)
//! extra-inputs = ["data/schema.json"] # files/dirs hashed into identity (and watched)
//! env = ["INVENTORY_MODE"]            # env vars whose values count toward identity (digests only)
//! wrapper = "scripts/serve.sh"        # started as `wrapper <stored executable> [args]`
//! watch = ["assets"]                  # extra paths to watch (not in identity)
//! ignore = ["*.log", "fixtures/**"]   # paths the watcher ignores (globs, relative to the package)
//! restart = "supervise"               # supervise | disconnect | manual
//! debounce-ms = 50
//! audit-log = "target/audit.jsonl"    # default: <target>/mcp-dev/audit/<label>.jsonl
//! audit-fsync = "boundaries"          # never | boundaries (default) | every
//! audit-max-segment-bytes = 67108864  # rotate the log into chained segments (0: never)
//! gate = "all"                        # "all" (default), "off", or a list of tool names
//! exempt = ["list_items"]             # with gate = "all": tools that need no approval
//!                                     # (a change that weakens gate/exempt/per-call
//!                                     # waits for `cargo mcp-dev approve --policy`)
//! approval = "per-epoch"              # per-epoch (default) | per-call
//! per-call = ["delete_item"]          # tools that need a decision per call
//! approval-channels = ["terminal"]    # who may grant: terminal, host (default: both when the
//!                                     # host declared elicitation, else terminal)
//! approval-timeout = "45s"            # how long a call waits for an answer in the host
//!
//! [package.metadata.mcp-dev.credential-scopes.inventory-api-staging]
//! env = ["INVENTORY_API_TOKEN"]       # env vars that carry the credential to the server
//! tools = ["write_item"]              # tools that use it
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What `run` does when a new build changes the identity (`restart`, `--restart`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartMode {
    /// Keep the host connection, replace the child, publish the new epoch and gate calls until
    /// catalog and grants are current.
    Supervise,
    /// On a new build, fail in-flight calls and close the connection: the host must reconnect.
    Disconnect,
    /// Never restart by itself; `cargo mcp-dev restart` applies the latest build.
    Manual,
}

impl RestartMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartMode::Supervise => "supervise",
            RestartMode::Disconnect => "disconnect",
            RestartMode::Manual => "manual",
        }
    }
}

/// Keys accepted in `[package.metadata.mcp-dev]`.
pub const KNOWN_KEYS: &[&str] = &[
    "label",
    "bin",
    "extra-inputs",
    "env",
    "wrapper",
    "watch",
    "ignore",
    "restart",
    "debounce-ms",
    "first-start-budget",
    "handshake-wait",
    "discover-wait",
    "fallback",
    "audit-log",
    "audit-fsync",
    "audit-max-segment-bytes",
    "gate",
    "exempt",
    "approval",
    "per-call",
    "approval-channels",
    "approval-timeout",
    "credential-scopes",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct McpDevConfig {
    pub label: Option<String>,
    pub bin: Option<String>,
    #[serde(default)]
    pub extra_inputs: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    pub wrapper: Option<String>,
    #[serde(default)]
    pub watch: Vec<String>,
    #[serde(default)]
    pub ignore: Vec<String>,
    pub restart: Option<String>,
    pub debounce_ms: Option<u64>,
    /// e.g. `"25s"` (humantime).
    pub first_start_budget: Option<String>,
    /// e.g. `"5s"` (humantime).
    pub handshake_wait: Option<String>,
    /// e.g. `"1s"` (humantime).
    pub discover_wait: Option<String>,
    /// `"none"` or `"last-good"`.
    pub fallback: Option<String>,
    pub audit_log: Option<String>,
    /// `"never"`, `"boundaries"` (default) or `"every"`.
    pub audit_fsync: Option<String>,
    /// Size at which the log rotates into a new segment (0: never).
    pub audit_max_segment_bytes: Option<u64>,
    pub gate: Option<GateSetting>,
    #[serde(default)]
    pub exempt: Vec<String>,
    pub approval: Option<String>,
    #[serde(default)]
    pub per_call: Vec<String>,
    /// `["terminal"]`, `["host"]` or both (also a single string).
    pub approval_channels: Option<ChannelsSetting>,
    /// e.g. `"45s"` (humantime).
    pub approval_timeout: Option<String>,
    #[serde(default)]
    pub credential_scopes: BTreeMap<String, CredentialScopeConfig>,
}

/// `approval-channels = "terminal" | ["terminal", "host"]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChannelsSetting {
    One(String),
    Many(Vec<String>),
}

impl ChannelsSetting {
    pub fn names(&self) -> Vec<&str> {
        match self {
            ChannelsSetting::One(s) => vec![s.as_str()],
            ChannelsSetting::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// `gate = "all" | "off" | ["tool", …]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GateSetting {
    Keyword(String),
    Tools(Vec<String>),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialScopeConfig {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub tools: Vec<String>,
}

/// The parsed table.
#[derive(Debug, Clone, Default)]
pub struct LoadedConfig {
    pub config: McpDevConfig,
    /// The raw table (hashed into identity as the `config` component).
    pub raw: Value,
}

/// What is wrong with `[package.metadata.mcp-dev]`. Every variant but `NotATable` carries the
/// key path inside the table, so the caller can point at the manifest line ([`locate_line`]).
#[derive(Debug, PartialEq)]
pub enum ConfigError {
    NotATable(&'static str),
    /// A key nobody reads: a typo would otherwise silently do nothing.
    UnknownKey {
        path: Vec<String>,
        suggestion: Option<String>,
        known: Vec<String>,
    },
    /// A known key with a value outside its closed set.
    UnknownValue {
        path: Vec<String>,
        value: String,
        expected: Vec<String>,
        suggestion: Option<String>,
    },
    /// A known key with a value of the wrong shape.
    Invalid {
        path: Vec<String>,
        message: String,
    },
}

impl std::error::Error for ConfigError {}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.render(None))
    }
}

impl ConfigError {
    /// The key path inside `[package.metadata.mcp-dev]` the error is about (empty: the table).
    pub fn path(&self) -> &[String] {
        match self {
            ConfigError::NotATable(_) => &[],
            ConfigError::UnknownKey { path, .. }
            | ConfigError::UnknownValue { path, .. }
            | ConfigError::Invalid { path, .. } => path,
        }
    }

    /// One sentence; `location` (`/path/Cargo.toml:12`) is placed right after the table name.
    pub fn render(&self, location: Option<&str>) -> String {
        let at = location.map(|l| format!(" at {l}")).unwrap_or_default();
        match self {
            ConfigError::NotATable(kind) => {
                format!("[package.metadata.mcp-dev]{at} must be a table, found {kind}")
            }
            ConfigError::UnknownKey {
                path,
                suggestion,
                known,
            } => {
                let (table, key) = split_path(path);
                let hint = match suggestion {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => format!("known keys: {}", known.join(", ")),
                };
                format!("unknown key `{key}` in {table}{at}: {hint}")
            }
            ConfigError::UnknownValue {
                path,
                value,
                expected,
                suggestion,
            } => {
                let (table, key) = split_path(path);
                let expected = one_of(expected);
                let hint = match suggestion {
                    Some(s) => format!("did you mean \"{s}\"? (expected {expected})"),
                    None => format!("expected {expected}"),
                };
                format!("unknown value {key} = \"{value}\" in {table}{at}: {hint}")
            }
            ConfigError::Invalid { path, message } => {
                let (table, key) = split_path(path);
                if key.is_empty() {
                    format!("{table}{at}: {message}")
                } else {
                    format!("`{key}` in {table}{at}: {message}")
                }
            }
        }
    }
}

/// `([package.metadata.mcp-dev.credential-scopes.s], tools)` from `[credential-scopes, s, tools]`.
fn split_path(path: &[String]) -> (String, String) {
    match path.split_last() {
        Some((key, parents)) => {
            let mut table = String::from("[package.metadata.mcp-dev");
            for p in parents {
                table.push('.');
                table.push_str(p);
            }
            table.push(']');
            (table, key.clone())
        }
        None => ("[package.metadata.mcp-dev]".into(), String::new()),
    }
}

/// `"a", "b" or "c"`.
fn one_of(options: &[String]) -> String {
    let quoted: Vec<String> = options.iter().map(|o| format!("\"{o}\"")).collect();
    match quoted.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}

/// The closest of `options` to `input`, if one is close enough to be a likely typo
/// (`debounce_ms` → `debounce-ms`, `supervize` → `supervise`).
pub fn closest<'a>(input: &str, options: &[&'a str]) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let input = norm(input);
    options
        .iter()
        .map(|o| (edit_distance(&input, &norm(o)), *o))
        .filter(|(d, o)| *d <= (o.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, o)| o)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The 1-based line of `key_path` inside `[package.metadata.mcp-dev]` in a manifest's text
/// (wherever TOML put it: a table header, dotted keys or an inline table).
pub fn locate_line(manifest_text: &str, key_path: &[String]) -> Option<usize> {
    let doc = toml::de::DeTable::parse(manifest_text).ok()?;
    let mut table = doc.get_ref();
    let mut span = None;
    let full: Vec<&str> = ["package", "metadata", "mcp-dev"]
        .into_iter()
        .chain(key_path.iter().map(String::as_str))
        .collect();
    for (i, name) in full.iter().enumerate() {
        let (key, value) = table.iter().find(|(k, _)| k.get_ref().as_ref() == *name)?;
        span = Some(key.span());
        if i + 1 < full.len() {
            match value.get_ref() {
                toml::de::DeValue::Table(t) => table = t,
                _ => break,
            }
        }
    }
    let start = span?.start;
    Some(
        manifest_text[..start.min(manifest_text.len())]
            .matches('\n')
            .count()
            + 1,
    )
}

const CREDENTIAL_SCOPE_KEYS: &[&str] = &["env", "tools"];
const RESTART_VALUES: &[&str] = &["supervise", "disconnect", "manual"];
const APPROVAL_VALUES: &[&str] = &["per-epoch", "per-call"];
const GATE_KEYWORDS: &[&str] = &["all", "off"];
const FALLBACK_VALUES: &[&str] = &["none", "last-good"];
/// Values of `approval-channels`.
pub const CHANNEL_VALUES: &[&str] = &["terminal", "host"];

fn path_of(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

fn unknown_key(parts: &[&str], known: &[&str]) -> ConfigError {
    let key = parts.last().copied().unwrap_or_default();
    ConfigError::UnknownKey {
        path: path_of(parts),
        suggestion: closest(key, known).map(str::to_string),
        known: known.iter().map(|k| k.to_string()).collect(),
    }
}

fn check_value(key: &str, value: &str, expected: &[&str]) -> Result<(), ConfigError> {
    if expected.contains(&value) {
        return Ok(());
    }
    Err(ConfigError::UnknownValue {
        path: vec![key.to_string()],
        value: value.to_string(),
        expected: expected.iter().map(|e| e.to_string()).collect(),
        suggestion: closest(value, expected).map(str::to_string),
    })
}

impl LoadedConfig {
    /// Parses `package.metadata` as cargo metadata reports it (the whole `metadata` value).
    /// Unknown keys and unknown values of known keys are errors, each with the closest known
    /// spelling when there is one.
    pub fn from_package_metadata(metadata: &Value) -> Result<LoadedConfig, ConfigError> {
        let table = match metadata.get("mcp-dev") {
            None | Some(Value::Null) => return Ok(LoadedConfig::default()),
            Some(Value::Object(map)) => map,
            Some(other) => return Err(ConfigError::NotATable(json_kind(other))),
        };
        if let Some(key) = table.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(unknown_key(&[key], KNOWN_KEYS));
        }
        if let Some(Value::Object(scopes)) = table.get("credential-scopes") {
            for (scope, body) in scopes {
                if let Value::Object(body) = body
                    && let Some(key) = body
                        .keys()
                        .find(|k| !CREDENTIAL_SCOPE_KEYS.contains(&k.as_str()))
                {
                    return Err(unknown_key(
                        &["credential-scopes", scope, key],
                        CREDENTIAL_SCOPE_KEYS,
                    ));
                }
            }
        }
        let config: McpDevConfig =
            serde_json::from_value(Value::Object(table.clone())).map_err(|e| {
                // Name the offending key: serde's message alone does not.
                let key = table.iter().find(|(k, v)| {
                    let one = serde_json::Map::from_iter([((*k).clone(), (*v).clone())]);
                    serde_json::from_value::<McpDevConfig>(Value::Object(one)).is_err()
                });
                ConfigError::Invalid {
                    path: key.map(|(k, _)| vec![k.clone()]).unwrap_or_default(),
                    message: e.to_string(),
                }
            })?;
        let loaded = LoadedConfig {
            config,
            raw: Value::Object(table.clone()),
        };
        loaded.validate()?;
        Ok(loaded)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        let invalid = |path: &[&str], message: String| ConfigError::Invalid {
            path: path_of(path),
            message,
        };
        if let Some(label) = &c.label
            && (label.is_empty()
                || !label
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)))
        {
            return Err(invalid(
                &["label"],
                format!(
                    "label `{label}` must be non-empty and use only letters, digits, `-`, `_` or `.`"
                ),
            ));
        }
        if let Some(r) = &c.restart {
            check_value("restart", r, RESTART_VALUES)?;
        }
        if let Some(a) = &c.approval {
            check_value("approval", a, APPROVAL_VALUES)?;
        }
        if let Some(f) = &c.fallback {
            check_value("fallback", f, FALLBACK_VALUES)?;
        }
        if let Some(f) = &c.audit_fsync {
            check_value("audit-fsync", f, crate::audit::FsyncPolicy::VALUES)?;
        }
        if let Some(channels) = &c.approval_channels {
            let names = channels.names();
            if names.is_empty() {
                return Err(invalid(
                    &["approval-channels"],
                    "no channel: name \"terminal\", \"host\" or both".into(),
                ));
            }
            for name in names {
                check_value("approval-channels", name, CHANNEL_VALUES)?;
            }
        }
        for (key, value) in [
            ("first-start-budget", &c.first_start_budget),
            ("handshake-wait", &c.handshake_wait),
            ("discover-wait", &c.discover_wait),
            ("approval-timeout", &c.approval_timeout),
        ] {
            if let Some(v) = value
                && let Err(e) = humantime::parse_duration(v)
            {
                return Err(invalid(
                    &[key],
                    format!("\"{v}\" is not a duration ({e}); e.g. \"25s\" or \"2m\""),
                ));
            }
        }
        if let Some(GateSetting::Keyword(k)) = &c.gate
            && !GATE_KEYWORDS.contains(&k.as_str())
        {
            return Err(ConfigError::UnknownValue {
                path: vec!["gate".into()],
                value: k.clone(),
                expected: vec!["all".into(), "off".into(), "a list of tool names".into()],
                suggestion: closest(k, GATE_KEYWORDS).map(str::to_string),
            });
        }
        for name in &c.env {
            if name.is_empty() || name.contains('=') {
                return Err(invalid(
                    &["env"],
                    format!("`{name}` is not a variable name"),
                ));
            }
        }
        for pattern in &c.ignore {
            // Found now, not when `run` builds its watch plan (it would then watch nothing).
            if let Err(e) = globset::Glob::new(pattern) {
                return Err(invalid(
                    &["ignore"],
                    format!("`{pattern}` is not a glob: {}", e.kind()),
                ));
            }
        }
        // A tool that needs a decision for every call is gated, whatever else the table says:
        // a conflict is refused rather than settled silently on the unsafe side.
        for tool in &c.per_call {
            if c.exempt.contains(tool) {
                return Err(invalid(
                    &["per-call"],
                    format!(
                        "`{tool}` is in both `exempt` and `per-call`; a tool that needs a decision for every call cannot be exempt (remove it from one)"
                    ),
                ));
            }
            match &c.gate {
                Some(GateSetting::Tools(gated)) if !gated.contains(tool) => {
                    return Err(invalid(
                        &["per-call"],
                        format!(
                            "`{tool}` is in `per-call` but not in `gate`, so it would need no decision at all; add it to `gate`"
                        ),
                    ));
                }
                Some(GateSetting::Keyword(k)) if k == "off" => {
                    return Err(invalid(
                        &["per-call"],
                        format!(
                            "`{tool}` is in `per-call` while `gate = \"off\"` gates nothing; remove one"
                        ),
                    ));
                }
                _ => {}
            }
        }
        for (scope, sc) in &c.credential_scopes {
            if sc.env.is_empty() {
                return Err(invalid(
                    &["credential-scopes", scope],
                    "`env` must list the variables that carry it".into(),
                ));
            }
        }
        Ok(())
    }

    pub fn restart_mode(&self) -> Option<RestartMode> {
        self.config
            .restart
            .as_deref()
            .and_then(|r| parse_restart(r).ok())
    }

    /// Names of every env var that carries a credential (their values are never written anywhere).
    pub fn credential_env_vars(&self) -> BTreeSet<String> {
        self.config
            .credential_scopes
            .values()
            .flat_map(|s| s.env.iter().cloned())
            .collect()
    }
}

fn parse_restart(r: &str) -> Result<RestartMode, ConfigError> {
    match r {
        "supervise" => Ok(RestartMode::Supervise),
        "disconnect" => Ok(RestartMode::Disconnect),
        "manual" => Ok(RestartMode::Manual),
        other => check_value("restart", other, RESTART_VALUES).map(|()| RestartMode::Supervise),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a table",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Red-team round 17: a bad glob and a per-call tool left ungated are refused when the
    /// table is read, each with a sentence naming the keys.
    #[test]
    fn conflicts_and_bad_globs_are_refused_with_the_keys_named() {
        for (table, words) in [
            (
                json!({"ignore": ["ok/*.log", "fixtures/[abc"]}),
                vec!["ignore", "fixtures/[abc", "not a glob"],
            ),
            (
                json!({"exempt": ["d"], "per-call": ["d"]}),
                vec!["per-call", "`d` is in both `exempt` and `per-call`"],
            ),
            (
                json!({"gate": ["w"], "per-call": ["d"]}),
                vec!["per-call", "add it to `gate`"],
            ),
            (
                json!({"gate": "off", "per-call": ["d"]}),
                vec!["per-call", "gates nothing"],
            ),
        ] {
            let e = LoadedConfig::from_package_metadata(&json!({"mcp-dev": table.clone()}))
                .expect_err(&table.to_string())
                .to_string();
            for w in words {
                assert!(e.contains(w), "{table}: {e}");
            }
        }
        for fine in [
            json!({"gate": ["d", "w"], "per-call": ["d"]}),
            json!({"exempt": ["r"], "per-call": ["d"], "ignore": ["**/*.tmp"]}),
        ] {
            assert!(
                LoadedConfig::from_package_metadata(&json!({"mcp-dev": fine.clone()})).is_ok(),
                "{fine}"
            );
        }
    }

    #[test]
    fn absent_table_is_default() {
        let c = LoadedConfig::from_package_metadata(&json!(null)).unwrap();
        assert_eq!(c.config, McpDevConfig::default());
        let c = LoadedConfig::from_package_metadata(&json!({"other-tool": {}})).unwrap();
        assert_eq!(c.config, McpDevConfig::default());
    }

    #[test]
    fn parses_full_table() {
        let m = json!({"mcp-dev": {
            "label": "inventory", "bin": "inventory", "extra-inputs": ["data"],
            "env": ["MODE"], "wrapper": "scripts/serve.sh", "restart": "manual",
            "gate": ["write_item", "delete"], "per-call": ["delete"], "debounce-ms": 50,
            "credential-scopes": {"staging": {"env": ["TOKEN"], "tools": ["write_item"]}}
        }});
        let c = LoadedConfig::from_package_metadata(&m).unwrap();
        assert_eq!(c.config.label.as_deref(), Some("inventory"));
        assert_eq!(
            c.config.gate,
            Some(GateSetting::Tools(vec![
                "write_item".into(),
                "delete".into()
            ]))
        );
        assert_eq!(c.restart_mode(), Some(RestartMode::Manual));
        assert_eq!(
            c.credential_env_vars().into_iter().collect::<Vec<_>>(),
            vec!["TOKEN"]
        );
    }

    fn error_of(m: Value) -> String {
        LoadedConfig::from_package_metadata(&m)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn unknown_keys_are_errors_with_the_closest_known_key() {
        for (table, expected) in [
            (
                json!({"debounce_ms": 50}),
                "unknown key `debounce_ms` in [package.metadata.mcp-dev]: did you mean `debounce-ms`?",
            ),
            (
                json!({"labl": "x"}),
                "unknown key `labl` in [package.metadata.mcp-dev]: did you mean `label`?",
            ),
            (
                json!({"extra_inputs": []}),
                "unknown key `extra_inputs` in [package.metadata.mcp-dev]: did you mean `extra-inputs`?",
            ),
            (
                json!({"credential-scopes": {"s": {"env": ["T"], "tool": []}}}),
                "unknown key `tool` in [package.metadata.mcp-dev.credential-scopes.s]: did you mean `tools`?",
            ),
        ] {
            assert_eq!(error_of(json!({ "mcp-dev": table })), expected);
        }
        // Nothing close: the known keys are listed instead.
        let err = error_of(json!({"mcp-dev": {"colour": "blue"}}));
        assert!(
            err.starts_with(
                "unknown key `colour` in [package.metadata.mcp-dev]: known keys: label, bin,"
            ),
            "{err}"
        );
    }

    #[test]
    fn approval_channels_and_timeout_are_read() {
        let c = LoadedConfig::from_package_metadata(&json!({"mcp-dev": {
            "approval-channels": ["terminal", "host"], "approval-timeout": "30s"}}))
        .unwrap()
        .config;
        assert_eq!(
            c.approval_channels.as_ref().map(|c| c.names()),
            Some(vec!["terminal", "host"])
        );
        assert_eq!(c.approval_timeout.as_deref(), Some("30s"));
        let c = LoadedConfig::from_package_metadata(
            &json!({"mcp-dev": {"approval-channels": "terminal"}}),
        )
        .unwrap()
        .config;
        assert_eq!(c.approval_channels.unwrap().names(), ["terminal"]);
        assert_eq!(
            error_of(json!({"mcp-dev": {"approval-channel": "host"}})),
            "unknown key `approval-channel` in [package.metadata.mcp-dev]: did you mean `approval-channels`?"
        );
    }

    #[test]
    fn unknown_values_of_known_keys_are_errors_with_the_closest_value() {
        for (table, expected) in [
            (
                json!({"restart": "supervize"}),
                "unknown value restart = \"supervize\" in [package.metadata.mcp-dev]: did you mean \"supervise\"? (expected \"supervise\", \"disconnect\" or \"manual\")",
            ),
            (
                json!({"restart": "sometimes"}),
                "unknown value restart = \"sometimes\" in [package.metadata.mcp-dev]: expected \"supervise\", \"disconnect\" or \"manual\"",
            ),
            (
                json!({"approval": "per_call"}),
                "unknown value approval = \"per_call\" in [package.metadata.mcp-dev]: did you mean \"per-call\"? (expected \"per-epoch\" or \"per-call\")",
            ),
            (
                json!({"fallback": "last_good"}),
                "unknown value fallback = \"last_good\" in [package.metadata.mcp-dev]: did you mean \"last-good\"? (expected \"none\" or \"last-good\")",
            ),
            (
                json!({"audit-fsync": "always"}),
                "unknown value audit-fsync = \"always\" in [package.metadata.mcp-dev]: expected \"never\", \"boundaries\" or \"every\"",
            ),
            (
                json!({"audit-fsync": "boundary"}),
                "unknown value audit-fsync = \"boundary\" in [package.metadata.mcp-dev]: did you mean \"boundaries\"? (expected \"never\", \"boundaries\" or \"every\")",
            ),
            (
                json!({"approval-channels": ["terminal", "hosts"]}),
                "unknown value approval-channels = \"hosts\" in [package.metadata.mcp-dev]: did you mean \"host\"? (expected \"terminal\" or \"host\")",
            ),
            (
                json!({"approval-channels": "termnal"}),
                "unknown value approval-channels = \"termnal\" in [package.metadata.mcp-dev]: did you mean \"terminal\"? (expected \"terminal\" or \"host\")",
            ),
            (
                json!({"gate": "of"}),
                "unknown value gate = \"of\" in [package.metadata.mcp-dev]: did you mean \"off\"? (expected \"all\", \"off\" or \"a list of tool names\")",
            ),
        ] {
            assert_eq!(error_of(json!({ "mcp-dev": table })), expected);
        }
    }

    #[test]
    fn rejects_bad_values_with_the_key_named() {
        for (m, needle) in [
            (json!({"mcp-dev": "x"}), "must be a table"),
            (json!({"mcp-dev": {"label": "a b"}}), "label `a b`"),
            (
                json!({"mcp-dev": {"env": ["A=B"]}}),
                "`A=B` is not a variable name",
            ),
            (
                json!({"mcp-dev": {"approval-channels": []}}),
                "`approval-channels` in [package.metadata.mcp-dev]: no channel",
            ),
            (
                json!({"mcp-dev": {"approval-timeout": "soon"}}),
                "`approval-timeout` in",
            ),
            (
                json!({"mcp-dev": {"debounce-ms": "fast"}}),
                "`debounce-ms` in",
            ),
            (
                json!({"mcp-dev": {"credential-scopes": {"s": {"tools": ["t"]}}}}),
                "[package.metadata.mcp-dev.credential-scopes]",
            ),
        ] {
            let err = error_of(m);
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }

    #[test]
    fn locates_keys_wherever_toml_put_them() {
        let text = "[package]\nname = \"x\"\n\n[package.metadata.mcp-dev]\nlabel = \"x\"\ndebounce_ms = 5\n\n[package.metadata.mcp-dev.credential-scopes.s]\nenv = [\"T\"]\ntool = []\n";
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(locate_line(text, &path(&["debounce_ms"])), Some(6));
        assert_eq!(
            locate_line(text, &path(&["credential-scopes", "s", "tool"])),
            Some(10)
        );
        assert_eq!(locate_line(text, &path(&["nope"])), None);
        let inline = "[package]\nname = \"x\"\nmetadata.mcp-dev = { label = \"x\",\n  restart = \"often\" }\n";
        assert_eq!(locate_line(inline, &path(&["restart"])), Some(4));
    }

    #[test]
    fn closest_only_suggests_likely_typos() {
        assert_eq!(closest("debounce_ms", KNOWN_KEYS), Some("debounce-ms"));
        assert_eq!(closest("Restart", KNOWN_KEYS), Some("restart"));
        assert_eq!(closest("colour", KNOWN_KEYS), None);
        assert_eq!(closest("x", KNOWN_KEYS), None);
    }
}
