#!/usr/bin/env python3
"""A contract-following trainer for frugal tune's tests: its eval_loss is a smooth function
of --lr, --hidden and the step, and flags make it misbehave the ways the tuner must name."""
import argparse, json, math, os, signal, sys, time

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float, required=True)
p.add_argument("--hidden", type=int, default=64)
p.add_argument("--steps", type=int, required=True)
p.add_argument("--step-ms", type=float, default=2.0)
p.add_argument("--eval-every", type=int, default=50)
p.add_argument("--ignore-stop-at", action="store_true")
p.add_argument("--ignore-resume", action="store_true")
p.add_argument("--no-metric", action="store_true")
p.add_argument("--hang-at", type=int)
p.add_argument("--crash-at", type=int)
p.add_argument("--crash-always", action="store_true")
a = p.parse_args()

ckpt = os.environ["FRUGAL_CHECKPOINT_DIR"]
stop_at = int(os.environ.get("FRUGAL_STOP_AT") or a.steps)
metrics = open(os.environ["FRUGAL_METRICS"], "a", buffering=1)
wanted = False


def ask(*_):
    global wanted
    wanted = True


signal.signal(signal.SIGUSR1, ask)


def save(step):
    final = os.path.join(ckpt, str(step))
    if os.path.isdir(final):
        return
    tmp = os.path.join(ckpt, f".tmp-{step}")
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "step"), "w") as f:
        f.write(str(step))
    os.replace(tmp, final)


step = 0
resume = os.environ.get("FRUGAL_RESUME_FROM")
if resume and not a.ignore_resume:
    step = int(open(os.path.join(resume, "step")).read())
end = a.steps if a.ignore_stop_at else min(stop_at, a.steps)
while step < end:
    time.sleep(a.step_ms / 1000)
    step += 1
    if step == a.hang_at:
        time.sleep(3600)
    if step == a.crash_at and a.crash_always:
        print(f"diverged at step {step}", file=sys.stderr)
        sys.exit(4)
    if step == a.crash_at and not os.path.exists(os.path.join(ckpt, "..", "crashed")):
        open(os.path.join(ckpt, "..", "crashed"), "w").close()  # once per trial
        sys.exit(3)
    line = {"step": step, "step_s": a.step_ms / 1000}
    if not a.no_metric and (step % a.eval_every == 0 or step == end):
        line["eval_loss"] = (math.log10(a.lr) + 2.5) ** 2 + 10 / math.sqrt(step) + 1 / a.hidden
    metrics.write(json.dumps(line) + "\n")
    if wanted or step % 100 == 0:
        save(step)
        wanted = False
save(step)
