#!/usr/bin/env bash
# A batch of real questions (QQP via GPTCache, see data/semantic-cache/PROVENANCE.md) run to
# the end through `kill -9`s at random moments and a simulated AWS spot notice with a move to a
# fresh directory through a store; compared line by line with an uninterrupted run.
#
#   scripts/bench-batch.sh [LINES] [KILLS]      (default 5000 lines, 5 kills)
#
# Prints each custom_id's count, whether every answer matches, and the cost per 1M tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-5000}
KILLS=${2:-5}
FRUGAL=${FRUGAL:-target/release/frugal}
MODEL=${MODEL:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
OUT=${OUT:-out/bench-batch}
rm -rf "$OUT" && mkdir -p "$OUT"/{reference,first,fresh,store}
python3 scripts/make-batch.py --lines "$LINES" --max-tokens 24 --out "$OUT/input.jsonl"
for d in reference first fresh; do cp "$OUT/input.jsonl" "$OUT/$d/in.jsonl"; done

run() { # DIR [FLAGS...]
  local dir=$1; shift
  (cd "$dir" && "$OLDPWD/$FRUGAL" --ledger ledger.sqlite batch run in.jsonl --output out.jsonl \
     --model-file "$OLDPWD/$MODEL" --concurrency 16 --price-per-hour 0.40 "$@")
}
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }

echo "== uninterrupted run" >&2
start=$(date +%s)
run "$OUT/reference" >"$OUT/reference.log" 2>&1
echo "reference: $(( $(date +%s) - start )) s" >&2
tail -3 "$OUT/reference.log" >&2

echo "== $KILLS kill -9s at random moments" >&2
for i in $(seq "$KILLS"); do
  run "$OUT/first" >>"$OUT/first.log" 2>&1 &
  pid=$!
  sleep "$(python3 -c 'import random; print(round(random.uniform(5, 40), 1))')"
  # The batch is a child of the subshell: kill it, not the subshell.
  pkill -KILL -P "$pid" frugal || true
  wait "$pid" || true
  echo "kill $i: $(lines "$OUT/first/out.jsonl") lines done" >&2
done

echo "== a spot notice, then a fresh directory" >&2
python3 - "$OUT/imds.port" "$OUT/notice" <<'PY' &
import http.server, json, os, sys, datetime
port_file, notice = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, body=b""):
        self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_PUT(self):
        self.reply(200, b"token") if self.path == "/latest/api/token" else self.reply(404)
    def do_GET(self):
        if self.path == "/latest/meta-data/spot/instance-action" and os.path.exists(notice):
            t = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.reply(200, json.dumps({"action": "terminate", "time": t}).encode())
        else:
            self.reply(404)
s = http.server.HTTPServer(("127.0.0.1", 0), H)
open(port_file, "w").write(str(s.server_port))
s.serve_forever()
PY
imds=$!
trap 'kill $imds 2>/dev/null || true' EXIT
while [ ! -s "$OUT/imds.port" ]; do sleep 0.1; done
store="$(pwd)/$OUT/store"
set +e
run "$OUT/first" --spot --notice aws --metadata-url "http://127.0.0.1:$(cat "$OUT/imds.port")" \
  --poll 1 --store "$store" --store-every 10s >>"$OUT/first.log" 2>&1 &
pid=$!
sleep 20
touch "$OUT/notice"
wait "$pid"; code=$?
set -e
echo "notice: exit $code, $(lines "$OUT/first/out.jsonl") lines done" >&2
[ "$code" = 75 ] || { echo "expected exit 75" >&2; exit 1; }

start=$(date +%s)
run "$OUT/fresh" --store "$store" >"$OUT/fresh.log" 2>&1
echo "fresh directory: $(( $(date +%s) - start )) s" >&2
tail -3 "$OUT/fresh.log" >&2

python3 - "$OUT/reference/out.jsonl" "$OUT/fresh/out.jsonl" "$LINES" <<'PY'
import collections, json, sys
def load(path):
    rows = [json.loads(l) for l in open(path)]
    return rows, {r["custom_id"]: r["response"]["body"]["choices"][0]["message"]["content"] for r in rows}
ref_rows, ref = load(sys.argv[1])
rows, got = load(sys.argv[2])
counts = collections.Counter(r["custom_id"] for r in rows)
n = int(sys.argv[3])
twice = [k for k, c in counts.items() if c > 1]
same = sum(got.get(k) == v for k, v in ref.items())
print(f"lines {len(rows)} of {n}; custom_ids {len(counts)}, twice {len(twice)}; answers equal to the uninterrupted run's: {same} of {len(ref)}")
assert len(rows) == n and not twice and same == n
PY
