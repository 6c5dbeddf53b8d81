#!/bin/sh
# MCP Inspector on `{{label}}`, started through `cargo mcp-dev run`.
#   mcp-dev/inspector.sh                                  web UI
#   mcp-dev/inspector.sh --cli --method tools/list        one request from the terminal
# Inspector gives the server a minimal environment: -e PATH=… puts cargo on it.
exec npx @modelcontextprotocol/inspector "$@" -e {{path_assign_sh}} -- \
  cargo mcp-dev run --manifest-path {{manifest_path_sh}}
