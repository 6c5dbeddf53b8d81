#!/usr/bin/env bash
# Installs the real MCP peers that the end-to-end tests drive, at exact versions:
#   <peers>/py-mcp2   venv with mcp==2.3.0   (pins: e2e/peers/py-mcp2.txt)
#   <peers>/py-mcp1   venv with mcp==1.30.0  (pins: e2e/peers/py-mcp1.txt)
#   <peers>/node      npm ci of e2e/peers/package.json + package-lock.json
#                     (@modelcontextprotocol/sdk 1.32.2, client 2.4.0, inspector 0.15.0)
#                     plus the node client drivers from e2e/clients/ (copied on every run,
#                     because Node ESM resolves packages from the script's own folder)
# <peers> is $MCP_DEV_PEERS_DIR, default <repo>/target/e2e-peers.
#
# Idempotent: each piece has a stamp keyed on a hash of its pinned inputs and the interpreter
# version; a piece whose stamp matches is not touched, so a second run takes well under a second.
# Any failure exits non-zero with a message naming the step: a missing peer is an installation
# failure, never a skipped scenario.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
peers="${MCP_DEV_PEERS_DIR:-$repo/target/e2e-peers}"
python="${MCP_DEV_PYTHON:-python3}"
step="start"

fail() {
  echo "install-peers: FAILED: $*" >&2
  exit 1
}
trap 'echo "install-peers: FAILED during: $step (exit $?); peers dir: $peers" >&2' ERR

step="checking prerequisites"
bash "$here/check-prerequisites.sh" || fail "prerequisites missing (see the lines above)"

mkdir -p "$peers"
peers="$(cd "$peers" && pwd)"

# Concurrent test binaries may call this at once: one installs, the others wait and then see stamps.
exec 9>"$peers/.install.lock"
flock 9

# Hash of everything that decides what a piece contains.
stamp_of() {
  cat "$@" | sha256sum | cut -d' ' -f1
}

is_current() { # dir stamp
  [[ -f "$1/.e2e-peer-stamp" && "$(cat "$1/.e2e-peer-stamp")" == "$2" ]]
}

install_venv() { # name requirements-file expected-mcp-version
  local name="$1" reqs="$2" want="$3" dir="$peers/$1" stamp got
  step="python venv $name"
  stamp="$( { cat "$reqs"; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
  if is_current "$dir" "$stamp"; then
    echo "install-peers: $name up to date"
    return
  fi
  echo "install-peers: installing $name (mcp==$want) ..."
  rm -rf "$dir"
  "$python" -m venv "$dir" || fail "$step: '$python -m venv' failed (Debian: apt-get install python3-venv)"
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$reqs" \
    || fail "$step: pip install -r $reqs failed"
  got="$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("mcp"))')" \
    || fail "$step: mcp is not importable after install"
  [[ "$got" == "$want" ]] || fail "$step: installed mcp $got, expected $want"
  echo "$stamp" >"$dir/.e2e-peer-stamp"
}

install_node() {
  local dir="$peers/node" stamp v
  step="node peers"
  stamp="$( { cat "$here/peers/package.json" "$here/peers/package-lock.json"; node --version; } | sha256sum | cut -d' ' -f1)"
  if is_current "$dir" "$stamp"; then
    echo "install-peers: node peers up to date"
  else
    echo "install-peers: installing node peers (npm ci) ..."
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$here/peers/package.json" "$here/peers/package-lock.json" "$dir/"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || fail "$step: npm ci failed in $dir"
    for pkg in sdk:1.32.2 client:2.4.0 inspector:0.15.0; do
      v="$(node -p "require('$dir/node_modules/@modelcontextprotocol/${pkg%%:*}/package.json').version")" \
        || fail "$step: @modelcontextprotocol/${pkg%%:*} missing after npm ci"
      [[ "$v" == "${pkg#*:}" ]] || fail "$step: @modelcontextprotocol/${pkg%%:*} is $v, expected ${pkg#*:}"
    done
    [[ -x "$dir/node_modules/.bin/mcp-inspector" ]] || fail "$step: node_modules/.bin/mcp-inspector missing"
    echo "$stamp" >"$dir/.e2e-peer-stamp"
  fi
  # Always refresh the drivers: they change with the repo, the packages do not.
  step="copying node client drivers"
  cp "$here"/clients/*.mjs "$dir/"
}

started=$SECONDS
install_venv py-mcp2 "$here/peers/py-mcp2.txt" 2.3.0
install_venv py-mcp1 "$here/peers/py-mcp1.txt" 1.30.0
install_node
step="done"
echo "install-peers: ready in $peers ($((SECONDS - started)) s)"
