#!/usr/bin/env python3
"""A new user's first hour: every fenced `frugal ...` command in README.md and docs/*.md,
run as written from an empty folder with only the binary on PATH.

Each page gets its own empty folder and its own data folder ($XDG_DATA_HOME, HOME), which
holds only the models (a link to ./models, as `FRUGAL_MODELS=~/.local/share/frugal/models
scripts/fetch-models.sh` fills it); frugal's own data comes from the binary. A page's
commands run in order, so one may read what an earlier one wrote.

- A usage synopsis (`[--flag X]`, or a placeholder such as `FILE.csv` or `TYPE`) is not run:
  every flag it names must be in the subcommand's `--help`.
- A command that needs a file the docs assume but do not make (a user's usage export, an
  F16 model; the checkout's example trainer, copied from beside the binary) gets a
  stand-in first (STAND_INS), and then runs as written.
- `frugal serve` starts in the background, must answer /health, and gets SIGTERM.
- `$ frugal ...` must print the lines shown under it (`...` stands for any), and exit with
  the number `$ echo $?` shows (else 0).
- What cannot exist in CI (a cloud, credentials, a database server, a GPU) is in SKIP,
  with the reason.
- A `frugal ...` named in the prose must be a command with the flags it names (listed only
  when it is not).

Prints each command with PASS, FAIL or SKIP; exits 1 when a documented command fails.
Usage: python3 scripts/first-hour.py [--bin target/release/frugal] [--models models] [-v]
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))
)
TIMEOUT_S = 60

# Commands, as written (continuation lines joined, comments dropped), that cannot run in CI;
# "PAGE: command" for one page's only.
SKIP = {
    "frugal train --spot --instance g5.xlarge --store s3://bucket/ckpt -- python train.py":
        "needs an S3 bucket with credentials, and the user's train.py",
    "frugal tune --space examples/tune/example-trainer.toml --parallel 2 -- "
    "target/release/frugal-example-trainer --steps 1600 --eval-every 100 --threads 1 "
    "--lr '{lr}' --hidden '{hidden}' --batch '{batch}' --embed '{embed}' "
    "--out '{trial_dir}/model.bin'":
        "the full search (trials of 1,600 steps) takes minutes on 2 cores; "
        "crates/frugal/tests/tune.rs runs the tuner on the same trainer",
    "frugal ledger migrate --from ~/.local/share/frugal/ledger.sqlite "
    "--to postgres://frugal:secret@db.internal/frugal":
        "needs a PostgreSQL server (db.internal) with credentials",
    "frugal plan --workload chat --instance g5.xlarge --bench g5.xlarge=g5.json "
    "--bench g6.xlarge=g6.json --slo-ttft-p99 500ms":
        "needs `frugal bench --json` runs measured on g5.xlarge and g6.xlarge GPUs (a cloud)",
    "docs/watch.md: frugal report":
        "reads what `frugal watch` billed from live inference servers; "
        "crates/frugal/tests/watch.rs runs both",
}

# A user's own files the docs assume, written before the command that reads them.
USAGE_CSV = """ts,duration_s,kind,workload,model,instance_type,capacity,requests,utilization
2026-11-24T10:00:00Z,3600,inference,chat,llama-3.1-8b,g5.xlarge,on_demand,1200,0.4
2026-11-24T11:00:00Z,3600,idle,chat,,g5.xlarge,on_demand,,
2026-11-25T10:00:00Z,7200,training,finetune,,p3.2xlarge,spot,,0.9
"""
FOCUS_CSV = (
    "BilledCost,EffectiveCost,ListCost,ChargeCategory,ChargePeriodStart,ChargePeriodEnd,"
    "CommitmentDiscountStatus,PricingCategory,ResourceName,Tags\n"
    "9.18,9.18,9.18,Usage,2026-11-26T00:00:00Z,2026-11-26T03:00:00Z,,Standard,train-box,"
    '"{""frugal-kind"": ""training"", ""frugal-run"": ""r1""}"\n'
)
DEFAULT_MODEL = "models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TRAINER = "target/release/frugal-example-trainer"
STAND_INS = {
    # The checkout's example trainer, built beside the binary.
    TRAINER: lambda env: (
        os.makedirs(os.path.dirname(TRAINER), exist_ok=True),
        shutil.copy2(os.path.join(env["FRUGAL_BUILT"], "frugal-example-trainer"), TRAINER),
    ),
    "usage.csv": lambda env: write("usage.csv", USAGE_CSV),
    "billing.csv": lambda env: write("billing.csv", FOCUS_CSV),
    # An F16 model, made from the default one.
    "model.f16.gguf": lambda env: subprocess.run(
        ["frugal", "quantize", os.path.join(env["XDG_DATA_HOME"], "frugal", DEFAULT_MODEL),
         "model.f16.gguf", "--type", "f16"],
        env=env, check=True, capture_output=True,
    ),
}


def write(name, text):
    with open(name, "w") as f:
        f.write(text)


def blocks(page):
    """The fenced blocks of a page, each as its lines."""
    text = open(os.path.join(ROOT, page)).read()
    return [m.group(1).split("\n") for m in re.finditer(r"```[^\n]*\n(.*?)```", text, re.S)]


def commands(page):
    """(command, exit status, lines printed) for each `frugal ...` line of the page's blocks."""
    found = []
    for lines in blocks(page):
        prompted = any(line.startswith("$ ") for line in lines)
        i = 0
        while i < len(lines):
            line = lines[i]
            if prompted:
                if not line.startswith("$ "):
                    i += 1
                    continue
                line = line[2:]
            # Continuation lines: after a backslash, or indented under a synopsis.
            while i + 1 < len(lines) and (
                line.rstrip().endswith("\\") or lines[i + 1].startswith(" ")
            ):
                i += 1
                line = line.rstrip().rstrip("\\").rstrip() + " " + lines[i].strip()
            i += 1
            line = strip_comment(line).strip()
            if not re.match(r"frugal [a-z][a-z-]*(\s|$)", line):
                continue
            # After a `$ ` command: the lines it prints (each must be in its output; `...`
            # stands for any), and the status `$ echo $?` shows.
            expect, printed = 0, []
            if prompted:
                j = i
                while j < len(lines) and not lines[j].startswith("$ "):
                    if lines[j].strip() not in ("", "..."):
                        printed.append(lines[j].strip())
                    j += 1
                if j < len(lines) and lines[j].strip() == "$ echo $?":
                    expect = int(lines[j + 1].strip())
            found.append((line, expect, printed))
    return found


def strip_comment(line):
    """The line without a trailing `# ...` outside quotes."""
    quote = None
    for j, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (j == 0 or line[j - 1] == " "):
            return line[:j]
    return line


PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.[a-z0-9]+)?$|^\[")


def is_synopsis(command):
    return any(PLACEHOLDER.search(t) for t in command.split())


HELP = {}


def help_of(path, env):
    """`frugal PATH --help`, or None when PATH is no command."""
    if path not in HELP:
        out = subprocess.run(["frugal", *path, "--help"], env=env, capture_output=True, text=True)
        HELP[path] = out.stdout if out.returncode == 0 else None
    return HELP[path]


def check_synopsis(command, env, inline=False):
    """Its subcommand exists and has every --flag it names. Inline, the words after the
    command may be prose (`frugal serve` says ...): the longest command they start with."""
    path = []
    for w in command.split()[1:]:
        if not re.match(r"^[a-z][a-z-]*$", w):
            break
        path.append(w)
    path = tuple(path)
    while inline and len(path) > 1 and help_of(path, env) is None:
        path = path[:-1]
    text = help_of(path, env)
    if text is None:
        return False, f"`frugal {' '.join(path)}` is no command"
    missing = [
        f for f in re.findall(r"--[a-z][a-z0-9-]*", command.split(" -- ")[0])
        if not re.search(re.escape(f) + r"(?![a-z0-9-])", text)
    ]
    if missing:
        return False, f"`frugal {' '.join(path)}` has no {', '.join(missing)}"
    return True, ""


def inline_commands(page):
    """The `frugal ...` spans in a page's prose."""
    text = re.sub(r"```.*?```", "", open(os.path.join(ROOT, page)).read(), flags=re.S)
    return re.findall(r"`(frugal [a-z][^`]*)`", text.replace("\n", " "))


def serve(command, env):
    """`frugal serve ...` in the background: /health, then SIGTERM and a clean exit."""
    port = re.search(r"--port[ =](\d+)", command)
    url = f"http://127.0.0.1:{port.group(1) if port else 8080}/health"
    child = subprocess.Popen(
        ["bash", "-c", "exec " + command], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.time() + TIMEOUT_S
    healthy = False
    while time.time() < deadline and child.poll() is None:
        try:
            healthy = urllib.request.urlopen(url, timeout=1).read() == b"ok"
            break
        except OSError:
            time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    try:
        said, _ = child.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        said, _ = child.communicate()
    ok = healthy and child.returncode == 0
    return ok, said if not ok else ""


def run(command, expect, printed, env):
    if command.startswith("frugal serve"):
        return serve(command, env)
    try:
        out = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command], env=env,
            capture_output=True, text=True, timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False, f"still running after {TIMEOUT_S} s"
    said = out.stdout + out.stderr
    if out.returncode != expect:
        return False, f"exit {out.returncode}, not {expect}:\n{said}"
    missing = [line for line in printed if line not in said]
    if missing:
        return False, f"did not print {missing[0]!r}:\n{said}"
    return True, ""


def run_page(page, env, built):
    """The page's fenced commands, in order, in the current (empty) folder; then the ones its
    prose names. Their results, and how many the prose names."""
    results = []
    stand_in_env = dict(env, FRUGAL_BUILT=built)
    for command, expect, printed in commands(page):
        began = time.time()
        skip = SKIP.get(f"{page}: {command}", SKIP.get(command))
        if skip:
            results.append((page, command, "SKIP", skip))
            continue
        if is_synopsis(command):
            ok, why = check_synopsis(command, env)
        else:
            try:
                for name, make in STAND_INS.items():
                    if name in command.split() and not os.path.exists(name):
                        make(stand_in_env)
            except (subprocess.CalledProcessError, OSError) as e:
                said = f"{getattr(e, 'stdout', '')}{getattr(e, 'stderr', '')}"
                ok, why = False, f"its stand-in failed: {e}\n{said}"
            else:
                ok, why = run(command, expect, printed, env)
        took = f"{time.time() - began:.1f}s"
        results.append((page, command, "PASS" if ok else "FAIL", why if not ok else took))
    inline = inline_commands(page)
    for command in inline:
        ok, why = check_synopsis(command, env, inline=True)
        if not ok:
            results.append((page, command, "FAIL", why))
    return results, len(inline)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "target/release/frugal"))
    parser.add_argument("--models", default=os.path.join(ROOT, "models"))
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="frugal-first-hour-")
    os.makedirs(os.path.join(tmp, "bin"))
    shutil.copy2(args.bin, os.path.join(tmp, "bin", "frugal"))
    built = os.path.dirname(os.path.abspath(args.bin))
    results, inline_count = [], 0
    started = time.time()
    try:
        for n, page in enumerate(PAGES):
            # A folder and a data folder of its own, the models linked in.
            work, home = os.path.join(tmp, f"page{n}"), os.path.join(tmp, f"home{n}")
            os.makedirs(work)
            os.makedirs(os.path.join(home, "frugal"))
            os.symlink(os.path.abspath(args.models), os.path.join(home, "frugal", "models"))
            env = {
                "PATH": os.path.join(tmp, "bin") + ":/usr/local/bin:/usr/bin:/bin",
                "HOME": home,
                "XDG_DATA_HOME": home,
                "LANG": "C.UTF-8",
            }
            os.chdir(work)
            found, named = run_page(page, env, built)
            results.extend(found)
            inline_count += named
    finally:
        os.chdir(ROOT)
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"first hour: {len(results)} documented commands run from empty folders "
          f"in {time.time() - started:.0f} s, and {inline_count} named in the prose checked "
          "against their --help (listed when wrong):")
    for page, command, verdict, note in results:
        short = command if len(command) <= 110 else command[:107] + "..."
        print(f"{verdict}  {page}: {short}")
        if verdict != "PASS" or args.verbose:
            for line in note.strip().split("\n")[-15:]:
                print(f"        {line}")
    failed = [r for r in results if r[2] == "FAIL"]
    if failed:
        print(f"first hour: {len(failed)} documented commands failed", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
