#!/usr/bin/env bash
# Autoscaling against a fixed pool on the same replayed demand: a `process` pool of real
# `frugal serve` replicas behind `frugal serve --no-model`, once with min_replicas = 0
# (autoscaled, scale to zero) and once with min = max (provisioned for the peak). A bursty
# day of data/demand-traces/ is scaled and compressed by scripts/make-demand-trace.py (it
# prints the factors), with Azure-trace token lengths; `frugal bench --trace` replays it.
# Replica-seconds and their cost are read from the ledger's replica spans, clipped to the
# replay's window; TTFT and errors from the bench.
#
#   scripts/bench-pool.sh            # figures in out/bench-pool/summary.txt
#   DAY=2015-03-21 MINUTES=10 PEAK_RPS=6 MAX=4 scripts/bench-pool.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/frugal}
MODEL=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
DAY=${DAY:-2015-04-06}
MINUTES=${MINUTES:-10}
PEAK_RPS=${PEAK_RPS:-6}
MAX=${MAX:-4}
TARGET=${TARGET:-2}
INSTANCE=${INSTANCE:-g5.xlarge}
OUT=out/bench-pool
mkdir -p "$OUT"
python3 scripts/make-demand-trace.py --day "$DAY" --minutes "$MINUTES" --peak-rps "$PEAK_RPS" \
  > "$OUT/trace.csv" 2> "$OUT/trace.txt"
cat "$OUT/trace.txt"

run() { # mode min
  local mode=$1 min=$2 dir="$OUT/$1"
  rm -rf "$dir" && mkdir -p "$dir"
  cat > "$dir/frugal.toml" <<TOML
[[serve.pool]]
name = "smol"
backend = "process"
command = "$PWD/$BIN serve --model {model} --port {port} --no-meter --no-cache --price-per-hour 0 --threads 1 --name smol"
model = "$PWD/$MODEL"
min_replicas = $min
max_replicas = $MAX
target_in_flight = $TARGET
stable_window = "20s"
panic_window = "3s"
scale_to_zero_after = "30s"
tick = "250ms"
instance = "$INSTANCE"
TOML
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$BIN" --config "$dir/frugal.toml" --ledger "$dir/ledger.sqlite" serve --no-model --no-cache \
    --port "$port" 2> "$dir/gateway.log" &
  local gw=$!
  until curl -sf "http://127.0.0.1:$port/v1/pools/smol/scale" > /dev/null; do sleep 0.2; done
  # A fixed pool is warm before the replay starts, as one provisioned for the peak is.
  until [ "$(curl -s "http://127.0.0.1:$port/v1/pools/smol/scale" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ready"])')" -ge "$min" ]; do sleep 0.2; done
  local t0 t1
  t0=$(date +%s%3N)
  "$BIN" bench --url "http://127.0.0.1:$port/v1" --model smol --trace "$OUT/trace.csv" \
    --requests 100000 --scale 0.1 --output-scale 0.1 --max-prompt 256 --max-output 64 \
    --instance "$INSTANCE" --json > "$dir/bench.json"
  t1=$(date +%s%3N)
  kill -TERM "$gw" && wait "$gw" || true
  python3 - "$dir" "$t0" "$t1" "$mode" <<'PY'
import json, sqlite3, sys
d, t0, t1, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
db = sqlite3.connect(f"{d}/ledger.sqlite")
secs = cost = 0.0
cold = 0
for ts, dur, c, state, failed in db.execute("SELECT ts_ms, duration_ms, cost, state, failed FROM replica_spans"):
    lo, hi = max(ts, t0), min(ts + dur, t1)
    if hi > lo and dur > 0:
        secs += (hi - lo) / 1000
        cost += c / 1e9 * (hi - lo) / dur
    if state == 0 and not failed and t0 <= ts < t1:
        cold += 1
waits = sorted(w for (w,) in db.execute("SELECT wait_ms FROM events WHERE kind = 0 AND outcome IS NULL"))
rank = lambda q: waits[max(0, -(-len(waits) * q // 100) - 1)] if waits else 0  # nearest rank
b = json.load(open(f"{d}/bench.json"))
ok = b["requests"] - b["errors"]
row = {
    "mode": mode, "window_s": (t1 - t0) / 1000, "replica_s": secs, "cost_usd": cost,
    "per_1k_usd": cost / ok * 1000 if ok else None, "requests": b["requests"], "errors": b["errors"],
    "ttft_p50_s": b["ttft"]["p50"], "ttft_p99_s": b["ttft"]["p99"], "cold_starts": cold,
    "held": sum(1 for w in waits if w > 0), "wait_p99_ms": rank(99), "wait_max_ms": waits[-1] if waits else 0,
}
json.dump(row, open(f"{d}/row.json", "w"))
print(json.dumps(row))
PY
}

run autoscale 0
run fixed "$MAX"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
a, f = (json.load(open(f"{sys.argv[1]}/{m}/row.json")) for m in ("autoscale", "fixed"))
import subprocess
cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2", shell=True, capture_output=True, text=True).stdout.strip()
print(f"on {cpu}, {subprocess.run('nproc', capture_output=True, text=True).stdout.strip()} vCPU")
print(f"{'':22}{'autoscaled (min 0)':>20}{'fixed at peak':>16}")
for k, fmt in [("window_s", "{:.0f}"), ("replica_s", "{:.0f}"), ("cost_usd", "${:.4f}"), ("per_1k_usd", "${:.4f}"),
               ("requests", "{}"), ("errors", "{}"), ("ttft_p50_s", "{:.3f}"), ("ttft_p99_s", "{:.3f}"),
               ("cold_starts", "{}"), ("held", "{}"), ("wait_p99_ms", "{}"), ("wait_max_ms", "{}")]:
    print(f"{k:22}{fmt.format(a[k]):>20}{fmt.format(f[k]):>16}")
print(f"replica-seconds saved: {1 - a['replica_s'] / f['replica_s']:.0%}; "
      f"p99 TTFT {a['ttft_p99_s'] / f['ttft_p99_s']:.2f}x the fixed pool's")
PY
