#!/usr/bin/env bash
# Set up (packages, tokenizer files, Release build) and run the whole test
# suite; then build the test binaries with AddressSanitizer + UBSan in a build
# folder of their own (build-asan, with its own ccache) and run them again.
#
#   bash scripts/test.sh                   # everything (what CI runs)
#   SKIP_SANITIZE=1 bash scripts/test.sh   # the Release suite only
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${JOBS:-2}
log() { printf '\033[1m[test]\033[0m %s (%d min %02d s so far)\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)) >&2; }

SKIP_MODEL=1 bash scripts/setup.sh
log "Release build ready; running its tests"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$JOBS"
log "Release tests passed"
if [ -n "${SKIP_SANITIZE:-}" ]; then exit 0; fi

# ASan + UBSan: troupe's code instrumented, libtorch/OpenBLAS/CAF not.
# Only the test binaries and the troupe binary the CLI tests run are built.
ASAN_DIR=${ASAN_BUILD_DIR:-$ROOT/build-asan}
export CCACHE_DIR=${CCACHE_DIR:-$ASAN_DIR/.ccache}
cmake -S "$ROOT" -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=Release -DTROUPE_SANITIZE=ON >/dev/null
mapfile -t targets < <(cmake --build "$ASAN_DIR" --target help | grep -oE '\b[a-z]+_tests\b' | sort -u)
log "building ${targets[*]} with -fsanitize=address,undefined in $ASAN_DIR"
cmake --build "$ASAN_DIR" -j"$JOBS" --target "${targets[@]}"
log "sanitizer build ready; running its tests"
# Tests with a wall-clock bound (named ...IsFast / ...IsCheap) cannot hold under
# ASan's slowdown; issue 6 moves them to bench/, this skips them meanwhile.
ctest --test-dir "$ASAN_DIR" --output-on-failure -j"$JOBS" -E '(IsFast|IsCheap)$'
log "sanitizer tests passed"
