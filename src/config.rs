//! `[package.metadata.mcp-dev]`: the server's configuration, read from cargo metadata.
//!
//! Owns parsing and validation of the table (unknown keys are reported, not ignored). It does not
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
//! debounce-ms = 200
//! audit-log = "target/audit.jsonl"    # default: <target>/mcp-dev/audit/<label>.jsonl
//! gate = "all"                        # "all" (default), "off", or a list of tool names
//! exempt = ["list_items"]             # with gate = "all": tools that need no approval
//! approval = "per-epoch"              # per-epoch (default) | per-call
//! per-call = ["delete_item"]          # tools that need a decision per call
//!
//! [package.metadata.mcp-dev.credential-scopes.inventory-api-staging]
//! env = ["INVENTORY_API_TOKEN"]       # env vars that carry the credential to the server
//! tools = ["write_item"]              # tools that use it
//! ```

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cli::RestartMode;

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
    "fallback",
    "audit-log",
    "gate",
    "exempt",
    "approval",
    "per-call",
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
    /// `"none"` or `"last-good"`.
    pub fallback: Option<String>,
    pub audit_log: Option<String>,
    pub gate: Option<GateSetting>,
    #[serde(default)]
    pub exempt: Vec<String>,
    pub approval: Option<String>,
    #[serde(default)]
    pub per_call: Vec<String>,
    #[serde(default)]
    pub credential_scopes: BTreeMap<String, CredentialScopeConfig>,
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

/// The parsed table plus what was wrong with it.
#[derive(Debug, Clone, Default)]
pub struct LoadedConfig {
    pub config: McpDevConfig,
    /// Keys present but not understood (reported as warnings; `check` fails on them).
    pub unknown_keys: Vec<String>,
    /// The raw table (hashed into identity as the `config` component).
    pub raw: Value,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("[package.metadata.mcp-dev] must be a table, found {0}")]
    NotATable(&'static str),
    #[error("[package.metadata.mcp-dev]: {0}")]
    Invalid(String),
}

impl LoadedConfig {
    /// Parses `package.metadata` as cargo metadata reports it (the whole `metadata` value).
    pub fn from_package_metadata(metadata: &Value) -> Result<LoadedConfig, ConfigError> {
        let table = match metadata.get("mcp-dev") {
            None | Some(Value::Null) => return Ok(LoadedConfig::default()),
            Some(Value::Object(map)) => map,
            Some(other) => return Err(ConfigError::NotATable(json_kind(other))),
        };
        let unknown_keys: Vec<String> = table
            .keys()
            .filter(|k| !KNOWN_KEYS.contains(&k.as_str()))
            .cloned()
            .collect();
        let mut known = table.clone();
        known.retain(|k, _| KNOWN_KEYS.contains(&k.as_str()));
        let config: McpDevConfig =
            serde_json::from_value(Value::Object(known.clone())).map_err(|e| {
                // Name the offending key: serde's message alone does not.
                let key = known.iter().find(|(k, v)| {
                    let one = serde_json::Map::from_iter([((*k).clone(), (*v).clone())]);
                    serde_json::from_value::<McpDevConfig>(Value::Object(one)).is_err()
                });
                match key {
                    Some((k, _)) => ConfigError::Invalid(format!("`{k}`: {e}")),
                    None => ConfigError::Invalid(e.to_string()),
                }
            })?;
        let loaded = LoadedConfig {
            config,
            unknown_keys,
            raw: Value::Object(table.clone()),
        };
        loaded.validate()?;
        Ok(loaded)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if let Some(label) = &c.label
            && (label.is_empty()
                || !label
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch)))
        {
            return Err(ConfigError::Invalid(format!(
                "label `{label}` must be non-empty and use only letters, digits, `-`, `_` or `.`"
            )));
        }
        if let Some(r) = &c.restart {
            parse_restart(r)?;
        }
        if let Some(a) = &c.approval
            && a != "per-epoch"
            && a != "per-call"
        {
            return Err(ConfigError::Invalid(format!(
                "approval = \"{a}\": expected \"per-epoch\" or \"per-call\""
            )));
        }
        if let Some(GateSetting::Keyword(k)) = &c.gate
            && k != "all"
            && k != "off"
        {
            return Err(ConfigError::Invalid(format!(
                "gate = \"{k}\": expected \"all\", \"off\" or a list of tool names"
            )));
        }
        for name in &c.env {
            if name.is_empty() || name.contains('=') {
                return Err(ConfigError::Invalid(format!(
                    "env: `{name}` is not a variable name"
                )));
            }
        }
        for (scope, sc) in &c.credential_scopes {
            if sc.env.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "credential-scopes.{scope}: `env` must list the variables that carry it"
                )));
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
        other => Err(ConfigError::Invalid(format!(
            "restart = \"{other}\": expected \"supervise\", \"disconnect\" or \"manual\""
        ))),
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

    #[test]
    fn absent_table_is_default() {
        let c = LoadedConfig::from_package_metadata(&json!(null)).unwrap();
        assert_eq!(c.config, McpDevConfig::default());
        let c = LoadedConfig::from_package_metadata(&json!({"other-tool": {}})).unwrap();
        assert!(c.unknown_keys.is_empty());
    }

    #[test]
    fn parses_full_table_and_reports_unknown_keys() {
        let m = json!({"mcp-dev": {
            "label": "inventory", "bin": "inventory", "extra-inputs": ["data"],
            "env": ["MODE"], "wrapper": "scripts/serve.sh", "restart": "manual",
            "gate": ["write_item"], "per-call": ["delete"], "debounce-ms": 50,
            "credential-scopes": {"staging": {"env": ["TOKEN"], "tools": ["write_item"]}},
            "colour": "blue", "labl": "x"
        }});
        let c = LoadedConfig::from_package_metadata(&m).unwrap();
        assert_eq!(c.config.label.as_deref(), Some("inventory"));
        assert_eq!(
            c.config.gate,
            Some(GateSetting::Tools(vec!["write_item".into()]))
        );
        assert_eq!(c.restart_mode(), Some(RestartMode::Manual));
        assert_eq!(
            c.unknown_keys,
            vec!["colour".to_string(), "labl".to_string()]
        );
        assert_eq!(
            c.credential_env_vars().into_iter().collect::<Vec<_>>(),
            vec!["TOKEN"]
        );
    }

    #[test]
    fn rejects_bad_values_with_the_key_named() {
        for (m, needle) in [
            (json!({"mcp-dev": "x"}), "must be a table"),
            (
                json!({"mcp-dev": {"restart": "sometimes"}}),
                "restart = \"sometimes\"",
            ),
            (json!({"mcp-dev": {"gate": "some"}}), "gate = \"some\""),
            (
                json!({"mcp-dev": {"approval": "forever"}}),
                "approval = \"forever\"",
            ),
            (json!({"mcp-dev": {"label": "a b"}}), "label `a b`"),
            (json!({"mcp-dev": {"env": ["A=B"]}}), "env: `A=B`"),
            (json!({"mcp-dev": {"debounce-ms": "fast"}}), "debounce-ms"),
            (
                json!({"mcp-dev": {"credential-scopes": {"s": {"tools": ["t"]}}}}),
                "credential-scopes.s",
            ),
            (
                json!({"mcp-dev": {"credential-scopes": {"s": {"env": ["T"], "tool": []}}}}),
                "unknown field",
            ),
        ] {
            let err = LoadedConfig::from_package_metadata(&m)
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err} should mention {needle}");
        }
    }
}
