#!/bin/sh
# MCP Inspector on `{{label}}`, started through `cargo mcp-dev run`.
#   mcp-dev/inspector.sh                                   web UI
#   mcp-dev/inspector.sh --cli --method tools/list         one request from the terminal
#   mcp-dev/inspector.sh --cli --method tools/call --tool-name NAME --tool-arg key=value ...
# The Inspector's own options (--cli, -e) go before `--`, the server command right after it and
# the method options last: a variadic option such as --tool-arg would otherwise swallow the
# server command. The Inspector gives the server a minimal environment: -e PATH=… puts cargo on
# it. The version is the one cargo mcp-dev is tested with.
cli=
for arg in "$@"; do
  shift
  if [ "$arg" = --cli ]; then cli=--cli; else set -- "$@" "$arg"; fi
done
exec npx --yes @modelcontextprotocol/inspector@0.15.0 $cli -e {{path_assign_sh}} -- \
  cargo mcp-dev run --manifest-path {{manifest_path_sh}} "$@"
