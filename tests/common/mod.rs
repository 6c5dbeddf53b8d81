//! Helpers shared by the integration tests (one module per concern).

pub mod fixture;
pub mod rpc;
pub mod session;
