#!/usr/bin/env bash
# Set up (packages, tokenizer files, build) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
SKIP_MODEL=1 bash scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2
