#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, and runs the simulator on the
# reproduction scenarios, printing each comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
for s in scenarios/*.toml; do
  echo "=== gmux sim run $s"
  build/bin/gmux sim run "$s"
  echo
done
