#!/usr/bin/env bash
# The one test command (README, .ci/run): installs the pinned MCP peers (Python SDK 2.x and 1.x,
# TypeScript SDK v1 and client v2, Inspector CLI) and agent hosts (Claude Code, Codex CLI, Gemini
# CLI, e2e/install-hosts.sh) into target/e2e-peers, then runs every test:
# unit, property, integration (fake server) and end-to-end (real rmcp server, real SDK clients),
# then the newcomer test (e2e/newcomer.sh). The prerequisites are checked first; a macOS
# type check (e2e/check-macos.sh) runs before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
# What must be on the machine, checked before anything is installed or built.
bash e2e/check-prerequisites.sh
echo "==> installing MCP peers (pinned; instant when already installed)" >&2
bash e2e/install-peers.sh
echo "==> installing agent hosts: Claude Code, Codex CLI, Gemini CLI (pinned; instant when already installed)" >&2
bash e2e/install-hosts.sh
echo "==> macOS type check (Linux first, macOS not precluded)" >&2
bash e2e/check-macos.sh
echo "==> cargo test (unit, property, integration, end-to-end)" >&2
cargo test --locked --no-fail-fast -- --test-threads="${MCP_DEV_TEST_THREADS:-2}"
echo "==> newcomer test (fresh clone, the README's install and demo commands as written)" >&2
bash e2e/newcomer.sh
echo "==> all tests passed in $(( $(date +%s) - started )) s" >&2
