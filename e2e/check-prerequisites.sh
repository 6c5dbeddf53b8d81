#!/usr/bin/env bash
# Checks what must be on the machine before the tests can run (README: Prerequisites), before
# anything is installed or built, and says exactly what is missing and how to get it:
#   Rust toolchain   cargo and rustc, at least the rust-version in Cargo.toml
#   Node.js 20+      with npm (the TypeScript SDK peers and the Inspector CLI)
#   Python 3.10+     with a working venv module (the Python SDK peers)
#   sha256sum, flock (coreutils, util-linux: used by install-peers.sh)
# Prints one `prerequisites: …` line per problem and exits 1 if there is any; prints nothing
# and exits 0 otherwise. Called first by e2e/test-all.sh and e2e/install-peers.sh.
# MCP_DEV_PYTHON names another interpreter than python3 (as in install-peers.sh).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
python="${MCP_DEV_PYTHON:-python3}"
problems=0

say() {
  echo "prerequisites: $*" >&2
  problems=$((problems + 1))
}

# version_at_least HAVE WANT: dotted numeric versions, HAVE >= WANT.
version_at_least() {
  local IFS=.
  local -a have=($1) want=($2)
  local i
  for ((i = 0; i < ${#want[@]}; i++)); do
    local h="${have[i]:-0}" w="${want[i]:-0}"
    ((10#$h > 10#$w)) && return 0
    ((10#$h < 10#$w)) && return 1
  done
  return 0
}

rust_version="$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$repo/Cargo.toml" | head -n1)"
if ! command -v cargo >/dev/null 2>&1; then
  say "missing: cargo (the Rust toolchain, $rust_version or newer): install it with rustup (https://rustup.rs), then open a new shell"
elif ! rustc_line="$(rustc --version 2>/dev/null)"; then
  say "missing: rustc (the Rust toolchain, $rust_version or newer): install it with rustup (https://rustup.rs)"
else
  have="$(echo "$rustc_line" | sed -n 's/^rustc \([0-9][0-9.]*\).*/\1/p')"
  if ! version_at_least "$have" "$rust_version"; then
    say "too old: rustc $have; this project needs $rust_version or newer (rust-version in Cargo.toml): run \`rustup update stable\`"
  fi
fi

if ! command -v node >/dev/null 2>&1; then
  say "missing: node (Node.js 20 or newer, for the end-to-end tests): install it from https://nodejs.org or your package manager (Debian/Ubuntu: apt-get install nodejs npm)"
else
  have="$(node --version 2>/dev/null | sed -n 's/^v\([0-9][0-9.]*\).*/\1/p')"
  if ! version_at_least "${have:-0}" 20; then
    say "too old: node ${have:-(no version)}; the end-to-end tests need Node.js 20 or newer (https://nodejs.org)"
  fi
fi
if ! command -v npm >/dev/null 2>&1; then
  say "missing: npm (comes with Node.js; Debian/Ubuntu: apt-get install npm)"
fi

if ! command -v "$python" >/dev/null 2>&1; then
  say "missing: $python (Python 3.10 or newer with venv, for the end-to-end tests): Debian/Ubuntu: apt-get install python3 python3-venv (or set MCP_DEV_PYTHON)"
else
  have="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"
  if ! version_at_least "${have:-0}" 3.10; then
    say "too old: $python ${have:-(no version)}; the end-to-end tests need Python 3.10 or newer (or set MCP_DEV_PYTHON)"
  elif ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    say "$python $have has no working venv module (\`$python -m venv\` needs venv and ensurepip): Debian/Ubuntu: apt-get install python3-venv"
  fi
fi

command -v sha256sum >/dev/null 2>&1 || say "missing: sha256sum (coreutils): apt-get install coreutils"
command -v flock >/dev/null 2>&1 || say "missing: flock (util-linux): apt-get install util-linux"

if ((problems > 0)); then
  echo "prerequisites: $problems problem(s) above; nothing was installed or run (README.md, section Prerequisites)" >&2
  exit 1
fi
exit 0
