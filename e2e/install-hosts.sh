#!/usr/bin/env bash
# Installs the real agent hosts that tests/e2e/hosts.rs drives, at exact versions, from the npm
# registry only (each host's native binary ships inside a registry package; nothing else is
# downloaded):
#   <peers>/hosts/claude-2.1.337   @anthropic-ai/claude-code 2.1.337 (native binary; runs without Node 22)
#   <peers>/hosts/claude-2.1.197   @anthropic-ai/claude-code 2.1.197
#   <peers>/hosts/codex-0.171.0    @openai/codex 0.171.0 (native binary)
#   <peers>/hosts/gemini-0.61.0    @google/gemini-cli 0.61.0 (Node 20+)
# each an `npm ci` of e2e/hosts/packages/<name>/{package.json,package-lock.json}.
# <peers> is $MCP_DEV_PEERS_DIR, default <repo>/target/e2e-peers. On Linux, bubblewrap and socat
# (Claude Code's sandbox) come from the distribution's packages, installed when missing.
#
# Idempotent: each host has a stamp keyed on a hash of its package.json, its lock and the Node
# version, checked together with the host's own `--version`; a current host is not touched, so
# a second run takes about a second. Any failure exits non-zero naming the step: a missing host is
# an installation failure, never a skipped scenario. Cold install: ~1.2 GB, ~1 min.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
peers="${MCP_DEV_PEERS_DIR:-$repo/target/e2e-peers}"
step="start"

fail() {
  echo "install-hosts: FAILED: $*" >&2
  exit 1
}
trap 'echo "install-hosts: FAILED during: $step (exit $?); hosts dir: $peers/hosts" >&2' ERR

step="checking node and npm"
command -v node >/dev/null || fail "node is not on PATH (Node 20+ with npm is needed)"
command -v npm >/dev/null || fail "npm is not on PATH"
major="$(node -p 'process.versions.node.split(".")[0]')"
((major >= 20)) || fail "Node $(node --version) is too old: Gemini CLI needs Node 20+"

# Claude Code's sandbox on Linux (tests/e2e/hosts_sandbox.rs) needs bubblewrap and socat, from
# the distribution's packages: installed here when missing (as root with apt-get), else a failure
# that says what to install. bwrap must also be able to make its namespaces on this machine.
if [[ "$(uname -s)" == Linux ]]; then
  step="sandbox tools (bubblewrap, socat)"
  if ! command -v bwrap >/dev/null || ! command -v socat >/dev/null; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
      echo "install-hosts: installing bubblewrap and socat (apt-get) ..."
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap socat >/dev/null 2>&1 \
        || { apt-get update >/dev/null 2>&1 \
          && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends bubblewrap socat >/dev/null; } \
        || fail "$step: apt-get install bubblewrap socat failed"
    else
      fail "$step: bwrap and socat must be on PATH (Debian/Ubuntu: sudo apt-get install bubblewrap socat)"
    fi
  fi
  bwrap --unshare-all --ro-bind / / true 2>/dev/null \
    || fail "$step: 'bwrap --unshare-all --ro-bind / / true' fails here (user namespaces disabled?): Claude Code's sandbox cannot run"
fi

mkdir -p "$peers/hosts"
peers="$(cd "$peers" && pwd)"
exec 9>"$peers/.install-hosts.lock"
flock 9

# name  binary-in-node_modules/.bin  expected --version output (a substring)
hosts=(
  "claude-2.1.337 claude 2.1.337 (Claude Code)"
  "claude-2.1.197 claude 2.1.197 (Claude Code)"
  "codex-0.171.0 codex codex-cli 0.171.0"
  "gemini-0.61.0 gemini 0.61.0"
)

version_of() { # dir bin
  if [[ "$2" == gemini ]]; then
    # A Node script: run it with the node on PATH (its shebang says `node` too).
    (cd "$1" && timeout 60 node node_modules/.bin/gemini --version 2>/dev/null)
  else
    (cd "$1" && HOME="$1" timeout 60 "node_modules/.bin/$2" --version 2>/dev/null)
  fi
}

started=$SECONDS
for entry in "${hosts[@]}"; do
  read -r name bin want <<<"$entry"
  src="$here/hosts/packages/$name"
  dir="$peers/hosts/$name"
  step="host $name"
  [[ -f "$src/package.json" && -f "$src/package-lock.json" ]] || fail "$step: $src has no package.json + package-lock.json"
  stamp="$( { cat "$src/package.json" "$src/package-lock.json"; node --version; } | sha256sum | cut -d' ' -f1)"
  if [[ -f "$dir/.e2e-host-stamp" && "$(cat "$dir/.e2e-host-stamp")" == "$stamp" ]] \
    && [[ "$(version_of "$dir" "$bin" || true)" == *"$want"* ]]; then
    echo "install-hosts: $name up to date"
    continue
  fi
  echo "install-hosts: installing $name (npm ci) ..."
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false) \
    || fail "$step: npm ci failed in $dir"
  got="$(version_of "$dir" "$bin")" || fail "$step: '$bin --version' failed after install"
  [[ "$got" == *"$want"* ]] || fail "$step: '$bin --version' says '$got', expected '$want'"
  echo "$stamp" >"$dir/.e2e-host-stamp"
done
step="done"
echo "install-hosts: ready in $peers/hosts ($((SECONDS - started)) s)"
