#!/usr/bin/env bash
# pyopencl's own test suite natively and through gmux, side by side (docs/conformance.md).
#
#   scripts/pyopencl-tests.sh PYOPENCL_SOURCE [TEST_FILE...]
#
# PYOPENCL_SOURCE is a source tree of inducer/pyopencl (a checkout, or a git directory holding
# tag v2022.3.1, the version Debian packages as python3-pyopencl). Its test/ directory is copied
# outside this repository and run with pytest against Debian's pyopencl twice: on PoCL alone, then
# through gmux's ICD against a gmuxd of this checkout's build (build/, `bash scripts/build.sh`).
# Not part of CI: it takes about 15 minutes on 2 cores.
#
# Test files (default): test_array.py test_algorithm.py test_wrapper.py test_enqueue_copy.py
# test_clrandom.py.
#
# Environment: PYOPENCL_WORK (default /tmp/gmux-pyopencl) the copy and the logs; GMUX_BUILD
# (default build) this checkout's build; PYOPENCL_RUNS (default "native gmux") which sides to run.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
src="$1"
shift
files=("$@")
[ ${#files[@]} -gt 0 ] ||
  files=(test_array.py test_algorithm.py test_wrapper.py test_enqueue_copy.py test_clrandom.py)
work="${PYOPENCL_WORK:-/tmp/gmux-pyopencl}"
gbuild="$(realpath "${GMUX_BUILD:-build}")"
runs="${PYOPENCL_RUNS:-native gmux}"
tag=v2022.3.1

python3 -c 'import pyopencl, pytest' 2>/dev/null || {
  echo "pyopencl-tests.sh: needs Debian's python3-pyopencl and python3-pytest" \
    "(apt-get install -y python3-pyopencl python3-pytest)" >&2
  exit 1
}
[ -x "$gbuild/bin/gmuxd" ] && [ -e "$gbuild/lib/libgmux-icd.so" ] ||
  { echo "pyopencl-tests.sh: no gmux build in $gbuild (run: bash scripts/build.sh)" >&2; exit 1; }
pocl_icd=$(grep -l pocl /etc/OpenCL/vendors/*.icd 2>/dev/null | head -1 || true)
[ -n "$pocl_icd" ] || { echo "pyopencl-tests.sh: no PoCL ICD in /etc/OpenCL/vendors" >&2; exit 1; }

rm -rf "$work/test"
mkdir -p "$work/test" "$work/logs"
if git -C "$src" rev-parse --verify -q "$tag^{commit}" >/dev/null 2>&1; then
  git -C "$src" archive "$tag" -- test | tar -x -C "$work"
else
  cp -r "$src/test/." "$work/test/"
fi

mkdir -p "$work/native-vendors" "$work/gmux-vendors"
rm -f "$work/native-vendors/"* "$work/gmux-vendors/"*
cp "$pocl_icd" "$work/native-vendors/"
echo "$gbuild/lib/libgmux-icd.so" >"$work/gmux-vendors/gmux.icd"

sock="$work/gmuxd.sock"
rm -f "$sock"
OCL_ICD_VENDORS="$work/native-vendors" "$gbuild/bin/gmuxd" --socket "$sock" --exit-after 3600 \
  >"$work/gmuxd.log" 2>&1 &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "pyopencl-tests.sh: gmuxd did not start:"; cat "$work/gmuxd.log"; exit 1; } >&2

for where in native gmux; do
  [[ " $runs " == *" $where "* ]] || continue
  vendors="$work/native-vendors"
  [ "$where" = gmux ] && vendors="$work/gmux-vendors"
  (cd "$work/test" && OCL_ICD_VENDORS="$vendors" GMUX_SOCKET="$sock" \
    timeout 3600 python3 -m pytest -rsfx -p no:cacheprovider "${files[@]}") \
    >"$work/logs/$where.log" 2>&1 || true
done

# The summary line of each side, and the tests that passed natively and not through gmux.
for where in native gmux; do
  [ -e "$work/logs/$where.log" ] || continue
  printf '%-7s %s\n' "$where" "$(grep -E '^=+ .*(passed|failed).* in ' "$work/logs/$where.log" |
    tail -1 | sed -E 's/^=+ //; s/ =+$//')"
done
if [ -e "$work/logs/native.log" ] && [ -e "$work/logs/gmux.log" ]; then
  # pytest -v is not used: a test that passed is one not listed as failed, skipped or xfailed.
  listed() { grep -E '^(FAILED|SKIPPED|XFAIL|ERROR) ' "$1" | sed -E 's/\[<context.*//; s/ - .*//' | sort -u; }
  echo "listed (failed, skipped, xfailed) through gmux and not natively:"
  comm -13 <(listed "$work/logs/native.log") <(listed "$work/logs/gmux.log") | sed 's/^/  /'
fi
echo "logs: $work/logs"
