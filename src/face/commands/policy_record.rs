//! The accepted-policy record on disk, and what it means for a package now: where the record of
//! a package lives in the user's state directory (outside the project, beside the audit key),
//! reading it (a corrupt, planted or foreign record is refused with the reason and counts as
//! nothing accepted), writing it (atomic, mode 0600, through the file door), and the verdict of
//! the project's policy against it ([`Verdict`]). The rules are `policy::accepted`'s.
//!
//! ```text
//! <state dir>/policy/<H>.json   H = hex SHA-256 of the manifest's canonical path
//! ```
//!
//! Must not touch: the policy's rules, the terminal (callers say what the verdict means).

use std::path::{Path, PathBuf};

use crate::audit::KeyStore;
use crate::base::error::Failure;
use crate::policy::accepted::{self, AcceptedRecord, Terms, Weakening};
use crate::policy::approval::Policy;

/// The largest record read (a record lists tool names: a few KB).
const LARGEST_RECORD: u64 = 1 << 20;

/// The manifest's canonical path, as records name it (as it is when it cannot be resolved: a
/// path spelled another way then finds no record, and nothing counts as accepted).
pub fn package_key(manifest: &Path) -> String {
    // The manifest's directory, canonical, and its own name, not followed: cargo builds the
    // sources beside the name it was given, so a `Cargo.toml` linked to another package's
    // manifest is another package and must not borrow its acceptance (red team, issue 36).
    let name = manifest.file_name().unwrap_or_default();
    let dir = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::base::beneath::followed::canonicalize(dir)
        .map(|d| d.join(name))
        .unwrap_or_else(|_| manifest.to_path_buf())
        .display()
        .to_string()
}

/// Where the record of the package with this manifest lives.
pub fn record_path(keys: &KeyStore, manifest: &Path) -> PathBuf {
    let key = crate::base::hashing::sha256_hex(package_key(manifest).as_bytes());
    keys.dir().join("policy").join(format!("{key}.json"))
}

/// What is accepted for a package.
#[derive(Debug, Clone, Default)]
pub struct Standing {
    /// The record, when there is a valid one.
    pub record: Option<AcceptedRecord>,
    /// Why a file at the record's place was refused (it then counts as nothing accepted).
    pub refused: Option<String>,
    pub path: PathBuf,
}

impl Standing {
    /// The accepted terms: the record's, else the default (every tool gated, per epoch).
    pub fn terms(&self) -> Terms {
        self.record
            .as_ref()
            .map(|r| r.terms.clone())
            .unwrap_or_default()
    }
}

/// Reads the record of the package with this manifest. Never fails: whatever cannot be read or
/// trusted is `refused` (with the reason) and nothing is accepted.
pub fn load(keys: &KeyStore, manifest: &Path) -> Standing {
    let path = record_path(keys, manifest);
    let refuse = |why: String| Standing {
        record: None,
        refused: Some(why),
        path: path.clone(),
    };
    let bytes = match crate::base::beneath::Beneath::parent_of(&path)
        .and_then(|(dir, name)| dir.read(&name, LARGEST_RECORD))
    {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Standing {
                path,
                ..Standing::default()
            };
        }
        Err(e) => return refuse(format!("cannot read it ({e})")),
    };
    let key = match keys.load_key() {
        Ok(k) => k,
        Err(e) => return refuse(format!("no audit key to check its seal ({e})")),
    };
    match AcceptedRecord::open(&bytes, &package_key(manifest), &key) {
        Ok(r) => Standing {
            record: Some(r),
            refused: None,
            path,
        },
        Err(e) => refuse(e.to_string()),
    }
}

/// Writes `record` in place of the package's (atomic, 0600, never through a link).
pub fn store(keys: &KeyStore, manifest: &Path, record: &AcceptedRecord) -> Result<(), Failure> {
    let path = record_path(keys, manifest);
    let dir = path.parent().unwrap_or(keys.dir());
    crate::audit::keys::ensure_private_dir(dir).map_err(|e| Failure::error(e.to_string()))?;
    crate::base::fsutil::write_atomic_with_mode(
        &path,
        &record.to_bytes(),
        crate::base::beneath::FileMode::New(0o600),
    )
    .map_err(|e| {
        Failure::error(format!(
            "cannot write the accepted policy {}: {e}",
            path.display()
        ))
    })
}

/// Seals `terms` as what a human accepted for the package with this manifest (the audit key
/// created if there is none) and writes the record. `logged`: the acceptance is in the audit
/// log already.
pub fn accept(
    keys: &KeyStore,
    manifest: &Path,
    terms: Terms,
    accepted_at_ms: u64,
    logged: bool,
) -> Result<AcceptedRecord, Failure> {
    let key = keys
        .load_or_create_key()
        .map_err(|e| Failure::error(e.to_string()))?;
    let record =
        AcceptedRecord::sealed(&package_key(manifest), terms, accepted_at_ms, logged, &key);
    store(keys, manifest, &record)?;
    Ok(record)
}

/// [`accept`] unless the package has a valid record already (a human's acceptance stands):
/// whether it wrote one.
pub fn accept_unless_recorded(
    keys: &KeyStore,
    manifest: &Path,
    terms: Terms,
    accepted_at_ms: u64,
    logged: bool,
) -> Result<bool, Failure> {
    if load(keys, manifest).record.is_some() {
        return Ok(false);
    }
    accept(keys, manifest, terms, accepted_at_ms, logged).map(|_| true)
}

/// The project's policy against what was accepted.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// What applies: the stricter of the two, per tool.
    pub effective: Terms,
    /// Weakenings `[package.metadata.mcp-dev]` asks for that wait for a human.
    pub from_config: Vec<Weakening>,
    /// Weakenings the flags (`--no-gating`, `--exempt`) add, waiting too.
    pub from_flags: Vec<Weakening>,
}

impl Verdict {
    /// `requested`: the configuration and flags; `config_only`: the configuration alone.
    pub fn of(requested: &Policy, config_only: &Policy, accepted: &Terms) -> Verdict {
        let req = Terms::of(requested);
        let from_config = accepted::weakenings(&Terms::of(config_only), accepted);
        let from_flags = accepted::weakenings(&req, accepted)
            .into_iter()
            .filter(|w| !from_config.contains(w))
            .collect();
        Verdict {
            effective: accepted::meet(&req, accepted),
            from_config,
            from_flags,
        }
    }

    pub fn waits(&self) -> bool {
        !self.from_config.is_empty() || !self.from_flags.is_empty()
    }

    /// One sentence: what waits and the command that confirms it (`command`), sanitized.
    /// Empty when nothing waits.
    pub fn status_line(&self, command: &str) -> String {
        if !self.waits() {
            return String::new();
        }
        let words = |ws: &[Weakening]| {
            ws.iter()
                .map(Weakening::words)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut parts = Vec::new();
        if !self.from_config.is_empty() {
            parts.push(format!("Cargo.toml asks to {}", words(&self.from_config)));
        }
        if !self.from_flags.is_empty() {
            parts.push(format!(
                "the host's `run` flags ask to {}",
                words(&self.from_flags)
            ));
        }
        let line = format!(
            "{}; no human has accepted that, so it stays gated until you run `{command}`",
            parts.join("; ")
        );
        crate::screen::sanitize::line(&line).into_owned()
    }

    /// Every waiting weakening's code (for records and `status --json`).
    pub fn codes(&self) -> Vec<String> {
        self.from_config
            .iter()
            .chain(&self.from_flags)
            .map(Weakening::code)
            .collect()
    }
}
