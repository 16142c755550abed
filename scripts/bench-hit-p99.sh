#!/usr/bin/env bash
# Exact-cache hits' latency while large prompts are in flight: does a 6,000-token prompt
# (tokenized, embedded for the semantic cache, prefilled) hold up the cheap requests beside it?
# For each binary given (default: ./target/release/frugal), one `frugal serve` (the default
# model, both caches on, metered into a temp ledger at --price-per-hour 1), then:
#   1. prime: the load generator's 21 deterministic prompts once each, so all are exact hits;
#   2. reference: CHEAP requests at concurrency 64, hits only, nothing else in flight;
#   3. loaded: the same CHEAP hits at 64, and LARGE_LEAD seconds in, LARGE_CLIENTS requests with
#      LARGE_TOKENS-token prompts (each distinct, max_tokens 1) at once; they are still in prefill
#      when the hits end (a 6,000-token prefill takes minutes on 2 cores), and are then cancelled.
# The load generator is LOADGEN's `frugal bench` for every binary (the same client for all).
# Usage: scripts/bench-hit-p99.sh [NAME=]BINARY ...   e.g. before=/path/old/frugal after=./target/release/frugal
# Env: CHEAP=10000, CONCURRENCY=64, LARGE_CLIENTS=4, LARGE_TOKENS=6000, LARGE_LEAD=1, ROUNDS=1,
# LOADGEN=./target/release/frugal, PORT=18290, OUT=out/bench-hit-p99.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
CHEAP=${CHEAP:-10000}
CONCURRENCY=${CONCURRENCY:-64}
LARGE_CLIENTS=${LARGE_CLIENTS:-4}
LARGE_TOKENS=${LARGE_TOKENS:-6000}
LARGE_LEAD=${LARGE_LEAD:-1}
ROUNDS=${ROUNDS:-1}
LOADGEN=${LOADGEN:-./target/release/frugal}
PORT=${PORT:-18290}
OUT=${OUT:-out/bench-hit-p99.jsonl}
[ $# -gt 0 ] || set -- "after=./target/release/frugal"
mkdir -p "$(dirname "$OUT")"
work=$(mktemp -d)
server=
large=
cleanup() { for p in $large $server; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
url=http://127.0.0.1:$PORT/v1
cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1) ($(nproc) cores)"
echo "CPU: $cpu"

# The load generator's 21 prompts (`loadgen::prompt(32, salt)`) are only 3 distinct word
# cycles in 21 rotations, so asked in turn most would be semantic hits of the first 3 (an
# embedding each time). Each is asked once with `Cache-Control: no-cache` (no lookup, the answer
# stored), exactly as `frugal bench` asks it, so that every later one is an exact hit.
prime() {
  python3 - "$PORT" <<'PY'
import http.client, json, sys
WORDS = ["the", "cost", "of", "compute", "is", "measured", "per", "unit", "and", "every", "model",
         "answer", "has", "a", "price", "that", "we", "can", "lower", "with", "care"]
for salt in range(21):
    text = " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(32))
    body = {"prompt": text, "ignore_eos": True, "max_tokens": 16, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=120)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", "Cache-Control": "no-cache"})
    r = c.getresponse(); r.read(); c.close()
    assert r.status == 200, r.status
PY
}

cheap() { # $1: label, $2: name, $3: round
  $LOADGEN bench --url "$url" --concurrency "$CONCURRENCY" --requests "$CHEAP" \
    --prompt-tokens 32 --max-tokens 16 --timeout 120 --json > "$work/cheap.json"
  python3 - "$2" "$1" "$3" "$work/cheap.json" "$cpu" >> "$OUT" <<'PY'
import json, sys
r = json.load(open(sys.argv[4]))
print(json.dumps({"binary": sys.argv[1], "load": sys.argv[2], "round": int(sys.argv[3]), "cpu": sys.argv[5],
                  "requests": r["requests"], "errors": r["errors"], "cache": r["cache"], "rps": r["requests_per_s"],
                  "p50_ms": r["latency"]["p50"] * 1e3, "p90_ms": r["latency"]["p90"] * 1e3,
                  "p99_ms": r["latency"]["p99"] * 1e3, "samples": r["error_samples"][:2]}))
PY
}

: > "$OUT"
for round in $(seq 1 "$ROUNDS"); do # binaries interleaved, round by round
  for spec in "$@"; do
    name=${spec%%=*}; bin=${spec#*=}; [ "$name" = "$spec" ] && name=$bin
    $bin --ledger "$work/ledger-$name-$round.sqlite" serve --port "$PORT" --price-per-hour 1 > "$work/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 1 300); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 0.2; done
    prime
    OUT=$OUT cheap none "$name" "$round"
    # The large prompts arrive LARGE_LEAD seconds into the hits, so their tokenizing and
    # embedding, and then their prefill, happen while the hits are being answered.
    ( sleep "$LARGE_LEAD"; exec $LOADGEN bench --url "$url" --concurrency "$LARGE_CLIENTS" --requests "$LARGE_CLIENTS" \
      --distinct --prompt-tokens "$LARGE_TOKENS" --max-tokens 1 --timeout 600 --json > /dev/null 2>&1 ) &
    large=$!
    cheap "${LARGE_CLIENTS}x${LARGE_TOKENS}-token" "$name" "$round"
    kill "$large" 2>/dev/null || true; wait "$large" 2>/dev/null || true; large=
    kill -TERM "$server"; wait "$server" 2>/dev/null || true; server=
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"{'binary':<10} {'round':>5} {'load beside the hits':<22} {'hits/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}  cache")
for r in rows:
    print(f"{r['binary']:<10} {r['round']:>5} {r['load']:<22} {r['rps']:>8.0f} {r['p50_ms']:>8.2f} {r['p90_ms']:>8.2f} {r['p99_ms']:>8.2f}  {r['cache']}"
          + (f"  errors {r['errors']}: {r['samples']}" if r["errors"] else ""))
PY
