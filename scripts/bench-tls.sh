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

# start NAME CONFIG: gmuxd on a socket and TCP port 0 of its own; prints the port.
start() {
  local name="$1" config="$2"
  printf '%s\n[[tenant]]\nname = "bench"\ntokens = ["bench-token"]\n' "$config" \
    > "$dir/$name.toml"
  "$bin/gmuxd" --socket "$dir/$name.sock" --config "$dir/$name.toml" --listen 127.0.0.1:0 \
    --port-file "$dir/$name.port" --exit-after 1800 > "$dir/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$dir/$name.port" ] && break; sleep 0.1; done
  cat "$dir/$name.port"
}

tls_port=$(start tls "[daemon]
tls_cert = \"$dir/server.pem\"
tls_key = \"$dir/server.key\"")
plain_port=$(start plain "[daemon]
plain_tcp = true")

echo "gmux bench over TLS (port $tls_port), plain TCP (port $plain_port), Unix socket; in $dir" >&2
GMUX_TOKEN=bench-token GMUX_TLS_CA="$dir/ca.pem" \
  "$bin/gmux" bench --address "127.0.0.1:$tls_port" --json "${extra[@]}" > "$dir/tls.json"
GMUX_TOKEN=bench-token \
  "$bin/gmux" bench --address "tcp://127.0.0.1:$plain_port" --json "${extra[@]}" > "$dir/plain.json"
env -u GMUX_SOCKET "$bin/gmux" bench --socket "$dir/tls.sock" --json "${extra[@]}" > "$dir/unix.json"

python3 - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
runs = {k: json.load(open(f"{d}/{k}.json")) for k in ("unix", "plain", "tls")}
def rows(j, prefix=""):
    out = {}
    for k, v in j.items():
        if isinstance(v, dict):
            out.update(rows(v, prefix + k + "."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + k] = v
    return out
flat = {k: rows(v) for k, v in runs.items()}
keys = [k for k in flat["tls"] if "ratio" in k or k.endswith("_us") or "gbps" in k.lower()]
print(f"{'figure':52} {'unix':>10} {'tcp':>10} {'tls':>10}")
for k in keys:
    vals = [flat[r].get(k) for r in ("unix", "plain", "tls")]
    print(f"{k:52} " + " ".join(f"{v:10.3f}" if isinstance(v, (int, float)) else f"{'-':>10}"
                                  for v in vals))
PY
