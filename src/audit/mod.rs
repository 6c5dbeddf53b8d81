//! The audit log: chained, sealed records that prove which code (execution epoch) handled every
//! call and who authorized it; verification; the session and activity journals.
//!
//! Owns: the record format ([`chain`], pure; type names in [`record_type`]), the errors
//! ([`error`]), the per-user key and the head anchors ([`keys`]), the append-only writer
//! ([`writer`]: one writer per log, group commit, fsync policy; its parts: the pure sealer
//! [`seal`] and the record [`clock`], the output [`sink`], the writer [`lock`], the open's
//! [`tail`] check, [`anchor`] updates, [`rotate`] and [`restore`]), the streaming line checks
//! and segment names ([`scan`]), the verifier ([`mod@verify`]), the start-of-run recovery
//! ([`recover`]), following a log ([`follow`]) and the journals ([`journal`]).
//!
//! The modules form a DAG (no import circles; a test, `tests_layers`, fails on one): leaves
//! first, `chain`, `record_type`, `clock` → `error`, `seal` → `keys`, `scan`, `records` →
//! `verify`, `follow`, `journal` and the writer's parts → `writer` → `recover`. This file only
//! declares and re-exports.
//! Must not touch: policy (whether a call is allowed is decided elsewhere; this module records the
//! decision), stdout, and other modules of the crate.
//!
//! A log is a JSONL file. Every line is one record:
//! `{"v":1,"seq":N,"time":…,"type":…,"run":…,"epoch":…|null,"prev":…,"data":{…},"hash":…,"mac":…}`.
//! `seq` is global to the log (across its runs and its segments); `prev` links to the previous
//! record's `hash`; `hash` covers a canonical encoding of the record (see [`chain`]); `mac` seals
//! the hash with a key kept outside the log (see [`keys`]), and the newest head is anchored
//! outside the log so that a truncated tail is detected.
//!
//! One process writes a log at a time (it holds the log's writer lock for its whole life; a
//! second writer is refused with [`AuditError::WriterBusy`]); successive runs append to the same
//! chain. A log grows into segments (`<stem>.00001.jsonl`, …, then the active `<stem>.jsonl`),
//! chained by [`record_type::SEGMENT_STARTED`] records. See [`writer`] for the writer's contract
//! (append / flush / commit) and what each [`FsyncPolicy`] survives.

mod anchor;
pub mod chain;
pub mod checkpoint;
pub mod clock;
pub mod error;
pub mod follow;
pub mod journal;
pub mod keys;
mod lock;
pub mod record_type;
pub mod records;
pub mod recover;
mod restore;
mod rotate;
pub mod scan;
mod seal;
mod sink;
mod tail;
#[cfg(test)]
mod tests_journal_ids;
#[cfg(test)]
mod tests_layers;
#[cfg(test)]
mod tests_planted_files;
pub mod verify;
pub mod writer;

pub use anchor::AnchorUpdate;
pub use chain::{
    AuditKey, ChainError, FORMAT_VERSION, GENESIS_PREV, Record, RecordData, anchor_mac,
    canonical_json, is_digest_hex, record_mac, verify_anchor_mac,
};
pub use clock::Moment;
pub use error::{AuditError, VerifyFailure};
pub use journal::{
    CallEntry, CallOutcome, ClientInfo, EpochEntry, GrantEntry, JournalView, Journals, RunEntry,
    SessionJournal,
};
pub use keys::{Anchor, HOME_ENV, KeyStore};
pub use record_type::*;
pub use recover::{Recovery, open_for_run, open_for_run_with, open_for_run_within};
pub use verify::{ChainBreak, SegmentReport, TornTailReport, VerifyReport, read_records, verify};
pub use writer::{
    ANCHOR_LAG, AppendedRecord, AuditLog, AuditOptions, DEFAULT_MAX_SEGMENT_BYTES, FsyncPolicy,
    ParseFsyncPolicyError, WRITER_LOCK_WAIT,
};
