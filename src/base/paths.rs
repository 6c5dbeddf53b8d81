//! Where cargo mcp-dev keeps its files under the target directory (`<target>/mcp-dev/`).
//!
//! Owns names only; creating, locking and reading the files belongs to the modules that use them.

use std::path::{Path, PathBuf};

/// The `mcp-dev` directory inside a cargo target directory.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    pub fn new(target_dir: &Path) -> Self {
        Layout {
            root: target_dir.join("mcp-dev"),
        }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    /// Content-addressed, read-only copies of executables: `store/sha256-<hex>`.
    pub fn store_dir(&self) -> PathBuf {
        self.root.join("store")
    }
    /// Last recorded identity per label/profile (what `changed`/`unchanged` is relative to).
    pub fn identity_file(&self, label: &str, profile: &str) -> PathBuf {
        self.root
            .join("identity")
            .join(format!("{label}.{profile}.json"))
    }
    /// Last successful build's identity is kept in the same file; a failed build does not touch it.
    pub fn launch_dir(&self, label: &str) -> PathBuf {
        self.root.join("launch").join(label)
    }
    /// Machine-readable status of a running supervisor (for other tools and `approve`/`status`).
    pub fn status_file(&self, label: &str) -> PathBuf {
        self.root.join("status").join(format!("{label}.json"))
    }
    /// Default audit log.
    pub fn audit_log(&self, label: &str) -> PathBuf {
        self.root.join("audit").join(format!("{label}.jsonl"))
    }
    /// Server facts (initialize result, catalog) remembered to answer a cold handshake quickly.
    pub fn facts_file(&self, label: &str) -> PathBuf {
        self.root.join("facts").join(format!("{label}.json"))
    }
    /// Serialises builds of one target directory between supervisors (cargo would block anyway;
    /// this makes a probing second copy wait without starting a build of its own).
    pub fn build_lock(&self) -> PathBuf {
        self.root.join("build.lock")
    }
}
