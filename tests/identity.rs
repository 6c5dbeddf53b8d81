//! Identity (issue 2) end to end: `build`, `identity` and `check` driven through the real binary
//! on std-only fixture projects copied to temp dirs.
//!
//! Each test owns its project copy, target dir and `CARGO_MCP_DEV_HOME`; the fake-server build
//! itself is shared (built once per process, copied with mtimes kept), see `common::fixture`.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;

use common::fixture::{Project, Run, sha256_of, short};
use serde_json::Value;

const SUITE: &str = "identity";
const LABEL: &str = "fake-server";
const EXE: &str = "target/debug/fake-server";

/// The line in `fake-server/src/main.rs` tests edit to produce a different executable.
const SERVER_REVISION: &str = "const REVISION: &str = \"r1\";";
/// The line in `fake-core/src/lib.rs` tests edit to change the path dependency.
const CORE_REVISION: &str = "pub const CORE_REVISION: &str = \"core-1\";";

/// Every sentence `check` can fail with (as far as these fixtures can provoke), so a test can
/// assert that exactly its own sentence appears.
const CHECK_SENTENCES: &[(&str, &str)] = &[
    (
        "no-lockfile",
        "no Cargo.lock: the dependency versions that will run are not pinned",
    ),
    (
        "lockfile-outdated",
        "Cargo.lock is out of date: cargo would have to change it to build",
    ),
    ("extra-missing", "declared extra input `"),
    ("env-unset", "declared identity env var `"),
    ("wrapper-missing", "configured wrapper `"),
    ("differs", "identity differs from the expected record"),
    ("build-failed", "build failed: identity not captured"),
];

fn fake_server() -> Project {
    Project::built_fake_server(SUITE)
}

/// Asserts that `check`'s stderr names exactly the problem `kind` among [`CHECK_SENTENCES`].
#[track_caller]
fn assert_only_check_sentence(run: &Run, kind: &str) {
    let present: Vec<&str> = CHECK_SENTENCES
        .iter()
        .filter(|(_, s)| run.stderr.contains(s))
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(
        present,
        vec![kind],
        "check should state exactly the `{kind}` problem; stderr:\n{}",
        run.stderr
    );
}

fn parse_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

fn identity_digest(p: &Project, profile: &str) -> String {
    p.record(LABEL, profile)["identityDigest"]
        .as_str()
        .expect("identityDigest")
        .to_string()
}

// ---------------------------------------------------------------- build: status lines

#[test]
fn first_build_says_changed_from_none_with_no_previous_identity() {
    let p = fake_server();
    let run = p.build(&[]);
    run.expect_code(0);
    let digest = identity_digest(&p, "dev");
    assert_eq!(
        run.status_line(),
        format!(
            "build complete: {EXE} changed (none -> {}; no previous identity)",
            short(&digest)
        )
    );
    let rec = p.record(LABEL, "dev");
    assert_eq!(rec["schema"], "cargo-mcp-dev/identity/v1");
    assert_eq!(rec["label"], LABEL);
    assert_eq!(rec["executable"]["path"], EXE);
    assert_eq!(rec["runtime"]["profile"], "dev");
    assert!(
        run.stdout.is_empty(),
        "human format prints nothing on stdout"
    );
}

#[test]
fn rebuild_without_edit_is_unchanged_with_the_same_digest() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let first = identity_digest(&p, "dev");
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(
        run.status_line(),
        format!("build complete: {EXE} unchanged ({})", short(&first))
    );
    assert_eq!(identity_digest(&p, "dev"), first);
}

#[test]
fn editing_server_source_changes_only_the_executable() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let before = identity_digest(&p, "dev");
    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = \"r2\";",
    );
    let run = p.build(&[]);
    run.expect_code(0);
    let after = identity_digest(&p, "dev");
    assert_ne!(before, after);
    assert_eq!(
        run.status_line(),
        format!(
            "build complete: {EXE} changed ({} -> {}; executable)",
            short(&before),
            short(&after)
        )
    );
}

#[test]
fn path_dependency_code_change_changes_dependency_tree() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let main_rs = p.read("src/main.rs");
    p.replace(
        "fake-core/src/lib.rs",
        CORE_REVISION,
        "pub const CORE_REVISION: &str = \"core-2\";",
    );
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(p.read("src/main.rs"), main_rs, "server source untouched");
    let changed = run.changed_components();
    assert!(
        changed.contains(&"dependency tree".to_string()),
        "{changed:?}"
    );
    // The constant is compiled into the server, so its bytes move too; nothing else may.
    assert_eq!(changed, ["executable", "dependency tree"]);
}

#[test]
fn path_dependency_comment_only_change_is_dependency_tree_alone() {
    // Source that does not change the binary still changed what went into it. Built once here
    // first: the shared baseline was compiled at another path, which debug info records.
    let p = fake_server();
    p.replace(
        "fake-core/src/lib.rs",
        CORE_REVISION,
        "pub const CORE_REVISION: &str = \"core-2\";",
    );
    p.build(&[]).expect_code(0);
    let mut lib = p.read("fake-core/src/lib.rs");
    lib.push_str("// a comment that changes no code\n");
    p.write("fake-core/src/lib.rs", &lib);
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(run.changed_components(), ["dependency tree"]);
}

#[test]
fn path_dependency_version_bump_changes_dependency_tree_and_lockfile() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let before = p.record(LABEL, "dev");
    p.replace(
        "fake-core/Cargo.toml",
        "version = \"0.1.0\"",
        "version = \"0.1.1\"",
    );
    let run = p.build(&[]);
    run.expect_code(0);
    assert!(
        p.read("Cargo.lock")
            .contains("name = \"fake-core\"\nversion = \"0.1.1\""),
        "cargo updated the lockfile"
    );
    let changed = run.changed_components();
    for c in ["lockfile", "dependency tree"] {
        assert!(changed.contains(&c.to_string()), "{c} missing: {changed:?}");
    }
    for c in [
        "runtime",
        "config",
        "env",
        "extra inputs",
        "wrapper",
        "launcher",
    ] {
        assert!(
            !changed.contains(&c.to_string()),
            "{c} unexpected: {changed:?}"
        );
    }
    let after = p.record(LABEL, "dev");
    assert_ne!(before["lockfile"]["sha256"], after["lockfile"]["sha256"]);
    let deps = p.run(["identity", "--deps", "--no-build"]);
    deps.expect_code(0);
    // `--no-build` prints the recorded list: the bumped version is in it.
    let listed = p.run(["identity", "--json", "--no-build"]);
    let rec = parse_json(&listed.stdout);
    let core = rec["dependencyTree"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "fake-core")
        .expect("fake-core in the dependency list")
        .clone();
    assert_eq!(core["version"], "0.1.1");
    assert!(deps.stdout.contains("fake-core 0.1.1"), "{}", deps.stdout);
}

#[test]
fn rustflags_change_is_runtime() {
    let mut p = fake_server();
    p.build(&[]).expect_code(0);
    // Already on in the dev profile: same code, different flags.
    p.set_env("RUSTFLAGS", "-Cdebug-assertions=on");
    let run = p.build(&[]);
    run.expect_code(0);
    let changed = run.changed_components();
    assert!(changed.contains(&"runtime".to_string()), "{changed:?}");
    assert!(
        changed.iter().all(|c| c == "runtime" || c == "executable"),
        "only runtime (and possibly the executable) may change: {changed:?}"
    );
    assert_eq!(
        p.record(LABEL, "dev")["runtime"]["rustflags"],
        "-Cdebug-assertions=on"
    );
}

#[test]
fn release_profile_is_recorded_separately_and_differs_in_runtime() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let run = p.build(&["--release"]);
    run.expect_code(0);
    let release = identity_digest(&p, "release");
    // "changed/unchanged" is relative to the last identity of the same profile.
    assert_eq!(
        run.status_line(),
        format!(
            "build complete: target/release/fake-server changed (none -> {}; no previous identity)",
            short(&release)
        )
    );
    assert_eq!(p.record(LABEL, "release")["runtime"]["profile"], "release");
    let dev = p.identity_file(LABEL, "dev");
    let rel = p.identity_file(LABEL, "release");
    let diff = p.run([
        "identity".as_ref(),
        "--diff".as_ref(),
        dev.as_os_str(),
        "--against".as_ref(),
        rel.as_os_str(),
        "--json".as_ref(),
    ]);
    diff.expect_code(0);
    let v = parse_json(&diff.stdout);
    let changed: Vec<&str> = v["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(changed.contains(&"runtime"), "{changed:?}");
    let human = p.run([
        "identity".as_ref(),
        "--diff".as_ref(),
        dev.as_os_str(),
        "--against".as_ref(),
        rel.as_os_str(),
    ]);
    assert!(
        human.stdout.contains("profile dev -> release"),
        "{}",
        human.stdout
    );
}

// ---------------------------------------------------------------- configured inputs

#[test]
fn declared_extra_input_change_is_extra_inputs() {
    let p = fake_server();
    p.configure(r#"extra-inputs = ["data/schema.json", "data/fixtures"]"#);
    p.write("data/schema.json", "{\"v\": 1}\n");
    p.write("data/fixtures/a.txt", "a\n");
    p.build(&[]).expect_code(0);
    let rec = p.record(LABEL, "dev");
    let kinds: Vec<(&str, &str)> = rec["extraInputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["path"].as_str().unwrap(), x["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("data/schema.json", "file"), ("data/fixtures", "dir")]
    );

    p.write("data/schema.json", "{\"v\": 2}\n");
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(run.changed_components(), ["extra inputs"]);

    // A new file in a declared directory counts as well.
    p.write("data/fixtures/b.txt", "b\n");
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(run.changed_components(), ["extra inputs"]);

    let run = p.build(&[]);
    assert!(run.status_line().contains(" unchanged ("), "{}", run.stderr);
}

#[test]
fn declared_env_change_is_env_and_the_value_is_never_written() {
    let mut p = fake_server();
    p.configure(r#"env = ["FAKE_IDENTITY_MODE"]"#);
    let first = "first-secret-value-7d41f0";
    let second = "second-secret-value-c93b2e";
    p.set_env("FAKE_IDENTITY_MODE", first);
    let run1 = p.build(&[]);
    run1.expect_code(0);
    let d1 = p.record(LABEL, "dev")["env"][0].clone();
    assert_eq!(d1["name"], "FAKE_IDENTITY_MODE");
    // Keyed with the audit key (issue 12: an unkeyed digest lets a reader test guesses).
    let digest = d1["sha256"].as_str().unwrap();
    assert!(digest.starts_with("hmac-sha256:"), "{digest}");
    let unkeyed =
        cargo_mcp_dev::identity::fingerprint::env_value_digest("FAKE_IDENTITY_MODE", first);
    assert!(!digest.contains(&unkeyed["sha256:".len()..]), "{digest}");

    p.set_env("FAKE_IDENTITY_MODE", second);
    let run2 = p.build(&["--message-format", "json"]);
    run2.expect_code(0);
    let event = parse_json(run2.stdout.trim());
    assert_eq!(event["changed"], serde_json::json!(["env"]));
    let run3 = p.build(&[]);
    assert!(
        run3.status_line().contains(" unchanged ("),
        "{}",
        run3.stderr
    );

    // Neither value appears in any output or in any file we wrote.
    for run in [&run1, &run2, &run3] {
        for v in [first, second] {
            assert!(!run.stdout.contains(v) && !run.stderr.contains(v));
        }
    }
    for dir in [p.target_dir().join("mcp-dev"), p.home.clone()] {
        for entry in walkdir::WalkDir::new(&dir) {
            let entry = entry.unwrap();
            if !entry.file_type().is_file() {
                continue;
            }
            let bytes = std::fs::read(entry.path()).unwrap();
            for v in [first, second] {
                assert!(
                    !bytes.windows(v.len()).any(|w| w == v.as_bytes()),
                    "{} contains the value of FAKE_IDENTITY_MODE",
                    entry.path().display()
                );
            }
        }
    }
}

#[test]
fn wrapper_script_change_alone_is_wrapper() {
    let p = fake_server();
    p.configure(r#"wrapper = "scripts/serve.sh""#);
    let script = p.path("scripts/serve.sh");
    p.write("scripts/serve.sh", "#!/bin/sh\nexec \"$@\"\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    p.build(&[]).expect_code(0);
    let rec = p.record(LABEL, "dev");
    let store_path = rec["executable"]["storePath"].as_str().unwrap();
    assert_eq!(
        rec["launch"]["argv"],
        serde_json::json!([script.display().to_string(), store_path]),
        "the wrapper starts the stored executable"
    );
    assert_eq!(rec["wrapper"]["starts"], store_path);

    p.write(
        "scripts/serve.sh",
        "#!/bin/sh\n# now with a comment\nexec \"$@\"\n",
    );
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(run.changed_components(), ["wrapper"]);
}

/// The 1-based line of the first line of `p`'s Cargo.toml that starts with `prefix`.
fn manifest_line(p: &Project, prefix: &str) -> usize {
    p.read("Cargo.toml")
        .lines()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in Cargo.toml"))
        + 1
}

#[test]
fn unknown_config_key_is_an_error_naming_file_line_and_closest_key() {
    let p = fake_server();
    p.configure("label = \"fake-server\"\ndebounce_ms = 50");
    let line = manifest_line(&p, "debounce_ms");
    let manifest = p.path("Cargo.toml").canonicalize().unwrap();
    for cmd in [&["build"][..], &["check"], &["identity", "--no-build"]] {
        let run = p.run(cmd.iter().copied());
        run.expect_code(1);
        assert_eq!(
            run.stderr.trim_end(),
            format!(
                "error: unknown key `debounce_ms` in [package.metadata.mcp-dev] at {}:{line}: did you mean `debounce-ms`?",
                manifest.display()
            ),
            "{cmd:?}"
        );
    }
}

#[test]
fn unknown_config_value_is_an_error_naming_file_line_and_closest_value() {
    let p = fake_server();
    p.configure("restart = \"supervize\"");
    let line = manifest_line(&p, "restart");
    let run = p.build(&[]);
    run.expect_code(1);
    run.assert_stderr_has(format!(
        "error: unknown value restart = \"supervize\" in [package.metadata.mcp-dev] at {}:{line}: did you mean \"supervise\"? (expected \"supervise\", \"disconnect\" or \"manual\")",
        p.path("Cargo.toml").canonicalize().unwrap().display()
    ));
}

// ---------------------------------------------------------------- check: the CI gate

#[test]
fn check_passes_on_a_clean_locked_project() {
    let p = fake_server();
    let run = p.run(["check"]);
    run.expect_code(0);
    let digest = identity_digest(&p, "dev");
    assert!(
        run.stderr
            .contains(&format!("check passed: identity {}", short(&digest))),
        "{}",
        run.stderr
    );
    assert_only_check_sentence_absent(&run);
}

#[track_caller]
fn assert_only_check_sentence_absent(run: &Run) {
    for (k, s) in CHECK_SENTENCES {
        assert!(!run.stderr.contains(s), "unexpected `{k}`:\n{}", run.stderr);
    }
}

#[test]
fn check_without_lockfile_is_103() {
    let p = fake_server();
    std::fs::remove_file(p.path("Cargo.lock")).unwrap();
    let run = p.run(["check"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "no-lockfile");
    assert!(
        !p.path("Cargo.lock").exists(),
        "check must not create a lockfile"
    );
}

#[test]
fn check_no_locked_without_lockfile_is_still_103() {
    // `--no-locked` drops `--locked` only; "the lockfile must still exist" (CLI help).
    let p = fake_server();
    std::fs::remove_file(p.path("Cargo.lock")).unwrap();
    let run = p.run(["check", "--no-locked"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "no-lockfile");
}

#[test]
fn check_with_outdated_lockfile_is_103() {
    let p = fake_server();
    let lock = p.read("Cargo.lock");
    p.replace(
        "fake-core/Cargo.toml",
        "version = \"0.1.0\"",
        "version = \"0.1.1\"",
    );
    let run = p.run(["check"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "lockfile-outdated");
    assert_eq!(
        p.read("Cargo.lock"),
        lock,
        "check must not rewrite Cargo.lock"
    );
}

#[test]
fn check_with_missing_extra_input_is_103() {
    let p = fake_server();
    p.configure(r#"extra-inputs = ["data/schema.json"]"#);
    let run = p.run(["check"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "extra-missing");
    assert!(
        run.stderr
            .contains("declared extra input `data/schema.json` does not exist"),
        "{}",
        run.stderr
    );
}

#[test]
fn check_with_unset_env_var_is_103() {
    let mut p = fake_server();
    p.configure(r#"env = ["FAKE_IDENTITY_MODE"]"#);
    p.remove_env("FAKE_IDENTITY_MODE");
    let run = p.run(["check"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "env-unset");
    assert!(
        run.stderr
            .contains("declared identity env var `FAKE_IDENTITY_MODE` is not set"),
        "{}",
        run.stderr
    );
    // Setting it makes the same project pass.
    p.set_env("FAKE_IDENTITY_MODE", "on");
    p.run(["check"]).expect_code(0);
}

#[test]
fn check_with_missing_wrapper_is_103() {
    let p = fake_server();
    p.configure(r#"wrapper = "scripts/serve.sh""#);
    let run = p.run(["check"]);
    run.expect_code(103);
    assert_only_check_sentence(&run, "wrapper-missing");
    run.assert_stderr_has("configured wrapper `scripts/serve.sh`");
}

#[test]
fn check_expect_names_the_differing_components_with_104() {
    let p = fake_server();
    let expected = p.scratch().join("expected.json");
    let run = p.run(["check".as_ref(), "--out".as_ref(), expected.as_os_str()]);
    run.expect_code(0);
    // The same project passes against its own record…
    p.run(["check".as_ref(), "--expect".as_ref(), expected.as_os_str()])
        .expect_code(0);
    // …and fails, naming the component, once the server changed.
    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = \"r2\";",
    );
    let run = p.run(["check".as_ref(), "--expect".as_ref(), expected.as_os_str()]);
    run.expect_code(104);
    assert_only_check_sentence(&run, "differs");
    let old = parse_json(&std::fs::read_to_string(&expected).unwrap());
    let new = identity_digest(&p, "dev");
    run.assert_stderr_has(format!(
        "identity differs from the expected record ({} -> {}): executable",
        short(old["identityDigest"].as_str().unwrap()),
        short(&new)
    ));
}

/// The identity record is a file in the target directory, which the agent can write: a
/// checksum with a multi-byte character where `identity --deps` cuts it (16 characters) is
/// shown, cut at a character. Red-team round 21: the cut was at byte 16 and the command
/// panicked (exit 101).
#[test]
fn identity_deps_shows_a_recorded_checksum_with_a_multibyte_character() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let file = p.identity_file(LABEL, "dev");
    let mut rec = p.record(LABEL, "dev");
    let list = rec["dependencyTree"]["list"]
        .as_array_mut()
        .expect("a dependency list");
    assert!(!list.is_empty(), "the fixture has dependencies");
    // 15 ASCII bytes, then a 2-byte character spanning bytes 15..17.
    list[0]["checksum"] = serde_json::json!("aaaaaaaaaaaaaaaé0123");
    std::fs::write(&file, serde_json::to_string_pretty(&rec).unwrap()).unwrap();
    let run = p.run(["identity", "--deps", "--no-build"]);
    run.expect_code(0);
    assert!(
        run.stdout.contains("checksum aaaaaaaaaaaaaaaé "),
        "{}",
        run.stdout
    );
}

/// An `--expect` record is a file anyone may have edited: the dependency names its failure
/// notes carry are shown with bidi and invisible characters named (`<U+202E>`), so a name
/// cannot reorder the line a human reads. Red-team round 21: the notes went through the plain
/// line cleaner, which passes those characters.
#[test]
fn check_expect_notes_name_bidi_characters_of_the_record() {
    let p = fake_server();
    let expected = p.scratch().join("expected.json");
    p.run(["check".as_ref(), "--out".as_ref(), expected.as_os_str()])
        .expect_code(0);
    let mut rec = parse_json(&std::fs::read_to_string(&expected).unwrap());
    let list = rec["dependencyTree"]["list"].as_array_mut().unwrap();
    let name = list[0]["name"].as_str().unwrap().to_string();
    list[0]["name"] = serde_json::json!(format!("{name}\u{202e}evil"));
    std::fs::write(&expected, rec.to_string()).unwrap();
    let run = p.run(["check".as_ref(), "--expect".as_ref(), expected.as_os_str()]);
    run.expect_code(104);
    run.assert_stderr_has(format!("{name}<U+202E>evil"));
    assert!(!run.stderr.contains('\u{202e}'), "{}", run.stderr);
}

/// One note is one line: a dependency name holding a newline in an `--expect` record is shown
/// with `\n`, never as a line of its own that reads as the tool's (`check passed: …`).
/// Red-team round 22 (after round 21 named bidi characters there).
#[test]
fn check_expect_notes_cannot_start_a_line_of_their_own() {
    let p = fake_server();
    let expected = p.scratch().join("expected.json");
    p.run(["check".as_ref(), "--out".as_ref(), expected.as_os_str()])
        .expect_code(0);
    let mut rec: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expected).unwrap()).unwrap();
    let list = rec["dependencyTree"]["list"].as_array_mut().unwrap();
    let name = list[0]["name"].as_str().unwrap().to_string();
    list[0]["name"] = serde_json::json!(format!("{name}\ncheck passed: identity sha256:forged"));
    std::fs::write(&expected, rec.to_string()).unwrap();
    let run = p.run(["check".as_ref(), "--expect".as_ref(), expected.as_os_str()]);
    run.expect_code(104);
    assert!(
        !run.stderr.lines().any(|l| l.starts_with("check passed")),
        "a line of the record reads as the tool's own:\n{}",
        run.stderr
    );
}

/// A CI job starts `check` from the repository root (or anywhere), a developer from the package
/// directory: the same server must pass, with the difference said, and recorded.
#[test]
fn check_expect_leaves_the_launch_directory_out_unless_asked() {
    let p = fake_server();
    let expected = p.scratch().join("expected.json");
    p.run(["check".as_ref(), "--out".as_ref(), expected.as_os_str()])
        .expect_code(0);
    let elsewhere = p.scratch().join("ci-job");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let elsewhere = elsewhere.canonicalize().unwrap();
    let manifest = p.path("Cargo.toml");
    let actual = p.scratch().join("actual.json");
    let check_from_elsewhere = |extra: &[&str]| {
        let mut cmd = p.command([
            "check".as_ref(),
            "--manifest-path".as_ref(),
            manifest.as_os_str(),
        ]);
        cmd.args([
            "--expect".as_ref(),
            expected.as_os_str(),
            "--out".as_ref(),
            actual.as_os_str(),
        ])
        .args(extra)
        .current_dir(&elsewhere);
        let out = cmd.output().unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    };

    let run = check_from_elsewhere(&[]);
    run.expect_code(0);
    run.assert_stderr_has(format!(
        "note: launch directory differs (`.` -> `{}`): recorded, not compared (--include-launch-dir compares it)",
        elsewhere.display()
    ));
    run.assert_stderr_has("check passed: identity ");
    let recorded = parse_json(&std::fs::read_to_string(&actual).unwrap());
    assert_eq!(recorded["launch"]["cwd"], elsewhere.display().to_string());

    let run = check_from_elsewhere(&["--include-launch-dir"]);
    run.expect_code(104);
    assert_only_check_sentence(&run, "differs");
    let old = parse_json(&std::fs::read_to_string(&expected).unwrap());
    run.assert_stderr_has(format!(
        "identity differs from the expected record ({} -> {}): launch directory\n",
        short(old["identityDigest"].as_str().unwrap()),
        short(recorded["identityDigest"].as_str().unwrap())
    ));
    run.assert_stderr_has(format!(
        "note: launch directory `.` -> `{}`",
        elsewhere.display()
    ));

    // A real difference still fails without the flag, and the launch directory is not in it.
    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = \"r3\";",
    );
    let run = check_from_elsewhere(&[]);
    run.expect_code(104);
    assert!(
        run.stderr.contains("): executable\n"),
        "only the executable differs:\n{}",
        run.stderr
    );
}

#[test]
fn check_with_build_failure_is_101() {
    let p = fake_server();
    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = r1_undefined;",
    );
    let run = p.run(["check"]);
    run.expect_code(101);
    assert_only_check_sentence(&run, "build-failed");
    run.assert_stderr_has("build failed: 1 error in src/main.rs");
}

#[test]
fn check_out_writes_the_record_identity_no_build_prints() {
    let p = fake_server();
    let out = p.scratch().join("ci/identity.json");
    p.run(["check".as_ref(), "--out".as_ref(), out.as_os_str()])
        .expect_code(0);
    let written = parse_json(&std::fs::read_to_string(&out).expect("--out file written"));
    let shown = p.run(["identity", "--no-build", "--json"]);
    shown.expect_code(0);
    assert_eq!(parse_json(&shown.stdout), written);
    assert_eq!(written, p.record(LABEL, "dev"));
}

#[test]
fn identity_no_build_without_a_record_is_103() {
    let p = Project::copy_of("fake-server");
    let run = p.run(["identity", "--no-build"]);
    run.expect_code(103);
    assert!(
        run.stderr
            .contains("no identity recorded yet for `fake-server`"),
        "{}",
        run.stderr
    );
}

// ---------------------------------------------------------------- store and last good

#[test]
fn store_copy_hashes_to_the_record_and_is_read_only() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let rec = p.record(LABEL, "dev");
    let sha = rec["executable"]["sha256"].as_str().unwrap();
    let store_path = std::path::PathBuf::from(rec["executable"]["storePath"].as_str().unwrap());
    assert_eq!(
        store_path,
        p.target_dir()
            .join("mcp-dev/store")
            .join(format!("sha256-{}", sha.strip_prefix("sha256:").unwrap()))
    );
    assert_eq!(
        sha256_of(&store_path),
        sha,
        "store copy hashes to the record"
    );
    assert_eq!(
        sha256_of(&p.path(EXE)),
        sha,
        "and equals cargo's output at capture time"
    );
    let meta = std::fs::metadata(&store_path).unwrap();
    assert_eq!(meta.len(), rec["executable"]["size"].as_u64().unwrap());
    let mode = meta.permissions().mode();
    assert_eq!(mode & 0o222, 0, "store entry is read-only (mode {mode:o})");
    assert_ne!(mode & 0o111, 0, "store entry is executable (mode {mode:o})");
    assert_eq!(
        rec["launch"]["argv"][0],
        store_path.display().to_string(),
        "what runs is the store copy"
    );
}

#[test]
fn build_failure_keeps_the_last_good_identity() {
    let p = fake_server();
    // Compile the good build here (the shared baseline was compiled at another path, which
    // debug info records), so that restoring the source later restores the same bytes.
    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = \"r2\";",
    );
    p.build(&[]).expect_code(0);
    let file = p.identity_file(LABEL, "dev");
    let good_bytes = std::fs::read(&file).unwrap();
    let good = identity_digest(&p, "dev");

    let original = p.read("src/main.rs");
    p.replace(
        "src/main.rs",
        "const REVISION: &str = \"r2\";",
        "const REVISION: &str = r2_undefined;",
    );
    let run = p.build(&[]);
    run.expect_code(101);
    assert_eq!(
        run.status_line(),
        format!(
            "build failed: 1 error in src/main.rs (last good: {})",
            short(&good)
        )
    );
    assert!(
        run.stderr.contains("error[E0425]"),
        "cargo's diagnostics are shown:\n{}",
        run.stderr
    );
    assert_eq!(
        std::fs::read(&file).unwrap(),
        good_bytes,
        "identity file untouched"
    );

    // Fixing the error brings back the same code: unchanged relative to the last good.
    p.write("src/main.rs", &original);
    let run = p.build(&[]);
    run.expect_code(0);
    assert_eq!(
        run.status_line(),
        format!("build complete: {EXE} unchanged ({})", short(&good))
    );
}

// ---------------------------------------------------------------- target selection errors

#[test]
fn library_only_package_is_refused() {
    let p = Project::copy_of("lib-only");
    let run = p.build(&[]);
    run.expect_code(1);
    run.assert_stderr_has("package `lib-only` is a library-only package: an MCP server over stdio needs a binary target");
    assert!(!p.path("target").exists(), "nothing was built");
}

#[test]
fn several_bins_without_bin_lists_them() {
    let p = Project::copy_of("two-bins");
    let run = p.build(&[]);
    run.expect_code(1);
    assert!(
        run.stderr
            .contains("package `two-bins` has several binaries (alpha, beta) and no `default-run`: pass --bin NAME"),
        "{}",
        run.stderr
    );
}

#[test]
fn unknown_bin_lists_the_available_ones() {
    let p = Project::copy_of("two-bins");
    let run = p.build(&["--bin", "nope"]);
    run.expect_code(1);
    assert!(
        run.stderr
            .contains("no bin target named `nope` in package `two-bins` (available: alpha, beta)"),
        "{}",
        run.stderr
    );
}

#[test]
fn choosing_a_bin_of_several_builds_it() {
    let p = Project::copy_of("two-bins");
    let run = p.build(&["--bin", "beta"]);
    run.expect_code(0);
    assert!(
        run.status_line()
            .starts_with("build complete: target/debug/beta changed (none -> sha256:"),
        "{}",
        run.stderr
    );
    assert_eq!(p.record("beta", "dev")["bin"], "beta");
}

#[test]
fn cargo_not_found_is_102_and_names_the_path_searched() {
    let mut p = Project::copy_of("two-bins");
    p.remove_env("CARGO");
    p.set_env("PATH", "");
    let run = p.build(&["--bin", "alpha"]);
    run.expect_code(102);
    assert!(
        run.stderr
            .contains("cargo not found on PATH (searched: <empty>)"),
        "{}",
        run.stderr
    );

    let searched = "/nonexistent/mcp-dev-a:/nonexistent/mcp-dev-b";
    p.set_env("PATH", searched);
    let run = p.build(&["--bin", "alpha"]);
    run.expect_code(102);
    assert!(
        run.stderr
            .contains(&format!("cargo not found on PATH (searched: {searched})")),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_manifest_paths_are_reported() {
    let p = Project::copy_of("two-bins");
    let missing = p.scratch().join("nowhere/Cargo.toml");
    let run = p.run([
        "build".as_ref(),
        "--manifest-path".as_ref(),
        missing.as_os_str(),
    ]);
    run.expect_code(102);
    run.assert_stderr_has(format!(
        "manifest path `{}` does not exist",
        missing.display()
    ));

    let not_a_manifest = p.path("src");
    let run = p.run([
        "build".as_ref(),
        "--manifest-path".as_ref(),
        not_a_manifest.as_os_str(),
    ]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains("the manifest-path must be a path to a Cargo.toml file"),
        "{}",
        run.stderr
    );

    let broken = p.scratch().join("broken/Cargo.toml");
    std::fs::create_dir_all(broken.parent().unwrap()).unwrap();
    std::fs::write(&broken, "[package\nname = \n").unwrap();
    let run = p.run([
        "build".as_ref(),
        "--manifest-path".as_ref(),
        broken.as_os_str(),
    ]);
    run.expect_code(102);
    run.assert_stderr_has("cargo metadata failed");
}

// ---------------------------------------------------------------- output formats and spellings

#[test]
fn message_format_json_prints_one_event_per_build() {
    let p = fake_server();
    let events: Vec<Value> = [
        p.build(&["--message-format", "json"]),
        p.build(&["--message-format", "json"]),
    ]
    .iter()
    .map(|run| {
        run.expect_code(0);
        one_event(run)
    })
    .collect();
    let digest = identity_digest(&p, "dev");
    let rec = p.record(LABEL, "dev");

    assert_eq!(events[0]["event"], "build-complete");
    assert_eq!(events[0]["outcome"], "changed");
    assert_eq!(events[0]["identity"], digest.as_str());
    assert_eq!(events[0]["previousIdentity"], Value::Null);
    assert_eq!(events[0]["storePath"], rec["executable"]["storePath"]);
    assert_eq!(events[0]["changed"].as_array().unwrap().len(), 10);

    assert_eq!(events[1]["outcome"], "unchanged");
    assert_eq!(events[1]["changed"], serde_json::json!([]));
    assert_eq!(events[1]["previousIdentity"], digest.as_str());

    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = r1_undefined;",
    );
    let run = p.build(&["--message-format", "json"]);
    run.expect_code(101);
    let failed = one_event(&run);
    assert_eq!(failed["event"], "build-failed");
    assert_eq!(failed["lastGood"], digest.as_str());
    assert_eq!(failed["file"], "src/main.rs");
    assert!(
        !run.stderr.contains("build failed: "),
        "json replaces the human status line"
    );
}

#[track_caller]
fn one_event(run: &Run) -> Value {
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one event line on stdout:\n{}",
        run.stdout
    );
    parse_json(lines[0])
}

#[test]
fn identity_diff_names_the_changed_components() {
    let p = fake_server();
    p.build(&[]).expect_code(0);
    let old = p.scratch().join("old.json");
    std::fs::copy(p.identity_file(LABEL, "dev"), &old).unwrap();
    let old_digest = identity_digest(&p, "dev");

    let same = p.run(["identity".as_ref(), "--diff".as_ref(), old.as_os_str()]);
    same.expect_code(0);
    assert_eq!(
        same.stdout.trim(),
        format!("identity unchanged ({})", short(&old_digest))
    );

    p.replace(
        "src/main.rs",
        SERVER_REVISION,
        "const REVISION: &str = \"r2\";",
    );
    let run = p.run(["identity".as_ref(), "--diff".as_ref(), old.as_os_str()]);
    run.expect_code(0);
    let new_digest = identity_digest(&p, "dev");
    let mut lines = run.stdout.lines();
    assert_eq!(
        lines.next().unwrap(),
        format!(
            "identity changed ({} -> {}): executable",
            short(&old_digest),
            short(&new_digest)
        )
    );
    assert!(
        lines.next().unwrap().starts_with("  executable: sha256:"),
        "{}",
        run.stdout
    );

    let new = p.identity_file(LABEL, "dev");
    let json = p.run([
        "identity".as_ref(),
        "--diff".as_ref(),
        old.as_os_str(),
        "--against".as_ref(),
        new.as_os_str(),
        "--json".as_ref(),
    ]);
    json.expect_code(0);
    let v = parse_json(&json.stdout);
    assert_eq!(v["changed"], serde_json::json!(["executable"]));
    assert_eq!(v["old"], old_digest.as_str());
    assert_eq!(v["new"], new_digest.as_str());
}

#[test]
fn identity_diff_of_a_non_record_is_an_error() {
    let p = fake_server();
    let junk = p.scratch().join("junk.json");
    std::fs::write(&junk, "{\"not\": \"a record\"}").unwrap();
    let run = p.run([
        "identity".as_ref(),
        "--diff".as_ref(),
        junk.as_os_str(),
        "--against".as_ref(),
        junk.as_os_str(),
    ]);
    assert_ne!(run.code, 0);
    run.assert_stderr_has("is not an identity record");
}

#[test]
fn cargo_spelling_mcp_dev_build_works_like_build() {
    let p = fake_server();
    let run = p.run(["mcp-dev", "build"]);
    run.expect_code(0);
    let digest = identity_digest(&p, "dev");
    assert_eq!(
        run.status_line(),
        format!(
            "build complete: {EXE} changed (none -> {}; no previous identity)",
            short(&digest)
        )
    );
    let run = p.build(&[]);
    assert_eq!(
        run.status_line(),
        format!("build complete: {EXE} unchanged ({})", short(&digest)),
        "both spellings share the recorded identity"
    );
    let shown = p.run(["mcp-dev", "identity", "--no-build", "--json"]);
    shown.expect_code(0);
    assert_eq!(parse_json(&shown.stdout)["identityDigest"], digest.as_str());
}

#[test]
fn the_metadata_cache_does_not_hide_a_manifest_change() {
    // The resolved graph is cached on manifest/lockfile digests; a config change must be seen.
    let p = fake_server();
    p.build(&[]).expect_code(0);
    p.configure("label = \"renamed\"");
    let run = p.build(&[]);
    run.expect_code(0);
    assert!(
        run.status_line().contains("(none -> sha256:"),
        "a new label has no previous identity: {}",
        run.stderr
    );
    assert_eq!(p.record("renamed", "dev")["label"], "renamed");
    let components: BTreeSet<String> = p.record("renamed", "dev")["components"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(components.len(), 10);
}
