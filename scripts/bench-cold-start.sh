#!/usr/bin/env bash
# Cold starts by backend kind: each pool is taken to zero, then asked one question, ROUNDS
# times. The cold start (start to ready, the ledger's starting spans) and the wait it added
# at the activator (the request's wait_ms) are read from the ledger, beside the same
# question answered warm. `local`: frugal's engine loaded in the gateway (the GGUF in the
# page cache after the first round); `process`: a `frugal serve` replica; `llama-server`
# too when LLAMA_SERVER names one.
#
#   scripts/bench-cold-start.sh                      # figures in out/bench-cold-start/summary.txt
#   LLAMA_SERVER=~/llama.cpp/build/bin/llama-server scripts/bench-cold-start.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/frugal}
MODEL=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-5}
OUT=out/bench-cold-start
rm -rf "$OUT" && mkdir -p "$OUT"
pool() { # name backend extra-lines
  cat <<TOML
[[serve.pool]]
name = "$1"
backend = "$2"
model = "$PWD/$MODEL"
price_per_hour = "1.00"
scale_to_zero_after = "1s"
stable_window = "2s"
panic_window = "1s"
tick = "100ms"
$3
TOML
}
{
  pool local local ""
  pool process process "command = \"$PWD/$BIN serve --model {model} --port {port} --no-meter --no-cache --price-per-hour 0 --name process\""
  if [ -n "${LLAMA_SERVER:-}" ]; then
    pool llama process "command = \"$LLAMA_SERVER -m {model} --port {port} -c 2048\""
  fi
} > "$OUT/frugal.toml"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" --config "$OUT/frugal.toml" --ledger "$OUT/ledger.sqlite" serve --no-model --no-cache --port "$port" 2> "$OUT/gateway.log" &
gw=$!
trap 'kill $gw 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do sleep 0.2; done
pools="local process"
[ -n "${LLAMA_SERVER:-}" ] && pools="$pools llama"
ask() { curl -s -o /dev/null -w '%{time_total}' "http://127.0.0.1:$port/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d "{\"model\":\"$1\",\"messages\":[{\"role\":\"user\",\"content\":\"Name a colour.\"}],\"max_tokens\":4,\"temperature\":0}"; }
for r in $(seq "$ROUNDS"); do
  for p in $pools; do
    until [ "$(curl -s "http://127.0.0.1:$port/v1/pools/$p/scale" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["ready"]+s["starting"]+s["draining"])')" = 0 ]; do sleep 0.2; done
    cold=$(ask "$p"); warm=$(ask "$p")
    echo "$p $cold $warm" >> "$OUT/rounds.txt"
  done
done
kill -TERM $gw; wait $gw || true
trap - EXIT
python3 - "$OUT" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" <<'PY' | tee "$OUT/summary.txt"
import sqlite3, statistics as st, sys
out, cores, cpu = sys.argv[1], sys.argv[2], sys.argv[3].strip()
db = sqlite3.connect(f"{out}/ledger.sqlite")
name = {i: n for i, n in db.execute("SELECT id, name FROM dims")}
starts = {}
for pool, dur in db.execute("SELECT pool, duration_ms FROM replica_spans WHERE state = 0 AND failed = 0"):
    starts.setdefault(name[pool], []).append(dur / 1000)
waits = {}
for model, w in db.execute("SELECT model, wait_ms FROM events WHERE kind = 0 AND wait_ms > 0"):
    waits.setdefault(name[model], []).append(w / 1000)
rounds = {}
for line in open(f"{out}/rounds.txt"):
    p, cold, warm = line.split()
    rounds.setdefault(p, []).append((float(cold), float(warm)))
print(f"cold starts on {cpu} ({cores} vCPU), {len(next(iter(rounds.values())))} rounds each; seconds, median (max)")
print(f"{'pool':10}{'start to ready':>18}{'activator wait':>18}{'answer cold':>16}{'answer warm':>16}")
f = lambda xs: f"{st.median(xs):.3f} ({max(xs):.3f})" if xs else "-"
for p, rs in rounds.items():
    print(f"{p:10}{f(starts.get(p, [])):>18}{f(waits.get(p, [])):>18}{f([c for c, _ in rs]):>16}{f([w for _, w in rs]):>16}")
PY
