//! The base layer: errors and exit codes, paths, hashing and the canonical encoding, the guarded
//! file helpers and the platform seam (`sys`).
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod beneath;
pub mod canonical;
pub mod error;
pub mod exit_codes;
pub mod fsutil;
pub mod hashing;
pub mod paths;
pub mod sys;
