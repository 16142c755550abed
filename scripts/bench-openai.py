#!/usr/bin/env python3
"""Streams completions from an OpenAI-compatible server through the official openai client,
N at a time, and prints what a user of that client sees (one JSON object):
output tok/s over the wall clock, each stream's decode tok/s after its first token, and the
time to first token.

Usage: scripts/bench-openai.py URL [--concurrency N] [--requests N] [--max-tokens N]
URL is the server's base, e.g. http://127.0.0.1:8080/v1. Every request asks for exactly
--max-tokens tokens (`ignore_eos`, which frugal and llama-server both honour), so both
servers generate the same amount; tokens are the usage the server reports at the end of the
stream (`include_usage`), else the streamed chunks.
"""
import argparse
import json
import statistics
import threading
import time

import openai

# About 128 tokens of prompt for a SmolLM2 / Qwen tokenizer, varied per request so that no
# server answers from a prefix cache across requests.
PROMPT = (
    "Request {i}. You are a helpful assistant for a logistics company. A customer writes: "
    "my parcel left the warehouse on Monday, was scanned in two sorting centres on Tuesday "
    "and Wednesday, and has shown no movement since. The tracking page says it is in "
    "transit and the estimated delivery date has passed. I need it for an event on "
    "Saturday. Explain what may have happened, what the customer can do now, which "
    "information support will ask for, and how long a trace usually takes. Write a "
    "careful, friendly and complete answer in plain prose."
)


def one(client, model, i, max_tokens, out):
    start = time.perf_counter()
    first = None
    n = 0
    stream = client.completions.create(
        model=model,
        prompt=PROMPT.format(i=i),
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            n += 1
            if first is None:
                first = time.perf_counter()
        if getattr(chunk, "usage", None):
            usage = chunk.usage.completion_tokens
    end = time.perf_counter()
    # A chunk may carry several tokens (frugal's speculative decoding): the usage counts.
    out.append((start, first or end, end, usage or n))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--requests", type=int, default=0, help="default: 4 per stream")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.url, api_key="bench", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    total = args.requests or 4 * args.concurrency
    # One warm-up request, unmeasured.
    one(client, model, -1, 8, [])
    results, lock, next_i = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = next_i[0]
                if i >= total:
                    return
                next_i[0] += 1
            one(client, model, i, args.max_tokens, results)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r[3] for r in results)
    decode = [(r[3] - 1) / (r[2] - r[1]) for r in results if r[3] > 1 and r[2] > r[1]]
    ttft = sorted(r[1] - r[0] for r in results)
    print(
        json.dumps(
            {
                "url": args.url,
                "model": model,
                "concurrency": args.concurrency,
                "requests": len(results),
                "output_tokens": tokens,
                "output_tokens_per_s": tokens / wall,
                "stream_decode_tokens_per_s_p50": statistics.median(decode) if decode else 0.0,
                "ttft_p50_s": ttft[len(ttft) // 2] if ttft else 0.0,
            }
        )
    )


if __name__ == "__main__":
    main()
