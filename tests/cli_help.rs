//! `--help` is a guide on its own: `run --help` grouped as cargo groups its help, one text for
//! `--message-format` everywhere, and the top-level help pointing to the documentation by path.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cargo-mcp-dev");

fn help(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("mcp-dev")
        .args(args)
        .env("CARGO_TERM_COLOR", "never")
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `heading -> options` in the order they appear.
fn groups(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(' ') && line.ends_with(':') {
            out.push((line.trim_end_matches(':').to_string(), Vec::new()));
        } else if let Some((_, opts)) = out.last_mut() {
            // An option line: `  -p, --package <SPEC>` or `      --release`.
            let t = line.trim_start();
            if line.starts_with("  ") && t.starts_with('-') && line.len() - t.len() <= 6 {
                let long = t
                    .split([',', ' '])
                    .find(|w| w.starts_with("--"))
                    .unwrap_or(t)
                    .trim_end_matches("...");
                opts.push(long.to_string());
            }
        }
    }
    out
}

#[test]
fn run_help_is_grouped_as_cargo_groups_it() {
    let text = help(&["run", "--help"]);
    assert!(!text.contains("Cargo options"), "{text}");
    let g = groups(&text);
    let headings: Vec<&str> = g.iter().map(|(h, _)| h.as_str()).collect();
    assert_eq!(
        headings,
        [
            "Usage: cargo mcp-dev run [OPTIONS] [-- <ARGS>...]",
            "Options",
            "Package Selection",
            "Compilation Options",
            "Manifest Options",
            "Run Options",
            "Output"
        ]
        .iter()
        .filter(|h| !h.starts_with("Usage"))
        .copied()
        .collect::<Vec<_>>(),
        "{text}"
    );
    let group = |name: &str| -> Vec<String> {
        g.iter()
            .find(|(h, _)| h == name)
            .map(|(_, o)| o.clone())
            .unwrap()
    };
    assert_eq!(group("Package Selection"), ["--package", "--bin"]);
    for o in [
        "--release",
        "--profile",
        "--features",
        "--target",
        "--target-dir",
    ] {
        assert!(
            group("Compilation Options").iter().any(|x| x == o),
            "{o}\n{text}"
        );
    }
    for o in ["--manifest-path", "--locked", "--offline", "--frozen"] {
        assert!(
            group("Manifest Options").iter().any(|x| x == o),
            "{o}\n{text}"
        );
    }
    // `run`'s own options, and nothing of cargo's among them.
    let run = group("Run Options");
    for o in [
        "--restart",
        "--debounce",
        "--no-watch",
        "--no-gating",
        "--exempt",
        "--per-call",
    ] {
        assert!(
            run.iter().any(|x| x == o),
            "{o} not under Run Options:\n{text}"
        );
    }
    assert!(
        !run.iter().any(|x| x == "--release" || x == "--bin"),
        "{run:?}"
    );
    let output = group("Output");
    for o in ["--message-format", "--verbose", "--quiet", "--color"] {
        assert!(
            output.iter().any(|x| x == o),
            "{o} not under Output:\n{text}"
        );
    }
}

/// The paragraph of `--message-format` in a command's `--help`.
fn message_format_text(cmd: &str) -> String {
    let text = help(&[cmd, "--help"]);
    let start = text
        .find("--message-format <FMT>")
        .unwrap_or_else(|| panic!("{cmd}: no --message-format\n{text}"));
    text[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn message_format_says_the_same_thing_in_every_command() {
    let build = message_format_text("build");
    assert!(
        build.contains("on stdout for `build` and `check`, on stderr for `run`"),
        "{build}"
    );
    for cmd in ["check", "run"] {
        assert_eq!(message_format_text(cmd), build, "{cmd}");
    }
}

#[test]
fn top_level_help_points_to_the_documentation_by_path() {
    for flag in ["-h", "--help"] {
        let text = help(&[flag]);
        let docs = &text[text
            .find("Documentation:")
            .unwrap_or_else(|| panic!("{flag}: no Documentation:\n{text}"))..];
        let paths: Vec<&str> = docs
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with('/'))
            .collect();
        assert_eq!(paths.len(), 2, "{docs}");
        assert!(paths[0].ends_with("/README.md"), "{docs}");
        assert!(paths[1].ends_with("/docs/protocol-notes.md"), "{docs}");
        for p in &paths {
            assert!(std::path::Path::new(p).is_file(), "{p} does not exist");
        }
        // Every section it names is a heading of that README.
        let readme = std::fs::read_to_string(paths[0]).unwrap();
        let headings: Vec<&str> = readme
            .lines()
            .filter_map(|l| l.strip_prefix("## "))
            .collect();
        let sections = docs
            .split("sections:")
            .nth(1)
            .unwrap()
            .split(paths[1])
            .next()
            .unwrap()
            .split(',')
            .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>();
        assert!(sections.len() >= 6, "{sections:?}");
        for s in sections {
            assert!(
                headings.iter().any(|h| h.starts_with(&s)),
                "README has no `## {s}…` section; headings: {headings:?}"
            );
        }
    }
}

/// `new` and `init` say they end with a build, and group its options; `status` offers
/// `--follow` and says what it shows.
#[test]
fn new_init_and_status_help_name_the_first_build_and_follow() {
    for cmd in ["new", "init"] {
        let text = help(&[cmd, "--help"]);
        let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(
                "then build it once (`--no-build` skips) so the first host connect is warm"
            ),
            "{cmd}: {text}"
        );
        let g = groups(&text);
        let first_build = g
            .iter()
            .find(|(h, _)| h == "First Build")
            .map(|(_, o)| o.clone())
            .unwrap_or_else(|| panic!("{cmd}: no First Build group\n{text}"));
        assert_eq!(
            first_build,
            ["--no-build", "--offline", "--locked", "--frozen"],
            "{cmd}"
        );
    }
    let text = help(&["status", "--help"]);
    let options = groups(&text)
        .into_iter()
        .find(|(h, _)| h == "Options")
        .map(|(_, o)| o)
        .unwrap();
    for o in ["--follow", "--lines"] {
        assert!(options.iter().any(|x| x == o), "{o}: {text}");
    }
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("Ctrl-C stops"), "{text}");
    // `--lines` only with `--follow`, `--follow` not with `--json`.
    let out = Command::new(BIN)
        .args(["mcp-dev", "status", "--follow", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = Command::new(BIN)
        .args(["mcp-dev", "status", "-n", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
