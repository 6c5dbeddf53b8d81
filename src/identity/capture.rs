//! Identity capture: gathers the facts [`crate::identity::fingerprint`] hashes (I/O lives here).
//!
//! Reads files (lockfile, extra inputs, wrapper, path-dependency sources, its own executable),
//! env values (only to digest them) and stores the executable via [`crate::identity::store`]. It never
//! invokes cargo and never decides whether a difference matters.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use walkdir::WalkDir;

use crate::base::hashing;
use crate::identity::build::{CargoSelection, profile_name};
use crate::identity::fingerprint::{
    self, DependencyEntry, EnvDigest, Executable, ExtraInput, FileDigest, IdentityInputs,
    IdentityRecord, Launch, Launcher, PackageRef, Runtime, Wrapper,
};
use crate::identity::store::{Store, StoreError};
use crate::identity::workspace::{RustcFacts, ServerTarget};

/// Something that keeps identity from being fully captured (`check` fails on each; `build`
/// reports them as warnings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureProblem {
    NoLockfile,
    EnvUnset(String),
    ExtraInputMissing(String),
    WrapperMissing(String),
    UnpinnedGit(Vec<String>),
}

impl std::fmt::Display for CaptureProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureProblem::NoLockfile => write!(
                f,
                "no Cargo.lock: the dependency versions that will run are not pinned (run `cargo generate-lockfile` and commit it)"
            ),
            CaptureProblem::EnvUnset(n) => write!(f, "declared identity env var `{n}` is not set"),
            CaptureProblem::ExtraInputMissing(p) => {
                write!(f, "declared extra input `{p}` does not exist")
            }
            CaptureProblem::WrapperMissing(p) => write!(
                f,
                "configured wrapper `{p}` does not exist or is not executable"
            ),
            CaptureProblem::UnpinnedGit(d) => write!(
                f,
                "git dependencies without a pinned revision in Cargo.lock: {}",
                d.join(", ")
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("could not read `{path}`: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// What identity capture needs besides the built executable.
pub struct CaptureContext<'a> {
    pub target: &'a ServerTarget,
    pub args: &'a CargoSelection,
    pub rustc: &'a RustcFacts,
    pub server_args: &'a [String],
    pub cwd: PathBuf,
}

pub struct Captured {
    pub record: IdentityRecord,
    pub problems: Vec<CaptureProblem>,
}

/// Stores the executable (retrying once if it moved during the copy) and builds the record.
pub fn capture(
    ctx: &CaptureContext<'_>,
    executable: &Path,
    store: &Store,
) -> Result<Captured, CaptureError> {
    let stored = match store.capture(executable) {
        Err(StoreError::ChangedDuringCapture { .. }) => store.capture(executable)?,
        other => other?,
    };
    let t = ctx.target;
    let r = &t.resolved;
    let cfg = &t.config.config;
    let mut problems = Vec::new();

    let lockfile = if crate::base::beneath::followed::is_file(&r.lockfile) {
        let (sha256, _) = hashing::sha256_file(&r.lockfile).map_err(io_err(&r.lockfile))?;
        Some(FileDigest {
            path: t.display_path(&r.lockfile),
            sha256,
        })
    } else {
        problems.push(CaptureProblem::NoLockfile);
        None
    };

    let mut dependencies = Vec::with_capacity(r.dependencies.len());
    for d in &r.dependencies {
        let source_digest = match &d.local_root {
            Some(root) => Some(tree_digest(root, true).map_err(io_err(root))?.0),
            None => None,
        };
        dependencies.push(DependencyEntry {
            source_digest,
            local_root: None,
            ..d.clone()
        });
    }
    let unpinned = crate::identity::workspace::unpinned_git_dependencies(&r.dependencies);
    if !unpinned.is_empty() {
        problems.push(CaptureProblem::UnpinnedGit(unpinned));
    }

    // Keyed with the audit key (issue 12: an unkeyed digest lets a reader of the identity file
    // test guesses of a secret value). Loaded only when variables are declared.
    let env_key = if cfg.env.is_empty() {
        None
    } else {
        crate::audit::KeyStore::from_env()
            .and_then(|k| k.load_or_create_key())
            .ok()
    };
    let env: Vec<EnvDigest> = cfg
        .env
        .iter()
        .map(|name| {
            let value = std::env::var(name).ok();
            if value.is_none() {
                problems.push(CaptureProblem::EnvUnset(name.clone()));
            }
            EnvDigest {
                name: name.clone(),
                sha256: value.map(|v| match &env_key {
                    Some(key) => fingerprint::env_value_mac(key, name, &v),
                    None => fingerprint::ENV_SET_UNKEYED.to_string(),
                }),
            }
        })
        .collect();

    let mut extra_inputs = Vec::new();
    for rel in &cfg.extra_inputs {
        let p = r.package_root.join(rel);
        if crate::base::beneath::followed::is_dir(&p) {
            let (sha256, files) = tree_digest(&p, false).map_err(io_err(&p))?;
            extra_inputs.push(ExtraInput {
                path: rel.clone(),
                kind: "dir".into(),
                sha256,
                files,
            });
        } else if crate::base::beneath::followed::is_file(&p) {
            let (sha256, _) = hashing::sha256_file(&p).map_err(io_err(&p))?;
            extra_inputs.push(ExtraInput {
                path: rel.clone(),
                kind: "file".into(),
                sha256,
                files: 1,
            });
        } else {
            problems.push(CaptureProblem::ExtraInputMissing(rel.clone()));
            extra_inputs.push(ExtraInput {
                path: rel.clone(),
                kind: "missing".into(),
                sha256: "missing".into(),
                files: 0,
            });
        }
    }

    let store_path = stored.store_path.display().to_string();
    let mut argv = Vec::new();
    let wrapper = match &cfg.wrapper {
        Some(rel) => {
            let p = r.package_root.join(rel);
            if is_executable_file(&p) {
                let (sha256, _) = hashing::sha256_file(&p).map_err(io_err(&p))?;
                argv.push(p.display().to_string());
                Some(Wrapper {
                    path: rel.clone(),
                    sha256,
                    starts: store_path.clone(),
                })
            } else {
                problems.push(CaptureProblem::WrapperMissing(rel.clone()));
                None
            }
        }
        None => None,
    };
    argv.push(store_path.clone());
    argv.extend(ctx.server_args.iter().cloned());

    let a = ctx.args;
    let mut features = Vec::new();
    if !a.features.is_empty() {
        features.push(format!("--features={}", a.features.join(",")));
    }
    if a.all_features {
        features.push("--all-features".into());
    }
    if a.no_default_features {
        features.push("--no-default-features".into());
    }
    let cwd_relative = ctx.cwd.strip_prefix(&r.workspace_root).ok().map(|p| {
        if p.as_os_str().is_empty() {
            ".".to_string()
        } else {
            p.display().to_string()
        }
    });

    let inputs = IdentityInputs {
        label: t.label.clone(),
        package: PackageRef {
            id: r.package_id.clone(),
            name: r.package_name.clone(),
            version: r.package_version.clone(),
        },
        bin: t.bin.clone(),
        launch: Launch {
            argv,
            cwd: ctx.cwd.display().to_string(),
            cwd_relative,
        },
        executable: Executable {
            path: t.display_path(executable),
            size: stored.size,
            sha256: stored.sha256,
            store_path,
        },
        lockfile,
        dependencies,
        runtime: Runtime {
            rustc_release: ctx.rustc.release.clone(),
            rustc_commit: ctx.rustc.commit_hash.clone(),
            host: ctx.rustc.host.clone(),
            target: a.target.clone().unwrap_or_else(|| ctx.rustc.host.clone()),
            profile: profile_name(a),
            rustflags: std::env::var("RUSTFLAGS").ok(),
            encoded_rustflags: std::env::var("CARGO_ENCODED_RUSTFLAGS").ok(),
            features,
        },
        config: t.config.raw.clone(),
        // Unknown keys stop every command before capture (see `config`).
        unknown_config_keys: Vec::new(),
        env,
        extra_inputs,
        wrapper,
        launcher: launcher(),
        workspace_root: r.workspace_root.display().to_string(),
        target_dir: r.target_dir.display().to_string(),
        captured_at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
    };
    Ok(Captured {
        record: fingerprint::identity_record(inputs),
        problems,
    })
}

fn io_err(p: &Path) -> impl FnOnce(io::Error) -> CaptureError + '_ {
    move |source| CaptureError::Io {
        path: p.to_path_buf(),
        source,
    }
}

fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    crate::base::beneath::followed::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// cargo-mcp-dev itself: version and the digest of its own executable (computed once).
pub fn launcher() -> Launcher {
    static DIGEST: OnceLock<String> = OnceLock::new();
    let sha256 = DIGEST
        .get_or_init(|| {
            std::env::current_exe()
                .and_then(|p| hashing::sha256_file(&p))
                .map(|(d, _)| d)
                .unwrap_or_else(|e| format!("unavailable: {e}"))
        })
        .clone();
    Launcher {
        name: env!("CARGO_PKG_NAME").into(),
        version: env!("CARGO_PKG_VERSION").into(),
        sha256,
    }
}

/// Digest of a directory tree: sorted relative paths with their contents. With `package_sources`
/// it skips what cargo never compiles from (target dirs, hidden dirs, nested packages).
/// Returns (digest, file count).
pub fn tree_digest(root: &Path, package_sources: bool) -> io::Result<(String, usize)> {
    let mut hasher = Sha256::new();
    let mut files = 0usize;
    let walker = WalkDir::new(root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| {
            if e.depth() == 0 || !e.file_type().is_dir() {
                return true;
            }
            let name = e.file_name().to_string_lossy();
            if !package_sources {
                return true;
            }
            !(name == "target"
                || name.starts_with('.')
                || crate::base::beneath::followed::is_file(&e.path().join("Cargo.toml")))
        });
    for entry in walker {
        let entry = entry.map_err(|e| io::Error::other(e.to_string()))?;
        let ft = entry.file_type();
        if ft.is_dir() {
            continue;
        }
        let rel = entry.path().strip_prefix(root).unwrap_or(entry.path());
        hasher.update(rel.as_os_str().as_encoded_bytes());
        hasher.update([0u8]);
        if ft.is_symlink() {
            let target = crate::base::beneath::followed::read_link(entry.path())?;
            hasher.update(b"symlink\0");
            hasher.update(target.as_os_str().as_encoded_bytes());
            // What the server reads through a link to a file is its content: hashed too (red-team
            // round 14: the file behind a link could change with the digest unchanged). A
            // link to a directory is not walked (no loops); a dangling one is its text alone.
            if crate::base::beneath::followed::is_file(entry.path()) {
                let (d, len) = hashing::sha256_file(entry.path())?;
                hasher.update(b"\0->");
                hasher.update(len.to_le_bytes());
                hasher.update(d.as_bytes());
            }
        } else if ft.is_file() {
            let (d, len) = hashing::sha256_file(entry.path())?;
            hasher.update(len.to_le_bytes());
            hasher.update(d.as_bytes());
        } else {
            // A named pipe, a socket or a device: never opened (reading a FIFO blocks forever,
            // a device may never end); counted by its name and kind.
            hasher.update(b"special\0");
        }
        hasher.update([0u8]);
        files += 1;
    }
    Ok((hashing::prefixed(&hasher.finalize()), files))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Red-team round 14: a link to a file inside a declared directory was hashed by its
    /// target's name only: the data the server reads through it could change (it may live in
    /// `target/` or `/tmp`) with the identity unchanged. Its content counts now; a dangling
    /// link or one to a directory is hashed by its text.
    #[test]
    fn a_link_to_a_file_counts_by_its_content() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let outside = d.path().join("outside.json");
        std::fs::write(&outside, r#"{"mode":"safe"}"#).unwrap();
        std::os::unix::fs::symlink(&outside, data.join("config.json")).unwrap();
        std::os::unix::fs::symlink(d.path().join("nowhere"), data.join("dangling")).unwrap();
        std::os::unix::fs::symlink(d.path(), data.join("loop")).unwrap();
        let (before, n) = tree_digest(&data, false).unwrap();
        assert_eq!(n, 3);
        assert_eq!(tree_digest(&data, false).unwrap().0, before, "stable");
        std::fs::write(&outside, r#"{"mode":"delete-everything"}"#).unwrap();
        let (after, _) = tree_digest(&data, false).unwrap();
        assert_ne!(
            before, after,
            "the data behind the link changed; the digest did not"
        );
    }

    #[test]
    fn tree_digest_tracks_names_and_contents_not_target() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("src")).unwrap();
        std::fs::create_dir_all(d.path().join("target/debug")).unwrap();
        std::fs::write(d.path().join("src/lib.rs"), "pub fn a() {}").unwrap();
        let (a, n) = tree_digest(d.path(), true).unwrap();
        assert_eq!(n, 1);
        std::fs::write(d.path().join("target/debug/junk"), "x").unwrap();
        std::fs::create_dir_all(d.path().join(".git")).unwrap();
        std::fs::write(d.path().join(".git/HEAD"), "x").unwrap();
        assert_eq!(
            tree_digest(d.path(), true).unwrap().0,
            a,
            "target/ and .git are not sources"
        );
        std::fs::write(d.path().join("src/lib.rs"), "pub fn b() {}").unwrap();
        let (b, _) = tree_digest(d.path(), true).unwrap();
        assert_ne!(a, b);
        std::fs::rename(d.path().join("src/lib.rs"), d.path().join("src/other.rs")).unwrap();
        assert_ne!(
            tree_digest(d.path(), true).unwrap().0,
            b,
            "a rename changes the digest"
        );
    }
}

#[cfg(test)]
mod special_file_tests {
    use super::*;

    /// Red-team round 15: a named pipe inside an extra-inputs directory (or a path dependency's
    /// sources), created with `mkfifo` by the agent, is opened for reading by `tree_digest`;
    /// the open blocks until a writer appears, so identity capture (every build of `run`,
    /// `build`, `check`) hangs forever with no message. Links to a FIFO are skipped since round
    /// 14; the FIFO itself is not. It should be hashed by its kind (or refused), not read.
    #[test]
    fn a_fifo_in_extra_inputs_is_not_read() {
        let d = tempfile::tempdir().unwrap();
        let data = d.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("a.json"), "{}").unwrap();
        let fifo = data.join("pipe");
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(st.success());
        let (tx, rx) = std::sync::mpsc::channel();
        let root = data.clone();
        std::thread::spawn(move || {
            let _ = tx.send(tree_digest(&root, false).map(|_| ()));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        if got.is_err() {
            // Unblock the hashing thread before failing.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        assert!(
            got.is_ok(),
            "tree_digest still blocked on the FIFO after 5 s"
        );
    }
}
