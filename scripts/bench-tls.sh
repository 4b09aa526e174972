#!/usr/bin/env bash
# What TLS costs on gmux's TCP transport: `gmux bench` (plain OpenCL programs natively and through
# gmux in one run, ratios to native) against this build's gmuxd over TLS, over plain TCP, and
# over the Unix socket, on loopback. Certificates of a throwaway CA are made for the run.
#   scripts/bench-tls.sh [BUILD_DIR] [-- extra gmux bench options, e.g. --sizes 4K,1M,256M]
# Prints one table; the JSON of each run is left in the temp dir it names.
set -euo pipefail
build="${1:-build}"
shift || true
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--sizes 4K,1M,64M,256M --repeat 3)
bin="$(cd "$build/bin" && pwd)"
dir="$(mktemp -d /tmp/gmux-bench-tls-XXXXXX)"
chmod 755 "$dir"  # TCP tenants' workers run as worker_user (nobody) and keep a cache in it
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# A CA and a server certificate for 127.0.0.1.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=bench CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=localhost" \
  -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$dir/ext"
openssl x509 -req -days 2 -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -set_serial 1 -extfile "$dir/ext" -out "$dir/server.pem" 2>/dev/null

# start NAME CONFIG: gmuxd on a socket and TCP port 0 of its own (its port: port NAME).
start() {
  local name="$1" config="$2"
  # A state dir of its own: two daemons must not share their workers' caches.
  printf '%s\nstate_dir = "%s"\n[[tenant]]\nname = "bench"\ntokens = ["bench-token"]\n' \
    "$config" "$dir/$name-state" > "$dir/$name.toml"
  "$bin/gmuxd" --socket "$dir/$name.sock" --config "$dir/$name.toml" --listen 127.0.0.1:0 \
    --port-file "$dir/$name.port" --exit-after 1800 > "$dir/$name.log" 2>&1 &
  pids+=($!)
}
port() {
  for _ in $(seq 300); do [ -s "$dir/$1.port" ] && break; sleep 0.1; done
  cat "$dir/$1.port"
}

start tls "[daemon]
tls_cert = \"$dir/server.pem\"
tls_key = \"$dir/server.key\""
start plain "[daemon]
plain_tcp = true"
tls_port=$(port tls)
plain_port=$(port plain)

echo "gmux bench over TLS (port $tls_port), plain TCP (port $plain_port), Unix socket; in $dir" >&2
GMUX_TOKEN=bench-token GMUX_TLS_CA="$dir/ca.pem" \
  "$bin/gmux" bench --address "127.0.0.1:$tls_port" --json "${extra[@]}" > "$dir/tls.json"
GMUX_TOKEN=bench-token \
  "$bin/gmux" bench --address "tcp://127.0.0.1:$plain_port" --json "${extra[@]}" > "$dir/plain.json"
env -u GMUX_SOCKET "$bin/gmux" bench --socket "$dir/tls.sock" --json "${extra[@]}" > "$dir/unix.json"

python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
names = (("unix", "Unix socket"), ("plain", "plain TCP"), ("tls", "TLS"))
runs = {k: json.load(open(f"{d}/{k}.json")) for k, _ in names}
def fig(j):
    out = {
        "launch + clFinish p50, added us": j["launch_us"]["gmux"]["p50"] - j["launch_us"]["native"]["p50"],
        "launch + clFinish p99, added us": j["launch_us"]["gmux"]["p99"] - j["launch_us"]["native"]["p99"],
        "pipelined launches, x native": j["pipelined_per_s"]["gmux"] / j["pipelined_per_s"]["native"],
        "512^2 matmul end to end, x native": j["matmul_ms"]["gmux"] / j["matmul_ms"]["native"],
    }
    for t in j["transfers"]:
        b = t["bytes"]
        size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
        for op in ("write", "read"):
            out[f"{size} blocking {op}, GB/s"] = t[f"{op}_gbps"]["gmux"]
            out[f"{size} blocking {op}, x native"] = t[f"{op}_gbps"]["gmux"] / t[f"{op}_gbps"]["native"]
    return out
figs = {k: fig(v) for k, v in runs.items()}
print(f"{'figure (gmux bench, same-run native baseline)':44}" + "".join(f"{n:>13}" for _, n in names))
for key in figs["tls"]:
    print(f"{key:44}" + "".join(f"{figs[k][key]:13.3f}" for k, _ in names))
PY
