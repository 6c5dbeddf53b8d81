//! Execution epochs and launch records.
//!
//! An epoch is a ULID minted by the supervisor when it starts a child, never taken from anything
//! the server says. The launch record ties the epoch to exactly what was started. Pure: the
//! caller supplies time and randomness-free inputs (except [`mint`], which reads the clock).

use serde::{Deserialize, Serialize};

use crate::fingerprint::IdentityRecord;

/// A new epoch id (ULID: sortable by creation time, unique).
pub fn mint() -> String {
    ulid::Ulid::generate().to_string()
}

/// First 12 characters of an epoch, for prefixes on stderr.
pub fn short(epoch: &str) -> &str {
    &epoch[..epoch.len().min(12)]
}

/// What was started under one epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchRecord {
    pub epoch: String,
    pub label: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub cwd: String,
    pub identity_digest: String,
    pub executable_sha256: String,
    pub lockfile_sha256: Option<String>,
    pub dependency_tree_sha256: String,
    pub runtime: crate::fingerprint::Runtime,
    /// RFC 3339, milliseconds.
    pub started_at: String,
    /// The epoch this one replaced, if any.
    pub replaced: Option<String>,
    /// Why an older build runs instead of the newest one (`--fallback last-good`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl LaunchRecord {
    pub fn new(
        epoch: &str,
        pid: u32,
        record: &IdentityRecord,
        started_at: String,
        replaced: Option<String>,
    ) -> Self {
        LaunchRecord {
            epoch: epoch.to_string(),
            label: record.label.clone(),
            pid,
            argv: record.launch.argv.clone(),
            cwd: record.launch.cwd.clone(),
            identity_digest: record.identity_digest.clone(),
            executable_sha256: record.executable.sha256.clone(),
            lockfile_sha256: record.lockfile.as_ref().map(|l| l.sha256.clone()),
            dependency_tree_sha256: record.dependency_tree.sha256.clone(),
            runtime: record.runtime.clone(),
            started_at,
            replaced,
            fallback: None,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn epochs_are_unique_and_ordered() {
        let a = super::mint();
        let b = super::mint();
        assert_ne!(a, b);
        assert_eq!(a.len(), 26);
        assert!(a <= b || a[..10] == b[..10], "ULIDs sort by time");
        assert_eq!(super::short(&a).len(), 12);
    }
}
