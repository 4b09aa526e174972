#!/usr/bin/env bash
# Khronos OpenCL-CTS natively and through gmux, side by side (docs/conformance.md has results).
#
#   scripts/cts.sh CTS_SOURCE [SUITE...]
#
# CTS_SOURCE is a source tree of KhronosGroup/OpenCL-CTS at tag v2023-05-16-00 (a checkout, or a
# git directory holding that tag). It is copied, without test_conformance/spir (large archives a
# snapshot may lack), to a build directory outside this repository, built against the system's
# OpenCL headers and ocl-icd loader, and the chosen suites run twice: on PoCL alone, then through
# gmux's ICD against a gmuxd of this checkout's build (build/, `bash scripts/build.sh`). Not part
# of CI: it needs the CTS tree and takes tens of minutes on 2 cores.
#
# Suites (default: all but images-full): api basic buffers events profiling computeinfo
# mem_host_flags multiple_device_context images (clGetInfo, and clReadWriteImage, clCopyImage
# and clFillImage with small_images), images-full (every image program, full size).
#
# Environment: CTS_BUILD (default /tmp/gmux-cts) the build and log directory; GMUX_BUILD
# (default build) this checkout's build; CTS_JOBS build parallelism (default nproc); CTS_RUNS
# (default "native gmux") which sides to run now: a side left out is read from its last log, if
# any (for example the native side once, then only gmux after each change).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

usage() {
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}
[ $# -ge 1 ] || usage
case "$1" in -h | --help) usage ;; esac
src="$1"
shift
suites=("$@")
[ ${#suites[@]} -gt 0 ] ||
  suites=(api basic buffers events profiling computeinfo mem_host_flags multiple_device_context images)
work="${CTS_BUILD:-/tmp/gmux-cts}"
gbuild="$(cd "${GMUX_BUILD:-build}" && pwd)"
jobs="${CTS_JOBS:-$(nproc)}"
runs="${CTS_RUNS:-native gmux}"
tag=v2023-05-16-00

# suite -> "source dir|CMake target|arguments", one line per program of the suite.
programs() {
  case "$1" in
    api) echo "api|test_api|" ;;
    basic) echo "basic|test_basic|" ;;
    buffers) echo "buffers|test_buffers|" ;;
    events) echo "events|test_events|" ;;
    profiling) echo "profiling|test_profiling|" ;;
    computeinfo) echo "computeinfo|test_computeinfo|" ;;
    mem_host_flags) echo "mem_host_flags|test_mem_host_flags|" ;;
    multiple_device_context) echo "multiple_device_context|test_multiples|" ;;
    images)
      echo "images/clGetInfo|test_cl_get_info|"
      echo "images/clReadWriteImage|test_cl_read_write_images|small_images"
      echo "images/clCopyImage|test_cl_copy_images|small_images"
      echo "images/clFillImage|test_cl_fill_images|small_images"
      ;;
    images-full)
      for p in clGetInfo:test_cl_get_info clReadWriteImage:test_cl_read_write_images \
        clCopyImage:test_cl_copy_images clFillImage:test_cl_fill_images \
        kernel_image_methods:test_kernel_image_methods kernel_read_write:test_image_streams \
        samplerlessReads:test_samplerless_reads; do
        echo "images/${p%%:*}|${p#*:}|"
      done
      ;;
    *) echo "cts.sh: unknown suite '$1'" >&2; return 1 ;;
  esac
}
for s in "${suites[@]}"; do programs "$s" >/dev/null; done

[ -x "$gbuild/bin/gmuxd" ] && [ -e "$gbuild/lib/libgmux-icd.so" ] ||
  { echo "cts.sh: no gmux build in $gbuild (run: bash scripts/build.sh)" >&2; exit 1; }
pocl_icd=$(grep -l pocl /etc/OpenCL/vendors/*.icd 2>/dev/null | head -1 || true)
[ -n "$pocl_icd" ] || { echo "cts.sh: no PoCL ICD in /etc/OpenCL/vendors" >&2; exit 1; }

# The source, without spir.
mkdir -p "$work"
if [ ! -e "$work/src/CMakeLists.txt" ]; then
  rm -rf "$work/src" "$work/src.part"
  mkdir -p "$work/src.part"
  if git -C "$src" rev-parse --verify -q "$tag^{commit}" >/dev/null 2>&1; then
    git -C "$src" archive "$tag" -- . ':(exclude)test_conformance/spir' 2>/dev/null |
      tar -x -C "$work/src.part"
  else
    tar -C "$src" --exclude='./test_conformance/spir' --exclude='./.git' -cf - . |
      tar -x -C "$work/src.part"
  fi
  sed -i '/add_subdirectory( *spir *)/d' "$work/src.part/test_conformance/CMakeLists.txt"
  mv "$work/src.part" "$work/src"
fi

# The build: only the suites' programs.
targets=()
for s in "${suites[@]}"; do
  while IFS='|' read -r _ t _; do targets+=("$t"); done < <(programs "$s")
done
cmake -S "$work/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCL_INCLUDE_DIR=/usr/include -DCL_LIB_DIR=/usr/lib/x86_64-linux-gnu -DOPENCL_LIBRARIES=OpenCL \
  -DCMAKE_C_FLAGS=-w -DCMAKE_CXX_FLAGS=-w >"$work/cmake.log" 2>&1 ||
  { tail -20 "$work/cmake.log"; exit 1; }
cmake --build "$work/build" -j "$jobs" --target "${targets[@]}" >"$work/build.log" 2>&1 ||
  { tail -30 "$work/build.log"; exit 1; }

# Vendor directories: PoCL alone, gmux alone.
mkdir -p "$work/native-vendors" "$work/gmux-vendors"
cp "$pocl_icd" "$work/native-vendors/"
echo "$gbuild/lib/libgmux-icd.so" >"$work/gmux-vendors/gmux.icd"

# A gmuxd for the gmux runs, stopped when the script ends.
sock="$work/gmuxd.sock"
rm -f "$sock"
OCL_ICD_VENDORS="$work/native-vendors" "$gbuild/bin/gmuxd" --socket "$sock" --exit-after 7200 \
  >"$work/gmuxd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "cts.sh: gmuxd did not start:"; cat "$work/gmuxd.log"; exit 1; } >&2

# run WHERE PROGRAM DIR ARGS: the program's log; prints "passed total".
run() {
  local where="$1" prog="$2" dir="$3" args="$4" log="$work/logs/$1-$2.log" exe
  mkdir -p "$work/logs"
  exe="$work/build/test_conformance/$dir/$prog"
  [ -x "$exe" ] || exe=$(find "$work/build" -name "$prog" -type f -perm -u+x | head -1)
  local vendors="$work/native-vendors"
  [ "$where" = gmux ] && vendors="$work/gmux-vendors"
  # Some programs read kernel files beside themselves.
  if [[ " $runs " == *" $where "* ]]; then
    (cd "$(dirname "$exe")" && OCL_ICD_VENDORS="$vendors" GMUX_SOCKET="$sock" \
      CL_DEVICE_TYPE=default timeout 3600 "$exe" $args) >"$log" 2>&1 || true
  elif [ ! -e "$log" ]; then
    echo "- - -"
    return
  fi
  local passed failed
  # The harness says "NAME passed" or "NAME FAILED" once per test (skipped ones are not counted).
  passed=$(grep -cE '^ *[A-Za-z0-9_]+ passed$' "$log" || true)
  failed=$(grep -cE '^ *[A-Za-z0-9_]+ FAILED$' "$log" || true)
  local skipped
  skipped=$(grep -cE '^ *[A-Za-z0-9_]+ skipped' "$log" || true)
  echo "$passed $((passed + failed)) $skipped"
}

# The tests that passed natively and not through gmux.
differ() {
  local prog="$1"
  [ -e "$work/logs/native-$prog.log" ] && [ -e "$work/logs/gmux-$prog.log" ] || return 0
  names() { grep -E '^ *[A-Za-z0-9_]+ passed$' "$1" | sed -E 's/^ *//; s/ passed$//' | sort -u; }
  comm -23 <(names "$work/logs/native-$prog.log") <(names "$work/logs/gmux-$prog.log") |
    while read -r t; do
      # Skipped through gmux (the reason is the harness's: a version or an extension missing).
      if grep -qE "^ *$t skipped" "$work/logs/gmux-$prog.log"; then echo -n "$t(skipped) "; else echo -n "$t "; fi
    done
}

# passed/run (skipped): a skipped test is not run, so it counts in neither figure.
printf '%-24s %-26s %14s %14s  %s\n' suite program native gmux "passed natively, not through gmux"
for s in "${suites[@]}"; do
  while IFS='|' read -r dir prog args; do
    read -r np nt ns < <(run native "$prog" "$dir" "$args")
    read -r gp gt gs < <(run gmux "$prog" "$dir" "$args")
    printf '%-24s %-26s %14s %14s  %s\n' "$s" "$prog" "$np/$nt ($ns)" "$gp/$gt ($gs)" \
      "$(differ "$prog")"
  done < <(programs "$s")
done
echo "logs: $work/logs (CTS $tag, $(date -u +%Y-%m-%d))"
