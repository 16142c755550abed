#!/usr/bin/env bash
# Serving benchmarks, side by side in one run (figures go to BENCHMARKS.md):
#   1. continuous against static (padded) and draining batching on a trace replay, at
#      several offered loads (SPEEDUPS, trace time compressed by each);
#   2. frugal serve vs llama.cpp's llama-server at 1, 4, 8, 16 concurrent streams.
# Usage: scripts/bench-serve.sh [LLAMA_SERVER_BINARY]   (the second part needs llama-server,
# built with cmake from the llama.cpp source inside the llama-cpp-python sdist)
set -euo pipefail
cd "$(dirname "$0")/.."
model=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
frugal=./target/release/frugal
llama_server=${1:-}
out=${OUT:-out/bench}
mkdir -p "$out"
cargo build --release -q -p frugal

wait_up() { for _ in $(seq 200); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return; sleep 0.1; done; echo "server on $1 did not start" >&2; exit 1; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

if [ -z "${PEER_ONLY:-}" ]; then
echo "== continuous vs static batching, trace replay (Azure conv trace, first ${ROWS:=100} rows, prompts x0.1, outputs x${OSCALE:=1} capped at ${MAXOUT:=1024}, max batch ${MAXB:=16})"
for speedup in ${SPEEDUPS:-0.5 1 2}; do
for mode in continuous static drain; do
  $frugal serve --no-meter --port 8301 --model "$model" --batching $mode --max-batch "${MAXB:=16}" 2>/dev/null & pid=$!
  wait_up 8301
  $frugal bench --url http://127.0.0.1:8301/v1 --trace data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv \
    --requests "$ROWS" --speedup "$speedup" --scale 0.1 --output-scale "$OSCALE" --max-prompt 512 --max-output "$MAXOUT" --json > "$out/trace-$speedup-$mode.json"
  stop $pid
done
python3 - "$out" "$speedup" <<'PY'
import json, sys
out, speedup = sys.argv[1:]
runs = {m: json.load(open(f"{out}/trace-{speedup}-{m}.json")) for m in ("continuous", "static", "drain")}
c = runs["continuous"]
for m, s in runs.items():
    ratio = c["requests_per_s"] / max(s["requests_per_s"], 1e-9)
    print(f"{speedup:>4}x {m:>10}: {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:6.1f} out tok/s, "
          f"TTFT p50 {s['ttft']['p50']:7.3f}s p99 {s['ttft']['p99']:7.3f}s, continuous/this {ratio:.2f}x, errors {s['errors']}")
PY
done

fi
[ -n "${TRACE_ONLY:-}" ] && exit 0
[ -n "$llama_server" ] || { echo "(no llama-server given: skipping the peer comparison)"; exit 0; }
echo "== frugal serve vs llama-server, 128-token prompts, 128 tokens out, 2 threads"
for c in ${LEVELS:-1 4 8 16}; do
  n=$((c * 4 > 16 ? c * 4 : 16))
  $frugal serve --no-meter --port 8302 --model "$model" --threads 2 --max-batch 16 2>/dev/null & pid=$!
  wait_up 8302
  $frugal bench --url http://127.0.0.1:8302/v1 --concurrency $c --requests $n --prompt-tokens 128 --max-tokens 128 --json > "$out/frugal-c$c.json"
  stop $pid
  "$llama_server" -m "$model" --port 8303 -t 2 -np 16 -c $((16 * 512)) --cont-batching --log-disable >/dev/null 2>&1 & pid=$!
  wait_up 8303
  $frugal bench --url http://127.0.0.1:8303/v1 --concurrency $c --requests $n --prompt-tokens 128 --max-tokens 128 --json > "$out/llama-c$c.json"
  stop $pid
  python3 - "$out/frugal-c$c.json" "$out/llama-c$c.json" $c <<'PY'
import json, sys
f, l = (json.load(open(p)) for p in sys.argv[1:3])
print(f"c={sys.argv[3]:>2}: frugal {f['output_tokens_per_s']:7.1f} tok/s (TTFT p50 {f['ttft']['p50']:.3f}s)  "
      f"llama-server {l['output_tokens_per_s']:7.1f} tok/s (TTFT p50 {l['ttft']['p50']:.3f}s)  "
      f"ratio {f['output_tokens_per_s'] / max(l['output_tokens_per_s'], 1e-9):.2f}x  errors {f['errors']}/{l['errors']}")
PY
done
