//! Execution epochs and launch records.
//!
//! An epoch is a ULID minted by the supervisor when it starts a child, never taken from anything
//! the server says. The launch record ties the epoch to exactly what was started. Pure: the
//! caller supplies time and randomness-free inputs (except [`mint`], which reads the clock).

use serde::{Deserialize, Serialize};

use crate::identity::fingerprint::IdentityRecord;

/// Declares a string newtype for an identifier: serialized as the plain string (the wire and
/// the audit log do not change), compared with `&str`, shown as itself.
macro_rules! id_newtype {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                $name(s)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                $name(s.to_string())
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

id_newtype!(
    /// An execution epoch: minted by the supervisor when it starts a server, never taken from
    /// anything the server says.
    EpochId
);
id_newtype!(
    /// An agent run: one host connection of one `run`.
    AgentRunId
);
id_newtype!(
    /// A grant a human issued.
    GrantId
);

/// A new epoch id (ULID: sortable by creation time, unique).
pub fn mint() -> String {
    ulid::Ulid::generate().to_string()
}

/// First 12 characters of an epoch, for prefixes on stderr.
pub fn short(epoch: &str) -> &str {
    crate::screen::sanitize::first_chars(epoch, 12)
}

/// What was started under one epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LaunchRecord {
    pub epoch: EpochId,
    pub label: String,
    pub pid: u32,
    pub argv: Vec<String>,
    pub cwd: String,
    pub identity_digest: String,
    pub executable_sha256: String,
    pub lockfile_sha256: Option<String>,
    pub dependency_tree_sha256: String,
    pub runtime: crate::identity::fingerprint::Runtime,
    /// RFC 3339, milliseconds.
    pub started_at: String,
    /// The epoch this one replaced, if any.
    pub replaced: Option<EpochId>,
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
        replaced: Option<EpochId>,
    ) -> Self {
        LaunchRecord {
            epoch: EpochId::from(epoch),
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
