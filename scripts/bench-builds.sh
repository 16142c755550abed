#!/usr/bin/env bash
# Two builds of frugal side by side on the local engine, in one run: each serves the same
# model (`frugal serve --no-meter`) and the same `frugal bench` (build B's) drives it, one
# stream and then CONC streams, rounds interleaved A, B, A, B so the machine's noise falls on
# both. For a change that must not move engine speed (a refactor): compare the ratios.
# Usage: scripts/bench-builds.sh BEFORE_BINARY AFTER_BINARY
# Env: MODEL (default SmolLM2 Q4_1), ROUNDS=2, REQUESTS=8, TOKENS=128, CONC=8, THREADS=2.
set -euo pipefail
cd "$(dirname "$0")/.."
a=${1:?usage: bench-builds.sh BEFORE AFTER}
b=${2:?usage: bench-builds.sh BEFORE AFTER}
model=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${ROUNDS:-2}
requests=${REQUESTS:-8}
tokens=${TOKENS:-128}
conc=${CONC:-8}
threads=${THREADS:-2}
port=8391
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# Output tokens per second of one build at `clients` streams.
measure() {
  local bin=$1 clients=$2 out=$3
  "$bin" serve --no-meter --no-semantic-cache --model "$model" --threads "$threads" --port $port 2>"$work/serve.log" &
  pid=$!
  for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  "$b" bench --url "http://127.0.0.1:$port/v1" --concurrency "$clients" --requests "$((requests * clients))" \
    --prompt-tokens 64 --max-tokens "$tokens" --distinct --json >"$out"
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
}

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "model: $model, $threads threads, $requests requests per stream, $tokens tokens each"
for r in $(seq "$rounds"); do
  for clients in 1 "$conc"; do
    measure "$a" "$clients" "$work/a-$r-$clients.json"
    measure "$b" "$clients" "$work/b-$r-$clients.json"
  done
done
python3 - "$work" "$rounds" "$conc" <<'PY'
import json, sys
work, rounds, conc = sys.argv[1], int(sys.argv[2]), sys.argv[3]
print(f"{'streams':>7} {'round':>5} {'before tok/s':>12} {'after tok/s':>11} {'after/before':>12}")
for clients in ["1", conc]:
    ratios = []
    for r in range(1, rounds + 1):
        a = json.load(open(f"{work}/a-{r}-{clients}.json"))["output_tokens_per_s"]
        b = json.load(open(f"{work}/b-{r}-{clients}.json"))["output_tokens_per_s"]
        ratios.append(b / a)
        print(f"{clients:>7} {r:>5} {a:>12.1f} {b:>11.1f} {b / a:>12.3f}")
    print(f"{clients:>7} {'mean':>5} {'':>12} {'':>11} {sum(ratios) / len(ratios):>12.3f}")
PY
