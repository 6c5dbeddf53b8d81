//! The files `cargo mcp-dev new` and `init` generate, embedded at compile time from `templates/`,
//! and the placeholder renderer that fills them.
//!
//! Owns the template texts, the `{{key}}` substitution and the escaping helpers for the formats
//! the templates are written in. It does not decide which files are written where, or whether an
//! existing file may be overwritten: that is `commands::init` (and `commands::new`).
//!
//! # Placeholders
//! A placeholder is `{{key}}` with `key` made of lowercase ASCII letters, digits and `_`, and no
//! spaces. Anything else that starts with `{{` (for example a GitHub Actions expression
//! `${{ github.sha }}`) is copied as it is. Rendering a placeholder whose key was not supplied is
//! an error, so a typo in a template fails the tests instead of shipping a `{{lable}}`.
//! Substituted values are not scanned again, so a path containing `{{` stays literal.
//!
//! The renderer does not escape: callers pass each value already encoded for the place it goes
//! (`*_json` keys hold a JSON string literal with its quotes, `*_toml` a TOML basic string,
//! `*_sh` a shell word), which keeps paths with spaces or quotes from breaking a generated file.

use std::collections::BTreeMap;

/// One embedded template: its path under `templates/` and its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Template {
    pub name: &'static str,
    pub text: &'static str,
}

macro_rules! template {
    ($name:literal) => {
        Template {
            name: $name,
            text: include_str!(concat!("../../templates/", $name)),
        }
    };
}

/// `Cargo.toml` of a new server package (`.tmpl`: a nested `Cargo.toml` would make cargo leave
/// the directory out of the published crate).
pub const NEW_CARGO_TOML: Template = template!("new/Cargo.toml.tmpl");
/// `src/main.rs` of a new server: rmcp, a read tool and a gated write tool.
pub const NEW_MAIN_RS: Template = template!("new/main.rs.tmpl");
pub const NEW_README: Template = template!("new/README.md");
pub const NEW_GITIGNORE: Template = template!("new/gitignore");
/// The commented `[package.metadata.mcp-dev]` block (in a new Cargo.toml, appended by `init`).
pub const METADATA_BLOCK: Template = template!("metadata-block.toml");
pub const HOST_CLAUDE_CODE: Template = template!("hosts/claude-code.json");
pub const HOST_CLAUDE_DESKTOP: Template = template!("hosts/claude-desktop.json");
pub const HOST_VSCODE: Template = template!("hosts/vscode.json");
pub const HOST_CURSOR: Template = template!("hosts/cursor.json");
pub const HOST_CODEX: Template = template!("hosts/codex.toml");
pub const HOST_INSPECTOR: Template = template!("hosts/inspector.sh");
/// Where each host snippet goes, the PATH pitfall, and every snippet's text.
pub const HOSTS_README: Template = template!("hosts/README.md");
pub const UPDATE_CONTRACT: Template = template!("UPDATE-CONTRACT.md");
pub const CI_WORKFLOW: Template = template!("ci/mcp-identity.yml");
pub const WATCH_BACON: Template = template!("watch/bacon.toml");
pub const WATCH_SCRIPT: Template = template!("watch/watch.sh");

/// Every embedded template.
pub const ALL: &[Template] = &[
    NEW_CARGO_TOML,
    NEW_MAIN_RS,
    NEW_README,
    NEW_GITIGNORE,
    METADATA_BLOCK,
    HOST_CLAUDE_CODE,
    HOST_CLAUDE_DESKTOP,
    HOST_VSCODE,
    HOST_CURSOR,
    HOST_CODEX,
    HOST_INSPECTOR,
    HOSTS_README,
    UPDATE_CONTRACT,
    CI_WORKFLOW,
    WATCH_BACON,
    WATCH_SCRIPT,
];

/// Values for placeholders. Keys a template does not use are ignored.
#[derive(Debug, Clone, Default)]
pub struct Vars(BTreeMap<String, String>);

impl Vars {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        self.0.insert(key.to_string(), value.into());
        self
    }
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("template `{template}` uses placeholder `{{{{{key}}}}}`, which has no value")]
pub struct RenderError {
    pub template: &'static str,
    pub key: String,
}

/// Fills every `{{key}}` of `template` from `vars`.
pub fn render(template: &Template, vars: &Vars) -> Result<String, RenderError> {
    let mut out = String::with_capacity(template.text.len() + 256);
    let mut rest = template.text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match placeholder_key(after) {
            Some(key) => {
                let value = vars.get(key).ok_or_else(|| RenderError {
                    template: template.name,
                    key: key.to_string(),
                })?;
                out.push_str(value);
                rest = &after[key.len() + 2..];
            }
            None => {
                // Not a placeholder: keep one `{` and look again from the next one, so `{{{key}}`
                // still finds its placeholder.
                out.push('{');
                rest = &rest[start + 1..];
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The keys of every placeholder in `text`, in order of first use.
pub fn placeholders(text: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        match placeholder_key(after) {
            Some(key) => {
                if !keys.iter().any(|k| k == key) {
                    keys.push(key.to_string());
                }
                rest = &after[key.len() + 2..];
            }
            None => rest = &rest[start + 1..],
        }
    }
    keys
}

/// `key` when `text` starts with `key}}` and `key` is a valid placeholder name.
fn placeholder_key(text: &str) -> Option<&str> {
    let len = text
        .bytes()
        .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
        .count();
    (len > 0 && text[len..].starts_with("}}")).then(|| &text[..len])
}

/// A JSON string literal, quotes included.
pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// A TOML basic string, quotes included.
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A TOML key: bare when it can be, quoted otherwise (a `.` would split a bare key).
pub fn toml_key(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        s.to_string()
    } else {
        toml_string(s)
    }
}

/// One POSIX shell word: unchanged when it needs no quoting, else single-quoted.
pub fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &'static str) -> Template {
        Template { name: "test", text }
    }

    #[test]
    fn fills_placeholders_and_keeps_other_braces() {
        let mut v = Vars::new();
        v.set("name", "inv").set("path_json", "\"/a b\"");
        let out = render(
            &t("x={{name}} y={{path_json}} gh=${{ github.sha }} {{{name}}} {} }}"),
            &v,
        )
        .unwrap();
        assert_eq!(out, "x=inv y=\"/a b\" gh=${{ github.sha }} {inv} {} }}");
    }

    #[test]
    fn unknown_placeholder_is_an_error() {
        let err = render(&t("a {{lable}} b"), &Vars::new()).unwrap_err();
        assert_eq!(err.key, "lable");
        assert!(err.to_string().contains("`{{lable}}`"), "{err}");
    }

    #[test]
    fn values_are_not_rendered_again() {
        let mut v = Vars::new();
        v.set("a", "{{b}}");
        assert_eq!(render(&t("{{a}}"), &v).unwrap(), "{{b}}");
    }

    #[test]
    fn placeholders_lists_each_key_once() {
        assert_eq!(
            placeholders("{{a}} {{ b }} {{a}} {{c_1}} {{D}}"),
            vec!["a".to_string(), "c_1".to_string()]
        );
    }

    #[test]
    fn escapers_survive_hostile_paths() {
        let path = "/tmp/a \"b\"\\c'd\n";
        let json: String = serde_json::from_str(&json_string(path)).unwrap();
        assert_eq!(json, path);
        let doc: toml::Table = format!("k = {}", toml_string(path)).parse().unwrap();
        assert_eq!(doc["k"].as_str(), Some(path));
        assert_eq!(shell_word("/usr/bin"), "/usr/bin");
        assert_eq!(shell_word("a b'c"), "'a b'\\''c'");
        assert_eq!(toml_key("inv-1"), "inv-1");
        assert_eq!(toml_key("a.b"), "\"a.b\"");
    }

    #[test]
    fn every_template_is_embedded() {
        for tpl in ALL {
            assert!(!tpl.text.trim().is_empty(), "{} is empty", tpl.name);
        }
    }
}
