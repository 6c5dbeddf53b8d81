//! Which package, binary and target directory: cargo discovery, `cargo metadata`, and its cache.
//!
//! Owns finding cargo (honouring `$CARGO`), running `cargo metadata` with the pass-through flags,
//! selecting the server package and bin, walking the resolved graph of normal and build
//! dependencies, and caching that result keyed on the digests of every manifest, the lockfile and
//! cargo config files, so an unchanged project never pays for `cargo metadata` again. It does not
//! build and never touches the server's processes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use cargo_metadata::{DependencyKind, Metadata, MetadataCommand, PackageId, TargetKind};
use serde::{Deserialize, Serialize};

use crate::base::error::Failure;
use crate::base::exit_codes;
use crate::base::hashing;
use crate::identity::build::CargoSelection;
use crate::identity::config::LoadedConfig;
use crate::identity::fingerprint::DependencyEntry;

/// The largest manifest, lockfile, cargo config or cache entry read (cargo reads these files
/// following links; a larger one is not read).
const MANIFEST_LIMIT: u64 = 64 << 20;

/// Bumped whenever [`Resolved`] changes shape, so old cache entries are ignored.
const CACHE_VERSION: u32 = 2;

/// The cargo executable to run: `$CARGO` (set by cargo for subcommands) or `cargo` on `PATH`.
pub fn find_cargo() -> Result<PathBuf, Failure> {
    if let Some(cargo) = std::env::var_os("CARGO") {
        let p = PathBuf::from(&cargo);
        return match crate::base::beneath::followed::metadata(&p) {
            Ok(m) if m.is_file() => Ok(p),
            Ok(_) => Err(Failure::new(
                exit_codes::METADATA_FAILED,
                format!("$CARGO is set to `{}`, which is not a file", p.display()),
            )),
            Err(e) => Err(Failure::new(
                exit_codes::METADATA_FAILED,
                format!("$CARGO is set to `{}`: {e}", p.display()),
            )),
        };
    }
    find_on_path("cargo").ok_or_else(|| {
        let path = std::env::var("PATH").unwrap_or_default();
        Failure::new(
            exit_codes::METADATA_FAILED,
            format!("cargo not found on PATH (searched: {})", if path.is_empty() { "<empty>" } else { &path }),
        )
        .with_note(
            "MCP hosts start servers with a minimal environment (HOME, PATH, SHELL, TERM, USER…): \
             add cargo's directory (e.g. ~/.cargo/bin) to PATH in the host's server entry (\"env\"), \
             or set CARGO to cargo's absolute path",
        )
    })
}

/// The rustc to ask for version facts: `$RUSTC`, else `rustc` next to cargo, else on PATH.
pub fn find_rustc(cargo: &Path) -> PathBuf {
    if let Some(r) = std::env::var_os("RUSTC") {
        return PathBuf::from(r);
    }
    if let Some(dir) = cargo.parent() {
        let beside = dir.join("rustc");
        if crate::base::beneath::followed::is_file(&beside) {
            return beside;
        }
    }
    find_on_path("rustc").unwrap_or_else(|| PathBuf::from("rustc"))
}

pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    crate::base::beneath::followed::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `rustc -vV`, parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RustcFacts {
    pub release: String,
    pub commit_hash: String,
    pub host: String,
}

/// Starts `rustc -vV` on its own thread (through rustup's proxy it takes ~25 ms): the caller
/// goes on resolving and building, and [`rustc_facts`] later returns at once or waits for it.
pub fn prefetch_rustc_facts(rustc: &Path) {
    let rustc = rustc.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("rustc-vV".into())
        .spawn(move || {
            if let Ok(facts) = rustc_facts(&rustc) {
                remember_rustc_facts(&remembered_facts_file(), &rustc, &facts);
            }
        });
}

fn remembered_facts_file() -> PathBuf {
    cache_dir().join("rustc-facts.json")
}

/// The facts `rustc -vV` gave the last process that ran this `rustc` (same path, same
/// `RUSTUP_TOOLCHAIN`): a guess to start with, never the facts an identity is built from.
pub fn remembered_rustc_facts(rustc: &Path) -> Option<RustcFacts> {
    remembered_in(&remembered_facts_file(), rustc)
}

/// The directory of one of this process's cache files (the rustc facts, the resolve cache),
/// held once per process and directory (created when missing): `run` resolves again at every
/// rebuild, and each read or write is then one `openat` beneath it, the file never followed.
fn cache_dir_of(file: &Path) -> Option<(std::sync::Arc<crate::base::beneath::Beneath>, &Path)> {
    use crate::base::beneath::HeldRoot;
    static HELD: std::sync::Mutex<Vec<HeldRoot>> = std::sync::Mutex::new(Vec::new());
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty())?;
    let name = Path::new(file.file_name()?);
    let root = {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        match held.iter().find(|h| h.path() == dir) {
            Some(h) => h.clone(),
            None => {
                // Bounded: a process uses two (tests use more, one per temporary directory).
                if held.len() >= 8 {
                    held.remove(0);
                }
                held.push(HeldRoot::new(dir, true));
                held.last()?.clone()
            }
        }
    };
    Some((root.get().ok()?, name))
}

fn remembered_in(file: &Path, rustc: &Path) -> Option<RustcFacts> {
    let (dir, name) = cache_dir_of(file)?;
    let text = dir.read(name, MANIFEST_LIMIT).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    if v["rustc"] != serde_json::json!(rustc.to_string_lossy())
        || v["toolchain"] != serde_json::json!(std::env::var("RUSTUP_TOOLCHAIN").ok())
    {
        return None;
    }
    serde_json::from_value(v["facts"].clone()).ok()
}

fn remember_rustc_facts(file: &Path, rustc: &Path, facts: &RustcFacts) {
    if remembered_in(file, rustc).as_ref() == Some(facts) {
        return;
    }
    let v = serde_json::json!({
        "rustc": rustc.to_string_lossy(),
        "toolchain": std::env::var("RUSTUP_TOOLCHAIN").ok(),
        "facts": facts,
    });
    if let Some((dir, name)) = cache_dir_of(file) {
        let _ = dir.write_atomic(
            name,
            v.to_string().as_bytes(),
            crate::base::beneath::FileMode::New(0o644),
        );
    }
}

/// Runs `rustc -vV` once per process.
pub fn rustc_facts(rustc: &Path) -> Result<RustcFacts, Failure> {
    static FACTS: OnceLock<Result<RustcFacts, String>> = OnceLock::new();
    FACTS
        .get_or_init(|| {
            let out = Command::new(rustc)
                .arg("-vV")
                .output()
                .map_err(|e| format!("could not run `{} -vV`: {e}", rustc.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "`{} -vV` failed: {}",
                    rustc.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(parse_rustc_vv(&String::from_utf8_lossy(&out.stdout)))
        })
        .clone()
        .map_err(|m| Failure::new(exit_codes::METADATA_FAILED, m))
}

pub fn parse_rustc_vv(text: &str) -> RustcFacts {
    let mut facts = RustcFacts {
        release: String::new(),
        commit_hash: String::new(),
        host: String::new(),
    };
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(':') {
            let v = v.trim().to_string();
            match k.trim() {
                "release" => facts.release = v,
                "commit-hash" => facts.commit_hash = v,
                "host" => facts.host = v,
                _ => {}
            }
        }
    }
    facts
}

/// A package whose sources live on this machine (workspace member or path dependency).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalPackage {
    pub id: String,
    pub name: String,
    pub version: String,
    pub root: PathBuf,
    pub manifest_path: PathBuf,
    pub has_build_script: bool,
}

/// What `cargo metadata` told us, reduced to what cargo mcp-dev needs (this is what is cached).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolved {
    pub cache_version: u32,
    pub workspace_root: PathBuf,
    pub target_dir: PathBuf,
    pub lockfile: PathBuf,
    pub package_id: String,
    pub package_name: String,
    pub package_version: String,
    pub manifest_path: PathBuf,
    pub package_root: PathBuf,
    pub bins: Vec<String>,
    /// The package's `default-run` (what `cargo run` picks among several bins).
    #[serde(default)]
    pub default_run: Option<String>,
    pub has_lib: bool,
    pub has_build_script: bool,
    /// `package.metadata` of the server package (holds `mcp-dev`).
    pub metadata: serde_json::Value,
    /// The server package and every local package it depends on (watched; path deps hashed).
    pub local_packages: Vec<LocalPackage>,
    /// Every package reachable from the server, excluding the server itself (normal and build
    /// edges, dev excluded): the same type identity records list.
    pub dependencies: Vec<DependencyEntry>,
    /// Files whose digests key the cache (manifests, lockfile, cargo config files).
    pub key_files: Vec<PathBuf>,
    pub key_digest: String,
}

/// The selected server: package, bin, configuration and target directory.
#[derive(Debug, Clone)]
pub struct ServerTarget {
    pub resolved: Resolved,
    pub bin: String,
    pub label: String,
    pub config: LoadedConfig,
    /// True when `cargo metadata` was not run because the cache matched.
    pub from_cache: bool,
    /// Set when the package has several bins and one was picked by a default (not `--bin`, not
    /// `bin` in the config): the sentence every command prints about that choice.
    pub bin_choice: Option<String>,
}

impl ServerTarget {
    pub fn layout(&self) -> crate::base::paths::Layout {
        crate::base::paths::Layout::new(&self.resolved.target_dir)
    }
    /// A path relative to the workspace root when it lies inside it (for humans).
    pub fn display_path(&self, p: &Path) -> String {
        p.strip_prefix(&self.resolved.workspace_root)
            .unwrap_or(p)
            .display()
            .to_string()
    }
}

/// Resolves the server package for these cargo flags, from the cache when it is current.
pub fn resolve(cargo: &Path, host: &str, args: &CargoSelection) -> Result<ServerTarget, Failure> {
    let manifest = locate_manifest(args.manifest_path.as_deref())?;
    let cache_file = cache_file_for(&manifest, args, host);
    let (resolved, from_cache) = match read_cache(&cache_file) {
        Some(r) => (r, true),
        None => {
            let r = run_metadata(cargo, host, &manifest, args)?;
            write_cache(&cache_file, &r);
            (r, false)
        }
    };
    select(resolved, args, from_cache)
}

fn select(
    resolved: Resolved,
    args: &CargoSelection,
    from_cache: bool,
) -> Result<ServerTarget, Failure> {
    let config = LoadedConfig::from_package_metadata(&resolved.metadata)
        .map_err(|e| config_failure(&e, &resolved.manifest_path))?;
    let name = &resolved.package_name;
    let mut bin_choice = None;
    let bin = if let Some(b) = &args.bin {
        if !resolved.bins.contains(b) {
            return Err(Failure::error(format!(
                "no bin target named `{b}` in package `{name}`{}",
                available(&resolved.bins)
            )));
        }
        b.clone()
    } else if let Some(b) = &config.config.bin {
        if !resolved.bins.contains(b) {
            return Err(Failure::error(format!(
                "[package.metadata.mcp-dev] bin = \"{b}\", but package `{name}` has no such bin target{}",
                available(&resolved.bins)
            )));
        }
        b.clone()
    } else {
        match resolved.bins.as_slice() {
            [one] => one.clone(),
            [] if resolved.has_lib => {
                return Err(Failure::error(format!(
                    "package `{name}` is a library-only package: an MCP server over stdio needs a binary target (src/main.rs or [[bin]])"
                )));
            }
            [] => {
                return Err(Failure::error(format!(
                    "package `{name}` has no binary target"
                )));
            }
            many => match resolved.default_run.as_ref().filter(|d| many.contains(d)) {
                // What `cargo run` would pick: say so, since a guess is easy to miss.
                Some(d) => {
                    bin_choice = Some(several_bins_sentence(name, many, Some(d)));
                    d.clone()
                }
                None => {
                    return Err(Failure::error(several_bins_sentence(name, many, None)));
                }
            },
        }
    };
    let label = config.config.label.clone().unwrap_or_else(|| bin.clone());
    let mut resolved = resolved;
    if let Some(td) = &args.target_dir {
        resolved.target_dir = absolute(td);
    }
    Ok(ServerTarget {
        resolved,
        bin,
        label,
        config,
        from_cache,
        bin_choice,
    })
}

/// A configuration error as one sentence that names the manifest and the line of the key.
pub fn config_failure(e: &crate::identity::config::ConfigError, manifest: &Path) -> Failure {
    let line = crate::base::beneath::followed::read_to_string(manifest, MANIFEST_LIMIT)
        .ok()
        .and_then(|text| crate::identity::config::locate_line(&text, e.path()));
    let location = match line {
        Some(l) => format!("{}:{l}", manifest.display()),
        None => manifest.display().to_string(),
    };
    Failure::error(e.render(Some(&location)))
}

/// The one sentence `run`, `init` and every other command say about a package with several
/// bins: which one they use (cargo's `default-run`) or that they cannot choose.
pub fn several_bins_sentence(package: &str, bins: &[String], chosen: Option<&str>) -> String {
    let how = "pass --bin NAME, or set bin = \"NAME\" in [package.metadata.mcp-dev]";
    match chosen {
        Some(d) => format!(
            "package `{package}` has several binaries ({}): using `{d}` (its `default-run`); to choose another, {how}",
            bins.join(", ")
        ),
        None => format!(
            "package `{package}` has several binaries ({}) and no `default-run`: {how}",
            bins.join(", ")
        ),
    }
}

fn available(bins: &[String]) -> String {
    if bins.is_empty() {
        String::new()
    } else {
        format!(" (available: {})", bins.join(", "))
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}

/// The manifest cargo would use: `--manifest-path`, else the nearest Cargo.toml upwards.
pub fn locate_manifest(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    let found = locate_manifest_any(explicit)?;
    // cargo metadata (and every path in its JSON) is UTF-8: refuse clearly instead of panicking
    // later (issue 12).
    if found.to_str().is_none() {
        return Err(Failure::new(
            exit_codes::METADATA_FAILED,
            format!(
                "the path `{}` is not valid UTF-8; cargo metadata and cargo mcp-dev need UTF-8 paths (rename the directory)",
                found.display()
            ),
        ));
    }
    Ok(found)
}

fn locate_manifest_any(explicit: Option<&Path>) -> Result<PathBuf, Failure> {
    if let Some(p) = explicit {
        let abs = absolute(p);
        if abs.file_name().map(|n| n != "Cargo.toml").unwrap_or(true) {
            return Err(Failure::error(format!(
                "the manifest-path must be a path to a Cargo.toml file: `{}`",
                p.display()
            )));
        }
        if !crate::base::beneath::followed::is_file(&abs) {
            return Err(Failure::new(
                exit_codes::METADATA_FAILED,
                format!("manifest path `{}` does not exist", p.display()),
            ));
        }
        return Ok(abs);
    }
    let cwd = std::env::current_dir()?;
    cwd.ancestors()
        .map(|d| d.join("Cargo.toml"))
        .find(|p| crate::base::beneath::followed::is_file(p))
        .ok_or_else(|| {
            Failure::new(
                exit_codes::METADATA_FAILED,
                format!(
                    "could not find `Cargo.toml` in `{}` or any parent directory (use --manifest-path)",
                    cwd.display()
                ),
            )
        })
}

fn cache_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CARGO_MCP_DEV_HOME") {
        return PathBuf::from(home).join("cache");
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("cargo-mcp-dev");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("cargo-mcp-dev")
}

/// One cache slot per (manifest, resolution-relevant flags, environment).
fn cache_file_for(manifest: &Path, args: &CargoSelection, host: &str) -> PathBuf {
    let env_keys = [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
    ];
    let key = serde_json::json!({
        "manifest": manifest.to_string_lossy(),
        "package": args.package,
        "features": args.features,
        "allFeatures": args.all_features,
        "noDefault": args.no_default_features,
        "target": args.target,
        "host": host,
        "env": env_keys.iter().map(|k| std::env::var(k).ok()).collect::<Vec<_>>(),
    });
    let digest = hashing::sha256_json(&key);
    cache_dir()
        .join("metadata")
        .join(format!("{}.json", &digest["sha256:".len()..][..32]))
}

fn key_digest(files: &[PathBuf]) -> String {
    let mut parts = Vec::new();
    for f in files {
        let content = crate::base::beneath::followed::read_regular(f, MANIFEST_LIMIT).ok();
        parts.push(serde_json::json!([
            f,
            content.map(|c| hashing::sha256_bytes(&c))
        ]));
    }
    hashing::sha256_json(&serde_json::Value::Array(parts))
}

fn read_cache(path: &Path) -> Option<Resolved> {
    let (dir, name) = cache_dir_of(path)?;
    let text = dir.read_to_string(name, MANIFEST_LIMIT).ok()?;
    let r: Resolved = serde_json::from_str(&text).ok()?;
    if r.cache_version != CACHE_VERSION {
        return None;
    }
    // Valid only while every manifest, the lockfile and cargo config files are byte-identical,
    // and no new cargo config file appeared above the workspace.
    let mut files = r.key_files.clone();
    for extra in config_files(&r.workspace_root) {
        if !files.contains(&extra) {
            files.push(extra);
        }
    }
    if key_digest(&files) != r.key_digest {
        return None;
    }
    Some(r)
}

fn write_cache(path: &Path, r: &Resolved) {
    if let (Ok(text), Some((dir, name))) = (serde_json::to_string(r), cache_dir_of(path)) {
        let _ = dir.write_atomic(
            name,
            text.as_bytes(),
            crate::base::beneath::FileMode::New(0o644),
        );
    }
}

/// `.cargo/config(.toml)` files from the workspace root upwards and in CARGO_HOME.
fn config_files(start: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in start.ancestors() {
        for name in ["config.toml", "config"] {
            let p = dir.join(".cargo").join(name);
            if crate::base::beneath::followed::is_file(&p) {
                out.push(p);
            }
        }
    }
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        for name in ["config.toml", "config"] {
            let p = PathBuf::from(&home).join(name);
            if crate::base::beneath::followed::is_file(&p) && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

fn run_metadata(
    cargo: &Path,
    host: &str,
    manifest: &Path,
    args: &CargoSelection,
) -> Result<Resolved, Failure> {
    let mut cmd = MetadataCommand::new();
    cmd.cargo_path(cargo).manifest_path(manifest);
    let mut other: Vec<String> = vec![
        "--filter-platform".into(),
        args.target.clone().unwrap_or_else(|| host.to_string()),
    ];
    other.extend(args.resolution_flags());
    cmd.other_options(other);
    let metadata = cmd.exec().map_err(|e| {
        Failure::new(
            exit_codes::METADATA_FAILED,
            format!("cargo metadata failed: {}", metadata_error(&e)),
        )
    })?;
    reduce(&metadata, manifest, args.package.as_deref())
}

fn metadata_error(e: &cargo_metadata::Error) -> String {
    match e {
        cargo_metadata::Error::CargoMetadata { stderr } => stderr.trim().to_string(),
        other => other.to_string(),
    }
}

/// Reduces cargo's metadata to [`Resolved`]: selects the package and walks its graph.
pub fn reduce(
    metadata: &Metadata,
    manifest: &Path,
    package: Option<&str>,
) -> Result<Resolved, Failure> {
    let pkg = select_package(metadata, manifest, package)?;
    let by_id: BTreeMap<&PackageId, &cargo_metadata::Package> =
        metadata.packages.iter().map(|p| (&p.id, p)).collect();
    let resolve = metadata.resolve.as_ref().ok_or_else(|| {
        Failure::new(
            exit_codes::METADATA_FAILED,
            "cargo metadata returned no dependency graph",
        )
    })?;
    let nodes: BTreeMap<&PackageId, &cargo_metadata::Node> =
        resolve.nodes.iter().map(|n| (&n.id, n)).collect();
    let lockfile = metadata.workspace_root.as_std_path().join("Cargo.lock");
    let checksums = lock_checksums(&lockfile);

    // Breadth-first over normal and build edges (dev-dependencies never reach the server binary).
    let mut seen: BTreeSet<&PackageId> = BTreeSet::new();
    let mut queue = VecDeque::from([&pkg.id]);
    seen.insert(&pkg.id);
    while let Some(id) = queue.pop_front() {
        if let Some(node) = nodes.get(id) {
            for dep in &node.deps {
                let used = dep
                    .dep_kinds
                    .iter()
                    .any(|k| matches!(k.kind, DependencyKind::Normal | DependencyKind::Build));
                if used && seen.insert(&dep.pkg) {
                    queue.push_back(&dep.pkg);
                }
            }
        }
    }
    let mut local_packages = Vec::new();
    let mut dependencies = Vec::new();
    for id in &seen {
        let Some(p) = by_id.get(id) else { continue };
        let root = p
            .manifest_path
            .parent()
            .map(|d| d.as_std_path().to_path_buf())
            .unwrap_or_default();
        let has_build_script = p
            .targets
            .iter()
            .any(|t| t.kind.contains(&TargetKind::CustomBuild));
        if p.source.is_none() {
            local_packages.push(LocalPackage {
                id: p.id.repr.clone(),
                name: p.name.to_string(),
                version: p.version.to_string(),
                root: root.clone(),
                manifest_path: p.manifest_path.as_std_path().to_path_buf(),
                has_build_script,
            });
        }
        if *id == &pkg.id {
            continue;
        }
        let source = p.source.as_ref().map(|s| s.repr.clone());
        let features = nodes
            .get(id)
            .map(|n| n.features.iter().map(|f| f.to_string()).collect())
            .unwrap_or_default();
        dependencies.push(DependencyEntry {
            id: p.id.repr.clone(),
            name: p.name.to_string(),
            version: p.version.to_string(),
            checksum: checksums
                .get(&(p.name.to_string(), p.version.to_string(), source.clone()))
                .cloned(),
            source,
            features,
            source_digest: None,
            local_root: if p.source.is_none() { Some(root) } else { None },
        });
    }
    dependencies.sort();
    local_packages.sort_by(|a, b| a.id.cmp(&b.id));

    let mut key_files: Vec<PathBuf> = metadata
        .workspace_members
        .iter()
        .filter_map(|id| by_id.get(id))
        .map(|p| p.manifest_path.as_std_path().to_path_buf())
        .chain(local_packages.iter().map(|l| l.manifest_path.clone()))
        .chain([
            metadata.workspace_root.as_std_path().join("Cargo.toml"),
            lockfile.clone(),
        ])
        .collect();
    key_files.sort();
    key_files.dedup();
    let workspace_root = metadata.workspace_root.as_std_path().to_path_buf();
    let mut digest_files = key_files.clone();
    for f in config_files(&workspace_root) {
        if !digest_files.contains(&f) {
            digest_files.push(f);
        }
    }
    let key_digest = key_digest(&digest_files);
    Ok(Resolved {
        cache_version: CACHE_VERSION,
        workspace_root,
        target_dir: metadata.target_directory.as_std_path().to_path_buf(),
        lockfile,
        package_id: pkg.id.repr.clone(),
        package_name: pkg.name.to_string(),
        package_version: pkg.version.to_string(),
        manifest_path: pkg.manifest_path.as_std_path().to_path_buf(),
        package_root: pkg
            .manifest_path
            .parent()
            .map(|d| d.as_std_path().to_path_buf())
            .unwrap_or_default(),
        bins: pkg
            .targets
            .iter()
            .filter(|t| t.kind.contains(&TargetKind::Bin))
            .map(|t| t.name.clone())
            .collect(),
        default_run: pkg.default_run.clone(),
        has_lib: pkg.targets.iter().any(|t| {
            t.kind.iter().any(|k| {
                matches!(
                    k,
                    TargetKind::Lib
                        | TargetKind::RLib
                        | TargetKind::DyLib
                        | TargetKind::CDyLib
                        | TargetKind::StaticLib
                        | TargetKind::ProcMacro
                )
            })
        }),
        has_build_script: pkg
            .targets
            .iter()
            .any(|t| t.kind.contains(&TargetKind::CustomBuild)),
        metadata: pkg.metadata.clone(),
        local_packages,
        dependencies,
        key_files,
        key_digest,
    })
}

fn select_package<'m>(
    metadata: &'m Metadata,
    manifest: &Path,
    spec: Option<&str>,
) -> Result<&'m cargo_metadata::Package, Failure> {
    let members: Vec<&cargo_metadata::Package> = metadata
        .packages
        .iter()
        .filter(|p| metadata.workspace_members.contains(&p.id))
        .collect();
    if let Some(spec) = spec {
        let (name, version) = spec
            .split_once('@')
            .map(|(n, v)| (n, Some(v)))
            .unwrap_or((spec, None));
        return members
            .iter()
            .copied()
            .find(|p| {
                p.name.as_str() == name
                    && version.map(|v| p.version.to_string() == v).unwrap_or(true)
            })
            .ok_or_else(|| {
                Failure::new(
                    exit_codes::METADATA_FAILED,
                    format!(
                        "package `{spec}` is not a member of the workspace (members: {})",
                        members
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            });
    }
    if let Some(p) = members
        .iter()
        .copied()
        .find(|p| p.manifest_path.as_std_path() == manifest)
    {
        return Ok(p);
    }
    let with_bins: Vec<_> = members
        .iter()
        .copied()
        .filter(|p| p.targets.iter().any(|t| t.kind.contains(&TargetKind::Bin)))
        .collect();
    match with_bins.as_slice() {
        [one] => Ok(one),
        [] => Err(Failure::error(
            "no package in this workspace has a binary target",
        )),
        many => Err(Failure::error(format!(
            "this is a virtual workspace with several server candidates ({}): pass -p/--package",
            many.iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Checksums of registry packages from Cargo.lock, keyed on (name, version, source).
fn lock_checksums(lockfile: &Path) -> BTreeMap<(String, String, Option<String>), String> {
    #[derive(Deserialize)]
    struct Lock {
        #[serde(default)]
        package: Vec<LockPackage>,
    }
    #[derive(Deserialize)]
    struct LockPackage {
        name: String,
        version: String,
        source: Option<String>,
        checksum: Option<String>,
    }
    let Ok(text) = crate::base::beneath::followed::read_to_string(lockfile, MANIFEST_LIMIT) else {
        return BTreeMap::new();
    };
    let Ok(lock) = toml::from_str::<Lock>(&text) else {
        return BTreeMap::new();
    };
    lock.package
        .into_iter()
        .filter_map(|p| p.checksum.map(|c| ((p.name, p.version, p.source), c)))
        .collect()
}

/// Git dependencies whose lockfile source does not pin a revision (`#<commit>`).
pub fn unpinned_git_dependencies(deps: &[DependencyEntry]) -> Vec<String> {
    deps.iter()
        .filter(|d| {
            d.source
                .as_deref()
                .map(|s| s.starts_with("git+") && !s.contains('#'))
                .unwrap_or(false)
        })
        .map(|d| format!("{} {}", d.name, d.version))
        .collect()
}

#[cfg(test)]
mod tests {

    #[test]
    fn remembered_rustc_facts_are_only_for_the_same_rustc() {
        use super::*;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rustc-facts.json");
        let rustc = Path::new("/opt/rust/bin/rustc");
        assert_eq!(remembered_in(&file, rustc), None, "nothing remembered yet");
        let facts = RustcFacts {
            release: "1.95.0".into(),
            commit_hash: "abc".into(),
            host: "x86_64-unknown-linux-gnu".into(),
        };
        remember_rustc_facts(&file, rustc, &facts);
        assert_eq!(remembered_in(&file, rustc), Some(facts.clone()));
        assert_eq!(
            remembered_in(&file, Path::new("/other/rustc")),
            None,
            "another rustc is not guessed from this one's answer"
        );
        std::fs::write(&file, b"{not json").unwrap();
        assert_eq!(
            remembered_in(&file, rustc),
            None,
            "a damaged file is no guess"
        );
    }

    /// Issue 12, low finding "a non-UTF-8 path panics (workspace handling)": a clear error.
    #[test]
    fn non_utf8_manifest_path_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStrExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(std::ffi::OsStr::from_bytes(b"proj-\xff"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"x\"\n").unwrap();
        let e = locate_manifest(Some(&dir.join("Cargo.toml"))).unwrap_err();
        assert!(e.message.contains("not valid UTF-8"), "{}", e.message);
        let _ = cache_file_for(&dir.join("Cargo.toml"), &CargoSelection::default(), "h");
    }

    use super::*;

    #[test]
    fn parses_rustc_vv() {
        let f = parse_rustc_vv(
            "rustc 1.95.0 (59807616e 2026-04-14)\nbinary: rustc\ncommit-hash: 59807616e\ncommit-date: 2026-04-14\nhost: x86_64-unknown-linux-gnu\nrelease: 1.95.0\nLLVM version: 20.1\n",
        );
        assert_eq!(f.release, "1.95.0");
        assert_eq!(f.commit_hash, "59807616e");
        assert_eq!(f.host, "x86_64-unknown-linux-gnu");
    }

    #[test]
    fn unpinned_git_detected() {
        let dep = |s: &str| DependencyEntry {
            id: "x".into(),
            name: "x".into(),
            version: "1.0.0".into(),
            source: Some(s.into()),
            checksum: None,
            features: vec![],
            source_digest: None,
            local_root: None,
        };
        assert_eq!(
            unpinned_git_dependencies(&[dep("git+https://h/r?branch=main#abc123")]).len(),
            0
        );
        assert_eq!(
            unpinned_git_dependencies(&[dep("git+https://h/r?branch=main")]).len(),
            1
        );
        assert_eq!(
            unpinned_git_dependencies(&[dep(
                "registry+https://github.com/rust-lang/crates.io-index"
            )])
            .len(),
            0
        );
    }
}
