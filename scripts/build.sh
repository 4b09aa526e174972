#!/usr/bin/env bash
# Configures and builds gmux into build/ (Release with debug info). Extra args go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${GMUX_JOBS:-$(nproc)}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMUX_WERROR=ON "$@" >/dev/null
cmake --build build -j "$jobs"
