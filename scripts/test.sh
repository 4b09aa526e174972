#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j "${GMUX_JOBS:-$(nproc)}" --timeout 600
