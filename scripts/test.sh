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

# ASan + UBSan on the unit tests: troupe's code instrumented, libtorch /
# OpenBLAS / CAF not. The black-box suites (cli_tests, cluster_tests,
# chaos_tests: real processes, minutes each under ASan) ran above; here each unit
# test binary runs whole, in one process (one libtorch load, not one per
# test), two binaries at a time.
ASAN_DIR=${ASAN_BUILD_DIR:-$ROOT/build-asan}
export CCACHE_DIR=${CCACHE_DIR:-$ASAN_DIR/.ccache}
cmake -S "$ROOT" -B "$ASAN_DIR" -DCMAKE_BUILD_TYPE=Release -DTROUPE_SANITIZE=ON >/dev/null
mapfile -t targets < <(cmake --build "$ASAN_DIR" --target help | grep -oE '\b[a-z]+_tests\b' | sort -u \
  | grep -vxE 'cli_tests|cluster_tests|chaos_tests')
log "building ${targets[*]} with -fsanitize=address,undefined in $ASAN_DIR"
cmake --build "$ASAN_DIR" -j"$JOBS" --target "${targets[@]}"
log "sanitizer build ready; running its tests"
export OMP_WAIT_POLICY=PASSIVE GOMP_SPINCOUNT=3000 ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
mkdir -p "$ASAN_DIR/logs"
# Left out here, as they ran above: the black-box tests of real troupe processes in the unit binaries
# (HttpFront.*: serve processes, curl, node; CliSimulate.* and CliProfile.*: troupe simulate/profile runs,
# minutes under ASan, whose code the in-process simulator tests run here) and TokenizerVsTiktoken.* (27 MB of
# text through node and the tokenizer). http_tests' unit tests (OpenAI mapping, Prometheus), HttpHostile.*
# (raw sockets against an instrumented troupe: the event loop under ASan) and loadgen_tests (the load
# generator against stand-in servers) run here. The longest binaries start first and model_tests (~5 min
# under ASan) runs as two shards, so the two CPUs end together.
jobs=("model_tests 0 2" "model_tests 1 2" "sim_tests 0 1" "http_tests 0 1")
for t in "${targets[@]}"; do
  case "$t" in model_tests | sim_tests | http_tests) ;; *) jobs+=("$t 0 1") ;; esac
done
printf '%s\n' "${jobs[@]}" | xargs -P "$JOBS" -L 1 sh -c \
  'GTEST_SHARD_INDEX=$2 GTEST_TOTAL_SHARDS=$3 "$0/$1" --gtest_brief=1 \
     --gtest_filter="-HttpFront.*:TokenizerVsTiktoken.*:CliSimulate.*:CliProfile.*" >"$0/logs/$1.$2.log" 2>&1 \
   && echo "  $1 (shard $(($2 + 1)) of $3): passed" \
   || { echo "  $1 (shard $(($2 + 1)) of $3): FAILED (log follows)"; tail -n 80 "$0/logs/$1.$2.log"; exit 255; }' "$ASAN_DIR"
log "sanitizer tests passed"
