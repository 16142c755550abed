#!/usr/bin/env bash
# The full-budget ranking of the example trainer's search space: every one of the 64
# configurations `frugal tune --seed 0` samples, trained to the end once (a one-rung search:
# min_resource = max_resource), with its held-out loss at each ASHA rung read from its
# metrics. Writes data/tune/example-trainer-ranking.csv, which the tune_replay benchmark
# replays ASHA and random search on.
#
#   scripts/tune-ranking.sh [PARALLEL]      (from the repository root, after `cargo build --release --workspace`)
set -euo pipefail
cd "$(dirname "$0")/.."
parallel=${1:-2}
bin=target/release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sed -e 's/^min_resource = .*/min_resource = 1600/' examples/tune/example-trainer.toml >"$work/space.toml"
"$bin/frugal" --ledger "$work/ledger.db" tune --space "$work/space.toml" --parallel "$parallel" \
  --dir "$work/state" --id ranking --json --no-gpu --store "$work/store" -- \
  "$bin/frugal-example-trainer" --steps 1600 --eval-every 100 --threads 1 --checkpoint-every 0 \
  --out '{trial_dir}/model.bin' --lr '{lr}' --hidden '{hidden}' --batch '{batch}' --embed '{embed}' \
  >"$work/summary.json"
mkdir -p data/tune
python3 - "$work" >data/tune/example-trainer-ranking.csv <<'PY'
import json, sys, os
work = sys.argv[1]
summary = json.load(open(os.path.join(work, "summary.json")))
rungs = [100, 400, 1600]
print("config,lr,hidden,batch,embed," + ",".join(f"eval_loss@{r}" for r in rungs) + ",step_s")
for t in summary["trials"]:
    lines = [json.loads(l) for l in open(os.path.join(work, "state", "trials", f"t{t['trial']:03}", "metrics.jsonl"))]
    evals = {l["step"]: l["eval_loss"] for l in lines if "eval_loss" in l}
    step_s = sum(l["step_s"] for l in lines) / len(lines)
    p = t["params"]
    print(f"t{t['trial']:03},{p['lr']},{p['hidden']},{p['batch']},{p['embed']},"
          + ",".join(repr(evals[r]) for r in rungs) + f",{step_s:.6g}")
PY
echo "wrote data/tune/example-trainer-ranking.csv ($(($(wc -l <data/tune/example-trainer-ranking.csv) - 1)) configurations)"
