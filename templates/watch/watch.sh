#!/bin/sh
# Watch loops for the MCP server `{{label}}` with the tools you may already run. Each rebuilds on
# change through `cargo mcp-dev build --message-format json`, which prints one JSON event per
# build on stdout (`event`, `outcome`, `changed`, `identity`, …) for scripts and editors.
# Drop `--message-format json` to get the human status line on stderr instead.
#
#   mcp-dev/watch.sh               watchexec (https://github.com/watchexec/watchexec)
#   mcp-dev/watch.sh cargo-watch   cargo-watch (https://github.com/watchexec/cargo-watch)
#
# The current state is also written to target/mcp-dev/identity/ (and, while `cargo mcp-dev run`
# is up, target/mcp-dev/status/{{label}}.json).
set -eu
cd {{package_root_sh}}
case "${1:-watchexec}" in
  watchexec)
    exec watchexec --exts rs,toml,lock --ignore 'target/**' -- \
      cargo mcp-dev build --message-format json
    ;;
  cargo-watch)
    exec cargo watch --ignore 'target/**' -x 'mcp-dev build --message-format json'
    ;;
  *)
    echo "usage: $0 [watchexec|cargo-watch]" >&2
    exit 2
    ;;
esac
