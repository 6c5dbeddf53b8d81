//! The identity layer: what is running: the package and its config, the build, the fingerprint, the
//! content-addressed store and the epochs minted from an identity.
//!
//! It imports only from its own layer and the ones below it (see `tests/layers.rs`).

pub mod build;
pub mod capture;
pub mod config;
pub mod cycle;
pub mod epoch;
pub mod fingerprint;
pub mod store;
pub mod workspace;
