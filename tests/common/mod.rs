//! Helpers shared by the integration tests (one module per concern).

pub mod fixture;
pub mod pty;
pub mod rpc;
pub mod session;
