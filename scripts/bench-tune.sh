#!/usr/bin/env bash
# A real `frugal tune` over the example trainer's space (examples/tune/example-trainer.toml),
# checked against its full-budget ranking (data/tune/example-trainer-ranking.csv, from
# scripts/tune-ranking.sh): each rung result against the ranking's, the chosen
# configuration's rank and loss, the compute used and the slots' busy share.
#
#   scripts/bench-tune.sh [PARALLEL] [EXTRA FLAGS...]   (after `cargo build --release --workspace`: frugal and frugal-example-trainer)
set -euo pipefail
cd "$(dirname "$0")/.."
parallel=${1:-2}
shift || true
bin=target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$bin/frugal" --ledger "$work/ledger.db" tune --space examples/tune/example-trainer.toml \
  --parallel "$parallel" --dir "$work/state" --id bench --json --no-gpu --store "$work/store" \
  --instance g5.xlarge "$@" -- \
  "$bin/frugal-example-trainer" --steps 1600 --eval-every 100 --threads 1 --checkpoint-every 0 \
  --out '{trial_dir}/model.bin' --lr '{lr}' --hidden '{hidden}' --batch '{batch}' --embed '{embed}' \
  >"$work/summary.json" 2>"$work/log"
python3 - "$work/summary.json" data/tune/example-trainer-ranking.csv <<'PY'
import csv, json, sys
r = json.load(open(sys.argv[1]))
rows = {row["config"]: row for row in csv.DictReader(open(sys.argv[2]))}
ranked = sorted(rows, key=lambda c: float(rows[c]["eval_loss@1600"]))
best = float(rows[ranked[0]]["eval_loss@1600"])
n = off = 0
for t in r["trials"]:
    row = rows[f"t{t['trial']:03}"]
    for x in t["results"]:
        n += 1
        want = float(row[f"eval_loss@{x['resource']}"])
        off += abs(x["metric"] - want) > 1e-12 * want
chosen = f"t{r['best']['trial']:03}"
full = float(rows[chosen]["eval_loss@1600"])
print(f"rung results: {n}, {off} differ from the ranking's")
print(f"chosen: {chosen} (rank {ranked.index(chosen) + 1} of {len(rows)}), full-budget loss {full:.4f}, "
      f"+{100 * (full / best - 1):.2f}% from the best ({ranked[0]}, {best:.4f})")
print(f"compute: {r['total_steps']} of {r['full_steps']} steps ({100 * r['total_steps'] / r['full_steps']:.1f}%); "
      f"cost ${r['cost_usd']:.5f} against ${r['full_cost_usd']:.5f} (saved ${r['saved_usd']:.5f})")
print(f"slots busy {100 * r['slot_utilization']:.1f}% over {r['wall_s']:.1f} s")
PY
