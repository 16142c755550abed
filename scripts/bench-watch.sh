#!/usr/bin/env bash
# frugal watch end to end (figures go to BENCHMARKS.md): a real `frugal serve` and a real
# `llama-server --metrics` (SmolLM2 Q4_1 both), driven by `frugal bench`, while
# `frugal watch` scrapes both into a ledger of its own. Then it compares:
#   - the tokens and requests watch recorded with the load generator's own counts (usage);
#   - (MODE=duty) the busy share watch measured with the load's duty cycle: phases of
#     back-to-back requests (one client) and silence, each server alone in its phase;
#   - (MODE=trace) an Azure LLM trace replayed at both servers for DURATION seconds, then
#     `frugal report` over the watch ledger (cost per 1k, idle dollars, levers).
# Usage: scripts/bench-watch.sh LLAMA_SERVER_BINARY
#   env: MODE=duty|trace, INTERVAL (watch --interval, default 2s), PHASES, ON (requests per
#   on-phase), OFF (seconds of silence), DURATION (trace mode, seconds), SPEEDUP, NP
#   (llama-server's slots, default 1), TIMEOUT (watch --timeout, default 10s)
set -euo pipefail
cd "$(dirname "$0")/.."
llama_server=${1:?usage: scripts/bench-watch.sh LLAMA_SERVER_BINARY}
model=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
mode=${MODE:-duty}
interval=${INTERVAL:-2s}
out=${OUT:-out/bench-watch-$mode}
frugal=./target/release/frugal
[ -n "${NO_BUILD:-}" ] || cargo build --release -q -p frugal
rm -rf "$out" && mkdir -p "$out"

wait_up() { # PORT PID
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return
    kill -0 "$2" 2>/dev/null || { echo "the server for port $1 exited (its log is in $out)" >&2; exit 1; }
    sleep 0.1
  done
  echo "server on $1 did not start" >&2; exit 1
}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

$frugal --ledger "$out/serve.sqlite" serve --port 8321 --model "$model" --threads 2 --max-batch 8 \
  --no-cache 2>"$out/frugal-serve.log" & pids+=($!)
wait_up 8321 $!
"$llama_server" -m "$model" --port 8322 -t 2 -np "${NP:-1}" -c $((${NP:-1} * 4096)) --metrics --log-disable \
  >"$out/llama-server.log" 2>&1 & pids+=($!)
wait_up 8322 $!

cat > "$out/frugal.toml" <<EOF
[[watch.target]]
name = "frugal-1"
url = "http://127.0.0.1:8321/metrics"
instance = "g5.xlarge"
workload = "chat"
model = "SmolLM2-135M-Instruct.Q4_1"

[[watch.target]]
name = "llama-1"
url = "http://127.0.0.1:8322/metrics"
instance = "g5.xlarge"
workload = "chat"
model = "SmolLM2-135M-Instruct.Q4_1"
EOF
$frugal --config "$out/frugal.toml" --ledger "$out/watch.sqlite" watch --interval "$interval" --timeout "${TIMEOUT:-10s}" \
  >"$out/watch.log" 2>&1 & watch_pid=$!
pids+=($watch_pid)
sleep 5
start=$(date +%s.%N)

bench() { # PORT NAME ARGS...: one bench run, its JSON kept
  local port=$1 name=$2; shift 2
  $frugal bench --url "http://127.0.0.1:$port/v1" --json "$@" > "$out/$name.json" 2>/dev/null
}

if [ "$mode" = duty ]; then
  for i in $(seq "${PHASES:-6}"); do
    bench 8321 "frugal-$i" --concurrency 1 --requests "${ON:-12}" --prompt-tokens 64 --max-tokens 48 --distinct
    bench 8322 "llama-$i" --concurrency 1 --requests "${ON:-12}" --prompt-tokens 64 --max-tokens 48 --distinct
    sleep "${OFF:-20}"
  done
else
  trace=data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv
  # The trace's rows that arrive within DURATION once compressed by SPEEDUP: each load
  # generator then ends on its own, with its counts.
  rows=$(python3 - "$trace" "${DURATION:-3600}" "${SPEEDUP:-0.25}" <<'PY'
import csv, datetime, sys
path, duration, speedup = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
stamps = [datetime.datetime.fromisoformat(r["TIMESTAMP"][:26]) for r in csv.DictReader(open(path))]
print(sum(1 for t in stamps if (t - stamps[0]).total_seconds() < duration * speedup))
PY
)
  echo "replaying $rows trace rows at ${SPEEDUP:-0.25}x to each server"
  args=(--trace "$trace" --speedup "${SPEEDUP:-0.25}" --scale 0.1 --output-scale 0.25
    --max-prompt 256 --max-output 96 --requests "$rows" --timeout 300)
  bench 8321 frugal-1 "${args[@]}" & b1=$!
  bench 8322 llama-1 "${args[@]}" & b2=$!
  pids+=("$b1" "$b2")
  wait "$b1" "$b2"
fi
sleep 6
end=$(date +%s.%N)
kill "$watch_pid"; wait "$watch_pid" 2>/dev/null || true

python3 - "$out" "$mode" "$start" "$end" <<'PY'
import glob, json, sqlite3, sys
out, mode, start, end = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
db = sqlite3.connect(f"{out}/watch.sqlite")
rows = db.execute("""
  SELECT v.name, sum(s.requests), sum(s.input_tokens), sum(s.output_tokens),
         sum(s.busy_ms), sum(s.duration_ms), count(*)
  FROM replica_spans s JOIN dims v ON v.id = s.server GROUP BY v.name ORDER BY v.name""").fetchall()
gaps = sum(1 for l in open(f"{out}/watch.log") if "a gap" in l)
print(f"watch: {sum(r[6] for r in rows)} intervals billed, {gaps} gaps, over {end - start:.0f} s of load")
for name, req, tin, tout, busy_ms, dur_ms, n in rows:
    prefix = "frugal" if name.startswith("frugal") else "llama"
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{prefix}*.json")) if open(p).read().strip()]
    load_req = sum(r["requests"] - r["errors"] for r in runs)
    load_in = sum(r["prompt_tokens"] for r in runs)
    load_out = sum(r["output_tokens"] for r in runs)
    on_s = sum(r["wall_s"] for r in runs)
    diff = lambda a, b: f"{(a - b) / b * 100:+.2f}%" if b else "-"
    print(f"{name}: requests {req} (load {load_req}, {diff(req, load_req)}), "
          f"prompt tokens {tin} (load {load_in}, {diff(tin, load_in)}), "
          f"output tokens {tout} (load {load_out}, {diff(tout, load_out)})")
    busy = busy_ms / dur_ms
    line = f"{name}: busy share {busy * 100:.1f}% over {dur_ms / 1000:.0f} s watched"
    if mode == "duty":
        duty = on_s / (dur_ms / 1000)
        line += f"; the load's duty cycle {duty * 100:.1f}% ({on_s:.0f} s of requests in flight)"
    print(line)
PY
$frugal --ledger "$out/watch.sqlite" report > "$out/report.txt"
echo "frugal report over the watch ledger: $out/report.txt"
