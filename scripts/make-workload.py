#!/usr/bin/env python3
"""Builds data/workload/qqp-replay.jsonl: a chat workload with realistic repetition.

Arrival times are the first rows of the Azure LLM inference trace (conversation), relative to
the first. Every request has the same max_tokens (32), as an application's requests do: a
repeat that differed in it would be a different request to a cache.
Prompts are Quora questions from the duplicate pairs of the semantic cache's held-out split
(the split `frugal eval-cache` reports on, so its threshold was not tuned on them):

- EXACT of the requests repeat an earlier prompt word for word, picked by Zipf popularity
  (the popular questions come back most);
- PARAPHRASE ask an earlier question in other words: the other side of its duplicate pair;
- the rest ask a question not seen before.

Usage: python3 scripts/make-workload.py [N] > data/workload/qqp-replay.jsonl
"""

import csv
import json
import random
import sys
import tarfile

N = int(sys.argv[1]) if len(sys.argv) > 1 else 400
EXACT, PARAPHRASE = 0.25, 0.15
HELD_OUT = 0.5  # `frugal eval-cache --held-out` default
SEED = 7
MAX_TOKENS = 32


def held_out(a: str, b: str) -> bool:
    """frugal_semantic::eval::is_held_out: FNV-1a over text_a, NUL, text_b."""
    h = 0xCBF29CE484222325
    for byte in a.encode() + b"\0" + b.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return (h % 10_000) / 10_000 < HELD_OUT


def main() -> None:
    tar = tarfile.open("data/semantic-cache/similiar_qqp_full.json.gz")
    member = next(m for m in tar.getmembers() if m.isfile())
    pairs = [
        p
        for p in json.load(tar.extractfile(member))
        if p["label"] == 1 and held_out(p["text_a"], p["text_b"])
    ]
    rng = random.Random(SEED)
    rng.shuffle(pairs)
    with open("data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv") as f:
        rows = list(csv.DictReader(f))[:N]

    def seconds(ts: str) -> float:
        hms = ts.split(" ")[1]
        h, m, s = hms.split(":")
        return int(h) * 3600 + int(m) * 60 + float(s)

    start = seconds(rows[0]["TIMESTAMP"])
    sent: list[str] = []  # distinct prompts, in order of first use
    asked: list[int] = []  # pairs whose first side was asked and whose other side was not
    fresh = iter(pairs)
    for row in rows:
        r = rng.random()
        if r < EXACT and sent:
            # Zipf over first use: the k-th distinct prompt comes back with weight 1/k.
            weights = [1 / (k + 1) for k in range(len(sent))]
            prompt = rng.choices(sent, weights)[0]
        elif r < EXACT + PARAPHRASE and asked:
            prompt = pairs[asked.pop(rng.randrange(len(asked)))]["text_b"]
            sent.append(prompt)
        else:
            pair = next(fresh)
            prompt = pair["text_a"]
            sent.append(prompt)
            asked.append(pairs.index(pair))
        at = round(seconds(row["TIMESTAMP"]) - start, 3)
        print(json.dumps({"at": at, "prompt": prompt, "max_tokens": MAX_TOKENS}))


if __name__ == "__main__":
    main()
