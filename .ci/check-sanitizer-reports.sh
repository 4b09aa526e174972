#!/usr/bin/env bash
# Usage: check-sanitizer-reports.sh DIR
#
# Prints every sanitizer report the processes of a test run wrote under DIR (their log_path) and
# fails if any is gmux's. Files holding only notes ("Running thread … was not suspended. False
# leaks are possible.") are not reports.
#
# A report is left out — counted and named, not failed — only when all of its evidence lies in
# code gmux does not own. Two kinds, neither expressible as a sanitizer suppression (ASan's
# interceptor_via_lib would also hide gmux handing PoCL a buffer that is too short):
#  1. A deadly signal (SEGV, stack overflow, bus error) whose frame #0 is a kernel PoCL compiled
#     for a tenant (`_pocl_kernel_*`, loaded from PoCL's kernel cache). The isolation tests run
#     hostile kernels (wild writes, huge private arrays) on purpose; the tenant's worker dies as it
#     would without a sanitizer, and the tests check that nobody else notices.
#  2. An ASan memory error inside PoCL (frame #1, the caller of the intercepted libc function, in
#     libpocl) on memory PoCL allocated itself (frame #1 of the allocation in libpocl): PoCL 3.1's
#     program-binary loader trusts the sizes inside a binary, which the isolation tests corrupt on
#     purpose (CorruptedProgramBinariesAreErrorsForTheirClientOnly). gmux cannot validate PoCL's
#     private binary format; the worker dies and only its own client sees an error.
# Everything else fails, including errors in PoCL on memory gmux allocated.
set -euo pipefail
dir="$1"

# Prints "kernel-crash", "pocl-own-memory", "note" or "gmux" for one report file.
classify() {
  awk '
    /ERROR: (AddressSanitizer|ThreadSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error:/ {
      reports++
      if ($0 ~ /(SEGV|stack-overflow|BUS|deadly signal)/) deadly = 1
      else if ($0 ~ /ERROR: AddressSanitizer: /) memory = 1
      else other = 1
      stack = "access"
    }
    /^allocated by thread/ { stack = "alloc" }
    /^ +#0 / && stack == "access" && first == "" { first = $0 }
    /^ +#1 / && stack == "access" && access1 == "" { access1 = $0 }
    /^ +#1 / && stack == "alloc" && alloc1 == "" { alloc1 = $0 }
    END {
      if (reports == 0) { print "note"; exit }
      if (reports == 1 && deadly && !memory && !other && first ~ /_pocl_kernel_/) {
        print "kernel-crash"; exit
      }
      if (reports == 1 && memory && !deadly && !other && access1 ~ /\/libpocl\.so/ &&
          alloc1 ~ /\/libpocl\.so/) {
        print "pocl-own-memory"; exit
      }
      print "gmux"
    }' "$1"
}

genuine=0
left_out=0
for f in $(find "$dir" -type f | sort); do
  kind="$(classify "$f")"
  case "$kind" in
    note) ;;
    gmux)
      genuine=$((genuine + 1))
      echo "---- sanitizer report $f"
      cat "$f"
      ;;
    *)
      left_out=$((left_out + 1))
      echo "---- left out ($kind, third-party code): $f: $(grep -m1 -E 'ERROR|WARNING' "$f")"
      ;;
  esac
done
echo "sanitizer reports: $genuine failing, $left_out left out as third-party"
[ "$genuine" -eq 0 ]
