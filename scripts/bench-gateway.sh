#!/usr/bin/env bash
# Gateway overhead, side by side: a fixed streamed completion from nginx on loopback, asked
# directly, through `frugal serve --no-model` (a gateway only: exact cache and metering on;
# every prompt distinct, so each request goes upstream) and through LiteLLM's proxy, at
# several concurrency levels.
# Needs nginx and LiteLLM (`pip install 'litellm[proxy]'`, or LITELLM=path/to/litellm).
# Env: LEVELS="1 8 32", REQUESTS=2000, LITELLM_REQUESTS=600, LITELLM_WORKERS=2, WARMUP=3000
# (unrecorded requests to each target first; LiteLLM gets a tenth);
# NO_LITELLM=1 measures nginx and frugal only; FRUGAL_ARGS adds flags to `frugal serve`;
# FRUGAL=path picks the binary; LOADGEN=path the `frugal bench` that drives the load (default:
# FRUGAL's), so two builds can be compared under the same client.
set -euo pipefail
cd "$(dirname "$0")/.."
LEVELS=${LEVELS:-"1 8 32"}
REQUESTS=${REQUESTS:-2000}
LITELLM_REQUESTS=${LITELLM_REQUESTS:-600}
LITELLM_WORKERS=${LITELLM_WORKERS:-2}
WARMUP=${WARMUP:-3000}
LITELLM=${LITELLM:-litellm}
NO_LITELLM=${NO_LITELLM:-}
FRUGAL=${FRUGAL:-./target/release/frugal}
LOADGEN=${LOADGEN:-$FRUGAL}
work=$(mktemp -d)
chmod 755 "$work" # nginx workers read the canned stream
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && echo "work dir $work"

chunk() { printf 'data: {"id":"cmpl-mock","object":"text_completion","created":1,"model":"mock","choices":[{"text":"%s","index":0,"logprobs":null,"finish_reason":%s}]}\n\n' "$1" "$2"; }
{
  chunk "The" null; chunk " answer" null; chunk " is" null; chunk " 42." '"stop"'
  printf 'data: {"id":"cmpl-mock","object":"text_completion","created":1,"model":"mock","choices":[],"usage":{"prompt_tokens":32,"completion_tokens":4,"total_tokens":36}}\n\n'
  printf 'data: [DONE]\n\n'
} > "$work/stream.txt"
cat > "$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.pid;
error_log $work/nginx-error.log;
events { worker_connections 4096; }
http {
  access_log off;
  server {
    listen 127.0.0.1:18081;
    root $work;
    location / {
      # Every path is the canned stream; a POST to a static file is a 405, turned into it.
      default_type text/event-stream;
      try_files /stream.txt =404;
      error_page 405 =200 \$uri;
    }
  }
}
NGINX
nginx -c "$work/nginx.conf" & pids+=($!)

source scripts/mock-upstream-config.sh
mock_upstream_config "$work" "http://127.0.0.1:18081/v1"
$FRUGAL --config "$work/frugal.toml" --ledger "$work/ledger.sqlite" serve --port 18082 --no-model --no-semantic-cache ${FRUGAL_ARGS:-} & pids+=($!)
frugal_pid=$!

cat > "$work/litellm.yaml" <<YAML
model_list:
  - model_name: mock
    litellm_params:
      model: text-completion-openai/mock
      api_base: http://127.0.0.1:18081/v1
      api_key: none
YAML
litellm_pid=
if [ -z "$NO_LITELLM" ]; then
  # No keys on either gateway; LiteLLM must be told that is intended, and that it is offline.
  LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY=true LITELLM_LOCAL_MODEL_COST_MAP=True \
    "$LITELLM" --config "$work/litellm.yaml" --port 18083 --num_workers "$LITELLM_WORKERS" > "$work/litellm.log" 2>&1 & pids+=($!)
  litellm_pid=$!
fi

wait_http() { for _ in $(seq 1 300); do curl -s -o /dev/null "$1" && return 0; sleep 0.2; done; echo "no answer from $1" >&2; exit 1; }
wait_http http://127.0.0.1:18081/v1/completions
wait_http http://127.0.0.1:18082/health
[ -n "$NO_LITELLM" ] || wait_http http://127.0.0.1:18083/health/liveliness
targets="direct frugal"
[ -n "$NO_LITELLM" ] || targets="$targets litellm"

rss_mb() { # total resident memory of a process tree, MB
  local total=0 p
  for p in $1 $(pgrep -P "$1" || true); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)))
  done
  echo $((total / 1024))
}

# Unrecorded warm-up of every target: a freshly started gateway's first requests pay for
# first-touch page faults and its upstream pool filling (measured: p50 ~0.5 ms, not ~0.35).
url_of() { case $1 in direct) echo http://127.0.0.1:18081/v1 ;; frugal) echo http://127.0.0.1:18082/v1 ;; litellm) echo http://127.0.0.1:18083/v1 ;; esac; }
for target in $targets; do
  n=$WARMUP; [ "$target" = litellm ] && n=$((WARMUP / 10))
  if [ "$n" -gt 0 ]; then
    $LOADGEN bench --url "$(url_of "$target")" --model mock --concurrency 8 --requests "$n" \
      --prompt-tokens 32 --max-tokens 4 --distinct --timeout 30 --json > /dev/null
  fi
done

out=$work/results.jsonl
for c in $LEVELS; do
  for target in $targets; do
    n=$REQUESTS; [ "$target" = litellm ] && n=$LITELLM_REQUESTS
    $LOADGEN bench --url "$(url_of "$target")" --model mock --concurrency "$c" --requests "$n" \
      --prompt-tokens 32 --max-tokens 4 --distinct --timeout 30 --json > "$work/one.json"
    python3 - "$target" "$c" "$work/one.json" >> "$out" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))
print(json.dumps({"target": sys.argv[1], "concurrency": int(sys.argv[2]), "rps": r["requests_per_s"],
                  "p50_ms": r["latency"]["p50"] * 1e3, "p99_ms": r["latency"]["p99"] * 1e3,
                  "errors": r["errors"], "samples": r["error_samples"][:2]}))
PY
  done
done
if [ -n "$NO_LITELLM" ]; then
  echo "RSS after the runs: frugal $(rss_mb "$frugal_pid") MB"
else
  echo "RSS after the runs: frugal $(rss_mb "$frugal_pid") MB, litellm $(rss_mb "$litellm_pid") MB (all its processes)"
fi
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {(r["target"], r["concurrency"]): r for r in rows}
litellm = any(r["target"] == "litellm" for r in rows)
head = f"{'conc':>4} | {'direct p50/p99 ms':>18} | {'frugal p50/p99 ms':>18} {'added p50/p99':>14} {'req/s':>8}"
if litellm:
    head += f" | {'litellm p50/p99 ms':>19} {'added p50/p99':>14} {'req/s':>7} | frugal/litellm req/s"
print(head)
for c in sorted({r["concurrency"] for r in rows}):
    d, f = by[("direct", c)], by[("frugal", c)]
    line = (f"{c:>4} | {d['p50_ms']:8.2f}/{d['p99_ms']:8.2f} | {f['p50_ms']:8.2f}/{f['p99_ms']:8.2f} "
            f"{f['p50_ms']-d['p50_ms']:6.2f}/{f['p99_ms']-d['p99_ms']:6.2f} {f['rps']:8.0f}")
    if litellm:
        l = by[("litellm", c)]
        line += (f" | {l['p50_ms']:8.2f}/{l['p99_ms']:9.2f} {l['p50_ms']-d['p50_ms']:6.1f}/{l['p99_ms']-d['p99_ms']:6.1f} "
                 f"{l['rps']:7.0f} | {f['rps']/max(l['rps'],1e-9):.1f}x")
    print(line)
PY
