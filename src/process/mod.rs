//! The process layer: the server's processes: spawn, watch for exit, stop.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod supervisor;
