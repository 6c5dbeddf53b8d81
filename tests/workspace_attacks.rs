//! Attacks through the workspace the agent can write (red-team round 17): a build script's
//! escape sequences, links planted where `init` writes, a half-failed `new`, a non-UTF-8 path,
//! nested noise directories and links out of the workspace in the watched tree, and a build
//! that rewrites its own sources. One test per finding; each failed on the code it was written
//! against.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::fixture::bin;

/// A std-only package written from scratch in its own temp dir (no fixture needed).
struct Pkg {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    home: PathBuf,
}

impl Pkg {
    fn new(name: &str, main_rs: &str) -> Pkg {
        let tmp = tempfile::Builder::new().prefix("rt17-").tempdir().unwrap();
        let root = tmp.path().join(name);
        let home = tmp.path().join("home");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(
            root.join("Cargo.toml"),
            format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2021\"\n"),
        )
        .unwrap();
        std::fs::write(root.join("src/main.rs"), main_rs).unwrap();
        Pkg {
            _tmp: tmp,
            root,
            home,
        }
    }

    fn scratch(&self) -> &Path {
        self._tmp.path()
    }

    fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut cmd = Command::new(bin());
        cmd.args(args).current_dir(&self.root);
        for k in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET_DIR",
            "CARGO_TERM_COLOR",
            "CARGO_MCP_DEV_HOME",
            "RUSTC_WRAPPER",
        ] {
            cmd.env_remove(k);
        }
        cmd.env("CARGO_MCP_DEV_HOME", &self.home)
            .env("CARGO_INCREMENTAL", "0");
        cmd
    }

    fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Output {
        self.command(args).output().expect("run cargo-mcp-dev")
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Finding (build.rs relay): cargo's stderr is relayed to the terminal raw (`status::raw`),
/// as "trusted" text. It is not all cargo's: a build script's `cargo:warning=` lines are
/// printed by cargo verbatim when colour is on (`--color always`, which `run`/`build` pass
/// whenever their own stderr is coloured, i.e. a terminal). The build script is the server's
/// code, written by the agent; here it sets the clipboard (OSC 52) and the window title
/// through the human's terminal. Only SGR colour sequences should get through.
#[test]
fn a_build_scripts_escape_sequences_never_reach_the_terminal() {
    let p = Pkg::new("rt17bs", "fn main() {}\n");
    std::fs::write(
        p.root.join("build.rs"),
        "fn main() { println!(\"cargo:warning=look \\x1b]52;c;cm0gLXJmIH4K\\x07 \\x1b]0;owned\\x07 \\x1b[2K\\x1b[1Agone\"); }\n",
    )
    .unwrap();
    let out = p.run(&["mcp-dev", "build", "--color", "always"]);
    let err = text(&out.stderr);
    assert!(
        err.contains("look"),
        "the build script's warning was not shown at all: {err}"
    );
    for seq in ["\x1b]52;", "\x1b]0;", "\x1b[2K", "\x1b[1A", "\x07"] {
        assert!(
            !err.contains(seq),
            "a build script's {seq:?} reached the terminal raw:\n{}",
            err.escape_debug()
        );
    }
}

/// Finding (init --force follows planted links): `Writer::write` checks `path.exists()` and
/// opens with `truncate`, both following symlinks, then `set_permissions(0o755)` (also
/// following). Anyone who can write the project (the agent) plants `.mcp.json -> ~/somefile`
/// or `mcp-dev/watch.sh -> ~/.ssh/id_ed25519`; the human's `init --force` ("rewrite the
/// generated files") then truncates and overwrites the file outside the package, and makes
/// the second one world-readable and executable. A generated file should be replaced
/// (temporary file + rename, or O_NOFOLLOW like `fsutil::write_atomic`), never written through.
#[test]
fn init_force_never_writes_through_links_planted_in_the_package() {
    use std::os::unix::fs::PermissionsExt;
    let p = Pkg::new("rt17init", "fn main() {}\n");
    let victim = p.scratch().join("victim.txt");
    let secret = p.scratch().join("secret_key");
    std::fs::write(&victim, "precious user data\n").unwrap();
    std::fs::write(&secret, "-----BEGIN KEY-----\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink(&victim, p.root.join(".mcp.json")).unwrap();
    std::fs::create_dir_all(p.root.join("mcp-dev")).unwrap();
    std::os::unix::fs::symlink(&secret, p.root.join("mcp-dev/watch.sh")).unwrap();
    let out = p.run(&["mcp-dev", "init", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious user data\n",
        "init --force overwrote a file outside the package through .mcp.json"
    );
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "-----BEGIN KEY-----\n",
        "init --force overwrote a file outside the package through mcp-dev/watch.sh"
    );
    let mode = std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "init --force chmod-ed a file outside the package"
    );
}

/// Finding (init follows planted directory links): without `--force`, `create_dir_all` and
/// `create_new` follow a directory symlink planted at `.vscode` (or `mcp-dev`, `.cursor`), so
/// `init` creates files in a directory outside the package, e.g. VS Code's *user*
/// configuration (`.vscode -> ~/.config/Code/User`: `mcp.json` there starts the server in
/// every workspace). Generated files should only land inside the package.
#[test]
fn init_refuses_a_linked_directory() {
    let p = Pkg::new("rt17dir", "fn main() {}\n");
    let elsewhere = p.scratch().join("user-config");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, p.root.join(".vscode")).unwrap();
    let out = p.run(&["mcp-dev", "init"]);
    let created: Vec<_> = std::fs::read_dir(&elsewhere)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        created.is_empty(),
        "init wrote {created:?} into {} (outside the package) through the `.vscode` link\n{}",
        elsewhere.display(),
        text(&out.stderr)
    );
}

/// Finding (host config clobbered): a project's `.mcp.json` usually lists other servers
/// too. `init` without `--force` keeps it and adds nothing (the host never sees this server);
/// the only way offered to add it, `--force`, replaces the whole file and silently drops the
/// user's other servers ("overwrote .mcp.json"). The entry should be merged into the
/// existing `mcpServers` object (or the clobbering refused), keeping the other entries.
#[test]
fn init_force_keeps_other_servers_in_the_host_config() {
    let p = Pkg::new("rt17merge", "fn main() {}\n");
    std::fs::write(
        p.root.join(".mcp.json"),
        r#"{"mcpServers":{"github":{"type":"stdio","command":"gh-mcp","args":[]}}}"#,
    )
    .unwrap();
    let out = p.run(&["mcp-dev", "init", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.root.join(".mcp.json")).unwrap()).unwrap();
    assert!(
        doc["mcpServers"]["rt17merge"].is_object(),
        "our server is missing: {doc}"
    );
    assert!(
        doc["mcpServers"]["github"].is_object(),
        "init --force dropped the user's other server from .mcp.json: {doc}"
    );
}

/// Finding (partial state): `new` creates the directory and writes files one by one; a
/// failure part way (here the enclosing repository's `.github` is a file, so the CI workflow
/// cannot be written) leaves a half-written package behind, and running `new` again is
/// refused ("already exists and is not empty"). `new` should remove what it created when it
/// fails (or build in a temporary directory and rename it into place).
#[test]
fn a_failed_new_leaves_no_half_written_package() {
    let tmp = tempfile::Builder::new()
        .prefix("rt17-new-")
        .tempdir()
        .unwrap();
    let repo = tmp.path().join("repo");
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    std::fs::write(repo.join(".github"), "not a directory\n").unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let new = || {
        Command::new(bin())
            .args(["mcp-dev", "new", "--no-build", "rt17new"])
            .current_dir(&repo)
            .env("CARGO_MCP_DEV_HOME", &home)
            .output()
            .unwrap()
    };
    let first = new();
    assert!(!first.status.success(), "expected the first `new` to fail");
    std::fs::remove_file(repo.join(".github")).unwrap();
    let second = new();
    assert!(
        second.status.success(),
        "after a failed `new`, fixing the cause is not enough: {}\n(first run: {})",
        text(&second.stderr),
        text(&first.stderr)
    );
}

/// Finding (non-UTF-8 paths): `new --path` into a directory whose name is not UTF-8 succeeds,
/// but every host snippet carries the path through `display()` (lossy: U+FFFD), so the
/// generated `.mcp.json` runs a Cargo.toml that does not exist. It should refuse with a clear
/// error instead of writing broken host files and saying `ready`.
#[test]
fn new_refuses_a_non_utf8_directory() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tempfile::Builder::new()
        .prefix("rt17-utf8-")
        .tempdir()
        .unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let dir = tmp
        .path()
        .join(std::ffi::OsStr::from_bytes(b"srv-\xff\xfe"));
    let out = Command::new(bin())
        .args(["mcp-dev", "new", "--no-build", "rt17u"])
        .arg("--path")
        .arg(&dir)
        .current_dir(tmp.path())
        .env("CARGO_MCP_DEV_HOME", &home)
        .output()
        .unwrap();
    if !out.status.success() {
        return; // refused: fine
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(".mcp.json")).unwrap()).unwrap();
    let manifest = doc["mcpServers"]["rt17u"]["args"][3]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        Path::new(&manifest).exists(),
        "`new` said ready, but .mcp.json runs `{manifest}`, which does not exist\n{}",
        text(&out.stderr)
    );
}

const STDIN_SERVER: &str = "use std::io::BufRead;\nfn main() { for l in std::io::stdin().lock().lines() { if l.is_err() { break; } } }\n";

/// Starts `run` on `p`, waits (at most 120 s) for `server started`, returns how many inotify
/// watches the supervisor holds then, and the stderr seen so far.
fn watches_of_a_running_session(p: &Pkg) -> (usize, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = p
        .command(&["mcp-dev", "run"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = String::new();
    let mut started = false;
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                started |= l.starts_with("server started");
                seen.push_str(&l);
                seen.push('\n');
                if started {
                    break;
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(_) => break,
        }
    }
    let mut watches = 0;
    if started {
        std::thread::sleep(Duration::from_millis(300));
        for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
            .unwrap()
            .flatten()
        {
            if let Ok(info) = std::fs::read_to_string(fd.path()) {
                watches += info
                    .lines()
                    .filter(|l| l.starts_with("inotify wd:"))
                    .count();
            }
        }
    }
    drop(child.stdin.take()); // ends the session
    let stop = Instant::now() + Duration::from_secs(15);
    while Instant::now() < stop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(started, "the session never started its server:\n{seen}");
    (watches, seen)
}

/// Finding (watch plan): every top-level directory of the package except a few names is
/// watched *recursively*, and the noise filter (`node_modules`, `.git`, `target`, …) only
/// filters events: notify still walks into and adds an inotify watch for every directory
/// below, e.g. `web/node_modules` (a UI beside the server), `examples/x/target`, a vendored
/// repo's `.git`. Tens of thousands of watches, a startup walk of the whole tree (done
/// synchronously before `run` starts, and again after builds), and the inotify limit
/// (ENOSPC, then no watching at all). Noise directories should not be descended into.
#[test]
fn nested_noise_directories_are_neither_walked_nor_watched() {
    let p = Pkg::new("rt17noise", STDIN_SERVER);
    let nm = p.root.join("web/node_modules");
    for i in 0..400 {
        std::fs::create_dir_all(nm.join(format!("pkg{i}/lib"))).unwrap();
    }
    std::fs::write(p.root.join("web/app.ts"), "export {}\n").unwrap();
    let (watches, seen) = watches_of_a_running_session(&p);
    assert!(
        watches < 100,
        "the supervisor holds {watches} inotify watches, one per directory under web/node_modules (800 there)\n{seen}"
    );
}

/// Finding (watch plan): notify's recursive watch follows symlinks (its default), so a link
/// in a watched directory to a tree outside the workspace (`data -> /srv/dataset`,
/// `docs -> ~/notes`, or `/`) is walked and watched in full, and changes out there rebuild
/// the server. Links out of the workspace should not be followed (notify
/// `Config::with_follow_symlinks(false)`, or a filter), or at least not recursively.
#[test]
fn a_link_out_of_the_workspace_is_not_followed() {
    let p = Pkg::new("rt17link", STDIN_SERVER);
    let outside = p.scratch().join("outside-tree");
    for i in 0..300 {
        std::fs::create_dir_all(outside.join(format!("d{i}"))).unwrap();
    }
    std::os::unix::fs::symlink(&outside, p.root.join("data")).unwrap();
    let (watches, seen) = watches_of_a_running_session(&p);
    assert!(
        watches < 100,
        "the supervisor holds {watches} inotify watches: it walked the 300 directories behind the `data` link, outside the workspace\n{seen}"
    );
}

/// Finding (rebuild storm): a build script that writes a generated source into the package
/// (`src/generated.rs`, the prost/bindgen "out_dir = src" pattern) without
/// `rerun-if-changed` makes every build trigger the next one, forever: the watcher sees the
/// build's own write, the session builds again, cargo reruns the build script (a package
/// file changed), which writes the file again. Same bytes every time, so every build is
/// "unchanged", but a core stays busy and stderr fills with status lines. Changes made by the
/// supervisor's own build (or whose content is unchanged since the last build) should not
/// queue another build.
#[test]
fn a_build_that_rewrites_its_sources_does_not_rebuild_forever() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let p = Pkg::new(
        "rt17storm",
        "include!(\"generated.rs\");\nuse std::io::BufRead;\nfn main() { let _ = GENERATED; for l in std::io::stdin().lock().lines() { if l.is_err() { break; } } }\n",
    );
    std::fs::write(
        p.root.join("build.rs"),
        "fn main() { std::fs::write(\"src/generated.rs\", \"pub const GENERATED: u32 = 1;\\n\").unwrap(); }\n",
    )
    .unwrap();
    let mut child = p
        .command(&["mcp-dev", "run"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    let mut started_at = None;
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        if let Some(t) = started_at
            && Instant::now() > t + Duration::from_secs(12)
        {
            break;
        }
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            if l.starts_with("server started") && started_at.is_none() {
                started_at = Some(Instant::now());
            }
            seen.push_str(&l);
            seen.push('\n');
        }
    }
    drop(child.stdin.take());
    let stop = Instant::now() + Duration::from_secs(15);
    while Instant::now() < stop && child.try_wait().ok().flatten().is_none() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(started_at.is_some(), "never started:\n{seen}");
    let builds = seen
        .lines()
        .filter(|l| l.starts_with("build complete"))
        .count();
    assert!(
        builds <= 3,
        "{builds} builds in the 12 s after the server started, with nobody editing anything:\n{seen}"
    );
}
