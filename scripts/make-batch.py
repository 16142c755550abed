#!/usr/bin/env python3
"""A batch input in OpenAI's Batch format from real questions: the first N distinct
questions (text_a) of the QQP-derived pairs in data/semantic-cache/similiar_qqp_full.json.gz
(Quora Question Pairs, via GPTCache's benchmark; see that folder's PROVENANCE.md), each a
greedy chat request. Deterministic: the same N gives the same file.

    python3 scripts/make-batch.py --lines 5000 --max-tokens 24 --out out/batch-5000.jsonl
"""

import argparse
import json
import tarfile

PAIRS = "data/semantic-cache/similiar_qqp_full.json.gz"


def questions(path):
    with tarfile.open(path, "r:gz") as tar:
        member = next(m for m in tar.getmembers() if m.isfile())
        pairs = json.load(tar.extractfile(member))
    seen = set()
    for p in pairs:
        q = " ".join(p["text_a"].split())
        if q and q not in seen:
            seen.add(q)
            yield q


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=5000)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--model", default="SmolLM2-135M-Instruct.Q4_1")
    ap.add_argument("--pairs", default=PAIRS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.out, "w") as out:
        for i, q in zip(range(args.lines), questions(args.pairs)):
            body = {
                "model": args.model,
                "messages": [{"role": "user", "content": q}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
            line = {"custom_id": f"q{i:05d}", "method": "POST", "url": "/v1/chat/completions", "body": body}
            out.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
