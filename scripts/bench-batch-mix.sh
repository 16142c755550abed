#!/usr/bin/env bash
# Interactive latency with a batch on the same engine, in one run of `frugal serve`:
#   A. the interactive trace alone (Azure conv trace, streamed, TTFT measured);
#   B. the same trace while a batch of real questions runs through the Batch API (lines at the
#      engine's lower priority): TTFT, and the batch's lines done in the gaps;
#   C. the same trace beside the same work sent as ordinary requests (8 clients back to back):
#      what the batch would do to interactive traffic without its lower priority.
# Then the report's cost per 1M tokens of the batch against the interactive traffic.
#
#   scripts/bench-batch-mix.sh   (ROWS=60 SPEEDUP=1 BATCH=3000 MAXB=16 to change the load; the
#                                  Batch API runs 8 lines of a batch at once, so MAXB=8 lets
#                                  the batch fill the engine and interactive requests preempt)
set -euo pipefail
cd "$(dirname "$0")/.."
frugal=./target/release/frugal
model=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${OUT:-out/bench-batch-mix}
ROWS=${ROWS:-60}
SPEEDUP=${SPEEDUP:-1}
BATCH=${BATCH:-3000}
MAXB=${MAXB:-16}
port=8302
api=http://127.0.0.1:$port/v1
rm -rf "$out" && mkdir -p "$out"
python3 scripts/make-batch.py --lines "$BATCH" --max-tokens 24 --out "$out/batch.jsonl"

$frugal --ledger "$out/ledger.sqlite" serve --model "$model" --port $port --no-cache --max-batch "$MAXB" \
  --price-per-hour 0.40 2>"$out/serve.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done

trace() { # NAME
  $frugal bench --url "$api" --trace data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv \
    --requests "$ROWS" --speedup "$SPEEDUP" --scale 0.1 --max-output 64 --distinct --json >"$out/$1.json"
}
counts() { curl -sf "$api/batches/$1" | python3 -c 'import json,sys; b=json.load(sys.stdin); c=b["request_counts"]; print(c["completed"]+c["failed"], b["status"])'; }

echo "== A: interactive alone" >&2
trace alone

echo "== B: beside a batch of $BATCH lines (Batch API)" >&2
file=$(curl -sf "$api/files" -F purpose=batch -F "file=@$out/batch.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
batch=$(curl -sf "$api/batches" -H 'content-type: application/json' \
  -d "{\"input_file_id\": \"$file\", \"endpoint\": \"/v1/chat/completions\", \"completion_window\": \"24h\"}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
until counts "$batch" | grep -q in_progress; do sleep 0.5; done
sleep 5 # the batch's lines fill the engine
read -r before _ < <(counts "$batch")
start=$(date +%s.%N)
trace with-batch
end=$(date +%s.%N)
read -r after _ < <(counts "$batch")
preempted=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^frugal_batch_preemptions_total/ {print $2}')
curl -sf -X POST "$api/batches/$batch/cancel" >/dev/null
until counts "$batch" | grep -q cancelled; do sleep 0.5; done

echo "== C: beside the same work as ordinary requests" >&2
$frugal bench --url "$api" --concurrency 8 --requests 100000 --prompt-tokens 40 --max-tokens 24 \
  --distinct --json >"$out/background.json" 2>/dev/null &
load=$!
sleep 5
trace with-plain-load
kill $load 2>/dev/null || true
wait $load 2>/dev/null || true

kill $server && wait $server || true
trap - EXIT
$frugal --ledger "$out/ledger.sqlite" report --json >"$out/report.json"

echo "max batch $MAXB; batch lines preempted for interactive requests during B: $preempted"
python3 - "$out" "$before" "$after" "$start" "$end" <<'PY'
import json, sys
out, before, after, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
for name, label in [("alone", "A alone"), ("with-batch", "B + batch (low priority)"), ("with-plain-load", "C + same work at equal priority")]:
    r = json.load(open(f"{out}/{name}.json"))
    print(f"{label:34} TTFT p50 {r['ttft']['p50']*1000:7.0f} ms  p99 {r['ttft']['p99']*1000:7.0f} ms  "
          f"{r['requests_per_s']:.2f} req/s  errors {r['errors']}")
secs = end - start
print(f"batch lines done during B: {after - before} in {secs:.0f} s ({(after - before) / secs:.2f} lines/s)")
rep = json.load(open(f"{out}/report.json"))
usd = lambda nanos: "-" if nanos is None else f"${nanos / 1e9:.4f}"
for j in rep.get("batch", []):
    print(f"batch {j['job']}: {j['lines']} lines; per 1M tokens {usd(j['per_m_tokens'])} against interactive "
          f"{usd(j['interactive_per_m_tokens'])}; per 1k {usd(j['per_1k'])} against {usd(j['interactive_per_1k'])}")
PY
