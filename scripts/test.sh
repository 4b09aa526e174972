#!/usr/bin/env bash
# The README's test command: installs dependencies, builds, and runs every test with CTest, then
# the same code under sanitizers and its fuzzers. Stages, in order (docs/testing.md has their
# costs and what each leaves out):
#   main  build/       the normal build and the whole suite: the main gate
#   asan  build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, the suite but clpeak
#   tsan  build-tsan/  ThreadSanitizer, the daemon's tests and the runtime tests (real gmuxd)
#   fuzz  build-fuzz/  clang + libFuzzer: every fuzz target for a bounded time on its corpus
# GMUX_CI_STAGES picks stages (default "main asan tsan fuzz"; e.g. GMUX_CI_STAGES=main locally).
# Every stage runs even when an earlier one failed; the script fails if any stage failed.
# GMUX_JOBS sets build and test parallelism; GMUX_FUZZ_SECONDS the fuzzing time shared by all
# targets (default 120).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
stages="${GMUX_CI_STAGES:-main asan tsan fuzz}"
jobs="${GMUX_JOBS:-$(nproc)}"
fuzz_seconds="${GMUX_FUZZ_SECONDS:-120}"
for s in $stages; do
  case "$s" in
    main | asan | tsan | fuzz) ;;
    *) echo "test.sh: unknown stage '$s' in GMUX_CI_STAGES (main asan tsan fuzz)" >&2; exit 2 ;;
  esac
done

logs="$(mktemp -d /tmp/gmux-test-XXXXXX)"
chmod 755 "$logs"  # tenants' processes write their sanitizer reports below it
# Names the frames of every sanitizer report (gcc's and clang's runtimes both speak to it).
symbolizer=/usr/lib/llvm-14/bin/llvm-symbolizer
# Tests the sanitizer stages leave out: clinfo's and clpeak's run Debian's uninstrumented programs,
# which cannot load the instrumented ICD (and clpeak's groups take minutes each even uninstrumented);
# the frame agent's are preloaded into Debian's GL programs, which cannot load an instrumented
# libgmux-frame.so (the daemon's side, frame_hub_test, runs instrumented).
uninstrumented_tools='[Cc]lpeak|ToolsTest|FramesTest|DemoFramesTest'

bash scripts/install-deps.sh

# Sanitizer reports go to files under one directory per stage (log_path), so that a report from
# a process no test waits on — gmuxd and its workers, which the runtime tests stop at exit — still
# fails the stage; .ci/check-sanitizer-reports.sh prints them and says which are third-party.
# Processes of other uids (tenants' workers and clients) write there too.
reports_dir() {
  local d="$logs/reports-$1"
  mkdir -p "$d"
  chmod 1777 "$d"
  echo "$d"
}

# The sanitizer stages build with -O1 and line tables only (-g1): enough for a report's stack
# with file and line, and it halves their compile time (an instrumented -O2 -g build took
# 29 min of CI's 80 on 2 cores; docs/testing.md, "What it costs").
sanitizer_flags=(-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG"
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG")

# configure_and_build DIR CMAKE_ARGS...
configure_and_build() {
  local dir="$1"
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMUX_WERROR=ON "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
}

# run_ctest DIR CTEST_ARGS...: the stage's tests; ctest's closing summary line is kept for the
# final summary.
run_ctest() {
  local dir="$1"
  shift
  local rc=0
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 600 "$@") 2>&1 |
    tee "$logs/ctest-$stage.log" || rc=$?
  grep -E "tests passed|tests failed" "$logs/ctest-$stage.log" | tail -1 >"$logs/summary-$stage" || true
  return "$rc"
}

# LeakSanitizer's stop-the-world tracer now and then crashes as a process exits ("Tracer caught
# signal 11 ... LeakSanitizer has encountered a fatal error", google/sanitizers#1353): the test's
# checks had passed, the sanitizer runtime failed the process. When there are no more failed
# tests than such crash notes among the stage's reports, the failed tests run once more, and their
# second run decides. Any other failure is final.
rerun_tracer_crashes() {
  local dir="$1" reports="$2" failed crashes
  failed="$(wc -l <"$dir/Testing/Temporary/LastTestsFailed.log" 2>/dev/null || echo 0)"
  crashes="$(grep -l "Tracer caught signal" "$reports"/* 2>/dev/null | wc -l || true)"
  [ "$failed" -gt 0 ] && [ "$crashes" -ge "$failed" ] || return 1
  echo "==== $failed failed test(s), $crashes LeakSanitizer tracer crash(es): running them again" |
    tee -a "$logs/ctest-$stage.log"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" --timeout 600 --rerun-failed) 2>&1 |
    tee -a "$logs/ctest-$stage.log"
}

stage_main() {
  # The product's optimization (-O2) with line tables only: all a failure's stack needs, and a
  # third less compile time than -g (docs/testing.md, "What it costs").
  bash scripts/build.sh -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
  mark build
  run_ctest build
}

stage_asan() {
  configure_and_build build-asan -DGMUX_SANITIZE=address,undefined -DGMUX_BUILD_BENCH=OFF \
    "${sanitizer_flags[@]}"
  mark build
  local reports
  reports="$(reports_dir asan)"
  # Leaks are checked, but those inside PoCL and LLVM are suppressed (.ci/lsan.supp). A 16 MiB
  # quarantine of freed memory (default 256) keeps the tests' RSS bounds meaningful.
  export ASAN_OPTIONS="external_symbolizer_path=$symbolizer:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_string_checks=1:quarantine_size_mb=16:log_path=$reports/asan"
  export LSAN_OPTIONS="suppressions=$root/.ci/lsan.supp:print_suppressions=0"
  # UBSan ignores log_path in a build combined with ASan: its reports go to the process's stderr
  # (the test's output; a daemon that hits one dies, failing its tests).
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  # Shorter loops, as under TSan: one size per transfer path, 50 launches or 12 round trips per
  # load client (the main stage runs them all uninstrumented).
  export GMUX_TEST_FEW_ITERATIONS=1
  local rc=0
  # The 64-client load tests are left out as under TSan: 64 instrumented clients compiling cold
  # on 2 cores take minutes; the 8-client ones run the same paths. So are two of the six transfer
  # variants, as under TSan (see stage_tsan; about 150 test-seconds): the main stage runs them.
  if ! run_ctest build-asan -E "$uninstrumented_tools|LoadTest\.SixtyFour" \
    -LE "^runtime/(transfers_inline_messages|transfers_shm)_test\$"; then
    rerun_tracer_crashes build-asan "$reports" || rc=1
  fi
  bash .ci/check-sanitizer-reports.sh "$reports" || rc=1
  return "$rc"
}

stage_tsan() {
  # Only what the daemon's and the runtime tests need: the daemon's (and worker's) test
  # executables, every runtime test, and the programs they start.
  local tests=() labels='runtime/.*' f
  for f in tests/daemon/*_test.cc tests/worker/*_test.cc; do
    [ -e "$f" ] || continue
    tests+=("$(basename "$f" .cc)")
    labels="$labels|$(basename "$f" .cc)"
  done
  # Two of transfers_test's variants are left out too, for time: transfers_inline_messages runs
  # the threads of transfers_inline (only the encoding of the data differs), transfers_shm copies
  # through pooled shared memory (the fallback; map_shm_test takes that pool under TSan) instead
  # of the client's pages. The main and asan stages run both.
  for f in tests/runtime/*_test.cc; do
    [[ "$(basename "$f")" =~ ^(clpeak|tools|transfers_inline_messages|transfers_shm)_test ]] ||
      tests+=("$(basename "$f" .cc)")
  done
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGMUX_WERROR=ON \
    -DGMUX_SANITIZE=thread \
    -DGMUX_BUILD_BENCH=OFF "${sanitizer_flags[@]}" >/dev/null
  cmake --build build-tsan -j "$jobs" --target gmuxd gmux-worker gmux-icd gmux "${tests[@]}"
  mark build
  local reports
  reports="$(reports_dir tsan)"
  # No reports of deadly signals (handle_segv=0): the isolation tests' hostile kernels crash their
  # own worker on purpose, TSan's report of that crash has no stack to tell it from gmux's, and the
  # asan stage reports every SEGV with its stack.
  export TSAN_OPTIONS="external_symbolizer_path=$symbolizer:halt_on_error=1:second_deadlock_stack=1:handle_segv=0:suppressions=$root/.ci/tsan.supp:log_path=$reports/tsan"
  export GMUX_TEST_FEW_ITERATIONS=1
  # Tests are labelled by executable, runtime tests "runtime/<executable>". The 64-client load
  # tests are left out: 128 instrumented processes on 2 cores run past the test timeout (the
  # 8-client ones exercise the same paths).
  local rc=0
  run_ctest build-tsan -L "^($labels)\$" -E "$uninstrumented_tools|LoadTest\.SixtyFour" || rc=$?
  bash .ci/check-sanitizer-reports.sh "$reports" || rc=1
  return "$rc"
}

stage_fuzz() {
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DGMUX_WERROR=ON \
    -DGMUX_SANITIZE=address,undefined -DGMUX_FUZZ=ON -DGMUX_BUILD_TESTS=OFF \
    -DGMUX_BUILD_BENCH=OFF "${sanitizer_flags[@]}" >/dev/null
  cmake --build build-fuzz -j "$jobs" --target gmux_fuzzers
  mark build
  export ASAN_OPTIONS="external_symbolizer_path=$symbolizer:detect_leaks=1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  local fuzzers=(build-fuzz/bin/*_fuzz)
  local each=$((fuzz_seconds / ${#fuzzers[@]}))
  [ "$each" -ge 1 ] || each=1
  local rc=0 crashes=0
  for f in "${fuzzers[@]}"; do
    local name
    name="$(basename "$f" _fuzz)"
    # New inputs go to a scratch corpus; the checked-in seeds are only read. A crashing (or slow,
    # or memory-hungry) input is written beside the logs and printed in base64 (docs/testing.md:
    # reproducing one).
    local work="$logs/corpus-$name" log="$logs/fuzz-$name.log"
    mkdir -p "$work"
    echo "fuzzing $name for ${each}s"
    if "$f" -max_total_time="$each" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
      -artifact_prefix="$logs/artifact-$name-" "$work" "fuzz/corpus/$name" >"$log" 2>&1; then
      grep -E "^(Done|stat::)" "$log" || true
    else
      rc=1
      cat "$log"
    fi
  done
  for c in "$logs"/artifact-*; do
    [ -e "$c" ] || continue
    crashes=$((crashes + 1))
    echo "failing input $(basename "$c") (base64): $(base64 -w0 "$c")"
  done
  echo "fuzzing: ${#fuzzers[@]} targets, ${each}s each, $crashes failing inputs" >"$logs/summary-$stage"
  [ "$crashes" -eq 0 ] || rc=1
  return "$rc"
}

# Per-stage timing: mark records when a stage's build ended.
mark() { date +%s >"$logs/mark-$stage-$1"; }

failed=()
for stage in $stages; do
  echo "==== stage $stage"
  start=$(date +%s)
  set +e
  (
    set -euo pipefail
    "stage_$stage"
  )
  rc=$?
  set -e
  end=$(date +%s)
  built=$(cat "$logs/mark-$stage-build" 2>/dev/null || echo "$end")
  timing="build $((built - start))s, tests $((end - built))s, total $((end - start))s"
  result=passed
  if [ "$rc" -ne 0 ]; then
    result=FAILED
    failed+=("$stage")
  fi
  echo "$stage: $result ($timing) $(cat "$logs/summary-$stage" 2>/dev/null || true)" >>"$logs/summary"
  echo "==== stage $stage $result: $timing"
done

echo "==== summary"
cat "$logs/summary"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "failed stages: ${failed[*]} (logs in $logs)"
  exit 1
fi
rm -rf "$logs"
