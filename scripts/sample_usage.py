#!/usr/bin/env python3
"""Writes a realistic week of usage as frugal JSONL, for `make run` and the README.

Inference requests take their token counts, in order, from the Azure LLM inference traces
in data/azure-llm-trace/ (conversation and code), with arrivals drawn from a Poisson process
whose rate follows the time of day. Two services:

- `chat`: a self-hosted model on two g5.2xlarge replicas, on demand all week. Each request
  is charged the engine time it takes (prefill and decode at fixed aggregate rates); each
  hour's remaining replica time is an idle event.
- `code-assist`: an API model (gpt-4o, with some traffic on gpt-4o-mini), priced per token
  by frugal from the price file.

Plus two training runs: a fine-tune on an on-demand p4d.24xlarge whose GPUs are starved,
and a pretraining run on two spot p3.8xlarge that is preempted once and resumes.
Seeded: the same file every time.
"""

import argparse
import csv
import json
import math
import pathlib
import random
from datetime import datetime, timedelta, timezone

ROOT = pathlib.Path(__file__).resolve().parent.parent
TRACE = ROOT / "data" / "azure-llm-trace"
WEEK_START = datetime(2026, 11, 23, tzinfo=timezone.utc)

# Self-hosted chat engine: g5.2xlarge (1 x A10G) on-demand in us-east-1, from the catalog.
CHAT_PRICE_PER_HOUR = 1.212
CHAT_REPLICAS = 2
PREFILL_TOK_S = 8000.0
DECODE_TOK_S = 400.0


def trace(name):
    with open(TRACE / f"AzureLLMInferenceTrace_{name}.csv") as f:
        return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]


def diurnal(t):
    """Traffic multiplier: low at night (UTC-5 office hours peak), lower at weekends."""
    hour = (t.hour - 5) % 24
    day = 1.0 if t.weekday() < 5 else 0.55
    return day * (0.35 + 0.65 * max(0.0, math.sin(math.pi * (hour - 6) / 14)) if 6 <= hour <= 20 else day * 0.35)


def ts(t):
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def arrivals(rng, mean_rate_per_s):
    """Poisson arrivals over the week, thinned by the diurnal curve."""
    t = WEEK_START
    end = WEEK_START + timedelta(days=7)
    peak = mean_rate_per_s * 2.2
    while True:
        t += timedelta(seconds=rng.expovariate(peak))
        if t >= end:
            return
        if rng.random() < diurnal(t) / 1.0:
            yield t


def chat(rng, out):
    rows = trace("conv")
    busy_by_hour = {}
    for i, t in enumerate(arrivals(rng, 0.35)):
        ctx, gen = rows[i % len(rows)]
        busy = ctx / PREFILL_TOK_S + gen / DECODE_TOK_S
        cost = busy * CHAT_PRICE_PER_HOUR / 3600
        hour = t.replace(minute=0, second=0, microsecond=0)
        busy_by_hour[hour] = busy_by_hour.get(hour, 0.0) + busy
        out.write(json.dumps({
            "ts": ts(t), "kind": "inference", "workload": "chat", "model": "llama-3.1-8b",
            "instance_type": "g5.2xlarge", "capacity": "on_demand", "duration_s": round(busy, 3),
            "input_tokens": ctx, "output_tokens": gen, "cost_usd": f"{cost:.9f}",
        }) + "\n")
    for h in range(7 * 24):
        hour = WEEK_START + timedelta(hours=h)
        idle = max(0.0, CHAT_REPLICAS * 3600 - busy_by_hour.get(hour, 0.0))
        out.write(json.dumps({
            "ts": ts(hour), "kind": "idle", "workload": "chat", "model": "llama-3.1-8b",
            "instance_type": "g5.2xlarge", "capacity": "on_demand", "instances": CHAT_REPLICAS,
            "duration_s": round(idle / CHAT_REPLICAS, 3),
            "cost_usd": f"{idle * CHAT_PRICE_PER_HOUR / 3600:.9f}",
        }) + "\n")


def code(rng, out):
    rows = trace("code")
    for i, t in enumerate(arrivals(rng, 0.1)):
        ctx, gen = rows[i % len(rows)]
        model = "gpt-4o" if rng.random() < 0.7 else "gpt-4o-mini"
        out.write(json.dumps({
            "ts": ts(t), "kind": "inference", "workload": "code-assist", "model": model,
            "input_tokens": ctx, "output_tokens": gen, "cached_input_tokens": int(ctx * 0.3),
        }) + "\n")


def training(out):
    def seg(**kw):
        out.write(json.dumps({"kind": "training", **kw}) + "\n")

    start = WEEK_START + timedelta(days=1, hours=9)
    seg(ts=ts(start), duration_s=10 * 3600, workload="finetune", run_id="ft-llama-8b",
        instance_type="p4d.24xlarge", capacity="on_demand", utilization=0.42, outcome="completed")
    start = WEEK_START + timedelta(days=2)
    seg(ts=ts(start), duration_s=7.5 * 3600, workload="pretrain", run_id="pretrain-350m",
        instance_type="p3.8xlarge", capacity="spot", instances=2, utilization=0.88,
        outcome="preempted", lost_s=25 * 60)
    start += timedelta(hours=7.75)
    seg(ts=ts(start), duration_s=9 * 3600, workload="pretrain", run_id="pretrain-350m",
        instance_type="p3.8xlarge", capacity="spot", instances=2, utilization=0.88,
        outcome="completed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w") as out:
        chat(rng, out)
        code(rng, out)
        training(out)
    n = sum(1 for _ in open(args.out))
    print(f"wrote {n} events to {args.out}")


if __name__ == "__main__":
    main()
