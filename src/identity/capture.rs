//! Identity capture: gathers the facts [`crate::identity::fingerprint`] hashes (I/O lives here).
//!
//! Reads files (lockfile, extra inputs, wrapper, path-dependency sources, its own executable),
//! env values (only to digest them) and stores the executable via [`crate::identity::store`]. It never
//! invokes cargo and never decides whether a difference matters.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::base::beneath::Beneath;
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

    // The package directory, held for the whole capture: the extra inputs below it are reached
    // from it (see `extra_input`).
    let package = Beneath::open_following(&r.package_root).map_err(io_err(&r.package_root))?;
    let mut extra_inputs = Vec::new();
    for rel in &cfg.extra_inputs {
        let input = extra_input(&package, rel)?;
        if input.kind == "missing" {
            problems.push(CaptureProblem::ExtraInputMissing(rel.clone()));
        }
        extra_inputs.push(input);
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

/// The digest of one declared extra input, `rel` below the held package directory `package`:
/// the directories between the package and the input are opened from it, no link followed (a
/// link planted at one, `data -> ~/.ssh` for `data/fixtures`, is refused: capture fails and
/// says so); a directory is walked and its files read beneath its own held handle. What the
/// human declared is followed as cargo would: a link at the input's own name, and a path that
/// leaves the package (`../shared/data`).
fn extra_input(package: &Beneath, rel: &str) -> Result<ExtraInput, CaptureError> {
    let p = package.root().join(rel);
    let entry = |kind: &str, (sha256, files): (String, usize)| ExtraInput {
        path: rel.to_string(),
        kind: kind.into(),
        sha256,
        files,
    };
    let below = Path::new(rel)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    let meta = if below {
        match package.metadata(Path::new(rel)) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&p)(e)),
        }
    } else {
        None
    };
    let held = |m: &crate::base::beneath::Meta| below && !m.is_symlink();
    Ok(match meta {
        Some(m) if held(&m) && m.is_dir() => {
            let dir = package.sub(Path::new(rel), false).map_err(io_err(&p))?;
            entry("dir", tree_digest_in(&dir, false).map_err(io_err(&p))?)
        }
        Some(m) if held(&m) && m.is_file() => {
            let file = package.open_read(Path::new(rel)).map_err(io_err(&p))?;
            let (sha256, _) = hashing::sha256_reader(file).map_err(io_err(&p))?;
            entry("file", (sha256, 1))
        }
        _ if crate::base::beneath::followed::is_dir(&p) => {
            entry("dir", tree_digest(&p, false).map_err(io_err(&p))?)
        }
        _ if crate::base::beneath::followed::is_file(&p) => {
            let (sha256, _) = hashing::sha256_file(&p).map_err(io_err(&p))?;
            entry("file", (sha256, 1))
        }
        _ => entry("missing", ("missing".into(), 0)),
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
/// Returns (digest, file count). `root` is the caller's path (a path dependency's directory, a
/// link at it followed); everything below it is reached from it held open ([`tree_digest_in`]).
pub fn tree_digest(root: &Path, package_sources: bool) -> io::Result<(String, usize)> {
    tree_digest_in(&Beneath::open_following(root)?, package_sources)
}

/// [`tree_digest`] of the directory held by `root`: each directory is listed, and each file
/// read, from the held handle, no link followed on the way (a directory swapped for a link
/// while it is walked is refused: an error, not a digest of what the link points to). A link in
/// the tree is hashed by its text and, when it leads to a file, by that file's content (read
/// following it: what the server reads through it). Names are visited in byte order, depth
/// first, as `walkdir` sorted by file name did: the digests are the same as before.
pub fn tree_digest_in(root: &Beneath, package_sources: bool) -> io::Result<(String, usize)> {
    let mut hasher = Sha256::new();
    let mut files = 0usize;
    digest_dir(
        root,
        Path::new(""),
        package_sources,
        &mut hasher,
        &mut files,
    )?;
    Ok((hashing::prefixed(&hasher.finalize()), files))
}

fn digest_dir(
    root: &Beneath,
    dir: &Path,
    package_sources: bool,
    hasher: &mut Sha256,
    files: &mut usize,
) -> io::Result<()> {
    use crate::base::beneath::Kind;
    let mut entries = root.list(dir)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for entry in entries {
        let rel = dir.join(&entry.name);
        if entry.kind == Kind::Dir {
            let name = entry.name.to_string_lossy();
            let skipped = package_sources
                && (name == "target"
                    || name.starts_with('.')
                    || crate::base::beneath::followed::is_file(
                        &root.root().join(&rel).join("Cargo.toml"),
                    ));
            if !skipped {
                digest_dir(root, &rel, package_sources, hasher, files)?;
            }
            continue;
        }
        hasher.update(rel.as_os_str().as_encoded_bytes());
        hasher.update([0u8]);
        match entry.kind {
            Kind::Symlink => {
                let target = root.read_link(&rel)?;
                hasher.update(b"symlink\0");
                hasher.update(target.as_os_str().as_encoded_bytes());
                // What the server reads through a link to a file is its content: hashed too
                // (red-team round 14: the file behind a link could change with the digest
                // unchanged). A link to a directory is not walked (no loops); a dangling one is
                // its text alone.
                let through = root.root().join(&rel);
                if crate::base::beneath::followed::is_file(&through) {
                    let (d, len) = hashing::sha256_file(&through)?;
                    hasher.update(b"\0->");
                    hasher.update(len.to_le_bytes());
                    hasher.update(d.as_bytes());
                }
            }
            Kind::File => {
                let (d, len) = hashing::sha256_reader(root.open_read(&rel)?)?;
                hasher.update(len.to_le_bytes());
                hasher.update(d.as_bytes());
            }
            // A named pipe, a socket or a device: never opened (reading a FIFO blocks forever,
            // a device may never end); counted by its name and kind.
            _ => hasher.update(b"special\0"),
        }
        hasher.update([0u8]);
        *files += 1;
    }
    Ok(())
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

    /// Issue 34, point 5: capture holds the package directory and reaches each extra input
    /// from it. A link planted at a directory between the package and a declared input (not
    /// the input's own name) after the package was opened is refused, not followed: before, the
    /// input was hashed through the link (whatever it pointed to, e.g. outside the project).
    /// A link at the input's own name (the human declared it) is still followed.
    #[test]
    fn a_link_planted_between_the_package_and_an_extra_input_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let pkg = d.path().join("pkg");
        std::fs::create_dir_all(pkg.join("data/fixtures")).unwrap();
        std::fs::write(pkg.join("data/fixtures/a.json"), "{}").unwrap();
        let package = Beneath::open(&pkg).unwrap();
        let held = extra_input(&package, "data/fixtures").unwrap();
        assert_eq!((held.kind.as_str(), held.files), ("dir", 1));
        assert_eq!(
            held.sha256,
            tree_digest(&pkg.join("data/fixtures"), false).unwrap().0
        );
        let outside = d.path().join("outside");
        std::fs::create_dir_all(outside.join("fixtures")).unwrap();
        std::fs::write(outside.join("fixtures/a.json"), "{\"other\": 1}").unwrap();
        std::fs::rename(pkg.join("data"), pkg.join("data.old")).unwrap();
        std::os::unix::fs::symlink(&outside, pkg.join("data")).unwrap();
        let e = extra_input(&package, "data/fixtures").unwrap_err();
        assert!(e.to_string().contains("not a directory of ours"), "{e}");
        assert!(extra_input(&package, "data/fixtures/a.json").is_err());
        // The input's own name as a link: followed, as declared.
        std::os::unix::fs::symlink(outside.join("fixtures"), pkg.join("linked")).unwrap();
        let linked = extra_input(&package, "linked").unwrap();
        assert_eq!((linked.kind.as_str(), linked.files), ("dir", 1));
        assert_eq!(extra_input(&package, "gone").unwrap().kind, "missing");
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
