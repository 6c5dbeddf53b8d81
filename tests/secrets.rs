//! Credential values never leave the environment: a known secret carried by a credential scope
//! and a declared identity env var is used through a whole session (approve with the scope,
//! gated call, rebuild, status, audit), then every file cargo mcp-dev wrote is searched for it.

// Tests plant links, fifos and files with std; only the library is held to `crate::base::beneath`.
#![allow(clippy::disallowed_methods)]

mod common;

use std::path::Path;

use common::session::Setup;
use serde_json::json;

const SECRET: &str = "s3cr3t-TOKEN-value-7f1e2d";
const MODE_SECRET: &str = "mode-secret-4a9b";

fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            // Compiler output holds no file of ours; everything we write lives under mcp-dev/.
            if p.file_name()
                .is_some_and(|n| n == "debug" || n == "release")
            {
                continue;
            }
            files_under(&p, out);
        } else if ft.is_file() {
            out.push(p);
        }
    }
}

#[test]
fn secret_values_appear_in_no_file_the_tool_writes() {
    let mut s = Setup::new()
        .env("INVENTORY_API_TOKEN", SECRET)
        .env("MODE", MODE_SECRET)
        .config(
            r#"env = ["MODE"]
[package.metadata.mcp-dev.credential-scopes.inventory-api-staging]
env = ["INVENTORY_API_TOKEN"]
tools = ["write"]
"#,
        )
        .start();
    let (_, epoch) = s.ready_legacy();

    // Denied first: the payload names the scope, never its value.
    let m = s.call("1", "write", json!({"marker": "a"}));
    let denial = m.tool_error_payload();
    assert_eq!(
        denial["error"],
        json!("authorization_required"),
        "{}",
        m.raw
    );
    assert_eq!(
        denial["credentialScopes"],
        json!(["inventory-api-staging"]),
        "{}",
        m.raw
    );
    assert!(!m.raw.contains(SECRET));

    // Approving the tool without its scope is refused; with it, the call goes through.
    let r = s.cli(&[
        "approve",
        "--yes",
        "--tool",
        "write",
        "--credential-scope",
        "nope",
    ]);
    assert_ne!(r.code, 0, "an unknown scope must be refused: {}", r.stderr);
    let r = s.cli(&["approve", "--yes", "--tool", "write"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("credential scope inventory-api-staging (env INVENTORY_API_TOKEN)"),
        "{}",
        r.stderr
    );
    let m = s.call("2", "write", json!({"marker": "a"}));
    assert!(
        m.result().get("isError").is_none() || m.result()["isError"] == json!(false),
        "{}",
        m.raw
    );
    let st = s.cli(&["status", "--json"]);
    assert_eq!(st.code, 0, "{}", st.stderr);
    let status: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(
        status["grants"][0]["credentialScope"],
        json!(["inventory-api-staging"])
    );
    assert_eq!(status["server"]["epoch"], json!(epoch));
    let identity = s.cli(&["identity", "--no-build", "--json"]);
    assert_eq!(identity.code, 0, "{}", identity.stderr);
    assert!(
        identity.stdout.contains("\"MODE\""),
        "the env var is named in identity"
    );

    let stderr = s.stderr_lines().join("\n");
    let mut files = Vec::new();
    files_under(&s.project.target_dir().join("mcp-dev"), &mut files);
    files_under(&s.project.home, &mut files);
    files_under(&s.project.root, &mut files);
    let contents: Vec<(String, Vec<u8>)> = files
        .iter()
        .map(|p| {
            (
                p.display().to_string(),
                std::fs::read(p).unwrap_or_default(),
            )
        })
        .collect();
    s.finish();

    assert!(
        !stderr.contains(SECRET) && !stderr.contains(MODE_SECRET),
        "status lines leak a secret"
    );
    for out in [&st.stdout, &identity.stdout, &r.stdout, &r.stderr] {
        assert!(!out.contains(SECRET) && !out.contains(MODE_SECRET));
    }
    let names: Vec<String> = contents.iter().map(|(n, _)| n.clone()).collect();
    for must in ["audit", "identity", "status", "launch", "facts"] {
        assert!(
            names.iter().any(|n| n.contains(&format!("/{must}/"))),
            "no {must} file written? {names:?}"
        );
    }
    for (name, bytes) in &contents {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(SECRET),
            "{name} contains the credential value"
        );
        assert!(
            !text.contains(MODE_SECRET),
            "{name} contains the identity env value"
        );
    }
}
