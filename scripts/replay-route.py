#!/usr/bin/env python3
"""Replay `frugal eval-route`'s held-out questions through a route of a running
`frugal serve` with shadows on, and set what the shadows measured online beside what
eval-route found offline on the same questions.

Each held-out question (the same hash split as eval-route's `--held-out`) is asked of the
route as eval-route asks a tier: one user message, "<question> Answer briefly.", greedy,
`--max-tokens`. One at a time, so each answer is the one eval-route saw. Then the script
waits for the shadows (`frugal_shadow_samples_total{lever="routing"}` on /metrics) and
prints the tiers that answered, the shadows' agreement, and, given eval-route's `--json`
file, how many online answers and routes match the offline ones and the offline figure
(`shadowed` in that file). `frugal report` then shows the interval from the ledger.

Usage: replay-route.py URL [--route auto] [--questions FILE]... [--eval out/eval-route.json]
Standard library only.
"""
import argparse
import json
import re
import time
import urllib.request

MASK = (1 << 64) - 1


def held_out(qid, share):
    """eval-route's split: `held_out` in crates/frugal-gateway/src/cascade/eval.rs."""
    h = ((qid * 0x9E3779B97F4A7C15) & MASK) >> 11
    return (h % 10_000) / 10_000 < share


def ask(url, route, question, max_tokens):
    body = json.dumps({
        "model": route, "temperature": 0, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": f"{question} Answer briefly."}],
    }).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        answer = json.loads(r.read())
        return r.headers.get("x-frugal-route"), answer["choices"][0]["message"]["content"]


def samples(url, route):
    """The route's shadow samples so far, {"true": n, "false": n}, and the shadows dropped
    (every slot busy: `frugal_shadow_dropped_total`, the whole server's)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out = {"true": 0, "false": 0, "dropped": 0}
    for line in text.splitlines():
        if line.startswith("frugal_shadow_dropped_total "):
            out["dropped"] = int(float(line.split()[1]))
        m = re.match(r'frugal_shadow_samples_total\{(.*)\} ([0-9.eE+-]+)$', line)
        if m and 'lever="routing"' in m.group(1) and f'route="{route}"' in m.group(1):
            agree = re.search(r'agree="(true|false)"', m.group(1)).group(1)
            out[agree] += int(float(m.group(2)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--route", default="auto")
    ap.add_argument("--questions", action="append")
    ap.add_argument("--held-out", type=float, default=0.5)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--eval", help="eval-route's --json output, to compare with")
    ap.add_argument("--json", help="write each question's route and answer here")
    args = ap.parse_args()
    questions = []
    for path in args.questions or ["data/cascade/questions.jsonl"]:
        with open(path) as f:
            questions += [json.loads(line) for line in f if line.strip()]
    held = [q for q in questions if held_out(q["id"], args.held_out)]
    before = samples(args.url, args.route)
    rows, start = [], time.time()
    for i, q in enumerate(held, 1):
        tier, text = ask(args.url, args.route, q["question"], args.max_tokens)
        rows.append({"id": q["id"], "route": tier, "answer": text})
        print(f"\r{i}/{len(held)} asked", end="", flush=True)
    print(f" in {time.time() - start:.0f} s")
    routes = {}
    for r in rows:
        routes[r["route"]] = routes.get(r["route"], 0) + 1
    print("answered by:", ", ".join(f"{k} {v}" for k, v in sorted(routes.items(), key=str)))
    # A route header without ">" is the cheap tier's accepted answer: each was drawn for a
    # shadow at shadow_rate.
    accepted = sum(v for k, v in routes.items() if k and ">" not in k)
    deadline = time.time() + 600
    while True:
        now = samples(args.url, args.route)
        got = {k: now[k] - before[k] for k in now}
        if sum(got.values()) >= accepted or time.time() > deadline:
            break
        time.sleep(2)
    n = got["true"] + got["false"]
    share = got["true"] / n if n else float("nan")
    print(f"shadows compared: {n} of {accepted} accepted cheap answers ({got['dropped']} dropped, every slot busy);"
          f" agreeing {got['true']} ({share:.1%})")
    if args.eval:
        with open(args.eval) as f:
            offline = json.load(f)
        by_id = {a["id"]: a for a in offline["answers"]}
        same = sum(1 for r in rows if r["route"] and ">" not in r["route"]
                   and by_id[r["id"]]["small"]["text"] == r["answer"])
        s = offline.get("shadowed", {})
        print(f"offline (eval-route, same questions): {s.get('agreed')} of {s.get('accepted')} accepted cheap answers agree"
              f"; online accepted answers identical to eval-route's small-tier text: {same} of {accepted}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"routes": routes, "shadow": got, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
