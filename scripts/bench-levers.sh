#!/usr/bin/env bash
# Cost per 1,000 inferences on a replayed workload (data/workload/qqp-replay.jsonl: trace
# arrivals, Quora questions with exact and paraphrased repeats), with each lever off and on.
# The large model is Qwen2.5-0.5B on its own `frugal serve`, standing in for a hosted API and
# priced per token as one (LARGE_INPUT / LARGE_OUTPUT USD per million); the gateway in front
# runs SmolLM2-135M locally, priced by its engine time at PRICE_PER_HOUR.
# Env: REQUESTS=400 SPEEDUP=1 LARGE_INPUT=0.15 LARGE_OUTPUT=0.60 PRICE_PER_HOUR=0.09
#      THRESHOLD=-1.391 (the cascade's min-logprob threshold) LEVERS="off exact semantic cascade all"
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${REQUESTS:-400}
SPEEDUP=${SPEEDUP:-1}
LARGE_INPUT=${LARGE_INPUT:-0.15}
LARGE_OUTPUT=${LARGE_OUTPUT:-0.60}
PRICE_PER_HOUR=${PRICE_PER_HOUR:-0.09}
THRESHOLD=${THRESHOLD:--1.391}
LEVERS=${LEVERS:-"off exact semantic cascade all"}
FRUGAL=./target/release/frugal
SMALL=$(sed -n 's/^pub const DEFAULT_MODEL: &str = "\(.*\)";/\1/p' crates/frugal-engine/src/lib.rs)
LARGE=$(sed -n 's/^pub const LARGE_MODEL: &str = "\(.*\)";/\1/p' crates/frugal-engine/src/lib.rs)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
wait_http() { for _ in $(seq 1 600); do curl -s -o /dev/null "$1" && return 0; sleep 0.2; done; echo "no answer from $1" >&2; exit 1; }

$FRUGAL --ledger "$work/large.sqlite" serve --model "$LARGE" --name large-model --port 18091 \
  --no-cache > "$work/large.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18091/health

cat > "$work/prices.toml" <<TOML
[[model]]
name = "large-api"
input = $LARGE_INPUT
output = $LARGE_OUTPUT
TOML
cat > "$work/frugal.toml" <<TOML
[prices]
files = ["prices.toml"]

[[serve.upstream]]
name = "large"
url = "http://127.0.0.1:18091/v1"
model = "large-model"
price = "large-api"

[[serve.route]]
name = "auto"
tiers = ["small", "large"]
quantile = 0.0
threshold = $THRESHOLD
TOML

out=$work/results.jsonl
for lever in $LEVERS; do
  case $lever in
    off) model=large; flags=(--no-cache) ;;
    exact) model=large; flags=(--no-semantic-cache) ;;
    semantic) model=large; flags=() ;;
    cascade) model=auto; flags=(--no-cache) ;;
    all) model=auto; flags=() ;;
  esac
  $FRUGAL --config "$work/frugal.toml" --ledger "$work/$lever.sqlite" serve --model "$SMALL" \
    --name small --port 18092 --price-per-hour "$PRICE_PER_HOUR" "${flags[@]}" \
    > "$work/gateway-$lever.log" 2>&1 &
  gw=$!
  wait_http http://127.0.0.1:18092/health
  echo "lever $lever: replaying $REQUESTS requests" >&2
  $FRUGAL bench --url http://127.0.0.1:18092/v1 --model "$model" --workload data/workload/qqp-replay.jsonl \
    --requests "$REQUESTS" --speedup "$SPEEDUP" --timeout 300 --json > "$work/$lever.json"
  kill "$gw"; wait "$gw" 2>/dev/null || true
  python3 - "$lever" "$work/$lever.json" >> "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
print(json.dumps({"lever": sys.argv[1], "requests": r["requests"], "errors": r["errors"],
                  "samples": r["error_samples"][:2], "cache": r["cache"], "routes": r["routes"],
                  "per_1k": (r["metered_per_1k_requests"] or 0) / 1e9,
                  "p50": r["latency"]["p50"], "p99": r["latency"]["p99"]}))
PY
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = next((r["per_1k"] for r in rows if r["lever"] == "off"), None)
names = {"off": "none (all to the large model)", "exact": "exact cache", "semantic": "exact + semantic cache",
         "cascade": "cascade (small first)", "all": "cascade + both caches"}
print("| levers on | requests | errors | exact hits | semantic hits | answered by the small model | $ per 1k | vs none | latency p50 / p99 s |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    ok = r["requests"] - r["errors"]
    c, routes = r["cache"], r["routes"]
    small = routes.get("small", 0)
    vs = f"{r['per_1k'] / base:.2f}x" if base else "-"
    print(f"| {names[r['lever']]} | {r['requests']} | {r['errors']} | {c.get('hit-exact', 0)} | {c.get('hit-semantic', 0)} | "
          f"{small} | {r['per_1k']:.4f} | {vs} | {r['p50']:.2f} / {r['p99']:.2f} |")
    for s in r["samples"]:
        print(f"  error sample ({r['lever']}): {s}")
PY
