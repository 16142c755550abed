#!/usr/bin/env bash
# Soak: `frugal serve` (the default model, `--price-per-hour 1`, a fresh ledger) beside a mock
# upstream, under a steady mixed load for DURATION seconds: exact-cache hits, sampled misses,
# streams, clients that leave mid-stream, upstream calls, an upstream that fails, and refusals
# (a bad request, an unknown model). The server's RSS is sampled every SAMPLE seconds; at the
# end the server is sent SIGTERM and the ledger's rows are counted against the requests that
# should have one (answered + cancelled + failed; refusals have none), by kind.
# A benchmark, not a test: run by hand, results under out/.
# Env: DURATION=1800, SAMPLE=60, WARMUP_S=120 (samples before it are left out of the slope),
# RATE=4 (requests/s, all kinds together), FRUGAL=path, MODEL=path (default: the server's),
# OUT=out/soak-DATE.json, KEEP=1 keeps the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-1800}
SAMPLE=${SAMPLE:-60}
WARMUP_S=${WARMUP_S:-120}
RATE=${RATE:-4}
FRUGAL=${FRUGAL:-./target/release/frugal}
OUT=${OUT:-out/soak-$(date +%Y%m%d-%H%M%S).json}
SERVE_PORT=${SERVE_PORT:-18190}
MOCK_PORT=${MOCK_PORT:-18191}
mkdir -p "$(dirname "$OUT")"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && echo "work dir $work"

# The mock upstream: a canned chat answer (JSON or SSE) under /ok/v1, a 500 under /fail/v1.
cat > "$work/mock.py" <<'PY'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

def chunk(delta, finish):
    return {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "mock",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

SSE = "".join(f"data: {json.dumps(c)}\n\n" for c in [
    chunk({"role": "assistant", "content": "The"}, None), chunk({"content": " answer"}, None),
    chunk({"content": " is 42."}, "stop"),
    {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "mock", "choices": [],
     "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}}]) + "data: [DONE]\n\n"
JSON = json.dumps({"id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "The answer is 42."},
                                "finish_reason": "stop"}],
                   "usage": {"prompt_tokens": 20, "completion_tokens": 4, "total_tokens": 24}})

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path.startswith("/fail/"):
            code, ctype, out = 500, "application/json", json.dumps({"error": {"message": "mock failure"}})
        elif body.get("stream"):
            code, ctype, out = 200, "text/event-stream", SSE
        else:
            code, ctype, out = 200, "application/json", JSON
        data = out.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
python3 "$work/mock.py" "$MOCK_PORT" & pids+=($!)

source scripts/mock-upstream-config.sh
mock_upstream_config "$work" "http://127.0.0.1:$MOCK_PORT/ok/v1"
cat >> "$work/frugal.toml" <<TOML

[[serve.upstream]]
name = "broken"
url = "http://127.0.0.1:$MOCK_PORT/fail/v1"
price = "mock-price"
retries = 0
TOML
$FRUGAL --config "$work/frugal.toml" --ledger "$work/ledger.sqlite" serve --port "$SERVE_PORT" \
  --price-per-hour 1 ${MODEL:+--model "$MODEL"} ${FRUGAL_ARGS:-} > "$work/serve.log" 2>&1 &
server=$!
pids+=($server)
for _ in $(seq 1 300); do curl -s -o /dev/null "http://127.0.0.1:$SERVE_PORT/health" && break; sleep 0.2; done
curl -sf -o /dev/null "http://127.0.0.1:$SERVE_PORT/health" || { echo "frugal serve did not start:" >&2; tail "$work/serve.log" >&2; exit 1; }

# The load driver: python's stdlib, one thread per request kind, each at its share of RATE.
cat > "$work/drive.py" <<'PY'
import http.client, json, os, random, socket, sys, threading, time

port, duration, sample, rate, server_pid, out = (int(sys.argv[1]), float(sys.argv[2]),
    float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
# Kind -> (share of the load, expected: "row" or "refused").
KINDS = {"hit": (6, "row"), "miss": (3, "row"), "stream": (3, "row"), "disconnect": (2, "row"),
         "upstream": (3, "row"), "upstream_fail": (1, "row"), "bad_request": (1, "refused"),
         "unknown_model": (1, "refused")}
total_share = sum(s for s, _ in KINDS.values())
lock = threading.Lock()
stats = {k: {"sent": 0, "ok": 0, "status": {}, "errors": 0} for k in KINDS}
stop = time.monotonic() + duration
HITS = [f"Name a colour of the rainbow, number {i}." for i in range(5)]

def post(body, stream=False, raw=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = raw if raw is not None else json.dumps(body).encode()
    c.request("POST", "/v1/chat/completions", body=data, headers={"Content-Type": "application/json"})
    return c, c.getresponse()

def chat(text, **kw):
    return {"messages": [{"role": "user", "content": text}], **kw}

def one(kind, n):
    if kind == "hit":
        c, r = post(chat(random.choice(HITS), max_tokens=8, temperature=0))
    elif kind == "miss":
        c, r = post(chat(f"Write a word about cost {n}.", max_tokens=16, temperature=0.8))
    elif kind == "stream":
        c, r = post(chat(f"Tell me about compute {n}.", max_tokens=16, temperature=0.8, stream=True))
    elif kind == "disconnect":
        # A long stream left after its first event: the server sees the client gone.
        c, r = post(chat(f"Count slowly {n}.", max_tokens=256, temperature=0.8, ignore_eos=True, stream=True))
        if r.status == 200:
            r.readline()
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
            return r.status
    elif kind == "upstream":
        c, r = post(chat(f"Ask upstream {n}.", model="mock", max_tokens=8, temperature=0.8, stream=n % 2 == 0))
    elif kind == "upstream_fail":
        c, r = post(chat(f"Ask the broken one {n}.", model="broken", max_tokens=8, temperature=0.8))
    elif kind == "bad_request":
        c, r = post(None, raw=b'{"messages": "not a list"')
    elif kind == "unknown_model":
        c, r = post(chat("Hello?", model="no-such-model", max_tokens=4))
    r.read()
    c.close()
    return r.status

def worker(kind, every):
    n = 0
    next_at = time.monotonic() + random.random() * every
    while next_at < stop:
        time.sleep(max(0.0, next_at - time.monotonic()))
        next_at += every
        n += 1
        # Each request on a thread of its own, so a slow one does not hold the schedule back.
        threading.Thread(target=send, args=(kind, n), daemon=False).start()

def send(kind, n):
    with lock:
        stats[kind]["sent"] += 1
    try:
        status = one(kind, n)
        with lock:
            s = stats[kind]["status"]
            s[str(status)] = s.get(str(status), 0) + 1
    except Exception as e:  # noqa: BLE001 - a benchmark counts every failure
        with lock:
            stats[kind]["errors"] += 1
            stats[kind].setdefault("error_samples", []).append(repr(e)[:200])

def rss_kb():
    with open(f"/proc/{server_pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

t0 = time.monotonic()
curve = [(0.0, rss_kb())]
threads = [threading.Thread(target=worker, args=(k, total_share / (rate * share)), daemon=True)
           for k, (share, _) in KINDS.items()]
for t in threads:
    t.start()
while time.monotonic() < stop:
    time.sleep(max(0.0, min(sample, stop - time.monotonic())))
    curve.append((time.monotonic() - t0, rss_kb()))
    print(f"  {curve[-1][0]:7.0f} s  RSS {curve[-1][1] / 1024:7.1f} MB  sent {sum(s['sent'] for s in stats.values())}", flush=True)
for t in threading.enumerate():
    if t is not threading.current_thread() and not t.daemon:
        t.join(timeout=180)
json.dump({"stats": stats, "kinds": KINDS, "rss_kb": curve, "wall_s": time.monotonic() - t0}, open(out, "w"))
PY
echo "soak: ${DURATION}s at ${RATE} req/s, RSS every ${SAMPLE}s, server pid $server"
python3 "$work/drive.py" "$SERVE_PORT" "$DURATION" "$SAMPLE" "$RATE" "$server" "$work/drive.json"

# SIGTERM: the server drains, the meter writes what was settled, then it exits.
kill -TERM "$server"
for _ in $(seq 1 600); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$server" 2>/dev/null; then echo "server still running 60 s after SIGTERM" >&2; exit 1; fi
wait "$server" && rc=0 || rc=$?

# Rows by (kind, model, outcome): kind 0 = inference, 2 = idle; outcome 2 = failed, 4 = cancelled.
sqlite3 -json "$work/ledger.sqlite" "SELECT e.kind AS kind, d.name AS model, e.outcome AS outcome, count(*) AS n
  FROM events e LEFT JOIN dims d ON d.id = e.model GROUP BY 1, 2, 3" > "$work/rows.json"
python3 - "$work/drive.json" "$work/rows.json" "$OUT" "$rc" "$WARMUP_S" "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(nproc)" <<'PY'
import json, sys
drive = json.load(open(sys.argv[1])); rows = json.loads(open(sys.argv[2]).read() or "[]")
out, rc, warmup, cpu, cores = sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6], sys.argv[7]
stats, kinds = drive["stats"], drive["kinds"]
OUTCOME = {None: "answered", 2: "failed", 4: "cancelled"}
ledger = {}
for r in rows:
    if r["kind"] == 0:
        key = f'{r["model"]}/{OUTCOME.get(r["outcome"], r["outcome"])}'
        ledger[key] = ledger.get(key, 0) + r["n"]
idle_rows = sum(r["n"] for r in rows if r["kind"] == 2)
# Expected rows: every request of a "row" kind that reached the server (any status, or a
# disconnect), by the model it was billed under.
local = sum(stats[k]["sent"] - stats[k]["errors"] for k in ("hit", "miss", "stream", "disconnect"))
up = stats["upstream"]["sent"] - stats["upstream"]["errors"]
broken = stats["upstream_fail"]["sent"] - stats["upstream_fail"]["errors"]
refused = {k: stats[k]["sent"] for k in ("bad_request", "unknown_model")}
got = lambda prefix: sum(n for k, n in ledger.items() if k.startswith(prefix + "/"))
local_model = max((k.split("/")[0] for k in ledger if not k.startswith(("mock/", "broken/"))), key=got, default="?")
check = [("local model (hit+miss+stream+disconnect)", local, got(local_model)),
         ("upstream mock", up, got("mock")), ("upstream broken (failed)", broken, got("broken"))]
curve = drive["rss_kb"]
pts = [(t, kb / 1024) for t, kb in curve if t >= warmup]
slope = None
if len(pts) >= 2:
    n = len(pts); mx = sum(t for t, _ in pts) / n; my = sum(m for _, m in pts) / n
    sxx = sum((t - mx) ** 2 for t, _ in pts)
    slope = sum((t - mx) * (m - my) for t, m in pts) / sxx * 3600 if sxx else None
print(f"\nCPU: {cpu} ({cores} cores); wall {drive['wall_s']:.0f} s; server exit status after SIGTERM: {rc}")
print(f"\n{'kind':<14} {'sent':>6} {'client errors':>13}  statuses")
for k, s in stats.items():
    print(f"{k:<14} {s['sent']:>6} {s['errors']:>13}  {json.dumps(s['status'])}" + (f"  {s['error_samples'][:1]}" if s.get("error_samples") else ""))
print(f"\n{'ledger rows for':<42} {'expected':>8} {'rows':>6}")
ok = True
for name, want, have in check:
    ok &= want == have
    print(f"{name:<42} {want:>8} {have:>6}{'' if want == have else '   MISMATCH'}")
print(f"refused (no row): {refused}; idle rows: {idle_rows}")
print(f"rows by model/outcome: {json.dumps(ledger, sort_keys=True)}")
print(f"\nRSS (MB): " + ", ".join(f"{t:.0f}s {kb/1024:.1f}" for t, kb in curve))
print(f"RSS slope after {warmup:.0f} s warm-up: " + (f"{slope:+.2f} MB/hour" if slope is not None else "n/a (too few samples)"))
json.dump({"cpu": cpu, "cores": cores, "wall_s": drive["wall_s"], "exit_status": rc, "stats": stats,
           "ledger_rows": ledger, "idle_rows": idle_rows, "refused": refused,
           "check": [{"what": a, "expected": b, "rows": c} for a, b, c in check], "rows_match": ok,
           "rss_mb": [[t, kb / 1024] for t, kb in curve], "slope_mb_per_hour": slope, "warmup_s": warmup},
          open(out, "w"), indent=1)
print(f"\nwritten {out}")
sys.exit(0 if ok else 1)
PY
