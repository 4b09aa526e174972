#!/usr/bin/env bash
# The README's main job: installs dependencies, builds, then
#  1. starts a private gmuxd on real PoCL and runs OpenCL tenants (separate uids) through the
#     gmux ICD, printing each tenant's results;
#  2. runs the simulator on every reproduction scenario, printing each comparison table.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
echo "=== gmuxd + gmux ICD: several tenants on real OpenCL (PoCL)"
build/bin/gmux-demo-tenants --tenants 3
echo
for s in scenarios/*.toml; do
  echo "=== gmux sim run $s"
  build/bin/gmux sim run "$s"
  echo
done
