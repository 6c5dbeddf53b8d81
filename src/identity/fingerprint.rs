//! Identity: inputs → identity record. Pure: no files, no processes, no clock.
//!
//! The record answers "which code will receive the next call?" for a cargo-built server. It is
//! built from facts that `capture` gathered; this module only decides what is hashed and how.
//!
//! # What is hashed (the `identityDigest`)
//! The digest is SHA-256 over the canonical JSON (sorted keys, compact) of
//! `{schema, label, components}`, where `components` maps each component name to the digest of
//! its own stable fields:
//!
//! | component | stable fields | why |
//! |---|---|---|
//! | `executable` | sha256 of the exact bytes that will be executed (the store copy) | the code itself |
//! | `lockfile` | sha256 of Cargo.lock (null when absent) | pins every registry/git version |
//! | `dependency tree` | per reachable package (normal + build edges): name, version, source, checksum, enabled features, and for path packages a digest of their source files | what went into the binary, including path deps whose code changed |
//! | `runtime` | rustc release, commit hash, host, target triple, profile, RUSTFLAGS, CARGO_ENCODED_RUSTFLAGS, requested features | same source, different compiler or flags, different code |
//! | `config` | the `[package.metadata.mcp-dev]` table | changes what is gated, watched and hashed |
//! | `env` | for each declared variable: name and keyed digest of its value (or unset) | declared behaviour switches |
//! | `extra inputs` | for each declared file/dir: relative path and content digest (files sorted, relative names included) | data the server loads at run time |
//! | `wrapper` | the wrapper script's relative path and digest | it decides how the server starts |
//! | `launcher` | cargo-mcp-dev version and the sha256 of its own executable | the supervisor is part of what acts |
//! | `launch` | argv with the store path abstracted to `<executable>`, the working directory relative to the workspace root (absolute if outside) | arguments and cwd change behaviour |
//!
//! # Deliberately not hashed
//! Timestamps (`capturedAt`), the absolute target directory and store path (moving `target/`
//! does not change what runs; the executable's bytes are hashed instead), package ids of path
//! packages (they embed absolute paths; name, version and source digest are used instead), the
//! absolute workspace root, executable size and path (implied by the digest), and values of
//! variables (only their keyed digests, HMAC with the per-user audit key over name and value, are
//! stored; without a key, only whether the variable is set).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::base::hashing::{sha256_bytes, sha256_json};

/// Version of the identity record format.
pub const SCHEMA: &str = "cargo-mcp-dev/identity/v1";

/// Placeholder for the store path inside the hashed argv.
pub const EXECUTABLE_PLACEHOLDER: &str = "<executable>";

/// An identity component, in the order status lines name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    Executable,
    Lockfile,
    DependencyTree,
    Runtime,
    Config,
    Env,
    ExtraInputs,
    Wrapper,
    Launcher,
    Launch,
}

impl Component {
    pub const ALL: [Component; 10] = [
        Component::Executable,
        Component::Lockfile,
        Component::DependencyTree,
        Component::Runtime,
        Component::Config,
        Component::Env,
        Component::ExtraInputs,
        Component::Wrapper,
        Component::Launcher,
        Component::Launch,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Component::Executable => "executable",
            Component::Lockfile => "lockfile",
            Component::DependencyTree => "dependency tree",
            Component::Runtime => "runtime",
            Component::Config => "config",
            Component::Env => "env",
            Component::ExtraInputs => "extra inputs",
            Component::Wrapper => "wrapper",
            Component::Launcher => "launcher",
            Component::Launch => "launch",
        }
    }
    pub fn from_name(s: &str) -> Option<Component> {
        Component::ALL.into_iter().find(|c| c.name() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PackageRef {
    pub id: String,
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launch {
    /// argv exactly as executed (absolute store path first, or the wrapper then the store path).
    pub argv: Vec<String>,
    /// Absolute working directory of the server.
    pub cwd: String,
    /// The same, relative to the workspace root (absent when outside it).
    pub cwd_relative: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Executable {
    /// Cargo's output path, relative to the workspace root when inside it.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// The read-only content-addressed copy that is actually executed.
    pub store_path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileDigest {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct DependencyEntry {
    pub id: String,
    pub name: String,
    pub version: String,
    pub source: Option<String>,
    pub checksum: Option<String>,
    pub features: Vec<String>,
    /// Path packages: digest of their source files (set by identity capture).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub source_digest: Option<String>,
    /// Path packages: their root on this machine (set by resolution, for hashing and watching;
    /// never part of an identity record: absolute paths differ between checkouts).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub local_root: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DependencyTree {
    pub sha256: String,
    pub packages: usize,
    pub list: Vec<DependencyEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Runtime {
    pub rustc_release: String,
    pub rustc_commit: String,
    pub host: String,
    pub target: String,
    pub profile: String,
    pub rustflags: Option<String>,
    pub encoded_rustflags: Option<String>,
    /// Feature flags as requested (`--features`, `--all-features`, `--no-default-features`).
    pub features: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvDigest {
    pub name: String,
    /// Keyed digest of the value (`hmac-sha256:…`, see [`env_value_mac`]); null when unset.
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtraInput {
    /// As configured (relative to the package root).
    pub path: String,
    pub kind: String,
    pub sha256: String,
    pub files: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Wrapper {
    pub path: String,
    pub sha256: String,
    /// What the wrapper starts: the store path of the server executable.
    pub starts: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launcher {
    pub name: String,
    pub version: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigDigest {
    pub sha256: String,
    pub unknown_keys: Vec<String>,
}

/// Everything identity capture gathered, before hashing.
#[derive(Debug, Clone, PartialEq)]
pub struct IdentityInputs {
    pub label: String,
    pub package: PackageRef,
    pub bin: String,
    pub launch: Launch,
    pub executable: Executable,
    pub lockfile: Option<FileDigest>,
    pub dependencies: Vec<DependencyEntry>,
    pub runtime: Runtime,
    pub config: Value,
    pub unknown_config_keys: Vec<String>,
    pub env: Vec<EnvDigest>,
    pub extra_inputs: Vec<ExtraInput>,
    pub wrapper: Option<Wrapper>,
    pub launcher: Launcher,
    pub workspace_root: String,
    pub target_dir: String,
    pub captured_at: String,
}

/// The identity record (JSON, versioned by `schema`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdentityRecord {
    pub schema: String,
    pub label: String,
    pub package: PackageRef,
    pub bin: String,
    pub launch: Launch,
    pub executable: Executable,
    pub lockfile: Option<FileDigest>,
    pub dependency_tree: DependencyTree,
    pub runtime: Runtime,
    pub config: ConfigDigest,
    pub env: Vec<EnvDigest>,
    pub extra_inputs: Vec<ExtraInput>,
    pub wrapper: Option<Wrapper>,
    pub launcher: Launcher,
    /// Digest per component (keys are [`Component::name`]).
    pub components: BTreeMap<String, String>,
    pub identity_digest: String,
    /// Not hashed.
    pub workspace_root: String,
    /// Not hashed.
    pub target_dir: String,
    /// Not hashed.
    pub captured_at: String,
}

/// Digest of an env value, salted with its name so equal values of different variables differ.
///
/// Unkeyed: whoever reads the identity file can test guesses of the value (issue 12). Records
/// use [`env_value_mac`] instead; this stays for comparisons with records written before.
pub fn env_value_digest(name: &str, value: &str) -> String {
    sha256_bytes(&env_message(b"cargo-mcp-dev/env/v1\0", name, value))
}

fn env_message(tag: &[u8], name: &str, value: &str) -> Vec<u8> {
    let mut buf = Vec::with_capacity(name.len() + value.len() + 32);
    buf.extend_from_slice(tag);
    buf.extend_from_slice(name.as_bytes());
    buf.push(0);
    buf.extend_from_slice(value.as_bytes());
    buf
}

/// Keyed digest of an env value: HMAC-SHA256 with the per-user audit key over the name and the
/// value (`hmac-sha256:<hex>`). A reader of the identity file cannot test guesses of a secret
/// value without the key; the same user on the same machine still sees a change of value as a
/// change of the `env` component. Records of different users (or machines) are not comparable
/// on this component.
pub fn env_value_mac(key: &crate::audit::AuditKey, name: &str, value: &str) -> String {
    format!(
        "hmac-sha256:{}",
        crate::audit::chain::keyed_digest(
            key,
            &env_message(b"cargo-mcp-dev/env/v2\0", name, value)
        )
    )
}

/// Recorded for a set variable when no audit key is available: names only, never a value
/// digest.
pub const ENV_SET_UNKEYED: &str = "set (value not recorded: no audit key)";

fn dependency_digest(list: &[DependencyEntry]) -> String {
    let mut entries: Vec<Value> = list
        .iter()
        .map(|d| {
            json!({
                "name": d.name, "version": d.version, "source": d.source,
                "checksum": d.checksum, "features": d.features, "sourceDigest": d.source_digest,
            })
        })
        .collect();
    entries.sort_by_key(|a| a.to_string());
    sha256_json(&Value::Array(entries))
}

fn component_values(i: &IdentityInputs) -> BTreeMap<Component, Value> {
    let hashed_argv: Vec<&str> = i
        .launch
        .argv
        .iter()
        .map(|a| {
            if *a == i.executable.store_path {
                EXECUTABLE_PLACEHOLDER
            } else {
                a.as_str()
            }
        })
        .collect();
    let mut m = BTreeMap::new();
    m.insert(Component::Executable, json!(i.executable.sha256));
    m.insert(
        Component::Lockfile,
        json!(i.lockfile.as_ref().map(|l| &l.sha256)),
    );
    m.insert(
        Component::DependencyTree,
        json!(dependency_digest(&i.dependencies)),
    );
    let r = &i.runtime;
    m.insert(
        Component::Runtime,
        json!({"release": r.rustc_release, "commit": r.rustc_commit, "host": r.host, "target": r.target,
               "profile": r.profile, "rustflags": r.rustflags, "encodedRustflags": r.encoded_rustflags,
               "features": r.features}),
    );
    m.insert(Component::Config, i.config.clone());
    m.insert(
        Component::Env,
        json!(
            i.env
                .iter()
                .map(|e| json!([e.name, e.sha256]))
                .collect::<Vec<_>>()
        ),
    );
    m.insert(
        Component::ExtraInputs,
        json!(
            i.extra_inputs
                .iter()
                .map(|e| json!([e.path, e.kind, e.sha256]))
                .collect::<Vec<_>>()
        ),
    );
    m.insert(
        Component::Wrapper,
        json!(i.wrapper.as_ref().map(|w| json!([w.path, w.sha256]))),
    );
    m.insert(
        Component::Launcher,
        json!({"version": i.launcher.version, "sha256": i.launcher.sha256}),
    );
    let cwd = i
        .launch
        .cwd_relative
        .clone()
        .unwrap_or_else(|| i.launch.cwd.clone());
    m.insert(Component::Launch, json!({"argv": hashed_argv, "cwd": cwd}));
    m
}

/// Builds the record: component digests and the overall identity digest.
pub fn identity_record(i: IdentityInputs) -> IdentityRecord {
    let components: BTreeMap<String, String> = component_values(&i)
        .into_iter()
        .map(|(c, v)| (c.name().to_string(), sha256_json(&v)))
        .collect();
    let identity_digest =
        sha256_json(&json!({"schema": SCHEMA, "label": i.label, "components": components}));
    let mut dependencies = i.dependencies;
    dependencies.sort();
    IdentityRecord {
        schema: SCHEMA.to_string(),
        dependency_tree: DependencyTree {
            sha256: dependency_digest(&dependencies),
            packages: dependencies.len(),
            list: dependencies,
        },
        config: ConfigDigest {
            sha256: sha256_json(&i.config),
            unknown_keys: i.unknown_config_keys,
        },
        label: i.label,
        package: i.package,
        bin: i.bin,
        launch: i.launch,
        executable: i.executable,
        lockfile: i.lockfile,
        runtime: i.runtime,
        env: i.env,
        extra_inputs: i.extra_inputs,
        wrapper: i.wrapper,
        launcher: i.launcher,
        components,
        identity_digest,
        workspace_root: i.workspace_root,
        target_dir: i.target_dir,
        captured_at: i.captured_at,
    }
}

/// Components whose digests differ between two records, in display order. A component missing
/// from either side (older schema) counts as changed.
pub fn changed_components(old: &IdentityRecord, new: &IdentityRecord) -> Vec<Component> {
    Component::ALL
        .into_iter()
        .filter(|c| old.components.get(c.name()) != new.components.get(c.name()))
        .collect()
}

/// What `check --expect` found, component by component.
///
/// It compares every component's digest, except `launch`: that one mixes the server's argv with
/// the directory the command was started from, and a CI job rarely starts where a developer
/// did. So the argv (`launch arguments`) is compared on its own, and the launch directory is
/// compared only when asked (`--include-launch-dir`); it stays recorded either way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExpectComparison {
    /// Names of the compared parts that differ, in display order.
    pub differing: Vec<&'static str>,
    /// `(expected, actual)` launch directories when they differ (compared or not).
    pub launch_dir: Option<(String, String)>,
}

/// Name of the launch directory in `check --expect` messages.
pub const LAUNCH_DIRECTORY: &str = "launch directory";
/// Name of the launch argv in `check --expect` messages.
pub const LAUNCH_ARGUMENTS: &str = "launch arguments";

/// Name of an expected record that is not self-consistent in `check --expect` messages.
pub const INCONSISTENT_RECORD: &str =
    "the expected record itself (its component digests are not those of its own fields)";

/// The first part of `r` that is not what its own fields make it, if any: each component digest
/// recomputed from the record's fields, the dependency list's digest, the identity digest from
/// the components, and the launch directory (hashed relative to the workspace) against the
/// absolute one a start uses. A record edited by hand (or by an agent that can write
/// `target/`) to show one build's fields with another's digests is caught. A record of another
/// schema cannot be judged, so it is not taken either (only this schema exists).
pub fn inconsistency(r: &IdentityRecord) -> Option<&'static str> {
    if r.schema != SCHEMA {
        return Some("schema");
    }
    if let Some(rel) = &r.launch.cwd_relative {
        let root = std::path::Path::new(&r.workspace_root);
        let expected = if rel == "." {
            root.to_path_buf()
        } else {
            root.join(rel)
        };
        if expected != std::path::Path::new(&r.launch.cwd) {
            return Some("launch directory");
        }
    }
    if r.dependency_tree.sha256 != dependency_digest(&r.dependency_tree.list) {
        return Some(Component::DependencyTree.name());
    }
    let inputs = IdentityInputs {
        label: r.label.clone(),
        package: r.package.clone(),
        bin: r.bin.clone(),
        launch: r.launch.clone(),
        executable: r.executable.clone(),
        lockfile: r.lockfile.clone(),
        dependencies: r.dependency_tree.list.clone(),
        runtime: r.runtime.clone(),
        config: Value::Null, // only its digest is recorded: compared below
        unknown_config_keys: Vec::new(),
        env: r.env.clone(),
        extra_inputs: r.extra_inputs.clone(),
        wrapper: r.wrapper.clone(),
        launcher: r.launcher.clone(),
        workspace_root: String::new(),
        target_dir: String::new(),
        captured_at: String::new(),
    };
    for (c, value) in component_values(&inputs) {
        let want = match c {
            Component::Config => r.config.sha256.clone(),
            _ => sha256_json(&value),
        };
        if r.components.get(c.name()) != Some(&want) {
            return Some(c.name());
        }
    }
    let digest =
        sha256_json(&json!({"schema": r.schema, "label": r.label, "components": r.components}));
    (digest != r.identity_digest).then_some("identityDigest")
}

/// Compares `actual` with `expected` the way `check --expect` does (see [`ExpectComparison`]).
pub fn compare_for_expect(
    expected: &IdentityRecord,
    actual: &IdentityRecord,
    include_launch_dir: bool,
) -> ExpectComparison {
    let mut differing: Vec<&'static str> = changed_components(expected, actual)
        .into_iter()
        .filter(|c| *c != Component::Launch)
        .map(Component::name)
        .collect();
    if launch_argv(expected) != launch_argv(actual) {
        differing.push(LAUNCH_ARGUMENTS);
    }
    // A record whose fields say one build and whose digests say another matches nothing.
    if inconsistency(expected).is_some() {
        differing.push(INCONSISTENT_RECORD);
    }
    let dir = |r: &IdentityRecord| {
        r.launch
            .cwd_relative
            .clone()
            .unwrap_or_else(|| r.launch.cwd.clone())
    };
    let launch_dir = (dir(expected) != dir(actual)).then(|| (dir(expected), dir(actual)));
    if include_launch_dir && launch_dir.is_some() {
        differing.push(LAUNCH_DIRECTORY);
    }
    ExpectComparison {
        differing,
        launch_dir,
    }
}

/// The argv with the store path (which moves with the target dir) abstracted, and paths inside
/// the workspace (a wrapper script) relative to it, so a checkout elsewhere compares equal.
fn launch_argv(r: &IdentityRecord) -> Vec<String> {
    let root = format!("{}/", r.workspace_root.trim_end_matches('/'));
    r.launch
        .argv
        .iter()
        .map(|a| {
            if *a == r.executable.store_path {
                EXECUTABLE_PLACEHOLDER.to_string()
            } else if let Some(rel) = a
                .strip_prefix(&root)
                .filter(|_| !r.workspace_root.is_empty())
            {
                format!("<workspace>/{rel}")
            } else {
                a.clone()
            }
        })
        .collect()
}

/// Human list: `executable, dependency tree`.
pub fn component_list(components: &[Component]) -> String {
    components
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Which dependencies were added, removed or changed between two records (for `--diff`).
pub fn dependency_changes(old: &IdentityRecord, new: &IdentityRecord) -> Vec<String> {
    let key = |d: &DependencyEntry| (d.name.clone(), d.source.clone().unwrap_or_default());
    let olds: BTreeMap<_, _> = old
        .dependency_tree
        .list
        .iter()
        .map(|d| (key(d), d))
        .collect();
    let news: BTreeMap<_, _> = new
        .dependency_tree
        .list
        .iter()
        .map(|d| (key(d), d))
        .collect();
    let mut out = Vec::new();
    for (k, n) in &news {
        match olds.get(k) {
            None => out.push(format!("+ {} {}", n.name, n.version)),
            Some(o) if o.version != n.version => {
                out.push(format!("~ {} {} -> {}", n.name, o.version, n.version))
            }
            Some(o) if o.source_digest != n.source_digest => {
                out.push(format!("~ {} {} (sources changed)", n.name, n.version))
            }
            Some(o) if o.features != n.features => out.push(format!(
                "~ {} {} features [{}] -> [{}]",
                n.name,
                n.version,
                o.features.join(", "),
                n.features.join(", ")
            )),
            Some(o) if o.checksum != n.checksum => {
                out.push(format!("~ {} {} (checksum changed)", n.name, n.version))
            }
            _ => {}
        }
    }
    for (k, o) in &olds {
        if !news.contains_key(k) {
            out.push(format!("- {} {}", o.name, o.version));
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn inputs() -> IdentityInputs {
        IdentityInputs {
            label: "inventory".into(),
            package: PackageRef {
                id: "path+file:///w#inventory@0.1.0".into(),
                name: "inventory".into(),
                version: "0.1.0".into(),
            },
            bin: "inventory".into(),
            launch: Launch {
                argv: vec!["/w/target/mcp-dev/store/sha256-aa".into(), "--flag".into()],
                cwd: "/w".into(),
                cwd_relative: Some(".".into()),
            },
            executable: Executable {
                path: "target/debug/inventory".into(),
                size: 10,
                sha256: "sha256:aa".into(),
                store_path: "/w/target/mcp-dev/store/sha256-aa".into(),
            },
            lockfile: Some(FileDigest {
                path: "Cargo.lock".into(),
                sha256: "sha256:11".into(),
            }),
            dependencies: vec![DependencyEntry {
                id: "path+file:///w/core#core@0.1.0".into(),
                name: "core".into(),
                version: "0.1.0".into(),
                source: None,
                checksum: None,
                features: vec![],
                source_digest: Some("sha256:c1".into()),
                local_root: None,
            }],
            runtime: Runtime {
                rustc_release: "1.95.0".into(),
                rustc_commit: "abc".into(),
                host: "x86_64-unknown-linux-gnu".into(),
                target: "x86_64-unknown-linux-gnu".into(),
                profile: "dev".into(),
                rustflags: None,
                encoded_rustflags: None,
                features: vec![],
            },
            config: json!({"label": "inventory"}),
            unknown_config_keys: vec![],
            env: vec![EnvDigest {
                name: "MODE".into(),
                sha256: Some(env_value_digest("MODE", "a")),
            }],
            extra_inputs: vec![],
            wrapper: None,
            launcher: Launcher {
                name: "cargo-mcp-dev".into(),
                version: "0.1.0".into(),
                sha256: "sha256:ee".into(),
            },
            workspace_root: "/w".into(),
            target_dir: "/w/target".into(),
            captured_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn expect_leaves_the_launch_directory_out_unless_asked() {
        let expected = identity_record(inputs());
        // The same server checked out elsewhere and checked from another directory, with a
        // wrapper script inside the workspace.
        let moved = |i: &mut IdentityInputs, root: &str| {
            i.workspace_root = root.into();
            i.executable.store_path = format!("{root}/target/mcp-dev/store/sha256-aa");
            i.launch.argv = vec![
                format!("{root}/scripts/serve.sh"),
                i.executable.store_path.clone(),
                "--flag".into(),
            ];
            i.launch.cwd = "/home/runner".into();
            i.launch.cwd_relative = None;
        };
        let mut a = inputs();
        moved(&mut a, "/w");
        let mut b = inputs();
        moved(&mut b, "/ci/checkout");
        b.launch.cwd = "/ci".into();
        let (a, b) = (identity_record(a), identity_record(b));
        assert_ne!(
            a.identity_digest, b.identity_digest,
            "the launch directory is hashed"
        );
        let cmp = compare_for_expect(&a, &b, false);
        assert!(cmp.differing.is_empty(), "{cmp:?}");
        assert_eq!(
            cmp.launch_dir,
            Some(("/home/runner".to_string(), "/ci".to_string()))
        );
        assert_eq!(
            compare_for_expect(&a, &b, true).differing,
            vec![LAUNCH_DIRECTORY]
        );
        // Different arguments are a difference, named on their own.
        let mut c = inputs();
        c.launch.argv.push("--other".into());
        let cmp = compare_for_expect(&expected, &identity_record(c), false);
        assert_eq!(cmp.differing, vec![LAUNCH_ARGUMENTS]);
        assert_eq!(cmp.launch_dir, None);
    }

    fn changed(mutate: impl FnOnce(&mut IdentityInputs)) -> Vec<Component> {
        let a = identity_record(inputs());
        let mut i = inputs();
        mutate(&mut i);
        let b = identity_record(i);
        let c = changed_components(&a, &b);
        assert_eq!(
            c.is_empty(),
            a.identity_digest == b.identity_digest,
            "digest agrees with components"
        );
        c
    }

    #[test]
    fn each_input_moves_its_own_component() {
        assert_eq!(
            changed(|i| i.executable.sha256 = "sha256:bb".into()),
            vec![Component::Executable]
        );
        assert_eq!(changed(|i| i.lockfile = None), vec![Component::Lockfile]);
        assert_eq!(
            changed(|i| i.dependencies[0].source_digest = Some("sha256:c2".into())),
            vec![Component::DependencyTree]
        );
        assert_eq!(
            changed(|i| i.dependencies[0].version = "0.2.0".into()),
            vec![Component::DependencyTree]
        );
        assert_eq!(
            changed(|i| i.dependencies[0].features = vec!["x".into()]),
            vec![Component::DependencyTree]
        );
        assert_eq!(
            changed(|i| i.runtime.profile = "release".into()),
            vec![Component::Runtime]
        );
        assert_eq!(
            changed(|i| i.runtime.rustflags = Some("-Copt-level=1".into())),
            vec![Component::Runtime]
        );
        assert_eq!(
            changed(|i| i.config = json!({"label": "x"})),
            vec![Component::Config]
        );
        assert_eq!(changed(|i| i.env[0].sha256 = None), vec![Component::Env]);
        assert_eq!(
            changed(|i| i.extra_inputs.push(ExtraInput {
                path: "data".into(),
                kind: "dir".into(),
                sha256: "sha256:d".into(),
                files: 1
            })),
            vec![Component::ExtraInputs]
        );
        assert_eq!(
            changed(|i| i.wrapper = Some(Wrapper {
                path: "s.sh".into(),
                sha256: "sha256:5".into(),
                starts: "x".into()
            })),
            vec![Component::Wrapper]
        );
        assert_eq!(
            changed(|i| i.launcher.sha256 = "sha256:ff".into()),
            vec![Component::Launcher]
        );
        assert_eq!(
            changed(|i| i.launch.argv.push("--more".into())),
            vec![Component::Launch]
        );
        assert_eq!(
            changed(|i| i.launch.cwd_relative = Some("sub".into())),
            vec![Component::Launch]
        );
    }

    #[test]
    fn volatile_facts_do_not_move_the_digest() {
        // Timestamps, where target/ lives, and the absolute workspace location are not identity.
        assert!(changed(|i| i.captured_at = "2030-01-01T00:00:00Z".into()).is_empty());
        assert!(
            changed(|i| {
                i.target_dir = "/elsewhere/target".into();
                i.executable.store_path = "/elsewhere/target/mcp-dev/store/sha256-aa".into();
                i.launch.argv[0] = i.executable.store_path.clone();
                i.executable.path = "/elsewhere/target/debug/inventory".into();
            })
            .is_empty()
        );
        assert!(
            changed(|i| {
                i.workspace_root = "/moved".into();
                i.launch.cwd = "/moved".into();
                i.dependencies[0].id = "path+file:///moved/core#core@0.1.0".into();
            })
            .is_empty()
        );
        assert!(changed(|i| i.dependencies.reverse()).is_empty());
    }

    /// Issue 12, low finding "the environment digest is unkeyed": without the key, a guess of
    /// the value cannot be checked against the recorded digest.
    #[test]
    fn env_digest_is_keyed() {
        let k1 = crate::audit::AuditKey::from_bytes([1; 32]);
        let k2 = crate::audit::AuditKey::from_bytes([2; 32]);
        let d = env_value_mac(&k1, "TOKEN", "secret-value");
        assert!(
            d.starts_with("hmac-sha256:") && !d.contains("secret"),
            "{d}"
        );
        assert_eq!(d, env_value_mac(&k1, "TOKEN", "secret-value"));
        assert_ne!(d, env_value_mac(&k2, "TOKEN", "secret-value"));
        assert_ne!(d, env_value_mac(&k1, "OTHER", "secret-value"));
        assert_ne!(d, env_value_mac(&k1, "TOKEN", "other-value"));
        assert!(!d.ends_with(&env_value_digest("TOKEN", "secret-value")[7..]));
    }

    #[test]
    fn env_digest_is_salted_and_hides_the_value() {
        let d = env_value_digest("TOKEN", "secret-value");
        assert!(!d.contains("secret"));
        assert_ne!(d, env_value_digest("OTHER", "secret-value"));
        assert_eq!(d, env_value_digest("TOKEN", "secret-value"));
    }

    #[test]
    fn record_round_trips_as_json() {
        let r = identity_record(inputs());
        let text = serde_json::to_string_pretty(&r).unwrap();
        let back: IdentityRecord = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        assert!(text.contains("\"identityDigest\""));
        assert!(text.contains("\"dependencyTree\""));
        assert_eq!(r.components.len(), Component::ALL.len());
    }

    #[test]
    fn dependency_changes_are_named() {
        let a = identity_record(inputs());
        let mut i = inputs();
        i.dependencies[0].source_digest = Some("sha256:zz".into());
        i.dependencies.push(DependencyEntry {
            id: "registry#serde@1.0.0".into(),
            name: "serde".into(),
            version: "1.0.0".into(),
            source: Some("registry+x".into()),
            checksum: Some("c".into()),
            features: vec![],
            source_digest: None,
            local_root: None,
        });
        let b = identity_record(i);
        let ch = dependency_changes(&a, &b);
        assert!(
            ch.contains(&"~ core 0.1.0 (sources changed)".to_string()),
            "{ch:?}"
        );
        assert!(ch.contains(&"+ serde 1.0.0".to_string()), "{ch:?}");
    }
}

#[cfg(test)]
mod consistency_tests {
    use super::tests::inputs;
    use super::*;

    /// Red-team round 14: `check --expect` trusted the `components` map of the expected record
    /// and never checked it against the record's own fields or its `identityDigest`. A record
    /// whose readable parts (identityDigest, executable.sha256…) are the approved build's but
    /// whose `components` were copied from another build made `check --expect` pass for that
    /// other build.
    #[test]
    fn expect_refuses_a_record_whose_components_contradict_its_fields() {
        let approved = identity_record(inputs());
        let mut other = inputs();
        other.executable.sha256 = "sha256:cc".into();
        let actual = identity_record(other);
        assert_ne!(approved.identity_digest, actual.identity_digest);
        let mut crafted = approved.clone();
        crafted.components = actual.components.clone();
        let cmp = compare_for_expect(&crafted, &actual, false);
        assert_eq!(cmp.differing, vec![INCONSISTENT_RECORD], "{cmp:?}");
    }

    /// A record as captured is consistent; each kind of edit is caught and named: a field
    /// without its component, a component without the identity digest, the dependency list
    /// without its digest, the launch argv (what a fallback would run).
    #[test]
    fn a_captured_record_is_consistent_and_each_edit_is_named() {
        let r = identity_record(inputs());
        assert_eq!(inconsistency(&r), None);
        let edit = |f: &dyn Fn(&mut IdentityRecord)| {
            let mut e = r.clone();
            f(&mut e);
            inconsistency(&e)
        };
        assert_eq!(
            edit(&|e| e.executable.sha256 = "sha256:ee".into()),
            Some("executable")
        );
        assert_eq!(
            edit(&|e| e.launch.argv.insert(0, "/bin/sh".into())),
            Some(Component::Launch.name())
        );
        assert_eq!(
            edit(&|e| e.config.sha256 = "x".into()),
            Some(Component::Config.name())
        );
        assert_eq!(
            edit(&|e| e.identity_digest = "sha256:00".into()),
            Some("identityDigest")
        );
        assert_eq!(
            edit(&|e| {
                e.dependency_tree.list.pop();
            }),
            Some(Component::DependencyTree.name())
        );
        // Not judged, so not taken: a record of another schema.
        assert_eq!(edit(&|e| e.schema = format!("{SCHEMA} ")), Some("schema"));
        // The directory a start uses is the one the digest covers (relative to the workspace).
        assert_eq!(
            edit(&|e| e.launch.cwd = "/tmp/agent".into()),
            Some("launch directory")
        );
    }
}
