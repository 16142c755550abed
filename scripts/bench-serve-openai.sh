#!/usr/bin/env bash
# frugal serve against llama.cpp's llama-server on the same GGUF file, through the official
# openai client (scripts/bench-openai.py), at 1 and 8 concurrent streams, interleaved, in one
# run (figures go to BENCHMARKS.md). Both get 2 threads; frugal runs without its caches, so
# only the engines and their HTTP stacks are compared.
# Usage: scripts/bench-serve-openai.sh LLAMA_SERVER [MODEL.gguf]   (ROUNDS=2, STREAMS="1 8",
# SPECULATE=ngram|none; llama-server built with cmake from the llama.cpp source inside the
# llama-cpp-python sdist)
set -euo pipefail
cd "$(dirname "$0")/.."
llama_server=${1:?usage: scripts/bench-serve-openai.sh LLAMA_SERVER [MODEL.gguf]}
model=${2:-models/smollm2/SmolLM2-135M-Instruct.Q8_0.gguf}
frugal=./target/release/frugal
cargo build --release -q -p frugal
python3 -c 'import openai' 2>/dev/null || python3 -m pip install -q 'openai>=1.50'

wait_up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null 2>&1 && return; sleep 0.1; done; echo "server on $1 did not start" >&2; exit 1; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

echo "== $model: frugal serve (speculate ${SPECULATE:=ngram}) vs llama-server, openai client, ~128-token prompts, 128 tokens out, 2 threads; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for round in $(seq "${ROUNDS:-2}"); do
  for c in ${STREAMS:-1 8}; do
    $frugal serve --no-meter --no-cache --no-semantic-cache --port 8302 --model "$model" --threads 2 --speculate "$SPECULATE" >/dev/null 2>&1 & pid=$!
    wait_up 8302
    f=$(python3 scripts/bench-openai.py http://127.0.0.1:8302/v1 --concurrency "$c")
    stop $pid
    "$llama_server" -m "$model" --port 8303 -t 2 -np "$c" -c $((c * 512)) --cont-batching >/dev/null 2>&1 & pid=$!
    wait_up 8303
    l=$(python3 scripts/bench-openai.py http://127.0.0.1:8303/v1 --concurrency "$c")
    stop $pid
    python3 - "$f" "$l" "$round" <<'PY'
import json, sys
f, l, r = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
print(f"round {r}, {f['concurrency']} streams: frugal {f['output_tokens_per_s']:6.1f} tok/s "
      f"(stream {f['stream_decode_tokens_per_s_p50']:6.1f}, TTFT {f['ttft_p50_s']*1e3:4.0f} ms), "
      f"llama-server {l['output_tokens_per_s']:6.1f} tok/s (stream {l['stream_decode_tokens_per_s_p50']:6.1f}, "
      f"TTFT {l['ttft_p50_s']*1e3:4.0f} ms): {f['output_tokens_per_s'] / l['output_tokens_per_s']:.2f}x")
PY
  done
done
