#!/usr/bin/env bash
# The quality side of the speed/size/quality frontier: a model re-quantized at load to each
# type, as `frugal serve --quant` runs it, against its own file dequantized to F32, on a
# held-out text (perplexity, KL divergence, same top token) and on the cascade questions
# (accuracy, flips). One markdown row per type on stdout; the JSON of each run in $OUT.
#
#   scripts/eval-frontier.sh [MODEL.gguf] [TEXT] [CHUNKS] [QUESTIONS]
#   TYPES="q8_0 q4_0" NO_BUILD=1 scripts/eval-frontier.sh
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
text=${2:-data/eval/shakespeare-heldout.txt}
chunks=${3:-8}
questions=${4:-306}
types=${TYPES:-q8_0 q6_k q5_k q5_1 q5_0 q4_k q4_1 q4_0}
out=${OUT:-out/eval-frontier}
mkdir -p "$out"
[ -n "${NO_BUILD:-}" ] || cargo build --release -p frugal -q
frugal=./target/release/frugal
record=(--record "$out/evals.jsonl")

echo "model: $model; text: $text, $chunks chunks of 512; $questions questions; CPU: $(lscpu | sed -n 's/^Model name: *//p')"
echo
echo "| type | weights MB | PPL | PPL ratio | mean KLD | p99 KLD | same top | accuracy | reference accuracy | flips |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for t in $types; do
  $frugal eval ppl --model "$model" --quant "$t" --text "$text" --chunks "$chunks" \
    --json "${record[@]}" > "$out/ppl-$t.json"
  $frugal eval tasks --model "$model" --quant "$t" --limit "$questions" \
    --json "${record[@]}" > "$out/tasks-$t.json"
  python3 - "$out/ppl-$t.json" "$out/tasks-$t.json" "$t" <<'PY'
import json, sys
p, k = (json.load(open(f)) for f in sys.argv[1:3])
r = p["reference"]
print(f"| {sys.argv[3]} | {p['weights_bytes']/1e6:.1f} | {p['ppl']:.3f} | {r['ppl_ratio']:.4f} | {r['kld']['mean']:.5f} "
      f"| {r['kld']['p99']:.4f} | {r['top1']*100:.1f}% | {k['accuracy']*100:.1f}% "
      f"| {k['reference_accuracy']*100:.1f}% | {k['flips']} |")
PY
done
