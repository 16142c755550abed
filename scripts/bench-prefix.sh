#!/usr/bin/env bash
# Prefix reuse on real multi-turn chats, in one run (figures go to BENCHMARKS.md):
#   frugal serve with its prefix cache, frugal serve with --no-prefix-cache, and llama.cpp's
#   llama-server (--parallel 4, cache_prompt on as it is by default), on the same SmolLM2
#   Q8_0 file, each replaying the same ShareGPT conversations with `frugal bench
#   --conversations` (each turn: the conversation so far with the server's own answers, then
#   the next user message; several conversations in flight). One table, and the ratios of
#   later-turn TTFT p50: frugal with / without its cache, and frugal / llama-server.
#
#   scripts/bench-prefix.sh                  # ShareGPT, 200 conversations, 8 in flight
#   WORKLOAD=system scripts/bench-prefix.sh  # a ~900-token shared system prompt, short questions
#   MODE=pool scripts/bench-prefix.sh        # 3 `process` replicas: routing prefix vs least_in_flight
#   CONVERSATIONS=20 IN_FLIGHT=4 scripts/bench-prefix.sh   # a quick look
#   SPEEDUP=0.2 scripts/bench-prefix.sh      # arrivals from the Azure conversation trace, x0.2
#
# Needs: the model (scripts/fetch-models.sh smollm2; the Q8_0 file is made from the shipped
# Q4_1 with `frugal quantize` when missing), ShareGPT (scripts/fetch-sharegpt.sh, run here when
# missing), and llama-server: LLAMA_SERVER=PATH, else built once into out/llama.cpp from the
# llama.cpp tree vendored in the llama-cpp-python 0.3.36 sdist (cmake from PyPI when the machine
# has none). Each run's JSON and transcripts are kept in out/bench-prefix/. BIN_WITHOUT=PATH: a
# frugal built without the prefix cache, run as "frugal-no-prefix" where BIN has no
# --no-prefix-cache.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/frugal}
Q41=models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q8_0.gguf}
MODE=${MODE:-servers}
WORKLOAD=${WORKLOAD:-sharegpt}
CONVERSATIONS=${CONVERSATIONS:-200}
IN_FLIGHT=${IN_FLIGHT:-8}
TURNS=${TURNS:-4}
MAX_TOKENS=${MAX_TOKENS:-32}
MAX_PROMPT=${MAX_PROMPT:-1500}
THREADS=${THREADS:-2}
PRICE=${PRICE:-0.10}   # $/hour of the machine under test: cost per 1,000 requests = price x wall time
SLOTS=${SLOTS:-4}
OUT=${OUT:-out/bench-prefix}
mkdir -p "$OUT"

[ -x "$BIN" ] || cargo build --release -q -p frugal
[ -f "$Q41" ] || scripts/fetch-models.sh smollm2
[ -f "$MODEL" ] || "$BIN" quantize "$Q41" "$MODEL" --type q8_0 > /dev/null

case $WORKLOAD in
  sharegpt)
    scripts/fetch-sharegpt.sh > /dev/null
    load=(--conversations data/sharegpt/sharegpt-v3.jsonl --turns "$TURNS") ;;
  system)
    # Single questions (the Quora questions of data/workload) under one long instruction block.
    load=(--conversations data/workload/qqp-replay.jsonl --system-prompt data/workload/system-prompt.txt --turns 1) ;;
  *) echo "WORKLOAD is sharegpt or system" >&2; exit 2 ;;
esac
bench_args=("${load[@]}" --requests "$CONVERSATIONS" --concurrency "$IN_FLIGHT"
  --max-tokens "$MAX_TOKENS" --max-prompt "$MAX_PROMPT" --price-per-hour "$PRICE" --json)
# SPEEDUP=X: conversations start at the Azure conversation trace's arrival times divided by X
# (about 5.4 a second at X = 1) instead of IN_FLIGHT at a time.
[ -z "${SPEEDUP:-}" ] || bench_args+=(--trace data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv --speedup "$SPEEDUP")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_up() { for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return; sleep 0.1; done; echo "server on $1 did not start" >&2; exit 1; }
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# build_llama_server DIR: llama-server from the sdist's vendored llama.cpp (build 0c1e570, as
# BENCHMARKS.md's other peer runs). GGML_NATIVE=OFF with AVX2/FMA/F16C: NATIVE picks up AMX on
# some EPYCs and dies with an illegal instruction.
build_llama_server() {
  local dir=$1
  [ -x "$dir/build/bin/llama-server" ] && return
  echo "building llama-server into $dir (once; minutes)" >&2
  mkdir -p "$dir"
  local cmake=cmake
  if ! command -v cmake >/dev/null; then
    [ -x "$dir/venv/bin/cmake" ] || { python3 -m venv "$dir/venv" && "$dir/venv/bin/pip" install --quiet cmake; }
    cmake=$dir/venv/bin/cmake
  fi
  if [ ! -d "$dir/src" ]; then
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d "$dir/sdist" llama-cpp-python==0.3.36
    mkdir -p "$dir/src"
    tar -xzf "$dir"/sdist/llama_cpp_python-*.tar.gz -C "$dir/src" --strip-components=1
  fi
  "$cmake" -S "$dir/src/vendor/llama.cpp" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON > /dev/null
  "$cmake" --build "$dir/build" --target llama-server -j "${JOBS:-2}" > /dev/null
}

# The frugal build may predate --no-prefix-cache: then that run is left out, said so.
has_flag() { "$BIN" serve --help 2>/dev/null | grep -q -- "$1"; }

bench() { # NAME PORT [extra bench args]: the replay against 127.0.0.1:PORT into $OUT/NAME.json
  local name=$1 port=$2
  shift 2
  "$BIN" bench --url "http://127.0.0.1:$port/v1" "${bench_args[@]}" "$@" \
    --transcript "$OUT/$name.transcript.jsonl" > "$OUT/$name.json"
}

frugal_run() { # NAME [serve flags]
  local name=$1 port
  shift
  port=$(free_port)
  "$BIN" serve --no-meter --no-cache --port "$port" --model "$MODEL" --threads "$THREADS" "$@" \
    2> "$OUT/$name.log" & local pid=$!
  wait_up "$port"
  bench "$name" "$port"
  stop $pid
}

llama_run() {
  local port server=${LLAMA_SERVER:-}
  if [ -z "$server" ]; then
    build_llama_server out/llama.cpp
    server=out/llama.cpp/build/bin/llama-server
  fi
  port=$(free_port)
  # Each slot holds one conversation's context (4096 tokens: the replay's estimate of a prompt's
  # length can run over MAX_PROMPT); cache_prompt (on by default) reuses a slot's.
  "$server" -m "$MODEL" --port "$port" -t "$THREADS" --parallel "$SLOTS" -c $((SLOTS * 4096)) \
    --cont-batching > "$OUT/llama-server.log" 2>&1 & local pid=$!
  wait_up "$port"
  bench llama-server "$port"
  stop $pid
}

pool_run() { # ROUTING: 3 process replicas behind one gateway; each replica's /metrics after
  local routing=$1 dir=$OUT/pool-$1 port
  rm -rf "$dir" && mkdir -p "$dir"
  # Each replica notes its port, so its own /metrics can be read after the replay.
  cat > "$dir/replica.sh" <<SH
#!/bin/sh
echo "\$2" > "$PWD/$dir/replica-\$1.port"
exec "$PWD/$BIN" serve --model "\$3" --port "\$2" --no-meter --no-cache --price-per-hour 0 --threads 1 --name smol
SH
  chmod +x "$dir/replica.sh"
  cat > "$dir/frugal.toml" <<TOML
[[serve.pool]]
name = "smol"
backend = "process"
command = "$PWD/$dir/replica.sh {replica} {port} {model}"
model = "$PWD/$MODEL"
min_replicas = 3
max_replicas = 3
routing = "$routing"
TOML
  port=$(free_port)
  "$BIN" --config "$dir/frugal.toml" serve --no-model --no-meter --no-cache --port "$port" \
    2> "$dir/gateway.log" & local gw=$!
  until [ "$(curl -s "http://127.0.0.1:$port/v1/pools/smol/scale" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ready"])' 2>/dev/null || echo 0)" -ge 3 ]; do
    kill -0 $gw 2>/dev/null || { echo "the gateway did not start:" >&2; tail -5 "$dir/gateway.log" >&2; exit 1; }
    sleep 0.2
  done
  bench "pool-$routing" "$port" --model smol
  for f in "$dir"/replica-*.port; do
    curl -s "http://127.0.0.1:$(cat "$f")/metrics" > "${f%.port}.metrics"
  done
  stop $gw
}

lscpu | grep -m1 "Model name" || true
echo "workload $WORKLOAD: $CONVERSATIONS conversations, ${SPEEDUP:+Azure arrivals x$SPEEDUP, not }$IN_FLIGHT in flight, <= $TURNS turns, <= $MAX_PROMPT prompt tokens, $MAX_TOKENS tokens an answer; $MODEL, $THREADS threads"
if [ "$MODE" = pool ]; then
  runs="pool-prefix pool-least_in_flight"
  pool_run prefix
  pool_run least_in_flight
else
  runs="frugal"
  frugal_run frugal
  if has_flag --no-prefix-cache; then
    frugal_run frugal-no-prefix --no-prefix-cache
    runs="$runs frugal-no-prefix"
  elif [ -n "${BIN_WITHOUT:-}" ]; then
    # A frugal built before the prefix cache, as the run without it.
    BIN=$BIN_WITHOUT frugal_run frugal-no-prefix
    runs="$runs frugal-no-prefix"
  else
    echo "(this frugal has no --no-prefix-cache and no BIN_WITHOUT was given: that run is left out)"
  fi
  llama_run
  runs="$runs llama-server"
fi

python3 - "$OUT" $runs <<'PY'
import glob, json, os, re, sys
out, runs = sys.argv[1], sys.argv[2:]
s = {r: json.load(open(f"{out}/{r}.json")) for r in runs}
usd = lambda v: "-" if v is None else f"${v / 1e9:.4f}"
print(f"{'server':<22}{'first TTFT p50':>15}{'later p50':>11}{'later p99':>11}{'prefill tok':>12}"
      f"{'cached tok':>12}{'decode tok/s':>13}{'$/1k req':>10}{'turns':>7}{'errors':>7}")
for r, v in s.items():
    cached = f"{v['cached_tokens']:,}" if v["cache_reported"] else "-"
    print(f"{r:<22}{v['first_turn_ttft']['p50']:>14.3f}s{v['later_turn_ttft']['p50']:>10.3f}s"
          f"{v['later_turn_ttft']['p99']:>10.3f}s{v['prefill_tokens']:>12,}{cached:>12}"
          f"{v['decode_tok_s']['p50']:>13.1f}{usd(v['cost_per_1k_requests']):>10}{v['requests']:>7}{v['errors']:>7}")
def ratio(a, b):
    if a in s and b in s:
        x, y = s[a]["later_turn_ttft"]["p50"], s[b]["later_turn_ttft"]["p50"]
        print(f"later-turn TTFT p50, {a} / {b}: {x / max(y, 1e-9):.2f}x")
ratio("frugal", "frugal-no-prefix")
ratio("frugal", "llama-server")
ratio("pool-prefix", "pool-least_in_flight")
# Pools: each replica's share of requests and prefix hit rate, from its own /metrics.
def metric(text, name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if re.match(rf"{name}(\{{| )", l))
for r in runs:
    files = sorted(glob.glob(f"{out}/{r}/replica-*.metrics"))
    if not files:
        continue
    rows, counted = [], True
    for f in files:
        t = open(f).read()
        counted &= "frugal_prefix_cache_hit_tokens_total" in t
        # frugal_prompt_tokens_total counts the prompt tokens computed; with the ones reused,
        # every prompt token.
        hit = metric(t, "frugal_prefix_cache_hit_tokens_total")
        rows.append((os.path.basename(f)[:-8], metric(t, "frugal_requests_total"),
                     metric(t, "frugal_prompt_tokens_total") + hit, hit))
    total = sum(n for _, n, _, _ in rows) or 1
    mean = total / len(rows)
    rate = lambda hit, prompt: f"{hit / max(prompt, 1):.1%}" if counted else "- (no frugal_prefix_cache_hit_tokens_total)"
    for name, n, prompt, hit in rows:
        print(f"  {r} {name}: {n:.0f} requests ({n / total:.0%}), prefix hit {rate(hit, prompt)} of {prompt:.0f} prompt tokens")
    prompt, hit = sum(p for *_, p, _ in rows), sum(h for *_, h in rows)
    print(f"  {r}: prefix hit rate {rate(hit, prompt)}, most loaded replica {max(n for _, n, _, _ in rows) / mean:.2f}x the mean")
PY
