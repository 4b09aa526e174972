#!/usr/bin/env bash
# What the Prometheus endpoint and the usage ledger cost gmuxd, per dispatch, in one run
# (docs/performance.md, "Operations overhead: metrics and ledger").
#
#   scripts/bench-ops-overhead.sh [--rounds N] [--window S] [--warmup S] [--clients N]
#                                 [--intervals LIST] [--scrape-every S] [--no-isolate]
#                                 [--tsv FILE] [--build DIR] [--keep]
#
# Each round starts one gmuxd per configuration, in turn (the order reversed on odd rounds, so
# a linear drift of the host cancels): "off" (no metrics_listen, no ledger) and, for each
# ledger interval I in LIST, "onI" (metrics_listen on port 0, scraped with curl every
# --scrape-every seconds during the window, and a ledger booking every I seconds). Every run
# loads its gmuxd with --clients closed-loop clients, each `plain_launch gmux blocking`
# (1-work-item launch + clFinish, over and over) under a uid of its own (a tenant each, so the
# scheduler decides every dispatch; express dispatch needs a lone tenant). Once every client's
# tenant has dispatched, and --warmup s later, a window of --window s is measured: gmuxd's own
# CPU time (utime+stime of /proc/PID/stat: all of gmuxd's threads, not its workers) over the
# dispatches the scheduler decided meanwhile (`gmux status --json`, scheduler.dispatches), and
# per thread (/proc/PID/task/*/schedstat) the busiest thread (the scheduler's) apart from the
# others (where the endpoint's and the ledger's threads are). Ratios are on/off within a round.
#
# Then, unless --no-isolate, three idle gmuxd (the clients' tenants known, with memory in use:
# their clients are stopped with SIGSTOP after a short load) give the idle CPU without and with
# an unscraped endpoint, the CPU of one scrape (3 batches of 100 back to back) and of one ledger
# booking (ledger_interval_s = 0.05, 3 segments of 3 s, against the idle daemon without one),
# each also as the scheduler thread's part; and what they predict for each onI configuration.
#
# Defaults: 4 rounds, 20 s windows, 3 s warm-up, 3 clients, intervals 1,10, a scrape a second:
# about 6 minutes. Needs root (clients under uids 60101..; without root every client runs
# under this uid with express_dispatch = false), curl, jq and sqlite3. Window and warm-up are
# whole seconds. --tsv FILE also writes one row per run; --keep keeps the temp dir (logs, ledgers).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}

rounds=4 window=20 warmup=3 clients=3 intervals=1,10 scrape_every=1 isolate=1 tsv="" keep=0
build=build
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage 0 ;;
    --rounds) rounds="$2"; shift ;;
    --window) window="$2"; shift ;;
    --warmup) warmup="$2"; shift ;;
    --clients) clients="$2"; shift ;;
    --intervals) intervals="$2"; shift ;;
    --scrape-every) scrape_every="$2"; shift ;;
    --no-isolate) isolate=0 ;;
    --tsv) tsv="$2"; shift ;;
    --build) build="$2"; shift ;;
    --keep) keep=1 ;;
    *) echo "bench-ops-overhead.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done

bin="$(cd "$build" && pwd)/bin"
lib="$(cd "$build" && pwd)/lib"
for f in "$bin/gmuxd" "$bin/gmux" "$bin/gmux-worker" "$bin/plain_launch" "$lib/libgmux-icd.so"; do
  [ -e "$f" ] || { echo "bench-ops-overhead.sh: missing $f (scripts/build.sh)" >&2; exit 1; }
done
for t in curl jq sqlite3; do
  command -v "$t" >/dev/null || { echo "bench-ops-overhead.sh: needs $t" >&2; exit 1; }
done
root=0
[ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && root=1
tck=$(getconf CLK_TCK)

top=$(mktemp -d /tmp/gmux-ops-overhead.XXXXXX)
chmod 755 "$top"  # the clients' uids must reach the ICD file and the socket
mkdir "$top/icd" "$top/state" "$top/bin" "$top/lib"
# Every run uses one copy of the build, taken now, even if the tree is rebuilt meanwhile.
cp "$bin/gmuxd" "$bin/gmux" "$bin/gmux-worker" "$bin/plain_launch" "$top/bin/"
cp "$lib/libgmux-icd.so" "$top/lib/"
bin="$top/bin"
echo "$top/lib/libgmux-icd.so" >"$top/icd/gmux.icd"
chmod -R a+rX "$top"

daemon_pid="" scrape_pid=""
client_pids=()
stop_clients() {
  local p
  for p in "${client_pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; done
  for p in "${client_pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${client_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  client_pids=()
}
stop_scrapes() {
  if [ -n "$scrape_pid" ]; then
    kill "$scrape_pid" 2>/dev/null || true
    wait "$scrape_pid" 2>/dev/null || true
    scrape_pid=""
  fi
}
stop_daemon() {
  if [ -n "$daemon_pid" ]; then
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" 2>/dev/null || true
    daemon_pid=""
  fi
}
cleanup() {
  stop_scrapes
  stop_clients
  stop_daemon
  if [ "$keep" = 1 ]; then echo "(kept $top)" >&2; else rm -rf "$top"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# sleep that a signal interrupts at once (bash runs a trap only between commands).
pause() {
  sleep "$1" &
  wait $!
}

# start_daemon DIR METRICS(0|1) LEDGER_INTERVAL("" = no ledger): sets daemon_pid and port.
start_daemon() {
  local dir=$1 metrics=$2 interval=$3
  mkdir -p "$dir"
  chmod 755 "$dir"
  {
    echo "[daemon]"
    echo "state_dir = \"$top/state\""
    if [ "$root" != 1 ]; then echo "express_dispatch = false"; fi
    if [ "$metrics" = 1 ]; then echo 'metrics_listen = "127.0.0.1:0"'; fi
    if [ -n "$interval" ]; then
      echo "ledger = \"$dir/usage.db\""
      echo "ledger_interval_s = $interval"
    fi
  } >"$dir/g.toml"
  "$bin/gmuxd" --socket "$dir/s.sock" --config "$dir/g.toml" \
    --exit-after $((warmup + window + 240)) >"$dir/gmuxd.log" 2>&1 &
  daemon_pid=$!
  port=""
  local i
  for i in $(seq 100); do
    if [ -S "$dir/s.sock" ]; then
      [ "$metrics" = 1 ] || return 0
      port=$(sed -n 's/.*Prometheus metrics at .*(port \([0-9]*\)).*/\1/p' "$dir/gmuxd.log")
      [ -n "$port" ] && return 0
    fi
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench-ops-overhead.sh: gmuxd did not start:" >&2
  cat "$dir/gmuxd.log" >&2
  exit 1
}

# start_clients DIR COUNT_PER_CLIENT: closed-loop clients, one uid (tenant) each when root.
start_clients() {
  local dir=$1 count=$2 k
  for k in $(seq "$clients"); do
    local pre=()
    if [ "$root" = 1 ]; then
      pre=(setpriv --reuid=$((60100 + k)) --regid=$((60100 + k)) --clear-groups)
    fi
    OCL_ICD_VENDORS="$top/icd" GMUX_SOCKET="$dir/s.sock" \
      "${pre[@]}" "$bin/plain_launch" gmux blocking "$count" >"$dir/client$k.log" 2>&1 &
    client_pids+=($!)
  done
}

# gmuxd's own CPU time in ns (all its threads, not its children), from /proc/PID/stat.
cpu_ns() {
  local f
  read -ra f <"/proc/$daemon_pid/stat"
  # Fields after the "(comm)" are shifted if comm has spaces; gmuxd's has none.
  echo $(((f[13] + f[14]) * 1000000000 / tck))
}
# The same from the threads' schedstat (ns resolution; misses threads that end meanwhile).
sched_ns() {
  cat /proc/"$daemon_pid"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f", s}'
}
# Per-thread CPU of gmuxd ("TID NS" lines) into FILE.
thread_snapshot() {
  local t
  for t in /proc/"$daemon_pid"/task/*; do
    echo "${t##*/} $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)"
  done >"$1"
}
# FILE0 FILE1: "TID NS" of the thread that used the most CPU in between, and the others' NS.
thread_split() {
  awk 'NR == FNR {a[$1] = $2; next} {d = $2 - a[$1]; s += d; if (d > m) {m = d; t = $1}}
    END {printf "%s %.0f %.0f\n", t, m, s - m}' "$1" "$2"
}
# The CPU ns of gmuxd's thread TID so far.
tid_ns() { cut -d' ' -f1 "/proc/$daemon_pid/task/$1/schedstat"; }
# scheduler.dispatches and the tenants' express_dispatches of the running gmuxd.
dispatches() {
  "$bin/gmux" status --json --socket "$1/s.sock" |
    jq -r '"\(.scheduler.dispatches) \([.tenants[].express_dispatches] | add // 0)"'
}
now_s() { date +%s.%N; }
# Waits until the clients' sessions all have tenants that dispatched (a first run compiles the
# kernel for each uid; the window must not start with a tenant alone).
wait_dispatching() {
  local i n
  for i in $(seq 240); do
    n=$("$bin/gmux" status --json --socket "$1/s.sock" |
      jq '[.tenants[] | select(.sessions > 0 and .dispatches > 0) | .sessions] | add // 0')
    if [ "$n" -ge "$clients" ]; then return 0; fi
    sleep 0.5
  done
  echo "bench-ops-overhead.sh: the clients did not all start:" >&2
  cat "$1"/client*.log >&2
  exit 1
}

alive_clients() {
  local p n=0
  for p in "${client_pids[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
  echo "$n"
}

results="$top/results.tsv"
printf 'round\tconfig\twall_s\tdispatches\texpress\tcpu_ms\tcpu_ns_per_dispatch' >"$results"
printf '\ttop_thread_ns_per_dispatch\tothers_ms\tscrapes\tbookings\tdispatch_per_s\n' \
  >>"$results"

# measure ROUND NAME INTERVAL: one loaded run; NAME "off" or "onI".
measure() {
  local round=$1 name=$2 interval=$3 dir="$top/r$1-$2" metrics=0
  [ "$name" = off ] || metrics=1
  start_daemon "$dir" "$metrics" "$interval"
  # Enough launches for the whole run at 20,000 per client per second.
  start_clients "$dir" $(((warmup + window + 180) * 20000))
  wait_dispatching "$dir"
  pause "$warmup"
  if [ "$(alive_clients)" -ne "$clients" ]; then
    echo "bench-ops-overhead.sh: a client ended early:" >&2
    cat "$dir"/client*.log "$dir/gmuxd.log" >&2
    exit 1
  fi
  local t0 c0 d0 e0 t1 c1 d1 e1
  t0=$(now_s); c0=$(cpu_ns); thread_snapshot "$dir/threads0"
  read -r d0 e0 < <(dispatches "$dir")
  if [ "$metrics" = 1 ]; then
    (
      while :; do
        curl -fsS -o /dev/null "http://127.0.0.1:$port/metrics" && echo ok
        sleep "$scrape_every"
      done >"$dir/scrapes.log" 2>&1
    ) &
    scrape_pid=$!
  fi
  pause "$window"
  t1=$(now_s); c1=$(cpu_ns); thread_snapshot "$dir/threads1"
  read -r d1 e1 < <(dispatches "$dir")
  local top_ns others_ns
  read -r _ top_ns others_ns < <(thread_split "$dir/threads0" "$dir/threads1")
  local alive scrapes=0 bookings=0
  if [ "$metrics" = 1 ]; then scrapes=$(grep -c '^ok$' "$dir/scrapes.log" || true); fi
  stop_scrapes
  alive=$(alive_clients)
  stop_clients
  stop_daemon
  [ "$alive" -eq "$clients" ] ||
    { echo "bench-ops-overhead.sh: a client ended in the window" >&2; exit 1; }
  if [ -z "$d0" ] || [ -z "$d1" ]; then
    echo "bench-ops-overhead.sh: gmux status failed" >&2
    exit 1
  fi
  if [ -n "$interval" ]; then
    bookings=$(sqlite3 "$dir/usage.db" \
      "SELECT COUNT(DISTINCT \"end\") FROM usage WHERE \"end\" > $t0 AND \"end\" <= $t1")
  fi
  awk -v r="$round" -v n="$name" -v t0="$t0" -v t1="$t1" -v d0="$d0" -v d1="$d1" \
    -v e0="$e0" -v e1="$e1" -v c0="$c0" -v c1="$c1" -v top="$top_ns" -v oth="$others_ns" \
    -v sc="$scrapes" -v bk="$bookings" 'BEGIN {
      d = d1 - d0; w = t1 - t0
      printf "%d\t%s\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%d\t%d\t%.0f\n", r, n, w, d,
        e1 - e0, (c1 - c0) / 1e6, (c1 - c0) / d, top / d, oth / 1e6, sc, bk, d / w }' \
    >>"$results"
  tail -n 1 "$results"
}

IFS=, read -ra ivals <<<"$intervals"
configs=(off)
for i in "${ivals[@]}"; do configs+=("on$i"); done
echo "gmuxd CPU per dispatch, $rounds rounds of: ${configs[*]} (window ${window} s, warm-up" \
  "${warmup} s, $clients clients, a scrape every ${scrape_every} s in on runs)"
[ "$root" = 1 ] || echo "(not root: clients share one uid, express_dispatch = false)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
head -n 1 "$results"
for r in $(seq 0 $((rounds - 1))); do
  order=("${configs[@]}")
  if [ $((r % 2)) = 1 ]; then
    order=()
    for ((k = ${#configs[@]} - 1; k >= 0; k--)); do order+=("${configs[k]}"); done
  fi
  for c in "${order[@]}"; do
    if [ "$c" = off ]; then measure "$r" off ""; else measure "$r" "$c" "${c#on}"; fi
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# Median and range of the numbers on stdin, e.g. "372 (351-390)".
median_range() {
  sort -g | awk '{x[NR] = $1}
    END {m = (x[int((NR + 1) / 2)] + x[int(NR / 2) + 1]) / 2
      printf "%.0f (%.0f-%.0f)", m, x[1], x[NR]}'
}

# The median of the numbers on stdin, with DECIMALS (default 4) decimals.
median() {
  sort -g | awk -v p="${1:-4}" '{x[NR] = $1}
    END {printf "%.*f", p, (x[int((NR + 1) / 2)] + x[int(NR / 2) + 1]) / 2}'
}

# Per configuration, medians (ranges) over its runs; per on configuration, per round against
# that round's off run: the ratio of CPU per dispatch, and the growth of the CPU of the threads
# other than the busiest one (the scheduler's), i.e. the endpoint's and the ledger's threads.
echo
echo "summary: median (range) over the runs; CPU of gmuxd from /proc/PID/stat"
for c in "${configs[@]}"; do
  col() { awk -F'\t' -v c="$c" -v k="$1" 'NR > 1 && $2 == c {print $k}' "$results"; }
  echo "  $c: $(col 7 | median_range) ns/dispatch; busiest thread $(col 8 | median_range)" \
    "ns/dispatch; $(col 12 | median_range) dispatches/s"
done
declare -A others_median
for c in "${configs[@]}"; do
  if [ "$c" = off ]; then continue; fi
  ratios=$(awk -F'\t' -v c="$c" 'NR > 1 && $2 == "off" {off[$1] = $7}
      NR > 1 && $2 == c {on[$1] = $7}
      END {for (r in on) if (r in off) printf "%.4f\n", on[r] / off[r]}' "$results" | sort -g)
  others=$(awk -F'\t' -v c="$c" 'NR > 1 && $2 == "off" {off[$1] = $9 / $3; cpu[$1] = $6 / $3}
      NR > 1 && $2 == c {on[$1] = $9 / $3}
      END {for (r in on) if (r in off) printf "%.3f\n", 100 * (on[r] - off[r]) / cpu[r]}' \
    "$results" | sort -g)
  echo "  $c/off, CPU per dispatch: ratios $(echo "$ratios" | tr '\n' ' ')-> median" \
    "$(echo "$ratios" | median 4)"
  others_median[$c]=$(echo "$others" | median 3)
  echo "  $c - off, CPU of the other threads, % of the off run's CPU: $(echo "$others" |
    tr '\n' ' ')-> median ${others_median[$c]} %"
done

# idle_run NAME METRICS INTERVAL: an idle gmuxd that knows the clients' tenants, with memory in
# use (their clients are stopped, not ended). CPU from the threads' schedstat (ns resolution).
# Sets idle_ns_per_s; with a ledger, booking_ns (3 segments of 3 s, the median and range) and
# rows_per_booking; with metrics, scrape_ns (3 batches of 100 scrapes), scrape_wall_ms and
# scrape_bytes; booking_sched_ns and scrape_sched_ns: the scheduler thread's part (the thread
# busiest under load), idle time not subtracted.
idle_run() {
  local name=$1 metrics=$2 interval=$3 dir="$top/idle-$1" p
  start_daemon "$dir" "$metrics" "$interval"
  start_clients "$dir" 1000000
  wait_dispatching "$dir"
  pause 1
  thread_snapshot "$dir/threads0"
  pause 1
  thread_snapshot "$dir/threads1"
  local tid
  read -r tid _ < <(thread_split "$dir/threads0" "$dir/threads1")
  for p in "${client_pids[@]}"; do kill -STOP "$p"; done
  pause 1
  local t0 c0 t1 c1 q0 q1 seg k
  local -a segs=()
  for seg in 1 2 3; do
    t0=$(now_s); c0=$(sched_ns); q0=$(tid_ns "$tid")
    pause 3
    t1=$(now_s); c1=$(sched_ns); q1=$(tid_ns "$tid")
    segs+=("$t0 $c0 $t1 $c1 $q0 $q1")
  done
  idle_ns_per_s=$(for seg in "${segs[@]}"; do
    echo "$seg" | awk '{printf "%.0f\n", ($4 - $2) / ($3 - $1)}'
  done | median_range)
  if [ -n "$interval" ]; then
    for seg in "${segs[@]}"; do
      read -r t0 c0 t1 c1 q0 q1 <<<"$seg"
      k=$(sqlite3 "$dir/usage.db" \
        "SELECT COUNT(DISTINCT \"end\") FROM usage WHERE \"end\" > $t0 AND \"end\" <= $t1")
      awk -v t0="$t0" -v c0="$c0" -v t1="$t1" -v c1="$c1" -v k="$k" -v idle="$idle_off_rate" \
        -v q0="$q0" -v q1="$q1" \
        'BEGIN {printf "%.0f %.0f\n", (c1 - c0 - idle * (t1 - t0)) / k, (q1 - q0) / k}'
    done >"$dir/bookings.txt"
    booking_ns=$(cut -d' ' -f1 "$dir/bookings.txt" | median_range)
    booking_sched_ns=$(cut -d' ' -f2 "$dir/bookings.txt" | median_range)
    rows_per_booking=$(sqlite3 "$dir/usage.db" \
      "SELECT printf('%.1f', 1.0 * COUNT(*) / COUNT(DISTINCT \"end\")) FROM usage")
  fi
  if [ "$metrics" = 1 ]; then
    scrape_bytes=$(curl -fsS "http://127.0.0.1:$port/metrics" | wc -c)
    for seg in 1 2 3; do
      t0=$(now_s); c0=$(sched_ns); q0=$(tid_ns "$tid")
      for k in $(seq 100); do curl -fsS -o /dev/null "http://127.0.0.1:$port/metrics"; done
      t1=$(now_s); c1=$(sched_ns); q1=$(tid_ns "$tid")
      awk -v t0="$t0" -v c0="$c0" -v t1="$t1" -v c1="$c1" -v idle="$idle_off_rate" \
        -v q0="$q0" -v q1="$q1" 'BEGIN {printf "%.0f %.3f %.0f\n",
          (c1 - c0 - idle * (t1 - t0)) / 100, (t1 - t0) * 10, (q1 - q0) / 100}'
    done >"$dir/scrapes.txt"
    scrape_ns=$(cut -d' ' -f1 "$dir/scrapes.txt" | median_range)
    scrape_wall_ms=$(cut -d' ' -f2 "$dir/scrapes.txt" | sort -g | sed -n 2p)
    scrape_sched_ns=$(cut -d' ' -f3 "$dir/scrapes.txt" | median_range)
  fi
  stop_clients
  stop_daemon
}

if [ "$isolate" = 1 ]; then
  echo
  echo "isolated costs: idle gmuxd, $clients tenants with memory in use (clients stopped);"
  echo "gmuxd CPU from its threads' schedstat, median (range) of 3 measurements"
  idle_off_rate=0
  idle_run off 0 ""
  echo "  idle gmuxd, no endpoint, no ledger: $idle_ns_per_s ns CPU/s"
  idle_off_rate=${idle_ns_per_s%% *}
  idle_run metrics 1 ""
  echo "  idle gmuxd, endpoint not scraped: $idle_ns_per_s ns CPU/s"
  echo "  one scrape ($scrape_bytes bytes): $scrape_ns ns of gmuxd CPU, of which" \
    "$scrape_sched_ns on the scheduler thread; 100 back to back, $scrape_wall_ms ms wall each"
  idle_run ledger 0 0.05
  echo "  one ledger booking ($rows_per_booking rows): $booking_ns ns of gmuxd CPU, of which" \
    "$booking_sched_ns on the scheduler thread (ledger_interval_s = 0.05)"
  # What those predict for each on configuration, against the off runs' CPU per second; and
  # the loaded runs' growth of the other threads plus the scheduler thread's part from here.
  off_cpu_per_s=$(awk -F'\t' 'NR > 1 && $2 == "off" {print $6 / $3 * 1e6}' "$results" |
    median_range)
  for i in "${ivals[@]}"; do
    awk -v s="${scrape_ns%% *}" -v every="$scrape_every" -v b="${booking_ns%% *}" -v i="$i" \
      -v off="${off_cpu_per_s%% *}" -v ss="${scrape_sched_ns%% *}" \
      -v bs="${booking_sched_ns%% *}" -v oth="${others_median[on$i]}" 'BEGIN {
        x = s / every + b / i; y = ss / every + bs / i
        printf "  on%s, predicted: %.0f ns/s = %.2f %% of the off runs'"'"' median %.0f ns/s\n",
          i, x, 100 * x / off, off
        printf "  on%s, under load: other threads %.2f %% + scheduler thread (isolated) %.2f %%" \
          " = %.2f %%\n", i, oth, 100 * y / off, oth + 100 * y / off}'
  done
fi

if [ -n "$tsv" ]; then cp "$results" "$tsv"; fi
