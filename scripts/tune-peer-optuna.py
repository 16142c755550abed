#!/usr/bin/env python3
"""The peer: Optuna's asynchronous successive halving (SuccessiveHalvingPruner, its ASHA)
replayed on the example trainer's full-budget ranking, as `cargo bench -p frugal-train
--bench tune_replay` replays frugal's. Optuna runs one trial at a time here (one slot);
a trial that survives a rung trains on (nothing to resume: it never stopped), and a pruned
one ends. For each seed the 64 configurations come in another order; the choice is the
best completed trial, judged by its full-budget loss.

    pip install optuna && python3 scripts/tune-peer-optuna.py [data/tune/example-trainer-ranking.csv]
"""
import csv
import random
import statistics
import sys

import optuna

optuna.logging.set_verbosity(optuna.logging.WARNING)
path = sys.argv[1] if len(sys.argv) > 1 else "data/tune/example-trainer-ranking.csv"
rows = list(csv.DictReader(open(path)))
rungs = [100, 400, 1600]
loss = [[float(r[f"eval_loss@{k}"]) for k in rungs] for r in rows]
ranked = sorted(range(len(rows)), key=lambda i: loss[i][-1])
best = loss[ranked[0]][-1]
all_steps = 1600 * len(rows)

gaps, within, used = [], 0, []
for seed in range(20):
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    spent = 0

    def objective(trial):
        global spent
        i = order[trial.number]
        trial.set_user_attr("config", i)
        prev = 0
        for k, step in enumerate(rungs):
            spent += step - prev
            prev = step
            trial.report(loss[i][k], step)
            if step < rungs[-1] and trial.should_prune():
                raise optuna.TrialPruned()
        return loss[i][-1]

    study = optuna.create_study(
        direction="minimize",
        sampler=optuna.samplers.RandomSampler(seed=seed),
        pruner=optuna.pruners.SuccessiveHalvingPruner(
            min_resource=100, reduction_factor=4, min_early_stopping_rate=0
        ),
    )
    study.optimize(objective, n_trials=len(rows))
    chosen = study.best_trial.user_attrs["config"]
    gap = 100 * (loss[chosen][-1] / best - 1)
    gaps.append(gap)
    within += gap <= 1.0
    used.append(spent / all_steps)
    print(f"seed {seed:>2}: rank {ranked.index(chosen) + 1:>2}, +{gap:.2f}%, compute {100 * spent / all_steps:.1f}%")
print(
    f"mean: Optuna's ASHA +{statistics.mean(gaps):.2f}% from the best, within 1% in {within}/20 seeds, "
    f"{100 * statistics.mean(used):.1f}% of the compute (one slot)"
)
