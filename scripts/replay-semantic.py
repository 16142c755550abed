#!/usr/bin/env python3
"""Replay held-out question pairs through a running `frugal serve` and set the semantic
cache's own estimate of its wrong-hit rate (/metrics) beside the rate the labels give.

For each pair (the held-out halves of the hand-written files and a sample of QQP's, split by
the same FNV-1a hash as `frugal eval-cache`, in hash order so the sets interleave): ask
text_a (a miss that fills the cache), then text_b, and read `x-frugal-cache`. Each pair gets
a system message of its own, so its text_b meets only its own text_a (the protocol of
`frugal eval-cache`). A semantic hit on a pair labelled different is a wrong hit.

Usage: replay-semantic.py URL [--qqp N] [--json OUT]
  URL: the server, e.g. http://127.0.0.1:8080 (started with its defaults: the verifier and
  semantic_max_error = 0.02, or what the run is to measure)
Standard library only.
"""
import argparse
import glob
import json
import re
import urllib.request

import semantic_pairs

QQP = "data/semantic-cache/similiar_qqp_full.json.gz"
HAND = ["data/semantic-cache/nearmiss.json"] + sorted(glob.glob("data/semantic-cache/reworded-*.json"))


def held_out(p):
    return semantic_pairs.held_out(p["text_a"], p["text_b"])


def ask(url, system, question):
    body = json.dumps({
        "model": "default", "temperature": 0, "max_tokens": 4,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
    }).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        r.read()
        return r.headers.get("x-frugal-cache"), r.headers.get("x-frugal-semantic-veto")


def metrics(url):
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"(frugal_semantic_[a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--qqp", type=int, default=1000, help="held-out QQP pairs to replay")
    ap.add_argument("--json")
    args = ap.parse_args()
    pairs = []
    for path in HAND:
        pairs += [dict(p, set="hand") for p in json.load(open(path)) if held_out(p)]
    qqp = [p for p in semantic_pairs.read_pairs(QQP) if held_out(p)]
    pairs += [dict(p, set="qqp", kind="qqp") for p in qqp[: args.qqp]]
    pairs.sort(key=lambda p: semantic_pairs.pair_hash(p["text_a"], p["text_b"]))
    served = {"hand": [0, 0], "qqp": [0, 0]}  # [hits, wrong]
    per_kind = {}
    for i, p in enumerate(pairs):
        system = f"Replay pair {i}."
        ask(args.url, system, p["text_a"])
        result, _ = ask(args.url, system, p["text_b"])
        hit = result == "hit-semantic"
        label = int(p["label"]) == 1
        k = per_kind.setdefault((p["kind"], label), [0, 0])
        k[0] += 1
        k[1] += hit
        if hit:
            served[p["set"]][0] += 1
            served[p["set"]][1] += not label
        if (i + 1) % 200 == 0:
            print(f"{i + 1}/{len(pairs)} pairs", flush=True)
    m = metrics(args.url)
    hits = sum(s[0] for s in served.values())
    wrong = sum(s[1] for s in served.values())
    est = {k.split('bound="')[1].rstrip('"}'): v for k, v in m.items() if k.startswith("frugal_semantic_wrong_rate_estimate")}
    print(f"\n{len(pairs)} pairs replayed; semantic hits served {hits}, wrong by the labels {wrong} "
          f"({100 * wrong / max(hits, 1):.2f}%)")
    print(f"the server's estimate: {100 * est.get('estimate', 0):.2f}% "
          f"(95% interval {100 * est.get('low', 0):.2f}% to {100 * est.get('high', 0):.2f}%)")
    for name, (h, w) in served.items():
        print(f"  {name}: {h} hits, {w} wrong")
    print("\nper kind (held-out): served / pairs")
    for (kind, label), (n, h) in sorted(per_kind.items(), key=lambda x: (x[0][1], x[0][0])):
        print(f"  {kind:16} {'paraphrase' if label else 'near miss':10} {h:4} / {n:4}  {100 * h / n:5.1f}%")
    if args.json:
        json.dump({
            "pairs": len(pairs), "hits": hits, "wrong": wrong, "actual_rate": wrong / max(hits, 1),
            "estimate": est, "sets": served, "metrics": m,
            "kinds": [{"kind": k, "paraphrase": l, "pairs": n, "served": h} for (k, l), (n, h) in per_kind.items()],
        }, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
