//! Catalog revisions: numbers local to a run, changing only when the digest changes.
//! Owns: [`CatalogRevision`], [`CatalogHistory`]. Must not touch: I/O, authorization.

use serde::{Deserialize, Serialize};

use super::*;

/// A catalog revision: a number local to this run plus the digest it names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CatalogRevision {
    /// 1 for the first catalog seen, +1 for every *different* digest after it.
    #[serde(rename = "revision")]
    pub number: u64,
    pub digest: String,
}

/// Assigns revision numbers: a number changes only when the digest changes, so a restart that
/// serves the same catalog keeps its revision (and the host need not refetch).
#[derive(Debug, Clone, Default)]
pub struct CatalogHistory {
    current: Option<(CatalogRevision, Catalog)>,
}

impl CatalogHistory {
    pub fn new() -> CatalogHistory {
        CatalogHistory::default()
    }

    /// Records a freshly fetched catalog. Returns its revision and, when it replaced a catalog
    /// with a different digest, the diff from that one. The first observation and an unchanged
    /// digest return no diff.
    pub fn observe(&mut self, catalog: Catalog) -> (CatalogRevision, Option<CatalogDiff>) {
        match self.current.take() {
            Some((rev, old)) if old.digest() == catalog.digest() => {
                // Same digest: keep the revision, but hold the newest text (e.g. `_meta`).
                self.current = Some((rev.clone(), catalog));
                (rev, None)
            }
            Some((rev, old)) => {
                let changes = diff(&old, &catalog);
                let next = CatalogRevision {
                    number: rev.number + 1,
                    digest: catalog.digest().to_owned(),
                };
                self.current = Some((next.clone(), catalog));
                (next, Some(changes))
            }
            None => {
                let first = CatalogRevision {
                    number: 1,
                    digest: catalog.digest().to_owned(),
                };
                self.current = Some((first.clone(), catalog));
                (first, None)
            }
        }
    }

    pub fn current(&self) -> Option<&CatalogRevision> {
        self.current.as_ref().map(|(rev, _)| rev)
    }

    pub fn catalog(&self) -> Option<&Catalog> {
        self.current.as_ref().map(|(_, catalog)| catalog)
    }
}
