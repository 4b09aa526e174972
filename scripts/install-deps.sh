#!/usr/bin/env bash
# Installs every Debian package gmux needs to build, test, benchmark and run its demos.
# Idempotent; safe to run on a fresh Debian 12 machine as root (or with sudo available).
set -euo pipefail

packages=(
  # toolchain; dpkg-dev's dpkg-shlibdeps fills in the Debian package's Depends (cpack -G DEB)
  build-essential cmake ninja-build pkg-config git dpkg-dev
  # core / sim / CLI (ncurses: the live view of `gmux top`)
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libncurses-dev
  # tests and benchmarks (tmux: `gmux top`'s test drives the live view in a detached session)
  googletest libgtest-dev libgmock-dev libbenchmark-dev librapidcheck-dev tmux
  # sanitizer and fuzz stages of scripts/test.sh: gcc's sanitizer runtimes come with gcc; the
  # fuzz targets need clang with libFuzzer, and llvm-symbolizer names the frames of its reports
  clang-14 libclang-rt-14-dev llvm-14
  # plots
  gnuplot-nox
  # runtime: OpenCL loader, headers, PoCL, wire schema, networking, ledger, metrics
  ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers opencl-clhpp-headers pocl-opencl-icd
  clinfo clpeak
  capnproto libcapnp-dev libasio-dev libsqlite3-dev libcpp-httplib-dev
  # the worker's allocator (docs/performance.md, "The worker's allocator")
  libjemalloc-dev
  # TLS for the TCP transport (OpenSSL through Asio); the openssl tool makes the tests' certificates
  libssl-dev openssl
  # the cluster test bed (scripts/slurm-testbed.sh): a one-node Slurm with munge
  munge slurmctld slurmd slurm-client
  # frame agent (vGASA): GL/EGL headers; its tests and `gmux demo frames` run GL programs on
  # Mesa's llvmpipe under Xvfb
  libgl-dev libegl-dev libgles-dev libx11-dev xvfb xauth mesa-utils libgl1-mesa-dri
  libegl-mesa0 glmark2-x11 glmark2-es2-x11
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
else
  echo "install-deps: all packages present"
fi
