#!/usr/bin/env bash
# The newcomer test: the first hour with cargo mcp-dev, following only the README.
#
#   1. a fresh clone of this repository in a temporary directory;
#   2. the prerequisite check, with a tool taken off PATH (node) and python3 without venv: the
#      test script must stop at once with the exact lines, having installed nothing;
#   3. the README's install commands, extracted from its `## Install` section (never copied
#      here) and run exactly as written in the clone;
#   4. the demo's output: every step and status line in the order things happened, and no
#      compiler warning from the install or the demo.
#
# Kept fast by reusing one target directory between runs (CARGO_TARGET_DIR, which both
# `cargo install` and `cargo mcp-dev demo` honour): by default the e2e fixture's, where rmcp is
# already compiled. The install goes to a temporary root (CARGO_INSTALL_ROOT), put first on PATH,
# never to ~/.cargo/bin. The clone holds what is committed (HEAD): commit before running it.
# Run by e2e/test-all.sh after `cargo test`; on its own: `bash e2e/newcomer.sh`.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
target="${MCP_DEV_NEWCOMER_TARGET_DIR:-$repo/target/e2e-fixture-target}"
mkdir -p "$target"
target="$(cd "$target" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/cargo-mcp-dev-newcomer.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
started=$SECONDS
checks=0

say() { echo "newcomer: $*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}
ok() {
  checks=$((checks + 1))
  say "ok: $* ($((SECONDS - started)) s)"
}

# ---------------------------------------------------------------------------- 1. fresh clone
if [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
  say "note: uncommitted changes in $repo are not in the clone (it tests HEAD)"
fi
git clone --quiet --no-hardlinks "$repo" "$tmp/clone" || fail "git clone $repo"
clone="$tmp/clone"
[[ -f "$clone/README.md" && -f "$clone/Cargo.lock" ]] || fail "the clone has no README.md or Cargo.lock"
ok "fresh clone in $clone"

# --------------------------------------------------------------- 2. prerequisites, via PATH
real_python="$(python3 -c 'import sys; print(sys.executable)')"
# machine DIR [HIDDEN...]: a bin dir with the tools the scripts use, minus HIDDEN.
machine() {
  local dir="$1" tool path
  shift
  mkdir -p "$dir"
  for tool in bash sed head dirname date cat cut env mkdir rm cp sort tr \
    cargo rustc node npm python3 sha256sum flock; do
    [[ " $* " == *" $tool "* ]] && continue
    if [[ "$tool" == python3 ]]; then
      path="$real_python"
    else
      path="$(command -v "$tool")" || fail "this test needs $tool installed"
    fi
    ln -s "$path" "$dir/$tool"
  done
}
# expect_stop BIN LINE...: test-all.sh on that PATH exits 1 with exactly these problem lines.
expect_stop() {
  local bin="$1" out code=0 expected got
  shift
  out="$(env PATH="$bin" MCP_DEV_PEERS_DIR="$tmp/peers" "$bin/bash" "$clone/e2e/test-all.sh" 2>&1 </dev/null)" || code=$?
  [[ "$code" == 1 ]] || fail "test-all.sh with $bin exited $code, not 1:"$'\n'"$out"
  expected="$(printf '%s\n' "$@" "prerequisites: $# problem(s) above; nothing was installed or run (README.md, section Prerequisites)")"
  got="$(grep '^prerequisites: ' <<<"$out" || true)"
  [[ "$got" == "$expected" ]] || fail "prerequisite lines differ"$'\n'"expected:"$'\n'"$expected"$'\n'"got:"$'\n'"$out"
  [[ ! -e "$tmp/peers" ]] || fail "test-all.sh installed peers although a prerequisite was missing"
  ! grep -q '==> cargo test' <<<"$out" || fail "test-all.sh ran the tests although a prerequisite was missing"
}

machine "$tmp/no-node" node
expect_stop "$tmp/no-node" \
  "prerequisites: missing: node (Node.js 20 or newer, for the end-to-end tests): install it from https://nodejs.org or your package manager (Debian/Ubuntu: apt-get install nodejs npm)"
ok "without node, test-all.sh names it and how to get it, and installs nothing"

machine "$tmp/no-venv" python3
py_version="$("$real_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
cat >"$tmp/no-venv/python3" <<EOF
#!/bin/sh
case "\$*" in *ensurepip*) echo "No module named 'ensurepip'" >&2; exit 1;; esac
exec '$real_python' "\$@"
EOF
chmod +x "$tmp/no-venv/python3"
expect_stop "$tmp/no-venv" \
  "prerequisites: python3 $py_version has no working venv module (\`python3 -m venv\` needs venv and ensurepip): Debian/Ubuntu: apt-get install python3-venv"
ok "python3 without venv is named with the package to install"

# The README quotes the same message.
readme_flat="$(tr '\n' ' ' <"$clone/README.md" | tr -s ' ')"
[[ "$readme_flat" == *'`prerequisites: missing: node (Node.js 20 or newer, for the end-to-end tests): …`'* ]] \
  || fail "README's Prerequisites section does not quote the missing-node line"
ok "the README quotes the message the script prints"

# ------------------------------------------------- 3. the README's install commands, as written
commands="$(awk '
  /^## Install/ { in_section = 1; next }
  in_section && /^## / { exit }
  in_section && /^```sh$/ { in_block = 1; next }
  in_block && /^```$/ { exit }
  in_block { print }
' "$clone/README.md" | sed -e 's/[[:space:]]#.*$//' -e '/^[[:space:]]*$/d')"
[[ -n "$commands" ]] || fail "no sh block in the README's Install section"
grep -q '^cargo install ' <<<"$commands" || fail "the README's install block has no cargo install:"$'\n'"$commands"
grep -q '^cargo mcp-dev demo' <<<"$commands" || fail "the README's install block has no demo:"$'\n'"$commands"
say "README install commands:"$'\n'"$commands"

mkdir -p "$tmp/root/bin" "$tmp/home"
n=0
while IFS= read -r command; do
  n=$((n + 1))
  log="$tmp/command-$n.log"
  say "running \`$command\` in the clone"
  (
    cd "$clone"
    export PATH="$tmp/root/bin:$PATH" CARGO_INSTALL_ROOT="$tmp/root" CARGO_TARGET_DIR="$target" \
      CARGO_MCP_DEV_HOME="$tmp/home" CARGO_TERM_COLOR=never
    timeout 1800 bash -c "$command"
  ) >"$log" 2>&1 </dev/null || {
    tail -n 60 "$log" >&2
    fail "\`$command\` failed (log above)"
  }
  # No compiler warning: cargo's summary line, or a diagnostic with its location.
  if grep -nE '^[[:space:]]*warning: `[^`]+` \(.*\) generated [0-9]+ warnings?' "$log" >&2 \
    || awk '/^[[:space:]]*warning: / { w = $0; next } w && /^[[:space:]]*--> / { print w; found = 1 } { w = "" } END { exit !found }' "$log" >&2; then
    fail "\`$command\` printed a compiler warning (log: the lines above)"
  fi
  ok "\`$command\` ran with no compiler warning"
  case "$command" in
    "cargo install "*)
      [[ -x "$tmp/root/bin/cargo-mcp-dev" ]] || fail "cargo install did not put cargo-mcp-dev in the install root"
      ;;
    "cargo mcp-dev demo"*) demo_log="$log" ;;
  esac
done <<<"$commands"

# ------------------------------------------------------------ 4. the demo, in the right order
[[ -n "${demo_log:-}" ]] || fail "the demo did not run"
grep -q 'demo complete: every step behaved as narrated' "$demo_log" || fail "the demo did not complete"
epoch_a="$(sed -n 's/.*server started: pid=[0-9]* epoch=\([0-9A-Z]*\).*/\1/p' "$demo_log" | head -n1)"
epoch_b="$(sed -n 's/.*server replaced: pid=[0-9]* epoch=\([0-9A-Z]*\).*/\1/p' "$demo_log" | head -n1)"
[[ -n "$epoch_a" && -n "$epoch_b" ]] || fail "no start or replace line in the demo"
line=0
while IFS= read -r marker; do
  marker="${marker//EPOCH_A/$epoch_a}"
  marker="${marker//EPOCH_B/$epoch_b}"
  at="$(tail -n "+$((line + 1))" "$demo_log" | grep -n -F -m1 -- "$marker" | cut -d: -f1 || true)"
  if [[ -z "$at" ]]; then
    cat "$demo_log" >&2
    fail "demo: \`$marker\` missing or out of order (after line $line)"
  fi
  line=$((line + at))
done <<'EOF'
[1] creating a small rmcp server
server started: pid=
] listing tools
call denied: add_note (authorization_required)
denied: {
approved: add_note for epoch EPOCH_A 
grant 
result: {"saved":true}
server replaced: pid=
catalog changed: revision 2
call denied: add_note (catalog_stale)
"error":"catalog_stale"
call denied: add_note (authorization_stale)
"error":"authorization_stale"
approved: add_note for epoch EPOCH_B 
result: {"saved":true}
] closing the connection
verified 
demo complete: every step behaved as narrated
EOF
ok "the demo's lines are in the order things happened"

say "$checks passed, 0 failed in $((SECONDS - started)) s"
