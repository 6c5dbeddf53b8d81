//! The policy layer: what may run: approvals (grants, the gate), the policy a human accepted,
//! and catalog revisions.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod accepted;
pub mod approval;
pub mod catalog;
