//! JSON-RPC plumbing between the host and the child: line framing and message envelopes.
//!
//! Owns bytes and ids, never decisions: whether a call is forwarded is decided by
//! [`crate::policy::approval`] through [`crate::session`].

pub mod envelope;
pub mod framing;
pub mod outlet;
pub mod scan;
