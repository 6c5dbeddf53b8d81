//! The wire layer: JSON-RPC on the wire: framing, envelopes, the outlet and the scanner.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod proxy;
