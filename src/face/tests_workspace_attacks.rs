//! Attacks through the workspace, unit level (red-team rounds 17 and 18): the watcher (`watch`)
//! and the configuration (`config`). Each test failed on the code it was written against.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, unbounded};
use globset::GlobSetBuilder;

use crate::face::watch::{self, Signal, WatchPlan};

/// The watcher tests count inotify watches and flood the queue: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn plan(roots: &[(&Path, bool)], package_root: &Path) -> WatchPlan {
    WatchPlan {
        roots: roots.iter().map(|(p, r)| (p.to_path_buf(), *r)).collect(),
        ignore_dirs: vec![package_root.join("target")],
        ignore: GlobSetBuilder::new().build().unwrap(),
        package_root: package_root.to_path_buf(),
    }
}

/// Runs `body` as an unprivileged user: the test binary re-executes this one test as uid
/// 65534 (root reads every directory, so a permission problem needs someone else). Shared by
/// the watcher's own tests.
pub(crate) fn as_nobody(test: &str, body: impl FnOnce()) {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("TEST_AS_NOBODY").is_some() || rustix::process::geteuid().as_raw() != 0 {
        return body();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("TEST_AS_NOBODY", "1")
        .env("TMPDIR", "/tmp")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && all.contains("1 passed"),
        "as uid 65534:\n{all}"
    );
}

/// Finding (watcher): `watch::start` adds its roots with `?`, and notify's recursive watch
/// stops at the first directory it cannot watch. One unwatchable directory anywhere under
/// any watched root (permission denied, as here: e.g. a root-owned 0700 Docker volume in
/// `data/`, or `lost+found`; the inotify watch limit, reported as MaxFilesWatch) makes
/// the whole watcher fail: `run` prints "cannot watch sources" and never rebuilds on a save
/// to `src/`, which is perfectly watchable. The rest should still be watched (and the bad
/// directory named).
#[test]
fn one_unwatchable_directory_leaves_the_rest_watched() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    as_nobody(
        "face::tests_workspace_attacks::one_unwatchable_directory_leaves_the_rest_watched",
        unwatchable_body,
    );
}

fn unwatchable_body() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let src = root.join("src");
    let data = root.join("data");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&data).unwrap();
    let locked = data.join("volume");
    std::fs::create_dir_all(&locked).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let (tx, rx) = unbounded();
    let w = watch::start(
        plan(&[(&src, true), (&data, true)], &root),
        Duration::from_millis(50),
        move |s| {
            let _ = tx.send(s);
        },
    );
    let w = match w {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700));
            panic!("one unwatchable directory under data/ stopped all watching: {e}")
        }
    };
    std::fs::write(src.join("main.rs"), "fn main() {}").unwrap();
    let got: Vec<Signal> =
        std::iter::from_fn(|| rx.recv_timeout(Duration::from_secs(3)).ok()).collect();
    drop(w);
    let _ = std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700));
    assert!(
        got.iter().any(|s| matches!(s, Signal::Settled { paths, .. } if paths.iter().any(|p| p.ends_with("src/main.rs")))),
        "a save to src/main.rs was not reported: {got:?}"
    );
}

/// Finding (debounce thread): `until_quiet` keeps the burst's paths in a `Vec` and checks
/// `batch.contains(&p)` for every event: quadratic in the number of distinct paths. A burst
/// of new files in a watched directory (a code generator, `git checkout` of another branch,
/// unpacking a data set into a top-level directory, which is watched recursively) wedges the
/// debounce thread: measured 3.6 s to settle after 5,000 files and 69 s after 20,000 (debug
/// build), a core busy all along, and the build started at the leading edge is held, not
/// served, the whole time. A set (HashSet/BTreeSet) beside the Vec, or a cap on the paths
/// kept (only three are shown), makes it linear.
#[test]
fn a_burst_of_distinct_paths_settles_promptly() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let src = root.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let (tx, rx) = unbounded();
    let _w = watch::start(
        plan(&[(&src, true)], &root),
        Duration::from_millis(50),
        move |s| {
            let _ = tx.send((s, Instant::now()));
        },
    )
    .unwrap();
    for i in 0..12_000 {
        std::fs::write(src.join(format!("generated_module_{i}.rs")), b"x").unwrap();
    }
    let wrote = Instant::now();
    let settled = loop {
        match rx.recv_timeout(Duration::from_secs(90)) {
            Ok((Signal::Settled { paths, .. }, at)) => break (at - wrote, paths.len()),
            Ok(_) => {}
            Err(e) => panic!("no batch within 90 s of the last write: {e:?}"),
        }
    };
    assert!(
        settled.0 < Duration::from_secs(5),
        "the burst of {} paths settled {:?} after its last write (debounce 50 ms)",
        settled.1,
        settled.0
    );
}

/// Finding (config): `ignore` globs are not checked when `[package.metadata.mcp-dev]` is read
/// (`validate` never compiles them); `build`, `check`, `identity` and `init` accept the table,
/// and only `run` finds out, when it builds the watch plan: it prints a warning and then
/// watches nothing at all for the whole session (no rebuild on any save). A typo in one
/// ignore pattern should be a configuration error naming the key and line, like every other
/// bad value.
#[test]
fn an_invalid_ignore_glob_is_refused_with_the_table() {
    use crate::identity::config::LoadedConfig;
    assert!(
        globset::Glob::new("fixtures/[abc").is_err(),
        "globset rejects it"
    );
    let r = LoadedConfig::from_package_metadata(&serde_json::json!({
        "mcp-dev": {"ignore": ["*.log", "fixtures/[abc"]}
    }));
    assert!(
        r.is_err(),
        "`ignore = [\"fixtures/[abc\"]` was accepted; `run` then watches nothing"
    );
}

/// Finding (config conflict): a tool listed in both `exempt` and `per-call` ("tools that need
/// a decision for every call") needs no decision at all: `Gating::All { exempt }` is checked
/// first and `per_call_tools` only chooses the grant's lifetime. Likewise `gate = [...]`
/// with a `per-call` tool not in the list, and `gate = "off"` with `per-call`. The conflict
/// is resolved silently towards the unsafe side (and `run --exempt TOOL` does the same to a
/// configured per-call tool, despite run.rs's "flags never narrow what it gates per call").
/// Either the table is refused (naming both keys) or per-call wins.
#[test]
fn a_per_call_tool_cannot_be_left_ungated_by_the_table() {
    use crate::face::commands::run::policy_from;
    use crate::identity::config::LoadedConfig;
    for table in [
        serde_json::json!({"exempt": ["delete_item"], "per-call": ["delete_item"]}),
        serde_json::json!({"gate": ["write_item"], "per-call": ["delete_item"]}),
    ] {
        match LoadedConfig::from_package_metadata(&serde_json::json!({ "mcp-dev": table.clone() }))
        {
            Err(_) => {} // the conflict is reported: fine
            Ok(c) => assert!(
                policy_from(&c, false).is_gated("delete_item"),
                "with {table}, `delete_item` (declared per-call) is called with no decision at all"
            ),
        }
    }
}

fn plan_of(root: &Path, roots: Vec<(PathBuf, bool)>) -> WatchPlan {
    WatchPlan {
        roots,
        ignore_dirs: vec![],
        ignore: GlobSetBuilder::new().build().unwrap(),
        package_root: root.to_path_buf(),
    }
}

/// Everything that arrives within `quiet` of the previous signal.
fn drain(rx: &Receiver<Signal>, quiet: Duration) -> Vec<Signal> {
    std::iter::from_fn(|| rx.recv_timeout(quiet).ok()).collect()
}

fn settled(signals: &[Signal]) -> bool {
    signals.iter().any(|s| matches!(s, Signal::Settled { .. }))
}

/// Red-team round 18: a directory deleted and created again at once (`git checkout` of a branch whose files in
/// `src/sub` all differ: git removes the emptied directory and recreates it; a code generator's
/// `rm -rf out && mkdir out`). By the time the debounce thread handles the removal the path
/// exists again, and it is still in `watched` (by path), so the new directory is never
/// watched: every later save in it builds nothing.
#[test]
fn a_directory_removed_and_recreated_is_watched_again() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let sub = root.join("src").join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("a.rs"), "fn a() {}").unwrap();
    let (tx, rx) = unbounded();
    let _w = watch::start(
        plan_of(&root, vec![(root.join("src"), true)]),
        Duration::from_millis(50),
        move |s| {
            let _ = tx.send(s);
        },
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // Checkout: many new directories (the debounce thread walks and watches them), and the
    // directory goes and comes back with new content.
    let outside = root.join("staging");
    for i in 0..3000 {
        std::fs::create_dir_all(outside.join(format!("d{}", i / 50)).join(format!("e{i}")))
            .unwrap();
    }
    std::fs::rename(&outside, root.join("src").join("gen")).unwrap();
    std::fs::remove_dir_all(&sub).unwrap();
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("b.rs"), "fn b() {}").unwrap();
    assert!(
        settled(&drain(&rx, Duration::from_millis(700))),
        "the checkout itself"
    );
    // The user now edits the new file.
    std::fs::write(sub.join("b.rs"), "fn b() { changed(); }").unwrap();
    let after = drain(&rx, Duration::from_millis(1500));
    assert!(
        settled(&after),
        "a save in the recreated directory started no build: {after:?}"
    );
}
