#!/usr/bin/env bash
# macOS must not be precluded (Linux is the first platform): the crate, its tests and benches
# type-check and pass clippy for x86_64-apple-darwin. Nothing is linked or run (no macOS SDK
# here); what this catches is Linux-only code outside the `src/base/sys` seams. Installs the target's
# standard library with rustup when it is missing (once; instant after). Without rustup (a
# distribution's cargo), or with MCP_DEV_SKIP_MACOS_CHECK=1, it says so and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
target=x86_64-apple-darwin
if [[ "${MCP_DEV_SKIP_MACOS_CHECK:-0}" == 1 ]]; then
  echo "macOS check: SKIPPED (MCP_DEV_SKIP_MACOS_CHECK=1)" >&2
  exit 0
fi
if ! command -v rustup >/dev/null; then
  echo "macOS check: SKIPPED (no rustup to install the $target standard library)" >&2
  exit 0
fi
if ! rustup target list --installed | grep -qx "$target"; then
  rustup target add "$target" >&2 || {
    echo "macOS check: could not install the $target target (offline?); set MCP_DEV_SKIP_MACOS_CHECK=1 to skip it" >&2
    exit 1
  }
fi
cargo clippy --locked --all-targets --target "$target" -- -D warnings
echo "macOS check: the crate, tests and benches type-check for $target" >&2
