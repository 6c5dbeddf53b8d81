//! Thin binary: all behaviour lives in the library so tests can drive it directly.
fn main() {
    std::process::exit(cargo_mcp_dev::main_entry());
}
