#!/usr/bin/env python3
"""A request trace for `frugal bench --trace` from the *shape* of a real demand series.

Takes one day of a NAB demand series (data/demand-traces/, a count per 5 minutes), scales it
so its busiest bucket arrives at --peak-rps, compresses the day into --minutes, draws Poisson
arrivals bucket by bucket, and gives each request the prompt and output lengths of the next
row of an Azure LLM inference trace. Writes the Azure trace's columns
(TIMESTAMP,ContextTokens,GeneratedTokens), and prints the factors to stderr so that every
figure from it can say them.

    scripts/make-demand-trace.py --day 2015-04-06 --minutes 10 --peak-rps 6 > out/demand.csv
"""
import argparse
import csv
import datetime as dt
import random
import sys

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--series", default="data/demand-traces/Twitter_volume_AMZN.csv")
p.add_argument("--day", default="2015-04-06", help="the day of the series to replay (YYYY-MM-DD)")
p.add_argument("--minutes", type=float, default=10.0, help="the day replayed in this many minutes")
p.add_argument("--peak-rps", type=float, default=6.0, help="requests per second in the busiest bucket")
p.add_argument("--lengths", default="data/azure-llm-trace/AzureLLMInferenceTrace_conv.csv")
p.add_argument("--seed", type=int, default=7)
a = p.parse_args()

counts = [int(r["value"]) for r in csv.DictReader(open(a.series)) if r["timestamp"].startswith(a.day)]
if not counts:
    sys.exit(f"no rows of {a.day} in {a.series}")
bucket_s = a.minutes * 60.0 / len(counts)
scale = a.peak_rps * bucket_s / max(counts)  # requests per count
rng = random.Random(a.seed)
lengths = csv.DictReader(open(a.lengths))
start = dt.datetime(2026, 1, 1)
out = csv.writer(sys.stdout)
out.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
n = 0
for i, c in enumerate(counts):
    # Poisson arrivals at the bucket's rate, by exponential gaps within the bucket.
    rate = c * scale / bucket_s
    t = 0.0
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= bucket_s:
            break
        row = next(lengths)
        at = start + dt.timedelta(seconds=i * bucket_s + t)
        out.writerow([at.strftime("%Y-%m-%d %H:%M:%S.%f"), row["ContextTokens"], row["GeneratedTokens"]])
        n += 1
mean = sum(counts) / len(counts)
print(
    f"{a.series} on {a.day}: {len(counts)} buckets of 5 min, each {bucket_s:.2f} s here "
    f"(time x{300 / bucket_s:.0f}); peak {max(counts)} -> {a.peak_rps} req/s, "
    f"mean {mean:.1f} -> {mean * scale / bucket_s:.2f} req/s ({mean / max(counts):.0%} of peak); "
    f"{n} requests, lengths from {a.lengths}",
    file=sys.stderr,
)
